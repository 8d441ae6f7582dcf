//! In-memory google.storage.v2 gRPC server used by tests, benchmarks and `bucketmap dev`.
