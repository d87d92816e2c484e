// A minimal host of the `stockade:sandbox` world (wit/sandbox.wit), in JavaScript for
// Node: the guest component, transpiled by jco, over an in-memory substrate, running
// the conformance scenarios (tests/scenarios/conformance.json). It shares no code
// with the Rust host or the edge: the WIT and docs/EMBEDDING.md are its whole brief.
// docs/CONFORMANCE.md is the scenario format and the reference mock's semantics.
//
//   node host.mjs <jco output dir> <scenario file>     (run.sh transpiles, then runs this)
//
// jco's conventions, used throughout: records are objects with camelCase fields, a
// variant is `{tag, val}`, an enum a string, an `option` a value or `undefined`, a
// `u64` a BigInt, a `list<u8>` a Uint8Array. An import returning `result<T, E>`
// returns T, or throws E as a plain value (throwing an `Error` traps the guest). An
// export returning `result<T, E>` returns T, or throws an Error whose `payload` is E.

import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { randomUUID } from 'node:crypto';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const enc = new TextEncoder();
const dec = new TextDecoder(); // lossy: invalid UTF-8 becomes U+FFFD

// ---- 1. The substrate: containers in a Map, processes that never really run ----------
// The reference mock's semantics (docs/CONFORMANCE.md, "The mock substrate"), which the
// scenarios assume: ids `mock-cN` and `00000000-0000-4000-8000-{n:012x}`, runs scripted
// by argv[0]. A real substrate keeps the same contracts with real containers.

/** A `substrate-error`, thrown as a plain value: the guest receives it as the `err` case. */
const fail = (tag, val) => ({ tag, val });
const UNSUPPORTED = fail('failed', 'unsupported: this host serves no preview doors');

class MemorySubstrate {
  constructor(ceiling) {
    this.ceiling = ceiling; // the ticket gate: at most this many live containers
    this.containers = new Map(); // id -> { key, processes: Map(id -> process-info), fence, rules, admitted, denied }
    this.keys = new Map(); // key -> its live container
    this.deniedByKey = new Map(); // key -> [denial]
    this.artifacts = new Map(); // key -> Map(name -> Uint8Array)
    this.named = new Map(); // key -> Set of its named snapshots' names
    this.forked = new Map(); // key -> [source, name]: the snapshot its next container starts from
    this.trace = []; // the ops called, which a scenario's `trace` lists
    this.counters = { container: 0, process: 0 };
  }

  enter(op) {
    this.trace.push(op);
  }

  container(id) {
    const c = this.containers.get(id);
    if (!c) throw fail('unreachable', `no container ${id}`); // unreachable: gone
    return c;
  }

  newProcess(id, running, exitCode) {
    const n = ++this.counters.process;
    const pid = `00000000-0000-4000-8000-${n.toString(16).padStart(12, '0')}`;
    this.container(id).processes.set(pid, { id: pid, running, exitCode });
    return pid;
  }

  // One method per WIT substrate function.
  ensure(key) {
    this.enter('ensure');
    if (this.keys.has(key)) return this.keys.get(key);
    if (this.containers.size >= this.ceiling) throw fail('over-capacity');
    const id = `mock-c${++this.counters.container}`;
    this.containers.set(id, { key, processes: new Map(), fence: null, rules: 0, admitted: 0, denied: 0 });
    this.keys.set(key, id);
    return id;
  }
  current(key) {
    this.enter('current');
    return this.keys.get(key);
  }
  applyGrant(id, grant) {
    this.enter('apply-grant');
    const c = this.container(id);
    // A real substrate opens the grant on the container's egress proxy here; this one
    // only remembers that a fence is open and how many rules it has, and counts what
    // `run` pretends it did.
    Object.assign(c, { fence: randomUUID(), rules: grant.rules.length, admitted: 0, denied: 0 });
    return c.fence;
  }
  revokeGrant(id) {
    this.enter('revoke-grant');
    const c = this.container(id);
    const counts = { admitted: c.admitted, denied: c.denied };
    Object.assign(c, { fence: null, rules: 0, admitted: 0, denied: 0 });
    return counts;
  }
  run(id, cmd, _timeoutMs) {
    this.enter('run');
    const c = this.container(id);
    const [prog, ...args] = cmd.argv;
    const r = { exitCode: 0, stdout: new Uint8Array(), stderr: new Uint8Array(), timedOut: false, truncated: false, limits: [] };
    if (prog === 'echo') r.stdout = enc.encode(`${args.join(' ')}\n`);
    if (prog === 'cat') r.stdout = cmd.stdin;
    if (prog === 'exit') r.exitCode = toI32(args[0]);
    if (prog === 'background') this.newProcess(id, true, undefined); // outlives the run: the teardown must kill it
    if (prog === 'hang') Object.assign(r, { exitCode: -1, timedOut: true });
    if (prog === 'rules') r.stdout = enc.encode(c.fence ? `${c.rules}\n` : 'none\n'); // the grant it runs under
    if (prog === 'admit' && c.fence) c.admitted += 1;
    if (prog === 'deny' && c.fence) {
      c.denied += 1;
      const list = this.deniedByKey.get(c.key) ?? [];
      list.push({ atMs: 0n, host: args[0] ?? '', method: 'GET', path: '/', fence: c.fence, reason: 'no-rule' });
      this.deniedByKey.set(c.key, list);
      r.exitCode = 22;
    }
    return r;
  }
  startProcess(id, cmd) {
    this.enter('start-process');
    return cmd.argv[0] === 'exit' ? this.newProcess(id, false, toI32(cmd.argv[1])) : this.newProcess(id, true, undefined);
  }
  listProcesses(id) {
    this.enter('list-processes');
    return [...this.container(id).processes.values()].sort((a, b) => (a.id < b.id ? -1 : 1));
  }
  processStatus(id, pid) {
    this.enter('process-status');
    return this.container(id).processes.get(pid);
  }
  killProcess(id, pid) {
    this.enter('kill-process');
    const c = this.container(id);
    const p = c.processes.get(pid);
    c.processes.delete(pid);
    return p?.running ? 1 : 0;
  }
  killAll(id) {
    this.enter('kill-all');
    const c = this.container(id);
    const n = [...c.processes.values()].filter((p) => p.running).length;
    c.processes.clear();
    return n;
  }
  snapshot(id) {
    this.enter('snapshot');
    this.container(id); // a real substrate saves /workspace as the key's restore cache
  }
  // Named snapshots outlive the container (a real substrate archives /workspace under the
  // name); a fork makes one the key's restore cache.
  saveSnapshot(id, name) {
    this.enter('save-snapshot');
    const { key } = this.container(id);
    if (!this.named.has(key)) this.named.set(key, new Set());
    this.named.get(key).add(name);
  }
  forkSnapshot(source, name, key) {
    this.enter('fork-snapshot');
    if (!this.named.get(source)?.has(name)) throw fail('invalid', `${source} holds no snapshot named ${JSON.stringify(name)}`);
    this.forked.set(key, [source, name]);
  }
  dropSnapshot(key, name) {
    this.enter('drop-snapshot');
    return this.named.get(key)?.delete(name) ?? false;
  }
  stop(id) {
    this.enter('stop');
    this.keys.delete(this.container(id).key);
    this.containers.delete(id);
  }
  denials(key) {
    this.enter('denials');
    return this.deniedByKey.get(key) ?? [];
  }
  listArtifacts(key) {
    this.enter('list-artifacts');
    const files = [...(this.artifacts.get(key) ?? new Map())].sort(([a], [b]) => byteOrder(a, b));
    return files.map(([name, bytes]) => ({ name, size: BigInt(bytes.length) }));
  }
  readArtifact(key, name, offset, length) {
    this.enter('read-artifact');
    const bytes = this.artifacts.get(key)?.get(name);
    if (!bytes) throw fail('invalid', `no artifact ${JSON.stringify(name)}`);
    const start = Math.min(Number(offset), bytes.length);
    return bytes.slice(start, Math.min(start + length, bytes.length));
  }
  // `open-preview`, `close-preview`, `list-previews`: a door needs an inbound listener.
  // Declined with a typed error, which the guest hands the consumer as `failed`
  // (docs/EMBEDDING.md, "What a host may decline").
  preview(op) {
    this.enter(op);
    throw UNSUPPORTED;
  }
}

/** `exit N`'s code: N when it is an i32, else 1. */
function toI32(s) {
  const n = /^[+-]?\d+$/.test(s ?? '') ? Number(s) : NaN;
  return Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31 ? n : 1;
}

/** Byte order of the UTF-8 encodings (the order `records.list` promises). */
const byteOrder = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));

// ---- 2. `substrate.batch`: the one substrate import this guest lowers ------------------
// The guest makes every substrate call through `batch` (a call alone is a batch of one),
// so that is the only substrate function this host hands it. A host for other guests of
// the world also gives the named functions. The batch also keeps the host's own books:
// which fences the call opened, which processes it started (used by `settle`, below).

function batch(s, books, calls) {
  if (calls.length < 1 || calls.length > 16) throw fail('invalid', `a batch carries 1 to 16 calls, not ${calls.length}`);
  if (calls.some((c, i) => c.tag === 'ensure' && i > 0)) throw fail('invalid', 'only the first call may be an ensure');
  const target = (c) => c.val?.container ?? c.val; // where a call names its container
  if (calls[0].tag !== 'ensure' && calls.some((c) => target(c)?.tag === 'ensured')) {
    throw fail('invalid', 'a call names the ensured container, and the batch does not open with an ensure');
  }
  let ensured;
  const on = (t) => (t.tag === 'ensured' ? ensured : t.val);
  const answers = [];
  for (const { tag, val } of calls) {
    try {
      answers.push({ tag: 'ok', val: { tag, val: make(tag, val) } });
    } catch (e) {
      if (e instanceof Error) throw e; // not a substrate-error: a bug, which traps the call
      answers.push({ tag: 'err', val: e });
      break; // stop at the first error: the calls after it are not made
    }
  }
  return answers;

  function make(tag, v) {
    switch (tag) {
      case 'ensure':
        return (ensured = s.ensure(v));
      case 'current':
        return s.current(v);
      case 'apply-grant': {
        const c = on(v.container);
        books.fences.set(c, 'apply-failed'); // until it answers: a failed apply is revoked too
        const fence = s.applyGrant(c, v.grant);
        books.fences.set(c, 'applied');
        return fence;
      }
      case 'revoke-grant': {
        const c = on(v);
        try {
          const counts = s.revokeGrant(c);
          books.fences.delete(c);
          return counts;
        } catch (e) {
          if (e?.tag === 'unreachable') books.fences.delete(c); // a grant does not outlive its container
          throw e;
        }
      }
      case 'run':
        return s.run(on(v.container), v.cmd, v.timeoutMs);
      case 'start-process': {
        const c = on(v.container);
        const id = s.startProcess(c, v.cmd);
        books.started.push([c, id]);
        return id;
      }
      case 'list-processes':
        return s.listProcesses(on(v));
      case 'process-status':
        return s.processStatus(on(v.container), v.id);
      case 'kill-process':
        return s.killProcess(on(v.container), v.id);
      case 'kill-all':
        return s.killAll(on(v));
      case 'snapshot':
        return s.snapshot(on(v));
      case 'stop':
        return s.stop(on(v));
      case 'save-snapshot':
        return s.saveSnapshot(on(v.container), v.name);
      case 'fork-snapshot':
        return s.forkSnapshot(v.source, v.name, v.key);
      case 'drop-snapshot':
        return s.dropSnapshot(v.key, v.name);
      case 'denials':
        return s.denials(v);
      case 'list-artifacts':
        return s.listArtifacts(v);
      case 'read-artifact':
        return s.readArtifact(v.key, v.name, v.offset, v.length);
      case 'open-preview':
      case 'close-preview':
      case 'list-previews':
        return s.preview(tag);
      default:
        throw fail('invalid', `unknown call ${tag}`);
    }
  }
}

// ---- 3. records, policy, clock, log -----------------------------------------------------

/** `records`: scope -> name -> value. A real host keeps them durably (docs/DESIGN.md §3.9). */
class Records {
  constructor() {
    this.scopes = new Map();
  }
  put(scope, name, value) {
    if (!this.scopes.has(scope)) this.scopes.set(scope, new Map());
    this.scopes.get(scope).set(name, value);
  }
  get(scope, name) {
    return this.scopes.get(scope)?.get(name);
  }
  remove(scope, name) {
    return this.scopes.get(scope)?.delete(name) ?? false;
  }
  list(scope, prefix) {
    return [...(this.scopes.get(scope) ?? [])]
      .filter(([name]) => name.startsWith(prefix))
      .sort(([a], [b]) => byteOrder(a, b))
      .map(([name, value]) => ({ name, value }));
  }
  find(prefix, value) {
    return this.all()
      .filter(([, name, v]) => name.startsWith(prefix) && v === value)
      .map(([scope, name]) => [scope, name]);
  }
  /** Every record as [scope, name, value], by scope then name. */
  all() {
    const rows = [...this.scopes].flatMap(([scope, m]) => [...m].map(([name, v]) => [scope, name, v]));
    return rows.sort((a, b) => byteOrder(a[0], b[0]) || byteOrder(a[1], b[1]));
  }
}

/** `policy`: the floor rules, approvals (an approver's, single use), no secrets. */
class Policy {
  constructor(floor) {
    this.floor = floor;
    this.approvals = new Map(); // token -> { key, argv, expires, spent }
  }
  approve(key, argv, expired) {
    const token = randomUUID();
    this.approvals.set(token, { key, argv, expires: expired ? 1 : Date.now() + 86_400_000, spent: false });
    return token;
  }
  valid(key, token) {
    const a = this.approvals.get(token);
    return a && a.key === key && !a.spent && a.expires > Date.now() ? a : undefined;
  }
  imports() {
    return {
      floorRules: () => this.floor.map((pattern) => ({ pattern })),
      approval: (key, token) => this.valid(key, token)?.argv, // looking spends nothing
      spendApproval: (key, token) => {
        const a = this.valid(key, token);
        if (a) a.spent = true; // check and spend in one step: JavaScript runs it alone
        return Boolean(a);
      },
      secretBinding: () => undefined, // no secrets here: every credential rule is refused
    };
  }
}

/** The floor rules `wasmtime.toml` ships (`[floor] rules`), for scenarios that give none. */
function defaultFloor() {
  const toml = readFileSync(join(root, 'wasmtime.toml'), 'utf8');
  const section = toml.slice(toml.indexOf('\n[floor]\n'));
  const m = section.match(/^rules = (\[[\s\S]*?^\])/m);
  if (!m) throw new Error('wasmtime.toml: no [floor] rules');
  return JSON.parse(m[1].replace(/#.*$/gm, '').replace(/,(\s*\])/g, '$1'));
}

// ---- 4. The runtime: a fresh instance per call, per-key order, settle ------------------

// No per-call deadline: Node cannot interrupt a synchronous guest call in its own thread
// (docs/EMBEDDING.md, "Calling the exports", says what a host does instead).

const MUTATING = new Set([
  'exec', 'startDetached', 'stopDetached', 'ensure', 'abort', 'checkpoint', 'saveSnapshot', 'fork', 'deleteSnapshot', 'expose', 'unexpose',
  'setLifetime', 'setMetadata', 'setNetwork', 'forget',
  'endLifetime', // an `events` call, but it ends the key: held as the key's other mutations
]);

/** The host-facing `events` exports; every other call is the facade's. */
const EVENTS = new Set(['onStop', 'expiring', 'endLifetime']);

class Host {
  constructor({ instantiate, cores, version, substrate, records, policy, log }) {
    Object.assign(this, { instantiate, cores, version, substrate, records, policy, log });
    this.queues = new Map(); // key -> the promise its last mutating call settles
  }

  imports(books) {
    const { substrate, records } = this;
    const byName = {
      'stockade:sandbox/types': {},
      'stockade:sandbox/substrate': { batch: (calls) => batch(substrate, books, calls) },
      // In memory they never fail; a store that does throws its error as a string.
      'stockade:sandbox/records': Object.fromEntries(
        ['put', 'get', 'remove', 'list', 'find'].map((f) => [f, records[f].bind(records)]),
      ),
      'stockade:sandbox/policy': this.policy.imports(),
      'stockade:sandbox/clock': { nowMs: () => BigInt(Date.now()) },
      'stockade:sandbox/log': { emit: (level, event, fields) => this.log(level, event, fields) },
    };
    // jco looks the unversioned names up; other bindings use the versioned ones.
    // The version is the WIT's own (`…/substrate@0.2.0`).
    return { ...byName, ...Object.fromEntries(Object.entries(byName).map(([n, f]) => [`${n}@${this.version}`, f])) };
  }

  /** A facade (or `events`) call. Mutating calls of one key run one at a time, in order. */
  call(name, ...args) {
    if (!MUTATING.has(name)) return this.once(name, args);
    const key = args[0];
    const mine = (this.queues.get(key) ?? Promise.resolve()).then(() => this.once(name, args));
    this.queues.set(key, mine.catch(() => {}));
    return mine;
  }

  /** One call on a fresh instance: `{ok}`, `{err}` (the facade's error) or `{trap}`. */
  async once(name, args) {
    const books = { fences: new Map(), started: [] };
    let result;
    try {
      const inst = await this.instantiate((path) => this.cores.get(path), this.imports(books));
      result = { ok: (EVENTS.has(name) ? inst.events : inst.facade)[name](...args) };
    } catch (e) {
      result = e && Object.hasOwn(e, 'payload') ? { err: e.payload } : { trap: e };
    }
    this.settle(books, 'trap' in result);
    return result;
  }

  /**
   * Whatever the call left behind, on every path (docs/DESIGN.md §3.1): a trapped call
   * handed out no id, so what it started is killed; a fence it left open is torn down
   * (kill-all), then revoked; an apply that failed opened nothing, so it is only
   * revoked. A call that answered closed its fences itself, unless a revoke failed.
   */
  settle(books, trapped) {
    const s = this.substrate;
    const quietly = (f) => { try { f(); } catch {} }; // best effort, as the guest's teardown
    if (trapped) for (const [c, id] of books.started) quietly(() => s.killProcess(c, id));
    for (const [c, state] of books.fences) {
      if (state === 'applied') quietly(() => s.killAll(c));
      quietly(() => s.revokeGrant(c));
    }
  }
}

// ---- 5. The scenarios (docs/CONFORMANCE.md) ---------------------------------------------

/** Scenarios this host does not run, by name, and why. */
const SKIP = new Map(
  [
    ['list unreadable: kill-all, the declared process too, and the grant is still revoked', 'list-processes'],
    ['a selective kill that fails falls back to kill-all', 'kill-process'],
    ['a run that fails still tears down and revokes', 'run'],
    ['a container unreachable mid-fence still gets its teardown and revoke', 'run'],
    ['a trap after apply-grant: the host tears the fence down, then revokes the grant', 'run (a trap)'],
    ['declarations unreadable at teardown: kill-all, the fence completes', 'records.list'],
    ['declarations that cannot be forgotten never skip a kill', 'records.remove'],
    ['a failing ensure opens no grant', 'ensure'],
    ['a failed snapshot stops nothing and keeps the records', 'snapshot'],
    ['an unreachable container reads as gone(container-unreachable) and its records are cleared', 'process-status'],
    ["an unreachable container's ids stay container-unreachable after the first poll", 'process-status'],
    ['a failed apply opened nothing: the declared process survives and the host only revokes', 'apply-grant'],
  ].map(([name, op]) => [name, `injects a fault into ${op}; this host injects no faults`]),
);

/** Every string that is exactly `$NAME` replaced by what was saved as NAME. */
function subst(v, saved) {
  if (typeof v === 'string') return v.startsWith('$') && Object.hasOwn(saved, v.slice(1)) ? saved[v.slice(1)] : v;
  if (Array.isArray(v)) return v.map((x) => subst(x, saved));
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, subst(x, saved)]));
  return v;
}

/** Partial match: every key `want` names, arrays element-wise with equal length. */
function matches(want, got) {
  const obj = (x) => x !== null && typeof x === 'object' && !Array.isArray(x);
  if (Array.isArray(want)) return Array.isArray(got) && want.length === got.length && want.every((w, i) => matches(w, got[i]));
  if (obj(want)) return obj(got) && Object.entries(want).every(([k, w]) => Object.hasOwn(got, k) && matches(w, got[k]));
  return want === got;
}

/** A scenario's grant (`{rules: [{host, methods, path_prefix, headers, intercept}], ask}`)
 * as the WIT `grant`. */
function grantOf(g) {
  return {
    rules: g.rules.map((r) => ({
      host: r.host ?? '',
      methods: r.methods ?? [],
      pathPrefix: r.path_prefix,
      headers: Object.entries(r.headers ?? {}).map(([name, h]) => ({ name, secret: h.secret })),
      intercept: r.intercept !== false,
    })),
    ask: g.ask === true,
  };
}

/** The scenario's snake_case `input` as the WIT `exec-input`. */
function execInput(v = {}) {
  return {
    argv: v.argv ?? [],
    cwd: v.cwd,
    env: v.env ?? [],
    timeoutMs: v.timeout_ms === undefined ? undefined : BigInt(v.timeout_ms),
    grant: v.grant && grantOf(v.grant),
    approval: v.approval,
    stdin: v.stdin === undefined ? undefined : enc.encode(v.stdin),
  };
}

/** One `call` step: the facade call, its result in the scenario file's vocabulary. */
async function callStep(host, st) {
  const answer = (r, ok) =>
    'ok' in r ? { ok: ok(r.ok) } : 'err' in r ? { err: r.err.tag } : { trap: true, why: String(r.trap?.message ?? r.trap) };
  const none = () => null;
  const key = st.key ?? '';
  switch (st.call) {
    case 'exec':
      return answer(await host.call('exec', key, execInput(st.input)), (o) => ({
        exit_code: o.exitCode, stdout: dec.decode(o.stdout), stderr: dec.decode(o.stderr), timed_out: o.timedOut,
        truncated: o.truncated, killed: o.killed, denials: o.denials, admitted: o.admitted,
      }));
    case 'start-detached': {
      // The WIT's `detached-input` cannot carry a grant: the host's own API refuses one.
      const { grant, timeoutMs: _, ...input } = execInput(st.input);
      if (grant) return { err: 'invalid-input' };
      return answer(await host.call('startDetached', key, input), (id) => id);
    }
    case 'detached-status':
      return answer(await host.call('detachedStatus', key, st.id ?? ''), (s) =>
        s.tag === 'running' ? 'running' : { [s.tag]: s.val },
      );
    case 'stop-detached':
      return answer(await host.call('stopDetached', key, st.id ?? ''), none);
    case 'ensure':
    case 'abort':
    case 'checkpoint':
      return answer(await host.call(st.call, key), none);
    // A snapshot's time is the clock's: the scenarios compare names.
    case 'save-snapshot':
      return answer(await host.call('saveSnapshot', key, st.name ?? ''), (s) => s.name);
    case 'snapshots':
      return answer(await host.call('snapshots', key), (l) => l.map((s) => s.name));
    case 'fork':
      return answer(await host.call('fork', key, st.source ?? '', st.name ?? ''), none);
    case 'delete-snapshot':
      return answer(await host.call('deleteSnapshot', key, st.name ?? ''), none);
    case 'set-lifetime':
      return answer(await host.call('setLifetime', key, lifetimeOf(st.lifetime)), none);
    case 'set-metadata':
      return answer(await host.call('setMetadata', key, st.metadata ?? []), none);
    // The key's network: a grant, or null (none).
    case 'set-network':
      return answer(await host.call('setNetwork', key, st.network ? grantOf(st.network) : undefined), none);
    case 'describe':
      return answer(await host.call('describe', key), (i) => (i === undefined ? null : infoJson(i)));
    case 'sandboxes':
      return answer(await host.call('sandboxes', st.prefix ?? ''), (l) => l.map(infoJson));
    case 'forget':
      return answer(await host.call('forget', key), none);
    case 'expire':
      return { ok: await expire(host) };
    case 'denials':
      return answer(await host.call('denials', key), (ds) =>
        ds.map((d) => ({ host: d.host, method: d.method, path: d.path, reason: d.reason })),
      );
    case 'artifacts':
      return answer(await host.call('artifacts', key), (as) => as.map((a) => ({ name: a.name, size: Number(a.size) })));
    case 'read-artifact': {
      const [offset, length] = [BigInt(st.offset ?? 0), st.length ?? 1 << 20];
      return answer(await host.call('readArtifact', key, st.name ?? '', offset, length), (b) => dec.decode(b));
    }
    case 'on-stop':
      return answer(await host.call('onStop', st.container ?? ''), (n) => n);
    default:
      throw new Error(`unknown call ${st.call}`);
  }
}

/** A step's `lifetime` (`{ends_at_ms, on_end}`, or null) as the WIT's `option<lifetime>`. */
function lifetimeOf(v) {
  if (!v) return undefined;
  return { endsAtMs: BigInt(v.ends_at_ms ?? 0), onEnd: v.on_end === 'checkpoint' ? 'checkpoint' : 'abort' };
}

/** A `sandbox-info` as the scenarios write it. */
function infoJson(i) {
  const l = i.lifetime;
  return {
    key: i.key,
    running: i.running,
    lifetime: l === undefined ? null : { ends_at_ms: Number(l.endsAtMs), on_end: l.onEnd },
    metadata: i.metadata,
    // Its network as its rules' hosts and its ask.
    network: i.network === undefined ? null : { rules: i.network.rules.map((r) => r.host), ask: i.network.ask },
  };
}

/**
 * What a host does every second: ask which lifetimes ended (`expiring`, read-only), then
 * end each under its key's order (`endLifetime` checks again); the keys that ended.
 */
async function expire(host) {
  const due = await host.call('expiring');
  if (!('ok' in due)) return [];
  const ended = [];
  for (const key of due.ok) {
    const r = await host.call('endLifetime', key);
    if (r.ok === true) ended.push(key);
  }
  return ended;
}

/** A `mock` step: the world changes under the guest (no trace, no guest call). */
function mockStep(s, st) {
  const c = s.containers.get(st.container);
  const p = c?.processes.get(st.id);
  switch (st.mock) {
    case 'exit-process':
      if (p) Object.assign(p, { running: false, exitCode: st.code });
      return;
    case 'lose-process':
      c?.processes.delete(st.id);
      return;
    case 'stop-container': // stopped from outside; this runner delivers no on-stop
      if (c) s.keys.delete(c.key);
      s.containers.delete(st.container);
      return;
    case 'put-artifact':
      if (!s.artifacts.has(st.key)) s.artifacts.set(st.key, new Map());
      s.artifacts.get(st.key).set(st.name, enc.encode(st.bytes));
      return;
    default:
      throw new Error(`unknown mock op ${st.mock}`);
  }
}

async function runScenario(scenario, guest) {
  const substrate = new MemorySubstrate(scenario.ceiling ?? 16);
  const records = new Records();
  const policy = new Policy(scenario.floor ?? guest.floor);
  const host = new Host({ ...guest, substrate, records, policy });
  const saved = {};
  for (const [i, step] of scenario.steps.entries()) {
    const at = `step ${i}`;
    substrate.trace.length = 0; // every step starts with a fresh trace
    const st = subst(step, saved);
    for (const kind of ['fault', 'clear_faults', 'check']) {
      if (kind in st) throw new Error(`${at}: a \`${kind}\` step, which this host does not implement: skip the scenario by name`);
    }
    if ('mock' in st) {
      mockStep(substrate, st);
      continue;
    }
    if ('approve' in st) {
      saved[st.save] = policy.approve(st.approve.key, st.approve.argv, st.approve.expired === true);
      continue;
    }
    const got = await callStep(host, st);
    if (typeof st.save === 'string' && typeof got.ok === 'string') saved[st.save] = got.ok;
    const word = 'ok' in got ? 'ok' : 'err' in got ? `err:${got.err}` : 'trap';
    if (st.outcome !== undefined && st.outcome !== word) throw new Error(`${at}: outcome ${word}, expected ${st.outcome}`);
    if (st.expect !== undefined && !matches(st.expect, got)) {
      throw new Error(`${at}: expected ${JSON.stringify(st.expect)}, got ${JSON.stringify(got)}`);
    }
    if (st.trace !== undefined && JSON.stringify(st.trace) !== JSON.stringify(substrate.trace)) {
      throw new Error(`${at}: trace ${JSON.stringify(substrate.trace)}, expected ${JSON.stringify(st.trace)}`);
    }
    const declared = records.all().filter(([, name]) => name.startsWith('detached/')).length;
    if (st.records !== undefined && st.records !== declared) throw new Error(`${at}: ${declared} declarations, expected ${st.records}`);
  }
}

// ---- 6. Main: load the guest once, run every scenario -----------------------------------

async function main() {
  const [gen, file] = process.argv.slice(2);
  if (!gen || !file) throw new Error('usage: node host.mjs <jco output dir> <scenario file>');
  const { instantiate } = await import(pathToFileURL(join(resolve(gen), 'stockade.js')).href);
  // Compiled once, instantiated per call (the core modules jco split the component into).
  const cores = new Map();
  for (const f of readdirSync(gen).filter((f) => f.endsWith('.wasm'))) {
    cores.set(f, await WebAssembly.compile(readFileSync(join(gen, f))));
  }
  const wit = readFileSync(join(root, 'wit/sandbox.wit'), 'utf8');
  const version = wit.match(/^package stockade:sandbox@([^;]+);/m)[1];
  const verbose = process.env.STOCKADE_EXAMPLE_LOG === '1';
  const log = (level, event, fields) => verbose && console.error(`  [${level}] ${event} ${fields.map((f) => f.join('=')).join(' ')}`);
  const guest = { instantiate, cores, version, floor: defaultFloor(), log };

  const { scenarios } = JSON.parse(readFileSync(file, 'utf8'));
  const counts = { passed: 0, failed: 0, skipped: 0 };
  for (const scenario of scenarios) {
    if (SKIP.has(scenario.name)) {
      console.log(`skip ${scenario.name}: ${SKIP.get(scenario.name)}`);
      counts.skipped += 1;
      continue;
    }
    try {
      await runScenario(scenario, guest);
      console.log(`ok   ${scenario.name}`);
      counts.passed += 1;
    } catch (e) {
      console.log(`FAIL ${scenario.name}: ${e?.message ?? e}`);
      counts.failed += 1;
    }
  }
  // A skip that names no scenario is stale: the file changed under the list.
  for (const name of SKIP.keys()) {
    if (!scenarios.some((s) => s.name === name)) {
      console.log(`FAIL the skip list names a scenario the file does not have: ${name}`);
      counts.failed += 1;
    }
  }
  console.log(`${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped`);
  process.exitCode = counts.failed > 0 || counts.passed === 0 ? 1 : 0;
}

main().catch((e) => {
  console.error(`host.mjs: ${e?.stack ?? e}`);
  process.exitCode = 1;
});
