"""The unmodified `e2b` SDK against `stockade serve`'s E2B layer (docs/E2B.md): PTYs,
Connect, and input. Configured only by the environment `stockade e2b env` prints
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Starts its own HTTP upstream on the test
host's 127.0.0.2 (the e2e server allows private targets, as tests do). Prints
"e2b pty: all checks passed" at the end; any failed check raises.

* `pty.create(size)` is a terminal (`tty -s` says so, `stty size` is the size given);
  `send_stdin` types into it, its output arrives through `on_pty`; `resize` changes
  `stty size`; `stream_input` types too; `pty.connect` follows it from then on;
  `exit 3` is the handle's exit code;
* `pty.kill` ends the PTY and its whole tree (a background `sleep` of it included);
* a PTY holds its sandbox's grant while it runs (`allow_out` names the upstream);
* `commands.connect(pid)` follows a running command's later lines, and the original
  stream keeps all of them; an unknown pid is not found;
* a command has no live stdin (docs/E2B.md, "Not yet"): `send_stdin` to one is a clear
  error, and `run(…, stdin=True)` is refused before anything runs.
"""

import threading
import time

from e2b import (
    CommandExitException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
)

import upstream
from upstream import hits

up, url = upstream.start()


def step(what):
    print(f"e2b pty: {what}", flush=True)


def until(what, check, seconds=30):
    """Wait for `check()` to be true, polling, with a deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds}s: {what}")


class Reader:
    """A handle read by a thread of its own: its output as it arrives, its end."""

    def __init__(self, handle, pty=True):
        self.handle = handle
        self.out = bytearray()
        self.lock = threading.Lock()
        self.result = None
        self.error = None
        self.done = threading.Event()
        kind = "on_pty" if pty else "on_stdout"
        threading.Thread(target=self._run, args=(kind,), daemon=True).start()

    def _add(self, chunk):
        with self.lock:
            self.out.extend(chunk if isinstance(chunk, (bytes, bytearray)) else chunk.encode())

    def _run(self, kind):
        try:
            self.result = self.handle.wait(**{kind: self._add})
        except CommandExitException as e:
            self.result = e
        except Exception as e:  # noqa: BLE001 - reported by the checks below
            self.error = e
        self.done.set()

    def text(self):
        with self.lock:
            return self.out.decode("utf-8", "replace")

    def wait_for(self, what, seconds=30):
        until(f"{what!r} in the output", lambda: what in self.text(), seconds)

    def end(self, seconds=30):
        assert self.done.wait(seconds), "the handle did not end"
        return self.result


sbx = Sandbox.create(allow_internet_access=False, network={"allow_out": ["127.0.0.2"]})

step("a PTY is a terminal of the size given")
term = sbx.pty.create(PtySize(rows=24, cols=80))
r = Reader(term)
# The terminal echoes what is typed: the arithmetic is only ever in the output
# computed, so a marker seen is the shell's answer, not the echo.
# `tty -s`: stdin is a terminal (its name under the container's /dev is not
# resolvable: the terminal is the host's, docs/LINUX.md).
sbx.pty.send_stdin(term.pid, b"tty -s && echo a-tty-$((1+1)); stty size; echo mark-$((6*7))\n")
r.wait_for("mark-42")
assert "a-tty-2" in r.text(), r.text()
assert "24 80" in r.text(), r.text()

step("resize changes the terminal's size")
sbx.pty.resize(term.pid, PtySize(rows=40, cols=100))
sbx.pty.send_stdin(term.pid, b"stty size; echo mark-$((6*8))\n")
r.wait_for("mark-48")
assert "40 100" in r.text(), r.text()

step("stream_input types too, chunk by chunk")
sbx.pty.stream_input(term.pid, [b"echo str", "eam-$((7*7))", b"\n"])
r.wait_for("stream-49")

step("the PTY holds its sandbox's grant while it runs")
sbx.pty.send_stdin(term.pid, f'curl -s -o /dev/null -w "http-%{{http_code}}-$((1+1))\\n" {url}/pty\n'.encode())
r.wait_for("http-200-2", 8)
assert hits == ["/pty"], hits

step("pty.connect follows the PTY from then on")
follower = Reader(sbx.pty.connect(term.pid))
sbx.pty.send_stdin(term.pid, b"echo follow-$((2*5))\n")
follower.wait_for("follow-10")
r.wait_for("follow-10")

step("exit 3 is the handle's exit code, for both streams")
sbx.pty.send_stdin(term.pid, b"exit 3\n")
res = r.end()
assert r.error is None, r.error
assert res.exit_code == 3, res
assert follower.end().exit_code == 3, follower.result
assert all(p.pid != term.pid for p in sbx.commands.list()), sbx.commands.list()

step("pty.kill ends the PTY and its whole tree")
k = sbx.pty.create(PtySize(rows=24, cols=80))
kr = Reader(k)
# A background loop of the PTY's beats into a file; the PTY sees it beat. (A command
# cannot look meanwhile: a PTY is a fenced exec, and a key's execs run one at a time.)
sbx.pty.send_stdin(
    k.pid,
    b"(while :; do date +%s%N > beat; sleep 0.05; done) & "
    b'a=$(cat beat); sleep 0.5; b=$(cat beat); [ "$a" != "$b" ] && echo beating-$((5*5))\n',
)
kr.wait_for("beating-25")
assert sbx.pty.kill(k.pid) is True
kr.end()
assert kr.error is not None or kr.result.exit_code != 0, kr.result
# The next command runs once the PTY's fence is torn down: its tree was killed with
# it, so the beat has stopped (a full second without one).
BEATING = 'a=$(cat beat); sleep 1; b=$(cat beat); [ "$a" != "$b" ] && echo beating || echo still'
assert sbx.commands.run(BEATING).stdout.strip() == "still"
assert sbx.pty.kill(k.pid) is False, "killed twice"

step("commands.connect follows a running command's later lines")
LOOP = "for i in $(seq 1 15); do echo line-$i; sleep 0.2; done"
bg = sbx.commands.run(LOOP, background=True)
orig = Reader(bg, pty=False)
orig.wait_for("line-2")
tail = Reader(sbx.commands.connect(bg.pid), pty=False)
tail.wait_for("line-15")
assert tail.end().exit_code == 0, tail.result
assert orig.end().exit_code == 0, orig.result
# The original stream kept every line; the follower saw lines from when it came.
assert orig.text() == "".join(f"line-{i}\n" for i in range(1, 16)), orig.text()
seen = [int(x[5:]) for x in tail.text().split()]
assert seen == list(range(seen[0], 16)) and seen[0] > 1, seen

step("connect to a pid that is not running is not found")
try:
    sbx.commands.connect(999_999)
    raise AssertionError("connected to an unknown pid")
except NotFoundException:
    pass

step("a command has no live stdin: send_stdin is a clear error")
bg = sbx.commands.run("sleep 30", background=True)
try:
    sbx.commands.send_stdin(bg.pid, "x\n")
    raise AssertionError("send_stdin to a command without a terminal was taken")
except SandboxException as e:
    assert "docs/E2B.md" in str(e), e
assert bg.kill() is True

step("run(…, stdin=True) is refused before anything runs")
try:
    sbx.commands.run("touch ran-with-stdin", stdin=True)
    raise AssertionError("a command asking for stdin ran")
except SandboxException as e:
    assert "docs/E2B.md" in str(e), e
assert sbx.commands.run("ls ran-with-stdin || echo absent").stdout.strip().endswith("absent")

sbx.kill()
up.shutdown()
print("e2b pty: all checks passed", flush=True)
