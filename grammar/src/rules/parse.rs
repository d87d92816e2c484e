//! Parsing what a consumer wrote into a [`Rule`], with typed errors: each refusal is
//! one [`InvalidRule`] variant, and its text is the message a consumer reads (the API,
//! the guest's `invalid-input` and the docs quote these words: they do not change).

use std::net::{IpAddr, Ipv6Addr};

use super::{
    CREDENTIAL_DEFAULT_PORT, CREDENTIAL_METHODS, HostPattern, METHODS, Rule, RuleSpec,
    credential_method, method_bit, normalize_path,
};
use crate::names::NameError;
pub use crate::names::{MAX_SECRET_NAME, secret_name};

/// Most headers one rule may add.
pub const MAX_RULE_HEADERS: usize = 16;

/// Why one rule (or a secret binding's host or path) does not parse. The host
/// variants carry the host as the consumer wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRule {
    /// The host is empty.
    #[error("host is empty")]
    EmptyHost,
    /// The host is `*`.
    #[error("host `*` would admit every host; name the hosts (or `*.suffix`)")]
    EveryHost,
    /// The host (wildcard and port included) is over 253 bytes.
    #[error("host {0:?} is longer than 253 characters")]
    HostTooLong(String),
    /// `[` without `]`.
    #[error("host {0:?}: `[` without `]`")]
    UnclosedBracket(String),
    /// What is inside `[…]` is not an IPv6 address.
    #[error("host {host:?}: {addr:?} is not an IPv6 address")]
    NotIpv6 {
        /// The host.
        host: String,
        /// What was inside the brackets.
        addr: String,
    },
    /// Something other than `:port` after `]`.
    #[error("host {0:?}: `]` must be followed by `:port` or nothing")]
    AfterBracket(String),
    /// Several colons without brackets, and not an IPv6 address.
    #[error("host {0:?} is not a valid IPv6 address (write `[addr]:port` to pin a port)")]
    BareIpv6(String),
    /// The port is not 1-65535.
    #[error("host {host:?}: port {port:?} is not a port (1-65535)")]
    Port {
        /// The host.
        host: String,
        /// The port as written.
        port: String,
    },
    /// A `*` anywhere but a leading `*.`.
    #[error("host {0:?}: a wildcard is only allowed as a leading `*.` (as in `*.example.com`)")]
    Wildcard(String),
    /// Nothing left once the wildcard, the port and a trailing dot are taken away.
    #[error("host {0:?} has no name")]
    NoName(String),
    /// A character outside `[A-Za-z0-9._-]`.
    #[error("host {host:?} contains the character {char:?}")]
    HostCharacter {
        /// The host.
        host: String,
        /// The first character refused.
        char: char,
    },
    /// Two dots in a row (or a leading one).
    #[error("host {0:?} has an empty label")]
    EmptyLabel(String),
    /// `*.` in front of an IP address.
    #[error("host {0:?}: `*.` does not apply to an IP address")]
    WildcardIp(String),
    /// A numeric top-level label that is no IPv4 address (`127.1`, leading zeros).
    #[error("host {0:?} looks like an IPv4 address but is not one (write a.b.c.d)")]
    NotIpv4(String),
    /// A method the grammar does not know (methods are upper-case).
    #[error("unknown method {0:?} (expected one of {methods}, upper-case)", methods = METHODS.join(" "))]
    UnknownMethod(String),
    /// A path prefix that does not start with `/`.
    #[error("path-prefix {0:?} must start with `/`")]
    PathRelative(String),
    /// A path prefix with `?` or `#`.
    #[error("path-prefix {0:?} must not contain a query or fragment")]
    PathQuery(String),
    /// A path prefix with whitespace or a control character.
    #[error("path-prefix {0:?} contains whitespace or control characters")]
    PathControl(String),
    /// More than [`MAX_RULE_HEADERS`] headers.
    #[error("more than {MAX_RULE_HEADERS} headers")]
    TooManyHeaders,
    /// A header name that is not an HTTP token of 1-64 characters.
    #[error("header name {0:?} is not an HTTP token (1-64 characters)")]
    HeaderName(String),
    /// A framing, routing or proxy header.
    #[error("header {0:?} may not be set by a rule")]
    ReservedHeader(String),
    /// The same header twice in one rule (lower-case).
    #[error("header {0:?} is named twice")]
    HeaderTwice(String),
    /// A header's secret name does not parse.
    #[error(transparent)]
    Secret(NameError),
    /// `intercept = false` with a method, path or header restriction.
    #[error(
        "a rule with intercept = false checks the host only: it may not restrict method or path nor carry headers"
    )]
    PinnedRestricts,
    /// A rule with headers that lists no methods.
    #[error(
        "a rule with headers must list its methods (a credential is never added to every method)"
    )]
    CredentialAnyMethod,
    /// A rule with headers that admits a method no credential goes on.
    #[error("a rule with headers may not admit {0:?} (credentials go only on {methods})", methods = CREDENTIAL_METHODS.join(" "))]
    CredentialMethod(String),
}

/// A rule that does not parse: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {index}: {error}")]
pub struct RuleError {
    /// Which rule (0-based).
    pub index: usize,
    /// What is wrong.
    pub error: InvalidRule,
}

/// Headers a rule may not set: framing, routing and the proxy's own (a credential
/// header cannot change where a request goes or how it is framed).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// A header name a rule may add: an RFC 9110 token, not reserved, returned lower-case.
pub fn credential_header(name: &str) -> Result<String, InvalidRule> {
    let lower = name.to_ascii_lowercase();
    let token = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(InvalidRule::HeaderName(name.to_owned()));
    }
    if RESERVED_HEADERS.contains(&lower.as_str())
        || lower.starts_with("proxy-")
        || lower.starts_with("x-stockade-")
    {
        return Err(InvalidRule::ReservedHeader(name.to_owned()));
    }
    Ok(lower)
}

/// One rule, parsed; a rule with headers pins a port (443 when it names none).
pub(crate) fn parse_rule(spec: &RuleSpec) -> Result<Rule, InvalidRule> {
    let (host, port) = parse_host(&spec.host)?;
    let mut methods = 0u16;
    for m in &spec.methods {
        match method_bit(m) {
            0 => {
                return Err(InvalidRule::UnknownMethod(m.clone()));
            }
            bit => methods |= bit,
        }
    }
    let path_prefix = match &spec.path_prefix {
        None => None,
        Some(p) => Some(path_prefix(p)?),
    };
    if spec.headers.len() > MAX_RULE_HEADERS {
        return Err(InvalidRule::TooManyHeaders);
    }
    let mut headers: Vec<(String, String)> = Vec::with_capacity(spec.headers.len());
    for (name, secret) in &spec.headers {
        let name = credential_header(name)?;
        secret_name(secret).map_err(InvalidRule::Secret)?;
        if headers.iter().any(|(n, _)| *n == name) {
            return Err(InvalidRule::HeaderTwice(name));
        }
        headers.push((name, secret.clone()));
    }
    let mut rule = Rule {
        host,
        port,
        methods,
        path_prefix,
        headers,
        intercept: spec.intercept,
    };
    if !rule.intercept && rule.needs_interception() {
        return Err(InvalidRule::PinnedRestricts);
    }
    // A credential goes only where the rule says, on requests whose answer does not
    // echo it: the methods are listed, each a standard one (no TRACE/TRACK, which
    // reflect the request, no CONNECT, no extension method), and no port means 443.
    if !rule.headers.is_empty() {
        if spec.methods.is_empty() {
            return Err(InvalidRule::CredentialAnyMethod);
        }
        if let Some(m) = spec.methods.iter().find(|m| !credential_method(m)) {
            return Err(InvalidRule::CredentialMethod(m.clone()));
        }
        rule.port = Some(rule.port.unwrap_or(CREDENTIAL_DEFAULT_PORT));
    }
    Ok(rule)
}

/// A path prefix as a rule (or a secret's binding) writes it, normalized (see
/// [`normalize_path`]).
pub(crate) fn path_prefix(p: &str) -> Result<String, InvalidRule> {
    if !p.starts_with('/') {
        return Err(InvalidRule::PathRelative(p.to_owned()));
    }
    if p.contains(['?', '#']) {
        return Err(InvalidRule::PathQuery(p.to_owned()));
    }
    if p.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(InvalidRule::PathControl(p.to_owned()));
    }
    Ok(normalize_path(p).into_owned())
}

/// A rule's (or a binding's) host: the hosts it names and the port it pins, if any.
pub(crate) fn parse_host(raw: &str) -> Result<(HostPattern, Option<u16>), InvalidRule> {
    let raw_owned = || raw.to_owned();
    if raw.is_empty() {
        return Err(InvalidRule::EmptyHost);
    }
    if raw == "*" {
        return Err(InvalidRule::EveryHost);
    }
    // The whole rule host (wildcard and port included) is at most 253 bytes: one bound
    // a schema can state exactly (docs/openapi.json's `Rule.host`).
    if raw.len() > 253 {
        return Err(InvalidRule::HostTooLong(raw_owned()));
    }
    let lower = raw.to_ascii_lowercase();
    // `[v6]` or `[v6]:port`
    if let Some(rest) = lower.strip_prefix('[') {
        let (addr, tail) = rest
            .split_once(']')
            .ok_or_else(|| InvalidRule::UnclosedBracket(raw_owned()))?;
        let ip: Ipv6Addr = addr.parse().map_err(|_| InvalidRule::NotIpv6 {
            host: raw_owned(),
            addr: addr.to_owned(),
        })?;
        let port = match tail {
            "" => None,
            t => match t.strip_prefix(':') {
                Some(p) => Some(parse_port(raw, p)?),
                None => {
                    return Err(InvalidRule::AfterBracket(raw_owned()));
                }
            },
        };
        return Ok((HostPattern::Ip(IpAddr::V6(ip)), port));
    }
    // A bare IPv6 address (several colons, no brackets, so no port).
    if lower.matches(':').count() > 1 {
        let ip: Ipv6Addr = lower
            .parse()
            .map_err(|_| InvalidRule::BareIpv6(raw_owned()))?;
        return Ok((HostPattern::Ip(IpAddr::V6(ip)), None));
    }
    let (name, port) = match lower.split_once(':') {
        Some((n, p)) => (n, Some(parse_port(raw, p)?)),
        None => (lower.as_str(), None),
    };
    let (wildcard, name) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    if name.contains('*') {
        return Err(InvalidRule::Wildcard(raw_owned()));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(InvalidRule::NoName(raw_owned()));
    }
    if name.len() > 253 {
        return Err(InvalidRule::HostTooLong(raw_owned()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(InvalidRule::HostCharacter {
            host: raw_owned(),
            char: bad,
        });
    }
    if name.split('.').any(str::is_empty) {
        return Err(InvalidRule::EmptyLabel(raw_owned()));
    }
    // No top-level domain is numeric: a numeric last label means an IP address.
    let numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    if wildcard {
        if numeric {
            return Err(InvalidRule::WildcardIp(raw_owned()));
        }
        return Ok((HostPattern::Suffix(format!(".{name}")), port));
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => Ok((HostPattern::Ip(ip), port)),
        Err(_) if numeric => Err(InvalidRule::NotIpv4(raw_owned())),
        Err(_) => Ok((HostPattern::Name(name.to_owned()), port)),
    }
}

fn parse_port(raw: &str, p: &str) -> Result<u16, InvalidRule> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(InvalidRule::Port {
            host: raw.to_owned(),
            port: p.to_owned(),
        }),
        Ok(port) => Ok(port),
    }
}
