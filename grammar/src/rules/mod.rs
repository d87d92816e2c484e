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

#[cfg(test)]
mod fuzz;
#[cfg(feature = "serde")]
mod json;
mod parse;
#[cfg(test)]
mod tests;

pub use parse::{
    InvalidRule, MAX_RULE_HEADERS, MAX_SECRET_NAME, RuleError, credential_header, secret_name,
};
pub(crate) use parse::{parse_host, parse_rule, path_prefix};

/// A rule as a consumer writes it: the one type of a rule from the API (whose JSON it is,
/// with the `serde` feature: `rules/json.rs`) through the guest (as the WIT `rule`, the
/// component's contract) and the node protocol to the proxy, which parses it into a
/// [`Grant`].
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
    /// The specs the rules were parsed from, in order: what a remote substrate sends
    /// a node, which parses them again (docs/NODE.md).
    pub(crate) specs: Vec<RuleSpec>,
    /// `ask = true` (docs/EGRESS.md, "Egress that can ask"): a request these rules refuse
    /// for want of a rule ([`Reason::askable`]) is held for the approver instead of
    /// denied at once.
    pub(crate) ask: bool,
}

impl Grant {
    /// Parse rule specs; the first rule that does not parse is the error.
    pub fn parse(specs: &[RuleSpec]) -> Result<Grant, RuleError> {
        let rules = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| parse_rule(spec).map_err(|error| RuleError { index, error }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Grant {
            rules,
            specs: specs.to_vec(),
            ask: false,
        })
    }

    /// This grant with `ask` set: what its rules refuse for want of a rule is asked of
    /// the approver.
    pub fn with_ask(mut self, ask: bool) -> Grant {
        self.ask = ask;
        self
    }

    /// Does this grant ask the approver about what its rules refuse?
    pub fn ask(&self) -> bool {
        self.ask
    }

    /// The specs this grant was parsed from (`Grant::parse(g.specs())` is `g` again).
    pub fn specs(&self) -> &[RuleSpec] {
        &self.specs
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
    /// An `ask` grant held the request and the approver refused it.
    RefusedByApprover,
    /// An `ask` grant held the request and no approver answered in time.
    AskTimeout,
    /// An `ask` grant would have held the request, but as many are already pending as
    /// the server allows (for the container, or in all): refused at once.
    AskFull,
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
            Reason::RefusedByApprover => "refused-by-approver",
            Reason::AskTimeout => "ask-timeout",
            Reason::AskFull => "ask-full",
        }
    }

    /// May an `ask` grant hold a request refused for this reason (pure)? Only the
    /// refusals for want of a rule: `no-rule`, `method`, `path`. Never one where a
    /// rule's answer is already a safety decision (`ambiguous-path`, `private-target`,
    /// `needs-interception`), never `detached` (a detached process holds no grant,
    /// ever) and never `no-grant` (no fence, nobody to widen).
    pub fn askable(self) -> bool {
        matches!(self, Reason::NoRule | Reason::Method | Reason::Path)
    }

    /// How far a request got before it failed: the most specific reason wins.
    fn specificity(self) -> u8 {
        match self {
            Reason::NoGrant | Reason::NoRule => 0,
            Reason::Method => 1,
            Reason::Path | Reason::AmbiguousPath => 2,
            Reason::NeedsInterception => 3,
            Reason::PrivateTarget | Reason::ResolveFailed | Reason::Detached => 4,
            Reason::RefusedByApprover | Reason::AskTimeout | Reason::AskFull => 5,
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

/// What an approver's "approve" adds to the fence that held `req` (pure):
/// the narrowest rule the grammar can state that admits it — its exact host and port
/// (never a `*.` suffix, never any port), its one method, and its normalized path as
/// the prefix (so the same path, and what lies below it on a segment boundary, passes
/// again without asking; a query is never part of a rule). No headers, interceptable.
/// `None` when no such rule parses (an extension method, a tunnel, a path the grammar
/// refuses): then the request is not askable and is denied as it was.
pub fn widening(req: &Request<'_>) -> Option<RuleSpec> {
    if req.tunnel || method_bit(req.method) == 0 || req.method == "CONNECT" {
        return None;
    }
    let host = normalize_host(req.host);
    let host = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{}", req.port),
        _ => format!("{}:{}", host.to_ascii_lowercase(), req.port),
    };
    let path = req
        .path
        .find(['?', '#'])
        .map_or(req.path, |i| &req.path[..i]);
    let path = if path.is_empty() { "/" } else { path };
    let spec = RuleSpec::new(&host, &[req.method], Some(&normalize_path(path)));
    parse_rule(&spec).ok().map(|_| spec)
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
