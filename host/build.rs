//! Builds the guest component with a nested cargo (its own target directory, as
//! wasmtime's test-programs do) and hands its path to `bindings.rs` to embed.
//! Cargo re-runs this only when the guest's sources, the WIT or the lock file change.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    for p in [
        "guest/src",
        "guest/Cargo.toml",
        "grammar/src",
        "grammar/Cargo.toml",
        "wit",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=STOCKADE_GUEST_PREBUILT");
    let wasm = match std::env::var_os("STOCKADE_GUEST_PREBUILT") {
        Some(p) => PathBuf::from(p),
        None => build_guest(&root),
    };
    println!("cargo:rustc-env=STOCKADE_GUEST_WASM={}", wasm.display());
}

fn build_guest(root: &std::path::Path) -> PathBuf {
    let target_dir = root.join("target").join("guest");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "-p",
            "stockade-guest",
            "--release",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // The guest is small and shipped inside the binary: optimize for size, no debuginfo.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1");
    for v in [
        "CARGO_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
    ] {
        cmd.env_remove(v);
    }
    let status = cmd
        .status()
        .expect("run the nested cargo that builds the guest");
    if !status.success() {
        panic!(
            "building the guest component failed; is the target installed? \
             run: rustup target add wasm32-wasip2"
        );
    }
    target_dir.join("wasm32-wasip2/release/stockade_guest.wasm")
}
