// A key's lifetime, metadata, network and listing on the edge (src/lifetime.js, a
// network's body in src/api.js): the bodies and the query read as
// host/src/api/sandboxes.rs reads them (the statuses, codes and messages `stockade
// serve` answered, but serde's " at line L column C"; a network's body with the
// messages an exec's grant has on the edge), a scoped token's listing narrowed as
// scope.rs `Pattern::listing` (its table), the answers' JSON as wire `SandboxInfo`
// serializes it.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bounded, grantJson, infoJson, lifetimeBody, listing, listQuery, MAX_WHOLE_MS, metadataBody } from '../src/lifetime.js';
import { BadRequest, execInput, grantBody } from '../src/api.js';
import { Pattern } from '../src/scope.js';

/** [status, code, message] of what `fn` throws. */
function refusal(fn) {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof BadRequest, String(e));
    return [e.status, e.code, e.message];
  }
  assert.fail('accepted');
}

test('a lifetime body is exactly one instant up to 2^53 - 1, on_end abort by default', () => {
  const now = 1_000;
  assert.deepEqual(lifetimeBody('{"ends_in_ms": 500}', now), { endsAtMs: 1_500n, onEnd: 'abort' });
  assert.deepEqual(lifetimeBody('{"ends_at_ms": 7, "on_end": "checkpoint"}', now), { endsAtMs: 7n, onEnd: 'checkpoint' });
  // `null` is absent (serde's Option), as `stockade serve` answered.
  assert.deepEqual(lifetimeBody('{"on_end": null, "ends_in_ms": 5}', now), { endsAtMs: 1_005n, onEnd: 'abort' });
  assert.deepEqual(lifetimeBody(`{"ends_at_ms": ${MAX_WHOLE_MS}}`, now).endsAtMs, MAX_WHOLE_MS);
  assert.deepEqual(lifetimeBody('{"ends_in_ms": 1000.0}', now).endsAtMs, 2_000n);
  const exactlyOne = [400, 'invalid-input', 'give exactly one of ends_at_ms and ends_in_ms'];
  const rows = [
    ['{"ends_in_ms": 1, "ends_at_ms": 1}', exactlyOne],
    ['{}', exactlyOne],
    ['[]', exactlyOne],
    ['{"ends_in_ms": null}', exactlyOne],
    [`{"ends_in_ms": ${MAX_WHOLE_MS + 1n}}`, [400, 'malformed-json', `${MAX_WHOLE_MS + 1n} is more than ${MAX_WHOLE_MS}`]],
    ['{"on_end": "pause", "ends_in_ms": 1}', [400, 'malformed-json', 'unknown variant `pause`, expected `abort` or `checkpoint`']],
    ['{"ends_in_ms": 1, "extra": 1}', [400, 'malformed-json', 'unknown field `extra`, expected one of `ends_at_ms`, `ends_in_ms`, `on_end`']],
    ['{"ends_in_ms": -1}', [400, 'malformed-json', '-1 is not a non-negative whole number']],
    ['{"ends_in_ms": 1.5}', [400, 'malformed-json', '1.5 is not a non-negative whole number']],
    ['{"ends_in_ms": "5"}', [400, 'malformed-json', 'invalid type: string "5", expected a non-negative whole number']],
    ['5', [400, 'malformed-json', 'invalid type: integer `5`, expected struct LifetimeBody']],
  ];
  for (const [body, want] of rows) assert.deepEqual(refusal(() => lifetimeBody(body, now)), want, body);
  // (A number past 2^53 needs its source text to be read exactly, which workerd's
  // JSON.parse gives and node 20's does not: the e2e run checks them on the Worker.)
  for (const body of ['not json', '', '{"ends_in_ms": 18446744073709551617}']) {
    assert.deepEqual(refusal(() => lifetimeBody(body, now)).slice(0, 2), [400, 'malformed-json'], body);
  }
});

test('a metadata body is a map of strings, by name, the last of a name given twice', () => {
  assert.deepEqual(metadataBody('{"metadata": {"team": "ci", "run": "7"}}'), [['run', '7'], ['team', 'ci']]);
  assert.deepEqual(metadataBody('{"metadata": {"a": "1", "a": "2"}}'), [['a', '2']]);
  assert.deepEqual(metadataBody('{"metadata": {}}'), []);
  // Names are not checked here: the guest refuses `""` (invalid-input).
  assert.deepEqual(metadataBody('{"metadata": {"": "x"}}'), [['', 'x']]);
  const rows = [
    ['{"metadata": {"a": 1}}', 'invalid type: integer `1`, expected a string'],
    ['{"metadata": null}', 'invalid type: null, expected a map'],
    ['{"metadata": []}', 'invalid type: sequence, expected a map'],
    ['{}', 'missing field `metadata`'],
    ['{"metadata": {}, "x": 1}', 'unknown field `x`, expected `metadata`'],
  ];
  for (const [body, message] of rows) assert.deepEqual(refusal(() => metadataBody(body)), [400, 'malformed-json', message], body);
  assert.deepEqual(refusal(() => metadataBody('not json')).slice(0, 2), [400, 'malformed-json']);
});

test("a network body is a grant as an exec's, read the same; any other shape is 400 malformed-json", () => {
  const text = JSON.stringify({
    rules: [
      { host: 'pypi.org' },
      { host: 'api.example.com', methods: ['GET'], path_prefix: '/v1/', headers: { 'X-Key': { secret: 'k' }, Authorization: { secret: 'tok' } } },
      { host: 'pinned.example', intercept: false },
    ],
    ask: true,
  });
  const want = {
    rules: [
      { host: 'pypi.org', methods: [], pathPrefix: undefined, headers: [], intercept: true },
      {
        host: 'api.example.com',
        methods: ['GET'],
        pathPrefix: '/v1/',
        headers: [
          { name: 'Authorization', secret: 'tok' },
          { name: 'X-Key', secret: 'k' },
        ],
        intercept: true,
      },
      { host: 'pinned.example', methods: [], pathPrefix: undefined, headers: [], intercept: false },
    ],
    ask: true,
  };
  assert.deepEqual(grantBody(text), want);
  // The same grant an exec body's `grant` reads to.
  assert.deepEqual(execInput(`{"argv": ["rules"], "grant": ${text}}`).grant, want);
  assert.deepEqual(grantBody('{"rules": []}'), { rules: [], ask: false });
  // Hosts are not checked here: the guest refuses `exa mple.com` (invalid-input).
  assert.deepEqual(grantBody('{"rules": [{"host": "exa mple.com"}]}').rules[0].host, 'exa mple.com');
  const rows = [
    ['not json', undefined],
    ['', undefined],
    ['[]', 'the body must be a JSON object'],
    ['null', 'the body must be a JSON object'],
    ['{}', 'body.rules: expected a list'],
    ['{"ask": true}', 'body.rules: expected a list'],
    ['{"rules": null}', 'body.rules: expected a list'],
    ['{"rules": [], "ask": "yes"}', 'body.ask: expected a boolean'],
    ['{"rules": [], "ask": null}', 'body.ask: expected a boolean'],
    ['{"rules": [], "extra": 1}', 'body: unknown field `extra`'],
    ['{"rules": ["pypi.org"]}', 'body.rules[0]: expected an object'],
    ['{"rules": [{"host": "a.example", "port": 1}]}', 'body.rules[0]: unknown field `port`'],
    ['{"rules": [{"methods": []}]}', 'body.rules[0].host: expected a string'],
    ['{"rules": [{"host": "a.example", "path_prefix": null}]}', 'path_prefix: expected a string'],
    ['{"rules": [{"host": "a.example", "methods": null}]}', 'body.rules[0].methods: expected a list of strings'],
    ['{"rules": [{"host": "a.example", "headers": null}]}', 'body.rules[0].headers: expected an object'],
    ['{"rules": [{"host": "a.example", "intercept": {}}]}', 'body.rules[0].intercept: expected a boolean'],
    ['{"rules": [{"host": "a.example", "headers": {"A": "s"}}]}', 'headers.A: expected {"secret": NAME}'],
  ];
  for (const [body, message] of rows) {
    const got = refusal(() => grantBody(body));
    assert.deepEqual(message === undefined ? got.slice(0, 2) : got, [400, 'malformed-json', ...(message === undefined ? [] : [message])], body);
  }
});

test('the listing query is prefix alone, form-decoded, the last one given', () => {
  assert.equal(listQuery(''), '');
  assert.equal(listQuery('&'), '');
  assert.equal(listQuery('prefix'), '');
  assert.equal(listQuery('prefix=pk-'), 'pk-');
  assert.equal(listQuery('prefix=a&prefix=pk'), 'pk');
  assert.equal(listQuery('prefix=p%6b'), 'pk');
  assert.equal(listQuery('prefix=p+k'), 'p k'); // the guest then refuses it as a key's start
  assert.deepEqual(refusal(() => listQuery('order=1')), [400, 'invalid-input', '"order" is not a parameter of this list']);
  assert.deepEqual(refusal(() => listQuery('prefix=%zz')), [400, 'invalid-input', '"%zz": a % escape that is not two hex digits']);
  assert.deepEqual(refusal(() => listQuery('prefix=%ff')), [400, 'invalid-input', '"%ff" is not UTF-8 once decoded']);
});

test("a scoped token's listing reaches only its pattern's keys (scope.rs's table)", () => {
  const p = Pattern.parse('ci-*').pattern;
  const k = Pattern.parse('build-7').pattern;
  const rows = [
    [p, '', { prefix: 'ci-' }],
    [p, 'c', { prefix: 'ci-' }],
    [p, 'ci-7', { prefix: 'ci-7' }],
    [p, 'cd', { nothing: true }],
    [k, '', { one: 'build-7' }],
    [k, 'build', { one: 'build-7' }],
    [k, 'build-77', { nothing: true }],
    [k, 'ci-', { nothing: true }],
    [undefined, 'x', { prefix: 'x' }],
    [undefined, '', { prefix: '' }],
  ];
  for (const [pattern, wanted, want] of rows) assert.deepEqual(listing(pattern, wanted), want, `${pattern} ${wanted}`);
});

test('an info is the wire JSON: metadata by name in byte order, a u64 end, null without a lifetime or a network', () => {
  const i = {
    key: 'k',
    running: true,
    lifetime: { endsAtMs: 18446744073709551615n, onEnd: 'checkpoint' },
    metadata: [['9', 'b'], ['10', 'a'], ['é', '"q"']],
  };
  assert.equal(
    infoJson(i),
    '{"key":"k","running":true,"lifetime":{"ends_at_ms":18446744073709551615,"on_end":"checkpoint"},"metadata":{"10":"a","9":"b","é":"\\"q\\""},"network":null}',
  );
  assert.equal(
    infoJson({ key: 'k', running: false, metadata: [] }),
    '{"key":"k","running":false,"lifetime":null,"metadata":{},"network":null}',
  );
});

test("a network is the wire JSON of a grant: a rule as grammar's json.rs writes it, ask only when true", () => {
  const network = {
    rules: [
      { host: 'pypi.org', methods: [], pathPrefix: undefined, headers: [], intercept: true },
      {
        host: 'api.example.com',
        methods: ['GET', 'POST'],
        pathPrefix: '/v1/',
        // In the grant's order; a name like an integer stays where it is.
        headers: [
          { name: 'Authorization', secret: 'tok' },
          { name: '7', secret: 'k' },
        ],
        intercept: true,
      },
      { host: 'pinned.example', methods: [], pathPrefix: undefined, headers: [], intercept: false },
    ],
    ask: true,
  };
  const rules =
    '[{"host":"pypi.org","methods":[]},' +
    '{"host":"api.example.com","methods":["GET","POST"],"path_prefix":"/v1/","headers":{"Authorization":{"secret":"tok"},"7":{"secret":"k"}}},' +
    '{"host":"pinned.example","methods":[],"intercept":false}]';
  assert.equal(grantJson(network), `{"rules":${rules},"ask":true}`);
  assert.equal(grantJson({ rules: [], ask: false }), '{"rules":[]}');
  assert.equal(
    infoJson({ key: 'n', running: true, metadata: [['a', 'b']], network }),
    `{"key":"n","running":true,"lifetime":null,"metadata":{"a":"b"},"network":{"rules":${rules},"ask":true}}`,
  );
  // What it writes reads back as the same grant (headers in name order, as a body's are read).
  const named = structuredClone(network);
  named.rules[1].headers.reverse();
  assert.deepEqual(grantBody(grantJson(named)), named);
});

test('a bounded fan-out keeps the order and never runs more than its bound', async () => {
  let now = 0;
  let most = 0;
  const out = await bounded([5, 1, 4, 2, 3], 2, async (x) => {
    now += 1;
    most = Math.max(most, now);
    await new Promise((r) => setTimeout(r, x));
    now -= 1;
    return x * 10;
  });
  assert.deepEqual(out, [50, 10, 40, 20, 30]);
  assert.equal(most, 2);
});
