//! The `stockade` CLI. `serve` runs the server; the other verbs talk to it over the
//! HTTP API through `stockade-client` (bearer token from `--token`, `STOCKADE_TOKEN`,
//! or the data directory); `doctor` and `demo` run in-process.
//!
//! Exit codes: a command's own exit code passes through `exec` (a signal N → 128+N, a
//! timeout → 124). Errors use sysexits: invalid input 65, unreachable 69, failed or
//! trapped 70, over capacity 75, needs approval 77, unauthorized 77, usage 2 (the
//! client's [`Error::exit_code`](stockade_client::Error::exit_code) for the server's
//! answers).
//!
//! `args` is what clap parses, `commands` one function per verb, `crate::render` the
//! text they print (shared with `stockade mcp`).

mod args;
mod commands;
mod preview;
mod shell;

use std::path::PathBuf;

use clap::Parser;
use stockade_client::Client;

pub use args::{
    Cli, CommandArgs, ConfigArgs, DEFAULT_SERVER, E2bVerb, EgressVerb, ExecArgs, NodeArgs,
    SecretVerb, ServeArgs, ShellArgs, StartArgs, Verb,
};

use stockade_runtime::config::Config;

/// A CLI failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    pub(super) fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<stockade_client::Error> for Failure {
    fn from(e: stockade_client::Error) -> Self {
        Failure::new(e.exit_code(), e.to_string())
    }
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
        Verb::Serve(_) | Verb::Node(_) => "info",
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

/// Run one parsed command line; its exit code.
async fn run(cli: Cli) -> Result<i32, Failure> {
    use commands as c;
    let json = cli.json;
    match &cli.verb {
        Verb::Serve(a) => {
            let mut cfg = load_config(a.config.config.as_deref(), cli.data_dir.as_ref())?;
            if let Some(l) = &a.listen {
                cfg.api.listen = l.clone();
            }
            if let Some(s) = &a.substrate {
                cfg.substrate.kind = s.clone();
            }
            let mut made = None;
            if a.mock {
                cfg.substrate.kind = "mock".into();
                // No data directory named: a fresh one of its own (the built-in one is
                // a production server's, and root's), removed when it stops.
                if cli.data_dir.is_none() && a.config.config.is_none() {
                    cfg.substrate.data_dir = std::env::temp_dir()
                        .join(format!("stockade-mock-{}", uuid::Uuid::new_v4().simple()));
                    made = Some(cfg.substrate.data_dir.clone());
                }
            }
            let served = crate::serve::serve_with(cfg, a.mock_script.clone()).await;
            if let Some(d) = made {
                let _ = std::fs::remove_dir_all(d);
            }
            served.map_err(|e| Failure::new(70, format!("{e:#}")))?;
            Ok(0)
        }
        Verb::Node(a) => {
            let mut cfg = load_config(a.config.config.as_deref(), cli.data_dir.as_ref())?;
            if let Some(l) = &a.listen {
                cfg.node.listen = l.clone();
            }
            stockade_node::run(cfg)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))?;
            Ok(0)
        }
        Verb::Doctor(a) => {
            let cfg = load_config(a.config.as_deref(), cli.data_dir.as_ref())?;
            crate::doctor::run(&cfg, json)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))
        }
        Verb::Demo(a) => {
            let cfg = load_config(a.config.as_deref(), cli.data_dir.as_ref())?;
            crate::demo::run(cfg)
                .await
                .map_err(|e| Failure::new(70, format!("{e:#}")))
        }
        Verb::Mcp => {
            crate::mcp::serve(client(&cli)?)
                .await
                .map_err(|e| Failure::new(74, format!("mcp: {e}")))?;
            Ok(0)
        }
        Verb::Exec(a) => c::exec(&client(&cli)?, a, json).await,
        Verb::Shell(a) => {
            let rules = a
                .grant
                .iter()
                .map(|r| c::shorthand_rule(r))
                .collect::<Result<Vec<_>, _>>()?;
            let grant = (!rules.is_empty()).then(|| stockade_wire::GrantBody {
                rules,
                ..Default::default()
            });
            shell::shell(cli.server(), &consumer_token(&cli)?, a, grant).await
        }
        Verb::Start(a) => c::start(&client(&cli)?, a, json).await,
        Verb::Status { key, id } => c::status(&client(&cli)?, key, id, json).await,
        Verb::Stop { key, id } => c::stop(&client(&cli)?, key, id, json).await,
        Verb::Denials { key } => c::denials(&client(&cli)?, key, json).await,
        Verb::Egress {
            key: Some(key),
            verb: None,
        } => c::egress(&client(&cli)?, key, json).await,
        Verb::Egress { verb: None, .. } => Err(Failure::new(
            64,
            "stockade egress KEY, or stockade egress pending|approve|refuse",
        )),
        Verb::Egress {
            verb: Some(verb), ..
        } => match verb {
            EgressVerb::Pending { key } => {
                c::egress_pending(&pending_client(&cli)?, key.as_deref(), json).await
            }
            EgressVerb::Approve { approver_token, id } => {
                let a = approver(&cli, approver_token.as_ref())?;
                c::egress_decide(&a, id, stockade_wire::Verdict::Approve, json).await
            }
            EgressVerb::Refuse { approver_token, id } => {
                let a = approver(&cli, approver_token.as_ref())?;
                c::egress_decide(&a, id, stockade_wire::Verdict::Refuse, json).await
            }
        },
        Verb::Artifacts { key, name: None } => c::artifacts(&client(&cli)?, key, json).await,
        Verb::Artifacts {
            key,
            name: Some(name),
        } => c::read_artifact(&client(&cli)?, key, name).await,
        Verb::Put { key, src, dest } => {
            c::put(&client(&cli)?, key, src, dest.as_deref(), json).await
        }
        Verb::Abort { key } => c::abort(&client(&cli)?, key, json).await,
        Verb::Expose { key, port } => preview::expose(&client(&cli)?, key, *port, json).await,
        Verb::Unexpose { key, port } => preview::unexpose(&client(&cli)?, key, *port, json).await,
        Verb::Previews { key } => preview::previews(&client(&cli)?, key, json).await,
        Verb::Checkpoint { key } => c::checkpoint(&client(&cli)?, key, json).await,
        Verb::Ensure { key } => c::ensure(&client(&cli)?, key, json).await,
        Verb::Snapshot { verb } => c::snapshot(&client(&cli)?, verb, json).await,
        Verb::Sandboxes { prefix } => {
            c::sandboxes(&client(&cli)?, prefix.as_deref().unwrap_or(""), json).await
        }
        Verb::Info { key } => c::info(&client(&cli)?, key, json).await,
        Verb::Lifetime {
            key,
            seconds,
            on_end,
            ..
        } => c::lifetime(&client(&cli)?, key, *seconds, on_end, json).await,
        Verb::Metadata { key, pairs } => c::metadata(&client(&cli)?, key, pairs, json).await,
        Verb::Network { grant, clear } => c::network(&client(&cli)?, grant, *clear, json).await,
        Verb::Forget { key } => c::forget(&client(&cli)?, key, json).await,
        Verb::Fork { key, source, name } => c::fork(&client(&cli)?, key, source, name, json).await,
        Verb::Token { verb } => c::token(&client(&cli)?, verb, json).await,
        Verb::E2b {
            verb: E2bVerb::Env { domain: None },
        } => {
            print!("{}", e2b_env(cli.server(), &consumer_token(&cli)?));
            Ok(0)
        }
        Verb::E2b {
            verb: E2bVerb::Env {
                domain: Some(domain),
            },
        } => {
            if !crate::e2b::domain::valid_domain(domain) {
                return Err(Failure::new(
                    64,
                    format!("--domain {domain:?}: not a DNS name"),
                ));
            }
            print!("{}", e2b_domain_env(domain, &consumer_token(&cli)?));
            Ok(0)
        }
        Verb::E2b {
            verb:
                E2bVerb::Serve {
                    listen,
                    internet,
                    domain,
                    tls_listen,
                    tls_cert,
                    tls_key,
                },
        } => {
            let d = crate::e2b::domain::configure(
                domain.as_deref(),
                tls_listen.as_deref(),
                tls_cert.as_deref(),
                tls_key.as_deref(),
                ["--domain", "--tls-listen", "--tls-cert", "--tls-key"],
            )
            .map_err(|m| Failure::new(64, m))?;
            e2b_gateway(cli.server(), &consumer_token(&cli)?, listen, internet, d).await
        }
        Verb::Secret {
            approver_token,
            verb,
        } => c::secret(&approver(&cli, approver_token.as_ref())?, verb, json).await,
        Verb::Approve {
            approver_token,
            key,
            argv,
        } => c::approve(&approver(&cli, approver_token.as_ref())?, key, argv, json).await,
    }
}

/// `egress pending`'s client: either token lists; the consumer's when one is given
/// or readable, else the approver's.
fn pending_client(cli: &Cli) -> Result<Client, Failure> {
    client(cli).or_else(|_| approver(cli, None))
}

/// `stockade e2b serve`: the E2B layer in front of `server` until SIGTERM or SIGINT.
async fn e2b_gateway(
    server: &str,
    token: &str,
    listen: &str,
    internet: &[String],
    domain: Option<crate::e2b::domain::Settings>,
) -> Result<i32, Failure> {
    let e = crate::e2b::E2b::gateway(
        server,
        internet,
        token,
        domain.as_ref().map(|d| d.domain.as_str()),
    )
    .map_err(|m| Failure::new(65, m))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|x| Failure::new(69, format!("listen on {listen}: {x}")))?;
    let domain_listener = match &domain {
        Some(d) => Some(
            tokio::net::TcpListener::bind(d.listen)
                .await
                .map_err(|x| Failure::new(69, format!("--tls-listen {}: {x}", d.listen)))?,
        ),
        None => None,
    };
    let local = listener
        .local_addr()
        .map_err(|x| Failure::new(70, x.to_string()))?;
    let mut signals = stockade_runtime::signals::Signals::install()
        .map_err(|x| Failure::new(70, format!("install the signal handlers: {x}")))?;
    tracing::info!(target: "stockade::e2b", listen = %local, api = %server, "e2b gateway serving");
    eprintln!("stockade: e2b gateway serving on http://{local} in front of {server}");
    // The largest body the API itself takes (24 MiB), as `stockade serve` mounts it.
    let app = crate::e2b::router(e.clone(), 24 << 20);
    // The domain form: the same router behind one HTTPS listener routed by Host.
    let domain_task = match (domain, domain_listener) {
        (Some(d), Some(l)) => {
            tracing::info!(target: "stockade::e2b", listen = %d.listen, domain = %d.domain, "e2b domain form serving");
            eprintln!(
                "stockade: e2b domain form serving on https://api.{} at {}",
                d.domain, d.listen
            );
            let app = crate::e2b::domain::router(e, &d.domain, app.clone());
            Some(tokio::spawn(crate::e2b::domain::serve(l, d.tls, app)))
        }
        _ => None,
    };
    let _stop_domain = AbortOnDrop(domain_task);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signals.recv().await;
        })
        .await
        .map_err(|x| Failure::new(70, x.to_string()))?;
    Ok(0)
}

/// The `export` lines that point the E2B SDK at `server` with `token` (pure): the
/// control plane and envd under the server's `/e2b` (docs/E2B.md), each value
/// single-quoted for the shell. `E2B_VALIDATE_API_KEY=false`: a Stockade token is not
/// E2B's `e2b_<hex>`, and SDK versions that check the key's shape before sending it
/// (Python `e2b` 2.31.0, the one openai-agents pins) refuse it unless told not to.
pub fn e2b_env(server: &str, token: &str) -> String {
    let base = server.trim_end_matches('/');
    let q = |v: &str| format!("'{}'", v.replace('\'', "'\\''"));
    format!(
        "export E2B_API_URL={}\nexport E2B_SANDBOX_URL={}\nexport E2B_API_KEY={}\n\
         export E2B_VALIDATE_API_KEY='false'\n",
        q(&format!("{base}{}", crate::e2b::API_PREFIX)),
        q(&format!("{base}{}", crate::e2b::ENVD_PREFIX)),
        q(token),
    )
}

/// The `export` lines that point the E2B SDK at a server's domain form (pure):
/// `E2B_DOMAIN` (the SDK then reaches `https://api.{domain}` and
/// `https://{port}-{id}.{domain}`), the token, and `E2B_VALIDATE_API_KEY=false` (as
/// [`e2b_env`]).
pub fn e2b_domain_env(domain: &str, token: &str) -> String {
    let q = |v: &str| format!("'{}'", v.replace('\'', "'\\''"));
    format!(
        "export E2B_DOMAIN={}\nexport E2B_API_KEY={}\nexport E2B_VALIDATE_API_KEY='false'\n",
        q(domain),
        q(token),
    )
}

/// A task aborted when this is dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// The client of `--server` with the consumer's token.
fn client(cli: &Cli) -> Result<Client, Failure> {
    let token = match &cli.token {
        Some(t) => t.clone(),
        None => read_secret(cli, "api-token")?,
    };
    Ok(Client::new(cli.server(), token)?)
}

/// The consumer's token (`--token`, the environment, or the data directory).
fn consumer_token(cli: &Cli) -> Result<String, Failure> {
    match &cli.token {
        Some(t) => Ok(t.clone()),
        None => read_secret(cli, "api-token"),
    }
}

/// The client of `--server` with the approver's token.
fn approver(cli: &Cli, token: Option<&String>) -> Result<Client, Failure> {
    let token = match token {
        Some(t) => t.clone(),
        None => read_secret(cli, "approver-token")?,
    };
    Ok(Client::new(cli.server(), token)?)
}

/// A token file of the data directory (`api-token`, `approver-token`); with
/// `--server`, which file it was is said once on stderr ([`token_from_file`]).
fn read_secret(cli: &Cli, name: &str) -> Result<String, Failure> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let dir = match &cli.data_dir {
        Some(d) => d.clone(),
        None => load_config(None, None)?.substrate.data_dir,
    };
    let p = dir.join(name);
    // A data directory the user named (--data-dir, STOCKADE_DATA_DIR) is the token file
    // they chose: only the built-in one is said.
    let other = cli.server.as_deref().filter(|_| cli.data_dir.is_none());
    let (token, note) = token_from_file(name, &p, other, std::fs::read_to_string(&p))?;
    if let Some(note) = note
        && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        eprintln!("stockade: {note}");
    }
    Ok(token)
}

/// The token read from the data directory's file `name` at `path` (`read`: what
/// reading it gave), and what to tell the user about it. A token not given on the
/// command line or in the environment comes from this machine's data directory; when
/// the server is another one (`server`: `--server` or `STOCKADE_SERVER` was given),
/// the note names the file, so a token of the wrong server is not sent silently, and a
/// missing or empty file is an error naming it and the server. Pure.
fn token_from_file(
    name: &str,
    path: &std::path::Path,
    server: Option<&str>,
    read: std::io::Result<String>,
) -> Result<(String, Option<String>), Failure> {
    let flag = if name == "approver-token" {
        "--approver-token or STOCKADE_APPROVER_TOKEN"
    } else {
        "--token or STOCKADE_TOKEN"
    };
    let why = match read.map(|t| t.trim().to_string()) {
        Ok(t) if !t.is_empty() => {
            let note = server.map(|s| {
                format!(
                    "--server {s}: using the {name} in {} (this machine's data directory; {flag} to give that server's)",
                    path.display()
                )
            });
            return Ok((t, note));
        }
        Ok(_) => "it is empty".to_string(),
        Err(e) => e.to_string(),
    };
    let message = match server {
        Some(s) => format!(
            "--server {s}: no {name} was given ({flag}) and {} cannot be used ({why}); pass that server's {name} with {flag}",
            path.display()
        ),
        None => format!("no {name} ({}: {why}); pass it with {flag}", path.display()),
    };
    Err(Failure::new(77, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_env_points_the_sdk_at_the_server_quoted_for_the_shell() {
        assert_eq!(
            e2b_env("http://127.0.0.1:8787/", "stk_a_b"),
            "export E2B_API_URL='http://127.0.0.1:8787/e2b'\n\
             export E2B_SANDBOX_URL='http://127.0.0.1:8787/e2b/envd'\n\
             export E2B_API_KEY='stk_a_b'\n\
             export E2B_VALIDATE_API_KEY='false'\n"
        );
        assert!(e2b_env("http://h:1", "a'b").contains("\nexport E2B_API_KEY='a'\\''b'\n"));
        Cli::try_parse_from(["stockade", "e2b", "env"]).unwrap();
        assert_eq!(
            e2b_domain_env("e2b.test", "stk_a_b"),
            "export E2B_DOMAIN='e2b.test'\nexport E2B_API_KEY='stk_a_b'\n\
             export E2B_VALIDATE_API_KEY='false'\n"
        );
        Cli::try_parse_from(["stockade", "e2b", "env", "--domain", "e2b.test"]).unwrap();
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
    fn a_token_from_the_data_directory_is_named_when_the_server_is_another() {
        use std::io::{Error, ErrorKind};
        let p = std::path::Path::new("/var/lib/stockade/api-token");
        let ok = || Ok("t0k\n".to_string());
        let missing = || Err(Error::from(ErrorKind::NotFound));
        // This machine's server: the token, nothing said.
        let (t, note) = token_from_file("api-token", p, None, ok()).unwrap();
        assert_eq!((t.as_str(), note), ("t0k", None));
        // Another server: the token, and the file it came from said.
        let (t, note) = token_from_file("api-token", p, Some("https://h:8787"), ok()).unwrap();
        assert_eq!(t, "t0k");
        assert_eq!(
            note.unwrap(),
            "--server https://h:8787: using the api-token in /var/lib/stockade/api-token \
             (this machine's data directory; --token or STOCKADE_TOKEN to give that server's)"
        );
        // Missing or empty: an error naming the file (and the server, when given).
        for read in [missing(), Ok(" \n".to_string())] {
            let e = token_from_file("api-token", p, Some("https://h:8787"), read).unwrap_err();
            assert_eq!(e.code, 77);
            assert!(e.message.starts_with("--server https://h:8787: no api-token was given (--token or STOCKADE_TOKEN) and /var/lib/stockade/api-token cannot be used ("), "{}", e.message);
        }
        let e = token_from_file("approver-token", p, None, missing()).unwrap_err();
        assert!(
            e.message
                .starts_with("no approver-token (/var/lib/stockade/api-token: "),
            "{}",
            e.message
        );
        assert!(
            e.message
                .ends_with("pass it with --approver-token or STOCKADE_APPROVER_TOKEN"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_server_is_the_default_unless_given() {
        let cli = Cli::try_parse_from(["stockade", "denials", "k"]).unwrap();
        assert_eq!(
            (cli.server.as_deref(), cli.server()),
            (None, DEFAULT_SERVER)
        );
        let cli =
            Cli::try_parse_from(["stockade", "--server", "http://h:1", "denials", "k"]).unwrap();
        assert_eq!(cli.server(), "http://h:1");
    }
}
