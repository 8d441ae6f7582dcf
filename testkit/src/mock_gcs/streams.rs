//! The streaming object RPCs: WriteObject (client streaming),
//! BidiWriteObject, ReadObject (server streaming) and BidiReadObject.
//!
//! A streaming call is logged once, when it ends: with its final code, or
//! as cancelled when the client reset the stream or stopped reading before
//! the mock was done (see [`StreamCall`]). Faults apply to the step that
//! resolves the call: finalizing a write, opening a read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

use super::content::{Content, MAX_READ_CHUNK};
use super::context::CallContext;
use super::lock;
use super::objects_grpc::{Preconditions, ReadSource, size_i64};
use super::proto;
use super::state::{State, Target, lenient_bucket_id, parse_bucket_name};

/// Responses of a server-streaming call, produced by a task of the mock.
pub(crate) type ResponseStream<T> = ReceiverStream<Result<T, Status>>;

/// How many responses a stream buffers ahead of a slow reader.
const STREAM_BUFFER: usize = 4;

/// One streaming call's bookkeeping: its target and context, logged once.
/// Dropped unlogged (the client went away), it logs the call as cancelled.
#[derive(Debug)]
pub(crate) struct StreamCall {
    state: Arc<Mutex<State>>,
    target: Target,
    context: CallContext,
    logged: bool,
}

impl StreamCall {
    /// A call of `method` in the current call context.
    pub(crate) fn new(state: Arc<Mutex<State>>, method: &'static str) -> Self {
        Self {
            state,
            target: Target {
                method,
                project: None,
                bucket: None,
            },
            context: CallContext::current(),
            logged: false,
        }
    }

    /// Names the bucket the call is about (`projects/_/buckets/ID`).
    pub(crate) fn set_bucket(&mut self, bucket_name: &str) {
        self.target.bucket = lenient_bucket_id(bucket_name).map(str::to_string);
    }

    /// Waits the latency configured for the method.
    pub(crate) async fn delay(&self) {
        let delay = lock(&self.state).controls.latency_for(self.target.method);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    /// Runs `op` under the state lock with the faults matching the call.
    pub(crate) fn guarded<T>(
        &self,
        op: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<T, Status> {
        lock(&self.state).run_guarded(&self.target, op)
    }

    /// Logs the call with `code`.
    pub(crate) fn finish(&mut self, code: Code, cancelled: bool) {
        if self.logged {
            return;
        }
        self.logged = true;
        let target = self.target.clone();
        let state = self.state.clone();
        self.context
            .clone()
            .sync_scope(|| lock(&state).log_call(target, code, cancelled));
    }

    /// Logs the call as failed with `status` and passes the status on.
    pub(crate) fn fail(&mut self, status: Status) -> Status {
        self.finish(status.code(), false);
        status
    }

    /// Logs the call as abandoned: the client's stream failed (reset,
    /// connection lost) with `status`, which is passed on.
    pub(crate) fn abandoned(&mut self, status: Status) -> Status {
        let cancelled = matches!(
            status.code(),
            Code::Cancelled | Code::Unknown | Code::Unavailable
        );
        self.finish(status.code(), cancelled);
        status
    }

    /// Records that the client went away after the call was logged.
    fn cancelled_late(&self) {
        lock(&self.state).controls.mark_cancelled(self.context.id);
    }

    /// Sends `response`; false (and the call logged or marked cancelled)
    /// when the client stopped reading.
    async fn send<T>(&mut self, tx: &mpsc::Sender<Result<T, Status>>, response: T) -> bool {
        if tx.send(Ok(response)).await.is_ok() {
            return true;
        }
        if self.logged {
            self.cancelled_late();
        } else {
            self.finish(Code::Cancelled, true);
        }
        false
    }
}

impl Drop for StreamCall {
    fn drop(&mut self) {
        self.finish(Code::Cancelled, true);
    }
}

/// What a write stream's first message opens.
#[derive(Debug)]
enum WriteFirst {
    UploadId(String),
    Spec(Box<proto::WriteObjectSpec>),
}

/// One message of WriteObject or BidiWriteObject.
#[derive(Debug)]
pub(crate) struct WriteMessage {
    first: Option<WriteFirst>,
    offset: i64,
    data: Option<proto::ChecksummedData>,
    checksums: Option<proto::ObjectChecksums>,
    finish: bool,
    state_lookup: bool,
}

impl From<proto::WriteObjectRequest> for WriteMessage {
    fn from(request: proto::WriteObjectRequest) -> Self {
        use proto::write_object_request::{Data, FirstMessage};
        Self {
            first: request.first_message.map(|first| match first {
                FirstMessage::UploadId(id) => WriteFirst::UploadId(id),
                FirstMessage::WriteObjectSpec(spec) => WriteFirst::Spec(Box::new(spec)),
            }),
            offset: request.write_offset,
            data: request.data.map(|Data::ChecksummedData(data)| data),
            checksums: request.object_checksums,
            finish: request.finish_write,
            state_lookup: false,
        }
    }
}

impl TryFrom<proto::BidiWriteObjectRequest> for WriteMessage {
    type Error = Status;

    fn try_from(request: proto::BidiWriteObjectRequest) -> Result<Self, Status> {
        use proto::bidi_write_object_request::{Data, FirstMessage};
        let first = match request.first_message {
            None => None,
            Some(FirstMessage::UploadId(id)) => Some(WriteFirst::UploadId(id)),
            Some(FirstMessage::WriteObjectSpec(spec)) => Some(WriteFirst::Spec(Box::new(spec))),
            Some(FirstMessage::AppendObjectSpec(_)) => {
                return Err(Status::unimplemented(
                    "appendable objects are not supported by the mock GCS",
                ));
            }
        };
        Ok(Self {
            first,
            offset: request.write_offset,
            data: request.data.map(|Data::ChecksummedData(data)| data),
            checksums: request.object_checksums,
            finish: request.finish_write,
            state_lookup: request.state_lookup,
        })
    }
}

/// What one write message led to.
#[derive(Debug)]
pub(crate) enum WriteStep {
    /// Nothing to answer yet.
    Continue,
    /// The client asked for the persisted size.
    Persisted(i64),
    /// The object is written.
    Finished(Box<proto::Object>),
}

/// One write stream over an upload session.
#[derive(Debug)]
pub(crate) struct WriteStream {
    call: StreamCall,
    upload: Option<String>,
    resumable: bool,
}

impl WriteStream {
    fn new(state: Arc<Mutex<State>>, method: &'static str) -> Self {
        Self {
            call: StreamCall::new(state, method),
            upload: None,
            resumable: false,
        }
    }

    /// The upload this stream writes, opened by the first message (with the
    /// object checksums it carries, checked when the write finishes).
    fn open(
        &mut self,
        first: Option<WriteFirst>,
        checksums: Option<&proto::ObjectChecksums>,
    ) -> Result<String, Status> {
        match (&self.upload, first) {
            (Some(id), None) => Ok(id.clone()),
            (Some(_), Some(_)) => Err(Status::invalid_argument(
                "only the first message of a write stream may carry write_object_spec or upload_id",
            )),
            (None, None) => Err(Status::invalid_argument(
                "the first message of a write stream must carry write_object_spec or upload_id",
            )),
            (None, Some(WriteFirst::Spec(spec))) => {
                let bucket = spec.resource.as_ref().map(|r| r.bucket.clone());
                self.call.set_bucket(&bucket.unwrap_or_default());
                let id = lock(&self.call.state).start_upload(*spec, checksums.cloned(), false)?;
                self.upload = Some(id.clone());
                Ok(id)
            }
            (None, Some(WriteFirst::UploadId(id))) => {
                let state = lock(&self.call.state);
                let upload = state.upload(&id)?;
                self.call.target.bucket = Some(upload.bucket.clone());
                self.resumable = upload.resumable;
                drop(state);
                self.upload = Some(id.clone());
                Ok(id)
            }
        }
    }

    /// Applies one message: opens the upload, appends the data, finalizes.
    fn apply(&mut self, message: WriteMessage) -> Result<WriteStep, Status> {
        let id = self.open(message.first, message.checksums.as_ref())?;
        let persisted = lock(&self.call.state).append_upload(&id, message.offset, message.data)?;
        if message.finish {
            let checksums = message.checksums;
            let object = self
                .call
                .guarded(|state| state.finish_upload(&id, checksums.as_ref()))?;
            return Ok(WriteStep::Finished(Box::new(object)));
        }
        if message.state_lookup {
            return Ok(WriteStep::Persisted(persisted));
        }
        Ok(WriteStep::Continue)
    }

    /// The stream ended without `finish_write`: a resumable upload reports
    /// its persisted size, a one-shot write is refused.
    fn unfinished(&self) -> Result<i64, Status> {
        match &self.upload {
            Some(id) if self.resumable => lock(&self.call.state).persisted_size(id),
            _ => Err(Status::invalid_argument(
                "the write stream ended without finish_write",
            )),
        }
    }
}

impl Drop for WriteStream {
    fn drop(&mut self) {
        if let Some(id) = self.upload.as_ref().filter(|_| !self.resumable) {
            lock(&self.call.state).discard_upload(id);
        }
    }
}

/// WriteObject: the client streams the data, the mock answers once.
pub(crate) async fn write_object(
    state: Arc<Mutex<State>>,
    mut requests: Streaming<proto::WriteObjectRequest>,
) -> Result<proto::WriteObjectResponse, Status> {
    use proto::write_object_response::WriteStatus;
    let mut stream = WriteStream::new(state, "WriteObject");
    stream.call.delay().await;
    loop {
        let request = match requests.message().await {
            Ok(Some(request)) => request,
            Ok(None) => {
                // hyper ends a request body reset with CANCEL as if the
                // client had half-closed it, then drops this call (logged
                // as cancelled by `StreamCall`) from its response task,
                // which may run later on another worker: a write that
                // would be refused as unfinished waits for that first.
                if stream.resumable {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(RESET_GRACE).await;
                }
                break;
            }
            Err(status) => return Err(stream.call.abandoned(status)),
        };
        match stream.apply(request.into()) {
            Err(status) => return Err(stream.call.fail(status)),
            Ok(WriteStep::Finished(object)) => {
                stream.call.finish(Code::Ok, false);
                return Ok(proto::WriteObjectResponse {
                    write_status: Some(WriteStatus::Resource(*object)),
                });
            }
            Ok(_) => {}
        }
    }
    match stream.unfinished() {
        Ok(size) => {
            stream.call.finish(Code::Ok, false);
            Ok(proto::WriteObjectResponse {
                write_status: Some(WriteStatus::PersistedSize(size)),
            })
        }
        Err(status) => Err(stream.call.fail(status)),
    }
}

/// BidiWriteObject: answers `state_lookup` with the persisted size and
/// `finish_write` with the object, then ends the stream.
pub(crate) fn bidi_write_object(
    state: Arc<Mutex<State>>,
    requests: Streaming<proto::BidiWriteObjectRequest>,
) -> ResponseStream<proto::BidiWriteObjectResponse> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let stream = WriteStream::new(state, "BidiWriteObject");
    tokio::spawn(bidi_write(stream, requests, tx));
    ReceiverStream::new(rx)
}

async fn bidi_write(
    mut stream: WriteStream,
    mut requests: Streaming<proto::BidiWriteObjectRequest>,
    tx: mpsc::Sender<Result<proto::BidiWriteObjectResponse, Status>>,
) {
    use proto::bidi_write_object_response::WriteStatus;
    stream.call.delay().await;
    let status = loop {
        let request = match requests.message().await {
            Ok(Some(request)) => request,
            Ok(None) if client_gone(&tx).await => {
                stream.call.finish(Code::Cancelled, true);
                return;
            }
            Ok(None) => break stream.unfinished().map(WriteStatus::PersistedSize),
            Err(status) => {
                stream.call.abandoned(status);
                return;
            }
        };
        let step = WriteMessage::try_from(request).and_then(|m| stream.apply(m));
        let status = match step {
            Ok(WriteStep::Continue) => continue,
            Ok(WriteStep::Persisted(size)) => WriteStatus::PersistedSize(size),
            Ok(WriteStep::Finished(object)) => break Ok(WriteStatus::Resource(*object)),
            Err(status) => break Err(status),
        };
        let response = proto::BidiWriteObjectResponse {
            write_status: Some(status),
            write_handle: None,
        };
        if !stream.call.send(&tx, response).await {
            return;
        }
    };
    match status {
        Ok(status) => {
            stream.call.finish(Code::Ok, false);
            let response = proto::BidiWriteObjectResponse {
                write_status: Some(status),
                write_handle: None,
            };
            stream.call.send(&tx, response).await;
        }
        Err(status) => {
            let status = stream.call.fail(status);
            let _ = tx.send(Err(status)).await;
        }
    }
}

/// How long a stream that ended waits to learn whether the client reset it.
const RESET_GRACE: Duration = Duration::from_millis(250);

/// Whether the client reset the call rather than half-closing it: hyper
/// ends a request body reset with CANCEL as a half-close, and its response
/// task, woken by the same reset, then drops the response body, which
/// closes `tx`. That task may run on another worker, later than this one
/// (a single yield lost that race under load), so this waits up to
/// [`RESET_GRACE`] for it; a client that half-closed keeps reading and
/// only costs the grace.
async fn client_gone<T>(tx: &mpsc::Sender<T>) -> bool {
    tokio::time::timeout(RESET_GRACE, tx.closed()).await.is_ok()
}

/// StartResumableWrite: a session later WriteObject / BidiWriteObject
/// streams write by upload id.
pub(crate) fn start_resumable_write(
    state: &mut State,
    request: proto::StartResumableWriteRequest,
) -> Result<proto::StartResumableWriteResponse, Status> {
    let spec = request
        .write_object_spec
        .ok_or_else(|| Status::invalid_argument("StartResumableWrite needs a write_object_spec"))?;
    let upload_id = state.start_upload(spec, request.object_checksums, true)?;
    Ok(proto::StartResumableWriteResponse { upload_id })
}

/// The bucket resource name a write spec or upload id targets, for the
/// call log.
pub(crate) fn write_spec_bucket(request: &proto::StartResumableWriteRequest) -> String {
    request
        .write_object_spec
        .as_ref()
        .and_then(|s| s.resource.as_ref())
        .map(|r| r.bucket.clone())
        .unwrap_or_default()
}

/// ReadObject: the object's metadata, range and checksums first, then its
/// data in chunks of at most 2 MiB.
pub(crate) async fn read_object(
    state: Arc<Mutex<State>>,
    request: proto::ReadObjectRequest,
) -> Result<ResponseStream<proto::ReadObjectResponse>, Status> {
    let mut call = StreamCall::new(state, "ReadObject");
    call.set_bucket(&request.bucket);
    call.delay().await;
    let preconditions = Preconditions {
        if_generation_match: request.if_generation_match,
        if_generation_not_match: request.if_generation_not_match,
        if_metageneration_match: request.if_metageneration_match,
        if_metageneration_not_match: request.if_metageneration_not_match,
    };
    let opened = call
        .guarded(|state| {
            state.read_source(
                &request.bucket,
                &request.object,
                request.generation,
                preconditions,
            )
        })
        .and_then(|source| {
            let range = source.range(request.read_offset, request.read_limit)?;
            Ok((source, range))
        });
    let (source, (start, end)) = opened.map_err(|status| call.fail(status))?;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(serve_read(call, tx, source, start, end));
    Ok(ReceiverStream::new(rx))
}

async fn serve_read(
    mut call: StreamCall,
    tx: mpsc::Sender<Result<proto::ReadObjectResponse, Status>>,
    source: ReadSource,
    start: u64,
    end: u64,
) {
    let mut first = Some(proto::ReadObjectResponse {
        checksummed_data: None,
        object_checksums: source.object.checksums.clone(),
        content_range: Some(proto::ContentRange {
            start: size_i64(start),
            end: size_i64(end),
            complete_length: size_i64(source.content.len()),
        }),
        metadata: Some(source.object),
    });
    let pieces = source.content.pieces(start, end, MAX_READ_CHUNK);
    let count = pieces.len();
    if count == 0 {
        call.finish(Code::Ok, false);
    }
    for (index, (_, piece)) in pieces.into_iter().enumerate() {
        let mut response = first.take().unwrap_or_default();
        response.checksummed_data = Some(checksummed(&piece));
        if index + 1 == count {
            call.finish(Code::Ok, false);
        }
        if !call.send(&tx, response).await {
            return;
        }
    }
    if let Some(response) = first {
        call.send(&tx, response).await;
    }
}

/// A piece of data, copied into the message, with its CRC32C.
fn checksummed(piece: &[bytes::Bytes]) -> proto::ChecksummedData {
    let content = piece.concat();
    proto::ChecksummedData {
        crc32c: Some(crc32c::crc32c(&content)),
        content,
    }
}

/// BidiReadObject: the first message names the object (`read_object_spec`);
/// the mock answers with its metadata and a read handle, then serves the
/// `read_ranges` of every message, each as `object_data_ranges` ending
/// with `range_end`, until the client half-closes.
pub(crate) async fn bidi_read_object(
    state: Arc<Mutex<State>>,
    mut requests: Streaming<proto::BidiReadObjectRequest>,
) -> Result<ResponseStream<proto::BidiReadObjectResponse>, Status> {
    let mut call = StreamCall::new(state, "BidiReadObject");
    call.delay().await;
    let first = match requests.message().await {
        Ok(Some(first)) => first,
        Ok(None) => {
            return Err(call.fail(Status::invalid_argument(
                "BidiReadObject needs a first message with read_object_spec",
            )));
        }
        Err(status) => return Err(call.abandoned(status)),
    };
    let spec = match first.read_object_spec {
        Some(spec) => spec,
        None => {
            return Err(call.fail(Status::invalid_argument(
                "the first BidiReadObject message must carry read_object_spec",
            )));
        }
    };
    call.set_bucket(&spec.bucket);
    let preconditions = Preconditions {
        if_generation_match: spec.if_generation_match,
        if_generation_not_match: spec.if_generation_not_match,
        if_metageneration_match: spec.if_metageneration_match,
        if_metageneration_not_match: spec.if_metageneration_not_match,
    };
    let source = call
        .guarded(|state| {
            state.read_source(&spec.bucket, &spec.object, spec.generation, preconditions)
        })
        .map_err(|status| call.fail(status))?;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(serve_bidi_read(
        call,
        requests,
        tx,
        source,
        first.read_ranges,
    ));
    Ok(ReceiverStream::new(rx))
}

async fn serve_bidi_read(
    mut call: StreamCall,
    mut requests: Streaming<proto::BidiReadObjectRequest>,
    tx: mpsc::Sender<Result<proto::BidiReadObjectResponse, Status>>,
    source: ReadSource,
    mut ranges: Vec<proto::ReadRange>,
) {
    let handle = read_handle(&source.object);
    let opening = proto::BidiReadObjectResponse {
        object_data_ranges: Vec::new(),
        metadata: Some(source.object.clone()),
        read_handle: Some(handle),
    };
    if !call.send(&tx, opening).await {
        return;
    }
    loop {
        for range in ranges.drain(..) {
            match serve_range(&mut call, &tx, &source, range).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(status) => {
                    let status = call.fail(status);
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
        }
        match requests.message().await {
            Ok(Some(request)) if request.read_object_spec.is_some() => {
                let status = call.fail(Status::invalid_argument(
                    "only the first BidiReadObject message may carry read_object_spec",
                ));
                let _ = tx.send(Err(status)).await;
                return;
            }
            Ok(Some(request)) => ranges = request.read_ranges,
            Ok(None) if client_gone(&tx).await => {
                call.finish(Code::Cancelled, true);
                return;
            }
            Ok(None) => break,
            Err(status) => {
                call.abandoned(status);
                return;
            }
        }
    }
    call.finish(Code::Ok, false);
}

/// Sends the data of one requested range; false when the client went away.
async fn serve_range(
    call: &mut StreamCall,
    tx: &mpsc::Sender<Result<proto::BidiReadObjectResponse, Status>>,
    source: &ReadSource,
    range: proto::ReadRange,
) -> Result<bool, Status> {
    let (start, end) = source.range(range.read_offset, range.read_length)?;
    let mut pieces = source.content.pieces(start, end, MAX_READ_CHUNK);
    if pieces.is_empty() {
        pieces.push((start, Vec::new()));
    }
    let count = pieces.len();
    for (index, (offset, piece)) in pieces.into_iter().enumerate() {
        let data = checksummed(&piece);
        let len = size_i64(data.content.len() as u64);
        let data = proto::ObjectRangeData {
            checksummed_data: Some(data),
            read_range: Some(proto::ReadRange {
                read_offset: size_i64(offset),
                read_length: len,
                read_id: range.read_id,
            }),
            range_end: index + 1 == count,
        };
        let response = proto::BidiReadObjectResponse {
            object_data_ranges: vec![data],
            metadata: None,
            read_handle: None,
        };
        if !call.send(tx, response).await {
            return Ok(false);
        }
    }
    Ok(true)
}

/// An opaque handle naming the generation a bidi read opened.
fn read_handle(object: &proto::Object) -> proto::BidiReadHandle {
    let bucket = parse_bucket_name(&object.bucket).unwrap_or(&object.bucket);
    proto::BidiReadHandle {
        handle: format!("mock-read/{bucket}/{}#{}", object.name, object.generation).into_bytes(),
    }
}

/// The data of the live object `name` in bucket `id`, for inspection.
pub(crate) fn live_content(state: &State, id: &str, name: &str) -> Option<Content> {
    let object = state
        .objects
        .get(id)?
        .iter()
        .find(|o| o.name == name && o.delete_time.is_none())?;
    state.contents.get(&object.generation).cloned()
}
