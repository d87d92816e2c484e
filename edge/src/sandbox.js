// One Durable Object per sandbox key (`idFromName(key)`): the key's guest calls, its
// `records` and approvals in the object's SQLite (`ctx.storage.sql`), the node it was
// placed on, and its idle checkpoint (the object's alarm).
//
// Why a queue: a Durable Object's input gate opens while one of its fetches is
// pending, and every substrate import here is a fetch to a node, so two requests for
// the key would otherwise interleave their guest calls over the same records. Every
// guest call goes through `this.queue` (one at a time, in arrival order); the stream
// of a live `exec` holds it until the run ends.
//
// The Worker (deploy.js) has checked the bearer token and forwards the public request
// with the decoded key in `x-stockade-sandbox-key`.

import { DurableObject } from 'cloudflare:workers';
import { JspiRuntime, CallError } from './jspi-host.js';
import { RemoteSubstrate, nodesFromEnv } from './nodes.js';
import {
  apiError,
  BadRequest,
  boundedBody,
  callErrorStatus,
  detachedInput,
  detachedState,
  execInput,
  exitEvent,
  grantBindingError,
  grantBody,
  json,
  MAX_BODY_BYTES,
  outcome,
  ptyFrame,
  stringFields,
  Utf8Chunker,
} from './api.js';
import { cmpBytes } from './mock.js';
import { noSnapshot } from './scope.js';
import { infoJson, jsonText, knownOf, lifetimeBody, metadataBody } from './lifetime.js';
import * as uploads from './upload.js';

export const KEY_HEADER = 'x-stockade-sandbox-key';
/** Set only by the Worker for a verified node call back (stripped from public requests). */
export const INTERNAL_HEADER = 'x-stockade-internal';
/** Set only by the Worker (stripped from public requests): a terminal's place in its
 * tenant's share, held for the session and released by this object when it ends. */
export const HOLD_HEADER = 'x-stockade-hold';
const DEFAULT_IDLE_MS = 600_000;
/** The container's egress proxy's port: the guest never opens a door onto it (api.rs `PROXY_PORT`). */
const PROXY_PORT = 3128;
const DEFAULT_APPROVAL_TTL_MS = 900_000;

/** The guest's records of lifetimes (guest/src/decide/lifetime.rs `LIFETIMES`): the key's
 * is its name there, `"<ends-at-ms> <abort|checkpoint>"`. Read here only to set the
 * object's alarm at its end; the guest decides what ended. */
const LIFETIMES = '~lifetimes';
/** A lifetime whose end did not take (a stop that failed) is looked at again this much later. */
const LIFETIME_RETRY_MS = 1000;

/** `GET …/pty`: how long the client has to send its start (host/src/api/pty.rs), and
 * how long the object stays silent before it probes the client (an empty message). */
const PTY_START_WITHIN_MS = 10_000;
const PTY_PROBE_MS = 1000;

/** The records and approvals of one key in the object's SQLite. */
export class SqlStore {
  constructor(sql) {
    this.sql = sql;
    sql.exec(`CREATE TABLE IF NOT EXISTS records (scope TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
                PRIMARY KEY (scope, name))`);
    sql.exec(`CREATE TABLE IF NOT EXISTS approvals (token TEXT PRIMARY KEY, key TEXT NOT NULL, argv TEXT NOT NULL,
                expires_ms INTEGER NOT NULL)`);
    sql.exec(`CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)`);
  }

  put(scope, name, value) {
    this.sql.exec('INSERT OR REPLACE INTO records (scope, name, value) VALUES (?, ?, ?)', scope, name, value);
  }

  get(scope, name) {
    const rows = this.sql.exec('SELECT value FROM records WHERE scope = ? AND name = ?', scope, name).toArray();
    return rows.length ? rows[0].value : undefined;
  }

  remove(scope, name) {
    const had = this.get(scope, name) !== undefined;
    if (had) this.sql.exec('DELETE FROM records WHERE scope = ? AND name = ?', scope, name);
    return had;
  }

  list(scope, prefix) {
    return this.sql
      .exec('SELECT name, value FROM records WHERE scope = ?', scope)
      .toArray()
      .filter((r) => r.name.startsWith(prefix))
      .sort((a, b) => cmpBytes(a.name, b.name))
      .map((r) => ({ name: r.name, value: r.value }));
  }

  find(prefix, value) {
    return this.sql
      .exec('SELECT scope, name FROM records WHERE value = ?', value)
      .toArray()
      .filter((r) => r.name.startsWith(prefix))
      .map((r) => [r.scope, r.name])
      .sort((x, y) => cmpBytes(x[0], y[0]) || cmpBytes(x[1], y[1]));
  }

  count() {
    return this.sql.exec('SELECT count(*) AS n FROM records').one().n;
  }

  recordApproval(key, argv, expiresMs) {
    const token = crypto.randomUUID();
    this.sql.exec(
      'INSERT INTO approvals (token, key, argv, expires_ms) VALUES (?, ?, ?, ?)',
      token,
      key,
      JSON.stringify(argv),
      expiresMs,
    );
    return token;
  }

  peekApproval(key, token, nowMs) {
    const rows = this.sql.exec('SELECT key, argv, expires_ms FROM approvals WHERE token = ?', token).toArray();
    if (!rows.length || rows[0].key !== key || rows[0].expires_ms <= nowMs) return undefined;
    return JSON.parse(rows[0].argv);
  }

  takeApproval(key, token, nowMs) {
    const rows = this.sql.exec('SELECT key, argv, expires_ms FROM approvals WHERE token = ?', token).toArray();
    if (!rows.length || rows[0].key !== key) return undefined;
    this.sql.exec('DELETE FROM approvals WHERE token = ?', token);
    return rows[0].expires_ms > nowMs ? JSON.parse(rows[0].argv) : undefined;
  }

  meta(name) {
    const rows = this.sql.exec('SELECT value FROM meta WHERE name = ?', name).toArray();
    return rows.length ? rows[0].value : undefined;
  }

  setMeta(name, value) {
    this.sql.exec('INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)', name, value);
  }
}

/** A snapshot-info as the API's `{name, at_ms}` (wire `Snapshot`). */
const snapshotJson = (s) => ({ name: s.name, at_ms: Number(s.atMs) });

/** The record the guest keeps of a key's snapshot `name` (guest/src/decide/snapshots.rs
 * `record_name`): read here only to lend it to a fork from another key. */
const snapshotRecord = (name) => `snapshot/${name}`;

/** A path parameter percent-decoded; one that does not decode is the 400
 * `invalid-input` api.rs's `Params` answers. */
function pathParam(raw) {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new BadRequest(400, 'invalid-input', `the path parameter ${JSON.stringify(raw)} does not decode`);
  }
}

/** `?name=` as a non-negative integer at most `max` (api.rs's `u64`/`u32` query
 * fields), undefined when absent; anything else is a 400 `invalid-input`. */
export function queryInt(params, name, max) {
  const all = params.getAll(name);
  if (all.length === 0) return undefined;
  const v = all[0];
  if (all.length > 1 || !/^[0-9]{1,20}$/.test(v) || BigInt(v) > max) {
    throw new BadRequest(400, 'invalid-input', `${name}: expected one non-negative integer`);
  }
  return BigInt(v);
}

/** A body's text, at most MAX_BODY_BYTES (a chunked body is counted as it is read). */
async function bodyText(request) {
  const body = await boundedBody(request);
  if (body === undefined) throw new BadRequest(413, 'payload-too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
  return new TextDecoder().decode(body);
}

const log = (level, event, fields) => {
  if (level === 'debug') return;
  const line = { target: 'stockade::edge', level, event, ...Object.fromEntries(fields ?? []) };
  (level === 'error' || level === 'warn' ? console.error : console.log)(JSON.stringify(line));
};

/** A time an alarm can be set at: after the epoch (setAlarm refuses <= 0) and within
 * what a JavaScript Date holds (8.64e15 ms; a lifetime may end at up to 2^53 - 1, and
 * an alarm that far away is one that does not come: the lifetime is checked again
 * when it does). */
const alarmTime = (ms) => Math.min(Math.max(ms, 1), 8.64e15);

export class Sandbox extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.store = new SqlStore(ctx.storage.sql);
    this.queue = Promise.resolve();
    this.nodes = nodesFromEnv(env, log);
    // Woken with a lifetime recorded and no alarm (one lost): armed again at its end.
    ctx.blockConcurrencyWhile(async () => {
      const key = this.key();
      const at = key === undefined ? undefined : this.lifetimeEnd(key);
      if (at !== undefined && (await ctx.storage.getAlarm()) === null) await ctx.storage.setAlarm(alarmTime(at));
    });
  }

  /** When the key's recorded lifetime ends (ms), or undefined: none. A record that does
   * not read is due now (the guest ends it as an abort). */
  lifetimeEnd(key) {
    const v = this.store.get(LIFETIMES, key);
    if (v === undefined) return undefined;
    const ms = Number(/^([0-9]+) /.exec(v)?.[1]);
    return Number.isFinite(ms) ? ms : Date.now();
  }

  /** The alarm at `ms` at the latest (an earlier one pending stays: it re-arms). */
  async armBy(ms) {
    const cur = await this.ctx.storage.getAlarm();
    if (cur === null || cur > ms) await this.ctx.storage.setAlarm(alarmTime(ms));
  }

  /** Tell the registry of known keys (known.js) whether `key` is known now. A registry
   * that cannot be told is logged: the key's own records stay the truth, and a listing
   * drops a key its object no longer describes. */
  async tellKnown(key, known) {
    try {
      await knownOf(this.env).note(key, known);
    } catch (e) {
      log('warn', 'the registry of known keys was not told', [
        ['key', key],
        ['known', String(known)],
        ['error', String(e?.message ?? e)],
      ]);
    }
  }

  /** The key described (`GET /v1/sandboxes/{key}`): its info's JSON, or the 404 of a
   * key nobody holds (api/sandboxes.rs `described`). */
  async described(key) {
    const i = await this.guest(key, 'describe', []);
    return i ? jsonText(infoJson(i)) : apiError(404, 'not-found', 'no such sandbox');
  }

  /** For a listing (deploy.js): the key's info as JSON text, or null when it is not
   * known (the registry told so too). */
  async describeKey(key) {
    if (!this.key()) this.store.setMeta('key', key);
    const i = await this.guest(key, 'describe', []);
    if (!i) await this.tellKnown(key, false);
    return i ? infoJson(i) : null;
  }

  /** Run `fn` after every call queued before it (one guest call at a time). */
  serialize(fn) {
    const run = this.queue.then(fn, fn);
    this.queue = run.then(
      () => {},
      () => {},
    );
    return run;
  }

  key() {
    return this.store.meta('key');
  }

  /** Does `key` hold a live container (its node's `current`)? For the tenants' object
   * (tenants.js), counting a share: not a guest call, so not queued behind one. A key
   * never placed holds none; a node that cannot be asked throws (counted as live). */
  async live(key) {
    if (!this.store.meta('node')) return false;
    const substrate = new RemoteSubstrate({
      key,
      nodes: this.nodes,
      placement: { get: () => this.store.meta('node'), set: () => {} },
      log,
    });
    return (await substrate.current(key)) !== undefined;
  }

  /** The secret bindings (prefetched per call: `policy.secret-binding` is synchronous). */
  async bindings() {
    const reg = this.env.REGISTRY.get(this.env.REGISTRY.idFromName('secrets'));
    const r = await reg.fetch('https://registry/bindings');
    const list = await r.json();
    return new Map(
      list.map((b) => [b.name, { host: b.host, port: b.port, methods: b.methods, pathPrefix: b.path_prefix }]),
    );
  }

  async runtime(key, substrateHooks = {}, store = this.store) {
    const substrate = new RemoteSubstrate({
      key,
      nodes: this.nodes,
      placement: {
        get: () => this.store.meta('node'),
        set: (name) => this.store.setMeta('node', name),
      },
      log,
      heartbeatMs: Number(this.env.HEARTBEAT_MS ?? 1000),
    });
    Object.assign(substrate, substrateHooks);
    // The deployment's floor rules (`FLOOR`, deploy-config's `floor`), else the defaults.
    const floor = Array.isArray(this.env.FLOOR) ? this.env.FLOOR : undefined;
    return new JspiRuntime({ substrate, store, bindings: await this.bindings(), log, ...(floor ? { floor } : {}) });
  }

  /** One guest call, queued; the idle alarm is pushed back after it. `store`: the
   * records the guest reads and writes (this object's, or them with a lent record). */
  guest(key, name, args, hooks, store = this.store) {
    return this.serialize(async () => {
      try {
        const rt = await this.runtime(key, hooks, store);
        return await rt.call(name, key, ...args);
      } finally {
        this.noteCall();
        // A pending alarm reads the last call when it fires and re-arms for last +
        // IDLE_MS (`alarm`), so the checkpoint still comes IDLE_MS after the last call;
        // one is set only when none is pending: no alarm write per call (a write per call
        // holds the answer for its commit, as below).
        if ((await this.ctx.storage.getAlarm()) === null) {
          await this.ctx.storage.setAlarm(Date.now() + this.idleMs());
        }
      }
    });
  }

  /**
   * A call ended now. Kept in memory, and written to storage only when the stored time
   * is IDLE_MS/4 old or more: a storage write per call holds every answer for its
   * commit. After an eviction the stored time may be up to IDLE_MS/4 early,
   * so the alarm may ask the node early; the node's own clock (a container touched
   * within IDLE_MS is not idle) still decides, so no container is checkpointed sooner.
   */
  noteCall() {
    const now = Date.now();
    this.lastCallMs = now;
    if (now - this.storedLastCall() >= this.idleMs() / 4) this.store.setMeta('last_call_ms', String(now));
  }

  storedLastCall() {
    return Number(this.store.meta('last_call_ms') ?? 0);
  }

  /** The last call's end: this instance's, or the stored one after an eviction. */
  lastCall() {
    return Math.max(this.lastCallMs ?? 0, this.storedLastCall());
  }

  idleMs() {
    const v = Number(this.env.IDLE_MS ?? DEFAULT_IDLE_MS);
    return Number.isFinite(v) && v > 0 ? v : DEFAULT_IDLE_MS;
  }

  /**
   * The object's one alarm: a lifetime's end (`lifetimeAlarm`) and the idle checkpoint
   * (`idleAlarm`), re-armed for the sooner of their next looks.
   */
  async alarm() {
    const key = this.key();
    if (!key) return;
    const next = [await this.lifetimeAlarm(key), await this.idleAlarm(key)].filter((t) => t !== undefined);
    if (next.length) await this.ctx.storage.setAlarm(alarmTime(Math.min(...next)));
  }

  /**
   * A lifetime's end (docs/EMBEDDING.md, the events a host asks): when the key's
   * recorded lifetime is due, the guest is asked `expiring` and, if it names the key,
   * `end-lifetime(key)`, in the object's queue as every mutation of the key (the guest
   * checks again, then aborts and forgets, or checkpoints); the registry is told
   * whether the key is still known. A lifetime still there after (a stop that failed)
   * is looked at again a second later. The time of the next look, or undefined: none.
   */
  async lifetimeAlarm(key) {
    const at = this.lifetimeEnd(key);
    if (at === undefined) return undefined;
    if (Date.now() < at) return at;
    try {
      await this.serialize(async () => {
        const rt = await this.runtime(key);
        const due = await rt.call('expiring');
        if (!due.includes(key)) return;
        const ended = await rt.call('endLifetime', key);
        const still = await rt.call('describe', key);
        await this.tellKnown(key, still !== undefined);
        log(ended ? 'info' : 'warn', 'lifetime end', [
          ['key', key],
          ['ended', String(ended)],
        ]);
      });
    } catch (e) {
      log('warn', 'lifetime end failed', [
        ['key', key],
        ['error', String(e?.message ?? e)],
      ]);
    }
    const again = this.lifetimeEnd(key);
    return again === undefined ? undefined : Math.max(again, Date.now() + LIFETIME_RETRY_MS);
  }

  /**
   * The idle checkpoint. When no call came for IDLE_MS, the key's node is asked which
   * of its containers have been idle that long (no process, no call: a running
   * detached process keeps a container busy); if this key's is, the object runs the
   * guest's `checkpoint` (snapshot, stop). Otherwise it looks again a quarter of
   * IDLE_MS later. The time of its next look, or undefined: none.
   */
  async idleAlarm(key) {
    const placed = this.store.meta('node');
    if (!placed) return undefined;
    const idleMs = this.idleMs();
    const last = this.lastCall();
    if (Date.now() - last < idleMs) return last + idleMs;
    const again = () => Date.now() + Math.max(100, Math.floor(idleMs / 4));
    const node = this.nodes.find((n) => n.name === placed);
    let idle;
    try {
      idle = node ? await node.call('', 'idle', { idle_for_ms: idleMs }) : [];
    } catch (e) {
      log('warn', 'idle check failed', [
        ['key', key],
        ['node', placed],
        ['error', String(e?.val ?? e?.message ?? e)],
      ]);
      return again();
    }
    if (!Array.isArray(idle) || !idle.includes(key)) {
      log('info', 'idle alarm: the container is busy on its node', [['key', key]]);
      return again();
    }
    try {
      await this.serialize(async () => (await this.runtime(key)).call('checkpoint', key));
      log('info', 'idle checkpoint', [
        ['key', key],
        ['node', placed],
      ]);
    } catch (e) {
      log('warn', 'idle checkpoint failed', [
        ['key', key],
        ['error', String(e?.message ?? e)],
      ]);
    }
    return undefined;
  }

  /**
   * A fork's source's record of snapshot `name`, lent to this key's guest call: the
   * guest reads it (`records.get(source, …)`: does the source hold the snapshot?), and
   * the source's records are its own object's, not this one's. This object's store with
   * that one record added, read-only (the guest's fork writes none of the source's).
   */
  async lentSnapshot(source, name) {
    const record = snapshotRecord(name);
    const stub = this.env.SANDBOX.get(this.env.SANDBOX.idFromName(source));
    const r = await stub.fetch(
      `https://sandbox/v1/sandboxes/${encodeURIComponent(source)}/snapshot-record?name=${encodeURIComponent(name)}`,
      { headers: { [KEY_HEADER]: source, [INTERNAL_HEADER]: 'snapshot-record' } },
    );
    if (!r.ok) throw new Error(`the source's object answered HTTP ${r.status} for its snapshot record`);
    const { value } = await r.json();
    const mine = this.store;
    const lent = Object.create(mine);
    lent.get = (scope, n) => (scope === source && n === record ? (value ?? undefined) : mine.get(scope, n));
    return lent;
  }

  async fetch(request) {
    const key = request.headers.get(KEY_HEADER);
    // An upload's body streams to the node (edge/src/upload.js has its own bound).
    const uploading = request.method === 'PUT' && /^\/v1\/sandboxes\/[^/]+\/files(\/|$)/.test(new URL(request.url).pathname);
    if (!uploading && Number(request.headers.get('content-length') ?? 0) > MAX_BODY_BYTES) {
      return apiError(413, 'payload-too-large', `a body is at most ${MAX_BODY_BYTES} bytes`);
    }
    if (!key) return apiError(400, 'invalid-input', 'no key');
    if (!this.key()) this.store.setMeta('key', key);
    const url = new URL(request.url);
    const rest = url.pathname.split('/').slice(4); // ['', 'v1', 'sandboxes', key, ...rest]
    const route = `${request.method} ${rest[0] ?? ''}${rest.length > 1 ? '/*' : ''}`;
    try {
      switch (route) {
        case 'POST exec':
          return await this.exec(key, request);
        case 'POST exec/*':
          if (rest[1] === 'stream' && rest.length === 2) return await this.execStream(key, request);
          break;
        case 'POST detached': {
          const input = detachedInput(execInput(await bodyText(request)));
          const id = await this.guest(key, 'startDetached', [input]);
          return json({ id }, 201);
        }
        case 'GET detached/*': {
          const st = await this.guest(key, 'detachedStatus', [decodeURIComponent(rest[1])]);
          return json(detachedState(st));
        }
        case 'DELETE detached/*': {
          const id = decodeURIComponent(rest[1]);
          await this.guest(key, 'stopDetached', [id]);
          return json({ stopped: id });
        }
        // A key's lifetime, metadata, network and listing (host/src/api/sandboxes.rs):
        // the guest validates, records and, at a lifetime's end or a command's fence,
        // decides; the registry of known keys (known.js) is told after each change.
        case 'GET ':
          return await this.described(key);
        case 'DELETE ': {
          // A known key aborted, then forgotten; an unknown one the 404 (abort is for those).
          if (!(await this.guest(key, 'describe', []))) return apiError(404, 'not-found', 'no such sandbox');
          await this.guest(key, 'abort', []);
          await this.guest(key, 'forget', []);
          await this.tellKnown(key, false);
          return json({ forgotten: key });
        }
        case 'PUT lifetime': {
          const lifetime = lifetimeBody(await bodyText(request), Date.now());
          await this.guest(key, 'setLifetime', [lifetime]);
          await this.armBy(Number(lifetime.endsAtMs));
          await this.tellKnown(key, true);
          return await this.described(key);
        }
        case 'DELETE lifetime':
          await this.guest(key, 'setLifetime', [undefined]);
          await this.tellKnown(key, true);
          return await this.described(key);
        case 'PUT metadata':
          await this.guest(key, 'setMetadata', [metadataBody(await bodyText(request))]);
          await this.tellKnown(key, true);
          return await this.described(key);
        // The key's network (api/sandboxes.rs `set_network`): a grant body as an exec's
        // `grant`, its secrets checked as an exec's are (409 for one not set, 400 for a
        // rule outside its binding), then validated and recorded by the guest.
        case 'PUT network': {
          const grant = grantBody(await bodyText(request));
          await this.checkSecrets({ grant });
          await this.guest(key, 'setNetwork', [grant]);
          await this.tellKnown(key, true);
          return await this.described(key);
        }
        case 'DELETE network':
          await this.guest(key, 'setNetwork', [undefined]);
          await this.tellKnown(key, true);
          return await this.described(key);
        case 'POST ensure':
          await this.guest(key, 'ensure', []);
          return json({ ensured: key });
        case 'POST abort':
          await this.guest(key, 'abort', []);
          return json({ aborted: key });
        case 'POST checkpoint':
          await this.guest(key, 'checkpoint', []);
          return json({ checkpointed: key });
        // Named snapshots and forks (host/src/api/snapshots.rs): one guest call each; the
        // guest validates and decides, the key's node keeps the archives.
        case 'POST snapshots': {
          const { name } = stringFields(await bodyText(request), ['name']);
          return json(snapshotJson(await this.guest(key, 'saveSnapshot', [name])));
        }
        case 'GET snapshots': {
          const list = await this.guest(key, 'snapshots', []);
          return json({ snapshots: list.map(snapshotJson) });
        }
        case 'DELETE snapshots/*': {
          if (rest.length !== 2) break; // `{name}` is one segment, as api.rs routes it
          const name = pathParam(rest[1]);
          await this.guest(key, 'deleteSnapshot', [name]);
          return json({ deleted: name });
        }
        case 'POST fork': {
          const { source, name } = stringFields(await bodyText(request), ['source', 'name']);
          // Well-formed names only reach the source's object: the guest refuses the rest
          // (400 invalid-input) before reading any record.
          const wellFormed = [key, source].every((k) => /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/.test(k)) && /^[a-z0-9][a-z0-9._-]{0,63}$/.test(name);
          const store = source === key || !wellFormed ? this.store : await this.lentSnapshot(source, name);
          try {
            await this.guest(key, 'fork', [source, name], undefined, store);
          } catch (e) {
            // Well-formed names the guest refuses are refused for the state, as
            // api/snapshots.rs (this picks the status only; the guest decides): no
            // such snapshot, 404; the key has a container, 409.
            if (e instanceof CallError && e.kind === 'facade' && e.payload?.tag === 'invalid-input' && wellFormed) {
              const m = String(e.payload.val ?? '');
              return m === noSnapshot(source, name) ? apiError(404, 'not-found', m) : apiError(409, 'invalid-input', m);
            }
            throw e;
          }
          return json({ forked: key });
        }
        case 'GET snapshot-record': {
          // Another key's object asks for this key's record of a snapshot (a fork from
          // it: `lentSnapshot`); never a public route (the Worker strips the header).
          if (request.headers.get(INTERNAL_HEADER) !== 'snapshot-record') break;
          const value = this.store.get(key, snapshotRecord(url.searchParams.get('name') ?? ''));
          return json({ value: value ?? null });
        }
        // Preview doors (docs/PREVIEW.md): the guest decides; the key's node serves the door
        // (src/nodes.js `openPreview`, docs/NODE.md "Preview doors").
        case 'POST previews': {
          let body;
          try {
            body = JSON.parse(await bodyText(request));
          } catch (e) {
            return apiError(400, 'malformed-json', String(e?.message ?? e));
          }
          // `{"port": N}` and nothing else, as the wire's `ExposeBody` (unknown fields refused).
          if (!body || typeof body !== 'object' || Array.isArray(body) || Object.keys(body).some((k) => k !== 'port')) {
            return apiError(400, 'malformed-json', 'the body must be {"port": N}, with no other field');
          }
          const port = body.port;
          if (!Number.isInteger(port) || port < 0 || port > 0xffffffff) {
            return apiError(400, 'malformed-json', 'port: a whole number is required');
          }
          let p;
          try {
            p = await this.guest(key, 'expose', [port]);
          } catch (e) {
            // A port in range the guest refuses is refused for the sandbox's state (no
            // running container, the per-key bound): well-formed, so 409, as api.rs. The
            // guest refuses the proxy's port (3128) whatever the state: 400, as api.rs
            // (this picks the status only; the guest's .wasm decides).
            if (e instanceof CallError && e.kind === 'facade' && e.payload?.tag === 'invalid-input' && port >= 1 && port <= 65535 && port !== PROXY_PORT) {
              return apiError(409, 'invalid-input', String(e.payload.val ?? ''));
            }
            throw e;
          }
          return json({ port: p.port, token: p.token, url: p.url });
        }
        case 'GET previews': {
          const ps = await this.guest(key, 'previews', []);
          return json({ previews: ps.map((p) => ({ port: p.port, token: p.token, url: p.url })) });
        }
        case 'DELETE previews/*': {
          const port = Number(rest[1]);
          if (!/^[0-9]{1,10}$/.test(rest[1]) || port > 0xffffffff) {
            return apiError(400, 'invalid-input', 'port: a whole number is required');
          }
          await this.guest(key, 'unexpose', [port]);
          return json({ unexposed: port });
        }
        case 'GET pty':
          return this.pty(key, request);
        case 'GET denials': {
          const d = await this.guest(key, 'denials', []);
          return json({
            denials: d.map((x) => ({
              at_ms: Number(x.atMs),
              host: x.host,
              method: x.method,
              path: x.path,
              // The API's name for the fence that was open (wire::Denial `rule_set`).
              rule_set: x.fence,
              reason: x.reason,
            })),
          });
        }
        case 'GET egress': {
          // The key's node's records (its proxy decided), as api.rs `egress`: not a
          // guest call, so not queued behind one, and no idle time is reset.
          const substrate = new RemoteSubstrate({
            key,
            nodes: this.nodes,
            placement: { get: () => this.store.meta('node'), set: () => {} },
            log,
          });
          try {
            return json({ egress: await substrate.egressAudit(key) });
          } catch (e) {
            if (e && typeof e === 'object' && typeof e.tag === 'string') return apiError(...substrateErrorStatus(e));
            throw e;
          }
        }
        case 'GET artifacts': {
          const a = await this.guest(key, 'artifacts', []);
          return json({ artifacts: a.map((x) => ({ name: x.name, size: Number(x.size) })) });
        }
        case 'GET artifacts/*': {
          const name = decodeURIComponent(rest.slice(1).join('/'));
          const offset = BigInt(queryInt(url.searchParams, 'offset', 2n ** 64n - 1n) ?? 0n);
          const length = Number(queryInt(url.searchParams, 'length', 2n ** 32n - 1n) ?? BigInt(1 << 20));
          let b;
          try {
            b = await this.guest(key, 'readArtifact', [name, offset, length]);
          } catch (e) {
            // A name the listing does not have is a 404, as api.rs answers it.
            if (e instanceof CallError && e.payload?.tag === 'invalid-input') {
              const listed = await this.guest(key, 'artifacts', []);
              if (!listed.some((a) => a.name === name)) {
                return apiError(404, 'not-found', `no artifact ${JSON.stringify(name)}`);
              }
            }
            throw e;
          }
          return new Response(b, { headers: { 'content-type': 'application/octet-stream' } });
        }
        case 'PUT files':
        case 'PUT files/*':
          return await this.put(key, request, url, rest);
        case 'POST approvals':
          return await this.approve(key, request);
        case 'GET records':
          // Edge-only inspection (the consumer's token): how many records the key's
          // object holds and the node it is placed on; never a record's name or value.
          return json({ records: this.store.count(), node: this.store.meta('node') ?? null });
        case 'POST on-stop': {
          if (request.headers.get(INTERNAL_HEADER) !== 'node-event') break;
          const { container } = await request.json();
          const n = await this.guest(key, 'onStop', [String(container)]);
          return json({ stopped: n });
        }
        default:
          break;
      }
      return apiError(404, 'not-found', 'no such route');
    } catch (e) {
      if (e instanceof BadRequest) return apiError(e.status, e.code, e.message);
      if (e instanceof CallError) return apiError(...callErrorStatus(e));
      log('error', 'request failed', [['error', String(e?.stack ?? e)]]);
      return apiError(500, 'failed', String(e?.message ?? e));
    }
  }

  /**
   * `GET …/pty`: an interactive terminal over a WebSocket, the same message table and
   * close codes as host/src/api/pty.rs. The session is the guest's `exec` whose run
   * goes as the node's `run-pty` (nodes.js `runPty`): the guest decides, fences and
   * tears down as for any command. Closing the socket ends the session: the run is
   * abandoned (exit -9) and the guest's teardown kills its tree and revokes its grant.
   */
  pty(key, request) {
    if ((request.headers.get('upgrade') ?? '').toLowerCase() !== 'websocket') {
      return apiError(400, 'invalid-input', 'this route is a WebSocket (a terminal session): no upgrade was asked');
    }
    const [client, server] = Object.values(new WebSocketPair());
    server.accept();
    const hold = request.headers.get(HOLD_HEADER);
    this.ptySession(key, server)
      .catch((e) => log('error', 'a terminal session failed', [['error', String(e?.stack ?? e)]]))
      .finally(() => {
        // The session's place in its tenant's share (deploy.js) is held until it ends.
        if (hold) this.env.TENANTS.get(this.env.TENANTS.idFromName('tenants')).release(hold).catch(() => {});
      });
    return new Response(null, { status: 101, webSocket: client });
  }

  async ptySession(key, ws) {
    let ended = false;
    let started = false;
    let outcomeLog = 'exit';
    let sink;
    const held = [];
    const gone = new AbortController();
    const close = (event, code, reason) => {
      try {
        if (event) ws.send(JSON.stringify(event));
        ws.close(code, String(reason).slice(0, 120));
      } catch {
        // the client is gone
      }
    };
    const errorEvent = (status, code, message) => ({ type: 'error', status, error: { code, message } });
    const refuse = ([code, reason]) => {
      if (ended) return;
      ended = true;
      outcomeLog = 'refused';
      close(errorEvent(400, 'invalid-input', reason), code, reason);
      gone.abort();
    };
    const done = () => log('info', 'a terminal session closed', [
      ['key', key],
      ['outcome', outcomeLog],
    ]);
    let begin;
    const start = new Promise((r) => (begin = r));
    const timer = setTimeout(() => {
      if (!started) {
        refuse([1008, `no start message within ${PTY_START_WITHIN_MS / 1000}s`]);
        begin(undefined);
      }
    }, PTY_START_WITHIN_MS);
    ws.addEventListener('message', (ev) => {
      if (ended) return;
      const f = ptyFrame(ev.data, started);
      if (f.refuse) {
        refuse(f.refuse);
        if (!started) begin(undefined);
      } else if (f.start) {
        started = true;
        clearTimeout(timer);
        begin(f.start);
      } else if (f.input) {
        if (sink) sink.data(f.input);
        else held.push(['data', f.input]);
      } else if (f.resize) {
        if (sink) sink.resize(f.resize.rows, f.resize.cols);
        else held.push(['resize', f.resize]);
      }
    });
    const away = () => {
      if (ended) return;
      ended = true;
      outcomeLog = 'the client went away';
      gone.abort();
      begin(undefined);
    };
    ws.addEventListener('close', away);
    ws.addEventListener('error', away);
    const s = await start;
    if (!s) return done();
    let input;
    try {
      input = execInput(JSON.stringify(s.command));
      await this.checkSecrets(input);
    } catch (e) {
      if (!(e instanceof BadRequest)) throw e;
      refuse([1008, e.message]);
      return done();
    }
    // workerd tells the object that a client went away without a close frame only
    // when a write to it fails: an empty output message after a second of silence is
    // such a write (a client writes no bytes for it).
    let lastOut = Date.now();
    const probe = setInterval(() => {
      if (ended) return clearInterval(probe);
      if (Date.now() - lastOut < PTY_PROBE_MS) return;
      try {
        ws.send(new Uint8Array(0));
        lastOut = Date.now();
      } catch {
        away();
      }
    }, PTY_PROBE_MS);
    const term = {
      rows: s.rows,
      cols: s.cols,
      attach: (x) => {
        sink = x;
        for (const [kind, v] of held.splice(0)) {
          if (kind === 'data') x.data(v);
          else x.resize(v.rows, v.cols);
        }
      },
      output: (bytes) => {
        try {
          ws.send(bytes);
          lastOut = Date.now();
        } catch {
          away();
        }
      },
    };
    let o;
    try {
      o = await this.guest(key, 'exec', [input], { pty: term, signal: gone.signal });
    } catch (e) {
      clearInterval(probe);
      if (!ended) {
        ended = true;
        outcomeLog = 'error';
        const [status, code, message] = e instanceof CallError ? callErrorStatus(e) : [500, 'failed', String(e?.message ?? e)];
        close(errorEvent(status, code, message), 1011, message);
      }
      return done();
    }
    clearInterval(probe);
    if (!ended) {
      ended = true;
      close(exitEvent(o), 1000, 'exit');
    }
    return done();
  }

  /** A grant may name only secrets set through the API: another is 409 (api.rs). */
  async checkSecrets(input) {
    const named = (input.grant?.rules ?? []).flatMap((r) => r.headers.map((h) => h.secret));
    if (named.length === 0) return;
    const bindings = await this.bindings();
    for (const name of named) {
      if (/^[a-z0-9][a-z0-9._-]{0,63}$/.test(name) && !bindings.has(name)) {
        throw new BadRequest(
          409,
          'secret-not-set',
          `secret ${JSON.stringify(name)} is not set (PUT /v1/secrets/${name} with the approver token)`,
        );
      }
    }
    // A credential rule outside its secret's binding: 400 naming the rule, before any
    // guest call, as api.rs (the guest refuses it too, without the rule's index).
    const outside = grantBindingError(input.grant, bindings);
    if (outside) throw new BadRequest(400, 'invalid-input', outside);
  }

  async exec(key, request) {
    const input = execInput(await bodyText(request));
    await this.checkSecrets(input);
    // The caller gone (workerd's `request.signal`, `enable_request_signal`: aborted when
    // the client disconnects, passed from the Worker's request to this object's) ends
    // the command, and the guest tears the fence down and revokes it as on every path,
    // as `execStream`'s client going away does.
    const o = await this.guest(key, 'exec', [input], { signal: request.signal });
    return json(outcome(o));
  }

  /** `PUT …/files[/PATH]`: the body streamed to the key's node and checked there,
   * unpacked by the container's `tar` through the guest (edge/src/upload.js). */
  async put(key, request, url, rest) {
    const { dest, upload } = uploads.what(rest, url, request.headers);
    const marker = uploads.newMarker();
    const { stream, state } = uploads.bounded(request.body);
    let verdict;
    const stdin = { stream, check: upload(marker), onVerdict: (v) => (verdict = v) };
    let call;
    try {
      call = { outcome: await this.guest(key, 'exec', [uploads.command(dest, marker)], { stdin }) };
    } catch (e) {
      if (!(e instanceof CallError)) throw e;
      call = { error: e };
    }
    const [status, body] = uploads.answer({ failure: state.failure, verdict, call, dest, callErrorStatus });
    log('info', 'upload', [
      ['key', key],
      ['status', status],
      ['bytes', state.bytes],
      ['entries', verdict?.entries ?? null],
    ]);
    return status >= 400 ? apiError(status, body.error.code, body.error.message) : json(body, status);
  }

  async approve(key, request) {
    let a;
    try {
      a = JSON.parse(await bodyText(request));
    } catch (e) {
      return apiError(400, 'malformed-json', e.message);
    }
    if (!a || !Array.isArray(a.argv) || a.argv.some((x) => typeof x !== 'string')) {
      return apiError(400, 'malformed-json', 'the body must be {"argv": [...]}');
    }
    if (a.argv.length === 0) return apiError(400, 'invalid-input', 'argv is empty');
    const ttl = Number(this.env.APPROVAL_TTL_MS ?? DEFAULT_APPROVAL_TTL_MS);
    const expires = Date.now() + ttl;
    const token = this.store.recordApproval(key, a.argv, expires);
    return json({ token, key, argv: a.argv, expires_ms: expires }, 201);
  }

  /** `exec` with live output: the node's NDJSON relayed as the API's stream. */
  async execStream(key, request) {
    const input = execInput(await bodyText(request));
    await this.checkSecrets(input);
    const { readable, writable } = new TransformStream();
    const writer = writable.getWriter();
    const enc = new TextEncoder();
    // A client that goes away ends the command: a write that fails aborts the node's
    // run, and the guest tears the fence down and revokes it as on every path.
    const gone = new AbortController();
    const send = (ev) =>
      writer.write(enc.encode(`${JSON.stringify(ev)}\n`)).catch(() => {
        if (!gone.signal.aborted) log('info', 'stream client went away', [['key', key]]);
        gone.abort();
      });
    // The readable side cancelled (the client hung up) even while nothing is written.
    writer.closed.catch(() => {
      if (!gone.signal.aborted) log('info', 'stream client went away', [['key', key]]);
      gone.abort();
    });
    const chunkers = { stdout: new Utf8Chunker('stdout'), stderr: new Utf8Chunker('stderr') };
    let markStarted;
    const started = new Promise((r) => (markStarted = r));
    const call = this.guest(key, 'exec', [input], {
      signal: gone.signal,
      onRunStarted: () => markStarted(true),
      output: (stream, bytes) => {
        const ev = chunkers[stream].push(bytes);
        if (ev) send(ev);
      },
    });
    const first = await Promise.race([started, call.then(() => false, () => false)]);
    if (!first) {
      // Ended before a run started: a plain error, or the outcome as the one event.
      let o;
      try {
        o = await call;
      } catch (e) {
        if (e instanceof CallError) return apiError(...callErrorStatus(e));
        throw e;
      }
      writer.close().catch(() => {});
      return new Response(`${JSON.stringify(exitEvent(o))}\n`, {
        headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' },
      });
    }
    call
      .then(
        (o) => exitEvent(o),
        (e) => {
          const [status, code, message] = callErrorStatus(e);
          return { type: 'error', status, error: { code, message } };
        },
      )
      .then(async (last) => {
        for (const c of Object.values(chunkers)) {
          const ev = c.finish();
          if (ev) await send(ev);
        }
        await send(last);
        await writer.close().catch(() => {});
      });
    return new Response(readable, {
      headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' },
    });
  }
}

/** A `substrate-error` met outside the guest (the egress audit), answered as api.rs
 * `substrate_error` does. */
export function substrateErrorStatus(e) {
  switch (e.tag) {
    case 'unreachable':
      return [502, 'unreachable', String(e.val ?? '')];
    case 'over-capacity':
      return [429, 'over-capacity', 'over capacity'];
    case 'invalid':
      return [400, 'invalid-input', String(e.val ?? '')];
    default:
      return [500, 'failed', String(e.val ?? '')];
  }
}
