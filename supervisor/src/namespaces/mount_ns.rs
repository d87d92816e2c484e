//! The spawner thread's mount namespace (a slave of the host's, made again when a
//! spawn's child would see a directory otherwise than the host does), and the paths a
//! child reaches, as landmarks to compare.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// `path` from the working directory of the calling thread if it is relative.
pub(super) fn absolute(path: CString) -> CString {
    use std::os::unix::ffi::OsStringExt;
    let p = as_path(&path);
    let made = p
        .is_relative()
        .then(|| std::path::absolute(p).ok())
        .flatten()
        .and_then(|a| CString::new(a.into_os_string().into_vec()).ok());
    made.unwrap_or(path)
}

fn as_path(path: &CString) -> &std::path::Path {
    std::path::Path::new(std::ffi::OsStr::from_bytes(path.as_bytes()))
}

/// A directory as a mount namespace shows it: its device and inode.
pub(super) type Landmark = (u64, u64);

/// What `path` is in this thread's mount namespace (`None`: nothing there).
pub(super) fn landmark(path: &CString) -> Option<Landmark> {
    rustix::fs::stat(path.as_c_str())
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// The directories a child reaches by path: what it opens, and where it attaches a tree
/// (the directory above it: the attach point itself is a mount the host has).
pub(super) fn landmarks(open_in_child: &[(CString, RawFd)], attach_at: &[CString]) -> Vec<CString> {
    let parent = |at: &CString| {
        as_path(at)
            .parent()
            .and_then(|d| CString::new(d.as_os_str().as_bytes()).ok())
    };
    open_in_child
        .iter()
        .map(|(path, _)| path)
        .filter(|path| !attach_at.contains(path))
        .cloned()
        .chain(attach_at.iter().filter_map(parent))
        .collect()
}

/// The spawner thread's mount namespace and the host's (the `namespaces` doc).
pub(super) struct MountNs {
    host: OwnedFd,
    own: OwnedFd,
}

impl MountNs {
    /// Give this thread a mount namespace of its own, a slave of the host's.
    pub(super) fn own() -> io::Result<MountNs> {
        let host = this_mount_ns()?;
        let own = Self::fresh(&host)?;
        Ok(MountNs { host, own })
    }

    /// Make this thread's namespace again, from the host's as it is now.
    pub(super) fn remake(&mut self) -> io::Result<()> {
        enter(&self.host)?;
        self.own = Self::fresh(&self.host)?;
        Ok(())
    }

    /// A new namespace for this thread (in the host's now), a slave of the host's; on
    /// an error the thread is in the host's.
    fn fresh(host: &OwnedFd) -> io::Result<OwnedFd> {
        // SAFETY: CLONE_NEWNS (with the CLONE_FS it implies) changes only this thread's
        // mount namespace, root and working directory; this thread holds no path.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
        let made = rustix::mount::mount_change(
            "/",
            rustix::mount::MountPropagationFlags::DOWNSTREAM
                | rustix::mount::MountPropagationFlags::REC,
        )
        .map_err(io::Error::from)
        .and_then(|()| this_mount_ns());
        if made.is_err() {
            // A namespace whose mounts may still propagate to the host's is not one to
            // clone from.
            let _ = enter(host);
        }
        made
    }

    /// Clone from the host's namespace until the guard drops (a spawn without
    /// namespaces: its child lives in the mount namespace it is cloned in).
    pub(super) fn host_for_now(&self) -> io::Result<impl Drop + '_> {
        struct Back<'a>(&'a OwnedFd);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                // Staying in the host's namespace only costs the cut (the `namespaces` doc).
                let back = enter(self.0);
                debug_assert!(back.is_ok(), "back to the spawner's namespace: {back:?}");
            }
        }
        enter(&self.host)?;
        Ok(Back(&self.own))
    }
}

/// This thread's mount namespace.
fn this_mount_ns() -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        "/proc/thread-self/ns/mnt",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Move this thread into the mount namespace `ns`.
fn enter(ns: &OwnedFd) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Mount),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespaces::{ROOT_FD, SpawnRequest, reap_blocking, spawn, start_spawner};
    use crate::stage;

    /// A mount the host makes after the spawner's namespace is not in it, so a
    /// container's clone does not copy it (each live container's storage);
    /// and a spawn whose child opens a directory the spawner sees otherwise than the
    /// host (a data directory mounted later) remakes the namespace from the host's.
    #[test]
    fn a_later_host_mount_is_copied_only_by_a_spawn_that_reaches_it() {
        // SAFETY: geteuid(2) has no failure mode.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test needs root (mounts, namespaces): run the suite as root"
        );
        start_spawner().unwrap();
        let dir = std::env::temp_dir().join(format!(
            "stockade-later-mount-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap();
        rustix::mount::mount(
            "tmpfs",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"size=1m",
        )
        .unwrap();
        struct Gone(std::path::PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
                // Removing the directory detaches the copies other namespaces hold.
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let gone = Gone(dir.clone());
        // Exits 0 when the mount on `dir` is in its mount namespace.
        let mounted_in_child = |open: bool| {
            let exe = rustix::fs::open(
                "/bin/sh",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let script = format!("grep -q ' {} ' /proc/self/mountinfo", dir.display());
            let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
            let s = spawn(SpawnRequest {
                exe,
                argv: ["sh", "-c", &script]
                    .map(|a| CString::new(a).unwrap())
                    .to_vec(),
                envp: Vec::new(),
                fds: Vec::new(),
                open_in_child: if open { vec![(path, ROOT_FD)] } else { vec![] },
                attach_in_child: Vec::new(),
                cgroup: None,
                namespaces: true,
                id_map: None,
                join: Vec::new(),
            })
            .unwrap();
            assert_eq!(stage::outcome(&s.steps).unwrap(), None);
            reap_blocking(&s.pidfd).unwrap() == 0
        };
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            host.contains(&format!(" {} ", dir.display())),
            "the host has the mount"
        );
        assert!(
            !mounted_in_child(false),
            "a container's clone copied a mount the host made after the spawner's namespace"
        );
        assert!(
            mounted_in_child(true),
            "a child that opens the mounted directory got the spawner's stale view of it"
        );
        drop(gone);
    }

    /// What a spawn's child reaches by path: what it opens, and the directory above
    /// each attach point (the attach point is a mount the spawner need not have).
    #[test]
    fn a_childs_landmarks_are_its_opens_and_the_parents_of_its_attach_points() {
        let c = |s: &str| CString::new(s).unwrap();
        // (why, opens, attach points, landmarks)
        type Row<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let rows: &[Row] = &[
            ("nothing", &[], &[], &[]),
            (
                "opens alone",
                &["/d/c/root", "/img"],
                &[],
                &["/d/c/root", "/img"],
            ),
            (
                "an attach point opened too is its parent",
                &["/d/c/root", "/d/c/fs"],
                &["/d/c/fs"],
                &["/d/c/root", "/d/c"],
            ),
        ];
        for (why, opens, attach, want) in rows {
            let opens: Vec<_> = opens.iter().map(|p| (c(p), 3)).collect();
            let attach: Vec<_> = attach.iter().map(|p| c(p)).collect();
            let want: Vec<_> = want.iter().map(|p| c(p)).collect();
            assert_eq!(landmarks(&opens, &attach), want, "{why}");
        }
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(absolute(c("/a/b")), c("/a/b"), "an absolute path stays");
        assert_eq!(
            absolute(c("a/b")),
            c(cwd.join("a/b").to_str().unwrap()),
            "a relative one is the caller's"
        );
    }
}
