//! The pod mutation: the sidecar as a native sidecar (an init container with
//! `restartPolicy: Always`), the bucket map mounted read-only, and every app
//! container pointed at it. Pure functions, unit-tested here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EnvVar, HTTPGetAction, KeyToPath,
    ObjectFieldSelector, Pod, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Pod label that asks for injection.
pub const INJECT_LABEL: &str = "bucketmap.dev/inject";
/// Name of the injected container.
pub const SIDECAR_NAME: &str = "bucketmap-sidecar";
/// Name of the injected volume holding the bucket map.
pub const MAP_VOLUME: &str = "bucketmap-map";
/// Where the sidecar reads the bucket map.
pub const MAP_MOUNT_PATH: &str = "/etc/bucketmap/map";
/// Name of the injected volume holding the ServiceAccount token the
/// sidecar follows the map with.
pub const TOKEN_VOLUME: &str = "bucketmap-token";
/// Where the sidecar reads its token, the cluster CA and its namespace: not
/// the standard ServiceAccount path, which the kubelet's own projection of
/// the app containers' token may take.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/bucketmap.dev/serviceaccount";
/// The token's lifetime; the kubelet renews it at 80 % of it, and the
/// sidecar re-reads the file for every request.
pub const TOKEN_SECONDS: i64 = 3607;
/// The bound on a sidecar's map age (`--max-map-age`): past it without a
/// confirmation from the API server, a sidecar refuses writes. The
/// operator moves a logical name only once a change is older than this
/// (docs/ARCHITECTURE.md, "How fresh a sidecar's map is").
pub const MAX_MAP_AGE: &str = "60s";
/// Name of the sidecar's admin port (probes and metrics). Distinctive, so it
/// does not clash with an app container's own `metrics` port: duplicate port
/// names in a pod make Services, probes and PodMonitors pick one of them.
pub const ADMIN_PORT_NAME: &str = "bucketmap-admin";
/// Pod annotation: the URL of the sidecar's GCS endpoint.
pub const ENDPOINT_ANNOTATION: &str = "bucketmap.dev/gcs-endpoint";
/// Pod annotation: how each client family is pointed at the sidecar.
pub const CLIENTS_ANNOTATION: &str = "bucketmap.dev/clients";
/// The sidecar's `--drain-timeout`. A native sidecar gets SIGTERM only after
/// the app containers have exited, so nothing is left to drain but requests
/// of processes that outlived them; 5 s keeps the sidecar's exit well inside
/// the rest of the pod's grace period (30 s by default, shared by the app's
/// shutdown and then the sidecar's).
pub const DRAIN_TIMEOUT: &str = "5s";

/// What to inject.
#[derive(Debug, Clone)]
pub struct InjectionConfig {
    /// Image of `bucketmap-sidecar`.
    pub sidecar_image: String,
    /// Loopback port the sidecar listens on.
    pub port: u16,
    /// Port of the sidecar's admin listener on the pod IP: the kubelet's
    /// probes and Prometheus reach it there. It never proxies.
    pub admin_port: u16,
    /// Name of the namespace's bucket map ConfigMap.
    pub map_name: String,
    /// Further arguments of every injected sidecar (for example
    /// `--upstream` and `--no-auth` in front of an emulator).
    pub extra_args: Vec<String>,
}

/// Whether the pod asks for injection.
pub fn wants_injection(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(INJECT_LABEL))
        .is_some_and(|v| v == "true")
}

/// Whether the sidecar is already there (re-admission, or a copied spec).
pub fn already_injected(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == SIDECAR_NAME)
            || s.containers.iter().any(|c| c.name == SIDECAR_NAME)
    })
}

/// The pod annotations: the sidecar's endpoint, and how each client family
/// is pointed at it (visible in `kubectl describe pod`). The environment
/// covers Python (gcsfs too), Go, C++ and gcloud; Node.js and Java take code.
pub fn annotations(port: u16) -> BTreeMap<String, String> {
    let url = format!("http://127.0.0.1:{port}");
    let clients = format!(
        "Python, Go: STORAGE_EMULATOR_HOST; C++: CLOUD_STORAGE_EMULATOR_ENDPOINT; \
         gcloud: CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE; gcsfs: also \
         GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (all set by bucketmap). \
         Node.js: delete process.env.STORAGE_EMULATOR_HOST, then \
         new Storage({{apiEndpoint: '{url}'}}) (while the variable is set, the \
         library takes it as its JSON API base, even with apiEndpoint). \
         Java: StorageOptions.newBuilder().setHost(\"{url}\")."
    );
    [
        (ENDPOINT_ANNOTATION.to_owned(), url),
        (CLIENTS_ANNOTATION.to_owned(), clients),
    ]
    .into()
}

/// Environment that points each GCS client library at the sidecar.
pub fn client_env(port: u16) -> Vec<EnvVar> {
    let url = format!("http://127.0.0.1:{port}");
    [
        // Python and Go clients (Node.js: see `annotations`).
        ("STORAGE_EMULATOR_HOST", url.clone()),
        // The C++ client.
        ("CLOUD_STORAGE_EMULATOR_ENDPOINT", url.clone()),
        // gcloud storage.
        ("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", format!("{url}/")),
        // gcsfs (Python) reads STORAGE_EMULATOR_HOST, but by default first
        // asks each bucket's layout over TLS gRPC on the same host:port. The
        // sidecar's port speaks plaintext, so every operation would wait out
        // gcsfs's 60 s retry budget before it falls back to the JSON API.
        ("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false".to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    })
    .collect()
}

/// An HTTP probe of the sidecar's admin listener. No `host`: the kubelet
/// probes from the node, so it must reach the pod IP (a `host` of 127.0.0.1
/// would be the node's own loopback, and Pod Security refuses it).
/// httpGet rather than `exec`: the image has no shell, and an exec probe
/// forks a process in the container at every period, which costs the node
/// more than one HTTP request.
fn admin_probe(path: &str, period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(ADMIN_PORT_NAME.to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

/// Requests and limits, sized from the memory figures on
/// docs/BENCHMARKS.md: the request covers a busy pod's 64 concurrent
/// streams; the limit leaves room for the 256 requests
/// --max-concurrent-requests admits and a few large metadata bodies. CPU is
/// requested but not limited: a CPU limit throttles every request it serves.
fn resources() -> ResourceRequirements {
    let quantity = |s: &str| Quantity(s.to_owned());
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_owned(), quantity("10m")),
                ("memory".to_owned(), quantity("24Mi")),
            ]
            .into(),
        ),
        limits: Some([("memory".to_owned(), quantity("96Mi"))].into()),
        ..ResourceRequirements::default()
    }
}

/// Non-root, nothing writable, no privilege: what Pod Security's
/// `restricted` profile asks of every container.
fn security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// The injected native sidecar container. The proxy listens on loopback
/// only (other pods must never use this pod's credentials through it), so
/// its port is not declared; the admin listener is on the pod IP.
pub fn sidecar_container(cfg: &InjectionConfig) -> Container {
    let mut args = vec![
        format!("--listen=127.0.0.1:{}", cfg.port),
        format!("--admin-addr=0.0.0.0:{}", cfg.admin_port),
        format!("--mapping-dir={MAP_MOUNT_PATH}"),
        format!("--drain-timeout={DRAIN_TIMEOUT}"),
        "--log-format=json".to_owned(),
    ];
    args.extend(cfg.extra_args.iter().cloned());
    Container {
        name: SIDECAR_NAME.to_owned(),
        image: Some(cfg.sidecar_image.clone()),
        // The image carries both binaries; its entrypoint is the operator.
        command: Some(vec!["bucketmap-sidecar".to_owned()]),
        args: Some(args),
        // A native sidecar: starts before the app containers, stops after.
        restart_policy: Some("Always".to_owned()),
        ports: Some(vec![ContainerPort {
            name: Some(ADMIN_PORT_NAME.to_owned()),
            container_port: i32::from(cfg.admin_port),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        // The app containers start once this passes: /readyz answers 200
        // once the map volume has been read, so no app runs before its map.
        startup_probe: Some(admin_probe("/readyz", 1, 30)),
        readiness_probe: Some(admin_probe("/readyz", 5, 3)),
        volume_mounts: Some(vec![VolumeMount {
            name: MAP_VOLUME.to_owned(),
            mount_path: MAP_MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        resources: Some(resources()),
        security_context: Some(security_context()),
        ..Container::default()
    }
}

/// Lets the injected sidecar follow the map through the API server: a
/// projected volume with the pod's ServiceAccount token (bound to the pod,
/// for the API server's audience, rotated by the kubelet), the cluster CA
/// and the namespace, and the flags to use it. Pods that opt out of a token
/// (`automountServiceAccountToken: false`) are not given one: their sidecar
/// serves the map from the volume alone.
fn follow_through_api(spec: &mut k8s_openapi::api::core::v1::PodSpec, cfg: &InjectionConfig) {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == TOKEN_VOLUME) {
        volumes.push(token_volume());
    }
    let Some(sidecar) = spec
        .init_containers
        .iter_mut()
        .flatten()
        .find(|c| c.name == SIDECAR_NAME)
    else {
        return;
    };
    sidecar.args.get_or_insert_with(Vec::new).extend([
        format!("--map-configmap={}", cfg.map_name),
        format!("--kube-credentials-dir={TOKEN_MOUNT_PATH}"),
        format!("--max-map-age={MAX_MAP_AGE}"),
    ]);
    sidecar
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: TOKEN_VOLUME.to_owned(),
            mount_path: TOKEN_MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
}

/// The projected volume of [`follow_through_api`], laid out as the
/// kubelet's own ServiceAccount volume: `token`, `ca.crt`, `namespace`.
fn token_volume() -> Volume {
    let token = VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            path: "token".to_owned(),
            expiration_seconds: Some(TOKEN_SECONDS),
            audience: None,
        }),
        ..VolumeProjection::default()
    };
    let ca = VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: "kube-root-ca.crt".to_owned(),
            items: Some(vec![KeyToPath {
                key: "ca.crt".to_owned(),
                path: "ca.crt".to_owned(),
                mode: None,
            }]),
            optional: None,
        }),
        ..VolumeProjection::default()
    };
    let namespace = VolumeProjection {
        downward_api: Some(DownwardAPIProjection {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "namespace".to_owned(),
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".to_owned()),
                    field_path: "metadata.namespace".to_owned(),
                }),
                ..DownwardAPIVolumeFile::default()
            }]),
        }),
        ..VolumeProjection::default()
    };
    Volume {
        name: TOKEN_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![token, ca, namespace]),
            default_mode: None,
        }),
        ..Volume::default()
    }
}

/// A warning for an injected pod that runs as its namespace's `default`
/// ServiceAccount: the sidecar forwards with the pod's credentials, and
/// `spec.access` grants a bucket to named ServiceAccounts.
pub fn default_account_warning(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref();
    let account = spec
        .and_then(|s| {
            s.service_account_name
                .as_deref()
                .or(s.service_account.as_deref())
        })
        .filter(|a| !a.is_empty());
    if account.is_some_and(|a| a != "default") {
        return None;
    }
    Some(
        "bucketmap: this pod runs as its namespace's default ServiceAccount; the \
         sidecar uses the pod's identity, and a Gcs resource grants its bucket to \
         named ServiceAccounts (spec.access): set serviceAccountName"
            .to_owned(),
    )
}

/// Why a pod that asks for the sidecar cannot have it, if it cannot: a
/// `hostNetwork` pod shares the node's loopback, where the sidecar's port
/// would be reachable by every process on the node (and taken by the first
/// such pod), each using the namespace's buckets and credentials.
pub fn refusal(pod: &Pod) -> Option<String> {
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    (wants_injection(pod) && !already_injected(pod) && host_network).then(|| {
        format!(
            "bucketmap-sidecar cannot be injected into a hostNetwork pod: its proxy port would \
             be on the node's loopback, open to every process on the node with this \
             namespace's buckets and credentials; drop hostNetwork, or the {INJECT_LABEL} label"
        )
    })
}

/// The pod with the sidecar injected, or `None` when nothing is to be done
/// (not labelled, or already injected).
pub fn inject(pod: &Pod, cfg: &InjectionConfig) -> Option<Pod> {
    if !wants_injection(pod) || already_injected(pod) {
        return None;
    }
    let mut pod = pod.clone();
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(annotations(cfg.port));
    let spec = pod.spec.get_or_insert_with(Default::default);

    // First, so that init containers after it can use GCS too.
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, sidecar_container(cfg));

    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == MAP_VOLUME) {
        volumes.push(Volume {
            name: MAP_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: cfg.map_name.clone(),
                // A namespace without Ready buckets yet has no map.
                optional: Some(true),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }

    if spec.automount_service_account_token != Some(false) {
        follow_through_api(spec, cfg);
    }

    let env = client_env(cfg.port);
    let app_init = spec
        .init_containers
        .iter_mut()
        .flatten()
        .filter(|c| c.name != SIDECAR_NAME);
    for container in spec.containers.iter_mut().chain(app_init) {
        let vars = container.env.get_or_insert_with(Vec::new);
        for var in &env {
            // A value the app set itself wins.
            if !vars.iter().any(|v| v.name == var.name) {
                vars.push(var.clone());
            }
        }
    }
    Some(pod)
}

/// The JSON patch turning `pod` into its injected form, if any.
pub fn patch(
    pod: &Pod,
    cfg: &InjectionConfig,
) -> Result<Option<json_patch::Patch>, serde_json::Error> {
    let Some(injected) = inject(pod, cfg) else {
        return Ok(None);
    };
    Ok(Some(json_patch::diff(
        &serde_json::to_value(pod)?,
        &serde_json::to_value(&injected)?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_running_as_the_default_service_account_is_warned() {
        let pod_as = |account: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "app"},
                "spec": {"containers": [{"name": "app"}], "serviceAccountName": account},
            }))
            .expect("pod parses")
        };
        assert_eq!(default_account_warning(&pod_as("photo-app".into())), None);
        for account in [serde_json::Value::Null, "default".into(), "".into()] {
            let warning = default_account_warning(&pod_as(account.clone()));
            assert!(
                warning.is_some_and(|w| w.contains("serviceAccountName")),
                "{account}"
            );
        }
    }

    fn cfg() -> InjectionConfig {
        InjectionConfig {
            sidecar_image: "bucketmap/bucketmap:test".into(),
            port: 9023,
            admin_port: 9024,
            map_name: "bucketmap".into(),
            extra_args: Vec::new(),
        }
    }

    fn pod(labelled: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app", "labels": if labelled { serde_json::json!({INJECT_LABEL: "true"}) } else { serde_json::json!({}) }},
            "spec": {
                "initContainers": [{"name": "migrate", "image": "app"}],
                "containers": [
                    {"name": "app", "image": "app", "env": [{"name": "STORAGE_EMULATOR_HOST", "value": "http://custom:1"}]},
                    {"name": "worker", "image": "app"}
                ]
            }
        }))
        .expect("pod parses")
    }

    #[test]
    fn the_sidecar_follows_the_map_with_a_projected_token_unless_the_pod_opts_out() {
        let sidecar_of = |pod: &Pod| {
            let spec = pod.spec.clone().expect("spec");
            let sidecar = spec.init_containers.expect("init")[0].clone();
            (spec.volumes.unwrap_or_default(), sidecar)
        };
        let (volumes, sidecar) = sidecar_of(&inject(&pod(true), &cfg()).expect("injected"));
        let args = sidecar.args.clone().unwrap_or_default();
        for want in [
            "--map-configmap=bucketmap".to_owned(),
            format!("--kube-credentials-dir={TOKEN_MOUNT_PATH}"),
            format!("--max-map-age={MAX_MAP_AGE}"),
            format!("--mapping-dir={MAP_MOUNT_PATH}"),
        ] {
            assert!(args.contains(&want), "{want} not in {args:?}");
        }
        let token = volumes
            .iter()
            .find(|v| v.name == TOKEN_VOLUME)
            .and_then(|v| v.projected.clone())
            .and_then(|p| p.sources)
            .expect("token volume");
        let projection = token[0]
            .service_account_token
            .clone()
            .expect("a token projection");
        assert_eq!(projection.expiration_seconds, Some(TOKEN_SECONDS));
        assert_eq!(
            token[1].config_map.as_ref().map(|c| c.name.as_str()),
            Some("kube-root-ca.crt")
        );
        assert!(token[2].downward_api.is_some());
        let mounts = sidecar.volume_mounts.unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == TOKEN_VOLUME && m.read_only == Some(true))
        );
        let mut opted_out = pod(true);
        if let Some(spec) = opted_out.spec.as_mut() {
            spec.automount_service_account_token = Some(false);
        }
        let (volumes, sidecar) = sidecar_of(&inject(&opted_out, &cfg()).expect("injected"));
        assert!(volumes.iter().all(|v| v.name != TOKEN_VOLUME));
        let args = sidecar.args.unwrap_or_default();
        assert!(args.iter().all(|a| !a.starts_with("--map-configmap")));
        assert!(args.contains(&format!("--mapping-dir={MAP_MOUNT_PATH}")));
    }

    #[test]
    fn a_labelled_pod_gets_the_native_sidecar_the_map_and_the_env() {
        let injected = inject(&pod(true), &cfg()).expect("injected");
        let spec = injected.spec.expect("spec");
        let init = spec.init_containers.expect("init containers");
        assert_eq!(init[0].name, SIDECAR_NAME);
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        assert_eq!(init[1].name, "migrate");
        let mount = &init[0].volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(
            (mount.name.as_str(), mount.read_only),
            (MAP_VOLUME, Some(true))
        );
        let volume = spec
            .volumes
            .expect("volumes")
            .into_iter()
            .find(|v| v.name == MAP_VOLUME)
            .expect("map volume");
        assert_eq!(
            volume.config_map.map(|c| c.name),
            Some("bucketmap".to_owned())
        );
        let security = init[0].security_context.clone().expect("security context");
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        let env_of = |c: &Container, name: &str| {
            c.env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            env_of(&spec.containers[0], "STORAGE_EMULATOR_HOST").as_deref(),
            Some("http://custom:1"),
            "the app's own value wins"
        );
        assert_eq!(
            env_of(&spec.containers[1], "STORAGE_EMULATOR_HOST").as_deref(),
            Some("http://127.0.0.1:9023")
        );
        assert_eq!(
            env_of(&init[1], "CLOUD_STORAGE_EMULATOR_ENDPOINT").as_deref(),
            Some("http://127.0.0.1:9023")
        );
        assert_eq!(
            env_of(&spec.containers[1], "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT").as_deref(),
            Some("false"),
            "gcsfs does not wait for a TLS gRPC lookup the sidecar cannot answer"
        );
        assert_eq!(
            env_of(&init[0], "STORAGE_EMULATOR_HOST"),
            None,
            "the sidecar itself is not pointed at itself"
        );
    }

    #[test]
    fn the_probes_reach_the_admin_port_on_the_pod_ip_and_the_proxy_stays_on_loopback() {
        let c = sidecar_container(&cfg());
        let ports = c.ports.clone().expect("ports");
        assert_eq!(
            ports
                .iter()
                .map(|p| (p.name.as_deref(), p.container_port))
                .collect::<Vec<_>>(),
            vec![(Some(ADMIN_PORT_NAME), 9024)],
            "only the admin port is declared: the proxy is not reachable on the pod IP"
        );
        for probe in [c.startup_probe.clone(), c.readiness_probe.clone()] {
            let get = probe.expect("probe").http_get.expect("an httpGet probe");
            assert_eq!(get.host, None, "the kubelet probes the pod IP");
            assert_eq!(get.port, IntOrString::String(ADMIN_PORT_NAME.to_owned()));
            assert_eq!(get.path.as_deref(), Some("/readyz"));
        }
        let args = c.args.expect("args");
        for arg in ["--listen=127.0.0.1:9023", "--admin-addr=0.0.0.0:9024"] {
            assert!(args.iter().any(|a| a == arg), "{args:?} lacks {arg}");
        }
    }

    #[test]
    fn the_pod_says_how_each_client_family_reaches_the_sidecar() {
        let injected = inject(&pod(true), &cfg()).expect("injected");
        let annotations = injected.metadata.annotations.expect("annotations");
        assert_eq!(
            annotations.get(ENDPOINT_ANNOTATION).map(String::as_str),
            Some("http://127.0.0.1:9023")
        );
        let clients = &annotations[CLIENTS_ANNOTATION];
        for needle in ["Node.js", "apiEndpoint", "Java", "setHost", "C++", "gcloud"] {
            assert!(clients.contains(needle), "{clients} lacks {needle}");
        }
    }

    #[test]
    fn host_network_pods_are_refused_only_when_they_ask_for_the_sidecar() {
        let mut labelled = pod(true);
        assert_eq!(refusal(&labelled), None);
        if let Some(spec) = labelled.spec.as_mut() {
            spec.host_network = Some(true);
        }
        let why = refusal(&labelled).expect("a refusal");
        assert!(why.contains("hostNetwork"), "{why}");
        let mut unlabelled = pod(false);
        if let Some(spec) = unlabelled.spec.as_mut() {
            spec.host_network = Some(true);
        }
        assert_eq!(refusal(&unlabelled), None);
    }

    #[test]
    fn unlabelled_and_already_injected_pods_are_left_alone() {
        assert!(inject(&pod(false), &cfg()).is_none());
        let once = inject(&pod(true), &cfg()).expect("injected");
        assert!(inject(&once, &cfg()).is_none());
        assert!(patch(&once, &cfg()).expect("patch").is_none());
    }

    #[test]
    fn the_patch_applied_to_the_pod_gives_the_injected_pod() {
        let original = pod(true);
        let p = patch(&original, &cfg())
            .expect("patch")
            .expect("some patch");
        let mut value = serde_json::to_value(&original).expect("json");
        json_patch::patch(&mut value, &p).expect("patch applies");
        let expected =
            serde_json::to_value(inject(&original, &cfg()).expect("injected")).expect("json");
        assert_eq!(value, expected);
    }
}
