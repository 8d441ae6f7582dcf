//! Credentials: the sidecar binary with real Application Default Credentials
//! (google-cloud-auth reading `GOOGLE_APPLICATION_CREDENTIALS`, an
//! `authorized_user` file whose token endpoint is a local server), in front
//! of an upstream that records the `Authorization` header of every request.
//!
//! What the issue asks: a request's own `Authorization` is forwarded;
//! otherwise a bearer token from ADC is added, cached and refreshed ahead of
//! expiry; tokens never appear in logs. The sidecar logs at debug level
//! here (its own lines and its libraries'), so that a leak anywhere shows.

use crate::common;

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use common::http::Request;
use common::procs::Sidecar;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const PHYSICAL: &str = "photos-k3x9q2mw";
const CLIENT_SECRET: &str = "bucketmap-test-client-secret";
const REFRESH_TOKEN: &str = "bucketmap-test-refresh-token";
const TOKEN_PREFIX: &str = "ya29.bucketmap-test-token-";
const APP_TOKEN: &str = "Bearer bucketmap-test-apps-own-token";

/// What the token endpoint answers.
#[derive(Clone, Copy)]
enum TokenAnswer {
    /// A new token valid for this many seconds.
    Valid(u64),
    /// `400 invalid_grant`, as Google's endpoint answers a revoked refresh token.
    Revoked,
}

/// What the local server saw.
#[derive(Default)]
struct Seen {
    /// Bodies of the requests to the token endpoint.
    token_requests: Vec<Value>,
    /// `Authorization` of each request that reached the upstream.
    upstream_auth: Vec<Option<String>>,
}

/// One loopback server playing both the OAuth token endpoint (`POST /token`)
/// and the GCS upstream (everything else: an object resource).
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl Server {
    fn start(answer: TokenAnswer) -> Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = seen.clone();
        std::thread::Builder::new()
            .name("token-and-upstream".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("server runtime");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("server listener");
                    while let Ok((stream, _)) = listener.accept().await {
                        let seen = shared.clone();
                        tokio::spawn(async move {
                            let service = service_fn(move |req| handle(req, seen.clone(), answer));
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                });
            })?;
        Ok(Server { addr, seen })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn token_requests(&self) -> usize {
        self.seen.lock().expect("lock").token_requests.len()
    }

    fn upstream_auth(&self) -> Vec<Option<String>> {
        self.seen.lock().expect("lock").upstream_auth.clone()
    }
}

async fn handle(
    req: hyper::Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
    answer: TokenAnswer,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let json_response = |status: u16, value: Value| {
        let mut response = hyper::Response::new(Full::new(Bytes::from(value.to_string())));
        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    };
    if req.uri().path() == "/token" {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let issued = {
            let mut seen = seen.lock().expect("lock");
            seen.token_requests.push(request);
            seen.token_requests.len()
        };
        return match answer {
            TokenAnswer::Valid(seconds) => json_response(
                200,
                json!({
                    "access_token": format!("{TOKEN_PREFIX}{issued}"),
                    "token_type": "Bearer",
                    "expires_in": seconds,
                }),
            ),
            TokenAnswer::Revoked => json_response(
                400,
                json!({"error": "invalid_grant", "error_description": "Token has been revoked."}),
            ),
        };
    }
    let auth = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    seen.lock().expect("lock").upstream_auth.push(auth);
    json_response(
        200,
        json!({"kind": "storage#object", "bucket": PHYSICAL, "name": "x", "id": format!("{PHYSICAL}/x/1")}),
    )
}

/// An `authorized_user` credentials file (what `gcloud auth
/// application-default login` writes) whose token endpoint is `server`.
fn credentials_file(dir: &Path, server: &Server) -> Result<std::path::PathBuf> {
    let path = dir.join("application_default_credentials.json");
    let file = json!({
        "type": "authorized_user",
        "client_id": "bucketmap-test-client.apps.googleusercontent.com",
        "client_secret": CLIENT_SECRET,
        "refresh_token": REFRESH_TOKEN,
        "token_uri": format!("{}/token", server.url()),
    });
    std::fs::write(&path, file.to_string())?;
    Ok(path)
}

fn start_sidecar(dir: &Path, server: &Server) -> Result<Sidecar> {
    let credentials = credentials_file(dir, server)?;
    Sidecar::start_with_credentials(
        dir,
        &server.url(),
        &["--map".to_owned(), format!("photos={PHYSICAL}")],
        &credentials,
    )
}

fn get_object(sidecar: &Sidecar, authorization: Option<&str>) -> Result<Value> {
    let mut request = Request::get("/storage/v1/b/photos/o/x");
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send(sidecar.addr)?;
    if response.status != 200 {
        bail!("GET through the sidecar: {}", response.summary());
    }
    response.json()
}

/// Fails if any secret shows in the sidecar's log.
fn assert_no_secrets_in_log(sidecar: &Sidecar) -> Result<()> {
    let log = std::fs::read_to_string(&sidecar.proc.log)
        .with_context(|| format!("cannot read {}", sidecar.proc.log.display()))?;
    for secret in [TOKEN_PREFIX, APP_TOKEN, CLIENT_SECRET, REFRESH_TOKEN] {
        if log.contains(secret) {
            bail!("the sidecar's log shows {secret:?}:\n{log}");
        }
    }
    Ok(())
}

#[test]
fn adc_tokens_are_added_cached_kept_out_of_logs_and_an_apps_own_authorization_wins() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(TokenAnswer::Valid(3600))?;
    let sidecar = start_sidecar(dir.path(), &server)?;

    for _ in 0..3 {
        let object = get_object(&sidecar, None)?;
        assert_eq!(
            object["bucket"], "photos",
            "the answer names the logical bucket"
        );
    }
    let token = format!("Bearer {TOKEN_PREFIX}1");
    assert_eq!(
        server.upstream_auth(),
        vec![Some(token.clone()); 3],
        "each request without Authorization carries the ADC token"
    );
    assert_eq!(server.token_requests(), 1, "the token is cached");
    let request = server.seen.lock().expect("lock").token_requests[0].clone();
    assert_eq!(request["grant_type"], "refresh_token");
    assert_eq!(request["refresh_token"], REFRESH_TOKEN);
    assert!(
        request["scope"]
            .as_str()
            .is_some_and(|s| s.contains("https://www.googleapis.com/auth/devstorage.full_control")),
        "the token is asked for the GCS scope: {request}"
    );

    get_object(&sidecar, Some(APP_TOKEN))?;
    assert_eq!(
        server.upstream_auth().last().cloned().flatten().as_deref(),
        Some(APP_TOKEN),
        "a request's own Authorization is forwarded as it is"
    );
    assert_eq!(server.token_requests(), 1, "no token is fetched for it");

    assert_no_secrets_in_log(&sidecar)
}

#[test]
fn a_token_is_refreshed_ahead_of_its_expiry() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // google-cloud-auth refreshes 240 s before expiry: a token valid for
    // 242 s is replaced about 2 s after it was issued, while still valid.
    let server = Server::start(TokenAnswer::Valid(242))?;
    let sidecar = start_sidecar(dir.path(), &server)?;

    get_object(&sidecar, None)?;
    let first = server.upstream_auth()[0].clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let issued_before = server.token_requests();
    while server.token_requests() == issued_before {
        if Instant::now() > deadline {
            bail!("no token refresh within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    get_object(&sidecar, None)?;
    let later = server.upstream_auth().last().cloned().flatten();
    assert!(
        later.as_deref().is_some_and(|t| t.starts_with("Bearer ")) && later != first,
        "a later request carries the refreshed token: {first:?} then {later:?}"
    );
    assert_no_secrets_in_log(&sidecar)
}

#[test]
fn without_credentials_a_request_gets_a_clear_503_and_reaches_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(TokenAnswer::Revoked)?;
    let sidecar = start_sidecar(dir.path(), &server)?;

    let response = Request::get("/storage/v1/b/photos/o/x").send(sidecar.addr)?;
    assert_eq!(response.status, 503, "{}", response.summary());
    let body = response.json()?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot obtain Application Default Credentials"),
        "the error says why: {body}"
    );
    assert!(server.upstream_auth().is_empty(), "nothing was forwarded");
    assert_no_secrets_in_log(&sidecar)
}
