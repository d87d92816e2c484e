// Scoped consumer tokens on the edge (src/scope.js): host/src/tenants/scope.rs's tables
// (patterns, overlap, token shape, share), the `POST /v1/tokens` body, the Book's
// create/list/revoke/verify answers (api/tenants.rs's statuses, codes and messages), its
// share admissions (a held key, a key found with no container forgotten, two
// concurrent calls never both taking the last place), and which token reaches which
// route (api/auth.rs `decide`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Book, ensuring, noSnapshot, Pattern, splitToken, tokenBody, withinShare } from '../src/scope.js';
import { bearerRefusal, envTokens } from '../src/api.js';

test('a pattern is one key or a prefix and nothing else', () => {
  const rows = [
    ['a prefix', 'ci-*', ['prefix', 'ci-']],
    ['one key', 'build-7', ['exact', 'build-7']],
    ["every key is the operator's", '*', 'operator'],
    ['a star inside', 'c*i', 'only end'],
    ['two stars', 'ci-**', 'only end'],
    ['a character no key has', 'ci/*', 'key pattern'],
    ['a leading dot', '.ci*', 'key pattern'],
    ['empty', '', 'key pattern'],
  ];
  for (const [sentence, input, want] of rows) {
    const p = Pattern.parse(input);
    if (Array.isArray(want)) {
      assert.deepEqual([p.pattern?.kind, p.pattern?.body], want, sentence);
      assert.equal(p.pattern.toString(), input, `${sentence}: it prints as written`);
    } else {
      assert.ok(p.error?.includes(want), `${sentence}: ${p.error}`);
    }
  }
  // The messages api.rs answers (seen from `stockade serve`).
  assert.equal(Pattern.parse('ci/*').error, 'key pattern "ci/*": key has a character outside [A-Za-z0-9._-]: \'/\'');
  assert.equal(Pattern.parse('').error, 'key pattern "": key is empty');
  assert.equal(Pattern.parse('c*i').error, 'key pattern "c*i": `*` may only end it (`ci-*`), once');
});

test('a pattern reaches its keys and overlap is any key both reach', () => {
  const p = (s) => Pattern.parse(s).pattern;
  assert.ok(p('ci-*').matches('ci-1'));
  assert.ok(p('ci-*').matches('ci-'), 'the prefix itself is a key it reaches');
  assert.ok(!p('ci-*').matches('cd-1'));
  assert.ok(!p('ci-*').matches('CI-1'), 'keys are case-sensitive');
  assert.ok(p('b').matches('b') && !p('b').matches('bb'));
  const rows = [
    ['nested prefixes', 'ci-*', 'ci-a*', true],
    ['disjoint prefixes', 'ci-*', 'cd-*', false],
    ['a prefix and a key it reaches', 'ci-*', 'ci-7', true],
    ['a prefix and a key it does not', 'ci-*', 'c', false],
    ['one key twice', 'k', 'k', true],
    ['two keys', 'k', 'l', false],
    ["a key that is a longer prefix's start", 'ci', 'ci-*', false],
  ];
  for (const [sentence, a, b, want] of rows) {
    assert.equal(p(a).overlaps(p(b)), want, sentence);
    assert.equal(p(b).overlaps(p(a)), want, `${sentence} (either way)`);
  }
});

test('a token is recognized only in its exact shape', () => {
  const id = '0123456789abcdef';
  const secret = 'a'.repeat(64);
  const good = `stk_${id}_${secret}`;
  assert.deepEqual(splitToken(good), [id, secret]);
  for (const [sentence, t] of [
    ["the operator's token", 'a'.repeat(64)],
    ['no prefix', `${id}_${secret}`],
    ['a short id', `stk_0123_${secret}`],
    ['uppercase', `stk_${id.toUpperCase()}_${secret}`],
    ['a short secret', `stk_${id}_abc`],
    ['a trailing part', `${good}_x`],
    ['empty', ''],
    ['not a string', undefined],
  ]) {
    assert.equal(splitToken(t), undefined, sentence);
  }
});

test('a share admits a held key always and a new one below the ceiling', () => {
  const rows = [
    ['an empty share', 0, false, 1, true],
    ['below', 3, false, 4, true],
    ['at the share, a new key', 4, false, 4, false],
    ['at the share, a key it holds', 4, true, 4, true],
    ['past the share (lowered), a held key', 5, true, 4, true],
  ];
  for (const [sentence, live, held, ceiling, want] of rows) assert.equal(withinShare(live, held, ceiling), want, sentence);
});

test('the routes that may create a container are api/auth.rs ENSURING_ROUTES', () => {
  const yes = [['POST', 'exec'], ['POST', 'exec/stream'], ['POST', 'detached'], ['POST', 'ensure'], ['POST', 'snapshots'],
    ['GET', 'pty'], ['PUT', 'files'], ['PUT', 'files/a/b.txt'], ['POST', 'previews']];
  const no = [['GET', 'snapshots'], ['POST', 'abort'], ['POST', 'checkpoint'], ['POST', 'fork'], ['GET', 'detached/x'],
    ['DELETE', 'previews/8000'], ['GET', 'previews'], ['GET', 'denials'], ['POST', 'exec/streamx']];
  for (const [m, r] of yes) assert.ok(ensuring(m, r), `${m} ${r}`);
  for (const [m, r] of no) assert.ok(!ensuring(m, r), `${m} ${r}`);
});

test("a token body is wire TokenBody's shape", () => {
  assert.deepEqual(tokenBody('{"keys": "ci-*", "ceiling": 4.0, "name": "ci"}'), { keys: 'ci-*', ceiling: 4, name: 'ci' });
  assert.deepEqual(tokenBody('{"keys": "k"}'), { keys: 'k', ceiling: undefined, name: undefined });
  for (const [sentence, text] of [
    ['not JSON', 'nope'],
    ['a list', '[]'],
    ['an unknown field', '{"keys": "k", "x": 1}'],
    ['no keys', '{"ceiling": 1}'],
    ['keys not a string', '{"keys": 5}'],
    ['a fraction', '{"keys": "k", "ceiling": 4.5}'],
    ['negative', '{"keys": "k", "ceiling": -1}'],
    ['a string ceiling', '{"keys": "k", "ceiling": "2"}'],
    ['a null ceiling', '{"keys": "k", "ceiling": null}'],
    ['a null name', '{"keys": "k", "name": null}'],
  ]) {
    assert.equal(typeof tokenBody(text).malformed, 'string', sentence);
  }
});

test('a fork from outside the pattern is refused as names.rs no_snapshot words it', () => {
  assert.equal(noSnapshot('tb-1', 's1'), 'tb-1 holds no snapshot named "s1"');
  assert.equal(noSnapshot('x', 'a"b\n'), 'x holds no snapshot named "a\\"b\\n"');
});

/** A Book over a Map store; `up`: the keys holding a live container. */
function book({ serverCeiling = 16, up = new Set(), failing = new Set(), asked = [] } = {}) {
  const rows = [];
  const keys = new Map();
  const lines = [];
  const store = {
    rows: () => rows.map((r) => ({ ...r })),
    put: (r) => rows.push({ ...r }),
    revoke: (id, ms) => (rows.find((r) => r.id === id).revoked_ms = ms),
    keys: (id) => [...(keys.get(id) ?? [])].sort(),
    note: (id, k) => keys.set(id, (keys.get(id) ?? new Set()).add(k)),
    forget: (id, k) => keys.get(id)?.delete(k),
  };
  let t = 1000;
  const b = new Book({
    store,
    serverCeiling,
    now: () => t++,
    live: async (k) => {
      asked.push(k);
      await new Promise((r) => setTimeout(r, 5));
      if (failing.has(k)) throw new Error('unreachable');
      return up.has(k);
    },
    log: (level, event, fields, target) => lines.push([target, event, Object.fromEntries(fields)]),
  });
  return { b, store, keys, lines, up, rows };
}

test('tokens are made, listed, verified and revoked as api/tenants.rs answers', async () => {
  const { b, lines, rows } = book();
  const made = (await b.create('{"keys": "ci-*", "ceiling": 4, "name": "ci"}')).created;
  assert.match(made.token, /^stk_[0-9a-f]{16}_[0-9a-f]{64}$/);
  assert.deepEqual(Object.keys(made), ['token', 'id', 'name', 'keys', 'ceiling', 'created_ms']);
  assert.equal(made.token.slice(4, 20), made.id);
  assert.deepEqual([made.keys, made.ceiling, made.name], ['ci-*', 4, 'ci']);
  // Only the secret's digest is kept.
  assert.ok(!JSON.stringify(rows).includes(made.token.slice(21)));
  assert.equal(rows[0].digest.length, 64);
  assert.deepEqual(await b.verify(made.token), { id: made.id, keys: 'ci-*', ceiling: 4 });
  // The last hex digit changed (it was the same token when that digit was already 0
  // and the one before it was not: about one run in seventeen).
  const flipped = made.token.slice(0, -1) + (made.token.endsWith('0') ? '1' : '0');
  assert.notEqual(flipped, made.token);
  assert.equal(await b.verify(flipped), null, 'another secret');
  assert.equal(await b.verify(`stk_${'0'.repeat(16)}_${made.token.slice(21)}`), null, 'another id');
  const refusals = [
    ['{"keys": "ci-a*"}', [409, 'keys-overlap', `keys ci-a* overlap the live token ${made.id} (ci-*): two tokens never reach one key`]],
    ['{"keys": "ci-7"}', [409, 'keys-overlap', `keys ci-7 overlap the live token ${made.id} (ci-*): two tokens never reach one key`]],
    ['{"keys": "*"}', [400, 'invalid-input', 'key pattern "*" reaches every key: that is the operator\'s token; give a prefix (`ci-*`)']],
    ['{"keys": "b", "ceiling": 0}', [400, 'invalid-input', 'ceiling 0: a share is at least 1 live container']],
    ['{"keys": "b", "ceiling": 99999999999}', [400, 'invalid-input', 'ceiling 99999999999: past 4294967295']],
    ['{"keys": "b", "name": ""}', [400, 'invalid-input', 'name: 1 to 64 characters, none a control character']],
    ['{"keys": "b", "name": "a\\u0007"}', [400, 'invalid-input', 'name: 1 to 64 characters, none a control character']],
  ];
  for (const [text, want] of refusals) assert.deepEqual((await b.create(text)).error, want, text);
  assert.equal((await b.create('{"keys": "x", "x": 1}')).error[1], 'malformed-json');
  // Above the server's ceiling: the server's; none: the whole of it; the name: the pattern.
  const big = (await b.create('{"keys": "b", "ceiling": 100}')).created;
  assert.deepEqual([big.ceiling, big.name], [16, 'b']);
  assert.equal((await b.create('{"keys": "c"}')).created.ceiling, 16);
  assert.deepEqual(b.list().tokens.map((t) => t.keys), ['ci-*', 'b', 'c']);
  // Revoked: a wrong token from now on, listed with its time; its keys may be taken again.
  assert.deepEqual(b.revoke(made.id), { revoked: { revoked: made.id } });
  assert.equal(await b.verify(made.token), null);
  assert.deepEqual(b.revoke(made.id).error, [404, 'not-found', 'no live token with that id']);
  assert.ok(typeof b.list().tokens[0].revoked_ms === 'number');
  assert.ok((await b.create('{"keys": "ci-7"}')).created);
  // Logged once per decision.
  assert.deepEqual(
    lines.map(([target, event]) => `${target} ${event}`),
    ['stockade::tenants token created', 'stockade::tenants token created', 'stockade::tenants token created',
      'stockade::tenants token revoked', 'stockade::tenants token created'],
  );
  // A new Book on the same store (the object restarted) holds the same live tokens.
  const again = new Book({ store: { ...book().store, rows: () => rows }, serverCeiling: 16, live: async () => false });
  assert.equal(again.live.size, 3);
});

test('a share counts the keys with a container, holds a place until released, forgets a key with none', async () => {
  const asked = [];
  const { b, keys, lines, up } = book({ asked });
  const { id } = (await b.create('{"keys": "ta-*", "ceiling": 1}')).created;
  const first = await b.admit(id, 'ta-1');
  assert.ok(first.hold);
  // Held (its container not live yet): a second key is over the share; the same key is not.
  const over = await b.admit(id, 'ta-2');
  assert.deepEqual(over.error, [429, 'over-capacity', `token ${id} holds its share of the ceiling (1 live containers)`]);
  assert.ok((await b.admit(id, 'ta-1')).hold, 'a key it holds is always admitted');
  assert.ok(lines.some(([t, e, f]) => t === 'stockade::tenants' && e === 'over its share' && f.key === 'ta-2'));
  // Released with its container live: still counted (the node says so).
  up.add('ta-1');
  b.holds.clear();
  assert.equal((await b.admit(id, 'ta-2')).error?.[0], 429);
  assert.ok(asked.includes('ta-1'), 'the live keys are asked of their objects');
  // Its container gone: the key is forgotten as it is counted, and the place is free.
  up.delete('ta-1');
  b.holds.clear();
  assert.ok((await b.admit(id, 'ta-2')).hold);
  assert.deepEqual([...keys.get(id)], ['ta-2'], 'ta-1 forgotten, ta-2 noted');
  // A key whose object cannot be asked counts as live (never overcommitted).
  b.holds.clear();
  const f = book({ failing: new Set(['tf-1']) });
  const t2 = (await f.b.create('{"keys": "tf-*", "ceiling": 1}')).created.id;
  f.b.release((await f.b.admit(t2, 'tf-1')).hold);
  assert.equal((await f.b.admit(t2, 'tf-2')).error?.[0], 429);
  // A revoked tenant's admission is a wrong token.
  b.revoke(id);
  assert.equal((await b.admit(id, 'ta-3')).error?.[0], 401);
});

test('two concurrent calls never both take the last place', async () => {
  const { b } = book();
  const { id } = (await b.create('{"keys": "tc-*", "ceiling": 2}')).created;
  assert.ok((await b.admit(id, 'tc-0')).hold);
  const all = await Promise.all(['tc-1', 'tc-2', 'tc-3', 'tc-4'].map((k) => b.admit(id, k)));
  assert.equal(all.filter((a) => a.hold).length, 1, JSON.stringify(all));
  assert.equal(all.filter((a) => a.error?.[0] === 429).length, 3);
  // Another tenant's admissions are its own.
  const other = (await b.create('{"keys": "td-*", "ceiling": 1}')).created.id;
  assert.ok((await b.admit(other, 'td-1')).hold);
});

test('which token reaches which route (api/auth.rs decide)', () => {
  const tokens = envTokens({ API_TOKEN: 'operator', APPROVER_TOKEN: 'approver' });
  const tenant = { id: '0123456789abcdef', keys: 'ci-*', ceiling: 2 };
  const t = 'Bearer stk_x';
  const rows = [
    ['a tenant runs commands', '/v1/sandboxes/ci-1/exec', t, tenant, null],
    ['a tenant lists its pending decisions', '/v1/egress/pending', t, tenant, null],
    ['a tenant learns its scope', '/v1/tokens/self', t, tenant, null],
    ['a tenant may not approve', '/v1/sandboxes/ci-1/approvals', t, tenant, [403, 'approver-only']],
    ['nor answer a pending decision', '/v1/egress/pending/abc', t, tenant, [403, 'approver-only']],
    ['nor set a secret', '/v1/secrets/x', t, tenant, [403, 'approver-only']],
    ['nor make tokens', '/v1/tokens', t, tenant, [403, 'operator-only']],
    ['nor revoke one', '/v1/tokens/0123456789abcdef', t, tenant, [403, 'operator-only']],
    ['the operator makes tokens', '/v1/tokens', 'Bearer operator', null, null],
    ['the operator revokes one', '/v1/tokens/0123456789abcdef', 'Bearer operator', null, null],
    ['the approver may not', '/v1/tokens', 'Bearer approver', null, [401, 'unauthorized']],
    ['the operator may not approve', '/v1/secrets', 'Bearer operator', null, [403, 'approver-only']],
    ['a wrong or revoked token', '/v1/sandboxes/ci-1/exec', t, null, [401, 'unauthorized']],
    ['nor on the tokens routes', '/v1/tokens', t, null, [401, 'unauthorized']],
  ];
  for (const [sentence, path, auth, who, want] of rows) {
    assert.deepEqual(bearerRefusal(path, auth, tokens, who)?.slice(0, 2) ?? null, want, sentence);
  }
});
