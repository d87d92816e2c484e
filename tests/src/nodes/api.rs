//! The front's side as a test drives it: a plain HTTP upstream that reports what it
//! hears, and a streamed exec read one NDJSON event at a time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A plain HTTP upstream on `ip` (port chosen by the kernel) answering `ok`; the path
/// of every request it sees is sent on the channel (a test waits on it as an event).
/// It runs until the test process exits (an accept loop on a thread).
pub fn http_upstream(ip: Ipv4Addr) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let l = TcpListener::bind((ip, 0)).expect("bind the upstream");
    let addr = l.local_addr().expect("its address");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            if tx.send(path).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

/// A streamed exec through a front's public API (`POST …/exec/stream`), read one
/// NDJSON event at a time.
pub struct ExecStream {
    /// The answer's status.
    pub status: u16,
    r: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl ExecStream {
    /// Send `body` for `key` and read the status line and headers.
    pub fn open(addr: &str, token: &str, key: &str, body: &serde_json::Value) -> ExecStream {
        let mut c = TcpStream::connect(addr).expect("connect to the front");
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let body = body.to_string();
        write!(
            c,
            "POST /v1/sandboxes/{key}/exec/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut r = BufReader::new(c);
        let mut line = String::new();
        r.read_line(&mut line).expect("a status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
        }
        ExecStream {
            status,
            r,
            pending: Vec::new(),
        }
    }

    /// The next event, or `None` at the end of the stream (or a read error).
    pub fn next_event(&mut self) -> Option<serde_json::Value> {
        loop {
            if let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                return serde_json::from_slice(&line).ok();
            }
            let mut size = String::new();
            if self.r.read_line(&mut size).ok()? == 0 {
                return None;
            }
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                return None;
            }
            let mut data = vec![0u8; n + 2];
            self.r.read_exact(&mut data).ok()?;
            data.truncate(n);
            self.pending.extend_from_slice(&data);
        }
    }

    /// Events until the last (`exit` or `error`), which is returned; output events are
    /// appended to `out`.
    pub fn outcome(&mut self, out: &mut String) -> Option<serde_json::Value> {
        loop {
            let e = self.next_event()?;
            match e["type"].as_str() {
                Some("stdout") | Some("stderr") => out.push_str(e["data"].as_str().unwrap_or("")),
                _ => return Some(e),
            }
        }
    }
}
