//! Failures collected across many checks, reported together, so one run
//! shows everything that is wrong.

use std::fmt::Debug;

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
