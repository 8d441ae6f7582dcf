//! RewriteObject as GCS serves it, between any two buckets of the mock
//! (of one project or two).
//!
//! A copy that keeps the location and the storage class completes in one
//! call. A copy that changes either is done in steps: each call copies at
//! most `max_bytes_rewritten_per_call` bytes (which must be a multiple of
//! 1 MiB and applies to such copies only), or the mock's per-call size
//! ([`Rewrites::bytes_per_call`]) when the request sets none, and answers
//! `done: false` with a rewrite token until the last step. The
//! destination object appears at the last step only.
//!
//! A token stands for the first call's request, the source generation
//! that call found, and the bytes copied so far. A later call may leave
//! the request's other fields out (they are the first call's); a field it
//! sends must equal the first call's, else INVALID_ARGUMENT, as GCS
//! answers a token used with another request. Every call checks again
//! what the first one checked: the source preconditions, the destination
//! preconditions, that the destination may be replaced (no hold or
//! retention on it), and that the request still selects the source
//! generation the first call found. A source replaced or deleted since
//! answers NOT_FOUND (naming that generation when another replaced it),
//! and nothing is written; a request that names its source generation
//! goes on copying it while versioning keeps it.
//!
//! A token stays usable after the next one was handed out, as a token
//! that carries its own progress would: a client retrying a step whose
//! answer was lost repeats that step, and repeating the last step repeats
//! the completion, under the same destination preconditions.
//!
//! The call log and faults see a rewrite's calls under its destination
//! bucket and that bucket's project.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::Status;

use super::content::check_checksums;
use super::objects_grpc::{Preconditions, ReadSource, size_i64};
use super::proto;
use super::state::{State, parse_bucket_name};

/// The unit `max_bytes_rewritten_per_call` must be a multiple of.
const MIB: i64 = 1024 * 1024;

/// What one call copies of a rewrite that changes location or storage
/// class when the request sets no limit, unless a test sets another size.
const DEFAULT_BYTES_PER_CALL: u64 = 1024 * 1024;

/// The rewrite tokens handed out, and how much one call copies.
#[derive(Debug)]
pub(crate) struct Rewrites {
    tokens: HashMap<String, Progress>,
    last_token: u64,
    /// Bytes one call copies when the copy changes location or storage
    /// class and the request sets no `max_bytes_rewritten_per_call`;
    /// 0 copies such objects in one call.
    pub(crate) bytes_per_call: u64,
}

impl Default for Rewrites {
    fn default() -> Self {
        Self {
            tokens: HashMap::new(),
            last_token: 0,
            bytes_per_call: DEFAULT_BYTES_PER_CALL,
        }
    }
}

/// What one rewrite token stands for: a rewrite and how far it got.
#[derive(Debug, Clone)]
struct Progress {
    rewrite: Arc<Pinned>,
    rewritten: u64,
}

/// A rewrite as its first call fixed it.
#[derive(Debug)]
struct Pinned {
    /// The first call's request, without a token.
    request: proto::RewriteObjectRequest,
    /// The source generation the first call found.
    source_generation: i64,
}

impl Rewrites {
    /// The destination bucket of the rewrite `token` belongs to.
    pub(crate) fn destination_bucket(&self, token: &str) -> Option<String> {
        let progress = self.tokens.get(token)?;
        Some(progress.rewrite.request.destination_bucket.clone())
    }

    /// The request a call stands for, and the progress its token carries:
    /// a first call as sent; a later one completed by its token's request.
    fn resume(
        &self,
        request: proto::RewriteObjectRequest,
    ) -> Result<(proto::RewriteObjectRequest, Option<Progress>), Status> {
        if request.rewrite_token.is_empty() {
            return Ok((request, None));
        }
        let token = request.rewrite_token.clone();
        let progress = self.tokens.get(&token).ok_or_else(|| {
            Status::invalid_argument(format!("Invalid rewrite token {token:?}: no such rewrite"))
        })?;
        let first = &progress.rewrite.request;
        let completed = completed_from(first, request);
        if completed != *first {
            return Err(Status::invalid_argument(format!(
                "Invalid rewrite token {token:?}: it continues another rewrite; a call with a \
                 token must send the first call's source, destination and parameters, or leave \
                 them out"
            )));
        }
        Ok((completed, Some(progress.clone())))
    }

    /// A new token for `rewrite` having copied `rewritten` bytes.
    fn issue(&mut self, rewrite: Arc<Pinned>, rewritten: u64) -> String {
        self.last_token += 1;
        let token = format!("mock-rewrite-{}", self.last_token);
        let progress = Progress { rewrite, rewritten };
        self.tokens.insert(token.clone(), progress);
        token
    }
}

/// `later` with the fields it leaves out taken from `first`, and no token.
/// A field the protocol adds later is not taken: a call must then repeat
/// it exactly, or it is refused.
fn completed_from(
    first: &proto::RewriteObjectRequest,
    mut later: proto::RewriteObjectRequest,
) -> proto::RewriteObjectRequest {
    fn fill<T: Clone + Default + PartialEq>(field: &mut T, first: &T) {
        if *field == T::default() {
            field.clone_from(first);
        }
    }
    let r = &mut later;
    r.rewrite_token.clear();
    fill(&mut r.destination_name, &first.destination_name);
    fill(&mut r.destination_bucket, &first.destination_bucket);
    fill(&mut r.destination_kms_key, &first.destination_kms_key);
    fill(&mut r.destination, &first.destination);
    fill(&mut r.source_bucket, &first.source_bucket);
    fill(&mut r.source_object, &first.source_object);
    fill(&mut r.source_generation, &first.source_generation);
    fill(
        &mut r.destination_predefined_acl,
        &first.destination_predefined_acl,
    );
    fill(&mut r.if_generation_match, &first.if_generation_match);
    fill(
        &mut r.if_generation_not_match,
        &first.if_generation_not_match,
    );
    fill(
        &mut r.if_metageneration_match,
        &first.if_metageneration_match,
    );
    fill(
        &mut r.if_metageneration_not_match,
        &first.if_metageneration_not_match,
    );
    fill(
        &mut r.if_source_generation_match,
        &first.if_source_generation_match,
    );
    fill(
        &mut r.if_source_generation_not_match,
        &first.if_source_generation_not_match,
    );
    fill(
        &mut r.if_source_metageneration_match,
        &first.if_source_metageneration_match,
    );
    fill(
        &mut r.if_source_metageneration_not_match,
        &first.if_source_metageneration_not_match,
    );
    fill(
        &mut r.max_bytes_rewritten_per_call,
        &first.max_bytes_rewritten_per_call,
    );
    fill(&mut r.object_checksums, &first.object_checksums);
    later
}

impl State {
    /// One call of RewriteObject (see the module's documentation).
    pub(crate) fn rewrite_object(
        &mut self,
        request: proto::RewriteObjectRequest,
    ) -> Result<proto::RewriteResponse, Status> {
        let (request, progress) = self.rewrites.resume(request)?;
        check_request(&request)?;
        let source = self.rewrite_source(&request, progress.as_ref())?;
        let destination = parse_bucket_name(&request.destination_bucket)?.to_string();
        self.check_rewrite_destination(&request, &destination)?;
        let changes_place = self.changes_place(&request, &source.object, &destination)?;
        let size = source.content.len();
        let before = progress.as_ref().map_or(0, |p| p.rewritten);
        let rewritten = match self.bytes_per_call(&request, changes_place) {
            Some(step) => size.min(before.saturating_add(step)),
            None => size,
        };
        let mut response = proto::RewriteResponse {
            total_bytes_rewritten: size_i64(rewritten),
            object_size: size_i64(size),
            ..Default::default()
        };
        if rewritten < size {
            let rewrite = match progress {
                Some(progress) => progress.rewrite,
                None => Arc::new(Pinned {
                    request,
                    source_generation: source.object.generation,
                }),
            };
            response.rewrite_token = self.rewrites.issue(rewrite, rewritten);
            return Ok(response);
        }
        let object = self.finish_rewrite(request, source, &destination, changes_place)?;
        response.done = true;
        response.resource = Some(object);
        Ok(response)
    }

    /// The source generation a call copies: the one the request selects,
    /// satisfying the source preconditions, and for a call with a token
    /// the one the first call found (NOT_FOUND naming it otherwise).
    fn rewrite_source(
        &self,
        request: &proto::RewriteObjectRequest,
        progress: Option<&Progress>,
    ) -> Result<ReadSource, Status> {
        let source = self.read_source(
            &request.source_bucket,
            &request.source_object,
            request.source_generation,
            Preconditions {
                if_generation_match: request.if_source_generation_match,
                if_generation_not_match: request.if_source_generation_not_match,
                if_metageneration_match: request.if_source_metageneration_match,
                if_metageneration_not_match: request.if_source_metageneration_not_match,
            },
        )?;
        match progress.map(|p| p.rewrite.source_generation) {
            Some(pinned) if pinned != source.object.generation => Err(Status::not_found(format!(
                "No such object: {}/{}#{pinned} (the source generation this rewrite copies \
                     was replaced or deleted)",
                parse_bucket_name(&request.source_bucket)?,
                request.source_object
            ))),
            _ => Ok(source),
        }
    }

    /// What every call checks of the destination: its bucket exists, the
    /// destination preconditions hold and the live object may be replaced.
    fn check_rewrite_destination(
        &self,
        request: &proto::RewriteObjectRequest,
        bucket: &str,
    ) -> Result<(), Status> {
        self.existing_bucket(bucket)?;
        let name = &request.destination_name;
        Preconditions {
            if_generation_match: request.if_generation_match,
            if_generation_not_match: request.if_generation_not_match,
            if_metageneration_match: request.if_metageneration_match,
            if_metageneration_not_match: request.if_metageneration_not_match,
        }
        .check_write(name, self.live_object(bucket, name))?;
        self.check_replaceable(bucket, name)
    }

    /// Whether the copy changes location or storage class: GCS then copies
    /// the data, in several calls for a large object.
    fn changes_place(
        &self,
        request: &proto::RewriteObjectRequest,
        source: &proto::Object,
        destination: &str,
    ) -> Result<bool, Status> {
        let from = self.existing_bucket(parse_bucket_name(&request.source_bucket)?)?;
        let to = self.existing_bucket(destination)?;
        let from_class = if source.storage_class.is_empty() {
            &from.storage_class
        } else {
            &source.storage_class
        };
        Ok(placement(from) != placement(to) || *from_class != destination_class(request, to))
    }

    /// How many bytes one call copies; `None`: all that remains.
    fn bytes_per_call(
        &self,
        request: &proto::RewriteObjectRequest,
        changes_place: bool,
    ) -> Option<u64> {
        if !changes_place {
            return None;
        }
        match u64::try_from(request.max_bytes_rewritten_per_call) {
            Ok(max) if max > 0 => Some(max),
            _ => Some(self.rewrites.bytes_per_call).filter(|b| *b > 0),
        }
    }

    /// The last step: checks the request's checksums against the source's,
    /// then stores the destination object with the source's data.
    fn finish_rewrite(
        &mut self,
        request: proto::RewriteObjectRequest,
        source: ReadSource,
        bucket: &str,
        changes_place: bool,
    ) -> Result<proto::Object, Status> {
        let checksums = source
            .object
            .checksums
            .clone()
            .unwrap_or_else(|| source.content.checksums());
        let what = format!("object {}", request.destination_name);
        check_checksums(&what, request.object_checksums.as_ref(), &checksums)?;
        let mut template = match request.destination {
            Some(given) => given_metadata(given),
            None => copied_metadata(&source.object),
        };
        template.name = request.destination_name;
        // Empty: the destination bucket's class.
        template.storage_class = template.storage_class.to_uppercase();
        template.kms_key = request.destination_kms_key;
        template.checksums = Some(checksums);
        // A composite object copied to another place counts one component.
        template.component_count = if changes_place {
            source.object.component_count.min(1)
        } else {
            source.object.component_count
        };
        self.store_object(bucket, template, source.content)
    }
}

/// INVALID_ARGUMENT for a request GCS refuses whatever the state;
/// UNIMPLEMENTED for customer-supplied encryption keys, which the mock
/// does not model.
fn check_request(request: &proto::RewriteObjectRequest) -> Result<(), Status> {
    if request.source_object.is_empty() || request.destination_name.is_empty() {
        return Err(Status::invalid_argument(
            "source_object and destination_name are required",
        ));
    }
    let max = request.max_bytes_rewritten_per_call;
    if max < 0 || max % MIB != 0 {
        return Err(Status::invalid_argument(format!(
            "max_bytes_rewritten_per_call must be a multiple of 1 MiB (1048576), got {max}"
        )));
    }
    if request
        .destination
        .as_ref()
        .is_some_and(|d| !d.name.is_empty() || !d.bucket.is_empty() || !d.kms_key.is_empty())
    {
        return Err(Status::invalid_argument(
            "destination.name, destination.bucket and destination.kms_key must not be set: \
             destination_name, destination_bucket and destination_kms_key give them",
        ));
    }
    let params = request.common_object_request_params.as_ref();
    let keys = !request.copy_source_encryption_algorithm.is_empty()
        || !request.copy_source_encryption_key_bytes.is_empty()
        || !request.copy_source_encryption_key_sha256_bytes.is_empty()
        || params.is_some_and(|p| {
            !p.encryption_algorithm.is_empty()
                || !p.encryption_key_bytes.is_empty()
                || !p.encryption_key_sha256_bytes.is_empty()
        });
    if keys {
        return Err(Status::unimplemented(
            "customer-supplied encryption keys are not supported by the mock GCS",
        ));
    }
    Ok(())
}

/// Where a bucket keeps its data: its location and, for a configurable
/// dual-region, its regions.
fn placement(bucket: &proto::Bucket) -> (&str, &[String]) {
    let regions = bucket.custom_placement_config.as_ref();
    let regions = regions.map_or(&[][..], |c| c.data_locations.as_slice());
    (bucket.location.as_str(), regions)
}

/// The storage class a copy lands in: the request's, else the destination
/// bucket's.
fn destination_class(request: &proto::RewriteObjectRequest, bucket: &proto::Bucket) -> String {
    let asked = request
        .destination
        .as_ref()
        .map(|d| d.storage_class.to_uppercase());
    asked
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| bucket.storage_class.clone())
}

/// The metadata a copy keeps from its source when the request gives none:
/// not the storage class, holds, retention or ACLs (the destination's
/// defaults apply).
fn copied_metadata(source: &proto::Object) -> proto::Object {
    proto::Object {
        content_type: source.content_type.clone(),
        content_encoding: source.content_encoding.clone(),
        content_disposition: source.content_disposition.clone(),
        content_language: source.content_language.clone(),
        cache_control: source.cache_control.clone(),
        metadata: source.metadata.clone(),
        custom_time: source.custom_time,
        contexts: source.contexts.clone(),
        ..Default::default()
    }
}

/// The fields of the request's `destination` a client may set; the server
/// sets the others.
fn given_metadata(given: proto::Object) -> proto::Object {
    proto::Object {
        storage_class: given.storage_class,
        content_type: given.content_type,
        content_encoding: given.content_encoding,
        content_disposition: given.content_disposition,
        content_language: given.content_language,
        cache_control: given.cache_control,
        acl: given.acl,
        metadata: given.metadata,
        custom_time: given.custom_time,
        contexts: given.contexts,
        temporary_hold: given.temporary_hold,
        event_based_hold: given.event_based_hold,
        retention: given.retention,
        ..Default::default()
    }
}
