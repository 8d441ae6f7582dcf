//! The pod mutation: the sidecar as a native sidecar (an init container with
//! `restartPolicy: Always`), the bucket map mounted read-only, and every app
//! container pointed at it. Pure functions, unit-tested here.

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, HTTPGetAction, Pod,
    Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
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

/// What to inject.
#[derive(Debug, Clone)]
pub struct InjectionConfig {
    /// Image of `bucketmap-sidecar`.
    pub sidecar_image: String,
    /// Loopback port the sidecar listens on.
    pub port: u16,
    /// Name of the namespace's bucket map ConfigMap.
    pub map_name: String,
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

/// Environment that points each GCS client library at the sidecar.
pub fn client_env(port: u16) -> Vec<EnvVar> {
    let url = format!("http://127.0.0.1:{port}");
    [
        // Python, Go and Node clients.
        ("STORAGE_EMULATOR_HOST", url.clone()),
        // The C++ client.
        ("CLOUD_STORAGE_EMULATOR_ENDPOINT", url.clone()),
        // gcloud storage.
        ("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", format!("{url}/")),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    })
    .collect()
}

/// The injected native sidecar container.
pub fn sidecar_container(cfg: &InjectionConfig) -> Container {
    let quantity = |s: &str| Quantity(s.to_owned());
    Container {
        name: SIDECAR_NAME.to_owned(),
        image: Some(cfg.sidecar_image.clone()),
        // The image carries both binaries; its entrypoint is the operator.
        command: Some(vec!["bucketmap-sidecar".to_owned()]),
        args: Some(vec![
            format!("--listen=127.0.0.1:{}", cfg.port),
            format!("--mapping-dir={MAP_MOUNT_PATH}"),
            "--log-format=json".to_owned(),
        ]),
        // A native sidecar: starts before the app containers, stops after.
        restart_policy: Some("Always".to_owned()),
        ports: Some(vec![ContainerPort {
            name: Some("gcs-proxy".to_owned()),
            container_port: i32::from(cfg.port),
            ..ContainerPort::default()
        }]),
        startup_probe: Some(Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
                port: IntOrString::Int(i32::from(cfg.port)),
                host: Some("127.0.0.1".to_owned()),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(30),
            ..Probe::default()
        }),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/_bucketmap/readyz".to_owned()),
                port: IntOrString::Int(i32::from(cfg.port)),
                host: Some("127.0.0.1".to_owned()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: MAP_VOLUME.to_owned(),
            mount_path: MAP_MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_owned(), quantity("10m")),
                    ("memory".to_owned(), quantity("16Mi")),
                ]
                .into(),
            ),
            limits: Some([("memory".to_owned(), quantity("64Mi"))].into()),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
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
        }),
        ..Container::default()
    }
}

/// The pod with the sidecar injected, or `None` when nothing is to be done
/// (not labelled, or already injected).
pub fn inject(pod: &Pod, cfg: &InjectionConfig) -> Option<Pod> {
    if !wants_injection(pod) || already_injected(pod) {
        return None;
    }
    let mut pod = pod.clone();
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

    fn cfg() -> InjectionConfig {
        InjectionConfig {
            sidecar_image: "bucketmap/bucketmap:test".into(),
            port: 9023,
            map_name: "bucketmap".into(),
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
            env_of(&init[0], "STORAGE_EMULATOR_HOST"),
            None,
            "the sidecar itself is not pointed at itself"
        );
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
