//! Invariant 10: bad input gets a clear error and changes nothing. Every check here
//! runs before the first substrate call.

use crate::stockade::sandbox::types::{ExecInput, Rule};

/// Longest sandbox key.
pub const MAX_KEY: usize = 128;
/// Most arguments in an argv.
pub const MAX_ARGS: usize = 4096;
/// Most environment variables.
pub const MAX_ENV: usize = 1024;
/// Largest argv + env + cwd, in bytes.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// Longest run timeout: one day.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// Most rules in a grant.
pub const MAX_RULES: usize = 256;
/// Longest artifact name.
pub const MAX_ARTIFACT_NAME: usize = 1024;
/// Largest artifact read in one call.
pub const MAX_ARTIFACT_CHUNK: u32 = 4 * 1024 * 1024;

/// HTTP methods a rule may name.
pub const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];

/// Which facade door the input came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `exec`: a fenced command.
    Exec,
    /// `start-detached`: a process that outlives the call.
    Detached,
}

/// A key is 1–128 characters of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key is empty".into());
    }
    if key.len() > MAX_KEY {
        return Err(format!("key is longer than {MAX_KEY} bytes"));
    }
    if key.starts_with('.') {
        return Err("key must not start with '.'".into());
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("key has a character outside [A-Za-z0-9._-]: {c:?}"));
    }
    Ok(())
}

/// A process id is a lowercase hyphenated UUID: ids come from the substrate, never pids.
pub fn process_id(id: &str) -> Result<(), String> {
    let b = id.as_bytes();
    let shape_ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        });
    if shape_ok {
        Ok(())
    } else {
        Err(format!("process id is not a UUID: {id:?}"))
    }
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

/// An egress allow rule: host `name` or `*.suffix`, known methods, a path prefix from `/`.
pub fn rule(rule: &Rule) -> Result<(), String> {
    let host = rule.host.as_str();
    let name = host.strip_prefix("*.").unwrap_or(host);
    if name.is_empty() {
        return Err(format!("rule host {host:?} is empty"));
    }
    if name.len() > 253
        || name.starts_with('.')
        || name.ends_with('.')
        || name.contains("..")
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']'))
    {
        return Err(format!(
            "rule host {host:?} is not a host name or a '*.suffix' glob"
        ));
    }
    for m in &rule.methods {
        if !METHODS.contains(&m.as_str()) {
            return Err(format!("rule method {m:?} is not a known HTTP method"));
        }
    }
    if let Some(p) = &rule.path_prefix
        && (!p.starts_with('/') || p.chars().any(|c| c.is_control() || c == ' '))
    {
        return Err(format!("rule path-prefix {p:?} must start with '/'"));
    }
    Ok(())
}

/// An artifact name is relative, `/`-separated, with no `.`/`..`/empty component.
pub fn artifact_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_ARTIFACT_NAME {
        return Err(format!(
            "artifact name must be 1..={MAX_ARTIFACT_NAME} bytes"
        ));
    }
    if name.starts_with('/') {
        return Err(format!("artifact name {name:?} is absolute"));
    }
    if name.contains('\0') || name.contains('\\') {
        return Err(format!("artifact name {name:?} has a NUL or a backslash"));
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!(
            "artifact name {name:?} has an empty, '.' or '..' component"
        ));
    }
    Ok(())
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
        }
    }

    fn r(host: &str, methods: &[&str], path: Option<&str>) -> Rule {
        Rule {
            host: host.into(),
            methods: methods.iter().map(|s| s.to_string()).collect(),
            path_prefix: path.map(Into::into),
        }
    }

    #[test]
    fn keys() {
        let rows = [
            ("demo", true),
            ("ci-run_42.a", true),
            ("", false),
            (".hidden", false),
            ("a/b", false),
            ("a b", false),
            ("é", false),
        ];
        for (k, ok) in rows {
            assert_eq!(key(k).is_ok(), ok, "key {k:?}");
        }
        assert!(key(&"k".repeat(MAX_KEY)).is_ok());
        assert!(key(&"k".repeat(MAX_KEY + 1)).is_err());
    }

    #[test]
    fn process_ids_are_uuids_never_pids() {
        let rows = [
            ("3f2b8c1e-0000-4000-8000-00000000002a", true),
            ("1234", false),
            ("3F2B8C1E-0000-4000-8000-00000000002A", false),
            ("3f2b8c1e-0000-4000-8000-00000000002", false),
            ("3f2b8c1e00000-4000-8000-00000000002a", false),
            ("../../etc/passwd", false),
        ];
        for (id, ok) in rows {
            assert_eq!(process_id(id).is_ok(), ok, "id {id:?}");
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
        let rows: Vec<(&str, ExecInput, Door, bool)> = vec![
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
        ];
        for (rule_, ok) in rows {
            assert_eq!(rule(&rule_).is_ok(), ok, "rule {rule_:?}");
        }
    }

    #[test]
    fn artifact_names_never_escape() {
        let rows = [
            ("report.tgz", true),
            ("playwright/index.html", true),
            ("..", false),
            ("../etc/passwd", false),
            ("a/../../b", false),
            ("/etc/passwd", false),
            ("a//b", false),
            ("./a", false),
            ("a\\..\\b", false),
            ("", false),
        ];
        for (name, ok) in rows {
            assert_eq!(artifact_name(name).is_ok(), ok, "name {name:?}");
        }
    }
}
