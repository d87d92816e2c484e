//! The `stockade` CLI. `serve` runs the server; the other verbs talk to it over the
//! HTTP API (bearer token from `--token`, `STOCKADE_TOKEN`, or the data directory);
//! `doctor` and `demo` run in-process.
//!
//! Exit codes: a command's own exit code passes through `exec` (a signal N → 128+N, a
//! timeout → 124). Errors use sysexits: invalid input 65, unreachable 69, failed or
//! trapped 70, over capacity 75, needs approval 77, unauthorized 77, usage 2.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use crate::api::{CommandBody, GrantBody, RuleBody};
use crate::config::Config;

const EXAMPLES: &str = "\
Examples:
  stockade serve                                   # start the server (embedded wasmtime.toml)
  stockade exec demo -- echo hello                 # a fenced command; its exit code is ours
  git diff | stockade exec demo -- git apply       # stdin is forwarded when it is not a terminal (-n: not)
  stockade exec ci --grant 'GET,HEAD pypi.org/simple/' --grant '*.pythonhosted.org' -- pip download requests
  stockade start ci -- python3 -m http.server 8000 # detached: outlives the call, holds no grant
  stockade status ci 3f2b8c1e-…                    # running | exited(N) | gone(reason)
  stockade stop ci 3f2b8c1e-…
  stockade denials ci --json
  stockade artifacts ci report.tgz > report.tgz
  stockade put ci ./src                            # a directory (or a file, or - for a tar on stdin) into /workspace
  stockade approve ci -- git push                  # prints a token: exec … --approval TOKEN -- git push
  stockade doctor                                  # what this machine offers
  stockade demo                                    # the whole story, on real containers";

/// Stockade: fenced commands and detached processes in per-key Linux sandboxes.
#[derive(Debug, Parser)]
#[command(name = "stockade", version, after_help = EXAMPLES)]
pub struct Cli {
    /// The server's address.
    #[arg(
        long,
        global = true,
        env = "STOCKADE_SERVER",
        default_value = "http://127.0.0.1:8787"
    )]
    pub server: String,
    /// The API token (default: read from the data directory).
    #[arg(long, global = true, env = "STOCKADE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The data directory (where the token lives).
    #[arg(long, global = true, env = "STOCKADE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Print JSON (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    /// Log format of `serve`, `doctor` and `demo`.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    pub log_format: String,
    /// The verb.
    #[command(subcommand)]
    pub verb: Verb,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Verb {
    /// Run the server (HTTP API on 127.0.0.1:8787 by default).
    Serve(ServeArgs),
    /// Run a fenced command: stdout/stderr shown, its exit code becomes ours.
    Exec(ExecArgs),
    /// Start a detached process (no grant, ever); prints its id.
    Start(StartArgs),
    /// A detached process's status.
    Status { key: String, id: String },
    /// Kill a detached process's whole tree and forget it.
    Stop { key: String, id: String },
    /// Egress requests the fence refused for a key.
    Denials { key: String },
    /// Everything the egress fence decided for a key: admitted requests (status, bytes
    /// each way, credential headers added by name) and denials, in one timeline.
    Egress { key: String },
    /// Server-held secrets that grant rules' headers name (the approver's credential).
    Secret {
        /// The approver token (default: read from the data directory).
        #[arg(long, env = "STOCKADE_APPROVER_TOKEN", hide_env_values = true)]
        approver_token: Option<String>,
        #[command(subcommand)]
        verb: SecretVerb,
    },
    /// List a key's artifacts, or write one to stdout.
    Artifacts { key: String, name: Option<String> },
    /// Stop a key's container at once; clears its detached records.
    Abort { key: String },
    /// Snapshot /workspace, stop the container; the next call restores it.
    Checkpoint { key: String },
    /// Put a file, a directory (as a tar archive) or a tar archive from stdin (`-`) into
    /// the key's /workspace, owned by the container's user; DEST is relative to
    /// /workspace (default: SRC's name; for `-`, /workspace itself).
    Put {
        key: String,
        src: PathBuf,
        dest: Option<String>,
    },
    /// Record an approval for a key and exactly this command (the approver's credential:
    /// --approver-token, STOCKADE_APPROVER_TOKEN or <data>/approver-token); prints the
    /// token, which admits that command once, until it expires.
    Approve {
        /// The approver token (default: read from the data directory).
        #[arg(long, env = "STOCKADE_APPROVER_TOKEN", hide_env_values = true)]
        approver_token: Option<String>,
        key: String,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// What this machine offers (root, cgroup v2, namespaces, kill mode, pooling).
    Doctor(ConfigArgs),
    /// The seed's scenario end to end on real containers, step by step.
    Demo(ConfigArgs),
    /// Serve the Model Context Protocol on stdin/stdout (tools: exec, start, status,
    /// stop, denials, artifacts, put), as a client of the running server.
    Mcp,
}

/// Where the configuration comes from.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// A wasmtime.toml (default: the embedded one).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `serve`'s flags (override the file and the environment).
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Listen address.
    #[arg(long)]
    pub listen: Option<String>,
    /// `linux` or `mock`.
    #[arg(long)]
    pub substrate: Option<String>,
}

/// What a command runs with.
#[derive(Debug, Args)]
pub struct CommandArgs {
    /// Working directory inside the container (default /workspace).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Extra environment variable NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// An approval token (floor commands).
    #[arg(long)]
    pub approval: Option<String>,
    /// Do not forward this process's standard input (by default it is forwarded, read
    /// to its end, when it is not a terminal).
    #[arg(short = 'n', long)]
    pub no_stdin: bool,
    /// The command.
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

/// `exec`'s flags.
#[derive(Debug, Args)]
pub struct ExecArgs {
    pub key: String,
    /// An allow rule: `[METHODS ]HOST[/PATH-PREFIX]`, e.g. `GET,HEAD pypi.org/simple/` or
    /// `*.pythonhosted.org` (repeatable).
    #[arg(long = "grant", value_name = "RULE")]
    pub grant: Vec<String>,
    /// A JSON file of rules: `{"rules": [{"host": …, "methods": […], "path_prefix": …}]}`.
    #[arg(long)]
    pub grant_file: Option<PathBuf>,
    /// Run timeout in milliseconds.
    #[arg(long)]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

/// `start`'s flags.
#[derive(Debug, Args)]
pub struct StartArgs {
    pub key: String,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

/// A CLI failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// What went wrong, as the CLI prints it.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

/// `stockade secret …`.
#[derive(Debug, clap::Subcommand)]
pub enum SecretVerb {
    /// Set or replace NAME; the value is read from standard input (one line; a
    /// trailing newline is dropped), never from the command line. The secret is bound
    /// to one host (and port, 443 when none), the methods and a path prefix: a grant
    /// rule naming it must sit inside them.
    Set {
        name: String,
        /// The one host the secret may go to: `api.example.com[:port]`.
        #[arg(long)]
        host: String,
        /// A method a rule naming it may admit (repeat for several; GET, POST, ...).
        #[arg(long = "method", required = true)]
        methods: Vec<String>,
        /// The path prefix a rule naming it must sit under (default `/`).
        #[arg(long = "path")]
        path_prefix: Option<String>,
    },
    /// The names and where each comes from (never a value).
    List,
    /// Remove NAME.
    Rm { name: String },
}

/// Parse a `--grant` rule: `[METHODS ]HOST[/PATH-PREFIX]`.
pub fn parse_rule(s: &str) -> Result<RuleBody, String> {
    let s = s.trim();
    let (methods, rest) = match s.split_once(char::is_whitespace) {
        Some((m, r)) => (
            m.split(',')
                .map(|m| m.trim().to_ascii_uppercase())
                .collect(),
            r.trim(),
        ),
        None => (vec![], s),
    };
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    if host.is_empty() {
        return Err(format!("rule {s:?} has no host"));
    }
    Ok(RuleBody {
        host: host.to_string(),
        methods,
        path_prefix: path,
        ..RuleBody::default()
    })
}

fn command_body(c: CommandArgs) -> Result<CommandBody, Failure> {
    let mut env = std::collections::BTreeMap::new();
    for e in c.env {
        let (k, v) = e
            .split_once('=')
            .ok_or_else(|| Failure::new(2, format!("--env {e:?} is not NAME=VALUE")))?;
        env.insert(k.to_string(), v.to_string());
    }
    let stdin = if c.no_stdin { None } else { forwarded_stdin()? };
    Ok(CommandBody {
        argv: c.argv,
        cwd: c.cwd,
        env,
        approval: c.approval,
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

/// The CLI's entry point; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging(&cli);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stockade: cannot start the async runtime: {e}");
            return 70;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("stockade: {}", f.message);
            f.code
        }
    }
}

fn init_logging(cli: &Cli) {
    // The demo tells a story on stdout: its logs (stderr, the same terminal) stay at
    // warnings unless RUST_LOG asks for more.
    let default = match cli.verb {
        Verb::Serve(_) => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if cli.log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

fn load_config(
    path: Option<&std::path::Path>,
    data_dir: Option<&PathBuf>,
) -> Result<Config, Failure> {
    let mut cfg = Config::load(path).map_err(|e| Failure::new(78, e.to_string()))?;
    cfg.apply_env(|k| std::env::var(k).ok())
        .map_err(|e| Failure::new(78, e.to_string()))?;
    if let Some(d) = data_dir {
        cfg.substrate.data_dir = d.clone();
    }
    Ok(cfg)
}

async fn run(cli: Cli) -> Result<i32, Failure> {
    let client = || Client::new(&cli);
    match &cli.verb {
        Verb::Serve(a) => {
            let mut cfg = load_config(a.config.config.as_deref(), cli.data_dir.as_ref())?;
            if let Some(l) = &a.listen {
                cfg.api.listen = l.clone();
            }
            if let Some(s) = &a.substrate {
                cfg.substrate.kind = s.clone();
            }
            crate::serve::serve(cfg)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))?;
            Ok(0)
        }
        Verb::Doctor(a) => {
            let cfg = load_config(a.config.as_deref(), cli.data_dir.as_ref())?;
            crate::doctor::run(&cfg, cli.json)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))
        }
        Verb::Mcp => {
            crate::mcp::serve(client()?)
                .await
                .map_err(|e| Failure::new(74, format!("mcp: {e}")))?;
            Ok(0)
        }
        Verb::Demo(a) => {
            let cfg = load_config(a.config.as_deref(), cli.data_dir.as_ref())?;
            crate::demo::run(cfg)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))
        }
        Verb::Exec(a) => {
            let mut body = command_body(clone_cmd(&a.cmd))?;
            body.timeout_ms = a.timeout;
            let mut rules = vec![];
            for r in &a.grant {
                rules.push(parse_rule(r).map_err(|e| Failure::new(2, e))?);
            }
            if let Some(f) = &a.grant_file {
                let text = std::fs::read_to_string(f)
                    .map_err(|e| Failure::new(66, format!("{}: {e}", f.display())))?;
                let g: GrantBody = serde_json::from_str(&text)
                    .map_err(|e| Failure::new(65, format!("{}: {e}", f.display())))?;
                rules.extend(g.rules);
            }
            if !rules.is_empty() || a.grant_file.is_some() {
                body.grant = Some(GrantBody { rules });
            }
            if cli.json {
                let out = client()?
                    .call(
                        "POST",
                        &format!("/v1/sandboxes/{}/exec", a.key),
                        Some(json!(body)),
                    )
                    .await?;
                println!("{out}");
                return Ok(exit_code_of(&out));
            }
            // Live: each chunk printed as it arrives, then the outcome's notes.
            let b64 = base64::engine::general_purpose::STANDARD;
            let last = client()?
                .stream(
                    &format!("/v1/sandboxes/{}/exec/stream", a.key),
                    json!(body),
                    |ev| {
                        let bytes = match (ev["data"].as_str(), ev["data_base64"].as_str()) {
                            (Some(t), _) => t.as_bytes().to_vec(),
                            (None, Some(b)) => b64.decode(b).unwrap_or_default(),
                            _ => return,
                        };
                        let _ = match ev["type"].as_str() {
                            Some("stdout") => {
                                let mut o = std::io::stdout().lock();
                                o.write_all(&bytes).and_then(|()| o.flush())
                            }
                            Some("stderr") => {
                                let mut e = std::io::stderr().lock();
                                e.write_all(&bytes).and_then(|()| e.flush())
                            }
                            _ => Ok(()),
                        };
                    },
                )
                .await?;
            if last["type"] == "error" {
                let status = last["status"].as_u64().unwrap_or(500) as u16;
                return Err(Client::failure(status, last.to_string().as_bytes()));
            }
            for note in outcome_notes(&last) {
                eprintln!("stockade: {note}");
            }
            Ok(exit_code_of(&last))
        }
        Verb::Start(a) => {
            let body = command_body(clone_cmd(&a.cmd))?;
            let out = client()?
                .call(
                    "POST",
                    &format!("/v1/sandboxes/{}/detached", a.key),
                    Some(json!(body)),
                )
                .await?;
            print_or(cli.json, &out, |o| {
                o["id"].as_str().unwrap_or_default().to_string()
            });
            Ok(0)
        }
        Verb::Status { key, id } => {
            let out = client()?
                .call("GET", &format!("/v1/sandboxes/{key}/detached/{id}"), None)
                .await?;
            print_or(cli.json, &out, |v| {
                serde_json::from_value(v.clone())
                    .map(|s| crate::render::state_words(&s))
                    .unwrap_or_default()
            });
            Ok(0)
        }
        Verb::Stop { key, id } => {
            let out = client()?
                .call(
                    "DELETE",
                    &format!("/v1/sandboxes/{key}/detached/{id}"),
                    None,
                )
                .await?;
            print_or(cli.json, &out, |_| format!("stopped {id}"));
            Ok(0)
        }
        Verb::Denials { key } => {
            let out = client()?
                .call("GET", &format!("/v1/sandboxes/{key}/denials"), None)
                .await?;
            print_or(cli.json, &out, |o| {
                o["denials"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|d| {
                                format!(
                                    "{}  {} {}{}  {}  ({})",
                                    d["at_ms"],
                                    d["method"].as_str().unwrap_or(""),
                                    d["host"].as_str().unwrap_or(""),
                                    d["path"].as_str().unwrap_or(""),
                                    d["reason"].as_str().unwrap_or(""),
                                    d["rule_set"].as_str().unwrap_or("")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default()
            });
            Ok(0)
        }
        Verb::Artifacts { key, name: None } => {
            let out = client()?
                .call("GET", &format!("/v1/sandboxes/{key}/artifacts"), None)
                .await?;
            print_or(cli.json, &out, |o| {
                o["artifacts"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| {
                                format!(
                                    "{:>10}  {}",
                                    x["size"],
                                    printable(x["name"].as_str().unwrap_or(""))
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default()
            });
            Ok(0)
        }
        Verb::Artifacts {
            key,
            name: Some(name),
        } => {
            let c = client()?;
            let mut offset = 0u64;
            let mut out = std::io::stdout().lock();
            loop {
                let chunk = c
                    .raw(
                        "GET",
                        &format!(
                            "/v1/sandboxes/{key}/artifacts/{name}?offset={offset}&length=1048576"
                        ),
                        None,
                    )
                    .await?;
                if chunk.is_empty() {
                    break;
                }
                offset += chunk.len() as u64;
                out.write_all(&chunk)
                    .map_err(|e| Failure::new(74, e.to_string()))?;
            }
            Ok(0)
        }
        Verb::Put { key, src, dest } => {
            let (path, bytes) = put_request(key, src, dest.as_deref())?;
            let what = format!("putting {} into {key}", human_bytes(bytes.len() as u64));
            let (status, body) = with_progress(
                &what,
                client()?.send_bytes("PUT", &path, "application/octet-stream", bytes),
            )
            .await?;
            if !(200..300).contains(&status) {
                return Err(Client::failure(status, &body));
            }
            let out: Value = serde_json::from_slice(&body)
                .map_err(|e| Failure::new(70, format!("the server answered non-JSON: {e}")))?;
            print_or(cli.json, &out, |o| {
                format!(
                    "{} entries in {}",
                    o["entries"],
                    o["dest"].as_str().unwrap_or_default()
                )
            });
            Ok(0)
        }
        Verb::Abort { key } => {
            let out = client()?
                .call("POST", &format!("/v1/sandboxes/{key}/abort"), None)
                .await?;
            print_or(cli.json, &out, |_| format!("aborted {key}"));
            Ok(0)
        }
        Verb::Checkpoint { key } => {
            let out = with_progress(
                &format!("checkpointing {key}"),
                client()?.call("POST", &format!("/v1/sandboxes/{key}/checkpoint"), None),
            )
            .await?;
            print_or(cli.json, &out, |_| format!("checkpointed {key}"));
            Ok(0)
        }
        Verb::Egress { key } => {
            let out = client()?
                .call("GET", &format!("/v1/sandboxes/{key}/egress"), None)
                .await?;
            print_or(cli.json, &out, |o| {
                o["egress"]
                    .as_array()
                    .map(|a| a.iter().map(egress_line).collect::<Vec<_>>().join("\n"))
                    .unwrap_or_default()
            });
            Ok(0)
        }
        Verb::Secret {
            approver_token,
            verb,
        } => {
            let mut c = client()?;
            c.token = match approver_token {
                Some(t) => t.clone(),
                None => read_secret(&cli, "approver-token")?,
            };
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
                        .take(crate::egress::secrets::MAX_SECRET_VALUE as u64 + 2)
                        .read_to_string(&mut value)
                        .map_err(|e| Failure::new(66, format!("stdin: {e}")))?;
                    let value = value.trim_end_matches(['\n', '\r']);
                    c.raw(
                        "PUT",
                        &format!("/v1/secrets/{}", encode(name)),
                        Some(json!({
                            "value": value,
                            "host": host,
                            "methods": methods
                                .iter()
                                .map(|m| m.to_ascii_uppercase())
                                .collect::<Vec<_>>(),
                            "path_prefix": path_prefix.as_deref().unwrap_or("/"),
                        })),
                    )
                    .await?;
                    if !cli.json {
                        println!("secret {name} set");
                    }
                }
                SecretVerb::List => {
                    let out = c.call("GET", "/v1/secrets", None).await?;
                    print_or(cli.json, &out, |o| {
                        o["secrets"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .map(|s| {
                                        format!(
                                            "{}  ({})  {}",
                                            s["name"].as_str().unwrap_or(""),
                                            s["source"].as_str().unwrap_or(""),
                                            s["binding"].as_str().unwrap_or("unbound")
                                        )
                                    })
                                    .collect::<Vec<_>>()
                                    .join("\n")
                            })
                            .unwrap_or_default()
                    });
                }
                SecretVerb::Rm { name } => {
                    c.raw("DELETE", &format!("/v1/secrets/{}", encode(name)), None)
                        .await?;
                    if !cli.json {
                        println!("secret {name} removed");
                    }
                }
            }
            Ok(0)
        }
        Verb::Approve {
            approver_token,
            key,
            argv,
        } => {
            let mut c = client()?;
            c.token = match approver_token {
                Some(t) => t.clone(),
                None => read_secret(&cli, "approver-token")?,
            };
            let out = c
                .call(
                    "POST",
                    &format!("/v1/sandboxes/{key}/approvals"),
                    Some(json!({ "argv": argv })),
                )
                .await?;
            print_or(cli.json, &out, |o| {
                o["token"].as_str().unwrap_or_default().to_string()
            });
            Ok(0)
        }
    }
}

/// The request of `put`: its path and body. A file goes as itself to `files/DEST`; a
/// directory as a tar archive of its contents (symlinks kept as symlinks) and `-` (a tar
/// archive on stdin) as it is, to `files?dest=DEST`.
fn put_request(key: &str, src: &Path, dest: Option<&str>) -> Result<(String, Vec<u8>), Failure> {
    use std::io::Read;
    let usage = |m: String| Failure::new(2, m);
    let io = |e: std::io::Error| Failure::new(66, format!("{}: {e}", src.display()));
    let name = || {
        src.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| usage(format!("{} has no name: give DEST", src.display())))
    };
    let limit = crate::upload::MAX_ARCHIVE_BYTES as u64;
    if src == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let dest = dest.unwrap_or_default();
        return Ok((
            format!("/v1/sandboxes/{key}/files?dest={}", encode(dest)),
            bytes,
        ));
    }
    let meta = std::fs::metadata(src).map_err(io)?;
    if meta.is_dir() {
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", src).map_err(io)?;
        let bytes = b.into_inner().map_err(io)?;
        let dest = match dest {
            Some(d) => d.to_string(),
            None => name()?,
        };
        return Ok((
            format!("/v1/sandboxes/{key}/files?dest={}", encode(&dest)),
            bytes,
        ));
    }
    if meta.len() > limit {
        return Err(usage(format!(
            "{} is larger than {limit} bytes",
            src.display()
        )));
    }
    let bytes = std::fs::read(src).map_err(io)?;
    let dest = match dest {
        Some(d) => d.to_string(),
        None => name()?,
    };
    Ok((
        format!("/v1/sandboxes/{key}/files/{}", encode(&dest)),
        bytes,
    ))
}

/// Percent-encode what is not unreserved (slashes kept: they are the path's).
fn encode(s: &str) -> String {
    percent_encode(s, true)
}

/// Percent-encode everything but unreserved characters (and `/` if `keep_slash`).
pub(crate) fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn clone_cmd(c: &CommandArgs) -> CommandArgs {
    CommandArgs {
        cwd: c.cwd.clone(),
        env: c.env.clone(),
        approval: c.approval.clone(),
        no_stdin: c.no_stdin,
        argv: c.argv.clone(),
    }
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

/// A byte count for people.
fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

/// What the CLI says after an exec's output: a timeout, truncation, limits reached.
fn outcome_notes(out: &Value) -> Vec<&'static str> {
    let mut notes = vec![];
    if out["timed_out"] == true {
        notes.push("the command timed out and was killed");
    }
    if out["truncated"] == true {
        notes.push("output was truncated at the configured bound");
    }
    for limit in out["limits"].as_array().into_iter().flatten() {
        notes.push(match limit.as_str().unwrap_or_default() {
            "pids" => "a fork failed: the container's process limit was reached",
            "memory" => "the OOM killer killed a process: the container's memory limit was reached",
            "disk" => "the container's storage (/workspace, /artifacts, /tmp) is full",
            _ => continue,
        });
    }
    notes
}

/// The CLI's exit status for an exec outcome: the command's own, 124 for a timeout,
/// 128 + N for a signal.
fn exit_code_of(out: &Value) -> i32 {
    let code = out["exit_code"].as_i64().unwrap_or(70);
    if out["timed_out"] == true {
        124
    } else if code < 0 {
        128 + (-code as i32)
    } else {
        code as i32
    }
}

fn print_or(json: bool, v: &Value, text: impl FnOnce(&Value) -> String) {
    if json {
        println!("{v}");
    } else {
        let t = text(v);
        if !t.is_empty() {
            println!("{t}");
        }
    }
}

/// A token file of the data directory (`api-token`, `approver-token`).
fn read_secret(cli: &Cli, name: &str) -> Result<String, Failure> {
    let dir = match &cli.data_dir {
        Some(d) => d.clone(),
        None => load_config(None, None)?.substrate.data_dir,
    };
    let p = dir.join(name);
    std::fs::read_to_string(&p)
        .map(|t| t.trim().to_string())
        .map_err(|e| {
            Failure::new(
                77,
                format!(
                    "no {name} ({}: {e}); pass it with --token / --approver-token or the environment",
                    p.display()
                ),
            )
        })
}

/// A small HTTP/1.1 client for the API (the CLI's and `stockade mcp`'s).
pub(crate) struct Client {
    addr: String,
    token: String,
}

impl Client {
    fn new(cli: &Cli) -> Result<Self, Failure> {
        let addr = cli
            .server
            .strip_prefix("http://")
            .ok_or_else(|| {
                Failure::new(
                    2,
                    format!("--server {:?} must start with http://", cli.server),
                )
            })?
            .trim_end_matches('/')
            .to_string();
        let token = match &cli.token {
            Some(t) => t.clone(),
            None => read_secret(cli, "api-token")?,
        };
        Ok(Self { addr, token })
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, bytes::Bytes), Failure> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.send_bytes(method, path, "application/json", body.into_bytes())
            .await
    }

    pub(crate) async fn send_bytes(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, bytes::Bytes), Failure> {
        use http_body_util::BodyExt;
        let resp = self.open(method, path, content_type, body).await?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.unreachable(e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }

    fn unreachable(&self, e: String) -> Failure {
        Failure::new(
            69,
            format!("cannot reach the server at http://{}: {e}", self.addr),
        )
    }

    /// Send one request on a new connection; the response with its body unread.
    async fn open(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, Failure> {
        use http_body_util::Full;
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.addr)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", content_type)
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| Failure::new(2, e.to_string()))?;
        send.send_request(req)
            .await
            .map_err(|e| self.unreachable(e.to_string()))
    }

    pub(crate) fn failure(status: u16, bytes: &[u8]) -> Failure {
        let v: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("failed");
        let message = v["error"]["message"].as_str().unwrap_or("").to_string();
        let exit = match code {
            "invalid-input" | "malformed-json" | "malformed-body" | "payload-too-large" => 65,
            "unreachable" => 69,
            "over-capacity" => 75,
            "needs-approval" | "unauthorized" => 77,
            _ => 70,
        };
        Failure::new(exit, format!("{code} (HTTP {status}): {message}"))
    }

    /// POST `body` to an NDJSON route: every output event goes to `on_event` as it
    /// arrives; the final one (`exit` or `error`) is returned. A plain (non-2xx) answer is its error.
    async fn stream(
        &self,
        path: &str,
        body: Value,
        mut on_event: impl FnMut(&Value),
    ) -> Result<Value, Failure> {
        use http_body_util::BodyExt;
        let unreachable = |e: String| self.unreachable(e);
        let resp = self
            .open(
                "POST",
                path,
                "application/json",
                body.to_string().into_bytes(),
            )
            .await?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        if !(200..300).contains(&status) {
            let bytes = body
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            return Err(Self::failure(status, &bytes));
        }
        let mut pending: Vec<u8> = Vec::new();
        let mut last: Option<Value> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| unreachable(e.to_string()))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            pending.extend_from_slice(data);
            while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                let ev: Value = serde_json::from_slice(&line)
                    .map_err(|e| Failure::new(70, format!("the server sent a bad event: {e}")))?;
                if matches!(ev["type"].as_str(), Some("exit" | "error")) {
                    last = Some(ev);
                } else {
                    on_event(&ev);
                }
            }
        }
        last.ok_or_else(|| unreachable("the stream ended before the outcome".into()))
    }

    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let (status, bytes) = self.send(method, path, body).await?;
        if !(200..300).contains(&status) {
            return Err(Self::failure(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| Failure::new(70, format!("the server answered non-JSON: {e}")))
    }

    pub(crate) async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<bytes::Bytes, Failure> {
        let (status, bytes) = self.send(method, path, body).await?;
        if !(200..300).contains(&status) {
            return Err(Self::failure(status, &bytes));
        }
        Ok(bytes)
    }
}

/// One line of `stockade egress`: time, decision, method, host and path, then the
/// status and bytes of an admitted request or the reason of a denial.
fn egress_line(e: &Value) -> String {
    let s = |k: &str| printable(e[k].as_str().unwrap_or(""));
    let head = format!(
        "{}  {:5} {} {}{}",
        e["at_ms"],
        s("decision"),
        s("method"),
        s("host"),
        s("path")
    );
    if e["via"] == "summary" {
        // A fence's summary row: how many admitted requests its rate bound left out of
        // the audit (they were admitted; only their records are missing).
        return format!(
            "{}  allow {} more admitted requests of fence {} not recorded ({})",
            e["at_ms"],
            e["suppressed"],
            s("fence"),
            s("error")
        );
    }
    if e["decision"] == "allow" {
        let creds = e["credentials"]
            .as_array()
            .filter(|a| !a.is_empty())
            .map(|a| {
                let names: Vec<String> = a
                    .iter()
                    .map(|n| printable(n.as_str().unwrap_or("")))
                    .collect();
                format!("  +{}", names.join(",+"))
            })
            .unwrap_or_default();
        let error = if s("error").is_empty() {
            String::new()
        } else {
            format!("  ({})", s("error"))
        };
        format!(
            "{head}  {} {}  {}B up {}B down{creds}{error}",
            s("via"),
            e["status"],
            e["bytes_up"],
            e["bytes_down"]
        )
    } else {
        format!("{head}  {}  ({})", s("reason"), s("rule_set"))
    }
}

/// A name a container chose, safe to print on a terminal: control characters (a
/// newline that forges a line, an escape sequence) are shown escaped.
pub fn printable(name: &str) -> String {
    if name.chars().any(char::is_control) {
        name.escape_debug().to_string()
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fence_summary_row_prints_what_the_audit_left_out() {
        let row = serde_json::json!({
            "decision": "allow", "via": "summary", "at_ms": 7, "fence": "f-1",
            "suppressed": 42, "error": "rate-limited", "method": "", "host": "", "path": ""
        });
        assert_eq!(
            super::egress_line(&row),
            "7  allow 42 more admitted requests of fence f-1 not recorded (rate-limited)"
        );
    }

    use super::*;

    #[test]
    fn grant_rules_on_the_command_line() {
        let r = parse_rule("GET,head pypi.org/simple/").unwrap();
        assert_eq!(r.methods, ["GET", "HEAD"]);
        assert_eq!(r.host, "pypi.org");
        assert_eq!(r.path_prefix.as_deref(), Some("/simple/"));
        let r = parse_rule("*.pythonhosted.org").unwrap();
        assert!(r.methods.is_empty() && r.path_prefix.is_none());
        assert!(parse_rule("GET /x").is_err());
    }

    #[test]
    fn the_cli_parses_its_examples() {
        Cli::try_parse_from(["stockade", "exec", "demo", "--", "echo", "hello"]).unwrap();
        Cli::try_parse_from(["stockade", "--json", "status", "k", "id"]).unwrap();
        Cli::try_parse_from(["stockade", "approve", "k", "--", "git", "push"]).unwrap();
        assert!(
            Cli::try_parse_from(["stockade", "exec", "demo"]).is_err(),
            "exec needs a command"
        );
    }

    #[test]
    fn names_a_container_chose_cannot_forge_terminal_lines() {
        assert_eq!(printable("report.txt"), "report.txt");
        assert_eq!(printable("a\n999 fake"), "a\\n999 fake");
        assert!(!printable("x\u{1b}[31mred").contains('\u{1b}'));
    }
}
