//! The injected sidecar as a kubelet sees it. The test takes the container
//! the webhook injects, runs the real `bucketmap-sidecar` with its command
//! line, user and group inside a network namespace of its own (the pod, with
//! a pod IP on one end of a veth pair), and probes it exactly as the kubelet
//! does: from the root namespace (the node), against the pod IP (or the
//! probe's `host` when it names one), with the probe's port (a name is
//! looked up in the container's ports), path and scheme, on the probe's
//! schedule; HTTP 200-399 or an accepted TCP connection is a success.
//!
//! It needs root and `ip` (iproute2); without them it fails, unless
//! `BUCKETMAP_SKIP_NETNS_TESTS=1` (see README.md; refused under `CI=true`,
//! where it fails naming the variable).

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use bucketmap::webhook::inject::{ADMIN_PORT_NAME, InjectionConfig, sidecar_container};
use common::mapping_dir::MappingDir;
use common::procs::{Proc, Sidecar, log_tail};
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const SKIP_VAR: &str = "BUCKETMAP_SKIP_NETNS_TESTS";

/// Whether the test can run here; fails with the reason when it cannot,
/// unless it is told to skip.
fn netns_available() -> bool {
    let problem = if !is_root() {
        Some("needs root (it creates a network namespace and a veth pair)")
    } else if Command::new("ip").arg("-V").output().is_err() {
        Some("needs `ip` (iproute2), which is not installed")
    } else {
        None
    };
    match problem {
        None => true,
        // Refused under CI=true (testkit's switches): CI runs it.
        Some(problem) if bucketmap_testkit::switches::flag(SKIP_VAR) => {
            eprintln!("SKIPPED: this test {problem}, and {SKIP_VAR}=1");
            false
        }
        Some(problem) => panic!(
            "this test {problem}: run it as root with iproute2 installed, \
             or set {SKIP_VAR}=1 to skip it"
        ),
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("cannot run ip {args:?}"))?;
    ensure!(
        out.status.success(),
        "ip {args:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A pod's network: a namespace with loopback up and one end of a veth pair
/// holding the pod IP; the other end (the node's) in the root namespace. Both
/// are removed on drop, whatever happened.
struct PodNetwork {
    netns: String,
    node_link: String,
    pod_ip: Ipv4Addr,
}

impl PodNetwork {
    fn create() -> Result<PodNetwork> {
        let pid = std::process::id();
        let (node_ip, pod_ip) = free_slash_30(pid)?;
        // From here on, dropping `net` removes whatever was made.
        let net = PodNetwork {
            netns: format!("bucketmap-probe-{pid}"),
            node_link: format!("bmnode{pid}"),
            pod_ip,
        };
        let pod_link = format!("bmpod{pid}");
        ip(&["netns", "add", &net.netns])?;
        ip(&[
            "link",
            "add",
            &net.node_link,
            "type",
            "veth",
            "peer",
            "name",
            &pod_link,
        ])?;
        ip(&["link", "set", &pod_link, "netns", &net.netns])?;
        ip(&[
            "addr",
            "add",
            &format!("{node_ip}/30"),
            "dev",
            &net.node_link,
        ])?;
        ip(&["link", "set", &net.node_link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &net.netns, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &format!("{pod_ip}/30"), "dev", &pod_link])?;
        inside(&["link", "set", &pod_link, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(net)
    }

    /// `program args…` inside the pod's network namespace.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns]).arg(program);
        cmd
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both.
        let _ = ip(&["link", "del", &self.node_link]);
        if let Err(e) = ip(&["netns", "del", &self.netns]) {
            eprintln!("cannot remove network namespace {}: {e:#}", self.netns);
        }
    }
}

/// A /30 in 10.213.0.0/16 that no interface uses: (node end, pod end).
fn free_slash_30(seed: u32) -> Result<(Ipv4Addr, Ipv4Addr)> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .context("cannot list addresses")?;
    let used = String::from_utf8_lossy(&out.stdout);
    let base = u32::from(Ipv4Addr::new(10, 213, 0, 0));
    for attempt in 0..64u32 {
        let subnet = base + (seed.wrapping_add(attempt.wrapping_mul(7919)) % 16384) * 4;
        let (node, pod) = (Ipv4Addr::from(subnet + 1), Ipv4Addr::from(subnet + 2));
        if !used.contains(&format!(" {node}/")) && !used.contains(&format!(" {pod}/")) {
            return Ok((node, pod));
        }
    }
    bail!("no free /30 in 10.213.0.0/16:\n{used}")
}

/// What the probe reached: an HTTP status, or a TCP connection.
fn probe_once(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Result<String, String> {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let target = |host: &Option<String>, port: &IntOrString| -> Result<SocketAddr, String> {
        let ip = match host {
            // The kubelet probes the pod IP unless the probe names a host.
            None => IpAddr::V4(pod_ip),
            Some(host) => host
                .parse()
                .map_err(|_| format!("host {host:?} is not an IP address"))?,
        };
        Ok(SocketAddr::new(ip, container_port(container, port)?))
    };
    if let Some(get) = &probe.http_get {
        let scheme = get.scheme.as_deref().unwrap_or("HTTP");
        if scheme != "HTTP" {
            return Err(format!("scheme {scheme}: this test speaks plain HTTP only"));
        }
        let addr = target(&get.host, &get.port)?;
        let path = get.path.as_deref().unwrap_or("/");
        let status = http_get(addr, path, timeout).map_err(|e| format!("{e:#}"))?;
        return if (200..400).contains(&status) {
            Ok(format!("HTTP {status} from {addr}{path}"))
        } else {
            Err(format!("HTTP {status} from {addr}{path}"))
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let addr = target(&tcp.host, &tcp.port)?;
        return TcpStream::connect_timeout(&addr, timeout)
            .map(|_| format!("connected to {addr}"))
            .map_err(|e| format!("cannot connect to {addr}: {e}"));
    }
    Err("neither httpGet nor tcpSocket: this test performs no other probe".to_owned())
}

/// A probe's port as the kubelet resolves it: a number, or the name of one
/// of the container's own ports.
fn container_port(container: &Container, port: &IntOrString) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| format!("the container has no port named {name:?}"))?,
    };
    u16::try_from(number).map_err(|_| format!("port {number} is out of range"))
}

/// The kubelet's HTTP probe request; the status code of the answer.
fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.34\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .with_context(|| format!("no complete answer from {addr}{path}"))?;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP answer from {addr}{path}: {text:?}"))
}

/// Runs `probe` on the kubelet's schedule (initialDelaySeconds, then every
/// periodSeconds) until successThreshold successes or failureThreshold
/// failures in a row.
fn kubelet_probe(
    what: &str,
    probe: &Probe,
    container: &Container,
    pod_ip: Ipv4Addr,
    sidecar: &mut Proc,
) -> Result<String> {
    let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
    let (needed, allowed) = (
        probe.success_threshold.unwrap_or(1),
        probe.failure_threshold.unwrap_or(3),
    );
    thread::sleep(Duration::from_secs(
        probe.initial_delay_seconds.unwrap_or(0).max(0) as u64,
    ));
    let (mut successes, mut failures) = (0, 0);
    loop {
        sidecar.check_running()?;
        let started = Instant::now();
        match probe_once(probe, container, pod_ip) {
            Ok(seen) => {
                (successes, failures) = (successes + 1, 0);
                if successes >= needed {
                    return Ok(seen);
                }
            }
            Err(seen) => {
                (successes, failures) = (0, failures + 1);
                if failures >= allowed {
                    bail!(
                        "{what} probe failed {failures} times in a row, last: {seen}\n{}",
                        log_tail(&sidecar.log, 30)
                    );
                }
            }
        }
        thread::sleep(period.saturating_sub(started.elapsed()));
    }
}

/// The injected container's command line, as the container runtime would
/// run it: the image's `bucketmap-sidecar` is the binary under test, and each
/// volume's mount path is where the test lays the volume out.
fn command_line(container: &Container, volumes: &Path) -> Result<Vec<String>> {
    let command = container.command.clone().unwrap_or_default();
    ensure!(
        command == ["bucketmap-sidecar"],
        "unexpected command {command:?}"
    );
    let mut args = container.args.clone().unwrap_or_default();
    for mount in container.volume_mounts.iter().flatten() {
        let local = volumes.join(&mount.name);
        for arg in &mut args {
            *arg = arg.replace(&mount.mount_path, &local.to_string_lossy());
        }
    }
    Ok(args)
}

/// The sidecar in the pod's network namespace, as the spec's user and group.
fn start_sidecar(net: &PodNetwork, container: &Container, dir: &Path) -> Result<Proc> {
    let security = container.security_context.clone().unwrap_or_default();
    let mut cmd = net.command(Path::new("setpriv"));
    if let Some(uid) = security.run_as_user {
        cmd.arg(format!("--reuid={uid}"));
    }
    if let Some(gid) = security.run_as_group {
        cmd.arg(format!("--regid={gid}"));
    }
    cmd.args(["--clear-groups", "--inh-caps=-all", "--no-new-privs"])
        .arg(Sidecar::bin())
        .args(command_line(container, &dir.join("volumes"))?)
        // The container's environment: the spec sets none.
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", dir)
        .env("RUST_LOG", "info");
    Proc::spawn("bucketmap-sidecar", &mut cmd, dir.join("sidecar.log"))
}

/// The answer to `GET path` on 127.0.0.1:`port` seen from inside the pod.
fn get_inside_pod(net: &PodNetwork, port: u16, path: &str) -> Result<String> {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && \
         printf 'GET {path} HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && \
         timeout 5 cat <&3"
    );
    let out = net
        .command(Path::new("bash"))
        .args(["-c", &script])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The port of `--listen=ADDR` in the container's args, checked to be loopback.
fn proxy_port(container: &Container) -> Result<u16> {
    let listen: SocketAddr = container
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--listen="))
        .context("no --listen")?
        .parse()?;
    ensure!(listen.ip().is_loopback(), "the proxy listens on {listen}");
    Ok(listen.port())
}

/// Before the map volume can be read, the admin listener answers and both
/// probes fail with 503: the app containers would not start yet.
fn assert_not_ready_before_the_map_is_read(
    container: &Container,
    net: &PodNetwork,
    sidecar: &mut Proc,
) -> Result<()> {
    let startup = container.startup_probe.clone().context("startupProbe")?;
    let readiness = container
        .readiness_probe
        .clone()
        .context("readinessProbe")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = loop {
        sidecar.check_running()?;
        match probe_once(&startup, container, net.pod_ip) {
            Err(seen) if seen.starts_with("HTTP ") => break seen,
            Ok(seen) => bail!("the startup probe passed before the map was read: {seen}"),
            Err(seen) if Instant::now() > deadline => bail!(
                "the startup probe never got an HTTP answer: {seen}\n{}",
                log_tail(&sidecar.log, 30)
            ),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    };
    ensure!(before.starts_with("HTTP 503"), "startup probe: {before}");
    let seen = probe_once(&readiness, container, net.pod_ip);
    ensure!(
        seen.as_ref().is_err_and(|s| s.starts_with("HTTP 503")),
        "readiness probe before the map was read: {seen:?}"
    );
    Ok(())
}

/// The proxy serves inside the pod and cannot be reached from the node; the
/// admin listener, which can, never proxies.
fn assert_the_proxy_is_pod_local(container: &Container, net: &PodNetwork) -> Result<()> {
    let port = proxy_port(container)?;
    let inside = get_inside_pod(net, port, "/_bucketmap/healthz")?;
    ensure!(
        inside.starts_with("HTTP/1.1 200"),
        "the proxy inside the pod: {inside:?}"
    );
    let outside = SocketAddr::from((net.pod_ip, port));
    ensure!(
        TcpStream::connect_timeout(&outside, Duration::from_secs(2)).is_err(),
        "the proxy port {outside} is reachable from outside the pod"
    );
    let admin_port = container_port(container, &IntOrString::String(ADMIN_PORT_NAME.to_owned()))
        .map_err(|e| anyhow!(e))?;
    let admin = SocketAddr::from((net.pod_ip, admin_port));
    let status = http_get(admin, "/storage/v1/b/photos/o", Duration::from_secs(2))?;
    ensure!(
        status == 404,
        "a GCS path on the admin listener answered {status}"
    );
    Ok(())
}

#[test]
fn the_kubelet_reaches_the_probes_on_the_pod_ip_and_not_the_proxy() -> Result<()> {
    if !netns_available() {
        return Ok(());
    }
    let container = sidecar_container(&InjectionConfig {
        sidecar_image: "bucketmap/bucketmap:test".into(),
        port: 9023,
        admin_port: 9024,
        map_name: "bucketmap".into(),
        extra_args: Vec::new(),
    });
    let startup = container.startup_probe.clone().context("startupProbe")?;
    let readiness = container
        .readiness_probe
        .clone()
        .context("readinessProbe")?;
    let dir = tempfile::tempdir()?;
    // The spec's user must reach the volumes, as the kubelet's mounts allow.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    std::fs::create_dir(dir.path().join("volumes"))?;

    let net = PodNetwork::create()?;
    let mut sidecar = start_sidecar(&net, &container, dir.path())?;

    assert_not_ready_before_the_map_is_read(&container, &net, &mut sidecar)?;

    // The kubelet mounts the map: here an optional ConfigMap that does not
    // exist yet (a namespace without Ready Gcs), an empty volume.
    let map_volume = container
        .volume_mounts
        .iter()
        .flatten()
        .next()
        .context("the map volume mount")?;
    let _volume = MappingDir::new(dir.path().join("volumes").join(&map_volume.name), &[])?;
    let seen = kubelet_probe("startup", &startup, &container, net.pod_ip, &mut sidecar)?;
    eprintln!("startup probe: {seen}");
    let seen = kubelet_probe(
        "readiness",
        &readiness,
        &container,
        net.pod_ip,
        &mut sidecar,
    )?;
    eprintln!("readiness probe: {seen}");

    assert_the_proxy_is_pod_local(&container, &net)?;
    sidecar.check_running()?;
    Ok(())
}
