"""The unmodified `e2b` SDK against `stockade serve`'s E2B layer (docs/E2B.md): the
fence and the lifecycle. Configured only by the environment `stockade e2b env` prints
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Starts its own HTTP upstream on the test
host's 127.0.0.2 (the e2e server allows private targets, as tests do). Prints
"e2b lifecycle: all checks passed" at the end; any failed check raises.

* a sandbox's network policy is its commands' grant: without it a command is denied
  (`no-rule`), with `network.allow_out` naming the upstream a command reaches it;
* a detached process (`STOCKADE_DETACH=1`) of that sandbox is denied even while a
  command of it holds the grant open, and the denial names why (`detached`);
* `update_network` replaces the policy whole (its next command runs under the new one);
  one wider than an address is refused and changes nothing;
* `set_timeout` ends a sandbox; `pause` checkpoints it, `connect` resumes it with its
  files; a sandbox that asked to pause at its timeout is paused, not killed.
"""

import time

from e2b import NotFoundException, Sandbox, SandboxException

import upstream
from upstream import hits

up, url = upstream.start()
host = upstream.HOST


def step(what):
    print(f"e2b lifecycle: {what}", flush=True)


def until(what, check, seconds=20):
    """Wait for `check()` to be true, polling, with a deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds}s: {what}")


# -D - prints the answer's headers (the denial's reason is one of them) on stdout.
CURL = f"curl -s -D - -o /dev/null {url}/"

step("no network policy: an empty grant, the request is denied")
closed = Sandbox.create(allow_internet_access=False)
r = closed.commands.run(CURL + "closed")
assert " 403" in r.stdout.splitlines()[0], r.stdout
# A fenced command with no grant holds an empty one: nothing has a rule.
assert "x-stockade-denial: no-rule" in r.stdout.lower(), r.stdout
assert hits == [], hits
info = Sandbox.get_info(closed.sandbox_id)
assert info.state.value == "running", info.state
closed.kill()

step("allow_out names the upstream: a command reaches it, only while it runs")
sbx = Sandbox.create(
    allow_internet_access=False, network={"allow_out": [host]}, envs={"FROM_CREATE": "a", "B": "x"}
)
step("the create's envs are every command's, under the command's own")
r = sbx.commands.run('echo "$FROM_CREATE $B"', envs={"B": "y"})
assert r.stdout == "a y\n", repr(r.stdout)
r = sbx.commands.run(CURL + "open")
assert " 200" in r.stdout.splitlines()[0], r.stdout
assert hits == ["/open"], hits

step("a detached process is denied while a command holds the grant, and told why")
det = sbx.commands.run(
    "for i in $(seq 400); do [ -e go ] && break; sleep 0.05; done; "
    f"curl -s -D detached.txt -o /dev/null {url}/detached; touch done",
    background=True,
    envs={"STOCKADE_DETACH": "1"},
)
# The fenced command opens the grant, lets the detached process go, and holds the
# grant open until the detached request was answered.
r = sbx.commands.run(
    "touch go; for i in $(seq 400); do [ -e done ] && break; sleep 0.05; done; cat detached.txt"
)
assert " 403" in r.stdout.splitlines()[0], r.stdout
assert "x-stockade-denial: detached" in r.stdout.lower(), r.stdout
assert "/detached" not in hits, hits
step("update_network replaces the policy whole; a refused one changes nothing")
sbx.update_network({"deny_out": ["0.0.0.0/0"]})
r = sbx.commands.run(CURL + "updated-closed")
assert " 403" in r.stdout.splitlines()[0], r.stdout
assert "x-stockade-denial: no-rule" in r.stdout.lower(), r.stdout
try:
    sbx.update_network({"allow_out": ["0.0.0.0/0"]})
    raise AssertionError("a policy wider than one address was taken")
except SandboxException:
    pass
r = sbx.commands.run(CURL + "still-closed")
assert " 403" in r.stdout.splitlines()[0], r.stdout
sbx.update_network({"allow_out": [host], "deny_out": ["0.0.0.0/0"]})
r = sbx.commands.run(CURL + "reopened")
assert " 200" in r.stdout.splitlines()[0], r.stdout
assert hits[-1] == "/reopened", hits
assert "/updated-closed" not in hits and "/still-closed" not in hits, hits


def gone(sid):
    try:
        Sandbox.get_info(sid)
        return False
    except NotFoundException:
        return True


step("set_timeout ends the sandbox")
sbx.set_timeout(1)
until("the sandbox is gone after its timeout", lambda: gone(sbx.sandbox_id))

step("pause keeps the files; a paused sandbox runs nothing; connect resumes it")
p = Sandbox.create()
p.files.write("/home/user/kept.txt", "kept\n")
assert p.pause() is True
assert p.pause() is False, "paused already"
assert Sandbox.get_info(p.sandbox_id).state.value == "paused"
try:
    p.commands.run("true")
    raise AssertionError("a paused sandbox ran a command")
except SandboxException:
    pass
again = Sandbox.connect(p.sandbox_id)
assert Sandbox.get_info(p.sandbox_id).state.value == "running"
assert again.commands.run("cat kept.txt").stdout == "kept\n"
again.kill()

step("a sandbox that asked to pause at its timeout is paused, not killed")
a = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause"})
a.files.write("/home/user/kept.txt", "still\n")
until(
    "the sandbox paused at its timeout",
    lambda: Sandbox.get_info(a.sandbox_id).state.value == "paused",
)
b = Sandbox.connect(a.sandbox_id)
assert b.commands.run("cat kept.txt").stdout == "still\n"
b.kill()

up.shutdown()
print("e2b lifecycle: all checks passed", flush=True)
