//! The fake API server's write semantics that need more than a merge:
//! server-side apply (field ownership per manager in `managedFields`, a
//! manager's dropped fields removed, conflicts with other managers),
//! JSON patch as the API server runs it, and label and field selectors.
//!
//! Server-side apply is modelled at the level the operator relies on:
//! objects are merged field by field and lists are atomic (owned whole).

use serde_json::{Map, Value, json};

use super::api::ApiError;

type Path = Vec<String>;

/// Applies `applied` as `manager` (to the status subresource when `sub`
/// is `status`): the object to store and its new `managedFields`.
pub(super) fn apply(
    old: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    sub: Option<&str>,
) -> Result<(Value, Value), ApiError> {
    let empty = json!({});
    let current = old.unwrap_or(&empty);
    let owners = Owners::of(current, manager, sub.unwrap_or(""));
    let new_paths = applied_paths(applied, owners.sub);
    if !force {
        conflicts(current, applied, &new_paths, &owners.others)?;
    }
    let owned_by_others = |p: &Path| {
        let mut owned = owners.others.iter().flat_map(|(_, ps)| ps);
        owned.any(|q| overlaps(p, q))
    };
    let mut obj = current.clone();
    let dropped = owners.mine.iter().filter(|p| !new_paths.contains(p));
    for p in dropped.filter(|p| !owned_by_others(p)) {
        remove_path(&mut obj, p);
    }
    for p in &new_paths {
        set_path(&mut obj, p, value_at(applied, p).clone());
    }
    for field in ["apiVersion", "kind"] {
        if let Some(v) = applied.get(field) {
            obj[field] = v.clone();
        }
    }
    if old.is_none() {
        obj["metadata"]["name"] = applied["metadata"]["name"].clone();
    }
    // A resourceVersion in the applied object is a precondition, checked
    // where every write is (`State::store`): 409 when it is not current.
    if let Some(version) = applied.pointer("/metadata/resourceVersion") {
        obj["metadata"]["resourceVersion"] = version.clone();
    }
    let managed = owners.after(&new_paths, force, &applied["apiVersion"]);
    Ok((obj, managed))
}

/// Who owns which fields of an object before an apply by `manager`.
struct Owners<'a> {
    manager: &'a str,
    sub: &'a str,
    /// Every `managedFields` entry.
    entries: Vec<Value>,
    /// The fields `manager` applied last time.
    mine: Vec<Path>,
    /// The other managers of the same subresource and their fields.
    others: Vec<(String, Vec<Path>)>,
}

impl<'a> Owners<'a> {
    fn of(current: &Value, manager: &'a str, sub: &'a str) -> Self {
        let entries = current["metadata"]["managedFields"].as_array().cloned();
        let mut owners = Owners {
            manager,
            sub,
            entries: entries.unwrap_or_default(),
            mine: Vec::new(),
            others: Vec::new(),
        };
        for e in &owners.entries {
            if owners.is_mine(e) {
                owners.mine.extend(paths_of(&e["fieldsV1"]));
            } else if subresource(e) == sub {
                let who = e["manager"].as_str().unwrap_or("").to_owned();
                owners.others.push((who, paths_of(&e["fieldsV1"])));
            }
        }
        owners
    }

    fn is_mine(&self, e: &Value) -> bool {
        e["manager"] == self.manager && e["operation"] == "Apply" && subresource(e) == self.sub
    }

    /// `managedFields` after the apply: `manager` owns `applied`; forced,
    /// the others lose those fields.
    fn after(self, applied: &[Path], force: bool, api_version: &Value) -> Value {
        let mut managed: Vec<Value> = self
            .entries
            .iter()
            .filter(|e| !self.is_mine(e))
            .cloned()
            .collect();
        if force {
            take_over(&mut managed, applied, self.sub);
        }
        let mut entry = json!({
            "manager": self.manager, "operation": "Apply", "apiVersion": api_version,
            "fieldsType": "FieldsV1", "fieldsV1": fields_of(applied),
        });
        if !self.sub.is_empty() {
            entry["subresource"] = json!(self.sub);
        }
        managed.push(entry);
        Value::Array(managed)
    }
}

fn subresource(entry: &Value) -> &str {
    entry["subresource"].as_str().unwrap_or("")
}

/// A 409 naming each field that another manager owns with another value.
fn conflicts(
    current: &Value,
    applied: &Value,
    new_paths: &[Path],
    others: &[(String, Vec<Path>)],
) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    for p in new_paths {
        if value_at(current, p) == value_at(applied, p) {
            continue;
        }
        for (who, owned) in others {
            if owned.iter().any(|q| overlaps(p, q)) {
                causes.push((
                    format!(".{}", p.join(".")),
                    format!("conflict with {who:?}"),
                ));
            }
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let message = format!("Apply failed with {} conflicts", causes.len());
    let mut error = ApiError::new(409, "Conflict", message);
    error.causes = causes;
    Err(error)
}

/// A forced apply: other managers of the same subresource lose `taken`.
fn take_over(managed: &mut Vec<Value>, taken: &[Path], sub: &str) {
    for entry in managed.iter_mut() {
        if subresource(entry) != sub {
            continue;
        }
        let kept: Vec<Path> = paths_of(&entry["fieldsV1"])
            .into_iter()
            .filter(|p| !taken.iter().any(|t| overlaps(p, t)))
            .collect();
        entry["fieldsV1"] = fields_of(&kept);
    }
    managed.retain(|e| e["fieldsV1"].as_object().is_some_and(|o| !o.is_empty()));
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The leaves of an applied configuration in its scope: the status for the
/// status subresource, else everything else but identity fields.
fn applied_paths(applied: &Value, sub: &str) -> Vec<Path> {
    let mut out = Vec::new();
    let Some(top) = applied.as_object() else {
        return out;
    };
    for (field, value) in top {
        let in_scope = match sub {
            "status" => field == "status",
            _ => !matches!(field.as_str(), "status" | "apiVersion" | "kind"),
        };
        if !in_scope {
            continue;
        }
        if field == "metadata" {
            for tracked in ["labels", "annotations", "finalizers", "ownerReferences"] {
                if let Some(v) = value.get(tracked) {
                    leaves(v, vec![field.clone(), tracked.to_owned()], &mut out);
                }
            }
        } else {
            leaves(value, vec![field.clone()], &mut out);
        }
    }
    out
}

/// Objects are walked field by field; anything else (lists too) is a leaf.
fn leaves(value: &Value, at: Path, out: &mut Vec<Path>) {
    match value.as_object() {
        Some(o) if !o.is_empty() => {
            for (k, v) in o {
                let mut p = at.clone();
                p.push(k.clone());
                leaves(v, p, out);
            }
        }
        _ => out.push(at),
    }
}

/// `fieldsV1` (`{"f:data": {"f:photos": {}}}`) into leaf paths.
fn paths_of(fields: &Value) -> Vec<Path> {
    fn walk(v: &Value, at: &Path, out: &mut Vec<Path>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|o| o.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() && !at.is_empty() {
            out.push(at.clone());
        }
        for (k, child) in children {
            let mut p = at.clone();
            p.push(k.trim_start_matches("f:").to_owned());
            walk(child, &p, out);
        }
    }
    let mut out = Vec::new();
    walk(fields, &Vec::new(), &mut out);
    out
}

fn fields_of(paths: &[Path]) -> Value {
    let mut root = Value::Object(Map::new());
    for p in paths {
        let mut at = &mut root;
        for segment in p {
            at = at
                .as_object_mut()
                .map(|o| o.entry(format!("f:{segment}")).or_insert_with(|| json!({})))
                .expect("fieldsV1 nodes are objects");
        }
    }
    root
}

fn value_at<'v>(v: &'v Value, p: &Path) -> &'v Value {
    p.iter().fold(v, |at, k| at.get(k).unwrap_or(&Value::Null))
}

fn set_path(v: &mut Value, p: &Path, value: Value) {
    let mut at = v;
    for k in p {
        if !at.is_object() {
            *at = json!({});
        }
        at = at
            .as_object_mut()
            .map(|o| o.entry(k.clone()).or_insert(Value::Null))
            .expect("an object");
    }
    *at = value;
}

/// Removes the leaf at `p`, then the objects it leaves empty.
fn remove_path(v: &mut Value, p: &Path) {
    let Some((last, parents)) = p.split_last() else {
        return;
    };
    let mut at = &mut *v;
    for k in parents {
        match at.get_mut(k) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(o) = at.as_object_mut() {
        o.remove(last);
        if o.is_empty() && !parents.is_empty() {
            remove_path(v, &parents.to_vec());
        }
    }
}

/// A JSON patch as the API server runs it: all or nothing; a `test` of a
/// missing member compares `null` (Go's JSON patch reads an omitted list
/// as null); a failed `test` or an impossible op is a 422.
pub(super) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))?;
    let mut work = doc.clone();
    for op in &ops.0 {
        match op {
            json_patch::PatchOperation::Test(test) => {
                let found = work.pointer(test.path.as_str()).unwrap_or(&Value::Null);
                if *found != test.value {
                    let message = format!(
                        "the server rejected our request due to an error in our request: testing value {} failed",
                        test.path.as_str()
                    );
                    return Err(ApiError::new(422, "Invalid", message));
                }
            }
            other => json_patch::patch(&mut work, std::slice::from_ref(other))
                .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?,
        }
    }
    *doc = work;
    Ok(())
}

/// Drops what the API server omits from metadata: nulls, empty lists and maps.
pub(super) fn normalize(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|_, v| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        });
    }
}

/// Whether `obj`'s labels match a selector (`k=v`, `k!=v`, `k in (a,b)`,
/// `k notin (a,b)`, `k`, `!k`, comma-separated).
pub(super) fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    split_terms(selector).iter().all(|term| {
        let term = term.trim();
        let label = |k: &str| labels.get(k.trim()).and_then(Value::as_str);
        if let Some((k, set)) = term.split_once(" notin ") {
            return label(k).is_none_or(|v| !in_set(set, v));
        }
        if let Some((k, set)) = term.split_once(" in ") {
            return label(k).is_some_and(|v| in_set(set, v));
        }
        if let Some((k, v)) = term.split_once("!=") {
            return label(k) != Some(v.trim());
        }
        if let Some((k, v)) = term.split_once('=') {
            return label(k) == Some(v.trim_start_matches('=').trim());
        }
        match term.strip_prefix('!') {
            Some(k) => label(k).is_none(),
            None => term.is_empty() || label(term).is_some(),
        }
    })
}

fn in_set(set: &str, value: &str) -> bool {
    let set = set.trim().trim_start_matches('(').trim_end_matches(')');
    set.split(',').any(|v| v.trim() == value)
}

/// Splits on the commas outside parentheses.
fn split_terms(selector: &str) -> Vec<String> {
    let (mut out, mut term, mut depth) = (Vec::new(), String::new(), 0);
    for c in selector.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut term));
                continue;
            }
            _ => {}
        }
        term.push(c);
    }
    out.push(term);
    out
}

/// Whether `obj` matches a field selector (`metadata.name=x`, comma-separated).
pub(super) fn fields_match(obj: &Value, selector: &str) -> bool {
    split_terms(selector)
        .iter()
        .filter(|t| !t.is_empty())
        .all(|term| {
            let (path, expected, equal) = match term.split_once("!=") {
                Some((p, v)) => (p, v, false),
                None => match term.split_once('=') {
                    Some((p, v)) => (p, v.trim_start_matches('='), true),
                    None => return false,
                },
            };
            let found = path
                .split('.')
                .fold(obj, |at, k| at.get(k).unwrap_or(&Value::Null));
            (found.as_str() == Some(expected)) == equal
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_fake_api_an_apply_removes_what_its_manager_no_longer_applies_and_keeps_the_rest() {
        let first = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "1", "b": "2"}});
        let (obj, managed) = apply(None, &first, "op", false, None).unwrap();
        let mut obj = obj;
        obj["metadata"]["managedFields"] = managed;
        obj["data"]["c"] = json!("3");
        let second = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"b": "2"}});
        let (obj, _) = apply(Some(&obj), &second, "op", false, None).unwrap();
        assert_eq!(obj["data"], json!({"b": "2", "c": "3"}));
    }

    #[test]
    fn reconcile_fake_api_an_apply_over_another_managers_field_conflicts_unless_forced() {
        let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "theirs"}});
        let (mut obj, managed) = apply(None, &theirs, "them", false, None).unwrap();
        obj["metadata"]["managedFields"] = managed;
        let ours = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "ours"}});
        let refused = apply(Some(&obj), &ours, "us", false, None).unwrap_err();
        assert_eq!((refused.code, refused.causes.len()), (409, 1));
        assert_eq!(refused.causes[0].0, ".data.a");
        let (forced, managed) = apply(Some(&obj), &ours, "us", true, None).unwrap();
        assert_eq!(forced["data"]["a"], "ours");
        assert_eq!(managed.as_array().map(Vec::len), Some(1), "{managed}");
    }

    #[test]
    fn reconcile_fake_api_a_json_patch_test_of_a_missing_list_compares_null_and_a_failed_test_is_422()
     {
        let mut doc = json!({"metadata": {"name": "x"}});
        let add = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                         {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]);
        json_patch(&mut doc, &add).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["f"]));
        let refused = json_patch(&mut doc, &add).unwrap_err();
        assert_eq!(refused.code, 422);
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["f"]),
            "nothing applied"
        );
    }

    #[test]
    fn reconcile_fake_api_selectors_select() {
        let obj = json!({"metadata": {"name": "n", "labels": {"a": "1", "b": "2"}}});
        for (selector, expected) in [
            ("a=1", true),
            ("a==1", true),
            ("a=2", false),
            ("a!=2", true),
            ("a in (0,1)", true),
            ("a in (0, 2)", false),
            ("a notin (2)", true),
            ("c", false),
            ("!c", true),
            ("a=1,b=2", true),
            ("a=1,b in (3)", false),
            ("", true),
        ] {
            assert_eq!(labels_match(&obj, selector), expected, "{selector}");
        }
        assert!(fields_match(&obj, "metadata.name=n"));
        assert!(!fields_match(&obj, "metadata.name=m"));
        assert!(fields_match(&obj, "metadata.name!=m"));
    }
}
