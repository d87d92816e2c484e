//! The process API between the host and a container's supervisor: one JSON object per
//! line each way, one request answered by one response, over the inherited Unix socket
//! (a streaming `run` sends its `output` frames before its response).

use serde::{Deserialize, Serialize};

use crate::process::{ProcessInfo, RunResult};

/// A request from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Is the supervisor up (its mounts done, serving)?
    Ping,
    /// Start a tracked process.
    Start {
        /// The command.
        spec: Spec,
    },
    /// Run a command in its own tree and wait for its leader.
    Run {
        /// The command.
        spec: Spec,
        /// Kill the tree after this long.
        timeout_ms: u64,
        /// Captured bytes per stream.
        output_limit: u64,
        /// Send the output as it is produced ([`Response::Output`] frames before the
        /// final [`Response::Ran`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stream: bool,
    },
    /// Every tracked process.
    List,
    /// One tracked process.
    Status {
        /// Its id.
        id: String,
    },
    /// Kill one tracked tree and forget it.
    Kill {
        /// Its id.
        id: String,
    },
    /// Kill every tracked tree.
    KillAll {
        /// The tree of a fenced run the host began and has no answer of: if its run
        /// has not reached the supervisor yet (this kill overtook it on another
        /// connection), it is refused when it comes (docs/LINUX.md, "A teardown that
        /// overtakes its run").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tree: Option<String>,
    },
}

/// A command as the supervisor runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory inside the container.
    pub cwd: String,
    /// Extra environment (after the defaults, so it can override them).
    pub env: Vec<(String, String)>,
    /// Standard input: these bytes, then end of file (empty: `/dev/null`). Base64 on
    /// the wire (a JSON array of numbers would be four times the size).
    #[serde(
        default,
        with = "crate::process::base64_bytes",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stdin: Vec<u8>,
    /// The tree's id (its leaf cgroup's name), chosen by the host for a fenced run so
    /// the egress proxy can tell the fenced command's connections from a detached
    /// process's (credentials go only to the former). A UUID; absent: the supervisor
    /// picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// Standard input is the read end of a pipe sent with this request (`SCM_RIGHTS`), in
    /// place of `stdin`: the host writes an upload into it as it arrives
    /// (docs/SECURITY.md, "Uploads"), so the bytes never sit whole in the host or the
    /// supervisor. A run only; the request is refused if no descriptor came with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_fd: bool,
    /// The descriptor sent with this request is a terminal's slave end (the host holds
    /// the master: an interactive session, `stockade shell`): it becomes the command's
    /// stdin, stdout and stderr and its controlling terminal (`setsid`, `TIOCSCTTY`),
    /// so the line discipline turns Ctrl-C into SIGINT and a resize into SIGWINCH. A
    /// run only, without `stdin_fd` and without `stdin` bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
}

/// A run's output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutStream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

/// The supervisor's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Response {
    /// `ping`.
    Pong,
    /// `start`: the new process's id.
    Started {
        /// Its UUID.
        id: String,
    },
    /// Part of a streaming run's output (zero or more before its `ran`).
    Output {
        /// Which stream.
        stream: OutStream,
        /// The bytes (base64 on the wire).
        #[serde(with = "crate::process::base64_bytes")]
        data: Vec<u8>,
    },
    /// `run`.
    Ran {
        /// What it produced.
        result: RunResult,
        /// Degradations met on the way (a degraded kill at the deadline), each said
        /// once per container: the host logs them (the supervisor has no log).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        degraded: Vec<String>,
        /// How many trees the supervisor tracks once the run is over (its own included
        /// while something it backgrounded lives). None from a supervisor that does
        /// not say: then the host cannot skip a `kill-all` after the run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trees: Option<u32>,
        /// The run's tree was named by the host and ended empty: its leaf is kept,
        /// and the host may name its next run the same (`pid1::leaves`). False from a
        /// supervisor that does not keep leaves.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        kept: bool,
    },
    /// `list`.
    Processes {
        /// Tracked entries.
        processes: Vec<ProcessInfo>,
    },
    /// `status`.
    Process {
        /// The entry, if tracked.
        process: Option<ProcessInfo>,
    },
    /// `kill`, `kill-all`: processes that died.
    Killed {
        /// How many.
        count: u32,
        /// Degradations met (a kill that reached only a tree's leader), each said once
        /// per container: the host logs them (the supervisor has no log).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        degraded: Vec<String>,
    },
    /// The request was malformed (empty argv, bad cwd, unparsable line).
    Invalid {
        /// Why.
        message: String,
    },
    /// The request failed.
    Failed {
        /// Why.
        message: String,
    },
}

impl Response {
    /// The degradations this answer reports.
    pub fn degraded(&self) -> &[String] {
        match self {
            Response::Ran { degraded, .. } | Response::Killed { degraded, .. } => degraded,
            _ => &[],
        }
    }
}

/// The supervisor's `ready` line: its set-up time, then the degradations it met
/// starting (a JSON array, absent when none).
pub fn ready_line(setup_us: u128, degraded: &[String]) -> String {
    if degraded.is_empty() {
        return format!("ready {setup_us}\n");
    }
    let list = serde_json::to_string(degraded).unwrap_or_else(|_| "[]".into());
    format!("ready {setup_us} {list}\n")
}

/// Parse what follows `ready` in [`ready_line`]: (set-up microseconds, degradations).
pub fn parse_ready(rest: &str) -> (u64, Vec<String>) {
    let rest = rest.trim();
    let (us, list) = rest.split_once(' ').unwrap_or((rest, ""));
    let degraded = serde_json::from_str(list.trim()).unwrap_or_default();
    (us.parse().unwrap_or(0), degraded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_carries_the_start_degradations() {
        let d = vec!["kill mode process-group: no cgroup".to_string()];
        for (us, degraded) in [(42, vec![]), (7, d)] {
            let line = ready_line(us, &degraded);
            let rest = line.trim_end().strip_prefix("ready").unwrap();
            assert_eq!(parse_ready(rest), (us as u64, degraded));
        }
        // The old line still parses.
        assert_eq!(parse_ready(" 12"), (12, vec![]));
    }

    #[test]
    fn degradations_travel_in_kill_and_run_answers() {
        let killed = Response::Killed {
            count: 1,
            degraded: vec!["kill mode single".into()],
        };
        let line = serde_json::to_string(&killed).unwrap();
        let back: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(back.degraded(), ["kill mode single".to_string()]);
        // None: the field is absent, and an answer without it reads as none.
        let plain = serde_json::to_string(&Response::Killed {
            count: 2,
            degraded: vec![],
        })
        .unwrap();
        assert_eq!(plain, r#"{"status":"killed","count":2}"#);
        let back: Response = serde_json::from_str(&plain).unwrap();
        assert!(back.degraded().is_empty());
    }
}
