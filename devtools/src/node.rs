//! `cargo dev --node`: the product on a single-node cluster on this machine
//! (`bucketmap_testkit::node`), installed as users install it: the image
//! the Dockerfile describes, loaded into the node's containerd, `helm
//! install` of the chart, `kubectl apply` of the examples; the example app
//! then writes `hello.txt` through its injected sidecar.

use std::path::Path;

use anyhow::Context as _;
use bucketmap_testkit::node::{self, Node, product};

/// Runs `cargo dev --node`.
pub async fn run(exit_when_ready: bool, kubeconfig_out: Option<&Path>) -> anyhow::Result<()> {
    if let Some(problem) = node::unavailable() {
        anyhow::bail!(
            "{problem}. Plain `cargo dev` needs none of this: it runs the operator on a \
             local control plane without a node"
        );
    }
    println!(
        "starting a single-node cluster in the network namespace {} \
         (the first run builds the node's components and images)",
        node::NETNS
    );
    let mut node = Node::start().await.context("the node did not come up")?;
    if let Some(path) = kubeconfig_out {
        std::fs::copy(node.kubeconfig_path(), path)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let product = product::install(&mut node).await?;
    let physical = product::example_object_written(&node, &product).await?;
    let kubeconfig = node.kubeconfig_path();
    let args = ["get", "pods", "-A", "-o", "wide"].map(str::to_owned);
    println!("{}", product::kubectl(&node, &args).await?);
    println!("the example app wrote photos/hello.txt; it is in the bucket {physical}");
    println!("  kubeconfig: {}", kubeconfig.display());
    println!("  node logs:  {}", node.log_dir().display());
    println!("  operator's GCS (mock): {}", product.mock.addr());
    println!(
        "  object data (fake-gcs-server): {}",
        product.fake_gcs.local_addr()
    );
    if !exit_when_ready {
        println!("press ctrl-c to stop (the node is taken down completely)");
        bucketmap::termination_signal().await;
    }
    drop(product);
    drop(node);
    Ok(())
}
