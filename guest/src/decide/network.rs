//! A key's network (docs/DESIGN.md §2, `set-network`): the grant a fenced command
//! of the key runs under when it brings none of its own. It is a grant like any other:
//! validated by the grammar when it is set, decided again at every command that uses
//! it (the credentials' bindings as they are then), open only while that command runs
//! (invariant 1). A detached process never reads it: it holds no grant, ever
//! (invariant 3).
//!
//! Records: the network of key `k` is `k` in scope [`NETWORKS`] (a scope name starting
//! with `~` is never a key), the grant written by [`encode`]: a first line `v1 ask=0|1`,
//! then a line per rule, its fields separated by tabs (host, methods, path prefix,
//! intercept, headers), each field escaped ([`escape`]) so every string round-trips.

use crate::stockade::sandbox::types::{CredentialHeader, Grant, Rule};

/// The scope holding every key's network, by key.
pub const NETWORKS: &str = "~networks";

/// Where a fenced command's grant came from (its canonical line's `grant` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The command brought its own.
    Own,
    /// The key's network.
    Network,
    /// Neither: the fence opens with no rules, so every request is denied.
    None,
}

impl Source {
    /// The label of the canonical line.
    pub fn label(self) -> &'static str {
        match self {
            Source::Own => "own",
            Source::Network => "network",
            Source::None => "none",
        }
    }
}

/// The grant a command runs under: its own when it brings one, else the key's network
/// (`recorded`, as read from the records), else none. A recorded network that does not
/// read back is an error: no command runs under a grant nobody can read (it would be
/// either wider or narrower than the one that was set).
pub fn choose(
    own: Option<Grant>,
    recorded: Option<&str>,
) -> Result<(Option<Grant>, Source), String> {
    match (own, recorded) {
        (Some(g), _) => Ok((Some(g), Source::Own)),
        (None, Some(v)) => decode(v)
            .map(|g| (Some(g), Source::Network))
            .ok_or_else(|| "the key's network record does not read back: set it again".into()),
        (None, None) => Ok((None, Source::None)),
    }
}

/// A grant as recorded.
pub fn encode(g: &Grant) -> String {
    let mut out = format!("v1 ask={}", u8::from(g.ask));
    for r in &g.rules {
        let methods: Vec<String> = r.methods.iter().map(|m| escape(m)).collect();
        let path = match &r.path_prefix {
            Some(p) => format!("={}", escape(p)),
            None => "-".to_string(),
        };
        let headers: Vec<String> = r
            .headers
            .iter()
            .map(|h| format!("{}={}", escape(&h.name), escape(&h.secret)))
            .collect();
        out.push('\n');
        out.push_str(
            &[
                escape(&r.host),
                methods.join(","),
                path,
                u8::from(r.intercept).to_string(),
                headers.join(","),
            ]
            .join("\t"),
        );
    }
    out
}

/// A recorded grant read back; `None` if it is not one.
pub fn decode(value: &str) -> Option<Grant> {
    let mut lines = value.split('\n');
    let ask = match lines.next()? {
        "v1 ask=0" => false,
        "v1 ask=1" => true,
        _ => return None,
    };
    let rules = lines.map(rule).collect::<Option<Vec<Rule>>>()?;
    Some(Grant { rules, ask })
}

/// A field's comma-separated items (none when it is empty).
fn list(s: &str) -> Vec<&str> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(',').collect()
    }
}

fn rule(line: &str) -> Option<Rule> {
    let fields: Vec<&str> = line.split('\t').collect();
    let [host, methods, path, intercept, headers] = fields[..] else {
        return None;
    };
    let methods = list(methods)
        .into_iter()
        .map(unescape)
        .collect::<Option<Vec<String>>>()?;
    let path_prefix = match path {
        "-" => None,
        p => Some(unescape(p.strip_prefix('=')?)?),
    };
    let intercept = match intercept {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let headers = list(headers)
        .into_iter()
        .map(|h| {
            let (name, secret) = h.split_once('=')?;
            Some(CredentialHeader {
                name: unescape(name)?,
                secret: unescape(secret)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Rule {
        host: unescape(host)?,
        methods,
        path_prefix,
        headers,
        intercept,
    })
}

/// A field with every character the format uses (`%`, tab, newline, `,`, `=`) written
/// `%XX`, so a field never holds one.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' | '\t' | '\n' | ',' | '=' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A field read back; `None` for a `%` not followed by two hex digits, or one that
/// escapes a character [`escape`] leaves as it is.
pub fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let hex: String = chars.by_ref().take(2).collect();
        let code = u8::from_str_radix(&hex, 16)
            .ok()
            .filter(|_| hex.len() == 2)?;
        match code as char {
            c @ ('%' | '\t' | '\n' | ',' | '=') => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str) -> Rule {
        Rule {
            host: host.into(),
            methods: vec![],
            path_prefix: None,
            headers: vec![],
            intercept: true,
        }
    }

    #[test]
    fn every_grant_round_trips() {
        let awkward = Rule {
            host: "api.example.com:8443".into(),
            methods: vec!["GET".into(), "POST".into()],
            path_prefix: Some("/v1/a,b=c%d\te\nf".into()),
            headers: vec![
                CredentialHeader {
                    name: "Authorization".into(),
                    secret: "gh.token".into(),
                },
                CredentialHeader {
                    name: "X-Api-Key".into(),
                    secret: "k-2".into(),
                },
            ],
            intercept: false,
        };
        let cases = [
            Grant {
                rules: vec![],
                ask: false,
            },
            Grant {
                rules: vec![],
                ask: true,
            },
            Grant {
                rules: vec![rule("pypi.org"), rule("*.example.com")],
                ask: false,
            },
            Grant {
                rules: vec![awkward, rule("")],
                ask: true,
            },
            Grant {
                rules: vec![Rule {
                    path_prefix: Some(String::new()),
                    ..rule("a.test")
                }],
                ask: false,
            },
        ];
        for g in cases {
            let v = encode(&g);
            assert_eq!(decode(&v), Some(g.clone()), "{v:?}");
        }
    }

    #[test]
    fn what_was_not_written_by_encode_does_not_read_back() {
        for bad in [
            "",
            "v2 ask=0",
            "v1 ask=yes",
            "v1 ask=0\npypi.org",
            "v1 ask=0\npypi.org\t\t-\t2\t",
            "v1 ask=0\npypi.org\t\t/x\t1\t",
            "v1 ask=0\npypi.org\t\t-\t1\tAuthorization",
            "v1 ask=0\npypi%2.org\t\t-\t1\t",
            "v1 ask=0\npypi%41.org\t\t-\t1\t",
            "v1 ask=0\npypi.org\t\t-\t1\t\textra",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn escape_leaves_no_separator_in_a_field() {
        for (raw, escaped) in [
            ("plain", "plain"),
            ("a,b", "a%2Cb"),
            ("a=b", "a%3Db"),
            ("100%", "100%25"),
            ("t\tn\n", "t%09n%0A"),
            ("é/ü", "é/ü"),
        ] {
            assert_eq!(escape(raw), escaped);
            assert_eq!(unescape(escaped).as_deref(), Some(raw));
        }
    }

    #[test]
    fn a_command_runs_under_its_own_grant_else_the_keys_network_else_none() {
        let own = Grant {
            rules: vec![rule("own.test")],
            ask: false,
        };
        let net = Grant {
            rules: vec![rule("net.test")],
            ask: true,
        };
        let recorded = encode(&net);
        let cases: [(
            Option<Grant>,
            Option<&str>,
            Result<(Option<Grant>, Source), ()>,
        ); 5] = [
            (
                Some(own.clone()),
                Some(&recorded),
                Ok((Some(own.clone()), Source::Own)),
            ),
            (
                Some(own.clone()),
                None,
                Ok((Some(own.clone()), Source::Own)),
            ),
            (None, Some(&recorded), Ok((Some(net), Source::Network))),
            (None, None, Ok((None, Source::None))),
            (None, Some("garbage"), Err(())),
        ];
        for (own, rec, want) in cases {
            assert_eq!(choose(own, rec).map_err(|_| ()), want, "{rec:?}");
        }
    }
}
