//! Refusal of requests the sidecar cannot rewrite, before anything is read
//! or forwarded (gRPC calls never get here: [`crate::grpc::layer`] takes
//! them first): a bad `X-HTTP-Method-Override`, shapes the
//! router does not know (deny by default), signed URLs and HMAC signatures
//! (their signature covers the bucket name), and bucket names the map in
//! force cannot translate (no map loaded yet, an unknown name, a refused
//! physical name). What passes is routed once and handed on as a [`Routed`]
//! request.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{Method, Request};
use tower::{Layer, Service, ServiceExt as _};

use super::{Answer, BoxFuture, Either, rejection};
use crate::errors::{ApiError, ErrorStyle};
use crate::hold::{Ended, Holds};
use crate::hop_by_hop::forwards_authorization;
use crate::host::virtual_host;
use crate::mapping::{Mapping, MappingStore};
use crate::metrics::Metrics;
use crate::policy::{self, Decision};
use crate::route::{Route, RouteError, route};
use crate::signing::signature_kind;

/// A request the sidecar can rewrite, with what routing found.
#[derive(Debug)]
pub struct Routed<B> {
    /// The client's request, untouched.
    pub request: Request<B>,
    /// What routing found: operation, bucket slots, body kinds.
    pub route: Route,
    /// The method routed and forwarded (`X-HTTP-Method-Override` applied).
    pub method: Method,
    /// The map the request is translated with, from start to end.
    pub mapping: Arc<Mapping>,
    /// The `Host` (or the listen address): links in responses may use it.
    pub host: String,
    /// The raw path with physical bucket names (virtual-hosted requests
    /// made path style), and the raw query.
    pub upstream_path: PathAndQuery,
    /// Headers to add upstream when the request's own `Authorization` does
    /// not reach it (set by [`super::credentials`]).
    pub credentials: Option<HeaderMap>,
    /// Whether the request writes and the map was stale when it was
    /// decided: names in its body meet a move's fence with it.
    pub access: policy::Access,
}

impl<B> Routed<B> {
    /// The same request with its body made by `f`.
    pub fn map_body<C>(self, f: impl FnOnce(B) -> C) -> Routed<C> {
        Routed {
            request: self.request.map(f),
            route: self.route,
            method: self.method,
            mapping: self.mapping,
            host: self.host,
            upstream_path: self.upstream_path,
            credentials: self.credentials,
            access: self.access,
        }
    }
}

/// Refuses what cannot be rewritten; routes the rest. A write a move's
/// fence holds ([`Decision::Hold`]) is kept, its body unread, and decided
/// again when the map changes ([`crate::hold`]).
#[derive(Clone, Debug)]
pub struct RefuseLayer {
    mapping: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    /// The address the listener was configured with: the host of a request
    /// without `Host`.
    listen: SocketAddr,
    allow_physical_names: bool,
    holds: Holds,
}

/// Why a request does not go on at once.
pub(crate) enum Stop<B> {
    /// Answered with this refusal.
    Refused(Refusal),
    /// Held by a move's fence (boxed: holds are rare, refusals are not).
    Held(Box<Held<B>>),
}

impl<B> From<Refusal> for Stop<B> {
    fn from(refusal: Refusal) -> Self {
        Stop::Refused(refusal)
    }
}

/// A request held by a move's fence: decided again when the map changes.
pub(crate) struct Held<B> {
    /// The request, its body unread (or read whole, held by a name in it).
    pub(crate) request: Request<B>,
    /// The map it was held with.
    pub(crate) mapping: Option<Arc<Mapping>>,
    /// The answer when the hold limit passes.
    pub(crate) refusal: Refusal,
}

impl RefuseLayer {
    /// `listen` stands for the host of requests without `Host`; with
    /// `allow_physical_names`, the physical names of mapped buckets are
    /// accepted too; a held write is answered when `hold_limit` passes.
    pub fn new(
        mapping: Arc<MappingStore>,
        metrics: Arc<Metrics>,
        listen: SocketAddr,
        allow_physical_names: bool,
        hold_limit: std::time::Duration,
    ) -> Self {
        Self {
            holds: Holds::new(mapping.clone(), hold_limit, metrics.clone()),
            mapping,
            metrics,
            listen,
            allow_physical_names,
        }
    }

    /// The holds of this front end.
    pub(crate) fn holds(&self) -> &Holds {
        &self.holds
    }

    /// The routed request, or why it does not go on (a refusal counted in
    /// `refused_requests` when the router refused it, or a hold). The
    /// decision is the policy's ([`policy::decide`]); this front end
    /// translates the request into the policy's model ([`model`]) and
    /// renders the refusal.
    pub(crate) fn check<B>(&self, req: Request<B>) -> Result<Routed<B>, Stop<B>> {
        let mapping = self.mapping.current();
        let (host, bucket) = virtual_host(&req, mapping.as_deref(), self.listen);
        let (path, query) = (req.uri().path(), req.uri().query());
        let method = effective_method(req.method(), req.headers()).map_err(|error| {
            self.metrics.refused("method_override");
            Refusal::new(error, guess_style(path), "unrouted")
        })?;
        let routed = route(&method, path, query, bucket.as_deref());
        if let Err(e) = &routed {
            self.metrics.refused(e.reason());
        }
        let cx = policy::Context {
            mapping: mapping.as_deref(),
            allow_physical: self.allow_physical_names,
            // Credentials are the next layer's ([`super::credentials`]).
            adc: false,
            stale: self.mapping.staleness(),
        };
        let access = policy::Access {
            writes: !policy::is_read_method(&method),
            stale: cx.stale,
        };
        let (style, operation) = match &routed {
            Ok(routed) => (routed.api.error_style(), routed.operation),
            Err(_) => (guess_style(path), "unrouted"),
        };
        let refuse = |error| Refusal::new(error, style, operation);
        let decision = policy::decide(&model(&routed, &method, query, req.headers()), &cx);
        let upstream_path = match (&routed, decision) {
            (Ok(routed), Decision::Forward { physical, .. }) => {
                physical_path(routed, &physical, path, query).map_err(refuse)?
            }
            (_, Decision::Refuse(error)) => return Err(refuse(error).into()),
            (_, Decision::Hold { bucket, .. }) => {
                let refusal = refuse(ApiError::moving(bucket));
                return Err(Stop::Held(Box::new(Held {
                    request: req,
                    mapping: mapping.clone(),
                    refusal,
                })));
            }
            // The policy forwards routed requests only.
            (Err(e), Decision::Forward { .. }) => {
                return Err(refuse(ApiError::refused_request(e)).into());
            }
        };
        // The policy forwards only with a map.
        let (Ok(routed), Some(mapping)) = (routed, mapping) else {
            return Err(refuse(ApiError::not_ready()).into());
        };
        Ok(Routed {
            request: req,
            route: routed,
            method,
            mapping,
            host,
            upstream_path,
            credentials: None,
            access,
        })
    }

    /// Holds `held` until the map changes, and decides again, until it goes
    /// on (to `inner`), is refused, or the hold limit passes.
    async fn hold<S, B>(&self, mut held: Box<Held<B>>, inner: S) -> Answer
    where
        S: Service<Routed<B>, Response = Answer, Error = Infallible>,
    {
        let hold = self.holds.start();
        loop {
            if !self.holds.wait(&hold, held.mapping.as_ref()).await {
                self.holds.ended(Ended::TimedOut);
                return held.refusal.answer();
            }
            match self.check(held.request) {
                Ok(routed) => {
                    self.holds.ended(Ended::Forwarded);
                    let Ok(answer) = inner.oneshot(routed).await;
                    return answer;
                }
                Err(Stop::Refused(refusal)) => {
                    self.holds.ended(Ended::Refused);
                    return refusal.answer();
                }
                Err(Stop::Held(again)) => held = again,
            }
        }
    }
}

/// The HTTP front end's request as the policy's model: the routed
/// operation (or the router's refusal), a signed URL or HMAC signature as a
/// refusal of the framing, the bucket names of the `Host` and the path, and
/// whether the client's own `Authorization` reaches the upstream.
pub fn model<'a>(
    routed: &'a Result<Route, RouteError>,
    method: &Method,
    query: Option<&str>,
    headers: &HeaderMap,
) -> policy::Request<'a> {
    let credentials = forwards_authorization(headers);
    match routed {
        Err(e) => policy::Request {
            operation: Err(ApiError::refused_request(e)),
            framing: None,
            buckets: policy::Names::new(),
            credentials,
            writes: !policy::is_read_method(method),
        },
        Ok(routed) => policy::Request {
            operation: Ok(routed.operation),
            framing: signature_kind(query, headers).map(ApiError::signed_request),
            buckets: routed.bucket_names().collect(),
            credentials,
            writes: !policy::is_read_method(method),
        },
    }
}

/// Why a request is refused, and how to say it.
pub(crate) struct Refusal {
    error: ApiError,
    style: ErrorStyle,
    operation: &'static str,
}

impl Refusal {
    /// `error`, said in `style`, for a request labelled `operation`.
    pub(crate) fn new(error: ApiError, style: ErrorStyle, operation: &'static str) -> Self {
        Self {
            error,
            style,
            operation,
        }
    }

    /// The answer to the client.
    pub(crate) fn answer(self) -> Answer {
        rejection(self.error, self.style, self.operation)
    }
}

impl<S> Layer<S> for RefuseLayer {
    type Service = Refuse<S>;

    fn layer(&self, inner: S) -> Refuse<S> {
        Refuse {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`RefuseLayer`].
#[derive(Clone, Debug)]
pub struct Refuse<S> {
    inner: S,
    layer: RefuseLayer,
}

impl<S, B> Service<Request<B>> for Refuse<S>
where
    S: Service<Routed<B>, Response = Answer, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Either<
        Ready<Result<Answer, Infallible>>,
        Either<S::Future, BoxFuture<Result<Answer, Infallible>>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.layer.check(req) {
            Ok(routed) => Either::right(Either::left(self.inner.call(routed))),
            Err(Stop::Refused(refusal)) => Either::left(ready(Ok(refusal.answer()))),
            Err(Stop::Held(held)) => {
                let (layer, inner) = (self.layer.clone(), self.inner.clone());
                let held = async move { Ok(layer.hold(held, inner).await) };
                Either::right(Either::right(Box::pin(held)))
            }
        }
    }
}

/// The upstream path: the raw path with each bucket segment replaced by its
/// physical name (`physical`, as the policy decided: the `Host`'s bucket
/// first, then the path's, left to right; virtual-hosted requests become
/// path style), the raw query.
fn physical_path(
    routed: &Route,
    physical: &[&str],
    path: &str,
    query: Option<&str>,
) -> Result<PathAndQuery, ApiError> {
    let mut physical = physical.iter();
    // Room for the path, longer bucket names, and the query.
    let mut out = String::with_capacity(path.len() + 64 + query.map_or(0, |q| q.len() + 1));
    if routed.virtual_host.is_some() {
        // Virtual-hosted style becomes path style: `/{bucket}{path}`, and
        // `/{bucket}` for the bucket itself.
        out.push('/');
        out.push_str(physical.next().copied().unwrap_or_default());
    }
    if routed.virtual_host.is_none() || path != "/" {
        let mut at = 0;
        for slot in &routed.buckets {
            out.push_str(&path[at..slot.range.start]);
            out.push_str(physical.next().copied().unwrap_or_default());
            at = slot.range.end;
        }
        out.push_str(&path[at..]);
    }
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    PathAndQuery::try_from(out)
        .map_err(|e| ApiError::bad_request(format!("cannot build the upstream path: {e}")))
}

/// The header some clients (Google's Java client on `HttpURLConnection`) use
/// to send a PATCH as a POST.
pub const METHOD_OVERRIDE: &str = "x-http-method-override";

/// [`METHOD_OVERRIDE`] as a header name, parsed once (a `&str` name is
/// parsed and hashed on every lookup).
pub static METHOD_OVERRIDE_HEADER: HeaderName = HeaderName::from_static(METHOD_OVERRIDE);

/// The method a request is routed and forwarded as: `X-HTTP-Method-Override`
/// is honoured on a POST (the upstream then gets the real method, without
/// the header); on any other method, or given twice, or naming a method GCS
/// does not serve, it is refused.
fn effective_method(method: &Method, headers: &HeaderMap) -> Result<Method, ApiError> {
    let mut values = headers.get_all(&METHOD_OVERRIDE_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(method.clone());
    };
    let refuse = |why: String| {
        ApiError::bad_request(format!(
            "bucketmap-sidecar refuses X-HTTP-Method-Override here: {why}"
        ))
    };
    if values.next().is_some() {
        return Err(refuse("it is given more than once".to_owned()));
    }
    if *method != Method::POST {
        return Err(refuse(format!(
            "it is honoured on POST only, and this is a {method}"
        )));
    }
    let served = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
    ];
    value
        .to_str()
        .ok()
        .and_then(|v| Method::from_bytes(v.trim().as_bytes()).ok())
        .filter(|m| served.contains(m))
        .ok_or_else(|| refuse(format!("{value:?} is not a method GCS serves")))
}

/// The error format for a request that could not be routed.
fn guess_style(path: &str) -> ErrorStyle {
    let json = [
        "/storage/",
        "/upload/",
        "/download/",
        "/batch/",
        "/resumable/",
    ];
    if json.iter().any(|p| path.starts_with(p)) {
        ErrorStyle::Json
    } else {
        ErrorStyle::Xml
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::HeaderValue;
    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::layers::testing::{body, calls, counting};
    use crate::metrics::ReasonLabels;

    const PHYSICAL: &str = "photos-k3x9q2mw";

    fn layer(mapped: bool) -> (RefuseLayer, Arc<Metrics>) {
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        if mapped {
            let entries = [("photos".to_owned(), PHYSICAL.to_owned())];
            store.set(Mapping::new(entries).unwrap_or_else(|e| panic!("{e}")));
        }
        let metrics = Arc::new(Metrics::new());
        let listen = SocketAddr::from(([127, 0, 0, 1], 9023));
        (
            RefuseLayer::new(
                store,
                metrics.clone(),
                listen,
                false,
                std::time::Duration::from_secs(30),
            ),
            metrics,
        )
    }

    fn request(
        method: Method,
        target: &str,
        headers: &[(&'static str, &'static str)],
    ) -> Request<()> {
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = target.parse().unwrap_or_else(|e| panic!("{target}: {e}"));
        for (name, value) in headers {
            req.headers_mut()
                .append(*name, HeaderValue::from_static(value));
        }
        req
    }

    fn refused(metrics: &Metrics, reason: &'static str) -> u64 {
        metrics
            .refusals
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Sends `req` through the layer around a counting inner service:
    /// the answer, and whether the inner service was called.
    async fn refuse(layer: &RefuseLayer, req: Request<()>) -> (Answer, bool) {
        let (inner_calls, inner) = counting();
        let Ok(answer) = layer.layer(inner).oneshot(req).await;
        (answer, calls(&inner_calls) > 0)
    }

    #[tokio::test]
    #[allow(clippy::too_many_lines)] // a table of cases
    async fn what_cannot_be_rewritten_never_reaches_the_core() {
        let (layer, metrics) = layer(true);
        let get = |target| request(Method::GET, target, &[]);
        let cases = [
            // (request, status, operation, refusal reason counted)
            (
                request(
                    Method::GET,
                    "/storage/v1/b/photos/o",
                    &[("x-http-method-override", "DELETE")],
                ),
                400,
                "unrouted",
                Some("method_override"),
            ),
            (
                get("/storage/v9/nothing"),
                400,
                "unrouted",
                Some("unknown_operation"),
            ),
            (
                get("/storage/v1/b/photos/o/x?X-Goog-Signature=ab"),
                400,
                "objects.get",
                None,
            ),
            (
                request(
                    Method::GET,
                    "/photos/x",
                    &[("authorization", "GOOG1 key:sig")],
                ),
                400,
                "xml.object.get",
                None,
            ),
            (get("/storage/v1/b/nope/o/x"), 404, "objects.get", None),
            (
                get(&format!("/storage/v1/b/{PHYSICAL}/o/x")),
                403,
                "objects.get",
                None,
            ),
        ];
        for (req, status, op, reason) in cases {
            let what = format!("{} {}", req.method(), req.uri());
            let counted = reason.map(|r| refused(&metrics, r));
            let (answer, called) = refuse(&layer, req).await;
            assert!(!called, "{what}: the core was called");
            assert_eq!(answer.response.status().as_u16(), status, "{what}");
            assert_eq!(answer.operation, op, "{what}");
            assert!(answer.rejected.is_some(), "{what}");
            if let (Some(reason), Some(before)) = (reason, counted) {
                assert_eq!(refused(&metrics, reason), before + 1, "{what}: {reason}");
            }
        }
        // Signed requests and unknown names are answered, not counted as
        // refused shapes.
        let total: u64 = ["method_override", "unknown_operation"]
            .iter()
            .map(|r| refused(&metrics, r))
            .sum();
        assert_eq!(total, 2);
    }

    #[tokio::test]
    async fn without_a_map_a_routed_request_is_not_ready() {
        let (layer, _) = layer(false);
        let (answer, called) =
            refuse(&layer, request(Method::GET, "/storage/v1/b/photos/o", &[])).await;
        assert!(!called);
        assert_eq!(answer.response.status(), 503);
        assert_eq!(answer.operation, "objects.list");
        let text = String::from_utf8_lossy(&body(answer.response).await).into_owned();
        assert!(text.contains("backendNotReady"), "{text}");
    }

    /// What the core was handed.
    type Handed = Arc<Mutex<Vec<(Method, String, String, &'static str)>>>;

    async fn hand_on(layer: &RefuseLayer, req: Request<()>) -> Handed {
        let handed = Handed::default();
        let keep = handed.clone();
        let inner = service_fn(move |routed: Routed<()>| {
            if let Ok(mut seen) = keep.lock() {
                seen.push((
                    routed.method.clone(),
                    routed.upstream_path.to_string(),
                    routed.host.clone(),
                    routed.route.operation,
                ));
            }
            let answer = Answer::new(http::Response::new(crate::body::empty()), "inner");
            std::future::ready(Ok::<_, Infallible>(answer))
        });
        let Ok(answer) = layer.layer(inner).oneshot(req).await;
        assert_eq!(answer.operation, "inner");
        handed
    }

    #[tokio::test]
    async fn a_rewritable_request_is_routed_once_and_handed_on() {
        let (layer, _) = layer(true);
        let req = request(
            Method::POST,
            "/storage/v1/b/photos/o/x%2Fy?alt=json",
            &[("x-http-method-override", "PATCH")],
        );
        let handed = hand_on(&layer, req).await;
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(
            seen,
            [(
                Method::PATCH,
                format!("/storage/v1/b/{PHYSICAL}/o/x%2Fy?alt=json"),
                "127.0.0.1:9023".to_owned(),
                "objects.patch",
            )]
        );
        // Virtual-hosted (XML API): the bucket moves into the path.
        let req = request(
            Method::GET,
            "/a/b.txt",
            &[("host", "photos.localhost:9023")],
        );
        let handed = hand_on(&layer, req).await;
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, format!("/{PHYSICAL}/a/b.txt"));
        assert_eq!(seen[0].2, "photos.localhost:9023");
        // The bucket itself, virtual-hosted: `/{bucket}`, the query kept.
        let req = request(
            Method::GET,
            "/?prefix=a%2F",
            &[("host", "photos.localhost:9023")],
        );
        let handed = hand_on(&layer, req).await;
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen[0].1, format!("/{PHYSICAL}?prefix=a%2F"));
        // Every bucket slot of the path is replaced.
        let req = request(
            Method::POST,
            "/storage/v1/b/photos/o/x/rewriteTo/b/photos/o/y",
            &[],
        );
        let handed = hand_on(&layer, req).await;
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(
            seen[0].1,
            format!("/storage/v1/b/{PHYSICAL}/o/x/rewriteTo/b/{PHYSICAL}/o/y")
        );
    }

    fn held_requests(metrics: &Metrics, outcome: &'static str) -> u64 {
        let labels = crate::metrics::HoldLabels { outcome };
        metrics.held_requests.get_or_create(&labels).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_write_goes_to_the_bucket_the_map_opens_or_is_refused_at_the_limit() {
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        let fenced = [("photos".to_owned(), format!("{PHYSICAL};fenced"))];
        store.set(Mapping::new(fenced).unwrap_or_else(|e| panic!("{e}")));
        let metrics = Arc::new(Metrics::new());
        let listen = SocketAddr::from(([127, 0, 0, 1], 9023));
        let limit = std::time::Duration::from_secs(30);
        let layer = RefuseLayer::new(store.clone(), metrics.clone(), listen, false, limit);
        let write = || request(Method::DELETE, "/storage/v1/b/photos/o/x", &[]);
        // A read of the fenced entry goes on at once, to its bucket.
        let handed = hand_on(
            &layer,
            request(Method::GET, "/storage/v1/b/photos/o/x", &[]),
        )
        .await;
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen[0].1, format!("/storage/v1/b/{PHYSICAL}/o/x"));
        // A write waits for the map; the move opens the entry elsewhere.
        let started = tokio::time::Instant::now();
        let moved = [("photos".to_owned(), "photos-n3wn3wn3".to_owned())];
        let moved = Mapping::new(moved).unwrap_or_else(|e| panic!("{e}"));
        let (handed, ()) = tokio::join!(hand_on(&layer, write()), async {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            store.set(moved);
        });
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_secs(5),
            "not held: {waited:?}"
        );
        let seen = handed.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, "/storage/v1/b/photos-n3wn3wn3/o/x");
        assert_eq!(held_requests(&metrics, "forwarded"), 1);
        // Fenced again, and nothing changes: refused 503 at the limit.
        let fenced = [("photos".to_owned(), "photos-n3wn3wn3;fenced".to_owned())];
        store.set(Mapping::new(fenced).unwrap_or_else(|e| panic!("{e}")));
        let started = tokio::time::Instant::now();
        let (answer, called) = refuse(&layer, write()).await;
        assert!(!called, "a held write reached the core");
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
        assert_eq!(answer.response.status(), 503);
        let text = String::from_utf8_lossy(&body(answer.response).await).into_owned();
        assert!(
            text.contains("backendNotReady") && text.contains("move"),
            "{text}"
        );
        assert_eq!(held_requests(&metrics, "timed_out"), 1);
    }
}
