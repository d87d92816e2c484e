// The guest over nodes: the jco transpile with JSPI (gen-jspi/, built by build.sh with
// the async lists of scripts/async-lists.mjs), a fresh instance per facade call, its
// `substrate` imports async (RemoteSubstrate: signed fetches to the key's node, the
// guest suspended while each is pending), `records` and `policy` answered
// synchronously from the Durable Object's SQLite (`store`) and a per-call prefetch of
// the secret bindings. As src/host.js does for the mock, through the same settle
// (src/settle.js): a call that traps has what it started killed, and a fence it left
// open torn down and revoked (invariant 1).

import { instantiate } from './jspi/stockade.js';
import core1 from './jspi/stockade.core.wasm';
import core2 from './jspi/stockade.core2.wasm';
import core3 from './jspi/stockade.core3.wasm';
import { withVersions, CallError, exported } from './call.js';
import { DEFAULT_FLOOR } from './defaults.js';
import { settle } from './settle.js';
import { FENCE_CALLS, batchInOrder, checkBatch } from './batch.js';

const CORES = {
  'stockade.core.wasm': core1,
  'stockade.core2.wasm': core2,
  'stockade.core3.wasm': core3,
};

export { CallError };

export class JspiRuntime {
  /**
   * substrate: RemoteSubstrate; store: {put, get, remove, list, find, peekApproval,
   * takeApproval}; bindings: Map name -> {host, port, methods, pathPrefix}.
   */
  constructor({ substrate, store, bindings = new Map(), floor = DEFAULT_FLOOR, log = () => {} }) {
    this.substrate = substrate;
    this.store = store;
    this.bindings = bindings;
    this.floor = floor;
    this.log = log;
  }

  imports(ctx) {
    const s = this.substrate;
    const str = (e) => (typeof e === 'string' ? e : String(e?.message ?? e));
    const rec = (fn) => (...args) => {
      try {
        return fn(...args);
      } catch (e) {
        throw str(e);
      }
    };
    const substrate = {
      ensure: (key) => s.ensure(key),
      current: async (key) => {
        const c = await s.current(key);
        // A batch opened by this key's `ensure` that got no answer may have opened its
        // fence on the container it never named: this is it, the guest's to close now
        // (and the settle's, if the call ends without closing it).
        if (c !== undefined && ctx.unresolvedKeys.includes(key)) {
          ctx.unresolvedKeys = ctx.unresolvedKeys.filter((k) => k !== key);
          ctx.openFences.push([c, 'applied']);
        }
        return c;
      },
      applyGrant: async (container, grant) => {
        // A fence whose apply got no answer may be open: torn down as applied. A
        // typed refusal opened nothing and ran nothing: settled by a revoke only.
        try {
          const fence = await s.applyGrant(container, grant);
          ctx.openFences.push([container, 'applied']);
          return fence;
        } catch (e) {
          ctx.openFences.push([container, e?.tag === 'unreachable' ? 'applied' : 'apply-failed']);
          throw e;
        }
      },
      revokeGrant: async (container) => {
        try {
          return await s.revokeGrant(container);
        } finally {
          ctx.openFences = ctx.openFences.filter(([c]) => c !== container);
        }
      },
      run: (container, cmd, timeoutMs) => s.run(container, cmd, timeoutMs),
      startProcess: async (container, cmd) => {
        const id = await s.startProcess(container, cmd);
        ctx.started.push([container, id]);
        return id;
      },
      listProcesses: (c) => s.listProcesses(c),
      processStatus: (c, id) => s.processStatus(c, id),
      killProcess: (c, id) => s.killProcess(c, id),
      killAll: (c) => s.killAll(c),
      snapshot: (c) => s.snapshot(c),
      saveSnapshot: (c, name) => s.saveSnapshot(c, name),
      forkSnapshot: (source, name, key) => s.forkSnapshot(source, name, key),
      dropSnapshot: (key, name) => s.dropSnapshot(key, name),
      stop: (c) => s.stop(c),
      denials: (key) => s.denials(key),
      listArtifacts: (key) => s.listArtifacts(key),
      readArtifact: (key, name, offset, length) => s.readArtifact(key, name, offset, length),
      openPreview: (c, port) => s.openPreview(c, port),
      closePreview: (c, port) => s.closePreview(c, port),
      listPreviews: (c) => s.listPreviews(c),
      // Calls the guest already decided, in one signed request to the node (docs/NODE.md
      // "Batches"); the open fences kept as each call alone keeps them. A run with an
      // upload's stream (its own request, `run-stream`) or a terminal (`run-pty`) goes
      // one call at a time.
      batch: async (calls) => {
        checkBatch(calls); // refused whole: nothing made, nothing to record
        // A call alone (the guest makes each call outside a fence as a batch of one)
        // goes as the named call does: the node's batch carries the fence's calls.
        if (calls.some((c) => !FENCE_CALLS.has(c.tag))) return batchInOrder(substrate, calls);
        if ((s.stdin || s.pty) && calls.some((c) => c.tag === 'run')) return batchInOrder(substrate, calls);
        let answers;
        try {
          answers = await s.batch(calls);
        } catch (e) {
          // Not known what was made: every apply may have opened its fence. One on the
          // ensured container names none: the key's, learnt by `current` (the guest's
          // call, or the settle's below).
          for (const c of calls) {
            if (c.tag !== 'apply-grant') continue;
            if (c.val.container.tag === 'ensured') {
              if (!ctx.unresolvedKeys.includes(calls[0].val)) ctx.unresolvedKeys.push(calls[0].val);
            } else ctx.openFences.push([c.val.container.val, 'applied']);
          }
          throw e;
        }
        // The opening ensure's container, which `target.ensured` names.
        const ensured = calls[0]?.tag === 'ensure' && answers[0]?.tag === 'ok' ? answers[0].val.val : undefined;
        answers.forEach((a, i) => {
          const c = calls[i];
          if (c.tag === 'apply-grant') {
            const state = a.tag === 'ok' || a.val?.tag === 'unreachable' ? 'applied' : 'apply-failed';
            const t = c.val.container;
            ctx.openFences.push([t.tag === 'ensured' ? ensured : t.val, state]);
          } else if (c.tag === 'revoke-grant' && (a.tag === 'ok' || a.val?.tag === 'unreachable')) {
            // A revoke that answered closed its fence, or may have (the host's
            // record, as the Rust host's). Another error leaves it to the settle.
            const container = c.val.tag === 'ensured' ? ensured : c.val.val;
            ctx.openFences = ctx.openFences.filter(([x]) => x !== container);
          }
        });
        return answers;
      },
    };
    return withVersions({
      'stockade:sandbox/types': {},
      'stockade:sandbox/substrate': substrate,
      'stockade:sandbox/records': {
        put: rec((scope, name, value) => this.store.put(scope, name, value)),
        get: rec((scope, name) => this.store.get(scope, name)),
        remove: rec((scope, name) => this.store.remove(scope, name)),
        list: rec((scope, prefix) => this.store.list(scope, prefix)),
        find: rec((prefix, value) => this.store.find(prefix, value)),
      },
      'stockade:sandbox/policy': {
        floorRules: () => this.floor.map((pattern) => ({ pattern: [...pattern] })),
        approval: (key, token) => {
          try {
            return this.store.peekApproval(key, token, Date.now());
          } catch {
            return undefined; // a store that cannot be read admits nothing
          }
        },
        spendApproval: (key, token) => {
          try {
            return this.store.takeApproval(key, token, Date.now()) !== undefined;
          } catch {
            return false;
          }
        },
        secretBinding: (name) => this.bindings.get(name),
      },
      'stockade:sandbox/clock': { nowMs: () => BigInt(Date.now()) },
      'stockade:sandbox/log': { emit: (level, event, fields) => this.log(level, event, fields) },
    });
  }

  /** Run one facade call (`name`, or an `events` one: 'onStop', 'expiring', 'endLifetime') on a fresh instance. */
  async call(name, ...args) {
    const ctx = { openFences: [], started: [], unresolvedKeys: [] };
    let result;
    let failure;
    try {
      const inst = await instantiate((path) => {
        const m = CORES[path];
        if (!m) throw new Error(`no core module ${path} (re-run edge/build.sh)`);
        return m;
      }, this.imports(ctx));
      result = await exported(inst, name)(...args);
    } catch (e) {
      failure = e;
    }
    const isFacadeError =
      failure !== undefined && failure !== null && Object.prototype.hasOwnProperty.call(failure, 'payload');
    await settle(this.substrate, ctx, { trapped: failure !== undefined && !isFacadeError, log: this.log });
    if (failure === undefined) return result;
    if (isFacadeError) throw new CallError('facade', failure.payload, `guest error ${failure.payload?.tag}`);
    this.log('error', 'guest trapped', [['error', String(failure?.stack ?? failure)]]);
    throw new CallError('trap', undefined, `guest trapped: ${failure?.message ?? failure}`);
  }
}
