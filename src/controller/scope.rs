//! Which namespaces the operator watches: all (one cluster-wide watch per
//! kind), or a list (`--watch-namespaces`): one watch per namespace and
//! kind, merged into one stream that a single reflector store can take,
//! so that a namespaced install needs no cluster-wide list or watch.

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use serde::de::DeserializeOwned;

/// The watch events of one kind, over every watched namespace.
pub(super) type Events<K> =
    std::pin::Pin<Box<dyn Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static>>;

/// Watches `K` with `config` in `namespaces` (`None`: cluster-wide), each
/// watch with the default backoff. `api` builds the API of one namespace
/// (`None`: all).
pub(super) fn watch_in<K>(
    namespaces: Option<&[String]>,
    config: &watcher::Config,
    api: impl Fn(Option<&str>) -> Api<K>,
) -> Events<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match namespaces {
        None => watch(api(None), config.clone()).default_backoff().boxed(),
        Some([one]) => watch(api(Some(one)), config.clone())
            .default_backoff()
            .boxed(),
        Some(many) => {
            let watches = many.iter().enumerate().map(|(i, ns)| {
                watch(api(Some(ns)), config.clone())
                    .default_backoff()
                    .map(move |event| (i, event))
                    .boxed()
            });
            merge(futures::stream::select_all(watches), many.len()).boxed()
        }
    }
}

/// Watches of the namespaces themselves: the metadata of each named one
/// (a field selector per name), or of all.
pub(super) fn watch_namespaces<K>(
    namespaces: Option<&[String]>,
    config: &watcher::Config,
    api: Api<K>,
) -> Events<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let names = match namespaces {
        None => return watch(api, config.clone()).default_backoff().boxed(),
        Some([one]) => {
            let by_name = config.clone().fields(&format!("metadata.name={one}"));
            return watch(api, by_name).default_backoff().boxed();
        }
        Some(names) => names,
    };
    let watches = names.iter().enumerate().map(|(i, ns)| {
        let by_name = config.clone().fields(&format!("metadata.name={ns}"));
        watch(api.clone(), by_name)
            .default_backoff()
            .map(move |event| (i, event))
            .boxed()
    });
    merge(futures::stream::select_all(watches), names.len()).boxed()
}

/// What the merge has seen so far.
struct Merge {
    /// Which watches finished their first list.
    listed: Vec<bool>,
    /// Whether every watch has: the store holds them all.
    ready: bool,
    /// Whether the merged `Init` was sent.
    started: bool,
}

/// Merges the events of `count` watches into the events of one: one
/// `Init`, every object of every first list as `InitApply`, one `InitDone`
/// once all first lists are complete; after that, objects as `Apply` and
/// `Delete`. A later re-list of one watch re-applies its objects but
/// cannot prune the store (the store's swap would drop the other
/// namespaces): an object deleted while that watch was down stays cached
/// until the operator restarts. Its reconcile finds it gone.
fn merge<K: Send + 'static>(
    events: impl Stream<Item = (usize, Result<Event<K>, watcher::Error>)> + Send + 'static,
    count: usize,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static {
    let state = Merge {
        listed: vec![false; count],
        ready: false,
        started: false,
    };
    events
        .scan(state, |state, (i, event)| {
            let out = match event {
                Ok(event) => state.next(i, event).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            std::future::ready(Some(futures::stream::iter(out)))
        })
        .flatten()
}

impl Merge {
    /// The merged events for `event` of watch `i`.
    fn next<K>(&mut self, i: usize, event: Event<K>) -> Vec<Event<K>> {
        let mut out = Vec::with_capacity(2);
        if !self.started {
            self.started = true;
            out.push(Event::Init);
        }
        match event {
            Event::Init => {}
            Event::InitApply(obj) | Event::Apply(obj) if !self.ready => {
                out.push(Event::InitApply(obj));
            }
            Event::InitApply(obj) | Event::Apply(obj) => out.push(Event::Apply(obj)),
            Event::Delete(obj) => out.push(Event::Delete(obj)),
            Event::InitDone => {
                if let Some(listed) = self.listed.get_mut(i) {
                    *listed = true;
                }
                if !self.ready && self.listed.iter().all(|l| *l) {
                    self.ready = true;
                    out.push(Event::InitDone);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(events: &[Event<&'static str>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Init => "init".to_owned(),
                Event::InitApply(o) => format!("init-apply {o}"),
                Event::InitDone => "init-done".to_owned(),
                Event::Apply(o) => format!("apply {o}"),
                Event::Delete(o) => format!("delete {o}"),
            })
            .collect()
    }

    #[test]
    fn the_store_is_ready_once_every_namespace_was_listed() {
        let mut merge = Merge {
            listed: vec![false; 2],
            ready: false,
            started: false,
        };
        let mut seen = Vec::new();
        for (i, event) in [
            (0, Event::Init),
            (0, Event::InitApply("a1")),
            (0, Event::InitDone),
            (0, Event::Apply("a2")),
            (1, Event::Init),
            (1, Event::InitApply("b1")),
            (1, Event::InitDone),
            (0, Event::Apply("a3")),
            (1, Event::Delete("b1")),
            // A re-list of one namespace later: applied, no second swap.
            (0, Event::Init),
            (0, Event::InitApply("a1")),
            (0, Event::InitDone),
        ] {
            seen.extend(merge.next(i, event));
        }
        assert_eq!(
            names(&seen),
            [
                "init",
                "init-apply a1",
                "init-apply a2",
                "init-apply b1",
                "init-done",
                "apply a3",
                "delete b1",
                "apply a1",
            ]
        );
    }
}
