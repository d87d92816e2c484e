// The public HTTP API's shapes, as host/src/api.rs and docs/openapi.json (the wire
// crate): request bodies to the guest's inputs, the guest's answers to JSON, a facade
// error to its status and code, and the live stream's events. Pure.

import { B64 } from './nodes.js';

export const json = (v, status = 200, headers = {}) =>
  new Response(JSON.stringify(v), { status, headers: { 'content-type': 'application/json', ...headers } });

/** An error answer `{"error": {code, message}}`. */
export function apiError(status, code, message) {
  return json({ error: { code, message } }, status, status === 429 ? { 'retry-after': '1' } : {});
}

/** A typed input error raised while reading a body. */
export class BadRequest extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v, what) => {
  if (typeof v !== 'string') throw new BadRequest(400, 'malformed-json', `${what}: expected a string`);
  return v;
};
const strs = (v, what) => {
  if (!Array.isArray(v)) throw new BadRequest(400, 'malformed-json', `${what}: expected a list of strings`);
  return v.map((x, i) => str(x, `${what}[${i}]`));
};
// Absent is absent; `null` is not (wire's `present`: a field given as null is a 400,
// as api.rs answers it).
const opt = (o, k, f) => (o[k] === undefined ? undefined : f(o[k], k));
function only(o, allowed, what) {
  for (const k of Object.keys(o)) {
    if (!allowed.includes(k)) throw new BadRequest(400, 'malformed-json', `${what}: unknown field \`${k}\``);
  }
}

const COMMAND_FIELDS = ['argv', 'cwd', 'env', 'timeout_ms', 'grant', 'approval', 'stdin', 'stdin_base64'];

/** A CommandBody (JSON text) as the WIT exec-input (jco's form). */
export function execInput(text) {
  let c;
  try {
    c = JSON.parse(text);
  } catch (e) {
    throw new BadRequest(400, 'malformed-json', e.message);
  }
  if (!isObj(c)) throw new BadRequest(400, 'malformed-json', 'the body must be a JSON object');
  only(c, COMMAND_FIELDS, 'body');
  if (c.argv === undefined) throw new BadRequest(400, 'malformed-json', 'missing field `argv`');
  const env = opt(c, 'env', (v) => {
    if (!isObj(v)) throw new BadRequest(400, 'malformed-json', 'env: expected an object');
    return Object.keys(v)
      .sort()
      .map((k) => [k, str(v[k], `env.${k}`)]);
  });
  const timeout = opt(c, 'timeout_ms', (v) => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
      throw new BadRequest(400, 'malformed-json', 'timeout_ms: expected a non-negative integer');
    }
    return BigInt(v);
  });
  if (c.stdin !== undefined && c.stdin_base64 !== undefined) {
    throw new BadRequest(400, 'invalid-input', 'give stdin or stdin_base64, not both');
  }
  let stdin;
  if (c.stdin !== undefined) stdin = new TextEncoder().encode(str(c.stdin, 'stdin'));
  else if (c.stdin_base64 !== undefined) {
    try {
      stdin = B64.dec(str(c.stdin_base64, 'stdin_base64'));
    } catch (e) {
      throw new BadRequest(400, 'invalid-input', `stdin_base64: ${e.message}`);
    }
  }
  const grant = opt(c, 'grant', (g) => {
    if (!isObj(g)) throw new BadRequest(400, 'malformed-json', 'grant: expected an object');
    only(g, ['rules', 'ask'], 'grant');
    if (g.ask !== undefined && typeof g.ask !== 'boolean') {
      throw new BadRequest(400, 'malformed-json', 'grant.ask: expected a boolean');
    }
    if (!Array.isArray(g.rules)) throw new BadRequest(400, 'malformed-json', 'grant.rules: expected a list');
    return {
      rules: g.rules.map((r, i) => {
        if (!isObj(r)) throw new BadRequest(400, 'malformed-json', `grant.rules[${i}]: expected an object`);
        only(r, ['host', 'methods', 'path_prefix', 'headers', 'intercept'], `grant.rules[${i}]`);
        const headers = r.headers === undefined ? {} : r.headers;
        if (!isObj(headers)) throw new BadRequest(400, 'malformed-json', `grant.rules[${i}].headers: expected an object`);
        if (r.intercept !== undefined && typeof r.intercept !== 'boolean') {
          throw new BadRequest(400, 'malformed-json', `grant.rules[${i}].intercept: expected a boolean`);
        }
        return {
          host: str(r.host, `grant.rules[${i}].host`),
          methods: r.methods === undefined ? [] : strs(r.methods, `grant.rules[${i}].methods`),
          pathPrefix: opt(r, 'path_prefix', (v) => str(v, 'path_prefix')),
          headers: Object.keys(headers)
            .sort()
            .map((name) => {
              const ref = headers[name];
              if (!isObj(ref)) throw new BadRequest(400, 'malformed-json', `headers.${name}: expected {"secret": NAME}`);
              return { name, secret: str(ref.secret, `headers.${name}.secret`) };
            }),
          intercept: r.intercept === undefined ? true : r.intercept,
        };
      }),
      ask: g.ask === true,
    };
  });
  return {
    argv: strs(c.argv, 'argv'),
    cwd: opt(c, 'cwd', (v) => str(v, 'cwd')),
    env: env ?? [],
    timeoutMs: timeout,
    grant,
    approval: opt(c, 'approval', (v) => str(v, 'approval')),
    stdin,
  };
}

/** The same as a detached-input (no grant, no timeout). */
export function detachedInput(input) {
  const { grant: _g, timeoutMs: _t, ...d } = input;
  return d;
}

const dec = new TextDecoder();

/** The guest's exec-outcome as the API's ExecOutcome. */
export function outcome(o) {
  return {
    exit_code: o.exitCode,
    stdout: dec.decode(o.stdout),
    stderr: dec.decode(o.stderr),
    stdout_base64: B64.enc(o.stdout),
    stderr_base64: B64.enc(o.stderr),
    timed_out: o.timedOut,
    truncated: o.truncated,
    killed: o.killed,
    denials: o.denials,
    admitted: o.admitted,
    limits: [...o.limits],
  };
}

/** The stream's last event after a run: the outcome without its output (keys sorted). */
export function exitEvent(o) {
  return {
    admitted: o.admitted,
    denials: o.denials,
    exit_code: o.exitCode,
    killed: o.killed,
    limits: [...o.limits],
    timed_out: o.timedOut,
    truncated: o.truncated,
    type: 'exit',
  };
}

/** A detached-state as the API's `{"state": …}`. */
export function detachedState(s) {
  if (s.tag === 'running') return { state: 'running' };
  if (s.tag === 'exited') return { state: 'exited', code: s.val };
  return { state: 'gone', reason: s.val };
}

/** A facade error (or trap) as [status, code, message] (host/src/api/error.rs). */
export function callErrorStatus(e) {
  if (e?.kind === 'facade') {
    const p = e.payload ?? {};
    switch (p.tag) {
      case 'needs-approval':
        return [403, 'needs-approval', p.val];
      case 'over-capacity':
        return [429, 'over-capacity', 'the ticket gate is full: retry when a sandbox frees'];
      case 'invalid-input':
        return [400, 'invalid-input', p.val];
      case 'unreachable':
        return [502, 'unreachable', p.val];
      default:
        return [500, 'failed', String(p.val ?? '')];
    }
  }
  return [500, 'trap', String(e?.message ?? e)];
}

/**
 * Per stream: byte chunks to `{"type", "data"}` events, holding an incomplete UTF-8
 * tail (at most 3 bytes) until the next chunk completes it; bytes that are not UTF-8
 * go out as `data_base64` (host/src/stream.rs `Utf8Chunker`).
 */
export class Utf8Chunker {
  constructor(stream) {
    this.stream = stream;
    this.held = new Uint8Array();
  }

  static incompleteTail(b) {
    // How many bytes at the end start a character that is not complete yet.
    for (let back = 1; back <= Math.min(3, b.length); back++) {
      const x = b[b.length - back];
      if ((x & 0xc0) === 0x80) continue; // continuation byte
      const need = x >= 0xf0 ? 4 : x >= 0xe0 ? 3 : x >= 0xc0 ? 2 : 1;
      return need > back ? back : 0;
    }
    return 0;
  }

  push(bytes) {
    const buf = new Uint8Array(this.held.length + bytes.length);
    buf.set(this.held);
    buf.set(bytes, this.held.length);
    this.held = new Uint8Array();
    const tail = Utf8Chunker.incompleteTail(buf);
    const body = buf.subarray(0, buf.length - tail);
    try {
      const text = new TextDecoder('utf-8', { fatal: true }).decode(body);
      this.held = buf.slice(buf.length - tail);
      return text ? { type: this.stream, data: text } : undefined;
    } catch {
      return { type: this.stream, data_base64: B64.enc(buf) };
    }
  }

  finish() {
    const h = this.held;
    this.held = new Uint8Array();
    return h.length ? { type: this.stream, data_base64: B64.enc(h) } : undefined;
  }
}

/** Constant-time comparison of two strings. */
export function same(a, b) {
  if (typeof a !== 'string' || typeof b !== 'string' || a.length !== b.length) return false;
  let d = 0;
  for (let i = 0; i < a.length; i++) d |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return d === 0;
}
