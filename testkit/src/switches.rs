//! Environment switches that change what a test checks (skip it, shrink
//! it, point it elsewhere), read in one place so that one rule holds for
//! all of them: a switch is for a person at a terminal, never for CI. Under
//! `CI=true` a test that finds one of its switches set fails, naming the
//! variable, rather than passing having checked less. `.ci/fast` and
//! `.ci/run` refuse them too, whatever `CI` says.
//!
//! A switch is honoured only when set to something other than empty or
//! `0`.

/// The value of switch `name` when it is set (not empty, not `0`).
///
/// # Panics
///
/// When it is set and `CI` is `true`: the test fails, naming `name`.
pub fn value(name: &str) -> Option<String> {
    let value = std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty() && v != "0")?;
    if let Some(refusal) = refusal(name, &value, std::env::var("CI").ok().as_deref()) {
        panic!("{refusal}");
    }
    Some(value)
}

/// Whether switch `name` is set (not empty, not `0`); see [`value`].
///
/// # Panics
///
/// When it is set and `CI` is `true`.
pub fn flag(name: &str) -> bool {
    value(name).is_some()
}

/// Switch `name` read as a number, else `default`; see [`value`].
///
/// # Panics
///
/// When it is set and `CI` is `true`, or set to something that is not a
/// number (a typo must not silently give the default).
pub fn number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match value(name) {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    }
}

/// Why switch `name`, set to `value`, is refused when the environment's
/// `CI` is `ci`; `None` when it is honoured.
fn refusal(name: &str, value: &str, ci: Option<&str>) -> Option<String> {
    ci.is_some_and(|ci| ci.eq_ignore_ascii_case("true"))
        .then(|| {
            format!(
                "{name}={value} is set and CI=true: this switch changes what the test checks, \
             and CI runs every test in full; unset {name}"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn a_switch_is_refused_under_ci_naming_the_variable() {
        let refused = refusal("BUCKETMAP_EXAMPLE", "1", Some("true"));
        assert!(
            refused
                .as_deref()
                .is_some_and(|r| r.contains("BUCKETMAP_EXAMPLE=1") && r.contains("CI=true")),
            "{refused:?}"
        );
        assert!(refusal("BUCKETMAP_EXAMPLE", "1", Some("TRUE")).is_some());
    }

    #[test]
    fn a_switch_is_honoured_outside_ci() {
        for ci in [None, Some("false"), Some("")] {
            assert_eq!(refusal("BUCKETMAP_EXAMPLE", "1", ci), None, "CI={ci:?}");
        }
    }
}
