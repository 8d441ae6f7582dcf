//! The Rust SDK's `Storage` client (crate google-cloud-storage) runs the
//! sidecar's client scenario.
//!
//! Usage: BUCKETMAP_TEST_ENDPOINT=http://127.0.0.1:PORT scenario SPEC.json
//!
//! With `--grpc`, the gRPC scenario of `grpc.rs` (`StorageControl` and
//! `Storage::open_object`) runs instead.
//!
//! SPEC.json is written by the Rust integration test (sidecar/tests/integration/common):
//! the logical bucket names, the files to upload and every object name. This
//! program only observes: it runs each step, records what the library
//! returned (object fields under their JSON API names, digests of downloaded
//! bytes, errors) and prints one JSON report on stdout. The test decides
//! what is right. A failing step is recorded and the scenario goes on.
//!
//! `Storage` reads and writes objects over the JSON API; everything else
//! (list, copy, compose, delete, buckets) is `StorageControl`, which speaks
//! gRPC only, so those steps are not part of this client's scenario.
//! Uploads use the library's defaults: single-shot below 16 MiB, resumable
//! in 8 MiB chunks at and above it.

mod grpc;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use google_cloud_storage::client::Storage;
use google_cloud_storage::model::Object;
use google_cloud_storage::model_ext::ReadRange;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

type Steps = Map<String, Value>;

fn digest(data: &[u8]) -> Value {
    json!({ "len": data.len(), "sha256": format!("{:x}", Sha256::digest(data)) })
}

/// The bucket id of a `projects/_/buckets/ID` resource name.
fn bucket_id(resource_name: &str) -> &str {
    resource_name
        .strip_prefix("projects/_/buckets/")
        .unwrap_or(resource_name)
}

/// Object fields under their JSON API names; the library's resource name
/// is kept too (`bucket_resource`), so the leak check sees it.
fn resource(o: &Object) -> Value {
    json!({
        "bucket": bucket_id(&o.bucket),
        "bucket_resource": o.bucket,
        "name": o.name,
        "size": o.size.to_string(),
        "generation": o.generation.to_string(),
        "contentType": o.content_type,
        "metadata": o.metadata,
    })
}

fn error_of(e: &google_cloud_storage::Error) -> Value {
    let mut out = json!({ "message": format!("{e:#}"), "debug": format!("{e:?}") });
    if let Some(code) = e.http_status_code() {
        out["code"] = json!(code);
    }
    out
}

struct Scenario {
    spec: Value,
    client: Storage,
    steps: Steps,
}

/// The resource name of the bucket the spec gives for `logical`.
fn spec_bucket(spec: &Value, logical: &str) -> String {
    let name = spec["buckets"][logical].as_str().unwrap_or(logical);
    format!("projects/_/buckets/{name}")
}

/// The object name the spec gives for `key`.
fn spec_object(spec: &Value, key: &str) -> String {
    spec["objects"][key].as_str().unwrap_or_default().to_owned()
}

impl Scenario {
    fn bucket(&self, logical: &str) -> String {
        spec_bucket(&self.spec, logical)
    }

    fn object(&self, key: &str) -> String {
        spec_object(&self.spec, key)
    }

    fn record(&mut self, name: &str, outcome: Result<Value, google_cloud_storage::Error>) {
        let value = match outcome {
            Ok(mut v) => {
                v["ok"] = json!(true);
                v
            }
            Err(e) => json!({ "ok": false, "error": error_of(&e) }),
        };
        self.steps.insert(name.to_owned(), value);
    }

    async fn write(&self, name: &str, data: bytes::Bytes) -> google_cloud_storage::Result<Object> {
        let bucket = self.bucket("photos");
        self.client
            .write_object(bucket, name, data)
            .send_buffered()
            .await
    }

    async fn read(
        &self,
        name: &str,
        range: Option<(u64, u64)>,
    ) -> google_cloud_storage::Result<Vec<u8>> {
        let mut req = self.client.read_object(self.bucket("photos"), name);
        if let Some((offset, len)) = range {
            req = req.set_read_range(ReadRange::segment(offset, len));
        }
        let mut resp = req.send().await?;
        let mut out = Vec::new();
        while let Some(chunk) = resp.next().await.transpose()? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    async fn run(&mut self, small: bytes::Bytes, large: bytes::Bytes) {
        let r = self.write(&self.object("small"), small).await;
        self.record(
            "small_upload",
            r.map(|o| json!({ "resource": resource(&o) })),
        );

        // 20 MiB and more: at or above the 16 MiB threshold, a resumable upload.
        let r = self.write(&self.object("large"), large).await;
        self.record(
            "large_upload",
            r.map(|o| json!({ "resource": resource(&o) })),
        );

        let r = self.tree_upload().await;
        self.record("tree_upload", r);

        let r = self.download_full().await;
        self.record("download_full", r);

        let start = self.spec["range"]["start"].as_u64().unwrap_or_default();
        let length = self.spec["range"]["length"].as_u64().unwrap_or_default();
        let r = self
            .read(&self.object("large"), Some((start, length)))
            .await;
        self.record("download_range", r.map(|d| json!({ "range": digest(&d) })));

        let r = self.read(&self.object("missing"), None).await;
        let not_found = match r {
            Ok(data) => Ok(json!({ "error": null, "read_len": data.len() })),
            Err(e) => Ok(json!({ "error": error_of(&e) })),
        };
        self.record("not_found", not_found);
    }

    async fn tree_upload(&self) -> google_cloud_storage::Result<Value> {
        let mut out = Vec::new();
        let tree = self.spec["tree"].as_array().cloned().unwrap_or_default();
        for t in tree {
            let name = t["name"].as_str().unwrap_or_default();
            let content = t["content"].as_str().unwrap_or_default().to_owned();
            let o = self.write(name, bytes::Bytes::from(content)).await?;
            out.push(resource(&o));
        }
        Ok(json!({ "resources": out }))
    }

    async fn download_full(&self) -> google_cloud_storage::Result<Value> {
        let large = self.read(&self.object("large"), None).await?;
        let small = self.read(&self.object("small"), None).await?;
        Ok(json!({ "large": digest(&large), "small": digest(&small) }))
    }
}

async fn main_inner() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (grpc_mode, spec_path) = match args.as_slice() {
        [_, spec_path] => (false, spec_path),
        [_, flag, spec_path] if flag == "--grpc" => (true, spec_path),
        _ => bail!("usage: scenario [--grpc] SPEC.json"),
    };
    let spec: Value = serde_json::from_slice(
        &std::fs::read(spec_path).with_context(|| format!("cannot read {spec_path}"))?,
    )
    .context("bad spec")?;
    if grpc_mode {
        let report = tokio::time::timeout(Duration::from_secs(240), grpc::run(spec))
            .await
            .context("the gRPC scenario took longer than 240 s")??;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let endpoint = std::env::var("BUCKETMAP_TEST_ENDPOINT")
        .context("BUCKETMAP_TEST_ENDPOINT (http://127.0.0.1:PORT) is required")?;
    let file = |key: &str| -> Result<bytes::Bytes> {
        let path = spec[key].as_str().context("spec names no file")?;
        Ok(std::fs::read(path)
            .with_context(|| format!("cannot read {path}"))?
            .into())
    };
    let (small, large) = (file("small_file")?, file("large_file")?);
    let mut builder = Storage::builder()
        .with_endpoint(&endpoint)
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build());
    // Set by the test for its direct baseline against fake-gcs-server only
    // (an emulator gap, explained in sidecar/tests/integration/common/scenario.rs).
    let single_shot_only = std::env::var_os("BUCKETMAP_TEST_SINGLE_SHOT_ONLY").is_some();
    if single_shot_only {
        builder = builder.with_resumable_upload_threshold(usize::MAX);
    }
    let client = builder
        .build()
        .await
        .context("Storage::builder().build()")?;
    let mut scenario = Scenario {
        spec,
        client,
        steps: Steps::new(),
    };
    tokio::time::timeout(Duration::from_secs(240), scenario.run(small, large))
        .await
        .context("the scenario took longer than 240 s")?;
    let report = json!({
        "client": "rust",
        "library": "google-cloud-storage 1.21.0 (Storage)",
        "endpoint": endpoint,
        "writes": if single_shot_only { "single-shot only" } else { "library defaults" },
        "steps": scenario.steps,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(e) = main_inner().await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
