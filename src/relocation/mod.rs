//! Moving a bucket under a running application (issue 59): the operator's
//! half of the switch protocol, as a pure state machine that the reconciler
//! drives and a model test checks (docs/ARCHITECTURE.md, "Moving a bucket:
//! the switch"). The sidecar's half is `bucketmap_sidecar_core::relocation`.

pub mod copy;
pub mod driver;
pub mod switch;

#[cfg(test)]
mod model_tests;
