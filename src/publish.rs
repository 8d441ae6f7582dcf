//! Publishing Ready buckets to the workloads of their namespace.
//!
//! - The bucket map: see [`crate::bucket_map`].
//! - A Service Binding Secret per `Gcs` (the Provisioned Service of the
//!   Service Binding specification): `type`, `provider`, `bucket`,
//!   `logical-bucket`, `project`, `uri`. No credentials.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
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
    let absent = current.is_none();
    if let Some(s) = &current
        && !controlled_by(s, obj)
    {
        return Err(Error::BindingNotOwned(format!(
            "Secret {ns}/{secret_name} exists and is not controlled by this Gcs; the binding is not written and the Secret is left untouched (delete or rename it)"
        )));
    }
    let up_to_date = current.is_some_and(|s| {
        s.data.as_ref() == Some(&data) && s.type_.as_deref() == Some(BINDING_SECRET_TYPE)
    });
    if up_to_date {
        return Ok(false);
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(secret_name.clone()),
            namespace: Some(ns.clone()),
            labels: Some([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())].into()),
            owner_references: Some(obj.controller_owner_ref(&()).into_iter().collect()),
            ..Default::default()
        },
        type_: Some(BINDING_SECRET_TYPE.to_owned()),
        data: Some(data),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    if absent && create_binding(&api, &secret, obj).await? {
        return Ok(true);
    }
    api.patch(
        &secret_name,
        &PatchParams::apply(crate::controller::FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await
    .map_err(Error::kube(format!(
        "write binding Secret {ns}/{secret_name}"
    )))?;
    Ok(true)
}

/// Creates a binding Secret the cache does not know: a plain create costs
/// the API server less than a server-side apply of a new object (no read
/// before the write). `false` when a Secret of that name exists after all:
/// ours (the cache lagged), and the caller applies instead; somebody else's
/// is an error, and is never overwritten.
async fn create_binding(api: &Api<Secret>, secret: &Secret, owner: &Gcs) -> Result<bool> {
    let name = secret.name_any();
    let params = PostParams {
        field_manager: Some(crate::controller::FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match api.create(&params, secret).await {
        Ok(_) => return Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("create binding Secret {name}"))(e)),
    }
    let existing = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read binding Secret {name}")))?;
    match existing {
        Some(s) if !controlled_by(&s, owner) => Err(Error::BindingNotOwned(format!(
            "Secret {name} exists and is not controlled by this Gcs; the binding is not written and the Secret is left untouched (delete or rename it)"
        ))),
        _ => Ok(false),
    }
}

/// Whether `secret` names `owner` as its controller.
fn controlled_by(secret: &Secret, owner: &Gcs) -> bool {
    let uid = owner.meta().uid.as_deref();
    secret
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// Deletes the binding Secret of a resource (gone already is fine). A
/// Secret of that name that this resource does not control is left alone.
pub async fn delete_binding(client: &kube::Client, obj: &Gcs) -> Result<()> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let secret_name = binding_secret_name(&obj.name_any());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let context = || format!("delete binding Secret {ns}/{secret_name}");
    let current = secrets
        .get_opt(&secret_name)
        .await
        .map_err(Error::kube(context()))?;
    let Some(uid) = current
        .filter(|s| controlled_by(s, obj))
        .and_then(|s| s.uid())
    else {
        return Ok(());
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match secrets.delete(&secret_name, &params).await {
        Ok(_) => Ok(()),
        // Gone, or replaced by another object since the read: not ours.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(context())(e)),
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
