//! The request router and everything that consumes its output for a request
//! line: virtual-host detection, name resolution, path rewriting, link
//! rewriting, signature detection. None of it may panic, and bucket slots
//! must always be valid ranges of the raw path.
#![no_main]

use arbitrary::Arbitrary;
use bucketmap_sidecar_core::mapping::Mapping;
use bucketmap_sidecar_core::policy::Access;
use bucketmap_sidecar_core::rewrite::url::{rewrite_copy_source, rewrite_url};
use bucketmap_sidecar_core::rewrite::{Direction, LinkBase, Translator, request_bucket};
use bucketmap_sidecar_core::route::{replace_slots, route, virtual_host_bucket};
use bucketmap_sidecar_core::signing::signature_kind;
use http::Method;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    method: u8,
    path: &'a str,
    query: Option<&'a str>,
    host: &'a str,
    authorization: &'a str,
    allow_physical: bool,
}

const METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

fuzz_target!(|input: Input<'_>| {
    let Ok(mapping) = Mapping::new([
        ("photos".to_owned(), "photos-k3x9q2mw".to_owned()),
        // A move fences `logs`: its writes are held.
        ("logs".to_owned(), "logs-aaaa1111;fenced".to_owned()),
    ]) else {
        return;
    };
    let method = &METHODS[usize::from(input.method) % METHODS.len()];
    let vhost = virtual_host_bucket(input.host, |label| mapping.knows(label));

    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(input.authorization) {
        headers.insert(http::header::AUTHORIZATION, value);
    }
    let _ = signature_kind(input.query, &headers);

    let Ok(routed) = route(method, input.path, input.query, vhost.as_deref()) else {
        return;
    };
    let mut physical = Vec::new();
    for slot in &routed.buckets {
        assert!(
            input.path.get(slot.range.clone()).is_some(),
            "slot {slot:?} is not a char range of the path"
        );
        match request_bucket(&mapping, input.allow_physical, &slot.name) {
            Ok(name) => physical.push(name),
            Err(_) => return,
        }
    }
    let names: Vec<&str> = physical.iter().map(String::as_str).collect();
    let upstream = replace_slots(input.path, &routed.buckets, &names);
    assert!(upstream.starts_with('/'));

    let links = LinkBase {
        scheme: "http".into(),
        authority: "127.0.0.1:9023".into(),
        virtual_host: vhost.clone(),
    };
    for direction in [Direction::ToLogical, Direction::ToPhysical] {
        let tr = Translator {
            mapping: &mapping,
            direction,
            allow_physical: input.allow_physical,
            links: &links,
            access: Access::WRITE,
            seen: None,
        };
        let _ = rewrite_url(&format!("https://storage.googleapis.com{upstream}"), &tr);
        let _ = rewrite_url(&format!("https://{}{}", input.host, input.path), &tr);
        if direction == Direction::ToPhysical {
            let _ = rewrite_copy_source(input.path, &tr);
        }
    }
});
