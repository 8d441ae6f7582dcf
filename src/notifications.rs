//! What to do about a bucket's Pub/Sub notification configurations: which
//! declared ones to create and which the operator made to delete.
//!
//! GCS gives a configuration an id and never changes it; a configuration is
//! known by its content. The operator records the content of what it is
//! about to create in `status.notifications` before creating it, and deletes
//! only configurations whose content it recorded and that left the spec.
//! So a restart never forgets one, a restore (status lost) finds the
//! declared ones in place instead of duplicating them, and configurations
//! made outside bucketmap are never touched.

use std::collections::{BTreeMap, BTreeSet};

use crate::crd::{Notification, RecordedNotification};
use crate::gcs::NotificationResource;

/// The prefix GCS gives topic names.
const PUBSUB: &str = "//pubsub.googleapis.com/";

/// What makes two configurations the same: everything but the id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    topic: String,
    payload_format: String,
    event_types: BTreeSet<String>,
    object_name_prefix: String,
    custom_attributes: BTreeMap<String, String>,
}

impl Key {
    /// The key of a declared configuration.
    pub fn of(n: &Notification) -> Key {
        Key {
            topic: full_topic(&n.topic),
            payload_format: n.payload_format.as_gcs().to_owned(),
            event_types: n
                .event_types
                .iter()
                .map(|e| e.as_gcs().to_owned())
                .collect(),
            object_name_prefix: n.object_name_prefix.clone().unwrap_or_default(),
            custom_attributes: n.custom_attributes.clone(),
        }
    }

    /// The key of a configuration GCS returned.
    pub fn of_resource(r: &NotificationResource) -> Key {
        Key {
            topic: full_topic(&r.topic),
            payload_format: r.payload_format.clone().unwrap_or_else(|| "NONE".into()),
            event_types: r.event_types.iter().cloned().collect(),
            object_name_prefix: r.object_name_prefix.clone().unwrap_or_default(),
            custom_attributes: r.custom_attributes.clone(),
        }
    }

    /// The topic, in the form GCS shows.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

/// `projects/P/topics/T` in the form the JSON API takes and returns.
pub fn full_topic(topic: &str) -> String {
    if topic.starts_with(PUBSUB) {
        topic.to_owned()
    } else {
        format!("{PUBSUB}{topic}")
    }
}

/// Why GCS or Pub/Sub would refuse `n`, where admission cannot tell.
pub fn invalid(n: &Notification) -> Option<String> {
    let reserved = n.custom_attributes.keys().find(|k| k.starts_with("goog"))?;
    Some(format!(
        "the notification to {} has custom attribute {reserved:?}: Pub/Sub reserves keys that start with 'goog'",
        n.topic
    ))
}

/// The request that creates `n`.
pub fn to_resource(n: &Notification) -> NotificationResource {
    NotificationResource {
        id: None,
        topic: full_topic(&n.topic),
        payload_format: Some(n.payload_format.as_gcs().to_owned()),
        event_types: n
            .event_types
            .iter()
            .map(|e| e.as_gcs().to_owned())
            .collect(),
        object_name_prefix: n.object_name_prefix.clone(),
        custom_attributes: n.custom_attributes.clone(),
    }
}

/// The changes that make the bucket's configurations as declared.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Declared and missing (each content once).
    pub create: Vec<Notification>,
    /// Made by the operator and no longer declared: id and key.
    pub delete: Vec<(String, Key)>,
}

/// Compares `declared` with the bucket's `existing` configurations;
/// `recorded` is what the operator made before.
pub fn plan(
    declared: &[Notification],
    recorded: &[RecordedNotification],
    existing: &[NotificationResource],
) -> Plan {
    let present: BTreeSet<Key> = existing.iter().map(Key::of_resource).collect();
    let wanted: BTreeSet<Key> = declared.iter().map(Key::of).collect();
    let made: BTreeSet<Key> = recorded.iter().map(|r| Key::of(&r.config())).collect();
    let mut seen = BTreeSet::new();
    let create = declared
        .iter()
        .filter(|n| {
            let key = Key::of(n);
            invalid(n).is_none() && !present.contains(&key) && seen.insert(key)
        })
        .cloned()
        .collect();
    let delete = existing
        .iter()
        .filter_map(|r| {
            let key = Key::of_resource(r);
            let ours = made.contains(&key) && !wanted.contains(&key);
            Some((r.id.clone()?, key)).filter(|_| ours)
        })
        .collect();
    Plan { create, delete }
}

/// What to record before creating: everything recorded and everything
/// declared, each content once, with the ids GCS gave those it has.
pub fn intent(
    declared: &[Notification],
    recorded: &[RecordedNotification],
    existing: &[NotificationResource],
) -> Vec<RecordedNotification> {
    let mut out: Vec<RecordedNotification> = Vec::new();
    let configs = recorded.iter().map(RecordedNotification::config);
    for config in configs.chain(declared.iter().cloned()) {
        let key = Key::of(&config);
        if out.iter().any(|r| Key::of(&r.config()) == key) {
            continue;
        }
        out.push(RecordedNotification::new(&config, id_of(&key, existing)));
    }
    out
}

/// The id of the first existing configuration with `key`.
pub fn id_of(key: &Key, existing: &[NotificationResource]) -> Option<String> {
    existing
        .iter()
        .find(|r| Key::of_resource(r) == *key)
        .and_then(|r| r.id.clone())
}

/// Whether GCS refused a configuration because of its topic: it does not
/// exist, or the project's Cloud Storage service agent may not publish to
/// it (GCS does not say which).
pub fn is_topic_refusal(message: &str) -> bool {
    message.contains("Pub/Sub topic")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NotificationEvent, PayloadFormat};

    fn declared(topic: &str, events: &[NotificationEvent]) -> Notification {
        Notification {
            topic: topic.into(),
            payload_format: PayloadFormat::JsonApiV1,
            event_types: events.to_vec(),
            object_name_prefix: None,
            custom_attributes: BTreeMap::new(),
        }
    }

    fn existing(id: &str, n: &Notification) -> NotificationResource {
        NotificationResource {
            id: Some(id.into()),
            ..to_resource(n)
        }
    }

    fn recorded(n: &Notification) -> RecordedNotification {
        RecordedNotification::new(n, None)
    }

    use NotificationEvent::{ObjectDelete, ObjectFinalize};

    #[test]
    fn a_declared_configuration_in_place_in_either_topic_form_is_kept() {
        let short = declared("projects/p-123456/topics/uploads", &[ObjectFinalize]);
        let mut long = short.clone();
        long.topic = "//pubsub.googleapis.com/projects/p-123456/topics/uploads".into();
        let plan = plan(&[short], &[recorded(&long)], &[existing("1", &long)]);
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn event_order_does_not_make_another_configuration() {
        let a = declared(
            "projects/p-123456/topics/t1",
            &[ObjectFinalize, ObjectDelete],
        );
        let b = declared(
            "projects/p-123456/topics/t1",
            &[ObjectDelete, ObjectFinalize],
        );
        assert_eq!(plan(&[a], &[], &[existing("7", &b)]), Plan::default());
    }

    #[test]
    fn missing_declared_configurations_are_created_once() {
        let a = declared("projects/p-123456/topics/t1", &[]);
        let plan = plan(&[a.clone(), a.clone()], &[], &[]);
        assert_eq!(plan.create, vec![a]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn only_recorded_configurations_that_left_the_spec_are_deleted() {
        let ours = declared("projects/p-123456/topics/ours", &[]);
        let theirs = declared("projects/p-123456/topics/theirs", &[]);
        let kept = declared("projects/p-123456/topics/kept", &[ObjectDelete]);
        let found = [
            existing("1", &ours),
            existing("2", &theirs),
            existing("3", &kept),
        ];
        let plan = plan(
            std::slice::from_ref(&kept),
            &[recorded(&ours), recorded(&kept)],
            &found,
        );
        assert!(plan.create.is_empty());
        let deleted: Vec<&str> = plan.delete.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(deleted, ["1"]);
    }

    #[test]
    fn a_changed_configuration_is_created_anew_and_the_old_one_deleted() {
        let old = declared("projects/p-123456/topics/t1", &[ObjectFinalize]);
        let mut new = old.clone();
        new.object_name_prefix = Some("incoming/".into());
        let plan = plan(&[new.clone()], &[recorded(&old)], &[existing("4", &old)]);
        assert_eq!(plan.create, vec![new]);
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.delete[0].0, "4");
    }

    #[test]
    fn a_configuration_with_a_reserved_attribute_is_never_created() {
        let mut a = declared("projects/p-123456/topics/a", &[]);
        a.custom_attributes.insert("googx".into(), "1".into());
        assert!(invalid(&a).is_some_and(|why| why.contains("googx")));
        assert_eq!(plan(&[a], &[], &[]), Plan::default());
    }

    #[test]
    fn intent_keeps_every_recorded_and_declared_content_once_with_known_ids() {
        let a = declared("projects/p-123456/topics/a", &[]);
        let b = declared("projects/p-123456/topics/b", &[]);
        let out = intent(
            &[a.clone(), b.clone()],
            &[recorded(&a)],
            &[existing("9", &b)],
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].id, None);
        assert_eq!(out[1].id.as_deref(), Some("9"));
    }
}
