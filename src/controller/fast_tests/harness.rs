//! One reconciler under test: a [`Context`] over the fake API server and
//! the in-process GCS mock, its caches filled from the fake API server
//! before each reconcile (as the watches would have filled them).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bucketmap_testkit::mock_gcs::{MockGcs, MockHandle};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use tokio::sync::mpsc;

use super::api::FakeApi;
use crate::controller::watches::Stores;
use crate::controller::{Context, MAP_READER_BINDING, OperatorConfig};
use crate::crd::Gcs;
use crate::gcs::{GcsClient, GcsConfig};
use crate::metrics::Metrics;
use crate::naming::{self, Identity};
use crate::publish::CachedBinding;

pub(super) const NS: &str = "team-a";
pub(super) const PROJECT: &str = "acme-test";
pub(super) const CLUSTER: &str = "unit-cluster";

/// How long a test waits for an event written in the background: far
/// longer than it takes (milliseconds), so that a busy machine cannot fail
/// it.
const EVENT_DEADLINE: Duration = Duration::from_secs(20);

type NamespaceMeta = PartialObjectMeta<Namespace>;
type ServiceAccountMeta = PartialObjectMeta<ServiceAccount>;

struct Writers {
    resources: Writer<Gcs>,
    namespaces: Writer<NamespaceMeta>,
    configmaps: Writer<ConfigMap>,
    secrets: Writer<CachedBinding>,
    service_accounts: Writer<ServiceAccountMeta>,
    role_bindings: Writer<RoleBinding>,
}

pub(super) struct Harness {
    pub api: FakeApi,
    pub gcs: MockHandle,
    pub ctx: Arc<Context>,
    resources: Store<Gcs>,
    writers: Mutex<Writers>,
    _woken: mpsc::UnboundedReceiver<ObjectRef<Gcs>>,
    mock: Arc<MockGcs>,
}

/// The operator's settings in these tests: a default project, no pacing
/// of bucket creates, a short map debounce.
pub(super) fn config() -> OperatorConfig {
    OperatorConfig {
        cluster_id: CLUSTER.to_owned(),
        default_project: Some(PROJECT.to_owned()),
        bucket_ops_interval: None,
        map_debounce: Duration::from_millis(1),
        ..OperatorConfig::default()
    }
}

impl Harness {
    /// Namespace [`NS`] exists; the operator runs with [`config`].
    pub async fn new() -> Harness {
        Self::with_config(config()).await
    }

    pub async fn with_config(config: OperatorConfig) -> Harness {
        let mock = MockGcs::start().await.expect("the GCS mock starts");
        let api = FakeApi::new();
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS},
        }))
        .expect("a namespace");
        api.create(&namespace);
        Self::over(api, Arc::new(mock), config).await
    }

    /// Another operator process over the same API server and GCS: another
    /// replica after a leader change, or this one restarted. Its caches
    /// and its memory of its own writes are its own.
    pub async fn replica(&self) -> Harness {
        let config = self.ctx.config.clone();
        Self::over(self.api.clone(), self.mock.clone(), config).await
    }

    async fn over(api: FakeApi, mock: Arc<MockGcs>, config: OperatorConfig) -> Harness {
        let metrics = Arc::new(Metrics::default());
        let gcs_config = GcsConfig {
            endpoint: Some(mock.endpoint()),
            anonymous: true,
        };
        let gcs = GcsClient::connect(&gcs_config, metrics.clone())
            .await
            .expect("a GCS client of the mock");
        let (resources, resources_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        let (configmaps, configmaps_w) = reflector::store();
        let (secrets, secrets_w) = reflector::store();
        let (service_accounts, service_accounts_w) = reflector::store();
        let (role_bindings, role_bindings_w) = reflector::store();
        let stores = Stores {
            resources: resources.clone(),
            namespaces,
            configmaps,
            secrets,
            service_accounts,
            role_bindings,
            own_writes: Arc::default(),
        };
        let (ctx, woken) = Context::without_watches(api.client(), gcs, metrics, config, stores);
        let writers = Writers {
            resources: resources_w,
            namespaces: namespaces_w,
            configmaps: configmaps_w,
            secrets: secrets_w,
            service_accounts: service_accounts_w,
            role_bindings: role_bindings_w,
        };
        let harness = Harness {
            api,
            gcs: mock.handle(),
            ctx,
            resources,
            writers: Mutex::new(writers),
            _woken: woken,
            mock,
        };
        harness.sync();
        harness
    }

    /// Creates `Gcs` `name` in [`NS`] from a spec given as JSON.
    pub fn create(&self, name: &str, spec: serde_json::Value) -> Gcs {
        let obj: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
            "metadata": {"name": name, "namespace": NS}, "spec": spec,
        }))
        .expect("a Gcs");
        self.api.create(&obj)
    }

    /// The stored `Gcs` `name`, if it exists.
    pub fn get(&self, name: &str) -> Option<Gcs> {
        self.api.get(NS, name)
    }

    /// Deletes `Gcs` `name` through the API (its finalizer keeps it).
    pub async fn delete(&self, name: &str) {
        let api: Api<Gcs> = Api::namespaced(self.ctx.client.clone(), NS);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("the delete is accepted");
    }

    /// Refills the caches from the fake API server, as the watches would.
    pub fn sync(&self) {
        self.refill(true);
    }

    /// Refills every cache but the namespaces' (a namespace watch that lags
    /// behind the API server).
    pub fn sync_but_namespaces(&self) {
        self.refill(false);
    }

    fn refill(&self, namespaces: bool) {
        let map_name = self.ctx.config.map_name.clone();
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let resources = self.api.list::<Gcs>().into_iter().map(|mut g| {
            crate::controller::watches::trim_for_cache(&mut g);
            g
        });
        relist(&mut w.resources, resources);
        if namespaces {
            relist(&mut w.namespaces, self.api.list::<NamespaceMeta>());
        }
        let maps = self.api.list::<ConfigMap>().into_iter();
        relist(
            &mut w.configmaps,
            maps.filter(|cm| cm.name_any() == map_name),
        );
        let managed = |s: &Secret| {
            let (key, value) = crate::publish::MANAGED_BY;
            s.labels().get(key).is_some_and(|v| v == value)
        };
        let secrets = self.api.list::<Secret>().into_iter().filter(managed);
        relist(&mut w.secrets, secrets.map(|s| CachedBinding::of(&s)));
        relist(
            &mut w.service_accounts,
            self.api.list::<ServiceAccountMeta>(),
        );
        let bindings = self.api.list::<RoleBinding>().into_iter();
        let map_readers = |rb: &RoleBinding| rb.name_any() == MAP_READER_BINDING;
        relist(&mut w.role_bindings, bindings.filter(map_readers));
    }

    /// Puts `obj`, an older version of a resource, in the resource cache,
    /// as a watch that has not delivered the later ones holds it.
    pub fn cache_as(&self, obj: Gcs) {
        let mut obj = obj;
        crate::controller::watches::trim_for_cache(&mut obj);
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        w.resources.apply_watcher_event(&watcher::Event::Apply(obj));
    }

    /// Every stored version of `Gcs` `name`, oldest first.
    pub fn versions(&self, name: &str) -> Vec<Gcs> {
        self.api.versions(NS, name)
    }

    /// One reconcile of `name` as the controller runs it: caches synced,
    /// the cached object passed in.
    pub async fn reconcile(&self, name: &str) -> crate::Result<Action> {
        self.sync();
        self.reconcile_cached(name).await
    }

    /// One reconcile of `name` with the caches as they are (they may lag
    /// behind the API server, as a watch does).
    pub async fn reconcile_cached(&self, name: &str) -> crate::Result<Action> {
        let obj = self
            .resources
            .get(&ObjectRef::new(name).within(NS))
            .expect("the resource is cached");
        crate::controller::reconcile(obj, self.ctx.clone()).await
    }

    /// Reconciles `name` until it is Ready (the first reconcile only adds
    /// the finalizer); at most three times.
    pub async fn reconcile_until_ready(&self, name: &str) -> Gcs {
        for _ in 0..3 {
            self.reconcile(name).await.expect("the reconcile succeeds");
            let obj = self.get(name).expect("the resource exists");
            if ready(&obj).is_some_and(|c| c.status == "True") {
                return obj;
            }
        }
        panic!(
            "{name} is not Ready: {:?}",
            self.get(name).map(|g| g.status)
        );
    }

    /// The bucket map of [`NS`] (empty when there is none).
    pub fn map(&self) -> BTreeMap<String, String> {
        let cm: Option<ConfigMap> = self.api.get(NS, &self.ctx.config.map_name);
        cm.and_then(|cm| cm.data).unwrap_or_default()
    }

    /// Candidate `attempt` of the physical name of `Gcs` `name`.
    pub fn candidate(&self, logical: &str, name: &str, attempt: u32) -> String {
        naming::physical_name(logical, identity(name), attempt)
    }

    /// The first event with `reason` about `Gcs` `name`, waiting for the
    /// background writer.
    pub async fn event(&self, name: &str, reason: &str) -> Event {
        let found = tokio::time::timeout(EVENT_DEADLINE, async {
            loop {
                if let Some(e) = self
                    .events(name)
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some(reason))
                {
                    return e;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let seen: Vec<Option<String>> = self.events(name).into_iter().map(|e| e.reason).collect();
        found.unwrap_or_else(|_| panic!("no {reason} event about {name}; seen: {seen:?}"))
    }

    /// Every event written so far about `Gcs` `name`.
    pub fn events(&self, name: &str) -> Vec<Event> {
        let about = |e: &Event| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name);
        self.api.list::<Event>().into_iter().filter(about).collect()
    }
}

/// The owner identity of `Gcs` `name` in [`NS`] under [`CLUSTER`].
pub(super) fn identity(name: &str) -> Identity<'_> {
    Identity {
        cluster: CLUSTER,
        namespace: NS,
        name,
    }
}

/// The `Ready` condition of `obj`, if any.
pub(super) fn ready(obj: &Gcs) -> Option<Condition> {
    condition(obj, crate::conditions::READY)
}

/// Condition `type_` of `obj`, if any.
pub(super) fn condition(obj: &Gcs, type_: &str) -> Option<Condition> {
    let status = obj.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == type_).cloned()
}

/// Replaces a cache's content with `objects`, as a watch's initial list.
fn relist<K>(writer: &mut Writer<K>, objects: impl IntoIterator<Item = K>)
where
    K: Lookup + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for obj in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}
