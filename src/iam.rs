//! Who may use a bucket: the IAM side of `spec.access`.
//!
//! - [`role_for`]: the role a grant names, the four object roles always,
//!   any other only where the namespace allows it;
//! - [`service_account_member`]: a Kubernetes ServiceAccount as an IAM
//!   member, in one of the two GKE Workload Identity ways;
//! - [`check_member`]: what a namespace may grant (tenant safety);
//! - [`edit_policy`]: the change to a bucket's IAM policy that adds and
//!   removes the operator's grants and touches nothing else.
//!
//! Everything here is pure; the reconciler (`controller::access`) reads and
//! writes the policy.

use std::collections::{BTreeMap, BTreeSet};

use google_cloud_iam_v1::model::{Binding, Policy};
use google_cloud_type::model::Expr;

use crate::crd::IamCondition;

/// ServiceAccount annotation naming the Google service account it acts as.
pub const GSA_ANNOTATION: &str = "iam.gke.io/gcp-service-account";
/// Namespace annotation listing the `member:` principals its resources may
/// grant: comma-separated exact members, `domain:D` or `*SUFFIX` patterns.
pub const ALLOWED_MEMBERS_ANNOTATION: &str = "bucketmap.dev/allowed-members";
/// Namespace annotation listing the full role names (beyond the four object
/// roles) its resources may grant, comma-separated.
pub const ALLOWED_ROLES_ANNOTATION: &str = "bucketmap.dev/allowed-roles";
/// IAM policy version the operator reads and writes: the one that carries
/// conditional bindings, so that none is lost.
pub const POLICY_VERSION: i32 = 3;

/// The Workload Identity Federation pool of the cluster (operator flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadIdentity {
    /// The pool, e.g. `PROJECT_ID.svc.id.goog`.
    pub pool: String,
    /// The number of the project that owns the pool.
    pub project_number: String,
}

/// One grant: an IAM member with a role on the bucket, under a condition
/// or not.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Grant {
    /// The member (`serviceAccount:...`, `principal://...`, ...).
    pub member: String,
    /// The full role (`roles/storage.objectViewer`).
    pub role: String,
    /// The condition of its binding; `None`: unconditional.
    pub condition: Option<IamCondition>,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} for {}", self.role, self.member)?;
        match &self.condition {
            Some(c) => write!(f, " if {:?}", c.title),
            None => Ok(()),
        }
    }
}

/// The full role of one of the four object roles, or `None`.
fn object_role(short: &str) -> Option<&'static str> {
    match short {
        "objectViewer" => Some("roles/storage.objectViewer"),
        "objectCreator" => Some("roles/storage.objectCreator"),
        "objectUser" => Some("roles/storage.objectUser"),
        "objectAdmin" => Some("roles/storage.objectAdmin"),
        _ => None,
    }
}

/// The IAM role a `spec.access[].role` grants in a namespace whose
/// [`ALLOWED_ROLES_ANNOTATION`] is `allowed`: the four object roles always,
/// a full role name only when the annotation lists it. `Err` says why not.
pub fn role_for(role: &str, namespace: &str, allowed: Option<&str>) -> Result<String, String> {
    if let Some(full) = object_role(role) {
        return Ok(full.to_owned());
    }
    if listed(allowed).any(|r| r == role) {
        Ok(role.to_owned())
    } else {
        Err(format!(
            "role {role} is not allowed in namespace {namespace}: beyond objectViewer, objectCreator, objectUser and objectAdmin, a role must be listed in the namespace's annotation {ALLOWED_ROLES_ANNOTATION}"
        ))
    }
}

/// The IAM member of ServiceAccount `name` in `namespace`: the Google
/// service account of its [`GSA_ANNOTATION`], else its Workload Identity
/// Federation principal. `Err` says why there is none.
pub fn service_account_member(
    namespace: &str,
    name: &str,
    annotations: &BTreeMap<String, String>,
    pool: Option<&WorkloadIdentity>,
) -> Result<String, String> {
    if let Some(email) = annotations.get(GSA_ANNOTATION) {
        let email = email.trim();
        if !is_service_account_email(email) {
            return Err(format!(
                "ServiceAccount {namespace}/{name}: annotation {GSA_ANNOTATION}={email:?} is not a Google service account email (NAME@PROJECT.iam.gserviceaccount.com)"
            ));
        }
        return Ok(format!("serviceAccount:{email}"));
    }
    match pool {
        Some(wi) => Ok(format!(
            "principal://iam.googleapis.com/projects/{}/locations/global/workloadIdentityPools/{}/subject/ns/{namespace}/sa/{name}",
            wi.project_number, wi.pool
        )),
        None => Err(format!(
            "ServiceAccount {namespace}/{name} has no annotation {GSA_ANNOTATION} and the operator runs without --workload-identity-pool and --workload-identity-project-number: it has no IAM identity"
        )),
    }
}

fn is_service_account_email(email: &str) -> bool {
    let Some((local, domain)) = email.split_once('@') else {
        return false;
    };
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    };
    name_ok(local) && name_ok(domain) && domain.ends_with("gserviceaccount.com")
}

/// Whether a resource in `namespace` may grant to `member`, given the
/// namespace's [`ALLOWED_MEMBERS_ANNOTATION`] (`allowed`). Public
/// principals and identities of other namespaces are always refused.
pub fn check_member(namespace: &str, member: &str, allowed: Option<&str>) -> Result<(), String> {
    if matches!(member, "allUsers" | "allAuthenticatedUsers") {
        return Err(format!(
            "member {member} is never granted: a bucket managed by bucketmap is never public"
        ));
    }
    if let Some(other) = kubernetes_namespace_of(member).filter(|ns| *ns != namespace) {
        return Err(format!(
            "member {member} is an identity of namespace {other}: a grant can only name identities of namespace {namespace}"
        ));
    }
    if listed(allowed).any(|p| pattern_allows(p, member)) {
        return Ok(());
    }
    Err(format!(
        "member {member} is not allowed in namespace {namespace}: its annotation {ALLOWED_MEMBERS_ANNOTATION} does not list it (exact members, domain:DOMAIN or *SUFFIX patterns)"
    ))
}

/// The entries of a comma-separated namespace annotation (blank ones left out).
fn listed(annotation: Option<&str>) -> impl Iterator<Item = &str> {
    (annotation.unwrap_or_default().split(','))
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
}

fn pattern_allows(pattern: &str, member: &str) -> bool {
    if let Some(domain) = pattern.strip_prefix("domain:") {
        let email_domain = member
            .split_once(':')
            .and_then(|(_, id)| id.rsplit_once('@'))
            .map(|(_, d)| d);
        return member == pattern || email_domain == Some(domain);
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => !suffix.is_empty() && member.ends_with(suffix),
        None => member == pattern,
    }
}

/// The Kubernetes namespace a Workload Identity member stands for (a
/// ServiceAccount or a whole namespace), if it is one.
fn kubernetes_namespace_of(member: &str) -> Option<&str> {
    if let Some((_, rest)) = member.split_once("/subject/ns/") {
        return rest.split('/').next();
    }
    if let Some((_, rest)) = member.split_once("/attribute.kubernetes_namespace/") {
        return rest.split('/').next();
    }
    if let Some((_, rest)) = member.split_once("/namespace/") {
        return rest.split('/').next();
    }
    // The legacy form: serviceAccount:POOL[NAMESPACE/NAME].
    let (_, rest) = member.split_once(".svc.id.goog[")?;
    rest.split('/').next()
}

/// What [`edit_policy`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PolicyEdit {
    /// Grants that were missing and were added.
    pub added: BTreeSet<Grant>,
    /// Grants that were present and were removed.
    pub removed: BTreeSet<Grant>,
}

impl PolicyEdit {
    /// Whether the policy must be written.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// Adds `grant` and removes `revoke` in `policy`, each in the binding of
/// its role and condition (the same title, description and expression),
/// and sets the policy version to 3. Other bindings (another condition
/// included), other members, audit configs and the etag are left as they
/// are; a binding left without members is dropped. A grant in both sets is
/// kept.
pub fn edit_policy(
    policy: &mut Policy,
    grant: &BTreeSet<Grant>,
    revoke: &BTreeSet<Grant>,
) -> PolicyEdit {
    let mut edit = PolicyEdit::default();
    for g in revoke.difference(grant) {
        let Some(binding) = binding_of(policy, g) else {
            continue;
        };
        let before = binding.members.len();
        binding.members.retain(|m| *m != g.member);
        if binding.members.len() != before {
            edit.removed.insert(g.clone());
        }
    }
    policy.bindings.retain(|b| !b.members.is_empty());
    for g in grant {
        match binding_of(policy, g) {
            Some(binding) if binding.members.contains(&g.member) => continue,
            Some(binding) => binding.members.push(g.member.clone()),
            None => policy.bindings.push(
                Binding::new()
                    .set_role(g.role.clone())
                    .set_members([g.member.clone()])
                    .set_or_clear_condition(g.condition.as_ref().map(expr_of)),
            ),
        }
        edit.added.insert(g.clone());
    }
    policy.version = POLICY_VERSION;
    edit
}

/// The binding of `grant`'s role and condition.
fn binding_of<'a>(policy: &'a mut Policy, grant: &Grant) -> Option<&'a mut Binding> {
    let wanted = grant.condition.as_ref().map(expr_of);
    policy
        .bindings
        .iter_mut()
        .find(|b| b.role == grant.role && same_condition(b.condition.as_ref(), wanted.as_ref()))
}

/// Whether two conditions are the same (IAM keeps a binding per role and
/// condition; an empty description is no description).
fn same_condition(a: Option<&Expr>, b: Option<&Expr>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.title == b.title && a.description == b.description && a.expression == b.expression
        }
        _ => false,
    }
}

fn expr_of(c: &IamCondition) -> Expr {
    Expr::new()
        .set_title(c.title.clone())
        .set_description(c.description.clone().unwrap_or_default())
        .set_expression(c.expression.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_type::model::Expr;

    const NS: &str = "team-a";

    fn grant(member: &str, role: &str) -> Grant {
        Grant {
            member: member.into(),
            role: role.into(),
            condition: None,
        }
    }

    fn pool() -> WorkloadIdentity {
        WorkloadIdentity {
            pool: "acme.svc.id.goog".into(),
            project_number: "123456".into(),
        }
    }

    #[test]
    fn the_four_object_roles_always_and_other_roles_only_where_listed() {
        for short in ["objectViewer", "objectCreator", "objectUser", "objectAdmin"] {
            let full = format!("roles/storage.{short}");
            assert_eq!(role_for(short, NS, None), Ok(full.clone()));
            assert!(role_for(&full, NS, None).is_err(), "{full} needs listing");
        }
        let listed = Some("roles/storage.admin, projects/acme/roles/reader");
        assert_eq!(
            role_for("roles/storage.admin", NS, listed),
            Ok("roles/storage.admin".into())
        );
        assert_eq!(
            role_for("projects/acme/roles/reader", NS, listed),
            Ok("projects/acme/roles/reader".into())
        );
        for other in [
            "admin",
            "ObjectViewer",
            "",
            "roles/storage.adm",
            "projects/acme/roles/*",
        ] {
            let refused = role_for(other, NS, listed);
            assert!(
                refused.is_err_and(|e| e.contains(ALLOWED_ROLES_ANNOTATION)),
                "{other}"
            );
        }
    }

    #[test]
    fn the_annotation_names_the_member_else_the_workload_identity_principal() {
        let annotated = BTreeMap::from([(
            GSA_ANNOTATION.to_owned(),
            "app@acme.iam.gserviceaccount.com".to_owned(),
        )]);
        let m = service_account_member(NS, "app", &annotated, Some(&pool()));
        assert_eq!(
            m,
            Ok("serviceAccount:app@acme.iam.gserviceaccount.com".into())
        );
        let m = service_account_member(NS, "app", &BTreeMap::new(), Some(&pool()));
        assert_eq!(
            m,
            Ok("principal://iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/acme.svc.id.goog/subject/ns/team-a/sa/app".into())
        );
        let none = service_account_member(NS, "app", &BTreeMap::new(), None);
        assert!(none.is_err_and(|e| e.contains("--workload-identity-pool")));
        let bad = BTreeMap::from([(GSA_ANNOTATION.to_owned(), "allUsers".to_owned())]);
        let m = service_account_member(NS, "app", &bad, Some(&pool()));
        assert!(m.is_err_and(|e| e.contains(GSA_ANNOTATION)));
    }

    #[test]
    fn public_principals_and_other_namespaces_are_always_refused() {
        let everything = Some("allUsers,allAuthenticatedUsers,*");
        for member in [
            "allUsers",
            "allAuthenticatedUsers",
            "principal://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/subject/ns/team-b/sa/app",
            "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/namespace/team-b",
            "serviceAccount:acme.svc.id.goog[team-b/app]",
        ] {
            assert!(check_member(NS, member, everything).is_err(), "{member}");
        }
        let own = "principal://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/subject/ns/team-a/sa/app";
        assert_eq!(check_member(NS, own, Some(own)), Ok(()));
    }

    #[test]
    fn members_need_the_namespace_annotation() {
        let m = "user:ana@acme.com";
        let refused = check_member(NS, m, None);
        assert!(refused.is_err_and(|e| e.contains(ALLOWED_MEMBERS_ANNOTATION) && e.contains(m)));
        assert!(check_member(NS, m, Some("")).is_err());
        assert!(check_member(NS, m, Some("user:bob@acme.com")).is_err());
        assert_eq!(
            check_member(NS, m, Some("user:bob@acme.com, user:ana@acme.com")),
            Ok(())
        );
        assert_eq!(check_member(NS, m, Some("domain:acme.com")), Ok(()));
        assert_eq!(
            check_member(NS, "domain:acme.com", Some("domain:acme.com")),
            Ok(())
        );
        assert!(check_member(NS, "user:ana@evil-acme.com", Some("domain:acme.com")).is_err());
        let sa = "serviceAccount:etl@data.iam.gserviceaccount.com";
        assert_eq!(
            check_member(NS, sa, Some("*@data.iam.gserviceaccount.com")),
            Ok(())
        );
        assert!(
            check_member(NS, sa, Some("*")).is_err(),
            "a bare * is no pattern"
        );
    }

    fn conditional(role: &str, member: &str) -> Binding {
        Binding::new()
            .set_role(role)
            .set_members([member])
            .set_condition(
                Expr::new()
                    .set_title("until 2030")
                    .set_expression("request.time < timestamp('2030-01-01T00:00:00Z')"),
            )
    }

    #[test]
    fn an_edit_adds_and_removes_only_its_grants() {
        let viewer = "roles/storage.objectViewer";
        let mut policy = Policy::new()
            .set_version(1)
            .set_etag(bytes_of("CAE="))
            .set_bindings([
                Binding::new()
                    .set_role(viewer)
                    .set_members(["user:foreign@acme.com"]),
                conditional(viewer, "serviceAccount:app@p.iam.gserviceaccount.com"),
                Binding::new()
                    .set_role("roles/storage.objectUser")
                    .set_members(["serviceAccount:old@p.iam.gserviceaccount.com"]),
            ]);
        let original = policy.clone();
        let app = grant("serviceAccount:app@p.iam.gserviceaccount.com", viewer);
        let old = grant(
            "serviceAccount:old@p.iam.gserviceaccount.com",
            "roles/storage.objectUser",
        );
        let edit = edit_policy(
            &mut policy,
            &BTreeSet::from([app.clone()]),
            &BTreeSet::from([old.clone()]),
        );
        assert_eq!(edit.added, BTreeSet::from([app.clone()]));
        assert_eq!(edit.removed, BTreeSet::from([old]));
        assert_eq!(policy.version, POLICY_VERSION);
        assert_eq!(policy.etag, original.etag);
        assert_eq!(policy.bindings.len(), 2, "{:?}", policy.bindings);
        assert_eq!(
            policy.bindings[0].members,
            ["user:foreign@acme.com", app.member.as_str()]
        );
        assert_eq!(policy.bindings[1], original.bindings[1], "conditional kept");
        let again = edit_policy(&mut policy, &BTreeSet::from([app]), &BTreeSet::new());
        assert!(again.is_empty(), "nothing to do the second time: {again:?}");
    }

    #[test]
    fn a_revoke_never_touches_a_conditional_binding_or_a_declared_grant() {
        let viewer = "roles/storage.objectViewer";
        let member = "serviceAccount:app@p.iam.gserviceaccount.com";
        let mut policy = Policy::new().set_bindings([conditional(viewer, member)]);
        let original = policy.clone();
        let g = BTreeSet::from([grant(member, viewer)]);
        let edit = edit_policy(&mut policy, &BTreeSet::new(), &g);
        assert!(edit.is_empty());
        assert_eq!(policy.bindings, original.bindings);
        let edit = edit_policy(&mut policy, &g, &g);
        assert_eq!(edit.added, g, "the declared grant wins over its revocation");
        assert!(edit.removed.is_empty());
    }

    #[test]
    fn a_conditional_grant_lives_in_the_binding_of_its_own_condition() {
        let viewer = "roles/storage.objectViewer";
        let member = "serviceAccount:app@p.iam.gserviceaccount.com";
        let until_2030 = conditional(viewer, member);
        let mut policy = Policy::new().set_bindings([until_2030.clone()]);
        let reports = IamCondition {
            title: "reports".into(),
            description: Some("only reports/".into()),
            expression: "resource.name.startsWith('projects/_/buckets/b/objects/reports/')".into(),
        };
        let g = Grant {
            condition: Some(reports.clone()),
            ..grant(member, viewer)
        };
        let edit = edit_policy(&mut policy, &BTreeSet::from([g.clone()]), &BTreeSet::new());
        assert_eq!(edit.added, BTreeSet::from([g.clone()]));
        assert_eq!(
            policy.bindings.len(),
            2,
            "a binding of its own: {:?}",
            policy.bindings
        );
        assert_eq!(
            policy.bindings[0], until_2030,
            "the other condition's binding is kept"
        );
        let made = &policy.bindings[1];
        let expr = made.condition.clone().unwrap_or_default();
        assert_eq!(
            (made.role.as_str(), made.members.as_slice()),
            (viewer, [member.to_owned()].as_slice())
        );
        assert_eq!(
            (expr.title, expr.description, expr.expression),
            (
                reports.title,
                "only reports/".to_owned(),
                reports.expression
            )
        );
        let again = edit_policy(&mut policy, &BTreeSet::from([g.clone()]), &BTreeSet::new());
        assert!(again.is_empty(), "{again:?}");
        // Revoked, its binding goes; the other condition's stays.
        let edit = edit_policy(&mut policy, &BTreeSet::new(), &BTreeSet::from([g.clone()]));
        assert_eq!(edit.removed, BTreeSet::from([g]));
        assert_eq!(policy.bindings, [until_2030]);
    }

    fn bytes_of(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }
}
