//! `cargo dev crd`: the CRD generated from the Rust types (`bucketmap crd`)
//! written to both checked-in copies, `deploy/crd/crd.yaml` (kubectl/kustomize)
//! and the Helm chart's `files/crd.yaml` (which its template
//! `templates/crd.yaml` renders, so that `helm upgrade` updates the CRD), or
//! checked against them.

use std::path::PathBuf;

use anyhow::Context as _;
use kube::CustomResourceExt as _;

use bucketmap::crd::Gcs;

/// The checked-in copies of the CRD, relative to the repository root.
pub const COPIES: [&str; 2] = [
    "deploy/crd/crd.yaml",
    "deploy/chart/bucketmap/files/crd.yaml",
];

/// Options of `cargo dev crd`.
#[derive(Debug, Clone, clap::Args)]
pub struct CrdArgs {
    /// Only compare: fail, naming the stale files, instead of writing.
    #[arg(long)]
    check: bool,
}

/// The CRD as `bucketmap crd` prints it.
pub fn render() -> anyhow::Result<String> {
    serde_yaml::to_string(&Gcs::crd()).context("cannot render the CRD")
}

/// The copies whose content differs from `expected` (missing ones included).
pub fn stale(expected: &str) -> Vec<PathBuf> {
    COPIES
        .iter()
        .map(|c| bucketmap_testkit::repo_path(c))
        .filter(|p| std::fs::read_to_string(p).ok().as_deref() != Some(expected))
        .collect()
}

/// Writes both copies, or with `--check` fails if either is stale.
pub fn run(args: &CrdArgs) -> anyhow::Result<()> {
    let yaml = render()?;
    let stale = stale(&yaml);
    if args.check {
        anyhow::ensure!(
            stale.is_empty(),
            "stale CRD copies (regenerate them with `cargo dev crd`): {}",
            stale
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("the CRD copies are current: {}", COPIES.join(", "));
        return Ok(());
    }
    for path in &stale {
        std::fs::write(path, &yaml).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if stale.is_empty() {
        println!("the CRD copies were already current");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_checked_in_copies_are_the_generated_crd() -> anyhow::Result<()> {
        let stale = stale(&render()?);
        assert!(
            stale.is_empty(),
            "stale: {stale:?}; regenerate them with `cargo dev crd`"
        );
        Ok(())
    }

    #[test]
    fn a_copy_that_differs_is_reported() -> anyhow::Result<()> {
        let mut other = render()?;
        other.push_str("# edited\n");
        assert_eq!(stale(&other).len(), COPIES.len());
        Ok(())
    }
}
