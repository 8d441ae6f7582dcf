//! Object calls of a move's copy: a page of a listing and one call of a
//! server-side rewrite.

use std::time::Instant;

use google_cloud_storage::model::{Object, RewriteResponse};

use super::{GcsClient, GcsResult, bucket_resource};

/// One page of a bucket's live objects, in name order, and the token of
/// the next page (empty after the last).
#[derive(Debug, Default)]
pub struct ObjectPage {
    /// The objects.
    pub objects: Vec<Object>,
    /// Where the next page starts; empty after the last.
    pub next: String,
}

/// One call of a rewrite of `source`'s live generation `generation` to the
/// same name in `destination`.
#[derive(Clone, Debug)]
pub struct RewriteCall<'a> {
    /// The source bucket.
    pub source: &'a str,
    /// The destination bucket.
    pub destination: &'a str,
    /// The object's name in both.
    pub name: &'a str,
    /// The source generation to copy; the call fails if it is gone.
    pub generation: i64,
    /// The destination's live generation the copy may replace (0: none).
    pub replaces: i64,
    /// The token of the previous call of this rewrite, empty for the first.
    pub token: &'a str,
    /// A cap on the bytes one call copies (0: GCS decides).
    pub max_bytes_per_call: i64,
    /// The copy's metadata, when not the source's (holds and retention,
    /// which GCS does not copy); the same at every call of a rewrite.
    pub metadata: Option<&'a Object>,
}

impl GcsClient {
    /// A page of `bucket`'s live objects from `token` (empty: the first).
    pub async fn list_object_page(
        &self,
        bucket: &str,
        token: &str,
        page_size: i32,
    ) -> GcsResult<ObjectPage> {
        let started = Instant::now();
        let result = self
            .control
            .list_objects()
            .set_parent(bucket_resource(bucket))
            .set_page_size(page_size)
            .set_page_token(token)
            .send()
            .await;
        let page = self.record("ListObjects", bucket, started, result)?;
        Ok(ObjectPage {
            objects: page.objects,
            next: page.next_page_token,
        })
    }

    /// One call of a rewrite, conditional on both generations: the source's
    /// must still be `generation` and the destination's still `replaces`.
    pub async fn rewrite_call(&self, call: &RewriteCall<'_>) -> GcsResult<RewriteResponse> {
        let started = Instant::now();
        let mut request = self
            .control
            .rewrite_object()
            .set_source_bucket(bucket_resource(call.source))
            .set_source_object(call.name)
            .set_source_generation(call.generation)
            .set_if_source_generation_match(call.generation)
            .set_destination_bucket(bucket_resource(call.destination))
            .set_destination_name(call.name)
            .set_if_generation_match(call.replaces)
            .set_rewrite_token(call.token);
        if let Some(metadata) = call.metadata {
            request = request.set_destination(metadata.clone());
        }
        if call.max_bytes_per_call > 0 {
            request = request.set_max_bytes_rewritten_per_call(call.max_bytes_per_call);
        }
        let result = request.send().await;
        self.record("RewriteObject", call.destination, started, result)
    }
}
