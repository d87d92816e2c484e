//! What a workload starts with: the proxy port and its identity, the environment every
//! process gets before the command's own, where its program is searched, its working
//! directory (pure, table-tested).

/// The proxy inside every container (the host's egress listener in its netns).
pub const PROXY_PORT: u16 = 3128;

/// The uid and gid workloads run as inside a container (the `sandbox` user; the host's
/// id pool maps it, `stockade_host::substrate::linux::idmap`).
pub const WORKLOAD_ID: u32 = 1000;

pub(super) const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The variables that point TLS clients at a CA bundle (the system bundle plus the
/// container's egress CA): OpenSSL and python's `ssl`, requests/pip, curl, git, cargo,
/// npm. Node takes extra CAs on top of its own store instead.
const CA_BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "NPM_CONFIG_CAFILE",
];

/// The environment every process gets before the command's own. `trusts_ca`: the
/// container holds its egress CA (`/etc/stockade`), and clients are pointed at it.
pub fn default_env(proxy_port: u16, trusts_ca: bool) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let ca: Vec<(String, String)> = if trusts_ca {
        CA_BUNDLE_VARS
            .iter()
            .map(|v| ((*v).to_owned(), crate::rootfs::CA_BUNDLE.to_owned()))
            .chain([(
                "NODE_EXTRA_CA_CERTS".to_owned(),
                crate::rootfs::CA_FILE.to_owned(),
            )])
            .collect()
    } else {
        Vec::new()
    };
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), PATH.into()),
        ("HOME".into(), "/workspace".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("HTTP_PROXY".into(), proxy.clone()),
        ("HTTPS_PROXY".into(), proxy.clone()),
        ("http_proxy".into(), proxy.clone()),
        ("https_proxy".into(), proxy),
        ("NO_PROXY".into(), no_proxy.clone()),
        ("no_proxy".into(), no_proxy),
    ];
    env.extend(ca);
    env
}

/// Merge `extra` over `base` (a later value for a name wins).
pub fn merge_env(base: Vec<(String, String)>, extra: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = base;
    for (k, v) in extra {
        match out.iter_mut().find(|(n, _)| n == k) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// The places `argv[0]` may be, in `PATH` order (or itself if it names a path).
pub fn candidates(argv0: &str, path: &str) -> Vec<String> {
    if argv0.contains('/') {
        return vec![argv0.to_string()];
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| format!("{}/{argv0}", d.trim_end_matches('/')))
        .collect()
}

/// A working directory: absolute as given, relative to `/workspace`, empty = `/workspace`.
pub fn resolve_cwd(cwd: &str) -> String {
    if cwd.is_empty() {
        "/workspace".into()
    } else if cwd.starts_with('/') {
        cwd.into()
    } else {
        format!("/workspace/{cwd}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_env_overrides_the_defaults() {
        let env = merge_env(
            default_env(3128, false),
            &[("HOME".into(), "/tmp".into()), ("X".into(), "1".into())],
        );
        assert!(env.contains(&("HOME".into(), "/tmp".into())));
        assert!(env.contains(&("X".into(), "1".into())));
        assert!(env.contains(&("HTTPS_PROXY".into(), "http://127.0.0.1:3128".into())));
        assert!(env.contains(&("no_proxy".into(), "localhost,127.0.0.1,::1".into())));
        assert!(!env.iter().any(|(k, _)| k == "SSL_CERT_FILE"));
    }

    #[test]
    fn a_container_that_trusts_its_ca_points_every_client_at_it() {
        let env = default_env(3128, true);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for var in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            assert_eq!(get(var), Some("/etc/stockade/ca-bundle.pem"), "{var}");
        }
        assert_eq!(get("NODE_EXTRA_CA_CERTS"), Some("/etc/stockade/ca.pem"));
    }

    #[test]
    fn a_program_is_searched_in_path_unless_it_names_a_path() {
        assert_eq!(candidates("./x", "/bin"), vec!["./x"]);
        assert_eq!(
            candidates("sh", "/usr/bin:/bin/"),
            vec!["/usr/bin/sh", "/bin/sh"]
        );
    }

    #[test]
    fn a_relative_cwd_is_under_the_workspace() {
        assert_eq!(resolve_cwd(""), "/workspace");
        assert_eq!(resolve_cwd("sub"), "/workspace/sub");
        assert_eq!(resolve_cwd("/tmp"), "/tmp");
    }
}
