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

/// One cell: `[call name, op, skip, fault, outcome]`; the fault `none` is the clean run.
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
        }
    }

    /// The cell as the file writes it.
    pub fn to_json(&self) -> Value {
        json!([self.call, self.op, self.skip, self.fault, self.outcome])
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
        out.push(base.clone());
        for (op, skip) in clean_ops(&c).await {
            for f in faults_for(&op) {
                out.push(Cell {
                    op: op.clone(),
                    skip,
                    fault: (*f).into(),
                    ..base.clone()
                });
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
