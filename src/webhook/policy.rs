//! Refuses, at admission, a `Gcs` the tenancy policy does not allow
//! ([`crate::tenancy`]), so that `kubectl apply` says why at once; the
//! controller checks the same policy again before it creates a bucket.
//! It also refuses the IP filter ranges GCS would refuse and CEL cannot
//! check ([`crate::cidr`]).
//!
//! It is one more entry of the operator's MutatingWebhookConfiguration
//! (whose `caBundle` the operator keeps current) and only ever denies:
//! registered with `failurePolicy: Fail` for CREATE and for UPDATEs that
//! change the spec (`matchConditions`), so that nobody slips a resource
//! past the policy while the webhook is down. Other updates (status,
//! finalizers, labels) are admitted at once, also here, so that deleting a
//! resource never waits for the policy.
//!
//! The namespace (labels, project annotation) and, when a rule limits
//! their number, the namespace's resources are read live: admissions of
//! `Gcs` are rare, and a cached read could let a just-relabelled namespace
//! through. A read that fails refuses the resource (fail closed).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use tracing::info;

use crate::conditions::reason;
use crate::controller::{PROJECT_ANNOTATION, Refusal, default_project, project_for};
use crate::crd::Gcs;
use crate::tenancy::{Policy, Request};

/// What the policy webhook needs.
#[derive(Clone)]
pub struct PolicyCheck {
    /// Reads namespaces and counts resources.
    pub client: Client,
    /// The policy.
    pub policy: Arc<Policy>,
    /// The operator's `--default-project`.
    pub default_project: Option<String>,
    /// The namespaces the operator watches (`None`: all); others belong to
    /// another installation and are admitted.
    pub watched: Option<Vec<String>>,
}

/// Answers one AdmissionReview for a `Gcs`.
pub async fn review(
    review: AdmissionReview<DynamicObject>,
    check: &PolicyCheck,
) -> AdmissionReview<DynamicObject> {
    let request = match super::admission_request(review) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let response = AdmissionResponse::from(&request);
    match refusal(&request, check).await {
        None => response.into_review(),
        Some(why) => {
            info!(namespace = ?request.namespace, gcs = %request.name, "refusing: {why}");
            response.deny(why).into_review()
        }
    }
}

/// Why `request` is refused, if it is.
async fn refusal(request: &AdmissionRequest<DynamicObject>, check: &PolicyCheck) -> Option<String> {
    let ns = request.namespace.as_deref()?;
    let watched = check
        .watched
        .as_ref()
        .is_none_or(|w| w.iter().any(|n| n == ns));
    if !watched || !matches!(request.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let gcs = match parse(request.object.as_ref()) {
        Ok(gcs) => gcs?,
        Err(e) => return Some(e),
    };
    if request.operation == Operation::Update
        && parse(request.old_object.as_ref())
            .ok()
            .flatten()
            .map(|old| old.spec)
            == Some(gcs.spec.clone())
    {
        return None;
    }
    if let Some(problem) = crate::cidr::ip_filter_problem(&gcs.spec) {
        return Some(problem);
    }
    judge(&gcs, ns, request.operation == Operation::Create, check)
        .await
        .err()
}

fn parse(obj: Option<&DynamicObject>) -> Result<Option<Gcs>, String> {
    obj.map(|o| {
        serde_json::to_value(o)
            .and_then(serde_json::from_value::<Gcs>)
            .map_err(|e| format!("cannot read the Gcs: {e}"))
    })
    .transpose()
}

/// The policy's verdict on `gcs` in namespace `ns`.
async fn judge(gcs: &Gcs, ns: &str, create: bool, check: &PolicyCheck) -> Result<(), String> {
    let namespace = Api::<Namespace>::all(check.client.clone())
        .get_metadata(ns)
        .await
        .map_err(|e| format!("cannot read namespace {ns} to check the tenancy policy: {e}"))?;
    let annotated = namespace.annotations().get(PROJECT_ANNOTATION);
    let default = check.default_project.as_deref();
    let spec = gcs.spec.project_id.as_deref();
    let project = match project_for(ns, spec, annotated.map(String::as_str), default) {
        Ok(project) => project,
        // No project: the controller reports it; nothing to judge here.
        Err(Refusal { reason, .. }) if reason == reason::PROJECT_MISSING => return Ok(()),
        Err(refusal) => return Err(refusal.message),
    };
    let default_project = default_project(annotated.map(String::as_str), default);
    let buckets = if create && check.policy.limits_count() {
        let list = Api::<Gcs>::namespaced(check.client.clone(), ns)
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| format!("cannot count the Gcs resources of {ns}: {e}"))?;
        Some(list.items.len() + 1)
    } else {
        None
    };
    let request = Request {
        namespace: ns,
        namespace_labels: namespace.labels(),
        project: &project,
        default_project: default_project.as_deref(),
        storage_class: gcs.spec.storage_class.as_gcs(),
        location: &gcs.spec.location,
        force_destroy: gcs.spec.force_destroy,
        buckets,
    };
    check.policy.allows(&request).map_err(|r| r.0)
}
