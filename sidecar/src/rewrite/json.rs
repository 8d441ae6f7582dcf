//! JSON API documents: the structured fields that carry bucket names, by
//! resource kind. Nothing else is touched; object names never are.

use serde_json::{Map, Value};

use super::text::replace_bucket_tokens;
use super::url::rewrite_url;
use super::{Direction, Translator};
use crate::errors::ApiError;
use crate::route::Resource;

/// Rewrites a JSON body. Returns `Ok(None)` when the body is empty or not
/// JSON (it is then forwarded untouched), `Err` when a request names a bucket
/// it may not use.
pub fn rewrite_json_bytes(
    body: &[u8],
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<Option<Vec<u8>>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let Ok(mut doc) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    rewrite_document(&mut doc, hint, tr)?;
    Ok(serde_json::to_vec(&doc).ok())
}

/// Rewrites a parsed document: an error document or a resource.
pub fn rewrite_document(
    doc: &mut Value,
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    if let Some(Value::Object(error)) = doc.get_mut("error") {
        if tr.direction == Direction::ToLogical {
            rewrite_error(error, tr);
        }
        return Ok(());
    }
    resource(doc, hint, tr)
}

fn kind_resource(kind: &str) -> Option<Resource> {
    Some(match kind {
        "storage#bucket" => Resource::Bucket,
        "storage#buckets" => Resource::Buckets,
        "storage#object" => Resource::Object,
        "storage#objects" => Resource::Objects,
        "storage#bucketAccessControl" | "storage#objectAccessControl" => Resource::Acl,
        "storage#bucketAccessControls" | "storage#objectAccessControls" => Resource::Acls,
        "storage#policy" => Resource::Policy,
        "storage#notification" => Resource::Notification,
        "storage#rewriteResponse" => Resource::RewriteResponse,
        "storage#composeRequest" => Resource::ComposeRequest,
        "storage#operation" => Resource::Operation,
        k if k.starts_with("storage#") => Resource::Generic,
        _ => return None,
    })
}

fn resource(value: &mut Value, hint: Resource, tr: &Translator<'_>) -> Result<(), ApiError> {
    let Value::Object(obj) = value else {
        return Ok(());
    };
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .and_then(kind_resource)
        .unwrap_or(hint);
    match kind {
        Resource::Buckets => {
            if tr.direction == Direction::ToLogical
                && !tr.shows_unmapped()
                && let Some(Value::Array(list)) = obj.get_mut("items")
            {
                // Buckets the mapping does not know are not this app's: hide them.
                list.retain(|b| {
                    b.get("name")
                        .and_then(Value::as_str)
                        .is_none_or(|n| tr.mapping.logical(n).is_some())
                });
            }
            items(obj, Resource::Bucket, tr)?;
        }
        Resource::Objects | Resource::Acls => {
            let item = if kind == Resource::Objects {
                Resource::Object
            } else {
                Resource::Acl
            };
            items(obj, item, tr)?;
        }
        Resource::Bucket => {
            strict(obj, "name", tr)?;
            lenient(obj, "id", tr);
            link(obj, "selfLink", tr);
            if let Some(Value::Object(logging)) = obj.get_mut("logging") {
                strict(logging, "logBucket", tr)?;
            }
            each(obj, "acl", Resource::Acl, tr)?;
            each(obj, "defaultObjectAcl", Resource::Acl, tr)?;
        }
        Resource::Object => {
            strict(obj, "bucket", tr)?;
            id_prefix(obj, "id", tr);
            link(obj, "selfLink", tr);
            link(obj, "mediaLink", tr);
            each(obj, "acl", Resource::Acl, tr)?;
        }
        Resource::Acl => {
            strict(obj, "bucket", tr)?;
            id_prefix(obj, "id", tr);
            link(obj, "selfLink", tr);
        }
        Resource::Policy => resource_name(obj, "resourceId", tr)?,
        Resource::Notification => {
            link(obj, "selfLink", tr);
            items(obj, Resource::Notification, tr)?;
        }
        Resource::RewriteResponse => {
            if let Some(res) = obj.get_mut("resource") {
                resource(res, Resource::Object, tr)?;
            }
        }
        Resource::ComposeRequest => {
            if let Some(dest) = obj.get_mut("destination") {
                resource(dest, Resource::Object, tr)?;
            }
        }
        Resource::Operation => {
            resource_name(obj, "name", tr)?;
            link(obj, "selfLink", tr);
        }
        Resource::Generic => {
            strict(obj, "bucket", tr)?;
            id_prefix(obj, "id", tr);
            link(obj, "selfLink", tr);
            link(obj, "mediaLink", tr);
            resource_name(obj, "resourceId", tr)?;
            items(obj, Resource::Generic, tr)?;
            if let Some(res) = obj.get_mut("resource") {
                resource(res, Resource::Generic, tr)?;
            }
        }
    }
    Ok(())
}

fn items(
    obj: &mut Map<String, Value>,
    item: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    each(obj, "items", item, tr)
}

fn each(
    obj: &mut Map<String, Value>,
    key: &str,
    item: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    if let Some(Value::Array(list)) = obj.get_mut(key) {
        for value in list {
            resource(value, item, tr)?;
        }
    }
    Ok(())
}

/// A field that names a bucket the request must be allowed to use.
fn strict(obj: &mut Map<String, Value>, key: &str, tr: &Translator<'_>) -> Result<(), ApiError> {
    if let Some(Value::String(name)) = obj.get_mut(key)
        && !name.is_empty()
        && let Some(new) = tr.bucket(name)?
    {
        *name = new;
    }
    Ok(())
}

/// A field equal to a bucket name, informational only.
fn lenient(obj: &mut Map<String, Value>, key: &str, tr: &Translator<'_>) {
    if let Some(Value::String(name)) = obj.get_mut(key)
        && let Some(new) = tr.bucket_lenient(name)
    {
        *name = new;
    }
}

/// An id whose first `/`-separated component is the bucket (`B/OBJECT/GEN`, `B/entity`).
fn id_prefix(obj: &mut Map<String, Value>, key: &str, tr: &Translator<'_>) {
    if let Some(Value::String(id)) = obj.get_mut(key) {
        let (bucket, rest) = id.split_at(id.find('/').unwrap_or(id.len()));
        if let Some(new) = tr.bucket_lenient(bucket) {
            *id = format!("{new}{rest}");
        }
    }
}

fn link(obj: &mut Map<String, Value>, key: &str, tr: &Translator<'_>) {
    if let Some(Value::String(url)) = obj.get_mut(key)
        && let Some(new) = rewrite_url(url, tr)
    {
        *url = new;
    }
}

/// A resource name `projects/_/buckets/B[/…]`.
fn resource_name(
    obj: &mut Map<String, Value>,
    key: &str,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    const PREFIX: &str = "projects/_/buckets/";
    if let Some(Value::String(name)) = obj.get_mut(key)
        && let Some(after) = name.strip_prefix(PREFIX)
    {
        let (bucket, rest) = after.split_at(after.find('/').unwrap_or(after.len()));
        if bucket.is_empty() {
            return Ok(());
        }
        if let Some(new) = tr.bucket(bucket)? {
            *name = format!("{PREFIX}{new}{rest}");
        }
    }
    Ok(())
}

fn rewrite_error(error: &mut Map<String, Value>, tr: &Translator<'_>) {
    let message = |text: &mut String| {
        let new = replace_bucket_tokens(text, |name| tr.bucket_lenient(name)).into_owned();
        *text = new;
    };
    if let Some(Value::String(text)) = error.get_mut("message") {
        message(text);
    }
    if let Some(Value::Array(errors)) = error.get_mut("errors") {
        for entry in errors {
            if let Some(Value::String(text)) = entry.get_mut("message") {
                message(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    use super::*;
    use serde_json::json;

    #[test]
    fn object_response_fields() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({
            "kind": "storage#object",
            "id": "photos-k3x9q2mw/photos-k3x9q2mw/a.jpg/17",
            "name": "photos-k3x9q2mw/a.jpg",
            "bucket": "photos-k3x9q2mw",
            "selfLink": "https://www.googleapis.com/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fa.jpg",
            "mediaLink": "https://storage.googleapis.com/download/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fa.jpg?generation=17&alt=media",
            "metadata": {"bucket": "photos-k3x9q2mw"},
            "acl": [{"kind": "storage#objectAccessControl", "bucket": "photos-k3x9q2mw", "id": "photos-k3x9q2mw/photos-k3x9q2mw/a.jpg/17/user-x"}],
        });
        rewrite_document(
            &mut doc,
            Resource::Object,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["bucket"], "photos");
        assert_eq!(
            doc["name"], "photos-k3x9q2mw/a.jpg",
            "object names are data"
        );
        assert_eq!(
            doc["metadata"]["bucket"], "photos-k3x9q2mw",
            "custom metadata is data"
        );
        assert_eq!(doc["id"], "photos/photos-k3x9q2mw/a.jpg/17");
        assert_eq!(
            doc["selfLink"],
            "http://127.0.0.1:9023/storage/v1/b/photos/o/photos-k3x9q2mw%2Fa.jpg"
        );
        assert_eq!(
            doc["mediaLink"],
            "http://127.0.0.1:9023/download/storage/v1/b/photos/o/photos-k3x9q2mw%2Fa.jpg?generation=17&alt=media"
        );
        assert_eq!(doc["acl"][0]["bucket"], "photos");
        assert_eq!(
            doc["acl"][0]["id"],
            "photos/photos-k3x9q2mw/a.jpg/17/user-x"
        );
    }

    #[test]
    fn bucket_list_hides_buckets_that_are_not_mapped() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({"kind": "storage#buckets", "items": [
            {"kind": "storage#bucket", "name": "photos-k3x9q2mw", "id": "photos-k3x9q2mw",
             "logging": {"logBucket": "logs-aaaa1111"}, "defaultObjectAcl": [{"bucket": "photos-k3x9q2mw"}]},
            {"kind": "storage#bucket", "name": "someone-elses", "id": "someone-elses"},
        ]});
        rewrite_document(
            &mut doc,
            Resource::Buckets,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(doc["items"][0]["name"], "photos");
        assert_eq!(doc["items"][0]["id"], "photos");
        assert_eq!(doc["items"][0]["logging"]["logBucket"], "logs");
        assert_eq!(doc["items"][0]["defaultObjectAcl"][0]["bucket"], "photos");
    }

    #[test]
    fn request_bodies_are_translated_strictly() {
        let (m, links) = (mapping(), upstream_base());
        let t = translator(&m, &links, Direction::ToPhysical);
        let mut compose = json!({"destination": {"bucket": "photos", "name": "x", "contentType": "a/b"}, "sourceObjects": [{"name": "photos"}]});
        rewrite_document(&mut compose, Resource::ComposeRequest, &t).expect("rewrites");
        assert_eq!(compose["destination"]["bucket"], "photos-k3x9q2mw");
        assert_eq!(compose["sourceObjects"][0]["name"], "photos");

        let mut policy = json!({"resourceId": "projects/_/buckets/photos", "bindings": [{"role": "r", "condition": {"expression": "photos"}}]});
        rewrite_document(&mut policy, Resource::Policy, &t).expect("rewrites");
        assert_eq!(policy["resourceId"], "projects/_/buckets/photos-k3x9q2mw");
        assert_eq!(policy["bindings"][0]["condition"]["expression"], "photos");

        let mut insert = json!({"name": "unmapped"});
        let err =
            rewrite_document(&mut insert, Resource::Bucket, &t).map_err(|e| e.status.as_u16());
        assert_eq!(err, Err(404));
        let mut physical = json!({"bucket": "logs-aaaa1111", "name": "o"});
        let err =
            rewrite_document(&mut physical, Resource::Object, &t).map_err(|e| e.status.as_u16());
        assert_eq!(err, Err(403));
    }

    #[test]
    fn error_messages_name_the_logical_bucket() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({"error": {"code": 404, "message": "No such object: photos-k3x9q2mw/a",
            "errors": [{"message": "No such object: photos-k3x9q2mw/a", "reason": "notFound"}]}});
        rewrite_document(
            &mut doc,
            Resource::Object,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["error"]["message"], "No such object: photos/a");
        assert_eq!(
            doc["error"]["errors"][0]["message"],
            "No such object: photos/a"
        );
    }

    #[test]
    fn non_json_and_empty_bodies_are_left_alone() {
        let (m, links) = (mapping(), sidecar_base());
        let t = translator(&m, &links, Direction::ToLogical);
        assert_eq!(
            rewrite_json_bytes(b"", Resource::Object, &t).ok(),
            Some(None)
        );
        assert_eq!(
            rewrite_json_bytes(b"not json", Resource::Object, &t).ok(),
            Some(None)
        );
        assert!(
            rewrite_json_bytes(b"{\"bucket\":\"photos-k3x9q2mw\"}", Resource::Object, &t)
                .ok()
                .flatten()
                .is_some()
        );
    }
}
