// The deployment end to end: two real nodes (`stockade node`, substrate.kind = "mock":
// no root needed; the node's HTTPS, certificate pinning, signing, ownership and run
// streaming are the real ones) and workerd serving edge's generated deploy config
// (the Worker, a Durable Object per key on local disk, the nodes as pinned `external`
// HTTPS services), driven through the Worker's public API (test-support/cluster.mjs).
// test/deploy-linux.test.mjs runs real containers the same way.
//
// The binary is $STOCKADE_EXE or target/debug/stockade (`cargo build -p stockade-host
// --bins`); a missing one fails loudly.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { Cluster, APPROVER, until } from '../test-support/cluster.mjs';
import { order } from '../src/placement.js';
import { signedHeaders } from '../src/sign.js';

let c;
let nodes;
const api = (...a) => c.api(...a);
const nodeCall = (...a) => c.nodeCall(...a);

before(async () => {
  c = await new Cluster({ kind: 'mock', nodes: 2 }).start();
  nodes = c.nodes;
});

after(async () => {
  await c?.stop();
});

test('the API takes the bearer token; approvals take the approver token', async () => {
  assert.equal((await api('POST', '/v1/sandboxes/auth/exec', { argv: ['true'] }, 'wrong')).status, 401);
  const r = await api('POST', '/v1/sandboxes/auth/approvals', { argv: ['reboot'] });
  assert.equal(r.status, 403);
  assert.equal(r.json.error.code, 'approver-only');
  assert.equal((await api('POST', '/v1/sandboxes/..bad/exec', { argv: ['true'] })).status, 400);
});

test("the Worker's consumer token is the operator's: its own scope is every key", async () => {
  const r = await api('GET', '/v1/tokens/self');
  assert.equal(r.status, 200);
  assert.deepEqual(r.json, { keys: '*' });
  assert.equal((await api('GET', '/v1/tokens/self', undefined, 'wrong')).status, 401);
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

test('a named snapshot is saved on its key\'s node; a fork places a new key on that node, whatever its own first choice; deleted, it forks no more', async () => {
  const names = nodes.map((n) => n.name);
  const src = 'snap-src';
  const home = (await order(names, src))[0];
  // A key whose own first choice is the other node.
  let dst;
  for (let i = 0; !dst && i < 100; i++) if ((await order(names, `snap-dst-${i}`))[0] !== home) dst = `snap-dst-${i}`;
  assert.ok(dst);
  const saved = await api('POST', `/v1/sandboxes/${src}/snapshots`, { name: 'v1' });
  assert.equal(saved.status, 200, saved.text);
  assert.equal(saved.json.name, 'v1');
  assert.ok(Number.isSafeInteger(saved.json.at_ms) && saved.json.at_ms > 0, saved.text);
  assert.equal((await api('GET', `/v1/sandboxes/${src}/records`)).json.node, home);
  const list = await api('GET', `/v1/sandboxes/${src}/snapshots`);
  assert.deepEqual(list.json, { snapshots: [{ name: 'v1', at_ms: saved.json.at_ms }] });
  // Bodies as api.rs reads them: unknown fields and missing ones are malformed.
  for (const [path, body] of [
    [`/v1/sandboxes/${src}/snapshots`, { name: 'v1', extra: 1 }],
    [`/v1/sandboxes/${src}/snapshots`, {}],
    [`/v1/sandboxes/${dst}/fork`, { source: src }],
    [`/v1/sandboxes/${dst}/fork`, { source: src, name: 7 }],
  ]) {
    const r = await api('POST', path, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.code, 'malformed-json');
  }
  const bad = await api('POST', `/v1/sandboxes/${src}/snapshots`, { name: '../v1' });
  assert.equal(bad.status, 400, bad.text);
  assert.equal(bad.json.error.code, 'invalid-input');
  const nope = await api('POST', `/v1/sandboxes/${dst}/fork`, { source: src, name: 'nope' });
  assert.equal(nope.status, 404, nope.text);
  assert.equal(nope.json.error.code, 'not-found');
  assert.equal(nope.json.error.message, 'snap-src holds no snapshot named "nope"');
  assert.equal((await api('GET', `/v1/sandboxes/${dst}/records`)).json.node, null, 'a refused fork places nothing');
  const fork = await api('POST', `/v1/sandboxes/${dst}/fork`, { source: src, name: 'v1' });
  assert.equal(fork.status, 200, fork.text);
  assert.deepEqual(fork.json, { forked: dst });
  assert.equal((await api('GET', `/v1/sandboxes/${dst}/records`)).json.node, home, 'the fork placed the key on its source\'s node');
  const ran = await api('POST', `/v1/sandboxes/${dst}/exec`, { argv: ['true'] });
  assert.equal(ran.status, 200, ran.text);
  const owner = nodes.find((n) => n.name === home);
  assert.ok(JSON.parse((await nodeCall(owner, dst, 'current', {})).body).ok, 'its container is there');
  // A key with a container is not forked onto.
  const busy = await api('POST', `/v1/sandboxes/${dst}/fork`, { source: src, name: 'v1' });
  assert.equal(busy.status, 409, busy.text);
  const del = await api('DELETE', `/v1/sandboxes/${src}/snapshots/v1`);
  assert.equal(del.status, 200, del.text);
  assert.deepEqual(del.json, { deleted: 'v1' });
  assert.deepEqual((await api('GET', `/v1/sandboxes/${src}/snapshots`)).json, { snapshots: [] });
  const gone = await api('POST', `/v1/sandboxes/${dst}-2/fork`, { source: src, name: 'v1' });
  assert.equal(gone.status, 404, gone.text);
  assert.equal(gone.json.error.code, 'not-found');
  // The routes' shapes: a name is one segment; another method is a 405.
  assert.equal((await api('DELETE', `/v1/sandboxes/${src}/snapshots/v1/x`)).status, 404);
  assert.equal((await api('GET', `/v1/sandboxes/${dst}/fork`)).status, 405);
  // The source's record is lent only to another key's object, never to a client.
  const r = await fetch(`${c.base}/v1/sandboxes/${src}/snapshot-record?name=v1`, {
    headers: { authorization: 'Bearer edge-test-token', 'x-stockade-internal': 'snapshot-record' },
  });
  assert.equal(r.status, 404, await r.text());
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
  assert.equal(list.json.secrets[0].binding, 'GET api.github.com:443/', 'as api.rs renders a binding');
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
  await c.restartWorkerd();
  const afterRestart = await api('GET', '/v1/sandboxes/persist-key/records');
  assert.deepEqual(afterRestart.json, before.json);
  const st = await api('GET', `/v1/sandboxes/persist-key/detached/${s.json.id}`);
  assert.deepEqual(st.json, { state: 'running' }, st.text);
  await api('DELETE', `/v1/sandboxes/persist-key/detached/${s.json.id}`);
});

test('concurrent calls for one key all complete, through its object\'s queue, on one container', async () => {
  const runs = await Promise.all(
    Array.from({ length: 6 }, (_, i) => api('POST', '/v1/sandboxes/queue-key/exec', { argv: ['echo', `n${i}`] })),
  );
  runs.forEach((r, i) => {
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.stdout, `n${i}\n`);
  });
  // One container for the key, on one node.
  const placed = (await api('GET', '/v1/sandboxes/queue-key/records')).json.node;
  const owner = nodes.find((n) => n.name === placed);
  const cur = JSON.parse((await nodeCall(owner, 'queue-key', 'current', {})).body).ok;
  assert.ok(cur);
});

test('a public request cannot reach the internal on-stop route, nor send an oversized body', async () => {
  const r = await fetch(`${c.base}/v1/sandboxes/int-key/on-stop`, {
    method: 'POST',
    headers: { authorization: 'Bearer edge-test-token', 'x-stockade-internal': 'node-event' },
    body: JSON.stringify({ container: 'x' }),
  });
  assert.equal(r.status, 404, await r.text());
  // The limit is api.rs's default (24 MiB: the guest's largest stdin as base64).
  const big = await api('POST', '/v1/sandboxes/int-key/exec', { argv: ['echo', 'x'.repeat(24 << 20)] });
  assert.equal(big.status, 413, big.text);
  assert.equal(big.json.error.code, 'payload-too-large');
  const fits = await api('POST', '/v1/sandboxes/int-key/exec', { argv: ['true'], stdin: 'x'.repeat(3 << 20) });
  assert.equal(fits.status, 200, fits.text);
});

test('as api.rs: a known route with another method is 405 with Allow; a null field or a bad offset is 400', async () => {
  for (const [method, path, allow] of [
    ['PUT', '/v1/sandboxes/m-key/exec', 'POST'],
    ['PATCH', '/v1/health', 'GET'],
    ['POST', '/v1/sandboxes/m-key/detached/some-id', 'GET, DELETE'],
    ['DELETE', '/v1/sandboxes/m-key/artifacts/a/b', 'GET'],
    ['GET', '/v1/secrets/name', 'PUT, DELETE'],
  ]) {
    const token = path.startsWith('/v1/secrets') ? APPROVER : undefined;
    const r = await fetch(`${c.base}${path}`, { method, headers: { authorization: `Bearer ${token ?? 'edge-test-token'}` } });
    assert.equal(r.status, 405, `${method} ${path}: ${await r.text()}`);
    assert.equal(r.headers.get('allow'), allow, `${method} ${path}`);
  }
  assert.equal((await api('GET', '/v1/sandboxes/m-key/nope')).status, 404);
  for (const body of [
    { argv: ['true'], stdin_base64: null },
    { argv: ['true'], stdin: null },
    { argv: ['true'], cwd: null },
    { argv: ['true'], grant: null },
    { argv: ['true'], grant: { rules: [], ask: 'yes' } },
    { argv: ['true'], grant: { rules: [{ host: 'a.example', intercept: {} }] } },
    { argv: ['true'], grant: { rules: [{ host: 'a.example', methods: null }] } },
    { argv: ['true'], grant: { rules: [{ host: 'a.example', headers: null }] } },
  ]) {
    const r = await api('POST', '/v1/sandboxes/m-key/exec', body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
  }
  // A secret value a node would refuse is refused before any node is asked.
  for (const value of ['a\r\nX-Injected: 1', '', 'x'.repeat(8 * 1024 + 1)]) {
    const r = await api('PUT', '/v1/secrets/bad-value', { value, host: 'api.example.com', methods: ['GET'] }, APPROVER);
    assert.equal(r.status, 400, r.text);
    assert.ok(!r.text.includes('X-Injected'), r.text);
  }
  for (const n of nodes) {
    const r = await nodeCall(n, '', 'remove-secret', { name: 'bad-value' });
    assert.notEqual(JSON.parse(r.body).ok, true, `${n.name} has it: ${r.body}`);
  }
  for (const q of ['offset=null', 'offset=-1', 'offset=1&offset=2', 'length=99999999999', 'offset=1.5']) {
    const r = await api('GET', `/v1/sandboxes/m-key/artifacts/a?${q}`);
    assert.equal(r.status, 400, `${q}: ${r.text}`);
    assert.equal(r.json.error.code, 'invalid-input', q);
  }
});

test('a node call back is verified with that node secret, then on-stop for the signed key', async () => {
  const key = 'callback-key';
  assert.equal((await api('POST', `/v1/sandboxes/${key}/exec`, { argv: ['true'] })).status, 200);
  const placed = (await api('GET', `/v1/sandboxes/${key}/records`)).json.node;
  const node = nodes.find((n) => n.name === placed);
  const container = JSON.parse((await nodeCall(node, key, 'current', {})).body).ok;
  const body = JSON.stringify({ node: node.name, stopped: container });
  let last;
  const send = async (secret, name = node.name, replay = undefined) => {
    const h = replay ?? (await signedHeaders(secret, { method: 'POST', path: '/v1/nodes/events', key, body }));
    last = h;
    const r = await fetch(`${c.base}/v1/nodes/events`, {
      method: 'POST',
      headers: { ...h, 'x-stockade-node': name, 'content-type': 'application/json' },
      body,
    });
    return { status: r.status, text: await r.text() };
  };
  const other = nodes.find((n) => n !== node);
  assert.equal((await send(other.secret)).status, 401, 'signed with another node secret');
  assert.equal((await send(node.secret, 'nobody')).status, 401, 'an unknown node');
  const ok = await send(node.secret);
  assert.equal(ok.status, 200, ok.text);
  assert.equal(typeof JSON.parse(ok.text).stopped, 'number');
  assert.equal((await send(node.secret, node.name, last)).status, 401, 'a replayed call back');
});

test('a grant naming a secret that is not set is 409; an artifact that does not exist is 404', async () => {
  const r = await api('POST', '/v1/sandboxes/sec-key/exec', {
    argv: ['true'],
    grant: { rules: [{ host: 'api.example.com', methods: ['GET'], headers: { authorization: { secret: 'unset-one' } } }] },
  });
  assert.equal(r.status, 409, r.text);
  assert.equal(r.json.error.code, 'secret-not-set');
  assert.equal((await api('POST', '/v1/sandboxes/sec-key/exec', { argv: ['true'] })).status, 200);
  const a = await api('GET', '/v1/sandboxes/sec-key/artifacts/nothing.txt');
  assert.equal(a.status, 404, a.text);
  assert.deepEqual((await api('GET', '/v1/sandboxes/sec-key/artifacts')).json, { artifacts: [] });
});

test("a key's network: PUT …/network is the grant of its commands that bring none, a bad body changes nothing, DELETE takes it away", async () => {
  const k = 'net-key';
  const at = `/v1/sandboxes/${k}`;
  /** A PUT of `text` as it is (JSON or not). */
  const put = async (text) => {
    const r = await fetch(`${c.base}${at}/network`, {
      method: 'PUT',
      headers: { authorization: 'Bearer edge-test-token', 'content-type': 'application/json' },
      body: text,
    });
    const body = await r.text();
    return { status: r.status, text: body, json: JSON.parse(body) };
  };
  const rules = async (grant) =>
    (await api('POST', `${at}/exec`, { argv: ['rules'], ...(grant ? { grant } : {}) })).json.stdout;
  const bad = [
    'not json',
    '[]',
    '{"ask": true}',
    '{"rules": [{"host": "pypi.org"}], "extra": 1}',
    '{"rules": [{"host": "pypi.org", "path_prefix": null}]}',
    '{"rules": [], "ask": "yes"}',
  ];
  // Not known, no network: a command runs under a fence with no rules.
  assert.equal((await api('GET', at)).status, 404);
  assert.equal(await rules(), '0\n');
  for (const body of bad) {
    const r = await put(body);
    assert.equal(r.status, 400, `${body}: ${r.text}`);
    assert.equal(r.json.error.code, 'malformed-json', body);
  }
  // A host the grammar refuses: the guest's 400 invalid-input.
  const refused = await put('{"rules": [{"host": "exa mple.com"}]}');
  assert.equal(refused.status, 400, refused.text);
  assert.equal(refused.json.error.code, 'invalid-input');
  assert.equal((await api('GET', at)).status, 404, 'a refused body made the key known');
  const network = {
    rules: [{ host: 'pypi.org', methods: [] }, { host: '*.pythonhosted.org', methods: ['GET'], path_prefix: '/packages/' }],
    ask: true,
  };
  const set = await put(JSON.stringify(network));
  assert.equal(set.status, 200, set.text);
  assert.deepEqual(set.json, { key: k, running: true, lifetime: null, metadata: {}, network });
  assert.deepEqual((await api('GET', at)).json, set.json);
  assert.deepEqual((await api('GET', '/v1/sandboxes?prefix=net-')).json, { sandboxes: [set.json] });
  // Its commands run under it; a command's own grant goes first, an empty one included.
  assert.equal(await rules(), '2\n');
  assert.equal(await rules({ rules: [{ host: 'example.com' }] }), '1\n');
  assert.equal(await rules({ rules: [] }), '0\n');
  // A bad body, a secret that is not set and a rule outside its secret's binding change nothing.
  for (const body of bad) assert.equal((await put(body)).status, 400, body);
  const credential = (host) =>
    JSON.stringify({ rules: [{ host, methods: ['GET'], headers: { authorization: { secret: 'net-token' } } }] });
  const unset = await put(credential('api.example.com'));
  assert.equal(unset.status, 409, unset.text);
  assert.equal(unset.json.error.code, 'secret-not-set');
  const secret = await api('PUT', '/v1/secrets/net-token', { value: 'v', host: 'api.example.com', methods: ['GET'] }, APPROVER);
  assert.equal(secret.status, 204, secret.text);
  const outside = await put(credential('other.example.com'));
  assert.equal(outside.status, 400, outside.text);
  assert.equal(outside.json.error.code, 'invalid-input');
  assert.match(outside.json.error.message, /^rule 0: secret "net-token"/);
  assert.deepEqual((await api('GET', at)).json.network, network);
  assert.equal(await rules(), '2\n');
  // One within its binding is the key's network.
  const within = await put(credential('api.example.com'));
  assert.equal(within.status, 200, within.text);
  assert.deepEqual(within.json.network, JSON.parse(credential('api.example.com')));
  assert.equal(await rules(), '1\n');
  assert.equal((await api('DELETE', '/v1/secrets/net-token', undefined, APPROVER)).status, 204);
  // DELETE: none again, the key still known; its commands run under no rules.
  const cleared = await api('DELETE', `${at}/network`);
  assert.equal(cleared.status, 200, cleared.text);
  assert.deepEqual(cleared.json, { key: k, running: true, lifetime: null, metadata: {}, network: null });
  assert.equal(await rules(), '0\n');
  const wrong = await api('GET', `${at}/network`);
  assert.equal(wrong.status, 405, wrong.text);
  assert.deepEqual((await api('DELETE', at)).json, { forgotten: k });
  assert.equal((await api('GET', at)).status, 404);
});

test('GET egress: a key never placed has none; a denial on its node is in its timeline', async () => {
  assert.deepEqual((await api('GET', '/v1/sandboxes/egress-none/egress')).json, { egress: [] });
  const e = await api('POST', '/v1/sandboxes/egress-key/exec', {
    argv: ['deny', 'blocked.example'],
    grant: { rules: [{ host: 'allowed.example' }] },
  });
  assert.equal(e.status, 200, e.text);
  assert.equal(e.json.exit_code, 22, e.text);
  const r = await api('GET', '/v1/sandboxes/egress-key/egress');
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.egress.length, 1, r.text);
  const [d] = r.json.egress;
  assert.ok(d.rule_set, r.text);
  assert.deepEqual(d, { decision: 'deny', at_ms: 0, host: 'blocked.example', method: 'GET', path: '/', rule_set: d.rule_set, reason: 'no-rule' });
  // The same record as the node's own answer.
  const placed = (await api('GET', '/v1/sandboxes/egress-key/records')).json.node;
  const node = nodes.find((n) => n.name === placed);
  const own = JSON.parse((await nodeCall(node, 'egress-key', 'denials', {})).body).ok;
  assert.deepEqual(own, [{ at_ms: 0, host: 'blocked.example', method: 'GET', path: '/', rule_set: d.rule_set, reason: 'no-rule' }]);
  assert.deepEqual(JSON.parse((await nodeCall(node, 'egress-key', 'admitted', {})).body).ok, []);
  assert.equal((await api('GET', '/v1/sandboxes/egress-key/egress', undefined, 'wrong')).status, 401);
});

test('a new key whose first node is over capacity goes to the next by score, and stays there', async () => {
  const full = await new Cluster({ kind: 'mock', nodes: 2, ceiling: 1 }).start();
  try {
    const names = full.nodes.map((n) => n.name);
    const keys = [];
    for (let i = 0; keys.length < 2; i++) {
      const k = `cap-${i}`;
      if ((await order(names, k))[0] === names[0]) keys.push(k);
    }
    for (const k of keys) assert.equal((await full.api('POST', `/v1/sandboxes/${k}/exec`, { argv: ['true'] })).status, 200);
    const placed = await Promise.all(keys.map(async (k) => (await full.api('GET', `/v1/sandboxes/${k}/records`)).json.node));
    assert.deepEqual(placed, [names[0], names[1]]);
    // Placed keys stay: the second key's next call goes to its node again.
    assert.equal((await full.api('POST', `/v1/sandboxes/${keys[1]}/exec`, { argv: ['true'] })).status, 200);
    assert.equal((await full.api('GET', `/v1/sandboxes/${keys[1]}/records`)).json.node, names[1]);
  } finally {
    await full.stop();
  }
});

test('a Worker holding a wrong node secret is refused by the node and changes nothing there', async () => {
  const wrong = await new Cluster({ kind: 'mock', nodes: 1, wrongSecrets: true }).start();
  try {
    const r = await wrong.api('POST', '/v1/sandboxes/refused/exec', { argv: ['true'] });
    assert.equal(r.status, 500, r.text);
    assert.equal(r.json.error.code, 'failed');
    assert.match(r.json.error.message, /refused the signature/);
    const cur = await wrong.nodeCall(wrong.nodes[0], 'refused', 'current', {});
    assert.equal(JSON.parse(cur.body).ok, null);
  } finally {
    await wrong.stop();
  }
});

test('a new key skips an unreachable node; a key placed on it is unreachable (502), not moved', async () => {
  const cl = await new Cluster({ kind: 'mock', nodes: 2 }).start();
  try {
    const names = cl.nodes.map((n) => n.name);
    let placedKey;
    for (let i = 0; !placedKey; i++) if ((await order(names, `un-${i}`))[0] === names[0]) placedKey = `un-${i}`;
    let newKey;
    for (let i = 0; !newKey; i++) if ((await order(names, `new-${i}`))[0] === names[0]) newKey = `new-${i}`;
    assert.equal((await cl.api('POST', `/v1/sandboxes/${placedKey}/exec`, { argv: ['true'] })).status, 200);
    await Cluster.kill(cl.nodes[0].child);
    const moved = await cl.api('POST', `/v1/sandboxes/${newKey}/exec`, { argv: ['true'] });
    assert.equal(moved.status, 200, moved.text);
    assert.equal((await cl.api('GET', `/v1/sandboxes/${newKey}/records`)).json.node, names[1]);
    const stuck = await cl.api('POST', `/v1/sandboxes/${placedKey}/exec`, { argv: ['true'] });
    assert.equal(stuck.status, 502, stuck.text);
    assert.equal(stuck.json.error.code, 'unreachable');
    assert.equal((await cl.api('GET', `/v1/sandboxes/${placedKey}/records`)).json.node, names[0]);
    const audit = await cl.api('GET', `/v1/sandboxes/${placedKey}/egress`);
    assert.equal(audit.status, 502, audit.text);
    assert.equal(audit.json.error.code, 'unreachable');
  } finally {
    await cl.stop();
  }
});
