//! envd's HTTP routes: `/health`, and `/files` (read, write), every path mapped into
//! the sandbox's `/workspace` ([`super::ids::workspace_path`]; anything else is a 400
//! before any call).
//!
//! * **Write** (`POST /files?path=P`, the SDK's multipart form, or an
//!   `application/octet-stream` body) is Stockade's `PUT …/files/{path}`: the file
//!   lands owned by the sandbox's user, through the API's own checks.
//! * **Read** (`GET /files?path=P`) is a fenced exec with no grant of `cat` on that one
//!   file (its path an argument, never part of a script), after a check that it is a
//!   regular file of at most [`READ_LIMIT`] bytes (the API's output bound per stream):
//!   a larger file is refused, never cut short.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use stockade_wire::CommandBody;

use super::connect::Code;
use super::{E2b, E2bError, ids};

/// The largest file a read returns: the API's default output bound per stream
/// (`output_limit`), so a read is one exec's whole output, never a truncated one.
pub const READ_LIMIT: u64 = 1 << 20;

/// The read's script: `$1` is the path. Exit 44: no such file; 45: not a regular
/// file; 46: larger than `$2` bytes.
const READ_SCRIPT: &str = r#"[ -e "$1" ] || exit 44
[ -f "$1" ] || exit 45
n=$(wc -c < "$1") || exit 1
[ "$n" -le "$2" ] || exit 46
exec cat -- "$1""#;

/// `?path=&username=` (the username is ignored: a sandbox has one user).
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
}

/// The sandbox of an envd HTTP call, as its routes answer a refusal.
fn sandbox(e: &E2b, h: &HeaderMap) -> Result<(String, super::Sandbox), E2bError> {
    super::process::sandbox_of(e, h)
        .map(|(token, _, s)| (token, s))
        .map_err(|err| {
            let status = match err.code {
                Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                _ => StatusCode::NOT_FOUND,
            };
            E2bError::new(status, err.message)
        })
}

fn path_of(q: &FileQuery) -> Result<(String, String), E2bError> {
    let p = q
        .path
        .as_deref()
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "path is required"))?;
    let rel = ids::workspace_path(p).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    Ok((p.to_string(), rel))
}

/// `GET /health`: 204 for a sandbox of the caller's (its container starts on its first
/// call); 502 for one that is not, or not the caller's, as E2B's proxy answers a
/// sandbox it does not find (the SDK's `is_running()` is then false).
pub async fn health(State(e): State<Arc<E2b>>, h: HeaderMap) -> Result<StatusCode, E2bError> {
    match sandbox(&e, &h) {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(err) if err.status == StatusCode::NOT_FOUND => {
            Err(E2bError::new(StatusCode::BAD_GATEWAY, err.message))
        }
        Err(err) => Err(err),
    }
}

/// `GET /files?path=P`: the file's bytes.
pub async fn read(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Query(q): Query<FileQuery>,
) -> Result<Response, E2bError> {
    let (token, s) = sandbox(&e, &h)?;
    let (path, rel) = path_of(&q)?;
    let abs = format!("{}/{rel}", ids::WORKSPACE);
    let cmd = CommandBody {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            READ_SCRIPT.into(),
            "read".into(),
            abs,
            READ_LIMIT.to_string(),
        ],
        timeout_ms: Some(60_000),
        // An empty grant of its own, not the key's network: nothing leaves the sandbox.
        grant: Some(stockade_wire::GrantBody::default()),
        ..Default::default()
    };
    let out = e
        .client(&token)
        .exec(&s.key, &cmd)
        .await
        .map_err(E2bError::of_client)?;
    match out.exit_code {
        0 if !out.truncated => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&out.stdout_base64)
                .map_err(|x| E2bError::new(StatusCode::BAD_GATEWAY, x.to_string()))?;
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
        }
        44 => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("path '{path}' does not exist"),
        )),
        45 => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("path '{path}' is not a file"),
        )),
        46 | 0 => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("path '{path}' is larger than {READ_LIMIT} bytes, the most a read returns"),
        )),
        n => Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading '{path}' failed (exit {n}): {}", out.stderr.trim()),
        )),
    }
}

/// `POST /files?path=P`: one file, from the SDK's multipart form (its first part) or
/// an octet-stream body.
pub async fn write(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Query(q): Query<FileQuery>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let (token, s) = sandbox(&e, &h)?;
    let (path, rel) = path_of(&q)?;
    let ctype = super::header(&h, "content-type").unwrap_or("application/octet-stream");
    let bytes = if ctype.starts_with("multipart/form-data") {
        multipart_first(ctype, &body)
            .map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?
            .to_vec()
    } else if ctype.starts_with("application/octet-stream") {
        body.to_vec()
    } else {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("{ctype}: a write is multipart/form-data or application/octet-stream"),
        ));
    };
    e.client(&token)
        .put_file(&s.key, &rel, bytes)
        .await
        .map_err(E2bError::of_client)?;
    let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
    Ok(axum::Json(json!([{"name": name, "type": "file", "path": path}])).into_response())
}

/// The body of a multipart form's first part (pure). One part is all a single-file
/// write sends; a form of several (`write_files`) is refused rather than half-written.
pub fn multipart_first<'a>(content_type: &str, body: &'a [u8]) -> Result<&'a [u8], String> {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"'))
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or("multipart: no boundary")?;
    let delim = format!("--{boundary}");
    let start = find(body, delim.as_bytes()).ok_or("multipart: no first boundary")?;
    let after = &body[start + delim.len()..];
    let after = after
        .strip_prefix(b"\r\n")
        .ok_or("multipart: a bad boundary line")?;
    // A part's headers end at a blank line; a part without headers starts with it.
    let content = match after.strip_prefix(b"\r\n") {
        Some(c) => c,
        None => {
            let head_end =
                find(after, b"\r\n\r\n").ok_or("multipart: a part without headers' end")?;
            &after[head_end + 4..]
        }
    };
    let close = format!("\r\n{delim}");
    let end = find(content, close.as_bytes()).ok_or("multipart: a part without its end")?;
    let rest = &content[end + close.len()..];
    if !rest.starts_with(b"--") {
        return Err("multipart: more than one part (one file per write here)".into());
    }
    Ok(&content[..end])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forms_one_part_is_the_file() {
        let ct = "multipart/form-data; boundary=xyz";
        let one = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhi\r\n--xyz--\r\n";
        let two = b"--xyz\r\n\r\na\r\n--xyz\r\n\r\nb\r\n--xyz--\r\n";
        let empty = b"--xyz\r\nX: y\r\n\r\n\r\n--xyz--\r\n";
        type Case<'a> = (&'a str, &'a str, &'a [u8], Option<&'a [u8]>);
        let cases: &[Case] = &[
            ("one part", ct, one, Some(b"hi")),
            (
                "quoted boundary",
                "multipart/form-data; boundary=\"xyz\"",
                one,
                Some(b"hi"),
            ),
            ("an empty file", ct, empty, Some(b"")),
            ("two parts", ct, two, None),
            ("no boundary", "multipart/form-data", one, None),
            (
                "another boundary",
                "multipart/form-data; boundary=abc",
                one,
                None,
            ),
            ("cut short", ct, &one[..40], None),
            ("nothing", ct, b"", None),
        ];
        for (what, ct, body, want) in cases {
            assert_eq!(multipart_first(ct, body).ok(), *want, "{what}");
        }
    }
}
