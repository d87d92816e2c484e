// The `Known` Durable Object (one instance, `KNOWN.idFromName('known')`): the registry
// of known keys (docs/DESIGN.md §2, "Lifetime, metadata and listing"). Each key's
// records (its `~known` row among them) live in its own Sandbox object, so the guest's
// `sandboxes(prefix)` inside one object sees one key. Each Sandbox object tells this
// one, after a set-lifetime, a set-metadata, a set-network, a forget, a DELETE and a
// lifetime's end, whether its key is known (its guest's `describe` is some or none); `GET
// /v1/sandboxes` lists its keys with the prefix and asks each key's object to describe
// it (deploy.js). The bodies, the query and the answers are lifetime.js's.

import { DurableObject } from 'cloudflare:workers';
import { MAX_LISTED } from './lifetime.js';

/** The registry of known keys (one instance): each key's Sandbox object tells it. */
export class Known extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS known (key TEXT PRIMARY KEY)');
  }

  /** `key` is known (its guest's `describe` is some) or not. */
  note(key, known) {
    if (known) this.sql.exec('INSERT OR IGNORE INTO known (key) VALUES (?)', key);
    else this.sql.exec('DELETE FROM known WHERE key = ?', key);
  }

  /** The keys starting with `prefix`, by key (keys are ASCII: SQLite's order is the
   * bytes'), at most `limit`. */
  keys(prefix, limit = MAX_LISTED) {
    return this.sql
      .exec('SELECT key FROM known WHERE substr(key, 1, ?) = ? ORDER BY key LIMIT ?', prefix.length, prefix, limit)
      .toArray()
      .map((r) => r.key);
  }
}
