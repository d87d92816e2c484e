//! The names a consumer hands Stockade: sandbox keys, process ids, artifact names. One
//! check each, used by the guest (before any substrate call) and by the host (the API,
//! the linux substrate's artifact reader), so both refuse the same inputs.

/// Longest sandbox key.
pub const MAX_KEY: usize = 128;
/// Longest artifact name.
pub const MAX_ARTIFACT_NAME: usize = 1024;

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

/// An artifact name is relative, `/`-separated, with no `.`/`..`/empty component, no
/// NUL and no backslash.
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

#[cfg(test)]
mod tests {
    use super::*;

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
            ("a\0b", false),
            ("", false),
        ];
        for (name, ok) in rows {
            assert_eq!(artifact_name(name).is_ok(), ok, "name {name:?}");
        }
    }
}
