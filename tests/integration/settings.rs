//! The bucket settings of issue 38 (encryption, CORS, website, billing,
//! logging, event-based hold, autoclass, hierarchical namespace, placement,
//! rpo, lifecycle conditions, retention lock, object retention) on a real
//! API server against the in-memory GCS: refused at admission with a clear
//! message, applied on create, corrected on drift, never written when in
//! sync, and, for those GCS fixes at creation, reported instead of
//! corrected; a locked retention policy is never undone, and keeps a
//! `forceDestroy` deletion waiting until its objects expire.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::Duration;

use anyhow::Context as _;

use bucketmap::crd::Gcs;
use bucketmap_testkit::mock_gcs::proto;
use common::{Fixture, PROJECT, physical};

type TestResult = anyhow::Result<()>;

const KEY: &str = "projects/kms-p/locations/us/keyRings/ring/cryptoKeys/photos";
const VPC: &str = "projects/net-p/global/networks/prod";
const TOPIC: &str = "projects/acme-test/topics/photo-events";

/// A spec with every setting of issue 38 set.
fn every_setting() -> serde_json::Value {
    serde_json::json!({
        "bucketName": "photos",
        "location": "US",
        "encryption": {"defaultKmsKeyName": KEY},
        "cors": [{"origin": ["https://photos.example.com"], "method": ["GET", "HEAD"],
                  "responseHeader": ["Content-Type"], "maxAgeSeconds": 3600}],
        "website": {"mainPageSuffix": "index.html", "notFoundPage": "404.html"},
        "billing": {"requesterPays": true},
        "logging": {"logBucket": "photo-logs", "logObjectPrefix": "photos/"},
        "defaultEventBasedHold": true,
        "autoclass": {"enabled": true, "terminalStorageClass": "ARCHIVE"},
        "hierarchicalNamespace": {"enabled": true},
        "customPlacementConfig": {"dataLocations": ["us-east1", "us-west1"]},
        "rpo": "ASYNC_TURBO",
        "ipFilter": {"mode": "Enabled",
                     "publicNetworkSource": {"allowedIpCidrRanges": ["203.0.113.0/24"]},
                     "vpcNetworkSources": [{"network": VPC, "allowedIpCidrRanges": ["10.8.0.0/14"]}]},
        "notifications": [{"topic": TOPIC, "eventTypes": ["OBJECT_FINALIZE"],
                           "objectNamePrefix": "uploads/", "customAttributes": {"app": "photos"}}],
        "lifecycleRules": [
            {"action": {"type": "Delete"}, "condition": {"ageDays": 365}},
            {"action": {"type": "Delete"}, "condition": {
                "customTimeBefore": "2030-01-31", "daysSinceCustomTime": 90,
                "noncurrentTimeBefore": "2029-02-28", "daysSinceNoncurrentTime": 30,
                "matchesPrefix": ["tmp/", "cache/"], "matchesSuffix": [".gz", ".zip"]}}
        ]
    })
}

fn manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {{name: {name}}}\nspec: {spec}\n"
    )
}

/// The bucket has every setting of [`every_setting`] as GCS keeps it.
fn assert_every_setting(b: &proto::Bucket) {
    let key = b.encryption.as_ref().map(|e| e.default_kms_key.as_str());
    assert_eq!(key, Some(KEY));
    assert_eq!(b.cors.len(), 1, "{:?}", b.cors);
    assert_eq!(b.cors[0].origin, ["https://photos.example.com"]);
    assert_eq!(b.cors[0].method, ["GET", "HEAD"]);
    assert_eq!(b.cors[0].response_header, ["Content-Type"]);
    assert_eq!(b.cors[0].max_age_seconds, 3600);
    let website = b.website.clone().unwrap_or_default();
    assert_eq!(
        (
            website.main_page_suffix.as_str(),
            website.not_found_page.as_str()
        ),
        ("index.html", "404.html")
    );
    assert!(b.billing.is_some_and(|b| b.requester_pays));
    let logging = b.logging.clone().unwrap_or_default();
    assert_eq!(logging.log_bucket, "projects/_/buckets/photo-logs");
    assert_eq!(logging.log_object_prefix, "photos/");
    assert!(b.default_event_based_hold);
    let autoclass = b.autoclass.clone().unwrap_or_default();
    assert!(autoclass.enabled);
    assert_eq!(autoclass.terminal_storage_class.as_deref(), Some("ARCHIVE"));
    assert!(b.hierarchical_namespace.is_some_and(|h| h.enabled));
    let placement = b.custom_placement_config.clone().unwrap_or_default();
    assert_eq!(placement.data_locations, ["US-EAST1", "US-WEST1"]);
    assert_eq!(b.location_type, "dual-region");
    assert_eq!(b.rpo, "ASYNC_TURBO");
    let filter = b.ip_filter.clone().unwrap_or_default();
    assert_eq!(filter.mode.as_deref(), Some("Enabled"));
    let public = filter.public_network_source.unwrap_or_default();
    assert_eq!(public.allowed_ip_cidr_ranges, ["203.0.113.0/24"]);
    assert_eq!(filter.vpc_network_sources.len(), 1);
    let vpc = &filter.vpc_network_sources[0];
    assert_eq!(vpc.network.as_deref(), Some(VPC));
    assert_eq!(vpc.allowed_ip_cidr_ranges, ["10.8.0.0/14"]);
    assert_eq!(filter.allow_all_service_agent_access, Some(false));
    let rules = b.lifecycle.clone().unwrap_or_default().rule;
    assert_eq!(rules.len(), 2, "{rules:?}");
    let c = rules[1].condition.clone().unwrap_or_default();
    let custom = c.custom_time_before.map(|d| (d.year, d.month, d.day));
    assert_eq!(custom, Some((2030, 1, 31)));
    let noncurrent = c.noncurrent_time_before.map(|d| (d.year, d.month, d.day));
    assert_eq!(noncurrent, Some((2029, 2, 28)));
    assert_eq!(c.days_since_custom_time, Some(90));
    assert_eq!(c.days_since_noncurrent_time, Some(30));
    assert_eq!(c.matches_prefix, ["tmp/", "cache/"]);
    assert_eq!(c.matches_suffix, [".gz", ".zip"]);
}

/// Waits until `check` holds for bucket `id` in the mock.
async fn wait_bucket(
    f: &Fixture,
    id: &str,
    what: &str,
    check: impl Fn(&proto::Bucket) -> bool,
) -> anyhow::Result<proto::Bucket> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let b = f.gcs.bucket(id);
        if let Some(b) = b.as_ref().filter(|b| check(b)) {
            return Ok(b.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what} not reached: {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn admission_refuses_each_invalid_setting_with_a_clear_message() -> TestResult {
    let f = Fixture::new().await?;
    let cases = [
        (
            "{bucketName: photos, notifications: [{topic: uploads}]}",
            "notifications[].topic must be a Pub/Sub topic of the form projects/PROJECT/topics/TOPIC",
        ),
        (
            "{bucketName: photos, notifications: [{topic: projects/acme-test/topics/goog-events}]}",
            "Pub/Sub reserves topic names that start with 'goog'",
        ),
        (
            "{bucketName: photos, notifications: [{topic: projects/acme-test/topics/t1}, {topic: projects/acme-test/topics/t1, payloadFormat: JSON_API_V1}]}",
            "notifications must not list the same configuration twice",
        ),
        (
            "{bucketName: photos, notifications: [{topic: projects/acme-test/topics/t1, eventTypes: [OBJECT_DELETE, OBJECT_DELETE]}]}",
            "notifications[].eventTypes must not list an event twice",
        ),
        (
            "{bucketName: photos, notifications: [{topic: projects/acme-test/topics/t1, eventTypes: [OBJECT_CREATE]}]}",
            "Unsupported value: \"OBJECT_CREATE\"",
        ),
        (
            "{bucketName: p, encryption: {defaultKmsKeyName: my-key}}",
            "must be a Cloud KMS key name of the form projects/PROJECT/locations/LOCATION/keyRings/RING/cryptoKeys/KEY",
        ),
        (
            "{bucketName: photos, encryption: {defaultKmsKeyName: 'projects/p/locations/us/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1'}}",
            "a key, not a key version",
        ),
        (
            "{bucketName: photos, location: europe-west1, encryption: {defaultKmsKeyName: projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k}}",
            "encryption.defaultKmsKeyName must be a key in the bucket's location",
        ),
        (
            "{bucketName: photos, location: EU, encryption: {defaultKmsKeyName: projects/p/locations/eu/keyRings/r/cryptoKeys/k}}",
            "or in us, europe or asia for the US, EU and ASIA multi-regions",
        ),
        (
            "{bucketName: photos, cors: [{origin: ['*'], method: [get]}]}",
            "CORS methods are HTTP methods in upper case",
        ),
        (
            "{bucketName: photos, logging: {logObjectPrefix: logs/}}",
            "logging.logObjectPrefix needs logging.logBucket",
        ),
        (
            "{bucketName: photos, logging: {logBucket: 'Logs!'}}",
            "logging.logBucket must be the name of a GCS bucket",
        ),
        (
            "{bucketName: photos, autoclass: {enabled: true}, lifecycleRules: [{action: {type: SetStorageClass, storageClass: COLDLINE}, condition: {ageDays: 30}}]}",
            "a lifecycle rule with a SetStorageClass action is not allowed while autoclass is enabled",
        ),
        (
            "{bucketName: photos, autoclass: {enabled: true}, storageClass: NEARLINE}",
            "autoclass needs storageClass STANDARD",
        ),
        (
            "{bucketName: photos, autoclass: {enabled: false, terminalStorageClass: ARCHIVE}}",
            "terminalStorageClass applies only when autoclass is enabled",
        ),
        (
            "{bucketName: photos, autoclass: {enabled: true, terminalStorageClass: COLDLINE}}",
            "Unsupported value: \"COLDLINE\"",
        ),
        (
            "{bucketName: photos, hierarchicalNamespace: {enabled: true}, uniformBucketLevelAccess: false}",
            "hierarchicalNamespace needs uniformBucketLevelAccess",
        ),
        (
            "{bucketName: photos, location: europe-west1, customPlacementConfig: {dataLocations: [europe-west1, europe-west4]}}",
            "customPlacementConfig needs location to be the multi-region (US, EU or ASIA)",
        ),
        (
            "{bucketName: photos, location: EU, customPlacementConfig: {dataLocations: [europe-west1]}}",
            "should have at least 2 items",
        ),
        (
            "{bucketName: photos, location: US, rpo: ASYNC_TURBO}",
            "rpo ASYNC_TURBO (turbo replication) needs a dual-region bucket",
        ),
        (
            "{bucketName: photos, location: us-central1, rpo: DEFAULT}",
            "rpo applies to dual- and multi-region buckets only",
        ),
        (
            "{bucketName: photos, location: EU, rpo: FAST}",
            "Unsupported value: \"FAST\"",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: Delete}, condition: {customTimeBefore: '2024-13-01'}}]}",
            "customTimeBefore in body should match",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: Delete}, condition: {noncurrentTimeBefore: 2024-1-1}}]}",
            "noncurrentTimeBefore in body should match",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: Delete}, condition: {daysSinceCustomTime: -1}}]}",
            "daysSinceCustomTime in body should be greater than or equal to 0",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: Delete}, condition: {matchesPrefix: ['']}}]}",
            "matchesPrefix[0] in body should be at least 1 chars long",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: Delete}, condition: {}}]}",
            "a lifecycle condition needs at least one field",
        ),
        (
            "{bucketName: photos, lifecycleRules: [{action: {type: AbortIncompleteMultipartUpload}, condition: {ageDays: 7, isLive: true}}]}",
            "an AbortIncompleteMultipartUpload rule takes only the conditions ageDays, matchesPrefix and matchesSuffix",
        ),
        (
            "{bucketName: photos, versioning: true, retentionPolicy: {retentionPeriodSeconds: 3600}}",
            "versioning and retentionPolicy cannot both be set",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: Enabled}}",
            "ipFilter.mode Enabled needs a publicNetworkSource or vpcNetworkSources",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: enabled}}",
            "Unsupported value: \"enabled\"",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: Enabled, publicNetworkSource: {allowedIpCidrRanges: ['10.0.0.0/33']}}}",
            "ipFilter ranges must be IPv4 or IPv6 ranges in CIDR notation",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: Enabled, publicNetworkSource: {allowedIpCidrRanges: [example.com]}}}",
            "ipFilter ranges must be IPv4 or IPv6 ranges in CIDR notation",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: Enabled, vpcNetworkSources: [{network: default, allowedIpCidrRanges: ['10.0.0.0/8']}]}}",
            "must be a VPC network name of the form projects/PROJECT/global/networks/NETWORK",
        ),
        (
            "{bucketName: photos, ipFilter: {mode: Enabled, vpcNetworkSources: [{network: projects/p/global/networks/n, allowedIpCidrRanges: []}]}}",
            "should have at least 1 items",
        ),
    ];
    for (spec, message) in cases {
        let out = f.kubectl_apply(&manifest("bad", spec)).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{spec} was accepted");
        assert!(
            stderr.contains(message),
            "{spec}: expected {message:?} in {stderr}"
        );
    }

    // A key in the bucket's region, or in the multi-region's KMS location.
    for (name, location, key_location) in [
        ("regional", "EUROPE-WEST1", "europe-west1"),
        ("multi", "eu", "europe"),
    ] {
        let spec = format!(
            "{{bucketName: {name}, location: {location}, encryption: {{defaultKmsKeyName: projects/p/locations/{key_location}/keyRings/r/cryptoKeys/k}}}}"
        );
        let out = f.kubectl_apply(&manifest(name, &spec)).await?;
        assert!(
            out.status.success(),
            "{spec}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Every setting at once is valid.
    let all = serde_json::to_string(&every_setting())?;
    let ok = f.kubectl_apply(&manifest("photos", &all)).await?;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // What GCS fixes at creation cannot be changed, added or removed; the
    // case of a region is no change.
    let mut changes = Vec::new();
    for (path, value) in [
        (
            "hierarchicalNamespace",
            serde_json::json!({"enabled": false}),
        ),
        ("hierarchicalNamespace", serde_json::Value::Null),
        (
            "customPlacementConfig",
            serde_json::json!({"dataLocations": ["us-east1", "us-east4"]}),
        ),
        ("customPlacementConfig", serde_json::Value::Null),
    ] {
        let mut spec = every_setting();
        if let Some(fields) = spec.as_object_mut() {
            match value {
                serde_json::Value::Null => fields.remove(path),
                v => fields.insert(path.to_owned(), v),
            };
        }
        changes.push((path, spec));
    }
    for (path, spec) in changes {
        let out = f
            .kubectl_apply(&manifest("photos", &serde_json::to_string(&spec)?))
            .await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "change of {path} was accepted: {spec}"
        );
        let message = match path {
            "hierarchicalNamespace" => {
                "spec.hierarchicalNamespace is set when the bucket is created and never changed"
            }
            _ => "spec.customPlacementConfig is immutable",
        };
        assert!(
            stderr.contains(message),
            "{path}: expected {message:?} in {stderr}"
        );
    }
    let mut same = every_setting();
    same["customPlacementConfig"] = serde_json::json!({"dataLocations": ["US-EAST1", "US-WEST1"]});
    same["rpo"] = serde_json::json!("DEFAULT");
    let out = f
        .kubectl_apply(&manifest("photos", &serde_json::to_string(&same)?))
        .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // kubectl explain shows the doc comments.
    let out = f
        .kubectl(&["explain", "gcs.spec.autoclass.terminalStorageClass"])
        .await?;
    let explained = String::from_utf8_lossy(&out.stdout);
    assert!(
        explained.contains("NEARLINE (GCS's default) or ARCHIVE"),
        "{explained}"
    );
    let out = f
        .kubectl(&["explain", "gcs.spec.notifications.payloadFormat"])
        .await?;
    let explained = String::from_utf8_lossy(&out.stdout);
    assert!(
        explained.contains("`NONE` (attributes only)"),
        "{explained}"
    );
    Ok(())
}

/// Waits until bucket `id` has `count` notification configurations.
async fn wait_notifications(f: &Fixture, id: &str, count: usize, what: &str) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while f.gcs.notifications(id).len() != count {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: {:?}",
            f.gcs.notifications(id)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Forgets the mock's call log, then waits until three resyncs have read
/// the bucket (at most 30 s): the log then holds what steady state does.
async fn three_resyncs(f: &Fixture) {
    f.gcs.reset_calls();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while f.gcs.call_count("GetBucket") < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no resyncs: {:?}",
            f.gcs.calls()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_setting_is_applied_on_create_and_nothing_is_written_in_sync() -> TestResult {
    let f = Fixture::started().await?;
    f.gcs.add_topic(TOPIC);
    f.create("photos", every_setting()).await?;
    let g = f.wait_ready("photos").await?;
    let id = physical(&g);
    let bucket = f.gcs.bucket(&id).expect("bucket exists");
    assert_every_setting(&bucket);
    f.wait_for(
        "photos",
        Duration::from_secs(30),
        "the notification made",
        |g| {
            let conditions = g.status.as_ref().map(|s| s.conditions.as_slice());
            conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Notifications" && c.status == "True")
        },
    )
    .await?;
    let notifications = f.gcs.notifications(&id);
    assert_eq!(notifications.len(), 1, "{notifications:?}");
    assert_eq!(
        notifications[0]["topic"],
        format!("//pubsub.googleapis.com/{TOPIC}")
    );
    assert_eq!(notifications[0]["object_name_prefix"], "uploads/");
    assert_eq!(f.gcs.call_count("CreateBucket"), 1);
    let out = f
        .kubectl(&["get", "gcs", "photos", "-o", "wide", "-n", &f.ns])
        .await?;
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert_eq!(
        lines[0][6..],
        ["LOCATION", "CLASS", "AUTOCLASS", "RPO", "NOTIFICATIONS"],
        "{table}"
    );
    assert_eq!(
        lines[1][6..],
        ["US", "STANDARD", "true", "ASYNC_TURBO", "True"],
        "{table}"
    );

    // In sync: resyncs read, never write.
    three_resyncs(&f).await;
    assert_eq!(f.gcs.call_count("UpdateBucket"), 0, "{:?}", f.gcs.calls());
    assert_eq!(f.gcs.call_count("CreateBucket"), 0);
    assert_eq!(f.gcs.call_count("CreateNotificationConfig"), 0);
    assert_eq!(f.gcs.call_count("DeleteNotificationConfig"), 0);
    // Each resync reads the bucket, then its notifications (the last one
    // may not have reached them yet).
    let (gets, lists) = (
        f.gcs.call_count("GetBucket"),
        f.gcs.call_count("ListNotificationConfigs"),
    );
    assert!(lists + 1 >= gets && lists >= 2, "{:?}", f.gcs.calls());
    let g = f.get("photos").await?;
    let conditions = g.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .all(|c| c.type_ != "ImmutableSettingsDiffer"),
        "{conditions:?}"
    );
    Ok(())
}

/// A role without `storage.buckets.getIpFilter`: GCS returns the bucket
/// without its filter. The operator says so and writes nothing, rather
/// than rewrite at every resync a filter it cannot read back.
#[tokio::test]
async fn an_ip_filter_hidden_from_the_operator_is_reported_never_rewritten() -> TestResult {
    let f = Fixture::started().await?;
    f.gcs.withhold_permission("storage.buckets.getIpFilter");
    let spec = serde_json::json!({"bucketName": "photos", "ipFilter": {"mode": "Enabled",
        "publicNetworkSource": {"allowedIpCidrRanges": ["192.0.2.0/24"]}}});
    f.create("photos", spec).await?;
    let hidden = |g: &Gcs| {
        let conditions = g.status.as_ref().map(|s| s.conditions.as_slice());
        conditions
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "IpFilterHidden" && c.status == "True")
            .map(|c| c.message.clone())
    };
    let g = f
        .wait_for("photos", Duration::from_secs(60), "IpFilterHidden", |g| {
            g.is_ready() && hidden(g).is_some()
        })
        .await?;
    let message = hidden(&g).unwrap_or_default();
    assert!(message.contains("storage.buckets.getIpFilter"), "{message}");
    let bucket = f.gcs.bucket(&physical(&g)).expect("bucket exists");
    let ranges = bucket
        .ip_filter
        .and_then(|i| i.public_network_source)
        .map(|p| p.allowed_ip_cidr_ranges);
    assert_eq!(
        ranges,
        Some(vec!["192.0.2.0/24".to_owned()]),
        "set at create"
    );
    f.wait_event("photos", "IpFilterHidden").await?;

    three_resyncs(&f).await;
    assert_eq!(f.gcs.call_count("UpdateBucket"), 0, "{:?}", f.gcs.calls());
    assert!(
        f.gcs.call_count("TestIamPermissions") >= 2,
        "{:?}",
        f.gcs.calls()
    );
    Ok(())
}

#[tokio::test]
async fn drift_in_every_mutable_setting_is_corrected_and_spec_changes_applied() -> TestResult {
    let f = Fixture::started().await?;
    f.gcs.add_topic(TOPIC);
    f.create("photos", every_setting()).await?;
    let id = physical(&f.wait_ready("photos").await?);
    wait_notifications(&f, &id, 1, "the notification made").await?;

    f.gcs.clear_notifications(&id);
    f.gcs.modify_bucket(&id, |b| {
        b.encryption = None;
        b.cors.clear();
        b.website = None;
        b.billing = None;
        b.logging = Some(proto::bucket::Logging {
            log_bucket: "projects/_/buckets/elsewhere".into(),
            log_object_prefix: String::new(),
        });
        b.default_event_based_hold = false;
        b.autoclass = Some(proto::bucket::Autoclass {
            enabled: true,
            terminal_storage_class: Some("NEARLINE".into()),
            ..Default::default()
        });
        b.rpo = "DEFAULT".into();
        b.ip_filter = None;
        if let Some(rule) = b.lifecycle.as_mut().and_then(|l| l.rule.get_mut(1)) {
            let c = rule.condition.get_or_insert_default();
            c.custom_time_before = None;
            c.matches_suffix.pop();
        }
    })?;
    let b = wait_bucket(&f, &id, "every setting restored", |b| {
        b.rpo == "ASYNC_TURBO"
            && b.default_event_based_hold
            && b.autoclass
                .as_ref()
                .and_then(|a| a.terminal_storage_class.as_deref())
                == Some("ARCHIVE")
    })
    .await?;
    assert_every_setting(&b);
    f.wait_event("photos", "Updated").await?;
    wait_notifications(&f, &id, 1, "the deleted notification made again").await?;

    // Settings the spec no longer names are left as the bucket has them.
    f.merge_spec(
        "photos",
        serde_json::json!({
            "encryption": null, "cors": null, "website": null, "logging": null,
            "billing": null, "defaultEventBasedHold": null, "autoclass": null, "rpo": null,
            "ipFilter": null
        }),
    )
    .await?;
    f.wait_for(
        "photos",
        Duration::from_secs(30),
        "the spec change seen",
        |g| g.status.as_ref().and_then(|s| s.observed_generation) == g.metadata.generation,
    )
    .await?;
    f.gcs.reset_calls();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while f.gcs.call_count("GetBucket") < 2 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no resync");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(f.gcs.call_count("UpdateBucket"), 0, "{:?}", f.gcs.calls());
    assert_every_setting(&f.gcs.bucket(&id).context("the bucket")?);

    // Declared empty, they are cleared.
    f.merge_spec(
        "photos",
        serde_json::json!({
            "encryption": {}, "cors": [], "website": {}, "logging": {},
            "billing": {"requesterPays": false}, "defaultEventBasedHold": false,
            "autoclass": {"enabled": false}, "rpo": "DEFAULT", "ipFilter": {"mode": "Disabled"}
        }),
    )
    .await?;
    let b = wait_bucket(&f, &id, "settings cleared", |b| {
        b.autoclass.as_ref().is_some_and(|a| !a.enabled) && b.rpo == "DEFAULT"
    })
    .await?;
    assert_eq!(b.encryption.map(|e| e.default_kms_key), Some(String::new()));
    assert!(b.cors.is_empty());
    assert_eq!(b.website, None);
    assert_eq!(b.logging, None);
    assert!(!b.billing.is_some_and(|b| b.requester_pays));
    assert!(!b.default_event_based_hold);
    assert_eq!(b.ip_filter, None);
    // Fixed at creation, and kept.
    assert!(b.hierarchical_namespace.is_some_and(|h| h.enabled));
    assert_eq!(
        b.custom_placement_config.map(|c| c.data_locations.len()),
        Some(2)
    );
    Ok(())
}

#[tokio::test]
async fn a_bucket_with_other_fixed_settings_is_reported_never_recreated() -> TestResult {
    let f = Fixture::started().await?;
    let existing = "terraform-photos-2";
    f.gcs.insert_bucket(
        PROJECT,
        proto::Bucket {
            bucket_id: existing.to_owned(),
            location: "US".into(),
            ..Default::default()
        },
    )?;
    f.gcs.put_object(existing, "kept.jpg")?;
    let mut spec = every_setting();
    spec["adopt"] = serde_json::json!({"bucket": existing});
    // Turbo replication needs the dual-region the bucket is not: GCS
    // would refuse the update.
    spec.as_object_mut().map(|o| o.remove("rpo"));
    f.create("photos", spec).await?;
    let g = f
        .wait_for(
            "photos",
            Duration::from_secs(60),
            "ImmutableSettingsDiffer",
            |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "ImmutableSettingsDiffer" && c.status == "True")
                })
            },
        )
        .await?;
    let condition = g
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "ImmutableSettingsDiffer")
        .cloned()
        .expect("condition");
    for part in [
        existing,
        "hierarchicalNamespace: off → on",
        "customPlacementConfig.dataLocations: none → US-EAST1, US-WEST1",
        "create a new Gcs resource",
    ] {
        assert!(
            condition.message.contains(part),
            "{part} in {}",
            condition.message
        );
    }
    f.wait_event("photos", "ImmutableSettingsDiffer").await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), existing);
    // The mutable settings were made as declared; the bucket and its data
    // are the same.
    let b = wait_bucket(&f, existing, "mutable settings applied", |b| {
        b.default_event_based_hold
    })
    .await?;
    assert!(b.hierarchical_namespace.is_none_or(|h| !h.enabled));
    assert_eq!(b.custom_placement_config, None);
    assert_eq!(f.gcs.objects(existing).len(), 1);
    assert_eq!(f.gcs.call_count("CreateBucket"), 0);
    assert_eq!(f.gcs.call_count("DeleteBucket"), 0);
    Ok(())
}

#[tokio::test]
async fn the_all_fields_example_is_admitted_and_created_as_written() -> TestResult {
    let f = Fixture::started().await?;
    let path = format!(
        "{}/examples/logs-all-fields.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let example: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let spec = serde_json::to_value(&example["spec"])?;
    for field in [
        "encryption",
        "cors",
        "website",
        "billing",
        "logging",
        "defaultEventBasedHold",
        "autoclass",
        "hierarchicalNamespace",
        "customPlacementConfig",
        "rpo",
        "objectRetention",
        "ipFilter",
        "notifications",
    ] {
        assert!(spec.get(field).is_some(), "{path} lacks {field}");
    }
    f.gcs.add_topic("projects/acme-staging/topics/log-objects");
    // Only the Gcs is applied here: its ServiceAccount grant waits, Ready does not.
    f.create("logs", spec).await?;
    let g = f.wait_ready("logs").await?;
    let b = f.gcs.bucket(&physical(&g)).expect("bucket exists");
    assert_eq!(b.rpo, "ASYNC_TURBO");
    assert_eq!(b.location_type, "dual-region");
    assert_eq!(b.cors.len(), 1);
    assert!(b.object_retention.is_some_and(|r| r.enabled));
    let filter = b.ip_filter.unwrap_or_default();
    assert_eq!(filter.mode.as_deref(), Some("Enabled"));
    assert_eq!(filter.vpc_network_sources.len(), 1);
    assert!(
        b.retention_policy.is_some_and(|p| !p.is_locked),
        "the example never locks"
    );
    assert!(
        b.encryption
            .is_some_and(|e| e.default_kms_key.ends_with("/cryptoKeys/logs"))
    );
    assert_eq!(
        b.logging.map(|l| l.log_object_prefix),
        Some("logs/".to_owned())
    );
    wait_notifications(&f, &b.bucket_id, 1, "the example's notification made").await?;
    let n = &f.gcs.notifications(&b.bucket_id)[0];
    assert_eq!(
        n["event_types"],
        serde_json::json!(["OBJECT_FINALIZE", "OBJECT_DELETE"])
    );
    assert_eq!(
        n["custom_attributes"],
        serde_json::json!({"source": "bucketmap"})
    );
    Ok(())
}

/// `kubectl apply` of Gcs `name` with `spec`; the API server's answer.
async fn apply(f: &Fixture, name: &str, spec: &str) -> anyhow::Result<(bool, String)> {
    let out = f.kubectl_apply(&manifest(name, spec)).await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn a_lock_and_object_retention_cannot_be_undone_at_admission() -> TestResult {
    let f = Fixture::new().await?;
    let locked = "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3600, isLocked: true}, objectRetention: {mode: Enabled}}";
    let (ok, stderr) = apply(&f, "worm", locked).await?;
    assert!(ok, "{stderr}");
    let refused = [
        (
            "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3600, isLocked: false}, objectRetention: {mode: Enabled}}",
            "spec.retentionPolicy.isLocked cannot be unset or set to false",
        ),
        (
            "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3600}, objectRetention: {mode: Enabled}}",
            "spec.retentionPolicy.isLocked cannot be unset or set to false",
        ),
        (
            "{bucketName: worm, objectRetention: {mode: Enabled}}",
            "nor the retentionPolicy removed",
        ),
        (
            "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3599, isLocked: true}, objectRetention: {mode: Enabled}}",
            "retentionPeriodSeconds cannot be shortened while the policy is locked",
        ),
        (
            "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3600, isLocked: true}}",
            "spec.objectRetention is set when the bucket is created and never changed",
        ),
        (
            "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 3600, isLocked: true}, objectRetention: {mode: Disabled}}",
            "Unsupported value: \"Disabled\"",
        ),
    ];
    for (spec, message) in refused {
        let (ok, stderr) = apply(&f, "worm", spec).await?;
        assert!(!ok, "{spec} was accepted");
        assert!(
            stderr.contains(message),
            "{spec}: expected {message:?} in {stderr}"
        );
    }
    // Longer is allowed.
    let longer = "{bucketName: worm, retentionPolicy: {retentionPeriodSeconds: 7200, isLocked: true}, objectRetention: {mode: Enabled}}";
    let (ok, stderr) = apply(&f, "worm", longer).await?;
    assert!(ok, "{stderr}");

    // Unlocked, the policy may shrink, go, or be locked; object retention
    // cannot be added later.
    let unlocked = "{bucketName: free, retentionPolicy: {retentionPeriodSeconds: 3600}}";
    assert!(apply(&f, "free", unlocked).await?.0);
    for spec in [
        "{bucketName: free, retentionPolicy: {retentionPeriodSeconds: 60, isLocked: false}}",
        "{bucketName: free}",
        "{bucketName: free, retentionPolicy: {retentionPeriodSeconds: 60, isLocked: true}}",
    ] {
        let (ok, stderr) = apply(&f, "free", spec).await?;
        assert!(ok, "{spec}: {stderr}");
    }
    let (ok, stderr) = apply(&f, "plain", "{bucketName: plain}").await?;
    assert!(ok, "{stderr}");
    let (ok, stderr) = apply(
        &f,
        "plain",
        "{bucketName: plain, objectRetention: {mode: Enabled}}",
    )
    .await?;
    assert!(!ok, "object retention added later was accepted");
    assert!(
        stderr.contains("spec.objectRetention is set when the bucket is created"),
        "{stderr}"
    );
    let out = f
        .kubectl(&["explain", "gcs.spec.retentionPolicy.isLocked"])
        .await?;
    let explained = String::from_utf8_lossy(&out.stdout);
    assert!(explained.contains("IRREVERSIBLE"), "{explained}");
    Ok(())
}

#[tokio::test]
async fn a_locked_bucket_is_locked_once_and_outlives_force_destroy_until_its_objects_expire()
-> TestResult {
    let mut f = Fixture::started().await?;
    let spec = serde_json::json!({
        "bucketName": "worm", "forceDestroy": true, "objectRetention": {"mode": "Enabled"},
        "retentionPolicy": {"retentionPeriodSeconds": 3600, "isLocked": true},
    });
    f.create("worm", spec).await?;
    let id = physical(&f.wait_ready("worm").await?);
    let b = wait_bucket(&f, &id, "the policy locked", |b| {
        b.retention_policy.is_some_and(|p| p.is_locked)
    })
    .await?;
    assert!(b.object_retention.is_some_and(|r| r.enabled));
    f.wait_event("worm", "RetentionPolicyLocked").await?;
    assert_eq!(f.gcs.call_count("LockBucketRetentionPolicy"), 1);

    // Resyncs write nothing.
    f.gcs.reset_calls();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while f.gcs.call_count("GetBucket") < 2 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no resync");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let writes: Vec<String> = f
        .gcs
        .calls()
        .into_iter()
        .map(|c| c.method)
        .filter(|m| !m.starts_with("Get") && !m.starts_with("List"))
        .collect();
    assert!(writes.is_empty(), "{writes:?}");

    f.gcs.put_object(&id, "young.txt")?;
    f.delete("worm").await?;
    let g = f.wait_reason("worm", "RetentionLocked").await?;
    let ready = g.ready_condition().cloned().context("Ready")?;
    assert_eq!(ready.status, "False");
    for part in [
        id.as_str(),
        "locked at 3600s",
        "1 object versions are under retention",
    ] {
        assert!(ready.message.contains(part), "{part} in {}", ready.message);
    }
    assert!(g.metadata.deletion_timestamp.is_some());
    assert_eq!(g.metadata.finalizers.unwrap_or_default().len(), 1);
    assert_eq!(f.gcs.objects(&id).len(), 1, "the young object is kept");
    assert!(f.gcs.bucket(&id).is_some(), "the bucket is kept");
    assert!(
        f.gcs.calls().iter().all(|c| c.code == tonic::Code::Ok),
        "no refused call: {:?}",
        f.gcs.calls()
    );

    // Once its retention expired (aged here), the next look deletes it all.
    let aged = f.gcs.modify_objects(&id, "young.txt", |o| {
        if let Some(t) = o.create_time.as_mut() {
            t.seconds -= 3601;
        }
    });
    assert_eq!(aged, 1);
    f.kill_operator().await;
    f.start_operator().await?;
    f.wait_gone("worm", Duration::from_secs(60)).await?;
    assert!(f.gcs.bucket(&id).is_none(), "the bucket is deleted");
    Ok(())
}
