// Unit tests of the deployment's pure parts, in node (no workerd): the request signer
// against auth.rs's documented vector and an independent HMAC (node:crypto), the
// rendezvous order against placement.rs's vectors, the JSPI lists generated from the
// WIT, the UTF-8 chunker of the live stream, the generated workerd configuration, and
// batches (batch.js batchInOrder, nodes.js RemoteSubstrate.batch, jspi-host.js's record
// of the fences a batch may have opened).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { canonical, sign, signedHeaders, verify, sha256Hex } from '../src/sign.js';
import { order, score } from '../src/placement.js';
import { asyncLists, interfaceFunctions } from '../scripts/async-lists.mjs';
import { Utf8Chunker, execInput, callErrorStatus, bearerRefusal, envTokens } from '../src/api.js';
import { deployConfig, capnpString, DEFAULT_LISTEN, storageNotice } from '../scripts/deploy-config.mjs';

const edge = join(dirname(fileURLToPath(import.meta.url)), '..');
const wit = readFileSync(join(edge, '..', 'wit', 'sandbox.wit'), 'utf8');
const SECRET = '0123456789abcdef0123456789abcdef';
const N = '00112233445566778899aabbccddeeff';
const REQ = { timeMs: 1_000_000, nonce: N, method: 'POST', path: '/node/v1/ensure', key: 'alpha', idempotency: 'i1', body: '{}' };

test('the canonical text is the one auth.rs documents (the_canonical_text_is_the_documented_one)', async () => {
  assert.equal(
    await canonical(REQ),
    'stockade-node-v1\n1000000\n00112233445566778899aabbccddeeff\nPOST\n/node/v1/ensure\nalpha\ni1\n' +
      '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a',
  );
  assert.equal(await sha256Hex(''), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
});

test('the signature is HMAC-SHA256 over the canonical text, keyed with the secret text', async () => {
  const want = createHmac('sha256', SECRET).update(await canonical(REQ)).digest('hex');
  assert.equal(await sign(SECRET, REQ), want);
  // The secret file's text is trimmed (tls.rs), not hex-decoded.
  assert.equal(await sign(`${SECRET}\n`, REQ), want);
});

test('a good signature verifies; every changed field, another secret, a stale time and bad headers do not', async () => {
  const body = '{"container":"c"}';
  const good = { ...REQ, body };
  const sig = await sign(SECRET, good);
  assert.equal(await verify(SECRET, good, sig, 1_000_000), null);
  const changed = {
    time: { timeMs: 1_000_001 },
    nonce: { nonce: 'ffffffffffffffffffffffffffffffff' },
    method: { method: 'GET' },
    path: { path: '/node/v1/stop' },
    key: { key: 'beta' },
    idempotency: { idempotency: '' },
    body: { body: '{"container":"d"}' },
  };
  for (const [what, c] of Object.entries(changed)) {
    assert.equal(await verify(SECRET, { ...good, ...c }, sig, 1_000_000), 'bad-signature', what);
  }
  assert.equal(await verify('another secret', good, sig, 1_000_000), 'bad-signature');
  assert.equal(await verify(SECRET, good, sig, 1_000_000 + 30_000), null);
  assert.equal(await verify(SECRET, good, sig, 1_000_000 + 30_001), 'expired');
  assert.equal(await verify(SECRET, good, sig, 1_000_000 - 30_001), 'expired');
  assert.equal(await verify(SECRET, good, 'zz', 1_000_000), 'malformed');
  assert.equal(await verify(SECRET, good, 'g'.repeat(64), 1_000_000), 'malformed');
  assert.equal(await verify(SECRET, { ...good, nonce: 'abc' }, sig, 1_000_000), 'malformed');
  assert.equal(await verify(SECRET, { ...good, nonce: N.toUpperCase() }, sig, 1_000_000), 'malformed');
});

test('signed headers carry a fresh nonce each time and verify', async () => {
  const a = await signedHeaders(SECRET, { method: 'POST', path: '/node/v1/current', key: 'k', idempotency: 'x', body: '{}' });
  const b = await signedHeaders(SECRET, { method: 'POST', path: '/node/v1/current', key: 'k', idempotency: 'x', body: '{}' });
  assert.notEqual(a['x-stockade-nonce'], b['x-stockade-nonce']);
  assert.match(a['x-stockade-nonce'], /^[0-9a-f]{32}$/);
  const req = {
    timeMs: Number(a['x-stockade-time']),
    nonce: a['x-stockade-nonce'],
    method: 'POST',
    path: '/node/v1/current',
    key: a['x-stockade-key'],
    idempotency: a['x-stockade-idempotency'],
    body: '{}',
  };
  assert.equal(await verify(SECRET, req, a['x-stockade-signature'], Date.now()), null);
});

test('rendezvous scores and orders are placement.rs vectors', async () => {
  const hex = (b) => Buffer.from(b).toString('hex');
  assert.equal(hex(await score('a', 'k')), '9a2a77afb0d50c76464e852f250f179997217d5e6d61f2630d825bbaca8039a4');
  assert.notEqual(hex(await score('ab', 'c')), hex(await score('a', 'bc')));
  const nodes = ['node-1', 'node-2', 'node-3'];
  const rows = [
    ['alpha', [1, 0, 2]],
    ['beta', [0, 1, 2]],
    ['gamma', [1, 2, 0]],
    ['k-0', [0, 1, 2]],
    ['', [2, 1, 0]],
  ];
  for (const [key, want] of rows) {
    assert.deepEqual(await order(nodes, key), want.map((i) => nodes[i]), `key ${key}`);
    assert.deepEqual(await order([...nodes].reverse(), key), want.map((i) => nodes[i]), `key ${key}, reversed`);
  }
  assert.deepEqual(await order(['only'], 'k'), ['only']);
  assert.deepEqual(await order([], 'k'), []);
});

test('the JSPI lists are every substrate import and every export, from the WIT', () => {
  const { imports, exports } = asyncLists(wit);
  assert.equal(imports.length, 22);
  assert.ok(imports.includes('stockade:sandbox/substrate#batch'));
  assert.ok(imports.includes('stockade:sandbox/substrate#open-preview'));
  assert.ok(imports.includes('stockade:sandbox/substrate#read-artifact'));
  assert.ok(imports.includes('stockade:sandbox/substrate#apply-grant'));
  assert.ok(imports.includes('stockade:sandbox/substrate#fork-snapshot'));
  assert.deepEqual(
    exports.filter((e) => e.includes('/events#')),
    ['stockade:sandbox/events#on-stop', 'stockade:sandbox/events#expiring', 'stockade:sandbox/events#end-lifetime'],
  );
  // 23 of the facade, 3 of the events.
  assert.equal(exports.length, 26);
  assert.ok(exports.includes('stockade:sandbox/facade#ensure'));
  assert.ok(exports.includes('stockade:sandbox/facade#save-snapshot'));
  assert.ok(exports.includes('stockade:sandbox/facade#set-lifetime'));
  assert.ok(exports.includes('stockade:sandbox/facade#set-network'));
  assert.ok(exports.includes('stockade:sandbox/facade#sandboxes'));
  // A new substrate call in the WIT shows up without anyone touching a list.
  const grown = wit.replace(/(interface substrate \{)/, '$1\n    probe: func(key: string) -> result<_, substrate-error>;');
  assert.ok(asyncLists(grown).imports.includes('stockade:sandbox/substrate#probe'));
  // Records nested in an interface are not functions; `%list` is `list`.
  assert.ok(interfaceFunctions(wit, 'records').includes('list'));
  assert.ok(!interfaceFunctions(wit, 'substrate').includes('exit-code'));
});

test('live output chunks keep UTF-8 intact across boundaries and send other bytes as base64', () => {
  const c = new Utf8Chunker('stdout');
  const euro = new TextEncoder().encode('a€b'); // € is 3 bytes
  assert.deepEqual(c.push(euro.subarray(0, 2)), { type: 'stdout', data: 'a' });
  assert.equal(c.push(euro.subarray(2, 3)), undefined);
  assert.deepEqual(c.push(euro.subarray(3)), { type: 'stdout', data: '€b' });
  assert.deepEqual(c.push(new Uint8Array([0xff, 0x41])), { type: 'stdout', data_base64: '/0E=' });
  assert.equal(c.push(new Uint8Array([0xe2])), undefined);
  assert.deepEqual(c.finish(), { type: 'stdout', data_base64: '4g==' });
  assert.equal(c.finish(), undefined);
});

test('request bodies are read as the wire crate reads them; errors map to api.rs statuses', () => {
  const i = execInput('{"argv":["echo","hi"],"env":{"B":"2","A":"1"},"timeout_ms":5,"stdin":"x"}');
  assert.deepEqual(i.env, [
    ['A', '1'],
    ['B', '2'],
  ]);
  assert.equal(i.timeoutMs, 5n);
  assert.deepEqual([...i.stdin], [120]);
  for (const [body, code] of [
    ['{', 'malformed-json'],
    ['[]', 'malformed-json'],
    ['{"argv":["a"],"nope":1}', 'malformed-json'],
    ['{"argv":["a"],"timeout_ms":1.5}', 'malformed-json'],
    ['{"argv":["a"],"stdin":"x","stdin_base64":"eA=="}', 'invalid-input'],
  ]) {
    assert.throws(() => execInput(body), (e) => e.code === code, body);
  }
  const rows = [
    [{ kind: 'facade', payload: { tag: 'needs-approval', val: 'm' } }, 403, 'needs-approval'],
    [{ kind: 'facade', payload: { tag: 'over-capacity' } }, 429, 'over-capacity'],
    [{ kind: 'facade', payload: { tag: 'invalid-input', val: 'm' } }, 400, 'invalid-input'],
    [{ kind: 'facade', payload: { tag: 'unreachable', val: 'm' } }, 502, 'unreachable'],
    [{ kind: 'facade', payload: { tag: 'failed', val: 'm' } }, 500, 'failed'],
    [{ kind: 'trap', message: 'x' }, 500, 'trap'],
  ];
  for (const [e, status, code] of rows) {
    const [s, c] = callErrorStatus(e);
    assert.deepEqual([s, c], [status, code]);
  }
});

test('token bindings are trimmed as stockade serve reads its token files; an empty one matches nothing', () => {
  // deploy-config.mjs embeds a token file whole, and `wrangler secret put API_TOKEN <
  // FILE` keeps its newline: `stockade serve` trims its files (host/src/api/tokens.rs).
  for (const end of ['\n', '\r\n', ' \n\n', '']) {
    const tokens = envTokens({ API_TOKEN: `consumer${end}`, APPROVER_TOKEN: `\tapprover${end}` });
    assert.equal(bearerRefusal('/v1/sandboxes/k/exec', 'Bearer consumer', tokens), null, JSON.stringify(end));
    assert.deepEqual(tokens, { api: 'consumer', approver: 'approver' });
    assert.equal(bearerRefusal('/v1/secrets', 'Bearer approver', tokens), null);
    assert.equal(bearerRefusal('/v1/egress/pending', 'Bearer approver', tokens), null);
    assert.equal(bearerRefusal('/v1/egress/pending', 'Bearer consumer', tokens), null);
    assert.deepEqual(bearerRefusal('/v1/secrets', 'Bearer consumer', tokens)?.slice(0, 2), [403, 'approver-only']);
    assert.deepEqual(bearerRefusal('/v1/sandboxes/k/exec', 'Bearer approver', tokens)?.slice(0, 2), [401, 'unauthorized']);
    assert.deepEqual(bearerRefusal('/v1/sandboxes/k/exec', `Bearer consumer${end}`, tokens)?.[0], end === '' ? undefined : 401);
    assert.deepEqual(bearerRefusal('/v1/sandboxes/k/exec', 'consumer', tokens)?.[0], 401, 'as api.rs: "Bearer " first');
  }
  // A token left empty (or only whitespace) is none: no bearer, not even an empty one, matches it.
  for (const empty of [undefined, '', ' \n']) {
    const tokens = envTokens({ API_TOKEN: empty, APPROVER_TOKEN: empty });
    for (const auth of [undefined, '', 'Bearer ', 'Bearer  ']) {
      assert.equal(bearerRefusal('/v1/sandboxes/k/exec', auth, tokens)?.[0], 401);
      assert.equal(bearerRefusal('/v1/secrets', auth, tokens)?.[0], 401);
      assert.equal(bearerRefusal('/v1/egress/pending', auth, tokens)?.[0], 401);
    }
  }
});

test('the generated configuration pins each node and embeds, never copies, files', () => {
  const text = deployConfig(
    {
      storage: '/var/lib/x',
      api_token: 't"1',
      approver_token_file: '/etc/a',
      nodes: [{ name: 'n1', address: '10.0.0.2:8788', cert_file: '/etc/n1.pem', secret_file: '/etc/n1.secret' }],
    },
    { descDir: '/', outDir: '/tmp' },
  );
  assert.match(text, /trustedCertificates = \[ embed "\.\.\/etc\/n1\.pem" \]/);
  assert.match(text, /certificateHost = "stockade-node"/);
  assert.match(text, /enableSql = true/);
  assert.match(text, /localDisk = "do-storage"/);
  assert.match(text, /name = "API_TOKEN", text = "t\\"1"/);
  assert.equal(capnpString('a\nb'), '"a\\nb"');
  assert.throws(() => deployConfig({ storage: 'rel', nodes: [{ name: 'n' }] }));
  assert.throws(() => deployConfig({ storage: '/x', nodes: [{ name: 'n' }, { name: 'n' }] }));
  const node = { name: 'n1', address: '10.0.0.2:8788', cert_file: '/c', secret_file: '/s' };
  assert.throws(() => deployConfig({ storage: '/x', api_token: ' \n', approver_token: 'a', nodes: [node] }), /api_token: empty/);
  // The default socket is no port a Stockade process takes by default (api, node, preview).
  assert.match(text, /address = "127\.0\.0\.1:8800"/);
  const defaults = readFileSync(join(edge, '..', 'wasmtime.toml'), 'utf8');
  const taken = [...defaults.matchAll(/^listen = "([^"]+)"/gm)].map((m) => m[1]);
  assert.deepEqual(taken, ['127.0.0.1:8787', '127.0.0.1:8788', '127.0.0.1:8790']);
  assert.ok(!taken.includes(DEFAULT_LISTEN));
  assert.ok(!taken.includes(JSON.parse(readFileSync(join(edge, 'deploy.example.json'), 'utf8')).listen));
  // A storage directory that does not exist is named before workerd fails on it.
  assert.equal(storageNotice('/there', () => true), null);
  assert.match(storageNotice('/var/lib/nowhere', () => false), /storage \/var\/lib\/nowhere does not exist: make it/);
});

test('the egress timeline: oldest first, a denial before an admission at the same ms, wire fields only', async () => {
  const { egressTimeline } = await import('../src/nodes.js');
  const allow = (at_ms, host) => ({ at_ms, fence: 'f', method: 'GET', host, port: 443, path: '/', rule: 0, via: 'https',
    status: 200, bytes_up: 0, bytes_down: 5, error: '', credentials: ['authorization'], suppressed: 0 });
  const deny = (at_ms, host) => ({ at_ms, host, method: 'GET', path: '/', rule_set: 'f', reason: 'no-rule', extra: 'dropped' });
  const t = egressTimeline([allow(5, 'a1'), allow(7, 'a2'), allow(5, 'a3')], [deny(7, 'd1'), deny(1, 'd2')]);
  assert.deepEqual(t.map((e) => `${e.decision}:${e.host}`), ['deny:d2', 'allow:a1', 'allow:a3', 'deny:d1', 'allow:a2']);
  assert.deepEqual(Object.keys(t[0]), ['decision', 'at_ms', 'host', 'method', 'path', 'rule_set', 'reason']);
  assert.deepEqual(t[1], { decision: 'allow', ...allow(5, 'a1') });
  assert.deepEqual(egressTimeline([], []), []);
});

// Uploads (edge/src/upload.js) and the streamed stdin's frames (edge/src/nodes.js).
import * as uploads from '../src/upload.js';
import { Framer } from '../src/nodes.js';
import { BadRequest } from '../src/api.js';

test('the unpack script is one file the host and the edge both load (host/node-protocol/src/upload/unpack.sh)', () => {
  const file = join(edge, '..', 'host', 'node-protocol', 'src', 'upload', 'unpack.sh');
  // The host: include_str! of that file, and no other copy of the script in its source.
  const rs = readFileSync(join(file, '..', 'mod.rs'), 'utf8');
  assert.match(rs, /const UNPACK: &str = include_str!\("unpack\.sh"\);/);
  assert.doesNotMatch(rs, /r#"set -e/);
  // The edge: gen/unpack.js is that file's text (edge/build.sh), what upload.js runs,
  // and a module of the deployment's Worker; no copy of the script in upload.js.
  assert.equal(uploads.UNPACK, readFileSync(file, 'utf8'));
  assert.doesNotMatch(readFileSync(join(edge, 'src', 'upload.js'), 'utf8'), /set -e/);
  assert.match(readFileSync(join(edge, 'src', 'upload.js'), 'utf8'), /from '#gen\/unpack\.js'/);
  assert.match(
    deployConfig({ storage: '/x', api_token: 'a', approver_token: 'b', nodes: [{ name: 'n', address: 'h:1', cert: 'c', secret: 's' }] }),
    /\(name = "#gen\/unpack\.js", esModule = embed "[^"]*gen\/unpack\.js"\)/,
  );
  const c = uploads.command('d/e', 'abc');
  assert.equal(c.argv[2], uploads.UNPACK);
  assert.deepEqual(c.argv.slice(3), ['stockade-put', '/workspace/d/e', '/workspace/.stockade-put-abc', '.stockade-complete-abc']);
  assert.equal(c.timeoutMs, 600_000n);
});

test('destinations and file paths are checked as archive.rs checks them', () => {
  // (input, the checked destination or the refusal's words)
  const dests = [
    ['', ''],
    ['a/./b//c/', 'a/b/c'],
    ['../x', /has \.\./],
    ['a/../../x', /has \.\./],
    ['/etc', /absolute/],
    ['a\0b', /NUL/],
  ];
  for (const [dest, want] of dests) {
    if (typeof want === 'string') assert.equal(uploads.checkDest(dest), want, dest);
    else assert.throws(() => uploads.checkDest(dest), (e) => e instanceof BadRequest && e.status === 400 && want.test(e.message), dest);
  }
  for (const ok of ['a', 'a/b.txt', '.hidden/x']) uploads.checkFileName(ok);
  for (const bad of ['', 'a//b', './a', 'a/..', '../a', 'a/.', '/abs', 'a\0']) {
    assert.throws(() => uploads.checkFileName(bad), (e) => e instanceof BadRequest && e.code === 'invalid-input', JSON.stringify(bad));
  }
  // A file needs its length; an archive over the bound is refused before its body.
  const url = new URL('https://x/v1/sandboxes/k/files/a.txt');
  assert.throws(() => uploads.what(['files', 'a.txt'], url, new Headers()), (e) => e.status === 411 && e.code === 'length-required');
  const big = new Headers({ 'content-length': String(2 ** 30 + 1) });
  assert.throws(() => uploads.what(['files'], new URL('https://x/?dest=a'), big), (e) => e.status === 413);
  assert.throws(() => uploads.what(['files'], new URL('https://x/?dst=a'), new Headers()), (e) => e.status === 400);
  const w = uploads.what(['files', 'a.txt'], url, new Headers({ 'content-length': '3' }));
  assert.deepEqual(w.upload('m'), { file: { path: 'a.txt', len: 3, marker: 'm' } });
});

test('an upload\'s answer: the body first, then the node\'s verdict, then the run', () => {
  const ran = (exitCode, stderr = '') => ({ outcome: { exitCode, stderr: new TextEncoder().encode(stderr) } });
  const statusOf = (e) => [502, 'unreachable', String(e)];
  const rows = [
    ['ok', { verdict: { entries: 2 }, call: ran(0) }, 201, { dest: '/workspace/d', entries: 2 }],
    ['the body broke off', { failure: [400, 'malformed-body', 'x'], verdict: { refused: 'y' }, call: ran(1) }, 400, 'malformed-body'],
    ['refused', { verdict: { refused: '../e has ..' }, call: ran(1) }, 400, 'invalid-input'],
    ['the call failed', { call: { error: 'gone' } }, 502, 'unreachable'],
    ['tar failed', { verdict: { entries: 1 }, call: ran(2, 'disk full\n') }, 422, 'put-failed'],
    ['no verdict', { call: ran(0) }, 422, 'put-failed'],
  ];
  for (const [why, args, status, want] of rows) {
    const [s, body] = uploads.answer({ dest: 'd', callErrorStatus: statusOf, ...args });
    assert.equal(s, status, why);
    if (typeof want === 'string') assert.equal(body.error.code, want, why);
    else assert.deepEqual(body, want, why);
  }
  // A node lost mid-upload: the user's terms, not the node call's words.
  const [s, body] = uploads.answer({ dest: 'd', callErrorStatus: statusOf, call: { error: 'node n: run: Network connection lost' } });
  assert.deepEqual([s, body.error.message], [502, "the upload did not complete: the sandbox's node could not be reached (nothing was written)"]);
});

test('a stream\'s frames are tagged as host/node-protocol/src/stream.rs verifies them (an independent HMAC)', async () => {
  const f = new Framer(SECRET, 'sig');
  const data = new Uint8Array((1 << 20) + 5).map((_, i) => i % 251);
  const pieces = [...(await f.frames(data)), ...(await f.end())];
  // Three pieces a frame: its length, its data (the caller's bytes, not a copy), its tag.
  assert.equal(pieces.length, 9);
  assert.equal(pieces[1].buffer, data.buffer, 'the data is not copied');
  let off = 0;
  for (let seq = 0; seq < 3; seq++) {
    const [lenBytes, body, tag] = pieces.slice(3 * seq, 3 * seq + 3);
    const len = new DataView(lenBytes.buffer, lenBytes.byteOffset).getUint32(0);
    assert.equal(body.length, len);
    assert.deepEqual(body, data.subarray(off, off + len));
    off += len;
    const head = Buffer.alloc(12);
    head.writeBigUInt64BE(BigInt(seq), 0);
    head.writeUInt32BE(len, 8);
    const digest = createHash('sha256').update(body).digest();
    const want = createHmac('sha256', SECRET).update('stockade-stream-v1\nsig\n').update(head).update(digest).digest();
    assert.deepEqual(Buffer.from(tag), want, `frame ${seq}`);
  }
  assert.equal(off, data.length);
});

// The upload's body as a byte source (upload.js `bounded`): one buffer for a
// whole upload where the body is a byte stream, as workerd's is.
const byteBody = (chunks) =>
  new ReadableStream({
    type: 'bytes',
    pull(ctl) {
      const c = chunks.shift();
      if (c !== undefined) return ctl.enqueue(c);
      ctl.close();
      // A pending BYOB read ends once its request is answered (Streams spec).
      ctl.byobRequest?.respond(0);
    },
  });

test('an upload\'s body is read into the caller\'s one buffer, and counted', async () => {
  const { stream, state } = uploads.bounded(byteBody([new Uint8Array(5).fill(1), new Uint8Array(7).fill(2)]));
  let buf = new ArrayBuffer(1 << 20);
  const seen = [];
  for (;;) {
    const { value, done } = await stream.read(new Uint8Array(buf));
    if (done) break;
    // The same memory comes back (transferred), never a fresh buffer per chunk.
    assert.equal(value.buffer.byteLength, 1 << 20);
    seen.push([...value]);
    buf = value.buffer;
  }
  assert.deepEqual(seen, [[1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2]]);
  assert.deepEqual(state, { failure: undefined, bytes: 12 });
});

test('a body that is not a byte stream is read chunk by chunk; no body is empty', async () => {
  const plain = new ReadableStream({
    start(ctl) {
      ctl.enqueue(new Uint8Array([9, 9]));
      ctl.close();
    },
  });
  const { stream, state } = uploads.bounded(plain);
  const r = await stream.read(new Uint8Array(16));
  assert.deepEqual([...r.value], [9, 9]);
  assert.equal((await stream.read(new Uint8Array(16))).done, true);
  assert.equal(state.bytes, 2);
  assert.equal((await uploads.bounded(null).stream.read(new Uint8Array(1))).done, true);
});

test('an upload past the bound, or silent, fails its read with the answer to give', async () => {
  // 1 GiB and one byte, in 64 MiB views of one buffer (a plain stream does not transfer).
  const piece = new Uint8Array(64 << 20);
  let left = uploads.MAX_ARCHIVE_BYTES + 1;
  const huge = new ReadableStream({
    pull(ctl) {
      const n = Math.min(left, piece.length);
      left -= n;
      ctl.enqueue(piece.subarray(0, n));
    },
  });
  const big = uploads.bounded(huge);
  await assert.rejects(async () => {
    for (;;) if ((await big.stream.read(new Uint8Array(1))).done) break;
  }, /too large/);
  assert.equal(big.state.failure[0], 413);
  assert.equal(big.state.failure[1], 'payload-too-large');

  // A stream that never sends: its read fails after the idle bound.
  const never = uploads.bounded(new ReadableStream({ type: 'bytes', pull() { return new Promise(() => {}); } }), 50);
  await assert.rejects(never.stream.read(new Uint8Array(8)), /sent nothing/);
  assert.deepEqual(never.state.failure.slice(0, 2), [400, 'malformed-body']);
});

test('preview doors go to the key\'s node as open-preview, close-preview and list-previews; a malformed answer is failed', async () => {
  const { RemoteSubstrate } = await import('../src/nodes.js');
  const door = { port: 8000, token: 'abcdefghijklmnopqrstuvwx', url: 'http://10.0.0.2:8790/p/abcdefghijklmnopqrstuvwx/' };
  const calls = [];
  let answers = {};
  const node = {
    name: 'n1',
    async call(key, call, body) {
      calls.push([key, call, body]);
      return answers[call];
    },
  };
  const s = new RemoteSubstrate({ key: 'alpha', nodes: [node], placement: { get: () => 'n1' } });
  answers = { 'open-preview': door, 'close-preview': true, 'list-previews': [door] };
  assert.deepEqual(await s.openPreview('c1', 8000), door);
  assert.equal(await s.closePreview('c1', 8000), true);
  assert.deepEqual(await s.listPreviews('c1'), [door]);
  assert.deepEqual(calls, [
    ['alpha', 'open-preview', { container: 'c1', port: 8000 }],
    ['alpha', 'close-preview', { container: 'c1', port: 8000 }],
    ['alpha', 'list-previews', { container: 'c1' }],
  ]);
  for (const bad of [null, { port: 8000, token: 't' }, { port: '8000', token: 't', url: 'u' }]) {
    answers = { 'open-preview': bad, 'list-previews': [bad] };
    await assert.rejects(s.openPreview('c1', 8000), (e) => e.tag === 'failed');
    await assert.rejects(s.listPreviews('c1'), (e) => e.tag === 'failed');
  }
  answers = { 'list-previews': { not: 'a list' } };
  await assert.rejects(s.listPreviews('c1'), (e) => e.tag === 'failed');
  // An unplaced key has no container: nothing is asked.
  const none = new RemoteSubstrate({ key: 'beta', nodes: [node], placement: { get: () => undefined } });
  calls.length = 0;
  await assert.rejects(none.openPreview('c1', 8000), (e) => e.tag === 'invalid');
  assert.deepEqual(calls, []);
});

/** Nodes that answer each call from `answers[node][call]` (a value, or a thrown
 * substrate-error), recording [node, key, call, body]. */
function answeringNodes(names, answers, calls) {
  return names.map((name) => ({
    name,
    async call(key, call, body) {
      calls.push([name, key, call, body]);
      const a = answers[name]?.[call];
      if (a && typeof a === 'object' && 'tag' in a) throw a;
      return a;
    },
  }));
}

test('named snapshots go to the key\'s node as save-snapshot and drop-snapshot; an unplaced key drops nothing and asks no node', async () => {
  const { RemoteSubstrate } = await import('../src/nodes.js');
  const calls = [];
  const nodes = answeringNodes(['n1', 'n2'], { n2: { 'save-snapshot': null, 'drop-snapshot': true } }, calls);
  const s = new RemoteSubstrate({ key: 'alpha', nodes, placement: { get: () => 'n2' } });
  assert.equal(await s.saveSnapshot('c1', 'v1'), undefined);
  assert.equal(await s.dropSnapshot('alpha', 'v1'), true);
  assert.deepEqual(calls, [
    ['n2', 'alpha', 'save-snapshot', { container: 'c1', name: 'v1' }],
    ['n2', 'alpha', 'drop-snapshot', { name: 'v1' }],
  ]);
  await assert.rejects(s.dropSnapshot('beta', 'v1'), (e) => e.tag === 'invalid');
  calls.length = 0;
  const none = new RemoteSubstrate({ key: 'alpha', nodes, placement: { get: () => undefined } });
  assert.equal(await none.dropSnapshot('alpha', 'v1'), false);
  await assert.rejects(none.saveSnapshot('c1', 'v1'), (e) => e.tag === 'invalid');
  assert.deepEqual(calls, []);
});

test('a fork onto an unplaced key looks for the snapshot in the source\'s rendezvous order and places the key where it was made', async () => {
  const { RemoteSubstrate } = await import('../src/nodes.js');
  const names = ['n1', 'n2', 'n3'];
  const [first, second, third] = await order(names, 'src');
  const noSnapshot = { tag: 'invalid', val: 'src holds no snapshot named "v1"' };
  const run = async (answers) => {
    const calls = [];
    let placed;
    const s = new RemoteSubstrate({
      key: 'dst',
      nodes: answeringNodes(names, answers, calls),
      placement: { get: () => placed, set: (n) => (placed = n) },
    });
    let error;
    try {
      await s.forkSnapshot('src', 'v1', 'dst');
    } catch (e) {
      error = e;
    }
    for (const [, key, call, body] of calls) {
      assert.equal(key, 'dst', 'signed with the forked key');
      assert.equal(call, 'fork-snapshot');
      assert.deepEqual(body, { source: 'src', name: 'v1' });
    }
    return { calls: calls.map(([n]) => n), placed, error };
  };
  // The first in the source's order holds none; the second makes the copy: the key is
  // placed there, and the third is not asked.
  let r = await run({ [first]: { 'fork-snapshot': noSnapshot }, [second]: { 'fork-snapshot': null } });
  assert.deepEqual(r.calls, [first, second]);
  assert.equal(r.placed, second);
  assert.equal(r.error, undefined);
  // None holds it: their `invalid`, and no placement.
  const everywhere = Object.fromEntries(names.map((n) => [n, { 'fork-snapshot': noSnapshot }]));
  r = await run(everywhere);
  assert.deepEqual(r.calls, [first, second, third]);
  assert.equal(r.placed, undefined);
  assert.equal(r.error, noSnapshot);
  // A node that could not be asked may hold it: unreachable, not "no snapshot".
  const down = { tag: 'unreachable', val: 'node down' };
  r = await run({ ...everywhere, [second]: { 'fork-snapshot': down } });
  assert.deepEqual(r.calls, [first, second, third]);
  assert.equal(r.error, down);
  assert.equal(r.placed, undefined);
  // ...and the next one is asked after it.
  r = await run({ [first]: { 'fork-snapshot': down }, [second]: { 'fork-snapshot': null } });
  assert.deepEqual(r.calls, [first, second]);
  assert.equal(r.placed, second);
  // Any other refusal ends the search.
  const failed = { tag: 'failed', val: 'disk full' };
  r = await run({ [first]: { 'fork-snapshot': failed } });
  assert.deepEqual(r.calls, [first]);
  assert.equal(r.error, failed);
  assert.equal(r.placed, undefined);
});

test('a fork onto a placed key is made on its node only', async () => {
  const { RemoteSubstrate } = await import('../src/nodes.js');
  const calls = [];
  const noSnapshot = { tag: 'invalid', val: 'src holds no snapshot named "v1"' };
  const nodes = answeringNodes(['n1', 'n2'], { n1: { 'fork-snapshot': noSnapshot }, n2: { 'fork-snapshot': null } }, calls);
  const sets = [];
  const s = new RemoteSubstrate({ key: 'dst', nodes, placement: { get: () => 'n1', set: (n) => sets.push(n) } });
  await assert.rejects(s.forkSnapshot('src', 'v1', 'dst'), (e) => e === noSnapshot);
  assert.deepEqual(calls, [['n1', 'dst', 'fork-snapshot', { source: 'src', name: 'v1' }]]);
  assert.deepEqual(sets, []);
  await assert.rejects(s.forkSnapshot('src', 'v1', 'other'), (e) => e.tag === 'invalid');
});

// Batches (docs/NODE.md "Batches"): an opening `ensure` and `target.ensured`, in the mock's
// batchInOrder (host.js, and jspi-host.js for a run with its own I/O) and in
// RemoteSubstrate.batch (the node's `batch`, or a first `ensure` alone that places the key).
import { Mock } from '../src/mock.js';
import { batchInOrder } from '../src/batch.js';
import { NodeClient, RemoteSubstrate } from '../src/nodes.js';

const ENSURED = { tag: 'ensured' };
const grantOf = { rules: [], ask: false };
const cmdOf = (...argv) => ({ argv, cwd: '/workspace', env: [], stdin: new Uint8Array() });
const opening = (key, argv = ['echo', 'hi']) => [
  { tag: 'ensure', val: key },
  { tag: 'apply-grant', val: { container: ENSURED, grant: grantOf } },
  { tag: 'run', val: { container: ENSURED, cmd: cmdOf(...argv), timeoutMs: 1000n } },
];
const on = (c) => ({ tag: 'container', val: c });
const teardown = (t) => [
  { tag: 'kill-all', val: t },
  { tag: 'revoke-grant', val: t },
];
// The whole fence in one batch (a key with no declared process spending no approval).
const oneBatch = (key, argv) => [...opening(key, argv), ...teardown(ENSURED)];
const mockImports = (m, later = (v) => v) => ({
  ensure: (k) => later(m.ensure(k)),
  applyGrant: (c, g) => {
    m.applyGrant(c, 'fence-1', g);
    return later('fence-1');
  },
  run: (c, cmd, t) => later(m.run(c, cmd, t)),
  killAll: (c) => later(m.killAll(c)),
  revokeGrant: (c) => later(m.revokeGrant(c)),
});

test('named snapshots in a batch: save-snapshot on the ensured container, fork-snapshot and drop-snapshot on keys, as the Rust mock traces them', async () => {
  const m = new Mock();
  const imports = {
    ...mockImports(m),
    saveSnapshot: (c, name) => m.saveSnapshot(c, name),
    forkSnapshot: (source, name, key) => m.forkSnapshot(source, name, key),
    dropSnapshot: (key, name) => m.dropSnapshot(key, name),
  };
  let answers = batchInOrder(imports, [
    { tag: 'ensure', val: 'a' },
    { tag: 'save-snapshot', val: { container: ENSURED, name: 'v1' } },
  ]);
  assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [['ok', 'ensure'], ['ok', 'save-snapshot']]);
  answers = batchInOrder(imports, [{ tag: 'fork-snapshot', val: { source: 'a', name: 'v1', key: 'b' } }]);
  assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [['ok', 'fork-snapshot']]);
  assert.deepEqual(m.forkedFrom('b'), ['a', 'v1']);
  answers = batchInOrder(imports, [{ tag: 'fork-snapshot', val: { source: 'a', name: 'nope', key: 'c' } }]);
  assert.deepEqual(answers, [{ tag: 'err', val: { tag: 'invalid', val: 'a holds no snapshot named "nope"' } }]);
  answers = batchInOrder(imports, [
    { tag: 'drop-snapshot', val: { key: 'a', name: 'v1' } },
    { tag: 'drop-snapshot', val: { key: 'a', name: 'v1' } },
  ]);
  assert.deepEqual(answers.map((a) => a.val.val), [true, false]);
  assert.deepEqual(m.trace, [
    { op: 'ensure', target: 'a' },
    { op: 'save-snapshot', target: 'mock-c1' },
    { op: 'fork-snapshot', target: 'b' },
    { op: 'fork-snapshot', target: 'c' },
    { op: 'drop-snapshot', target: 'a' },
    { op: 'drop-snapshot', target: 'a' },
  ]);
});

test('a batch that opens with ensure names the ensured container, sync and async', async () => {
  for (const [how, later] of [['sync', (v) => v], ['async', (v) => Promise.resolve(v)]]) {
    const m = new Mock();
    const answers = await batchInOrder(mockImports(m, later), opening('k'));
    assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [['ok', 'ensure'], ['ok', 'apply-grant'], ['ok', 'run']], how);
    assert.equal(answers[0].val.val, 'mock-c1', how);
    assert.equal(new TextDecoder().decode(answers[2].val.val.stdout), 'hi\n', how);
    assert.deepEqual(m.trace, [
      { op: 'ensure', target: 'k' },
      { op: 'apply-grant', target: 'mock-c1' },
      { op: 'run', target: 'mock-c1' },
    ], how);
    // A container target is its id, as before.
    const t = await batchInOrder(mockImports(m, later), teardown(on('mock-c1')));
    assert.deepEqual(t.map((a) => a.val.tag), ['kill-all', 'revoke-grant'], how);
    // The sync imports answer synchronously (host.js's guest is not JSPI).
    if (how === 'sync') assert.ok(Array.isArray(batchInOrder(mockImports(m), opening('k'))));
  }
});

test('the whole fence in one batch: kill-all and revoke-grant on the ensured container too, sync and async', async () => {
  for (const [how, later] of [['sync', (v) => v], ['async', (v) => Promise.resolve(v)]]) {
    const m = new Mock();
    const answers = await batchInOrder(mockImports(m, later), oneBatch('k'));
    assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [
      ['ok', 'ensure'],
      ['ok', 'apply-grant'],
      ['ok', 'run'],
      ['ok', 'kill-all'],
      ['ok', 'revoke-grant'],
    ], how);
    assert.deepEqual(answers[4].val.val, { admitted: 0, denied: 0 }, how);
    assert.deepEqual(m.trace, [
      { op: 'ensure', target: 'k' },
      { op: 'apply-grant', target: 'mock-c1' },
      { op: 'run', target: 'mock-c1' },
      { op: 'kill-all', target: 'mock-c1' },
      { op: 'revoke-grant', target: 'mock-c1' },
    ], how);
    assert.equal(m.container('mock-c1').grant, null, `${how}: the grant is closed`);
  }
  // A kill-all that fails: the revoke after it is not made (the guest revokes alone).
  const m = new Mock();
  const imports = { ...mockImports(m), killAll: () => { throw { tag: 'failed', val: 'kill' }; } };
  const answers = batchInOrder(imports, oneBatch('k'));
  assert.deepEqual(answers.map((a) => a.tag), ['ok', 'ok', 'ok', 'err']);
  assert.deepEqual(answers[3].val, { tag: 'failed', val: 'kill' });
  assert.deepEqual(m.ops(), ['ensure', 'apply-grant', 'run']);
});

test('an ensure that fails makes nothing after it', async () => {
  const m = new Mock(0);
  const answers = batchInOrder(mockImports(m), opening('k'));
  assert.deepEqual(answers, [{ tag: 'err', val: { tag: 'over-capacity' } }]);
  assert.deepEqual(m.ops(), ['ensure']);
});

test('a batch naming ensured without opening with ensure, an ensure not first, or 17 calls is refused whole', () => {
  const [ensure, apply, run] = opening('k');
  const c1 = { tag: 'container', val: 'mock-c1' };
  const rows = [
    ['ensured without an ensure', [apply, run]],
    ['ensured after a kill-all', [{ tag: 'kill-all', val: on('mock-c1') }, run]],
    ['a kill-all on ensured without an ensure', [{ tag: 'kill-all', val: ENSURED }]],
    ['a revoke on ensured without an ensure', [{ tag: 'revoke-grant', val: ENSURED }]],
    ['an ensure second', [{ tag: 'apply-grant', val: { container: c1, grant: grantOf } }, ensure]],
    ['two ensures', [ensure, ensure]],
    ['17 calls', Array.from({ length: 17 }, () => ({ tag: 'kill-all', val: on('mock-c1') }))],
  ];
  for (const [what, calls] of rows) {
    const m = new Mock();
    m.ensure('k');
    m.clearTrace();
    assert.throws(() => batchInOrder(mockImports(m), calls), (e) => e.tag === 'invalid' && !(e instanceof Error), what);
    assert.deepEqual(m.ops(), [], `${what}: nothing made`);
  }
});

// A node as RemoteSubstrate reaches it: a NodeClient over a fake service binding that
// records each call's name and body and answers from `answer(call, body)`.
function fakeNode(name, answer) {
  const seen = [];
  const fetcher = {
    async fetch(url, init) {
      const call = new URL(url).pathname.slice('/node/v1/'.length);
      const body = JSON.parse(init.body);
      seen.push([call, body]);
      const a = answer(call, body);
      if (Array.isArray(a)) {
        const text = a.map((l) => `${JSON.stringify(l)}\n`).join('');
        return new Response(text, { headers: { 'content-type': 'application/x-ndjson' } });
      }
      return Response.json(a);
    },
  };
  return { node: new NodeClient({ name, fetcher, secret: SECRET }), seen };
}

const runOk = { exit_code: 0, stdout: '', stderr: '', timed_out: false, truncated: false, limits: [] };
const place = (name) => {
  let placed = name;
  return { get: () => placed, set: (n) => (placed = n) };
};

test('a placed key sends its ensure in the batch: {"ensure": {}} first, the empty container id for ensured', async () => {
  const { node, seen } = fakeNode('n1', () => [
    { answer: { ok: 'c-9' } },
    { answer: { ok: null } },
    { stdout: Buffer.from('hi\n').toString('base64') },
    { answer: { ok: runOk } },
  ]);
  const s = new RemoteSubstrate({ key: 'alpha', nodes: [node], placement: place('n1') });
  const answers = await s.batch(opening('alpha'));
  assert.equal(seen.length, 1);
  const [call, body] = seen[0];
  assert.equal(call, 'batch');
  assert.deepEqual(Object.keys(body.calls[0]), ['ensure']);
  assert.deepEqual(body.calls[0].ensure, {});
  assert.equal(body.calls[1]['apply-grant'].container, '');
  assert.deepEqual(body.calls[1]['apply-grant'].rules, []);
  assert.equal(body.calls[2].run.container, '');
  assert.deepEqual(body.calls[2].run.cmd.argv, ['echo', 'hi']);
  assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [['ok', 'ensure'], ['ok', 'apply-grant'], ['ok', 'run']]);
  assert.equal(answers[0].val.val, 'c-9');
  assert.equal(answers[1].val.val, body.calls[1]['apply-grant'].fence);
  assert.equal(new TextDecoder().decode(answers[2].val.val.stdout), 'hi\n');

  // An ensure's error answers that call: nothing after it was made.
  const { node: busy } = fakeNode('n1', () => [{ answer: { error: { kind: 'over-capacity', message: 'full' } } }]);
  const full = new RemoteSubstrate({ key: 'alpha', nodes: [busy], placement: place('n1') });
  assert.deepEqual(await full.batch(opening('alpha')), [{ tag: 'err', val: { tag: 'over-capacity' } }]);

  // A container target goes as its id, as before.
  const { node: n2, seen: seen2 } = fakeNode('n1', () => [{ answer: { ok: 2 } }, { answer: { ok: { admitted: 1, denied: 0 } } }]);
  const t = new RemoteSubstrate({ key: 'alpha', nodes: [n2], placement: place('n1') });
  await t.batch([
    { tag: 'apply-grant', val: { container: { tag: 'container', val: 'c-9' }, grant: grantOf } },
    { tag: 'run', val: { container: { tag: 'container', val: 'c-9' }, cmd: cmdOf('true'), timeoutMs: 5n } },
  ]);
  assert.equal(seen2[0][1].calls[0]['apply-grant'].container, 'c-9');
  assert.equal(seen2[0][1].calls[1].run.container, 'c-9');
});

test('the whole fence in one batch on the wire: kill-all and revoke-grant name the ensured container by ""', async () => {
  const { node, seen } = fakeNode('n1', () => [
    { answer: { ok: 'c-9' } },
    { answer: { ok: null } },
    { answer: { ok: runOk } },
    { answer: { ok: 1 } },
    { answer: { ok: { admitted: 2, denied: 1 } } },
  ]);
  const s = new RemoteSubstrate({ key: 'alpha', nodes: [node], placement: place('n1') });
  const answers = await s.batch(oneBatch('alpha', ['true']));
  assert.equal(seen.length, 1, 'one signed call');
  const wire = seen[0][1].calls;
  assert.deepEqual(wire.map((c) => Object.keys(c)[0]), ['ensure', 'apply-grant', 'run', 'kill-all', 'revoke-grant']);
  assert.deepEqual(wire[3], { 'kill-all': { container: '' } });
  assert.deepEqual(wire[4], { 'revoke-grant': { container: '' } });
  assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [
    ['ok', 'ensure'],
    ['ok', 'apply-grant'],
    ['ok', 'run'],
    ['ok', 'kill-all'],
    ['ok', 'revoke-grant'],
  ]);
  assert.equal(answers[3].val.val, 1);
  assert.deepEqual(answers[4].val.val, { admitted: 2, denied: 1 });

  // A container target goes as its id.
  const { node: n2, seen: seen2 } = fakeNode('n1', () => [{ answer: { ok: 0 } }, { answer: { ok: { admitted: 0, denied: 0 } } }]);
  const t = new RemoteSubstrate({ key: 'alpha', nodes: [n2], placement: place('n1') });
  await t.batch(teardown(on('c-9')));
  assert.deepEqual(seen2[0][1].calls, [{ 'kill-all': { container: 'c-9' } }, { 'revoke-grant': { container: 'c-9' } }]);

  // An unplaced key: its ensure alone, then the rest naming the container it answered.
  const u = fakeNode('n1', (call) =>
    call === 'ensure'
      ? { ok: 'c-4' }
      : [{ answer: { ok: null } }, { answer: { ok: runOk } }, { answer: { ok: 0 } }, { answer: { ok: { admitted: 0, denied: 0 } } }],
  );
  const placement = place(undefined);
  const us = new RemoteSubstrate({ key: 'alpha', nodes: [u.node], placement });
  const ua = await us.batch(oneBatch('alpha', ['true']));
  assert.deepEqual(u.seen.map(([c]) => c), ['ensure', 'batch']);
  const rest = u.seen[1][1].calls;
  assert.deepEqual(rest.map((c) => Object.keys(c)[0]), ['apply-grant', 'run', 'kill-all', 'revoke-grant']);
  assert.deepEqual(rest.map((c) => Object.values(c)[0].container), ['c-4', 'c-4', 'c-4', 'c-4']);
  assert.deepEqual(ua.map((a) => a.val.tag), ['ensure', 'apply-grant', 'run', 'kill-all', 'revoke-grant']);
  assert.equal(ua[0].val.val, 'c-4');
  assert.equal(placement.get(), 'n1');
});

test('an unplaced key is placed by its ensure alone; the rest goes as a batch to that node, naming its container', async () => {
  const [first, second] = await order(['n1', 'n2'], 'alpha');
  const nodes = {};
  // The first in rendezvous order is full: the key is placed on the second.
  nodes[first] = fakeNode(first, (call) =>
    call === 'ensure' ? { error: { kind: 'over-capacity', message: 'full' } } : assert.fail(`${first}: ${call}`),
  );
  nodes[second] = fakeNode(second, (call) =>
    call === 'ensure' ? { ok: 'c-3' } : [{ answer: { ok: null } }, { answer: { ok: runOk } }],
  );
  const placement = place(undefined);
  const s = new RemoteSubstrate({ key: 'alpha', nodes: [nodes.n1.node, nodes.n2.node], placement });
  const answers = await s.batch(opening('alpha'));
  assert.equal(placement.get(), second, 'the key is placed where its ensure answered');
  assert.deepEqual(nodes[first].seen.map(([c]) => c), ['ensure']);
  assert.deepEqual(nodes[second].seen.map(([c]) => c), ['ensure', 'batch']);
  assert.deepEqual(nodes[second].seen[0][1], {});
  const wire = nodes[second].seen[1][1].calls;
  assert.deepEqual(wire.map((c) => Object.keys(c)[0]), ['apply-grant', 'run']);
  assert.equal(wire[0]['apply-grant'].container, 'c-3');
  assert.equal(wire[1].run.container, 'c-3');
  assert.deepEqual(answers.map((a) => [a.tag, a.val.tag]), [['ok', 'ensure'], ['ok', 'apply-grant'], ['ok', 'run']]);
  assert.equal(answers[0].val.val, 'c-3', 'the container as the plain ensure answers it');

  // Every node full: the ensure's error is the batch's one answer, nothing else is sent.
  const a = fakeNode('n1', () => ({ error: { kind: 'over-capacity', message: 'full' } }));
  const b = fakeNode('n2', () => ({ error: { kind: 'over-capacity', message: 'full' } }));
  const none = place(undefined);
  const full = new RemoteSubstrate({ key: 'alpha', nodes: [a.node, b.node], placement: none });
  assert.deepEqual(await full.batch(opening('alpha')), [{ tag: 'err', val: { tag: 'over-capacity' } }]);
  assert.deepEqual([...a.seen, ...b.seen].map(([c]) => c), ['ensure', 'ensure']);
  assert.equal(none.get(), undefined);
});

test('a remote batch refused whole sends nothing', async () => {
  const { node, seen } = fakeNode('n1', () => assert.fail('nothing is sent'));
  const s = new RemoteSubstrate({ key: 'alpha', nodes: [node], placement: place('n1') });
  const [ensure, apply, run] = opening('alpha');
  for (const [what, calls] of [
    ['ensured without an ensure', [apply, run]],
    ['an ensure not first', [{ tag: 'kill-all', val: on('c') }, ensure]],
    ['17 calls', Array.from({ length: 17 }, () => ({ tag: 'kill-all', val: on('c') }))],
    ['a revoke on ensured without an ensure', [{ tag: 'revoke-grant', val: ENSURED }]],
    ['another key\'s ensure', opening('beta')],
    ['an empty container id', [{ tag: 'run', val: { container: { tag: 'container', val: '' }, cmd: cmdOf('true'), timeoutMs: 1n } }]],
    ['a kill-all on an empty container id', [{ tag: 'kill-all', val: on('') }]],
    ['a revoke on an empty container id', [{ tag: 'revoke-grant', val: on('') }]],
    ['an empty container id after an ensure', [...opening('alpha'), ...teardown(on(''))]],
  ]) {
    await assert.rejects(s.batch(calls), (e) => e.tag === 'invalid', what);
  }
  const unplaced = new RemoteSubstrate({ key: 'alpha', nodes: [node], placement: place(undefined) });
  await assert.rejects(unplaced.batch([ensure, ensure]), (e) => e.tag === 'invalid');
  assert.deepEqual(seen, []);
});

// jspi-host.js's record of open fences around a batch, without workerd: the JSPI
// bindings and their core modules are stubbed (a loader hook), so a "guest" here is a
// script over the import object, and the runtime's settle after a trap is the real one.
import { register } from 'node:module';

const stubHooks = `
export async function resolve(spec, ctx, next) {
  if (spec === './jspi/stockade.js') {
    return { url: 'data:text/javascript,export const instantiate = (...a) => globalThis.__jspiGuest(...a);', shortCircuit: true };
  }
  if (spec.startsWith('./jspi/') && spec.endsWith('.wasm')) return { url: 'data:text/javascript,export default {};', shortCircuit: true };
  return next(spec, ctx);
}`;
register(`data:text/javascript,${encodeURIComponent(stubHooks)}`, import.meta.url);
const { JspiRuntime } = await import('../src/jspi-host.js');

/** A runtime whose guest's `exec` is `script(substrateImports)`, over a substrate that
 * records its calls; `batch` answers with `onBatch(calls)`. */
function scripted(script, { onBatch, ...opts }) {
  const current = 'current' in opts ? opts.current : 'c-7';
  const made = [];
  const substrate = {
    batch: async (calls) => onBatch(calls),
    current: async (key) => {
      made.push(['current', key]);
      if (opts.currentFails) throw { tag: 'unreachable', val: 'node down' };
      return current;
    },
    killAll: async (c) => (made.push(['kill-all', c]), 0),
    revokeGrant: async (c) => (made.push(['revoke-grant', c]), { admitted: 0, denied: 0 }),
    killProcess: async (c, id) => (made.push(['kill-process', c, id]), 0),
  };
  globalThis.__jspiGuest = async (_cores, imports) => ({
    facade: { exec: (key) => script(imports['stockade:sandbox/substrate'], key) },
  });
  return { rt: new JspiRuntime({ substrate, store: {} }), made };
}

const trap = () => {
  throw new Error('unreachable executed');
};

test('jspi-host: an unanswered batch on the ensured container is settled through current', async () => {
  const lost = () => Promise.reject({ tag: 'unreachable', val: 'no answer' });
  // The guest trapped before it asked `current`: the settle asks, then tears down and revokes.
  let r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    trap();
  }, { onBatch: lost });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['current', 'alpha'], ['kill-all', 'c-7'], ['revoke-grant', 'c-7']]);

  // The guest asked `current` (the fence is now on a known container), then trapped.
  r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    assert.equal(await sub.current(key), 'c-7');
    trap();
  }, { onBatch: lost });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['current', 'alpha'], ['kill-all', 'c-7'], ['revoke-grant', 'c-7']]);

  // The guest learnt it and tore it down itself: nothing is left to settle.
  r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    const c = await sub.current(key);
    await sub.revokeGrant(c);
    return 0;
  }, { onBatch: lost });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, [['current', 'alpha'], ['revoke-grant', 'c-7']]);

  // The key has no container: nothing can be open, nothing is torn down.
  r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    trap();
  }, { onBatch: lost, current: undefined });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['current', 'alpha']]);

  // `current` fails too: nothing names the container; the node's grant lease closes it.
  r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    trap();
  }, { onBatch: lost, currentFails: true });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['current', 'alpha']]);
});

test('jspi-host: an answered batch records its fence on the container the ensure answered', async () => {
  const ok = (tag, val) => ({ tag: 'ok', val: { tag, val } });
  const r = scripted(async (sub, key) => {
    const a = await sub.batch(opening(key));
    assert.equal(a[0].val.val, 'c-5');
    trap();
  }, { onBatch: () => [ok('ensure', 'c-5'), ok('apply-grant', 'f'), ok('run', {})] });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['kill-all', 'c-5'], ['revoke-grant', 'c-5']]);

  // The teardown's batch revoked it: nothing is left.
  const done = scripted(async (sub, key) => {
    await sub.batch(opening(key));
    await sub.batch(teardown(on('c-5')));
    return 0;
  }, {
    onBatch: (calls) =>
      calls[0].tag === 'ensure'
        ? [ok('ensure', 'c-5'), ok('apply-grant', 'f'), ok('run', {})]
        : [ok('kill-all', 0), ok('revoke-grant', { admitted: 0, denied: 0 })],
  });
  assert.equal(await done.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(done.made, []);

  // A batch refused whole made nothing: nothing is recorded, nothing settled.
  const refused = scripted(async (sub, key) => {
    const [, apply, run] = opening(key);
    await assert.rejects(sub.batch([apply, run]), (e) => e.tag === 'invalid');
    trap();
  }, { onBatch: () => assert.fail('not sent') });
  await assert.rejects(refused.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(refused.made, []);
});

test('jspi-host: the whole fence in one batch; its revoke closes the ensured container\'s fence', async () => {
  const ok = (tag, val) => ({ tag: 'ok', val: { tag, val } });
  const counts = { admitted: 0, denied: 0 };
  const began = [ok('ensure', 'c-5'), ok('apply-grant', 'f'), ok('run', {})];
  const exec = (check = () => {}) => async (sub, key) => {
    check(await sub.batch(oneBatch(key)));
    return 0;
  };

  // Every call answered: the revoke on the ensured container closed it, nothing is left.
  let r = scripted(exec((a) => assert.equal(a.length, 5)), {
    onBatch: () => [...began, ok('kill-all', 0), ok('revoke-grant', counts)],
  });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, []);

  // The revoke answered unreachable: the fence is closed or closes with its container
  // (as a revoke alone): nothing is left.
  r = scripted(exec(), {
    onBatch: () => [...began, ok('kill-all', 0), { tag: 'err', val: { tag: 'unreachable', val: 'gone' } }],
  });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, []);

  // The revoke failed otherwise: the fence is still open, the settle tears it down.
  r = scripted(exec(), {
    onBatch: () => [...began, ok('kill-all', 0), { tag: 'err', val: { tag: 'failed', val: 'revoke' } }],
  });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, [['kill-all', 'c-5'], ['revoke-grant', 'c-5']]);

  // The kill-all failed, so no revoke was made: open, settled.
  r = scripted(exec(), { onBatch: () => [...began, { tag: 'err', val: { tag: 'failed', val: 'kill' } }] });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, [['kill-all', 'c-5'], ['revoke-grant', 'c-5']]);

  // A revoke on the ensured container closes only that one: another's fence stays open.
  r = scripted(async (sub, key) => {
    await sub.batch([...opening(key), { tag: 'apply-grant', val: { container: on('c-8'), grant: grantOf } }]);
    await sub.batch([{ tag: 'ensure', val: key }, { tag: 'revoke-grant', val: ENSURED }]);
    return 0;
  }, {
    onBatch: (calls) =>
      calls.length === 4 ? [...began, ok('apply-grant', 'g')] : [ok('ensure', 'c-5'), ok('revoke-grant', counts)],
  });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, [['kill-all', 'c-8'], ['revoke-grant', 'c-8']]);

  // No answer at all: the key's container is learnt by current and torn down.
  r = scripted(async (sub, key) => {
    await sub.batch(oneBatch(key)).catch(() => {});
    trap();
  }, { onBatch: () => Promise.reject({ tag: 'unreachable', val: 'no answer' }) });
  await assert.rejects(r.rt.call('exec', 'alpha', {}), (e) => e.kind === 'trap');
  assert.deepEqual(r.made, [['current', 'alpha'], ['kill-all', 'c-7'], ['revoke-grant', 'c-7']]);
});

test('jspi-host: a call alone is a batch of one made as the named call, with its bookkeeping', async () => {
  const lost = () => Promise.reject({ tag: 'unreachable', val: 'no answer' });
  // The node's batch gets no answer: a call alone must not go there. `current` as a
  // batch of one is made as the named call and resolves the unanswered batch's fence
  // onto its container, as `current` alone does: the settle tears down c-7 without
  // asking `current` again.
  const r = scripted(async (sub, key) => {
    await sub.batch(opening(key)).catch(() => {});
    const a = await sub.batch([{ tag: 'current', val: key }]);
    assert.deepEqual(a, [{ tag: 'ok', val: { tag: 'current', val: 'c-7' } }]);
    const k = await sub.batch([{ tag: 'kill-process', val: { container: on('c-7'), id: 'p-1' } }]);
    assert.deepEqual(k, [{ tag: 'ok', val: { tag: 'kill-process', val: 0 } }]);
    return 0;
  }, { onBatch: lost });
  assert.equal(await r.rt.call('exec', 'alpha', {}), 0);
  assert.deepEqual(r.made, [
    ['current', 'alpha'],
    ['kill-process', 'c-7', 'p-1'],
    ['kill-all', 'c-7'],
    ['revoke-grant', 'c-7'],
  ]);
});
