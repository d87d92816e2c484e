//! The command line as clap reads it: the global flags, one variant per verb, the
//! flags each verb takes. No behaviour here: `commands` runs what is parsed.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  stockade serve                                   # start the server (embedded wasmtime.toml)
  stockade node --config node.toml                 # serve this machine's substrate to fronts (docs/NODE.md)
  stockade exec demo -- echo hello                 # a fenced command; its exit code is ours
  git diff | stockade exec demo -- git apply       # stdin is forwarded when it is not a terminal (-n: not)
  stockade exec ci --grant 'GET,HEAD pypi.org/simple/' --grant '*.pythonhosted.org' -- pip download requests
  stockade shell ci                                # an interactive terminal (a fenced exec)
  stockade start ci -- python3 -m http.server 8000 # detached: outlives the call, holds no grant
  stockade status ci 3f2b8c1e-…                    # running | exited(N) | gone(reason)
  stockade stop ci 3f2b8c1e-…
  stockade denials ci --json
  stockade artifacts ci report.tgz > report.tgz
  stockade put ci ./src                            # a directory (or a file, or - for a tar on stdin) into /workspace
  stockade approve ci -- git push                  # prints a token: exec … --approval TOKEN -- git push
  stockade serve --mock                            # a test double of the API: no root, no containers (docs/MOCK.md)
  stockade doctor                                  # what this machine offers
  stockade demo                                    # the whole story, on real containers";

/// Stockade: fenced commands and detached processes in per-key Linux sandboxes.
#[derive(Debug, Parser)]
#[command(name = "stockade", version, after_help = EXAMPLES)]
pub struct Cli {
    /// The server's address (default: http://127.0.0.1:8787, this machine's
    /// `stockade serve`).
    #[arg(long, global = true, env = "STOCKADE_SERVER")]
    pub server: Option<String>,
    /// The API token (default: read from the data directory; with `--server` and the
    /// built-in data directory, the file read is named on stderr).
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

/// The server a CLI without `--server` (or `STOCKADE_SERVER`) talks to.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8787";

impl Cli {
    /// The server's address: `--server`, `STOCKADE_SERVER`, or [`DEFAULT_SERVER`].
    pub fn server(&self) -> &str {
        self.server.as_deref().unwrap_or(DEFAULT_SERVER)
    }
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Verb {
    /// Run the server (HTTP API on 127.0.0.1:8787 by default).
    Serve(ServeArgs),
    /// Serve this machine's substrate to fronts over HTTPS (docs/NODE.md; 127.0.0.1:8788
    /// by default).
    Node(NodeArgs),
    /// Run a fenced command: stdout/stderr shown, its exit code becomes ours.
    Exec(ExecArgs),
    /// An interactive terminal in the key's container (a fenced exec: its grant lives
    /// only while the session runs); default: /bin/sh -i. Exits with the command's code.
    Shell(ShellArgs),
    /// Start a detached process (no grant, ever); prints its id.
    Start(StartArgs),
    /// A detached process's status.
    Status { key: String, id: String },
    /// Kill a detached process's whole tree and forget it.
    Stop { key: String, id: String },
    /// Egress requests the fence refused for a key.
    Denials { key: String },
    /// Everything the egress fence decided for a key: admitted requests (status, bytes
    /// each way, credential headers added by name) and denials, in one timeline; or,
    /// with a verb, the requests `--ask` grants hold for the approver.
    #[command(args_conflicts_with_subcommands = true)]
    Egress {
        key: Option<String>,
        #[command(subcommand)]
        verb: Option<EgressVerb>,
    },
    /// Server-held secrets that grant rules' headers name (the approver's credential).
    Secret {
        /// The approver token (default: read from the data directory).
        #[arg(long, env = "STOCKADE_APPROVER_TOKEN", hide_env_values = true)]
        approver_token: Option<String>,
        #[command(subcommand)]
        verb: SecretVerb,
    },
    /// The E2B-compatible API (docs/E2B.md): `stockade e2b env` prints the `export`
    /// lines that point the unmodified E2B SDK at this server.
    E2b {
        #[command(subcommand)]
        verb: E2bVerb,
    },
    /// Scoped consumer tokens (the operator's token): each reaches only its keys and
    /// holds at most its share of the ceiling (docs/TENANTS.md).
    Token {
        #[command(subcommand)]
        verb: TokenVerb,
    },
    /// List a key's artifacts, or write one to stdout.
    Artifacts { key: String, name: Option<String> },
    /// Start a key's container if it has none (restoring its checkpoint): no command,
    /// no grant; a refusal (over capacity, the token's share) comes now.
    Ensure { key: String },
    /// Stop a key's container at once; clears its detached records.
    Abort { key: String },
    /// Open a preview door onto PORT (127.0.0.1 inside the key's running container);
    /// prints its URL. The door closes on unexpose, abort, checkpoint or stop.
    Expose { key: String, port: u32 },
    /// Close the preview door onto PORT.
    Unexpose { key: String, port: u32 },
    /// The key's open preview doors: PORT  URL.
    Previews { key: String },
    /// Snapshot /workspace, stop the container; the next call restores it.
    Checkpoint { key: String },
    /// The known keys (given a lifetime, metadata or a network) this token reaches:
    /// KEY  running|stopped  ENDS  NAME=VALUE…
    Sandboxes { prefix: Option<String> },
    /// One known key, as `sandboxes` lists it.
    Info { key: String },
    /// Give KEY a lifetime: it ends after SECONDS (`--in`), or never (`--clear`); at its
    /// end it is aborted and forgotten, or checkpointed (`--on-end checkpoint`).
    Lifetime {
        key: String,
        /// Seconds from now.
        #[arg(
            long = "in",
            conflicts_with = "clear",
            required_unless_present = "clear"
        )]
        seconds: Option<u64>,
        /// Take the lifetime away.
        #[arg(long)]
        clear: bool,
        /// `abort` (default) or `checkpoint`.
        #[arg(long, default_value = "abort", value_parser = ["abort", "checkpoint"])]
        on_end: String,
    },
    /// Replace KEY's metadata with NAME=VALUE pairs (none: clear it).
    Metadata { key: String, pairs: Vec<String> },
    /// Give KEY a network: the grant of each of its fenced commands that brings none
    /// (`exec` without `--grant`), open only while that command runs; a detached process
    /// never runs under it. `--clear` takes it away.
    Network {
        #[command(flatten)]
        grant: GrantArgs,
        /// Take the network away (its commands then run with no rule).
        #[arg(long, conflicts_with_all = ["grant", "grant_file", "ask"])]
        clear: bool,
    },
    /// Abort a known KEY and forget it (its lifetime, metadata, network; named snapshots stay).
    Forget { key: String },
    /// Named snapshots of a key's /workspace: save (the container runs on), list,
    /// delete.
    Snapshot {
        #[command(subcommand)]
        verb: SnapshotVerb,
    },
    /// Start KEY from SOURCE's snapshot NAME: it becomes KEY's restore cache (KEY must
    /// have no container), and KEY's next container starts from it.
    Fork {
        key: String,
        source: String,
        name: String,
    },
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
    /// Serve the API over the mock substrate: a TEST DOUBLE for a consumer's tests (no
    /// root, no containers; nothing runs: outcomes are scripted). Its own routes
    /// (`/v1/mock/…`) script outcomes, arm faults and read each key's trace
    /// (docs/MOCK.md). Without --data-dir, a fresh temporary one.
    #[arg(long, conflicts_with = "substrate")]
    pub mock: bool,
    /// The mock's script at start (JSON, docs/MOCK.md): rules matching argv to outcomes.
    #[arg(long, value_name = "FILE", requires = "mock")]
    pub mock_script: Option<PathBuf>,
}

/// `node`'s flags (override the file and the environment).
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Listen address (`node.listen`).
    #[arg(long)]
    pub listen: Option<String>,
}

/// What a command runs with.
#[derive(Debug, Clone, Args)]
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

/// A grant's flags (`exec`'s, `network`'s): the key and its rules.
#[derive(Debug, Args)]
pub struct GrantArgs {
    pub key: String,
    /// An allow rule: `[METHODS ]HOST[/PATH-PREFIX]`, e.g. `GET,HEAD pypi.org/simple/` or
    /// `*.pythonhosted.org` (repeatable).
    #[arg(long = "grant", value_name = "RULE")]
    pub grant: Vec<String>,
    /// A JSON file of rules: `{"rules": [{"host": …, "methods": […], "path_prefix": …}]}`.
    #[arg(long)]
    pub grant_file: Option<PathBuf>,
    /// Hold what the rules refuse for want of a rule for the approver to answer
    /// (`stockade egress pending`, `stockade egress approve|refuse ID`) instead of
    /// denying it at once.
    #[arg(long)]
    pub ask: bool,
}

/// `exec`'s flags.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The key and the command's own grant (none: the key's network, if it has one).
    #[command(flatten)]
    pub grant: GrantArgs,
    /// Run timeout in milliseconds.
    #[arg(long)]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

/// `shell`'s flags.
#[derive(Debug, Args)]
pub struct ShellArgs {
    pub key: String,
    /// An allow rule for the session's life (as `exec --grant`; repeatable).
    #[arg(long = "grant", value_name = "RULE")]
    pub grant: Vec<String>,
    /// The session's timeout in milliseconds (the guest's bound applies).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Working directory inside the container (default /workspace).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Extra environment variable NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// An approval token (floor commands).
    #[arg(long)]
    pub approval: Option<String>,
    /// The command (default: the container's shell).
    #[arg(last = true)]
    pub argv: Vec<String>,
}

/// `start`'s flags.
#[derive(Debug, Args)]
pub struct StartArgs {
    pub key: String,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

/// `stockade secret …`.
#[derive(Debug, Subcommand)]
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

/// `stockade e2b …`.
#[derive(Debug, Subcommand)]
pub enum E2bVerb {
    /// Print `export E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… E2B_VALIDATE_API_KEY=false`
    /// for `--server` and the consumer's token (`--token`, STOCKADE_TOKEN or the data directory's):
    /// `eval "$(stockade e2b env)"`. With `--domain D`: the domain form instead,
    /// `export E2B_DOMAIN=D E2B_API_KEY=… E2B_VALIDATE_API_KEY=false`.
    Env {
        /// The server's domain form (its `[e2b] domain`, or the gateway's `--domain`):
        /// print `E2B_DOMAIN` instead of the explicit URLs.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Serve the E2B-compatible API in front of `--server` (any Stockade API: another
    /// `stockade serve`, the edge Worker), as a client of it with each caller's token
    /// (docs/E2B.md, "In front of any front"). Its sandboxes' table is in memory; the
    /// token (`--token`, STOCKADE_TOKEN or the data directory's) ends sandboxes at
    /// their timeout. Point the SDK at it with `stockade e2b env --server <its URL>`.
    Serve {
        /// Listen address (port 0: any free port; the log names the bound one).
        #[arg(long, default_value = "127.0.0.1:8791")]
        listen: String,
        /// A host of "the internet" of `allow_internet_access` (repeatable; the
        /// syntax of `[e2b] internet`). None: no internet.
        #[arg(long)]
        internet: Vec<String>,
        /// E2B's domain form (docs/E2B.md "The domain form"): `api.DOMAIN` and
        /// `PORT-ID.DOMAIN` on one HTTPS listener. All four of `--domain`,
        /// `--tls-listen`, `--tls-cert`, `--tls-key`, or none.
        #[arg(long)]
        domain: Option<String>,
        /// The domain form's HTTPS listener, `ADDR:PORT` (the SDK dials 443).
        #[arg(long)]
        tls_listen: Option<String>,
        /// Its certificate chain (PEM) for `api.DOMAIN` and `*.DOMAIN`.
        #[arg(long)]
        tls_cert: Option<PathBuf>,
        /// Its private key (PEM).
        #[arg(long)]
        tls_key: Option<PathBuf>,
    },
}

/// `stockade token …`.
#[derive(Debug, Subcommand)]
pub enum TokenVerb {
    /// Make a token; prints it once (the server keeps only its digest).
    Create {
        /// The keys it reaches: one key, or a prefix ending in `*` (`ci-*`). No two live
        /// tokens' keys overlap.
        #[arg(long)]
        keys: String,
        /// Its share of the ceiling: live containers it may hold at once (default: the
        /// server's ceiling).
        #[arg(long)]
        ceiling: Option<u32>,
        /// A label (default: the pattern).
        #[arg(long)]
        name: Option<String>,
    },
    /// Every token: ID  KEYS  CEILING  NAME  (revoked ones marked).
    List,
    /// Revoke a token by its id: it is a wrong token from now on.
    Revoke { id: String },
}

/// `snapshot save|list|rm`.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotVerb {
    /// Archive KEY's /workspace as NAME (`[a-z0-9._-]`, at most 64), replacing one of
    /// that name; starts KEY's container if it has none.
    Save { key: String, name: String },
    /// KEY's named snapshots: NAME  TAKEN.
    List { key: String },
    /// Delete KEY's snapshot NAME.
    Rm { key: String, name: String },
}

/// `egress pending|approve|refuse` (docs/EGRESS.md, "Egress that can ask").
#[derive(Debug, clap::Subcommand)]
pub enum EgressVerb {
    /// The requests held for the approver (either token): ID  KEY  METHOD URL  REASON.
    Pending {
        /// Only this key's.
        key: Option<String>,
    },
    /// Let a held request through; its fence admits the same request again, until it
    /// closes (the approver's token).
    Approve {
        /// The approver token (default: read from the data directory).
        #[arg(long, env = "STOCKADE_APPROVER_TOKEN", hide_env_values = true)]
        approver_token: Option<String>,
        id: String,
    },
    /// Refuse a held request: 403 `refused-by-approver` (the approver's token).
    Refuse {
        /// The approver token (default: read from the data directory).
        #[arg(long, env = "STOCKADE_APPROVER_TOKEN", hide_env_values = true)]
        approver_token: Option<String>,
        id: String,
    },
}
