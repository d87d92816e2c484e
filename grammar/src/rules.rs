//! Egress allow rules: parsing (typed errors) and the pure admit/deny decision.
//!
//! Everything here is data in, data out: [`Grant::parse`] turns what a consumer wrote
//! into rules, [`decide`] says whether one request is admitted and by which rule (or
//! why not), [`pick_target`] says which resolved address the proxy may connect to.
//! The host's egress proxy does the I/O around them; the guest validates a grant with
//! the same [`Grant::parse`] before any substrate call, so both hosts refuse the same
//! rules at the same point (invariant 10).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A rule as a consumer writes it (WIT `rule`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// Exact host (name or IP, optionally `:port`) or `*.suffix`.
    pub host: String,
    /// Upper-case methods; empty = any.
    pub methods: Vec<String>,
    /// Optional path prefix starting with `/`.
    pub path_prefix: Option<String>,
    /// Headers the proxy adds to the requests this rule admits over intercepted HTTPS:
    /// `(header name, secret name)`. The command never holds the values.
    pub headers: Vec<(String, String)>,
    /// `false`: HTTPS to this rule's hosts is never intercepted (a client that pins
    /// its certificates). Such a rule checks the host only, so it may not restrict
    /// method or path nor carry headers.
    pub intercept: bool,
}

impl RuleSpec {
    /// A rule on host, methods and path, with no headers, interceptable.
    pub fn new(host: &str, methods: &[&str], path_prefix: Option<&str>) -> RuleSpec {
        RuleSpec {
            host: host.to_owned(),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            path_prefix: path_prefix.map(str::to_owned),
            headers: Vec::new(),
            intercept: true,
        }
    }
}

/// Most headers one rule may add.
pub const MAX_RULE_HEADERS: usize = 16;
/// Longest secret name.
pub const MAX_SECRET_NAME: usize = 64;

/// A secret's name: 1–64 characters of `[a-z0-9._-]`, starting with a letter or digit.
pub fn secret_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SECRET_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "secret name {name:?} must be 1-{MAX_SECRET_NAME} characters of [a-z0-9._-], starting with a letter or digit"
        ))
    }
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
pub fn credential_header(name: &str) -> Result<String, String> {
    let lower = name.to_ascii_lowercase();
    let token = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(format!(
            "header name {name:?} is not an HTTP token (1-64 characters)"
        ));
    }
    if RESERVED_HEADERS.contains(&lower.as_str())
        || lower.starts_with("proxy-")
        || lower.starts_with("x-stockade-")
    {
        return Err(format!("header {name:?} may not be set by a rule"));
    }
    Ok(lower)
}

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// Which rule (0-based).
    pub index: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rule {}: {}", self.index, self.message)
    }
}

impl std::error::Error for RuleError {}

/// Which hosts a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostPattern {
    /// One host name, lower-case, no trailing dot.
    Name(String),
    /// One IP address.
    Ip(IpAddr),
    /// Sub-domains of a name: stored with its leading dot (`.example.com`), so the
    /// apex never matches.
    Suffix(String),
}

/// One parsed allow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) host: HostPattern,
    /// `Some` pins the port; `None` admits any port (a rule with headers always pins
    /// one: 443 when it names none).
    pub(crate) port: Option<u16>,
    /// Bit set over [`METHODS`]; 0 = any method.
    pub(crate) methods: u16,
    /// Normalized prefix (see [`normalize_path`]).
    pub(crate) path_prefix: Option<String>,
    /// `(lower-case header name, secret name)`, added over intercepted HTTPS.
    pub(crate) headers: Vec<(String, String)>,
    /// `false`: a pinned client's host, never intercepted.
    intercept: bool,
}

impl Rule {
    /// A CONNECT tunnel to this rule's host can only be admitted by looking inside it.
    fn needs_interception(&self) -> bool {
        let methods_ok = self.methods == 0 || self.methods & CONNECT_BIT != 0;
        !methods_ok || self.path_prefix.is_some() || !self.headers.is_empty()
    }
}

/// The methods a rule may name, in bit order.
pub(crate) const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];

/// The methods a request may carry a credential on: the standard ones whose answer
/// does not echo the request. TRACE (and TRACK) reflect the request, headers included,
/// back to the workload; CONNECT opens a tunnel nothing is added to; an extension
/// method's semantics are unknown.
pub const CREDENTIAL_METHODS: [&str; 7] =
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// May a request with this method carry a credential header (pure)?
pub fn credential_method(method: &str) -> bool {
    CREDENTIAL_METHODS.contains(&method)
}

/// The port a credential rule without one pins: HTTPS's, never any port.
pub const CREDENTIAL_DEFAULT_PORT: u16 = 443;

fn method_bit(method: &str) -> u16 {
    METHODS
        .iter()
        .position(|m| *m == method)
        .map_or(0, |i| 1 << i)
}

const CONNECT_BIT: u16 = 1 << 7;

/// A parsed grant: the allow rules of one fence. Everything they do not admit is denied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub(crate) rules: Vec<Rule>,
}

impl Grant {
    /// Parse rule specs; the first rule that does not parse is the error.
    pub fn parse(specs: &[RuleSpec]) -> Result<Grant, RuleError> {
        let rules = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| parse_rule(spec).map_err(|message| RuleError { index, message }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Grant { rules })
    }

    /// The grant that admits nothing.
    pub fn deny_all() -> Grant {
        Grant::default()
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

pub(crate) fn parse_rule(spec: &RuleSpec) -> Result<Rule, String> {
    let (host, port) = parse_host(&spec.host)?;
    let mut methods = 0u16;
    for m in &spec.methods {
        match method_bit(m) {
            0 => {
                return Err(format!(
                    "unknown method {m:?} (expected one of {}, upper-case)",
                    METHODS.join(" ")
                ));
            }
            bit => methods |= bit,
        }
    }
    let path_prefix = match &spec.path_prefix {
        None => None,
        Some(p) => Some(path_prefix(p)?),
    };
    if spec.headers.len() > MAX_RULE_HEADERS {
        return Err(format!("more than {MAX_RULE_HEADERS} headers"));
    }
    let mut headers: Vec<(String, String)> = Vec::with_capacity(spec.headers.len());
    for (name, secret) in &spec.headers {
        let name = credential_header(name)?;
        secret_name(secret)?;
        if headers.iter().any(|(n, _)| *n == name) {
            return Err(format!("header {name:?} is named twice"));
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
        return Err(
            "a rule with intercept = false checks the host only: it may not restrict method or path nor carry headers"
                .into(),
        );
    }
    // A credential goes only where the rule says, on requests whose answer does not
    // echo it: the methods are listed, each a standard one (no TRACE/TRACK, which
    // reflect the request, no CONNECT, no extension method), and no port means 443.
    if !rule.headers.is_empty() {
        if spec.methods.is_empty() {
            return Err(
                "a rule with headers must list its methods (a credential is never added to every method)"
                    .into(),
            );
        }
        if let Some(m) = spec.methods.iter().find(|m| !credential_method(m)) {
            return Err(format!(
                "a rule with headers may not admit {m:?} (credentials go only on {})",
                CREDENTIAL_METHODS.join(" ")
            ));
        }
        rule.port = Some(rule.port.unwrap_or(CREDENTIAL_DEFAULT_PORT));
    }
    Ok(rule)
}

/// A path prefix as a rule (or a secret's binding) writes it, normalized (see
/// [`normalize_path`]).
pub(crate) fn path_prefix(p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("path-prefix {p:?} must start with `/`"));
    }
    if p.contains(['?', '#']) {
        return Err(format!(
            "path-prefix {p:?} must not contain a query or fragment"
        ));
    }
    if p.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "path-prefix {p:?} contains whitespace or control characters"
        ));
    }
    Ok(normalize_path(p).into_owned())
}

pub(crate) fn parse_host(raw: &str) -> Result<(HostPattern, Option<u16>), String> {
    if raw.is_empty() {
        return Err("host is empty".into());
    }
    if raw == "*" {
        return Err("host `*` would admit every host; name the hosts (or `*.suffix`)".into());
    }
    // The whole rule host (wildcard and port included) is at most 253 bytes: one bound
    // a schema can state exactly (docs/openapi.json's `Rule.host`).
    if raw.len() > 253 {
        return Err(format!("host {raw:?} is longer than 253 characters"));
    }
    let lower = raw.to_ascii_lowercase();
    // `[v6]` or `[v6]:port`
    if let Some(rest) = lower.strip_prefix('[') {
        let (addr, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("host {raw:?}: `[` without `]`"))?;
        let ip: Ipv6Addr = addr
            .parse()
            .map_err(|_| format!("host {raw:?}: {addr:?} is not an IPv6 address"))?;
        let port = match tail {
            "" => None,
            t => match t.strip_prefix(':') {
                Some(p) => Some(parse_port(raw, p)?),
                None => {
                    return Err(format!(
                        "host {raw:?}: `]` must be followed by `:port` or nothing"
                    ));
                }
            },
        };
        return Ok((HostPattern::Ip(IpAddr::V6(ip)), port));
    }
    // A bare IPv6 address (several colons, no brackets, so no port).
    if lower.matches(':').count() > 1 {
        let ip: Ipv6Addr = lower.parse().map_err(|_| {
            format!("host {raw:?} is not a valid IPv6 address (write `[addr]:port` to pin a port)")
        })?;
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
        return Err(format!(
            "host {raw:?}: a wildcard is only allowed as a leading `*.` (as in `*.example.com`)"
        ));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(format!("host {raw:?} has no name"));
    }
    if name.len() > 253 {
        return Err(format!("host {raw:?} is longer than 253 characters"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(format!("host {raw:?} contains the character {bad:?}"));
    }
    if name.split('.').any(str::is_empty) {
        return Err(format!("host {raw:?} has an empty label"));
    }
    // No top-level domain is numeric: a numeric last label means an IP address.
    let numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    if wildcard {
        if numeric {
            return Err(format!(
                "host {raw:?}: `*.` does not apply to an IP address"
            ));
        }
        return Ok((HostPattern::Suffix(format!(".{name}")), port));
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => Ok((HostPattern::Ip(ip), port)),
        Err(_) if numeric => Err(format!(
            "host {raw:?} looks like an IPv4 address but is not one (write a.b.c.d)"
        )),
        Err(_) => Ok((HostPattern::Name(name.to_owned()), port)),
    }
}

fn parse_port(raw: &str, p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("host {raw:?}: port {p:?} is not a port (1-65535)")),
        Ok(port) => Ok(port),
    }
}

/// One egress request, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// Target host (name or IP; IPv6 with or without brackets; any case).
    pub host: &'a str,
    /// Target port.
    pub port: u16,
    /// Method (`CONNECT` for a tunnel).
    pub method: &'a str,
    /// Request target path, possibly with a query (empty for a tunnel).
    pub path: &'a str,
    /// A CONNECT tunnel: only the host and port are visible.
    pub tunnel: bool,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No fence is open: no grant at all.
    NoGrant,
    /// No rule names this host (and port).
    NoRule,
    /// A rule names the host, but not this method.
    Method,
    /// A rule names the host and method, but not this path.
    Path,
    /// A path rule applies and the path holds an encoded separator (`%2F`, `%5C`) or a
    /// `;` parameter: an upstream may decode it into a path the rule never admitted.
    AmbiguousPath,
    /// A tunnel whose host is only named by rules that restrict method or path, which
    /// cannot be checked inside TLS without interception (not built).
    NeedsInterception,
    /// The host resolves only to loopback/private addresses.
    PrivateTarget,
    /// The host does not resolve.
    ResolveFailed,
    /// A grant admits the request, but the connection is not held by the fenced run's
    /// process tree (a detached process): an open fence's grant is the fenced
    /// command's alone.
    Detached,
}

impl Reason {
    /// The kebab-case name used in headers, logs and denial records.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoGrant => "no-grant",
            Reason::NoRule => "no-rule",
            Reason::Method => "method",
            Reason::Path => "path",
            Reason::AmbiguousPath => "ambiguous-path",
            Reason::NeedsInterception => "needs-interception",
            Reason::PrivateTarget => "private-target",
            Reason::ResolveFailed => "resolve-failed",
            Reason::Detached => "detached",
        }
    }

    /// How far a request got before it failed: the most specific reason wins.
    fn specificity(self) -> u8 {
        match self {
            Reason::NoGrant | Reason::NoRule => 0,
            Reason::Method => 1,
            Reason::Path | Reason::AmbiguousPath => 2,
            Reason::NeedsInterception => 3,
            Reason::PrivateTarget | Reason::ResolveFailed | Reason::Detached => 4,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verdict on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted by rule number `rule` (0-based, the first rule that admits it).
    Allow {
        /// Index into the grant's rules.
        rule: usize,
    },
    /// Refused.
    Deny(Reason),
}

/// Does the open grant (if any) admit this request? The first rule that admits it wins;
/// otherwise the most specific reason among the rules that named the host.
pub fn decide(grant: Option<&Grant>, req: &Request<'_>) -> Decision {
    let Some(grant) = grant else {
        return Decision::Deny(Reason::NoGrant);
    };
    let mut check = Check::new(req);
    let mut best = Reason::NoRule;
    for (i, rule) in grant.rules.iter().enumerate() {
        match check.rule(rule) {
            Ok(()) => return Decision::Allow { rule: i },
            Err(r) if r.specificity() > best.specificity() => best = r,
            Err(_) => {}
        }
    }
    Decision::Deny(best)
}

/// One request checked rule by rule: its host parsed once, its path normalized at most
/// once (only if a path rule is reached).
struct Check<'r, 'a> {
    req: &'r Request<'a>,
    host: &'a str,
    ip: Option<IpAddr>,
    path: Option<Cow<'a, str>>,
}

impl<'r, 'a> Check<'r, 'a> {
    fn new(req: &'r Request<'a>) -> Self {
        let host = normalize_host(req.host);
        Check {
            req,
            host,
            ip: host.parse::<IpAddr>().ok(),
            path: None,
        }
    }

    /// Does `rule` admit the request? If not, why (`NoRule` when it names another
    /// host).
    fn rule(&mut self, rule: &Rule) -> Result<(), Reason> {
        let req = self.req;
        if !rule.matches_host(self.host, self.ip, req.port) {
            return Err(Reason::NoRule);
        }
        if req.tunnel {
            // Inside a tunnel neither method nor path is visible, and no header can be
            // added: only a rule that restricts neither (or names CONNECT itself) and
            // carries no headers may admit it blind.
            return if rule.needs_interception() {
                Err(Reason::NeedsInterception)
            } else {
                Ok(())
            };
        }
        if rule.methods != 0 && rule.methods & method_bit(req.method) == 0 {
            return Err(Reason::Method);
        }
        if let Some(prefix) = &rule.path_prefix {
            if ambiguous_path(req.path) {
                return Err(Reason::AmbiguousPath);
            }
            let p = self.path.get_or_insert_with(|| normalize_path(req.path));
            if !prefix_matches(prefix, p) {
                return Err(Reason::Path);
            }
        }
        Ok(())
    }
}

/// What the proxy does with a CONNECT tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tunnel {
    /// Splice bytes both ways, unseen (admitted by rule number `rule`).
    Blind {
        /// Index into the grant's rules.
        rule: usize,
    },
    /// Terminate TLS and decide every request inside with [`decide`] (rule `rule`
    /// named the host).
    Intercept {
        /// The first rule that named the host and needs interception.
        rule: usize,
    },
    /// Refused.
    Deny(Reason),
}

/// A CONNECT to `host:port`: blind, intercepted, or refused (pure). `can_intercept`:
/// this container has a CA its clients trust and interception is on.
///
/// * A rule with `intercept = false` naming the host wins: a pinned client's host is
///   never intercepted (the rule is host-only by construction).
/// * Otherwise, when a rule naming the host needs to see inside (method, path or
///   headers) and interception is available, the tunnel is intercepted, so the
///   requests inside are decided one by one against every rule.
/// * Otherwise a host-only rule admits it blind, as without interception.
/// * Otherwise `needs-interception` (or `no-rule`).
pub fn decide_tunnel(grant: Option<&Grant>, host: &str, port: u16, can_intercept: bool) -> Tunnel {
    let Some(grant) = grant else {
        return Tunnel::Deny(Reason::NoGrant);
    };
    let h = normalize_host(host);
    let ip = h.parse::<IpAddr>().ok();
    let mut blind = None;
    let mut intercept = None;
    for (i, rule) in grant.rules.iter().enumerate() {
        if !rule.matches_host(h, ip, port) {
            continue;
        }
        if !rule.intercept {
            return Tunnel::Blind { rule: i };
        }
        if rule.needs_interception() {
            intercept.get_or_insert(i);
        } else {
            blind.get_or_insert(i);
        }
    }
    match (intercept, blind) {
        (Some(rule), _) if can_intercept => Tunnel::Intercept { rule },
        (_, Some(rule)) => Tunnel::Blind { rule },
        (Some(_), None) => Tunnel::Deny(Reason::NeedsInterception),
        (None, None) => Tunnel::Deny(Reason::NoRule),
    }
}

impl Grant {
    /// The headers to add to an intercepted request (pure): those of every rule that
    /// admits it, in rule order; the first rule naming a header wins. `(header, secret)`.
    pub fn headers_for<'g>(&'g self, req: &Request<'_>) -> Vec<(&'g str, &'g str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        // Never on a method whose answer echoes the request (TRACE, TRACK), on a
        // tunnel, nor on a method whose semantics are unknown: the parse refuses such
        // rules; this holds even for a grant built some other way.
        if req.tunnel
            || !credential_method(req.method)
            || self.rules.iter().all(|r| r.headers.is_empty())
        {
            return out;
        }
        let mut check = Check::new(req);
        for rule in &self.rules {
            if rule.headers.is_empty() || check.rule(rule).is_err() {
                continue;
            }
            for (name, secret) in &rule.headers {
                if !out.iter().any(|(n, _)| n == name) {
                    out.push((name, secret));
                }
            }
        }
        out
    }

    /// Every secret the rules name (sorted, once each).
    pub fn secret_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .rules
            .iter()
            .flat_map(|r| r.headers.iter().map(|(_, s)| s.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

impl Rule {
    fn matches_host(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            HostPattern::Name(name) => ip.is_none() && host.eq_ignore_ascii_case(name),
            HostPattern::Ip(rule_ip) => {
                ip.is_some_and(|ip| canonical_ip(ip) == canonical_ip(*rule_ip))
            }
            HostPattern::Suffix(suffix) => {
                ip.is_none()
                    && host.len() > suffix.len()
                    && host.is_char_boundary(host.len() - suffix.len())
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

/// An IPv4-mapped IPv6 address names the IPv4 host.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Strip IPv6 brackets and one trailing dot; case is handled by the comparisons.
fn normalize_host(host: &str) -> &str {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host)
}

/// A prefix matches on a segment boundary: `/api` admits `/api` and `/api/x`, not
/// `/apiary`; `/api/` admits `/api/x`, not `/api`.
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
    }
}

/// Does the path (before any query) hold what an upstream may read as a separator the
/// decision did not see: `%2F` or `%5C` (any case), a raw backslash, or a `;`
/// parameter (`/allowed/..;/secret` on some servers)?
pub fn ambiguous_path(path: &str) -> bool {
    let path = path.find(['?', '#']).map_or(path, |i| &path[..i]);
    let lower = path.to_ascii_lowercase();
    lower.contains("%2f") || lower.contains("%5c") || path.contains(['\\', ';'])
}

/// The request target the proxy forwards: exactly the path that was decided on
/// (normalized as [`normalize_path`] does), then the original query, if any. An
/// upstream never receives a raw path whose `..` or encoded dots the decision resolved
/// differently.
pub fn forward_target(path_and_query: &str) -> String {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let mut out = normalize_path(path).into_owned();
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Normalize a request path for prefix matching: drop the query and fragment, decode
/// percent-encoded unreserved characters (so `%2e%2e` is `..`), upper-case the hex of
/// the others, and resolve `.` and `..` segments (RFC 3986 §5.2.4), so
/// `/allowed/../secret` is `/secret`. An empty path is `/`.
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    let path = match path.find(['?', '#']) {
        Some(i) => &path[..i],
        None => path,
    };
    if path.is_empty() {
        return Cow::Borrowed("/");
    }
    let needs_work = path.contains('%') || path.split('/').any(|s| s == "." || s == "..");
    if !needs_work {
        return Cow::Borrowed(path);
    }
    let decoded = percent_decode_unreserved(path);
    Cow::Owned(remove_dot_segments(&decoded))
}

fn percent_decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            let c = (h << 4 | l) as char;
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~') {
                out.push(c);
            } else {
                out.push('%');
                out.push(b[i + 1].to_ascii_uppercase() as char);
                out.push(b[i + 2].to_ascii_uppercase() as char);
            }
            i += 3;
            continue;
        }
        // Copy up to the next `%` in one piece (keeps multi-byte characters whole: `i`
        // and every `%` are character boundaries; searching the bytes, not a slice of
        // the string at `i + 1`, which can fall inside a character: found by fuzzing).
        let next = b[i + 1..]
            .iter()
            .position(|&c| c == b'%')
            .map_or(b.len(), |j| i + 1 + j);
        out.push_str(&path[i..next]);
        i = next;
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn remove_dot_segments(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    let last = segments.len() - 1;
    let mut trailing_slash = false;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => trailing_slash = i == last,
            ".." => {
                out.pop();
                trailing_slash = i == last;
            }
            "" if i == 0 && absolute => {}
            s => {
                out.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut result = String::with_capacity(path.len());
    if absolute {
        result.push('/');
    }
    result.push_str(&out.join("/"));
    if trailing_slash && !result.ends_with('/') {
        result.push('/');
    }
    result
}

/// Loopback, private (RFC 1918, ULA), link-local, CGNAT, unspecified, broadcast,
/// multicast and reserved addresses, and IPv4-mapped IPv6 forms of them: targets a
/// sandbox must not reach unless configuration says so.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private_v4(v4);
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                // IPv4-compatible ::a.b.c.d and NAT64 64:ff9b::/96 embed an IPv4 target
                || (s[..6] == [0, 0, 0, 0, 0, 0]) && is_private_v4(embedded_v4(v6))
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]) && is_private_v4(embedded_v4(v6))
        }
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Ipv4Addr {
    let o = v6.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

fn is_private_v4(v4: Ipv4Addr) -> bool {
    let [a, b, _, _] = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_multicast()
        || v4.is_broadcast()
        || a == 0 // "this network", includes unspecified
        || (a == 100 && (b & 0xc0) == 64) // CGNAT 100.64.0.0/10
        || a >= 240 // reserved
}

/// Which resolved address may the proxy connect to? The first that is not private
/// (or the first at all, when private targets are allowed). The proxy connects to
/// exactly this address: no second resolution can swap it.
pub fn pick_target(
    addrs: impl IntoIterator<Item = SocketAddr>,
    allow_private: bool,
) -> Result<SocketAddr, Reason> {
    let mut any = false;
    for addr in addrs {
        any = true;
        if allow_private || !is_private(addr.ip()) {
            return Ok(addr);
        }
    }
    Err(if any {
        Reason::PrivateTarget
    } else {
        Reason::ResolveFailed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, methods: &[&str], path: Option<&str>) -> RuleSpec {
        RuleSpec::new(host, methods, path)
    }

    fn http<'a>(method: &'a str, host: &'a str, port: u16, path: &'a str) -> Request<'a> {
        Request {
            host,
            port,
            method,
            path,
            tunnel: false,
        }
    }

    fn connect(host: &str, port: u16) -> Request<'_> {
        Request {
            host,
            port,
            method: "CONNECT",
            path: "",
            tunnel: true,
        }
    }

    use Decision::{Allow, Deny};
    use Reason::*;

    #[test]
    fn rules_that_parse() {
        let ok: &[(&str, RuleSpec)] = &[
            ("an exact host", rule("registry.npmjs.org", &[], None)),
            (
                "an exact host with a port pin",
                rule("example.com:8080", &[], None),
            ),
            ("an IPv4 address", rule("93.184.216.34", &[], None)),
            (
                "an IPv4 address with a port",
                rule("127.0.0.1:3000", &[], None),
            ),
            (
                "a bracketed IPv6 address with a port",
                rule("[::1]:443", &[], None),
            ),
            ("a bare IPv6 address", rule("2001:db8::1", &[], None)),
            (
                "a wildcard sub-domain rule",
                rule("*.githubusercontent.com", &[], None),
            ),
            ("upper-case host is lowered", rule("GitHub.COM", &[], None)),
            ("a trailing dot is dropped", rule("example.com.", &[], None)),
            (
                "known methods",
                rule("a.com", &["GET", "HEAD", "CONNECT", "TRACE"], None),
            ),
            ("a path prefix", rule("a.com", &["GET"], Some("/simple/"))),
        ];
        for (sentence, spec) in ok {
            assert!(
                Grant::parse(std::slice::from_ref(spec)).is_ok(),
                "{sentence} parses"
            );
        }
    }

    #[test]
    fn rules_that_do_not_parse_say_why() {
        let bad: &[(&str, RuleSpec, &str)] = &[
            ("an empty host", rule("", &[], None), "empty"),
            ("a bare star", rule("*", &[], None), "every host"),
            (
                "a star in the middle",
                rule("a.*.com", &[], None),
                "leading `*.`",
            ),
            (
                "a star without a dot",
                rule("*example.com", &[], None),
                "leading `*.`",
            ),
            (
                "a trailing star",
                rule("example.*", &[], None),
                "leading `*.`",
            ),
            (
                "a space in the host",
                rule("exa mple.com", &[], None),
                "character",
            ),
            (
                "a slash in the host",
                rule("example.com/x", &[], None),
                "character",
            ),
            ("an empty label", rule("a..com", &[], None), "empty label"),
            (
                "a rule host past 253 bytes, its port included",
                rule(&format!("{}.com:443", "a".repeat(246)), &[], None),
                "longer than 253",
            ),
            (
                "a port that is not a number",
                rule("a.com:http", &[], None),
                "port",
            ),
            ("port zero", rule("a.com:0", &[], None), "port"),
            ("a port past 65535", rule("a.com:70000", &[], None), "port"),
            (
                "an unclosed bracket",
                rule("[::1", &[], None),
                "without `]`",
            ),
            (
                "a port after `]` without its colon",
                rule("[::1]80", &[], None),
                "followed by",
            ),
            (
                "a lower-case method",
                rule("a.com", &["get"], None),
                "unknown method",
            ),
            (
                "an unknown method",
                rule("a.com", &["BREW"], None),
                "unknown method",
            ),
            (
                "a relative path prefix",
                rule("a.com", &[], Some("api/")),
                "start with `/`",
            ),
            (
                "a path prefix with a query",
                rule("a.com", &[], Some("/a?b")),
                "query",
            ),
            (
                "a wildcard over an IP",
                rule("*.0.0.1", &[], None),
                "IP address",
            ),
            (
                "a short-hand IPv4 address",
                rule("127.1", &[], None),
                "IPv4",
            ),
            (
                "an IPv4 address with leading zeros",
                rule("127.000.0.1", &[], None),
                "IPv4",
            ),
        ];
        for (sentence, spec, needle) in bad {
            let specs = [rule("fine.example", &[], None), spec.clone()];
            let err = Grant::parse(&specs).expect_err(sentence);
            assert_eq!(err.index, 1, "{sentence}: index names the bad rule");
            assert!(
                err.message.contains(needle),
                "{sentence}: {:?} should mention {needle:?}",
                err.message
            );
        }
    }

    #[test]
    fn decisions_read_like_the_spec() {
        let grant = Grant::parse(&[
            rule("registry.npmjs.org", &[], None),                   // 0
            rule("*.githubusercontent.com", &["GET"], None),         // 1
            rule("api.example.com", &["GET", "HEAD"], Some("/v1/")), // 2
            rule("pinned.example.com:8443", &[], None),              // 3
            rule("files.example.com", &[], Some("/allowed/")),       // 4
            rule("127.0.0.1", &[], None),                            // 5
            rule("api.example.com", &["POST"], Some("/v1/upload")),  // 6
            rule("tunnel.example.com", &["CONNECT"], None),          // 7
            rule("[::1]:8080", &[], None),                           // 8
        ])
        .unwrap();
        let g = Some(&grant);
        let rows: &[(&str, Option<&Grant>, Request<'_>, Decision)] = &[
            (
                "with no fence open nothing is admitted",
                None,
                http("GET", "registry.npmjs.org", 80, "/"),
                Deny(NoGrant),
            ),
            (
                "an exact host rule admits its host on any method and path",
                g,
                http("DELETE", "registry.npmjs.org", 80, "/x"),
                Allow { rule: 0 },
            ),
            (
                "host matching ignores case",
                g,
                http("GET", "Registry.NPMJS.org", 80, "/"),
                Allow { rule: 0 },
            ),
            (
                "a trailing dot on the request host still matches",
                g,
                http("GET", "registry.npmjs.org.", 80, "/"),
                Allow { rule: 0 },
            ),
            (
                "an exact host rule does not admit a sub-domain",
                g,
                http("GET", "evil.registry.npmjs.org", 80, "/"),
                Deny(NoRule),
            ),
            (
                "an exact host rule does not admit a look-alike suffix",
                g,
                http("GET", "registry.npmjs.org.evil.com", 80, "/"),
                Deny(NoRule),
            ),
            (
                "a host no rule names is denied",
                g,
                http("GET", "example.org", 80, "/"),
                Deny(NoRule),
            ),
            (
                "a wildcard admits a sub-domain",
                g,
                http("GET", "raw.githubusercontent.com", 80, "/"),
                Allow { rule: 1 },
            ),
            (
                "a wildcard admits a deep sub-domain",
                g,
                http("GET", "a.b.githubusercontent.com", 80, "/"),
                Allow { rule: 1 },
            ),
            (
                "a wildcard does not admit the apex",
                g,
                http("GET", "githubusercontent.com", 80, "/"),
                Deny(NoRule),
            ),
            (
                "a wildcard does not admit a name that merely ends the same",
                g,
                http("GET", "evilgithubusercontent.com", 80, "/"),
                Deny(NoRule),
            ),
            (
                "host matched but method did not: method",
                g,
                http("POST", "raw.githubusercontent.com", 80, "/"),
                Deny(Method),
            ),
            (
                "host and method matched but path did not: path",
                g,
                http("GET", "api.example.com", 80, "/v2/x"),
                Deny(Path),
            ),
            (
                "host, method and path match",
                g,
                http("GET", "api.example.com", 80, "/v1/users"),
                Allow { rule: 2 },
            ),
            (
                "a later rule can admit what an earlier one refused",
                g,
                http("POST", "api.example.com", 80, "/v1/upload/a"),
                Allow { rule: 6 },
            ),
            (
                "the most specific reason wins across rules",
                g,
                http("POST", "api.example.com", 80, "/v2/"),
                Deny(Path),
            ),
            (
                "the query is ignored for the prefix",
                g,
                http("GET", "api.example.com", 80, "/v1/?x=/../../admin"),
                Allow { rule: 2 },
            ),
            (
                "dot-dot cannot climb out of the prefix",
                g,
                http("GET", "files.example.com", 80, "/allowed/../secret"),
                Deny(Path),
            ),
            (
                "percent-encoded dot-dot cannot climb out",
                g,
                http("GET", "files.example.com", 80, "/allowed/%2e%2E/secret"),
                Deny(Path),
            ),
            (
                "dot-dot that stays inside the prefix is fine",
                g,
                http("GET", "files.example.com", 80, "/allowed/a/../b"),
                Allow { rule: 4 },
            ),
            (
                "encoded unreserved characters are decoded",
                g,
                http("GET", "files.example.com", 80, "/%61llowed/x"),
                Allow { rule: 4 },
            ),
            (
                "the prefix needs its trailing slash",
                g,
                http("GET", "files.example.com", 80, "/allowed"),
                Deny(Path),
            ),
            (
                "a port pin admits its port",
                g,
                http("GET", "pinned.example.com", 8443, "/"),
                Allow { rule: 3 },
            ),
            (
                "a port pin refuses another port",
                g,
                http("GET", "pinned.example.com", 443, "/"),
                Deny(NoRule),
            ),
            (
                "an IP rule admits the IP",
                g,
                http("GET", "127.0.0.1", 9999, "/"),
                Allow { rule: 5 },
            ),
            (
                "an IP rule admits its IPv4-mapped form",
                g,
                http("GET", "[::ffff:127.0.0.1]", 9999, "/"),
                Allow { rule: 5 },
            ),
            (
                "a bracketed IPv6 rule admits its address",
                g,
                http("GET", "[::1]", 8080, "/"),
                Allow { rule: 8 },
            ),
            (
                "a CONNECT to a host-only rule's host is a tunnel",
                g,
                connect("registry.npmjs.org", 443),
                Allow { rule: 0 },
            ),
            (
                "a CONNECT to a host with only method rules needs interception",
                g,
                connect("raw.githubusercontent.com", 443),
                Deny(NeedsInterception),
            ),
            (
                "a CONNECT to a host with only path rules needs interception",
                g,
                connect("files.example.com", 443),
                Deny(NeedsInterception),
            ),
            (
                "a rule naming CONNECT admits the tunnel",
                g,
                connect("tunnel.example.com", 443),
                Allow { rule: 7 },
            ),
            (
                "a CONNECT to an unnamed host has no rule",
                g,
                connect("example.org", 443),
                Deny(NoRule),
            ),
            (
                "a CONNECT to a pinned host on another port has no rule",
                g,
                connect("pinned.example.com", 443),
                Deny(NoRule),
            ),
            (
                "the deny-all grant admits nothing",
                Some(&Grant::deny_all()),
                http("GET", "registry.npmjs.org", 80, "/"),
                Deny(NoRule),
            ),
        ];
        for (sentence, grant, req, want) in rows {
            assert_eq!(decide(*grant, req), *want, "{sentence}");
        }
    }

    #[test]
    fn paths_normalize_before_matching() {
        let rows: &[(&str, &str, &str)] = &[
            ("a plain path is unchanged", "/a/b", "/a/b"),
            ("an empty path is the root", "", "/"),
            ("the query is dropped", "/a?b=1", "/a"),
            ("the fragment is dropped", "/a#frag", "/a"),
            ("dot segments are removed", "/a/./b/../c", "/a/c"),
            ("dot-dot cannot go above the root", "/../../etc", "/etc"),
            (
                "a final dot-dot keeps the directory slash",
                "/a/b/..",
                "/a/",
            ),
            (
                "encoded dots are decoded then resolved",
                "/a/%2E%2e/b",
                "/b",
            ),
            ("encoded tilde is decoded", "/%7Euser", "/~user"),
            (
                "an encoded slash stays encoded, upper-cased",
                "/a%2fb",
                "/a%2Fb",
            ),
            ("a broken escape is kept", "/a%zz", "/a%zz"),
            ("a trailing percent is kept", "/a%", "/a%"),
            ("non-ASCII is kept whole", "/é%41", "/éA"),
        ];
        for (sentence, input, want) in rows {
            assert_eq!(normalize_path(input), *want, "{sentence}");
        }
    }

    #[test]
    fn private_addresses_are_recognized() {
        let rows: &[(&str, &str, bool)] = &[
            ("IPv4 loopback", "127.0.0.1", true),
            ("anything in 127/8", "127.5.6.7", true),
            ("RFC1918 10/8", "10.1.2.3", true),
            ("RFC1918 172.16/12", "172.31.255.255", true),
            ("just outside 172.16/12", "172.32.0.1", false),
            ("RFC1918 192.168/16", "192.168.0.1", true),
            ("link-local (cloud metadata)", "169.254.169.254", true),
            ("CGNAT", "100.64.0.1", true),
            ("just outside CGNAT", "100.128.0.1", false),
            ("unspecified", "0.0.0.0", true),
            ("multicast", "224.0.0.1", true),
            ("broadcast", "255.255.255.255", true),
            ("a public IPv4", "93.184.216.34", false),
            ("IPv6 loopback", "::1", true),
            ("IPv6 unspecified", "::", true),
            ("ULA", "fd00::1", true),
            ("IPv6 link-local", "fe80::1", true),
            ("IPv6 multicast", "ff02::1", true),
            ("IPv4-mapped loopback", "::ffff:127.0.0.1", true),
            ("IPv4-mapped private", "::ffff:10.0.0.1", true),
            ("IPv4-mapped public", "::ffff:93.184.216.34", false),
            ("NAT64 of loopback", "64:ff9b::7f00:1", true),
            ("a public IPv6", "2606:4700::1111", false),
        ];
        for (sentence, ip, want) in rows {
            assert_eq!(is_private(ip.parse().unwrap()), *want, "{sentence}");
        }
    }

    #[test]
    fn the_target_is_the_first_address_that_may_be_reached() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        type Row = (
            &'static str,
            Vec<SocketAddr>,
            bool,
            Result<SocketAddr, Reason>,
        );
        let rows: &[Row] = &[
            (
                "nothing resolved: resolve-failed",
                vec![],
                false,
                Err(ResolveFailed),
            ),
            (
                "only loopback: private-target",
                vec![a("127.0.0.1:80")],
                false,
                Err(PrivateTarget),
            ),
            (
                "loopback when allowed is fine",
                vec![a("127.0.0.1:80")],
                true,
                Ok(a("127.0.0.1:80")),
            ),
            (
                "a public address after a private one is picked",
                vec![a("10.0.0.1:80"), a("93.184.216.34:80")],
                false,
                Ok(a("93.184.216.34:80")),
            ),
            (
                "a public address is picked",
                vec![a("93.184.216.34:80")],
                false,
                Ok(a("93.184.216.34:80")),
            ),
        ];
        for (sentence, addrs, allow, want) in rows {
            assert_eq!(
                pick_target(addrs.iter().copied(), *allow),
                *want,
                "{sentence}"
            );
        }
    }

    #[test]
    fn under_a_path_rule_encoded_separators_and_parameters_are_refused() {
        let g =
            Grant::parse(&[RuleSpec::new("files.example", &["GET"], Some("/allowed/"))]).unwrap();
        let req = |path: &'static str| Request {
            host: "files.example",
            port: 80,
            method: "GET",
            path,
            tunnel: false,
        };
        let rows = [
            ("/allowed/file.txt", Decision::Allow { rule: 0 }),
            (
                "/allowed/..%2Fsecret.txt",
                Decision::Deny(Reason::AmbiguousPath),
            ),
            (
                "/allowed/%2e%2e%2fsecret.txt",
                Decision::Deny(Reason::AmbiguousPath),
            ),
            (
                "/allowed/x/..%2F..%2Fsecret.txt",
                Decision::Deny(Reason::AmbiguousPath),
            ),
            (
                "/allowed/..%5csecret",
                Decision::Deny(Reason::AmbiguousPath),
            ),
            ("/allowed/..;/secret", Decision::Deny(Reason::AmbiguousPath)),
            ("/allowed/%2e%2e/secret", Decision::Deny(Reason::Path)),
            ("/allowed/file?x=%2F", Decision::Allow { rule: 0 }),
        ];
        for (path, want) in rows {
            assert_eq!(decide(Some(&g), &req(path)), want, "{path}");
        }
    }

    #[test]
    fn the_forwarded_target_is_the_path_decided_on() {
        assert_eq!(forward_target("/a/b/../c?x=1"), "/a/c?x=1");
        assert_eq!(forward_target("/a/%2e%2e/b"), "/b");
        assert_eq!(forward_target("/%7euser/"), "/~user/");
        assert_eq!(forward_target(""), "/");
        assert_eq!(forward_target("/plain"), "/plain");
    }

    fn with_headers(
        host: &str,
        methods: &[&str],
        path: Option<&str>,
        headers: &[(&str, &str)],
    ) -> RuleSpec {
        RuleSpec {
            headers: headers
                .iter()
                .map(|(h, s)| ((*h).to_owned(), (*s).to_owned()))
                .collect(),
            ..RuleSpec::new(host, methods, path)
        }
    }

    fn pinned(host: &str) -> RuleSpec {
        RuleSpec {
            intercept: false,
            ..RuleSpec::new(host, &[], None)
        }
    }

    #[test]
    fn a_tunnel_is_blind_intercepted_or_refused() {
        let g = Grant::parse(&[
            rule("blind.example", &[], None),
            rule("api.example", &["GET"], Some("/v1/")),
            with_headers(
                "cred.example",
                &["GET"],
                None,
                &[("Authorization", "token")],
            ),
            rule("both.example", &[], None),
            rule("both.example", &["POST"], None),
            pinned("pinned.example"),
            rule("pinned.example", &["GET"], None),
            rule("*.wild.example", &[], Some("/x")),
        ])
        .unwrap();
        use Tunnel::*;
        let cases: &[(&str, &str, bool, Tunnel)] = &[
            (
                "a host-only rule stays blind with interception on",
                "blind.example",
                true,
                Blind { rule: 0 },
            ),
            (
                "a host-only rule stays blind with interception off",
                "blind.example",
                false,
                Blind { rule: 0 },
            ),
            (
                "a method/path rule is intercepted",
                "api.example",
                true,
                Intercept { rule: 1 },
            ),
            (
                "a method/path rule without interception is refused",
                "api.example",
                false,
                Deny(Reason::NeedsInterception),
            ),
            (
                "a rule with headers is intercepted",
                "cred.example",
                true,
                Intercept { rule: 2 },
            ),
            (
                "a rule with headers is never tunnelled blind",
                "cred.example",
                false,
                Deny(Reason::NeedsInterception),
            ),
            (
                "a host with a host-only and a method rule is intercepted",
                "both.example",
                true,
                Intercept { rule: 4 },
            ),
            (
                "... and blind without interception",
                "both.example",
                false,
                Blind { rule: 3 },
            ),
            (
                "a pinned rule wins over a method rule",
                "pinned.example",
                true,
                Blind { rule: 5 },
            ),
            (
                "a wildcard path rule is intercepted",
                "a.wild.example",
                true,
                Intercept { rule: 7 },
            ),
            (
                "an unnamed host has no rule",
                "other.example",
                true,
                Deny(Reason::NoRule),
            ),
        ];
        for (what, host, can, want) in cases {
            assert_eq!(decide_tunnel(Some(&g), host, 443, *can), *want, "{what}");
        }
        assert_eq!(
            decide_tunnel(None, "blind.example", 443, true),
            Deny(Reason::NoGrant)
        );
    }

    #[test]
    fn headers_come_from_every_rule_that_admits_the_request() {
        let g = Grant::parse(&[
            rule("api.example", &[], Some("/public/")),
            with_headers(
                "api.example",
                &["GET"],
                Some("/v1/"),
                &[("Authorization", "read-token")],
            ),
            with_headers(
                "api.example",
                &["GET", "POST"],
                None,
                &[("authorization", "write-token"), ("X-Team", "team")],
            ),
            with_headers(
                "other.example",
                &["GET"],
                None,
                &[("Authorization", "other")],
            ),
        ])
        .unwrap();
        type Case<'a> = (&'a str, Request<'a>, &'a [(&'a str, &'a str)]);
        let cases: &[Case<'_>] = &[
            (
                "the first rule naming a header wins",
                http("GET", "api.example", 443, "/v1/x"),
                &[("authorization", "read-token"), ("x-team", "team")],
            ),
            (
                "a rule that does not admit adds nothing",
                http("POST", "api.example", 443, "/v1/x"),
                &[("authorization", "write-token"), ("x-team", "team")],
            ),
            (
                "a path outside every header rule's prefix still gets the host-wide rule's",
                http("GET", "api.example", 443, "/public/a"),
                &[("authorization", "write-token"), ("x-team", "team")],
            ),
            (
                "another host gets its own",
                http("GET", "other.example", 443, "/"),
                &[("authorization", "other")],
            ),
            (
                "an unnamed host gets nothing",
                http("GET", "third.example", 443, "/"),
                &[],
            ),
        ];
        for (what, req, want) in cases {
            assert_eq!(g.headers_for(req), want.to_vec(), "{what}");
        }
        assert_eq!(
            g.secret_names(),
            vec!["other", "read-token", "team", "write-token"]
        );
    }

    #[test]
    fn a_credential_rule_lists_standard_methods_that_do_not_echo_the_request() {
        let cred = |methods: &[&str]| {
            Grant::parse(&[with_headers(
                "api.example",
                methods,
                None,
                &[("X-Api-Key", "s")],
            )])
        };
        let rows: &[(&str, &[&str], bool)] = &[
            ("a rule with headers and no methods is refused", &[], false),
            ("GET and POST are fine", &["GET", "POST"], true),
            (
                "every standard method is fine",
                &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                true,
            ),
            ("TRACE echoes the header back: refused", &["TRACE"], false),
            ("TRACE beside GET is refused too", &["GET", "TRACE"], false),
            ("TRACK echoes it too: refused", &["TRACK"], false),
            ("CONNECT carries no header: refused", &["CONNECT"], false),
            ("an extension method: refused", &["PROPFIND"], false),
        ];
        for (sentence, methods, ok) in rows {
            assert_eq!(cred(methods).is_ok(), *ok, "{sentence}");
        }
        let e = cred(&[]).unwrap_err();
        assert!(e.message.contains("must list its methods"), "{e}");
        let e = cred(&["GET", "TRACE"]).unwrap_err();
        assert!(e.message.contains("\"TRACE\""), "{e}");
        // A rule without headers keeps "no methods = any method".
        assert!(Grant::parse(&[rule("api.example", &[], None)]).is_ok());
    }

    #[test]
    fn a_credential_rule_without_a_port_means_443() {
        let g = Grant::parse(&[
            with_headers("cred.example", &["GET"], None, &[("X-Api-Key", "s")]),
            with_headers("pinned.example:8443", &["GET"], None, &[("X-Api-Key", "s")]),
            rule("plain.example", &["GET"], None),
        ])
        .unwrap();
        let rows: &[(&str, Request<'_>, Decision)] = &[
            (
                "a credential rule without a port admits 443",
                http("GET", "cred.example", 443, "/"),
                Decision::Allow { rule: 0 },
            ),
            (
                "... and no other port",
                http("GET", "cred.example", 8443, "/"),
                Decision::Deny(Reason::NoRule),
            ),
            (
                "... not even plain HTTP's",
                http("GET", "cred.example", 80, "/"),
                Decision::Deny(Reason::NoRule),
            ),
            (
                "a credential rule with a port admits that port",
                http("GET", "pinned.example", 8443, "/"),
                Decision::Allow { rule: 1 },
            ),
            (
                "... and not 443",
                http("GET", "pinned.example", 443, "/"),
                Decision::Deny(Reason::NoRule),
            ),
            (
                "a rule without headers and without a port admits any port",
                http("GET", "plain.example", 8443, "/"),
                Decision::Allow { rule: 2 },
            ),
        ];
        for (sentence, req, want) in rows {
            assert_eq!(decide(Some(&g), req), *want, "{sentence}");
        }
        assert!(
            g.headers_for(&http("GET", "cred.example", 8443, "/"))
                .is_empty()
        );
        assert_eq!(
            decide_tunnel(Some(&g), "cred.example", 8443, true),
            Tunnel::Deny(Reason::NoRule)
        );
    }

    #[test]
    fn no_credential_goes_on_trace_track_connect_or_an_unknown_method() {
        // A grant built past the parse (its rule admits every method): headers_for
        // still adds nothing where the answer can echo it or the method is unknown.
        let g = Grant {
            rules: vec![Rule {
                host: HostPattern::Name("api.example".into()),
                port: None,
                methods: 0,
                path_prefix: None,
                headers: vec![("x-api-key".into(), "s".into())],
                intercept: true,
            }],
        };
        let rows: &[(&str, &str, bool)] = &[
            ("GET carries it", "GET", true),
            ("POST carries it", "POST", true),
            ("TRACE echoes the request: none", "TRACE", false),
            ("TRACK echoes the request: none", "TRACK", false),
            ("CONNECT opens a tunnel: none", "CONNECT", false),
            ("an extension method: none", "PROPFIND", false),
            ("a lower-case method is not GET: none", "get", false),
        ];
        for (sentence, method, carries) in rows {
            let got = g.headers_for(&http(method, "api.example", 443, "/"));
            assert_eq!(!got.is_empty(), *carries, "{sentence}");
        }
        let tunnel = Request {
            tunnel: true,
            ..http("GET", "api.example", 443, "")
        };
        assert!(g.headers_for(&tunnel).is_empty(), "a tunnel carries none");
    }

    #[test]
    fn credential_headers_and_opt_outs_are_checked_at_parse() {
        let bad: &[(&str, RuleSpec, &str)] = &[
            (
                "a reserved header",
                with_headers("a.example", &["GET"], None, &[("Host", "s")]),
                "may not be set",
            ),
            (
                "a proxy header",
                with_headers("a.example", &["GET"], None, &[("Proxy-Authorization", "s")]),
                "may not be set",
            ),
            (
                "the proxy's own header",
                with_headers("a.example", &["GET"], None, &[("X-Stockade-Denial", "s")]),
                "may not be set",
            ),
            (
                "a header that is not a token",
                with_headers("a.example", &["GET"], None, &[("Bad Header", "s")]),
                "not an HTTP token",
            ),
            (
                "a header named twice",
                with_headers("a.example", &["GET"], None, &[("A", "s"), ("a", "t")]),
                "named twice",
            ),
            (
                "a secret outside the grammar",
                with_headers("a.example", &["GET"], None, &[("A", "Bad/Name")]),
                "secret name",
            ),
            (
                "an empty secret",
                with_headers("a.example", &["GET"], None, &[("A", "")]),
                "secret name",
            ),
            (
                "a pinned rule with a method",
                RuleSpec {
                    intercept: false,
                    ..rule("a.example", &["GET"], None)
                },
                "intercept = false",
            ),
            (
                "a pinned rule with a path",
                RuleSpec {
                    intercept: false,
                    ..rule("a.example", &[], Some("/x"))
                },
                "intercept = false",
            ),
            (
                "a pinned rule with headers",
                RuleSpec {
                    intercept: false,
                    ..with_headers("a.example", &[], None, &[("A", "s")])
                },
                "intercept = false",
            ),
        ];
        for (what, spec, want) in bad {
            let e = Grant::parse(std::slice::from_ref(spec)).expect_err(what);
            assert!(e.message.contains(want), "{what}: {}", e.message);
        }
        let many: Vec<(&str, &str)> = (0..=MAX_RULE_HEADERS).map(|_| ("a", "s")).collect();
        assert!(Grant::parse(&[with_headers("a.example", &["GET"], None, &many)]).is_err());
        assert!(Grant::parse(&[pinned("a.example")]).is_ok());
        assert!(secret_name(&"a".repeat(MAX_SECRET_NAME)).is_ok());
        assert!(secret_name(&"a".repeat(MAX_SECRET_NAME + 1)).is_err());
        assert!(secret_name("-a").is_err());
    }
}

/// Fuzzing (issue 12): the grammar and the decision over arbitrary input. No panic; a
/// rule that parses decides; an admitted path, forwarded as the proxy forwards it, stays
/// under the rule's prefix and carries no encoded separator. `PROPTEST_CASES=100000`
/// is the long run.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9*.:\\[\\]-]{0,40}",
            "\\PC{0,30}",
            Just("*.example.com".to_string()),
            Just("127.0.0.1:8080".to_string()),
            Just("[::1]:443".to_string()),
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        prop_oneof![
            "(/[a-zA-Z0-9._~%;\\\\-]{0,8}){0,6}(\\?[a-z=&%]{0,10})?",
            "\\PC{0,40}",
            Just("/allowed/..%2Fsecret".to_string()),
            Just("/allowed/%2e%2e/x".to_string()),
        ]
    }

    proptest! {
        #[test]
        fn parsing_and_deciding_never_panic(
            h in host(),
            methods in proptest::collection::vec("[A-Za-z]{0,8}", 0..3),
            prefix in proptest::option::of(path()),
            req_host in host(),
            port in any::<u16>(),
            method in "[A-Z]{1,8}",
            req_path in path(),
            tunnel in any::<bool>(),
        ) {
            let spec = RuleSpec { host: h, methods, path_prefix: prefix, headers: vec![], intercept: true };
            if let Ok(g) = Grant::parse(std::slice::from_ref(&spec)) {
                let req = Request { host: &req_host, port, method: &method, path: &req_path, tunnel };
                let _ = decide(Some(&g), &req);
            }
            let _ = normalize_path(&req_path);
            let _ = forward_target(&req_path);
            let _ = ambiguous_path(&req_path);
        }

        #[test]
        fn an_admitted_path_is_forwarded_inside_its_prefix(
            prefix in "(/[a-z]{1,6}){1,3}/?",
            req_path in path(),
        ) {
            let g = Grant::parse(&[RuleSpec::new("files.example", &[], Some(&prefix))]).unwrap();
            let req = Request { host: "files.example", port: 80, method: "GET", path: &req_path, tunnel: false };
            if decide(Some(&g), &req) == (Decision::Allow { rule: 0 }) {
                let sent = forward_target(&req_path);
                let sent_path = sent.split('?').next().unwrap_or("");
                let p = normalize_path(&prefix);
                prop_assert!(prefix_matches(&p, sent_path), "{req_path:?} admitted, forwarded as {sent:?}, outside {prefix:?}");
                prop_assert!(!ambiguous_path(sent_path), "{sent:?} carries an encoded separator");
                let again = normalize_path(sent_path).into_owned();
                prop_assert_eq!(again.as_str(), sent_path, "forwarded paths are normal");
            }
        }
    }
}
