//! `stockade mcp`: the Model Context Protocol over stdio, so a coding agent uses a
//! Stockade sandbox directly. A client of the HTTP API, like the CLI (same server,
//! same token): every tool is one API call, and every check the server makes stays
//! the server's.
//!
//! Transport: newline-delimited JSON-RPC 2.0 on stdin/stdout; logs go to stderr.
//! Lifecycle: `initialize` (the handshake revisions 2024-11-05 … 2025-11-25; the
//! client's revision is echoed if known, else the newest), `notifications/initialized`,
//! `ping`, `tools/list`, `tools/call`. Tools: `exec`, `start`, `status`, `stop`,
//! `denials`, `egress`, `artifacts`, `put`. Their input schemas are built from
//! `docs/openapi.json` (the command's constraints exactly as the API states them),
//! plus the key and the ids. A tool whose call the server refuses answers
//! `isError: true` with the server's code and message (the model can read and fix
//! it); a request that is not a valid JSON-RPC call gets a JSON-RPC error.
//!
//! Decided: a command's non-zero exit is a result, not a tool error (`isError`
//! false; the exit code is in the text and the structured content). Every call goes
//! through `stockade-client` (the CLI's client: typed answers, every path segment
//! percent-encoded) with a key that passed the shared grammar: a model's `key` cannot
//! reach another route. Texts come from `crate::render`, as the CLI's do.

use base64::Engine as _;
use serde_json::{Value, json};
use stockade_client::Client;
use stockade_wire::{Artifacts, CommandBody, Denials, Egress};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::render;

/// The handshake revisions this server speaks, oldest to newest.
pub const PROTOCOL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// The revision to answer a client that asked for `requested` (pure).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == requested)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.len() - 1])
}

/// Replace every `{"$ref": "#/components/schemas/X"}` in `v` by X itself.
fn inline_refs(v: &mut Value, schemas: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                let mut target = schemas[name].clone();
                inline_refs(&mut target, schemas);
                *v = target;
                return;
            }
            for x in m.values_mut() {
                inline_refs(x, schemas);
            }
        }
        Value::Array(a) => {
            for x in a {
                inline_refs(x, schemas);
            }
        }
        _ => {}
    }
}

/// The tools with their exact input schemas.
pub fn tools() -> Value {
    let doc: Value = serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON");
    let schemas = &doc["components"]["schemas"];
    let param = |path: &str, name: &str| -> Value {
        doc["paths"][path]["parameters"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .map(|p| p["schema"].clone())
            .unwrap_or_else(|| panic!("openapi: no parameter {name} on {path}"))
    };
    let key = {
        let mut k = param("/v1/sandboxes/{key}/exec", "key");
        k["description"] = json!("The sandbox: one container and its records per key");
        k
    };
    let id = param("/v1/sandboxes/{key}/detached/{id}", "id");
    let mut command = schemas["Command"].clone();
    inline_refs(&mut command, schemas);
    let mut detached = schemas["DetachedCommand"].clone();
    inline_refs(&mut detached, schemas);
    let with_key = |mut s: Value, drop: &[&str]| -> Value {
        let props = s["properties"].as_object_mut().expect("properties");
        for d in drop {
            props.remove(*d);
        }
        let mut all = serde_json::Map::new();
        all.insert("key".into(), key.clone());
        all.extend(props.clone());
        s["properties"] = Value::Object(all);
        let mut req = vec![json!("key")];
        req.extend(s["required"].as_array().cloned().unwrap_or_default());
        s["required"] = Value::Array(req);
        s
    };
    let object = |props: Value, required: &[&str]| -> Value {
        json!({ "type": "object", "properties": props, "required": required, "additionalProperties": false })
    };
    json!([
        {
            "name": "exec",
            "title": "Run a fenced command",
            "description": "Run a command in the key's sandbox and wait for it. Its network is denied except what `grant` allows, only while it runs; what it backgrounded is killed when it ends. Returns its exit code, stdout and stderr.",
            "inputSchema": with_key(command.clone(), &[]),
        },
        {
            "name": "start",
            "title": "Start a detached process",
            "description": "Start a process that outlives the call (a server, a watcher) in the key's sandbox. It holds no network grant, ever. Returns its id for status and stop.",
            "inputSchema": with_key(detached, &[]),
        },
        {
            "name": "status",
            "title": "A detached process's state",
            "description": "running, exited(code) or gone(reason).",
            "inputSchema": object(json!({ "key": key, "id": id }), &["key", "id"]),
        },
        {
            "name": "stop",
            "title": "Stop a detached process",
            "description": "Kill a detached process's whole tree and forget its id.",
            "inputSchema": object(json!({ "key": key, "id": id }), &["key", "id"]),
        },
        {
            "name": "denials",
            "title": "Refused egress",
            "description": "The network requests the key's fence refused, and why.",
            "inputSchema": object(json!({ "key": key }), &["key"]),
        },
        {
            "name": "egress",
            "title": "Everything on the network",
            "description": "Every request the key's fence decided, oldest first: admitted (status, bytes each way, credential headers the proxy added, by name) and refused (why).",
            "inputSchema": object(json!({ "key": key }), &["key"]),
        },
        {
            "name": "artifacts",
            "title": "Files under /artifacts",
            "description": "Without `name`: list the key's /artifacts. With `name`: read that file (text, or base64 when it is not UTF-8), up to 4 MiB from `offset`.",
            "inputSchema": object(json!({
                "key": key,
                "name": param("/v1/sandboxes/{key}/artifacts/{name}", "name"),
                "offset": param("/v1/sandboxes/{key}/artifacts/{name}", "offset"),
                "length": param("/v1/sandboxes/{key}/artifacts/{name}", "length"),
            }), &["key"]),
        },
        {
            "name": "put",
            "title": "Put a file into /workspace",
            "description": "Write one file under the key's /workspace (parents created), owned by the sandbox's user. Give `content` (text) or `content_base64` (any bytes), at most 256 MiB.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "key": key,
                    "path": {
                        "type": "string",
                        "minLength": 1,
                        "pattern": "^[^/\\u0000][^\\u0000]*$",
                        "description": "Relative to /workspace; no '..' segment",
                    },
                    "content": { "type": "string" },
                    "content_base64": { "type": "string", "format": "byte" },
                },
                "required": ["key", "path"],
                "additionalProperties": false,
                "oneOf": [ { "required": ["content"] }, { "required": ["content_base64"] } ],
            },
        },
    ])
}

/// A tool's arguments, checked enough to name a route; the server checks the rest.
struct Args<'a>(&'a Value);

impl Args<'_> {
    fn key(&self) -> Result<String, String> {
        let k = self.str("key")?;
        stockade_grammar::names::key(&k).map_err(|e| format!("key: {e}"))?;
        Ok(k)
    }

    fn str(&self, name: &str) -> Result<String, String> {
        self.0[name]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("`{name}` (a string) is required"))
    }

    /// The command: every argument but the key, as the API takes it.
    fn command(&self) -> Result<CommandBody, String> {
        let mut b = self.0.clone();
        if let Some(m) = b.as_object_mut() {
            m.remove("key");
        }
        serde_json::from_value(b).map_err(|e| format!("invalid-input: {e}"))
    }
}

/// A tool's answer: text for the model, the API's JSON as structured content.
fn result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [ { "type": "text", "text": text } ],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// An answer as the API wrote it.
fn structured(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn tool_error(message: String) -> Value {
    result(message.clone(), json!({ "error": message }), true)
}

/// Run one tool through the API.
async fn call_tool(client: &Client, name: &str, args: &Value) -> Result<Value, String> {
    let a = Args(args);
    let fail = |e: stockade_client::Error| e.to_string();
    match name {
        "exec" => {
            let out = client.exec(&a.key()?, &a.command()?).await.map_err(fail)?;
            let mut s = structured(&out);
            if let Some(m) = s.as_object_mut() {
                m.remove("stdout_base64");
                m.remove("stderr_base64");
            }
            Ok(result(render::exec_text(&out), s, false))
        }
        "start" => {
            let out = client.start(&a.key()?, &a.command()?).await.map_err(fail)?;
            Ok(result(
                format!("started {}", out.id),
                structured(&out),
                false,
            ))
        }
        "status" => {
            let out = client
                .status(&a.key()?, &a.str("id")?)
                .await
                .map_err(fail)?;
            Ok(result(render::state_words(&out), structured(&out), false))
        }
        "stop" => {
            let id = a.str("id")?;
            let out = client.stop(&a.key()?, &id).await.map_err(fail)?;
            Ok(result(format!("stopped {id}"), structured(&out), false))
        }
        "egress" => {
            let egress = client.egress(&a.key()?).await.map_err(fail)?;
            let text = render::lines(&egress, render::egress_line, "no egress");
            Ok(result(text, structured(&Egress { egress }), false))
        }
        "denials" => {
            let denials = client.denials(&a.key()?).await.map_err(fail)?;
            let text = render::lines(&denials, render::denial_line, "no denials");
            Ok(result(text, structured(&Denials { denials }), false))
        }
        "artifacts" => {
            let key = a.key()?;
            let Some(name) = args["name"].as_str() else {
                let artifacts = client.artifacts(&key).await.map_err(fail)?;
                let text = render::lines(&artifacts, render::artifact_line, "no artifacts");
                return Ok(result(text, structured(&Artifacts { artifacts }), false));
            };
            let offset = args["offset"].as_u64().unwrap_or(0);
            let length = args["length"].as_u64().unwrap_or(4 << 20);
            let bytes = client
                .read_artifact(&key, name, offset, length)
                .await
                .map_err(fail)?;
            Ok(match std::str::from_utf8(&bytes) {
                Ok(t) => result(
                    t.to_string(),
                    json!({ "name": name, "offset": offset, "text": t }),
                    false,
                ),
                Err(_) => {
                    let b = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    result(
                        format!(
                            "{} bytes, not UTF-8 (base64 in structured content)",
                            bytes.len()
                        ),
                        json!({ "name": name, "offset": offset, "base64": b }),
                        false,
                    )
                }
            })
        }
        "put" => {
            let key = a.key()?;
            let path = a.str("path")?;
            let bytes = match (args["content"].as_str(), args["content_base64"].as_str()) {
                (Some(t), None) => t.as_bytes().to_vec(),
                (None, Some(b)) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("content_base64: {e}"))?,
                _ => return Err("give exactly one of `content` and `content_base64`".into()),
            };
            let out = client.put_file(&key, &path, bytes).await.map_err(fail)?;
            Ok(result(
                format!("wrote /workspace/{path}"),
                structured(&out),
                false,
            ))
        }
        other => Err(format!("unknown tool {other:?}")),
    }
}

/// A JSON-RPC error object.
fn rpc_error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

/// Answer one message; `None` for a notification (nothing to send).
pub(crate) async fn handle(client: &Client, tools: &Value, msg: &str) -> Option<Value> {
    let req: Value = match serde_json::from_str(msg) {
        Ok(v) => v,
        Err(e) => return Some(rpc_error(Value::Null, -32700, format!("parse error: {e}"))),
    };
    let method = req["method"].as_str();
    let Some(id) = req.get("id").cloned() else {
        // A notification (`notifications/initialized`, `notifications/cancelled`, …):
        // nothing to answer.
        return None;
    };
    if req["jsonrpc"] != "2.0" || method.is_none() {
        return Some(rpc_error(
            id,
            -32600,
            "invalid request: jsonrpc 2.0 with a method",
        ));
    }
    let params = &req["params"];
    let result = match method.unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": negotiate(params["protocolVersion"].as_str()),
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": { "name": "stockade", "title": "Stockade sandboxes", "version": env!("CARGO_PKG_VERSION") },
            "instructions": "Each key is a sandbox (a Linux container with /workspace). `exec` runs a command with no network unless `grant` allows hosts, only while it runs; `start` runs a detached process (no network). Files go in with `put`, come out through /artifacts.",
        }),
        "ping" => json!({}),
        "tools/list" => json!({ "tools": tools }),
        "tools/call" => {
            let Some(name) = params["name"].as_str() else {
                return Some(rpc_error(id, -32602, "tools/call needs a tool `name`"));
            };
            if !tools
                .as_array()
                .is_some_and(|t| t.iter().any(|x| x["name"] == name))
            {
                return Some(rpc_error(id, -32602, format!("unknown tool {name:?}")));
            }
            let args = if params["arguments"].is_null() {
                json!({})
            } else {
                params["arguments"].clone()
            };
            if !args.is_object() {
                return Some(rpc_error(id, -32602, "`arguments` must be an object"));
            }
            match call_tool(client, name, &args).await {
                Ok(r) => r,
                Err(e) => tool_error(e),
            }
        }
        other => return Some(rpc_error(id, -32601, format!("method not found: {other}"))),
    };
    Some(json!({ "jsonrpc": "2.0", "id": id, "result": result }))
}

/// Serve MCP on stdin/stdout until stdin closes.
pub(crate) async fn serve(client: Client) -> std::io::Result<()> {
    let tools = tools();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(resp) = handle(&client, &tools, &line).await {
            let mut bytes = serde_json::to_vec(&resp).unwrap_or_default();
            bytes.push(b'\n');
            out.write_all(&bytes).await?;
            out.flush().await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_the_clients_if_known_else_the_newest() {
        let rows = [
            (Some("2025-06-18"), "2025-06-18"),
            (Some("2024-11-05"), "2024-11-05"),
            (Some("2025-11-25"), "2025-11-25"),
            (Some("2026-07-28"), "2025-11-25"),
            (Some("nonsense"), "2025-11-25"),
            (None, "2025-11-25"),
        ];
        for (asked, want) in rows {
            assert_eq!(negotiate(asked), want, "{asked:?}");
        }
    }

    #[test]
    fn tool_schemas_carry_the_apis_constraints_and_no_refs() {
        let t = tools();
        let exec = t
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "exec")
            .unwrap();
        let s = &exec["inputSchema"];
        assert_eq!(s["required"], json!(["key", "argv"]));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["argv"]["minItems"], 1);
        assert!(s["properties"]["key"]["pattern"].is_string());
        assert!(!t.to_string().contains("$ref"), "refs are inlined");
        let start = t
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "start")
            .unwrap();
        assert!(
            start["inputSchema"]["properties"]["grant"].is_null(),
            "start takes no grant"
        );
        let names: Vec<_> = t
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].clone())
            .collect();
        assert_eq!(
            names,
            json!([
                "exec",
                "start",
                "status",
                "stop",
                "denials",
                "egress",
                "artifacts",
                "put"
            ])
            .as_array()
            .unwrap()
            .clone()
        );
    }
}
