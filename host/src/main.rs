//! The `stockade` binary: the CLI and the server. A container's PID 1 is another
//! executable, `stockade-supervisor` (the supervisor crate).

fn main() {
    std::process::exit(stockade_host::cli::main());
}
