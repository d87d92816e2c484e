//! Descriptors crossing between the host and a supervisor, both sides: at its start,
//! at fixed numbers ([`Inherited`]), and afterwards over its socket (`SCM_RIGHTS`).
//!
//! At its start: the host's clone child ([`super::namespaces`]) places each
//! descriptor at its number ([`SOCK_FD`] … [`IMAGE_FD`]) and marks every other one
//! close-on-exec; the supervisor adopts them once, first thing ([`Inherited::adopt`]).
//!
//! The host sends one descriptor with a request (the read end of the pipe an upload
//! streams into: docs/SECURITY.md, "Uploads"); the supervisor reads every request with
//! [`recv`], which keeps whatever descriptors came with the bytes, close-on-exec, for the
//! request that claims them (any other is closed: a descriptor nobody asked for is never
//! kept). A descriptor read with a plain `read` would be dropped by the kernel, so the
//! supervisor never reads its socket any other way.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The fd the supervisor finds its (bound, not yet listening) Unix socket on.
pub const SOCK_FD: RawFd = 3;
/// The fd the supervisor finds its cgroup directory on.
pub const CGROUP_FD: RawFd = 4;
/// The fd the supervisor reports `ready` (or why not) on.
pub const READY_FD: RawFd = 5;
/// `<container-dir>/root`, opened `O_PATH` by the clone child.
pub const ROOT_FD: RawFd = 6;
/// `<container-dir>/fs` (the storage), opened `O_PATH` by the clone child.
pub const STORAGE_FD: RawFd = 7;
/// The image directory (`rootfs = DIR`), opened `O_PATH` by the clone child.
pub const IMAGE_FD: RawFd = 8;
/// Below this, every fd number is one of the above or stdio.
pub const FIRST_FREE: RawFd = 9;

/// The descriptors a supervisor was started with, owned (but the ready pipe, which
/// [`Inherited::adopt`] returns beside them: `main` writes it once the set-up is over).
#[derive(Debug)]
pub struct Inherited {
    /// Its socket, bound by the host, not yet listening.
    pub sock: OwnedFd,
    /// Its container's cgroup directory (cgroup mode).
    pub cgroup: Option<OwnedFd>,
    /// `<container-dir>/root`, `O_PATH` (with isolation).
    pub root: Option<OwnedFd>,
    /// `<container-dir>/fs`, `O_PATH` (with isolation).
    pub storage: Option<OwnedFd>,
    /// The image directory, `O_PATH` (with isolation and an image).
    pub image: Option<OwnedFd>,
}

impl Inherited {
    /// Mark every handed number close-on-exec (our own descriptors never reach a
    /// workload; each workload also closes everything above 2 before its exec) and
    /// take ownership of those the command line says were handed: the cgroup
    /// directory with `cgroup`, the root and storage with `isolate`, the image with
    /// both `isolate` and `image`.
    ///
    /// # Safety
    /// Call once, in the supervisor's `main`, before anything opens a descriptor: the
    /// numbers must be the ones the clone child placed (nothing else owns them).
    pub unsafe fn adopt(cgroup: bool, isolate: bool, image: bool) -> (OwnedFd, Inherited) {
        for fd in SOCK_FD..FIRST_FREE {
            // SAFETY: the number stays open for this call (nothing else runs yet); an
            // unused one fails with EBADF, which is ignored.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
        }
        let take = |fd: RawFd, handed: bool| {
            // SAFETY: the caller's contract: the clone child placed `fd` for us (the
            // command line says it did), and nothing else owns it.
            handed.then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        };
        // SAFETY: as `take`: the ready pipe and the socket are always handed.
        let (ready, sock) = unsafe {
            (
                OwnedFd::from_raw_fd(READY_FD),
                OwnedFd::from_raw_fd(SOCK_FD),
            )
        };
        let fds = Inherited {
            sock,
            cgroup: take(CGROUP_FD, cgroup),
            root: take(ROOT_FD, isolate),
            storage: take(STORAGE_FD, isolate),
            image: take(IMAGE_FD, isolate && image),
        };
        (ready, fds)
    }
}

/// Most descriptors one read keeps (one per request; more is a sender's error, and
/// the kernel closes what does not fit: `MSG_CTRUNC`).
const MAX_FDS: usize = 4;

/// Send `bytes` with `fd` attached to the first of them; how many bytes went (the
/// descriptor went with them; the rest is for plain writes). `sock` may be
/// non-blocking: `WouldBlock` then means nothing went.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    Ok(rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

/// Read into `buf` (blocking); the descriptors that came with the bytes are appended
/// to `fds`, close-on-exec. `Ok(0)`: the peer closed.
pub fn recv(sock: impl AsFd, buf: &mut [u8], fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            &sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    Ok(got.bytes)
}

/// A line reader over a socket that keeps the descriptors sent with its lines.
pub struct Lines<S> {
    sock: S,
    buf: Vec<u8>,
    /// What each `recvmsg` reads into: made (and zeroed) once per connection, not per
    /// read (64 KiB of `memset` a request before).
    chunk: Box<[u8]>,
    /// Descriptors received and not yet claimed, oldest first.
    pub fds: VecDeque<OwnedFd>,
}

impl<S: AsFd> Lines<S> {
    /// Lines from `sock`.
    pub fn new(sock: S) -> Self {
        Self {
            sock,
            buf: Vec::new(),
            chunk: vec![0u8; 64 * 1024].into_boxed_slice(),
            fds: VecDeque::new(),
        }
    }

    /// The next line, without its newline; `None` at end of stream (a partial last
    /// line is dropped: a request is a whole line). A line over `max` bytes is an
    /// error (the connection is then dropped).
    pub fn next_line(&mut self, max: usize) -> io::Result<Option<Vec<u8>>> {
        let mut scanned = 0;
        loop {
            if let Some(n) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + n;
                let line = self.buf[..end].to_vec();
                self.buf.drain(..=end);
                return Ok(Some(line));
            }
            scanned = self.buf.len();
            if scanned > max {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a request line is too long",
                ));
            }
            let n = recv(&self.sock, &mut self.chunk, &mut self.fds)?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&self.chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_sent_with_a_line_arrives_with_it() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let sent = send(a.as_fd(), b"{\"x\":1}\nsecond\n", r.as_fd()).unwrap();
        assert_eq!(sent, 15);
        drop(r);
        let mut lines = Lines::new(b);
        assert_eq!(lines.next_line(1 << 20).unwrap().unwrap(), b"{\"x\":1}");
        let got = lines.fds.pop_front().expect("the descriptor came");
        std::fs::File::from(w)
            .write_all(b"through the pipe")
            .unwrap();
        let mut text = String::new();
        std::fs::File::from(got).read_to_string(&mut text).unwrap();
        assert_eq!(text, "through the pipe");
        assert_eq!(lines.next_line(1 << 20).unwrap().unwrap(), b"second");
        drop(a);
        assert_eq!(lines.next_line(1 << 20).unwrap(), None);
        assert!(lines.fds.is_empty());
    }

    #[test]
    fn a_line_without_end_past_the_bound_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[b'x'; 2000]).unwrap();
        let mut lines = Lines::new(b);
        assert!(lines.next_line(1000).is_err());
    }
}
