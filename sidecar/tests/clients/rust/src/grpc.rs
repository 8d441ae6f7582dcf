//! The gRPC scenario: the SDK's `StorageControl` (gRPC only) and
//! `Storage::open_object` (BidiReadObject) against a plaintext HTTP/2
//! endpoint.
//!
//! Usage: BUCKETMAP_TEST_GRPC_ENDPOINT=http://127.0.0.1:PORT scenario --grpc SPEC.json
//!
//! SPEC.json: `{"buckets": {"photos": ID, "videos": ID}, "list_prefix": P,
//! "range": {"start": N, "length": N}, "sources": [NAME, ...], "objects":
//! {"composed": NAME, "copy": NAME, "missing": NAME}}`. The source objects
//! exist in `photos` before the program runs (this SDK writes over the JSON
//! API only). Steps: get_bucket, list_objects, get_object, compose_object
//! (the sources into `composed`), rewrite_object (`composed` to `copy` in
//! `videos`), open_object (a range of `composed`), delete_object (the first
//! source, then get_object on it), not_found.

use anyhow::{Context, Result};
use google_cloud_storage::client::{Storage, StorageControl};
use google_cloud_storage::model::compose_object_request::SourceObject;
use google_cloud_storage::model::{Bucket, Object};
use google_cloud_storage::model_ext::ReadRange;
use serde_json::{Value, json};

use super::{Steps, digest, resource};

fn grpc_error_of(e: &google_cloud_storage::Error) -> Value {
    let mut out = super::error_of(e);
    if let Some(status) = e.status() {
        out["grpc_code"] = json!(format!("{:?}", status.code));
        out["grpc_message"] = json!(status.message);
    }
    out
}

fn bucket_json(b: &Bucket) -> Value {
    json!({ "name": b.name, "bucket_id": b.bucket_id, "project": b.project })
}

struct GrpcScenario {
    spec: Value,
    control: StorageControl,
    storage: Storage,
    steps: Steps,
}

impl GrpcScenario {
    fn bucket(&self, logical: &str) -> String {
        crate::spec_bucket(&self.spec, logical)
    }

    fn object(&self, key: &str) -> String {
        crate::spec_object(&self.spec, key)
    }

    fn sources(&self) -> Vec<String> {
        self.spec["sources"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn record(&mut self, name: &str, outcome: google_cloud_storage::Result<Value>) {
        let value = match outcome {
            Ok(mut v) => {
                v["ok"] = json!(true);
                v
            }
            Err(e) => json!({ "ok": false, "error": grpc_error_of(&e) }),
        };
        self.steps.insert(name.to_owned(), value);
    }

    async fn get(&self, bucket: &str, name: &str) -> google_cloud_storage::Result<Object> {
        self.control
            .get_object()
            .set_bucket(self.bucket(bucket))
            .set_object(name)
            .send()
            .await
    }

    async fn run(&mut self) {
        let r = self
            .control
            .get_bucket()
            .set_name(self.bucket("photos"))
            .send()
            .await;
        self.record(
            "get_bucket",
            r.map(|b| json!({ "bucket": bucket_json(&b) })),
        );

        let prefix = self.spec["list_prefix"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let r = self
            .control
            .list_objects()
            .set_parent(self.bucket("photos"))
            .set_prefix(prefix)
            .send()
            .await;
        self.record(
            "list_objects",
            r.map(|l| {
                let names: Vec<&str> = l.objects.iter().map(|o| o.name.as_str()).collect();
                json!({ "names": names })
            }),
        );

        let first = self.sources().first().cloned().unwrap_or_default();
        let r = self.get("photos", &first).await;
        self.record("get_object", r.map(|o| json!({ "resource": resource(&o) })));

        let r = self.compose().await;
        self.record("compose_object", r);

        let r = self.rewrite().await;
        self.record("rewrite_object", r);

        let r = self.open_object().await;
        self.record("open_object", r);

        let r = self.delete(&first).await;
        self.record("delete_object", r);

        let r = match self.get("photos", &self.object("missing")).await {
            Ok(o) => Ok(json!({ "error": null, "resource": resource(&o) })),
            Err(e) => Ok(json!({ "error": grpc_error_of(&e) })),
        };
        self.record("not_found", r);
    }

    async fn compose(&self) -> google_cloud_storage::Result<Value> {
        let sources = self
            .sources()
            .into_iter()
            .map(|name| SourceObject::new().set_name(name));
        let destination = Object::new()
            .set_bucket(self.bucket("photos"))
            .set_name(self.object("composed"))
            .set_content_type("application/octet-stream");
        let o = self
            .control
            .compose_object()
            .set_destination(destination)
            .set_source_objects(sources)
            .send()
            .await?;
        Ok(json!({ "resource": resource(&o), "component_count": o.component_count }))
    }

    async fn rewrite(&self) -> google_cloud_storage::Result<Value> {
        let r = self
            .control
            .rewrite_object()
            .set_source_bucket(self.bucket("photos"))
            .set_source_object(self.object("composed"))
            .set_destination_bucket(self.bucket("videos"))
            .set_destination_name(self.object("copy"))
            .send()
            .await?;
        Ok(json!({
            "done": r.done,
            "total_bytes_rewritten": r.total_bytes_rewritten.to_string(),
            "resource": r.resource.as_ref().map(resource),
        }))
    }

    async fn open_object(&self) -> google_cloud_storage::Result<Value> {
        let start = self.spec["range"]["start"].as_u64().unwrap_or_default();
        let length = self.spec["range"]["length"].as_u64().unwrap_or_default();
        let descriptor = self
            .storage
            .open_object(self.bucket("photos"), self.object("composed"))
            .send()
            .await?;
        let mut reader = descriptor
            .read_range(ReadRange::segment(start, length))
            .await;
        let mut data = Vec::new();
        while let Some(chunk) = reader.next().await.transpose()? {
            data.extend_from_slice(&chunk);
        }
        Ok(json!({ "resource": resource(&descriptor.object()), "range": digest(&data) }))
    }

    async fn delete(&self, name: &str) -> google_cloud_storage::Result<Value> {
        self.control
            .delete_object()
            .set_bucket(self.bucket("photos"))
            .set_object(name)
            .send()
            .await?;
        let exists_after = match self.get("photos", name).await {
            Ok(_) => json!(true),
            Err(e)
                if e.status()
                    .is_some_and(|s| format!("{:?}", s.code) == "NotFound") =>
            {
                json!(false)
            }
            Err(e) => return Err(e),
        };
        Ok(json!({ "exists_after": exists_after }))
    }
}

/// Runs the gRPC scenario of `spec` against `endpoint`; the report.
pub async fn run(spec: Value) -> Result<Value> {
    let endpoint = std::env::var("BUCKETMAP_TEST_GRPC_ENDPOINT")
        .context("BUCKETMAP_TEST_GRPC_ENDPOINT (http://127.0.0.1:PORT) is required with --grpc")?;
    let anonymous = || google_cloud_auth::credentials::anonymous::Builder::new().build();
    let control = StorageControl::builder()
        .with_endpoint(&endpoint)
        .with_credentials(anonymous())
        .build()
        .await
        .context("StorageControl::builder().build()")?;
    let storage = Storage::builder()
        .with_endpoint(&endpoint)
        .with_credentials(anonymous())
        .build()
        .await
        .context("Storage::builder().build()")?;
    let mut scenario = GrpcScenario {
        spec,
        control,
        storage,
        steps: Steps::new(),
    };
    scenario.run().await;
    Ok(json!({
        "client": "rust",
        "library": "google-cloud-storage 1.21.0 (StorageControl, Storage::open_object)",
        "api": "grpc",
        "endpoint": endpoint,
        "steps": scenario.steps,
    }))
}
