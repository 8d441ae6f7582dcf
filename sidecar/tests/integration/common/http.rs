//! A deliberately small HTTP/1.1 client over `std::net::TcpStream`.
//!
//! The tests need to send requests that well-behaved clients refuse to build
//! (invalid percent-encodings, odd `Host` headers, raw request targets) and to
//! stream a body slowly across a map reload, so they write the bytes
//! themselves. Every request is `Connection: close`; the response is read to
//! the end of the stream.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// How long a test waits for any single response before calling it a hang.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The request target exactly as sent (already percent-encoded).
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, target: impl Into<String>) -> Self {
        Self {
            method: method.to_owned(),
            target: target.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn get(target: impl Into<String>) -> Self {
        Self::new("GET", target)
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    pub fn json(self, value: &serde_json::Value) -> Self {
        self.header("Content-Type", "application/json")
            .body(value.to_string())
    }

    /// The request head; `Host` defaults to `addr` unless set explicitly.
    fn head(&self, addr: SocketAddr) -> String {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            head.push_str(&format!("Host: {addr}\r\n"));
        }
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        head.push_str("Connection: close\r\n\r\n");
        head
    }

    pub fn send(&self, addr: SocketAddr) -> Result<Response> {
        self.send_paced(addr, 0, Duration::ZERO)
    }

    /// Send the body in `pieces` writes with `pause` between them, so the
    /// request stays in flight for about `pieces * pause`. Sending stops
    /// once an answer starts to arrive: the sidecar answers a write it cut
    /// off without reading the rest of the body.
    pub fn send_paced(&self, addr: SocketAddr, pieces: usize, pause: Duration) -> Result<Response> {
        let what = format!("{} {} to {addr}", self.method, self.target);
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .with_context(|| format!("cannot connect for {what}"))?;
        stream.set_read_timeout(Some(RESPONSE_TIMEOUT))?;
        stream.set_write_timeout(Some(RESPONSE_TIMEOUT))?;
        stream.set_nodelay(true)?;
        stream
            .write_all(self.head(addr).as_bytes())
            .with_context(|| format!("cannot send {what}"))?;
        if pieces <= 1 {
            stream
                .write_all(&self.body)
                .with_context(|| format!("cannot send the body of {what}"))?;
        } else {
            let size = self.body.len().div_ceil(pieces).max(1);
            for piece in self.body.chunks(size) {
                if answered(&stream)? {
                    break;
                }
                if let Err(e) = stream.write_all(piece) {
                    // Answered and closed while the body was on its way:
                    // the answer is what counts, if there is one.
                    let mut raw = Vec::new();
                    let _ = read_to_end_tolerant(&mut stream, &mut raw);
                    if raw.is_empty() {
                        return Err(e).with_context(|| format!("cannot send the body of {what}"));
                    }
                    return parse_response(&raw, false)
                        .with_context(|| format!("bad response to {what}"));
                }
                thread::sleep(pause);
            }
        }
        let mut raw = Vec::new();
        read_to_end_tolerant(&mut stream, &mut raw)
            .with_context(|| format!("no complete response to {what}"))?;
        parse_response(&raw, self.method == "HEAD")
            .with_context(|| format!("bad response to {what}"))
    }
}

/// Whether the answer to a request on `stream` has started to arrive.
fn answered(stream: &TcpStream) -> Result<bool> {
    stream.set_nonblocking(true)?;
    let peeked = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false)?;
    Ok(matches!(peeked, Ok(n) if n > 0))
}

/// GET `target` and read the response slowly (`piece` bytes, then `pause`),
/// so the response stays in flight for a while. Returns the whole response.
pub fn get_slowly(
    addr: SocketAddr,
    target: &str,
    piece: usize,
    pause: Duration,
) -> Result<Response> {
    let req = Request::get(target);
    let what = format!("GET {target} to {addr}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("cannot connect for {what}"))?;
    stream.set_read_timeout(Some(RESPONSE_TIMEOUT))?;
    stream
        .write_all(req.head(addr).as_bytes())
        .with_context(|| format!("cannot send {what}"))?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; piece.max(1)];
    loop {
        let n = stream
            .read(&mut buf)
            .with_context(|| format!("reading the response to {what}"))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        thread::sleep(pause);
    }
    parse_response(&raw, false).with_context(|| format!("bad response to {what}"))
}

/// Read until EOF; a reset after some bytes arrived still yields what came.
fn read_to_end_tolerant(stream: &mut TcpStream, out: &mut Vec<u8>) -> Result<()> {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn parse_response(raw: &[u8], head_only: bool) -> Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            anyhow!(
                "no end of headers in {} bytes: {:?}",
                raw.len(),
                String::from_utf8_lossy(raw)
            )
        })?;
    let head = std::str::from_utf8(&raw[..end]).context("response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let body = if head_only || status == 204 || status == 304 {
        Vec::new()
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = find("content-length") {
        let len: usize = len
            .parse()
            .with_context(|| format!("bad Content-Length {len:?}"))?;
        if rest.len() < len {
            bail!("body cut short: {} of {len} bytes", rest.len());
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("chunked body cut short"))?;
        let size_text = std::str::from_utf8(&data[..line_end])?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("chunk cut short");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("status {} body is not JSON: {}", self.status, self.text()))
    }

    /// `status` and the start of the body, for failure messages.
    pub fn summary(&self) -> String {
        let text = self.text();
        let cut: String = text.chars().take(400).collect();
        format!("{} {}", self.status, cut)
    }
}

/// Percent-encode everything but RFC 3986 unreserved characters, the way the
/// client libraries encode object names in JSON API paths.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
