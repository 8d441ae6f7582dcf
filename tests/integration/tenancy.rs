//! The tenancy policy on a real API server and the GCS mock: refused at
//! admission by the shipped webhook (served by the operator binary), and
//! again by the controller, which creates no bucket for a refused resource.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bucketmap::crd::Gcs;
use bucketmap::tenancy::Policy;
use bucketmap_testkit::free_port;
use common::{Fixture, PROJECT, physical};
use kube::api::{Patch, PatchParams};

type TestResult = anyhow::Result<()>;

/// Buckets whose name starts with `logical-`.
fn buckets_named(f: &Fixture, logical: &str) -> usize {
    f.gcs
        .buckets()
        .iter()
        .filter(|b| b.bucket_id.starts_with(&format!("{logical}-")))
        .count()
}

/// One rule for the fixture's namespace.
fn team_policy(ns: &str, max: u32) -> anyhow::Result<Policy> {
    Ok(serde_yaml::from_str(&format!(
        "rules:\n- name: team\n  namespaces: [{ns}]\n  projects: [{PROJECT}, team-project]\n  \
         storageClasses: [STANDARD]\n  allowForceDestroy: false\n  maxBucketsPerNamespace: {max}\n"
    ))?)
}

/// The `Ready` message of `name` once its reason is NotAllowedByPolicy.
async fn refusal(f: &Fixture, name: &str) -> anyhow::Result<String> {
    let g = f.wait_reason(name, "NotAllowedByPolicy").await?;
    Ok(g.ready_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default())
}

#[tokio::test]
async fn the_controller_creates_no_bucket_the_policy_does_not_allow() -> TestResult {
    let mut f = Fixture::new().await?;
    f.config.tenancy = Arc::new(team_policy(&f.ns, 3)?);
    f.start_operator().await?;
    f.create("aaa", serde_json::json!({"bucketName": "aaa"}))
        .await?;
    f.wait_ready("aaa").await?;
    let cases = [
        (
            "bbb",
            serde_json::json!({"bucketName": "bbb", "projectID": "other-project"}),
            "project other-project is not one of test-project, team-project",
        ),
        (
            "ccc",
            serde_json::json!({"bucketName": "ccc", "storageClass": "ARCHIVE"}),
            "storage class ARCHIVE is not one of STANDARD",
        ),
        (
            "ddd",
            serde_json::json!({"bucketName": "ddd", "forceDestroy": true}),
            "forceDestroy is not allowed",
        ),
        (
            "eee",
            serde_json::json!({"bucketName": "eee", "projectID": "team-project"}),
            "would have 5 Gcs resources, more than the 3 allowed",
        ),
    ];
    for (name, spec, why) in &cases {
        f.create(name, spec.clone()).await?;
        let message = refusal(&f, name).await?;
        assert!(message.contains(why), "{name}: {message}");
        assert!(message.contains("rule team"), "{name}: {message}");
    }
    for (name, ..) in &cases {
        assert_eq!(buckets_named(&f, name), 0, "a bucket for refused {name}");
    }
    // Room again: the one within every limit gets its bucket.
    for name in ["bbb", "ccc", "ddd"] {
        f.delete(name).await?;
    }
    let e = f.wait_ready("eee").await?;
    assert_eq!(
        f.gcs.bucket_project(&physical(&e)).as_deref(),
        Some("team-project")
    );
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn two_resources_racing_for_the_last_place_never_both_take_it() -> TestResult {
    let mut f = Fixture::new().await?;
    f.config.tenancy = Arc::new(team_policy(&f.ns, 2)?);
    f.start_operator().await?;
    f.create("aaa", serde_json::json!({"bucketName": "aaa"}))
        .await?;
    f.wait_ready("aaa").await?;
    // Both admitted (no webhook here) at once: exactly one takes the last
    // place, never both (and never neither): each reconcile counts the
    // other when it is already there, and ranks the two the same way.
    let (b, c) = tokio::join!(
        f.create("bbb", serde_json::json!({"bucketName": "bbb"})),
        f.create("ccc", serde_json::json!({"bucketName": "ccc"})),
    );
    b?;
    c?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (first, second) = loop {
        let reason = |g: &Gcs| {
            g.ready_condition()
                .map(|c| c.reason.clone())
                .unwrap_or_default()
        };
        let (rb, rc) = (reason(&f.get("bbb").await?), reason(&f.get("ccc").await?));
        match (rb.as_str(), rc.as_str()) {
            ("BucketReady", "NotAllowedByPolicy") => break ("bbb", "ccc"),
            ("NotAllowedByPolicy", "BucketReady") => break ("ccc", "bbb"),
            _ => {}
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "bbb {rb}, ccc {rc}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let message = refusal(&f, second).await?;
    assert!(message.contains("more than the 2 allowed"), "{message}");
    assert_eq!(buckets_named(&f, second), 0);
    assert_eq!(buckets_named(&f, first), 1);
    assert_eq!(f.gcs.buckets().len(), 2, "the limit holds");
    // A place freed goes to the one waiting.
    f.delete(first).await?;
    f.wait_ready(second).await?;
    Ok(())
}

/// Two operators over one control plane and one GCS, each with caches of
/// its own and no leader election between them (the worst case: a leader
/// that stalled after counting and the replica that took over), reconcile
/// resources created at once in a namespace limited to three buckets. The
/// namespace's places (ConfigMap `bucketmap-places-<namespace>`) serialize
/// them through the API server: at no moment are there more than three
/// buckets, and exactly three resources get one.
#[tokio::test]
async fn two_operators_racing_at_the_limit_never_exceed_it() -> TestResult {
    const LIMIT: usize = 3;
    const RESOURCES: usize = 8;
    let mut f = Fixture::new().await?;
    f.config.tenancy = Arc::new(team_policy(&f.ns, LIMIT as u32)?);
    f.start_operator().await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let second = f
        .spawn_operator(f.env.client().await?, async {
            let _ = stopped.await;
        })
        .await?;
    let names: Vec<String> = (0..RESOURCES).map(|i| format!("race{i}")).collect();
    let creates = names
        .iter()
        .map(|n| f.create(n, serde_json::json!({"bucketName": n})));
    for created in futures::future::join_all(creates).await {
        created?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut most = 0;
    loop {
        let buckets = f.gcs.buckets().len();
        most = most.max(buckets);
        assert!(buckets <= LIMIT, "{buckets} buckets, more than {LIMIT}");
        let mut reasons = Vec::new();
        for name in &names {
            let g = f.get(name).await?;
            reasons.push(
                g.ready_condition()
                    .map(|c| c.reason.clone())
                    .unwrap_or_default(),
            );
        }
        let ready = reasons.iter().filter(|r| *r == "BucketReady").count();
        let refused = reasons
            .iter()
            .filter(|r| *r == "NotAllowedByPolicy")
            .count();
        if ready == LIMIT && refused == RESOURCES - LIMIT {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not settled: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A while longer: the refused ones are reconciled again (resyncs), and
    // neither operator lets one through.
    for _ in 0..40 {
        let buckets = f.gcs.buckets().len();
        assert!(buckets <= LIMIT, "{buckets} buckets, more than {LIMIT}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most, LIMIT);
    let _ = stop.send(());
    second.await?;
    Ok(())
}

#[tokio::test]
async fn without_a_rule_a_namespace_may_use_only_the_default_project() -> TestResult {
    let f = Fixture::started().await?;
    f.create("mine", serde_json::json!({"bucketName": "mine"}))
        .await?;
    f.wait_ready("mine").await?;
    f.create(
        "elsewhere",
        serde_json::json!({"bucketName": "elsewhere", "projectID": "someone-elses"}),
    )
    .await?;
    let message = refusal(&f, "elsewhere").await?;
    assert!(
        message.contains("no rule of the tenancy policy selects the namespace")
            && message.contains("only the default project test-project"),
        "{message}"
    );
    assert_eq!(buckets_named(&f, "elsewhere"), 0);
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

/// Creates `name` with `spec`; the API server's refusal, if any.
async fn create_refused(
    f: &Fixture,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<Option<String>> {
    match f.create(name, spec).await {
        Ok(_) => Ok(None),
        Err(e) => Ok(Some(format!("{e:#}"))),
    }
}

/// Waits until the webhook answers: a resource it must refuse is refused.
async fn wait_refusing(f: &Fixture) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let spec = serde_json::json!({"bucketName": "probe", "projectID": "other-project"});
        if let Some(refused) = create_refused(f, "probe", spec).await? {
            return Ok(refused);
        }
        // Admitted while the webhook was not up yet (failurePolicy Ignore).
        f.delete("probe").await?;
        f.wait_gone("probe", Duration::from_secs(30)).await?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the webhook never refused"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator binary serving the webhooks for the fixture's namespace
/// with `policy`, its certificate in `dir`.
fn operator_with_policy(
    f: &Fixture,
    port: u16,
    dir: &std::path::Path,
    policy: &Policy,
) -> anyhow::Result<tokio::process::Child> {
    let file = dir.join("policy.yaml");
    std::fs::write(&file, serde_yaml::to_string(policy)?)?;
    Ok(common::webhooks::operator_with_webhooks(f, port, dir)
        .arg("--tenancy-policy")
        .arg(&file)
        // Where the namespace's places are kept.
        .env("POD_NAMESPACE", &f.config.operator_namespace)
        .spawn()?)
}

/// The IP filter checks CEL cannot express on every Kubernetes the chart
/// admits: a range GCS would refuse, and more ranges than it allows.
async fn ip_filter_refusals(f: &Fixture) -> TestResult {
    // An IP filter range GCS would refuse, which CEL cannot see.
    let host_bits = serde_json::json!({"bucketName": "filtered", "ipFilter": {"mode": "Enabled",
        "publicNetworkSource": {"allowedIpCidrRanges": ["192.0.2.1/24"]}}});
    let refused = create_refused(f, "filtered", host_bits).await?;
    assert!(
        refused.as_deref().is_some_and(
            |r| r.contains("192.0.2.1/24 has host bits set") && r.contains("192.0.2.0/24")
        ),
        "{refused:?}"
    );

    // More ranges than GCS allows, a sum CEL cannot bound on 1.29.
    let ranges = |n: usize, from: usize| -> Vec<String> {
        (from..from + n)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect()
    };
    let too_many = serde_json::json!({"bucketName": "many", "ipFilter": {"mode": "Enabled",
        "publicNetworkSource": {"allowedIpCidrRanges": ranges(101, 0)},
        "vpcNetworkSources": [{"network": "projects/net-p/global/networks/prod",
                               "allowedIpCidrRanges": ranges(100, 101)}]}});
    let refused = create_refused(f, "many", too_many).await?;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("ipFilter allows at most 200 IP ranges in all")),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_webhook_refuses_at_admission_what_the_policy_does_not_allow() -> TestResult {
    let f = Fixture::new().await?;
    let (ca, dir) = common::certs::cert_files()?;
    let port = free_port()?;
    common::webhooks::register_shipped(&f, "policy.gcs.bucketmap.dev", port, "/validate-gcs", &ca)
        .await?;
    let _operator = operator_with_policy(&f, port, dir.path(), &team_policy(&f.ns, 2)?)?;
    let refused = wait_refusing(&f).await?;
    assert!(
        refused.contains("policy.gcs.bucketmap.dev")
            && refused.contains("project other-project is not one of test-project, team-project"),
        "{refused}"
    );
    let refused = create_refused(
        &f,
        "cold",
        serde_json::json!({"bucketName": "cold", "storageClass": "COLDLINE"}),
    )
    .await?;
    assert!(
        refused.is_some_and(|r| r.contains("storage class COLDLINE")),
        "COLDLINE admitted"
    );
    ip_filter_refusals(&f).await?;

    f.create("fine", serde_json::json!({"bucketName": "fine"}))
        .await?;
    f.wait_ready("fine").await?;
    // A spec change the policy does not allow is refused; a label is not
    // the policy's business.
    let api = f.api();
    let archive = serde_json::json!({"spec": {"storageClass": "ARCHIVE"}});
    let err = api
        .patch("fine", &PatchParams::default(), &Patch::Merge(archive))
        .await
        .expect_err("ARCHIVE admitted");
    assert!(err.to_string().contains("storage class ARCHIVE"), "{err}");
    let label = serde_json::json!({"metadata": {"labels": {"team": "aaa"}}});
    api.patch("fine", &PatchParams::default(), &Patch::Merge(label))
        .await?;

    f.create("second", serde_json::json!({"bucketName": "second"}))
        .await?;
    let refused = create_refused(&f, "third", serde_json::json!({"bucketName": "third"})).await?;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("would have 3 Gcs resources, more than the 2 allowed")),
        "{refused:?}"
    );
    Ok(())
}
