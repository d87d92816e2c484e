//! Files in (docs/DESIGN.md §2): a tar archive, or one file, into a key's `/workspace`,
//! streamed from the request's body to the container's `tar`.
//!
//! Decision: the archive is unpacked **inside the container**, by the container's own
//! `tar` running as the container's unprivileged user: an ordinary fenced exec with no
//! grant, the archive on its stdin. So an upload is serialized with the key's other
//! mutating calls (the key's lock), is owned by the container's user, counts against
//! the container's disk cap (a full disk fails the upload, not the host), and can write
//! nothing the container itself could not: the boundary is the container's, not a host
//! unpacker's. The archive does not cross the guest (whose stdin is bounded at 16 MiB):
//! the host hands it to the run as a stream ([`ExecIo::stdin`]), which the linux
//! substrate writes into a pipe whose read end the supervisor got with the request
//! (`substrate::linux::handoff`).
//!
//! The stream: the body's frames go to a checker ([`archive`]) on a blocking thread,
//! which forwards each entry once its header passed, then a completion entry; the
//! chunks go to the run's stdin. Three bounded channels between them: the server holds
//! a few chunks of an upload, whatever its size (a 96 MiB upload: see the e2e test
//! `upload::a_large_upload_streams_through_the_server`). At most
//! [`MAX_CONCURRENT_UPLOADS`] per server (429 past it); a body that stalls for
//! [`BODY_IDLE`] is broken off.
//!
//! Failure leaves nothing: `tar` unpacks into a staging directory
//! (`/workspace/.stockade-put-<id>`), and only an unpack that saw the completion entry
//! (which a refused, truncated or broken-off upload never gets) and succeeded is merged
//! into the destination (same result as unpacking there directly), after a check that
//! no file lands where the destination holds a directory. The merge renames (it
//! copied, by `tar` again, and the copy was most of an upload's time): a new
//! destination is the staging directory renamed, an existing one gets each name it
//! lacks renamed in and each directory both hold merged one level down ([`UNPACK`]).
//! The staging directory is removed on every exit, and any an interrupted upload left
//! is removed by the key's next one. An upload takes its size of the container's disk
//! once (the renames move, they do not copy; the `tar` copy that is left, for a tree
//! with read-only directories, takes it twice while it runs). A merge that fails
//! half-way (a rename refused by the destination's own permissions) can leave part of
//! it. While its body streams, an upload holds its key (the run's timeout, ten
//! minutes, bounds it; [`BODY_IDLE`] bounds a stalled client).
//! Files leave the other way (docs/DESIGN.md §2.1): by being written to `/artifacts`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use stockade_node_protocol::upload::IN_FLIGHT;
pub use stockade_node_protocol::upload::{
    Frame, MAX_ARCHIVE_BYTES, Upload, archive, check_archive, check_dest, check_file_name,
    check_stream, command, single_file,
};

use stockade_runtime::bindings::FacadeError;
use stockade_runtime::runtime::{CallError, ExecIo, Runtime};
use stockade_runtime::substrate::StdinStream;

/// Most uploads one server streams at once: one past it is a 429 `uploads-busy`,
/// before its body is read.
pub const MAX_CONCURRENT_UPLOADS: usize = 4;

/// A body that sends nothing for this long is broken off (the upload holds its key).
pub const BODY_IDLE: Duration = Duration::from_secs(60);

/// An upload that went in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    /// Where: `/workspace/<dest>`.
    pub dest: String,
    /// How many entries.
    pub entries: usize,
}

/// Why an upload did not go in (nothing of it did).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The body is larger than [`MAX_ARCHIVE_BYTES`].
    #[error("an upload takes at most {MAX_ARCHIVE_BYTES} bytes")]
    TooLarge,
    /// The body broke off, or stalled.
    #[error("{0}")]
    Body(String),
    /// The archive is refused.
    #[error("{0}")]
    Refused(String),
    /// The sandbox's node could not be reached while the upload ran (it died, or the
    /// connection to it was lost): the cause, for the log (it names the node's calls).
    #[error(
        "the upload did not complete: the sandbox's node could not be reached (nothing was written)"
    )]
    Unreachable(String),
    /// The facade call failed.
    #[error(transparent)]
    Call(CallError),
    /// `tar` in the container failed: its exit code and stderr.
    #[error("tar in the container exited {0}: {1}")]
    Unpack(i32, String),
}

impl From<CallError> for Failure {
    /// A node that cannot be reached is said in the user's terms ([`Failure::Unreachable`]):
    /// the call's own text names the node protocol's calls (`run: …`).
    fn from(e: CallError) -> Self {
        match e {
            CallError::Facade(FacadeError::Unreachable(why)) => Failure::Unreachable(why),
            e => Failure::Call(e),
        }
    }
}

/// Stream `body` into the key's `/workspace` as `what` says.
pub async fn put(
    runtime: &Arc<Runtime>,
    key: &str,
    what: Upload,
    body: axum::body::Body,
) -> Result<Put, Failure> {
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let dest = match &what {
        Upload::Archive { dest } => dest.clone(),
        Upload::File { .. } => String::new(),
    };
    let (body_tx, body_rx) = mpsc::channel(IN_FLIGHT);
    let (stdin_tx, stdin_rx) = mpsc::channel(IN_FLIGHT);
    let check = check_stream(what, &marker, body_rx, stdin_tx);
    let io = ExecIo {
        stdin: Some(StdinStream::new(stdin_rx)),
        ..ExecIo::default()
    };
    let unpack = command(&dest, &marker);
    let (pumped, ran) = tokio::join!(pump(body, body_tx), runtime.exec_with(key, &unpack, io));
    let checked = check
        .await
        .map_err(|e| Failure::Body(format!("the upload's check failed: {e}")))?;
    // The first cause wins: the body, then the archive, then the run.
    pumped?;
    let entries = match checked {
        Ok(n) => Some(n),
        Err(archive::Stop::Refused(why)) => return Err(Failure::Refused(why)),
        // The container stopped reading: its run says why.
        Err(archive::Stop::Interrupted) => None,
    };
    let out = ran?;
    match entries {
        Some(entries) if out.exit_code == 0 => Ok(Put {
            dest: format!("/workspace/{dest}"),
            entries,
        }),
        _ => Err(Failure::Unpack(
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}

/// Read `body` frame by frame into `tx`, at most [`MAX_ARCHIVE_BYTES`], each frame
/// within [`BODY_IDLE`]; the end is said (`Frame::End`), so a pump that stops
/// otherwise (its error, or its drop) is never taken for the end of the archive. A
/// check that stopped reading ends the pump without an error (the check says why).
async fn pump(mut body: axum::body::Body, tx: mpsc::Sender<Frame>) -> Result<(), Failure> {
    use http_body_util::BodyExt as _;
    let mut total = 0usize;
    loop {
        let frame = match tokio::time::timeout(BODY_IDLE, body.frame()).await {
            Err(_) => {
                return Err(Failure::Body(format!(
                    "the upload's body sent nothing for {}s",
                    BODY_IDLE.as_secs()
                )));
            }
            Ok(None) => {
                let _ = tx.send(Frame::End).await;
                return Ok(());
            }
            Ok(Some(Err(e))) => return Err(Failure::Body(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len();
        if total > MAX_ARCHIVE_BYTES {
            return Err(Failure::TooLarge);
        }
        if tx.send(Frame::Data(data)).await.is_err() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_cut_by_its_node_says_so_in_the_users_terms() {
        let cut = CallError::Facade(FacadeError::Unreachable(
            "node node-1: run: Network connection lost".into(),
        ));
        let f = Failure::from(cut);
        assert!(
            matches!(&f, Failure::Unreachable(why) if why.contains("Network connection lost")),
            "{f:?}"
        );
        assert_eq!(
            f.to_string(),
            "the upload did not complete: the sandbox's node could not be reached (nothing was written)"
        );
        let other = Failure::from(CallError::Facade(FacadeError::Failed("x".into())));
        assert!(matches!(other, Failure::Call(_)), "{other:?}");
    }
}
