//! cgroup v2: one directory per tree, `cgroup.kill`, and waiting for `populated 0`.
//!
//! Only the core files are used (`cgroup.procs`, `cgroup.kill`, `cgroup.events`): no
//! controller is enabled, so a process may sit in a non-leaf cgroup (the supervisor sits
//! in its container's cgroup above its processes' leaves). Every operation is relative to
//! a directory fd, so the supervisor works with the fd it inherited and needs no `/sys`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on a unified machine, else
/// `/sys/fs/cgroup/unified` on a hybrid one.
pub fn detect_v2() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").is_file())
}

/// The parent cgroup of every container: `auto` is `stockade` under the v2 mount.
pub fn resolve_root(configured: &str) -> Option<PathBuf> {
    if configured.is_empty() || configured == "auto" {
        detect_v2().map(|v2| v2.join("stockade"))
    } else {
        Some(PathBuf::from(configured))
    }
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An open cgroup directory.
#[derive(Debug)]
pub struct CgroupDir {
    fd: OwnedFd,
}

impl CgroupDir {
    /// Open (creating it if `create`) the cgroup at `path`.
    pub fn open(path: &Path, create: bool) -> io::Result<CgroupDir> {
        if create {
            match std::fs::create_dir(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let f = std::fs::File::open(path)?;
        Ok(CgroupDir { fd: f.into() })
    }

    /// Adopt an inherited directory fd.
    ///
    /// # Safety
    /// `fd` must be an open directory fd this process owns.
    pub unsafe fn from_raw(fd: RawFd) -> CgroupDir {
        CgroupDir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }
    }

    /// The directory fd (for `CLONE_INTO_CGROUP`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Create (or open) the child cgroup `name`.
    pub fn child(&self, name: &str) -> io::Result<CgroupDir> {
        let c = cstr(name)?;
        // SAFETY: a valid dirfd and NUL-terminated name.
        let r = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
        }
        self.open_child(name)
    }

    /// Open the existing child cgroup `name`.
    pub fn open_child(&self, name: &str) -> io::Result<CgroupDir> {
        let c = cstr(name)?;
        // SAFETY: as above.
        let fd = cvt(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        })?;
        // SAFETY: fresh fd.
        Ok(CgroupDir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Open one of this cgroup's core files.
    pub fn open_file(&self, file: &str, write: bool) -> io::Result<std::fs::File> {
        let c = cstr(file)?;
        let mode = if write {
            libc::O_WRONLY
        } else {
            libc::O_RDONLY
        };
        // SAFETY: as above.
        let fd =
            cvt(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), mode | libc::O_CLOEXEC) })?;
        // SAFETY: fresh fd.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    fn read_file(&self, file: &str) -> io::Result<String> {
        let mut s = String::new();
        io::Read::read_to_string(&mut self.open_file(file, false)?, &mut s)?;
        Ok(s)
    }

    /// The pids in this cgroup (not its children).
    pub fn procs(&self) -> io::Result<Vec<i32>> {
        Ok(self
            .read_file("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Pids in this cgroup and every descendant.
    pub fn procs_recursive(&self) -> io::Result<Vec<i32>> {
        let mut all = self.procs()?;
        for name in self.children()? {
            if let Ok(c) = self.open_child(&name) {
                all.extend(c.procs_recursive().unwrap_or_default());
            }
        }
        Ok(all)
    }

    /// Does this cgroup or a descendant hold a live process?
    pub fn populated(&self) -> io::Result<bool> {
        Ok(parse_populated(&self.read_file("cgroup.events")?))
    }

    /// Kill every process in this cgroup and its descendants at once (`cgroup.kill`:
    /// a forking process cannot outrun it, a `setsid` cannot leave it).
    pub fn kill(&self) -> io::Result<()> {
        io::Write::write_all(&mut self.open_file("cgroup.kill", true)?, b"1")
    }

    /// Wait until `populated 0` or the deadline: `cgroup.events` raises POLLPRI on every
    /// change, so this sleeps on the kernel's notification, not a timer.
    pub fn wait_empty(&self, deadline: Instant) -> io::Result<bool> {
        let f = self.open_file("cgroup.events", false)?;
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: valid fd and buffer.
            let n = unsafe { libc::pread(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if !parse_populated(&String::from_utf8_lossy(&buf[..n as usize])) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut p = libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }

    /// Names of child cgroups.
    pub fn children(&self) -> io::Result<Vec<String>> {
        // SAFETY: dup of a valid fd; fdopendir takes ownership of the dup.
        let dup = cvt(unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        let dir = unsafe { libc::fdopendir(dup) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: rewind (the dup shares the offset with earlier listings).
        unsafe { libc::rewinddir(dir) };
        let mut out = Vec::new();
        loop {
            // SAFETY: dir is open until closedir below.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry.
            let (kind, name) = unsafe {
                (
                    (*ent).d_type,
                    std::ffi::CStr::from_ptr((*ent).d_name.as_ptr())
                        .to_string_lossy()
                        .into_owned(),
                )
            };
            if kind == libc::DT_DIR && name != "." && name != ".." {
                out.push(name);
            }
        }
        // SAFETY: closes dir and the dup.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }

    /// Remove the child cgroup `name` and every descendant (they must be empty).
    pub fn remove_child(&self, name: &str) -> io::Result<()> {
        if let Ok(c) = self.open_child(name) {
            for sub in c.children()? {
                c.remove_child(&sub)?;
            }
        }
        let cn = cstr(name)?;
        // SAFETY: valid dirfd and name.
        let r = unsafe { libc::unlinkat(self.fd.as_raw_fd(), cn.as_ptr(), libc::AT_REMOVEDIR) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Kill the child `name`'s tree, wait for it to empty, remove it. The number of
    /// processes it held.
    pub fn destroy_child(&self, name: &str, deadline: Instant) -> io::Result<u32> {
        let c = match self.open_child(name) {
            Ok(c) => c,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(0),
            Err(e) => return Err(e),
        };
        let n = c.procs_recursive().map(|p| p.len() as u32).unwrap_or(0);
        c.kill()?;
        if !c.wait_empty(deadline)? {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("cgroup {name} did not empty"),
            ));
        }
        drop(c);
        self.remove_child(name)?;
        Ok(n)
    }
}

fn parse_populated(events: &str) -> bool {
    events.lines().any(|l| l.trim() == "populated 1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populated_is_read_from_cgroup_events() {
        assert!(parse_populated("populated 1\nfrozen 0\n"));
        assert!(!parse_populated("populated 0\nfrozen 0\n"));
        assert!(!parse_populated(""));
    }
}
