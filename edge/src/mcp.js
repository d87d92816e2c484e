// `/mcp` on the Worker: the Model Context Protocol over Streamable HTTP (revision
// 2025-11-25), as `stockade serve` serves it (host/src/mcp/http.rs, protocol.rs,
// tools.rs, session.rs; docs/MCP.md): the same checks in the same order, the same
// statuses, the same tools, each one call of the Worker's own API.
//
// * The Worker (deploy.js) checks the `Origin` (absent, this deployment's own loopback
//   origin on the port the request names, or one in `MCP_ORIGINS`; else 403, the
//   DNS-rebinding defence) and the consumer's bearer token (else 401 with
//   `WWW-Authenticate: Bearer`), then hands the request to the one `McpSessions`
//   Durable Object (`MCP.idFromName('mcp')`), which runs [`McpServer`].
// * Why one object: a session opened through one isolate must be found through any
//   other (Cloudflare runs a Worker in many), and a `notifications/cancelled` must
//   reach the request it names wherever that request arrived. The object holds the
//   session table (its SQLite: sessions outlive the object's eviction) and the
//   requests running now (memory: they live only while their connection does).
// * Every tool call is a request to the Worker's own API handler (the function that
//   serves the public routes, called in place with the caller's token), so every check
//   the API makes stays the API's, as http.rs's loopback client does. `exec` always
//   goes through the live-output route (`POST …/exec/stream`): a caller that leaves,
//   or cancels, cancels that stream, which the key's object sees as its client leaving
//   (the node's run is aborted, the fence torn down and revoked).
//
// Pure but for `McpServer`'s SQL and the API it is given; test/mcp.test.mjs drives it
// in node over a fake API.

import { B64 } from './nodes.js';
import { boundedBody, concat, MAX_BODY_BYTES, same } from './api.js';

/** The handshake revisions this server speaks, oldest to newest (protocol.rs). */
export const PROTOCOL_VERSIONS = ['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25'];
/** At most this many sessions (session.rs `MAX_SESSIONS`). */
export const MAX_SESSIONS = 256;
/** A session unused this long is gone (session.rs `IDLE`). */
export const IDLE_MS = 30 * 60 * 1000;
export const SESSION_HEADER = 'mcp-session-id';
export const VERSION_HEADER = 'mcp-protocol-version';
/** How often a running SSE answer writes a comment (how soon a caller's leaving is
 * seen). */
export const HEARTBEAT_MS = 500;

/** The revision to answer a client that asked for `requested`. */
export function negotiate(requested) {
  return PROTOCOL_VERSIONS.includes(requested) ? requested : PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.length - 1];
}

export function rpcError(id, code, message) {
  return { jsonrpc: '2.0', id, error: { code, message } };
}

/** An origin as compared: trimmed, lowercase, no trailing slash. */
export const normalizeOrigin = (o) => String(o).trim().replace(/\/+$/, '').toLowerCase();

/**
 * May a request with this `Origin` use `/mcp` (http.rs `origin_allowed`)? Absent: yes
 * (not a browser). Present: one of `configured` (normalized), or a loopback name
 * (`localhost`, `127.0.0.1`, `[::1]`) on `port`, the port the request was sent to (a
 * browser sets `Host` from the URL it fetches, so a page cannot choose it). Anything
 * else, `null` included, is refused, however its name resolves.
 */
export function originAllowed(origin, port, configured) {
  if (origin === null || origin === undefined) return true;
  const o = normalizeOrigin(origin);
  if (configured.includes(o)) return true;
  const rest = o.startsWith('http://') ? o.slice(7) : o.startsWith('https://') ? o.slice(8) : undefined;
  if (rest === undefined) return false;
  return ['localhost', '127.0.0.1', '[::1]'].some((h) => rest === `${h}:${port}`);
}

/** The port a request was sent to (its URL's, or its scheme's default). */
export function requestPort(url) {
  const u = new URL(url);
  return u.port || (u.protocol === 'https:' ? '443' : '80');
}

/** Does `Accept` take both answers a POST may get (http.rs `accepts_both`)? */
export function acceptsBoth(accept) {
  if (typeof accept !== 'string') return false;
  const types = accept.split(',').map((t) => t.split(';')[0].trim().toLowerCase());
  const has = (t) => types.some((x) => x === t || x === '*/*');
  return has('application/json') && has('text/event-stream');
}

/** The caller's `params._meta.progressToken` (a string or an integer), if any. */
export function progressToken(msg) {
  const t = msg?.params?._meta?.progressToken;
  return typeof t === 'string' || (typeof t === 'number' && Number.isInteger(t)) ? t : undefined;
}

/** One SSE event carrying one JSON-RPC message. */
export const sseEvent = (v) => `event: message\ndata: ${JSON.stringify(v)}\n\n`;

// --- Refusals (http.rs `Refusal`): the status and a JSON-RPC error saying why.

const REFUSALS = {
  origin: 403,
  token: 401,
  'no-session': 400,
  'unknown-session': 404,
  'protocol-version': 400,
  accept: 406,
  'content-type': 415,
  message: 400,
  'too-large': 413,
};

export function refuse(reason, message, code = reason === 'message' ? -32600 : -32000) {
  const headers = { 'content-type': 'application/json' };
  if (reason === 'token') headers['www-authenticate'] = 'Bearer';
  return new Response(JSON.stringify(rpcError(null, code, message)), { status: REFUSALS[reason], headers });
}

/** No server stream, and no other method (http.rs `not_offered`). */
function notOffered(message) {
  return new Response(JSON.stringify(rpcError(null, -32000, message)), {
    status: 405,
    headers: { 'content-type': 'application/json', allow: 'POST, DELETE' },
  });
}

/**
 * The Origin and the token, on every method (http.rs `admit`): the caller's token (the
 * operator's, or a live scoped one), or the refusal to answer. `origins`:
 * `MCP_ORIGINS`, normalized.
 */
export function admit(request, apiToken, origins, { scoped = false } = {}) {
  if (!originAllowed(request.headers.get('origin'), requestPort(request.url), origins)) {
    return { refused: refuse('origin', 'this Origin may not use this server') };
  }
  const auth = request.headers.get('authorization') ?? '';
  const presented = auth.startsWith('Bearer ') ? auth.slice(7) : undefined;
  // `scoped`: the caller verified the presented token as a live scoped one (deploy.js,
  // the Tenants object); its tools then reach its keys only, as the API's routes do.
  if (presented === undefined || (!scoped && (!same(presented, apiToken ?? '') || !apiToken))) {
    return { refused: refuse('token', 'missing or wrong bearer token') };
  }
  return { token: presented };
}

/** `MCP_ORIGINS` (a JSON list of origins, or one origin per line), normalized. */
export function configuredOrigins(env) {
  const v = env?.MCP_ORIGINS;
  const list = Array.isArray(v) ? v : typeof v === 'string' && v.trim() ? v.trim().split(/[\s,]+/) : [];
  return list.map(normalizeOrigin);
}

// --- Sessions (session.rs): a bounded table, written through to SQLite.

/**
 * At most `max` sessions, each gone after `idleMs` unused (checked when met, and
 * swept before every open); when full, the least recently used is dropped. An id is
 * chosen by the caller; `owner` is a digest of the token that opened it. `sql`
 * (`ctx.storage.sql`) keeps them across the object's eviction; without it (tests) the
 * table is memory only.
 */
export class Sessions {
  constructor({ sql, max = MAX_SESSIONS, idleMs = IDLE_MS } = {}) {
    this.sql = sql;
    this.max = Math.max(1, max);
    this.idleMs = idleMs;
    this.map = new Map();
    if (sql) {
      sql.exec(`CREATE TABLE IF NOT EXISTS mcp_sessions (id TEXT PRIMARY KEY, owner TEXT NOT NULL,
                  version TEXT NOT NULL, last_used INTEGER NOT NULL)`);
      for (const r of sql.exec('SELECT id, owner, version, last_used FROM mcp_sessions').toArray()) {
        this.map.set(r.id, { owner: r.owner, version: r.version, lastUsed: r.last_used });
      }
    }
  }

  get size() {
    return this.map.size;
  }

  drop(id) {
    this.map.delete(id);
    this.sql?.exec('DELETE FROM mcp_sessions WHERE id = ?', id);
  }

  /** Keep session `id` for `owner` at `version`, making room first: {expired, evicted}. */
  open(id, owner, version, now) {
    let expired = 0;
    for (const [k, s] of this.map) {
      if (now - s.lastUsed > this.idleMs) {
        this.drop(k);
        expired += 1;
      }
    }
    let evicted;
    if (this.map.size >= this.max) {
      for (const [k, s] of this.map) {
        if (evicted === undefined || s.lastUsed < this.map.get(evicted).lastUsed) evicted = k;
      }
      this.drop(evicted);
    }
    this.map.set(id, { owner, version, lastUsed: now });
    this.sql?.exec(
      'INSERT OR REPLACE INTO mcp_sessions (id, owner, version, last_used) VALUES (?, ?, ?, ?)',
      id,
      owner,
      version,
      now,
    );
    return { expired, evicted };
  }

  /** The revision of session `id` if held, not idle too long, and `owner`'s; it counts
   * as used now. Unknown, expired and another owner's are all undefined (a 404). */
  touch(id, owner, now) {
    const s = this.map.get(id);
    if (!s) return undefined;
    if (now - s.lastUsed > this.idleMs) {
      this.drop(id);
      return undefined;
    }
    if (!same(s.owner, owner)) return undefined;
    s.lastUsed = now;
    this.sql?.exec('UPDATE mcp_sessions SET last_used = ? WHERE id = ?', now, id);
    return s.version;
  }

  /** End session `id` if it is `owner`'s (and not expired); did it exist? */
  close(id, owner, now) {
    if (this.touch(id, owner, now) === undefined) return false;
    this.drop(id);
    return true;
  }
}

/** A new session id: two UUIDv4s (244 random bits), 64 hex characters. */
export const newSessionId = () => `${crypto.randomUUID()}${crypto.randomUUID()}`.replace(/-/g, '');

/** The first characters of a session id, for logs (never the whole id). */
const short = (id) => String(id).slice(0, 8);

async function digest(token) {
  const h = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(token));
  return [...new Uint8Array(h)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

// --- The tools (tools.rs): one table, schemas from docs/openapi.json.

function inlineRefs(v, schemas) {
  if (Array.isArray(v)) return v.map((x) => inlineRefs(x, schemas));
  if (v && typeof v === 'object') {
    if (typeof v.$ref === 'string' && v.$ref.startsWith('#/components/schemas/')) {
      return inlineRefs(schemas[v.$ref.slice('#/components/schemas/'.length)], schemas);
    }
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, inlineRefs(x, schemas)]));
  }
  return v;
}

/** The tools with their exact input schemas, from the OpenAPI document `doc`. */
export function tools(doc) {
  const schemas = doc.components.schemas;
  const param = (path, name) => {
    const p = (doc.paths[path]?.parameters ?? []).find((x) => x.name === name);
    if (!p) throw new Error(`openapi: no parameter ${name} on ${path}`);
    return structuredClone(p.schema);
  };
  const key = { ...param('/v1/sandboxes/{key}/exec', 'key'), description: 'The sandbox: one container and its records per key' };
  const id = param('/v1/sandboxes/{key}/detached/{id}', 'id');
  const command = inlineRefs(schemas.Command, schemas);
  const detached = inlineRefs(schemas.DetachedCommand, schemas);
  const withKey = (s) => ({
    ...s,
    properties: { key, ...s.properties },
    required: ['key', ...(s.required ?? [])],
  });
  const object = (properties, required) => ({ type: 'object', properties, required, additionalProperties: false });
  const artifact = '/v1/sandboxes/{key}/artifacts/{name}';
  const preview = '/v1/sandboxes/{key}/previews/{port}';
  return [
    {
      name: 'exec',
      title: 'Run a fenced command',
      description:
        'Run a command in the key\'s sandbox and wait for it. Its network is denied except what `grant` allows (none given: the key\'s network, if it has one), only while it runs; what it backgrounded is killed when it ends. Returns its exit code, stdout and stderr.',
      inputSchema: withKey(command),
    },
    {
      name: 'start',
      title: 'Start a detached process',
      description:
        'Start a process that outlives the call (a server, a watcher) in the key\'s sandbox. It holds no network grant, ever. Returns its id for status and stop.',
      inputSchema: withKey(detached),
    },
    {
      name: 'status',
      title: 'A detached process\'s state',
      description: 'running, exited(code) or gone(reason).',
      inputSchema: object({ key, id }, ['key', 'id']),
    },
    {
      name: 'stop',
      title: 'Stop a detached process',
      description: 'Kill a detached process\'s whole tree and forget its id.',
      inputSchema: object({ key, id }, ['key', 'id']),
    },
    {
      name: 'denials',
      title: 'Refused egress',
      description: 'The network requests the key\'s fence refused, and why.',
      inputSchema: object({ key }, ['key']),
    },
    {
      name: 'egress',
      title: 'Everything on the network',
      description:
        'Every request the key\'s fence decided, oldest first: admitted (status, bytes each way, credential headers the proxy added, by name) and refused (why).',
      inputSchema: object({ key }, ['key']),
    },
    {
      name: 'egress_pending',
      title: 'Requests waiting for the approver',
      description:
        'The network requests an `ask` grant holds for the approver (all keys, or the key\'s), oldest first: id, method, host, path, why the rules refused it, what approving would admit. This server runs with the consumer\'s token: it can list them, never answer them (the approver answers with `stockade egress approve|refuse ID`).',
      inputSchema: object({ key }, []),
    },
    {
      name: 'artifacts',
      title: 'Files under /artifacts',
      description:
        'Without `name`: list the key\'s /artifacts. With `name`: read that file (text, or base64 when it is not UTF-8), up to 4 MiB from `offset`.',
      inputSchema: object(
        { key, name: param(artifact, 'name'), offset: param(artifact, 'offset'), length: param(artifact, 'length') },
        ['key'],
      ),
    },
    {
      name: 'expose',
      title: 'Open a preview URL',
      description:
        'Open a preview door onto `port` (127.0.0.1 inside the key\'s running container, e.g. a server started with `start`). Returns its URL, with a random token; a browser or an HTTP client (WebSockets too) reaches the server through it. It never opens the sandbox\'s egress. The door closes on unexpose, abort, checkpoint or stop.',
      inputSchema: object({ key, port: param(preview, 'port') }, ['key', 'port']),
    },
    {
      name: 'unexpose',
      title: 'Close a preview URL',
      description: 'Close the preview door onto `port`; its URL answers 404 from now on.',
      inputSchema: object({ key, port: param(preview, 'port') }, ['key', 'port']),
    },
    {
      name: 'previews',
      title: 'Open preview URLs',
      description: 'The key\'s open preview doors: port and URL each.',
      inputSchema: object({ key }, ['key']),
    },
    {
      name: 'put',
      title: 'Put a file into /workspace',
      description:
        'Write one file under the key\'s /workspace (parents created), owned by the sandbox\'s user. Give `content` (text) or `content_base64` (any bytes), at most 256 MiB.',
      inputSchema: {
        type: 'object',
        properties: {
          key,
          path: {
            type: 'string',
            minLength: 1,
            pattern: '^[^/\\u0000][^\\u0000]*$',
            description: 'Relative to /workspace; no \'..\' segment',
          },
          content: { type: 'string' },
          content_base64: { type: 'string', format: 'byte' },
        },
        required: ['key', 'path'],
        additionalProperties: false,
        oneOf: [{ required: ['content'] }, { required: ['content_base64'] }],
      },
    },
  ];
}

// --- Texts (host/src/render.rs): what a model reads, the CLI's words.

/** A name a container chose, safe to print: control characters shown escaped. */
export function printable(name) {
  const s = String(name);
  // eslint-disable-next-line no-control-regex
  if (!/[\x00-\x1f\x7f-\x9f]/.test(s)) return s;
  return JSON.stringify(s).slice(1, -1);
}

const stateWords = (s) =>
  s.state === 'running' ? 'running' : s.state === 'exited' ? `exited(${s.code})` : `gone(${s.reason})`;

const LIMIT_NOTES = {
  pids: 'a fork failed: the container\'s process limit was reached',
  memory: 'the OOM killer killed a process: the container\'s memory limit was reached',
  disk: 'the container\'s storage (/workspace, /artifacts, /tmp) is full',
};

/** render.rs `exec_text`. */
export function execText(out) {
  let text = `exit code ${out.exit_code}`;
  if (out.timed_out) text += ' (timed out: killed)';
  for (const label of ['stdout', 'stderr']) {
    if (out[label]) text += `\n--- ${label} ---\n${out[label]}`;
  }
  const notes = [];
  if (out.truncated) notes.push('output was truncated at the configured bound');
  for (const l of out.limits ?? []) notes.push(LIMIT_NOTES[l] ?? String(l));
  for (const n of notes) text += `\n(${n})`;
  if (out.denials > 0) text += `\n(${out.denials} network requests were denied: see the denials tool)`;
  return text;
}

const denialTail = (d) =>
  `${printable(d.method)} ${printable(d.host)}${printable(d.path)}  ${printable(d.reason)}  (${printable(d.rule_set)})`;
const denialLine = (d) => `${d.at_ms}  ${denialTail(d)}`;
const artifactLine = (a) => `${String(a.size).padStart(10)}  ${printable(a.name)}`;

function egressLine(e) {
  if (e.decision === 'deny') return `${e.at_ms}  deny  ${denialTail(e)}`;
  if (e.via === 'summary') {
    return `${e.at_ms}  allow ${e.suppressed} more admitted requests of fence ${printable(e.fence)} not recorded (${printable(e.error)})`;
  }
  const creds = e.credentials?.length ? `  +${e.credentials.map(printable).join(',+')}` : '';
  const error = e.error ? `  (${printable(e.error)})` : '';
  return `${e.at_ms}  allow ${printable(e.method)} ${printable(e.host)}${printable(e.path)}  ${printable(e.via)} ${e.status}  ${e.bytes_up}B up ${e.bytes_down}B down${creds}${error}`;
}

const lines = (items, line, empty) => (items.length ? items.map(line).join('\n') : empty);

/** A tool's answer: text for the model, the API's JSON as structured content. */
const result = (text, structured, isError = false) => ({
  content: [{ type: 'text', text }],
  structuredContent: structured,
  isError,
});
export const toolError = (message) => result(message, { error: message }, true);

/** Percent-encoding of a path segment (or, `keepSlash`, a relative path), as the Rust
 * client's: everything but RFC 3986's unreserved characters. */
export function encodePath(s, keepSlash = false) {
  let out = '';
  for (const b of new TextEncoder().encode(s)) {
    const c = String.fromCharCode(b);
    if (/[A-Za-z0-9\-._~]/.test(c) || (keepSlash && c === '/')) out += c;
    else out += `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** A failed API answer, as the Rust client's error reads (`code (HTTP status): message`). */
class ApiFailure extends Error {}

async function failure(resp) {
  let code = 'failed';
  let message = '';
  try {
    const b = await resp.json();
    code = b.error.code;
    message = b.error.message;
  } catch {
    // Not the API's error body: `failed`, no message (the Rust client's reading).
  }
  return new ApiFailure(`${code} (HTTP ${resp.status}): ${message}`);
}

// --- The server (http.rs `post_mcp`, `delete_mcp`, `get_mcp`).

/**
 * `/mcp` past the Origin and the token: sessions, the protocol, the tools, each tool
 * one call of `api` (a `Request` -> `Response`: the Worker's own handler), running
 * requests cancellable by their session's `notifications/cancelled`.
 */
export class McpServer {
  constructor({ api, doc, validKey, sql, maxSessions, idleMs, now = () => Date.now(), log = () => {} }) {
    this.api = api;
    this.validKey = validKey;
    this.tools = tools(doc);
    this.version = doc.info?.version ?? '0.0.0';
    this.sessions = new Sessions({ sql, max: maxSessions, idleMs });
    this.now = now;
    this.log = log;
    /** Requests running now: `${session}\n${JSON id}` -> AbortController. */
    this.inflight = new Map();
  }

  /** A refusal past the token, logged (one line), as http.rs `Refusal::answer`. */
  refuse(reason, message, code) {
    this.log('info', 'mcp http', [
      ['decision', 'refused'],
      ['reason', reason],
      ['message', message],
    ]);
    return refuse(reason, message, code);
  }

  /** Serve one request whose Origin and token `admit` has passed (`token`). */
  async serve(request, token) {
    if (request.method === 'POST') return this.post(request, token);
    if (request.method === 'DELETE') return this.delete(request, token);
    if (request.method === 'GET') return notOffered('no server-initiated stream: Stockade never speaks first');
    return notOffered('/mcp takes POST and DELETE');
  }

  async delete(request, token) {
    const id = request.headers.get(SESSION_HEADER);
    if (id === null) return this.refuse('no-session', 'Mcp-Session-Id is required');
    if (!this.sessions.close(id, await digest(token), this.now())) return this.refuse('unknown-session', 'no such session');
    this.log('info', 'mcp http', [
      ['decision', 'session-ended'],
      ['session', short(id)],
    ]);
    return new Response(null, { status: 204 });
  }

  async post(request, token) {
    if (!acceptsBoth(request.headers.get('accept'))) {
      return this.refuse('accept', 'Accept must list application/json and text/event-stream');
    }
    if (!(request.headers.get('content-type') ?? '').trim().toLowerCase().startsWith('application/json')) {
      return this.refuse('content-type', 'the body must be application/json');
    }
    const text = await boundedText(request);
    if (text === undefined) return this.refuse('too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (e) {
      return this.refuse('message', `parse error: ${e.message}`, -32700);
    }
    if (Array.isArray(msg)) return this.refuse('message', 'one JSON-RPC message per POST (no batches)');
    if (msg === null || typeof msg !== 'object') return this.refuse('message', 'a JSON-RPC message is an object');
    const owner = await digest(token);
    if (msg.method === 'initialize') return this.initialize(msg, owner);
    const session = request.headers.get(SESSION_HEADER);
    if (session === null) return this.refuse('no-session', 'Mcp-Session-Id is required (initialize first)');
    if (this.sessions.touch(session, owner, this.now()) === undefined) {
      return this.refuse('unknown-session', 'no such session (initialize again)');
    }
    const asked = request.headers.get(VERSION_HEADER);
    if (asked !== null && !PROTOCOL_VERSIONS.includes(asked)) {
      return this.refuse('protocol-version', `MCP-Protocol-Version ${JSON.stringify(asked)}: this server speaks ${PROTOCOL_VERSIONS.join(', ')}`);
    }
    if (msg.method === 'notifications/cancelled') this.cancel(session, msg.params?.requestId);
    if (!('id' in msg) || !('method' in msg)) return new Response(null, { status: 202 });
    const progress = progressToken(msg);
    const stream = progress !== undefined && msg.method === 'tools/call' && msg.params?.name === 'exec';
    return this.run(session, msg, token, stream ? progress : undefined);
  }

  async initialize(msg, owner) {
    const resp = await this.handle(msg, undefined);
    if (!resp) return this.refuse('message', 'initialize is a request (it needs an id)');
    const version = resp.result?.protocolVersion;
    if (!PROTOCOL_VERSIONS.includes(version)) return jsonResponse(resp);
    const id = newSessionId();
    const opened = this.sessions.open(id, owner, version, this.now());
    this.log('info', 'mcp http', [
      ['decision', 'session-opened'],
      ['session', short(id)],
      ['version', version],
      ['expired', String(opened.expired)],
      ['evicted', opened.evicted === undefined ? '' : short(opened.evicted)],
    ]);
    return jsonResponse(resp, { [SESSION_HEADER]: id });
  }

  /** `notifications/cancelled`: end the session's request `requestId` if it runs. */
  cancel(session, requestId) {
    const k = `${session}\n${JSON.stringify(requestId ?? null)}`;
    const c = this.inflight.get(k);
    if (!c) return;
    this.inflight.delete(k);
    c.abort();
    this.log('info', 'mcp http', [
      ['decision', 'cancelled'],
      ['session', short(session)],
      ['request', JSON.stringify(requestId)],
    ]);
  }

  /**
   * One request, answered 200: `application/json` (whole, with its length, when the
   * call ends), or (`progress`) an SSE stream of progress notifications then the
   * response, whose cancellation (the caller gone) aborts the call. A cancellation
   * aborts it either way; an aborted exec cancels its API stream (`exec`).
   */
  async run(session, msg, token, progress) {
    const k = `${session}\n${JSON.stringify(msg.id)}`;
    const control = new AbortController();
    // A client reusing a running request's id replaces it as the one cancellable.
    this.inflight.set(k, control);
    const cancelled = new Promise((resolve) => control.signal.addEventListener('abort', () => resolve(undefined), { once: true }));
    const answer = (onChunk) =>
      Promise.race([this.handle(msg, { token, signal: control.signal, onChunk }), cancelled])
        .then((resp) => resp ?? rpcError(msg.id, -32800, 'request cancelled'))
        .catch((e) => rpcError(msg.id, -32603, String(e?.message ?? e)))
        .finally(() => {
          if (this.inflight.get(k) === control) this.inflight.delete(k);
        });
    if (progress === undefined) return jsonResponse(await answer(undefined));
    const { readable, writable } = new TransformStream();
    const writer = writable.getWriter();
    const enc = new TextEncoder();
    // The caller gone (the stream cancelled): the call is aborted. workerd tells a
    // Durable Object its response's reader left only at the stream's next write, so
    // while the call runs an SSE comment (which clients ignore) is written every
    // HEARTBEAT_MS: a command that prints nothing still ends soon after its caller.
    writer.closed.catch(() => control.abort());
    const beat = setInterval(() => writer.write(enc.encode(': \n\n')).catch(() => control.abort()), HEARTBEAT_MS);
    control.signal.addEventListener('abort', () => clearInterval(beat), { once: true });
    let n = 0;
    const onChunk = (chunk) => {
      n += 1;
      const note = { jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: progress, progress: n, message: chunk } };
      writer.write(enc.encode(sseEvent(note))).catch(() => control.abort());
    };
    answer(onChunk)
      .then(async (resp) => {
        clearInterval(beat);
        await writer.write(enc.encode(sseEvent(resp)));
        await writer.close();
      })
      .catch(() => {});
    return new Response(readable, { status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-store' } });
  }

  /** protocol.rs `handle_value`: one message's answer; undefined for a notification. */
  async handle(req, call) {
    if (!('id' in req)) return undefined;
    const id = req.id;
    if (req.jsonrpc !== '2.0' || typeof req.method !== 'string') {
      return rpcError(id, -32600, 'invalid request: jsonrpc 2.0 with a method');
    }
    const params = req.params ?? {};
    let result;
    switch (req.method) {
      case 'initialize':
        result = {
          protocolVersion: negotiate(params.protocolVersion),
          capabilities: { tools: { listChanged: false } },
          serverInfo: { name: 'stockade', title: 'Stockade sandboxes', version: this.version },
          instructions:
            'Each key is a sandbox (a Linux container with /workspace). `exec` runs a command with no network unless `grant` allows hosts, only while it runs; `start` runs a detached process (no network). Files go in with `put`, come out through /artifacts.',
        };
        break;
      case 'ping':
        result = {};
        break;
      case 'tools/list':
        result = { tools: this.tools };
        break;
      case 'tools/call': {
        const name = params.name;
        if (typeof name !== 'string') return rpcError(id, -32602, 'tools/call needs a tool `name`');
        if (!this.tools.some((t) => t.name === name)) return rpcError(id, -32602, `unknown tool ${JSON.stringify(name)}`);
        const args = params.arguments ?? {};
        if (args === null || typeof args !== 'object' || Array.isArray(args)) {
          return rpcError(id, -32602, '`arguments` must be an object');
        }
        try {
          result = await this.callTool(name, args, call);
        } catch (e) {
          if (call?.signal?.aborted) return undefined;
          result = toolError(String(e?.message ?? e));
        }
        break;
      }
      default:
        return rpcError(id, -32601, `method not found: ${req.method}`);
    }
    return { jsonrpc: '2.0', id, result };
  }

  /** One API call with the caller's token: the answer, or an `ApiFailure`. */
  async fetchApi(call, method, path, { body, contentType = 'application/json' } = {}) {
    const headers = { authorization: `Bearer ${call.token}` };
    if (body !== undefined) headers['content-type'] = contentType;
    // No `signal` on the request: an aborted call stops being waited for (`run`), and
    // an exec's stream is cancelled by `exec` once it has it, however late.
    const resp = await this.api(new Request(`https://stockade${path}`, { method, headers, body }));
    if (resp.status < 200 || resp.status >= 300) throw await failure(resp);
    return resp;
  }

  async json(call, method, path, body) {
    return (await this.fetchApi(call, method, path, body === undefined ? {} : { body: JSON.stringify(body) })).json();
  }

  /** tools.rs `call_tool`: one tool through the API. */
  async callTool(name, args, call) {
    const a = new Args(args, this.validKey);
    const sandbox = (key) => `/v1/sandboxes/${encodePath(key)}`;
    switch (name) {
      case 'exec': {
        const out = await this.exec(call, sandbox(a.key()), a.command());
        return result(execText(out), out);
      }
      case 'start': {
        const out = await this.json(call, 'POST', `${sandbox(a.key())}/detached`, a.command());
        return result(`started ${out.id}`, out);
      }
      case 'status': {
        const out = await this.json(call, 'GET', `${sandbox(a.key())}/detached/${encodePath(a.str('id'))}`);
        return result(stateWords(out), out);
      }
      case 'stop': {
        const id = a.str('id');
        const out = await this.json(call, 'DELETE', `${sandbox(a.key())}/detached/${encodePath(id)}`);
        return result(`stopped ${id}`, out);
      }
      case 'expose': {
        const out = await this.json(call, 'POST', `${sandbox(a.key())}/previews`, { port: a.port() });
        return result(out.url, out);
      }
      case 'unexpose': {
        const port = a.port();
        const out = await this.json(call, 'DELETE', `${sandbox(a.key())}/previews/${port}`);
        return result(`unexposed port ${port}`, out);
      }
      case 'previews': {
        const out = await this.json(call, 'GET', `${sandbox(a.key())}/previews`);
        return result(lines(out.previews, (p) => `${p.port}  ${p.url}`, 'no previews'), { previews: out.previews });
      }
      case 'egress': {
        const out = await this.json(call, 'GET', `${sandbox(a.key())}/egress`);
        return result(lines(out.egress, egressLine, 'no egress'), { egress: out.egress });
      }
      case 'egress_pending': {
        const path = args.key === undefined || args.key === null ? '/v1/egress/pending' : `${sandbox(a.key())}/egress/pending`;
        const out = await this.json(call, 'GET', path);
        const text = lines(
          out.pending,
          (p) => `${p.id}  ${p.key}  ${p.method} ${p.host}:${p.port}${p.path}  ${p.reason}  widens: ${p.widens}`,
          'nothing pending',
        );
        return result(text, { pending: out.pending });
      }
      case 'denials': {
        const out = await this.json(call, 'GET', `${sandbox(a.key())}/denials`);
        return result(lines(out.denials, denialLine, 'no denials'), { denials: out.denials });
      }
      case 'artifacts': {
        const key = a.key();
        if (typeof args.name !== 'string') {
          const out = await this.json(call, 'GET', `${sandbox(key)}/artifacts`);
          return result(lines(out.artifacts, artifactLine, 'no artifacts'), { artifacts: out.artifacts });
        }
        const offset = Number.isInteger(args.offset) && args.offset >= 0 ? args.offset : 0;
        const length = Number.isInteger(args.length) && args.length >= 0 ? args.length : 4 << 20;
        const path = `${sandbox(key)}/artifacts/${encodePath(args.name, true)}?offset=${offset}&length=${length}`;
        const bytes = new Uint8Array(await (await this.fetchApi(call, 'GET', path)).arrayBuffer());
        try {
          const t = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
          return result(t, { name: args.name, offset, text: t });
        } catch {
          return result(`${bytes.length} bytes, not UTF-8 (base64 in structured content)`, {
            name: args.name,
            offset,
            base64: B64.enc(bytes),
          });
        }
      }
      case 'put': {
        const key = a.key();
        const path = a.str('path');
        let bytes;
        if (typeof args.content === 'string' && args.content_base64 === undefined) bytes = new TextEncoder().encode(args.content);
        else if (typeof args.content_base64 === 'string' && args.content === undefined) {
          try {
            bytes = B64.dec(args.content_base64);
          } catch (e) {
            throw new ArgError(`content_base64: ${e.message}`);
          }
        } else throw new ArgError('give exactly one of `content` and `content_base64`');
        const resp = await this.fetchApi(call, 'PUT', `${sandbox(key)}/files/${encodePath(path, true)}`, {
          body: bytes,
          contentType: 'application/octet-stream',
        });
        return result(`wrote /workspace/${path}`, await resp.json());
      }
      default:
        throw new ArgError(`unknown tool ${JSON.stringify(name)}`);
    }
  }

  /**
   * A fenced command through the live-output route (`…/exec/stream`), whatever the
   * caller asked: each chunk goes to `call.onChunk` (progress) as it arrives, and the
   * outcome is assembled as the Rust client's `exec_stream` reads it. An abort
   * (cancelled, or the caller gone) cancels the stream: the key's object sees its
   * client leave and aborts the node's run.
   */
  async exec(call, sandbox, command) {
    const resp = await this.fetchApi(call, 'POST', `${sandbox}/exec/stream`, { body: JSON.stringify(command) });
    const reader = resp.body.getReader();
    const stop = () => reader.cancel().catch(() => {});
    if (call.signal.aborted) stop();
    call.signal.addEventListener('abort', stop, { once: true });
    const out = { stdout: [], stderr: [] };
    const dec = new TextDecoder();
    let pending = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += dec.decode(value, { stream: true });
        let nl;
        while ((nl = pending.indexOf('\n')) >= 0) {
          const line = pending.slice(0, nl);
          pending = pending.slice(nl + 1);
          if (!line.trim()) continue;
          const ev = JSON.parse(line);
          if (ev.type === 'exit') return streamedOutcome(ev, out);
          if (ev.type === 'error') throw new ApiFailure(`${ev.error?.code} (HTTP ${ev.status}): ${ev.error?.message}`);
          if (ev.type !== 'stdout' && ev.type !== 'stderr') continue;
          const bytes = typeof ev.data === 'string' ? new TextEncoder().encode(ev.data) : ev.data_base64 ? B64.dec(ev.data_base64) : undefined;
          if (!bytes) continue;
          out[ev.type].push(bytes);
          call.onChunk?.(new TextDecoder().decode(bytes));
        }
      }
    } finally {
      call.signal.removeEventListener('abort', stop);
    }
    throw new ApiFailure('the stream ended before the outcome');
  }
}

/** A tool's argument that does not name a call (tools.rs `Args`): a tool error. */
class ArgError extends Error {}

class Args {
  constructor(v, validKey) {
    this.v = v;
    this.validKey = validKey;
  }

  str(name) {
    if (typeof this.v[name] !== 'string') throw new ArgError(`\`${name}\` (a string) is required`);
    return this.v[name];
  }

  /** The key, if it passes the grammar (deploy.js `validKey`); else why, in the
   * grammar's words (names.rs `NameError`). */
  key() {
    const k = this.str('key');
    if (this.validKey(k)) return k;
    const bad = [...k].find((c) => !/[A-Za-z0-9._-]/.test(c));
    const why =
      k === ''
        ? 'key is empty'
        : new TextEncoder().encode(k).length > 128
          ? 'key is longer than 128 bytes'
          : k.startsWith('.')
            ? "key must not start with '.'"
            : `key has a character outside [A-Za-z0-9._-]: '${bad ?? ''}'`;
    throw new ArgError(`key: ${why}`);
  }

  port() {
    const p = this.v.port;
    if (!Number.isInteger(p) || p < 0 || p > 0xffffffff) throw new ArgError('`port` (a whole number, 1-65535) is required');
    return p;
  }

  /** The command: every argument but the key, as the API takes it. */
  command() {
    const { key: _k, ...rest } = this.v;
    return rest;
  }
}

/** tools.rs `streamed_outcome`, without the base64 copies (the tool drops them). */
function streamedOutcome(exit, out) {
  const dec = new TextDecoder();
  return {
    exit_code: exit.exit_code,
    stdout: dec.decode(concat(out.stdout)),
    stderr: dec.decode(concat(out.stderr)),
    timed_out: exit.timed_out,
    truncated: exit.truncated,
    killed: exit.killed,
    denials: exit.denials,
    admitted: exit.admitted,
    limits: exit.limits,
  };
}

function jsonResponse(v, headers = {}) {
  return new Response(JSON.stringify(v), { status: 200, headers: { 'content-type': 'application/json', ...headers } });
}

/** A body's text, or undefined past MAX_BODY_BYTES (declared or counted). */
async function boundedText(request) {
  if (Number(request.headers.get('content-length') ?? 0) > MAX_BODY_BYTES) {
    request.body?.cancel().catch(() => {});
    return undefined;
  }
  const body = await boundedBody(request);
  return body && new TextDecoder().decode(body);
}
