//! An upload's archive, checked as it streams (pure: a reader in, a writer out).
//!
//! What is checked, on the host, before the container's `tar` sees an entry: every
//! name relative and free of `..`, no device, fifo or hard link, no symlink that
//! points out of the tree (the destination is checked by [`check_dest`]). The check
//! runs over the body as it arrives and forwards each entry's bytes only once its
//! header passed ([`archive`]): a refused entry never reaches the container. The
//! archive's own end is dropped and replaced by a **completion entry** named from
//! the upload's marker, then a fresh end: the container merges an upload only if
//! that entry arrived ([`super::command`]), so a refused, truncated or broken-off
//! upload, which never gets it, writes nothing. One file (`PUT …/files/PATH`) is
//! framed the same way ([`file`]), from the length its request declared.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::path::{Component, Path};
use std::rc::Rc;

use bytes::Bytes;

/// The largest upload one request takes. It streams (the host holds a few chunks of
/// it, not all of it), so the bound is the container's disk's, not memory's: it
/// bounds how long one upload holds its key.
pub const MAX_ARCHIVE_BYTES: usize = 1 << 30;

/// Why an upload's stream stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The archive is refused: why (a bad entry, not a tar archive, empty).
    Refused(String),
    /// Its input broke off, or the container stopped reading its output: the side
    /// that failed says why.
    Interrupted,
}

impl From<io::Error> for Stop {
    fn from(_: io::Error) -> Self {
        Stop::Interrupted
    }
}

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

/// One entry, checked: its name, its kind, a symlink's target.
fn check_entry<R: Read>(entry: &tar::Entry<'_, R>) -> Result<(), String> {
    let name = entry
        .path()
        .map_err(|e| format!("an entry's name: {e}"))?
        .into_owned();
    let kind = entry.header().entry_type();
    check_name(&name, kind == tar::EntryType::Directory)?;
    match kind {
        tar::EntryType::Regular | tar::EntryType::Directory => Ok(()),
        tar::EntryType::Symlink => {
            let target = entry
                .link_name()
                .map_err(|e| format!("{}: {e}", name.display()))?
                .ok_or_else(|| format!("the symlink {} has no target", name.display()))?;
            check_link(&name, &target)
        }
        other => Err(format!(
            "{}: {other:?} entries are not taken (files, directories and symlinks inside the tree are)",
            name.display()
        )),
    }
}

/// Where an archive's bytes come from: pieces as they arrive (a body's frames), so
/// the bytes that pass are forwarded as the same pieces, not copied.
pub trait Source {
    /// The next piece (`None`: the input ended well).
    fn next_piece(&mut self) -> io::Result<Option<Bytes>>;
}

/// Where the checked bytes go, piece by piece, in order.
pub trait Sink {
    /// Take `piece` (the sink may hold small pieces until [`Sink::finish`]).
    fn put(&mut self, piece: Bytes) -> io::Result<()>;
    /// Everything taken goes out.
    fn finish(&mut self) -> io::Result<()>;
}

impl Sink for Vec<u8> {
    fn put(&mut self, piece: Bytes) -> io::Result<()> {
        self.extend_from_slice(&piece);
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn put(&mut self, piece: Bytes) -> io::Result<()> {
        (**self).put(piece)
    }

    fn finish(&mut self) -> io::Result<()> {
        (**self).finish()
    }
}

/// A sink that keeps nothing (a check of a whole archive).
struct Discard;

impl Sink for Discard {
    fn put(&mut self, _: Bytes) -> io::Result<()> {
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reader as a [`Source`], in pieces of at most 64 KiB (copied: a whole archive in
/// memory, the tests' readers).
pub struct ReadSource<R>(pub R);

impl<R: Read> Source for ReadSource<R> {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(Some(Bytes::from(buf)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A [`Source`] as a reader (one file's bytes, which the tar builder reads).
pub struct SourceReader<S> {
    source: S,
    current: Bytes,
    ended: bool,
}

impl<S> SourceReader<S> {
    /// Read `source`'s pieces in order.
    pub fn new(source: S) -> Self {
        Self {
            source,
            current: Bytes::new(),
            ended: false,
        }
    }
}

impl<S: Source> Read for SourceReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.source.next_piece()? {
                Some(p) => self.current = p,
                None => self.ended = true,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// A [`Sink`] as a writer (what the tar builder writes: one file's archive).
pub struct SinkWriter<K>(pub K);

impl<K: Sink> Write for SinkWriter<K> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.put(Bytes::copy_from_slice(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.finish()
    }
}

/// A writer as a [`Sink`] (the tests' buffers, [`archive`]'s callers).
pub struct WriteSink<W>(pub W);

impl<W: Write> Sink for WriteSink<W> {
    fn put(&mut self, piece: Bytes) -> io::Result<()> {
        self.0.write_all(&piece)
    }

    fn finish(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The pieces received and not yet forwarded, and how far forwarding may go: up to
/// the end of the last checked entry's data.
struct Forward<K> {
    out: K,
    pending: VecDeque<Bytes>,
    /// The offset (in the input) of the first byte of `pending`.
    at: u64,
    /// Bytes before this offset are checked.
    limit: u64,
    /// The input or the output failed (not the archive).
    failed: bool,
}

impl<K: Sink> Forward<K> {
    /// Forward every pending byte before `limit` (whole pieces, or a piece's head).
    fn flush(&mut self) -> io::Result<()> {
        while self.at < self.limit {
            let Some(front) = self.pending.front_mut() else {
                break;
            };
            let room = self.limit - self.at;
            let piece = if (front.len() as u64) <= room {
                self.pending.pop_front().unwrap_or_default()
            } else {
                front.split_to(room as usize)
            };
            self.at += piece.len() as u64;
            self.out.put(piece)?;
        }
        Ok(())
    }
}

/// The input as the tar reader reads it: every piece is kept (not copied) until it
/// may go out.
struct Tee<S, K> {
    input: S,
    current: Bytes,
    forward: Rc<RefCell<Forward<K>>>,
}

impl<S: Source, K: Sink> Read for Tee<S, K> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut f = self.forward.borrow_mut();
        while self.current.is_empty() {
            match self.input.next_piece().inspect_err(|_| f.failed = true)? {
                None => return Ok(0),
                Some(p) => {
                    f.pending.push_back(p.clone());
                    self.current = p;
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        f.flush().inspect_err(|_| f.failed = true)?;
        Ok(n)
    }
}

/// Check a tar archive read from `input` ([`archive_pieces`]).
pub fn archive(input: impl Read, marker: &str, out: impl Write) -> Result<usize, Stop> {
    archive_pieces(ReadSource(input), marker, WriteSink(out))
}

/// Check a tar archive as it streams from `input`, forwarding to `out` each entry once
/// its header passed (the input's own pieces: the data is not copied on its way), then
/// the completion entry for `marker` and the end of the archive (whatever followed the
/// archive's own end is read and dropped); the number of entries. On a refusal nothing
/// past the last good entry is forwarded, and no completion entry.
pub fn archive_pieces(input: impl Source, marker: &str, out: impl Sink) -> Result<usize, Stop> {
    let forward = Rc::new(RefCell::new(Forward {
        out,
        pending: VecDeque::new(),
        at: 0,
        limit: 0,
        failed: false,
    }));
    let mut tar = tar::Archive::new(Tee {
        input,
        current: Bytes::new(),
        forward: forward.clone(),
    });
    let mut n = 0;
    let not_tar = |e: io::Error| {
        if forward.borrow().failed {
            Stop::Interrupted
        } else {
            Stop::Refused(format!("not a tar archive: {e}"))
        }
    };
    let checked = (|| {
        for entry in tar.entries().map_err(not_tar)? {
            let entry = entry.map_err(not_tar)?;
            check_entry(&entry).map_err(Stop::Refused)?;
            let end = entry.raw_file_position()
                + entry.size().div_ceil(TAR_BLOCK as u64) * TAR_BLOCK as u64;
            let mut f = forward.borrow_mut();
            f.limit = end;
            f.flush()?;
            n += 1;
        }
        Ok(())
    })();
    if let Err(stop) = checked {
        // What passed goes out (without a completion entry the container drops it).
        let _ = forward.borrow_mut().out.finish();
        return Err(stop);
    }
    if n == 0 {
        return Err(Stop::Refused("the archive is empty".into()));
    }
    // Past the archive's end: read to the end of the input (it must end well), keep
    // none of it.
    let mut rest = tar.into_inner();
    while rest.input.next_piece()?.is_some() {}
    drop(rest);
    let Ok(forward) = Rc::try_unwrap(forward) else {
        unreachable!("the tar reader is gone")
    };
    let mut forward = forward.into_inner();
    forward.flush()?;
    complete(SinkWriter(forward.out), marker)?;
    Ok(n)
}

/// One file of `len` bytes from `input`, named `name` (checked: [`check_file_name`]),
/// as an archive of one entry (mode 0644) written to `out` as it streams, then the
/// completion entry for `marker`. An input shorter or longer than `len` is an
/// interruption (the request's framing said `len`).
pub fn file(
    name: &str,
    len: u64,
    input: impl Read,
    marker: &str,
    out: impl Write,
) -> Result<usize, Stop> {
    check_file_name(name).map_err(Stop::Refused)?;
    let mut b = tar::Builder::new(out);
    let mut data = Counted {
        input: input.take(len),
        n: 0,
    };
    b.append_data(&mut file_header(len), name, &mut data)?;
    // `append_data` pads a short input without a word: what it read is counted.
    if data.n != len {
        return Err(Stop::Interrupted);
    }
    if io::copy(&mut data.input.into_inner(), &mut io::sink())? != 0 {
        return Err(Stop::Interrupted);
    }
    complete_with(b, marker)?;
    Ok(1)
}

/// A reader that counts what it read.
struct Counted<R> {
    input: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.input.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// A regular file's header: `len` bytes, mode 0644.
fn file_header(len: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(len);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// The name of the completion entry for `marker` (in the staging directory's top).
pub fn completion_name(marker: &str) -> String {
    format!(".stockade-complete-{marker}")
}

/// Write the completion entry for `marker` and the end of the archive to `out`.
fn complete(out: impl Write, marker: &str) -> io::Result<()> {
    complete_with(tar::Builder::new(out), marker)
}

fn complete_with<W: Write>(mut b: tar::Builder<W>, marker: &str) -> io::Result<()> {
    b.append_data(&mut file_header(0), completion_name(marker), io::empty())?;
    b.into_inner()?.flush()
}

/// Check every entry of a whole archive in memory; the number of entries.
pub fn check_archive(bytes: &[u8]) -> Result<usize, String> {
    match archive_pieces(ReadSource(bytes), "check", Discard) {
        Ok(n) => Ok(n),
        Err(Stop::Refused(why)) => Err(why),
        Err(Stop::Interrupted) => Err("the archive broke off".into()),
    }
}

/// A tar block: a header's size, and the unit data is padded to.
const TAR_BLOCK: usize = 512;

/// One file as an archive of one entry (mode 0644), named `name` (checked), held
/// whole (the CLI's and the tests' archives; the server streams: [`file`]).
pub fn single_file(name: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    check_file_name(name)?;
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut file_header(bytes.len() as u64), name, bytes)
        .map_err(|e| format!("{name}: {e}"))?;
    b.into_inner().map_err(|e| e.to_string())
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
    fn one_file_is_the_archive_the_builder_writes() {
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
        assert_eq!(check_archive(&a), Ok(1), "a long name");
    }

    /// The entries of an archive: (name, contents).
    fn entries_of(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut a = tar::Archive::new(bytes);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let name = e.path().unwrap().display().to_string();
                let mut data = vec![];
                e.read_to_end(&mut data).unwrap();
                (name, data)
            })
            .collect()
    }

    /// A reader that gives `bytes` in pieces of `piece`, then fails (`broken`) or ends.
    struct Pieces {
        bytes: Vec<u8>,
        at: usize,
        piece: usize,
        broken: bool,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.at == self.bytes.len() {
                return if self.broken {
                    Err(io::Error::other("the body broke off"))
                } else {
                    Ok(0)
                };
            }
            let n = self.piece.min(buf.len()).min(self.bytes.len() - self.at);
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn pieces(bytes: Vec<u8>, piece: usize, broken: bool) -> Pieces {
        Pieces {
            bytes,
            at: 0,
            piece,
            broken,
        }
    }

    #[test]
    fn a_good_archive_streams_through_with_its_completion_entry() {
        use tar::EntryType::*;
        let long = format!("{}/f", "d".repeat(150));
        let mut a = archive(&[
            ("d/", Directory, ""),
            ("d/f", Regular, "x"),
            ("d/l", Symlink, "f"),
        ]);
        a.truncate(a.len() - 2 * TAR_BLOCK);
        a.extend(single_file(&long, &[7u8; 1000]).unwrap());
        // Bytes after the archive's end are read and dropped.
        a.extend_from_slice(b"trailing bytes that are not an entry");
        for piece in [1, 100, 512, 4096, 1 << 20] {
            let mut out = Vec::new();
            let n = archive_stream(&a, piece, &mut out);
            assert_eq!(n, Ok(4), "piece {piece}");
            let got = entries_of(&out);
            let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                ["d/", "d/f", "d/l", long.as_str(), ".stockade-complete-m1"],
                "piece {piece}"
            );
            assert_eq!(got[3].1, vec![7u8; 1000]);
        }
    }

    fn archive_stream(a: &[u8], piece: usize, out: &mut Vec<u8>) -> Result<usize, Stop> {
        super::archive(pieces(a.to_vec(), piece, false), "m1", out)
    }

    /// The input's pieces, and the pieces forwarded.
    struct Given(std::collections::VecDeque<Bytes>);

    impl Source for Given {
        fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
            Ok(self.0.pop_front())
        }
    }

    #[derive(Default)]
    struct Taken(Vec<Bytes>, usize);

    impl Sink for Taken {
        fn put(&mut self, piece: Bytes) -> io::Result<()> {
            self.0.push(piece);
            Ok(())
        }

        fn finish(&mut self) -> io::Result<()> {
            self.1 += 1;
            Ok(())
        }
    }

    /// An upload is not copied on its way (docs/BENCHMARKS.md, upload): an entry's data
    /// goes out as the input's own pieces, the bytes in order and unchanged, whatever the
    /// pieces' sizes.
    #[test]
    fn the_data_goes_out_as_the_input_pieces_not_copies() {
        let data: Vec<u8> = (0..300_000).map(|i| (i % 251) as u8).collect();
        let a = single_file("big.bin", &data).unwrap();
        for piece in [4096, 65_536, 100_000] {
            let given: Vec<Bytes> = a.chunks(piece).map(Bytes::copy_from_slice).collect();
            let mut taken = Taken::default();
            let n = archive_pieces(Given(given.iter().cloned().collect()), "m1", &mut taken);
            assert_eq!(n, Ok(1), "piece {piece}");
            let out: Vec<u8> = taken.0.iter().flat_map(|b| b.iter().copied()).collect();
            let got = entries_of(&out);
            assert_eq!(
                got[0],
                ("big.bin".to_string(), data.clone()),
                "piece {piece}"
            );
            assert_eq!(got[1].0, ".stockade-complete-m1");
            assert!(taken.1 >= 1, "the sink was finished");
            // Every input piece after the first (the header's) went out in place.
            let inside = |b: &Bytes| {
                given.iter().any(|g| {
                    let (s, e) = (g.as_ptr() as usize, g.as_ptr() as usize + g.len());
                    (s..e).contains(&(b.as_ptr() as usize))
                })
            };
            let in_place: usize = taken.0.iter().filter(|b| inside(b)).map(|b| b.len()).sum();
            assert!(
                in_place >= data.len() - piece,
                "piece {piece}: {in_place} of {} bytes forwarded in place",
                data.len()
            );
        }
    }

    #[test]
    fn a_refused_entry_never_goes_out_nor_does_the_completion_entry() {
        use tar::EntryType::*;
        let good = archive(&[("a.txt", Regular, "first")]);
        let first = &good[..1024];
        let a = archive(&[
            ("a.txt", Regular, "first"),
            ("l", Symlink, "/etc/passwd"),
            ("c.txt", Regular, "after"),
        ]);
        for piece in [1, 700, 1 << 20] {
            let mut out = Vec::new();
            let r = archive_stream(&a, piece, &mut out);
            assert!(
                matches!(r, Err(Stop::Refused(ref why)) if why.contains("absolute")),
                "{r:?}"
            );
            assert_eq!(
                out, first,
                "piece {piece}: the good entry only, nothing of the bad one"
            );
        }
    }

    #[test]
    fn a_broken_off_or_truncated_archive_gets_no_completion_entry() {
        use tar::EntryType::*;
        let a = archive(&[("a.txt", Regular, "first"), ("b.txt", Regular, "second")]);
        for cut in [0, 512, 700, 1024, 1536, 2048] {
            let mut out = Vec::new();
            let r = super::archive(pieces(a[..cut].to_vec(), 300, true), "m1", &mut out);
            assert!(r.is_err(), "cut {cut}: {r:?}");
            assert!(
                !String::from_utf8_lossy(&out).contains(".stockade-complete"),
                "cut {cut}"
            );
        }
        // Truncated inside an entry's data, the input ending well: refused.
        let mut out = Vec::new();
        let r = super::archive(pieces(a[..700].to_vec(), 300, false), "m1", &mut out);
        assert!(matches!(r, Err(Stop::Refused(_))), "{r:?}");
        assert!(!String::from_utf8_lossy(&out).contains(".stockade-complete"));
    }

    #[test]
    fn one_file_streams_with_its_completion_entry_and_exactly_its_length() {
        let data: Vec<u8> = (0..5000).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        let r = file(
            "notes/a.bin",
            5000,
            pieces(data.clone(), 999, false),
            "m2",
            &mut out,
        );
        assert_eq!(r, Ok(1));
        let got = entries_of(&out);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0.as_str(), &got[0].1), ("notes/a.bin", &data));
        assert_eq!(got[1].0, ".stockade-complete-m2");
        for (len, broken) in [(5001, false), (4999, false), (5000, true)] {
            let mut out = Vec::new();
            let r = file(
                "a.bin",
                len,
                pieces(data.clone(), 999, broken),
                "m2",
                &mut out,
            );
            assert_eq!(r, Err(Stop::Interrupted), "len {len} broken {broken}");
            assert!(!String::from_utf8_lossy(&out).contains(".stockade-complete"));
        }
        let r = file("../a", 1, pieces(vec![1], 1, false), "m2", &mut Vec::new());
        assert!(matches!(r, Err(Stop::Refused(_))));
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
