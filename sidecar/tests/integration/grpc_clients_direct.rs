//! Real gRPC clients straight against the in-repo mock GCS (no sidecar):
//! the Go client (`storage.NewGRPCClient`, writes, whole, ranged and bidi
//! reads, listing, attributes, delete) and the Rust SDK (`StorageControl`:
//! bucket and object metadata, compose, rewrite across buckets, delete;
//! `Storage::open_object`: a bidi ranged read). The mock's store is the
//! judge of what was written; its call log shows which RPCs each library
//! uses and that the request metadata arrived.
//!
//! These are the baselines of the sidecar's gRPC tests: the same drivers
//! (`common/grpc_clients.rs`) take the sidecar's address instead.

use crate::common;

use std::collections::BTreeMap;

use bucketmap_testkit::mock_gcs::{Call, MockGcs, proto};
use common::checks::Checks;
use common::grpc_clients::{GrpcClient, GrpcSpec, check_go, check_rust, methods, run_grpc_client};

const PROJECT: &str = "acme-staging";
const PHOTOS: &str = "photos-k3x9q2mw";
const VIDEOS: &str = "videos-a1b2c3d4";

async fn mock_with_buckets() -> anyhow::Result<MockGcs> {
    let mock = MockGcs::start().await?;
    for id in [PHOTOS, VIDEOS] {
        mock.handle().insert_bucket(
            PROJECT,
            proto::Bucket {
                bucket_id: id.to_owned(),
                ..Default::default()
            },
        )?;
    }
    Ok(mock)
}

fn names() -> BTreeMap<String, String> {
    [("photos", PHOTOS), ("videos", VIDEOS)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Shows which RPCs `client` used; checks the metadata every call carried
/// and that none was cancelled (a reader closed once it had its bytes may
/// end a read stream before the mock logged it: reads are let through).
fn check_calls(checks: &mut Checks, client: GrpcClient, calls: &[Call]) {
    eprintln!("{} client called: {:?}", client.name(), methods(calls));
    // The checks below hold for every call: over no call they check nothing.
    checks.check(!calls.is_empty(), || {
        format!("the mock saw no call of the {} client", client.name())
    });
    if let Some(first) = calls.first() {
        eprintln!("metadata of its first call: {:?}", first.metadata);
    }
    for call in calls {
        checks.check(
            !call.cancelled || call.method.starts_with("Bidi") || call.method == "ReadObject",
            || format!("an unexpected cancelled call: {call:?}"),
        );
        checks.check(call.header("x-goog-request-params").is_some(), || {
            format!("no x-goog-request-params on {call:?}")
        });
        // The Go scenario runs every step under a deadline.
        checks.check(
            client != GrpcClient::Go || call.header("grpc-timeout").is_some(),
            || format!("no grpc-timeout on {call:?}"),
        );
    }
}

/// Runs `client` against a fresh mock and checks its report and the store.
async fn direct(client: GrpcClient) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("bucketmap-grpc-direct-{}-", client.name()))
        .tempdir()
        .expect("a temporary directory");
    let mock = mock_with_buckets().await.expect("start the mock GCS");
    let spec = GrpcSpec::write(dir.path(), &names(), &names()).expect("write the spec");
    if client == GrpcClient::Rust {
        spec.arrange_rust(&mock.handle())
            .expect("put the source objects");
    }
    let endpoint = mock.endpoint();
    let out_dir = dir.path().to_owned();
    let run = tokio::task::spawn_blocking({
        let spec = spec.clone();
        move || run_grpc_client(client, &endpoint, &spec, &out_dir)
    })
    .await
    .expect("the client runner");
    let mut checks = Checks::default();
    match run {
        Ok(report) => {
            let checked = match client {
                GrpcClient::Go | GrpcClient::Java => {
                    check_go(&mut checks, &spec, &report, &mock.handle())
                }
                GrpcClient::Rust => check_rust(&mut checks, &spec, &report, &mock.handle()),
            };
            if let Err(e) = checked {
                checks.fail(format!("cannot check the report: {e:#}"));
            }
        }
        Err(e) => checks.fail(format!("{e:#}")),
    }
    let calls = mock.handle().calls();
    check_calls(&mut checks, client, &calls);
    let kept = if checks.is_empty() && std::env::var_os("BUCKETMAP_TEST_KEEP").is_none() {
        dir.path().to_owned()
    } else {
        dir.keep()
    };
    checks.finish(
        &format!(
            "{} gRPC client against the mock GCS directly",
            client.name()
        ),
        &format!("calls: {calls:#?}\nreports and logs in {}", kept.display()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_grpc_client_direct() {
    direct(GrpcClient::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_grpc_client_direct() {
    direct(GrpcClient::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_grpc_client_direct() {
    direct(GrpcClient::Java).await;
}
