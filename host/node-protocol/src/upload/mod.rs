//! An upload's stream, checked: the one checker of uploads, run by the server for its
//! own uploads and by a node for a front that asks it to check (`run-stream`'s
//! `upload`, docs/NODE.md), and the script that unpacks the checked archive inside
//! the container ([`UNPACK`]). [`archive`] is the entry-by-entry check itself (pure).

pub mod archive;

use std::io;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

pub use archive::{MAX_ARCHIVE_BYTES, check_archive, check_dest, check_file_name, single_file};

use stockade_runtime::bindings::{ExecInput, Grant};

/// The size of the chunks that go to the container, and how many wait at once on
/// each of the two hops (body → check, check → container).
pub const CHUNK: usize = 256 << 10;
/// How many chunks wait at once on each hop.
pub const IN_FLIGHT: usize = 4;

/// What is uploaded.
#[derive(Debug, Clone)]
pub enum Upload {
    /// A tar archive, unpacked into `/workspace/<dest>` (`dest` checked).
    Archive {
        /// The destination, relative to `/workspace`.
        dest: String,
    },
    /// One file of `len` bytes (the request's declared length) at `/workspace/<path>`.
    File {
        /// Its path, relative to `/workspace` (checked).
        path: String,
        /// Its length.
        len: u64,
    },
}

/// Check a stream of frames as `what` says ([`archive::archive`] or [`archive::file`],
/// completion entry for `marker`), on a blocking thread, its checked bytes to `out` in
/// chunks of [`CHUNK`]; the number of entries. The one checker of uploads: the
/// server's (`put`) and a node's for a front that asks it to check (`run-stream`'s
/// `upload`, docs/NODE.md: the edge).
pub fn check_stream(
    what: Upload,
    marker: &str,
    input: mpsc::Receiver<Frame>,
    out: mpsc::Sender<Bytes>,
) -> tokio::task::JoinHandle<Result<usize, archive::Stop>> {
    let marker = marker.to_owned();
    tokio::task::spawn_blocking(move || {
        let input = Frames::new(input);
        let out = Chunks::new(out);
        match what {
            Upload::Archive { .. } => archive::archive_pieces(input, &marker, out),
            Upload::File { path, len } => archive::file(
                &path,
                len,
                archive::SourceReader::new(input),
                &marker,
                archive::SinkWriter(out),
            ),
        }
    })
}

/// What the body pump hands the check.
pub enum Frame {
    /// Bytes of the body.
    Data(Bytes),
    /// The body ended well.
    End,
}

/// The body's frames as a blocking [`archive::Source`] (the check's thread): each
/// frame as it came, not copied; a pump that stopped without [`Frame::End`] is an
/// error here.
struct Frames {
    rx: mpsc::Receiver<Frame>,
    ended: bool,
}

impl Frames {
    fn new(rx: mpsc::Receiver<Frame>) -> Self {
        Self { rx, ended: false }
    }
}

impl archive::Source for Frames {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            if self.ended {
                return Ok(None);
            }
            match self.rx.blocking_recv() {
                Some(Frame::Data(b)) if b.is_empty() => continue,
                Some(Frame::Data(b)) => return Ok(Some(b)),
                Some(Frame::End) => self.ended = true,
                None => return Err(io::Error::other("the upload's body broke off")),
            }
        }
    }
}

/// The run's stdin as a blocking [`archive::Sink`]: a piece of at least
/// [`CHUNK`]` / 4` goes as it is (not copied), smaller ones are gathered into chunks
/// of [`CHUNK`] (a body's small frames, headers, one file's writes); a run that
/// stopped reading is a broken pipe.
struct Chunks {
    tx: mpsc::Sender<Bytes>,
    gathered: BytesMut,
}

impl Chunks {
    fn new(tx: mpsc::Sender<Bytes>) -> Self {
        Self {
            tx,
            gathered: BytesMut::new(),
        }
    }

    fn send(&mut self, b: Bytes) -> io::Result<()> {
        self.tx
            .blocking_send(b)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    fn send_gathered(&mut self) -> io::Result<()> {
        if self.gathered.is_empty() {
            return Ok(());
        }
        let b = self.gathered.split().freeze();
        self.send(b)
    }
}

impl archive::Sink for Chunks {
    fn put(&mut self, piece: Bytes) -> io::Result<()> {
        if piece.len() >= CHUNK / 4 {
            self.send_gathered()?;
            return self.send(piece);
        }
        if self.gathered.capacity() - self.gathered.len() < piece.len() {
            self.send_gathered()?;
            self.gathered.reserve(CHUNK);
        }
        self.gathered.extend_from_slice(&piece);
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.send_gathered()
    }
}

/// The script [`command`] runs: unpack into a fresh staging directory; refuse an
/// upload whose completion entry did not arrive (refused, truncated or broken off:
/// [`archive`]); then move what was unpacked into the destination by renames, so the
/// result is what unpacking straight into the destination gives and the bytes are not
/// copied a second time (the copy was most of an upload's time):
/// * a destination that does not exist becomes the staging directory (one rename);
/// * otherwise, before anything is moved, an archive whose file would land where the
///   destination holds a directory is refused (the one conflict `tar` cannot resolve:
///   it replaces a file by a directory, not the reverse); then, directory by
///   directory, what the destination lacks or holds as a file or symlink is renamed
///   over it (`mv -f`: a rename replaces the name, a symlink there is never followed;
///   a directory replacing a file or symlink removes it first, as `tar` does) and a
///   directory both hold is merged the same way, one level down;
/// * a staging tree holding a directory its owner may not write, read or enter (an
///   archive's `0555` directory: moving out of it, or moving it to another parent,
///   fails) is merged by `tar` again, as before: `tar -c | tar -x` (the same result,
///   a copy).
///
/// A tree's Landlock domain grants `REFER` beneath `/` (`supervisor/src/exec/child.rs`), so
/// a rename into another directory of `/workspace` is allowed; where it is not (Landlock
/// ABI 1, or a destination on another mount through a symlink) `mv` copies instead.
/// The staging directory goes on every exit (made writable first: an archive's
/// read-only directory would keep it). `$1` the destination, `$2` the staging
/// directory, `$3` the completion entry's name. Uploads to one key are serialized (the
/// key's lock), so a staging directory an interrupted upload left is removed here.
const UNPACK: &str = include_str!("unpack.sh");

/// The exec that unpacks the streamed archive into `/workspace/<dest>` (made if
/// missing), as the container's user, with an empty grant of its own (no network,
/// whatever the key's network is: an upload is not a command of the consumer's); the
/// archive goes to its stdin from the host. An upload without its completion entry for `marker`, or one that
/// fails, leaves nothing there ([`UNPACK`]).
pub fn command(dest: &str, marker: &str) -> ExecInput {
    ExecInput {
        argv: vec![
            "sh".into(),
            "-c".into(),
            UNPACK.into(),
            "stockade-put".into(),
            format!("/workspace/{dest}"),
            format!("/workspace/.stockade-put-{marker}"),
            archive::completion_name(marker),
        ],
        cwd: None,
        env: vec![],
        timeout_ms: Some(10 * 60 * 1000),
        grant: Some(Grant {
            rules: vec![],
            ask: false,
        }),
        approval: None,
        stdin: None,
    }
}
