// Placement of a key on a node: rendezvous hashing as docs/NODE.md and
// host/remote/src/placement.rs: a node's score for a key is
// SHA-256(name ‖ 0x00 ‖ key), compared as a big-endian number; nodes are tried
// highest first (the next on over-capacity or unreachable). The Durable Object records
// the node it placed a key on, so the placement outlives restarts. Pure.

const enc = new TextEncoder();

/** The score of `node` for `key` (32 bytes). */
export async function score(node, key) {
  const n = enc.encode(node);
  const k = enc.encode(key);
  const buf = new Uint8Array(n.length + 1 + k.length);
  buf.set(n, 0);
  buf.set(k, n.length + 1);
  return new Uint8Array(await crypto.subtle.digest('SHA-256', buf));
}

function cmp(a, b) {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}

/** Node names in the order to try for `key`: highest score first. */
export async function order(names, key) {
  const scored = await Promise.all(names.map(async (n) => [n, await score(n, key)]));
  return scored.sort((x, y) => cmp(y[1], x[1]) || (x[0] < y[0] ? -1 : 1)).map(([n]) => n);
}
