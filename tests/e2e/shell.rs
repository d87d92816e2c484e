//! The interactive terminal (DESIGN §8) through the real binary: `stockade shell` driven
//! inside tmux (its own server, `tmux -L <unique socket>`, killed by that socket only), as
//! a person at a terminal drives it: a prompt, `stty size` and a resize, Ctrl-C ending a
//! `sleep`, the exit code; a granted session reaches a loopback upstream only while it
//! runs; and hostile frames on the raw WebSocket get a typed close and leave nothing
//! behind.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use stockade_tests::stockade_exe;

use crate::Server;

/// A tmux server of this test's own, one session; killed (by its socket) when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `stockade shell ARGS` in a `cols`x`rows` window; when it ends, the pane says
    /// `[exit N]` and stays.
    fn start(srv: &Server, args: &str, cols: u16, rows: u16) -> Tmux {
        let socket = format!("stockade-e2e-{}", uuid::Uuid::new_v4().simple());
        let line = format!(
            "STOCKADE_SERVER=http://{} STOCKADE_DATA_DIR={} {} shell {args}; echo \"[exit $?]\"; sleep 600",
            srv.addr,
            srv.data_dir().display(),
            stockade_exe().display()
        );
        let t = Tmux { socket };
        t.run(&[
            "new-session",
            "-d",
            "-s",
            "s",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
            "sh",
            "-c",
            &line,
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let o = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux (scripts/setup installs it)");
        assert!(
            o.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Type `text` (literally), then Enter.
    fn line(&self, text: &str) {
        self.run(&["send-keys", "-t", "s", "-l", text]);
        self.run(&["send-keys", "-t", "s", "Enter"]);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "s"])
    }

    /// Wait until the screen shows `what` (the pane is the event), or fail.
    fn wait_for(&self, what: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no {what:?} on the screen within {within:?}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

const T: Duration = Duration::from_secs(30);

#[test]
fn a_shell_shows_a_prompt_its_size_a_resize_ctrl_c_and_the_exit_code() {
    let srv = Server::start();
    let tmux = Tmux::start(&srv, "shell-e2e", 100, 30);
    tmux.wait_for("$", T);
    tmux.line("stty size");
    tmux.wait_for("30 100", T);
    // The window grows: the program sees the new size (TIOCSWINSZ, SIGWINCH).
    tmux.run(&["resize-window", "-t", "s", "-x", "120", "-y", "40"]);
    // The resize reaches the CLI as SIGWINCH, the server as a message; wait for it.
    let deadline = Instant::now() + T;
    loop {
        tmux.line("stty size");
        std::thread::sleep(Duration::from_millis(200));
        if tmux.screen().contains("40 120") {
            break;
        }
        assert!(Instant::now() < deadline, "no resize:\n{}", tmux.screen());
    }
    // Ctrl-C is a byte; the terminal's line discipline makes it SIGINT for `sleep`.
    // It is sent once the shell has read the command's line (its first word's output
    // is on the screen): a Ctrl-C that came before the Enter was read would flush the
    // Enter from the terminal's input (ISIG), and the line it ends would not be this.
    let started = Instant::now();
    tmux.line("echo started-$((1+1)); sleep 100");
    tmux.wait_for("started-2", T);
    tmux.run(&["send-keys", "-t", "s", "C-c"]);
    tmux.line("echo after-$((40+2))");
    tmux.wait_for("after-42", T);
    assert!(started.elapsed() < Duration::from_secs(60));
    // The exit code passes through.
    tmux.line("exit 3");
    let screen = tmux.wait_for("[exit 3]", T);
    // The local terminal is itself again (the pane's shell printed the line).
    assert!(screen.contains("[exit 3]"), "{screen}");
    drop(tmux);
    srv.stop();
}

#[test]
fn ctrl_d_ends_the_shell_and_a_command_runs_in_place_of_it() {
    let srv = Server::start();
    let tmux = Tmux::start(&srv, "shell-e2e-d", 80, 24);
    tmux.wait_for("$", T);
    tmux.run(&["send-keys", "-t", "s", "C-d"]);
    tmux.wait_for("[exit 0]", T);
    drop(tmux);
    let tmux = Tmux::start(
        &srv,
        "shell-e2e-d -- sh -c 'tty -s && echo is-a-tty; exit 7'",
        80,
        24,
    );
    tmux.wait_for("is-a-tty", T);
    tmux.wait_for("[exit 7]", T);
    drop(tmux);
    // Killed by a signal: 128 + N, as a shell says it.
    let tmux = Tmux::start(&srv, "shell-e2e-d -- sh -c 'kill -TERM $$'", 80, 24);
    tmux.wait_for("[exit 143]", T);
    drop(tmux);
    srv.stop();
}

/// A plain HTTP upstream on 127.0.0.2 (not in the container's `no_proxy`: its requests
/// go through the fence) that answers every request 200 `upstream-ok`; stops when the
/// listener drops (the test's end).
fn upstream() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let port = l.local_addr().unwrap().port();
    let served = l.try_clone().unwrap();
    std::thread::spawn(move || {
        for conn in served.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nupstream-ok",
            );
        }
    });
    (l, port)
}

#[test]
fn a_granted_shell_reaches_the_upstream_only_while_it_runs() {
    let srv = Server::start();
    let (_up, port) = upstream();
    let curl = format!("curl -s -o /dev/null -w 'code=%{{http_code}}\\n' http://127.0.0.2:{port}/");
    let tmux = Tmux::start(
        &srv,
        &format!("shell-e2e-g --grant 'GET 127.0.0.2:{port}'"),
        100,
        30,
    );
    tmux.wait_for("$", T);
    tmux.line(&curl);
    tmux.wait_for("code=200", T);
    tmux.line("exit");
    tmux.wait_for("[exit 0]", T);
    drop(tmux);
    // The session is over: its grant is gone. The same request from the same
    // container (a later exec with no grant) is refused.
    let o = srv.cli(&["exec", "shell-e2e-g", "--", "sh", "-c", &curl]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("code=403"), "after the session: {out}");
    srv.stop();
}

/// The raw socket: an HTTP upgrade to `…/pty` with the token, then `frames` (each
/// masked, as a client's must be); what the server sent back, until it closed.
fn raw_session(srv: &Server, key: &str, frames: &[(u8, &[u8])]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let req = format!(
        "GET /v1/sandboxes/{key}/pty HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        srv.addr,
        srv.token()
    );
    s.write_all(req.as_bytes()).unwrap();
    for (opcode, payload) in frames {
        let mut f = vec![0x80 | opcode];
        let mask = [1u8, 2, 3, 4];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        if s.write_all(&f).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// The close code of the first close frame in what the server sent (after the
/// handshake), if any.
fn close_code(bytes: &[u8]) -> Option<u16> {
    let start = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..start]);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut i = start;
    while i + 2 <= bytes.len() {
        let opcode = bytes[i] & 0x0f;
        let (len, at) = match bytes[i + 1] & 0x7f {
            126 => (
                u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]) as usize,
                i + 4,
            ),
            127 => (
                u64::from_be_bytes(bytes[i + 2..i + 10].try_into().ok()?) as usize,
                i + 10,
            ),
            n => (n as usize, i + 2),
        };
        if opcode == 8 && len >= 2 {
            return Some(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        }
        i = at + len;
    }
    None
}

#[test]
fn hostile_frames_get_a_typed_close_and_leave_nothing() {
    let srv = Server::start();
    let start = br#"{"type":"start","rows":24,"cols":80}"#;
    // (what, the frames after the handshake, the close code wanted)
    type Row<'a> = (&'a str, Vec<(u8, &'a [u8])>, u16);
    let rows: Vec<Row> = vec![
        ("binary before the start", vec![(2, b"ls\n")], 1008),
        ("garbage text", vec![(1, b"\x1b[A not json")], 1008),
        (
            "a huge resize",
            vec![
                (1, start),
                (1, br#"{"type":"resize","rows":65535,"cols":65535}"#),
            ],
            1008,
        ),
        ("a second start", vec![(1, start), (1, start)], 1008),
        (
            "an unknown message type",
            vec![(1, start), (1, br#"{"type":"signal","sig":9}"#)],
            1008,
        ),
    ];
    for (what, frames, want) in &rows {
        let got = raw_session(&srv, "shell-e2e-h", frames);
        assert_eq!(close_code(&got), Some(*want), "{what}");
    }
    // A message over the bound.
    let big = vec![b'a'; 200 * 1024];
    let got = raw_session(&srv, "shell-e2e-h", &[(1, start), (2, &big)]);
    assert_eq!(
        close_code(&got),
        Some(1009),
        "an input message over the bound"
    );
    // A plain GET is a typed 400, not an upgrade.
    let (status, text) = stockade_tests::http(
        &srv.addr,
        "GET",
        "/v1/sandboxes/shell-e2e-h/pty",
        Some(&srv.token()),
        b"",
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid-input"), "{text}");
    // Every session's tree is gone (kill-all at each end): no shell is left running.
    let o = srv.cli(&["exec", "shell-e2e-h", "--", "ps", "-e", "-o", "args="]);
    let ps = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !ps.contains("/bin/sh -i"),
        "a session's shell outlived it:\n{ps}"
    );
    srv.stop();
}

/// Write one masked client frame.
fn send_frame(s: &mut std::net::TcpStream, opcode: u8, payload: &[u8]) {
    assert!(payload.len() < 126);
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&f).unwrap();
}

/// Read one server frame: (opcode, payload).
fn read_frame(s: &mut std::net::TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l).unwrap();
            u16::from_be_bytes(l) as usize
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l).unwrap();
            u64::from_be_bytes(l) as usize
        }
        n => n as usize,
    };
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).unwrap();
    (h[0] & 0x0f, p)
}

/// The terminal's keystroke-to-echo latency through the whole path (WebSocket, the
/// server, the master, the line discipline's echo, back): docs/BENCHMARKS.md. Prints
/// p50 and p95 over 200 keystrokes; fails only past a second (a broken path, not a
/// slow machine).
#[test]
fn keystroke_to_echo_latency() {
    let srv = Server::start();
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.set_nodelay(true).unwrap();
    let req = format!(
        "GET /v1/sandboxes/shell-e2e-lat/pty HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        srv.addr,
        srv.token()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"));
    // `cat`: the line discipline echoes each key (canonical mode), cat reads lines.
    send_frame(
        &mut s,
        1,
        br#"{"type":"start","command":{"argv":["cat"]},"rows":24,"cols":80}"#,
    );
    // The first key also waits for the container and the fence: not measured.
    send_frame(&mut s, 2, b"w");
    while read_frame(&mut s).1 != b"w" {}
    let mut took = Vec::new();
    for i in 0..200u32 {
        let key = [b'a' + (i % 26) as u8];
        let t0 = Instant::now();
        send_frame(&mut s, 2, &key);
        loop {
            let (op, p) = read_frame(&mut s);
            assert_eq!(op, 2, "an output frame");
            if p.contains(&key[0]) {
                break;
            }
        }
        took.push(t0.elapsed());
    }
    took.sort();
    let (p50, p95) = (took[took.len() / 2], took[took.len() * 95 / 100]);
    println!("keystroke to echo over 200 keys: p50 {p50:?}, p95 {p95:?}");
    assert!(p95 < Duration::from_secs(1), "p95 {p95:?}");
    // Ctrl-D twice (the line is not empty, then it is): cat ends, exit 0.
    send_frame(&mut s, 2, b"\x04\x04");
    loop {
        let (op, p) = read_frame(&mut s);
        if op == 1 {
            let text = String::from_utf8_lossy(&p);
            assert!(text.contains(r#""type":"exit""#), "{text}");
            assert!(text.contains(r#""exit_code":0"#), "{text}");
            break;
        }
    }
    drop(s);
    srv.stop();
}

/// A raw session started with `argv` (JSON), the handshake read; the socket.
fn raw_start(srv: &Server, key: &str, argv: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let req = format!(
        "GET /v1/sandboxes/{key}/pty HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        srv.addr,
        srv.token()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"));
    let start = format!(r#"{{"type":"start","command":{{"argv":{argv}}},"rows":24,"cols":80}}"#);
    send_frame(&mut s, 1, start.as_bytes());
    s
}

/// What the container runs now, one command line each.
fn container_ps(srv: &Server, key: &str) -> String {
    let o = srv.cli(&["exec", key, "--", "ps", "-e", "-o", "args="]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The fence's canonical log line of `key`'s run that ended with `exit`, as the front
/// writes it: `key=K … exit=N` (Rust) or JSON fields (the edge's Worker).
fn fence_line(key: &str, exit: i32) -> [String; 2] {
    match crate::front() {
        crate::Front::Edge => [format!("\"key\":\"{key}\""), format!("\"exit\":\"{exit}\"")],
        _ => [format!("key={key}"), format!("exit={exit}")],
    }
}

#[test]
fn closing_the_socket_ends_the_session_and_its_tree() {
    let srv = Server::start();
    // A client that goes away: the run is abandoned, the teardown kills it.
    let s = raw_start(&srv, "shell-e2e-c", r#"["sleep","1000"]"#);
    srv.wait_log(&["a terminal session starts"], T);
    drop(s);
    srv.wait_log(&["a terminal session closed", "the client went away"], T);
    let [k, e] = fence_line("shell-e2e-c", -9);
    srv.wait_log(&["CANONICAL-FENCE", &k, &e], T);
    assert!(!container_ps(&srv, "shell-e2e-c").contains("sleep 1000"));
    srv.stop();
}

#[test]
fn a_client_that_never_reads_is_dropped_and_its_tree_killed() {
    let srv = Server::start();
    // A client that never reads while `yes` writes: dropped after SEND_WITHIN (30 s),
    // its tree killed.
    let s = raw_start(&srv, "shell-e2e-r", r#"["yes","stockade"]"#);
    srv.wait_log(
        &["a terminal session closed", "the client stopped reading"],
        Duration::from_secs(90),
    );
    drop(s);
    assert!(!container_ps(&srv, "shell-e2e-r").contains("yes stockade"));
    srv.stop();
}
