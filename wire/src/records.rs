//! The answers of the API's routes (and the small request bodies of approvals and
//! secrets), one type per JSON object `docs/openapi.json` names.

use serde::{Deserialize, Serialize};

use crate::command::present;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `true` when the server answers.
    pub ok: bool,
}

/// A resource limit a run reached, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// A fork failed: the container's process limit was reached.
    Pids,
    /// The OOM killer killed a process.
    Memory,
    /// The container's storage is full.
    Disk,
}

/// `POST …/exec`: what a fenced command produced. Output as text (lossy UTF-8) and as
/// exact base64.
///
/// Answers are read leniently (a field this version does not know is ignored), so an
/// older client reads a newer server; requests are read strictly by the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// The command's exit code (negative: killed by that signal; -1 on timeout).
    pub exit_code: i32,
    /// Standard output, lossy UTF-8.
    pub stdout: String,
    /// Standard error, lossy UTF-8.
    pub stderr: String,
    /// Standard output, exact.
    pub stdout_base64: String,
    /// Standard error, exact.
    pub stderr_base64: String,
    /// The run hit its timeout and was killed.
    pub timed_out: bool,
    /// Output beyond the bound was discarded.
    pub truncated: bool,
    /// Processes the fence's teardown killed.
    pub killed: u32,
    /// Egress requests refused while the fence was open.
    pub denials: u32,
    /// Egress requests admitted while the fence was open.
    pub admitted: u32,
    /// Container limits the run reached.
    pub limits: Vec<Limit>,
}

/// `POST …/detached` (201): the new process's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// The id for `status` and `stop`.
    pub id: String,
}

/// Why a detached id is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GoneReason {
    /// An id this key never started, or already stopped.
    Unknown,
    /// The process is no longer tracked.
    NotTracked,
    /// Its container cannot be reached.
    ContainerUnreachable,
}

impl GoneReason {
    /// The reason as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            GoneReason::Unknown => "unknown",
            GoneReason::NotTracked => "not-tracked",
            GoneReason::ContainerUnreachable => "container-unreachable",
        }
    }
}

/// `GET …/detached/{id}`: `{"state": "running"}`, `{"state": "exited", "code": N}`,
/// `{"state": "gone", "reason": …}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum DetachedState {
    /// Still running.
    Running,
    /// Exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// Not there (any more).
    Gone {
        /// Why.
        reason: GoneReason,
    },
}

/// `DELETE …/detached/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    /// The id that was stopped.
    pub stopped: String,
}

/// `POST …/abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aborted {
    /// The key whose container was stopped.
    pub aborted: String,
}

/// `POST …/ensure`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ensured {
    /// The key whose container is running.
    pub ensured: String,
}

/// A named snapshot of a key's `/workspace`: `POST …/snapshots`' answer, and one
/// row of `GET …/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its name (`[a-z0-9._-]`, 1 to 64).
    pub name: String,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// `POST …/snapshots`' body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    /// The snapshot's name.
    pub name: String,
}

/// `GET …/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshots {
    /// The key's named snapshots, by name.
    pub snapshots: Vec<Snapshot>,
}

/// `DELETE …/snapshots/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDeleted {
    /// The name deleted (or that was not there: nothing changed).
    pub deleted: String,
}

/// `POST …/fork`'s body: whose snapshot becomes the key's restore cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The key holding the snapshot (the caller's token must reach it).
    pub source: String,
    /// The snapshot's name.
    pub name: String,
}

/// `POST …/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forked {
    /// The key whose next container starts from the snapshot.
    pub forked: String,
}

/// What the end of a key's lifetime does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnEnd {
    /// Stop the container at once; the key is forgotten, its metadata with it.
    Abort,
    /// Snapshot `/workspace` and stop; the key stays known, with no lifetime.
    Checkpoint,
}

/// A key's lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    /// When it ends, in milliseconds since the Unix epoch.
    pub ends_at_ms: u64,
    /// What its end does.
    pub on_end: OnEnd,
}

/// `PUT …/lifetime`'s body: exactly one of `ends_at_ms` (an instant) and `ends_in_ms`
/// (from the server's now); `on_end` defaults to `abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifetimeBody {
    /// When it ends, in milliseconds since the Unix epoch (JSON Schema's `integer`
    /// admits `1000.0`: so does this field, found by Schemathesis; never `1000.5`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::command::whole_or_null"
    )]
    pub ends_at_ms: Option<u64>,
    /// How long from now it ends, in milliseconds (as `ends_at_ms`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::command::whole_or_null"
    )]
    pub ends_in_ms: Option<u64>,
    /// What its end does (default `abort`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_end: Option<OnEnd>,
}

/// `PUT …/metadata`'s body: the key's metadata, replaced whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataBody {
    /// Name → value.
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// A known key: `GET /v1/sandboxes/{key}`, a row of `GET /v1/sandboxes`, and the
/// answer of `PUT …/lifetime`, `PUT …/metadata` and `PUT …/network`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The key.
    pub key: String,
    /// It has a live container now.
    pub running: bool,
    /// Its lifetime, if it has one.
    pub lifetime: Option<Lifetime>,
    /// Its metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Its network (`PUT …/network`): the grant of its fenced commands that bring none.
    /// Read as absent from a server before networks were native.
    #[serde(default)]
    pub network: Option<crate::GrantBody>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxList {
    /// The known keys the caller reaches, by key.
    pub sandboxes: Vec<SandboxInfo>,
}

/// `DELETE /v1/sandboxes/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forgotten {
    /// The key aborted and forgotten.
    pub forgotten: String,
}

/// `POST …/checkpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpointed {
    /// The key whose workspace was snapshotted.
    pub checkpointed: String,
}

/// An egress request the fence refused: the proxy's record, the store's row, a node's
/// answer and the API's (`stockade-egress` re-exports it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Target host.
    pub host: String,
    /// Request method (`CONNECT` for tunnels).
    pub method: String,
    /// Request path (empty for CONNECT).
    pub path: String,
    /// The fence that was open, or `none`.
    pub rule_set: String,
    /// Why it was refused (`no-rule`, `method`, `path`, …).
    pub reason: String,
}

/// `GET …/denials`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denials {
    /// Oldest first.
    pub denials: Vec<Denial>,
}

/// One admitted request (or blind tunnel, or a fence's summary row) of the egress
/// audit: the record the proxy makes when the request ends, the store's row, a node's
/// answer to its front and the API's answer (`stockade-egress` re-exports it).
///
/// An admitted request is recorded with the bytes that crossed each way: the request
/// body upstream, the answer body back. A blind tunnel is one record (method `CONNECT`,
/// status 200, the bytes spliced). Credentials appear only as the names of the headers
/// the proxy added.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admitted {
    /// When it was decided, ms since the Unix epoch.
    pub at_ms: u64,
    /// The fence that admitted it.
    pub fence: String,
    /// Method (`CONNECT` for a blind tunnel).
    pub method: String,
    /// Host as decided.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Path as decided (without the query; empty for a tunnel).
    pub path: String,
    /// Index of the rule that admitted it.
    pub rule: u32,
    /// `http` (plain), `https` (intercepted), `tunnel` (blind), or `summary` (a
    /// fence's summary row, [`VIA_SUMMARY`]).
    pub via: String,
    /// The status the command got (the upstream's, or the proxy's 502/503).
    pub status: u16,
    /// Request-body bytes sent upstream (for a tunnel: bytes from the command).
    pub bytes_up: u64,
    /// Answer-body bytes sent back (for a tunnel: bytes to the command).
    pub bytes_down: u64,
    /// Why the upstream failed or the answer was cut off (empty when it did not).
    pub error: String,
    /// Names of the headers the proxy added (never their values).
    pub credentials: Vec<String>,
    /// A summary row only: how many admitted requests of this fence the rate bound
    /// left without a row of their own (0 on every other row).
    #[serde(default)]
    pub suppressed: u64,
}

/// The `via` of a fence's summary row.
pub const VIA_SUMMARY: &str = "summary";

/// The `error` of a request whose credentials were withheld (not the fenced run's
/// connection).
pub const CREDENTIALS_WITHHELD: &str = "credentials-withheld";

impl Admitted {
    /// The summary row of fence `fence`, closed at `at_ms`: `suppressed` admitted
    /// requests were not recorded one by one.
    pub fn summary(fence: &str, at_ms: u64, suppressed: u64) -> Admitted {
        Admitted {
            at_ms,
            fence: fence.to_owned(),
            via: VIA_SUMMARY.to_owned(),
            error: "rate-limited".to_owned(),
            suppressed,
            ..Admitted::default()
        }
    }

    /// Did the proxy add (or withhold) a credential on this request? Such a record is
    /// never left out of the audit.
    pub fn credentialed(&self) -> bool {
        !self.credentials.is_empty() || self.error == CREDENTIALS_WITHHELD
    }
}

/// One entry of `GET …/egress`: admitted or denied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "lowercase")]
pub enum EgressEvent {
    /// The fence let it through.
    Allow(Admitted),
    /// The fence refused it.
    Deny(Denial),
}

/// `GET …/egress`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Oldest first; at the same millisecond a denial before an admission.
    pub egress: Vec<EgressEvent>,
}

/// A file under a container's `/artifacts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Path relative to `/artifacts`.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// `GET …/artifacts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifacts {
    /// The files.
    pub artifacts: Vec<Artifact>,
}

/// `POST …/approvals`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalBody {
    /// Exactly the command the approval admits.
    pub argv: Vec<String>,
}

/// `POST …/approvals` (201): the token that admits the command once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The approval token (`exec … --approval TOKEN`).
    pub token: String,
    /// The key it is for.
    pub key: String,
    /// The command it admits.
    pub argv: Vec<String>,
    /// When it expires, ms since the Unix epoch.
    pub expires_ms: u64,
}

/// `PUT …/files…` (201): what was unpacked where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uploaded {
    /// The directory or file written, under `/workspace`.
    pub dest: String,
    /// Archive entries unpacked.
    pub entries: u64,
}

/// `PUT /v1/secrets/{name}`'s body: the value and where it may go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretBody {
    /// The value (never echoed in any answer).
    pub value: String,
    /// One exact host, optionally `:port` (443 when none).
    pub host: String,
    /// The methods a rule naming it may admit.
    pub methods: Vec<String>,
    /// The path prefix a rule naming it must sit under (default `/`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub path_prefix: Option<String>,
}

/// One secret of `GET /v1/secrets`: where it comes from, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// The name.
    pub name: String,
    /// `api` or `file`.
    pub source: String,
    /// When it was set through the API (ms since the epoch); 0 for a file.
    pub updated_ms: u64,
    /// Where it may go (`GET,POST api.example.com:443/v1/`); `None` (`null`): unbound.
    pub binding: Option<String>,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secrets {
    /// Names and sources.
    pub secrets: Vec<SecretInfo>,
}

#[cfg(test)]
mod lifetime_tests {
    use super::*;

    #[test]
    fn a_lifetimes_times_are_whole_numbers_written_either_way_or_null() {
        let b: LifetimeBody =
            serde_json::from_str(r#"{"ends_in_ms": 4177.0, "ends_at_ms": null}"#).unwrap();
        assert_eq!((b.ends_in_ms, b.ends_at_ms), (Some(4177), None));
        let b: LifetimeBody = serde_json::from_str(r#"{"ends_at_ms": 9007199254740991}"#).unwrap();
        assert_eq!(b.ends_at_ms, Some(crate::command::MAX_WHOLE_MS));
        for bad in [
            r#"{"ends_at_ms": 9007199254740992}"#,
            r#"{"ends_at_ms": 18446744073709551616}"#,
            r#"{"ends_in_ms": 1e300}"#,
            r#"{"ends_in_ms": 1.5}"#,
            r#"{"ends_in_ms": -1}"#,
            r#"{"ends_in_ms": "1"}"#,
            r#"{"ends_in_ms": 1, "x": 1}"#,
        ] {
            assert!(serde_json::from_str::<LifetimeBody>(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detached_states_read_as_the_api_writes_them() {
        let rows = [
            (DetachedState::Running, json!({"state": "running"})),
            (
                DetachedState::Exited { code: -9 },
                json!({"state": "exited", "code": -9}),
            ),
            (
                DetachedState::Gone {
                    reason: GoneReason::ContainerUnreachable,
                },
                json!({"state": "gone", "reason": "container-unreachable"}),
            ),
            (
                DetachedState::Gone {
                    reason: GoneReason::NotTracked,
                },
                json!({"state": "gone", "reason": "not-tracked"}),
            ),
        ];
        for (state, j) in rows {
            assert_eq!(serde_json::to_value(state).unwrap(), j);
            assert_eq!(serde_json::from_value::<DetachedState>(j).unwrap(), state);
        }
    }

    #[test]
    fn egress_events_carry_their_decision_beside_the_records_fields() {
        let deny = EgressEvent::Deny(Denial {
            at_ms: 1,
            host: "h".into(),
            method: "GET".into(),
            path: "/x".into(),
            rule_set: "f".into(),
            reason: "path".into(),
        });
        let j = serde_json::to_value(&deny).unwrap();
        assert_eq!(j["decision"], "deny");
        assert_eq!(j["reason"], "path");
        assert_eq!(serde_json::from_value::<EgressEvent>(j).unwrap(), deny);
        let allow = EgressEvent::Allow(Admitted {
            via: "https".into(),
            status: 200,
            ..Admitted::default()
        });
        let j = serde_json::to_value(&allow).unwrap();
        assert_eq!(j["decision"], "allow");
        assert_eq!(j["suppressed"], 0);
        assert_eq!(serde_json::from_value::<EgressEvent>(j).unwrap(), allow);
    }

    #[test]
    fn an_outcome_has_every_field_the_schema_requires() {
        let j = serde_json::to_value(ExecOutcome {
            limits: vec![Limit::Pids, Limit::Disk],
            ..ExecOutcome::default()
        })
        .unwrap();
        let mut keys: Vec<&str> = j.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "admitted",
                "denials",
                "exit_code",
                "killed",
                "limits",
                "stderr",
                "stderr_base64",
                "stdout",
                "stdout_base64",
                "timed_out",
                "truncated"
            ]
        );
        assert_eq!(j["limits"], json!(["pids", "disk"]));
    }

    #[test]
    fn an_older_client_reads_a_newer_servers_answers() {
        let o: ExecOutcome = serde_json::from_value(json!({
            "exit_code": 0, "stdout": "", "stderr": "", "stdout_base64": "",
            "stderr_base64": "", "timed_out": false, "truncated": false, "killed": 0,
            "denials": 0, "admitted": 0, "limits": [], "from_the_future": 1
        }))
        .unwrap();
        assert_eq!(o, ExecOutcome::default());
        let s: DetachedState =
            serde_json::from_value(json!({"state": "running", "since_ms": 5})).unwrap();
        assert_eq!(s, DetachedState::Running);
    }

    #[test]
    fn an_unbound_secret_lists_its_binding_as_null() {
        let s = SecretInfo {
            name: "n".into(),
            source: "file".into(),
            updated_ms: 0,
            binding: None,
        };
        assert_eq!(serde_json::to_value(&s).unwrap()["binding"], json!(null));
    }
}
