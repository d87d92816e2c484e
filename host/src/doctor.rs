//! `stockade doctor`: what this machine offers and what the substrate will do with it.

use serde_json::json;

use stockade_linux::Capabilities;
use stockade_runtime::config::Config;
use stockade_runtime::runtime::{Allocation, Compiled};

/// Print the report; exit 0 when the linux substrate can run with full tree kills,
/// 1 when it would run degraded.
pub async fn run(cfg: &Config, as_json: bool) -> anyhow::Result<i32> {
    let caps = Capabilities::detect(&cfg.substrate);
    let compiled = Compiled::new(cfg)?;
    let pooling = compiled.allocation() == Allocation::Pooling;
    let guest_bytes = stockade_runtime::bindings::EMBEDDED_GUEST.len();
    let full = caps.degradations.is_empty();
    let missing = caps.missing_required(&cfg.substrate.require);
    // Security lists the configuration empties on purpose (`Config::emptied`): listed,
    // not failed (an explicit `[]` is honoured).
    let emptied = cfg.emptied();
    if as_json {
        println!(
            "{}",
            json!({
                "capabilities": caps,
                "pooling_allocator": pooling,
                "guest_component_bytes": guest_bytes,
                "substrate": cfg.substrate.kind,
                "data_dir": cfg.substrate.data_dir,
                "ceiling": cfg.substrate.ceiling,
                "warm": cfg.substrate.warm,
                "rootfs": cfg.substrate.rootfs,
                "limits": cfg.substrate.limits,
                "require": cfg.substrate.require,
                "required_but_missing": missing,
                "floor_rules": cfg.floor.rules,
                "emptied": emptied,
                "mock": cfg.substrate.kind == "mock",
                "ok": full,
            })
        );
    } else {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        println!("stockade doctor");
        println!("  root (namespaces, mounts)   {}", yes(caps.root));
        println!(
            "  cgroup v2                   {}",
            caps.cgroup_v2
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "NO".into())
        );
        println!(
            "  container cgroup root       {}",
            caps.cgroup_root
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "-".into())
        );
        println!("  cgroup.kill                 {}", yes(caps.cgroup_kill));
        println!("  namespaces                  {}", yes(caps.namespaces));
        println!("  user namespaces             {}", yes(caps.userns));
        println!("  seccomp                     {}", yes(caps.seccomp));
        let mech = |m: &stockade_linux::limits::Mechanism| match m {
            stockade_linux::limits::Mechanism::V2 => "cgroup v2".to_string(),
            stockade_linux::limits::Mechanism::V1(p) => {
                format!("cgroup v1 at {}", p.display())
            }
            stockade_linux::limits::Mechanism::Missing => "NO".to_string(),
        };
        let l = &cfg.substrate.limits;
        println!(
            "  limit: pids                 {} ({})",
            l.pids,
            mech(&caps.limits.pids)
        );
        println!(
            "  limit: memory               {} MiB ({})",
            l.memory_mib,
            mech(&caps.limits.memory)
        );
        println!(
            "  limit: cpus                 {} ({})",
            l.cpus,
            mech(&caps.limits.cpu)
        );
        println!(
            "  limit: disk                 {} MiB ({})",
            l.disk_mib,
            if caps.disk {
                "a tmpfs per container, in RAM"
            } else {
                "NO"
            }
        );
        println!("  root filesystem             {}", cfg.substrate.rootfs);
        println!("  tree kill mode              {:?}", caps.kill_mode);
        println!(
            "  egress attribution          {}",
            if caps.attribution {
                "yes (an open grant is the fenced run's alone)"
            } else {
                "NO (a detached process shares an open grant)"
            }
        );
        println!("  pooling allocator           {}", yes(pooling));
        println!("  guest component             {guest_bytes} bytes (embedded)");
        println!(
            "  substrate / ceiling / warm  {} / {} / {}",
            cfg.substrate.kind, cfg.substrate.ceiling, cfg.substrate.warm
        );
        println!(
            "  data dir                    {}",
            cfg.substrate.data_dir.display()
        );
        println!("  floor rules                 {}", cfg.floor.rules.len());
        for e in &emptied {
            println!("  EMPTIED: {e}");
        }
        if cfg.substrate.kind == "mock" {
            println!(
                "  MOCK: substrate.kind is \"mock\": `stockade serve` would be a TEST DOUBLE (no container, no fence; docs/MOCK.md)"
            );
        }
        for d in &caps.degradations {
            println!("  DEGRADED: {d}");
        }
        if !missing.is_empty() {
            println!(
                "  REFUSED: substrate.require names {missing:?}: `stockade serve` will not start"
            );
        }
        if full {
            println!("  everything Stockade needs is here");
        }
    }
    Ok(if full { 0 } else { 1 })
}
