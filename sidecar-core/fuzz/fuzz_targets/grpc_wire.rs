//! The gRPC wire walker on arbitrary bytes, for every message type of the
//! table, in both directions, and the status-details rewriter. None may panic.
#![no_main]

use bucketmap_sidecar_core::grpc::schema::MESSAGES;
use bucketmap_sidecar_core::grpc::wire::{rewrite_message, rewrite_status_details};
use bucketmap_sidecar_core::mapping::Mapping;
use bucketmap_sidecar_core::policy::Access;
use bucketmap_sidecar_core::rewrite::{Direction, LinkBase, Translator};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

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
    let message = usize::from(selector >> 1) % MESSAGES.len();
    let body = Bytes::copy_from_slice(body);
    for direction in [Direction::ToPhysical, Direction::ToLogical] {
        let tr = Translator {
            mapping: &mapping,
            direction,
            allow_physical: selector & 1 != 0,
            links: &links,
            access: Access::WRITE,
            seen: None,
        };
        if let Ok(Some(out)) = rewrite_message(&body, message, &tr) {
            // A rewritten message is well formed: walking it again cannot panic.
            let _ = rewrite_message(&out, message, &tr);
        }
    }
    let _ = rewrite_status_details(&body, &mapping);
});
