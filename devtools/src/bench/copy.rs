//! `cargo dev bench-copy`: how fast a move's copy goes (issue 59), on the
//! mock GCS in this process, against the floor of the same copy.
//!
//! Two shapes: many small objects, and a few large ones between buckets of
//! different locations (GCS then copies a large object in several calls,
//! each continuing from the last one's rewrite token; the mock copies
//! `--bytes-per-call` per call).
//!
//! For each shape, two copies of the same objects into an empty destination
//! take turns, three times each. The floor: the official client lists the
//! source and rewrites every object until done, with the same number of
//! calls in flight and nothing else (no comparison with the destination,
//! no preconditions, no verification). The pass: the operator's copy
//! (`bucketmap::relocation::copy::Copier`). The figures are the median wall
//! time, objects and bytes per second, and the pass's time as a multiple
//! of the floor's. The mock
//! copies by sharing the source's buffers, so what is measured is the
//! calls, not memory bandwidth: the operator's overhead per object and per
//! call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use google_cloud_storage::client::StorageControl;

use bucketmap::gcs::{GcsClient, GcsConfig, bucket_resource};
use bucketmap::metrics::Metrics;
use bucketmap::relocation::copy::Copier;
use bucketmap_testkit::mock_gcs::{MockGcs, MockHandle, proto};

const SOURCE: &str = "bench-src00000";
const DESTINATION: &str = "bench-dst00000";

/// Options of `cargo dev bench-copy`.
#[derive(Debug, Clone, clap::Args)]
pub struct CopyArgs {
    /// Number of small objects.
    #[arg(long, default_value_t = 10_000)]
    pub small: usize,
    /// Size of each small object, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub small_size: usize,
    /// Number of large objects.
    #[arg(long, default_value_t = 10)]
    pub large: usize,
    /// Size of each large object, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub large_mib: usize,
    /// What the mock copies per rewrite call between locations, in MiB
    /// (its default: a large object then takes many calls, as in GCS).
    #[arg(long, default_value_t = 1)]
    pub bytes_per_call_mib: u64,
    /// Copies in flight at once, for the floor and the pass alike.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
}

/// One shape's figures.
struct Figures {
    floor: Duration,
    pass: Duration,
    objects: usize,
    bytes: u64,
}

pub async fn run(args: CopyArgs) -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    handle.set_rewrite_bytes_per_call(args.bytes_per_call_mib << 20);
    for (project, id, location) in [("bench-us", SOURCE, "US"), ("bench-eu", DESTINATION, "EU")] {
        let bucket = proto::Bucket {
            bucket_id: id.to_owned(),
            location: location.to_owned(),
            ..Default::default()
        };
        handle.insert_bucket(project, bucket)?;
    }
    let config = GcsConfig {
        endpoint: Some(mock.endpoint()),
        anonymous: true,
    };
    let gcs = GcsClient::connect(&config, Arc::new(Metrics::default())).await?;
    let raw = StorageControl::builder()
        .with_endpoint(mock.endpoint())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .context("a plain client of the mock")?;
    println!(
        "copy from a US bucket to an EU one, {} in flight, {} MiB per rewrite call",
        args.concurrency, args.bytes_per_call_mib
    );
    let shapes = [
        (
            "small",
            args.small,
            args.small_size,
            format!("{} objects of {} B", args.small, args.small_size),
        ),
        (
            "large",
            args.large,
            args.large_mib << 20,
            format!("{} objects of {} MiB", args.large, args.large_mib),
        ),
    ];
    for (prefix, count, size, shape) in shapes {
        if count == 0 {
            continue;
        }
        handle.clear_objects(SOURCE);
        fill(&handle, prefix, count, &Bytes::from(vec![b'x'; size]))?;
        let figures = measure(&handle, &gcs, &raw, args.concurrency).await?;
        report(&shape, &figures);
    }
    mock.shutdown().await;
    Ok(())
}

/// `count` objects holding `data` (one buffer, shared).
fn fill(handle: &MockHandle, prefix: &str, count: usize, data: &Bytes) -> anyhow::Result<()> {
    for i in 0..count {
        handle.put_object_data(SOURCE, &format!("{prefix}/{i:06}"), data.clone())?;
    }
    Ok(())
}

/// Rounds of each, alternating (floor, pass, floor, ...) so that neither
/// has the warm-up to itself; the medians are compared.
const ROUNDS: usize = 3;

/// The floor and the pass, [`ROUNDS`] times each, each into an empty
/// destination.
async fn measure(
    handle: &MockHandle,
    gcs: &GcsClient,
    raw: &StorageControl,
    concurrency: usize,
) -> anyhow::Result<Figures> {
    let copier = Copier {
        gcs,
        source: SOURCE,
        destination: DESTINATION,
        concurrency,
        max_bytes_per_call: 0,
        page_size: 1000,
    };
    let (mut floors, mut passes) = (Vec::new(), Vec::new());
    let (mut objects, mut bytes) = (0, 0);
    for _ in 0..ROUNDS {
        handle.clear_objects(DESTINATION);
        let started = Instant::now();
        (objects, bytes) = floor(raw, concurrency).await?;
        floors.push(started.elapsed());
        anyhow::ensure!(
            handle.objects(DESTINATION).len() == objects,
            "the floor copied too few"
        );
        handle.clear_objects(DESTINATION);
        let started = Instant::now();
        let pass = copier.pass().await?;
        passes.push(started.elapsed());
        anyhow::ensure!(
            pass.copied as usize == objects && pass.copied_bytes == bytes,
            "the pass copied {pass:?}, the floor {objects} objects of {bytes} bytes"
        );
        anyhow::ensure!(
            copier.pass().await?.converged(),
            "a second pass found differences"
        );
    }
    Ok(Figures {
        floor: median(floors),
        pass: median(passes),
        objects,
        bytes,
    })
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Lists the source and rewrites every object until done, nothing more.
async fn floor(raw: &StorageControl, concurrency: usize) -> anyhow::Result<(usize, u64)> {
    let mut names = Vec::new();
    let mut bytes = 0;
    let mut token = String::new();
    loop {
        let page = raw
            .list_objects()
            .set_parent(bucket_resource(SOURCE))
            .set_page_size(1000)
            .set_page_token(token)
            .send()
            .await?;
        for o in page.objects {
            bytes += u64::try_from(o.size).unwrap_or(0);
            names.push(o.name);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let objects = names.len();
    futures::stream::iter(names)
        .map(|name| rewrite(raw, name))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((objects, bytes))
}

async fn rewrite(raw: &StorageControl, name: String) -> anyhow::Result<()> {
    let mut token = String::new();
    loop {
        let answer = raw
            .rewrite_object()
            .set_source_bucket(bucket_resource(SOURCE))
            .set_source_object(&name)
            .set_destination_bucket(bucket_resource(DESTINATION))
            .set_destination_name(&name)
            .set_rewrite_token(token)
            .send()
            .await?;
        if answer.done {
            return Ok(());
        }
        token = answer.rewrite_token;
    }
}

fn report(shape: &str, f: &Figures) {
    let per_second = |d: Duration| {
        (
            f.objects as f64 / d.as_secs_f64(),
            f.bytes as f64 / d.as_secs_f64() / (1 << 20) as f64,
        )
    };
    let (floor_objects, floor_mib) = per_second(f.floor);
    let (pass_objects, pass_mib) = per_second(f.pass);
    println!(
        "{shape}: floor {:.2} s ({floor_objects:.0} objects/s, {floor_mib:.0} MiB/s); \
         copy pass {:.2} s ({pass_objects:.0} objects/s, {pass_mib:.0} MiB/s): {:.2}x the floor",
        f.floor.as_secs_f64(),
        f.pass.as_secs_f64(),
        f.pass.as_secs_f64() / f.floor.as_secs_f64()
    );
}
