/**
 * Test helpers over `stockade serve --mock` (docs/MOCK.md): the whole Stockade API over
 * the in-memory mock substrate, the real guest deciding, no root and no containers.
 * Node only (it spawns the binary: `STOCKADE_BIN`, else `stockade` on PATH).
 *
 *   import { test } from "node:test";
 *   import { useMockServer } from "@stockade/client/testing";
 *   const mock = useMockServer();            // a server for this file: before/after hooks
 *   // vitest: useMockServer({ hooks: { before: beforeAll, after: afterAll } })
 *   test("a failing build", async () => {
 *     await mock.sb.script([{ argv: ["make"], match: "prefix", exit_code: 2 }]);
 *     assert.equal((await mock.sb.exec("ci", ["make"])).exitCode, 2);
 *     assert.deepEqual(await mock.sb.ops("ci"), ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]);
 *   });
 *
 * The mock is a test double: nothing runs, nothing is fenced. Never point production at it.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before } from "node:test";

import { Stockade } from "./index.js";

/** One substrate call of a key's trace. */
export interface TraceCall {
  op: string;
  target: string;
}

/** A fault: `failed`, `unreachable`, `over-capacity`, `invalid` or `trap`. */
export type FaultKind = "failed" | "unreachable" | "over-capacity" | "invalid" | "trap";

/** A client of a `stockade serve --mock`: every call of `Stockade`, and the mock's own. */
export class MockStockade extends Stockade {
  /** Replace the script: `rules` (first match wins), `default` for what none matches. */
  async script(rules: object[] = [], defaultOutcome?: object): Promise<unknown> {
    const doc: Record<string, unknown> = { rules };
    if (defaultOutcome !== undefined) doc.default = defaultOutcome;
    return this.json("PUT", "/v1/mock/script", doc);
  }

  /** Arm `fault` on the next `times` calls of `op` (or "always"), of `key`'s sandbox only when given. */
  async fault(op: string, fault: FaultKind, o: { key?: string; times?: number | "always"; skip?: number } = {}): Promise<unknown> {
    return this.json("POST", "/v1/mock/faults", { op, fault, times: o.times ?? 1, skip: o.skip ?? 0, ...(o.key === undefined ? {} : { key: o.key }) });
  }

  /** Disarm every fault. */
  async clearFaults(): Promise<void> {
    await this.json("DELETE", "/v1/mock/faults");
  }

  /** The substrate calls made about `key`'s sandbox, in order. */
  async trace(key: string): Promise<TraceCall[]> {
    return (await this.json<{ calls: TraceCall[] }>("GET", `/v1/mock/trace/${encodeURIComponent(key)}`)).calls;
  }

  /** The ops of `trace(key)`. */
  async ops(key: string): Promise<string[]> {
    return (await this.trace(key)).map((c) => c.op);
  }

  /** Make happen what no call does: `put-artifact` (key, name, bytes), `stop-container` (key), `exit-process` (key, id, code), `lose-process` (key, id). */
  async control(mock: "put-artifact" | "stop-container" | "exit-process" | "lose-process", fields: Record<string, unknown>): Promise<unknown> {
    return this.json("POST", "/v1/mock/control", { mock, ...fields });
  }

  /** Forget `key`'s trace. */
  async clearTrace(key: string): Promise<void> {
    await this.json("DELETE", `/v1/mock/trace/${encodeURIComponent(key)}`);
  }
}

/** A running `stockade serve --mock` on a free loopback port, in a temporary data directory. */
export class MockServer {
  private constructor(
    private readonly child: ChildProcess,
    private readonly dir: string,
    readonly url: string,
    readonly sb: MockStockade,
    readonly log: string[],
  ) {}

  /** Start one (`script`: its script from the start); resolves once it serves. */
  static async start(o: { binary?: string; script?: object; startupMs?: number } = {}): Promise<MockServer> {
    const bin = o.binary ?? process.env.STOCKADE_BIN ?? "stockade";
    const dir = mkdtempSync(join(tmpdir(), "stockade-mock-"));
    const data = join(dir, "data");
    const args = ["serve", "--mock", "--listen", "127.0.0.1:0", "--data-dir", data];
    if (o.script !== undefined) {
      writeFileSync(join(dir, "script.json"), JSON.stringify(o.script));
      args.push("--mock-script", join(dir, "script.json"));
    }
    const env = { ...process.env };
    for (const k of ["STOCKADE_DATA_DIR", "STOCKADE_SUBSTRATE", "STOCKADE_LISTEN"]) delete env[k];
    const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env });
    const log: string[] = [];
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`stockade serve --mock did not start:\n${log.join("\n")}`)), o.startupMs ?? 30_000);
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(e);
      });
      child.on("exit", () => {
        clearTimeout(timer);
        reject(new Error(`stockade serve --mock exited:\n${log.join("\n")}`));
      });
      createInterface({ input: child.stderr! }).on("line", (line) => {
        log.push(line);
        const m = line.match(/serving on (http:\/\/\S+)/);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
    }).catch((e) => {
      child.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
      throw e;
    });
    const token = readFileSync(join(data, "api-token"), "utf8").trim();
    return new MockServer(child, dir, url, new MockStockade({ server: url, token }), log);
  }

  /** Stop it (SIGTERM, SIGKILL after 10 s) and remove its directory. */
  async stop(): Promise<void> {
    const c = this.child;
    if (c.exitCode === null && c.signalCode === null) {
      const exited = new Promise<void>((r) => c.once("exit", () => r()));
      c.kill("SIGTERM");
      const timer = setTimeout(() => c.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A `stockade serve --mock` for the calling test file (node:test's `before` and `after`
 * hooks start and stop it, or another runner's given as `hooks`: vitest's `beforeAll`
 * and `afterAll`); `.sb` is its client once the tests run.
 */
export function useMockServer(
  o: {
    binary?: string;
    script?: object;
    /** Another runner's hooks (vitest's `beforeAll`/`afterAll`); default node:test's `before`/`after`. */
    hooks?: { before: (fn: () => Promise<void>) => unknown; after: (fn: () => Promise<void>) => unknown };
  } = {},
): { readonly sb: MockStockade; readonly server: MockServer } {
  let server: MockServer | undefined;
  const hooks = o.hooks ?? { before, after };
  hooks.before(async () => {
    server = await MockServer.start(o);
  });
  hooks.after(async () => {
    await server?.stop();
  });
  return {
    get sb() {
      if (!server) throw new Error("the mock server starts in before(): use it inside a test");
      return server.sb;
    },
    get server() {
      if (!server) throw new Error("the mock server starts in before(): use it inside a test");
      return server;
    },
  };
}
