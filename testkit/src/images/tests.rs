//! The archives' structure (digests and sizes match their blobs), the
//! images' configurations and layers, reproducibility, and an import into a
//! throw-away containerd.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

use super::*;

/// One path of a layer as read back: mode, owner, link target or content.
#[derive(Debug)]
struct Read {
    mode: u32,
    owner: (u64, u64),
    kind: tar::EntryType,
    link: Option<PathBuf>,
    bytes: Vec<u8>,
}

/// An archive read back and checked: every descriptor's digest and size
/// match its blob, the index names the image.
struct Checked {
    config: serde_json::Value,
    layers: Vec<BTreeMap<String, Read>>,
}

fn files(tar_bytes: &[u8]) -> anyhow::Result<BTreeMap<String, Read>> {
    let mut out = BTreeMap::new();
    for entry in tar::Archive::new(tar_bytes).entries()? {
        let mut entry = entry?;
        let header = entry.header().clone();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_end_matches('/')
            .to_owned();
        let read = Read {
            mode: header.mode()?,
            owner: (header.uid()?, header.gid()?),
            kind: header.entry_type(),
            link: entry.link_name()?.map(|l| l.into_owned()),
            bytes,
        };
        anyhow::ensure!(header.mtime()? == 0, "{path} has a modification time");
        anyhow::ensure!(out.insert(path.clone(), read).is_none(), "{path} twice");
    }
    Ok(out)
}

fn blob<'a>(
    all: &'a BTreeMap<String, Read>,
    descriptor: &serde_json::Value,
    media_type: &str,
) -> anyhow::Result<&'a [u8]> {
    assert_eq!(descriptor["mediaType"], media_type, "{descriptor}");
    let digest = descriptor["digest"].as_str().context("no digest")?;
    let hex = digest.strip_prefix("sha256:").context("not sha256")?;
    let bytes = &all
        .get(&format!("blobs/sha256/{hex}"))
        .with_context(|| format!("no blob {digest}"))?
        .bytes;
    assert_eq!(format!("{:x}", Sha256::digest(bytes)), hex, "{digest}");
    assert_eq!(descriptor["size"], bytes.len(), "{digest}");
    Ok(bytes)
}

fn check(archive: &ImageArchive) -> anyhow::Result<Checked> {
    let all = files(&std::fs::read(&archive.path)?)?;
    let layout: serde_json::Value = serde_json::from_slice(&all["oci-layout"].bytes)?;
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    let index: serde_json::Value = serde_json::from_slice(&all["index.json"].bytes)?;
    let manifests = index["manifests"].as_array().context("no manifests")?;
    assert_eq!(manifests.len(), 1, "{index}");
    let annotations = &manifests[0]["annotations"];
    assert_eq!(
        annotations["io.containerd.image.name"],
        archive.name.as_str()
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(blob(&all, &manifests[0], oci::MANIFEST)?)?;
    let config: serde_json::Value =
        serde_json::from_slice(blob(&all, &manifest["config"], oci::CONFIG)?)?;
    let (os, arch) = oci::platform()?;
    assert_eq!(
        (config["os"].as_str(), config["architecture"].as_str()),
        (Some(os), Some(arch))
    );
    let mut layers = Vec::new();
    let descriptors = manifest["layers"].as_array().context("no layers")?;
    for (i, descriptor) in descriptors.iter().enumerate() {
        layers.push(files(blob(&all, descriptor, oci::LAYER)?)?);
        // Uncompressed: the diff id is the layer's digest.
        assert_eq!(config["rootfs"]["diff_ids"][i], descriptor["digest"]);
    }
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().map(Vec::len),
        Some(layers.len())
    );
    Ok(Checked { config, layers })
}

fn stand_in(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n# {name}\n"))?;
    Ok(path)
}

fn assert_entry(layer: &BTreeMap<String, Read>, path: &str, mode: u32, owner: (u64, u64)) {
    let entry = layer.get(path).unwrap_or_else(|| panic!("{path} missing"));
    assert_eq!(
        (entry.mode, entry.owner),
        (mode, owner),
        "{path}: {entry:?}"
    );
}

#[test]
fn images_pause_archive_has_matching_digests_the_binary_and_its_config() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let archive = pause_image(&stand_in(dir.path(), "pause")?, &dir.path().join("out"))?;
    assert_eq!(archive.name, "registry.k8s.io/pause:3.10");
    let checked = check(&archive)?;
    assert_eq!(checked.config["config"]["User"], "65535:65535");
    assert_eq!(
        checked.config["config"]["Entrypoint"],
        serde_json::json!(["/pause"])
    );
    let [layer] = checked.layers.as_slice() else {
        panic!("one layer expected")
    };
    assert_eq!(layer.keys().collect::<Vec<_>>(), ["pause"]);
    assert_entry(layer, "pause", 0o755, (0, 0));
    assert_eq!(layer["pause"].bytes, b"#!/bin/sh\n# pause\n");
    Ok(())
}

#[test]
fn images_are_reproducible_byte_for_byte() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let app = stand_in(dir.path(), "photo-app")?;
    let first = std::fs::read(assemble_example_app(&app, &dir.path().join("a"))?.path)?;
    let second = std::fs::read(assemble_example_app(&app, &dir.path().join("b"))?.path)?;
    assert!(first == second, "two archives of the same inputs differ");
    Ok(())
}

#[test]
fn images_example_app_runs_as_nonroot_with_a_writable_tmp() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let archive = assemble_example_app(&stand_in(dir.path(), "photo-app")?, dir.path())?;
    assert_eq!(archive.name, "docker.io/bucketmap/photo-app:dev");
    let checked = check(&archive)?;
    assert_eq!(checked.config["config"]["User"], "65532:65532");
    let entrypoint = serde_json::json!(["/usr/local/bin/photo-app"]);
    assert_eq!(checked.config["config"]["Entrypoint"], entrypoint);
    let layer = &checked.layers[0];
    assert_entry(layer, "usr/local/bin/photo-app", 0o755, (0, 0));
    assert_entry(layer, "tmp", 0o1777, (0, 0));
    assert_entry(layer, "home/nonroot", 0o700, (65532, 65532));
    let passwd = String::from_utf8(layer["etc/passwd"].bytes.clone())?;
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    Ok(())
}

/// The product image around stand-in binaries (`/usr/bin/true`, which
/// needs the C library): the Dockerfile's configuration, the base's files,
/// and, as root, the binaries run from the unpacked layers as nonroot.
#[test]
fn images_product_holds_the_base_and_the_binaries_and_runs_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binaries = ProductBinaries {
        operator: "/usr/bin/true".into(),
        sidecar: "/usr/bin/true".into(),
    };
    let archive = assemble_product(&binaries, dir.path())?;
    assert_eq!(archive.name, product_image_name()?);
    let checked = check(&archive)?;
    let stage = dockerfile::FinalStage::of_repository()?;
    let config = &checked.config["config"];
    assert_eq!(config["User"], stage.user.as_str());
    assert_eq!(config["Entrypoint"], serde_json::json!(stage.entrypoint));
    for setting in stage.env.iter().chain(&base::ENV.map(String::from)) {
        let env = config["Env"].as_array().context("no Env")?;
        assert!(
            env.iter().any(|e| e == setting.as_str()),
            "{setting} not in {env:?}"
        );
    }
    let [base_layer, binaries_layer] = checked.layers.as_slice() else {
        panic!("two layers")
    };
    for binary in ["usr/local/bin/bucketmap", "usr/local/bin/bucketmap-sidecar"] {
        assert_entry(binaries_layer, binary, 0o755, (0, 0));
    }
    assert_base(base_layer)?;
    if std::fs::metadata("/proc/self")?.uid() == 0 {
        run_unpacked(&checked.layers, dir.path())?;
    }
    Ok(())
}

fn assert_base(layer: &BTreeMap<String, Read>) -> anyhow::Result<()> {
    assert_entry(layer, "tmp", 0o1777, (0, 0));
    assert_entry(layer, "home/nonroot", 0o700, (65532, 65532));
    assert_entry(layer, "etc/ssl/certs/ca-certificates.crt", 0o644, (0, 0));
    let bundle = String::from_utf8(layer["etc/ssl/certs/ca-certificates.crt"].bytes.clone())?;
    assert!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "a thin CA bundle"
    );
    let group = String::from_utf8(layer["etc/group"].bytes.clone())?;
    for name in ["root:x:0:", "nobody:x:65534:", "nonroot:x:65532:"] {
        assert!(group.contains(name), "{group}");
    }
    assert_eq!(layer["lib64"].link.as_deref(), Some(Path::new("usr/lib64")));
    assert_eq!(layer["lib64"].kind, tar::EntryType::Symlink);
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    for lib in [
        "libc.so.6",
        "libgcc_s.so.1",
        "libstdc++.so.6",
        "libssl.so.3",
    ] {
        let path = format!("usr/lib/{multiarch}/{lib}");
        assert!(layer.contains_key(&path), "{path} missing");
    }
    Ok(())
}

/// Unpacks `layers` into a directory and runs both entrypoints there
/// (`chroot`) as the image's user.
fn run_unpacked(layers: &[BTreeMap<String, Read>], dir: &Path) -> anyhow::Result<()> {
    let root = dir.join("rootfs");
    std::fs::create_dir(&root)?;
    for layer in layers {
        for (path, entry) in layer {
            let at = root.join(path);
            match entry.kind {
                tar::EntryType::Directory => std::fs::create_dir_all(&at).context(path.clone())?,
                tar::EntryType::Symlink => {
                    let link = entry.link.as_ref().context("link without target")?;
                    std::os::unix::fs::symlink(link, &at).context(path.clone())?;
                }
                _ => {
                    std::fs::write(&at, &entry.bytes).context(path.clone())?;
                    let mode = std::os::unix::fs::PermissionsExt::from_mode(entry.mode);
                    std::fs::set_permissions(&at, mode)?;
                }
            }
        }
    }
    for binary in [
        "/usr/local/bin/bucketmap",
        "/usr/local/bin/bucketmap-sidecar",
    ] {
        let status = std::process::Command::new("chroot")
            .args(["--userspec=65532:65532"])
            .arg(&root)
            .arg(binary)
            .status()?;
        assert!(status.success(), "{binary} in the unpacked image: {status}");
    }
    Ok(())
}

#[test]
fn images_dockerfile_final_stage_is_read_with_continuations_and_both_env_forms()
-> anyhow::Result<()> {
    let text = "FROM rust AS build\nUSER 1\nENV BUILD=1\n\
                # FROM a comment\n\
                FROM gcr.io/distroless/cc-debian12:nonroot@sha256:0a1b AS run\n\
                COPY --from=build /out/a \\\n  /out/b /usr/local/bin/\n\
                ENV A=1 B=\"two\"\nENV C three\nUSER 65532:65532\n\
                ENTRYPOINT [\"/usr/local/bin/a\", \"run\"]\n";
    let stage = dockerfile::FinalStage::parse(text)?;
    assert_eq!(stage.base, "gcr.io/distroless/cc-debian12:nonroot");
    assert_eq!(
        dockerfile::from_args(text)
            .iter()
            .map(|from| dockerfile::image_reference(from))
            .collect::<Vec<_>>(),
        [
            ("rust", None),
            ("gcr.io/distroless/cc-debian12:nonroot", Some("sha256:0a1b"))
        ]
    );
    let sources = vec!["/out/a".to_owned(), "/out/b".to_owned()];
    assert_eq!(stage.copies, [(sources, "/usr/local/bin/".to_owned())]);
    assert_eq!(stage.env, ["A=1", "B=two", "C=three"]);
    assert_eq!(stage.user, "65532:65532");
    assert_eq!(stage.entrypoint, ["/usr/local/bin/a", "run"]);
    let destinations = product::binary_destinations(&stage)?;
    assert_eq!(
        destinations[1],
        ("b".to_owned(), "/usr/local/bin/b".to_owned())
    );
    let shell_form = text.replace("[\"/usr/local/bin/a\", \"run\"]", "/usr/local/bin/a run");
    assert!(
        dockerfile::FinalStage::parse(&shell_form).is_err(),
        "a shell-form ENTRYPOINT"
    );
    Ok(())
}

/// A containerd of its own (root, state and socket in a temporary
/// directory, without the CRI plugin), stopped when dropped.
struct Containerd {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> anyhow::Result<Containerd> {
        let dir = tempfile::tempdir()?;
        let d = dir.path().display();
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{d}/sock\"\n"
        );
        std::fs::write(dir.path().join("config.toml"), config)?;
        let log = std::fs::File::create(dir.path().join("containerd.log"))?;
        let child = std::process::Command::new("containerd")
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context(
                "cannot start containerd; install it as root: apt-get install containerd runc \
                 (or run bash tools/node/install.sh)",
            )?;
        let containerd = Containerd { child, dir };
        containerd.wait_ready()?;
        Ok(containerd)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        for _ in 0..100 {
            let version = std::process::Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .arg("version")
                .output();
            if version.is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self.dir.path().join("containerd.log"))?;
        anyhow::bail!(
            "containerd did not answer on {}: {log}",
            self.socket().display()
        )
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn images_pause_imports_into_a_throwaway_containerd() -> anyhow::Result<()> {
    anyhow::ensure!(
        std::fs::metadata("/proc/self")?.uid() == 0,
        "importing into containerd needs root: run this test as root"
    );
    let dir = tempfile::tempdir()?;
    let archive = pause_image(&stand_in(dir.path(), "pause")?, dir.path())?;
    let containerd = Containerd::start()?;
    import(&containerd.socket(), &archive)?;
    // A second import of the same archive is a no-op, not an error.
    import(&containerd.socket(), &archive)?;
    Ok(())
}
