//! The node cluster's certificates: one CA, the API server's serving
//! certificate, and a client certificate per component with the identity
//! a kubeadm cluster gives it (so RBAC and the Node authorizer apply as
//! they do in users' clusters).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::testenv::write_private_file;

/// A certificate and its key, as PEM.
pub(crate) struct Pair {
    pub cert: String,
    pub key: String,
}

/// Where [`Pki::write`] put a pair.
pub(crate) struct PairFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA and everything it signed.
pub(crate) struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    pub service_account_key: String,
    pub service_account_public: String,
}

impl Pki {
    pub(crate) fn generate() -> Result<Pki> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "bucketmap-node-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("cannot generate the CA key")?;
        let ca = CertifiedIssuer::self_signed(params, key).context("cannot create the CA")?;
        let sa = KeyPair::generate().context("cannot generate the service-account key")?;
        Ok(Pki {
            ca,
            service_account_key: sa.serialize_pem(),
            service_account_public: sa.public_key_pem(),
        })
    }

    /// The CA certificate, as PEM.
    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A client certificate for user `cn` in the groups `orgs`.
    pub(crate) fn client(&self, cn: &str, orgs: &[&str]) -> Result<Pair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        for org in orgs {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, cn)
    }

    /// A serving certificate for the DNS names and IP addresses in `names`.
    pub(crate) fn server(&self, cn: &str, names: &[&str]) -> Result<Pair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        for name in names {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into()?),
            });
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, cn)
    }

    fn sign(&self, params: CertificateParams, what: &str) -> Result<Pair> {
        let key = KeyPair::generate().with_context(|| format!("cannot generate {what}'s key"))?;
        let cert = params
            .signed_by(&key, &self.ca)
            .with_context(|| format!("cannot sign {what}'s certificate"))?;
        Ok(Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

impl Pair {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key`.
    pub(crate) fn write(&self, dir: &Path, name: &str) -> Result<PairFiles> {
        let files = PairFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        write_private_file(&files.cert, self.cert.as_bytes())?;
        write_private_file(&files.key, self.key.as_bytes())?;
        Ok(files)
    }
}
