//! Where the bucket name stands in the resource names of the gRPC API.

use std::ops::Range;

use super::table::Kind;

/// The byte range of the bucket name in `value`, a field of `kind`:
/// - [`Kind::BucketName`]: exactly `projects/{project}/buckets/{bucket}`;
/// - [`Kind::BucketPrefixed`]: that, optionally followed by `/` and anything;
/// - [`Kind::BucketId`]: the whole (non-empty) value.
///
/// The project is any non-empty segment without `/` (often `_`); the bucket
/// is non-empty. `None` when `value` has not that shape (or `kind` names no
/// bucket).
pub fn bucket_range(value: &str, kind: Kind) -> Option<Range<usize>> {
    match kind {
        Kind::BucketId => (!value.is_empty()).then_some(0..value.len()),
        Kind::BucketName => in_resource_name(value, false),
        Kind::BucketPrefixed => in_resource_name(value, true),
        Kind::Message(_) | Kind::BucketList(_) => None,
    }
}

/// The bucket segment of `projects/{project}/buckets/{bucket}[/...]`.
fn in_resource_name(value: &str, trailing: bool) -> Option<Range<usize>> {
    let after_projects = value.strip_prefix("projects/")?;
    let slash = after_projects.find('/')?;
    if slash == 0 {
        return None;
    }
    let bucket_and_rest = after_projects[slash..].strip_prefix("/buckets/")?;
    let start = value.len() - bucket_and_rest.len();
    let end = match bucket_and_rest.find('/') {
        None => value.len(),
        Some(i) if trailing => start + i,
        Some(_) => return None,
    };
    (end > start).then_some(start..end)
}

/// How a value of `kind` must look, for error messages.
pub fn expected_shape(kind: Kind) -> &'static str {
    match kind {
        Kind::BucketName => "projects/_/buckets/NAME",
        Kind::BucketPrefixed => "projects/_/buckets/NAME[/...]",
        Kind::BucketId | Kind::Message(_) | Kind::BucketList(_) => "a bucket name",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(value: &str, kind: Kind) -> Option<&str> {
        bucket_range(value, kind).map(|r| &value[r])
    }

    #[test]
    fn bucket_names_are_exact() {
        let kind = Kind::BucketName;
        assert_eq!(bucket("projects/_/buckets/photos", kind), Some("photos"));
        assert_eq!(bucket("projects/p-1/buckets/photos", kind), Some("photos"));
        for bad in [
            "",
            "photos",
            "projects/_/buckets/",
            "projects//buckets/photos",
            "projects/_/buckets/photos/",
            "projects/_/buckets/photos/folders/a",
            "projects/_/objects/photos",
            "project/_/buckets/photos",
            "projects/_",
        ] {
            assert_eq!(bucket(bad, kind), None, "{bad}");
        }
    }

    #[test]
    fn prefixed_names_may_go_on() {
        let kind = Kind::BucketPrefixed;
        for (value, want) in [
            ("projects/_/buckets/photos", "photos"),
            ("projects/_/buckets/photos/", "photos"),
            ("projects/_/buckets/photos/folders/a/b/", "photos"),
            ("projects/_/buckets/photos/managedFolders/m", "photos"),
        ] {
            assert_eq!(bucket(value, kind), Some(want), "{value}");
        }
        for bad in ["projects/_/buckets//x", "photos/x", "projects/_/buckets"] {
            assert_eq!(bucket(bad, kind), None, "{bad}");
        }
    }

    #[test]
    fn ids_are_whole_values() {
        assert_eq!(bucket("photos", Kind::BucketId), Some("photos"));
        assert_eq!(bucket("", Kind::BucketId), None);
        assert_eq!(bucket("photos", Kind::Message(0)), None);
    }
}
