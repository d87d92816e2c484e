//! The containers' identities (invariant 11): each container runs in
//! its own user namespace, and its ids `0..per_container` map onto a host range that
//! no other container and no host user has.
//!
//! The pool (`[substrate.ids]`) is `containers` ranges of `per_container` ids from
//! `start`. A range is *leased* by taking an exclusive `flock` on
//! `/run/stockade/ids/<first-id>.lock`: the lock dies with the process that holds it,
//! and it is machine-wide, so two servers (or a server and the test suites) with the
//! same pool never hand one range to two containers. A lease is released only after
//! every process of its container is dead.
//!
//! Inside a container, `0` is the supervisor (and owns what it builds: the root
//! filesystem's mountpoints, `/tmp`), and workloads run as [`WORKLOAD_ID`], which owns
//! `/workspace` and `/artifacts`. A host file is reached with the permissions of an
//! unprivileged host uid, never root's.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FlockOperation, Mode, OFlags};

use stockade_runtime::config::IdPoolConfig;

/// The uid and gid workloads run as inside a container (the `sandbox` user).
pub use stockade_supervisor::exec::WORKLOAD_ID;

/// Where the machine-wide lease locks live.
pub const LOCK_DIR: &str = "/run/stockade/ids";

/// A pool that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The ranges do not fit in 32-bit ids, or are too small for a workload user.
    #[error(
        "substrate.ids: {containers} ranges of {per_container} ids from {start} do not fit: {why}"
    )]
    Shape {
        /// First id.
        start: u64,
        /// Ids per container.
        per_container: u64,
        /// Ranges.
        containers: u64,
        /// Why.
        why: &'static str,
    },
    /// Fewer ranges than containers that may exist (the ticket gate's ceiling and
    /// the warm pool).
    #[error(
        "substrate.ids.containers ({containers}) is below substrate.ceiling + substrate.warm ({ceiling})"
    )]
    TooFew {
        /// Ranges in the pool.
        containers: u32,
        /// The ceiling plus the warm pool.
        ceiling: u32,
    },
    /// A host user, group or subordinate range already uses ids of the pool.
    #[error(
        "substrate.ids overlaps {source_file}: {entry:?} uses ids in {start}..{end}; choose another start"
    )]
    Overlap {
        /// The file naming it.
        source_file: String,
        /// The entry.
        entry: String,
        /// The pool's first id.
        start: u64,
        /// One past the pool's last id.
        end: u64,
    },
}

/// The pool's id span `[start, end)`, checked for shape (pure).
pub fn span(cfg: &IdPoolConfig, ceiling: u32) -> Result<(u64, u64), PoolError> {
    let shape = |why| PoolError::Shape {
        start: cfg.start,
        per_container: cfg.per_container,
        containers: u64::from(cfg.containers),
        why,
    };
    if cfg.per_container <= u64::from(WORKLOAD_ID) {
        return Err(shape(
            "each range needs more than 1000 ids (the workload user is 1000)",
        ));
    }
    if cfg.start == 0 {
        return Err(shape("id 0 is the host's root"));
    }
    let end = cfg
        .per_container
        .checked_mul(u64::from(cfg.containers))
        .and_then(|n| n.checked_add(cfg.start))
        .ok_or_else(|| shape("the pool overflows"))?;
    // 4294967295 is (uid_t)-1, "no id", and 65534 is the overflow id.
    if end > u64::from(u32::MAX) {
        return Err(shape("the pool passes the last 32-bit id"));
    }
    if (cfg.start..end).contains(&65534) {
        return Err(shape("the pool contains the overflow id 65534"));
    }
    if cfg.containers < ceiling {
        return Err(PoolError::TooFew {
            containers: cfg.containers,
            ceiling,
        });
    }
    Ok((cfg.start, end))
}

/// Ids that a line of `/etc/passwd` or `/etc/group` (`name:x:ID:...`) or of
/// `/etc/subuid`/`subgid` (`name:FIRST:COUNT`) takes: `[first, end)`.
pub fn entry_ids(line: &str, subordinate: bool) -> Option<(u64, u64)> {
    let fields: Vec<&str> = line.trim().split(':').collect();
    if line.trim_start().starts_with('#') || fields.len() < 3 {
        return None;
    }
    if subordinate {
        let first: u64 = fields[1].parse().ok()?;
        let count: u64 = fields[2].parse().ok()?;
        Some((first, first.saturating_add(count)))
    } else {
        let id: u64 = fields[2].parse().ok()?;
        Some((id, id + 1))
    }
}

/// The first entry of `text` (a passwd, group, subuid or subgid file) whose ids fall in
/// `[start, end)` (pure).
pub fn overlap(text: &str, subordinate: bool, start: u64, end: u64) -> Option<String> {
    text.lines()
        .find(|l| entry_ids(l, subordinate).is_some_and(|(a, b)| a < end && start < b))
        .map(|l| l.trim().to_string())
}

/// Check the pool at start-up: its shape, and that no host user, group or subordinate
/// range uses its ids.
pub fn check(cfg: &IdPoolConfig, ceiling: u32) -> Result<(), PoolError> {
    let (start, end) = span(cfg, ceiling)?;
    for (file, subordinate) in [
        ("/etc/passwd", false),
        ("/etc/group", false),
        ("/etc/subuid", true),
        ("/etc/subgid", true),
    ] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        if let Some(entry) = overlap(&text, subordinate, start, end) {
            return Err(PoolError::Overlap {
                source_file: file.into(),
                entry,
                start,
                end,
            });
        }
    }
    Ok(())
}

/// One container's host id range, held while the lock file is locked.
#[derive(Debug)]
pub struct Lease {
    /// The host id of the container's `0`.
    pub base: u32,
    /// Ids in the range.
    pub size: u32,
    _lock: OwnedFd,
}

impl Lease {
    /// The host uid (= gid) of an id inside the container.
    pub fn host(&self, inside: u32) -> u32 {
        self.base + inside
    }

    /// The line for `/proc/<pid>/uid_map` and `gid_map`.
    pub fn map_line(&self) -> String {
        map_line(self.base, self.size)
    }
}

/// `inside-first host-first count` (pure).
pub fn map_line(base: u32, size: u32) -> String {
    format!("0 {base} {size}\n")
}

/// The lock file of the range starting at `base`.
fn lock_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base}.lock"))
}

/// Lease a free range of the pool (`None`: every range is leased).
pub fn lease(cfg: &IdPoolConfig) -> io::Result<Option<Lease>> {
    /// Where this process's next lease starts looking.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    lease_in(Path::new(LOCK_DIR), cfg, &NEXT)
}

/// [`lease`] with the lock directory and the cursor given (tests). The ranges are
/// tried from `next` on, wrapping, and `next` is left just past the one leased: with
/// N containers live, a lease tries the ranges after the last one taken (free, unless
/// the pool wrapped) instead of trying the N taken ones first (an `open` and a
/// refused `flock` each: 1.5 ms of every cold start at 1000 live).
pub fn lease_in(dir: &Path, cfg: &IdPoolConfig, next: &AtomicU64) -> io::Result<Option<Lease>> {
    std::fs::create_dir_all(dir)?;
    let size = u32::try_from(cfg.per_container).map_err(io::Error::other)?;
    let n = u64::from(cfg.containers);
    let first = next.load(Ordering::Relaxed);
    for k in 0..n {
        let i = (first + k) % n;
        let base = cfg.start + i * cfg.per_container;
        let fd = rustix::fs::open(
            lock_path(dir, base),
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                next.store(i + 1, Ordering::Relaxed);
                return Ok(Some(Lease {
                    base: u32::try_from(base).map_err(io::Error::other)?,
                    size,
                    _lock: fd,
                }));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(start: u64, per: u64, n: u32) -> IdPoolConfig {
        IdPoolConfig {
            start,
            per_container: per,
            containers: n,
        }
    }

    #[test]
    fn a_pool_must_fit_and_cover_the_ceiling() {
        let rows: &[(IdPoolConfig, u32, bool)] = &[
            // the default pool, ceiling 16
            (IdPoolConfig::default(), 16, true),
            // too few ranges for the ceiling
            (pool(2_000_000_000, 65536, 8), 16, false),
            // a range too small for the workload user 1000
            (pool(2_000_000_000, 1000, 64), 16, false),
            // past the last 32-bit id
            (pool(4_294_000_000, 65536, 64), 16, false),
            // the host's root
            (pool(0, 65536, 64), 16, false),
            // the overflow id
            (pool(60_000, 65536, 16), 16, false),
        ];
        for (cfg, ceiling, ok) in rows {
            assert_eq!(
                span(cfg, *ceiling).is_ok(),
                *ok,
                "{cfg:?} ceiling {ceiling}"
            );
        }
    }

    #[test]
    fn a_host_user_or_subordinate_range_inside_the_pool_is_an_overlap() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\n# c\nsvc:x:2000000100:2000000100::/:/bin/false\n";
        assert_eq!(
            overlap(passwd, false, 2_000_000_000, 2_000_065_536).as_deref(),
            Some("svc:x:2000000100:2000000100::/:/bin/false")
        );
        assert_eq!(overlap(passwd, false, 3_000_000_000, 3_000_065_536), None);
        let subuid = "alice:100000:65536\nbob:1999990000:20000\n";
        assert!(overlap(subuid, true, 2_000_000_000, 2_004_194_304).is_some());
        assert_eq!(overlap(subuid, true, 165_536, 200_000), None);
        assert_eq!(entry_ids("broken", false), None);
    }

    #[test]
    fn leases_are_exclusive_until_dropped() {
        let dir = std::env::temp_dir().join(format!("stockade-ids-{}", uuid::Uuid::new_v4()));
        let cfg = pool(2_100_000_000, 65536, 2);
        let next = AtomicU64::new(0);
        let a = lease_in(&dir, &cfg, &next).unwrap().expect("a free range");
        let b = lease_in(&dir, &cfg, &next)
            .unwrap()
            .expect("another free range");
        assert_ne!(a.base, b.base);
        assert!(
            lease_in(&dir, &cfg, &next).unwrap().is_none(),
            "the pool is exhausted"
        );
        let freed = a.base;
        drop(a);
        assert_eq!(lease_in(&dir, &cfg, &next).unwrap().unwrap().base, freed);
        assert_eq!(b.map_line(), format!("0 {} 65536\n", b.base));
        assert_eq!(b.host(WORKLOAD_ID), b.base + 1000);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A lease tries the ranges after the last one it took first: with many taken, it
    /// does not walk them all again (each try is an `open` and a refused `flock`).
    #[test]
    fn a_lease_starts_after_the_last_one_taken_and_wraps() {
        let dir = std::env::temp_dir().join(format!("stockade-ids-{}", uuid::Uuid::new_v4()));
        let cfg = pool(2_100_000_000, 65536, 4);
        let next = AtomicU64::new(0);
        let take = || lease_in(&dir, &cfg, &next).unwrap().expect("a free range");
        let index = |l: &Lease| (u64::from(l.base) - cfg.start) / cfg.per_container;
        let (a, b) = (take(), take());
        assert_eq!((index(&a), index(&b)), (0, 1));
        drop(a);
        let c = take();
        assert_eq!(index(&c), 2, "after the last one taken, not the first free");
        let d = take();
        assert_eq!(index(&d), 3);
        let e = take();
        assert_eq!(index(&e), 0, "wrapped to the freed range");
        assert!(lease_in(&dir, &cfg, &next).unwrap().is_none(), "all taken");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files, 4);
        drop((b, c, d, e));
        let _ = std::fs::remove_dir_all(dir);
    }
}
