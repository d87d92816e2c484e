//! The names a consumer hands Stockade: sandbox keys, process ids, artifact names. One
//! check each, used by the guest (before any substrate call) and by the host (the API,
//! the linux substrate's artifact reader), so both refuse the same inputs.

/// Longest sandbox key.
pub const MAX_KEY: usize = 128;
/// Longest artifact name.
pub const MAX_ARTIFACT_NAME: usize = 1024;

/// Why a name is refused. The text is the message a consumer reads (the API, the
/// guest's `invalid-input`): it does not change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// An empty key.
    #[error("key is empty")]
    KeyEmpty,
    /// A key over [`MAX_KEY`] bytes.
    #[error("key is longer than {MAX_KEY} bytes")]
    KeyTooLong,
    /// A key that starts with `.`.
    #[error("key must not start with '.'")]
    KeyDot,
    /// A key with a character outside `[A-Za-z0-9._-]` (the first one).
    #[error("key has a character outside [A-Za-z0-9._-]: {0:?}")]
    KeyCharacter(char),
    /// A process id that is not a lower-case hyphenated UUID.
    #[error("process id is not a UUID: {0:?}")]
    ProcessId(String),
    /// An artifact name that is empty or over [`MAX_ARTIFACT_NAME`] bytes.
    #[error("artifact name must be 1..={MAX_ARTIFACT_NAME} bytes")]
    ArtifactLength,
    /// An absolute artifact name.
    #[error("artifact name {0:?} is absolute")]
    ArtifactAbsolute(String),
    /// An artifact name with a NUL or a backslash.
    #[error("artifact name {0:?} has a NUL or a backslash")]
    ArtifactCharacter(String),
    /// An artifact name with an empty, `.` or `..` component.
    #[error("artifact name {0:?} has an empty, '.' or '..' component")]
    ArtifactComponent(String),
    /// A secret name outside `[a-z0-9._-]{1,64}` (or not starting with a letter or digit).
    #[error(
        "secret name {0:?} must be 1-{max} characters of [a-z0-9._-], starting with a letter or digit",
        max = MAX_SECRET_NAME
    )]
    Secret(String),
    /// A snapshot name outside `[a-z0-9._-]{1,64}` (or not starting with a letter or
    /// digit).
    #[error(
        "snapshot name {0:?} must be 1-{max} characters of [a-z0-9._-], starting with a letter or digit",
        max = MAX_SNAPSHOT_NAME
    )]
    Snapshot(String),
}

/// The message, for callers whose errors are text (the contract's `invalid-input`).
impl From<NameError> for String {
    fn from(e: NameError) -> String {
        e.to_string()
    }
}

/// A key is 1–128 characters of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn key(key: &str) -> Result<(), NameError> {
    if key.is_empty() {
        return Err(NameError::KeyEmpty);
    }
    if key.len() > MAX_KEY {
        return Err(NameError::KeyTooLong);
    }
    if key.starts_with('.') {
        return Err(NameError::KeyDot);
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::KeyCharacter(c));
    }
    Ok(())
}

/// A process id is a lowercase hyphenated UUID: ids come from the substrate, never pids.
pub fn process_id(id: &str) -> Result<(), NameError> {
    let b = id.as_bytes();
    let shape_ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        });
    if shape_ok {
        Ok(())
    } else {
        Err(NameError::ProcessId(id.to_owned()))
    }
}

/// An artifact name is relative, `/`-separated, with no `.`/`..`/empty component, no
/// NUL and no backslash.
pub fn artifact_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() || name.len() > MAX_ARTIFACT_NAME {
        return Err(NameError::ArtifactLength);
    }
    if name.starts_with('/') {
        return Err(NameError::ArtifactAbsolute(name.to_owned()));
    }
    if name.contains('\0') || name.contains('\\') {
        return Err(NameError::ArtifactCharacter(name.to_owned()));
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(NameError::ArtifactComponent(name.to_owned()));
    }
    Ok(())
}

/// Longest secret name.
pub const MAX_SECRET_NAME: usize = 64;

/// A secret's name: 1–64 characters of `[a-z0-9._-]`, starting with a letter or digit.
pub fn secret_name(name: &str) -> Result<(), NameError> {
    if lower_name(name, MAX_SECRET_NAME) {
        Ok(())
    } else {
        Err(NameError::Secret(name.to_owned()))
    }
}

/// Longest snapshot name.
pub const MAX_SNAPSHOT_NAME: usize = 64;

/// A named snapshot's name: 1–64 characters of `[a-z0-9._-]`, starting with a letter
/// or digit (so it is a safe file name as it is: no `.`, `..`, `/` or NUL).
pub fn snapshot_name(name: &str) -> Result<(), NameError> {
    if lower_name(name, MAX_SNAPSHOT_NAME) {
        Ok(())
    } else {
        Err(NameError::Snapshot(name.to_owned()))
    }
}

/// The refusal of a fork from a snapshot `source` does not hold. The guest answers it,
/// and the API answers the same bytes for a source outside the caller's token: which
/// keys hold which snapshots is never learnt through another tenant's key.
pub fn no_snapshot(source: &str, name: &str) -> String {
    format!("{source} holds no snapshot named {name:?}")
}

/// 1 to `max` characters of `[a-z0-9._-]`, the first a letter or digit.
fn lower_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
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
    fn each_refusal_is_typed_and_reads_as_the_consumer_always_read_it() {
        let long_key = "k".repeat(MAX_KEY + 1);
        let rows: [(Result<(), NameError>, NameError, &str); 9] = [
            (key(""), NameError::KeyEmpty, "key is empty"),
            (
                key(&long_key),
                NameError::KeyTooLong,
                "key is longer than 128 bytes",
            ),
            (key(".a"), NameError::KeyDot, "key must not start with '.'"),
            (
                key("a/b"),
                NameError::KeyCharacter('/'),
                "key has a character outside [A-Za-z0-9._-]: '/'",
            ),
            (
                process_id("1234"),
                NameError::ProcessId("1234".into()),
                "process id is not a UUID: \"1234\"",
            ),
            (
                artifact_name(""),
                NameError::ArtifactLength,
                "artifact name must be 1..=1024 bytes",
            ),
            (
                artifact_name("/etc"),
                NameError::ArtifactAbsolute("/etc".into()),
                "artifact name \"/etc\" is absolute",
            ),
            (
                artifact_name("a\\b"),
                NameError::ArtifactCharacter("a\\b".into()),
                "artifact name \"a\\\\b\" has a NUL or a backslash",
            ),
            (
                artifact_name("a/../b"),
                NameError::ArtifactComponent("a/../b".into()),
                "artifact name \"a/../b\" has an empty, '.' or '..' component",
            ),
        ];
        for (got, want, text) in rows {
            assert_eq!(got, Err(want.clone()), "{text}");
            assert_eq!(want.to_string(), text);
            assert_eq!(String::from(want), text);
        }
        assert_eq!(
            crate::rules::secret_name("-a").unwrap_err().to_string(),
            "secret name \"-a\" must be 1-64 characters of [a-z0-9._-], starting with a letter or digit"
        );
    }

    #[test]
    fn snapshot_names_are_safe_file_names() {
        let rows = [
            ("base", true),
            ("v1.2_after-install", true),
            ("0", true),
            (&"a".repeat(64) as &str, true),
            (&"a".repeat(65) as &str, false),
            ("", false),
            (".", false),
            ("..", false),
            ("-a", false),
            ("a/b", false),
            ("../x", false),
            ("Upper", false),
            ("a\0b", false),
            ("a b", false),
        ];
        for (name, ok) in rows {
            assert_eq!(snapshot_name(name).is_ok(), ok, "name {name:?}");
        }
        assert_eq!(
            snapshot_name("..").unwrap_err().to_string(),
            "snapshot name \"..\" must be 1-64 characters of [a-z0-9._-], starting with a letter or digit"
        );
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
