//! Preview doors (docs/PREVIEW.md): what `expose`, `unexpose` and `previews` decide
//! before and between their substrate calls. The door itself (listener, token,
//! forwarding) is the substrate's own route (docs/DESIGN.md §8: the route is the
//! substrate's own, the hostname is configuration, the token is random); the guest
//! decides only what a consumer may ask for.

use crate::stockade::sandbox::types::Preview;

/// Most doors one key holds open at once.
pub const MAX_PER_KEY: usize = 8;

/// The container's egress proxy listens on this port of its loopback (docs/LINUX.md):
/// a door onto it would hand whoever holds the URL the key's egress, so none opens.
pub const PROXY_PORT: u16 = 3128;

/// A port `unexpose` may name: 1-65535.
pub fn port(port: u32) -> Result<u16, String> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("port must be 1..=65535, got {port}")),
    }
}

/// A port a consumer may expose: 1-65535, and never the egress proxy's own
/// ([`PROXY_PORT`]): inbound is not egress (docs/DESIGN.md §2.1).
pub fn exposable(port: u32) -> Result<u16, String> {
    let p = self::port(port)?;
    if p == PROXY_PORT {
        return Err(format!(
            "port {PROXY_PORT} is the sandbox's egress proxy: a preview never opens onto it"
        ));
    }
    Ok(p)
}

/// What `expose` does once it knows the key's container and its open doors.
#[derive(Debug, Clone, PartialEq)]
pub enum Expose {
    /// The port's door is already open: answer it again (no second token).
    Existing(Preview),
    /// Open a door.
    Open,
    /// Refuse: the key has no running container (`expose` never creates one).
    NoContainer,
    /// Refuse: the key already holds [`MAX_PER_KEY`] doors.
    TooMany,
}

impl Expose {
    /// The decision's name for a log line (never the door's token).
    pub fn label(&self) -> &'static str {
        match self {
            Expose::Existing(_) => "existing",
            Expose::Open => "open",
            Expose::NoContainer => "no-container",
            Expose::TooMany => "too-many",
        }
    }
}

/// The decision for `expose(port)` given the key's container (if any) and its doors.
pub fn expose(has_container: bool, open: &[Preview], port: u16) -> Expose {
    if !has_container {
        return Expose::NoContainer;
    }
    if let Some(p) = open.iter().find(|p| p.port == port) {
        return Expose::Existing(p.clone());
    }
    if open.len() >= MAX_PER_KEY {
        return Expose::TooMany;
    }
    Expose::Open
}

/// The refusal's text, for `invalid-input`.
pub fn refusal(e: &Expose) -> Option<String> {
    match e {
        Expose::NoContainer => Some(
            "the key has no running container: start a process in it first (expose never creates one)"
                .into(),
        ),
        Expose::TooMany => Some(format!(
            "the key already has {MAX_PER_KEY} previews open: unexpose one first"
        )),
        Expose::Existing(_) | Expose::Open => None,
    }
}

/// The doors in port order (the answer of `previews`).
pub fn sorted(mut open: Vec<Preview>) -> Vec<Preview> {
    open.sort_by_key(|p| p.port);
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(port: u16) -> Preview {
        Preview {
            port,
            token: format!("t{port:015}"),
            url: format!("http://127.0.0.1:1/p/t{port:015}/"),
        }
    }

    #[test]
    fn ports() {
        let rows: [(u32, Result<u16, ()>); 6] = [
            (0, Err(())),
            (1, Ok(1)),
            (8000, Ok(8000)),
            (65535, Ok(65535)),
            (65536, Err(())),
            (u32::MAX, Err(())),
        ];
        for (input, want) in rows {
            assert_eq!(port(input).map_err(drop), want, "port {input}");
        }
    }

    #[test]
    fn exposable_ports() {
        // (port, exposable, the refusal names)
        let rows: [(u32, Result<u16, &str>); 7] = [
            (0, Err("1..=65535")),
            (1, Ok(1)),
            (3127, Ok(3127)),
            (3128, Err("egress proxy")),
            (3129, Ok(3129)),
            (65535, Ok(65535)),
            (65536, Err("1..=65535")),
        ];
        for (input, want) in rows {
            match (exposable(input), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "port {input}"),
                (Err(m), Err(w)) => assert!(m.contains(w), "port {input}: {m}"),
                (got, w) => panic!("port {input}: {got:?}, want {w:?}"),
            }
        }
        // Unexposing 3128 is a well-formed no-op (no door is ever open there).
        assert_eq!(port(3128), Ok(3128));
    }

    #[test]
    fn expose_decisions() {
        let full: Vec<Preview> = (1..=MAX_PER_KEY as u16).map(p).collect();
        let rows: [(&str, bool, Vec<Preview>, u16, Expose); 5] = [
            ("no container", false, vec![], 80, Expose::NoContainer),
            ("first door", true, vec![], 80, Expose::Open),
            (
                "same port again",
                true,
                vec![p(80)],
                80,
                Expose::Existing(p(80)),
            ),
            (
                "at the bound, a new port",
                true,
                full.clone(),
                9000,
                Expose::TooMany,
            ),
            (
                "at the bound, an open port",
                true,
                full,
                1,
                Expose::Existing(p(1)),
            ),
        ];
        for (name, has, open, port, want) in rows {
            let got = expose(has, &open, port);
            assert_eq!(got, want, "{name}");
            assert_eq!(
                refusal(&got).is_some(),
                matches!(want, Expose::NoContainer | Expose::TooMany),
                "{name}"
            );
        }
    }

    #[test]
    fn previews_are_in_port_order() {
        let got: Vec<u16> = sorted(vec![p(9), p(3), p(7)])
            .iter()
            .map(|p| p.port)
            .collect();
        assert_eq!(got, [3, 7, 9]);
    }
}
