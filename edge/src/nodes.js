// Nodes from the Worker: signed calls over a service binding (docs/NODE.md), and the
// guest's `substrate` imports as those calls for one key (the Durable Object's).
//
// * NodeClient.call: `POST https://stockade-node/node/v1/{call}` through the node's
//   `external` service binding (workerd pins the node's certificate: it is the only
//   trusted certificate, and its name is `stockade-node`). Every logical call has one
//   idempotency key; it is retried (freshly signed) only when no answer arrived, at
//   most 3 attempts. An answer is `{"ok": …}` or `{"error": {kind, message}}`; a 401,
//   403 or 400 is a typed `failed`/`invalid` error, never trusted as data.
// * NodeClient.run: the NDJSON lines of `run`, each handed to `onLine` as it arrives.
// * RemoteSubstrate: the WIT `substrate` calls for one key, async (the guest is
//   transpiled with JSPI: every substrate import suspends the guest while its fetch
//   is pending). A typed failure is thrown as the WIT `substrate-error` (a plain
//   object `{tag, val}`), as jco expects of a `result` import.

import { HEADERS, signedHeaders } from './sign.js';
import { order } from './placement.js';
import { BatchPlan, checkBatch, targetOf } from './batch.js';

export const PREFIX = '/node/v1/';
const ATTEMPTS = 3;
const B64 = {
  enc(bytes) {
    let s = '';
    const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes ?? []);
    for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
    return btoa(s);
  },
  dec(text) {
    const s = atob(text ?? '');
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  },
};
export { B64 };

/** A WIT `substrate-error` value. */
export function substrateError(kind, message = '') {
  switch (kind) {
    case 'unreachable':
      return { tag: 'unreachable', val: message };
    case 'over-capacity':
      return { tag: 'over-capacity' };
    case 'invalid':
      return { tag: 'invalid', val: message };
    default:
      return { tag: 'failed', val: message };
  }
}

/** One node: its name, its service binding (a Fetcher) and its request secret. */
export class NodeClient {
  constructor({ name, fetcher, secret, log = () => {} }) {
    this.name = name;
    this.fetcher = fetcher;
    this.secret = secret;
    this.log = log;
  }

  /** One signed POST, retried only when no answer arrived; returns the Response. */
  async post(key, call, body, idempotency = crypto.randomUUID()) {
    const path = `${PREFIX}${call}`;
    const text = JSON.stringify(body ?? {});
    let last;
    for (let attempt = 1; attempt <= ATTEMPTS; attempt++) {
      const headers = await signedHeaders(this.secret, { method: 'POST', path, key, idempotency, body: text });
      try {
        return await this.fetcher.fetch(`https://stockade-node${path}`, {
          method: 'POST',
          headers: { ...headers, 'content-type': 'application/json' },
          body: text,
        });
      } catch (e) {
        last = e;
        this.log('warn', 'node call got no answer', [
          ['node', this.name],
          ['call', call],
          ['attempt', String(attempt)],
          ['error', String(e?.message ?? e)],
        ]);
      }
    }
    throw substrateError('unreachable', `node ${this.name}: ${last?.message ?? last}`);
  }

  /** A call answered `{"ok": …}` (returned) or `{"error": …}` (thrown, typed). */
  async call(key, call, body) {
    const r = await this.post(key, call, body);
    if (r.status === 401 || r.status === 403) {
      await r.body?.cancel();
      if (r.status === 401) throw substrateError('failed', `node ${this.name} refused the signature (401)`);
      throw substrateError('invalid', `node ${this.name}: not this key's container (403)`);
    }
    let v;
    try {
      v = await r.json();
    } catch {
      throw substrateError('failed', `node ${this.name}: ${call}: HTTP ${r.status}, not JSON`);
    }
    if (v && typeof v === 'object' && 'error' in v) {
      throw substrateError(v.error?.kind, String(v.error?.message ?? ''));
    }
    if (r.status !== 200 || !v || typeof v !== 'object' || !('ok' in v)) {
      throw substrateError('failed', `node ${this.name}: ${call}: HTTP ${r.status}`);
    }
    return v.ok;
  }

  /** `run`: hands each NDJSON line to `onLine`; returns the `result` line's value or
   * throws its `error`. `onStarted` is called when the node accepted the run. */
  async run(key, body, opts = {}) {
    return this.runAnswer(await this.post(key, 'run', body), opts);
  }

  /**
   * `run-stream` (docs/NODE.md "Streamed stdin"): `head` signed, then `source` (a
   * byte source `{read(view), cancel()}`, upload.js `bounded`, read as the node takes
   * it) as tagged frames. Never retried (a stream cannot be sent twice). Answered as
   * `run`.
   */
  async runStream(key, head, source, opts = {}) {
    const path = `${PREFIX}run-stream`;
    const text = JSON.stringify(head);
    const headers = await signedHeaders(this.secret, {
      method: 'POST',
      path,
      key,
      idempotency: crypto.randomUUID(),
      body: text,
    });
    const framer = new Framer(this.secret, headers[HEADERS.signature]);
    // workerd's native pipe: a write completes once the fetch has taken the bytes, so
    // one read buffer serves the whole body (`source` is upload.js `bounded`'s byte
    // source: no garbage the size of the upload). Elsewhere a standard stream, and a
    // copy of each read.
    const native = typeof IdentityTransformStream === 'function';
    const { readable, writable } = native ? new IdentityTransformStream() : new TransformStream();
    const writer = writable.getWriter();
    // The body: the head line, then each chunk's frames, then the end frame; a
    // source that fails aborts it (no end frame: the node refuses the stream).
    const pump = (async () => {
      try {
        await writer.write(new TextEncoder().encode(`${text}\n`));
        let buf = new ArrayBuffer(FRAME);
        for (;;) {
          const { value, done } = await source.read(new Uint8Array(buf));
          if (done) break;
          for (const p of await framer.frames(native ? value : value.slice())) await writer.write(p);
          buf = value.buffer.byteLength >= FRAME ? value.buffer : new ArrayBuffer(FRAME);
        }
        for (const p of await framer.end()) if (p.length) await writer.write(p);
        await writer.close();
      } catch (e) {
        source.cancel(e);
        writer.abort(e).catch(() => {});
      }
    })();
    let r;
    try {
      r = await this.fetcher.fetch(`https://stockade-node${path}`, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/x-ndjson' },
        body: readable,
      });
    } catch (e) {
      writer.abort(e).catch(() => {});
      throw substrateError('unreachable', `node ${this.name}: run-stream: ${e?.message ?? e}`);
    }
    try {
      return await this.runAnswer(r, opts);
    } finally {
      source.cancel();
      await pump;
    }
  }

  /**
   * `run-pty` (docs/NODE.md "Terminals"): a WebSocket to the node through its service
   * binding (a fetch with `Upgrade: websocket`; workerd pins the node's certificate as
   * for every call), the head signed (method GET, the head's JSON as the body) and sent
   * base64 in `x-stockade-head`. `term` is {attach(sink), output(bytes)}: `attach`
   * hands it {data(bytes), resize(rows, cols)}, each sent as a sealed frame (Sealer), in
   * order; the node's binary messages go to `output`. An "alive" frame after a second
   * of silence; no message from the node for three heartbeats is `unreachable`.
   * Returns the `result` line's value or throws its `error`. The caller gone (`signal`)
   * closes the socket (the node abandons the run) and answers exit -9, as the Rust
   * runtime's caller-gone run does (the guest's teardown then kills the tree).
   */
  async runPty(key, head, term, { heartbeatMs = 1000, signal } = {}) {
    const gone = { exit_code: -9, stdout: '', stderr: '', timed_out: false, truncated: false, limits: [] };
    if (signal?.aborted) return gone;
    const path = `${PREFIX}run-pty`;
    const text = JSON.stringify(head);
    const headers = await signedHeaders(this.secret, { method: 'GET', path, key, body: text });
    let r;
    try {
      r = await this.fetcher.fetch(`https://stockade-node${path}`, {
        headers: { ...headers, [PTY_HEAD]: B64.enc(new TextEncoder().encode(text)), upgrade: 'websocket' },
      });
    } catch (e) {
      throw substrateError('unreachable', `node ${this.name}: run-pty: ${e?.message ?? e}`);
    }
    const ws = r.webSocket;
    if (r.status !== 101 || !ws) {
      let v;
      try {
        v = await r.json();
      } catch {
        v = undefined;
      }
      const why = String(v?.error?.message ?? `HTTP ${r.status}`);
      if (r.status === 401) throw substrateError('failed', `node ${this.name} refused the signature (401): ${why}`);
      if (r.status === 403) throw substrateError('invalid', `node ${this.name}: not this key's container (403)`);
      if (r.status === 400 || r.status === 413) throw substrateError('invalid', `node ${this.name}: run-pty: ${why}`);
      throw substrateError(v?.error?.kind ?? 'failed', `node ${this.name}: run-pty: ${why}`);
    }
    ws.accept();
    const sealer = new Sealer(this.secret, headers[HEADERS.signature]);
    let chain = Promise.resolve();
    let lastSent = Date.now();
    // Frames leave in the order they were asked for (each is sealed asynchronously).
    const send = (make) => {
      chain = chain
        .then(async () => {
          ws.send(await make());
          lastSent = Date.now();
        })
        .catch(() => {});
    };
    return await new Promise((resolve, reject) => {
      let done = false;
      let timer;
      const silence = 3 * heartbeatMs + 1000;
      const alive = setInterval(() => {
        if (Date.now() - lastSent >= PTY_ALIVE_MS) send(() => sealer.alive());
      }, PTY_ALIVE_MS);
      const finish = (f) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        clearInterval(alive);
        signal?.removeEventListener('abort', away);
        try {
          ws.close(1000, 'done');
        } catch {
          // closed already
        }
        f();
      };
      const arm = () => {
        clearTimeout(timer);
        timer = setTimeout(
          () => finish(() => reject(substrateError('unreachable', `node ${this.name}: run-pty: silent for ${silence} ms`))),
          silence,
        );
      };
      const away = () => finish(() => resolve(gone));
      signal?.addEventListener('abort', away, { once: true });
      arm();
      ws.addEventListener('message', (ev) => {
        if (done) return;
        arm();
        if (typeof ev.data !== 'string') {
          term.output(new Uint8Array(ev.data));
          return;
        }
        let v;
        try {
          v = JSON.parse(ev.data);
        } catch {
          finish(() => reject(substrateError('failed', `node ${this.name}: run-pty: a line that is not JSON`)));
          return;
        }
        if (v && 'result' in v) finish(() => resolve(v.result));
        else if (v && 'error' in v) finish(() => reject(substrateError(v.error?.kind, String(v.error?.message ?? ''))));
      });
      const closed = () =>
        finish(() => reject(substrateError('unreachable', `node ${this.name}: run-pty: the session closed without a result`)));
      ws.addEventListener('close', closed);
      ws.addEventListener('error', closed);
      term.attach({
        data: (bytes) => {
          for (let i = 0; i < bytes.length; i += PTY_MAX_INPUT) {
            const part = bytes.slice(i, i + PTY_MAX_INPUT);
            send(() => sealer.seal(0, part));
          }
        },
        resize: (rows, cols) => send(() => sealer.resize(rows, cols)),
      });
    });
  }

  /** A `run` or `run-stream` answer: its lines to `onLine`, its result or error. */
  async runAnswer(r, { onLine = () => {}, onStarted = () => {}, onAnswer, heartbeatMs = 1000, signal } = {}) {
    const type = r.headers.get('content-type') ?? '';
    if (r.status !== 200 || !type.includes('ndjson')) {
      let v;
      try {
        v = await r.json();
      } catch {
        v = undefined;
      }
      if (v?.error) throw substrateError(v.error.kind, String(v.error.message ?? ''));
      throw substrateError('failed', `node ${this.name}: run: HTTP ${r.status}`);
    }
    onStarted();
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    let outcome;
    // Three heartbeats without a line: the node is unreachable.
    const silence = 3 * heartbeatMs + 1000;
    // The caller went away (a live stream's client): the run is given up, so the
    // guest tears its fence down; the node ends a run whose front hung up.
    const aborted = new Promise((_, reject) => {
      const gone = () => reject(substrateError('failed', 'the client went away'));
      if (signal?.aborted) gone();
      signal?.addEventListener('abort', gone, { once: true });
    });
    aborted.catch(() => {});
    for (;;) {
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(substrateError('unreachable', `node ${this.name}: run: silent`)), silence);
      });
      let chunk;
      try {
        chunk = await Promise.race([reader.read(), timeout, aborted]);
      } catch (e) {
        reader.cancel().catch(() => {});
        if (e?.tag) throw e;
        throw substrateError('unreachable', `node ${this.name}: run: ${e?.message ?? e}`);
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) break;
      buf += dec.decode(chunk.value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        let v;
        try {
          v = JSON.parse(line);
        } catch {
          throw substrateError('failed', `node ${this.name}: run: a line that is not JSON`);
        }
        // A batch's answer: one `answer` line per call made, in order.
        if (onAnswer && 'answer' in v) onAnswer(v.answer);
        else if ('result' in v) outcome = { result: v.result };
        else if ('error' in v) outcome = { error: v.error };
        else onLine(v);
      }
    }
    if (onAnswer) return undefined;
    if (outcome?.result) return outcome.result;
    if (outcome?.error) throw substrateError(outcome.error.kind, String(outcome.error.message ?? ''));
    throw substrateError('unreachable', `node ${this.name}: run: the answer ended without a result`);
  }
}

const FRAME = 1 << 20;

/** `run-pty`'s head header, the most bytes typed one frame carries, and how often a
 * silent front says it is there (host/node-protocol/src/pty.rs). */
const PTY_HEAD = 'x-stockade-head';
const PTY_MAX_INPUT = 64 * 1024;
const PTY_ALIVE_MS = 1000;

/** Seals a terminal session's frames for the upgrade signed `signature`
 * (host/node-protocol/src/pty.rs: kind u8, payload, then HMAC-SHA256 over the domain, the
 * signature, "\n", seq u64 BE, kind, len u32 BE and SHA-256(payload)). Each frame's
 * seq is taken when `seal` is called: call it in the order the frames are sent. */
export class Sealer {
  constructor(secret, signature) {
    this.key = crypto.subtle.importKey('raw', new TextEncoder().encode(secret.trim()), { name: 'HMAC', hash: 'SHA-256' }, false, [
      'sign',
    ]);
    this.prefix = new TextEncoder().encode(`stockade-pty-v1\n${signature}\n`);
    this.seq = 0n;
  }

  /** One frame: kind, payload, tag. */
  async seal(kind, payload) {
    const seq = this.seq;
    this.seq += 1n;
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', payload));
    const msg = new Uint8Array(this.prefix.length + 13 + 32);
    msg.set(this.prefix, 0);
    const v = new DataView(msg.buffer, this.prefix.length, 13);
    v.setBigUint64(0, seq);
    v.setUint8(8, kind);
    v.setUint32(9, payload.length);
    msg.set(digest, this.prefix.length + 13);
    const tag = new Uint8Array(await crypto.subtle.sign('HMAC', await this.key, msg));
    const out = new Uint8Array(1 + payload.length + 32);
    out[0] = kind;
    out.set(payload, 1);
    out.set(tag, 1 + payload.length);
    return out;
  }

  resize(rows, cols) {
    const p = new Uint8Array(4);
    new DataView(p.buffer).setUint16(0, rows);
    new DataView(p.buffer).setUint16(2, cols);
    return this.seal(1, p);
  }

  alive() {
    return this.seal(2, new Uint8Array());
  }
}

/** Frames a `run-stream`'s stdin for the request signed `signature` (host/node-protocol/src/
 * stream.rs: len u32 BE, data, HMAC-SHA256 over the domain, the signature, "\n", seq
 * u64 BE, len u32 BE and SHA-256(data); a frame of length 0 ends the stream). A frame
 * is three pieces (its length, the data as given, its tag): no copy of the data is
 * made in JavaScript, so an upload leaves no garbage the size of the upload. */
export class Framer {
  constructor(secret, signature) {
    this.key = crypto.subtle.importKey('raw', new TextEncoder().encode(secret.trim()), { name: 'HMAC', hash: 'SHA-256' }, false, [
      'sign',
    ]);
    this.prefix = new TextEncoder().encode(`stockade-stream-v1\n${signature}\n`);
    this.seq = 0n;
  }

  /** One frame of `data` (at most 1 MiB) as [length, data, tag]. */
  async frame(data) {
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', data));
    const msg = new Uint8Array(this.prefix.length + 12 + 32);
    msg.set(this.prefix, 0);
    const v = new DataView(msg.buffer, this.prefix.length, 12);
    v.setBigUint64(0, this.seq);
    v.setUint32(8, data.length);
    msg.set(digest, this.prefix.length + 12);
    this.seq += 1n;
    const tag = new Uint8Array(await crypto.subtle.sign('HMAC', await this.key, msg));
    const len = new Uint8Array(4);
    new DataView(len.buffer).setUint32(0, data.length);
    return [len, data, tag];
  }

  /** `data`'s frames' pieces, in order (at most 1 MiB of data a frame; none for empty data). */
  async frames(data) {
    const out = [];
    for (let i = 0; i < data.length; i += FRAME) out.push(...(await this.frame(data.subarray(i, i + FRAME))));
    return out;
  }

  /** The end frame's pieces. */
  end() {
    return this.frame(new Uint8Array());
  }
}

/** The nodes of the deployment from the Worker's env: `NODES` (JSON: [{name, service,
 * secret}], `service` and `secret` naming bindings). */
export function nodesFromEnv(env, log) {
  let list = env.NODES;
  if (typeof list === 'string') list = JSON.parse(list);
  if (!Array.isArray(list) || list.length === 0) throw new Error('NODES: no nodes configured');
  return list.map(({ name, service, secret }) => {
    const fetcher = env[service];
    const s = env[secret];
    if (!fetcher || typeof s !== 'string') throw new Error(`NODES: node ${name}: binding ${service} or ${secret} missing`);
    return new NodeClient({ name, fetcher, secret: s.trim(), log });
  });
}

const LIMITS = new Set(['pids', 'memory', 'disk']);
const REASONS = new Set([
  'no-grant',
  'no-rule',
  'method',
  'path',
  'ambiguous-path',
  'needs-interception',
  'private-target',
  'resolve-failed',
  'detached',
  'refused-by-approver',
  'ask-timeout',
  'ask-full',
]);

/**
 * The WIT `substrate` for one key, over the nodes. `placement` is {get(), set(name)}
 * (the Durable Object's storage); `output` receives {stream, bytes} of a run as it
 * arrives (the live stream), `onRunStarted` when a node accepted a run.
 */
export class RemoteSubstrate {
  constructor({ key, nodes, placement, log = () => {}, heartbeatMs = 1000 }) {
    this.key = key;
    this.nodes = new Map(nodes.map((n) => [n.name, n]));
    this.placement = placement;
    this.log = log;
    this.heartbeatMs = heartbeatMs;
    this.output = null;
    this.onRunStarted = null;
    this.signal = undefined;
    // The next run's stdin as a stream (an upload: edge/src/upload.js), taken by it:
    // {stream, check (run-stream's `upload`), onVerdict (the node's `upload` line)}.
    this.stdin = undefined;
    // The next run's terminal (`GET …/pty`: sandbox.js), taken by it: the run goes as
    // the node's `run-pty`, its I/O the terminal's.
    this.pty = undefined;
  }

  placed() {
    const name = this.placement.get();
    if (!name) return undefined;
    const n = this.nodes.get(name);
    if (!n) throw substrateError('unreachable', `key placed on node ${name}, which is not configured`);
    return n;
  }

  checkKey(key) {
    if (key !== this.key) throw substrateError('invalid', 'a call for another key');
  }

  node() {
    const n = this.placed();
    if (!n) throw substrateError('invalid', 'no container: the key is not placed');
    return n;
  }

  async ensure(key) {
    this.checkKey(key);
    const placed = this.placed();
    if (placed) return placed.call(key, 'ensure', {});
    // A new key: rendezvous order, the next on over-capacity or unreachable.
    let last;
    for (const name of await order([...this.nodes.keys()], key)) {
      const n = this.nodes.get(name);
      try {
        const id = await n.call(key, 'ensure', {});
        this.placement.set(name);
        this.log('info', 'key placed', [
          ['key', key],
          ['node', name],
        ]);
        return id;
      } catch (e) {
        if (e?.tag !== 'over-capacity' && e?.tag !== 'unreachable') throw e;
        last = e;
      }
    }
    throw last ?? substrateError('unreachable', 'no nodes');
  }

  async current(key) {
    this.checkKey(key);
    const n = this.placed();
    if (!n) return undefined;
    return (await n.call(key, 'current', {})) ?? undefined;
  }

  async applyGrant(container, grant) {
    const fence = crypto.randomUUID();
    await this.node().call(this.key, 'apply-grant', RemoteSubstrate.wireGrant(container, fence, grant));
    return fence;
  }

  /** `apply-grant`'s body: `ask` only when set (the node's proxy holds what it asks
   * about; the Worker's pending routes list and answer it: pending.js). */
  static wireGrant(container, fence, grant) {
    const body = { container, fence, rules: RemoteSubstrate.wireRules(grant) };
    if (grant.ask) body.ask = true;
    return body;
  }

  /** The grant's rules (jco's form of the WIT `rule`) in the node protocol's form, the
   * one stockade-node-protocol writes for the grammar's `RuleSpec` (`NodeRule`). A copy
   * that stays: the Worker runs no Rust but the guest, and the guest speaks only the
   * WIT; the node reads these bytes with the Rust type and parses them again. */
  static wireRules(grant) {
    return grant.rules.map((r) => ({
      host: r.host,
      methods: [...r.methods],
      path_prefix: r.pathPrefix ?? null,
      headers: r.headers.map((h) => [h.name, h.secret]),
      intercept: r.intercept,
    }));
  }

  /**
   * The WIT `batch`: the calls in one signed request (`batch`, docs/NODE.md), made by
   * the node in order, stopping at the first error; one `{tag: 'ok'|'err'}` answer per
   * call made. Checked whole first (batch.js checkBatch: refused whole, nothing made).
   * A call a batch does not carry is that call's `invalid`: the calls before it are
   * made. Throws (a typed error) when what was made is not known.
   *
   * An opening `ensure` goes as `{"ensure": {}}`, and `target.ensured` (of any call:
   * apply-grant, run, kill-all, revoke-grant) as the empty container id, when the key
   * is placed; a key not yet placed is placed by its `ensure` alone (rendezvous order,
   * capacity fallback: `ensure`), and the rest goes as a batch to the node that
   * answered, naming the container it answered.
   */
  async batch(calls) {
    checkBatch(calls);
    const opens = calls[0]?.tag === 'ensure';
    if (opens) this.checkKey(calls[0].val);
    // On the wire the empty id is the ensured container: a container named so is not
    // one (and would be read as it).
    for (const c of calls) {
      const t = targetOf(c);
      if (t && t.tag !== 'ensured' && !t.val) throw substrateError('invalid', `${c.tag}: an empty container id`);
    }
    if (opens && !this.placed()) {
      let container;
      try {
        container = await this.ensure(calls[0].val);
      } catch (e) {
        if (e instanceof Error) throw e;
        return [{ tag: 'err', val: e }];
      }
      const target = (t) => (t.tag === 'ensured' ? { tag: 'container', val: container } : t);
      const rest = calls.slice(1).map((c) => {
        if (c.tag === 'apply-grant' || c.tag === 'run') return { tag: c.tag, val: { ...c.val, container: target(c.val.container) } };
        if (c.tag === 'kill-all' || c.tag === 'revoke-grant') return { tag: c.tag, val: target(c.val) };
        return c;
      });
      const first = { tag: 'ok', val: { tag: 'ensure', val: container } };
      return [first, ...(rest.length ? await this.batch(rest) : [])];
    }
    const on = (t) => (t.tag === 'ensured' ? '' : t.val);
    const wire = [];
    const fences = [];
    let refused;
    for (const c of calls) {
      if (c.tag === 'ensure') {
        wire.push({ ensure: {} });
      } else if (c.tag === 'apply-grant') {
        fences[wire.length] = crypto.randomUUID();
        wire.push({ 'apply-grant': RemoteSubstrate.wireGrant(on(c.val.container), fences[wire.length], c.val.grant) });
      } else if (c.tag === 'run') {
        wire.push({ run: { container: on(c.val.container), cmd: RemoteSubstrate.wireCmd(c.val.cmd), timeout_ms: Number(c.val.timeoutMs) } });
      } else if (c.tag === 'kill-all' || c.tag === 'revoke-grant') {
        wire.push({ [c.tag]: { container: on(c.val) } });
      } else {
        refused = substrateError('invalid', `no call ${c.tag} in a batch`);
        break;
      }
    }
    const answers = [];
    const out = [];
    const err = [];
    if (wire.length) {
      const node = this.node();
      // The caller gone ends a batch's run, never the teardown after it: the signal is
      // the run's, used once (a kill-all it aborted would leave the guest nothing but
      // stopping the container).
      const signal = wire.some((c) => c.run) ? this.signal : undefined;
      if (signal) this.signal = undefined;
      const r = await node.post(this.key, 'batch', { calls: wire });
      await node.runAnswer(r, {
        heartbeatMs: this.heartbeatMs,
        signal,
        // A run starts once every call before it answered ok (the live stream's start).
        onStarted: () => {
          if (wire[0].run) this.onRunStarted?.();
        },
        onAnswer: (a) => {
          answers.push(a);
          if (a && typeof a === 'object' && 'ok' in a && wire[answers.length]?.run) this.onRunStarted?.();
        },
        onLine: (line) => {
          for (const stream of ['stdout', 'stderr']) {
            if (typeof line[stream] === 'string') {
              const bytes = B64.dec(line[stream]);
              (stream === 'stdout' ? out : err).push(bytes);
              this.output?.(stream, bytes);
            }
          }
        },
      });
    }
    // The node made the calls as the plan does (batch.js): its answers read back
    // through one, which stops at the first error.
    const plan = new BatchPlan(calls);
    for (const [i, a] of answers.entries()) {
      const call = wire[i];
      if (!call || !a || typeof a !== 'object') throw substrateError('failed', 'batch: more answers than calls');
      if ('error' in a) {
        plan.answer({ tag: 'err', val: substrateError(a.error?.kind, String(a.error?.message ?? '')) });
        break;
      }
      const name = Object.keys(call)[0];
      let val;
      switch (name) {
        case 'ensure':
          if (typeof a.ok !== 'string') throw substrateError('failed', 'batch: an ensure answered no container id');
          val = a.ok;
          break;
        case 'apply-grant':
          val = fences[i];
          break;
        case 'run':
          val = RemoteSubstrate.runResult(a.ok ?? {}, out, err);
          break;
        case 'kill-all':
          val = a.ok >>> 0;
          break;
        default:
          val = { admitted: a.ok?.admitted >>> 0, denied: a.ok?.denied >>> 0 };
      }
      plan.answer({ tag: 'ok', val: { tag: name, val } });
    }
    if (!plan.stopped && plan.answers.length < wire.length) {
      throw substrateError('unreachable', 'batch: the answer ended before every call was answered');
    }
    // The call the node's batch does not carry is answered at its turn, if the batch
    // got there.
    if (refused && plan.next()?.index === wire.length) plan.answer({ tag: 'err', val: refused });
    return plan.answers;
  }

  /** A run's result from its `result` value and the output that came in lines. */
  static runResult(r, out, err) {
    const cat = (parts, tail) => {
      const extra = tail ? B64.dec(tail) : new Uint8Array();
      const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0) + extra.length);
      let o = 0;
      for (const p of [...parts, extra]) {
        all.set(p, o);
        o += p.length;
      }
      return all;
    };
    return {
      exitCode: r.exit_code | 0,
      stdout: cat(out, r.stdout),
      stderr: cat(err, r.stderr),
      timedOut: !!r.timed_out,
      truncated: !!r.truncated,
      limits: (r.limits ?? []).filter((l) => LIMITS.has(l)),
    };
  }

  async revokeGrant(container) {
    const c = await this.node().call(this.key, 'revoke-grant', { container });
    return { admitted: c.admitted >>> 0, denied: c.denied >>> 0 };
  }

  static wireCmd(cmd) {
    return {
      argv: [...cmd.argv],
      cwd: cmd.cwd,
      env: cmd.env.map(([k, v]) => [k, v]),
      stdin: B64.enc(cmd.stdin ?? new Uint8Array()),
    };
  }

  async run(container, cmd, timeoutMs) {
    const term = this.pty;
    this.pty = undefined;
    if (term) {
      const head = {
        container,
        cmd: { argv: [...cmd.argv], cwd: cmd.cwd, env: cmd.env.map(([k, v]) => [k, v]) },
        timeout_ms: Number(timeoutMs),
        rows: term.rows,
        cols: term.cols,
      };
      const r = await this.node().runPty(this.key, head, term, { heartbeatMs: this.heartbeatMs, signal: this.signal });
      // The caller gone ended the run, not its fence: the teardown's calls still reach
      // the node (kill-all, revoke), as the Rust runtime's do.
      this.signal = undefined;
      return RemoteSubstrate.runResult(r, [], []);
    }
    const out = [];
    const err = [];
    const req = { container, cmd: RemoteSubstrate.wireCmd(cmd), timeout_ms: Number(timeoutMs) };
    // An upload's body, set by the object for this one run: streamed, checked on the node.
    const upload = this.stdin;
    this.stdin = undefined;
    // The caller gone ends this run, not the teardown's calls after it (as `batch`).
    const signal = this.signal;
    this.signal = undefined;
    const node = this.node();
    const r = await (upload
      ? (lines) => node.runStream(this.key, { ...req, upload: upload.check }, upload.stream, lines)
      : (lines) => node.run(this.key, req, lines))(
      {
        heartbeatMs: this.heartbeatMs,
        signal,
        onStarted: () => this.onRunStarted?.(),
        onLine: (line) => {
          if (line.upload && typeof line.upload === 'object') upload?.onVerdict?.(line.upload);
          for (const stream of ['stdout', 'stderr']) {
            if (typeof line[stream] === 'string') {
              const bytes = B64.dec(line[stream]);
              (stream === 'stdout' ? out : err).push(bytes);
              this.output?.(stream, bytes);
            }
          }
        },
      },
    );
    return RemoteSubstrate.runResult(r, out, err);
  }

  async startProcess(container, cmd) {
    return this.node().call(this.key, 'start-process', { container, cmd: RemoteSubstrate.wireCmd(cmd) });
  }

  static process(p) {
    return { id: p.id, running: !!p.running, exitCode: p.exit_code ?? undefined };
  }

  async listProcesses(container) {
    return (await this.node().call(this.key, 'list-processes', { container })).map(RemoteSubstrate.process);
  }

  async processStatus(container, id) {
    const p = await this.node().call(this.key, 'process-status', { container, id });
    return p ? RemoteSubstrate.process(p) : undefined;
  }

  async killProcess(container, id) {
    return (await this.node().call(this.key, 'kill-process', { container, id })) >>> 0;
  }

  async killAll(container) {
    return (await this.node().call(this.key, 'kill-all', { container })) >>> 0;
  }

  async snapshot(container) {
    await this.node().call(this.key, 'snapshot', { container });
  }

  async stop(container) {
    await this.node().call(this.key, 'stop', { container });
  }

  // Named snapshots live on their key's node (docs/NODE.md): `save-snapshot` and
  // `drop-snapshot` go to it; a fork is made where its source's snapshot is.
  async saveSnapshot(container, name) {
    await this.node().call(this.key, 'save-snapshot', { container, name });
  }

  /**
   * `fork-snapshot` onto this key, signed with it (host/remote/src/lib.rs
   * `fork_snapshot`). A placed key is forked on its node only (a copy across nodes is
   * not made). This object knows only its own key's placement: for a key not placed
   * yet, the source's snapshot is looked for on the nodes in the source's rendezvous
   * order (where the source was placed, unless it fell back). A node answering
   * `invalid` holds no such snapshot, and one unreachable may: the next is asked. The
   * first that makes the copy places the key, as `ensure` does. None did: unreachable
   * if a node could not be asked, else the `invalid` they answered.
   */
  async forkSnapshot(source, name, key) {
    this.checkKey(key);
    const body = { source, name };
    const placed = this.placed();
    if (placed) {
      await placed.call(key, 'fork-snapshot', body);
      return;
    }
    let refused;
    let unreachable;
    for (const nodeName of await order([...this.nodes.keys()], source)) {
      try {
        await this.nodes.get(nodeName).call(key, 'fork-snapshot', body);
      } catch (e) {
        if (e?.tag === 'invalid') refused ??= e;
        else if (e?.tag === 'unreachable') unreachable ??= e;
        else throw e;
        continue;
      }
      this.placement.set(nodeName);
      this.log('info', "key placed with its fork's source", [
        ['key', key],
        ['source', source],
        ['node', nodeName],
      ]);
      return;
    }
    throw unreachable ?? refused ?? substrateError('unreachable', 'no nodes');
  }

  async dropSnapshot(key, name) {
    this.checkKey(key);
    const n = this.placed();
    if (!n) return false;
    return (await n.call(key, 'drop-snapshot', { name })) === true;
  }

  async denials(key) {
    this.checkKey(key);
    const n = this.placed();
    if (!n) return [];
    return (await n.call(key, 'denials', {})).map((d) => ({
      atMs: BigInt(d.at_ms ?? 0),
      host: String(d.host ?? ''),
      method: String(d.method ?? ''),
      path: String(d.path ?? ''),
      fence: String(d.rule_set ?? d.fence ?? ''),
      reason: REASONS.has(d.reason) ? d.reason : 'no-rule',
    }));
  }

  /**
   * `GET …/egress` (host/remote/src/housekeeping.rs `egress_audit`): the key's
   * admitted requests and denials from its placed node, asked in parallel, as one
   * timeline (egressTimeline). A key not placed has none (`[]`); a failed call throws
   * its `substrate-error`.
   */
  async egressAudit(key) {
    this.checkKey(key);
    const n = this.placed();
    if (!n) return [];
    const [admitted, denied] = await Promise.all([n.call(key, 'admitted', {}), n.call(key, 'denials', {})]);
    if (!Array.isArray(admitted) || !Array.isArray(denied)) {
      throw substrateError('failed', `node ${n.name}: admitted/denials: not a list`);
    }
    return egressTimeline(admitted, denied);
  }

  async listArtifacts(key) {
    this.checkKey(key);
    const n = this.placed();
    if (!n) return [];
    return (await n.call(key, 'list-artifacts', {})).map((a) => ({ name: a.name, size: BigInt(a.size) }));
  }

  // Preview doors are the node's (docs/NODE.md "Preview doors"): its own listener
  // serves the door, and its URL is handed out as the node answered it. The Worker
  // never carries a door's traffic.
  static preview(p) {
    if (!p || typeof p !== 'object' || !Number.isInteger(p.port) || typeof p.token !== 'string' || typeof p.url !== 'string') {
      throw substrateError('failed', 'a node answered a preview that is not {port, token, url}');
    }
    return { port: p.port, token: p.token, url: p.url };
  }

  async openPreview(container, port) {
    return RemoteSubstrate.preview(await this.node().call(this.key, 'open-preview', { container, port: Number(port) }));
  }

  async closePreview(container, port) {
    return (await this.node().call(this.key, 'close-preview', { container, port: Number(port) })) === true;
  }

  async listPreviews(container) {
    const list = await this.node().call(this.key, 'list-previews', { container });
    if (!Array.isArray(list)) throw substrateError('failed', 'list-previews: not a list');
    return list.map(RemoteSubstrate.preview);
  }

  async readArtifact(key, name, offset, length) {
    this.checkKey(key);
    return B64.dec(await this.node().call(key, 'read-artifact', { name, offset: Number(offset), length }));
  }
}

const str = (v) => (typeof v === 'string' ? v : '');
const num = (v) => (Number.isSafeInteger(v) && v >= 0 ? v : 0);

/**
 * Both records of a key in one timeline, as api.rs answers `GET …/egress`
 * (egress/src/audit.rs `timeline`, wire `EgressEvent`): oldest first, at the same
 * millisecond a denial before an admission, each kind in the node's order otherwise
 * (a stable sort); every event `{decision, …the record's fields}` in the wire's order.
 * The node's records are read field by field (no other field passes through).
 */
export function egressTimeline(admitted, denied) {
  const deny = denied.map((d) => ({
    decision: 'deny',
    at_ms: num(d?.at_ms),
    host: str(d?.host),
    method: str(d?.method),
    path: str(d?.path),
    rule_set: str(d?.rule_set),
    reason: str(d?.reason),
  }));
  const allow = admitted.map((a) => ({
    decision: 'allow',
    at_ms: num(a?.at_ms),
    fence: str(a?.fence),
    method: str(a?.method),
    host: str(a?.host),
    port: num(a?.port),
    path: str(a?.path),
    rule: num(a?.rule),
    via: str(a?.via),
    status: num(a?.status),
    bytes_up: num(a?.bytes_up),
    bytes_down: num(a?.bytes_down),
    error: str(a?.error),
    credentials: Array.isArray(a?.credentials) ? a.credentials.filter((c) => typeof c === 'string') : [],
    suppressed: num(a?.suppressed),
  }));
  return [...deny, ...allow].sort((x, y) => x.at_ms - y.at_ms || (x.decision === 'allow') - (y.decision === 'allow'));
}
