//! The tools, one table for both transports: their input schemas (built from
//! `docs/openapi.json`, so the model is told exactly what the server enforces) and
//! their calls, each one API call through `stockade-client` (the CLI's client: typed
//! answers, every path segment percent-encoded) with a key that passed the shared
//! grammar, so a model's `key` cannot reach another route and every check stays the
//! server's.
//!
//! Decided: a command's non-zero exit is a result, not a tool error (`isError` false;
//! the exit code is in the text and the structured content). A call the server
//! refuses answers `isError: true` with the server's code and message (the model can
//! read and fix it). Texts come from `crate::render`, as the CLI's do. An `exec` whose
//! caller asked for progress runs through the live-output route (`…/exec/stream`) and
//! reports each chunk as it arrives ([`Progress`]).

use base64::Engine as _;
use serde_json::{Value, json};
use stockade_client::{Client, Stream};
use stockade_wire::{Artifacts, CommandBody, Denials, Egress, ExecOutcome, ExitEvent};

use crate::render;

const OPENAPI: &str = include_str!("../../../docs/openapi.json");

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
            "description": "Run a command in the key's sandbox and wait for it. Its network is denied except what `grant` allows (none given: the key's network, if it has one), only while it runs; what it backgrounded is killed when it ends. Returns its exit code, stdout and stderr.",
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
            "name": "egress_pending",
            "title": "Requests waiting for the approver",
            "description": "The network requests an `ask` grant holds for the approver (all keys, or the key's), oldest first: id, method, host, path, why the rules refused it, what approving would admit. This server runs with the consumer's token: it can list them, never answer them (the approver answers with `stockade egress approve|refuse ID`).",
            "inputSchema": object(json!({ "key": key }), &[]),
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
            "name": "expose",
            "title": "Open a preview URL",
            "description": "Open a preview door onto `port` (127.0.0.1 inside the key's running container, e.g. a server started with `start`). Returns its URL, with a random token; a browser or an HTTP client (WebSockets too) reaches the server through it. It never opens the sandbox's egress. The door closes on unexpose, abort, checkpoint or stop.",
            "inputSchema": object(json!({ "key": key, "port": param("/v1/sandboxes/{key}/previews/{port}", "port") }), &["key", "port"]),
        },
        {
            "name": "unexpose",
            "title": "Close a preview URL",
            "description": "Close the preview door onto `port`; its URL answers 404 from now on.",
            "inputSchema": object(json!({ "key": key, "port": param("/v1/sandboxes/{key}/previews/{port}", "port") }), &["key", "port"]),
        },
        {
            "name": "previews",
            "title": "Open preview URLs",
            "description": "The key's open preview doors: port and URL each.",
            "inputSchema": object(json!({ "key": key }), &["key"]),
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

    /// `port`: a whole number (the guest checks 1-65535).
    fn port(&self) -> Result<u32, String> {
        self.0["port"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| "`port` (a whole number, 1-65535) is required".to_string())
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

/// Where an `exec`'s live output goes, chunk by chunk, while it runs: the transport
/// turns each into a `notifications/progress` for the caller's progress token.
pub(crate) type Progress = tokio::sync::mpsc::UnboundedSender<String>;

/// An outcome from a streamed run: its exit event and the output that streamed.
fn streamed_outcome(exit: ExitEvent, stdout: Vec<u8>, stderr: Vec<u8>) -> ExecOutcome {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    ExecOutcome {
        exit_code: exit.exit_code,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        stdout_base64: b64(&stdout),
        stderr_base64: b64(&stderr),
        timed_out: exit.timed_out,
        truncated: exit.truncated,
        killed: exit.killed,
        denials: exit.denials,
        admitted: exit.admitted,
        limits: exit.limits,
    }
}

/// Run a fenced command: the whole answer at once, or (with `progress`) through the
/// live-output route, each chunk sent on as it arrives.
async fn exec(
    client: &Client,
    key: &str,
    cmd: &CommandBody,
    progress: Option<Progress>,
) -> Result<ExecOutcome, stockade_client::Error> {
    let Some(progress) = progress else {
        return client.exec(key, cmd).await;
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = client
        .exec_stream(key, cmd, |which, bytes| {
            match which {
                Stream::Stdout => stdout.extend_from_slice(bytes),
                Stream::Stderr => stderr.extend_from_slice(bytes),
            }
            // The caller may be gone; the run's own end is the client's disconnect.
            let _ = progress.send(String::from_utf8_lossy(bytes).into_owned());
        })
        .await?;
    Ok(streamed_outcome(exit, stdout, stderr))
}

pub(crate) fn tool_error(message: String) -> Value {
    result(message.clone(), json!({ "error": message }), true)
}

/// Run one tool through the API.
pub(crate) async fn call_tool(
    client: &Client,
    name: &str,
    args: &Value,
    progress: Option<Progress>,
) -> Result<Value, String> {
    let a = Args(args);
    let fail = |e: stockade_client::Error| e.to_string();
    match name {
        "exec" => {
            let out = exec(client, &a.key()?, &a.command()?, progress)
                .await
                .map_err(fail)?;
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
        "expose" => {
            let out = client.expose(&a.key()?, a.port()?).await.map_err(fail)?;
            Ok(result(out.url.clone(), structured(&out), false))
        }
        "unexpose" => {
            let port = a.port()?;
            let out = client.unexpose(&a.key()?, port).await.map_err(fail)?;
            Ok(result(
                format!("unexposed port {port}"),
                structured(&out),
                false,
            ))
        }
        "previews" => {
            let previews = client.previews(&a.key()?).await.map_err(fail)?;
            let text = render::lines(
                &previews,
                |p| format!("{}  {}", p.port, p.url),
                "no previews",
            );
            Ok(result(
                text,
                structured(&stockade_wire::Previews { previews }),
                false,
            ))
        }
        "egress" => {
            let egress = client.egress(&a.key()?).await.map_err(fail)?;
            let text = render::lines(&egress, render::egress_line, "no egress");
            Ok(result(text, structured(&Egress { egress }), false))
        }
        "egress_pending" => {
            let key = match a.0.get("key") {
                None | Some(Value::Null) => None,
                Some(_) => Some(a.key()?),
            };
            let pending = client.egress_pending(key.as_deref()).await.map_err(fail)?;
            let text = if pending.is_empty() {
                "nothing pending".to_string()
            } else {
                pending
                    .iter()
                    .map(|p| {
                        format!(
                            "{}  {}  {} {}:{}{}  {}  widens: {}",
                            p.id, p.key, p.method, p.host, p.port, p.path, p.reason, p.widens
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            Ok(result(
                text,
                structured(&stockade_wire::PendingDecisions { pending }),
                false,
            ))
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

#[cfg(test)]
mod tests {
    use super::*;

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
                "egress_pending",
                "artifacts",
                "expose",
                "unexpose",
                "previews",
                "put"
            ])
            .as_array()
            .unwrap()
            .clone()
        );
    }
}
