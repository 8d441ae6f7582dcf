use super::*;

fn policy(yaml: &str) -> Policy {
    let policy: Policy = serde_yaml::from_str(yaml).expect("policy");
    policy.check().expect("valid");
    policy
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A request in `ns` for `project`, everything else the defaults.
fn request<'a>(ns: &'a str, l: &'a BTreeMap<String, String>, project: &'a str) -> Request<'a> {
    Request {
        namespace: ns,
        namespace_labels: l,
        project,
        default_project: Some("shared"),
        storage_class: "STANDARD",
        location: "US",
        force_destroy: false,
        buckets: Some(1),
    }
}

const TEAMS: &str = r"
rules:
  - name: team-a
    namespaces: [team-a-*]
    projects: [a-prod, a-dev]
    storageClasses: [STANDARD, NEARLINE]
    locations: [eu, europe-west1]
    allowForceDestroy: false
    maxBucketsPerNamespace: 3
  - name: labelled
    namespaceSelector:
      matchExpressions: [{key: tier, operator: In, values: [batch]}]
    projects: [batch]
";

#[test]
fn without_rules_a_namespace_may_use_the_default_project_only() {
    let p = Policy::default();
    let none = labels(&[]);
    assert_eq!(p.allows(&request("dev", &none, "shared")), Ok(()));
    let refused = p.allows(&request("dev", &none, "prod")).unwrap_err();
    assert!(
        refused
            .0
            .contains("project prod is not allowed in namespace dev"),
        "{refused}"
    );
    assert!(
        refused.0.contains("only the default project shared"),
        "{refused}"
    );
    let no_default = Request {
        default_project: None,
        ..request("dev", &none, "shared")
    };
    let refused = p.allows(&no_default).unwrap_err();
    assert!(refused.0.contains("may use no project"), "{refused}");
}

#[test]
fn a_rule_grants_its_projects_to_the_namespaces_it_names() {
    let p = policy(TEAMS);
    let none = labels(&[]);
    let eu = |project| Request {
        location: "EU",
        ..request("team-a-staging", &none, project)
    };
    assert_eq!(p.allows(&eu("a-prod")), Ok(())); // prefix match, location in any case
    assert_eq!(p.allows(&eu("a-dev")), Ok(()));
    let refused = p.allows(&eu("shared")).unwrap_err();
    assert!(
        refused
            .0
            .contains("rule team-a: project shared is not one of a-prod, a-dev"),
        "{refused}"
    );
    // Another namespace is not selected: the default project only.
    assert!(p.allows(&request("team-b", &none, "a-prod")).is_err());
    assert_eq!(p.allows(&request("team-b", &none, "shared")), Ok(()));
}

#[test]
fn every_limit_of_the_rule_is_checked() {
    let p = policy(TEAMS);
    let none = labels(&[]);
    let ok = Request {
        location: "europe-west1",
        ..request("team-a-x", &none, "a-prod")
    };
    assert_eq!(p.allows(&ok), Ok(()));
    let cases = [
        (
            Request {
                storage_class: "ARCHIVE",
                ..ok.clone()
            },
            "storage class ARCHIVE is not one of STANDARD, NEARLINE",
        ),
        (
            Request {
                location: "US",
                ..ok.clone()
            },
            "location US is not one of eu, europe-west1",
        ),
        (
            Request {
                force_destroy: true,
                ..ok.clone()
            },
            "forceDestroy is not allowed",
        ),
        (
            Request {
                buckets: Some(4),
                ..ok.clone()
            },
            "would have 4 Gcs resources, more than the 3 allowed",
        ),
    ];
    for (req, why) in cases {
        let refused = p.allows(&req).unwrap_err();
        assert!(refused.0.contains(why), "{refused} lacks {why}");
        assert!(refused.0.contains("namespace team-a-x"), "{refused}");
    }
    // A resource that has its bucket is not counted again.
    assert_eq!(
        p.allows(&Request {
            buckets: None,
            ..ok.clone()
        }),
        Ok(())
    );
    assert_eq!(
        p.allows(&Request {
            buckets: Some(3),
            ..ok
        }),
        Ok(())
    );
}

#[test]
fn a_label_selector_selects_namespaces_and_one_allowing_rule_is_enough() {
    let p = policy(TEAMS);
    let batch = labels(&[("tier", "batch")]);
    assert_eq!(p.allows(&request("jobs", &batch, "batch")), Ok(()));
    // Selected by a rule, so the default project is no longer implied.
    let refused = p.allows(&request("jobs", &batch, "shared")).unwrap_err();
    assert!(
        refused
            .0
            .contains("rule labelled: project shared is not one of batch"),
        "{refused}"
    );
    // Selected by both rules: either may allow it; both reasons are told.
    let both = request("team-a-batch", &batch, "batch");
    assert_eq!(p.allows(&both), Ok(()));
    let refused = p
        .allows(&request("team-a-batch", &batch, "other"))
        .unwrap_err();
    assert!(
        refused.0.contains("rule team-a:") && refused.0.contains("rule labelled:"),
        "{refused}"
    );
}

#[test]
fn an_empty_project_list_means_the_default_project() {
    let p = policy("rules: [{namespaces: [ci], allowForceDestroy: false}]");
    let none = labels(&[]);
    assert_eq!(p.allows(&request("ci", &none, "shared")), Ok(()));
    assert!(p.allows(&request("ci", &none, "other")).is_err());
    let fd = Request {
        force_destroy: true,
        ..request("ci", &none, "shared")
    };
    assert!(p.allows(&fd).is_err());
}

#[test]
fn a_policy_with_unknown_fields_or_a_bad_selector_is_refused() {
    let dir = std::env::temp_dir().join(format!("tenancy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("policy.yaml");
    std::fs::write(&file, "rules: [{namespaces: [a], project: [typo]}]").expect("write");
    let err = format!("{:#}", Policy::from_file(&file).unwrap_err());
    assert!(err.contains("unknown field `project`"), "{err}");
    std::fs::write(
        &file,
        "rules: [{namespaceSelector: {matchExpressions: [{key: a, operator: Bogus}]}}]",
    )
    .expect("write");
    let err = format!("{:#}", Policy::from_file(&file).unwrap_err());
    assert!(err.contains("rules[0]: bad namespaceSelector"), "{err}");
    std::fs::write(&file, TEAMS).expect("write");
    assert_eq!(Policy::from_file(&file).expect("reads"), policy(TEAMS));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn an_empty_rule_in_code_means_what_it_means_in_a_file() {
    let read: Policy = serde_yaml::from_str("rules: [{}]").expect("policy");
    assert_eq!(read.rules, [Rule::default()]);
}
