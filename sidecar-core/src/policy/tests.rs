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
    }
}

fn kind(decision: &Decision<'_>) -> Option<Kind> {
    match decision {
        Decision::Refuse(refusal) => Some(refusal.kind),
        Decision::Forward { .. } => None,
    }
}

#[test]
fn each_check_refuses_in_its_order() {
    let m = mapping();
    let cx = Context {
        mapping: Some(&m),
        allow_physical: false,
        adc: true,
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
