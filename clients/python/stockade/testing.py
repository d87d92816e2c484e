"""Test helpers over `stockade serve --mock` (docs/MOCK.md): the whole Stockade API over
the in-memory mock substrate, the real guest deciding, no root and no containers. A
test scripts what commands do, arms faults and reads what the fence did. Standard
library only; with pytest installed, the `stockade_mock` fixture.

    from stockade.testing import MockServer
    with MockServer() as sb:                      # `stockade` from STOCKADE_BIN or PATH
        sb.script([{"argv": ["make", "test"], "exit_code": 2, "stderr": "1 failed\\n"}])
        assert sb.exec("ci", ["make", "test"]).exit_code == 2
        sb.fault("process-status", "unreachable", key="ci")
        assert sb.ops("ci")[:3] == ["ensure", "apply-grant", "run"]

pytest: `pytest_plugins = ["stockade.testing"]` in a conftest.py (or nothing, when the
`stockade` package is installed: its `pytest11` entry point registers it), then

    def test_deploy(stockade_mock):               # a fresh server per test, stopped after
        stockade_mock.script([...])
        ...

The mock is a test double: nothing runs, nothing is fenced. Never point production at it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from . import Stockade, _q

__all__ = ["MockServer", "MockStockade"]


@dataclass
class MockStockade(Stockade):
    """A client of a `stockade serve --mock`: every call of [`Stockade`], and the mock's
    own (the operator's token)."""

    def script(self, rules: Sequence[Mapping[str, Any]] = (),
               default: Optional[Mapping[str, Any]] = None) -> dict:
        """Replace the script: `rules` (first match wins), `default` for what none
        matches (absent: the built-in vocabulary, anything else exit 0)."""
        doc: dict = {"rules": [dict(r) for r in rules]}
        if default is not None:
            doc["default"] = dict(default)
        return self._json("PUT", "/v1/mock/script", doc)

    def fault(self, op: str, fault: str, *, key: Optional[str] = None,
              times: Any = 1, skip: int = 0) -> dict:
        """Arm `fault` (`failed`, `unreachable`, `over-capacity`, `invalid`, `trap`) on
        the next `times` calls of `op` (an int, or "always"), after `skip`; of `key`'s
        sandbox only when given."""
        body: dict = {"op": op, "fault": fault, "times": times, "skip": skip}
        if key is not None:
            body["key"] = key
        return self._json("POST", "/v1/mock/faults", body)

    def clear_faults(self) -> None:
        self._json("DELETE", "/v1/mock/faults")

    def trace(self, key: str) -> list[dict]:
        """The substrate calls made about `key`'s sandbox, in order: `{"op", "target"}`."""
        return self._json("GET", f"/v1/mock/trace/{_q(key)}")["calls"]

    def ops(self, key: str) -> list[str]:
        """The ops of [`trace`]: `["ensure", "apply-grant", "run", ...]`."""
        return [c["op"] for c in self.trace(key)]

    def clear_trace(self, key: str) -> None:
        self._json("DELETE", f"/v1/mock/trace/{_q(key)}")

    def control(self, mock: str, **fields: Any) -> dict:
        """Make happen what no call does: `control("put-artifact", key=, name=, bytes=)`,
        `control("stop-container", key=)`, `control("exit-process", key=, id=, code=)`,
        `control("lose-process", key=, id=)`."""
        return self._json("POST", "/v1/mock/control", {"mock": mock, **fields})


def _binary(binary: Optional[str]) -> str:
    found = binary or os.environ.get("STOCKADE_BIN") or shutil.which("stockade")
    if not found:
        raise RuntimeError("no stockade binary: set STOCKADE_BIN or put `stockade` on PATH")
    return found


class MockServer:
    """A `stockade serve --mock` on a free loopback port, in a temporary data directory;
    `with MockServer() as client:` starts it and stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: Optional[str] = None, *,
                 script: Optional[Mapping[str, Any]] = None,
                 args: Sequence[str] = (), startup_timeout: float = 30.0) -> None:
        self.binary = _binary(binary)
        self.initial_script = script
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.log: list[str] = []
        self.url = ""
        self.client: Optional[MockStockade] = None
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[tempfile.TemporaryDirectory] = None

    def start(self) -> MockStockade:
        self._dir = tempfile.TemporaryDirectory(prefix="stockade-mock-")
        data = Path(self._dir.name, "data")
        cmd = [self.binary, "serve", "--mock", "--listen", "127.0.0.1:0", "--data-dir", str(data)]
        if self.initial_script is not None:
            path = Path(self._dir.name, "script.json")
            path.write_text(json.dumps(self.initial_script))
            cmd += ["--mock-script", str(path)]
        env = {k: v for k, v in os.environ.items()
               if k not in ("STOCKADE_DATA_DIR", "STOCKADE_SUBSTRATE", "STOCKADE_LISTEN")}
        self._proc = subprocess.Popen(cmd + self.args, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      env=env)
        serving = threading.Event()

        def read() -> None:
            assert self._proc is not None and self._proc.stderr is not None
            for raw in self._proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.log.append(line)
                if not serving.is_set() and "serving on http://" in line:
                    self.url = "http://" + line.split("serving on http://", 1)[1].split()[0]
                    serving.set()
            serving.set()  # the process ended: wake the waiter, which sees no URL

        threading.Thread(target=read, daemon=True).start()
        if not serving.wait(self.startup_timeout) or not self.url:
            self.stop()
            raise RuntimeError("stockade serve --mock did not start:\n" + "\n".join(self.log))
        token = (data / "api-token").read_text().strip()
        self.client = MockStockade(server=self.url, token=token)
        return self.client

    def stop(self) -> None:
        p, self._proc = self._proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p is not None and p.stderr is not None:
            p.stderr.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> MockStockade:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


try:
    import pytest
except ImportError:  # standard library only without it: MockServer is all there is
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def stockade_mock() -> Iterator[MockStockade]:
        """A fresh `stockade serve --mock` for the test: its client (every facade call,
        and `script`, `fault`, `trace`, `ops`); stopped after the test."""
        with MockServer() as client:
            yield client
