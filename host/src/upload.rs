//! Files in (issue 13 item 3): a tar archive, or one file, into a key's `/workspace`.
//!
//! Decision: the archive is unpacked **inside the container**, by the container's own
//! `tar` running as the container's unprivileged user: an ordinary fenced exec with no
//! grant, the archive on its stdin. So an upload is serialized with the key's other
//! mutating calls (the key's lock), is owned by the container's user, counts against
//! the container's disk cap (a full disk fails the upload, not the host), and can write
//! nothing the container itself could not: the boundary is the container's, not a host
//! unpacker's. What is checked here, on the host, before anything runs, is the archive
//! (pure): every name relative and free of `..`, no device, fifo or hard link, no
//! symlink that points out of the tree; the destination a relative path under
//! `/workspace`; at most [`MAX_ARCHIVE_BYTES`]. The archive does not cross the guest
//! (whose stdin is bounded at 16 MiB): the host hands it to the run as its stdin
//! ([`ExecIo::stdin`](crate::runtime::ExecIo)), after these checks.
//!
//! Memory and failure (issue 21, item 16): the body is read once into one buffer sized
//! from its length (a single file's tar header written in place in front of it), and
//! the supervisor's request carries it as base64 written straight into a buffer sized
//! up front: about 2.3 times the upload at the peak, not 5.7. At most
//! [`MAX_CONCURRENT_UPLOADS`](crate::api::MAX_CONCURRENT_UPLOADS) uploads per server
//! at once (429 past it). In the container, `tar` unpacks into a staging directory
//! (`/workspace/.stockade-put-<id>`) and only a complete, successful unpack is merged
//! into the destination, by `tar` again (same result as unpacking there directly: a
//! rename cannot merge a tree into directories that already exist, so it copies),
//! after a check that no file lands where the destination holds a directory:
//! a truncated or bad archive, a full disk while unpacking, or such a conflict leaves
//! nothing in `/workspace` (the staging directory is removed on every exit, and any an
//! interrupted upload left is removed by the key's next one). The price: while it is
//! merged, an upload takes twice its size of the container's disk; a disk that fills
//! during the merge (not the unpack) can leave part of it.
//! Files leave the other way, as ADR-0012 says: by being written to `/artifacts`.

use std::path::{Component, Path};

use crate::bindings::ExecInput;

/// The largest archive one upload takes (it is held in memory on the host, and by the
/// container's supervisor while `tar` reads it).
pub const MAX_ARCHIVE_BYTES: usize = 256 << 20;

/// The destination directory as given (relative to `/workspace`; empty: `/workspace`),
/// checked: no absolute path, no `..`, no NUL.
pub fn check_dest(dest: &str) -> Result<String, String> {
    if dest.contains('\0') {
        return Err("the destination contains a NUL byte".into());
    }
    let p = Path::new(dest);
    let mut parts = vec![];
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("the destination {dest:?} has ..")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "the destination {dest:?} is absolute (it is relative to /workspace)"
                ));
            }
        }
    }
    Ok(parts.join("/"))
}

/// A name inside the archive, checked: relative, no `..`, not empty (`.` names the
/// destination itself, which only a directory entry may: `tar -C DIR .` writes one).
fn check_name(name: &Path, directory: bool) -> Result<(), String> {
    let mut depth = 0usize;
    for c in name.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("{} has ..", name.display())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("{} is absolute", name.display()));
            }
        }
    }
    if depth == 0 && !directory {
        return Err("an entry that is not a directory has an empty name".into());
    }
    Ok(())
}

/// A symlink at `name` pointing at `target` stays inside the tree.
fn check_link(name: &Path, target: &Path) -> Result<(), String> {
    let mut depth: i64 = name
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count() as i64
        - 1;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!(
                        "the symlink {} points out of the tree ({})",
                        name.display(),
                        target.display()
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "the symlink {} points at an absolute path ({})",
                    name.display(),
                    target.display()
                ));
            }
        }
    }
    Ok(())
}

/// Check every entry of a tar archive; the number of entries.
pub fn check_archive(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() > MAX_ARCHIVE_BYTES {
        return Err(format!(
            "the archive is {} bytes, more than {MAX_ARCHIVE_BYTES}",
            bytes.len()
        ));
    }
    let mut archive = tar::Archive::new(bytes);
    let mut n = 0;
    let entries = archive
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("not a tar archive: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| format!("an entry's name: {e}"))?
            .into_owned();
        let kind = entry.header().entry_type();
        check_name(&name, kind == tar::EntryType::Directory)?;
        match kind {
            tar::EntryType::Regular | tar::EntryType::Directory => {}
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| format!("{}: {e}", name.display()))?
                    .ok_or_else(|| format!("the symlink {} has no target", name.display()))?;
                check_link(&name, &target)?;
            }
            other => {
                return Err(format!(
                    "{}: {other:?} entries are not taken (files, directories and symlinks inside the tree are)",
                    name.display()
                ));
            }
        }
        n += 1;
    }
    if n == 0 {
        return Err("the archive is empty".into());
    }
    Ok(n)
}

/// A tar block: a header's size, and the unit data is padded to.
pub const TAR_BLOCK: usize = 512;

/// The end-of-archive marker: two zero blocks.
pub const TAR_TRAILER: usize = 2 * TAR_BLOCK + TAR_BLOCK;

/// One file as an archive of one entry (mode 0644), named `name` (checked).
pub fn single_file(name: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(TAR_BLOCK + bytes.len() + TAR_TRAILER);
    buf.resize(TAR_BLOCK, 0);
    buf.extend_from_slice(bytes);
    single_file_in_place(name, buf)
}

/// [`single_file`] without a copy: `buf` is [`TAR_BLOCK`] bytes of room for the
/// header, then the file's bytes; the header is written into the room and the padding
/// and end-of-archive marker appended. A name too long for one header (more than 100
/// bytes: it needs an extension entry in front) is built by copy instead.
pub fn single_file_in_place(name: &str, mut buf: Vec<u8>) -> Result<Vec<u8>, String> {
    check_file_name(name)?;
    let len = buf.len() - TAR_BLOCK;
    let mut header = tar::Header::new_gnu();
    header.set_size(len as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    if name.len() > 100 || header.set_path(name).is_err() {
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut header, name, &buf[TAR_BLOCK..])
            .map_err(|e| format!("{name}: {e}"))?;
        return b.into_inner().map_err(|e| e.to_string());
    }
    header.set_cksum();
    buf[..TAR_BLOCK].copy_from_slice(header.as_bytes());
    let padded = len.div_ceil(TAR_BLOCK) * TAR_BLOCK;
    buf.resize(TAR_BLOCK + padded + 2 * TAR_BLOCK, 0);
    Ok(buf)
}

/// A file's path as `PUT …/files/PATH` takes it: canonical, relative to `/workspace`.
pub fn check_file_name(name: &str) -> Result<(), String> {
    // A file's path is canonical: `/`-separated segments, none empty, `.` or `..`
    // (docs/openapi.json states the same pattern).
    if name.contains('\0') {
        return Err("the name contains a NUL byte".into());
    }
    if let Some(bad) = name
        .split('/')
        .find(|seg| seg.is_empty() || *seg == "." || *seg == "..")
    {
        return Err(format!(
            "the path {name:?} has an empty, '.' or '..' segment ({bad:?}); write it canonical, relative to /workspace"
        ));
    }
    check_name(Path::new(name), false)
}

/// The script [`command`] runs: unpack into a fresh staging directory; refuse, before
/// anything is written, an archive whose file would land where the destination holds a
/// directory (the one conflict `tar` cannot resolve: it replaces a file by a directory,
/// not the reverse); then merge with `tar` itself, so the result is what unpacking
/// straight into the destination gives. (A tree's Landlock domain refuses linking or
/// renaming a file into another directory, EXDEV, so the merge copies.) The staging
/// directory goes on every exit. `$1` the destination, `$2` the staging directory.
/// Uploads to one key are serialized (the key's lock), so a staging directory an
/// interrupted upload left is removed here.
const UNPACK: &str = r#"set -e
rm -rf -- /workspace/.stockade-put-*
mkdir -- "$2"
trap 'rm -rf -- "$2"' EXIT
tar -x --no-same-owner -f - -C "$2"
mkdir -p -- "$1"
cd -- "$2"
if ! find . -mindepth 1 ! -type d -exec sh -c '
  for p; do
    if [ -d "$0/$p" ] && [ ! -L "$0/$p" ]; then echo "stockade-put: $p is a directory in $0" >&2; exit 1; fi
  done' "$1" {} +; then
  echo "stockade-put: nothing was written" >&2
  exit 1
fi
tar -cf - . | tar -x --no-same-owner -f - -C "$1""#;

/// The exec that unpacks a checked archive into `/workspace/<dest>` (made if missing),
/// as the container's user, with no grant; the archive goes to its stdin from the host.
/// A failed unpack leaves nothing there ([`UNPACK`]).
pub fn command(dest: &str) -> ExecInput {
    ExecInput {
        argv: vec![
            "sh".into(),
            "-c".into(),
            UNPACK.into(),
            "stockade-put".into(),
            format!("/workspace/{dest}"),
            format!("/workspace/.stockade-put-{}", uuid::Uuid::new_v4().simple()),
        ],
        cwd: None,
        env: vec![],
        timeout_ms: Some(10 * 60 * 1000),
        grant: None,
        approval: None,
        stdin: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive written header by header with raw names (the builder refuses some of
    /// what an attacker can write); a link's `data` is its target, a file's its bytes.
    fn archive(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let link = matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link);
            let body = if link { "" } else { *data };
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_size(body.len() as u64);
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            if link {
                h.as_old_mut().linkname[..data.len()].copy_from_slice(data.as_bytes());
            }
            h.set_cksum();
            b.append(&h, body.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn archives_rows() {
        use tar::EntryType::*;
        let rows: Vec<(&str, Vec<u8>, bool)> = vec![
            ("a file", archive(&[("a.txt", Regular, "x")]), true),
            (
                "a tree",
                archive(&[
                    ("d/", Directory, ""),
                    ("d/f", Regular, "x"),
                    ("d/l", Symlink, "f"),
                ]),
                true,
            ),
            (
                "a symlink up but inside",
                archive(&[("d/e/l", Symlink, "../f")]),
                true,
            ),
            (
                "an absolute name",
                archive(&[("/etc/x", Regular, "x")]),
                false,
            ),
            ("a .. name", archive(&[("../x", Regular, "x")]), false),
            (
                "a .. inside a name",
                archive(&[("d/../../x", Regular, "x")]),
                false,
            ),
            (
                "a symlink out",
                archive(&[("l", Symlink, "../../etc")]),
                false,
            ),
            (
                "an absolute symlink",
                archive(&[("l", Symlink, "/etc/passwd")]),
                false,
            ),
            ("a hard link", archive(&[("h", Link, "a.txt")]), false),
            ("a fifo", archive(&[("p", Fifo, "")]), false),
            ("a device", archive(&[("c", Char, "")]), false),
            ("an empty archive", archive(&[]), false),
            (
                "the destination itself",
                archive(&[("./", Directory, ""), ("./f", Regular, "x")]),
                true,
            ),
            ("a file named .", archive(&[(".", Regular, "x")]), false),
            (
                "not a tar",
                b"hello, I am not a tar archive at all".repeat(20),
                false,
            ),
        ];
        for (what, bytes, ok) in rows {
            assert_eq!(
                check_archive(&bytes).is_ok(),
                ok,
                "{what}: {:?}",
                check_archive(&bytes)
            );
        }
        assert!(check_archive(&vec![0; MAX_ARCHIVE_BYTES + 1]).is_err());
    }

    #[test]
    fn destinations_rows() {
        let rows = [
            ("", Some("")),
            (".", Some("")),
            ("src", Some("src")),
            ("a/./b/", Some("a/b")),
            ("/etc", None),
            ("../x", None),
            ("a/../../x", None),
            ("a\0b", None),
        ];
        for (dest, want) in rows {
            assert_eq!(check_dest(dest).ok().as_deref(), want, "{dest:?}");
        }
    }

    #[test]
    fn a_file_written_in_place_is_the_archive_the_builder_writes() {
        for (name, len) in [
            ("a.txt", 0usize),
            ("notes/a.txt", 5),
            ("b", 512),
            ("c", 513),
            ("d", 100_000),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut h = tar::Header::new_gnu();
            h.set_size(len as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            let mut b = tar::Builder::new(Vec::new());
            b.append_data(&mut h, name, &data[..]).unwrap();
            let built = b.into_inner().unwrap();
            assert_eq!(single_file(name, &data).unwrap(), built, "{name} {len}");
        }
        let long = format!("{}/f", "d".repeat(150));
        let a = single_file(&long, b"x").unwrap();
        assert_eq!(check_archive(&a), Ok(1), "a long name goes by copy");
    }

    #[test]
    fn a_single_file_is_an_archive_of_one_entry() {
        let a = single_file("notes/a.txt", b"hello").unwrap();
        assert_eq!(check_archive(&a), Ok(1));
        assert!(single_file("../a", b"x").is_err());
        assert!(single_file("/a", b"x").is_err());
        for bad in ["a/", "./a", "a//b", "a/./b", "."] {
            assert!(single_file(bad, b"x").is_err(), "{bad}");
        }
    }
}
