//! The conformance scenarios as data (`tests/scenarios/conformance.json`), run against
//! the real guest over the mock substrate. `edge/` runs the same file against the same
//! `.wasm` in workerd; docs/CONFORMANCE.md describes the format.

use std::collections::HashMap;

use serde_json::{Value, json};
use stockade_runtime::bindings::{
    CredentialHeader, DetachedState, ExecInput, FacadeError, GoneReason, Grant, Rule,
};
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::SubstrateError;
use stockade_runtime::substrate::mock::Fault;

use crate::MockHarness;

/// The scenario file, embedded.
pub const FILE: &str = include_str!("../scenarios/conformance.json");

/// All scenarios in the file.
pub fn all() -> Vec<Value> {
    let v: Value = serde_json::from_str(FILE).expect("conformance.json parses");
    v["scenarios"]
        .as_array()
        .expect("a scenarios array")
        .clone()
}

/// Run one scenario; `Err` names the step and what differed.
pub async fn run(scenario: &Value) -> Result<(), String> {
    run_keeping(scenario).await.map(drop)
}

/// Run one scenario and hand back its harness and the last call's outcome (to inspect
/// what the last step did).
pub async fn run_keeping(scenario: &Value) -> Result<(MockHarness, Value), String> {
    let mut last = Value::Null;
    let floor = scenario.get("floor").map(|f| {
        serde_json::from_value::<Vec<Vec<String>>>(f.clone())
            .expect("floor is a list of argv patterns")
    });
    let ceiling = scenario
        .get("ceiling")
        .and_then(Value::as_u64)
        .unwrap_or(16) as usize;
    let h = MockHarness::with(ceiling, floor);
    let mut saved: HashMap<String, String> = HashMap::new();
    for (i, step) in scenario["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .enumerate()
    {
        let at = format!("step {i} {step}");
        h.mock.clear_trace();
        if let Some(f) = step.get("fault") {
            h.mock.inject_after(
                f["op"].as_str().expect("fault.op"),
                f.get("skip").and_then(Value::as_u64).unwrap_or(0) as u32,
                fault(f["error"].as_str().expect("fault.error")),
                f.get("times").and_then(Value::as_u64).map(|n| n as u32),
            );
            continue;
        }
        if step.get("clear_faults").is_some() {
            h.mock.clear_faults();
            continue;
        }
        if let Some(c) = step.get("check").and_then(Value::as_str) {
            let id = subst(step["id"].as_str().unwrap_or_default(), &saved);
            check(&h, c, &id).map_err(|e| format!("{at}: {e}"))?;
            continue;
        }
        if let Some(m) = step.get("mock") {
            let arg = |k: &str| subst(step[k].as_str().unwrap_or_default(), &saved);
            match m.as_str().expect("mock op") {
                "exit-process" => h.mock.exit_process(
                    &arg("container"),
                    &arg("id"),
                    step["code"].as_i64().expect("code") as i32,
                ),
                "lose-process" => h.mock.lose_process(&arg("container"), &arg("id")),
                "put-artifact" => {
                    h.mock
                        .put_artifact(&arg("key"), &arg("name"), arg("bytes").as_bytes())
                }
                "stop-container" => h.mock.stop_from_outside(&arg("container")),
                other => return Err(format!("{at}: unknown mock op {other}")),
            }
            continue;
        }
        if let Some(a) = step.get("approve") {
            let argv: Vec<String> =
                serde_json::from_value(a["argv"].clone()).expect("approve.argv");
            // Valid for a day, or already expired (`"expired": true`).
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let expires = if a["expired"] == true {
                1
            } else {
                now + 86_400_000
            };
            let token = h
                .store
                .record_approval(a["key"].as_str().expect("approve.key"), &argv, now, expires)
                .expect("record approval");
            saved.insert(
                step["save"].as_str().expect("approve.save").to_string(),
                token,
            );
            continue;
        }
        let call = step["call"].as_str().ok_or(format!("{at}: no call"))?;
        let got = do_call(&h, call, step, &saved).await;
        last = got.clone();
        if let (Some(name), Some(Value::String(id))) =
            (step.get("save").and_then(Value::as_str), got.get("ok"))
        {
            saved.insert(name.to_string(), id.clone());
        }
        if let Some(want) = step.get("outcome").and_then(Value::as_str) {
            let got = outcome_name(&got);
            if got != want {
                return Err(format!("{at}: outcome {got}, expected {want}"));
            }
        }
        if let Some(want) = step.get("expect") {
            let want = subst_value(want, &saved);
            if !matches(&want, &got) {
                return Err(format!("{at}: expected {want}, got {got}"));
            }
        }
        if let Some(want) = step.get("trace") {
            let ops: Vec<&str> = h.mock.ops();
            let want: Vec<&str> = want
                .as_array()
                .expect("trace")
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            if ops != want {
                return Err(format!("{at}: trace {ops:?}, expected {want:?}"));
            }
        }
        if let Some(want) = step.get("records") {
            // Declarations only: tombstones (`gone/…`) are what a cleared declaration
            // leaves behind, not a declaration.
            let n = h
                .store
                .all_records()
                .expect("records")
                .iter()
                .filter(|(_, name, _)| name.starts_with("detached/"))
                .count() as u64;
            if Some(n) != want.as_u64() {
                return Err(format!("{at}: {n} records, expected {want}"));
            }
        }
    }
    Ok((h, last))
}

/// A call's outcome in one word: `ok`, `err:NAME` or `trap`.
pub fn outcome_name(got: &Value) -> String {
    if got.get("ok").is_some() {
        "ok".into()
    } else if let Some(e) = got.get("err").and_then(Value::as_str) {
        format!("err:{e}")
    } else if got.get("trap").is_some() {
        "trap".into()
    } else {
        format!("unknown:{got}")
    }
}

/// The state checks a step can make (docs/CONFORMANCE.md):
/// * `fence-closed`: no container has a grant open;
/// * `declared-only`: every running process is declared by its key, for its container;
/// * `records-match`: the declarations are exactly the processes the containers track;
/// * `alive` (with `id`): that process is still running (a declared process the call
///   must not have killed).
fn check(h: &MockHarness, what: &str, id: &str) -> Result<(), String> {
    use std::collections::BTreeSet;
    let declared = || -> BTreeSet<(String, String, String)> {
        h.store
            .all_records()
            .expect("records")
            .into_iter()
            .filter_map(|(scope, name, container)| {
                name.strip_prefix("detached/")
                    .map(|id| (scope, container, id.to_string()))
            })
            .collect()
    };
    let tracked = |running_only: bool| -> BTreeSet<(String, String, String)> {
        h.mock
            .tracked()
            .into_iter()
            .filter(|(_, _, p)| p.running || !running_only)
            .map(|(k, c, p)| (k, c, p.id))
            .collect()
    };
    match what {
        "fence-closed" => {
            let open = h.mock.open_grants_now();
            if open.is_empty() {
                Ok(())
            } else {
                Err(format!("grants left open: {open:?}"))
            }
        }
        "declared-only" => {
            let undeclared: Vec<_> = tracked(true).difference(&declared()).cloned().collect();
            if undeclared.is_empty() {
                Ok(())
            } else {
                Err(format!("undeclared processes left running: {undeclared:?}"))
            }
        }
        "records-match" => {
            let (d, t) = (declared(), tracked(false));
            if d == t {
                Ok(())
            } else {
                Err(format!("declarations {d:?} but tracked processes {t:?}"))
            }
        }
        "alive" => {
            if tracked(true).iter().any(|(_, _, p)| p == id) {
                Ok(())
            } else {
                Err(format!("the declared process {id} was killed"))
            }
        }
        other => Err(format!("unknown check {other}")),
    }
}

fn fault(name: &str) -> Fault {
    match name {
        "trap" => Fault::Trap,
        "unreachable" => Fault::Error(SubstrateError::Unreachable("injected".into())),
        "over-capacity" => Fault::Error(SubstrateError::OverCapacity),
        "invalid" => Fault::Error(SubstrateError::Invalid("injected".into())),
        "failed" => Fault::Error(SubstrateError::Failed("injected".into())),
        other => panic!("unknown fault {other}"),
    }
}

fn subst(s: &str, saved: &HashMap<String, String>) -> String {
    match s.strip_prefix('$') {
        Some(name) => saved.get(name).cloned().unwrap_or_else(|| s.to_string()),
        None => s.to_string(),
    }
}

fn subst_value(v: &Value, saved: &HashMap<String, String>) -> Value {
    match v {
        Value::String(s) => Value::String(subst(s, saved)),
        Value::Array(a) => Value::Array(a.iter().map(|x| subst_value(x, saved)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), subst_value(x, saved)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `want` matches `got` when every key of an object in `want` matches, arrays match
/// element-wise with equal length, and scalars are equal.
pub fn matches(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w
            .iter()
            .all(|(k, wv)| g.get(k).is_some_and(|gv| matches(wv, gv))),
        (Value::Array(w), Value::Array(g)) => {
            w.len() == g.len() && w.iter().zip(g).all(|(a, b)| matches(a, b))
        }
        (w, g) => w == g,
    }
}

/// The input of a step, with `$name` substituted.
pub fn exec_input(v: &Value, saved: &HashMap<String, String>) -> ExecInput {
    let v = subst_value(v, saved);
    ExecInput {
        argv: strings(&v["argv"]),
        cwd: v.get("cwd").and_then(Value::as_str).map(String::from),
        env: v
            .get("env")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p[0].as_str().unwrap().to_string(),
                            p[1].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        timeout_ms: v.get("timeout_ms").and_then(Value::as_u64),
        grant: v.get("grant").map(grant_of),
        approval: v.get("approval").and_then(Value::as_str).map(String::from),
        stdin: v
            .get("stdin")
            .and_then(Value::as_str)
            .map(|t| t.as_bytes().to_vec()),
    }
}

/// A JSON array of strings (anything else: none).
fn strings(x: &Value) -> Vec<String> {
    x.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A step's grant: `{"rules": [{"host", "methods"?, "path_prefix"?, "headers"?,
/// "intercept"?}], "ask"?}`.
fn grant_of(g: &Value) -> Grant {
    Grant {
        rules: g["rules"]
            .as_array()
            .expect("grant.rules")
            .iter()
            .map(|r| Rule {
                host: r["host"].as_str().unwrap_or_default().to_string(),
                methods: strings(&r["methods"]),
                path_prefix: r
                    .get("path_prefix")
                    .and_then(Value::as_str)
                    .map(String::from),
                headers: r
                    .get("headers")
                    .and_then(Value::as_object)
                    .map(|h| {
                        h.iter()
                            .map(|(name, v)| CredentialHeader {
                                name: name.clone(),
                                secret: v["secret"].as_str().unwrap_or_default().to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                intercept: r.get("intercept").and_then(Value::as_bool).unwrap_or(true),
            })
            .collect(),
        ask: g.get("ask").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// The kebab-case name of a facade error (the scenario file's vocabulary).
pub fn error_name(e: &FacadeError) -> &'static str {
    match e {
        FacadeError::NeedsApproval(_) => "needs-approval",
        FacadeError::OverCapacity => "over-capacity",
        FacadeError::InvalidInput(_) => "invalid-input",
        FacadeError::Unreachable(_) => "unreachable",
        FacadeError::Failed(_) => "failed",
    }
}

/// A detached state in the scenario file's vocabulary.
pub fn state_json(s: &DetachedState) -> Value {
    match s {
        DetachedState::Running => json!("running"),
        DetachedState::Exited(c) => json!({ "exited": c }),
        DetachedState::Gone(r) => json!({ "gone": match r {
            GoneReason::Unknown => "unknown",
            GoneReason::NotTracked => "not-tracked",
            GoneReason::ContainerUnreachable => "container-unreachable",
        }}),
    }
}

fn outcome<T>(r: Result<T, CallError>, ok: impl FnOnce(T) -> Value) -> Value {
    match r {
        Ok(v) => json!({ "ok": ok(v) }),
        Err(CallError::Facade(e)) => json!({ "err": error_name(&e) }),
        Err(CallError::Trap(_)) => json!({ "trap": true }),
    }
}

async fn do_call(
    h: &MockHarness,
    call: &str,
    step: &Value,
    saved: &HashMap<String, String>,
) -> Value {
    let key = subst(step["key"].as_str().unwrap_or_default(), saved);
    let id = subst(step["id"].as_str().unwrap_or_default(), saved);
    let rt = &h.rt;
    match call {
        "exec" => outcome(
            rt.exec(&key, &exec_input(&step["input"], saved)).await,
            |o| {
                json!({
                    "exit_code": o.exit_code,
                    "stdout": String::from_utf8_lossy(&o.stdout),
                    "stderr": String::from_utf8_lossy(&o.stderr),
                    "timed_out": o.timed_out,
                    "truncated": o.truncated,
                    "killed": o.killed,
                    "denials": o.denials,
                    "admitted": o.admitted,
                })
            },
        ),
        "start-detached" => outcome(
            rt.start_detached(&key, &exec_input(&step["input"], saved))
                .await,
            |id| json!(id),
        ),
        "detached-status" => outcome(rt.detached_status(&key, &id).await, |s| state_json(&s)),
        "stop-detached" => outcome(rt.stop_detached(&key, &id).await, |_| Value::Null),
        "ensure" => outcome(rt.ensure(&key).await, |_| Value::Null),
        "abort" => outcome(rt.abort(&key).await, |_| Value::Null),
        "checkpoint" => outcome(rt.checkpoint(&key).await, |_| Value::Null),
        // The time a snapshot was taken is the clock's: the scenario compares names.
        "save-snapshot" => outcome(
            rt.save_snapshot(&key, step["name"].as_str().unwrap_or_default())
                .await,
            |s| json!(s.name),
        ),
        "fork" => outcome(
            rt.fork(
                &key,
                step["source"].as_str().unwrap_or_default(),
                step["name"].as_str().unwrap_or_default(),
            )
            .await,
            |_| Value::Null,
        ),
        "snapshots" => outcome(rt.snapshots(&key).await, |l| {
            json!(l.iter().map(|s| s.name.clone()).collect::<Vec<_>>())
        }),
        "delete-snapshot" => outcome(
            rt.delete_snapshot(&key, step["name"].as_str().unwrap_or_default())
                .await,
            |_| Value::Null,
        ),
        "set-lifetime" => outcome(
            rt.set_lifetime(&key, lifetime_of(&step["lifetime"])).await,
            |_| Value::Null,
        ),
        "set-metadata" => outcome(
            rt.set_metadata(&key, pairs_of(&step["metadata"])).await,
            |_| Value::Null,
        ),
        "set-network" => outcome(
            rt.set_network(
                &key,
                step["network"]
                    .as_object()
                    .map(|_| grant_of(&step["network"])),
            )
            .await,
            |_| Value::Null,
        ),
        "describe" => outcome(rt.describe(&key).await, |i| match i {
            Some(i) => info_json(&i),
            None => Value::Null,
        }),
        "sandboxes" => outcome(
            rt.sandboxes(step["prefix"].as_str().unwrap_or_default())
                .await,
            |l| json!(l.iter().map(info_json).collect::<Vec<_>>()),
        ),
        "forget" => outcome(rt.forget(&key).await, |_| Value::Null),
        // The host-facing ask and end, as the runtime's loop makes them.
        "expire" => json!({ "ok": rt.expire().await }),
        "denials" => outcome(rt.denials(&key).await, |d| {
            json!(d.iter().map(|d| json!({"host": d.host, "method": d.method, "path": d.path, "reason": d.reason})).collect::<Vec<_>>())
        }),
        "artifacts" => outcome(rt.artifacts(&key).await, |a| {
            json!(
                a.iter()
                    .map(|a| json!({"name": a.name, "size": a.size}))
                    .collect::<Vec<_>>()
            )
        }),
        "read-artifact" => outcome(
            rt.read_artifact(
                &key,
                &subst(step["name"].as_str().unwrap_or_default(), saved),
                step["offset"].as_u64().unwrap_or(0),
                step["length"].as_u64().unwrap_or(1 << 20) as u32,
            )
            .await,
            |b| json!(String::from_utf8_lossy(&b)),
        ),
        "on-stop" => outcome(
            rt.on_stop(&subst(
                step["container"].as_str().unwrap_or_default(),
                saved,
            ))
            .await,
            |n| json!(n),
        ),
        other => json!({ "error": format!("unknown call {other}") }),
    }
}

/// A step's `lifetime`: `{"ends_at_ms", "on_end": "abort"|"checkpoint"}`, or null.
fn lifetime_of(v: &Value) -> Option<stockade_runtime::bindings::Lifetime> {
    use stockade_runtime::bindings::{EndAction, Lifetime};
    v.as_object().map(|o| Lifetime {
        ends_at_ms: o.get("ends_at_ms").and_then(Value::as_u64).unwrap_or(0),
        on_end: match o.get("on_end").and_then(Value::as_str) {
            Some("checkpoint") => EndAction::Checkpoint,
            _ => EndAction::Abort,
        },
    })
}

/// A step's `metadata`: `[[name, value], …]`.
fn pairs_of(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    Some((
                        p.get(0)?.as_str()?.to_string(),
                        p.get(1)?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A known key as a scenario compares it.
fn info_json(i: &stockade_runtime::bindings::SandboxInfo) -> Value {
    use stockade_runtime::bindings::EndAction;
    json!({
        "key": i.key,
        "running": i.running,
        "lifetime": i.lifetime.as_ref().map(|l| json!({
            "ends_at_ms": l.ends_at_ms,
            "on_end": match l.on_end { EndAction::Abort => "abort", EndAction::Checkpoint => "checkpoint" },
        })),
        "metadata": i.metadata,
        "network": i.network.as_ref().map(|g| json!({
            "rules": g.rules.iter().map(|r| r.host.clone()).collect::<Vec<_>>(),
            "ask": g.ask,
        })),
    })
}
