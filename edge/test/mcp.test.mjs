// `/mcp` on the Worker (src/mcp.js) in node, over a fake API: the pure checks against
// host/src/mcp/http.rs's tables (Origin, Accept, the progress token), the bounded
// session table (session.rs's rows), and the server end to end: every forgery refused
// with its status and no API call made, an exec's output as progress then its result,
// a cancellation or a caller that leaves cancels the exec's stream (what the key's
// object sees as its client leaving), another session's cancel touches nothing.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  McpServer,
  Sessions,
  acceptsBoth,
  admit,
  configuredOrigins,
  encodePath,
  execText,
  negotiate,
  newSessionId,
  originAllowed,
  progressToken,
  tools,
} from '../src/mcp.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const doc = JSON.parse(readFileSync(join(root, 'docs', 'openapi.json'), 'utf8'));
const TOKEN = 'consumer-token';
const validKey = (k) => typeof k === 'string' && /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/.test(k);

test('only this server\'s own loopback origin on its port, or a configured one, is allowed (http.rs rows)', () => {
  const conf = ['https://agent.example.com/'].map((o) => configuredOrigins({ MCP_ORIGINS: [o] })[0]);
  const rows = [
    ['no Origin: not a browser', null, true],
    ['localhost on our port', 'http://localhost:8787', true],
    ['127.0.0.1 on our port', 'http://127.0.0.1:8787', true],
    ['[::1] on our port', 'http://[::1]:8787', true],
    ['case does not matter', 'HTTP://LocalHost:8787', true],
    ['a configured origin', 'https://agent.example.com', true],
    ['localhost on another port', 'http://localhost:3000', false],
    ['a rebinding name on our port', 'http://evil.example:8787', false],
    ['a suffix trick', 'http://localhost:8787.evil.example', false],
    ['userinfo trick', 'http://localhost:8787@evil.example', false],
    ['the null origin', 'null', false],
    ['no scheme', 'localhost:8787', false],
    ['a configured host on another scheme', 'http://agent.example.com', false],
    ['unreadable bytes', '\u0000', false],
  ];
  for (const [what, origin, want] of rows) assert.equal(originAllowed(origin, '8787', conf), want, what);
});

test('a POST must accept both answers; the progress token is a string or an integer; revisions', () => {
  const accept = [
    ['application/json, text/event-stream', true],
    ['text/event-stream;q=0.9, application/json', true],
    ['*/*', true],
    ['application/json', false],
    ['text/event-stream', false],
    [null, false],
  ];
  for (const [a, want] of accept) assert.equal(acceptsBoth(a), want, String(a));
  const tokens = [
    [{ params: { _meta: { progressToken: 't1' } } }, 't1'],
    [{ params: { _meta: { progressToken: 7 } } }, 7],
    [{ params: { _meta: { progressToken: 1.5 } } }, undefined],
    [{ params: { _meta: { progressToken: {} } } }, undefined],
    [{ params: {} }, undefined],
  ];
  for (const [msg, want] of tokens) assert.equal(progressToken(msg), want, JSON.stringify(msg));
  const revisions = [
    ['2025-06-18', '2025-06-18'],
    ['2024-11-05', '2024-11-05'],
    ['2026-07-28', '2025-11-25'],
    [undefined, '2025-11-25'],
  ];
  for (const [asked, want] of revisions) assert.equal(negotiate(asked), want, String(asked));
  const id = newSessionId();
  assert.match(id, /^[0-9a-f]{64}$/, 'two UUIDv4s');
  assert.notEqual(id, newSessionId());
});

test('a session answers only its owner and only until idle (session.rs rows)', () => {
  const idle = 60_000;
  const s = new Sessions({ max: 8, idleMs: idle });
  s.open('a', 'tok', 'V', 0);
  const rows = [
    ['its owner, at once', 'a', 'tok', 0, 'V'],
    ['another token', 'a', 'other', 0, undefined],
    ['a prefix of the token', 'a', 'to', 0, undefined],
    ['an unknown id', 'b', 'tok', 0, undefined],
    ['its owner within idle', 'a', 'tok', idle, 'V'],
    ['used within idle keeps it', 'a', 'tok', idle * 2, 'V'],
    ['idle too long', 'a', 'tok', idle * 4, undefined],
    ['gone once expired', 'a', 'tok', idle * 2, undefined],
  ];
  for (const [what, id, owner, at, want] of rows) assert.equal(s.touch(id, owner, at), want, what);
  assert.equal(s.size, 0, 'the expired session was dropped');
});

test('a flood of opens never holds more than the bound; a full table drops the least recently used', () => {
  const s = new Sessions({ max: 16, idleMs: 60_000 });
  for (let i = 0; i < 10_000; i++) {
    s.open(`s${i}`, 'tok', 'V', i);
    assert.ok(s.size <= 16, `after ${i}: ${s.size}`);
  }
  assert.equal(s.touch('s9999', 'tok', 10_000), 'V');
  assert.equal(s.touch('s0', 'tok', 10_000), undefined);
  const t = new Sessions({ max: 2, idleMs: 60_000 });
  t.open('a', 'tok', 'V', 0);
  t.open('b', 'tok', 'V', 1);
  t.touch('a', 'tok', 2);
  assert.equal(t.open('c', 'tok', 'V', 3).evicted, 'b', 'b was used least recently');
  const u = new Sessions({ max: 4, idleMs: 1000 });
  u.open('a', 'tok', 'V', 0);
  u.open('b', 'tok', 'V', 0);
  assert.deepEqual(u.open('c', 'tok', 'V', 5000), { expired: 2, evicted: undefined }, 'idle ones swept before an open');
  assert.equal(u.close('c', 'other', 5000), false, 'another token cannot end it');
  assert.equal(u.close('c', 'tok', 5000), true);
  assert.equal(u.close('c', 'tok', 5000), false, 'already gone');
});

test('the tools are the Rust table\'s, their schemas the API\'s with no refs', () => {
  const t = tools(doc);
  assert.deepEqual(
    t.map((x) => x.name),
    ['exec', 'start', 'status', 'stop', 'denials', 'egress', 'egress_pending', 'artifacts', 'expose', 'unexpose', 'previews', 'put'],
  );
  const exec = t[0].inputSchema;
  assert.deepEqual(exec.required, ['key', 'argv']);
  assert.equal(exec.additionalProperties, false);
  assert.equal(exec.properties.argv.minItems, 1);
  assert.equal(typeof exec.properties.key.pattern, 'string');
  assert.ok(!JSON.stringify(t).includes('$ref'), 'refs are inlined');
  assert.equal(t[1].inputSchema.properties.grant, undefined, 'start takes no grant');
  assert.equal(encodePath('a/b?c#%'), 'a%2Fb%3Fc%23%25');
  assert.equal(encodePath('x y/z', true), 'x%20y/z');
});

test('an exec\'s text is render.rs exec_text\'s', () => {
  const base = { exit_code: 0, stdout: '', stderr: '', timed_out: false, truncated: false, denials: 0, limits: [] };
  assert.equal(execText({ ...base, stdout: 'hi\n' }), 'exit code 0\n--- stdout ---\nhi\n');
  assert.equal(
    execText({ ...base, exit_code: 137, timed_out: true, truncated: true, denials: 2, limits: ['pids'] }),
    'exit code 137 (timed out: killed)\n(output was truncated at the configured bound)\n' +
      '(a fork failed: the container\'s process limit was reached)\n(2 network requests were denied: see the denials tool)',
  );
});

// --- The server over a fake API.

/** A fake API: records every call; `exec/stream` answers `script`'s events, a `hold`
 * stream stays open until cancelled (then `cancelled` resolves). */
function fakeApi() {
  const calls = [];
  let markCancelled;
  const cancelled = new Promise((r) => (markCancelled = r));
  const api = async (req) => {
    const url = new URL(req.url);
    const body = req.body ? await req.text() : '';
    calls.push({ method: req.method, path: url.pathname + url.search, auth: req.headers.get('authorization'), body });
    if (url.pathname.endsWith('/exec/stream')) {
      const cmd = JSON.parse(body);
      if (cmd.argv.length === 0) {
        return new Response(JSON.stringify({ error: { code: 'invalid-input', message: 'argv is empty' } }), { status: 400 });
      }
      const enc = new TextEncoder();
      const line = (v) => enc.encode(`${JSON.stringify(v)}\n`);
      const hold = cmd.argv[0] === 'hold';
      return new Response(
        new ReadableStream({
          start(c) {
            c.enqueue(line({ type: 'stdout', data: 'started\n' }));
            if (hold) return;
            c.enqueue(line({ type: 'stderr', data_base64: Buffer.from('err\n').toString('base64') }));
            c.enqueue(line({ type: 'exit', exit_code: 3, timed_out: false, truncated: false, killed: 0, denials: 0, admitted: 0, limits: [] }));
            c.close();
          },
          cancel() {
            markCancelled(true);
          },
        }),
        { headers: { 'content-type': 'application/x-ndjson' } },
      );
    }
    return new Response(JSON.stringify({ state: 'running' }), { headers: { 'content-type': 'application/json' } });
  };
  return { api, calls, cancelled };
}

const ACCEPT = 'application/json, text/event-stream';

function harness() {
  const fake = fakeApi();
  const server = new McpServer({ api: fake.api, doc, validKey });
  const env = { API_TOKEN: TOKEN };
  /** The Worker's path: admit, then the object's `serve`. */
  const send = async (method, headers = {}, body) => {
    const req = new Request('http://127.0.0.1:8787/mcp', {
      method,
      headers: { accept: ACCEPT, 'content-type': 'application/json', authorization: `Bearer ${TOKEN}`, ...headers },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    const a = admit(req, env.API_TOKEN, configuredOrigins(env));
    return a.refused ?? server.serve(req, a.token);
  };
  const open = async () => {
    const r = await send('POST', {}, { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25' } });
    assert.equal(r.status, 200);
    const body = await r.json();
    assert.equal(body.result.serverInfo.name, 'stockade');
    return r.headers.get('mcp-session-id');
  };
  return { fake, server, send, open };
}

const mark = (n) => ({
  jsonrpc: '2.0',
  id: 2,
  method: 'tools/call',
  params: { name: 'exec', arguments: { key: 'mcp-attack', argv: ['touch', `/workspace/pwned-${n}`] } },
});

test('every forgery is refused with its status and reaches no API call', async () => {
  const { fake, send, open } = harness();
  const sid = await open();
  const other = await open();
  const ended = await open();
  assert.equal((await send('DELETE', { 'mcp-session-id': ended })).status, 204);
  const forged = sid.slice(0, 63) + (sid.endsWith('0') ? '1' : '0');
  const s = { 'mcp-session-id': sid };
  const rows = [
    ['no token', 'POST', { ...s, authorization: '' }, mark(1), 401],
    ['a wrong token', 'POST', { ...s, authorization: `Bearer ${TOKEN}x` }, mark(2), 401],
    ['the approver\'s token', 'POST', { ...s, authorization: 'Bearer approver' }, mark(3), 401],
    ['a foreign Origin', 'POST', { ...s, origin: 'http://evil.example:8787' }, mark(4), 403],
    ['a foreign Origin opening a session', 'POST', { origin: 'http://evil.example:8787' }, { jsonrpc: '2.0', id: 1, method: 'initialize' }, 403],
    ['the null Origin', 'POST', { ...s, origin: 'null' }, mark(5), 403],
    ['no session id', 'POST', {}, mark(6), 400],
    ['a forged session id', 'POST', { 'mcp-session-id': forged }, mark(7), 404],
    ['an ended session', 'POST', { 'mcp-session-id': ended }, mark(8), 404],
    ['an unknown revision', 'POST', { ...s, 'mcp-protocol-version': '1999-01-01' }, mark(10), 400],
    ['a batch', 'POST', s, [mark(90), mark(91)], 400],
    ['not JSON at all', 'POST', s, '{"jsonrpc": ', 400],
    ['no Accept of both answers', 'POST', { ...s, accept: 'application/json' }, mark(11), 406],
    ['not JSON', 'POST', { ...s, 'content-type': 'text/plain' }, mark(12), 415],
    ['GET: no server stream', 'GET', s, undefined, 405],
    ['GET without a token', 'GET', { authorization: '' }, undefined, 401],
    ['DELETE of a forged session', 'DELETE', { 'mcp-session-id': forged }, undefined, 404],
    ['DELETE with the approver\'s token', 'DELETE', { ...s, authorization: 'Bearer approver' }, undefined, 401],
  ];
  for (const [what, method, headers, body, want] of rows) {
    const r = await send(method, headers, body);
    assert.equal(r.status, want, what);
    if (want === 401) assert.equal(r.headers.get('www-authenticate'), 'Bearer', what);
    if (want === 405) assert.equal(r.headers.get('allow'), 'POST, DELETE', what);
    const v = await r.json();
    assert.equal(v.jsonrpc, '2.0', `${what}: a JSON-RPC error`);
  }
  assert.deepEqual(fake.calls, [], 'no refused request reached the API');
  // Both live sessions still work, this server's own origin is accepted.
  const ping = { jsonrpc: '2.0', id: 4, method: 'ping' };
  assert.equal((await send('POST', { ...s, origin: 'http://localhost:8787', 'mcp-protocol-version': '2025-11-25' }, ping)).status, 200);
  assert.equal((await send('POST', { 'mcp-session-id': other }, ping)).status, 200);
});

test('tools run through the API with the caller\'s token; refusals are readable tool errors', async () => {
  const { fake, send, open } = harness();
  const s = { 'mcp-session-id': await open() };
  const call = async (name, args) => (await (await send('POST', s, { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name, arguments: args } })).json());
  const ok = await call('exec', { key: 'k', argv: ['sh'] });
  assert.equal(ok.result.isError, false);
  assert.equal(ok.result.structuredContent.exit_code, 3, 'a non-zero exit is a result');
  assert.equal(ok.result.structuredContent.stdout, 'started\n');
  assert.equal(ok.result.structuredContent.stderr, 'err\n');
  assert.equal(ok.result.content[0].text, 'exit code 3\n--- stdout ---\nstarted\n\n--- stderr ---\nerr\n');
  const bad = await call('exec', { key: 'k', argv: [] });
  assert.equal(bad.result.isError, true);
  assert.equal(bad.result.content[0].text, 'invalid-input (HTTP 400): argv is empty');
  const key = await call('status', { key: 'k/../../v1/secrets', id: 'x' });
  assert.equal(key.result.isError, true);
  assert.equal(key.result.content[0].text, 'key: key has a character outside [A-Za-z0-9._-]: \'/\'');
  const st = await call('status', { key: 'k', id: 'a/b' });
  assert.equal(st.result.content[0].text, 'running');
  const unknown = await call('rm-rf', {});
  assert.equal(unknown.error.code, -32602);
  assert.match(unknown.error.message, /unknown tool "rm-rf"/);
  assert.deepEqual(
    fake.calls.map((c) => `${c.method} ${c.path} ${c.auth}`),
    [
      `POST /v1/sandboxes/k/exec/stream Bearer ${TOKEN}`,
      `POST /v1/sandboxes/k/exec/stream Bearer ${TOKEN}`,
      `GET /v1/sandboxes/k/detached/a%2Fb Bearer ${TOKEN}`,
    ],
    'the key outside the grammar made no call; every segment is encoded',
  );
});

/** The SSE events of a response body read so far, and the reader. */
async function readUntil(reader, text, seen = { text: '' }) {
  const dec = new TextDecoder();
  while (!seen.text.includes(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    seen.text += dec.decode(value, { stream: true });
  }
  return seen;
}

test('an exec with a progress token streams its output as progress, then its result', async () => {
  const { send, open } = harness();
  const s = { 'mcp-session-id': await open() };
  const r = await send('POST', s, {
    jsonrpc: '2.0', id: 5, method: 'tools/call',
    params: { _meta: { progressToken: 'p' }, name: 'exec', arguments: { key: 'k', argv: ['sh'] } },
  });
  assert.equal(r.headers.get('content-type'), 'text/event-stream');
  const events = (await r.text()).split('\n\n').filter((e) => e && !e.startsWith(':')).map((e) => JSON.parse(e.replace(/^event: message\ndata: /, '')));
  assert.deepEqual(
    events.map((e) => e.method ?? 'response'),
    ['notifications/progress', 'notifications/progress', 'response'],
  );
  assert.deepEqual(events.slice(0, 2).map((e) => [e.params.progress, e.params.message, e.params.progressToken]), [[1, 'started\n', 'p'], [2, 'err\n', 'p']]);
  assert.equal(events[2].result.structuredContent.exit_code, 3);
});

test('a cancelled exec ends its stream with -32800 and cancels its API stream; another session\'s cancel does nothing', async () => {
  const { fake, server, send, open } = harness();
  const sid = await open();
  const other = await open();
  const r = await send('POST', { 'mcp-session-id': sid }, {
    jsonrpc: '2.0', id: 7, method: 'tools/call',
    params: { _meta: { progressToken: 1 }, name: 'exec', arguments: { key: 'k', argv: ['hold'] } },
  });
  const reader = r.body.getReader();
  const seen = await readUntil(reader, 'started');
  const cancel = { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 7, reason: 'Esc' } };
  assert.equal((await send('POST', { 'mcp-session-id': other }, cancel)).status, 202);
  assert.equal(server.inflight.size, 1, 'another session\'s cancel of the same id touched nothing');
  assert.equal((await send('POST', { 'mcp-session-id': sid }, { ...cancel, params: { requestId: '7' } })).status, 202);
  assert.equal(server.inflight.size, 1, 'another id (a string) touched nothing');
  assert.equal((await send('POST', { 'mcp-session-id': sid }, cancel)).status, 202);
  await readUntil(reader, '-32800', seen);
  assert.match(seen.text, /"code":-32800/);
  assert.equal(await fake.cancelled, true, 'the API stream was cancelled: the key\'s object sees its client leave');
  assert.equal(server.inflight.size, 0);
});

test('a caller that leaves mid-exec cancels its API stream', async () => {
  const { fake, server, send, open } = harness();
  const r = await send('POST', { 'mcp-session-id': await open() }, {
    jsonrpc: '2.0', id: 8, method: 'tools/call',
    params: { _meta: { progressToken: 'g' }, name: 'exec', arguments: { key: 'k', argv: ['hold'] } },
  });
  const reader = r.body.getReader();
  await readUntil(reader, 'started');
  await reader.cancel();
  assert.equal(await fake.cancelled, true);
  // The request is forgotten once its call has ended.
  for (let i = 0; i < 100 && server.inflight.size > 0; i++) await new Promise((res) => setImmediate(res));
  assert.equal(server.inflight.size, 0);
});

test('a cancelled exec without a progress token answers -32800 as JSON and cancels its API stream', async () => {
  const { fake, server, send, open } = harness();
  const s = { 'mcp-session-id': await open() };
  const pending = send('POST', s, {
    jsonrpc: '2.0', id: 'x', method: 'tools/call', params: { name: 'exec', arguments: { key: 'k', argv: ['hold'] } },
  });
  while (server.inflight.size === 0 || fake.calls.length === 0) await new Promise((res) => setImmediate(res));
  const cancel = { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'x' } };
  assert.equal((await send('POST', s, cancel)).status, 202);
  const r = await pending;
  assert.equal(r.headers.get('content-type'), 'application/json');
  assert.equal((await r.json()).error.code, -32800);
  assert.equal(await fake.cancelled, true);
});
