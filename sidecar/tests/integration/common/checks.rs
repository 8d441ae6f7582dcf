//! Failures collected across many checks, reported together, so one run
//! shows everything that is wrong.

use std::fmt::Debug;

use serde_json::Value;

#[derive(Default)]
pub struct Checks {
    pub failures: Vec<String>,
}

impl Checks {
    pub fn fail(&mut self, msg: impl Into<String>) {
        self.failures.push(msg.into());
    }

    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(msg());
        }
    }

    pub fn eq<T: PartialEq + Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.failures
                .push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }

    /// Panic with every failure and `context` (log tails, file paths).
    pub fn finish(self, title: &str, context: &str) {
        if !self.failures.is_empty() {
            let list: Vec<String> = self.failures.iter().map(|f| format!("  - {f}")).collect();
            panic!(
                "{title}: {} failure(s)\n{}\n\n{context}",
                self.failures.len(),
                list.join("\n")
            );
        }
    }
}

/// A tool's steps through the sidecar have the outcomes they had straight
/// against the emulator (`direct`: at least `min_steps` of them, each a
/// JSON object with `step` and `ok`); directly, only the `missing*` steps
/// fail.
pub fn check_same_outcomes(c: &mut Checks, direct: &[Value], sidecar: &[Value], min_steps: usize) {
    c.check(direct.len() >= min_steps, || {
        format!("{} steps reported, want {min_steps}", direct.len())
    });
    c.eq("number of steps", sidecar.len(), direct.len());
    for (want, got) in direct.iter().zip(sidecar) {
        c.eq(&format!("step {}", want["step"]), got, want);
    }
    for step in direct {
        let failed_on_purpose = step["step"]
            .as_str()
            .is_some_and(|s| s.starts_with("missing"));
        c.check(step["ok"] == Value::Bool(!failed_on_purpose), || {
            format!("directly, step {step} has the wrong outcome")
        });
    }
}
