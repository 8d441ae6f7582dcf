//! Kubernetes events about `Gcs` resources (`events.k8s.io/v1`).
//!
//! Warnings go through kube's [`Recorder`], which folds a warning repeated
//! within six minutes into one event with a growing `series` count (a failing
//! reconcile retries for as long as the fault lasts). To do that it keeps
//! every event it published in memory for six minutes, and scans that cache
//! on each publish: for one-off `Normal` events (`Created`, `Updated`, ...)
//! that nobody repeats, this grew the operator's memory by about 4 MiB per
//! 1000 new resources, and its CPU with the square of them. Those are
//! created directly instead, with the same fields, and nothing is kept.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes events as `reporter`.
pub struct Events {
    client: kube::Client,
    reporter: Reporter,
    recorder: Recorder,
}

impl Events {
    /// Events reported as `reporter` (the operator's controller and instance).
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Events {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes an event about `regarding`: warnings folded into series,
    /// normal events once.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        match event.type_ {
            EventType::Warning => self.recorder.publish(event, regarding).await,
            EventType::Normal => {
                let ns = regarding.namespace.as_deref().unwrap_or("default");
                let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), ns);
                api.create(
                    &PostParams::default(),
                    &one_off(&self.reporter, event, regarding),
                )
                .await
                .map(drop)
            }
        }
    }
}

/// The event as kube's `Recorder` writes a new one.
fn one_off(reporter: &Reporter, event: &Event, regarding: &ObjectReference) -> K8sEvent {
    let now = k8s_openapi::jiff::Timestamp::now();
    let controller = &reporter.controller;
    K8sEvent {
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(controller),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| controller.clone()),
        ),
        type_: Some("Normal".to_owned()),
        ..K8sEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_off_event_has_what_a_recorded_one_has() {
        let reporter = Reporter {
            controller: "bucketmap".into(),
            instance: Some("bucketmap-0".into()),
        };
        let regarding = ObjectReference {
            name: Some("photos".into()),
            namespace: Some("team-a".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "Created".into(),
            note: Some("Created bucket photos-x".into()),
            action: "CreateBucket".into(),
            secondary: None,
        };
        let e = one_off(&reporter, &event, &regarding);
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        assert!(
            e.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("photos."))
        );
        assert_eq!(e.reason.as_deref(), Some("Created"));
        assert_eq!(e.action.as_deref(), Some("CreateBucket"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.reporting_controller.as_deref(), Some("bucketmap"));
        assert_eq!(e.reporting_instance.as_deref(), Some("bucketmap-0"));
        assert!(e.event_time.is_some() && e.series.is_none());
    }
}
