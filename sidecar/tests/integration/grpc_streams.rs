//! The sidecar's gRPC streams against the in-repo mock GCS: a 1 GiB
//! WriteObject and a 1 GiB ReadObject arrive intact while the sidecar's
//! peak RSS stays bounded (it streams, it does not buffer); a client that
//! drops a read or a write mid-stream cancels the upstream call (and a
//! dropped write stores nothing); a client's deadline reaches the upstream
//! as `grpc-timeout`, and a deadline that passes while the upstream is slow
//! ends DEADLINE_EXCEEDED at the client.
//!
//! The client is the generated tonic client over a bare hyper h2c client
//! (`common/grpc_raw.rs`), so the status seen is the one the sidecar sent.
//!
//! `BUCKETMAP_GRPC_DIRECT=1` runs the same scenarios against the mock
//! directly (physical names, no RSS bound): the baseline that shows a
//! failure is the sidecar's, not the harness's.
//! `BUCKETMAP_GRPC_PHYSICAL=1` runs them through the sidecar with
//! `--allow-physical-names`, clients naming the physical bucket: streaming,
//! cancellation and deadlines without depending on the message rewriter.
//! `BUCKETMAP_GRPC_STREAM_MIB=N` shrinks the large transfers (default 1024).
//! These switches are for runs by hand: under `CI=true` a test that finds
//! one set fails, naming it (`bucketmap_testkit::switches`).

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bucketmap_testkit::mock_gcs::{MockGcs, proto};
use bytes::Bytes;
use futures::StreamExt as _;
use proto::write_object_response::WriteStatus;
use tonic::Code;

use common::checks::Checks;
use common::grpc_raw::{
    CHUNK, Client, MIB, Verifier, bucket_name, chunk, client, memory_kib, parse_grpc_timeout,
    request, wait_for_call, write_messages,
};
use common::http::Request as HttpRequest;
use common::procs::{Sidecar, log_tail};

const PROJECT: &str = "acme-staging";
const LOGICAL: &str = "photos";
const PHYSICAL: &str = "photos-k3x9q2mw";
/// The sidecar's peak RSS after 1 GiB each way: far below what buffering
/// a single transfer would need, so only streaming passes.
const PEAK_RSS_BOUND_KIB: u64 = 128 * 1024;
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
const CALL_LOG_TIMEOUT: Duration = Duration::from_secs(10);

/// A mock GCS holding `photos-k3x9q2mw`, and the sidecar in front of it
/// mapping `photos` to it (or nothing, with `BUCKETMAP_GRPC_DIRECT=1`).
struct Setup {
    mock: MockGcs,
    sidecar: Option<Sidecar>,
    /// The bucket name clients use.
    bucket: &'static str,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Result<Setup> {
        let mock = MockGcs::start().await?;
        mock.handle().insert_bucket(
            PROJECT,
            proto::Bucket {
                bucket_id: PHYSICAL.to_owned(),
                ..Default::default()
            },
        )?;
        let dir = tempfile::Builder::new()
            .prefix("bucketmap-grpc-streams-")
            .tempdir()?;
        let (sidecar, bucket) = if env_flag("BUCKETMAP_GRPC_DIRECT") {
            (None, PHYSICAL)
        } else {
            let physical = env_flag("BUCKETMAP_GRPC_PHYSICAL");
            let mut args = vec![
                "--grpc-upstream".to_owned(),
                mock.endpoint(),
                "--map".to_owned(),
                format!("{LOGICAL}={PHYSICAL}"),
            ];
            if physical {
                args.push("--allow-physical-names".to_owned());
            }
            // The HTTP upstream is never reached: only gRPC is exercised.
            let path = dir.path().to_owned();
            let sidecar = tokio::task::spawn_blocking(move || {
                Sidecar::start(&path, "http://127.0.0.1:9", &args)
            })
            .await??;
            (Some(sidecar), if physical { PHYSICAL } else { LOGICAL })
        };
        let endpoint = sidecar
            .as_ref()
            .map_or_else(|| mock.endpoint(), Sidecar::url);
        Ok(Setup {
            client: client(&endpoint)?,
            mock,
            sidecar,
            bucket,
            _dir: dir,
        })
    }

    /// The sidecar's (VmRSS, VmHWM) in KiB; None when running direct.
    fn memory(&self) -> Result<Option<(u64, u64)>> {
        self.sidecar
            .as_ref()
            .map(|s| memory_kib(s.proc.pid()))
            .transpose()
    }

    /// The sidecar's `grpc_requests_total` for `method` (e.g. `GetObject`)
    /// and `code` (e.g. `OK`); None when running direct.
    fn grpc_requests(&self, method: &str, code: &str) -> Result<Option<f64>> {
        let Some(sidecar) = &self.sidecar else {
            return Ok(None);
        };
        let response = HttpRequest::get("/_bucketmap/metrics").send(sidecar.addr)?;
        let method = format!("method=\"google.storage.v2.Storage/{method}\"");
        let code = format!("code=\"{code}\"");
        let value = response
            .text()
            .lines()
            .filter(|l| l.starts_with("bucketmap_sidecar_grpc_requests_total{"))
            .filter(|l| l.contains(&method) && l.contains(&code))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Ok(Some(value))
    }

    /// Fails unless the sidecar counted `method` with `code` (running
    /// direct, there is nothing to check).
    fn assert_counted(&self, method: &str, code: &str) {
        let counted = self
            .grpc_requests(method, code)
            .expect("the sidecar's metrics");
        assert!(
            counted.is_none_or(|n| n >= 1.0),
            "no {method} with {code} in bucketmap_sidecar_grpc_requests_total"
        );
    }

    /// The sidecar's log tail, for failure messages.
    fn log(&self) -> String {
        self.sidecar
            .as_ref()
            .map_or_else(String::new, |s| log_tail(&s.proc.log, 30))
    }
}

/// Whether switch `name` is set to something but `0` (refused in CI).
fn env_flag(name: &str) -> bool {
    bucketmap_testkit::switches::flag(name)
}

/// The size of the large transfers (a switch shrinks them by hand, never
/// in CI).
fn stream_size() -> u64 {
    bucketmap_testkit::switches::number("BUCKETMAP_GRPC_STREAM_MIB", 1024) * MIB
}

/// Puts a `size`-byte object of [`chunk`]s straight into the mock.
fn put_chunks(setup: &Setup, name: &str, size: u64) -> Result<proto::Object> {
    let mut data = Vec::with_capacity(usize::try_from(size)?);
    let mut index = 0;
    while (data.len() as u64) < size {
        data.extend_from_slice(&chunk(index));
        index += 1;
    }
    data.truncate(usize::try_from(size)?);
    setup
        .mock
        .handle()
        .put_object_data(PHYSICAL, name, Bytes::from(data))
}

fn read_request(setup: &Setup, name: &str) -> proto::ReadObjectRequest {
    proto::ReadObjectRequest {
        bucket: bucket_name(setup.bucket),
        object: name.to_owned(),
        ..Default::default()
    }
}

/// Writes `size` bytes as `name` through the client; returns the object
/// the write answered.
async fn write(setup: &Setup, name: &str, size: u64) -> Result<proto::Object> {
    let mut client = setup.client.clone();
    let messages = write_messages(setup.bucket, name, size);
    let response = client
        .write_object(request(messages, setup.bucket, None))
        .await
        .with_context(|| format!("WriteObject of {name}"))?
        .into_inner();
    match response.write_status {
        Some(WriteStatus::Resource(object)) => Ok(object),
        other => anyhow::bail!("WriteObject of {name} answered {other:?}"),
    }
}

/// Reads `name` whole through the client, checking every byte; returns the
/// first message's object checksums and metadata, and the bytes read.
async fn read(
    setup: &Setup,
    name: &str,
) -> Result<(Option<proto::ObjectChecksums>, Option<proto::Object>, u64)> {
    let mut client = setup.client.clone();
    let mut stream = client
        .read_object(request(read_request(setup, name), setup.bucket, None))
        .await
        .with_context(|| format!("ReadObject of {name}"))?
        .into_inner();
    let mut verifier = Verifier::default();
    let (mut checksums, mut metadata) = (None, None);
    while let Some(message) = stream
        .message()
        .await
        .with_context(|| format!("ReadObject of {name} after {} bytes", verifier.offset()))?
    {
        if verifier.offset() == 0 && checksums.is_none() {
            checksums = message.object_checksums;
            metadata = message.metadata;
        }
        if let Some(data) = message.checksummed_data {
            verifier.feed(&data.content)?;
        }
    }
    Ok((checksums, metadata, verifier.offset()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_streams_each_way_in_bounded_memory() {
    let setup = Setup::start()
        .await
        .expect("start the mock and the sidecar");
    let size = stream_size();
    let name = "streams/large.bin";
    let before = setup.memory().expect("the sidecar's memory");

    // Write: the mock stores every byte, in order.
    let started = Instant::now();
    let written = tokio::time::timeout(TRANSFER_TIMEOUT, write(&setup, name, size))
        .await
        .expect("the write finishes in time")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", setup.log()));
    let write_time = started.elapsed();
    assert_eq!(
        written.size,
        i64::try_from(size).expect("size"),
        "{written:?}"
    );
    assert_eq!(
        written.bucket,
        bucket_name(setup.bucket),
        "the bucket as the client names it"
    );
    let stored = setup
        .mock
        .handle()
        .objects(PHYSICAL)
        .into_iter()
        .find(|o| o.name == name)
        .expect("the object in the mock's store");
    assert_eq!(stored.size, written.size);
    let stored_crc = stored.checksums.as_ref().and_then(|c| c.crc32c);
    assert!(stored_crc.is_some(), "the mock computes crc32c: {stored:?}");
    let data = setup
        .mock
        .handle()
        .object_data(PHYSICAL, name)
        .expect("the object's data");
    let mut verifier = Verifier::default();
    verifier
        .feed(&data)
        .expect("the stored data is what was sent");
    assert_eq!(verifier.offset(), size);
    drop(data);
    let after_write = setup.memory().expect("the sidecar's memory");

    // Read it back: every byte, and the checksums the mock stores.
    let started = Instant::now();
    let (checksums, metadata, read) = tokio::time::timeout(TRANSFER_TIMEOUT, read(&setup, name))
        .await
        .expect("the read finishes in time")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", setup.log()));
    let read_time = started.elapsed();
    assert_eq!(read, size, "bytes read");
    assert_eq!(
        checksums.and_then(|c| c.crc32c),
        stored_crc,
        "crc32c of the read"
    );
    let metadata = metadata.expect("the first message carries the object");
    assert_eq!(metadata.size, stored.size);
    assert_eq!(metadata.bucket, bucket_name(setup.bucket));
    let after_read = setup.memory().expect("the sidecar's memory");
    setup.assert_counted("WriteObject", "OK");
    setup.assert_counted("ReadObject", "OK");

    let mib_s = |t: Duration| size as f64 / MIB as f64 / t.as_secs_f64();
    eprintln!(
        "{} MiB: write {write_time:.1?} ({:.0} MiB/s), read {read_time:.1?} ({:.0} MiB/s); \
         sidecar (VmRSS, VmHWM) KiB before {before:?}, after the write {after_write:?}, \
         after the read {after_read:?}",
        size / MIB,
        mib_s(write_time),
        mib_s(read_time),
    );
    if let Some((_, hwm)) = after_read {
        assert!(
            hwm < PEAK_RSS_BOUND_KIB,
            "the sidecar's peak RSS {hwm} KiB is over {PEAK_RSS_BOUND_KIB} KiB after {} MiB \
             each way: it buffers instead of streaming\n{}",
            size / MIB,
            setup.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_dropped_mid_stream_cancels_the_upstream_call() {
    let setup = Setup::start()
        .await
        .expect("start the mock and the sidecar");
    let name = "streams/dropped-read.bin";
    put_chunks(&setup, name, 64 * MIB).expect("put the object");
    let mut client = setup.client.clone();
    let mut stream = client
        .read_object(request(read_request(&setup, name), setup.bucket, None))
        .await
        .expect("ReadObject starts")
        .into_inner();
    let mut verifier = Verifier::default();
    for _ in 0..3 {
        let message = stream
            .message()
            .await
            .expect("a message")
            .expect("not the end yet");
        let data = message.checksummed_data.expect("data");
        verifier.feed(&data.content).expect("the right bytes");
    }
    assert!(verifier.offset() < 64 * MIB);
    drop(stream);

    let call = wait_for_call(&setup.mock.handle(), CALL_LOG_TIMEOUT, |c| {
        c.method == "ReadObject"
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", setup.log()));
    assert_eq!(call.bucket.as_deref(), Some(PHYSICAL));
    // The call is logged when the mock's stream ends; the cancellation may
    // be marked a moment later.
    wait_for_call(&setup.mock.handle(), CALL_LOG_TIMEOUT, |c| {
        c.method == "ReadObject" && c.cancelled
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the upstream read was not cancelled: {e:#}\n{}",
            setup.log()
        )
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_mid_stream_cancels_the_upstream_call_and_stores_nothing() {
    let setup = Setup::start()
        .await
        .expect("start the mock and the sidecar");
    let name = "streams/dropped-write.bin";
    // Four chunks of a 64 MiB object, then the client stalls.
    let messages = write_messages(setup.bucket, name, 64 * MIB)
        .take(4)
        .chain(futures::stream::pending());
    let mut client = setup.client.clone();
    let bucket = setup.bucket;
    let call =
        tokio::spawn(async move { client.write_object(request(messages, bucket, None)).await });
    let mock = setup.mock.handle();
    let deadline = Instant::now() + CALL_LOG_TIMEOUT;
    while mock.upload_count() == 0 {
        assert!(
            Instant::now() < deadline,
            "the write never reached the mock\n{}",
            setup.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the chunks sent so far arrive, then give up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !call.is_finished(),
        "the write ended early: {:?}",
        call.await
    );
    call.abort();

    let logged = wait_for_call(&mock, CALL_LOG_TIMEOUT, |c| c.method == "WriteObject")
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", setup.log()));
    // A proxy passes a client's cancellation on as one: RST_STREAM(CANCEL)
    // (the mock logs a reset with another code, e.g. INTERNAL_ERROR, as a
    // failed call, not a cancelled one).
    let mut checks = Checks::default();
    checks.check(logged.cancelled, || {
        format!("the upstream write was not cancelled: {logged:?}")
    });
    checks.check(
        mock.objects(PHYSICAL).iter().all(|o| o.name != name),
        || {
            format!(
                "a dropped write stored an object: {:?}",
                mock.objects(PHYSICAL)
            )
        },
    );
    checks.eq("open write sessions", mock.upload_count(), 0);
    checks.finish("a write dropped mid-stream", &setup.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_deadline_reaches_the_upstream_as_grpc_timeout() {
    let setup = Setup::start()
        .await
        .expect("start the mock and the sidecar");
    let name = "streams/small.txt";
    setup
        .mock
        .handle()
        .put_object_data(PHYSICAL, name, Bytes::from_static(b"small"))
        .expect("put the object");
    let timeout = Duration::from_secs(30);
    let mut client = setup.client.clone();
    for method in ["GetObject", "ReadObject"] {
        let result = if method == "GetObject" {
            let get = proto::GetObjectRequest {
                bucket: bucket_name(setup.bucket),
                object: name.to_owned(),
                ..Default::default()
            };
            client
                .get_object(request(get, setup.bucket, Some(timeout)))
                .await
                .map(|_| ())
        } else {
            let read = read_request(&setup, name);
            match client
                .read_object(request(read, setup.bucket, Some(timeout)))
                .await
            {
                Ok(response) => {
                    let mut stream = response.into_inner();
                    let mut result = Ok(());
                    while let Some(message) = stream.next().await {
                        if let Err(status) = message {
                            result = Err(status);
                        }
                    }
                    result
                }
                Err(status) => Err(status),
            }
        };
        result.unwrap_or_else(|s| panic!("{method}: {s:?}\n{}", setup.log()));
        let call = wait_for_call(&setup.mock.handle(), CALL_LOG_TIMEOUT, |c| {
            c.method == method
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        let header = call
            .header("grpc-timeout")
            .unwrap_or_else(|| panic!("{method} arrived without grpc-timeout: {call:?}"));
        let forwarded = parse_grpc_timeout(header).expect("a valid grpc-timeout");
        assert!(
            forwarded <= timeout && forwarded > timeout - Duration::from_secs(5),
            "{method}: grpc-timeout {header} for a {timeout:?} deadline"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_while_the_upstream_is_slow_ends_deadline_exceeded() {
    let setup = Setup::start()
        .await
        .expect("start the mock and the sidecar");
    let name = "streams/slow.txt";
    let mock = setup.mock.handle();
    mock.put_object_data(PHYSICAL, name, Bytes::from_static(b"slow"))
        .expect("put the object");
    let deadline = Duration::from_millis(500);
    // The status must come at the deadline, not with the upstream's late
    // answer: the bound is generous by an order of magnitude over the
    // deadline, and the upstream's delay is well beyond the bound.
    let limit = deadline * 10;
    let delay = limit * 2;
    for method in ["GetObject", "ReadObject"] {
        mock.set_latency(Some(method.to_owned()), delay);
        let mut client = setup.client.clone();
        let started = Instant::now();
        let status = if method == "GetObject" {
            let get = proto::GetObjectRequest {
                bucket: bucket_name(setup.bucket),
                object: name.to_owned(),
                ..Default::default()
            };
            client
                .get_object(request(get, setup.bucket, Some(deadline)))
                .await
                .map(|_| ())
                .err()
        } else {
            let read = read_request(&setup, name);
            match client
                .read_object(request(read, setup.bucket, Some(deadline)))
                .await
            {
                Ok(response) => response.into_inner().message().await.err(),
                Err(status) => Some(status),
            }
        };
        let elapsed = started.elapsed();
        let status = status
            .unwrap_or_else(|| panic!("{method} succeeded past its deadline\n{}", setup.log()));
        // tonic's server (the mock) answers an expired `grpc-timeout` with
        // CANCELLED; GCS, and so the sidecar, with DEADLINE_EXCEEDED.
        let expected = if setup.sidecar.is_none() {
            Code::Cancelled
        } else {
            Code::DeadlineExceeded
        };
        assert_eq!(
            status.code(),
            expected,
            "{method}: {status:?}\n{}",
            setup.log()
        );
        assert!(
            elapsed < limit,
            "{method}: the status came after {elapsed:?}, not at the deadline"
        );
        mock.set_latency(Some(method.to_owned()), Duration::ZERO);
        setup.assert_counted(method, "DEADLINE_EXCEEDED");
    }
}

/// The generated data: one message's worth per chunk, distinct chunks
/// (so a reordered or repeated message shows).
#[test]
fn a_chunk_is_one_message() {
    assert_eq!(chunk(0).len(), CHUNK);
    assert_ne!(chunk(0), chunk(1));
}
