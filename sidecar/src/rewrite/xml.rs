//! XML API documents: `ListBucketResult/Name`, `ListAllMyBucketsResult`
//! bucket names, `Bucket` elements of the multipart-upload results,
//! `Location`, `LogBucket`, and the text of `Error/Message|Details`.
//! Everything else (keys, prefixes, attributes) is copied as it is.

use quick_xml::Reader;
use quick_xml::Writer;
use quick_xml::events::{BytesText, Event};

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

/// Rewrites an XML body. Returns `Ok(None)` when it is not well-formed XML
/// (it is then forwarded untouched).
pub fn rewrite_xml(input: &[u8], tr: &Translator<'_>) -> Result<Option<Vec<u8>>, ApiError> {
    let mut reader = Reader::from_reader(input);
    let mut rw = Rewriter {
        tr,
        writer: Writer::new(Vec::with_capacity(input.len() + 64)),
        held: None,
    };
    let mut stack: Vec<String> = Vec::new();
    let mut capture: Option<Capture> = None;
    let filter_listing = tr.direction == Direction::ToLogical && !tr.shows_unmapped();
    loop {
        let event = match reader.read_event() {
            Ok(Event::Eof) => break,
            Ok(event) => event,
            Err(_) => return Ok(None),
        };
        let written = match event {
            Event::Start(start) => {
                let name = String::from_utf8_lossy(start.local_name().as_ref()).into_owned();
                if let Some(cap) = capture.take() {
                    // Not a leaf after all: put its text back unchanged.
                    if rw
                        .emit(Event::Text(BytesText::from_escaped(cap.raw)))
                        .is_err()
                    {
                        return Ok(None);
                    }
                }
                let entry = filter_listing
                    && name == "Bucket"
                    && stack.last().map(String::as_str) == Some("Buckets")
                    && rw.held.is_none();
                if entry {
                    rw.held = Some(Held {
                        depth: stack.len(),
                        events: Vec::new(),
                        mapped: false,
                    });
                }
                if let Some(leaf) = leaf_kind(&stack, &name) {
                    capture = Some(Capture {
                        leaf,
                        depth: stack.len(),
                        raw: String::new(),
                    });
                }
                stack.push(name);
                rw.emit(Event::Start(start))
            }
            Event::Text(text) if capture.is_some() => {
                if let Some(cap) = &mut capture {
                    cap.raw
                        .push_str(&String::from_utf8_lossy(&text.into_inner()));
                }
                Ok(())
            }
            Event::GeneralRef(reference) if capture.is_some() => {
                if let Some(cap) = &mut capture {
                    cap.raw.push('&');
                    cap.raw.push_str(&String::from_utf8_lossy(&reference));
                    cap.raw.push(';');
                }
                Ok(())
            }
            Event::CData(cdata) if capture.is_some() => {
                if let Some(cap) = &mut capture {
                    let content = String::from_utf8_lossy(&cdata.into_inner()).into_owned();
                    cap.raw
                        .push_str(&quick_xml::escape::escape(content.as_str()));
                }
                Ok(())
            }
            Event::End(end) => {
                let depth = stack.len().saturating_sub(1);
                if let Some(cap) = capture.take_if(|c| c.depth == depth) {
                    let Ok(text) = quick_xml::escape::unescape(&cap.raw) else {
                        return Ok(None);
                    };
                    let new = rw.translate(cap.leaf, &text)?;
                    let escaped = quick_xml::escape::escape(new.as_str()).into_owned();
                    if rw
                        .emit(Event::Text(BytesText::from_escaped(escaped)))
                        .is_err()
                    {
                        return Ok(None);
                    }
                }
                stack.pop();
                let result = rw.emit(Event::End(end));
                if rw.held.as_ref().is_some_and(|h| h.depth == stack.len())
                    && let Some(held) = rw.held.take()
                    && held.mapped
                {
                    for event in held.events {
                        if rw.writer.write_event(event).is_err() {
                            return Ok(None);
                        }
                    }
                }
                result
            }
            other => rw.emit(other),
        };
        if written.is_err() {
            return Ok(None);
        }
    }
    if !stack.is_empty() {
        return Ok(None);
    }
    Ok(Some(rw.writer.into_inner()))
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
