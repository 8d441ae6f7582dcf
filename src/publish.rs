//! Publishing Ready buckets to the workloads of their namespace.
//!
//! - The bucket map: see [`crate::bucket_map`].
//! - A Service Binding Secret per `Gcs` (the Provisioned Service of the
//!   Service Binding specification): `type`, `provider`, `bucket`,
//!   `logical-bucket`, `project`, `uri`. No credentials.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
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
    secrets: &Store<CachedBinding>,
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
        && !s.controlled_by(obj)
    {
        return Err(Error::BindingNotOwned(format!(
            "Secret {ns}/{secret_name} exists and is not controlled by this Gcs; the binding is not written and the Secret is left untouched (delete or rename it)"
        )));
    }
    let up_to_date = current.is_some_and(|s| s.holds(&data));
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

/// What the operator's cache keeps of a binding Secret: whose it is and a
/// digest of what it holds, not the Secret itself. One is cached per
/// resource, so its size is the operator's memory at scale: a whole
/// cached Secret (metadata, maps) costs several times more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedBinding {
    name: String,
    namespace: Option<String>,
    /// The uid of the Secret's controlling owner.
    controller: Option<String>,
    /// [`content_digest`] of the Secret's type and data.
    digest: [u8; 32],
}

impl CachedBinding {
    /// What the cache keeps of `secret`.
    pub fn of(secret: &Secret) -> Self {
        CachedBinding {
            name: secret.name_any(),
            namespace: secret.namespace(),
            controller: controller_of(secret).map(str::to_owned),
            digest: content_digest(secret.type_.as_deref(), secret.data.as_ref()),
        }
    }

    /// The cache's event for a watch event of a Secret.
    pub fn of_event(event: watcher::Event<Secret>) -> watcher::Event<Self> {
        use watcher::Event;
        match event {
            Event::Apply(s) => Event::Apply(Self::of(&s)),
            Event::Delete(s) => Event::Delete(Self::of(&s)),
            Event::Init => Event::Init,
            Event::InitApply(s) => Event::InitApply(Self::of(&s)),
            Event::InitDone => Event::InitDone,
        }
    }

    /// Whether `owner` is the Secret's controller.
    fn controlled_by(&self, owner: &Gcs) -> bool {
        is_controller(self.controller.as_deref(), owner)
    }

    /// Whether the Secret is a binding holding exactly `data`.
    fn holds(&self, data: &BTreeMap<String, ByteString>) -> bool {
        self.digest == content_digest(Some(BINDING_SECRET_TYPE), Some(data))
    }
}

impl kube::runtime::reflector::Lookup for CachedBinding {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        <Secret as Resource>::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        <Secret as Resource>::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        <Secret as Resource>::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <Secret as Resource>::plural(&())
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.namespace.as_deref().map(Cow::Borrowed)
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// SHA-256 of a Secret's type and data. sha2 (already a dependency) rather
/// than std's `DefaultHasher`: both would do, as the digest never leaves
/// the process, but SHA-256 is stable across Rust versions and no user edit
/// can collide with the operator's content by chance. The type and each key
/// and value are prefixed by their length (the type by a presence byte
/// too), so that no two contents share an input.
fn content_digest(type_: Option<&str>, data: Option<&BTreeMap<String, ByteString>>) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    match type_ {
        Some(t) => {
            field(&[1]);
            field(t.as_bytes());
        }
        None => field(&[0]),
    }
    for (key, ByteString(value)) in data.into_iter().flatten() {
        field(key.as_bytes());
        field(value);
    }
    hasher.finalize().into()
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
    is_controller(controller_of(secret), owner)
}

/// The uid of `secret`'s controller (the API server allows at most one).
fn controller_of(secret: &Secret) -> Option<&str> {
    secret
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Whether `controller`, a Secret's controller uid, is `owner`.
fn is_controller(controller: Option<&str>, owner: &Gcs) -> bool {
    controller.is_some() && controller == owner.meta().uid.as_deref()
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

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
    fn cached(data: BTreeMap<String, ByteString>, type_: &str) -> CachedBinding {
        CachedBinding::of(&Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("photos-gcs-binding".into()),
                namespace: Some("ns".into()),
                labels: Some([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())].into()),
                annotations: Some([("note".to_owned(), "big".to_owned())].into()),
                managed_fields: Some(vec![Default::default()]),
                ..Default::default()
            },
            data: Some(data),
            string_data: Some([("extra".to_owned(), "x".to_owned())].into()),
            type_: Some(type_.to_owned()),
            ..Secret::default()
        })
    }

    #[test]
    fn the_cache_keeps_a_digest_instead_of_the_data() {
        let data = binding_data(&gcs("photos", "photos"), "photos-k3x9", "p");
        let c = cached(data.clone(), BINDING_SECRET_TYPE);
        assert!(c.holds(&data));
        assert_eq!(
            kube::runtime::reflector::Lookup::to_object_ref(&c, ()),
            ObjectRef::new("photos-gcs-binding").within("ns")
        );
        assert_eq!(
            c.digest,
            content_digest(Some(BINDING_SECRET_TYPE), Some(&data))
        );
    }

    #[test]
    fn data_edited_by_a_user_no_longer_matches() {
        let g = gcs("photos", "photos");
        let data = binding_data(&g, "photos-k3x9", "p");
        let mut edited = data.clone();
        edited.insert("bucket".into(), ByteString(b"other".to_vec()));
        assert!(!cached(edited, BINDING_SECRET_TYPE).holds(&data));
        let mut added = data.clone();
        added.insert("extra".into(), ByteString(Vec::new()));
        assert!(!cached(added, BINDING_SECRET_TYPE).holds(&data));
        let mut removed = data.clone();
        removed.remove("uri");
        assert!(!cached(removed, BINDING_SECRET_TYPE).holds(&data));
        assert!(!cached(data.clone(), "Opaque").holds(&data));
        assert!(!cached(BTreeMap::new(), BINDING_SECRET_TYPE).holds(&data));
        let other_project = binding_data(&g, "photos-k3x9", "q");
        assert!(!cached(other_project, BINDING_SECRET_TYPE).holds(&data));
    }

    #[test]
    fn the_cache_knows_the_controller_only() {
        let mut owner = gcs("photos", "photos");
        owner.metadata.uid = Some("uid-1".into());
        let reference = |uid: &str, controller: Option<bool>| OwnerReference {
            uid: uid.into(),
            controller,
            ..Default::default()
        };
        let with = |refs: Vec<OwnerReference>| {
            let mut s = Secret::default();
            s.metadata.name = Some("photos-gcs-binding".into());
            s.metadata.owner_references = Some(refs);
            CachedBinding::of(&s)
        };
        assert!(with(vec![reference("uid-1", Some(true))]).controlled_by(&owner));
        assert!(
            with(vec![reference("x", None), reference("uid-1", Some(true))]).controlled_by(&owner)
        );
        assert!(!with(vec![reference("uid-1", None)]).controlled_by(&owner));
        assert!(!with(vec![reference("uid-1", Some(false))]).controlled_by(&owner));
        assert!(!with(vec![reference("uid-2", Some(true))]).controlled_by(&owner));
        assert!(!with(Vec::new()).controlled_by(&owner));
        owner.metadata.uid = None;
        assert!(!with(vec![reference("uid-1", Some(true))]).controlled_by(&owner));
    }

    #[test]
    fn the_digest_does_not_mix_type_keys_and_values() {
        let one =
            |k: &str, v: &str| BTreeMap::from([(k.to_owned(), ByteString(v.as_bytes().to_vec()))]);
        let t = Some(BINDING_SECRET_TYPE);
        assert_ne!(
            content_digest(t, Some(&one("ab", "c"))),
            content_digest(t, Some(&one("a", "bc")))
        );
        assert_eq!(
            content_digest(t, Some(&one("a", "b"))),
            content_digest(t, Some(&one("a", "b")))
        );
        assert_ne!(
            content_digest(Some("a"), None),
            content_digest(None, Some(&one("a", "")))
        );
        assert_ne!(content_digest(Some(""), None), content_digest(None, None));
    }
}
