//! Live output on the substrate: a streaming run sends each chunk as the command
//! writes it, and a host that hangs up mid-run (its client went away) gets the run's
//! tree killed by the supervisor at its next chunk.

use std::time::Duration;

use stockade_runtime::substrate::{Output, Substrate};

use crate::support::{DEADLINE, harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_run_sends_each_chunk_while_the_command_runs() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("stream").await.unwrap();
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let linux = h.linux.clone();
    let cmd = h.cmd("echo a; while [ ! -e go ]; do sleep 0.01; done; echo b >&2; echo c");
    let c2 = c.clone();
    let run = tokio::spawn(async move { linux.run_streaming(&c2, cmd, DEADLINE, sink).await });
    let first = tokio::time::timeout(DEADLINE, rx.recv()).await.unwrap();
    assert_eq!(first, Some(Output::Stdout(b"a\n".to_vec())));
    // The command is still waiting: only now may it go on.
    std::fs::write(h.container_dir(&c).join("fs/workspace/go"), "").unwrap();
    let r = tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The output went to the sink; the answer carries none of it again.
    assert_eq!((r.exit_code, r.stdout.len(), r.stderr.len()), (0, 0, 0));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Ok(o) = rx.try_recv() {
        match o {
            Output::Stdout(b) => out.extend(b),
            Output::Stderr(b) => err.extend(b),
            Output::Started => {}
        }
    }
    assert_eq!((&out[..], &err[..]), (&b"c\n"[..], &b"b\n"[..]));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_run_whose_host_hangs_up_is_killed_by_the_supervisor() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("hangup").await.unwrap();
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let linux = h.linux.clone();
    let cmd = h.cmd("while true; do echo x; sleep 0.05; done");
    let c2 = c.clone();
    let run = tokio::spawn(async move {
        linux
            .run_streaming(&c2, cmd, Duration::from_secs(600), sink)
            .await
    });
    let first = tokio::time::timeout(DEADLINE, rx.recv()).await.unwrap();
    assert!(matches!(first, Some(Output::Stdout(_))), "{first:?}");
    // The host drops the call (and with it the connection); no kill is sent.
    run.abort();
    h.assert_no_marked("the supervisor killed the run when its host hung up")
        .await;
    h.finish().await;
}
