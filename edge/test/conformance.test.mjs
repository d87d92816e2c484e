// The conformance scenarios (tests/scenarios/conformance.json), run against the same
// guest .wasm inside workerd. Starts workerd on a free loopback port, waits for it to
// answer (polling, with a deadline), POSTs each scenario to /scenario, and stops
// workerd at the end. Run by `node --test` (edge/run-tests.sh).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { DEFAULT_FLOOR } from '../src/defaults.js';

const edge = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(edge, '..');
const { scenarios } = JSON.parse(readFileSync(join(root, 'tests/scenarios/conformance.json'), 'utf8'));
const faults = JSON.parse(readFileSync(join(root, 'tests/scenarios/faults.json'), 'utf8'));
const READY_DEADLINE_MS = 60_000;

let workerd;
let output = '';
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

before(async () => {
  for (const f of ['stockade.js', 'stockade.core.wasm']) {
    assert.ok(existsSync(join(edge, 'gen', f)), `edge/gen/${f} is missing: run \`npm run build\` in edge/ first`);
  }
  const bin = join(edge, 'node_modules', '.bin', 'workerd');
  assert.ok(existsSync(bin), 'workerd is not installed: run `npm ci` in edge/ first');
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  workerd = spawn(bin, ['serve', join(edge, 'config.capnp'), '--socket-addr', `http=127.0.0.1:${port}`], {
    cwd: edge,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  workerd.stdout.on('data', (d) => (output += d));
  workerd.stderr.on('data', (d) => (output += d));
  let exited = null;
  workerd.on('exit', (code, signal) => (exited = { code, signal }));
  const deadline = Date.now() + READY_DEADLINE_MS;
  for (;;) {
    if (exited) assert.fail(`workerd exited (${JSON.stringify(exited)}) before it was ready:\n${output}`);
    try {
      const r = await fetch(`${base}/health`, { signal: AbortSignal.timeout(2000) });
      if (r.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) assert.fail(`workerd not ready after ${READY_DEADLINE_MS} ms:\n${output}`);
    await sleep(100);
  }
});

after(async () => {
  if (workerd && workerd.exitCode === null && workerd.signalCode === null) {
    const gone = new Promise((r) => workerd.once('exit', r));
    workerd.kill('SIGTERM');
    const t = setTimeout(() => workerd.kill('SIGKILL'), 5000);
    await gone;
    clearTimeout(t);
  }
});

async function runInWorkerd(scenario) {
  const r = await fetch(`${base}/scenario`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(scenario),
  });
  const text = await r.text();
  assert.equal(r.status, 200, `HTTP ${r.status}: ${text}`);
  return JSON.parse(text);
}

test('the scenario file has scenarios with unique names', () => {
  assert.ok(scenarios.length > 0);
  assert.equal(new Set(scenarios.map((s) => s.name)).size, scenarios.length);
});

for (const scenario of scenarios) {
  test(scenario.name, async () => {
    const r = await runInWorkerd(scenario);
    assert.ok(r.ok, `${r.error}\n${(r.log ?? []).join('\n')}\n--- workerd output ---\n${output}`);
  });
}

async function runCells(call, cells) {
  const r = await fetch(`${base}/cells`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ call, cells }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, `HTTP ${r.status}: ${text}`);
  return JSON.parse(text);
}

// The fault matrix (tests/scenarios/faults.json), one test per call.
test('the fault matrix has cells for every call', () => {
  for (const call of faults.calls) {
    assert.ok(faults.cells.some((c) => c[0] === call.name), `no cells for ${call.name}`);
  }
  assert.ok(faults.cells.length > 100, `only ${faults.cells.length} cells`);
});

for (const call of faults.calls) {
  test(`fault matrix: ${call.name}`, async () => {
    const cells = faults.cells.filter((c) => c[0] === call.name);
    const r = await runCells(call, cells);
    assert.equal(r.ran, cells.length);
    assert.ok(r.ok, `${r.failures.length} of ${cells.length} cells failed:\n${r.failures.join('\n')}`);
  });
}

test('a fault-matrix cell expecting a wrong outcome fails in workerd too', async () => {
  const cell = [...faults.cells.find((c) => c[3] === 'none')];
  cell[4] = 'err:failed';
  const r = await runCells(faults.calls.find((c) => c.name === cell[0]), [cell]);
  assert.equal(r.ok, false);
  assert.match(r.failures[0], /outcome/);
});

test('the fault-matrix checks catch an open grant and an undeclared process in workerd too', async () => {
  const open = {
    name: 'open',
    steps: [
      { fault: { op: 'revoke-grant', error: 'failed' } },
      { fault: { op: 'kill-all', error: 'trap' } },
      { call: 'exec', key: 'k', input: { argv: ['background'] } },
      { check: 'fence-closed' },
    ],
  };
  let r = await runInWorkerd(open);
  assert.equal(r.ok, false);
  assert.match(r.error, /grants left open/);
  const undeclared = {
    name: 'undeclared',
    steps: [
      { fault: { op: 'kill-all', error: 'failed' } },
      { fault: { op: 'stop', error: 'failed' } },
      { call: 'exec', key: 'k', input: { argv: ['background'] } },
      { check: 'declared-only' },
    ],
  };
  r = await runInWorkerd(undeclared);
  assert.equal(r.ok, false);
  assert.match(r.error, /undeclared/);
});

test('a scenario expecting a wrong trace fails in workerd too', async () => {
  const s = structuredClone(scenarios.find((x) => x.steps.some((st) => Array.isArray(st.trace) && st.trace.length > 1)));
  const step = s.steps.find((st) => Array.isArray(st.trace) && st.trace.length > 1);
  step.trace = [...step.trace].reverse();
  const r = await runInWorkerd(s);
  assert.equal(r.ok, false, 'a wrong trace must fail');
  assert.match(r.error, /trace/);
});

test('a scenario expecting a wrong outcome fails in workerd too', async () => {
  const s = {
    name: 'wrong stdout',
    steps: [{ call: 'exec', key: 'k', input: { argv: ['echo', 'hello'] }, expect: { ok: { stdout: 'goodbye\n' } } }],
  };
  const r = await runInWorkerd(s);
  assert.equal(r.ok, false);
  assert.match(r.error, /expected/);
});

test('a malformed scenario is refused', async () => {
  const r = await fetch(`${base}/scenario`, { method: 'POST', body: '{not json' });
  assert.equal(r.status, 400);
});

test('the default floor rules match wasmtime.toml', () => {
  const toml = readFileSync(join(root, 'wasmtime.toml'), 'utf8');
  const section = toml.split(/^\[floor\]\s*$/m)[1].split(/^\[/m)[0];
  const body = section.match(/^rules\s*=\s*\[([\s\S]*?)^\]/m)[1].replace(/#.*$/gm, '');
  const rules = JSON.parse(`[${body.trim().replace(/,\s*$/, '')}]`);
  assert.deepEqual(DEFAULT_FLOOR, rules);
});
