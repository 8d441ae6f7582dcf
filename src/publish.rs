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

/// Annotation of the operator's cached copy of a binding Secret (never of
/// the Secret on the API server): the [`data_digest`] of its data, which
/// the cache does not keep (see [`trim_cached_binding`]).
pub const CACHED_DATA_DIGEST: &str = "bucketmap.dev/cached-data-digest";

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
    let up_to_date = current.is_some_and(|s| cached_secret_matches(&s, &data));
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

/// Whether a cached binding Secret (data replaced by its digest) holds
/// `data` and has the binding's type.
fn cached_secret_matches(cached: &Secret, data: &BTreeMap<String, ByteString>) -> bool {
    let digest = cached.annotations().get(CACHED_DATA_DIGEST);
    digest == Some(&data_digest(Some(data))) && cached.type_.as_deref() == Some(BINDING_SECRET_TYPE)
}

/// Trims a binding Secret about to be cached to what [`write_binding`]
/// reads: its owner references, its type and, in the
/// [`CACHED_DATA_DIGEST`] annotation (the only one kept), the digest of its
/// data. Its data, labels (the watch selects on them already), other
/// annotations and `managedFields` are dropped: 5000 binding Secrets' data
/// maps and labels cost the operator several MiB of heap (issue 15).
pub fn trim_cached_binding(secret: &mut Secret) {
    let digest = data_digest(secret.data.take().as_ref());
    secret.string_data = None;
    secret.metadata.managed_fields = None;
    secret.metadata.labels = None;
    secret.metadata.annotations = Some([(CACHED_DATA_DIGEST.to_owned(), digest)].into());
}

/// SHA-256 of a Secret's data, in hex. sha2 (already a dependency) rather
/// than std's `DefaultHasher`: both would do, as the digest never leaves
/// the process, but SHA-256 is stable across Rust versions and no user edit
/// can collide with the operator's data by chance. Each key and value is
/// prefixed by its length, so that no two maps share an input.
pub fn data_digest(data: Option<&BTreeMap<String, ByteString>>) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (key, ByteString(value)) in data.into_iter().flatten() {
        hasher.update((key.len() as u64).to_le_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_le_bytes());
        hasher.update(value);
    }
    hasher
        .finalize()
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            hex.push_str(&format!("{byte:02x}"));
            hex
        })
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

    fn gcs(name: &str, bucket_name: &str) -> Gcs {
        let mut g = Gcs::new(
            name,
            serde_json::from_value(serde_json::json!({"bucketName": bucket_name})).expect("spec"),
        );
        g.metadata.namespace = Some("ns".into());
        g
    }

    /// The binding Secret as the cache holds it, with `data`.
    fn cached(data: BTreeMap<String, ByteString>, type_: &str) -> Secret {
        let mut s = Secret {
            metadata: kube::api::ObjectMeta {
                labels: Some([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())].into()),
                annotations: Some([("note".to_owned(), "big".to_owned())].into()),
                managed_fields: Some(vec![Default::default()]),
                ..Default::default()
            },
            data: Some(data),
            string_data: Some([("extra".to_owned(), "x".to_owned())].into()),
            type_: Some(type_.to_owned()),
            ..Secret::default()
        };
        trim_cached_binding(&mut s);
        s
    }

    #[test]
    fn the_cache_keeps_a_digest_instead_of_the_data() {
        let data = binding_data(&gcs("photos", "photos"), "photos-k3x9", "p");
        let s = cached(data.clone(), BINDING_SECRET_TYPE);
        assert_eq!(s.data, None);
        assert_eq!(s.string_data, None);
        assert_eq!(s.metadata.labels, None);
        assert_eq!(s.metadata.managed_fields, None);
        let digest = data_digest(Some(&data));
        let only_the_digest = [(CACHED_DATA_DIGEST.to_owned(), digest)].into();
        assert_eq!(s.metadata.annotations, Some(only_the_digest));
        assert!(cached_secret_matches(&s, &data));
    }

    #[test]
    fn data_edited_by_a_user_no_longer_matches() {
        let g = gcs("photos", "photos");
        let data = binding_data(&g, "photos-k3x9", "p");
        let mut edited = data.clone();
        edited.insert("bucket".into(), ByteString(b"other".to_vec()));
        assert!(!cached_secret_matches(
            &cached(edited, BINDING_SECRET_TYPE),
            &data
        ));
        let mut added = data.clone();
        added.insert("extra".into(), ByteString(Vec::new()));
        assert!(!cached_secret_matches(
            &cached(added, BINDING_SECRET_TYPE),
            &data
        ));
        let mut removed = data.clone();
        removed.remove("uri");
        assert!(!cached_secret_matches(
            &cached(removed, BINDING_SECRET_TYPE),
            &data
        ));
        assert!(!cached_secret_matches(
            &cached(data.clone(), "Opaque"),
            &data
        ));
        let no_data = cached(BTreeMap::new(), BINDING_SECRET_TYPE);
        assert!(!cached_secret_matches(&no_data, &data));
        let other_project = binding_data(&g, "photos-k3x9", "q");
        assert!(!cached_secret_matches(
            &cached(other_project, BINDING_SECRET_TYPE),
            &data
        ));
    }

    #[test]
    fn the_digest_does_not_mix_keys_and_values() {
        let one =
            |k: &str, v: &str| BTreeMap::from([(k.to_owned(), ByteString(v.as_bytes().to_vec()))]);
        assert_ne!(
            data_digest(Some(&one("ab", "c"))),
            data_digest(Some(&one("a", "bc")))
        );
        assert_eq!(
            data_digest(Some(&one("a", "b"))),
            data_digest(Some(&one("a", "b")))
        );
        assert_eq!(data_digest(Some(&one("a", "b"))).len(), 64);
    }
}
