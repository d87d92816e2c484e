//! Fuzzing (docs/INVARIANTS.md, "The failure surface"): the grammar and the decision over
//! arbitrary input. No panic; a rule that parses decides; an admitted path, forwarded as
//! the proxy forwards it, stays under the rule's prefix and carries no encoded separator.
//! `PROPTEST_CASES=100000` is the long run.

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
