//! `stockade-supervisor`: a container's PID 1. The host clones it into the
//! container's namespaces and cgroup and `execveat`s it from a descriptor, with its
//! socket, ready pipe and directories at fixed numbers ([`stockade_supervisor::namespaces`]).
//! Everything it does is [`stockade_supervisor::pid1`].

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(stockade_supervisor::pid1::main(args));
}
