//! The targets (issue 12), judged on one run's figures and printed as met
//! or MISSED, never asserted: the sidecar against nginx-rewrite (the same
//! job done by the proxy a user would deploy instead), against direct TLS
//! for streaming, and its memory.

use super::*;

/// One judged target.
struct Verdict {
    upstream: String,
    path: String,
    target: String,
    figure: String,
    met: bool,
    /// In how many of the blocks (the paths' turns, run side by side) the
    /// target holds on that block's own figures, and of how many: a target
    /// that holds in every block, or in none, is decided; one whose blocks
    /// split is within the machine's noise.
    blocks: Option<(usize, usize)>,
}

/// One percentile of a block's latencies.
type BlockPercentile = fn(&BlockFigures) -> Duration;

/// In how many of the blocks `holds` is true of the sidecar's figures and
/// nginx-rewrite's in the same turn, and of how many.
fn blocks_held<T>(mine: &[T], theirs: &[T], holds: impl Fn(&T, &T) -> bool) -> (usize, usize) {
    let held = mine.iter().zip(theirs).filter(|(m, t)| holds(m, t)).count();
    (held, mine.len().min(theirs.len()))
}

/// The CPU target of a sidecar path: the shipped build's, unless the path
/// measures another build (the second build, or a build named by
/// `BUCKETMAP_BENCH_SIDECAR_BIN` that is not the shipped one).
fn cpu_target(label: &str, main_is_shipped: bool) -> f64 {
    let second = sidecar_bin_b().is_some_and(|(_, b)| b == label);
    if main_is_shipped && !second {
        TARGET_CPU_SHIPPED
    } else {
        TARGET_CPU_OTHER
    }
}

impl Report {
    pub(crate) fn render_targets(&self, out: &mut String) {
        let mut verdicts = Vec::new();
        self.metadata_targets(&mut verdicts);
        self.throughput_targets(&mut verdicts);
        self.stream_targets(&mut verdicts);
        self.memory_targets(&mut verdicts);
        if verdicts.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n### Targets\n\nJudged on this run's figures (ratios in one run; only they mean anything on a shared machine), never asserted. \"nr\" is nginx-rewrite. \"Blocks held\" judges the same target on each block's own figures (the paths' turns, run side by side): a target held in every block, or in none, is decided; when the blocks split, the verdict is within this machine's noise.\n"
        );
        let _ = writeln!(
            out,
            "| upstream | path | target | figures | verdict | blocks held |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for v in &verdicts {
            let blocks = v
                .blocks
                .map_or_else(String::new, |(held, of)| format!("{held} of {of}"));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {blocks} |",
                v.upstream,
                v.path,
                v.target,
                v.figure,
                verdict(v.met)
            );
        }
    }

    fn metadata_targets(&self, verdicts: &mut Vec<Verdict>) {
        for m in &self.metadata {
            let Some(r) = m.labels.iter().position(|l| *l == NGINX_REWRITE) else {
                continue;
            };
            let ok = m.latencies.iter().all(|l| l.errors.is_empty());
            for (i, label) in m.labels.iter().enumerate().filter(|(_, l)| is_sidecar(l)) {
                let mut push = |target: String, figure: String, met: bool, blocks| {
                    verdicts.push(Verdict {
                        upstream: m.upstream.into(),
                        path: (*label).into(),
                        target,
                        figure,
                        met: ok && met,
                        blocks: Some(blocks),
                    });
                };
                let (mine, theirs) = (&m.blocks[i], &m.blocks[r]);
                // The direct path's figure cancels out of "added" in a block.
                let percentiles: [(&str, f64, BlockPercentile); 2] =
                    [("p50", 50.0, |b| b.p50), ("p99", 99.0, |b| b.p99)];
                for (name, p, of) in percentiles {
                    let (me, nr) = (added(m, i, p), added(m, r, p));
                    push(
                        format!("added {name} ≤ nr's"),
                        format!("{:+.0} µs vs {:+.0} µs", me * 1e6, nr * 1e6),
                        me <= nr,
                        blocks_held(mine, theirs, |a, b| of(a) <= of(b)),
                    );
                }
            }
        }
    }

    fn throughput_targets(&self, verdicts: &mut Vec<Verdict>) {
        for t in &self.throughput {
            let Some(r) = t.labels.iter().position(|l| *l == NGINX_REWRITE) else {
                continue;
            };
            for (i, label) in t.labels.iter().enumerate().filter(|(_, l)| is_sidecar(l)) {
                let mut push = |target: String, figure: String, met: bool, blocks| {
                    verdicts.push(Verdict {
                        upstream: t.upstream.into(),
                        path: (*label).into(),
                        target,
                        figure,
                        met: t.errors == 0 && met,
                        blocks,
                    });
                };
                let limit = cpu_target(label, self.main_is_shipped);
                for row in &t.rows {
                    let (mine, theirs) = (row.cpu_us[i], row.cpu_us[r]);
                    push(
                        format!(
                            "CPU per request at {} connection(s) ≤ {limit:.2}× nr",
                            row.connections
                        ),
                        format!("{mine:.1} vs {theirs:.1} µs: {:.2}×", ratio(mine, theirs)),
                        ratio(mine, theirs) <= limit,
                        Some(blocks_held(
                            &row.block_cpu_us[i],
                            &row.block_cpu_us[r],
                            |a, b| ratio(*a, *b) <= limit,
                        )),
                    );
                }
                if let Some(row) = t.rows.iter().find(|row| row.connections == 16) {
                    let (mine, theirs) = (row.rps[i], row.rps[r]);
                    push(
                        "requests per second at 16 connections ≥ nr's".into(),
                        format!("{mine:.0} vs {theirs:.0}: {:.2}×", ratio(mine, theirs)),
                        mine >= theirs,
                        Some(blocks_held(&row.block_rps[i], &row.block_rps[r], |a, b| {
                            a >= b
                        })),
                    );
                }
                if let Some(Some(m)) = t.memory_after.get(i) {
                    for (what, kib, limit) in [
                        (
                            "RSS once the loops are over",
                            m.rss_kib,
                            TARGET_LOADED_IDLE_RSS_KIB,
                        ),
                        ("peak RSS by then", m.hwm_kib, TARGET_LOADED_PEAK_RSS_KIB),
                    ] {
                        push(
                            format!("{what} ≤ {}", mib(limit)),
                            mib(kib),
                            kib <= limit,
                            None,
                        );
                    }
                }
            }
        }
    }

    fn stream_targets(&self, verdicts: &mut Vec<Verdict>) {
        for f in &self.streams {
            let medians: Vec<f64> = f.rates.iter().map(|r| median(r)).collect();
            // The better of the two nginx configurations.
            let nginx = f
                .labels
                .iter()
                .zip(&medians)
                .filter(|(l, _)| l.starts_with("nginx"))
                .map(|(_, m)| *m)
                .fold(f64::NAN, f64::max);
            let tls = f.upstream.contains("TLS");
            for (i, label) in f.labels.iter().enumerate().filter(|(_, l)| is_sidecar(l)) {
                let transfer = format!("{} {} MiB", f.direction.as_str(), f.size / MIB);
                if !nginx.is_nan() {
                    verdicts.push(Verdict {
                        upstream: f.upstream.into(),
                        path: (*label).into(),
                        target: format!("{transfer} ≥ nginx's (the better configuration)"),
                        figure: format!("{:.0} vs {nginx:.0} MiB/s", medians[i]),
                        met: medians[i] >= nginx,
                        blocks: None,
                    });
                }
                if tls {
                    let share = ratio(medians[i], medians[0]);
                    // The TLS relay does nothing but TLS and copies: no proxy
                    // in the sidecar's position can do better on this machine.
                    let floor = f
                        .labels
                        .iter()
                        .position(|l| *l == TLS_RELAY)
                        .map(|r| {
                            let relay = ratio(medians[r], medians[0]) * 100.0;
                            format!(" (the TLS relay, the floor: {relay:.1} %)")
                        })
                        .unwrap_or_default();
                    verdicts.push(Verdict {
                        upstream: f.upstream.into(),
                        path: (*label).into(),
                        target: format!(
                            "{transfer} ≥ {:.0} % of direct TLS",
                            TARGET_TLS_STREAM_RATIO * 100.0
                        ),
                        figure: format!("{:.1} %{floor}", share * 100.0),
                        met: share >= TARGET_TLS_STREAM_RATIO,
                        blocks: None,
                    });
                }
            }
        }
    }

    fn memory_targets(&self, verdicts: &mut Vec<Verdict>) {
        for m in &self.memory {
            verdicts.push(Verdict {
                upstream: m.label.clone(),
                path: "sidecar".into(),
                target: format!("idle RSS ≤ {}", mib(TARGET_IDLE_RSS_KIB)),
                figure: mib(m.idle_rss_kib),
                met: m.idle_rss_kib <= TARGET_IDLE_RSS_KIB,
                blocks: None,
            });
            let peak = m.rows.iter().map(|r| r.hwm_after_kib).max().unwrap_or(0);
            verdicts.push(Verdict {
                upstream: m.label.clone(),
                path: "sidecar".into(),
                target: format!(
                    "peak RSS at {} concurrent streams ≤ {}",
                    self.settings.streams,
                    mib(TARGET_PEAK_RSS_KIB)
                ),
                figure: mib(peak),
                met: peak <= TARGET_PEAK_RSS_KIB,
                blocks: None,
            });
        }
    }
}
