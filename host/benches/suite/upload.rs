//! Upload speed (docs/BENCHMARKS.md, "Uploads"): `PUT …/files` of a 100 MB tar through the
//! real path (the HTTP API, the host's entry-by-entry check, the pipe handed to the
//! supervisor, the container's `tar` into a staging directory, the merge into
//! `/workspace/<dest>`), side by side, interleaved, with `tar -x` of the same archive into
//! a fresh directory on the host (the archive on its stdin from memory, as the upload's
//! body is): on the temp dir's filesystem (the goal's baseline; here ext4, whose small-file
//! figure swings with other processes' writeback), and on a tmpfs (the medium a container's
//! `/workspace` is: docs/LINUX.md, storage).
//!
//! Two archives of about 100 MB each:
//! * large: 4 files of 25 MB;
//! * small: 10 000 files of 10 KB in 100 directories.
//!
//! Each upload goes to a fresh destination, removed (untimed) after it; each local
//! `tar -x` to a fresh directory under the temp dir, removed (untimed) after it.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common::*;

pub async fn run(env: &Env) -> Vec<Row> {
    tokio::task::block_in_place(|| measure(env))
}

/// A tar of `files` files of `size` bytes each (`per_dir` to a directory).
fn archive(files: usize, size: usize, per_dir: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    for i in 0..files {
        let mut h = tar::Header::new_gnu();
        h.set_size(size as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, format!("d{}/f{i}", i / per_dir), &body[..])
            .unwrap();
    }
    b.into_inner().unwrap()
}

/// `tar -x` of `archive` (on its stdin) into `dir`, made fresh and removed after; the
/// time of the `tar` alone.
fn untar(archive: &[u8], dir: &std::path::Path) -> Duration {
    std::fs::create_dir_all(dir).unwrap();
    let t = Instant::now();
    let mut child = std::process::Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(dir)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(archive).unwrap();
    assert!(child.wait().unwrap().success());
    let d = t.elapsed();
    let _ = std::fs::remove_dir_all(dir);
    d
}

/// A tmpfs of 1 GiB on a fresh temp directory, unmounted and removed on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount() -> Tmpfs {
        let dir = std::env::temp_dir().join(format!("stockade-bench-tmpfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1g,nosuid,nodev", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(ok.success(), "mount a tmpfs on {}", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn measure(env: &Env) -> Vec<Row> {
    let mut http = env.http();
    let key = "bench-upload";
    let cmd = |script: &str| serde_json::json!({ "argv": ["sh", "-c", script] }).to_string();
    // The container exists before the first timed upload.
    let (st, body) = http.request(
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        Some(&cmd("true")),
    );
    assert_eq!(st, 200, "{body}");
    let cases = [
        ("large", "4 files of 25 MB", archive(4, 25_000_000, 4)),
        (
            "small",
            "10 000 files of 10 KB",
            archive(10_000, 10_000, 100),
        ),
    ];
    let m = iters(5).max(3);
    let tmpfs = Tmpfs::mount();
    let mut rows = vec![];
    for (name, what, archive) in &cases {
        let (mut up, mut local, mut local_tmpfs) = (vec![], vec![], vec![]);
        // One untimed round first (the first write of a tmpfs's pages, the page cache).
        for i in 0..m + 1 {
            let t = Instant::now();
            let (st, body) = http.request_bytes(
                "PUT",
                &format!("/v1/sandboxes/{key}/files?dest=u{i}"),
                "application/x-tar",
                archive,
            );
            let d_up = t.elapsed();
            assert_eq!(st, 201, "{body}");
            let (st, body) = http.request(
                "POST",
                &format!("/v1/sandboxes/{key}/exec"),
                Some(&cmd(&format!("rm -rf /workspace/u{i}"))),
            );
            assert_eq!(st, 200, "{body}");
            let d_local = untar(
                archive,
                &std::env::temp_dir().join(format!(
                    "stockade-bench-untar-{name}-{i}-{}",
                    std::process::id()
                )),
            );
            let d_tmpfs = untar(archive, &tmpfs.0.join(format!("x{i}")));
            if i > 0 {
                up.push(d_up);
                local.push(d_local);
                local_tmpfs.push(d_tmpfs);
            }
        }
        let (up, local, local_tmpfs) = (Stats::of(up), Stats::of(local), Stats::of(local_tmpfs));
        detail(&format!("upload {name}: PUT …/files"), &up);
        detail(&format!("local {name}: tar -x of it"), &local);
        detail(
            &format!("local {name}: tar -x of it on a tmpfs"),
            &local_tmpfs,
        );
        let mb = |d: Duration| archive.len() as f64 / 1e6 / d.as_secs_f64();
        let r = mb(up.median) / mb(local.median);
        rows.push(row(
            "25",
            format!(
                "upload: a {} MB tar, {what}, into /workspace (median)",
                archive.len() / 1_000_000
            ),
            format!("{:.0} MB/s ({})", mb(up.median), fmt_d(up.median)),
            format!(
                "tar -x locally {:.0} MB/s ({})",
                mb(local.median),
                fmt_d(local.median)
            ),
            format!("{r:.2}×"),
            "≥ 0.5×",
            Some(r >= 0.5),
        ));
        rows.push(row(
            "25",
            "upload: the same, against tar -x on a tmpfs (median)",
            format!("{:.0} MB/s", mb(up.median)),
            format!(
                "tar -x on a tmpfs {:.0} MB/s ({})",
                mb(local_tmpfs.median),
                fmt_d(local_tmpfs.median)
            ),
            format!("{:.2}×", mb(up.median) / mb(local_tmpfs.median)),
            "–",
            None,
        ));
    }
    let _ = http.request("POST", &format!("/v1/sandboxes/{key}/abort"), None);
    rows
}
