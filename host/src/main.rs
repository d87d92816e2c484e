//! The `stockade` binary: the CLI, and (as `stockade __supervisor …`) a container's PID 1.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "__supervisor") {
        std::process::exit(stockade_host::substrate::linux::supervisor::main(
            args[2..].to_vec(),
        ));
    }
    std::process::exit(stockade_host::cli::main());
}
