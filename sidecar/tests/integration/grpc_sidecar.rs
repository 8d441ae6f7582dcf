//! The sidecar's gRPC path, end to end: real gRPC clients (Go
//! `storage.NewGRPCClient`, the Rust SDK) through the sidecar with logical
//! names while the mock GCS holds the physical buckets; the refusals (deny
//! by default) with a raw client, each proved by the mock seeing no call;
//! unknown protobuf fields both ways through a raw upstream of our own; the
//! client's deadline and cancellation reaching the upstream call; the
//! `grpc_requests_total` metric.
//!
//! The mock's store and call log are the judge of what reached GCS; the
//! client reports and the raw responses of what the application saw.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bucketmap_testkit::mock_gcs::{Call, MockHandle, proto};
use bytes::{BufMut, Bytes};
use common::checks::Checks;
use common::grpc_clients::{GrpcClient, GrpcSpec, check_go, check_rust, methods, run_grpc_client};
use common::grpc_world::{
    FORBIDDEN, GrpcWorld, MAP, RawUpstream, all_physical, bucket_name, code_of, grpc_messages,
    metrics, physical, raw_unary, sample, start_sidecar,
};
use percent_encoding::percent_decode_str;
use prost::Message;
use proto::bidi_write_object_request::{Data, FirstMessage};
use tonic::Code;

const GET_OBJECT: &str = "/google.storage.v2.Storage/GetObject";
const ROUTING: &str = "x-goog-request-params";
/// A logical name the map does not hold.
const UNMAPPED: &str = "music";

fn get_object(bucket: &str, object: &str) -> proto::GetObjectRequest {
    proto::GetObjectRequest {
        bucket: bucket_name(bucket),
        object: object.to_owned(),
        ..Default::default()
    }
}

/// The bucket ids a call's `x-goog-request-params` names (percent-decoded
/// values of the form `projects/_/buckets/{id}[/...]`).
fn routed_buckets(call: &Call) -> Vec<String> {
    let Some(params) = call.header(ROUTING) else {
        return Vec::new();
    };
    params
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(_, v)| percent_decode_str(v).decode_utf8().ok())
        .filter_map(|v| {
            v.strip_prefix("projects/_/buckets/")
                .map(|rest| rest.split('/').next().unwrap_or_default().to_owned())
        })
        .collect()
}

/// Every call the mock saw names only mapped physical buckets, in the
/// request and in its routing header, and carries the client's deadline.
fn check_calls_physical(checks: &mut Checks, client: GrpcClient, calls: &[Call]) {
    eprintln!("{} client called: {:?}", client.name(), methods(calls));
    let mapped: Vec<&str> = MAP.iter().map(|(_, p)| *p).collect();
    checks.check(!calls.is_empty(), || "the mock saw no call".to_owned());
    for call in calls {
        if let Some(bucket) = &call.bucket {
            checks.check(mapped.contains(&bucket.as_str()), || {
                format!("the mock saw bucket {bucket:?} in {call:?}")
            });
        }
        let routed = routed_buckets(call);
        checks.check(!routed.is_empty(), || {
            format!("no bucket in the routing header of {call:?}")
        });
        for id in routed {
            checks.check(mapped.contains(&id.as_str()), || {
                format!("the routing header names {id:?}: {call:?}")
            });
        }
        checks.check(
            !call.cancelled || call.method.starts_with("Bidi") || call.method == "ReadObject",
            || format!("an unexpected cancelled call: {call:?}"),
        );
        // The Go scenario runs every step under a deadline: forwarded.
        checks.check(
            client != GrpcClient::Go || call.header("grpc-timeout").is_some(),
            || format!("no grpc-timeout on {call:?}"),
        );
    }
}

/// Runs `client` through the sidecar with logical names; the mock holds
/// the physical buckets.
async fn through_sidecar(client: GrpcClient) {
    let name = format!("{}-client", client.name());
    let mut world = GrpcWorld::start(&name, &[])
        .await
        .expect("start the mock GCS and the sidecar");
    let logical: BTreeMap<String, String> = MAP
        .iter()
        .map(|(l, _)| ((*l).to_owned(), (*l).to_owned()))
        .collect();
    let physical: BTreeMap<String, String> = MAP
        .iter()
        .map(|(l, p)| ((*l).to_owned(), (*p).to_owned()))
        .collect();
    let spec = GrpcSpec::write(world.dir(), &logical, &physical).expect("write the spec");
    if client == GrpcClient::Rust {
        spec.arrange_rust(&world.mock.handle())
            .expect("put the source objects");
    }
    let (endpoint, out_dir) = (world.endpoint(), world.dir().to_owned());
    let run = tokio::task::spawn_blocking({
        let spec = spec.clone();
        move || run_grpc_client(client, &endpoint, &spec, &out_dir)
    })
    .await
    .expect("the client runner");
    let mut checks = Checks::default();
    let mock = world.mock.handle();
    match run {
        Ok(report) => {
            let checked = match client {
                GrpcClient::Go | GrpcClient::Java => check_go(&mut checks, &spec, &report, &mock),
                GrpcClient::Rust => check_rust(&mut checks, &spec, &report, &mock),
            };
            if let Err(e) = checked {
                checks.fail(format!("cannot check the report: {e:#}"));
            }
            let text = report.to_string();
            for id in all_physical() {
                checks.check(!text.contains(id), || {
                    format!("the {} report shows the physical name {id}", client.name())
                });
            }
        }
        Err(e) => checks.fail(format!("{e:#}")),
    }
    let calls = mock.calls();
    check_calls_physical(&mut checks, client, &calls);
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish(
        &format!("{} gRPC client through the sidecar", client.name()),
        &format!("calls: {calls:#?}\n{}", world.diagnostics()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_grpc_client_through_sidecar() {
    through_sidecar(GrpcClient::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_grpc_client_through_sidecar() {
    through_sidecar(GrpcClient::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_grpc_client_through_sidecar() {
    through_sidecar(GrpcClient::Java).await;
}

/// The judge of refusals: the code, the message, and no call upstream.
struct Refusals {
    checks: Checks,
    mock: MockHandle,
}

impl Refusals {
    /// Checks that `result` failed with one of `want` (the message
    /// containing `needle`) and that the mock saw no call; then forgets
    /// the call log.
    fn check<T>(
        &mut self,
        case: &str,
        result: &Result<T, tonic::Status>,
        want: &[Code],
        needle: &str,
    ) {
        let checks = &mut self.checks;
        match result {
            Ok(_) => checks.fail(format!("{case}: succeeded, want {want:?}")),
            Err(status) => {
                checks.check(want.contains(&status.code()), || {
                    format!("{case}: got {status:?}, want {want:?}")
                });
                checks.check(status.message().contains(needle), || {
                    format!(
                        "{case}: the message {:?} lacks {needle:?}",
                        status.message()
                    )
                });
                let reason = error_info_reason(status);
                checks.check(reason.as_ref().is_some_and(|r| is_reason(r)), || {
                    format!("{case}: no bucketmap.dev ErrorInfo in the details: {reason:?}")
                });
            }
        }
        let calls = self.mock.calls();
        checks.check(calls.is_empty(), || {
            format!("{case}: the mock saw {calls:?}")
        });
        self.mock.reset_calls();
    }
}

/// The reason of the `google.rpc.ErrorInfo` of domain `bucketmap.dev` in
/// the status's details (the sidecar's own refusals carry one).
fn error_info_reason(status: &tonic::Status) -> Option<String> {
    use googleapis_tonic_google_storage_v2::google::rpc;
    use prost::Message as _;
    let details = rpc::Status::decode(status.details()).ok()?;
    details
        .details
        .iter()
        .filter(|any| any.type_url == "type.googleapis.com/google.rpc.ErrorInfo")
        .filter_map(|any| rpc::ErrorInfo::decode(any.value.as_slice()).ok())
        .find(|info| info.domain == "bucketmap.dev")
        .map(|info| info.reason)
}

/// UPPER_SNAKE_CASE, as `google.rpc.ErrorInfo.reason` is written.
fn is_reason(reason: &str) -> bool {
    !reason.is_empty() && reason.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

const NOT_FOUND: &[Code] = &[Code::NotFound];
const INVALID: &[Code] = &[Code::InvalidArgument];
/// A bucket outside the map: unknown as a logical name, not one of ours as
/// a physical one.
const NOT_OURS: &[Code] = &[Code::NotFound, Code::PermissionDenied];

/// A world with one object, `photos/o`, and its refusal judge.
async fn refusals_world(name: &str, args: &[&str]) -> (GrpcWorld, Refusals) {
    let world = GrpcWorld::start(name, args)
        .await
        .expect("start the mock GCS and the sidecar");
    let mock = world.mock.handle();
    mock.put_object_data(physical("photos"), "o", Bytes::from_static(b"data"))
        .expect("put an object");
    let checks = Checks::default();
    (world, Refusals { checks, mock })
}

/// Deny by default, names: an unmapped logical name, a physical name, a
/// bucket outside the map are refused by the sidecar itself, with the
/// right code, before anything reaches GCS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_the_map_never_reach_the_upstream() {
    let (mut world, mut judge) = refusals_world("refused-names", &[]).await;
    let mut storage = world.storage().await.expect("a storage client");

    let r = storage.get_object(get_object(UNMAPPED, "o")).await;
    judge.check("unmapped name", &r, NOT_FOUND, "");
    let reason = r.as_ref().err().and_then(error_info_reason);
    judge.checks.eq(
        "the unmapped name's reason",
        reason.as_deref(),
        Some("UNKNOWN_BUCKET"),
    );
    let r = storage
        .get_object(get_object(physical("photos"), "o"))
        .await;
    judge.check("physical name", &r, &[Code::PermissionDenied], "");
    let r = storage.get_object(get_object(FORBIDDEN, "o")).await;
    judge.check("another environment's bucket", &r, NOT_OURS, "");
    let header = format!("bucket=projects%2F_%2Fbuckets%2F{UNMAPPED}");
    let mut request = tonic::Request::new(get_object("photos", "o"));
    let value = header.parse().expect("an ASCII header value");
    request.metadata_mut().insert(ROUTING, value);
    let r = storage.get_object(request).await;
    judge.check(
        "unmapped routing header",
        &r,
        &[Code::NotFound, Code::InvalidArgument],
        "",
    );

    // The control: a well-formed logical request does reach the mock.
    let r = storage.get_object(get_object("photos", "o")).await;
    let mut checks = judge.checks;
    checks.eq("the control GetObject", code_of(&r), Code::Ok);
    checks.eq(
        "calls of the control",
        judge.mock.call_count("GetObject"),
        1,
    );
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish("gRPC refusals of names", &world.diagnostics());
}

/// Deny by default, shapes: an unknown method, a malformed resource name,
/// a truncated message, a malformed routing header are refused by the
/// sidecar itself before anything reaches GCS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_never_reach_the_upstream() {
    let (mut world, mut judge) = refusals_world("refused-shapes", &[]).await;
    let channel = world.channel().await.expect("connect to the sidecar");
    let mut storage = world.storage().await.expect("a storage client");

    let path = "/google.storage.v2.Storage/NoSuchRpc";
    let r = raw_unary(channel.clone(), path, Bytes::new(), &[]).await;
    judge.check("unknown method", &r, &[Code::Unimplemented], "NoSuchRpc");
    let mut bad = get_object("photos", "o");
    bad.bucket = "buckets/x".to_owned();
    let r = storage.get_object(bad).await;
    judge.check("malformed resource name", &r, INVALID, "");
    let whole = get_object("photos", "o").encode_to_vec();
    let truncated = Bytes::copy_from_slice(&whole[..whole.len() - 1]);
    let r = raw_unary(channel.clone(), GET_OBJECT, truncated, &[]).await;
    judge.check("truncated message", &r, INVALID, "");
    let routing = [(ROUTING, "bucket=buckets%2Fx")];
    let r = raw_unary(
        channel.clone(),
        GET_OBJECT,
        Bytes::from(whole.clone()),
        &routing,
    )
    .await;
    judge.check("malformed routing header", &r, INVALID, "");

    // The control: the whole message, raw, does reach the mock.
    let r = raw_unary(channel, GET_OBJECT, Bytes::from(whole), &[]).await;
    let mut checks = judge.checks;
    checks.eq("the control GetObject", code_of(&r), Code::Ok);
    checks.eq(
        "calls of the control",
        judge.mock.call_count("GetObject"),
        1,
    );
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish("gRPC refusals of malformed requests", &world.diagnostics());
}

/// With `--allow-physical-names` a mapped physical name passes as it is;
/// a bucket outside the map is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_physical_names_lets_mapped_physical_names_through() {
    let args = ["--allow-physical-names"];
    let (mut world, mut judge) = refusals_world("allow-physical", &args).await;
    let mut storage = world.storage().await.expect("a storage client");

    let r = storage.get_object(get_object(FORBIDDEN, "o")).await;
    judge.check("another environment's bucket", &r, NOT_OURS, "");

    let mut checks = judge.checks;
    match storage
        .get_object(get_object(physical("photos"), "o"))
        .await
    {
        Ok(object) => checks.eq("size", object.get_ref().size, 4),
        Err(e) => checks.fail(format!("GetObject by physical name: {e:?}")),
    }
    let calls = judge.mock.calls();
    let buckets: Vec<Option<&str>> = calls.iter().map(|c| c.bucket.as_deref()).collect();
    checks.eq(
        "buckets the mock saw",
        buckets,
        vec![Some(physical("photos"))],
    );
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish("--allow-physical-names", &world.diagnostics());
}

fn bidi_write(
    bucket: &str,
    offset: i64,
    data: &[u8],
    finish: bool,
) -> proto::BidiWriteObjectRequest {
    let spec = proto::WriteObjectSpec {
        resource: Some(proto::Object {
            bucket: bucket_name(bucket),
            name: "bidi/refused.bin".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    proto::BidiWriteObjectRequest {
        first_message: Some(FirstMessage::WriteObjectSpec(spec)),
        write_offset: offset,
        data: Some(Data::ChecksummedData(proto::ChecksummedData {
            content: data.to_vec(),
            crc32c: None,
        })),
        finish_write: finish,
        ..Default::default()
    }
}

/// A later message of a client stream naming an unmapped bucket: the
/// client gets NOT_FOUND, the upstream call is cancelled and the write
/// never completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_later_stream_message_cancels_the_upstream_call() {
    let mut world = GrpcWorld::start("bidi-refused", &[])
        .await
        .expect("start the mock GCS and the sidecar");
    let mock = world.mock.handle();
    let mut storage = world.storage().await.expect("a storage client");
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let call = tokio::spawn(async move {
        let mut responses = storage.bidi_write_object(rx).await?.into_inner();
        while responses.message().await?.is_some() {}
        Ok::<(), tonic::Status>(())
    });
    tx.unbounded_send(bidi_write("photos", 0, b"first ", false))
        .expect("send the first message");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut checks = Checks::default();
    let second = tx.unbounded_send(bidi_write(UNMAPPED, 6, b"second", true));
    checks.check(second.is_ok(), || {
        "the call ended before the second message was sent".to_owned()
    });
    let result = tokio::time::timeout(Duration::from_secs(20), call).await;
    drop(tx);
    match result {
        Ok(Ok(r)) => checks.eq("the client's status", code_of(&r), Code::NotFound),
        Ok(Err(e)) => checks.fail(format!("the call task failed: {e}")),
        Err(_) => checks.fail("the client got no answer in 20 s".to_owned()),
    }
    let writes = wait_for_call(&mock, "BidiWriteObject", Duration::from_secs(5)).await;
    // Passed on, the second message would be refused by the mock itself
    // (INVALID_ARGUMENT): the upstream call must rather have been cancelled
    // under the mock (the sidecar resets it with RST_STREAM(CANCEL), as a
    // client cancelling a call does). Exactly one upstream call was opened
    // (by the first message): with none, there would be nothing to cancel
    // and the loop below would check nothing.
    checks.eq("upstream BidiWriteObject calls opened", writes.len(), 1);
    for call in &writes {
        checks.check(call.cancelled, || {
            format!("the upstream write was not cancelled: {call:?}")
        });
    }
    let stored = mock.object_data(physical("photos"), "bidi/refused.bin");
    checks.check(stored.is_none(), || {
        format!("the write completed: {stored:?}")
    });
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish("a refused later stream message", &world.diagnostics());
}

/// The calls of `method` once the mock logged one (or none after `limit`).
async fn wait_for_call(mock: &MockHandle, method: &str, limit: Duration) -> Vec<Call> {
    let deadline = Instant::now() + limit;
    loop {
        let calls: Vec<Call> = mock
            .calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect();
        if !calls.is_empty() || Instant::now() > deadline {
            return calls;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A length-delimited field `tag` (any wire type 2 payload).
fn unknown_bytes(out: &mut Vec<u8>, tag: u32, payload: &[u8]) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(payload.len() as u64, out);
    out.put_slice(payload);
}

/// A varint field `tag`.
fn unknown_varint(out: &mut Vec<u8>, tag: u32, value: u64) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::Varint, out);
    prost::encoding::encode_varint(value, out);
}

/// `head`, the known fields, `tail`: unknown fields before and after.
fn with_unknown(known: &impl Message, tail_varint: bool) -> Vec<u8> {
    let mut out = Vec::new();
    unknown_bytes(&mut out, 999, b"opaque \x00\xff bytes");
    known.encode(&mut out).expect("a Vec grows");
    if tail_varint {
        unknown_varint(&mut out, 998, 300);
    }
    unknown_bytes(&mut out, 997, b"tail");
    out
}

/// Unknown protobuf fields pass byte for byte both ways; only the bucket
/// (in the message and in the routing header) is rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_pass_byte_for_byte() {
    let object = |bucket: &str| proto::Object {
        name: "grpc/unknown.txt".to_owned(),
        bucket: bucket_name(bucket),
        size: 5,
        ..Default::default()
    };
    let answer = with_unknown(&object(physical("photos")), false);
    let raw = RawUpstream::start(Bytes::from(answer))
        .await
        .expect("start the raw upstream");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sidecar = start_sidecar(dir.path(), &raw.endpoint(), &[])
        .await
        .expect("start the sidecar");
    let channel = common::grpc_world::channel_to(&sidecar.url())
        .await
        .expect("connect to the sidecar");
    let sent = with_unknown(&get_object("photos", "grpc/unknown.txt"), true);
    let header = "bucket=projects%2F_%2Fbuckets%2Fphotos";
    let result = raw_unary(channel, GET_OBJECT, Bytes::from(sent), &[(ROUTING, header)]).await;

    let mut checks = Checks::default();
    match &result {
        Ok(resp) => checks.eq(
            "the response message",
            resp.get_ref().clone(),
            Bytes::from(with_unknown(&object("photos"), false)),
        ),
        Err(e) => checks.fail(format!("GetObject through the sidecar: {e:?}")),
    }
    let seen = raw.seen();
    checks.eq("requests upstream", seen.len(), 1);
    if let Some(req) = seen.first() {
        checks.eq("the upstream path", req.path.as_str(), GET_OBJECT);
        let want = with_unknown(&get_object(physical("photos"), "grpc/unknown.txt"), true);
        match grpc_messages(&req.body) {
            Ok(messages) => checks.eq("the upstream messages", messages, vec![Bytes::from(want)]),
            Err(e) => checks.fail(format!("the upstream body: {e:#}")),
        }
        let routing = req.headers.get(ROUTING).and_then(|v| v.to_str().ok());
        let decoded = routing.map(|v| percent_decode_str(v).decode_utf8_lossy().into_owned());
        let want = format!("bucket=projects/_/buckets/{}", physical("photos"));
        checks.eq("the upstream routing header", decoded, Some(want));
    }
    checks.finish(
        "unknown fields through the sidecar",
        &common::procs::log_tail(&sidecar.proc.log, 60),
    );
}

/// `grpc_requests_total` counts calls by method and final code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_are_counted_by_method_and_code() {
    let mut world = GrpcWorld::start("metrics", &[])
        .await
        .expect("start the mock GCS and the sidecar");
    world
        .mock
        .handle()
        .put_object_data(physical("photos"), "o", Bytes::from_static(b"data"))
        .expect("put an object");
    let mut storage = world.storage().await.expect("a storage client");
    let mut checks = Checks::default();
    for _ in 0..2 {
        let r = storage.get_object(get_object("photos", "o")).await;
        checks.eq("GetObject", code_of(&r), Code::Ok);
    }
    let r = storage.get_object(get_object(UNMAPPED, "o")).await;
    checks.eq("GetObject of an unmapped name", code_of(&r), Code::NotFound);
    let text = metrics(&world.sidecar).await.expect("read the metrics");
    let metric = "bucketmap_sidecar_grpc_requests_total";
    let method = ("method", "google.storage.v2.Storage/GetObject");
    let ok = sample(&text, metric, &[method, ("code", "OK")]);
    checks.eq("GetObject OK", ok, Some(2.0));
    let not_found = sample(&text, metric, &[method, ("code", "NOT_FOUND")]);
    checks.eq("GetObject NOT_FOUND", not_found, Some(1.0));
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish(
        "gRPC metrics",
        &format!("metrics:\n{text}\n{}", world.diagnostics()),
    );
}

/// The client's deadline (`grpc-timeout`) reaches the upstream, and a
/// client that resets its stream mid-read cancels the upstream call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_and_cancellation_reach_the_upstream() {
    let mut world = GrpcWorld::start("cancel", &[])
        .await
        .expect("start the mock GCS and the sidecar");
    let mock = world.mock.handle();
    let big = Bytes::from(vec![7u8; 32 * 1024 * 1024]);
    mock.put_object_data(physical("photos"), "big", big)
        .expect("put an object");
    let mut storage = world.storage().await.expect("a storage client");
    let mut checks = Checks::default();

    let mut request = tonic::Request::new(get_object("photos", "big"));
    request.set_timeout(Duration::from_secs(30));
    let r = storage.get_object(request).await;
    checks.eq("GetObject with a deadline", code_of(&r), Code::Ok);
    let calls = mock.calls();
    let timeout = calls.first().and_then(|c| c.header("grpc-timeout"));
    checks.check(timeout.is_some(), || {
        format!("no grpc-timeout upstream: {calls:?}")
    });
    mock.reset_calls();

    let read = proto::ReadObjectRequest {
        bucket: bucket_name("photos"),
        object: "big".to_owned(),
        ..Default::default()
    };
    match storage.read_object(read).await {
        Ok(resp) => {
            let mut stream = resp.into_inner();
            let first = stream.message().await;
            checks.check(matches!(first, Ok(Some(_))), || {
                format!("first chunk: {first:?}")
            });
            drop(stream);
        }
        Err(e) => checks.fail(format!("ReadObject: {e:?}")),
    }
    let reads = wait_for_call(&mock, "ReadObject", Duration::from_secs(10)).await;
    checks.check(reads.len() == 1 && reads[0].cancelled, || {
        format!("the upstream read was not cancelled: {reads:?}")
    });
    if !checks.is_empty() {
        world.keep_if_asked();
    }
    checks.finish("deadline and cancellation", &world.diagnostics());
}
