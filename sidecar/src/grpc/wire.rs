//! TEMPORARY STUB (replaced by the grpc-wire branch).
use crate::mapping::Mapping;
use crate::rewrite::Translator;
use bytes::Bytes;
/// stub
pub fn rewrite_message(
    _msg: &Bytes,
    _message: usize,
    _t: &Translator<'_>,
) -> Result<Option<Bytes>, tonic::Status> {
    Ok(None)
}
/// stub
pub fn rewrite_status_details(_details: &[u8], _mapping: &Mapping) -> Option<Bytes> {
    None
}
