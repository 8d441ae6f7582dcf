//! Work slots: how many reconciles do work (GCS calls, API writes) at once.
//!
//! The controller's own concurrency limit counts a reconcile as busy for its
//! whole life, also while it only waits for its namespace's bucket map to be
//! written. With many resources in one namespace those waits, not the API
//! server, limited how fast resources became Ready. So the controller runs
//! more reconciles at once ([`WAITING_FACTOR`] times the work limit) and each
//! holds a [`Slot`] while it works, giving it back while it waits
//! ([`Slot::released_while`]). Work stays bounded by `--concurrency`; waiting
//! does not count against it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Error, Result};

/// Reconciles admitted by the controller per work slot: the rest of them
/// may be waiting for a map write at any time.
pub const WAITING_FACTOR: usize = 8;

/// The operator's work slots (`--concurrency` of them; 0: unbounded).
#[derive(Clone, Debug)]
pub struct Slots(Arc<Semaphore>);

impl Slots {
    /// `concurrency` slots; 0 means as many as a semaphore can hold.
    pub fn new(concurrency: u16) -> Self {
        let permits = match concurrency {
            0 => Semaphore::MAX_PERMITS,
            n => usize::from(n),
        };
        Slots(Arc::new(Semaphore::new(permits)))
    }

    /// The controller's own limit: room for the reconciles that wait.
    pub fn controller_concurrency(concurrency: u16) -> u16 {
        let admitted = usize::from(concurrency).saturating_mul(WAITING_FACTOR);
        u16::try_from(admitted).unwrap_or(u16::MAX)
    }

    /// Waits for a free slot (first come, first served).
    pub async fn acquire(&self) -> Result<Slot> {
        let permit = self.permit().await?;
        Ok(Slot {
            slots: self.clone(),
            permit: Some(permit),
        })
    }

    async fn permit(&self) -> Result<OwnedSemaphorePermit> {
        // The semaphore is never closed; this error would be a bug.
        self.0
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Publish("the work slots were closed".into()))
    }

    /// Slots free right now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// One reconcile's work slot, held until dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Slots,
    permit: Option<OwnedSemaphorePermit>,
}

impl Slot {
    /// Runs `wait` without the slot, then takes a slot again.
    pub async fn released_while<F: Future>(&mut self, wait: F) -> Result<F::Output> {
        self.permit = None;
        let output = wait.await;
        self.permit = Some(self.slots.permit().await?);
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiting_reconcile_gives_its_slot_to_another() {
        let slots = Slots::new(1);
        let mut first = slots.acquire().await.expect("slot");
        assert_eq!(slots.available(), 0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let other = slots.clone();
        let second = tokio::spawn(async move {
            let _slot = other.acquire().await.expect("slot");
            tx.send(()).expect("the first is waiting");
        });
        // The first waits for the second to get a slot: it must have given
        // its own back, or this would never finish.
        first.released_while(rx).await.expect("slot").expect("sent");
        second.await.expect("second reconcile");
        assert_eq!(slots.available(), 0, "the first holds its slot again");
        drop(first);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn work_never_exceeds_the_slots() {
        let slots = Slots::new(2);
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let (slots, busy, peak) = (slots.clone(), busy.clone(), peak.clone());
                tokio::spawn(async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let mut slot = slots.acquire().await.expect("slot");
                    let now = busy.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    tokio::task::yield_now().await;
                    busy.fetch_sub(1, SeqCst);
                    slot.released_while(tokio::task::yield_now())
                        .await
                        .expect("slot");
                    let now = busy.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    tokio::task::yield_now().await;
                    busy.fetch_sub(1, SeqCst);
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 2);
    }

    #[test]
    fn the_controller_admits_more_than_the_work_slots() {
        assert_eq!(Slots::controller_concurrency(32), 256);
        assert_eq!(Slots::controller_concurrency(0), 0, "0 stays unbounded");
        assert_eq!(Slots::controller_concurrency(u16::MAX), u16::MAX);
    }
}
