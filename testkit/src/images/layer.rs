//! One filesystem layer: paths with their modes, owners and contents,
//! written as a tar stream in path order with a fixed modification time, so
//! that the same content always gives the same bytes (and digest).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// What a path in a layer is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file with these bytes.
    Bytes(Vec<u8>),
    /// A regular file copied from this host path when the layer is written.
    HostFile(PathBuf),
    /// A symbolic link to this target.
    Symlink(PathBuf),
}

/// One path of a layer.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Permission bits (and sticky bit).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Content.
    pub kind: Kind,
}

/// A layer's entries by path (relative, without a leading slash). Parents
/// sort before their children, and missing parents are added as root-owned
/// 0755 directories when written.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

/// The modification time of every entry (the epoch: content alone decides
/// the digest).
const MTIME: u64 = 0;

impl Layer {
    /// Adds (or replaces) `path` (absolute in the image).
    pub fn insert(&mut self, path: &str, mode: u32, owner: (u64, u64), kind: Kind) {
        let path = path
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_owned();
        let (uid, gid) = owner;
        self.entries.insert(
            path,
            Entry {
                mode,
                uid,
                gid,
                kind,
            },
        );
    }

    /// A root-owned directory.
    pub fn dir(&mut self, path: &str, mode: u32) {
        self.insert(path, mode, (0, 0), Kind::Dir);
    }

    /// A root-owned file with `bytes`.
    pub fn file(&mut self, path: &str, mode: u32, bytes: impl Into<Vec<u8>>) {
        self.insert(path, mode, (0, 0), Kind::Bytes(bytes.into()));
    }

    /// A root-owned file copied from `host` (its mode is `mode`, not the host's).
    pub fn host_file(&mut self, path: &str, mode: u32, host: &Path) {
        self.insert(path, mode, (0, 0), Kind::HostFile(host.to_owned()));
    }

    /// A root-owned symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.insert(path, 0o777, (0, 0), Kind::Symlink(target.into()));
    }

    /// The entries by path.
    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// Writes the layer as an uncompressed tar stream.
    pub fn write_tar(&self, out: impl Write) -> anyhow::Result<()> {
        let mut tar = tar::Builder::new(out);
        let mut written = std::collections::BTreeSet::new();
        for (path, entry) in &self.entries {
            for parent in Path::new(path).ancestors().skip(1) {
                let parent = parent.to_string_lossy().into_owned();
                if !parent.is_empty()
                    && !self.entries.contains_key(&parent)
                    && written.insert(parent.clone())
                {
                    let dir = Entry {
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        kind: Kind::Dir,
                    };
                    append(&mut tar, &parent, &dir)?;
                }
            }
            append(&mut tar, path, entry).with_context(|| format!("cannot add /{path}"))?;
        }
        tar.into_inner()?.flush()?;
        Ok(())
    }
}

fn append<W: Write>(tar: &mut tar::Builder<W>, path: &str, entry: &Entry) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mode(entry.mode);
    header.set_uid(entry.uid);
    header.set_gid(entry.gid);
    header.set_mtime(MTIME);
    match &entry.kind {
        Kind::Dir => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            tar.append_data(&mut header, format!("{path}/"), std::io::empty())?;
        }
        Kind::Bytes(bytes) => {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(bytes.len() as u64);
            tar.append_data(&mut header, path, bytes.as_slice())?;
        }
        Kind::HostFile(host) => {
            let file = std::fs::File::open(host)
                .with_context(|| format!("cannot open {}", host.display()))?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(file.metadata()?.len());
            tar.append_data(&mut header, path, file)?;
        }
        Kind::Symlink(target) => {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, path, target)?;
        }
    }
    Ok(())
}
