//! The pure decisions of the E2B layer: what a sandbox id is, which Stockade key it
//! names for a token's scope, and which file in `/workspace` an E2B path names.
//! Table-tested; nothing here does I/O but [`new_id`]'s read of the OS CSPRNG.

/// How many characters a sandbox id has: 20 of 36 (lowercase and digits), ~103 bits.
pub const ID_LEN: usize = 20;

/// The prefix of the operator's sandboxes' keys (a token reaching every key).
pub const OPERATOR_PREFIX: &str = "e2b-";

/// A fresh sandbox id: [`ID_LEN`] characters of `[a-z0-9]` from the OS CSPRNG (two
/// UUIDv4s' random bits), so it is a DNS label and a key suffix as it is.
pub fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    // 256 is not a multiple of 36: a byte past the largest multiple (252) is skipped,
    // so every character is equally likely. 32 bytes leave 20 with overwhelming odds;
    // short of that, draw again.
    let mut id: String = bytes
        .iter()
        .filter(|b| **b < 252)
        .map(|b| ALPHABET[(*b % 36) as usize] as char)
        .take(ID_LEN)
        .collect();
    while id.len() < ID_LEN {
        id.push_str(&new_id()[..ID_LEN - id.len()]);
    }
    id
}

/// Is `id` a sandbox id this layer could have made? Checked before it is looked up or
/// written into a key, so a caller's id cannot name another key's shape.
pub fn valid_id(id: &str) -> bool {
    id.len() == ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Why no key could be made for a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The id is not one this layer makes.
    BadId,
    /// The scope (`GET /v1/tokens/self`'s `keys`) is no pattern this layer knows.
    BadScope,
    /// The derived key does not pass the shared grammar (a prefix too long).
    Grammar(String),
}

/// The Stockade key of sandbox `id` for a token whose scope is `keys` (pure):
///
/// * `*` (the operator's token): `e2b-<id>`;
/// * `p*` (a scoped token's prefix): `<p><id>`, inside its pattern by construction;
/// * one key `k`: `k` itself; such a token holds one sandbox at a time (the caller
///   checks that none is live).
pub fn key_for(keys: &str, id: &str) -> Result<String, KeyError> {
    if !valid_id(id) {
        return Err(KeyError::BadId);
    }
    let key = match keys {
        "" => return Err(KeyError::BadScope),
        "*" => format!("{OPERATOR_PREFIX}{id}"),
        p if p.ends_with('*') => {
            let prefix = &p[..p.len() - 1];
            if prefix.contains('*') {
                return Err(KeyError::BadScope);
            }
            format!("{prefix}{id}")
        }
        k if k.contains('*') => return Err(KeyError::BadScope),
        k => k.to_string(),
    };
    stockade_grammar::names::key(&key).map_err(|e| KeyError::Grammar(e.to_string()))?;
    Ok(key)
}

/// The sandbox user's home as E2B names it; in Stockade it is `/workspace`.
pub const E2B_HOME: &str = "/home/user";
/// Where a sandbox's files live in Stockade.
pub const WORKSPACE: &str = "/workspace";

/// The path relative to `/workspace` of the file an E2B path names (pure), or why
/// not. E2B's home `/home/user` is Stockade's `/workspace` (where uploads land and
/// commands start); `/workspace/...` is taken as it is; a relative path is relative to
/// the home, as E2B resolves it. Nothing else is reachable through files: anything
/// outside, a `.` or `..` segment, an empty segment, a NUL, or the home itself (a
/// directory) is refused, before any call.
pub fn workspace_path(path: &str) -> Result<String, String> {
    if path.contains('\0') {
        return Err("a path has no NUL".into());
    }
    let rel = if let Some(rest) = path.strip_prefix('/') {
        let rest = format!("/{rest}");
        [E2B_HOME, WORKSPACE]
            .iter()
            .find_map(|root| rest.strip_prefix(&format!("{root}/")).map(str::to_string))
            .ok_or_else(|| {
                format!(
                    "{path}: only paths under {E2B_HOME} (the sandbox's /workspace) are reachable"
                )
            })?
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest.to_string()
    } else {
        path.to_string()
    };
    let rel = rel.trim_end_matches('/');
    if rel.is_empty() {
        return Err(format!("{path}: names a directory, not a file"));
    }
    if rel
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(format!("{path}: no empty, `.` or `..` segment"));
    }
    Ok(rel.to_string())
}

/// The path relative to `/workspace` of the entry an E2B path names (pure), the
/// home itself included (`""`): what the filesystem service's Stat, ListDir, MakeDir
/// and watches take, a directory as often as a file. The same mapping as
/// [`workspace_path`], which refuses the home (a file call on it, a Remove or Move of
/// the whole workspace).
pub fn workspace_entry(path: &str) -> Result<String, String> {
    let p = path.trim_end_matches('/');
    if [E2B_HOME, WORKSPACE, "~"].contains(&p) && !p.is_empty() {
        return Ok(String::new());
    }
    workspace_path(path)
}

/// The E2B path of the entry at `rel` in `/workspace` (pure): the inverse of
/// [`workspace_entry`], in E2B's namespace (`/home/user/...`).
pub fn e2b_path(rel: &str) -> String {
    if rel.is_empty() {
        E2B_HOME.to_string()
    } else {
        format!("{E2B_HOME}/{rel}")
    }
}

/// A working directory as E2B names it, as Stockade's (pure): the home and paths
/// under it are `/workspace`'s; `/workspace...` as it is; another absolute directory
/// is passed on (the API's own checks decide); none is the API's default, `/workspace`.
pub fn workdir(cwd: Option<&str>) -> Option<String> {
    let cwd = cwd.filter(|c| !c.is_empty())?;
    if cwd == E2B_HOME || cwd == "~" {
        return Some(WORKSPACE.to_string());
    }
    if let Some(rest) = cwd.strip_prefix(&format!("{E2B_HOME}/")) {
        return Some(format!("{WORKSPACE}/{rest}"));
    }
    if !cwd.starts_with('/') {
        return Some(format!("{WORKSPACE}/{cwd}"));
    }
    Some(cwd.to_string())
}

/// E2B's snapshot ids (`super::snapshots`): a snapshot id is its source sandbox's id
/// and [`SUFFIX_LEN`] more characters from the OS CSPRNG, the native snapshot's name as
/// it is; the source's key is derived from it and the caller's scope as a sandbox's
/// is, so another token's snapshot id names a key of the caller's own.
/// How many characters a snapshot id has: a sandbox id and [`SUFFIX_LEN`] more.
pub const SNAPSHOT_ID_LEN: usize = ID_LEN + SUFFIX_LEN;
/// The random characters after the source's id.
pub const SUFFIX_LEN: usize = 12;

/// A fresh snapshot id of sandbox `source`.
pub fn snapshot_id(source: &str) -> String {
    format!("{source}{}", &new_id()[..SUFFIX_LEN])
}

/// The source sandbox id of `snapshot`, if it is a snapshot id this layer could have
/// made (checked before it is written into a key or a native name).
pub fn source_of(snapshot: &str) -> Option<&str> {
    let ok = snapshot.len() == SNAPSHOT_ID_LEN
        && snapshot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    ok.then(|| &snapshot[..ID_LEN])
}

/// The key holding snapshot `snapshot` for the caller whose scope is `keys`, if the
/// id is one this layer makes.
pub fn source_key(keys: &str, snapshot: &str) -> Option<String> {
    key_for(keys, source_of(snapshot)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dns_labels_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert!(valid_id(id), "{id}");
            assert_eq!(id.len(), ID_LEN);
        }
    }

    #[test]
    fn ids_are_checked() {
        let ok = "a".repeat(ID_LEN);
        for (id, want) in [
            (ok.as_str(), true),
            ("abc", false),
            (&*"A".repeat(ID_LEN), false),
            (&*format!("{}-", "a".repeat(ID_LEN - 1)), false),
            (&*format!("{}/", "a".repeat(ID_LEN - 1)), false),
            (&*"a".repeat(ID_LEN + 1), false),
            ("", false),
        ] {
            assert_eq!(valid_id(id), want, "{id:?}");
        }
    }

    #[test]
    fn keys_fall_in_the_tokens_pattern() {
        let id = "0123456789abcdefghij";
        let cases: &[(&str, &str, Result<&str, KeyError>)] = &[
            ("operator", "*", Ok("e2b-0123456789abcdefghij")),
            ("a prefix", "ci-*", Ok("ci-0123456789abcdefghij")),
            ("one key", "build-7", Ok("build-7")),
            ("an empty scope", "", Err(KeyError::BadScope)),
            ("two stars", "a*b*", Err(KeyError::BadScope)),
            ("a star inside", "a*b", Err(KeyError::BadScope)),
        ];
        for (what, keys, want) in cases {
            let got = key_for(keys, id);
            assert_eq!(got.as_deref().map_err(Clone::clone), want.clone(), "{what}");
            if let Ok(k) = &got
                && keys.ends_with('*')
            {
                assert!(k.starts_with(&keys[..keys.len() - 1]), "{what}");
            }
        }
        assert_eq!(key_for("*", "short"), Err(KeyError::BadId));
        assert_eq!(key_for("*", "../../v1/tokens/abc"), Err(KeyError::BadId));
        let long = format!("{}*", "p".repeat(200));
        assert!(matches!(key_for(&long, id), Err(KeyError::Grammar(_))));
    }

    #[test]
    fn paths_map_into_the_workspace_or_are_refused() {
        let cases: &[(&str, Option<&str>)] = &[
            ("/home/user/a.txt", Some("a.txt")),
            ("/home/user/d/a.txt", Some("d/a.txt")),
            ("/workspace/a.txt", Some("a.txt")),
            ("a.txt", Some("a.txt")),
            ("~/a.txt", Some("a.txt")),
            ("d/a.txt/", Some("d/a.txt")),
            ("/home/user", None),
            ("/home/user/", None),
            ("/home/userx/a", None),
            ("/etc/passwd", None),
            ("/tmp/a", None),
            ("/home/user/../../etc/passwd", None),
            ("/home/user/./a", None),
            ("/home/user//a", None),
            ("../a", None),
            ("", None),
            ("/home/user/a\0b", None),
        ];
        for (path, want) in cases {
            assert_eq!(workspace_path(path).ok().as_deref(), *want, "{path:?}");
        }
    }

    #[test]
    fn entries_are_files_or_the_home_itself() {
        let cases: &[(&str, Option<&str>)] = &[
            ("/home/user", Some("")),
            ("/home/user/", Some("")),
            ("/workspace", Some("")),
            ("~", Some("")),
            ("~/", Some("")),
            ("/home/user/d", Some("d")),
            ("d/e/", Some("d/e")),
            ("/", None),
            ("", None),
            ("/home", None),
            ("/home/userx", None),
            ("/home/user/..", None),
            ("/etc", None),
        ];
        for (path, want) in cases {
            assert_eq!(workspace_entry(path).ok().as_deref(), *want, "{path:?}");
            if let Some(rel) = want {
                let back = e2b_path(rel);
                assert_eq!(workspace_entry(&back).ok().as_deref(), Some(*rel), "{back}");
            }
        }
    }

    #[test]
    fn working_directories_are_the_workspaces() {
        for (cwd, want) in [
            (None, None),
            (Some(""), None),
            (Some("/home/user"), Some("/workspace")),
            (Some("~"), Some("/workspace")),
            (Some("/home/user/src"), Some("/workspace/src")),
            (Some("src"), Some("/workspace/src")),
            (Some("/workspace/x"), Some("/workspace/x")),
            (Some("/tmp"), Some("/tmp")),
        ] {
            assert_eq!(workdir(cwd).as_deref(), want, "{cwd:?}");
        }
    }

    #[test]
    fn a_snapshot_id_names_its_source_and_nothing_else_parses() {
        let src = new_id();
        let s = snapshot_id(&src);
        assert_eq!(s.len(), SNAPSHOT_ID_LEN);
        assert_eq!(source_of(&s), Some(src.as_str()));
        assert_ne!(snapshot_id(&src), s, "the suffix is random");
        stockade_grammar::names::snapshot_name(&s).expect("a native snapshot name as it is");
        for bad in [
            "",
            "base",
            &src,
            &format!("{s}x"),
            &s.to_uppercase(),
            &format!("{}/..", &s[..30]),
            &format!("{}:default", &s[..24]),
        ] {
            assert_eq!(source_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn another_scopes_snapshot_id_names_a_key_of_the_callers_own() {
        let s = snapshot_id(&new_id());
        let a = source_key("team-a-*", &s).unwrap();
        let b = source_key("team-b-*", &s).unwrap();
        assert!(a.starts_with("team-a-") && b.starts_with("team-b-"));
        assert_eq!(source_key("team-a-*", "base"), None);
    }
}
