//! A bare gRPC client for the sidecar's streaming tests: the generated
//! tonic `StorageClient` over a plain hyper HTTP/2 (h2c) client.
//!
//! Not tonic's `Channel`: it enforces `grpc-timeout` itself and reports an
//! expired deadline as CANCELLED, so a test could not tell what the server
//! answered. Here the status is exactly the server's; dropping a response
//! (or a request stream's call) resets the HTTP/2 stream with CANCEL, as
//! every gRPC client does when it gives up.
//!
//! Also: the data the large transfers send and check (generated per chunk,
//! never held whole), the sidecar's peak RSS, and waiting for the mock to
//! log a call.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bucketmap_testkit::mock_gcs::{Call, MockHandle, proto};
use futures::Stream;
use http::Uri;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use proto::storage_client::StorageClient;
use proto::write_object_request::{Data, FirstMessage};

use super::scenario::pseudo_random;

pub const MIB: u64 = 1024 * 1024;
/// Bytes per data message, as the Go and Java clients send them.
pub const CHUNK: usize = 2 * MIB as usize;
/// Largest message the client accepts (a 2 MiB chunk plus its envelope).
const MAX_MESSAGE: usize = 8 * CHUNK;

/// The h2c transport under the generated client.
pub type Transport = HyperClient<HttpConnector, tonic::body::Body>;
/// The generated `google.storage.v2.Storage` client over [`Transport`].
pub type Client = StorageClient<Transport>;

/// A client of `endpoint` (`http://127.0.0.1:PORT`), HTTP/2 prior knowledge.
pub fn client(endpoint: &str) -> Result<Client> {
    let origin: Uri = endpoint
        .parse()
        .with_context(|| format!("bad gRPC endpoint {endpoint}"))?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let transport = HyperClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    Ok(StorageClient::with_origin(transport, origin)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// `projects/_/buckets/{id}`.
pub fn bucket_name(id: &str) -> String {
    format!("projects/_/buckets/{id}")
}

/// `message` with the routing header a Google client sends for `bucket`
/// (a bucket id, logical or physical) and, if given, a deadline.
pub fn request<T>(message: T, bucket: &str, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("bucket=projects%2F_%2Fbuckets%2F{bucket}");
    if let Ok(value) = value.parse() {
        request
            .metadata_mut()
            .insert("x-goog-request-params", value);
    }
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

/// Chunk `index` of the large objects' data (distinct per chunk).
pub fn chunk(index: u64) -> Vec<u8> {
    // The generator ignores the seed's lowest bit.
    pseudo_random(CHUNK, 0x5eed_0000 + 2 * index)
}

/// The WriteObject messages of a `size`-byte object `name` in `bucket` (the
/// name the client uses), generated as the transport asks for them: the
/// spec with the first chunk, then one chunk per message, `finish_write`
/// on the last.
pub fn write_messages(
    bucket: &str,
    name: &str,
    size: u64,
) -> impl Stream<Item = proto::WriteObjectRequest> + Send + 'static {
    let spec = proto::WriteObjectSpec {
        resource: Some(proto::Object {
            name: name.to_owned(),
            bucket: bucket_name(bucket),
            content_type: "application/octet-stream".to_owned(),
            ..Default::default()
        }),
        object_size: i64::try_from(size).ok(),
        ..Default::default()
    };
    let chunks = size.div_ceil(CHUNK as u64);
    futures::stream::iter((0..chunks).map(move |index| {
        let offset = index * CHUNK as u64;
        let mut content = chunk(index);
        content.truncate(usize::try_from(size - offset).unwrap_or(CHUNK).min(CHUNK));
        proto::WriteObjectRequest {
            write_offset: i64::try_from(offset).unwrap_or(i64::MAX),
            first_message: (index == 0).then(|| FirstMessage::WriteObjectSpec(spec.clone())),
            data: Some(Data::ChecksummedData(proto::ChecksummedData {
                content,
                crc32c: None,
            })),
            finish_write: index + 1 == chunks,
            ..Default::default()
        }
    }))
}

/// Checks received bytes against [`chunk`]s, whatever their framing.
#[derive(Debug, Default)]
pub struct Verifier {
    offset: u64,
    current: Option<(u64, Vec<u8>)>,
}

impl Verifier {
    /// Checks `data`, the bytes that follow those already fed.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let index = self.offset / CHUNK as u64;
            if self.current.as_ref().is_none_or(|(i, _)| *i != index) {
                self.current = Some((index, chunk(index)));
            }
            let Some((_, want)) = &self.current else {
                bail!("no expected chunk");
            };
            let at = usize::try_from(self.offset % CHUNK as u64)?;
            let n = data.len().min(CHUNK - at);
            if data[..n] != want[at..at + n] {
                let bad = (0..n).find(|&i| data[i] != want[at + i]).unwrap_or(0);
                bail!("the data differs at byte {}", self.offset + bad as u64);
            }
            self.offset += n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    /// How many bytes were checked.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// (`VmRSS`, `VmHWM`) of process `pid`, in KiB.
pub fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in {path}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The first call the mock logged that satisfies `wanted`, waiting up to
/// `timeout` for it (streams are logged when they end).
pub async fn wait_for_call(
    mock: &MockHandle,
    timeout: Duration,
    wanted: impl Fn(&Call) -> bool,
) -> Result<Call> {
    let deadline = Instant::now() + timeout;
    loop {
        let calls = mock.calls();
        if let Some(call) = calls.iter().find(|c| wanted(c)) {
            return Ok(call.clone());
        }
        if Instant::now() > deadline {
            bail!("no such call after {timeout:?}; the mock logged {calls:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parses a `grpc-timeout` value (`1500m`, `30S`, ...).
pub fn parse_grpc_timeout(value: &str) -> Result<Duration> {
    let (digits, unit) = value.split_at(value.len().saturating_sub(1));
    let n: u64 = digits
        .parse()
        .with_context(|| format!("bad grpc-timeout {value:?}"))?;
    Ok(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => bail!("bad grpc-timeout unit in {value:?}"),
    })
}
