//! The object data RPCs driven by the generated tonic client of
//! `googleapis-tonic-google-storage-v2`: writes (one-shot, resumable,
//! bidi), reads (ranges, chunking, bidi), compose, rewrite, checksums, and
//! what the call log records (metadata, cancellation).

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::time::Duration;

use googleapis_tonic_google_storage_v2::google::storage::v2::storage_client::StorageClient;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Code, Request};

use super::{MockGcs, proto};

const PROJECT: &str = "acme-staging";
const PHOTOS: &str = "photos-k3x9q2mw";
const VIDEOS: &str = "videos-a1b2c3d4";
const MIB: usize = 1024 * 1024;

async fn mock_with_buckets() -> anyhow::Result<(MockGcs, StorageClient<Channel>)> {
    let mock = MockGcs::start().await?;
    for id in [PHOTOS, VIDEOS] {
        mock.handle().insert_bucket(
            PROJECT,
            proto::Bucket {
                bucket_id: id.to_string(),
                ..Default::default()
            },
        )?;
    }
    let channel = Channel::from_shared(mock.endpoint())?.connect().await?;
    let client = StorageClient::new(channel).max_decoding_message_size(8 * MIB);
    Ok((mock, client))
}

fn bucket(id: &str) -> String {
    format!("projects/_/buckets/{id}")
}

/// Deterministic bytes that differ from chunk to chunk.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed ^ ((i / 4096) as u8))
        .collect()
}

fn spec(bucket_id: &str, name: &str) -> proto::WriteObjectSpec {
    proto::WriteObjectSpec {
        resource: Some(proto::Object {
            name: name.to_string(),
            bucket: bucket(bucket_id),
            content_type: "image/jpeg".to_string(),
            metadata: [("camera".to_string(), "x100".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn checksummed(chunk: &[u8]) -> proto::ChecksummedData {
    proto::ChecksummedData {
        content: chunk.to_vec(),
        crc32c: Some(crc32c::crc32c(chunk)),
    }
}

/// WriteObject messages sending `bytes` in chunks of `chunk` bytes, the
/// first with `first`, the last with `finish_write` and `checksums`.
fn write_messages(
    first: proto::write_object_request::FirstMessage,
    offset: usize,
    bytes: &[u8],
    chunk: usize,
    finish: Option<proto::ObjectChecksums>,
) -> Vec<proto::WriteObjectRequest> {
    let mut messages: Vec<proto::WriteObjectRequest> = bytes
        .chunks(chunk)
        .enumerate()
        .map(|(i, c)| proto::WriteObjectRequest {
            write_offset: (offset + i * chunk) as i64,
            data: Some(proto::write_object_request::Data::ChecksummedData(
                checksummed(c),
            )),
            ..Default::default()
        })
        .collect();
    if messages.is_empty() {
        messages.push(proto::WriteObjectRequest {
            write_offset: offset as i64,
            ..Default::default()
        });
    }
    messages[0].first_message = Some(first);
    if let Some(checksums) = finish {
        let last = messages.last_mut().unwrap();
        last.finish_write = true;
        last.object_checksums = Some(checksums);
    }
    messages
}

fn full_checksums(bytes: &[u8]) -> proto::ObjectChecksums {
    proto::ObjectChecksums {
        crc32c: Some(crc32c::crc32c(bytes)),
        md5_hash: md5::compute(bytes).0.to_vec(),
    }
}

async fn write(
    client: &mut StorageClient<Channel>,
    messages: Vec<proto::WriteObjectRequest>,
) -> Result<proto::write_object_response::WriteStatus, tonic::Status> {
    let response = client
        .write_object(tokio_stream::iter(messages))
        .await?
        .into_inner();
    Ok(response.write_status.expect("a write status"))
}

fn resource(status: proto::write_object_response::WriteStatus) -> proto::Object {
    match status {
        proto::write_object_response::WriteStatus::Resource(object) => object,
        other => panic!("expected the object, got {other:?}"),
    }
}

/// ReadObject: every response, in order.
async fn read(
    client: &mut StorageClient<Channel>,
    request: proto::ReadObjectRequest,
) -> Result<Vec<proto::ReadObjectResponse>, tonic::Status> {
    let mut stream = client.read_object(request).await?.into_inner();
    let mut responses = Vec::new();
    while let Some(response) = stream.next().await {
        responses.push(response?);
    }
    Ok(responses)
}

fn read_request(bucket_id: &str, name: &str, offset: i64, limit: i64) -> proto::ReadObjectRequest {
    proto::ReadObjectRequest {
        bucket: bucket(bucket_id),
        object: name.to_string(),
        read_offset: offset,
        read_limit: limit,
        ..Default::default()
    }
}

/// The data of read responses, checking every chunk's CRC32C and size.
fn joined(responses: &[proto::ReadObjectResponse]) -> Vec<u8> {
    let mut out = Vec::new();
    for data in responses.iter().filter_map(|r| r.checksummed_data.as_ref()) {
        assert!(data.content.len() <= 2 * MIB, "a chunk over 2 MiB");
        assert_eq!(data.crc32c, Some(crc32c::crc32c(&data.content)));
        out.extend_from_slice(&data.content);
    }
    out
}

fn status_code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> Code {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn a_streamed_write_reads_back_whole_and_in_ranges() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    let bytes = data(5 * MIB + 123, 7);
    let first = proto::write_object_request::FirstMessage::WriteObjectSpec(spec(PHOTOS, "a.jpg"));
    let messages = write_messages(first, 0, &bytes, MIB, Some(full_checksums(&bytes)));
    let object = resource(write(&mut client, messages).await?);
    assert_eq!(object.size, bytes.len() as i64);
    assert_eq!(object.bucket, bucket(PHOTOS));
    assert_eq!(object.content_type, "image/jpeg");
    assert_eq!(
        object.metadata.get("camera").map(String::as_str),
        Some("x100")
    );
    assert_eq!(object.checksums, Some(full_checksums(&bytes)));
    assert!(object.generation > 0 && object.finalize_time.is_some());
    assert_eq!(
        mock.handle().object_data(PHOTOS, "a.jpg").as_deref(),
        Some(&bytes[..])
    );
    assert_eq!(
        mock.handle().upload_count(),
        0,
        "a one-shot write leaves no session"
    );

    let responses = read(&mut client, read_request(PHOTOS, "a.jpg", 0, 0)).await?;
    let first = &responses[0];
    assert_eq!(first.metadata.as_ref(), Some(&object));
    assert_eq!(first.object_checksums, object.checksums);
    assert_eq!(
        first.content_range,
        Some(proto::ContentRange {
            start: 0,
            end: bytes.len() as i64,
            complete_length: bytes.len() as i64
        })
    );
    assert!(responses[1..].iter().all(|r| r.metadata.is_none()));
    assert_eq!(responses.len(), 3, "5 MiB in chunks of at most 2 MiB");
    assert_eq!(joined(&responses), bytes);

    let ranged = read(
        &mut client,
        read_request(PHOTOS, "a.jpg", 3 * MIB as i64 - 5, 1000),
    )
    .await?;
    assert_eq!(joined(&ranged), &bytes[3 * MIB - 5..3 * MIB + 995]);
    assert_eq!(
        ranged[0].content_range.map(|r| (r.start, r.end)),
        Some((3 * MIB as i64 - 5, 3 * MIB as i64 + 995))
    );
    let tail = read(&mut client, read_request(PHOTOS, "a.jpg", -100, 0)).await?;
    assert_eq!(joined(&tail), &bytes[bytes.len() - 100..]);
    let past_end = read(
        &mut client,
        read_request(PHOTOS, "a.jpg", bytes.len() as i64 + 1, 0),
    )
    .await;
    assert_eq!(status_code(past_end), Code::OutOfRange);

    // The same object through the metadata RPCs.
    let got = client
        .get_object(proto::GetObjectRequest {
            bucket: bucket(PHOTOS),
            object: "a.jpg".to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(got, object);
    let listed = client
        .list_objects(proto::ListObjectsRequest {
            parent: bucket(PHOTOS),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.objects, vec![object]);
    client
        .delete_object(proto::DeleteObjectRequest {
            bucket: bucket(PHOTOS),
            object: "a.jpg".to_string(),
            ..Default::default()
        })
        .await?;
    let gone = read(&mut client, read_request(PHOTOS, "a.jpg", 0, 0)).await;
    assert_eq!(status_code(gone), Code::NotFound);
    assert_eq!(mock.handle().object_data(PHOTOS, "a.jpg"), None);
    Ok(())
}

#[tokio::test]
async fn empty_objects_are_written_and_read() -> anyhow::Result<()> {
    let (_mock, mut client) = mock_with_buckets().await?;
    let first = proto::write_object_request::FirstMessage::WriteObjectSpec(spec(PHOTOS, "empty"));
    let object = resource(
        write(
            &mut client,
            write_messages(first, 0, &[], MIB, Some(full_checksums(&[]))),
        )
        .await?,
    );
    assert_eq!(object.size, 0);
    let responses = read(&mut client, read_request(PHOTOS, "empty", 0, 0)).await?;
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].metadata.as_ref().map(|o| o.size), Some(0));
    assert!(joined(&responses).is_empty());
    Ok(())
}

#[tokio::test]
async fn wrong_checksums_and_missing_targets_are_refused() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    let bytes = data(3 * MIB, 1);
    let spec_first =
        || proto::write_object_request::FirstMessage::WriteObjectSpec(spec(PHOTOS, "bad"));

    // A chunk whose CRC32C does not match its content.
    let mut messages = write_messages(spec_first(), 0, &bytes, MIB, Some(full_checksums(&bytes)));
    if let Some(proto::write_object_request::Data::ChecksummedData(d)) = messages[1].data.as_mut() {
        d.crc32c = Some(d.crc32c.unwrap() ^ 1);
    }
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::InvalidArgument
    );

    // Object checksums that do not match the data: CRC32C, then MD5.
    let mut wrong = full_checksums(&bytes);
    wrong.crc32c = wrong.crc32c.map(|c| c ^ 1);
    let messages = write_messages(spec_first(), 0, &bytes, MIB, Some(wrong));
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::InvalidArgument
    );
    let mut wrong = full_checksums(&bytes);
    wrong.md5_hash[0] ^= 1;
    let messages = write_messages(spec_first(), 0, &bytes, MIB, Some(wrong));
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::InvalidArgument
    );

    // Wrong object checksums on the first message, finish_write later.
    let mut messages = write_messages(spec_first(), 0, &bytes, MIB, Some(Default::default()));
    let mut wrong = full_checksums(&bytes);
    wrong.crc32c = wrong.crc32c.map(|c| c ^ 1);
    messages[0].object_checksums = Some(wrong);
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::InvalidArgument
    );

    // A one-shot stream that ends without finish_write.
    let messages = write_messages(spec_first(), 0, &bytes, MIB, None);
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::InvalidArgument
    );
    assert!(
        mock.handle().objects(PHOTOS).is_empty(),
        "nothing was stored"
    );
    assert_eq!(mock.handle().upload_count(), 0);

    // A missing bucket or object.
    let first =
        proto::write_object_request::FirstMessage::WriteObjectSpec(spec("nope-bucket", "x"));
    let messages = write_messages(first, 0, &bytes, MIB, Some(full_checksums(&bytes)));
    assert_eq!(
        status_code(write(&mut client, messages).await),
        Code::NotFound
    );
    let missing = read(&mut client, read_request(PHOTOS, "missing", 0, 0)).await;
    assert_eq!(status_code(missing), Code::NotFound);
    let missing = read(&mut client, read_request("nope-bucket", "x", 0, 0)).await;
    assert_eq!(status_code(missing), Code::NotFound);

    // if_generation_match = 0: only if the object does not exist yet.
    let mut guarded = spec(PHOTOS, "once");
    guarded.if_generation_match = Some(0);
    let first = proto::write_object_request::FirstMessage::WriteObjectSpec(guarded.clone());
    resource(
        write(
            &mut client,
            write_messages(first, 0, b"1", MIB, Some(full_checksums(b"1"))),
        )
        .await?,
    );
    let first = proto::write_object_request::FirstMessage::WriteObjectSpec(guarded);
    let again = write(
        &mut client,
        write_messages(first, 0, b"2", MIB, Some(full_checksums(b"2"))),
    )
    .await;
    assert_eq!(status_code(again), Code::FailedPrecondition);
    assert_eq!(
        mock.handle().object_data(PHOTOS, "once").as_deref(),
        Some(&b"1"[..])
    );
    Ok(())
}

#[tokio::test]
async fn resumable_writes_span_streams_and_report_their_state() -> anyhow::Result<()> {
    use proto::bidi_write_object_response::WriteStatus as Bidi;
    use proto::query_write_status_response::WriteStatus as Query;
    let (mock, mut client) = mock_with_buckets().await?;
    let bytes = data(6 * MIB + 17, 3);
    let upload_id = client
        .start_resumable_write(proto::StartResumableWriteRequest {
            write_object_spec: Some(spec(VIDEOS, "clip.mp4")),
            ..Default::default()
        })
        .await?
        .into_inner()
        .upload_id;
    assert!(!upload_id.is_empty());

    // A first WriteObject stream sends 2 MiB and stops without finishing.
    let first = proto::write_object_request::FirstMessage::UploadId(upload_id.clone());
    let status = write(
        &mut client,
        write_messages(first, 0, &bytes[..2 * MIB], MIB, None),
    )
    .await?;
    assert_eq!(
        status,
        proto::write_object_response::WriteStatus::PersistedSize(2 * MIB as i64)
    );
    let query = proto::QueryWriteStatusRequest {
        upload_id: upload_id.clone(),
        ..Default::default()
    };
    let persisted = client.query_write_status(query.clone()).await?.into_inner();
    assert_eq!(
        persisted.write_status,
        Some(Query::PersistedSize(2 * MIB as i64))
    );

    // A BidiWriteObject stream resends the last MiB (skipped), flushes with
    // a state lookup, then finishes.
    let mut requests = Vec::new();
    for (i, chunk) in bytes[MIB..].chunks(MIB).enumerate() {
        requests.push(proto::BidiWriteObjectRequest {
            first_message: (i == 0).then(|| {
                proto::bidi_write_object_request::FirstMessage::UploadId(upload_id.clone())
            }),
            write_offset: ((i + 1) * MIB) as i64,
            data: Some(proto::bidi_write_object_request::Data::ChecksummedData(
                checksummed(chunk),
            )),
            flush: i == 2,
            state_lookup: i == 2,
            ..Default::default()
        });
    }
    let last = requests.last_mut().unwrap();
    last.finish_write = true;
    last.object_checksums = Some(full_checksums(&bytes));
    let mut responses = client
        .bidi_write_object(tokio_stream::iter(requests))
        .await?
        .into_inner();
    let mut statuses = Vec::new();
    while let Some(response) = responses.next().await {
        statuses.push(response?.write_status.expect("a write status"));
    }
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert_eq!(statuses[0], Bidi::PersistedSize(4 * MIB as i64));
    let Bidi::Resource(object) = &statuses[1] else {
        panic!("expected the object last, got {statuses:?}");
    };
    assert_eq!(object.size, bytes.len() as i64);
    assert_eq!(
        mock.handle().object_data(VIDEOS, "clip.mp4").as_deref(),
        Some(&bytes[..])
    );
    let done = client.query_write_status(query).await?.into_inner();
    assert_eq!(done.write_status, Some(Query::Resource(object.clone())));

    // A gap is refused; an unknown session is NOT_FOUND.
    let upload_id = client
        .start_resumable_write(proto::StartResumableWriteRequest {
            write_object_spec: Some(spec(VIDEOS, "gap")),
            ..Default::default()
        })
        .await?
        .into_inner()
        .upload_id;
    let first = proto::write_object_request::FirstMessage::UploadId(upload_id);
    let gap = write(&mut client, write_messages(first, 10, b"late", MIB, None)).await;
    assert_eq!(status_code(gap), Code::OutOfRange);
    let unknown = client
        .query_write_status(proto::QueryWriteStatusRequest {
            upload_id: "no-such-upload".to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(status_code(unknown), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn bidi_reads_serve_ranges_as_they_are_asked() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    let bytes = data(3 * MIB, 9);
    let object = mock
        .handle()
        .put_object_data(PHOTOS, "big", bytes.clone())?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(proto::BidiReadObjectRequest {
        read_object_spec: Some(proto::BidiReadObjectSpec {
            bucket: bucket(PHOTOS),
            object: "big".to_string(),
            ..Default::default()
        }),
        read_ranges: vec![proto::ReadRange {
            read_offset: 10,
            read_length: 2 * MIB as i64 + 10,
            read_id: 1,
        }],
    })
    .await?;
    let mut responses = client
        .bidi_read_object(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let opening = responses.next().await.expect("a first response")?;
    assert_eq!(opening.metadata.as_ref(), Some(&object));
    assert!(opening.read_handle.is_some_and(|h| !h.handle.is_empty()));

    /// Collects one range's data: offsets contiguous, `range_end` last.
    async fn collect_range(
        responses: &mut tonic::Streaming<proto::BidiReadObjectResponse>,
        read_id: i64,
        mut offset: i64,
    ) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let response = responses.next().await.expect("range data")?;
            assert_eq!(response.object_data_ranges.len(), 1);
            let range = &response.object_data_ranges[0];
            let read_range = range.read_range.expect("a read range");
            assert_eq!(
                (read_range.read_id, read_range.read_offset),
                (read_id, offset)
            );
            let data = range.checksummed_data.as_ref().expect("data");
            assert_eq!(data.crc32c, Some(crc32c::crc32c(&data.content)));
            assert_eq!(read_range.read_length, data.content.len() as i64);
            offset += data.content.len() as i64;
            out.extend_from_slice(&data.content);
            if range.range_end {
                return Ok(out);
            }
        }
    }
    let first = collect_range(&mut responses, 1, 10).await?;
    assert_eq!(first, &bytes[10..2 * MIB + 20]);
    // A later message asks for two more ranges: the tail and everything
    // from an offset.
    tx.send(proto::BidiReadObjectRequest {
        read_object_spec: None,
        read_ranges: vec![
            proto::ReadRange {
                read_offset: -5,
                read_length: 0,
                read_id: 2,
            },
            proto::ReadRange {
                read_offset: 3 * MIB as i64 - 100,
                read_length: 0,
                read_id: 3,
            },
        ],
    })
    .await?;
    let tail = collect_range(&mut responses, 2, 3 * MIB as i64 - 5).await?;
    assert_eq!(tail, &bytes[3 * MIB - 5..]);
    let rest = collect_range(&mut responses, 3, 3 * MIB as i64 - 100).await?;
    assert_eq!(rest, &bytes[3 * MIB - 100..]);
    drop(tx);
    assert!(
        responses.next().await.is_none(),
        "the stream ends after the half-close"
    );
    let call = mock
        .handle()
        .calls()
        .into_iter()
        .find(|c| c.method == "BidiReadObject")
        .expect("the call is logged");
    assert_eq!((call.code, call.cancelled), (Code::Ok, false));

    // A range past the end fails the stream with OUT_OF_RANGE.
    let bad = proto::BidiReadObjectRequest {
        read_object_spec: Some(proto::BidiReadObjectSpec {
            bucket: bucket(PHOTOS),
            object: "big".to_string(),
            ..Default::default()
        }),
        read_ranges: vec![proto::ReadRange {
            read_offset: 4 * MIB as i64,
            read_length: 1,
            read_id: 1,
        }],
    };
    let mut responses = client
        .bidi_read_object(tokio_stream::iter([bad]))
        .await?
        .into_inner();
    responses.next().await.expect("the opening response")?;
    let failed = responses.next().await.expect("an error");
    assert_eq!(status_code(failed), Code::OutOfRange);
    Ok(())
}

#[tokio::test]
async fn compose_concatenates_and_rewrite_copies_across_buckets() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    let parts = [data(MIB + 1, 1), data(10, 2), data(3 * MIB, 3)];
    for (i, part) in parts.iter().enumerate() {
        mock.handle()
            .put_object_data(PHOTOS, &format!("part-{i}"), part.clone())?;
    }
    let whole = parts.concat();
    let composed = client
        .compose_object(proto::ComposeObjectRequest {
            destination: Some(proto::Object {
                bucket: bucket(PHOTOS),
                name: "whole".to_string(),
                content_type: "text/plain".to_string(),
                ..Default::default()
            }),
            source_objects: (0..3)
                .map(|i| proto::compose_object_request::SourceObject {
                    name: format!("part-{i}"),
                    ..Default::default()
                })
                .collect(),
            object_checksums: Some(proto::ObjectChecksums {
                crc32c: Some(crc32c::crc32c(&whole)),
                md5_hash: Vec::new(),
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(composed.size, whole.len() as i64);
    assert_eq!(composed.component_count, 3);
    assert_eq!(composed.content_type, "text/plain");
    assert_eq!(
        composed.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(&whole))
    );
    assert_eq!(
        mock.handle().object_data(PHOTOS, "whole").as_deref(),
        Some(&whole[..])
    );
    let read_back = read(&mut client, read_request(PHOTOS, "whole", 0, 0)).await?;
    assert_eq!(joined(&read_back), whole);

    let missing_source = client
        .compose_object(proto::ComposeObjectRequest {
            destination: Some(proto::Object {
                bucket: bucket(PHOTOS),
                name: "broken".to_string(),
                ..Default::default()
            }),
            source_objects: vec![proto::compose_object_request::SourceObject {
                name: "absent".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await;
    assert_eq!(status_code(missing_source), Code::NotFound);

    let rewritten = client
        .rewrite_object(proto::RewriteObjectRequest {
            source_bucket: bucket(PHOTOS),
            source_object: "whole".to_string(),
            destination_bucket: bucket(VIDEOS),
            destination_name: "copy".to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(rewritten.done && rewritten.rewrite_token.is_empty());
    assert_eq!(rewritten.total_bytes_rewritten, whole.len() as i64);
    let copy = rewritten.resource.expect("the new object");
    assert_eq!(
        (copy.bucket.as_str(), copy.name.as_str()),
        (bucket(VIDEOS).as_str(), "copy")
    );
    assert_eq!(copy.content_type, "text/plain");
    assert_ne!(copy.generation, composed.generation);
    assert_eq!(
        mock.handle().object_data(VIDEOS, "copy").as_deref(),
        Some(&whole[..])
    );
    let to_missing_bucket = client
        .rewrite_object(proto::RewriteObjectRequest {
            source_bucket: bucket(PHOTOS),
            source_object: "whole".to_string(),
            destination_bucket: bucket("nope-bucket"),
            destination_name: "copy".to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(status_code(to_missing_bucket), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn calls_record_their_metadata() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    mock.handle()
        .put_object_data(PHOTOS, "a", b"abc".to_vec())?;
    let mut request = Request::new(read_request(PHOTOS, "a", 0, 0));
    request.set_timeout(Duration::from_secs(30));
    let metadata = request.metadata_mut();
    metadata.insert(
        "x-goog-request-params",
        "bucket=projects/_/buckets/photos-k3x9q2mw".parse()?,
    );
    metadata.insert("authorization", "Bearer token-1".parse()?);
    let mut stream = client.read_object(request).await?.into_inner();
    while stream.next().await.transpose()?.is_some() {}
    let mut get = Request::new(proto::GetObjectRequest {
        bucket: bucket(PHOTOS),
        object: "a".to_string(),
        ..Default::default()
    });
    get.metadata_mut()
        .insert("authorization", "Bearer token-2".parse()?);
    client.get_object(get).await?;

    let calls = mock.handle().calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let read_call = &calls[0];
    assert_eq!(read_call.method, "ReadObject");
    assert_eq!(read_call.bucket.as_deref(), Some(PHOTOS));
    assert_eq!(read_call.project.as_deref(), Some(PROJECT));
    assert_eq!(
        read_call.header("x-goog-request-params"),
        Some("bucket=projects/_/buckets/photos-k3x9q2mw")
    );
    assert_eq!(read_call.header("authorization"), Some("Bearer token-1"));
    let timeout = read_call
        .header("grpc-timeout")
        .expect("grpc-timeout is recorded");
    assert!(timeout.ends_with(['m', 'u', 'S', 'n']), "{timeout}");
    assert!(!read_call.cancelled && read_call.code == Code::Ok);
    assert_eq!(calls[1].method, "GetObject");
    assert_eq!(calls[1].header("authorization"), Some("Bearer token-2"));
    assert_eq!(calls[1].header("grpc-timeout"), None);
    assert_ne!(calls[0].id, calls[1].id);
    Ok(())
}

/// Waits until the call log holds a call of `method` that is cancelled.
async fn cancelled_call(mock: &MockGcs, method: &str) -> Option<super::Call> {
    for _ in 0..100 {
        let found = mock
            .handle()
            .calls()
            .into_iter()
            .find(|c| c.method == method && c.cancelled);
        if found.is_some() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Opens a raw HTTP/2 gRPC call of `method`, sends `messages`, then resets
/// the stream with CANCEL, as a client that gives up does.
async fn reset_after<M: prost::Message>(
    mock: &MockGcs,
    method: &str,
    messages: &[M],
) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(mock.addr()).await?;
    let (client, connection) = h2::client::handshake(tcp).await?;
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await?;
    let request = http::Request::post(format!(
        "{}/google.storage.v2.Storage/{method}",
        mock.endpoint()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())?;
    let (_response, mut stream) = client.send_request(request, false)?;
    for message in messages {
        let body = message.encode_to_vec();
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(body.len())?.to_be_bytes());
        frame.extend_from_slice(&body);
        stream.send_data(frame.into(), false)?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stream.send_reset(h2::Reason::CANCEL);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(client);
    connection.abort();
    Ok(())
}

#[tokio::test]
async fn cancelled_calls_are_marked() -> anyhow::Result<()> {
    let (mock, mut client) = mock_with_buckets().await?;
    mock.handle()
        .put_object_data(PHOTOS, "big", data(20 * MIB, 1))?;

    // A reader that takes the first chunk, then drops the stream.
    let mut stream = client
        .read_object(read_request(PHOTOS, "big", 0, 0))
        .await?
        .into_inner();
    stream.next().await.expect("a first response")?;
    drop(stream);
    let call = cancelled_call(&mock, "ReadObject")
        .await
        .expect("a cancelled ReadObject");
    assert_eq!(call.code, Code::Cancelled);

    // A writer that resets its stream (RST_STREAM CANCEL) mid-write.
    let first = proto::write_object_request::FirstMessage::WriteObjectSpec(spec(PHOTOS, "w"));
    let messages = write_messages(first, 0, &data(MIB, 2), MIB / 2, None);
    reset_after(&mock, "WriteObject", &messages).await?;
    let call = cancelled_call(&mock, "WriteObject")
        .await
        .unwrap_or_else(|| panic!("no cancelled WriteObject in {:?}", mock.handle().calls()));
    assert_eq!(call.code, Code::Cancelled);
    assert!(mock.handle().objects(PHOTOS).iter().all(|o| o.name != "w"));
    assert_eq!(mock.handle().upload_count(), 0);

    // A unary call the client stops waiting for still completes, marked.
    mock.handle()
        .set_latency(Some("GetObject".to_string()), Duration::from_millis(500));
    let mut get = Request::new(proto::GetObjectRequest {
        bucket: bucket(PHOTOS),
        object: "big".to_string(),
        ..Default::default()
    });
    get.set_timeout(Duration::from_millis(100));
    let code = status_code(client.get_object(get).await);
    assert!(
        matches!(code, Code::Cancelled | Code::DeadlineExceeded),
        "{code:?}"
    );
    let call = cancelled_call(&mock, "GetObject")
        .await
        .expect("a cancelled GetObject");
    assert_eq!(call.code, Code::Ok, "the work completed on the server");
    Ok(())
}

#[tokio::test]
async fn a_gibibyte_is_written_and_read_back() -> anyhow::Result<()> {
    const GIB: usize = 1024 * MIB;
    let (mock, mut client) = mock_with_buckets().await?;
    let chunk = data(2 * MIB, 5);
    let chunk_crc = crc32c::crc32c(&chunk);
    let count = GIB / chunk.len();
    let expected_crc = (0..count).fold(0, |crc, _| {
        crc32c::crc32c_combine(crc, chunk_crc, chunk.len())
    });
    let messages = (0..count).map({
        let chunk = chunk.clone();
        move |i| proto::WriteObjectRequest {
            first_message: (i == 0).then(|| {
                proto::write_object_request::FirstMessage::WriteObjectSpec(spec(PHOTOS, "gib"))
            }),
            write_offset: (i * chunk.len()) as i64,
            data: Some(proto::write_object_request::Data::ChecksummedData(
                proto::ChecksummedData {
                    content: chunk.clone(),
                    crc32c: Some(chunk_crc),
                },
            )),
            finish_write: i + 1 == count,
            object_checksums: (i + 1 == count).then_some(proto::ObjectChecksums {
                crc32c: Some(expected_crc),
                md5_hash: Vec::new(),
            }),
            ..Default::default()
        }
    });
    let object = resource(
        client
            .write_object(tokio_stream::iter(messages))
            .await?
            .into_inner()
            .write_status
            .expect("a write status"),
    );
    assert_eq!(object.size, GIB as i64);
    let mut stream = client
        .read_object(read_request(PHOTOS, "gib", 0, 0))
        .await?
        .into_inner();
    let (mut len, mut crc) = (0usize, 0u32);
    while let Some(response) = stream.next().await {
        if let Some(data) = response?.checksummed_data {
            assert!(data.content.len() <= 2 * MIB);
            len += data.content.len();
            crc = crc32c::crc32c_append(crc, &data.content);
        }
    }
    assert_eq!((len, crc), (GIB, expected_crc));
    drop(mock);
    Ok(())
}
