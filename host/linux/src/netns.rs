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
            // SAFETY: the caller keeps the pidfd open while this thread runs (it joins).
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(pidfd) };
            // Changes only this short-lived thread's network namespace.
            rustix::thread::move_into_link_name_space(
                fd,
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            loopback_up()?;
            TcpListener::bind(("127.0.0.1", port))
        })?
        .join()
        .map_err(|_| io::Error::other("the netns thread panicked"))?
}

/// Connect to `127.0.0.1:port` in the network namespace of the process behind `pidfd`
/// (a preview door's connection, DESIGN §8): a short-lived thread enters the netns and
/// connects; the socket stays in that namespace after the thread exits. The host never
/// reaches the container through an address of its own.
pub fn connect_in(
    pidfd: std::sync::Arc<std::os::fd::OwnedFd>,
    port: u16,
    timeout: std::time::Duration,
) -> io::Result<std::net::TcpStream> {
    std::thread::Builder::new()
        .name("stockade-preview".into())
        .spawn(move || {
            // Changes only this short-lived thread's network namespace; the pidfd is
            // owned by the Arc this thread holds.
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&*pidfd),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            let s = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })?
        .join()
        .map_err(|_| io::Error::other("the netns thread panicked"))?
}

/// `ip link set lo up` in the calling thread's netns (`SIOCSIFFLAGS`; rustix has no
/// interface-flags ioctl, so this is the one raw call).
pub fn loopback_up() -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let s = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // SAFETY: `ifr` is plain data, zeroed, with a NUL-terminated name that fits; both
    // ioctls only read and write that struct through a valid socket descriptor.
    let r = unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr);
        if r >= 0 {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr);
        }
        r
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
