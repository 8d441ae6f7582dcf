//! The JSON response rewriter against serde_json on arbitrary bytes: a body
//! is unreadable (refused, or a 502 for an answer) exactly when serde_json
//! cannot read it as one object, and what it writes instead is always JSON
//! that serde_json reads. The rewriter splits objects with its own scanner
//! (`rewrite::scan`), so this is the scanner checked against the parser it
//! stands in for, on inputs nobody wrote by hand.
#![no_main]

use std::collections::HashMap;

use bucketmap_sidecar_core::mapping::Mapping;
use bucketmap_sidecar_core::policy::Access;
use bucketmap_sidecar_core::rewrite::json::{JsonBody, rewrite_json_body};
use bucketmap_sidecar_core::rewrite::strict::is_no_document;
use bucketmap_sidecar_core::rewrite::{Direction, LinkBase, Translator};
use bucketmap_sidecar_core::route::Resource;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fuzz_target!(|body: &[u8]| {
    let Ok(mapping) = Mapping::new([("photos".to_owned(), "photos-k3x9q2mw".to_owned())]) else {
        return;
    };
    let links = LinkBase {
        scheme: "http".into(),
        authority: "127.0.0.1:9023".into(),
        virtual_host: None,
    };
    let tr = Translator {
        mapping: &mapping,
        direction: Direction::ToLogical,
        allow_physical: false,
        links: &links,
        access: Access::WRITE,
        seen: None,
    };
    let Ok(rewritten) = rewrite_json_body(body, Resource::Generic, &tr) else {
        return;
    };
    // Empty and `null` bodies are no document: nothing to read.
    if is_no_document(body) {
        assert_eq!(rewritten, JsonBody::Unchanged);
        return;
    }
    let serde_reads = body.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<HashMap<String, &RawValue>>(body).is_ok();
    match &rewritten {
        JsonBody::Unreadable => assert!(!serde_reads, "refused what serde_json reads"),
        JsonBody::Unchanged => assert!(serde_reads, "passed what serde_json refuses"),
        JsonBody::Changed(new) => {
            assert!(serde_reads, "rewrote what serde_json refuses");
            let out = serde_json::from_slice::<HashMap<String, &RawValue>>(new);
            assert!(out.is_ok(), "wrote JSON serde_json cannot read");
        }
    }
});
