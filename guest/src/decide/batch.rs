//! What a `batch`'s answers mean for the fence (one round trip for calls the guest
//! already decided, which a substrate across a network needs: docs/NODE.md, "Batches").
//! The guest sends `[ensure, apply-grant, run]` (or, when the fence spends an approval,
//! which must come between `ensure` and the grant, `[apply-grant, run]` after a plain
//! `ensure`) and `[kill-all, revoke-grant]` after the run; the substrate makes them in
//! order and stops at the first error. These functions read the answers back into exactly
//! what the calls made one by one would have told the fence, so every decision after them
//! is the one it was (an apply that failed: nothing ran, nothing is torn down; a kill-all
//! that failed: the revoke was not made, the guest makes it by a further call). An answer
//! that says nothing of what was made (no answer came back) is read as the worst case:
//! everything may have been made.

use crate::stockade::sandbox::substrate::{
    ApplyGrantCall, Call, CallAnswer, Command, FenceCounts, RunCall, RunResult, SubstrateError,
    Target,
};
use crate::stockade::sandbox::types::Grant;

/// What a fence's batches are made of: the grant, the command and its timeout.
pub struct FenceCalls {
    /// The grant the fence opens (an empty one when the input names none).
    pub grant: Grant,
    /// The command it runs.
    pub cmd: Command,
    /// The run's timeout.
    pub timeout_ms: u64,
}

/// `[apply-grant, run]` on `target`: the run only if the apply answered (invariant 1:
/// the grant window opens after approval and ensure, and nothing runs outside it).
pub fn apply_run(target: Target, f: FenceCalls) -> Vec<Call> {
    vec![
        Call::ApplyGrant(ApplyGrantCall {
            container: target.clone(),
            grant: f.grant,
        }),
        Call::Run(RunCall {
            container: target,
            cmd: f.cmd,
            timeout_ms: f.timeout_ms,
        }),
    ]
}

/// The fence's opening batch when no approval is spent: `[ensure, apply-grant, run]`
/// on the ensured container, one round trip (docs/NODE.md, "Batches"). A key with no
/// declared process has its teardown decided before the run (kill-all: nothing declares
/// a process while the fence holds the key), so `[kill-all, revoke-grant]` join it: the
/// whole fence in one round trip, the grant closed right after the kill.
pub fn whole_fence(key: &str, f: FenceCalls, teardown_decided: bool) -> Vec<Call> {
    let mut calls = vec![Call::Ensure(key.to_string())];
    calls.extend(apply_run(Target::Ensured, f));
    if teardown_decided {
        calls.extend(closing(Target::Ensured));
    }
    calls
}

/// `[kill-all, revoke-grant]` on `target`: the revoke only after the kill answered
/// (invariant 1: the grant closes after the teardown).
pub fn closing(target: Target) -> [Call; 2] {
    [Call::KillAll(target.clone()), Call::RevokeGrant(target)]
}

/// A batch's answer as the substrate gives it.
pub type Answers = Result<Vec<Result<CallAnswer, SubstrateError>>, SubstrateError>;

/// What `[apply-grant, run]` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Opened {
    /// The apply failed: it opened nothing and the run never started. Nothing is torn
    /// down (a declared process survives bad input); the error is the fence's.
    NotApplied(SubstrateError),
    /// The fence `fence` opened and the run answered (its error, if it failed): tear
    /// down, then revoke.
    Ran {
        /// The fence's id.
        fence: String,
        /// The run's answer.
        run: Result<RunResult, SubstrateError>,
    },
    /// What was made is not known (no answer, or an answer that does not fit the
    /// calls): the fence may be open and the command may have run. Tear down, then
    /// revoke, and fail with this error.
    Unknown(SubstrateError),
}

fn misfit(what: &str) -> SubstrateError {
    SubstrateError::Failed(format!(
        "the substrate's batch answer does not fit its calls: {what}"
    ))
}

/// Read the answers of `[apply-grant, run]`.
pub fn opened(answers: Answers) -> Opened {
    let answers = match answers {
        Ok(a) => a,
        Err(e) => return Opened::Unknown(e),
    };
    let mut it = answers.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(Err(e)), None, None) => Opened::NotApplied(e),
        (Some(Ok(CallAnswer::ApplyGrant(fence))), run, None) => {
            let run = match run {
                Some(Ok(CallAnswer::Run(r))) => Ok(r),
                Some(Err(e)) => Err(e),
                Some(Ok(_)) => Err(misfit("the run answered as another call")),
                // An apply that answered and no run answer: the run was asked for, so
                // it may have started.
                None => Err(misfit("no answer for the run")),
            };
            Opened::Ran { fence, run }
        }
        _ => Opened::Unknown(misfit("not one answer per call made")),
    }
}

/// What `[ensure, apply-grant, run]` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Began {
    /// The `ensure` failed: nothing was made (no grant, no run); the error is the
    /// fence's, as a plain `ensure`'s.
    NotEnsured(SubstrateError),
    /// The key's container is `container`; the rest of the batch did what `opened`
    /// says (read as the answers of `[apply-grant, run]` alone).
    Ensured {
        /// The container `ensure` answered.
        container: String,
        /// What the apply and the run did.
        opened: Opened,
    },
    /// What was made is not known, not even the container: the fence may be open on
    /// the key's container. The guest asks `current` for it, then tears down and
    /// revokes as for [`Opened::Unknown`].
    Unknown(SubstrateError),
}

/// Read the answers of `[ensure, apply-grant, run]`.
pub fn began(answers: Answers) -> Began {
    let mut answers = match answers {
        Ok(a) => a,
        Err(e) => return Began::Unknown(e),
    };
    if answers.is_empty() {
        return Began::Unknown(misfit("no answer for the ensure"));
    }
    match answers.remove(0) {
        Err(e) if answers.is_empty() => Began::NotEnsured(e),
        Ok(CallAnswer::Ensure(container)) => Began::Ensured {
            container,
            opened: opened(Ok(answers)),
        },
        _ => Began::Unknown(misfit("the first answer is not an ensure's")),
    }
}

/// Read the answers of `[ensure, apply-grant, run, kill-all, revoke-grant]` (a fence
/// whose teardown was decided before its run): what the first three did, and what the
/// teardown did when it was made (`None`: not made, the run's error stopped the batch
/// or the answers do not say: the guest tears down by further calls, as after
/// [`began`] alone).
pub fn whole(answers: Answers) -> (Began, Option<Closed>) {
    let mut answers = match answers {
        Ok(a) => a,
        Err(e) => return (Began::Unknown(e), None),
    };
    if answers.len() <= 3 {
        return (began(Ok(answers)), None);
    }
    let teardown = answers.split_off(3);
    match answers.last() {
        Some(Ok(CallAnswer::Run(_))) => (began(Ok(answers)), Some(closed(Ok(teardown)))),
        _ => (
            Began::Unknown(misfit("answers after a run that did not answer")),
            None,
        ),
    }
}

/// What `[kill-all, revoke-grant]` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// `kill-all`'s answer (not known: read as its error, which the teardown's
    /// `after_kill_all` decides on).
    pub kill_all: Result<u32, SubstrateError>,
    /// `revoke-grant`'s answer, or `None`: it was not made (the kill failed first), or
    /// it is not known whether it was: the guest revokes by a further call.
    pub revoke: Option<Result<FenceCounts, SubstrateError>>,
}

/// Read the answer of a batch of one call (how the guest makes every substrate call
/// that is not part of a fence's batch): that call's answer or error. An answer that is
/// not one answer for the one call is a `failed`, as a call that failed: the guest
/// acts on no answer it cannot read. Whether the answer is the call's own kind is the
/// caller's check (`crate::substrate`).
pub fn one(answers: Answers) -> Result<CallAnswer, SubstrateError> {
    let mut answers = answers?;
    match (answers.pop(), answers.is_empty()) {
        (Some(answer), true) => answer,
        _ => Err(misfit("not one answer for one call")),
    }
}

/// Read the answers of `[kill-all, revoke-grant]`.
pub fn closed(answers: Answers) -> Closed {
    let answers = match answers {
        Ok(a) => a,
        Err(e) => {
            return Closed {
                kill_all: Err(e),
                revoke: None,
            };
        }
    };
    let mut it = answers.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(CallAnswer::KillAll(n))), revoke, None) => Closed {
            kill_all: Ok(n),
            revoke: match revoke {
                Some(Ok(CallAnswer::RevokeGrant(c))) => Some(Ok(c)),
                Some(Err(e)) => Some(Err(e)),
                // Not made, or an answer that is not a revoke's: revoke again.
                Some(Ok(_)) | None => None,
            },
        },
        (Some(Err(e)), None, None) => Closed {
            kill_all: Err(e),
            revoke: None,
        },
        _ => Closed {
            kill_all: Err(misfit("not one answer per call made")),
            revoke: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(timeout_ms: u64) -> FenceCalls {
        FenceCalls {
            grant: Grant {
                rules: vec![],
                ask: false,
            },
            cmd: Command {
                argv: vec!["true".into()],
                cwd: "/workspace".into(),
                env: vec![],
                stdin: vec![],
            },
            timeout_ms,
        }
    }

    fn shape(calls: &[Call]) -> Vec<String> {
        calls
            .iter()
            .map(|c| {
                let on = |t: &Target| match t {
                    Target::Ensured => "ensured".to_string(),
                    Target::Container(c) => c.clone(),
                };
                match c {
                    Call::Ensure(k) => format!("ensure {k}"),
                    Call::ApplyGrant(a) => format!("apply-grant {}", on(&a.container)),
                    Call::Run(r) => format!("run {} {}", on(&r.container), r.timeout_ms),
                    Call::KillAll(t) => format!("kill-all {}", on(t)),
                    Call::RevokeGrant(t) => format!("revoke-grant {}", on(t)),
                    other => format!("{other:?}"),
                }
            })
            .collect()
    }

    #[test]
    fn a_fence_batches_what_it_has_decided_and_nothing_more() {
        let on = |c: &str| Target::Container(c.into());
        let rows: Vec<(&str, Vec<Call>, Vec<String>)> = vec![
            (
                "no declared process: the whole fence in one batch, revoke after kill",
                whole_fence("k", calls(5), true),
                vec![
                    "ensure k".into(),
                    "apply-grant ensured".into(),
                    "run ensured 5".into(),
                    "kill-all ensured".into(),
                    "revoke-grant ensured".into(),
                ],
            ),
            (
                "declared processes: the teardown is decided after the run",
                whole_fence("k", calls(5), false),
                vec![
                    "ensure k".into(),
                    "apply-grant ensured".into(),
                    "run ensured 5".into(),
                ],
            ),
            (
                "an approval spent after ensure: apply and run on the named container",
                apply_run(on("c1"), calls(7)),
                vec!["apply-grant c1".into(), "run c1 7".into()],
            ),
            (
                "the teardown's kill-all, then the revoke",
                closing(on("c1")).to_vec(),
                vec!["kill-all c1".into(), "revoke-grant c1".into()],
            ),
        ];
        for (why, got, want) in rows {
            assert_eq!(shape(&got), want, "{why}");
        }
    }

    fn run(code: i32) -> RunResult {
        RunResult {
            exit_code: code,
            stdout: vec![],
            stderr: vec![],
            timed_out: false,
            truncated: false,
            limits: vec![],
        }
    }

    fn counts(admitted: u32, denied: u32) -> FenceCounts {
        FenceCounts { admitted, denied }
    }

    fn failed(s: &str) -> SubstrateError {
        SubstrateError::Failed(s.into())
    }

    #[test]
    fn one_rows() {
        let unreachable = SubstrateError::Unreachable("node".into());
        let rows: Vec<(&str, Answers, Result<CallAnswer, SubstrateError>)> = vec![
            (
                "answered",
                Ok(vec![Ok(CallAnswer::KillProcess(3))]),
                Ok(CallAnswer::KillProcess(3)),
            ),
            (
                "the call failed",
                Ok(vec![Err(failed("gone"))]),
                Err(failed("gone")),
            ),
            (
                "no answer: the batch's error",
                Err(unreachable.clone()),
                Err(unreachable),
            ),
            (
                "no answer in an answered batch",
                Ok(vec![]),
                Err(misfit("not one answer for one call")),
            ),
            (
                "two answers for one call",
                Ok(vec![Ok(CallAnswer::Stop), Ok(CallAnswer::Stop)]),
                Err(misfit("not one answer for one call")),
            ),
        ];
        for (what, answers, want) in rows {
            assert_eq!(one(answers), want, "{what}");
        }
    }

    #[test]
    fn opened_rows() {
        let unreachable = SubstrateError::Unreachable("node".into());
        let rows: Vec<(&str, Answers, Opened)> = vec![
            (
                "applied and ran",
                Ok(vec![
                    Ok(CallAnswer::ApplyGrant("f".into())),
                    Ok(CallAnswer::Run(run(3))),
                ]),
                Opened::Ran {
                    fence: "f".into(),
                    run: Ok(run(3)),
                },
            ),
            (
                "applied, the run failed: still torn down",
                Ok(vec![
                    Ok(CallAnswer::ApplyGrant("f".into())),
                    Err(failed("spawn")),
                ]),
                Opened::Ran {
                    fence: "f".into(),
                    run: Err(failed("spawn")),
                },
            ),
            (
                "the apply failed: nothing ran, nothing torn down",
                Ok(vec![Err(SubstrateError::Invalid("rule".into()))]),
                Opened::NotApplied(SubstrateError::Invalid("rule".into())),
            ),
            (
                "no answer: as if everything was made",
                Err(unreachable.clone()),
                Opened::Unknown(unreachable),
            ),
            (
                "applied, no run answer: the run may have started",
                Ok(vec![Ok(CallAnswer::ApplyGrant("f".into()))]),
                Opened::Ran {
                    fence: "f".into(),
                    run: Err(misfit("no answer for the run")),
                },
            ),
            (
                "no answers at all: not known",
                Ok(vec![]),
                Opened::Unknown(misfit("not one answer per call made")),
            ),
            (
                "an error and then an answer: not known",
                Ok(vec![Err(failed("x")), Ok(CallAnswer::Run(run(0)))]),
                Opened::Unknown(misfit("not one answer per call made")),
            ),
            (
                "the first answer is not an apply's: not known",
                Ok(vec![
                    Ok(CallAnswer::KillAll(1)),
                    Ok(CallAnswer::Run(run(0))),
                ]),
                Opened::Unknown(misfit("not one answer per call made")),
            ),
            (
                "the second answer is not a run's: torn down, failed",
                Ok(vec![
                    Ok(CallAnswer::ApplyGrant("f".into())),
                    Ok(CallAnswer::KillAll(1)),
                ]),
                Opened::Ran {
                    fence: "f".into(),
                    run: Err(misfit("the run answered as another call")),
                },
            ),
        ];
        for (what, answers, want) in rows {
            assert_eq!(opened(answers), want, "{what}");
        }
    }

    #[test]
    fn closed_rows() {
        let rows: Vec<(&str, Answers, Closed)> = vec![
            (
                "killed and revoked",
                Ok(vec![
                    Ok(CallAnswer::KillAll(2)),
                    Ok(CallAnswer::RevokeGrant(counts(1, 4))),
                ]),
                Closed {
                    kill_all: Ok(2),
                    revoke: Some(Ok(counts(1, 4))),
                },
            ),
            (
                "killed, the revoke failed: its error stands",
                Ok(vec![Ok(CallAnswer::KillAll(0)), Err(failed("proxy"))]),
                Closed {
                    kill_all: Ok(0),
                    revoke: Some(Err(failed("proxy"))),
                },
            ),
            (
                "the kill failed: the revoke was not made, the guest makes it",
                Ok(vec![Err(failed("cgroup.kill"))]),
                Closed {
                    kill_all: Err(failed("cgroup.kill")),
                    revoke: None,
                },
            ),
            (
                "no answer: the kill's error, and revoke again",
                Err(SubstrateError::Unreachable("node".into())),
                Closed {
                    kill_all: Err(SubstrateError::Unreachable("node".into())),
                    revoke: None,
                },
            ),
            (
                "killed, no revoke answer: revoke again",
                Ok(vec![Ok(CallAnswer::KillAll(1))]),
                Closed {
                    kill_all: Ok(1),
                    revoke: None,
                },
            ),
            (
                "nothing answered: the kill is not known to be done",
                Ok(vec![]),
                Closed {
                    kill_all: Err(misfit("not one answer per call made")),
                    revoke: None,
                },
            ),
        ];
        for (what, answers, want) in rows {
            assert_eq!(closed(answers), want, "{what}");
        }
    }

    #[test]
    fn began_rows() {
        let unreachable = SubstrateError::Unreachable("node".into());
        let ensured = |c: &str| Ok(CallAnswer::Ensure(c.into()));
        let rows: Vec<(&str, Answers, Began)> = vec![
            (
                "ensured, applied and ran",
                Ok(vec![
                    ensured("c1"),
                    Ok(CallAnswer::ApplyGrant("f".into())),
                    Ok(CallAnswer::Run(run(0))),
                ]),
                Began::Ensured {
                    container: "c1".into(),
                    opened: Opened::Ran {
                        fence: "f".into(),
                        run: Ok(run(0)),
                    },
                },
            ),
            (
                "the ensure failed: nothing made, nothing torn down",
                Ok(vec![Err(SubstrateError::OverCapacity)]),
                Began::NotEnsured(SubstrateError::OverCapacity),
            ),
            (
                "ensured, the apply failed: nothing ran",
                Ok(vec![ensured("c1"), Err(failed("bad rule"))]),
                Began::Ensured {
                    container: "c1".into(),
                    opened: Opened::NotApplied(failed("bad rule")),
                },
            ),
            (
                "ensured, applied, the run failed: torn down",
                Ok(vec![
                    ensured("c1"),
                    Ok(CallAnswer::ApplyGrant("f".into())),
                    Err(failed("spawn")),
                ]),
                Began::Ensured {
                    container: "c1".into(),
                    opened: Opened::Ran {
                        fence: "f".into(),
                        run: Err(failed("spawn")),
                    },
                },
            ),
            (
                "ensured and nothing more answered: the apply may have opened",
                Ok(vec![ensured("c1")]),
                Began::Ensured {
                    container: "c1".into(),
                    opened: Opened::Unknown(misfit("not one answer per call made")),
                },
            ),
            (
                "no answer: not even the container is known",
                Err(unreachable.clone()),
                Began::Unknown(unreachable),
            ),
            (
                "nothing answered",
                Ok(vec![]),
                Began::Unknown(misfit("no answer for the ensure")),
            ),
            (
                "a first answer that is not an ensure's",
                Ok(vec![Ok(CallAnswer::ApplyGrant("f".into()))]),
                Began::Unknown(misfit("the first answer is not an ensure's")),
            ),
            (
                "an ensure error followed by more answers",
                Ok(vec![
                    Err(failed("x")),
                    Ok(CallAnswer::ApplyGrant("f".into())),
                ]),
                Began::Unknown(misfit("the first answer is not an ensure's")),
            ),
        ];
        for (what, answers, want) in rows {
            assert_eq!(began(answers), want, "{what}");
        }
    }

    #[test]
    fn whole_rows() {
        let unreachable = SubstrateError::Unreachable("node".into());
        let ensured = || Ok(CallAnswer::Ensure("c1".into()));
        let applied = || Ok(CallAnswer::ApplyGrant("f".into()));
        let ran = || Ok(CallAnswer::Run(run(0)));
        let ran_began = || Began::Ensured {
            container: "c1".into(),
            opened: Opened::Ran {
                fence: "f".into(),
                run: Ok(run(0)),
            },
        };
        let rows: Vec<(&str, Answers, (Began, Option<Closed>))> = vec![
            (
                "all five made",
                Ok(vec![
                    ensured(),
                    applied(),
                    ran(),
                    Ok(CallAnswer::KillAll(2)),
                    Ok(CallAnswer::RevokeGrant(counts(1, 0))),
                ]),
                (
                    ran_began(),
                    Some(Closed {
                        kill_all: Ok(2),
                        revoke: Some(Ok(counts(1, 0))),
                    }),
                ),
            ),
            (
                "the kill failed: the revoke was not made",
                Ok(vec![
                    ensured(),
                    applied(),
                    ran(),
                    Err(failed("cgroup.kill")),
                ]),
                (
                    ran_began(),
                    Some(Closed {
                        kill_all: Err(failed("cgroup.kill")),
                        revoke: None,
                    }),
                ),
            ),
            (
                "the run failed: the teardown was not made",
                Ok(vec![ensured(), applied(), Err(failed("spawn"))]),
                (
                    Began::Ensured {
                        container: "c1".into(),
                        opened: Opened::Ran {
                            fence: "f".into(),
                            run: Err(failed("spawn")),
                        },
                    },
                    None,
                ),
            ),
            (
                "ran, and no teardown answer: not made, tear down again",
                Ok(vec![ensured(), applied(), ran()]),
                (ran_began(), None),
            ),
            (
                "the ensure failed",
                Ok(vec![Err(SubstrateError::OverCapacity)]),
                (Began::NotEnsured(SubstrateError::OverCapacity), None),
            ),
            (
                "no answer",
                Err(unreachable.clone()),
                (Began::Unknown(unreachable), None),
            ),
            (
                "answers after a run error",
                Ok(vec![
                    ensured(),
                    applied(),
                    Err(failed("spawn")),
                    Ok(CallAnswer::KillAll(1)),
                ]),
                (
                    Began::Unknown(misfit("answers after a run that did not answer")),
                    None,
                ),
            ),
        ];
        for (what, answers, want) in rows {
            assert_eq!(whole(answers), want, "{what}");
        }
    }
}
