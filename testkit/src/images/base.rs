//! The product image's base, equal in what matters to
//! `gcr.io/distroless/cc-debian12:nonroot`: Debian's shared libraries (at the
//! versions installed on this machine, which the binaries were linked
//! against), the CA bundle, the users root, nobody and nonroot, their homes
//! and `/tmp`. Packages are fetched with `apt-get download` and unpacked
//! with `dpkg-deb -x` once, into the per-user cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use super::layer::{Kind, Layer};

/// The Debian packages of distroless's `cc` image (its `base` plus the C
/// and C++ runtimes).
pub const PACKAGES: [&str; 8] = [
    "libc6",
    "libgcc-s1",
    "libgomp1",
    "libstdc++6",
    "libssl3",
    "ca-certificates",
    "netbase",
    "tzdata",
];

/// The user distroless's `nonroot` images run as.
pub const NONROOT: u64 = 65532;

/// The environment distroless sets (the Dockerfile's `ENV` come after it).
pub const ENV: [&str; 2] = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
];

/// The working directory of distroless's `nonroot` images.
pub const WORKING_DIR: &str = "/home/nonroot";

/// The base layer: the packages' files and the users.
pub fn layer() -> anyhow::Result<Layer> {
    let mut layer = Layer::default();
    for top in ["bin", "lib", "lib64", "sbin"] {
        layer.dir(&format!("usr/{top}"), 0o755);
        layer.symlink(top, &format!("usr/{top}"));
    }
    let mut certs = String::new();
    for package in PACKAGES {
        let tree = unpacked(package)?;
        add_tree(&mut layer, &tree, "")?;
        if package == "ca-certificates" {
            certs = ca_bundle(&tree.join("usr/share/ca-certificates"))?;
        }
    }
    anyhow::ensure!(
        !certs.is_empty(),
        "the ca-certificates package holds no certificate"
    );
    layer.dir("etc/ssl/certs", 0o755);
    layer.file("etc/ssl/certs/ca-certificates.crt", 0o644, certs);
    identity(&mut layer);
    Ok(layer)
}

/// The users and groups root, nobody and nonroot, their homes, `/tmp`.
pub fn identity(layer: &mut Layer) {
    layer.file(
        "etc/passwd",
        0o644,
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    );
    layer.file(
        "etc/group",
        0o644,
        "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
    );
    layer.file("etc/nsswitch.conf", 0o644, "hosts: files dns\n");
    layer.dir("root", 0o700);
    layer.dir("home", 0o755);
    layer.insert("home/nonroot", 0o700, (NONROOT, NONROOT), Kind::Dir);
    layer.dir("tmp", 0o1777);
}

/// The per-user cache, as tools/lib.sh defines it.
pub fn cache_root() -> anyhow::Result<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("BUCKETMAP_CACHE_DIR") {
        return Ok(dir.into());
    }
    let cache = match set("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => home::home_dir()
            .context("no home directory for the cache; set BUCKETMAP_CACHE_DIR")?
            .join(".cache"),
    };
    Ok(cache.join("bucketmap"))
}

/// `package`'s files, unpacked once into the cache (keyed by the installed
/// version, or by "candidate" when the package is not installed here).
fn unpacked(package: &str) -> anyhow::Result<PathBuf> {
    let installed = installed_version(package);
    let key = installed
        .as_deref()
        .unwrap_or("candidate")
        .replace(':', "%3a");
    let dest = cache_root()?
        .join("images/debian")
        .join(format!("{package}={key}"));
    if dest.is_dir() {
        return Ok(dest);
    }
    std::fs::create_dir_all(dest.parent().context("cache path")?)?;
    let tmp = tempfile::tempdir_in(dest.parent().context("cache path")?)?;
    let deb = download(package, installed.as_deref(), tmp.path())?;
    let root = tmp.path().join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    // A concurrent run may have published the same tree first: either is right.
    if std::fs::rename(&root, &dest).is_err() && !dest.is_dir() {
        anyhow::bail!("cannot publish {}", dest.display());
    }
    Ok(dest)
}

fn installed_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", package])
        .output()
        .ok()?;
    let version = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !version.is_empty()).then_some(version)
}

/// Downloads `package` (at `version` when that is still in the archive,
/// else the candidate, which is newer) into `dir`; returns the `.deb`.
fn download(package: &str, version: Option<&str>, dir: &Path) -> anyhow::Result<PathBuf> {
    let pinned = version.map(|v| format!("{package}={v}"));
    let attempts = pinned.into_iter().chain([package.to_owned()]);
    let mut errors = Vec::new();
    for spec in attempts {
        let mut download = Command::new("apt-get");
        download.args(["download", "-q", &spec]).current_dir(dir);
        match run(&mut download) {
            Ok(()) => return single_deb(dir),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    anyhow::bail!(
        "cannot download the Debian package {package} (run `apt-get update` if apt's lists \
         are missing): {}",
        errors.join("; ")
    )
}

fn single_deb(dir: &Path) -> anyhow::Result<PathBuf> {
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    match debs.as_slice() {
        [deb] => Ok(deb.clone()),
        other => anyhow::bail!("expected one .deb in {}: {other:?}", dir.display()),
    }
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let out = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{command:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Adds the tree under `host` at `prefix` (image paths), root-owned, with
/// the host's modes; the top-level `bin`, `lib*` and `sbin` move under `usr`
/// (merged /usr, as a fresh Debian 12 has it). Manuals are left out.
fn add_tree(layer: &mut Layer, host: &Path, prefix: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut entries: Vec<_> = std::fs::read_dir(host)
        .with_context(|| format!("cannot read {}", host.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = match (prefix, name.as_str()) {
            ("", "bin" | "sbin" | "lib" | "lib32" | "lib64" | "libx32") => format!("usr/{name}"),
            ("", _) => name,
            _ => format!("{prefix}/{name}"),
        };
        if ["usr/share/man", "usr/share/info", "usr/share/lintian"].contains(&path.as_str()) {
            continue;
        }
        let meta = std::fs::symlink_metadata(entry.path())?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            layer.insert(&path, 0o777, (0, 0), Kind::Symlink(target));
        } else if meta.is_dir() {
            layer.dir(&path, mode);
            add_tree(layer, &entry.path(), &path)?;
        } else {
            layer.host_file(&path, mode, &entry.path());
        }
    }
    Ok(())
}

/// The certificates under `dir` concatenated in path order, as
/// `update-ca-certificates` builds the bundle with every certificate enabled.
fn ca_bundle(dir: &Path) -> anyhow::Result<String> {
    let mut bundle = String::new();
    let mut dirs = vec![dir.to_owned()];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "crt") {
                files.push(path);
            }
        }
    }
    files.sort();
    for file in files {
        let pem = std::fs::read_to_string(&file)?;
        bundle.push_str(pem.trim_end());
        bundle.push('\n');
    }
    Ok(bundle)
}
