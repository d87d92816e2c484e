//! The workspace restore cache: `<data>/snapshots/<key>.tar.gz`, written atomically
//! (0600: the data directory is private).
//!
//! The host walks a workspace a container wrote (invariant 11). The container is
//! frozen while it does (the caller's `cgroup.freeze`), and the walk never resolves a
//! path: every directory is opened relative to its parent's descriptor with
//! `O_NOFOLLOW`, every file is opened first and typed after (`fstat` of what was
//! opened), and a symlink is archived as a symlink (`readlinkat`), never followed. A
//! directory swapped for a symlink to a host directory mid-walk yields a symlink entry
//! or an error, never the host directory's files. Sockets, fifos and devices are left
//! out.
//!
//! The archive is bounded by the container's disk cap (found by a red team: a sparse
//! file of 8 EiB, or one file hard-linked twenty times, made the host write without
//! end): a file hard-linked again is archived as a link to its first name, and the
//! files' sizes together may not pass the cap, which is also what a restore can hold
//! (the restore writes every byte).

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

use super::storage;

/// How deep a snapshot walks before it refuses.
const MAX_DEPTH: usize = 256;

/// Where `key`'s snapshot lives (the key is hex-encoded: any string is a safe file name).
pub fn path(data_dir: &Path, key: &str) -> PathBuf {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    data_dir.join("snapshots").join(format!("{hex}.tar.gz"))
}

/// Where `key`'s named snapshot `name` lives: `<data>/snapshots/named/<hex key>/<name>.tar.gz`
/// (the name is checked by the caller: `[a-z0-9._-]`, starting with a letter or digit,
/// so it is a file name as it is).
pub fn named(data_dir: &Path, key: &str, name: &str) -> PathBuf {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    data_dir
        .join("snapshots")
        .join("named")
        .join(hex)
        .join(format!("{name}.tar.gz"))
}

/// Copy a snapshot archive `from` to `to` as a restore cache is written (temp file,
/// fsync, rename, fsync the directory): a fork. `NotFound` when `from` is missing.
pub fn copy(from: &Path, to: &Path) -> io::Result<()> {
    let mut src = std::fs::File::open(from)?;
    let dir = to
        .parent()
        .ok_or_else(|| io::Error::other("snapshot path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        io::copy(&mut src, &mut file)?;
        file.sync_all()?;
        std::fs::rename(&tmp, to)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Archive `workspace` into `dest` (temp file, fsync, rename, fsync the directory).
/// Symlinks are stored as symlinks, never followed; the files' bytes together may not
/// pass `budget`.
pub fn write(workspace: &Path, dest: &Path, budget: u64) -> io::Result<()> {
    let dir = dest
        .parent()
        .ok_or_else(|| io::Error::other("snapshot path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4()));
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        let root = storage::open_dir(None, workspace)?;
        let mut walk_state = Walk {
            left: budget,
            links: HashMap::new(),
        };
        walk(&mut tar, root.as_fd(), Path::new(""), 0, &mut walk_state)?;
        let mut file = tar.into_inner()?.finish()?;
        file.flush()?;
        file.sync_all()?;
        std::fs::rename(&tmp, dest)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn header(kind: tar::EntryType, st: &rustix::fs::Stat, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(size);
    h
}

/// What a walk has archived so far: the bytes it may still take, and the first name of
/// every file with more than one link.
struct Walk {
    left: u64,
    links: HashMap<(u64, u64), PathBuf>,
}

/// The snapshot would pass the disk cap.
pub fn over_budget() -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        "the workspace's files add up to more than limits.disk_mib (sparse files?): not archived",
    )
}

fn walk<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    rel: &Path,
    depth: usize,
    state: &mut Walk,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("workspace tree too deep"));
    }
    for (name, _) in storage::entries(dir)? {
        let path = rel.join(OsStr::from_bytes(name.to_bytes()));
        let opened = rustix::fs::openat(
            dir,
            &name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        );
        match opened {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd)?;
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => {
                        let mut h = header(tar::EntryType::Directory, &st, 0);
                        tar.append_data(&mut h, &path, io::empty())?;
                        walk(tar, fd.as_fd(), &path, depth + 1, state)?;
                    }
                    FileType::RegularFile => {
                        let size = st.st_size as u64;
                        if st.st_nlink > 1 {
                            let id = (st.st_dev, st.st_ino);
                            if let Some(first) = state.links.get(&id) {
                                let mut h = header(tar::EntryType::Link, &st, 0);
                                tar.append_link(&mut h, &path, first)?;
                                continue;
                            }
                            state.links.insert(id, path.clone());
                        }
                        state.left = state.left.checked_sub(size).ok_or_else(over_budget)?;
                        let mut h = header(tar::EntryType::Regular, &st, size);
                        // Exactly `size` bytes: the container is frozen, but a short
                        // file must not shift the archive.
                        let body = std::fs::File::from(fd).take(size);
                        tar.append_data(
                            &mut h,
                            &path,
                            Exact {
                                inner: body,
                                left: size,
                            },
                        )?;
                    }
                    _ => {} // fifo, socket, device: not part of a restore cache
                }
            }
            Err(rustix::io::Errno::LOOP) => link(tar, dir, &name, &path)?,
            // Gone since the listing; a socket (ENXIO) or another special file that
            // will not open: not part of a restore cache either.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NXIO | rustix::io::Errno::NODEV) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A symlink, archived as itself.
fn link<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &CStr,
    path: &Path,
) -> io::Result<()> {
    let st = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
        return Ok(()); // swapped since the open: skipped, never followed
    }
    let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
    let mut h = header(tar::EntryType::Symlink, &st, 0);
    tar.append_link(&mut h, path, OsStr::from_bytes(target.as_bytes()))
}

/// A reader of exactly `left` bytes: zeros after a premature end.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// Unpack `src` into `workspace` (the tar crate refuses entries that escape it). The
/// workspace is the host's alone at this point: its container has not started.
pub fn restore(src: &Path, workspace: &Path) -> io::Result<bool> {
    let file = match std::fs::File::open(src) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(false);
    // The tar crate's errors name host paths: the consumer gets the kind only.
    tar.unpack(workspace)
        .map_err(|e| io::Error::new(e.kind(), format!("unpacking the snapshot: {}", e.kind())))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_keeps_files_dirs_and_symlinks_and_follows_none() {
        let base = std::env::temp_dir().join(format!("stockade-snap-{}", uuid::Uuid::new_v4()));
        let ws = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir_all(ws.join("d")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "HOST").unwrap();
        std::fs::write(ws.join("d/f"), "data").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        let dest = base.join("snapshots/x.tar.gz");
        write(&ws, &dest, 1 << 20).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let back = base.join("back");
        std::fs::create_dir_all(&back).unwrap();
        assert!(restore(&dest, &back).unwrap());
        assert_eq!(std::fs::read_to_string(back.join("d/f")).unwrap(), "data");
        assert_eq!(std::fs::read_link(back.join("link")).unwrap(), outside);
        let mut names = Vec::new();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(
            std::fs::File::open(&dest).unwrap(),
        ));
        for e in a.entries().unwrap() {
            names.push(e.unwrap().path().unwrap().display().to_string());
        }
        assert!(
            !names.iter().any(|n| n.contains("secret")),
            "the symlink was followed: {names:?}"
        );
        let _ = std::fs::remove_dir_all(base);
    }

    #[test]
    fn a_named_snapshot_lives_under_its_key_and_a_fork_copies_it_whole() {
        let base = std::env::temp_dir().join(format!("stockade-fork-{}", uuid::Uuid::new_v4()));
        assert_eq!(
            named(&base, "a/b", "v1"),
            base.join("snapshots/named/612f62/v1.tar.gz")
        );
        let ws = base.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("f"), "forked").unwrap();
        let from = named(&base, "src", "v1");
        write(&ws, &from, 1 << 20).unwrap();
        let to = path(&base, "dst");
        copy(&from, &to).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&to).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let back = base.join("back");
        std::fs::create_dir_all(&back).unwrap();
        assert!(restore(&to, &back).unwrap());
        assert_eq!(std::fs::read_to_string(back.join("f")).unwrap(), "forked");
        let missing = copy(&named(&base, "src", "nope"), &path(&base, "other"));
        assert_eq!(missing.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(
            !path(&base, "other").exists(),
            "a failed fork wrote nothing"
        );
        let _ = std::fs::remove_dir_all(base);
    }

    #[test]
    fn a_snapshot_counts_a_hard_linked_file_once_and_refuses_to_pass_its_budget() {
        let base = std::env::temp_dir().join(format!("stockade-snap-{}", uuid::Uuid::new_v4()));
        let ws = base.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("a"), vec![7u8; 4096]).unwrap();
        for i in 0..20 {
            std::fs::hard_link(ws.join("a"), ws.join(format!("link{i}"))).unwrap();
        }
        let dest = base.join("snapshots/x.tar.gz");
        write(&ws, &dest, 8192).expect("one file's bytes, not twenty-one");
        let back = base.join("back");
        std::fs::create_dir_all(&back).unwrap();
        restore(&dest, &back).unwrap();
        assert_eq!(std::fs::read(back.join("link7")).unwrap(), vec![7u8; 4096]);
        // A sparse file whose size passes the budget: refused, nothing left behind.
        let f = std::fs::File::create(ws.join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        let err = write(&ws, &base.join("snapshots/y.tar.gz"), 1 << 20).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        let left: Vec<_> = std::fs::read_dir(base.join("snapshots"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("x.tar.gz")],
            "no temp file left"
        );
        let _ = std::fs::remove_dir_all(base);
    }
}
