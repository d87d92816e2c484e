"""The frameworks' own E2B providers, unchanged, against Stockade's E2B-compatible API
(docs/E2B.md): configured only by what `eval "$(stockade e2b env)"` sets (E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY, E2B_VALIDATE_API_KEY: this venv's e2b 2.31.0 checks the
key's shape otherwise), driven by the same scripted models. Every E2B call they make is served (the e2e
test fails on any skip)."""

import asyncio
import io
import os
import unittest

from stockade import Stockade

from scripted import langchain_scripted_model, oa_exec, oa_patch, oa_say, openai_scripted_model


def SandboxRegistryOf(name: str):
    """deepagents-code's provider `name`, through its registry (entry points included)."""
    from deepagents_code.integrations.sandbox_config import SandboxConfig
    from deepagents_code.integrations.sandbox_registry import SandboxRegistry
    return SandboxRegistry(config=SandboxConfig()).create_provider(name)


def e2b_key(sandbox_id: str) -> str:
    """The Stockade key of an E2B sandbox made with the operator's token (docs/E2B.md)."""
    return f"e2b-{sandbox_id}"


class E2BProvidersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for v in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
            if not os.environ.get(v):
                raise AssertionError(f"{v} is not set: run under `eval \"$(stockade e2b env)\"`")
        cls.sb = Stockade()

    def _oa_e2b_run(self, turns, check):
        """Run a scripted `SandboxAgent` on a session of the SDK's own E2B client (unchanged);
        `check(key)` runs while the session is open; the model is returned."""
        from agents import RunConfig, Runner
        from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions
        from agents.sandbox import SandboxAgent, SandboxRunConfig

        model = openai_scripted_model(turns)

        async def run():
            client = E2BSandboxClient()
            session = await client.create(options=E2BSandboxClientOptions(sandbox_type="e2b"))
            key = e2b_key(session._inner.state.sandbox_id)
            async with session:
                agent = SandboxAgent(name="builder", instructions="Build it.", model=model)
                cfg = RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True)
                result = await Runner.run(agent, "build it", run_config=cfg)
                self.assertEqual(result.final_output, "done")
                await check(session, key)

        asyncio.run(run())
        return model

    def test_openai_agents_e2b_provider_runs_a_scripted_agent(self):
        async def check(session, key):
            self.assertEqual(self.sb.exec(key, ["cat", "/workspace/e2b.txt"]).text, "via-e2b\n")
            self.assertNotEqual(self.sb.exec(key, ["test", "-e", "/workspace/gone.txt"]).exit_code, 0)
            # The session's own file calls: files.write, files.read (envd /files).
            await session.write("sub/e2b-file.txt", io.BytesIO(b"written"))
            self.assertEqual((await session.read("sub/e2b-file.txt")).read(), b"written")
            self.assertEqual(self.sb.exec(key, ["cat", "/workspace/sub/e2b-file.txt"]).text, "written")

        model = self._oa_e2b_run([
            [oa_exec("echo via-e2b > e2b.txt && echo bye > gone.txt && uname -s", "e1")],
            [oa_exec("cat e2b.txt", "e2")],
            # apply_patch's Delete File: the SDK's rm, a command.
            [oa_patch("*** Begin Patch\n*** Delete File: gone.txt\n*** End Patch\n", "e3")],
            [oa_say("done")],
        ], check)
        self.assertIn("Linux", model.outputs["e1"])
        self.assertIn("via-e2b", model.outputs["e2"])
        self.assertIn("Deleted gone.txt", model.outputs["e3"])

    def test_openai_agents_e2b_provider_applies_patches(self):
        async def check(session, key):
            self.assertEqual(self.sb.exec(key, ["cat", "/workspace/notes/e2b.md"]).text, "from the patch")
            # The file had its final newline (echo), and the update keeps it.
            self.assertEqual(self.sb.exec(key, ["cat", "/workspace/top.md"]).text, "patched\n")

        model = self._oa_e2b_run([
            [oa_patch("*** Begin Patch\n*** Add File: notes/e2b.md\n+from the patch\n*** End Patch\n", "p1")],
            [oa_exec("echo top > top.md", "p2")],
            [oa_patch("*** Begin Patch\n*** Update File: top.md\n@@\n-top\n+patched\n*** End Patch\n", "p3")],
            [oa_say("done")],
        ], check)
        self.assertIn("notes/e2b.md", model.outputs["p1"])

    def test_deepagents_e2b_provider_runs_a_scripted_deep_agent(self):
        from deepagents import create_deep_agent

        # langchain-e2b's provider, found through the same entry point as Stockade's own.
        provider = SandboxRegistryOf("e2b")
        backend = provider.get_or_create()
        key = e2b_key(backend.id)
        try:
            model = langchain_scripted_model([
                [("write_file", {"file_path": "/workspace/da-e2b.py", "content": "print('deep e2b')\n"})],
                [("execute", {"command": "python3 /workspace/da-e2b.py | tee /workspace/da-out.txt"})],
                [("read_file", {"file_path": "/workspace/da-out.txt"})],
                "done",
            ])
            result = create_deep_agent(model=model, backend=backend).invoke(
                {"messages": [{"role": "user", "content": "run it"}]})
            outs = {m.name: m.content for m in result["messages"] if getattr(m, "type", "") == "tool"}
            self.assertIn("deep e2b", outs["execute"])
            self.assertIn("deep e2b", outs["read_file"])
            self.assertEqual(self.sb.exec(key, ["cat", "/workspace/da-e2b.py"]).text, "print('deep e2b')\n")
        finally:
            provider.delete(sandbox_id=backend.id)

    def test_deepagents_e2b_provider_downloads_files(self):
        provider = SandboxRegistryOf("e2b")
        backend = provider.get_or_create()
        try:
            self.assertEqual([u.error for u in backend.upload_files([("/workspace/d.bin", b"\x00d")])], [None])
            down = backend.download_files(["/workspace/d.bin", "/workspace/none"])
            self.assertEqual([(d.content, d.error) for d in down],
                             [(b"\x00d", None), (None, "file_not_found")])
        finally:
            provider.delete(sandbox_id=backend.id)


if __name__ == "__main__":
    unittest.main()
