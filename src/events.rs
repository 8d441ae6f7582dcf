//! Kubernetes events about `Gcs` resources (`events.k8s.io/v1`).
//!
//! Warnings go through kube's [`Recorder`], which folds a warning repeated
//! within six minutes into one event with a growing `series` count (a failing
//! reconcile retries for as long as the fault lasts). To do that it keeps
//! every event it published in memory for six minutes, and scans that cache
//! on each publish: for one-off `Normal` events (`Created`, `Updated`, ...)
//! that nobody repeats, this grew the operator's memory with every new
//! resource, and its CPU with the square of their number. Those are
//! created directly instead, with the same fields, and nothing is kept.
//!
//! Publishing never waits for the API server. Events go into a bounded queue
//! that one background task writes in order, one at a time, as client-go's
//! event broadcaster does for every controller written in Go: a reconcile
//! goes on as soon as its event is queued, and under a burst of work (5000
//! new resources at once) the events yield the API server to the writes
//! that make resources Ready, and follow them. The state itself is in each
//! resource's status conditions; events are best effort. When the queue is
//! full, new events are dropped and counted (`bucketmap_events_dropped`),
//! as client-go drops them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::warn;

use crate::metrics::Metrics;

/// Events queued at most (each about 0.3 KiB): a burst of this many new
/// resources keeps all its `Created` events.
pub const QUEUE_CAPACITY: usize = 10_000;

/// The fields of a queued event, in the order [`Queued`] packs them.
const FIELDS: usize = 9;

fn opt(f: Option<&String>) -> &str {
    f.map_or("", String::as_str)
}

/// One queued event, packed into one allocation: a burst holds thousands.
struct Queued {
    warning: bool,
    /// The reason, action and note, then the regarding object's apiVersion,
    /// kind, namespace, name, uid and resourceVersion, one after another.
    text: Box<str>,
    /// Where each field of `text` ends.
    ends: [usize; FIELDS],
}

impl Queued {
    fn new(type_: EventType, reason: &str, action: &str, note: &str, r: &ObjectReference) -> Self {
        let fields: [&str; FIELDS] = [
            reason,
            action,
            note,
            opt(r.api_version.as_ref()),
            opt(r.kind.as_ref()),
            opt(r.namespace.as_ref()),
            opt(r.name.as_ref()),
            opt(r.uid.as_ref()),
            opt(r.resource_version.as_ref()),
        ];
        let mut text = String::with_capacity(fields.iter().map(|f| f.len()).sum());
        let mut ends = [0; FIELDS];
        for (end, field) in ends.iter_mut().zip(fields) {
            text.push_str(field);
            *end = text.len();
        }
        Queued {
            warning: matches!(type_, EventType::Warning),
            text: text.into_boxed_str(),
            ends,
        }
    }

    /// Field `i`, or `None` when it is empty.
    fn field(&self, i: usize) -> Option<String> {
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p]);
        let f = &self.text[start..self.ends[i]];
        (!f.is_empty()).then(|| f.to_owned())
    }

    /// The event and what it regards, as kube writes them.
    fn unpack(&self) -> (Event, ObjectReference) {
        let event = Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.field(0).unwrap_or_default(),
            action: self.field(1).unwrap_or_default(),
            note: self.field(2),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: self.field(3),
            kind: self.field(4),
            namespace: self.field(5),
            name: self.field(6),
            uid: self.field(7),
            resource_version: self.field(8),
            field_path: None,
        };
        (event, regarding)
    }
}

/// Publishes events as `reporter`, through the background writer.
pub struct Events {
    queue: mpsc::Sender<Queued>,
    metrics: Arc<Metrics>,
}

impl Events {
    /// Events reported as `reporter` (the operator's controller and
    /// instance), written by a task spawned here that ends when this is
    /// dropped (after writing what is queued).
    pub fn new(client: kube::Client, reporter: Reporter, metrics: Arc<Metrics>) -> Self {
        Self::with_capacity(client, reporter, metrics, QUEUE_CAPACITY)
    }

    fn with_capacity(
        client: kube::Client,
        reporter: Reporter,
        metrics: Arc<Metrics>,
        capacity: usize,
    ) -> Self {
        let (queue, queued) = mpsc::channel(capacity.max(1));
        tokio::spawn(write_all(client, reporter, queued));
        Events { queue, metrics }
    }

    /// Queues an event about `regarding`, or drops it when the queue is
    /// full. An empty `note` is none.
    pub fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        regarding: &ObjectReference,
    ) {
        let queued = Queued::new(type_, reason, action, note, regarding);
        if self.queue.try_send(queued).is_err() {
            let dropped = self.metrics.event_dropped();
            // Logged at 1, 2, 4, 8, ... so that a long burst is not a flood.
            if dropped.is_power_of_two() {
                warn!(dropped, reason, "event queue full or closed: event dropped");
            }
        }
    }
}

/// Writes the queued events in order, one at a time: warnings folded into
/// series, normal events once. A failed write is logged and not retried.
async fn write_all(client: kube::Client, reporter: Reporter, mut queued: mpsc::Receiver<Queued>) {
    let recorder = Recorder::new(client.clone(), reporter.clone());
    while let Some(q) = queued.recv().await {
        let (event, regarding) = q.unpack();
        let written = match event.type_ {
            EventType::Warning => recorder.publish(&event, &regarding).await,
            EventType::Normal => {
                let ns = regarding.namespace.as_deref().unwrap_or("default");
                let api: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
                api.create(
                    &PostParams::default(),
                    &one_off(&reporter, &event, &regarding),
                )
                .await
                .map(drop)
            }
        };
        if let Err(e) = written {
            warn!(error = %e, reason = event.reason, "cannot publish event");
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
    use std::sync::Mutex;

    fn photos() -> ObjectReference {
        ObjectReference {
            api_version: Some("storage.bucketmap.dev/v1alpha1".into()),
            kind: Some("Gcs".into()),
            name: Some("photos".into()),
            namespace: Some("team-a".into()),
            uid: Some("0b3c".into()),
            resource_version: Some("42".into()),
            field_path: None,
        }
    }

    #[test]
    fn a_queued_event_unpacks_to_what_was_published() {
        let q = Queued::new(
            EventType::Warning,
            "NameConflict",
            "CreateBucket",
            "taken",
            &photos(),
        );
        let (event, regarding) = q.unpack();
        assert_eq!(regarding, photos());
        assert!(matches!(event.type_, EventType::Warning));
        assert_eq!(
            (event.reason.as_str(), event.action.as_str()),
            ("NameConflict", "CreateBucket")
        );
        assert_eq!(event.note.as_deref(), Some("taken"));
        // Empty fields are absent, not empty strings.
        let bare = ObjectReference {
            name: Some("x".into()),
            ..ObjectReference::default()
        };
        let (event, regarding) = Queued::new(EventType::Normal, "Created", "", "", &bare).unpack();
        assert!(matches!(event.type_, EventType::Normal));
        assert_eq!(event.note, None);
        assert_eq!(regarding, bare);
    }

    /// A stand-in API server that answers event creates only once `open`
    /// is true, recording each event's note in order.
    fn gated_server(
        open: tokio::sync::watch::Receiver<bool>,
        notes: Arc<Mutex<Vec<String>>>,
    ) -> kube::Client {
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let (mut open, notes) = (open.clone(), notes.clone());
            async move {
                open.wait_for(|o| *o).await?;
                let body = req.into_body().collect_bytes().await?;
                let event: K8sEvent = serde_json::from_slice(&body)?;
                if let Ok(mut n) = notes.lock() {
                    n.push(event.note.unwrap_or_default());
                }
                let answer = axum::http::Response::builder()
                    .status(201)
                    .body(kube::client::Body::from(body.to_vec()))?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(answer)
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn publishing_never_waits_events_are_written_in_order_and_dropped_when_the_queue_is_full()
    {
        let (open, gate) = tokio::sync::watch::channel(false);
        let notes = Arc::new(Mutex::new(Vec::new()));
        let metrics = Arc::new(Metrics::default());
        let reporter = Reporter {
            controller: "bucketmap".into(),
            instance: None,
        };
        let client = gated_server(gate, notes.clone());
        let events = Events::with_capacity(client, reporter, metrics.clone(), 3);
        // The API server answers nothing yet, and the writer has not run
        // (one thread, no await): three are queued, seven dropped.
        for i in 0..10 {
            events.publish(
                EventType::Normal,
                "Created",
                "CreateBucket",
                &format!("n{i}"),
                &photos(),
            );
        }
        assert_eq!(metrics.event_dropped(), 8, "seven dropped before this one");
        open.send(true).expect("the writer is running");
        drop(events);
        let written = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let n = notes.lock().map(|n| n.clone()).unwrap_or_default();
                if n.len() >= 3 {
                    return n;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the queued events are written after the queue is dropped");
        assert_eq!(written, ["n0", "n1", "n2"]);
    }

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
