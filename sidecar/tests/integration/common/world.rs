//! One test's world: fake-gcs-server with the physical buckets, and the
//! sidecar in front of it (or nothing, for the baseline runs that check the
//! clients and the emulator on their own).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;
use tempfile::TempDir;

use super::procs::{FakeGcs, Sidecar, log_tail};

/// logical → physical, as the operator would publish it.
pub const MAP: [(&str, &str); 2] = [("photos", "photos-k3x9q2mw"), ("videos", "videos-a1b2c3d4")];

/// Physical buckets of another environment, in the same upstream: the app
/// must never reach them.
pub const FORBIDDEN: [&str; 2] = ["photos-j7h6g5f4", "videos-m3n4p5q6"];

pub struct World {
    dir: TempDir,
    pub fake: FakeGcs,
    pub sidecar: Option<Sidecar>,
    map: BTreeMap<String, String>,
}

impl World {
    fn temp_dir(name: &str) -> Result<TempDir> {
        Ok(tempfile::Builder::new()
            .prefix(&format!("bucketmap-sidecar-{name}-"))
            .tempdir()?)
    }

    /// fake-gcs-server with the mapped and the forbidden physical buckets, and
    /// the sidecar started with `--map` for each mapping plus `extra_args`.
    pub fn through_sidecar(name: &str, extra_args: &[&str]) -> Result<World> {
        let dir = Self::temp_dir(name)?;
        let mut buckets: Vec<&str> = MAP.iter().map(|(_, p)| *p).collect();
        buckets.extend(FORBIDDEN);
        let fake = FakeGcs::start(dir.path(), &buckets)?;
        let mut args: Vec<String> = Vec::new();
        for (logical, physical) in MAP {
            args.push("--map".into());
            args.push(format!("{logical}={physical}"));
        }
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let sidecar = Sidecar::start(dir.path(), &fake.url(), &args)?;
        let map = MAP
            .iter()
            .map(|(l, p)| (l.to_string(), p.to_string()))
            .collect();
        Ok(World {
            dir,
            fake,
            sidecar: Some(sidecar),
            map,
        })
    }

    /// fake-gcs-server alone, with buckets named like the logical ones (and the
    /// forbidden pair): the clients talk to it directly.
    pub fn direct(name: &str) -> Result<World> {
        let dir = Self::temp_dir(name)?;
        let mut buckets: Vec<&str> = MAP.iter().map(|(l, _)| *l).collect();
        buckets.extend(FORBIDDEN);
        let fake = FakeGcs::start(dir.path(), &buckets)?;
        let map = MAP
            .iter()
            .map(|(l, _)| (l.to_string(), l.to_string()))
            .collect();
        Ok(World {
            dir,
            fake,
            sidecar: None,
            map,
        })
    }

    /// A world whose sidecar the test starts itself (e.g. with `--mapping-dir`).
    pub fn upstream_only(name: &str, buckets: &[&str]) -> Result<World> {
        let dir = Self::temp_dir(name)?;
        let fake = FakeGcs::start(dir.path(), buckets)?;
        Ok(World {
            dir,
            fake,
            sidecar: None,
            map: BTreeMap::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the application sends its requests.
    pub fn endpoint_addr(&self) -> SocketAddr {
        self.sidecar
            .as_ref()
            .map(|s| s.addr)
            .unwrap_or(self.fake.addr)
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.endpoint_addr())
    }

    pub fn sidecar_addr(&self) -> SocketAddr {
        self.sidecar
            .as_ref()
            .expect("this world runs the sidecar")
            .addr
    }

    pub fn physical<'a>(&'a self, logical: &'a str) -> &'a str {
        self.map.get(logical).map(String::as_str).unwrap_or(logical)
    }

    pub fn map(&self) -> &BTreeMap<String, String> {
        &self.map
    }

    pub fn forbidden(&self) -> [&'static str; 2] {
        FORBIDDEN
    }

    pub fn all_physical_buckets(&self) -> Vec<String> {
        let mut all: Vec<String> = self.map.values().cloned().collect();
        all.extend(FORBIDDEN.iter().map(|s| s.to_string()));
        all.sort();
        all
    }

    /// Strings the application must never see through the sidecar: physical
    /// names and the upstream's address.
    pub fn leaks(&self) -> Vec<String> {
        if self.sidecar.is_none() {
            return Vec::new();
        }
        let mut leaks: Vec<String> = self.all_physical_buckets();
        leaks.push(self.fake.addr.to_string());
        leaks
    }

    /// Log tails and where the artefacts are, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut out = Vec::new();
        if let Some(sidecar) = &self.sidecar {
            out.push(log_tail(&sidecar.proc.log, 80));
        }
        out.push(log_tail(&self.fake.proc.log, 20));
        out.push(format!("test files: {}", self.dir.path().display()));
        out.join("\n")
    }
}

impl Drop for World {
    /// With BUCKETMAP_TEST_KEEP set, the test's files (logs, client reports,
    /// spec) are kept.
    fn drop(&mut self) {
        if std::env::var_os("BUCKETMAP_TEST_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
    }
}
