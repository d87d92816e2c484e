//! The supervisor's command line: what the host says on it, and its parsing.

use std::collections::HashMap;
use std::ffi::OsString;

use crate::kill::{self, KillMode};

/// The supervisor's command line (after argv[0]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The container id (for the hostname).
    pub id: String,
    /// How trees are killed.
    pub kill_mode: KillMode,
    /// Build the container (namespaces, mounts, an unprivileged workload identity);
    /// false when the host could not create namespaces.
    pub isolate: bool,
    /// Where the root comes from: an image directory on [`handoff::IMAGE_FD`].
    pub image: bool,
    /// The egress proxy's port on the container's loopback.
    pub proxy_port: u16,
    /// The inherited cgroup directory (cgroup mode).
    pub cgroup: bool,
    /// The container's egress CA certificate (PEM), which it is made to trust; `None`
    /// without interception. Public: the key stays with the host.
    pub ca_pem: Option<String>,
}

impl Args {
    /// The command line for these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        vec![
            "--id".into(),
            self.id.clone(),
            "--kill-mode".into(),
            kill::mode_arg(self.kill_mode).into(),
            "--isolate".into(),
            flag(self.isolate),
            "--image".into(),
            flag(self.image),
            "--proxy-port".into(),
            self.proxy_port.to_string(),
            "--cgroup".into(),
            flag(self.cgroup),
            "--ca".into(),
            self.ca_pem.clone().unwrap_or_else(|| "-".into()),
        ]
    }

    /// Parse a command line.
    pub fn parse(args: &[OsString]) -> Result<Args, String> {
        let mut m: HashMap<String, String> = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let k = k.to_str().ok_or("non-UTF-8 argument")?;
            let v = it.next().ok_or(format!("{k} needs a value"))?;
            m.insert(
                k.trim_start_matches("--").into(),
                v.to_str().ok_or("non-UTF-8 argument")?.into(),
            );
        }
        let get = |k: &str| m.get(k).cloned().ok_or(format!("--{k} is required"));
        let flag = |k: &str| -> Result<bool, String> { Ok(get(k)? == "1") };
        Ok(Args {
            id: get("id")?,
            kill_mode: kill::parse_mode(&get("kill-mode")?).ok_or("bad --kill-mode")?,
            isolate: flag("isolate")?,
            image: flag("image")?,
            proxy_port: get("proxy-port")?.parse().map_err(|_| "bad --proxy-port")?,
            cgroup: flag("cgroup")?,
            ca_pem: match get("ca")?.as_str() {
                "-" => None,
                pem if pem.starts_with("-----BEGIN CERTIFICATE-----") => Some(pem.to_owned()),
                _ => return Err("bad --ca".into()),
            },
        })
    }

    /// The container's hostname.
    pub fn hostname(&self) -> String {
        let short: String = self.id.chars().take(12).collect();
        format!("stockade-{short}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let a = Args {
            id: "0123456789abcdef".into(),
            kill_mode: KillMode::ProcessGroup,
            isolate: true,
            image: false,
            proxy_port: 3128,
            cgroup: true,
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n".into()),
        };
        let argv: Vec<OsString> = a.to_args().into_iter().map(OsString::from).collect();
        assert_eq!(Args::parse(&argv).unwrap(), a);
        assert_eq!(a.hostname(), "stockade-0123456789ab");
    }
}
