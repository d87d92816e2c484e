//! Bounds on what a client chooses, before it reaches a log line or a stored row.
//!
//! A command inside a container picks the method, host, path and header names of every
//! request it sends. Kept whole, they let it turn the proxy's logs and the store into an
//! amplifier (30 kB methods and hosts kept whole made 13 MiB of lines in 4 s:
//! docs/SECURITY.md, "The proxy against its own clients"). Every client-chosen field that
//! is logged or recorded goes through [`field`] first; extension methods longer than
//! [`MAX_METHOD`] are refused before any work is done.

/// Most bytes of a client-chosen field (host, method, path, error detail, header name)
/// kept in a log line or a stored row.
pub const MAX_FIELD: usize = 256;

/// Longest method the proxy serves: every standard method is at most 7 bytes; a
/// longer extension method is refused (400) before it is decided or logged.
pub const MAX_METHOD: usize = 32;

/// `s` cut to at most [`MAX_FIELD`] bytes, on a character boundary (pure, no
/// allocation).
pub fn field(s: &str) -> &str {
    cut(s, MAX_FIELD)
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An owned copy of `s` bounded by [`field`].
pub fn owned(s: &str) -> String {
    field(s).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_cut_on_a_character_boundary() {
        let rows: &[(&str, String, usize)] = &[
            ("short stays whole", "/short".into(), 6),
            (
                "exactly the bound stays whole",
                "a".repeat(MAX_FIELD),
                MAX_FIELD,
            ),
            ("30 kB is cut to the bound", "m".repeat(30_000), MAX_FIELD),
            // 'é' is 2 bytes: 255 ASCII bytes then 'é' would end at 257.
            (
                "a multi-byte character straddling the bound is left out",
                format!("{}é", "a".repeat(MAX_FIELD - 1)),
                MAX_FIELD - 1,
            ),
        ];
        for (sentence, input, want) in rows {
            assert_eq!(field(input).len(), *want, "{sentence}");
            assert!(input.starts_with(field(input)), "{sentence}");
        }
        assert_eq!(owned("GET"), "GET");
    }
}
