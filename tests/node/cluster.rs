//! The node with the product installed (`bucketmap_testkit::node::product`).

use anyhow::Result;
use bucketmap_testkit::node::Node;
use bucketmap_testkit::node::product::{self, Product};

pub struct Cluster {
    // Field order is drop order: the product's GCS before the node.
    pub product: Product,
    pub client: kube::Client,
    pub node: Node,
}

impl Cluster {
    pub async fn up() -> Result<Cluster> {
        let mut node = Node::start().await?;
        let product = product::install(&mut node).await?;
        let client = node.client()?;
        Ok(Cluster {
            product,
            client,
            node,
        })
    }
}
