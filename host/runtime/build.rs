//! Builds the guest component with a nested cargo (its own target directory, as
//! wasmtime's test-programs do) and hands its path to `bindings/mod.rs` to embed.
//! Cargo re-runs this only when the guest's sources, the WIT or the lock file change.
//!
//! The nested cargo links a core module (`--skip-wit-component`); [`stub_std_wasi`]
//! turns the WASI functions that std links for its panic message and its exit into
//! local functions that trap, and wit-component makes the component from what is
//! left: a guest that imports the Stockade interfaces alone (every lowered
//! import costs each per-call instance a function reference, and the guest does no
//! I/O of its own), and with no post-return functions ([`POST_RETURN`]). The
//! component is written where the nested build used to leave
//! it, `target/guest/wasm32-wasip2/release/stockade_guest.wasm`, for the edge.

use std::path::{Path, PathBuf};
use std::process::Command;

use wasm_encoder::reencode::{self, Reencode};

/// The WASI interfaces std (through wasi-libc) links for a panic's message on
/// stderr, `RUST_BACKTRACE`, and exit. Their functions become traps; an import from
/// any other `wasi:` interface fails the build (a guest that needs the clock or
/// randomness asks the host through a Stockade import).
const STD_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().parent().unwrap().to_path_buf();
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
    let (wasm, with_wasi) = match std::env::var_os("STOCKADE_GUEST_PREBUILT") {
        Some(p) => (PathBuf::from(p), PathBuf::new()),
        None => build_guest(&root),
    };
    println!("cargo:rustc-env=STOCKADE_GUEST_WASM={}", wasm.display());
    // The benches' "before": the same guest as the linker made it, std's WASI imported.
    println!(
        "cargo:rustc-env=STOCKADE_GUEST_WASM_WITH_WASI={}",
        with_wasi.display()
    );
}

/// The component, and the same guest with std's WASI imported (for the benches).
fn build_guest(root: &Path) -> (PathBuf, PathBuf) {
    let core_dir = root.join("target").join("guest-core");
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
        .arg(&core_dir)
        // The guest is small and shipped inside the binary: optimize for size, no debuginfo.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        // A core module: the component is made below, from the module less std's WASI.
        .env("CARGO_ENCODED_RUSTFLAGS", "-Clink-arg=--skip-wit-component");
    for v in [
        "CARGO_TARGET_DIR",
        "RUSTFLAGS",
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
    let core = core_dir.join("wasm32-wasip2/release/stockade_guest.wasm");
    let bytes = std::fs::read(&core).unwrap_or_else(|e| panic!("{}: {e}", core.display()));
    let component = componentize(&bytes).unwrap_or_else(|e| panic!("the guest component: {e}"));
    let out = root.join("target/guest/wasm32-wasip2/release");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let wasm = out.join("stockade_guest.wasm");
    // Written whole, then renamed: a reader (the edge's build) never sees half of it.
    let tmp = out.join("stockade_guest.wasm.tmp");
    std::fs::write(&tmp, &component).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, &wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));
    let with_wasi = out.join("stockade_guest.with-wasi.wasm");
    let linked = wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|mut e| e.encode())
        .unwrap_or_else(|e| panic!("the guest component with WASI: {e:#}"));
    std::fs::write(&with_wasi, linked).unwrap_or_else(|e| panic!("{}: {e}", with_wasi.display()));
    (wasm, with_wasi)
}

/// The component of the guest's core module, less std's WASI.
fn componentize(core: &[u8]) -> Result<Vec<u8>, String> {
    let module = stub_std_wasi(core)?;
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .and_then(|mut e| e.encode())
        .map_err(|e| format!("{e:#}"))
}

/// `core` with each function it imports from a [`STD_WASI`] interface made a local
/// function of the same type whose body is `unreachable`. Imported functions are
/// renumbered (the kept ones first, then the stubs, as the module's first defined
/// functions); the defined functions keep their indices. The [`POST_RETURN`] exports
/// are dropped.
fn stub_std_wasi(core: &[u8]) -> Result<Vec<u8>, String> {
    let mut imported = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        if let wasmparser::Payload::ImportSection(s) = payload.map_err(|e| e.to_string())? {
            for import in s.into_imports() {
                let import = import.map_err(|e| e.to_string())?;
                if let wasmparser::TypeRef::Func(ty) | wasmparser::TypeRef::FuncExact(ty) =
                    import.ty
                {
                    imported.push((import.module.to_owned(), ty));
                }
            }
        }
    }
    let mut stub = Stub::default();
    let kept = imported.iter().filter(|(m, _)| !is_wasi(m)).count();
    let (mut next_kept, mut next_stub) = (0u32, kept as u32);
    for (module, ty) in &imported {
        if is_wasi(module) {
            let interface = module.split('@').next().unwrap_or_default();
            if !STD_WASI.contains(&interface) {
                return Err(format!(
                    "the guest imports `{module}`: it does no I/O of its own (only std's \
                     panic and exit paths link WASI, {STD_WASI:?}); ask the host through a \
                     Stockade import"
                ));
            }
            stub.funcs.push(next_stub);
            stub.types.push(*ty);
            next_stub += 1;
        } else {
            stub.funcs.push(next_kept);
            next_kept += 1;
        }
    }
    let mut module = wasm_encoder::Module::new();
    stub.parse_core_module(&mut module, wasmparser::Parser::new(0), core)
        .map_err(|e| e.to_string())?;
    let bytes = module.finish();
    wasmparser::Validator::new()
        .validate_all(&bytes)
        .map_err(|e| format!("the guest less std's WASI does not validate: {e}"))?;
    Ok(bytes)
}

/// The prefix of the exports wit-component makes each lifted function's post-return
/// from. [`stub_std_wasi`]'s re-encoding drops them: the host and the edge make one
/// call per instance and then drop the instance whole (DESIGN §1, Worker-style), so
/// the guest freeing its answer first is work thrown away, and every post-return is
/// a function reference each instance makes (runtime test
/// `the_guests_exports_have_no_post_return`).
const POST_RETURN: &str = "cabi_post_";

fn is_wasi(module: &str) -> bool {
    module.starts_with("wasi:")
}

/// The re-encoding of [`stub_std_wasi`].
#[derive(Default)]
struct Stub {
    /// The new index of each imported function, by its old index.
    funcs: Vec<u32>,
    /// The type of each stub, in order.
    types: Vec<u32>,
}

impl Reencode for Stub {
    type Error = std::convert::Infallible;

    fn function_index(&mut self, func: u32) -> Result<u32, reencode::Error> {
        Ok(self.funcs.get(func as usize).copied().unwrap_or(func))
    }

    fn parse_import_section(
        &mut self,
        imports: &mut wasm_encoder::ImportSection,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), reencode::Error> {
        for import in section.into_imports() {
            let import = import?;
            let func = matches!(
                import.ty,
                wasmparser::TypeRef::Func(_) | wasmparser::TypeRef::FuncExact(_)
            );
            if !(func && is_wasi(import.module)) {
                imports.import(import.module, import.name, self.entity_type(import.ty)?);
            }
        }
        Ok(())
    }

    fn parse_export(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        export: wasmparser::Export<'_>,
    ) -> Result<(), reencode::Error> {
        if export.name.starts_with(POST_RETURN) {
            return Ok(());
        }
        reencode::utils::parse_export(self, exports, export)
    }

    fn parse_function_section(
        &mut self,
        functions: &mut wasm_encoder::FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), reencode::Error> {
        for &ty in &self.types {
            functions.function(ty);
        }
        reencode::utils::parse_function_section(self, functions, section)
    }

    fn parse_code_section(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), reencode::Error> {
        for _ in &self.types {
            let mut f = wasm_encoder::Function::new([]);
            f.instruction(&wasm_encoder::Instruction::Unreachable);
            f.instruction(&wasm_encoder::Instruction::End);
            code.function(&f);
        }
        reencode::utils::parse_code_section(self, code, section)
    }
}
