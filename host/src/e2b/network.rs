//! A sandbox's network policy (pure): E2B's create fields `allow_internet_access` and
//! `network.{allowOut, denyOut, allowPublicTraffic}` made into the allow rules of the
//! grant every `commands.run` of the sandbox is given (docs/E2B.md, "Network").
//!
//! Stockade's fence is deny-by-default and decides on names (DESIGN §5): a grant is a
//! list of allow rules, each a host (a name, an address, or `*.suffix`). E2B's policy
//! is allow-by-default with address blocks. The mapping:
//!
//! * **"The internet"** is what the operator configured it to be: `[e2b] internet`,
//!   hosts in allowOut's syntax (embedded default: none, so a sandbox reaches nothing
//!   unless it names hosts). It is given unless `allow_internet_access` is `false` or a
//!   denyOut entry covers every address (`0.0.0.0/0`, `::/0`); a narrower denyOut entry
//!   takes out the configured hosts that are addresses inside it (names are decided
//!   by name: an address block says nothing about which name resolves into it).
//! * **allowOut** entries are rules, always (E2B: "allowed entries always take
//!   precedence over denied entries"): a name, `*.name` (sub-domains only, as E2B's
//!   wildcard), an address, or a CIDR block of exactly one address (`/32`, `/128`).
//!   A wider block is refused: Stockade's rules name hosts, and widening a block to
//!   "any host" would grant what was not asked.
//! * What E2B's network has that this does not serve is refused, never ignored, where
//!   ignoring it would grant or expose more than asked (`rules` (E2B's credential
//!   transforms: Stockade brokers credentials its own way, docs/EGRESS.md),
//!   `egressProxy`); `dnsServers`, `maskRequestHost` and `httpsPorts` are accepted and
//!   have no effect (the proxy resolves names itself; no preview is HTTPS inside).
//!
//! The rules are checked by the one grammar ([`Grant::parse`]) at create, so a bad
//! entry is the create's 400; the guest decides them again at every exec, as it
//! decides every grant.

use std::net::IpAddr;

use serde_json::{Map, Value};
use stockade_grammar::rules::{Grant, RuleSpec};

/// At most this many rules in a sandbox's policy.
pub const MAX_RULES: usize = 256;

/// A sandbox's network policy, as created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The hosts its commands' grant admits (each a host-only rule), in order, no
    /// repeats; empty: its commands get no grant.
    pub hosts: Vec<String>,
    /// `allowPublicTraffic`: its preview doors need no traffic token (E2B's default).
    pub public: bool,
}

impl Policy {
    /// The grant a command of this sandbox is given: none when it names no host.
    pub fn rules(&self) -> Vec<RuleSpec> {
        self.hosts
            .iter()
            .map(|h| RuleSpec::new(h, &[], None))
            .collect()
    }

    /// The key's native network (`PUT …/network`) this policy is: its hosts'
    /// rules; none when it names no host (a command then runs in a fence with no rule,
    /// as under a network with none).
    pub fn grant(&self) -> Option<stockade_wire::GrantBody> {
        (!self.hosts.is_empty()).then(|| stockade_wire::GrantBody {
            rules: self.rules(),
            ask: false,
        })
    }

    /// The stored form (`{"hosts": [...], "public": bool}`).
    pub fn to_json(&self) -> String {
        serde_json::json!({"hosts": self.hosts, "public": self.public}).to_string()
    }

    /// Read the stored form; anything unreadable is the policy that grants nothing.
    pub fn from_json(s: &str) -> Policy {
        let v: Value = serde_json::from_str(s).unwrap_or(Value::Null);
        Policy {
            hosts: v["hosts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|h| h.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            public: v["public"].as_bool().unwrap_or(true),
        }
    }
}

/// Check the operator's `[e2b] internet` hosts (pure): each as an allowOut entry.
pub fn check_internet(internet: &[String]) -> Result<(), String> {
    let hosts = internet
        .iter()
        .map(|e| allow_entry(e).map_err(|m| format!("[e2b] internet: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    parse(&hosts).map_err(|m| format!("[e2b] internet: {m}"))
}

/// `PUT /sandboxes/{id}/network`'s body (`update_network`) made a policy: it replaces
/// the sandbox's egress whole (E2B: a field left out is cleared), read as a create's
/// `allow_internet_access` and `network` are ([`policy`]); `allowPublicTraffic` is not
/// the update's, so the sandbox's own (`public`) is kept.
pub fn update(
    body: &Map<String, Value>,
    internet: &[String],
    public: bool,
) -> Result<Policy, String> {
    let mut network = body.clone();
    let mut create = Map::new();
    if let Some(a) = network.remove("allow_internet_access") {
        create.insert("allow_internet_access".into(), a);
    }
    network.remove("allowPublicTraffic");
    create.insert("network".into(), Value::Object(network));
    Ok(Policy {
        public,
        ..policy(&create, internet)?
    })
}

/// The policy of a create (pure): its body's object, and the operator's internet.
pub fn policy(body: &Map<String, Value>, internet: &[String]) -> Result<Policy, String> {
    let internet_on = match body.get("allow_internet_access") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("allow_internet_access: not a boolean".into()),
    };
    let empty = Map::new();
    let net = match body.get("network") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err("network: not an object".into()),
    };
    for refused in ["rules", "egressProxy"] {
        if net.get(refused).is_some_and(|v| !v.is_null()) {
            return Err(format!(
                "network.{refused} is not served by Stockade (docs/E2B.md, \"Network\")"
            ));
        }
    }
    let list = |name: &str| -> Result<Vec<String>, String> {
        match net.get(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("network.{name}: not a list of strings"))
                })
                .collect(),
            Some(_) => Err(format!("network.{name}: not a list of strings")),
        }
    };
    let allow = list("allowOut")?;
    let deny = list("denyOut")?
        .iter()
        .map(|d| cidr(d).ok_or_else(|| format!("network.denyOut {d:?}: not an address or CIDR block (E2B's denyOut takes no names)")))
        .collect::<Result<Vec<_>, _>>()?;
    let public = match net.get("allowPublicTraffic") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("network.allowPublicTraffic: not a boolean".into()),
    };
    if allow.len() > MAX_RULES {
        return Err(format!("network.allowOut: more than {MAX_RULES} entries"));
    }
    let mut hosts: Vec<String> = Vec::new();
    for a in &allow {
        let h = allow_entry(a).map_err(|m| format!("network.allowOut: {m}"))?;
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    let everything = deny.iter().any(|(_, prefix)| *prefix == 0);
    if internet_on && !everything {
        for i in internet {
            let h = allow_entry(i).map_err(|m| format!("[e2b] internet: {m}"))?;
            let denied = h
                .parse::<IpAddr>()
                .is_ok_and(|ip| deny.iter().any(|(net, p)| within(ip, *net, *p)));
            if !denied && !hosts.contains(&h) {
                hosts.push(h);
            }
        }
    }
    if hosts.len() > MAX_RULES {
        return Err(format!("more than {MAX_RULES} hosts in the network policy"));
    }
    parse(&hosts)?;
    Ok(Policy { hosts, public })
}

/// One allowOut entry as a rule's host (pure).
fn allow_entry(e: &str) -> Result<String, String> {
    let e = e.trim();
    if e.is_empty() || e == "*" {
        return Err(format!(
            "{e:?}: name a host (\"*\" is every host, which Stockade's fence never grants)"
        ));
    }
    if e.contains('/') {
        return match cidr(e) {
            Some((ip, p)) if p == full(ip) => Ok(ip.to_string()),
            Some(_) => Err(format!(
                "{e:?}: a block wider than one address is not a Stockade rule: name the hosts"
            )),
            None => Err(format!("{e:?}: not a CIDR block")),
        };
    }
    Ok(e.to_ascii_lowercase())
}

/// The one grammar's check of host-only rules.
fn parse(hosts: &[String]) -> Result<(), String> {
    let specs: Vec<RuleSpec> = hosts.iter().map(|h| RuleSpec::new(h, &[], None)).collect();
    Grant::parse(&specs)
        .map(|_| ())
        .map_err(|e| format!("{:?}: {}", hosts[e.index], e.error))
}

/// An address or CIDR block (pure): the network and its prefix length.
fn cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, p) = match s.trim().split_once('/') {
        Some((ip, p)) => (ip.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
        None => {
            let ip = s.trim().parse::<IpAddr>().ok()?;
            (ip, full(ip))
        }
    };
    (p <= full(ip)).then_some((ip, p))
}

fn full(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// Is `ip` inside `net/prefix` (pure)?
fn within(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn an_update_replaces_the_egress_whole_and_keeps_the_sandboxs_public_traffic() {
        let internet = ["pypi.org".to_string()];
        /// A row: the body, the sandbox's public traffic, the hosts (or a refusal).
        type Row<'a> = (Value, bool, Result<&'a [&'a str], ()>);
        let rows: &[Row] = &[
            // Nothing given: the SDK's update with every field left out clears to the
            // default, the configured internet.
            (json!({}), false, Ok(&["pypi.org"])),
            (json!({"allow_internet_access": false}), true, Ok(&[])),
            (
                json!({"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"]}),
                false,
                Ok(&["a.test"]),
            ),
            (
                json!({"allowOut": ["a.test"]}),
                true,
                Ok(&["a.test", "pypi.org"]),
            ),
            // Not the update's: the sandbox's own stays.
            (
                json!({"allowPublicTraffic": true}),
                false,
                Ok(&["pypi.org"]),
            ),
            (json!({"allowOut": ["0.0.0.0/0"]}), true, Err(())),
            (json!({"rules": {"a.test": []}}), true, Err(())),
            (json!({"egressProxy": {"address": "x:1"}}), true, Err(())),
            (json!({"denyOut": ["a.test"]}), true, Err(())),
            (json!({"allow_internet_access": "yes"}), true, Err(())),
        ];
        for (b, public, want) in rows {
            let got = update(&body(b.clone()), &internet, *public);
            match want {
                Ok(hosts) => {
                    let p = got.unwrap_or_else(|e| panic!("{b}: {e}"));
                    assert_eq!(p.hosts, *hosts, "{b}");
                    assert_eq!(p.public, *public, "{b}");
                }
                Err(()) => assert!(got.is_err(), "{b}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_policy_is_the_internet_as_configured_and_what_allow_out_names() {
        let internet = ["pypi.org".to_string(), "10.1.2.3".to_string()];
        let rows: &[(Value, &[&str], bool)] = &[
            // The SDK's default: the operator's internet.
            (json!({}), &["pypi.org", "10.1.2.3"], true),
            (
                json!({"allow_internet_access": true}),
                &["pypi.org", "10.1.2.3"],
                true,
            ),
            (json!({"allow_internet_access": false}), &[], true),
            // allowOut always; the internet too unless it is off.
            (
                json!({"allow_internet_access": false, "network": {"allowOut": ["API.example.com", "*.pythonhosted.org", "1.2.3.4/32"]}}),
                &["api.example.com", "*.pythonhosted.org", "1.2.3.4"],
                true,
            ),
            (
                json!({"network": {"allowOut": ["pypi.org", "a.test"]}}),
                &["pypi.org", "a.test", "10.1.2.3"],
                true,
            ),
            // denyOut of everything: only allowOut.
            (
                json!({"network": {"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"]}}),
                &["a.test"],
                true,
            ),
            // A narrower block takes out the configured addresses inside it, not names.
            (
                json!({"network": {"denyOut": ["10.0.0.0/8"]}}),
                &["pypi.org"],
                true,
            ),
            (
                json!({"network": {"denyOut": ["10.1.2.4"]}}),
                &["pypi.org", "10.1.2.3"],
                true,
            ),
            (
                json!({"network": {"allowPublicTraffic": false}}),
                &["pypi.org", "10.1.2.3"],
                false,
            ),
            // Accepted, no effect.
            (
                json!({"network": {"dnsServers": ["8.8.8.8"], "maskRequestHost": "x"}}),
                &["pypi.org", "10.1.2.3"],
                true,
            ),
        ];
        for (b, hosts, public) in rows {
            let p = policy(&body(b.clone()), &internet).unwrap_or_else(|e| panic!("{b}: {e}"));
            assert_eq!(p.hosts, *hosts, "{b}");
            assert_eq!(p.public, *public, "{b}");
        }
        // The embedded default: no internet.
        assert!(policy(&body(json!({})), &[]).unwrap().hosts.is_empty());
    }

    #[test]
    fn what_would_grant_more_than_asked_is_refused() {
        for b in [
            json!({"allow_internet_access": "yes"}),
            json!({"network": []}),
            json!({"network": {"allowOut": "a.test"}}),
            json!({"network": {"allowOut": [1]}}),
            json!({"network": {"allowOut": ["*"]}}),
            json!({"network": {"allowOut": [""]}}),
            json!({"network": {"allowOut": ["0.0.0.0/0"]}}),
            json!({"network": {"allowOut": ["10.0.0.0/8"]}}),
            json!({"network": {"allowOut": ["1.2.3.4/33"]}}),
            json!({"network": {"allowOut": ["a b"]}}),
            json!({"network": {"denyOut": ["example.com"]}}),
            json!({"network": {"rules": {"api.example.com": []}}}),
            json!({"network": {"egressProxy": {"address": "x"}}}),
            json!({"network": {"allowPublicTraffic": 1}}),
        ] {
            assert!(policy(&body(b.clone()), &[]).is_err(), "{b}");
        }
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("h{i}.test")).collect();
        assert!(policy(&body(json!({"network": {"allowOut": many}})), &[]).is_err());
    }

    #[test]
    fn the_configured_internet_is_checked_and_a_policy_round_trips() {
        assert!(check_internet(&["pypi.org".into(), "*.example.com".into()]).is_ok());
        assert!(check_internet(&["*".into()]).is_err());
        assert!(check_internet(&["10.0.0.0/8".into()]).is_err());
        let p = Policy {
            hosts: vec!["a.test".into()],
            public: false,
        };
        assert_eq!(Policy::from_json(&p.to_json()), p);
        assert_eq!(p.rules(), vec![RuleSpec::new("a.test", &[], None)]);
        assert_eq!(
            Policy::from_json("junk"),
            Policy {
                hosts: vec![],
                public: true
            }
        );
    }

    #[test]
    fn blocks_contain_their_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(within(ip("10.1.2.3"), ip("10.0.0.0"), 8));
        assert!(!within(ip("11.1.2.3"), ip("10.0.0.0"), 8));
        assert!(within(ip("10.1.2.3"), ip("0.0.0.0"), 0));
        assert!(within(ip("fd00::1"), ip("fd00::"), 8));
        assert!(!within(ip("fd00::1"), ip("10.0.0.0"), 8));
        assert_eq!(cidr("1.2.3.4"), Some((ip("1.2.3.4"), 32)));
        assert_eq!(cidr("::/0"), Some((ip("::"), 0)));
        assert_eq!(cidr("1.2.3.4/40"), None);
    }
}
