//! gcsfs (fsspec's GCS filesystem, with its own aiohttp JSON API client) as
//! a differential check: the same operations through the sidecar and
//! straight against fake-gcs-server must have the same outcomes, step by
//! step (`clients/python/gcsfs_scenario.py`).

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::checks::Checks;
use super::procs::{clients, repo_root};
use super::world::{FORBIDDEN, World};

/// Runs the gcsfs scenario against `world`'s endpoint and returns its
/// report and its raw output (for the leak check).
pub fn run_gcsfs(world: &World) -> Result<(Value, String)> {
    let python = clients()?
        .get("python")
        .cloned()
        .context("install.sh printed no python=")?;
    let script = repo_root().join("sidecar/tests/clients/python/gcsfs_scenario.py");
    let out = Command::new(python)
        .arg(script)
        .args([&world.endpoint(), "photos", "videos", FORBIDDEN[0]])
        .arg(
            world
                .sidecar
                .as_ref()
                .map_or(FORBIDDEN[1], |_| world.physical("photos")),
        )
        .env_remove("STORAGE_EMULATOR_HOST")
        .output()
        .context("cannot run the gcsfs scenario")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(world.dir().join("gcsfs.stderr"), stderr.as_bytes())?;
    if !out.status.success() {
        bail!("the gcsfs scenario failed ({}): {stderr}", out.status);
    }
    let raw = String::from_utf8(out.stdout).context("the report is not UTF-8")?;
    std::fs::write(world.dir().join("gcsfs.json"), &raw)?;
    let report = serde_json::from_str(&raw).context("the report is not JSON")?;
    Ok((report, raw + &stderr))
}

/// The compared steps of a report.
pub fn steps(report: &Value) -> Vec<Value> {
    report["steps"].as_array().cloned().unwrap_or_default()
}

/// Through the sidecar: only the mapped buckets are listed, other buckets
/// are not found and physical names refused, nothing leaks, and the physical buckets hold what gcsfs saw.
pub fn check_sidecar_side(c: &mut Checks, world: &World, report: &Value, raw: &str) -> Result<()> {
    c.eq(
        "buckets listed through the sidecar",
        &report["own"][0]["value"],
        &serde_json::json!(["photos/", "videos/"]),
    );
    c.eq(
        "another environment's bucket (not in the map)",
        &report["own"][1]["error"],
        &Value::from("FileNotFoundError"),
    );
    c.eq(
        "the physical name of a mapped bucket",
        &report["own"][2]["error"],
        &Value::from("OSError"),
    );
    for leak in world.leaks() {
        c.check(!raw.contains(&leak), || format!("gcsfs saw {leak:?}"));
    }
    for logical in ["photos", "videos"] {
        let seen: BTreeSet<String> = report["final"][logical]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str()?.strip_prefix(&format!("{logical}/")))
            .map(str::to_owned)
            .collect();
        let physical = world.physical(logical);
        let stored: BTreeSet<String> = world.fake.objects(physical)?.into_keys().collect();
        c.check(!seen.is_empty(), || {
            format!("gcsfs left nothing in {logical}")
        });
        c.eq(&format!("objects in {physical}"), stored, seen);
    }
    for bucket in FORBIDDEN {
        let found = world.fake.objects(bucket)?;
        c.check(found.is_empty(), || format!("{bucket} holds {found:?}"));
    }
    Ok(())
}
