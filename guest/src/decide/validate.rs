//! Invariant 10: bad input gets a clear error and changes nothing. Every check here
//! runs before the first substrate call. Rules, keys, process ids and artifact names
//! are checked by `stockade-grammar`, the one grammar the host's proxy and API use too
//! (a rule admitted here is one the proxy can apply).

use stockade_grammar::rules::{Grant as ParsedGrant, RuleSpec};

use crate::stockade::sandbox::types::{ExecInput, Rule};

pub use stockade_grammar::names::{MAX_ARTIFACT_NAME, MAX_KEY, artifact_name, key, process_id};
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

/// Which facade door the input came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `exec`: a fenced command.
    Exec,
    /// `start-detached`: a process that outlives the call.
    Detached,
}

/// The command input for either door.
pub fn input(input: &ExecInput, door: Door) -> Result<(), String> {
    let argv = &input.argv;
    if argv.is_empty() {
        return Err("argv is empty".into());
    }
    if argv[0].is_empty() {
        return Err("argv[0] is empty".into());
    }
    if argv.len() > MAX_ARGS {
        return Err(format!("argv has more than {MAX_ARGS} arguments"));
    }
    if input.env.len() > MAX_ENV {
        return Err(format!("env has more than {MAX_ENV} variables"));
    }
    let mut bytes = 0usize;
    for a in argv {
        no_nul("argument", a)?;
        bytes += a.len() + 1;
    }
    for (name, value) in &input.env {
        if name.is_empty() || name.contains('=') {
            return Err(format!("env name {name:?} is empty or contains '='"));
        }
        no_nul("env name", name)?;
        no_nul("env value", value)?;
        bytes += name.len() + value.len() + 2;
    }
    if let Some(cwd) = &input.cwd {
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
    if let Some(stdin) = &input.stdin
        && stdin.len() > MAX_STDIN_BYTES
    {
        return Err(format!(
            "stdin is {} bytes, more than {MAX_STDIN_BYTES}",
            stdin.len()
        ));
    }
    if let Some(t) = input.timeout_ms
        && (t == 0 || t > MAX_TIMEOUT_MS)
    {
        return Err(format!("timeout-ms must be 1..={MAX_TIMEOUT_MS}, got {t}"));
    }
    if let Some(token) = &input.approval {
        no_nul("approval", token)?;
    }
    match (&input.grant, door) {
        // ADR-0012: a detached process holds no grant. Ever.
        (Some(_), Door::Detached) => Err("a detached process holds no grant".into()),
        (Some(g), Door::Exec) => {
            if g.rules.len() > MAX_RULES {
                return Err(format!("grant has more than {MAX_RULES} rules"));
            }
            g.rules.iter().try_for_each(rule)
        }
        (None, _) => Ok(()),
    }
}

/// An egress allow rule, parsed by the one grammar the proxy applies.
pub fn rule(rule: &Rule) -> Result<(), String> {
    let spec = RuleSpec {
        host: rule.host.clone(),
        methods: rule.methods.clone(),
        path_prefix: rule.path_prefix.clone(),
        headers: rule
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.secret.clone()))
            .collect(),
        intercept: rule.intercept,
    };
    ParsedGrant::parse(std::slice::from_ref(&spec))
        .map(drop)
        .map_err(|e| e.message)
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
    use crate::stockade::sandbox::types::Grant;

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
        });
        let mut bad_rule = input_with(&["curl"]);
        bad_rule.grant = Some(Grant {
            rules: vec![r("exa mple.com", &[], None)],
        });
        let mut fed = input_with(&["cat"]);
        fed.stdin = Some(vec![0; MAX_STDIN_BYTES]);
        let mut overfed = input_with(&["cat"]);
        overfed.stdin = Some(vec![0; MAX_STDIN_BYTES + 1]);
        let rows: Vec<(&str, ExecInput, Door, bool)> = vec![
            ("stdin up to the limit is accepted", fed, Door::Exec, true),
            (
                "stdin past the limit is refused",
                overfed,
                Door::Exec,
                false,
            ),
            (
                "a plain command is accepted",
                input_with(&["echo", "hi"]),
                Door::Exec,
                true,
            ),
            (
                "an empty argv is refused",
                input_with(&[]),
                Door::Exec,
                false,
            ),
            (
                "an empty program is refused",
                input_with(&[""]),
                Door::Exec,
                false,
            ),
            ("oversized input is refused", big, Door::Exec, false),
            (
                "an env name with '=' is refused",
                bad_env,
                Door::Exec,
                false,
            ),
            ("a NUL byte is refused", nul, Door::Exec, false),
            ("a relative cwd is refused", rel, Door::Exec, false),
            ("a zero timeout is refused", zero, Door::Exec, false),
            (
                "a grant on exec is accepted",
                granted.clone(),
                Door::Exec,
                true,
            ),
            (
                "a grant on start-detached is refused",
                granted,
                Door::Detached,
                false,
            ),
            (
                "a rule that does not parse is refused",
                bad_rule,
                Door::Exec,
                false,
            ),
        ];
        for (what, i, door, ok) in rows {
            assert_eq!(input(&i, door).is_ok(), ok, "{what}");
        }
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
            // The rules the guest once accepted and the proxy refused (issue 12).
            (r("a.com:0", &[], None), false),
            (r("1.2.3", &[], None), false),
            (r("*.1.2.3.4", &[], None), false),
            (r("example.com", &[], Some("/a?b")), false),
        ];
        for (rule_, ok) in rows {
            assert_eq!(rule(&rule_).is_ok(), ok, "rule {rule_:?}");
        }
    }
}
