//! Benchmark 10: what each part of the boundary costs per container, measured on its
//! own (create and destroy, µs) next to a whole cold ensure + stop of the same run:
//! the id-range lease, the v1/v2 limit directories (create, join a process, destroy),
//! the size-capped storage (mount, unmount).

use std::time::{Duration, Instant};

use stockade_linux::{idmap, limits, storage};
use stockade_runtime::substrate::Substrate;

use crate::common::*;

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let v = f();
    (t.elapsed(), v)
}

pub async fn run(env: &Env) -> Vec<Row> {
    let n = iters(30);
    let caps = env.linux.capabilities().clone();
    let root_name = std::path::Path::new(&env.cfg.substrate.cgroup_root)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let scratch = env.cleanup.data.join("bench-limits");
    let (mut lease, mut lim, mut join, mut lim_down, mut disk, mut disk_down, mut cold) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n + 2 {
        let (d_lease, l) = time(|| idmap::lease(&env.cfg.substrate.ids).unwrap().unwrap());
        let id = format!("bench-limits-{i}");
        let (d_lim, cl) = time(|| {
            limits::ContainerLimits::create(
                &caps.limits,
                &env.cfg.substrate.limits,
                &root_name,
                &id,
                None,
            )
            .unwrap()
        });
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let (d_join, ()) = time(|| cl.join(child.id() as i32).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        let (d_lim_down, ()) = time(|| {
            cl.destroy(Instant::now() + Duration::from_secs(10))
                .unwrap()
        });
        let dir = scratch.join(format!("fs-{i}"));
        let (d_disk, s) = time(|| {
            storage::Storage::create(
                &dir,
                env.cfg.substrate.limits.disk_mib,
                (l.host(1000), l.host(1000)),
                (l.base, l.base),
            )
            .unwrap()
        });
        let (d_disk_down, ()) = time(|| s.unmount().unwrap());
        drop(l);
        let key = format!("bench-limits-cold-{i}");
        let t = Instant::now();
        let c = env.linux.ensure(&key).await.unwrap();
        env.linux.stop(&c).await.unwrap();
        let d_cold = t.elapsed();
        if i >= 2 {
            lease.push(d_lease);
            lim.push(d_lim);
            join.push(d_join);
            lim_down.push(d_lim_down);
            disk.push(d_disk);
            disk_down.push(d_disk_down);
            cold.push(d_cold);
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let cold = Stats::of(cold);
    detail("cold ensure + stop (the whole)", &cold);
    let mut rows = vec![];
    for (name, v) in [
        ("id range lease (flock)", lease),
        ("limits: create the cgroup directories and values", lim),
        ("limits: join the supervisor (v1 cgroup.procs)", join),
        ("limits: remove the directories", lim_down),
        ("disk: mount the tmpfs and its three directories", disk),
        ("disk: unmount", disk_down),
    ] {
        let s = Stats::of(v);
        detail(name, &s);
        rows.push(row(
            "10",
            format!("per container: {name} (median)"),
            fmt_d(s.median),
            format!("cold ensure + stop {}", fmt_d(cold.median)),
            format!("{:.0} %", 100.0 * ratio(s.median, cold.median)),
            "–",
            None,
        ));
    }
    rows
}
