//! A node's "host": a network namespace held by a harness process, joined to the root
//! namespace by a veth pair on a private /30 (see the parent module for why a holder
//! process and not `ip netns add`). Subnets are picked from 10.213.0.0/16, apart per
//! process and skipping any the root namespace already uses (another run's links).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::kill;

/// The private range the harness takes its /30s from: 10.213.0.0/16 (16384 links).
const NET_BASE: u32 = u32::from_be_bytes([10, 213, 0, 0]);
const NET_LINKS: u32 = 1 << 14;

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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::super::{connect, wait_for};
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

    /// Two namespaces on their own veths (the host's mount table unchanged): each
    /// reaches the root side and is reached from it (a TCP round trip both ways: there
    /// is no `ping` on every machine), a cut link is unreachable at once, a mended one
    /// works again, and dropping the links leaves no namespace and no veth.
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
