"""Stockade's Python client: every facade call of the HTTP API (docs/openapi.json),
live output included. Standard library only (urllib, json).

    from stockade import Stockade
    sb = Stockade()                       # STOCKADE_SERVER, STOCKADE_TOKEN or <data>/api-token
    out = sb.exec("ci", ["pytest", "-q"], grant=[{"host": "pypi.org"}])
    for ev in sb.exec_stream("ci", ["make", "test"]):
        ...                               # Output(stream, data) as it is written, then Exit
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

__all__ = [
    "Stockade",
    "StockadeError",
    "ExecOutcome",
    "Output",
    "Exit",
    "DetachedState",
    "Denial",
    "Artifact",
    "Preview",
    "Snapshot",
    "Lifetime",
    "Grant",
    "SandboxInfo",
]

Rule = Mapping[str, Any]  # {"host": ..., "methods": [...], "path_prefix": ...}


class StockadeError(Exception):
    """The server refused a call: its HTTP status and stable error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code} (HTTP {status}): {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ExecOutcome:
    """What a fenced command produced."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    killed: int
    denials: int
    admitted: int
    limits: list[str]

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class Output:
    """A chunk of live output: `stream` is "stdout" or "stderr"."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class Exit:
    """The last event of a streamed exec: the outcome, without the output."""

    exit_code: int
    timed_out: bool
    truncated: bool
    killed: int
    denials: int
    admitted: int
    limits: list[str]


@dataclass(frozen=True)
class DetachedState:
    """`running`, `exited` (with `code`) or `gone` (with `reason`)."""

    state: str
    code: Optional[int] = None
    reason: Optional[str] = None

    def __str__(self) -> str:
        if self.state == "exited":
            return f"exited({self.code})"
        if self.state == "gone":
            return f"gone({self.reason})"
        return self.state


@dataclass(frozen=True)
class Denial:
    at_ms: int
    host: str
    method: str
    path: str
    rule_set: str
    reason: str


@dataclass(frozen=True)
class Preview:
    """A preview door onto a port of the key's container: its random token and URL."""

    port: int
    token: str
    url: str


@dataclass(frozen=True)
class Snapshot:
    """A named snapshot of a key's /workspace: its name and when it was taken (ms)."""

    name: str
    at_ms: int


@dataclass(frozen=True)
class Lifetime:
    """When a key's lifetime ends (ms since the Unix epoch) and what its end does:
    ``"abort"`` (the key is forgotten) or ``"checkpoint"`` (it stays known)."""

    ends_at_ms: int
    on_end: str


@dataclass(frozen=True)
class Grant:
    """A grant as the server answers it (a key's network): its rules, each a dict of
    the API's JSON as ``exec``'s ``grant`` takes them (``methods`` always present,
    ``intercept`` only when false), and ``ask`` (what the rules refuse for want of a
    rule is held for the approver)."""

    rules: list[dict[str, Any]]
    ask: bool = False

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Grant":
        return cls([dict(r) for r in d["rules"]], bool(d.get("ask", False)))


@dataclass(frozen=True)
class SandboxInfo:
    """A known key (given a lifetime, metadata or a network, until it is forgotten):
    whether its container runs, its lifetime (None: it has none), its metadata, its
    network (None: it has none)."""

    key: str
    running: bool
    lifetime: Optional[Lifetime]
    metadata: dict[str, str]
    network: Optional[Grant] = None

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        life = d.get("lifetime")
        net = d.get("network")
        return cls(d["key"], d["running"], Lifetime(**life) if life else None, dict(d["metadata"]),
                   Grant._of(net) if net else None)


@dataclass(frozen=True)
class TokenInfo:
    """A scoped consumer token as listed (never its secret)."""

    id: str
    name: str
    keys: str
    ceiling: int
    created_ms: int
    revoked_ms: Optional[int] = None


@dataclass(frozen=True)
class Artifact:
    name: str
    size: int


def _default_token(data_dir: Optional[str]) -> str:
    tok = os.environ.get("STOCKADE_TOKEN")
    if tok:
        return tok
    d = data_dir or os.environ.get("STOCKADE_DATA_DIR") or "/var/lib/stockade"
    return Path(d, "api-token").read_text().strip()


def _q(segment: str, keep_slash: bool = False) -> str:
    return urllib.parse.quote(segment, safe="/" if keep_slash else "")


@dataclass
class Stockade:
    """A client of one Stockade server."""

    server: str = field(default_factory=lambda: os.environ.get("STOCKADE_SERVER", "http://127.0.0.1:8787"))
    token: Optional[str] = None
    data_dir: Optional[str] = None
    timeout: float = 3600.0

    def __post_init__(self) -> None:
        self.server = self.server.rstrip("/")
        if self.token is None:
            self.token = _default_token(self.data_dir)

    # -- transport ---------------------------------------------------------------

    def _open(self, method: str, path: str, body: Optional[bytes] = None,
              content_type: str = "application/json", token: Optional[str] = None):
        req = urllib.request.Request(self.server + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {token or self.token}")
        if body is not None:
            req.add_header("Content-Type", content_type)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)["error"]
                raise StockadeError(e.code, err.get("code", "failed"), err.get("message", "")) from None
            except (ValueError, KeyError, TypeError):
                raise StockadeError(e.code, "failed", raw.decode("utf-8", "replace")) from None

    def _json(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        with self._open(method, path, data, token=token) as r:
            return json.loads(r.read())

    @staticmethod
    def _command(argv: Sequence[str], cwd: Optional[str], env: Optional[Mapping[str, str]],
                  timeout_ms: Optional[int], grant: Optional[Sequence[Rule]],
                  approval: Optional[str], stdin: Union[None, str, bytes]) -> dict:
        body: dict = {"argv": list(argv)}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        if grant is not None:
            body["grant"] = {"rules": [dict(r) for r in grant]}
        if approval is not None:
            body["approval"] = approval
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray)):
            body["stdin_base64"] = base64.b64encode(stdin).decode()
        return body

    # -- the facade --------------------------------------------------------------

    def health(self) -> bool:
        return bool(self._json("GET", "/v1/health")["ok"])

    def exec(self, key: str, argv: Sequence[str], *, cwd: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None, timeout_ms: Optional[int] = None,
             grant: Optional[Sequence[Rule]] = None, approval: Optional[str] = None,
             stdin: Union[None, str, bytes] = None) -> ExecOutcome:
        """Run a fenced command and wait for it. `grant` opens egress to those hosts
        only while it runs; None: the key's network (`set_network`), if it has one."""
        o = self._json("POST", f"/v1/sandboxes/{_q(key)}/exec",
                       self._command(argv, cwd, env, timeout_ms, grant, approval, stdin))
        return ExecOutcome(
            exit_code=o["exit_code"],
            stdout=base64.b64decode(o["stdout_base64"]),
            stderr=base64.b64decode(o["stderr_base64"]),
            timed_out=o["timed_out"], truncated=o["truncated"], killed=o["killed"],
            denials=o["denials"], admitted=o["admitted"], limits=list(o["limits"]),
        )

    def exec_stream(self, key: str, argv: Sequence[str], *, cwd: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None, timeout_ms: Optional[int] = None,
                    grant: Optional[Sequence[Rule]] = None, approval: Optional[str] = None,
                    stdin: Union[None, str, bytes] = None) -> Iterator[Union[Output, Exit]]:
        """Run a fenced command, yielding its output as it is written, then its `Exit`.
        Closing the iterator early disconnects: the command is killed and its grant
        revoked."""
        body = json.dumps(self._command(argv, cwd, env, timeout_ms, grant, approval, stdin)).encode()
        r = self._open("POST", f"/v1/sandboxes/{_q(key)}/exec/stream", body)
        with r:
            for line in r:
                ev = json.loads(line)
                kind = ev["type"]
                if kind in ("stdout", "stderr"):
                    data = ev["data"].encode() if "data" in ev else base64.b64decode(ev["data_base64"])
                    yield Output(kind, data)
                elif kind == "exit":
                    yield Exit(exit_code=ev["exit_code"], timed_out=ev["timed_out"],
                               truncated=ev["truncated"], killed=ev["killed"],
                               denials=ev["denials"], admitted=ev["admitted"],
                               limits=list(ev["limits"]))
                    return
                else:
                    err = ev.get("error", {})
                    raise StockadeError(ev.get("status", 500), err.get("code", "failed"), err.get("message", ""))
        raise StockadeError(502, "unreachable", "the stream ended before the outcome")

    def start(self, key: str, argv: Sequence[str], *, cwd: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None,
              stdin: Union[None, str, bytes] = None) -> str:
        """Start a detached process (no grant, ever); its id."""
        body = self._command(argv, cwd, env, None, None, None, stdin)
        return self._json("POST", f"/v1/sandboxes/{_q(key)}/detached", body)["id"]

    def status(self, key: str, id: str) -> DetachedState:
        s = self._json("GET", f"/v1/sandboxes/{_q(key)}/detached/{_q(id)}")
        return DetachedState(s["state"], s.get("code"), s.get("reason"))

    def stop(self, key: str, id: str) -> None:
        self._json("DELETE", f"/v1/sandboxes/{_q(key)}/detached/{_q(id)}")

    def ensure(self, key: str) -> None:
        """Start the key's container if it has none (restoring its checkpoint): no
        command runs, no grant is applied; a refusal (over capacity) comes now."""
        self._json("POST", f"/v1/sandboxes/{_q(key)}/ensure")

    def abort(self, key: str) -> None:
        self._json("POST", f"/v1/sandboxes/{_q(key)}/abort")

    def checkpoint(self, key: str) -> None:
        self._json("POST", f"/v1/sandboxes/{_q(key)}/checkpoint")

    def save_snapshot(self, key: str, name: str) -> Snapshot:
        """Archive the key's /workspace under ``name`` (replacing a snapshot of that
        name), starting its container if it has none; the container keeps running. A
        key holds at most 16; they outlive its container until deleted."""
        return Snapshot(**self._json("POST", f"/v1/sandboxes/{_q(key)}/snapshots", {"name": name}))

    def snapshots(self, key: str) -> list[Snapshot]:
        """The key's named snapshots, by name."""
        return [Snapshot(**s) for s in self._json("GET", f"/v1/sandboxes/{_q(key)}/snapshots")["snapshots"]]

    def delete_snapshot(self, key: str, name: str) -> None:
        """Delete the key's snapshot ``name`` (one that does not exist: nothing changes)."""
        self._json("DELETE", f"/v1/sandboxes/{_q(key)}/snapshots/{_q(name)}")

    def fork(self, key: str, source: str, name: str) -> None:
        """Make ``source``'s snapshot ``name`` the key's restore cache: the key's next
        container starts from it. The key must have no container (abort or checkpoint
        it first)."""
        self._json("POST", f"/v1/sandboxes/{_q(key)}/fork", {"source": source, "name": name})

    def sandboxes(self, prefix: str = "") -> list[SandboxInfo]:
        """The known keys starting with ``prefix`` that this token reaches, by key."""
        path = "/v1/sandboxes" + (f"?prefix={_q(prefix)}" if prefix else "")
        return [SandboxInfo._of(i) for i in self._json("GET", path)["sandboxes"]]

    def describe(self, key: str) -> SandboxInfo:
        """The key as it is known; a key that is not known is a 404 not-found."""
        return SandboxInfo._of(self._json("GET", f"/v1/sandboxes/{_q(key)}"))

    def forget(self, key: str) -> None:
        """Abort the known key's container, then forget the key (its lifetime, metadata
        and network; its named snapshots stay). A key that is not known is a 404."""
        self._json("DELETE", f"/v1/sandboxes/{_q(key)}")

    def set_lifetime(self, key: str, *, ends_in_ms: Optional[int] = None,
                     ends_at_ms: Optional[int] = None, on_end: Optional[str] = None) -> SandboxInfo:
        """Give the key a lifetime (exactly one of ``ends_in_ms``, from the server's
        now, and ``ends_at_ms``): at its end the key is ended as
        ``on_end`` says, ``"abort"`` (the default) or ``"checkpoint"``."""
        body: dict[str, Any] = {}
        if ends_in_ms is not None:
            body["ends_in_ms"] = ends_in_ms
        if ends_at_ms is not None:
            body["ends_at_ms"] = ends_at_ms
        if on_end is not None:
            body["on_end"] = on_end
        return SandboxInfo._of(self._json("PUT", f"/v1/sandboxes/{_q(key)}/lifetime", body))

    def clear_lifetime(self, key: str) -> SandboxInfo:
        """The key's lifetime removed: it ends no more (it stays known)."""
        return SandboxInfo._of(self._json("DELETE", f"/v1/sandboxes/{_q(key)}/lifetime"))

    def set_metadata(self, key: str, metadata: Mapping[str, str]) -> SandboxInfo:
        """Replace the key's metadata whole (at most 64 entries)."""
        return SandboxInfo._of(self._json("PUT", f"/v1/sandboxes/{_q(key)}/metadata",
                                          {"metadata": dict(metadata)}))

    def set_network(self, key: str, rules: Sequence[Rule], *, ask: bool = False) -> SandboxInfo:
        """Give the key a network (replacing its own): the grant, ``rules`` as ``exec``'s
        ``grant`` takes them, that each of its fenced commands (``exec``,
        ``exec_stream``, ``terminal``) bringing no grant of its own runs under, open only
        while that command runs; a detached process never does. ``ask``: what the rules
        refuse for want of a rule is held for the approver. Checked now as an exec's
        grant (a secret not set: 409 secret-not-set; a rule refused: 400 invalid-input)."""
        body: dict[str, Any] = {"rules": [dict(r) for r in rules]}
        if ask:
            body["ask"] = True
        return SandboxInfo._of(self._json("PUT", f"/v1/sandboxes/{_q(key)}/network", body))

    def clear_network(self, key: str) -> SandboxInfo:
        """The key's network removed: its commands that bring no grant run with no rules
        (it stays known)."""
        return SandboxInfo._of(self._json("DELETE", f"/v1/sandboxes/{_q(key)}/network"))

    def expose(self, key: str, port: int) -> Preview:
        """Open a preview door onto ``port`` (127.0.0.1 inside the key's running
        container); the URL reaches it (HTTP/1.1, WebSockets too)."""
        return Preview(**self._json("POST", f"/v1/sandboxes/{_q(key)}/previews", {"port": port}))

    def unexpose(self, key: str, port: int) -> None:
        """Close the door onto ``port`` (one not open: nothing changes)."""
        self._json("DELETE", f"/v1/sandboxes/{_q(key)}/previews/{int(port)}")

    def previews(self, key: str) -> list[Preview]:
        """The key's open preview doors, by port."""
        return [Preview(**p) for p in self._json("GET", f"/v1/sandboxes/{_q(key)}/previews")["previews"]]

    def terminal(self, key: str, argv: Sequence[str] = (), *, cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, timeout_ms: Optional[int] = None,
                 grant: Optional[Sequence[Rule]] = None, approval: Optional[str] = None,
                 rows: int = 24, cols: int = 80):
        """Open a terminal: a fenced exec on a pseudo-terminal (a WebSocket), its grant
        alive as long as the session (`stockade.terminal.Terminal`; empty argv: a shell)."""
        from .terminal import open_terminal
        return open_terminal(self.server, self.token or "", key, argv, cwd=cwd, env=env,
                             timeout_ms=timeout_ms, grant=grant, approval=approval,
                             rows=rows, cols=cols)

    def denials(self, key: str) -> list[Denial]:
        return [Denial(**d) for d in self._json("GET", f"/v1/sandboxes/{_q(key)}/denials")["denials"]]

    def egress(self, key: str) -> list[dict]:
        """Everything the key's fence decided, oldest first: admitted requests
        (``decision == "allow"``: status, bytes each way, credential header names) and
        denials (``decision == "deny"``: the reason)."""
        return list(self._json("GET", f"/v1/sandboxes/{_q(key)}/egress")["egress"])

    def artifacts(self, key: str) -> list[Artifact]:
        return [Artifact(**a) for a in self._json("GET", f"/v1/sandboxes/{_q(key)}/artifacts")["artifacts"]]

    def read_artifact(self, key: str, name: str) -> bytes:
        """The whole artifact (read in 4 MiB parts)."""
        out = bytearray()
        while True:
            path = f"/v1/sandboxes/{_q(key)}/artifacts/{_q(name, True)}?offset={len(out)}&length=4194304"
            with self._open("GET", path) as r:
                part = r.read()
            out += part
            if len(part) < 4194304:
                return bytes(out)

    def put_file(self, key: str, path: str, data: Union[str, bytes]) -> None:
        """Write one file under /workspace (parents created), as the sandbox's user."""
        body = data.encode() if isinstance(data, str) else bytes(data)
        with self._open("PUT", f"/v1/sandboxes/{_q(key)}/files/{_q(path, True)}", body,
                        "application/octet-stream") as r:
            r.read()

    def put_archive(self, key: str, tar: bytes, dest: str = "") -> int:
        """Unpack a tar archive under /workspace/dest; the number of entries."""
        path = f"/v1/sandboxes/{_q(key)}/files?dest={_q(dest, True)}"
        with self._open("PUT", path, tar, "application/x-tar") as r:
            return json.loads(r.read())["entries"]

    def approve(self, key: str, argv: Sequence[str], approver_token: str) -> str:
        """Record an approval for one floor command (the approver's token); the token
        that admits it once."""
        return self._json("POST", f"/v1/sandboxes/{_q(key)}/approvals", {"argv": list(argv)},
                          token=approver_token)["token"]

    # -- scoped consumer tokens (the operator's token; docs/TENANTS.md) -------------

    def create_token(self, keys: str, ceiling: Optional[int] = None,
                     name: Optional[str] = None) -> tuple[str, TokenInfo]:
        """Make a token reaching ``keys`` (one key, or a prefix ending in ``*``) and
        holding at most ``ceiling`` live containers: (the token, shown once; its info)."""
        body: dict[str, Any] = {"keys": keys}
        if ceiling is not None:
            body["ceiling"] = ceiling
        if name is not None:
            body["name"] = name
        made = self._json("POST", "/v1/tokens", body)
        token = made.pop("token")
        return token, TokenInfo(**made)

    def tokens(self) -> list[TokenInfo]:
        """Every scoped token, live and revoked, oldest first."""
        return [TokenInfo(**t) for t in self._json("GET", "/v1/tokens")["tokens"]]

    def revoke_token(self, id: str) -> None:
        """Revoke a token by its id: a wrong token (401) from now on."""
        self._json("DELETE", f"/v1/tokens/{_q(id)}")
