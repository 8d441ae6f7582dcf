//! The in-process upstream: a hyper server answering as fast as it can.

use super::*;

pub(crate) struct Canned {
    pub(crate) addr: SocketAddr,
    pub(crate) big: u64,
    pub(crate) stream_size: u64,
    pub(crate) metadata: Bytes,
    pub(crate) chunk: Bytes,
}

impl Canned {
    /// An object resource shaped like GCS's (links on the upstream's address).
    pub(crate) fn object_json(&self, bucket: &str, name: &str, size: u64) -> String {
        let addr = self.addr;
        let generation = "1764417600000000";
        format!(
            concat!(
                r#"{{"kind":"storage#object","id":"{b}/{n}/{g}","#,
                r#""selfLink":"http://{a}/storage/v1/b/{b}/o/{n}","#,
                r#""mediaLink":"http://{a}/download/storage/v1/b/{b}/o/{n}?generation={g}&alt=media","#,
                r#""name":"{n}","bucket":"{b}","generation":"{g}","metageneration":"1","#,
                r#""contentType":"application/octet-stream","storageClass":"STANDARD","size":"{s}","#,
                r#""md5Hash":"XUFAKrxLKna5cZ2REBfFkg==","crc32c":"mnG7TA==","etag":"CIDg4pCOkJEDEAE=","#,
                r#""timeCreated":"2025-11-29T12:00:00.000Z","updated":"2025-11-29T12:00:00.000Z","#,
                r#""timeStorageClassUpdated":"2025-11-29T12:00:00.000Z"}}"#
            ),
            a = addr,
            b = bucket,
            n = name,
            g = generation,
            s = size,
        )
    }
}

pub(crate) fn json_response(body: impl Into<Bytes>) -> Response<BenchBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

pub(crate) fn status_response(status: StatusCode) -> Response<BenchBody> {
    let mut response = Response::new(empty());
    *response.status_mut() = status;
    response
}

pub(crate) fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

pub(crate) async fn upstream_handle(
    req: Request<Incoming>,
    canned: Arc<Canned>,
) -> Result<Response<BenchBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let media = query_param(query.as_deref(), "alt") == Some("media");
    if req.method() == Method::POST && path.starts_with("/upload/storage/v1/b/") {
        let bucket = path["/upload/storage/v1/b/".len()..]
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let name = query_param(query.as_deref(), "name")
            .unwrap_or("object")
            .to_owned();
        let mut body = req.into_body();
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        received += data.len() as u64;
                    }
                }
                Err(_) => return Ok(status_response(StatusCode::BAD_REQUEST)),
            }
        }
        return Ok(json_response(canned.object_json(&bucket, &name, received)));
    }
    if req.method() == Method::GET && path.starts_with("/storage/v1/b/") {
        if !media {
            return Ok(json_response(canned.metadata.clone()));
        }
        let size = if path.ends_with("/o/big") {
            canned.big
        } else {
            canned.stream_size
        };
        let mut response = Response::new(Generated::new(size, &canned.chunk).boxed());
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
        return Ok(response);
    }
    Ok(other_response(req.method(), &path))
}

/// What the upstream answers besides metadata and transfers, for the
/// training run's mix ([`train`]): an XML listing of the bucket, or GCS's
/// JSON error document, both naming the physical bucket as GCS would.
fn other_response(method: &Method, path: &str) -> Response<BenchBody> {
    if method == Method::GET && path.strip_prefix('/') == Some(PHYSICAL) {
        let listing = format!(
            concat!(
                r#"<?xml version="1.0" encoding="UTF-8"?>"#,
                r#"<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">"#,
                "<Name>{b}</Name><Prefix>a</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>",
                "<IsTruncated>false</IsTruncated><Contents><Key>a1</Key><Size>5</Size></Contents>",
                "</ListBucketResult>"
            ),
            b = PHYSICAL
        );
        let mut response = Response::new(Full::new(Bytes::from(listing)).boxed());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/xml; charset=UTF-8"),
        );
        return response;
    }
    let message = format!("No such object: {PHYSICAL}/y");
    let mut response = json_response(
        serde_json::json!({"error": {"code": 404, "message": message,
            "errors": [{"message": message, "domain": "global", "reason": "notFound"}]}})
        .to_string(),
    );
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Starts the in-process upstream on its own thread and runtime: plain
/// HTTP/1.1, or with `tls` HTTP/1.1 and HTTP/2 chosen by ALPN, as GCS.
pub(crate) fn start_in_process_upstream(
    settings: &Settings,
    chunk: &Bytes,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<SocketAddr> {
    let listener = StdTcpListener::bind("127.0.0.1:0").context("cannot bind the upstream")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let mut canned = Canned {
        addr,
        big: settings.big,
        stream_size: settings.stream_size,
        metadata: Bytes::new(),
        chunk: chunk.clone(),
    };
    canned.metadata = canned.object_json(PHYSICAL, "x", 595).into();
    let canned = Arc::new(canned);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("upstream runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("upstream listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve_upstream(stream, canned.clone(), acceptor.clone()));
                }
            });
        })
        .context("cannot start the upstream thread")?;
    Ok(addr)
}

/// Serves one upstream connection.
async fn serve_upstream(
    stream: tokio::net::TcpStream,
    canned: Arc<Canned>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) {
    let service = service_fn(move |req| upstream_handle(req, canned.clone()));
    match acceptor {
        None => {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
        Some(acceptor) => {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    }
}
