//! Nodes on their own hosts (issue 23): a harness that starts `stockade node`
//! processes, each in a network namespace of its own reached over a veth pair (its own
//! "host" on a private /30), and a front (`stockade serve` with `substrate.kind =
//! "remote"`) in the root namespace that drives them over HTTPS.
//!
//! Why a namespace per node: a node's listener, its egress proxy and the front's call
//! backs then cross a real link that a test can cut (`ip link set … down`), and the
//! node's address is not the front's, as on separate machines.
//!
//! The namespace is held by a process of the harness ([`Link`]), not named with `ip
//! netns add` (a bind mount under `/run/netns` would change the host's mount table,
//! which other tests running at the same time check). A node is started with `nsenter
//! --net=/proc/<holder>/ns/net`, not `ip netns exec`: that also unshares the mount
//! namespace and mounts a fresh sysfs on `/sys`, which hides `/sys/fs/cgroup` from the
//! node (it could not make a container); `nsenter --net` changes the network namespace
//! only.
//!
//! Everything a [`Cluster`] makes is its own and named after its short id (`sk<id>h1`
//! veths, `stockade-node-<id>-n1` cgroup roots, its temp directory; `stk-<id>-n1` names
//! a namespace in logs): dropping it kills only its own processes (by pid), removes its
//! cgroups (under every `/sys/fs/cgroup/*` mount), unmounts what its nodes left mounted
//! under its directories, ends its namespaces and deletes its veths, and then checks
//! that nothing of that is left. A test waits on events with deadlines (a file appearing, a listener accepting),
//! never on a sleep.
//!
//! [`NodeClient`] signs node calls (`stockade_host::node::auth`) and pins the node's
//! certificate, so a test can ask a node directly, e.g. for its `open-grants`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::Signal;
use stockade_host::config::{Config, RemoteNode};
use stockade_host::node::auth;

use crate::{TempDir, kill, stockade_exe};

/// The port every node listens on (its own address, so they never collide).
pub const NODE_PORT: u16 = 8788;

/// How long a node or a front may take to come up.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// The private range the harness takes its /30s from: 10.213.0.0/16 (16384 links).
const NET_BASE: u32 = u32::from_be_bytes([10, 213, 0, 0]);
const NET_LINKS: u32 = 1 << 14;

/// A log a child's stderr is copied into (and echoed to the test's stderr).
pub type Log = Arc<Mutex<Vec<String>>>;

/// `ip ARGS…`; an error names the command and what it printed.
fn ip(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            std::io::Error::other(format!(
                "ip {}: {e} (is iproute2 installed?)",
                args.join(" ")
            ))
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The IPv4 addresses on this (the root) network namespace's interfaces.
fn host_addresses() -> Vec<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.position(|t| t == "inet")?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

/// The /30 to use for the `n`th link of this process: derived from the pid and a
/// per-process counter (so parallel runs start apart), skipping any /30 whose addresses
/// the root namespace already has (another run's links). Pure but for `used`.
pub fn pick_subnet(pid: u32, n: u32, used: &[Ipv4Addr]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let start = pid.wrapping_mul(97).wrapping_add(n.wrapping_mul(13));
    (0..NET_LINKS).find_map(|k| {
        let idx = start.wrapping_add(k) % NET_LINKS;
        let net = NET_BASE + idx * 4;
        let (host, peer) = (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2));
        (!used.contains(&host) && !used.contains(&peer)).then_some((host, peer))
    })
}

/// One network namespace joined to the root namespace by a veth pair: the node's
/// "host". The root side keeps `host_ip`, the namespace side `ns_ip`, on a /30.
///
/// The namespace is held by a process of the harness (`unshare --net -- sleep
/// infinity`, with a parent-death signal), not named with `ip netns add`: that would
/// bind-mount it under `/run/netns` in the host's mount table, which other tests,
/// running at the same time, check is unchanged by what they did.
#[derive(Debug)]
pub struct Link {
    /// A name for logs (`stk-<id>-n<i>`).
    pub ns: String,
    /// The veth end in the root namespace.
    pub host_if: String,
    /// The veth end inside the namespace.
    pub ns_if: String,
    /// The root side's address.
    pub host_ip: Ipv4Addr,
    /// The namespace side's address (the node's).
    pub ns_ip: Ipv4Addr,
    holder: Option<Child>,
}

impl Link {
    /// Make the namespace `stk-<id>-n<i>` with a veth pair `sk<id>h<i>` / `sk<id>n<i>`
    /// (`id`: 8 characters of `[0-9a-f]`), both ends up, loopback up inside, a default
    /// route to the root side. A half-made link is removed before the error is returned.
    pub fn create(id: &str, i: usize) -> std::io::Result<Link> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let (host_ip, ns_ip) = pick_subnet(std::process::id(), n, &host_addresses())
            .ok_or_else(|| std::io::Error::other("no free /30 in 10.213.0.0/16"))?;
        // The holder dies with the thread that made it (a test that dies leaves no
        // namespace behind); until then it only sleeps.
        let holder = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "unshare", "--net", "--"])
            .args(["sleep", "infinity"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| std::io::Error::other(format!("unshare --net: {e}")))?;
        let mut link = Link {
            ns: format!("stk-{id}-n{i}"),
            host_if: format!("sk{id}h{i}"),
            ns_if: format!("sk{id}n{i}"),
            host_ip,
            ns_ip,
            holder: Some(holder),
        };
        assert!(link.host_if.len() <= 15, "an interface name fits IFNAMSIZ");
        // The holder is in its own namespace once unshare has run (the event: its
        // namespace link differs from ours).
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        let end = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(link.ns_path()).ok().as_ref() == Some(&ours) {
            if Instant::now() > end {
                let _ = link.remove();
                return Err(std::io::Error::other("unshare --net did not take effect"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = link.pid().to_string();
        let host_cidr = format!("{host_ip}/30");
        let ns_cidr = format!("{ns_ip}/30");
        let gateway = host_ip.to_string();
        let (host_if, ns_if) = (link.host_if.clone(), link.ns_if.clone());
        let steps: [(bool, &[&str]); 7] = [
            (
                false,
                &[
                    "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &pid,
                ],
            ),
            (false, &["addr", "add", &host_cidr, "dev", &host_if]),
            (false, &["link", "set", &host_if, "up"]),
            (true, &["addr", "add", &ns_cidr, "dev", &ns_if]),
            (true, &["link", "set", &ns_if, "up"]),
            (true, &["link", "set", "lo", "up"]),
            (true, &["route", "add", "default", "via", &gateway]),
        ];
        for (inside, args) in steps {
            let done = if inside {
                link.ip_inside(args)
            } else {
                ip(args)
            };
            if let Err(e) = done {
                let _ = link.remove();
                return Err(e);
            }
        }
        Ok(link)
    }

    fn pid(&self) -> u32 {
        self.holder.as_ref().map(Child::id).unwrap_or(0)
    }

    /// `ip ARGS…` inside the namespace.
    fn ip_inside(&self, args: &[&str]) -> std::io::Result<()> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns_path().display()))
            .args(["--", "ip"])
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "{}: ip {}: {}",
                self.ns,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// The namespace's file, for `nsenter --net=` or `setns`: the holder's.
    pub fn ns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }

    /// Cut the link: the root side goes down (the namespace side sees no carrier).
    pub fn down(&self) -> std::io::Result<()> {
        ip(&["link", "set", &self.host_if, "down"])
    }

    /// Mend it.
    pub fn up(&self) -> std::io::Result<()> {
        ip(&["link", "set", &self.host_if, "up"])
    }

    /// Kill the holder (the namespace goes once nothing else is in it: stop the node
    /// first) and delete the root side of the veth (which takes its peer with it), then
    /// check both are gone.
    pub fn remove(&mut self) -> std::io::Result<()> {
        let Some(mut holder) = self.holder.take() else {
            return Ok(());
        };
        let _ = kill(holder.id() as i32, Signal::KILL);
        let _ = holder.wait();
        if Path::new("/sys/class/net").join(&self.host_if).exists() {
            let _ = ip(&["link", "del", &self.host_if]);
        }
        if Path::new("/sys/class/net").join(&self.host_if).exists() {
            return Err(std::io::Error::other(format!(
                "left behind: veth {}",
                self.host_if
            )));
        }
        Ok(())
    }

    /// Run `f` on a thread inside the namespace (`setns` on that thread only) and
    /// return what it returns.
    pub fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        in_netns(&self.ns_path(), f)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Err(e) = self.remove()
            && !std::thread::panicking()
        {
            panic!("{e}");
        }
    }
}

/// Run `f` on a short-lived thread that first joins the network namespace at `ns`
/// (`/proc/<pid>/ns/net`); only that thread moves.
pub fn in_netns<T: Send + 'static>(
    ns: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let file = std::fs::File::open(ns)?;
    std::thread::Builder::new()
        .name("stockade-test-netns".into())
        .spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            f()
        })?
        .join()
        .map_err(|_| std::io::Error::other("the netns thread panicked"))?
}

/// Addresses of the test host's loopback (127.0.0.2, …) made reachable from inside a
/// node's namespace, for the suites whose upstreams listen there: a node's egress
/// proxy runs in the node's namespace, whose loopback is its own.
///
/// An nftables `redirect` inside the node's namespace (and only there: the table goes
/// with the namespace) sends every TCP connection to those addresses to a listener the
/// harness bound in that namespace; the harness accepts on a thread of the root
/// namespace, reads the original destination (`SO_ORIGINAL_DST`) and connects to it
/// from the root namespace, then copies bytes both ways. TLS passes through untouched.
pub struct Mirror {
    listener: TcpListener,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    /// Start mirroring `addrs` into `link`'s namespace.
    pub fn start(link: &Link, addrs: &[Ipv4Addr]) -> std::io::Result<Mirror> {
        let listener = link.inside(|| TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let list = addrs
            .iter()
            .map(Ipv4Addr::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let rules = format!(
            "table ip stockade_mirror {{ chain output {{ type nat hook output priority -100; policy accept; \
             ip daddr {{ {list} }} meta l4proto tcp redirect to :{port}; }}; }}\n"
        );
        let mut nft = Command::new("nsenter")
            .arg(format!("--net={}", link.ns_path().display()))
            .args(["--", "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| std::io::Error::other(format!("nft: {e} (is nftables installed?)")))?;
        nft.stdin
            .take()
            .expect("piped stdin")
            .write_all(rules.as_bytes())?;
        let out = nft.wait_with_output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "nft: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accepting = listener.try_clone()?;
        let kept = conns.clone();
        let thread = std::thread::Builder::new()
            .name("stockade-test-mirror".into())
            .spawn(move || {
                // Ends when the listener is shut down (accept fails).
                while let Ok((inside, _)) = accepting.accept() {
                    let Ok(dst) = rustix::net::sockopt::ip_original_dst(&inside) else {
                        continue;
                    };
                    let Ok(outside) =
                        TcpStream::connect_timeout(&SocketAddr::V4(dst), Duration::from_secs(5))
                    else {
                        continue;
                    };
                    relay(inside, outside, &kept);
                }
            })?;
        Ok(Mirror {
            listener,
            conns,
            thread: Some(thread),
        })
    }
}

/// Copy both ways between `a` and `b` on two threads; each direction's end is passed
/// on as a write shutdown. Both are kept in `conns` so the mirror can close them.
fn relay(a: TcpStream, b: TcpStream, conns: &Arc<Mutex<Vec<TcpStream>>>) {
    let pairs = (a.try_clone(), b.try_clone());
    let (Ok(a2), Ok(b2)) = pairs else {
        return;
    };
    {
        let mut kept = conns.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|s| s.peer_addr().is_ok());
        if let (Ok(a3), Ok(b3)) = (a.try_clone(), b.try_clone()) {
            kept.push(a3);
            kept.push(b3);
        }
    }
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    };
    copy(a, b2);
    copy(b, a2);
}

impl Drop for Mirror {
    /// Stop accepting and close every relayed connection: the node's namespace can
    /// only go once no socket of it is left.
    fn drop(&mut self) {
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for s in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Connect with a deadline per attempt.
fn connect(addr: SocketAddr, limit: Duration) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, limit)
}

/// A child's stderr copied, line by line, into a [`Log`] and the test's stderr with
/// `prefix`; the returned channel gets each line too (a test may wait on one).
fn keep_log(
    child: &mut Child,
    prefix: String,
    logs: Vec<Log>,
) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[{prefix}] {line}");
            for log in &logs {
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.clone());
            }
            let _ = tx.send(line);
        }
    });
    rx
}

/// SIGTERM, then SIGKILL if it has not exited within `grace`; reaped either way. The
/// process is the harness's own child (a pid, never a name).
fn terminate(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(child.id() as i32, Signal::TERM);
    let end = Instant::now() + grace;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > end {
            let _ = kill(child.id() as i32, Signal::KILL);
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `stockade node` on its own link.
pub struct Node {
    /// Its name (`n1`, `n2`, …), as the front knows it.
    pub name: String,
    /// Its host: namespace and veth.
    pub link: Link,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its data directory (`node/cert.pem`, `node/secret`, `containers/…`).
    pub data_dir: PathBuf,
    /// Its cgroup root (under the v2 mount).
    pub cgroup_root: PathBuf,
    /// Every line it has logged (across restarts).
    pub log: Log,
    child: Option<Child>,
    mirror: Option<Mirror>,
    also_log: Option<Log>,
}

impl Node {
    /// Its API's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.link.ns_ip, NODE_PORT))
    }

    /// Its API's URL (as the front's `[[remote.nodes]] url`).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// Its pinned certificate.
    pub fn cert_file(&self) -> PathBuf {
        self.data_dir.join("node/cert.pem")
    }

    /// Its request secret.
    pub fn secret_file(&self) -> PathBuf {
        self.data_dir.join("node/secret")
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Start it (`nsenter --net=… stockade node --config …`) and wait, with a
    /// deadline, for its certificate, its secret and its listener.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} already runs", self.name);
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.link.ns_path().display()))
            .arg("--")
            .arg(stockade_exe())
            .args(["node", "--config"])
            .arg(&self.config)
            .env_remove("STOCKADE_DATA_DIR")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nsenter … stockade node");
        let mut logs = vec![self.log.clone()];
        logs.extend(self.also_log.clone());
        let _lines = keep_log(&mut child, self.name.clone(), logs);
        self.child = Some(child);
        let end = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!("node {} exited while starting: {status}", self.name);
            }
            let files = self.cert_file().is_file() && self.secret_file().is_file();
            if files && connect(self.addr(), Duration::from_millis(500)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < end,
                "node {} did not listen on {} within {START_DEADLINE:?} (cert and secret: {files})",
                self.name,
                self.addr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A client for its API, signing with its secret and pinning its certificate.
    pub fn client(&self) -> NodeClient {
        NodeClient::from_files(self.addr(), &self.cert_file(), &self.secret_file())
            .expect("the node's certificate and secret")
    }

    /// The containers (directories) under its cgroup root.
    pub fn container_cgroups(&self) -> Vec<String> {
        std::fs::read_dir(&self.cgroup_root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// The front: `stockade serve` over the nodes.
pub struct Front {
    /// Its address for the test (`127.0.0.1:<port>`; it listens on every address so
    /// the nodes reach it on their links' root side).
    pub addr: String,
    /// Its data directory (tokens, store).
    pub data_dir: PathBuf,
    /// Its configuration file.
    pub config: PathBuf,
    /// Every line it has logged (across restarts).
    pub log: Log,
    child: Option<Child>,
}

impl Front {
    /// The consumer's token.
    pub fn token(&self) -> String {
        read_trimmed(&self.data_dir.join("api-token"))
    }

    /// The approver's token.
    pub fn approver_token(&self) -> String {
        read_trimmed(&self.data_dir.join("approver-token"))
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "the front already runs");
        let child = spawn_front(&self.config, vec![self.log.clone()]);
        self.child = Some(child);
    }

    /// `stockade ARGS…` against this front (the CLI, as a user runs it).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(stockade_exe())
            .args(args)
            .env("STOCKADE_SERVER", format!("http://{}", self.addr))
            .env("STOCKADE_DATA_DIR", &self.data_dir)
            .stdin(Stdio::null())
            .output()
            .expect("run the CLI")
    }
}

/// `stockade serve --config <config>` (a front), its log kept in each of `logs`
/// (and echoed with a `[front]` prefix); returns once it logged that it serves.
pub fn spawn_front(config: &Path, logs: Vec<Log>) -> Child {
    let mut child = Command::new(stockade_exe())
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("STOCKADE_DATA_DIR")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockade serve");
    let lines = keep_log(&mut child, "front".into(), logs);
    let end = Instant::now() + START_DEADLINE;
    loop {
        match lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains("serving on http://") => return child,
            Ok(_) => {}
            Err(e) => {
                let _ = kill(child.id() as i32, Signal::KILL);
                let status = child.wait();
                // Disconnected: it closed its stderr (exited) before serving.
                panic!("the front did not serve within {START_DEADLINE:?} ({e}; exit: {status:?})");
            }
        }
    }
}

fn read_trimmed(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// How a [`Cluster`] is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many nodes.
    pub nodes: usize,
    /// Each node's `lease_grace_ms`.
    pub lease_grace_ms: u64,
    /// Each node's `heartbeat_ms`.
    pub heartbeat_ms: u64,
    /// Addresses of the test host's loopback (e.g. 127.0.0.2) that each node reaches
    /// as if they were its own: see [`Mirror`]. Empty: none.
    pub mirror_loopback: Vec<Ipv4Addr>,
    /// A log every node's lines also go to (e.g. the e2e suite's server log, so a test
    /// that searches "what the server logged" searches the whole deployment's).
    pub also_log: Option<Log>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            lease_grace_ms: 2_000,
            heartbeat_ms: 500,
            mirror_loopback: Vec::new(),
            also_log: None,
        }
    }
}

/// N nodes, each on its own link, and a front over them.
pub struct Cluster {
    /// The short id every name of this cluster carries.
    pub id: String,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The front.
    pub front: Front,
    dir: Option<TempDir>,
    cgroup_names: Vec<String>,
    front_port: u16,
    heartbeat_ms: u64,
}

impl Cluster {
    /// Start `opts.nodes` nodes from `base` (its substrate, egress and limits
    /// sections; `base` as the e2e suite tweaks it), each on its own link, and wait for
    /// them; no front yet ([`Cluster::start`] starts one, [`Cluster::front_config`]
    /// configures one the caller starts). Needs root and cgroup v2.
    pub fn start_nodes(base: &Config, opts: &Options) -> Cluster {
        let v2 = crate::require_root_and_cgroup_v2();
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let dir = TempDir::new(&format!("nodes-{id}"));
        // The front's port is chosen first: the nodes call it back (front_url).
        let port = {
            let l = TcpListener::bind("0.0.0.0:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let mut cluster = Cluster {
            id: id.clone(),
            nodes: Vec::new(),
            front: Front {
                addr: format!("127.0.0.1:{port}"),
                data_dir: dir.path().join("front/data"),
                config: dir.path().join("front/wasmtime.toml"),
                log: Log::default(),
                child: None,
            },
            dir: Some(dir),
            cgroup_names: Vec::new(),
            front_port: port,
            heartbeat_ms: opts.heartbeat_ms,
        };
        let root = cluster.dir().to_path_buf();
        for i in 1..=opts.nodes {
            let link = Link::create(&id, i).expect("a node's namespace and veth");
            let name = format!("n{i}");
            let ndir = root.join(&name);
            std::fs::create_dir_all(&ndir).expect("the node's directory");
            let cg_name = format!("stockade-node-{id}-{name}");
            cluster.cgroup_names.push(cg_name.clone());
            let mut cfg = base.clone();
            cfg.substrate.kind = "linux".into();
            cfg.substrate.data_dir = ndir.join("data");
            cfg.substrate.cgroup_root = v2.join(&cg_name).display().to_string();
            cfg.substrate.idle_timeout_ms = 0;
            cfg.egress.allow_private_targets = true;
            cfg.node.listen = SocketAddr::from((link.ns_ip, NODE_PORT)).to_string();
            cfg.node.name = name.clone();
            cfg.node.hostnames = vec![link.ns_ip.to_string()];
            cfg.node.front_url = format!("http://{}:{port}", link.host_ip);
            cfg.node.lease_grace_ms = opts.lease_grace_ms;
            cfg.node.heartbeat_ms = opts.heartbeat_ms;
            cfg.remote = Default::default();
            let config = ndir.join("wasmtime.toml");
            std::fs::write(&config, toml::to_string(&cfg).expect("a node config")).unwrap();
            cluster.nodes.push(Node {
                name,
                link,
                config,
                data_dir: cfg.substrate.data_dir.clone(),
                cgroup_root: v2.join(&cg_name),
                log: Log::default(),
                child: None,
                mirror: None,
                also_log: opts.also_log.clone(),
            });
        }
        for n in &mut cluster.nodes {
            if !opts.mirror_loopback.is_empty() {
                n.mirror = Some(
                    Mirror::start(&n.link, &opts.mirror_loopback)
                        .expect("mirror the test host's loopback addresses into the node"),
                );
            }
            n.spawn();
        }
        cluster
    }

    /// [`Cluster::start_nodes`], then its own front (`<dir>/front/data`), started and
    /// waited for.
    pub fn start(base: &Config, opts: &Options) -> Cluster {
        let mut cluster = Cluster::start_nodes(base, opts);
        let cfg = cluster.front_config(base, &cluster.front.data_dir);
        std::fs::create_dir_all(cluster.dir().join("front")).unwrap();
        std::fs::write(
            &cluster.front.config,
            toml::to_string(&cfg).expect("a front config"),
        )
        .unwrap();
        cluster.front.spawn();
        cluster
    }

    /// The configuration of a front over these nodes, from `base` (its engine,
    /// guest, floor and API sections), with `data_dir`, listening on every address at
    /// the port the nodes call back (so they reach it on their links' root side).
    pub fn front_config(&self, base: &Config, data_dir: &Path) -> Config {
        let mut cfg = base.clone();
        cfg.substrate.kind = "remote".into();
        cfg.substrate.data_dir = data_dir.to_path_buf();
        cfg.api.listen = format!("0.0.0.0:{}", self.front_port);
        cfg.remote.nodes = self
            .nodes
            .iter()
            .map(|n| RemoteNode {
                name: n.name.clone(),
                url: n.url(),
                cert_file: n.cert_file(),
                secret_file: n.secret_file(),
            })
            .collect();
        // Faster than the default three seconds: a cut link is told sooner.
        cfg.remote.heartbeat_timeout_ms = (self.heartbeat_ms * 3).max(1_000);
        cfg
    }

    /// The port the front listens on (every address) and the nodes call back.
    pub fn front_port(&self) -> u16 {
        self.front_port
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the cluster's directory").path()
    }

    /// Cut node `i`'s link (0-based).
    pub fn link_down(&self, i: usize) {
        self.nodes[i].link.down().expect("ip link set down");
    }

    /// Mend node `i`'s link.
    pub fn link_up(&self, i: usize) {
        self.nodes[i].link.up().expect("ip link set up");
    }

    /// SIGKILL node `i`'s process (only it) and reap it.
    pub fn kill_node(&mut self, i: usize) {
        let mut c = self.nodes[i].child.take().expect("the node runs");
        kill(c.id() as i32, Signal::KILL).expect("kill the node");
        let _ = c.wait();
    }

    /// Start node `i` again (same data dir, so the same certificate and secret).
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].spawn();
    }

    /// SIGKILL the front (only it) and reap it.
    pub fn kill_front(&mut self) {
        let mut c = self.front.child.take().expect("the front runs");
        kill(c.id() as i32, Signal::KILL).expect("kill the front");
        let _ = c.wait();
    }

    /// Start the front again on the same port and data directory.
    pub fn restart_front(&mut self) {
        self.front.spawn();
    }

    /// The one node with a grant open and that grant's container (the node's own id),
    /// if exactly one grant is open across the nodes.
    pub fn the_open_grant(&self) -> Option<(usize, String)> {
        let mut open = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for id in n.client().open_grants().ok()? {
                open.push((i, id));
            }
        }
        (open.len() == 1).then(|| open.remove(0))
    }

    /// Each node's `open-grants` (asked from the root side of its link).
    pub fn open_grants(&self) -> Vec<(String, std::io::Result<Vec<String>>)> {
        self.nodes
            .iter()
            .map(|n| (n.name.clone(), n.client().open_grants()))
            .collect()
    }

    /// The front stops (SIGTERM, its shutdown deadline), then every node (SIGTERM: a
    /// node tears its containers down), each within `grace` or SIGKILL.
    pub fn terminate_all(&mut self, grace: Duration) {
        if let Some(mut c) = self.front.child.take() {
            terminate(&mut c, grace);
        }
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                terminate(&mut c, grace);
            }
        }
    }

    /// What this cluster left behind on the machine: its nodes' container cgroups,
    /// mounts under its directory, its namespaces and veths. Empty: clean.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for n in &self.nodes {
            for c in n.container_cgroups() {
                left.push(format!("{}: container cgroup {c}", n.name));
            }
        }
        if let Some(d) = &self.dir {
            for m in crate::mounts_under(d.path()) {
                left.push(format!("mount {m}"));
            }
        }
        left
    }

    /// Stop everything gracefully and check the nodes tore their containers down and
    /// left no mount; then clean the rest (Drop). Panics naming what was left.
    pub fn stop(mut self) {
        self.terminate_all(Duration::from_secs(30));
        let left = self.leftovers();
        assert!(
            left.is_empty(),
            "left behind after a graceful stop: {left:?}"
        );
    }

    fn cleanup(&mut self) -> Vec<String> {
        self.terminate_all(Duration::from_secs(10));
        // Its sockets hold the namespaces: closed before they are deleted.
        for n in &mut self.nodes {
            n.mirror = None;
        }
        let mut problems = Vec::new();
        // Cgroups: every hierarchy this machine mounts (v2 and the v1 limit ones).
        for name in &self.cgroup_names {
            for dir in cgroup_dirs_named(name) {
                remove_cgroup_tree(&dir);
                if dir.exists() {
                    problems.push(format!("cgroup {}", dir.display()));
                }
            }
        }
        if let Some(d) = &self.dir {
            for m in crate::mounts_under(d.path()).iter().rev() {
                let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
            }
            for m in crate::mounts_under(d.path()) {
                problems.push(format!("mount {m}"));
            }
        }
        for n in &mut self.nodes {
            if let Err(e) = n.link.remove() {
                problems.push(e.to_string());
            }
        }
        if let Some(d) = self.dir.take() {
            let p = d.path().to_path_buf();
            drop(d);
            if p.exists() {
                problems.push(format!("directory {}", p.display()));
            }
        }
        problems
    }
}

impl Drop for Cluster {
    /// Kill only its own processes, then remove its cgroups, mounts, namespaces, veths
    /// and directory, and check they are gone.
    fn drop(&mut self) {
        let problems = self.cleanup();
        if !problems.is_empty() && !std::thread::panicking() {
            panic!("the cluster left behind: {problems:?}");
        }
    }
}

/// `/sys/fs/cgroup/<h>/<name>` for every hierarchy `h`, and `/sys/fs/cgroup/<name>`
/// (a pure v2 machine), that exist.
fn cgroup_dirs_named(name: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut out = vec![base.join(name)];
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        out.push(e.path().join(name));
    }
    out.retain(|p| p.is_dir());
    out
}

/// Kill and remove a cgroup tree this harness owns, deepest first (`cgroup.kill` where
/// the hierarchy has it, else SIGKILL to each listed pid; nothing if it is gone).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() || Instant::now() > end {
            break;
        }
        for p in pids {
            let _ = kill(p, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let end = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A signed, pinned client of one node's API.
#[derive(Clone)]
pub struct NodeClient {
    addr: SocketAddr,
    secret: Vec<u8>,
    tls: Arc<rustls::ClientConfig>,
}

impl NodeClient {
    /// From the node's certificate (PEM) and secret files.
    pub fn from_files(addr: SocketAddr, cert: &Path, secret: &Path) -> std::io::Result<NodeClient> {
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_file(cert)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", cert.display())))?;
        let secret = std::fs::read_to_string(secret)?.trim().as_bytes().to_vec();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                der: der.into_owned(),
                provider,
            }))
            .with_no_client_auth();
        Ok(NodeClient {
            addr,
            secret,
            tls: Arc::new(tls),
        })
    }

    /// `POST /node/v1/{call}` for `key` ("" node-wide) with `body`, signed now with a
    /// fresh nonce: (status, body). An error: no answer (connect, TLS, reset).
    pub fn call(&self, call: &str, key: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let path = format!("{}{call}", stockade_host::node::protocol::PREFIX);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(std::io::Error::other)?
            .as_millis() as u64;
        let nonce = auth::nonce();
        let signed = auth::Signed {
            time_ms: now,
            nonce: &nonce,
            method: "POST",
            path: &path,
            key,
            idempotency: "",
            body,
        };
        let sig = signed.sign(&self.secret);
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: stockade-node\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}: {now}\r\n{}: {nonce}\r\n{}: {key}\r\n{}: {sig}\r\n\r\n",
            body.len(),
            auth::TIME_HEADER,
            auth::NONCE_HEADER,
            auth::KEY_HEADER,
            auth::SIGNATURE_HEADER,
        )
        .into_bytes();
        req.extend_from_slice(body);
        let tcp = connect(self.addr, Duration::from_secs(3))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
        let server = rustls_pki_types::ServerName::try_from("stockade-node")
            .map_err(std::io::Error::other)?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), server)
            .map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(&req)?;
        tls.flush()?;
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw) {
            Ok(_) => {}
            // A peer that closes without close_notify after a full answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(e),
        }
        parse_response(&raw)
    }

    /// The node's `open-grants`: container ids with a grant open.
    pub fn open_grants(&self) -> std::io::Result<Vec<String>> {
        let (status, body) =
            self.call(stockade_host::node::protocol::call::OPEN_GRANTS, "", b"{}")?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| std::io::Error::other(format!("open-grants {status}: {e}")))?;
        match (status, v.get("ok").and_then(|o| o.as_array())) {
            (200, Some(ids)) => Ok(ids
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect()),
            _ => Err(std::io::Error::other(format!(
                "open-grants answered {status}: {v}"
            ))),
        }
    }
}

/// (status, de-chunked body) of a whole HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let bad = |m: &str| std::io::Error::other(format!("bad response: {m}"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let nl = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("a chunk size line"))?;
        let size_text = String::from_utf8_lossy(&body[..nl]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("a chunk size"))?;
        body = &body[nl + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        if body.len() < size + 2 {
            return Err(bad("a short chunk"));
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Trusts exactly one certificate (the pinned node's), with the provider's signature
/// checks for the handshake itself.
#[derive(Debug)]
struct Pinned {
    der: rustls_pki_types::CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_ref() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "not the pinned node certificate".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

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

/// Poll `f` until it returns `Some`, failing after `limit` with `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_are_slash_30s_in_the_private_range_and_skip_used_addresses() {
        let (h, p) = pick_subnet(1234, 0, &[]).unwrap();
        let (h32, p32) = (u32::from(h), u32::from(p));
        assert_eq!(h32 & !3, p32 & !3, "one /30");
        assert_eq!((h32 & 3, p32 & 3), (1, 2));
        assert_eq!(h32 >> 16, NET_BASE >> 16, "in 10.213.0.0/16");
        // Taken: the next /30.
        let (h2, _) = pick_subnet(1234, 0, &[p]).unwrap();
        assert_eq!(u32::from(h2), (h32 & !3) + 4 + 1);
        // Another counter: another /30.
        assert_ne!(pick_subnet(1234, 1, &[]).unwrap().0, h);
        // Wraps inside the range.
        let (h3, _) = pick_subnet(u32::MAX, u32::MAX, &[]).unwrap();
        assert_eq!(u32::from(h3) >> 16, NET_BASE >> 16);
    }

    #[test]
    fn a_response_is_parsed_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(parse_response(plain).unwrap(), (200, b"ok".to_vec()));
        let chunked =
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (401, b"abcde".to_vec()));
        assert!(parse_response(b"HTTP/1.1 200").is_err());
    }

    /// Two namespaces on their own veths (the host's mount table unchanged): each
    /// reaches the root side and is reached from it (a TCP round trip both ways: there is no `ping` on every machine), a cut
    /// link is unreachable at once, a mended one works again, and dropping the links
    /// leaves no namespace and no veth.
    #[test]
    fn two_namespaces_talk_across_their_veths_and_leave_nothing() {
        crate::require_root_and_cgroup_v2();
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let links = [Link::create(&id, 1).unwrap(), Link::create(&id, 2).unwrap()];
        assert_ne!(links[0].ns_ip, links[1].ns_ip);
        // Other tests check the host's mount table meanwhile: the links mount nothing.
        assert_eq!(
            std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
            mounts
        );
        let names: Vec<(PathBuf, String)> = links
            .iter()
            .map(|l| (l.ns_path(), l.host_if.clone()))
            .collect();
        for l in &links {
            // Root → namespace.
            let listener = l
                .inside({
                    let ip = l.ns_ip;
                    move || TcpListener::bind((ip, 0))
                })
                .unwrap();
            let addr = listener.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                s.write_all(b"pong").unwrap();
            });
            let mut s = connect(addr, Duration::from_secs(5)).unwrap();
            let mut got = String::new();
            s.read_to_string(&mut got).unwrap();
            assert_eq!(got, "pong");
            t.join().unwrap();
            // Namespace → root side.
            let up = TcpListener::bind((l.host_ip, 0)).unwrap();
            let up_addr = up.local_addr().unwrap();
            let t = std::thread::spawn(move || up.accept().map(|_| ()));
            l.inside(move || connect(up_addr, Duration::from_secs(5)).map(|_| ()))
                .unwrap();
            t.join().unwrap().unwrap();
            // Cut: unreachable; mended: reachable.
            l.down().unwrap();
            let cut = l.inside(move || connect(up_addr, Duration::from_millis(500)).map(|_| ()));
            assert!(cut.is_err(), "a cut link still connects");
            l.up().unwrap();
            let up = TcpListener::bind(up_addr).unwrap();
            let t = std::thread::spawn(move || up.accept().map(|_| ()));
            wait_for("the mended link connects", Duration::from_secs(10), || {
                l.inside(move || connect(up_addr, Duration::from_millis(500)).map(|_| ()))
                    .ok()
            });
            t.join().unwrap().unwrap();
        }
        // The two namespaces do not share a network: the first's address is not the
        // second's.
        let other = links[1].ns_ip;
        let seen = links[0].inside(move || Ok(host_addresses_here().contains(&other)));
        assert!(!seen.unwrap());
        drop(links);
        for (ns, veth) in names {
            assert!(!ns.exists(), "{} left", ns.display());
            assert!(
                !Path::new("/sys/class/net").join(&veth).exists(),
                "{veth} left"
            );
        }
    }

    /// A mirrored loopback address: from inside a namespace, 127.0.0.2:PORT reaches the
    /// test host's 127.0.0.2:PORT (bytes both ways), and once the mirror and the link
    /// are dropped nothing of the namespace is left.
    #[test]
    fn a_mirrored_loopback_address_reaches_the_test_hosts_and_leaves_nothing() {
        crate::require_root_and_cgroup_v2();
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let link = Link::create(&id, 1).unwrap();
        let mirror = Mirror::start(&link, &[Ipv4Addr::new(127, 0, 0, 2)]).unwrap();
        let up = TcpListener::bind("127.0.0.2:0").unwrap();
        let addr = up.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = up.accept().unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
            s.write_all(b"pong").unwrap();
        });
        let got = link
            .inside(move || {
                let mut s = connect(addr, Duration::from_secs(5))?;
                s.write_all(b"ping")?;
                let mut got = String::new();
                s.read_to_string(&mut got)?;
                Ok(got)
            })
            .unwrap();
        assert_eq!(got, "pong");
        t.join().unwrap();
        let (ns, veth) = (link.ns_path(), link.host_if.clone());
        drop(mirror);
        drop(link);
        assert!(!ns.exists());
        assert!(!Path::new("/sys/class/net").join(veth).exists());
    }

    /// The addresses of the calling thread's namespace (`/proc/thread-self/net`).
    fn host_addresses_here() -> Vec<Ipv4Addr> {
        let text = std::fs::read_to_string("/proc/thread-self/net/fib_trie").unwrap_or_default();
        let mut out = Vec::new();
        let mut last: Option<Ipv4Addr> = None;
        for l in text.lines() {
            let t = l.trim();
            if let Some(a) = t.strip_prefix("|-- ") {
                last = a.parse().ok();
            } else if t.contains("/32 host LOCAL")
                && let Some(a) = last
            {
                out.push(a);
            }
        }
        out
    }
}
