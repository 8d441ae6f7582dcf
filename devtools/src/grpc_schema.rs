//! `cargo dev grpc-schema`: writes the sidecar's gRPC bucket-name table
//! (`sidecar-core/src/grpc/schema.rs`) derived from the vendored protos
//! (`bucketmap_testkit::grpc_schema`). A command of its own, never a mode
//! of the test that checks the table (`sidecar/tests/integration/grpc_schema.rs`): that
//! test only ever compares, and names this command when the table is stale.

use anyhow::Context as _;

use bucketmap_testkit::grpc_schema::{SCHEMA_PATH, derive};

/// Writes the table if it differs from what the protos give.
pub fn run() -> anyhow::Result<()> {
    let derived = derive();
    let path = bucketmap_testkit::repo_path(SCHEMA_PATH);
    let current = std::fs::read_to_string(&path).ok();
    if current.as_deref() == Some(derived.as_str()) {
        println!("{SCHEMA_PATH} was already current");
        return Ok(());
    }
    std::fs::write(&path, &derived).with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {SCHEMA_PATH}: review its diff");
    Ok(())
}
