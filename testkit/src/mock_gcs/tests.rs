//! The mock driven by the real `google-cloud-storage` client, as the
//! operator uses it.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use anyhow::Context as _;
use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_storage::client::StorageControl;
use google_cloud_storage::model::{Bucket, bucket};

use super::{Fault, MockGcs, proto};

const STAGING: &str = "acme-staging";
const PROD: &str = "acme-prod";

/// A client like the operator's, without retries so every call is visible.
pub(super) async fn client(mock: &MockGcs) -> anyhow::Result<StorageControl> {
    StorageControl::builder()
        .with_endpoint(mock.endpoint())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .with_retry_policy(NeverRetry)
        .build()
        .await
        .context("cannot build the StorageControl client")
}

/// A client with the library's default retry policy and quick backoff.
async fn retrying_client(mock: &MockGcs) -> anyhow::Result<StorageControl> {
    let backoff = ExponentialBackoffBuilder::new()
        .with_initial_delay(Duration::from_millis(10))
        .with_maximum_delay(Duration::from_millis(50))
        .build()?;
    StorageControl::builder()
        .with_endpoint(mock.endpoint())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .with_backoff_policy(backoff)
        .build()
        .await
        .context("cannot build the StorageControl client")
}

fn name(id: &str) -> String {
    format!("projects/_/buckets/{id}")
}

async fn create(
    client: &StorageControl,
    project: &str,
    id: &str,
) -> google_cloud_storage::Result<Bucket> {
    client
        .create_bucket()
        .set_parent("projects/_")
        .set_bucket_id(id)
        .set_bucket(Bucket::new().set_project(format!("projects/{project}")))
        .send()
        .await
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

fn message<T: std::fmt::Debug>(result: google_cloud_storage::Result<T>) -> String {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => err.status().map(|s| s.message.clone()).unwrap_or_default(),
    }
}

#[tokio::test]
async fn create_then_get_shows_the_sent_and_server_fields() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let created = client
        .create_bucket()
        .set_parent("projects/_")
        .set_bucket_id("photos-k3x9q2mw")
        .set_bucket(
            Bucket::new()
                .set_project(format!("projects/{STAGING}"))
                .set_location("us-central1")
                .set_labels([("bucketmap-dev-owner", "team-a")])
                .set_versioning(bucket::Versioning::new().set_enabled(true))
                .set_iam_config(
                    bucket::IamConfig::new()
                        .set_uniform_bucket_level_access(
                            bucket::iam_config::UniformBucketLevelAccess::new().set_enabled(true),
                        )
                        .set_public_access_prevention("enforced"),
                ),
        )
        .send()
        .await?;
    let got = client
        .get_bucket()
        .set_name(name("photos-k3x9q2mw"))
        .send()
        .await?;
    assert_eq!(got, created);
    assert_eq!(got.name, "projects/_/buckets/photos-k3x9q2mw");
    assert_eq!(got.bucket_id, "photos-k3x9q2mw");
    assert_eq!(got.project, "projects/acme-staging");
    assert_eq!(got.metageneration, 1);
    assert_eq!(got.location, "US-CENTRAL1");
    assert_eq!(got.storage_class, "STANDARD");
    assert!(got.create_time.is_some() && got.update_time.is_some());
    assert!(!got.etag.is_empty());
    assert_eq!(
        got.labels.get("bucketmap-dev-owner").map(String::as_str),
        Some("team-a")
    );
    assert!(got.versioning.is_some_and(|v| v.enabled));
    let iam = got.iam_config.context("no iam_config")?;
    assert_eq!(iam.public_access_prevention, "enforced");
    assert!(iam.uniform_bucket_level_access.is_some_and(|u| u.enabled));
    assert_eq!(
        mock.handle().bucket_project("photos-k3x9q2mw").as_deref(),
        Some(STAGING)
    );
    let calls = mock.handle().calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].method, "CreateBucket");
    assert_eq!(calls[0].project.as_deref(), Some(STAGING));
    assert_eq!(calls[0].bucket.as_deref(), Some("photos-k3x9q2mw"));
    assert_eq!(calls[0].code, tonic::Code::Ok);
    assert_eq!(calls[1].method, "GetBucket");
    assert_eq!(calls[1].project.as_deref(), Some(STAGING));
    Ok(())
}

#[tokio::test]
async fn create_accepts_the_project_in_parent_and_defaults_location() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let created = client
        .create_bucket()
        .set_parent(format!("projects/{PROD}"))
        .set_bucket_id("logs-a1b2c3d4")
        .send()
        .await?;
    assert_eq!(created.project, "projects/acme-prod");
    assert_eq!(created.location, "US");
    assert_eq!(
        mock.handle().bucket_project("logs-a1b2c3d4").as_deref(),
        Some(PROD)
    );
    assert_eq!(
        code(create(&client, STAGING, "Bad_Name").await),
        Code::InvalidArgument
    );
    Ok(())
}

#[tokio::test]
async fn bucket_ids_are_global_across_projects() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    create(&client, STAGING, "photos-k3x9q2mw").await?;

    let err = create(&client, PROD, "photos-k3x9q2mw")
        .await
        .expect_err("the id is taken");
    assert_eq!(err.status().map(|s| s.code), Some(Code::AlreadyExists));
    // The underlying tonic::Status is reachable too.
    let tonic_status = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<tonic::Status>())
        .context("no tonic::Status source")?;
    assert_eq!(tonic_status.code(), tonic::Code::AlreadyExists);
    assert!(tonic_status.message().contains("not available"));

    assert!(message(create(&client, STAGING, "photos-k3x9q2mw").await).contains("already own it"));
    assert_eq!(
        mock.handle().bucket_project("photos-k3x9q2mw").as_deref(),
        Some(STAGING)
    );
    let last = mock.handle().calls().pop().context("no calls")?;
    assert_eq!(last.code, tonic::Code::AlreadyExists);
    assert_eq!(last.project.as_deref(), Some(STAGING));
    Ok(())
}

#[tokio::test]
async fn get_honours_metageneration_and_reports_missing_buckets() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let missing = client.get_bucket().set_name(name("nope-0000")).send().await;
    assert!(message(missing).contains("nope-0000"));
    assert_eq!(
        code(client.get_bucket().set_name(name("nope-0000")).send().await),
        Code::NotFound
    );

    create(&client, STAGING, "photos-k3x9q2mw").await?;
    let get = |m: i64| {
        client
            .get_bucket()
            .set_name(name("photos-k3x9q2mw"))
            .set_if_metageneration_match(m)
            .send()
    };
    assert_eq!(get(1).await?.metageneration, 1);
    assert_eq!(code(get(2).await), Code::FailedPrecondition);
    let not_match = client
        .get_bucket()
        .set_name(name("photos-k3x9q2mw"))
        .set_if_metageneration_not_match(1)
        .send()
        .await;
    assert_eq!(code(not_match), Code::FailedPrecondition);
    Ok(())
}

#[tokio::test]
async fn update_applies_the_mask_under_a_metageneration_precondition() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    create(&client, STAGING, "photos-k3x9q2mw").await?;
    let desired = Bucket::new()
        .set_name(name("photos-k3x9q2mw"))
        .set_labels([("env", "staging")])
        .set_storage_class("NEARLINE")
        .set_versioning(bucket::Versioning::new().set_enabled(true));
    let update = |mask: &[&str], metageneration: i64| {
        client
            .update_bucket()
            .set_bucket(desired.clone())
            .set_update_mask(google_cloud_wkt::FieldMask::default().set_paths(mask.iter().copied()))
            .set_if_metageneration_match(metageneration)
            .send()
    };

    let updated = update(&["labels", "versioning"], 1).await?;
    assert_eq!(updated.metageneration, 2);
    assert_eq!(
        updated.labels.get("env").map(String::as_str),
        Some("staging")
    );
    assert!(updated.versioning.is_some_and(|v| v.enabled));
    assert_eq!(updated.storage_class, "STANDARD", "not in the mask");

    // A stale precondition changes nothing.
    assert_eq!(
        code(update(&["storage_class"], 1).await),
        Code::FailedPrecondition
    );
    assert_eq!(code(update(&["location"], 2).await), Code::InvalidArgument);
    let stored = mock.handle().bucket("photos-k3x9q2mw").context("gone")?;
    assert_eq!(stored.metageneration, 2);
    assert_eq!(stored.storage_class, "STANDARD");

    let updated = update(&["storage_class"], 2).await?;
    assert_eq!(updated.storage_class, "NEARLINE");
    assert_eq!(updated.metageneration, 3);
    Ok(())
}

#[tokio::test]
async fn out_of_band_drift_bumps_the_metageneration() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    create(&client, STAGING, "photos-k3x9q2mw").await?;
    mock.handle().modify_bucket("photos-k3x9q2mw", |b| {
        b.labels.insert("drift".into(), "yes".into());
    })?;
    let got = client
        .get_bucket()
        .set_name(name("photos-k3x9q2mw"))
        .send()
        .await?;
    assert_eq!(got.metageneration, 2);
    assert_eq!(got.labels.get("drift").map(String::as_str), Some("yes"));
    assert!(mock.handle().modify_bucket("nope-0000", |_| {}).is_err());
    Ok(())
}

#[tokio::test]
async fn delete_refuses_a_non_empty_bucket_until_every_version_is_gone() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    handle.insert_bucket(
        STAGING,
        proto::Bucket {
            bucket_id: "photos-k3x9q2mw".into(),
            versioning: Some(proto::bucket::Versioning { enabled: true }),
            ..Default::default()
        },
    )?;
    handle.put_object("photos-k3x9q2mw", "a.jpg")?;
    handle.put_object("photos-k3x9q2mw", "a.jpg")?;
    handle.put_object("photos-k3x9q2mw", "b.jpg")?;
    assert_eq!(handle.objects("photos-k3x9q2mw").len(), 3);

    let delete = || {
        client
            .delete_bucket()
            .set_name(name("photos-k3x9q2mw"))
            .send()
    };
    let refused = delete().await;
    assert!(message(refused).contains("not empty"));
    assert_eq!(code(delete().await), Code::FailedPrecondition);

    let list = |versions: bool| {
        client
            .list_objects()
            .set_parent(name("photos-k3x9q2mw"))
            .set_versions(versions)
            .send()
    };
    assert_eq!(list(false).await?.objects.len(), 2, "live objects only");
    let all = list(true).await?.objects;
    assert_eq!(all.len(), 3);
    for object in all.iter().take(2) {
        client
            .delete_object()
            .set_bucket(name("photos-k3x9q2mw"))
            .set_object(&object.name)
            .set_generation(object.generation)
            .send()
            .await?;
    }
    assert_eq!(code(delete().await), Code::FailedPrecondition, "one left");
    let last = &all[2];
    client
        .delete_object()
        .set_bucket(name("photos-k3x9q2mw"))
        .set_object(&last.name)
        .set_generation(last.generation)
        .send()
        .await?;
    delete().await?;
    assert!(handle.bucket("photos-k3x9q2mw").is_none());
    assert_eq!(code(delete().await), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn objects_follow_versioning() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    for (id, enabled) in [("plain-bucket", false), ("versioned-bucket", true)] {
        handle.insert_bucket(
            STAGING,
            proto::Bucket {
                bucket_id: id.into(),
                versioning: Some(proto::bucket::Versioning { enabled }),
                ..Default::default()
            },
        )?;
        let first = handle.put_object(id, "x")?;
        let second = handle.put_object(id, "x")?;
        assert!(second.generation > first.generation);
        let live = client
            .get_object()
            .set_bucket(name(id))
            .set_object("x")
            .send()
            .await?;
        assert_eq!(live.generation, second.generation);
        // Deleting the live version without a generation.
        client
            .delete_object()
            .set_bucket(name(id))
            .set_object("x")
            .send()
            .await?;
        let left = handle.objects(id);
        let get_live = client
            .get_object()
            .set_bucket(name(id))
            .set_object("x")
            .send()
            .await;
        assert_eq!(code(get_live), Code::NotFound);
        if enabled {
            assert_eq!(left.len(), 2, "both generations are noncurrent");
            assert!(left.iter().all(|o| o.delete_time.is_some()));
        } else {
            assert!(left.is_empty(), "{left:?}");
        }
    }
    let missing = client
        .delete_object()
        .set_bucket(name("plain-bucket"))
        .set_object("x")
        .send()
        .await;
    assert_eq!(code(missing), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn listings_filter_by_prefix_and_page() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    for id in ["photos-1", "photos-2", "photos-3", "videos-1"] {
        create(&client, STAGING, id).await?;
    }
    create(&client, PROD, "photos-9").await?;
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_buckets()
            .set_parent(format!("projects/{STAGING}"))
            .set_prefix("photos-")
            .set_page_size(2)
            .set_page_token(token)
            .send()
            .await?;
        assert!(page.buckets.len() <= 2);
        ids.extend(page.buckets.into_iter().map(|b| b.bucket_id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(ids, ["photos-1", "photos-2", "photos-3"]);

    for object in ["a/1", "a/2", "a/3", "b/1", "c"] {
        handle.put_object("photos-1", object)?;
    }
    let mut names = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client
            .list_objects()
            .set_parent(name("photos-1"))
            .set_prefix("a/")
            .set_page_size(2)
            .set_page_token(token)
            .send()
            .await?;
        pages += 1;
        names.extend(page.objects.into_iter().map(|o| o.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(names, ["a/1", "a/2", "a/3"]);
    assert_eq!(pages, 2);
    let folders = client
        .list_objects()
        .set_parent(name("photos-1"))
        .set_delimiter("/")
        .send()
        .await?;
    assert_eq!(folders.prefixes, ["a/", "b/"]);
    let top: Vec<&str> = folders.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(top, ["c"]);
    let missing = client
        .list_objects()
        .set_parent(name("nope-0000"))
        .send()
        .await;
    assert_eq!(code(missing), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn faults_apply_the_given_number_of_times() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    create(&client, STAGING, "photos-k3x9q2mw").await?;
    handle.add_fault(
        Fault::new("GetBucket", tonic::Code::Unavailable)
            .bucket("photos-k3x9q2mw")
            .times(2),
    );
    let get = || client.get_bucket().set_name(name("photos-k3x9q2mw")).send();
    assert_eq!(code(get().await), Code::Unavailable);
    assert_eq!(code(get().await), Code::Unavailable);
    get().await?;
    let codes: Vec<tonic::Code> = handle
        .calls()
        .into_iter()
        .filter(|c| c.method == "GetBucket")
        .map(|c| c.code)
        .collect();
    assert_eq!(
        codes,
        [
            tonic::Code::Unavailable,
            tonic::Code::Unavailable,
            tonic::Code::Ok
        ]
    );

    // Filters: a fault for another project does not fire.
    handle.add_fault(Fault::new("GetBucket", tonic::Code::PermissionDenied).project(PROD));
    get().await?;
    handle.add_fault(Fault::any_method(tonic::Code::Internal));
    assert_eq!(code(get().await), Code::Internal);
    handle.clear_faults();
    get().await?;
    Ok(())
}

#[tokio::test]
async fn after_write_faults_lose_the_response_but_keep_the_change() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    handle.add_fault(
        Fault::new("CreateBucket", tonic::Code::Unavailable)
            .project(STAGING)
            .times(1)
            .after_write(),
    );
    assert_eq!(
        code(create(&client, STAGING, "photos-k3x9q2mw").await),
        Code::Unavailable
    );
    assert_eq!(
        handle.bucket_project("photos-k3x9q2mw").as_deref(),
        Some(STAGING),
        "the bucket exists although the call failed"
    );
    assert_eq!(
        code(create(&client, STAGING, "photos-k3x9q2mw").await),
        Code::AlreadyExists
    );
    Ok(())
}

#[tokio::test]
async fn the_default_client_retries_a_lost_create_into_already_exists() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = retrying_client(&mock).await?;
    handle.add_fault(
        Fault::new("CreateBucket", tonic::Code::Unavailable)
            .times(1)
            .after_write(),
    );
    let result = create(&client, STAGING, "photos-k3x9q2mw").await;
    assert!(message(result).contains("already own it"));
    assert_eq!(handle.call_count("CreateBucket"), 2);
    Ok(())
}

#[tokio::test]
async fn the_bucket_rate_limit_is_per_project() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    handle.set_bucket_rate_limit(Some(Duration::from_secs(60)));
    create(&client, STAGING, "photos-1").await?;
    let second = create(&client, STAGING, "photos-2").await;
    assert!(message(second).contains("rateLimitExceeded"));
    assert_eq!(
        code(
            client
                .delete_bucket()
                .set_name(name("photos-1"))
                .send()
                .await
        ),
        Code::ResourceExhausted
    );
    create(&client, PROD, "photos-3").await?;
    assert_eq!(handle.quota_errors(), 2);
    assert!(handle.bucket("photos-2").is_none());

    handle.set_bucket_rate_limit(Some(Duration::from_millis(200)));
    tokio::time::sleep(Duration::from_millis(250)).await;
    create(&client, STAGING, "photos-2").await?;
    handle.set_bucket_rate_limit(None);
    create(&client, STAGING, "photos-4").await?;
    assert_eq!(handle.quota_errors(), 2);
    Ok(())
}

#[tokio::test]
async fn latency_delays_the_chosen_method() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    create(&client, STAGING, "photos-k3x9q2mw").await?;
    // The latency is the behaviour under test, so the calls are timed: the
    // delay is an order of magnitude above what an undelayed call takes on
    // a loaded machine, so the bound on the other method cannot fail by
    // chance.
    let latency = Duration::from_secs(3);
    handle.set_latency(Some("GetBucket".into()), latency);
    let started = Instant::now();
    client
        .get_bucket()
        .set_name(name("photos-k3x9q2mw"))
        .send()
        .await?;
    assert!(started.elapsed() >= latency);
    let started = Instant::now();
    client
        .list_buckets()
        .set_parent(format!("projects/{STAGING}"))
        .send()
        .await?;
    assert!(started.elapsed() < latency, "{:?}", started.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_slow_call_completes_although_the_client_gave_up() -> anyhow::Result<()> {
    use google_cloud_gax::options::RequestOptionsBuilder as _;
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    // Long enough that the bucket cannot exist yet when the client's
    // attempt has timed out, however loaded the machine.
    handle.set_latency(Some("CreateBucket".into()), Duration::from_secs(4));
    let result = client
        .create_bucket()
        .set_parent(format!("projects/{STAGING}"))
        .set_bucket_id("photos-k3x9q2mw")
        .with_attempt_timeout(Duration::from_millis(100))
        .send()
        .await;
    let err = result.expect_err("the attempt times out");
    assert!(err.is_timeout(), "{err:?}");
    assert!(handle.bucket("photos-k3x9q2mw").is_none(), "not yet");
    // The mock finishes the call on its own: wait for the bucket.
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.bucket("photos-k3x9q2mw").is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(handle.bucket("photos-k3x9q2mw").is_some());
    assert_eq!(handle.calls().len(), 1);
    Ok(())
}

#[tokio::test]
async fn other_methods_are_unimplemented() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let result = client
        .restore_object()
        .set_bucket(name("photos-k3x9q2mw"))
        .set_object("photo.jpg")
        .set_generation(1)
        .send()
        .await;
    assert_eq!(code(result), Code::Unimplemented);
    Ok(())
}

#[tokio::test]
async fn state_survives_a_restart_on_the_same_port() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let (addr, handle) = (mock.addr(), mock.handle());
    create(&client(&mock).await?, STAGING, "photos-k3x9q2mw").await?;
    mock.shutdown().await;
    let mock = MockGcs::start_with(addr, handle).await?;
    let got = client(&mock)
        .await?
        .get_bucket()
        .set_name(name("photos-k3x9q2mw"))
        .send()
        .await?;
    assert_eq!(got.project, "projects/acme-staging");
    assert_eq!(mock.handle().call_count("CreateBucket"), 1);
    mock.shutdown().await;
    Ok(())
}
