// The mock substrate in JavaScript: a line-for-line mirror of host/runtime/src/substrate/mock.rs
// (docs/CONFORMANCE.md states the semantics both implement). In memory, deterministic,
// records the ordered call trace, injects faults per op.
//
// A run's behaviour is scripted by its argv (argv[0] compared exactly):
//   echo A B    -> stdout "A B\n", exit 0
//   cat         -> stdout = the command's stdin, exit 0
//   exit N      -> exit code N (unparsable or missing: 1); for start-process an already exited process
//   background  -> exit 0, leaves a running tracked process behind
//   hang        -> timed out, exit -1
//   deny HOST   -> while a grant is open: one denial for HOST, exit 22 (no grant: exit 0, nothing)
//   rules       -> stdout the open grant's number of rules (`0\n` for one with none),
//                  `none\n` when no grant is open (which grant a command runs under)
//   otherwise   -> exit 0, no output
//
// Errors are thrown as `SubstrateError` objects ({tag, val}); an injected `trap` is
// thrown as a `MockTrap` (an Error), which the host turns into a real guest trap.

/** An injected trap: the host traps the guest call (proves the host-side revoke). */
export class MockTrap extends Error {
  constructor(op) {
    super(`injected trap: injected into ${op}`);
    this.name = 'MockTrap';
  }
}

/** The substrate error a fault name stands for (the scenario file's vocabulary). */
export function faultFor(name) {
  switch (name) {
    case 'trap': return { trap: true };
    case 'unreachable': return { error: { tag: 'unreachable', val: 'injected' } };
    case 'over-capacity': return { error: { tag: 'over-capacity' } };
    case 'invalid': return { error: { tag: 'invalid', val: 'injected' } };
    case 'failed': return { error: { tag: 'failed', val: 'injected' } };
    default: throw new Error(`unknown fault ${name}`);
  }
}

/** Order strings as SQLite/BTreeMap do: by UTF-8 bytes (= by code point). */
export function cmpBytes(a, b) {
  const x = Array.from(a);
  const y = Array.from(b);
  const n = Math.min(x.length, y.length);
  for (let i = 0; i < n; i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  return x.length - y.length;
}

/** Rust's `str::parse::<i32>()`, or `undefined`. */
function parseI32(s) {
  if (typeof s !== 'string' || !/^[+-]?[0-9]+$/.test(s)) return undefined;
  const n = Number(s);
  return n >= -2147483648 && n <= 2147483647 ? n : undefined;
}

function unreachable(c) {
  return { tag: 'unreachable', val: `no container ${c}` };
}

const enc = new TextEncoder();

export class Mock {
  /** A mock admitting at most `ceiling` live containers. */
  constructor(ceiling = 16) {
    this.ceiling = ceiling;
    this.trace = []; // [{op, target}]
    this.faults = []; // [{op, fault, skip, remaining}]
    this.allOps = []; // every injectable op in call order, untraced ones included
    this.containers = new Map(); // id -> {key, processes: Map<id, info>, grant, deniedWhileOpen}
    this.keys = new Map(); // key -> container id
    this.nextContainer = 0;
    this.nextProcess = 0;
    this.denialsByKey = new Map(); // key -> [denial]
    this.artifactsByKey = new Map(); // key -> Map<name, Uint8Array>
    this.snapshots = [];
    this.named = new Map(); // named snapshots: JSON [key, name] -> the container they were taken of
    this.forked = new Map(); // key -> [source, name]: the fork that set its restore cache
  }

  // ---- test control (no trace entries) ----

  /** The [source, name] a fork set `key`'s restore cache from, if one did. */
  forkedFrom(key) {
    return this.forked.get(key);
  }

  /** The ops of the trace. */
  ops() {
    return this.trace.map((c) => c.op);
  }

  clearTrace() {
    this.trace = [];
    this.allOps = [];
  }

  /**
   * Make `op` fail with `fault` (from `faultFor`), `times` times (undefined: until
   * cleared), after letting the first `skip` calls of `op` through.
   */
  inject(op, fault, times, skip = 0) {
    this.faults.push({ op, fault, skip, remaining: times });
  }

  /** Every tracked process with its container and the container's key. */
  tracked() {
    const out = [];
    for (const [id, c] of this.containers) {
      for (const p of c.processes.values()) out.push({ key: c.key, container: id, process: p });
    }
    return out;
  }

  clearFaults() {
    this.faults = [];
  }

  putArtifact(key, name, bytes) {
    if (!this.artifactsByKey.has(key)) this.artifactsByKey.set(key, new Map());
    this.artifactsByKey.get(key).set(name, bytes);
  }

  exitProcess(container, id, code) {
    const p = this.containers.get(container)?.processes.get(id);
    if (p) {
      p.running = false;
      p.exitCode = code;
    }
  }

  /** The container stops on its own: it is gone (nothing here delivers on-stop). */
  stopFromOutside(container) {
    const c = this.containers.get(container);
    if (c) {
      this.containers.delete(container);
      this.keys.delete(c.key);
    }
  }

  loseProcess(container, id) {
    this.containers.get(container)?.processes.delete(id);
  }

  /** Containers with an open grant (the host's shutdown revokes them). */
  openGrants() {
    return [...this.containers].filter(([, c]) => c.grant !== null).map(([id]) => id);
  }

  live() {
    return this.containers.size;
  }

  // ---- internals ----

  /** Log `op`, then return the first armed fault for it whose skips are used up. */
  armed(op) {
    this.allOps.push(op);
    const i = this.faults.findIndex((f) => f.op === op);
    if (i < 0) return undefined;
    const armed = this.faults[i];
    if (armed.skip > 0) {
      armed.skip -= 1;
      return undefined;
    }
    if (armed.remaining !== undefined && armed.remaining !== null) {
      armed.remaining -= 1;
      if (armed.remaining === 0) this.faults.splice(i, 1);
    }
    return armed.fault;
  }

  /** Fire an armed fault for an op the trace does not record (`records.list`, …). */
  fire(op) {
    const fault = this.armed(op);
    if (fault === undefined) return;
    if (fault.trap) throw new MockTrap(op);
    throw `injected into ${op}`;
  }

  /** Record the call, then fire an armed fault for it if there is one. */
  enter(op, target) {
    this.trace.push({ op, target: String(target) });
    const fault = this.armed(op);
    if (fault === undefined) return;
    if (fault.trap) throw new MockTrap(op);
    // Unreachable means gone (the linux substrate decides it from the container's own
    // state): the container the op is about dies now, as one killed from outside would.
    if (fault.error.tag === 'unreachable') this.gone(target);
    throw { ...fault.error };
  }

  /** Remove the container `target` names (its id, its key, or one of its processes). */
  gone(target) {
    let id;
    if (this.containers.has(target)) id = target;
    else if (this.keys.has(target)) id = this.keys.get(target);
    else {
      for (const [cid, c] of this.containers) {
        if (c.processes.has(target)) {
          id = cid;
          break;
        }
      }
    }
    if (id === undefined) return;
    const c = this.containers.get(id);
    this.containers.delete(id);
    this.keys.delete(c.key);
  }

  container(c) {
    const found = this.containers.get(c);
    if (!found) throw unreachable(c);
    return found;
  }

  newProcess(c, running, exitCode) {
    this.nextProcess += 1;
    const id = `00000000-0000-4000-8000-${this.nextProcess.toString(16).padStart(12, '0')}`;
    this.container(c).processes.set(id, { id, running, exitCode });
    return id;
  }

  static copy(p) {
    return { id: p.id, running: p.running, exitCode: p.exitCode };
  }

  // ---- the WIT `substrate` interface (camelCase, as jco binds it) ----

  ensure(key) {
    this.enter('ensure', key);
    const have = this.keys.get(key);
    if (have !== undefined) return have;
    if (this.containers.size >= this.ceiling) throw { tag: 'over-capacity' };
    this.nextContainer += 1;
    const id = `mock-c${this.nextContainer}`;
    this.containers.set(id, {
      key,
      processes: new Map(),
      grant: null,
      deniedWhileOpen: 0,
      admittedWhileOpen: 0,
      previews: new Map(),
    });
    this.keys.set(key, id);
    return id;
  }

  current(key) {
    this.enter('current', key);
    return this.keys.get(key);
  }

  applyGrant(container, fence, grant) {
    this.enter('apply-grant', container);
    const c = this.container(container);
    c.grant = { fence, rules: grant.rules.length };
    c.deniedWhileOpen = 0;
    c.admittedWhileOpen = 0;
  }

  revokeGrant(container) {
    this.enter('revoke-grant', container);
    const c = this.container(container);
    c.grant = null;
    const counts = { admitted: c.admittedWhileOpen, denied: c.deniedWhileOpen };
    c.deniedWhileOpen = 0;
    c.admittedWhileOpen = 0;
    return counts;
  }

  run(container, cmd, _timeoutMs) {
    this.enter('run', container);
    this.container(container);
    const args = cmd.argv.slice(1);
    const r = {
      exitCode: 0,
      stdout: new Uint8Array(0),
      stderr: new Uint8Array(0),
      timedOut: false,
      truncated: false,
      limits: [],
    };
    switch (cmd.argv[0]) {
      case 'echo':
        r.stdout = enc.encode(`${args.join(' ')}\n`);
        break;
      case 'cat':
        r.stdout = Uint8Array.from(cmd.stdin ?? []);
        break;
      case 'exit':
        r.exitCode = parseI32(args[0]) ?? 1;
        break;
      case 'background':
        this.newProcess(container, true, undefined);
        break;
      case 'hang':
        r.timedOut = true;
        r.exitCode = -1;
        break;
      case 'rules': {
        const c = this.container(container);
        r.stdout = enc.encode(c.grant === null ? 'none\n' : `${c.grant.rules}\n`);
        break;
      }
      case 'admit': {
        const c = this.container(container);
        if (c.grant !== null) c.admittedWhileOpen += 1;
        break;
      }
      case 'deny': {
        const host = args[0] ?? '';
        const c = this.container(container);
        if (c.grant === null) return r;
        c.deniedWhileOpen += 1;
        if (!this.denialsByKey.has(c.key)) this.denialsByKey.set(c.key, []);
        this.denialsByKey.get(c.key).push({
          atMs: 0n,
          host,
          method: 'GET',
          path: '/',
          fence: c.grant.fence,
          reason: 'no-rule',
        });
        r.exitCode = 22;
        break;
      }
      default:
        break;
    }
    return r;
  }

  startProcess(container, cmd) {
    this.enter('start-process', container);
    if (cmd.argv[0] === 'exit') {
      return this.newProcess(container, false, parseI32(cmd.argv[1]) ?? 1);
    }
    return this.newProcess(container, true, undefined);
  }

  listProcesses(container) {
    this.enter('list-processes', container);
    return [...this.container(container).processes.values()]
      .sort((a, b) => cmpBytes(a.id, b.id))
      .map(Mock.copy);
  }

  processStatus(container, id) {
    this.enter('process-status', id);
    const p = this.container(container).processes.get(id);
    return p ? Mock.copy(p) : undefined;
  }

  killProcess(container, id) {
    this.enter('kill-process', id);
    const c = this.container(container);
    const p = c.processes.get(id);
    c.processes.delete(id);
    return p && p.running ? 1 : 0;
  }

  killAll(container) {
    this.enter('kill-all', container);
    const c = this.container(container);
    const n = [...c.processes.values()].filter((p) => p.running).length;
    c.processes.clear();
    return n;
  }

  snapshot(container) {
    this.enter('snapshot', container);
    this.container(container);
    this.snapshots.push(container);
  }

  // Named snapshots (host/runtime/src/substrate/mock/mod.rs): kept by (key, name), they
  // outlive the container; `fork-snapshot` and `drop-snapshot` are traced on their key.
  saveSnapshot(container, name) {
    this.enter('save-snapshot', container);
    const { key } = this.container(container);
    this.named.set(JSON.stringify([key, name]), container);
  }

  forkSnapshot(source, name, key) {
    this.enter('fork-snapshot', key);
    if (!this.named.has(JSON.stringify([source, name]))) {
      throw { tag: 'invalid', val: `${source} holds no snapshot named ${JSON.stringify(name)}` };
    }
    this.forked.set(key, [source, name]);
  }

  dropSnapshot(key, name) {
    this.enter('drop-snapshot', key);
    return this.named.delete(JSON.stringify([key, name]));
  }

  stop(container) {
    this.enter('stop', container);
    const c = this.containers.get(container);
    if (!c) throw unreachable(container);
    this.containers.delete(container);
    this.keys.delete(c.key);
  }

  denials(key) {
    this.enter('denials', key);
    return (this.denialsByKey.get(key) ?? []).map((d) => ({ ...d }));
  }

  listArtifacts(key) {
    this.enter('list-artifacts', key);
    const m = this.artifactsByKey.get(key);
    if (!m) return [];
    return [...m.keys()]
      .sort(cmpBytes)
      .map((name) => ({ name, size: BigInt(m.get(name).length) }));
  }

  readArtifact(key, name, offset, length) {
    this.enter('read-artifact', key);
    const bytes = this.artifactsByKey.get(key)?.get(name);
    if (!bytes) throw { tag: 'invalid', val: `no artifact ${JSON.stringify(name)}` };
    const off = BigInt(offset);
    const start = off > BigInt(bytes.length) ? bytes.length : Number(off);
    const end = Math.min(start + Number(length), bytes.length);
    return bytes.slice(start, end);
  }

  // Preview doors (docs/PREVIEW.md): the contract's semantics as host/runtime/src/substrate/mock.rs
  // keeps them (it serves no route): a fresh random token per door, the open door
  // answered again for its port, the doors gone with the container.
  openPreview(container, port) {
    this.enter('open-preview', container);
    const c = this.container(container);
    const open = c.previews.get(port);
    if (open) return { ...open };
    const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
    let token = '';
    while (token.length < 24) {
      for (const b of crypto.getRandomValues(new Uint8Array(32))) {
        if (b < 252 && token.length < 24) token += alphabet[b % 36];
      }
    }
    const p = { port, token, url: `http://preview.mock.invalid/p/${token}/` };
    c.previews.set(port, p);
    return { ...p };
  }

  closePreview(container, port) {
    this.enter('close-preview', container);
    return this.container(container).previews.delete(port);
  }

  listPreviews(container) {
    this.enter('list-previews', container);
    return [...this.container(container).previews.values()].sort((a, b) => a.port - b.port).map((p) => ({ ...p }));
  }
}
