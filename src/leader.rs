//! Leader election on a `coordination.k8s.io` Lease, so that the operator
//! can run replicated while only one replica reconciles.
//!
//! Uses `kube-lease-manager` (server-side apply on the Lease, tolerant of
//! clock skew). A replica that loses the lease stops reconciling and exits
//! with an error, as controller-runtime managers do: its pod restarts and
//! queues up as a standby, and no two replicas ever reconcile at once.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use kube_lease_manager::LeaseManagerBuilder;
use tracing::info;

/// Where the lease lives and how long it lasts.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// Unique per replica (the pod name in a cluster).
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long before expiry the holder renews.
    pub renew_margin: Duration,
}

/// Runs `work` while this replica holds the lease.
///
/// Waits (as a standby) until the lease is acquired, then starts
/// `work(stop)`. Returns `Ok` when `shutdown` resolves (stopping the work and
/// releasing the lease for a quick takeover), or an error once the lease is
/// lost (after stopping the work).
pub async fn run_while_leader<W, F>(
    client: kube::Client,
    election: &LeaderElection,
    shutdown: impl Future<Output = ()>,
    on_standby: impl FnOnce(),
    work: W,
) -> anyhow::Result<()>
where
    W: FnOnce(tokio::sync::oneshot::Receiver<()>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let lease = format!("{}/{}", election.namespace, election.lease_name);
    let manager = LeaseManagerBuilder::new(client, &election.lease_name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.lease_duration.as_secs().max(2))
        .with_grace(election.renew_margin.as_secs().max(1))
        .build()
        .await
        .with_context(|| format!("cannot use lease {lease}"))?;
    let (mut leading, manager_task) = manager.watch().await;
    tokio::pin!(shutdown);

    on_standby();
    info!(%lease, identity = %election.identity, "waiting to become the leader");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = &mut shutdown => {
                drop(leading);
                let _ = manager_task.await;
                return Ok(());
            }
            changed = leading.changed() => changed.with_context(|| format!("lease manager of {lease} stopped"))?,
        }
    }
    info!(%lease, identity = %election.identity, "became the leader");

    let (stop, stopped) = tokio::sync::oneshot::channel();
    let running = tokio::spawn(work(stopped));
    let lost = loop {
        tokio::select! {
            _ = &mut shutdown => break false,
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    break true;
                }
            }
        }
    };
    let _ = stop.send(());
    running.await.context("the leader's work panicked")?;
    // Dropping the channel releases the lease for the next replica.
    drop(leading);
    let _ = manager_task.await;
    if lost {
        anyhow::bail!("lost the leader lease {lease}; exiting so that a standby takes over");
    }
    Ok(())
}
