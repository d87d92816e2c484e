// `@stockade/client/testing` as a consumer's vitest suite uses it (docs/MOCK.md), over a
// real `stockade serve --mock` (STOCKADE_BIN): vitest's own hooks given to
// `useMockServer`. Imports the built client (`npm run build` first, as `test:vitest`
// does). Run by tests/e2e/clients.rs.
import { afterAll, beforeAll, expect, test } from "vitest";

import { useMockServer } from "../dist/src/testing.js";

const mock = useMockServer({ hooks: { before: beforeAll, after: afterAll } });
const text = (b: Uint8Array) => new TextDecoder().decode(b);

test("a scripted command's output, and the fence's trace", async () => {
  await mock.sb.script([{ argv: ["make", "test"], match: "prefix", exit_code: 2, stdout: "1 failed\n" }]);
  const out = await mock.sb.exec("ci", ["make", "test", "-j2"]);
  expect(out.exitCode).toBe(2);
  expect(text(out.stdout)).toBe("1 failed\n");
  expect(await mock.sb.ops("ci")).toEqual(["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]);
});

test("a dispatcher's poll loop sees gone(container-unreachable) after an injected fault", async () => {
  const sb = mock.sb;
  const id = await sb.start("job-v", ["worker"]);
  const deadline = Date.now() + 20_000;
  let polls = 0;
  let state = await sb.status("job-v", id);
  while (state.state === "running") {
    polls += 1;
    if (polls === 2) await sb.fault("process-status", "unreachable", { key: "job-v" });
    expect(Date.now()).toBeLessThan(deadline);
    await new Promise((r) => setTimeout(r, 20));
    state = await sb.status("job-v", id);
  }
  expect(state).toEqual({ state: "gone", reason: "container-unreachable" });
});
