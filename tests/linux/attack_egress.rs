//! Request smuggling (docs/EGRESS.md) from inside a real container, through the consumer's
//! path (an exec with a grant): a body on GET that carries a second request, sent with a
//! raw socket to the proxy, against a host upstream that reads GET requests' heads only (as
//! Python's `http.server` does). The proxy used to forward the body on its kept upstream
//! connection, where it was read as `GET /secret.txt`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::facade::{fx, grant, out};

/// A keep-alive HTTP/1.1 server on `ip` that reads each request's head only, never a
/// body; records `METHOD target` of every request it reads.
fn head_only_server(ip: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let Ok(mut w) = s.try_clone() else {
                    return;
                };
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim().to_string();
                    if line.is_empty() {
                        continue;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h.trim().is_empty() {
                            break;
                        }
                    }
                    let mut parts = line.split_whitespace();
                    let (m, p) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                    log.lock().unwrap().push(format!("{m} {p}"));
                    if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_on_get_smuggles_no_request_to_an_upstream_that_ignores_it() {
    let f = fx(|_| {}).await;
    let (port, seen) = head_only_server("127.0.0.2");
    let u = format!("127.0.0.2:{port}");
    // The command talks to the proxy itself, byte for byte, and prints the status line
    // of the one answer it reads.
    let py = format!(
        r#"import socket
inner = b"GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n"
req = b"GET http://{u}/allowed/ok.txt HTTP/1.1\r\nHost: {u}\r\nContent-Length: %d\r\n\r\n" % len(inner) + inner
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(req)
got = b""
while b"\r\n\r\n" not in got:
    b = s.recv(4096)
    if not b:
        break
    got += b
print(got.split(b"\r\n")[0].decode())
"#
    );
    let mut input = f.argv(&["python3", "-c", &py]);
    input.grant = Some(grant("127.0.0.2", &["GET"], Some("/allowed/")));
    let o = f.rt.exec("attack-get-body", &input).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|r| r.contains("secret")),
        "a request nobody decided on reached the upstream: {seen:?}"
    );
    assert_eq!(
        out(&o.stdout),
        "HTTP/1.1 400 Bad Request\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert!(seen.is_empty(), "the refused request reached it: {seen:?}");
    f.finish().await;
}
