//! In-process tests: the proxy on loopback in front of a tiny hyper upstream,
//! driven by a hyper client. They prove streaming (bodies that only complete
//! if the proxy forwards them piece by piece, and bounded memory for
//! 1 GiB each way), map reloads with requests in flight, graceful drain,
//! and that refused requests are answered locally with nothing forwarded.
//!
//! This is the fast tier of the sidecar's tests: only Rust, no API server,
//! no client libraries, no fake-gcs-server.

mod faults;
mod grpc;
mod harness;
mod lifecycle;
mod refusals;
mod streaming;
mod tls;
mod translation;
