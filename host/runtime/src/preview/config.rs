//! `[preview]` in `wasmtime.toml`: where the preview listener listens, the Host form's
//! domain, and the per-door rate bound. Validated at start-up (a bad value is an error
//! naming the key, never a listener that half works).

use serde::{Deserialize, Serialize};

use super::rate::Bound;

/// `[preview]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreviewConfig {
    /// Serve doors at all (`stockade serve` with the linux substrate).
    pub enabled: bool,
    /// The listener's address; port 0 picks a free one (the URLs name the bound one).
    pub listen: String,
    /// The Host form's domain (`{port}-{token}.{domain}`): configuration, never a
    /// consumer's. Empty: the path form (`/p/{token}/`) only.
    pub domain: String,
    /// Requests one door admits at once.
    pub burst: u32,
    /// Requests per second one door admits, sustained.
    pub per_second: u32,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: "127.0.0.1:8790".into(),
            domain: String::new(),
            burst: 200,
            per_second: 100,
        }
    }
}

impl PreviewConfig {
    /// The rate bound every door shares.
    pub fn bound(&self) -> Bound {
        Bound {
            burst: self.burst,
            per_second: self.per_second,
        }
    }

    /// The domain, if configured.
    pub fn domain(&self) -> Option<String> {
        (!self.domain.is_empty()).then(|| self.domain.to_ascii_lowercase())
    }

    /// Check values that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "preview.listen must be an address such as 127.0.0.1:8790, got {:?}",
                self.listen
            ));
        }
        if !self.domain.is_empty() && !valid_domain(&self.domain) {
            return Err(format!(
                "preview.domain must be a DNS name (labels of [a-z0-9-], no port), got {:?}",
                self.domain
            ));
        }
        if self.burst == 0 || self.per_second == 0 {
            return Err("preview.burst and preview.per_second must be positive".into());
        }
        Ok(())
    }
}

fn valid_domain(d: &str) -> bool {
    d.len() <= 200
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let ok = PreviewConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let rows: [(&str, PreviewConfig, bool); 7] = [
            ("default", ok.clone(), true),
            (
                "a domain",
                PreviewConfig {
                    domain: "preview.localhost".into(),
                    ..ok.clone()
                },
                true,
            ),
            (
                "a domain with a port",
                PreviewConfig {
                    domain: "p.test:80".into(),
                    ..ok.clone()
                },
                false,
            ),
            (
                "an empty label",
                PreviewConfig {
                    domain: "p..test".into(),
                    ..ok.clone()
                },
                false,
            ),
            (
                "listen not an address",
                PreviewConfig {
                    listen: "localhost".into(),
                    ..ok.clone()
                },
                false,
            ),
            (
                "no burst",
                PreviewConfig {
                    burst: 0,
                    ..ok.clone()
                },
                false,
            ),
            (
                "no rate",
                PreviewConfig {
                    per_second: 0,
                    ..ok.clone()
                },
                false,
            ),
        ];
        for (name, cfg, want) in rows {
            assert_eq!(cfg.validate().is_ok(), want, "{name}");
        }
    }
}
