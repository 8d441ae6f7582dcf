//! The copy of a move: passes that make the destination hold what the
//! source holds, server-side (`RewriteObject`), verified object by object.
//!
//! A pass walks both buckets' listings side by side (GCS lists in name
//! order), a page at a time, so its memory does not grow with the bucket.
//! For each name: an object only in the source is copied; one in both is
//! left when it is the same (size, checksums and the metadata a copy
//! carries) and copied over otherwise; one only in the destination is
//! deleted. Every copy is conditional on both generations it was decided
//! from, the source's and the destination's: an object that changed while
//! the pass ran is *raced*, not overwritten, and the next pass looks again.
//! A pass that copied, deleted and raced nothing proves the two buckets
//! equal at its end ([`Pass::converged`]).
//!
//! Before the fence, passes run while the application writes to the
//! source, until one copies little; the last pass runs after the fence,
//! when the source no longer changes, and must converge on the pass after
//! it (docs/ARCHITECTURE.md, "Moving a bucket: the switch").
//!
//! What a copy carries: the live generation's data, content type,
//! encoding, disposition, language, cache control, custom metadata and
//! custom time, with its CRC32C and MD5 (GCS copies them; the pass checks
//! the CRC32C and the size of the result). Noncurrent versions are not
//! copied. Holds and an object's own retention are set on the copy as
//! they are on the source, so the destination protects what the source
//! protected.

use futures::{StreamExt as _, TryStreamExt as _};
use google_cloud_storage::model::Object;

use crate::gcs::{GcsClient, GcsErrorKind, RewriteCall};
use crate::{Error, Result};

/// Tasks gathered per call in flight before they run: the listing pauses
/// while a batch runs, and the batch's tail runs with fewer calls in flight,
/// so batches are long.
const BATCH_PER_FLIGHT: usize = 64;

/// What one pass found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Live objects in the source.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects copied by this pass.
    pub copied: u64,
    /// Their bytes.
    pub copied_bytes: u64,
    /// Objects the destination already held the same.
    pub same: u64,
    /// Objects deleted from the destination, gone from the source.
    pub pruned: u64,
    /// Objects that changed in either bucket while the pass copied them.
    pub raced: u64,
}

impl Pass {
    /// Whether the buckets were equal when the pass ended.
    pub fn converged(&self) -> bool {
        self.copied == 0 && self.pruned == 0 && self.raced == 0
    }
}

/// How a pass runs.
#[derive(Clone, Copy, Debug)]
pub struct Copier<'a> {
    /// The client.
    pub gcs: &'a GcsClient,
    /// The source bucket.
    pub source: &'a str,
    /// The destination bucket.
    pub destination: &'a str,
    /// Copies and deletions in flight at once.
    pub concurrency: usize,
    /// A cap on the bytes of one rewrite call (0: GCS decides).
    pub max_bytes_per_call: i64,
    /// Objects per listing page.
    pub page_size: i32,
}

/// What the pass does with one name.
#[derive(Debug)]
enum Task {
    Copy { object: Object, replaces: i64 },
    Prune { object: Object },
}

/// What one task did.
#[derive(Debug)]
enum Done {
    Copied(u64),
    Pruned,
    Raced,
}

impl Copier<'_> {
    /// One pass over both buckets.
    pub async fn pass(&self) -> Result<Pass> {
        let mut source = Cursor::new(self, self.source);
        let mut destination = Cursor::new(self, self.destination);
        let mut pass = Pass::default();
        let mut batch = Vec::new();
        while let Some(task) = self
            .next_task(&mut source, &mut destination, &mut pass)
            .await?
        {
            batch.push(task);
            if batch.len() >= self.concurrency.max(1) * BATCH_PER_FLIGHT {
                self.run(std::mem::take(&mut batch), &mut pass).await?;
            }
        }
        self.run(batch, &mut pass).await?;
        Ok(pass)
    }

    /// The next name that needs work, counting the source's objects and
    /// those already the same on the way.
    async fn next_task(
        &self,
        source: &mut Cursor<'_>,
        destination: &mut Cursor<'_>,
        pass: &mut Pass,
    ) -> Result<Option<Task>> {
        loop {
            source.fill().await?;
            destination.fill().await?;
            let order = match (source.front(), destination.front()) {
                (None, None) => return Ok(None),
                (Some(s), Some(d)) => s.name.cmp(&d.name),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
            };
            let task = match order {
                std::cmp::Ordering::Greater => {
                    let object = destination.pop()?;
                    Some(Task::Prune { object })
                }
                std::cmp::Ordering::Less => {
                    let object = source.pop()?;
                    Some(Task::Copy {
                        object,
                        replaces: 0,
                    })
                }
                std::cmp::Ordering::Equal => {
                    let (object, held) = (source.pop()?, destination.pop()?);
                    (!same(&object, &held)).then_some(Task::Copy {
                        object,
                        replaces: held.generation,
                    })
                }
            };
            match task {
                Some(task) => {
                    count_source(&task, pass);
                    return Ok(Some(task));
                }
                None => {
                    pass.objects += 1;
                    pass.same += 1;
                }
            }
        }
    }

    async fn run(&self, batch: Vec<Task>, pass: &mut Pass) -> Result<()> {
        let done: Vec<Done> = futures::stream::iter(batch)
            .map(|task| self.task(task))
            .buffer_unordered(self.concurrency.max(1))
            .try_collect()
            .await?;
        for d in done {
            match d {
                Done::Copied(bytes) => {
                    pass.copied += 1;
                    pass.copied_bytes += bytes;
                }
                Done::Pruned => pass.pruned += 1,
                Done::Raced => pass.raced += 1,
            }
        }
        Ok(())
    }

    async fn task(&self, task: Task) -> Result<Done> {
        let result = match &task {
            Task::Copy { object, replaces } => self.copy(object, *replaces).await,
            Task::Prune { object } => self
                .gcs
                .delete_object(self.destination, &object.name, object.generation)
                .await
                .map(|()| Done::Pruned)
                .map_err(Error::from),
        };
        match result {
            Err(Error::Gcs(e))
                if matches!(
                    e.kind,
                    GcsErrorKind::FailedPrecondition | GcsErrorKind::NotFound
                ) =>
            {
                Ok(Done::Raced)
            }
            other => other,
        }
    }
}

/// Counts a task's source object in the pass's totals.
fn count_source(task: &Task, pass: &mut Pass) {
    if let Task::Copy { object, .. } = task {
        pass.objects += 1;
        pass.bytes += size(object);
    }
}

fn size(object: &Object) -> u64 {
    u64::try_from(object.size).unwrap_or(0)
}

/// Whether the destination's `held` is what a copy of `object` would be.
fn same(object: &Object, held: &Object) -> bool {
    let sums = |o: &Object| o.checksums.as_ref().map(|c| (c.crc32c, c.md5_hash.clone()));
    object.size == held.size
        && sums(object) == sums(held)
        && object.content_type == held.content_type
        && object.content_encoding == held.content_encoding
        && object.content_disposition == held.content_disposition
        && object.content_language == held.content_language
        && object.cache_control == held.cache_control
        && object.metadata == held.metadata
        && object.custom_time == held.custom_time
        && object.temporary_hold == held.temporary_hold
        && object.event_based_hold == held.event_based_hold
}

impl Copier<'_> {
    /// Copies `object` over the destination's generation `replaces` (0:
    /// none), a call at a time until GCS says done, and checks the result.
    async fn copy(&self, object: &Object, replaces: i64) -> Result<Done> {
        let mut token = String::new();
        let metadata = protected(object);
        loop {
            let call = RewriteCall {
                source: self.source,
                destination: self.destination,
                name: &object.name,
                generation: object.generation,
                replaces,
                token: &token,
                max_bytes_per_call: self.max_bytes_per_call,
                metadata: metadata.as_ref(),
            };
            let answer = self.gcs.rewrite_call(&call).await?;
            if !answer.done {
                token = answer.rewrite_token;
                continue;
            }
            let copy = answer
                .resource
                .ok_or(Error::MissingField("rewritten object"))?;
            verify(object, &copy, self.destination)?;
            return Ok(Done::Copied(size(object)));
        }
    }
}

/// The destination's metadata when the source is on hold or under its own
/// retention: what GCS copies by itself, plus those, which it does not.
/// `None`: GCS's copy of the metadata is the whole of it.
fn protected(object: &Object) -> Option<Object> {
    let held = object.temporary_hold || object.event_based_hold == Some(true);
    if !held && object.retention.is_none() {
        return None;
    }
    let mut copy = Object::new()
        .set_content_type(object.content_type.clone())
        .set_content_encoding(object.content_encoding.clone())
        .set_content_disposition(object.content_disposition.clone())
        .set_content_language(object.content_language.clone())
        .set_cache_control(object.cache_control.clone())
        .set_metadata(object.metadata.clone())
        .set_temporary_hold(object.temporary_hold)
        .set_or_clear_event_based_hold(object.event_based_hold)
        .set_or_clear_retention(object.retention.clone());
    copy.custom_time = object.custom_time;
    Some(copy)
}

/// The copy has the source's size and CRC32C.
fn verify(object: &Object, copy: &Object, destination: &str) -> Result<()> {
    let crc = |o: &Object| o.checksums.as_ref().and_then(|c| c.crc32c);
    if copy.size != object.size || crc(copy) != crc(object) {
        return Err(Error::CopyMismatch(format!(
            "the copy of {} in {destination} has {} bytes and CRC32C {:?}; the source's \
             generation {} has {} bytes and CRC32C {:?}",
            object.name,
            copy.size,
            crc(copy),
            object.generation,
            object.size,
            crc(object)
        )));
    }
    Ok(())
}

/// One bucket's listing, a page at a time.
struct Cursor<'a> {
    copier: &'a Copier<'a>,
    bucket: &'a str,
    page: std::collections::VecDeque<Object>,
    /// The next page's token; `None` after the last page.
    next: Option<String>,
}

impl<'a> Cursor<'a> {
    fn new(copier: &'a Copier<'a>, bucket: &'a str) -> Cursor<'a> {
        Cursor {
            copier,
            bucket,
            page: Default::default(),
            next: Some(String::new()),
        }
    }

    /// Reads pages until one object is at hand or the listing is over.
    async fn fill(&mut self) -> Result<()> {
        while self.page.is_empty() {
            let Some(token) = self.next.take() else {
                return Ok(());
            };
            let page = self
                .copier
                .gcs
                .list_object_page(self.bucket, &token, self.copier.page_size)
                .await?;
            self.page.extend(page.objects);
            self.next = (!page.next.is_empty()).then_some(page.next);
        }
        Ok(())
    }

    fn front(&self) -> Option<&Object> {
        self.page.front()
    }

    fn pop(&mut self) -> Result<Object> {
        self.page
            .pop_front()
            .ok_or(Error::MissingField("listed object"))
    }
}

#[cfg(test)]
#[path = "copy_tests.rs"]
mod tests;
