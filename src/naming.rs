//! Physical bucket names and ownership labels.
//!
//! A physical name is `<logical>-<suffix>`: the suffix is 8 base36 characters
//! derived from the resource's identity (namespace, name, uid) and a naming
//! attempt number. The same inputs always give the same name, so an operator
//! that crashes or loses a response finds its own bucket again instead of
//! creating a second one; a new attempt number is used only when the name turns
//! out to belong to somebody else.

use sha2::{Digest, Sha256};

/// Characters in the suffix appended to the logical name.
pub const SUFFIX_LEN: usize = 8;
/// Longest logical name: GCS allows 63 characters, the suffix takes 9.
pub const MAX_LOGICAL_NAME_LEN: usize = 54;
/// Label every operator-created bucket carries.
pub const MANAGED_BY_LABEL: &str = "managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "bucketmap";
/// Label naming the `Gcs` resource (by uid) that owns the bucket.
pub const OWNER_LABEL: &str = "bucketmap-owner";

const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Identity of a `Gcs` resource, the input of its physical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The resource's namespace.
    pub namespace: &'a str,
    /// The resource's name.
    pub name: &'a str,
    /// The resource's `metadata.uid`: a re-created resource gets new names.
    pub uid: &'a str,
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
    let mut hasher = Sha256::new();
    // Length-prefix each part so ("ab", "c") and ("a", "bc") differ.
    for part in [identity.namespace, identity.name, identity.uid] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(attempt.to_be_bytes());
    if salt > 0 {
        hasher.update(salt.to_be_bytes());
    }
    let digest = hasher.finalize();
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

/// The value of [`OWNER_LABEL`] for a resource uid: GCS label values allow
/// lowercase letters, digits, `-` and `_`, which a Kubernetes uid already is.
pub fn owner_id(uid: &str) -> String {
    uid.to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(63)
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

    fn id<'a>(namespace: &'a str, name: &'a str, uid: &'a str) -> Identity<'a> {
        Identity {
            namespace,
            name,
            uid,
        }
    }

    #[test]
    fn suffix_changes_with_every_input() {
        let base = suffix(id("staging", "photos", "u1"), 0);
        assert_ne!(base, suffix(id("prod", "photos", "u1"), 0));
        assert_ne!(base, suffix(id("staging", "videos", "u1"), 0));
        assert_ne!(base, suffix(id("staging", "photos", "u2"), 0));
        assert_ne!(base, suffix(id("staging", "photos", "u1"), 1));
        assert_ne!(suffix(id("ab", "c", "u"), 0), suffix(id("a", "bc", "u"), 0));
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
    fn owner_id_is_a_valid_label_value() {
        assert_eq!(owner_id("3F2A-b9_c"), "3f2a-b9_c");
        assert_eq!(owner_id("a.b/c"), "a-b-c");
    }

    proptest! {
        #[test]
        fn physical_names_are_valid_bounded_and_deterministic(
            logical in "[a-z0-9][a-z0-9_-]{1,52}[a-z0-9]",
            namespace in "[a-z0-9-]{1,63}",
            name in "[a-z0-9.-]{1,253}",
            uid in "[0-9a-f-]{36}",
            attempt in 0u32..100,
        ) {
            prop_assume!(validate_logical_name(&logical).is_ok());
            let identity = id(&namespace, &name, &uid);
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
        fn owner_ids_are_label_values(uid in ".{0,80}") {
            let owner = owner_id(&uid);
            prop_assert!(owner.len() <= 63);
            prop_assert!(owner.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'));
        }
    }
}
