//! One function per verb that talks to the server: build the request from the
//! arguments, make the typed call, print the answer (`--json`: as the API wrote it;
//! else in `crate::render`'s words), return the exit code.

use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use serde::Serialize;
use stockade_client::{Client, Stream};
use stockade_wire::{CommandBody, GrantBody, RuleSpec, SecretBody};

use super::Failure;
use super::args::{
    CommandArgs, ExecArgs, GrantArgs, SecretVerb, SnapshotVerb, StartArgs, TokenVerb,
};
use crate::render;

/// `exec`: live output (or, with `--json`, the whole outcome), then the command's own
/// exit code.
pub(super) async fn exec(c: &Client, a: &ExecArgs, json: bool) -> Result<i32, Failure> {
    let mut body = command_body(&a.cmd)?;
    body.timeout_ms = a.timeout;
    body.grant = grant_body(&a.grant)?;
    let key = &a.grant.key;
    if json {
        let out = c.exec(key, &body).await?;
        print_json(&out);
        return Ok(exit_status(&stockade_wire::ExitEvent::from(&out)));
    }
    // Live: each chunk printed as it arrives, then the outcome's notes.
    let last = c
        .exec_stream(key, &body, |stream, bytes| {
            let _ = match stream {
                Stream::Stdout => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(bytes).and_then(|()| o.flush())
                }
                Stream::Stderr => {
                    let mut e = std::io::stderr().lock();
                    e.write_all(bytes).and_then(|()| e.flush())
                }
            };
        })
        .await?;
    for note in render::outcome_notes(&last) {
        eprintln!("stockade: {note}");
    }
    Ok(exit_status(&last))
}

/// A `--grant` rule in the shorthand (`stockade_grammar::shorthand`): the grammar's rule,
/// which is what the API takes.
pub(super) fn shorthand_rule(s: &str) -> Result<RuleSpec, Failure> {
    stockade_grammar::shorthand::parse(s).map_err(|e| Failure::new(2, e.to_string()))
}

/// `start`: the new process's id.
pub(super) async fn start(c: &Client, a: &StartArgs, json: bool) -> Result<i32, Failure> {
    let out = c.start(&a.key, &command_body(&a.cmd)?).await?;
    print_or(json, &out, |o| o.id.clone());
    Ok(0)
}

/// `status`: running, exited(N) or gone(reason).
pub(super) async fn status(c: &Client, key: &str, id: &str, json: bool) -> Result<i32, Failure> {
    let out = c.status(key, id).await?;
    print_or(json, &out, render::state_words);
    Ok(0)
}

/// `stop`.
pub(super) async fn stop(c: &Client, key: &str, id: &str, json: bool) -> Result<i32, Failure> {
    let out = c.stop(key, id).await?;
    print_or(json, &out, |_| format!("stopped {id}"));
    Ok(0)
}

/// `denials`: one line each.
pub(super) async fn denials(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let denials = c.denials(key).await?;
    let out = stockade_wire::Denials { denials };
    print_or(json, &out, |o| {
        render::lines(&o.denials, render::denial_line, "")
    });
    Ok(0)
}

/// `egress`: the timeline, one line each.
pub(super) async fn egress(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let egress = c.egress(key).await?;
    let out = stockade_wire::Egress { egress };
    print_or(json, &out, |o| {
        render::lines(&o.egress, render::egress_line, "")
    });
    Ok(0)
}

/// `artifacts KEY`: the listing.
pub(super) async fn artifacts(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let artifacts = c.artifacts(key).await?;
    let out = stockade_wire::Artifacts { artifacts };
    print_or(json, &out, |o| {
        render::lines(&o.artifacts, render::artifact_line, "")
    });
    Ok(0)
}

/// `artifacts KEY NAME`: the file to stdout, byte-exact, read in 1 MiB chunks.
pub(super) async fn read_artifact(c: &Client, key: &str, name: &str) -> Result<i32, Failure> {
    let mut offset = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let chunk = c.read_artifact(key, name, offset, 1 << 20).await?;
        if chunk.is_empty() {
            break;
        }
        offset += chunk.len() as u64;
        out.write_all(&chunk)
            .map_err(|e| Failure::new(74, e.to_string()))?;
    }
    Ok(0)
}

/// `put`: a file, a directory or a tar archive on stdin into `/workspace`.
pub(super) async fn put(
    c: &Client,
    key: &str,
    src: &Path,
    dest: Option<&str>,
    json: bool,
) -> Result<i32, Failure> {
    let (what, bytes) = put_request(src, dest)?;
    let progress = format!(
        "putting {} into {key}",
        render::human_bytes(bytes.len() as u64)
    );
    let out = match what {
        Put::File(dest) => with_progress(&progress, c.put_file(key, &dest, bytes)).await?,
        Put::Archive(dest) => with_progress(&progress, c.put_archive(key, &dest, bytes)).await?,
    };
    print_or(json, &out, |o| {
        format!("{} entries in {}", o.entries, o.dest)
    });
    Ok(0)
}

/// `ensure`.
pub(super) async fn ensure(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let out = with_progress(&format!("starting {key}"), c.ensure(key)).await?;
    print_or(json, &out, |_| format!("ensured {key}"));
    Ok(0)
}

/// `abort`.
pub(super) async fn abort(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let out = c.abort(key).await?;
    print_or(json, &out, |_| format!("aborted {key}"));
    Ok(0)
}

/// `checkpoint`.
pub(super) async fn checkpoint(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let out = with_progress(&format!("checkpointing {key}"), c.checkpoint(key)).await?;
    print_or(json, &out, |_| format!("checkpointed {key}"));
    Ok(0)
}

/// `snapshot save|list|rm`.
pub(super) async fn snapshot(c: &Client, verb: &SnapshotVerb, json: bool) -> Result<i32, Failure> {
    match verb {
        SnapshotVerb::Save { key, name } => {
            let out =
                with_progress(&format!("snapshotting {key}"), c.save_snapshot(key, name)).await?;
            print_or(json, &out, |s| format!("saved {key} as {}", s.name));
        }
        SnapshotVerb::List { key } => {
            let snapshots = c.snapshots(key).await?;
            let out = stockade_wire::Snapshots { snapshots };
            print_or(json, &out, |o| {
                render::lines(&o.snapshots, render::snapshot_line, "no snapshots")
            });
        }
        SnapshotVerb::Rm { key, name } => {
            let out = c.delete_snapshot(key, name).await?;
            print_or(json, &out, |_| format!("deleted {key}'s snapshot {name}"));
        }
    }
    Ok(0)
}

/// `sandboxes [PREFIX]`.
pub(super) async fn sandboxes(c: &Client, prefix: &str, json: bool) -> Result<i32, Failure> {
    let sandboxes = c.sandboxes(prefix).await?;
    let out = stockade_wire::SandboxList { sandboxes };
    print_or(json, &out, |o| {
        render::lines(&o.sandboxes, render::sandbox_line, "no known sandboxes")
    });
    Ok(0)
}

/// `info KEY`.
pub(super) async fn info(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let out = c.describe(key).await?;
    print_or(json, &out, render::sandbox_line);
    Ok(0)
}

/// `lifetime KEY --in S | --clear [--on-end …]`.
pub(super) async fn lifetime(
    c: &Client,
    key: &str,
    seconds: Option<u64>,
    on_end: &str,
    json: bool,
) -> Result<i32, Failure> {
    let out = match seconds {
        Some(s) => {
            let body = stockade_wire::LifetimeBody {
                ends_at_ms: None,
                ends_in_ms: Some(s.saturating_mul(1000)),
                on_end: Some(if on_end == "checkpoint" {
                    stockade_wire::OnEnd::Checkpoint
                } else {
                    stockade_wire::OnEnd::Abort
                }),
            };
            c.set_lifetime(key, &body).await?
        }
        None => c.clear_lifetime(key).await?,
    };
    print_or(json, &out, render::sandbox_line);
    Ok(0)
}

/// The grant the flags give (`--grant`, `--grant-file`, `--ask`); none when they give
/// nothing.
fn grant_body(a: &GrantArgs) -> Result<Option<GrantBody>, Failure> {
    let mut rules = vec![];
    let mut ask = a.ask;
    for r in &a.grant {
        rules.push(shorthand_rule(r)?);
    }
    if let Some(f) = &a.grant_file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Failure::new(66, format!("{}: {e}", f.display())))?;
        let g: GrantBody = serde_json::from_str(&text)
            .map_err(|e| Failure::new(65, format!("{}: {e}", f.display())))?;
        rules.extend(g.rules);
        ask |= g.ask;
    }
    Ok((!rules.is_empty() || a.grant_file.is_some() || ask).then_some(GrantBody { rules, ask }))
}

/// `network KEY --grant RULE… [--grant-file F] [--ask] | --clear`. Flags that give no
/// rule set a network of none (every request of its commands denied), which is not
/// `--clear` (no network: the same today, but said as meant).
pub(super) async fn network(
    c: &Client,
    a: &GrantArgs,
    clear: bool,
    json: bool,
) -> Result<i32, Failure> {
    let out = if clear {
        c.clear_network(&a.key).await?
    } else {
        let g = grant_body(a)?.unwrap_or_default();
        c.set_network(&a.key, &g).await?
    };
    print_or(json, &out, render::sandbox_line);
    Ok(0)
}

/// `metadata KEY NAME=VALUE…`.
pub(super) async fn metadata(
    c: &Client,
    key: &str,
    pairs: &[String],
    json: bool,
) -> Result<i32, Failure> {
    let mut metadata = std::collections::BTreeMap::new();
    for p in pairs {
        let Some((n, v)) = p.split_once('=') else {
            return Err(Failure::new(2, format!("{p:?} is not NAME=VALUE")));
        };
        metadata.insert(n.to_string(), v.to_string());
    }
    let out = c.set_metadata(key, metadata).await?;
    print_or(json, &out, render::sandbox_line);
    Ok(0)
}

/// `forget KEY`.
pub(super) async fn forget(c: &Client, key: &str, json: bool) -> Result<i32, Failure> {
    let out = c.forget(key).await?;
    print_or(json, &out, |_| format!("{key} aborted and forgotten"));
    Ok(0)
}

/// `fork KEY SOURCE NAME`.
pub(super) async fn fork(
    c: &Client,
    key: &str,
    source: &str,
    name: &str,
    json: bool,
) -> Result<i32, Failure> {
    let out = c.fork(key, source, name).await?;
    print_or(json, &out, |_| {
        format!("{key} starts from {source}'s snapshot {name}")
    });
    Ok(0)
}

/// `secret set|list|rm` (the approver's client).
pub(super) async fn secret(c: &Client, verb: &SecretVerb, json: bool) -> Result<i32, Failure> {
    match verb {
        SecretVerb::Set {
            name,
            host,
            methods,
            path_prefix,
        } => {
            use std::io::Read;
            let mut value = String::new();
            std::io::stdin()
                .lock()
                .take(stockade_egress::secrets::MAX_SECRET_VALUE as u64 + 2)
                .read_to_string(&mut value)
                .map_err(|e| Failure::new(66, format!("stdin: {e}")))?;
            let body = SecretBody {
                value: value.trim_end_matches(['\n', '\r']).to_string(),
                host: host.clone(),
                methods: methods.iter().map(|m| m.to_ascii_uppercase()).collect(),
                path_prefix: Some(path_prefix.as_deref().unwrap_or("/").to_string()),
            };
            c.set_secret(name, &body).await?;
            if !json {
                println!("secret {name} set");
            }
        }
        SecretVerb::List => {
            let secrets = c.secrets().await?;
            let out = stockade_wire::Secrets { secrets };
            print_or(json, &out, |o| {
                render::lines(&o.secrets, render::secret_line, "")
            });
        }
        SecretVerb::Rm { name } => {
            c.remove_secret(name).await?;
            if !json {
                println!("secret {name} removed");
            }
        }
    }
    Ok(0)
}

/// `token create|list|revoke` (the operator's token).
pub(super) async fn token(c: &Client, verb: &TokenVerb, json: bool) -> Result<i32, Failure> {
    match verb {
        TokenVerb::Create {
            keys,
            ceiling,
            name,
        } => {
            let body = stockade_wire::TokenBody {
                keys: keys.clone(),
                ceiling: ceiling.map(u64::from),
                name: name.clone(),
            };
            let made = c.create_token(&body).await?;
            print_or(json, &made, |m| {
                format!(
                    "{}\n(token {} for keys {}, share {}: shown once; give it to the tenant as its bearer token)",
                    m.token, m.info.id, m.info.keys, m.info.ceiling
                )
            });
        }
        TokenVerb::List => {
            let tokens = c.tokens().await?;
            let out = stockade_wire::Tokens { tokens };
            print_or(json, &out, |o| {
                render::lines(&o.tokens, render::token_line, "no tokens")
            });
        }
        TokenVerb::Revoke { id } => {
            let r = c.revoke_token(id).await?;
            if json {
                print_or(json, &r, |_| String::new());
            } else {
                println!("token {id} revoked");
            }
        }
    }
    Ok(0)
}

/// `egress pending [KEY]`: one line per held request.
pub(super) async fn egress_pending(
    c: &Client,
    key: Option<&str>,
    json: bool,
) -> Result<i32, Failure> {
    let pending = c.egress_pending(key).await?;
    let out = stockade_wire::PendingDecisions { pending };
    print_or(json, &out, |o| {
        o.pending
            .iter()
            .map(|p| {
                format!(
                    "{}  {}  {} {}:{}{}  {}  widens: {}",
                    p.id, p.key, p.method, p.host, p.port, p.path, p.reason, p.widens
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(0)
}

/// `egress approve|refuse ID` (the approver's client).
pub(super) async fn egress_decide(
    c: &Client,
    id: &str,
    decision: stockade_wire::Verdict,
    json: bool,
) -> Result<i32, Failure> {
    let out = c.egress_decide(id, decision).await?;
    print_or(json, &out, |o| {
        let verb = match o.decision {
            stockade_wire::Verdict::Approve => "approved",
            stockade_wire::Verdict::Refuse => "refused",
        };
        format!(
            "{verb} {} {}:{}{} ({})",
            o.pending.method, o.pending.host, o.pending.port, o.pending.path, o.pending.key
        )
    });
    Ok(0)
}

/// `approve` (the approver's client): the token.
pub(super) async fn approve(
    c: &Client,
    key: &str,
    argv: &[String],
    json: bool,
) -> Result<i32, Failure> {
    let out = c.approve(key, argv).await?;
    print_or(json, &out, |o| o.token.clone());
    Ok(0)
}

/// The command of `exec` and `start` as the API takes it.
fn command_body(c: &CommandArgs) -> Result<CommandBody, Failure> {
    let mut env = std::collections::BTreeMap::new();
    for e in &c.env {
        let (k, v) = e
            .split_once('=')
            .ok_or_else(|| Failure::new(2, format!("--env {e:?} is not NAME=VALUE")))?;
        env.insert(k.to_string(), v.to_string());
    }
    let stdin = if c.no_stdin { None } else { forwarded_stdin()? };
    Ok(CommandBody {
        argv: c.argv.clone(),
        cwd: c.cwd.clone(),
        env,
        approval: c.approval.clone(),
        stdin_base64: stdin.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
        ..Default::default()
    })
}

/// This process's standard input when it is not a terminal, read to its end (empty:
/// none). More than the guest takes is a usage error here, not a refused request.
fn forwarded_stdin() -> Result<Option<Vec<u8>>, Failure> {
    use std::io::{IsTerminal, Read};
    const LIMIT: u64 = 16 << 20;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::new(2, format!("reading standard input: {e}")))?;
    if bytes.len() as u64 > LIMIT {
        return Err(Failure::new(
            2,
            format!("standard input is larger than {LIMIT} bytes (use a file in /workspace)"),
        ));
    }
    Ok((!bytes.is_empty()).then_some(bytes))
}

/// Where `put` sends its bytes.
enum Put {
    /// One file, to `files/DEST`.
    File(String),
    /// A tar archive, unpacked into `files?dest=DEST`.
    Archive(String),
}

/// The request of `put`: a file goes as itself to `files/DEST`; a directory as a tar
/// archive of its contents (symlinks kept as symlinks) and `-` (a tar archive on
/// stdin) as it is, to `files?dest=DEST`.
fn put_request(src: &Path, dest: Option<&str>) -> Result<(Put, Vec<u8>), Failure> {
    use std::io::Read;
    let usage = |m: String| Failure::new(2, m);
    let io = |e: std::io::Error| Failure::new(66, format!("{}: {e}", src.display()));
    let name = || {
        src.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| usage(format!("{} has no name: give DEST", src.display())))
    };
    let dest_or_name = || match dest {
        Some(d) => Ok(d.to_string()),
        None => name(),
    };
    let limit = crate::upload::MAX_ARCHIVE_BYTES as u64;
    if src == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        return Ok((Put::Archive(dest.unwrap_or_default().to_string()), bytes));
    }
    let meta = std::fs::metadata(src).map_err(io)?;
    if meta.is_dir() {
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", src).map_err(io)?;
        let bytes = b.into_inner().map_err(io)?;
        return Ok((Put::Archive(dest_or_name()?), bytes));
    }
    if meta.len() > limit {
        return Err(usage(format!(
            "{} is larger than {limit} bytes",
            src.display()
        )));
    }
    let bytes = std::fs::read(src).map_err(io)?;
    Ok((Put::File(dest_or_name()?), bytes))
}

/// Await `work`; on a terminal, say what it is doing and for how long (every 200 ms,
/// on one line of stderr, cleared at the end). Off a terminal: nothing.
async fn with_progress<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let began = std::time::Instant::now();
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tick.tick() => {
                eprint!("\rstockade: {what}… {:.1} s", began.elapsed().as_secs_f64());
                let _ = std::io::stderr().flush();
            }
        }
    };
    eprint!("\r\x1b[2K");
    out
}

/// The CLI's exit status for an exec outcome: the command's own, 124 for a timeout,
/// 128 + N for a signal.
pub(super) fn exit_status(out: &stockade_wire::ExitEvent) -> i32 {
    if out.timed_out {
        124
    } else if out.exit_code < 0 {
        128_i32.saturating_sub(out.exit_code)
    } else {
        out.exit_code
    }
}

fn print_json(v: &impl Serialize) {
    println!("{}", serde_json::to_string(v).unwrap_or_default());
}

/// `--json`: the answer as the API wrote it; else its text (nothing when empty).
pub(super) fn print_or<T: Serialize>(json: bool, v: &T, text: impl FnOnce(&T) -> String) {
    if json {
        print_json(v);
    } else {
        let t = text(v);
        if !t.is_empty() {
            println!("{t}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_rules_on_the_command_line_become_the_apis_rules() {
        let r = shorthand_rule("GET,head pypi.org/simple/").unwrap();
        assert_eq!(
            r,
            RuleSpec::new("pypi.org", &["GET", "HEAD"], Some("/simple/"))
        );
        assert_eq!(shorthand_rule("GET /x").unwrap_err().code, 2);
    }

    #[test]
    fn an_outcome_becomes_the_clis_exit_status() {
        let ev = |exit_code, timed_out| stockade_wire::ExitEvent {
            exit_code,
            timed_out,
            ..Default::default()
        };
        let rows = [
            (ev(0, false), 0),
            (ev(3, false), 3),
            (ev(-9, false), 137),
            (ev(-1, true), 124),
        ];
        for (out, want) in rows {
            assert_eq!(exit_status(&out), want, "{out:?}");
        }
    }
}
