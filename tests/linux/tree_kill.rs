//! Invariants 6 and 7: a kill reaps the whole tree, whatever the tree did to escape.

use std::time::Duration;

use stockade_runtime::config::KillMode;
use stockade_runtime::substrate::Substrate;
use stockade_tests::poll_readable;

use crate::support::{
    DEADLINE, assert_eof_within, degradation_lines, harness, proc_state_and_pgrp, wait_exited,
    wait_marked_at_least,
};

/// Open a fifo at `path` for reading without blocking (before any writer).
fn fifo_reader(path: &std::path::Path) -> std::fs::File {
    use rustix::fs::{CWD, Mode, OFlags, mkfifoat, open};
    mkfifoat(CWD, path, Mode::from_raw_mode(0o666)).expect("mkfifo");
    // The workload is the container's unprivileged user: the fifo must be writable by
    // others whatever the umask.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let fd = open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .expect("open the fifo");
    std::fs::File::from(fd)
}

/// Read until `want` arrives (the writer is connected), with the deadline.
fn read_until(f: &std::fs::File, want: &[u8]) {
    let end = std::time::Instant::now() + DEADLINE;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(want.len()).any(|w| w == want) {
        let left = end.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "never read {want:?}, got {got:?}");
        poll_readable(f, left);
        if let Ok(n @ 1..) = rustix::io::read(f, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
    }
}

/// The regression test of DESIGN §2.2: a command backgrounds a grandchild that holds its
/// stdout and another that holds a pipe; the run returns at its leader's exit (it does
/// not wait for an EOF that would never come), and the fence's kill-all kills the
/// grandchildren: the pipe reaches EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_holding_the_pipe_dies_and_the_pipe_reaches_eof() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("seed").await.unwrap();
    let reader = fifo_reader(&h.container_dir(&c).join("fs/workspace/fifo"));
    let started = std::time::Instant::now();
    let r = h
        .linux
        .run(
            &c,
            h.cmd("(echo hi; exec sleep 1000) > /workspace/fifo & sleep 1000 & echo started"),
            DEADLINE,
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the run waited for the grandchild"
    );
    assert_eq!((r.exit_code, r.timed_out), (0, false));
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "started");
    read_until(&reader, b"hi");
    // The run's tree is still tracked: it has live members.
    let tracked = h.linux.list_processes(&c).await.unwrap();
    assert_eq!(tracked.len(), 1, "{tracked:?}");
    assert!(tracked[0].running);
    let killed = h.linux.kill_all(&c).await.unwrap();
    assert!(killed >= 2, "killed {killed}");
    assert_eof_within(&reader, DEADLINE);
    h.assert_no_marked("after kill-all").await;
    assert!(h.linux.list_processes(&c).await.unwrap().is_empty());
    h.finish().await;
}

const ESCAPERS: &str = "setsid sleep 1000 & \
    (sleep 1000 &) ; \
    sh -c 'sh -c \"sleep 1000 &\" &' ; \
    nohup sleep 1000 >/dev/null 2>&1 & \
    i=0; while [ $i -lt 500 ]; do sleep 1000 & i=$((i+1)); done; echo forked";

/// A `setsid` escaper, a double-forked daemon, `nohup`, a fork storm of 500: the
/// fence's teardown (kill-all) leaves none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapers_and_a_fork_storm_do_not_survive_kill_all() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("escapers").await.unwrap();
    let r = h.linux.run(&c, h.cmd(ESCAPERS), DEADLINE).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    wait_marked_at_least(&h, 504).await;
    let killed = h.linux.kill_all(&c).await.unwrap();
    assert!(killed >= 504, "killed {killed}");
    h.assert_no_marked("after kill-all").await;
    h.finish().await;
}

/// The same escapers under a started process: killing that one process (stop-detached)
/// leaves none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapers_and_a_fork_storm_do_not_survive_kill_process() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("escapers-started").await.unwrap();
    let id = h.linux.start_process(&c, h.cmd(ESCAPERS)).await.unwrap();
    wait_marked_at_least(&h, 504).await;
    let killed = h.linux.kill_process(&c, &id).await.unwrap();
    assert!(killed >= 504, "killed {killed}");
    h.assert_no_marked("after kill-process").await;
    assert_eq!(
        h.linux.process_status(&c, &id).await.unwrap(),
        None,
        "a killed process is forgotten"
    );
    h.finish().await;
}

/// A run that outlives its timeout: the tree is killed (including what it
/// backgrounded), `timed_out` is reported with exit -1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_timeout_kills_the_tree() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("timeout").await.unwrap();
    let r = h
        .linux
        .run(
            &c,
            h.cmd("sleep 1000 & echo waiting; sleep 1000"),
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, -1);
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "waiting");
    h.assert_no_marked("after the timeout").await;
    assert!(
        h.linux.list_processes(&c).await.unwrap().is_empty(),
        "a timed-out run is not tracked"
    );
    h.finish().await;
}

/// Output past `output_limit` is drained and discarded, and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_limit_is_truncated() {
    let h = harness(|cfg| cfg.substrate.output_limit = 1000).await;
    let c = h.linux.ensure("truncate").await.unwrap();
    // 1 MiB on stdout would block a writer whose reader stopped reading.
    let r = h
        .linux
        .run(
            &c,
            h.cmd("head -c 1048576 /dev/zero; echo err >&2; exit 3"),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.truncated);
    assert_eq!(r.stderr, b"err\n");
    let r = h
        .linux
        .run(&c, h.cmd("echo small"), DEADLINE)
        .await
        .unwrap();
    assert!(!r.truncated);
    assert_eq!(r.exit_code, 0);
    let r = h
        .linux
        .run(&c, h.cmd("kill -TERM $$"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        r.exit_code,
        -rustix::process::Signal::TERM.as_raw(),
        "a signal is reported as its negative"
    );
    h.finish().await;
}

/// A started process that exited reports its code, and keeps it until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_started_process_keeps_its_exit_code_until_killed() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("exit-code").await.unwrap();
    let id = h.linux.start_process(&c, h.cmd("exit 7")).await.unwrap();
    let info = wait_exited(&h.linux, &c, &id).await;
    assert_eq!(info.exit_code, Some(7));
    let listed = h.linux.list_processes(&c).await.unwrap();
    assert_eq!(
        listed,
        vec![info.clone()],
        "an exited started process stays listed"
    );
    assert_eq!(h.linux.process_status(&c, &id).await.unwrap(), Some(info));
    assert_eq!(h.linux.kill_process(&c, &id).await.unwrap(), 0);
    assert_eq!(h.linux.process_status(&c, &id).await.unwrap(), None);
    // A program that cannot be executed ran and failed, as in a shell: a started one
    // reads exited(127); a run answers 127 (not found) or 126 (not executable) and
    // says why on its stderr.
    let cmd = |prog: &str| stockade_runtime::substrate::Command {
        argv: vec![prog.into()],
        cwd: String::new(),
        env: vec![],
        stdin: vec![],
        stdin_stream: None,
    };
    let id = h.linux.start_process(&c, cmd("/no/such")).await.unwrap();
    assert_eq!(wait_exited(&h.linux, &c, &id).await.exit_code, Some(127));
    h.linux.kill_process(&c, &id).await.unwrap();
    for (prog, code) in [("/no/such", 127), ("/etc/hostname", 126)] {
        let r = h.linux.run(&c, cmd(prog), DEADLINE).await.unwrap();
        let err = String::from_utf8_lossy(&r.stderr).to_string();
        assert_eq!(r.exit_code, code, "{prog}: {err}");
        assert!(err.starts_with(&format!("stockade: {prog}: ")), "{err}");
    }
    h.finish().await;
}

/// Forced process-group mode (the degraded mechanism) kills an ordinary tree...
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_group_mode_kills_an_ordinary_tree() {
    let h = harness(|cfg| cfg.substrate.kill_mode = KillMode::ProcessGroup).await;
    assert_eq!(h.linux.capabilities().kill_mode, KillMode::ProcessGroup);
    let c = h.linux.ensure("pg").await.unwrap();
    let id = h
        .linux
        .start_process(&c, h.cmd("sleep 1000 & sleep 1000 & (sleep 1000 &); wait"))
        .await
        .unwrap();
    wait_marked_at_least(&h, 4).await;
    let killed = h.linux.kill_process(&c, &id).await.unwrap();
    assert!(killed >= 4, "killed {killed}");
    h.assert_no_marked("after the group kill").await;
    h.finish().await;
}

/// ...but a grandchild that calls `setsid` escapes it: the reason cgroup mode exists.
/// Only the container's stop (its PID namespace dies with its PID 1) reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_escaper_survives_only_the_degraded_mode() {
    let h = harness(|cfg| cfg.substrate.kill_mode = KillMode::ProcessGroup).await;
    let c = h.linux.ensure("pg-escaper").await.unwrap();
    let escaper = "setsid sh -c 'echo > /workspace/escaped; exec sleep 1000' & sleep 1000";
    let id = h.linux.start_process(&c, h.cmd(escaper)).await.unwrap();
    // Kill only once the escaper has left the group (its own session).
    let escaped = h.container_dir(&c).join("fs/workspace/escaped");
    let deadline = std::time::Instant::now() + DEADLINE;
    while !escaped.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the escaper never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_marked_at_least(&h, 3).await;
    h.linux.kill_process(&c, &id).await.unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while h.marked().len() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "expected exactly the escaper to survive: {:?}",
            h.marked()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.linux.stop(&c).await.unwrap();
    h.assert_no_marked("after stop").await;
    h.finish().await;
}

/// Wait until `cond` holds, or fail with `why` after the deadline.
async fn wait_until(why: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The single-process kill (the last degradation, DESIGN §2.2) on real processes. It kills
/// the leader, and only the leader: what the leader started survives (here its two
/// `sleep`s, orphaned) until the container stops. The supervisor met a degradation and the
/// host logs its canonical line, with the container's id (the supervisor has no log of its
/// own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_process_kill_kills_the_leader_only_and_the_host_logs_it() {
    let h = harness(|cfg| cfg.substrate.kill_mode = KillMode::Single).await;
    assert_eq!(h.linux.capabilities().kill_mode, KillMode::Single);
    let c = h.linux.ensure("single").await.unwrap();
    let id = h
        .linux
        .start_process(&c, h.cmd("sleep 1000 & sleep 1000; echo never"))
        .await
        .unwrap();
    wait_marked_at_least(&h, 3).await;
    let before = h.marked();
    assert_eq!(h.linux.kill_process(&c, &id).await.unwrap(), 1);
    assert_eq!(
        h.linux.process_status(&c, &id).await.unwrap(),
        None,
        "the killed tree is forgotten"
    );
    // The leader (the shell) is dead; its two children live on (each a `sleep` once
    // it has exec'd: a loaded machine may show a forked shell first).
    let comm = |pid: &i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    wait_until("only the leader dies, its two sleeps live", || {
        let m = h.marked();
        m.len() == 2 && m.iter().all(|p| comm(p).trim() == "sleep")
    })
    .await;
    let survivors = h.marked();
    assert!(
        survivors.iter().all(|p| before.contains(p)),
        "{survivors:?}"
    );
    let lines = degradation_lines(&c);
    assert_eq!(lines.len(), 1, "one canonical line: {lines:?}");
    assert!(
        lines[0].contains("DEGRADATION kill mode single")
            && lines[0].contains("stockade::degradation"),
        "{lines:?}"
    );
    // Said once per container: a second degraded kill adds no line.
    let id = h
        .linux
        .start_process(&c, h.cmd("exec sleep 1000"))
        .await
        .unwrap();
    assert_eq!(h.linux.kill_process(&c, &id).await.unwrap(), 1);
    assert_eq!(degradation_lines(&c).len(), 1);
    // Only the container's stop reaches the survivors (its PID namespace dies).
    h.linux.stop(&c).await.unwrap();
    h.assert_no_marked("after stop").await;
    h.finish().await;
}

/// In process-group mode (DESIGN §2.2) a tree's leader that exits while its group
/// lives stays a zombie, so its pid (the group's id) cannot be taken by another
/// process before the group is killed; the kill then reaches the group and reaps the
/// leader. (Before, the leader was reaped at once and the guard trusted a number that
/// anyone could reuse.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_group_leader_stays_a_zombie_until_its_group_is_killed() {
    let h = harness(|cfg| cfg.substrate.kill_mode = KillMode::ProcessGroup).await;
    let c = h.linux.ensure("pg-zombie").await.unwrap();
    let id = h
        .linux
        .start_process(&c, h.cmd("sleep 1000 & exit 3"))
        .await
        .unwrap();
    let info = wait_exited_leader(&h, &c, &id).await;
    assert_eq!((info.exit_code, info.running), (Some(3), true));
    wait_marked_at_least(&h, 1).await;
    let member = h.marked()[0];
    let (_, group) = proc_state_and_pgrp(member).expect("the member lives");
    assert_ne!(group, member);
    assert_eq!(
        proc_state_and_pgrp(group),
        Some(('Z', group)),
        "the exited leader {group} was reaped while its group lives"
    );
    assert_eq!(h.linux.kill_process(&c, &id).await.unwrap(), 1);
    h.assert_no_marked("after the group kill").await;
    assert_eq!(
        proc_state_and_pgrp(group),
        None,
        "the leader is reaped once its group is dead"
    );
    assert_eq!(h.linux.process_status(&c, &id).await.unwrap(), None);
    // A leader whose group is empty at its exit is reaped at once: nothing is left to
    // signal, and its tree is not running.
    let id = h.linux.start_process(&c, h.cmd("exit 4")).await.unwrap();
    let info = wait_exited(&h.linux, &c, &id).await;
    assert_eq!(info.exit_code, Some(4));
    assert_eq!(h.linux.kill_process(&c, &id).await.unwrap(), 0);
    h.finish().await;
}

/// Wait until `status` reports the leader's exit code (the tree may still run).
async fn wait_exited_leader(
    h: &crate::support::Harness,
    c: &str,
    id: &str,
) -> stockade_runtime::substrate::ProcessInfo {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let info = h
            .linux
            .process_status(c, id)
            .await
            .unwrap()
            .expect("tracked");
        if info.exit_code.is_some() {
            return info;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id}'s leader never exited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fenced run watches its own leader (the supervisor's leader watcher is not woken
/// for it), and hands it to the watcher before its own kill: in the process-group and
/// single modes that kill waits for the leader's reap. A run past its timeout is then
/// killed at once, in every mode, and nothing of it is left; without the hand-over the
/// kill waited out the supervisor's 10 s kill deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_timeout_dies_at_once_in_every_kill_mode() {
    for mode in [KillMode::Cgroup, KillMode::ProcessGroup, KillMode::Single] {
        let h = harness(|cfg| cfg.substrate.kill_mode = mode).await;
        assert_eq!(h.linux.capabilities().kill_mode, mode);
        let c = h.linux.ensure("run-timeout").await.unwrap();
        let started = std::time::Instant::now();
        let r = h
            .linux
            .run(&c, h.cmd("exec sleep 1000"), Duration::from_millis(300))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(r.timed_out, "{mode:?}: {r:?}");
        assert!(
            took < Duration::from_secs(5),
            "{mode:?}: the timed-out run answered after {took:?}"
        );
        h.assert_no_marked(&format!("{mode:?}: after the timed-out run"))
            .await;
        // The next run's leader is still the run's own to watch and reap.
        let r = h
            .linux
            .run(&c, h.cmd("exit 7"), Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!((r.exit_code, r.timed_out), (7, false), "{mode:?}");
        h.finish().await;
    }
}

/// PID 1 reaps an orphan as it exits. The orphan reaper sleeps on `SIGCHLD` (an
/// orphan's exit signal, whatever it was before its reparenting), and a leader has no
/// exit signal, so a run's end does not wake it. Here a tree's middle process exits at
/// once, leaving `sleep 0.4` to PID 1; nothing of the tree's leader moves when the
/// orphan exits. Before, the reaper slept on a condition only a leader's exit or a
/// spawn signalled, with a 1 s backstop: the orphan stayed a zombie for up to a second,
/// holding a pid against the container's `pids` limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_reaped_as_it_exits() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("orphan").await.unwrap();
    let id = h
        .linux
        .start_process(&c, h.cmd("(sleep 0.4 &); exec sleep 1000"))
        .await
        .unwrap();
    let cmdline = |p: i32| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
    let deadline = std::time::Instant::now() + DEADLINE;
    let orphan = loop {
        if let Some(p) = h
            .marked()
            .into_iter()
            .find(|p| cmdline(*p) == b"sleep\x000.4\x00")
        {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "the orphan never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // From the moment it is a zombie (or gone) until it is reaped.
    let mut zombie_since = None;
    loop {
        match proc_state_and_pgrp(orphan) {
            None => break,
            Some(('Z', _)) => {
                zombie_since.get_or_insert_with(std::time::Instant::now);
            }
            Some(_) => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the orphan {orphan} never went"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let zombie = zombie_since.map(|t| t.elapsed()).unwrap_or_default();
    assert!(
        zombie < Duration::from_millis(300),
        "the orphan stayed a zombie for {zombie:?}"
    );
    h.linux.kill_process(&c, &id).await.unwrap();
    h.finish().await;
}

/// A kill answers once its tree's processes are reaped, not only dead: a zombie still
/// holds its pid, charged to the container's `pids` limit, and the next command of a
/// container whose fork bomb was just killed failed to fork ("Cannot fork": seen once
/// in the boundary suite's bomb test). 300 processes, whose parent dies with them (so
/// PID 1 reaps them all): none is a zombie when the kill returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_returns_once_the_tree_is_reaped() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("reaped").await.unwrap();
    for round in 0..3 {
        let id = h
            .linux
            .start_process(
                &c,
                h.cmd("for i in $(seq 300); do sleep 1000 & done; exec sleep 1000"),
            )
            .await
            .unwrap();
        wait_marked_at_least(&h, 301).await;
        let leaf = h.cgroup_root.join(&c).join(&id).join("cgroup.procs");
        let pids: Vec<i32> = std::fs::read_to_string(&leaf)
            .unwrap()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        assert!(pids.len() >= 301, "round {round}: {}", pids.len());
        assert_eq!(
            h.linux.kill_process(&c, &id).await.unwrap() as usize,
            pids.len()
        );
        let zombies: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| proc_state_and_pgrp(*p).is_some_and(|(state, _)| state == 'Z'))
            .collect();
        assert!(
            zombies.is_empty(),
            "round {round}: {} of {} processes still unreaped when the kill returned",
            zombies.len(),
            pids.len()
        );
    }
    h.finish().await;
}

/// A process whose main thread exited while another of its threads runs: the leader a
/// zombie, the process alive.
const HEADLESS: &str = "python3 -c 'import threading, time, ctypes; threading.Thread(target=time.sleep, args=(3600,)).start(); ctypes.CDLL(None).pthread_exit(None)'";

/// Host pids of the headless processes (a zombie leader with a live thread) in any
/// leaf of the container cgroup `dir`.
fn headless(dir: &std::path::Path) -> Vec<i32> {
    let mut out = Vec::new();
    for leaf in std::fs::read_dir(dir).unwrap().flatten() {
        if !leaf.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let procs = std::fs::read_to_string(leaf.path().join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0);
            if proc_state_and_pgrp(pid).is_some_and(|(s, _)| s == 'Z') && threads >= 2 {
                out.push(pid);
            }
        }
    }
    out
}

/// Red team, 2026-12-04: a process whose main thread exited (`pthread_exit`) while
/// another thread runs is not signalled by `cgroup.kill` on this kernel (6.18): the
/// kill reaches a process through its leader thread. Its tree never emptied: `stop`
/// failed after 10 s with the process alive, and a fenced exec's teardown failed and
/// took the container with it. Now a kill whose tree has not emptied within 100 ms
/// signals every process still there through a pidfd (its whole thread group): the
/// stop of a started one and the kill-all after a run that left one behind both
/// succeed, and the process is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_process_whose_main_thread_exited_dies_with_its_tree() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("headless").await.unwrap();
    let dir = h.cgroup_root.join(&c);
    let id = h
        .linux
        .start_process(&c, h.cmd(&format!("exec {HEADLESS}")))
        .await
        .unwrap();
    wait_until("the started process is headless", || {
        headless(&dir).len() == 1
    })
    .await;
    let pid = headless(&dir)[0];
    let killed = h.linux.kill_process(&c, &id).await;
    assert!(killed.is_ok(), "stop: {killed:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the headless process outlived its stop"
    );

    let r = h
        .linux
        .run(&c, h.cmd(&format!("{HEADLESS} & echo left")), DEADLINE)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    wait_until("the run left a headless process", || {
        headless(&dir).len() == 1
    })
    .await;
    let pid = headless(&dir)[0];
    let killed = h.linux.kill_all(&c).await;
    assert!(killed.is_ok(), "kill-all: {killed:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the headless process outlived the kill-all"
    );
    h.finish().await;
}

/// Red team round 2, 2026-12-04: a headless process whose live thread forks children
/// that all fork again, every 50 ms, holds the container at its pids limit: as the
/// first kill's pidfd sweep freed pids, the processes not yet signalled forked new
/// ones into them, outside the sweep's list, and `stop` failed after 10 s with the
/// storm running (and a fenced run's teardown kept its grant that long). The sweep now
/// freezes the tree first (nothing in it forks again), writes `cgroup.kill` again and
/// signals every process listed.
const STORM_C: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
static int delay_us = 50000;
static void *forker(void *a) {
    for (;;) {
        if (fork() == 0) continue;
        usleep(delay_us);
    }
    return a;
}
int main(int argc, char **argv) {
    if (argc > 1) delay_us = atoi(argv[1]);
    signal(SIGCHLD, SIG_IGN);
    pthread_t t;
    pthread_create(&t, 0, forker, 0);
    pthread_exit(0);
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_headless_fork_storm_at_the_pids_limit_dies_with_its_tree() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("storm").await.unwrap();
    let ws = h.data.join("containers").join(&c).join("fs/workspace");
    let src = ws.join("storm.c");
    std::fs::write(&src, STORM_C).unwrap();
    let built = std::process::Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(ws.join("storm"))
        .arg(&src)
        .status()
        .expect("a C compiler (cc) builds the storm: apt-get install gcc");
    assert!(built.success(), "cc: {built:?}");
    let id = h
        .linux
        .start_process(&c, h.cmd("exec /workspace/storm 50000"))
        .await
        .unwrap();
    let leaf = h.cgroup_root.join(&c).join(&id);
    let count = || {
        std::fs::read_to_string(leaf.join("cgroup.procs"))
            .map(|p| p.lines().count())
            .unwrap_or(0)
    };
    wait_until("the storm fills the pids limit", || count() >= 900).await;
    let killed = h.linux.kill_process(&c, &id).await;
    assert!(killed.is_ok(), "stop: {killed:?} ({} left)", count());
    assert!(!leaf.exists(), "the storm's leaf is gone");
    h.finish().await;
}
