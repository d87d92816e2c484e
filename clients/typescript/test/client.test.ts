// The TypeScript client against a real server (started by tests/e2e/clients.rs, which
// sets STOCKADE_SERVER and STOCKADE_DATA_DIR). Every facade call, live output included.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { AddressInfo } from "node:net";

import { Stockade, StockadeError, type Output, type Exit } from "../src/index.js";

const dataDir = process.env.STOCKADE_DATA_DIR!;
const sb = new Stockade({
  server: process.env.STOCKADE_SERVER,
  token: readFileSync(join(dataDir, "api-token"), "utf8").trim(),
});

// An HTTP server on 127.0.0.2: `ok`, and on /go `yes` once the test opens the gate.
let go = false;
let port = 0;
const target = http.createServer((req, res) => {
  res.end(req.url === "/go" ? (go ? "yes" : "no") : "ok");
});
before(async () => {
  await new Promise<void>((r) => target.listen(0, "127.0.0.2", r));
  port = (target.address() as AddressInfo).port;
});
after(() => target.close());

const text = (b: Uint8Array) => new TextDecoder().decode(b);

/** A one-file ustar archive. */
function tar(name: string, body: Uint8Array): Uint8Array {
  const h = new Uint8Array(512);
  const put = (s: string, at: number) => h.set(new TextEncoder().encode(s), at);
  put(name, 0);
  put("0000644\0", 100);
  put("0000000\0", 108);
  put("0000000\0", 116);
  put(body.length.toString(8).padStart(11, "0") + "\0", 124);
  put("00000000000\0", 136);
  put("        ", 148);
  put("0", 156);
  put("ustar\0" + "00", 257);
  const sum = h.reduce((a, b) => a + b, 0);
  put(sum.toString(8).padStart(6, "0") + "\0 ", 148);
  const out = new Uint8Array(512 + Math.ceil(body.length / 512) * 512 + 1024);
  out.set(h, 0);
  out.set(body, 512);
  return out;
}

test("the seed's story", async () => {
  assert.equal(await sb.health(), true);
  const curl = `curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.2:${port}/`;
  let out = await sb.exec("ts-story", ["sh", "-c", curl], { grant: [{ host: "127.0.0.2" }] });
  assert.deepEqual([out.exitCode, out.text], [0, "200"]);
  out = await sb.exec("ts-story", ["sh", "-c", curl]);
  assert.deepEqual([out.text, out.denials], ["403", 1]);
  const denials = await sb.denials("ts-story");
  assert.equal(denials.at(-1)?.host, "127.0.0.2");
  const egress = await sb.egress("ts-story");
  assert.equal(egress.at(-1)?.decision, "deny");
  const id = await sb.start("ts-story", ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]);
  assert.deepEqual(await sb.status("ts-story", id), { state: "running" });
  const dial =
    "import time, urllib.request as u\nfor _ in range(200):\n    try:\n        print(u.urlopen('http://127.0.0.1:8000').status); break\n    except OSError: time.sleep(0.05)\n";
  assert.equal((await sb.exec("ts-story", ["python3", "-c", dial])).text.trim(), "200");
  await sb.stop("ts-story", id);
  assert.equal((await sb.status("ts-story", id)).state, "gone");
  await sb.abort("ts-story");
});

test("output is live and bytes are exact", async () => {
  const gate = `until curl -s --max-time 2 http://127.0.0.2:${port}/go | grep -q yes; do sleep 0.02; done`;
  const events = sb.execStream("ts-live", ["sh", "-c", `echo one; ${gate}; printf 'two\\377'; exit 4`], {
    grant: [{ host: "127.0.0.2" }],
  });
  const first = await events.next();
  assert.deepEqual(first.value, { type: "stdout", data: new TextEncoder().encode("one\n") });
  // The command is still waiting: only now may it go on.
  go = true;
  const rest: (Output | Exit)[] = [];
  for await (const ev of events) rest.push(ev);
  const bytes = rest.flatMap((e) => (e.type === "exit" ? [] : [...e.data]));
  assert.deepEqual(bytes, [...new TextEncoder().encode("two"), 0xff]);
  const last = rest.at(-1) as Exit;
  assert.deepEqual([last.type, last.exitCode], ["exit", 4]);
  const out = await sb.exec("ts-live", ["cat"], { stdin: new Uint8Array([0, 1, 2, 255]) });
  assert.deepEqual([...out.stdout], [0, 1, 2, 255]);
  await sb.abort("ts-live");
});

test("files in, artifacts out, checkpoint", async () => {
  const n = await sb.putArchive("ts-files", tar("src/main.py", new TextEncoder().encode("print('hi')\n")), "proj");
  assert.equal(n, 1);
  await sb.putFile("ts-files", "notes/a b.txt", "hello ✓\n");
  const out = await sb.exec("ts-files", [
    "sh",
    "-c",
    "python3 proj/src/main.py > /artifacts/out.txt; cat 'notes/a b.txt' >> /artifacts/out.txt; head -c 5000000 /dev/zero > /artifacts/big",
  ]);
  assert.equal(out.exitCode, 0);
  const listed = Object.fromEntries((await sb.artifacts("ts-files")).map((a) => [a.name, a.size]));
  assert.deepEqual(listed, { "out.txt": 13, big: 5000000 });
  assert.equal(text(await sb.readArtifact("ts-files", "out.txt")), "hi\nhello ✓\n");
  assert.equal((await sb.readArtifact("ts-files", "big")).length, 5000000);
  await sb.checkpoint("ts-files");
  await sb.ensure("ts-files"); // the container back, the checkpoint restored, nothing run
  assert.equal((await sb.exec("ts-files", ["cat", "proj/src/main.py"])).text, "print('hi')\n");
  // A named snapshot: a new key forked from it starts with this workspace; deleted, it
  // is listed no more.
  assert.equal((await sb.saveSnapshot("ts-files", "v1")).name, "v1");
  assert.deepEqual((await sb.snapshots("ts-files")).map((s) => s.name), ["v1"]);
  await sb.fork("ts-fork", "ts-files", "v1");
  assert.equal((await sb.exec("ts-fork", ["cat", "proj/src/main.py"])).text, "print('hi')\n");
  await sb.deleteSnapshot("ts-files", "v1");
  assert.deepEqual(await sb.snapshots("ts-files"), []);
  // A key's lifetime and metadata: described, listed, cleared, forgotten.
  let info = await sb.setMetadata("ts-files", { team: "ci", run: "7" });
  assert.deepEqual(info, { key: "ts-files", running: true, lifetime: null, metadata: { run: "7", team: "ci" }, network: null });
  info = await sb.setLifetime("ts-files", { endsInMs: 3_600_000, onEnd: "checkpoint" });
  assert.equal(info.lifetime?.on_end, "checkpoint");
  assert.ok((info.lifetime?.ends_at_ms ?? 0) > Date.now() + 3_000_000);
  assert.deepEqual(await sb.describe("ts-files"), info);
  assert.deepEqual(await sb.sandboxes("ts-fi"), [info]);
  assert.equal((await sb.clearLifetime("ts-files")).lifetime, null);
  await assert.rejects(sb.setLifetime("ts-files", { endsInMs: 1, endsAtMs: 1 }), (e: StockadeError) => e.status === 400 && e.code === "invalid-input");
  // A key's network: the grant of its commands that bring none; described, cleared.
  const curl = `curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.2:${port}/`;
  const rule = { host: "127.0.0.2", methods: ["GET" as const] };
  info = await sb.setNetwork("ts-files", [rule]);
  assert.deepEqual(info, { key: "ts-files", running: true, lifetime: null, metadata: { run: "7", team: "ci" }, network: { rules: [rule] } });
  assert.deepEqual(await sb.describe("ts-files"), info);
  assert.equal((await sb.exec("ts-files", ["sh", "-c", curl])).text, "200");
  assert.equal((await sb.exec("ts-files", ["sh", "-c", curl], { grant: [] })).text, "403");
  assert.deepEqual((await sb.setNetwork("ts-files", [{ host: "127.0.0.2" }], { ask: true })).network, { rules: [{ host: "127.0.0.2", methods: [] }], ask: true });
  const credential = { host: "api.example.com", methods: ["GET" as const], headers: { Authorization: { secret: "ts-unset" } } };
  await assert.rejects(sb.setNetwork("ts-files", [credential]), (e: StockadeError) => e.status === 409 && e.code === "secret-not-set");
  assert.equal((await sb.describe("ts-files")).network?.ask, true);
  assert.equal((await sb.clearNetwork("ts-files")).network, null);
  assert.equal((await sb.describe("ts-files")).network, null);
  assert.equal((await sb.exec("ts-files", ["sh", "-c", curl])).text, "403");
  await sb.forget("ts-files");
  await assert.rejects(sb.describe("ts-files"), (e: StockadeError) => e.status === 404 && e.code === "not-found");
  assert.deepEqual(await sb.sandboxes("ts-fi"), []);
  // A lifetime that has ended: the server aborts the key and forgets it.
  assert.equal((await sb.setLifetime("ts-fork", { endsInMs: 0 })).lifetime?.on_end, "abort");
  for (let i = 0; i < 100 && (await sb.sandboxes("ts-fork")).length > 0; i++) await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(await sb.sandboxes("ts-fork"), []);
  await sb.abort("ts-files");
});

test("a preview door reaches a detached server", async (t) => {
  await sb.exec("ts-preview", ["sh", "-c", "echo preview-ok > /workspace/index.html"]);
  const pid = await sb.start("ts-preview", ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/workspace"]);
  let door;
  try {
    door = await sb.expose("ts-preview", 8000);
  } catch (e) {
    await sb.stop("ts-preview", pid);
    await sb.abort("ts-preview");
    // A deployment whose substrate serves no doors (remote, edge) says so, typed.
    if (e instanceof StockadeError && e.code === "failed" && e.message.includes("not served")) {
      t.skip(`this deployment serves no preview doors: ${e.message}`);
      return;
    }
    throw e;
  }
  assert.ok(door.token.length >= 16);
  assert.deepEqual(await sb.previews("ts-preview"), [door]);
  let body = "";
  for (let i = 0; i < 200 && body === ""; i++) {
    const r = await fetch(door.url + "index.html").catch(() => null);
    if (r && r.status === 200) body = await r.text();
    else await new Promise((res) => setTimeout(res, 50));
  }
  assert.equal(body, "preview-ok\n");
  await assert.rejects(sb.expose("ts-preview", 0), (e: unknown) => e instanceof StockadeError && e.status === 400);
  await sb.unexpose("ts-preview", 8000);
  assert.deepEqual(await sb.previews("ts-preview"), []);
  assert.equal((await fetch(door.url + "index.html")).status, 404);
  await sb.stop("ts-preview", pid);
  await sb.abort("ts-preview");
});

test("errors are typed", async () => {
  await assert.rejects(sb.exec("ts-err", []), (e: StockadeError) => e.status === 400 && e.code === "invalid-input");
  await assert.rejects(sb.exec("ts-err", ["git", "push", "origin"]), (e: StockadeError) => e.code === "needs-approval");
  const approver = readFileSync(join(dataDir, "approver-token"), "utf8").trim();
  const token = await sb.approve("ts-err", ["git", "push", "origin"], approver);
  const out = await sb.exec("ts-err", ["git", "push", "origin"], { approval: token });
  assert.notEqual(out.exitCode, 0); // no repository: git fails, but it ran
  await assert.rejects(
    (async () => {
      for await (const _ of sb.execStream("ts-err", ["true"], { cwd: "relative" })) {
        /* nothing */
      }
    })(),
    (e: StockadeError) => e.status === 400,
  );
  const wrong = new Stockade({ server: sb.server, token: "wrong" });
  await assert.rejects(wrong.exec("ts-err", ["true"]), (e: StockadeError) => e.status === 401);
  assert.deepEqual(await sb.status("ts-err", "00000000-0000-4000-8000-000000000000"), {
    state: "gone",
    reason: "unknown",
  });
  await sb.abort("ts-err");
});

test("a scoped token reaches only its keys", async (t) => {
  let made;
  try {
    made = await sb.createToken("ts-tenant-*", { ceiling: 2, name: "ts" });
  } catch (e) {
    // A deployment that serves no tenants (the edge Worker) answers 404.
    if (e instanceof StockadeError && e.status === 404) {
      t.skip(`this deployment serves no scoped tokens: ${e.message}`);
      return;
    }
    throw e;
  }
  assert.deepEqual([made.info.keys, made.info.ceiling, made.info.name], ["ts-tenant-*", 2, "ts"]);
  const tenant = new Stockade({ server: sb.server, token: made.token });
  assert.equal((await tenant.exec("ts-tenant-1", ["echo", "mine"])).text, "mine\n");
  await assert.rejects(tenant.exec("ts-other", ["true"]), (e: StockadeError) => e.status === 404 && e.code === "not-found");
  await assert.rejects(tenant.tokens(), (e: StockadeError) => e.code === "operator-only");
  assert.ok((await sb.tokens()).some((x) => x.id === made.info.id));
  await tenant.abort("ts-tenant-1");
  await sb.revokeToken(made.info.id);
  await assert.rejects(tenant.exec("ts-tenant-1", ["true"]), (e: StockadeError) => e.status === 401);
});
