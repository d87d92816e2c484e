//! The host's side of the process API: a small pool of connections to one supervisor
//! (the status path is hot; a connect per call would dominate it).
//!
//! Every new connection checks who listens at the other end (`SO_PEERCRED`: the
//! credentials of the process that called `listen`): the container's supervisor, its
//! pid and its host uid, or the connection is refused. The socket lives outside every
//! container's view; the check is the second wall.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::kill;
use super::protocol::{Request, Response};
use stockade_runtime::substrate::SubstrateError;

/// Idle connections kept per supervisor. Each holds one of its workers, so fewer than
/// it has: the rest serve calls, and a call beyond them waits for a busy connection to
/// end (dropped when the pool is full) rather than for ever.
const POOL: usize = 4;
const _: () = assert!(POOL < stockade_supervisor::pid1::WORKERS);

/// Who must be listening: the supervisor's pid (host PID namespace) and host uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The supervisor's pid.
    pub pid: i32,
    /// Its host uid (the container's root).
    pub uid: u32,
}

/// Connections to one supervisor.
#[derive(Debug)]
pub struct Client {
    /// The container's id (for the degradation lines the supervisor reports).
    container: String,
    path: PathBuf,
    peer: Peer,
    idle: Mutex<Vec<BufReader<UnixStream>>>,
}

impl Client {
    /// A client for container `container`'s supervisor `peer` listening at `path`.
    pub fn new(container: &str, path: PathBuf, peer: Peer) -> Client {
        Client {
            container: container.to_string(),
            path,
            peer,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Forget the idle connections.
    pub fn drop_idle(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    async fn connect(&self) -> Result<UnixStream, SubstrateError> {
        let conn = UnixStream::connect(&self.path)
            .await
            .map_err(|e| SubstrateError::Unreachable(format!("supervisor: {e}")))?;
        let cred = conn
            .peer_cred()
            .map_err(|e| SubstrateError::Failed(format!("supervisor credentials: {e}")))?;
        let seen = Peer {
            pid: cred.pid().unwrap_or(-1),
            uid: cred.uid(),
        };
        if seen != self.peer {
            return Err(SubstrateError::Failed(format!(
                "the supervisor socket is held by pid {} uid {}, not the container's supervisor (pid {} uid {})",
                seen.pid, seen.uid, self.peer.pid, self.peer.uid
            )));
        }
        Ok(conn)
    }

    /// Send one request and wait up to `timeout` for its answer. Any transport failure
    /// is `Unreachable` (the connection is dropped, never reused). A degradation the
    /// answer reports is logged here, the one canonical line for it.
    pub async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, SubstrateError> {
        self.call_with(req, None, timeout, |_| {}).await
    }

    /// [`Client::call`], with `fd` sent along with the request (a run's stdin pipe:
    /// [`super::handoff`]), handing every `output` frame that comes before the answer
    /// to `on_output` (a streaming run). Dropping the future drops the connection: the
    /// supervisor's next frame then fails, and it kills the run.
    pub async fn call_with(
        &self,
        req: &Request,
        fd: Option<OwnedFd>,
        timeout: Duration,
        mut on_output: impl FnMut(Response) + Send,
    ) -> Result<Response, SubstrateError> {
        let unreachable = |e: String| SubstrateError::Unreachable(format!("supervisor: {e}"));
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => BufReader::with_capacity(256 * 1024, self.connect().await?),
        };
        // Sized up front: a run's stdin (an upload's archive) is written once, as
        // base64, with no doubling of the buffer as it grows (docs/SECURITY.md, "Uploads").
        let stdin_len = match req {
            Request::Run { spec, .. } | Request::Start { spec } => spec.stdin.len(),
            _ => 0,
        };
        let mut line = Vec::with_capacity(stdin_len.div_ceil(3) * 4 + 4096);
        serde_json::to_writer(&mut line, req)
            .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let exchange = async {
            let mut sent = 0;
            if let Some(fd) = &fd {
                let sock = conn.get_ref();
                sent = loop {
                    sock.writable().await?;
                    match sock.try_io(tokio::io::Interest::WRITABLE, || {
                        super::handoff::send(sock.as_fd(), &line, fd.as_fd())
                    }) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        r => break r?,
                    }
                };
            }
            conn.get_mut().write_all(&line[sent..]).await?;
            // The supervisor holds its own copy of the descriptor now.
            drop(fd);
            loop {
                let mut answer = String::new();
                if conn.read_line(&mut answer).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                }
                match serde_json::from_str::<Response>(&answer) {
                    Ok(frame @ Response::Output { .. }) => on_output(frame),
                    Ok(resp) => return Ok(Ok(resp)),
                    Err(e) => return Ok(Err(e)),
                }
            }
        };
        let resp = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(Ok(r))) => r,
            Ok(Ok(Err(e))) => return Err(SubstrateError::Failed(format!("bad answer: {e}"))),
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable(format!("no answer within {timeout:?}"))),
        };
        for what in resp.degraded() {
            kill::log_supervisor_degradation(&self.container, what);
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL {
            idle.push(conn);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_held_by_another_process_is_refused() {
        let dir = std::env::temp_dir().join(format!("stockade-peer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sup.sock");
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        let me = Peer {
            pid: std::process::id() as i32,
            uid: rustix::process::geteuid().as_raw(),
        };
        // The listener is this process: a client expecting another pid refuses it.
        let other = Client::new("c", path.clone(), Peer { pid: 1, ..me });
        let err = other
            .call(&Request::Ping, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, SubstrateError::Failed(m) if m.contains("not the container's supervisor")),
            "{err:?}"
        );
        let wrong_uid = Client::new(
            "c",
            path.clone(),
            Peer {
                uid: me.uid + 1,
                ..me
            },
        );
        assert!(
            wrong_uid
                .call(&Request::Ping, Duration::from_secs(1))
                .await
                .is_err()
        );
        // The right peer gets through to the exchange (which times out: nobody answers).
        let right = Client::new("c", path, me);
        assert!(matches!(
            right.call(&Request::Ping, Duration::from_millis(50)).await,
            Err(SubstrateError::Unreachable(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
