// Scoped consumer tokens on the edge (docs/TENANTS.md), decided purely: a key pattern,
// whether two patterns could name one key, the shape of a token, whether one more
// container fits a share, a `POST /v1/tokens` body; and `Book`, the tokens and their
// shares over a store (the `Tenants` Durable Object's SQLite, tenants.js; a Map in
// test/tenants.test.mjs). A copy of host/src/tenants/{scope.rs,mod.rs} that stays: the
// Worker runs no Rust but the guest, and the guest has no tenants. Its answers are
// api/tenants.rs's and api/auth.rs's: the same statuses, codes and messages.

/** The grammar's key rule (grammar/src/names.rs `key`) with its messages, or null. */
export function keyError(key) {
  if (key === '') return 'key is empty';
  if (new TextEncoder().encode(key).length > 128) return 'key is longer than 128 bytes';
  if (key.startsWith('.')) return "key must not start with '.'";
  const bad = [...key].find((c) => !/^[A-Za-z0-9._-]$/.test(c));
  if (bad !== undefined) return `key has a character outside [A-Za-z0-9._-]: ${rustChar(bad)}`;
  return null;
}

/** A char as Rust's `{:?}` writes it (the printable ones; others escaped). */
function rustChar(c) {
  if (c === "'") return "'\\''";
  if (c === '\\') return "'\\\\'";
  if (c === '\n') return "'\\n'";
  if (c === '\r') return "'\\r'";
  if (c === '\t') return "'\\t'";
  const n = c.codePointAt(0);
  if (n < 0x20 || n === 0x7f) return `'\\u{${n.toString(16)}}'`;
  return `'${c}'`;
}

/** Rust's `{:?}` of a string (the printable characters kept, `"` and `\` escaped,
 * controls as `\n`, `\0`, `\u{…}`), as scope.rs's and names.rs's messages write one. */
export function quoted(s) {
  let out = '"';
  for (const c of s) {
    const n = c.codePointAt(0);
    if (c === '"') out += '\\"';
    else if (c === '\\') out += '\\\\';
    else if (c === '\n') out += '\\n';
    else if (c === '\r') out += '\\r';
    else if (c === '\t') out += '\\t';
    else if (n === 0) out += '\\0';
    else if (n < 0x20 || (n >= 0x7f && n <= 0x9f)) out += `\\u{${n.toString(16)}}`;
    else out += c;
  }
  return `${out}"`;
}

/** What a fork from a source holding no snapshot `name` is refused with (grammar
 * names.rs `no_snapshot`): also a source outside a scoped token's pattern. */
export const noSnapshot = (source, name) => `${source} holds no snapshot named ${quoted(name)}`;

/** The keys one token reaches: `{exact: key}` or `{prefix: p}` (scope.rs `Pattern`). */
export class Pattern {
  constructor(kind, body) {
    this.kind = kind; // 'exact' | 'prefix'
    this.body = body;
  }

  /** `ci-*` or `build-7`, else the message scope.rs `Pattern::parse` gives. */
  static parse(s) {
    const prefix = s.endsWith('*');
    const body = prefix ? s.slice(0, -1) : s;
    if (body.includes('*')) return { error: `key pattern ${quoted(s)}: \`*\` may only end it (\`ci-*\`), once` };
    if (prefix && body === '') {
      return { error: 'key pattern "*" reaches every key: that is the operator\'s token; give a prefix (`ci-*`)' };
    }
    // A prefix is checked as a key it could start (`ci-` as `ci-x`).
    const e = keyError(prefix ? `${body}x` : body);
    if (e) return { error: `key pattern ${quoted(s)}: ${e}` };
    return { pattern: new Pattern(prefix ? 'prefix' : 'exact', body) };
  }

  matches(key) {
    return this.kind === 'exact' ? key === this.body : key.startsWith(this.body);
  }

  /** Could one key match both patterns? */
  overlaps(o) {
    if (this.kind === 'exact' && o.kind === 'exact') return this.body === o.body;
    if (this.kind === 'prefix' && o.kind === 'exact') return o.body.startsWith(this.body);
    if (this.kind === 'exact' && o.kind === 'prefix') return this.body.startsWith(o.body);
    return this.body.startsWith(o.body) || o.body.startsWith(this.body);
  }

  toString() {
    return this.kind === 'exact' ? this.body : `${this.body}*`;
  }
}

/** Every scoped token starts with this; the operator's never does. */
export const TOKEN_PREFIX = 'stk_';
export const ID_HEX = 16;
export const SECRET_HEX = 64;

/** `stk_<16 hex>_<64 hex>` (lowercase) as [id, secret]; anything else undefined. */
export function splitToken(t) {
  if (typeof t !== 'string') return undefined;
  const m = /^stk_([0-9a-f]{16})_([0-9a-f]{64})$/.exec(t);
  return m ? [m[1], m[2]] : undefined;
}

/** May a tenant whose `live` keys hold containers (or are being created) take a key,
 * `held`: the key is among them (it holds no new container)? */
export function withinShare(live, held, ceiling) {
  return held || live < ceiling;
}

/** How long a hold lasts when no release comes. */
export const HOLD_MS = 15 * 60_000;

/** The keyed routes whose call may create a container (api/auth.rs `ENSURING_ROUTES`):
 * a scoped token's call is admitted there within its share. [method, the path after
 * `/v1/sandboxes/{key}/`]. */
const ENSURING = [
  ['POST', /^exec$/],
  ['POST', /^exec\/stream$/],
  ['POST', /^detached$/],
  ['POST', /^ensure$/],
  ['POST', /^snapshots$/],
  ['GET', /^pty$/],
  ['PUT', /^files(\/.+)?$/],
  ['POST', /^previews$/],
];
export const ensuring = (method, rest) => ENSURING.some(([m, r]) => m === method && r.test(rest));

/** The longest label. */
export const MAX_NAME = 64;

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** A `POST /v1/tokens` body (wire `TokenBody`: unknown fields refused, `keys` a string,
 * `ceiling` a non-negative whole number (`4.0` too), `name` a string; `null` is not
 * absent) as {keys, ceiling?, name?}, or {malformed: message} (400 `malformed-json`). */
export function tokenBody(text) {
  let b;
  try {
    b = JSON.parse(text);
  } catch (e) {
    return { malformed: e.message };
  }
  if (!isObj(b)) return { malformed: 'the body must be a JSON object {"keys", "ceiling", "name"}' };
  const extra = Object.keys(b).find((k) => !['keys', 'ceiling', 'name'].includes(k));
  if (extra !== undefined) return { malformed: `unknown field \`${extra}\`, expected one of \`keys\`, \`ceiling\`, \`name\`` };
  if (b.keys === undefined) return { malformed: 'missing field `keys`' };
  if (typeof b.keys !== 'string') return { malformed: 'keys: expected a string' };
  if (b.ceiling !== undefined && !(typeof b.ceiling === 'number' && Number.isInteger(b.ceiling) && b.ceiling >= 0)) {
    return { malformed: `ceiling: ${JSON.stringify(b.ceiling)} is not a non-negative whole number` };
  }
  if (b.name !== undefined && typeof b.name !== 'string') return { malformed: 'name: expected a string' };
  return { keys: b.keys, ceiling: b.ceiling, name: b.name };
}

/** An answer of the book: [status, body] with body an object, or an error
 * [status, code, message]. */
const err = (status, code, message) => ({ error: [status, code, message] });

/** A token row as listed (wire `TokenInfo`, its fields in order; never the digest). */
export function info(r) {
  const i = { id: r.id, name: r.name, keys: r.keys, ceiling: r.ceiling, created_ms: r.created_ms };
  if (r.revoked_ms !== null && r.revoked_ms !== undefined) i.revoked_ms = r.revoked_ms;
  return i;
}

/** Constant-time comparison of two equal-length hex strings. */
function sameHex(a, b) {
  if (a.length !== b.length) return false;
  let d = 0;
  for (let i = 0; i < a.length; i++) d |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return d === 0;
}

/** Lowercase hex of `n` random bytes (the platform's CSPRNG). */
export function randomHex(n) {
  const b = new Uint8Array(n);
  crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
}

/** The SHA-256 of `text` as lowercase hex. */
export async function sha256Hex(text) {
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text)));
  return [...d].map((x) => x.toString(16).padStart(2, '0')).join('');
}

/**
 * The scoped tokens of one deployment and their shares (host/src/tenants/mod.rs
 * `Tenants`). `store`: rows() (every token, oldest first: {id, name, keys, ceiling,
 * digest, created_ms, revoked_ms}), put(row), revoke(id, ms), keys(id) (the keys the
 * tenant has called), note(id, key), forget(id, key). `live(key)`: does the key hold a
 * container (a key that cannot be asked: true, so a share is never overcommitted). The
 * live tokens are held in memory, changed with the store.
 */
export class Book {
  constructor({ store, serverCeiling, live, now = () => Date.now(), log = () => {} }) {
    this.store = store;
    this.serverCeiling = serverCeiling;
    this.liveKey = live;
    this.now = now;
    this.log = log;
    this.live = new Map();
    for (const r of store.rows()) {
      if (r.revoked_ms !== null && r.revoked_ms !== undefined) continue;
      const p = Pattern.parse(r.keys);
      if (p.error) {
        log('warn', 'token left out', [['id', r.id], ['error', p.error]], 'stockade::tenants');
        continue;
      }
      this.live.set(r.id, { id: r.id, name: r.name, keys: p.pattern, ceiling: r.ceiling, digest: r.digest });
    }
    // Calls holding a key until their container is live: holdId -> {tenant, key}.
    this.holds = new Map();
    this.nextHold = 0;
    // One admission at a time per tenant: its promise chain.
    this.admitting = new Map();
  }

  /** The live tenant whose token this is ({id, keys, ceiling}), or null. */
  async verify(presented) {
    const s = splitToken(presented);
    if (!s) return null;
    const t = this.live.get(s[0]);
    if (!t) return null;
    const d = await sha256Hex(s[1]);
    // Looked up again: a revoke may have come while the digest was computed.
    const still = this.live.get(s[0]);
    if (!still || !sameHex(d, still.digest)) return null;
    return { id: still.id, keys: still.keys.toString(), ceiling: still.ceiling };
  }

  /** `POST /v1/tokens`: {created: TokenCreated} or {error}. */
  async create(text) {
    const b = tokenBody(text);
    if (b.malformed !== undefined) return err(400, 'malformed-json', b.malformed);
    const p = Pattern.parse(b.keys);
    if (p.error) return err(400, 'invalid-input', p.error);
    const keys = p.pattern;
    let ceiling;
    if (b.ceiling === undefined) ceiling = this.serverCeiling;
    else if (b.ceiling === 0) return err(400, 'invalid-input', 'ceiling 0: a share is at least 1 live container');
    else if (b.ceiling > 4294967295) return err(400, 'invalid-input', `ceiling ${b.ceiling}: past 4294967295`);
    else ceiling = Math.min(b.ceiling, this.serverCeiling);
    const name = b.name ?? keys.toString();
    // eslint-disable-next-line no-control-regex
    if (name === '' || [...name].length > MAX_NAME || /[\x00-\x1f\x7f-\x9f]/.test(name)) {
      return err(400, 'invalid-input', `name: 1 to ${MAX_NAME} characters, none a control character`);
    }
    const secret = randomHex(SECRET_HEX / 2);
    const digest = await sha256Hex(secret);
    // Checked after the last await: nothing else runs between this check and the insert.
    const other = [...this.live.values()].find((o) => o.keys.overlaps(keys));
    if (other) {
      return err(
        409,
        'keys-overlap',
        `keys ${keys} overlap the live token ${other.id} (${other.keys}): two tokens never reach one key`,
      );
    }
    let id;
    do id = randomHex(ID_HEX / 2);
    while (this.store.rows().some((r) => r.id === id));
    const row = { id, name, keys: keys.toString(), ceiling, digest, created_ms: this.now(), revoked_ms: null };
    this.store.put(row);
    this.live.set(id, { id, name, keys, ceiling, digest });
    this.log('info', 'token created', [['id', id], ['keys', row.keys], ['ceiling', String(ceiling)]], 'stockade::tenants');
    return { created: { token: `${TOKEN_PREFIX}${id}_${secret}`, ...info(row) } };
  }

  /** `GET /v1/tokens`: every token, live and revoked. */
  list() {
    return { tokens: this.store.rows().map(info) };
  }

  /** `DELETE /v1/tokens/{id}`: a wrong token from the next request. */
  revoke(id) {
    if (!this.live.has(id)) return err(404, 'not-found', 'no live token with that id');
    this.store.revoke(id, this.now());
    this.live.delete(id);
    this.log('info', 'token revoked', [['id', id]], 'stockade::tenants');
    return { revoked: { revoked: id } };
  }

  /**
   * Admit tenant `id`'s call on `key`, which may create a container: within its share
   * the call holds the key (counted as live) until `release(hold)`. {hold} or {error}
   * (429 `over-capacity`). One admission at a time per tenant: the count and the hold
   * it makes are one step.
   */
  admit(id, key) {
    const prev = this.admitting.get(id) ?? Promise.resolve();
    const run = prev.then(() => this.admitNow(id, key));
    const tail = run.then(
      () => {},
      () => {},
    );
    this.admitting.set(id, tail);
    tail.then(() => {
      if (this.admitting.get(id) === tail) this.admitting.delete(id);
    });
    return run;
  }

  async admitNow(id, key) {
    const t = this.live.get(id);
    // Revoked between the request's check and now: a wrong token.
    if (!t) return err(401, 'unauthorized', 'missing or wrong bearer token');
    // A hold no release reached (its Worker gone) lapses: by then its container, if it
    // made one, is live and counted as such.
    for (const [h, v] of this.holds) if (this.now() - v.at > HOLD_MS) this.holds.delete(h);
    const held = new Set([...this.holds.values()].filter((h) => h.tenant === id).map((h) => h.key));
    const keys = this.store.keys(id);
    const up = await Promise.all(
      keys.map(async (k) => {
        if (held.has(k)) return true;
        try {
          return (await this.liveKey(k)) !== false;
        } catch {
          return true;
        }
      }),
    );
    let live = 0;
    let keyIsLive = false;
    keys.forEach((k, i) => {
      if (up[i]) {
        live += 1;
        keyIsLive ||= k === key;
      } else if (!held.has(k)) {
        // No container and no call holding it: the list stays as long as the share.
        this.store.forget(id, k);
      }
    });
    if (!withinShare(live, keyIsLive, t.ceiling)) {
      this.log(
        'info',
        'over its share',
        [['id', id], ['key', key], ['live', String(live)], ['ceiling', String(t.ceiling)]],
        'stockade::tenants',
      );
      return err(429, 'over-capacity', `token ${id} holds its share of the ceiling (${t.ceiling} live containers)`);
    }
    this.store.note(id, key);
    this.nextHold += 1;
    const hold = `${id}:${this.nextHold}`;
    this.holds.set(hold, { tenant: id, key, at: this.now() });
    return { hold };
  }

  /** The call holding `hold` has a live container, or ended. */
  release(hold) {
    return this.holds.delete(hold);
  }
}
