//! Metadata body rewriters on arbitrary bytes: JSON, XML, batch requests and
//! responses, multipart boundaries. None may panic.
#![no_main]

use bucketmap_sidecar_core::batch;
use bucketmap_sidecar_core::mapping::Mapping;
use bucketmap_sidecar_core::multipart;
use bucketmap_sidecar_core::policy::Access;
use bucketmap_sidecar_core::rewrite::json::rewrite_json_bytes;
use bucketmap_sidecar_core::rewrite::xml::rewrite_xml;
use bucketmap_sidecar_core::rewrite::{Direction, LinkBase, Translator};
use bucketmap_sidecar_core::route::Resource;
use libfuzzer_sys::fuzz_target;

const HINTS: [Resource; 6] = [
    Resource::Bucket,
    Resource::Buckets,
    Resource::Object,
    Resource::Objects,
    Resource::Policy,
    Resource::Generic,
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let Ok(mapping) = Mapping::new([
        ("photos".to_owned(), "photos-k3x9q2mw".to_owned()),
        // A move fences `logs`: its writes are held.
        ("logs".to_owned(), "logs-aaaa1111;fenced".to_owned()),
    ]) else {
        return;
    };
    let links = LinkBase {
        scheme: "http".into(),
        authority: "127.0.0.1:9023".into(),
        virtual_host: None,
    };
    let direction = if selector & 1 == 0 {
        Direction::ToLogical
    } else {
        Direction::ToPhysical
    };
    let tr = Translator {
        mapping: &mapping,
        direction,
        allow_physical: selector & 2 != 0,
        links: &links,
        access: Access::WRITE,
        seen: None,
    };
    let hint = HINTS[usize::from(selector >> 2) % HINTS.len()];
    let _ = rewrite_json_bytes(body, hint, &tr);
    let _ = rewrite_xml(body, &tr);
    let _ = multipart::split(body, "b");
    if let Ok(plan) = batch::prepare(body, "multipart/mixed; boundary=b", &tr) {
        let _ = batch::translate_response(body, "multipart/mixed; boundary=b", &plan, &tr);
        let _ = batch::local_response(&plan);
    }
});
