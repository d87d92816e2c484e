//! The host's side of the process API: a small pool of connections to one supervisor
//! (the status path is hot; a connect per call would dominate it).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{Request, Response};
use crate::substrate::SubstrateError;

const POOL: usize = 4;

/// Connections to one supervisor.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    idle: Mutex<Vec<BufReader<UnixStream>>>,
}

impl Client {
    /// A client for the supervisor listening at `path`.
    pub fn new(path: PathBuf) -> Client {
        Client {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Send one request and wait up to `timeout` for its answer. Any transport failure
    /// is `Unreachable` (the connection is dropped, never reused).
    pub async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, SubstrateError> {
        let unreachable = |e: String| SubstrateError::Unreachable(format!("supervisor: {e}"));
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => BufReader::new(
                UnixStream::connect(&self.path)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?,
            ),
        };
        let mut line =
            serde_json::to_vec(req).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let exchange = async {
            conn.get_mut().write_all(&line).await?;
            let mut answer = String::new();
            if conn.read_line(&mut answer).await? == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            Ok(answer)
        };
        let answer = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable(format!("no answer within {timeout:?}"))),
        };
        let resp = serde_json::from_str(&answer)
            .map_err(|e| SubstrateError::Failed(format!("bad answer: {e}")))?;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL {
            idle.push(conn);
        }
        Ok(resp)
    }
}
