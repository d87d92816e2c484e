// The public HTTP API's shapes, as host/src/api/mod.rs and docs/openapi.json (the wire
// crate): request bodies to the guest's inputs, the guest's answers to JSON, a facade
// error to its status and code, and the live stream's events. Pure.

import { B64 } from './nodes.js';

/** The largest request body a route reads: `stockade serve`'s `api.max_body_bytes`
 * default (wasmtime.toml), the largest stdin the guest takes (16 MiB) as base64, with room. */
export const MAX_BODY_BYTES = 24 << 20;

/** The bytes of `parts`, one after another. */
export function concat(parts) {
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    all.set(p, o);
    o += p.length;
  }
  return all;
}

/** A request's body, or undefined once it passes `max` bytes as it is read (a chunked
 * body is counted; the reader is cancelled there). No body is empty. */
export async function boundedBody(request, max = MAX_BODY_BYTES) {
  if (!request.body) return new Uint8Array();
  const reader = request.body.getReader();
  const parts = [];
  let n = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    n += value.length;
    if (n > max) {
      reader.cancel().catch(() => {});
      return undefined;
    }
    parts.push(value);
  }
  return concat(parts);
}

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

/** A body (JSON text) that must be an object, or the 400 `malformed-json` api.rs
 * `parse_json` answers. */
function jsonObject(text) {
  let c;
  try {
    c = JSON.parse(text);
  } catch (e) {
    throw new BadRequest(400, 'malformed-json', e.message);
  }
  if (!isObj(c)) throw new BadRequest(400, 'malformed-json', 'the body must be a JSON object');
  return c;
}

/** A body of string fields, each required, and no other (wire's `SnapshotBody`
 * `{"name"}`, `ForkBody` `{"source", "name"}`: unknown fields refused), as
 * {field: string}; else the 400 `malformed-json` api.rs answers. */
export function stringFields(text, fields) {
  const b = jsonObject(text);
  only(b, fields, 'body');
  return Object.fromEntries(
    fields.map((f) => {
      if (b[f] === undefined) throw new BadRequest(400, 'malformed-json', `missing field \`${f}\``);
      return [f, str(b[f], f)];
    }),
  );
}

/**
 * A grant in the API's JSON (wire `GrantBody`: `{"rules": [RuleSpec…], "ask"?: bool}`,
 * unknown fields refused) as jco's form of the WIT `grant`; `what` names it in the
 * messages (`grant`: an exec body's field, `body`: a body that is one).
 */
function grantOf(g, what) {
  if (!isObj(g)) throw new BadRequest(400, 'malformed-json', `${what}: expected an object`);
  only(g, ['rules', 'ask'], what);
  if (g.ask !== undefined && typeof g.ask !== 'boolean') {
    throw new BadRequest(400, 'malformed-json', `${what}.ask: expected a boolean`);
  }
  if (!Array.isArray(g.rules)) throw new BadRequest(400, 'malformed-json', `${what}.rules: expected a list`);
  // The API's rule (grammar/src/rules/json.rs, `RuleSpec` in the API's JSON) read
  // into jco's form of the WIT `rule`. A copy that stays: the Worker runs no Rust but
  // the guest, whose input is the WIT; it checks only the JSON's shape (headers in
  // name order, as the Rust form reads them) and leaves the grammar to the guest.
  return {
    rules: g.rules.map((r, i) => {
      const at = `${what}.rules[${i}]`;
      if (!isObj(r)) throw new BadRequest(400, 'malformed-json', `${at}: expected an object`);
      only(r, ['host', 'methods', 'path_prefix', 'headers', 'intercept'], at);
      const headers = r.headers === undefined ? {} : r.headers;
      if (!isObj(headers)) throw new BadRequest(400, 'malformed-json', `${at}.headers: expected an object`);
      if (r.intercept !== undefined && typeof r.intercept !== 'boolean') {
        throw new BadRequest(400, 'malformed-json', `${at}.intercept: expected a boolean`);
      }
      return {
        host: str(r.host, `${at}.host`),
        methods: r.methods === undefined ? [] : strs(r.methods, `${at}.methods`),
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
}

/** `PUT …/network`'s body (JSON text): a grant as an exec body's `grant` is (wire
 * `GrantBody`), as the WIT `grant` (jco's form); else the 400 `malformed-json`. */
export function grantBody(text) {
  return grantOf(jsonObject(text), 'body');
}

/** A CommandBody (JSON text) as the WIT exec-input (jco's form). */
export function execInput(text) {
  const c = jsonObject(text);
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
  const grant = opt(c, 'grant', (g) => grantOf(g, 'grant'));
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

// --- The bearer tokens (api.rs's auth).

/** Routes that take the approver's token (api.rs `APPROVER_ROUTES`): approvals,
 * secrets, answering a pending egress decision. */
const APPROVER_ROUTES = [
  /^\/v1\/sandboxes\/[^/]+\/approvals$/,
  /^\/v1\/secrets$/,
  /^\/v1\/secrets\/[^/]+$/,
  /^\/v1\/egress\/pending\/[^/]+$/,
];

/** Routes either token may call (api.rs `EITHER_ROUTES`): the approver lists what
 * waits for them; the consumer (its MCP server) may list, never answer. */
const EITHER_ROUTES = [/^\/v1\/egress\/pending$/, /^\/v1\/sandboxes\/[^/]+\/egress\/pending$/];

/** The Worker's two tokens, `API_TOKEN` and `APPROVER_TOKEN` (bindings), trimmed of
 * surrounding whitespace as `stockade serve` reads its token files
 * (host/src/api/tokens.rs): `deploy-config.mjs` embeds a token file whole and `wrangler
 * secret put NAME < FILE` keeps its newline, which would otherwise be part of the token.
 * One unset, empty or all whitespace is `undefined`, which no bearer matches. */
export function envTokens(env) {
  const token = (v) => (typeof v === 'string' && v.trim() !== '' ? v.trim() : undefined);
  return { api: token(env?.API_TOKEN), approver: token(env?.APPROVER_TOKEN) };
}

/** Routes only the operator's token takes (api.rs `OPERATOR_ROUTES`): making, listing
 * and revoking scoped tokens (`/v1/tokens/self` is any consumer's). */
const OPERATOR_ROUTES = [/^\/v1\/tokens$/, /^\/v1\/tokens\/(?!self$)[^/]+$/];

/** The bearer token of an `Authorization` header (`Bearer ` first, as api.rs), or undefined. */
export const bearer = (authorization) => (authorization?.startsWith('Bearer ') ? authorization.slice(7) : undefined);

/** The bearer check of a route, compared in constant time: `null` when `authorization`
 * carries a token `path` takes (`tokens` from `envTokens`; `tenant`: the live scoped
 * token it carries, verified by the Tenants object, else null), else the refusal's
 * `[status, code, message]` for `apiError` (api/auth.rs `decide`): 403 `approver-only`
 * for a consumer's token (the operator's or a scoped one) on an approver's route, 403
 * `operator-only` for a scoped token on the tokens' routes, 401 otherwise. */
export function bearerRefusal(path, authorization, tokens, tenant = null) {
  const presented = bearer(authorization);
  const holds = (token) => presented !== undefined && token !== undefined && same(presented, token);
  const approving = APPROVER_ROUTES.some((r) => r.test(path));
  const operating = OPERATOR_ROUTES.some((r) => r.test(path));
  if (holds(approving ? tokens.approver : tokens.api)) return null;
  if (EITHER_ROUTES.some((r) => r.test(path)) && holds(tokens.approver)) return null;
  if (approving && (holds(tokens.api) || tenant)) {
    return [403, 'approver-only', 'approvals and secrets take the approver token, not a consumer token'];
  }
  if (operating && tenant) {
    return [403, 'operator-only', "this route takes the operator's token, not a scoped one (the tokens' routes; the mock's)"];
  }
  if (tenant) return null;
  return [401, 'unauthorized', 'missing or wrong bearer token'];
}

// --- A grant's credential rules against their secrets' bindings (api.rs `check_secrets`).

/** The methods a rule may name (grammar rules.rs `METHODS`), and those a credential may
 * go on (`CREDENTIAL_METHODS`). */
const RULE_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'CONNECT', 'TRACE'];
const CREDENTIAL_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];
const RESERVED_HEADERS = ['host', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'expect'];

/** A host in the plain shape `[*.]name[:port]` (lower-case labels of [a-z0-9-], an
 * IPv4 address in canonical form), as {suffix, host, port}; undefined for any other
 * shape (IPv6, a trailing dot, upper case, a bad port...), which the grammar decides. */
function plainHost(raw) {
  if (typeof raw !== 'string' || raw.length > 253) return undefined;
  const m = /^(\*\.)?([a-z0-9-]+(?:\.[a-z0-9-]+)*)(?::([1-9][0-9]{0,4}))?$/.exec(raw);
  if (!m || (m[3] !== undefined && Number(m[3]) > 65535)) return undefined;
  const labels = m[2].split('.');
  if (/^[0-9]+$/.test(labels[labels.length - 1])) {
    // Numeric: only a canonical IPv4 address (and never under `*.`).
    const ipv4 = labels.length === 4 && labels.every((l) => /^(0|[1-9][0-9]{0,2})$/.test(l) && Number(l) <= 255);
    if (!ipv4 || m[1]) return undefined;
  }
  return { suffix: Boolean(m[1]), host: m[2], port: m[3] === undefined ? undefined : Number(m[3]) };
}

/** A path prefix that needs no normalizing (no `%`, no `.`/`..` segment, no query,
 * no control character or space). */
const plainPath = (p) =>
  typeof p === 'string' && p.length <= 256 && p.startsWith('/') && !/[?#%\s\x00-\x1f\x7f]/.test(p) && !p.split('/').some((s) => s === '.' || s === '..');

/** grammar rules.rs `prefix_matches`: `path` is at or below `prefix` on a segment boundary. */
function prefixMatches(prefix, path) {
  if (!path.startsWith(prefix)) return false;
  const rest = path.slice(prefix.length);
  return rest === '' || prefix.endsWith('/') || rest.startsWith('/');
}

/**
 * Is every rule of `grant` (jco's form) that names a secret inside that secret's
 * binding (`bindings`: name -> {host, port, methods, pathPrefix}, the Registry's)? The
 * message api.rs `check_secrets` answers ("rule N: ..."), or undefined. It answers only
 * for a grant whose every rule is in the plain shape (host `[*.]name[:port]`, known
 * methods, plain path prefixes and header names, intercepted); any other grant is left
 * whole to the guest, which runs the grammar and refuses the same rules (its message
 * without the rule's index). Pure. A copy of grammar binding.rs `grant_within` that
 * stays: the Worker runs no Rust but the guest, and the guest's refusal carries neither
 * the API's status nor the rule's index; the guest still checks every grant after it.
 */
export function grantBindingError(grant, bindings) {
  const rules = grant?.rules ?? [];
  const named = rules.some((r) => r.headers.length > 0);
  if (!named) return undefined;
  const plain = rules.every(
    (r) =>
      plainHost(r.host) &&
      r.intercept !== false &&
      r.methods.every((m) => RULE_METHODS.includes(m)) &&
      (r.pathPrefix === undefined || plainPath(r.pathPrefix)) &&
      r.headers.length <= 16 &&
      new Set(r.headers.map((h) => h.name.toLowerCase())).size === r.headers.length &&
      r.headers.every(
        (h) =>
          /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/.test(h.name) &&
          !RESERVED_HEADERS.includes(h.name.toLowerCase()) &&
          !/^(proxy-|x-stockade-)/i.test(h.name) &&
          /^[a-z0-9][a-z0-9._-]{0,63}$/.test(h.secret),
      ),
  );
  if (!plain) return undefined;
  // The grammar's own refusals of a credential rule (grammar rules/parse.rs), first
  // for the whole grant, as Grant::parse runs before the bindings are looked at.
  for (const [i, r] of rules.entries()) {
    if (r.headers.length === 0) continue;
    if (r.methods.length === 0) {
      return `rule ${i}: a rule with headers must list its methods (a credential is never added to every method)`;
    }
    const bad = r.methods.find((m) => !CREDENTIAL_METHODS.includes(m));
    if (bad) {
      return `rule ${i}: a rule with headers may not admit ${JSON.stringify(bad)} (credentials go only on ${CREDENTIAL_METHODS.join(' ')})`;
    }
  }
  // grammar binding.rs `rule_within`, each (rule, secret) in order.
  for (const [i, r] of rules.entries()) {
    for (const { secret } of r.headers) {
      const fail = (why) => `rule ${i}: secret ${JSON.stringify(secret)}: ${why}`;
      const b = bindings.get(secret);
      if (!b) return fail('the secret has no binding (set it again with its host, methods and path)');
      if (!plainPath(b.pathPrefix)) return undefined;
      const h = plainHost(r.host);
      if (h.suffix) return fail('a rule naming a secret names one exact host, not a `*.` pattern');
      if (h.host !== b.host) return fail(`the rule's host ${JSON.stringify(h.host)} is not the secret's host ${JSON.stringify(b.host)}`);
      const port = h.port ?? 443;
      if (port !== b.port) {
        return fail(`the rule's port ${port} is not the secret's port ${b.port} (no port on a rule with headers means 443)`);
      }
      for (const m of RULE_METHODS) {
        if (r.methods.includes(m) && !b.methods.includes(m)) {
          return fail(`the rule admits ${JSON.stringify(m)}, the secret only ${b.methods.join(' ')}`);
        }
      }
      const prefix = r.pathPrefix ?? '/';
      if (!prefixMatches(b.pathPrefix, prefix)) {
        return fail(`the rule's path prefix ${JSON.stringify(prefix)} is not at or below the secret's ${JSON.stringify(b.pathPrefix)}`);
      }
    }
  }
  return undefined;
}

// --- The terminal's messages (`GET …/pty`, sandbox.js `ptySession`).

/** `GET …/pty` (host/src/api/pty.rs): the most bytes one input message carries, the
 * shell a start without a command runs, a side's bound. */
export const PTY_MAX_INPUT = 64 * 1024;
const PTY_SHELL = ['/bin/sh', '-i'];
const PTY_MAX_CELLS = 1000;

const cells = (v) => Number.isInteger(v) && v >= 1 && v <= PTY_MAX_CELLS;

/**
 * What a terminal client's message is (host/src/api/pty.rs `decode`'s table, pure):
 * {start: {command, rows, cols}} (first, once), {input: bytes}, {resize: {rows, cols}},
 * or {refuse: [close code, reason]} (1008 a frame the table refuses, 1009 over the
 * bound). `data` is a string (a text message) or an ArrayBuffer (binary).
 */
export function ptyFrame(data, started) {
  const refuse = (reason, code = 1008) => ({ refuse: [code, reason] });
  if (typeof data !== 'string') {
    const n = data.byteLength;
    if (!started) return refuse(`${n} input bytes before the start message`);
    if (n > PTY_MAX_INPUT) return refuse(`an input message is at most ${PTY_MAX_INPUT} bytes`, 1009);
    return { input: new Uint8Array(data) };
  }
  let m;
  try {
    m = JSON.parse(data);
  } catch (e) {
    return refuse(`not a message of the terminal protocol: ${e.message}`);
  }
  const keys = m && typeof m === 'object' && !Array.isArray(m) ? Object.keys(m) : [];
  const allowed = m?.type === 'start' ? ['type', 'command', 'rows', 'cols'] : ['type', 'rows', 'cols'];
  if (!['start', 'resize'].includes(m?.type) || keys.some((k) => !allowed.includes(k)) || !('rows' in m) || !('cols' in m)) {
    return refuse('not a message of the terminal protocol');
  }
  if (!cells(m.rows) || !cells(m.cols)) return refuse(`rows and cols must be 1 to ${PTY_MAX_CELLS}`);
  if (m.type === 'resize') {
    return started ? { resize: { rows: m.rows, cols: m.cols } } : refuse('a resize before the start message');
  }
  if (started) return refuse('a second start message');
  const command = m.command ?? {};
  if (!command || typeof command !== 'object' || Array.isArray(command)) return refuse('command: expected an object');
  if (command.stdin !== undefined || command.stdin_base64 !== undefined) {
    return refuse("a terminal's input is the terminal: no stdin");
  }
  const argv = Array.isArray(command.argv) && command.argv.length ? command.argv : PTY_SHELL;
  return { start: { command: { ...command, argv }, rows: m.rows, cols: m.cols } };
}
