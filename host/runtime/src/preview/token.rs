//! A door's token: [`LEN`] characters of `[a-z0-9]` (about 124 bits), drawn from the
//! operating system's CSPRNG by rejection sampling (uniform over the alphabet).
//! Lower-case only, so the Host form (`{port}-{token}.{domain}`) survives DNS's case
//! folding.

use ring::rand::{SecureRandom, SystemRandom};

/// Characters in a token.
pub const LEN: usize = 24;
const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A fresh token. Fails only when the OS has no randomness to give.
pub fn fresh() -> Result<String, String> {
    let rng = SystemRandom::new();
    let mut out = String::with_capacity(LEN);
    let mut buf = [0u8; 64];
    while out.len() < LEN {
        rng.fill(&mut buf)
            .map_err(|_| "the OS random source failed".to_string())?;
        // 252 = 7 * 36: bytes at or above it would bias the first characters.
        for b in buf.iter().filter(|b| **b < 252) {
            if out.len() == LEN {
                break;
            }
            out.push(ALPHABET[(*b % 36) as usize] as char);
        }
    }
    Ok(out)
}

/// Is `s` shaped like a token (the route parses nothing else)?
pub fn well_formed(s: &str) -> bool {
    s.len() == LEN && s.bytes().all(|b| ALPHABET.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_lowercase_and_distinct() {
        let a: Vec<String> = (0..64).map(|_| fresh().unwrap()).collect();
        for t in &a {
            assert!(well_formed(t), "{t}");
            assert!(t.len() >= 16);
        }
        let mut d = a.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), a.len(), "64 fresh tokens are distinct");
        // Every character of the alphabet shows up over many draws (not a stuck source).
        let all: String = (0..200).map(|_| fresh().unwrap()).collect();
        for c in ALPHABET {
            assert!(all.as_bytes().contains(c), "{}", *c as char);
        }
    }

    #[test]
    fn shape() {
        let rows = [
            ("abcdefghijklmnopqrstuvwx", true),
            ("abcdefghijklmnopqrstuvw", false),
            ("ABCDEFGHIJKLMNOPQRSTUVWX", false),
            ("abcdefghijklmnopqrstuvw-", false),
            ("", false),
        ];
        for (s, want) in rows {
            assert_eq!(well_formed(s), want, "{s:?}");
        }
    }
}
