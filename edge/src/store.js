// The `records` store and the approvals behind `policy`, in memory (Maps). Same
// semantics as the SQLite store of host/store/src/lib.rs: put replaces, list is by name
// prefix in name order (UTF-8 byte order), find is across scopes ordered by
// (scope, name). Approvals are kept apart from records (they are not counted as records).

import { cmpBytes } from './mock.js';

export class MemoryStore {
  constructor() {
    this.scopes = new Map(); // scope -> Map<name, value>
    this.approvals = new Map(); // token -> {key, argv}
  }

  // ---- the WIT `records` interface ----

  put(scope, name, value) {
    if (!this.scopes.has(scope)) this.scopes.set(scope, new Map());
    this.scopes.get(scope).set(name, value);
  }

  get(scope, name) {
    return this.scopes.get(scope)?.get(name);
  }

  remove(scope, name) {
    const m = this.scopes.get(scope);
    if (!m || !m.has(name)) return false;
    m.delete(name);
    if (m.size === 0) this.scopes.delete(scope);
    return true;
  }

  list(scope, prefix) {
    const m = this.scopes.get(scope);
    if (!m) return [];
    return [...m]
      .filter(([name]) => name.startsWith(prefix))
      .sort(([a], [b]) => cmpBytes(a, b))
      .map(([name, value]) => ({ name, value }));
  }

  find(prefix, value) {
    const out = [];
    for (const [scope, m] of this.scopes) {
      for (const [name, v] of m) {
        if (v === value && name.startsWith(prefix)) out.push([scope, name]);
      }
    }
    return out.sort((x, y) => cmpBytes(x[0], y[0]) || cmpBytes(x[1], y[1]));
  }

  // ---- inspection and approvals ----

  /** Every record as [scope, name, value], ordered by (scope, name). */
  allRecords() {
    const out = [];
    for (const [scope, m] of this.scopes) for (const [name, v] of m) out.push([scope, name, v]);
    return out.sort((x, y) => cmpBytes(x[0], y[0]) || cmpBytes(x[1], y[1]));
  }

  /** Record an approval for `key` and exactly `argv`, valid until `expiresMs`; returns
   * its token (a UUID). */
  recordApproval(key, argv, expiresMs) {
    const token = crypto.randomUUID();
    this.approvals.set(token, { key, argv: [...argv], expiresMs });
    return token;
  }

  /** The argv the approval recorded for `key` under `token` admits, if it exists and
   * has not expired at `nowMs`. Looking spends nothing. */
  peekApproval(key, token, nowMs) {
    const a = this.approvals.get(token);
    if (!a || a.key !== key || a.expiresMs <= nowMs) return undefined;
    return [...a.argv];
  }

  /** Use the approval recorded for `key` under `token`: its argv if it exists and has
   * not expired at `nowMs`; it is gone afterwards (single use). */
  takeApproval(key, token, nowMs) {
    const a = this.approvals.get(token);
    if (!a || a.key !== key) return undefined;
    this.approvals.delete(token);
    return a.expiresMs > nowMs ? [...a.argv] : undefined;
  }
}
