//! The test kit of bucketmap: what the tests, the benchmark and `cargo dev`
//! run the operator and the sidecar against. Never a dependency of the
//! product (a test checks that the operator's dependency tree lacks it).
//!
//! - [`testenv`]: a real local control plane (kube-apiserver + etcd);
//! - [`mock_gcs`]: an in-memory `google.storage.v2` gRPC server with fault
//!   injection;
//! - [`node`]: a single-node cluster (control plane, kubelet, containerd)
//!   inside a network namespace of its own;
//! - [`images`]: the product's image and the node's images as OCI archives,
//!   assembled without a registry or a Docker engine;
//! - [`grpc_schema`]: the sidecar's gRPC bucket-name table, derived from
//!   the vendored protos;
//! - [`http`]: a small loopback HTTP client (hyper) for probes and metrics;
//! - [`switches`]: the environment switches of the tests, refused in CI;
//! - [`free_port`], [`repo_path`], [`shipped_finalizer_webhook`]: fixtures
//!   shared by the test suites and the benchmark;
//! - [`package_env_vars`]: what a nested cargo must not inherit.

pub mod grpc_schema;
pub mod http;
pub mod images;
pub mod mock_gcs;
pub mod node;
pub mod switches;
pub mod testenv;

use std::path::PathBuf;

/// A path inside this repository (the workspace root), for the scripts in
/// `tools/` and the manifests in `deploy/` and `examples/`. Meant for tests
/// and developer tools run from a checkout, never for a shipped binary.
pub fn repo_path(relative: &str) -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    root.parent().unwrap_or(root).join(relative)
}

/// The Gcs finalizer webhook as `deploy/webhook.yaml` ships it (its failure
/// policy, rules and timeout), calling `url` (for example
/// `https://127.0.0.1:PORT/mutate-gcs`) instead of the Service, trusting
/// `ca_pem` when given (else the operator writes its own CA there).
pub fn shipped_finalizer_webhook(
    url: &str,
    ca_pem: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    shipped_webhook("finalizer.gcs.bucketmap.dev", url, ca_pem)
}

/// The webhook `name` of `deploy/webhook.yaml` as shipped, calling `url`
/// instead of the Service, trusting `ca_pem` when given.
pub fn shipped_webhook(
    name: &str,
    url: &str,
    ca_pem: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context as _;
    use base64::Engine as _;
    use serde::Deserialize as _;
    let path = repo_path("deploy/webhook.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut shipped = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc = serde_json::to_value(serde_yaml::Value::deserialize(doc)?)?;
        let hooks = doc["webhooks"].as_array().cloned().unwrap_or_default();
        shipped = shipped.or(hooks.into_iter().find(|w| w["name"] == name));
    }
    let mut hook = shipped.with_context(|| format!("deploy/webhook.yaml has no {name}"))?;
    hook["clientConfig"] = serde_json::json!({ "url": url });
    if let Some(ca) = ca_pem {
        hook["clientConfig"]["caBundle"] =
            base64::engine::general_purpose::STANDARD.encode(ca).into();
    }
    Ok(hook)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Chooses the process-wide rustls crypto provider (ring) if none is chosen
/// yet: kube-rs and the Google crates link two, so rustls cannot choose.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: any provider works.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The names of the environment variables cargo set for the package this
/// process runs as (`CARGO_PKG_*`, `CARGO_MANIFEST_DIR`, `OUT_DIR`, ...),
/// for a nested `cargo build` to go without: inherited, they reach the
/// build scripts that read them (ring's does), whose fingerprints then
/// differ from a plain build's, so the nested build and the next build by
/// hand each rebuild ring and everything above it.
pub fn package_env_vars() -> Vec<String> {
    const SET_FOR_THE_PACKAGE: [&str; 9] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_BIN_EXE_")
                || SET_FOR_THE_PACKAGE.contains(&name.as_str())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// Run by `cargo test`, this process has its package's variables and
    /// cargo's own; only the first are listed.
    #[test]
    fn the_package_variables_cargo_set_are_listed_and_nothing_else() {
        let names = super::package_env_vars();
        for set in ["CARGO_PKG_NAME", "CARGO_PKG_VERSION", "CARGO_MANIFEST_DIR"] {
            assert!(
                names.iter().any(|n| n == set),
                "{set} missing from {names:?}"
            );
        }
        for kept in ["CARGO", "PATH", "HOME", "RUSTUP_TOOLCHAIN", "CARGO_HOME"] {
            assert!(!names.iter().any(|n| n == kept), "{kept} listed: {names:?}");
        }
    }
}
