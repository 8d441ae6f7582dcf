//! The reconciler's fast tier: every phase of [`super::reconcile`] against
//! an in-memory Kubernetes API server (module `api`, a `kube::Client` over
//! a `tower::service_fn`) and the in-process GCS mock, with no control
//! plane to start. Every test has `reconcile` in its name: `cargo test -p
//! bucketmap --lib reconcile` runs the tier. What only a real API server
//! shows (admission, CEL rules, server-side apply's full merge rules,
//! watches) stays in `tests/`.

/// The fake API server.
mod api;
/// The reconciler over the fake API server and the GCS mock.
mod harness;
/// The fake API server's server-side apply, JSON patch and selectors.
mod ssa;

/// `spec.access`.
mod access;
/// `spec.adopt`.
mod adoption;
/// Create, drift, steady state, naming.
mod apply;
/// Deletion per `deletionPolicy`.
mod cleanup;
/// The status of each refusal and failure.
mod conditions;
/// The fake answers as the API server does; the reconciler relies on it.
mod fidelity;
/// The namespace, the tenancy policy, the map budget.
mod limits;
/// The RoleBinding that lets a namespace's ServiceAccounts read its map.
mod map_readers;
/// `spec.notifications`.
mod notifications;
/// Buckets found again; settings fixed at creation.
mod recovery;
/// Retention lock, deletion under retention, object retention.
mod retention;
/// Status written only from the view it was computed from.
mod stale;
