"""The unmodified `e2b` SDK and the MCP SDK against `stockade serve --mock`
(docs/MOCK.md): the E2B layer and `/mcp` over the mock, a scripted outcome seen through
each. Run by tests/e2e/mock.rs with the E2B_* environment `stockade e2b env` prints;
argv: the server's URL and the operator's token. Prints "mock: all checks passed"."""

import asyncio
import sys

from e2b import CommandExitException, Sandbox
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

server, token = sys.argv[1], sys.argv[2]


def check(cond, what, got=None):
    if not cond:
        raise SystemExit(f"FAILED: {what}: {got!r}")
    print(f"mock: {what}", flush=True)


sbx = Sandbox.create()
try:
    r = sbx.commands.run("echo hello")
    check(r.exit_code == 0, "an unscripted E2B command exits 0", r)
    try:
        sbx.commands.run("deploy --prod")
        check(False, "the scripted deploy fails")
    except CommandExitException as e:
        check(e.exit_code == 3 and "refused" in e.stderr, "the scripted deploy fails with its code and stderr", e)
finally:
    sbx.kill()


async def mcp() -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with streamable_http_client(f"{server}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r = await s.call_tool("exec", {"key": "mcp-mock", "argv": ["deploy", "--prod"]})
                sc = r.structured_content
                check(sc["exit_code"] == 3 and sc["stderr"] == "refused\n", "an MCP exec answers the script", sc)


asyncio.run(mcp())
print("mock: all checks passed")
