//! One policy, two protocols: equivalent HTTP and gRPC requests (the same
//! operation, the same bucket names, credentials present or not, a map
//! loaded or not, fresh or stale, an entry fenced by a move) translated by
//! each front end into the policy's model reach the same decision —
//! forwarded with the same physical names and the same credentials rule,
//! held, or refused with the same HTTP status, GCS reason and gRPC code.

use std::collections::BTreeMap;

use http::{HeaderValue, Method, Request, Version, header};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::grpc::headers::{REQUEST_PARAMS, deadline, routing_buckets};
use crate::grpc::service::{self, find_rpc};
use crate::layers::refuse;
use crate::mapping::Mapping;
use crate::policy::{self, Decision};
use crate::route::route;

/// One operation in both protocols: the HTTP method and path (`{0}`, `{1}`
/// the bucket names, left to right), the gRPC method and its routing keys
/// (one per bucket name, in the same order).
struct Operation {
    method: Method,
    path: &'static str,
    grpc: &'static str,
    keys: &'static [&'static str],
}

const OPERATIONS: [Operation; 5] = [
    Operation {
        method: Method::GET,
        path: "/storage/v1/b/{0}/o/a.txt",
        grpc: "/google.storage.v2.Storage/GetObject",
        keys: &["bucket"],
    },
    Operation {
        method: Method::DELETE,
        path: "/storage/v1/b/{0}/o/a.txt",
        grpc: "/google.storage.v2.Storage/DeleteObject",
        keys: &["bucket"],
    },
    Operation {
        method: Method::GET,
        path: "/storage/v1/b/{0}",
        grpc: "/google.storage.v2.Storage/GetBucket",
        keys: &["bucket"],
    },
    Operation {
        method: Method::POST,
        path: "/storage/v1/b/{0}/o/a.txt/rewriteTo/b/{1}/o/b.txt",
        grpc: "/google.storage.v2.Storage/RewriteObject",
        keys: &["source_bucket", "bucket"],
    },
    // Neither protocol knows it: refused, whatever the names.
    Operation {
        method: Method::GET,
        path: "/storage/v9/b/{0}/nothing",
        grpc: "/google.storage.v2.Storage/NoSuchMethod",
        keys: &["bucket"],
    },
];

/// A map past its bound.
const STALE: policy::Staleness = policy::Staleness {
    age: std::time::Duration::from_secs(90),
    bound: std::time::Duration::from_secs(60),
    confirmed_once: true,
};

/// Logical, physical, and unknown names; `logs` is fenced by a move.
const NAMES: [&str; 5] = [
    "photos",
    "photos-k3x9q2mw",
    "music",
    "logs",
    "logs-aaaa1111",
];

/// Whether a name names the entry a move has fenced.
fn fenced(name: &str) -> bool {
    name.starts_with("logs")
}

/// One generated pair of equivalent requests and the sidecar's state.
#[derive(Clone, Debug)]
struct Case {
    operation: usize,
    names: [usize; 2],
    credentials: bool,
    mapped: bool,
    allow_physical: bool,
    adc: bool,
    /// A refusal of each protocol's own framing: a signed URL over HTTP,
    /// a call over HTTP/1.1 for gRPC.
    framed: bool,
    /// The map is older than its bound: writes are refused.
    stale: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        0..OPERATIONS.len(),
        [0..NAMES.len(), 0..NAMES.len()],
        any::<bool>(),
        prop::bool::weighted(0.8),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(operation, names, credentials, mapped, allow_physical, adc, framed, stale)| Case {
                operation,
                names,
                credentials,
                mapped,
                allow_physical,
                adc,
                framed,
                stale,
            },
        )
}

/// What a client sees of a decision, whichever protocol it speaks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Forward {
        physical: Vec<String>,
        add_credentials: bool,
    },
    Hold {
        bucket: String,
    },
    Refuse {
        http: u16,
        reason: &'static str,
        grpc: &'static str,
        /// A refusal for the map's age (the same status as a map not yet loaded).
        stale: bool,
    },
}

fn seen(decision: Decision<'_>) -> Seen {
    match decision {
        Decision::Forward {
            physical,
            add_credentials,
            ..
        } => Seen::Forward {
            physical: physical.iter().map(|s| (*s).to_owned()).collect(),
            add_credentials,
        },
        Decision::Hold { bucket, .. } => Seen::Hold {
            bucket: bucket.to_owned(),
        },
        Decision::Refuse(refusal) => Seen::Refuse {
            http: refusal.status.as_u16(),
            stale: refusal.kind == policy::Kind::StaleMap,
            reason: refusal.reason,
            grpc: refusal.grpc_code().name(),
        },
    }
}

/// The outcome a case is counted under.
fn label(seen: &Seen) -> String {
    match seen {
        Seen::Forward {
            add_credentials, ..
        } => format!("forward, credentials added: {add_credentials}"),
        Seen::Hold { .. } => "hold".to_owned(),
        Seen::Refuse { grpc, stale, .. } => {
            format!("refuse {grpc}{}", if *stale { " (stale map)" } else { "" })
        }
    }
}

fn with_credentials<B>(mut req: Request<B>, credentials: bool) -> Request<B> {
    if credentials {
        req.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer own"),
        );
    }
    req
}

/// The HTTP front end's decision.
fn http_decision(case: &Case, names: &[&str], cx: &policy::Context<'_>) -> Seen {
    let op = &OPERATIONS[case.operation];
    let mut path = op.path.replace("{0}", names[0]);
    if let Some(second) = names.get(1) {
        path = path.replace("{1}", second);
    }
    if case.framed {
        path.push_str("?X-Goog-Signature=ab");
    }
    let mut req = Request::new(());
    *req.method_mut() = op.method.clone();
    *req.uri_mut() = path.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
    let req = with_credentials(req, case.credentials);
    let routed = route(req.method(), req.uri().path(), req.uri().query(), None);
    seen(policy::decide(
        &refuse::model(&routed, req.method(), req.uri().query(), req.headers()),
        cx,
    ))
}

/// The gRPC front end's decision.
fn grpc_decision(case: &Case, names: &[&str], cx: &policy::Context<'_>) -> Seen {
    let op = &OPERATIONS[case.operation];
    let params: Vec<String> = op
        .keys
        .iter()
        .zip(names)
        .map(|(key, name)| format!("{key}=projects%2F_%2Fbuckets%2F{name}"))
        .collect();
    let mut req = Request::new(());
    *req.method_mut() = Method::POST;
    *req.version_mut() = match case.framed {
        true => Version::HTTP_11,
        false => Version::HTTP_2,
    };
    *req.uri_mut() = op
        .grpc
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", op.grpc));
    let headers = req.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    let params = HeaderValue::try_from(params.join("&")).unwrap_or_else(|e| panic!("{e}"));
    headers.insert(REQUEST_PARAMS, params);
    let req = with_credentials(req, case.credentials);
    let (deadline, routing) = (deadline(req.headers()), routing_buckets(req.headers()));
    let rpc = find_rpc(req.uri().path());
    seen(policy::decide(
        &service::model(&req, rpc, &deadline, &routing),
        cx,
    ))
}

/// The rules of a map's age and of a move's fence, whichever the protocol:
/// no write with a stale map is forwarded, nor any request naming a fenced
/// entry but a read with a fresh map; only writes naming one are held.
fn safe(case: &Case, seen: &Seen, names: &[&str]) -> Result<(), TestCaseError> {
    let writes = OPERATIONS[case.operation].method != Method::GET;
    let forwarded = matches!(seen, Seen::Forward { .. });
    if case.stale && writes {
        prop_assert!(
            !forwarded,
            "a write with a stale map was forwarded: {:?}",
            case
        );
    }
    let names_fence = names.iter().any(|name| fenced(name));
    if names_fence && (writes || case.stale) {
        prop_assert!(
            !forwarded,
            "a write, or a request with a stale map, naming a fenced entry was forwarded: {:?}",
            case
        );
    }
    if matches!(seen, Seen::Hold { .. }) {
        prop_assert!(names_fence && writes && !case.stale, "held: {:?}", case);
    }
    Ok(())
}

/// Equivalent HTTP and gRPC requests reach the same decision; every kind
/// of outcome is reached (a policy or a front end that refused everything
/// would otherwise pass).
#[test]
fn equivalent_http_and_grpc_requests_reach_the_same_decision() {
    let mapping = Mapping::new([
        ("photos".to_owned(), "photos-k3x9q2mw".to_owned()),
        ("logs".to_owned(), "logs-aaaa1111;fenced".to_owned()),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let outcomes = std::sync::Mutex::new(BTreeMap::<String, u32>::new());
    let config = Config {
        test_name: Some("equivalent_http_and_grpc_requests_reach_the_same_decision"),
        source_file: Some(file!()),
        ..Config::with_cases(2048)
    };
    let run = TestRunner::new(config).run(&cases(), |case| {
        let cx = policy::Context {
            mapping: case.mapped.then_some(&mapping),
            allow_physical: case.allow_physical,
            adc: case.adc,
            stale: case.stale.then_some(STALE),
        };
        let names = case.names.map(|i| NAMES[i]);
        let count = OPERATIONS[case.operation].keys.len();
        let http = http_decision(&case, &names[..count], &cx);
        let grpc = grpc_decision(&case, &names[..count], &cx);
        prop_assert_eq!(&http, &grpc, "{:?}", case);
        let label = label(&http);
        safe(&case, &http, &names[..count])?;
        if let Ok(mut outcomes) = outcomes.lock() {
            *outcomes.entry(label).or_default() += 1;
        }
        Ok(())
    });
    if let Err(e) = run {
        panic!("{e}");
    }
    let outcomes = outcomes.into_inner().unwrap_or_default();
    let want = [
        "forward, credentials added: false",
        "forward, credentials added: true",
        "hold",
        "refuse INVALID_ARGUMENT",
        "refuse NOT_FOUND",
        "refuse PERMISSION_DENIED",
        "refuse UNAVAILABLE",
        "refuse UNAVAILABLE (stale map)",
        "refuse UNIMPLEMENTED",
    ];
    for label in want {
        // Each outcome in at least 2% of the cases: compared, not skipped.
        let n = outcomes.get(label).copied().unwrap_or_default();
        assert!(n >= 2048 / 50, "{label}: {n} of 2048 cases ({outcomes:?})");
    }
    assert_eq!(outcomes.len(), want.len(), "{outcomes:?}");
    assert_eq!(outcomes.values().sum::<u32>(), 2048);
}
