//! Serving certificates for the webhook tests.

/// A CA and a serving certificate for 127.0.0.1 in `tls.crt` and `tls.key`
/// (as a cert-manager Secret mount provides them): (the CA's PEM, the directory).
pub fn cert_files() -> anyhow::Result<(String, tempfile::TempDir)> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &ca)?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("tls.crt"), cert.pem())?;
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem())?;
    Ok((ca.pem(), dir))
}
