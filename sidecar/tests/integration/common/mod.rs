//! Shared harness of the sidecar's integration tests: fake-gcs-server as the
//! upstream, the sidecar binary in front of it, real client libraries
//! (Python, Go, Node) driven through it, and a raw HTTP client for requests
//! no library would send.
#![allow(dead_code)]

pub mod checks;
pub mod gcsfs;
pub mod grpc_clients;
pub mod grpc_raw;
pub mod grpc_world;
pub mod http;
pub mod mapping_dir;
pub mod procs;
pub mod rclone;
pub mod report;
pub mod scenario;
pub mod world;
