//! The bucket settings GCS fills in and refuses (autoclass, rpo,
//! configurable dual-regions, hierarchical namespace, CMEK, logging, IP
//! filter), driven
//! by the real `google-cloud-storage` client as the operator uses it.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use anyhow::Context as _;
use google_cloud_gax::error::rpc::Code;
use google_cloud_storage::client::StorageControl;
use google_cloud_storage::model::{Bucket, bucket};

use super::MockGcs;
use super::tests::client;

const PROJECT: &str = "acme-staging";

async fn create(
    client: &StorageControl,
    id: &str,
    bucket: Bucket,
) -> google_cloud_storage::Result<Bucket> {
    client
        .create_bucket()
        .set_parent(format!("projects/{PROJECT}"))
        .set_bucket_id(id)
        .set_bucket(bucket)
        .send()
        .await
}

async fn update(
    client: &StorageControl,
    id: &str,
    patch: Bucket,
    mask: &[&str],
) -> google_cloud_storage::Result<Bucket> {
    client
        .update_bucket()
        .set_bucket(patch.set_name(format!("projects/_/buckets/{id}")))
        .set_update_mask(google_cloud_wkt::FieldMask::default().set_paths(mask.iter().copied()))
        .send()
        .await
}

/// The gRPC code and message of a failed call; panics on success.
fn refusal<T: std::fmt::Debug>(result: google_cloud_storage::Result<T>) -> (Code, String) {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => {
            let status = err
                .status()
                .unwrap_or_else(|| panic!("no status in {err:?}"));
            (status.code, status.message.clone())
        }
    }
}

fn ubla(enabled: bool) -> bucket::IamConfig {
    bucket::IamConfig::new().set_uniform_bucket_level_access(
        bucket::iam_config::UniformBucketLevelAccess::new().set_enabled(enabled),
    )
}

fn hns() -> bucket::HierarchicalNamespace {
    bucket::HierarchicalNamespace::new().set_enabled(true)
}

fn placement(regions: [&str; 2]) -> bucket::CustomPlacementConfig {
    bucket::CustomPlacementConfig::new().set_data_locations(regions)
}

#[tokio::test]
async fn autoclass_gets_nearline_as_its_terminal_class_and_a_toggle_time() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let autoclass = bucket::Autoclass::new().set_enabled(true);
    let created = create(&client, "auto-a", Bucket::new().set_autoclass(autoclass)).await?;
    let got = created.autoclass.context("no autoclass")?;
    assert!(got.enabled);
    assert_eq!(got.terminal_storage_class.as_deref(), Some("NEARLINE"));
    assert_eq!(got.toggle_time, created.create_time);

    let archive = bucket::Autoclass::new()
        .set_enabled(true)
        .set_terminal_storage_class("ARCHIVE");
    let updated = update(
        &client,
        "auto-a",
        Bucket::new().set_autoclass(archive),
        &["autoclass"],
    )
    .await?;
    let got = updated.autoclass.context("no autoclass")?;
    assert_eq!(got.terminal_storage_class.as_deref(), Some("ARCHIVE"));
    assert_eq!(
        got.toggle_time, created.create_time,
        "still enabled: not toggled"
    );

    let off = bucket::Autoclass::new().set_enabled(false);
    let updated = update(
        &client,
        "auto-a",
        Bucket::new().set_autoclass(off),
        &["autoclass"],
    )
    .await?;
    let got = updated.autoclass.context("no autoclass")?;
    assert!(!got.enabled);
    assert_eq!(got.terminal_storage_class, None);
    assert_ne!(got.toggle_time, created.create_time, "toggled off");

    // Refused: another default class, a SetStorageClass rule, a warm terminal class.
    let on = || bucket::Autoclass::new().set_enabled(true);
    let nearline = Bucket::new()
        .set_autoclass(on())
        .set_storage_class("NEARLINE");
    let (code, message) = refusal(create(&client, "auto-b", nearline).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("must be STANDARD"), "{message}");
    let rule = bucket::lifecycle::Rule::new()
        .set_action(
            bucket::lifecycle::rule::Action::new()
                .set_type("SetStorageClass")
                .set_storage_class("COLDLINE"),
        )
        .set_condition(bucket::lifecycle::rule::Condition::new().set_age_days(30));
    let with_rule = Bucket::new()
        .set_autoclass(on())
        .set_lifecycle(bucket::Lifecycle::new().set_rule([rule]));
    let (code, message) = refusal(create(&client, "auto-b", with_rule).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("SetStorageClass"), "{message}");
    let coldline = Bucket::new().set_autoclass(on().set_terminal_storage_class("COLDLINE"));
    let (code, _) = refusal(create(&client, "auto-b", coldline).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(mock.handle().bucket("auto-b").is_none(), "nothing created");
    Ok(())
}

#[tokio::test]
async fn rpo_defaults_on_dual_and_multi_regions_and_turbo_needs_a_dual_region() -> anyhow::Result<()>
{
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let multi = create(&client, "rpo-multi", Bucket::new().set_location("US")).await?;
    assert_eq!(
        (multi.location_type.as_str(), multi.rpo.as_str()),
        ("multi-region", "DEFAULT")
    );
    let dual = create(&client, "rpo-dual", Bucket::new().set_location("NAM4")).await?;
    assert_eq!(
        (dual.location_type.as_str(), dual.rpo.as_str()),
        ("dual-region", "DEFAULT")
    );
    let region = create(
        &client,
        "rpo-region",
        Bucket::new().set_location("europe-west1"),
    )
    .await?;
    assert_eq!(
        (region.location_type.as_str(), region.rpo.as_str()),
        ("region", "")
    );
    let custom = create(
        &client,
        "rpo-custom",
        Bucket::new()
            .set_location("us")
            .set_custom_placement_config(placement(["us-east1", "us-west1"]))
            .set_rpo("ASYNC_TURBO"),
    )
    .await?;
    assert_eq!(custom.location_type, "dual-region");
    assert_eq!(custom.rpo, "ASYNC_TURBO");
    let regions = custom
        .custom_placement_config
        .context("no placement")?
        .data_locations;
    assert_eq!(regions, ["US-EAST1", "US-WEST1"]);

    let turbo = || Bucket::new().set_rpo("ASYNC_TURBO");
    let (code, message) = refusal(update(&client, "rpo-multi", turbo(), &["rpo"]).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("dual-region"), "{message}");
    let (code, _) = refusal(
        update(
            &client,
            "rpo-region",
            Bucket::new().set_rpo("DEFAULT"),
            &["rpo"],
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument);
    let updated = update(&client, "rpo-dual", turbo(), &["rpo"]).await?;
    assert_eq!(updated.rpo, "ASYNC_TURBO");
    let updated = update(
        &client,
        "rpo-dual",
        Bucket::new().set_rpo("DEFAULT"),
        &["rpo"],
    )
    .await?;
    assert_eq!(updated.rpo, "DEFAULT");
    Ok(())
}

#[tokio::test]
async fn placement_and_hierarchical_namespace_are_fixed_at_creation() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    // A hierarchical namespace needs uniform bucket-level access.
    let (code, message) = refusal(
        create(
            &client,
            "hns-a",
            Bucket::new()
                .set_hierarchical_namespace(hns())
                .set_iam_config(ubla(false)),
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("uniform bucket-level access"), "{message}");
    let created = create(
        &client,
        "hns-a",
        Bucket::new()
            .set_hierarchical_namespace(hns())
            .set_iam_config(ubla(true)),
    )
    .await?;
    assert!(created.hierarchical_namespace.is_some_and(|h| h.enabled));
    let (code, _) = refusal(
        update(
            &client,
            "hns-a",
            Bucket::new().set_iam_config(ubla(false)),
            &["iam_config.uniform_bucket_level_access"],
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument, "uniform access stays on");
    let off = Bucket::new().set_hierarchical_namespace(bucket::HierarchicalNamespace::new());
    let (code, message) = refusal(update(&client, "hns-a", off, &["hierarchical_namespace"]).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("cannot be changed"), "{message}");

    // A configurable dual-region: two regions of a multi-region, for good.
    let (code, _) = refusal(
        create(
            &client,
            "dual-a",
            Bucket::new()
                .set_location("europe-west1")
                .set_custom_placement_config(placement(["europe-west1", "europe-west4"])),
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument, "not a multi-region");
    create(
        &client,
        "dual-a",
        Bucket::new()
            .set_location("EU")
            .set_custom_placement_config(placement(["europe-west1", "europe-west4"])),
    )
    .await?;
    let moved =
        Bucket::new().set_custom_placement_config(placement(["europe-west1", "europe-north1"]));
    let (code, _) = refusal(update(&client, "dual-a", moved, &["custom_placement_config"]).await);
    assert_eq!(code, Code::InvalidArgument);
    let stored = mock.handle().bucket("dual-a").context("gone")?;
    let regions = stored
        .custom_placement_config
        .context("no placement")?
        .data_locations;
    assert_eq!(regions, ["EUROPE-WEST1", "EUROPE-WEST4"]);
    Ok(())
}

#[tokio::test]
async fn keys_logging_and_the_other_settings_are_kept_as_sent() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let key = "projects/p/locations/us/keyRings/r/cryptoKeys/k";
    let (code, message) = refusal(
        create(
            &client,
            "cmek-a",
            Bucket::new().set_encryption(
                bucket::Encryption::new().set_default_kms_key(format!("{key}/cryptoKeyVersions/1")),
            ),
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("Cloud KMS key"), "{message}");
    let elsewhere = "projects/p/locations/europe/keyRings/r/cryptoKeys/k";
    let (code, message) = refusal(
        create(
            &client,
            "cmek-a",
            Bucket::new()
                .set_location("US")
                .set_encryption(bucket::Encryption::new().set_default_kms_key(elsewhere)),
        )
        .await,
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("needs a key in us"), "{message}");
    let created = create(
        &client,
        "cmek-a",
        Bucket::new()
            .set_location("US")
            .set_encryption(bucket::Encryption::new().set_default_kms_key(key))
            .set_logging(bucket::Logging::new().set_log_bucket("projects/_/buckets/logs-a"))
            .set_cors([bucket::Cors::new()
                .set_origin(["https://example.com"])
                .set_method(["GET"])])
            .set_website(bucket::Website::new().set_main_page_suffix("index.html"))
            .set_billing(bucket::Billing::new().set_requester_pays(true))
            .set_default_event_based_hold(true),
    )
    .await?;
    assert_eq!(
        created
            .encryption
            .as_ref()
            .map(|e| e.default_kms_key.as_str()),
        Some(key)
    );
    let logging = created.logging.context("no logging")?;
    assert_eq!(logging.log_bucket, "projects/_/buckets/logs-a");
    assert_eq!(logging.log_object_prefix, "cmek-a", "GCS's default prefix");
    assert_eq!(created.cors.len(), 1);
    assert_eq!(
        created.website.map(|w| w.main_page_suffix),
        Some("index.html".to_string())
    );
    assert!(created.billing.is_some_and(|b| b.requester_pays));
    assert!(created.default_event_based_hold);

    // The key alone is cleared; the rest of the encryption config stays.
    let updated = update(
        &client,
        "cmek-a",
        Bucket::new(),
        &["encryption.default_kms_key", "logging", "cors"],
    )
    .await?;
    assert_eq!(
        updated.encryption.map(|e| e.default_kms_key),
        Some(String::new())
    );
    assert_eq!(updated.logging, None);
    assert!(updated.cors.is_empty());
    assert!(updated.default_event_based_hold, "not in the mask");
    Ok(())
}

fn ip_filter(mode: &str, public: &[&str], vpcs: &[(&str, &[&str])]) -> bucket::IpFilter {
    use bucket::ip_filter::{PublicNetworkSource, VpcNetworkSource};
    bucket::IpFilter::new()
        .set_mode(mode)
        .set_public_network_source(
            PublicNetworkSource::new().set_allowed_ip_cidr_ranges(public.iter().copied()),
        )
        .set_vpc_network_sources(vpcs.iter().map(|(network, ranges)| {
            VpcNetworkSource::new()
                .set_network(*network)
                .set_allowed_ip_cidr_ranges(ranges.iter().copied())
        }))
        .set_allow_all_service_agent_access(false)
}

#[tokio::test]
async fn an_ip_filter_is_kept_as_sent_and_malformed_ones_refused() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let vpc = "projects/net-p/global/networks/default";
    let many: Vec<String> = (0..201)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let bad = [
        (ip_filter("On", &["10.0.0.0/8"], &[]), "invalid mode"),
        (
            ip_filter("Enabled", &["192.0.2.1/24"], &[]),
            "host bits zero",
        ),
        (
            ip_filter("Enabled", &["2001:db8::1/32"], &[]),
            "host bits zero",
        ),
        (ip_filter("Enabled", &["10.0.0.0/33"], &[]), "CIDR notation"),
        (
            ip_filter("Enabled", &["example.com/8"], &[]),
            "CIDR notation",
        ),
        (
            ip_filter("Enabled", &[], &[("default", &["10.0.0.0/8"])]),
            "invalid network",
        ),
        (ip_filter("Enabled", &many, &[]), "201 ranges, at most 200"),
    ];
    for (filter, why) in bad {
        let (code, message) =
            refusal(create(&client, "ipf-a", Bucket::new().set_ip_filter(filter)).await);
        assert_eq!(code, Code::InvalidArgument, "{message}");
        assert!(message.contains(why), "expected {why:?} in {message}");
    }
    assert!(
        mock.handle().bucket("ipf-a").is_none(),
        "a refused create created nothing"
    );

    let filter = ip_filter(
        "Enabled",
        &["203.0.113.0/24", "2001:db8::/32"],
        &[(vpc, &["10.8.0.0/14"])],
    );
    let created = create(
        &client,
        "ipf-a",
        Bucket::new().set_ip_filter(filter.clone()),
    )
    .await?;
    assert_eq!(created.ip_filter.as_ref(), Some(&filter));
    // A bad update is refused and changes nothing; a good one replaces it.
    let patch = Bucket::new().set_ip_filter(ip_filter("Enabled", &["10.0.0.1/8"], &[]));
    let (code, _) = refusal(update(&client, "ipf-a", patch, &["ip_filter"]).await);
    assert_eq!(code, Code::InvalidArgument);
    assert_eq!(
        mock.handle()
            .bucket("ipf-a")
            .and_then(|b| b.ip_filter)
            .map(|f| f.mode),
        Some(Some("Enabled".to_string()))
    );
    let off = ip_filter("Disabled", &["203.0.113.0/24"], &[]);
    let updated = update(
        &client,
        "ipf-a",
        Bucket::new().set_ip_filter(off.clone()),
        &["ip_filter"],
    )
    .await?;
    assert_eq!(updated.ip_filter, Some(off));
    // In the mask but not in the patch: cleared.
    let cleared = update(&client, "ipf-a", Bucket::new(), &["ip_filter"]).await?;
    assert_eq!(cleared.ip_filter, None);
    Ok(())
}

/// A lifecycle condition from its JSON form (dates as `{year, month, day}`).
fn condition(json: serde_json::Value) -> bucket::lifecycle::rule::Condition {
    serde_json::from_value(json).expect("a lifecycle condition")
}

fn delete_rule(condition: bucket::lifecycle::rule::Condition) -> bucket::Lifecycle {
    let rule = bucket::lifecycle::Rule::new()
        .set_action(bucket::lifecycle::rule::Action::new().set_type("Delete"))
        .set_condition(condition);
    bucket::Lifecycle::new().set_rule([rule])
}

#[tokio::test]
async fn lifecycle_conditions_are_kept_as_sent_and_empty_or_invalid_ones_refused()
-> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let every = condition(serde_json::json!({
        "customTimeBefore": {"year": 2024, "month": 2, "day": 29},
        "daysSinceCustomTime": 7,
        "noncurrentTimeBefore": {"year": 2023, "month": 12, "day": 1},
        "daysSinceNoncurrentTime": 30,
        "matchesPrefix": ["logs/", "tmp/"],
        "matchesSuffix": [".gz", ".zip"],
    }));
    assert!(every.custom_time_before.is_some() && every.noncurrent_time_before.is_some());
    let created = create(
        &client,
        "life-a",
        Bucket::new().set_lifecycle(delete_rule(every.clone())),
    )
    .await?;
    let rules = created.lifecycle.context("no lifecycle")?.rule;
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].condition, Some(every));

    let refused = [
        (serde_json::json!({}), "at least one condition"),
        (
            serde_json::json!({"customTimeBefore": {"year": 2023, "month": 2, "day": 29}}),
            "invalid date",
        ),
        (
            serde_json::json!({"noncurrentTimeBefore": {"year": 2024, "month": 13, "day": 1}}),
            "invalid date",
        ),
    ];
    for (json, expected) in refused {
        let patch = Bucket::new().set_lifecycle(delete_rule(condition(json.clone())));
        let (code, message) = refusal(update(&client, "life-a", patch, &["lifecycle"]).await);
        assert_eq!(code, Code::InvalidArgument, "{json}");
        assert!(message.contains(expected), "{json}: {message}");
    }
    let kept = mock.handle().bucket("life-a").context("the bucket")?;
    assert_eq!(kept.metageneration, 1, "no refused update was applied");
    Ok(())
}

fn retention(seconds: i64) -> bucket::RetentionPolicy {
    bucket::RetentionPolicy::new()
        .set_retention_duration(google_cloud_wkt::Duration::clamp(seconds, 0))
}

async fn lock(
    client: &StorageControl,
    id: &str,
    metageneration: i64,
) -> google_cloud_storage::Result<Bucket> {
    client
        .lock_bucket_retention_policy()
        .set_bucket(format!("projects/_/buckets/{id}"))
        .set_if_metageneration_match(metageneration)
        .send()
        .await
}

#[tokio::test]
async fn a_retention_policy_locks_at_the_current_metageneration_and_never_shrinks()
-> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    create(&client, "plain", Bucket::new()).await?;
    let (code, message) = refusal(lock(&client, "plain", 1).await);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(message.contains("no retention policy"), "{message}");

    let created = create(
        &client,
        "worm",
        Bucket::new().set_retention_policy(retention(3600)),
    )
    .await?;
    let policy = created.retention_policy.clone().context("a policy")?;
    assert!(!policy.is_locked, "a new policy is unlocked");
    let (code, _) = refusal(lock(&client, "worm", 0).await);
    assert_eq!(code, Code::InvalidArgument, "the precondition is required");
    let (code, message) = refusal(lock(&client, "worm", created.metageneration + 1).await);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(message.contains("metageneration"), "{message}");
    assert!(
        !mock
            .handle()
            .bucket("worm")
            .and_then(|b| b.retention_policy)
            .context("a policy")?
            .is_locked,
        "a refused lock locks nothing"
    );
    let locked = lock(&client, "worm", created.metageneration).await?;
    assert!(
        locked
            .retention_policy
            .as_ref()
            .is_some_and(|p| p.is_locked)
    );
    assert_eq!(locked.metageneration, created.metageneration + 1);
    let again = lock(&client, "worm", locked.metageneration).await?;
    assert_eq!(again.metageneration, locked.metageneration, "no change");

    // Removed or shortened: PERMISSION_DENIED (GCS's documented answer).
    let cases = [
        ("removed", Bucket::new()),
        (
            "shortened",
            Bucket::new().set_retention_policy(retention(60)),
        ),
    ];
    for (what, patch) in cases {
        let (code, message) = refusal(update(&client, "worm", patch, &["retention_policy"]).await);
        assert_eq!(code, Code::PermissionDenied, "{what}");
        assert!(message.contains("locked"), "{what}: {message}");
    }
    let longer = Bucket::new().set_retention_policy(retention(7200));
    let grown = update(&client, "worm", longer, &["retention_policy"]).await?;
    let policy = grown.retention_policy.context("a policy")?;
    assert!(policy.is_locked, "still locked");
    assert_eq!(policy.retention_duration.map(|d| d.seconds()), Some(7200));
    Ok(())
}

async fn delete_object(
    client: &StorageControl,
    id: &str,
    object: &str,
    generation: i64,
) -> google_cloud_storage::Result<()> {
    client
        .delete_object()
        .set_bucket(format!("projects/_/buckets/{id}"))
        .set_object(object)
        .set_generation(generation)
        .send()
        .await
}

#[tokio::test]
async fn objects_under_retention_cannot_be_deleted_until_it_passes() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    create(
        &client,
        "worm",
        Bucket::new().set_retention_policy(retention(3600)),
    )
    .await?;
    let young = handle.put_object("worm", "young.txt")?;
    let old = handle.put_object("worm", "old.txt")?;
    let aged = handle.modify_objects("worm", "old.txt", |o| {
        if let Some(t) = o.create_time.as_mut() {
            t.seconds -= 3601;
        }
    });
    assert_eq!(aged, 1);
    let listed = client
        .list_objects()
        .set_parent("projects/_/buckets/worm")
        .send()
        .await?;
    assert_eq!(listed.objects.len(), 2);
    for o in &listed.objects {
        let expiry = o.retention_expire_time.context("an expiry")?.seconds();
        let created = o.create_time.context("a creation time")?.seconds();
        assert_eq!(expiry - created, 3600, "{}", o.name);
    }
    let (code, message) =
        refusal(delete_object(&client, "worm", "young.txt", young.generation).await);
    assert_eq!(code, Code::PermissionDenied);
    assert!(message.contains("retention"), "{message}");
    // Replacing it would delete it: refused too, and the object is kept.
    let replaced = handle.put_object("worm", "young.txt");
    let err = replaced.expect_err("a retained object cannot be replaced");
    assert!(err.to_string().contains("overwritten"), "{err}");
    let kept = handle.objects("worm");
    assert!(
        kept.iter().any(|o| o.generation == young.generation),
        "{kept:?}"
    );
    delete_object(&client, "worm", "old.txt", old.generation).await?;
    assert_eq!(
        handle.objects("worm").len(),
        1,
        "only the young one is left"
    );

    // An unlocked policy removed, nothing holds the object any more.
    update(&client, "worm", Bucket::new(), &["retention_policy"]).await?;
    delete_object(&client, "worm", "young.txt", young.generation).await?;
    assert!(handle.objects("worm").is_empty());
    Ok(())
}

#[tokio::test]
async fn object_retention_is_enabled_at_creation_only_and_holds_objects() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    let enabled = client
        .create_bucket()
        .set_parent(format!("projects/{PROJECT}"))
        .set_bucket_id("kept")
        .set_bucket(Bucket::new())
        .set_enable_object_retention(true)
        .send()
        .await?;
    assert!(enabled.object_retention.is_some_and(|r| r.enabled));
    let output_only =
        Bucket::new().set_object_retention(bucket::ObjectRetention::new().set_enabled(true));
    let plain = create(&client, "plain", output_only).await?;
    assert!(
        plain.object_retention.is_none_or(|r| !r.enabled),
        "output only: the request's flag enables it, not the bucket field"
    );
    let (code, message) =
        refusal(update(&client, "kept", Bucket::new(), &["object_retention"]).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("cannot be changed"), "{message}");

    let object = handle.put_object("kept", "contract.pdf")?;
    handle.modify_objects("kept", "contract.pdf", |o| {
        let until = o.create_time.map(|t| prost_types::Timestamp {
            seconds: t.seconds + 86400,
            nanos: 0,
        });
        o.retention = Some(super::proto::object::Retention {
            mode: 2,
            retain_until_time: until,
        });
    });
    let (code, _) =
        refusal(delete_object(&client, "kept", "contract.pdf", object.generation).await);
    assert_eq!(code, Code::PermissionDenied);
    assert_eq!(handle.objects("kept").len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_held_object_cannot_be_deleted_until_its_hold_is_released() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let handle = mock.handle();
    let client = client(&mock).await?;
    create(&client, "held", Bucket::new()).await?;
    let object = handle.put_object("held", "a.txt")?;
    for temporary in [true, false] {
        handle.modify_objects("held", "a.txt", |o| {
            o.temporary_hold = temporary;
            o.event_based_hold = Some(!temporary);
        });
        let (code, message) =
            refusal(delete_object(&client, "held", "a.txt", object.generation).await);
        assert_eq!(code, Code::PermissionDenied, "temporary hold: {temporary}");
        assert!(message.contains("hold"), "{message}");
    }
    handle.modify_objects("held", "a.txt", |o| o.event_based_hold = Some(false));
    delete_object(&client, "held", "a.txt", object.generation).await?;
    assert!(handle.objects("held").is_empty(), "released, then deleted");
    Ok(())
}

#[tokio::test]
async fn without_get_ip_filter_a_bucket_is_returned_without_its_filter() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let filter = ip_filter("Enabled", &["203.0.113.0/24"], &[]);
    let seen = |b: &Bucket| b.ip_filter.clone();
    let created = create(
        &client,
        "ipf-h",
        Bucket::new().set_ip_filter(filter.clone()),
    )
    .await?;
    assert_eq!(seen(&created), Some(filter.clone()));
    let ask = |permissions: &[&str]| {
        client
            .test_iam_permissions()
            .set_resource("projects/_/buckets/ipf-h")
            .set_permissions(permissions.iter().map(|p| p.to_string()))
            .send()
    };
    let both = ["storage.buckets.get", "storage.buckets.getIpFilter"];
    assert_eq!(ask(&both).await?.permissions, both);

    mock.handle()
        .withhold_permission("storage.buckets.getIpFilter");
    assert_eq!(ask(&both).await?.permissions, ["storage.buckets.get"]);
    let got = client
        .get_bucket()
        .set_name("projects/_/buckets/ipf-h")
        .send()
        .await?;
    assert_eq!(seen(&got), None, "hidden from the caller");
    let patch = Bucket::new().set_labels([("team", "a")]);
    let updated = update(&client, "ipf-h", patch, &["labels"]).await?;
    assert_eq!(seen(&updated), None, "hidden in an update's answer too");
    let stored = mock.handle().bucket("ipf-h").and_then(|b| b.ip_filter);
    assert_eq!(
        stored.map(|f| f.mode),
        Some(Some("Enabled".to_string())),
        "still there"
    );
    let missing = client
        .test_iam_permissions()
        .set_resource("projects/_/buckets/no-such")
        .set_permissions(["storage.buckets.get"])
        .send()
        .await;
    assert_eq!(refusal(missing).0, Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn versioning_and_a_retention_policy_exclude_each_other() -> anyhow::Result<()> {
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let versioning = bucket::Versioning::new().set_enabled(true);
    let both = Bucket::new()
        .set_versioning(versioning.clone())
        .set_retention_policy(retention(3600));
    let (code, message) = refusal(create(&client, "vr-a", both).await);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("cannot both be enabled"), "{message}");
    assert!(mock.handle().bucket("vr-a").is_none());
    // Added later, either one is refused while the other is on.
    create(
        &client,
        "vr-a",
        Bucket::new().set_retention_policy(retention(3600)),
    )
    .await?;
    let patch = Bucket::new().set_versioning(versioning);
    let (code, _) = refusal(update(&client, "vr-a", patch, &["versioning"]).await);
    assert_eq!(code, Code::InvalidArgument);
    update(&client, "vr-a", Bucket::new(), &["retention_policy"]).await?;
    let versioning = bucket::Versioning::new().set_enabled(true);
    let patch = Bucket::new().set_versioning(versioning);
    update(&client, "vr-a", patch, &["versioning"]).await?;
    Ok(())
}

#[tokio::test]
async fn abort_incomplete_uploads_takes_only_age_and_name_conditions() -> anyhow::Result<()> {
    use bucket::lifecycle::rule::{Action, Condition};
    let mock = MockGcs::start().await?;
    let client = client(&mock).await?;
    let rule = |condition: Condition| {
        let action = Action::new().set_type("AbortIncompleteMultipartUpload");
        bucket::lifecycle::Rule::new()
            .set_action(action)
            .set_condition(condition)
    };
    let with = |condition: Condition| {
        Bucket::new().set_lifecycle(bucket::Lifecycle::new().set_rule([rule(condition)]))
    };
    for refused in [
        Condition::new().set_age_days(7).set_is_live(true),
        Condition::new().set_num_newer_versions(2),
        Condition::new().set_days_since_custom_time(3),
        Condition::new().set_matches_storage_class(["STANDARD"]),
    ] {
        let (code, message) = refusal(create(&client, "aimu-a", with(refused)).await);
        assert_eq!(code, Code::InvalidArgument, "{message}");
        assert!(message.contains("only the age, matchesPrefix"), "{message}");
    }
    let allowed = Condition::new()
        .set_age_days(7)
        .set_matches_prefix(["uploads/"])
        .set_matches_suffix([".bin"]);
    create(&client, "aimu-a", with(allowed)).await?;
    Ok(())
}
