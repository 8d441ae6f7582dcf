//! XML API documents: `ListBucketResult/Name`, `ListAllMyBucketsResult`
//! bucket names, `Bucket` elements of the multipart-upload results,
//! `Location`, `LogBucket`, and the text of `Error/Message|Details`.
//! Everything else (keys, prefixes, attributes) is copied as it is.

use quick_xml::Reader;
use quick_xml::Writer;
use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};

use super::text::replace_bucket_tokens;
use super::url::rewrite_url;
use super::{Direction, Translator};
use crate::errors::ApiError;

/// What a leaf element's text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leaf {
    /// A bucket name that the request must be allowed to use.
    Bucket,
    /// The name of a bucket in `ListAllMyBucketsResult`.
    ListedBucket,
    Url,
    Message,
}

fn leaf_kind(stack: &[String], name: &str) -> Option<Leaf> {
    let parent = stack.last().map(String::as_str);
    let grandparent = stack
        .len()
        .checked_sub(2)
        .and_then(|i| stack.get(i))
        .map(String::as_str);
    match (grandparent, parent, name) {
        (_, Some("ListBucketResult"), "Name") => Some(Leaf::Bucket),
        (Some("Buckets"), Some("Bucket"), "Name") => Some(Leaf::ListedBucket),
        (_, Some("Buckets"), "Bucket") => None,
        (_, _, "Bucket" | "LogBucket" | "TargetBucket" | "BucketName") => Some(Leaf::Bucket),
        (_, _, "Location") => Some(Leaf::Url),
        (_, Some("Error"), "Message" | "Details") => Some(Leaf::Message),
        _ => None,
    }
}

struct Capture {
    leaf: Leaf,
    depth: usize,
    raw: String,
}

/// A `<Bucket>` entry of `ListAllMyBucketsResult`, held back until we know
/// whether it is one of the app's buckets.
struct Held {
    depth: usize,
    events: Vec<Event<'static>>,
    mapped: bool,
}

struct Rewriter<'t, 'a> {
    tr: &'t Translator<'a>,
    writer: Writer<Vec<u8>>,
    held: Option<Held>,
    /// Local names of the open elements, outermost first.
    stack: Vec<String>,
    /// The leaf element whose text is being collected.
    capture: Option<Capture>,
    /// Hide the `ListAllMyBucketsResult` entries the mapping does not know.
    filter_listing: bool,
}

/// Why rewriting stopped before the end of the document.
enum Stop {
    /// Not well-formed XML, or not writable back: the body is forwarded untouched.
    Malformed,
    /// A bucket name the request may not use.
    Refused(ApiError),
}

impl From<ApiError> for Stop {
    fn from(error: ApiError) -> Self {
        Stop::Refused(error)
    }
}

impl From<std::io::Error> for Stop {
    fn from(_: std::io::Error) -> Self {
        Stop::Malformed
    }
}

impl Rewriter<'_, '_> {
    fn emit(&mut self, event: Event<'_>) -> std::io::Result<()> {
        match &mut self.held {
            Some(held) => {
                held.events.push(event.into_owned());
                Ok(())
            }
            None => self.writer.write_event(event),
        }
    }

    fn translate(&mut self, leaf: Leaf, text: &str) -> Result<String, ApiError> {
        let tr = self.tr;
        let trimmed = text.trim();
        Ok(match leaf {
            Leaf::Bucket | Leaf::ListedBucket if trimmed.is_empty() => text.to_owned(),
            Leaf::Bucket => tr.bucket(trimmed)?.unwrap_or_else(|| text.to_owned()),
            Leaf::ListedBucket => match tr.bucket(trimmed)? {
                Some(new) => {
                    if let Some(held) = &mut self.held {
                        held.mapped = true;
                    }
                    new
                }
                None => text.to_owned(),
            },
            Leaf::Url => rewrite_url(trimmed, tr).unwrap_or_else(|| text.to_owned()),
            Leaf::Message if tr.direction == Direction::ToLogical => {
                replace_bucket_tokens(text, |n| tr.bucket_lenient(n)).into_owned()
            }
            Leaf::Message => text.to_owned(),
        })
    }
}

/// Rewrites an XML body. Returns `Ok(None)` when it is not well-formed XML:
/// a request is then refused, a response answered as one that cannot be read
/// (neither is forwarded as it came).
pub fn rewrite_xml(input: &[u8], tr: &Translator<'_>) -> Result<Option<Vec<u8>>, ApiError> {
    let mut reader = Reader::from_reader(input);
    let mut rw = Rewriter {
        tr,
        writer: Writer::new(Vec::with_capacity(input.len() + 64)),
        held: None,
        stack: Vec::new(),
        capture: None,
        filter_listing: tr.direction == Direction::ToLogical && !tr.shows_unmapped(),
    };
    loop {
        let event = match reader.read_event() {
            Ok(Event::Eof) => break,
            Ok(event) => event,
            Err(_) => return Ok(None),
        };
        match rw.event(event) {
            Ok(()) => {}
            Err(Stop::Malformed) => return Ok(None),
            Err(Stop::Refused(error)) => return Err(error),
        }
    }
    if !rw.stack.is_empty() {
        return Ok(None);
    }
    Ok(Some(rw.writer.into_inner()))
}

impl Rewriter<'_, '_> {
    /// Handles one event: a leaf's text is collected until its end tag, the
    /// rest is written (or held) as it is.
    fn event(&mut self, event: Event<'_>) -> Result<(), Stop> {
        match event {
            Event::Start(start) => self.start(start),
            Event::Text(text) if self.capture.is_some() => {
                if let Some(cap) = &mut self.capture {
                    cap.raw
                        .push_str(&String::from_utf8_lossy(&text.into_inner()));
                }
                Ok(())
            }
            Event::GeneralRef(reference) if self.capture.is_some() => {
                if let Some(cap) = &mut self.capture {
                    cap.raw.push('&');
                    cap.raw.push_str(&String::from_utf8_lossy(&reference));
                    cap.raw.push(';');
                }
                Ok(())
            }
            Event::CData(cdata) if self.capture.is_some() => {
                if let Some(cap) = &mut self.capture {
                    let content = String::from_utf8_lossy(&cdata.into_inner()).into_owned();
                    cap.raw
                        .push_str(&quick_xml::escape::escape(content.as_str()));
                }
                Ok(())
            }
            Event::End(end) => self.end(end),
            other => Ok(self.emit(other)?),
        }
    }

    /// A start tag: starts holding a listing entry or capturing a leaf.
    fn start(&mut self, start: BytesStart<'_>) -> Result<(), Stop> {
        let name = String::from_utf8_lossy(start.local_name().as_ref()).into_owned();
        if let Some(cap) = self.capture.take() {
            // Not a leaf after all: put its text back unchanged.
            self.emit(Event::Text(BytesText::from_escaped(cap.raw)))?;
        }
        let entry = self.filter_listing
            && name == "Bucket"
            && self.stack.last().map(String::as_str) == Some("Buckets")
            && self.held.is_none();
        if entry {
            self.held = Some(Held {
                depth: self.stack.len(),
                events: Vec::new(),
                mapped: false,
            });
        }
        if let Some(leaf) = leaf_kind(&self.stack, &name) {
            self.capture = Some(Capture {
                leaf,
                depth: self.stack.len(),
                raw: String::new(),
            });
        }
        self.stack.push(name);
        Ok(self.emit(Event::Start(start))?)
    }

    /// An end tag: writes a captured leaf's translated text, and releases a
    /// held listing entry (kept only when the mapping knows its bucket).
    fn end(&mut self, end: BytesEnd<'_>) -> Result<(), Stop> {
        let depth = self.stack.len().saturating_sub(1);
        if let Some(cap) = self.capture.take_if(|c| c.depth == depth) {
            let text = quick_xml::escape::unescape(&cap.raw).map_err(|_| Stop::Malformed)?;
            let new = self.translate(cap.leaf, &text)?;
            let escaped = quick_xml::escape::escape(new.as_str()).into_owned();
            self.emit(Event::Text(BytesText::from_escaped(escaped)))?;
        }
        self.stack.pop();
        let result = self.emit(Event::End(end));
        if self
            .held
            .as_ref()
            .is_some_and(|h| h.depth == self.stack.len())
            && let Some(held) = self.held.take()
            && held.mapped
        {
            for event in held.events {
                self.writer.write_event(event)?;
            }
        }
        Ok(result?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::LinkBase;
    use super::super::testing::*;
    use super::*;

    fn run(
        input: &str,
        links: &LinkBase,
        direction: Direction,
    ) -> Result<Option<String>, ApiError> {
        let m = mapping();
        let tr = translator(&m, links, direction);
        Ok(rewrite_xml(input.as_bytes(), &tr)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    #[test]
    fn list_bucket_result_names_the_logical_bucket_and_keeps_keys() {
        let input = "<?xml version='1.0' encoding='UTF-8'?><ListBucketResult xmlns='http://doc.s3.amazonaws.com/2006-03-01'>\
            <Name>photos-k3x9q2mw</Name><Prefix></Prefix><Contents><Key>photos-k3x9q2mw/a&amp;b</Key></Contents></ListBucketResult>";
        let out = run(input, &sidecar_base(), Direction::ToLogical)
            .ok()
            .flatten()
            .unwrap_or_default();
        assert!(out.contains("<Name>photos</Name>"), "{out}");
        assert!(out.contains("<Key>photos-k3x9q2mw/a&amp;b</Key>"), "{out}");
        assert!(
            out.starts_with("<?xml version='1.0' encoding='UTF-8'?>"),
            "{out}"
        );
    }

    #[test]
    fn multipart_results_and_errors() {
        let input = "<CompleteMultipartUploadResult><Location>https://storage.googleapis.com/photos-k3x9q2mw/k</Location>\
            <Bucket>photos-k3x9q2mw</Bucket><Key>k</Key><ETag>\"x\"</ETag></CompleteMultipartUploadResult>";
        let out = run(input, &sidecar_base(), Direction::ToLogical)
            .ok()
            .flatten()
            .unwrap_or_default();
        assert!(
            out.contains("<Location>http://127.0.0.1:9023/photos/k</Location>"),
            "{out}"
        );
        assert!(out.contains("<Bucket>photos</Bucket>"), "{out}");

        let error = "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>\
            <Details>No such object: photos-k3x9q2mw/photos-k3x9q2mw</Details></Error>";
        let out = run(error, &sidecar_base(), Direction::ToLogical)
            .ok()
            .flatten()
            .unwrap_or_default();
        assert!(
            out.contains("<Details>No such object: photos/photos</Details>"),
            "{out}"
        );
    }

    #[test]
    fn bucket_listing_hides_unmapped_buckets() {
        let input = "<ListAllMyBucketsResult><Owner><ID>1</ID></Owner><Buckets>\
            <Bucket><Name>someone-else</Name><CreationDate>d</CreationDate></Bucket>\
            <Bucket><Name>logs-aaaa1111</Name><CreationDate>d</CreationDate></Bucket>\
            </Buckets></ListAllMyBucketsResult>";
        let out = run(input, &sidecar_base(), Direction::ToLogical)
            .ok()
            .flatten()
            .unwrap_or_default();
        assert_eq!(
            out,
            "<ListAllMyBucketsResult><Owner><ID>1</ID></Owner><Buckets>\
             <Bucket><Name>logs</Name><CreationDate>d</CreationDate></Bucket>\
             </Buckets></ListAllMyBucketsResult>"
        );
    }

    #[test]
    fn logging_request_is_translated_strictly() {
        let input = "<Logging><LogBucket>logs</LogBucket><LogObjectPrefix>photos</LogObjectPrefix></Logging>";
        let out = run(input, &upstream_base(), Direction::ToPhysical)
            .ok()
            .flatten()
            .unwrap_or_default();
        assert!(
            out.contains(
                "<LogBucket>logs-aaaa1111</LogBucket><LogObjectPrefix>photos</LogObjectPrefix>"
            ),
            "{out}"
        );
        let bad = "<Logging><LogBucket>elsewhere</LogBucket></Logging>";
        assert_eq!(
            run(bad, &upstream_base(), Direction::ToPhysical).map_err(|e| e.status.as_u16()),
            Err(404)
        );
    }

    #[test]
    fn malformed_xml_is_left_alone() {
        assert_eq!(
            run("<a><b></a>", &sidecar_base(), Direction::ToLogical).ok(),
            Some(None)
        );
        assert_eq!(
            run("<a>", &sidecar_base(), Direction::ToLogical).ok(),
            Some(None)
        );
    }
}
