"""`stockade.deepagents` under the real deepagents: the provider is found through the
`deepagents_code.sandbox_providers` entry point of the installed `stockade` package, and
a deep agent whose chat model is scripted (no model service) runs `write_file`,
`execute` and `read_file` on Stockade. Run by tests/e2e/clients.rs."""

import importlib.metadata
import unittest

from deepagents import create_deep_agent

from stockade import Stockade
from stockade.deepagents import StockadeSandbox, StockadeSandboxProvider, stockade_grant

from scripted import langchain_scripted_model, target


def tool_outputs(result) -> dict[str, str]:
    return {m.name: m.content for m in result["messages"] if getattr(m, "type", "") == "tool"}


class DeepagentsProviderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sb = Stockade()
        cls.port, cls.seen = target()

    def test_the_provider_is_found_through_its_entry_point(self):
        found = {e.name: e for e in importlib.metadata.entry_points(group="deepagents_code.sandbox_providers")}
        self.assertIn("stockade", found)
        self.assertEqual(found["stockade"].dist.name, "stockade")
        self.assertIs(found["stockade"].load(), StockadeSandboxProvider)
        # deepagents-code's own registry makes it and reads its metadata.
        from deepagents_code.integrations.sandbox_config import SandboxConfig
        from deepagents_code.integrations.sandbox_registry import SandboxRegistry
        registry = SandboxRegistry(config=SandboxConfig())
        self.assertIn("stockade", registry.available_providers())
        self.assertEqual(registry.get_metadata("stockade").working_dir, "/workspace")
        provider = registry.create_provider("stockade")
        backend = provider.get_or_create(sandbox_id="prov-da-entry")
        self.assertEqual(backend.id, "prov-da-entry")
        res = backend.execute("pwd; echo from-entry-point")
        self.assertEqual((res.exit_code, res.output), (0, "/workspace\nfrom-entry-point\n"))
        provider.delete(sandbox_id="prov-da-entry")

    def test_a_scripted_deep_agent_writes_executes_and_reads(self):
        key = "prov-da-story"
        model = langchain_scripted_model([
            [("write_file", {"file_path": "/workspace/app/hello.py", "content": "print('hi from py')\n"})],
            [("execute", {"command": "python3 app/hello.py | tee out.txt"})],
            [("read_file", {"file_path": "/workspace/out.txt"})],
            "done",
        ])
        backend = StockadeSandbox(key)
        agent = create_deep_agent(model=model, backend=backend)
        result = agent.invoke({"messages": [{"role": "user", "content": "run hello"}]})
        self.assertEqual(result["messages"][-1].content, "done")
        outs = tool_outputs(result)
        self.assertIn("hi from py", outs["execute"])
        self.assertIn("hi from py", outs["read_file"])
        self.assertIn("/workspace/app/hello.py", outs["write_file"])
        # The effects are in the key's container, seen by the plain client.
        self.assertEqual(self.sb.exec(key, ["cat", "/workspace/app/hello.py"]).text, "print('hi from py')\n")
        self.assertEqual(self.sb.exec(key, ["cat", "/workspace/out.txt"]).text, "hi from py\n")
        # Files both ways, bytes exact, in and out of /workspace, with typed errors.
        up = backend.upload_files([("/workspace/b/raw", b"\x00\xff"), ("/tmp/x/y", b"tmp"), ("rel", b"")])
        self.assertEqual([u.error for u in up], [None, None, "invalid_path"])
        down = backend.download_files(["/workspace/b/raw", "/tmp/x/y", "/workspace/none", "/workspace/b"])
        self.assertEqual([(d.content, d.error) for d in down],
                         [(b"\x00\xff", None), (b"tmp", None), (None, "file_not_found"), (None, "is_directory")])
        backend.close()

    def test_the_fence_default_grant_block_grant_and_denials(self):
        key, port = "prov-da-fence", self.port
        curl = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{port}"
        bare = StockadeSandbox(key)
        model = langchain_scripted_model([[("execute", {"command": curl + "/da-denied"})], "ok"])
        result = create_deep_agent(model=model, backend=bare).invoke({"messages": [{"role": "user", "content": "x"}]})
        self.assertIn("403", tool_outputs(result)["execute"])
        self.assertIn("denied 1 egress request", tool_outputs(result)["execute"])
        self.assertIn("/da-denied", [d.path for d in self.sb.denials(key)])
        with stockade_grant([{"host": "127.0.0.2"}]):
            self.assertTrue(bare.execute(curl + "/da-block").output.startswith("200"))
        self.assertTrue(bare.execute(curl + "/da-own", grant=[{"host": "127.0.0.2"}]).output.startswith("200"))
        granted = StockadeSandbox(key, grant=[{"host": "127.0.0.2"}])
        model = langchain_scripted_model([[("execute", {"command": curl + "/da-granted"})], "ok"])
        result = create_deep_agent(model=model, backend=granted).invoke({"messages": [{"role": "user", "content": "x"}]})
        self.assertIn("200", tool_outputs(result)["execute"])
        self.assertEqual([p for p in self.seen if p.startswith("/da-")], ["/da-block", "/da-own", "/da-granted"])
        bare.close()


if __name__ == "__main__":
    unittest.main()
