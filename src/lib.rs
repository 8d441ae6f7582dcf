//! bucketmap: a Kubernetes operator that turns `Gcs` resources into real,
//! uniquely named Google Cloud Storage buckets.

pub mod mock_gcs;
pub mod testenv;
