//! A credential goes only where the approver bound it (invariant 3; docs/EGRESS.md,
//! "Credentials the command never holds").
//!
//! A rule that names a secret must sit inside the binding the approver gave the secret
//! when setting it (host and port, methods, path prefix). The check is the grammar's
//! [`stockade_grammar::binding::grant_within`], the same function the API and the
//! substrate apply; here it runs before any substrate call, so a consumer that points
//! a secret at another host changes nothing (no container, no fence).

use stockade_grammar::binding::{self, Binding};
use stockade_grammar::rules::Grant as ParsedGrant;

use crate::stockade::sandbox::policy::Binding as SecretBinding;
use crate::stockade::sandbox::types::Grant;

/// The distinct secret names a grant's rules carry, in order of first use (each is
/// looked up once).
pub fn secret_names(grant: &Grant) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for h in grant.rules.iter().flat_map(|r| r.headers.iter()) {
        if !names.contains(&h.secret) {
            names.push(h.secret.clone());
        }
    }
    names
}

/// Is every credential rule of `grant` (as [`validate::grant`] parsed it) inside its
/// secret's binding? `bindings` holds what the host answered for each name of
/// [`secret_names`] (`None`: not set, or set without a binding: refused).
///
/// [`validate::grant`]: crate::decide::validate::grant
pub fn check(
    grant: &ParsedGrant,
    bindings: &[(String, Option<SecretBinding>)],
) -> Result<(), String> {
    let lookup = |name: &str| {
        bindings
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, b)| b.as_ref())
            .map(|b| Binding {
                host: b.host.clone(),
                port: b.port,
                methods: b.methods.clone(),
                path_prefix: b.path_prefix.clone(),
            })
    };
    binding::grant_within(grant, lookup).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stockade::sandbox::types::{CredentialHeader, Rule};

    fn rule(host: &str, methods: &[&str], path: Option<&str>, secret: Option<&str>) -> Rule {
        Rule {
            host: host.into(),
            methods: methods.iter().map(|m| (*m).to_string()).collect(),
            path_prefix: path.map(Into::into),
            headers: secret
                .map(|s| {
                    vec![CredentialHeader {
                        name: "Authorization".into(),
                        secret: s.into(),
                    }]
                })
                .unwrap_or_default(),
            intercept: true,
        }
    }

    fn bound(host: &str, port: u16, methods: &[&str], path: &str) -> Option<SecretBinding> {
        Some(SecretBinding {
            host: host.into(),
            port,
            methods: methods.iter().map(|m| (*m).to_string()).collect(),
            path_prefix: path.into(),
        })
    }

    #[test]
    fn a_credential_rule_must_sit_inside_its_secrets_binding() {
        let api = || bound("api.example.com", 443, &["GET", "POST"], "/v1/");
        let rows: Vec<(&str, Rule, Option<SecretBinding>, bool)> = vec![
            (
                "the bound host, method and path: admitted",
                rule("api.example.com", &["GET"], Some("/v1/repos"), Some("s")),
                api(),
                true,
            ),
            (
                "the issue's attack: the consumer points the secret at its own host",
                rule("attacker.example", &["GET"], None, Some("s")),
                api(),
                false,
            ),
            (
                "a suffix glob is wider than one host",
                rule("*.example.com", &["GET"], Some("/v1/"), Some("s")),
                api(),
                false,
            ),
            (
                "no port means 443, so a rule on :8443 is outside a 443 binding",
                rule("api.example.com:8443", &["GET"], Some("/v1/"), Some("s")),
                api(),
                false,
            ),
            (
                "a method the approver did not bind",
                rule("api.example.com", &["DELETE"], Some("/v1/"), Some("s")),
                api(),
                false,
            ),
            (
                "a path above the bound prefix",
                rule("api.example.com", &["GET"], Some("/"), Some("s")),
                api(),
                false,
            ),
            (
                "a secret that is not set (or set before bindings existed) is refused",
                rule("api.example.com", &["GET"], Some("/v1/"), Some("s")),
                None,
                false,
            ),
            (
                "a rule without credentials needs no binding",
                rule("anywhere.example", &[], None, None),
                None,
                true,
            ),
        ];
        for (what, r, b, ok) in rows {
            let grant = Grant {
                rules: vec![r],
                ask: false,
            };
            let names = secret_names(&grant);
            let bindings: Vec<_> = names.into_iter().map(|n| (n, b.clone())).collect();
            let parsed = crate::decide::validate::grant(&grant).unwrap();
            let got = check(&parsed, &bindings);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
        }
    }

    #[test]
    fn each_secret_is_looked_up_once() {
        let grant = Grant {
            rules: vec![
                rule("a.example", &["GET"], None, Some("s")),
                rule("b.example", &["GET"], None, Some("t")),
                rule("c.example", &["GET"], None, Some("s")),
            ],
            ask: false,
        };
        assert_eq!(secret_names(&grant), vec!["s".to_string(), "t".to_string()]);
    }
}
