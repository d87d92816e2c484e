//! The data directory is private (invariant 11): it holds the API
//! token, the approval tokens and records (`stockade.db`), every snapshot and every
//! container's storage. It is 0700 and owned by the user the server runs as; its
//! files are 0600 and its directories 0700.
//!
//! [`secure`] is checked at every start, before anything is read or written: a
//! directory this user owns is fixed (and the fix logged), one owned by somebody else
//! is refused with a message naming it (its owner could read everything).

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The data directory cannot be made private.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// Owned by another user.
    #[error(
        "data directory {path} is owned by uid {owner}, not by this server's uid {me}: its owner could read the API token, approvals and snapshots; fix its ownership or choose another substrate.data_dir"
    )]
    Owner {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// Not a directory (a symlink is refused too: it could point anywhere).
    #[error("data directory {0} is not a directory (symlinks are refused)")]
    NotADirectory(PathBuf),
    /// Another instance holds the directory.
    #[error(
        "data directory {0} is in use by another stockade instance (its lock file is held); one data directory serves one instance"
    )]
    InUse(PathBuf),
    /// An I/O error.
    #[error("data directory {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Hold the data directory for this process: an exclusive `flock` on `<dir>/lock`,
/// kept as long as the returned file lives (a second instance on the same directory is
/// refused instead of sweeping the first one's containers).
pub fn lock(dir: &Path) -> Result<std::fs::File, DataDirError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("lock");
    let io_err = |source| DataDirError::Io {
        path: path.clone(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(DataDirError::InUse(dir.to_path_buf())),
        Err(e) => Err(io_err(e.into())),
    }
}

/// The mode a data directory entry must have (pure): directories 0700, files 0600.
pub fn wanted_mode(is_dir: bool) -> u32 {
    if is_dir { 0o700 } else { 0o600 }
}

/// Create `dir` if it is missing and make it and its top two levels private.
pub fn secure(dir: &Path) -> Result<(), DataDirError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataDirError::Io { path, source }
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        Err(e) => return Err(io_err(dir)(e)),
        Ok(m) if !m.is_dir() => return Err(DataDirError::NotADirectory(dir.to_path_buf())),
        Ok(_) => {}
    }
    let me = rustix::process::geteuid().as_raw();
    let m = std::fs::symlink_metadata(dir).map_err(io_err(dir))?;
    if m.uid() != me {
        return Err(DataDirError::Owner {
            path: dir.to_path_buf(),
            owner: m.uid(),
            me,
        });
    }
    fix(dir, true)?;
    // The store, the token, snapshots/ and containers/ (and what is directly in them;
    // container directories hold mounts and are kept 0700 by their creator).
    for entry in read_dir(dir)? {
        let Ok(meta) = std::fs::symlink_metadata(&entry) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        fix(&entry, meta.is_dir())?;
        if meta.is_dir() && entry.file_name().is_some_and(|n| n == "snapshots") {
            for f in read_dir(&entry)? {
                if std::fs::symlink_metadata(&f).is_ok_and(|m| m.is_file()) {
                    fix(&f, false)?;
                }
            }
        }
    }
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, DataDirError> {
    Ok(std::fs::read_dir(dir)
        .map_err(|source| DataDirError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .flatten()
        .map(|e| e.path())
        .collect())
}

/// Give `path` its wanted mode if it lacks it, and say so.
fn fix(path: &Path, is_dir: bool) -> Result<(), DataDirError> {
    let want = wanted_mode(is_dir);
    let m = std::fs::symlink_metadata(path).map_err(|source| DataDirError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let have = m.permissions().mode() & 0o7777;
    if have != want {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)).map_err(
            |source| DataDirError::Io {
                path: path.to_path_buf(),
                source,
            },
        )?;
        tracing::warn!(target: "stockade::datadir", path = %path.display(), from = format!("{have:o}"), to = format!("{want:o}"), "made private");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_readable_data_directory_is_made_private() {
        let d = std::env::temp_dir().join(format!("stockade-dd-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(d.join("snapshots")).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(d.join("stockade.db"), "").unwrap();
        std::fs::set_permissions(
            d.join("stockade.db"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::write(d.join("snapshots/k.tar.gz"), "").unwrap();
        std::fs::set_permissions(
            d.join("snapshots/k.tar.gz"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        secure(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&d.join("stockade.db")), 0o600);
        assert_eq!(mode(&d.join("snapshots")), 0o700);
        assert_eq!(mode(&d.join("snapshots/k.tar.gz")), 0o600);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_missing_data_directory_is_created_private_and_a_file_is_refused() {
        let d = std::env::temp_dir().join(format!("stockade-dd-{}", uuid::Uuid::new_v4()));
        secure(&d.join("nested")).unwrap();
        assert_eq!(mode(&d.join("nested")), 0o700);
        std::fs::write(d.join("file"), "").unwrap();
        assert!(matches!(
            secure(&d.join("file")),
            Err(DataDirError::NotADirectory(_))
        ));
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_data_directory_serves_one_instance_at_a_time() {
        let d = std::env::temp_dir().join(format!("stockade-dd-{}", uuid::Uuid::new_v4()));
        secure(&d).unwrap();
        let held = lock(&d).unwrap();
        assert!(matches!(lock(&d), Err(DataDirError::InUse(_))));
        drop(held);
        assert!(lock(&d).is_ok(), "free again once the holder is gone");
        assert_eq!(mode(&d.join("lock")), 0o600);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_data_directory_owned_by_another_user_is_refused_naming_it() {
        assert_eq!(
            rustix::process::geteuid().as_raw(),
            0,
            "this test gives a directory to another uid: it needs root (CI runs as root)"
        );
        let d = std::env::temp_dir().join(format!("stockade-dd-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(12345), Some(12345)).unwrap();
        let err = secure(&d).unwrap_err();
        assert!(
            matches!(err, DataDirError::Owner { owner: 12345, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&d.display().to_string()));
        let _ = std::fs::remove_dir_all(d);
    }
}
