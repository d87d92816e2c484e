//! What only the Rust host can show: durability across a restart, traps and
//! deadlines that leave the host standing, per-key serialization.

use std::time::Duration;

use stockade_runtime::bindings::{DetachedState, GoneReason};
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::Housekeeping;
use stockade_runtime::substrate::mock::Fault;
use stockade_tests::{MockHarness, input, test_config};

#[tokio::test]
async fn records_survive_a_host_restart() {
    let mut h = MockHarness::new();
    let id = h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    h.restart();
    assert_eq!(
        h.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Running
    );
    assert_eq!(h.store.all_records().unwrap().len(), 1);
}

#[tokio::test]
async fn after_a_restart_a_gone_container_reads_as_unreachable_and_is_cleared() {
    let mut h = MockHarness::new();
    let id = h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    // The host restarts and its containers died with it.
    h.mock.shutdown().await;
    h.restart();
    assert_eq!(
        h.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::ContainerUnreachable)
    );
    assert_eq!(declarations(&h), 0, "the declaration is cleared");
    // A consumer polling from durable steps reads the same reason on the next poll
    // (DESIGN §2.3: it used to turn into `unknown`).
    assert_eq!(
        h.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::ContainerUnreachable)
    );
}

/// The declarations in the store (tombstones are not declarations).
fn declarations(h: &MockHarness) -> usize {
    h.store
        .all_records()
        .unwrap()
        .iter()
        .filter(|(_, name, _)| name.starts_with("detached/"))
        .count()
}

#[tokio::test]
async fn a_trap_never_takes_the_host_down() {
    let h = MockHarness::new();
    h.mock.inject("run", Fault::Trap, Some(1));
    assert!(matches!(
        h.rt.exec("k", &input(&["true"])).await,
        Err(CallError::Trap(_))
    ));
    assert!(
        h.mock.open_grants().is_empty(),
        "the host revoked the trapped call's grant"
    );
    let out =
        h.rt.exec("k", &input(&["echo", "still", "here"]))
            .await
            .unwrap();
    assert_eq!(out.stdout, b"still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_inside_imports_does_not_count_against_the_guest_deadline() {
    let mut cfg = test_config();
    cfg.engine.call_deadline_ms = 50;
    let h = MockHarness::with_config(16, None, cfg);
    // The run import really takes 400 ms, eight times the deadline: the call succeeds
    // because the epoch callback counts only guest compute (counting the import's time
    // would trap it).
    let started = std::time::Instant::now();
    let o = h.rt.exec("k", &input(&["sleep-ms", "400"])).await;
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert!(
        o.is_ok(),
        "a long import tripped the guest's deadline: {o:?}"
    );
}

#[tokio::test]
async fn on_stop_events_from_the_substrate_reach_the_guest() {
    let h = MockHarness::new();
    let events = h.rt.spawn_event_loop();
    let id = h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    let container = h
        .mock
        .trace()
        .iter()
        .find(|c| c.op == "start-process")
        .unwrap()
        .target
        .clone();
    h.mock.stop_from_outside(&container);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while declarations(&h) != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "on-stop never cleared the records"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        h.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::ContainerUnreachable)
    );
    events.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_calls_of_one_key_are_serialized_and_reads_are_not() {
    let h = MockHarness::new();
    let rt = h.rt.clone();
    let mut tasks = vec![];
    for i in 0..8 {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            rt.exec("k", &input(&["echo", &i.to_string()]))
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Serialized: every fence's calls are contiguous in the trace.
    let ops = h.mock.ops();
    let fences: Vec<_> = ops.chunks(5).collect();
    assert_eq!(fences.len(), 8);
    for f in fences {
        assert_eq!(
            f,
            ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]
        );
    }
    // Reads are not serialized: while an exec of the key sits in its run (holding the
    // key's lock), a status of the same key answers.
    let id = rt.start_detached("k", &input(&["server"])).await.unwrap();
    h.mock.clear_trace();
    let slow = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.exec("k", &input(&["sleep-ms", "5000"])).await })
    };
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !h.mock.ops().contains(&"run") {
        assert!(std::time::Instant::now() < end, "the exec never ran");
        tokio::task::yield_now().await;
    }
    let status = tokio::time::timeout(Duration::from_secs(2), rt.detached_status("k", &id))
        .await
        .expect("a read waited for the key's mutating call");
    assert_eq!(status.unwrap(), DetachedState::Running);
    assert!(!slow.is_finished(), "the exec was still running");
    slow.abort();
}

thread_local! {
    static LOG: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes into the calling thread's `LOG`.
struct ThreadLog;

impl std::io::Write for ThreadLog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.with(|l| l.borrow_mut().extend_from_slice(b));
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One process-wide subscriber writing each thread's lines to that thread's buffer
/// (a thread-local subscriber misses events whose callsite another test registered
/// first); a `#[tokio::test]` runs on one thread.
fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(|| ThreadLog)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
    });
    LOG.with(|l| l.borrow_mut().clear());
}

fn fence_lines() -> Vec<String> {
    LOG.with(|l| String::from_utf8_lossy(&l.borrow()).into_owned())
        .lines()
        .filter(|l| l.contains("CANONICAL-FENCE"))
        .map(str::to_string)
        .collect()
}

/// Every exec's outcome has its one `CANONICAL-FENCE` line, the failed ones
/// (with the error) as much as the successes.
#[tokio::test]
async fn every_fence_outcome_logs_one_canonical_line() {
    capture_logs();
    let h = MockHarness::new();
    type Row<'a> = (&'a str, Option<(&'a str, Fault)>, &'a [&'a str], &'a str);
    let rows: Vec<Row> = vec![
        ("success", None, &["true"], "outcome=ran"),
        (
            "the run fails",
            Some((
                "run",
                Fault::Error(stockade_runtime::substrate::SubstrateError::Failed(
                    "boom".into(),
                )),
            )),
            &["true"],
            "outcome=error",
        ),
        (
            "over capacity",
            Some((
                "ensure",
                Fault::Error(stockade_runtime::substrate::SubstrateError::OverCapacity),
            )),
            &["true"],
            "OverCapacity",
        ),
        ("invalid input", None, &[""], "InvalidInput"),
    ];
    for (what, fault, argv, says) in rows {
        LOG.with(|l| l.borrow_mut().clear());
        if let Some((op, f)) = fault {
            h.mock.inject(op, f, Some(1));
        }
        let _ = h.rt.exec("k", &input(argv)).await;
        let lines = fence_lines();
        assert_eq!(lines.len(), 1, "{what}: {lines:?}");
        assert!(lines[0].contains(says), "{what}: {}", lines[0]);
        assert!(lines[0].contains("key=k"), "{what}: {}", lines[0]);
    }
}

/// Idle eviction checks and acts under one hold of the key's lock. A call
/// that arrives while the eviction decides runs after it (on a new container), and its
/// declaration survives; it used to run between the check and the checkpoint, whose
/// stop then cleared it.
#[tokio::test]
async fn idle_eviction_checks_and_acts_under_one_lock_hold() {
    let h = MockHarness::new();
    h.rt.exec("k", &input(&["true"])).await.unwrap();
    h.mock.set_idle(&["k"]);
    let (entered, release) = h.mock.pause_idle();
    let rt = h.rt.clone();
    let evict = tokio::spawn(async move { rt.evict_if_idle("k", Duration::ZERO).await });
    entered.notified().await;
    // The eviction is deciding; a call arrives and queues on the key's lock (this
    // runtime has one thread: the spawned call runs until it blocks).
    let rt = h.rt.clone();
    let start = tokio::spawn(async move { rt.start_detached("k", &input(&["server"])).await });
    tokio::task::yield_now().await;
    h.mock.set_idle(&[]);
    release.notify_one();
    evict.await.unwrap();
    let id = start.await.unwrap().expect("the call ran");
    assert_eq!(
        h.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Running,
        "the eviction cleared a declaration made after its check"
    );
}

/// The largest stdin the guest admits goes through the real guest within its memory
/// (the bytes are in the guest's linear memory on the way in, and the mock's `cat`
/// brings them back as output); one byte more is refused before any substrate call.
#[tokio::test]
async fn the_largest_stdin_fits_the_guests_memory() {
    const MAX: usize = 16 << 20;
    let h = MockHarness::new();
    let mut i = input(&["cat"]);
    i.stdin = Some((0..MAX).map(|n| (n % 253) as u8).collect());
    let o = h.rt.exec("k", &i).await.expect("16 MiB of stdin");
    assert_eq!(o.stdout.len(), MAX);
    assert_eq!(o.stdout, *i.stdin.as_ref().unwrap());
    i.stdin.as_mut().unwrap().push(0);
    h.mock.clear_trace();
    assert!(matches!(
        h.rt.exec("k", &i).await,
        Err(CallError::Facade(
            stockade_runtime::bindings::FacadeError::InvalidInput(_)
        ))
    ));
    assert!(h.mock.ops().is_empty());
}

/// A call that changes a sandbox runs to completion (polled in its caller's task, the
/// rest handed to the runtime when the caller drops it): a caller that stops waiting
/// mid-fence (a dropped future, an HTTP client gone) cannot cut it
/// between apply and revoke (invariant 1, through the runtime's one mutating call).
#[tokio::test]
async fn a_mutating_call_runs_to_completion_when_its_caller_stops_waiting() {
    let h = MockHarness::new();
    let mut exec = input(&["sleep-ms", "200"]);
    exec.grant = Some(stockade_runtime::bindings::Grant {
        rules: vec![],
        ask: false,
    });
    let rt = h.rt.clone();
    let mut call = Box::pin(rt.exec("k", &exec));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !h.mock.ops().contains(&"run") {
        assert!(std::time::Instant::now() < end, "the exec never ran");
        tokio::select! {
            biased;
            _ = &mut call => panic!("the run ended before its caller stopped waiting"),
            _ = tokio::task::yield_now() => {}
        }
    }
    drop(call);
    assert_eq!(
        h.mock.open_grants_now().len(),
        1,
        "the fence is open mid-run"
    );
    while h.mock.ops().last() != Some(&"revoke-grant") {
        assert!(
            std::time::Instant::now() < end,
            "the abandoned call never revoked its grant: {:?}",
            h.mock.ops()
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(
        h.mock.ops(),
        ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]
    );
    assert!(h.mock.open_grants_now().is_empty());
}
