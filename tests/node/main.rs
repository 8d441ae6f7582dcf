//! The product on a real node: a single-node cluster on this machine
//! (`bucketmap_testkit::node`: kubelet, containerd, runc, kube-proxy, the
//! CNI bridge, inside a network namespace of its own), the product's image
//! assembled as the Dockerfile describes it and loaded into the node's
//! containerd, the chart installed with `helm install`, the examples
//! applied with `kubectl apply`. GCS is the in-memory mock for the
//! operator (gRPC) and fake-gcs-server for object data, both listening on
//! the node's address where pods reach them.
//!
//! One node serves every scenario (it takes minutes to bring up), so this
//! test runs its scenarios one after the other with its own harness
//! (libtest-mimic): each scenario is a test of its own in the output. It
//! needs root, containerd and Go (`tools/node/install.sh` installs or
//! builds the rest); without them every scenario fails and says why.

mod cluster;
mod lifecycle;
mod live;
mod more;
mod scenarios;

use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};

use cluster::Cluster;

/// The node, started by the first scenario that runs.
type Shared = Arc<Mutex<Option<Result<Arc<Cluster>, String>>>>;

fn cluster(shared: &Shared, runtime: &tokio::runtime::Runtime) -> Result<Arc<Cluster>, Failed> {
    let mut slot = shared.lock().map_err(|_| "the node's lock is poisoned")?;
    let state = slot.get_or_insert_with(|| {
        runtime
            .block_on(Cluster::up())
            .map(Arc::new)
            .map_err(|e| format!("the node did not come up: {e:#}"))
    });
    state.clone().map_err(Failed::from)
}

fn main() -> std::process::ExitCode {
    let mut args = Arguments::from_args();
    // One node, one scenario at a time.
    args.test_threads = Some(1);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => Arc::new(runtime),
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let shared: Shared = Arc::default();
    let trials = scenarios::ALL
        .iter()
        .map(|&(name, scenario)| {
            let (shared, runtime) = (shared.clone(), runtime.clone());
            Trial::test(name, move || {
                let cluster = cluster(&shared, &runtime)?;
                runtime
                    .block_on(scenario(cluster))
                    .map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // Take the node down before the runtime goes.
    if let Ok(mut slot) = shared.lock()
        && let Some(Ok(cluster)) = slot.take()
    {
        runtime.block_on(async move { drop(cluster) });
    }
    conclusion.exit_code()
}
