//! Percent-encoding of what goes into a path: everything but RFC 3986's unreserved
//! characters, so a name's `?`, `#`, `%`, space or `/` can never change which route or
//! which resource a request names.

/// One path segment (a key, an id, a secret's name): `/` is encoded too.
pub fn segment(s: &str) -> String {
    encode(s, false)
}

/// A relative path (an artifact name, a file under `/workspace`): each segment
/// encoded, the `/` between them kept.
pub fn path(s: &str) -> String {
    encode(s, true)
}

fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_in_a_name_can_start_a_query_a_fragment_or_an_escape() {
        let rows = [
            ("report.txt", "report.txt", "report.txt"),
            ("a?b", "a%3Fb", "a%3Fb"),
            ("a#b", "a%23b", "a%23b"),
            ("100%", "100%25", "100%25"),
            ("a b", "a%20b", "a%20b"),
            ("x/y", "x%2Fy", "x/y"),
            ("a b/c?d/../e", "a%20b%2Fc%3Fd%2F..%2Fe", "a%20b/c%3Fd/../e"),
            ("é", "%C3%A9", "%C3%A9"),
        ];
        for (raw, seg, p) in rows {
            assert_eq!(segment(raw), seg, "{raw}");
            assert_eq!(path(raw), p, "{raw}");
        }
    }
}
