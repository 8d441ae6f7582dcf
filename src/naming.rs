//! Physical bucket names and ownership labels.
//!
//! # Names
//!
//! A physical name is `<logical>-<suffix>`: the suffix is 8 base36 characters
//! derived from the owner's identity ([`Identity`]: the cluster identity,
//! the resource's namespace and its name) and a naming attempt number. The
//! same inputs always give the same name, so an operator that crashes or
//! loses a response finds its own bucket again instead of creating a second
//! one, and so does a rebuilt or restored cluster that re-applies the same
//! manifests under the same cluster identity, whether or not the resource's
//! status came back with it. No Kubernetes uid takes part: a re-created
//! resource is the same owner. A new attempt number is used only when the
//! name turns out to belong to somebody else.
//!
//! # Ownership labels
//!
//! Every bucket bucketmap creates or adopts carries:
//!
//! | label                 | value                                                  |
//! |-----------------------|--------------------------------------------------------|
//! | `managed-by`          | `bucketmap`                                            |
//! | `bucketmap-cluster`   | the cluster identity, as given (`--cluster-id`)        |
//! | `bucketmap-namespace` | the resource's namespace (always a valid label value)  |
//! | `bucketmap-name`      | the resource's name, or a readable hashed form of it   |
//! | `bucketmap-owner`     | the owner key: a hash of the three above               |
//!
//! The owner key alone decides ownership ([`ownership`]): one exact
//! comparison, which a name that had to be shortened cannot make ambiguous.
//! The other labels say, to a person or to `gcloud storage buckets list
//! --filter`, whose bucket it is. A Kubernetes name that is not a label value
//! (dots, more than 63 characters) is written as its first characters with
//! dots made dashes, then `-` and 12 hexadecimal digits of its hash
//! ([`name_label`]).
//!
//! Buckets labelled by earlier versions carry the owning resource's uid in
//! `bucketmap-owner`: they are still recognised as the resource's own
//! ([`Ownership::Legacy`]) while the resource names them in its status, and
//! the reconciler replaces those labels with the ones above.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Characters in the suffix appended to the logical name.
pub const SUFFIX_LEN: usize = 8;
/// Longest logical name: GCS allows 63 characters, the suffix takes 9.
pub const MAX_LOGICAL_NAME_LEN: usize = 54;
/// Longest label value GCS accepts.
pub const MAX_LABEL_VALUE_LEN: usize = 63;
/// Label every operator-created bucket carries.
pub const MANAGED_BY_LABEL: &str = "managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "bucketmap";
/// Label holding the owner key ([`Identity::owner_key`]); in buckets
/// labelled by earlier versions, the owning resource's uid.
pub const OWNER_LABEL: &str = "bucketmap-owner";
/// Label holding the cluster identity, as given.
pub const CLUSTER_LABEL: &str = "bucketmap-cluster";
/// Label holding the owning resource's namespace.
pub const NAMESPACE_LABEL: &str = "bucketmap-namespace";
/// Label holding the owning resource's name ([`name_label`]).
pub const NAME_LABEL: &str = "bucketmap-name";
/// Every label bucketmap puts on a bucket, and removes when it abandons one.
pub const OWNERSHIP_LABELS: [&str; 5] = [
    MANAGED_BY_LABEL,
    OWNER_LABEL,
    CLUSTER_LABEL,
    NAMESPACE_LABEL,
    NAME_LABEL,
];

const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Who owns a bucket: the cluster identity plus the `Gcs` resource's
/// namespace and name. The input of the physical name and of the labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The cluster identity (`--cluster-id`), a valid label value.
    pub cluster: &'a str,
    /// The resource's namespace.
    pub namespace: &'a str,
    /// The resource's name.
    pub name: &'a str,
}

impl Identity<'_> {
    /// The value of [`OWNER_LABEL`]: 32 hexadecimal digits of a hash of the
    /// three parts (never the shape of a Kubernetes uid, which has dashes).
    pub fn owner_key(&self) -> String {
        let digest = hash_parts(&[
            b"owner",
            self.cluster.as_bytes(),
            self.namespace.as_bytes(),
            self.name.as_bytes(),
        ]);
        hex(&digest[..16])
    }

    /// The ownership labels of this owner's buckets.
    pub fn labels(&self) -> BTreeMap<String, String> {
        [
            (MANAGED_BY_LABEL, MANAGED_BY_VALUE.to_owned()),
            (OWNER_LABEL, self.owner_key()),
            (CLUSTER_LABEL, self.cluster.to_owned()),
            (NAMESPACE_LABEL, label_value(self.namespace)),
            (NAME_LABEL, name_label(self.name)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// Who a bucket belongs to, as far as `identity` is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Labelled with this identity's owner key.
    Ours,
    /// Labelled by an earlier version with this resource's uid: ours, with
    /// labels to replace.
    Legacy,
    /// No owner label: nobody's (made by hand, by Terraform, or abandoned).
    Unowned,
    /// Somebody else's: who, in words.
    Foreign(String),
}

/// Whose a bucket with `labels` is, for the resource of `identity` whose
/// uid is `uid` (the uid only recognises buckets labelled by earlier
/// versions).
pub fn ownership<'l>(
    labels: impl IntoIterator<Item = (&'l String, &'l String)>,
    identity: &Identity<'_>,
    uid: Option<&str>,
) -> Ownership {
    let labels: BTreeMap<&str, &str> = labels
        .into_iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some(owner) = labels.get(OWNER_LABEL).copied().filter(|o| !o.is_empty()) else {
        return Ownership::Unowned;
    };
    if owner == identity.owner_key() {
        return Ownership::Ours;
    }
    if uid.is_some_and(|uid| owner == legacy_owner_id(uid)) {
        return Ownership::Legacy;
    }
    let description = match (
        labels.get(CLUSTER_LABEL),
        labels.get(NAMESPACE_LABEL),
        labels.get(NAME_LABEL),
    ) {
        (Some(cluster), Some(ns), Some(name)) => {
            format!("cluster {cluster:?}, Gcs {ns}/{name} ({OWNER_LABEL}={owner})")
        }
        (Some(cluster), _, _) => format!("cluster {cluster:?} ({OWNER_LABEL}={owner})"),
        _ => format!(
            "the Gcs resource with uid {owner}, labelled by an earlier bucketmap ({OWNER_LABEL}={owner})"
        ),
    };
    Ownership::Foreign(description)
}

/// The labels of a bucket without the ones bucketmap puts there.
pub fn without_ownership_labels<'l>(
    labels: impl IntoIterator<Item = (&'l String, &'l String)>,
) -> BTreeMap<String, String> {
    labels
        .into_iter()
        .filter(|(k, _)| !OWNERSHIP_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The physical bucket name for `logical` at naming attempt `attempt`.
pub fn physical_name(logical: &str, identity: Identity<'_>, attempt: u32) -> String {
    format!("{logical}-{}", suffix(identity, attempt))
}

/// The deterministic base36 suffix for an identity and attempt.
pub fn suffix(identity: Identity<'_>, attempt: u32) -> String {
    // A suffix spelling "g00gle" would make GCS refuse the name: re-hash with
    // a salt until it does not (deterministic, and almost never needed).
    (0u32..)
        .map(|salt| salted_suffix(identity, attempt, salt))
        .find(|s| !contains_google_like(s))
        .unwrap_or_default()
}

fn salted_suffix(identity: Identity<'_>, attempt: u32, salt: u32) -> String {
    let attempt = attempt.to_be_bytes();
    let salt_bytes = salt.to_be_bytes();
    let mut parts: Vec<&[u8]> = vec![
        identity.cluster.as_bytes(),
        identity.namespace.as_bytes(),
        identity.name.as_bytes(),
        &attempt,
    ];
    if salt > 0 {
        parts.push(&salt_bytes);
    }
    let digest = hash_parts(&parts);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    let mut value = u64::from_be_bytes(bytes);
    let mut out = String::with_capacity(SUFFIX_LEN);
    for _ in 0..SUFFIX_LEN {
        out.insert(0, char::from(ALPHABET[(value % 36) as usize]));
        value /= 36;
    }
    out
}

/// SHA-256 of `parts`, each length-prefixed so ("ab", "c") and ("a", "bc")
/// differ.
fn hash_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_label_value(value: &str) -> bool {
    value.len() <= MAX_LABEL_VALUE_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// `value` if it is a label value, else its readable hashed form.
fn label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_owned();
    }
    let readable: String = value
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .take(MAX_LABEL_VALUE_LEN - 13)
        .collect();
    let digest = hash_parts(&[value.as_bytes()]);
    format!("{readable}-{}", hex(&digest[..6]))
}

/// The value of [`NAME_LABEL`] for a resource name: the name when it is a
/// label value, else its first 50 characters with every other character a
/// dash, `-` and 12 hexadecimal digits of the name's hash (a Kubernetes name
/// may hold dots and 253 characters, a label value neither).
pub fn name_label(name: &str) -> String {
    label_value(name)
}

/// Why `id` cannot be a cluster identity: it is written as a GCS label value
/// and must stay one. 1 to 63 lowercase letters, digits, `-` or `_`,
/// starting with a letter.
pub fn validate_cluster_id(id: &str) -> Result<String, String> {
    let starts_with_letter = id.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if starts_with_letter && is_label_value(id) {
        Ok(id.to_owned())
    } else {
        Err(format!(
            "cluster id {id:?} is not valid: it is written on every bucket as a label value, so it must be 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter (e.g. prod-europe-west1)"
        ))
    }
}

/// The value earlier versions wrote in [`OWNER_LABEL`] for a resource uid
/// (its lowercase form; a Kubernetes uid is already a label value).
pub fn legacy_owner_id(uid: &str) -> String {
    uid.to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_VALUE_LEN)
        .collect()
}

/// Why a logical bucket name is not acceptable. The same rules are enforced
/// at admission by the CRD schema; the operator checks again so that a
/// resource created before a schema change can never produce a bad bucket.
pub fn validate_logical_name(name: &str) -> Result<(), String> {
    let len = name.len();
    if len < 3 {
        return Err(format!(
            "bucketName {name:?} must be at least 3 characters long"
        ));
    }
    if len > MAX_LOGICAL_NAME_LEN {
        return Err(format!(
            "bucketName {name:?} must be at most {MAX_LOGICAL_NAME_LEN} characters long"
        ));
    }
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !name.chars().all(valid_char) || !edge(name.chars().next()) || !edge(name.chars().last()) {
        return Err(format!(
            "bucketName {name:?} may contain only lowercase letters, digits, '-' and '_', and must start and end with a letter or digit"
        ));
    }
    if name.starts_with("goog") {
        return Err(format!("bucketName {name:?} must not start with 'goog'"));
    }
    if contains_google_like(name) {
        return Err(format!(
            "bucketName {name:?} must not contain 'google' or a close misspelling of it"
        ));
    }
    Ok(())
}

/// Matches the schema's `g[o0][o0]+g[l1]e`.
fn contains_google_like(name: &str) -> bool {
    let b = name.as_bytes();
    (0..b.len()).any(|start| {
        if b[start] != b'g' {
            return false;
        }
        let mut i = start + 1;
        let os = b[i..]
            .iter()
            .take_while(|c| matches!(c, b'o' | b'0'))
            .count();
        if os < 2 {
            return false;
        }
        i += os;
        b.get(i) == Some(&b'g')
            && matches!(b.get(i + 1), Some(b'l' | b'1'))
            && b.get(i + 2) == Some(&b'e')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id<'a>(cluster: &'a str, namespace: &'a str, name: &'a str) -> Identity<'a> {
        Identity {
            cluster,
            namespace,
            name,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn suffix_changes_with_every_input() {
        let base = suffix(id("c1", "staging", "photos"), 0);
        assert_ne!(base, suffix(id("c2", "staging", "photos"), 0));
        assert_ne!(base, suffix(id("c1", "prod", "photos"), 0));
        assert_ne!(base, suffix(id("c1", "staging", "videos"), 0));
        assert_ne!(base, suffix(id("c1", "staging", "photos"), 1));
        assert_ne!(suffix(id("c", "ab", "c"), 0), suffix(id("c", "a", "bc"), 0));
    }

    #[test]
    fn a_recreated_resource_gets_the_same_name_and_owner_key() {
        // Nothing of the resource's own life (uid, creation time) takes part:
        // the same cluster identity, namespace and name are the same owner.
        let first = id("prod-eu", "team-a", "photos");
        let again = id("prod-eu", "team-a", "photos");
        assert_eq!(
            physical_name("photos", first, 0),
            physical_name("photos", again, 0)
        );
        assert_eq!(first.owner_key(), again.owner_key());
        assert_eq!(first.labels(), again.labels());
        let other_cluster = id("prod-us", "team-a", "photos");
        assert_ne!(first.owner_key(), other_cluster.owner_key());
        assert_ne!(
            physical_name("photos", first, 0),
            physical_name("photos", other_cluster, 0)
        );
    }

    #[test]
    fn the_labels_say_whose_bucket_it_is() {
        let owner = id("prod-eu", "team-a", "photos");
        let l = owner.labels();
        assert_eq!(l[MANAGED_BY_LABEL], "bucketmap");
        assert_eq!(l[CLUSTER_LABEL], "prod-eu");
        assert_eq!(l[NAMESPACE_LABEL], "team-a");
        assert_eq!(l[NAME_LABEL], "photos");
        assert_eq!(l[OWNER_LABEL], owner.owner_key());
        assert_eq!(l.len(), OWNERSHIP_LABELS.len());
        assert!(OWNERSHIP_LABELS.iter().all(|k| l.contains_key(*k)), "{l:?}");
    }

    #[test]
    fn a_name_that_is_no_label_value_is_hashed_readably() {
        assert_eq!(name_label("photos_2"), "photos_2");
        let dotted = name_label("photos.v2");
        assert!(dotted.starts_with("photos-v2-"), "{dotted}");
        assert_eq!(dotted.len(), "photos-v2-".len() + 12);
        assert_ne!(dotted, name_label("photos-v2"), "the hash keeps them apart");
        let long = "a".repeat(253);
        let hashed = name_label(&long);
        assert!(is_label_value(&hashed), "{hashed}");
        assert_ne!(hashed, name_label(&"a".repeat(252)));
    }

    #[test]
    fn ownership_is_decided_by_the_owner_key() {
        let me = id("prod-eu", "team-a", "photos");
        assert_eq!(ownership(&me.labels(), &me, Some("u1")), Ownership::Ours);
        assert_eq!(ownership(&labels(&[]), &me, Some("u1")), Ownership::Unowned);
        let user_labels = labels(&[("team", "media"), (MANAGED_BY_LABEL, "bucketmap")]);
        assert_eq!(ownership(&user_labels, &me, None), Ownership::Unowned);
        // Informational labels that were edited do not make it someone else's.
        let mut edited = me.labels();
        edited.insert(NAME_LABEL.into(), "renamed".into());
        assert_eq!(ownership(&edited, &me, None), Ownership::Ours);
    }

    #[test]
    fn a_bucket_of_another_cluster_or_resource_is_foreign_and_named() {
        let me = id("prod-eu", "team-a", "photos");
        let theirs = id("prod-us", "team-a", "photos");
        let Ownership::Foreign(who) = ownership(&theirs.labels(), &me, None) else {
            panic!("another cluster's bucket was not foreign");
        };
        assert!(
            who.contains("prod-us") && who.contains("team-a/photos"),
            "{who}"
        );
        let sibling = id("prod-eu", "team-a", "videos");
        let Ownership::Foreign(who) = ownership(&sibling.labels(), &me, None) else {
            panic!("another resource's bucket was not foreign");
        };
        assert!(who.contains("team-a/videos"), "{who}");
    }

    #[test]
    fn a_uid_label_of_an_earlier_version_is_ours_only_for_that_uid() {
        let me = id("prod-eu", "team-a", "photos");
        let uid = "0B6C7A4E-3f4e-4c1e-9a55-2f1f6c1d8e01";
        let legacy = labels(&[
            (MANAGED_BY_LABEL, "bucketmap"),
            (OWNER_LABEL, &legacy_owner_id(uid)),
        ]);
        assert_eq!(ownership(&legacy, &me, Some(uid)), Ownership::Legacy);
        let Ownership::Foreign(who) = ownership(&legacy, &me, Some("another-uid")) else {
            panic!("another resource's uid label was not foreign");
        };
        assert!(who.contains("uid 0b6c7a4e"), "{who}");
        assert_eq!(
            ownership(&legacy, &me, None),
            Ownership::Foreign(who.clone())
        );
    }

    #[test]
    fn abandoning_removes_exactly_the_ownership_labels() {
        let me = id("prod-eu", "team-a", "photos");
        let mut l = me.labels();
        l.insert("team".into(), "media".into());
        assert_eq!(without_ownership_labels(&l), labels(&[("team", "media")]));
    }

    #[test]
    fn cluster_ids_are_label_values_starting_with_a_letter() {
        for good in ["prod", "prod-europe-west1", "a", "blue_2", &"a".repeat(63)] {
            assert_eq!(validate_cluster_id(good), Ok(good.to_owned()));
        }
        for bad in [
            "",
            "Prod",
            "1prod",
            "-prod",
            "prod.eu",
            "prod eu",
            &"a".repeat(64),
        ] {
            let message = validate_cluster_id(bad).expect_err(bad);
            assert!(
                message.contains("lowercase letters") && message.contains("starting with a letter"),
                "{message}"
            );
        }
    }

    #[test]
    fn google_like_names_are_refused() {
        for bad in [
            "my-google-bucket",
            "g00gle",
            "xgoogle",
            "go0gle1",
            "googlex",
            "goog-x",
            "g0o0gle",
        ] {
            assert!(
                validate_logical_name(bad).is_err(),
                "{bad} should be refused"
            );
        }
        for good in ["photos", "gogle-ish", "logs_2024", "a-b", "gxoogle"] {
            assert!(
                validate_logical_name(good).is_ok(),
                "{good} should be accepted"
            );
        }
    }

    #[test]
    fn shape_rules_are_enforced() {
        for bad in [
            "ab",
            "Photos",
            "-photos",
            "photos-",
            "pho.tos",
            "ph otos",
            &"a".repeat(55),
        ] {
            assert!(
                validate_logical_name(bad).is_err(),
                "{bad} should be refused"
            );
        }
        assert!(validate_logical_name(&"a".repeat(54)).is_ok());
    }

    #[test]
    fn legacy_owner_id_is_a_valid_label_value() {
        assert_eq!(legacy_owner_id("3F2A-b9_c"), "3f2a-b9_c");
        assert_eq!(legacy_owner_id("a.b/c"), "a-b-c");
    }

    proptest! {
        #[test]
        fn physical_names_are_valid_bounded_and_deterministic(
            logical in "[a-z0-9][a-z0-9_-]{1,52}[a-z0-9]",
            cluster in "[a-z][a-z0-9_-]{0,62}",
            namespace in "[a-z0-9-]{1,63}",
            name in "[a-z0-9.-]{1,253}",
            attempt in 0u32..100,
        ) {
            prop_assume!(validate_logical_name(&logical).is_ok());
            let identity = id(&cluster, &namespace, &name);
            let physical = physical_name(&logical, identity, attempt);
            prop_assert!(physical.len() <= 63);
            prop_assert_eq!(physical.len(), logical.len() + 1 + SUFFIX_LEN);
            prop_assert_eq!(&physical, &physical_name(&logical, identity, attempt));
            let physical_suffix = &physical[logical.len() + 1..];
            prop_assert!(physical_suffix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
            // The physical name obeys the GCS rules itself (it may be up to 63).
            prop_assert!(physical.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'));
            prop_assert!(physical.as_bytes()[physical.len() - 1].is_ascii_alphanumeric());
            prop_assert!(!contains_google_like(physical_suffix));
        }

        #[test]
        fn ownership_labels_are_label_values(
            cluster in "[a-z][a-z0-9_-]{0,62}",
            namespace in "[a-z0-9-]{1,63}",
            name in "[a-z0-9.-]{1,253}",
        ) {
            let identity = id(&cluster, &namespace, &name);
            for (key, value) in identity.labels() {
                prop_assert!(is_label_value(&value), "{key}={value}");
                prop_assert!(!value.is_empty(), "{key} is empty");
            }
            prop_assert_eq!(ownership(&identity.labels(), &identity, None), Ownership::Ours);
        }

        #[test]
        fn legacy_owner_ids_are_label_values(uid in ".{0,80}") {
            let owner = legacy_owner_id(&uid);
            prop_assert!(is_label_value(&owner));
        }
    }
}
