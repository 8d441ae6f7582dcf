//! Differential test of the sidecar's multipart splitting (`multipart::split`
//! and `part_headers`, used for `multipart/mixed` batches, and
//! `upload::rewrite_related`, which finds the metadata part of a
//! `multipart/related` upload) against Python's standard `email` package,
//! an RFC 2046 parser: for generated bodies with
//! CRLF and bare-LF line ends mixed, preambles, epilogues, parts without
//! headers, and content lines that resemble delimiters (`--B--junk`,
//! `--Bjunk`, ` --B`, delimiters followed by blanks), both must see the same
//! parts with the same headers and content, so that the sidecar never
//! checks one set of nested requests while the upstream runs another.
//! Bodies the sidecar refuses (a part without the empty line that ends its
//! headers, on which RFC 2046 parsers disagree) forward nothing; the test
//! also checks that the framings real clients send are never refused.
//!
//! The Rust crates that parse multipart (multer) accept only CRLF framing,
//! while real clients send bare LF (the Python client's batches), so the
//! sidecar keeps its own splitter and this test holds it to a standard one.
//! Generated bodies are ASCII without lone CR (Python's `email` takes a lone
//! CR for a line end, Go's mime/multipart and GCS do not).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use bucketmap_sidecar::multipart::{part_headers, split};
use bucketmap_sidecar::upload::rewrite_related;
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};

/// Python's `email`, one long-lived process answering one line per case.
struct PythonEmail {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PythonEmail {
    fn start() -> PythonEmail {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/multipart/python_email_parts.py"
        );
        let mut child = Command::new(std::env::var("PYTHON").unwrap_or("python3".into()))
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 is required (the standard library's email package)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        PythonEmail {
            child,
            stdin,
            stdout,
        }
    }

    fn parts(&mut self, boundary: &str, body: &str) -> Value {
        let line = json!({ "boundary": boundary, "body": body }).to_string();
        writeln!(self.stdin, "{line}").expect("write to python");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("read from python");
        let answer: Value = serde_json::from_str(&answer).expect("python answers JSON");
        answer["parts"].clone()
    }
}

impl Drop for PythonEmail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sidecar's view, in the shape the Python script prints.
fn sidecar_parts(boundary: &str, body: &str) -> Value {
    let Some(parts) = split(body.as_bytes(), boundary) else {
        return Value::Null;
    };
    let parts: Vec<Value> = parts
        .into_iter()
        .map(|part| {
            let (headers, content) = part_headers(part);
            let headers: Vec<Value> = headers.into_iter().map(|(n, v)| json!([n, v])).collect();
            json!({ "headers": headers, "content": String::from_utf8_lossy(content) })
        })
        .collect();
    Value::Array(parts)
}

/// A content or preamble line, some of them close to a delimiter of `b`.
fn line(b: String) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z :]{0,12}",
        1 => Just(String::new()),
        1 => Just(format!("--{b}--junk")),
        1 => Just(format!("--{b}junk")),
        1 => Just(format!(" --{b}")),
        1 => Just(format!("x--{b}")),
        1 => Just(format!("--{b} \t")),
        1 => Just(format!("--{b}-")),
        1 => Just(format!("--{b}-- ")),
    ]
}

/// A multipart body with boundary `b` and the generated parts.
fn body(b: String) -> impl Strategy<Value = String> {
    let eol = prop_oneof![Just("\r\n"), Just("\n")];
    let header = prop_oneof![
        Just("Content-Type: application/http".to_owned()),
        "Content-ID: <[a-z0-9+]{1,6}>",
        "X-Test: [a-z ]{0,8}",
    ];
    let part = (
        prop::collection::vec((header, eol.clone()), 0..3),
        eol.clone(),
        prop::collection::vec((line(b.clone()), eol.clone()), 0..4),
    );
    (
        prop::collection::vec((line(b.clone()), eol.clone()), 0..2),
        prop::collection::vec(part, 1..4),
        eol.clone(),
        prop::collection::vec((line(b.clone()), eol), 0..2),
    )
        .prop_map(move |(preamble, parts, close_eol, epilogue)| {
            let mut out = String::new();
            for (l, e) in preamble {
                out.push_str(&format!("{l}{e}"));
            }
            for (headers, blank, content) in parts {
                out.push_str(&format!("--{b}{blank}"));
                for (h, e) in headers {
                    out.push_str(&format!("{h}{e}"));
                }
                out.push_str(blank);
                for (l, e) in content {
                    out.push_str(&format!("{l}{e}"));
                }
            }
            out.push_str(&format!("--{b}--{close_eol}"));
            for (l, e) in epilogue {
                out.push_str(&format!("{l}{e}"));
            }
            out
        })
}

fn case() -> impl Strategy<Value = (String, String)> {
    "[A-Za-z0-9'()+_,./:=?-]{0,15}[A-Za-z0-9]".prop_flat_map(|b| (Just(b.clone()), body(b)))
}

/// Generated cases a run holds to Python's `email`.
const CASES: u32 = 512;

/// Runs [`CASES`] generated framings through `check`, given what Python's
/// `email` reads and the case: `None` when the sidecar refused the body (a
/// refusal forwards nothing), else whether the two agree. Fails on the first
/// disagreement, and when the sidecar refused half of the cases or more: the
/// generated framings are mostly well formed, and a splitter that refused
/// them all would prove nothing.
fn against_python_email(check: impl Fn(&Value, &str, &str) -> Option<Result<(), String>>) {
    let python = std::cell::RefCell::new(PythonEmail::start());
    let refused = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |(boundary, body)| {
        let theirs = python.borrow_mut().parts(&boundary, &body);
        match check(&theirs, &boundary, &body) {
            None => refused.set(refused.get() + 1),
            Some(Err(why)) => {
                return Err(TestCaseError::fail(format!(
                    "boundary {boundary:?}, body {body:?}:\n{why}"
                )));
            }
            Some(Ok(())) => {}
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        refused.get() < CASES / 2,
        "the sidecar refused {} of {CASES} bodies",
        refused.get()
    );
}

#[test]
fn sidecar_and_python_email_see_the_same_parts() {
    against_python_email(|theirs, boundary, body| {
        let ours = sidecar_parts(boundary, body);
        if ours.is_null() {
            None
        } else if ours != *theirs {
            Some(Err(format!(" sidecar {ours}\n email   {theirs}")))
        } else {
            Some(Ok(()))
        }
    });
}

/// The metadata part `rewrite_related` hands to the rewriter, or `None`
/// when it refuses the body.
fn sidecar_metadata(boundary: &str, body: &str) -> Option<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let content_type = format!("multipart/related; boundary=\"{boundary}\"");
    let seen = std::cell::RefCell::new(None);
    let body = http_body_util::Full::new(Bytes::from(body.to_owned()));
    let result = runtime.block_on(rewrite_related(body, &content_type, 1 << 20, |part| {
        *seen.borrow_mut() = Some(String::from_utf8_lossy(part).into_owned());
        Ok(None)
    }));
    result.ok().and_then(|_| seen.into_inner())
}

/// `multipart/related` uploads: the metadata part the sidecar checks and
/// rewrites is the first part Python's email reads, whatever the framing.
#[test]
fn upload_metadata_is_the_part_python_email_reads_first() {
    against_python_email(|theirs, boundary, body| {
        let ours = sidecar_metadata(boundary, body)?;
        Some(if theirs[0]["content"].as_str() == Some(ours.as_str()) {
            Ok(())
        } else {
            Err(format!(" sidecar {ours:?}\n email   {theirs}"))
        })
    });
}

/// The framings real clients send, fixed, so a failure names one of them.
#[test]
fn known_framings_match_python_email() {
    let mut python = PythonEmail::start();
    let cases = [
        (
            "===1==",
            "--===1==\nContent-ID: <a+1>\n\nGET /x HTTP/1.1\n\n\n--===1==--",
        ),
        (
            "b",
            "--b\r\nContent-ID: <1>\r\n\r\nGET /x HTTP/1.1\r\n\r\n\r\n--b--\r\n",
        ),
        (
            "b",
            "preamble\r\n--b\r\n\r\nno headers\r\n--b--\r\nepilogue",
        ),
        ("b", "--b\r\n\r\none\r\n--b--junk\r\nstill one\r\n--b--\r\n"),
        ("b", "--b \t\r\n\r\none\r\n--b-- \r\n"),
    ];
    for (boundary, body) in cases {
        assert_eq!(
            sidecar_parts(boundary, body),
            python.parts(boundary, body),
            "boundary {boundary:?}, body {body:?}"
        );
    }
}
