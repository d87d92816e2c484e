//! The container's filesystem, built by the supervisor (root of the container's user
//! namespace, unprivileged on the host) in its new mount namespace, with the new mount
//! API: every mount is a detached tree (`fsmount`, `open_tree(OPEN_TREE_CLONE)`) made
//! `nosuid,nodev` (and read-only where it is not the container's own storage) before
//! it is attached under the new root, so nothing is ever visible with weaker flags.
//! Then `pivot_root`, detach the old root, and make the root read-only.
//!
//! What the root holds is [`super::rootfs`]'s plan. Host paths the supervisor's host
//! uid may not traverse (the 0700 data directory) arrive as descriptors opened by the
//! clone child before it dropped the host's root ([`Fds`]).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags,
};

use super::rootfs::{self, Kind, Source, Step};
use super::storage;

/// The descriptors the supervisor builds the root from.
pub struct Fds<'a> {
    /// `<container-dir>/root`: where the new root is attached.
    pub mountpoint: BorrowedFd<'a>,
    /// `<container-dir>/fs`: the container's storage (`workspace`, `artifacts`, `tmp`).
    pub storage: BorrowedFd<'a>,
    /// The image directory (`rootfs = DIR`); `None` for the host.
    pub image: Option<BorrowedFd<'a>>,
}

fn ctx(what: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> io::Error {
    let what = what.into();
    move |e| io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
}

/// `mount_setattr`'s attribute bits (linux/mount.h).
const ATTR_RDONLY: u64 = 0x1;
const ATTR_NOSUID: u64 = 0x2;
const ATTR_NODEV: u64 = 0x4;
const ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set `set` on the mount `fd` refers to (and every mount below it if `recursive`).
/// rustix has no `mount_setattr`; this is its one raw call.
fn set_attr(fd: BorrowedFd<'_>, set: u64, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `fd` is a live descriptor, the path is a NUL-terminated empty string and
    // `attr` is a `struct mount_attr` of the size passed; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            c"".as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new, detached filesystem of `fstype` with `options`, mounted with `attrs`.
fn new_fs(fstype: &str, options: &[(&str, &str)], attrs: MountAttrFlags) -> io::Result<OwnedFd> {
    let fs = rustix::mount::fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(ctx(format!("fsopen {fstype}")))?;
    for (k, v) in options {
        rustix::mount::fsconfig_set_string(&fs, *k, *v)
            .map_err(ctx(format!("{fstype} {k}={v}")))?;
    }
    rustix::mount::fsconfig_create(&fs).map_err(ctx(format!("creating {fstype}")))?;
    rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(ctx(format!("fsmount {fstype}")))
}

/// A detached copy of the mount tree at `path` (relative to `at`).
fn clone_tree(at: BorrowedFd<'_>, path: &CStr, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    if path.is_empty() {
        flags |= OpenTreeFlags::AT_EMPTY_PATH;
    }
    rustix::mount::open_tree(at, path, flags).map_err(ctx(format!("open_tree {path:?}")))
}

/// Attach the detached tree `tree` on `name` (relative to `at`).
fn attach(tree: &OwnedFd, at: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    rustix::mount::move_mount(tree, c"", at, name, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(ctx(format!("attaching {name:?}")))
}

fn cs(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn mkdir(at: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    rustix::fs::mkdirat(at, name, Mode::from_raw_mode(mode)).map_err(ctx(format!("mkdir {name:?}")))
}

fn open_sub(at: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(ctx(format!("open {name:?}")))
}

/// An empty file to bind a file onto.
fn touch(at: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    rustix::fs::openat(
        at,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map(drop)
    .map_err(ctx(format!("create {name:?}")))
}

/// The entries of the directory `dir`, typed, symlinks with their targets.
fn listing(dir: BorrowedFd<'_>) -> io::Result<Vec<(String, Kind)>> {
    let mut out = Vec::new();
    for (name, _) in storage::entries(dir)? {
        let Ok(text) = name.to_str() else { continue };
        let kind = match storage::kind(dir, &name) {
            Ok(FileType::Directory) => Kind::Dir,
            Ok(FileType::RegularFile) => Kind::File,
            Ok(FileType::Symlink) => match rustix::fs::readlinkat(dir, &name, Vec::new()) {
                Ok(t) => Kind::Link(PathBuf::from(std::ffi::OsStr::from_bytes(t.as_bytes()))),
                Err(_) => Kind::Other,
            },
            _ => Kind::Other,
        };
        out.push((text.to_string(), kind));
    }
    out.sort();
    Ok(out)
}

/// Carry out `steps` from the source directory `src` into `dst`.
fn apply(steps: &[Step], src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> io::Result<()> {
    const RO: u64 = ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV;
    for s in steps {
        match s {
            Step::Link(name, target) => {
                rustix::fs::symlinkat(target.as_os_str().as_bytes(), dst, name.as_str())
                    .map_err(ctx(format!("symlink {name}")))?;
            }
            Step::Bind(name, kind) => {
                let n = cs(name)?;
                if *kind == Kind::Dir {
                    mkdir(dst, &n, 0o755)?;
                } else {
                    touch(dst, &n)?;
                }
                let tree = clone_tree(src, &n, true)?;
                set_attr(tree.as_fd(), RO, true)
                    .map_err(|e| io::Error::new(e.kind(), format!("read-only {name}: {e}")))?;
                attach(&tree, dst, &n)?;
            }
        }
    }
    Ok(())
}

/// Build the container's root under `fds.mountpoint` and pivot into it.
pub fn setup(fds: &Fds<'_>, hostname: &str, ca_pem: Option<&str>) -> io::Result<()> {
    // Nothing done here may propagate back to the host's mounts.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(ctx("making / private"))?;

    let nosuid_nodev = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    let root = new_fs("tmpfs", &[("size", "4m"), ("mode", "0755")], nosuid_nodev)?;
    rustix::mount::move_mount(
        &root,
        c"",
        fds.mountpoint,
        c"",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(ctx("attaching the root"))?;
    let r = root.as_fd();

    // The source: this machine's `/`, or the image.
    let (source, src_root) = match fds.image {
        Some(fd) => (Source::Image(PathBuf::from("image")), open_sub(fd, c".")?),
        None => (Source::Host, open_sub(rustix::fs::CWD, c"/")?),
    };
    apply(
        &rootfs::top_level(&source, &listing(src_root.as_fd())?),
        src_root.as_fd(),
        r,
    )?;

    // /etc: made for the container, plus what the plan takes from the source's.
    mkdir(r, c"etc", 0o755)?;
    let etc = open_sub(r, c"etc")?;
    for (name, text) in rootfs::generated_etc(hostname) {
        let f = rustix::fs::openat(
            &etc,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(ctx(format!("/etc/{name}")))?;
        io::Write::write_all(&mut std::fs::File::from(f), text.as_bytes())?;
    }
    if let Ok(src_etc) = open_sub(src_root.as_fd(), c"etc") {
        apply(
            &rootfs::etc(&source, &listing(src_etc.as_fd())?),
            src_etc.as_fd(),
            etc.as_fd(),
        )?;
    }

    if let Some(pem) = ca_pem {
        trust_ca(src_root.as_fd(), etc.as_fd(), pem)?;
    }

    proc_(r)?;
    dev(r)?;

    // The container's own storage: writable, nosuid, nodev.
    for name in [c"workspace", c"artifacts", c"tmp"] {
        mkdir(r, name, 0o755)?;
        let tree = clone_tree(fds.storage, name, false)?;
        set_attr(tree.as_fd(), ATTR_NOSUID | ATTR_NODEV, false)?;
        attach(&tree, r, name)?;
    }
    mkdir(r, c"run", 0o755)?;
    mkdir(r, c"var", 0o755)?;
    rustix::fs::symlinkat("/tmp", r, "var/tmp").map_err(ctx("/var/tmp"))?;

    rustix::process::fchdir(r).map_err(ctx("entering the root"))?;
    rustix::process::pivot_root(".", ".").map_err(ctx("pivot_root"))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(ctx("detaching the old root"))?;
    rustix::process::chdir("/").map_err(ctx("chdir /"))?;
    drop(src_root);
    // The root and /dev are read-only once their mountpoints exist (not recursive:
    // the storage below stays writable).
    let root_now = open_sub(rustix::fs::CWD, c"/")?;
    set_attr(
        root_now.as_fd(),
        ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV,
        false,
    )?;
    let dev_now = open_sub(rustix::fs::CWD, c"/dev")?;
    set_attr(
        dev_now.as_fd(),
        ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC,
        false,
    )?;
    Ok(())
}

/// Make the container trust its egress CA: `/etc/stockade/ca.pem`, the source's system
/// bundle plus the CA in `/etc/stockade/ca-bundle.pem`, and that bundle bound over the
/// system bundle's path when it is a regular file. The source's bundle is opened with
/// `RESOLVE_IN_ROOT`: an image's symlink cannot make it read a host file.
fn trust_ca(src_root: BorrowedFd<'_>, etc: BorrowedFd<'_>, pem: &str) -> io::Result<()> {
    use std::io::{Read, Write};
    let dir = cs(rootfs::CA_DIR)?;
    mkdir(etc, &dir, 0o755)?;
    let ca_dir = open_sub(etc, &dir)?;
    let write = |name: &str, text: &str| -> io::Result<()> {
        let f = rustix::fs::openat(
            &ca_dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(ctx(format!("/etc/stockade/{name}")))?;
        std::fs::File::from(f).write_all(text.as_bytes())
    };
    write("ca.pem", pem)?;
    let mut system = String::new();
    let mut found: Option<&str> = None;
    for candidate in rootfs::SYSTEM_BUNDLES {
        let opened = rustix::fs::openat2(
            src_root,
            format!("etc/{candidate}"),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
            rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
        );
        let Ok(fd) = opened else { continue };
        let st = rustix::fs::fstat(&fd).map_err(ctx(format!("stat {candidate}")))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            continue;
        }
        std::fs::File::from(fd)
            .take(rootfs::MAX_SYSTEM_BUNDLE)
            .read_to_string(&mut system)?;
        found = Some(candidate);
        break;
    }
    write("ca-bundle.pem", &rootfs::ca_bundle(&system, pem))?;
    // The system path inside the container's /etc, when it is a plain file there.
    if let Some(candidate) = found {
        let target = rustix::fs::openat2(
            etc,
            candidate,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
        );
        if let Ok(target) = target
            && rustix::fs::fstat(&target)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
        {
            let tree = clone_tree(ca_dir.as_fd(), c"ca-bundle.pem", false)?;
            set_attr(tree.as_fd(), ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, false)?;
            rustix::mount::move_mount(
                &tree,
                c"",
                &target,
                c"",
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
            )
            .map_err(ctx(format!("binding the CA bundle over /etc/{candidate}")))?;
        }
    }
    Ok(())
}

/// A fresh `/proc` with runc's masked and read-only paths.
fn proc_(r: BorrowedFd<'_>) -> io::Result<()> {
    let proc_fs = new_fs(
        "proc",
        &[],
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )?;
    mkdir(r, c"proc", 0o555)?;
    attach(&proc_fs, r, c"proc")?;
    let p = open_sub(r, c"proc")?;
    for name in rootfs::MASKED {
        let n = cs(name)?;
        match storage::kind(p.as_fd(), &n) {
            Ok(FileType::Directory) => {
                let empty = new_fs(
                    "tmpfs",
                    &[("size", "4k"), ("mode", "0555")],
                    MountAttrFlags::MOUNT_ATTR_RDONLY
                        | MountAttrFlags::MOUNT_ATTR_NOSUID
                        | MountAttrFlags::MOUNT_ATTR_NODEV
                        | MountAttrFlags::MOUNT_ATTR_NOEXEC,
                )?;
                attach(&empty, p.as_fd(), &n)?;
            }
            Ok(_) => {
                let null = clone_tree(rustix::fs::CWD, c"/dev/null", false)?;
                attach(&null, p.as_fd(), &n)?;
            }
            Err(_) => {} // not on this kernel
        }
    }
    for name in rootfs::READ_ONLY {
        let n = cs(name)?;
        if storage::kind(p.as_fd(), &n).is_err() {
            continue;
        }
        let tree = clone_tree(p.as_fd(), &n, true)?;
        set_attr(
            tree.as_fd(),
            ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC,
            true,
        )?;
        attach(&tree, p.as_fd(), &n)?;
    }
    Ok(())
}

/// `/dev`: a tmpfs with six host devices bound in (the only mounts without `nodev`),
/// the `fd`/`std*` links and a `/dev/shm`.
fn dev(r: BorrowedFd<'_>) -> io::Result<()> {
    let dev_fs = new_fs(
        "tmpfs",
        &[("size", "64k"), ("mode", "0755")],
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )?;
    mkdir(r, c"dev", 0o755)?;
    attach(&dev_fs, r, c"dev")?;
    let d = open_sub(r, c"dev")?;
    for name in rootfs::DEVICES {
        let host = Path::new("/dev").join(name);
        if !host.exists() {
            continue;
        }
        let n = cs(name)?;
        touch(d.as_fd(), &n)?;
        let node = clone_tree(rustix::fs::CWD, &cs(&host.to_string_lossy())?, false)?;
        set_attr(node.as_fd(), ATTR_NOSUID | ATTR_NOEXEC, false)?;
        attach(&node, d.as_fd(), &n)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        rustix::fs::symlinkat(target, &d, link).map_err(ctx(format!("/dev/{link}")))?;
    }
    let shm = new_fs(
        "tmpfs",
        &[("size", "64m"), ("mode", "1777")],
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )?;
    mkdir(d.as_fd(), c"shm", 0o1777)?;
    attach(&shm, d.as_fd(), c"shm")?;
    Ok(())
}

/// Set the UTS namespace's hostname.
pub fn set_hostname(name: &str) -> io::Result<()> {
    Ok(rustix::system::sethostname(name.as_bytes())?)
}
