// A batch's semantics, the edge's copy (src/batch.js: BatchPlan, batchInOrder) run
// against the rows of tests/scenarios/batch.json, the same table the Rust plan's test
// reads (host/runtime/src/substrate/batch.rs); and the settle both edge hosts share
// (src/settle.js).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { BatchPlan, batchInOrder, closedMeanwhile } from '../src/batch.js';
import { settle } from '../src/settle.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const table = JSON.parse(readFileSync(join(root, 'tests', 'scenarios', 'batch.json'), 'utf8'));

const KEYED = new Set(['ensure', 'current', 'denials', 'list-artifacts', 'read-artifact']);
const ON_CONTAINER = new Set(['kill-all', 'revoke-grant', 'list-processes', 'snapshot', 'stop', 'list-previews']);

/** A table call (`NAME ARG`, `@` the ensured placeholder) as the WIT call jco hands over. */
function witCall(s) {
  const [tag, arg] = s.split(' ');
  const target = arg === '@' ? { tag: 'ensured' } : { tag: 'container', val: arg };
  if (KEYED.has(tag)) return { tag, val: arg };
  if (ON_CONTAINER.has(tag)) return { tag, val: target };
  return { tag, val: { container: target, grant: { rules: [], ask: false }, cmd: { argv: ['true'] }, timeoutMs: 1000n, id: 'p', port: 8000 } };
}

/** A table answer (`ok`, `ok CONTAINER`, `err KIND`) as the call's WIT answer. */
function witAnswer(tag, s) {
  const [what, val] = s.split(' ');
  if (what === 'err') return { tag: 'err', val: { tag: val, val: 'scripted' } };
  return { tag: 'ok', val: { tag, val } };
}

const shown = (a) => (a.tag === 'err' ? `err ${a.val.tag}` : a.val.val === undefined ? 'ok' : `ok ${a.val.val}`);

test('every row of the batch table, against the edge plan', () => {
  assert.ok(table.rows.length >= 10);
  for (const row of table.rows) {
    const calls = row.calls.map(witCall);
    let plan;
    try {
      plan = new BatchPlan(calls);
    } catch (e) {
      assert.equal(row.refused, e.tag, row.what);
      continue;
    }
    assert.equal(row.refused, undefined, row.what);
    const script = [...row.answers];
    const grants = new Map();
    let numbers = 0;
    const made = [];
    for (let next = plan.next(); next; next = plan.next()) {
      if (row.closed_before === next.index) {
        numbers += 1;
        for (const c of grants.keys()) grants.set(c, 100 + numbers);
      }
      const c = calls[next.index];
      if (next.whileOpen && grants.get(next.container) !== next.whileOpen.grant) {
        plan.answer({ tag: 'err', val: closedMeanwhile(next.container) });
        continue;
      }
      made.push(next.container === undefined ? row.calls[next.index] : `${c.tag} ${next.container}`);
      assert.ok(script.length, `${row.what}: no scripted answer for ${c.tag}`);
      const a = witAnswer(c.tag, script.shift());
      if (c.tag === 'apply-grant') {
        if (a.tag === 'ok') grants.set(next.container, (numbers += 1));
        plan.answerOpened(a, grants.get(next.container));
      } else {
        if (c.tag === 'revoke-grant' && a.tag === 'ok') grants.delete(next.container);
        plan.answer(a);
      }
    }
    assert.ok(plan.done, row.what);
    assert.deepEqual(made, row.made, `${row.what}: the calls made`);
    assert.deepEqual(plan.answers.map(shown), row.result, `${row.what}: the answers`);
  }
});

/** An import object that answers from a row's script and records what it was asked. */
function scripted(row, made, later) {
  const script = [...(row.answers ?? [])];
  const answer = (tag, arg) => {
    made.push(`${tag} ${arg}`);
    const a = witAnswer(tag, script.shift());
    if (later) return a.tag === 'err' ? Promise.reject(a.val) : Promise.resolve(a.val.val);
    if (a.tag === 'err') throw a.val;
    return a.val.val;
  };
  const key = (tag) => (k) => answer(tag, k);
  return {
    ensure: key('ensure'),
    current: key('current'),
    denials: key('denials'),
    listArtifacts: key('list-artifacts'),
    applyGrant: (c) => answer('apply-grant', c),
    run: (c) => answer('run', c),
    killAll: (c) => answer('kill-all', c),
    revokeGrant: (c) => answer('revoke-grant', c),
    startProcess: (c) => answer('start-process', c),
    listProcesses: (c) => answer('list-processes', c),
    stop: (c) => answer('stop', c),
  };
}

test('every row of the batch table, through batchInOrder, sync and async (the rows a driver that cannot be raced shares)', async () => {
  for (const later of [false, true]) {
    for (const row of table.rows.filter((r) => !r.guard)) {
      const calls = row.calls.map(witCall);
      const made = [];
      let answers;
      try {
        answers = await batchInOrder(scripted(row, made, later), calls);
      } catch (e) {
        assert.equal(row.refused, e.tag, row.what);
        assert.deepEqual(made, [], `${row.what}: refused whole, nothing made`);
        continue;
      }
      assert.deepEqual(made, row.made, `${row.what}: the calls made`);
      assert.deepEqual(answers.map(shown), row.result, `${row.what}: the answers`);
    }
  }
});

/** A substrate recording the settle's calls, failing those named in `fails`. */
function recorder(fails = new Set(), current = new Map()) {
  const calls = [];
  const rec = (name) => async (...args) => {
    calls.push([name, ...args]);
    if (fails.has(name)) throw { tag: 'failed', val: name };
    return name === 'current' ? current.get(args[0]) : 0;
  };
  return { calls, substrate: { killProcess: rec('killProcess'), killAll: rec('killAll'), revokeGrant: rec('revokeGrant'), current: rec('current') } };
}

test('the settle: a fence left open is torn down, then revoked; a failed apply only revoked', async () => {
  const { calls, substrate } = recorder();
  const logs = [];
  const ctx = { openFences: [['c1', 'applied'], ['c2', 'apply-failed']], started: [['c1', 'p1']] };
  await settle(substrate, ctx, { trapped: false, log: (...l) => logs.push(l) });
  assert.deepEqual(calls, [['killAll', 'c1'], ['revokeGrant', 'c1'], ['revokeGrant', 'c2']], 'a started process is killed only after a trap');
  assert.deepEqual(ctx.openFences, []);
  assert.deepEqual(logs.map(([level, event]) => [level, event]), [
    ['warn', 'host tore down and revoked a fence the call left open'],
    ['info', 'a failed apply opened nothing: revoked, nothing killed'],
  ]);
});

test('the settle after a trap: what the call started is killed first; a failed kill still revokes', async () => {
  const { calls, substrate } = recorder(new Set(['killAll']));
  const logs = [];
  const ctx = { openFences: [['c1', 'applied']], started: [['c1', 'p1']] };
  await settle(substrate, ctx, { trapped: true, log: (...l) => logs.push(l) });
  assert.deepEqual(calls, [['killProcess', 'c1', 'p1'], ['killAll', 'c1'], ['revokeGrant', 'c1']]);
  assert.deepEqual(logs[1][2], [['container', 'c1'], ['killed_all', 'false'], ['revoked', 'true']]);
});

test('the settle finds an unanswered batch\'s container through current; none: nothing to close', async () => {
  const { calls, substrate } = recorder(new Set(), new Map([['k', 'c9']]));
  const ctx = { openFences: [], started: [], unresolvedKeys: ['k', 'gone'] };
  await settle(substrate, ctx, { trapped: true, log: () => {} });
  assert.deepEqual(calls, [['current', 'k'], ['current', 'gone'], ['killAll', 'c9'], ['revokeGrant', 'c9']]);
  assert.deepEqual(ctx.unresolvedKeys, []);
  // A synchronous substrate (the mock's) is settled the same.
  const sync = [];
  const s = { killAll: (c) => sync.push(['killAll', c]), revokeGrant: (c) => { sync.push(['revokeGrant', c]); throw { tag: 'failed', val: 'x' }; } };
  const logs = [];
  await settle(s, { openFences: [['c1', 'applied']], started: [] }, { trapped: false, log: (...l) => logs.push(l) });
  assert.deepEqual(sync, [['killAll', 'c1'], ['revokeGrant', 'c1']]);
  assert.deepEqual(logs[0][2], [['container', 'c1'], ['killed_all', 'true'], ['revoked', 'false']]);
});
