//! The fault matrix (`tests/scenarios/faults.json`): every import a facade call makes,
//! at every step, gets every fault, one cell at a time. A cell is expanded into an
//! ordinary scenario (so `edge/` runs the same cells with its own runner): the call's
//! setup, the fault armed on the op's `skip + 1`th call, the call and its expected
//! outcome, then the checks that must hold whatever failed.

use serde_json::{Value, json};

use crate::scenarios;

/// The matrix file, embedded.
pub const FILE: &str = include_str!("../scenarios/faults.json");

/// The matrix.
pub fn matrix() -> Value {
    serde_json::from_str(FILE).expect("faults.json parses")
}

/// The faults an op gets: a substrate call can fail, be unreachable or trap; a records
/// or policy call (whose error is a string, or nothing) can fail or trap.
pub fn faults_for(op: &str) -> &'static [&'static str] {
    if op.starts_with("records.") || op.starts_with("policy.") {
        &["failed", "trap"]
    } else {
        &["failed", "unreachable", "trap"]
    }
}

/// One cell: `[call name, op, skip, fault, outcome, survives]`; the fault `none` is the
/// clean run. `survives`: the call's declared `survivor` must still run after the call
/// (the cells where killing a declared process would be a wrong answer: DESIGN §2.1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cell {
    /// The name of the call in `calls`.
    pub call: String,
    /// The import the fault is armed on (`-` for the clean run).
    pub op: String,
    /// How many calls of `op` go through before the fault fires.
    pub skip: u32,
    /// The fault (`none`, `failed`, `unreachable`, `trap`).
    pub fault: String,
    /// The consumer's outcome: `ok`, `err:NAME` or `trap`.
    pub outcome: String,
    /// The call's declared survivor must be running after the call ([`must_survive`]).
    pub survives: bool,
}

impl Cell {
    /// Parse a cell of the file.
    pub fn parse(v: &Value) -> Cell {
        let s = |i: usize| v[i].as_str().expect("a cell's string field").to_string();
        Cell {
            call: s(0),
            op: s(1),
            skip: v[2].as_u64().expect("a cell's skip") as u32,
            fault: s(3),
            outcome: s(4),
            survives: v[5].as_bool().unwrap_or(false),
        }
    }

    /// The cell as the file writes it.
    pub fn to_json(&self) -> Value {
        json!([
            self.call,
            self.op,
            self.skip,
            self.fault,
            self.outcome,
            self.survives
        ])
    }
}

/// Must the call's declared `survivor` (a detached process the setup started) still run
/// after this cell's call? DESIGN §2.1 kills a declared process only where sparing it could
/// leave a grant-holder alive: the list of tracked processes cannot be read, a selective
/// kill failed, the declarations cannot be read, or the fence was left open (a trap after
/// the grant was applied, a revoke that failed) so the host kills every tree; or its
/// container is unreachable (gone, its processes with it). Everywhere else (bad input, a
/// failed apply that opened nothing, a failed run, over capacity, a status or a start
/// beside it) killing it is a wrong answer (DESIGN §2.3: a failed apply kills nothing).
/// `ops` is the call's clean run, in order: "after the apply" is read from it.
pub fn must_survive(call: &Value, cell: &Cell, ops: &[(String, u32)]) -> bool {
    if call.get("survivor").is_none() {
        return false;
    }
    if cell.fault == "none" {
        return true;
    }
    let at = |op: &str, skip: u32| ops.iter().position(|(o, s)| o == op && *s == skip);
    let after_apply = match (at("apply-grant", 0), at(&cell.op, cell.skip)) {
        (Some(apply), Some(here)) => here > apply,
        _ => false,
    };
    // The teardown's first records.list reads the declarations (a later one reads
    // tombstones, whose loss is logged, never a kill).
    let declarations_read = at("apply-grant", 0).and_then(|apply| {
        ops.iter()
            .enumerate()
            .skip(apply + 1)
            .find(|(_, (o, _))| o == "records.list")
            .map(|(i, _)| i)
    });
    let first_list_after_apply =
        declarations_read.is_some() && declarations_read == at(&cell.op, cell.skip);
    match (cell.op.as_str(), cell.fault.as_str()) {
        // An unreachable container is gone, and its processes with it (the mock
        // decides it the way the linux substrate does).
        (_, "unreachable") => false,
        ("list-processes" | "kill-process", _) if after_apply => false,
        ("records.list", _) if first_list_after_apply => false,
        ("revoke-grant", "failed") => false,
        (_, "trap") if after_apply => false,
        _ => true,
    }
}

/// The calls of the matrix.
pub fn calls() -> Vec<Value> {
    matrix()["calls"].as_array().expect("calls").clone()
}

/// The cells of the matrix.
pub fn cells() -> Vec<Cell> {
    matrix()["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(Cell::parse)
        .collect()
}

/// The call spec named `name`.
pub fn call(name: &str) -> Value {
    calls()
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no call {name:?} in faults.json"))
}

/// A cell as a scenario. The same expansion is in `edge/src/scenarios.js`.
pub fn cell_scenario(call: &Value, cell: &Cell) -> Value {
    scenario_of(call, cell, true)
}

/// The call's setup, the cell's fault (if any), the call; with `checks`, the call's
/// expected outcome and the checks that follow it.
fn scenario_of(call: &Value, cell: &Cell, checks: bool) -> Value {
    let mut steps: Vec<Value> = call["setup"].as_array().cloned().unwrap_or_default();
    if cell.fault != "none" {
        steps.push(json!({ "fault": {
            "op": cell.op, "skip": cell.skip, "error": cell.fault, "times": 1
        }}));
    }
    let mut step = call["step"].clone();
    if checks {
        step["outcome"] = json!(cell.outcome);
    }
    steps.push(step);
    if checks && cell.survives {
        steps.push(json!({ "check": "alive", "id": call["survivor"] }));
    }
    if checks {
        steps.extend([
            json!({ "check": "fence-closed" }),
            json!({ "check": "declared-only" }),
            json!({ "clear_faults": true }),
            json!({ "call": "exec", "key": "k", "input": { "argv": ["echo", "after"] }, "outcome": "ok" }),
            json!({ "check": "fence-closed" }),
            json!({ "check": "records-match" }),
        ]);
    }
    let mut s = json!({
        "name": format!("{} | {}#{} | {}", cell.call, cell.op, cell.skip, cell.fault),
        "steps": steps,
    });
    if let Some(f) = call.get("floor") {
        s["floor"] = f.clone();
    }
    s
}

/// The clean cell of a call.
fn clean(call: &Value) -> Cell {
    Cell {
        call: call["name"].as_str().expect("call name").to_string(),
        op: "-".into(),
        skip: 0,
        fault: "none".into(),
        outcome: String::new(),
        survives: false,
    }
}

/// The injectable ops the call makes on a clean run: the cells of a call are these ops
/// (each at its occurrence) times their faults.
pub async fn clean_ops(call: &Value) -> Vec<(String, u32)> {
    let s = scenario_of(call, &clean(call), false);
    let (h, _) = scenarios::run_keeping(&s)
        .await
        .unwrap_or_else(|e| panic!("the clean run of {} failed: {e}", call["name"]));
    let mut seen: Vec<String> = vec![];
    h.mock
        .all_ops()
        .into_iter()
        .map(|op| {
            let skip = seen.iter().filter(|o| **o == op).count() as u32;
            seen.push(op.clone());
            (op, skip)
        })
        .collect()
}

/// The cells a clean run of every call implies (outcomes left empty).
pub async fn expected_cells() -> Vec<Cell> {
    let mut out = vec![];
    for c in calls() {
        let base = clean(&c);
        let ops = clean_ops(&c).await;
        out.push(Cell {
            survives: must_survive(&c, &base, &ops),
            ..base.clone()
        });
        for (op, skip) in &ops {
            for f in faults_for(op) {
                let mut cell = Cell {
                    op: op.clone(),
                    skip: *skip,
                    fault: (*f).into(),
                    ..base.clone()
                };
                cell.survives = must_survive(&c, &cell, &ops);
                out.push(cell);
            }
        }
    }
    out
}

/// What a cell's call answers, run for real (the bless records it).
pub async fn observed_outcome(call: &Value, cell: &Cell) -> String {
    let s = scenario_of(call, cell, false);
    let (_, got) = scenarios::run_keeping(&s)
        .await
        .expect("the cell's steps run");
    scenarios::outcome_name(&got)
}

/// Rewrite `cells` in the file from a clean enumeration and observed outcomes.
pub async fn bless(path: &std::path::Path) {
    let mut cells = expected_cells().await;
    for cell in &mut cells {
        cell.outcome = observed_outcome(&call(&cell.call), cell).await;
    }
    let m = matrix();
    let calls: Vec<String> = m["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| format!("    {c}"))
        .collect();
    let rows: Vec<String> = cells
        .iter()
        .map(|c| format!("    {}", c.to_json()))
        .collect();
    let text = format!(
        "{{\n  \"about\": {},\n  \"calls\": [\n{}\n  ],\n  \"cells\": [\n{}\n  ]\n}}\n",
        m["about"],
        calls.join(",\n"),
        rows.join(",\n")
    );
    std::fs::write(path, text).expect("write faults.json");
}
