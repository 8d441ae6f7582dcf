//! bucketmap: a Kubernetes operator that turns `Gcs` resources into real,
//! uniquely named Google Cloud Storage buckets.
//!
//! - [`crd`]: the `Gcs` resource (the CRD is generated from these types);
//! - [`naming`]: deterministic physical names and ownership labels;
//! - [`settings`]: desired vs observed bucket settings (drift);
//! - [`gcs`]: bucket operations through the official `google-cloud-storage` crate;
//! - [`iam`]: who may use a bucket (members, roles, tenant rules, policy edits);
//! - [`controller`]: the reconciler;
//! - [`metrics`], [`telemetry`]: operations.
//!
//! This crate is the product only. The local control plane and the mock GCS
//! the tests use are in `testkit/`; `cargo dev` (the embedded default, the
//! benchmark) is in `devtools/`.

#![forbid(unsafe_code)]

/// The field manager of every write the operator makes (server-side apply
/// of status, the bucket maps and the binding Secrets): one name, so that
/// what the operator owns in an object is what this manager owns.
pub const FIELD_MANAGER: &str = "bucketmap";

pub mod bucket_map;
pub mod cidr;
pub mod cli;
pub mod cluster_id;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod events;
pub mod gcs;
pub mod iam;
pub mod leader;
pub mod metrics;
pub mod naming;
pub mod notifications;
pub mod permissions;
pub mod publish;
pub mod relocation;
pub mod settings;
pub mod slots;
pub mod telemetry;
pub mod tenancy;
pub mod webhook;

/// Installs ring, the one crypto library linked, as the process-wide rustls
/// provider. The Google crates and tonic take the process's provider for
/// their TLS clients and signatures (their aws-lc features are off), so call
/// this before building any client. Idempotent.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: any provider works.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Resolves on SIGTERM or SIGINT (ctrl-c) with the signal's name. A signal
/// that cannot be listened for is logged and never fires.
pub async fn termination_signal() -> &'static str {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    }
}

/// Errors of a reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("cannot {action}: {source}")]
    Kube {
        /// What was attempted, in words ("patch status", ...).
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A GCS call failed.
    #[error(transparent)]
    Gcs(#[from] gcs::GcsError),
    /// The bucket cannot be deleted yet (it is not empty).
    #[error("{0}")]
    DeletionBlocked(String),
    /// The bucket cannot be deleted yet: objects in it are under retention
    /// (a locked retention policy, or their own) and cannot be deleted
    /// before it expires.
    #[error("{0}")]
    RetentionLocked(String),
    /// A copy of an object does not match its source (size or CRC32C).
    #[error("{0}")]
    CopyMismatch(String),
    /// The object lacks a field every stored object has.
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// A Secret of the binding's name belongs to somebody else.
    #[error("{0}")]
    BindingNotOwned(String),
    /// The bucket map could not be written.
    #[error("bucket map: {0}")]
    Publish(String),
    /// A namespace could not be read from the API server.
    #[error("{0}")]
    NamespaceRead(String),
    /// Another writer changed the object between our read and our write:
    /// expected now and then, retried quietly.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A write computed from an old view of the object was refused by its
    /// precondition: the reconcile runs again from the live object.
    #[error("stale view: {0}")]
    Stale(String),
}

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> String {
        match self {
            Error::Kube { .. } | Error::NamespaceRead(_) => "kube".into(),
            Error::Gcs(e) => format!("gcs_{}", e.code_label().to_ascii_lowercase()),
            Error::DeletionBlocked(_) => "deletion_blocked".into(),
            Error::RetentionLocked(_) => "retention_locked".into(),
            Error::MissingField(_) => "missing_field".into(),
            Error::CopyMismatch(_) => "copy_mismatch".into(),
            Error::Publish(_) => "publish".into(),
            Error::BindingNotOwned(_) => "binding_not_owned".into(),
            Error::Conflict(_) => "conflict".into(),
            Error::Stale(_) => "stale".into(),
        }
    }

    /// Whether this is a conflict with another writer that a retry
    /// resolves (our own `test` patch, or an API server 409): logged at
    /// debug level and not counted as a failed reconcile.
    pub fn is_expected_conflict(&self) -> bool {
        match self {
            Error::Conflict(_) | Error::Stale(_) => true,
            Error::Kube {
                source: kube::Error::Api(status),
                ..
            } => status.code == 409,
            _ => false,
        }
    }

    /// Wraps a Kubernetes API error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}

/// Result of reconciler steps.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "test", "reason": "Test", "code": code,
        }))
        .expect("a Status");
        Error::kube("patch Gcs photos")(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn only_conflicts_with_other_writers_are_retried_quietly() {
        assert!(Error::Conflict("finalizers changed".into()).is_expected_conflict());
        assert!(api_error(409).is_expected_conflict());
        for code in [403, 404, 422, 500] {
            assert!(!api_error(code).is_expected_conflict(), "{code}");
        }
        assert!(!Error::DeletionBlocked("not empty".into()).is_expected_conflict());
        assert_eq!(Error::Conflict(String::new()).metric_label(), "conflict");
    }
}
