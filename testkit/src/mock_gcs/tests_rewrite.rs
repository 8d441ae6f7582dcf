//! RewriteObject driven by the official `google-cloud-storage` client, as
//! the operator will copy a bucket's objects: one call within a location
//! and storage class, rewrite tokens across them, the source generation
//! pinned, preconditions and faults at every call.

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::collections::HashMap;

use anyhow::Context as _;
use google_cloud_gax::error::rpc::Code;
use google_cloud_storage::builder::storage_control::RewriteObject;
use google_cloud_storage::builder_ext::RewriteObjectExt as _;
use google_cloud_storage::client::StorageControl;
use google_cloud_storage::model::{Object, RewriteResponse};

use super::{Fault, MockGcs, proto};

const STAGING: &str = "acme-staging";
const PROD: &str = "acme-prod";
/// US, STANDARD.
const PHOTOS: &str = "photos-k3x9q2mw";
/// US, STANDARD, the same place as PHOTOS.
const BACKUP: &str = "backup-h7d2p4xq";
/// EUROPE-WEST1, STANDARD.
const EUROPE: &str = "europe-m5n6b7v8";
/// US, STANDARD, versioned.
const VERSIONED: &str = "versions-q1w2e3r4";
/// US, NEARLINE, in another project.
const ARCHIVE: &str = "archive-z9y8x7w6";
const MIB: usize = 1024 * 1024;

/// A mock holding the buckets above, and a client without retries.
async fn world() -> anyhow::Result<(MockGcs, StorageControl)> {
    let mock = MockGcs::start().await?;
    let buckets = [
        (STAGING, PHOTOS, "US", "STANDARD", false),
        (STAGING, BACKUP, "US", "STANDARD", false),
        (STAGING, EUROPE, "EUROPE-WEST1", "STANDARD", false),
        (STAGING, VERSIONED, "US", "STANDARD", true),
        (PROD, ARCHIVE, "US", "NEARLINE", false),
    ];
    for (project, id, location, class, versioned) in buckets {
        mock.handle().insert_bucket(
            project,
            proto::Bucket {
                bucket_id: id.to_string(),
                location: location.to_string(),
                storage_class: class.to_string(),
                versioning: Some(proto::bucket::Versioning { enabled: versioned }),
                ..Default::default()
            },
        )?;
    }
    let client = super::tests::client(&mock).await?;
    Ok((mock, client))
}

fn name(id: &str) -> String {
    format!("projects/_/buckets/{id}")
}

/// Deterministic bytes that differ from MiB to MiB and from seed to seed.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed ^ ((i / MIB) as u8))
        .collect()
}

/// A rewrite of `from` (bucket, object) to `to`.
fn copy(client: &StorageControl, from: (&str, &str), to: (&str, &str)) -> RewriteObject {
    client
        .rewrite_object()
        .set_source_bucket(name(from.0))
        .set_source_object(from.1)
        .set_destination_bucket(name(to.0))
        .set_destination_name(to.1)
}

/// Sends `request`, then again with each token, until done; every answer.
async fn rewrite_all(mut request: RewriteObject) -> anyhow::Result<Vec<RewriteResponse>> {
    let mut answers = Vec::new();
    loop {
        let answer = request.clone().send().await?;
        request = request.set_rewrite_token(answer.rewrite_token.clone());
        let done = answer.done;
        answers.push(answer);
        if done {
            return Ok(answers);
        }
        anyhow::ensure!(answers.len() < 100, "the rewrite never ends");
    }
}

fn totals(answers: &[RewriteResponse]) -> Vec<i64> {
    answers.iter().map(|a| a.total_bytes_rewritten).collect()
}

/// The gRPC code of a failed call; panics on success.
fn code<T: std::fmt::Debug>(result: google_cloud_storage::Result<T>) -> Code {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => err
            .status()
            .map(|s| s.code)
            .unwrap_or_else(|| panic!("no gRPC status in {err:?}")),
    }
}

/// The gRPC code and message of a failed call; panics on success.
fn status<T: std::fmt::Debug>(result: google_cloud_storage::Result<T>) -> (Code, String) {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => err
            .status()
            .map(|s| (s.code, s.message.clone()))
            .unwrap_or_else(|| panic!("no gRPC status in {err:?}")),
    }
}

/// The names of the live objects in `bucket`.
fn live_names(mock: &MockGcs, bucket: &str) -> Vec<String> {
    let objects = mock.handle().objects(bucket).into_iter();
    objects
        .filter(|o| o.delete_time.is_none())
        .map(|o| o.name)
        .collect()
}

#[tokio::test]
async fn a_copy_in_one_place_keeps_every_metadata_field_and_the_checksums() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let bytes = data(3 * MIB + 5, 1);
    let source = handle.put_object_data(PHOTOS, "a.jpg", bytes.clone())?;
    let custom = prost_types::Timestamp {
        seconds: 1_700_000_000,
        nanos: 0,
    };
    let until = prost_types::Timestamp {
        seconds: 4_000_000_000,
        nanos: 0,
    };
    let changed = handle.modify_objects(PHOTOS, "a.jpg", |o| {
        o.content_type = "image/jpeg".into();
        o.content_encoding = "gzip".into();
        o.content_disposition = "attachment".into();
        o.content_language = "fr".into();
        o.cache_control = "no-cache".into();
        o.metadata = [("camera".to_string(), "x100".to_string())].into();
        o.custom_time = Some(custom);
        o.metageneration = 4;
        o.temporary_hold = true;
        o.event_based_hold = Some(true);
        o.retention = Some(proto::object::Retention {
            mode: proto::object::retention::Mode::Unlocked.into(),
            retain_until_time: Some(until),
        });
    });
    assert_eq!(changed, 1);

    // Same location and class: one call, although the object is larger
    // than the limit (which applies to copies that change place only).
    let answer = copy(&client, (PHOTOS, "a.jpg"), (BACKUP, "b.jpg"))
        .set_max_bytes_rewritten_per_call(MIB as i64)
        .send()
        .await?;
    assert!(answer.done);
    assert!(answer.rewrite_token.is_empty());
    assert_eq!(answer.total_bytes_rewritten, bytes.len() as i64);
    assert_eq!(answer.object_size, bytes.len() as i64);
    let copied = answer.resource.context("the copy")?;
    assert_eq!(copied.bucket, name(BACKUP));
    assert_eq!(copied.name, "b.jpg");
    assert_eq!(copied.content_type, "image/jpeg");
    assert_eq!(copied.content_encoding, "gzip");
    assert_eq!(copied.content_disposition, "attachment");
    assert_eq!(copied.content_language, "fr");
    assert_eq!(copied.cache_control, "no-cache");
    assert_eq!(
        copied.metadata,
        HashMap::from([("camera".to_string(), "x100".to_string())])
    );
    assert_eq!(
        copied.custom_time.map(|t| t.seconds()),
        Some(custom.seconds)
    );
    let checksums = copied.checksums.context("the copy's checksums")?;
    assert_eq!(checksums.crc32c, Some(crc32c::crc32c(&bytes)));
    assert_eq!(
        checksums.md5_hash.as_ref(),
        md5::compute(&bytes).0.as_slice()
    );
    assert!(copied.generation > source.generation);
    assert_eq!(copied.metageneration, 1);
    assert_eq!(copied.size, bytes.len() as i64);
    assert_eq!(copied.storage_class, "STANDARD");
    // Holds and retention stay with the source.
    assert!(!copied.temporary_hold);
    assert_ne!(copied.event_based_hold, Some(true));
    assert!(copied.retention.is_none(), "{:?}", copied.retention);
    assert_eq!(
        handle.object_data(BACKUP, "b.jpg").as_deref(),
        Some(&bytes[..])
    );
    assert_eq!(handle.call_count("RewriteObject"), 1);
    Ok(())
}

#[tokio::test]
async fn a_copy_to_another_storage_class_loops_on_the_token_until_done() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let bytes = data(5 * MIB + 10, 2);
    handle.put_object_data(PHOTOS, "big.bin", bytes.clone())?;
    handle.modify_objects(PHOTOS, "big.bin", |o| {
        o.metadata = [("camera".to_string(), "x100".to_string())].into();
    });
    let destination = Object::new()
        .set_storage_class("NEARLINE")
        .set_content_type("text/plain")
        .set_metadata([("tier", "cold")]);
    let request = copy(&client, (PHOTOS, "big.bin"), (BACKUP, "cold.bin"))
        .set_destination(destination)
        .set_max_bytes_rewritten_per_call(2 * MIB as i64);
    let mut answers: Vec<RewriteResponse> = Vec::new();
    let copied = loop {
        assert!(
            handle.objects(BACKUP).is_empty(),
            "a destination object before the last call"
        );
        let token = answers.last().map(|a| a.rewrite_token.clone());
        let answer = request
            .clone()
            .set_rewrite_token(token.unwrap_or_default())
            .send()
            .await?;
        assert_eq!(answer.object_size, bytes.len() as i64);
        answers.push(answer.clone());
        if answer.done {
            assert!(answer.rewrite_token.is_empty());
            break answer.resource.context("the copy")?;
        }
        assert!(answer.resource.is_none());
        assert!(!answer.rewrite_token.is_empty());
        anyhow::ensure!(answers.len() < 10, "the rewrite never ends");
    };
    let mib = MIB as i64;
    assert_eq!(totals(&answers), [2 * mib, 4 * mib, 5 * mib + 10]);
    assert_ne!(answers[0].rewrite_token, answers[1].rewrite_token);
    // The request's destination replaces the source's metadata.
    assert_eq!(copied.storage_class, "NEARLINE");
    assert_eq!(copied.content_type, "text/plain");
    assert_eq!(
        copied.metadata,
        HashMap::from([("tier".to_string(), "cold".to_string())])
    );
    assert_eq!(
        copied.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(&bytes))
    );
    assert_eq!(
        handle.object_data(BACKUP, "cold.bin").as_deref(),
        Some(&bytes[..])
    );
    assert_eq!(handle.call_count("RewriteObject"), 3);

    let odd_limit = copy(&client, (PHOTOS, "big.bin"), (BACKUP, "odd.bin"))
        .set_max_bytes_rewritten_per_call(1000)
        .send()
        .await;
    assert_eq!(code(odd_limit), Code::InvalidArgument);
    Ok(())
}

#[tokio::test]
async fn a_copy_to_another_location_advances_by_the_mock_wide_size() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    handle.set_rewrite_bytes_per_call(3 * MIB as u64);
    let bytes = data(7 * MIB, 3);
    handle.put_object_data(PHOTOS, "v.mp4", bytes.clone())?;
    handle.modify_objects(PHOTOS, "v.mp4", |o| o.component_count = 3);
    let answers = rewrite_all(copy(&client, (PHOTOS, "v.mp4"), (EUROPE, "v.mp4"))).await?;
    let mib = MIB as i64;
    assert_eq!(totals(&answers), [3 * mib, 6 * mib, 7 * mib]);
    assert_eq!(
        answers.iter().map(|a| a.done).collect::<Vec<_>>(),
        [false, false, true]
    );
    let copied = answers[2].resource.clone().context("the copy")?;
    assert_eq!(copied.bucket, name(EUROPE));
    assert_eq!(copied.storage_class, "STANDARD");
    assert_eq!(copied.component_count, 1, "a composite copied elsewhere");
    assert_eq!(
        copied.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(&bytes))
    );
    assert_eq!(
        handle.object_data(EUROPE, "v.mp4").as_deref(),
        Some(&bytes[..])
    );

    // Controls: in one place the components are kept, in one call; without
    // a per-call size the copy elsewhere is done in one call too.
    let here = copy(&client, (PHOTOS, "v.mp4"), (BACKUP, "v.mp4"))
        .send()
        .await?;
    assert!(here.done);
    assert_eq!(here.resource.map(|o| o.component_count), Some(3));
    handle.set_rewrite_bytes_per_call(0);
    let whole = copy(&client, (PHOTOS, "v.mp4"), (EUROPE, "again.mp4"))
        .send()
        .await?;
    assert!(whole.done);
    assert_eq!(whole.total_bytes_rewritten, 7 * mib);
    Ok(())
}

#[tokio::test]
async fn a_token_sent_with_another_request_is_refused() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let bytes = data(3 * MIB, 4);
    handle.put_object_data(PHOTOS, "t.bin", bytes.clone())?;
    let request = copy(&client, (PHOTOS, "t.bin"), (EUROPE, "t.bin"));
    let first = request.clone().send().await?;
    assert!(!first.done);
    assert_eq!(
        first.total_bytes_rewritten, MIB as i64,
        "the mock-wide size is 1 MiB unless set"
    );
    let token = first.rewrite_token.clone();

    let other_name = copy(&client, (PHOTOS, "t.bin"), (EUROPE, "other.bin"))
        .set_rewrite_token(&token)
        .send()
        .await;
    assert_eq!(code(other_name), Code::InvalidArgument);
    let other_bucket = copy(&client, (PHOTOS, "t.bin"), (BACKUP, "t.bin"))
        .set_rewrite_token(&token)
        .send()
        .await;
    assert_eq!(code(other_bucket), Code::InvalidArgument);
    let other_limit = request
        .clone()
        .set_max_bytes_rewritten_per_call(2 * MIB as i64)
        .set_rewrite_token(&token)
        .send()
        .await;
    assert_eq!(code(other_limit), Code::InvalidArgument);
    let other_precondition = request
        .clone()
        .set_if_generation_match(0)
        .set_rewrite_token(&token)
        .send()
        .await;
    assert_eq!(code(other_precondition), Code::InvalidArgument);
    let unknown = request
        .clone()
        .set_rewrite_token("not-a-token")
        .send()
        .await;
    assert_eq!(code(unknown), Code::InvalidArgument);

    // The refused calls changed nothing; a call with the token may leave
    // the source out.
    let second = client
        .rewrite_object()
        .set_destination_bucket(name(EUROPE))
        .set_destination_name("t.bin")
        .set_rewrite_token(&token)
        .send()
        .await?;
    assert_eq!(second.total_bytes_rewritten, 2 * MIB as i64);
    let last = request
        .clone()
        .set_rewrite_token(&second.rewrite_token)
        .send()
        .await?;
    assert!(last.done);
    assert_eq!(live_names(&mock, EUROPE), ["t.bin"]);
    assert!(live_names(&mock, BACKUP).is_empty());
    assert_eq!(
        handle.object_data(EUROPE, "t.bin").as_deref(),
        Some(&bytes[..])
    );
    Ok(())
}

#[tokio::test]
async fn a_source_replaced_or_deleted_mid_rewrite_is_not_copied() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();

    // Without versioning the replaced generation is gone; with it, it is
    // kept (noncurrent) but the request names the live one: both refused.
    for (bucket, object) in [(PHOTOS, "plain.bin"), (VERSIONED, "kept.bin")] {
        let old = handle.put_object_data(bucket, object, data(3 * MIB, 5))?;
        let request = copy(&client, (bucket, object), (EUROPE, object));
        let first = request.clone().send().await?;
        assert!(!first.done);
        handle.put_object_data(bucket, object, data(3 * MIB, 6))?;
        let next = request
            .clone()
            .set_rewrite_token(&first.rewrite_token)
            .send()
            .await;
        let (code, text) = status(next);
        assert_eq!(code, Code::NotFound, "{text}");
        assert!(
            text.contains(&format!("{bucket}/{object}#{}", old.generation)),
            "{text}"
        );
    }
    assert!(handle.objects(EUROPE).is_empty(), "nothing was written");

    // A precondition on the source generation is checked at every call.
    let pinned = handle.put_object_data(VERSIONED, "pinned.bin", data(3 * MIB, 7))?;
    let request = copy(&client, (VERSIONED, "pinned.bin"), (EUROPE, "pinned.bin"))
        .set_if_source_generation_match(pinned.generation);
    let first = request.clone().send().await?;
    handle.put_object_data(VERSIONED, "pinned.bin", b"newer".to_vec())?;
    let next = request
        .clone()
        .set_rewrite_token(&first.rewrite_token)
        .send()
        .await;
    assert_eq!(code(next), Code::FailedPrecondition);

    // A deleted source.
    handle.put_object_data(PHOTOS, "gone.bin", data(3 * MIB, 8))?;
    let request = copy(&client, (PHOTOS, "gone.bin"), (EUROPE, "gone.bin"));
    let first = request.clone().send().await?;
    client
        .delete_object()
        .set_bucket(name(PHOTOS))
        .set_object("gone.bin")
        .send()
        .await?;
    let next = request
        .clone()
        .set_rewrite_token(&first.rewrite_token)
        .send()
        .await;
    assert_eq!(code(next), Code::NotFound);
    assert!(handle.objects(EUROPE).is_empty(), "nothing was written");

    // Control: a rewrite that names its source generation copies it
    // although a newer one replaced it (versioning keeps it).
    let bytes = data(3 * MIB, 9);
    let named = handle.put_object_data(VERSIONED, "named.bin", bytes.clone())?;
    let request = copy(&client, (VERSIONED, "named.bin"), (EUROPE, "named.bin"))
        .set_source_generation(named.generation);
    let first = request.clone().send().await?;
    handle.put_object_data(VERSIONED, "named.bin", b"newer".to_vec())?;
    let rest = rewrite_all(request.set_rewrite_token(&first.rewrite_token)).await?;
    assert_eq!(totals(&rest), [2 * MIB as i64, 3 * MIB as i64]);
    assert_eq!(
        handle.object_data(EUROPE, "named.bin").as_deref(),
        Some(&bytes[..])
    );
    Ok(())
}

#[tokio::test]
async fn if_generation_match_zero_refuses_to_overwrite_at_every_call() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let taken = handle.put_object_data(BACKUP, "taken.bin", b"kept".to_vec())?;
    let bytes = data(3 * MIB, 10);
    handle.put_object_data(PHOTOS, "src.bin", bytes.clone())?;

    let refused = copy(&client, (PHOTOS, "src.bin"), (BACKUP, "taken.bin"))
        .set_if_generation_match(0)
        .send()
        .await;
    assert_eq!(code(refused), Code::FailedPrecondition);
    let left = handle.objects(BACKUP);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].generation, taken.generation);
    assert_eq!(
        handle.object_data(BACKUP, "taken.bin").as_deref(),
        Some(&b"kept"[..])
    );

    // A destination written between calls stops the rewrite.
    let request =
        copy(&client, (PHOTOS, "src.bin"), (EUROPE, "late.bin")).set_if_generation_match(0);
    let first = request.clone().send().await?;
    assert!(!first.done);
    handle.put_object_data(EUROPE, "late.bin", b"first".to_vec())?;
    let next = request
        .clone()
        .set_rewrite_token(&first.rewrite_token)
        .send()
        .await;
    assert_eq!(code(next), Code::FailedPrecondition);
    assert_eq!(handle.objects(EUROPE).len(), 1);
    assert_eq!(
        handle.object_data(EUROPE, "late.bin").as_deref(),
        Some(&b"first"[..])
    );

    // Control: without the precondition the copy replaces the object.
    let replaced = copy(&client, (PHOTOS, "src.bin"), (BACKUP, "taken.bin"))
        .send()
        .await?;
    assert!(replaced.done);
    assert_eq!(
        handle.object_data(BACKUP, "taken.bin").as_deref(),
        Some(&bytes[..])
    );

    // A held destination is not replaced, as by any write.
    handle.modify_objects(BACKUP, "taken.bin", |o| o.temporary_hold = true);
    let held = copy(&client, (PHOTOS, "src.bin"), (BACKUP, "taken.bin"))
        .send()
        .await;
    assert_eq!(code(held), Code::PermissionDenied);
    Ok(())
}

#[tokio::test]
async fn a_copy_to_another_project_lands_in_the_destination_storage_class() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let bytes = data(2 * MIB + 1, 11);
    handle.put_object_data(PHOTOS, "p.jpg", bytes.clone())?;
    let copied = copy(&client, (PHOTOS, "p.jpg"), (ARCHIVE, "p.jpg"))
        .rewrite_until_done()
        .await?;
    assert_eq!(copied.bucket, name(ARCHIVE));
    assert_eq!(copied.storage_class, "NEARLINE");
    assert_eq!(
        copied.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(&bytes))
    );
    assert_eq!(
        handle.object_data(ARCHIVE, "p.jpg").as_deref(),
        Some(&bytes[..])
    );
    // The class changes: three calls of 1 MiB at most, each logged with
    // the destination's project.
    let calls: Vec<_> = handle
        .calls()
        .into_iter()
        .filter(|c| c.method == "RewriteObject")
        .collect();
    assert_eq!(calls.len(), 3);
    for call in &calls {
        assert_eq!(call.project.as_deref(), Some(PROD));
        assert_eq!(call.bucket.as_deref(), Some(ARCHIVE));
    }

    let cold = copy(&client, (PHOTOS, "p.jpg"), (ARCHIVE, "cold.jpg"))
        .set_destination(Object::new().set_storage_class("COLDLINE"))
        .rewrite_until_done()
        .await?;
    assert_eq!(cold.storage_class, "COLDLINE");
    let missing = copy(&client, (PHOTOS, "p.jpg"), ("nope-bucket", "p.jpg"))
        .send()
        .await;
    assert_eq!(code(missing), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn a_noncurrent_source_generation_is_copied() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let first = handle.put_object_data(VERSIONED, "doc.txt", b"first version".to_vec())?;
    handle.put_object_data(VERSIONED, "doc.txt", b"second".to_vec())?;

    let old = copy(&client, (VERSIONED, "doc.txt"), (BACKUP, "doc-v1.txt"))
        .set_source_generation(first.generation)
        .send()
        .await?;
    assert!(old.done);
    let old = old.resource.context("the copy")?;
    assert_eq!(old.size, 13);
    assert_eq!(
        old.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(b"first version"))
    );
    assert_eq!(
        handle.object_data(BACKUP, "doc-v1.txt").as_deref(),
        Some(&b"first version"[..])
    );
    let live = copy(&client, (VERSIONED, "doc.txt"), (BACKUP, "doc.txt"))
        .send()
        .await?;
    assert_eq!(live.total_bytes_rewritten, 6);
    assert_eq!(
        handle.object_data(BACKUP, "doc.txt").as_deref(),
        Some(&b"second"[..])
    );
    let missing = copy(&client, (VERSIONED, "doc.txt"), (BACKUP, "doc-v0.txt"))
        .set_source_generation(first.generation - 1)
        .send()
        .await;
    assert_eq!(code(missing), Code::NotFound);
    assert_eq!(
        handle.objects(VERSIONED).len(),
        2,
        "the source is untouched"
    );
    Ok(())
}

#[tokio::test]
async fn faults_apply_to_every_call_of_a_rewrite() -> anyhow::Result<()> {
    let (mock, client) = world().await?;
    let handle = mock.handle();
    let bytes = data(3 * MIB, 12);
    handle.put_object_data(PHOTOS, "f.bin", bytes.clone())?;
    let request = copy(&client, (PHOTOS, "f.bin"), (EUROPE, "f.bin")).set_if_generation_match(0);
    let first = request.clone().send().await?;

    handle.add_fault(
        Fault::new("RewriteObject", tonic::Code::Unavailable)
            .bucket(EUROPE)
            .times(1),
    );
    let resend = || {
        request
            .clone()
            .set_rewrite_token(&first.rewrite_token)
            .send()
    };
    assert_eq!(code(resend().await), Code::Unavailable);
    let second = resend().await?;
    assert_eq!(second.total_bytes_rewritten, 2 * MIB as i64);

    // The last call's answer is lost: the copy exists, and repeating the
    // call repeats the completion, which the precondition now refuses.
    handle.add_fault(
        Fault::new("RewriteObject", tonic::Code::Unavailable)
            .times(1)
            .after_write(),
    );
    let last = || {
        request
            .clone()
            .set_rewrite_token(&second.rewrite_token)
            .send()
    };
    assert_eq!(code(last().await), Code::Unavailable);
    assert_eq!(
        handle.object_data(EUROPE, "f.bin").as_deref(),
        Some(&bytes[..])
    );
    assert_eq!(code(last().await), Code::FailedPrecondition);
    assert_eq!(handle.objects(EUROPE).len(), 1);

    let codes: Vec<(tonic::Code, Option<String>)> = handle
        .calls()
        .into_iter()
        .filter(|c| c.method == "RewriteObject")
        .map(|c| (c.code, c.bucket))
        .collect();
    let europe = Some(EUROPE.to_string());
    assert_eq!(
        codes,
        [
            (tonic::Code::Ok, europe.clone()),
            (tonic::Code::Unavailable, europe.clone()),
            (tonic::Code::Ok, europe.clone()),
            (tonic::Code::Unavailable, europe.clone()),
            (tonic::Code::FailedPrecondition, europe),
        ]
    );
    Ok(())
}
