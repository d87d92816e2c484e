"""The unmodified `e2b` SDK's snapshots against `stockade serve`'s E2B layer
(docs/E2B.md, "Snapshots"): `create_snapshot` names the sandbox's `/workspace`, the
sandbox running on; `Sandbox.create(snapshot_id)` forks a new sandbox from it (its
files, none of its processes), and the source's later changes are not the fork's;
`list_snapshots` lists them, paged, and still after their sandbox is killed; `fork(count=2)` makes two sandboxes from the
source as it is (leaving no snapshot behind); `delete_snapshot` deletes one (a second delete, an
unknown id, another tenant's: false); a create from a deleted, unknown or another
tenant's snapshot is E2B's 404 for an unknown template. Configured only by `stockade e2b env`'s environment; the server's
own API (for a tenant token) is argv[1].
Prints "e2b snapshots: all checks passed" at the end; any failed check raises.
"""

import json
import os
import sys
import urllib.request

from e2b import Sandbox, SandboxException

server = sys.argv[1]
operator = os.environ["E2B_API_KEY"]


def step(what):
    print(f"e2b snapshots: {what}", flush=True)


step("a snapshot of a running sandbox: it runs on")
src = Sandbox.create()
src.files.write("/home/user/state.txt", "v1")
src.commands.run("mkdir -p deep/er && echo nested > deep/er/f && ln -s state.txt link")
# A detached process: a fenced background command holds the key until it ends.
keeper = src.commands.run("sleep 600", background=True, envs={"STOCKADE_DETACH": "1"})
snap = src.create_snapshot()
assert snap.snapshot_id and snap.names == [], snap
assert src.is_running()
assert src.commands.run("cat state.txt").stdout == "v1"
pids = [p.pid for p in src.commands.list()]
assert keeper.pid in pids, ("the snapshot stopped a process", keeper.pid, pids)

step("the source changes after the snapshot; the fork has the snapshot's files")
src.files.write("/home/user/state.txt", "v2")
fork = Sandbox.create(snap.snapshot_id)
assert fork.sandbox_id != src.sandbox_id
assert fork.files.read("/home/user/state.txt") == "v1"
assert fork.commands.run("cat deep/er/f; readlink link").stdout == "nested\nstate.txt\n"
assert fork.commands.list() == [], "a fork carries no processes"
fork.files.write("/home/user/state.txt", "fork's own")
assert src.files.read("/home/user/state.txt") == "v2", "the fork wrote into its source"

step("list_snapshots: the sandbox's, paged")
second = src.create_snapshot()
ids = sorted([snap.snapshot_id, second.snapshot_id])
listed = []
pages = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=1)
while pages.has_next:
    page = pages.next_items()
    assert len(page) <= 1, page
    listed += [s.snapshot_id for s in page]
assert listed == ids, (listed, ids)
assert Sandbox.list_snapshots(sandbox_id=fork.sandbox_id).next_items() == []

step("fork: two sandboxes from the source as it is now, its policy and envs theirs")
forks = src.fork(count=2)
assert len(forks) == 2 and len({f.sandbox_id for f in forks}) == 2, forks
for f in forks:
    assert f.files.read("/home/user/state.txt") == "v2"
    assert f.sandbox_id not in (src.sandbox_id, fork.sandbox_id)
    f.kill()
assert Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items() != [], "kept"
assert sorted(s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()) == ids, (
    "the fork's own snapshot was left behind"
)

step("a snapshot outlives its source sandbox: still listed, still a template")
src.kill()
listed = sorted(s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items())
assert listed == ids, ("a killed sandbox's snapshots are not listed", listed, ids)
assert set(ids) <= {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}, "the whole list"
again = Sandbox.create(second.snapshot_id)
assert again.files.read("/home/user/state.txt") == "v2"
again.kill()


def unknown_template(template, **opts):
    """A create from `template` is E2B's 404 for an unknown template (the SDK raises
    its SandboxException with the status, as it does against E2B)."""
    try:
        Sandbox.create(template, **opts)
        raise AssertionError(f"a sandbox was made from {template}")
    except SandboxException as e:
        assert str(e).startswith("404: template "), str(e)


def tenant_checks():
    req = urllib.request.Request(
        f"{server}/v1/tokens",
        data=json.dumps({"keys": "snap-tn-*", "name": "e2b-snapshots"}).encode(),
        headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/json"},
        method="POST",
    )
    tenant = json.load(urllib.request.urlopen(req))["token"]
    unknown_template(snap.snapshot_id, api_key=tenant)
    assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=tenant) is False
    assert Sandbox.list_snapshots(api_key=tenant).next_items() == []


step("another tenant's snapshot id is unknown to it: 404, delete false")
tenant_checks()

step("delete_snapshot; a fork from a deleted or unknown snapshot is a 404")
assert Sandbox.delete_snapshot(snap.snapshot_id) is True
assert Sandbox.delete_snapshot(snap.snapshot_id) is False
for gone in [snap.snapshot_id, "z" * 32, "not-a-snapshot"]:
    unknown_template(gone)
# The last one deleted through the native API (the operator's token: the key is
# `e2b-<id>`): the E2B list finds none left, and lists nothing.
req = urllib.request.Request(
    f"{server}/v1/sandboxes/e2b-{src.sandbox_id}/snapshots/{second.snapshot_id}",
    headers={"Authorization": f"Bearer {operator}"},
    method="DELETE",
)
assert urllib.request.urlopen(req).status == 200
assert Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items() == [], "its last one deleted"
assert Sandbox.delete_snapshot(second.snapshot_id) is False, "deleted already"
fork.kill()

print("e2b snapshots: all checks passed", flush=True)
