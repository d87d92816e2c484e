// A key's lifetime, metadata, network and listing on the edge (docs/DESIGN.md §2,
// "Lifetime, metadata and listing"; host/src/api/sandboxes.rs), the pure part: the
// request bodies and the query read as api.rs reads them (wire `LifetimeBody`,
// `MetadataBody`, a network's `GrantBody` in api.js `grantBody`,
// e2b::listing `form_pairs`), a scoped token's listing narrowed as scope.rs
// `Pattern::listing`, and the answers' JSON. The registry of known keys is known.js's
// `Known` object; the routes are sandbox.js's (one key) and deploy.js's (the listing).

import { BadRequest } from './api.js';
import { cmpBytes } from './mock.js';

/** Most keys one listing answers (guest decide/lifetime.rs `MAX_LISTED`). */
export const MAX_LISTED = 1024;
const U64_MAX = 2n ** 64n - 1n;
/** The largest time a lifetime takes (wire `MAX_WHOLE_MS`): 2^53 - 1. */
export const MAX_WHOLE_MS = 2n ** 53n - 1n;

const malformed = (m) => new BadRequest(400, 'malformed-json', m);
const invalid = (m) => new BadRequest(400, 'invalid-input', m);
const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** JSON text parsed; each number also kept as its source text where the runtime tells
 * it (a `1.0` is a float to serde, not a u64). Not JSON: the 400 `malformed-json`. */
function parse(text) {
  const sources = new Map();
  let v;
  try {
    v = JSON.parse(text, function (k, value, ctx) {
      if (typeof value === 'number' && ctx?.source !== undefined) sources.set(value, ctx.source);
      return value;
    });
  } catch (e) {
    throw malformed(e.message);
  }
  return { v, sources };
}

/** A float as serde_json's messages write it: `1000.0`, `1.5`, `1.8446744073709552e+19`. */
function floatText(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e16 || a < 1e-5)) return v.toExponential();
  return Number.isInteger(v) ? `${v}.0` : `${v}`;
}

/** What serde calls a JSON value's type, for its "invalid type" message. */
function kind(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'sequence';
  if (typeof v === 'object') return 'map';
  if (typeof v === 'boolean') return `boolean \`${v}\``;
  if (typeof v === 'string') return `string ${JSON.stringify(v)}`;
  return Number.isInteger(v) ? `integer \`${v}\`` : `floating point \`${floatText(v)}\``;
}

/** An optional whole number (`null` is absent, as serde's `Option`), as a BigInt: a
 * float with no fraction is one (`1000.0`: JSON Schema's `integer` admits it, as wire's
 * `whole_or_null` does), never `1000.5`. */
function u64(v, sources) {
  if (v === null || v === undefined) return undefined;
  if (typeof v !== 'number') {
    throw malformed(`invalid type: ${kind(v)}, expected a non-negative whole number`);
  }
  if (!Number.isInteger(v) || v < 0) {
    throw malformed(`${Number.isInteger(v) ? v : floatText(v)} is not a non-negative whole number`);
  }
  // At most 2^53 - 1 (wire `MAX_WHOLE_MS`): every number up to it is exact here.
  const src = sources.get(v);
  const b = src !== undefined && /^[0-9]+$/.test(src) ? BigInt(src) : BigInt(v);
  if (b > MAX_WHOLE_MS) throw malformed(`${b} is more than ${MAX_WHOLE_MS}`);
  return b;
}

/** The fields of a struct body (serde takes a map, or a sequence of the fields in order). */
function fields(v, names, struct) {
  if (Array.isArray(v)) {
    if (v.length > names.length) {
      throw malformed(`invalid length ${v.length}, expected fewer elements in array`);
    }
    return v.map((x, i) => [names[i], x]);
  }
  if (!isObj(v)) throw malformed(`invalid type: ${kind(v)}, expected struct ${struct}`);
  const expected =
    names.length === 1 ? `\`${names[0]}\`` : `one of ${names.map((n) => `\`${n}\``).join(', ')}`;
  return Object.entries(v).map(([k, x]) => {
    if (!names.includes(k)) throw malformed(`unknown field \`${k}\`, expected ${expected}`);
    return [k, x];
  });
}

/**
 * `PUT …/lifetime`'s body (wire `LifetimeBody`: unknown fields refused; `null` is
 * absent) read at `nowMs`, as api/sandboxes.rs `lifetime`: exactly one of `ends_at_ms`
 * and `ends_in_ms` (added to now, saturating); `on_end` `abort` (the default) or
 * `checkpoint`. The WIT lifetime (jco's form: {endsAtMs: bigint, onEnd}); else a
 * BadRequest (400 `malformed-json` for the shape, `invalid-input` for the times).
 */
export function lifetimeBody(text, nowMs) {
  const { v, sources } = parse(text);
  let at;
  let inMs;
  let onEnd;
  for (const [k, x] of fields(v, ['ends_at_ms', 'ends_in_ms', 'on_end'], 'LifetimeBody')) {
    if (k === 'ends_at_ms') at = u64(x, sources);
    else if (k === 'ends_in_ms') inMs = u64(x, sources);
    else if (x !== null && x !== undefined) {
      if (x !== 'abort' && x !== 'checkpoint') {
        if (typeof x === 'string') throw malformed(`unknown variant \`${x}\`, expected \`abort\` or \`checkpoint\``);
        throw malformed(`invalid type: ${kind(x)}, expected enum OnEnd`);
      }
      onEnd = x;
    }
  }
  const now = BigInt(nowMs);
  const min = (a, b) => (a < b ? a : b);
  let endsAtMs;
  if (at !== undefined && inMs === undefined) endsAtMs = at;
  else if (at === undefined && inMs !== undefined) endsAtMs = min(now + inMs, U64_MAX);
  else throw invalid('give exactly one of ends_at_ms and ends_in_ms');
  return { endsAtMs, onEnd: onEnd ?? 'abort' };
}

/**
 * `PUT …/metadata`'s body (wire `MetadataBody`: `{"metadata": {name: string}}`, unknown
 * fields refused) as the WIT list of (name, value), by name (a BTreeMap: a name given
 * twice, its last value). The guest checks the entries; the shape is checked here.
 */
export function metadataBody(text) {
  const { v } = parse(text);
  let m;
  const given = fields(v, ['metadata'], 'MetadataBody');
  for (const [, x] of given) m = x;
  if (!given.length) {
    if (Array.isArray(v)) throw malformed('invalid length 0, expected struct MetadataBody with 1 element');
    throw malformed('missing field `metadata`');
  }
  if (!isObj(m)) throw malformed(`invalid type: ${kind(m)}, expected a map`);
  return Object.entries(m)
    .map(([k, x]) => {
      if (typeof x !== 'string') throw malformed(`invalid type: ${kind(x)}, expected a string`);
      return [k, x];
    })
    .sort((a, b) => cmpBytes(a[0], b[0]));
}

/** One `application/x-www-form-urlencoded` part decoded (`+` a space, `%XX` a byte, the
 * whole UTF-8), as e2b::listing `decode`; else its message. */
function formDecode(s) {
  const out = [];
  const enc = new TextEncoder();
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '+') out.push(0x20);
    else if (c === '%') {
      const h = s.slice(i + 1, i + 3);
      if (!/^[0-9A-Fa-f]{2}$/.test(h)) throw invalid(`${JSON.stringify(s)}: a % escape that is not two hex digits`);
      out.push(parseInt(h, 16));
      i += 2;
    } else {
      const cp = s.codePointAt(i);
      out.push(...enc.encode(String.fromCodePoint(cp)));
      if (cp > 0xffff) i += 1;
    }
  }
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(new Uint8Array(out));
  } catch {
    throw invalid(`${JSON.stringify(s)} is not UTF-8 once decoded`);
  }
}

/**
 * `GET /v1/sandboxes`' query (the raw text after `?`, or '') as the prefix wanted, as
 * api/sandboxes.rs `list` reads it: `prefix` (the last one given; absent: every key),
 * any other parameter a 400 `invalid-input`.
 */
export function listQuery(raw) {
  let wanted = '';
  for (const p of raw.split('&')) {
    if (p === '') continue;
    const at = p.indexOf('=');
    const [k, v] = at < 0 ? [p, ''] : [p.slice(0, at), p.slice(at + 1)];
    const name = formDecode(k);
    const value = formDecode(v);
    if (name !== 'prefix') throw invalid(`${JSON.stringify(name)} is not a parameter of this list`);
    wanted = value;
  }
  return wanted;
}

/** What a listing of the keys starting with `wanted` reaches under a scoped token's
 * pattern (scope.js `Pattern`; none: the operator's, every key), as scope.rs
 * `Pattern::listing`: {prefix} (the narrower of the two), {one: key}, or {nothing}. */
export function listing(pattern, wanted) {
  if (!pattern) return { prefix: wanted };
  if (pattern.kind === 'exact') return pattern.body.startsWith(wanted) ? { one: pattern.body } : { nothing: true };
  if (wanted.startsWith(pattern.body)) return { prefix: wanted };
  if (pattern.body.startsWith(wanted)) return { prefix: pattern.body };
  return { nothing: true };
}

/** A WIT grant (jco's form) as the API's JSON text (wire `GrantBody`, its rules as
 * grammar/src/rules/json.rs writes a `RuleSpec`): `methods` always, `path_prefix` when
 * there is one, `headers` (in the grant's order) when there are any, `intercept` only
 * when false; `ask` only when true. Written as text: an object literal would put a
 * header named like an integer first. */
export function grantJson(g) {
  const rule = (r) => {
    let out = `{"host":${JSON.stringify(r.host)},"methods":${JSON.stringify([...r.methods])}`;
    if (r.pathPrefix !== undefined && r.pathPrefix !== null) out += `,"path_prefix":${JSON.stringify(r.pathPrefix)}`;
    if (r.headers.length) {
      const h = r.headers.map((x) => `${JSON.stringify(x.name)}:{"secret":${JSON.stringify(x.secret)}}`);
      out += `,"headers":{${h.join(',')}}`;
    }
    if (r.intercept === false) out += ',"intercept":false';
    return `${out}}`;
  };
  return `{"rules":[${g.rules.map(rule).join(',')}]${g.ask ? ',"ask":true' : ''}}`;
}

/** A WIT sandbox-info (jco's form) as the API's JSON text (wire `SandboxInfo`), its
 * metadata by name as the BTreeMap serializes it (an object literal would put
 * integer-like names first), its network as `grantJson` writes it, or null. */
export function infoJson(i) {
  const meta = [...i.metadata].sort((a, b) => cmpBytes(a[0], b[0]));
  const lifetime = i.lifetime
    ? `{"ends_at_ms":${BigInt(i.lifetime.endsAtMs)},"on_end":${JSON.stringify(i.lifetime.onEnd)}}`
    : 'null';
  const network = i.network ? grantJson(i.network) : 'null';
  return (
    `{"key":${JSON.stringify(i.key)},"running":${Boolean(i.running)},"lifetime":${lifetime},` +
    `"metadata":{${meta.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`).join(',')}},"network":${network}}`
  );
}

/** A JSON text answer. */
export const jsonText = (text, status = 200) =>
  new Response(text, { status, headers: { 'content-type': 'application/json' } });

/** Run `fn` over `items`, at most `limit` at once, the answers in the items' order. */
export async function bounded(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** The one `Known` object's stub (known.js). */
export const knownOf = (env) => env.KNOWN.get(env.KNOWN.idFromName('known'));
