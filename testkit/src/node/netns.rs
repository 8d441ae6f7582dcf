//! The node's network namespace: created with `ip netns`, entered by a
//! thread with `setns(2)`, and reached from the machine only through
//! loopback forwarders that the harness runs.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use anyhow::{Context as _, Result, bail};

/// Where `ip netns add` bind-mounts a namespace.
const NETNS_DIR: &str = "/run/netns";

/// Path of the named network namespace's bind mount.
pub(crate) fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Runs `ip ARGS`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Creates the namespace `name` with loopback up and `node_ip` (a /32) on
/// it: the node's address, which pods reach through their bridge gateway.
/// The Service range gets a route too (from the node's address), or the
/// node's own processes (the API server calling a webhook) could not even
/// connect to a cluster IP for kube-proxy's rules to translate. Nothing
/// outside the namespace is configured.
pub(crate) fn create(name: &str, node_ip: &str, service_range: &str) -> Result<()> {
    let node_addr = format!("{node_ip}/32");
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"])?;
    ip(&["-n", name, "addr", "add", &node_addr, "dev", "lo"])?;
    let route = ["route", "add", service_range, "dev", "lo", "src", node_ip];
    ip(&[&["-n", name][..], &route[..]].concat())?;
    Ok(())
}

/// Moves the calling thread into the namespace at `path`.
#[allow(unsafe_code)]
fn enter(path: &Path) -> io::Result<()> {
    let ns = File::open(path)?;
    // SAFETY: setns only reads the descriptor, which stays open for the
    // call; it changes the network namespace of the calling thread alone.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Runs `f` on a new thread inside the namespace and returns its result.
/// Sockets made there keep their namespace wherever they are used later.
pub(crate) fn run_in<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let path = netns_path(name);
    thread::spawn(move || {
        enter(&path).with_context(|| format!("cannot enter {}", path.display()))?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread inside the node's namespace panicked"))?
}

/// A listener bound to `addr` inside the namespace.
pub(crate) fn bind_in(name: &str, addr: SocketAddr) -> Result<TcpListener> {
    run_in(name, move || {
        let listener =
            TcpListener::bind(addr).with_context(|| format!("cannot bind {addr} in the node"))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
}

/// Forwards connections from a loopback port of the machine to `target`
/// inside the namespace, for as long as it lives.
pub struct Forwarder {
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`.
    pub(crate) async fn start(netns: &str, target: SocketAddr) -> Result<Forwarder> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind a loopback port for the forwarder")?;
        let local = listener.local_addr()?;
        let netns = netns.to_owned();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let netns = netns.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = connect_in(&netns, target).await else {
                        return;
                    };
                    let Ok(mut outbound) = tokio::net::TcpStream::from_std(outbound) else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Ok(Forwarder { local, task })
    }

    /// The loopback address clients on the machine use.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection to `target` made from inside the namespace.
async fn connect_in(netns: &str, target: SocketAddr) -> Result<std::net::TcpStream> {
    let netns = netns.to_owned();
    tokio::task::spawn_blocking(move || {
        run_in(&netns, move || {
            let stream = std::net::TcpStream::connect(target)
                .with_context(|| format!("cannot connect to {target} in the node"))?;
            stream.set_nonblocking(true)?;
            Ok(stream)
        })
    })
    .await
    .context("the connecting task panicked")?
}
