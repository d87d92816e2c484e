"""The unmodified `e2b` SDK against Stockade's E2B domain form (docs/E2B.md, "The
domain form"): configured only by E2B_DOMAIN, E2B_API_KEY and E2B_VALIDATE_API_KEY
(plus SSL_CERT_FILE, the test's CA). The SDK reaches https://api.<domain> and
https://49983-<id>.<domain>; `get_host(8000)` names https://8000-<id>.<domain>, a
preview door onto the sandbox's port 8000. The test resolves every name under the
domain to the server's HTTPS listener (tests/e2e/e2b.rs: a DNS answerer of its own in
this process's mount namespace's resolv.conf); the SDK is not modified.

Prints "e2b domain: all checks passed" at the end; any failed check raises.
"""

import base64
import os
import socket
import ssl
import time

import httpx

from e2b import Sandbox

domain = os.environ["E2B_DOMAIN"]
tls = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])


def step(what):
    print(f"e2b domain: {what}", flush=True)


def until(what, check, seconds=30):
    """Wait for `check()` to answer something true, polling, with a deadline."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # not answering yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds}s: {what} (last: {last!r})")


def fetch(url, headers=None):
    with httpx.Client(verify=tls, timeout=10) as c:
        return c.get(url, headers=headers or {})


SERVE = "python3 -m http.server 8000 --bind 127.0.0.1 --directory /workspace"

step("create through https://api.<domain>")
sbx = Sandbox.create()
step(f"sandbox {sbx.sandbox_id}")

step("a command through https://49983-<id>.<domain>")
r = sbx.commands.run("echo hello")
assert r.stdout == "hello\n", r

step("write and read a file")
sbx.files.write("/home/user/index.html", "hello through the door\n")
assert sbx.files.read("/home/user/index.html") == "hello through the door\n"

step("get_host(8000) names the sandbox's port under the domain")
host = sbx.get_host(8000)
assert host == f"8000-{sbx.sandbox_id}.{domain}", host

step("a detached HTTP server in the sandbox, fetched through get_host")
sbx.commands.run(SERVE, background=True, envs={"STOCKADE_DETACH": "1"})
resp = until(
    "the sandbox's port 8000 answers through https://<get_host(8000)>/",
    lambda: (lambda r: r if r.status_code == 200 else None)(
        fetch(f"https://{host}/index.html")
    ),
)
assert resp.text == "hello through the door\n", resp.text

step("a WebSocket through get_host echoes; a request through it opens no egress")
# The preview tests' server (static files, /ws an echo, /egress?URL tries URL through
# the container's proxy): python3's stdlib only.
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "e2e", "preview", "server.py")) as f:
    sbx.files.write("/home/user/server.py", f.read())
sbx.commands.run(
    "python3 /workspace/server.py 8002", background=True, envs={"STOCKADE_DETACH": "1"}
)
wshost = sbx.get_host(8002)
until(
    "the sandbox's port 8002 answers through get_host",
    lambda: fetch(f"https://{wshost}/index.html").status_code == 200,
)


def websocket_echo(host, messages):
    # RFC 6455 by hand over TLS (no client library): a masked text frame each, its echo.
    raw = tls.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
    key = base64.b64encode(os.urandom(16)).decode()
    raw.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = raw.recv(1)
        assert chunk, f"closed before the upgrade's head: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    got = []
    for m in messages:
        data, mask = m.encode(), os.urandom(4)
        raw.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        frame = b""
        while len(frame) < 2 + len(data):
            chunk = raw.recv(2 + len(data) - len(frame))
            assert chunk, "closed mid-echo"
            frame += chunk
        got.append(frame[2:].decode())
    raw.close()
    return got


msgs = [f"ping {i}" for i in range(5)]
assert websocket_echo(wshost, msgs) == msgs
r = fetch(f"https://{wshost}/egress?http://example.com/")
assert r.text == "blocked 403", ("inbound never opens egress", r.text)

step("a port nothing listens on: 502")
r = fetch(f"https://{sbx.get_host(8001)}/")
assert r.status_code == 502, (r.status_code, r.text)

step("allowPublicTraffic=False: refused without the traffic token, served with it")
private = Sandbox.create(network={"allow_public_traffic": False})
assert private.traffic_access_token, "the create answers trafficAccessToken"
private.files.write("/home/user/index.html", "private door\n")
private.commands.run(SERVE, background=True, envs={"STOCKADE_DETACH": "1"})
phost = private.get_host(8000)
r = fetch(f"https://{phost}/index.html")
assert r.status_code == 403, (r.status_code, r.text)
assert r.json()["code"] == 403, r.text
r = fetch(
    f"https://{phost}/index.html",
    {"e2b-traffic-access-token": sbx.traffic_access_token or "x" * 64},
)
assert r.status_code == 403, ("another sandbox's traffic token", r.status_code)
ok = until(
    "the private sandbox's port answers with its traffic token",
    lambda: (lambda r: r if r.status_code == 200 else None)(
        fetch(
            f"https://{phost}/index.html",
            {"e2b-traffic-access-token": private.traffic_access_token},
        )
    ),
)
assert ok.text == "private door\n", ok.text

step("an unknown host under the domain: E2B's 404")
r = fetch(f"https://nothing.{domain}/")
assert r.status_code == 404 and r.json()["code"] == 404, (r.status_code, r.text)
r = fetch(f"https://8000-{'z' * 20}.{domain}/")
assert r.status_code == 404 and r.json()["code"] == 404, (r.status_code, r.text)

step("a paused sandbox's port: 502")
assert private.pause() is True
r = fetch(
    f"https://{phost}/index.html",
    {"e2b-traffic-access-token": private.traffic_access_token},
)
assert r.status_code == 502 and r.json()["code"] == 502, (r.status_code, r.text)

step("kill: its hosts are gone")
private.kill()
sbx.kill()
r = fetch(f"https://{host}/index.html")
assert r.status_code == 404, (r.status_code, r.text)

print("e2b domain: all checks passed", flush=True)
