"""Drive `/mcp` (Streamable HTTP) with the official MCP Python SDK's streamable HTTP
client: initialize (a session), tools/list (the same tools as stdio), an exec whose
output arrives as progress notifications before its result, a tool error, an unknown
tool, and the session's end. Run by the e2e suite (`tests/e2e/mcp_http.rs`) against a
server it started; exits non-zero on any failure.

Usage: python drive_http.py URL TOKEN
"""

import asyncio
import sys
import time

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def check(cond, what, got=None):
    if not cond:
        raise SystemExit(f"FAILED: {what}: {got!r}")
    print(f"ok: {what}")


TOOLS = ["exec", "start", "status", "stop", "denials", "egress", "artifacts", "put"]


async def main(url: str, token: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                check(init.server_info.name == "stockade", "initialize names the server", init.server_info)
                check(init.protocol_version == "2025-11-25", "the current revision", init.protocol_version)

                listed = await s.list_tools()
                names = [t.name for t in listed.tools]
                # One table serves both transports (drive.py checks the stdio list whole).
                check(set(TOOLS) <= set(names), "tools/list has every tool", names)
                check(len(names) == len(set(names)), "each tool once", names)

                # A command that writes three lines, some time apart: each should
                # arrive as a progress notification while it runs, before the result.
                seen = []

                async def on_progress(progress, total, message):
                    seen.append((time.monotonic(), progress, message))

                script = "for i in 1 2 3; do echo tick$i; sleep 0.3; done; echo done >&2"
                r = await s.call_tool(
                    "exec", {"key": "mcp-http", "argv": ["sh", "-c", script]}, progress_callback=on_progress
                )
                answered = time.monotonic()
                sc = r.structured_content
                check(not r.is_error and sc["exit_code"] == 0, "the exec succeeds", r)
                check(sc["stdout"] == "tick1\ntick2\ntick3\n" and sc["stderr"] == "done\n", "its whole output is in the result", sc)
                msgs = "".join(m for _, _, m in seen)
                check("tick1" in msgs and "tick2" in msgs and "tick3" in msgs, "every chunk came as progress", seen)
                check(len(seen) >= 3, "one notification per chunk", seen)
                progress = [p for _, p, _ in seen]
                check(progress == sorted(progress) and len(set(progress)) == len(progress), "progress increases", progress)
                check(answered - seen[0][0] > 0.4, "the first chunk came while the command still ran", (seen[0][0], answered))

                r = await s.call_tool("exec", {"key": "mcp-http", "argv": ["sh", "-c", "exit 3"]})
                check(not r.is_error and r.structured_content["exit_code"] == 3, "a non-zero exit is a result", r)

                r = await s.call_tool("exec", {"key": "mcp-http", "argv": []})
                text = r.content[0].text if r.content else ""
                check(r.is_error and "invalid-input" in text, "bad input is a tool error the model can read", text)

                r = await s.call_tool("put", {"key": "mcp-http", "path": "a.txt", "content": "over http\n"})
                check(not r.is_error, "put writes a file", r)
                r = await s.call_tool("exec", {"key": "mcp-http", "argv": ["cat", "a.txt"]})
                check(r.structured_content["stdout"] == "over http\n", "and exec reads it back", r)

                try:
                    await s.call_tool("rm-rf", {})
                    check(False, "an unknown tool is refused")
                except Exception as e:  # the SDK raises on a JSON-RPC error
                    check("unknown tool" in str(e), "an unknown tool is a JSON-RPC error", str(e))
    print("mcp-http: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
