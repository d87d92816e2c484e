//! Which process tree holds a connection to the egress proxy (DESIGN §5): the proxy adds
//! a grant's credentials only to the fenced run's own connections, never to a detached
//! process's, even while the fence is open and its grant is shared (DESIGN §2.1).
//!
//! A connection is attributed by the kernel's own records, read from the host:
//! * the container's TCP table (`/proc/<supervisor>/net/tcp`, the supervisor's network
//!   namespace is the container's) names the socket inode of the client end: the row
//!   whose local address is the peer the proxy accepted and whose remote address is the
//!   proxy's listener;
//! * the fenced run's tree is a leaf cgroup whose name the host chose
//!   (`Fence::begin_run`); its `cgroup.procs` lists its processes, and one of them must
//!   hold `socket:[inode]` in `/proc/<pid>/fd`.
//!
//! A workload cannot leave its cgroup (tested by the boundary suite), so a detached
//! process cannot join the fenced tree; it could only get a credential through the
//! fenced command's cooperation, and the fenced command is who the credential is for.
//! Anything that cannot be read is "not the fenced run": credentials are withheld.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Instant;

use stockade_egress::Attribution;

use super::cgroup::CgroupDir;

/// Reads the records of one container.
pub struct Tracer {
    /// `/proc/<supervisor>/net`, opened when the container was assigned.
    net: OwnedFd,
    /// The container's cgroup (cgroup mode); without one nothing is attributed.
    cgroup: Option<CgroupDir>,
    /// The last reading of the records (with every connection attributed, a
    /// burst of connections must not each read the TCP table and every descriptor of
    /// the fenced tree on the server's threads).
    last: Mutex<Option<Reading>>,
}

/// What the kernel's records said at one moment, for one tree and listener.
struct Reading {
    /// When reading began: it answers for what was there before (a connection accepted
    /// and a run begun earlier), never for a run begun later under the same tree id.
    at: Instant,
    tree: String,
    listener: SocketAddrV4,
    /// Client address → socket inode, for connections to the listener.
    clients: HashMap<SocketAddrV4, u64>,
    /// The socket inodes the tree's processes hold.
    held: HashSet<u64>,
}

impl Reading {
    /// Does this reading answer for tree `tree` behind `listener` as of `since` (pure)?
    fn answers(&self, tree: &str, listener: SocketAddrV4, since: Instant) -> bool {
        self.at >= since && self.tree == tree && self.listener == listener
    }
}

impl Tracer {
    pub fn new(supervisor_pid: i32, cgroup: Option<CgroupDir>) -> std::io::Result<Tracer> {
        let net = rustix::fs::open(
            format!("/proc/{supervisor_pid}/net"),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(Tracer {
            net,
            cgroup,
            last: Mutex::new(None),
        })
    }

    fn tcp_table(&self) -> Option<String> {
        let fd = rustix::fs::openat(
            self.net.as_fd(),
            "tcp",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        std::io::read_to_string(std::fs::File::from(fd)).ok()
    }
}

impl Attribution for Tracer {
    fn holds(&self, tree: &str, peer: SocketAddr, listener: SocketAddr) -> bool {
        self.holds_since(tree, peer, listener, Instant::now())
    }

    fn holds_since(
        &self,
        tree: &str,
        peer: SocketAddr,
        listener: SocketAddr,
        since: Instant,
    ) -> bool {
        let (SocketAddr::V4(peer), SocketAddr::V4(listener)) = (peer, listener) else {
            return false;
        };
        let Some(cgroup) = &self.cgroup else {
            return false;
        };
        if stockade_grammar::names::process_id(tree).is_err() {
            return false;
        }
        off_the_workers(|| self.read_and_look_up(cgroup, tree, peer, listener, since))
    }
}

/// Run `f`, which reads `/proc` and may wait for another reading, without holding one
/// of the runtime's workers: a burst of connections once stalled every other key's
/// exec for 1.7 s while both workers of a 2-core server read the fenced tree's
/// descriptors (the linux test `availability`). On a current-thread runtime (unit
/// tests) it simply runs.
fn off_the_workers<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Tracer {
    fn read_and_look_up(
        &self,
        cgroup: &CgroupDir,
        tree: &str,
        peer: SocketAddrV4,
        listener: SocketAddrV4,
        since: Instant,
    ) -> bool {
        // One reading at a time: connections waiting here use the one just made when
        // it began after `since` (their acceptance, and their run's start).
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = last
            .as_ref()
            .is_some_and(|r| r.answers(tree, listener, since));
        if !fresh {
            let at = Instant::now();
            let clients = self
                .tcp_table()
                .map(|t| clients_of(&t, listener))
                .unwrap_or_default();
            let held = cgroup
                .open_child(tree)
                .and_then(|leaf| leaf.procs())
                .map(|pids| pids.into_iter().flat_map(held_sockets).collect())
                .unwrap_or_default();
            *last = Some(Reading {
                at,
                tree: tree.to_owned(),
                listener,
                clients,
                held,
            });
        }
        let r = last.as_ref().expect("read above");
        r.clients.get(&peer).is_some_and(|i| r.held.contains(i))
    }
}

/// The socket inodes process `pid` holds.
fn held_sockets(pid: i32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            socket_inode(target.to_str()?)
        })
        .collect()
}

/// `socket:[N]` → N (pure).
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Client address → socket inode of every row whose remote address is `server`, from a
/// `/proc/net/tcp` table (pure; the format as for [`client_inode`]).
pub fn clients_of(table: &str, server: SocketAddrV4) -> HashMap<SocketAddrV4, u64> {
    let parse = |hex: &str| -> Option<SocketAddrV4> {
        let (ip, port) = hex.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?.to_ne_bytes();
        Some(SocketAddrV4::new(
            ip.into(),
            u16::from_str_radix(port, 16).ok()?,
        ))
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() <= 9 || parse(f[2])? != server {
                return None;
            }
            let inode: u64 = f[9].parse().ok().filter(|i| *i != 0)?;
            Some((parse(f[1])?, inode))
        })
        .collect()
}

/// Does process `pid` hold a descriptor that is `socket:[inode]`?
#[cfg(test)]
fn holds_socket(pid: i32, wanted: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        std::fs::read_link(e.path())
            .is_ok_and(|target| target.as_os_str() == std::ffi::OsStr::new(wanted))
    })
}

/// The inode of the socket whose local address is `client` and whose remote address
/// is `server`, from a `/proc/net/tcp` table (pure). Addresses there are hex, the
/// IPv4 address in the kernel's byte order (little-endian on the machines this runs
/// on: `0100007F` is 127.0.0.1), the port big-endian.
pub fn client_inode(table: &str, client: SocketAddrV4, server: SocketAddrV4) -> Option<u64> {
    let hex = |a: SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        )
    };
    let (local, remote) = (hex(client), hex(server));
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode …
        if f.len() > 9 && f[1] == local && f[2] == remote {
            f[9].parse().ok().filter(|i| *i != 0)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_end_of_a_connection_is_found_by_its_addresses() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:0C38 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:D431 0100007F:0C38 01 00000000:00000000 00:00000000 00000000  1000        0 3333 1 0000000000000000 20 4 30 10 -1\n\
   3: 0100007F:D432 0100007F:0C38 06 00000000:00000000 03:00000C8E 00000000     0        0 0 3 0000000000000000\n";
        let lo = |port| SocketAddrV4::new([127, 0, 0, 1].into(), port);
        assert_eq!(
            client_inode(table, lo(0xD431), lo(3128)),
            Some(3333),
            "the client end"
        );
        assert_eq!(
            client_inode(table, lo(3128), lo(0xD431)),
            Some(2222),
            "the accepted end"
        );
        assert_eq!(
            client_inode(table, lo(0xD432), lo(3128)),
            None,
            "a time-wait row has no inode"
        );
        assert_eq!(client_inode(table, lo(1), lo(3128)), None);
        assert_eq!(client_inode("", lo(1), lo(3128)), None);
        let clients = clients_of(table, lo(3128));
        assert_eq!(
            clients,
            HashMap::from([(lo(0xD431), 3333)]),
            "the table read once: every client of the listener"
        );
        assert_eq!(socket_inode("socket:[3333]"), Some(3333));
        assert_eq!(socket_inode("pipe:[3333]"), None);
    }

    /// A reading answers for its own tree and listener, for what was there when it
    /// began: a connection accepted and a run begun before it, not a run begun after
    /// under the same tree id (a kept leaf's id is given to the next run).
    #[test]
    fn a_reading_answers_only_for_what_began_before_it() {
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(1);
        let lo = |port| SocketAddrV4::new([127, 0, 0, 1].into(), port);
        let r = Reading {
            at: t0,
            tree: "t1".into(),
            listener: lo(3128),
            clients: HashMap::new(),
            held: HashSet::new(),
        };
        let before = t0.checked_sub(std::time::Duration::from_millis(1)).unwrap();
        for (tree, listener, since, answers, why) in [
            (
                "t1",
                3128,
                before,
                true,
                "accepted and begun before the reading",
            ),
            ("t1", 3128, t0, true, "at the reading's start"),
            (
                "t1",
                3128,
                later,
                false,
                "a run (or connection) begun after it",
            ),
            ("t2", 3128, before, false, "another tree"),
            ("t1", 3129, before, false, "another listener"),
        ] {
            assert_eq!(r.answers(tree, lo(listener), since), answers, "{why}");
        }
    }

    /// A real socket on this machine: the table names its inode, and this process
    /// holds it.
    #[test]
    fn a_real_connection_is_attributed_to_the_process_holding_it() {
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = match l.local_addr().unwrap() {
            SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let c = std::net::TcpStream::connect(server).unwrap();
        let client = match c.local_addr().unwrap() {
            SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
        let inode = client_inode(&table, client, server).expect("the row");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
        let meta = std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
        assert_eq!(meta.ino(), inode);
        assert!(holds_socket(
            std::process::id() as i32,
            &format!("socket:[{inode}]")
        ));
        assert!(!holds_socket(std::process::id() as i32, "socket:[1]"));
        assert!(held_sockets(std::process::id() as i32).contains(&inode));
        assert_eq!(clients_of(&table, server).get(&client), Some(&inode));
    }
}
