// The conformance scenario runner: a mirror of tests/src/scenarios.rs. One scenario
// (an element of tests/scenarios/conformance.json) runs against the real guest over a
// fresh mock substrate and a fresh in-memory store. docs/CONFORMANCE.md is the format.

import { Mock, faultFor } from './mock.js';
import { MemoryStore } from './store.js';
import { CallError, EdgeRuntime } from './host.js';

const dec = new TextDecoder(); // lossy, like String::from_utf8_lossy
const enc = new TextEncoder();

/** A fresh harness: mock (ceiling), store, runtime (floor: the scenario's or the default). */
export function harness(ceiling = 16, floor = undefined, log = () => {}) {
  const mock = new Mock(ceiling);
  const store = new MemoryStore();
  const rt = new EdgeRuntime({ substrate: mock, store, ...(floor ? { floor } : {}), log });
  return { mock, store, rt };
}

function subst(s, saved) {
  if (typeof s === 'string' && s.startsWith('$')) {
    const name = s.slice(1);
    return Object.prototype.hasOwnProperty.call(saved, name) ? saved[name] : s;
  }
  return s;
}

function substValue(v, saved) {
  if (typeof v === 'string') return subst(v, saved);
  if (Array.isArray(v)) return v.map((x) => substValue(x, saved));
  if (v && typeof v === 'object') {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, substValue(x, saved)]));
  }
  return v;
}

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/**
 * `want` matches `got` when every key of an object in `want` matches, arrays match
 * element-wise with equal length, and scalars are equal.
 */
export function matches(want, got) {
  if (isObject(want) && isObject(got)) {
    return Object.entries(want).every(
      ([k, wv]) => Object.prototype.hasOwnProperty.call(got, k) && matches(wv, got[k]),
    );
  }
  if (Array.isArray(want) && Array.isArray(got)) {
    return want.length === got.length && want.every((w, i) => matches(w, got[i]));
  }
  if (isObject(want) || Array.isArray(want) || isObject(got) || Array.isArray(got)) return false;
  return want === got;
}

const str = (x) => (typeof x === 'string' ? x : '');
const u64 = (x) => (Number.isInteger(x) && x >= 0 ? x : undefined);
const strings = (x) => (Array.isArray(x) ? x.map(str) : []);

/** A step's grant (`{"rules": [{"host", "methods"?, "path_prefix"?, "headers"?,
 * "intercept"?}], "ask"?}`) as the WIT `grant` (scenarios.rs `grant_of`). */
function grantOf(g) {
  return {
    rules: g.rules.map((r) => ({
      host: str(r.host),
      methods: strings(r.methods),
      pathPrefix: typeof r.path_prefix === 'string' ? r.path_prefix : undefined,
      headers: Object.entries(r.headers ?? {}).map(([name, v]) => ({
        name: str(name),
        secret: str(v?.secret),
      })),
      intercept: r.intercept !== false,
    })),
    ask: g.ask === true,
  };
}

/** The input of a step (snake_case JSON) as the WIT `exec-input` (jco's camelCase). */
export function execInput(v, saved) {
  v = substValue(v ?? {}, saved) ?? {};
  const timeout = u64(v.timeout_ms);
  return {
    argv: strings(v.argv),
    cwd: typeof v.cwd === 'string' ? v.cwd : undefined,
    env: Array.isArray(v.env) ? v.env.map((p) => [str(p[0]), str(p[1])]) : [],
    timeoutMs: timeout === undefined ? undefined : BigInt(timeout),
    grant: v.grant === undefined ? undefined : grantOf(v.grant),
    approval: typeof v.approval === 'string' ? v.approval : undefined,
    stdin: typeof v.stdin === 'string' ? enc.encode(v.stdin) : undefined,
  };
}

/** A detached state in the scenario file's vocabulary. */
export function stateJson(s) {
  switch (s.tag) {
    case 'running':
      return 'running';
    case 'exited':
      return { exited: s.val };
    case 'gone':
      return { gone: s.val };
    default:
      throw new Error(`unknown detached state ${JSON.stringify(s)}`);
  }
}

async function outcome(promise, ok) {
  try {
    return { ok: ok(await promise) };
  } catch (e) {
    if (e instanceof CallError && e.kind === 'facade') return { err: e.payload.tag };
    if (e instanceof CallError && e.kind === 'trap') return { trap: true };
    throw e;
  }
}

/** A step's `lifetime` (`{ends_at_ms, on_end}`, or null) as the WIT's `option<lifetime>`. */
function lifetimeOf(v) {
  if (!isObject(v)) return undefined;
  return { endsAtMs: BigInt(u64(v.ends_at_ms) ?? 0), onEnd: v.on_end === 'checkpoint' ? 'checkpoint' : 'abort' };
}

/** A `sandbox-info` as the scenarios write it (scenarios.rs `info_json`). */
function infoJson(i) {
  return {
    key: i.key,
    running: i.running,
    lifetime: i.lifetime === undefined ? null : { ends_at_ms: Number(i.lifetime.endsAtMs), on_end: i.lifetime.onEnd },
    metadata: i.metadata,
    network: i.network === undefined ? null : { rules: i.network.rules.map((r) => r.host), ask: i.network.ask },
  };
}

/**
 * The Rust runtime's `expire`: ask which lifetimes ended (`expiring`, read-only), then
 * end each (`endLifetime`, which checks again; the runner's calls run one at a time, as
 * the key's order would hold them); the keys that ended. An unreadable ask ends none.
 */
async function expire(rt) {
  let due;
  try {
    due = await rt.call('expiring');
  } catch (e) {
    if (e instanceof CallError) return [];
    throw e;
  }
  const ended = [];
  for (const key of due) {
    try {
      if ((await rt.call('endLifetime', key)) === true) ended.push(key);
    } catch (e) {
      if (!(e instanceof CallError)) throw e;
    }
  }
  return ended;
}

async function doCall(h, call, step, saved) {
  const key = subst(str(step.key), saved);
  const id = subst(str(step.id), saved);
  const rt = h.rt;
  switch (call) {
    case 'exec':
      return outcome(rt.call('exec', key, execInput(step.input, saved)), (o) => ({
        exit_code: o.exitCode,
        stdout: dec.decode(o.stdout),
        stderr: dec.decode(o.stderr),
        timed_out: o.timedOut,
        truncated: o.truncated,
        killed: o.killed,
        denials: o.denials,
        admitted: o.admitted,
      }));
    case 'start-detached': {
      // The mirror of runtime.rs's `detached_input`: a grant is refused before any
      // call (the contract's detached-input cannot carry one), a timeout dropped.
      const input = execInput(step.input, saved);
      if (input.grant !== undefined) return { err: 'invalid-input' };
      const { grant: _g, timeoutMs: _t, ...detached } = input;
      return outcome(rt.call('startDetached', key, detached), (id) => id);
    }
    case 'detached-status':
      return outcome(rt.call('detachedStatus', key, id), stateJson);
    case 'stop-detached':
      return outcome(rt.call('stopDetached', key, id), () => null);
    case 'ensure':
      return outcome(rt.call('ensure', key), () => null);
    case 'abort':
      return outcome(rt.call('abort', key), () => null);
    case 'checkpoint':
      return outcome(rt.call('checkpoint', key), () => null);
    // The time a snapshot was taken is the clock's: the scenario compares names.
    case 'save-snapshot':
      return outcome(rt.call('saveSnapshot', key, subst(str(step.name), saved)), (s) => s.name);
    case 'snapshots':
      return outcome(rt.call('snapshots', key), (l) => l.map((s) => s.name));
    case 'fork':
      return outcome(rt.call('fork', key, subst(str(step.source), saved), subst(str(step.name), saved)), () => null);
    case 'delete-snapshot':
      return outcome(rt.call('deleteSnapshot', key, subst(str(step.name), saved)), () => null);
    case 'set-lifetime':
      return outcome(rt.call('setLifetime', key, lifetimeOf(step.lifetime)), () => null);
    case 'set-metadata':
      return outcome(
        rt.call('setMetadata', key, Array.isArray(step.metadata) ? step.metadata.map((p) => [str(p?.[0]), str(p?.[1])]) : []),
        () => null,
      );
    case 'set-network':
      return outcome(rt.call('setNetwork', key, isObject(step.network) ? grantOf(step.network) : undefined), () => null);
    case 'describe':
      return outcome(rt.call('describe', key), (i) => (i === undefined ? null : infoJson(i)));
    case 'sandboxes':
      return outcome(rt.call('sandboxes', subst(str(step.prefix), saved)), (l) => l.map(infoJson));
    case 'forget':
      return outcome(rt.call('forget', key), () => null);
    // The host-facing ask and end, as the runtime's loop makes them.
    case 'expire':
      return { ok: await expire(rt) };
    case 'denials':
      return outcome(rt.call('denials', key), (d) =>
        d.map((d) => ({ host: d.host, method: d.method, path: d.path, reason: d.reason })),
      );
    case 'artifacts':
      return outcome(rt.call('artifacts', key), (a) => a.map((a) => ({ name: a.name, size: Number(a.size) })));
    case 'read-artifact':
      return outcome(
        rt.call(
          'readArtifact',
          key,
          subst(str(step.name), saved),
          BigInt(u64(step.offset) ?? 0),
          (u64(step.length) ?? 1 << 20) >>> 0,
        ),
        (b) => dec.decode(b),
      );
    case 'on-stop':
      return outcome(rt.call('onStop', subst(str(step.container), saved)), (n) => n);
    default:
      return { error: `unknown call ${call}` };
  }
}

/** Run one scenario; resolves to `{ok: true}` or `{ok: false, error}` naming the step and what differed. */
export async function runScenario(scenario, { log } = {}) {
  try {
    await run(scenario, log);
    return { ok: true, error: null };
  } catch (e) {
    return { ok: false, error: e instanceof ScenarioFailure ? e.message : `runner error: ${e?.stack ?? e}` };
  }
}

class ScenarioFailure extends Error {}

async function run(scenario, log) {
  const floor = scenario.floor;
  const ceiling = u64(scenario.ceiling) ?? 16;
  const h = harness(ceiling, floor, log);
  const saved = {};
  const steps = scenario.steps;
  if (!Array.isArray(steps)) throw new ScenarioFailure('no steps');
  for (const [i, step] of steps.entries()) {
    const at = `step ${i} ${JSON.stringify(step)}`;
    h.mock.clearTrace();
    if (step.fault !== undefined) {
      const f = step.fault;
      h.mock.inject(f.op, faultFor(f.error), u64(f.times), u64(f.skip) ?? 0);
      continue;
    }
    if (step.clear_faults !== undefined) {
      h.mock.clearFaults();
      continue;
    }
    if (typeof step.check === 'string') {
      const e = check(h, step.check, subst(str(step.id), saved));
      if (e !== null) throw new ScenarioFailure(`${at}: ${e}`);
      continue;
    }
    if (step.mock !== undefined) {
      const arg = (k) => subst(str(step[k]), saved);
      switch (step.mock) {
        case 'exit-process':
          h.mock.exitProcess(arg('container'), arg('id'), step.code | 0);
          break;
        case 'lose-process':
          h.mock.loseProcess(arg('container'), arg('id'));
          break;
        case 'stop-container':
          h.mock.stopFromOutside(arg('container'));
          break;
        case 'put-artifact':
          h.mock.putArtifact(arg('key'), arg('name'), enc.encode(arg('bytes')));
          break;
        default:
          throw new ScenarioFailure(`${at}: unknown mock op ${step.mock}`);
      }
      continue;
    }
    if (step.approve !== undefined) {
      const a = step.approve;
      // Valid for a day, or already expired (`"expired": true`).
      const expires = a.expired === true ? 1 : Date.now() + 86_400_000;
      const token = h.store.recordApproval(a.key, a.argv, expires);
      saved[step.save] = token;
      continue;
    }
    if (typeof step.call !== 'string') throw new ScenarioFailure(`${at}: no call`);
    const got = await doCall(h, step.call, step, saved);
    if (typeof step.save === 'string' && typeof got.ok === 'string') saved[step.save] = got.ok;
    if (typeof step.outcome === 'string') {
      const name = outcomeName(got);
      if (name !== step.outcome) throw new ScenarioFailure(`${at}: outcome ${name}, expected ${step.outcome}`);
    }
    if (step.expect !== undefined) {
      const want = substValue(step.expect, saved);
      if (!matches(want, got)) {
        throw new ScenarioFailure(`${at}: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
      }
    }
    if (step.trace !== undefined) {
      const ops = h.mock.ops();
      const want = step.trace;
      if (ops.length !== want.length || ops.some((op, j) => op !== want[j])) {
        throw new ScenarioFailure(`${at}: trace ${JSON.stringify(ops)}, expected ${JSON.stringify(want)}`);
      }
    }
    if (step.records !== undefined) {
      // Declarations only: tombstones (`gone/…`) are what a cleared declaration leaves.
      const n = h.store.allRecords().filter(([, name]) => name.startsWith('detached/')).length;
      if (n !== step.records) throw new ScenarioFailure(`${at}: ${n} records, expected ${step.records}`);
    }
  }
}

/** A call's outcome in one word: `ok`, `err:NAME` or `trap`. */
export function outcomeName(got) {
  if (Object.prototype.hasOwnProperty.call(got, 'ok')) return 'ok';
  if (typeof got.err === 'string') return `err:${got.err}`;
  if (got.trap === true) return 'trap';
  return `unknown:${JSON.stringify(got)}`;
}

/**
 * The state checks a step can make (docs/CONFORMANCE.md); null when it holds:
 * `fence-closed` (no grant open), `declared-only` (every running process is declared
 * by its key, for its container), `records-match` (the declarations are exactly the
 * processes the containers track).
 */
function check(h, what, id) {
  const row = (k, c, id) => JSON.stringify([k, c, id]);
  const declared = new Set(
    h.store
      .allRecords()
      .filter(([, name]) => name.startsWith('detached/'))
      .map(([scope, name, container]) => row(scope, container, name.slice('detached/'.length))),
  );
  const tracked = (runningOnly) =>
    new Set(
      h.mock
        .tracked()
        .filter((t) => t.process.running || !runningOnly)
        .map((t) => row(t.key, t.container, t.process.id)),
    );
  switch (what) {
    case 'fence-closed': {
      const open = h.mock.openGrants();
      return open.length === 0 ? null : `grants left open: ${JSON.stringify(open)}`;
    }
    case 'declared-only': {
      const undeclared = [...tracked(true)].filter((r) => !declared.has(r));
      return undeclared.length === 0 ? null : `undeclared processes left running: ${undeclared.join(', ')}`;
    }
    case 'records-match': {
      const t = tracked(false);
      const same = t.size === declared.size && [...t].every((r) => declared.has(r));
      return same ? null : `declarations ${[...declared].join(', ')} but tracked processes ${[...t].join(', ')}`;
    }
    case 'alive': {
      const running = h.mock.tracked().some((t) => t.process.running && t.process.id === id);
      return running ? null : `the declared process ${id} was killed`;
    }
    default:
      return `unknown check ${what}`;
  }
}

/** A fault-matrix cell (`[call, op, skip, fault, outcome]`) as a scenario: the mirror
 * of `cell_scenario` in tests/src/faults.rs. */
export function cellScenario(call, cell) {
  const [, op, skip, fault, outcome, survives] = cell;
  const steps = [...(call.setup ?? [])];
  if (fault !== 'none') steps.push({ fault: { op, skip, error: fault, times: 1 } });
  steps.push({ ...call.step, outcome });
  if (survives === true) steps.push({ check: 'alive', id: call.survivor });
  steps.push(
    { check: 'fence-closed' },
    { check: 'declared-only' },
    { clear_faults: true },
    { call: 'exec', key: 'k', input: { argv: ['echo', 'after'] }, outcome: 'ok' },
    { check: 'fence-closed' },
    { check: 'records-match' },
  );
  const s = { name: `${cell[0]} | ${op}#${skip} | ${fault}`, steps };
  if (call.floor !== undefined) s.floor = call.floor;
  return s;
}
