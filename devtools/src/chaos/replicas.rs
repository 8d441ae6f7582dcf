//! Two `bucketmap operator --leader-elect` processes, supervised like the
//! pods of a Deployment: one that exits (e.g. after losing its Lease while
//! the API server is away) is started again a second later, and at random
//! points of the run's progress a replica is killed with SIGKILL and
//! started again: the Lease holder at every other kill (the first
//! included), a random one otherwise. Kills follow progress, not the
//! clock, so that each one lands while work is left whatever the speed of
//! the machine.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::process::Child;
use tokio::time::Instant;

use bucketmap_testkit::testenv;

use super::observe::Progress;

/// How to start one replica.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// This binary (its hidden `operator` command is `bucketmap operator`).
    pub exe: PathBuf,
    pub kubeconfig: PathBuf,
    pub gcs_endpoint: String,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Where each replica's stderr is appended (`replica-0.log`, ...).
    pub log_dir: PathBuf,
    /// The replicas' `--tenancy-policy`.
    pub tenancy_policy: PathBuf,
}

/// When to kill: kill `i` once the run's progress reaches `at[i]`.
#[derive(Debug, Clone)]
pub struct KillPlan {
    pub kills: u32,
    /// Progress marks, ascending, one per kill.
    pub at: Vec<usize>,
    pub seed: u64,
}

impl KillPlan {
    /// `kills` marks drawn in `range` of the progress (sorted).
    pub fn new(kills: u32, range: std::ops::RangeInclusive<usize>, seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut at: Vec<usize> = (0..kills).map(|_| rng.usize(range.clone())).collect();
        at.sort_unstable();
        KillPlan { kills, at, seed }
    }

    /// Kills planned to hit the Lease holder: every other one, the first
    /// included (such a kill waits until a running replica holds the Lease).
    pub fn leader_kills(&self) -> u32 {
        self.kills.div_ceil(2)
    }

    fn targets_leader(kill: u32) -> bool {
        kill.is_multiple_of(2)
    }
}

/// What happened to the replicas.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplicaCounts {
    /// SIGKILLs sent.
    pub kills: u32,
    /// Of which to the Lease holder.
    pub leader_kills: u32,
    /// SIGKILLs that failed (the replica had exited already, or the
    /// signal could not be sent): not counted in `kills`.
    pub failed_kills: u32,
    /// Exits nobody caused (lost Lease, API server away), each restarted.
    pub exits: u32,
    /// Processes started, first ones included.
    pub starts: u32,
}

/// The two supervised replicas; [`Replicas::stop`] kills both.
pub struct Replicas {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Mutex<ReplicaCounts>>,
}

const LEASE_NAME: &str = "bucketmap-operator";
/// Replicas run; the operator ships with two.
const REPLICAS: usize = 2;

impl Replicas {
    /// Starts both replicas and the supervisor that kills per `plan`.
    pub fn start(
        spec: ReplicaSpec,
        plan: KillPlan,
        progress: Progress,
        client: kube::Client,
    ) -> Self {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let counts = Arc::new(Mutex::new(ReplicaCounts::default()));
        let supervisor = Supervisor {
            spec,
            client,
            counts: counts.clone(),
            rng: fastrand::Rng::with_seed(plan.seed),
            children: std::array::from_fn(|_| None),
            respawn_at: [Instant::now(); REPLICAS],
            progress,
        };
        let task = tokio::spawn(supervisor.run(plan, stopped));
        Replicas { stop, task, counts }
    }

    /// Kills both replicas and ends the supervision; returns the counts.
    pub async fn stop(self) -> ReplicaCounts {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Supervisor {
    spec: ReplicaSpec,
    client: kube::Client,
    counts: Arc<Mutex<ReplicaCounts>>,
    rng: fastrand::Rng,
    children: [Option<Child>; REPLICAS],
    respawn_at: [Instant; REPLICAS],
    progress: Progress,
}

impl Supervisor {
    async fn run(mut self, plan: KillPlan, mut stopped: tokio::sync::watch::Receiver<bool>) {
        let mut kills = 0;
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            self.restart_exited();
            let due = plan.at.get(kills as usize);
            if due.is_some_and(|&at| self.progress.get() >= at) {
                // A leader kill waits (a tick at a time) for a running
                // replica to hold the Lease; nothing converges meanwhile.
                let target_leader = KillPlan::targets_leader(kills);
                let Some(victim) = self.victim(target_leader).await else {
                    continue;
                };
                // A leader kill's victim held the Lease when victim() looked:
                // asking the API server again could meet it restarting (this
                // run restarts it too) and miscount the kill.
                let leader = target_leader || self.slot_holds_lease(victim).await;
                kills += u32::from(self.kill(victim, leader).await);
            }
        }
        for (slot, child) in self.children.iter_mut().enumerate() {
            if let Some(child) = child
                && let Err(e) = child.kill().await
            {
                tracing::warn!(replica = slot, error = %e, "cannot stop an operator replica");
            }
        }
    }

    /// The replica to kill: the one holding the Lease when `leader` (none
    /// while no running replica holds it), else a random one.
    async fn victim(&mut self, leader: bool) -> Option<usize> {
        if !leader {
            return Some(self.rng.usize(..REPLICAS));
        }
        for slot in 0..REPLICAS {
            if self.slot_holds_lease(slot).await {
                return Some(slot);
            }
        }
        None
    }

    fn count(&self, change: impl FnOnce(&mut ReplicaCounts)) {
        change(&mut self.counts.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Starts every replica that is not running (a second after an exit).
    fn restart_exited(&mut self) {
        for slot in 0..REPLICAS {
            if let Some(child) = &mut self.children[slot]
                && let Ok(Some(status)) = child.try_wait()
            {
                tracing::info!(replica = slot, %status, "operator replica exited; restarting it");
                self.children[slot] = None;
                self.respawn_at[slot] = Instant::now() + Duration::from_secs(1);
                self.count(|c| c.exits += 1);
            }
            if self.children[slot].is_none() && Instant::now() >= self.respawn_at[slot] {
                match spawn(&self.spec, slot) {
                    Ok(child) => {
                        self.children[slot] = Some(child);
                        self.count(|c| c.starts += 1);
                    }
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot start a replica"),
                }
            }
        }
    }

    /// Whether replica `slot` runs and holds the Lease.
    async fn slot_holds_lease(&self, slot: usize) -> bool {
        match self.children[slot].as_ref().and_then(Child::id) {
            Some(pid) => self.holds_lease(pid).await,
            None => false,
        }
    }

    /// SIGKILLs replica `slot` (counted as a kill of the Lease holder when
    /// `leader`) and starts it again; false when it was not running
    /// (nothing killed).
    async fn kill(&mut self, slot: usize, leader: bool) -> bool {
        let Some(mut child) = self.children[slot].take() else {
            return false;
        };
        // tokio's kill is SIGKILL on Unix: no shutdown, no Lease release.
        // It fails when the process had exited already: that kill did not
        // happen, and the run must not count it.
        if let Err(e) = child.kill().await {
            tracing::warn!(replica = slot, error = %e, "a SIGKILL of an operator replica failed");
            self.count(|c| c.failed_kills += 1);
            self.respawn_at[slot] = Instant::now();
            self.restart_exited();
            return false;
        }
        tracing::info!(
            replica = slot,
            leader,
            "killed an operator replica (SIGKILL)"
        );
        self.count(|c| {
            c.kills += 1;
            c.leader_kills += u32::from(leader);
        });
        self.respawn_at[slot] = Instant::now();
        self.restart_exited();
        true
    }

    /// Whether the process `pid` holds the Lease (default identities end
    /// with `-<pid>`).
    async fn holds_lease(&self, pid: u32) -> bool {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.spec.lease_namespace);
        let holder = api.get_opt(LEASE_NAME).await.ok().flatten();
        holder
            .and_then(|l| l.spec?.holder_identity)
            .is_some_and(|h| h.ends_with(&format!("-{pid}")))
    }
}

/// Starts replica `slot` as its own process.
fn spawn(spec: &ReplicaSpec, slot: usize) -> anyhow::Result<Child> {
    let port = bucketmap_testkit::free_port()?;
    let log = spec.log_dir.join(format!("replica-{slot}.log"));
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let mut command = tokio::process::Command::new(&spec.exe);
    command
        .args(["operator", "--gcs-anonymous"])
        .args(["--gcs-endpoint", &spec.gcs_endpoint])
        .args(["--bucket-ops-interval", "0s"])
        .args(["--map-reader-role", super::followers::MAP_READER_ROLE])
        .arg("--tenancy-policy")
        .arg(&spec.tenancy_policy)
        .args(["--leader-elect", "--leader-election-namespace"])
        .arg(&spec.lease_namespace)
        .args(["--lease-duration", "4s", "--lease-renew-margin", "2s"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &spec.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true);
    testenv::die_with_parent(&mut command);
    command
        .spawn()
        .with_context(|| format!("cannot start operator replica {slot}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_marks_are_sorted_inside_the_range_and_repeat_with_the_seed() {
        for seed in 0..200 {
            let plan = KillPlan::new(5, 10..=90, seed);
            assert_eq!(plan.at.len(), 5);
            assert!(plan.at.is_sorted(), "{:?}", plan.at);
            assert!(
                plan.at.iter().all(|m| (10..=90).contains(m)),
                "{:?}",
                plan.at
            );
            assert_eq!(plan.at, KillPlan::new(5, 10..=90, seed).at);
        }
    }
}
