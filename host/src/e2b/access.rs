//! envd's access token (pure): what a sandbox's envd routes take as
//! `X-Access-Token`, one per sandbox, so a token handed to whatever talks to one
//! sandbox (E2B's model: the SDK, a browser, a subprocess) reaches that sandbox only,
//! never the caller's other sandboxes nor its API key's other powers.
//!
//! It is derived, not stored: `hex(HMAC-SHA256(server secret, "stockade-e2b-envd\0"
//! || sandbox id))`, 64 hex characters. The server secret is the server's own consumer
//! token (persistent, never disclosed), so a create, a connect and `get_info` answer
//! the same token without keeping it, and a restart still accepts it. Rotating the
//! server's token rotates every access token (a client gets the new one from
//! `connect`). Checked in constant time ([`ring::hmac::verify`]).

use ring::hmac;

/// The HMAC's domain separation: these bytes are signed for nothing else.
const CONTEXT: &[u8] = b"stockade-e2b-envd\0";
/// The traffic access token's (`trafficAccessToken`, the `e2b-traffic-access-token`
/// header of a request to one of a sandbox's ports in the domain form when its create
/// said `allowPublicTraffic: false`): another label, so neither token is the other.
const TRAFFIC: &[u8] = b"stockade-e2b-traffic\0";

fn mac_key(secret: &str) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes())
}

fn message(label: &[u8], id: &str) -> Vec<u8> {
    let mut m = label.to_vec();
    m.extend_from_slice(id.as_bytes());
    m
}

fn sign(label: &[u8], secret: &str, id: &str) -> String {
    let tag = hmac::sign(&mac_key(secret), &message(label, id));
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Sandbox `id`'s access token under `secret`.
pub fn token(secret: &str, id: &str) -> String {
    sign(CONTEXT, secret, id)
}

/// Sandbox `id`'s traffic access token under `secret` (its ports' door key when its
/// traffic is not public).
pub fn traffic_token(secret: &str, id: &str) -> String {
    sign(TRAFFIC, secret, id)
}

/// Is `presented` sandbox `id`'s access token under `secret`? (Constant time in the
/// token's bytes; a token of another shape is refused.)
pub fn verify(secret: &str, id: &str, presented: &str) -> bool {
    check(CONTEXT, secret, id, presented)
}

/// Is `presented` sandbox `id`'s traffic access token under `secret`? (As [`verify`].)
pub fn verify_traffic(secret: &str, id: &str, presented: &str) -> bool {
    check(TRAFFIC, secret, id, presented)
}

fn check(label: &[u8], secret: &str, id: &str, presented: &str) -> bool {
    if presented.len() != 64 {
        return false;
    }
    let Some(tag) = (0..32)
        .map(|i| u8::from_str_radix(presented.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    hmac::verify(&mac_key(secret), &message(label, id), &tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandboxs_token_opens_that_sandbox_only() {
        let t = token("server-secret", "aaaaaaaaaaaaaaaaaaaa");
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(t, token("server-secret", "aaaaaaaaaaaaaaaaaaaa"), "derived");
        assert!(verify("server-secret", "aaaaaaaaaaaaaaaaaaaa", &t));
        for (secret, id, presented) in [
            // Another sandbox, another server, the caller's API key, nothing, junk.
            ("server-secret", "bbbbbbbbbbbbbbbbbbbb", t.as_str()),
            ("other-secret", "aaaaaaaaaaaaaaaaaaaa", t.as_str()),
            (
                "server-secret",
                "aaaaaaaaaaaaaaaaaaaa",
                "stk_0123456789abcdef_00",
            ),
            ("server-secret", "aaaaaaaaaaaaaaaaaaaa", ""),
            ("server-secret", "aaaaaaaaaaaaaaaaaaaa", &"zz".repeat(32)),
            ("server-secret", "aaaaaaaaaaaaaaaaaaaa", &t[..63]),
        ] {
            assert!(!verify(secret, id, presented), "{secret} {id} {presented}");
        }
    }

    #[test]
    fn the_traffic_token_is_another_label_so_neither_opens_the_other() {
        let (s, id) = ("server-secret", "aaaaaaaaaaaaaaaaaaaa");
        let (envd, traffic) = (token(s, id), traffic_token(s, id));
        assert_ne!(envd, traffic);
        assert!(verify_traffic(s, id, &traffic));
        assert!(
            !verify_traffic(s, id, &envd),
            "the envd token is no traffic token"
        );
        assert!(
            !verify(s, id, &traffic),
            "the traffic token is no envd token"
        );
        assert!(!verify_traffic(s, "bbbbbbbbbbbbbbbbbbbb", &traffic));
        assert!(!verify_traffic("other", id, &traffic));
    }
}
