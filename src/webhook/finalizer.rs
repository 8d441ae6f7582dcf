//! Sets the operator's finalizer on a `Gcs` as the API server creates it,
//! so the operator's first reconcile goes straight to work instead of
//! writing the finalizer and waiting for the resource to come back.
//!
//! This is an optimization, never a dependency: the webhook is registered
//! with `failurePolicy: Ignore` (`deploy/webhook.yaml`), and the controller
//! still adds the finalizer itself, before any bucket exists, to a resource
//! that has none (created while the webhook was down, or before it was
//! installed). Kubernetes does the same for PersistentVolumeClaims: the
//! `StorageObjectInUseProtection` admission plugin sets their protection
//! finalizer on create, and a controller adds it to those created without.
//! The webhook never refuses a resource and changes nothing but the list of
//! finalizers, and only of resources the operator reconciles (all
//! namespaces, or those `--watch-namespaces` names).

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionResponse, AdmissionReview, Operation};
use tracing::warn;

use crate::crd::FINALIZER;

/// Answers one AdmissionReview for a `Gcs`: on create, adds [`FINALIZER`]
/// unless the resource already has it; anything else is admitted unchanged.
/// When the operator watches only the `watched` namespaces
/// (`--watch-namespaces`), resources of other namespaces are left alone:
/// nobody would remove their finalizer.
pub fn review(
    review: AdmissionReview<DynamicObject>,
    watched: Option<&[String]>,
) -> AdmissionReview<DynamicObject> {
    let request = match super::admission_request(review) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let response = AdmissionResponse::from(&request);
    let finalizers = request
        .object
        .as_ref()
        .map(|o| o.metadata.finalizers.as_deref().unwrap_or_default());
    let ours = watched.is_none_or(|namespaces| {
        request
            .namespace
            .as_ref()
            .is_some_and(|ns| namespaces.contains(ns))
    });
    let patch = match (&request.operation, finalizers) {
        (Operation::Create, Some(finalizers)) if ours => patch(finalizers),
        _ => None,
    };
    let Some(patch) = patch else {
        return response.into_review();
    };
    match response.clone().with_patch(patch) {
        Ok(r) => r.into_review(),
        Err(e) => {
            warn!(error = %e, "cannot serialize the finalizer patch; admitting unchanged");
            response.into_review()
        }
    }
}

/// The JSON patch that appends [`FINALIZER`] to `finalizers`, or `None`
/// when it is already there.
fn patch(finalizers: &[String]) -> Option<json_patch::Patch> {
    if finalizers.iter().any(|f| f == FINALIZER) {
        return None;
    }
    let op = if finalizers.is_empty() {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})
    } else {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER})
    };
    serde_json::from_value(serde_json::json!([op])).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionRequest;

    fn admission(operation: &str, metadata: serde_json::Value) -> AdmissionReview<DynamicObject> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7d1e5c0a-0000-4000-8000-000000000001",
                "kind": {"group": "storage.bucketmap.dev", "version": "v1alpha1", "kind": "Gcs"},
                "resource": {"group": "storage.bucketmap.dev", "version": "v1alpha1", "resource": "gcs"},
                "requestKind": {"group": "storage.bucketmap.dev", "version": "v1alpha1", "kind": "Gcs"},
                "requestResource": {"group": "storage.bucketmap.dev", "version": "v1alpha1", "resource": "gcs"},
                "name": "photos",
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "storage.bucketmap.dev/v1alpha1",
                    "kind": "Gcs",
                    "metadata": metadata,
                    "spec": {"bucketName": "photos"},
                },
                "dryRun": false,
            }
        }))
        .expect("a valid AdmissionReview")
    }

    /// The resource's metadata after the answer's patch, and whether it was allowed.
    fn admitted(review: AdmissionReview<DynamicObject>) -> (bool, serde_json::Value) {
        admitted_watching(review, None)
    }

    fn admitted_watching(
        review: AdmissionReview<DynamicObject>,
        watched: Option<&[String]>,
    ) -> (bool, serde_json::Value) {
        let request: AdmissionRequest<DynamicObject> =
            review.clone().try_into().expect("a request");
        let mut object = serde_json::to_value(request.object).expect("object");
        let response = super::review(review, watched).response.expect("a response");
        if let Some(bytes) = &response.patch {
            let patch: json_patch::Patch = serde_json::from_slice(bytes).expect("a JSON patch");
            json_patch::patch(&mut object, &patch).expect("the patch applies");
        }
        (response.allowed, object["metadata"].clone())
    }

    #[test]
    fn a_new_gcs_gets_the_finalizer_and_keeps_the_finalizers_it_has() {
        let cases = [
            (serde_json::json!({"name": "photos"}), vec![FINALIZER]),
            (
                serde_json::json!({"name": "photos", "finalizers": ["example.com/keep"]}),
                vec!["example.com/keep", FINALIZER],
            ),
            (
                serde_json::json!({"name": "photos", "finalizers": [FINALIZER]}),
                vec![FINALIZER],
            ),
        ];
        for (metadata, want) in cases {
            let (allowed, meta) = admitted(admission("CREATE", metadata.clone()));
            assert!(allowed, "{metadata}");
            assert_eq!(meta["finalizers"], serde_json::json!(want), "{metadata}");
            assert_eq!(meta["name"], "photos");
        }
    }

    #[test]
    fn only_creates_are_changed() {
        for op in ["UPDATE", "DELETE", "CONNECT"] {
            let (allowed, meta) = admitted(admission(op, serde_json::json!({"name": "photos"})));
            assert!(allowed, "{op}");
            assert!(meta.get("finalizers").is_none(), "{op}: {meta}");
        }
    }

    #[test]
    fn a_resource_outside_the_watched_namespace_is_left_alone() {
        let meta = serde_json::json!({"name": "photos"});
        let others = ["team-b".to_owned(), "team-c".to_owned()];
        let (allowed, theirs) = admitted_watching(admission("CREATE", meta.clone()), Some(&others));
        assert!(allowed);
        assert!(theirs.get("finalizers").is_none(), "{theirs}");
        let ours = ["team-b".to_owned(), "team-a".to_owned()];
        let (_, ours) = admitted_watching(admission("CREATE", meta), Some(&ours));
        assert_eq!(ours["finalizers"], serde_json::json!([FINALIZER]));
    }

    #[test]
    fn a_malformed_review_is_answered_not_panicked_on() {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
        }))
        .expect("parses without a request");
        let answer = serde_json::to_value(super::review(review, None)).expect("answer");
        assert_eq!(answer["response"]["allowed"], false);
    }
}
