//! The bucket settings GCS checks and fills in beyond the basics of
//! `state.rs`: autoclass, replication (rpo), configurable dual-regions,
//! hierarchical namespace, CMEK, logging, IP filter. What GCS refuses is refused here
//! with the same code; what it fills in (autoclass's terminal class and
//! toggle time, the log object prefix) is filled in; `state.rs` gives a
//! configurable dual-region its location type and rpo.

use prost_types::Timestamp;
use tonic::Status;

use super::proto;

/// Autoclass's terminal class when the request names none.
const DEFAULT_TERMINAL_CLASS: &str = "NEARLINE";

/// Fills what GCS fills in on a bucket being created (`time`: its creation).
pub(crate) fn fill_created(bucket: &mut proto::Bucket, time: Timestamp) {
    if let Some(placement) = bucket.custom_placement_config.as_mut() {
        for location in &mut placement.data_locations {
            *location = location.to_uppercase();
        }
    }
    fill_updated(bucket, None, time);
}

/// Fills what GCS fills in on a bucket created or updated from `previous`.
pub(crate) fn fill_updated(
    bucket: &mut proto::Bucket,
    previous: Option<&proto::Bucket>,
    time: Timestamp,
) {
    let was = previous.and_then(|p| p.autoclass.as_ref());
    if let Some(autoclass) = bucket.autoclass.as_mut() {
        if autoclass.enabled {
            let terminal = autoclass
                .terminal_storage_class
                .get_or_insert_with(|| DEFAULT_TERMINAL_CLASS.to_string());
            *terminal = terminal.to_uppercase();
        } else {
            autoclass.terminal_storage_class = None;
        }
        let toggled = was.is_none_or(|w| w.enabled != autoclass.enabled);
        autoclass.toggle_time = if toggled {
            Some(time)
        } else {
            was.and_then(|w| w.toggle_time)
        };
        let same_terminal =
            was.is_some_and(|w| w.terminal_storage_class == autoclass.terminal_storage_class);
        autoclass.terminal_storage_class_update_time = match was {
            Some(w) if same_terminal => w.terminal_storage_class_update_time,
            _ => autoclass.terminal_storage_class.as_ref().map(|_| time),
        };
    }
    let id = bucket.bucket_id.clone();
    if let Some(logging) = bucket.logging.as_mut() {
        if logging.log_bucket.is_empty() {
            bucket.logging = None;
        } else if logging.log_object_prefix.is_empty() {
            // GCS names log objects after the logged bucket by default.
            logging.log_object_prefix = id;
        }
    }
}

/// INVALID_ARGUMENT when `bucket` (being created, or as an update would
/// leave it) combines settings GCS refuses.
pub(crate) fn check(bucket: &proto::Bucket) -> Result<(), Status> {
    check_hierarchical_namespace(bucket)?;
    check_autoclass(bucket)?;
    check_placement(bucket)?;
    check_rpo(bucket)?;
    check_encryption(bucket)?;
    check_ip_filter(bucket)?;
    check_versioning_and_retention(bucket)?;
    check_lifecycle(bucket)
}

/// GCS: "Retention policies and Object Versioning are mutually exclusive
/// features": a bucket has at most one of them.
fn check_versioning_and_retention(bucket: &proto::Bucket) -> Result<(), Status> {
    let versioned = bucket.versioning.is_some_and(|v| v.enabled);
    let retained = bucket
        .retention_policy
        .is_some_and(|p| p.retention_duration.is_some_and(|d| d.seconds > 0));
    if versioned && retained {
        return Err(Status::invalid_argument(format!(
            "bucket {}: a retention policy and object versioning cannot both be enabled",
            bucket.bucket_id
        )));
    }
    Ok(())
}

/// GCS's limits on an IP filter: in all at most 200 ranges and 25 VPC
/// networks.
const MAX_IP_FILTER_RANGES: usize = 200;
const MAX_VPC_NETWORKS: usize = 25;

/// A known mode, networks named `projects/P/global/networks/N`, ranges in
/// CIDR notation with no host bits set (`192.0.2.1/24` is refused), and
/// GCS's limits.
fn check_ip_filter(bucket: &proto::Bucket) -> Result<(), Status> {
    let Some(filter) = &bucket.ip_filter else {
        return Ok(());
    };
    let refuse = |why: String| {
        Status::invalid_argument(format!("bucket {}: ipFilter: {why}", bucket.bucket_id))
    };
    let mode = filter.mode.as_deref().unwrap_or_default();
    if !matches!(mode, "Enabled" | "Disabled") {
        return Err(refuse(format!(
            "invalid mode {mode:?}: expected Enabled or Disabled"
        )));
    }
    let vpcs = &filter.vpc_network_sources;
    if vpcs.len() > MAX_VPC_NETWORKS {
        return Err(refuse(format!(
            "{} VPC networks, at most {MAX_VPC_NETWORKS}",
            vpcs.len()
        )));
    }
    for vpc in vpcs {
        let network = vpc.network.as_deref().unwrap_or_default();
        let parts: Vec<&str> = network.split('/').collect();
        let shaped = matches!(parts[..], ["projects", p, "global", "networks", n] if !p.is_empty() && !n.is_empty());
        if !shaped {
            return Err(refuse(format!(
                "invalid network {network:?}: expected projects/PROJECT/global/networks/NETWORK"
            )));
        }
    }
    let public = filter.public_network_source.iter();
    let ranges: Vec<&String> = (public.flat_map(|p| &p.allowed_ip_cidr_ranges))
        .chain(vpcs.iter().flat_map(|v| &v.allowed_ip_cidr_ranges))
        .collect();
    if ranges.len() > MAX_IP_FILTER_RANGES {
        return Err(refuse(format!(
            "{} ranges, at most {MAX_IP_FILTER_RANGES}",
            ranges.len()
        )));
    }
    match ranges.into_iter().find(|r| !truncated_cidr(r)) {
        Some(bad) => Err(refuse(format!(
            "invalid range {bad:?}: expected CIDR notation with the host bits zero, e.g. 192.0.2.0/24"
        ))),
        None => Ok(()),
    }
}

/// `ADDRESS/PREFIX`, IPv4 or IPv6, with every bit after the prefix zero.
fn truncated_cidr(range: &str) -> bool {
    let Some((address, prefix)) = range.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u32>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => {
            prefix <= 32 && u32::from(a).checked_shl(prefix).unwrap_or(0) == 0
        }
        Ok(std::net::IpAddr::V6(a)) => {
            prefix <= 128 && u128::from(a).checked_shl(prefix).unwrap_or(0) == 0
        }
        Err(_) => false,
    }
}

/// Each lifecycle rule has a known action (with a storage class exactly
/// when it is SetStorageClass) and at least one condition, and its dates
/// are dates: GCS answers 400 otherwise.
fn check_lifecycle(bucket: &proto::Bucket) -> Result<(), Status> {
    let rules = bucket.lifecycle.iter().flat_map(|l| &l.rule);
    for (i, rule) in rules.enumerate() {
        let refuse = |why: String| {
            Status::invalid_argument(format!(
                "bucket {}: lifecycle rule {i}: {why}",
                bucket.bucket_id
            ))
        };
        let action = rule.action.clone().unwrap_or_default();
        let class_wanted = action.r#type == "SetStorageClass";
        match action.r#type.as_str() {
            "Delete" | "SetStorageClass" | "AbortIncompleteMultipartUpload" => {}
            other => return Err(refuse(format!("unknown action type {other:?}"))),
        }
        if class_wanted == action.storage_class.is_empty() {
            return Err(refuse(
                "a storage class is required for SetStorageClass and not allowed otherwise".into(),
            ));
        }
        let c = rule.condition.clone().unwrap_or_default();
        let dates = [
            &c.created_before,
            &c.custom_time_before,
            &c.noncurrent_time_before,
        ];
        let any = c.age_days.is_some()
            || c.is_live.is_some()
            || c.num_newer_versions.is_some()
            || c.days_since_custom_time.is_some()
            || c.days_since_noncurrent_time.is_some()
            || dates.iter().any(|d| d.is_some())
            || !c.matches_storage_class.is_empty()
            || !c.matches_prefix.is_empty()
            || !c.matches_suffix.is_empty();
        if !any {
            return Err(refuse("a rule needs at least one condition".into()));
        }
        let beyond_age_and_names = c.is_live.is_some()
            || c.num_newer_versions.is_some()
            || c.days_since_custom_time.is_some()
            || c.days_since_noncurrent_time.is_some()
            || dates.iter().any(|d| d.is_some())
            || !c.matches_storage_class.is_empty();
        if action.r#type == "AbortIncompleteMultipartUpload" && beyond_age_and_names {
            return Err(refuse(
                "AbortIncompleteMultipartUpload supports only the age, matchesPrefix and matchesSuffix conditions".into(),
            ));
        }
        if let Some(bad) = dates.into_iter().flatten().find(|d| !valid_date(d)) {
            return Err(refuse(format!("invalid date {bad:?}")));
        }
    }
    Ok(())
}

/// A calendar date (leap years included).
fn valid_date(d: &googleapis_tonic_google_storage_v2::google::r#type::Date) -> bool {
    let leap = (d.year % 4 == 0 && d.year % 100 != 0) || d.year % 400 == 0;
    let days = match d.month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=9999).contains(&d.year) && (1..=days).contains(&d.day)
}

fn check_hierarchical_namespace(bucket: &proto::Bucket) -> Result<(), Status> {
    let hns = bucket.hierarchical_namespace.is_some_and(|h| h.enabled);
    let ubla = bucket
        .iam_config
        .as_ref()
        .and_then(|c| c.uniform_bucket_level_access)
        .is_some_and(|u| u.enabled);
    if hns && !ubla {
        return Err(Status::invalid_argument(format!(
            "bucket {}: hierarchical namespace requires uniform bucket-level access to be enabled",
            bucket.bucket_id
        )));
    }
    Ok(())
}

fn check_autoclass(bucket: &proto::Bucket) -> Result<(), Status> {
    let Some(autoclass) = bucket.autoclass.as_ref().filter(|a| a.enabled) else {
        return Ok(());
    };
    let id = &bucket.bucket_id;
    let terminal = autoclass.terminal_storage_class.as_deref();
    if terminal.is_some_and(|t| !matches!(t, "NEARLINE" | "ARCHIVE")) {
        return Err(Status::invalid_argument(format!(
            "bucket {id}: autoclass terminal storage class must be NEARLINE or ARCHIVE, got {terminal:?}"
        )));
    }
    if bucket.storage_class != "STANDARD" {
        return Err(Status::invalid_argument(format!(
            "bucket {id}: the default storage class of an autoclass bucket must be STANDARD, got {}",
            bucket.storage_class
        )));
    }
    let rules = bucket.lifecycle.iter().flat_map(|l| &l.rule);
    let mut actions = rules.filter_map(|r| r.action.as_ref());
    if actions.any(|a| a.r#type == "SetStorageClass") {
        return Err(Status::invalid_argument(format!(
            "bucket {id}: lifecycle SetStorageClass actions are not allowed while autoclass is enabled"
        )));
    }
    Ok(())
}

fn check_placement(bucket: &proto::Bucket) -> Result<(), Status> {
    let Some(placement) = &bucket.custom_placement_config else {
        return Ok(());
    };
    let regions = &placement.data_locations;
    let multi_region = matches!(bucket.location.as_str(), "US" | "EU" | "ASIA");
    if regions.len() != 2 || !multi_region || regions.iter().any(|r| !r.contains('-')) {
        return Err(Status::invalid_argument(format!(
            "bucket {}: a configurable dual-region names exactly two regions of its multi-region \
             location (US, EU or ASIA); got location {} and data locations {regions:?}",
            bucket.bucket_id, bucket.location
        )));
    }
    Ok(())
}

fn check_rpo(bucket: &proto::Bucket) -> Result<(), Status> {
    let id = &bucket.bucket_id;
    match (bucket.rpo.as_str(), bucket.location_type.as_str()) {
        ("", _) | ("DEFAULT", "dual-region" | "multi-region") | ("ASYNC_TURBO", "dual-region") => {
            Ok(())
        }
        ("ASYNC_TURBO", _) => Err(Status::invalid_argument(format!(
            "bucket {id}: turbo replication (rpo ASYNC_TURBO) is only available for dual-region buckets"
        ))),
        ("DEFAULT", _) => Err(Status::invalid_argument(format!(
            "bucket {id}: rpo applies to dual-region and multi-region buckets only"
        ))),
        (other, _) => Err(Status::invalid_argument(format!(
            "bucket {id}: invalid rpo {other:?}: expected DEFAULT or ASYNC_TURBO"
        ))),
    }
}

fn check_encryption(bucket: &proto::Bucket) -> Result<(), Status> {
    let key = bucket
        .encryption
        .as_ref()
        .map_or("", |e| e.default_kms_key.as_str());
    if key.is_empty() {
        return Ok(());
    }
    let parts: Vec<&str> = key.split('/').collect();
    let shaped = parts.len() == 8
        && parts
            .iter()
            .step_by(2)
            .copied()
            .eq(["projects", "locations", "keyRings", "cryptoKeys"])
        && parts.iter().skip(1).step_by(2).all(|p| !p.is_empty());
    if !shaped {
        return Err(Status::invalid_argument(format!(
            "bucket {}: invalid Cloud KMS key name {key:?}: expected \
             projects/P/locations/L/keyRings/R/cryptoKeys/K",
            bucket.bucket_id
        )));
    }
    let wanted = match (bucket.location.as_str(), bucket.location_type.as_str()) {
        (_, "dual-region") => None,
        ("US", _) => Some("us".to_string()),
        ("EU", _) => Some("europe".to_string()),
        ("ASIA", _) => Some("asia".to_string()),
        (region, "region") => Some(region.to_lowercase()),
        _ => None,
    };
    match wanted {
        Some(wanted) if parts[3] != wanted => Err(Status::invalid_argument(format!(
            "bucket {}: the Cloud KMS key {key} is in location {}, but a bucket in {} needs a key \
             in {wanted}",
            bucket.bucket_id, parts[3], bucket.location
        ))),
        _ => Ok(()),
    }
}
