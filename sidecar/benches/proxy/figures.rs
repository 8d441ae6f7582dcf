//! Figures and their formatting.

use super::*;

pub(crate) struct Latencies {
    pub(crate) sorted: Vec<Duration>,
    pub(crate) errors: Vec<String>,
    /// p99 of each open-loop block, sorted.
    pub(crate) block_p99: Vec<Duration>,
}

impl Latencies {
    pub(crate) fn new(
        mut samples: Vec<Duration>,
        errors: Vec<String>,
        mut block_p99: Vec<Duration>,
    ) -> Self {
        samples.sort_unstable();
        block_p99.sort_unstable();
        Latencies {
            sorted: samples,
            errors,
            block_p99,
        }
    }

    /// The median of the blocks' p99s: the tail of a typical block, less
    /// swayed than the overall p99 by one block that met a stall of the
    /// (shared) machine.
    pub(crate) fn median_block_p99(&self) -> Duration {
        self.block_p99
            .get(self.block_p99.len() / 2)
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * (self.sorted.len() - 1) as f64).round() as usize;
        self.sorted[rank.min(self.sorted.len() - 1)]
    }

    pub(crate) fn max(&self) -> Duration {
        self.sorted.last().copied().unwrap_or_default()
    }
}

pub(crate) const PERCENTILES: [(&str, f64); 4] =
    [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9)];

pub(crate) struct MetadataFigures {
    pub(crate) upstream: &'static str,
    /// The paths, in the order of the other vectors; the first is direct.
    pub(crate) labels: Vec<&'static str>,
    pub(crate) latencies: Vec<Latencies>,
    /// CPU ns per path during its blocks: client + upstream (direct), the
    /// proxy's (others).
    pub(crate) cpu_ns: Vec<u64>,
    /// Per path, each block's own figures, in the order the blocks ran.
    pub(crate) blocks: Vec<Vec<BlockFigures>>,
}

/// One path's figures in one open-loop block.
#[derive(Clone, Copy)]
pub(crate) struct BlockFigures {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

/// The closed-loop figures at one connection count, per path.
pub(crate) struct ThroughputRow {
    pub(crate) connections: usize,
    pub(crate) rps: Vec<f64>,
    /// CPU µs per request, as the kernel accounts the process's time
    /// (`utime + stime`, every thread).
    pub(crate) cpu_us: Vec<f64>,
    /// Each block's requests per second, in the order the blocks ran.
    pub(crate) block_rps: Vec<Vec<f64>>,
    /// Each block's CPU µs per request, as `cpu_us`.
    pub(crate) block_cpu_us: Vec<Vec<f64>>,
}

/// Closed-loop requests per second, per path.
pub(crate) struct ThroughputFigures {
    pub(crate) upstream: &'static str,
    pub(crate) labels: Vec<&'static str>,
    pub(crate) rows: Vec<ThroughputRow>,
    /// Failed requests over all runs.
    pub(crate) errors: u64,
    /// Per path, for the sidecars: its memory once the last run (the most
    /// connections) is over.
    pub(crate) memory_after: Vec<Option<Memory>>,
}

pub(crate) struct StreamFigures {
    pub(crate) upstream: &'static str,
    pub(crate) size: u64,
    pub(crate) direction: Direction,
    pub(crate) labels: Vec<&'static str>,
    /// MiB/s per repetition, per path.
    pub(crate) rates: Vec<Vec<f64>>,
    /// CPU ns per path over its repetitions, as in [`MetadataFigures`].
    pub(crate) cpu_ns: Vec<u64>,
}

pub(crate) struct MemoryFigures {
    /// Which sidecar: its upstream and HTTP version.
    pub(crate) label: String,
    pub(crate) idle_rss_kib: u64,
    pub(crate) rows: Vec<MemoryRow>,
}

pub(crate) struct MemoryRow {
    pub(crate) direction: Direction,
    pub(crate) direct: f64,
    pub(crate) via: f64,
    pub(crate) hwm_after_kib: u64,
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

pub(crate) fn fmt_added(via: Duration, direct: Duration) -> String {
    let us = (via.as_secs_f64() - direct.as_secs_f64()) * 1e6;
    if us.abs() < 10_000.0 {
        format!("{us:+.0} µs")
    } else {
        format!("{:+.2} ms", us / 1000.0)
    }
}

pub(crate) fn ratio(via: f64, direct: f64) -> f64 {
    if direct > 0.0 { via / direct } else { f64::NAN }
}

pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB as f64 / elapsed.as_secs_f64()
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
