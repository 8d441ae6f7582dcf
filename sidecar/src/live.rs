//! Follows the namespace's bucket map ConfigMap through the Kubernetes API
//! server (`--map-configmap`), so a changed map reaches the sidecar within
//! the API server's watch latency instead of at the kubelet's next volume
//! sync, and so the sidecar knows how fresh its map is.
//!
//! One object, one namespace, the pod's own ServiceAccount token (a
//! projected, audience-bound token the kubelet rotates: re-read from its
//! file for every request). The loop:
//!
//! 1. A consistent LIST of that one ConfigMap (`fieldSelector`
//!    `metadata.name`, no `resourceVersion`: the API server answers with
//!    the state as of the moment it handles the request). Its map is
//!    applied, and the sidecar counts its map as confirmed *as of the
//!    moment the request was sent* ([`MappingStore::confirm`]): any change
//!    written before then is in it.
//! 2. A WATCH from the list's `resourceVersion`, with bookmarks, ended by
//!    the API server after the relist period; every event is applied at
//!    once. Then 1 again. A watch event proves nothing about wall-clock
//!    time (the API server's watch cache may lag), so only the lists
//!    confirm: a sidecar cut off from the API server stops confirming, and
//!    once its map is older than `--max-map-age` it refuses writes
//!    ([`MappingStore::staleness`]; the rule is docs/ARCHITECTURE.md's).
//!
//! Failures (no route, a refused token, a 403 before the namespace's
//! RoleBinding exists) are logged once per kind and retried with backoff up
//! to the relist period; the mounted volume stays in force until the first
//! list succeeds. A map that fails to validate is never applied (the last
//! good one stays), as for the volume, and a list that brought one
//! confirms nothing: a sidecar that cannot read the map the operator
//! published (a newer format) goes stale within the bound and stops
//! writing, rather than go on writing with an entry the map has left.
//!
//! Hand-written over `kube`'s runtime: the sidecar watches one object, and
//! `kube`'s client and reflector (with their dependencies) would grow the
//! idle sidecar's memory, which docs/BENCHMARKS.md holds at its floor.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::{Buf as _, Bytes, BytesMut};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use tokio::sync::watch;

use crate::mapping::MappingStore;
use crate::metrics::Metrics;

/// Where and what to follow.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// The API server's base URL (`https://host:port`).
    pub api: Uri,
    /// The ConfigMap's namespace (the pod's).
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The ServiceAccount token, re-read for every request.
    pub token_file: PathBuf,
    /// The cluster's CA certificates (PEM).
    pub ca_file: PathBuf,
    /// How long each watch lasts before a consistent list confirms the map again.
    pub relist: Duration,
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// One HTTP/1.1 connection to the API server, opened when needed and kept:
/// each list and the watch after it go over it one after the other, so a
/// follower holds one connection in the API server, not a pool's.
struct Connection {
    connector: Connector,
    api: Uri,
    sender: Option<SendRequest<Empty<Bytes>>>,
}

impl Connection {
    /// Sends `request` on the kept connection, opening one if there is none
    /// or it closed; a failed send drops it.
    async fn send(
        &mut self,
        request: Request<Empty<Bytes>>,
    ) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        if let Some(sender) = &mut self.sender
            && sender.ready().await.is_err()
        {
            self.sender = None;
        }
        let mut sender = match self.sender.take() {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let response = sender
            .send_request(request)
            .await
            .with_context(|| format!("the request to the API server at {} failed", self.api))?;
        self.sender = Some(sender);
        Ok(response)
    }

    /// TCP, TLS, the HTTP/1.1 handshake; the connection's task runs on the
    /// runtime until the connection closes.
    async fn connect(&mut self) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
        let stream = tower::ServiceExt::oneshot(self.connector.clone(), self.api.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the API server at {}: {e}", self.api))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(stream)
            .await
            .context("the HTTP handshake with the API server failed")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// Drops the connection: a response was abandoned half-read.
    fn reset(&mut self) {
        self.sender = None;
    }
}

/// The ConfigMap as the sidecar reads it.
#[derive(Debug, Deserialize)]
struct ConfigMap {
    #[serde(default)]
    data: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Debug, Deserialize)]
struct List {
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<ConfigMap>,
}

/// One line of a watch: the event's type and its object (a ConfigMap, a
/// bookmark's bare metadata, or an ERROR's Status), kept raw until the
/// type says which.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// Why a watch ended.
enum WatchEnd {
    /// The API server ended it (its timeout) or it was shut down: relist.
    Closed,
    /// The resourceVersion is too old (410 Gone): relist.
    Expired,
}

/// The connection's connector: rustls with the cluster's CA only, HTTP/1.1.
fn connector(cfg: &LiveConfig) -> anyhow::Result<Connector> {
    let tls = crate::tls::cluster_config(&cfg.ca_file)?;
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(crate::upstream::tcp_connector(Duration::from_secs(5))))
}

/// Follows the map until `shutdown` turns true.
pub async fn run(
    cfg: LiveConfig,
    store: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connector = match connector(&cfg) {
        Ok(connector) => connector,
        Err(err) => {
            tracing::warn!(
                error = format!("{err:#}"),
                "cannot follow the bucket map through the API server; the mounted volume stays the only source"
            );
            store.give_up_waiting();
            return;
        }
    };
    let connection = Connection {
        connector,
        api: cfg.api.clone(),
        sender: None,
    };
    let mut follower = Follower::new(cfg, connection, store, metrics);
    tokio::select! {
        () = follower.follow() => {}
        _ = shutdown.changed() => {}
    }
}

/// The loop's state.
struct Follower {
    cfg: LiveConfig,
    connection: Connection,
    store: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    /// The failure last logged, so a repeated one is logged once.
    last_error: Option<String>,
    /// The last invalid map logged, likewise.
    last_invalid: Option<String>,
    /// The logged freshness: whether the map was past its bound.
    was_stale: bool,
}

impl Follower {
    fn new(
        cfg: LiveConfig,
        connection: Connection,
        store: Arc<MappingStore>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            cfg,
            connection,
            store,
            metrics,
            last_error: None,
            last_invalid: None,
            was_stale: false,
        }
    }

    /// List, watch, list again; back off on failure.
    async fn follow(&mut self) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let sent = Instant::now();
            match self.list().await {
                Ok((entries, version)) => {
                    // A map refused is no confirmation of the map in force:
                    // the API server's map has moved on from it.
                    if self.apply(entries, "list") {
                        self.store.confirm(sent);
                    }
                    self.recovered();
                    if self.watch_until_end(&version).await {
                        backoff = Duration::from_millis(250);
                    } else {
                        // A watch that fails at once must not turn into a
                        // list per round trip.
                        self.sleep_watching_age(backoff).await;
                        backoff = (backoff * 2).min(self.cfg.relist);
                    }
                }
                Err(err) => {
                    self.failed(&err);
                    self.sleep_watching_age(backoff).await;
                    backoff = (backoff * 2).min(self.cfg.relist);
                }
            }
        }
    }

    /// Watches until the watch ends; whether it ended as a watch does
    /// (the API server's timeout, or an expired resourceVersion).
    async fn watch_until_end(&mut self, version: &str) -> bool {
        let end = self.watch(version).await;
        if !matches!(end, Ok(WatchEnd::Closed)) {
            // The response was left half-read.
            self.connection.reset();
        }
        match end {
            Ok(WatchEnd::Closed | WatchEnd::Expired) => true,
            Err(err) => {
                self.failed(&err);
                false
            }
        }
    }

    /// A consistent list of the one ConfigMap: its entries (none when it
    /// does not exist) and the list's resourceVersion.
    async fn list(&mut self) -> anyhow::Result<(Vec<(String, String)>, String)> {
        let path = self.path(None);
        let body = match tokio::time::timeout(Duration::from_secs(10), self.get(&path)).await {
            Ok(body) => body,
            Err(_) => {
                self.connection.reset();
                bail!("the list took longer than 10 s");
            }
        };
        let body = body.inspect_err(|_| self.connection.reset())?;
        let list: List =
            serde_json::from_slice(&body).context("the list is not a ConfigMapList")?;
        let entries = list
            .items
            .into_iter()
            .next()
            .map(|cm| entries(cm.data))
            .unwrap_or_default();
        Ok((entries, list.metadata.resource_version))
    }

    /// One watch from `version`, applying each event, until the API server
    /// ends it (after the relist period) or it fails.
    async fn watch(&mut self, version: &str) -> anyhow::Result<WatchEnd> {
        let path = self.path(Some(version));
        let response = self.send(&path).await?;
        let mut body = response.into_body();
        let mut buffer = BytesMut::new();
        // The API server ends the watch after `relist`; silence much longer
        // than that is a dead connection.
        let patience = self.cfg.relist + Duration::from_secs(5);
        loop {
            let frame = tokio::time::timeout(patience, body.frame()).await;
            let frame = match frame {
                Err(_) => bail!("the watch went silent for {patience:?}"),
                Ok(None) => return Ok(WatchEnd::Closed),
                Ok(Some(frame)) => frame.context("the watch failed")?,
            };
            if let Ok(data) = frame.into_data() {
                buffer.extend_from_slice(&data);
            }
            while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                let line = buffer.split_to(at + 1);
                if let Some(end) = self.event(line.chunk())? {
                    return Ok(end);
                }
            }
        }
    }

    /// Applies one watch line; `Some` when the watch must end.
    fn event(&mut self, line: &[u8]) -> anyhow::Result<Option<WatchEnd>> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let event: Event = serde_json::from_slice(line).context("a watch event is not JSON")?;
        match event.kind.as_str() {
            "ADDED" | "MODIFIED" => {
                let cm: ConfigMap = serde_json::from_value(event.object)
                    .context("a watch event holds no ConfigMap")?;
                // Events apply changes but confirm nothing.
                self.apply(entries(cm.data), "watch");
            }
            "DELETED" => {
                self.apply(Vec::new(), "watch");
            }
            "BOOKMARK" => {}
            "ERROR" => {
                let code = event.object.get("code").and_then(serde_json::Value::as_u64);
                if code == Some(410) {
                    return Ok(Some(WatchEnd::Expired));
                }
                bail!("the watch ended with an error: {}", event.object);
            }
            other => bail!("unknown watch event type {other:?}"),
        }
        Ok(None)
    }

    /// Puts a map from the API server in force (or reports why not);
    /// whether it is in force.
    fn apply(&mut self, entries: Vec<(String, String)>, source: &'static str) -> bool {
        apply(
            &self.store,
            &self.metrics,
            &mut self.last_invalid,
            entries,
            source,
        )
    }

    /// The collection path: the list, or a watch from `version`.
    fn path(&self, version: Option<&str>) -> String {
        let base = format!(
            "/api/v1/namespaces/{}/configmaps?fieldSelector=metadata.name%3D{}",
            self.cfg.namespace, self.cfg.name
        );
        match version {
            None => base,
            Some(version) => format!(
                "{base}&watch=true&allowWatchBookmarks=true&resourceVersion={version}&timeoutSeconds={}",
                self.cfg.relist.as_secs().max(1)
            ),
        }
    }

    /// A GET whose whole body is read.
    async fn get(&mut self, path: &str) -> anyhow::Result<Bytes> {
        let response = self.send(path).await?;
        let body = response
            .into_body()
            .collect()
            .await
            .context("the response broke off")?;
        Ok(body.to_bytes())
    }

    /// Sends a GET with the current token; a status other than 200 is an error.
    async fn send(&mut self, path: &str) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        let token = std::fs::read_to_string(&self.cfg.token_file)
            .with_context(|| format!("cannot read the token {}", self.cfg.token_file.display()))?;
        let host = self
            .cfg
            .api
            .authority()
            .map(|a| a.as_str().to_owned())
            .context("the API server's URL has no host")?;
        let request = Request::get(path)
            .header(http::header::HOST, host)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            )
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .context("cannot build the request")?;
        let response = self.connection.send(request).await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            let text = body.map(|b| String::from_utf8_lossy(&b).into_owned());
            bail!(
                "the API server answered {status}: {}",
                text.unwrap_or_default().trim()
            );
        }
        Ok(response)
    }

    /// Reports a failure once per distinct message.
    fn failed(&mut self, err: &anyhow::Error) {
        self.metrics.count_live_failure();
        let message = format!("{err:#}");
        if self.last_error.as_deref() != Some(&message) {
            tracing::warn!(error = %message, map = %self.cfg.name, "cannot follow the bucket map through the API server; retrying (the map in force stays)");
            self.last_error = Some(message);
        }
        self.log_transition();
    }

    /// Logs the first success after failures.
    fn recovered(&mut self) {
        if self.last_error.take().is_some() {
            tracing::info!(map = %self.cfg.name, "following the bucket map through the API server again");
        }
        self.log_transition();
    }

    /// Sleeps `pause`, logging the moment the map passes its bound.
    async fn sleep_watching_age(&mut self, pause: Duration) {
        let until = Instant::now() + pause;
        if let Some(at) = self.store.stale_at().filter(|at| *at < until) {
            tokio::time::sleep_until(at.into()).await;
            self.log_transition();
        }
        tokio::time::sleep_until(until.into()).await;
        self.log_transition();
    }

    /// One log line when the map passes its bound, one when it is back.
    fn log_transition(&mut self) {
        let stale = self.store.staleness();
        match (self.was_stale, stale) {
            (false, Some(s)) => tracing::warn!(
                age_seconds = s.age.as_secs(),
                bound_seconds = s.bound.as_secs(),
                "the bucket map is older than its bound: writes are refused, reads are served"
            ),
            (true, None) => {
                tracing::info!("the bucket map is confirmed again: writes are served");
            }
            _ => {}
        }
        self.was_stale = stale.is_some();
    }
}

/// Puts a map from the API server in force, reporting what happened
/// (`last_invalid`: the invalid map last logged); whether it is in force.
/// A map that fails to validate (one of a newer format, a fence an older
/// sidecar cannot read) is not: the map in force stays, and a list that
/// brought it confirms nothing, so the sidecar goes stale and stops
/// writing within the bound rather than writing on with an entry the
/// operator has moved on from.
fn apply(
    store: &MappingStore,
    metrics: &Metrics,
    last_invalid: &mut Option<String>,
    entries: Vec<(String, String)>,
    source: &'static str,
) -> bool {
    let outcome = store.apply_live(entries);
    let applied = !matches!(outcome, crate::mapping::ReloadOutcome::Failed(_));
    crate::watch::report(store, metrics, outcome, last_invalid, source);
    applied
}

/// A ConfigMap's data as map entries: keys starting with `.` are not
/// entries (as in the mounted volume, where they are hidden files).
fn entries(data: BTreeMap<String, String>) -> Vec<(String, String)> {
    data.into_iter()
        .filter(|(key, _)| !key.starts_with('.'))
        .map(|(key, value)| (key, value.trim().to_owned()))
        .collect()
}

/// What to follow, from the command line: `None` without `--map-configmap`.
pub fn config_of(config: &crate::config::Config) -> anyhow::Result<Option<LiveConfig>> {
    let Some(name) = config.map_configmap.clone() else {
        return Ok(None);
    };
    let dir = &config.kube_credentials_dir;
    let namespace_file = dir.join("namespace");
    let namespace = std::fs::read_to_string(&namespace_file)
        .with_context(|| {
            format!(
                "cannot read the pod's namespace from {}",
                namespace_file.display()
            )
        })?
        .trim()
        .to_owned();
    anyhow::ensure!(
        !namespace.is_empty(),
        "{} is empty",
        namespace_file.display()
    );
    let api = match &config.kube_api {
        Some(api) => api.clone(),
        None => in_cluster_api()?,
    };
    Ok(Some(LiveConfig {
        api,
        namespace,
        name,
        token_file: dir.join("token"),
        ca_file: dir.join("ca.crt"),
        relist: (config.max_map_age / 4).max(Duration::from_secs(1)),
    }))
}

/// The API server of the pod's cluster, from the environment the kubelet
/// gives every container.
pub fn in_cluster_api() -> anyhow::Result<Uri> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .context("KUBERNETES_SERVICE_HOST is not set (give --kube-api)")?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_owned());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    format!("https://{host}:{port}")
        .parse()
        .context("KUBERNETES_SERVICE_HOST/PORT do not make a URL")
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::body::{Frame, Incoming};

    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn hidden_keys_are_not_entries_and_values_are_trimmed() {
        let data = [
            ("photos".to_owned(), "photos-k3x9q2mw\n".to_owned()),
            (".marks".to_owned(), "x".to_owned()),
        ]
        .into();
        assert_eq!(
            entries(data),
            vec![("photos".to_owned(), "photos-k3x9q2mw".to_owned())]
        );
    }

    #[test]
    fn a_watch_line_of_each_type_is_read() -> anyhow::Result<()> {
        let list: List = serde_json::from_str(
            r#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"name":"bucketmap"},"data":{"photos":"photos-k3x9q2mw"}}]}"#,
        )?;
        assert_eq!(list.metadata.resource_version, "42");
        assert_eq!(list.items.len(), 1);
        let empty: List =
            serde_json::from_str(r#"{"metadata":{"resourceVersion":"7"},"items":[]}"#)?;
        assert!(empty.items.is_empty());
        let gone: Event = serde_json::from_str(
            r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}"#,
        )?;
        assert_eq!(gone.kind, "ERROR");
        assert_eq!(gone.object.get("code").and_then(|c| c.as_u64()), Some(410));
        Ok(())
    }

    /// An API server of one ConfigMap whose `photos` entry is `value`:
    /// lists answer it, watches stay open and silent. Counts the watches
    /// started (each comes after a list was handled).
    async fn api_server(value: &'static str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let watches = Arc::new(AtomicUsize::new(0));
        let counted = watches.clone();
        let answer = move |req: Request<Incoming>| {
            let body = if req.uri().query().is_some_and(|q| q.contains("watch=true")) {
                counted.fetch_add(1, Ordering::SeqCst);
                let silent = futures::stream::pending::<Result<Frame<Bytes>, Infallible>>();
                crate::body::boxed(http_body_util::StreamBody::new(silent))
            } else {
                let list = serde_json::json!({
                    "kind": "ConfigMapList",
                    "metadata": {"resourceVersion": "7"},
                    "items": [{"metadata": {"name": "bucketmap"}, "data": {"photos": value}}]
                });
                crate::body::full(list.to_string())
            };
            std::future::ready(Ok::<_, Infallible>(http::Response::new(body)))
        };
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let service = hyper::service::service_fn(answer.clone());
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                );
            }
        });
        (addr, watches)
    }

    /// The real follower against [`api_server`], the map in force before
    /// it `photos-v1v1v1v1`: the store once the first list was handled.
    async fn follow_one_list(value: &'static str) -> Arc<MappingStore> {
        let (addr, watches) = api_server(value).await;
        let dir = tempfile::tempdir().expect("a directory");
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .expect("a certificate");
        std::fs::write(dir.path().join("ca.crt"), ca.cert.pem()).expect("the CA file");
        std::fs::write(dir.path().join("token"), "t").expect("the token");
        let cfg = LiveConfig {
            api: format!("http://{addr}").parse().expect("a URL"),
            namespace: "ns".to_owned(),
            name: "bucketmap".to_owned(),
            token_file: dir.path().join("token"),
            ca_file: dir.path().join("ca.crt"),
            relist: Duration::from_secs(60),
        };
        let store =
            Arc::new(MappingStore::new(None, Vec::new()).following(Duration::from_secs(60)));
        let v1 = [("photos".to_owned(), "photos-v1v1v1v1".to_owned())];
        store.set(crate::mapping::Mapping::new(v1).expect("a map"));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(cfg, store.clone(), Arc::new(Metrics::new()), stopped));
        let deadline = Instant::now() + Duration::from_secs(30);
        while watches.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the follower never watched");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
        let _ = task.await;
        store
    }

    #[tokio::test]
    async fn the_follower_confirms_only_with_a_list_whose_map_it_applied() {
        let physical = |store: &MappingStore| {
            store
                .current()
                .and_then(|m| m.physical("photos").map(str::to_owned))
        };
        // Control: a valid map (fenced) is applied and confirmed.
        let store = follow_one_list("photos-v2v2v2v2;fenced").await;
        assert_eq!(physical(&store).as_deref(), Some("photos-v2v2v2v2"));
        assert_eq!(store.staleness(), None, "a valid list did not confirm");
        // A map this sidecar cannot read is not applied, and the list
        // confirms nothing: the map stays unconfirmed, writes refused.
        let store = follow_one_list("photos-v2v2v2v2;sealed").await;
        assert_eq!(physical(&store).as_deref(), Some("photos-v1v1v1v1"));
        let stale = store
            .staleness()
            .expect("a refused list confirmed the old map");
        assert!(!stale.confirmed_once);
    }
}
