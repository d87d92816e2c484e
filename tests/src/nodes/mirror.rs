//! The test host's loopback addresses (127.0.0.2, …) reachable from inside a node's
//! namespace: see [`Mirror`].

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::link::Link;

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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::path::Path;

    use super::super::connect;
    use super::*;

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
}
