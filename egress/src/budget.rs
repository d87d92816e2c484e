//! What one container's egress proxy may spend of the server (docs/SECURITY.md, the red
//! team's h2 and TLS floods): descriptors and TLS work are the server's, not the
//! container's, so each container gets a budget of them and the API keeps a reserve no
//! container can reach.
//!
//! * **Descriptors.** Every client connection and every upstream socket the proxy
//!   holds takes a place in one server-wide pool, sized at first use as the soft
//!   `RLIMIT_NOFILE` (which `serve` raises to the hard limit) minus a reserve for the
//!   API, the store and the containers' own descriptors ([`reserved_descriptors`]).
//!   A container's client connections and upstream sockets count against one cap
//!   together ([`Limits::descriptors`]: 26 h2 connections once took the server from
//!   66 to 627 descriptors while upstream sockets were capped apart from the client
//!   connections). Its upstream sockets are also capped ([`Limits::upstreams`]), as are
//!   its concurrent h2 streams across all its connections ([`Limits::streams`]): one
//!   container's 250 connections × 64 streams once held 20 000 upstream sockets and
//!   stalled every other key. Past a cap a request is answered at once (a 502 whose
//!   `x-stockade-upstream-error` is `budget`, or a 503 for a stream), no socket is
//!   opened.
//! * **TLS work.** CONNECTs and TLS handshakes (with the command's client, and to the
//!   upstream) are rate-limited per container by token buckets, and at most
//!   [`Limits::handshakes`] handshakes of one container run at once, all in proportion
//!   to the container's CPU limit ([`Limits::for_cpus`]): 43 000 abandoned handshakes
//!   once cost the server 15.7 CPU-s (the container 6), and later 898 from a container
//!   limited to 1 CPU cost it 12.5 CPU-s in 12 s. Past the rate a CONNECT is answered
//!   429; one that finds no place among the handshakes in progress within
//!   [`HANDSHAKE_WAIT`] (a client's parallel CONNECTs wait their turn) 503: before
//!   anything is attributed, minted or connected.
//! * **Connections** are accepted at a rate in proportion to the CPU limit too: past
//!   it they wait in the kernel's backlog (accepting, parsing and refusing is the
//!   server's CPU; so is each attribution's reading of a TCP table every connection
//!   lengthens).
//!
//! * **Requests** are paced per container ([`Limits::requests_per_second`]): past the
//!   burst a request waits its turn; what the proxy does per request is CPU outside
//!   the container's limit.
//!
//! Refusals are counted and logged at most once a second per container (a flood must
//! not turn into log lines).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A container's budget (the defaults are [`Limits::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Descriptors the container's proxy holds at once: its client connections and
    /// its upstream sockets together. Past it a new connection waits in the
    /// kernel's backlog and a new upstream socket is refused (`502 budget`).
    pub descriptors: usize,
    /// Upstream sockets held at once (plain HTTP, intercepted, blind tunnels).
    pub upstreams: usize,
    /// Concurrent h2 streams across all of the container's intercepted connections.
    pub streams: usize,
    /// TLS handshakes in progress at once.
    pub handshakes: usize,
    /// CONNECTs: a burst, then a steady rate per second.
    pub connect_burst: f64,
    /// CONNECTs per second after the burst.
    pub connects_per_second: f64,
    /// TLS handshakes (both sides): a burst, then a steady rate per second.
    pub handshake_burst: f64,
    /// TLS handshakes per second after the burst.
    pub handshakes_per_second: f64,
    /// Client connections accepted: a burst, then a steady rate per second; past it
    /// a connection waits in the kernel's backlog (accepting, parsing and refusing a
    /// connection is the server's CPU, and so is each attribution's reading of a TCP
    /// table that every connection the container made lengthens).
    pub accept_burst: f64,
    /// Client connections accepted per second after the burst.
    pub accepts_per_second: f64,
    /// Requests (every one the proxy reads, h1 and h2): a burst, then a steady rate;
    /// past it a request waits for its turn (the client is paced, nothing refused).
    pub request_burst: f64,
    /// Requests per second after the burst.
    pub requests_per_second: f64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            descriptors: DESCRIPTORS,
            upstreams: UPSTREAMS,
            streams: STREAMS,
            handshakes: HANDSHAKES,
            connect_burst: 200.0,
            connects_per_second: 100.0,
            handshake_burst: 128.0,
            handshakes_per_second: 64.0,
            accept_burst: 2.0 * ACCEPT_BURST_PER_CPU,
            accepts_per_second: 2.0 * ACCEPTS_PER_CPU,
            request_burst: 2000.0,
            requests_per_second: 1000.0,
        }
    }
}

impl Limits {
    /// The limits of a container allowed `cpus` CPUs (0: no limit, the machine's
    /// `machine` CPUs), pure: its CONNECTs and TLS handshakes, their bursts and the
    /// handshakes it may have in progress grow with its CPU limit, so the work the
    /// server does on its behalf, outside that limit, is in proportion to it
    /// (docs/SECURITY.md: at most [`HANDSHAKES_PER_CPU`] handshakes a second for each
    /// of its CPUs). Descriptors, streams and requests keep their defaults.
    pub fn for_cpus(cpus: f64, machine: usize) -> Limits {
        let cpus = if cpus > 0.0 && cpus.is_finite() {
            cpus
        } else {
            machine.max(1) as f64
        };
        Limits {
            handshakes: ((HANDSHAKES_AT_ONCE_PER_CPU * cpus).ceil() as usize).max(1),
            handshake_burst: (HANDSHAKE_BURST_PER_CPU * cpus).max(1.0),
            handshakes_per_second: HANDSHAKES_PER_CPU * cpus,
            connect_burst: (CONNECT_BURST_PER_CPU * cpus).max(1.0),
            connects_per_second: CONNECTS_PER_CPU * cpus,
            accept_burst: (ACCEPT_BURST_PER_CPU * cpus).max(1.0),
            accepts_per_second: ACCEPTS_PER_CPU * cpus,
            ..Limits::default()
        }
    }
}

/// TLS handshakes a second (with the command's client and to the upstream) for each
/// CPU of the container's limit. One abandoned handshake through an intercepted
/// CONNECT cost the server 6.5 ms of CPU (the TLS itself ~0.1 ms; the rest the
/// attribution's reading of the container's TCP table, on a debug build): 32 a second
/// is ~0.2 CPU-s a second per CPU of the container's own.
pub const HANDSHAKES_PER_CPU: f64 = 32.0;
/// The handshake burst for each CPU of the container's limit.
pub const HANDSHAKE_BURST_PER_CPU: f64 = 64.0;
/// Handshakes in progress at once for each CPU of the container's limit (at least 1).
pub const HANDSHAKES_AT_ONCE_PER_CPU: f64 = 4.0;
/// CONNECTs a second for each CPU of the container's limit (each is attributed: the
/// reading of a TCP table, most of what a handshake costs).
pub const CONNECTS_PER_CPU: f64 = 50.0;
/// The CONNECT burst for each CPU of the container's limit.
pub const CONNECT_BURST_PER_CPU: f64 = 100.0;
/// How long a CONNECT to be intercepted waits for a place among the handshakes in
/// progress before it is refused (`503 handshakes`).
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);
/// Client connections accepted a second for each CPU of the container's limit.
pub const ACCEPTS_PER_CPU: f64 = 100.0;
/// The accept burst for each CPU of the container's limit.
pub const ACCEPT_BURST_PER_CPU: f64 = 200.0;
/// What the server may spend on one container's TLS work, as a share of the
/// container's own CPU limit: what [`HANDSHAKES_PER_CPU`] is chosen to stay within
/// (the attack test holds the server to it).
pub const TLS_SHARE: f64 = 0.5;

/// The default of [`Limits::descriptors`]: a kept upstream socket for each of the
/// [`crate::MAX_CONNECTIONS`] client connections.
pub const DESCRIPTORS: usize = 2 * crate::MAX_CONNECTIONS;

/// The default of [`Limits::upstreams`]: twice the client connections a container may
/// hold (a kept upstream per connection, and a new one while the old closes).
pub const UPSTREAMS: usize = 2 * crate::MAX_CONNECTIONS;
/// The default of [`Limits::streams`].
pub const STREAMS: usize = 256;
/// The default of [`Limits::handshakes`].
pub const HANDSHAKES: usize = 8;

/// Descriptors the proxies never take: the API's connections, the store, each
/// container's own (pidfd, directories, supervisor socket). At least 1024, or an
/// eighth of the limit.
pub fn reserved_descriptors(limit: u64) -> u64 {
    (limit / 8).max(1024)
}

/// The places in the server-wide pool of proxy descriptors (pure): the limit minus the
/// reserve, never fewer than 64 (a machine with a tiny limit still serves a little).
pub fn pool_size(limit: u64) -> usize {
    limit.saturating_sub(reserved_descriptors(limit)).max(64) as usize
}

/// The server-wide pool, sized at first use from the soft descriptor limit.
fn pool() -> &'static Arc<Semaphore> {
    static POOL: OnceLock<Arc<Semaphore>> = OnceLock::new();
    POOL.get_or_init(|| {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let limit = l.current.unwrap_or(1 << 20);
        let size = pool_size(limit);
        tracing::info!(target: "stockade::egress", limit, pool = size, reserved = reserved_descriptors(limit), "egress descriptor pool");
        Arc::new(Semaphore::new(size))
    })
}

/// What a refusal was about (the `x-stockade-limit` header and the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Too many upstream sockets (the container's, or the server's pool).
    Upstreams,
    /// Too many concurrent h2 streams.
    Streams,
    /// CONNECTs over the rate.
    ConnectRate,
    /// TLS handshakes over the rate.
    HandshakeRate,
    /// Too many TLS handshakes in progress at once.
    Handshakes,
}

impl Limit {
    /// The name the answer's `x-stockade-limit` header and the log lines carry.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Upstreams => "upstreams",
            Limit::Streams => "streams",
            Limit::ConnectRate => "connect-rate",
            Limit::HandshakeRate => "handshake-rate",
            Limit::Handshakes => "handshakes",
        }
    }
}

/// A token bucket.
struct Bucket {
    burst: f64,
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(burst: f64, rate: f64) -> Bucket {
        Bucket {
            burst,
            rate,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Take a token, going into debt if there is none: how long until the debt is
    /// paid (zero when a token was there). A rate of 0 never pays: a second's wait.
    fn reserve(&mut self, now: Instant) -> Duration {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst) - 1.0;
        self.at = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else if self.rate > 0.0 {
            Duration::from_secs_f64(-self.tokens / self.rate)
        } else {
            Duration::from_secs(1)
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One container's budget.
pub struct Budget {
    limits: Limits,
    descriptors: Arc<Semaphore>,
    upstreams: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    connect_rate: Mutex<Bucket>,
    handshake_rate: Mutex<Bucket>,
    request_rate: Mutex<Bucket>,
    accept_rate: Mutex<Bucket>,
    /// The server-wide descriptor pool (a test may give a budget its own).
    pool: Arc<Semaphore>,
    /// Refusals since the last line logged, and when that was.
    refused: AtomicU64,
    logged: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limits", &self.limits)
            .finish()
    }
}

/// A place in the descriptor pool and under the container's descriptor cap (and, for
/// an upstream socket, its upstream cap): held as long as the descriptor is.
#[derive(Debug)]
pub struct Place {
    _pool: OwnedSemaphorePermit,
    _own: OwnedSemaphorePermit,
    _cap: Option<OwnedSemaphorePermit>,
}

impl Budget {
    /// A budget drawing on the server-wide descriptor pool.
    pub fn new(limits: Limits) -> Budget {
        Budget::with_pool(limits, pool().clone())
    }

    /// A budget drawing on `pool` (tests).
    pub fn with_pool(limits: Limits, pool: Arc<Semaphore>) -> Budget {
        Budget {
            limits,
            descriptors: Arc::new(Semaphore::new(limits.descriptors.max(2))),
            upstreams: Arc::new(Semaphore::new(limits.upstreams.max(1))),
            streams: Arc::new(Semaphore::new(limits.streams.max(1))),
            handshakes: Arc::new(Semaphore::new(limits.handshakes.max(1))),
            connect_rate: Mutex::new(Bucket::new(
                limits.connect_burst.max(1.0),
                limits.connects_per_second,
            )),
            handshake_rate: Mutex::new(Bucket::new(
                limits.handshake_burst.max(1.0),
                limits.handshakes_per_second,
            )),
            request_rate: Mutex::new(Bucket::new(
                limits.request_burst.max(1.0),
                limits.requests_per_second,
            )),
            accept_rate: Mutex::new(Bucket::new(
                limits.accept_burst.max(1.0),
                limits.accepts_per_second,
            )),
            pool,
            refused: AtomicU64::new(0),
            logged: Mutex::new(None),
        }
    }

    /// The limits this budget was made with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A place for a client connection about to be accepted: waits while the
    /// container's descriptors or the server-wide pool are spent (the connection
    /// waits in the kernel's backlog).
    pub async fn client(&self) -> Option<Place> {
        let own = self.descriptors.clone().acquire_owned().await.ok()?;
        let pool = self.pool.clone().acquire_owned().await.ok()?;
        Some(Place {
            _pool: pool,
            _own: own,
            _cap: None,
        })
    }

    /// A place for a new upstream socket, or the limit that refuses it (at once):
    /// it counts among the container's descriptors with its client connections.
    pub fn upstream(&self) -> Result<Place, Limit> {
        let own = self.descriptors.clone().try_acquire_owned();
        let cap = self.upstreams.clone().try_acquire_owned();
        let pool = self.pool.clone().try_acquire_owned();
        match (own, cap, pool) {
            (Ok(own), Ok(cap), Ok(pool)) => Ok(Place {
                _pool: pool,
                _own: own,
                _cap: Some(cap),
            }),
            _ => Err(self.refuse(Limit::Upstreams)),
        }
    }

    /// A place for one more concurrent h2 stream.
    pub fn stream(&self) -> Result<OwnedSemaphorePermit, Limit> {
        self.streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.refuse(Limit::Streams))
    }

    /// May one more CONNECT be served now?
    pub fn connect(&self) -> Result<(), Limit> {
        let ok = self
            .connect_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        if ok {
            Ok(())
        } else {
            Err(self.refuse(Limit::ConnectRate))
        }
    }

    /// May one more TLS handshake start now (the rate)?
    pub fn handshake_rate(&self) -> Result<(), Limit> {
        let ok = self
            .handshake_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        if ok {
            Ok(())
        } else {
            Err(self.refuse(Limit::HandshakeRate))
        }
    }

    /// Wait for this request's turn under the request rate (at once within the burst).
    pub async fn request(&self) {
        let wait = self
            .request_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Wait for the next client connection's turn under the accept rate (at once
    /// within the burst): meanwhile connections wait in the kernel's backlog, costing
    /// the server nothing.
    pub async fn accept(&self) {
        let wait = self
            .accept_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// A place among the handshakes running at once (waits for one): for the
    /// upstream's, which an admitted request asks for.
    pub async fn handshake(&self) -> Option<OwnedSemaphorePermit> {
        self.handshakes.clone().acquire_owned().await.ok()
    }

    /// A place among the handshakes running at once for the command's client, taken
    /// before the CONNECT is answered: a burst of a client's parallel CONNECTs waits
    /// its turn (waiting costs the server nothing), one still waiting after
    /// [`HANDSHAKE_WAIT`] is refused, and nothing is attributed, minted or shaken
    /// for it.
    pub async fn client_handshake(&self) -> Result<OwnedSemaphorePermit, Limit> {
        self.client_handshake_within(HANDSHAKE_WAIT).await
    }

    async fn client_handshake_within(&self, wait: Duration) -> Result<OwnedSemaphorePermit, Limit> {
        match tokio::time::timeout(wait, self.handshakes.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(self.refuse(Limit::Handshakes)),
        }
    }

    /// Count a refusal; log at most one line a second (with how many were refused).
    fn refuse(&self, limit: Limit) -> Limit {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1)) {
            *logged = Some(now);
            self.refused.store(0, Ordering::Relaxed);
            drop(logged);
            tracing::warn!(target: "stockade::egress", limit = limit.as_str(), refused, "egress budget spent: refused");
        }
        limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(upstreams: usize, streams: usize, pool: usize) -> Budget {
        Budget::with_pool(
            Limits {
                descriptors: 1000,
                upstreams,
                streams,
                handshakes: 2,
                connect_burst: 3.0,
                connects_per_second: 0.0,
                handshake_burst: 2.0,
                handshakes_per_second: 0.0,
                request_burst: 2.0,
                requests_per_second: 10.0,
                accept_burst: 2.0,
                accepts_per_second: 10.0,
            },
            Arc::new(Semaphore::new(pool)),
        )
    }

    #[test]
    fn the_reserve_is_never_given_to_proxies() {
        assert_eq!(reserved_descriptors(1024), 1024);
        assert_eq!(pool_size(1024), 64, "a tiny limit still serves a little");
        assert_eq!(pool_size(65_536), 65_536 - 8192);
        assert_eq!(pool_size(1 << 20), (1 << 20) - (1 << 17));
    }

    #[test]
    fn upstream_sockets_stop_at_the_containers_cap_and_come_back_when_closed() {
        let b = small(2, 1, 100);
        let one = b.upstream().unwrap();
        let _two = b.upstream().unwrap();
        assert_eq!(b.upstream().unwrap_err(), Limit::Upstreams);
        drop(one);
        assert!(b.upstream().is_ok());
    }

    #[test]
    fn the_server_pool_bounds_every_container_together() {
        let pool = Arc::new(Semaphore::new(3));
        let a = Budget::with_pool(Limits::default(), pool.clone());
        let b = Budget::with_pool(Limits::default(), pool.clone());
        let _x = (a.upstream().unwrap(), a.upstream().unwrap());
        let _y = b.upstream().unwrap();
        assert_eq!(b.upstream().unwrap_err(), Limit::Upstreams);
        assert_eq!(a.upstream().unwrap_err(), Limit::Upstreams);
    }

    #[test]
    fn streams_and_rates_are_bounded() {
        let b = small(2, 1, 100);
        let s = b.stream().unwrap();
        assert_eq!(b.stream().unwrap_err(), Limit::Streams);
        drop(s);
        assert!(b.stream().is_ok());
        for _ in 0..3 {
            b.connect().unwrap();
        }
        assert_eq!(b.connect().unwrap_err(), Limit::ConnectRate);
        b.handshake_rate().unwrap();
        b.handshake_rate().unwrap();
        assert_eq!(b.handshake_rate().unwrap_err(), Limit::HandshakeRate);
    }

    #[test]
    fn past_the_burst_a_request_waits_its_turn() {
        let t0 = Instant::now();
        let mut k = Bucket::new(2.0, 10.0);
        k.at = t0;
        assert_eq!(k.reserve(t0), Duration::ZERO);
        assert_eq!(k.reserve(t0), Duration::ZERO);
        let third = k.reserve(t0);
        let fourth = k.reserve(t0);
        assert!(
            (third.as_secs_f64() - 0.1).abs() < 1e-6,
            "one token's time: {third:?}"
        );
        assert!((fourth.as_secs_f64() - 0.2).abs() < 1e-6, "{fourth:?}");
    }

    /// Through a real proxy: past the container's upstream sockets a request is a
    /// `502 budget` with no socket opened (the upstream never sees more than the cap);
    /// past the CONNECT rate a CONNECT is a `429 connect-rate`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_proxy_opens_no_upstream_socket_past_the_budget_and_paces_connects() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        use crate::audit::Denial;
        use crate::rules::{Grant, RuleSpec};
        use crate::{DenialSink, Fence, ProxyOptions};

        struct Nothing;
        impl DenialSink for Nothing {
            fn record(&self, _: &str, _: &str, _: Denial) {}
        }
        // An upstream that accepts and never answers: each forwarded request holds a
        // socket. It counts what it accepted.
        let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_port = up.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let upstream = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = up.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(s);
            }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fence = Fence::new("k", "c");
        fence.apply(
            "f",
            Grant::parse(&[RuleSpec::new("127.0.0.1", &[], None)]).unwrap(),
        );
        let limits = Limits {
            upstreams: 3,
            connect_burst: 2.0,
            connects_per_second: 0.0,
            ..Limits::default()
        };
        let task = crate::serve_with(
            listener,
            fence,
            ProxyOptions {
                allow_private_targets: true,
                max_connections: 64,
            },
            Arc::new(Nothing),
            None,
            None,
            Budget::with_pool(limits, Arc::new(Semaphore::new(1000))),
        );
        // Three requests hold the three sockets (their answers never come).
        let mut held = Vec::new();
        for i in 0..3 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(
                format!("GET http://127.0.0.1:{up_port}/{i} HTTP/1.1\r\nHost: x\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
            held.push(c);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while accepted.load(Ordering::SeqCst) < 3 {
            assert!(Instant::now() < deadline, "the three requests reached it");
            tokio::task::yield_now().await;
        }
        // Answers the proxy writes itself end the exchange: read until the head's end.
        async fn ask(addr: std::net::SocketAddr, head: String) -> String {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(head.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
                    .await
                    .expect("an answer")
                    .unwrap();
                assert!(n > 0, "closed without an answer");
                got.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&got).to_ascii_lowercase()
        }
        for i in 3..6 {
            let a = ask(
                addr,
                format!("GET http://127.0.0.1:{up_port}/{i} HTTP/1.1\r\nHost: x\r\n\r\n"),
            )
            .await;
            assert!(
                a.starts_with("http/1.1 502") && a.contains("x-stockade-upstream-error: budget"),
                "{a}"
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "no socket past the cap");
        // CONNECTs: two (the burst; each needs a socket too, so the budget answers),
        // then the rate.
        for _ in 0..2 {
            let a = ask(
                addr,
                format!("CONNECT 127.0.0.1:{up_port} HTTP/1.1\r\n\r\n"),
            )
            .await;
            assert!(!a.starts_with("http/1.1 429"), "{a}");
        }
        let a = ask(
            addr,
            format!("CONNECT 127.0.0.1:{up_port} HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(
            a.starts_with("http/1.1 429") && a.contains("x-stockade-limit: connect-rate"),
            "{a}"
        );
        task.abort();
        upstream.abort();
    }

    #[test]
    fn the_tls_budget_scales_with_the_containers_cpu_limit() {
        // (sentence, cpus, machine, handshakes/s, burst, at once, connects/s, accepts/s)
        type Row = (&'static str, f64, usize, f64, f64, usize, f64, f64);
        let rows: &[Row] = &[
            (
                "two CPUs are the defaults",
                2.0,
                8,
                64.0,
                128.0,
                8,
                100.0,
                200.0,
            ),
            (
                "half a CPU, a quarter of them",
                0.5,
                8,
                16.0,
                32.0,
                2,
                25.0,
                50.0,
            ),
            ("one CPU", 1.0, 8, 32.0, 64.0, 4, 50.0, 100.0),
            (
                "no limit: the machine's CPUs",
                0.0,
                4,
                128.0,
                256.0,
                16,
                200.0,
                400.0,
            ),
            (
                "a nonsense limit: the machine's",
                f64::NAN,
                1,
                32.0,
                64.0,
                4,
                50.0,
                100.0,
            ),
            (
                "a tiny limit keeps one of each",
                0.01,
                8,
                0.32,
                1.0,
                1,
                0.5,
                1.0,
            ),
        ];
        for &(sentence, cpus, machine, rate, burst, at_once, connects, accepts) in rows {
            let l = Limits::for_cpus(cpus, machine);
            assert!(
                (l.handshakes_per_second - rate).abs() < 1e-9,
                "{sentence}: {l:?}"
            );
            assert!(
                (l.handshake_burst - burst).abs() < 1e-9,
                "{sentence}: {l:?}"
            );
            assert_eq!(l.handshakes, at_once, "{sentence}");
            assert!(
                (l.connects_per_second - connects).abs() < 1e-9,
                "{sentence}"
            );
            assert!((l.accepts_per_second - accepts).abs() < 1e-9, "{sentence}");
            assert_eq!(l.descriptors, DESCRIPTORS, "{sentence}: not scaled");
        }
        assert_eq!(Limits::for_cpus(2.0, 2), Limits::default());
        // What the rate is chosen for: a second of handshakes at the measured cost is
        // within the share of the container's CPU.
        let cost = 0.0065;
        assert!(HANDSHAKES_PER_CPU * cost <= TLS_SHARE);
    }

    #[test]
    fn client_connections_and_upstream_sockets_share_the_containers_descriptors() {
        let b = Budget::with_pool(
            Limits {
                descriptors: 3,
                ..Limits::default()
            },
            Arc::new(Semaphore::new(100)),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (one, _two) = rt.block_on(async { (b.client().await, b.client().await) });
        let up = b.upstream().unwrap();
        assert_eq!(
            b.upstream().unwrap_err(),
            Limit::Upstreams,
            "the cap is spent"
        );
        drop(one);
        let _again = b
            .upstream()
            .expect("a closed connection gives its place back");
        drop(up);
        let waits = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(10), b.client())
                .await
                .is_ok()
        });
        assert!(waits, "a place came back for a client connection");
    }

    #[tokio::test]
    async fn a_handshake_past_the_cap_waits_its_turn_then_is_refused() {
        let b = small(2, 1, 100);
        let wait = Duration::from_millis(20);
        let a = b.client_handshake_within(wait).await.unwrap();
        let _b = b.client_handshake_within(wait).await.unwrap();
        assert_eq!(
            b.client_handshake_within(wait).await.unwrap_err(),
            Limit::Handshakes
        );
        let (third, ()) = tokio::join!(b.client_handshake_within(Duration::from_secs(10)), async {
            drop(a)
        });
        assert!(
            third.is_ok(),
            "a place given back is taken by the one waiting"
        );
    }

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut k = Bucket::new(2.0, 10.0);
        k.at = t0;
        assert!(k.take(t0) && k.take(t0) && !k.take(t0));
        assert!(!k.take(t0 + Duration::from_millis(50)));
        assert!(k.take(t0 + Duration::from_millis(160)));
    }
}
