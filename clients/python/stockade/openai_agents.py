"""Stockade as a sandbox of the OpenAI Agents SDK (`openai-agents`, its `agents.sandbox`
interface; docs/PROVIDERS.md).

    from agents import Runner, RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from stockade.openai_agents import StockadeSandboxClient, StockadeSandboxClientOptions

    options = StockadeSandboxClientOptions(key="ci-42", grant=({"host": "pypi.org"},))
    run_config = RunConfig(sandbox=SandboxRunConfig(client=StockadeSandboxClient(), options=options))
    await Runner.run(SandboxAgent(name="dev", instructions="..."), "fix the tests", run_config=run_config)

A session is one sandbox key. Every SDK exec is a Stockade fenced exec: it holds the
options' default `grant` (none unless given) or the one `stockade_grant(...)` gives the
execs of a block, never more; a denial is reported in the command's stderr. Files go in
through the upload API (under /workspace) or an exec fed on stdin (elsewhere); reads are
an exec's stdout, an artifact past the output limit. The workspace is persisted as a tar
of the root through `/artifacts` and hydrated through the archive upload. An exposed port
is a preview door. With `pty=True` the SDK's `exec_command` runs on Stockade terminals
(`write_stdin` then reaches a running process). This module imports the SDK itself:
`import stockade` never does.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Optional
from urllib.parse import urlsplit

from pydantic import Field

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path, sandbox_path_str

from . import Stockade, StockadeError
from .fence import denial_note, grant_for, stockade_grant
from .terminal import Terminal, TerminalError

__all__ = [
    "StockadeSandboxClient",
    "StockadeSandboxClientOptions",
    "StockadeSandboxSession",
    "StockadeSandboxSessionState",
    "StockadeExposedPortEndpoint",
    "stockade_grant",
]

# Stockade's upload API writes under this directory and nowhere else; its checkpoint
# snapshots it. The SDK's default manifest root is the same path.
WORKSPACE = PurePosixPath("/workspace")
# What a run writes here is read back by name through the artifacts API, in parts and
# past the exec output limit (DESIGN §2).
ARTIFACTS = PurePosixPath("/artifacts")


class StockadeSandboxClientOptions(BaseSandboxClientOptions):
    """Options of a Stockade sandbox session. Nothing secret: they round-trip as JSON."""

    type: Literal["stockade"] = "stockade"
    key: Optional[str] = None
    """The sandbox key (a consumer's own name for it); default: `agents-<session id>`."""
    grant: tuple[dict[str, Any], ...] = ()
    """The default grant: egress rules (`{"host": ..., "methods": [...], "path_prefix": ...}`)
    every exec of the session holds while it runs. Empty: no network at all."""
    env: Optional[dict[str, str]] = None
    """Environment of every exec (the manifest's environment is added to it)."""
    exposed_ports: tuple[int, ...] = ()
    """Ports `resolve_exposed_port` may open a preview door onto."""
    checkpoint_on_exit: bool = False
    """On shutdown checkpoint the key (its /workspace restored by the next exec) instead
    of aborting it (the container and its workspace gone)."""
    exec_timeout_s: Optional[float] = None
    """An exec's timeout when the SDK gives none (None: the server's)."""
    pty: bool = False
    """Run the SDK's `exec_command` on Stockade terminals (a fenced exec on a
    pseudo-terminal, `GET …/pty`), which gives the agent `write_stdin`: a process that
    keeps running across tool calls. While one runs it holds the key's exec lock, so the
    session's other calls wait for it (DESIGN §1). Off: every `exec_command` is one
    fenced exec, killed at its timeout."""

    def __init__(self, key: Optional[str] = None, grant: tuple[dict[str, Any], ...] = (),
                 env: Optional[dict[str, str]] = None, exposed_ports: tuple[int, ...] = (),
                 checkpoint_on_exit: bool = False, exec_timeout_s: Optional[float] = None,
                 pty: bool = False, *, type: Literal["stockade"] = "stockade") -> None:
        super().__init__(type=type, key=key, grant=tuple(dict(r) for r in grant), env=env,
                         exposed_ports=tuple(exposed_ports),
                         checkpoint_on_exit=checkpoint_on_exit, exec_timeout_s=exec_timeout_s,
                         pty=pty)


class StockadeSandboxSessionState(SandboxSessionState):
    """What resuming a Stockade session needs: its key and the options it was made with
    (never the API token: that is the client's)."""

    type: Literal["stockade"] = "stockade"
    key: str
    grant: tuple[dict[str, Any], ...] = ()
    base_env: dict[str, str] = Field(default_factory=dict)
    checkpoint_on_exit: bool = False
    exec_timeout_s: Optional[float] = None
    pty: bool = False


@dataclass
class _Pty:
    """One terminal process the agent may write to: its output, gathered by a reader
    thread (the terminal's socket is blocking), and its exit."""

    terminal: Terminal
    tty: bool
    output_chunks: deque = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    exit_code: Optional[int] = None


@dataclass(frozen=True)
class StockadeExposedPortEndpoint(ExposedPortEndpoint):
    """A preview door: Stockade's door URL carries its token in the path
    (`http://host:port/p/<token>/`) unless a preview domain puts it in the host name, so
    the endpoint keeps the path and `url_for` gives it back."""

    path: str = "/"

    def url_for(self, scheme: str) -> str:
        base = super().url_for(scheme)
        head, _, query = base.partition("?")
        url = head.rstrip("/") + "/" + self.path.lstrip("/")
        return f"{url}?{query}" if query else url


class StockadeSandboxSession(BaseSandboxSession):
    """One Stockade sandbox key as an Agents SDK session."""

    state: StockadeSandboxSessionState

    def __init__(self, *, state: StockadeSandboxSessionState, client: Stockade) -> None:
        self.state = state
        self._client = client
        self._closed = False
        self._ptys: dict[int, _Pty] = {}
        self._pty_lock = asyncio.Lock()

    @property
    def key(self) -> str:
        return self.state.key

    # -- calls ------------------------------------------------------------------------

    async def _call(self, fn, *args, **kwargs):
        """A client call off the event loop (the client is synchronous, urllib)."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _run(self, argv: list[str], *, grant: Optional[list[dict]] = None,
                   stdin: Optional[bytes] = None, timeout: Optional[float] = None,
                   cwd: Optional[str] = None):
        envs = await self._resolved_envs()
        timeout_ms = None if timeout is None else max(1, int(timeout * 1000))
        return await self._call(self._client.exec, self.key, argv, cwd=cwd, env=envs or None,
                                timeout_ms=timeout_ms, grant=grant, stdin=stdin)

    async def _resolved_envs(self) -> dict[str, str]:
        manifest_envs = await self.state.manifest.environment.resolve()
        return {**self.state.base_env, **manifest_envs}

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(c) for c in command]
        if timeout is None:
            timeout = self.state.exec_timeout_s
        # The block's grant (stockade_grant) or the session's default: read here, in the
        # caller's context, not in the worker thread.
        grant = grant_for(self.state.grant)
        root = sandbox_path_str(self.state.manifest.root)
        cwd = root if self.state.workspace_root_ready or root == str(WORKSPACE) else None
        try:
            out = await self._run(argv, grant=grant, timeout=timeout, cwd=cwd)
        except StockadeError as e:
            raise ExecTransportError(command=tuple(argv), context={
                "backend": "stockade", "status": e.status, "code": e.code}, cause=e) from e
        if out.timed_out:
            raise ExecTimeoutError(command=tuple(argv), timeout_s=timeout)
        return ExecResult(stdout=out.stdout, stderr=out.stderr + denial_note(out.denials).encode(),
                          exit_code=out.exit_code)

    # -- terminals (options.pty) -----------------------------------------------------------

    def supports_pty(self) -> bool:
        return self.state.pty

    async def pty_exec_start(self, *command: str | Path, timeout: float | None = None,
                             shell: bool | list[str] = True, user: str | User | None = None,
                             tty: bool = False, yield_time_s: float | None = None,
                             max_output_tokens: int | None = None) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        if timeout is None:
            timeout = self.state.exec_timeout_s
        grant = grant_for(self.state.grant)
        envs = await self._resolved_envs()
        root = sandbox_path_str(self.state.manifest.root)
        cwd = root if self.state.workspace_root_ready or root == str(WORKSPACE) else None
        try:
            term = await self._call(
                self._client.terminal, self.key, argv, cwd=cwd, env=envs or None, grant=grant,
                timeout_ms=None if timeout is None else max(1, int(timeout * 1000)))
        except (TerminalError, OSError) as e:
            raise ExecTransportError(command=tuple(argv), context={
                "backend": "stockade", "detail": str(e)}, cause=e) from e
        entry = _Pty(terminal=term, tty=tty)
        self._pump(entry, asyncio.get_running_loop())
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._ptys))
            oldest = None
            if len(self._ptys) >= PTY_PROCESSES_MAX:
                oldest = min(self._ptys, key=lambda k: self._ptys[k].last_used)
                oldest = self._ptys.pop(oldest)
            self._ptys[process_id] = entry
        if oldest is not None:
            await self._call(oldest.terminal.close)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str, yield_time_s: float | None = None,
                              max_output_tokens: int | None = None) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._ptys, session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process (started without tty)")
            await self._call(entry.terminal.send, chars.encode("utf-8"))
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._collect(session_id, entry, resolve_pty_write_yield_time_ms(
            yield_time_ms=yield_ms, input_empty=chars == ""), max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._ptys.values())
            self._ptys.clear()
        for entry in entries:
            await self._call(entry.terminal.close)

    def _pump(self, entry: _Pty, loop: asyncio.AbstractEventLoop) -> None:
        """A thread reads the terminal until its exit and hands each piece to the loop."""

        def add(chunk: bytes) -> None:
            entry.output_chunks.append(chunk)
            entry.output_notify.set()

        def done(code: int) -> None:
            entry.exit_code = code
            entry.output_closed.set()
            entry.output_notify.set()

        def read() -> None:
            code = -1
            while True:
                kind, value = entry.terminal.recv()
                if kind == "output":
                    loop.call_soon_threadsafe(add, value)
                elif kind == "exit":
                    code = 124 if value.get("timed_out") else int(value.get("exit_code", -1))
                    note = denial_note(int(value.get("denials", 0)))
                    if note:
                        loop.call_soon_threadsafe(add, note.encode())
                    break
                elif kind == "error":
                    err = value.get("error", {})
                    loop.call_soon_threadsafe(add, f"[stockade] {err.get('code')}: {err.get('message')}\n".encode())
                    break
                elif kind == "closed":
                    break
            try:
                loop.call_soon_threadsafe(done, code)
            except RuntimeError:  # the loop is gone: nobody is waiting
                pass

        threading.Thread(target=read, name=f"stockade-pty-{self.key}", daemon=True).start()

    async def _collect(self, process_id: int, entry: _Pty, yield_ms: int,
                       max_output_tokens: int | None) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks, output_lock=entry.output_lock,
            output_notify=entry.output_notify, is_done=entry.output_closed.is_set,
            yield_time_ms=yield_ms, max_output_tokens=max_output_tokens)
        exit_code = entry.exit_code if closed else None
        if exit_code is None:
            return PtyExecUpdate(process_id=process_id, output=output, exit_code=None,
                                 original_token_count=tokens)
        async with self._pty_lock:
            self._ptys.pop(process_id, None)
        await self._call(entry.terminal.close)
        return PtyExecUpdate(process_id=None, output=output, exit_code=exit_code,
                             original_token_count=tokens)

    # -- lifecycle --------------------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        # /workspace always exists; another root is made before execs use it as their cwd.
        root = sandbox_path_str(self.state.manifest.root)
        if root != str(WORKSPACE):
            out = await self._run(["mkdir", "-p", "--", root])
            if out.exit_code != 0:
                raise WorkspaceArchiveWriteError(path=Path(root), context={
                    "reason": "workspace_root_setup_failed", "stderr": out.stderr.decode("utf-8", "replace")})

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        # The path is resolved inside the container (symlinks included), as the other
        # remote providers do.
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def running(self) -> bool:
        # A key has no stopped state a consumer sees: the next call ensures its container
        # (restoring its last checkpoint). So: this session is not shut down and the server
        # answers.
        if self._closed:
            return False
        try:
            return bool(await self._call(self._client.health))
        except (OSError, StockadeError):
            return False

    async def _shutdown_backend(self) -> None:
        self._closed = True
        try:
            if self.state.checkpoint_on_exit:
                await self._call(self._client.checkpoint, self.key)
            else:
                await self._call(self._client.abort, self.key)
        except (OSError, StockadeError):
            pass

    # -- files --------------------------------------------------------------------------

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            target = await self._check_read_with_exec(path, user=user)
        else:
            target = await self._validate_path_access(path)
        p = sandbox_path_str(target)
        try:
            out = await self._run(["sh", "-c", 'test -f "$1" || exit 44; cat -- "$1"', "sh", p])
        except StockadeError as e:
            raise WorkspaceArchiveReadError(path=error_path, cause=e) from e
        if out.exit_code == 44:
            raise WorkspaceReadNotFoundError(path=error_path)
        if out.exit_code != 0:
            raise WorkspaceArchiveReadError(path=error_path, context={
                "stderr": out.stderr.decode("utf-8", "replace")})
        if not out.truncated:
            return io.BytesIO(out.stdout)
        # Past the exec output limit: through an artifact, read in parts.
        return io.BytesIO(await self._via_artifact(["cp", "--", p], error_path))

    async def _via_artifact(self, producer: list[str], error_path: Path, *, tar: bool = False) -> bytes:
        """Run `producer` with an artifact path as its last argument, read that artifact
        back through the API, then remove it."""
        name = f".stockade-agents-{uuid.uuid4().hex}"
        dest = str(ARTIFACTS / name)
        try:
            out = await self._run([*producer, dest])
            if out.exit_code != 0:
                raise WorkspaceArchiveReadError(path=error_path, context={
                    "reason": "tar_failed" if tar else "copy_failed",
                    "stderr": out.stderr.decode("utf-8", "replace")})
            return await self._call(self._client.read_artifact, self.key, name)
        except StockadeError as e:
            raise WorkspaceArchiveReadError(path=error_path, cause=e) from e
        finally:
            try:
                await self._run(["rm", "-f", "--", dest])
            except StockadeError:
                pass

    async def write(self, path: Path | str, data: io.IOBase, *, user: str | User | None = None) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=error_path, actual_type=type(payload).__name__)
        target = await self._validate_path_access(path, for_write=True)
        p = PurePosixPath(sandbox_path_str(target))
        try:
            if p.is_relative_to(WORKSPACE) and p != WORKSPACE:
                # The upload API: a checked stream into /workspace, parents made.
                await self._call(self._client.put_file, self.key, str(p.relative_to(WORKSPACE)),
                                 bytes(payload))
            else:
                script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
                out = await self._run(["sh", "-c", script, "sh", str(p)], stdin=bytes(payload))
                if out.exit_code != 0:
                    raise WorkspaceArchiveWriteError(path=target, context={
                        "stderr": out.stderr.decode("utf-8", "replace")})
        except StockadeError as e:
            raise WorkspaceArchiveWriteError(path=target, cause=e) from e

    # -- the workspace as a tar ------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path().as_posix()
        excludes = shell_tar_exclude_args(self._persist_workspace_skip_relpaths())
        # tar writes the archive as an artifact (no output limit), read back by the API.
        cmd = f"tar {' '.join(excludes)} -C {shlex.quote(root)} -cf \"$1\" ."
        raw = await self._via_artifact(["sh", "-c", cmd, "sh"], Path(root), tar=True)
        return io.BytesIO(raw)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(payload).__name__)
        try:
            validate_tar_bytes(bytes(payload), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(path=root, context={
                "reason": "unsafe_or_invalid_tar", "member": e.member, "detail": str(e)}, cause=e) from e
        p = PurePosixPath(root.as_posix())
        if not (p == WORKSPACE or p.is_relative_to(WORKSPACE)):
            # The archive upload unpacks under /workspace only.
            raise WorkspaceArchiveWriteError(path=root, context={
                "reason": "root_outside_workspace", "detail": "Stockade unpacks archives under /workspace"})
        try:
            dest = "" if p == WORKSPACE else str(p.relative_to(WORKSPACE))
            await self._call(self._client.put_archive, self.key, bytes(payload), dest)
        except StockadeError as e:
            raise WorkspaceArchiveWriteError(path=root, cause=e) from e

    # -- exposed ports: preview doors ---------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        try:
            door = await self._call(self._client.expose, self.key, port)
        except StockadeError as e:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context={"backend": "stockade", "detail": str(e)}, cause=e) from e
        split = urlsplit(door.url)
        tls = split.scheme == "https"
        return StockadeExposedPortEndpoint(
            host=split.hostname or "", port=split.port or (443 if tls else 80), tls=tls,
            query=split.query, path=split.path or "/")


class StockadeSandboxClient(BaseSandboxClient[StockadeSandboxClientOptions]):
    """Makes and resumes Stockade sessions on one server (`STOCKADE_SERVER`, and the token
    from `STOCKADE_TOKEN` or `<STOCKADE_DATA_DIR>/api-token`, as `stockade.Stockade`)."""

    backend_id = "stockade"
    supports_default_options = True

    def __init__(self, client: Optional[Stockade] = None, *,
                 instrumentation: Optional[Instrumentation] = None,
                 dependencies: Optional[Dependencies] = None) -> None:
        self.client = client or Stockade()
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: StockadeSandboxClientOptions | None = None) -> SandboxSession:
        options = options or StockadeSandboxClientOptions()
        manifest = self._validate_manifest_for_create(manifest or Manifest(root=str(WORKSPACE)))
        session_id = uuid.uuid4()
        state = StockadeSandboxSessionState(
            session_id=session_id, manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            key=options.key or f"agents-{session_id.hex}", grant=options.grant,
            base_env=dict(options.env or {}), exposed_ports=options.exposed_ports,
            checkpoint_on_exit=options.checkpoint_on_exit, exec_timeout_s=options.exec_timeout_s,
            pty=options.pty)
        inner = StockadeSandboxSession(state=state, client=self.client)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, StockadeSandboxSession):
            raise TypeError("StockadeSandboxClient.delete expects a StockadeSandboxSession")
        try:
            await inner.shutdown()
        except Exception:
            pass
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, StockadeSandboxSessionState):
            raise TypeError("StockadeSandboxClient.resume expects a StockadeSandboxSessionState")
        state.assert_path_grants_rebound()
        inner = StockadeSandboxSession(state=state, client=self.client)
        # A key is always there to reattach to: its container, or its last checkpoint
        # restored by the next call. The SDK still compares the workspace's fingerprint
        # with its own snapshot before trusting it.
        inner._set_start_state_preserved(True, system=True)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, StockadeSandboxSessionState)
