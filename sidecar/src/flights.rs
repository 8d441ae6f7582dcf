//! Writes in flight, and their cut-off when a move fences their bucket
//! (docs/ARCHITECTURE.md, "Moving a bucket: the switch").
//!
//! Every write the sidecar forwards is registered with the physical
//! buckets it names ([`Flights::register`]) until its body is complete: the
//! HTTP request's body has been handed to the upstream connection whole
//! ([`Guarded`]), the gRPC write stream's message with `finish_write` has
//! (`grpc::service`). Whenever the map changes, and when it passes its
//! bound, [`run`] looks at each one: a write whose bucket
//! [`relocation::cut_off`] says no new write may go to (its entry fenced or
//! moved, or the map stale) is cut off — its body errors, so the upstream
//! request or stream is dropped before the upstream has the whole body, and
//! GCS commits nothing; the client gets a retryable error. A write whose
//! body was complete is left to finish: the operator waits for it.
//!
//! The cost is on writes only, and small: one allocation (the shared state
//! of the flight, its bucket names shared with the map) and a lock to enter
//! and leave the registry; reads are not registered.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldhash::HashMap;
use http_body::{Body, Frame, SizeHint};
use smallvec::SmallVec;
use tokio::sync::watch;

use crate::body::BoxError;
use crate::mapping::{Mapping, MappingStore};
use crate::metrics::Metrics;
use bucketmap_sidecar_core::relocation;

/// The physical buckets a write names (two at most but for odd requests).
pub type Buckets = SmallVec<[Arc<str>; 2]>;

/// While a map is stale, how often [`run`] looks again for its bound (a
/// confirmation moves it, and tells no one).
const RECHECK_WHILE_STALE: Duration = Duration::from_secs(1);

/// The writes in flight.
#[derive(Debug)]
pub struct Flights {
    store: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Flight>>>,
}

/// One write in flight: where it was sent, and whether its body is
/// complete or it was cut off (whichever came first).
#[derive(Debug)]
pub struct Flight {
    sent_to: Buckets,
    state: AtomicU8,
    /// Woken when the write is cut off, to fail its body at once.
    waker: Mutex<Option<Waker>>,
}

const SENDING: u8 = 0;
const COMPLETE: u8 = 1;
const CUT: u8 = 2;

impl Flight {
    /// Whether the write was cut off.
    pub fn is_cut(&self) -> bool {
        self.state.load(Ordering::Acquire) == CUT
    }

    /// Marks the body complete; `false` when the write was cut off first.
    pub fn complete(&self) -> bool {
        match self
            .state
            .compare_exchange(SENDING, COMPLETE, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == COMPLETE,
        }
    }

    /// Whether the write is cut off; if not, `cx` is woken when it is.
    pub fn poll_cut(&self, cx: &Context<'_>) -> bool {
        if self.is_cut() {
            return true;
        }
        {
            let mut waker = lock(&self.waker);
            match waker.as_ref() {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        // A cut between the first look and the waker's registration.
        self.is_cut()
    }

    /// Cuts the write off unless its body is complete; whether it did.
    fn cut(&self) -> bool {
        let cut = self
            .state
            .compare_exchange(SENDING, CUT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if cut && let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
        cut
    }
}

/// A write's place among the flights; dropping it takes the write off.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    flight: Arc<Flight>,
    flights: Arc<Flights>,
}

impl Ticket {
    /// The write's shared state.
    pub fn flight(&self) -> &Arc<Flight> {
        &self.flight
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.flights.open).remove(&self.id);
    }
}

impl Flights {
    /// No write in flight yet.
    pub fn new(store: Arc<MappingStore>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            store,
            metrics,
            next: AtomicU64::new(0),
            open: Mutex::default(),
        })
    }

    /// Registers a write sent to `sent_to` (physical names). A map put in
    /// force since the write was decided was looked at before the write
    /// was registered, so it is looked at once more here.
    pub fn register(self: &Arc<Self>, sent_to: Buckets) -> Ticket {
        let flight = Arc::new(Flight {
            sent_to,
            state: AtomicU8::new(SENDING),
            waker: Mutex::new(None),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(id, flight.clone());
        let mapping = self.store.current();
        let stale = self.store.staleness().is_some();
        self.check(&flight, mapping.as_deref(), stale);
        Ticket {
            id,
            flight,
            flights: self.clone(),
        }
    }

    /// Cuts off every write in flight that the map in force (and its age)
    /// no longer lets through to the bucket it was sent to.
    pub fn sweep(&self) {
        let mapping = self.store.current();
        let stale = self.store.staleness().is_some();
        for flight in lock(&self.open).values() {
            self.check(flight, mapping.as_deref(), stale);
        }
    }

    fn check(&self, flight: &Flight, mapping: Option<&Mapping>, stale: bool) {
        let must = flight
            .sent_to
            .iter()
            .any(|bucket| must_cut(mapping, bucket, stale));
        if must && flight.cut() {
            self.metrics.cut_off_writes.inc();
            tracing::info!(
                buckets = ?flight.sent_to,
                stale,
                "a write in flight was cut off: its bucket is being moved or the map went stale"
            );
        }
    }

    /// How many writes are in flight (tests).
    pub fn len(&self) -> usize {
        lock(&self.open).len()
    }

    /// Whether no write is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a write sent to `sent_to` must be cut off under `mapping`: the
/// rule of [`relocation::cut_off`] for the entry that now holds `sent_to`;
/// an entry that no longer names it has moved (or left the map).
fn must_cut(mapping: Option<&Mapping>, sent_to: &str, stale: bool) -> bool {
    let Some(mapping) = mapping else {
        return true;
    };
    match mapping.logical(sent_to) {
        None => true,
        Some(logical) => relocation::cut_off(
            sent_to,
            mapping.physical(logical).unwrap_or_default(),
            mapping.entry(logical),
            stale,
        ),
    }
}

/// Looks at every write in flight whenever the map changes and when it
/// passes its bound, until `shutdown` turns true.
pub async fn run(flights: Arc<Flights>, mut shutdown: watch::Receiver<bool>) {
    let mut changes = flights.store.changes();
    loop {
        let now = Instant::now();
        // Just past the bound: at the bound itself the map is still fresh.
        let wake = flights.store.stale_at().map(|at| match at > now {
            true => at + Duration::from_millis(1),
            false => now + RECHECK_WHILE_STALE,
        });
        let timer = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = timer => {}
            _ = shutdown.changed() => return,
        }
        flights.sweep();
    }
}

/// Why a write's body failed: it was cut off.
#[derive(Debug, thiserror::Error)]
#[error("the write was cut off: its bucket is being moved, or the bucket map went stale")]
pub struct CutOff;

pin_project_lite::pin_project! {
    /// A write's request body, failed when the write is cut off before the
    /// body is complete; it holds the write's [`Ticket`]. (`left`: the
    /// bytes still to come, when the body's length is known.)
    pub struct Guarded<B> {
        #[pin]
        inner: B,
        ticket: Ticket,
        left: Option<u64>,
    }
}

impl<B: Body> Guarded<B> {
    /// `inner`, registered as `ticket`.
    pub fn new(inner: B, ticket: Ticket) -> Self {
        let left = inner.size_hint().exact();
        Self {
            inner,
            ticket,
            left,
        }
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes, Error = BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let flight = &this.ticket.flight;
        if flight.is_cut() {
            return Poll::Ready(Some(Err(Box::new(CutOff))));
        }
        let polled = match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending if flight.poll_cut(cx) => {
                return Poll::Ready(Some(Err(Box::new(CutOff))));
            }
            Poll::Pending => return Poll::Pending,
            Poll::Ready(polled) => polled,
        };
        let complete = match &polled {
            None => true,
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                *this.left = this.left.map(|left| left.saturating_sub(len));
                *this.left == Some(0) || this.inner.is_end_stream()
            }
            Some(Err(_)) => false,
        };
        if complete && !flight.complete() {
            return Poll::Ready(Some(Err(Box::new(CutOff))));
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A flight's waker and the registry hold no invariant a panic could
    // break half-way.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt as _;

    use super::*;
    use crate::body::full;

    fn map(entries: &[(&str, &str)]) -> Mapping {
        Mapping::new(
            entries
                .iter()
                .map(|(l, v)| ((*l).to_owned(), (*v).to_owned())),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn flights(mapping: Mapping) -> (Arc<MappingStore>, Arc<Flights>, Arc<Metrics>) {
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        store.set(mapping);
        let metrics = Arc::new(Metrics::new());
        let flights = Flights::new(store.clone(), metrics.clone());
        (store, flights, metrics)
    }

    fn sent_to(name: &str) -> Buckets {
        std::iter::once(Arc::from(name)).collect()
    }

    #[test]
    fn a_write_is_cut_off_when_its_entry_is_fenced_or_moved_and_not_when_complete() {
        let open = map(&[("photos", "photos-v1v1v1v1"), ("logs", "logs-aaaa1111")]);
        let (store, flights, metrics) = flights(open);
        let photos = flights.register(sent_to("photos-v1v1v1v1"));
        let logs = flights.register(sent_to("logs-aaaa1111"));
        let done = flights.register(sent_to("photos-v1v1v1v1"));
        assert!(done.flight().complete());
        assert_eq!(flights.len(), 3);
        flights.sweep();
        assert!(!photos.flight().is_cut() && !logs.flight().is_cut());
        // `photos` fenced: its write with a body still arriving is cut off,
        // the complete one and the other entry's are not.
        store.set(map(&[
            ("photos", "photos-v1v1v1v1;fenced"),
            ("logs", "logs-aaaa1111"),
        ]));
        flights.sweep();
        assert!(photos.flight().is_cut());
        assert!(!photos.flight().complete(), "a cut write completed");
        assert!(!done.flight().is_cut());
        assert!(!logs.flight().is_cut());
        assert_eq!(metrics.cut_off_writes.get(), 1);
        // `logs` moved to another bucket: cut off too.
        store.set(map(&[
            ("photos", "photos-v1v1v1v1"),
            ("logs", "logs-bbbb2222"),
        ]));
        flights.sweep();
        assert!(logs.flight().is_cut());
        assert_eq!(metrics.cut_off_writes.get(), 2);
        // Registered after the change: cut off at once.
        let late = flights.register(sent_to("logs-aaaa1111"));
        assert!(late.flight().is_cut());
        drop((photos, logs, done, late));
        assert!(flights.is_empty());
    }

    #[tokio::test]
    async fn a_cut_off_body_fails_at_once_and_a_complete_one_ends() {
        let (store, flights, _) = flights(map(&[("photos", "photos-v1v1v1v1")]));
        // A body that waits for its client, as a slow upload's does.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let frames = Box::pin(futures::stream::unfold(rx, |mut rx| async {
            rx.recv().await.map(|frame| (frame, rx))
        }));
        let slow = http_body_util::StreamBody::new(frames);
        let mut body = Guarded::new(slow, flights.register(sent_to("photos-v1v1v1v1")));
        let part = Frame::data(Bytes::from_static(b"part"));
        tx.send(Ok(part)).await.unwrap_or_else(|e| panic!("{e}"));
        let first = body.frame().await.map(|f| f.map(|f| f.is_data()));
        assert!(matches!(first, Some(Ok(true))), "{first:?}");
        let polled = Arc::new(AtomicUsize::new(0));
        let waiting = tokio::spawn({
            let polled = polled.clone();
            async move {
                polled.fetch_add(1, Ordering::SeqCst);
                body.frame().await.map(|f| f.map(|_| ()))
            }
        });
        while polled.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        store.set(map(&[("photos", "photos-v1v1v1v1;fenced")]));
        flights.sweep();
        let ended = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        let error = ended
            .as_ref()
            .and_then(|r| r.as_ref().err())
            .map(ToString::to_string);
        assert!(error.is_some_and(|e| e.contains("cut off")), "{ended:?}");
        drop(tx);
        // A whole body is complete once its last frame is out: no cut after.
        store.set(map(&[("photos", "photos-v1v1v1v1")]));
        let mut whole = Guarded::new(full("all"), flights.register(sent_to("photos-v1v1v1v1")));
        let all = whole.frame().await.map(|f| f.is_ok());
        assert_eq!(all, Some(true));
        store.set(map(&[("photos", "photos-v1v1v1v1;fenced")]));
        flights.sweep();
        assert!(!whole.ticket.flight().is_cut());
        assert!(whole.frame().await.is_none());
    }
}
