//! Per-request latency on loopback: direct, through the Stockade egress proxy, and
//! through tinyproxy (when installed) in the same run. A plain `main` (harness = false)
//! printing one table; `cargo bench -p stockade-egress --bench proxy`.
//!
//! The goal it checks: a keep-alive request through the proxy costs at most 1.5× a
//! direct one, and less than through tinyproxy.
//!
//! Then HTTPS (docs/EGRESS.md, "HTTPS: interception"), against a rustls upstream with its
//! own CA: keep-alive requests intercepted (TLS terminated with the container CA's leaf,
//! re-encrypted upstream) and through a blind tunnel, against direct; and a new
//! connection to a host whose leaf is cached against one to a new host (the leaf minted
//! on the way).
//!
//! `STOCKADE_BENCH_ONLY=plain` (or `https`) runs only the proxy's per-request measure of
//! that kind (keep-alive GETs, the proxy threads' CPU and context switches): a profile's
//! run (`valgrind --tool=callgrind --separate-threads=yes`, `perf record`) then holds
//! nothing else. docs/BENCHMARKS.md says how the proxy's profiles were taken.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use stockade_egress::audit::Denial;
use stockade_egress::budget::{Budget, Limits};
use stockade_egress::rules::{Grant, RuleSpec};
use stockade_egress::tls::{self, Authority};
use stockade_egress::{DenialSink, Fence, Interception, ProxyOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WARMUP: usize = 300;
const REQUESTS: usize = 3000;
const ROUNDS: usize = 5;

/// `n` scaled by `STOCKADE_BENCH_SCALE` (as the suite is; 0.2 for a quick look, or a
/// profile under callgrind), at least one per round.
/// `STOCKADE_BENCH_ONLY`: `Some("plain")` or `Some("https")` runs that per-request
/// measure alone.
fn only() -> Option<String> {
    std::env::var("STOCKADE_BENCH_ONLY")
        .ok()
        .filter(|s| !s.is_empty())
}

fn scaled(n: usize) -> usize {
    let scale = std::env::var("STOCKADE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0);
    ((n as f64 * scale) as usize).max(ROUNDS)
}

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

/// A CONNECT tunnel to `target` through the proxy at `proxy`, answered 200.
async fn tunnel_through(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
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
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

async fn connect(via: Via, upstream: SocketAddr) -> Sender {
    let stream = match via {
        Via::Direct => TcpStream::connect(upstream).await.unwrap(),
        Via::Proxy(p) => TcpStream::connect(p).await.unwrap(),
        Via::Tunnel(p) => tunnel_through(p, &upstream.to_string()).await,
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
        .thread_name("bench-far")
        .enable_all()
        .build()
        .unwrap();
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-proxy")
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
        Grant::parse(&[RuleSpec::new("127.0.0.1", &[], None)]).unwrap(),
    );
    let _proxy = {
        let _guard = host.enter();
        serve_unpaced(
            listener,
            fence.clone(),
            ProxyOptions {
                allow_private_targets: true,
                max_connections: stockade_egress::MAX_CONNECTIONS,
            },
            Arc::new(NoSink),
            None,
        )
    };

    let only = only();
    if let Some(which) = only.as_deref()
        && !["plain", "https"].contains(&which)
    {
        panic!("STOCKADE_BENCH_ONLY is `plain` or `https`, not {which:?}");
    }
    if only.as_deref() == Some("plain") {
        client.block_on(plain_alone(stockade, upstream));
        assert_eq!(fence.revoke(), 0, "no request was denied");
        return;
    }
    if only.as_deref() == Some("https") {
        https_section(&far, &host, &client);
        return;
    }
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
            r.run(scaled(WARMUP), false, upstream).await;
        }
        // Rounds interleave the rows so a noisy neighbour hurts them all alike.
        for _ in 0..ROUNDS {
            for r in &mut runners {
                r.run(scaled(REQUESTS) / ROUNDS, true, upstream).await;
            }
        }

        println!(
            "egress proxy latency on loopback: {} sequential GETs per row \
             ({ROUNDS} interleaved rounds, after {} warm-up)",
            scaled(REQUESTS),
            scaled(WARMUP)
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
        plain_alone(stockade, upstream).await;
    });
    assert_eq!(fence.revoke(), 0, "no request was denied");
    https_section(&far, &host, &client);
}

/// The proxy's own work per keep-alive request, alone: CPU time and context switches of
/// its threads (less noisy than latency on a busy machine).
async fn plain_alone(stockade: SocketAddr, upstream: SocketAddr) {
    let mut alone = Runner::new(
        Row {
            name: "stockade proxy",
            via: Via::Proxy(stockade),
            keep_alive: true,
        },
        upstream,
    );
    alone.run(scaled(WARMUP), false, upstream).await;
    let n = scaled(REQUESTS);
    let before = proxy_threads();
    alone.run(n, false, upstream).await;
    println!("{}", before.per_request(n, "plain keep-alive"));
}

/// CPU time and context switches of the proxy's threads (`bench-proxy`) so far, from
/// `/proc/self/task/*/schedstat` and `status`.
#[derive(Clone, Copy, Default)]
struct ThreadUse {
    cpu_ns: u64,
    switches: u64,
}

fn proxy_threads() -> ThreadUse {
    let mut total = ThreadUse::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return total;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "bench-proxy" {
            continue;
        }
        let sched = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        total.cpu_ns += sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        total.switches += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

impl ThreadUse {
    /// The proxy threads' use since `self`, per request of `n`.
    fn per_request(self, n: usize, what: &str) -> String {
        let now = proxy_threads();
        format!(
            "proxy threads per {what} request (alone, {n} requests): {:.1} µs CPU, {:.2} context switches",
            now.cpu_ns.saturating_sub(self.cpu_ns) as f64 / n as f64 / 1e3,
            now.switches.saturating_sub(self.switches) as f64 / n as f64
        )
    }
}

/// How many fresh hosts the minting rows use (loopback addresses 127.0.0.2…).
const FRESH_HOSTS: usize = 100;
const HTTPS_REQUESTS: usize = 2000;
/// The slow upstream's answer time.
const SLOW_UPSTREAM: Duration = Duration::from_millis(1);

/// The HTTPS upstreams' PKI: a CA the proxy (and the direct client) trust, a leaf for
/// 127.0.0.1 and the fresh hosts.
fn https_pki() -> tls::LocalPki {
    let names: Vec<String> = std::iter::once("127.0.0.1".to_string())
        .chain((0..FRESH_HOSTS).map(fresh_host))
        .collect();
    tls::LocalPki::new(names).unwrap()
}

/// An HTTPS upstream answering after `delay` (zero: at once, the loopback's own
/// latency; a millisecond stands for a registry across a LAN).
fn https_upstream(
    far: &tokio::runtime::Runtime,
    pki: &tls::LocalPki,
    delay: Duration,
) -> SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
    // On every loopback address: the fresh hosts are 127.0.0.k.
    let listener = far
        .block_on(tokio::net::TcpListener::bind("0.0.0.0:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    far.spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(t) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |_req: Request<hyper::body::Incoming>| async move {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"{\"ok\":true,\"payload\":\"a small JSON answer like a registry index\"}",
                    ))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(t), svc)
                    .await;
            });
        }
    });
    ([127, 0, 0, 1], port).into()
}

fn fresh_host(i: usize) -> String {
    format!("127.0.0.{}", i + 2)
}

/// A TLS client connection to `host:port`, direct or through a CONNECT to `proxy`.
async fn https_connect(
    proxy: Option<SocketAddr>,
    host: &str,
    port: u16,
    client: &Arc<rustls::ClientConfig>,
) -> Sender {
    let target = format!("{host}:{port}");
    let s = match proxy {
        Some(p) => tunnel_through(p, &target).await,
        None => TcpStream::connect(&target).await.unwrap(),
    };
    s.set_nodelay(true).unwrap();
    let name = rustls_pki_types::ServerName::try_from(host.to_string()).unwrap();
    let t = tokio_rustls::TlsConnector::from(client.clone())
        .connect(name, s)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(t))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

async fn https_get(s: &mut Sender, host: &str) {
    s.ready().await.unwrap();
    let resp = s
        .send_request(
            Request::get("/index.json")
                .header(hyper::header::HOST, host)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let _ = resp.into_body().collect().await.unwrap();
}

/// The production proxy with its per-container rates lifted (the budgets of `budget.rs`
/// pace requests at 1000/s, TLS handshakes at 64/s and accepted connections at 200/s per
/// container, with 2 CPUs): the rows measure
/// what the proxy does per request, not the pacing. The caps on sockets and streams stay.
fn serve_unpaced(
    listener: std::net::TcpListener,
    fence: Fence,
    opts: ProxyOptions,
    sink: Arc<dyn DenialSink>,
    tls: Option<Interception>,
) -> tokio::task::JoinHandle<()> {
    let unpaced = Limits {
        connect_burst: 1e9,
        connects_per_second: 1e9,
        handshake_burst: 1e9,
        handshakes_per_second: 1e9,
        request_burst: 1e9,
        requests_per_second: 1e9,
        accept_burst: 1e9,
        accepts_per_second: 1e9,
        ..Limits::default()
    };
    stockade_egress::serve_with(listener, fence, opts, sink, tls, None, Budget::new(unpaced))
}

fn summarize(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let n = samples.len();
    Stats {
        mean: samples.iter().sum::<Duration>() / n as u32,
        p50: samples[n / 2],
        p99: samples[n * 99 / 100],
        connections: 0,
    }
}

fn https_section(
    far: &tokio::runtime::Runtime,
    host: &tokio::runtime::Runtime,
    client_rt: &tokio::runtime::Runtime,
) {
    let pki = https_pki();
    let upstream_ca = pki.ca.clone();
    let up = https_upstream(far, &pki, Duration::ZERO);
    let slow = https_upstream(far, &pki, SLOW_UPSTREAM);
    // Two proxies: one whose rule names a method (intercepted), one whose rule names
    // the host only (a blind tunnel to the same upstream).
    let authority = Arc::new(Authority::generate("bench").unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stockade = listener.local_addr().unwrap();
    let fence = Fence::new("bench-https", "bench-https");
    let mut rules = vec![RuleSpec::new(
        &format!("127.0.0.1:{}", up.port()),
        &["GET"],
        None,
    )];
    rules.extend((0..FRESH_HOSTS).map(|i| RuleSpec::new(&fresh_host(i), &["GET"], None)));
    rules.push(RuleSpec::new(
        &format!("127.0.0.1:{}", slow.port()),
        &["GET"],
        None,
    ));
    fence.apply("bench-https", Grant::parse(&rules).unwrap());
    let blind_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let blind = blind_listener.local_addr().unwrap();
    let blind_fence = Fence::new("bench-blind", "bench-blind");
    blind_fence.apply(
        "bench-blind",
        Grant::parse(&[RuleSpec::new("127.0.0.1", &[], None)]).unwrap(),
    );
    let opts = ProxyOptions {
        allow_private_targets: true,
        max_connections: stockade_egress::MAX_CONNECTIONS,
    };
    let tls_opts = Interception {
        authority: authority.clone(),
        upstream: tls::upstream_config_with(false, vec![upstream_ca.clone()]).unwrap(),
        attribution: None,
    };
    let (_p1, _p2) = {
        let _guard = host.enter();
        (
            serve_unpaced(
                listener,
                fence.clone(),
                opts,
                Arc::new(NoSink),
                Some(tls_opts.clone()),
            ),
            serve_unpaced(
                blind_listener,
                blind_fence.clone(),
                opts,
                Arc::new(NoSink),
                Some(tls_opts),
            ),
        )
    };
    use rustls_pki_types::pem::PemObject;
    let container_ca =
        rustls_pki_types::CertificateDer::from_pem_slice(authority.cert_pem().as_bytes()).unwrap();
    let trusts_upstream = tls::upstream_config_with(false, vec![upstream_ca]).unwrap();
    let trusts_container = tls::upstream_config_with(false, vec![container_ca]).unwrap();
    let h = "127.0.0.1";
    let port = up.port();
    let only = only().is_some();
    client_rt.block_on(async {
        let mut intercepted = https_connect(Some(stockade), h, port, &trusts_container).await;
        if only {
            for _ in 0..scaled(WARMUP) {
                https_get(&mut intercepted, h).await;
            }
            let n = scaled(HTTPS_REQUESTS);
            let before = proxy_threads();
            for _ in 0..n {
                https_get(&mut intercepted, h).await;
            }
            println!("{}", before.per_request(n, "https intercepted keep-alive"));
            return;
        }
        // Keep-alive rows: one connection each, requests interleaved in rounds.
        let mut direct = https_connect(None, h, port, &trusts_upstream).await;
        let mut tunnel = https_connect(Some(blind), h, port, &trusts_upstream).await;
        let mut slow_direct = https_connect(None, h, slow.port(), &trusts_upstream).await;
        let mut slow_intercepted =
            https_connect(Some(stockade), h, slow.port(), &trusts_container).await;
        let mut samples: [Vec<Duration>; 5] = Default::default();
        for _ in 0..scaled(WARMUP) {
            https_get(&mut direct, h).await;
            https_get(&mut intercepted, h).await;
            https_get(&mut tunnel, h).await;
        }
        for _ in 0..ROUNDS {
            let conns = [
                &mut direct,
                &mut intercepted,
                &mut tunnel,
                &mut slow_direct,
                &mut slow_intercepted,
            ];
            for (i, s) in conns.into_iter().enumerate() {
                // The slow rows take a millisecond a request: fewer of them.
                let n = scaled(if i < 3 { HTTPS_REQUESTS } else { HTTPS_REQUESTS / 4 }) / ROUNDS;
                for _ in 0..n {
                    let t = Instant::now();
                    https_get(s, h).await;
                    samples[i].push(t.elapsed());
                }
            }
        }
        let n = scaled(HTTPS_REQUESTS);
        let before = proxy_threads();
        for _ in 0..n {
            https_get(&mut intercepted, h).await;
        }
        println!("{}", before.per_request(n, "https intercepted keep-alive"));
        // New connection per request: to a host whose leaf is cached, to a fresh host
        // (minted now), and direct.
        let mut fresh = Vec::new();
        let mut cached = Vec::new();
        let mut direct_new = Vec::new();
        for i in 0..FRESH_HOSTS {
            let t = Instant::now();
            let mut s = https_connect(Some(stockade), &fresh_host(i), port, &trusts_container).await;
            https_get(&mut s, &fresh_host(i)).await;
            fresh.push(t.elapsed());
            let t = Instant::now();
            let mut s = https_connect(Some(stockade), h, port, &trusts_container).await;
            https_get(&mut s, h).await;
            cached.push(t.elapsed());
            let t = Instant::now();
            let mut s = https_connect(None, h, port, &trusts_upstream).await;
            https_get(&mut s, h).await;
            direct_new.push(t.elapsed());
        }
        println!();
        println!(
            "HTTPS on loopback: {} sequential keep-alive GETs per row ({ROUNDS} interleaved rounds); \
             {FRESH_HOSTS} new connections per new-connection row, interleaved",
            scaled(HTTPS_REQUESTS)
        );
        println!(
            "{:<52} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "row", "mean µs", "p50 µs", "p99 µs", "mean/dir", "p50/dir"
        );
        let rows = [
            ("https direct, keep-alive, upstream after 1 ms", summarize(samples[3].clone())),
            ("https intercepted, keep-alive, upstream after 1 ms", summarize(samples[4].clone())),
            ("https direct, keep-alive", summarize(samples[0].clone())),
            ("https intercepted (method rule), keep-alive", summarize(samples[1].clone())),
            ("https blind tunnel (host-only rule), keep-alive", summarize(samples[2].clone())),
            ("https direct, new connection", summarize(direct_new)),
            ("https intercepted, new connection, leaf cached", summarize(cached)),
            (
                "https intercepted, new connection, new host (mint, no resumption)",
                summarize(fresh),
            ),
        ];
        for (i, (name, s)) in rows.iter().enumerate() {
            let base = match i {
                0 | 1 => rows[0].1,
                2..=4 => rows[2].1,
                _ => rows[5].1,
            };
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            println!(
                "{:<52} {:>9.1} {:>9.1} {:>9.1} {:>8.2}× {:>8.2}×",
                name,
                s.mean.as_secs_f64() * 1e6,
                s.p50.as_secs_f64() * 1e6,
                s.p99.as_secs_f64() * 1e6,
                ratio(s.mean, base.mean),
                ratio(s.p50, base.p50),
            );
        }
    });
    assert_eq!(fence.revoke(), 0, "no HTTPS request was denied");
    if only {
        return;
    }
    assert_eq!(blind_fence.revoke(), 0, "no tunnel was denied");

    // Minting alone: a leaf for a host the container has not reached (one signature and
    // a server configuration) against the cached lookup for one it has.
    let ca = Authority::generate("bench-mint").unwrap();
    let mut minted = Vec::new();
    let mut cached = Vec::new();
    for i in 0..1000 {
        let name = format!("host-{i}.example");
        let t = Instant::now();
        let (_, fresh) = ca.server_config(&name).unwrap();
        minted.push(t.elapsed());
        assert!(fresh);
        let t = Instant::now();
        let (_, fresh) = ca.server_config(&name).unwrap();
        cached.push(t.elapsed());
        assert!(!fresh);
    }
    let (m, c) = (summarize(minted), summarize(cached));
    println!(
        "leaf for a new host: {:.1} µs p50 ({:.1} mean); cached: {:.2} µs p50 (1000 hosts)",
        m.p50.as_secs_f64() * 1e6,
        m.mean.as_secs_f64() * 1e6,
        c.p50.as_secs_f64() * 1e6
    );
}
