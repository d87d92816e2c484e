//! The protocol both transports speak: JSON-RPC 2.0 messages in, answers out.
//! Lifecycle: `initialize` (the handshake revisions 2024-11-05 … 2025-11-25; the
//! client's revision is echoed if known, else the newest), `notifications/initialized`,
//! `ping`, `tools/list`, `tools/call`. A request that is not a valid JSON-RPC call, an
//! unknown method or tool gets a JSON-RPC error; a tool the server refuses answers
//! `isError: true` (`super::tools`). A transport only frames messages: what a message
//! means is decided here, once.

use serde_json::{Value, json};
use stockade_client::Client;

use super::tools::{Progress, call_tool, tool_error};

/// The handshake revisions this server speaks, oldest to newest.
pub const PROTOCOL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The revision to answer a client that asked for `requested` (pure).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == requested)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.len() - 1])
}

/// A JSON-RPC error object.
pub(crate) fn rpc_error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

/// Answer one message (text); `None` for a notification (nothing to send).
pub(crate) async fn handle(client: &Client, tools: &Value, msg: &str) -> Option<Value> {
    match serde_json::from_str(msg) {
        Ok(req) => handle_value(client, tools, req, None).await,
        Err(e) => Some(rpc_error(Value::Null, -32700, format!("parse error: {e}"))),
    }
}

/// Answer one parsed message; `None` for a notification. `progress`: where an
/// `exec`'s live output goes while it runs (the caller asked for progress).
pub(crate) async fn handle_value(
    client: &Client,
    tools: &Value,
    req: Value,
    progress: Option<Progress>,
) -> Option<Value> {
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
            match call_tool(client, name, &args, progress).await {
                Ok(r) => r,
                Err(e) => tool_error(e),
            }
        }
        other => return Some(rpc_error(id, -32601, format!("method not found: {other}"))),
    };
    Some(json!({ "jsonrpc": "2.0", "id": id, "result": result }))
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
}
