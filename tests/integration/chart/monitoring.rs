//! The chart's alerts and dashboard against the code: every `bucketmap_*`
//! metric they use is one the operator or the sidecar exports, and every
//! alert links a runbook section that docs/RUNBOOKS.md has. (The API
//! server's metrics the webhook alerts and panels use are checked against
//! a real API server in `lifecycle`.)

use std::collections::BTreeSet;

use anyhow::Context as _;
use serde_json::Value;

use super::{ROOT, TestResult, chart_dir, get, helm, helm_template, objects};

/// The metric names in a PromQL expression that belong to bucketmap or to
/// the API server (the only ones the chart's queries use); quoted label
/// values are skipped.
pub(super) fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            i += expr[i + 1..].find('"').map_or(bytes.len(), |n| n + 2);
            continue;
        }
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word
            && (expr[i..].starts_with("bucketmap_") || expr[i..].starts_with("apiserver_"))
        {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// The sample names of an exposition's `# TYPE` lines: `name_total` for a
/// counter, `name_bucket`/`_sum`/`_count` for a histogram, `name` otherwise.
fn sample_names(types: impl Iterator<Item = (String, String)>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (name, kind) in types {
        match kind.as_str() {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                out.insert(name);
            }
        }
    }
    out
}

/// What the operator exports, from its own registry's exposition after
/// one call of each recorder (a labelled family without a series is not
/// in the exposition at all).
fn operator_metrics() -> anyhow::Result<BTreeSet<String>> {
    let metrics = bucketmap::metrics::Metrics::default();
    drop(metrics.reconcile_started());
    metrics.reconcile_failed("kube");
    metrics.observe_gcs_call("GetBucket", "OK", std::time::Duration::from_millis(1));
    metrics.map_written("written");
    metrics.event_dropped();
    let text = metrics.encode()?;
    let types = text.lines().filter_map(|l| {
        let mut words = l.strip_prefix("# TYPE ")?.split_whitespace();
        Some((words.next()?.to_owned(), words.next()?.to_owned()))
    });
    let names = sample_names(types);
    anyhow::ensure!(
        names.contains("bucketmap_reconciles_total"),
        "the operator's exposition has no bucketmap_reconciles_total: {text}"
    );
    Ok(names)
}

/// What the sidecar exports, read from sidecar/src/metrics.rs (the root
/// crate's tests cannot link the sidecar crate): its registry's prefix, and
/// each `register("name", …, self.field.clone())` with the type of `field`.
fn sidecar_metrics() -> anyhow::Result<BTreeSet<String>> {
    let source = std::fs::read_to_string(format!("{ROOT}/sidecar/src/metrics.rs"))?;
    let quoted = |s: &str| s.split('"').nth(1).map(str::to_owned);
    let prefix = source
        .split("Registry::with_prefix(")
        .nth(1)
        .and_then(quoted)
        .context("sidecar/src/metrics.rs: no Registry::with_prefix(\"...\")")?;
    let mut types = Vec::new();
    for call in source.split(".register(").skip(1) {
        let call = call.split(");").next().unwrap_or_default();
        let name = quoted(call).context("a register call without a name")?;
        let field = call
            .split("self.")
            .nth(1)
            .and_then(|f| f.split('.').next())
            .with_context(|| format!("register({name:?}): no self.field"))?;
        let declaration = source
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("pub {field}: ")))
            .with_context(|| format!("no declaration of the field {field}"))?;
        let kind = ["Counter", "Gauge", "Histogram"]
            .into_iter()
            .find(|k| declaration.contains(k))
            .with_context(|| format!("{declaration}: no metric type"))?;
        types.push((format!("{prefix}_{name}"), kind.to_ascii_lowercase()));
    }
    anyhow::ensure!(
        types.len() >= 5,
        "sidecar/src/metrics.rs: only {} metrics read ({types:?}); has its layout changed?",
        types.len()
    );
    Ok(sample_names(types.into_iter()))
}

fn exported() -> anyhow::Result<BTreeSet<String>> {
    let mut all = operator_metrics()?;
    all.extend(sidecar_metrics()?);
    Ok(all)
}

/// The alerts the chart renders with `prometheusRule.enabled`: (name, expr).
pub(super) async fn alert_rules() -> anyhow::Result<Vec<(String, String)>> {
    Ok(rendered_rules()
        .await?
        .iter()
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_owned(),
                r["expr"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

async fn rendered_rules() -> anyhow::Result<Vec<Value>> {
    let helm = helm().await?;
    let rendered = helm_template(&helm, &["--set", "prometheusRule.enabled=true"]).await?;
    let objs = objects(&rendered, "helm template --set prometheusRule.enabled=true")?;
    let rule = get(&objs, "PrometheusRule", "bucketmap")?;
    let rules: Vec<Value> = rule["spec"]["groups"]
        .as_array()
        .context("no groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    anyhow::ensure!(!rules.is_empty(), "the PrometheusRule has no rules");
    Ok(rules)
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names(
            r#"sum by (error) (rate(bucketmap_reconcile_failures_total{namespace="x"}[5m])) / ignoring(le) apiserver_admission_webhook_rejection_count{name="bucketmap_x",e=~"a|apiserver_y"} + my_bucketmap_other + bucketmap_sidecar_in_flight_requests"#
        ),
        BTreeSet::from([
            "apiserver_admission_webhook_rejection_count".to_owned(),
            "bucketmap_reconcile_failures_total".to_owned(),
            "bucketmap_sidecar_in_flight_requests".to_owned(),
        ])
    );
}

#[tokio::test]
async fn every_alert_uses_exported_metrics_and_links_its_runbook() -> TestResult {
    let exported = exported()?;
    let runbooks = std::fs::read_to_string(format!("{ROOT}/docs/RUNBOOKS.md"))?;
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(format!(
        "{}/values.yaml",
        chart_dir()
    ))?)?;
    let base = values["prometheusRule"]["runbookBaseUrl"]
        .as_str()
        .context("no prometheusRule.runbookBaseUrl")?;
    let rules = rendered_rules().await?;
    let mut used = BTreeSet::new();
    for rule in &rules {
        let alert = rule["alert"].as_str().context("a rule without alert")?;
        let expr = rule["expr"].as_str().context("a rule without expr")?;
        for name in metric_names(expr) {
            assert!(
                name.starts_with("apiserver_") || exported.contains(&name),
                "{alert} uses {name}, which neither the operator nor the sidecar exports"
            );
            used.insert(name);
        }
        assert!(
            ["critical", "warning", "info"]
                .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{alert}: no severity"
        );
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{alert}: no summary"
        );
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .with_context(|| format!("{alert}: no runbook_url"))?;
        let section = url
            .strip_prefix(&format!("{base}#"))
            .with_context(|| format!("{alert}: {url} is not under {base}"))?;
        assert_eq!(section, alert.to_lowercase(), "{alert}: {url}");
        assert!(
            sections.contains(section),
            "{alert}: docs/RUNBOOKS.md has no section #{section} (has {sections:?})"
        );
    }
    // The alerts issue 36 asks for: reconcile errors, webhook failures,
    // sidecar refusals.
    for needed in [
        "bucketmap_reconcile_failures_total",
        "apiserver_admission_webhook_rejection_count",
        "bucketmap_sidecar_refused_requests_total",
    ] {
        assert!(used.contains(needed), "no alert on {needed}: {used:?}");
    }
    Ok(())
}

/// The dashboard's queries: (panel title, expr).
pub(super) fn dashboard_queries() -> anyhow::Result<Vec<(String, String)>> {
    let path = format!("{}/dashboards/bucketmap.json", chart_dir());
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{path} is not JSON"))?;
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().context("no panels")? {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                panel["title"].as_str().unwrap_or_default().to_owned(),
                target["expr"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    anyhow::ensure!(!exprs.is_empty(), "{path}: no queries");
    Ok(exprs)
}

#[test]
fn the_dashboard_queries_exported_metrics() -> TestResult {
    let exported = exported()?;
    let exprs = dashboard_queries()?;
    let mut used = BTreeSet::new();
    for (title, expr) in &exprs {
        let names = metric_names(expr);
        assert!(
            !names.is_empty(),
            "{title}: {expr:?} queries no bucketmap metric"
        );
        for name in names {
            assert!(
                name.starts_with("apiserver_") || exported.contains(&name),
                "panel {title:?} queries {name}, which neither the operator nor the sidecar exports"
            );
            used.insert(name);
        }
    }
    for prefix in [
        "bucketmap_sidecar_",
        "bucketmap_reconcile",
        "apiserver_admission_webhook",
    ] {
        assert!(
            used.iter().any(|n| n.starts_with(prefix)),
            "the dashboard shows no {prefix}* metric"
        );
    }
    Ok(())
}
