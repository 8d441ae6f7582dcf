//! Live reads of namespaces' project annotations, coalesced.
//!
//! A resource whose project is chosen now reads its namespace from the API
//! server, not from the cache (see `apply::namespace_project`). A burst of
//! new resources would make as many reads; instead the reconciles that ask
//! while a read is in flight share the next one, whatever their namespaces:
//! one consistent LIST of just those namespaces (the label
//! `kubernetes.io/metadata.name`, which the API server sets on every
//! namespace, selects them by name). That read starts after they asked, so
//! it sees each namespace at least as new as their resources: one read per
//! round trip, whatever the burst.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use tokio::sync::oneshot;

use super::PROJECT_ANNOTATION;
use crate::{Error, Result};

/// The label the API server gives every namespace: its name.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Namespaces named in one LIST's label selector (the rest of a round's go
/// in further LISTs, sent at once).
const NAMES_PER_LIST: usize = 64;

/// What a read gives for one namespace: its project annotation, or why
/// the read failed.
type Answer = std::result::Result<Option<String>, String>;

/// Reads the given namespaces' annotations (every one of them, or fails).
type Fetch = Arc<
    dyn Fn(Vec<String>) -> BoxFuture<'static, std::result::Result<Annotations, String>>
        + Send
        + Sync,
>;
type Annotations = HashMap<String, Option<String>>;

/// The coalesced reads (one per [`super::Context`]).
pub(super) struct NamespaceReads {
    fetch: Fetch,
    round: Mutex<Round>,
}

/// Whether a read is in flight, and who waits for the next one.
#[derive(Default)]
struct Round {
    in_flight: bool,
    waiting: HashMap<String, Vec<oneshot::Sender<Answer>>>,
}

impl NamespaceReads {
    /// Reads through `client`.
    pub(super) fn new(client: kube::Client) -> Arc<Self> {
        let api: Api<Namespace> = Api::all(client);
        Self::with_fetch(Arc::new(move |names| Box::pin(read(api.clone(), names))))
    }

    fn with_fetch(fetch: Fetch) -> Arc<Self> {
        Arc::new(NamespaceReads {
            fetch,
            round: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        // The round only holds waiters; a poisoned one is still consistent.
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The project annotation of `ns` from a read that starts after this
    /// call (`None`: the namespace has none).
    pub(super) async fn project_annotation(self: &Arc<Self>, ns: &str) -> Result<Option<String>> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut round = self.lock();
            round.waiting.entry(ns.to_owned()).or_default().push(tx);
            !std::mem::replace(&mut round.in_flight, true)
        };
        if start {
            tokio::spawn(self.clone().read_rounds());
        }
        rx.await
            .map_err(|_| Error::NamespaceRead(format!("the read of namespace {ns} was dropped")))?
            .map_err(Error::NamespaceRead)
    }

    /// Reads, for the waiters of each round, until nobody waits.
    async fn read_rounds(self: Arc<Self>) {
        loop {
            let waiting = {
                let mut round = self.lock();
                if round.waiting.is_empty() {
                    round.in_flight = false;
                    return;
                }
                std::mem::take(&mut round.waiting)
            };
            let names: Vec<String> = waiting.keys().cloned().collect();
            let reads = names
                .chunks(NAMES_PER_LIST)
                .map(|chunk| (self.fetch)(chunk.to_vec()));
            let mut found = Annotations::new();
            let mut failed = None;
            for result in futures::future::join_all(reads).await {
                match result {
                    Ok(part) => found.extend(part),
                    Err(e) => failed = Some(e),
                }
            }
            for (ns, waiters) in waiting {
                let answer = match (found.get(&ns), &failed) {
                    (Some(annotation), _) => Ok(annotation.clone()),
                    (None, Some(e)) => Err(e.clone()),
                    (None, None) => Err(format!("namespace {ns} was not read")),
                };
                for waiter in waiters {
                    // A waiter whose reconcile was dropped no longer listens.
                    let _ = waiter.send(answer.clone());
                }
            }
        }
    }
}

/// The project annotation of a namespace's metadata.
pub(super) fn project_annotation_of(meta: &PartialObjectMeta<Namespace>) -> Option<String> {
    meta.annotations().get(PROJECT_ANNOTATION).cloned()
}

/// The annotations of `names`: one consistent LIST selecting them by
/// name, then a GET of any the LIST did not return (a namespace without
/// the name label, or one that is gone: that GET fails).
async fn read(api: Api<Namespace>, names: Vec<String>) -> std::result::Result<Annotations, String> {
    let selector = format!("{NAME_LABEL} in ({})", names.join(","));
    let listed = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("cannot list namespaces {names:?} (their project annotation): {e}"))?;
    let mut found: Annotations = listed
        .items
        .iter()
        .map(|meta| (meta.name_any(), project_annotation_of(meta)))
        .collect();
    for name in names {
        if let std::collections::hash_map::Entry::Vacant(missing) = found.entry(name) {
            let name = missing.key();
            let meta = api.get_metadata(name).await.map_err(|e| {
                format!("cannot read namespace {name} (its project annotation): {e}")
            })?;
            missing.insert(project_annotation_of(&meta));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// A fetch that answers `NS-N` for each namespace of its N-th read
    /// (from 1), each read held until the test releases a permit; it
    /// records the names each read asked for.
    struct Gated {
        reads: Arc<NamespaceReads>,
        gate: Arc<Semaphore>,
        asked: Arc<Mutex<Vec<Vec<String>>>>,
    }

    fn gated() -> Gated {
        let gate = Arc::new(Semaphore::new(0));
        let asked: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let count = Arc::new(AtomicUsize::new(0));
        let (g, a) = (gate.clone(), asked.clone());
        let fetch: Fetch = Arc::new(move |mut names: Vec<String>| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            names.sort();
            a.lock().map(|mut a| a.push(names.clone())).ok();
            let g = g.clone();
            Box::pin(async move {
                let permit = g.acquire().await.map_err(|e| e.to_string())?;
                permit.forget();
                Ok(names
                    .into_iter()
                    .map(|ns| (ns.clone(), Some(format!("{ns}-{n}"))))
                    .collect())
            })
        });
        Gated {
            reads: NamespaceReads::with_fetch(fetch),
            gate,
            asked,
        }
    }

    impl Gated {
        fn ask(&self, ns: &str) -> tokio::task::JoinHandle<Result<Option<String>>> {
            let (reads, ns) = (self.reads.clone(), ns.to_owned());
            tokio::spawn(async move { reads.project_annotation(&ns).await })
        }

        fn asked(&self) -> Vec<Vec<String>> {
            self.asked.lock().map(|a| a.clone()).unwrap_or_default()
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    async fn answer(task: tokio::task::JoinHandle<Result<Option<String>>>) -> Option<String> {
        task.await.ok().and_then(|r| r.ok()).flatten()
    }

    #[tokio::test]
    async fn askers_during_a_read_share_the_next_read_never_the_one_in_flight() {
        let g = gated();
        let first = g.ask("team-a");
        settle().await;
        assert_eq!(g.asked(), [vec!["team-a".to_owned()]]);
        // Asked while read 1 is in flight: its answer may predate them.
        let later: Vec<_> = ["team-a", "team-b", "team-a", "team-c"]
            .into_iter()
            .map(|ns| (ns, g.ask(ns)))
            .collect();
        settle().await;
        assert_eq!(g.asked().len(), 1, "one read in flight at a time");
        g.gate.add_permits(1);
        assert_eq!(answer(first).await.as_deref(), Some("team-a-1"));
        settle().await;
        assert_eq!(
            g.asked()[1],
            ["team-a", "team-b", "team-c"],
            "the later askers share one read"
        );
        g.gate.add_permits(1);
        for (ns, task) in later {
            assert_eq!(answer(task).await, Some(format!("{ns}-2")));
        }
        let round = g.reads.lock();
        assert!(round.waiting.is_empty() && !round.in_flight);
    }

    #[tokio::test]
    async fn a_round_of_many_namespaces_is_read_in_lists_of_at_most_64() {
        let g = gated();
        let blocker = g.ask("first");
        settle().await;
        let names: Vec<String> = (0..150).map(|i| format!("ns-{i:03}")).collect();
        let tasks: Vec<_> = names.iter().map(|ns| g.ask(ns)).collect();
        settle().await;
        g.gate.add_permits(1 + 3);
        assert!(answer(blocker).await.is_some());
        for (ns, task) in names.iter().zip(tasks) {
            let got = answer(task).await.unwrap_or_default();
            assert!(got.starts_with(&format!("{ns}-")), "{ns}: {got}");
        }
        let asked = g.asked();
        let sizes: Vec<usize> = asked[1..].iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 150);
        assert!(sizes.iter().all(|n| *n <= NAMES_PER_LIST), "{sizes:?}");
        assert_eq!(sizes.len(), 3, "{sizes:?}");
    }

    #[tokio::test]
    async fn a_failed_or_incomplete_read_fails_its_askers_with_the_reason() {
        let fetch: Fetch = Arc::new(|names: Vec<String>| {
            Box::pin(async move {
                if names.iter().any(|n| n == "forbidden") {
                    return Err("cannot list namespaces: forbidden".to_owned());
                }
                Ok(names
                    .into_iter()
                    .filter(|n| n != "gone")
                    .map(|n| (n.clone(), Some(format!("{n}-project"))))
                    .collect())
            })
        });
        let reads = NamespaceReads::with_fetch(fetch);
        let (a, gone) = tokio::join!(
            reads.project_annotation("team-a"),
            reads.project_annotation("gone")
        );
        assert_eq!(a.ok().flatten().as_deref(), Some("team-a-project"));
        let gone = gone.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(gone.contains("namespace gone"), "{gone}");
        let refused = reads.project_annotation("forbidden").await;
        let refused = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("forbidden"), "{refused}");
    }
}
