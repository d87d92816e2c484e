//! A typed client of the Stockade HTTP API (`docs/openapi.json`): one call per route,
//! requests and answers as `stockade-wire` types, and errors that carry the CLI's exit
//! codes. The CLI, `stockade mcp` and the E2B layer use it; [`pty`] is the terminal
//! session (a WebSocket) `stockade shell` and the E2B layer's PTYs share.
//!
//! Every path segment it sends is percent-encoded (keys, ids, secret names, each
//! segment of an artifact name or a file path): a `?`, `#` or `%` in a name is part of
//! the name, never the start of a query, a fragment or an escape. The server decodes
//! each segment back; names outside the grammar are refused there.
//!
//! Plain HTTP/1.1 over one connection per call, with the bearer token: the server
//! listens on loopback (TLS, if any, is a fronting proxy's). A host that serves the API
//! in the same process gives the client a [`Transport`] instead: the same requests,
//! through the same routes and checks, with no connection at all (the E2B layer in
//! `stockade serve`). The terminal session ([`pty`]) always connects.

#![deny(missing_docs)]

mod encode;
mod error;
pub mod pty;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;
use serde::de::DeserializeOwned;
use stockade_wire::{
    Aborted, Approval, ApprovalBody, Artifact, Artifacts, Checkpointed, CommandBody, Denial,
    Denials, DetachedState, Egress, EgressEvent, ExecOutcome, ExitEvent, Health, SecretBody,
    SecretInfo, Secrets, Started, Stopped, StreamEvent, Uploaded,
};

pub use encode::{path, segment};
pub use error::Error;
pub use pty::{Pty, PtyEvent};

/// Which stream a chunk of live output belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// An answer's body, whatever carried it.
pub type AnswerBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
/// What a [`Transport`] or an answer's body fails with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A [`Transport`]'s answer, to come.
pub type Answer = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<hyper::Response<AnswerBody>, BoxError>> + Send>,
>;

/// What carries one request to the server and its answer back, in place of a new
/// connection: a host serving the API in the same process hands the request to its
/// router (every route, layer and check the connection would have met).
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// Carry `req` (its method, path, headers and body as the client made them).
    fn send(&self, req: hyper::Request<Full<Bytes>>) -> Answer;
}

/// A client of one server, with one token.
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    token: String,
    transport: Option<std::sync::Arc<dyn Transport>>,
}

/// The prefix of every sandbox route: `/v1/sandboxes/KEY`, the key encoded.
fn sandbox(key: &str) -> String {
    format!("/v1/sandboxes/{}", segment(key))
}

impl Client {
    /// A client of the server at `server` (`http://HOST:PORT`) with `token`.
    pub fn new(server: &str, token: impl Into<String>) -> Result<Self, Error> {
        let addr = server
            .strip_prefix("http://")
            .ok_or_else(|| Error::Usage(format!("--server {server:?} must start with http://")))?
            .trim_end_matches('/')
            .to_string();
        Ok(Self {
            addr,
            token: token.into(),
            transport: None,
        })
    }

    /// The same client, its requests carried by `transport` instead of a connection
    /// each (the terminal session still connects to the address).
    pub fn with_transport(mut self, transport: std::sync::Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// The same server with another token (the approver's).
    pub fn with_token(&self, token: impl Into<String>) -> Self {
        Self {
            addr: self.addr.clone(),
            token: token.into(),
            transport: self.transport.clone(),
        }
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Health, Error> {
        self.json("GET", "/v1/health", None::<&()>).await
    }

    /// `POST …/exec`: a fenced command, its whole outcome.
    pub async fn exec(&self, key: &str, cmd: &CommandBody) -> Result<ExecOutcome, Error> {
        self.json("POST", &format!("{}/exec", sandbox(key)), Some(cmd))
            .await
    }

    /// `POST …/exec/stream`: a fenced command whose output goes to `on_output` chunk
    /// by chunk as it arrives; its outcome at the end. An error before the run starts
    /// is the plain answer's; one after, the stream's last event: both are
    /// [`Error::Api`].
    pub async fn exec_stream(
        &self,
        key: &str,
        cmd: &CommandBody,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExitEvent, Error> {
        use base64::Engine as _;
        let body = serde_json::to_vec(cmd).map_err(|e| Error::Usage(e.to_string()))?;
        let resp = self
            .open(
                "POST",
                &format!("{}/exec/stream", sandbox(key)),
                "application/json",
                body,
            )
            .await?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        if !(200..300).contains(&status) {
            let bytes = body
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            return Err(Error::answer(status, &bytes));
        }
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.unreachable(e))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            pending.extend_from_slice(data);
            while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                let ev: StreamEvent = serde_json::from_slice(&line)
                    .map_err(|e| Error::BadAnswer(format!("the server sent a bad event: {e}")))?;
                let (which, chunk) = match ev {
                    StreamEvent::Exit(exit) => return Ok(exit),
                    StreamEvent::Error(e) => {
                        return Err(Error::Api {
                            status: e.status,
                            code: e.error.code,
                            message: e.error.message,
                        });
                    }
                    StreamEvent::Stdout(c) => (Stream::Stdout, c),
                    StreamEvent::Stderr(c) => (Stream::Stderr, c),
                };
                let bytes = match (chunk.data, chunk.data_base64) {
                    (Some(t), _) => t.into_bytes(),
                    (None, Some(b)) => base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .map_err(|e| Error::BadAnswer(format!("a chunk's base64: {e}")))?,
                    (None, None) => continue,
                };
                on_output(which, &bytes);
            }
        }
        Err(self.unreachable("the stream ended before the outcome"))
    }

    /// `POST …/detached`: start a detached process.
    pub async fn start(&self, key: &str, cmd: &CommandBody) -> Result<Started, Error> {
        self.json("POST", &format!("{}/detached", sandbox(key)), Some(cmd))
            .await
    }

    /// `GET …/detached/{id}`.
    pub async fn status(&self, key: &str, id: &str) -> Result<DetachedState, Error> {
        let p = format!("{}/detached/{}", sandbox(key), segment(id));
        self.json("GET", &p, None::<&()>).await
    }

    /// `DELETE …/detached/{id}`.
    pub async fn stop(&self, key: &str, id: &str) -> Result<Stopped, Error> {
        let p = format!("{}/detached/{}", sandbox(key), segment(id));
        self.json("DELETE", &p, None::<&()>).await
    }

    /// `POST …/abort`.
    pub async fn abort(&self, key: &str) -> Result<Aborted, Error> {
        self.json("POST", &format!("{}/abort", sandbox(key)), None::<&()>)
            .await
    }

    /// `POST …/previews`: open a preview door onto `port` of the key's running
    /// container (docs/PREVIEW.md).
    pub async fn expose(&self, key: &str, port: u32) -> Result<stockade_wire::Preview, Error> {
        let body = stockade_wire::ExposeBody { port };
        self.json("POST", &format!("{}/previews", sandbox(key)), Some(&body))
            .await
    }

    /// `DELETE …/previews/{port}`: close the door.
    pub async fn unexpose(&self, key: &str, port: u32) -> Result<stockade_wire::Unexposed, Error> {
        let p = format!("{}/previews/{port}", sandbox(key));
        self.json("DELETE", &p, None::<&()>).await
    }

    /// `GET …/previews`: the key's open doors.
    pub async fn previews(&self, key: &str) -> Result<Vec<stockade_wire::Preview>, Error> {
        let p: stockade_wire::Previews = self
            .json("GET", &format!("{}/previews", sandbox(key)), None::<&()>)
            .await?;
        Ok(p.previews)
    }

    /// `POST …/ensure`: the key's container started if it has none (no command, no
    /// grant).
    pub async fn ensure(&self, key: &str) -> Result<stockade_wire::Ensured, Error> {
        self.json("POST", &format!("{}/ensure", sandbox(key)), None::<&()>)
            .await
    }

    /// `POST …/snapshots`: the key's `/workspace` archived under `name` (its container
    /// started if it has none, and running on).
    pub async fn save_snapshot(
        &self,
        key: &str,
        name: &str,
    ) -> Result<stockade_wire::Snapshot, Error> {
        let body = stockade_wire::SnapshotBody {
            name: name.to_owned(),
        };
        self.json("POST", &format!("{}/snapshots", sandbox(key)), Some(&body))
            .await
    }

    /// `GET …/snapshots`: the key's named snapshots, by name.
    pub async fn snapshots(&self, key: &str) -> Result<Vec<stockade_wire::Snapshot>, Error> {
        let s: stockade_wire::Snapshots = self
            .json("GET", &format!("{}/snapshots", sandbox(key)), None::<&()>)
            .await?;
        Ok(s.snapshots)
    }

    /// `DELETE …/snapshots/{name}`.
    pub async fn delete_snapshot(
        &self,
        key: &str,
        name: &str,
    ) -> Result<stockade_wire::SnapshotDeleted, Error> {
        let p = format!("{}/snapshots/{}", sandbox(key), segment(name));
        self.json("DELETE", &p, None::<&()>).await
    }

    /// `POST …/fork`: `source`'s snapshot `name` becomes the key's restore cache (the
    /// key must have no container); its next container starts from it.
    pub async fn fork(
        &self,
        key: &str,
        source: &str,
        name: &str,
    ) -> Result<stockade_wire::Forked, Error> {
        let body = stockade_wire::ForkBody {
            source: source.to_owned(),
            name: name.to_owned(),
        };
        self.json("POST", &format!("{}/fork", sandbox(key)), Some(&body))
            .await
    }

    /// `GET /v1/sandboxes?prefix=…`: the known keys this token reaches, by key.
    pub async fn sandboxes(&self, prefix: &str) -> Result<Vec<stockade_wire::SandboxInfo>, Error> {
        let p = if prefix.is_empty() {
            "/v1/sandboxes".to_string()
        } else {
            format!("/v1/sandboxes?prefix={}", segment(prefix))
        };
        let l: stockade_wire::SandboxList = self.json("GET", &p, None::<&()>).await?;
        Ok(l.sandboxes)
    }

    /// `GET /v1/sandboxes/{key}`: the key as it is known (404 when it is not).
    pub async fn describe(&self, key: &str) -> Result<stockade_wire::SandboxInfo, Error> {
        self.json("GET", &sandbox(key), None::<&()>).await
    }

    /// `DELETE /v1/sandboxes/{key}`: a known key aborted and forgotten.
    pub async fn forget(&self, key: &str) -> Result<stockade_wire::Forgotten, Error> {
        self.json("DELETE", &sandbox(key), None::<&()>).await
    }

    /// `PUT …/lifetime`: the key's lifetime (exactly one of `ends_at_ms`,
    /// `ends_in_ms`).
    pub async fn set_lifetime(
        &self,
        key: &str,
        body: &stockade_wire::LifetimeBody,
    ) -> Result<stockade_wire::SandboxInfo, Error> {
        self.json("PUT", &format!("{}/lifetime", sandbox(key)), Some(body))
            .await
    }

    /// `DELETE …/lifetime`: the key has none.
    pub async fn clear_lifetime(&self, key: &str) -> Result<stockade_wire::SandboxInfo, Error> {
        self.json("DELETE", &format!("{}/lifetime", sandbox(key)), None::<&()>)
            .await
    }

    /// `PUT …/metadata`: the key's metadata, replaced whole.
    pub async fn set_metadata(
        &self,
        key: &str,
        metadata: std::collections::BTreeMap<String, String>,
    ) -> Result<stockade_wire::SandboxInfo, Error> {
        let body = stockade_wire::MetadataBody { metadata };
        self.json("PUT", &format!("{}/metadata", sandbox(key)), Some(&body))
            .await
    }

    /// `PUT …/network`: the key's network, the grant of its fenced commands that bring
    /// none of their own (a detached process never runs under it).
    pub async fn set_network(
        &self,
        key: &str,
        network: &stockade_wire::GrantBody,
    ) -> Result<stockade_wire::SandboxInfo, Error> {
        self.json("PUT", &format!("{}/network", sandbox(key)), Some(network))
            .await
    }

    /// `DELETE …/network`: the key has no network (its commands that bring no grant
    /// run in a fence with no rules).
    pub async fn clear_network(&self, key: &str) -> Result<stockade_wire::SandboxInfo, Error> {
        self.json("DELETE", &format!("{}/network", sandbox(key)), None::<&()>)
            .await
    }

    /// `POST …/checkpoint`.
    pub async fn checkpoint(&self, key: &str) -> Result<Checkpointed, Error> {
        self.json("POST", &format!("{}/checkpoint", sandbox(key)), None::<&()>)
            .await
    }

    /// `GET …/denials`.
    pub async fn denials(&self, key: &str) -> Result<Vec<Denial>, Error> {
        let d: Denials = self
            .json("GET", &format!("{}/denials", sandbox(key)), None::<&()>)
            .await?;
        Ok(d.denials)
    }

    /// `GET …/egress`.
    pub async fn egress(&self, key: &str) -> Result<Vec<EgressEvent>, Error> {
        let e: Egress = self
            .json("GET", &format!("{}/egress", sandbox(key)), None::<&()>)
            .await?;
        Ok(e.egress)
    }

    /// `GET …/artifacts`.
    pub async fn artifacts(&self, key: &str) -> Result<Vec<Artifact>, Error> {
        let a: Artifacts = self
            .json("GET", &format!("{}/artifacts", sandbox(key)), None::<&()>)
            .await?;
        Ok(a.artifacts)
    }

    /// `GET …/artifacts/{name}`: up to `length` bytes from `offset` (empty: past the
    /// end).
    pub async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u64,
    ) -> Result<Bytes, Error> {
        let p = format!(
            "{}/artifacts/{}?offset={offset}&length={length}",
            sandbox(key),
            path(name)
        );
        self.ok("GET", &p, "application/json", Vec::new()).await
    }

    /// `POST …/approvals` (the approver's token): a token admitting exactly `argv`
    /// once.
    pub async fn approve(&self, key: &str, argv: &[String]) -> Result<Approval, Error> {
        let body = ApprovalBody {
            argv: argv.to_vec(),
        };
        self.json("POST", &format!("{}/approvals", sandbox(key)), Some(&body))
            .await
    }

    /// `PUT …/files/{path}`: one file's bytes to `/workspace/PATH`.
    pub async fn put_file(&self, key: &str, dest: &str, bytes: Vec<u8>) -> Result<Uploaded, Error> {
        let p = format!("{}/files/{}", sandbox(key), path(dest));
        self.upload(&p, bytes).await
    }

    /// `PUT …/files?dest=DIR`: a tar archive unpacked into `/workspace/DIR`.
    pub async fn put_archive(
        &self,
        key: &str,
        dest: &str,
        archive: Vec<u8>,
    ) -> Result<Uploaded, Error> {
        let p = format!("{}/files?dest={}", sandbox(key), path(dest));
        self.upload(&p, archive).await
    }

    /// `GET /v1/egress/pending` (either token), or one key's: the requests `ask`
    /// grants hold for the approver, oldest first.
    pub async fn egress_pending(
        &self,
        key: Option<&str>,
    ) -> Result<Vec<stockade_wire::PendingDecision>, Error> {
        let p = match key {
            Some(k) => format!("{}/egress/pending", sandbox(k)),
            None => "/v1/egress/pending".to_string(),
        };
        let d: stockade_wire::PendingDecisions = self.json("GET", &p, None::<&()>).await?;
        Ok(d.pending)
    }

    /// `POST /v1/egress/pending/{id}` (the approver's token): answer once.
    pub async fn egress_decide(
        &self,
        id: &str,
        decision: stockade_wire::Verdict,
    ) -> Result<stockade_wire::Decided, Error> {
        let body = stockade_wire::VerdictBody { decision };
        self.json(
            "POST",
            &format!("/v1/egress/pending/{}", segment(id)),
            Some(&body),
        )
        .await
    }

    /// `GET /v1/secrets` (the approver's token): names and sources, never values.
    pub async fn secrets(&self) -> Result<Vec<SecretInfo>, Error> {
        let s: Secrets = self.json("GET", "/v1/secrets", None::<&()>).await?;
        Ok(s.secrets)
    }

    /// `PUT /v1/secrets/{name}` (the approver's token).
    pub async fn set_secret(&self, name: &str, body: &SecretBody) -> Result<(), Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Usage(e.to_string()))?;
        let p = format!("/v1/secrets/{}", segment(name));
        self.ok("PUT", &p, "application/json", body).await?;
        Ok(())
    }

    /// `DELETE /v1/secrets/{name}` (the approver's token).
    pub async fn remove_secret(&self, name: &str) -> Result<(), Error> {
        let p = format!("/v1/secrets/{}", segment(name));
        self.ok("DELETE", &p, "application/json", Vec::new())
            .await?;
        Ok(())
    }

    /// `POST /v1/tokens` (the operator's token): a scoped consumer token, shown once.
    pub async fn create_token(
        &self,
        body: &stockade_wire::TokenBody,
    ) -> Result<stockade_wire::TokenCreated, Error> {
        self.json("POST", "/v1/tokens", Some(body)).await
    }

    /// `GET /v1/tokens` (the operator's token).
    pub async fn tokens(&self) -> Result<Vec<stockade_wire::TokenInfo>, Error> {
        let t: stockade_wire::Tokens = self.json("GET", "/v1/tokens", None::<&()>).await?;
        Ok(t.tokens)
    }

    /// `GET /v1/tokens/self` (any consumer token): the keys this client's token reaches.
    pub async fn token_self(&self) -> Result<stockade_wire::TokenSelf, Error> {
        self.json("GET", "/v1/tokens/self", None::<&()>).await
    }

    /// `DELETE /v1/tokens/{id}` (the operator's token).
    pub async fn revoke_token(&self, id: &str) -> Result<stockade_wire::Revoked, Error> {
        let p = format!("/v1/tokens/{}", segment(id));
        self.json("DELETE", &p, None::<&()>).await
    }

    async fn upload(&self, path: &str, bytes: Vec<u8>) -> Result<Uploaded, Error> {
        let body = self
            .ok("PUT", path, "application/octet-stream", bytes)
            .await?;
        parse(&body)
    }

    /// A JSON call: `body` serialized, the 2xx answer parsed as `T`.
    async fn json<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, Error> {
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| Error::Usage(e.to_string()))?,
            None => Vec::new(),
        };
        let bytes = self.ok(method, path, "application/json", body).await?;
        parse(&bytes)
    }

    /// One call whose answer must be a 2xx: its body; any other status is
    /// [`Error::Api`] with the server's code.
    async fn ok(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Bytes, Error> {
        let resp = self.open(method, path, content_type, body).await?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.unreachable(e))?
            .to_bytes();
        if !(200..300).contains(&status) {
            return Err(Error::answer(status, &bytes));
        }
        Ok(bytes)
    }

    /// Send one request (on a new connection, or by the client's [`Transport`]); the
    /// response with its body unread.
    async fn open(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<hyper::Response<AnswerBody>, Error> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.addr)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Error::Usage(e.to_string()))?;
        if let Some(t) = &self.transport {
            return t.send(req).await.map_err(|e| self.unreachable(e));
        }
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.unreachable(e))?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| self.unreachable(e))?;
        tokio::spawn(conn);
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> Error {
        Error::Unreachable(format!(
            "cannot reach the server at http://{}: {e}",
            self.addr
        ))
    }
}

/// A 2xx answer's body as `T`.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::BadAnswer(format!("the server answered unexpected JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback server that answers one request with `answer` (status line, headers,
    /// body) and hands back the request's head as it arrived.
    async fn one_answer(answer: String) -> (Client, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request's head");
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        let c = Client::new(&format!("http://{addr}"), "t0ken").unwrap();
        (c, served)
    }

    fn http(status: &str, content_type: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn an_artifact_name_is_sent_as_encoded_segments_with_its_own_query() {
        let (c, served) = one_answer(http("200 OK", "application/octet-stream", "right")).await;
        let got = c.read_artifact("k", "dir x/a?b#c%", 7, 9).await.unwrap();
        assert_eq!(&got[..], b"right");
        let head = served.await.unwrap();
        let line = head.lines().next().unwrap();
        assert_eq!(
            line,
            "GET /v1/sandboxes/k/artifacts/dir%20x/a%3Fb%23c%25?offset=7&length=9 HTTP/1.1"
        );
        assert!(head.contains("authorization: Bearer t0ken"), "{head}");
    }

    #[tokio::test]
    async fn a_key_or_an_id_is_one_segment() {
        let body = r#"{"state":"exited","code":3}"#;
        let (c, served) = one_answer(http("200 OK", "application/json", body)).await;
        let st = c.status("../k", "i/d?x").await.unwrap();
        assert_eq!(st, DetachedState::Exited { code: 3 });
        let head = served.await.unwrap();
        assert!(
            head.starts_with("GET /v1/sandboxes/..%2Fk/detached/i%2Fd%3Fx HTTP/1.1"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_stream_delivers_chunks_and_its_error_event_is_a_typed_error() {
        let ndjson = concat!(
            "{\"type\":\"stdout\",\"data\":\"hi\\n\"}\n",
            "{\"type\":\"stderr\",\"data_base64\":\"/w==\"}\n",
            "{\"type\":\"error\",\"status\":502,\"error\":{\"code\":\"unreachable\",\"message\":\"gone\"}}\n",
        );
        let (c, _served) = one_answer(http("200 OK", "application/x-ndjson", ndjson)).await;
        let mut chunks = vec![];
        let e = c
            .exec_stream("k", &CommandBody::default(), |s, b| {
                chunks.push((s, b.to_vec()))
            })
            .await
            .unwrap_err();
        assert_eq!(
            chunks,
            [
                (Stream::Stdout, b"hi\n".to_vec()),
                (Stream::Stderr, vec![0xff])
            ]
        );
        assert_eq!(e.code(), Some(&stockade_wire::ErrorCode::Unreachable));
        assert_eq!(e.exit_code(), 69);
        assert_eq!(e.to_string(), "unreachable (HTTP 502): gone");
    }

    #[tokio::test]
    async fn a_refused_call_carries_the_servers_code_and_the_clis_exit_code() {
        let body = r#"{"error":{"code":"needs-approval","message":"git push is a floor command"}}"#;
        let (c, _served) = one_answer(http("403 Forbidden", "application/json", body)).await;
        let e = c.exec("k", &CommandBody::default()).await.unwrap_err();
        assert_eq!(e.exit_code(), 77);
        assert_eq!(
            e.to_string(),
            "needs-approval (HTTP 403): git push is a floor command"
        );
    }
}
