//! Moving a bucket under a running application (issue 59): the operator's
//! half of the switch protocol, as a pure state machine that the reconciler
//! drives and a model test checks (docs/ARCHITECTURE.md, "Moving a bucket:
//! the switch"). The sidecar's half is `bucketmap_sidecar_core::relocation`.

pub mod copy;
pub mod driver;
pub mod switch;

#[cfg(test)]
mod model_tests;

/// The map's format is the operator's to write and the sidecar's to read:
/// held to one meaning here.
#[cfg(test)]
mod format_tests {
    use bucketmap_sidecar_core::mapping::{FENCED_SUFFIX, Mapping};
    use bucketmap_sidecar_core::relocation::Entry;

    use crate::bucket_map::{self, entry_value};

    #[test]
    fn the_sidecar_reads_the_operators_fenced_and_open_values() {
        assert_eq!(bucket_map::FENCED_SUFFIX, FENCED_SUFFIX);
        let map = Mapping::new([
            ("photos".to_owned(), entry_value("photos-k3x9q2mw", true)),
            ("logs".to_owned(), entry_value("logs-a1b2c3d4", false)),
        ])
        .expect("the operator's values are a valid map");
        assert_eq!(map.physical("photos"), Some("photos-k3x9q2mw"));
        assert_eq!(map.entry("photos"), Entry::Fenced);
        assert_eq!(map.entry("photos-k3x9q2mw"), Entry::Fenced);
        assert_eq!(map.physical("logs"), Some("logs-a1b2c3d4"));
        assert_eq!(map.entry("logs"), Entry::Open);
    }
}
