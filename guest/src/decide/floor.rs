//! The approval floor (docs/DESIGN.md §2; §3, invariant 4): one check for both doors.
//! Starting a floor command detached is not a way around the floor.

use crate::stockade::sandbox::policy::FloorRule;

/// What the floor says about a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a floor command, or approved for this key and this exact argv.
    Admit,
    /// A floor command without a matching approval; the text says which rule.
    NeedsApproval(String),
}

/// Does `rule` mark `argv` as a floor command?
///
/// Element 0 of the pattern is compared with argv[0]'s base name (`/bin/rm` is `rm`);
/// `*` matches any one argument; a trailing `**` matches whatever follows. Without
/// `**` the argv may be longer than the pattern (a pattern is a prefix).
pub fn matches(rule: &FloorRule, argv: &[String]) -> bool {
    let pattern = &rule.pattern;
    if pattern.is_empty() {
        return false;
    }
    for (i, p) in pattern.iter().enumerate() {
        if p == "**" && i == pattern.len() - 1 {
            return true;
        }
        let Some(arg) = argv.get(i) else {
            return false;
        };
        let arg = if i == 0 {
            arg.rsplit('/').next().unwrap_or(arg)
        } else {
            arg.as_str()
        };
        if p != "*" && p != arg {
            return false;
        }
    }
    true
}

/// What the floor needs looked up before it can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Not a floor command: nothing is looked up, so a token it carries is never spent.
    NotFloor,
    /// A floor command carrying this token: look up what it approves.
    Token(&'a str),
    /// A floor command carrying no token: refused without a lookup.
    NoToken,
}

/// Step one of the floor: is the input's approval token looked up at all?
pub fn lookup<'a>(argv: &[String], rules: &[FloorRule], token: Option<&'a str>) -> Lookup<'a> {
    if !rules.iter().any(|r| matches(r, argv)) {
        return Lookup::NotFloor;
    }
    match token {
        Some(t) => Lookup::Token(t),
        None => Lookup::NoToken,
    }
}

/// Which approval the command spends once it is admitted (after `ensure`): the token
/// that admitted a floor command, nothing otherwise. An approval is single use; an
/// over-capacity answer or a wrong argv spends nothing.
pub fn to_spend<'a>(lookup: &Lookup<'a>, verdict: &Verdict) -> Option<&'a str> {
    match (lookup, verdict) {
        (Lookup::Token(t), Verdict::Admit) => Some(t),
        _ => None,
    }
}

/// The floor check, the same function for `exec` and `start-detached`.
///
/// `approved` is the argv an approver recorded for this key under the token the input
/// carries (if it carries one and the token is known). An approval admits exactly
/// that argv, nothing else.
pub fn check(argv: &[String], rules: &[FloorRule], approved: Option<&[String]>) -> Verdict {
    let Some(rule) = rules.iter().find(|r| matches(r, argv)) else {
        return Verdict::Admit;
    };
    match approved {
        Some(a) if a == argv => Verdict::Admit,
        Some(_) => Verdict::NeedsApproval(format!(
            "the approval was recorded for a different command; floor rule {:?}",
            rule.pattern
        )),
        None => Verdict::NeedsApproval(format!(
            "floor rule {:?} needs an approval recorded for this key and command",
            rule.pattern
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    fn rule(p: &[&str]) -> FloorRule {
        FloorRule { pattern: v(p) }
    }

    #[test]
    fn floor_rows() {
        let rules = [
            rule(&["rm", "-rf", "**"]),
            rule(&["git", "push"]),
            rule(&["shutdown"]),
        ];
        let rows: &[(&str, &[&str], Option<&[&str]>, bool)] = &[
            (
                "a command no rule names is admitted",
                &["echo", "hi"],
                None,
                true,
            ),
            (
                "a floor command without approval is refused",
                &["rm", "-rf", "/"],
                None,
                false,
            ),
            (
                "the base name of argv[0] is what a rule names",
                &["/bin/rm", "-rf", "x"],
                None,
                false,
            ),
            (
                "a pattern is a prefix",
                &["git", "push", "origin"],
                None,
                false,
            ),
            ("a shorter argv does not match", &["git"], None, true),
            (
                "an approval for this exact argv admits it",
                &["git", "push"],
                Some(&["git", "push"]),
                true,
            ),
            (
                "an approval for another argv does not",
                &["git", "push", "-f"],
                Some(&["git", "push"]),
                false,
            ),
            (
                "'*' matches one argument",
                &["shutdown", "now"],
                None,
                false,
            ),
        ];
        for (what, argv, approved, admit) in rows {
            let approved = approved.map(v);
            let verdict = check(&v(argv), &rules, approved.as_deref());
            assert_eq!(verdict == Verdict::Admit, *admit, "{what}: {verdict:?}");
        }
    }

    #[test]
    fn a_token_is_looked_up_and_spent_only_for_an_admitted_floor_command() {
        let rules = [rule(&["git", "push"])];
        let rows: &[(
            &str,
            &[&str],
            Option<&str>,
            Lookup<'static>,
            Verdict,
            Option<&str>,
        )] = &[
            (
                "a command that is not a floor command looks nothing up and spends nothing",
                &["echo"],
                Some("t"),
                Lookup::NotFloor,
                Verdict::Admit,
                None,
            ),
            (
                "a floor command without a token looks nothing up",
                &["git", "push"],
                None,
                Lookup::NoToken,
                Verdict::NeedsApproval(String::new()),
                None,
            ),
            (
                "a floor command's token is looked up, and spent when it admits",
                &["git", "push"],
                Some("t"),
                Lookup::Token("t"),
                Verdict::Admit,
                Some("t"),
            ),
            (
                "a token recorded for another argv is not spent",
                &["git", "push"],
                Some("t"),
                Lookup::Token("t"),
                Verdict::NeedsApproval(String::new()),
                None,
            ),
        ];
        for (what, argv, token, want_lookup, verdict, spent) in rows {
            let got = lookup(&v(argv), &rules, *token);
            assert_eq!(&got, want_lookup, "{what}");
            assert_eq!(to_spend(&got, verdict), *spent, "{what}");
        }
    }

    #[test]
    fn star_matches_any_single_argument() {
        let r = rule(&["kubectl", "*", "delete"]);
        assert!(matches(&r, &v(&["kubectl", "-n", "delete"])));
        assert!(!matches(&r, &v(&["kubectl", "-n"])));
        assert!(!matches(&rule(&[]), &v(&["anything"])));
    }
}
