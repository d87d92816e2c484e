//! The egress fence (DESIGN §5) through the facade, seen by real clients (curl, Python's
//! `urllib`, raw sockets) in a real container, against servers the test starts on the
//! host loopback at 127.0.0.2 (inside a container `NO_PROXY` covers 127.0.0.1, so the
//! proxy is used for 127.0.0.2).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use stockade_runtime::bindings::{DetachedState, FacadeError};
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::Substrate;

use crate::facade::{facade_err, fx, grant, out, wait_for};

/// A host HTTP server on `ip` answering `ok` to every request; records `METHOD path`.
pub fn http_server(ip: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let line = head.lines().next().unwrap_or("").to_string();
            let mut parts = line.split_whitespace();
            let (m, p) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            log.lock().unwrap().push(format!("{m} {p}"));
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    (port, seen)
}

/// A raw TCP echo server on 127.0.0.2.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// The allowed host/method/path passes (curl and urllib); another path, method or host
/// gets 403 with the right reason, recorded and counted by the exec. A later exec
/// without a grant is denied too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_passes_and_path_method_host_are_denied_with_reasons() {
    let f = fx(|_| {}).await;
    let (port, seen) = http_server("127.0.0.2");
    let base = format!("http://127.0.0.2:{port}");
    let script = format!(
        r#"c() {{ curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 "$@"; echo; }}
c {base}/allowed/x
c {base}/other
c -X POST {base}/allowed/x
c http://127.0.0.3:{port}/allowed/x
python3 - <<'EOF'
import urllib.request, urllib.error
print(urllib.request.urlopen("{base}/allowed/py", timeout=5).status)
try:
    urllib.request.urlopen("{base}/nope", timeout=5)
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("x-stockade-denial"))
EOF
"#
    );
    let mut input = f.sh(&script);
    input.grant = Some(grant("127.0.0.2", &["GET"], Some("/allowed")));
    let o = f.rt.exec("eg", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "200\n403\n403\n403\n200\n403 path\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(o.exit_code, 0);
    assert_eq!(o.denials, 4, "the exec counts its fence's denials: {o:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["GET /allowed/x".to_string(), "GET /allowed/py".to_string()],
        "denied requests never reach the server"
    );
    let d = f.rt.denials("eg").await.unwrap();
    let got: Vec<_> = d
        .iter()
        .map(|d| {
            (
                d.host.as_str(),
                d.method.as_str(),
                d.path.as_str(),
                d.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("127.0.0.2", "GET", "/other", "path"),
            ("127.0.0.2", "POST", "/allowed/x", "method"),
            ("127.0.0.3", "GET", "/allowed/x", "no-rule"),
            ("127.0.0.2", "GET", "/nope", "path"),
        ]
    );
    let fence = d[0].rule_set.clone();
    assert!(
        d.iter().all(|x| x.rule_set == fence) && fence != "none",
        "{d:?}"
    );
    assert!(
        f.linux.open_grants().is_empty(),
        "the grant closed with the exec"
    );

    // The same request from a later exec without a grant: its fence is open with no
    // rules, so the proxy answers `no-rule` under the new fence's rule set.
    let o = f
        .rt
        .exec(
            "eg",
            &f.sh(&format!(
                "curl -s -o /dev/null -D - --max-time 5 {base}/allowed/x | tr -d '\\r' | grep -i '^x-stockade-denial'"
            )),
        )
        .await
        .unwrap();
    assert_eq!(out(&o.stdout), "x-stockade-denial: no-rule\n", "{o:?}");
    assert_eq!(o.denials, 1);
    let d = f.rt.denials("eg").await.unwrap();
    let last = d.last().unwrap();
    assert_eq!(
        (last.path.as_str(), last.reason.as_str()),
        ("/allowed/x", "no-rule")
    );
    assert_ne!(last.rule_set, fence, "a new fence");
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "nothing more reached the server"
    );
    f.finish().await;
}

/// A detached process holds no grant: `start-detached` opens none (and refuses one),
/// a grant is open only while an exec runs, and between fences a detached process
/// reaches nothing, through the proxy (`no-grant`, rule set `none`) or around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_process_between_fences_reaches_nothing() {
    let f = fx(|_| {}).await;
    let (port, seen) = http_server("127.0.0.2");
    let url = format!("http://127.0.0.2:{port}/allowed/x");
    let mut with_grant = f.argv(&["true"]);
    with_grant.grant = Some(grant("127.0.0.2", &[], None));
    assert!(matches!(
        facade_err(f.rt.start_detached("det", &with_grant).await),
        FacadeError::InvalidInput(_)
    ));
    let py = format!(
        r#"import os, time, urllib.request, urllib.error
res = []
try:
    res.append("proxy %d" % urllib.request.urlopen("{url}", timeout=5).status)
except urllib.error.HTTPError as e:
    res.append("proxy %d %s" % (e.code, e.headers.get("x-stockade-denial")))
except Exception as e:
    res.append("proxy error " + type(e).__name__)
try:
    o = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
    res.append("direct %d" % o.open("{url}", timeout=5).status)
except Exception as e:
    res.append("direct error")
open("/workspace/result.tmp", "w").write("\n".join(res) + "\n")
os.rename("/workspace/result.tmp", "/workspace/result")
while True:
    time.sleep(3600)
"#
    );
    let id =
        f.rt.start_detached("det", &f.argv(&["python3", "-c", &py]))
            .await
            .unwrap();
    assert!(
        f.linux.open_grants().is_empty(),
        "start-detached applied no grant"
    );
    // Wait (on the host) for the result, so it was produced with no fence open.
    let c = f.linux.current("det").await.unwrap().unwrap();
    let result = f
        .data
        .join("containers")
        .join(&c)
        .join("fs/workspace/result");
    wait_for("the detached process wrote its result", || result.exists()).await;
    assert!(f.linux.open_grants().is_empty());
    // Read it back through a later exec, which waits for it with its own deadline.
    let o =
        f.rt.exec(
            "det",
            &f.sh("for i in $(seq 200); do [ -f result ] && break; sleep 0.05; done; cat result"),
        )
        .await
        .unwrap();
    assert_eq!(
        out(&o.stdout),
        "proxy 403 no-grant\ndirect error\n",
        "{o:?}"
    );
    let d = f.rt.denials("det").await.unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (
            d[0].reason.as_str(),
            d[0].rule_set.as_str(),
            d[0].path.as_str()
        ),
        ("no-grant", "none", "/allowed/x")
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing reached the server"
    );

    // A grant is open exactly while an exec runs: the command signals it is running
    // and waits for the host's go.
    let inside = f
        .data
        .join("containers")
        .join(&c)
        .join("fs/workspace/inside");
    let go = f.data.join("containers").join(&c).join("fs/workspace/go");
    let mut input =
        f.sh("touch inside; for i in $(seq 400); do [ -f go ] && exit 0; sleep 0.05; done; exit 9");
    input.grant = Some(grant("127.0.0.2", &[], None));
    let rt = f.rt.clone();
    let exec = tokio::spawn(async move { rt.exec("det", &input).await });
    wait_for("the fenced command runs", || inside.exists()).await;
    assert_eq!(
        f.linux.open_grants(),
        vec![c.clone()],
        "the exec's grant is open"
    );
    std::fs::write(&go, b"").unwrap();
    let o = exec.await.unwrap().unwrap();
    assert_eq!(o.exit_code, 0);
    assert!(f.linux.open_grants().is_empty(), "closed after the exec");
    assert_eq!(
        f.rt.detached_status("det", &id).await.unwrap(),
        DetachedState::Running,
        "the declared process survived both fences"
    );
    f.rt.stop_detached("det", &id).await.unwrap();
    f.finish().await;
}

/// Bypassing the proxy reaches nothing: not the host's loopback (127.0.0.2, or a
/// server on the host's 127.0.0.1), not any other address, even with a grant open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_connection_bypassing_the_proxy_fails() {
    let f = fx(|_| {}).await;
    let (port, seen) = http_server("127.0.0.2");
    let (lo_port, lo_seen) = http_server("127.0.0.1");
    let script = format!(
        r#"curl -s -o /dev/null -w '%{{http_code}}\n' --noproxy '*' --max-time 5 http://127.0.0.2:{port}/
python3 - <<'EOF'
import socket
for a in [("127.0.0.2", {port}), ("127.0.0.1", {lo_port}), ("1.1.1.1", 80), ("10.0.0.1", 80), ("::1", {lo_port})]:
    s = socket.socket(socket.AF_INET6 if ":" in a[0] else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect(a)
        print("connected", a[0])
    except OSError as e:
        print("failed", a[0])
EOF
"#
    );
    let mut input = f.sh(&script);
    input.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("direct", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "000\nfailed 127.0.0.2\nfailed 127.0.0.1\nfailed 1.1.1.1\nfailed 10.0.0.1\nfailed ::1\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(o.denials, 0, "the proxy never saw these");
    assert!(seen.lock().unwrap().is_empty() && lo_seen.lock().unwrap().is_empty());
    f.finish().await;
}

/// CONNECT to an allowed host tunnels bytes both ways (a raw socket speaking CONNECT
/// to an echo server, and curl's `--proxytunnel`); CONNECT under a path rule is denied
/// with `needs-interception`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnels_both_ways_and_a_path_rule_needs_interception() {
    // Interception off: a path rule cannot be checked inside a tunnel (with it on, the
    // tunnel is intercepted: tests/linux/https.rs).
    let f = fx(|c| c.egress.interception = false).await;
    let echo = echo_server();
    let (http, seen) = http_server("127.0.0.2");
    let py = format!(
        r#"import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT 127.0.0.2:{echo} HTTP/1.1\r\nHost: 127.0.0.2:{echo}\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    d = s.recv(4096)
    if not d:
        break
    head += d
lines = head.split(b"\r\n")
print(lines[0].decode().split(" ")[1])
for l in lines:
    if l.lower().startswith(b"x-stockade-denial"):
        print(l.decode().split(":")[1].strip())
if lines[0].split(b" ")[1] == b"200":
    for m in [b"ping-1\n", b"\x00\xffbinary\n"]:
        s.sendall(m)
        got = b""
        while len(got) < len(m):
            got += s.recv(100)
        print(got == m)
"#
    );
    let script = format!(
        "python3 -c '{py}'\ncurl -s -p -o /dev/null -w '%{{http_connect}} %{{http_code}}\\n' --max-time 5 http://127.0.0.2:{http}/tunnelled",
        py = py.replace('\'', "'\\''")
    );
    let mut input = f.sh(&script);
    input.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("tun", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "200\nTrue\nTrue\n200 200\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(o.denials, 0);
    assert_eq!(*seen.lock().unwrap(), vec!["GET /tunnelled".to_string()]);

    let mut input = f.sh(&script);
    input.grant = Some(grant("127.0.0.2", &[], Some("/x")));
    let o = f.rt.exec("tun", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "403\nneeds-interception\n403 000\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(o.denials, 2);
    let d = f.rt.denials("tun").await.unwrap();
    let got: Vec<_> = d
        .iter()
        .map(|d| (d.method.as_str(), d.path.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("CONNECT", "", "needs-interception"),
            ("CONNECT", "", "needs-interception")
        ]
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the denied tunnel reached nothing"
    );
    f.finish().await;
}
