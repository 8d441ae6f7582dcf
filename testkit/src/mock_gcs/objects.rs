//! Object metadata RPCs: listing (with versions, prefix, delimiter and
//! paging), get and delete. Object data is in `objects_grpc.rs`.

use std::collections::BTreeSet;

use tonic::Status;

use super::proto;
use super::retention::{check_deletable, with_retention_expiry};
use super::state::{State, now, page_size, parse_bucket_name};

/// One row of a listing: an object generation, or a collapsed prefix when a
/// delimiter is used. Listed by [`Entry::key`]: name, then generation.
#[derive(Debug)]
enum Entry<'a> {
    Prefix(String),
    Object(&'a proto::Object),
}

impl Entry<'_> {
    fn key(&self) -> (&str, i64) {
        match self {
            Entry::Prefix(prefix) => (prefix, 0),
            Entry::Object(object) => (&object.name, object.generation),
        }
    }
}

impl State {
    pub(crate) fn list_objects(
        &self,
        request: &proto::ListObjectsRequest,
    ) -> Result<proto::ListObjectsResponse, Status> {
        let id = parse_bucket_name(&request.parent)?;
        let bucket = self.existing_bucket(id)?;
        let size = page_size(request.page_size)?;
        let after = parse_page_token(&request.page_token)?;
        let objects = self.objects.get(id).map(Vec::as_slice).unwrap_or_default();
        // Soft-deleted objects are not modelled: such listings are empty.
        let candidates = objects.iter().filter(|o| {
            !request.soft_deleted
                && (request.versions || o.delete_time.is_none())
                && o.name.starts_with(&request.prefix)
                && o.name.as_str() >= request.lexicographic_start.as_str()
                && (request.lexicographic_end.is_empty()
                    || o.name.as_str() < request.lexicographic_end.as_str())
        });
        let mut prefixes = BTreeSet::new();
        let mut entries = Vec::new();
        for object in candidates {
            match collapsed_prefix(&object.name, &request.prefix, &request.delimiter) {
                Some(prefix) => {
                    prefixes.insert(prefix);
                }
                None => entries.push(Entry::Object(object)),
            }
        }
        entries.extend(prefixes.into_iter().map(Entry::Prefix));
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
        let mut remaining = entries.into_iter().filter(|e| {
            after
                .as_ref()
                .is_none_or(|(n, g)| e.key() > (n.as_str(), *g))
        });
        let page: Vec<Entry> = remaining.by_ref().take(size).collect();
        let next_page_token = match (remaining.next(), page.last()) {
            (Some(_), Some(last)) => {
                let (name, generation) = last.key();
                format!("{generation}/{name}")
            }
            _ => String::new(),
        };
        let mut response = proto::ListObjectsResponse {
            next_page_token,
            ..Default::default()
        };
        for entry in page {
            match entry {
                Entry::Prefix(prefix) => response.prefixes.push(prefix),
                Entry::Object(object) => response
                    .objects
                    .push(with_retention_expiry(bucket, object.clone())),
            }
        }
        Ok(response)
    }

    pub(crate) fn get_object(
        &self,
        request: &proto::GetObjectRequest,
    ) -> Result<proto::Object, Status> {
        let id = parse_bucket_name(&request.bucket)?;
        let bucket = self.existing_bucket(id)?;
        let object = self
            .objects
            .get(id)
            .and_then(|objects| find_object(objects, &request.object, request.generation))
            .filter(|_| request.soft_deleted != Some(true))
            .ok_or_else(|| object_not_found(id, &request.object, request.generation))?;
        check_object_preconditions(
            object,
            request.if_generation_match,
            request.if_generation_not_match,
            request.if_metageneration_match,
            request.if_metageneration_not_match,
        )?;
        Ok(with_retention_expiry(bucket, object.clone()))
    }

    pub(crate) fn delete_object(
        &mut self,
        request: &proto::DeleteObjectRequest,
    ) -> Result<(), Status> {
        let id = parse_bucket_name(&request.bucket)?;
        let bucket = self.existing_bucket(id)?.clone();
        let versioned = bucket.versioning.is_some_and(|v| v.enabled);
        let not_found = || object_not_found(id, &request.object, request.generation);
        let objects = self.objects.get_mut(id).ok_or_else(not_found)?;
        let index = objects
            .iter()
            .position(|o| {
                o.name == request.object
                    && if request.generation == 0 {
                        o.delete_time.is_none()
                    } else {
                        o.generation == request.generation
                    }
            })
            .ok_or_else(not_found)?;
        check_object_preconditions(
            &objects[index],
            request.if_generation_match,
            request.if_generation_not_match,
            request.if_metageneration_match,
            request.if_metageneration_not_match,
        )?;
        check_deletable(&bucket, &objects[index])?;
        if versioned && request.generation == 0 {
            // Deleting the live version of a versioned object keeps it as a
            // noncurrent version.
            objects[index].delete_time = Some(now());
        } else {
            let removed = objects.remove(index);
            self.contents.remove(&removed.generation);
        }
        Ok(())
    }
}

/// The live generation of `name` (generation 0) or that exact generation.
pub(crate) fn find_object<'a>(
    objects: &'a [proto::Object],
    name: &str,
    generation: i64,
) -> Option<&'a proto::Object> {
    objects.iter().find(|o| {
        o.name == name
            && if generation == 0 {
                o.delete_time.is_none()
            } else {
                o.generation == generation
            }
    })
}

/// With a delimiter, the prefix `name` collapses into (the listing prefix
/// plus everything up to and including the first delimiter after it).
fn collapsed_prefix(name: &str, prefix: &str, delimiter: &str) -> Option<String> {
    if delimiter.is_empty() {
        return None;
    }
    let rest = name.strip_prefix(prefix)?;
    let end = rest.find(delimiter)? + delimiter.len();
    Some(format!("{prefix}{}", &rest[..end]))
}

/// Page tokens are `{generation}/{name}` of the last entry returned.
fn parse_page_token(token: &str) -> Result<Option<(String, i64)>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .split_once('/')
        .and_then(|(generation, name)| Some((name.to_string(), generation.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| Status::invalid_argument(format!("invalid page_token {token:?}")))
}

pub(crate) fn object_not_found(bucket: &str, object: &str, generation: i64) -> Status {
    let version = if generation == 0 {
        String::new()
    } else {
        format!("#{generation}")
    };
    Status::not_found(format!("No such object: {bucket}/{object}{version}"))
}

/// FAILED_PRECONDITION unless `object` satisfies every given precondition.
pub(crate) fn check_object_preconditions(
    object: &proto::Object,
    if_generation_match: Option<i64>,
    if_generation_not_match: Option<i64>,
    if_metageneration_match: Option<i64>,
    if_metageneration_not_match: Option<i64>,
) -> Result<(), Status> {
    let failed = if_generation_match.is_some_and(|g| g != object.generation)
        || if_generation_not_match == Some(object.generation)
        || if_metageneration_match.is_some_and(|m| m != object.metageneration)
        || if_metageneration_not_match == Some(object.metageneration);
    if failed {
        Err(Status::failed_precondition(format!(
            "precondition failed for object {}#{}",
            object.name, object.generation
        )))
    } else {
        Ok(())
    }
}
