// The deployment end to end: two real nodes (`stockade node`, substrate.kind = "mock":
// no root needed; the node's HTTPS, certificate pinning, signing, ownership and run
// streaming are the real ones) and workerd serving edge's generated deploy config
// (the Worker, a Durable Object per key on local disk, the nodes as pinned `external`
// HTTPS services), driven through the Worker's public API.
//
// The binary is $STOCKADE_EXE or target/debug/stockade (`cargo build -p stockade-host
// --bins`); a missing one fails loudly. Everything started here is stopped by its pid
// and every directory made here is removed, in `after`.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { deployConfig } from '../scripts/deploy-config.mjs';
import { order } from '../src/placement.js';
import { signedHeaders } from '../src/sign.js';

const edge = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(edge, '..');
const EXE = process.env.STOCKADE_EXE ?? join(root, 'target', 'debug', 'stockade');
const DEADLINE_MS = 60_000;
const TOKEN = 'edge-test-token';
const APPROVER = 'edge-test-approver';

const dir = mkdtempSync(join(tmpdir(), 'stockade-edge-'));
const children = new Set();
const nodes = [];
let workerd;
let base;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `probe` until it returns a truthy value, failing after the deadline. */
async function until(what, probe, log = () => '') {
  const end = Date.now() + DEADLINE_MS;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) assert.fail(`${what}: not after ${DEADLINE_MS} ms\n${log()}`);
    await sleep(50);
  }
}

function start(cmd, args, opts = {}) {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
  child.log = '';
  child.stdout.on('data', (d) => (child.log += d));
  child.stderr.on('data', (d) => (child.log += d));
  child.exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  children.add(child);
  child.exited.then(() => children.delete(child));
  return child;
}

async function stop(child) {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), 5000);
    await child.exited;
    clearTimeout(t);
  }
}

async function startNode(i) {
  const port = await freePort();
  const data = join(dir, `node-${i}`);
  const config = join(dir, `node-${i}.toml`);
  writeFileSync(
    config,
    `[substrate]\nkind = "mock"\ndata_dir = "${data}"\nrequire = []\n\n[node]\nlisten = "127.0.0.1:${port}"\nname = "node-${i}"\nheartbeat_ms = 200\n`,
  );
  const child = start(EXE, ['node', '--config', config]);
  await until(`node-${i} serving`, () => child.log.includes('serving on') || (child.exitCode !== null && assert.fail(child.log)), () => child.log);
  return {
    name: `node-${i}`,
    port,
    child,
    cert: join(data, 'node', 'cert.pem'),
    secretFile: join(data, 'node', 'secret'),
    secret: readFileSync(join(data, 'node', 'secret'), 'utf8').trim(),
  };
}

async function startWorkerd() {
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const desc = {
    listen: `127.0.0.1:${port}`,
    storage: join(dir, 'do-storage'),
    api_token: TOKEN,
    approver_token: APPROVER,
    heartbeat_ms: 200,
    nodes: nodes.map((n) => ({ name: n.name, address: `127.0.0.1:${n.port}`, cert_file: n.cert, secret_file: n.secretFile })),
  };
  mkdirSync(desc.storage, { recursive: true });
  const config = join(dir, 'deploy.capnp');
  writeFileSync(config, deployConfig(desc, { descDir: dir, outDir: dir }));
  const bin = join(edge, 'node_modules', '.bin', 'workerd');
  workerd = start(bin, ['serve', config], { cwd: dir });
  await until(
    'workerd ready',
    async () => {
      if (workerd.exitCode !== null) assert.fail(`workerd exited:\n${workerd.log}`);
      try {
        return (await fetch(`${base}/v1/health`, { signal: AbortSignal.timeout(2000) })).ok;
      } catch {
        return false;
      }
    },
    () => workerd.log,
  );
}

/** A call of the public API with the consumer's token (or `token`). */
async function api(method, path, body, token = TOKEN) {
  const r = await fetch(`${base}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text, type: r.headers.get('content-type') };
}

/** A signed call straight to a node (pinned to its certificate), as the Worker makes. */
function nodeCall(node, key, call, body, { secret = node.secret, headers: extra = {} } = {}) {
  return new Promise(async (resolve, reject) => {
    const path = `/node/v1/${call}`;
    const text = JSON.stringify(body);
    const headers = { ...(await signedHeaders(secret, { method: 'POST', path, key, body: text })), ...extra };
    const req = httpsRequest(
      {
        host: '127.0.0.1',
        port: node.port,
        path,
        method: 'POST',
        ca: readFileSync(node.cert),
        servername: 'stockade-node',
        headers: { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
      },
      (res) => {
        let out = '';
        res.on('data', (d) => (out += d));
        res.on('end', () => resolve({ status: res.statusCode, body: out, headers }));
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

before(async () => {
  assert.ok(existsSync(EXE), `${EXE} is missing: build it with \`cargo build -p stockade-host --bins\` (or set STOCKADE_EXE)`);
  assert.ok(existsSync(join(edge, 'gen-jspi', 'stockade.js')), 'edge/gen-jspi is missing: run `npm run build` in edge/');
  nodes.push(await startNode(1), await startNode(2));
  await startWorkerd();
});

after(async () => {
  for (const c of [...children]) await stop(c);
  rmSync(dir, { recursive: true, force: true });
});

test('the API takes the bearer token; approvals take the approver token', async () => {
  assert.equal((await api('POST', '/v1/sandboxes/auth/exec', { argv: ['true'] }, 'wrong')).status, 401);
  const r = await api('POST', '/v1/sandboxes/auth/approvals', { argv: ['reboot'] });
  assert.equal(r.status, 403);
  assert.equal(r.json.error.code, 'approver-only');
  assert.equal((await api('POST', '/v1/sandboxes/..bad/exec', { argv: ['true'] })).status, 400);
});

test('exec runs on a node and answers its output', async () => {
  const r = await api('POST', '/v1/sandboxes/exec-key/exec', { argv: ['echo', 'hello edge'] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.exit_code, 0);
  assert.equal(r.json.stdout, 'hello edge\n');
  assert.equal(r.json.stdout_base64, Buffer.from('hello edge\n').toString('base64'));
});

test('a streaming exec relays the node run output as NDJSON, then the exit event', async () => {
  const r = await api('POST', '/v1/sandboxes/stream-key/exec/stream', { argv: ['echo', 'streamed'] });
  assert.equal(r.status, 200, r.text);
  assert.match(r.type, /application\/x-ndjson/);
  const lines = r.text.trim().split('\n').map((l) => JSON.parse(l));
  const last = lines.pop();
  assert.equal(last.type, 'exit', r.text);
  assert.equal(last.exit_code, 0);
  assert.equal(lines.filter((l) => l.type === 'stdout').map((l) => l.data).join(''), 'streamed\n');
});

test('a floor command needs an approval; the approver token records one that admits it once', async () => {
  const denied = await api('POST', '/v1/sandboxes/floor-key/exec', { argv: ['reboot', 'now'] });
  assert.equal(denied.status, 403, denied.text);
  assert.equal(denied.json.error.code, 'needs-approval');
  const a = await api('POST', '/v1/sandboxes/floor-key/approvals', { argv: ['reboot', 'now'] }, APPROVER);
  assert.equal(a.status, 201, a.text);
  const ok = await api('POST', '/v1/sandboxes/floor-key/exec', { argv: ['reboot', 'now'], approval: a.json.token });
  assert.equal(ok.status, 200, ok.text);
  const again = await api('POST', '/v1/sandboxes/floor-key/exec', { argv: ['reboot', 'now'], approval: a.json.token });
  assert.equal(again.status, 403, again.text);
});

test('a detached process: start, status, stop', async () => {
  const s = await api('POST', '/v1/sandboxes/det-key/detached', { argv: ['sleep', '100'] });
  assert.equal(s.status, 201, s.text);
  const id = s.json.id;
  const st = await api('GET', `/v1/sandboxes/det-key/detached/${id}`);
  assert.deepEqual(st.json, { state: 'running' });
  const stop = await api('DELETE', `/v1/sandboxes/det-key/detached/${id}`);
  assert.deepEqual(stop.json, { stopped: id });
  const gone = await api('GET', `/v1/sandboxes/det-key/detached/${id}`);
  assert.equal(gone.json.state, 'gone', gone.text);
});

test('two keys land on their rendezvous nodes, and only there', async () => {
  const names = nodes.map((n) => n.name);
  // Two keys whose first choices differ.
  const keys = [];
  for (let i = 0; keys.length < 2 && i < 100; i++) {
    const k = `place-${i}`;
    const first = (await order(names, k))[0];
    if (!keys.some(([, f]) => f === first)) keys.push([k, first]);
  }
  assert.equal(keys.length, 2);
  for (const [k, want] of keys) {
    const r = await api('POST', `/v1/sandboxes/${k}/exec`, { argv: ['true'] });
    assert.equal(r.status, 200, r.text);
    const placed = await api('GET', `/v1/sandboxes/${k}/records`);
    assert.equal(placed.json.node, want, k);
    for (const n of nodes) {
      const c = await nodeCall(n, k, 'current', {});
      assert.equal(c.status, 200, c.body);
      const cur = JSON.parse(c.body).ok;
      if (n.name === want) assert.ok(cur, `${k} has a container on ${n.name}`);
      else assert.equal(cur, null, `${k} has no container on ${n.name}`);
    }
  }
});

test('a node refuses a request signed with another secret, and a replayed one', async () => {
  const n = nodes[0];
  assert.equal((await nodeCall(n, 'x', 'current', {}, { secret: 'f'.repeat(64) })).status, 401);
  const first = await nodeCall(n, 'x', 'current', {});
  assert.equal(first.status, 200);
  const replay = await nodeCall(n, 'x', 'current', {}, { headers: first.headers });
  assert.equal(replay.status, 401);
});

test('secrets fan out to every node; listing shows names and bindings, never values', async () => {
  const put = await api('PUT', '/v1/secrets/gh-token', { value: 'v-123', host: 'api.github.com', methods: ['GET'] }, APPROVER);
  assert.equal(put.status, 204, put.text);
  const list = await api('GET', '/v1/secrets', undefined, APPROVER);
  assert.equal(list.json.secrets[0].name, 'gh-token');
  assert.ok(!list.text.includes('v-123'));
  for (const n of nodes) {
    // The node has it: removing it there says it existed; set it back through the API.
    const r = await nodeCall(n, '', 'remove-secret', { name: 'gh-token' });
    assert.equal(JSON.parse(r.body).ok, true, `${n.name}: ${r.body}`);
  }
  assert.equal((await api('DELETE', '/v1/secrets/gh-token', undefined, APPROVER)).status, 204);
});

test('records and placement persist across a workerd restart (local disk)', async () => {
  const s = await api('POST', '/v1/sandboxes/persist-key/detached', { argv: ['sleep', '100'] });
  assert.equal(s.status, 201, s.text);
  const before = await api('GET', '/v1/sandboxes/persist-key/records');
  assert.ok(before.json.records > 0, before.text);
  await stop(workerd);
  await startWorkerd();
  const afterRestart = await api('GET', '/v1/sandboxes/persist-key/records');
  assert.deepEqual(afterRestart.json, before.json);
  const st = await api('GET', `/v1/sandboxes/persist-key/detached/${s.json.id}`);
  assert.deepEqual(st.json, { state: 'running' }, st.text);
  await api('DELETE', `/v1/sandboxes/persist-key/detached/${s.json.id}`);
});
