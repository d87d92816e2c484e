//! What a container's root filesystem holds (invariant 11; docs/SECURITY.md, "Exactly
//! what a container sees"): the plan, as pure functions over a listing of the source.
//! [`super::mounts`] carries it out.
//!
//! The root is a read-only tmpfs that is not the host's, holding:
//! * from the source, read-only (`nosuid,nodev`): with `rootfs = "host"`, `/usr` and the
//!   `/bin`, `/sbin`, `/lib*` links (or directories, where the host is not merged-usr);
//!   with `rootfs = DIR`, every top-level entry of the image but the reserved ones;
//! * an `/etc` made for the container: `passwd`/`group` with its own users (`root`,
//!   `sandbox` = 1000, `nobody`), `hosts`, `hostname`, `resolv.conf`, `nsswitch.conf`;
//!   plus, from the source's `/etc`, read-only: with the host, an allowlist (CA
//!   certificates, the dynamic linker's cache, `alternatives`, time zone, language
//!   runtimes' configuration; never `shadow`, host keys or credentials); with an image,
//!   everything but what is generated and `shadow`/`gshadow`;
//! * `/proc` (masked), `/dev` (six devices), `/tmp`, `/workspace`, `/artifacts`,
//!   an empty `/run`, and a `/var` holding only `tmp` → `/tmp` (an image's `/var` is
//!   not used: it would be read-only, and tools write there).

use std::path::PathBuf;

/// What a listing says one entry of the source is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink and its target.
    Link(PathBuf),
    /// Anything else (sockets, devices, fifos): never part of a container.
    Other,
}

/// Where the root comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A curated view of this machine.
    Host,
    /// An unpacked image: a directory holding a distribution's root.
    Image(PathBuf),
}

impl Source {
    /// `substrate.rootfs`: `host` or a directory.
    pub fn from_config(rootfs: &str) -> Source {
        if rootfs == "host" {
            Source::Host
        } else {
            Source::Image(PathBuf::from(rootfs))
        }
    }
}

/// One step of building the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A read-only (`nosuid,nodev`) recursive bind of the source's entry at the same
    /// name: a directory or a file.
    Bind(String, Kind),
    /// A symlink with the source's target.
    Link(String, PathBuf),
}

/// Top-level names the container builds itself: never taken from the source.
pub const RESERVED: &[&str] = &[
    "proc",
    "sys",
    "dev",
    "tmp",
    "workspace",
    "artifacts",
    "etc",
    "run",
    "var",
];

/// The host's top-level entries a container sees.
pub const HOST_TOP: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// `/etc` entries of the host a container sees (exact names).
pub const HOST_ETC: &[&str] = &[
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "debian_version",
    "lsb-release",
    "bash.bashrc",
    "profile",
    "profile.d",
    "inputrc",
    "magic",
    "magic.mime",
    "gitconfig",
    "perl",
    "nanorc",
    "vim",
];

/// `/etc` entries of the host a container sees (prefixes: language runtimes).
pub const HOST_ETC_PREFIXES: &[&str] = &["python3", "java-", "node"];

/// `/etc` files the container gets made for it; never taken from the source.
pub const GENERATED_ETC: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
];

/// `/etc` entries of an image a container never sees.
pub const IMAGE_ETC_HIDDEN: &[&str] = &["shadow", "gshadow", "shadow-", "gshadow-"];

fn step(name: &str, kind: &Kind) -> Option<Step> {
    match kind {
        Kind::Dir | Kind::File => Some(Step::Bind(name.to_string(), kind.clone())),
        Kind::Link(t) => Some(Step::Link(name.to_string(), t.clone())),
        Kind::Other => None,
    }
}

/// The top level of the root, from a listing of the source's `/` (pure).
pub fn top_level(source: &Source, listing: &[(String, Kind)]) -> Vec<Step> {
    listing
        .iter()
        .filter(|(name, _)| match source {
            Source::Host => HOST_TOP.contains(&name.as_str()),
            Source::Image(_) => !RESERVED.contains(&name.as_str()),
        })
        .filter_map(|(name, kind)| step(name, kind))
        .collect()
}

/// What of the source's `/etc` is bound into the container's (pure).
pub fn etc(source: &Source, listing: &[(String, Kind)]) -> Vec<Step> {
    listing
        .iter()
        .filter(|(name, _)| !GENERATED_ETC.contains(&name.as_str()))
        .filter(|(name, _)| match source {
            Source::Host => {
                HOST_ETC.contains(&name.as_str())
                    || HOST_ETC_PREFIXES.iter().any(|p| name.starts_with(p))
            }
            Source::Image(_) => !IMAGE_ETC_HIDDEN.contains(&name.as_str()),
        })
        .filter_map(|(name, kind)| step(name, kind))
        .collect()
}

/// The files made for the container's `/etc` (pure).
pub fn generated_etc(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/sh\n\
             sandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                .into(),
        ),
        (
            "group",
            "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n".into(),
        ),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost\n"),
        ),
        ("hostname", format!("{hostname}\n")),
        (
            "resolv.conf",
            "# No resolver: the container reaches the network only through the egress\n\
             # proxy (HTTP_PROXY, HTTPS_PROXY), which resolves names itself.\n"
                .into(),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n\
             protocols: files\nservices: files\n"
                .into(),
        ),
    ]
}

/// Where a container finds its egress CA (docs/EGRESS.md, "HTTPS: interception"): the CA
/// alone, and the source's system bundle with the CA appended. Clients are pointed at
/// them by environment (`exec::default_env`), and the bundle is also bound over the
/// system bundle's own path, so a client that reads only the system store trusts it too.
pub const CA_DIR: &str = "stockade";
/// The CA alone (`/etc/stockade/ca.pem`).
pub const CA_FILE: &str = "/etc/stockade/ca.pem";
/// The system bundle plus the CA (`/etc/stockade/ca-bundle.pem`).
pub const CA_BUNDLE: &str = "/etc/stockade/ca-bundle.pem";

/// Where distributions keep the system CA bundle, under `/etc` (Debian/Ubuntu,
/// Fedora/RHEL, Alpine/Arch), in the order they are tried.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "ssl/certs/ca-certificates.crt",
    "pki/tls/certs/ca-bundle.crt",
    "ssl/cert.pem",
];

/// Largest system bundle taken into the container's bundle (the root is a 4 MiB
/// tmpfs; Debian's is about 220 KiB).
pub const MAX_SYSTEM_BUNDLE: u64 = 1 << 20;

/// The container's bundle: the system's, then the CA (pure).
pub fn ca_bundle(system: &str, ca_pem: &str) -> String {
    let mut out = String::with_capacity(system.len() + ca_pem.len() + 64);
    out.push_str(system);
    if !system.is_empty() && !system.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("# Stockade egress CA of this container (its key never leaves the host)\n");
    out.push_str(ca_pem);
    out
}

/// runc's masked paths under `/proc`: files read as empty (`/dev/null`), directories
/// as an empty read-only tmpfs.
pub const MASKED: &[&str] = &[
    "acpi",
    "asound",
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "scsi",
];

/// runc's read-only paths under `/proc` (`sysrq-trigger` is one: masked by
/// `/dev/null` it would open for writing), and `pressure` (writable PSI triggers).
pub const READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger", "pressure"];

/// The devices a container gets (bound from the host's `/dev`).
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, kind: Kind) -> (String, Kind) {
        (name.to_string(), kind)
    }

    #[test]
    fn the_host_top_level_is_usr_and_its_links_only() {
        let listing = vec![
            l("usr", Kind::Dir),
            l("bin", Kind::Link("usr/bin".into())),
            l("lib64", Kind::Link("usr/lib64".into())),
            l("sbin", Kind::Dir),
            l("etc", Kind::Dir),
            l("root", Kind::Dir),
            l("home", Kind::Dir),
            l("var", Kind::Dir),
            l("work", Kind::Dir),
            l("opt", Kind::Dir),
            l("initrd.img", Kind::Link("boot/initrd".into())),
        ];
        assert_eq!(
            top_level(&Source::Host, &listing),
            [
                Step::Bind("usr".into(), Kind::Dir),
                Step::Link("bin".into(), "usr/bin".into()),
                Step::Link("lib64".into(), "usr/lib64".into()),
                Step::Bind("sbin".into(), Kind::Dir),
            ]
        );
    }

    #[test]
    fn an_image_gives_everything_but_what_the_container_builds() {
        let listing = vec![
            l("usr", Kind::Dir),
            l("opt", Kind::Dir),
            l("proc", Kind::Dir),
            l("etc", Kind::Dir),
            l("tmp", Kind::Dir),
            l("var", Kind::Dir),
            l("bin", Kind::Link("usr/bin".into())),
            l("weird", Kind::Other),
        ];
        assert_eq!(
            top_level(&Source::Image("/img".into()), &listing),
            [
                Step::Bind("usr".into(), Kind::Dir),
                Step::Bind("opt".into(), Kind::Dir),
                Step::Link("bin".into(), "usr/bin".into()),
            ]
        );
    }

    #[test]
    fn the_hosts_etc_is_an_allowlist_without_secrets() {
        let listing = vec![
            l("shadow", Kind::File),
            l("passwd", Kind::File),
            l("ssh", Kind::Dir),
            l("sudoers", Kind::File),
            l("ssl", Kind::Dir),
            l("alternatives", Kind::Dir),
            l("python3.11", Kind::Dir),
            l("os-release", Kind::Link("../usr/lib/os-release".into())),
            l("machine-id", Kind::File),
        ];
        assert_eq!(
            etc(&Source::Host, &listing),
            [
                Step::Bind("ssl".into(), Kind::Dir),
                Step::Bind("alternatives".into(), Kind::Dir),
                Step::Bind("python3.11".into(), Kind::Dir),
                Step::Link("os-release".into(), "../usr/lib/os-release".into()),
            ]
        );
    }

    #[test]
    fn an_images_etc_loses_only_shadow_and_what_is_generated() {
        let listing = vec![
            l("shadow", Kind::File),
            l("passwd", Kind::File),
            l("hosts", Kind::File),
            l("apt", Kind::Dir),
            l("ssl", Kind::Dir),
        ];
        assert_eq!(
            etc(&Source::Image("/img".into()), &listing),
            [
                Step::Bind("apt".into(), Kind::Dir),
                Step::Bind("ssl".into(), Kind::Dir),
            ]
        );
    }

    #[test]
    fn the_ca_bundle_is_the_system_bundle_then_the_ca() {
        let ca = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
        let b = ca_bundle("SYSTEM", ca);
        assert!(b.starts_with("SYSTEM\n# Stockade"), "{b}");
        assert!(b.ends_with(ca));
        assert!(ca_bundle("", ca).starts_with("# Stockade"));
        assert!(CA_FILE.starts_with(&format!("/etc/{CA_DIR}/")));
        assert!(CA_BUNDLE.starts_with(&format!("/etc/{CA_DIR}/")));
    }

    #[test]
    fn the_generated_etc_names_the_workload_user_and_no_resolver() {
        let files = generated_etc("stockade-abc");
        let get = |n: &str| files.iter().find(|(f, _)| *f == n).unwrap().1.clone();
        assert!(get("passwd").contains("sandbox:x:1000:1000:sandbox:/workspace"));
        assert!(get("hosts").contains("localhost stockade-abc"));
        assert!(!get("resolv.conf").contains("nameserver"));
        let names: Vec<_> = files.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, GENERATED_ETC);
    }
}
