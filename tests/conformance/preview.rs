//! Preview doors over the mock (docs/PREVIEW.md): the guest's decisions with exact
//! traces. `expose` never creates a container, validates before any substrate call,
//! answers the open door again, holds at most 8 per key; doors go with their container
//! (abort, checkpoint, a stop from outside); a remote-style refusal is typed.

use stockade_runtime::bindings::FacadeError;
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::SubstrateError;
use stockade_runtime::substrate::mock::Fault;
use stockade_tests::{MockHarness, input};

fn ops(h: &MockHarness) -> Vec<&'static str> {
    h.mock.trace().into_iter().map(|c| c.op).collect()
}

fn invalid(r: Result<impl std::fmt::Debug, CallError>) -> String {
    match r {
        Err(CallError::Facade(FacadeError::InvalidInput(m))) => m,
        other => panic!("expected invalid-input, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_ports_and_a_key_without_a_container_change_nothing() {
    let h = MockHarness::new();
    for port in [0u32, 65536, u32::MAX] {
        let m = invalid(h.rt.expose("k", port).await);
        assert!(m.contains("1..=65535"), "{m}");
        invalid(h.rt.unexpose("k", port).await);
    }
    // The egress proxy's own port: no door onto it, whatever the key's state.
    let m = invalid(h.rt.expose("k", 3128).await);
    assert!(m.contains("egress proxy"), "{m}");
    assert!(ops(&h).is_empty(), "no substrate call for a bad port");
    let m = invalid(h.rt.expose("k", 8000).await);
    assert!(m.contains("no running container"), "{m}");
    assert_eq!(ops(&h), ["current"], "expose never ensures");
    assert_eq!(h.mock.live(), 0);
    assert_eq!(h.rt.previews("k").await.unwrap(), vec![]);
    h.rt.unexpose("k", 8000).await.unwrap();
}

#[tokio::test]
async fn a_door_is_answered_again_bounded_per_key_and_goes_with_its_container() {
    let h = MockHarness::new();
    h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    h.mock.clear_trace();
    // With a running container too: 3128 is refused before any substrate call.
    let m = invalid(h.rt.expose("k", 3128).await);
    assert!(m.contains("egress proxy"), "{m}");
    assert!(ops(&h).is_empty(), "the proxy's port opens nothing");
    let a = h.rt.expose("k", 8000).await.unwrap();
    assert_eq!(ops(&h), ["current", "list-previews", "open-preview"]);
    assert!(a.token.len() >= 16 && a.url.ends_with(&format!("/p/{}/", a.token)));
    h.mock.clear_trace();
    assert_eq!(
        h.rt.expose("k", 8000).await.unwrap(),
        a,
        "the open door again"
    );
    assert_eq!(ops(&h), ["current", "list-previews"]);
    for port in 8001..8008 {
        h.rt.expose("k", port).await.unwrap();
    }
    h.mock.clear_trace();
    let m = invalid(h.rt.expose("k", 9000).await);
    assert!(m.contains("8 previews"), "{m}");
    assert_eq!(
        ops(&h),
        ["current", "list-previews"],
        "the ninth opens nothing"
    );
    let listed = h.rt.previews("k").await.unwrap();
    assert_eq!(listed.len(), 8);
    assert!(listed.windows(2).all(|w| w[0].port < w[1].port), "by port");
    // Another key sees none of them.
    h.rt.start_detached("other", &input(&["server"]))
        .await
        .unwrap();
    assert_eq!(h.rt.previews("other").await.unwrap(), vec![]);
    h.rt.unexpose("k", 8000).await.unwrap();
    assert!(
        h.rt.previews("k")
            .await
            .unwrap()
            .iter()
            .all(|p| p.port != 8000)
    );
    let b = h.rt.expose("k", 8000).await.unwrap();
    assert_ne!(b.token, a.token, "a reopened door has a fresh token");
    // Abort: the doors go with the container.
    h.rt.abort("k").await.unwrap();
    assert_eq!(h.rt.previews("k").await.unwrap(), vec![]);
    // Checkpoint too.
    h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    h.rt.expose("k", 8000).await.unwrap();
    h.rt.checkpoint("k").await.unwrap();
    assert_eq!(h.rt.previews("k").await.unwrap(), vec![]);
    // And a stop from outside (on-stop).
    h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    h.rt.expose("k", 8000).await.unwrap();
    let container = h
        .mock
        .trace()
        .iter()
        .rev()
        .find(|c| c.op == "open-preview")
        .unwrap()
        .target
        .clone();
    h.mock.stop_from_outside(&container);
    assert_eq!(h.rt.previews("k").await.unwrap(), vec![]);
}

#[tokio::test]
async fn a_substrate_that_serves_no_doors_answers_a_typed_error() {
    let h = MockHarness::new();
    h.rt.start_detached("k", &input(&["server"])).await.unwrap();
    let refusal = stockade_runtime::substrate::no_previews("remote");
    h.mock
        .inject("list-previews", Fault::Error(refusal.clone()), None);
    match h.rt.expose("k", 8000).await {
        Err(CallError::Facade(FacadeError::Failed(m))) => {
            assert!(m.contains("not served by the remote substrate"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(refusal, SubstrateError::Failed(_)));
    assert!(h.mock.trace().iter().all(|c| c.op != "open-preview"));
}
