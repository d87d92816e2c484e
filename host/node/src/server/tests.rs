use super::*;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::routes::streamed::*;
use crate::state::*;
use stockade_egress::secrets::Secrets;
use stockade_node_protocol::auth::Signed;
use stockade_node_protocol::stream;
use stockade_node_protocol::{self as protocol, Answer, RunLine};
use stockade_runtime::substrate::mock::Mock;
use stockade_runtime::substrate::{Command, SubstrateError};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A directory removed when dropped (the store's).
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn node(mock: Arc<Mock>) -> (Arc<Node>, Dir) {
    let dir =
        Dir(std::env::temp_dir().join(format!("stockade-node-server-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let store = Arc::new(stockade_store::Store::open_in(&dir.0).expect("a store"));
    let node = Node::new(
        "node-1",
        mock,
        store.clone(),
        Secrets::new(store, Default::default()),
        SECRET.to_vec(),
        Settings {
            ceiling: 4,
            lease_grace: Duration::from_secs(30),
            heartbeat: Duration::from_millis(100),
            max_body: 1024,
        },
    );
    (node, dir)
}

async fn send(node: &Arc<Node>, call: &str, key: &str, body: &[u8]) -> (u16, String) {
    send_idem(node, call, key, body, "").await
}

/// [`send`] with an idempotency key.
async fn send_idem(
    node: &Arc<Node>,
    call: &str,
    key: &str,
    body: &[u8],
    idempotency: &str,
) -> (u16, String) {
    let path = format!("{}{call}", protocol::PREFIX);
    let (time, nonce) = (now_ms(), auth::nonce());
    let sig = Signed {
        time_ms: time,
        nonce: &nonce,
        method: "POST",
        path: &path,
        key,
        idempotency,
        body,
    }
    .sign(SECRET);
    let req = axum::http::Request::post(&path)
        .header(auth::TIME_HEADER, time.to_string())
        .header(auth::NONCE_HEADER, nonce)
        .header(auth::KEY_HEADER, key)
        .header(protocol::IDEMPOTENCY_HEADER, idempotency)
        .header(auth::SIGNATURE_HEADER, sig)
        .body(Body::from(body.to_vec()))
        .unwrap();
    let r = handle(State(node.clone()), Path(call.to_owned()), req).await;
    let status = r.status().as_u16();
    let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A `run-stream` request: the head signed (with `nonce`), then `frames` as the
/// body; its status and NDJSON lines.
async fn send_stream(
    node: &Arc<Node>,
    key: &str,
    head: &[u8],
    nonce: &str,
    frames: impl FnOnce(&str) -> Vec<u8>,
) -> (u16, Vec<String>) {
    send_stream_idem(node, key, head, nonce, "", frames).await
}

/// [`send_stream`] with an idempotency key.
async fn send_stream_idem(
    node: &Arc<Node>,
    key: &str,
    head: &[u8],
    nonce: &str,
    idempotency: &str,
    frames: impl FnOnce(&str) -> Vec<u8>,
) -> (u16, Vec<String>) {
    let path = format!("{}{}", protocol::PREFIX, call::RUN_STREAM);
    let time = now_ms();
    let sig = Signed {
        time_ms: time,
        nonce,
        method: "POST",
        path: &path,
        key,
        idempotency,
        body: head,
    }
    .sign(SECRET);
    let mut body = head.to_vec();
    body.push(b'\n');
    body.extend(frames(&sig));
    // The body arrives in small pieces, as a stream does.
    let pieces: Vec<Result<Bytes, std::io::Error>> = body
        .chunks(1000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let req = axum::http::Request::post(&path)
        .header(auth::TIME_HEADER, time.to_string())
        .header(auth::NONCE_HEADER, nonce)
        .header(auth::KEY_HEADER, key)
        .header(protocol::IDEMPOTENCY_HEADER, idempotency)
        .header(auth::SIGNATURE_HEADER, sig)
        .body(Body::from_stream(futures_util::stream::iter(pieces)))
        .unwrap();
    let r = handle(State(node.clone()), Path(call::RUN_STREAM.to_owned()), req).await;
    let status = r.status().as_u16();
    let body = axum::body::to_bytes(r.into_body(), 1 << 24).await.unwrap();
    let lines = String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| !l.contains("heartbeat"))
        .map(str::to_owned)
        .collect();
    (status, lines)
}

/// A batch's answer lines (heartbeats left out).
fn batch_lines(b: &str) -> Vec<RunLine> {
    b.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l| !matches!(l, RunLine::Heartbeat(_)))
        .collect()
}

fn fence_batch(container: &str, argv: &[&str]) -> Vec<u8> {
    let grant = stockade_egress::rules::Grant::parse(&[]).unwrap();
    serde_json::to_vec(&protocol::Batch {
        calls: vec![
            protocol::BatchCall::ApplyGrant(protocol::ApplyGrant::new(container, "f1", &grant)),
            protocol::BatchCall::Run(protocol::Run {
                container: container.into(),
                cmd: Command {
                    argv: argv.iter().map(|a| a.to_string()).collect(),
                    cwd: "/workspace".into(),
                    env: vec![],
                    stdin: vec![],
                    stdin_stream: None,
                },
                timeout_ms: 5_000,
            }),
            protocol::BatchCall::KillAll(protocol::OnContainer {
                container: container.into(),
            }),
            protocol::BatchCall::RevokeGrant(protocol::OnContainer {
                container: container.into(),
            }),
        ],
    })
    .unwrap()
}

#[tokio::test]
async fn a_batch_makes_its_calls_in_order_and_stops_at_the_first_error() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let id = ensured(&n, "alpha").await;
    mock.clear_trace();
    let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(&id, &["echo", "hi"])).await;
    assert_eq!(s, 200, "{b}");
    let lines = batch_lines(&b);
    assert_eq!(
        lines[0],
        RunLine::Answer(Answer::Ok(serde_json::Value::Null)),
        "{b}"
    );
    assert_eq!(lines[1], RunLine::Stdout(b"hi\n".to_vec()), "{b}");
    assert!(
        matches!(&lines[2], RunLine::Answer(Answer::Ok(v)) if v["exit_code"] == 0),
        "{b}"
    );
    assert!(matches!(&lines[3], RunLine::Answer(Answer::Ok(_))), "{b}");
    assert!(
        matches!(&lines[4], RunLine::Answer(Answer::Ok(v)) if v["denied"] == 0),
        "{b}"
    );
    assert_eq!(lines.len(), 5, "{b}");
    assert_eq!(
        mock.ops(),
        ["apply-grant", "run", "kill-all", "revoke-grant"]
    );
    assert!(mock.open_grants_now().is_empty());
    // A retry (the same idempotency key, freshly signed) gets the answers again and
    // makes nothing twice.
    mock.clear_trace();
    let body = fence_batch(&id, &["echo", "once"]);
    let first = send_idem(&n, call::BATCH, "alpha", &body, "idem-1").await;
    let again = send_idem(&n, call::BATCH, "alpha", &body, "idem-1").await;
    assert_eq!(
        mock.ops(),
        ["apply-grant", "run", "kill-all", "revoke-grant"]
    );
    let answers = |b: &str| -> Vec<RunLine> {
        batch_lines(b)
            .into_iter()
            .filter(|l| matches!(l, RunLine::Answer(_)))
            .collect()
    };
    assert_eq!(again.0, 200);
    assert_eq!(answers(&again.1), answers(&first.1), "{}", again.1);
    // A failed apply: the run is never made, and the answer says so.
    mock.clear_trace();
    mock.inject(
        "apply-grant",
        stockade_runtime::substrate::mock::Fault::Error(SubstrateError::Failed("proxy".into())),
        Some(1),
    );
    let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(&id, &["echo", "no"])).await;
    assert_eq!(s, 200, "{b}");
    let lines = batch_lines(&b);
    assert!(
        matches!(&lines[..], [RunLine::Answer(Answer::Error(e))] if e.kind == "failed"),
        "{b}"
    );
    assert_eq!(mock.ops(), ["apply-grant"]);
}

#[tokio::test]
async fn a_batch_naming_another_keys_container_is_refused_whole_before_any_call() {
    let mock = Arc::new(Mock::new(4));
    let (n, _dir) = node(mock.clone());
    let (mine, theirs) = (ensured(&n, "alpha").await, ensured(&n, "beta").await);
    mock.clear_trace();
    // Its own apply first, then a kill of another key's container: nothing is made.
    let mut batch: protocol::Batch =
        serde_json::from_slice(&fence_batch(&mine, &["echo"])).unwrap();
    batch.calls[2] = protocol::BatchCall::KillAll(protocol::OnContainer {
        container: theirs.clone(),
    });
    let (s, b) = send(
        &n,
        call::BATCH,
        "alpha",
        &serde_json::to_vec(&batch).unwrap(),
    )
    .await;
    assert_eq!(s, 403, "{b}");
    assert!(mock.ops().is_empty(), "{:?}", mock.ops());
    // A guessed container, an empty batch, too many calls, a call a batch does not
    // carry: refused whole, nothing made.
    let guessed = fence_batch("c-guessed", &["echo"]);
    assert_eq!(send(&n, call::BATCH, "alpha", &guessed).await.0, 403);
    assert_eq!(
        send(&n, call::BATCH, "alpha", br#"{"calls":[]}"#).await.0,
        400
    );
    let many = protocol::Batch {
        calls: vec![
            protocol::BatchCall::KillAll(protocol::OnContainer {
                container: mine.clone()
            });
            stockade_runtime::substrate::MAX_BATCH + 1
        ],
    };
    let (s, b) = send(
        &n,
        call::BATCH,
        "alpha",
        &serde_json::to_vec(&many).unwrap(),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    let stop = format!(r#"{{"calls":[{{"stop":{{"container":"{mine}"}}}}]}}"#);
    assert_eq!(send(&n, call::BATCH, "alpha", stop.as_bytes()).await.0, 400);
    assert!(mock.ops().is_empty(), "{:?}", mock.ops());
}

/// `[ensure, apply-grant, run]` on the ensured container (`""`).
fn ensure_batch(argv: &[&str]) -> Vec<u8> {
    ensured_batch(argv, 2)
}

/// `[ensure, apply-grant, run, kill-all, revoke-grant]`, all on the ensured container.
fn whole_batch(argv: &[&str]) -> Vec<u8> {
    ensured_batch(argv, 4)
}

/// [`fence_batch`]'s first `calls` on the ensured container, after an `ensure`.
fn ensured_batch(argv: &[&str], calls: usize) -> Vec<u8> {
    let mut b: protocol::Batch =
        serde_json::from_slice(&fence_batch(protocol::ENSURED, argv)).unwrap();
    b.calls.truncate(calls);
    b.calls
        .insert(0, protocol::BatchCall::Ensure(protocol::Empty {}));
    serde_json::to_vec(&b).unwrap()
}

/// The key's container, by a plain `ensure`.
async fn ensured(n: &Arc<Node>, key: &str) -> String {
    let (_, b) = send(n, "ensure", key, b"{}").await;
    match serde_json::from_str::<Answer<String>>(&b).unwrap() {
        Answer::Ok(id) => id,
        Answer::Error(e) => panic!("{e:?}"),
    }
}

/// `body` sent as a batch in a task of its own, once its run is going on `container`.
async fn batch_running(
    n: &Arc<Node>,
    key: &'static str,
    container: &str,
    body: Vec<u8>,
) -> tokio::task::JoinHandle<(u16, String)> {
    let batch = tokio::spawn({
        let n = n.clone();
        async move { send(&n, call::BATCH, key, &body).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !n.leases.running(container) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the batch's run started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    batch
}

#[tokio::test]
async fn a_batch_opening_with_ensure_fences_the_container_it_answered() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let (s, b) = send(&n, call::BATCH, "alpha", &ensure_batch(&["echo", "hi"])).await;
    assert_eq!(s, 200, "{b}");
    let lines = batch_lines(&b);
    let RunLine::Answer(Answer::Ok(serde_json::Value::String(id))) = &lines[0] else {
        panic!("the ensure's answer first: {b}")
    };
    assert!(!id.is_empty(), "{b}");
    assert_eq!(lines[2], RunLine::Stdout(b"hi\n".to_vec()), "{b}");
    assert!(
        matches!(&lines[3], RunLine::Answer(Answer::Ok(v)) if v["exit_code"] == 0),
        "{b}"
    );
    assert_eq!(mock.ops(), ["ensure", "apply-grant", "run"]);
    assert_eq!(mock.open_grants_now(), std::slice::from_ref(id));
    // The key owns what its batch ensured: the teardown names it as any container.
    let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(id, &["true"])[..]).await;
    assert_eq!(s, 200, "{b}");
    assert!(mock.open_grants_now().is_empty());
    // Another key's batch cannot name it, nor fence it by the ensured name: its own
    // ensure answers its own container.
    let (s, b) = send(&n, call::BATCH, "beta", &fence_batch(id, &["true"])).await;
    assert_eq!(s, 403, "{b}");
    mock.clear_trace();
    let (s, b) = send(&n, call::BATCH, "beta", &ensure_batch(&["true"])).await;
    assert_eq!(s, 200, "{b}");
    let RunLine::Answer(Answer::Ok(serde_json::Value::String(theirs))) = &batch_lines(&b)[0] else {
        panic!("{b}")
    };
    assert_ne!(theirs, id);
    // The whole fence in one batch: the teardown names the ensured container too,
    // and leaves nothing open.
    mock.clear_trace();
    let (s, b) = send(&n, call::BATCH, "alpha", &whole_batch(&["true"])).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        mock.ops(),
        ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]
    );
    assert_eq!(batch_lines(&b).len(), 5, "{b}");
    // (Only beta's grant, which its batch above left open, is.)
    assert_eq!(mock.open_grants_now(), std::slice::from_ref(theirs));
    // An ensure that fails makes nothing after it.
    mock.clear_trace();
    mock.inject(
        "ensure",
        stockade_runtime::substrate::mock::Fault::Error(SubstrateError::OverCapacity),
        Some(1),
    );
    let (s, b) = send(&n, call::BATCH, "gamma", &ensure_batch(&["true"])).await;
    assert_eq!(s, 200, "{b}");
    let lines = batch_lines(&b);
    assert_eq!(lines.len(), 1, "{b}");
    assert!(
        matches!(&lines[0], RunLine::Answer(Answer::Error(_))),
        "{b}"
    );
    assert_eq!(mock.ops(), ["ensure"]);
}

#[tokio::test]
async fn a_batchs_teardown_is_not_made_once_its_fence_was_closed_by_another_call() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let id = ensured(&n, "alpha").await;
    // The whole fence in one batch, its run long enough for a front that went away
    // to tear the fence down by calls of its own meanwhile.
    let batch = batch_running(&n, "alpha", &id, whole_batch(&["sleep-ms", "400"])).await;
    let on = serde_json::to_vec(&protocol::OnContainer {
        container: id.clone(),
    })
    .unwrap();
    assert_eq!(send(&n, "revoke-grant", "alpha", &on).await.0, 200);
    mock.clear_trace();
    let (s, b) = batch.await.unwrap();
    assert_eq!(s, 200, "{b}");
    let lines: Vec<RunLine> = batch_lines(&b)
        .into_iter()
        .filter(|l| matches!(l, RunLine::Answer(_)))
        .collect();
    assert_eq!(lines.len(), 4, "stopped at the kill-all: {b}");
    assert!(
        matches!(&lines[3], RunLine::Answer(Answer::Error(e)) if e.kind == "unreachable"),
        "{b}"
    );
    // Nothing was killed or revoked after the fence was closed: a later fence of
    // the key (which opens once the run ended) is never this batch's to touch.
    assert!(
        !mock
            .ops()
            .iter()
            .any(|o| *o == "kill-all" || *o == "revoke-grant"),
        "{:?}",
        mock.ops()
    );
}

#[tokio::test]
async fn no_grant_opens_on_a_container_while_an_earlier_fences_run_is_going() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let id = ensured(&n, "alpha").await;
    // A fence whose front went away mid-run (a cut link): its run goes on.
    let mut first: protocol::Batch =
        serde_json::from_slice(&fence_batch(&id, &["sleep-ms", "2600"])).unwrap();
    first.calls.truncate(2);
    let batch = batch_running(&n, "alpha", &id, serde_json::to_vec(&first).unwrap()).await;
    // The key's next fence cannot open a grant the old command would share: the
    // apply waits RUN_END_WAIT for the run to end, then is refused.
    let grant = stockade_egress::rules::Grant::parse(&[]).unwrap();
    let next = serde_json::to_vec(&protocol::ApplyGrant::new(&id, "f2", &grant)).unwrap();
    let (s, b) = send(&n, "apply-grant", "alpha", &next).await;
    assert_eq!(s, 200, "{b}");
    assert!(
        matches!(serde_json::from_str::<Answer<()>>(&b).unwrap(), Answer::Error(e) if e.kind == "failed"),
        "{b}"
    );
    assert!(n.leases.running(&id), "refused while the run still went");
    // An apply made while the run is about to end (a run its front just killed)
    // waits for it and opens.
    let (s, b) = send(&n, "apply-grant", "alpha", &next).await;
    assert!(!n.leases.running(&id));
    batch.await.unwrap();
    assert_eq!(s, 200, "{b}");
    assert!(
        matches!(
            serde_json::from_str::<Answer<()>>(&b).unwrap(),
            Answer::Ok(())
        ),
        "{b}"
    );
}

#[tokio::test]
async fn a_batch_naming_the_ensured_container_without_opening_with_ensure_is_refused_whole() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    // `""` with no ensure before it.
    let (s, b) = send(
        &n,
        call::BATCH,
        "alpha",
        &fence_batch(protocol::ENSURED, &["true"]),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    // An ensure that is not the first call.
    let mut late: protocol::Batch = serde_json::from_slice(&ensure_batch(&["true"])).unwrap();
    late.calls.swap(0, 1);
    let (s, b) = send(
        &n,
        call::BATCH,
        "alpha",
        &serde_json::to_vec(&late).unwrap(),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    // Two ensures.
    let two = br#"{"calls":[{"ensure":{}},{"ensure":{}}]}"#;
    assert_eq!(send(&n, call::BATCH, "alpha", two).await.0, 400);
    // An ensure's body takes nothing.
    let extra = br#"{"calls":[{"ensure":{"key":"beta"}}]}"#;
    assert_eq!(send(&n, call::BATCH, "alpha", extra).await.0, 400);
    assert!(mock.ops().is_empty(), "{:?}", mock.ops());
}

#[tokio::test]
async fn a_streamed_stdin_arrives_whole_and_a_tampered_one_is_refused() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let id = ensured(&n, "alpha").await;
    let head = |length: Option<u64>| {
        serde_json::to_vec(&protocol::RunStream {
            container: id.clone(),
            cmd: Command {
                argv: vec!["cat".into()],
                cwd: "/workspace".into(),
                env: vec![],
                stdin: vec![],
                stdin_stream: None,
            },
            timeout_ms: 5_000,
            length,
            upload: None,
        })
        .unwrap()
    };
    // Larger than the node's plain body bound (1 KiB here) many times over.
    let data: Vec<u8> = (0..3 * stream::MAX_FRAME + 5)
        .map(|i| (i % 253) as u8)
        .collect();
    let framed = |sig: &str, data: &[u8]| {
        let mut f = stream::Framer::new(SECRET, sig);
        let mut out: Vec<u8> = f.frames(data).concat();
        out.extend_from_slice(&f.end());
        out
    };
    let nonce = auth::nonce();
    let h = head(Some(data.len() as u64));
    let (s, lines) = send_stream(&n, "alpha", &h, &nonce, |sig| framed(sig, &data)).await;
    assert_eq!(s, 200);
    let mut got = Vec::new();
    for l in &lines[..lines.len() - 1] {
        let RunLine::Stdout(b) = serde_json::from_str(l).unwrap() else {
            panic!("{l}")
        };
        got.extend(b);
    }
    assert!(got == data, "the stdin arrived whole ({} bytes)", got.len());
    assert!(
        lines.last().unwrap().contains(r#""exit_code":0"#),
        "{lines:?}"
    );
    // The same request again (its nonce): a replay, refused before any frame.
    let (s, _) = send_stream(&n, "alpha", &h, &nonce, |sig| framed(sig, &data)).await;
    assert_eq!(s, 401);
    // (why, the key, the frames for a request signed `sig`, what the answer says)
    type Frames = Box<dyn FnOnce(&str) -> Vec<u8>>;
    let cut = framed("x", &data).len() - 1;
    let d1 = data.clone();
    let d2 = data.clone();
    let d3 = data.clone();
    let rows: Vec<(&str, &str, Frames, &str)> = vec![
        (
            "frames of another request (spliced)",
            "alpha",
            Box::new(move |_| framed("another-signature", &d1)),
            "tag does not verify",
        ),
        (
            "cut before its end",
            "alpha",
            Box::new(move |sig| framed(sig, &d2)[..cut].to_vec()),
            "broke off",
        ),
        (
            "longer than signed",
            "alpha",
            Box::new(move |sig| framed(sig, &[&d3[..], b"x"].concat())),
            "longer than its signed length",
        ),
    ];
    for (why, key, frames, says) in rows {
        let (s, lines) = send_stream(&n, key, &h, &auth::nonce(), frames).await;
        assert_eq!(s, 200, "{why}");
        let last: RunLine = serde_json::from_str(lines.last().unwrap()).unwrap();
        let RunLine::Error(e) = last else {
            panic!("{why}: {lines:?}")
        };
        assert_eq!(e.kind, "invalid", "{why}");
        assert!(e.message.contains(says), "{why}: {}", e.message);
    }
    // A retry (a fresh nonce, the same idempotency key) gets the first answer's last
    // line; the run is not done again.
    let before = mock.ops().iter().filter(|o| **o == "run").count();
    let (s, first) = send_stream_idem(&n, "alpha", &h, &auth::nonce(), "i-1", |sig| {
        framed(sig, &data)
    })
    .await;
    assert_eq!(s, 200);
    let (s, again) = send_stream_idem(&n, "alpha", &h, &auth::nonce(), "i-1", |sig| {
        framed(sig, &data)
    })
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        again,
        vec![first.last().unwrap().clone()],
        "the stored last line"
    );
    assert_eq!(
        mock.ops().iter().filter(|o| **o == "run").count(),
        before + 1,
        "one run for two attempts"
    );
    // Another key naming the container: 403 before anything runs.
    let before = mock.ops().len();
    let (s, _) = send_stream(&n, "beta", &h, &auth::nonce(), |sig| framed(sig, b"")).await;
    assert_eq!(s, 403);
    assert_eq!(mock.ops().len(), before, "nothing ran");
}

/// A tar archive of (name, kind, link target or contents), headers written raw.
fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        if *kind == tar::EntryType::Symlink {
            h.set_size(0);
            // Raw, as a hostile archive would carry it.
            h.as_old_mut().linkname[..data.len()].copy_from_slice(data.as_bytes());
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, std::io::empty()).unwrap();
        } else {
            h.set_size(data.len() as u64);
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, data.as_bytes()).unwrap();
        }
    }
    b.into_inner().unwrap()
}

#[tokio::test]
async fn a_node_checks_an_upload_it_is_asked_to_with_the_servers_checker() {
    let mock = Arc::new(Mock::new(2));
    let (n, _dir) = node(mock.clone());
    let id = ensured(&n, "alpha").await;
    let head = |upload: protocol::UploadCheck| {
        serde_json::to_vec(&protocol::RunStream {
            container: id.clone(),
            cmd: Command {
                argv: vec!["cat".into()],
                cwd: "/workspace".into(),
                env: vec![],
                stdin: vec![],
                stdin_stream: None,
            },
            timeout_ms: 5_000,
            length: None,
            upload: Some(upload),
        })
        .unwrap()
    };
    let archive = |marker: &str| protocol::UploadCheck::Archive {
        marker: marker.into(),
    };
    use tar::EntryType::{Regular, Symlink};
    // (why, what is checked, the body, the verdict, whether the completion entry
    // reached the run)
    let rows: Vec<(&str, protocol::UploadCheck, Vec<u8>, &str, bool)> = vec![
        (
            "a good archive",
            archive("m1"),
            tar_of(&[("a.txt", Regular, "hello"), ("l", Symlink, "a.txt")]),
            r#"{"upload":{"entries":2}}"#,
            true,
        ),
        (
            "a ../ path",
            archive("m2"),
            tar_of(&[("ok.txt", Regular, "fine"), ("../evil", Regular, "EVIL")]),
            r#"{"upload":{"refused":"../evil has .."}}"#,
            false,
        ),
        (
            "a symlink out of the tree",
            archive("m3"),
            tar_of(&[("esc", Symlink, "../../etc")]),
            r#"{"upload":{"refused":"#,
            false,
        ),
        (
            "one file",
            protocol::UploadCheck::File {
                path: "d/f.bin".into(),
                len: 3,
                marker: "m4".into(),
            },
            b"abc".to_vec(),
            r#"{"upload":{"entries":1}}"#,
            true,
        ),
        (
            "one file, a bad path",
            protocol::UploadCheck::File {
                path: "../f".into(),
                len: 3,
                marker: "m5".into(),
            },
            b"abc".to_vec(),
            r#"{"upload":{"refused":"#,
            false,
        ),
    ];
    for (why, check, body, verdict, complete) in rows {
        let marker = match &check {
            protocol::UploadCheck::Archive { marker }
            | protocol::UploadCheck::File { marker, .. } => marker.clone(),
        };
        let h = head(check);
        let (s, lines) = send_stream(&n, "alpha", &h, &auth::nonce(), |sig| {
            let mut f = stream::Framer::new(SECRET, sig);
            let mut out: Vec<u8> = f.frames(&body).concat();
            out.extend_from_slice(&f.end());
            out
        })
        .await;
        assert_eq!(s, 200, "{why}");
        let mut stdin = Vec::new();
        for l in &lines {
            if let Ok(RunLine::Stdout(b)) = serde_json::from_str(l) {
                stdin.extend(b);
            }
        }
        let at = lines.len() - 2;
        assert!(lines[at].starts_with(verdict), "{why}: {lines:?}");
        let name = stockade_node_protocol::upload::archive::completion_name(&marker);
        let has = |needle: &[u8]| stdin.windows(needle.len()).any(|w| w == needle);
        assert_eq!(has(name.as_bytes()), complete, "{why}");
        assert!(!has(b"EVIL"), "{why}: a refused entry reached the run");
    }
    // A marker that is not letters and digits: refused before anything runs.
    let before = mock.ops().len();
    let h = head(archive("../x"));
    let (s, _) = send_stream(&n, "alpha", &h, &auth::nonce(), |sig| {
        stream::Framer::new(SECRET, sig).end().to_vec()
    })
    .await;
    assert_eq!(s, 400);
    assert_eq!(mock.ops().len(), before);
}

#[tokio::test]
async fn pending_decisions_are_a_keys_own_and_answered_once() {
    use stockade_egress::ask::Pending;
    let mock = Arc::new(Mock::new(4));
    let (n, _dir) = node(mock.clone());
    let hold = |key: &str| {
        let p = Pending {
            id: String::new(),
            key: key.into(),
            fence: format!("f-{key}"),
            method: "GET".into(),
            host: "example.com".into(),
            port: 80,
            path: "/x".into(),
            reason: "no-rule".into(),
            at_ms: 0,
            expires_ms: 0,
            widens: "GET example.com:80/x".into(),
        };
        mock.asks().hold(&format!("c-{key}"), p).expect("room")
    };
    let (a, _wait_a) = hold("alpha");
    let (b, _wait_b) = hold("beta");
    let listed = |body: &str| -> Vec<String> {
        match serde_json::from_str::<Answer<Vec<Pending>>>(body).unwrap() {
            Answer::Ok(v) => v.into_iter().map(|p| p.id).collect(),
            Answer::Error(e) => panic!("{e:?}"),
        }
    };
    // Keyed: the key's own only; node-wide (no key): every key's.
    let (s, body) = send(&n, "pending", "alpha", b"{}").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(listed(&body), vec![a.id.clone()]);
    let (_, body) = send(&n, "pending", "", b"{}").await;
    let mut all = listed(&body);
    all.sort();
    let mut want = vec![a.id.clone(), b.id.clone()];
    want.sort();
    assert_eq!(all, want);
    let verdict = |id: &str, d: &str| format!(r#"{{"id":"{id}","decision":"{d}"}}"#);
    // A key answering another key's decision: 403, and it stays held.
    let (s, body) = send(
        &n,
        "answer-pending",
        "alpha",
        verdict(&b.id, "approve").as_bytes(),
    )
    .await;
    assert_eq!(s, 403, "{body}");
    assert_eq!(mock.asks().pending(Some("beta")).len(), 1, "still held");
    // Its own: answered once; again: already decided.
    let answered =
        |body: &str| serde_json::from_str::<Answer<protocol::PendingAnswer>>(body).unwrap();
    let (s, body) = send(
        &n,
        "answer-pending",
        "alpha",
        verdict(&a.id, "refuse").as_bytes(),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        answered(&body),
        Answer::Ok(protocol::PendingAnswer::Answered(a.clone()))
    );
    let (_, body) = send(
        &n,
        "answer-pending",
        "alpha",
        verdict(&a.id, "approve").as_bytes(),
    )
    .await;
    assert_eq!(
        answered(&body),
        Answer::Ok(protocol::PendingAnswer::AlreadyDecided("refused".into()))
    );
    // Node-wide: whoever's; an id never issued is not found.
    let (_, body) = send(
        &n,
        "answer-pending",
        "",
        verdict(&b.id, "approve").as_bytes(),
    )
    .await;
    assert_eq!(
        answered(&body),
        Answer::Ok(protocol::PendingAnswer::Answered(b.clone()))
    );
    let never = uuid::Uuid::new_v4().to_string();
    let (_, body) = send(
        &n,
        "answer-pending",
        "",
        verdict(&never, "approve").as_bytes(),
    )
    .await;
    assert_eq!(
        answered(&body),
        Answer::Ok(protocol::PendingAnswer::NotFound)
    );
    // A key outside the grammar is still refused; an unknown verdict does not parse.
    let (s, _) = send(&n, "pending", "../etc", b"{}").await;
    assert_eq!(s, 400);
    let (s, _) = send(
        &n,
        "answer-pending",
        "",
        verdict(&never, "maybe").as_bytes(),
    )
    .await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn bad_input_is_a_typed_refusal_and_changes_nothing() {
    let mock = Arc::new(Mock::new(4));
    let (n, _dir) = node(mock.clone());
    let big = vec![b' '; 2048];
    // (why, call, key, body, status, kind)
    type Row<'a> = (&'a str, &'a str, &'a str, &'a [u8], u16, &'a str);
    let rows: &[Row<'_>] = &[
        (
            "an unknown field",
            "ensure",
            "alpha",
            br#"{"key":"beta"}"#,
            400,
            "invalid",
        ),
        ("not JSON", "ensure", "alpha", b"ensure!", 400, "invalid"),
        (
            "a key outside the grammar",
            "ensure",
            "../etc",
            b"{}",
            400,
            "invalid",
        ),
        (
            "no key on a keyed call",
            "ensure",
            "",
            b"{}",
            400,
            "invalid",
        ),
        (
            "an unknown call",
            "format-disk",
            "alpha",
            b"{}",
            404,
            "invalid",
        ),
        (
            "a body over the bound",
            "ensure",
            "alpha",
            &big,
            413,
            "invalid",
        ),
        (
            "a container never ensured",
            "stop",
            "alpha",
            br#"{"container":"c1"}"#,
            403,
            "forbidden",
        ),
    ];
    for (why, call, key, body, status, kind) in rows {
        let (s, b) = send(&n, call, key, body).await;
        assert_eq!(s, *status, "{why}: {b}");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["kind"], *kind, "{why}: {b}");
    }
    assert!(
        mock.ops().is_empty(),
        "nothing reached the substrate: {:?}",
        mock.ops()
    );
    // A put-secret that does not parse never echoes its value.
    let (s, b) = send(
        &n,
        "put-secret",
        "",
        br#"{"name":"tok","value":"hunter2","host":"a.example","port":"hunter2","methods":["GET"],"path_prefix":"/"}"#,
    )
    .await;
    assert_eq!(s, 400);
    assert!(!b.contains("hunter2"), "{b}");
}

#[tokio::test]
async fn a_door_opens_only_on_the_keys_own_container_and_a_bad_port_is_invalid() {
    let mock = Arc::new(Mock::new(4));
    let (n, _dir) = node(mock.clone());
    let ensure = |key: &'static str| {
        let n = n.clone();
        async move {
            let (s, b) = send(&n, "ensure", key, b"{}").await;
            assert_eq!(s, 200, "{b}");
            match serde_json::from_str::<Answer<String>>(&b).unwrap() {
                Answer::Ok(id) => id,
                Answer::Error(e) => panic!("{e:?}"),
            }
        }
    };
    let (a, b) = (ensure("alpha").await, ensure("beta").await);
    let on = |c: &str, port: &str| format!(r#"{{"container":"{c}","port":{port}}}"#);
    let (s, body) = send(&n, "open-preview", "alpha", on(&a, "8000").as_bytes()).await;
    assert_eq!(s, 200, "{body}");
    let Answer::Ok(door) = serde_json::from_str::<Answer<protocol::Preview>>(&body).unwrap() else {
        panic!("{body}")
    };
    assert_eq!(door.port, 8000);
    assert!(door.url.contains(&door.token), "{door:?}");
    let (_, again) = send(&n, "open-preview", "alpha", on(&a, "8000").as_bytes()).await;
    assert_eq!(
        again, body,
        "the open door answered again, not a second one"
    );
    let list = format!(r#"{{"container":"{a}"}}"#);
    let (_, listed) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
    assert_eq!(listed, format!(r#"{{"ok":[{}]}}"#, json_str(&door)));
    // Nothing below reaches the substrate: another key's container (whichever
    // call), a container no key ensured, a port that does not parse, port 0.
    let before = mock.ops();
    // (why, call, key, body, status, kind)
    let rows: Vec<(&str, &str, &str, String, u16, &str)> = vec![
        (
            "another key opens",
            "open-preview",
            "beta",
            on(&a, "9000"),
            403,
            "forbidden",
        ),
        (
            "another key closes",
            "close-preview",
            "beta",
            on(&a, "8000"),
            403,
            "forbidden",
        ),
        (
            "another key lists",
            "list-previews",
            "beta",
            list.clone(),
            403,
            "forbidden",
        ),
        (
            "never ensured",
            "open-preview",
            "alpha",
            on("c-guessed", "8000"),
            403,
            "forbidden",
        ),
        (
            "port 65536",
            "open-preview",
            "alpha",
            on(&a, "65536"),
            400,
            "invalid",
        ),
        (
            "port -1",
            "open-preview",
            "alpha",
            on(&a, "-1"),
            400,
            "invalid",
        ),
        (
            "port a string",
            "open-preview",
            "alpha",
            on(&a, "\"8000\""),
            400,
            "invalid",
        ),
        (
            "an unknown field",
            "open-preview",
            "alpha",
            format!(r#"{{"container":"{a}","port":8000,"key":"beta"}}"#),
            400,
            "invalid",
        ),
        (
            "port 0 opens",
            "open-preview",
            "alpha",
            on(&a, "0"),
            200,
            "invalid",
        ),
        (
            "port 0 closes",
            "close-preview",
            "alpha",
            on(&a, "0"),
            200,
            "invalid",
        ),
    ];
    for (why, call, key, body, status, kind) in rows {
        let (s, got) = send(&n, call, key, body.as_bytes()).await;
        assert_eq!(s, status, "{why}: {got}");
        let v: serde_json::Value = serde_json::from_str(&got).unwrap();
        assert_eq!(v["error"]["kind"], kind, "{why}: {got}");
    }
    assert_eq!(mock.ops(), before, "nothing reached the substrate");
    // Beta's own container has no door; alpha's is as it was.
    let (_, theirs) = send(
        &n,
        "list-previews",
        "beta",
        format!(r#"{{"container":"{b}"}}"#).as_bytes(),
    )
    .await;
    assert_eq!(theirs, r#"{"ok":[]}"#);
    let (_, still) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
    assert_eq!(still, listed);
    // Its owner closes it: true once, then false; gone from the list.
    let (_, closed) = send(&n, "close-preview", "alpha", on(&a, "8000").as_bytes()).await;
    assert_eq!(closed, r#"{"ok":true}"#);
    let (_, closed) = send(&n, "close-preview", "alpha", on(&a, "8000").as_bytes()).await;
    assert_eq!(closed, r#"{"ok":false}"#);
    let (_, listed) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
    assert_eq!(listed, r#"{"ok":[]}"#);
}

fn json_str<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

#[tokio::test]
async fn calls_reach_the_substrate_for_their_key_and_answer_its_words() {
    let mock = Arc::new(Mock::new(1));
    let (n, _dir) = node(mock.clone());
    let (s, b) = send(&n, "ensure", "alpha", b"{}").await;
    assert_eq!(s, 200, "{b}");
    let id: Answer<String> = serde_json::from_str(&b).unwrap();
    let Answer::Ok(id) = id else { panic!("{b}") };
    // The gate is full: an answer, not an HTTP error.
    let (s, b) = send(&n, "ensure", "beta", b"").await;
    assert_eq!(
        (s, b.as_str()),
        (200, r#"{"error":{"kind":"over-capacity","message":""}}"#)
    );
    let (s, b) = send(&n, "health", "", b"{}").await;
    assert_eq!(s, 200);
    assert_eq!(
        serde_json::from_str::<Answer<protocol::Health>>(&b).unwrap(),
        Answer::Ok(protocol::Health {
            node: "node-1".into(),
            substrate: "mock".into(),
            live: 1,
            ceiling: 4,
        })
    );
    let stop = format!(r#"{{"container":"{id}"}}"#);
    let (s, _) = send(&n, "stop", "beta", stop.as_bytes()).await;
    assert_eq!(s, 403, "another key");
    // The egress audit's admitted requests are the key's own, from the node's store.
    let a = stockade_egress::audit::Admitted {
        at_ms: 1,
        fence: "f".into(),
        method: "GET".into(),
        host: "example.com".into(),
        port: 443,
        ..Default::default()
    };
    n.store.record_admitted("alpha", &id, &a).unwrap();
    let (s, b) = send(&n, "admitted", "alpha", b"{}").await;
    assert_eq!(s, 200, "{b}");
    let got: Answer<Vec<stockade_egress::audit::Admitted>> = serde_json::from_str(&b).unwrap();
    assert_eq!(got, Answer::Ok(vec![a]));
    let (_, b) = send(&n, "admitted", "beta", b"{}").await;
    assert_eq!(b, r#"{"ok":[]}"#, "another key's are not");
    // A run carries its stdin: its body may pass the plain bound (1 KiB here).
    let stdin = vec![b'x'; 4096];
    let run = serde_json::to_vec(&protocol::Run {
        container: id.clone(),
        cmd: Command {
            argv: vec!["cat".into()],
            cwd: "/workspace".into(),
            env: vec![],
            stdin: stdin.clone(),
            stdin_stream: None,
        },
        timeout_ms: 5_000,
    })
    .unwrap();
    let (s, b) = send(&n, "run", "alpha", &run).await;
    assert_eq!(s, 200, "{b}");
    let lines: Vec<RunLine> = b
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.first(), Some(&RunLine::Stdout(stdin)), "{b}");
    assert!(
        matches!(lines.last(), Some(RunLine::Result(r)) if r.exit_code == 0),
        "{b}"
    );
    let (s, b) = send(&n, "stop", "alpha", stop.as_bytes()).await;
    assert_eq!((s, b.as_str()), (200, r#"{"ok":null}"#));
}

#[tokio::test]
async fn a_runs_head_waits_for_its_first_line_but_never_past_the_bound() {
    use futures_util::StreamExt;
    let every = Duration::from_secs(5);
    // A short run: its one line and the end are the answer's first frames.
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Bytes::from_static(b"{\"result\":1}\n")).unwrap();
    drop(tx);
    let r = stream_after_first_line(rx, every).await;
    let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    assert_eq!(&b[..], b"{\"result\":1}\n");
    // A run saying nothing: the head goes after FIRST_LINE_WAIT, not a heartbeat's
    // interval, and the heartbeats follow as before.
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let t = std::time::Instant::now();
    let r = stream_after_first_line(rx, every).await;
    let waited = t.elapsed();
    assert!(
        waited >= FIRST_LINE_WAIT && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    tx.send(Bytes::from_static(b"{\"stdout\":\"\"}\n")).unwrap();
    let mut body = r.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"{\"stdout\":\"\"}\n");
    drop(tx);
    assert!(body.next().await.is_none(), "ends with its lines");
}

/// A request for `call` signed at `time` (with `secret`) whose body is one chunk and
/// then never ends (a client holding back its last byte); `signed: false` sends no
/// signature header.
fn held_request(call: &str, time: u64, secret: &[u8], signed: bool) -> axum::http::Request<Body> {
    let path = format!("{}{call}", protocol::PREFIX);
    let nonce = auth::nonce();
    let sig = Signed {
        time_ms: time,
        nonce: &nonce,
        method: "POST",
        path: &path,
        key: "alpha",
        idempotency: "",
        body: b"{}",
    }
    .sign(secret);
    let first =
        futures_util::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{ ")) });
    let body = Body::from_stream(futures_util::StreamExt::chain(
        first,
        futures_util::stream::pending(),
    ));
    let mut b = axum::http::Request::post(&path)
        .header(auth::TIME_HEADER, time.to_string())
        .header(auth::NONCE_HEADER, nonce)
        .header(auth::KEY_HEADER, "alpha");
    if signed {
        b = b.header(auth::SIGNATURE_HEADER, sig);
    }
    b.body(body).unwrap()
}

async fn status_of(node: &Arc<Node>, call: &str, req: axum::http::Request<Body>) -> u16 {
    handle(State(node.clone()), Path(call.to_owned()), req)
        .await
        .status()
        .as_u16()
}

#[tokio::test]
async fn an_unsigned_or_stale_request_is_refused_before_its_body_is_read() {
    let (node, _dir) = node(Arc::new(Mock::new(4)));
    // Were the body read first, these would wait on it for ever.
    let within = Duration::from_secs(5);
    let unsigned = held_request("ensure", now_ms(), SECRET, false);
    let s = tokio::time::timeout(within, status_of(&node, "ensure", unsigned)).await;
    assert_eq!(s, Ok(401), "unsigned");
    let stale = held_request("ensure", now_ms() - 31_000, SECRET, true);
    let s = tokio::time::timeout(within, status_of(&node, "ensure", stale)).await;
    assert_eq!(s, Ok(401), "outside the window");
    let stream = held_request(call::RUN_STREAM, now_ms(), SECRET, false);
    let s = tokio::time::timeout(within, status_of(&node, call::RUN_STREAM, stream)).await;
    assert_eq!(s, Ok(401), "a run-stream's head");
    assert!(
        node.nonces.lock().unwrap().is_empty(),
        "no nonce slot taken"
    );
}

#[tokio::test]
async fn unverified_bodies_are_bounded_and_past_it_refused_at_once() {
    let (node, _dir) = node(Arc::new(Mock::new(4)));
    // Forged (another secret), in time, bodies that never end: each takes a permit.
    let forged = || held_request("ensure", now_ms(), b"another secret", true);
    let held: Vec<_> = (0..UNVERIFIED_BODIES)
        .map(|_| tokio::spawn(status_of_owned(node.clone(), forged())))
        .collect();
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while node.unverified.available_permits() > 0 {
        assert!(
            std::time::Instant::now() < end,
            "the bodies were never read"
        );
        tokio::task::yield_now().await;
    }
    let s =
        tokio::time::timeout(Duration::from_secs(5), status_of(&node, "ensure", forged())).await;
    assert_eq!(s, Ok(503), "past the bound");
    // A small signed call is served meanwhile.
    assert_eq!(send(&node, "ensure", "alpha", b"{}").await.0, 200);
    for h in held {
        h.abort();
    }
}

async fn status_of_owned(node: Arc<Node>, req: axum::http::Request<Body>) -> u16 {
    status_of(&node, "ensure", req).await
}

#[tokio::test]
async fn a_body_slower_than_its_window_is_refused() {
    let (node, _dir) = node(Arc::new(Mock::new(4)));
    // Signed 29.5 s ago: half a second of the window is left for the body.
    let req = held_request("ensure", now_ms() - 29_500, SECRET, true);
    let s = tokio::time::timeout(Duration::from_secs(5), status_of(&node, "ensure", req)).await;
    assert_eq!(s, Ok(408));
}
