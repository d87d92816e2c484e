"""A terminal session (`GET /v1/sandboxes/{key}/pty`, a WebSocket; docs/LINUX.md
"Interactive terminal"): a fenced exec whose I/O is a pseudo-terminal, its grant alive
exactly as long as the session. Standard library only: a minimal RFC 6455 client (one
connection, masked frames out, unfragmented or continued frames in, pings answered).

    t = Stockade().terminal("ci", ["python3", "-i"])
    t.send(b"print(6 * 7)\\n")
    kind, value = t.recv()       # ("output", b"...") ... then ("exit", {...exit event...})
    t.close()                    # kills what it started and revokes the grant
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import struct
import urllib.parse
from typing import Any, Optional, Tuple

_TEXT, _BINARY, _CLOSE, _PING, _PONG, _CONT = 1, 2, 8, 9, 10, 0


class TerminalError(Exception):
    """The terminal could not be opened, or its socket broke."""


class Terminal:
    """One terminal session. `recv` gives ("output", bytes), then ("exit", the exec
    stream's exit event) or ("error", the error event); ("closed", None) after that."""

    def __init__(self, server: str, token: str, key: str, command: dict,
                 rows: int = 24, cols: int = 80, connect_timeout: float = 30.0) -> None:
        url = urllib.parse.urlsplit(server)
        host, tls = url.hostname or "127.0.0.1", url.scheme == "https"
        port = url.port or (443 if tls else 80)
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        if tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        self._sock = sock
        self._buf = b""
        self._done = False
        path = url.path.rstrip("/") + f"/v1/sandboxes/{urllib.parse.quote(key, safe='')}/pty"
        nonce = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      f"Authorization: Bearer {token}\r\nConnection: Upgrade\r\n"
                      f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Key: {nonce}\r\n\r\n").encode())
        while b"\r\n\r\n" not in self._buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise TerminalError("the server closed the connection before the upgrade")
            self._buf += chunk
        head, _, self._buf = self._buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status + " ":
            raise TerminalError(f"no terminal: {status}")
        sock.settimeout(None)
        self._frame(_TEXT, json.dumps({"type": "start", "command": command,
                                       "rows": rows, "cols": cols}).encode())

    # -- frames ------------------------------------------------------------------------

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._sock.sendall(head + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise TerminalError("the terminal's socket closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _next_message(self) -> Tuple[int, bytes]:
        opcode, data = None, b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            op = b0 & 0x0F
            if op == _PING:
                self._frame(_PONG, payload)
                continue
            if op == _PONG:
                continue
            if op != _CONT:
                opcode = op
            data += payload
            if b0 & 0x80:
                return opcode or _BINARY, data

    # -- the session ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Bytes typed (at most 64 KiB a message: longer input is split)."""
        for i in range(0, len(data), 65536):
            self._frame(_BINARY, data[i:i + 65536])

    def resize(self, rows: int, cols: int) -> None:
        self._frame(_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())

    def recv(self) -> Tuple[str, Any]:
        if self._done:
            return "closed", None
        try:
            opcode, data = self._next_message()
        except (OSError, TerminalError):
            self._done = True
            return "closed", None
        if opcode == _BINARY:
            return "output", data
        if opcode == _CLOSE:
            self._done = True
            return "closed", None
        event = json.loads(data)
        if event.get("type") in ("exit", "error"):
            self._done = True
            return event["type"], event
        return "event", event

    def close(self) -> None:
        """Leave: the server kills what the session started and revokes its grant."""
        try:
            self._frame(_CLOSE, struct.pack("!H", 1000))
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_terminal(server: str, token: str, key: str, argv, *, cwd: Optional[str] = None,
                  env=None, timeout_ms: Optional[int] = None, grant=None,
                  approval: Optional[str] = None, rows: int = 24, cols: int = 80) -> Terminal:
    command: dict = {"argv": list(argv)}
    if cwd is not None:
        command["cwd"] = cwd
    if env:
        command["env"] = dict(env)
    if timeout_ms is not None:
        command["timeout_ms"] = timeout_ms
    if grant is not None:
        command["grant"] = {"rules": [dict(r) for r in grant]}
    if approval is not None:
        command["approval"] = approval
    return Terminal(server, token, key, command, rows, cols)
