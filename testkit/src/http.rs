//! A small HTTP/1.1 client for loopback endpoints (probes, metrics, the
//! demo's sidecar), built on hyper's client.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `method path` with a JSON `body` to `addr` (host:port) and returns
/// the status and the body as text.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .with_context(|| format!("invalid request {method} {path}"))?;
    let response = tokio::time::timeout(TIMEOUT, client.request(request))
        .await
        .with_context(|| format!("{method} http://{addr}{path}: no answer within {TIMEOUT:?}"))?
        .with_context(|| format!("{method} http://{addr}{path}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .with_context(|| format!("{method} http://{addr}{path}: cannot read the body"))?
        .to_bytes();
    let text = String::from_utf8(body.to_vec())
        .with_context(|| format!("{method} http://{addr}{path}: the body is not UTF-8"))?;
    Ok((status, text))
}

/// `GET path` on `addr`.
pub async fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    request(addr, "GET", path, "").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_status_and_body_of_a_real_server() -> anyhow::Result<()> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await?;
            let mut seen = vec![0u8; 4096];
            let n = conn.read(&mut seen).await?;
            conn.write_all(b"HTTP/1.1 418 I'm a teapot\r\ncontent-length: 5\r\n\r\nshort")
                .await?;
            anyhow::Ok(String::from_utf8_lossy(&seen[..n]).into_owned())
        });
        let (status, body) = request(&addr, "POST", "/x?y=1", "{}").await?;
        assert_eq!((status, body.as_str()), (418, "short"));
        let seen = server.await??;
        assert!(seen.starts_with("POST /x?y=1 HTTP/1.1\r\n"), "{seen}");
        Ok(())
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_address() {
        let port = crate::free_port().expect("free port");
        let err = get(&format!("127.0.0.1:{port}"), "/healthz")
            .await
            .expect_err("nothing listens");
        assert!(format!("{err:#}").contains(&port.to_string()), "{err:#}");
    }
}
