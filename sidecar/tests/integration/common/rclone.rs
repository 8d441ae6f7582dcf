//! rclone (its GCS backend is Google's generated Go JSON API client,
//! google.golang.org/api/storage/v1, driven its own way: `null` bodies on
//! rewrites, downloads through `mediaLink`) as a differential check: the
//! same commands through the sidecar and straight against fake-gcs-server
//! must succeed or fail alike and print the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::checks::Checks;
use super::procs::{run_with_timeout, tool_bin};
use super::scenario::{pseudo_random, sha256_hex};
use super::world::{FORBIDDEN, World};

/// The rclone binary, built once from tools/rclone.
pub fn rclone_bin() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tool_bin(&BIN, "rclone")
}

/// The compared commands: (step, arguments). `R:` is the remote; `{dir}`
/// the run's local directory. tools/rclone/main.go builds rclone with
/// these commands only: a new one is imported there too.
pub const STEPS: &[(&str, &[&str])] = &[
    (
        "copy_small",
        &["copyto", "{dir}/small.txt", "R:photos/d/small.txt"],
    ),
    // Over the Go client's 16 MiB media chunk: a resumable upload.
    (
        "copy_big",
        &["copyto", "{dir}/big.bin", "R:photos/d/big.bin"],
    ),
    ("ls", &["ls", "R:photos"]),
    ("cat", &["cat", "R:photos/d/small.txt"]),
    (
        "cat_range",
        &[
            "cat",
            "--offset",
            "5",
            "--count",
            "10",
            "R:photos/d/big.bin",
        ],
    ),
    (
        "copy_across",
        &["copyto", "R:photos/d/small.txt", "R:videos/e/small.txt"],
    ),
    (
        "move",
        &["moveto", "R:photos/d/small.txt", "R:photos/d/moved.txt"],
    ),
    ("sync", &["sync", "{dir}/tree", "R:photos/s"]),
    ("check", &["check", "{dir}/tree", "R:photos/s"]),
    (
        "lsjson",
        &["lsjson", "-R", "--no-modtime", "--hash", "R:photos"],
    ),
    ("lsf_videos", &["lsf", "-R", "R:videos"]),
    ("md5sum", &["md5sum", "R:photos"]),
    ("copy_down", &["copy", "R:photos/s", "{dir}/down"]),
    ("check_down", &["check", "{dir}/tree", "{dir}/down"]),
    ("delete", &["delete", "R:videos"]),
    ("purge", &["purge", "R:photos/d"]),
    ("size", &["size", "--json", "R:photos"]),
    // rclone takes a missing object for an empty directory: nothing to copy.
    (
        "missing_object",
        &[
            "copyto",
            "--error-on-no-transfer",
            "R:photos/nope",
            "{dir}/nope",
        ],
    ),
    ("missing_bucket", &["ls", "R:bucketmap-no-such-bucket"]),
];

/// The local files the commands upload.
fn write_files(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("tree/sub"))?;
    std::fs::write(dir.join("small.txt"), "hello from rclone\n")?;
    std::fs::write(
        dir.join("big.bin"),
        pseudo_random(20 * 1024 * 1024 + 123, 0x5eed),
    )?;
    std::fs::write(dir.join("tree/a.txt"), "a")?;
    std::fs::write(dir.join("tree/sub/b.bin"), pseudo_random(70_000, 3))?;
    Ok(())
}

/// What one command did: its outcome and its output, the endpoint written
/// as `{endpoint}` and lines sorted (rclone lists concurrently), except
/// for `cat`; output that is not text as its digest.
fn outcome(world: &World, step: &str, args: &[&str], raw: &mut String) -> Result<Value> {
    let dir = world.dir().join("rclone");
    let config = dir.join("rclone.conf");
    let endpoint = world.endpoint();
    std::fs::write(
        &config,
        format!(
            "[R]\ntype = google cloud storage\nanonymous = true\n\
             endpoint = {endpoint}/storage/v1/\nproject_number = bucketmap-test\n"
        ),
    )?;
    let dir_text = dir.display().to_string();
    let args: Vec<String> = args.iter().map(|a| a.replace("{dir}", &dir_text)).collect();
    let mut cmd = Command::new(rclone_bin()?);
    cmd.arg("--config")
        .arg(&config)
        .args(["--retries", "1", "--low-level-retries", "2", "--stats", "0"])
        .args(&args)
        .env_remove("STORAGE_EMULATOR_HOST");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(120))
        .with_context(|| format!("rclone {args:?}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(dir.join(format!("{step}.stderr")), stderr.as_bytes())?;
    raw.push_str(&String::from_utf8_lossy(&out.stdout));
    raw.push_str(&stderr);
    let stdout = match String::from_utf8(out.stdout) {
        Ok(text) if step.starts_with("cat") => json!(text.replace(&endpoint, "{endpoint}")),
        Ok(text) => {
            let mut lines: Vec<&str> = text.lines().collect();
            lines.sort_unstable();
            json!(lines.join("\n").replace(&endpoint, "{endpoint}"))
        }
        Err(e) => json!({"bytes": e.as_bytes().len(), "sha256": sha256_hex(e.as_bytes())?}),
    };
    Ok(json!({"step": step, "ok": out.status.success(), "stdout": stdout}))
}

/// Runs every step against `world`; (compared steps, own steps, raw
/// output). Own steps differ by design: the bucket listing, creating a
/// bucket, a physical name (`photos`' through the sidecar, another
/// environment's bucket directly).
pub fn run_rclone(world: &World) -> Result<(Vec<Value>, Vec<Value>, String)> {
    let physical = match world.sidecar {
        Some(_) => world.physical("photos"),
        None => FORBIDDEN[1],
    };
    write_files(&world.dir().join("rclone"))?;
    let mut raw = String::new();
    let mut steps = Vec::new();
    for (step, args) in STEPS {
        steps.push(outcome(world, step, args, &mut raw)?);
    }
    let physical_ls = format!("R:{physical}");
    let own_steps: [(&str, &[&str]); 3] = [
        ("buckets", &["lsf", "R:"]),
        ("mkdir_bucket", &["mkdir", "R:bucketmap-new-bucket"]),
        ("physical", &["ls", &physical_ls]),
    ];
    let mut own = Vec::new();
    for (step, args) in own_steps {
        // The refusal of a physical name names it: not a leak.
        let mut seen = String::new();
        own.push(outcome(world, step, args, &mut seen)?);
        if step != "physical" {
            raw.push_str(&seen);
        }
    }
    Ok((steps, own, raw))
}

/// Through the sidecar: only the mapped buckets are listed, no bucket is
/// created, the physical name is refused, nothing leaks, and the physical
/// buckets hold what rclone lists.
pub fn check_rclone_sidecar_side(
    c: &mut Checks,
    world: &World,
    own: &[Value],
    raw: &str,
) -> Result<()> {
    let field = |i: usize, key: &str| own.get(i).map_or(Value::Null, |v| v[key].clone());
    c.eq(
        "buckets listed",
        field(0, "stdout"),
        json!("photos/\nvideos/"),
    );
    c.eq(
        "creating an unmapped bucket succeeded",
        field(1, "ok"),
        json!(false),
    );
    c.eq(
        "listing a physical name succeeded",
        field(2, "ok"),
        json!(false),
    );
    for leak in world.leaks() {
        c.check(!raw.contains(&leak), || format!("rclone printed {leak:?}"));
    }
    let want: BTreeSet<String> = ["s/a.txt", "s/sub/b.bin"].map(str::to_owned).into();
    let stored: BTreeSet<String> = world
        .fake
        .objects(world.physical("photos"))?
        .into_keys()
        .collect();
    c.eq("objects left in photos' physical bucket", stored, want);
    c.check(
        world.fake.objects(world.physical("videos"))?.is_empty(),
        || "rclone delete left objects in videos".to_owned(),
    );
    for bucket in FORBIDDEN {
        let found = world.fake.objects(bucket)?;
        c.check(found.is_empty(), || format!("{bucket} holds {found:?}"));
    }
    Ok(())
}
