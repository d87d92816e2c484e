//! A substrate batch's semantics as one pure plan (docs/EMBEDDING.md, `batch`;
//! docs/NODE.md, "Batches"), which every Rust path that makes a batch drives: the
//! runtime's import (`imports/substrate.rs`), [`super::batch_one_by_one`], the remote
//! substrate and the node's `batch` route. Each driver only makes the calls it is told
//! to and hands back their answers; what the batch means is decided here, once:
//!
//! * the shape is checked whole before anything is made ([`super::check_batch`]);
//! * the **ensured placeholder** ([`On::Ensured`]) names the container the opening
//!   `ensure` answered, resolved before the call is made;
//! * the calls are made in order and the batch **stops at the first failure**: the
//!   answers are one per call made, the last the error if there was one;
//! * a **trailing teardown** (`kill-all`, `revoke-grant`) on the container of the
//!   batch's own `apply-grant` is made only while the grant open there is still the
//!   one that apply opened, for a driver that can tell ([`Plan::answer_opened`]: the
//!   node, where a front that gave up may have closed the fence and opened the next
//!   one meanwhile); otherwise it is answered [`closed_meanwhile`] in its place.
//!
//! The table of `tests/scenarios/batch.json` pins these, and the edge's JavaScript
//! plan (`edge/src/batch.js`) is tested against the same rows.

use super::{ContainerId, Result, Shape, SubstrateError, check_batch};

/// What a call is, as far as a batch's semantics go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ensure`: only first; its answer is the container [`On::Ensured`] names.
    Ensure,
    /// `apply-grant`: opens the fence a trailing teardown belongs to.
    ApplyGrant,
    /// `kill-all` or `revoke-grant`: a teardown, made only while its fence is open.
    Teardown,
    /// Any other call (`run` among them).
    Other,
}

/// What a call acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum On {
    /// A key (`ensure`, `current`, `denials`, …): no container.
    Key,
    /// The container the batch's opening `ensure` answered (the placeholder).
    Ensured,
    /// This container.
    Container(ContainerId),
}

/// One call of a batch, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What it is.
    pub kind: Kind,
    /// What it acts on.
    pub on: On,
}

impl Step {
    /// What the shape check needs of it.
    pub fn shape(&self) -> Shape {
        match (self.kind, &self.on) {
            (Kind::Ensure, _) => Shape::Ensure,
            (_, On::Ensured) => Shape::OnEnsured,
            _ => Shape::Other,
        }
    }
}

/// An answer the plan reads the ensured container from.
pub trait Answered {
    /// The container an `ensure` answered (`None` for any other answer).
    fn ensured(&self) -> Option<&str>;
}

impl Answered for super::Answer {
    fn ensured(&self) -> Option<&str> {
        match self {
            super::Answer::Ensure(c) => Some(c),
            _ => None,
        }
    }
}

/// The node protocol's answers are JSON: an `ensure`'s is the container id.
impl Answered for serde_json::Value {
    fn ensured(&self) -> Option<&str> {
        self.as_str()
    }
}

/// The call to make next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next<G> {
    /// Its index in the batch.
    pub index: usize,
    /// The container it acts on, the placeholder resolved (`None`: it names a key).
    pub container: Option<ContainerId>,
    /// A teardown of the fence this batch opened on that container: make it only if the
    /// grant open there is still this one, else answer [`closed_meanwhile`] instead.
    pub while_open: Option<G>,
}

/// A batch being made: which call next, the answers so far, when it is over. `A` and
/// `E` are the driver's answer and error; `G` names a grant (the node's lease number)
/// for a driver that guards its trailing teardown ([`Plan::answer_opened`]).
#[derive(Debug)]
pub struct Plan<A, E, G = ()> {
    steps: Vec<Step>,
    answers: Vec<std::result::Result<A, E>>,
    ensured: Option<ContainerId>,
    opened: Option<(ContainerId, G)>,
    stopped: bool,
}

impl<A: Answered, E, G: Clone + PartialEq> Plan<A, E, G> {
    /// The plan of these calls, or the batch's `invalid` (its shape, checked whole:
    /// nothing is made).
    pub fn new(steps: Vec<Step>) -> Result<Self> {
        check_batch(steps.iter().map(Step::shape))?;
        Ok(Plan {
            answers: Vec::with_capacity(steps.len()),
            steps,
            ensured: None,
            opened: None,
            stopped: false,
        })
    }

    /// The call to make next; `None` when the batch is over (every call answered, or
    /// one failed).
    pub fn next(&self) -> Option<Next<G>> {
        if self.stopped {
            return None;
        }
        let index = self.answers.len();
        let step = self.steps.get(index)?;
        let container = match self.resolved(index) {
            On::Container(c) => Some(c),
            // Never: an `ensure` failing stops the batch, so a call after it that
            // names its container is made only once it answered one.
            On::Ensured => Some(ContainerId::new()),
            On::Key => None,
        };
        let while_open = match (&self.opened, step.kind, &container) {
            (Some((c, g)), Kind::Teardown, Some(on)) if c == on => Some(g.clone()),
            _ => None,
        };
        Some(Next {
            index,
            container,
            while_open,
        })
    }

    /// What call `index` acts on, the placeholder resolved once the `ensure` answered
    /// (until then it stays [`On::Ensured`]: a driver sending calls ahead, in one
    /// request, names it as its wire does).
    pub fn resolved(&self, index: usize) -> On {
        match (&self.steps[index].on, &self.ensured) {
            (On::Ensured, Some(c)) => On::Container(c.clone()),
            (on, _) => on.clone(),
        }
    }

    /// The answer of the call [`Plan::next`] named (or, for a driver that sent calls
    /// ahead, of the next one in order). An error ends the batch; an answer after the
    /// end is not one of its calls' and is dropped.
    pub fn answer(&mut self, r: std::result::Result<A, E>) {
        let Some(step) = self.steps.get(self.answers.len()).filter(|_| !self.stopped) else {
            return;
        };
        match &r {
            Ok(a) if step.kind == Kind::Ensure => self.ensured = a.ensured().map(str::to_owned),
            Ok(_) => {}
            Err(_) => self.stopped = true,
        }
        self.answers.push(r);
    }

    /// [`Plan::answer`] for an `apply-grant`, with the grant open on its container now:
    /// a teardown later in the batch on that container is made only while it is still
    /// that grant ([`Next::while_open`]).
    pub fn answer_opened(&mut self, r: std::result::Result<A, E>, grant: G) {
        let index = self.answers.len();
        if r.is_ok()
            && !self.stopped
            && let Some(Step {
                kind: Kind::ApplyGrant,
                ..
            }) = self.steps.get(index)
            && let On::Container(c) = self.resolved(index)
        {
            self.opened = Some((c, grant));
        }
        self.answer(r);
    }

    /// How many calls were answered (the index of the next one).
    pub fn answered(&self) -> usize {
        self.answers.len()
    }

    /// Whether the batch is over.
    pub fn done(&self) -> bool {
        self.next().is_none()
    }

    /// The batch's answers: one per call made, in order, the last the error if one
    /// stopped it.
    pub fn into_answers(self) -> Vec<std::result::Result<A, E>> {
        self.answers
    }
}

/// The answer of a trailing teardown whose fence was closed by another call meanwhile
/// (the grant open on its container is no longer the one the batch's apply opened): it
/// was not made, and what it would have done is the other call's.
pub fn closed_meanwhile(container: &str) -> SubstrateError {
    SubstrateError::Unreachable(format!(
        "the fence this batch opened on {container:?} was closed by another call meanwhile: its teardown was not made"
    ))
}

#[cfg(test)]
mod tests {
    //! The table of `tests/scenarios/batch.json`, run against the plan; the edge runs
    //! the same rows against `edge/src/batch.js`.

    use std::collections::HashMap;

    use super::*;

    const TABLE: &str = include_str!("../../../../tests/scenarios/batch.json");

    /// A table answer: `ok`, `ok <container>` (an `ensure`'s) or `err <kind>`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Ans(Option<String>);

    impl Answered for Ans {
        fn ensured(&self) -> Option<&str> {
            self.0.as_deref()
        }
    }

    fn step(call: &str) -> (String, Step) {
        let (name, arg) = call.split_once(' ').expect("a call names its argument");
        let kind = match name {
            "ensure" => Kind::Ensure,
            "apply-grant" => Kind::ApplyGrant,
            "kill-all" | "revoke-grant" => Kind::Teardown,
            _ => Kind::Other,
        };
        let on = match (name, arg) {
            ("ensure" | "current" | "denials" | "list-artifacts" | "read-artifact", _) => On::Key,
            (_, "@") => On::Ensured,
            (_, c) => On::Container(c.to_owned()),
        };
        (name.to_owned(), Step { kind, on })
    }

    fn shown(r: &std::result::Result<Ans, String>) -> String {
        match r {
            Ok(Ans(Some(c))) => format!("ok {c}"),
            Ok(Ans(None)) => "ok".into(),
            Err(kind) => format!("err {kind}"),
        }
    }

    #[test]
    fn every_row_of_the_batch_table() {
        let table: serde_json::Value = serde_json::from_str(TABLE).expect("the table parses");
        let rows = table["rows"].as_array().expect("rows");
        assert!(rows.len() >= 10, "the table has its rows");
        for row in rows {
            let what = row["what"].as_str().expect("what");
            let strs = |k: &str| -> Vec<String> {
                row[k]
                    .as_array()
                    .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
                    .unwrap_or_default()
            };
            let calls = strs("calls");
            let (names, steps): (Vec<String>, Vec<Step>) =
                calls.iter().map(String::as_str).map(step).unzip();
            let mut plan: Plan<Ans, String, Option<u64>> = match Plan::new(steps) {
                Ok(p) => p,
                Err(e) => {
                    assert!(
                        matches!(e, SubstrateError::Invalid(_)),
                        "{what}: refused as invalid"
                    );
                    assert_eq!(row["refused"].as_str(), Some("invalid"), "{what}: refused");
                    continue;
                }
            };
            assert!(row["refused"].is_null(), "{what}: not refused");
            // The substrate: its script of answers, and the grant open on each
            // container (a number per apply, none once revoked).
            let mut script = strs("answers").into_iter();
            let closed_before = row["closed_before"].as_u64().map(|n| n as usize);
            let mut grants: HashMap<String, u64> = HashMap::new();
            let mut numbers = 0u64;
            let mut made = Vec::new();
            while let Some(next) = plan.next() {
                if closed_before == Some(next.index) {
                    // Another call closed the fence and opened the key's next one.
                    numbers += 1;
                    for g in grants.values_mut() {
                        *g = 100 + numbers;
                    }
                }
                let name = &names[next.index];
                let on = next.container.clone().unwrap_or_default();
                if let Some(opened) = &next.while_open
                    && grants.get(&on).copied() != *opened
                {
                    plan.answer(Err("unreachable".into()));
                    continue;
                }
                made.push(match &next.container {
                    Some(c) => format!("{name} {c}"),
                    None => calls[next.index].clone(),
                });
                let a = script
                    .next()
                    .unwrap_or_else(|| panic!("{what}: no scripted answer for {name}"));
                let r = match a.split_once(' ') {
                    Some(("ok", c)) => Ok(Ans(Some(c.to_owned()))),
                    Some(("err", kind)) => Err(kind.to_owned()),
                    _ => Ok(Ans(None)),
                };
                match name.as_str() {
                    "apply-grant" => {
                        if r.is_ok() {
                            numbers += 1;
                            grants.insert(on.clone(), numbers);
                        }
                        plan.answer_opened(r, grants.get(&on).copied());
                    }
                    "revoke-grant" => {
                        if r.is_ok() {
                            grants.remove(&on);
                        }
                        plan.answer(r);
                    }
                    _ => plan.answer(r),
                }
            }
            assert!(plan.done(), "{what}");
            assert_eq!(made, strs("made"), "{what}: the calls made");
            let answers: Vec<String> = plan.into_answers().iter().map(shown).collect();
            assert_eq!(answers, strs("result"), "{what}: the answers");
        }
    }

    #[test]
    fn a_driver_that_guards_nothing_makes_every_teardown() {
        let steps = vec![
            Step {
                kind: Kind::ApplyGrant,
                on: On::Container("c".into()),
            },
            Step {
                kind: Kind::Teardown,
                on: On::Container("c".into()),
            },
        ];
        let mut plan: Plan<Ans, String> = Plan::new(steps).unwrap();
        plan.answer(Ok(Ans(None)));
        assert_eq!(
            plan.next(),
            Some(Next {
                index: 1,
                container: Some("c".into()),
                while_open: None
            })
        );
        plan.answer(Ok(Ans(None)));
        // An answer past the end is not one of the batch's.
        plan.answer(Err("failed".into()));
        assert!(plan.done());
        assert_eq!(plan.into_answers().len(), 2);
    }
}
