// The deployment's Worker: the public HTTP API of host/src/api/mod.rs (docs/openapi.json)
// in front of one Durable Object per sandbox key (sandbox.js), over nodes
// (docs/NODE.md).
//
// * Auth: `Authorization: Bearer` with the API token (`API_TOKEN`, a secret binding);
//   approvals and secrets take the approver's (`APPROVER_TOKEN`); the consumer's token
//   on those is 403 `approver-only`. Both trimmed, as `stockade serve` trims its token
//   files, and compared in constant time (api.js `envTokens`, `bearerRefusal`).
// * Sandbox routes go to `SANDBOX.idFromName(key)`; the key is checked against the
//   grammar's key rule first (1..=128 of [A-Za-z0-9._-], not starting with '.').
// * Secrets: the Registry object holds each secret's binding (never its value); a PUT
//   fans the value out to every node (`put-secret`), a DELETE removes it from every
//   node (`remove-secret`); it succeeds only when every node answered.
// * Node call backs (`POST /v1/nodes/events`, signed by the node): verified with that
//   node's secret and sent to the key's object as `on-stop`.

import { DurableObject } from 'cloudflare:workers';
import { apiError, BadRequest, bearer, bearerRefusal, boundedBody, callErrorStatus, envTokens, json, MAX_BODY_BYTES, same, stringFields } from './api.js';
import { nodesFromEnv } from './nodes.js';
import { HEADERS, verify } from './sign.js';
import { HOLD_HEADER, INTERNAL_HEADER, KEY_HEADER } from './sandbox.js';
import { ensuring, noSnapshot, Pattern, splitToken } from './scope.js';
import { tenantsOf } from './tenants.js';
import { allowedMethods, dotSegments, rawPath } from './routes.js';
import { answerPending, listPending, pendingQuery } from './pending.js';
import { McpServer, admit, configuredOrigins } from './mcp.js';
import { bounded, jsonText, knownOf, listing, listQuery, MAX_LISTED } from './lifetime.js';
import { JspiRuntime, CallError } from './jspi-host.js';
import openapi from './jspi/openapi.json';

export { Sandbox } from './sandbox.js';
export { Tenants } from './tenants.js';
export { Known } from './known.js';

const log = (level, event, fields, target = 'stockade::edge') => {
  const line = { target, level, event, ...Object.fromEntries(fields ?? []) };
  (level === 'error' || level === 'warn' ? console.error : console.log)(JSON.stringify(line));
};

/** The grammar's key rule (grammar/src/names.rs `key`): 1..=128 of [A-Za-z0-9._-],
 * not starting with '.'. */
export function validKey(k) {
  return typeof k === 'string' && /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/.test(k);
}

/** The grammar's secret name rule (grammar/src/names.rs `secret_name`). */
export function validSecretName(n) {
  return typeof n === 'string' && /^[a-z0-9][a-z0-9._-]{0,63}$/.test(n);
}

/** The secret bindings: name -> {host, port, methods, path_prefix, updated_ms}. */
export class Registry extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(`CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, host TEXT NOT NULL, port INTEGER NOT NULL,
                     methods TEXT NOT NULL, path_prefix TEXT NOT NULL, updated_ms INTEGER NOT NULL)`);
  }

  list() {
    return this.sql
      .exec('SELECT * FROM secrets ORDER BY name')
      .toArray()
      .map((r) => ({ ...r, methods: JSON.parse(r.methods) }));
  }

  async fetch(request) {
    const url = new URL(request.url);
    if (url.pathname === '/bindings') return json(this.list());
    if (url.pathname === '/set' && request.method === 'POST') {
      const b = await request.json();
      this.sql.exec(
        'INSERT OR REPLACE INTO secrets (name, host, port, methods, path_prefix, updated_ms) VALUES (?, ?, ?, ?, ?, ?)',
        b.name,
        b.host,
        b.port,
        JSON.stringify(b.methods),
        b.path_prefix,
        Date.now(),
      );
      return json({ ok: true });
    }
    if (url.pathname === '/remove' && request.method === 'POST') {
      const { name } = await request.json();
      const had = this.sql.exec('SELECT name FROM secrets WHERE name = ?', name).toArray().length > 0;
      this.sql.exec('DELETE FROM secrets WHERE name = ?', name);
      return json({ removed: had });
    }
    return apiError(404, 'not-found', 'no such route');
  }
}

/** The live scoped token a request presents ({id, keys, ceiling}, from the Tenants
 * object), or null: the operator's, the approver's, one not in the `stk_` shape, a
 * wrong or revoked one. Only a token in that shape costs a call to the object. */
async function presentedTenant(request, env) {
  const t = bearer(request.headers.get('authorization'));
  if (!splitToken(t)) return null;
  const { api, approver } = envTokens(env);
  if ((api !== undefined && same(t, api)) || (approver !== undefined && same(t, approver))) return null;
  return tenantsOf(env).verify(t);
}

/** `/v1/tokens` (the operator's token; deploy.js checked it): make, list, revoke. */
async function tokens(request, env, path) {
  const book = tenantsOf(env);
  let r;
  if (path === '/v1/tokens') {
    if (request.method === 'GET') return json(await book.list());
    const body = await boundedBody(request);
    if (body === undefined) return apiError(413, 'payload-too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
    r = await book.create(new TextDecoder().decode(body));
    return r.error ? apiError(...r.error) : json(r.created, 201);
  }
  let id;
  try {
    id = decodeURIComponent(path.slice('/v1/tokens/'.length));
  } catch {
    return apiError(400, 'invalid-input', 'the token id does not decode');
  }
  r = await book.revoke(id);
  return r.error ? apiError(...r.error) : json(r.revoked);
}

/** Key objects asked at once by a listing. */
const LISTING_FAN_OUT = 16;

/** A records store holding nothing (the guest's listing check, below). */
const NO_RECORDS = {
  put: () => {
    throw new Error('read only');
  },
  get: () => undefined,
  remove: () => false,
  list: () => [],
  find: () => [],
};

/**
 * `GET /v1/sandboxes` (api/sandboxes.rs `list`): the query read (`prefix`, nothing
 * else), narrowed to a scoped token's pattern (lifetime.js `listing`), the registry's
 * known keys with that prefix (known.js; at most 1024), each described by its own
 * object (those answering none dropped), by key. A prefix is checked as the guest's
 * `sandboxes` checks it (a key's start), by the guest itself over no records.
 */
async function listSandboxes(request, env, pattern) {
  const at = request.url.indexOf('?');
  const raw = at < 0 ? '' : request.url.slice(at + 1).split('#')[0];
  let wanted;
  try {
    wanted = listQuery(raw);
  } catch (e) {
    if (e instanceof BadRequest) return apiError(e.status, e.code, e.message);
    throw e;
  }
  const l = listing(pattern, wanted);
  let keys = [];
  if (l.one !== undefined) keys = [l.one];
  else if (l.prefix !== undefined) {
    if (l.prefix !== '') {
      try {
        await new JspiRuntime({ substrate: null, store: NO_RECORDS, log }).call('sandboxes', l.prefix);
      } catch (e) {
        if (e instanceof CallError) return apiError(...callErrorStatus(e));
        throw e;
      }
    }
    keys = await knownOf(env).keys(l.prefix, MAX_LISTED);
  }
  keys = keys.filter((k) => !pattern || pattern.matches(k));
  const infos = await bounded(keys, LISTING_FAN_OUT, (k) => env.SANDBOX.get(env.SANDBOX.idFromName(k)).describeKey(k));
  return jsonText(`{"sandboxes":[${infos.filter((i) => i !== null).join(',')}]}`);
}

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);

/** The largest secret value (egress/src/secrets.rs `MAX_SECRET_VALUE`). */
const MAX_SECRET_VALUE = 8 * 1024;

/** A secret's body as its binding (host[:port], methods, path_prefix), or an error string. */
export function parseBinding(b) {
  if (!b || typeof b !== 'object' || typeof b.value !== 'string' || typeof b.host !== 'string' || !Array.isArray(b.methods)) {
    return 'the body must be {"value": "...", "host": "api.example.com[:port]", "methods": ["GET", ...], "path_prefix": "/v1/" (optional)}';
  }
  // As the nodes' check (egress/src/secrets.rs `check_value`), before any node is asked:
  // a value one node refuses would otherwise be set on the others.
  const size = new TextEncoder().encode(b.value).length;
  if (size === 0 || size > MAX_SECRET_VALUE) return `a secret value must be 1..=${MAX_SECRET_VALUE} bytes`;
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x08\x0a-\x1f\x7f]/.test(b.value)) return 'a secret value must not hold control characters (CR, LF, NUL, ...)';
  const m = /^([A-Za-z0-9.-]+)(?::([0-9]{1,5}))?$/.exec(b.host);
  if (!m || m[1].startsWith('*')) return `host ${JSON.stringify(b.host)}: an exact host name, optionally :port`;
  const port = m[2] === undefined ? 443 : Number(m[2]);
  if (port < 1 || port > 65535) return `host ${JSON.stringify(b.host)}: port out of range`;
  if (b.methods.length === 0 || b.methods.some((x) => !METHODS.has(x))) {
    return 'methods: one or more of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS';
  }
  const prefix = b.path_prefix ?? '/';
  if (typeof prefix !== 'string' || !prefix.startsWith('/')) return 'path_prefix must start with /';
  return { host: m[1].toLowerCase(), port, methods: [...b.methods], path_prefix: prefix };
}

async function secrets(request, env, name) {
  const reg = env.REGISTRY.get(env.REGISTRY.idFromName('secrets'));
  const nodes = nodesFromEnv(env, log);
  if (name === undefined) {
    if (request.method !== 'GET') return apiError(405, 'method-not-allowed', 'method not allowed on this route');
    const list = await (await reg.fetch('https://registry/bindings')).json();
    return json({
      secrets: list.map((s) => ({
        name: s.name,
        source: 'api',
        updated_ms: s.updated_ms,
        // As grammar's Binding display (api.rs answers it): `GET,POST host:port/prefix`.
        binding: `${s.methods.join(',')} ${s.host}:${s.port}${s.path_prefix}`,
      })),
    });
  }
  if (!validSecretName(name)) return apiError(400, 'invalid-input', `secret name ${JSON.stringify(name)} is not valid`);
  if (request.method === 'PUT') {
    let body;
    try {
      body = JSON.parse(await request.text());
    } catch {
      body = undefined;
    }
    const b = parseBinding(body);
    if (typeof b === 'string') return apiError(400, body ? 'invalid-input' : 'malformed-json', b);
    const results = await Promise.allSettled(
      nodes.map((n) => n.call('', 'put-secret', { name, value: body.value, ...b })),
    );
    const failed = results.map((r, i) => [r, nodes[i].name]).filter(([r]) => r.status === 'rejected');
    if (failed.length) {
      const why = failed.map(([r, n]) => `${n}: ${r.reason?.val ?? r.reason?.tag ?? r.reason}`).join('; ');
      return apiError(502, 'unreachable', `the secret was not set on every node (${why})`);
    }
    await reg.fetch('https://registry/set', { method: 'POST', body: JSON.stringify({ name, ...b }) });
    log('info', 'secret set', [
      ['secret', name],
      ['nodes', String(nodes.length)],
    ]);
    return new Response(null, { status: 204 });
  }
  if (request.method === 'DELETE') {
    const r = await (await reg.fetch('https://registry/remove', { method: 'POST', body: JSON.stringify({ name }) })).json();
    const removed = await Promise.allSettled(nodes.map((n) => n.call('', 'remove-secret', { name })));
    const anywhere = r.removed || removed.some((x) => x.status === 'fulfilled' && x.value === true);
    if (!anywhere) return apiError(404, 'not-found', `no secret ${JSON.stringify(name)}`);
    log('info', 'secret removed', [['secret', name]]);
    return new Response(null, { status: 204 });
  }
  return apiError(405, 'method-not-allowed', 'method not allowed on this route');
}

/** Nonces of node call backs seen in the last two windows (this isolate's; bounded:
 * full, a call back is refused rather than a live nonce forgotten, as auth.rs Nonces). */
const seenNonces = new Map();
const NONCE_CAPACITY = 10_000;
function acceptNonce(nonce, nowMs) {
  for (const [n, t] of seenNonces) {
    if (nowMs - t <= 60_000) break;
    seenNonces.delete(n);
  }
  if (seenNonces.has(nonce)) return 'replayed';
  if (seenNonces.size >= NONCE_CAPACITY) return 'busy';
  seenNonces.set(nonce, nowMs);
  return null;
}

/** A node's call back: verified with that node's secret, then `on-stop` for the key. */
async function nodeEvent(request, env) {
  const body = new Uint8Array(await request.arrayBuffer());
  const name = request.headers.get(HEADERS.node) ?? '';
  const node = nodesFromEnv(env, log).find((n) => n.name === name);
  if (!node) return apiError(401, 'unauthorized', 'unknown node');
  const req = {
    timeMs: Number(request.headers.get(HEADERS.time)),
    nonce: request.headers.get(HEADERS.nonce) ?? '',
    method: 'POST',
    path: '/v1/nodes/events',
    key: request.headers.get(HEADERS.key) ?? '',
    idempotency: request.headers.get(HEADERS.idempotency) ?? '',
    body,
  };
  const now = Date.now();
  const refused =
    (await verify(node.secret, req, request.headers.get(HEADERS.signature) ?? '', now)) ?? acceptNonce(req.nonce, now);
  if (refused) {
    log('warn', 'node call back refused', [
      ['node', name],
      ['why', refused],
    ]);
    return apiError(401, 'unauthorized', 'bad signature');
  }
  let ev;
  try {
    ev = JSON.parse(new TextDecoder().decode(body));
  } catch {
    return apiError(400, 'malformed-json', 'not JSON');
  }
  if (!validKey(req.key) || ev?.node !== name || typeof ev?.stopped !== 'string') {
    return apiError(400, 'invalid-input', 'an event is {node, stopped} for a key');
  }
  const stub = env.SANDBOX.get(env.SANDBOX.idFromName(req.key));
  return stub.fetch(`https://sandbox/v1/sandboxes/${encodeURIComponent(req.key)}/on-stop`, {
    method: 'POST',
    headers: { [KEY_HEADER]: req.key, [INTERNAL_HEADER]: 'node-event' },
    body: JSON.stringify({ container: ev.stopped }),
  });
}

// How much of a body declared too large is read (and dropped) before the 413 (not
// exported: a Worker's main module exports handlers only).
const DRAIN_BYTES = 2 * MAX_BODY_BYTES;

/** 413 for a body declared past MAX_BODY_BYTES, after reading and dropping it up to
 * DRAIN_BYTES: a client still sending then gets the answer, not a reset (workerd
 * closes a connection whose request body is left unread), as api.rs's server answers
 * it. Past DRAIN_BYTES the connection is dropped unread. */
async function tooLarge(request) {
  await drain(request);
  return apiError(413, 'payload-too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
}

/** Read and drop a request's body, up to DRAIN_BYTES (then the connection is dropped). */
async function drain(request) {
  if (request.body) {
    const reader = request.body.getReader();
    let n = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      n += value.length;
      if (n > DRAIN_BYTES) {
        reader.cancel().catch(() => {});
        break;
      }
    }
  }
}

/** Uploads this isolate streams at once, and its bound (api/upload.rs's per server:
 * here per isolate; one more is 429 `uploads-busy`, its body drained unread). */
let uploads = 0;
const MAX_CONCURRENT_UPLOADS = 4;

/** 405 with the `Allow` header (RFC 9110) listing what the route takes. */
function methodNotAllowed(allowed) {
  const r = apiError(405, 'method-not-allowed', 'method not allowed on this route');
  r.headers.set('allow', allowed.join(', '));
  return r;
}

/**
 * `/mcp` (src/mcp.js): the one object holding the MCP sessions and the requests
 * running now, so a session or a cancellation is found whichever isolate a request
 * reaches. Each tool call is a request to this Worker's own handler, in place, with
 * the caller's token: the same routes and checks as any client's.
 */
export class McpSessions extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.mcp = new McpServer({ api: (r) => handler.fetch(r, env), doc: openapi, validKey, sql: ctx.storage.sql, log });
  }

  async fetch(request) {
    // The Worker admitted it; the object trusts no caller and checks again.
    const scoped = (await presentedTenant(request, this.env)) !== null;
    const a = admit(request, envTokens(this.env).api, configuredOrigins(this.env), { scoped });
    return a.refused ?? this.mcp.serve(request, a.token);
  }
}

const handler = {
  async fetch(request, env) {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path === '/v1/health') {
      return request.method === 'GET' ? json({ ok: true }) : methodNotAllowed(['GET']);
    }
    if (path === '/v1/nodes/events' && request.method === 'POST') return nodeEvent(request, env);
    if (path === '/mcp') {
      // The Origin and the token first (before the body), then the sessions' object. A
      // scoped token's tools call the API with it: they reach its keys only.
      const scoped = (await presentedTenant(request, env)) !== null;
      const a = admit(request, envTokens(env).api, configuredOrigins(env), { scoped });
      return a.refused ?? env.MCP.get(env.MCP.idFromName('mcp')).fetch(request);
    }
    const tenant = await presentedTenant(request, env);
    const refused = bearerRefusal(path, request.headers.get('authorization'), envTokens(env), tenant);
    if (refused) return apiError(...refused);
    // The keys the caller reaches: a scoped token's pattern's; the operator's, every key.
    const pattern = tenant ? Pattern.parse(tenant.keys).pattern : undefined;
    const reaches = (k) => !pattern || pattern.matches(k);
    // A `.` or `..` segment on the path as sent (`new URL` resolved it in `path`):
    // what `stockade serve` answers (routes.js).
    const dots = dotSegments(rawPath(request.url));
    if (dots) return apiError(...dots);
    // A known route asked with another method: 405 naming the ones it takes.
    const allowed = allowedMethods(path);
    if (allowed && !allowed.includes(request.method)) return methodNotAllowed(allowed);
    // A consumer's own scope (api/tenants.rs `own`): a scoped token's pattern and id; the
    // operator's reaches every key.
    if (path === '/v1/tokens/self') return json(tenant ? { keys: tenant.keys, id: tenant.id } : { keys: '*' });
    // Uploads stream (PUT …/files[/PATH]); every other body is bounded here first.
    const upload = request.method === 'PUT' && /^\/v1\/sandboxes\/[^/]+\/files(\/|$)/.test(path);
    if (!upload && Number(request.headers.get('content-length') ?? 0) > MAX_BODY_BYTES) return tooLarge(request);
    // Making, listing and revoking scoped tokens (the operator's token: checked above).
    if (path === '/v1/tokens' || /^\/v1\/tokens\/[^/]+$/.test(path)) return tokens(request, env, path);
    // Pending egress decisions are the nodes' (pending.js), never the key's object's:
    // it may be inside the exec that is held.
    if (path === '/v1/egress/pending') {
      const q = pendingQuery(url.searchParams);
      return q.refused ?? listPending(nodesFromEnv(env, log), q.key, reaches);
    }
    const answer = /^\/v1\/egress\/pending\/([^/]+)$/.exec(path);
    if (answer) {
      let id;
      try {
        id = decodeURIComponent(answer[1]);
      } catch {
        id = '';
      }
      return answerPending(nodesFromEnv(env, log), id, await request.text(), log);
    }
    if (path === '/v1/sandboxes') return listSandboxes(request, env, pattern);
    // A keyed route: `/v1/sandboxes/{key}` itself (describe, forget) or below it.
    const s = /^\/v1\/sandboxes\/([^/]+)(?:\/(.+))?$/.exec(path);
    if (s) {
      const rest = s[2] ?? '';
      let key;
      try {
        key = decodeURIComponent(s[1]);
      } catch {
        return apiError(400, 'invalid-input', 'the key does not decode');
      }
      // A key outside a scoped token's pattern: the bytes of a key nobody holds (api/auth.rs
      // `no_such_sandbox`), before the key is read further or any object is touched.
      if (!reaches(key)) {
        log('info', "a key outside the token's pattern", [['tenant', tenant.id], ['key', key]], 'stockade::api');
        if (upload) await drain(request);
        return apiError(404, 'not-found', 'no such sandbox');
      }
      if (!validKey(key)) return apiError(400, 'invalid-input', `key ${JSON.stringify(key)} is not valid`);
      if (rest === 'egress/pending') return listPending(nodesFromEnv(env, log), key, reaches);
      const headers = new Headers(request.headers);
      headers.set(KEY_HEADER, key);
      headers.delete(INTERNAL_HEADER);
      headers.delete(HOLD_HEADER);
      let forwarded = request;
      if (tenant && request.method === 'POST' && rest === 'fork') {
        // A fork names a second key, its source: one outside the pattern is refused as a
        // source holding no such snapshot (api/snapshots.rs), before its object is asked.
        const body = await boundedBody(request);
        if (body === undefined) return apiError(413, 'payload-too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
        const text = new TextDecoder().decode(body);
        let b;
        try {
          b = stringFields(text, ['source', 'name']);
        } catch (e) {
          if (!(e instanceof BadRequest)) throw e;
        }
        if (b && !reaches(b.source)) {
          log('info', "a fork's source outside the token's pattern", [['tenant', tenant.id], ['key', b.source]], 'stockade::api');
          return apiError(404, 'not-found', noSnapshot(b.source, b.name));
        }
        headers.delete('content-length');
        forwarded = new Request(request, { body: text, headers });
      }
      // A scoped token's call that may create a container: within its share, holding its
      // place until the container is live or the call ended (a terminal: the session,
      // released by the key's object).
      let hold;
      if (tenant && ensuring(request.method, rest)) {
        const a = await tenantsOf(env).admit(tenant.id, key);
        if (a.error) {
          if (upload) await drain(request);
          return apiError(...a.error);
        }
        hold = a.hold;
      }
      const pty = request.method === 'GET' && rest === 'pty';
      if (hold && pty) headers.set(HOLD_HEADER, hold);
      const stub = env.SANDBOX.get(env.SANDBOX.idFromName(key));
      const send = () => stub.fetch(new Request(forwarded, { headers }));
      let held = hold !== undefined;
      const release = async () => {
        if (!held) return;
        held = false;
        await tenantsOf(env).release(hold).catch(() => {});
      };
      try {
        if (!upload) {
          const r = await send();
          // A session started: its object releases the place when it ends.
          if (pty && r.status === 101) held = false;
          return r;
        }
        if (uploads >= MAX_CONCURRENT_UPLOADS) {
          await drain(request);
          return apiError(429, 'uploads-busy', `${MAX_CONCURRENT_UPLOADS} uploads are in progress on this server: retry`);
        }
        uploads += 1;
        try {
          return await send();
        } finally {
          uploads -= 1;
        }
      } finally {
        await release();
      }
    }
    if (path === '/v1/secrets') return secrets(request, env, undefined);
    const sec = /^\/v1\/secrets\/([^/]+)$/.exec(path);
    if (sec) return secrets(request, env, decodeURIComponent(sec[1]));
    return apiError(404, 'not-found', 'no such route');
  },
};

export default handler;
