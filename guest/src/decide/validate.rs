//! Invariant 10: bad input gets a clear error and changes nothing. Every check here
//! runs before the first substrate call. Rules, keys, process ids and artifact names
//! are checked by `stockade-grammar`, the one grammar the host's proxy and API use too
//! (a rule admitted here is one the proxy can apply).

use stockade_grammar::names;
use stockade_grammar::rules::{Grant as ParsedGrant, RuleSpec};

use crate::stockade::sandbox::types::{DetachedInput, ExecInput, Grant, Rule};

pub use stockade_grammar::names::{MAX_ARTIFACT_NAME, MAX_KEY};

// The grammar's errors are typed; the contract's `invalid-input` carries their text.

/// A sandbox key ([`names::key`]).
pub fn key(key: &str) -> Result<(), String> {
    names::key(key).map_err(String::from)
}

/// A named snapshot's name ([`names::snapshot_name`]).
pub fn snapshot_name(name: &str) -> Result<(), String> {
    names::snapshot_name(name).map_err(String::from)
}

/// A process id: a UUID from the substrate ([`names::process_id`]).
pub fn process_id(id: &str) -> Result<(), String> {
    names::process_id(id).map_err(String::from)
}

/// An artifact name that stays under `/artifacts` ([`names::artifact_name`]).
pub fn artifact_name(name: &str) -> Result<(), String> {
    names::artifact_name(name).map_err(String::from)
}

/// Most arguments in an argv.
pub const MAX_ARGS: usize = 4096;
/// Most environment variables.
pub const MAX_ENV: usize = 1024;
/// Largest argv + env + cwd, in bytes.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// Largest standard input handed to a command, in bytes.
pub const MAX_STDIN_BYTES: usize = 16 << 20;
/// Longest run timeout: one day.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// Most rules in a grant.
pub const MAX_RULES: usize = 256;
/// Largest artifact read in one call.
pub const MAX_ARTIFACT_CHUNK: u32 = 4 * 1024 * 1024;

/// A fenced command's input: the command, its timeout and its grant. The grant, parsed,
/// is the answer ([`grant`]): what the credentials check reads, not parsed again.
pub fn input(input: &ExecInput) -> Result<Option<ParsedGrant>, String> {
    command(
        &input.argv,
        &input.env,
        input.cwd.as_deref(),
        input.approval.as_deref(),
        input.stdin.as_ref().map(Vec::len),
    )?;
    if let Some(t) = input.timeout_ms
        && (t == 0 || t > MAX_TIMEOUT_MS)
    {
        return Err(format!("timeout-ms must be 1..={MAX_TIMEOUT_MS}, got {t}"));
    }
    input.grant.as_ref().map(grant).transpose()
}

/// A grant, validated: the one place a grant is (docs/ARCHITECTURE.md, "One grant,
/// through the files"), before any substrate call, by the grammar the proxy applies
/// ([`ParsedGrant::parse`]). The API answers some of the same refusals earlier and the
/// host and a node parse again as defence in depth, all with that same function. The
/// first rule that does not parse is the error, in the grammar's words.
pub fn grant(g: &Grant) -> Result<ParsedGrant, String> {
    if g.rules.len() > MAX_RULES {
        return Err(format!("grant has more than {MAX_RULES} rules"));
    }
    let specs: Vec<RuleSpec> = g.rules.iter().map(spec).collect();
    ParsedGrant::parse(&specs)
        .map(|p| p.with_ask(g.ask))
        .map_err(|e| e.error.to_string())
}

/// A detached process's input. It has no grant to check: "a detached process holds no
/// grant, ever" (docs/DESIGN.md §3, invariant 3) is the type (`detached-input` carries
/// none).
pub fn detached(input: &DetachedInput) -> Result<(), String> {
    command(
        &input.argv,
        &input.env,
        input.cwd.as_deref(),
        input.approval.as_deref(),
        input.stdin.as_ref().map(Vec::len),
    )
}

/// What both doors share: argv, env, cwd, the approval token and stdin's size.
fn command(
    argv: &[String],
    env: &[(String, String)],
    cwd: Option<&str>,
    approval: Option<&str>,
    stdin_len: Option<usize>,
) -> Result<(), String> {
    if argv.is_empty() {
        return Err("argv is empty".into());
    }
    if argv[0].is_empty() {
        return Err("argv[0] is empty".into());
    }
    if argv.len() > MAX_ARGS {
        return Err(format!("argv has more than {MAX_ARGS} arguments"));
    }
    if env.len() > MAX_ENV {
        return Err(format!("env has more than {MAX_ENV} variables"));
    }
    let mut bytes = 0usize;
    for a in argv {
        no_nul("argument", a)?;
        bytes += a.len() + 1;
    }
    for (name, value) in env {
        if name.is_empty() || name.contains('=') {
            return Err(format!("env name {name:?} is empty or contains '='"));
        }
        no_nul("env name", name)?;
        no_nul("env value", value)?;
        bytes += name.len() + value.len() + 2;
    }
    if let Some(cwd) = cwd {
        if !cwd.starts_with('/') {
            return Err(format!("cwd must be absolute: {cwd:?}"));
        }
        no_nul("cwd", cwd)?;
        bytes += cwd.len();
    }
    if bytes > MAX_INPUT_BYTES {
        return Err(format!(
            "argv, env and cwd are {bytes} bytes, more than {MAX_INPUT_BYTES}"
        ));
    }
    if let Some(n) = stdin_len
        && n > MAX_STDIN_BYTES
    {
        return Err(format!("stdin is {n} bytes, more than {MAX_STDIN_BYTES}"));
    }
    if let Some(token) = approval {
        no_nul("approval", token)?;
    }
    Ok(())
}

/// The contract's rule as the grammar's input. The guest's own bindings make a `Rule`
/// of their own (the host's `bindgen!` another), so this conversion is the guest's, as
/// `host/runtime/src/bindings/convert.rs` is the host's.
pub fn spec(rule: &Rule) -> RuleSpec {
    RuleSpec {
        host: rule.host.clone(),
        methods: rule.methods.clone(),
        path_prefix: rule.path_prefix.clone(),
        headers: rule
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.secret.clone()))
            .collect(),
        intercept: rule.intercept,
    }
}

/// The size of one artifact read.
pub fn artifact_chunk(length: u32) -> Result<(), String> {
    if length == 0 || length > MAX_ARTIFACT_CHUNK {
        return Err(format!("length must be 1..={MAX_ARTIFACT_CHUNK}"));
    }
    Ok(())
}

fn no_nul(what: &str, s: &str) -> Result<(), String> {
    if s.contains('\0') {
        Err(format!("{what} contains a NUL byte"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_with(argv: &[&str]) -> ExecInput {
        ExecInput {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: vec![],
            timeout_ms: None,
            grant: None,
            approval: None,
            stdin: None,
        }
    }

    fn r(host: &str, methods: &[&str], path: Option<&str>) -> Rule {
        Rule {
            host: host.into(),
            methods: methods.iter().map(|s| s.to_string()).collect(),
            path_prefix: path.map(Into::into),
            headers: vec![],
            intercept: true,
        }
    }

    #[test]
    fn inputs() {
        let mut big = input_with(&["echo"]);
        big.argv.push("x".repeat(MAX_INPUT_BYTES));
        let mut bad_env = input_with(&["env"]);
        bad_env.env.push(("A=B".into(), "c".into()));
        let mut nul = input_with(&["echo"]);
        nul.argv.push("a\0b".into());
        let mut rel = input_with(&["ls"]);
        rel.cwd = Some("workspace".into());
        let mut zero = input_with(&["ls"]);
        zero.timeout_ms = Some(0);
        let mut granted = input_with(&["curl"]);
        granted.grant = Some(Grant {
            rules: vec![r("example.com", &["GET"], Some("/"))],
            ask: false,
        });
        let mut bad_rule = input_with(&["curl"]);
        bad_rule.grant = Some(Grant {
            rules: vec![r("exa mple.com", &[], None)],
            ask: false,
        });
        let mut fed = input_with(&["cat"]);
        fed.stdin = Some(vec![0; MAX_STDIN_BYTES]);
        let mut overfed = input_with(&["cat"]);
        overfed.stdin = Some(vec![0; MAX_STDIN_BYTES + 1]);
        let rows: Vec<(&str, ExecInput, bool)> = vec![
            ("stdin up to the limit is accepted", fed, true),
            ("stdin past the limit is refused", overfed, false),
            (
                "a plain command is accepted",
                input_with(&["echo", "hi"]),
                true,
            ),
            ("an empty argv is refused", input_with(&[]), false),
            ("an empty program is refused", input_with(&[""]), false),
            ("oversized input is refused", big, false),
            ("an env name with '=' is refused", bad_env, false),
            ("a NUL byte is refused", nul, false),
            ("a relative cwd is refused", rel, false),
            ("a zero timeout is refused", zero, false),
            ("a grant on exec is accepted", granted, true),
            ("a rule that does not parse is refused", bad_rule, false),
        ];
        for (what, i, ok) in rows {
            assert_eq!(input(&i).is_ok(), ok, "{what}");
        }
    }

    #[test]
    fn a_detached_input_is_checked_as_a_command() {
        let d = |argv: &[&str], cwd: Option<&str>| DetachedInput {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: cwd.map(Into::into),
            env: vec![],
            approval: None,
            stdin: None,
        };
        assert!(detached(&d(&["sleep", "1"], None)).is_ok());
        assert!(detached(&d(&[], None)).is_err(), "an empty argv");
        assert!(
            detached(&d(&["ls"], Some("rel"))).is_err(),
            "a relative cwd"
        );
        let mut fed = d(&["cat"], None);
        fed.stdin = Some(vec![0; MAX_STDIN_BYTES + 1]);
        assert!(detached(&fed).is_err(), "stdin past the limit");
    }

    #[test]
    fn rules() {
        let rows = [
            (r("example.com", &[], None), true),
            (r("*.example.com", &["GET", "HEAD"], Some("/simple/")), true),
            (r("127.0.0.1:8080", &[], None), true),
            (r("", &[], None), false),
            (r("*.", &[], None), false),
            (r("*", &[], None), false),
            (r("ex*ample.com", &[], None), false),
            (r("a..b", &[], None), false),
            (r("example.com", &["get"], None), false),
            (r("example.com", &["FETCH"], None), false),
            (r("example.com", &[], Some("simple")), false),
            // The rules the guest once accepted and the proxy refused (one grammar since:
            // docs/DESIGN.md §3, invariant 10).
            (r("a.com:0", &[], None), false),
            (r("1.2.3", &[], None), false),
            (r("*.1.2.3.4", &[], None), false),
            (r("example.com", &[], Some("/a?b")), false),
        ];
        for (rule_, ok) in rows {
            let g = Grant {
                rules: vec![rule_.clone()],
                ask: false,
            };
            assert_eq!(grant(&g).is_ok(), ok, "rule {rule_:?}");
        }
    }
}
