//! A ConfigMap volume as the kubelet lays it out: each key's file holds the
//! data in a timestamped directory, `..data` a symlink to it, each key a
//! symlink through `..data`; an update writes a new timestamped directory
//! and renames a fresh `..data_tmp` symlink over `..data`.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A ConfigMap volume as the kubelet lays it out.
pub struct MappingDir {
    root: PathBuf,
    generation: u32,
    current: Option<PathBuf>,
    keys: Vec<String>,
}

impl MappingDir {
    pub fn new(root: PathBuf, map: &[(&str, &str)]) -> Result<MappingDir> {
        std::fs::create_dir_all(&root)?;
        let mut dir = MappingDir {
            root,
            generation: 0,
            current: None,
            keys: Vec::new(),
        };
        dir.publish(map)?;
        Ok(dir)
    }

    /// The kubelet's atomic update: new data dir, `..data` swapped with a
    /// rename, key symlinks added and removed, old data dir deleted.
    pub fn publish(&mut self, map: &[(&str, &str)]) -> Result<()> {
        self.generation += 1;
        let ts = format!(
            "..2026_11_29_16_00_{:02}.{:09}",
            self.generation,
            100_000_000 + self.generation
        );
        let data = self.root.join(&ts);
        std::fs::create_dir(&data)?;
        for (key, value) in map {
            std::fs::write(data.join(key), value)?;
        }
        let tmp = self.root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(&ts, &tmp)?;
        std::fs::rename(&tmp, self.root.join("..data")).context("swap ..data")?;
        let new_keys: Vec<String> = map.iter().map(|(k, _)| k.to_string()).collect();
        for key in &new_keys {
            let link = self.root.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(key), &link)?;
            }
        }
        for key in &self.keys {
            if !new_keys.contains(key) {
                std::fs::remove_file(self.root.join(key))?;
            }
        }
        if let Some(old) = self.current.replace(data) {
            std::fs::remove_dir_all(old)?;
        }
        self.keys = new_keys;
        Ok(())
    }
}
