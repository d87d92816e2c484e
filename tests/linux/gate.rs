//! The ticket gate: at most `ceiling` live containers, never overcommitted.

use std::sync::Arc;
use std::time::Duration;

use stockade_runtime::substrate::{Substrate, SubstrateError};

use crate::support::harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ensures_never_exceed_the_ceiling() {
    const N: usize = 2;
    let h = harness(|cfg| cfg.substrate.ceiling = N as u32).await;
    let linux = Arc::new(h.linux.clone());
    let tasks: Vec<_> = (0..4 * N)
        .map(|i| {
            let l = linux.clone();
            tokio::spawn(async move { l.ensure(&format!("key-{i}")).await })
        })
        .collect();
    let mut ok = Vec::new();
    let mut over = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(id) => ok.push(id),
            Err(SubstrateError::OverCapacity) => over += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(ok.len(), N, "admitted {ok:?}");
    assert_eq!(over, 3 * N);
    let cgroups = std::fs::read_dir(&h.cgroup_root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(cgroups, N, "live container cgroups");
    // The same key again is its live container, not a new ticket.
    let first = h.linux.current("key-0").await.unwrap();
    if let Some(id) = first {
        assert_eq!(h.linux.ensure("key-0").await.unwrap(), id);
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_frees_the_ticket_and_a_waiter_gets_it() {
    let h = harness(|cfg| {
        cfg.substrate.ceiling = 1;
        cfg.substrate.admission_timeout_ms = 300;
    })
    .await;
    let a = h.linux.ensure("a").await.unwrap();
    let t = std::time::Instant::now();
    assert_eq!(h.linux.ensure("b").await, Err(SubstrateError::OverCapacity));
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "over capacity after the admission timeout"
    );
    h.linux.stop(&a).await.unwrap();
    assert!(matches!(
        h.linux.run(&a, h.cmd("true"), Duration::from_secs(5)).await,
        Err(SubstrateError::Unreachable(_))
    ));
    assert_eq!(h.linux.current("a").await.unwrap(), None);
    let b = h.linux.ensure("b").await.unwrap();
    assert_ne!(a, b);
    h.finish().await;
}
