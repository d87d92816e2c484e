//! Invariant 11, attacked: the container is a boundary. Every test here runs a hostile
//! command inside a real container through the consumer's path (the guest `.wasm`
//! through the runtime over the linux substrate) and tries to cross one class of the
//! boundary (docs/SECURITY.md lists the classes). Each was watched succeeding against
//! the code before the boundary existed (see docs/INVARIANTS.md).
//!
//! Host-side fixtures live under a per-test directory whose name carries the test's
//! marker and are removed by the test, pass or fail (`Fixture`'s drop).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use stockade_runtime::bindings::{DetachedState, ExecInput, ExecOutcome, ResourceLimit};
use stockade_runtime::substrate::Substrate;

use crate::facade::{Fx, fx, out};
use crate::support::DEADLINE;

/// A host directory created for one test and removed when dropped.
struct Fixture(PathBuf);

impl Fixture {
    fn new(parent: &str, marker: &str) -> Fixture {
        let p = Path::new(parent).join(format!("stockade-attack-{marker}"));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture(p)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `python3 -c script` for `key`, tagged with the test's marker.
fn py(f: &Fx, script: &str) -> ExecInput {
    f.argv(&["python3", "-c", script])
}

async fn exec(f: &Fx, key: &str, input: &ExecInput) -> ExecOutcome {
    f.rt.exec(key, input)
        .await
        .expect("the exec itself succeeds")
}

/// The lines of `o`'s stdout that start with `tag`.
fn tagged(o: &ExecOutcome, tag: &str) -> Vec<String> {
    out(&o.stdout)
        .lines()
        .filter(|l| l.starts_with(tag))
        .map(str::to_string)
        .collect()
}

const LIST_FDS: &str = r#"
import os
fds = []
for x in os.listdir('/proc/self/fd'):
    try:
        os.readlink('/proc/self/fd/' + x)
        fds.append(int(x))
    except OSError:
        pass  # the listing's own descriptor, closed by now
REPORT('FDS %s' % sorted(fds))
"#;

/// Inherited descriptors: a fenced command and a detached process start with exactly
/// fds 0, 1 and 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_workload_starts_with_fds_0_1_2_only() {
    let f = fx(|_| {}).await;
    let o = exec(&f, "fds", &py(&f, &format!("REPORT = print\n{LIST_FDS}"))).await;
    assert_eq!(tagged(&o, "FDS"), ["FDS [0, 1, 2]"], "{o:?}");
    // The detached process reports in a file opened after the listing.
    let detached = format!(
        "def REPORT(line):\n    open('/workspace/fds.txt', 'w').write(line + '\\n')\n{LIST_FDS}"
    );
    let id =
        f.rt.start_detached("fds", &py(&f, &detached))
            .await
            .unwrap();
    wait_detached_exit(&f, "fds", &id).await;
    let o = exec(&f, "fds", &f.sh("cat /workspace/fds.txt")).await;
    assert_eq!(tagged(&o, "FDS"), ["FDS [0, 1, 2]"], "detached: {o:?}");
    f.finish().await;
}

/// Inherited descriptors: walking up (`..`) from every descriptor a workload can name
/// never reaches the host's root (the old fd 4, a directory on the host's cgroup2
/// mount, led to the host's `/`, read-write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_no_descriptor_walks_up_to_the_host() {
    let f = fx(|_| {}).await;
    let probe = Fixture::new("/tmp", &f.marker);
    let name = probe.0.file_name().unwrap().to_str().unwrap().to_string();
    let script = format!(
        r#"
import os
for fd in range(0, 256):
    base = '/proc/self/fd/%d/' % fd
    if not os.path.isdir(base):
        continue
    up = base + '../' * 24
    target = up + 'tmp/{name}'
    if os.path.isdir(target):
        print('ESCAPED via fd', fd)
        try:
            open(target + '/written', 'w').write('x')
            print('ESCAPED-WRITE via fd', fd)
        except OSError as e:
            print('write refused', e)
print('done')
"#
    );
    let o = exec(&f, "walk", &py(&f, &script)).await;
    assert!(out(&o.stdout).contains("done"), "{o:?}");
    assert!(tagged(&o, "ESCAPED").is_empty(), "{}", out(&o.stdout));
    assert!(
        !probe.path("written").exists(),
        "a workload wrote the host's /tmp"
    );
    f.finish().await;
}

/// The supervisor's channel: a workload finds no listening socket to accept the host's
/// requests on (the old fd 3 let a detached process answer a later exec with forged
/// output and read that exec's environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_the_supervisor_socket_cannot_be_reached() {
    let f = fx(|_| {}).await;
    let attacker = r#"
import os, socket, stat
found = []
for fd in range(3, 256):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if stat.S_ISSOCK(st.st_mode):
        s = socket.socket(fileno=fd)
        try:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.append(s)
        except OSError:
            pass
open('/workspace/attacker', 'w').write('listeners %d\n' % len(found))
if found:
    s = found[0]
    while True:
        c, _ = s.accept()
        line = c.makefile('rb').readline()
        open('/workspace/captured', 'ab').write(line)
        c.sendall(b'{"status":"ran","result":{"exit_code":0,"stdout":[70,79,82,71,69,68,10],"stderr":[],"timed_out":false,"truncated":false}}\n')
"#;
    let id =
        f.rt.start_detached("sock", &py(&f, attacker))
            .await
            .unwrap();
    let o = exec(
        &f,
        "sock",
        &f.sh("while [ ! -e /workspace/attacker ]; do sleep 0.05; done; cat /workspace/attacker"),
    )
    .await;
    let found = out(&o.stdout);
    // Force fresh connections to the supervisor: concurrent reads overflow the pool.
    let mut reads = Vec::new();
    for _ in 0..8 {
        let rt = f.rt.clone();
        reads.push(tokio::spawn(async move {
            rt.detached_status("sock", "00000000-0000-4000-8000-000000000000")
                .await
        }));
    }
    for r in reads {
        let _ = r.await;
    }
    for i in 0..6 {
        let mut input = f.sh("echo real");
        input
            .env
            .push(("STOCKADE_SECRET".into(), format!("secret-{}", f.marker)));
        let o = f.rt.exec("sock", &input).await;
        if let Ok(o) = &o {
            assert_eq!(
                out(&o.stdout),
                "real\n",
                "exec {i} answered by the attacker: {o:?}"
            );
        }
    }
    let o = exec(
        &f,
        "sock",
        &f.sh("cat /workspace/captured 2>/dev/null; true"),
    )
    .await;
    assert!(
        !out(&o.stdout).contains(&f.marker),
        "the attacker captured a request: {}",
        out(&o.stdout)
    );
    assert_eq!(
        found, "listeners 0\n",
        "a workload holds a listening socket"
    );
    let _ = f.rt.stop_detached("sock", &id).await;
    f.finish().await;
}

/// Not the host's root: the host's secrets, home directories and projects are not in
/// the container's view, and a root-only host file inside a bound tree is unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_host_files_are_not_visible_or_readable() {
    let f = fx(|_| {}).await;
    let usr = Fixture::new("/usr/local/lib", &f.marker);
    std::fs::write(usr.path("secret"), format!("TOPSECRET-{}", f.marker)).unwrap();
    std::fs::set_permissions(usr.path("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let var = Fixture::new("/var/tmp", &f.marker);
    std::fs::write(var.path("open.txt"), format!("VISIBLE-{}", f.marker)).unwrap();
    let here = std::env::current_dir().unwrap();
    let script = format!(
        r#"
import os
for p in ['/etc/shadow', '/etc/gshadow', '{usr}', '{var}', '/proc/1/environ', '/proc/1/root/etc/hostname']:
    try:
        print('READ', p, open(p).read()[:40])
    except OSError as e:
        print('refused', p, e.errno)
for d in ['/root', '/home', '{here}', '/var/lib', '/work']:
    try:
        print('LISTED', d, os.listdir(d)[:3])
    except OSError as e:
        print('refused', d, e.errno)
"#,
        usr = usr.path("secret").display(),
        var = var.path("open.txt").display(),
        here = here.display(),
    );
    let o = exec(&f, "files", &py(&f, &script)).await;
    assert!(out(&o.stdout).contains("refused /etc/shadow"), "{o:?}");
    assert!(tagged(&o, "READ").is_empty(), "{}", out(&o.stdout));
    assert!(tagged(&o, "LISTED").is_empty(), "{}", out(&o.stdout));
    f.finish().await;
}

/// Host sockets: a root-only (0600) pathname socket inside a bound tree does not
/// answer a workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_root_only_host_socket_does_not_answer() {
    let f = fx(|_| {}).await;
    let dir = Fixture::new("/usr/local/lib", &f.marker);
    let path = dir.path("root.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        r#"
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('{}')
    print('CONNECTED')
except OSError as e:
    print('refused', e.errno)
"#,
        path.display()
    );
    let o = exec(&f, "sock", &py(&f, &script)).await;
    assert!(tagged(&o, "CONNECTED").is_empty(), "{o:?}");
    assert!(
        listener.accept().is_err(),
        "the host socket accepted a workload"
    );
    f.finish().await;
}

/// Devices: a device node inside a bound tree does not open (every mount is `nodev`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_device_node_in_a_bound_tree_does_not_open() {
    let f = fx(|_| {}).await;
    let dir = Fixture::new("/usr/local/lib", &f.marker);
    let node = dir.path("null");
    // /dev/null's numbers (1, 3), mode 0666.
    use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
    mknodat(
        CWD,
        &node,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        makedev(1, 3),
    )
    .expect("mknod");
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = format!(
        r#"
import os
try:
    fd = os.open('{}', os.O_RDWR)
    print('OPENED')
except OSError as e:
    print('refused', e.errno)
"#,
        node.display()
    );
    let o = exec(&f, "dev", &py(&f, &script)).await;
    assert!(out(&o.stdout).contains("refused"), "{o:?}");
    assert!(tagged(&o, "OPENED").is_empty(), "{o:?}");
    f.finish().await;
}

/// Kernel settings: `/proc/sys` and `/proc/sysrq-trigger` do not open for writing, and
/// runc's masked paths read as empty. Nothing is ever written: open only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_proc_is_masked_and_read_only() {
    let f = fx(|_| {}).await;
    let script = r#"
import os
for p in ['/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger', '/proc/sys/vm/drop_caches',
          '/proc/sys/kernel/hostname']:
    try:
        fd = os.open(p, os.O_WRONLY)
        os.close(fd)
        print('WRITABLE', p)
    except OSError as e:
        print('refused', p, e.errno)
for p in ['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug']:
    try:
        data = open(p, 'rb').read(64)
        if data:
            print('UNMASKED', p)
        else:
            print('masked', p)
    except OSError as e:
        print('masked', p, e.errno)
for d in ['/proc/acpi', '/proc/scsi']:
    try:
        if os.listdir(d):
            print('UNMASKED', d)
    except OSError:
        pass
print('sys', os.path.exists('/sys/kernel'))
"#;
    let o = exec(&f, "proc", &py(&f, script)).await;
    assert!(
        out(&o.stdout).contains("refused /proc/sysrq-trigger"),
        "{o:?}"
    );
    assert!(tagged(&o, "WRITABLE").is_empty(), "{}", out(&o.stdout));
    assert!(tagged(&o, "UNMASKED").is_empty(), "{}", out(&o.stdout));
    assert!(out(&o.stdout).contains("sys False"), "no host /sys: {o:?}");
    f.finish().await;
}

/// cgroups: a backgrounded process that tries every way out of its leaf (an inherited
/// cgroup directory, a fresh cgroup2 mount) is still killed by the fence's teardown
/// (invariant 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_workload_cannot_leave_its_cgroup() {
    let f = fx(|_| {}).await;
    let escaper = r#"
import os, subprocess, time
me = str(os.getpid())
moved = False
for fd in range(3, 256):
    base = '/proc/self/fd/%d' % fd
    if not os.path.isdir(base):
        continue
    for rel in ['cgroup.procs', '../cgroup.procs', '../../cgroup.procs']:
        try:
            open(base + '/' + rel, 'w').write(me)
            moved = True
        except OSError:
            pass
os.makedirs('/tmp/cg', exist_ok=True)
r = subprocess.run(['mount', '-t', 'cgroup2', 'none', '/tmp/cg'], capture_output=True)
if r.returncode == 0:
    try:
        open('/tmp/cg/cgroup.procs', 'w').write(me)
        moved = True
    except OSError:
        pass
open('/workspace/escaper', 'w').write('moved %s\n' % moved)
time.sleep(600)
"#;
    let script = format!(
        "python3 -c '{}' & while [ ! -e /workspace/escaper ]; do sleep 0.05; done; cat /workspace/escaper",
        escaper.replace('\'', "'\\''")
    );
    let o = exec(&f, "cg", &f.sh(&script)).await;
    assert!(out(&o.stdout).contains("moved"), "{o:?}");
    f.assert_no_marked("a backgrounded process left its leaf and survived the teardown")
        .await;
    assert_eq!(out(&o.stdout), "moved False\n", "{o:?}");
    f.finish().await;
}

/// seccomp: the kernel surface Docker's default profile closes answers EPERM (clone3
/// ENOSYS, so libc falls back to a clone whose flags the filter can see).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_seccomp_closes_the_kernel_surface() {
    let f = fx(|_| {}).await;
    let script = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno() if r < 0 else 0
    print('SYS', name, 'ok' if r >= 0 else os.strerror(e).replace(' ', '_'))
buf = ctypes.create_string_buffer(256)
call('keyctl', 250, 1, 0)                          # KEYCTL_JOIN_SESSION_KEYRING
call('add_key', 248, ctypes.addressof(ctypes.create_string_buffer(b'user')), ctypes.addressof(ctypes.create_string_buffer(b'k')), ctypes.addressof(buf), 1, -3)
call('bpf', 321, 0, ctypes.addressof(buf), 72)     # BPF_MAP_CREATE
call('perf_event_open', 298, ctypes.addressof(buf), 0, -1, -1, 0)
call('unshare_user', 272, 0x10000000)              # CLONE_NEWUSER
call('unshare_net', 272, 0x40000000)               # CLONE_NEWNET
call('mount', 165, ctypes.addressof(ctypes.create_string_buffer(b'none')), ctypes.addressof(ctypes.create_string_buffer(b'/tmp')), ctypes.addressof(ctypes.create_string_buffer(b'tmpfs')), 0, 0)
call('userfaultfd', 323, 0)
call('clone3', 435, 0, 0)
for l in open('/proc/self/status'):
    if l.startswith('Seccomp:'):
        print('STATUS', l.split()[1])
"#;
    let o = exec(&f, "sec", &py(&f, script)).await;
    let s = out(&o.stdout);
    for name in [
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "unshare_user",
        "unshare_net",
        "mount",
        "userfaultfd",
    ] {
        assert!(
            s.contains(&format!("SYS {name} Operation_not_permitted")),
            "{name}:\n{s}\n{}",
            out(&o.stderr)
        );
    }
    assert!(s.contains("SYS clone3 Function_not_implemented"), "{s}");
    assert!(s.contains("STATUS 2"), "a seccomp filter is installed: {s}");
    let o = exec(&f, "sec", &f.sh("unshare -U true && echo NESTED-USERNS")).await;
    assert!(!out(&o.stdout).contains("NESTED"), "{o:?}");
    f.finish().await;
}

/// Limits: a fork bomb stops at the pids limit and the host and another key keep
/// working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_fork_bomb_stops_at_the_pids_limit() {
    let f = fx(|c| c.substrate.limits.pids = 128).await;
    let bomb = r#"
import os, time
n = 0
while n < 1500:
    try:
        pid = os.fork()
    except OSError as e:
        print('EAGAIN' if e.errno == 11 else e)
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    n += 1
print('FORKED', n)
"#;
    let o = exec(&f, "bomb", &py(&f, bomb)).await;
    let forked: u32 = tagged(&o, "FORKED")
        .first()
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u32::MAX);
    assert!(forked < 128, "the pids limit held: {o:?}");
    assert!(out(&o.stdout).contains("EAGAIN"), "{o:?}");
    assert_eq!(
        o.limits,
        [ResourceLimit::Pids],
        "the exec says which limit: {o:?}"
    );
    f.assert_no_marked("the bomb's children die with the fence")
        .await;
    // The classic shell bomb, which never ends by itself: the fence's timeout ends it,
    // the teardown kills every copy, and the host and another key keep working. The
    // command's own shell forks once, before the bomb starts (the subshell that lights
    // it), then becomes `sleep` by exec: a shell that had to fork again once the bomb
    // held every pid (a `sleep`, or the bomb's second half when the first half's
    // children outran it on the other core) failed with "Cannot fork" and ended the
    // command (exit 2) before its timeout.
    let mut bomb = f.sh("(b() { b | b & }; b); exec sleep 30");
    bomb.timeout_ms = Some(3000);
    let o = exec(&f, "bomb", &bomb).await;
    assert!(o.timed_out, "{o:?}");
    assert!(o.limits.contains(&ResourceLimit::Pids), "{o:?}");
    f.assert_no_marked("the shell bomb dies with the fence")
        .await;
    let other = exec(&f, "bystander", &f.sh("echo alive")).await;
    assert_eq!(out(&other.stdout), "alive\n");
    let again = exec(&f, "bomb", &f.sh("echo recovered")).await;
    assert_eq!(out(&again.stdout), "recovered\n", "{again:?}");
    f.finish().await;
}

/// Limits: a memory hog is killed at the memory limit; the fence ends with a clear
/// outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_memory_hog_stops_at_the_memory_limit() {
    let f = fx(|c| c.substrate.limits.memory_mib = 256).await;
    let hog = r#"
chunks = []
for i in range(96):
    b = bytearray(32 * 1024 * 1024)
    for j in range(0, len(b), 4096):
        b[j] = 1
    chunks.append(b)
print('ALLOCATED', len(chunks) * 32, 'MiB')
"#;
    let o = exec(&f, "hog", &py(&f, hog)).await;
    assert!(
        tagged(&o, "ALLOCATED").is_empty(),
        "3 GiB were allowed: {o:?}"
    );
    assert_eq!(o.exit_code, -9, "killed by the OOM killer: {o:?}");
    assert_eq!(
        o.limits,
        [ResourceLimit::Memory],
        "the exec says which limit: {o:?}"
    );
    // The container (its supervisor) survived its workload's OOM kill.
    let again = exec(&f, "hog", &f.sh("echo alive")).await;
    assert_eq!(out(&again.stdout), "alive\n", "{again:?}");
    let other = exec(&f, "bystander", &f.sh("echo alive")).await;
    assert_eq!(out(&other.stdout), "alive\n");
    f.finish().await;
}

/// Limits: a workload is the OOM killer's first choice (`oom_score_adj` 1000), never
/// its supervisor, whose score stays the host's. The workload child shares the
/// supervisor's memory until its exec, and the kernel gives a score written
/// then to every process sharing that memory: written by the child, it raised the
/// supervisor to 1000 at the first spawn, and a container whose workload ran many
/// small processes could lose its supervisor to the OOM killer first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_the_supervisor_is_never_the_oom_killers_first_choice() {
    let f = fx(|_| {}).await;
    let host = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    let adj = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok();
    for _ in 0..3 {
        let o = exec(&f, "oom", &f.sh("true")).await;
        assert_eq!(o.exit_code, 0, "{o:?}");
    }
    let c = f
        .linux
        .current("oom")
        .await
        .unwrap()
        .expect("the container");
    let id =
        f.rt.start_detached("oom", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    // The workload's score (set right after its exec): waited for, with a deadline.
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let scores: Vec<_> = f.marked().into_iter().filter_map(adj).collect();
        if scores.len() == 1 && scores[0] == "1000\n" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the workload's oom_score_adj: {scores:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sup = f.linux.supervisor_pid(&c).expect("the supervisor's pid");
    assert_eq!(
        adj(sup).as_deref(),
        Some(host.as_str()),
        "the supervisor's oom_score_adj is the host's"
    );
    f.rt.stop_detached("oom", &id).await.unwrap();
    f.finish().await;
}

/// Limits: writes past the disk cap fail with ENOSPC, in `/workspace` and `/tmp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_writes_past_the_disk_cap_fail() {
    let f = fx(|c| {
        c.substrate.limits.disk_mib = 64;
        c.substrate.limits.memory_mib = 512;
    })
    .await;
    for dir in ["/workspace", "/tmp", "/artifacts"] {
        let o = exec(
            &f,
            "disk",
            &f.sh(&format!(
                "dd if=/dev/zero of={dir}/big bs=1M count=256 2>&1"
            )),
        )
        .await;
        assert!(
            out(&o.stdout).contains("No space left on device"),
            "{dir}: {o:?}"
        );
        assert_eq!(o.limits, [ResourceLimit::Disk], "{dir}: {o:?}");
        let o = exec(&f, "disk", &f.sh(&format!("rm {dir}/big && echo freed"))).await;
        assert_eq!(
            (out(&o.stdout).as_str(), o.limits.len()),
            ("freed\n", 0),
            "{o:?}"
        );
    }
    // The three share one cap: what /tmp holds, /workspace cannot.
    let o = exec(
        &f,
        "disk",
        &f.sh("dd if=/dev/zero of=/tmp/half bs=1M count=40 2>/dev/null; dd if=/dev/zero of=/workspace/half bs=1M count=40 2>&1"),
    )
    .await;
    assert!(out(&o.stdout).contains("No space left on device"), "{o:?}");
    f.finish().await;
}

/// A host directory of 50 files, each `HOSTSECRET-<marker>`: what no archive of a
/// workspace may ever hold.
fn host_secrets(f: &Fx) -> Fixture {
    let secret = Fixture::new("/var/tmp", &f.marker);
    for i in 0..50 {
        std::fs::write(
            secret.path(&format!("s{i}")),
            format!("HOSTSECRET-{}", f.marker),
        )
        .unwrap();
    }
    secret
}

/// Start, detached in `key`'s container, a process that swaps a directory of the
/// workspace with a symlink onto `secret` as fast as it can (RENAME_EXCHANGE); return
/// once it is swapping.
async fn start_flipping(f: &Fx, key: &str, secret: &Fixture) {
    let flipper = format!(
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir('/workspace')
os.makedirs('d', exist_ok=True)
for i in range(200):
    open('d/f%d' % i, 'w').write('x')
if not os.path.lexists('s'):
    os.symlink('{}', 's')
open('/workspace/flipping', 'w').write('1')
while True:
    libc.renameat2(-100, b'd', -100, b's', 2)   # RENAME_EXCHANGE
"#,
        secret.0.display()
    );
    f.rt.start_detached(key, &py(f, &flipper)).await.unwrap();
    let o = exec(
        f,
        key,
        &f.sh("while [ ! -e /workspace/flipping ]; do sleep 0.02; done; sleep 0.3; echo up"),
    )
    .await;
    assert_eq!(out(&o.stdout), "up\n", "{o:?}");
}

/// Does the gzipped tar `archive` hold a file written by [`host_secrets`]?
fn holds_a_host_file(archive: &Path) -> bool {
    let listing = std::process::Command::new("tar")
        .arg("-xzOf")
        .arg(archive)
        .output()
        .unwrap();
    String::from_utf8_lossy(&listing.stdout).contains("HOSTSECRET")
}

/// Checkpoint: a symlink flipped in for a directory while the snapshot runs is
/// archived as a symlink and never followed: no host file enters the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_checkpoint_never_follows_a_flipping_symlink() {
    let f = fx(|_| {}).await;
    let secret = host_secrets(&f);
    let snap = f
        .data
        .join("snapshots")
        .join(format!("{}.tar.gz", hex("flip")));
    for round in 0..8 {
        start_flipping(&f, "flip", &secret).await;
        f.rt.checkpoint("flip").await.unwrap();
        assert!(
            !holds_a_host_file(&snap),
            "round {round}: a host file entered the snapshot"
        );
    }
    f.finish().await;
}

/// A named snapshot and a fork: a hostile workspace flipping a symlink onto a host
/// directory while it is archived puts no host file in the archive, a fork onto
/// another key gives that key none either, and a name that would leave the snapshots
/// directory is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_named_snapshot_and_its_fork_never_carry_a_host_file() {
    let f = fx(|_| {}).await;
    let secret = host_secrets(&f);
    start_flipping(&f, "nsrc", &secret).await;
    let archive = f
        .data
        .join("snapshots/named")
        .join(hex("nsrc"))
        .join("v1.tar.gz");
    for round in 0..4 {
        f.rt.save_snapshot("nsrc", "v1").await.unwrap();
        assert!(
            !holds_a_host_file(&archive),
            "round {round}: a host file entered the named snapshot"
        );
    }
    f.rt.fork("nfork", "nsrc", "v1").await.unwrap();
    let o = exec(
        &f,
        "nfork",
        &f.sh("cat /workspace/s/* /workspace/d/* 2>/dev/null; ls -la /workspace/s; true"),
    )
    .await;
    assert!(
        !out(&o.stdout).contains("HOSTSECRET"),
        "the fork reads a host file: {o:?}"
    );
    for bad in ["../../escape", "..", "a/b", ".hidden"] {
        let r = f.rt.save_snapshot("nsrc", bad).await;
        assert!(r.is_err(), "{bad:?} was saved");
        let r = f.rt.fork("nfork2", "nsrc", bad).await;
        assert!(r.is_err(), "a fork of {bad:?} was made");
    }
    let named = f.data.join("snapshots/named");
    let mut found = Vec::new();
    for d in std::fs::read_dir(&named).unwrap() {
        for e in std::fs::read_dir(d.unwrap().path()).unwrap() {
            found.push(e.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    assert_eq!(found, ["v1.tar.gz"], "only the one snapshot was written");
    assert!(
        !f.data.join("escape.tar.gz").exists() && !f.data.join("snapshots/escape.tar.gz").exists()
    );
    f.rt.abort("nfork").await.unwrap();
    f.finish().await;
}

/// The data directory is private: 0700, its database and snapshots 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_the_data_directory_is_private() {
    let f = fx(|_| {}).await;
    exec(&f, "priv", &f.sh("echo x > /workspace/f")).await;
    f.rt.checkpoint("priv").await.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&f.data), 0o700, "{}", f.data.display());
    for e in std::fs::read_dir(&f.data).unwrap().flatten() {
        let p = e.path();
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&p), want, "{}", p.display());
    }
    for e in std::fs::read_dir(f.data.join("snapshots"))
        .unwrap()
        .flatten()
    {
        assert_eq!(mode(&e.path()), 0o600, "{}", e.path().display());
    }
    f.finish().await;
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Poll a detached process until it is no longer running.
async fn wait_detached_exit(f: &Fx, key: &str, id: &str) {
    let end = std::time::Instant::now() + DEADLINE;
    while f.rt.detached_status(key, id).await.unwrap() == DetachedState::Running {
        assert!(std::time::Instant::now() < end, "{id} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An unprivileged identity: workloads are uid/gid 1000 of the container's own user
/// namespace, which maps onto a host range no other container shares; `/workspace`
/// and `/artifacts` belong to it; on the host its processes are that range's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_each_container_has_its_own_unprivileged_identity() {
    let f = fx(|_| {}).await;
    let script = "id -u; id -g; cat /proc/self/uid_map; stat -c '%u:%g' /workspace /artifacts; \
                  stat -c '%a' /tmp; grep CapEff /proc/self/status; \
                  grep NoNewPrivs /proc/self/status; exec sleep 1000";
    let mut ids = Vec::new();
    for key in ["id-a", "id-b"] {
        let rt = f.rt.clone();
        let input = f.sh(script);
        let k = key.to_string();
        let run = tokio::spawn(async move { rt.exec(&k, &input).await });
        // While it sleeps: its host uid, read on the host.
        let c = loop {
            if let Some(c) = f.linux.current(key).await.unwrap() {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (root, workload) = f.linux.host_ids(&c).expect("a live container");
        let end = std::time::Instant::now() + DEADLINE;
        let pid = loop {
            let marked = f.marked();
            if let Some(p) = marked.iter().find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with("sleep"))
            }) {
                break *p;
            }
            assert!(std::time::Instant::now() < end, "the workload never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == workload.to_string()),
            "host view of the workload: {uid_line} (want {workload})"
        );
        assert!(
            (2_000_000_000..2_000_000_000 + 64 * 65_536).contains(&root),
            "{root}"
        );
        f.linux.kill_all(&c).await.unwrap();
        let o = run.await.unwrap().unwrap();
        let lines: Vec<String> = out(&o.stdout).lines().map(str::to_string).collect();
        assert_eq!(lines[0], "1000", "{o:?}");
        assert_eq!(lines[1], "1000", "{o:?}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["0", &root.to_string(), "65536"],
            "{o:?}"
        );
        assert_eq!(lines[3..5], ["1000:1000", "1000:1000"], "{o:?}");
        assert_eq!(lines[5], "1777", "{o:?}");
        assert!(lines[6].ends_with("0000000000000000"), "{o:?}");
        assert!(lines[7].ends_with('1'), "no_new_privs: {o:?}");
        ids.push(root);
    }
    assert_ne!(ids[0], ids[1], "two containers share an id range");
    assert!(ids[0].abs_diff(ids[1]) >= 65_536, "ranges overlap: {ids:?}");
    f.finish().await;
}

/// Not the host's root: the container's `/` holds only the curated view, and `/etc` is
/// made for it (its own users, no shadow, no resolver).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_the_root_is_a_curated_view() {
    let f = fx(|_| {}).await;
    let o = exec(
        &f,
        "root",
        &f.sh("ls / | tr '\\n' ' '; echo; cat /etc/passwd; ls /etc/shadow 2>&1; \
               touch /usr/x 2>&1; touch /etc/x 2>&1; touch /x 2>&1; grep ' / ' /proc/self/mountinfo"),
    )
    .await;
    let s = out(&o.stdout);
    let top: Vec<&str> = s.lines().next().unwrap().split_whitespace().collect();
    for want in [
        "usr",
        "bin",
        "etc",
        "proc",
        "dev",
        "tmp",
        "workspace",
        "artifacts",
    ] {
        assert!(top.contains(&want), "{want} missing: {top:?}");
    }
    for never in [
        "root", "home", "work", "var/lib", "opt", "srv", "mnt", "boot", "sys",
    ] {
        assert!(!top.contains(&never), "{never} visible: {top:?}");
    }
    assert!(s.contains("sandbox:x:1000:1000:sandbox:/workspace"), "{s}");
    assert!(s.contains("'/etc/shadow': No such file"), "{s}");
    assert_eq!(s.matches("Read-only file system").count(), 3, "{s}");
    let root_mount = s.lines().find(|l| l.contains(" / / ")).unwrap_or_default();
    assert!(
        root_mount.contains("ro,") && root_mount.contains("nosuid") && root_mount.contains("nodev"),
        "{root_mount}"
    );
    f.finish().await;
}

/// `rootfs = DIR`: an unpacked image is the container's root (here a minimal one:
/// dash and its libraries), with an `/etc` made for the container over the image's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_an_image_directory_is_the_root() {
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let image = Fixture::new("/tmp", &format!("image-{marker}"));
    for (dir, link) in [
        ("usr/bin", "bin"),
        ("usr/lib", "lib"),
        ("usr/lib64", "lib64"),
    ] {
        std::fs::create_dir_all(image.path(dir)).unwrap();
        std::os::unix::fs::symlink(dir, image.path(link)).unwrap();
    }
    for file in [
        "/usr/bin/dash",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ] {
        let real = std::fs::canonicalize(file).unwrap();
        let rel = real.strip_prefix("/").unwrap();
        let dst = image.path(rel.to_str().unwrap());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&real, &dst).unwrap();
        let link = image.path(file.trim_start_matches('/'));
        if !link.exists() {
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&real, &link).unwrap();
        }
    }
    std::os::unix::fs::symlink("dash", image.path("usr/bin/sh")).unwrap();
    std::fs::create_dir_all(image.path("etc")).unwrap();
    std::fs::write(image.path("etc/image-release"), format!("IMAGE-{marker}\n")).unwrap();
    std::fs::write(image.path("etc/shadow"), "root:secret:::\n").unwrap();
    std::fs::write(image.path("etc/passwd"), "imageuser:x:5:5::/:/bin/sh\n").unwrap();
    let root = image.0.display().to_string();
    let f = fx(|c| c.substrate.rootfs = root).await;
    let o = exec(
        &f,
        "img",
        &f.sh(
            "read l < /etc/image-release; echo $l; echo /usr/bin/*; read p < /etc/passwd; echo $p; \
               [ -e /etc/shadow ] && echo SHADOW; echo done",
        ),
    )
    .await;
    assert_eq!(
        out(&o.stdout),
        format!("IMAGE-{marker}\n/usr/bin/dash /usr/bin/sh\nroot:x:0:0:root:/root:/bin/sh\ndone\n"),
        "{o:?}"
    );
    f.finish().await;
}

/// `require`: a mechanism the configuration requires and the machine (here, the
/// configuration) lacks refuses start-up, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_a_required_mechanism_that_is_missing_refuses_start() {
    let s = crate::support::setup("require", |c| {
        c.substrate.kill_mode = stockade_runtime::config::KillMode::ProcessGroup;
        c.substrate.require = vec!["userns".into(), "cgroup-kill".into()];
    });
    let err = stockade_linux::Linux::new(&s.cfg, s.store.clone(), crate::support::stockade_exe())
        .await
        .err()
        .expect("start-up refused");
    assert!(err.to_string().contains("cgroup-kill"), "{err}");
    assert!(!err.to_string().contains("userns\""), "{err}");
    let _ = std::fs::remove_dir_all(&s.data);
}

/// The tools a run needs still work inside the hardened container: a shell, git on
/// /workspace, python, and files that survive a checkpoint owned by the workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_tools_work_inside_the_hardened_container() {
    let f = fx(|_| {}).await;
    let o = exec(
        &f,
        "tools",
        &f.sh("git init -q repo && cd repo && echo hi > f && git add f && \
               git -c user.email=a@b -c user.name=a commit -qm one && git log --oneline | wc -l && \
               python3 -c 'import ssl, sqlite3, json; print(\"py\")' && mkdir -p /tmp/t && echo tmp && \
               mkdir -p a b && echo x > a/f && ln a/f b/l && \
               python3 -c 'import os; os.rename(\"a/f\", \"b/g\"); print(\"renamed\")'"),
    )
    .await;
    // A link or rename into another directory works as outside: each tree's Landlock
    // domain grants REFER beneath `/` (without it: EXDEV, "Invalid cross-device link").
    assert_eq!(out(&o.stdout), "1\npy\ntmp\nrenamed\n", "{o:?}");
    f.rt.checkpoint("tools").await.unwrap();
    let o = exec(
        &f,
        "tools",
        &f.sh("cd repo && git log --oneline | wc -l && stat -c %u f && echo more >> f && echo ok"),
    )
    .await;
    assert_eq!(out(&o.stdout), "1\n1000\nok\n", "{o:?}");
    f.finish().await;
}

/// Artifacts: a directory the container swaps for a symlink to a host directory while
/// the host lists `/artifacts` is never followed: no host file name is listed (found
/// by a red team: the listing resolved paths and listed the data directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_an_artifact_listing_never_follows_a_flipping_symlink() {
    let f = fx(|_| {}).await;
    let secret = Fixture::new("/var/tmp", &f.marker);
    std::fs::write(secret.path(&format!("hostfile-{}", f.marker)), "x").unwrap();
    let flipper = format!(
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir('/artifacts')
os.makedirs('d', exist_ok=True)
for i in range(50):
    open('d/f%d' % i, 'w').write('x')
os.symlink('{}', 'lnk')
open('/workspace/flipping', 'w').write('1')
while True:
    libc.renameat2(-100, b'd', -100, b'lnk', 2)   # RENAME_EXCHANGE
"#,
        secret.0.display()
    );
    f.rt.start_detached("art", &py(&f, &flipper)).await.unwrap();
    let o = exec(
        &f,
        "art",
        &f.sh("while [ ! -e /workspace/flipping ]; do sleep 0.02; done; echo up"),
    )
    .await;
    assert_eq!(out(&o.stdout), "up\n", "{o:?}");
    let mut seen_dir = 0;
    for _ in 0..200 {
        let listed = f.rt.artifacts("art").await.unwrap();
        assert!(
            !listed.iter().any(|a| a.name.contains("hostfile")),
            "a host directory was listed: {listed:?}"
        );
        seen_dir += usize::from(
            listed
                .iter()
                .any(|a| a.name.starts_with("d/") || a.name.starts_with("lnk/")),
        );
    }
    assert!(
        seen_dir > 0,
        "the listing never saw the container's own directory"
    );
    f.finish().await;
}

/// Checkpoint and kept artifacts stay within the disk cap whatever the files claim
/// (found by a red team: a sparse file of 8 EiB made the checkpoint write without end,
/// a 0-block 5 GB file in /artifacts became 5 GB of the host's disk at stop, and hard
/// links multiplied both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_sparse_files_and_hard_links_do_not_amplify_onto_the_host() {
    let f = fx(|c| {
        c.substrate.limits.disk_mib = 64;
        c.substrate.limits.memory_mib = 512;
    })
    .await;
    // Hard links of one 8 MiB file: archived once, restored whole.
    let o = exec(
        &f,
        "amp",
        &f.sh("head -c 8388608 /dev/urandom > /workspace/a && for i in $(seq 30); do ln /workspace/a /workspace/l$i; done && echo ok"),
    )
    .await;
    assert_eq!(out(&o.stdout), "ok\n", "{o:?}");
    f.rt.checkpoint("amp")
        .await
        .expect("hard links are archived as links");
    let snap = f
        .data
        .join("snapshots")
        .join(format!("{}.tar.gz", hex("amp")));
    let size = std::fs::metadata(&snap).unwrap().len();
    assert!(
        size < 16 << 20,
        "the snapshot holds the file once: {size} bytes"
    );
    let o = exec(
        &f,
        "amp",
        &f.sh("cmp /workspace/a /workspace/l30 && echo same"),
    )
    .await;
    assert_eq!(out(&o.stdout), "same\n", "{o:?}");
    // A sparse file claiming 8 EiB: the checkpoint refuses at once, leaves no partial
    // archive, and the key keeps working with its previous snapshot.
    let o = exec(
        &f,
        "amp",
        &f.sh("truncate -s 9223372036854775807 /workspace/huge && echo made"),
    )
    .await;
    assert_eq!(out(&o.stdout), "made\n", "{o:?}");
    let err = f.rt.checkpoint("amp").await.expect_err("refused");
    assert!(format!("{err:?}").contains("limits.disk_mib"), "{err:?}");
    let partial: Vec<_> = std::fs::read_dir(f.data.join("snapshots"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(partial.is_empty(), "a partial archive was left");
    assert!(
        std::fs::metadata(&snap).unwrap().len() == size,
        "the previous snapshot stands"
    );
    let o = exec(&f, "amp", &f.sh("rm /workspace/huge; echo alive")).await;
    assert_eq!(out(&o.stdout), "alive\n", "{o:?}");
    // /artifacts: a 5 GB sparse file and twenty links of a real one; what is kept on
    // the host's disk after the container stops stays within the cap.
    let o = exec(
        &f,
        "amp",
        &f.sh(
            "truncate -s 5G /artifacts/big && head -c 4194304 /dev/urandom > /artifacts/real && \
               for i in $(seq 20); do ln /artifacts/real /artifacts/r$i; done && echo ok",
        ),
    )
    .await;
    assert_eq!(out(&o.stdout), "ok\n", "{o:?}");
    let c = f.linux.current("amp").await.unwrap().unwrap();
    f.rt.abort("amp").await.unwrap();
    let kept = f.data.join("containers").join(&c).join("artifacts");
    let inodes: std::collections::HashMap<u64, u64> = std::fs::read_dir(&kept)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            use std::os::unix::fs::MetadataExt;
            (m.ino(), m.blocks() * 512)
        })
        .collect();
    let blocks: u64 = inodes.values().sum();
    assert!(
        blocks <= 64 << 20,
        "kept artifacts take {blocks} bytes of the host's disk"
    );
    assert_eq!(
        std::fs::read(kept.join("r20")).unwrap(),
        std::fs::read(kept.join("real")).unwrap(),
        "hard links kept as links"
    );
    assert!(
        !kept.join("big").exists(),
        "the sparse file past the cap was left out"
    );
    f.finish().await;
}

/// The egress proxy: a container opening thousands of connections to it does not spend
/// the host's descriptors (red team: 20 000 connections starved every key, abort
/// included), and a loop of refused requests does not write a line per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_the_proxy_cannot_be_flooded() {
    let f = fx(|_| {}).await;
    let host_fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = host_fds();
    let flood = r#"
import socket, time
socks = []
for i in range(3000):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(('127.0.0.1', 3128))
    except BlockingIOError:
        pass
    except OSError:
        break
    socks.append(s)
open('/workspace/flooding', 'w').write('%d' % len(socks))
time.sleep(600)
"#;
    f.rt.start_detached("flood", &py(&f, flood)).await.unwrap();
    let o = exec(
        &f,
        "flood",
        &f.sh("while [ ! -e /workspace/flooding ]; do sleep 0.05; done; cat /workspace/flooding"),
    )
    .await;
    let opened: usize = out(&o.stdout).trim().parse().unwrap_or(0);
    assert!(
        opened > 1000,
        "the flood opened {opened} connections: {o:?}"
    );
    let grown = host_fds().saturating_sub(before);
    assert!(
        grown < egress_cap() + 100,
        "the host holds {grown} more descriptors for one container's flood"
    );
    // Another key, and this one, still work.
    let other = exec(&f, "bystander", &f.sh("echo alive")).await;
    assert_eq!(out(&other.stdout), "alive\n");
    f.rt.abort("flood").await.unwrap();
    // 3000 refused requests in one fence: all counted, few written.
    let spam = r#"
import socket
s = socket.create_connection(('127.0.0.1', 3128))
req = b'GET http://denied.invalid/' + b'A' * 2000 + b' HTTP/1.1\r\nhost: denied.invalid\r\n\r\n'
n = 0
f = s.makefile('rb')
for i in range(3000):
    s.sendall(req)
    line = f.readline()
    while True:
        h = f.readline()
        if h in (b'\r\n', b''):
            break
        if h.lower().startswith(b'content-length:'):
            length = int(h.split(b':')[1])
    f.read(length)
    n += line.startswith(b'HTTP/1.1 403')
print('DENIED', n)
"#;
    let o = exec(&f, "spam", &py(&f, spam)).await;
    assert_eq!(tagged(&o, "DENIED"), ["DENIED 3000"], "{o:?}");
    assert_eq!(o.denials, 3000, "every refusal is counted: {o:?}");
    let recorded = f.rt.denials("spam").await.unwrap();
    assert!(
        recorded.len() < 500,
        "{} denials written for one loop",
        recorded.len()
    );
    assert!(
        recorded.iter().all(|d| d.path.len() <= 512),
        "paths are cut"
    );
    f.finish().await;
}

/// What one container's idle flood may hold on the host: the proxy's client
/// connections (no upstream is opened for them).
fn egress_cap() -> usize {
    stockade_egress::MAX_CONNECTIONS
}

/// A red team's finding (docs/SECURITY.md, "Grant sharing"): a detached process ptraced a
/// process of the fenced run and made it send its own request with the fence's credential.
/// Each tree now lives in a Landlock domain of its own: a detached process can neither
/// attach to a fenced process nor open its memory or environment, while a tree still traces
/// its own children (strace and gdb keep working).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_detached_process_cannot_reach_into_a_fenced_one() {
    let f = fx(|_| {}).await;
    let spy = r#"
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def find():
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                if open('/proc/%s/cmdline' % p, 'rb').read() == b'sleep\x0031337\x00':
                    return int(p)
            except OSError:
                pass
res = []
deadline = time.time() + 20
pid = None
while pid is None and time.time() < deadline:
    pid = find()
    time.sleep(0.02)
if libc.ptrace(16, pid, None, None) == 0:
    res.append('ATTACHED to the fenced process')
else:
    res.append('attach refused ' + errno.errorcode[ctypes.get_errno()])
for what, flags in [('mem', os.O_RDWR), ('environ', os.O_RDONLY)]:
    try:
        os.close(os.open('/proc/%d/%s' % (pid, what), flags))
        res.append('OPENED ' + what)
    except OSError as e:
        res.append(what + ' refused ' + errno.errorcode[e.errno])
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
if libc.ptrace(16, child, None, None) == 0:
    os.waitpid(child, 0x40000000)
    res.append('own child traced')
else:
    res.append('own child refused ' + errno.errorcode[ctypes.get_errno()])
os.kill(child, 9)
open('/tmp/spy.tmp', 'w').write('\n'.join(res) + '\n')
os.rename('/tmp/spy.tmp', '/tmp/spy.result')
time.sleep(3600)
"#;
    let mut detached = py(&f, spy);
    detached.timeout_ms = None;
    f.rt.start_detached("trace", &detached).await.unwrap();
    let o = exec(
        &f,
        "trace",
        &f.sh("sleep 31337 & S=$!; for i in $(seq 400); do [ -f /tmp/spy.result ] && break; sleep 0.05; done; kill $S; cat /tmp/spy.result"),
    )
    .await;
    let text = out(&o.stdout);
    assert!(
        text.contains("attach refused EPERM")
            && text.contains("mem refused")
            && text.contains("environ refused")
            && text.contains("own child traced"),
        "{text}\n{}",
        out(&o.stderr)
    );
    f.finish().await;
}
