//! A container's writable storage (invariant 11's disk limit; docs/LINUX.md, "Limits"):
//! one size-capped tmpfs per container, mounted by the host at `<container-dir>/fs`
//! (`nosuid,nodev`), holding `workspace`, `artifacts` and `tmp`; the supervisor binds
//! them at `/workspace`, `/artifacts` and `/tmp`. Writes past `limits.disk_mib` fail with
//! `ENOSPC`, whichever of the three they go to.
//!
//! Why a tmpfs (decision, docs/SECURITY.md): it is the only per-container size cap
//! that costs nothing at `ensure` (no `mkfs`, no loop device) and needs nothing of the
//! host's filesystem (project quotas need XFS or ext4 with `prjquota`). Its cost: the
//! storage is RAM. Pages a container writes are charged to its memory cgroup, so its
//! memory limit bounds memory and disk together, and a machine's RAM bounds
//! `ceiling × disk_mib`. `/artifacts` outlives the container: at teardown it is copied
//! to `<container-dir>/artifacts` on disk (bounded by the cap) before the unmount.
//!
//! Every walk of a tree a container wrote (chown after a restore, the copy of
//! artifacts) goes through directory descriptors with `O_NOFOLLOW`: a symlink is never
//! followed, whatever the container put there.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};
use rustix::mount::{MountFlags, UnmountFlags};

/// The subdirectories of a container's storage.
pub const WORKSPACE: &str = "workspace";
/// See [`WORKSPACE`].
pub const ARTIFACTS: &str = "artifacts";
/// See [`WORKSPACE`].
pub const TMP: &str = "tmp";

/// Free space below which the storage counts as full (a run hit the disk limit).
const FULL_BELOW: u64 = 64 * 1024;

/// One container's mounted storage.
#[derive(Debug)]
pub struct Storage {
    dir: PathBuf,
}

/// The tmpfs options for a cap of `mib` MiB (pure): the size, and as many inodes as
/// 4 KiB files would fill (inodes are kernel memory the size does not count).
pub fn tmpfs_options(mib: u64) -> String {
    let inodes = ((mib << 20) / 4096).max(1024);
    format!("size={}m,nr_inodes={inodes},mode=0755", mib.max(1))
}

impl Storage {
    /// Mount a tmpfs of `mib` MiB on `dir` and create `workspace` and `artifacts`
    /// (owned by `workload`, 0755) and `tmp` (owned by the container's root, 1777).
    pub fn create(
        dir: &Path,
        mib: u64,
        workload: (u32, u32),
        root: (u32, u32),
    ) -> io::Result<Storage> {
        std::fs::create_dir_all(dir)?;
        let opts = std::ffi::CString::new(tmpfs_options(mib)).map_err(io::Error::other)?;
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            opts.as_c_str(),
        )?;
        let s = Storage {
            dir: dir.to_path_buf(),
        };
        let made = (|| {
            let fd = open_dir(None, dir)?;
            for (name, mode, (uid, gid)) in [
                (WORKSPACE, 0o755, workload),
                (ARTIFACTS, 0o755, workload),
                (TMP, 0o1777, root),
            ] {
                rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o700))?;
                rustix::fs::chownat(
                    &fd,
                    name,
                    Some(Uid::from_raw(uid)),
                    Some(Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
                rustix::fs::chmodat(&fd, name, Mode::from_raw_mode(mode), AtFlags::empty())?;
            }
            Ok::<_, io::Error>(())
        })();
        if let Err(e) = made {
            let _ = s.unmount();
            return Err(e);
        }
        Ok(s)
    }

    /// An already mounted storage (a restart's sweep).
    pub fn existing(dir: &Path) -> Storage {
        Storage {
            dir: dir.to_path_buf(),
        }
    }

    /// `<dir>/<sub>`.
    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.join(sub)
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// No room left (bytes or inodes): a run filled the disk cap.
    pub fn full(&self) -> bool {
        rustix::fs::statvfs(&self.dir)
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize) < FULL_BELOW || s.f_favail == 0)
            .unwrap_or(false)
    }

    /// Copy `artifacts` to `dest` on the host's disk (regular files and directories;
    /// symlinks and special files are skipped, never followed), at most `budget` bytes:
    /// a file hard-linked again is linked again, not copied again, and what would pass
    /// the budget (sparse files) is left out (a red team turned a 0-block file into
    /// 5 GB of the host's disk). Returns whether everything was kept.
    pub fn keep_artifacts(&self, dest: &Path, budget: u64) -> io::Result<bool> {
        std::fs::create_dir_all(dest)?;
        let src = open_dir(None, &self.path(ARTIFACTS))?;
        let dst = open_dir(None, dest)?;
        let mut state = Copy {
            left: budget,
            links: std::collections::HashMap::new(),
            complete: true,
        };
        copy_tree(src.as_fd(), dst.as_fd(), dest, 0, &mut state)?;
        Ok(state.complete)
    }

    /// Unmount (lazily: a process that still holds a file keeps only that file).
    pub fn unmount(&self) -> io::Result<()> {
        match rustix::mount::unmount(&self.dir, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// How deep a walk goes before it refuses (a tmpfs of a few GiB cannot hold a deeper
/// tree that matters; the bound keeps the recursion's stack finite).
const MAX_DEPTH: usize = 256;

/// Open a directory relative to `at` (or absolute), without following a final symlink.
pub fn open_dir(at: Option<BorrowedFd<'_>>, path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(match at {
        Some(fd) => rustix::fs::openat(fd, path, flags, Mode::empty())?,
        None => rustix::fs::open(path, flags, Mode::empty())?,
    })
}

/// Entry names of the directory `fd` (no `.`/`..`), with their types as the directory
/// reports them.
pub fn entries(fd: BorrowedFd<'_>) -> io::Result<Vec<(std::ffi::CString, FileType)>> {
    let mut dir = rustix::fs::Dir::read_from(fd)?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e?;
        let name = e.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        out.push((name.to_owned(), e.file_type()));
    }
    Ok(out)
}

/// The type of `name` in `dir`, not following a symlink.
pub fn kind(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<FileType> {
    Ok(FileType::from_raw_mode(
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?.st_mode,
    ))
}

/// `chown` every entry under `dir` (and `dir`) to `uid:gid`, never following a
/// symlink (a restored workspace, before the container that will own it starts).
pub fn chown_tree(dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let fd = open_dir(None, dir)?;
    rustix::fs::fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    chown_below(fd.as_fd(), uid, gid, 0)
}

fn chown_below(dir: BorrowedFd<'_>, uid: u32, gid: u32, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("directory tree too deep"));
    }
    for (name, _) in entries(dir)? {
        rustix::fs::chownat(
            dir,
            &name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
        if kind(dir, &name)? == FileType::Directory {
            let sub = rustix::fs::openat(
                dir,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            chown_below(sub.as_fd(), uid, gid, depth + 1)?;
        }
    }
    Ok(())
}

/// A copy's progress: the bytes it may still write, the first copy of every file with
/// more than one link, and whether anything was left out.
struct Copy {
    left: u64,
    links: std::collections::HashMap<(u64, u64), PathBuf>,
    complete: bool,
}

fn copy_tree(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    dst_path: &Path,
    depth: usize,
    state: &mut Copy,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("directory tree too deep"));
    }
    for (name, _) in entries(src)? {
        let nofollow = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        // Opened first, typed after: what is read is what was checked.
        let Ok(fd) = rustix::fs::openat(src, &name, OFlags::RDONLY | nofollow, Mode::empty())
        else {
            continue; // a symlink (ELOOP) or gone
        };
        let st = rustix::fs::fstat(&fd)?;
        let here = dst_path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(0o755))?;
                let sub_dst = rustix::fs::openat(
                    dst,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | nofollow,
                    Mode::empty(),
                )?;
                copy_tree(fd.as_fd(), sub_dst.as_fd(), &here, depth + 1, state)?;
            }
            FileType::RegularFile => {
                if st.st_nlink > 1 {
                    let id = (st.st_dev, st.st_ino);
                    if let Some(first) = state.links.get(&id) {
                        std::fs::hard_link(first, &here)?;
                        continue;
                    }
                    state.links.insert(id, here.clone());
                }
                let size = st.st_size as u64;
                let Some(left) = state.left.checked_sub(size) else {
                    state.complete = false;
                    continue;
                };
                state.left = left;
                let out = rustix::fs::openat(
                    dst,
                    &name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )?;
                let mut from = std::fs::File::from(fd);
                let mut to = std::fs::File::from(out);
                io::copy(&mut from, &mut to)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Mount points at or below `under` in a `/proc/self/mountinfo` text, deepest first
/// (pure): what a restart's sweep unmounts.
pub fn mounts_under(mountinfo: &str, under: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(under))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && b.get(i + 1..i + 4)
                .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_sets_size_and_inodes() {
        assert_eq!(tmpfs_options(64), "size=64m,nr_inodes=16384,mode=0755");
        assert_eq!(tmpfs_options(1), "size=1m,nr_inodes=1024,mode=0755");
    }

    #[test]
    fn a_sweep_finds_mounts_below_the_containers_directory_deepest_first() {
        let info = "\
22 27 0:21 / /proc rw - proc proc rw
90 27 0:50 / /var/lib/stockade/containers/a/fs rw - tmpfs tmpfs rw
91 90 0:51 / /var/lib/stockade/containers/a/fs/x rw - tmpfs tmpfs rw
92 27 0:52 / /var/lib/stockade/containers2/b/fs rw - tmpfs tmpfs rw
93 27 0:53 / /var/lib/stockade/containers/with\\040space/fs rw - tmpfs tmpfs rw
";
        let under = Path::new("/var/lib/stockade/containers");
        assert_eq!(
            mounts_under(info, under),
            [
                PathBuf::from("/var/lib/stockade/containers/a/fs/x"),
                PathBuf::from("/var/lib/stockade/containers/a/fs"),
                PathBuf::from("/var/lib/stockade/containers/with space/fs"),
            ]
        );
    }
}
