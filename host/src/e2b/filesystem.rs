//! envd's `filesystem.Filesystem` service over Connect (JSON codec): `Stat`,
//! `ListDir`, `MakeDir`, `Move`, `Remove`, `CreateWatcher`, `GetWatcherEvents`,
//! `RemoveWatcher` (unary) and `WatchDir` (a server stream).
//!
//! Every call is a **fenced exec with no grant of one fixed script** ([`SCRIPT`]), its
//! verb and paths argv elements (never part of the script), through the API with the
//! caller's token, as `files::read` is: the API's checks, the sandbox's user, nothing
//! decided here but E2B's shapes. Paths map as `/files` maps them
//! ([`ids::workspace_entry`], [`ids::workspace_path`]): anything outside `/home/user`
//! (the sandbox's `/workspace`) is `invalid_argument` before any call. Entries are
//! read with `find -printf`, NUL-separated ([`parse`]), at most [`MAX_ENTRIES`] per
//! call and the API's output bound; past either, `resource_exhausted`, never a
//! silently cut listing.
//!
//! **Watches poll** (no inotify reaches through the API): a watch is a listing of the
//! directory (one level, or [`WATCH_DEPTH`] if recursive) diffed against the last one
//! ([`diff`]) into envd's events: a new path is `CREATE` (and `WRITE` if it is a
//! non-empty file, as a create-then-write reads on envd), a changed size or mtime
//! `WRITE`, a changed mode `CHMOD`, a gone path `REMOVE`, or `RENAME` if its inode is
//! at a new path (the new path is then a `CREATE`, as fsnotify reports a rename).
//! Granularity: `WatchDir` lists every [`POLL`]; the sync SDK's watcher
//! (`CreateWatcher`, then `GetWatcherEvents`) lists when asked for events. A file made
//! and removed between two listings is not seen; several writes are one `WRITE`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use stockade_wire::CommandBody;
use tokio::sync::mpsc;

use super::connect::{self, Code, RpcError};
use super::process::{failed, sandbox_of, streaming, unary_error};
use super::{E2b, Sandbox, header, ids};

/// The most entries one call lists (a listing past it is refused, never cut short).
pub const MAX_ENTRIES: usize = 10_000;
/// A ListDir's depth is at most this (a deeper ask lists this deep).
pub const MAX_DEPTH: u32 = 64;
/// How deep a recursive watch looks.
pub const WATCH_DEPTH: u32 = 16;
/// How often a `WatchDir` stream lists its directory.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(500);
/// At most this many watchers (`CreateWatcher`) per sandbox (each keeps a listing)...
pub const MAX_WATCHERS_PER_SANDBOX: usize = 16;
/// ...and in all (a create past either: `resource_exhausted`).
pub const MAX_WATCHERS: usize = 1024;

/// The fields `find -printf` writes per entry, each NUL-terminated: its type, its
/// target's type (a symlink's), size, permission bits (octal), `ls`-style
/// permissions, owner, group, mtime (seconds since the epoch), inode, a symlink's
/// target, the path.
const FIELDS: usize = 11;

/// The one script every call runs: `$1` the verb, then its paths (absolute, under
/// `/workspace`, so never an option to `find`). Exit 44: no such entry; 45: not a
/// directory, or there and not a directory (MakeDir); 47: a directory already there
/// (MakeDir); 48: mkdir or mv failed (its stderr says why).
pub const SCRIPT: &str = r#"F='%y\0%Y\0%s\0%m\0%M\0%u\0%g\0%T@\0%i\0%l\0%p\0'
v=$1; shift
case $v in
stat)
  [ -e "$1" ] || [ -L "$1" ] || exit 44
  exec find "$1" -maxdepth 0 -printf "$F" ;;
list)
  [ -e "$1" ] || [ -L "$1" ] || exit 44
  [ -d "$1" ] || exit 45
  find -H "$1" -mindepth 1 -maxdepth "$2" -printf "$F" | head -z -n "$3"
  exit 0 ;;
mkdir)
  [ -d "$1" ] && exit 47
  if [ -e "$1" ] || [ -L "$1" ]; then exit 45; fi
  mkdir -p -- "$1" || exit 48
  exec find "$1" -maxdepth 0 -printf "$F" ;;
move)
  [ -e "$1" ] || [ -L "$1" ] || exit 44
  mkdir -p -- "$(dirname -- "$2")" || exit 48
  mv -T -- "$1" "$2" || exit 48
  exec find "$2" -maxdepth 0 -printf "$F" ;;
remove)
  exec rm -rf -- "$1" ;;
esac
exit 2"#;

/// One entry as `find` reported it (pure data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    /// `%y`: `f`, `d`, `l`, or another (a socket, a fifo...).
    pub kind: char,
    /// `%Y`: the type a symlink points at (`N`: nothing; `L`: a loop).
    pub target_kind: char,
    /// `%s`: bytes.
    pub size: u64,
    /// `%m`: the permission bits.
    pub mode: u32,
    /// `%M`: as `ls -l` shows them.
    pub permissions: String,
    /// `%u`, `%g`: names, or ids where the container has none.
    pub owner: String,
    /// See `owner`.
    pub group: String,
    /// `%T@` as written: compared as it is (a changed mtime is a write).
    pub mtime: String,
    /// `%i`: tells a rename from a remove and a create.
    pub inode: u64,
    /// `%l`: a symlink's target.
    pub link: String,
    /// Relative to `/workspace` (`""`: the workspace itself).
    pub rel: String,
}

/// The entries of `find -printf`'s NUL-separated output (pure). Anything but whole
/// records of [`FIELDS`] fields under `/workspace` is refused; so is more than `max`.
pub fn parse(out: &[u8], max: usize) -> Result<Vec<Raw>, String> {
    if out.is_empty() {
        return Ok(vec![]);
    }
    let body = out
        .strip_suffix(b"\0")
        .ok_or("the listing does not end with a NUL")?;
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    if !fields.len().is_multiple_of(FIELDS) {
        return Err(format!(
            "the listing has {} fields, not records of {FIELDS}",
            fields.len()
        ));
    }
    if fields.len() / FIELDS > max {
        return Err(format!("more than {max} entries"));
    }
    fields.chunks(FIELDS).map(record).collect()
}

fn record(f: &[&[u8]]) -> Result<Raw, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let one = |b: &[u8], what: &str| match b {
        [c] => Ok(*c as char),
        _ => Err(format!("{what}: not one character")),
    };
    let num = |b: &[u8], what: &str| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| format!("{what}: not a number"))
    };
    let mode = std::str::from_utf8(f[3])
        .ok()
        .and_then(|s| u32::from_str_radix(s, 8).ok())
        .filter(|m| *m <= 0o7777)
        .ok_or("mode: not octal permission bits")?;
    let mtime = text(f[7]);
    if mtime_secs(&mtime).is_none() {
        return Err("mtime: not seconds".into());
    }
    let path = text(f[10]);
    let rel = if path == ids::WORKSPACE {
        String::new()
    } else {
        path.strip_prefix(&format!("{}/", ids::WORKSPACE))
            .ok_or_else(|| format!("{path}: not under {}", ids::WORKSPACE))?
            .to_string()
    };
    Ok(Raw {
        kind: one(f[0], "type")?,
        target_kind: one(f[1], "target type")?,
        size: num(f[2], "size")?,
        mode,
        permissions: text(f[4]),
        owner: text(f[5]),
        group: text(f[6]),
        mtime,
        inode: num(f[8], "inode")?,
        link: text(f[9]),
        rel,
    })
}

/// `%T@`'s whole seconds (it may carry a fraction).
fn mtime_secs(t: &str) -> Option<u64> {
    let (s, frac) = t.split_once('.').unwrap_or((t, ""));
    frac.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
    s.parse().ok()
}

/// envd's `FileType` of an entry (pure): a symlink has its target's type (and
/// `isSymlink`), a dangling one `SYMLINK`; a socket or fifo none (the SDK skips it).
fn file_type(r: &Raw) -> &'static str {
    let t = if r.kind == 'l' { r.target_kind } else { r.kind };
    match t {
        'f' => "FILE_TYPE_FILE",
        'd' => "FILE_TYPE_DIRECTORY",
        'N' | 'L' => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

/// envd's `EntryInfo` (protobuf JSON: camelCase, int64 as a string), its path in
/// E2B's namespace (pure).
pub fn entry_info(r: &Raw) -> Value {
    let path = ids::e2b_path(&r.rel);
    let name = path.rsplit('/').next().unwrap_or_default().to_string();
    let secs = mtime_secs(&r.mtime).unwrap_or(0);
    let mut v = json!({
        "name": name,
        "type": file_type(r),
        "path": path,
        "size": r.size.to_string(),
        "mode": r.mode,
        "permissions": r.permissions,
        "owner": r.owner,
        "group": r.group,
        "modifiedTime": super::control::rfc3339(secs.saturating_mul(1000)),
        "isSymlink": r.kind == 'l',
    });
    if r.kind == 'l' {
        v["symlinkTarget"] = Value::String(r.link.clone());
    }
    v
}

/// A request's message (pure): the JSON of a unary body (`application/json`) or of a
/// stream's one envelope, as `T`; anything else `invalid_argument`.
pub fn decode<T: DeserializeOwned>(body: &[u8], streamed: bool, what: &str) -> Result<T, RpcError> {
    let json = if streamed {
        connect::single(body).map_err(|f| {
            RpcError::new(
                Code::InvalidArgument,
                format!("not one message envelope: {f:?}"),
            )
        })?
    } else {
        body
    };
    serde_json::from_slice(json)
        .map_err(|x| RpcError::new(Code::InvalidArgument, format!("{what}: {x}")))
}

/// The `/workspace`-relative path of a request's E2B path, the home allowed or not.
fn mapped(path: &str, home: bool) -> Result<String, RpcError> {
    let r = if home {
        ids::workspace_entry(path)
    } else {
        ids::workspace_path(path)
    };
    r.map_err(|m| RpcError::new(Code::InvalidArgument, m))
}

fn abs(rel: &str) -> String {
    if rel.is_empty() {
        ids::WORKSPACE.to_string()
    } else {
        format!("{}/{rel}", ids::WORKSPACE)
    }
}

/// Run [`SCRIPT`]'s `verb` on `args` in the caller's sandbox; its entries.
async fn run(
    e: &E2b,
    token: &str,
    s: &Sandbox,
    verb: &str,
    args: &[String],
    shown: &str,
) -> Result<Vec<Raw>, RpcError> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        SCRIPT.into(),
        "fs".into(),
        verb.into(),
    ];
    argv.extend(args.iter().cloned());
    let cmd = CommandBody {
        argv,
        timeout_ms: Some(60_000),
        // An empty grant of its own, not the key's network: nothing leaves the sandbox.
        grant: Some(stockade_wire::GrantBody::default()),
        ..Default::default()
    };
    let out = e
        .client(token)
        .exec(&s.key, &cmd)
        .await
        .map_err(super::process::rpc_of)?;
    let err = |code, m: String| Err(RpcError::new(code, m));
    match out.exit_code {
        0 if out.truncated => err(
            Code::ResourceExhausted,
            format!("{shown}: the listing is past the API's output bound"),
        ),
        0 => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&out.stdout_base64)
                .map_err(|x| RpcError::new(Code::Internal, x.to_string()))?;
            parse(&bytes, MAX_ENTRIES).map_err(|m| {
                let code = if m.starts_with("more than") {
                    Code::ResourceExhausted
                } else {
                    Code::Internal
                };
                RpcError::new(code, format!("{shown}: {m}"))
            })
        }
        44 => err(Code::NotFound, format!("path '{shown}' does not exist")),
        45 if verb == "mkdir" => err(
            Code::InvalidArgument,
            format!("path '{shown}' already exists and is not a directory"),
        ),
        45 => err(
            Code::InvalidArgument,
            format!("path '{shown}' is not a directory"),
        ),
        47 => err(
            Code::AlreadyExists,
            format!("directory '{shown}' already exists"),
        ),
        48 => err(
            Code::InvalidArgument,
            format!("{shown}: {}", out.stderr.trim()),
        ),
        n => err(
            Code::Internal,
            format!("{verb} '{shown}' failed (exit {n}): {}", out.stderr.trim()),
        ),
    }
}

/// One unary call: the caller's sandbox, its request, the answer or a Connect error.
async fn unary<T, F, Fut>(e: Arc<E2b>, h: HeaderMap, body: Bytes, what: &str, f: F) -> Response
where
    T: DeserializeOwned,
    F: FnOnce(Arc<E2b>, String, String, Sandbox, T) -> Fut,
    Fut: std::future::Future<Output = Result<Value, RpcError>>,
{
    let (token, id, s) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let req = match decode::<T>(&body, false, what) {
        Ok(r) => r,
        Err(err) => return unary_error(err),
    };
    match f(e, token, id, s, req).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(err) => unary_error(err),
    }
}

/// `{path}` (Stat, MakeDir, Remove).
#[derive(Debug, Deserialize)]
pub struct PathRequest {
    path: String,
}

/// `ListDirRequest`.
#[derive(Debug, Deserialize)]
pub struct ListDirRequest {
    path: String,
    #[serde(default)]
    depth: u32,
}

/// `MoveRequest`.
#[derive(Debug, Deserialize)]
pub struct MoveRequest {
    source: String,
    destination: String,
}

/// `WatchDirRequest`, `CreateWatcherRequest`.
#[derive(Debug, Deserialize)]
pub struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry", alias = "include_entry")]
    include_entry: bool,
}

/// `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Debug, Deserialize)]
pub struct WatcherRequest {
    #[serde(rename = "watcherId", alias = "watcher_id")]
    watcher_id: String,
}

fn one_entry(v: Vec<Raw>, shown: &str) -> Result<Value, RpcError> {
    v.first()
        .map(|r| json!({"entry": entry_info(r)}))
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("path '{shown}' does not exist")))
}

/// `POST /filesystem.Filesystem/Stat`: the entry (`not_found` if none).
pub async fn stat(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "StatRequest",
        |e, t, _, s, r: PathRequest| async move {
            let rel = mapped(&r.path, true)?;
            let v = run(&e, &t, &s, "stat", &[abs(&rel)], &r.path).await?;
            one_entry(v, &r.path)
        },
    )
    .await
}

/// The depth a ListDir lists (pure): 0 (the SDK's "not set") is 1, as envd's; at
/// most [`MAX_DEPTH`].
pub fn list_depth(asked: u32) -> u32 {
    asked.clamp(1, MAX_DEPTH)
}

/// `POST /filesystem.Filesystem/ListDir`: the entries under a directory, `depth`
/// levels deep (`not_found` if none; `invalid_argument` if not a directory).
pub async fn list_dir(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "ListDirRequest",
        |e, t, _, s, r: ListDirRequest| async move {
            let rel = mapped(&r.path, true)?;
            let v = list(&e, &t, &s, &rel, list_depth(r.depth), &r.path).await?;
            Ok(json!({"entries": v.iter().map(entry_info).collect::<Vec<_>>()}))
        },
    )
    .await
}

async fn list(
    e: &E2b,
    token: &str,
    s: &Sandbox,
    rel: &str,
    depth: u32,
    shown: &str,
) -> Result<Vec<Raw>, RpcError> {
    // One record past the bound is read, so "more than" is told from "exactly".
    let lines = (MAX_ENTRIES + 1) * FIELDS;
    let args = [abs(rel), depth.to_string(), lines.to_string()];
    let mut v = run(e, token, s, "list", &args, shown).await?;
    // In path order, as envd's walk lists (find's is the directory's own).
    v.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(v)
}

/// `POST /filesystem.Filesystem/MakeDir`: the directory and its parents; one already
/// there is `already_exists` (the SDK's `make_dir` then answers False).
pub async fn make_dir(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "MakeDirRequest",
        |e, t, _, s, r: PathRequest| async move {
            let rel = mapped(&r.path, true)?;
            let v = run(&e, &t, &s, "mkdir", &[abs(&rel)], &r.path).await?;
            one_entry(v, &r.path)
        },
    )
    .await
}

/// `POST /filesystem.Filesystem/Move`: a rename (`mv -T`, the destination's parents
/// made); the moved entry.
pub async fn move_(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "MoveRequest",
        |e, t, _, s, r: MoveRequest| async move {
            let from = mapped(&r.source, false)?;
            let to = mapped(&r.destination, false)?;
            let v = run(&e, &t, &s, "move", &[abs(&from), abs(&to)], &r.source).await?;
            one_entry(v, &r.destination)
        },
    )
    .await
}

/// `POST /filesystem.Filesystem/Remove`: the entry and all under it; none there is
/// no error (envd's `os.RemoveAll`). The home itself is refused.
pub async fn remove(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "RemoveRequest",
        |e, t, _, s, r: PathRequest| async move {
            let rel = mapped(&r.path, false)?;
            run(&e, &t, &s, "remove", &[abs(&rel)], &r.path).await?;
            Ok(json!({}))
        },
    )
    .await
}

/// A filesystem event's type, envd's `EventType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum Event {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Create => "EVENT_TYPE_CREATE",
            Event::Write => "EVENT_TYPE_WRITE",
            Event::Remove => "EVENT_TYPE_REMOVE",
            Event::Rename => "EVENT_TYPE_RENAME",
            Event::Chmod => "EVENT_TYPE_CHMOD",
        }
    }
}

/// A watched directory's listing: entries by their name relative to it.
pub type Snapshot = BTreeMap<String, Raw>;

/// A listing as a snapshot of the directory at `rel` (pure).
pub fn snapshot(rel: &str, entries: Vec<Raw>) -> Snapshot {
    let prefix = if rel.is_empty() {
        String::new()
    } else {
        format!("{rel}/")
    };
    entries
        .into_iter()
        .filter_map(|r| Some((r.rel.strip_prefix(&prefix)?.to_string(), r)))
        .collect()
}

/// The events between two listings (pure), as the module's head says: removes and
/// renames first, then creates (a non-empty new file also a write, unless it was
/// renamed there), then writes and
/// mode changes, each in name order.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<(String, Event)> {
    let created: Vec<&Raw> = new
        .iter()
        .filter(|(n, _)| !old.contains_key(*n))
        .map(|(_, r)| r)
        .collect();
    let mut out = vec![];
    for (name, r) in old.iter().filter(|(n, _)| !new.contains_key(*n)) {
        let renamed = created
            .iter()
            .any(|c| c.inode == r.inode && c.kind == r.kind);
        let ev = if renamed {
            Event::Rename
        } else {
            Event::Remove
        };
        out.push((name.clone(), ev));
    }
    let removed: Vec<&Raw> = old
        .iter()
        .filter(|(n, _)| !new.contains_key(*n))
        .map(|(_, r)| r)
        .collect();
    for (name, r) in new.iter().filter(|(n, _)| !old.contains_key(*n)) {
        out.push((name.clone(), Event::Create));
        let moved_here = removed
            .iter()
            .any(|o| o.inode == r.inode && o.kind == r.kind);
        if r.kind == 'f' && r.size > 0 && !moved_here {
            out.push((name.clone(), Event::Write));
        }
    }
    for (name, r) in new {
        let Some(o) = old.get(name) else { continue };
        if o.size != r.size || o.mtime != r.mtime {
            out.push((name.clone(), Event::Write));
        } else if o.mode != r.mode {
            out.push((name.clone(), Event::Chmod));
        }
    }
    out
}

/// envd's `FilesystemEvent` (pure): its name relative to the watched directory, its
/// entry if asked for and there.
fn event_json(name: &str, ev: Event, entry: Option<&Raw>) -> Value {
    let mut v = json!({"name": name, "type": ev.name()});
    if let Some(r) = entry {
        v["entry"] = entry_info(r);
    }
    v
}

fn events_json(old: &Snapshot, new: &Snapshot, include_entry: bool) -> Vec<Value> {
    diff(old, new)
        .into_iter()
        .map(|(n, ev)| {
            let entry = include_entry
                .then(|| new.get(&n))
                .flatten()
                .filter(|_| !matches!(ev, Event::Remove | Event::Rename));
            event_json(&n, ev, entry)
        })
        .collect()
}

/// A watched directory: where, and its last listing.
pub struct Watcher {
    rel: String,
    depth: u32,
    include_entry: bool,
    last: Snapshot,
}

fn watch_depth(recursive: bool) -> u32 {
    if recursive { WATCH_DEPTH } else { 1 }
}

/// The watched directory's listing now (`not_found` if it is gone, as envd's watch
/// ends when its directory is removed).
async fn look(e: &E2b, t: &str, s: &Sandbox, rel: &str, depth: u32) -> Result<Snapshot, RpcError> {
    let shown = ids::e2b_path(rel);
    Ok(snapshot(rel, list(e, t, s, rel, depth, &shown).await?))
}

/// `POST /filesystem.Filesystem/CreateWatcher` (the sync SDK's `watch_dir`): the
/// directory's listing now, kept; its id.
pub async fn create_watcher(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "CreateWatcherRequest",
        |e, t, id, s, r: WatchRequest| async move {
            let rel = mapped(&r.path, true)?;
            let depth = watch_depth(r.recursive);
            let last = look(&e, &t, &s, &rel, depth).await?;
            let wid = uuid::Uuid::new_v4().to_string();
            let mut w = e.watchers();
            // Watchers of sandboxes gone (killed) are dropped here, so the table holds
            // only live sandboxes' watchers.
            let live: std::collections::HashSet<String> = e.table().by_id.keys().cloned().collect();
            w.retain(|(sid, _), _| live.contains(sid));
            if w.len() >= MAX_WATCHERS
                || w.keys().filter(|(sid, _)| *sid == id).count() >= MAX_WATCHERS_PER_SANDBOX
            {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    "too many watchers: remove some (WatchHandle.stop)",
                ));
            }
            w.insert(
                (id, wid.clone()),
                Watcher {
                    rel,
                    depth,
                    include_entry: r.include_entry,
                    last,
                },
            );
            Ok(json!({"watcherId": wid}))
        },
    )
    .await
}

fn no_watcher(wid: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher {wid} not found"))
}

/// `POST /filesystem.Filesystem/GetWatcherEvents`: the events since the last call
/// (or the watcher's creation), by listing now.
pub async fn get_watcher_events(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "GetWatcherEventsRequest",
        |e, t, id, s, r: WatcherRequest| async move {
            let key = (id, r.watcher_id.clone());
            let (rel, depth) = e
                .watchers()
                .get(&key)
                .map(|w| (w.rel.clone(), w.depth))
                .ok_or_else(|| no_watcher(&r.watcher_id))?;
            let now = look(&e, &t, &s, &rel, depth).await?;
            let mut w = e.watchers();
            let w = w.get_mut(&key).ok_or_else(|| no_watcher(&r.watcher_id))?;
            let events = events_json(&w.last, &now, w.include_entry);
            w.last = now;
            Ok(json!({"events": events}))
        },
    )
    .await
}

/// `POST /filesystem.Filesystem/RemoveWatcher`.
pub async fn remove_watcher(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    unary(
        e,
        h,
        body,
        "RemoveWatcherRequest",
        |e, _, id, _, r: WatcherRequest| async move {
            e.watchers()
                .remove(&(id, r.watcher_id.clone()))
                .map(|_| json!({}))
                .ok_or_else(|| no_watcher(&r.watcher_id))
        },
    )
    .await
}

/// `POST /filesystem.Filesystem/WatchDir` (the JS and async SDKs' `watchDir`): a
/// start event once the directory is listed, then its events every [`POLL`], a
/// keepalive every `Keepalive-Ping-Interval` seconds; it ends when the caller leaves,
/// or with `not_found` when the directory is gone.
pub async fn watch_dir(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (token, _, s) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return failed(err),
    };
    let r: WatchRequest = match decode(&body, true, "WatchDirRequest") {
        Ok(r) => r,
        Err(err) => return failed(err),
    };
    let rel = match mapped(&r.path, true) {
        Ok(x) => x,
        Err(err) => return failed(err),
    };
    let keepalive = super::process::keepalive_interval(header(&h, "keepalive-ping-interval"));
    let depth = watch_depth(r.recursive);
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let mut last = match look(&e, &token, &s, &rel, depth).await {
            Ok(x) => x,
            Err(err) => {
                let _ = tx.send(connect::end(Some(&err)));
                return;
            }
        };
        let _ = tx.send(connect::message(&json!({"start": {}})));
        let mut poll = super::process::every(POLL);
        let mut ping = super::process::every(keepalive);
        let end = loop {
            tokio::select! {
                () = tx.closed() => return,
                _ = ping.tick() => {
                    let _ = tx.send(connect::message(&json!({"keepalive": {}})));
                }
                _ = poll.tick() => match look(&e, &token, &s, &rel, depth).await {
                    Ok(now) => {
                        for ev in events_json(&last, &now, r.include_entry) {
                            let _ = tx.send(connect::message(&json!({"filesystem": ev})));
                        }
                        last = now;
                    }
                    Err(err) => break err,
                },
            }
        };
        let _ = tx.send(connect::end(Some(&end)));
    });
    streaming(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: &str, size: &str, inode: &str, path: &str) -> Vec<u8> {
        let fields = [
            kind,
            kind,
            size,
            "644",
            "-rw-r--r--",
            "user",
            "user",
            "1733540000.5",
            inode,
            "",
            path,
        ];
        let mut out = vec![];
        for f in fields {
            out.extend_from_slice(f.as_bytes());
            out.push(0);
        }
        out
    }

    fn raw(kind: char, size: u64, mtime: &str, inode: u64, rel: &str) -> Raw {
        Raw {
            kind,
            target_kind: kind,
            size,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            mtime: mtime.into(),
            inode,
            link: String::new(),
            rel: rel.into(),
        }
    }

    #[test]
    fn listings_are_parsed_whole_or_refused() {
        let one = rec("f", "2", "7", "/workspace/a.txt");
        let mut two = one.clone();
        two.extend(rec("d", "40", "8", "/workspace/d"));
        let odd_name = rec("f", "0", "9", "/workspace/a\nb c");
        type Case<'a> = (&'a str, Vec<u8>, Result<Vec<&'a str>, &'a str>);
        let cases: Vec<Case> = vec![
            ("nothing", vec![], Ok(vec![])),
            ("one", one.clone(), Ok(vec!["a.txt"])),
            ("two", two.clone(), Ok(vec!["a.txt", "d"])),
            (
                "a newline and a space in a name",
                odd_name,
                Ok(vec!["a\nb c"]),
            ),
            (
                "the workspace itself",
                rec("d", "0", "1", "/workspace"),
                Ok(vec![""]),
            ),
            ("no final NUL", one[..one.len() - 1].to_vec(), Err("NUL")),
            (
                "a field short",
                one[..one.len() - b"/workspace/a.txt\0".len()].to_vec(),
                Err("fields"),
            ),
            (
                "outside the workspace",
                rec("f", "0", "1", "/etc/passwd"),
                Err("not under"),
            ),
            (
                "a size not a number",
                rec("f", "x", "1", "/workspace/a"),
                Err("size"),
            ),
            (
                "a type of two characters",
                rec("ff", "0", "1", "/workspace/a"),
                Err("type"),
            ),
            (
                "an inode not a number",
                rec("f", "0", "-1", "/workspace/a"),
                Err("inode"),
            ),
        ];
        for (what, out, want) in cases {
            let got = parse(&out, 10).map(|v| v.into_iter().map(|r| r.rel).collect::<Vec<_>>());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{what}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{what}: {g}"),
                (g, w) => panic!("{what}: got {g:?}, want {w:?}"),
            }
        }
        assert!(parse(&two, 1).unwrap_err().contains("more than 1"));
        let mut bad_mode = one.clone();
        let at = bad_mode
            .windows(5)
            .position(|w| w == b"\x00644\x00")
            .unwrap();
        bad_mode[at + 1] = b'9';
        assert!(parse(&bad_mode, 10).unwrap_err().contains("mode"));
    }

    #[test]
    fn entries_are_envds_in_e2bs_namespace() {
        let f = raw('f', 3, "1733540000.25", 7, "d/a.txt");
        let v = entry_info(&f);
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["path"], "/home/user/d/a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "3");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["modifiedTime"], "2024-12-07T02:53:20Z");
        assert_eq!(v["isSymlink"], false);
        assert!(v.get("symlinkTarget").is_none());
        let home = entry_info(&raw('d', 0, "0", 1, ""));
        assert_eq!(
            (home["name"].clone(), home["path"].clone()),
            (json!("user"), json!("/home/user"))
        );
        assert_eq!(home["type"], "FILE_TYPE_DIRECTORY");
        let mut l = raw('l', 4, "0", 2, "l");
        l.target_kind = 'd';
        l.link = "/etc".into();
        let v = entry_info(&l);
        assert_eq!(
            (
                v["type"].clone(),
                v["isSymlink"].clone(),
                v["symlinkTarget"].clone()
            ),
            (json!("FILE_TYPE_DIRECTORY"), json!(true), json!("/etc"))
        );
        l.target_kind = 'N';
        assert_eq!(entry_info(&l)["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(
            entry_info(&raw('p', 0, "0", 3, "fifo"))["type"],
            "FILE_TYPE_UNSPECIFIED"
        );
    }

    #[test]
    fn requests_are_decoded_or_refused() {
        let unary: &[(&[u8], bool)] = &[
            (br#"{"path":"/home/user"}"#, true),
            (br#"{"path":"/home/user","extra":1}"#, true),
            (br#"{"path":7}"#, false),
            (br#"{}"#, false),
            (br#"[]"#, false),
            (b"", false),
            (b"\x00\x00\x00\x00\x02{}", false),
        ];
        for (body, ok) in unary {
            let got = decode::<PathRequest>(body, false, "StatRequest");
            assert_eq!(got.is_ok(), *ok, "{}", String::from_utf8_lossy(body));
            if let Err(e) = got {
                assert_eq!(e.code, Code::InvalidArgument);
            }
        }
        let w: WatcherRequest = decode(br#"{"watcherId":"w"}"#, false, "x").unwrap();
        assert_eq!(w.watcher_id, "w");
        let w: WatcherRequest = decode(br#"{"watcher_id":"w"}"#, false, "x").unwrap();
        assert_eq!(w.watcher_id, "w");
        let env = connect::envelope(0, br#"{"path":"d","recursive":true,"includeEntry":true}"#);
        let r: WatchRequest = decode(&env, true, "WatchDirRequest").unwrap();
        assert!(r.recursive && r.include_entry && r.path == "d");
        assert!(
            decode::<WatchRequest>(br#"{"path":"d"}"#, true, "w").is_err(),
            "not enveloped"
        );
        for (asked, want) in [(0, 1), (1, 1), (3, 3), (u32::MAX, MAX_DEPTH)] {
            assert_eq!(list_depth(asked), want, "{asked}");
        }
    }

    #[test]
    fn listings_diff_into_envds_events() {
        let snap = |v: Vec<Raw>| snapshot("w", v);
        let a = raw('f', 2, "1.0", 10, "w/a");
        let empty = raw('f', 0, "1.0", 11, "w/e");
        let d = raw('d', 0, "1.0", 12, "w/d");
        let base = snap(vec![a.clone(), d.clone()]);
        use Event::*;
        type Case<'a> = (&'a str, Snapshot, Vec<(&'a str, Event)>);
        let cases: Vec<Case> = vec![
            ("nothing changed", base.clone(), vec![]),
            (
                "a non-empty file made: created and written",
                snap(vec![a.clone(), d.clone(), raw('f', 3, "2.0", 13, "w/n")]),
                vec![("n", Create), ("n", Write)],
            ),
            (
                "an empty file, a directory made: created",
                snap(vec![
                    a.clone(),
                    d.clone(),
                    empty.clone(),
                    raw('d', 0, "2.0", 14, "w/d/e"),
                ]),
                vec![("d/e", Create), ("e", Create)],
            ),
            (
                "a file written",
                snap(vec![raw('f', 2, "3.0", 10, "w/a"), d.clone()]),
                vec![("a", Write)],
            ),
            ("a file removed", snap(vec![d.clone()]), vec![("a", Remove)]),
            (
                "a file renamed: the old name renamed, the new created",
                snap(vec![raw('f', 2, "1.0", 10, "w/b"), d.clone()]),
                vec![("a", Rename), ("b", Create)],
            ),
            (
                "a mode changed",
                snap(vec![
                    Raw {
                        mode: 0o600,
                        ..a.clone()
                    },
                    d.clone(),
                ]),
                vec![("a", Chmod)],
            ),
        ];
        for (what, new, want) in cases {
            let got = diff(&base, &new);
            let got: Vec<(&str, Event)> = got.iter().map(|(n, e)| (n.as_str(), *e)).collect();
            assert_eq!(got, want, "{what}");
        }
        // Entries outside the watched directory are not its.
        assert!(snapshot("w", vec![raw('f', 0, "1", 1, "wx")]).is_empty());
        let ev = events_json(&base, &snap(vec![d.clone()]), true);
        assert_eq!(ev, vec![json!({"name": "a", "type": "EVENT_TYPE_REMOVE"})]);
        let ev = events_json(&snap(vec![]), &snap(vec![empty.clone()]), true);
        assert_eq!(ev[0]["entry"]["path"], "/home/user/w/e");
    }
}
