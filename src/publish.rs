//! Publishing Ready buckets to the workloads of their namespace.
//!
//! - The bucket map: see [`crate::bucket_map`].
//! - A Service Binding Secret per `Gcs` (the Provisioned Service of the
//!   Service Binding specification): `type`, `provider`, `bucket`,
//!   `logical-bucket`, `project`, `uri`. No credentials.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::crd::Gcs;
use crate::{Error, Result};

/// Label on everything the operator publishes (binding Secrets, bucket maps).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "bucketmap");
/// Secret type of the binding (`servicebinding.io/<type>`).
pub const BINDING_SECRET_TYPE: &str = "servicebinding.io/gcs";

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

/// Makes sure the binding Secret exists as it should. Returns whether it
/// was written (skipped when the cached Secret already matches).
pub async fn write_binding(
    client: &kube::Client,
    secrets: &Store<Secret>,
    obj: &Gcs,
    physical: &str,
    project: &str,
) -> Result<bool> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let secret_name = binding_secret_name(&obj.name_any());
    let data = binding_data(obj, physical, project);
    let current = secrets.get(&ObjectRef::new(&secret_name).within(&ns));
    let up_to_date = current.is_some_and(|s| {
        s.data.as_ref() == Some(&data)
            && s.type_.as_deref() == Some(BINDING_SECRET_TYPE)
            && s.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == obj.meta().uid.as_ref())
    });
    if up_to_date {
        return Ok(false);
    }
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
    Ok(true)
}

/// Deletes the binding Secret of a resource (gone already is fine).
pub async fn delete_binding(client: &kube::Client, obj: &Gcs) -> Result<()> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
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
