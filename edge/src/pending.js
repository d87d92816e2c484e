// The approver's side of egress that can ask (docs/EGRESS.md) on the edge: the requests
// `ask = true` grants hold on the nodes' proxies, listed and answered over the nodes,
// with host/src/api/egress_ask.rs's routes, codes and bodies (docs/openapi.json;
// docs/NODE.md "Pending egress decisions").
//
// * `GET /v1/egress/pending[?key=K]`, `GET /v1/sandboxes/{key}/egress/pending`: either
//   token (deploy.js). A key's list is asked of every node, keyed (the key's placement
//   is its Durable Object's, and the object runs one call at a time: it may be inside
//   the very exec that is held, so the Worker never waits on it; a node that does not
//   hold the key lists nothing). Every key's: every node, node-wide. Oldest first. A
//   node that cannot be asked fails the list (502 `unreachable`): a list without its
//   decisions would look complete.
// * `POST /v1/egress/pending/{id}` `{"decision": "approve"|"refuse"}`: the approver's
//   token (deploy.js `APPROVER`). Asked of every node, node-wide; the ids are UUIDv4s
//   drawn on each node, so at most one holds it. Read as the Rust front reads it
//   (host/remote/src/lib.rs `answered`): answered on one node, 200; else
//   decided on one, 409 `already-decided`; else a node not asked may hold it, its
//   error; else 404 `not-found`.

import { apiError, json } from './api.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const KEY = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;

const str = (v) => (typeof v === 'string' ? v : '');
const num = (v) => (Number.isSafeInteger(v) && v >= 0 ? v : 0);

/** A node's pending decision as the API's PendingDecision, field by field in the
 * wire's order (nothing else a node sent passes through). Pure. */
export function decision(p) {
  return {
    id: str(p?.id),
    key: str(p?.key),
    fence: str(p?.fence),
    method: str(p?.method),
    host: str(p?.host),
    port: num(p?.port),
    path: str(p?.path),
    reason: str(p?.reason),
    at_ms: num(p?.at_ms),
    expires_ms: num(p?.expires_ms),
    widens: str(p?.widens),
  };
}

/** The nodes' lists as one, oldest first (the same millisecond: by id). Pure. */
export function union(lists) {
  return lists
    .flat()
    .map(decision)
    .sort((a, b) => a.at_ms - b.at_ms || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

/**
 * The nodes' answers to one `answer-pending` (each `{ok: value}` or `{err:
 * substrate-error}`) as the front's: `{answered: PendingDecision}`, `{decided:
 * outcome}`, `{error: substrate-error}` or `{unknown: true}`. Pure; the same order
 * as host/remote/src/lib.rs `answered`.
 */
export function answered(answers) {
  let decided;
  let failed;
  for (const a of answers) {
    if ('err' in a) {
      failed ??= a.err;
      continue;
    }
    const v = a.ok;
    if (v && typeof v === 'object' && 'answered' in v) return { answered: decision(v.answered) };
    if (v && typeof v === 'object' && 'already-decided' in v) decided = str(v['already-decided']) || 'decided';
  }
  if (decided !== undefined) return { decided };
  if (failed !== undefined) return { error: failed };
  return { unknown: true };
}

/** A node's substrate-error as the API's answer (api.rs `substrate_error`). */
function substrateAnswer(e) {
  switch (e?.tag) {
    case 'unreachable':
      return apiError(502, 'unreachable', str(e.val));
    case 'over-capacity':
      return apiError(429, 'over-capacity', 'over capacity');
    case 'invalid':
      return apiError(400, 'invalid-input', str(e.val));
    default:
      return apiError(500, 'failed', str(e?.val ?? e?.message ?? e));
  }
}

/** Every node's answer to `call` as `{ok}` or `{err}`, in the nodes' order. */
async function askEvery(nodes, key, call, body) {
  const settled = await Promise.allSettled(nodes.map((n) => n.call(key, call, body)));
  return settled.map((s) => (s.status === 'fulfilled' ? { ok: s.value } : { err: s.reason }));
}

/** `GET /v1/egress/pending[?key=K]` (`key` undefined) and `GET …/{key}/egress/pending`.
 * `reaches`: the keys the caller's token reaches (a scoped token: its pattern's); another
 * key's decisions are left out, and asking for another key is the empty list a key
 * nobody holds gives (api/egress_ask.rs `list`). */
export async function listPending(nodes, key, reaches = () => true) {
  if (key !== undefined && !KEY.test(key)) {
    return apiError(400, 'invalid-input', `key ${JSON.stringify(key)} is not valid`);
  }
  if (key !== undefined && !reaches(key)) return json({ pending: [] });
  const answers = await askEvery(nodes, key ?? '', 'pending', {});
  const down = answers.find((a) => 'err' in a);
  if (down) return substrateAnswer(down.err);
  const lists = answers.map((a) => (Array.isArray(a.ok) ? a.ok : []));
  return json({ pending: union(lists).filter((p) => reaches(p.key)) });
}

/** The query of `GET /v1/egress/pending`: `{key}` or an error answer (api.rs refuses
 * an unknown or repeated parameter, 400 `invalid-input`). */
export function pendingQuery(searchParams) {
  let key;
  for (const [name, value] of searchParams) {
    if (name !== 'key') return { refused: apiError(400, 'invalid-input', `unknown field \`${name}\`, expected \`key\``) };
    if (key !== undefined) return { refused: apiError(400, 'invalid-input', 'duplicate field `key`') };
    key = value;
  }
  return { key };
}

/** `POST /v1/egress/pending/{id}` (the approver's token, checked before). */
export async function answerPending(nodes, id, text, log = () => {}) {
  let body;
  try {
    body = JSON.parse(text);
  } catch (e) {
    return apiError(400, 'malformed-json', e.message);
  }
  const fields = body && typeof body === 'object' && !Array.isArray(body) ? Object.keys(body) : undefined;
  if (!fields) return apiError(400, 'malformed-json', 'the body must be {"decision": "approve"|"refuse"}');
  const extra = fields.find((f) => f !== 'decision');
  if (extra !== undefined) return apiError(400, 'malformed-json', `unknown field \`${extra}\`, expected \`decision\``);
  if (body.decision !== 'approve' && body.decision !== 'refuse') {
    return apiError(400, 'malformed-json', 'decision: expected "approve" or "refuse"');
  }
  // An id is a UUID; anything else was never issued (and is not echoed back).
  if (!UUID.test(id)) return apiError(404, 'not-found', 'no such pending egress decision');
  const r = answered(await askEvery(nodes, '', 'answer-pending', { id, decision: body.decision }));
  if (r.answered) {
    log('info', 'egress decision answered', [
      ['id', id],
      ['key', r.answered.key],
      ['fence', r.answered.fence],
      ['decision', body.decision],
      ['widens', r.answered.widens],
    ]);
    return json({ pending: r.answered, decision: body.decision });
  }
  if (r.decided !== undefined) {
    return apiError(409, 'already-decided', `egress decision ${id} is already decided: ${r.decided}`);
  }
  if (r.error) return substrateAnswer(r.error);
  return apiError(404, 'not-found', 'no such pending egress decision');
}
