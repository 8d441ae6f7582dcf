//! kubectl as a child process. A module of its own, without the fixture,
//! so that `tests/integration/chart` (a test target of its own) includes it by path.

use anyhow::Context as _;
use tokio::io::AsyncWriteExt as _;

/// `kubectl --kubeconfig KUBECONFIG args…` with `stdin` (without blocking
/// the runtime); its output, whatever the status.
pub async fn kubectl_with_stdin(
    kubeconfig: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    stdin: &str,
) -> anyhow::Result<std::process::Output> {
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run kubectl")?;
    let mut input = child.stdin.take().context("kubectl without stdin")?;
    input.write_all(stdin.as_bytes()).await?;
    drop(input);
    Ok(child.wait_with_output().await?)
}
