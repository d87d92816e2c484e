//! The mock's scripted outcomes (docs/MOCK.md, "Scripted outcomes"): rules matching a
//! command's argv to what its run answers (exit code, output, duration, output chunks
//! over time) and, for a detached process, its life. Pure: parsing and matching only;
//! the mock plays what [`Script::pick`] answers.
//!
//! The document (a file for `stockade serve --mock-script`, the body of
//! `PUT /v1/mock/script`) is JSON:
//!
//! ```json
//! {"rules": [{"argv": ["sh", "-c", "exit 3"], "exit_code": 3},
//!            {"argv": ["pytest", "**"], "match": "glob", "stdout": "3 passed\n"}],
//!  "default": {"exit_code": 0}}
//! ```
//!
//! The first rule whose pattern matches wins; no rule matching: `default`, and without
//! one the mock's built-in vocabulary (docs/CONFORMANCE.md: `echo`, `cat`, `exit N`, …;
//! anything else exits 0 with no output).

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// The most rules a script holds.
pub const MAX_RULES: usize = 1_000;
/// The most bytes of one stream an outcome writes (stdout, stderr; chunks included).
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;
/// The longest a scripted run (or a detached process's life) lasts.
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// The most chunks one outcome sends.
pub const MAX_CHUNKS: usize = 1_000;

/// How a rule's `argv` is compared with a command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatchKind {
    /// The same arguments, all of them.
    #[default]
    Exact,
    /// The command starts with these arguments.
    Prefix,
    /// Each pattern argument a glob of one argument (`*` any run of characters, `?` any
    /// one character); an argument `**` alone matches any number of arguments (none
    /// included).
    Glob,
}

/// One stream of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bytes a run writes at a moment of its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// When, from the run's start.
    pub at: Duration,
    /// Which stream.
    pub stream: Stream,
    /// What.
    pub bytes: Vec<u8>,
}

/// A detached process's scripted life: it runs this long, then exits with this code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Life {
    /// How long it runs (zero: it has already exited when `start` answers).
    pub runs: Duration,
    /// Its exit code then.
    pub exit_code: i32,
}

/// What a scripted command does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The run's exit code.
    pub exit_code: i32,
    /// Written to stdout at the run's start.
    pub stdout: Vec<u8>,
    /// Written to stderr at the run's start.
    pub stderr: Vec<u8>,
    /// Written over the run's life, in `at` order.
    pub chunks: Vec<Chunk>,
    /// How long the run lasts (at least until its last chunk). A run whose timeout comes
    /// first is timed out, as a real one would be.
    pub duration: Duration,
    /// Started detached: its life (`None`: it runs until it is killed).
    pub detached: Option<Life>,
}

impl Outcome {
    /// When the run ends: its duration, or its last chunk if that is later.
    pub fn ends_at(&self) -> Duration {
        self.chunks
            .iter()
            .map(|c| c.at)
            .max()
            .unwrap_or_default()
            .max(self.duration)
    }

    /// Everything the run writes, per stream (a run without a live sink answers it whole).
    pub fn whole(&self, until: Duration) -> (Vec<u8>, Vec<u8>) {
        let (mut out, mut err) = (self.stdout.clone(), self.stderr.clone());
        for c in self.chunks.iter().filter(|c| c.at <= until) {
            match c.stream {
                Stream::Stdout => out.extend_from_slice(&c.bytes),
                Stream::Stderr => err.extend_from_slice(&c.bytes),
            }
        }
        (out, err)
    }
}

/// A rule's pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// How it compares.
    pub kind: MatchKind,
    /// The pattern's arguments.
    pub argv: Vec<String>,
}

impl Pattern {
    /// Does `argv` match?
    pub fn matches(&self, argv: &[String]) -> bool {
        match self.kind {
            MatchKind::Exact => self.argv == argv,
            MatchKind::Prefix => argv.starts_with(&self.argv),
            MatchKind::Glob => glob_args(&self.argv, argv),
        }
    }
}

fn glob_args(pattern: &[String], argv: &[String]) -> bool {
    match pattern.split_first() {
        None => argv.is_empty(),
        Some((p, rest)) if p == "**" => (0..=argv.len()).any(|skip| glob_args(rest, &argv[skip..])),
        Some((p, rest)) => match argv.split_first() {
            Some((a, more)) => glob_one(p.as_bytes(), a.as_bytes()) && glob_args(rest, more),
            None => false,
        },
    }
}

/// One argument against one glob (`*`, `?`; every other byte itself).
fn glob_one(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|skip| glob_one(rest, &s[skip..])),
        Some((b'?', rest)) => {
            // One character, not one byte.
            let Some(c) = std::str::from_utf8(s).ok().and_then(|t| t.chars().next()) else {
                return false;
            };
            glob_one(rest, &s[c.len_utf8()..])
        }
        Some((c, rest)) => s.first() == Some(c) && glob_one(rest, &s[1..]),
    }
}

/// A parsed script.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Script {
    /// The rules, first match wins.
    pub rules: Vec<(Pattern, Outcome)>,
    /// What no rule matches does (`None`: the built-in vocabulary).
    pub default: Option<Outcome>,
}

impl Script {
    /// The outcome `argv` gets: the first rule matching it, else the default; `None`:
    /// neither, the built-in vocabulary answers.
    pub fn pick(&self, argv: &[String]) -> Option<&Outcome> {
        self.rules
            .iter()
            .find(|(p, _)| p.matches(argv))
            .map(|(_, o)| o)
            .or(self.default.as_ref())
    }

    /// Parse a script document (JSON text); the error says what, and where.
    pub fn parse(text: &[u8]) -> Result<Script, String> {
        let v: Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        Script::from_value(&v)
    }

    /// Parse a script document.
    pub fn from_value(v: &Value) -> Result<Script, String> {
        let Value::Object(doc) = v else {
            return Err("a script is a JSON object: {\"rules\": [...], \"default\": {...}}".into());
        };
        if let Some(k) = doc
            .keys()
            .find(|k| !matches!(k.as_str(), "rules" | "default"))
        {
            return Err(format!(
                "unknown field {k:?} (a script has rules and default)"
            ));
        }
        let rules = match doc.get("rules") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err("rules: a list of rules".into()),
        };
        if rules.len() > MAX_RULES {
            return Err(format!("rules: at most {MAX_RULES}, not {}", rules.len()));
        }
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(r).map_err(|e| format!("rules[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let default = match doc.get("default") {
            None | Some(Value::Null) => None,
            Some(d) => Some(outcome(d).map_err(|e| format!("default: {e}"))?),
        };
        Ok(Script { rules, default })
    }
}

/// The fields of an outcome as the document writes them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutcomeDoc {
    #[serde(default)]
    exit_code: i32,
    stdout: Option<String>,
    stderr: Option<String>,
    stdout_base64: Option<String>,
    stderr_base64: Option<String>,
    #[serde(default)]
    duration_ms: u64,
    #[serde(default)]
    chunks: Vec<ChunkDoc>,
    detached: Option<LifeDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkDoc {
    at_ms: u64,
    stdout: Option<String>,
    stderr: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LifeDoc {
    runs_ms: u64,
    #[serde(default)]
    exit_code: i32,
}

fn rule(v: &Value) -> Result<(Pattern, Outcome), String> {
    let Value::Object(fields) = v else {
        return Err("a rule is an object with argv".into());
    };
    let mut fields = fields.clone();
    let argv: Vec<String> = match fields.remove("argv") {
        Some(a) => serde_json::from_value(a).map_err(|_| "argv: a list of strings")?,
        None => return Err("argv: missing (the pattern the command is matched against)".into()),
    };
    if argv.is_empty() {
        return Err("argv: empty (it would match nothing)".into());
    }
    let kind = match fields.remove("match").as_ref().map(|m| m.as_str()) {
        None => MatchKind::Exact,
        Some(Some("exact")) => MatchKind::Exact,
        Some(Some("prefix")) => MatchKind::Prefix,
        Some(Some("glob")) => MatchKind::Glob,
        Some(_) => return Err("match: \"exact\", \"prefix\" or \"glob\"".into()),
    };
    let outcome = outcome(&Value::Object(fields))?;
    Ok((Pattern { kind, argv }, outcome))
}

fn outcome(v: &Value) -> Result<Outcome, String> {
    if !v.is_object() {
        return Err("an outcome is an object (exit_code, stdout, …)".into());
    }
    let doc: OutcomeDoc = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let stdout = bytes("stdout", doc.stdout, doc.stdout_base64)?;
    let stderr = bytes("stderr", doc.stderr, doc.stderr_base64)?;
    let ms = |what: &str, n: u64| {
        if n > MAX_DURATION_MS {
            Err(format!("{what}: at most {MAX_DURATION_MS} ms, not {n}"))
        } else {
            Ok(Duration::from_millis(n))
        }
    };
    if doc.chunks.len() > MAX_CHUNKS {
        return Err(format!("chunks: at most {MAX_CHUNKS}"));
    }
    let mut chunks = Vec::with_capacity(doc.chunks.len());
    let mut last = Duration::ZERO;
    for (i, c) in doc.chunks.into_iter().enumerate() {
        let at = ms(&format!("chunks[{i}].at_ms"), c.at_ms)?;
        if at < last {
            return Err(format!("chunks[{i}].at_ms: chunks are in time order"));
        }
        last = at;
        let (stream, text) = match (c.stdout, c.stderr) {
            (Some(t), None) => (Stream::Stdout, t),
            (None, Some(t)) => (Stream::Stderr, t),
            _ => return Err(format!("chunks[{i}]: exactly one of stdout and stderr")),
        };
        chunks.push(Chunk {
            at,
            stream,
            bytes: text.into_bytes(),
        });
    }
    let o = Outcome {
        exit_code: doc.exit_code,
        stdout,
        stderr,
        chunks,
        duration: ms("duration_ms", doc.duration_ms)?,
        detached: match doc.detached {
            Some(l) => Some(Life {
                runs: ms("detached.runs_ms", l.runs_ms)?,
                exit_code: l.exit_code,
            }),
            None => None,
        },
    };
    let (out, err) = o.whole(Duration::MAX);
    if out.len().max(err.len()) > MAX_OUTPUT_BYTES {
        return Err(format!(
            "output: at most {MAX_OUTPUT_BYTES} bytes per stream"
        ));
    }
    Ok(o)
}

fn bytes(what: &str, text: Option<String>, b64: Option<String>) -> Result<Vec<u8>, String> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(format!("{what} and {what}_base64: one or the other")),
        (Some(t), None) => Ok(t.into_bytes()),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("{what}_base64: {e}")),
        (None, None) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn patterns_match_argv_exactly_by_prefix_or_by_glob() {
        use MatchKind::*;
        let rows: &[(&str, MatchKind, &[&str], &str, bool)] = &[
            ("exact: the same", Exact, &["git", "push"], "git push", true),
            (
                "exact: longer is not",
                Exact,
                &["git", "push"],
                "git push origin",
                false,
            ),
            (
                "exact: shorter is not",
                Exact,
                &["git", "push"],
                "git",
                false,
            ),
            (
                "prefix: the same",
                Prefix,
                &["git", "push"],
                "git push",
                true,
            ),
            (
                "prefix: longer",
                Prefix,
                &["git", "push"],
                "git push -f origin",
                true,
            ),
            (
                "prefix: another verb",
                Prefix,
                &["git", "push"],
                "git pull",
                false,
            ),
            (
                "glob: * in an argument",
                Glob,
                &["pytest", "test_*.py"],
                "pytest test_a.py",
                true,
            ),
            (
                "glob: * is one argument's",
                Glob,
                &["pytest", "*"],
                "pytest a b",
                false,
            ),
            ("glob: ? one character", Glob, &["v?"], "vé", true),
            ("glob: ? not none", Glob, &["v?"], "v", false),
            (
                "glob: ** any number",
                Glob,
                &["make", "**"],
                "make -j2 all",
                true,
            ),
            ("glob: ** none", Glob, &["make", "**"], "make", true),
            (
                "glob: ** in the middle",
                Glob,
                &["sh", "**", "exit*"],
                "sh -x -c exit3",
                true,
            ),
            (
                "glob: ** in the middle, no tail",
                Glob,
                &["sh", "**", "exit*"],
                "sh -c true",
                false,
            ),
            ("glob: literal otherwise", Glob, &["ls"], "ls -l", false),
        ];
        for (what, kind, pat, cmd, want) in rows {
            let p = Pattern {
                kind: *kind,
                argv: pat.iter().map(|s| s.to_string()).collect(),
            };
            assert_eq!(p.matches(&argv(cmd)), *want, "{what}");
        }
    }

    #[test]
    fn the_first_matching_rule_wins_then_the_default_then_nothing() {
        let s = Script::from_value(&json!({"rules": [
            {"argv": ["git", "push"], "match": "prefix", "exit_code": 1},
            {"argv": ["git"], "match": "prefix", "exit_code": 2},
        ]}))
        .unwrap();
        assert_eq!(s.pick(&argv("git push x")).map(|o| o.exit_code), Some(1));
        assert_eq!(s.pick(&argv("git status")).map(|o| o.exit_code), Some(2));
        assert_eq!(
            s.pick(&argv("ls")),
            None,
            "no default: the built-in vocabulary"
        );
        let s = Script::from_value(&json!({"default": {"exit_code": 7}})).unwrap();
        assert_eq!(s.pick(&argv("ls")).map(|o| o.exit_code), Some(7));
    }

    #[test]
    fn an_outcome_reads_every_field() {
        let s = Script::from_value(&json!({"rules": [{
            "argv": ["build"], "exit_code": 3, "stdout": "a", "stderr_base64": "/wA=",
            "duration_ms": 50,
            "chunks": [{"at_ms": 10, "stdout": "b"}, {"at_ms": 80, "stderr": "c"}],
            "detached": {"runs_ms": 200, "exit_code": 4},
        }]}))
        .unwrap();
        let o = &s.rules[0].1;
        assert_eq!(o.exit_code, 3);
        assert_eq!(o.stderr, vec![0xff, 0]);
        assert_eq!(
            o.ends_at(),
            Duration::from_millis(80),
            "the last chunk, past the duration"
        );
        assert_eq!(
            o.whole(Duration::MAX),
            (b"ab".to_vec(), vec![0xff, 0, b'c'])
        );
        assert_eq!(
            o.whole(Duration::from_millis(20)).1,
            vec![0xff, 0],
            "until a timeout"
        );
        assert_eq!(
            o.detached,
            Some(Life {
                runs: Duration::from_millis(200),
                exit_code: 4
            })
        );
    }

    #[test]
    fn a_bad_script_is_refused_saying_where() {
        let rows: &[(Value, &str)] = &[
            (json!([]), "a script is a JSON object"),
            (json!({"rule": []}), "unknown field \"rule\""),
            (json!({"rules": {}}), "rules: a list"),
            (
                json!({"rules": [{"exit_code": 1}]}),
                "rules[0]: argv: missing",
            ),
            (json!({"rules": [{"argv": []}]}), "rules[0]: argv: empty"),
            (
                json!({"rules": [{"argv": [1]}]}),
                "rules[0]: argv: a list of strings",
            ),
            (
                json!({"rules": [{"argv": ["a"], "match": "regex"}]}),
                "rules[0]: match:",
            ),
            (
                json!({"rules": [{"argv": ["a"], "exit": 1}]}),
                "rules[0]: unknown field `exit`",
            ),
            (
                json!({"rules": [{"argv": ["a"], "stdout": "x", "stdout_base64": "eA=="}]}),
                "one or the other",
            ),
            (
                json!({"rules": [{"argv": ["a"], "stdout_base64": "!"}]}),
                "stdout_base64:",
            ),
            (
                json!({"rules": [{"argv": ["a"], "duration_ms": 3_600_001}]}),
                "duration_ms: at most",
            ),
            (
                json!({"rules": [{"argv": ["a"], "chunks": [{"at_ms": 5, "stdout": "x"}, {"at_ms": 1, "stdout": "y"}]}]}),
                "chunks[1].at_ms: chunks are in time order",
            ),
            (
                json!({"rules": [{"argv": ["a"], "chunks": [{"at_ms": 5}]}]}),
                "chunks[0]: exactly one",
            ),
            (
                json!({"rules": [{"argv": ["a"], "detached": {"exit_code": 1}}]}),
                "rules[0]: missing field `runs_ms`",
            ),
            (
                json!({"default": {"exit_code": "x"}}),
                "default: invalid type",
            ),
            (json!({"default": [0]}), "default: an outcome is an object"),
        ];
        for (doc, want) in rows {
            let e = Script::from_value(doc).expect_err(&doc.to_string());
            assert!(e.contains(want), "{doc}: {e:?} does not say {want:?}");
        }
        assert!(Script::parse(b"{").unwrap_err().starts_with("not JSON"));
        assert_eq!(Script::parse(b"{}").unwrap(), Script::default());
    }
}
