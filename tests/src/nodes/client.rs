//! A node's API as a test calls it directly: each request signed with the node's
//! secret (`stockade_node_protocol::auth`), its certificate pinned (nothing else trusted).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stockade_node_protocol::auth;

use super::connect;

/// A signed, pinned client of one node's API.
#[derive(Clone)]
pub struct NodeClient {
    addr: SocketAddr,
    secret: Vec<u8>,
    tls: Arc<rustls::ClientConfig>,
}

impl NodeClient {
    /// From the node's certificate (PEM) and secret files.
    pub fn from_files(addr: SocketAddr, cert: &Path, secret: &Path) -> std::io::Result<NodeClient> {
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_file(cert)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", cert.display())))?;
        let secret = std::fs::read_to_string(secret)?.trim().as_bytes().to_vec();
        // The front's own pinning (only this certificate, signatures checked).
        let tls = stockade_remote::client::pinned_config(der.into_owned())
            .map_err(std::io::Error::other)?;
        Ok(NodeClient {
            addr,
            secret,
            tls: Arc::new(tls),
        })
    }

    /// `POST /node/v1/{call}` for `key` ("" node-wide) with `body`, signed now with a
    /// fresh nonce: (status, body). An error: no answer (connect, TLS, reset).
    pub fn call(&self, call: &str, key: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let path = format!("{}{call}", stockade_node_protocol::PREFIX);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(std::io::Error::other)?
            .as_millis() as u64;
        let nonce = auth::nonce();
        let signed = auth::Signed {
            time_ms: now,
            nonce: &nonce,
            method: "POST",
            path: &path,
            key,
            idempotency: "",
            body,
        };
        let sig = signed.sign(&self.secret);
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: stockade-node\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}: {now}\r\n{}: {nonce}\r\n{}: {key}\r\n{}: {sig}\r\n\r\n",
            body.len(),
            auth::TIME_HEADER,
            auth::NONCE_HEADER,
            auth::KEY_HEADER,
            auth::SIGNATURE_HEADER,
        )
        .into_bytes();
        req.extend_from_slice(body);
        let tcp = connect(self.addr, Duration::from_secs(3))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
        let server = rustls_pki_types::ServerName::try_from("stockade-node")
            .map_err(std::io::Error::other)?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), server)
            .map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(&req)?;
        tls.flush()?;
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw) {
            Ok(_) => {}
            // A peer that closes without close_notify after a full answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(e),
        }
        parse_response(&raw)
    }

    /// The node's `open-grants`: container ids with a grant open.
    pub fn open_grants(&self) -> std::io::Result<Vec<String>> {
        let (status, body) = self.call(stockade_node_protocol::call::OPEN_GRANTS, "", b"{}")?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| std::io::Error::other(format!("open-grants {status}: {e}")))?;
        match (status, v.get("ok").and_then(|o| o.as_array())) {
            (200, Some(ids)) => Ok(ids
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect()),
            _ => Err(std::io::Error::other(format!(
                "open-grants answered {status}: {v}"
            ))),
        }
    }
}

/// (status, de-chunked body) of a whole HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let bad = |m: &str| std::io::Error::other(format!("bad response: {m}"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let nl = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("a chunk size line"))?;
        let size_text = String::from_utf8_lossy(&body[..nl]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("a chunk size"))?;
        body = &body[nl + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        if body.len() < size + 2 {
            return Err(bad("a short chunk"));
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_parsed_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(parse_response(plain).unwrap(), (200, b"ok".to_vec()));
        let chunked =
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (401, b"abcde".to_vec()));
        assert!(parse_response(b"HTTP/1.1 200").is_err());
    }
}
