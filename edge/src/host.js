// The edge host: the jco-transpiled guest (gen/, built by build.sh), instantiated per
// facade call (Worker-style, like host/runtime/src/runtime/mod.rs), with the imports implemented in
// JavaScript over a substrate (the mock) and a store (in memory).
//
// jco conventions used here: an import returning `result<T, E>` returns T or throws a
// plain (non-Error) value E; throwing an `Error` instead traps the guest. An export
// returning `result<T, E>` returns T or throws an Error whose `payload` is E.

import { instantiate } from './stockade.js';
import core1 from './stockade.core.wasm';
import core2 from './stockade.core2.wasm';
import core3 from './stockade.core3.wasm';
import { MockTrap } from './mock.js';
import { batchInOrder } from './batch.js';
import { DEFAULT_FLOOR } from './defaults.js';
import { settle } from './settle.js';
import { CallError, exported, withVersions } from './call.js';

export { CallError };

const CORES = {
  'stockade.core.wasm': core1,
  'stockade.core2.wasm': core2,
  'stockade.core3.wasm': core3,
};

/**
 * The runtime: one substrate and one store shared by every call, a fresh guest
 * instance per call, and the host-side revoke of any grant a call left open.
 */
export class EdgeRuntime {
  constructor({ substrate, store, floor = DEFAULT_FLOOR, log = () => {} }) {
    this.substrate = substrate;
    this.store = store;
    this.floor = floor;
    this.log = log;
  }

  /** The import object for one call, recording the fences it opens in `ctx`. */
  imports(ctx) {
    const s = this.substrate;
    // Substrate calls: a typed error is thrown on as the WIT `substrate-error` (a plain
    // object); an injected trap (MockTrap, an Error) traps the guest.
    const sub = (fn) => fn;
    const str = (e) => (typeof e === 'string' ? e : String(e?.message ?? e));
    // Records calls: an armed `records.OP` fault fires first (not traced); an injected
    // trap stays an Error (it traps the guest).
    const rec = (op, fn) => (...args) => {
      try {
        s.fire(`records.${op}`);
        return fn(...args);
      } catch (e) {
        if (e instanceof Error && e.name === 'MockTrap') throw e;
        throw str(e); // records errors are strings
      }
    };
    const substrate = {
      ensure: sub((key) => s.ensure(key)),
      current: sub((key) => s.current(key)),
      applyGrant: (container, grant) => {
        // The fence's id: chosen here, never the consumer's, never a container id.
        const fence = crypto.randomUUID();
        try {
          s.applyGrant(container, fence, grant);
        } catch (e) {
          // A failed apply opened nothing and ran nothing: settled by a revoke only,
          // nothing is killed (a declared process survives bad input).
          ctx.openFences.push([container, 'apply-failed']);
          throw e;
        }
        ctx.openFences.push([container, 'applied']);
        return fence;
      },
      revokeGrant: (container) => {
        let n;
        try {
          n = s.revokeGrant(container);
        } catch (e) {
          // Unreachable is decided from the container's own state (it is gone), and a
          // grant does not outlive its container: the fence is closed either way.
          if (e?.tag === 'unreachable') ctx.openFences = ctx.openFences.filter(([c]) => c !== container);
          throw e;
        }
        ctx.openFences = ctx.openFences.filter(([c]) => c !== container);
        return n;
      },
      run: sub((container, cmd, timeoutMs) => s.run(container, cmd, timeoutMs)),
      startProcess: (container, cmd) => {
        const id = s.startProcess(container, cmd);
        ctx.started.push([container, id]);
        return id;
      },
      listProcesses: sub((container) => s.listProcesses(container)),
      processStatus: sub((container, id) => s.processStatus(container, id)),
      killProcess: sub((container, id) => s.killProcess(container, id)),
      killAll: sub((container) => s.killAll(container)),
      snapshot: sub((container) => s.snapshot(container)),
      saveSnapshot: sub((container, name) => s.saveSnapshot(container, name)),
      forkSnapshot: sub((source, name, key) => s.forkSnapshot(source, name, key)),
      dropSnapshot: sub((key, name) => s.dropSnapshot(key, name)),
      stop: sub((container) => s.stop(container)),
      denials: sub((key) => s.denials(key)),
      listArtifacts: sub((key) => s.listArtifacts(key)),
      readArtifact: sub((key, name, offset, length) => s.readArtifact(key, name, offset, length)),
      openPreview: sub((container, port) => s.openPreview(container, port)),
      closePreview: sub((container, port) => s.closePreview(container, port)),
      listPreviews: sub((container) => s.listPreviews(container)),
    };
    // Calls the guest already decided, made in order through the imports above (the
    // same bookkeeping of open fences), stopping at the first error.
    substrate.batch = (calls) => batchInOrder(substrate, calls);
    return withVersions({
      'stockade:sandbox/types': {},
      'stockade:sandbox/substrate': substrate,
      'stockade:sandbox/records': {
        put: rec('put', (scope, name, value) => this.store.put(scope, name, value)),
        get: rec('get', (scope, name) => this.store.get(scope, name)),
        remove: rec('remove', (scope, name) => this.store.remove(scope, name)),
        list: rec('list', (scope, prefix) => this.store.list(scope, prefix)),
        find: rec('find', (prefix, value) => this.store.find(prefix, value)),
      },
      'stockade:sandbox/policy': {
        // The floor cannot fail by contract; a host that cannot state it admits
        // nothing: an injected fault of any kind traps the call.
        floorRules: () => {
          try {
            s.fire('policy.floor-rules');
          } catch (e) {
            if (e instanceof Error) throw e;
            throw new Error(`injected into policy.floor-rules: ${e}`);
          }
          return this.floor.map((pattern) => ({ pattern: [...pattern] }));
        },
        // A store that cannot be read admits nothing: the floor fails closed. Looking
        // spends nothing; the guest spends the token once the command is admitted.
        approval: (key, token) => {
          try {
            s.fire('policy.approval');
            return this.store.peekApproval(key, token, Date.now());
          } catch (e) {
            if (e instanceof Error && e.name === 'MockTrap') throw e;
            return undefined;
          }
        },
        spendApproval: (key, token) => {
          try {
            s.fire('policy.spend-approval');
            return this.store.takeApproval(key, token, Date.now()) !== undefined;
          } catch (e) {
            if (e instanceof Error && e.name === 'MockTrap') throw e;
            return false;
          }
        },
        // This host holds no secrets: every credential rule is unbound (refused).
        secretBinding: (_name) => {
          try {
            s.fire('policy.secret-binding');
          } catch (e) {
            if (e instanceof Error && e.name === 'MockTrap') throw e;
          }
          return undefined;
        },
      },
      'stockade:sandbox/clock': { nowMs: () => BigInt(Date.now()) },
      'stockade:sandbox/log': {
        emit: (level, event, fields) => this.log(level, event, fields),
      },
    });
  }

  /** Run one facade (or `events`) call on a fresh instance; returns its value or throws a CallError. */
  async call(name, ...args) {
    const ctx = { openFences: [], started: [] };
    let result;
    let failure;
    try {
      const inst = await instantiate((path) => {
        const m = CORES[path];
        if (!m) throw new Error(`no core module ${path} (re-run edge/build.sh)`);
        return m;
      }, this.imports(ctx));
      result = exported(inst, name)(...args);
    } catch (e) {
      failure = e;
    }
    const isFacadeError =
      failure !== undefined && failure !== null && Object.prototype.hasOwnProperty.call(failure, 'payload');
    await settle(this.substrate, ctx, { trapped: failure !== undefined && !isFacadeError, log: this.log });
    if (failure === undefined) return result;
    if (failure && Object.prototype.hasOwnProperty.call(failure, 'payload') && !(failure instanceof CallError)) {
      throw new CallError('facade', failure.payload, `guest error ${failure.payload?.tag}`);
    }
    this.log('error', 'guest trapped', [['error', String(failure?.stack ?? failure)]]);
    throw new CallError('trap', undefined, `guest trapped: ${failure?.message ?? failure}`);
  }
}
