//! Who may use the bucket: the grants of `spec.access` in its IAM policy.
//!
//! Each reconcile resolves `spec.access` to IAM members (refusing what the
//! namespace may not grant), records the grants it is about to make in
//! `status.access` *before* writing (so a restart never forgets one), then
//! edits the policy by read-modify-write with the etag precondition: only
//! its own grants are added or removed, a concurrent edit makes it read
//! again, and nothing is written when the policy is already as declared.
//! On deletion every recorded grant is revoked.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info};

use super::Context;
use super::status::StatusWriter;
use crate::conditions::{ACCESS, reason};
use crate::crd::{AccessGrant, Gcs, GrantedAccess};
use crate::gcs::{GcsError, GcsErrorKind, PolicyWrite};
use crate::iam::{
    self, ALLOWED_MEMBERS_ANNOTATION, ALLOWED_ROLES_ANNOTATION, Grant, PolicyEdit, WorkloadIdentity,
};
use crate::{Error, Result};

/// Read-modify-write rounds before a policy that keeps changing is an error.
const MAX_POLICY_ATTEMPTS: u32 = 5;

/// What `spec.access` resolves to.
#[derive(Debug, Default, PartialEq, Eq)]
struct Resolution {
    /// The grants to have in the policy.
    granted: Vec<GrantedAccess>,
    /// Why some grants wait (their ServiceAccount does not exist yet).
    pending: Vec<String>,
    /// Why some grants are refused.
    refused: Vec<String>,
}

/// What a namespace's annotations allow its resources to grant.
#[derive(Debug, Default, Clone, Copy)]
struct Allowed<'a> {
    /// [`ALLOWED_MEMBERS_ANNOTATION`].
    members: Option<&'a str>,
    /// [`ALLOWED_ROLES_ANNOTATION`].
    roles: Option<&'a str>,
}

/// Resolves `access` of a resource in namespace `ns`: `allowed` is what
/// the namespace's annotations allow, `service_account` the annotations
/// of a ServiceAccount of `ns` by name (`None`: it does not exist), `pool`
/// the cluster's Workload Identity pool.
fn resolve(
    ns: &str,
    access: &[AccessGrant],
    allowed: Allowed<'_>,
    service_account: impl Fn(&str) -> Option<BTreeMap<String, String>>,
    pool: Option<&WorkloadIdentity>,
) -> Resolution {
    let mut out = Resolution::default();
    for grant in access {
        let role = match iam::role_for(&grant.role, ns, allowed.roles) {
            Ok(role) => role,
            Err(why) => {
                out.refused.push(why);
                continue;
            }
        };
        let member = match (&grant.service_account, &grant.member) {
            (Some(sa), None) => match service_account(sa) {
                None => {
                    let why = format!("ServiceAccount {ns}/{sa} does not exist yet");
                    out.pending.push(why);
                    continue;
                }
                Some(annotations) => iam::service_account_member(ns, sa, &annotations, pool),
            },
            (None, Some(member)) => {
                iam::check_member(ns, member, allowed.members).map(|()| member.clone())
            }
            _ => Err("a grant names exactly one of serviceAccount or member".to_owned()),
        };
        match member {
            Ok(member) => out.granted.push(GrantedAccess {
                member,
                role,
                service_account: grant.service_account.clone(),
                condition: grant.condition.clone(),
            }),
            Err(why) => out.refused.push(why),
        }
    }
    out.granted.sort_by(|a, b| key(a).cmp(&key(b)));
    out.granted.dedup_by(|a, b| key(a) == key(b));
    out
}

/// What makes a grant the same grant: member, role and condition.
fn key(g: &GrantedAccess) -> (&String, &String, &Option<crate::crd::IamCondition>) {
    (&g.member, &g.role, &g.condition)
}

fn grants(access: &[GrantedAccess]) -> BTreeSet<Grant> {
    access
        .iter()
        .map(|a| Grant {
            member: a.member.clone(),
            role: a.role.clone(),
            condition: a.condition.clone(),
        })
        .collect()
}

/// Resolves `spec.access` with the operator's caches.
fn resolve_with_caches(obj: &Gcs, ctx: &Context) -> Resolution {
    let ns = obj.namespace().unwrap_or_default();
    let namespace = ctx.namespaces.get(&ObjectRef::new(&ns));
    let annotation = |key: &str| {
        namespace
            .as_ref()
            .and_then(|n| n.annotations().get(key).cloned())
    };
    let (members, roles) = (
        annotation(ALLOWED_MEMBERS_ANNOTATION),
        annotation(ALLOWED_ROLES_ANNOTATION),
    );
    let allowed = Allowed {
        members: members.as_deref(),
        roles: roles.as_deref(),
    };
    let lookup = |name: &str| {
        ctx.service_accounts
            .get(&ObjectRef::new(name).within(&ns))
            .map(|sa| sa.annotations().clone())
    };
    let pool = ctx.config.workload_identity.as_ref();
    resolve(&ns, &obj.spec.access, allowed, lookup, pool)
}

/// Puts the grants of `spec.access` in bucket `physical`'s policy and
/// revokes the recorded ones that left it; says how it went in the
/// `Access` condition and in events.
pub(super) async fn grant_access(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    physical: &str,
) -> Result<()> {
    let previous = grants(&status.status.access);
    if obj.spec.access.is_empty() && previous.is_empty() {
        status.condition(ACCESS, None);
        return Ok(());
    }
    let resolution = resolve_with_caches(obj, ctx);
    let desired = grants(&resolution.granted);
    record_intent(status, &resolution.granted).await?;
    let edit = match write_grants(ctx, physical, &desired, &previous).await {
        Ok(edit) => edit,
        Err(e) => {
            status.condition(ACCESS, Some(write_failed(&resolution, &e)));
            return Err(e);
        }
    };
    announce(obj, ctx, physical, &edit, &previous);
    status.status.access = resolution.granted.clone();
    if obj.spec.access.is_empty() {
        // Everything recorded was revoked: nothing is declared any more.
        status.condition(ACCESS, None);
    } else {
        report(obj, ctx, status, physical, &resolution);
    }
    Ok(())
}

/// Reports the grants of `spec.access` that the namespace may not make in
/// the `Access` condition, before any GCS call: the refusal depends only
/// on the spec and the namespace, so it shows even while GCS is
/// unreachable or refuses to let the policy be read.
pub(super) fn report_refusals(obj: &Gcs, ctx: &Context, status: &mut StatusWriter<'_>) {
    if obj.spec.access.is_empty() {
        return;
    }
    let resolution = resolve_with_caches(obj, ctx);
    if !resolution.refused.is_empty() {
        // Refused: the message names no bucket, so the later report
        // finds it unchanged and warns only once.
        set_condition(obj, ctx, status, condition_of(&resolution, ""));
    }
}

/// The `Access` condition after the policy write failed with `error`: a
/// refusal stays the reason, the failure is added to it.
fn write_failed(resolution: &Resolution, error: &Error) -> (bool, &'static str, String) {
    if resolution.refused.is_empty() {
        return (false, failure_reason(error), error.to_string());
    }
    let refused = resolution.refused.join("; ");
    let message = format!("{refused}; the grants allowed could not be written: {error}");
    (false, reason::ACCESS_NOT_ALLOWED, message)
}

/// The reason of a condition (`Access`, `Notifications`) whose GCS calls
/// failed with `error`.
pub(super) fn failure_reason(error: &Error) -> &'static str {
    match error {
        Error::Gcs(e) if e.kind == GcsErrorKind::PermissionDenied => reason::PERMISSION_DENIED,
        _ => reason::GCS_ERROR,
    }
}

/// Records grants about to be made in `status.access` before the policy
/// is written: a crash after the write must not forget them.
async fn record_intent(status: &mut StatusWriter<'_>, granted: &[GrantedAccess]) -> Result<()> {
    let recorded = &status.status.access;
    let new: Vec<GrantedAccess> = granted
        .iter()
        .filter(|g| !recorded.iter().any(|r| key(r) == key(g)))
        .cloned()
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    status.status.access.extend(new);
    status.flush().await
}

/// Adds `grant` and removes `revoke` in bucket `physical`'s policy by
/// read-modify-write with the etag precondition, reading again after a
/// concurrent edit. A missing bucket has nothing to edit.
async fn write_grants(
    ctx: &Context,
    physical: &str,
    grant: &BTreeSet<Grant>,
    revoke: &BTreeSet<Grant>,
) -> Result<PolicyEdit> {
    for attempt in 1..=MAX_POLICY_ATTEMPTS {
        let Some(mut policy) = ctx.gcs.get_iam_policy(physical).await? else {
            return Ok(PolicyEdit::default());
        };
        let edit = iam::edit_policy(&mut policy, grant, revoke);
        if edit.is_empty() {
            return Ok(edit);
        }
        match ctx.gcs.set_iam_policy(physical, policy).await? {
            PolicyWrite::Written(_) => return Ok(edit),
            PolicyWrite::Stale => {
                debug!(bucket = %physical, attempt, "IAM policy changed since it was read; reading again");
            }
        }
    }
    Err(Error::Gcs(GcsError {
        kind: GcsErrorKind::Unavailable,
        operation: "SetIamPolicy",
        bucket: physical.to_owned(),
        message: format!(
            "the policy changed between read and write {MAX_POLICY_ATTEMPTS} times in a row"
        ),
    }))
}

/// Events for what an edit changed: grants made (restored when they had
/// been made before and were removed out of band) and revoked.
fn announce(
    obj: &Gcs,
    ctx: &Context,
    physical: &str,
    edit: &PolicyEdit,
    previous: &BTreeSet<Grant>,
) {
    for g in &edit.added {
        let (kind, why, note) = if previous.contains(g) {
            let note = format!(
                "Grant of {g} on bucket {physical} was removed outside of bucketmap; restored"
            );
            (EventType::Warning, "AccessRestored", note)
        } else {
            let note = format!("Granted {g} on bucket {physical}");
            (EventType::Normal, reason::ACCESS_GRANTED, note)
        };
        info!(bucket = %physical, grant = %g, why, "IAM grant");
        ctx.event(obj, kind, why, "SetIamPolicy", note);
    }
    for g in &edit.removed {
        info!(bucket = %physical, grant = %g, "IAM grant revoked");
        let note = format!("Revoked {g} on bucket {physical}");
        ctx.event(
            obj,
            EventType::Normal,
            "AccessRevoked",
            "SetIamPolicy",
            note,
        );
    }
}

/// The `Access` condition, and a warning when a refusal is new.
fn report(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    physical: &str,
    resolution: &Resolution,
) {
    set_condition(obj, ctx, status, condition_of(resolution, physical));
}

/// The `Access` condition of `resolution` on bucket `physical`.
fn condition_of(resolution: &Resolution, physical: &str) -> (bool, &'static str, String) {
    if !resolution.refused.is_empty() {
        let mut all = resolution.refused.clone();
        all.extend(resolution.pending.iter().cloned());
        (false, reason::ACCESS_NOT_ALLOWED, all.join("; "))
    } else if !resolution.pending.is_empty() {
        let message = format!("{}; granted once it appears", resolution.pending.join("; "));
        (false, reason::ACCESS_PENDING, message)
    } else {
        let list: Vec<String> = grants(&resolution.granted)
            .iter()
            .map(Grant::to_string)
            .collect();
        let message = format!("Bucket {physical}: {}", list.join(", "));
        (true, reason::ACCESS_GRANTED, message)
    }
}

/// Sets the `Access` condition, with a warning when a failure is new.
fn set_condition(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    (ok, why, message): (bool, &'static str, String),
) {
    let unchanged = status
        .current(ACCESS)
        .is_some_and(|c| c.reason == why && c.message == message);
    if !ok && !unchanged {
        let kind = EventType::Warning;
        ctx.event(obj, kind, why, "SetIamPolicy", message.clone());
    }
    status.condition(ACCESS, Some((ok, why, message)));
}

/// Revokes every grant recorded in the status (the resource is going).
pub(super) async fn revoke_all(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    physical: &str,
) -> Result<()> {
    let previous = grants(&status.status.access);
    if previous.is_empty() {
        return Ok(());
    }
    let edit = write_grants(ctx, physical, &BTreeSet::new(), &previous).await?;
    announce(obj, ctx, physical, &edit, &previous);
    status.status.access.clear();
    status.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "team-a";

    fn sa(name: &str, role: &str) -> AccessGrant {
        AccessGrant {
            service_account: Some(name.into()),
            member: None,
            role: role.into(),
            condition: None,
        }
    }

    fn member(m: &str, role: &str) -> AccessGrant {
        AccessGrant {
            service_account: None,
            member: Some(m.into()),
            role: role.into(),
            condition: None,
        }
    }

    fn pool() -> WorkloadIdentity {
        WorkloadIdentity {
            pool: "acme.svc.id.goog".into(),
            project_number: "42".into(),
        }
    }

    #[test]
    fn service_accounts_resolve_pending_or_to_their_member() {
        let annotated = BTreeMap::from([(
            iam::GSA_ANNOTATION.to_owned(),
            "app@acme.iam.gserviceaccount.com".to_owned(),
        )]);
        let lookup = |name: &str| match name {
            "app" => Some(annotated.clone()),
            "plain" => Some(BTreeMap::new()),
            _ => None,
        };
        let access = [
            sa("app", "objectUser"),
            sa("plain", "objectViewer"),
            sa("later", "objectViewer"),
            sa("app", "objectUser"),
        ];
        let r = resolve(NS, &access, Allowed::default(), lookup, Some(&pool()));
        let members: Vec<(&str, &str)> = r
            .granted
            .iter()
            .map(|g| (g.member.as_str(), g.role.as_str()))
            .collect();
        assert_eq!(
            members,
            [
                (
                    "principal://iam.googleapis.com/projects/42/locations/global/workloadIdentityPools/acme.svc.id.goog/subject/ns/team-a/sa/plain",
                    "roles/storage.objectViewer"
                ),
                (
                    "serviceAccount:app@acme.iam.gserviceaccount.com",
                    "roles/storage.objectUser"
                ),
            ]
        );
        assert_eq!(
            r.pending,
            ["ServiceAccount team-a/later does not exist yet"]
        );
        assert!(r.refused.is_empty());
        let without_pool = resolve(NS, &access[1..2], Allowed::default(), lookup, None);
        assert_eq!(without_pool.refused.len(), 1, "{without_pool:?}");
    }

    #[test]
    fn members_and_roles_outside_the_rules_are_refused() {
        let access = [
            member("user:ana@acme.com", "objectViewer"),
            member("user:eve@evil.com", "objectViewer"),
            member("allUsers", "objectViewer"),
            sa("app", "storage.admin"),
            sa("app", "roles/storage.admin"),
            sa("app", "projects/acme/roles/bucketReader"),
        ];
        let allowed = Allowed {
            members: Some("domain:acme.com"),
            roles: Some("projects/acme/roles/bucketReader, roles/storage.objectAdmin"),
        };
        let r = resolve(
            NS,
            &access,
            allowed,
            |_| Some(BTreeMap::new()),
            Some(&pool()),
        );
        let app = "principal://iam.googleapis.com/projects/42/locations/global/workloadIdentityPools/acme.svc.id.goog/subject/ns/team-a/sa/app";
        let granted: Vec<(&str, &str)> = (r.granted.iter())
            .map(|g| (g.member.as_str(), g.role.as_str()))
            .collect();
        assert_eq!(
            granted,
            [
                (app, "projects/acme/roles/bucketReader"),
                ("user:ana@acme.com", "roles/storage.objectViewer"),
            ]
        );
        assert_eq!(r.refused.len(), 4, "{:?}", r.refused);
        assert!(r.refused[0].contains("user:eve@evil.com"));
        assert!(r.refused[1].contains("allUsers"));
        for refused in &r.refused[2..] {
            assert!(
                refused.contains("storage.admin") && refused.contains(ALLOWED_ROLES_ANNOTATION),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_same_member_and_role_under_two_conditions_are_two_grants() {
        let condition = |title: &str| crate::crd::IamCondition {
            title: title.into(),
            description: None,
            expression: format!("request.time < timestamp('{title}-01-01T00:00:00Z')"),
        };
        let mut a = member("user:ana@acme.com", "objectViewer");
        a.condition = Some(condition("2030"));
        let mut b = a.clone();
        b.condition = Some(condition("2031"));
        let plain = member("user:ana@acme.com", "objectViewer");
        let access = [a.clone(), b, plain, a];
        let allowed = Allowed {
            members: Some("user:ana@acme.com"),
            roles: None,
        };
        let r = resolve(NS, &access, allowed, |_| None, None);
        let conditions: Vec<Option<&str>> = (r.granted.iter())
            .map(|g| g.condition.as_ref().map(|c| c.title.as_str()))
            .collect();
        assert_eq!(conditions, [None, Some("2030"), Some("2031")]);
        assert_eq!(grants(&r.granted).len(), 3);
    }
}
