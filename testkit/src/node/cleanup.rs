//! Taking the node down, completely: every process in its namespace and in
//! its pods' cgroups, every mount under its state directory, its network
//! namespace, its cgroups, the machine-wide sysctls the kubelet changed, and
//! its files. Runs at every stop and, before a start, over whatever a
//! crashed run left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use super::layout::{CNI_NETWORK, CONTAINERD_NAMESPACE, Layout, NETNS};
use super::netns::{ip, netns_path};

/// The sysctls the kubelet sets for the whole machine when it starts
/// (`protectKernelDefaults: false`); recorded first, put back at cleanup.
const KUBELET_SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

/// Records the machine's values of [`KUBELET_SYSCTLS`], unless a record
/// from an earlier, unfinished run is there (it holds the originals).
pub(crate) fn record_sysctls(layout: &Layout) -> Result<()> {
    let path = layout.sysctls();
    if path.exists() {
        return Ok(());
    }
    let mut values = BTreeMap::new();
    for name in KUBELET_SYSCTLS {
        let file = Path::new("/proc/sys").join(name);
        let value = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        values.insert(name.to_owned(), value.trim().to_owned());
    }
    super::config::write(&path, &serde_json::to_string(&values)?)
}

fn restore_sysctls(layout: &Layout) -> Result<()> {
    let path = layout.sysctls();
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let values: BTreeMap<String, String> =
        serde_json::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?;
    for (name, value) in values {
        let file = Path::new("/proc/sys").join(&name);
        std::fs::write(&file, &value)
            .with_context(|| format!("cannot put {} back to {value}", file.display()))?;
    }
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))
}

/// Creates the pods' cgroup root in every controller the kubelet uses (it
/// refuses a root with missing paths); cpuset's gets its parent's CPUs and
/// memory nodes, without which no task may join it.
pub(crate) fn create_cgroup_root(layout: &Layout) -> Result<()> {
    let controllers = std::fs::read_dir("/sys/fs/cgroup").context("cannot list /sys/fs/cgroup")?;
    for controller in controllers.flatten() {
        let parent = controller.path();
        if parent.ends_with("unified") || !parent.join("cgroup.procs").exists() {
            continue;
        }
        let dir = parent.join(layout.cgroup_root().trim_start_matches('/'));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for inherited in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(parent.join(inherited)) {
                std::fs::write(dir.join(inherited), value.trim())
                    .with_context(|| format!("cannot set {}", dir.join(inherited).display()))?;
            }
        }
    }
    Ok(())
}

/// Takes down everything the node left on the machine. Idempotent.
pub(crate) fn sweep(layout: &Layout) -> Result<()> {
    kill_everything(layout)?;
    unmount_under(&layout.dir)?;
    if netns_path(NETNS).exists() {
        ip(&["netns", "delete", NETNS])?;
    }
    remove_cgroups(layout)?;
    remove_container_log_links(layout)?;
    remove_runtime_leftovers(layout)?;
    restore_sysctls(layout)?;
    if layout.dir.exists() {
        std::fs::remove_dir_all(&layout.dir)
            .with_context(|| format!("cannot remove {}", layout.dir.display()))?;
    }
    Ok(())
}

/// SIGKILLs the node's daemons and shims (its namespace's processes) and
/// its containers (its cgroups' processes) until none is left.
fn kill_everything(layout: &Layout) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pids = netns_pids()?;
        pids.extend(cgroup_pids(layout));
        if pids.is_empty() {
            return Ok(());
        }
        for pid in &pids {
            // Gone already is fine; anything else shows in the next round.
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "processes of the node survived SIGKILL for 30 s: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn netns_pids() -> Result<Vec<u32>> {
    if !netns_path(NETNS).exists() {
        return Ok(Vec::new());
    }
    let out = Command::new("ip")
        .args(["netns", "pids", NETNS])
        .output()
        .context("cannot run `ip netns pids`")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Every cgroup directory of the pods, deepest first, in every controller.
fn cgroup_dirs(layout: &Layout) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return dirs;
    };
    for controller in controllers.flatten() {
        let root = controller
            .path()
            .join(layout.cgroup_root().trim_start_matches('/'));
        collect_dirs(&root, &mut dirs);
    }
    dirs
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
    out.push(dir.to_path_buf());
}

fn cgroup_pids(layout: &Layout) -> Vec<u32> {
    cgroup_dirs(layout)
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn remove_cgroups(layout: &Layout) -> Result<()> {
    for dir in cgroup_dirs(layout) {
        std::fs::remove_dir(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    Ok(())
}

/// Lazily unmounts every mount point under `dir`, deepest first.
fn unmount_under(dir: &Path) -> Result<()> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").context("cannot read mountinfo")?;
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for point in points {
        let status = Command::new("umount")
            .args(["-l", point])
            .status()
            .context("cannot run umount")?;
        anyhow::ensure!(status.success(), "cannot unmount {point}");
    }
    Ok(())
}

/// What containerd 1.6, runc, the CNI plugins and the kubelet keep at fixed
/// paths of the machine, whatever their configuration says: runc's state
/// and the shims' sockets under `/run/containerd` (for the node's tasks,
/// named in its own state directory), the CNI results of the node's
/// network in `/var/lib/cni/results`, and the kubelet's device-plugin
/// socket. Another containerd's files are never touched.
fn remove_runtime_leftovers(layout: &Layout) -> Result<()> {
    use sha2::{Digest as _, Sha256};
    let tasks = layout
        .containerd_state()
        .join("io.containerd.runtime.v2.task")
        .join(CONTAINERD_NAMESPACE);
    let ids: Vec<String> = std::fs::read_dir(&tasks)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let socket = layout.containerd_socket();
    let mut stale = Vec::new();
    for id in &ids {
        stale.push(
            Path::new("/run/containerd/runc")
                .join(CONTAINERD_NAMESPACE)
                .join(id),
        );
        // containerd names a shim's socket by the hash of its address,
        // namespace and task id.
        let key = socket.join(CONTAINERD_NAMESPACE).join(id);
        let hash = Sha256::digest(key.as_os_str().as_encoded_bytes());
        let name: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        stale.push(Path::new("/run/containerd/s").join(name));
    }
    if let Ok(results) = std::fs::read_dir("/var/lib/cni/results") {
        stale.extend(
            results
                .flatten()
                .map(|e| e.path())
                .filter(|path| cni_result_is_ours(path, layout)),
        );
    }
    stale.push(PathBuf::from(
        "/var/lib/kubelet/device-plugins/kubelet.sock",
    ));
    for path in stale {
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(_) => continue,
        };
        removed.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    remove_empty_runtime_dirs();
    Ok(())
}

/// A cached CNI result of the node: its network's (named after it), or one
/// whose interfaces live in a network namespace under the node's state
/// directory (the loopback plugin's, `cni-loopback-<sandbox>-lo`).
fn cni_result_is_ours(path: &Path, layout: &Layout) -> bool {
    let named = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{CNI_NETWORK}-")));
    let Ok(text) = std::fs::read_to_string(path) else {
        return named;
    };
    let Ok(cached) = serde_json::from_str::<serde_json::Value>(&text) else {
        return named;
    };
    let interfaces = cached["result"]["interfaces"].as_array();
    named
        || interfaces.into_iter().flatten().any(|i| {
            i["sandbox"]
                .as_str()
                .is_some_and(|s| Path::new(s).starts_with(&layout.dir))
        })
}

/// The directories containerd and the kubelet create at those fixed paths,
/// removed when the node's files were all they held (a directory that
/// still holds anything, another runtime's for instance, stays).
fn remove_empty_runtime_dirs() {
    for dir in [
        "/run/containerd/runc/k8s.io",
        "/run/containerd/runc",
        "/run/containerd/s",
        "/run/containerd",
        "/var/lib/cni/results",
        "/var/lib/cni",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet",
    ] {
        // Not empty or absent: left as it is.
        let _ = std::fs::remove_dir(dir);
    }
}

/// The kubelet links every container's log into `/var/log/containers`,
/// whatever its configuration says; the links into the node's pod logs go.
fn remove_container_log_links(layout: &Layout) -> Result<()> {
    let Ok(entries) = std::fs::read_dir("/var/log/containers") else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let ours = std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(&layout.dir));
        if ours {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    Ok(())
}
