//! What a scoped consumer token reaches, decided purely (docs/TENANTS.md): its key
//! pattern, whether two patterns could name one key, the shape of a token, and whether
//! one more container fits its share of the ceiling.

/// The keys one token reaches: one key, or every key that starts with a prefix
/// (`ci-*`). Nothing else: a pattern whose overlap with another is decidable at a
/// glance, so no two live tokens ever reach one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this key.
    Exact(String),
    /// Every key starting with this (non-empty) prefix.
    Prefix(String),
}

impl Pattern {
    /// Parse `ci-*` or `build-7`. The prefix or key must be a key's characters
    /// (`stockade_grammar::names::key`); `*` only last; an empty prefix (`*`, every
    /// key) is the operator's token, never a scoped one.
    pub fn parse(s: &str) -> Result<Pattern, String> {
        let (body, prefix) = match s.strip_suffix('*') {
            Some(p) => (p, true),
            None => (s, false),
        };
        if body.contains('*') {
            return Err(format!(
                "key pattern {s:?}: `*` may only end it (`ci-*`), once"
            ));
        }
        if prefix && body.is_empty() {
            return Err(
                "key pattern \"*\" reaches every key: that is the operator's token; give a prefix (`ci-*`)"
                    .into(),
            );
        }
        // A prefix is checked as a key it could start (`ci-` as `ci-x`): a prefix no
        // key can start would make a token that reaches nothing.
        let probe = if prefix {
            format!("{body}x")
        } else {
            body.to_string()
        };
        stockade_grammar::names::key(&probe).map_err(|e| format!("key pattern {s:?}: {e}"))?;
        Ok(if prefix {
            Pattern::Prefix(body.to_string())
        } else {
            Pattern::Exact(body.to_string())
        })
    }

    /// Does this pattern reach `key`?
    pub fn matches(&self, key: &str) -> bool {
        match self {
            Pattern::Exact(k) => k == key,
            Pattern::Prefix(p) => key.starts_with(p.as_str()),
        }
    }

    /// What a listing of the keys starting with `wanted` reaches under this pattern:
    /// the narrower of the two prefixes, the one key, or nothing.
    pub fn listing(&self, wanted: &str) -> Listing {
        match self {
            Pattern::Exact(k) if k.starts_with(wanted) => Listing::One(k.clone()),
            Pattern::Prefix(p) if wanted.starts_with(p.as_str()) => {
                Listing::Prefix(wanted.to_owned())
            }
            Pattern::Prefix(p) if p.starts_with(wanted) => Listing::Prefix(p.clone()),
            _ => Listing::Nothing,
        }
    }

    /// Could one key match both patterns?
    pub fn overlaps(&self, other: &Pattern) -> bool {
        use Pattern::*;
        match (self, other) {
            (Exact(a), Exact(b)) => a == b,
            (Prefix(p), Exact(k)) | (Exact(k), Prefix(p)) => k.starts_with(p.as_str()),
            (Prefix(p), Prefix(q)) => p.starts_with(q.as_str()) || q.starts_with(p.as_str()),
        }
    }
}

/// What a tenant's listing reaches ([`Pattern::listing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// The known keys starting with this.
    Prefix(String),
    /// This one key, if known.
    One(String),
    /// No key.
    Nothing,
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Exact(k) => f.write_str(k),
            Pattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// Every scoped token starts with this; the operator's never does.
pub const TOKEN_PREFIX: &str = "stk_";

/// The public id's length (hex) and the secret's (hex, 256 bits).
pub const ID_HEX: usize = 16;
/// The secret part's length in hex characters.
pub const SECRET_HEX: usize = 64;

/// A presented token split into its id and secret: `stk_<id>_<secret>`, both lowercase
/// hex of the fixed lengths; anything else is not a scoped token.
pub fn split_token(t: &str) -> Option<(&str, &str)> {
    let rest = t.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (hex(id, ID_HEX) && hex(secret, SECRET_HEX)).then_some((id, secret))
}

/// May a tenant whose `live` keys hold containers (or are being created) take `key`,
/// under its `ceiling`? A key already among them always may (it holds no new
/// container); a new one only below the share.
pub fn within_share(live: usize, key_is_held: bool, ceiling: u32) -> bool {
    key_is_held || live < ceiling as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_is_one_key_or_a_prefix_and_nothing_else() {
        let rows: &[(&str, &str, Result<Pattern, &str>)] = &[
            ("a prefix", "ci-*", Ok(Pattern::Prefix("ci-".into()))),
            ("one key", "build-7", Ok(Pattern::Exact("build-7".into()))),
            ("every key is the operator's", "*", Err("operator")),
            ("a star inside", "c*i", Err("only end")),
            ("two stars", "ci-**", Err("only end")),
            ("a character no key has", "ci/*", Err("key pattern")),
            ("a leading dot", ".ci*", Err("key pattern")),
            ("empty", "", Err("key pattern")),
        ];
        for (sentence, input, want) in rows {
            match (Pattern::parse(input), want) {
                (Ok(p), Ok(w)) => {
                    assert_eq!(&p, w, "{sentence}");
                    assert_eq!(p.to_string(), *input, "{sentence}: it prints as written");
                }
                (Err(e), Err(w)) => assert!(e.contains(w), "{sentence}: {e}"),
                (got, _) => panic!("{sentence}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_listing_reaches_only_the_patterns_keys() {
        let p = Pattern::Prefix("ci-".into());
        let k = Pattern::Exact("build-7".into());
        let rows = [
            (&p, "", Listing::Prefix("ci-".into())),
            (&p, "c", Listing::Prefix("ci-".into())),
            (&p, "ci-7", Listing::Prefix("ci-7".into())),
            (&p, "cd", Listing::Nothing),
            (&k, "", Listing::One("build-7".into())),
            (&k, "build", Listing::One("build-7".into())),
            (&k, "build-77", Listing::Nothing),
            (&k, "ci-", Listing::Nothing),
        ];
        for (pattern, wanted, want) in rows {
            assert_eq!(pattern.listing(wanted), want, "{pattern} {wanted:?}");
        }
    }

    #[test]
    fn a_pattern_reaches_its_keys_and_overlap_is_any_key_both_reach() {
        let p = |s| Pattern::parse(s).unwrap();
        assert!(p("ci-*").matches("ci-1"));
        assert!(
            p("ci-*").matches("ci-"),
            "the prefix itself is a key it reaches"
        );
        assert!(!p("ci-*").matches("cd-1"));
        assert!(!p("ci-*").matches("CI-1"), "keys are case-sensitive");
        assert!(p("b").matches("b") && !p("b").matches("bb"));
        let rows: &[(&str, &str, &str, bool)] = &[
            ("nested prefixes", "ci-*", "ci-a*", true),
            ("disjoint prefixes", "ci-*", "cd-*", false),
            ("a prefix and a key it reaches", "ci-*", "ci-7", true),
            ("a prefix and a key it does not", "ci-*", "c", false),
            ("one key twice", "k", "k", true),
            ("two keys", "k", "l", false),
            ("a key that is a longer prefix's start", "ci", "ci-*", false),
        ];
        for (sentence, a, b, want) in rows {
            assert_eq!(p(a).overlaps(&p(b)), *want, "{sentence}");
            assert_eq!(p(b).overlaps(&p(a)), *want, "{sentence} (either way)");
        }
    }

    #[test]
    fn a_token_is_recognized_only_in_its_exact_shape() {
        let id = "0123456789abcdef";
        let secret = "a".repeat(SECRET_HEX);
        let good = format!("stk_{id}_{secret}");
        assert_eq!(split_token(&good), Some((id, secret.as_str())));
        for (sentence, t) in [
            ("the operator's token", "a".repeat(64)),
            ("no prefix", format!("{id}_{secret}")),
            ("a short id", format!("stk_0123_{secret}")),
            ("uppercase", format!("stk_{}_{secret}", id.to_uppercase())),
            ("a short secret", format!("stk_{id}_abc")),
            ("a trailing part", format!("{good}_x")),
            ("empty", String::new()),
        ] {
            assert_eq!(split_token(&t), None, "{sentence}");
        }
    }

    #[test]
    fn a_share_admits_a_held_key_always_and_a_new_one_below_the_ceiling() {
        let rows: &[(&str, usize, bool, u32, bool)] = &[
            ("an empty share", 0, false, 1, true),
            ("below", 3, false, 4, true),
            ("at the share, a new key", 4, false, 4, false),
            ("at the share, a key it holds", 4, true, 4, true),
            ("past the share (lowered), a held key", 5, true, 4, true),
        ];
        for (sentence, live, held, ceiling, want) in rows {
            assert_eq!(within_share(*live, *held, *ceiling), *want, "{sentence}");
        }
    }
}
