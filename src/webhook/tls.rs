//! The webhook's serving certificate: from files (cert-manager mounts its
//! Secret; its CA injector fills the `caBundle`), or managed by the operator
//! itself: a CA and a serving certificate kept in a Secret shared by all
//! replicas, the CA written into the MutatingWebhookConfiguration's
//! `caBundle`, both checked and renewed periodically.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// Where the serving certificate comes from.
#[derive(Clone)]
pub enum CertSource {
    /// `tls.crt` and `tls.key` in a directory (a mounted cert-manager Secret).
    Files(PathBuf),
    /// Generated and rotated by the operator.
    SelfManaged {
        /// Client for the Secret and the webhook configuration.
        client: kube::Client,
        /// The operator's namespace, where the Secret lives.
        namespace: String,
        /// Secret that stores the certificate and key across restarts.
        secret: String,
        /// DNS names (and IPs) the certificate is valid for.
        hosts: Vec<String>,
        /// MutatingWebhookConfiguration whose `caBundle` is kept up to date.
        webhook_config: String,
    },
}

/// Hands the current certificate to each TLS handshake.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

impl CertResolver {
    fn set(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("bad certificate PEM")?;
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("bad private key PEM")?;
        let provider = rustls::crypto::CryptoProvider::get_default()
            .context("no rustls crypto provider installed")?;
        let certified = CertifiedKey::from_der(certs, key, provider)
            .context("certificate and key do not match")?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = Some(Arc::new(certified));
        Ok(())
    }
}

const RENEW_BEFORE_DAYS: i64 = 30;
const NOT_AFTER_ANNOTATION: &str = "bucketmap.dev/not-after";
const HOSTS_ANNOTATION: &str = "bucketmap.dev/hosts";

struct Material {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn generate(hosts: &[String]) -> anyhow::Result<(Material, jiff_ts::Timestamp)> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let now = jiff_ts::Timestamp::now();
    let not_after = now + jiff_ts::SignedDuration::from_hours(24 * 365);
    let to_offset =
        |t: jiff_ts::Timestamp| time::OffsetDateTime::from_unix_timestamp(t.as_second());

    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "bucketmap-webhook-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = to_offset(now - jiff_ts::SignedDuration::from_hours(1))?;
    ca_params.not_after = to_offset(now + jiff_ts::SignedDuration::from_hours(24 * 365 * 5))?;
    let ca_key = KeyPair::generate().context("cannot generate the webhook CA key")?;
    let ca =
        CertifiedIssuer::self_signed(ca_params, ca_key).context("cannot create the webhook CA")?;

    let mut params = CertificateParams::new(hosts.to_vec()).context("bad webhook host names")?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .map(String::as_str)
            .unwrap_or("bucketmap-webhook"),
    );
    params.not_before = to_offset(now - jiff_ts::SignedDuration::from_hours(1))?;
    params.not_after = to_offset(not_after)?;
    let key = KeyPair::generate().context("cannot generate the webhook serving key")?;
    let cert = params
        .signed_by(&key, &ca)
        .context("cannot sign the webhook serving certificate")?;
    Ok((
        Material {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
        not_after,
    ))
}

use k8s_openapi::jiff as jiff_ts;

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

/// The Secret's material if present, valid for a while and for `hosts`.
fn usable(secret: &Secret, hosts: &[String]) -> Option<Material> {
    let annotations = secret.metadata.annotations.as_ref()?;
    let not_after: jiff_ts::Timestamp = annotations.get(NOT_AFTER_ANNOTATION)?.parse().ok()?;
    if not_after
        < jiff_ts::Timestamp::now() + jiff_ts::SignedDuration::from_hours(24 * RENEW_BEFORE_DAYS)
    {
        return None;
    }
    if annotations.get(HOSTS_ANNOTATION)? != &hosts.join(",") {
        return None;
    }
    Some(Material {
        ca_pem: text(secret, "ca.crt")?,
        cert_pem: text(secret, "tls.crt")?,
        key_pem: text(secret, "tls.key")?,
    })
}

/// Reads or creates (or renews) the shared certificate Secret.
async fn ensure_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
) -> anyhow::Result<Material> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let existing = api
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read Secret {namespace}/{name}"))?;
    if let Some(material) = existing.as_ref().and_then(|s| usable(s, hosts)) {
        return Ok(material);
    }
    let (material, not_after) = generate(hosts)?;
    let mut secret = existing.clone().unwrap_or_default();
    secret.metadata.name = Some(name.to_owned());
    secret.metadata.namespace = Some(namespace.to_owned());
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(NOT_AFTER_ANNOTATION.to_owned(), not_after.to_string());
    annotations.insert(HOSTS_ANNOTATION.to_owned(), hosts.join(","));
    secret.type_ = Some("kubernetes.io/tls".to_owned());
    secret.data = Some(
        [
            ("ca.crt", &material.ca_pem),
            ("tls.crt", &material.cert_pem),
            ("tls.key", &material.key_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect(),
    );
    // Create, or replace at the version we read: if another replica won the
    // race, use what it wrote.
    let written = match existing {
        None => api.create(&PostParams::default(), &secret).await,
        Some(_) => api.replace(name, &PostParams::default(), &secret).await,
    };
    match written {
        Ok(_) => {
            info!(secret = %format!("{namespace}/{name}"), "generated the webhook serving certificate");
            Ok(material)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let secret = api
                .get(name)
                .await
                .with_context(|| format!("cannot read Secret {namespace}/{name}"))?;
            usable(&secret, hosts).with_context(|| {
                format!("Secret {namespace}/{name} written by another replica is unusable")
            })
        }
        Err(e) => Err(e).with_context(|| format!("cannot write Secret {namespace}/{name}")),
    }
}

/// Writes `ca_pem` into every webhook's `caBundle` of the configuration.
async fn ensure_ca_bundle(
    client: &kube::Client,
    config_name: &str,
    ca_pem: &str,
) -> anyhow::Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(mut config) = api
        .get_opt(config_name)
        .await
        .with_context(|| format!("cannot read MutatingWebhookConfiguration {config_name}"))?
    else {
        warn!(
            config = config_name,
            "MutatingWebhookConfiguration not found; caBundle not written"
        );
        return Ok(());
    };
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let mut changed = false;
    for webhook in config.webhooks.iter_mut().flatten() {
        if webhook.client_config.ca_bundle.as_ref() != Some(&bundle) {
            webhook.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if changed {
        config.metadata.managed_fields = None;
        api.replace(config_name, &PostParams::default(), &config)
            .await
            .with_context(|| format!("cannot write the caBundle of {config_name}"))?;
        info!(config = config_name, "updated the webhook caBundle");
    }
    Ok(())
}

async fn refresh(source: &CertSource, resolver: &CertResolver) -> anyhow::Result<()> {
    match source {
        CertSource::Files(dir) => {
            let read = |f: &str| {
                let path = dir.join(f);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))
            };
            resolver.set(&read("tls.crt")?, &read("tls.key")?)
        }
        CertSource::SelfManaged {
            client,
            namespace,
            secret,
            hosts,
            webhook_config,
        } => {
            let material = ensure_secret(client, namespace, secret, hosts).await?;
            resolver.set(&material.cert_pem, &material.key_pem)?;
            ensure_ca_bundle(client, webhook_config, &material.ca_pem).await
        }
    }
}

/// Loads the certificate once (failing if it cannot), then keeps it (and the
/// `caBundle`) current every `period` in the background.
pub async fn start(source: CertSource, period: Duration) -> anyhow::Result<Arc<CertResolver>> {
    let resolver = Arc::new(CertResolver {
        current: RwLock::new(None),
    });
    refresh(&source, &resolver).await?;
    let background = resolver.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = refresh(&source, &background).await {
                warn!(error = %format!("{e:#}"), "cannot refresh the webhook certificate");
            }
        }
    });
    Ok(resolver)
}
