//! The resources of a chaos run and the API calls that create, delete and
//! wait for them, each retried through API server outages.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use bucketmap::crd::Gcs;

use super::check::Planned;

/// The share of each kind of resource (the rest: `Delete`, left empty).
const ORPHAN: f64 = 0.15;
const ORPHAN_NON_EMPTY: f64 = 0.05;
const BLOCKED: f64 = 0.10;
const FORCED: f64 = 0.15;
/// One resource in `ABANDON_EVERY` (the eleventh, the thirty-first, ...)
/// is `Abandon` and left empty, whatever the draws: every run of eleven
/// resources or more has some.
const ABANDON_EVERY: usize = 20;

/// `n` resources round-robin over `namespaces` and `projects`, each drawn
/// Orphan / Orphan and non-empty / non-empty without forceDestroy /
/// non-empty with forceDestroy / plain, except the Abandon ones.
pub fn plan(
    rng: &mut fastrand::Rng,
    n: usize,
    namespaces: &[String],
    projects: &[String],
) -> Vec<Planned> {
    (0..n)
        .map(|i| {
            let draw = rng.f64();
            let abandon = i % ABANDON_EVERY == 10;
            let orphan = draw < ORPHAN + ORPHAN_NON_EMPTY && !abandon;
            let non_empty =
                (ORPHAN..ORPHAN + ORPHAN_NON_EMPTY + BLOCKED + FORCED).contains(&draw) && !abandon;
            let force_destroy = draw >= ORPHAN + ORPHAN_NON_EMPTY + BLOCKED && non_empty;
            Planned {
                namespace: namespaces[i % namespaces.len()].clone(),
                name: format!("chaos-{i:04}"),
                logical: format!("chaos-{i:04}"),
                project: projects[i % projects.len()].clone(),
                orphan,
                abandon,
                non_empty,
                force_destroy,
            }
        })
        .collect()
}

/// The `Gcs` object of `p`.
fn object(p: &Planned) -> anyhow::Result<Gcs> {
    let policy = match (p.orphan, p.abandon) {
        (true, _) => "Orphan",
        (false, true) => "Abandon",
        (false, false) => "Delete",
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.bucketmap.dev/v1alpha1",
        "kind": "Gcs",
        "metadata": {"name": p.name, "namespace": p.namespace},
        "spec": {
            "bucketName": p.logical,
            "projectID": p.project,
            "deletionPolicy": policy,
            "forceDestroy": p.force_destroy,
        },
    }))
    .with_context(|| format!("cannot build the Gcs {}", p.key()))
}

/// Runs `call` until it succeeds (API server restarts in between), for at
/// most a minute.
async fn retried<T>(
    what: &str,
    mut call: impl AsyncFnMut() -> Result<T, kube::Error>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, what, "retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot {what}")),
        }
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Creates every planned resource, 16 at a time (one already there counts).
pub async fn create_all(client: &kube::Client, plan: &[Planned]) -> anyhow::Result<()> {
    futures::stream::iter(plan)
        .map(|p| async move {
            let api: Api<Gcs> = Api::namespaced(client.clone(), &p.namespace);
            let obj = object(p)?;
            retried(&format!("create {}", p.key()), async || {
                match api.create(&PostParams::default(), &obj).await {
                    Err(e) if is_status(&e, 409) => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .await
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes every planned resource, 16 at a time (one already gone counts).
pub async fn delete_all(client: &kube::Client, plan: &[Planned]) -> anyhow::Result<()> {
    futures::stream::iter(plan)
        .map(|p| async move {
            let api: Api<Gcs> = Api::namespaced(client.clone(), &p.namespace);
            retried(&format!("delete {}", p.key()), async || {
                match api.delete(&p.name, &DeleteParams::default()).await {
                    Err(e) if is_status(&e, 404) => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .await
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Touches an annotation of `p` so that the operator reconciles it now
/// (a person emptying a bucket would wait for the backoff instead).
pub async fn nudge(client: &kube::Client, p: &Planned) -> anyhow::Result<()> {
    let api: Api<Gcs> = Api::namespaced(client.clone(), &p.namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {
        "chaos.bucketmap.dev/nudge": format!("{:?}", std::time::SystemTime::now()),
    }}});
    retried(&format!("annotate {}", p.key()), async || {
        match api
            .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(e) if is_status(&e, 404) => Ok(()),
            other => other.map(|_| ()),
        }
    })
    .await
}

/// Every `Gcs` of `namespaces` as the checks see it, by `namespace/name`;
/// `None` while the API server does not answer.
pub async fn list(
    client: &kube::Client,
    namespaces: &[String],
) -> Option<std::collections::BTreeMap<String, Gcs>> {
    let mut out = std::collections::BTreeMap::new();
    for ns in namespaces {
        let api: Api<Gcs> = Api::namespaced(client.clone(), ns);
        let list = api.list(&ListParams::default()).await.ok()?;
        for g in list {
            out.insert(format!("{ns}/{}", kube::ResourceExt::name_any(&g)), g);
        }
    }
    Some(out)
}

/// Polls (every 500 ms, through outages) until `done` holds for the
/// resources of `namespaces`; fails after `timeout` with `progress`.
pub async fn wait_for(
    client: &kube::Client,
    namespaces: &[String],
    timeout: Duration,
    what: &str,
    done: impl Fn(&std::collections::BTreeMap<String, Gcs>) -> (bool, String),
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut progress = String::from("the API server never answered");
    loop {
        if let Some(all) = list(client, namespaces).await {
            let (ok, now) = done(&all);
            if ok {
                return Ok(());
            }
            progress = now;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what} not reached within {timeout:?}: {progress}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
