//! The workspace restore cache: `<data>/snapshots/<key>.tar.gz`, written atomically.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Where `key`'s snapshot lives (the key is hex-encoded: any string is a safe file name).
pub fn path(data_dir: &Path, key: &str) -> PathBuf {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    data_dir.join("snapshots").join(format!("{hex}.tar.gz"))
}

/// Archive `workspace` into `dest` (temp file, fsync, rename, fsync the directory).
/// Symlinks are stored as symlinks, never followed.
pub fn write(workspace: &Path, dest: &Path) -> io::Result<()> {
    let dir = dest
        .parent()
        .ok_or_else(|| io::Error::other("snapshot path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4()));
    let result = (|| {
        let file = std::fs::File::create(&tmp)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        tar.follow_symlinks(false);
        tar.append_dir_all(".", workspace)?;
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

/// Unpack `src` into `workspace` (the tar crate refuses entries that escape it).
pub fn restore(src: &Path, workspace: &Path) -> io::Result<bool> {
    let file = match std::fs::File::open(src) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    tar.set_preserve_permissions(true);
    tar.unpack(workspace)?;
    Ok(true)
}
