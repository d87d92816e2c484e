//! The container's filesystem, built by the supervisor in its new mount namespace:
//! a tmpfs root holding read-only recursive binds of the host's top-level directories,
//! a fresh `/proc`, a minimal `/dev`, a private `/tmp`, and `/workspace` and
//! `/artifacts` bound read-write from the container's host directory. Then
//! `pivot_root`, detach the old root, and make the new root read-only.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn ctx(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn mount(
    src: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(CString::new).transpose()?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let t = c(target)?;
    let p = |o: &Option<CString>| o.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: NUL-terminated strings or null.
    let r = unsafe { libc::mount(p(&src), t.as_ptr(), p(&fstype), flags, p(&data).cast()) };
    if r < 0 {
        return Err(io::Error::last_os_error()).map_err(ctx(format!("mount {}", target.display())));
    }
    Ok(())
}

fn bind(src: &Path, target: &Path, recursive: bool) -> io::Result<()> {
    let s = src
        .to_str()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let rec = if recursive { libc::MS_REC } else { 0 };
    mount(Some(s), target, None, libc::MS_BIND | rec, None)
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Read-only and nosuid on `target` and every mount below it (`mount_setattr`,
/// `AT_RECURSIVE`: a plain remount would leave the submounts writable).
fn readonly_recursive(target: &Path) -> io::Result<()> {
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let t = c(target)?;
    // SAFETY: valid path and attr struct of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error())
            .map_err(ctx(format!("mount_setattr {}", target.display())));
    }
    Ok(())
}

const SKIP: &[&str] = &["proc", "sys", "dev", "tmp", "workspace", "artifacts"];
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Build the container's root under `<container_dir>/root` and pivot into it.
/// `data_dir` (holding every container's directories) is masked by an empty tmpfs if a
/// bound host directory contains it: one container must not read another's workspace.
pub fn setup(container_dir: &Path, data_dir: &Path) -> io::Result<()> {
    let root = Path::new("/");
    // Nothing done here may propagate back to the host's mounts.
    mount(None, root, None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    let new = container_dir.join("root");
    mount(
        Some("tmpfs"),
        &new,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=755,size=16m"),
    )?;

    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name();
        if SKIP.iter().any(|s| name.as_bytes() == s.as_bytes()) {
            continue;
        }
        let src = root.join(&name);
        let dst = new.join(&name);
        let meta = std::fs::symlink_metadata(&src)?;
        if meta.file_type().is_symlink() {
            // /bin -> usr/bin and friends
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if meta.is_dir() {
            std::fs::create_dir(&dst)?;
            bind(&src, &dst, true)?;
            readonly_recursive(&dst)?;
        }
    }
    if let Ok(rel) = data_dir.strip_prefix(root) {
        let masked = new.join(rel);
        if !rel.as_os_str().is_empty() && masked.is_dir() {
            mount(
                Some("tmpfs"),
                &masked,
                Some("tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                Some("size=4k"),
            )?;
        }
    }

    let proc_ = new.join("proc");
    std::fs::create_dir(&proc_)?;
    mount(
        Some("proc"),
        &proc_,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;

    let dev = new.join("dev");
    std::fs::create_dir(&dev)?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )?;
    for d in DEVICES {
        let host = Path::new("/dev").join(d);
        if !host.exists() {
            continue;
        }
        let node = dev.join(d);
        std::fs::File::create(&node)?;
        bind(&host, &node, false)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link))?;
    }
    let shm = dev.join("shm");
    std::fs::create_dir(&shm)?;
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=64m"),
    )?;

    let tmp = new.join("tmp");
    std::fs::create_dir(&tmp)?;
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=256m"),
    )?;

    for d in ["workspace", "artifacts"] {
        let dst = new.join(d);
        std::fs::create_dir(&dst)?;
        bind(&container_dir.join(d), &dst, false)?;
    }

    let cnew = c(&new)?;
    let dot = CString::new(".")?;
    // SAFETY: valid paths.
    unsafe {
        if libc::chdir(cnew.as_ptr()) < 0
            || libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) < 0
            || libc::umount2(dot.as_ptr(), libc::MNT_DETACH) < 0
            || libc::chdir(c"/".as_ptr()) < 0
        {
            return Err(io::Error::last_os_error()).map_err(ctx("pivot_root".into()));
        }
    }
    // The tmpfs root and /dev are read-only once their mountpoints exist.
    let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID;
    mount(None, root, None, ro, None)?;
    mount(None, Path::new("/dev"), None, ro | libc::MS_NOEXEC, None)?;
    Ok(())
}

/// Set the UTS namespace's hostname.
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: valid buffer and length.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
