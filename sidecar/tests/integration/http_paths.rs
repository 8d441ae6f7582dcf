//! Raw HTTP through the sidecar: the XML API in path style and in
//! virtual-hosted style, the JSON API paths, and the requests it must refuse
//! (unknown logical names, physical names, signed URLs, oversized metadata
//! bodies, malformed paths) without writing anything upstream.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::net::SocketAddr;

use anyhow::Result;
use common::checks::Checks;
use common::http::{Request, Response, encode};
use common::procs::Sidecar;
use common::world::World;
use serde_json::json;

const PHOTOS_PHYSICAL: &str = "photos-k3x9q2mw";
const VIDEOS_PHYSICAL: &str = "videos-a1b2c3d4";
const FORBIDDEN_PHOTOS: &str = "photos-j7h6g5f4";

/// The same object name in three physical buckets with different contents,
/// so a read proves which bucket it reached.
const SEED: &str = "seed/hello.txt";

fn seed(world: &World) -> Result<()> {
    for bucket in [PHOTOS_PHYSICAL, VIDEOS_PHYSICAL, FORBIDDEN_PHOTOS] {
        world
            .fake
            .put(bucket, SEED, content_of(bucket).as_bytes())?;
        world.fake.put(bucket, "seed/other.txt", b"other")?;
    }
    Ok(())
}

fn content_of(bucket: &str) -> String {
    format!("the seed object of {bucket}\n")
}

fn world(name: &str, extra_args: &[&str]) -> World {
    let world =
        World::through_sidecar(name, extra_args).expect("start fake-gcs-server and the sidecar");
    seed(&world).expect("seed the physical buckets");
    world
}

/// Send, turning a transport error into a failure of the check list.
fn send(c: &mut Checks, addr: SocketAddr, what: &str, req: Request) -> Option<Response> {
    match req.send(addr) {
        Ok(resp) => Some(resp),
        Err(e) => {
            c.fail(format!("{what}: {e:#}"));
            None
        }
    }
}

/// The response must not reveal a physical name or the upstream address,
/// except names the request itself carried (an error may echo them).
fn no_leak(c: &mut Checks, world: &World, what: &str, resp: &Response) {
    no_leak_except(c, world, what, resp, None);
}

fn no_leak_except(
    c: &mut Checks,
    world: &World,
    what: &str,
    resp: &Response,
    req: Option<&Request>,
) {
    let text = resp.text();
    let headers: String = resp
        .headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\n"))
        .collect();
    let sent = req.map(|r| {
        let mut sent = r.target.clone();
        for (n, v) in &r.headers {
            sent.push_str(&format!("\n{n}: {v}"));
        }
        sent.push_str(&String::from_utf8_lossy(&r.body));
        sent
    });
    for leak in world.leaks() {
        if sent.as_deref().is_some_and(|sent| sent.contains(&leak)) {
            continue;
        }
        c.check(!text.contains(&leak) && !headers.contains(&leak), || {
            format!("{what}: the response reveals {leak:?}: {}", resp.summary())
        });
    }
}

#[test]
fn xml_api_path_style_and_virtual_hosted_style() {
    let world = world("xml", &[]);
    let addr = world.sidecar_addr();
    let mut c = Checks::default();
    let vhost = |bucket: &str| format!("{bucket}.storage.googleapis.com");

    for (logical, physical) in [("photos", PHOTOS_PHYSICAL), ("videos", VIDEOS_PHYSICAL)] {
        let want = content_of(physical);
        let what = format!("GET /{logical}/{SEED} (path style)");
        if let Some(r) = send(
            &mut c,
            addr,
            &what,
            Request::get(format!("/{logical}/{SEED}")),
        ) {
            c.eq(&format!("{what}: status"), r.status, 200);
            c.eq(&format!("{what}: body"), r.text(), want.clone());
        }
        let what = format!(
            "GET /{SEED} with Host: {} (virtual-hosted style)",
            vhost(logical)
        );
        if let Some(r) = send(
            &mut c,
            addr,
            &what,
            Request::get(format!("/{SEED}")).header("Host", vhost(logical)),
        ) {
            c.eq(&format!("{what}: status"), r.status, 200);
            c.eq(&format!("{what}: body"), r.text(), want.clone());
        }
    }

    // Only the first path segment is the bucket: an object whose name starts
    // with bucket names stays as it is.
    let tricky = format!("photos/{VIDEOS_PHYSICAL}/photos.txt");
    world
        .fake
        .put(PHOTOS_PHYSICAL, &tricky, b"tricky")
        .expect("seed");
    for (what, req) in [
        (
            format!("GET /photos/{tricky}"),
            Request::get(format!("/photos/{tricky}")),
        ),
        (
            format!("GET /{tricky} (virtual-hosted)"),
            Request::get(format!("/{tricky}")).header("Host", vhost("photos")),
        ),
        (
            format!("GET /storage/v1/b/photos/o/{}?alt=media", encode(&tricky)),
            Request::get(format!(
                "/storage/v1/b/photos/o/{}?alt=media",
                encode(&tricky)
            )),
        ),
    ] {
        if let Some(r) = send(&mut c, addr, &what, req) {
            c.eq(
                &format!("{what}: status and body"),
                (r.status, r.text()),
                (200, "tricky".to_owned()),
            );
        }
    }

    let want = content_of(PHOTOS_PHYSICAL);
    let what = "HEAD /photos/seed/hello.txt";
    if let Some(r) = send(
        &mut c,
        addr,
        what,
        Request::new("HEAD", format!("/photos/{SEED}")),
    ) {
        c.eq(&format!("{what}: status"), r.status, 200);
        c.eq(
            &format!("{what}: Content-Length"),
            r.header("content-length").map(str::to_owned),
            Some(want.len().to_string()),
        );
    }
    let what = "GET /photos/seed/hello.txt with Range: bytes=4-11";
    if let Some(r) = send(
        &mut c,
        addr,
        what,
        Request::get(format!("/photos/{SEED}")).header("Range", "bytes=4-11"),
    ) {
        c.eq(&format!("{what}: status"), r.status, 206);
        c.eq(
            &format!("{what}: body"),
            r.body.clone(),
            want.as_bytes()[4..12].to_vec(),
        );
    }
    let what = "GET /photos/seed/missing.txt";
    if let Some(r) = send(&mut c, addr, what, Request::get("/photos/seed/missing.txt")) {
        c.eq(&format!("{what}: status"), r.status, 404);
        no_leak(&mut c, &world, what, &r);
    }

    // Listing: the XML body names the bucket; it must be the logical one.
    for (what, req) in [
        (
            "GET /photos?prefix=seed/ (path-style list)",
            Request::get("/photos?prefix=seed/"),
        ),
        (
            "GET /?prefix=seed/ with Host: photos.storage.googleapis.com",
            Request::get("/?prefix=seed/").header("Host", vhost("photos")),
        ),
    ] {
        if let Some(r) = send(&mut c, addr, what, req) {
            c.eq(&format!("{what}: status"), r.status, 200);
            let body = r.text();
            c.check(body.contains("<Name>photos</Name>"), || {
                format!("{what}: no <Name>photos</Name> in {body}")
            });
            c.check(
                body.contains("<Key>seed/hello.txt</Key>")
                    && body.contains("<Key>seed/other.txt</Key>"),
                || format!("{what}: the listing lacks the seeded keys: {body}"),
            );
            no_leak(&mut c, &world, what, &r);
        }
    }

    // (No XML PUT upload here: fake-gcs-server answers a plain
    // `PUT /BUCKET/OBJECT` with 400 "invalid uploadType"; the negative
    // tests still send XML PUTs, which must be refused before the upstream.)

    // JSON API, raw: metadata, both download paths, and an error body.
    let enc = encode(SEED);
    let what = "GET /storage/v1/b/photos/o/seed%2Fhello.txt";
    if let Some(r) = send(
        &mut c,
        addr,
        what,
        Request::get(format!("/storage/v1/b/photos/o/{enc}")),
    ) {
        c.eq(&format!("{what}: status"), r.status, 200);
        match r.json() {
            Ok(body) => {
                c.eq(
                    &format!("{what}: bucket"),
                    body["bucket"].as_str(),
                    Some("photos"),
                );
                c.eq(&format!("{what}: name"), body["name"].as_str(), Some(SEED));
                let self_link = body["selfLink"].as_str().unwrap_or_default();
                let want = format!("{}/storage/v1/b/photos/o/", world.endpoint());
                c.check(self_link.starts_with(&want), || {
                    format!("{what}: selfLink {self_link:?} does not start with {want:?}")
                });
                let media_link = body["mediaLink"].as_str().unwrap_or_default();
                let want = format!("{}/", world.endpoint());
                c.check(
                    media_link.starts_with(&want) && media_link.contains("/b/photos/o/"),
                    || {
                        format!(
                            "{what}: mediaLink {media_link:?} is not a logical link on {want:?}"
                        )
                    },
                );
            }
            Err(e) => c.fail(format!("{what}: {e:#}")),
        }
        no_leak(&mut c, &world, what, &r);
    }
    for target in [
        format!("/download/storage/v1/b/photos/o/{enc}?alt=media"),
        format!("/storage/v1/b/photos/o/{enc}?alt=media"),
    ] {
        let what = format!("GET {target}");
        if let Some(r) = send(&mut c, addr, &what, Request::get(target.clone())) {
            c.eq(&format!("{what}: status"), r.status, 200);
            c.eq(
                &format!("{what}: body"),
                r.text(),
                content_of(PHOTOS_PHYSICAL),
            );
        }
    }
    let what = "GET /storage/v1/b/photos/o/seed%2Fmissing.txt";
    if let Some(r) = send(
        &mut c,
        addr,
        what,
        Request::get("/storage/v1/b/photos/o/seed%2Fmissing.txt"),
    ) {
        c.eq(&format!("{what}: status"), r.status, 404);
        no_leak(&mut c, &world, what, &r);
    }
    let what = "GET /storage/v1/b/photos";
    if let Some(r) = send(&mut c, addr, what, Request::get("/storage/v1/b/photos")) {
        c.eq(&format!("{what}: status"), r.status, 200);
        if let Ok(body) = r.json() {
            c.eq(
                &format!("{what}: name"),
                body["name"].as_str(),
                Some("photos"),
            );
            c.eq(&format!("{what}: id"), body["id"].as_str(), Some("photos"));
        }
        no_leak(&mut c, &world, what, &r);
    }

    c.finish(
        "XML and JSON API paths through the sidecar",
        &world.diagnostics(),
    );
}

/// Send each request, expect a status in `statuses`, and check nothing
/// changed upstream.
fn refused(
    c: &mut Checks,
    world: &World,
    title: &str,
    cases: Vec<(String, Request)>,
    statuses: &[u16],
) {
    let addr = world.sidecar_addr();
    let before = world.fake.snapshot().expect("snapshot the upstream");
    for (what, req) in cases {
        let req_copy = req.clone();
        if let Some(r) = send(c, addr, &what, req) {
            c.check(statuses.contains(&r.status), || {
                format!(
                    "{title}: {what}: want one of {statuses:?}, got {}",
                    r.summary()
                )
            });
            c.check(!r.text().contains("the seed object of"), || {
                format!(
                    "{title}: {what}: the response holds object data: {}",
                    r.summary()
                )
            });
            no_leak_except(c, world, &format!("{title}: {what}"), &r, Some(&req_copy));
        }
    }
    match world.fake.snapshot() {
        Ok(after) => c.check(after == before, || {
            let added: Vec<_> = after
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(*v))
                .map(|(k, _)| k)
                .collect();
            let removed: Vec<_> = before.keys().filter(|k| !after.contains_key(*k)).collect();
            format!("{title}: the upstream changed: written {added:?}, removed {removed:?}")
        }),
        Err(e) => c.fail(format!("{title}: {e:#}")),
    }
    // The sidecar survived all of it.
    match Request::get(Sidecar::READYZ).send(addr) {
        Ok(r) => c.eq(&format!("{title}: /readyz afterwards"), r.status, 200),
        Err(e) => c.fail(format!("{title}: /readyz afterwards: {e:#}")),
    }
}

fn upload(bucket: &str, name: &str) -> Request {
    Request::new(
        "POST",
        format!(
            "/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
            encode(name)
        ),
    )
    .header("Content-Type", "text/plain")
    .body("must not be written")
}

#[test]
fn unknown_logical_bucket_is_a_gcs_style_404_naming_it() {
    let world = world("unknown", &[]);
    let addr = world.sidecar_addr();
    let mut c = Checks::default();
    let json_cases = [
        (
            "GET /storage/v1/b/nosuch",
            Request::get("/storage/v1/b/nosuch"),
        ),
        (
            "GET /storage/v1/b/nosuch/o",
            Request::get("/storage/v1/b/nosuch/o"),
        ),
        (
            "GET /storage/v1/b/nosuch/o/seed%2Fhello.txt",
            Request::get("/storage/v1/b/nosuch/o/seed%2Fhello.txt"),
        ),
        ("POST media upload to nosuch", upload("nosuch", "x.txt")),
    ];
    let before = world.fake.snapshot().expect("snapshot");
    for (what, req) in json_cases {
        let Some(r) = send(&mut c, addr, what, req) else {
            continue;
        };
        c.eq(&format!("{what}: status"), r.status, 404);
        let ct = r.header("content-type").unwrap_or_default().to_owned();
        c.check(ct.starts_with("application/json"), || {
            format!("{what}: Content-Type {ct:?}, want application/json")
        });
        match r.json() {
            Ok(body) => {
                c.eq(
                    &format!("{what}: error.code"),
                    body["error"]["code"].as_u64(),
                    Some(404),
                );
                let msg = body["error"]["message"].as_str().unwrap_or_default();
                c.check(msg.contains("nosuch"), || {
                    format!("{what}: error.message {msg:?} does not name the bucket")
                });
            }
            Err(e) => c.fail(format!("{what}: {e:#}")),
        }
        no_leak(&mut c, &world, what, &r);
    }
    c.eq(
        "upstream unchanged",
        world.fake.snapshot().expect("snapshot"),
        before,
    );

    // The XML API and the two-bucket JSON paths refuse it too.
    let cases = vec![
        (
            "GET /nosuch/seed/hello.txt".to_owned(),
            Request::get("/nosuch/seed/hello.txt"),
        ),
        (
            "GET /seed/hello.txt, Host: nosuch.storage.googleapis.com".to_owned(),
            Request::get("/seed/hello.txt").header("Host", "nosuch.storage.googleapis.com"),
        ),
        (
            "PUT /nosuch/x.txt".to_owned(),
            Request::new("PUT", "/nosuch/x.txt").body("must not be written"),
        ),
        (
            "POST copyTo an unknown bucket".to_owned(),
            Request::new(
                "POST",
                "/storage/v1/b/photos/o/seed%2Fhello.txt/copyTo/b/nosuch/o/x.txt",
            )
            .json(&json!({})),
        ),
        (
            "POST rewriteTo from an unknown bucket".to_owned(),
            Request::new(
                "POST",
                "/storage/v1/b/nosuch/o/seed%2Fhello.txt/rewriteTo/b/photos/o/x.txt",
            )
            .json(&json!({})),
        ),
    ];
    refused(&mut c, &world, "unknown logical name", cases, &[404]);
    c.finish("unknown logical bucket", &world.diagnostics());
}

fn physical_name_cases(physical: &str) -> Vec<(String, Request)> {
    vec![
        (
            format!("GET /storage/v1/b/{physical}/o"),
            Request::get(format!("/storage/v1/b/{physical}/o")),
        ),
        (
            format!("GET /storage/v1/b/{physical}/o/seed%2Fhello.txt"),
            Request::get(format!("/storage/v1/b/{physical}/o/seed%2Fhello.txt")),
        ),
        (
            format!("GET /storage/v1/b/{physical}/o/…?alt=media"),
            Request::get(format!(
                "/storage/v1/b/{physical}/o/seed%2Fhello.txt?alt=media"
            )),
        ),
        (
            format!("GET /{physical}/seed/hello.txt"),
            Request::get(format!("/{physical}/seed/hello.txt")),
        ),
        (
            format!("GET Host: {physical}.storage.googleapis.com"),
            Request::get("/seed/hello.txt")
                .header("Host", format!("{physical}.storage.googleapis.com")),
        ),
        (
            format!("POST media upload to {physical}"),
            upload(physical, "sneaky.txt"),
        ),
        (
            format!("PUT /{physical}/sneaky.txt"),
            Request::new("PUT", format!("/{physical}/sneaky.txt")).body("must not be written"),
        ),
        (
            format!("DELETE /storage/v1/b/{physical}/o/seed%2Fhello.txt"),
            Request::new(
                "DELETE",
                format!("/storage/v1/b/{physical}/o/seed%2Fhello.txt"),
            ),
        ),
        (
            format!("POST copyTo {physical}"),
            Request::new(
                "POST",
                format!("/storage/v1/b/photos/o/seed%2Fhello.txt/copyTo/b/{physical}/o/stolen.txt"),
            )
            .json(&json!({})),
        ),
        (
            format!("POST rewriteTo {physical}"),
            Request::new(
                "POST",
                format!(
                    "/storage/v1/b/photos/o/seed%2Fhello.txt/rewriteTo/b/{physical}/o/stolen.txt"
                ),
            )
            .json(&json!({})),
        ),
        (
            format!("POST rewriteTo photos from {physical}"),
            Request::new(
                "POST",
                format!(
                    "/storage/v1/b/{physical}/o/seed%2Fhello.txt/rewriteTo/b/photos/o/stolen.txt"
                ),
            )
            .json(&json!({})),
        ),
    ]
}

#[test]
fn physical_names_are_refused() {
    let world = world("physical", &[]);
    let mut c = Checks::default();
    // Mapped physical names (the app must use the logical one) and another
    // environment's buckets alike.
    for physical in [PHOTOS_PHYSICAL, FORBIDDEN_PHOTOS] {
        refused(
            &mut c,
            &world,
            &format!("physical name {physical}"),
            physical_name_cases(physical),
            &[400, 403, 404],
        );
    }
    c.finish("physical names used directly", &world.diagnostics());
}

#[test]
fn allow_physical_names_admits_mapped_physical_names_only() {
    let world = world("allow-physical", &["--allow-physical-names"]);
    let addr = world.sidecar_addr();
    let mut c = Checks::default();
    for target in [
        format!("/{PHOTOS_PHYSICAL}/{SEED}"),
        format!(
            "/storage/v1/b/{PHOTOS_PHYSICAL}/o/{}?alt=media",
            encode(SEED)
        ),
    ] {
        let what = format!("GET {target} with --allow-physical-names");
        if let Some(r) = send(&mut c, addr, &what, Request::get(target.clone())) {
            c.eq(&format!("{what}: status"), r.status, 200);
            c.eq(
                &format!("{what}: body"),
                r.text(),
                content_of(PHOTOS_PHYSICAL),
            );
        }
    }
    refused(
        &mut c,
        &world,
        &format!("unmapped {FORBIDDEN_PHOTOS} with --allow-physical-names"),
        physical_name_cases(FORBIDDEN_PHOTOS),
        &[400, 403, 404],
    );
    c.finish("--allow-physical-names", &world.diagnostics());
}

#[test]
fn signed_urls_are_rejected_with_400() {
    let world = world("signed", &[]);
    let mut c = Checks::default();
    let v4 = "X-Goog-Algorithm=GOOG4-RSA-SHA256\
        &X-Goog-Credential=app%40p.iam.gserviceaccount.com%2F20260101%2Fauto%2Fstorage%2Fgoog4_request\
        &X-Goog-Date=20260101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host\
        &X-Goog-Signature=0123456789abcdef";
    let v2 = "GoogleAccessId=app%40p.iam.gserviceaccount.com&Expires=1900000000&Signature=c2lnbmVk";
    let cases = vec![
        (
            "V4 GET, path style".to_owned(),
            Request::get(format!("/photos/{SEED}?{v4}")),
        ),
        (
            "V4 GET, virtual-hosted".to_owned(),
            Request::get(format!("/{SEED}?{v4}")).header("Host", "photos.storage.googleapis.com"),
        ),
        (
            "V4 PUT, path style".to_owned(),
            Request::new("PUT", format!("/photos/signed.txt?{v4}")).body("must not be written"),
        ),
        (
            "V4 on a JSON API download".to_owned(),
            Request::get(format!(
                "/storage/v1/b/photos/o/{}?alt=media&{v4}",
                encode(SEED)
            )),
        ),
        (
            "V2 GET, path style".to_owned(),
            Request::get(format!("/photos/{SEED}?{v2}")),
        ),
    ];
    refused(&mut c, &world, "signed URL", cases, &[400]);
    c.finish("signed URLs", &world.diagnostics());
}

#[test]
fn oversized_metadata_bodies_are_413_and_media_is_not_limited() {
    const LIMIT: usize = 4096;
    let limit = LIMIT.to_string();
    let world = world("metadata-limit", &["--max-metadata-bytes", &limit]);
    let addr = world.sidecar_addr();
    let mut c = Checks::default();
    let big_metadata = json!({ "metadata": { "filler": "x".repeat(3 * LIMIT) } });
    let multipart = |metadata: &serde_json::Value, media: &[u8]| {
        let mut body = Vec::new();
        body.extend_from_slice(b"--bnd\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n");
        body.extend_from_slice(metadata.to_string().as_bytes());
        body.extend_from_slice(b"\r\n--bnd\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(media);
        body.extend_from_slice(b"\r\n--bnd--\r\n");
        Request::new("POST", "/upload/storage/v1/b/photos/o?uploadType=multipart")
            .header("Content-Type", "multipart/related; boundary=bnd")
            .body(body)
    };
    let mut big_named = big_metadata.clone();
    big_named["name"] = json!("oversized/multipart.txt");
    let cases = vec![
        (
            "PATCH object metadata".to_owned(),
            Request::new("PATCH", format!("/storage/v1/b/photos/o/{}", encode(SEED)))
                .json(&big_metadata),
        ),
        (
            "resumable upload init".to_owned(),
            Request::new(
                "POST",
                "/upload/storage/v1/b/photos/o?uploadType=resumable&name=oversized%2Fresumable.txt",
            )
            .json(&big_metadata),
        ),
        (
            "multipart upload metadata part".to_owned(),
            multipart(&big_named, b"small media"),
        ),
    ];
    refused(&mut c, &world, "oversized metadata", cases, &[413]);

    // Under the limit, and media far over it, still pass.
    let media = common::scenario::pseudo_random(16 * LIMIT, 7);
    let what = "multipart upload, small metadata, media 16x the limit";
    if let Some(r) = send(
        &mut c,
        addr,
        what,
        multipart(&json!({ "name": "fits/multipart.bin" }), &media),
    ) {
        c.eq(&format!("{what}: status"), r.status, 200);
        match world.fake.content(PHOTOS_PHYSICAL, "fits/multipart.bin") {
            Ok(got) => c.check(got == media, || {
                format!(
                    "{what}: upstream holds {} bytes, not the {} sent",
                    got.len(),
                    media.len()
                )
            }),
            Err(e) => c.fail(format!("{what}: {e:#}")),
        }
    }
    let what = "media upload 16x the limit";
    let req = Request::new(
        "POST",
        "/upload/storage/v1/b/photos/o?uploadType=media&name=fits%2Fmedia.bin",
    )
    .header("Content-Type", "application/octet-stream")
    .body(media.clone());
    if let Some(r) = send(&mut c, addr, what, req) {
        c.eq(&format!("{what}: status"), r.status, 200);
        match world.fake.content(PHOTOS_PHYSICAL, "fits/media.bin") {
            Ok(got) => c.check(got == media, || {
                format!(
                    "{what}: upstream holds {} bytes, not the {} sent",
                    got.len(),
                    media.len()
                )
            }),
            Err(e) => c.fail(format!("{what}: {e:#}")),
        }
    }
    let what = "PATCH with small metadata";
    let req = Request::new("PATCH", format!("/storage/v1/b/photos/o/{}", encode(SEED)))
        .json(&json!({ "metadata": { "color": "green" } }));
    if let Some(r) = send(&mut c, addr, what, req) {
        c.eq(&format!("{what}: status"), r.status, 200);
        if let Ok(body) = r.json() {
            c.eq(
                &format!("{what}: metadata"),
                body["metadata"]["color"].as_str(),
                Some("green"),
            );
            c.eq(
                &format!("{what}: bucket"),
                body["bucket"].as_str(),
                Some("photos"),
            );
        }
    }
    c.finish("metadata body limit", &world.diagnostics());
}

#[test]
fn malformed_requests_get_a_clean_4xx() {
    let world = world("malformed", &[]);
    let mut c = Checks::default();
    let long = "a".repeat(64 * 1024);
    let cases = vec![
        (
            "invalid percent-encoding in an object name".to_owned(),
            Request::get("/storage/v1/b/photos/o/%ZZ"),
        ),
        (
            "truncated percent-encoding in an object name".to_owned(),
            Request::get("/storage/v1/b/photos/o/abc%2"),
        ),
        (
            "invalid percent-encoding in a bucket".to_owned(),
            Request::get("/storage/v1/b/%ZZ/o"),
        ),
        (
            "lone % as a bucket".to_owned(),
            Request::get("/storage/v1/b/%/o"),
        ),
        (
            "empty bucket segment".to_owned(),
            Request::get("/storage/v1/b//o"),
        ),
        (
            "encoded slash inside the bucket".to_owned(),
            Request::get("/storage/v1/b/photos%2F..%2Fphotos-j7h6g5f4/o"),
        ),
        (
            "NUL in the bucket".to_owned(),
            Request::get("/storage/v1/b/pho%00tos/o"),
        ),
        (
            "dot segments towards another bucket (JSON)".to_owned(),
            Request::get("/storage/v1/b/photos/../photos-j7h6g5f4/o"),
        ),
        (
            "dot segments towards another bucket (XML)".to_owned(),
            Request::get("/photos/../photos-j7h6g5f4/seed/hello.txt"),
        ),
        (
            "encoded dot segments (XML)".to_owned(),
            Request::get("/photos/%2E%2E/photos-j7h6g5f4/seed/hello.txt"),
        ),
        (
            "invalid percent-encoding, XML path".to_owned(),
            Request::get("/photos/%ZZ"),
        ),
        (
            "invalid percent-encoding, XML bucket".to_owned(),
            Request::get("/%ZZ/x"),
        ),
        (
            "64 KiB request target".to_owned(),
            Request::get(format!("/photos/{long}")),
        ),
        (
            "malformed JSON in a PATCH".to_owned(),
            Request::new("PATCH", format!("/storage/v1/b/photos/o/{}", encode(SEED)))
                .header("Content-Type", "application/json")
                .body("{not json"),
        ),
        (
            "malformed multipart upload".to_owned(),
            Request::new("POST", "/upload/storage/v1/b/photos/o?uploadType=multipart")
                .header("Content-Type", "multipart/related; boundary=bnd")
                .body("this is not multipart"),
        ),
        (
            "malformed compose body".to_owned(),
            Request::new("POST", "/storage/v1/b/photos/o/composed.txt/compose")
                .header("Content-Type", "application/json")
                .body("[1,2"),
        ),
    ];
    let statuses: Vec<u16> = (400..500).collect();
    refused(&mut c, &world, "malformed", cases, &statuses);
    c.finish("malformed requests", &world.diagnostics());
}

/// One `application/http` part of a batch request.
fn batch_part(id: &str, request_line: &str, json_body: Option<&serde_json::Value>) -> String {
    let mut part = format!(
        "--bnd\r\nContent-Type: application/http\r\nContent-ID: <{id}>\r\n\r\n{request_line} HTTP/1.1\r\n"
    );
    match json_body {
        Some(body) => {
            let body = body.to_string();
            part.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}\r\n",
                body.len()
            ));
        }
        None => part.push_str("\r\n\r\n"),
    }
    part
}

/// The nested responses of a `multipart/mixed` batch response, by Content-ID
/// (`response-` prefix removed): (status, body).
fn batch_responses(resp: &Response) -> Result<std::collections::BTreeMap<String, (u16, String)>> {
    let ct = resp.header("content-type").unwrap_or_default();
    let boundary = ct
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_owned())
        .ok_or_else(|| anyhow::anyhow!("batch response without a boundary: Content-Type {ct:?}"))?;
    let text = resp.text();
    let mut out = std::collections::BTreeMap::new();
    for part in text.split(&format!("--{boundary}")).skip(1) {
        if part.starts_with("--") {
            break;
        }
        let part = part.trim_start_matches("\r\n");
        let (head, nested) = part.split_once("\r\n\r\n").unwrap_or((part, ""));
        let id = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(n, _)| n.trim().eq_ignore_ascii_case("content-id"))
            })
            .map(|(_, v)| {
                v.trim()
                    .trim_matches(['<', '>'])
                    .trim_start_matches("response-")
                    .to_owned()
            })
            .unwrap_or_default();
        let status: u16 = nested
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = nested
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.trim().to_owned())
            .unwrap_or_default();
        out.insert(id, (status, body));
    }
    Ok(out)
}

#[test]
fn batch_requests_are_rewritten_both_ways() {
    let world = world("batch", &[]);
    let addr = world.sidecar_addr();
    let endpoint = world.endpoint();
    let mut c = Checks::default();
    let enc = encode(SEED);
    let other = encode("seed/other.txt");
    let body = [
        // Origin-form and absolute-form request lines (Python sends the latter).
        batch_part("get", &format!("GET /storage/v1/b/photos/o/{enc}"), None),
        batch_part(
            "patch",
            &format!("PATCH {endpoint}/storage/v1/b/videos/o/{enc}"),
            Some(&json!({ "metadata": { "color": "green" } })),
        ),
        batch_part(
            "delete",
            &format!("DELETE /storage/v1/b/photos/o/{other}"),
            None,
        ),
        batch_part(
            "physical",
            &format!("DELETE /storage/v1/b/{FORBIDDEN_PHOTOS}/o/{other}"),
            None,
        ),
        batch_part(
            "unknown",
            &format!("GET /storage/v1/b/nosuch/o/{enc}"),
            None,
        ),
        "--bnd--\r\n".to_owned(),
    ]
    .concat();
    let req = Request::new("POST", "/batch/storage/v1")
        .header("Content-Type", "multipart/mixed; boundary=bnd")
        .body(body);
    let sent = req.clone();
    let Some(resp) = send(&mut c, addr, "POST /batch/storage/v1", req) else {
        return c.finish("batch", &world.diagnostics());
    };
    c.eq("batch: status", resp.status, 200);
    // The refused part may echo the physical name it asked for; nothing else may leak.
    no_leak_except(&mut c, &world, "batch response", &resp, Some(&sent));
    match batch_responses(&resp) {
        Ok(parts) => {
            let get = |id: &str| parts.get(id).cloned().unwrap_or((0, String::new()));
            let json_of =
                |body: &str| serde_json::from_str::<serde_json::Value>(body).unwrap_or_default();

            let (status, body) = get("get");
            c.eq("batch GET photos: status", status, 200);
            let v = json_of(&body);
            c.eq(
                "batch GET photos: bucket",
                v["bucket"].as_str(),
                Some("photos"),
            );
            c.eq("batch GET photos: name", v["name"].as_str(), Some(SEED));
            for key in ["selfLink", "mediaLink"] {
                let link = v[key].as_str().unwrap_or_default();
                c.check(
                    link.starts_with(&format!("{endpoint}/")) && link.contains("/b/photos/o/"),
                    || {
                        format!(
                            "batch GET photos: {key} {link:?} is not a logical link on {endpoint}"
                        )
                    },
                );
            }

            let (status, body) = get("patch");
            c.eq("batch PATCH videos: status", status, 200);
            let v = json_of(&body);
            c.eq(
                "batch PATCH videos: bucket",
                v["bucket"].as_str(),
                Some("videos"),
            );
            c.eq(
                "batch PATCH videos: metadata",
                v["metadata"]["color"].as_str(),
                Some("green"),
            );
            if let Some(link) = v["selfLink"].as_str() {
                c.check(link.starts_with(&format!("{endpoint}/storage/v1/b/videos/o/")), || {
                    format!("batch PATCH videos: selfLink {link:?} is not a logical link on {endpoint}")
                });
            }

            let (status, _) = get("delete");
            c.check((200..300).contains(&status), || {
                format!("batch DELETE photos: status {status}")
            });
            let (status, _) = get("physical");
            c.check(matches!(status, 400 | 403 | 404), || {
                format!("batch DELETE on {FORBIDDEN_PHOTOS}: status {status}, want a refusal")
            });
            c.eq("batch GET unknown: status", get("unknown").0, 404);
        }
        Err(e) => c.fail(format!("batch: {e:#}: {}", resp.summary())),
    }

    // Upstream: only the mapped buckets changed, each as asked.
    let has = |bucket: &str, name: &str| {
        world
            .fake
            .objects(bucket)
            .map(|o| o.contains_key(name))
            .unwrap_or(false)
    };
    c.check(!has(PHOTOS_PHYSICAL, "seed/other.txt"), || {
        format!("{PHOTOS_PHYSICAL}/seed/other.txt was not deleted")
    });
    c.check(has(VIDEOS_PHYSICAL, "seed/other.txt"), || {
        format!("{VIDEOS_PHYSICAL}/seed/other.txt was deleted")
    });
    c.check(has(FORBIDDEN_PHOTOS, "seed/other.txt"), || {
        format!("{FORBIDDEN_PHOTOS}/seed/other.txt was deleted")
    });
    let metadata = world
        .fake
        .objects(VIDEOS_PHYSICAL)
        .ok()
        .and_then(|o| o.get(SEED).cloned())
        .unwrap_or_default();
    c.eq(
        "batch PATCH: metadata upstream",
        metadata["metadata"]["color"].as_str(),
        Some("green"),
    );

    c.finish("batch requests", &world.diagnostics());
}

#[test]
fn resumable_upload_protocol_through_the_sidecar() {
    let world = world("resumable", &[]);
    let addr = world.sidecar_addr();
    let endpoint = world.endpoint();
    let mut c = Checks::default();
    let data = common::scenario::pseudo_random(3 * 256 * 1024 + 1000, 11);
    let first = 2 * 256 * 1024;

    // Initiation, with the bucket also named in the JSON body (as some clients send it).
    let init = |name: &str| {
        Request::new(
            "POST",
            format!(
                "/upload/storage/v1/b/photos/o?uploadType=resumable&name={}",
                encode(name)
            ),
        )
        .json(
            &json!({ "name": name, "bucket": "photos", "contentType": "application/octet-stream" }),
        )
    };
    let session = |c: &mut Checks, what: &str, name: &str| -> Option<String> {
        let r = send(c, addr, what, init(name))?;
        c.eq(&format!("{what}: status"), r.status, 200);
        no_leak(c, &world, what, &r);
        let location = r.header("location").unwrap_or_default().to_owned();
        let want = format!("{endpoint}/upload/storage/v1/b/photos/o?");
        c.check(
            location.starts_with(&want) && location.contains("upload_id="),
            || format!("{what}: Location {location:?} is not a session URL on {want:?}"),
        );
        location.strip_prefix(&endpoint).map(str::to_owned)
    };

    if let Some(target) = session(&mut c, "resumable init", "raw/resumable.bin") {
        let put = |range: String, body: &[u8]| {
            Request::new("PUT", target.clone())
                .header("Content-Range", range)
                .body(body.to_vec())
        };
        let what = "first chunk";
        if let Some(r) = send(
            &mut c,
            addr,
            what,
            put(format!("bytes 0-{}/*", first - 1), &data[..first]),
        ) {
            c.eq(&format!("{what}: status"), r.status, 308);
            c.eq(
                &format!("{what}: Range"),
                r.header("range").map(str::to_owned),
                Some(format!("bytes=0-{}", first - 1)),
            );
        }
        // (No status query, `Content-Range: bytes */*`: fake-gcs-server takes
        // it as the end of a streamed upload and finalises the object.)
        let what = "last chunk";
        let range = format!("bytes {first}-{}/{}", data.len() - 1, data.len());
        if let Some(r) = send(&mut c, addr, what, put(range, &data[first..])) {
            c.eq(&format!("{what}: status"), r.status, 200);
            no_leak(&mut c, &world, what, &r);
            if let Ok(v) = r.json() {
                c.eq(
                    &format!("{what}: bucket"),
                    v["bucket"].as_str(),
                    Some("photos"),
                );
                c.eq(
                    &format!("{what}: name"),
                    v["name"].as_str(),
                    Some("raw/resumable.bin"),
                );
            }
        }
        match world.fake.content(PHOTOS_PHYSICAL, "raw/resumable.bin") {
            Ok(got) => c.check(got == data, || {
                format!(
                    "upstream holds {} bytes, not the {} sent",
                    got.len(),
                    data.len()
                )
            }),
            Err(e) => c.fail(format!("{e:#}")),
        }
    }

    // Cancelling a session writes nothing.
    if let Some(target) = session(&mut c, "second resumable init", "raw/cancelled.bin") {
        let what = "DELETE the session";
        if let Some(r) = send(&mut c, addr, what, Request::new("DELETE", target)) {
            c.check(matches!(r.status, 200..=299 | 499), || {
                format!("{what}: {}", r.summary())
            });
        }
        let names = world
            .fake
            .objects(PHOTOS_PHYSICAL)
            .map(|o| o.contains_key("raw/cancelled.bin"));
        c.eq("cancelled upload upstream", names.ok(), Some(false));
    }
    c.finish("resumable upload protocol", &world.diagnostics());
}
