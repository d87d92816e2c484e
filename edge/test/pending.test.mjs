// The Worker's pending egress decisions (src/pending.js): the nodes' answers
// read as host/remote/src/lib.rs `answered` reads them, the lists as one,
// and the routes' input checks (pure; the nodes are stand-ins answering `call`).

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { answered, answerPending, decision, listPending, pendingQuery, union } from '../src/pending.js';
import { substrateError } from '../src/nodes.js';

const held = (id, at, key = 'k') => ({
  id,
  key,
  fence: 'f',
  method: 'GET',
  host: 'h',
  port: 80,
  path: '/',
  reason: 'no-rule',
  at_ms: at,
  expires_ms: at + 1,
  widens: 'GET h:80/',
});

test('one answer is read from every node as the Rust front reads it', () => {
  const down = { err: substrateError('unreachable', 'node-2') };
  const p = held('i', 1);
  // [row, the nodes' answers, the front's]
  const rows = [
    ['answered on one node', [{ ok: 'not-found' }, { ok: { answered: p } }], { answered: p }],
    ['answered on one, another down', [down, { ok: { answered: p } }], { answered: p }],
    ['decided on one', [{ ok: { 'already-decided': 'timed-out' } }, { ok: 'not-found' }], { decided: 'timed-out' }],
    ['decided on one, another down', [down, { ok: { 'already-decided': 'approved' } }], { decided: 'approved' }],
    ['unknown everywhere', [{ ok: 'not-found' }, { ok: 'not-found' }], { unknown: true }],
    ['unknown where asked, a node down: it may be there', [{ ok: 'not-found' }, down], { error: down.err }],
    ['no node to ask', [], { unknown: true }],
  ];
  for (const [row, answers, want] of rows) assert.deepEqual(answered(answers), want, row);
});

test('the nodes lists are one, oldest first, each decision field by field', () => {
  const a = held('b', 5);
  const b = { ...held('a', 5), extra: 'dropped' };
  const c = held('z', 1);
  assert.deepEqual(
    union([[a], [b, c]]).map((p) => p.id),
    ['z', 'a', 'b'],
  );
  assert.deepEqual(Object.keys(decision(b)), Object.keys(held('x', 0)), 'no other field passes');
  assert.equal(decision({ port: -1 }).port, 0);
});

test('the list query takes one key and nothing else', () => {
  assert.deepEqual(pendingQuery(new URLSearchParams('')), { key: undefined });
  assert.deepEqual(pendingQuery(new URLSearchParams('key=k1')), { key: 'k1' });
  for (const bad of ['other=1', 'key=a&key=b']) {
    assert.equal(pendingQuery(new URLSearchParams(bad)).refused?.status, 400, bad);
  }
});

/** A node stand-in: `answers(call, key, body)` is its answer; every call recorded. */
function stand(name, answers) {
  const calls = [];
  return {
    name,
    calls,
    async call(key, call, body) {
      calls.push({ key, call, body });
      return answers(call, key, body);
    },
  };
}

test('a key lists what its node holds, keyed; a node down fails the list (502)', async () => {
  const n1 = stand('n1', (_c, key) => (key === 'k' ? [held('i1', 2)] : [held('i1', 2), held('i2', 1, 'o')]));
  const n2 = stand('n2', () => []);
  const r = await listPending([n1, n2], 'k');
  assert.equal(r.status, 200);
  assert.deepEqual((await r.json()).pending.map((p) => p.id), ['i1']);
  assert.deepEqual(n1.calls[0], { key: 'k', call: 'pending', body: {} });
  const all = await listPending([n1, n2], undefined);
  assert.deepEqual((await all.json()).pending.map((p) => p.id), ['i2', 'i1']);
  assert.equal(n1.calls[1].key, '', 'node-wide');
  const down = stand('n3', () => {
    throw substrateError('unreachable', 'gone');
  });
  const r3 = await listPending([n1, down], undefined);
  assert.equal(r3.status, 502);
  assert.equal((await r3.json()).error.code, 'unreachable');
  assert.equal((await listPending([n1], '..bad')).status, 400);
});

test('an answer: bad bodies 400, a non-UUID 404 without asking, then 200, 409 or 404', async () => {
  const id = '6f1c1d9e-3a57-4c3e-9d1e-2b7a0c4f5e6d';
  let state = 'held';
  const n1 = stand('n1', (_c, _k, body) => {
    if (body.id !== id) return 'not-found';
    if (state === 'held') {
      state = 'approved';
      return { answered: held(id, 1) };
    }
    return { 'already-decided': state };
  });
  const n2 = stand('n2', () => 'not-found');
  const nodes = [n1, n2];
  for (const [body, code] of [
    ['not json', 'malformed-json'],
    ['[]', 'malformed-json'],
    ['{"decision":"maybe"}', 'malformed-json'],
    ['{"decision":"approve","x":1}', 'malformed-json'],
  ]) {
    const r = await answerPending(nodes, id, body);
    assert.equal(r.status, 400, body);
    assert.equal((await r.json()).error.code, code, body);
  }
  const r404 = await answerPending(nodes, 'not-a-uuid', '{"decision":"approve"}');
  assert.equal(r404.status, 404);
  assert.equal(n1.calls.length + n2.calls.length, 0, 'nothing asked');
  const ok = await answerPending(nodes, id, '{"decision":"approve"}');
  assert.equal(ok.status, 200);
  assert.deepEqual(await ok.json(), { pending: held(id, 1), decision: 'approve' });
  assert.deepEqual(n2.calls[0], { key: '', call: 'answer-pending', body: { id, decision: 'approve' } });
  const again = await answerPending(nodes, id, '{"decision":"refuse"}');
  assert.equal(again.status, 409);
  assert.equal((await again.json()).error.code, 'already-decided');
  const never = await answerPending(nodes, '00000000-0000-4000-8000-000000000000', '{"decision":"refuse"}');
  assert.equal(never.status, 404);
});
