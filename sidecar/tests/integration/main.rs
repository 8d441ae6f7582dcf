//! The sidecar's integration tests: the sidecar binary in front of
//! fake-gcs-server or the in-repo mock GCS, driven by real client
//! libraries, gRPC clients, data tools and raw requests (`common`); the
//! whole product on one machine (`full_flow`). One test binary, one module
//! per subject: the modules share one build and link of the harness and
//! the dependencies, and the test harness runs tests of different modules
//! side by side. Pick a subject with a filter:
//! `cargo test -p bucketmap-sidecar --test integration -- grpc_streams::`.
//!
//! The in-process tests of the fast tier (`tests/loopback/`) are a test
//! binary apart.

mod auth;
mod cli;
mod client_libraries;
mod common;
mod fence;
mod full_flow;
mod grpc_clients_direct;
mod grpc_schema;
mod grpc_sidecar;
mod grpc_streams;
mod http_paths;
mod kubelet_probes;
mod live_map;
mod multipart_differential;
mod reload;
