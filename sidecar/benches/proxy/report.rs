//! The printed report.

use super::*;

pub(crate) fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub(crate) struct Report {
    pub(crate) settings: Settings,
    pub(crate) date: String,
    pub(crate) commit: String,
    /// Which builds of the sidecar were measured.
    pub(crate) builds: String,
    /// Whether the main sidecar path measures the shipped build.
    pub(crate) main_is_shipped: bool,
    pub(crate) cores: usize,
    /// Whether address-space randomisation was on for the bench's processes.
    pub(crate) randomised: bool,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) elapsed: Duration,
    pub(crate) metadata: Vec<MetadataFigures>,
    pub(crate) throughput: Vec<ThroughputFigures>,
    pub(crate) streams: Vec<StreamFigures>,
    pub(crate) memory: Vec<MemoryFigures>,
    pub(crate) instructions: Vec<InstructionFigures>,
    pub(crate) grpc: Option<GrpcFigures>,
    pub(crate) main_sidecar_hwm_kib: Option<u64>,
    pub(crate) notes: Vec<String>,
}

impl Report {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## bucketmap-sidecar benchmark\n");
        let _ = writeln!(
            out,
            "{}, commit {}, {} cores, address-space randomisation {}, load average {} before / {} after, {:.0?} in all.\n",
            self.date,
            self.commit,
            self.cores,
            if self.randomised {
                "on (processes of one binary may differ by 5–10 % in CPU)"
            } else {
                "off"
            },
            self.load_before,
            self.load_after,
            self.elapsed
        );
        let _ = writeln!(out, "{}\n", self.builds);

        self.render_metadata(&mut out);
        self.render_throughput(&mut out);
        self.render_streams(&mut out);
        self.render_memory(&mut out);
        self.render_targets(&mut out);
        if !self.instructions.is_empty() {
            let _ = writeln!(
                out,
                "\n### Instructions per metadata request\n\nCounted by callgrind over {COUNTED_REQUESTS} sequential `GET /storage/v1/b/B/o/x` through each proxy (after a warm-up): every instruction of the process, runtime, libc and TLS library included, the kernel's excluded. These counts do not depend on the machine's load. The HTTP relay forwards with the sidecar's HTTP machinery (hyper server, the sidecar's upstream client, one tokio thread) and nothing else: the sidecar's own work is what it counts above it. On the TLS upstream, the production shape, every proxy also speaks TLS to the upstream.\n"
            );
            for counts in &self.instructions {
                counts.render(&mut out);
            }
        }
        if let Some(grpc) = &self.grpc {
            grpc.render(&mut out);
        }
        if let Some(hwm) = self.main_sidecar_hwm_kib {
            let _ = writeln!(
                out,
                "\nPeak RSS of the sidecar that served the latency and single-stream runs (in-process upstream): {}.",
                mib(hwm)
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "\nNote: {note}");
        }
        out
    }
}

impl InstructionFigures {
    fn render(&self, out: &mut String) {
        let Some((floor, relay)) = self.rows.first() else {
            return;
        };
        let _ = writeln!(
            out,
            "\n| upstream | path | instructions per request | vs {floor} | vs nginx-rewrite |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        let nginx_rewrite = self.nginx_rewrite();
        for (path, count) in &self.rows {
            let versus_nr = nginx_rewrite.map_or_else(String::new, |nr| {
                format!("{:.2}×", ratio(*count as f64, nr as f64))
            });
            let versus_relay = ratio(*count as f64, *relay as f64);
            let _ = writeln!(
                out,
                "| {} | via {path} | {count} | {versus_relay:.2}× | {versus_nr} |",
                self.upstream
            );
        }
    }
}

/// Where the direct and nginx-rewrite paths are among `labels`.
pub(crate) fn bases(labels: &[&str]) -> (usize, Option<usize>) {
    (0, labels.iter().position(|l| *l == NGINX_REWRITE))
}

/// `value` and its ratios to the direct path's and nginx-rewrite's.
pub(crate) fn with_ratios(
    text: String,
    value: f64,
    values: &[f64],
    labels: &[&str],
    index: usize,
) -> String {
    let (direct, rewrite) = bases(labels);
    let mut parts = Vec::new();
    if index != direct {
        parts.push(format!("{:.2}× d", ratio(value, values[direct])));
    }
    if let Some(r) = rewrite.filter(|&r| r != index) {
        parts.push(format!("{:.2}× nr", ratio(value, values[r])));
    }
    if parts.is_empty() {
        text
    } else {
        format!("{text} ({})", parts.join(", "))
    }
}

pub(crate) fn is_sidecar(label: &str) -> bool {
    label.starts_with("sidecar")
}

/// The latency a path adds over direct at percentile `p`, in seconds.
pub(crate) fn added(m: &MetadataFigures, index: usize, p: f64) -> f64 {
    m.latencies[index].percentile(p).as_secs_f64() - m.latencies[0].percentile(p).as_secs_f64()
}

/// CPU µs per metadata request of each path during its latency blocks.
pub(crate) fn cpu_per_request(m: &MetadataFigures) -> Vec<f64> {
    m.cpu_ns
        .iter()
        .zip(&m.latencies)
        .map(|(ns, lat)| {
            let count = (lat.sorted.len() + lat.errors.len()).max(1);
            *ns as f64 / 1000.0 / count as f64
        })
        .collect()
}

pub(crate) const RATIO_NOTE: &str =
    "Each figure is followed by its ratio to direct (d) and to nginx-rewrite (nr) in the same run.";

impl Report {
    fn render_metadata(&self, out: &mut String) {
        if self.metadata.is_empty() {
            return;
        }
        let s = &self.settings;
        let _ = writeln!(
            out,
            "### Metadata latency\n\n`GET /storage/v1/b/B/o/x` (JSON object resource), open loop at {} req/s, {:?} per path in {} blocks of {:?}, the paths taking turns. {RATIO_NOTE} Added latency is a path's percentile minus the direct one. The TCP relay is the floor of any user-space proxy here (one more process and two more sockets, no HTTP); on the TLS upstream the TLS relay is, which also speaks TLS to the upstream. The HTTP relay forwards with hyper, the sidecar's HTTP machinery, and does nothing else: the floor of a proxy built on it. nginx is one process with a keep-alive pool to the upstream; nginx-rewrite also rewrites the bucket in the path and `sub_filter`s the name in JSON, the sidecar's job done off the shelf. CPU per request here is the live threads' run time (`/proc/PID/task/*/schedstat`) at this low rate, where every request wakes each process from sleep: a view of wake-up costs, not the headline, which is the closed loops' below. It is the client's plus the upstream's (direct) or the proxy's, each during its own blocks. On the TLS upstream, direct is the client speaking TLS itself, the proxies take plaintext and speak TLS to the upstream.\n",
            s.rate,
            s.per_path(),
            s.blocks,
            s.block
        );
        let _ = writeln!(
            out,
            "| upstream | path | requests | errors | p50 | p90 | p99 | p99.9 | max |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for m in &self.metadata {
            for (i, (label, lat)) in m.labels.iter().zip(&m.latencies).enumerate() {
                let mut row = format!(
                    "| {} | {label} | {} | {} |",
                    m.upstream,
                    lat.sorted.len(),
                    lat.errors.len()
                );
                for (_, p) in PERCENTILES {
                    let values: Vec<f64> = m
                        .latencies
                        .iter()
                        .map(|l| l.percentile(p).as_secs_f64())
                        .collect();
                    let cell = with_ratios(
                        fmt_duration(lat.percentile(p)),
                        values[i],
                        &values,
                        &m.labels,
                        i,
                    );
                    let _ = write!(row, " {cell} |");
                }
                let _ = writeln!(out, "{row} {} |", fmt_duration(lat.max()));
            }
        }
        let _ = writeln!(
            out,
            "\n| upstream | path | added p50 | added p99 | added median block p99 | CPU per request |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for m in &self.metadata {
            let (_, rewrite) = bases(&m.labels);
            let cpu = cpu_per_request(m);
            for (i, label) in m.labels.iter().enumerate().skip(1) {
                let vs_rewrite = |value: f64, base: Option<f64>| match (rewrite, base) {
                    (Some(r), Some(b)) if r != i => format!(" ({:.2}× nr)", ratio(value, b)),
                    _ => String::new(),
                };
                let added_cell = |p: f64| {
                    let value = added(m, i, p);
                    let base = rewrite.map(|r| added(m, r, p));
                    format!("{:+.0} µs{}", value * 1e6, vs_rewrite(value, base))
                };
                let block = m.latencies[i].median_block_p99().as_secs_f64()
                    - m.latencies[0].median_block_p99().as_secs_f64();
                let block_base = rewrite.map(|r| {
                    m.latencies[r].median_block_p99().as_secs_f64()
                        - m.latencies[0].median_block_p99().as_secs_f64()
                });
                let _ = writeln!(
                    out,
                    "| {} | {label} | {} | {} | {:+.0} µs{} | {} |",
                    m.upstream,
                    added_cell(50.0),
                    added_cell(99.0),
                    block * 1e6,
                    vs_rewrite(block, block_base),
                    with_ratios(format!("{:.0} µs", cpu[i]), cpu[i], &cpu, &m.labels, i),
                );
            }
            let _ = writeln!(
                out,
                "| {} | direct | | | | {:.0} µs (client + upstream) |",
                m.upstream, cpu[0]
            );
        }
        for m in &self.metadata {
            for (label, lat) in m.labels.iter().zip(&m.latencies) {
                if let Some(first) = lat.errors.first() {
                    let _ = writeln!(
                        out,
                        "\n{} {label}: {} errors, first: {first}",
                        m.upstream,
                        lat.errors.len()
                    );
                }
            }
        }
    }

    fn render_throughput(&self, out: &mut String) {
        if self.throughput.is_empty() {
            return;
        }
        let s = &self.settings;
        let _ = writeln!(
            out,
            "\n### Requests per second and CPU per request\n\nMetadata GETs in closed loops (each connection sends its next request when the last is answered) at 1 and 16 connections, {:?} per path and connection count in {} block(s), the paths taking turns. The load client is one thread, as are the upstream, nginx and the sidecar, all on {} cores. CPU per request is the headline: each process's `utime + stime` over its blocks, as the kernel accounts it (every thread it had; what `top` shows), divided by the requests it served; for direct, the client's and the upstream's. {RATIO_NOTE}\n",
            s.rps_block * s.rps_blocks,
            s.rps_blocks,
            self.cores
        );
        let _ = writeln!(
            out,
            "| upstream | path | connections | requests per second | CPU per request |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for t in &self.throughput {
            for ThroughputRow {
                connections,
                rps,
                cpu_us: cpu,
                ..
            } in &t.rows
            {
                for (i, label) in t.labels.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "| {} | {label} | {connections} | {} | {} |",
                        t.upstream,
                        with_ratios(format!("{:.0}", rps[i]), rps[i], rps, &t.labels, i),
                        with_ratios(format!("{:.0} µs", cpu[i]), cpu[i], cpu, &t.labels, i),
                    );
                }
            }
            if t.errors > 0 {
                let _ = writeln!(out, "\n{}: {} requests failed.", t.upstream, t.errors);
            }
            for (label, memory) in t.labels.iter().zip(&t.memory_after) {
                if let Some(m) = memory {
                    let _ = writeln!(
                        out,
                        "\n{}, {label}: RSS once the loops were over {} ({} its own, \
                         the rest its binary's and libraries' mapped pages), peak {}.",
                        t.upstream,
                        mib(m.rss_kib),
                        mib(m.anon_kib),
                        mib(m.hwm_kib)
                    );
                }
            }
        }
    }

    fn render_streams(&self, out: &mut String) {
        if self.streams.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n### Streaming throughput\n\nOne `POST /upload/storage/v1/b/B/o?uploadType=media&name=big` and one `GET /storage/v1/b/B/o/big?alt=media`, {} repetition(s) per path, the paths taking turns; median MiB/s (range). nginx streams both ways (`proxy_request_buffering off`, `proxy_buffering off`). CPU per GiB moved is the client's plus the upstream's (direct) or the proxy's. {RATIO_NOTE}\n",
            self.settings.reps
        );
        let _ = writeln!(out, "| upstream | transfer | path | MiB/s | CPU per GiB |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for f in &self.streams {
            let medians: Vec<f64> = f.rates.iter().map(|r| median(r)).collect();
            let cpu: Vec<f64> = (0..f.labels.len())
                .map(|i| {
                    let gib = (f.size * f.rates[i].len() as u64) as f64 / (1u64 << 30) as f64;
                    f.cpu_ns[i] as f64 / 1e6 / gib
                })
                .collect();
            for (i, label) in f.labels.iter().enumerate() {
                let lo = f.rates[i].iter().copied().fold(f64::INFINITY, f64::min);
                let hi = f.rates[i].iter().copied().fold(0.0, f64::max);
                let range = if f.rates[i].len() > 1 {
                    format!(" ({lo:.0}–{hi:.0})")
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "| {} | {} {} MiB | {label} | {} | {} |",
                    f.upstream,
                    f.direction.as_str(),
                    f.size / MIB,
                    with_ratios(
                        format!("{:.0}{range}", medians[i]),
                        medians[i],
                        &medians,
                        &f.labels,
                        i
                    ),
                    with_ratios(format!("{:.0} ms", cpu[i]), cpu[i], &cpu, &f.labels, i),
                );
            }
        }
    }

    fn render_memory(&self, out: &mut String) {
        if self.memory.is_empty() {
            return;
        }
        let s = &self.settings;
        let _ = writeln!(
            out,
            "\n### Sidecar memory under {} concurrent streams\n\nA fresh sidecar per upstream: idle RSS after start, then {} concurrent downloads, then {} concurrent uploads, {} MiB each, one client connection per stream. Peak RSS is `VmHWM` (peak since start) read after each batch; the direct run of each batch goes first, for the throughput baseline. On the TLS upstream the sidecar runs with `--upstream-http 2` (one multiplexed connection) and `--upstream-http 1.1` (a keep-alive pool).\n",
            s.streams,
            s.streams,
            s.streams,
            s.stream_size / MIB
        );
        let _ = writeln!(
            out,
            "| sidecar | batch | direct aggregate | via sidecar aggregate | ratio | idle RSS | peak RSS |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for m in &self.memory {
            for row in &m.rows {
                let _ = writeln!(
                    out,
                    "| {} | {} × {} | {:.0} MiB/s | {:.0} MiB/s | {:.1} % | {} | {} ({:.2}× idle) |",
                    m.label,
                    s.streams,
                    row.direction.as_str(),
                    row.direct,
                    row.via,
                    ratio(row.via, row.direct) * 100.0,
                    mib(m.idle_rss_kib),
                    mib(row.hwm_after_kib),
                    ratio(row.hwm_after_kib as f64, m.idle_rss_kib as f64),
                );
            }
        }
    }
}
