//! Invariant 3 through the consumer's path: an open fence's grant is the fenced
//! run's alone. A detached process, started before the fence, that asks for exactly
//! what the fenced command asks for while the fence is open (plain HTTP, and a
//! CONNECT) is denied `detached`, recorded under the fence; the fenced command's
//! requests are admitted. Servers are the test's own, on the host loopback 127.0.0.2.

use stockade_runtime::substrate::Substrate;

use crate::facade::{fx, grant, out, wait_for};

/// Plain HTTP and a CONNECT through the proxy, each printed as `what status reason`.
const PROBE: &str = r#"
import socket, sys, urllib.request, urllib.error
def probe(url, connect_to):
    res = []
    try:
        res.append("http %d -" % urllib.request.urlopen(url, timeout=5).status)
    except urllib.error.HTTPError as e:
        res.append("http %d %s" % (e.code, e.headers.get("x-stockade-denial")))
    except Exception as e:
        res.append("http error " + type(e).__name__)
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (connect_to, connect_to)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(4096)
            if not b:
                break
            head += b
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ")[1]
        reason = "-"
        for l in lines[1:]:
            if l.lower().startswith("x-stockade-denial:"):
                reason = l.split(":", 1)[1].strip()
        res.append("connect %s %s" % (status, reason))
        s.close()
    except Exception as e:
        res.append("connect error " + type(e).__name__)
    return "\n".join(res) + "\n"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_process_is_denied_the_open_fences_grant_the_fenced_command_gets() {
    let f = fx(|_| {}).await;
    let (port, seen) = crate::facade_egress::http_server("127.0.0.2");
    let url = format!("http://127.0.0.2:{port}/allowed/x");
    let target = format!("127.0.0.2:{port}");
    // The detached process waits (with a deadline of its own) for the fenced command
    // to say "go", then asks for exactly what the fenced command asked for.
    let detached = format!(
        r#"{PROBE}
import os, time
for _ in range(600):
    if os.path.exists("/workspace/go"):
        break
    time.sleep(0.05)
r = probe("{url}", "{target}")
open("/workspace/detached.tmp", "w").write(r)
os.rename("/workspace/detached.tmp", "/workspace/detached")
while True:
    time.sleep(3600)
"#
    );
    f.rt.start_detached("det21", &f.argv(&["python3", "-c", &detached]))
        .await
        .unwrap();
    let fenced = format!(
        r#"{PROBE}
import os, sys, time
sys.stdout.write(probe("{url}", "{target}"))
open("/workspace/go", "w").close()
for _ in range(600):
    if os.path.exists("/workspace/detached"):
        break
    time.sleep(0.05)
sys.stdout.write(open("/workspace/detached").read())
"#
    );
    let mut input = f.argv(&["python3", "-c", &fenced]);
    input.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("det21", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "http 200 -\nconnect 200 -\nhttp 403 detached\nconnect 403 detached\n",
        "the fenced command's requests admitted, the detached process's denied: {}",
        out(&o.stderr)
    );
    assert_eq!(
        o.denials, 2,
        "the detached denials count under the fence: {o:?}"
    );
    // Recorded under the fence (not `none`), with the reason.
    let d = f.rt.denials("det21").await.unwrap();
    let detached: Vec<_> = d
        .iter()
        .filter(|d| {
            format!("{:?}", d.reason)
                .to_ascii_lowercase()
                .contains("detached")
        })
        .collect();
    assert_eq!(detached.len(), 2, "{d:?}");
    assert!(
        detached
            .iter()
            .all(|d| !format!("{d:?}").contains("\"none\"")),
        "{d:?}"
    );
    let methods: Vec<_> = detached.iter().map(|d| d.method.as_str()).collect();
    assert!(
        methods.contains(&"GET") && methods.contains(&"CONNECT"),
        "{methods:?}"
    );
    // The upstream saw the fenced command's request only (and its empty tunnel).
    let requests: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.trim().is_empty())
        .cloned()
        .collect();
    assert_eq!(requests, ["GET /allowed/x".to_string()]);
    // The detached process lives on after the fence (denied, not killed).
    let c = f.linux.current("det21").await.unwrap().unwrap();
    let result = f
        .data
        .join("containers")
        .join(&c)
        .join("fs/workspace/detached");
    wait_for("the detached result stays", || result.exists()).await;
    f.finish().await;
}
