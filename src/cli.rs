//! `bucketmap operator`: its command line and what it runs. The `bucketmap`
//! binary is a thin shell around [`run`]; the benchmark (`cargo dev bench`)
//! runs the same entry point in its own process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::controller::{self, OperatorConfig};
use crate::gcs::{GcsClient, GcsConfig};
use crate::iam::WorkloadIdentity;
use crate::leader::{self, LeaderElection};
use crate::metrics::{self, Health, Metrics};

/// Where GCS is and how to authenticate.
#[derive(Args, Debug, Clone)]
pub struct GcsArgs {
    /// GCS endpoint (default: https://storage.googleapis.com), e.g. an emulator.
    #[arg(long, env = "BUCKETMAP_GCS_ENDPOINT")]
    gcs_endpoint: Option<String>,
    /// Send no credentials to GCS (emulators); otherwise Application Default Credentials.
    #[arg(long, env = "BUCKETMAP_GCS_ANONYMOUS")]
    gcs_anonymous: bool,
}

impl GcsArgs {
    fn config(&self) -> GcsConfig {
        GcsConfig {
            endpoint: self.gcs_endpoint.clone(),
            anonymous: self.gcs_anonymous,
        }
    }
}

/// How the operator reconciles: its policy, its pace and its budgets.
/// `bucketmap operator` and the embedded operator of `cargo dev` take the
/// same flags.
#[derive(Args, Debug, Clone)]
pub struct TuningArgs {
    /// The tenancy policy, a YAML file: which namespaces may use which
    /// projects, storage classes, locations, forceDestroy, and how many
    /// buckets (see README). Without it, every namespace may use the
    /// default project only (its annotation's, else --default-project).
    #[arg(long, env = "BUCKETMAP_TENANCY_POLICY", value_parser = tenancy_policy)]
    tenancy_policy: Option<crate::tenancy::Policy>,
    /// Drift check period: each resource is checked once per period.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    resync: Duration,
    /// Minimum interval between bucket creates/deletes per project (GCS allows ~1 per 2 s); 0 disables.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    bucket_ops_interval: Duration,
    /// Candidate names tried before reporting NameConflict.
    #[arg(long, default_value_t = 5)]
    max_name_attempts: u32,
    /// Reconciles doing work (GCS calls, API writes) at once; one waiting
    /// for its namespace's map write does not count (0: unbounded).
    #[arg(long, default_value_t = 32)]
    concurrency: u16,
    /// Bytes one namespace's bucket map may hold (entries count twice their
    /// logical name, plus the physical name and 16). The default fits the API
    /// server's and etcd's limits; resources beyond it report MapFull.
    #[arg(long, default_value_t = crate::bucket_map::DEFAULT_MAX_MAP_BYTES)]
    map_max_bytes: usize,
    /// Pause between the first change of a namespace's bucket map and its
    /// write, so that a burst of new resources makes one write.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    map_debounce: Duration,
    /// Bucket map writes in flight at once, over all namespaces (0: one per
    /// namespace, no other limit). While namespaces wait their turn, their
    /// maps gather more entries, so a burst over many namespaces costs
    /// fewer writes.
    #[arg(long, default_value_t = crate::bucket_map::DEFAULT_WRITERS)]
    map_writers: usize,
}

impl TuningArgs {
    /// Sets these in `config`.
    pub fn apply(&self, config: &mut OperatorConfig) {
        config.tenancy = Arc::new(self.tenancy_policy.clone().unwrap_or_default());
        config.resync = self.resync;
        config.bucket_ops_interval = Some(self.bucket_ops_interval);
        config.max_name_attempts = self.max_name_attempts.max(1);
        config.concurrency = self.concurrency;
        config.map_max_bytes = self.map_max_bytes;
        config.map_debounce = self.map_debounce;
        config.map_writers = self.map_writers;
    }
}

/// The options of `bucketmap operator`.
#[derive(Args, Debug)]
pub struct OperatorArgs {
    #[command(flatten)]
    gcs: GcsArgs,
    #[command(flatten)]
    tuning: TuningArgs,
    /// This cluster's identity, recorded on every bucket with the resource's
    /// namespace and name: a cluster given the same identity (a restore, a
    /// rebuild, a blue/green successor) finds the same buckets. A GCS label
    /// value: 1 to 63 lowercase letters, digits, '-' or '_', starting with a
    /// letter. Default: the one stored in the ConfigMap bucketmap-cluster-id
    /// of the operator's namespace, created with a random one if absent.
    #[arg(long, env = "BUCKETMAP_CLUSTER_ID", value_parser = crate::naming::validate_cluster_id)]
    cluster_id: Option<String>,
    /// Project for resources whose spec and namespace name none.
    #[arg(long, env = "BUCKETMAP_DEFAULT_PROJECT")]
    default_project: Option<String>,
    /// Watch only this namespace (default: all); the same as
    /// --watch-namespaces with one namespace, and combined with it.
    #[arg(long, env = "BUCKETMAP_NAMESPACE")]
    namespace: Option<String>,
    /// Watch only these namespaces, comma-separated (default: all): a
    /// namespaced install, whose RBAC is Roles in these namespaces.
    #[arg(
        long,
        env = "BUCKETMAP_WATCH_NAMESPACES",
        value_delimiter = ',',
        value_parser = namespace_name
    )]
    watch_namespaces: Vec<String>,
    /// Publish a Service Binding Secret per Gcs (`--service-binding=false`:
    /// none; the operator then reads and writes no Secret outside its own
    /// namespace, and needs no RBAC for it).
    #[arg(long, env = "BUCKETMAP_SERVICE_BINDING", default_value_t = true, action = clap::ArgAction::Set)]
    service_binding: bool,
    /// Name of the per-namespace ConfigMap that maps logical to physical names.
    #[arg(long, env = "BUCKETMAP_MAP_NAME", default_value = "bucketmap")]
    map_name: String,
    /// ClusterRole that lets a namespace's ServiceAccounts read its bucket
    /// map (the chart's bucketmap-map-reader): the operator binds it in each
    /// namespace with a Gcs (RoleBinding bucketmap-map-reader) and removes
    /// the binding with the namespace's last Gcs. Unset: the operator
    /// manages no RoleBinding (a namespaced install, whose chart binds a
    /// Role in each watched namespace itself).
    #[arg(long, env = "BUCKETMAP_MAP_READER_ROLE")]
    map_reader_role: Option<String>,
    /// Workload Identity Federation pool of the cluster (e.g.
    /// PROJECT_ID.svc.id.goog): a ServiceAccount without the annotation
    /// iam.gke.io/gcp-service-account is granted as its principal.
    #[arg(
        long,
        env = "BUCKETMAP_WORKLOAD_IDENTITY_POOL",
        requires = "workload_identity_project_number"
    )]
    workload_identity_pool: Option<String>,
    /// Number of the project that owns --workload-identity-pool.
    #[arg(long, env = "BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER", requires = "workload_identity_pool", value_parser = project_number)]
    workload_identity_project_number: Option<String>,
    /// Run as one of several replicas: only the holder of a Lease reconciles.
    #[arg(long)]
    leader_elect: bool,
    /// The operator's namespace: of the leader election Lease, the webhook's
    /// Secret, the cluster identity's ConfigMap and the places of the
    /// namespaces whose buckets the tenancy policy limits.
    #[arg(long, env = "POD_NAMESPACE", default_value = "bucketmap-system")]
    leader_election_namespace: String,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "bucketmap-operator")]
    leader_election_id: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else host name and pid).
    #[arg(long)]
    leader_election_identity: Option<String>,
    /// How long the Lease stays valid after its last renewal; a standby takes over within it.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// How long before expiry the holder renews the Lease.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    lease_renew_margin: Duration,
    /// Serve the pod injection webhook (HTTPS) on this address; off when unset.
    #[arg(long)]
    webhook_addr: Option<SocketAddr>,
    /// Directory with tls.crt and tls.key for the webhook (e.g. a cert-manager
    /// Secret); without it the operator generates and rotates its own.
    #[arg(long)]
    webhook_cert_dir: Option<PathBuf>,
    /// Secret (in the operator's namespace) holding the self-managed webhook certificate.
    #[arg(long, default_value = "bucketmap-webhook-tls")]
    webhook_secret: String,
    /// MutatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(long, default_value = "bucketmap")]
    webhook_config_name: String,
    /// Names the webhook certificate is valid for (default: the webhook Service's DNS names).
    #[arg(long = "webhook-host")]
    webhook_hosts: Vec<String>,
    /// Service in front of the webhook (for the default certificate names).
    #[arg(long, default_value = "bucketmap-webhook")]
    webhook_service: String,
    /// Image of the injected sidecar.
    #[arg(
        long,
        env = "BUCKETMAP_SIDECAR_IMAGE",
        default_value = "bucketmap/bucketmap:0.1.0"
    )]
    sidecar_image: String,
    /// A further argument of every injected sidecar, repeatable (for
    /// example `--sidecar-arg=--upstream=http://gcs-emulator:4443`).
    #[arg(long = "sidecar-arg", value_name = "ARG", allow_hyphen_values = true)]
    sidecar_args: Vec<String>,
    /// Loopback port of the injected sidecar.
    #[arg(long, default_value_t = 9023)]
    sidecar_port: u16,
    /// Port of the injected sidecar's admin listener (probes, /metrics) on the pod IP.
    #[arg(long, default_value_t = 9024)]
    sidecar_admin_port: u16,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// On SIGTERM, how long /readyz reports not ready while the webhook
    /// still accepts requests, so that the API server stops sending them
    /// here before the listener closes.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    shutdown_delay: Duration,
    /// After the webhook stops accepting, how long admission requests in
    /// flight may take to finish before their connections are closed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    webhook_drain_timeout: Duration,
    /// The Google service account the operator acts as (GKE Workload
    /// Identity; the chart sets it from serviceAccount.gcpServiceAccount).
    /// Checked at start: the chart's placeholder or a malformed address is
    /// refused. Empty: other credentials (an emulator, or Application
    /// Default Credentials found otherwise).
    #[arg(long, env = "BUCKETMAP_GCP_SERVICE_ACCOUNT", value_parser = gcp_service_account)]
    gcp_service_account: Option<GcpServiceAccount>,
}

/// A Google service account address, or none (empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcpServiceAccount(pub Option<String>);

/// Parses `--gcp-service-account`: empty, or an address of the form
/// `NAME@PROJECT.iam.gserviceaccount.com` (or another
/// `*.gserviceaccount.com` domain Google uses for its own accounts); the
/// chart's placeholder is refused with what to do.
pub fn gcp_service_account(value: &str) -> Result<GcpServiceAccount, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(GcpServiceAccount(None));
    }
    if value.contains("YOUR_PROJECT") {
        return Err(format!(
            "{value:?} is the chart's placeholder: set the Helm value \
             serviceAccount.gcpServiceAccount (env BUCKETMAP_GCP_SERVICE_ACCOUNT) to the \
             Google service account the operator acts as, created as docs/INSTALL-GKE.md \
             shows, or to \"\" when the operator gets other credentials"
        ));
    }
    let well_formed = value.split_once('@').is_some_and(|(name, domain)| {
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        let project = domain
            .strip_suffix(".iam.gserviceaccount.com")
            .or_else(|| domain.strip_suffix(".gserviceaccount.com"));
        label(name) && project.is_some_and(|p| p.split('.').all(label))
    });
    if well_formed {
        Ok(GcpServiceAccount(Some(value.to_owned())))
    } else {
        Err(format!(
            "{value:?} is not a Google service account address \
             (NAME@PROJECT.iam.gserviceaccount.com); check the Helm value \
             serviceAccount.gcpServiceAccount (env BUCKETMAP_GCP_SERVICE_ACCOUNT) and \
             docs/INSTALL-GKE.md"
        ))
    }
}

fn tenancy_policy(path: &str) -> Result<crate::tenancy::Policy, String> {
    crate::tenancy::Policy::from_file(std::path::Path::new(path)).map_err(|e| format!("{e:#}"))
}

fn operator_config(args: &OperatorArgs, cluster_id: String) -> OperatorConfig {
    let mut config = OperatorConfig {
        cluster_id,
        default_project: args.default_project.clone(),
        namespace: args.namespace.clone(),
        watch_namespaces: args.watch_namespaces.clone(),
        service_binding: args.service_binding,
        map_name: args.map_name.clone(),
        map_reader_role: args.map_reader_role.clone().filter(|r| !r.is_empty()),
        workload_identity: args
            .workload_identity_pool
            .clone()
            .zip(args.workload_identity_project_number.clone())
            .map(|(pool, project_number)| WorkloadIdentity {
                pool,
                project_number,
            }),
        operator_namespace: args.leader_election_namespace.clone(),
        ..OperatorConfig::default()
    };
    args.tuning.apply(&mut config);
    config
}

/// A namespace name (a DNS label); blanks around it are dropped, and an
/// empty item (`a,,b`, or an empty variable) names none.
fn namespace_name(value: &str) -> Result<String, String> {
    let value = value.trim();
    let label = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if label {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (lowercase letters, digits and '-')"
        ))
    }
}

/// A project number: digits only (the pool's principal names it).
fn project_number(value: &str) -> Result<String, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a project number (digits only, e.g. 123456789012)"
        ))
    }
}

async fn shutdown_signal() {
    let signal = crate::termination_signal().await;
    tracing::info!(signal, "shutting down");
}

/// Resolves once the process was asked to stop (see [`stopping`]).
async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// On SIGTERM or ctrl-c: readiness turns false first, then `stopping`
/// turns true for everything that stops.
fn stopping(health: Health) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        health.set_ready(false);
        let _ = tx.send(true);
    });
    rx
}

/// Runs the operator until SIGTERM or ctrl-c (as the leader only, with
/// `--leader-elect`), serving metrics and probes, and the webhook when
/// asked; on the signal, the webhook drains its requests in flight before
/// the process ends.
pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (kubeconfig or in-cluster config)")?;
    let metrics = Arc::new(Metrics::default());
    let gcs = GcsClient::connect(&args.gcs.config(), metrics.clone()).await?;
    let health = Health::new(metrics.clone());
    let stop = stopping(health.clone());
    let server = tokio::spawn(metrics::serve(
        args.metrics_addr,
        health.clone(),
        std::future::pending(),
    ));
    if let Some(GcpServiceAccount(Some(account))) = &args.gcp_service_account {
        tracing::info!(
            account,
            "acting as Google service account (Workload Identity)"
        );
    }
    let config = operator_config(&args, cluster_identity(&args, &client).await?);
    let webhook = match args.webhook_addr {
        Some(addr) => Some(start_webhook(&args, &client, addr, stop.clone()).await?),
        None => None,
    };
    let result = run_operator(&args, client, gcs, metrics, config, &health, stop).await;
    health.set_ready(false);
    if let Some(webhook) = webhook {
        match webhook.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "webhook server stopped"),
            Err(e) => tracing::error!(error = %e, "the webhook task panicked"),
        }
    }
    server.abort();
    result
}

/// The controller until `stop`: as the leader only with `--leader-elect`.
async fn run_operator(
    args: &OperatorArgs,
    client: kube::Client,
    gcs: GcsClient,
    metrics: Arc<Metrics>,
    config: OperatorConfig,
    health: &Health,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let ready = health.clone();
    let operator = {
        let client = client.clone();
        move |halt: tokio::sync::oneshot::Receiver<()>| {
            controller::run(
                client,
                gcs,
                metrics,
                config,
                move || ready.set_ready(true),
                async {
                    let _ = halt.await;
                },
            )
        }
    };
    if !args.leader_elect {
        let (halt, halted) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(operator(halted));
        stopped(stop).await;
        let _ = halt.send(());
        return run.await.context("the operator task panicked");
    }
    let election = leader_election(args);
    // A standby is healthy and ready to take over.
    let (standby, leading) = (health.clone(), health.clone());
    leader::run_while_leader(
        client,
        &election,
        stopped(stop),
        move || standby.set_ready(true),
        |halt| {
            leading.set_ready(false);
            operator(halt)
        },
    )
    .await
}

/// The cluster identity (given, or stored in the operator's namespace),
/// logged: docs/RECOVERY.md tells users to keep it.
async fn cluster_identity(args: &OperatorArgs, client: &kube::Client) -> anyhow::Result<String> {
    let (cluster_id, source) = crate::cluster_id::resolve(
        client,
        args.cluster_id.as_deref(),
        &args.leader_election_namespace,
    )
    .await?;
    tracing::info!(cluster_id, source = source.as_str(), "cluster identity");
    Ok(cluster_id)
}

/// The Lease this replica competes for (`--leader-elect`).
fn leader_election(args: &OperatorArgs) -> LeaderElection {
    LeaderElection {
        namespace: args.leader_election_namespace.clone(),
        lease_name: args.leader_election_id.clone(),
        identity: args
            .leader_election_identity
            .clone()
            .unwrap_or_else(default_identity),
        lease_duration: args.lease_duration,
        renew_margin: args.lease_renew_margin,
    }
}

/// Starts the admission webhooks (on every replica, leader or not). On
/// `stop` (readiness is false by then) they keep serving for
/// `--shutdown-delay`, stop accepting, and drain for at most
/// `--webhook-drain-timeout`.
async fn start_webhook(
    args: &OperatorArgs,
    client: &kube::Client,
    addr: SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    use crate::webhook::{self, InjectionConfig};
    anyhow::ensure!(
        args.sidecar_admin_port != args.sidecar_port,
        "--sidecar-admin-port and --sidecar-port must differ (both are {})",
        args.sidecar_port
    );
    let certs = webhook::tls::start(cert_source(args, client), Duration::from_secs(60)).await?;
    let cfg = InjectionConfig {
        sidecar_image: args.sidecar_image.clone(),
        port: args.sidecar_port,
        admin_port: args.sidecar_admin_port,
        map_name: args.map_name.clone(),
        extra_args: args.sidecar_args.clone(),
    };
    let config = operator_config(args, String::new());
    let watched = config.watched_namespaces();
    let policy = webhook::PolicyCheck {
        client: client.clone(),
        policy: config.tenancy.clone(),
        default_project: config.default_project.clone(),
        watched: watched.clone(),
    };
    let delay = args.shutdown_delay;
    let shutdown = async move {
        stopped(stop).await;
        tokio::time::sleep(delay).await;
    };
    let drain = args.webhook_drain_timeout;
    Ok(tokio::spawn(webhook::serve_checked(
        addr,
        certs,
        cfg,
        watched,
        Some(policy),
        shutdown,
        drain,
    )))
}

/// Where the webhook's certificate comes from: `--webhook-cert-dir`, else
/// the Secret the operator manages in its namespace.
fn cert_source(args: &OperatorArgs, client: &kube::Client) -> crate::webhook::tls::CertSource {
    use crate::webhook::tls::CertSource;
    if let Some(dir) = &args.webhook_cert_dir {
        return CertSource::Files(dir.clone());
    }
    let ns = &args.leader_election_namespace;
    let svc = &args.webhook_service;
    let hosts = if args.webhook_hosts.is_empty() {
        vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ]
    } else {
        args.webhook_hosts.clone()
    };
    CertSource::SelfManaged {
        client: client.clone(),
        namespace: ns.clone(),
        secret: args.webhook_secret.clone(),
        hosts,
        webhook_config: args.webhook_config_name.clone(),
    }
}

/// This replica's identity in the lease: the pod name, else host name and pid.
fn default_identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Command {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn parse(flags: &[&str]) -> Result<OperatorConfig, clap::Error> {
        let argv = std::iter::once("bucketmap").chain(flags.iter().copied());
        Command::try_parse_from(argv).map(|c| operator_config(&c.args, "test".into()))
    }

    #[test]
    fn the_workload_identity_pool_comes_with_its_project_number() {
        let config = parse(&[
            "--workload-identity-pool",
            "acme.svc.id.goog",
            "--workload-identity-project-number",
            "123456789012",
        ])
        .expect("both flags parse");
        assert_eq!(
            config.workload_identity,
            Some(WorkloadIdentity {
                pool: "acme.svc.id.goog".into(),
                project_number: "123456789012".into(),
            })
        );
        let none = parse(&[]).expect("no flags parse");
        assert_eq!(none.workload_identity, None);
        for alone in [
            &["--workload-identity-pool", "acme.svc.id.goog"][..],
            &["--workload-identity-project-number", "123456789012"][..],
        ] {
            assert!(parse(alone).is_err(), "{alone:?} alone is refused");
        }
        let bad = parse(&[
            "--workload-identity-pool",
            "acme.svc.id.goog",
            "--workload-identity-project-number",
            "acme",
        ]);
        let message = bad
            .expect_err("a project id is no project number")
            .to_string();
        assert!(message.contains("not a project number"), "{message}");
    }

    #[test]
    fn the_placeholder_or_a_malformed_service_account_is_refused_at_start() {
        let parse = |v: &str| {
            Command::try_parse_from(["bucketmap", "--gcp-service-account", v])
                .map(|c| c.args.gcp_service_account)
        };
        let placeholder = parse("bucketmap@YOUR_PROJECT.iam.gserviceaccount.com")
            .expect_err("the placeholder is refused")
            .to_string();
        for needle in [
            "placeholder",
            "serviceAccount.gcpServiceAccount",
            "docs/INSTALL-GKE.md",
        ] {
            assert!(placeholder.contains(needle), "{needle}: {placeholder}");
        }
        for bad in [
            "bucketmap",
            "bucketmap@acme",
            "Bucketmap@acme.iam.gserviceaccount.com",
            "@acme.iam.gserviceaccount.com",
            "a@b@acme.iam.gserviceaccount.com",
        ] {
            let message = parse(bad).expect_err(bad).to_string();
            assert!(message.contains("INSTALL-GKE.md"), "{bad}: {message}");
        }
        for good in [
            "bucketmap@acme-prod.iam.gserviceaccount.com",
            "123456789012-compute@developer.gserviceaccount.com",
        ] {
            let parsed = parse(good).expect(good);
            assert_eq!(parsed, Some(GcpServiceAccount(Some(good.to_owned()))));
        }
        assert_eq!(parse("").expect("empty"), Some(GcpServiceAccount(None)));
        let none = Command::try_parse_from(["bucketmap"]).expect("no flags parse");
        assert_eq!(none.args.gcp_service_account, None);
    }

    #[test]
    fn watched_namespaces_come_from_both_flags() {
        let all = parse(&[]).expect("no flags parse");
        assert_eq!(all.watched_namespaces(), None);
        let one = parse(&["--namespace", "team-a"]).expect("parses");
        assert_eq!(one.watched_namespaces(), Some(vec!["team-a".to_owned()]));
        let many = parse(&[
            "--watch-namespaces",
            "team-b, team-a,,team-b",
            "--namespace",
            "team-c",
        ])
        .expect("parses");
        assert_eq!(
            many.watched_namespaces(),
            Some(vec![
                "team-a".to_owned(),
                "team-b".to_owned(),
                "team-c".to_owned()
            ])
        );
        let message = parse(&["--watch-namespaces", "Team_A"])
            .expect_err("refused")
            .to_string();
        assert!(message.contains("not a namespace name"), "{message}");
    }

    #[test]
    fn the_map_readers_are_bound_only_when_the_role_is_named() {
        let role = |flags: &[&str]| parse(flags).expect("parses").map_reader_role;
        assert_eq!(role(&[]), None, "a namespaced install: the chart binds");
        assert_eq!(role(&["--map-reader-role", ""]), None);
        assert_eq!(
            role(&["--map-reader-role", "bucketmap-map-reader"]).as_deref(),
            Some("bucketmap-map-reader")
        );
    }

    #[test]
    fn a_cluster_id_that_is_no_label_value_is_refused_at_start() {
        let given = Command::try_parse_from(["bucketmap", "--cluster-id", "prod-eu"])
            .expect("a valid cluster id parses");
        assert_eq!(given.args.cluster_id.as_deref(), Some("prod-eu"));
        let none = Command::try_parse_from(["bucketmap"]).expect("no flags parse");
        assert_eq!(none.args.cluster_id, None);
        for bad in ["Prod", "9prod", "prod.eu"] {
            let message = Command::try_parse_from(["bucketmap", "--cluster-id", bad])
                .expect_err(bad)
                .to_string();
            assert!(message.contains("label value"), "{message}");
        }
    }
}
