//! `cargo dev bench` stopped by SIGTERM or ctrl-c ends everything it
//! started: the control plane and the operator process it spawned.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context as _;

type TestResult = anyhow::Result<()>;

/// Every live process below `root` (children, grandchildren, ...).
fn descendants(root: u32) -> BTreeSet<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (comm) state ppid ...; comm may hold spaces: split after ')'.
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let zombie = fields.first() == Some(&"Z");
            let ppid = fields.get(1)?.parse().ok()?;
            (!zombie).then_some((pid, ppid))
        })
        .collect();
    let mut found = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, ppid) in &parents {
            if *ppid == parent && found.insert(*pid) {
                frontier.push(*pid);
            }
        }
    }
    found
}

fn command_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ")
}

async fn interrupted_bench_leaves_nothing(signal: i32) -> TestResult {
    let mut bench = tokio::process::Command::new(env!("CARGO_BIN_EXE_bucketmap-dev"))
        .args(["bench", "--shapes", "200x1", "--no-steady-state"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start bucketmap bench")?;
    let pid = bench.id().context("bench exited at once")?;

    // Wait until the bench runs the operator next to the control plane.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let started = loop {
        let below = descendants(pid);
        let commands: Vec<String> = below.iter().map(|p| command_of(*p)).collect();
        let has = |what: &str| commands.iter().any(|c| c.contains(what));
        if has("kube-apiserver") && has("etcd") && has(" operator ") {
            break below;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the bench never started its processes: {commands:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Delivered with kill(1), as a person (or an init system) would.
    let sent = tokio::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(sent.success(), "kill -{signal} {pid} failed");
    let status = tokio::time::timeout(Duration::from_secs(30), bench.wait())
        .await
        .context("the bench did not stop within 30 s of the signal")??;
    assert!(!status.success(), "an interrupted bench reports failure");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<String> = started
            .iter()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .filter(|p| {
                // Reaped or zombie processes do not count as running.
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .map(|s| {
                        !s.rsplit_once(')')
                            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                    })
                    .unwrap_or(false)
            })
            .map(|p| format!("{p}: {}", command_of(*p)))
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "still running after the bench stopped: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn sigterm_stops_the_bench_and_everything_it_started() -> TestResult {
    interrupted_bench_leaves_nothing(15).await
}

#[tokio::test]
async fn ctrl_c_stops_the_bench_and_everything_it_started() -> TestResult {
    interrupted_bench_leaves_nothing(2).await
}
