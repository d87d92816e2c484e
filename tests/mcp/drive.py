"""Drive `stockade mcp` with the official MCP Python SDK (a real MCP client):
initialize, tools/list, tools/call (an exec with a grant, a detached server, a
denial, put, a tool error, an unknown tool). Run by the e2e suite
(`tests/e2e/mcp.rs`) against a server it started; exits non-zero on any failure.

Usage: python drive.py STOCKADE_EXE  (STOCKADE_SERVER and STOCKADE_DATA_DIR set)
"""

import asyncio
import http.server
import json
import os
import sys
import threading

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def target() -> int:
    """An HTTP server on 127.0.0.2 answering 200 (the egress target)."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.2", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


def check(cond, what, got=None):
    if not cond:
        raise SystemExit(f"FAILED: {what}: {got!r}")
    print(f"ok: {what}")


async def main(exe: str) -> None:
    port = target()
    params = StdioServerParameters(command=exe, args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check(init.server_info.name == "stockade", "initialize names the server", init.server_info)
            check(init.capabilities.tools is not None, "the server offers tools", init.capabilities)

            listed = await s.list_tools()
            names = [t.name for t in listed.tools]
            check(
                names == ["exec", "start", "status", "stop", "denials", "egress", "egress_pending", "artifacts", "expose", "unexpose", "previews", "put"],
                "tools/list has every tool",
                names,
            )
            exec_schema = next(t for t in listed.tools if t.name == "exec").input_schema
            check(exec_schema["required"] == ["key", "argv"], "exec's schema requires key and argv", exec_schema)
            check(exec_schema["properties"]["argv"]["minItems"] == 1, "argv must not be empty", exec_schema)

            async def call(name, args):
                r = await s.call_tool(name, args)
                return r, (r.content[0].text if r.content else ""), r.structured_content

            curl = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{port}/x"
            r, text, sc = await call(
                "exec",
                {"key": "mcp", "argv": ["sh", "-c", curl], "grant": {"rules": [{"host": "127.0.0.2"}]}},
            )
            check(not r.is_error and sc["exit_code"] == 0 and sc["stdout"] == "200", "exec with a grant reaches its host", text)

            r, text, sc = await call("exec", {"key": "mcp", "argv": ["sh", "-c", curl]})
            check(sc["stdout"] == "403" and sc["denials"] == 1, "without a grant the fence denies", text)
            r, text, sc = await call("denials", {"key": "mcp"})
            check(any(d["host"] == "127.0.0.2" for d in sc["denials"]), "denials lists it", text)
            r, text, sc = await call("egress", {"key": "mcp"})
            check(sc["egress"][-1]["decision"] == "deny" and "  deny  GET 127.0.0.2" in text, "egress lists it, as the CLI prints it", text)

            r, text, sc = await call(
                "start", {"key": "mcp", "argv": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]}
            )
            check(not r.is_error and len(sc["id"]) == 36, "start returns an id", text)
            pid = sc["id"]
            dial = (
                "import time, urllib.request as u\n"
                "for _ in range(200):\n"
                "    try:\n"
                "        print(u.urlopen('http://127.0.0.1:8000').status); break\n"
                "    except OSError: time.sleep(0.05)\n"
            )
            r, text, sc = await call("exec", {"key": "mcp", "argv": ["python3", "-c", dial]})
            check(sc["stdout"].strip() == "200", "the detached server answers inside the sandbox", text)
            r, text, sc = await call("status", {"key": "mcp", "id": pid})
            check(sc["state"] == "running" and text == "running", "status says running", text)
            r, text, sc = await call("stop", {"key": "mcp", "id": pid})
            check(not r.is_error, "stop", text)
            r, text, sc = await call("status", {"key": "mcp", "id": pid})
            check(sc["state"] == "gone", "a stopped process is gone", text)

            r, text, sc = await call("put", {"key": "mcp", "path": "notes/a b.txt", "content": "hello ✓\n"})
            check(not r.is_error, "put writes a file", text)
            r, text, sc = await call("exec", {"key": "mcp", "argv": ["sh", "-c", "cat 'notes/a b.txt'; stat -c %u 'notes/a b.txt'"]})
            check(sc["stdout"] == "hello ✓\n1000\n", "the file is there, owned by the sandbox's user", text)

            r, text, sc = await call("exec", {"key": "mcp", "argv": []})
            check(r.is_error and "invalid-input" in text, "bad input is a tool error the model can read", text)
            r, text, sc = await call("exec", {"key": "../x", "argv": ["true"]})
            check(r.is_error and "key" in text, "a key outside the grammar never reaches a route", text)

            try:
                await s.call_tool("rm-rf", {})
                check(False, "an unknown tool is refused")
            except Exception as e:  # the SDK raises on a JSON-RPC error
                check("unknown tool" in str(e), "an unknown tool is a JSON-RPC error", str(e))
    print("mcp: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
