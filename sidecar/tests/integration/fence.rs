//! The sidecar's half of a move's switch (docs/ARCHITECTURE.md, "Moving a
//! bucket: the switch"), with the real binary in front of fake-gcs-server
//! (HTTP) and the in-repo mock GCS (gRPC). The map comes from a volume laid
//! out as the kubelet does (`--mapping-dir`); the operator's steps are
//! published into it by hand:
//!
//! - a write to a fenced entry is held, reads of it go to the source, and
//!   the write lands in the destination once the entry opens there — also
//!   when the fenced name is only in the request's body;
//! - a write held longer than `--hold-limit` is answered 503;
//! - an upload whose body is still arriving when its entry is fenced is cut
//!   off and lands nowhere; one whose body was complete is left to finish;
//! - a sidecar whose map is stale refuses reads of a fenced entry and still
//!   serves reads of an open one.

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bucketmap_testkit::mock_gcs::{MockGcs, proto};
use futures::StreamExt as _;
use tonic::Code;

use common::checks::Checks;
use common::grpc_raw::{MIB, bucket_name, client, request, wait_for_call, write_messages};
use common::http::{RESPONSE_TIMEOUT, Request, Response};
use common::mapping_dir::MappingDir;
use common::procs::{Sidecar, log_tail};
use common::world::World;

/// The bucket `photos` moves out of, the one it moves to, and a bucket no
/// move touches.
const SRC: &str = "photos-src0aaaa1";
const DST: &str = "photos-dst0bbbb2";
const LOGS: &str = "logs-aaaa1111";
/// The mock's project.
const PROJECT: &str = "acme-staging";
/// How long to wait for anything the test causes (a map reload, a call).
const PATIENCE: Duration = Duration::from_secs(20);

fn fenced(physical: &str) -> String {
    format!("{physical};fenced")
}

/// The sum of the samples of the sidecar's metrics whose line starts with
/// `series` (a name, with its labels when it has some).
fn metric(sidecar: &Sidecar, series: &str) -> Result<f64> {
    let text = Request::get("/_bucketmap/metrics")
        .send(sidecar.addr)?
        .text();
    Ok(text
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

const RELOADS: &str = "bucketmap_sidecar_mapping_reloads_total{result=\"success\"}";
const CUT_OFF: &str = "bucketmap_sidecar_cut_off_writes_total";

fn held(outcome: &str) -> String {
    format!("bucketmap_sidecar_held_requests_total{{outcome=\"{outcome}\"}}")
}

/// Publishes `map` into the volume and waits until the sidecar has put it
/// in force (its count of maps put in force goes up).
fn publish(dir: &mut MappingDir, sidecar: &Sidecar, map: &[(&str, &str)]) -> Result<()> {
    let before = metric(sidecar, RELOADS)?;
    dir.publish(map)?;
    let deadline = Instant::now() + PATIENCE;
    while metric(sidecar, RELOADS)? <= before {
        if Instant::now() > deadline {
            bail!(
                "the sidecar did not take the map {map:?}\n{}",
                log_tail(&sidecar.proc.log, 30)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A sidecar following the volume `dir` in front of `upstream`, with `extra` args.
fn sidecar(log_dir: &Path, upstream: &str, dir: &Path, extra: &[&str]) -> Result<Sidecar> {
    let mut args = vec![
        "--mapping-dir".to_owned(),
        dir.display().to_string(),
        "--mapping-poll-interval".to_owned(),
        "200ms".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Sidecar::start(log_dir, upstream, &args)
}

fn upload(bucket: &str, name: &str, body: &[u8]) -> Request {
    Request::new(
        "POST",
        format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"),
    )
    .header("Content-Type", "application/octet-stream")
    .body(body.to_vec())
}

fn read(bucket: &str, name: &str) -> Request {
    Request::get(format!("/storage/v1/b/{bucket}/o/{name}?alt=media"))
}

/// Sends `request` on a thread; its answer when it comes.
fn in_background(request: Request, addr: SocketAddr) -> thread::JoinHandle<Result<Response>> {
    thread::spawn(move || request.send(addr))
}

/// Waits `pause` and fails if `call` has finished by then: it was not held.
fn assert_held<T: std::fmt::Debug>(call: &thread::JoinHandle<T>, pause: Duration, what: &str) {
    thread::sleep(pause);
    assert!(!call.is_finished(), "{what} was not held");
}

#[test]
fn a_held_write_lands_in_the_destination_once_the_entry_opens_and_reads_go_to_the_source() {
    let world = World::upstream_only("fence-hold", &[SRC, DST, LOGS]).expect("fake-gcs-server");
    let root = world.dir().join("mapping");
    let mut dir = MappingDir::new(root.clone(), &[("photos", SRC), ("logs", LOGS)]).expect("map");
    let sidecar = sidecar(
        world.dir(),
        &world.fake.url(),
        &root,
        &["--hold-limit", "120s"],
    )
    .expect("the sidecar");
    let addr = sidecar.addr;
    world
        .fake
        .put(SRC, "seed.txt", b"from the source")
        .expect("seed");
    world.fake.put(LOGS, "x.txt", b"log").expect("seed");
    let mut c = Checks::default();

    // The fence: reads go on, to the source; writes wait.
    let src_fenced = fenced(SRC);
    publish(
        &mut dir,
        &sidecar,
        &[("photos", &src_fenced), ("logs", LOGS)],
    )
    .expect("fence");
    let write = in_background(upload("photos", "held.txt", b"held"), addr);
    // Named only in the body: an object of `logs` patched with a `bucket`
    // member naming `photos`.
    let patch = Request::new("PATCH", "/storage/v1/b/logs/o/x.txt")
        .json(&serde_json::json!({"metadata": {"k": "v"}, "bucket": "photos"}));
    let patch = in_background(patch, addr);
    assert_held(
        &write,
        Duration::from_secs(1),
        "a write to the fenced entry",
    );
    assert!(
        !patch.is_finished(),
        "a write naming the fenced entry in its body was not held"
    );
    match read("photos", "seed.txt").send(addr) {
        Ok(r) => c.eq(
            "a read during the fence",
            (r.status, r.text()),
            (200, "from the source".to_owned()),
        ),
        Err(e) => c.fail(format!("a read during the fence: {e:#}")),
    }
    let (in_src, in_dst) = (world.fake.objects(SRC), world.fake.objects(DST));
    c.check(
        in_src.as_ref().is_ok_and(|o| !o.contains_key("held.txt"))
            && in_dst.as_ref().is_ok_and(|o| !o.contains_key("held.txt")),
        || format!("a held write landed: {in_src:?} {in_dst:?}"),
    );

    // The switch (the destination, still fenced): reads move, writes wait.
    world
        .fake
        .put(DST, "seed.txt", b"from the destination")
        .expect("copy");
    let dst_fenced = fenced(DST);
    publish(
        &mut dir,
        &sidecar,
        &[("photos", &dst_fenced), ("logs", LOGS)],
    )
    .expect("switch");
    match read("photos", "seed.txt").send(addr) {
        Ok(r) => c.eq(
            "a read after the switch",
            (r.status, r.text()),
            (200, "from the destination".to_owned()),
        ),
        Err(e) => c.fail(format!("a read after the switch: {e:#}")),
    }
    assert!(
        !write.is_finished(),
        "the write went on while the destination was fenced"
    );

    // Open on the destination: the held writes go there.
    publish(&mut dir, &sidecar, &[("photos", DST), ("logs", LOGS)]).expect("open");
    match write.join().expect("the writer") {
        Ok(r) => c.eq("the held write", r.status, 200),
        Err(e) => c.fail(format!("the held write: {e:#}")),
    }
    match patch.join().expect("the patcher") {
        Ok(r) => c.eq("the held patch", r.status, 200),
        Err(e) => c.fail(format!("the held patch: {e:#}")),
    }
    match world.fake.content(DST, "held.txt") {
        Ok(body) => c.eq("the held write in the destination", body, b"held".to_vec()),
        Err(e) => c.fail(format!("the held write is not in the destination: {e:#}")),
    }
    let in_src = world.fake.objects(SRC).expect("list the source");
    c.check(!in_src.contains_key("held.txt"), || {
        "the held write reached the source".to_owned()
    });
    c.eq(
        "writes held, then forwarded",
        metric(&sidecar, &held("forwarded")).ok(),
        Some(2.0),
    );
    c.finish("a held write", &log_tail(&sidecar.proc.log, 40));
}

#[test]
fn a_write_held_past_the_hold_limit_is_refused_with_503() {
    let world = World::upstream_only("fence-limit", &[SRC, LOGS]).expect("fake-gcs-server");
    let root = world.dir().join("mapping");
    let src_fenced = fenced(SRC);
    let _dir =
        MappingDir::new(root.clone(), &[("photos", &src_fenced), ("logs", LOGS)]).expect("map");
    // The limit is what is under test: the answer must come after it, and
    // long before the client's own timeout.
    let limit = Duration::from_secs(2);
    let sidecar = sidecar(
        world.dir(),
        &world.fake.url(),
        &root,
        &["--hold-limit", "2s"],
    )
    .expect("the sidecar");
    let started = Instant::now();
    let refused = upload("photos", "late.txt", b"late")
        .send(sidecar.addr)
        .expect("the write");
    let waited = started.elapsed();
    let mut c = Checks::default();
    c.eq("status", refused.status, 503);
    c.check(refused.text().contains("backendNotReady"), || {
        refused.summary()
    });
    c.check(refused.text().contains("a move of the bucket"), || {
        refused.summary()
    });
    c.check(waited >= limit && waited < RESPONSE_TIMEOUT / 2, || {
        format!("answered after {waited:?}")
    });
    let in_src = world.fake.objects(SRC).expect("list the source");
    c.check(in_src.is_empty(), || {
        format!("a refused write landed: {in_src:?}")
    });
    c.eq(
        "holds timed out",
        metric(&sidecar, &held("timed_out")).ok(),
        Some(1.0),
    );
    // A write to an open entry is not held.
    let other = upload("logs", "now.txt", b"now")
        .send(sidecar.addr)
        .expect("a write");
    c.eq("a write to an open entry", other.status, 200);
    c.finish(
        "a write held past the limit",
        &log_tail(&sidecar.proc.log, 40),
    );
}

/// A relay to the upstream that passes requests on at once and, while
/// `hold` is set, keeps the upstream's answers: a request whose body
/// reached the upstream is still in flight at the sidecar.
struct Relay {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
}

impl Relay {
    fn start(upstream: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let hold = Arc::new(AtomicBool::new(false));
        let held = hold.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let (up_from, up_to) = (client.try_clone(), server.try_clone());
                let (Ok(up_from), Ok(up_to)) = (up_from, up_to) else {
                    continue;
                };
                thread::spawn(move || pump(up_from, up_to, None));
                let held = held.clone();
                thread::spawn(move || pump(server, client, Some(held)));
            }
        });
        Ok(Relay { addr, hold })
    }
}

/// Copies `from` to `to` until either ends; waits while `hold` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, hold: Option<Arc<AtomicBool>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while hold.as_ref().is_some_and(|h| h.load(Ordering::SeqCst)) {
            thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

#[test]
fn an_upload_still_arriving_is_cut_off_at_the_fence_and_a_complete_one_finishes() {
    let world = World::upstream_only("fence-cut", &[SRC, LOGS]).expect("fake-gcs-server");
    let relay = Relay::start(world.fake.addr).expect("the relay");
    let root = world.dir().join("mapping");
    let mut dir = MappingDir::new(root.clone(), &[("photos", SRC), ("logs", LOGS)]).expect("map");
    let upstream = format!("http://{}", relay.addr);
    let sidecar = sidecar(world.dir(), &upstream, &root, &[]).expect("the sidecar");
    let addr = sidecar.addr;
    let mut c = Checks::default();

    // A complete upload: its body reached GCS, its answer is on its way.
    relay.hold.store(true, Ordering::SeqCst);
    let complete = in_background(upload("photos", "complete.bin", &[7u8; 4096]), addr);
    let deadline = Instant::now() + PATIENCE;
    while !world
        .fake
        .objects(SRC)
        .expect("list")
        .contains_key("complete.bin")
    {
        assert!(
            Instant::now() < deadline,
            "the complete upload never reached the upstream"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // A slow upload: 64 pieces, 250 ms apart, 16 s in all.
    let slow_body = vec![9u8; 256 * 1024];
    let slow = thread::spawn(move || {
        let request = upload("photos", "slow.bin", &slow_body);
        request.send_paced(addr, 64, Duration::from_millis(250))
    });
    // In flight: the complete upload, the slow one, and this scrape.
    let deadline = Instant::now() + PATIENCE;
    while metric(&sidecar, "bucketmap_sidecar_in_flight_requests").expect("metrics") < 3.0 {
        assert!(
            Instant::now() < deadline,
            "the slow upload never reached the sidecar"
        );
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(500));
    assert!(
        !slow.is_finished(),
        "the slow upload ended early: {:?}",
        slow.join()
    );

    let fenced_at = Instant::now();
    let src_fenced = fenced(SRC);
    publish(
        &mut dir,
        &sidecar,
        &[("photos", &src_fenced), ("logs", LOGS)],
    )
    .expect("fence");
    match slow.join().expect("the slow uploader") {
        Ok(r) => {
            c.eq("the slow upload's status", r.status, 503);
            c.check(r.text().contains("cut off"), || r.summary());
        }
        Err(e) => c.fail(format!("the slow upload: {e:#}")),
    }
    let took = fenced_at.elapsed();
    c.check(took < Duration::from_secs(10), || {
        format!("cut off only {took:?} after the fence")
    });
    relay.hold.store(false, Ordering::SeqCst);
    match complete.join().expect("the complete uploader") {
        Ok(r) => c.eq("the complete upload's status", r.status, 200),
        Err(e) => c.fail(format!("the complete upload: {e:#}")),
    }
    let in_src = world.fake.objects(SRC).expect("list the source");
    c.check(!in_src.contains_key("slow.bin"), || {
        "the cut-off upload landed".to_owned()
    });
    c.check(in_src.contains_key("complete.bin"), || {
        "the complete upload is gone".to_owned()
    });
    c.eq("writes cut off", metric(&sidecar, CUT_OFF).ok(), Some(1.0));
    c.finish(
        "uploads in flight at the fence",
        &log_tail(&sidecar.proc.log, 40),
    );
}

/// A credentials directory for `--map-configmap` whose API server never
/// answers: the sidecar never confirms its map, which is stale from the start.
fn unreachable_api(dir: &Path) -> Result<Vec<String>> {
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    std::fs::write(dir.join("ca.crt"), ca.cert.pem())?;
    std::fs::write(dir.join("token"), "t")?;
    std::fs::write(dir.join("namespace"), "app")?;
    // A port that was free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    Ok(vec![
        "--map-configmap=bucketmap".to_owned(),
        format!("--kube-api=https://127.0.0.1:{port}"),
        format!("--kube-credentials-dir={}", dir.display()),
    ])
}

#[test]
fn a_stale_sidecar_refuses_reads_of_a_fenced_entry_and_serves_an_open_one() {
    let world = World::upstream_only("fence-stale", &[SRC, LOGS]).expect("fake-gcs-server");
    world.fake.put(SRC, "seed.txt", b"photo").expect("seed");
    world.fake.put(LOGS, "seed.txt", b"log").expect("seed");
    let root = world.dir().join("mapping");
    let src_fenced = fenced(SRC);
    let _dir =
        MappingDir::new(root.clone(), &[("photos", &src_fenced), ("logs", LOGS)]).expect("map");
    let creds = world.dir().join("creds");
    std::fs::create_dir_all(&creds).expect("creds");
    let follow = unreachable_api(&creds).expect("credentials");
    let mut args = vec!["--mapping-dir".to_owned(), root.display().to_string()];
    args.extend(follow);
    let stale_logs = world.dir().join("stale");
    std::fs::create_dir_all(&stale_logs).expect("logs");
    // Not ready until its grace for a first confirmation passes.
    let mut stale =
        Sidecar::start_unready(&stale_logs, &world.fake.url(), &args).expect("the stale sidecar");
    stale
        .wait_ready(PATIENCE)
        .expect("ready on the volume's map");
    // Control: the same map in a sidecar that follows the volume alone
    // (never stale) reads the fenced entry.
    let fresh = sidecar(world.dir(), &world.fake.url(), &root, &[]).expect("the fresh sidecar");

    let mut c = Checks::default();
    let got = |s: &Sidecar, bucket: &str| {
        read(bucket, "seed.txt")
            .send(s.addr)
            .map(|r| (r.status, r.text()))
            .unwrap_or_else(|e| (0, format!("{e:#}")))
    };
    let (status, text) = got(&stale, "photos");
    c.eq("a stale read of the fenced entry", status, 503);
    c.check(
        text.contains("a move of the bucket") && text.contains("--max-map-age"),
        || text.clone(),
    );
    c.eq(
        "a stale read of an open entry",
        got(&stale, "logs"),
        (200, "log".to_owned()),
    );
    c.eq(
        "a fresh read of the fenced entry",
        got(&fresh, "photos"),
        (200, "photo".to_owned()),
    );
    let write = upload("logs", "w.txt", b"w")
        .send(stale.addr)
        .map(|r| r.status)
        .ok();
    c.eq("a stale write to an open entry", write, Some(503));
    c.finish(
        "a stale sidecar and a fence",
        &log_tail(&stale.proc.log, 40),
    );
}

/// The mock GCS with the source and the destination of `photos`, and a
/// sidecar in front of it following a volume that maps `photos` to the source.
struct GrpcFence {
    _dir: tempfile::TempDir,
    mock: MockGcs,
    volume: MappingDir,
    sidecar: Sidecar,
}

impl GrpcFence {
    async fn start(name: &str) -> Result<GrpcFence> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("bucketmap-{name}-"))
            .tempdir()?;
        let mock = MockGcs::start().await?;
        for id in [SRC, DST] {
            let bucket = proto::Bucket {
                bucket_id: id.to_owned(),
                ..Default::default()
            };
            mock.handle().insert_bucket(PROJECT, bucket)?;
        }
        let root = dir.path().join("mapping");
        let volume = MappingDir::new(root.clone(), &[("photos", SRC)])?;
        let (logs, endpoint) = (dir.path().to_owned(), mock.endpoint());
        let sidecar = tokio::task::spawn_blocking(move || {
            // The HTTP upstream is never reached: only gRPC is exercised.
            sidecar(
                &logs,
                "http://127.0.0.1:9",
                &root,
                &["--grpc-upstream", &endpoint, "--hold-limit", "120s"],
            )
        })
        .await??;
        Ok(GrpcFence {
            _dir: dir,
            mock,
            volume,
            sidecar,
        })
    }

    async fn publish(&mut self, map: Vec<(&'static str, String)>) -> Result<()> {
        let map: Vec<(&str, &str)> = map.iter().map(|(l, v)| (*l, v.as_str())).collect();
        let (sidecar, volume) = (&self.sidecar, &mut self.volume);
        tokio::task::block_in_place(|| publish(volume, sidecar, &map))
    }

    fn log(&self) -> String {
        log_tail(&self.sidecar.proc.log, 40)
    }
}

/// A one-message WriteObject of `name` in `photos` through `endpoint`,
/// with the routing header a Google client sends (`routed`) or with the
/// bucket in its first message only.
async fn grpc_write(
    endpoint: String,
    name: &'static str,
    routed: bool,
) -> Result<proto::Object, tonic::Status> {
    let mut client = client(&endpoint).map_err(|e| tonic::Status::internal(e.to_string()))?;
    let messages = write_messages("photos", name, 1024);
    let call = match routed {
        true => request(messages, "photos", None),
        false => tonic::Request::new(messages),
    };
    let response = client.write_object(call).await?;
    match response.into_inner().write_status {
        Some(proto::write_object_response::WriteStatus::Resource(object)) => Ok(object),
        other => Err(tonic::Status::internal(format!("no object: {other:?}"))),
    }
}

/// The names of the objects the mock holds in `bucket`.
fn names(mock: &bucketmap_testkit::mock_gcs::MockHandle, bucket: &str) -> Vec<String> {
    mock.objects(bucket).into_iter().map(|o| o.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_grpc_write_completes_on_the_destination_and_reads_go_to_the_source() {
    let mut f = GrpcFence::start("fence-grpc-hold")
        .await
        .expect("the world");
    let mock = f.mock.handle();
    mock.put_object_data(SRC, "seed.txt", bytes::Bytes::from_static(b"src"))
        .expect("seed");
    f.publish(vec![("photos", fenced(SRC))])
        .await
        .expect("fence");
    let write = tokio::spawn(grpc_write(f.sidecar.url(), "held.bin", true));
    // Held by the name in its first message, before anything went upstream.
    let unrouted = tokio::spawn(grpc_write(f.sidecar.url(), "unrouted.bin", false));
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (call, what) in [(&write, "routed"), (&unrouted, "named in its message only")] {
        assert!(
            !call.is_finished(),
            "a gRPC write to the fenced entry ({what}) was not held\n{}",
            f.log()
        );
    }
    // A read during the fence, from the source.
    let mut reader = client(&f.sidecar.url()).expect("a client");
    let read = proto::ReadObjectRequest {
        bucket: bucket_name("photos"),
        object: "seed.txt".to_owned(),
        ..Default::default()
    };
    let mut stream = reader
        .read_object(request(read, "photos", None))
        .await
        .unwrap_or_else(|e| panic!("a read during the fence: {e}\n{}", f.log()))
        .into_inner();
    let mut data = Vec::new();
    while let Some(message) = stream.next().await {
        let message = message.unwrap_or_else(|e| panic!("the read broke: {e}"));
        data.extend(
            message
                .checksummed_data
                .map(|d| d.content)
                .unwrap_or_default(),
        );
    }
    assert_eq!(data, b"src");
    assert!(names(&mock, DST).is_empty());
    assert_eq!(names(&mock, SRC), ["seed.txt"]);

    f.publish(vec![("photos", DST.to_owned())])
        .await
        .expect("open");
    for (call, name) in [(write, "held.bin"), (unrouted, "unrouted.bin")] {
        let object = call
            .await
            .expect("the writer")
            .unwrap_or_else(|e| panic!("the held write {name}: {e}\n{}", f.log()));
        // The client sees the logical name.
        assert_eq!(object.bucket, bucket_name("photos"));
    }
    assert_eq!(names(&mock, DST), ["held.bin", "unrouted.bin"]);
    assert_eq!(names(&mock, SRC), ["seed.txt"]);
    let forwarded = tokio::task::block_in_place(|| metric(&f.sidecar, &held("forwarded")));
    assert_eq!(forwarded.ok(), Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_write_in_flight_is_cut_off_at_the_fence_and_a_finished_one_is_not() {
    let mut f = GrpcFence::start("fence-grpc-cut").await.expect("the world");
    let mock = f.mock.handle();
    // Two chunks of a 64 MiB object, then the client stalls.
    let messages = write_messages("photos", "slow.bin", 64 * MIB)
        .take(2)
        .chain(futures::stream::pending());
    let mut slow_client = client(&f.sidecar.url()).expect("a client");
    let slow = tokio::spawn(async move {
        slow_client
            .write_object(request(messages, "photos", None))
            .await
    });
    let deadline = Instant::now() + PATIENCE;
    while mock.upload_count() == 0 {
        assert!(
            Instant::now() < deadline,
            "the slow write never reached the mock\n{}",
            f.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A finished write whose answer is slow: the mock waits before it
    // reads the stream; the sidecar has passed the whole stream on.
    mock.set_latency(Some("WriteObject".to_owned()), Duration::from_secs(3));
    let finished = tokio::spawn(grpc_write(f.sidecar.url(), "finished.bin", true));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !finished.is_finished(),
        "the finished write was answered before the fence"
    );

    f.publish(vec![("photos", fenced(SRC))])
        .await
        .expect("fence");
    let cut = tokio::time::timeout(PATIENCE, slow)
        .await
        .unwrap_or_else(|_| panic!("the slow write was not cut off\n{}", f.log()))
        .expect("the slow writer");
    let mut c = Checks::default();
    match cut {
        Ok(r) => c.fail(format!("the slow write succeeded: {r:?}")),
        Err(status) => {
            c.eq("the slow write's code", status.code(), Code::Unavailable);
            c.check(status.message().contains("cut off"), || {
                status.message().to_owned()
            });
        }
    }
    let logged = wait_for_call(&mock, PATIENCE, |call| {
        call.method == "WriteObject" && call.bucket.as_deref() == Some(SRC) && call.cancelled
    })
    .await;
    c.check(logged.is_ok(), || {
        format!("the upstream write was not cancelled: {logged:?}")
    });
    match finished.await.expect("the finished writer") {
        Ok(object) => c.eq("the finished write", object.name, "finished.bin".to_owned()),
        Err(status) => c.fail(format!("the finished write was refused: {status}")),
    }
    let names: Vec<String> = mock.objects(SRC).into_iter().map(|o| o.name).collect();
    c.eq(
        "objects in the source",
        names,
        vec!["finished.bin".to_owned()],
    );
    let cut_off = tokio::task::block_in_place(|| metric(&f.sidecar, CUT_OFF));
    c.eq("writes cut off", cut_off.ok(), Some(1.0));
    c.finish("gRPC writes in flight at the fence", &f.log());
}
