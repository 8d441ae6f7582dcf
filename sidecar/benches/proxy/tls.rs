//! The TLS upstream's throwaway CA: a server certificate for `localhost` and
//! `127.0.0.1`, the CA file the sidecar (`--upstream-ca-file`) and nginx
//! (`proxy_ssl_trusted_certificate`) are given, and the bench client's trust.

use super::*;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// The name the TLS upstream's certificate is issued to (besides 127.0.0.1).
pub(crate) const TLS_NAME: &str = "localhost";

/// A throwaway CA and what each side needs of it.
pub(crate) struct Tls {
    /// The CA certificate, PEM, written for the sidecar and nginx.
    pub(crate) ca_file: PathBuf,
    /// The upstream's configuration: its certificate, ALPN h2 then http/1.1 (as GCS).
    pub(crate) server: Arc<rustls::ServerConfig>,
    /// The bench client's: trusts the CA only, offers http/1.1.
    pub(crate) client: rustls::ClientConfig,
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Issues the CA and the upstream's certificate; writes the CA to `dir/ca.pem`.
    pub(crate) fn new(dir: &Path) -> Result<Tls> {
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        // Distinct subjects: OpenSSL (nginx) takes a leaf whose issuer
        // equals its subject (rcgen's default name for both) as self-signed.
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "bucketmap bench CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)
            .context("cannot issue the bench CA")?;
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(vec![TLS_NAME.to_owned(), "127.0.0.1".to_owned()])?;
        leaf.distinguished_name.push(DnType::CommonName, TLS_NAME);
        let cert = leaf
            .signed_by(&key, &ca)
            .context("cannot issue the upstream certificate")?;
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| anyhow!("the upstream key: {e}"))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)
            .context("the upstream TLS configuration")?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.pem())
            .with_context(|| format!("cannot write {}", ca_file.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone())?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls {
            ca_file,
            server: Arc::new(server),
            client,
        })
    }
}
