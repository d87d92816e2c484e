//! Reading a container's `/artifacts` from the host, without ever following a symlink
//! the container planted: every component is opened `O_NOFOLLOW` relative to its parent.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use stockade_runtime::substrate::{Artifact, SubstrateError};

/// The largest chunk one `read_artifact` returns.
pub const MAX_CHUNK: u32 = 4 * 1024 * 1024;
const MAX_LISTED: usize = 10_000;

/// Is `name` a plain relative path with no `..`, no absolute part, no NUL? (The one
/// grammar's check, the guest's too.)
pub fn valid_name(name: &str) -> bool {
    stockade_grammar::names::artifact_name(name).is_ok()
}

/// Every regular file under `dir` (symlinks and special files are skipped). The walk
/// holds a directory descriptor per level and opens each subdirectory relative to its
/// parent with `O_NOFOLLOW`: a directory the container swaps for a symlink while the
/// host lists is never followed (the listing then simply lacks it).
pub fn list(dir: &Path) -> io::Result<Vec<Artifact>> {
    let root = match super::storage::open_dir(None, dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    walk(&root, "", 0, &mut out)?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Depth first, one open descriptor per level (at most `MAX_DEPTH`).
fn walk(fd: &OwnedFd, rel: &str, depth: usize, out: &mut Vec<Artifact>) -> io::Result<()> {
    const MAX_DEPTH: usize = 64;
    for (name, _) in super::storage::entries(fd.as_fd())? {
        if out.len() >= MAX_LISTED {
            return Ok(());
        }
        let Ok(name) = name.into_string() else {
            continue; // not UTF-8: not nameable through the API
        };
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        // Opened first, typed after: what is typed is what was opened.
        let Ok(child) = openat(
            fd,
            std::ffi::OsStr::new(&name),
            OFlags::RDONLY | OFlags::NONBLOCK,
        ) else {
            continue; // a symlink (ELOOP), a socket (ENXIO), gone
        };
        let st = rustix::fs::fstat(&child)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory if depth < MAX_DEPTH => {
                walk(&child, &path, depth + 1, out)?
            }
            rustix::fs::FileType::RegularFile => out.push(Artifact {
                name: path,
                size: st.st_size as u64,
            }),
            _ => {}
        }
    }
    Ok(())
}

fn openat(dir: &OwnedFd, name: &std::ffi::OsStr, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Up to `length` bytes of `dir/name` from `offset`.
pub fn read(dir: &Path, name: &str, offset: u64, length: u32) -> Result<Vec<u8>, SubstrateError> {
    if !valid_name(name) {
        return Err(SubstrateError::Invalid(format!("artifact name {name:?}")));
    }
    let io_err = |e: io::Error| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            SubstrateError::Invalid(format!("artifact {name:?} is not a regular file"))
        }
        Some(libc::ENOENT) => SubstrateError::Invalid(format!("no artifact {name:?}")),
        _ => SubstrateError::Failed(format!("artifact {name:?}: {e}")),
    };
    let mut cur = OwnedFd::from(std::fs::File::open(dir).map_err(io_err)?);
    let parts: Vec<_> = Path::new(name).components().collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let flags = if last {
            OFlags::RDONLY | OFlags::NONBLOCK
        } else {
            OFlags::RDONLY | OFlags::DIRECTORY
        };
        cur = openat(&cur, part.as_os_str(), flags).map_err(io_err)?;
    }
    let file = std::fs::File::from(cur);
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(SubstrateError::Invalid(format!(
            "artifact {name:?} is not a regular file"
        )));
    }
    let want = length.min(MAX_CHUNK) as usize;
    let mut buf = vec![0u8; want.min(meta.len().saturating_sub(offset) as usize)];
    let mut got = 0;
    while got < buf.len() {
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut buf[got..], offset + got as u64)
            .map_err(io_err)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_escape_are_refused() {
        for bad in [
            "",
            "..",
            "../x",
            "a/../../b",
            "/etc/passwd",
            "a/./b",
            "a\0b",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        for good in ["report.txt", "a/b/c.json"] {
            assert!(valid_name(good), "{good:?}");
        }
    }

    #[test]
    fn a_symlink_is_never_followed() {
        let dir = std::env::temp_dir().join(format!("stockade-art-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/ok.txt"), b"hello world").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("leak")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("dirleak")).unwrap();
        assert_eq!(read(&dir, "sub/ok.txt", 6, 100).unwrap(), b"world");
        assert!(matches!(
            read(&dir, "leak", 0, 10),
            Err(SubstrateError::Invalid(_))
        ));
        assert!(matches!(
            read(&dir, "dirleak/passwd", 0, 10),
            Err(SubstrateError::Invalid(_))
        ));
        let names: Vec<_> = list(&dir).unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(names, vec!["sub/ok.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
