//! Publishing Ready buckets to the workloads of their namespace.
//!
//! - The bucket map: one ConfigMap per namespace (`bucketmap` by default)
//!   whose keys are logical names and values physical names. Each `Gcs`
//!   owns exactly its own key through server-side apply with a field manager
//!   of its own, so concurrent updates never lose an entry, a key someone
//!   else wrote is never touched, and removing the entry is applying nothing.
//! - A Service Binding Secret per `Gcs` (the Provisioned Service of the
//!   Service Binding specification): `type`, `provider`, `bucket`,
//!   `logical-bucket`, `project`, `uri`. No credentials.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::crd::Gcs;
use crate::{Error, Result};

/// Label on everything the operator publishes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "bucketmap");
/// Secret type of the binding (`servicebinding.io/<type>`).
pub const BINDING_SECRET_TYPE: &str = "servicebinding.io/gcs";

/// Caches of what was published, to skip writes that would change nothing.
#[derive(Clone)]
pub struct PublishedCache {
    pub configmaps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
}

/// Name of the binding Secret of a `Gcs`.
pub fn binding_secret_name(gcs_name: &str) -> String {
    const SUFFIX: &str = "-gcs-binding";
    if gcs_name.len() + SUFFIX.len() <= 253 {
        return format!("{gcs_name}{SUFFIX}");
    }
    let mut cut = 253 - SUFFIX.len();
    while !gcs_name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{SUFFIX}", gcs_name[..cut].trim_end_matches(['-', '.']))
}

/// The field manager that owns this resource's key in the bucket map.
fn map_field_manager(uid: &str) -> String {
    format!("bucketmap-map-{uid}")
}

fn binding_data(obj: &Gcs, physical: &str, project: &str) -> BTreeMap<String, ByteString> {
    [
        ("type", "gcs"),
        ("provider", "google"),
        ("bucket", physical),
        ("logical-bucket", obj.spec.bucket_name.as_str()),
        ("project", project),
        ("uri", &format!("gs://{physical}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

/// Why publishing failed.
pub enum PublishError {
    /// Another `Gcs` in the namespace maps the same logical name elsewhere.
    LogicalNameTaken(String),
    Other(Error),
}

impl From<Error> for PublishError {
    fn from(e: Error) -> Self {
        PublishError::Other(e)
    }
}

/// Makes sure the map entry and the binding Secret exist as they should.
/// Returns whether anything was written.
pub async fn publish(
    client: &kube::Client,
    cache: &PublishedCache,
    map_name: &str,
    obj: &Gcs,
    physical: &str,
    project: &str,
) -> std::result::Result<bool, PublishError> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let logical = &obj.spec.bucket_name;
    let mut wrote = false;

    let map_current = cache
        .configmaps
        .get(&ObjectRef::new(map_name).within(&ns))
        .and_then(|cm| cm.data.as_ref().and_then(|d| d.get(logical).cloned()));
    if map_current.as_deref() != Some(physical) {
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": map_name, "namespace": ns, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
            "data": {logical: physical},
        });
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        // No force: a conflict means another resource owns this logical name.
        match api
            .patch(
                map_name,
                &PatchParams::apply(&map_field_manager(&uid)),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => wrote = true,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Err(PublishError::LogicalNameTaken(format!(
                    "logical name {logical} is already mapped in ConfigMap {ns}/{map_name} by another writer ({}); the bucket {physical} is not published",
                    status.message
                )));
            }
            Err(e) => {
                return Err(
                    Error::kube(format!("publish {logical} in ConfigMap {ns}/{map_name}"))(e)
                        .into(),
                );
            }
        }
    }

    let secret_name = binding_secret_name(&obj.name_any());
    let data = binding_data(obj, physical, project);
    let current = cache.secrets.get(&ObjectRef::new(&secret_name).within(&ns));
    let up_to_date = current.is_some_and(|s| {
        s.data.as_ref() == Some(&data)
            && s.type_.as_deref() == Some(BINDING_SECRET_TYPE)
            && s.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == obj.meta().uid.as_ref())
    });
    if !up_to_date {
        use base64::Engine as _;
        let encoded: BTreeMap<&String, String> = data
            .iter()
            .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(&v.0)))
            .collect();
        let value = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "namespace": ns,
                "labels": {MANAGED_BY.0: MANAGED_BY.1},
                "ownerReferences": obj.controller_owner_ref(&()).into_iter().collect::<Vec<_>>(),
            },
            "type": BINDING_SECRET_TYPE,
            "data": encoded,
        });
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        api.patch(
            &secret_name,
            &PatchParams::apply(crate::controller::FIELD_MANAGER).force(),
            &Patch::Apply(&value),
        )
        .await
        .map_err(Error::kube(format!(
            "write binding Secret {ns}/{secret_name}"
        )))?;
        wrote = true;
    }
    Ok(wrote)
}

/// Removes this resource's map entry and its binding Secret.
pub async fn unpublish(client: &kube::Client, map_name: &str, obj: &Gcs) -> Result<()> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    if api
        .get_opt(map_name)
        .await
        .map_err(Error::kube(format!("read ConfigMap {ns}/{map_name}")))?
        .is_some()
    {
        // Applying an empty intent with our manager drops the key we owned.
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": map_name, "namespace": ns},
        });
        api.patch(
            map_name,
            &PatchParams::apply(&map_field_manager(&uid)),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "remove {} from ConfigMap {ns}/{map_name}",
            obj.spec.bucket_name
        )))?;
    }
    let secret_name = binding_secret_name(&obj.name_any());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    match secrets.delete(&secret_name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "delete binding Secret {ns}/{secret_name}"
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_secret_names_fit_the_limit() {
        assert_eq!(binding_secret_name("photos"), "photos-gcs-binding");
        let long = "a".repeat(253);
        let name = binding_secret_name(&long);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-gcs-binding"));
    }
}
