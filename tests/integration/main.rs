//! The operator's integration tests: a real kube-apiserver and etcd per
//! test (`common`), the in-memory GCS, the chart and the binaries.
//! One test binary, one module per subject: the modules share one build
//! and link of the fixture and the dependencies, and the test harness
//! runs tests of different modules side by side. Pick a subject with a
//! filter: `cargo test --test integration -- publish::`.
//!
//! The fast tier's product checks (`tests/product.rs`) and the node tests
//! (`tests/node/`, a harness of their own) are test binaries apart.

mod access;
mod binary;
mod bucket_map;
mod chart;
mod common;
mod finalizer;
mod leader;
mod least_privilege;
mod manifests;
mod namespace_cache;
mod operator;
mod ownership;
mod publish;
mod settings;
mod tenancy;
mod watch_expiry;
mod webhook;
mod webhook_renewal;
mod webhook_shutdown;
