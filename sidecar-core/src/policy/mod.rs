//! The sidecar's request policy, once for both protocols. Each front end
//! (the HTTP stack's refuse layer, the gRPC service) translates what it
//! received into a protocol-neutral [`Request`] — the operation, the bucket
//! names, whether the client's own credentials reach the upstream, and any
//! refusal its own framing already found — and [`decide`] answers with a
//! [`Decision`]: forward (with the physical names and whether credentials
//! are added) or refuse with a [`Refusal`], which each front end renders in
//! its protocol (an HTTP JSON/XML error, a gRPC status) from one table
//! ([`refusal::TABLE`]).
//!
//! The order of the checks is the order both front ends answered in before
//! there was one policy: the operation, the framing, the map, the names
//! (left to right), a move's fence and the map's age, the credentials.
//!
//! A request that names an entry a move has fenced, by any of its names,
//! goes by [`crate::relocation::route`]: with a fresh map its reads are
//! forwarded and its writes held — the shell keeps the request, without
//! reading its body further, until the map changes, then decides again
//! (the entry may be open on another bucket by then), and answers
//! [`Kind::Moving`] once its hold limit passes; with a stale map it is
//! refused, read or write. Names in bodies and messages go by the same
//! rule in the rewriters ([`bucket_in_body`]): a write naming a fenced
//! entry there is refused with [`Kind::Moving`], which the shell holds
//! like [`Decision::Hold`] while it still has the whole request.
//!
//! | check | refusal | HTTP | gRPC |
//! |---|---|---|---|
//! | operation unknown | [`Kind::UnsupportedOperation`] | 400 `invalid` | `UNIMPLEMENTED` |
//! | framing (signed URL; gRPC not over HTTP/2, bad `grpc-timeout` or routing header) | [`Kind::SignedRequest`], [`Kind::BadRequest`] | 400 `invalid` | `INVALID_ARGUMENT` |
//! | no map loaded | [`Kind::NotReady`] | 503 `backendNotReady` | `UNAVAILABLE` |
//! | a name the map does not know | [`Kind::UnknownBucket`] | 404 `notFound` | `NOT_FOUND` |
//! | a physical name, not allowed | [`Kind::PhysicalName`] | 403 `forbidden` | `PERMISSION_DENIED` |
//! | a name of an entry a move has fenced ([`crate::relocation`]): reads forwarded, writes held ([`Decision::Hold`]) | when the shell's hold limit passes, [`Kind::Moving`] | 503 `backendNotReady` | `UNAVAILABLE` |
//! | a name of a fenced entry while the map is stale: reads and writes | [`Kind::StaleMap`] | 503 `backendNotReady` | `UNAVAILABLE` |
//! | a write while the map is stale ([`Staleness`]) | [`Kind::StaleMap`] | 503 `backendNotReady` | `UNAVAILABLE` |
//! | no own credentials, ADC configured | forward, credentials added ([`adds_credentials`]) | | |
//! | the credentials cannot be obtained (the shell's I/O) | [`Kind::CredentialsUnavailable`] | 503 `backendError` | `UNAVAILABLE` |

pub mod refusal;

#[cfg(test)]
mod tests;

use smallvec::SmallVec;

use crate::mapping::Mapping;
use crate::relocation::{self, Entry, Route};
pub use refusal::{ErrorStyle, Kind, Refusal};

/// The bucket names of one request, on the stack while few.
pub type Names<'a> = SmallVec<[&'a str; 2]>;

/// A request as the policy sees it, whichever protocol it came in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The operation the request names (`objects.get`,
    /// `google.storage.v2.Storage/GetObject`), or the refusal of a request
    /// that names none the sidecar knows.
    pub operation: Result<&'static str, Refusal>,
    /// A refusal the front end found in its protocol's framing: a signed
    /// URL, a gRPC call not over HTTP/2, a bad `grpc-timeout` or routing
    /// header.
    pub framing: Option<Refusal>,
    /// The bucket names the request addresses before its body (path and
    /// `Host`; the gRPC routing header), left to right. Names in bodies and
    /// messages are checked by the rewriters with the same rule
    /// ([`bucket`]).
    pub buckets: Names<'a>,
    /// Whether the client's own `Authorization` reaches the upstream.
    pub credentials: bool,
    /// Whether the request may change data or metadata in GCS (anything
    /// but a read: see [`is_read_method`] and [`is_read_rpc`]).
    pub writes: bool,
}

/// How long ago the sidecar last confirmed its map with the API server,
/// once that is longer than the bound (`--max-map-age`): writes are then
/// refused and reads still served (docs/ARCHITECTURE.md, "How fresh a
/// sidecar's map is").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staleness {
    /// Since the last confirmation, or since start when there was none.
    pub age: std::time::Duration,
    /// The bound.
    pub bound: std::time::Duration,
    /// Whether the map was ever confirmed by the API server.
    pub confirmed_once: bool,
}

/// What a move's fence needs to know of a request besides its names:
/// whether it writes, and whether the map is past its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The request may change data or metadata ([`Request::writes`]).
    pub writes: bool,
    /// Set when the map is older than the bound.
    pub stale: Option<Staleness>,
}

impl Access {
    /// A write with a fresh map: how a name is checked when nothing else is
    /// known (a fenced entry's writes are held, so in doubt nothing goes).
    pub const WRITE: Access = Access {
        writes: true,
        stale: None,
    };
}

/// What the policy decides with: the sidecar's state and settings.
#[derive(Clone, Copy, Debug)]
pub struct Context<'m> {
    /// The map in force, if one has been loaded.
    pub mapping: Option<&'m Mapping>,
    /// Accept the physical names of mapped buckets.
    pub allow_physical: bool,
    /// Whether the sidecar has credentials of its own to add (ADC).
    pub adc: bool,
    /// Set when the map is older than the bound: writes are refused.
    pub stale: Option<Staleness>,
}

/// What happens to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Forward it, rewritten.
    Forward {
        /// The operation.
        operation: &'static str,
        /// The physical name of each of the request's bucket names, in order.
        physical: Names<'a>,
        /// Whether the sidecar adds its own credentials.
        add_credentials: bool,
    },
    /// Keep it until the map changes, then decide again: a write naming an
    /// entry a move has fenced. Nothing goes upstream meanwhile.
    Hold {
        /// The operation.
        operation: &'static str,
        /// The request's name of the fenced entry (the first, left to right).
        bucket: &'a str,
    },
    /// Answer with this refusal; nothing goes upstream.
    Refuse(Refusal),
}

/// Decides what happens to `request` (see the module's table).
pub fn decide<'a>(request: &Request<'a>, cx: &Context<'a>) -> Decision<'a> {
    match decide_forward(request, cx) {
        Ok(decision) => decision,
        Err(refusal) => Decision::Refuse(refusal),
    }
}

fn decide_forward<'a>(request: &Request<'a>, cx: &Context<'a>) -> Result<Decision<'a>, Refusal> {
    let operation = request.operation.clone()?;
    if let Some(refusal) = &request.framing {
        return Err(refusal.clone());
    }
    let mapping = ready(cx.mapping)?;
    let physical = request
        .buckets
        .iter()
        .map(|name| bucket(mapping, cx.allow_physical, name))
        .collect::<Result<Names<'a>, Refusal>>()?;
    let fenced = request
        .buckets
        .iter()
        .copied()
        .find(|name| mapping.entry(name) == Entry::Fenced);
    let entry = fenced.map_or(Entry::Open, |_| Entry::Fenced);
    match (
        relocation::route(entry, request.writes, cx.stale.is_some()),
        fenced,
        cx.stale,
    ) {
        (Route::Forward, ..) => Ok(Decision::Forward {
            operation,
            physical,
            add_credentials: adds_credentials(request.credentials, cx.adc),
        }),
        (Route::Hold, Some(bucket), _) => Ok(Decision::Hold { operation, bucket }),
        (Route::Refuse, Some(bucket), Some(stale)) => Err(Refusal::fenced_stale(
            bucket,
            stale.age,
            stale.bound,
            stale.confirmed_once,
        )),
        (Route::Refuse, None, Some(stale)) => Err(Refusal::stale_map(
            stale.age,
            stale.bound,
            stale.confirmed_once,
        )),
        // The rule holds only fenced entries and refuses only with a stale
        // map; fail safe if it ever did otherwise.
        (Route::Hold | Route::Refuse, bucket, _) => {
            Err(Refusal::moving(bucket.unwrap_or_default()))
        }
    }
}

/// The map in force, or the refusal of a sidecar that has none yet.
pub fn ready<T>(mapping: Option<T>) -> Result<T, Refusal> {
    mapping.ok_or_else(Refusal::not_ready)
}

/// The physical name a request may use for `name`: the mapped physical name
/// of a logical bucket, or `name` itself if it is a physical name and those
/// are allowed. Anything else is refused. The one rule for every bucket
/// name of a request (path, `Host`, routing header, body, message).
pub fn bucket<'m>(
    mapping: &'m Mapping,
    allow_physical: bool,
    name: &'m str,
) -> Result<&'m str, Refusal> {
    if let Some(physical) = mapping.physical(name) {
        return Ok(physical);
    }
    match mapping.logical(name) {
        Some(_) if allow_physical => Ok(name),
        Some(logical) => Err(Refusal::physical_name_refused(name, logical)),
        None => Err(Refusal::unknown_bucket(name)),
    }
}

/// The physical name a request may use for `name` found in its body or
/// message, as [`bucket`] decides, and the fence of a move on its entry:
/// a write naming a fenced entry is refused with [`Kind::Moving`] (the
/// shell holds the request when it still can, and decides again), and any
/// request naming one while the map is stale with [`Kind::StaleMap`].
pub fn bucket_in_body<'m>(
    mapping: &'m Mapping,
    allow_physical: bool,
    access: Access,
    name: &'m str,
) -> Result<&'m str, Refusal> {
    let physical = bucket(mapping, allow_physical, name)?;
    if mapping.entry(name) == Entry::Open {
        return Ok(physical);
    }
    match (
        relocation::route(Entry::Fenced, access.writes, access.stale.is_some()),
        access.stale,
    ) {
        (Route::Forward, _) => Ok(physical),
        (Route::Refuse, Some(stale)) => Err(Refusal::fenced_stale(
            name,
            stale.age,
            stale.bound,
            stale.confirmed_once,
        )),
        (Route::Hold | Route::Refuse, _) => Err(Refusal::moving(name)),
    }
}

/// Whether a refusal is a write held by a move's fence, which the shell
/// holds and decides again rather than answer at once.
pub fn holds(refusal: &Refusal) -> bool {
    refusal.kind == Kind::Moving
}

/// Whether an HTTP request of this method only reads: `GET` and `HEAD`.
/// Everything else is taken as a write, including the JSON API's batch
/// `POST` whatever its parts are (deny by default: the parts are not read
/// before the decision).
pub fn is_read_method(method: &http::Method) -> bool {
    matches!(*method, http::Method::GET | http::Method::HEAD)
}

/// Whether a gRPC method (`/package.Service/Method`) only reads: the
/// `Get`, `List`, `Read` and `Test` methods and `QueryWriteStatus`.
/// Everything else, unknown methods included, is taken as a write.
pub fn is_read_rpc(path: &str) -> bool {
    let method = path.rsplit('/').next().unwrap_or_default();
    ["Get", "List", "Read", "BidiRead", "TestIamPermissions"]
        .iter()
        .any(|prefix| method.starts_with(prefix))
        || method == "QueryWriteStatus"
}

/// Whether the sidecar adds its own credentials to a request: when the
/// client's own `Authorization` does not reach the upstream and the sidecar
/// has credentials to add.
pub fn adds_credentials(own_credentials: bool, adc: bool) -> bool {
    adc && !own_credentials
}
