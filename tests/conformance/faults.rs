//! The fault matrix: every import of every facade call, at every step, with every
//! fault (tests/scenarios/faults.json; edge/ runs the same cells in workerd).

use stockade_tests::faults::{self, Cell};
use stockade_tests::scenarios;

/// The file's cells are exactly what a clean run of each call implies: a guest that
/// makes a new import call (or stops making one) turns this red until the matrix is
/// regenerated (`STOCKADE_BLESS=1`) and its new outcomes are read.
#[tokio::test]
async fn fault_matrix_covers_every_import_at_every_step() {
    if std::env::var_os("STOCKADE_BLESS").is_some() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/faults.json");
        faults::bless(&path).await;
        return;
    }
    let strip = |c: &Cell| Cell {
        outcome: String::new(),
        ..c.clone()
    };
    let mut want: Vec<Cell> = faults::expected_cells().await;
    let mut have: Vec<Cell> = faults::cells().iter().map(strip).collect();
    want.sort();
    have.sort();
    let missing: Vec<_> = want.iter().filter(|c| !have.contains(c)).collect();
    let extra: Vec<_> = have.iter().filter(|c| !want.contains(c)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "faults.json is out of date (STOCKADE_BLESS=1 regenerates it):\nmissing {missing:#?}\nextra {extra:#?}"
    );
    assert!(have.len() > 100, "only {} cells", have.len());
}

/// Every cell: the typed outcome, no grant open, no undeclared process running; then a
/// clean exec of the key works and the declarations are exactly what runs.
#[tokio::test]
async fn fault_matrix_every_cell_holds() {
    let mut failures = vec![];
    let cells = faults::cells();
    for cell in &cells {
        let s = faults::cell_scenario(&faults::call(&cell.call), cell);
        if let Err(e) = scenarios::run(&s).await {
            failures.push(format!("{}: {e}", s["name"]));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cells failed:\n{}",
        failures.len(),
        cells.len(),
        failures.join("\n")
    );
}

/// The checks can fail: a cell expecting the wrong outcome, and a state the checks
/// must reject (a grant left open, an undeclared process left running).
#[tokio::test]
async fn fault_matrix_checks_can_fail() {
    let cell = faults::cells()
        .into_iter()
        .find(|c| c.fault == "none")
        .expect("a clean cell");
    let mut wrong = cell.clone();
    wrong.outcome = "err:failed".into();
    let s = faults::cell_scenario(&faults::call(&wrong.call), &wrong);
    let e = scenarios::run(&s).await.expect_err("a wrong outcome fails");
    assert!(e.contains("outcome"), "{e}");

    // An exec whose teardown is skipped (kill-all's result ignored is not possible
    // from data, so the state is made directly): a backgrounded process and a grant
    // left open are caught.
    let open = serde_json::json!({ "name": "open", "steps": [
        { "fault": { "op": "revoke-grant", "error": "failed" } },
        { "fault": { "op": "kill-all", "error": "trap" } },
        { "call": "exec", "key": "k", "input": { "argv": ["background"] } },
        { "check": "fence-closed" }
    ]});
    // The host's settle retries the revoke, which still fails: the grant stays open.
    let e = scenarios::run(&open)
        .await
        .expect_err("an open grant fails");
    assert!(e.contains("grants left open"), "{e}");
    let undeclared = serde_json::json!({ "name": "undeclared", "steps": [
        { "fault": { "op": "kill-all", "error": "failed" } },
        { "fault": { "op": "stop", "error": "failed" } },
        { "call": "exec", "key": "k", "input": { "argv": ["background"] } },
        { "check": "declared-only" }
    ]});
    let e = scenarios::run(&undeclared)
        .await
        .expect_err("an undeclared process fails");
    assert!(e.contains("undeclared"), "{e}");
}
