"""The unmodified `e2b` SDK (tests/python-requirements.txt) against `stockade serve`'s
E2B layer (docs/E2B.md), configured only by the environment the e2e test sets:
E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the operator's token). The server's own
API (for a tenant token) is argv[1]. Prints "e2b: all checks passed" at the end; any
failed check raises."""

import json
import os
import sys
import time
import urllib.request

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

server = sys.argv[1]
operator = os.environ["E2B_API_KEY"]


def step(what):
    print(f"e2b: {what}", flush=True)


step("create")
sbx = Sandbox.create()
assert len(sbx.sandbox_id) >= 16 and sbx.sandbox_id.isalnum(), sbx.sandbox_id

step("a command's output and exit code")
r = sbx.commands.run("echo hello")
assert r.stdout == "hello\n", repr(r.stdout)
assert r.exit_code == 0, r.exit_code
r = sbx.commands.run("echo err >&2; echo out")
assert (r.stdout, r.stderr) == ("out\n", "err\n"), (r.stdout, r.stderr)

step("a non-zero exit raises CommandExitException")
try:
    sbx.commands.run("exit 3")
    raise AssertionError("exit 3 did not raise")
except CommandExitException as e:
    assert e.exit_code == 3, e.exit_code

step("output streams as it is written")
seen = []
sbx.commands.run("echo one; sleep 1; echo two", on_stdout=lambda s: seen.append((time.monotonic(), s)))
assert "".join(s for _, s in seen) == "one\ntwo\n", seen
assert len(seen) == 2 and seen[1][0] - seen[0][0] > 0.5, seen

step("files: write then read, and a command sees the file")
info = sbx.files.write("/home/user/a.txt", "hi")
assert info.path == "/home/user/a.txt", info
assert sbx.files.read("/home/user/a.txt") == "hi"
assert sbx.commands.run("cat a.txt").stdout == "hi"
try:
    sbx.files.read("/home/user/missing.txt")
    raise AssertionError("a missing file was read")
except NotFoundException:
    pass

step("files: make_dir, list, exists, get_info, rename, remove")
assert sbx.files.make_dir("/home/user/d") is True
assert sbx.files.make_dir("/home/user/d") is False, "an existing directory is not made again"
sbx.files.write("/home/user/d/b.txt", "bee")
names = sorted(e.name for e in sbx.files.list("/home/user"))
assert names == ["a.txt", "d"], names
deep = {e.path: e for e in sbx.files.list("/home/user", depth=2)}
assert sorted(deep) == ["/home/user/a.txt", "/home/user/d", "/home/user/d/b.txt"], sorted(deep)
e = sbx.files.get_info("/home/user/d/b.txt")
assert (e.name, e.type, e.path, e.size) == ("b.txt", FileType.FILE, "/home/user/d/b.txt", 3), e
sbx.commands.run("echo made > d/m.txt")
m = sbx.files.get_info("/home/user/d/m.txt")
assert m.modified_time.year >= 2024, m.modified_time
sbx.files.remove("/home/user/d/m.txt")
assert e.permissions.startswith("-rw"), e.permissions
assert sbx.files.get_info("/home/user/d").type == FileType.DIR
assert sbx.files.get_info("/home/user").path == "/home/user"
assert sbx.files.exists("/home/user/a.txt") is True
assert sbx.files.exists("/home/user/nope") is False
try:
    sbx.files.get_info("/home/user/nope")
    raise AssertionError("a missing file had info")
except FileNotFoundException:
    pass
try:
    sbx.files.list("/etc")
    raise AssertionError("a path outside /home/user was listed")
except InvalidArgumentException:
    pass
r = sbx.files.rename("/home/user/d/b.txt", "/home/user/d/c.txt")
assert (r.name, r.path) == ("c.txt", "/home/user/d/c.txt"), r
assert sbx.files.read("/home/user/d/c.txt") == "bee"
assert sbx.files.exists("/home/user/d/b.txt") is False
sbx.files.remove("/home/user/d")
assert sbx.files.exists("/home/user/d") is False
assert sbx.commands.run("ls").stdout == "a.txt\n"

step("watch_dir sees a file a command writes, and its removal")
w = sbx.files.watch_dir("/home/user")
sbx.commands.run("echo x > w.txt")
events = w.get_new_events()
assert ("w.txt", FilesystemEventType.CREATE) in [(e.name, e.type) for e in events], events
sbx.commands.run("mv w.txt v.txt")
events = [(e.name, e.type) for e in w.get_new_events()]
assert ("w.txt", FilesystemEventType.RENAME) in events and ("v.txt", FilesystemEventType.CREATE) in events, events
sbx.files.remove("/home/user/v.txt")
events = [(e.name, e.type) for e in w.get_new_events()]
assert events == [("v.txt", FilesystemEventType.REMOVE)], events
w.stop()

step("a background command starts, is listed and killed")
h = sbx.commands.run("sleep 30", background=True)
assert h.pid > 0, h.pid
pids = [p.pid for p in sbx.commands.list()]
assert h.pid in pids, (h.pid, pids)
assert sbx.commands.kill(h.pid) is True
try:
    h.wait()
    raise AssertionError("a killed command exited 0")
except CommandExitException as e:
    assert e.exit_code != 0, e.exit_code
assert h.pid not in [p.pid for p in sbx.commands.list()]

step("a background command asked detached runs beside other commands, no grant")
d = sbx.commands.run("sleep 30", background=True, envs={"STOCKADE_DETACH": "1"})
t0 = time.monotonic()
assert sbx.commands.run("echo during").stdout == "during\n"
assert time.monotonic() - t0 < 10, "a command waited for the detached one"
assert d.pid in [p.pid for p in sbx.commands.list()]
assert sbx.commands.kill(d.pid) is True
try:
    d.wait()
    raise AssertionError("a killed detached process exited 0")
except CommandExitException as e:
    assert e.exit_code != 0, e.exit_code
assert d.pid not in [p.pid for p in sbx.commands.list()]
d = sbx.commands.run("echo ${STOCKADE_DETACH:-unset} > d.txt", background=True, envs={"STOCKADE_DETACH": "1"})
assert d.wait().exit_code == 0
assert sbx.files.read("/home/user/d.txt") == "unset\n", "the variable asking for it reached the process"
d = sbx.commands.run("exit 4", background=True, envs={"STOCKADE_DETACH": "1"})
try:
    d.wait()
    raise AssertionError("exit 4 did not raise")
except CommandExitException as e:
    assert e.exit_code == 4, e.exit_code

step("info and list")
assert sbx.get_info().sandbox_id == sbx.sandbox_id
listed = [s.sandbox_id for s in Sandbox.list().next_items()]
assert sbx.sandbox_id in listed, listed

step("list filters by metadata and state, and pages with limit and the next token")
other = Sandbox.create(metadata={"drive": "other one", "n": "2"})
try:
    mine = Sandbox.list(query=SandboxQuery(metadata={"drive": "other one"})).next_items()
    assert [s.sandbox_id for s in mine] == [other.sandbox_id], mine
    assert mine[0].metadata == {"drive": "other one", "n": "2"}, mine[0].metadata
    none = Sandbox.list(query=SandboxQuery(metadata={"drive": "other", "n": "2"})).next_items()
    assert none == [], none
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    assert paused == [], paused
    pages = Sandbox.list(limit=1)
    seen = []
    while pages.has_next:
        page = pages.next_items()
        assert len(page) <= 1, page
        seen += [s.sandbox_id for s in page]
    assert sbx.sandbox_id in seen and other.sandbox_id in seen, seen
    assert len(seen) == len(set(seen)), seen
finally:
    other.kill()

step("a wrong API key raises AuthenticationException")
try:
    Sandbox.create(api_key="stk_0000000000000000_" + "0" * 64)
    raise AssertionError("a wrong key created a sandbox")
except AuthenticationException:
    pass

step("an unknown sandbox id raises NotFoundException")
try:
    Sandbox.connect("a" * 20)
    raise AssertionError("an unknown id connected")
except NotFoundException:
    pass


def tenant_checks():
    req = urllib.request.Request(
        f"{server}/v1/tokens",
        data=json.dumps({"keys": "tn-*", "name": "e2b-tenant"}).encode(),
        headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/json"},
        method="POST",
    )
    tenant = json.load(urllib.request.urlopen(req))["token"]
    try:
        Sandbox.connect(sbx.sandbox_id, api_key=tenant)
        raise AssertionError("a tenant reached the operator's sandbox")
    except NotFoundException:
        pass
    mine = Sandbox.create(api_key=tenant)
    assert mine.commands.run("echo tenant").stdout == "tenant\n"
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=tenant).next_items()]
    try:
        Sandbox.connect(mine.sandbox_id).commands.run("true")
        raise AssertionError("the operator's key reached a tenant's E2B sandbox")
    except NotFoundException:
        pass
    mine.kill()


step("another tenant's sandbox is the same NotFoundException")
tenant_checks()

step("kill")
assert sbx.is_running()
sbx.kill()
assert not sbx.is_running()
try:
    sbx.commands.run("true")
    raise AssertionError("a killed sandbox ran a command")
except NotFoundException:
    pass
assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]

print("e2b: all checks passed", flush=True)
