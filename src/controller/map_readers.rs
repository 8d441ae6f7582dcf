//! Who may read a namespace's bucket map through the API server: the
//! namespace's own ServiceAccounts (the sidecar watches the map with its
//! pod's token), nobody else's, and nothing but the map.
//!
//! The chart's ClusterRole (`--map-reader-role`, `bucketmap-map-reader`)
//! allows get, list and watch of ConfigMaps by the map's name only. In a
//! cluster-wide install the operator binds it in each namespace that has a
//! `Gcs` (RoleBinding [`MAP_READER_BINDING`], subject the group
//! `system:serviceaccounts:<namespace>`), so no namespace's pods can read
//! another's map: a ClusterRoleBinding would grant every map to every
//! ServiceAccount. The operator may grant that ClusterRole and no other
//! (RBAC `bind` limited to its name).
//!
//! **The rule.** The binding exists while the namespace has a `Gcs` that
//! is not being deleted. Every reconcile that applies a resource (past
//! the validation of its spec) makes sure of it from the cache
//! ([`ensure`], before the map's first write);
//! the cleanup of the namespace's last such resource removes it
//! ([`release`]), after unpublishing that resource's entry. The
//! ConfigMap is no owner for it: the map outlives its last entry (written
//! empty, never deleted), and the binding must exist before the map does.
//!
//! **Every write says what it was computed from.** The apply carries
//! nothing read from the cluster (the name, the role and the namespace):
//! server-side apply under [`crate::FIELD_MANAGER`], without force unless
//! it takes back the operator's own binding from an edit. The
//! delete is decided from a consistent list of the namespace's resources
//! and a live read of the binding, and carries that read's uid and
//! resourceVersion as preconditions; a binding without the operator's
//! label (`app.kubernetes.io/managed-by=bucketmap`) is never changed or
//! deleted. A resource created while the last one's cleanup deletes the
//! binding is reconciled again when the binding's deletion reaches the
//! cache (`watches.rs`), and binds it again.

use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use tracing::{debug, info, warn};

use super::Context;
use crate::crd::Gcs;
use crate::publish::MANAGED_BY;
use crate::slots::Slot;
use crate::{Error, Result};

/// Name of the RoleBinding in each namespace with a `Gcs`.
pub const MAP_READER_BINDING: &str = "bucketmap-map-reader";

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Resources per page when looking for one that remains.
const LIST_PAGE: u32 = 100;

/// The group of every ServiceAccount of `ns`.
fn service_accounts_of(ns: &str) -> String {
    format!("system:serviceaccounts:{ns}")
}

/// Whether the operator made `rb` (its label says so).
pub(super) fn is_ours(rb: &RoleBinding) -> bool {
    rb.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
}

/// Whether `rb` binds `role` to the ServiceAccounts of its namespace, and
/// to nobody else.
fn binds_role(rb: &RoleBinding, role: &str) -> bool {
    let ns = rb.namespace().unwrap_or_default();
    let role_ref = &rb.role_ref;
    let subjects = rb.subjects.as_deref().unwrap_or_default();
    let group = service_accounts_of(&ns);
    role_ref.kind == "ClusterRole"
        && role_ref.name == role
        && role_ref.api_group == RBAC_GROUP
        && subjects.len() == 1
        && subjects
            .iter()
            .all(|s| s.kind == "Group" && s.name == group && s.namespace.is_none())
}

/// Whether a change of the cached binding `rb` needs a reconcile of its
/// namespace: the operator's binding no longer as it wrote it.
pub(super) fn needs_repair(rb: &RoleBinding, role: &str) -> bool {
    is_ours(rb) && !binds_role(rb, role)
}

/// Makes sure namespace `ns` has the binding, when the operator manages
/// it: written when the cache shows none, or the operator's own not as
/// desired; another's of that name is left alone (and said so).
pub(super) async fn ensure(ctx: &Context, ns: &str, slot: &mut Slot) -> Result<()> {
    let Some(role) = ctx.config.map_reader_role.as_deref() else {
        return Ok(());
    };
    slot.released_while(synced(&ctx.role_bindings)).await??;
    let api: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    let cached = ctx
        .role_bindings
        .get(&ObjectRef::new(MAP_READER_BINDING).within(ns));
    let force = match cached.as_deref() {
        None => false,
        Some(rb) if !is_ours(rb) => {
            warn!(namespace = %ns, binding = MAP_READER_BINDING, "a RoleBinding of this name is not bucketmap's; left alone: the namespace's sidecars may not be able to read the bucket map");
            return Ok(());
        }
        Some(rb) if binds_role(rb, role) => return Ok(()),
        // Its roleRef cannot change: replaced whole.
        Some(rb) if rb.role_ref.name != role || rb.role_ref.kind != "ClusterRole" => {
            delete_exactly(&api, rb).await?;
            false
        }
        // The operator's own, edited by somebody: its fields taken back.
        Some(_) => true,
    };
    apply(&api, ns, role, force).await
}

/// Writes the binding of `role` to the ServiceAccounts of `ns` (`force`:
/// taking back fields another manager changed).
async fn apply(api: &Api<RoleBinding>, ns: &str, role: &str, force: bool) -> Result<()> {
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": MAP_READER_BINDING,
            "namespace": ns,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
        },
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": service_accounts_of(ns)}],
    });
    let mut params = PatchParams::apply(crate::FIELD_MANAGER);
    params.force = force;
    api.patch(MAP_READER_BINDING, &params, &Patch::Apply(&binding))
    .await
    .map_err(Error::kube(format!(
        "bind ClusterRole {role} to the ServiceAccounts of namespace {ns} (RoleBinding {ns}/{MAP_READER_BINDING})"
    )))?;
    info!(namespace = %ns, role, "the namespace's ServiceAccounts may read its bucket map");
    Ok(())
}

/// Removes the binding of `obj`'s namespace when no other `Gcs` there
/// remains that is not being deleted: the operator's own only, and only
/// as it was read just before.
pub(super) async fn release(ctx: &Context, obj: &Gcs) -> Result<()> {
    if ctx.config.map_reader_role.is_none() {
        return Ok(());
    }
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    if another_remains(ctx, &ns, obj).await? {
        return Ok(());
    }
    let api: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let live = api
        .get_opt(MAP_READER_BINDING)
        .await
        .map_err(Error::kube(format!(
            "read RoleBinding {ns}/{MAP_READER_BINDING}"
        )))?;
    match live {
        Some(rb) if is_ours(&rb) => {
            delete_exactly(&api, &rb).await?;
            info!(namespace = %ns, "the namespace's last Gcs is gone: its ServiceAccounts no longer read the bucket map");
        }
        Some(_) => debug!(namespace = %ns, "the map reader binding is not bucketmap's; kept"),
        None => {}
    }
    Ok(())
}

/// Whether namespace `ns` has a `Gcs` other than `obj` that is not being
/// deleted: a consistent list (its pages one snapshot), not the cache,
/// which may still show a resource that is gone. Stops at the first.
async fn another_remains(ctx: &Context, ns: &str, obj: &Gcs) -> Result<bool> {
    let api: Api<Gcs> = Api::namespaced(ctx.client.clone(), ns);
    let remains = |g: &PartialObjectMeta<Gcs>| {
        g.uid() != obj.uid() && g.metadata.deletion_timestamp.is_none()
    };
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(Error::kube(format!(
                "list the Gcs resources of namespace {ns}"
            )))?;
        if page.items.iter().any(remains) {
            return Ok(true);
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(false),
        }
    }
}

/// Deletes `rb` if it is still the object read (its uid and
/// resourceVersion); gone already is fine.
async fn delete_exactly(api: &Api<RoleBinding>, rb: &RoleBinding) -> Result<()> {
    let ns = rb.namespace().unwrap_or_default();
    let params = DeleteParams::default().preconditions(Preconditions {
        uid: rb.uid(),
        resource_version: rb.resource_version(),
    });
    match api.delete(MAP_READER_BINDING, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "delete RoleBinding {ns}/{MAP_READER_BINDING} as read (uid {:?}, resourceVersion {:?})",
            rb.uid(),
            rb.resource_version()
        ))(e)),
    }
}

/// Waits for the binding cache (the reconcile gives its work slot back
/// meanwhile): an empty one would have every reconcile write the binding
/// again.
async fn synced(store: &Store<RoleBinding>) -> Result<()> {
    loop {
        // Re-poll: a store's readiness future wakes only its latest poller.
        let wait = store.wait_until_ready();
        match tokio::time::timeout(std::time::Duration::from_millis(200), wait).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(_)) => {
                return Err(Error::Publish(
                    "the map reader RoleBinding cache was dropped before it synced".into(),
                ));
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(ns: &str, labels: serde_json::Value, role: &str, group: &str) -> RoleBinding {
        serde_json::from_value(json!({
            "metadata": {"name": MAP_READER_BINDING, "namespace": ns, "labels": labels},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": group}],
        }))
        .expect("a RoleBinding")
    }

    #[test]
    fn only_the_operators_binding_not_as_written_needs_repair() {
        let ours = json!({"app.kubernetes.io/managed-by": "bucketmap"});
        let role = "bucketmap-map-reader";
        let as_written = binding(
            "team-a",
            ours.clone(),
            role,
            "system:serviceaccounts:team-a",
        );
        assert!(binds_role(&as_written, role));
        assert!(!needs_repair(&as_written, role));
        for wrong in [
            binding(
                "team-a",
                ours.clone(),
                role,
                "system:serviceaccounts:team-b",
            ),
            binding(
                "team-a",
                ours.clone(),
                "admin",
                "system:serviceaccounts:team-a",
            ),
            binding("team-a", ours.clone(), role, "system:serviceaccounts"),
        ] {
            assert!(needs_repair(&wrong, role), "{wrong:?}");
        }
        let mut widened = as_written.clone();
        widened
            .subjects
            .get_or_insert_default()
            .push(Default::default());
        assert!(needs_repair(&widened, role), "a second subject");
        let theirs = binding(
            "team-a",
            json!({"app.kubernetes.io/managed-by": "Helm"}),
            "x",
            "y",
        );
        assert!(!is_ours(&theirs));
        assert!(!needs_repair(&theirs, role), "another's is never touched");
    }
}
