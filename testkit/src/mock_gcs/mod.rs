//! In-memory google.storage.v2 gRPC server used by tests, benchmarks and `cargo dev`.
//!
//! [`MockGcs`] serves the bucket and object methods of
//! `google.storage.v2.Storage` (CreateBucket, GetBucket, UpdateBucket,
//! DeleteBucket, LockBucketRetentionPolicy, ListBuckets, ListObjects,
//! DeleteObject, GetObject, and the
//! object data methods WriteObject, BidiWriteObject, StartResumableWrite,
//! QueryWriteStatus, ReadObject, BidiReadObject, ComposeObject,
//! RewriteObject with their real streaming shapes, rewrite tokens
//! included) over plaintext HTTP/2
//! (h2c) on a local port, with GCS semantics: global bucket ids,
//! metageneration and generation preconditions, field-mask updates,
//! non-empty bucket protection, object versioning, retention policies and
//! their lock, object retention, CRC32C and MD5 checks of
//! written data, reads in chunks of at most 2 MiB. Object data is kept as
//! the chunks it arrived in. It also serves the IAM policy of buckets
//! (`google.storage.control.v2.StorageControl` GetIamPolicy and
//! SetIamPolicy: etags, version 3 conditional bindings), and, over
//! HTTP/1.1 on the same port, the JSON API's notification configurations
//! (`notifications.rs`). Other methods answer UNIMPLEMENTED.
//!
//! Every call is logged ([`MockHandle::calls`]) with its method, target,
//! final code, request metadata (`x-goog-request-params`, `authorization`,
//! `grpc-timeout`, ...) and whether the client cancelled it.
//!
//! Point the official client at it with
//! `StorageControl::builder().with_endpoint(mock.endpoint())` and anonymous
//! credentials. Tests arrange and inspect state, inject faults, latency and
//! quota errors through a [`MockHandle`].
//!
//! Names: handle methods take plain bucket ids (`photos-k3x9q2mw`) and plain
//! project ids (`acme-staging`); on the wire buckets are
//! `projects/_/buckets/{id}` and a bucket's `project` is `projects/{project}`.

mod buckets;
mod content;
mod context;
mod faults;
mod iam;
mod notifications;
mod objects;
mod objects_grpc;
mod retention;
mod rewrite;
pub(crate) mod service;
mod settings;
mod state;
mod streams;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_grpc;
#[cfg(test)]
mod tests_notifications;
#[cfg(test)]
mod tests_rewrite;
#[cfg(test)]
mod tests_settings;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

pub use faults::{Call, Fault, FaultCounts, RandomFaults};
pub use googleapis_tonic_google_storage_v2::google::storage::v2 as proto;
pub use iam::{has_member, iam_proto};

use context::Recorded;
use service::{MockService, StorageServer};
use state::State;

/// How long [`MockGcs::shutdown`] waits for open calls before aborting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A running mock GCS server. Stops when dropped or [`shut down`](Self::shutdown).
#[derive(Debug)]
pub struct MockGcs {
    addr: SocketAddr,
    handle: MockHandle,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl MockGcs {
    /// Starts a mock with empty state on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<MockGcs> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts a mock with empty state on `addr` (port 0 picks a free port).
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<MockGcs> {
        Self::start_with(addr, MockHandle::new()).await
    }

    /// Serves existing state on `addr`: lets a test stop a mock and start
    /// it again (an outage) without losing buckets, faults or the call log.
    pub async fn start_with(addr: SocketAddr, handle: MockHandle) -> anyhow::Result<MockGcs> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot bind the mock GCS to {addr}"))?;
        Self::serve(listener, handle)
    }

    /// Serves `handle`'s state on a listener the caller bound (one inside
    /// a test node's network namespace, for instance).
    pub fn serve_std(
        listener: std::net::TcpListener,
        handle: MockHandle,
    ) -> anyhow::Result<MockGcs> {
        listener
            .set_nonblocking(true)
            .context("cannot make the mock GCS's listener non-blocking")?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .context("cannot serve the mock GCS on the given listener")?;
        Self::serve(listener, handle)
    }

    fn serve(listener: tokio::net::TcpListener, handle: MockHandle) -> anyhow::Result<MockGcs> {
        let addr = listener
            .local_addr()
            .context("cannot read the address the mock GCS bound")?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = Recorded(StorageServer::new(MockService::new(handle.state.clone())));
        let control = Recorded(iam::StorageControlServer::new(iam::ControlService::new(
            handle.state.clone(),
        )));
        // The JSON API's notification calls share the port, over HTTP/1.1.
        let json = axum::Router::new().route_service(
            "/storage/v1/b/{*rest}",
            Recorded(notifications::JsonApi(handle.state.clone())),
        );
        let routes = tonic::service::Routes::from(json)
            .add_service(service)
            .add_service(control);
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .accept_http1(true)
                .add_routes(routes)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    // A dropped sender also means stop.
                    let _ = stopped.await;
                }),
        );
        tracing::debug!(%addr, "mock GCS listening");
        Ok(MockGcs {
            addr,
            handle,
            stop: Some(stop),
            server: Some(server),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint for clients, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        let host = if self.addr.ip().is_unspecified() {
            SocketAddr::from((Ipv4Addr::LOCALHOST, self.addr.port()))
        } else {
            self.addr
        };
        format!("http://{host}")
    }

    /// A handle on the mock's state; cheap to clone, shares the state.
    pub fn handle(&self) -> MockHandle {
        self.handle.clone()
    }

    /// Stops accepting connections, lets open calls finish (for a few
    /// seconds at most) and releases the port.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(mut server) = self.server.take() else {
            return;
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(addr = %self.addr, "mock GCS server failed: {err}"),
            Ok(Err(err)) => tracing::warn!(addr = %self.addr, "mock GCS server task failed: {err}"),
            Err(_) => {
                tracing::warn!(addr = %self.addr, "mock GCS did not stop in {SHUTDOWN_GRACE:?}; aborting it");
                server.abort();
            }
        }
    }
}

impl Drop for MockGcs {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// Shared access to a mock's state, for tests to arrange and inspect it.
///
/// Bucket arguments are plain ids (`photos-k3x9q2mw`), projects plain ids
/// (`acme-staging`). Changes made here are not logged as calls and bypass
/// faults and quota.
#[derive(Debug, Clone, Default)]
pub struct MockHandle {
    state: Arc<Mutex<State>>,
}

impl MockHandle {
    /// Empty state, not served yet (see [`MockGcs::start_with`]).
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// All buckets, by id.
    pub fn buckets(&self) -> Vec<proto::Bucket> {
        self.lock().buckets.values().cloned().collect()
    }

    /// The bucket with id `id`.
    pub fn bucket(&self, id: &str) -> Option<proto::Bucket> {
        self.lock().buckets.get(id).cloned()
    }

    /// The plain project id owning bucket `id`.
    pub fn bucket_project(&self, id: &str) -> Option<String> {
        self.lock().bucket_project(id)
    }

    /// Stores `bucket` in `project` as if it had been created there (e.g. a
    /// foreign bucket already holding a name), replacing any bucket with the
    /// same id. The id comes from `bucket_id`, else the last segment of
    /// `name`; missing server-side fields get CreateBucket's defaults, and
    /// the metageneration is at least 1. Returns the stored bucket.
    pub fn insert_bucket(
        &self,
        project: &str,
        bucket: proto::Bucket,
    ) -> anyhow::Result<proto::Bucket> {
        self.lock().insert_bucket(project, bucket)
    }

    /// Deletes bucket `id` and its objects out of band (ignoring whether it
    /// is empty). Returns the removed bucket.
    pub fn remove_bucket(&self, id: &str) -> Option<proto::Bucket> {
        let mut state = self.lock();
        state.drop_objects(id);
        state.buckets.remove(id)
    }

    /// Edits bucket `id` out of band (drift): applies `change`, then bumps
    /// the metageneration, update time and etag. Returns the new bucket.
    pub fn modify_bucket(
        &self,
        id: &str,
        change: impl FnOnce(&mut proto::Bucket),
    ) -> anyhow::Result<proto::Bucket> {
        self.lock().modify_bucket(id, change)
    }

    /// Edits every generation of object `name` in bucket `bucket` out of
    /// band (an older creation time, a retention of its own, ...); returns
    /// how many generations were changed.
    pub fn modify_objects(
        &self,
        bucket: &str,
        name: &str,
        mut change: impl FnMut(&mut proto::Object),
    ) -> usize {
        let mut state = self.lock();
        let objects = state.objects.get_mut(bucket).into_iter().flatten();
        let mut changed = 0;
        for object in objects.filter(|o| o.name == name) {
            change(object);
            changed += 1;
        }
        changed
    }

    /// Writes a new live generation of object `name` in bucket `bucket`.
    /// If the bucket has versioning enabled the previous live generation
    /// becomes noncurrent (it gets a `delete_time`), otherwise it is
    /// replaced. Fails if the bucket does not exist.
    pub fn put_object(&self, bucket: &str, name: &str) -> anyhow::Result<proto::Object> {
        self.lock().put_object(bucket, name)
    }

    /// Writes a new live generation of object `name` in bucket `bucket`
    /// holding `data` (its size and checksums set), as
    /// [`put_object`](Self::put_object) does.
    pub fn put_object_data(
        &self,
        bucket: &str,
        name: &str,
        data: impl Into<Bytes>,
    ) -> anyhow::Result<proto::Object> {
        let content = content::Content::from_chunks([data.into()]);
        self.lock().put_object_data(bucket, name, content)
    }

    /// The data of the live generation of object `name` in `bucket`, in one
    /// buffer.
    pub fn object_data(&self, bucket: &str, name: &str) -> Option<Bytes> {
        let content = streams::live_content(&self.lock(), bucket, name)?;
        Some(match content.chunks() {
            [] => Bytes::new(),
            [one] => one.clone(),
            chunks => Bytes::from(chunks.concat()),
        })
    }

    /// How many bytes one RewriteObject call copies when the copy changes
    /// location or storage class and the request sets no
    /// `max_bytes_rewritten_per_call`: GCS then answers with a rewrite
    /// token until the copy is done. 1 MiB unless set; 0 copies such
    /// objects in one call.
    pub fn set_rewrite_bytes_per_call(&self, bytes: u64) {
        self.lock().rewrites.bytes_per_call = bytes;
    }

    /// How many write sessions are open (resumable uploads and write
    /// streams in progress, finalized resumable uploads).
    pub fn upload_count(&self) -> usize {
        self.lock().uploads.len()
    }

    /// All generations (live and noncurrent) of all objects in `bucket`, by
    /// name then generation; noncurrent ones have a `delete_time`.
    pub fn objects(&self, bucket: &str) -> Vec<proto::Object> {
        self.lock().objects_in(bucket)
    }

    /// Removes every object generation from `bucket`.
    pub fn clear_objects(&self, bucket: &str) {
        self.lock().drop_objects(bucket);
    }

    /// Every call answered so far (including failed ones), in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().controls.calls.clone()
    }

    /// How many calls of `method` (e.g. `"CreateBucket"`) were answered.
    pub fn call_count(&self, method: &str) -> usize {
        self.lock()
            .controls
            .calls
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    /// Forgets the call log.
    pub fn reset_calls(&self) {
        self.lock().controls.calls.clear();
    }

    /// Adds a fault; faults are matched in the order they were added.
    pub fn add_fault(&self, fault: Fault) {
        self.lock().controls.faults.push(fault);
    }

    /// Removes all faults.
    pub fn clear_faults(&self) {
        self.lock().controls.faults.clear();
    }

    /// Delays every call of `method` (`None`: of every method without its
    /// own setting) by `latency` before it is processed. The call completes
    /// on the server even if the client gives up. A zero duration removes
    /// the setting.
    pub fn set_latency(&self, method: Option<String>, latency: Duration) {
        let mut state = self.lock();
        if latency.is_zero() {
            state.controls.latency.remove(&method);
        } else {
            state.controls.latency.insert(method, latency);
        }
    }

    /// Per-project bucket quota like GCS's (about one create or delete per
    /// two seconds): a CreateBucket or DeleteBucket in a project sooner than
    /// `interval` after the previous accepted one in that project answers
    /// RESOURCE_EXHAUSTED and counts in [`quota_errors`](Self::quota_errors).
    /// `None` disables the limit.
    pub fn set_bucket_rate_limit(&self, interval: Option<Duration>) {
        self.lock().controls.bucket_rate_limit = interval;
    }

    /// Turns seeded random faults and latency on ([`RandomFaults`]), with
    /// fresh counts, or off (`None`, keeping nothing).
    pub fn set_random_faults(&self, settings: Option<RandomFaults>) {
        self.lock().controls.random = settings.map(faults::RandomState::new);
    }

    /// What random mode injected so far, by kind (zero when off).
    pub fn random_fault_counts(&self) -> FaultCounts {
        self.lock()
            .controls
            .random
            .as_ref()
            .map(|r| r.counts)
            .unwrap_or_default()
    }

    /// How many calls the bucket rate limit rejected.
    pub fn quota_errors(&self) -> usize {
        self.lock().controls.quota_errors
    }
}

/// Locks the state; a panic in another holder (only possible in tests)
/// does not make the state unusable.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
