//! Benchmark 13: the peers, as whole processes, in the same run. One
//! command's cost end to end, each started as a process and waited for:
//!
//! * `stockade exec KEY -- /bin/true` on a warm key: the CLI binary, its HTTP call to
//!   this bench's API, the fence (grant, run, kill, revoke) in a running container;
//! * `runc run` of `/bin/true` (Debian's runc) in a new container with a user namespace
//!   (65536 ids mapped), pid/net/ipc/uts/mount/cgroup namespaces, a seccomp denylist and
//!   limits (pids, memory, cpu), on a read-only root filesystem;
//! * `bwrap` with the cold section's isolation (`--unshare-all`, uid 1000, read-only
//!   `/usr`);
//! * `podman exec` of `/bin/true` into a running container (Debian's podman over runc:
//!   crun refuses this machine's hybrid cgroup layout).
//!
//! Interleaved: a round runs each once. The root filesystem of runc's and podman's
//! containers is built here from the host's own binaries (`sh`, `true`, `sleep`, their
//! libc and loader): no registry pull; podman gets it by `podman import` of a tarball.
//! Everything the peers create is the bench's: podman runs with its storage, run and
//! temp directories under the bench's data directory (removed at the end) and a cgroup
//! parent of its own, runc with a cgroup path of its own; both are removed at the end,
//! and a leftover cgroup directory is swept from every hierarchy. A peer whose binary
//! is missing is reported, not measured (`scripts/bench` installs runc and podman).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Syscalls runc's seccomp profile answers `EPERM` (the families our filter denies).
const RUNC_DENIED: &[&str] = &[
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "process_vm_readv",
    "process_vm_writev",
];

fn available(bin: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run `c` to completion, timed; it must succeed.
fn timed(what: &str, c: &mut Command) -> Duration {
    c.stdin(Stdio::null()).stdout(Stdio::null());
    let t = Instant::now();
    let out = c.stderr(Stdio::piped()).output().expect(what);
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "{what} failed: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

/// A root filesystem from the host's own binaries: `sh`, `true`, `sleep`, libc and
/// the loader, in a merged-`/usr` layout.
fn build_rootfs(root: &Path) {
    for d in [
        "usr/bin",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "usr/lib64",
        "proc",
        "dev",
        "sys",
        "tmp",
        "etc",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    for (from, to) in [
        ("/bin/sh", "usr/bin/sh"),
        ("/bin/true", "usr/bin/true"),
        ("/bin/sleep", "usr/bin/sleep"),
    ] {
        std::fs::copy(from, root.join(to)).unwrap();
    }
    // The libraries `true` and `sleep` link, wherever this distribution keeps them.
    for lib in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/lib/ld-linux-aarch64.so.1",
    ] {
        if Path::new(lib).exists() {
            let rel = lib.trim_start_matches('/');
            let to = root.join("usr").join(rel.trim_start_matches("usr/"));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(lib, to).unwrap();
        }
    }
}

/// runc's bundle: the OCI config for `/bin/true` with a user namespace, seccomp and
/// limits.
fn runc_config(cgroup: &str) -> serde_json::Value {
    let scmp = if cfg!(target_arch = "aarch64") {
        "SCMP_ARCH_AARCH64"
    } else {
        "SCMP_ARCH_X86_64"
    };
    let ns: Vec<_> = ["pid", "network", "ipc", "uts", "mount", "user", "cgroup"]
        .iter()
        .map(|t| serde_json::json!({ "type": t }))
        .collect();
    let ids = serde_json::json!([{ "containerID": 0, "hostID": 3_900_000_000u32, "size": 65536 }]);
    serde_json::json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": ["/bin/true"],
            "env": ["PATH=/usr/bin:/bin"],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {
                "bounding": [], "effective": [], "permitted": [], "ambient": []
            },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024 }]
        },
        "root": { "path": "rootfs", "readonly": true },
        "hostname": "peers",
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "nodev", "mode=1777"] }
        ],
        "linux": {
            "namespaces": ns,
            "uidMappings": ids,
            "gidMappings": ids,
            "cgroupsPath": cgroup,
            "resources": {
                "devices": [{ "allow": false, "access": "rwm" }],
                "pids": { "limit": 64 },
                "memory": { "limit": 268_435_456u64 },
                "cpu": { "quota": 100000, "period": 100000 }
            },
            "seccomp": {
                "defaultAction": "SCMP_ACT_ALLOW",
                "architectures": [scmp],
                "syscalls": [{ "names": RUNC_DENIED, "action": "SCMP_ACT_ERRNO", "errnoRet": 1 }]
            },
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

/// Remove cgroup directory `rel` (and what is below it, deepest first) from every
/// hierarchy under `/sys/fs/cgroup`: runc and podman create it in each v1 hierarchy
/// and in the v2 one.
fn sweep_cgroup(rel: &str) {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut hierarchies = vec![PathBuf::from("/sys/fs/cgroup")];
    for e in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            hierarchies.push(e.path());
        }
    }
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
        out.push(d.to_path_buf());
    }
    for h in hierarchies {
        let d = h.join(rel.trim_start_matches('/'));
        if d.is_dir() {
            walk(&d, &mut dirs);
        }
    }
    for d in dirs {
        if let Err(e) = std::fs::remove_dir(&d) {
            println!("  peers: could not remove {}: {e}", d.display());
        }
    }
}

/// podman with everything of its own under `dir` and the bench's cgroup parent.
struct Podman {
    dir: PathBuf,
    cgroup_parent: String,
}

impl Podman {
    fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        let d = &self.dir;
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("run"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--runtime",
                "runc",
                "--events-backend",
                "none",
            ]);
        c
    }

    /// Import the root filesystem and start `sleep` in a container.
    fn start(&self, rootfs: &Path) {
        std::fs::create_dir_all(self.dir.join("tmp")).unwrap();
        let tar = self.dir.join("rootfs.tar");
        timed(
            "tar",
            Command::new("tar")
                .arg("-C")
                .arg(rootfs)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        timed(
            "podman import",
            self.cmd()
                .args(["import", "-q"])
                .arg(&tar)
                .arg("localhost/stockade-bench-peers:1"),
        );
        timed(
            "podman run",
            self.cmd().args([
                "run",
                "-d",
                "--name",
                "stockade-bench-peers",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--pids-limit",
                "64",
                "--memory",
                "256m",
                "--cgroup-parent",
                &self.cgroup_parent,
                "localhost/stockade-bench-peers:1",
                "/bin/sleep",
                "100000",
            ]),
        );
    }

    fn exec_true(&self) -> Duration {
        timed(
            "podman exec",
            self.cmd()
                .args(["exec", "stockade-bench-peers", "/bin/true"]),
        )
    }
}

/// The container, the image and the cgroup parent go, also when a step panicked.
impl Drop for Podman {
    fn drop(&mut self) {
        let quiet = |c: &mut Command| {
            let _ = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
        };
        quiet(
            self.cmd()
                .args(["rm", "-f", "-t", "0", "stockade-bench-peers"]),
        );
        quiet(
            self.cmd()
                .args(["rmi", "-f", "localhost/stockade-bench-peers:1"]),
        );
        sweep_cgroup(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// runc's bundle directory, outside the bench's data directory (0700: the container's
/// mapped root could not reach its root filesystem there); removed on drop.
struct Bundle(PathBuf);

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn run(env: &Env) -> Vec<Row> {
    let tag = &env.marker[..12];
    let bundle = Bundle(std::env::temp_dir().join(format!("stockade-bench-peers-{tag}")));
    std::fs::create_dir(&bundle.0).unwrap();
    std::fs::set_permissions(
        &bundle.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let dir = env.cleanup.data.join("peers");
    let rootfs = bundle.0.join("rootfs");
    build_rootfs(&rootfs);
    let runc_cgroup = format!("/stockade-bench-peers-{tag}-runc");
    let runc = available("runc");
    if runc {
        let config = runc_config(&runc_cgroup);
        std::fs::write(
            bundle.0.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
    }
    let bwrap = available("bwrap");
    let podman_present = available("podman");
    let podman = podman_present.then(|| Podman {
        dir: dir.join("podman"),
        cgroup_parent: format!("/stockade-bench-peers-{tag}-podman"),
    });
    if let Some(p) = &podman {
        tokio::task::block_in_place(|| p.start(&rootfs));
    }

    // A warm key: its container runs, its instance is pooled.
    let key = "bench-peers";
    let o = env.rt.exec(key, &true_input()).await.expect("warm exec");
    assert_eq!(o.exit_code, 0);
    let stockade = stockade_exe();
    let server = format!("http://{}", env.api);

    let n = iters(20).max(3);
    let (mut s, mut r, mut b, mut p) = (vec![], vec![], vec![], vec![]);
    tokio::task::block_in_place(|| {
        for i in 0..n + 1 {
            let a = timed(
                "stockade exec",
                Command::new(&stockade)
                    .args(["--server", &server, "--token", &env.token, "exec", key])
                    .args(["--", "/bin/true"]),
            );
            let rr = runc.then(|| {
                timed(
                    "runc run",
                    Command::new("runc")
                        .arg("run")
                        .arg("--bundle")
                        .arg(&bundle.0)
                        .arg(format!("stockade-bench-peers-{tag}-{i}")),
                )
            });
            let bb = bwrap.then(|| timed("bwrap", Command::new("bwrap").args(BWRAP)));
            let pp = podman.as_ref().map(|p| p.exec_true());
            if i > 0 {
                s.push(a);
                r.extend(rr);
                b.extend(bb);
                p.extend(pp);
            }
        }
    });
    tokio::task::block_in_place(|| drop(podman));
    if runc {
        sweep_cgroup(&runc_cgroup);
    }

    let s = Stats::of(s);
    detail("stockade exec /bin/true (warm key, CLI)", &s);
    let mut rows = Vec::new();
    let peers = [
        ("runc run (userns, seccomp, limits)", r, runc, "runc"),
        ("bwrap (--unshare-all, uid 1000)", b, bwrap, "bwrap"),
        (
            "podman exec into a running container",
            p,
            podman_present,
            "podman",
        ),
    ];
    for (name, samples, present, bin) in peers {
        if !present {
            println!("  peers: {bin} is not installed: no {name} row");
            continue;
        }
        let st = Stats::of(samples);
        detail(name, &st);
        rows.push(row(
            "13",
            format!("peers: `stockade exec /bin/true` on a warm key vs {name} (median of {n})"),
            format!("{} (p95 {})", fmt_d(s.median), fmt_d(s.p95)),
            format!("{bin} {} (p95 {})", fmt_d(st.median), fmt_d(st.p95)),
            format!("{:.2}×", ratio(s.median, st.median)),
            "–",
            None,
        ));
    }
    rows
}
