// `@stockade/client/testing` as a consumer's node:test suite uses it, over a real
// `stockade serve --mock` (STOCKADE_BIN). Run by tests/e2e/clients.rs.
import { test } from "node:test";
import assert from "node:assert/strict";

import { StockadeError } from "../src/index.js";
import { MockServer, useMockServer } from "../src/testing.js";

const mock = useMockServer();
const text = (b: Uint8Array) => new TextDecoder().decode(b);

test("a scripted command answers its outcome; the trace shows the fence", async () => {
  await mock.sb.script([{ argv: ["sh", "-c", "exit 3"], exit_code: 3, stderr: "three\n" }]);
  const out = await mock.sb.exec("ci", ["sh", "-c", "exit 3"]);
  assert.equal(out.exitCode, 3);
  assert.equal(text(out.stderr), "three\n");
  assert.deepEqual(await mock.sb.ops("ci"), ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]);
});

test("a dispatcher's poll loop sees gone(container-unreachable) after an injected fault", async () => {
  const sb = mock.sb;
  const id = await sb.start("job-1", ["worker"]);
  const deadline = Date.now() + 20_000;
  let polls = 0;
  let state = await sb.status("job-1", id);
  while (state.state === "running") {
    polls += 1;
    if (polls === 2) await sb.fault("process-status", "unreachable", { key: "job-1" });
    assert.ok(Date.now() < deadline, "the job never left running");
    await new Promise((r) => setTimeout(r, 20));
    state = await sb.status("job-1", id);
  }
  assert.deepEqual(state, { state: "gone", reason: "container-unreachable" });
});

test("over capacity for the next two calls, then it heals", async () => {
  await mock.sb.fault("ensure", "over-capacity", { times: 2 });
  for (let i = 0; i < 2; i++) {
    await assert.rejects(mock.sb.exec("k2", ["true"]), (e: unknown) => e instanceof StockadeError && e.status === 429 && e.code === "over-capacity");
  }
  assert.equal((await mock.sb.exec("k2", ["true"])).exitCode, 0);
});

test("a script at start, without the hooks", async () => {
  const s = await MockServer.start({ script: { default: { exit_code: 9 } } });
  try {
    assert.equal((await s.sb.exec("ci", ["anything"])).exitCode, 9);
  } finally {
    await s.stop();
  }
});

test("an artifact a test puts is read back", async () => {
  await mock.sb.control("put-artifact", { key: "ci", name: "report.txt", bytes: "hello" });
  assert.equal(text(await mock.sb.readArtifact("ci", "report.txt")), "hello");
});
