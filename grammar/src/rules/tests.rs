//! The rule grammar and the decision, as tables whose rows read like docs/DESIGN.md §5.

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
        let message = err.error.to_string();
        assert!(
            message.contains(needle),
            "{sentence}: {message:?} should mention {needle:?}"
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
    let g = Grant::parse(&[RuleSpec::new("files.example", &["GET"], Some("/allowed/"))]).unwrap();
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
    assert_eq!(e.error, InvalidRule::CredentialAnyMethod, "{e}");
    assert!(e.to_string().contains("must list its methods"), "{e}");
    let e = cred(&["GET", "TRACE"]).unwrap_err();
    assert_eq!(
        e.error,
        InvalidRule::CredentialMethod("TRACE".into()),
        "{e}"
    );
    assert!(e.to_string().contains("\"TRACE\""), "{e}");
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
        specs: Vec::new(),
        ask: false,
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
        assert!(e.error.to_string().contains(want), "{what}: {e}");
    }
    let many: Vec<(&str, &str)> = (0..=MAX_RULE_HEADERS).map(|_| ("a", "s")).collect();
    assert!(Grant::parse(&[with_headers("a.example", &["GET"], None, &many)]).is_err());
    assert!(Grant::parse(&[pinned("a.example")]).is_ok());
    assert!(secret_name(&"a".repeat(MAX_SECRET_NAME)).is_ok());
    assert!(secret_name(&"a".repeat(MAX_SECRET_NAME + 1)).is_err());
    assert!(secret_name("-a").is_err());
}

#[test]
fn each_rule_refusal_is_typed_and_reads_as_the_consumer_always_read_it() {
    let refused = |spec: RuleSpec| Grant::parse(&[spec]).unwrap_err().error;
    let host = |h: &str| refused(rule(h, &[], None));
    let long = "a".repeat(254);
    let too_long = format!("host {long:?} is longer than 253 characters");
    let rows: Vec<(InvalidRule, &str)> = vec![
        (host(""), "host is empty"),
        (
            host("*"),
            "host `*` would admit every host; name the hosts (or `*.suffix`)",
        ),
        (host(&long), &too_long),
        (host("[::1"), "host \"[::1\": `[` without `]`"),
        (host("[zz]"), "host \"[zz]\": \"zz\" is not an IPv6 address"),
        (
            host("[::1]x"),
            "host \"[::1]x\": `]` must be followed by `:port` or nothing",
        ),
        (
            host("::g"),
            "host \"::g\" is not a valid IPv6 address (write `[addr]:port` to pin a port)",
        ),
        (
            host("a.com:0"),
            "host \"a.com:0\": port \"0\" is not a port (1-65535)",
        ),
        (
            host("a*.com"),
            "host \"a*.com\": a wildcard is only allowed as a leading `*.` (as in `*.example.com`)",
        ),
        (host("."), "host \".\" has no name"),
        (host("a b"), "host \"a b\" contains the character ' '"),
        (host("a..com"), "host \"a..com\" has an empty label"),
        (
            host("*.0.0.1"),
            "host \"*.0.0.1\": `*.` does not apply to an IP address",
        ),
        (
            host("127.1"),
            "host \"127.1\" looks like an IPv4 address but is not one (write a.b.c.d)",
        ),
        (
            refused(rule("a.com", &["get"], None)),
            "unknown method \"get\" (expected one of GET HEAD POST PUT PATCH DELETE OPTIONS CONNECT TRACE, upper-case)",
        ),
        (
            refused(rule("a.com", &[], Some("api/"))),
            "path-prefix \"api/\" must start with `/`",
        ),
        (
            refused(rule("a.com", &[], Some("/a?b"))),
            "path-prefix \"/a?b\" must not contain a query or fragment",
        ),
        (
            refused(rule("a.com", &[], Some("/a b"))),
            "path-prefix \"/a b\" contains whitespace or control characters",
        ),
        (
            refused(with_headers("a.com", &["GET"], None, &[("Bad Name", "s")])),
            "header name \"Bad Name\" is not an HTTP token (1-64 characters)",
        ),
        (
            refused(with_headers("a.com", &["GET"], None, &[("Host", "s")])),
            "header \"Host\" may not be set by a rule",
        ),
        (
            refused(with_headers(
                "a.com",
                &["GET"],
                None,
                &[("A", "s"), ("a", "t")],
            )),
            "header \"a\" is named twice",
        ),
        (
            refused(with_headers("a.com", &["GET"], None, &[("A", "-s")])),
            "secret name \"-s\" must be 1-64 characters of [a-z0-9._-], starting with a letter or digit",
        ),
        (
            refused(pinned_with(rule("a.com", &["GET"], None))),
            "a rule with intercept = false checks the host only: it may not restrict method or path nor carry headers",
        ),
        (
            refused(with_headers("a.com", &[], None, &[("A", "s")])),
            "a rule with headers must list its methods (a credential is never added to every method)",
        ),
        (
            refused(with_headers("a.com", &["TRACE"], None, &[("A", "s")])),
            "a rule with headers may not admit \"TRACE\" (credentials go only on GET HEAD POST PUT PATCH DELETE OPTIONS)",
        ),
    ];
    for (error, text) in rows {
        assert_eq!(error.to_string(), text, "{error:?}");
    }
    let many: Vec<(&str, &str)> = (0..=MAX_RULE_HEADERS).map(|_| ("a", "s")).collect();
    assert_eq!(
        refused(with_headers("a.com", &["GET"], None, &many)),
        InvalidRule::TooManyHeaders
    );
    assert_eq!(
        InvalidRule::TooManyHeaders.to_string(),
        "more than 16 headers"
    );
    // The index names the rule, in front of the same text.
    let e = Grant::parse(&[rule("a.com", &[], None), rule("", &[], None)]).unwrap_err();
    assert_eq!(e.to_string(), "rule 1: host is empty");
}

fn pinned_with(spec: RuleSpec) -> RuleSpec {
    RuleSpec {
        intercept: false,
        ..spec
    }
}

#[test]
fn only_a_refusal_for_want_of_a_rule_may_be_asked() {
    let rows: &[(Reason, bool)] = &[
        (Reason::NoRule, true),
        (Reason::Method, true),
        (Reason::Path, true),
        (Reason::NoGrant, false),
        (Reason::AmbiguousPath, false),
        (Reason::NeedsInterception, false),
        (Reason::PrivateTarget, false),
        (Reason::ResolveFailed, false),
        (Reason::Detached, false),
        (Reason::RefusedByApprover, false),
        (Reason::AskTimeout, false),
        (Reason::AskFull, false),
    ];
    for (reason, askable) in rows {
        assert_eq!(reason.askable(), *askable, "{reason}");
    }
}

#[test]
fn an_approval_widens_by_the_narrowest_rule_that_admits_the_request() {
    /// (host, method, path prefix) of the widening rule.
    type Widened<'a> = Option<(&'a str, &'a str, &'a str)>;
    let rows: &[(&str, Request<'_>, Widened<'_>)] = &[
        (
            "host, port, method, path",
            http("GET", "Api.Example.", 80, "/v1/x?q=1"),
            Some(("api.example:80", "GET", "/v1/x")),
        ),
        (
            "dot segments normalized",
            http("POST", "api.example", 8080, "/a/../b/./c"),
            Some(("api.example:8080", "POST", "/b/c")),
        ),
        (
            "an empty path is the root",
            http("GET", "10.0.0.1", 80, ""),
            Some(("10.0.0.1:80", "GET", "/")),
        ),
        (
            "ipv6 bracketed",
            http("GET", "[2001:db8::1]", 443, "/x"),
            Some(("[2001:db8::1]:443", "GET", "/x")),
        ),
        (
            "an extension method: none",
            http("PROPFIND", "api.example", 80, "/x"),
            None,
        ),
        ("a tunnel: none", connect("api.example", 443), None),
        (
            "a control byte in the path: none",
            http("GET", "api.example", 80, "/a b"),
            None,
        ),
    ];
    for (name, req, want) in rows {
        let got = widening(req);
        match (got, want) {
            (None, None) => {}
            (Some(spec), Some((host, method, path))) => {
                assert_eq!(spec.host, *host, "{name}");
                assert_eq!(spec.methods, vec![method.to_string()], "{name}");
                assert_eq!(spec.path_prefix.as_deref(), Some(*path), "{name}");
                assert!(spec.headers.is_empty() && spec.intercept, "{name}");
                // The widening admits the request it was made for, and not its host's
                // other paths, other methods or other ports.
                let g = Grant::parse(&[spec]).expect(name);
                assert_eq!(decide(Some(&g), req), Decision::Allow { rule: 0 }, "{name}");
                // (The root is every path: approving `GET /` admits the host's GETs.)
                let other = Request {
                    path: "/elsewhere",
                    ..*req
                };
                assert!(
                    *path == "/" || decide(Some(&g), &other) != Decision::Allow { rule: 0 },
                    "{name}"
                );
                let other = Request {
                    method: "DELETE",
                    ..*req
                };
                assert_ne!(
                    decide(Some(&g), &other),
                    Decision::Allow { rule: 0 },
                    "{name}"
                );
                let other = Request {
                    port: req.port + 1,
                    ..*req
                };
                assert_ne!(
                    decide(Some(&g), &other),
                    Decision::Allow { rule: 0 },
                    "{name}"
                );
            }
            (got, want) => panic!("{name}: {got:?} vs {want:?}"),
        }
    }
}
