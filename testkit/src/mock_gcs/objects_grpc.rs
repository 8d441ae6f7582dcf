//! Object data RPCs on the state: write sessions (one-shot and resumable),
//! what a read serves, ComposeObject and QueryWriteStatus. The streams
//! around them are in `streams.rs`, RewriteObject in `rewrite.rs`.

use bytes::Bytes;
use tonic::Status;

use super::content::{Content, Hasher, check_checksums, check_chunk};
use super::objects::{check_object_preconditions, find_object, object_not_found};
use super::proto;
use super::state::{State, parse_bucket_name};

/// Most source objects one ComposeObject takes, as in GCS.
const MAX_COMPOSE_SOURCES: usize = 32;

/// A write in progress: a resumable upload (StartResumableWrite) or the
/// data of one WriteObject / BidiWriteObject stream opened with a spec.
#[derive(Debug)]
pub(crate) struct Upload {
    /// Plain bucket id.
    pub(crate) bucket: String,
    spec: proto::WriteObjectSpec,
    /// Checksums sent when the upload started, checked at the end.
    checksums: Option<proto::ObjectChecksums>,
    content: Content,
    hasher: Hasher,
    /// Started by StartResumableWrite: survives the stream that writes it.
    pub(crate) resumable: bool,
    /// The object, once finalized.
    finished: Option<proto::Object>,
}

/// What a read serves: the object, its data and the byte range.
#[derive(Debug, Clone)]
pub(crate) struct ReadSource {
    pub(crate) object: proto::Object,
    pub(crate) content: Content,
}

impl ReadSource {
    /// The byte range `[start, end)` a read from `offset` (negative: from
    /// the end) of at most `limit` bytes (0: to the end) covers; OUT_OF_RANGE
    /// past the end, INVALID_ARGUMENT for a negative limit.
    pub(crate) fn range(&self, offset: i64, limit: i64) -> Result<(u64, u64), Status> {
        let size = self.content.len();
        let limit = u64::try_from(limit)
            .map_err(|_| Status::invalid_argument(format!("negative read limit {limit}")))?;
        let start = if offset < 0 {
            size.saturating_sub(offset.unsigned_abs())
        } else {
            offset.unsigned_abs()
        };
        if start > size || (start == size && size > 0 && offset >= 0) {
            return Err(Status::out_of_range(format!(
                "Request range not satisfiable: offset {offset} of object {} ({size} bytes)",
                self.object.name
            )));
        }
        let end = if limit == 0 {
            size
        } else {
            size.min(start.saturating_add(limit))
        };
        Ok((start, end))
    }
}

/// The preconditions of a read or write on the live (or given) generation.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Preconditions {
    pub(crate) if_generation_match: Option<i64>,
    pub(crate) if_generation_not_match: Option<i64>,
    pub(crate) if_metageneration_match: Option<i64>,
    pub(crate) if_metageneration_not_match: Option<i64>,
}

impl Preconditions {
    /// FAILED_PRECONDITION unless `current` (the live generation, if any)
    /// satisfies every precondition; generation 0 stands for "no live object".
    pub(crate) fn check_write(
        &self,
        name: &str,
        current: Option<&proto::Object>,
    ) -> Result<(), Status> {
        let generation = current.map_or(0, |o| o.generation);
        let failed = self.if_generation_match.is_some_and(|g| g != generation)
            || self.if_generation_not_match == Some(generation)
            || (current.is_none()
                && (self.if_metageneration_match.is_some()
                    || self.if_metageneration_not_match.is_some()));
        if failed {
            return Err(Status::failed_precondition(format!(
                "At least one of the pre-conditions you specified did not hold for object {name} \
                 (live generation {generation})"
            )));
        }
        match current {
            Some(object) => check_object_preconditions(
                object,
                None,
                None,
                self.if_metageneration_match,
                self.if_metageneration_not_match,
            ),
            None => Ok(()),
        }
    }
}

impl State {
    /// Opens a write of the object `spec` describes; returns its upload id.
    pub(crate) fn start_upload(
        &mut self,
        spec: proto::WriteObjectSpec,
        checksums: Option<proto::ObjectChecksums>,
        resumable: bool,
    ) -> Result<String, Status> {
        let resource = spec
            .resource
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("write_object_spec.resource is required"))?;
        let bucket = parse_bucket_name(&resource.bucket)?.to_string();
        self.existing_bucket(&bucket)?;
        if resource.name.is_empty() {
            return Err(Status::invalid_argument(
                "write_object_spec.resource.name is required",
            ));
        }
        if spec.appendable == Some(true) {
            return Err(Status::unimplemented(
                "appendable objects are not supported by the mock GCS",
            ));
        }
        self.last_upload += 1;
        // GCS's form: the routing annotations read the bucket from it
        // (`{bucket=projects/*/buckets/*}/**`).
        let id = format!(
            "projects/_/buckets/{bucket}/uploads/mock-{}",
            self.last_upload
        );
        self.uploads.insert(
            id.clone(),
            Upload {
                bucket,
                spec,
                checksums,
                content: Content::default(),
                hasher: Hasher::default(),
                resumable,
                finished: None,
            },
        );
        Ok(id)
    }

    /// The upload `id`, or NOT_FOUND.
    pub(crate) fn upload(&self, id: &str) -> Result<&Upload, Status> {
        self.uploads
            .get(id)
            .ok_or_else(|| Status::not_found(format!("upload session {id} does not exist")))
    }

    fn open_upload(&mut self, id: &str) -> Result<&mut Upload, Status> {
        let upload = self
            .uploads
            .get_mut(id)
            .ok_or_else(|| Status::not_found(format!("upload session {id} does not exist")))?;
        if upload.finished.is_some() {
            return Err(Status::failed_precondition(format!(
                "upload session {id} is already finalized"
            )));
        }
        Ok(upload)
    }

    /// Appends `data`, written at `offset`, to upload `id`; returns the
    /// persisted size. Data the upload already holds (a client resending
    /// after a reconnect) is skipped; a gap is refused.
    pub(crate) fn append_upload(
        &mut self,
        id: &str,
        offset: i64,
        data: Option<proto::ChecksummedData>,
    ) -> Result<i64, Status> {
        let upload = self.open_upload(id)?;
        let persisted = upload.content.len();
        let Some(data) = data else {
            return Ok(size_i64(persisted));
        };
        check_chunk(&data)?;
        let offset = u64::try_from(offset)
            .map_err(|_| Status::invalid_argument(format!("negative write_offset {offset}")))?;
        if offset > persisted {
            return Err(Status::out_of_range(format!(
                "write_offset {offset} is past the persisted size {persisted} of upload {id}"
            )));
        }
        let skip = usize::try_from(persisted - offset).unwrap_or(usize::MAX);
        if skip < data.content.len() {
            let chunk = Bytes::from(data.content).slice(skip..);
            upload.hasher.update(&chunk);
            upload.content.push(chunk);
        }
        Ok(size_i64(upload.content.len()))
    }

    /// Finalizes upload `id`: checks the checksums (`checksums`, completed
    /// by the ones sent at the start), the declared size and the
    /// preconditions, then stores the object.
    pub(crate) fn finish_upload(
        &mut self,
        id: &str,
        checksums: Option<&proto::ObjectChecksums>,
    ) -> Result<proto::Object, Status> {
        let upload = self.open_upload(id)?;
        let actual = upload.hasher.checksums();
        let name = upload.spec.resource.as_ref().map(|r| r.name.clone());
        let name = name.unwrap_or_default();
        let expected = merged(checksums, upload.checksums.as_ref());
        check_checksums(&format!("object {name}"), expected.as_ref(), &actual)?;
        let size = size_i64(upload.content.len());
        if let Some(expected) = upload.spec.object_size
            && expected != size
        {
            return Err(Status::out_of_range(format!(
                "upload {id} declared object_size {expected} but {size} bytes were written"
            )));
        }
        let bucket = upload.bucket.clone();
        let spec = upload.spec.clone();
        let content = upload.content.clone();
        let preconditions = Preconditions {
            if_generation_match: spec.if_generation_match,
            if_generation_not_match: spec.if_generation_not_match,
            if_metageneration_match: spec.if_metageneration_match,
            if_metageneration_not_match: spec.if_metageneration_not_match,
        };
        preconditions.check_write(&name, self.live_object(&bucket, &name))?;
        let mut template = spec.resource.unwrap_or_default();
        template.checksums = Some(actual);
        let object = self.store_object(&bucket, template, content)?;
        if let Some(upload) = self.uploads.get_mut(id) {
            upload.finished = Some(object.clone());
            upload.content = Content::default();
        }
        Ok(object)
    }

    /// How many bytes upload `id` holds.
    pub(crate) fn persisted_size(&self, id: &str) -> Result<i64, Status> {
        Ok(size_i64(self.upload(id)?.content.len()))
    }

    /// Forgets upload `id`.
    pub(crate) fn discard_upload(&mut self, id: &str) {
        self.uploads.remove(id);
    }

    /// The persisted size of upload `id`, or its object once finalized.
    pub(crate) fn query_write_status(
        &self,
        request: &proto::QueryWriteStatusRequest,
    ) -> Result<proto::QueryWriteStatusResponse, Status> {
        use proto::query_write_status_response::WriteStatus;
        let upload = self.upload(&request.upload_id)?;
        let status = match &upload.finished {
            Some(object) => WriteStatus::Resource(object.clone()),
            None => WriteStatus::PersistedSize(size_i64(upload.content.len())),
        };
        Ok(proto::QueryWriteStatusResponse {
            write_status: Some(status),
        })
    }

    /// The live generation of object `name` in bucket `bucket`, if any.
    pub(crate) fn live_object(&self, bucket: &str, name: &str) -> Option<&proto::Object> {
        self.objects
            .get(bucket)
            .and_then(|objects| find_object(objects, name, 0))
    }

    /// The object generation a read names (0: the live one) and its data,
    /// if it satisfies the preconditions.
    pub(crate) fn read_source(
        &self,
        bucket: &str,
        name: &str,
        generation: i64,
        preconditions: Preconditions,
    ) -> Result<ReadSource, Status> {
        let id = parse_bucket_name(bucket)?;
        self.existing_bucket(id)?;
        let object = self
            .objects
            .get(id)
            .and_then(|objects| find_object(objects, name, generation))
            .ok_or_else(|| object_not_found(id, name, generation))?;
        check_object_preconditions(
            object,
            preconditions.if_generation_match,
            preconditions.if_generation_not_match,
            preconditions.if_metageneration_match,
            preconditions.if_metageneration_not_match,
        )?;
        Ok(ReadSource {
            object: object.clone(),
            content: self
                .contents
                .get(&object.generation)
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Concatenates the source objects into the destination (same bucket).
    pub(crate) fn compose_object(
        &mut self,
        request: proto::ComposeObjectRequest,
    ) -> Result<proto::Object, Status> {
        let destination = request
            .destination
            .ok_or_else(|| Status::invalid_argument("ComposeObject needs a destination"))?;
        let bucket = parse_bucket_name(&destination.bucket)?.to_string();
        if request.source_objects.is_empty() || request.source_objects.len() > MAX_COMPOSE_SOURCES {
            return Err(Status::invalid_argument(format!(
                "ComposeObject takes 1 to {MAX_COMPOSE_SOURCES} source objects, got {}",
                request.source_objects.len()
            )));
        }
        let mut chunks = Vec::new();
        let (mut crc, mut components) = (0u32, 0i32);
        for source in &request.source_objects {
            let precondition = source
                .object_preconditions
                .and_then(|p| p.if_generation_match);
            let read = self.read_source(
                &destination.bucket,
                &source.name,
                source.generation,
                Preconditions {
                    if_generation_match: precondition,
                    ..Preconditions::default()
                },
            )?;
            let len = usize::try_from(read.content.len()).unwrap_or(usize::MAX);
            crc = crc32c::crc32c_combine(crc, read.content.crc32c(), len);
            components += read.object.component_count.max(1);
            chunks.extend(read.content.chunks().iter().cloned());
        }
        let checksums = proto::ObjectChecksums {
            crc32c: Some(crc),
            md5_hash: Vec::new(),
        };
        check_checksums(
            &format!("object {}", destination.name),
            request.object_checksums.as_ref(),
            &checksums,
        )?;
        Preconditions {
            if_generation_match: request.if_generation_match,
            if_metageneration_match: request.if_metageneration_match,
            ..Preconditions::default()
        }
        .check_write(
            &destination.name,
            self.live_object(&bucket, &destination.name),
        )?;
        let mut template = destination;
        template.component_count = components;
        template.checksums = Some(checksums);
        self.store_object(&bucket, template, Content::from_chunks(chunks))
    }
}

/// The checksums sent last, completed by those sent earlier.
fn merged(
    later: Option<&proto::ObjectChecksums>,
    earlier: Option<&proto::ObjectChecksums>,
) -> Option<proto::ObjectChecksums> {
    match (later, earlier) {
        (None, earlier) => earlier.cloned(),
        (Some(later), None) => Some(later.clone()),
        (Some(later), Some(earlier)) => Some(proto::ObjectChecksums {
            crc32c: later.crc32c.or(earlier.crc32c),
            md5_hash: if later.md5_hash.is_empty() {
                earlier.md5_hash.clone()
            } else {
                later.md5_hash.clone()
            },
        }),
    }
}

/// A size as the `int64` the API uses.
pub(crate) fn size_i64(size: u64) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}
