//! A container's supervisor started: its socket, its descriptors and the request to the
//! spawner thread, the egress listener in its network namespace, and its `ready` line.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use stockade_egress::tls::Authority;
use stockade_runtime::substrate::{Result, SubstrateError};
use stockade_supervisor::stage;

use super::{Build, Up, failed};
use crate::idmap::Lease;
use crate::{CALL_TIMEOUT, Inner, exec, kill, namespaces, netns, protocol};

impl Inner {
    /// Start the supervisor, its egress listener, and wait until it is ready.
    pub(super) async fn launch(self: &Arc<Self>, b: &mut Build) -> Result<Up> {
        let (dir_fd, sock_path, sock) = supervisor_socket(&b.dir)?;
        let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed("ready pipe", e))?;

        let isolate = self.caps.namespaces;
        // Without a network namespace the proxy cannot own 3128: take any free port.
        let host_listener = if isolate {
            None
        } else {
            Some(
                std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(|e| failed("egress listener", e))?,
            )
        };
        let proxy_port = match &host_listener {
            Some(l) => l
                .local_addr()
                .map_err(|e| failed("egress listener", e))?
                .port(),
            None => exec::PROXY_PORT,
        };
        // A CA only where the container can be made to trust it (its own /etc).
        if isolate && self.upstream_tls.is_some() {
            b.authority = Some(Arc::new(
                Authority::generate(&b.id).map_err(|e| failed("the container's egress CA", e))?,
            ));
        }
        let req = self.spawn_request(b, sock, ready_w, isolate, proxy_port)?;
        let spawn_began = Instant::now();
        let spawned = tokio::task::spawn_blocking(move || namespaces::spawn(req))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| failed("starting the supervisor", e))?;
        let pid = spawned.pid;
        let steps = Arc::new(spawned.steps);
        let pidfd = Arc::new(spawned.pidfd);
        b.spawned = Some(pidfd.clone());

        // While the supervisor builds its root: the egress listener in its network
        // namespace.
        let pfd = pidfd.clone();
        let child_steps = steps.clone();
        let listener = tokio::task::spawn_blocking(move || match host_listener {
            Some(l) => Ok(l),
            None => netns::listen_in(pfd.as_raw_fd(), exec::PROXY_PORT).map_err(|e| {
                // A supervisor whose clone child died has no netns to enter: say which
                // step it failed (its step pipe is closed by then: no wait).
                match stage::outcome(&*child_steps) {
                    Ok(Some(step)) => failed("the supervisor did not start", step),
                    _ => failed("egress listener in the container's netns", e),
                }
            }),
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))??;
        listener
            .set_nonblocking(true)
            .map_err(|e| failed("egress listener", e))?;

        let (setup_us, degraded) = wait_ready(ready_r, steps).await?;
        for what in &degraded {
            kill::log_supervisor_degradation(&b.id, what);
        }
        let launch_us = spawn_began.elapsed().as_micros() as u64;

        Ok(Up {
            pid,
            pidfd,
            dir_fd,
            sock_path,
            listener,
            setup_us,
            launch_us,
        })
    }

    /// The supervisor's clone, as the spawner thread takes it: its argv (its
    /// configuration), the descriptors it finds at fixed numbers, what its child opens
    /// and attaches as the host's root, its cgroups and its id map.
    fn spawn_request(
        &self,
        b: &Build,
        sock: OwnedFd,
        ready_w: OwnedFd,
        isolate: bool,
        proxy_port: u16,
    ) -> Result<namespaces::SpawnRequest> {
        let image = match crate::rootfs::Source::from_config(&self.cfg.rootfs) {
            crate::rootfs::Source::Image(p) => Some(p),
            crate::rootfs::Source::Host => None,
        };
        let args = stockade_supervisor::Args {
            id: b.id.clone(),
            kill_mode: self.mode,
            isolate,
            image: image.is_some(),
            proxy_port,
            cgroup: b.cgroup.is_some(),
            ca_pem: b.authority.as_ref().map(|a| a.cert_pem().to_owned()),
        };
        let cs = |s: &[u8]| CString::new(s).map_err(|_| failed("a path", "NUL byte"));
        // argv[0] names no host path (a workload reads /proc/1/cmdline); the binary
        // is exec'd from a descriptor.
        let mut argv = vec![cs(b"stockade-supervisor")?];
        for a in args.to_args() {
            argv.push(cs(a.as_bytes())?);
        }
        let mut fds = vec![(sock, namespaces::SOCK_FD), (ready_w, namespaces::READY_FD)];
        if let Some(cg) = &b.cgroup {
            fds.push((
                cg.try_clone_fd()
                    .map_err(|e| failed("container cgroup", e))?,
                namespaces::CGROUP_FD,
            ));
        }
        let mut open_in_child = Vec::new();
        if isolate {
            open_in_child.push((
                cs(b.dir.join("root").as_os_str().as_bytes())?,
                namespaces::ROOT_FD,
            ));
            open_in_child.push((
                cs(b.dir.join("fs").as_os_str().as_bytes())?,
                namespaces::STORAGE_FD,
            ));
            if let Some(img) = &image {
                open_in_child.push((cs(img.as_os_str().as_bytes())?, namespaces::IMAGE_FD));
            }
        }
        // The storage mount is the host's alone: the spawner's mount namespace, which
        // the clone copies, was made before it (supervisor `namespaces`). The child
        // attaches a detached copy of it where the host has it.
        let mut attach_in_child = Vec::new();
        if isolate && b.storage.is_some() {
            let fs = b.dir.join("fs");
            let tree = rustix::mount::open_tree(
                rustix::fs::CWD,
                &fs,
                rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
                    | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(|e| failed("a detached copy of the container storage", e))?;
            attach_in_child.push((tree, cs(fs.as_os_str().as_bytes())?));
        }
        let exe = rustix::fs::open(
            &self.supervisor_exe,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| failed("the supervisor executable", e))?;
        Ok(namespaces::SpawnRequest {
            exe,
            argv,
            envp: vec![cs(
                b"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )?],
            fds,
            open_in_child,
            attach_in_child,
            cgroup: b
                .cgroup
                .as_ref()
                .map(|c| c.try_clone_fd())
                .transpose()
                .map_err(|e| failed("container cgroup", e))?,
            namespaces: isolate,
            id_map: b.lease.as_ref().map(Lease::map_line),
            join: b
                .limits
                .as_ref()
                .map(|l| l.v1_dirs().map(|d| d.join("cgroup.procs")).collect())
                .unwrap_or_default(),
        })
    }
}

/// Wait for the supervisor's `ready` line (or its reason, or EOF when it died): the
/// microseconds its set-up took, and the degradations it met starting.
/// Wait for the supervisor's `ready` line. A supervisor gone without one either never
/// ran (its clone child failed a step, read from `steps`: the error names it) or died
/// during its set-up.
async fn wait_ready(ready: OwnedFd, steps: Arc<OwnedFd>) -> Result<(u64, Vec<String>)> {
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut chunk = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(failed("the supervisor", "not ready within 30 s"));
            }
            let timeout = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [rustix::event::PollFd::new(
                &ready,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(failed("ready pipe", e)),
            }
            match rustix::io::read(&ready, &mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(failed("ready pipe", e)),
            }
            if buf.contains(&b'\n') {
                break;
            }
        }
        let line = String::from_utf8_lossy(&buf).trim().to_string();
        // No line: the pipe closed. Both ends of `steps` are closed by then (at the
        // exec, or with the child), so reading it does not block.
        let failed = if line.is_empty() {
            stage::outcome(&*steps).map_err(|e| failed("the supervisor's step pipe", e))?
        } else {
            None
        };
        Ok((line, failed))
    })
    .await
    .map_err(|e| SubstrateError::Failed(e.to_string()))??;
    match (read.0.as_str(), read.1) {
        (r, _) if r.starts_with("ready") => {
            Ok(protocol::parse_ready(r.trim_start_matches("ready")))
        }
        ("", Some(step)) => Err(failed("the supervisor did not start", step)),
        ("", None) => Err(failed("the supervisor", "exited during set-up")),
        (why, _) => Err(failed(
            "the supervisor could not build the container",
            why.trim_start_matches("error: "),
        )),
    }
}

/// The supervisor's socket, bound in the container's directory (reached through a
/// descriptor: socket paths are limited to 108 bytes, the data directory is not).
fn supervisor_socket(dir: &Path) -> Result<(OwnedFd, PathBuf, OwnedFd)> {
    let dir_fd =
        OwnedFd::from(std::fs::File::open(dir).map_err(|e| failed("container directory", e))?);
    let sock_path = PathBuf::from(format!("/proc/self/fd/{}/sup.sock", dir_fd.as_raw_fd()));
    // Bound here, listened on by the supervisor: SO_PEERCRED then names it.
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| failed("supervisor socket", e))?;
    rustix::net::bind(
        &sock,
        &rustix::net::SocketAddrUnix::new(&sock_path)
            .map_err(|e| failed("supervisor socket", e))?,
    )
    .map_err(|e| failed("supervisor socket", e))?;
    Ok((dir_fd, sock_path, sock))
}
