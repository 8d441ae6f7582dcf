//! The drift check: every resource is reconciled once per resync period.
//!
//! A reconcile that did its work asks for no requeue; [`resyncs`] brings
//! each resource back instead. The period is cut into slots and a
//! resource's slot is fixed by a hash of its uid, so the checks spread
//! evenly over the period and each resource is checked once per period,
//! however often it was reconciled in between. No timer is held per
//! resource: a requeue would keep an entry per resource in kube-runtime's
//! scheduler for the whole period, the largest share of the operator's
//! memory after the cache of the resources themselves
//! (docs/BENCHMARKS.md).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::Gcs;

/// Slots per period, when a slot would last at least [`MIN_SLOT`].
const SLOTS: u32 = 256;
/// The shortest slot: each slot walks the cache once.
const MIN_SLOT: Duration = Duration::from_millis(100);

/// How `period` is cut: the number of slots and the length of one.
fn slotting(period: Duration) -> (u32, Duration) {
    let fit = period.as_millis() / MIN_SLOT.as_millis();
    let slots = u32::try_from(fit).unwrap_or(u32::MAX).clamp(1, SLOTS);
    (slots, period / slots)
}

/// The slot of `obj` among `slots`: the same for the object's whole life
/// (its uid; name and namespace for an object the API server did not
/// store, as in tests).
fn slot_of(obj: &Gcs, slots: u32) -> u32 {
    let mut hasher = DefaultHasher::new();
    match &obj.metadata.uid {
        Some(uid) => uid.hash(&mut hasher),
        None => (&obj.metadata.namespace, &obj.metadata.name).hash(&mut hasher),
    }
    u32::try_from(hasher.finish() % u64::from(slots)).unwrap_or_default()
}

/// The resources of `cache` whose drift check is due, slot after slot: each
/// resource once per `period`, the first slot at once.
pub(super) fn resyncs(
    cache: Store<Gcs>,
    period: Duration,
) -> impl Stream<Item = ObjectRef<Gcs>> + Send + 'static {
    let (slots, slot_length) = slotting(period);
    // A tick missed while the runtime was busy still comes (the default
    // burst): no slot is skipped.
    let ticks = stream::unfold(tokio::time::interval(slot_length), |mut ticks| async {
        ticks.tick().await;
        Some(((), ticks))
    });
    ticks
        .zip(stream::iter((0..slots).cycle()))
        .flat_map(move |((), slot)| {
            let due: Vec<ObjectRef<Gcs>> = cache
                .state_filter(|obj| slot_of(obj, slots) == slot)
                .iter()
                .map(|obj| ObjectRef::from_obj(&**obj))
                .collect();
            stream::iter(due)
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;

    fn resource(i: usize) -> Gcs {
        let mut obj = Gcs::new(
            &format!("r{i}"),
            serde_json::from_value(serde_json::json!({"bucketName": "photos"}))
                .expect("a valid spec"),
        );
        obj.metadata.namespace = Some(format!("team-{}", i % 7));
        obj.metadata.uid = Some(format!("00000000-0000-0000-0000-{i:012}"));
        obj
    }

    /// How often each resource came in the first `periods` periods.
    async fn counts(n: usize, period: Duration, periods: u32) -> BTreeMap<String, u32> {
        let (cache, mut writer) = reflector::store();
        for i in 0..n {
            writer.apply_watcher_event(&Event::Apply(resource(i)));
        }
        let mut due = Box::pin(resyncs(cache, period));
        let mut seen = BTreeMap::new();
        // Just short of the end: the next period's first slot comes at once.
        let window = period * periods - MIN_SLOT / 2;
        let _ = tokio::time::timeout(window, async {
            while let Some(obj) = due.next().await {
                *seen.entry(obj.name).or_insert(0) += 1;
            }
        })
        .await;
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn resync_brings_every_resource_once_per_period() {
        for (period, periods) in [(Duration::from_secs(2), 3), (Duration::from_secs(1800), 2)] {
            let seen = counts(500, period, periods).await;
            assert_eq!(seen.len(), 500, "every resource came ({period:?})");
            let wrong: Vec<_> = seen.iter().filter(|(_, n)| **n != periods).collect();
            assert!(
                wrong.is_empty(),
                "{periods} times each ({period:?}): {wrong:?}"
            );
        }
    }

    #[test]
    fn resync_spreads_the_resources_over_the_slots() {
        let (slots, length) = slotting(Duration::from_secs(1800));
        assert_eq!((slots, length * slots), (SLOTS, Duration::from_secs(1800)));
        let mut per_slot = vec![0u32; slots as usize];
        for i in 0..25_600 {
            per_slot[slot_of(&resource(i), slots) as usize] += 1;
        }
        let (least, most) = (per_slot.iter().min(), per_slot.iter().max());
        // 100 a slot on average.
        assert!(
            least >= Some(&60) && most <= Some(&140),
            "{least:?}..{most:?}"
        );
    }

    #[test]
    fn resync_slots_last_at_least_the_minimum() {
        assert_eq!(slotting(Duration::from_secs(2)), (20, MIN_SLOT));
        assert_eq!(slotting(Duration::from_millis(10)).0, 1);
    }
}
