//! The rule shorthand of the command line: `[METHODS ]HOST[/PATH-PREFIX]`, e.g.
//! `GET,HEAD pypi.org/simple/` or `*.pythonhosted.org` (`stockade exec --grant`).
//!
//! It only splits the text into a [`RuleSpec`]: methods (upper-cased, comma-separated,
//! before the first space), the host up to the first `/`, the rest as the path prefix.
//! Whether the rule is valid is [`Grant::parse`](crate::rules::Grant::parse)'s to say,
//! in the guest, like every rule however it was written.

use crate::rules::RuleSpec;

/// Why a shorthand rule cannot be split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShorthandError {
    /// Nothing is left for the host (the rule as written).
    NoHost(String),
}

impl std::fmt::Display for ShorthandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShorthandError::NoHost(s) => write!(f, "rule {s:?} has no host"),
        }
    }
}

impl std::error::Error for ShorthandError {}

/// Split `[METHODS ]HOST[/PATH-PREFIX]` into a rule (no headers, interceptable).
pub fn parse(s: &str) -> Result<RuleSpec, ShorthandError> {
    let s = s.trim();
    let (methods, rest) = match s.split_once(char::is_whitespace) {
        Some((m, r)) => (
            m.split(',')
                .map(|m| m.trim().to_ascii_uppercase())
                .collect(),
            r.trim(),
        ),
        None => (vec![], s),
    };
    let (host, path_prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_owned())),
        None => (rest, None),
    };
    if host.is_empty() {
        return Err(ShorthandError::NoHost(s.to_owned()));
    }
    Ok(RuleSpec {
        host: host.to_owned(),
        methods,
        path_prefix,
        headers: Vec::new(),
        intercept: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shorthand_splits_methods_host_and_path() {
        // (written, methods, host, path prefix)
        let rows: &[(&str, &[&str], &str, Option<&str>)] = &[
            ("pypi.org", &[], "pypi.org", None),
            ("*.pythonhosted.org", &[], "*.pythonhosted.org", None),
            (
                "GET,head pypi.org/simple/",
                &["GET", "HEAD"],
                "pypi.org",
                Some("/simple/"),
            ),
            (
                "post api.example.com:8443/v1",
                &["POST"],
                "api.example.com:8443",
                Some("/v1"),
            ),
            (
                "  GET   127.0.0.2/allowed/  ",
                &["GET"],
                "127.0.0.2",
                Some("/allowed/"),
            ),
            ("GET, HEAD h", &["GET", ""], "HEAD h", None),
            ("host/", &[], "host", Some("/")),
            ("[::1]:8080/x", &[], "[::1]:8080", Some("/x")),
        ];
        for (written, methods, host, path) in rows {
            let r = parse(written).unwrap_or_else(|e| panic!("{written:?}: {e}"));
            assert_eq!(r.methods, *methods, "{written:?}");
            assert_eq!(r.host, *host, "{written:?}");
            assert_eq!(r.path_prefix.as_deref(), *path, "{written:?}");
            assert!(r.headers.is_empty() && r.intercept, "{written:?}");
        }
    }

    #[test]
    fn a_rule_with_no_host_is_refused_as_written() {
        for written in ["", "   ", "GET /x", "/x", "GET,HEAD /"] {
            assert_eq!(
                parse(written),
                Err(ShorthandError::NoHost(written.trim().to_owned())),
                "{written:?}"
            );
        }
        assert_eq!(
            parse("GET /x").unwrap_err().to_string(),
            "rule \"GET /x\" has no host"
        );
    }
}
