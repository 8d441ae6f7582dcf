//! The product image: what the Dockerfile's build stage builds, copied where
//! its final stage copies it, on the distroless base it names, with that
//! stage's environment, user and entrypoint.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use super::dockerfile::FinalStage;
use super::layer::Layer;
use super::oci::RunConfig;
use super::{ImageArchive, base};

/// The base the Dockerfile's final stage must name: [`base`] imitates it.
pub const DISTROLESS_BASE: &str = "gcr.io/distroless/cc-debian12:nonroot";

/// The operator's build, as the Dockerfile runs it (its binary:
/// `target/dist/bucketmap`).
pub const OPERATOR_BUILD: [&str; 7] = [
    "cargo",
    "build",
    "--profile",
    "dist",
    "--locked",
    "-p",
    "bucketmap",
];

/// The sidecar's build, as the Dockerfile runs it (the last line of its
/// stdout is the binary's path).
pub const SIDECAR_BUILD: [&str; 2] = ["bash", "tools/pgo/build.sh"];

/// The two binaries the image ships.
#[derive(Debug, Clone)]
pub struct ProductBinaries {
    /// `bucketmap`, the operator.
    pub operator: PathBuf,
    /// `bucketmap-sidecar`, the proxy.
    pub sidecar: PathBuf,
}

/// Builds the product and writes its image into `out_dir`.
pub fn product_image(out_dir: &Path) -> anyhow::Result<ImageArchive> {
    let binaries = build_product()?;
    assemble_product(&binaries, out_dir)
}

/// Builds both binaries as the Dockerfile's build stage does (cargo's
/// incremental builds make a second call quick), without the cargo
/// variables of the package this process runs as.
pub fn build_product() -> anyhow::Result<ProductBinaries> {
    let root = crate::repo_path("");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut operator = Command::new(cargo);
    operator.args(&OPERATOR_BUILD[1..]).current_dir(&root);
    for name in crate::package_env_vars() {
        operator.env_remove(name);
    }
    let status = operator.status().context("cannot run cargo")?;
    anyhow::ensure!(
        status.success(),
        "{} failed ({status})",
        OPERATOR_BUILD.join(" ")
    );
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let sidecar = super::script_output(&root.join(SIDECAR_BUILD[1]))?;
    Ok(ProductBinaries {
        operator: target.join("dist/bucketmap"),
        sidecar,
    })
}

/// The product image around `binaries`, written into `out_dir`.
pub fn assemble_product(
    binaries: &ProductBinaries,
    out_dir: &Path,
) -> anyhow::Result<ImageArchive> {
    let stage = FinalStage::of_repository()?;
    anyhow::ensure!(
        stage.base == DISTROLESS_BASE,
        "the Dockerfile's final stage is based on {}, the assembler imitates {DISTROLESS_BASE}",
        stage.base
    );
    let layers = [base::layer()?, binaries_layer(&stage, binaries)?];
    super::write(
        &product_image_name()?,
        &layers,
        &product_run_config(&stage),
        out_dir,
    )
}

/// Where the final stage's `COPY`s put the build stage's binaries: each
/// binary's name (`bucketmap`, `bucketmap-sidecar`) and its path in the image.
pub fn binary_destinations(stage: &FinalStage) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (sources, dest) in &stage.copies {
        for source in sources {
            let name = source.rsplit('/').next().unwrap_or(source);
            let path = match dest.strip_suffix('/') {
                Some(dir) => format!("{dir}/{name}"),
                None if sources.len() == 1 => dest.clone(),
                None => anyhow::bail!("COPY of several files to {dest}, which is not a directory"),
            };
            out.push((name.to_owned(), path));
        }
    }
    Ok(out)
}

/// The binaries where the final stage copies them, root-owned and
/// executable as `COPY` leaves them.
fn binaries_layer(stage: &FinalStage, binaries: &ProductBinaries) -> anyhow::Result<Layer> {
    let mut layer = Layer::default();
    for (name, path) in binary_destinations(stage)? {
        let host = match name.as_str() {
            "bucketmap" => &binaries.operator,
            "bucketmap-sidecar" => &binaries.sidecar,
            other => {
                anyhow::bail!("the Dockerfile copies {other}, which the assembler does not build")
            }
        };
        layer.host_file(&path, 0o755, host);
    }
    Ok(layer)
}

/// The run configuration of the final stage: the base's environment, then
/// the stage's `ENV` (a name set again replaces the base's value).
pub fn product_run_config(stage: &FinalStage) -> RunConfig {
    let mut env: Vec<String> = base::ENV.iter().map(|s| (*s).to_owned()).collect();
    for setting in &stage.env {
        let name = setting.split('=').next().unwrap_or_default();
        env.retain(|e| e.split('=').next() != Some(name));
        env.push(setting.clone());
    }
    RunConfig {
        user: stage.user.clone(),
        entrypoint: stage.entrypoint.clone(),
        env,
        working_dir: Some(base::WORKING_DIR.into()),
    }
}

/// `docker.io/` + the chart's default repository + `:` + its appVersion
/// (the tag the chart's Deployment asks for).
pub fn product_image_name() -> anyhow::Result<String> {
    let chart = crate::repo_path("deploy/chart/bucketmap");
    let yaml = |file: &str| -> anyhow::Result<serde_yaml::Value> {
        let path = chart.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_yaml::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))
    };
    let version = yaml("Chart.yaml")?["appVersion"]
        .as_str()
        .context("Chart.yaml has no appVersion")?
        .to_owned();
    let values = yaml("values.yaml")?;
    let repository = values["image"]["repository"]
        .as_str()
        .context("values.yaml has no image.repository")?;
    Ok(format!("{}:{version}", full_repository(repository)))
}

/// A repository as containerd names it (`bucketmap/x` is `docker.io/bucketmap/x`).
fn full_repository(repository: &str) -> String {
    let first = repository.split('/').next().unwrap_or_default();
    let has_registry =
        repository.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    match (has_registry, repository.contains('/')) {
        (true, _) => repository.to_owned(),
        (false, true) => format!("docker.io/{repository}"),
        (false, false) => format!("docker.io/library/{repository}"),
    }
}
