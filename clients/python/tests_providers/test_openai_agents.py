"""`stockade.openai_agents` under the real OpenAI Agents SDK: a `SandboxAgent` run whose
model is scripted (no model service) drives a Stockade sandbox through the SDK's own tools
(`exec_command`, `apply_patch`); the effects are asserted through the plain client. Run by
tests/e2e/clients.rs with STOCKADE_SERVER and STOCKADE_DATA_DIR set."""

import asyncio
import io
import tarfile
import unittest
import urllib.request

from agents import RunConfig, Runner
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.errors import WorkspaceReadNotFoundError

from stockade import Stockade
from stockade.openai_agents import (
    StockadeSandboxClient,
    StockadeSandboxClientOptions,
    stockade_grant,
)

import re

from scripted import oa_exec, oa_patch, oa_say, oa_stdin, openai_scripted_model, target


def run_agent(model, session):
    agent = SandboxAgent(name="builder", instructions="Build it.", model=model)
    cfg = RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True)
    return Runner.run(agent, "build it", run_config=cfg)


class OpenAIAgentsProviderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sb = Stockade()
        cls.port, cls.seen = target()

    def test_a_scripted_agent_execs_writes_and_reads_in_the_sandbox(self):
        key = "prov-oa-story"
        model = openai_scripted_model([
            [oa_exec("echo made > by-exec.txt && uname -s", "c1")],
            [oa_patch("*** Begin Patch\n*** Add File: notes/plan.md\n+first line\n*** End Patch\n", "c2")],
            [oa_patch("*** Begin Patch\n*** Update File: notes/plan.md\n@@\n-first line\n+second line\n*** End Patch\n", "c3")],
            [oa_exec("cat notes/plan.md by-exec.txt", "c4")],
            [oa_say("done")],
        ])

        async def story():
            client = StockadeSandboxClient()
            session = await client.create(options=StockadeSandboxClientOptions(key=key))
            async with session:
                result = await run_agent(model, session)
                self.assertEqual(result.final_output, "done")
                # The container is the key's: the plain client sees what the agent did (the
                # SDK's patch writes its lines without a final newline).
                self.assertEqual(self.sb.exec(key, ["cat", "/workspace/notes/plan.md"]).text, "second line")
                self.assertEqual(self.sb.exec(key, ["cat", "/workspace/by-exec.txt"]).text, "made\n")
                self.assertTrue(await session.running())
                # read/write straight through the session, bytes exact.
                await session.write("bin/blob", io.BytesIO(b"\x00\xffraw"))
                self.assertEqual((await session.read("bin/blob")).read(), b"\x00\xffraw")
                with self.assertRaises(WorkspaceReadNotFoundError):
                    await session.read("no/such/file")
                # persist → change → hydrate: the workspace comes back as it was.
                tar = (await session.persist_workspace()).read()
                with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                    self.assertIn("./notes/plan.md", t.getnames())
                await session.exec("rm -rf notes bin && echo gone > by-exec.txt")
                await session.hydrate_workspace(io.BytesIO(tar))
                self.assertEqual((await session.read("notes/plan.md")).read(), b"second line")
                self.assertEqual((await session.read("by-exec.txt")).read(), b"made\n")
            # The session is over: the key's container was aborted with it.
            self.assertFalse(await session.running())

        asyncio.run(story())
        self.assertIn("Linux", model.outputs["c1"])
        self.assertIn("second linemade\n", model.outputs["c4"])
        self.assertIn("notes/plan.md", model.outputs["c2"])

    def test_the_fence_a_default_grant_and_one_execs_own(self):
        key, port = "prov-oa-fence", self.port
        curl = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{port}"

        async def fence():
            client = StockadeSandboxClient()
            # No grant: the fence refuses the agent's request and records the denial.
            bare = await client.create(options=StockadeSandboxClientOptions(key=key))
            async with bare:
                model = openai_scripted_model([[oa_exec(curl + "/denied", "d1")], [oa_say("ok")]])
                await run_agent(model, bare)
                self.assertIn("403", model.outputs["d1"])
                self.assertIn("denied 1 egress request", model.outputs["d1"])
                # One exec's own grant, from code, for that exec only.
                with stockade_grant([{"host": "127.0.0.2"}]):
                    out = await bare.exec(curl + "/own")
                self.assertEqual(out.stdout, b"200")
                self.assertEqual((await bare.exec(curl + "/after")).stdout, b"403")
            denied = [d.path for d in self.sb.denials(key) if d.host == "127.0.0.2"]
            self.assertIn("/denied", denied)
            self.assertIn("/after", denied)
            # A default grant in the options: every exec of the session holds it.
            opts = StockadeSandboxClientOptions(key=key, grant=({"host": "127.0.0.2"},))
            granted = await client.create(options=opts)
            async with granted:
                model = openai_scripted_model([[oa_exec(curl + "/granted", "g1")], [oa_say("ok")]])
                await run_agent(model, granted)
                self.assertIn("200", model.outputs["g1"])

        asyncio.run(fence())
        self.assertIn("/granted", self.seen)
        self.assertIn("/own", self.seen)
        self.assertNotIn("/denied", self.seen)
        self.assertNotIn("/after", self.seen)

    def test_an_exposed_port_is_a_preview_door(self):
        key = "prov-oa-door"

        async def door():
            client = StockadeSandboxClient()
            session = await client.create(options=StockadeSandboxClientOptions(key=key, exposed_ports=(8000,)))
            async with session:
                await session.write("index.html", io.BytesIO(b"door-ok\n"))
                self.sb.start(key, ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1",
                                    "--directory", "/workspace"])
                endpoint = await session.resolve_exposed_port(8000)
                url = endpoint.url_for("http") + "index.html"
                body = await asyncio.to_thread(fetch, url)
                self.assertEqual(body, b"door-ok\n")
                self.assertEqual([p.port for p in self.sb.previews(key)], [8000])

        try:
            asyncio.run(door())
        except Exception as e:  # a deployment without doors (the edge's own) says so
            if "not served" in str(e):
                self.skipTest(f"this deployment serves no preview doors: {e}")
            raise

    def test_with_pty_a_process_runs_across_tool_calls_and_takes_stdin(self):
        key = "prov-oa-pty"

        def session_of(outputs):
            found = re.search(r"session ID (\d+)", outputs["t1"])
            self.assertIsNotNone(found, outputs["t1"])
            return [oa_stdin(int(found.group(1)), "hello\n", "t2")]

        model = openai_scripted_model([
            # A process that waits for input: still running when the tool call returns.
            [oa_exec("read x; echo got $x; tty -s && echo on-a-tty; exit 3", "t1", tty=True, yield_time_ms=500)],
            session_of,
            [oa_exec("echo one-shot", "t3")],
            [oa_say("done")],
        ])

        async def run():
            client = StockadeSandboxClient()
            session = await client.create(options=StockadeSandboxClientOptions(key=key, pty=True))
            async with session:
                self.assertTrue(session.supports_pty())
                await run_agent(model, session)

        asyncio.run(run())
        self.assertIn("Process running with session ID", model.outputs["t1"])
        self.assertIn("got hello", model.outputs["t2"])
        self.assertIn("on-a-tty", model.outputs["t2"])
        self.assertIn("Process exited with code 3", model.outputs["t2"])
        self.assertIn("Process exited with code 0", model.outputs["t3"])
        self.assertIn("one-shot", model.outputs["t3"])

    def test_options_and_state_round_trip_through_json(self):
        from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions
        opts = StockadeSandboxClientOptions(key="k", grant=({"host": "pypi.org"},), exposed_ports=(3000,))
        back = BaseSandboxClientOptions.parse(opts.model_dump(mode="json"))
        self.assertEqual(back, opts)
        self.assertEqual(opts.type, "stockade")


def fetch(url: str) -> bytes:
    import time
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


if __name__ == "__main__":
    unittest.main()
