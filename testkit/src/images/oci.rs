//! An OCI image layout in one tar archive (`oci-layout`, `index.json`,
//! `blobs/sha256/…`), as `ctr images import` reads it: one manifest for the
//! host's platform, named by the `io.containerd.image.name` annotation.
//! Layers are uncompressed, so each layer's digest is its diff id.

use std::io::{Seek as _, Write};
use std::path::Path;

use anyhow::Context as _;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::layer::Layer;

/// The run configuration of an image (the `config` object of its config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// `uid:gid`.
    pub user: String,
    /// The entrypoint, exec form.
    pub entrypoint: Vec<String>,
    /// `NAME=value`, in order.
    pub env: Vec<String>,
    /// The working directory, if any.
    pub working_dir: Option<String>,
}

/// Media types.
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The manifest's media type.
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The config's media type.
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed layer's media type.
pub const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// The host's platform as OCI names it.
pub fn platform() -> anyhow::Result<(&'static str, &'static str)> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => anyhow::bail!("no OCI architecture name known for {other}"),
    };
    Ok(("linux", arch))
}

/// A blob: its bytes live in a file (layers can be large).
struct Blob {
    digest: String,
    size: u64,
    file: std::fs::File,
}

impl Blob {
    fn from_bytes(bytes: &[u8]) -> anyhow::Result<Blob> {
        let mut file = tempfile::tempfile()?;
        file.write_all(bytes)?;
        Blob::finish(file, format!("{:x}", Sha256::digest(bytes)), bytes.len())
    }

    fn from_layer(layer: &Layer) -> anyhow::Result<Blob> {
        let mut hashing = Hashing {
            file: tempfile::tempfile()?,
            hash: Sha256::new(),
            size: 0,
        };
        layer.write_tar(&mut hashing)?;
        let digest = format!("{:x}", hashing.hash.finalize());
        Blob::finish(hashing.file, digest, hashing.size)
    }

    fn finish(mut file: std::fs::File, hex: String, size: usize) -> anyhow::Result<Blob> {
        file.rewind()?;
        Ok(Blob {
            digest: format!("sha256:{hex}"),
            size: size as u64,
            file,
        })
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({ "mediaType": media_type, "digest": self.digest, "size": self.size })
    }
}

/// A writer that hashes and counts what goes through it into a file.
struct Hashing {
    file: std::fs::File,
    hash: Sha256,
    size: usize,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The image config: the platform, the run configuration, the layers' diff ids.
fn config_json(run: &RunConfig, layers: &[Blob]) -> anyhow::Result<serde_json::Value> {
    let (os, arch) = platform()?;
    let mut config = json!({
        "User": run.user,
        "Entrypoint": run.entrypoint,
        "Env": run.env,
    });
    if let Some(dir) = &run.working_dir {
        config["WorkingDir"] = dir.as_str().into();
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    Ok(json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": arch,
        "os": os,
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
}

/// Writes the image `name` (a full reference, `docker.io/owner/repo:tag`)
/// with `layers` (bottom first) and `run` to the archive `path`.
pub fn write_archive(
    path: &Path,
    name: &str,
    layers: &[Layer],
    run: &RunConfig,
) -> anyhow::Result<()> {
    let layers = layers
        .iter()
        .map(Blob::from_layer)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = Blob::from_bytes(&serde_json::to_vec(&config_json(run, &layers)?)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.descriptor(CONFIG),
        "layers": layers.iter().map(|l| l.descriptor(LAYER)).collect::<Vec<_>>(),
    });
    let manifest = Blob::from_bytes(&serde_json::to_vec(&manifest)?)?;
    let index = serde_json::to_vec(&index_json(name, &manifest)?)?;
    let mut blobs: Vec<Blob> = layers;
    blobs.extend([config, manifest]);
    let tmp = path.with_extension("partial");
    write_layout(&tmp, blobs, &index)?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// The index: one manifest, for the host's platform, named `name`.
fn index_json(name: &str, manifest: &Blob) -> anyhow::Result<serde_json::Value> {
    let (os, arch) = platform()?;
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let mut descriptor = manifest.descriptor(MANIFEST);
    descriptor["platform"] = json!({ "os": os, "architecture": arch });
    descriptor["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    });
    Ok(json!({ "schemaVersion": 2, "mediaType": INDEX, "manifests": [descriptor] }))
}

/// The layout's tar: the blobs in digest order, the index, `oci-layout`.
fn write_layout(path: &Path, mut blobs: Vec<Blob>, index: &[u8]) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    blobs.sort_by(|a, b| a.digest.cmp(&b.digest));
    blobs.dedup_by(|a, b| a.digest == b.digest);
    for dir in ["blobs/", "blobs/sha256/"] {
        append(
            &mut tar,
            dir,
            0,
            std::io::empty(),
            tar::EntryType::Directory,
        )?;
    }
    for blob in blobs {
        let name = format!("blobs/sha256/{}", &blob.digest["sha256:".len()..]);
        append(
            &mut tar,
            &name,
            blob.size,
            blob.file,
            tar::EntryType::Regular,
        )?;
    }
    let regular = tar::EntryType::Regular;
    append(&mut tar, "index.json", index.len() as u64, index, regular)?;
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    append(
        &mut tar,
        "oci-layout",
        layout.len() as u64,
        &layout[..],
        regular,
    )?;
    tar.into_inner()?.into_inner()?.sync_all()?;
    Ok(())
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    size: u64,
    data: impl std::io::Read,
    kind: tar::EntryType,
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    tar.append_data(&mut header, name, data.take(size))
        .with_context(|| format!("cannot add {name} to the archive"))
}
