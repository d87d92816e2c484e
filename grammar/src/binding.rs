//! Where an approver's secret may go (docs/EGRESS.md, "Credentials the command never
//! holds"): a secret is bound, when the approver sets it, to one `host:port`, a list of
//! methods and a path prefix. A rule that names the secret must sit inside that binding,
//! or the fence does not open: the consumer chooses which requests carry a credential,
//! never where it goes.
//!
//! Pure, no I/O: [`parse`] reads an approver's binding, [`rule_within`] says whether
//! a consumer's rule sits inside it, [`grant_within`] checks every credential rule of a
//! parsed grant (the substrate's defense in depth). The API, the guest and the linux
//! substrate all call these, so they refuse the same rules. No message holds a value:
//! the functions never see one.

use std::fmt;

use crate::rules::{
    self, CREDENTIAL_DEFAULT_PORT, CREDENTIAL_METHODS, Grant, HostPattern, InvalidRule, Rule,
    RuleSpec, canonical_ip, credential_method, prefix_matches,
};

/// Where a secret may be sent: set by the approver with the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// One exact host: a lower-case name without a trailing dot, or an IP address
    /// (IPv6 without brackets; an IPv4-mapped IPv6 address as its IPv4 form).
    pub host: String,
    /// The one port (443 when the approver named none).
    pub port: u16,
    /// Upper-case standard methods, each once, never TRACE, TRACK or CONNECT.
    pub methods: Vec<String>,
    /// Normalized path prefix (`/` when the approver named none).
    pub path_prefix: String,
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(
            f,
            "{} {host}:{}{}",
            self.methods.join(","),
            self.port,
            clip(&self.path_prefix)
        )
    }
}

/// Why a binding does not parse, or a rule is outside one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingError {
    /// The binding's host does not parse.
    BadHost(InvalidRule),
    /// The binding's host is a `*.suffix` pattern: a binding names one host.
    WildcardHost,
    /// The binding lists no methods.
    NoMethods,
    /// The binding lists a method that may not carry a credential.
    BadMethod(String),
    /// The binding's path prefix does not parse.
    BadPath(InvalidRule),
    /// The rule itself does not parse.
    Rule(InvalidRule),
    /// The rule names a `*.suffix` host: a credential goes to one host.
    RuleWildcard,
    /// The rule names another host than the binding's.
    Host {
        /// The rule's host (normalized).
        rule: String,
        /// The binding's.
        bound: String,
    },
    /// The rule names another port (no port on a credential rule = 443).
    Port {
        /// The rule's port.
        rule: u16,
        /// The binding's.
        bound: u16,
    },
    /// The rule lists no methods (it would admit every method).
    AnyMethod,
    /// The rule admits a method the binding does not.
    Method {
        /// The method.
        method: String,
        /// The binding's methods.
        bound: Vec<String>,
    },
    /// The rule's path prefix is not at or below the binding's.
    Path {
        /// The rule's prefix (normalized; `/` when it names none).
        rule: String,
        /// The binding's.
        bound: String,
    },
    /// The secret has no binding (set before bindings existed, or a file secret
    /// without one in the configuration): no rule may name it.
    Unbound,
}

/// Client-chosen text in a message is bounded (a 30 kB path never reaches a log).
fn clip(s: &str) -> String {
    const MAX: usize = 256;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl fmt::Display for BindingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindingError::BadHost(e) => write!(f, "binding host: {}", clip(&e.to_string())),
            BindingError::WildcardHost => {
                f.write_str("a binding names one exact host, not a `*.` pattern")
            }
            BindingError::NoMethods => f.write_str("a binding must list its methods"),
            BindingError::BadMethod(m) => write!(
                f,
                "a binding may not list {:?} (only {})",
                clip(m),
                CREDENTIAL_METHODS.join(" ")
            ),
            BindingError::BadPath(e) => write!(f, "binding path: {}", clip(&e.to_string())),
            BindingError::Rule(e) => write!(f, "{}", clip(&e.to_string())),
            BindingError::RuleWildcard => {
                f.write_str("a rule naming a secret names one exact host, not a `*.` pattern")
            }
            BindingError::Host { rule, bound } => write!(
                f,
                "the rule's host {:?} is not the secret's host {:?}",
                clip(rule),
                clip(bound)
            ),
            BindingError::Port { rule, bound } => write!(
                f,
                "the rule's port {rule} is not the secret's port {bound} (no port on a rule with headers means 443)"
            ),
            BindingError::AnyMethod => f.write_str("a rule naming a secret must list its methods"),
            BindingError::Method { method, bound } => write!(
                f,
                "the rule admits {:?}, the secret only {}",
                clip(method),
                bound.join(" ")
            ),
            BindingError::Path { rule, bound } => write!(
                f,
                "the rule's path prefix {:?} is not at or below the secret's {:?}",
                clip(rule),
                clip(bound)
            ),
            BindingError::Unbound => f.write_str(
                "the secret has no binding (set it again with its host, methods and path)",
            ),
        }
    }
}

impl std::error::Error for BindingError {}

/// The one string a host pattern is compared by: a name, or an IP in canonical form.
fn exact_host(h: &HostPattern) -> Option<String> {
    match h {
        HostPattern::Name(n) => Some(n.clone()),
        HostPattern::Ip(ip) => Some(canonical_ip(*ip).to_string()),
        HostPattern::Suffix(_) => None,
    }
}

/// Parse an approver's binding (host[:port], methods, optional path prefix).
pub fn parse(
    host: &str,
    methods: &[String],
    path_prefix: Option<&str>,
) -> Result<Binding, BindingError> {
    let (pattern, port) = rules::parse_host(host).map_err(BindingError::BadHost)?;
    let host = exact_host(&pattern).ok_or(BindingError::WildcardHost)?;
    if methods.is_empty() {
        return Err(BindingError::NoMethods);
    }
    let mut listed: Vec<String> = Vec::with_capacity(methods.len());
    for m in methods {
        if !credential_method(m) {
            return Err(BindingError::BadMethod(m.clone()));
        }
        if !listed.contains(m) {
            listed.push(m.clone());
        }
    }
    let path_prefix = match path_prefix {
        None => "/".to_owned(),
        Some(p) => rules::path_prefix(p).map_err(BindingError::BadPath)?,
    };
    Ok(Binding {
        host,
        port: port.unwrap_or(CREDENTIAL_DEFAULT_PORT),
        methods: listed,
        path_prefix,
    })
}

/// Is `rule` (its host, methods, path prefix) inside `binding`, for secret `secret`?
/// The rule's host equals the binding's (a `*.suffix` rule never does), its port too
/// (none = 443), it lists methods and each is the binding's, and its path prefix is at
/// or below the binding's on a segment boundary (`/v1/` holds `/v1/x`, not `/v1x`).
pub fn rule_within(rule: &RuleSpec, binding: &Binding) -> Result<(), BindingError> {
    let parsed = rules::parse_rule(rule).map_err(BindingError::Rule)?;
    parsed_within(&parsed, binding)
}

fn parsed_within(rule: &Rule, binding: &Binding) -> Result<(), BindingError> {
    let host = exact_host(&rule.host).ok_or(BindingError::RuleWildcard)?;
    if host != binding.host {
        return Err(BindingError::Host {
            rule: host,
            bound: binding.host.clone(),
        });
    }
    let port = rule.port.unwrap_or(CREDENTIAL_DEFAULT_PORT);
    if port != binding.port {
        return Err(BindingError::Port {
            rule: port,
            bound: binding.port,
        });
    }
    if rule.methods == 0 {
        return Err(BindingError::AnyMethod);
    }
    for (i, m) in rules::METHODS.iter().enumerate() {
        if rule.methods & (1 << i) != 0 && !binding.methods.iter().any(|b| b == m) {
            return Err(BindingError::Method {
                method: (*m).to_owned(),
                bound: binding.methods.clone(),
            });
        }
    }
    let prefix = rule.path_prefix.as_deref().unwrap_or("/");
    if !prefix_matches(&binding.path_prefix, prefix) {
        return Err(BindingError::Path {
            rule: prefix.to_owned(),
            bound: binding.path_prefix.clone(),
        });
    }
    Ok(())
}

/// A credential rule outside its secret's binding, in a parsed grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantBindingError {
    /// Which rule (0-based).
    pub index: usize,
    /// The secret it names (a name, never a value).
    pub secret: String,
    /// Why.
    pub error: BindingError,
}

impl fmt::Display for GrantBindingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rule {}: secret {:?}: {}",
            self.index, self.secret, self.error
        )
    }
}

impl std::error::Error for GrantBindingError {}

/// Every rule of `grant` that names a secret sits inside that secret's binding
/// (`binding(name)`; `None` = unbound, refused). The first that does not is the error.
pub fn grant_within(
    grant: &Grant,
    binding: impl Fn(&str) -> Option<Binding>,
) -> Result<(), GrantBindingError> {
    for (index, rule) in grant.rules.iter().enumerate() {
        for (_, secret) in &rule.headers {
            let fail = |error| GrantBindingError {
                index,
                secret: secret.clone(),
                error,
            };
            let b = binding(secret).ok_or_else(|| fail(BindingError::Unbound))?;
            parsed_within(rule, &b).map_err(fail)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn cred(host: &str, methods: &[&str], path: Option<&str>) -> RuleSpec {
        RuleSpec {
            headers: vec![("X-Api-Key".into(), "s".into())],
            ..RuleSpec::new(host, methods, path)
        }
    }

    #[test]
    fn an_approvers_binding_parses_to_one_host_port_methods_and_prefix() {
        type Row = (
            &'static str,
            &'static str,
            &'static [&'static str],
            Option<&'static str>,
            Result<(&'static str, u16, &'static [&'static str], &'static str), BindingError>,
        );
        let rows: &[Row] = &[
            (
                "no port means 443, no path means /",
                "API.example.com",
                &["GET", "POST"],
                None,
                Ok(("api.example.com", 443, &["GET", "POST"], "/")),
            ),
            (
                "a port is kept",
                "api.example.com:8443",
                &["GET"],
                Some("/v1/"),
                Ok(("api.example.com", 8443, &["GET"], "/v1/")),
            ),
            (
                "a method listed twice is kept once",
                "api.example.com",
                &["GET", "GET"],
                None,
                Ok(("api.example.com", 443, &["GET"], "/")),
            ),
            (
                "a path is normalized",
                "api.example.com",
                &["GET"],
                Some("/v1/x/../"),
                Ok(("api.example.com", 443, &["GET"], "/v1/")),
            ),
            (
                "an IPv6 host with a port",
                "[::1]:8443",
                &["GET"],
                None,
                Ok(("::1", 8443, &["GET"], "/")),
            ),
            (
                "an IPv4-mapped host is its IPv4 form",
                "[::ffff:10.0.0.1]",
                &["GET"],
                None,
                Ok(("10.0.0.1", 443, &["GET"], "/")),
            ),
            (
                "a wildcard host is refused",
                "*.example.com",
                &["GET"],
                None,
                Err(BindingError::WildcardHost),
            ),
            (
                "no methods is refused",
                "api.example.com",
                &[],
                None,
                Err(BindingError::NoMethods),
            ),
            (
                "TRACE is refused",
                "api.example.com",
                &["GET", "TRACE"],
                None,
                Err(BindingError::BadMethod("TRACE".into())),
            ),
            (
                "TRACK is refused",
                "api.example.com",
                &["TRACK"],
                None,
                Err(BindingError::BadMethod("TRACK".into())),
            ),
            (
                "CONNECT is refused",
                "api.example.com",
                &["CONNECT"],
                None,
                Err(BindingError::BadMethod("CONNECT".into())),
            ),
            (
                "a lower-case method is refused",
                "api.example.com",
                &["get"],
                None,
                Err(BindingError::BadMethod("get".into())),
            ),
        ];
        for (sentence, host, methods, path, want) in rows {
            let got = parse(host, &m(methods), *path);
            let want = want.clone().map(|(h, p, ms, pp)| Binding {
                host: h.into(),
                port: p,
                methods: m(ms),
                path_prefix: pp.into(),
            });
            assert_eq!(got, want, "{sentence}");
        }
        for (sentence, host, path) in [
            ("an empty host", "", None),
            ("a bad port", "api.example.com:0", None),
            ("a path without /", "api.example.com", Some("v1")),
            ("a path with a query", "api.example.com", Some("/v1?x")),
        ] {
            assert!(parse(host, &m(&["GET"]), path).is_err(), "{sentence}");
        }
    }

    #[test]
    fn a_rule_naming_a_secret_sits_inside_its_binding() {
        let b = parse("api.example.com", &m(&["GET", "POST"]), Some("/v1/")).unwrap();
        let rows: &[(&str, RuleSpec, Result<(), BindingError>)] = &[
            (
                "the bound host, a bound method, the bound prefix",
                cred("api.example.com", &["GET"], Some("/v1/")),
                Ok(()),
            ),
            (
                "a prefix below the binding's",
                cred("api.example.com", &["GET", "POST"], Some("/v1/items/")),
                Ok(()),
            ),
            (
                "the host in another case, port 443 written out",
                cred("API.example.com:443", &["POST"], Some("/v1/x")),
                Ok(()),
            ),
            (
                "another host (the issue's attacker)",
                cred("attacker.example", &["GET"], Some("/v1/")),
                Err(BindingError::Host {
                    rule: "attacker.example".into(),
                    bound: "api.example.com".into(),
                }),
            ),
            (
                "a sub-domain of the bound host",
                cred("evil.api.example.com", &["GET"], Some("/v1/")),
                Err(BindingError::Host {
                    rule: "evil.api.example.com".into(),
                    bound: "api.example.com".into(),
                }),
            ),
            (
                "a wildcard that covers the bound host",
                cred("*.example.com", &["GET"], Some("/v1/")),
                Err(BindingError::RuleWildcard),
            ),
            (
                "another port",
                cred("api.example.com:8443", &["GET"], Some("/v1/")),
                Err(BindingError::Port {
                    rule: 8443,
                    bound: 443,
                }),
            ),
            (
                "a method the binding does not list",
                cred("api.example.com", &["GET", "DELETE"], Some("/v1/")),
                Err(BindingError::Method {
                    method: "DELETE".into(),
                    bound: m(&["GET", "POST"]),
                }),
            ),
            (
                "no path prefix is the whole host, wider than /v1/",
                cred("api.example.com", &["GET"], None),
                Err(BindingError::Path {
                    rule: "/".into(),
                    bound: "/v1/".into(),
                }),
            ),
            (
                "a sibling prefix sharing the letters",
                cred("api.example.com", &["GET"], Some("/v1x/")),
                Err(BindingError::Path {
                    rule: "/v1x/".into(),
                    bound: "/v1/".into(),
                }),
            ),
            (
                "/v1 without the slash admits /v1 itself, outside /v1/",
                cred("api.example.com", &["GET"], Some("/v1")),
                Err(BindingError::Path {
                    rule: "/v1".into(),
                    bound: "/v1/".into(),
                }),
            ),
            (
                "dots that climb out of the prefix",
                cred("api.example.com", &["GET"], Some("/v1/../admin/")),
                Err(BindingError::Path {
                    rule: "/admin/".into(),
                    bound: "/v1/".into(),
                }),
            ),
            (
                "a rule with headers and no methods does not parse",
                cred("api.example.com", &[], Some("/v1/")),
                Err(BindingError::Rule(InvalidRule::CredentialAnyMethod)),
            ),
        ];
        for (sentence, rule, want) in rows {
            assert_eq!(rule_within(rule, &b), *want, "{sentence}");
        }
        // The typed error reads as the grammar's message did when it was text.
        assert_eq!(
            BindingError::Rule(InvalidRule::CredentialAnyMethod).to_string(),
            "a rule with headers must list its methods (a credential is never added to every method)"
        );
        // A rule without headers is checked on the same terms (no methods = any).
        assert_eq!(
            rule_within(&RuleSpec::new("api.example.com", &[], Some("/v1/")), &b),
            Err(BindingError::AnyMethod)
        );
    }

    #[test]
    fn segment_aware_prefixes_and_ports() {
        let bare = parse("api.example.com:8443", &m(&["GET"]), Some("/v1")).unwrap();
        let rows: &[(&str, RuleSpec, bool)] = &[
            (
                "/v1 holds /v1",
                cred("api.example.com:8443", &["GET"], Some("/v1")),
                true,
            ),
            (
                "/v1 holds /v1/",
                cred("api.example.com:8443", &["GET"], Some("/v1/")),
                true,
            ),
            (
                "/v1 holds /v1/x",
                cred("api.example.com:8443", &["GET"], Some("/v1/x")),
                true,
            ),
            (
                "/v1 does not hold /v1x",
                cred("api.example.com:8443", &["GET"], Some("/v1x")),
                false,
            ),
            (
                "a credential rule without a port means 443, not the bound 8443",
                cred("api.example.com", &["GET"], Some("/v1")),
                false,
            ),
        ];
        for (sentence, rule, ok) in rows {
            assert_eq!(rule_within(rule, &bare).is_ok(), *ok, "{sentence}");
        }
        let ip = parse("127.0.0.2:4443", &m(&["GET"]), None).unwrap();
        assert!(rule_within(&cred("127.0.0.2:4443", &["GET"], None), &ip).is_ok());
        assert!(rule_within(&cred("[::ffff:127.0.0.2]:4443", &["GET"], None), &ip).is_ok());
        assert!(rule_within(&cred("127.0.0.3:4443", &["GET"], None), &ip).is_err());
    }

    #[test]
    fn every_credential_rule_of_a_grant_is_checked_and_unbound_secrets_are_refused() {
        let bound = parse("api.example.com", &m(&["GET"]), None).unwrap();
        let lookup = |name: &str| (name == "bound").then(|| bound.clone());
        let rule = |host: &str, secret: &str| RuleSpec {
            headers: vec![("X-Api-Key".into(), secret.into())],
            ..RuleSpec::new(host, &["GET"], None)
        };
        let g = Grant::parse(&[
            RuleSpec::new("anything.example", &[], None),
            rule("api.example.com", "bound"),
        ])
        .unwrap();
        assert_eq!(grant_within(&g, lookup), Ok(()));
        let g = Grant::parse(&[
            rule("api.example.com", "bound"),
            rule("attacker.example", "bound"),
        ])
        .unwrap();
        let e = grant_within(&g, lookup).unwrap_err();
        assert_eq!((e.index, e.secret.as_str()), (1, "bound"));
        assert!(matches!(e.error, BindingError::Host { .. }), "{e}");
        assert!(
            e.to_string().starts_with("rule 1: secret \"bound\": "),
            "{e}"
        );
        let g = Grant::parse(&[rule("api.example.com", "old")]).unwrap();
        let e = grant_within(&g, lookup).unwrap_err();
        assert_eq!(e.error, BindingError::Unbound);
    }

    #[test]
    fn messages_are_bounded() {
        let long = format!("/{}", "a".repeat(30_000));
        let e = BindingError::Path {
            rule: long,
            bound: "/".into(),
        };
        assert!(e.to_string().len() < 400);
    }
}
