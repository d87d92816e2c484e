//! One named test per shared scenario, plus the proof that a wrong expectation fails.

use serde_json::{Value, json};
use stockade_tests::scenarios;

async fn scenario(name_starts: &str) {
    let all = scenarios::all();
    let s = all
        .iter()
        .find(|s| s["name"].as_str().unwrap().starts_with(name_starts))
        .unwrap_or_else(|| panic!("no scenario named {name_starts:?}"));
    if let Err(e) = scenarios::run(s).await {
        panic!("scenario {:?} failed: {e}", s["name"]);
    }
}

#[tokio::test]
async fn every_shared_scenario_passes() {
    let mut failures = vec![];
    let all = scenarios::all();
    for s in &all {
        if let Err(e) = scenarios::run(s).await {
            failures.push(format!("{}: {e}", s["name"]));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn a_scenario_expecting_a_wrong_trace_fails() {
    let mut s = scenarios::all()[0].clone();
    s["steps"][0]["trace"] = json!(["ensure", "run", "kill-all", "revoke-grant"]);
    let err = scenarios::run(&s)
        .await
        .expect_err("a wrong trace must fail");
    assert!(err.contains("trace"), "{err}");
    let mut s = scenarios::all()[0].clone();
    s["steps"][0]["expect"] = json!({ "ok": { "stdout": "goodbye\n" } });
    assert!(
        scenarios::run(&s).await.is_err(),
        "a wrong outcome must fail"
    );
}

#[test]
fn every_invariant_about_the_guest_has_a_scenario() {
    let all = scenarios::all();
    let covered: Vec<u64> = all
        .iter()
        .filter_map(|s| s.get("invariant").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_u64)
        .collect();
    for inv in [1, 2, 3, 4, 5, 7, 8, 9, 10] {
        assert!(
            covered.contains(&inv),
            "invariant {inv} has no shared scenario"
        );
    }
}

#[tokio::test]
async fn fence_without_declared_process_is_exactly_ensure_apply_run_kill_all_revoke() {
    scenario("no declared process").await;
}

#[tokio::test]
async fn fence_kill_reaches_what_the_command_backgrounded() {
    scenario("the fence's kill reaches").await;
}

#[tokio::test]
async fn teardown_spares_declared_and_kills_undeclared() {
    scenario("declared processes: list").await;
}

#[tokio::test]
async fn teardown_reaps_declarations_whose_process_is_gone() {
    scenario("a declaration whose process is gone").await;
}

#[tokio::test]
async fn teardown_kills_all_when_list_is_unreadable() {
    scenario("list unreadable").await;
}

#[tokio::test]
async fn teardown_falls_back_to_kill_all_when_a_selective_kill_fails() {
    scenario("a selective kill that fails").await;
}

#[tokio::test]
async fn grant_is_revoked_when_the_run_fails() {
    scenario("a run that fails").await;
}

#[tokio::test]
async fn grant_is_revoked_when_the_container_is_unreachable_mid_fence() {
    scenario("a container unreachable mid-fence").await;
}

#[tokio::test]
async fn grant_is_revoked_on_timeout() {
    scenario("a timed-out run").await;
}

#[tokio::test]
async fn grant_is_revoked_on_non_zero_exit() {
    scenario("a non-zero exit").await;
}

#[tokio::test]
async fn host_revokes_the_grant_of_a_trapped_call() {
    scenario("a trap after apply-grant").await;
}

#[tokio::test]
async fn teardown_kills_all_when_the_declarations_cannot_be_read() {
    scenario("declarations unreadable at teardown").await;
}

#[tokio::test]
async fn a_records_failure_never_skips_a_kill() {
    scenario("declarations that cannot be forgotten").await;
}

#[tokio::test]
async fn one_grammar_refuses_what_the_proxy_cannot_apply() {
    scenario("one grammar").await;
}

#[tokio::test]
async fn an_approval_is_used_once_and_expires() {
    scenario("an approval is used once").await;
}

#[tokio::test]
async fn a_failed_ensure_opens_no_grant() {
    scenario("a failing ensure").await;
}

#[tokio::test]
async fn ticket_gate_answers_over_capacity() {
    scenario("the ticket gate").await;
}

#[tokio::test]
async fn start_detached_never_applies_a_grant() {
    scenario("start-detached never applies").await;
    scenario("a grant given to start-detached").await;
}

#[tokio::test]
async fn floor_is_the_same_for_both_doors() {
    scenario("the floor refuses").await;
}

#[tokio::test]
async fn another_keys_id_is_gone_unknown() {
    scenario("another key's process id").await;
    scenario("an id that is not a UUID").await;
}

#[tokio::test]
async fn stop_kills_and_forgets() {
    scenario("stop kills the tree").await;
}

#[tokio::test]
async fn exited_code_is_kept_until_stop() {
    scenario("an exited detached process").await;
    scenario("a process the container no longer tracks").await;
}

#[tokio::test]
async fn ensure_starts_the_container_with_no_command_and_no_grant() {
    scenario("ensure starts the container").await;
}

#[tokio::test]
async fn a_named_snapshot_forks_only_a_key_with_no_container() {
    scenario("a named snapshot is read").await;
}

#[tokio::test]
async fn a_lifetime_ends_its_key_as_it_says_and_metadata_is_described_and_listed() {
    scenario("a key's lifetime and metadata").await;
}

#[tokio::test]
async fn abort_checkpoint_and_on_stop_clear_every_record() {
    scenario("abort stops").await;
    scenario("checkpoint snapshots").await;
    scenario("a failed snapshot").await;
    scenario("on-stop clears").await;
}

#[tokio::test]
async fn unreachable_container_reads_as_container_unreachable() {
    scenario("an unreachable container").await;
}

#[tokio::test]
async fn bad_input_gets_a_typed_error_and_no_substrate_call() {
    scenario("bad input").await;
}

#[tokio::test]
async fn denials_are_counted_and_listed() {
    scenario("denials during a fence").await;
}

#[tokio::test]
async fn artifacts_are_read_by_key() {
    scenario("artifacts are listed").await;
}
