//! The egress listener inside a container's network namespace.
//!
//! A short-lived thread enters the supervisor's netns (`setns` on its pidfd), brings `lo`
//! up and binds `127.0.0.1:3128`; the socket stays in that namespace after the thread
//! exits. The host serves it from its own netns (the proxy resolves and connects there).
//! The container's netns has nothing but loopback: a program that ignores the proxy
//! variables cannot reach anything (fail closed).

use std::io;
use std::net::TcpListener;
use std::os::fd::RawFd;

/// Bind `127.0.0.1:port` in the network namespace of the process behind `pidfd`.
pub fn listen_in(pidfd: RawFd, port: u16) -> io::Result<TcpListener> {
    std::thread::Builder::new()
        .name("stockade-netns".into())
        .spawn(move || {
            // SAFETY: setns on a valid pidfd changes only this thread's netns.
            if unsafe { libc::setns(pidfd, libc::CLONE_NEWNET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            TcpListener::bind(("127.0.0.1", port))
        })?
        .join()
        .map_err(|_| io::Error::other("the netns thread panicked"))?
}

/// `ip link set lo up` in the calling thread's netns (`SIOCSIFFLAGS`).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket; closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; the name fits.
    let r = unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr);
        if r >= 0 {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr);
        }
        r
    };
    let err = io::Error::last_os_error();
    // SAFETY: our fd.
    unsafe { libc::close(s) };
    if r < 0 { Err(err) } else { Ok(()) }
}
