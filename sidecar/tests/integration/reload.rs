//! The map reloads from `--mapping-dir` while requests are in flight.
//!
//! The directory has the layout the kubelet gives a ConfigMap volume: the
//! data in a timestamped directory, `..data` a symlink to it, each key a
//! symlink through `..data`; an update writes a new timestamped directory
//! and renames a fresh `..data_tmp` symlink over `..data`, then fixes the
//! key symlinks and removes the old directory.
//!
//! A read in flight finishes against the bucket it was routed to; a write
//! whose body is still arriving when an update moves its bucket away is
//! cut off (a retryable 503) and lands nowhere, as a move's switch needs
//! (`bucketmap_sidecar::flights`).

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use common::checks::Checks;
use common::http::{Request, encode, get_slowly};
use common::mapping_dir::MappingDir;
use common::procs::Sidecar;
use common::scenario::{MIB, pseudo_random};
use common::world::{FORBIDDEN, World};

const PHOTOS_V1: &str = "photos-k3x9q2mw";
const PHOTOS_V2: &str = "photos-v2r8s7t6";
const VIDEOS: &str = "videos-a1b2c3d4";
const MUSIC: &str = "music-x1y2z3w4";

/// A read's status and body, or its transport error.
type ReadResult = Result<(u16, String), String>;

#[derive(Debug)]
struct Upload {
    name: String,
    started: Instant,
    finished: Instant,
    result: Result<u16, String>,
    /// Answered 503 because the write was cut off: it was in flight when
    /// an update moved `photos` away from the bucket it was sent to.
    cut: bool,
}

/// Whether an answer is the retryable refusal of a write cut off.
fn cut_off(response: &common::http::Response) -> bool {
    response.status == 503 && response.text().contains("cut off")
}

fn upload(name: &str, body: Vec<u8>) -> Request {
    Request::new(
        "POST",
        format!(
            "/upload/storage/v1/b/photos/o?uploadType=media&name={}",
            encode(name)
        ),
    )
    .header("Content-Type", "application/octet-stream")
    .body(body)
}

/// Upload probes until one lands in `want`; the instant it was observed.
fn wait_for_mapping(world: &World, addr: SocketAddr, want: &str, tag: &str) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        let name = format!("probe/{tag}/{i}");
        let resp = upload(&name, name.clone().into_bytes()).send(addr)?;
        if cut_off(&resp) {
            // Sent to the old bucket as the update came: try again.
            continue;
        }
        if resp.status != 200 {
            bail!("probe upload {name}: {}", resp.summary());
        }
        if world.fake.objects(want)?.contains_key(&name) {
            return Ok(Instant::now());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("the sidecar did not switch photos to {want} within 20 s of the mapping update")
}

#[test]
fn map_reload_with_requests_in_flight() {
    let mut buckets = vec![PHOTOS_V1, PHOTOS_V2, VIDEOS, MUSIC];
    buckets.extend(FORBIDDEN);
    let world = World::upstream_only("reload", &buckets).expect("start fake-gcs-server");
    let mut c = Checks::default();

    // The same names in both physical buckets of `photos`, different bytes.
    let big_v1 = pseudo_random(16 * MIB, 1);
    let big_v2 = pseudo_random(16 * MIB, 2);
    world
        .fake
        .put(PHOTOS_V1, "seed/big.bin", &big_v1)
        .expect("seed");
    world
        .fake
        .put(PHOTOS_V2, "seed/big.bin", &big_v2)
        .expect("seed");
    world
        .fake
        .put(PHOTOS_V1, "seed/small.txt", b"v1")
        .expect("seed");
    world
        .fake
        .put(PHOTOS_V2, "seed/small.txt", b"v2")
        .expect("seed");

    let root = world.dir().join("mapping");
    let mut mapping = MappingDir::new(root.clone(), &[("photos", PHOTOS_V1), ("videos", VIDEOS)])
        .expect("mapping dir");
    let sidecar = Sidecar::start(
        world.dir(),
        &world.fake.url(),
        &["--mapping-dir".into(), root.display().to_string()],
    )
    .expect("start the sidecar with --mapping-dir");
    let addr = sidecar.addr;
    let diagnostics = || {
        format!(
            "{}\n{}",
            common::procs::log_tail(&sidecar.proc.log, 80),
            world.diagnostics()
        )
    };

    // Before any change: photos is v1, videos is mapped, music is not.
    match Request::get("/photos/seed/small.txt").send(addr) {
        Ok(r) => c.eq(
            "before: GET /photos/seed/small.txt",
            (r.status, r.text()),
            (200, "v1".to_owned()),
        ),
        Err(e) => c.fail(format!("before: {e:#}")),
    }

    let stop = Arc::new(AtomicBool::new(false));
    let uploads: Arc<Mutex<Vec<Upload>>> = Arc::default();
    let reads: Arc<Mutex<Vec<ReadResult>>> = Arc::default();
    let load_deadline = Instant::now() + Duration::from_secs(60);

    // Steady load: small uploads and reads, bounded in count and time.
    let mut workers = Vec::new();
    for t in 0..3 {
        let (stop, uploads, reads) = (stop.clone(), uploads.clone(), reads.clone());
        workers.push(thread::spawn(move || {
            for i in 0..2000 {
                if stop.load(Ordering::Relaxed) || Instant::now() > load_deadline {
                    break;
                }
                let name = format!("load/{t}/{i}");
                let started = Instant::now();
                let sent = upload(&name, name.clone().into_bytes()).send(addr);
                let cut = sent.as_ref().is_ok_and(cut_off);
                let result = sent.map(|r| r.status).map_err(|e| format!("{e:#}"));
                uploads.lock().unwrap().push(Upload {
                    name,
                    started,
                    finished: Instant::now(),
                    result,
                    cut,
                });
                let read = Request::get("/photos/seed/small.txt")
                    .send(addr)
                    .map(|r| (r.status, r.text()))
                    .map_err(|e| format!("{e:#}"));
                reads.lock().unwrap().push(read);
            }
        }));
    }

    // Long requests that straddle update 1: a slow upload and a slow
    // download. Both are routed before the update, to v1; the download
    // finishes there, the upload is cut off (its body is still arriving
    // when v1 stops being photos' bucket).
    let slow_body = pseudo_random(2 * MIB, 3);
    let slow_upload = {
        let body = slow_body.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let result =
                upload("slow/upload.bin", body).send_paced(addr, 40, Duration::from_millis(50));
            (started, Instant::now(), result)
        })
    };
    let slow_download = thread::spawn(move || {
        let started = Instant::now();
        let result = get_slowly(
            addr,
            "/photos/seed/big.bin",
            128 * 1024,
            Duration::from_millis(15),
        );
        (started, Instant::now(), result)
    });

    thread::sleep(Duration::from_millis(500));
    // Update 1: photos moves to v2, videos goes away, music appears.
    let published_v2 = Instant::now();
    mapping
        .publish(&[("photos", PHOTOS_V2), ("music", MUSIC)])
        .expect("publish update 1");
    let switched_v2 = wait_for_mapping(&world, addr, PHOTOS_V2, "v2");
    thread::sleep(Duration::from_millis(500));
    // Update 2: back to v1, videos returns, music goes away.
    let published_v1 = Instant::now();
    mapping
        .publish(&[("photos", PHOTOS_V1), ("videos", VIDEOS)])
        .expect("publish update 2");
    let switched_v1 = wait_for_mapping(&world, addr, PHOTOS_V1, "v1");
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("load worker");
    }

    let (switched_v2, switched_v1) = match (switched_v2, switched_v1) {
        (Ok(a), Ok(b)) => (Some(a), Some(b)),
        (a, b) => {
            for e in [a.err(), b.err()].into_iter().flatten() {
                c.fail(format!("{e:#}"));
            }
            (None, None)
        }
    };

    // Every request completed, with a success.
    let uploads = std::mem::take(&mut *uploads.lock().unwrap());
    let reads = std::mem::take(&mut *reads.lock().unwrap());
    c.check(uploads.len() >= 10, || {
        format!("only {} uploads ran during the test", uploads.len())
    });
    // A write in flight at an update that moved photos is cut off.
    let straddled = |u: &Upload| {
        [published_v2, published_v1]
            .iter()
            .any(|p| u.started < *p && u.finished > *p)
    };
    let bad_uploads: Vec<_> = uploads
        .iter()
        .filter(|u| u.result != Ok(200) && !(u.cut && straddled(u)))
        .collect();
    c.check(bad_uploads.is_empty(), || {
        format!(
            "{} of {} uploads failed, e.g. {:?}",
            bad_uploads.len(),
            uploads.len(),
            &bad_uploads[..bad_uploads.len().min(5)]
        )
    });
    let bad_reads: Vec<_> = reads
        .iter()
        .filter(|r| !matches!(r, Ok((200, body)) if body == "v1" || body == "v2"))
        .collect();
    c.check(bad_reads.is_empty(), || {
        format!(
            "{} of {} reads failed or mixed buckets, e.g. {:?}",
            bad_reads.len(),
            reads.len(),
            &bad_reads[..bad_reads.len().min(5)]
        )
    });

    let straddles = |what: &str, c: &mut Checks, started: Instant, finished: Instant| {
        c.check(started < published_v2 && finished > published_v2, || {
            format!(
                "{what} did not straddle update 1 (started {:?} before it, ended {:?} after it): the test proves nothing",
                published_v2.saturating_duration_since(started),
                finished.saturating_duration_since(published_v2)
            )
        });
    };
    let (started, finished, result) = slow_upload.join().expect("slow upload thread");
    straddles("the slow upload", &mut c, started, finished);
    match result {
        Ok(r) => {
            c.check(cut_off(&r), || {
                format!("slow upload across update 1 not cut off: {}", r.summary())
            });
            let found: Vec<&str> = [PHOTOS_V1, PHOTOS_V2]
                .into_iter()
                .filter(|b| {
                    world
                        .fake
                        .content(b, "slow/upload.bin")
                        .map(|got| got == slow_body)
                        .unwrap_or(false)
                })
                .collect();
            c.eq(
                "slow upload across update 1: complete copies upstream",
                found,
                Vec::<&str>::new(),
            );
        }
        Err(e) => c.fail(format!("slow upload across update 1: {e:#}")),
    }
    let (started, finished, result) = slow_download.join().expect("slow download thread");
    straddles("the slow download", &mut c, started, finished);
    match result {
        Ok(r) => {
            c.eq("slow download across update 1: status", r.status, 200);
            c.check(r.body == big_v1, || {
                format!(
                    "slow download across update 1: {} bytes, not the v1 object intact{}",
                    r.body.len(),
                    if r.body == big_v2 {
                        " (the v2 one)"
                    } else {
                        ""
                    }
                )
            });
        }
        Err(e) => c.fail(format!("slow download across update 1: {e:#}")),
    }
    eprintln!(
        "reload: {} uploads, {} reads; switch to v2 seen {:?} after publishing, back to v1 {:?} after",
        uploads.len(),
        reads.len(),
        switched_v2.map(|t| t.saturating_duration_since(published_v2)),
        switched_v1.map(|t| t.saturating_duration_since(published_v1)),
    );

    // Each upload landed in exactly one photos bucket. One that ran wholly
    // between observing update 1 and publishing update 2 is in v2; one that
    // started after update 2 was observed is in v1; others may be in either.
    let in_v1 = world.fake.objects(PHOTOS_V1).expect("list v1");
    let in_v2 = world.fake.objects(PHOTOS_V2).expect("list v2");
    let mut misplaced = Vec::new();
    for u in uploads.iter().filter(|u| u.cut) {
        if in_v1.contains_key(&u.name) || in_v2.contains_key(&u.name) {
            misplaced.push(format!("{} was cut off, yet it landed", u.name));
        }
    }
    for u in uploads.iter().filter(|u| u.result == Ok(200)) {
        let places: Vec<&str> = [(PHOTOS_V1, &in_v1), (PHOTOS_V2, &in_v2)]
            .into_iter()
            .filter(|(_, objects)| objects.contains_key(&u.name))
            .map(|(b, _)| b)
            .collect();
        let want = match (switched_v2, switched_v1) {
            (_, Some(o2)) if u.started > o2 => Some(PHOTOS_V1),
            (Some(o1), _) if u.started > o1 && u.finished < published_v1 => Some(PHOTOS_V2),
            _ => None,
        };
        if places.len() != 1 || want.is_some_and(|w| places[0] != w) {
            misplaced.push(format!("{} in {places:?}, want {want:?}", u.name));
        }
    }
    c.check(misplaced.is_empty(), || {
        format!(
            "{} uploads misplaced, e.g. {:?}",
            misplaced.len(),
            &misplaced[..misplaced.len().min(5)]
        )
    });
    for (name, content) in in_v1
        .keys()
        .chain(in_v2.keys())
        .filter(|n| n.starts_with("load/"))
        .map(|n| (n, n.as_bytes()))
    {
        let bucket = if in_v1.contains_key(name) {
            PHOTOS_V1
        } else {
            PHOTOS_V2
        };
        if let Ok(got) = world.fake.content(bucket, name) {
            c.check(got == content, || {
                format!("{bucket}/{name} holds the wrong bytes")
            });
        }
    }

    // After update 2 settled: videos is back, music is gone again.
    let status = |target: &str| {
        Request::get(target)
            .send(addr)
            .map(|r| r.status)
            .unwrap_or(0)
    };
    c.eq(
        "after: GET /storage/v1/b/videos/o",
        status("/storage/v1/b/videos/o"),
        200,
    );
    c.eq(
        "after: GET /storage/v1/b/music/o",
        status("/storage/v1/b/music/o"),
        404,
    );
    c.eq("after: /readyz", status(Sidecar::READYZ), 200);
    let untouched: BTreeMap<&str, usize> = [VIDEOS, MUSIC]
        .into_iter()
        .chain(FORBIDDEN)
        .map(|b| {
            (
                b,
                world.fake.objects(b).map(|o| o.len()).unwrap_or(usize::MAX),
            )
        })
        .collect();
    c.eq(
        "objects in buckets the load never wrote to",
        untouched,
        [VIDEOS, MUSIC]
            .into_iter()
            .chain(FORBIDDEN)
            .map(|b| (b, 0))
            .collect(),
    );

    c.finish("map reload under load", &diagnostics());
}

#[test]
fn not_ready_until_a_map_is_loaded() {
    let world = World::upstream_only("readiness", &[PHOTOS_V1]).expect("start fake-gcs-server");
    let mut c = Checks::default();
    // The directory does not exist yet: the map has not been read. (An
    // empty directory is a map that was read and is empty: ready.)
    let root = world.dir().join("mapping");
    let mut sidecar = Sidecar::start_unready(
        world.dir(),
        &world.fake.url(),
        &["--mapping-dir".into(), root.display().to_string()],
    )
    .expect("start the sidecar with a --mapping-dir that does not exist yet");
    let addr = sidecar.addr;

    // Nothing published yet: not ready, saying why, and no bucket is reachable.
    thread::sleep(Duration::from_millis(300));
    match Request::get(Sidecar::READYZ).send(addr) {
        Ok(r) => c.check(
            r.status == 503 && String::from_utf8_lossy(&r.body).contains(&*root.to_string_lossy()),
            || format!("readyz with no map: {}", r.summary()),
        ),
        Err(e) => c.fail(format!("readyz with no map: {e:#}")),
    }
    let before = world.fake.snapshot().expect("snapshot");
    match upload("early.txt", b"too early".to_vec()).send(addr) {
        Ok(r) => c.check((400..600).contains(&r.status), || {
            format!("an upload with no map succeeded: {}", r.summary())
        }),
        Err(e) => c.fail(format!("upload with no map: {e:#}")),
    }
    c.eq(
        "upstream unchanged while no map is loaded",
        world.fake.snapshot().expect("snapshot"),
        before,
    );

    // The kubelet publishes the ConfigMap: ready, and photos works.
    let _mapping = MappingDir::new(root, &[("photos", PHOTOS_V1)]).expect("publish the map");
    if let Err(e) = sidecar.wait_ready(Duration::from_secs(20)) {
        c.fail(format!("{e:#}"));
    }
    match upload("ready.txt", b"in time".to_vec()).send(addr) {
        Ok(r) => c.eq("upload once ready: status", r.status, 200),
        Err(e) => c.fail(format!("upload once ready: {e:#}")),
    }
    match world.fake.content(PHOTOS_V1, "ready.txt") {
        Ok(got) => c.eq(
            "upload once ready: upstream content",
            got,
            b"in time".to_vec(),
        ),
        Err(e) => c.fail(format!("{e:#}")),
    }
    let log = common::procs::log_tail(&sidecar.proc.log, 40);
    c.finish(
        "readiness follows the mapping",
        &format!("{log}\n{}", world.diagnostics()),
    );
}
