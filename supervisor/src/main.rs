//! `stockade-supervisor`: a container's PID 1. The host clones it into the
//! container's namespaces and cgroup and `execveat`s it from a descriptor, with its
//! socket, ready pipe and directories at fixed numbers ([`stockade_supervisor::namespaces`]).
//! Everything it does is [`stockade_supervisor::pid1`].
//!
//! Its footprint is paid once per live container (a thousand of them on one host:
//! docs/SCALE.md): the one thing set here, before any thread exists, is glibc's allocator
//! to one arena. By default every thread that allocates gets an arena of its own (up to 8
//! per core), each with heap pages of its own that are touched once and kept; the
//! supervisor's twelve threads (the workers, the watcher, the acceptor, the spawner)
//! serve one host and seldom at once, so one shared arena costs no time and saves their
//! pages (docs/BENCHMARKS.md).

fn main() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before any other
    // thread exists, and a refusal (0) leaves the default, which is still correct.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(stockade_supervisor::pid1::main(args));
}
