//! Whether the disruptions the chaos run planned happened: a run whose
//! kills failed, whose leader was never killed, or whose faults were never
//! injected proves nothing about them, so it fails like a broken promise.
//! Plain data in, [`Violation`]s and the lines of what was verified out.

use super::check::Violation;

/// The replica kills a run planned and what the supervisor counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kills {
    /// SIGKILLs planned (`--kills`).
    pub planned: u32,
    /// Of which planned to hit the Lease holder.
    pub planned_leader: u32,
    /// SIGKILLs that killed a running replica.
    pub done: u32,
    /// Of which to the Lease holder.
    pub done_leader: u32,
    /// SIGKILLs that failed (the process was not killed by them).
    pub failed: u32,
}

/// One kind of injected GCS fault, as the calls' answers show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultKind {
    /// The gRPC code the fault answers with, for messages.
    pub code: &'static str,
    /// Faults of this kind scripted to happen (each exactly once).
    pub scripted: u64,
    /// Faults of this kind random mode counted as injected.
    pub random: u64,
    /// Calls the mock logged as answered with this code.
    pub answered: u64,
}

/// The violations among `kills` and `faults`, and a line per disruption
/// verified.
pub fn check(kills: &Kills, faults: &[FaultKind]) -> (Vec<Violation>, Vec<String>) {
    let mut violations = Vec::new();
    let mut verified = Vec::new();
    if kills.failed > 0 {
        violations.push(format!(
            "{} SIGKILL(s) of an operator replica failed (the replica logs say which)",
            kills.failed
        ));
    }
    if kills.done < kills.planned {
        violations.push(format!(
            "{} of {} planned SIGKILLs happened before the resources converged",
            kills.done, kills.planned
        ));
    } else {
        verified.push(format!(
            "SIGKILLs of a running replica: {} of {} planned",
            kills.done, kills.planned
        ));
    }
    if kills.done_leader < kills.planned_leader {
        violations.push(format!(
            "{} of {} planned SIGKILLs of the Lease holder happened",
            kills.done_leader, kills.planned_leader
        ));
    } else {
        verified.push(format!(
            "SIGKILLs of the Lease holder: {} (at least {} planned)",
            kills.done_leader, kills.planned_leader
        ));
    }
    for kind in faults {
        let injected = kind.scripted + kind.random;
        if kind.scripted == 0 && kind.random == 0 {
            violations.push(format!("no {} fault was injected", kind.code));
        } else if kind.answered < injected {
            violations.push(format!(
                "{} {} faults injected ({} scripted, {} random), but only {} calls were answered {}",
                injected, kind.code, kind.scripted, kind.random, kind.answered, kind.code
            ));
        } else {
            verified.push(format!(
                "{} faults injected: {injected} ({} scripted, {} random); calls answered {}: {}",
                kind.code, kind.scripted, kind.random, kind.code, kind.answered
            ));
        }
    }
    (violations, verified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kills() -> Kills {
        Kills {
            planned: 3,
            planned_leader: 2,
            done: 3,
            done_leader: 2,
            failed: 0,
        }
    }

    fn faults() -> Vec<FaultKind> {
        vec![FaultKind {
            code: "UNAVAILABLE",
            scripted: 2,
            random: 5,
            answered: 9,
        }]
    }

    #[test]
    fn a_run_that_did_what_it_planned_passes_and_says_what_it_verified() {
        let (violations, verified) = check(&kills(), &faults());
        assert_eq!(violations, Vec::<String>::new());
        assert_eq!(verified.len(), 3, "{verified:?}");
    }

    #[test]
    fn a_missing_kill_a_failed_kill_or_a_spared_leader_fails_the_run() {
        let cases = [
            (Kills { done: 2, ..kills() }, "2 of 3 planned SIGKILLs"),
            (
                Kills {
                    failed: 1,
                    ..kills()
                },
                "1 SIGKILL(s) of an operator replica failed",
            ),
            (
                Kills {
                    done_leader: 1,
                    ..kills()
                },
                "1 of 2 planned SIGKILLs of the Lease holder",
            ),
        ];
        for (kills, says) in cases {
            let (violations, _) = check(&kills, &faults());
            assert_eq!(violations.len(), 1, "{kills:?}: {violations:?}");
            assert!(violations[0].contains(says), "{violations:?}");
        }
    }

    #[test]
    fn faults_never_injected_or_never_answered_fail_the_run() {
        let none = FaultKind {
            code: "DEADLINE_EXCEEDED",
            ..FaultKind::default()
        };
        let unanswered = FaultKind {
            answered: 6,
            ..faults()[0]
        };
        for (kind, says) in [
            (none, "no DEADLINE_EXCEEDED fault was injected"),
            (unanswered, "only 6 calls were answered UNAVAILABLE"),
        ] {
            let (violations, verified) = check(&kills(), &[kind]);
            assert_eq!(violations.len(), 1, "{violations:?}");
            assert!(violations[0].contains(says), "{violations:?}");
            assert_eq!(verified.len(), 2, "{verified:?}");
        }
    }
}
