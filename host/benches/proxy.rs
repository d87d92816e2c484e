//! Per-request latency on loopback: direct, through the Stockade egress proxy, and
//! through tinyproxy (when installed) in the same run. A plain `main` (harness = false)
//! printing one table; `cargo bench -p stockade-host --bench proxy`.
//!
//! The goal it checks: a keep-alive request through the proxy costs at most 1.5× a
//! direct one, and less than through tinyproxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use stockade_host::egress::proxy::{self, DenialSink, Fence, ProxyOptions};
use stockade_host::egress::rules::{Grant, RuleSpec};
use stockade_host::substrate::Denial;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WARMUP: usize = 300;
const REQUESTS: usize = 3000;
const ROUNDS: usize = 5;

struct NoSink;
impl DenialSink for NoSink {
    fn record(&self, _: &str, _: &str, d: Denial) {
        panic!("the bench was denied: {d:?}");
    }
}

/// How a row reaches the upstream.
#[derive(Clone, Copy)]
enum Via {
    Direct,
    /// Absolute-form requests to this forward proxy.
    Proxy(SocketAddr),
    /// One CONNECT tunnel through this proxy, origin-form requests inside it.
    Tunnel(SocketAddr),
}

struct Row {
    name: &'static str,
    via: Via,
    keep_alive: bool,
}

#[derive(Clone, Copy)]
struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
    connections: usize,
}

/// The far server, on its own runtime (it stands for a registry on the network).
fn upstream(rt: &tokio::runtime::Runtime, accepted: Arc<AtomicUsize>) -> SocketAddr {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::Relaxed);
            let _ = s.set_nodelay(true);
            let svc = hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"{\"ok\":true,\"payload\":\"a small JSON answer like a registry index\"}",
                ))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(s), svc),
            );
        }
    });
    addr
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(via: Via, upstream: SocketAddr) -> Sender {
    let stream = match via {
        Via::Direct => TcpStream::connect(upstream).await.unwrap(),
        Via::Proxy(p) => TcpStream::connect(p).await.unwrap(),
        Via::Tunnel(p) => {
            let mut s = TcpStream::connect(p).await.unwrap();
            s.write_all(
                format!("CONNECT {upstream} HTTP/1.1\r\nHost: {upstream}\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                assert_eq!(
                    s.read(&mut b).await.unwrap(),
                    1,
                    "proxy closed during CONNECT"
                );
                head.push(b[0]);
            }
            assert!(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"));
            s
        }
    };
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// One row's client: its kept connection and its samples, across rounds.
struct Runner {
    row: Row,
    uri: String,
    sender: Option<Sender>,
    samples: Vec<Duration>,
    connections: usize,
}

impl Runner {
    fn new(row: Row, upstream: SocketAddr) -> Runner {
        let uri = match row.via {
            Via::Proxy(_) => format!("http://{upstream}/index.json"),
            Via::Direct | Via::Tunnel(_) => "/index.json".to_string(),
        };
        Runner {
            row,
            uri,
            sender: None,
            samples: Vec::with_capacity(REQUESTS),
            connections: 0,
        }
    }

    fn request(&self, upstream: SocketAddr) -> Request<Full<Bytes>> {
        Request::get(&self.uri)
            .header(hyper::header::HOST, upstream.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    async fn run(&mut self, n: usize, record: bool, upstream: SocketAddr) {
        for _ in 0..n {
            let start = Instant::now();
            let mut s = match self.sender.take() {
                Some(s) if self.row.keep_alive && !s.is_closed() => s,
                _ => {
                    self.connections += usize::from(record);
                    connect(self.row.via, upstream).await
                }
            };
            let resp = match s.ready().await {
                Ok(()) => s.send_request(self.request(upstream)).await,
                Err(e) => Err(e),
            };
            let resp = match resp {
                Ok(r) => r,
                // The server closed a kept connection under us: a new one, counted.
                Err(_) => {
                    self.connections += usize::from(record);
                    s = connect(self.row.via, upstream).await;
                    s.send_request(self.request(upstream)).await.unwrap()
                }
            };
            assert!(
                resp.status().is_success(),
                "{}: {}",
                self.row.name,
                resp.status()
            );
            let _ = resp.into_body().collect().await.unwrap();
            if record {
                self.samples.push(start.elapsed());
            }
            self.sender = Some(s);
        }
    }

    fn stats(&mut self) -> Stats {
        self.samples.sort();
        let n = self.samples.len();
        Stats {
            mean: self.samples.iter().sum::<Duration>() / n as u32,
            p50: self.samples[n / 2],
            p99: self.samples[n * 99 / 100],
            connections: self.connections,
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the tinyproxy this bench started when the bench ends.
struct Child(std::process::Child, std::path::PathBuf);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

async fn start_tinyproxy() -> Result<(SocketAddr, Child), String> {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("stockade-bench-tinyproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let conf = dir.join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 100\nLogLevel Critical\n\
             User nobody\nGroup nogroup\nDisableViaHeader Yes\nAllow 127.0.0.1\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let child = std::process::Command::new("tinyproxy")
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("tinyproxy not started ({e}); `apt-get install -y tinyproxy` adds the row")
        })?;
    let child = Child(child, dir);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            return Err("tinyproxy did not listen within 5 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((addr, child))
}

fn main() {
    // Three runtimes, as in production: the far server, the host that runs the proxy,
    // and the client (a process in the sandbox). Nothing but the proxy runs on the
    // host runtime.
    let far = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let upstream = upstream(&far, accepted.clone());

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stockade = listener.local_addr().unwrap();
    let fence = Fence::new("bench", "bench");
    fence.apply(
        "bench",
        Grant::parse(&[RuleSpec {
            host: "127.0.0.1".into(),
            methods: vec![],
            path_prefix: None,
        }])
        .unwrap(),
    );
    let _proxy = {
        let _guard = host.enter();
        proxy::serve(
            listener,
            fence.clone(),
            ProxyOptions {
                allow_private_targets: true,
                max_connections: stockade_host::egress::proxy::MAX_CONNECTIONS,
            },
            Arc::new(NoSink),
        )
    };

    client.block_on(async {
        let tinyproxy = start_tinyproxy().await;
        let mut rows = vec![
            Row {
                name: "direct",
                via: Via::Direct,
                keep_alive: true,
            },
            Row {
                name: "stockade proxy",
                via: Via::Proxy(stockade),
                keep_alive: true,
            },
            Row {
                name: "stockade CONNECT tunnel",
                via: Via::Tunnel(stockade),
                keep_alive: true,
            },
        ];
        if let Ok((addr, _)) = &tinyproxy {
            rows.push(Row {
                name: "tinyproxy",
                via: Via::Proxy(*addr),
                keep_alive: true,
            });
        }
        rows.push(Row {
            name: "direct, new connection each",
            via: Via::Direct,
            keep_alive: false,
        });
        rows.push(Row {
            name: "stockade, new connection each",
            via: Via::Proxy(stockade),
            keep_alive: false,
        });
        if let Ok((addr, _)) = &tinyproxy {
            rows.push(Row {
                name: "tinyproxy, new connection each",
                via: Via::Proxy(*addr),
                keep_alive: false,
            });
        }
        let mut runners: Vec<Runner> = rows.into_iter().map(|r| Runner::new(r, upstream)).collect();
        for r in &mut runners {
            r.run(WARMUP, false, upstream).await;
        }
        // Rounds interleave the rows so a noisy neighbour hurts them all alike.
        for _ in 0..ROUNDS {
            for r in &mut runners {
                r.run(REQUESTS / ROUNDS, true, upstream).await;
            }
        }

        println!(
            "egress proxy latency on loopback: {REQUESTS} sequential GETs per row \
             ({ROUNDS} interleaved rounds, after {WARMUP} warm-up)"
        );
        println!(
            "{:<32} {:>9} {:>9} {:>9} {:>8} {:>12} {:>9} {:>9}",
            "row", "mean µs", "p50 µs", "p99 µs", "req/s", "client conns", "mean/dir", "p50/dir"
        );
        // Each row is compared with the direct row of the same connection mode.
        let mut direct: [Option<Stats>; 2] = [None, None];
        for r in &mut runners {
            let s = r.stats();
            let base = *direct[usize::from(!r.row.keep_alive)].get_or_insert(s);
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            println!(
                "{:<32} {:>9.1} {:>9.1} {:>9.1} {:>8.0} {:>12} {:>8.2}× {:>8.2}×",
                r.row.name,
                s.mean.as_secs_f64() * 1e6,
                s.p50.as_secs_f64() * 1e6,
                s.p99.as_secs_f64() * 1e6,
                1.0 / s.mean.as_secs_f64(),
                s.connections,
                ratio(s.mean, base.mean),
                ratio(s.p50, base.p50),
            );
        }
        println!(
            "upstream connections accepted in all: {}",
            accepted.load(Ordering::Relaxed)
        );
        if let Err(why) = &tinyproxy {
            println!("tinyproxy rows skipped: {why}");
        }
    });
    assert_eq!(fence.revoke(), 0, "no request was denied");
}
