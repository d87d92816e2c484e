//! Which door an inbound request names, and the path it goes on with. Pure: the
//! request's `Host` header and request target in, a [`Route`] (or nothing: the 404)
//! out.
//!
//! * Host form, when a domain is configured: `Host: {port}-{token}.{domain}` (an
//!   optional `:port` after it). Parsed strictly: one label before the domain, the
//!   port in decimal without a leading zero, the token well-formed; anything else is
//!   not a door. The target is forwarded unchanged.
//! * Path form: `/p/{token}/rest?query` forwards `/rest?query`; `/p/{token}` alone
//!   forwards `/`.

use super::token;

/// A request that names a door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The token it names.
    pub token: String,
    /// The port the Host form names (the door's port must be it); none in the path form.
    pub port: Option<u16>,
    /// The request target to forward (origin form, starts with `/`).
    pub target: String,
}

/// The route of a request, or `None` (the 404).
pub fn parse(host: Option<&str>, target: &str, domain: Option<&str>) -> Option<Route> {
    if !target.starts_with('/') {
        return None;
    }
    if let (Some(domain), Some(host)) = (domain, host)
        && let Some(r) = host_form(host, target, domain)
    {
        return Some(r);
    }
    path_form(target)
}

fn host_form(host: &str, target: &str, domain: &str) -> Option<Route> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        Some(_) => return None,
        None => host,
    };
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return None;
    }
    let name = name.to_ascii_lowercase();
    let label = name.strip_suffix(&format!(".{}", domain.to_ascii_lowercase()))?;
    let (port, tok) = label.split_once('-')?;
    if port.is_empty() || port.len() > 5 || port.starts_with('0') || !token::well_formed(tok) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    Some(Route {
        token: tok.to_string(),
        port: Some(port),
        target: target.to_string(),
    })
}

fn path_form(target: &str) -> Option<Route> {
    let rest = target.strip_prefix("/p/")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (tok, after) = rest.split_at(end);
    if !token::well_formed(tok) {
        return None;
    }
    let target = if after.starts_with('/') {
        after.to_string()
    } else {
        format!("/{after}")
    };
    Some(Route {
        token: tok.to_string(),
        port: None,
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "abcdefghijklmnopqrstuvwx";

    fn r(port: Option<u16>, target: &str) -> Option<Route> {
        Some(Route {
            token: T.into(),
            port,
            target: target.into(),
        })
    }

    /// (Host header, request target, configured domain, the route).
    type Row<'a> = (Option<String>, String, Option<&'a str>, Option<Route>);

    #[test]
    fn routes() {
        let d = Some("preview.test");
        let rows: Vec<Row> = vec![
            // Path form.
            (None, format!("/p/{T}/"), None, r(None, "/")),
            (None, format!("/p/{T}"), None, r(None, "/")),
            (None, format!("/p/{T}?a=1"), None, r(None, "/?a=1")),
            (None, format!("/p/{T}/x/y?z"), None, r(None, "/x/y?z")),
            (None, format!("/p/{T}x/"), None, None),
            (None, "/p/short/".into(), None, None),
            (None, format!("/p/{}/", T.to_uppercase()), None, None),
            (None, format!("/q/{T}/"), None, None),
            (None, "/".into(), None, None),
            (None, format!("http://evil/p/{T}/"), None, None),
            (None, "*".into(), None, None),
            // Host form.
            (
                Some(format!("8000-{T}.preview.test")),
                "/a?b".into(),
                d,
                r(Some(8000), "/a?b"),
            ),
            (
                Some(format!("8000-{T}.preview.test:8790")),
                "/".into(),
                d,
                r(Some(8000), "/"),
            ),
            (
                Some(format!("8000-{T}.PREVIEW.test")),
                "/".into(),
                d,
                r(Some(8000), "/"),
            ),
            (Some(format!("08000-{T}.preview.test")), "/".into(), d, None),
            (Some(format!("0-{T}.preview.test")), "/".into(), d, None),
            (Some(format!("70000-{T}.preview.test")), "/".into(), d, None),
            (
                Some(format!("x.8000-{T}.preview.test")),
                "/".into(),
                d,
                None,
            ),
            (
                Some(format!("8000-{T}.preview.test.evil")),
                "/".into(),
                d,
                None,
            ),
            (
                Some(format!("8000-{T}.evilpreview.test")),
                "/".into(),
                d,
                None,
            ),
            (Some(format!("8000-{T}.preview.test:")), "/".into(), d, None),
            (
                Some(format!("u@8000-{T}.preview.test")),
                "/".into(),
                d,
                None,
            ),
            (Some(format!("8000-{T}.preview.test ")), "/".into(), d, None),
            // No domain configured: the Host form is not a door.
            (
                Some(format!("8000-{T}.preview.test")),
                "/".into(),
                None,
                None,
            ),
            // A Host that is not a door falls back to the path form.
            (
                Some("127.0.0.1:8790".into()),
                format!("/p/{T}/z"),
                d,
                r(None, "/z"),
            ),
        ];
        for (host, target, domain, want) in rows {
            assert_eq!(
                parse(host.as_deref(), &target, domain),
                want,
                "host {host:?} target {target:?} domain {domain:?}"
            );
        }
    }
}
