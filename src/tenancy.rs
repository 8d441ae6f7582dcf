//! The tenancy policy: which namespaces may put buckets in which projects,
//! with which storage classes and locations, whether `forceDestroy` is
//! theirs to set, and how many buckets each may have.
//!
//! The cluster's administrators write it (the chart's `tenancy` values, a
//! file the operator reads with `--tenancy-policy`); tenants, who write
//! `Gcs` resources, cannot change it. It is checked at admission (the
//! `/validate-gcs` webhook) for a clear refusal at `kubectl apply`, and
//! again by the controller before it creates a bucket, so that a resource
//! admitted while the webhook was down, or before a stricter policy, gets
//! no bucket it may not have.
//!
//! A rule *selects* namespaces (by name, a trailing `*` matching a prefix,
//! and by labels); a resource is allowed when one rule that selects its
//! namespace allows all of it. A namespace no rule selects may use the
//! default project only: the operator's `--default-project`, or the one its
//! `bucketmap.dev/project-id` annotation pins (administrators set that too).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt as _};
use serde::{Deserialize, Serialize};

/// The whole policy: its rules, in order.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// The rules; none: every namespace may use the default project only.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// One grant to the namespaces it selects.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// Named in refusals; default: `rules[<index>]`.
    #[serde(default)]
    pub name: Option<String>,
    /// Namespace names; `team-a-*` matches by prefix. Empty: any name.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces by label. Absent: any labels.
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    /// Projects allowed. Empty: the default project only.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Storage classes allowed (`STANDARD`, ...). Empty: any.
    #[serde(default)]
    pub storage_classes: Vec<String>,
    /// Locations allowed, in any case (`EU`, `europe-west1`). Empty: any.
    #[serde(default)]
    pub locations: Vec<String>,
    /// Whether `forceDestroy: true` (delete every object with the bucket) is
    /// allowed.
    #[serde(default = "yes")]
    pub allow_force_destroy: bool,
    /// Most `Gcs` resources per namespace. Absent: no limit.
    #[serde(default)]
    pub max_buckets_per_namespace: Option<u32>,
}

fn yes() -> bool {
    true
}

/// What a rule with no fields means (as read from a file): selects every
/// namespace, the default project only, any class and location,
/// `forceDestroy` allowed, no limit.
impl Default for Rule {
    fn default() -> Self {
        Rule {
            name: None,
            namespaces: Vec::new(),
            namespace_selector: None,
            projects: Vec::new(),
            storage_classes: Vec::new(),
            locations: Vec::new(),
            allow_force_destroy: true,
            max_buckets_per_namespace: None,
        }
    }
}

/// What a resource asks for, in the terms the policy speaks.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The resource's namespace.
    pub namespace: &'a str,
    /// That namespace's labels.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// The project the bucket would live in.
    pub project: &'a str,
    /// The default projects: the namespace's annotation, else the
    /// operator's `--default-project`.
    pub default_project: Option<&'a str>,
    /// As GCS spells it.
    pub storage_class: &'a str,
    /// The bucket's location.
    pub location: &'a str,
    /// `spec.forceDestroy`.
    pub force_destroy: bool,
    /// `Gcs` resources of the namespace, this one included; `None`: not
    /// counted (the resource already has its bucket).
    pub buckets: Option<usize>,
}

/// Why a resource is refused: the message says which rules were tried and
/// what each did not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl Policy {
    /// Reads the policy from a YAML (or JSON) file, checking every rule.
    pub fn from_file(path: &Path) -> anyhow::Result<Policy> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tenancy policy {}", path.display()))?;
        let policy: Policy = serde_yaml::from_str(&text)
            .with_context(|| format!("the tenancy policy {} is not valid", path.display()))?;
        policy
            .check()
            .with_context(|| format!("the tenancy policy {} is not valid", path.display()))?;
        Ok(policy)
    }

    /// Refuses a rule whose selector cannot be evaluated.
    pub fn check(&self) -> anyhow::Result<()> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.selector()
                .with_context(|| format!("{}: bad namespaceSelector", rule.label(i)))?;
        }
        Ok(())
    }

    /// Whether any rule limits the number of resources per namespace (they
    /// need counting only then).
    pub fn limits_count(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.max_buckets_per_namespace.is_some())
    }

    /// Allows `request`, or says why not.
    pub fn allows(&self, request: &Request<'_>) -> Result<(), Refusal> {
        let mut why = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.selects(request.namespace, request.namespace_labels) {
                continue;
            }
            match rule.refusal(request) {
                None => return Ok(()),
                Some(reason) => why.push(format!("{}: {reason}", rule.label(i))),
            }
        }
        if why.is_empty() {
            return default_rule(request);
        }
        Err(Refusal(format!(
            "not allowed by the tenancy policy in namespace {}: {}",
            request.namespace,
            why.join("; ")
        )))
    }
}

/// A namespace no rule selects: the default project only.
fn default_rule(request: &Request<'_>) -> Result<(), Refusal> {
    if request.default_project == Some(request.project) {
        return Ok(());
    }
    let allowed = request.default_project.map_or_else(
        || "no project".to_owned(),
        |p| format!("only the default project {p}"),
    );
    Err(Refusal(format!(
        "project {} is not allowed in namespace {}: no rule of the tenancy policy selects the namespace, so it may use {allowed}; ask the cluster's administrators for a rule",
        request.project, request.namespace
    )))
}

impl Rule {
    fn label(&self, index: usize) -> String {
        self.name
            .as_ref()
            .map_or_else(|| format!("rules[{index}]"), |n| format!("rule {n}"))
    }

    fn selector(&self) -> anyhow::Result<Option<Selector>> {
        self.namespace_selector
            .clone()
            .map(Selector::try_from)
            .transpose()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Whether the rule speaks for namespace `ns` with `labels`.
    fn selects(&self, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        let named = self.namespaces.is_empty()
            || self.namespaces.iter().any(|n| match n.strip_suffix('*') {
                Some(prefix) => ns.starts_with(prefix),
                None => ns == n,
            });
        // A bad selector was refused when the policy was read; were one to
        // get here, it selects nothing (fail closed).
        let labelled = match self.selector() {
            Ok(None) => true,
            Ok(Some(selector)) => selector.matches(labels),
            Err(_) => false,
        };
        named && labelled
    }

    /// What the rule does not allow of `request`, if anything.
    fn refusal(&self, request: &Request<'_>) -> Option<String> {
        let project_ok = if self.projects.is_empty() {
            request.default_project == Some(request.project)
        } else {
            self.projects.iter().any(|p| p == request.project)
        };
        if !project_ok {
            let allowed = if self.projects.is_empty() {
                request.default_project.unwrap_or("none").to_owned()
            } else {
                self.projects.join(", ")
            };
            return Some(format!(
                "project {} is not one of {allowed}",
                request.project
            ));
        }
        if !self.storage_classes.is_empty()
            && !self
                .storage_classes
                .iter()
                .any(|c| c == request.storage_class)
        {
            return Some(format!(
                "storage class {} is not one of {}",
                request.storage_class,
                self.storage_classes.join(", ")
            ));
        }
        if !self.locations.is_empty()
            && !self
                .locations
                .iter()
                .any(|l| l.eq_ignore_ascii_case(request.location))
        {
            return Some(format!(
                "location {} is not one of {}",
                request.location,
                self.locations.join(", ")
            ));
        }
        if request.force_destroy && !self.allow_force_destroy {
            return Some("forceDestroy is not allowed".to_owned());
        }
        match (self.max_buckets_per_namespace, request.buckets) {
            (Some(max), Some(n)) if n > max as usize => Some(format!(
                "the namespace would have {n} Gcs resources, more than the {max} allowed"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
