//! `cargo dev chaos`: the operator under faults, with nothing lost.
//!
//! On a real API server (`testenv`) and the in-repo mock GCS, several
//! hundred `Gcs` resources over several namespaces and projects (some
//! `deletionPolicy: Orphan` or `Abandon`, some buckets given an object,
//! with and without `forceDestroy`) are created, then deleted, while:
//! - the operator runs as two `--leader-elect` replicas, separate
//!   processes, and at random points of the progress (resources Ready,
//!   then gone) one is SIGKILLed (the Lease holder every other time) and
//!   started again (`replicas`);
//! - the mock GCS answers random UNAVAILABLE, RESOURCE_EXHAUSTED and
//!   DEADLINE_EXCEEDED, loses answers after committing, and adds latency
//!   (seeded `RandomFaults`); one fault of each kind is scripted on the
//!   first bucket creates, so that every kind happens in every run;
//! - the kube-apiserver is restarted once (etcd kept) while the resources
//!   are converging;
//! - in each namespace a sidecar's live map follows the namespace's bucket
//!   map with a ServiceAccount token and the operator's grant only
//!   (`followers`): at all Ready and at the end it must hold exactly that
//!   map, confirmed within its bound.
//!
//! Foreign buckets sit in the same projects. Three checkpoints
//! (`check`): all Ready, where, faults paused, an operator that saw
//! nothing of the run reconciles every resource and must leave each
//! status as it is (`fresh`); deletes done (the non-empty buckets without
//! forceDestroy block their resource with `DeletionBlocked`); and, after
//! those buckets are emptied, the end, where every bucket left must have
//! an owner the run expects. Then whether the planned kills,
//! leader kills and faults happened (`disruptions`): a run spared them
//! proves nothing. Every violation is printed; any fails the run, and
//! what was verified is printed too. The seed is printed always: `--seed` repeats the plan,
//! the kill moments and the fault draws (the interleaving of concurrent
//! calls still varies).

mod check;
mod disruptions;
mod followers;
mod fresh;
mod observe;
mod plan;
mod replicas;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::CustomResourceExt as _;

use bucketmap::crd::Gcs;
use bucketmap_testkit::mock_gcs::{Fault, FaultCounts, MockGcs, MockHandle, RandomFaults, proto};
use bucketmap_testkit::testenv::{self, TestEnv};

use check::{Planned, Recorded, Tally, Violation};
use observe::{ReadyWatch, Scope};
use replicas::{KillPlan, ReplicaCounts, ReplicaSpec, Replicas};

/// Options of `cargo dev chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// `Gcs` resources created and deleted.
    #[arg(long, default_value_t = 300)]
    pub resources: usize,
    /// Namespaces they are spread over.
    #[arg(long, default_value_t = 6)]
    pub namespaces: usize,
    /// GCP projects they are spread over.
    #[arg(long, default_value_t = 3)]
    pub projects: usize,
    /// SIGKILLs of an operator replica, each at a random point of the
    /// run's progress.
    #[arg(long, default_value_t = 10)]
    pub kills: u32,
    /// Probability of each injected GCS error kind per call (UNAVAILABLE,
    /// RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, lost answer after a change).
    #[arg(long, default_value_t = 0.03)]
    pub fault_probability: f64,
    /// Longest random latency added to a GCS call.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub max_latency: Duration,
    /// Seed of every random choice (default: a random one, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Give up on a checkpoint after this long.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Buckets not owned by any resource, put in the mock first.
const FOREIGN_BUCKETS: usize = 6;
const MAP_NAME: &str = "bucketmap";

/// Runs the chaos run; stops everything on SIGTERM/ctrl-c.
pub async fn chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!("# bucketmap operator chaos run\nseed: {seed} (repeat with --seed {seed})");
    let result = tokio::select! {
        result = run(&args, seed) => result,
        signal = bucketmap::termination_signal() => {
            Err(anyhow::anyhow!("{signal}: chaos run interrupted; stopped everything it started"))
        }
    };
    result.map_err(|e| e.context(format!("chaos run with --seed {seed} failed")))
}

/// What the summary prints.
#[derive(Default)]
struct Figures {
    replicas: ReplicaCounts,
    faults: FaultCounts,
    create_calls: usize,
    delete_calls: usize,
    to_ready: Duration,
    apiserver_restart: Duration,
    converged: Duration,
    tally: Tally,
    foreign_kept: usize,
    left: check::Left,
}

/// The running world of one chaos run.
struct Run {
    env: TestEnv,
    client: kube::Client,
    mock: MockGcs,
    gcs: MockHandle,
    namespaces: Vec<String>,
    lease_namespace: String,
    watch: ReadyWatch,
    /// A sidecar's live map in each namespace.
    followers: followers::Followers,
}

impl Run {
    fn gcs(&self) -> MockHandle {
        self.gcs.clone()
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            client: &self.client,
            namespaces: &self.namespaces,
            map_name: MAP_NAME,
            gcs: &self.gcs,
        }
    }
}

async fn run(args: &ChaosArgs, seed: u64) -> anyhow::Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    eprintln!("starting a local control plane and the mock GCS...");
    let mut world = start(args).await?;
    let projects = project_names(args);
    let foreign = foreign_buckets(&world.gcs(), &projects, &mut rng)?;
    let plan = plan::plan(&mut rng, args.resources, &world.namespaces, &projects);
    print_plan(args, &plan);
    let (replicas, log_dir, kill_plan) = start_replicas(args, &world, &plan, &mut rng).await?;
    for fault in scripted_faults() {
        world.gcs().add_fault(fault);
    }
    world
        .gcs()
        .set_random_faults(Some(random_faults(args, rng.u64(..))));
    let mut figures = Figures::default();
    let policy = log_dir.join(TENANCY_POLICY);
    let during = Setup { policy: &policy };
    let outcome = phases(
        args,
        &mut world,
        &plan,
        &foreign,
        &mut rng,
        &mut figures,
        during,
    )
    .await;
    figures.faults = world.gcs().random_fault_counts();
    world.gcs().set_random_faults(None);
    figures.replicas = replicas.stop().await;
    let calls = world.gcs().calls();
    figures.create_calls = calls.iter().filter(|c| c.method == "CreateBucket").count();
    figures.delete_calls = calls.iter().filter(|c| c.method == "DeleteBucket").count();
    print_figures(args, &figures);
    world.mock.shutdown().await;
    drop(world.env);
    let mut violations = outcome?;
    let (missed, verified) = disruptions::check(
        &kills(&kill_plan, &figures.replicas),
        &fault_kinds(&figures.faults, &calls),
    );
    violations.extend(at("disruptions", missed));
    print_verified(&violations, &verified);
    if !violations.is_empty() {
        println!("\n## FAILED: {} violation(s)", violations.len());
        for v in &violations {
            println!("- {v}");
        }
        anyhow::bail!("{} promise(s) broken (listed above)", violations.len());
    }
    println!("\nresult: PASS (every check held)");
    // The replica logs are kept only when the run fails.
    let _ = std::fs::remove_dir_all(&log_dir);
    Ok(())
}

/// The control plane, the CRD, the mock GCS, the namespaces and the watch.
async fn start(args: &ChaosArgs) -> anyhow::Result<Run> {
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    testenv::install_crd(&client, &Gcs::crd()).await?;
    let mock = MockGcs::start().await?;
    let mut namespaces = Vec::new();
    for _ in 0..args.namespaces.max(1) {
        namespaces.push(testenv::create_namespace(&client, "chaos").await?);
    }
    let lease_namespace = testenv::create_namespace(&client, "chaos-operator").await?;
    let watch = ReadyWatch::start(client.clone());
    let followers = followers::Followers::start(&env, &client, &namespaces, MAP_NAME).await?;
    Ok(Run {
        followers,
        gcs: mock.handle(),
        env,
        client,
        mock,
        namespaces,
        lease_namespace,
        watch,
    })
}

/// Puts buckets no resource owns in the projects (half of them holding an
/// object, one labelled as owned by a resource that does not exist);
/// returns them as they are.
fn foreign_buckets(
    gcs: &MockHandle,
    projects: &[String],
    rng: &mut fastrand::Rng,
) -> anyhow::Result<BTreeMap<String, check::SeenBucket>> {
    for i in 0..FOREIGN_BUCKETS {
        let id = format!("foreign-{i}-{:08x}", rng.u32(..));
        let mut bucket = proto::Bucket {
            bucket_id: id.clone(),
            ..proto::Bucket::default()
        };
        if i == 0 {
            bucket.labels.insert(
                bucketmap::naming::OWNER_LABEL.to_owned(),
                "00000000-0000-0000-0000-000000000000".to_owned(),
            );
        }
        gcs.insert_bucket(&projects[i % projects.len()], bucket)?;
        if i % 2 == 1 {
            gcs.put_object(&id, "foreign-data")?;
        }
    }
    let all = observe::buckets(gcs);
    Ok(all)
}

fn random_faults(args: &ChaosArgs, seed: u64) -> RandomFaults {
    let p = args.fault_probability;
    RandomFaults::new(seed)
        .unavailable(p)
        .resource_exhausted(p)
        .deadline_exceeded(p)
        .lost_response(p)
        .latency(Duration::ZERO..=args.max_latency)
}

/// One fault of each kind random mode injects, on the first bucket creates
/// (explicit faults are matched before random ones): each kind happens in
/// every run, whatever the draws, and a lost create answer is among them.
fn scripted_faults() -> Vec<Fault> {
    use tonic::Code;
    vec![
        Fault::new("CreateBucket", Code::Unavailable).times(1),
        Fault::new("CreateBucket", Code::ResourceExhausted).times(1),
        Fault::new("CreateBucket", Code::DeadlineExceeded).times(1),
        Fault::new("CreateBucket", Code::Unavailable)
            .after_write()
            .times(1),
    ]
}

/// The kills planned and done, for [`disruptions::check`].
fn kills(plan: &KillPlan, done: &ReplicaCounts) -> disruptions::Kills {
    disruptions::Kills {
        planned: plan.kills,
        planned_leader: plan.leader_kills(),
        done: done.kills,
        done_leader: done.leader_kills,
        failed: done.failed_kills,
    }
}

/// Each kind of fault: scripted by [`scripted_faults`], counted by random
/// mode, and answered in the call log (a lost answer is an UNAVAILABLE).
fn fault_kinds(
    random: &FaultCounts,
    calls: &[bucketmap_testkit::mock_gcs::Call],
) -> Vec<disruptions::FaultKind> {
    use tonic::Code;
    let scripted = scripted_faults();
    let kind = |code: Code, name: &'static str, random: u64| disruptions::FaultKind {
        code: name,
        scripted: scripted.iter().filter(|f| f.code == code).count() as u64,
        random,
        answered: calls.iter().filter(|c| c.code == code).count() as u64,
    };
    vec![
        kind(
            Code::Unavailable,
            "UNAVAILABLE",
            random.unavailable + random.lost_responses,
        ),
        kind(
            Code::ResourceExhausted,
            "RESOURCE_EXHAUSTED",
            random.resource_exhausted,
        ),
        kind(
            Code::DeadlineExceeded,
            "DEADLINE_EXCEEDED",
            random.deadline_exceeded,
        ),
    ]
}

/// The projects the resources are spread over.
fn project_names(args: &ChaosArgs) -> Vec<String> {
    (0..args.projects.max(1))
        .map(|i| format!("chaos-project-{i}"))
        .collect()
}

/// A tenancy policy that lets every namespace use the run's projects,
/// written for the replicas' `--tenancy-policy`.
fn write_tenancy_policy(
    args: &ChaosArgs,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let policy = bucketmap::tenancy::Policy {
        rules: vec![bucketmap::tenancy::Rule {
            name: Some("chaos".to_owned()),
            projects: project_names(args),
            // The run deletes non-empty buckets with forceDestroy.
            allow_force_destroy: true,
            ..Default::default()
        }],
    };
    let path = dir.join(TENANCY_POLICY);
    std::fs::write(&path, serde_yaml::to_string(&policy)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

async fn start_replicas(
    args: &ChaosArgs,
    world: &Run,
    plan: &[Planned],
    rng: &mut fastrand::Rng,
) -> anyhow::Result<(Replicas, std::path::PathBuf, KillPlan)> {
    let log_dir = std::env::temp_dir().join(format!("bucketmap-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", log_dir.display()))?;
    let spec = ReplicaSpec {
        exe: std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("cannot find this binary: {e}"))?,
        kubeconfig: world.env.kubeconfig_path().to_path_buf(),
        gcs_endpoint: world.mock.endpoint(),
        lease_namespace: world.lease_namespace.clone(),
        tenancy_policy: write_tenancy_policy(args, &log_dir)?,
        log_dir,
    };
    let plan = KillPlan::new(args.kills, kill_range(plan), rng.u64(..));
    println!(
        "operator replica logs (kept if the run fails): {}",
        spec.log_dir.display()
    );
    let log_dir = spec.log_dir.clone();
    let progress = world.watch.progress();
    let replicas = Replicas::start(spec, plan.clone(), progress, world.client.clone());
    Ok((replicas, log_dir, plan))
}

/// Where in the progress the kills fall: each resource counts once when
/// Ready and once when gone, and the blocked ones go only after the
/// deletes checkpoint. The kills fall between a tenth and nine tenths of
/// the progress reachable before that checkpoint, so that work is left
/// after each one.
fn kill_range(plan: &[Planned]) -> std::ops::RangeInclusive<usize> {
    let reachable = 2 * plan.len() - plan.iter().filter(|p| p.blocked()).count();
    (reachable / 10).max(1)..=(reachable * 9 / 10).max(1)
}

/// The file name of the replicas' tenancy policy, in the log directory.
const TENANCY_POLICY: &str = "tenancy-policy.yaml";

/// What the phases need of the replicas' setup.
struct Setup<'a> {
    /// The replicas' tenancy policy (for the fresh reconcile's operator).
    policy: &'a std::path::Path,
}

/// The three checkpoints; a checkpoint not reached in time is a violation
/// too (its check still runs on what is there). At the first, with faults
/// paused, a fresh operator's reconcile must leave every status as it is
/// (module `fresh`).
async fn phases(
    args: &ChaosArgs,
    w: &mut Run,
    plan: &[Planned],
    foreign: &BTreeMap<String, check::SeenBucket>,
    rng: &mut fastrand::Rng,
    figures: &mut Figures,
    during: Setup<'_>,
) -> anyhow::Result<Vec<Violation>> {
    let started = Instant::now();
    plan::create_all(&w.client, plan).await?;
    tokio::time::sleep(Duration::from_millis(rng.u64(0..3000))).await;
    let restart = Instant::now();
    w.env.restart_apiserver().await?;
    figures.apiserver_restart = restart.elapsed();
    let mut violations = wait_ready(args, w, plan).await;
    figures.to_ready = started.elapsed();
    fill_buckets(w, plan).await?;
    let ready = observe::snapshot(&w.scope(), &w.watch).await?;
    let foreign_ids: BTreeSet<String> = foreign.keys().cloned().collect();
    violations.extend(at(
        "all Ready",
        check::all_ready(plan, &ready, &foreign_ids),
    ));
    violations.extend(at(
        "live map at all Ready",
        w.followers.check(&w.client, MAP_NAME).await,
    ));
    if !violations.is_empty() {
        return Ok(violations);
    }
    w.gcs().set_random_faults(None);
    violations.extend(at("fresh reconcile", fresh::check(w, during.policy).await?));
    w.gcs()
        .set_random_faults(Some(random_faults(args, rng.u64(..))));
    let recorded: BTreeMap<String, Recorded> = ready
        .resources
        .iter()
        .map(|(k, r)| {
            let physical = r.physical.clone();
            (
                k.clone(),
                Recorded {
                    uid: r.uid.clone(),
                    physical,
                },
            )
        })
        .collect();
    violations.extend(deletes(args, w, plan, foreign, figures, &recorded, started).await?);
    Ok(violations)
}

/// The second and third checkpoints: deletes done, and the end.
async fn deletes(
    args: &ChaosArgs,
    w: &mut Run,
    plan: &[Planned],
    foreign: &BTreeMap<String, check::SeenBucket>,
    figures: &mut Figures,
    recorded: &BTreeMap<String, Recorded>,
    started: Instant,
) -> anyhow::Result<Vec<Violation>> {
    wait_watch_caught_up(&w.watch, recorded).await;
    plan::delete_all(&w.client, plan).await?;
    let mut violations = Vec::new();
    violations.extend(wait_blocked(args, w, plan).await);
    let blocked = observe::snapshot(&w.scope(), &w.watch).await?;
    violations.extend(at(
        "deletes done",
        check::after_deletes(plan, recorded, &blocked),
    ));
    unblock(w, plan, &blocked).await?;
    violations.extend(wait_gone(args, w, plan).await);
    figures.converged = started.elapsed();
    let end = observe::snapshot(&w.scope(), &w.watch).await?;
    let (at_end, tally) = check::at_end(plan, recorded, &end, foreign);
    figures.tally = tally;
    figures.left = check::left(plan, recorded, &end, foreign);
    figures.foreign_kept = foreign
        .iter()
        .filter(|(id, b)| end.buckets.get(*id) == Some(*b))
        .count();
    violations.extend(at("end", at_end));
    violations.extend(at(
        "live map at the end",
        w.followers.check(&w.client, MAP_NAME).await,
    ));
    Ok(violations)
}

/// What the run verified, besides the violations.
fn print_verified(violations: &[Violation], verified: &[String]) {
    println!("\n## disruptions verified");
    println!("- kube-apiserver restarted once (etcd kept) while the resources converged");
    if !violations.iter().any(|v| v.starts_with("[live map")) {
        println!(
            "- each namespace's sidecar live map (a follower with the operator's grant only) \
             held its map, confirmed within the bound, at all Ready and at the end"
        );
    }
    for line in verified {
        println!("- {line}");
    }
}

/// Violations labelled with their checkpoint.
fn at(checkpoint: &str, violations: Vec<Violation>) -> Vec<Violation> {
    violations
        .into_iter()
        .map(|v| format!("[{checkpoint}] {v}"))
        .collect()
}

/// Waits until every planned resource is Ready.
async fn wait_ready(args: &ChaosArgs, w: &Run, plan: &[Planned]) -> Vec<Violation> {
    let result = plan::wait_for(&w.client, &w.namespaces, args.timeout, "all Ready", |all| {
        let ready = plan
            .iter()
            .filter(|p| all.get(&p.key()).is_some_and(|g| g.is_ready()))
            .count();
        (
            ready == plan.len(),
            format!("{ready} of {} Ready", plan.len()),
        )
    })
    .await;
    result.err().map(|e| format!("{e:#}")).into_iter().collect()
}

/// Waits (a minute at most) until the Ready watch has seen every resource
/// Ready: after the API server restart it may still be backing off, and a
/// resource it first sees while being deleted would count as never Ready.
async fn wait_watch_caught_up(watch: &ReadyWatch, recorded: &BTreeMap<String, Recorded>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let seen = watch.transitions();
        if recorded.values().all(|r| seen.contains_key(&r.uid)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until only the blocked resources remain, each showing DeletionBlocked.
async fn wait_blocked(args: &ChaosArgs, w: &Run, plan: &[Planned]) -> Vec<Violation> {
    let result = plan::wait_for(
        &w.client,
        &w.namespaces,
        args.timeout,
        "deletes done",
        |all| {
            let pending = plan
                .iter()
                .filter(|p| match (p.blocked(), all.get(&p.key())) {
                    (true, Some(g)) => {
                        observe::seen(g).reason != bucketmap::conditions::reason::DELETION_BLOCKED
                    }
                    (true, None) => false,
                    (false, present) => present.is_some(),
                })
                .count();
            (
                pending == 0,
                format!("{pending} of {} not settled", plan.len()),
            )
        },
    )
    .await;
    result.err().map(|e| format!("{e:#}")).into_iter().collect()
}

/// Waits until no planned resource is left.
async fn wait_gone(args: &ChaosArgs, w: &Run, plan: &[Planned]) -> Vec<Violation> {
    let result = plan::wait_for(&w.client, &w.namespaces, args.timeout, "all gone", |all| {
        let left = plan.iter().filter(|p| all.contains_key(&p.key())).count();
        (left == 0, format!("{left} of {} still present", plan.len()))
    })
    .await;
    result.err().map(|e| format!("{e:#}")).into_iter().collect()
}

/// Puts an object in the bucket of every non-empty resource.
async fn fill_buckets(w: &Run, plan: &[Planned]) -> anyhow::Result<()> {
    let all = plan::list(&w.client, &w.namespaces)
        .await
        .ok_or_else(|| anyhow::anyhow!("cannot list the Gcs resources"))?;
    for p in plan.iter().filter(|p| p.non_empty) {
        let physical = all
            .get(&p.key())
            .and_then(|g| g.status.as_ref()?.bucket_full_name.clone());
        if let Some(physical) = physical {
            w.gcs.put_object(&physical, "chaos-object")?;
        }
    }
    Ok(())
}

/// Empties the buckets that block their resource's deletion and nudges
/// those resources: now they must go.
async fn unblock(w: &Run, plan: &[Planned], world: &check::World) -> anyhow::Result<()> {
    for p in plan.iter().filter(|p| p.blocked()) {
        if let Some(physical) = world
            .resources
            .get(&p.key())
            .and_then(|r| r.physical.clone())
        {
            w.gcs.clear_objects(&physical);
        }
        plan::nudge(&w.client, p).await?;
    }
    Ok(())
}

fn print_plan(args: &ChaosArgs, plan: &[Planned]) {
    let count = |f: &dyn Fn(&Planned) -> bool| plan.iter().filter(|p| f(p)).count();
    println!(
        "resources: {} over {} namespaces and {} projects; Orphan {} (of which non-empty {}), Abandon {}, non-empty with forceDestroy {}, non-empty without forceDestroy {}, plain {}; foreign buckets {FOREIGN_BUCKETS}",
        plan.len(),
        args.namespaces.max(1),
        args.projects.max(1),
        count(&|p| p.orphan),
        count(&|p| p.orphan && p.non_empty),
        count(&|p| p.abandon),
        count(&|p| p.non_empty && p.force_destroy && !p.orphan),
        count(&|p| p.blocked()),
        count(&|p| !p.keeps_bucket() && !p.non_empty),
    );
}

fn print_figures(args: &ChaosArgs, f: &Figures) {
    let r = &f.replicas;
    let q = &f.faults;
    println!(
        "
## figures"
    );
    println!(
        "- operator: 2 replicas (--leader-elect); SIGKILLs {} ({} of the Lease holder, {} failed); other exits (restarted) {}; processes started {}",
        r.kills, r.leader_kills, r.failed_kills, r.exits, r.starts
    );
    println!(
        "- kube-apiserver restarts: 1 (etcd kept), back in {:.1} s",
        f.apiserver_restart.as_secs_f64()
    );
    println!(
        "- injected GCS faults (p = {} each): UNAVAILABLE {}, RESOURCE_EXHAUSTED {}, DEADLINE_EXCEEDED {}, answers lost after the change {}; calls delayed 0-{:?}: {}",
        args.fault_probability,
        q.unavailable,
        q.resource_exhausted,
        q.deadline_exceeded,
        q.lost_responses,
        args.max_latency,
        q.delayed
    );
    println!(
        "- creates: {} (CreateBucket calls {}), deletes: {} (DeleteBucket calls {})",
        args.resources, f.create_calls, args.resources, f.delete_calls
    );
    println!(
        "- leaks: {}, duplicates: {}, foreign buckets untouched: {} of {FOREIGN_BUCKETS}",
        f.tally.leaks, f.tally.duplicates, f.foreign_kept
    );
    let l = &f.left;
    println!(
        "- buckets left at the end: {} (foreign {}, kept by Orphan {}, released by Abandon {}), each checked for an owner the run expects",
        l.total, l.foreign, l.orphaned, l.abandoned
    );
    println!(
        "- time to all Ready: {:.1} s; time to converge (first create to last resource gone): {:.1} s",
        f.to_ready.as_secs_f64(),
        f.converged.as_secs_f64()
    );
}
