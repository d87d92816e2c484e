//! The spawner thread every supervisor is cloned from (the `namespaces` doc says why one,
//! long-lived, with a descriptor table and a mount namespace of its own), and the socket
//! a request's descriptors cross into it by.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use rustix::io::Errno;

use super::child::clone_supervisor;
use super::mount_ns::{Landmark, MountNs, absolute, landmark, landmarks};
use super::{SpawnRequest, Spawned, kill_pidfd, reap_blocking};

/// A request without its descriptors (they cross on the socket), and where the answer
/// goes: the pid, the pidfd and the step pipe following on the socket.
type Job = (Plan, mpsc::Sender<io::Result<i32>>);

/// [`SpawnRequest`] less its descriptors, and the number its descriptors' message
/// carries.
struct Plan {
    seq: u64,
    argv: Vec<CString>,
    envp: Vec<CString>,
    targets: Vec<RawFd>,
    has_cgroup: bool,
    open_in_child: Vec<(CString, RawFd)>,
    attach_at: Vec<CString>,
    /// The directories the child reaches by path, and what the host finds there.
    landmarks: Vec<(CString, Landmark)>,
    namespaces: bool,
    id_map: Option<String>,
    join: Vec<std::path::PathBuf>,
}

/// The host's side of the spawner thread.
struct Spawner {
    jobs: mpsc::Sender<Job>,
    /// The host's end of the socket pair the descriptors cross by.
    sock: OwnedFd,
    /// The number of the next request.
    seq: u64,
}

/// Most descriptors one message carries: the executable, the cgroup and the request's
/// own (the host passes 6).
const MAX_PASSED: usize = 16;

fn spawner() -> io::Result<std::sync::MutexGuard<'static, Spawner>> {
    static SPAWNER: OnceLock<io::Result<Mutex<Spawner>>> = OnceLock::new();
    let s = SPAWNER.get_or_init(|| {
        let (host_end, thread_end) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel::<bool>();
        let theirs = thread_end.as_raw_fd();
        std::thread::Builder::new()
            .name("stockade-spawner".into())
            .spawn(move || serve_spawns(thread_end, rx, ready_tx))?;
        // Once the thread has its own table, its end of the pair is its own: the
        // entry this table still has goes (so the host sees the thread's end close).
        if ready.recv() == Ok(true) {
            // SAFETY: `theirs` is the number of the socket moved to the thread; in this
            // table nothing owns it any more (the thread's copy is in its own table).
            unsafe { libc::close(theirs) };
        }
        Ok(Mutex::new(Spawner {
            jobs: tx,
            sock: host_end,
            seq: 0,
        }))
    });
    match s {
        Ok(m) => Ok(m.lock().unwrap_or_else(|p| p.into_inner())),
        Err(e) => Err(io::Error::new(e.kind(), format!("the spawner thread: {e}"))),
    }
}

/// The spawner thread: its own descriptor table, then one clone per request. Without
/// its own table (`unshare` refused) it works on the process's, as it did before:
/// slower at scale, nothing else.
fn serve_spawns(sock: OwnedFd, jobs: mpsc::Receiver<Job>, ready: mpsc::Sender<bool>) {
    // A signal sent to the process is never handled on this thread: a handler writes
    // to descriptor numbers of the process's table, which are not this thread's (tokio's
    // signal pipe: a SIGTERM caught here was lost, and `serve` never shut down; a stray
    // byte could land in a descriptor of a spawn in flight). The kernel gives the signal
    // to another thread. A clone child resets its mask (`default_signals`).
    let _blocked = crate::clone::BlockedSignals::all();
    let own = own_table(sock.as_raw_fd()).is_ok();
    // Before the host goes on: its next mounts are not in it.
    let mut mounts = MountNs::own().ok();
    let _ = ready.send(own);
    for (plan, reply) in jobs {
        if let Some(m) = &mut mounts
            && plan.namespaces
            && !plan
                .landmarks
                .iter()
                .all(|(path, seen)| landmark(path) == Some(*seen))
            && m.remake().is_err()
        {
            // Back in the host's namespace (`remake` returns there when it fails): the
            // spawner clones from it from now on.
            mounts = None;
        }
        let _ = reply.send(spawn_here(&sock, plan, mounts.as_ref()));
    }
}

/// Give this thread a descriptor table of its own, holding only stdio and `keep`.
fn own_table(keep: RawFd) -> io::Result<()> {
    // SAFETY: CLONE_FILES gives this thread a copy of the process's table; the other
    // threads keep theirs. Nothing on this thread holds a descriptor of the process's
    // but `keep` (the thread was just started), so closing the rest of the copy
    // closes nothing anyone here uses; the other threads' descriptors stay open in
    // their table.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FILES) }?;
    let close = |from: RawFd, to: u32| {
        if from as u32 <= to {
            // SAFETY: close_range(2) on this thread's own table (above).
            unsafe { libc::syscall(libc::SYS_close_range, from as u32, to, 0u32) };
        }
    };
    close(3, (keep as u32).saturating_sub(1));
    close(keep + 1, u32::MAX);
    Ok(())
}

/// On the spawner thread: receive `plan`'s descriptors, clone, send the supervisor's
/// pidfd and step pipe back (its pid in the message).
fn spawn_here(sock: &OwnedFd, plan: Plan, mounts: Option<&MountNs>) -> io::Result<i32> {
    let mut fds = receive(sock, plan.seq)?.into_iter();
    let mut next = || {
        fds.next()
            .ok_or_else(|| io::Error::other("a descriptor is missing"))
    };
    let exe = next()?;
    let cgroup = if plan.has_cgroup { Some(next()?) } else { None };
    let mut passed = Vec::with_capacity(plan.targets.len());
    for target in &plan.targets {
        passed.push((next()?, *target));
    }
    let mut attach = Vec::with_capacity(plan.attach_at.len());
    for at in plan.attach_at {
        attach.push((next()?, at));
    }
    let _host = match mounts {
        Some(m) if !plan.namespaces => Some(m.host_for_now()?),
        _ => None,
    };
    let spawned = clone_supervisor(SpawnRequest {
        exe,
        argv: plan.argv,
        envp: plan.envp,
        fds: passed,
        open_in_child: plan.open_in_child,
        attach_in_child: attach,
        cgroup,
        namespaces: plan.namespaces,
        id_map: plan.id_map,
        join: plan.join,
    })?;
    let sent = send(
        sock,
        plan.seq,
        &[spawned.pidfd.as_fd(), spawned.steps.as_fd()],
    );
    if let Err(e) = sent {
        // The host cannot have it: it must not live.
        let _ = kill_pidfd(&spawned.pidfd);
        let _ = reap_blocking(&spawned.pidfd);
        return Err(e);
    }
    Ok(spawned.pid)
}

/// Send `fds` in one message tagged `seq` (one message: all of them cross, or none).
fn send(sock: &OwnedFd, seq: u64, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_PASSED || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let bytes = seq.to_ne_bytes();
    rustix::net::sendmsg(
        sock,
        &[std::io::IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receive the message tagged `seq`, in order; a stale one (a request whose other end
/// gave up) is dropped, its descriptors with it.
fn receive(sock: &OwnedFd, seq: u64) -> io::Result<Vec<OwnedFd>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    loop {
        let mut space =
            [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut bytes = [0u8; 8];
        let got = match rustix::net::recvmsg(
            sock,
            &mut [std::io::IoSliceMut::new(&mut bytes)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(Errno::INTR) => continue,
            r => r?,
        };
        if got.bytes == 0 {
            return Err(io::Error::other("the spawner's socket closed"));
        }
        let mut fds = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = msg {
                fds.extend(rights);
            }
        }
        if got.bytes == bytes.len() && u64::from_ne_bytes(bytes) == seq {
            return Ok(fds);
        }
    }
}

/// The spawner thread's `/proc/self/task/<tid>` directory, once it runs: where its
/// descriptor table, mount namespace and signal mask can be read.
pub fn spawner_task() -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "stockade-spawne")
        })
        .map(|t| t.path())
}

/// Start the spawner thread if it is not running (the first [`spawn`] does too): a
/// host starts it before it holds containers' descriptors, and the socket pair it
/// keeps for its lifetime is there from the start.
pub fn start_spawner() -> io::Result<()> {
    spawner().map(drop)
}

/// Start a supervisor on the spawner thread (blocking: call it from `spawn_blocking`).
pub fn spawn(req: SpawnRequest) -> io::Result<Spawned> {
    let mut sp = spawner()?;
    sp.seq += 1;
    let seq = sp.seq;
    let SpawnRequest {
        exe,
        argv,
        envp,
        fds,
        open_in_child,
        attach_in_child,
        cgroup,
        namespaces,
        id_map,
        join,
    } = req;
    // The spawner's working directory is its own (the `namespaces` doc): a relative path is
    // this thread's.
    let open_in_child: Vec<_> = open_in_child
        .into_iter()
        .map(|(path, target)| (absolute(path), target))
        .collect();
    let attach_in_child: Vec<_> = attach_in_child
        .into_iter()
        .map(|(tree, at)| (tree, absolute(at)))
        .collect();
    let mut passed = vec![exe.as_fd()];
    passed.extend(cgroup.as_ref().map(|c| c.as_fd()));
    passed.extend(fds.iter().map(|(fd, _)| fd.as_fd()));
    passed.extend(attach_in_child.iter().map(|(fd, _)| fd.as_fd()));
    send(&sp.sock, seq, &passed)?;
    let attach_at: Vec<CString> = attach_in_child.iter().map(|(_, at)| at.clone()).collect();
    // As this (host) thread's namespace shows them.
    let landmarks = landmarks(&open_in_child, &attach_at)
        .into_iter()
        .filter_map(|path| landmark(&path).map(|seen| (path, seen)))
        .collect();
    let plan = Plan {
        seq,
        argv,
        envp,
        targets: fds.iter().map(|(_, t)| *t).collect(),
        has_cgroup: cgroup.is_some(),
        open_in_child,
        attach_at,
        landmarks,
        namespaces,
        id_map,
        join,
    };
    // The spawner holds its own copies now.
    drop((exe, cgroup, fds, attach_in_child));
    let (tx, rx) = mpsc::channel();
    sp.jobs
        .send((plan, tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    let pid = rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))??;
    let mut back = receive(&sp.sock, seq)?.into_iter();
    match (back.next(), back.next()) {
        (Some(pidfd), Some(steps)) => Ok(Spawned { pid, pidfd, steps }),
        _ => Err(io::Error::other("the spawner sent no pidfd")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespaces::tests::spawn_true;
    use crate::stage;

    /// The spawner thread's descriptor table is its own: a clone copies that one, not
    /// the host's, however many descriptors the host holds (~9 per live container).
    #[test]
    fn the_spawner_thread_has_a_descriptor_table_of_its_own() {
        let held: Vec<std::fs::File> = (0..300)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        start_spawner().unwrap();
        let count = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let spawner = spawner_task().expect("the spawner thread runs");
        let own = count(&format!("{}/fd", spawner.display()));
        let process = count("/proc/self/fd");
        assert!(process > 300, "{process}");
        // Stdio and its socket; a spawn in flight (another test) holds a few more.
        assert!(own <= 24, "the spawner's table holds {own} descriptors");
        drop(held);
        // It still spawns.
        let s = spawn_true(None);
        assert_eq!(stage::outcome(&s.steps).unwrap(), None);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), 0);
    }

    /// No signal sent to the process is handled on the spawner thread (its descriptor
    /// table is its own: a handler's writes to the process's descriptors would miss).
    #[test]
    fn the_spawner_thread_blocks_every_signal() {
        start_spawner().unwrap();
        let spawner = spawner_task().expect("the spawner thread runs");
        let status = std::fs::read_to_string(spawner.join("status")).unwrap();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .expect("SigBlk");
        for sig in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGCHLD,
            libc::SIGHUP,
            libc::SIGUSR1,
        ] {
            assert_ne!(
                blocked & (1 << (sig - 1)),
                0,
                "signal {sig} is not blocked: {blocked:x}"
            );
        }
    }
}
