// Signed node requests from JavaScript (WebCrypto), exactly as host/node-protocol/src/auth.rs:
// the lower-case hex HMAC-SHA256, keyed with the node's secret (the text of its
// `<data_dir>/node/secret`, trimmed, not hex-decoded), over the canonical text
//
//   stockade-node-v1\n{time ms}\n{nonce}\n{METHOD}\n{path}\n{key}\n{idempotency}\n{hex sha-256(body)}
//
// test/sign.test.mjs checks the vector of auth.rs `the_canonical_text_is_the_documented_one`
// and verifies signatures the way a node does. Pure but for crypto.getRandomValues.

const enc = new TextEncoder();

/** Header names (auth.rs). */
export const HEADERS = {
  time: 'x-stockade-time',
  nonce: 'x-stockade-nonce',
  key: 'x-stockade-key',
  idempotency: 'x-stockade-idempotency',
  signature: 'x-stockade-signature',
  node: 'x-stockade-node',
};

/** Lower-case hex of bytes. */
export function hex(bytes) {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  let s = '';
  for (const x of b) s += x.toString(16).padStart(2, '0');
  return s;
}

/** Bytes of a body: a string is UTF-8. */
export function bodyBytes(body) {
  if (body === undefined || body === null) return new Uint8Array();
  return typeof body === 'string' ? enc.encode(body) : new Uint8Array(body);
}

/** hex SHA-256. */
export async function sha256Hex(bytes) {
  return hex(await crypto.subtle.digest('SHA-256', bodyBytes(bytes)));
}

/** The canonical text a signature covers. */
export async function canonical({ timeMs, nonce, method, path, key, idempotency, body }) {
  return [
    'stockade-node-v1',
    String(timeMs),
    nonce,
    method,
    path,
    key ?? '',
    idempotency ?? '',
    await sha256Hex(body),
  ].join('\n');
}

const keys = new Map(); // secret text -> CryptoKey

async function hmacKey(secret) {
  let k = keys.get(secret);
  if (!k) {
    k = await crypto.subtle.importKey('raw', enc.encode(secret.trim()), { name: 'HMAC', hash: 'SHA-256' }, false, [
      'sign',
      'verify',
    ]);
    keys.set(secret, k);
  }
  return k;
}

/** The signature of `req` under `secret`. */
export async function sign(secret, req) {
  const k = await hmacKey(secret);
  return hex(await crypto.subtle.sign('HMAC', k, enc.encode(await canonical(req))));
}

/** A fresh nonce: 32 hex characters. */
export function nonce() {
  return hex(crypto.getRandomValues(new Uint8Array(16)));
}

/** The headers of a signed request (a fresh nonce, the time now). */
export async function signedHeaders(secret, { method, path, key, idempotency, body, timeMs = Date.now() }) {
  const req = { timeMs, nonce: nonce(), method, path, key: key ?? '', idempotency: idempotency ?? '', body };
  const h = {
    [HEADERS.time]: String(req.timeMs),
    [HEADERS.nonce]: req.nonce,
    [HEADERS.key]: req.key,
    [HEADERS.signature]: await sign(secret, req),
  };
  if (req.idempotency) h[HEADERS.idempotency] = req.idempotency;
  return h;
}

/** Why a signed request is refused ('malformed' | 'expired' | 'bad-signature'), or
 * null: the checks of auth.rs `verify` (the nonce cache is the caller's). */
export async function verify(secret, req, signature, nowMs, windowMs = 30_000) {
  if (!/^[0-9a-f]{16,64}$/.test(req.nonce ?? '') || typeof signature !== 'string' || signature.length !== 64) {
    return 'malformed';
  }
  if (Math.abs(nowMs - req.timeMs) > windowMs) return 'expired';
  if (!/^[0-9a-f]{64}$/i.test(signature)) return 'malformed';
  const tag = new Uint8Array(signature.match(/../g).map((x) => parseInt(x, 16)));
  const ok = await crypto.subtle.verify('HMAC', await hmacKey(secret), tag, enc.encode(await canonical(req)));
  return ok ? null : 'bad-signature';
}
