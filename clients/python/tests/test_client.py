"""The Python client against a real server (started by tests/e2e/clients.rs, which sets
STOCKADE_SERVER and STOCKADE_DATA_DIR). Every facade call, live output included."""

import http.server
import io
import os
import tarfile
import threading
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

from stockade import DetachedState, Exit, Grant, Output, Stockade, StockadeError


GO = threading.Event()


def target() -> int:
    """An HTTP server on 127.0.0.2: `ok` to every request, and on /go, `yes` once the
    test set GO (a gate a running command polls through its grant)."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (b"yes" if GO.is_set() else b"no") if self.path == "/go" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.2", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sb = Stockade()
        cls.port = target()

    def test_the_seeds_story(self):
        sb, port = self.sb, self.port
        self.assertTrue(sb.health())
        curl = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{port}/"
        out = sb.exec("py-story", ["sh", "-c", curl], grant=[{"host": "127.0.0.2"}])
        self.assertEqual((out.exit_code, out.text), (0, "200"))
        out = sb.exec("py-story", ["sh", "-c", curl])
        self.assertEqual((out.text, out.denials), ("403", 1))
        self.assertEqual(sb.denials("py-story")[-1].host, "127.0.0.2")
        self.assertEqual(sb.egress("py-story")[-1]["decision"], "deny")
        pid = sb.start("py-story", ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"])
        self.assertEqual(str(sb.status("py-story", pid)), "running")
        dial = ("import time, urllib.request as u\n"
                "for _ in range(200):\n"
                "    try:\n        print(u.urlopen('http://127.0.0.1:8000').status); break\n"
                "    except OSError: time.sleep(0.05)\n")
        self.assertEqual(sb.exec("py-story", ["python3", "-c", dial]).text.strip(), "200")
        sb.stop("py-story", pid)
        self.assertEqual(sb.status("py-story", pid).state, "gone")
        sb.abort("py-story")

    def test_output_is_live_and_bytes_exact(self):
        sb = self.sb
        gate = f"until curl -s --max-time 2 http://127.0.0.2:{self.port}/go | grep -q yes; do sleep 0.02; done"
        events = sb.exec_stream("py-live", ["sh", "-c", f"echo one; {gate}; printf 'two\\377'; exit 4"],
                                grant=[{"host": "127.0.0.2"}])
        first = next(events)
        self.assertEqual(first, Output("stdout", b"one\n"))
        # The command is still waiting: only now may it go on.
        GO.set()
        rest = list(events)
        data = b"".join(e.data for e in rest if isinstance(e, Output))
        self.assertEqual(data, b"two\xff")
        self.assertIsInstance(rest[-1], Exit)
        self.assertEqual(rest[-1].exit_code, 4)
        out = sb.exec("py-live", ["cat"], stdin=b"\x00\x01bytes")
        self.assertEqual(out.stdout, b"\x00\x01bytes")

    def test_files_in_artifacts_out_checkpoint(self):
        sb = self.sb
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            info = tarfile.TarInfo("src/main.py")
            body = b"print('hi')\n"
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
        self.assertEqual(sb.put_archive("py-files", buf.getvalue(), "proj"), 1)
        out = sb.exec("py-files", ["sh", "-c", "python3 proj/src/main.py > /artifacts/out.txt; head -c 5000000 /dev/zero > /artifacts/big"])
        self.assertEqual(out.exit_code, 0)
        names = {a.name: a.size for a in sb.artifacts("py-files")}
        self.assertEqual(names, {"out.txt": 3, "big": 5000000})
        self.assertEqual(sb.read_artifact("py-files", "out.txt"), b"hi\n")
        self.assertEqual(len(sb.read_artifact("py-files", "big")), 5000000)
        sb.checkpoint("py-files")
        sb.ensure("py-files")  # the container back, the checkpoint restored, nothing run
        self.assertEqual(sb.exec("py-files", ["cat", "proj/src/main.py"]).text, "print('hi')\n")
        # A named snapshot: a new key forked from it starts with this workspace; deleted,
        # it is listed no more.
        self.assertEqual(sb.save_snapshot("py-files", "v1").name, "v1")
        self.assertEqual([s.name for s in sb.snapshots("py-files")], ["v1"])
        sb.fork("py-fork", "py-files", "v1")
        self.assertEqual(sb.exec("py-fork", ["cat", "proj/src/main.py"]).text, "print('hi')\n")
        sb.delete_snapshot("py-files", "v1")
        self.assertEqual(sb.snapshots("py-files"), [])
        # A key's lifetime and metadata: described, listed, cleared, forgotten.
        info = sb.set_metadata("py-files", {"team": "ci", "run": "7"})
        self.assertEqual((info.key, info.running, info.lifetime, info.metadata),
                         ("py-files", True, None, {"run": "7", "team": "ci"}))
        info = sb.set_lifetime("py-files", ends_in_ms=3_600_000, on_end="checkpoint")
        self.assertEqual(info.lifetime.on_end, "checkpoint")
        self.assertGreater(info.lifetime.ends_at_ms, time.time() * 1000 + 3_000_000)
        self.assertEqual(sb.describe("py-files"), info)
        self.assertEqual(sb.sandboxes("py-fi"), [info])
        self.assertIsNone(sb.clear_lifetime("py-files").lifetime)
        with self.assertRaises(StockadeError) as e:
            sb.set_lifetime("py-files", ends_in_ms=1, ends_at_ms=1)
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid-input"))
        # A key's network: the grant of its commands that bring none; described, cleared.
        curl = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{self.port}/"
        rule = {"host": "127.0.0.2", "methods": ["GET"]}
        info = sb.set_network("py-files", [rule])
        self.assertEqual((info.key, info.lifetime, info.metadata, info.network),
                         ("py-files", None, {"run": "7", "team": "ci"}, Grant([rule], False)))
        self.assertEqual(sb.describe("py-files"), info)
        self.assertEqual(sb.exec("py-files", ["sh", "-c", curl]).text, "200")
        self.assertEqual(sb.exec("py-files", ["sh", "-c", curl], grant=[]).text, "403")
        self.assertEqual(sb.set_network("py-files", [{"host": "127.0.0.2"}], ask=True).network,
                         Grant([{"host": "127.0.0.2", "methods": []}], True))
        with self.assertRaises(StockadeError) as e:
            sb.set_network("py-files", [{"host": "api.example.com", "methods": ["GET"],
                                         "headers": {"Authorization": {"secret": "py-unset"}}}])
        self.assertEqual((e.exception.status, e.exception.code), (409, "secret-not-set"))
        with self.assertRaises(StockadeError) as e:
            sb.set_network("py-files", [{"host": "127.0.0.2", "methods": ["get"]}])
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid-input"))
        self.assertTrue(sb.describe("py-files").network.ask)
        self.assertIsNone(sb.clear_network("py-files").network)
        self.assertIsNone(sb.describe("py-files").network)
        self.assertEqual(sb.exec("py-files", ["sh", "-c", curl]).text, "403")
        sb.forget("py-files")
        with self.assertRaises(StockadeError) as e:
            sb.describe("py-files")
        self.assertEqual((e.exception.status, e.exception.code), (404, "not-found"))
        self.assertEqual(sb.sandboxes("py-fi"), [])
        # A lifetime that has ended: the server aborts the key and forgets it.
        self.assertEqual(sb.set_lifetime("py-fork", ends_in_ms=0).lifetime.on_end, "abort")
        for _ in range(100):
            if "py-fork" not in [i.key for i in sb.sandboxes("py-fork")]:
                break
            time.sleep(0.1)
        self.assertEqual(sb.sandboxes("py-fork"), [])
        sb.abort("py-files")

    def test_a_preview_door_reaches_a_detached_server(self):
        sb = self.sb
        sb.exec("py-preview", ["sh", "-c", "echo preview-ok > /workspace/index.html"])
        pid = sb.start("py-preview", ["python3", "-m", "http.server", "8000", "--bind",
                                      "127.0.0.1", "--directory", "/workspace"])
        try:
            door = sb.expose("py-preview", 8000)
        except StockadeError as e:
            sb.stop("py-preview", pid)
            sb.abort("py-preview")
            if e.code == "failed" and "not served" in str(e):
                self.skipTest(f"this deployment serves no preview doors: {e}")
            raise
        self.assertGreaterEqual(len(door.token), 16)
        self.assertEqual(sb.previews("py-preview"), [door])
        body = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(door.url + "index.html", timeout=5) as r:
                    body = r.read()
                break
            except OSError:
                time.sleep(0.05)
        self.assertEqual(body, b"preview-ok\n")
        with self.assertRaises(StockadeError) as e:
            sb.expose("py-preview", 0)
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid-input"))
        sb.unexpose("py-preview", 8000)
        self.assertEqual(sb.previews("py-preview"), [])
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(door.url + "index.html", timeout=5)
        self.assertEqual(e.exception.code, 404)
        sb.stop("py-preview", pid)
        sb.abort("py-preview")

    def test_errors_are_typed(self):
        sb = self.sb
        with self.assertRaises(StockadeError) as e:
            sb.exec("py-err", [])
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid-input"))
        with self.assertRaises(StockadeError) as e:
            sb.exec("py-err", ["git", "push", "origin"])
        self.assertEqual(e.exception.code, "needs-approval")
        approver = Path(os.environ["STOCKADE_DATA_DIR"], "approver-token").read_text().strip()
        token = sb.approve("py-err", ["git", "push", "origin"], approver)
        out = sb.exec("py-err", ["git", "push", "origin"], approval=token)
        self.assertNotEqual(out.exit_code, 0)  # no repository: git fails, but it ran
        with self.assertRaises(StockadeError) as e:
            list(sb.exec_stream("py-err", ["sh", "-c", "echo"], cwd="relative"))
        self.assertEqual(e.exception.status, 400)
        with self.assertRaises(StockadeError) as e:
            Stockade(token="wrong").exec("py-err", ["true"])
        self.assertEqual(e.exception.status, 401)
        self.assertEqual(sb.status("py-err", "00000000-0000-4000-8000-000000000000"),
                         DetachedState("gone", None, "unknown"))
        sb.abort("py-err")

    def test_a_scoped_token_reaches_only_its_keys(self):
        sb = self.sb
        try:
            token, info = sb.create_token("py-tenant-*", ceiling=2, name="py")
        except StockadeError as e:
            if e.status == 404:  # a deployment that serves no tenants (the edge Worker)
                self.skipTest(f"this deployment serves no scoped tokens: {e.message}")
            raise
        self.assertEqual((info.keys, info.ceiling, info.name), ("py-tenant-*", 2, "py"))
        tenant = Stockade(server=sb.server, token=token)
        self.assertEqual(tenant.exec("py-tenant-1", ["echo", "mine"]).text, "mine\n")
        with self.assertRaises(StockadeError) as e:
            tenant.exec("py-other", ["true"])
        self.assertEqual((e.exception.status, e.exception.code), (404, "not-found"))
        with self.assertRaises(StockadeError) as e:
            tenant.tokens()
        self.assertEqual(e.exception.code, "operator-only")
        self.assertIn(info.id, [t.id for t in sb.tokens()])
        tenant.abort("py-tenant-1")
        sb.revoke_token(info.id)
        with self.assertRaises(StockadeError) as e:
            tenant.exec("py-tenant-1", ["true"])
        self.assertEqual(e.exception.status, 401)


if __name__ == "__main__":
    unittest.main()
