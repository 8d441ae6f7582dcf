//! Images without a registry: the product image the Dockerfile describes,
//! the pause image and the example app, as OCI archives that
//! `ctr -n k8s.io images import` accepts (containerd's CRI then runs them
//! with `imagePullPolicy: IfNotPresent` or `Never`).
//!
//! - [`product_image`]: `docker.io/bucketmap/bucketmap:<appVersion>`, the
//!   operator and the sidecar built as the Dockerfile's build stage builds
//!   them, on a base equal in content to its `FROM` (distroless cc, nonroot:
//!   [`base`]), with the final stage's copies, `ENV`, `USER` and
//!   `ENTRYPOINT` read from the Dockerfile ([`dockerfile`]);
//! - [`pause_image`]: [`PAUSE_IMAGE`], the sandbox image, from the `pause`
//!   binary `tools/node/install.sh` builds;
//! - [`example_app_image`]: [`EXAMPLE_APP_IMAGE`], `examples/app/go` (the
//!   official Go client) built by `tools/example-app/build.sh`;
//! - [`import`]: into a containerd, under the image's name.
//!
//! The functions block (builds, file I/O): call them from `spawn_blocking`.
//! Layers are written in path order with fixed times and owners, so the same
//! inputs give the same digests.

pub mod base;
pub mod dockerfile;
pub mod layer;
pub mod oci;
pub mod product;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

pub use product::{ProductBinaries, assemble_product, build_product, product_image};
pub use product::{product_image_name, product_run_config};

use layer::Layer;
use oci::RunConfig;

/// An image written as an OCI archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageArchive {
    /// The image's full reference (`docker.io/bucketmap/bucketmap:0.1.0`),
    /// the name it is listed under once imported.
    pub name: String,
    /// The archive (a tar of an OCI image layout).
    pub path: PathBuf,
}

/// The sandbox image's name, written into containerd's configuration (the
/// node's containerd pulls nothing: the tests import every image).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// The example app's name: a pod says `bucketmap/photo-app:dev`.
pub const EXAMPLE_APP_IMAGE: &str = "docker.io/bucketmap/photo-app:dev";

/// The pause image's user (the upstream image's).
const PAUSE_USER: &str = "65535:65535";

/// The `PATH` of every image.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The pause image, holding `pause_bin` (a static binary, the `pause` in
/// the directory `tools/node/install.sh` prints) as `/pause`, written into
/// `out_dir`.
pub fn pause_image(pause_bin: &Path, out_dir: &Path) -> anyhow::Result<ImageArchive> {
    let mut layer = Layer::default();
    layer.host_file("pause", 0o755, pause_bin);
    let run = RunConfig {
        user: PAUSE_USER.into(),
        entrypoint: vec!["/pause".into()],
        env: vec![PATH.into()],
        working_dir: None,
    };
    write(PAUSE_IMAGE, &[layer], &run, out_dir)
}

/// The example app's image (built by `tools/example-app/build.sh`, cached),
/// written into `out_dir`.
pub fn example_app_image(out_dir: &Path) -> anyhow::Result<ImageArchive> {
    let binary = script_output(&crate::repo_path("tools/example-app/build.sh"))?;
    assemble_example_app(&binary, out_dir)
}

/// The example app's image around `binary` (static, no libraries needed):
/// `/usr/local/bin/photo-app`, run as nonroot (65532) with the users and
/// `/tmp` of the product's base.
pub fn assemble_example_app(binary: &Path, out_dir: &Path) -> anyhow::Result<ImageArchive> {
    let mut layer = Layer::default();
    base::identity(&mut layer);
    layer.host_file("usr/local/bin/photo-app", 0o755, binary);
    let nonroot = format!("{0}:{0}", base::NONROOT);
    let run = RunConfig {
        user: nonroot,
        entrypoint: vec!["/usr/local/bin/photo-app".into()],
        env: vec![PATH.into()],
        working_dir: Some(base::WORKING_DIR.into()),
    };
    write(EXAMPLE_APP_IMAGE, &[layer], &run, out_dir)
}

/// Imports `archive` into the containerd at `ctr_address` (its socket), in
/// the namespace the CRI plugin uses (`k8s.io`), unpacked for the default
/// snapshotter; fails unless the image is then listed under its name.
pub fn import(ctr_address: &Path, archive: &ImageArchive) -> anyhow::Result<()> {
    import_for_snapshotter(ctr_address, archive, None)
}

/// [`import`], unpacked for `snapshotter` when given (the one the CRI plugin
/// is configured with, when it is not containerd's default, overlayfs).
pub fn import_for_snapshotter(
    ctr_address: &Path,
    archive: &ImageArchive,
    snapshotter: Option<&str>,
) -> anyhow::Result<()> {
    let ctr = |args: &[&str]| {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(ctr_address);
        command.args(["--namespace", "k8s.io"]).args(args);
        command
    };
    let mut import = ctr(&["images", "import"]);
    if let Some(snapshotter) = snapshotter {
        import.args(["--snapshotter", snapshotter]);
    }
    run_quiet(import.arg(&archive.path))
        .with_context(|| format!("cannot import {}", archive.name))?;
    let listed = run_quiet(&mut ctr(&["images", "ls", "--quiet"]))?;
    anyhow::ensure!(
        listed.lines().any(|l| l == archive.name),
        "imported {} but containerd lists only: {listed}",
        archive.name
    );
    Ok(())
}

/// Writes the image `name` into `out_dir` (`<name, / and : as _>.oci.tar`).
fn write(
    name: &str,
    layers: &[Layer],
    run: &RunConfig,
    out_dir: &Path,
) -> anyhow::Result<ImageArchive> {
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let file = name.replace(['/', ':'], "_");
    let path = out_dir.join(format!("{file}.oci.tar"));
    oci::write_archive(&path, name, layers, run)
        .with_context(|| format!("cannot write the image {name} to {}", path.display()))?;
    Ok(ImageArchive {
        name: name.to_owned(),
        path,
    })
}

/// Runs `command`; its stdout, or an error with its stderr.
fn run_quiet(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{command:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the script (`bash SCRIPT`, without the package's cargo variables),
/// its stderr passed through; the last line of its stdout, as a path.
fn script_output(script: &Path) -> anyhow::Result<PathBuf> {
    let mut command = Command::new("bash");
    command.arg(script).current_dir(crate::repo_path(""));
    for name in crate::package_env_vars() {
        command.env_remove(name);
    }
    let out = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8(out.stdout)?;
    let last = stdout.lines().last().unwrap_or_default().trim();
    anyhow::ensure!(!last.is_empty(), "{} printed no path", script.display());
    Ok(PathBuf::from(last))
}
