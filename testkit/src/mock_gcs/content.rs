//! Object data: kept as the chunks it arrived in (`Bytes`, never copied
//! into one buffer), with the CRC32C and MD5 checksums GCS reports.

use bytes::Bytes;

use super::proto;

/// The largest data chunk the mock sends in one read response, as GCS
/// (2 MiB).
pub(crate) const MAX_READ_CHUNK: usize = 2 * 1024 * 1024;

/// The data of one object generation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Content {
    chunks: Vec<Bytes>,
    len: u64,
}

impl Content {
    /// Content made of `chunks`, in order.
    pub(crate) fn from_chunks(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        let mut content = Self::default();
        for chunk in chunks {
            content.push(chunk);
        }
        content
    }

    /// Appends `chunk` (empty chunks are dropped).
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len() as u64;
            self.chunks.push(chunk);
        }
    }

    /// The size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The chunks in order.
    pub(crate) fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// The bytes `[start, end)` as pieces of `max` bytes (the last one
    /// shorter), each with its offset and the slices of the stored chunks
    /// it spans (shared, not copied).
    pub(crate) fn pieces(&self, start: u64, end: u64, max: usize) -> Vec<(u64, Vec<Bytes>)> {
        let mut pieces = Vec::new();
        let mut chunks = self.chunks.iter();
        let mut current: Option<(u64, &Bytes)> = None;
        let mut chunk_start = 0u64;
        let mut at = start;
        while at < end {
            let piece_start = at;
            let piece_end = end.min(at + max as u64);
            let mut slices = Vec::new();
            while at < piece_end {
                let (from, chunk) = match current {
                    Some((from, chunk)) if at < from + chunk.len() as u64 => (from, chunk),
                    _ => {
                        let Some(chunk) = chunks.next() else {
                            return pieces;
                        };
                        let from = chunk_start;
                        chunk_start += chunk.len() as u64;
                        current = Some((from, chunk));
                        continue;
                    }
                };
                let to = piece_end.min(from + chunk.len() as u64);
                slices.push(chunk.slice(offset_in(at - from)..offset_in(to - from)));
                at = to;
            }
            pieces.push((piece_start, slices));
        }
        pieces
    }

    /// CRC32C and MD5 of the whole content.
    pub(crate) fn checksums(&self) -> proto::ObjectChecksums {
        let mut hasher = Hasher::default();
        for chunk in &self.chunks {
            hasher.update(chunk);
        }
        hasher.checksums()
    }

    /// The CRC32C of the whole content.
    pub(crate) fn crc32c(&self) -> u32 {
        self.chunks
            .iter()
            .fold(0, |crc, chunk| crc32c::crc32c_append(crc, chunk))
    }
}

/// A chunk offset; chunks are in memory, so their offsets fit a `usize`.
fn offset_in(offset: u64) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

/// Running CRC32C and MD5 of data written piece by piece.
#[derive(Clone)]
pub(crate) struct Hasher {
    crc32c: u32,
    md5: md5::Context,
}

impl Default for Hasher {
    fn default() -> Self {
        Self {
            crc32c: 0,
            md5: md5::Context::new(),
        }
    }
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher")
            .field("crc32c", &self.crc32c)
            .finish_non_exhaustive()
    }
}

impl Hasher {
    /// Adds `data`.
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.crc32c = crc32c::crc32c_append(self.crc32c, data);
        self.md5.consume(data);
    }

    /// The checksums of everything added so far.
    pub(crate) fn checksums(&self) -> proto::ObjectChecksums {
        proto::ObjectChecksums {
            crc32c: Some(self.crc32c),
            md5_hash: self.md5.clone().finalize().0.to_vec(),
        }
    }
}

/// INVALID_ARGUMENT unless the checksums the client sent (`expected`, each
/// optional) match the data's (`actual`).
pub(crate) fn check_checksums(
    what: &str,
    expected: Option<&proto::ObjectChecksums>,
    actual: &proto::ObjectChecksums,
) -> Result<(), tonic::Status> {
    let Some(expected) = expected else {
        return Ok(());
    };
    if let Some(crc) = expected.crc32c
        && Some(crc) != actual.crc32c
    {
        return Err(tonic::Status::invalid_argument(format!(
            "The crc32c checksum of {what} does not match: sent {crc}, computed {}",
            actual.crc32c.unwrap_or_default()
        )));
    }
    if !expected.md5_hash.is_empty() && expected.md5_hash != actual.md5_hash {
        return Err(tonic::Status::invalid_argument(format!(
            "The md5 hash of {what} does not match the data received"
        )));
    }
    Ok(())
}

/// INVALID_ARGUMENT unless `data` matches the CRC32C sent with it.
pub(crate) fn check_chunk(data: &proto::ChecksummedData) -> Result<(), tonic::Status> {
    match data.crc32c {
        Some(crc) if crc != crc32c::crc32c(&data.content) => {
            Err(tonic::Status::invalid_argument(format!(
                "The crc32c of a data chunk ({} bytes) does not match: sent {crc}, computed {}",
                data.content.len(),
                crc32c::crc32c(&data.content)
            )))
        }
        _ => Ok(()),
    }
}
