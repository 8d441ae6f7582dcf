use smallvec::smallvec;

use super::*;
use crate::grpc::status::Code;

fn mapping() -> Mapping {
    Mapping::new([("photos".to_owned(), "photos-k3x9q2mw".to_owned())]).unwrap_or_default()
}

fn request<'a>(buckets: &[&'a str], credentials: bool) -> Request<'a> {
    Request {
        operation: Ok("objects.get"),
        framing: None,
        buckets: buckets.iter().copied().collect(),
        credentials,
        writes: false,
    }
}

fn kind(decision: &Decision<'_>) -> Option<Kind> {
    match decision {
        Decision::Refuse(refusal) => Some(refusal.kind),
        Decision::Forward { .. } | Decision::Hold { .. } => None,
    }
}

#[test]
fn each_check_refuses_in_its_order() {
    let m = mapping();
    let cx = Context {
        mapping: Some(&m),
        allow_physical: false,
        adc: true,
        stale: None,
    };
    let none = Context {
        mapping: None,
        ..cx
    };
    let mut unknown = request(&["nope"], false);
    unknown.operation = Err(Refusal::unknown_grpc_method("/x"));
    unknown.framing = Some(Refusal::bad_request("x"));
    let mut framed = request(&["nope"], false);
    framed.framing = Some(Refusal::signed_request("a signed URL"));
    let cases = [
        (&unknown, &none, Some(Kind::UnsupportedOperation)),
        (&framed, &none, Some(Kind::SignedRequest)),
        (&request(&["nope"], false), &none, Some(Kind::NotReady)),
        (
            &request(&["photos", "nope"], false),
            &cx,
            Some(Kind::UnknownBucket),
        ),
        (
            &request(&["photos-k3x9q2mw"], false),
            &cx,
            Some(Kind::PhysicalName),
        ),
        (&request(&["photos"], false), &cx, None),
    ];
    for (req, cx, want) in &cases {
        assert_eq!(kind(&decide(req, cx)), *want, "{req:?}");
    }
    assert_eq!(cases.len(), 6);
}

#[test]
fn a_forwarded_request_has_its_physical_names_and_credentials() {
    let m = mapping();
    let cx = Context {
        mapping: Some(&m),
        allow_physical: true,
        adc: true,
        stale: None,
    };
    let both = request(&["photos", "photos-k3x9q2mw"], false);
    let want: Names<'_> = smallvec!["photos-k3x9q2mw", "photos-k3x9q2mw"];
    assert_eq!(
        decide(&both, &cx),
        Decision::Forward {
            operation: "objects.get",
            physical: want,
            add_credentials: true,
        }
    );
    let own = decide(&request(&[], true), &cx);
    assert!(
        matches!(
            own,
            Decision::Forward {
                add_credentials: false,
                ..
            }
        ),
        "{own:?}"
    );
    let no_adc = Context { adc: false, ..cx };
    let none = decide(&request(&[], false), &no_adc);
    assert!(
        matches!(
            none,
            Decision::Forward {
                add_credentials: false,
                ..
            }
        ),
        "{none:?}"
    );
}

#[test]
fn not_ready_is_unavailable_in_both_protocols() {
    let refusal = ready(None::<&Mapping>)
        .err()
        .unwrap_or_else(|| Refusal::bad_request(""));
    assert_eq!(refusal.status.as_u16(), 503);
    assert_eq!(refusal.reason, "backendNotReady");
    assert_eq!(refusal.grpc_status().code(), Code::Unavailable);
}

#[test]
fn a_stale_map_refuses_writes_and_serves_reads() {
    let m = mapping();
    let stale = Staleness {
        age: std::time::Duration::from_secs(75),
        bound: std::time::Duration::from_secs(60),
        confirmed_once: true,
    };
    let cx = Context {
        mapping: Some(&m),
        allow_physical: false,
        adc: true,
        stale: Some(stale),
    };
    let fresh = Context { stale: None, ..cx };
    let read = request(&["photos"], false);
    let write = Request {
        writes: true,
        ..read.clone()
    };
    assert_eq!(kind(&decide(&read, &cx)), None);
    assert_eq!(kind(&decide(&write, &fresh)), None);
    let Decision::Refuse(refusal) = decide(&write, &cx) else {
        panic!("a write with a stale map was forwarded");
    };
    assert_eq!(refusal.kind, Kind::StaleMap);
    assert_eq!(refusal.status.as_u16(), 503);
    assert_eq!(refusal.grpc_status().code(), Code::Unavailable);
    assert!(
        refusal.message.contains("last confirmed 75s ago"),
        "{refusal}"
    );
    assert!(refusal.message.contains("bound of 60s"), "{refusal}");
    // A name the map does not know is still a 404, stale or not.
    let unknown = Request {
        writes: true,
        ..request(&["nope"], false)
    };
    assert_eq!(kind(&decide(&unknown, &cx)), Some(Kind::UnknownBucket));
    let never = Staleness {
        confirmed_once: false,
        ..stale
    };
    let Decision::Refuse(refusal) = decide(
        &write,
        &Context {
            stale: Some(never),
            ..cx
        },
    ) else {
        panic!("forwarded");
    };
    assert!(
        refusal.message.contains("not been confirmed since"),
        "{refusal}"
    );
}

#[test]
fn only_reads_are_reads() {
    use http::Method;
    for (method, read) in [
        (Method::GET, true),
        (Method::HEAD, true),
        (Method::POST, false),
        (Method::PUT, false),
        (Method::PATCH, false),
        (Method::DELETE, false),
        (Method::OPTIONS, false),
    ] {
        assert_eq!(is_read_method(&method), read, "{method}");
    }
    for (path, read) in [
        ("/google.storage.v2.Storage/ReadObject", true),
        ("/google.storage.v2.Storage/BidiReadObject", true),
        ("/google.storage.v2.Storage/GetObject", true),
        ("/google.storage.v2.Storage/ListObjects", true),
        ("/google.storage.v2.Storage/GetBucket", true),
        ("/google.storage.v2.Storage/TestIamPermissions", true),
        ("/google.storage.v2.Storage/QueryWriteStatus", true),
        ("/google.storage.control.v2.StorageControl/GetFolder", true),
        ("/google.storage.v2.Storage/WriteObject", false),
        ("/google.storage.v2.Storage/BidiWriteObject", false),
        ("/google.storage.v2.Storage/StartResumableWrite", false),
        ("/google.storage.v2.Storage/CancelResumableWrite", false),
        ("/google.storage.v2.Storage/ComposeObject", false),
        ("/google.storage.v2.Storage/RewriteObject", false),
        ("/google.storage.v2.Storage/MoveObject", false),
        ("/google.storage.v2.Storage/RestoreObject", false),
        ("/google.storage.v2.Storage/DeleteObject", false),
        ("/google.storage.v2.Storage/UpdateObject", false),
        ("/google.storage.v2.Storage/SetIamPolicy", false),
        (
            "/google.storage.v2.Storage/LockBucketRetentionPolicy",
            false,
        ),
        (
            "/google.storage.control.v2.StorageControl/CreateFolder",
            false,
        ),
        ("/google.storage.v2.Storage/NoSuchMethod", false),
    ] {
        assert_eq!(is_read_rpc(path), read, "{path}");
    }
}

/// `photos` open, `logs` fenced by a move.
fn fenced_mapping() -> Mapping {
    Mapping::new([
        ("photos".to_owned(), "photos-k3x9q2mw".to_owned()),
        ("logs".to_owned(), "logs-aaaa1111;fenced".to_owned()),
    ])
    .unwrap_or_default()
}

/// What happens to a request, in one word.
fn outcome(decision: &Decision<'_>) -> &'static str {
    match decision {
        Decision::Forward { .. } => "forward",
        Decision::Hold { .. } => "hold",
        Decision::Refuse(r) if r.kind == Kind::StaleMap => "refuse stale",
        Decision::Refuse(_) => "refuse other",
    }
}

#[test]
#[allow(clippy::too_many_lines)] // a table of cases
fn a_fenced_entry_holds_writes_forwards_reads_and_refuses_both_when_stale() {
    let m = fenced_mapping();
    assert!(m.any_fenced(), "the test needs a fenced entry");
    let stale = Staleness {
        age: std::time::Duration::from_secs(75),
        bound: std::time::Duration::from_secs(60),
        confirmed_once: true,
    };
    let fresh = Context {
        mapping: Some(&m),
        allow_physical: true,
        adc: false,
        stale: None,
    };
    let old = Context {
        stale: Some(stale),
        ..fresh
    };
    let at = |names: &[&'static str], writes: bool, cx: &Context<'_>| {
        let mut req = request(names, true);
        req.writes = writes;
        outcome(&decide(&req, cx))
    };
    let (fresh, old) = (&fresh, &old);
    let table: [(&[&'static str], bool, &Context<'_>, &str); 12] = [
        // names, writes, context => outcome (relocation::route's table)
        (&["logs"], false, fresh, "forward"),
        (&["logs"], true, fresh, "hold"),
        (&["logs"], false, old, "refuse stale"),
        (&["logs"], true, old, "refuse stale"),
        // By its physical name too.
        (&["logs-aaaa1111"], true, fresh, "hold"),
        (&["logs-aaaa1111"], false, old, "refuse stale"),
        // Any of the request's names: a copy out of or into a fenced entry.
        (&["photos", "logs"], true, fresh, "hold"),
        (&["logs", "photos"], false, fresh, "forward"),
        // An open entry beside it goes on as before.
        (&["photos"], true, fresh, "forward"),
        (&["photos"], false, old, "forward"),
        (&["photos"], true, old, "refuse stale"),
        // Unknown names are refused first, fenced or not.
        (&["nope", "logs"], true, fresh, "refuse other"),
    ];
    for (names, writes, cx, want) in table {
        assert_eq!(
            at(names, writes, cx),
            want,
            "{names:?} writes={writes} stale={}",
            cx.stale.is_some()
        );
    }
    let mut write = request(&["photos", "logs-aaaa1111"], true);
    write.writes = true;
    assert_eq!(
        decide(&write, fresh),
        Decision::Hold {
            operation: "objects.get",
            bucket: "logs-aaaa1111"
        }
    );
    let mut read = request(&["logs"], true);
    read.writes = false;
    let Decision::Refuse(refusal) = decide(&read, old) else {
        panic!("a stale read of a fenced entry was not refused");
    };
    assert_eq!(refusal.status.as_u16(), 503);
    assert_eq!(refusal.grpc_status().code(), Code::Unavailable);
    assert!(
        refusal.message.contains("a move of the bucket"),
        "{refusal}"
    );
}

#[test]
fn names_in_bodies_meet_the_same_fence() {
    let m = fenced_mapping();
    let stale = Some(Staleness {
        age: std::time::Duration::from_secs(75),
        bound: std::time::Duration::from_secs(60),
        confirmed_once: false,
    });
    let read = Access {
        writes: false,
        stale: None,
    };
    let check = |name, access| bucket_in_body(&m, true, access, name).map_err(|r| r.kind);
    assert_eq!(check("logs", read), Ok("logs-aaaa1111"));
    assert_eq!(check("logs", Access::WRITE), Err(Kind::Moving));
    assert_eq!(check("logs-aaaa1111", Access::WRITE), Err(Kind::Moving));
    assert_eq!(check("logs", Access { stale, ..read }), Err(Kind::StaleMap));
    assert_eq!(check("photos", Access::WRITE), Ok("photos-k3x9q2mw"));
    assert_eq!(
        check("photos", Access { stale, ..read }),
        Ok("photos-k3x9q2mw")
    );
    assert_eq!(check("nope", Access::WRITE), Err(Kind::UnknownBucket));
    let held = bucket_in_body(&m, true, Access::WRITE, "logs")
        .err()
        .unwrap_or_else(Refusal::not_ready);
    assert!(holds(&held), "{held}");
    assert_eq!(held.status.as_u16(), 503);
    assert_eq!(held.grpc_status().code(), Code::Unavailable);
    assert!(!holds(&Refusal::not_ready()));
}
