//! The watches feeding the reconciler, and [`run`], which wires them to the
//! controller.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::map_readers::{self, MAP_READER_BINDING};
use super::status::OwnWrites;
use super::{Context, FailureCounts, OperatorConfig, error_policy, reconcile, scope};
use crate::bucket_map::{BucketMaps, MapSettings, in_namespace};
use crate::crd::Gcs;
use crate::gcs::{GcsClient, Pacer};
use crate::metrics::Metrics;
use crate::publish::{self, CachedBinding};
use crate::slots::Slots;

type NamespaceMeta = PartialObjectMeta<Namespace>;
type ServiceAccountMeta = PartialObjectMeta<ServiceAccount>;

/// `kubectl apply`'s copy of the object it applied, as large as the object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the caches of resources, namespaces and ServiceAccounts keep of an
/// object: all but the API server's record of who wrote which field
/// (`managedFields`) and `kubectl apply`'s copy of the object, which
/// nothing here reads and which would double the memory each one takes.
/// What is dropped is freed, not kept as spare capacity: a cleared list
/// and an emptied map keep their buffers, one per cached object.
pub(super) fn trim_for_cache<K: ResourceExt>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    gcs: GcsClient,
    metrics: Arc<Metrics>,
    config: OperatorConfig,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (namespaces, ns_stream) = watch_namespaces(&client, &config);
    let own_writes = Arc::<OwnWrites>::default();
    let (resources, gcs_stream) = watch_resources(&client, &config, own_writes.clone());
    let (configmaps, secrets, cache_tasks) = watch_published(&client, &config);
    let (service_accounts, sa_stream) = watch_service_accounts(&client, &config);
    let (role_bindings, rb_stream) = watch_map_readers(&client, &config);
    let concurrency = config.concurrency;
    let stores = Stores {
        resources: resources.clone(),
        namespaces: namespaces.clone(),
        configmaps,
        secrets,
        service_accounts: service_accounts.clone(),
        role_bindings,
        own_writes,
    };
    let (ctx, woken) = Context::build(client, gcs, metrics, config, stores, Arc::default());
    let triggers = Triggers {
        woken,
        namespaces: ns_stream,
        resync: ctx.config.resync,
    };
    let controller = controller(gcs_stream, resources.clone(), concurrency, triggers);
    let controller = with_service_accounts(controller, sa_stream);
    let controller = match rb_stream {
        Some(stream) => with_map_readers(controller, stream),
        None => controller,
    };
    let synced = ctx.namespaces_synced.clone();
    let caches = Caches {
        resources,
        namespaces,
        service_accounts,
    };
    let readiness = tokio::spawn(signal_ready(caches, synced, on_ready));
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
    // The background watches live exactly as long as the controller.
    readiness.abort();
    for task in cache_tasks {
        task.abort();
    }
}

fn reporter() -> Reporter {
    Reporter {
        controller: "bucketmap".into(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

/// The watched namespaces' metadata (their project annotation), cached;
/// the stream yields a namespace whose annotations changed.
fn watch_namespaces(
    client: &kube::Client,
    config: &OperatorConfig,
) -> (
    Store<NamespaceMeta>,
    impl Stream<Item = Result<NamespaceMeta, watcher::Error>> + Send + 'static,
) {
    let api: Api<NamespaceMeta> = Api::all(client.clone());
    let watched = config.watched_namespaces();
    let (reader, writer) = reflector::store();
    let stream = scope::watch_namespaces(watched.as_deref(), &watcher::Config::default(), api)
        .modify(trim_for_cache::<NamespaceMeta>)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::annotations, Default::default());
    (reader, stream)
}

/// The `Gcs` resources, cached; the stream yields the ones to reconcile.
fn watch_resources(
    client: &kube::Client,
    config: &OperatorConfig,
    own_writes: Arc<OwnWrites>,
) -> (
    Store<Gcs>,
    impl Stream<Item = Result<Gcs, watcher::Error>> + Send + 'static,
) {
    let watched = config.watched_namespaces();
    let (reader, writer) = reflector::store();
    let watch = watcher::Config::default().any_semantic();
    let events = scope::watch_in(watched.as_deref(), &watch, api_in::<Gcs>(client))
        .modify(trim_for_cache::<Gcs>);
    // Status writes do not trigger reconciles; spec changes, deletion
    // (which bumps the generation) and finalizer changes do.
    let stream = super::changes::reflect_changes(events, writer, reader.clone(), own_writes);
    (reader, stream)
}

/// What brings a resource to the controller besides its own changes.
struct Triggers<N> {
    /// Refused map claims that may now succeed: an entry left the map.
    woken: mpsc::UnboundedReceiver<ObjectRef<Gcs>>,
    /// Namespaces whose project annotation changed: each of their resources.
    namespaces: N,
    /// The drift check's period (module `resync`).
    resync: Duration,
}

/// The controller over `resources` and what else `triggers` a reconcile.
fn controller(
    resources: impl Stream<Item = Result<Gcs, watcher::Error>> + Send + 'static,
    cache: Store<Gcs>,
    concurrency: u16,
    triggers: Triggers<impl Stream<Item = Result<NamespaceMeta, watcher::Error>> + Send + 'static>,
) -> Controller<Gcs> {
    let resyncs = super::resync::resyncs(cache.clone(), triggers.resync);
    let controller = Controller::for_stream(resources, cache)
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(Slots::controller_concurrency(concurrency)),
        )
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            triggers.woken,
        ))
        .reconcile_on(resyncs);
    let store = controller.store();
    controller.watches_stream(triggers.namespaces, move |ns| {
        let name = ns.name_any();
        store
            .state_filter(|g| in_namespace(g, &name))
            .iter()
            .map(|g| ObjectRef::from_obj(&**g))
            .collect::<Vec<_>>()
    })
}

/// The caches a reconcile reads.
struct Caches {
    resources: Store<Gcs>,
    namespaces: Store<NamespaceMeta>,
    service_accounts: Store<ServiceAccountMeta>,
}

/// Sets `synced` and calls `on_ready` once the caches hold everything.
async fn signal_ready(caches: Caches, synced: Arc<AtomicBool>, on_ready: impl FnOnce()) {
    // Re-poll with a timeout: a store's readiness future only wakes its
    // latest poller, and the controller waits on the same store.
    loop {
        let wait = async {
            let (a, b, c) = tokio::join!(
                caches.resources.wait_until_ready(),
                caches.namespaces.wait_until_ready(),
                caches.service_accounts.wait_until_ready()
            );
            a.is_ok() && b.is_ok() && c.is_ok()
        };
        match tokio::time::timeout(Duration::from_millis(200), wait).await {
            Ok(true) => break,
            Ok(false) => {
                warn!("watch caches were dropped before they synced");
                return;
            }
            Err(_) => {}
        }
    }
    synced.store(true, Ordering::Release);
    info!("caches synced");
    on_ready();
}

/// The ServiceAccounts' metadata (their Workload Identity annotation),
/// cached; the stream yields every one created, changed or deleted.
fn watch_service_accounts(
    client: &kube::Client,
    config: &OperatorConfig,
) -> (
    Store<ServiceAccountMeta>,
    impl Stream<Item = Result<ServiceAccountMeta, watcher::Error>> + Send + 'static,
) {
    let watched = config.watched_namespaces();
    let (reader, writer) = reflector::store();
    let watch = watcher::Config::default();
    let stream = scope::watch_in(
        watched.as_deref(),
        &watch,
        api_in::<ServiceAccountMeta>(client),
    )
    .modify(trim_for_cache::<ServiceAccountMeta>)
    .reflect(writer)
    .touched_objects();
    (reader, stream)
}

/// Also reconciles the resources that grant access to a ServiceAccount
/// that appeared, changed (its annotation names the member) or went.
fn with_service_accounts(
    controller: Controller<Gcs>,
    service_accounts: impl Stream<Item = Result<ServiceAccountMeta, watcher::Error>> + Send + 'static,
) -> Controller<Gcs> {
    let store = controller.store();
    controller.watches_stream(service_accounts, move |sa| {
        let (ns, name) = (sa.namespace().unwrap_or_default(), sa.name_any());
        let grants_to = |g: &Gcs| {
            let grantee = |a: &crate::crd::AccessGrant| a.service_account.as_deref() == Some(&name);
            g.spec.access.iter().any(grantee)
        };
        store
            .state_filter(|g| in_namespace(g, &ns) && grants_to(g))
            .iter()
            .map(|g| ObjectRef::from_obj(&**g))
            .collect::<Vec<_>>()
    })
}

/// The RoleBindings named [`MAP_READER_BINDING`], cached, when the
/// operator manages them (`--map-reader-role`); the stream yields those
/// whose namespace needs a reconcile to bind the role again: deleted, or
/// the operator's own no longer as it wrote it. Its own writes trigger
/// nothing.
fn watch_map_readers(
    client: &kube::Client,
    config: &OperatorConfig,
) -> (
    Store<RoleBinding>,
    Option<impl Stream<Item = Result<RoleBinding, watcher::Error>> + Send + 'static>,
) {
    let (reader, writer) = reflector::store();
    let Some(role) = config.map_reader_role.clone() else {
        return (reader, None);
    };
    let watched = config.watched_namespaces();
    // By name: the only list and watch the operator's RBAC allows.
    let watch = watcher::Config::default().fields(&format!("metadata.name={MAP_READER_BINDING}"));
    let stream = scope::watch_in(watched.as_deref(), &watch, api_in::<RoleBinding>(client))
        .modify(trim_for_cache::<RoleBinding>)
        .reflect(writer)
        .try_filter_map(move |event| {
            let repair = match event {
                watcher::Event::Delete(rb) => Some(rb),
                watcher::Event::Apply(rb) if map_readers::needs_repair(&rb, &role) => Some(rb),
                _ => None,
            };
            std::future::ready(Ok(repair))
        });
    (reader, Some(stream))
}

/// Also reconciles the resources of a namespace whose map reader binding
/// went or was changed (any one of them binds it again).
fn with_map_readers(
    controller: Controller<Gcs>,
    bindings: impl Stream<Item = Result<RoleBinding, watcher::Error>> + Send + 'static,
) -> Controller<Gcs> {
    let store = controller.store();
    controller.watches_stream(bindings, move |rb| {
        let ns = rb.namespace().unwrap_or_default();
        let applied = |g: &Gcs| in_namespace(g, &ns) && g.metadata.deletion_timestamp.is_none();
        store
            .state_filter(applied)
            .iter()
            .map(|g| ObjectRef::from_obj(&**g))
            .collect::<Vec<_>>()
    })
}

/// The API of `K` in one namespace, or in all (`None`).
fn api_in<K>(client: &kube::Client) -> impl Fn(Option<&str>) -> Api<K> + use<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    let client = client.clone();
    move |ns| match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Caches of the bucket maps and binding Secrets (only those labelled as
/// ours, and none with Service Binding off), kept by background watches (they trigger nothing: our own writes would only cause reconciles
/// that change nothing). The maps keep their `managedFields` (one entry per
/// writer) so that the writer can see field managers of earlier versions.
fn watch_published(
    client: &kube::Client,
    config: &OperatorConfig,
) -> (Store<ConfigMap>, Store<CachedBinding>, Vec<JoinHandle<()>>) {
    let watched = config.watched_namespaces();
    let (configmaps, cm_writer) = reflector::store();
    let (secrets, secret_writer) = reflector::store();
    let cm_watch = watcher::Config::default().fields(&format!("metadata.name={}", config.map_name));
    let secret_watch = watcher::Config::default().labels(&format!(
        "{}={}",
        publish::MANAGED_BY.0,
        publish::MANAGED_BY.1
    ));
    let cm_task = tokio::spawn(
        scope::watch_in(watched.as_deref(), &cm_watch, api_in::<ConfigMap>(client))
            .reflect(cm_writer)
            .for_each(|_| async {}),
    );
    let mut tasks = vec![cm_task];
    // Without Service Binding no Secret is read: the store stays empty.
    if config.service_binding {
        tasks.push(tokio::spawn(
            reflector::reflector(
                secret_writer,
                scope::watch_in(watched.as_deref(), &secret_watch, api_in::<Secret>(client))
                    // The reconciler compares digests; the Secret stays out of memory.
                    .map_ok(CachedBinding::of_event),
            )
            .for_each(|_| async {}),
        ));
    }
    (configmaps, secrets, tasks)
}

/// The caches a [`Context`] reads: filled by the watches of [`run`], or by
/// the unit tests.
pub(super) struct Stores {
    pub resources: Store<Gcs>,
    pub namespaces: Store<NamespaceMeta>,
    pub configmaps: Store<ConfigMap>,
    pub secrets: Store<CachedBinding>,
    pub service_accounts: Store<ServiceAccountMeta>,
    /// The map reader RoleBindings (module `map_readers`).
    pub role_bindings: Store<RoleBinding>,
    /// This process's status writes the resource cache may not show yet.
    pub own_writes: Arc<OwnWrites>,
}

impl Context {
    /// A context over `stores`, `synced` saying whether its namespace
    /// caches hold everything; with the receiver of the resources the
    /// bucket maps wake.
    fn build(
        client: kube::Client,
        gcs: GcsClient,
        metrics: Arc<Metrics>,
        config: OperatorConfig,
        stores: Stores,
        synced: Arc<AtomicBool>,
    ) -> (Arc<Context>, mpsc::UnboundedReceiver<ObjectRef<Gcs>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let settings = MapSettings {
            map_name: config.map_name.clone(),
            max_bytes: config.map_max_bytes,
            debounce: config.map_debounce,
            writers: config.map_writers,
        };
        let (resources, configmaps) = (stores.resources, stores.configmaps);
        let maps = BucketMaps::new(
            client.clone(),
            metrics.clone(),
            settings,
            resources,
            configmaps,
            wake,
        );
        let ctx = Context {
            events: crate::events::Events::new(client.clone(), reporter(), metrics.clone()),
            pacer: Pacer::new(config.bucket_ops_interval),
            namespaces: stores.namespaces,
            namespace_reads: super::namespaces::NamespaceReads::new(client.clone()),
            service_accounts: stores.service_accounts,
            role_bindings: stores.role_bindings,
            namespaces_synced: synced,
            failures: FailureCounts::default(),
            own_writes: stores.own_writes,
            slots: Slots::new(config.concurrency),
            count_locks: super::CountLocks::default(),
            client,
            gcs,
            metrics,
            config,
            maps,
            secrets: stores.secrets,
        };
        (Arc::new(ctx), woken)
    }

    /// A context as [`run`] builds it, over `stores` instead of watches,
    /// its namespace caches counted as synced.
    #[cfg(test)]
    pub(super) fn without_watches(
        client: kube::Client,
        gcs: GcsClient,
        metrics: Arc<Metrics>,
        config: OperatorConfig,
        stores: Stores,
    ) -> (Arc<Context>, mpsc::UnboundedReceiver<ObjectRef<Gcs>>) {
        let synced = Arc::new(AtomicBool::new(true));
        Self::build(client, gcs, metrics, config, stores, synced)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn the_caches_drop_managed_fields_and_kubectls_copy_and_keep_the_rest() {
        let mut sa = ServiceAccountMeta {
            metadata: ObjectMeta {
                name: Some("app".into()),
                annotations: Some(
                    [
                        (LAST_APPLIED.to_string(), "{...}".to_string()),
                        ("iam.gke.io/gcp-service-account".into(), "app@p.iam".into()),
                    ]
                    .into(),
                ),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            ..Default::default()
        };
        trim_for_cache(&mut sa);
        assert_eq!(sa.metadata.managed_fields, None, "no buffer is kept");
        assert_eq!(
            sa.annotations().keys().collect::<Vec<_>>(),
            ["iam.gke.io/gcp-service-account"]
        );
        assert_eq!(sa.name_any(), "app");

        // kubectl's copy was the only annotation: no empty map is kept.
        sa.annotations_mut().clear();
        sa.annotations_mut()
            .insert(LAST_APPLIED.into(), "{...}".into());
        trim_for_cache(&mut sa);
        assert_eq!(sa.metadata.annotations, None);
    }
}
