//! TLS towards the upstreams: the bundled web PKI roots (GCS), plus the
//! certificates of `--upstream-ca-file` (a private GCS endpoint, an
//! emulator or a test server behind a throwaway CA).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// The client configuration both upstream clients use; the HTTP versions
/// offered by ALPN are set by each connector.
pub fn client_config(ca_file: Option<&Path>) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read --upstream-ca-file {}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("--upstream-ca-file {} is not PEM", path.display()))?;
        anyhow::ensure!(
            !certs.is_empty(),
            "--upstream-ca-file {} holds no certificate",
            path.display()
        );
        for cert in certs {
            roots.add(cert).with_context(|| {
                format!(
                    "a certificate of --upstream-ca-file {} is invalid",
                    path.display()
                )
            })?;
        }
    }
    with_roots(roots, "the upstream")
}

/// The client configuration towards the Kubernetes API server: the
/// cluster's CA certificates (`ca.crt` of the ServiceAccount volume) and
/// nothing else.
pub fn cluster_config(ca_file: &Path) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .with_context(|| format!("cannot read the cluster CA {}", ca_file.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("the cluster CA {} is not PEM", ca_file.display()))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    anyhow::ensure!(
        added > 0,
        "the cluster CA {} holds no usable certificate",
        ca_file.display()
    );
    with_roots(roots, "the API server")
}

/// A client configuration trusting `roots`, towards `peer` (for errors).
fn with_roots(roots: rustls::RootCertStore, peer: &str) -> anyhow::Result<rustls::ClientConfig> {
    // An explicit provider, ring: rustls could not pick alone should a
    // dependency ever link a second one.
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .with_context(|| format!("cannot configure TLS for {peer}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_roots_are_added_and_bad_files_refused() -> anyhow::Result<()> {
        let bundled = client_config(None)?;
        let dir = tempfile::tempdir()?;
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "")?;
        let e = client_config(Some(&empty)).expect_err("no certificate");
        assert!(format!("{e:#}").contains("holds no certificate"), "{e:#}");
        let missing = client_config(Some(&dir.path().join("missing.pem")));
        assert!(missing.is_err());
        drop(bundled);
        Ok(())
    }
}
