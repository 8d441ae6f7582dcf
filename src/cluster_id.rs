//! The cluster identity: who owns a bucket, together with a resource's
//! namespace and name (see [`crate::naming`]).
//!
//! The user sets it once (`--cluster-id`, `BUCKETMAP_CLUSTER_ID`, the chart's
//! `clusterId`) and gives it again to every cluster that is to find the same
//! buckets: a restore, a rebuild, the green side of a blue/green migration.
//! When it is not set, the operator derives one at its first start and
//! stores it in the ConfigMap [`CONFIGMAP`] of its own namespace; every later
//! start, and every other replica, reads it from there. The ConfigMap is
//! created only if absent, so two replicas starting together agree (the
//! loser of the create reads the winner's). docs/RECOVERY.md tells users to
//! write the value down: a cluster rebuilt without it is a new owner.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

use crate::naming::validate_cluster_id;

/// Name of the ConfigMap holding a derived cluster identity.
pub const CONFIGMAP: &str = "bucketmap-cluster-id";
/// Key of the identity in [`CONFIGMAP`].
pub const KEY: &str = "clusterID";

/// Where the cluster identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--cluster-id` or `BUCKETMAP_CLUSTER_ID`.
    Given,
    /// Read from the ConfigMap.
    Stored,
    /// Derived now and stored in the ConfigMap.
    Derived,
}

impl Source {
    /// How a log line says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Given => "given (--cluster-id / BUCKETMAP_CLUSTER_ID)",
            Source::Stored => "stored (ConfigMap bucketmap-cluster-id)",
            Source::Derived => "derived now and stored (ConfigMap bucketmap-cluster-id)",
        }
    }
}

/// The cluster identity: `given` (already validated) if any, else the one
/// stored in namespace `namespace`, else a new random one stored there.
pub async fn resolve(
    client: &kube::Client,
    given: Option<&str>,
    namespace: &str,
) -> anyhow::Result<(String, Source)> {
    if let Some(id) = given {
        let id = validate_cluster_id(id).map_err(anyhow::Error::msg)?;
        return Ok((id, Source::Given));
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Some(id) = stored(&api, namespace).await? {
        return Ok((id, Source::Stored));
    }
    let id = random_id();
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(CONFIGMAP.to_owned()),
            labels: Some(
                [("app.kubernetes.io/name".to_owned(), "bucketmap".to_owned())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some([(KEY.to_owned(), id.clone())].into_iter().collect()),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &cm).await {
        Ok(_) => Ok((id, Source::Derived)),
        // Another replica stored one first: use it.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let id = stored(&api, namespace).await?.with_context(|| {
                format!("ConfigMap {namespace}/{CONFIGMAP} exists but cannot be read back")
            })?;
            Ok((id, Source::Stored))
        }
        Err(e) => Err(e).with_context(|| {
            format!("cannot create ConfigMap {namespace}/{CONFIGMAP} to store the cluster identity (set --cluster-id, or allow the operator to create it)")
        }),
    }
}

/// The identity stored in the ConfigMap, if the ConfigMap exists.
async fn stored(api: &Api<ConfigMap>, namespace: &str) -> anyhow::Result<Option<String>> {
    let Some(cm) = api
        .get_opt(CONFIGMAP)
        .await
        .with_context(|| format!("cannot read ConfigMap {namespace}/{CONFIGMAP}"))?
    else {
        return Ok(None);
    };
    let value = cm
        .data
        .and_then(|mut d| d.remove(KEY))
        .with_context(|| format!("ConfigMap {namespace}/{CONFIGMAP} has no key {KEY}"))?;
    validate_cluster_id(&value)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("ConfigMap {namespace}/{CONFIGMAP}: {e}"))
}

/// A new identity: `cluster-` and 10 random lowercase letters and digits.
fn random_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = (0..10)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect();
    format!("cluster-{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_identity_is_valid_and_new_each_time() {
        let a = random_id();
        assert_eq!(validate_cluster_id(&a), Ok(a.clone()));
        assert_ne!(a, random_id());
    }
}
