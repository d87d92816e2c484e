// The `Tenants` Durable Object (one instance, `TENANTS.idFromName('tenants')`): the
// deployment's scoped consumer tokens (docs/TENANTS.md) in its SQLite, the keys each
// tenant has called, and the admissions against their shares. The decisions are
// scope.js's `Book`; this object is its store and its one place, so two requests
// reaching two isolates still meet here (a tenant's admissions run one at a time).
// Called by RPC from the Worker (deploy.js), the MCP object and the Sandbox objects.

import { DurableObject } from 'cloudflare:workers';
import { Book } from './scope.js';

/** The deployment's ceiling when none is configured: a node's default (16) per node. */
export function serverCeiling(env) {
  const c = Number(env?.CEILING);
  if (Number.isSafeInteger(c) && c >= 1) return c;
  const nodes = Array.isArray(env?.NODES) ? env.NODES.length : 1;
  return 16 * Math.max(1, nodes);
}

const log = (level, event, fields, target = 'stockade::edge') => {
  const line = { target, level, event, ...Object.fromEntries(fields ?? []) };
  (level === 'error' || level === 'warn' ? console.error : console.log)(JSON.stringify(line));
};

/** The Book's store over the object's SQLite. */
class SqlTenants {
  constructor(sql) {
    this.sql = sql;
    sql.exec(`CREATE TABLE IF NOT EXISTS tenants (id TEXT PRIMARY KEY, name TEXT NOT NULL, keys TEXT NOT NULL,
                ceiling INTEGER NOT NULL, digest TEXT NOT NULL, created_ms INTEGER NOT NULL, revoked_ms INTEGER)`);
    sql.exec(`CREATE TABLE IF NOT EXISTS tenant_keys (tenant TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (tenant, key))`);
  }

  rows() {
    return this.sql.exec('SELECT * FROM tenants ORDER BY created_ms, rowid').toArray();
  }

  put(r) {
    this.sql.exec(
      'INSERT INTO tenants (id, name, keys, ceiling, digest, created_ms, revoked_ms) VALUES (?, ?, ?, ?, ?, ?, ?)',
      r.id,
      r.name,
      r.keys,
      r.ceiling,
      r.digest,
      r.created_ms,
      r.revoked_ms,
    );
  }

  revoke(id, ms) {
    this.sql.exec('UPDATE tenants SET revoked_ms = ? WHERE id = ?', ms, id);
    this.sql.exec('DELETE FROM tenant_keys WHERE tenant = ?', id);
  }

  keys(id) {
    return this.sql.exec('SELECT key FROM tenant_keys WHERE tenant = ? ORDER BY key', id).toArray().map((r) => r.key);
  }

  note(id, key) {
    this.sql.exec('INSERT OR IGNORE INTO tenant_keys (tenant, key) VALUES (?, ?)', id, key);
  }

  forget(id, key) {
    this.sql.exec('DELETE FROM tenant_keys WHERE tenant = ? AND key = ?', id, key);
  }
}

export class Tenants extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.book = new Book({
      store: new SqlTenants(ctx.storage.sql),
      serverCeiling: serverCeiling(env),
      // Does `key`'s Sandbox object report a live container (its node's `current`)?
      live: (key) => env.SANDBOX.get(env.SANDBOX.idFromName(key)).live(key),
      log,
    });
  }

  verify(token) {
    return this.book.verify(token);
  }

  create(text) {
    return this.book.create(text);
  }

  list() {
    return this.book.list();
  }

  revoke(id) {
    return this.book.revoke(id);
  }

  admit(id, key) {
    return this.book.admit(id, key);
  }

  release(hold) {
    return this.book.release(hold);
  }
}

/** The one `Tenants` object's stub. */
export const tenantsOf = (env) => env.TENANTS.get(env.TENANTS.idFromName('tenants'));
