// A deployment for tests: N real nodes (`stockade node`, substrate "mock" or "linux")
// and workerd serving the generated deploy config over them, driven through the
// Worker's public API. Everything it starts is stopped by pid, and everything it makes
// (its temp directory; for linux nodes their cgroup roots `stockade-edge-<id>` under
// every /sys/fs/cgroup mount, and any mount left under its directory) is removed by
// `stop()`, which then checks that none of it is left. Readiness is waited for with a
// deadline (a log line, a health answer), never a fixed sleep.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, rmdirSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync } from 'node:child_process';

import { deployConfig } from '../scripts/deploy-config.mjs';
import { signedHeaders } from '../src/sign.js';

export const edge = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(edge, '..');
export const EXE = process.env.STOCKADE_EXE ?? join(root, 'target', 'debug', 'stockade');
const DEADLINE_MS = 60_000;
export const TOKEN = 'edge-test-token';
export const APPROVER = 'edge-test-approver';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Poll `probe` until it returns a truthy value; fail after `deadlineMs`. */
export async function until(what, probe, log = () => '', deadlineMs = DEADLINE_MS) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) assert.fail(`${what}: not after ${deadlineMs} ms\n${log()}`);
    await sleep(50);
  }
}

/** Root and a cgroup v2 mount, or a loud failure (as stockade_tests::require_root_and_cgroup_v2). */
export function requireRootAndCgroupV2() {
  assert.equal(process.getuid?.(), 0, 'this test needs root (linux nodes make containers)');
  const mounts = readFileSync('/proc/mounts', 'utf8');
  const v2 = mounts.split('\n').find((l) => l.split(' ')[2] === 'cgroup2');
  assert.ok(v2, 'this test needs a cgroup v2 mount');
  return v2.split(' ')[1];
}

export class Cluster {
  constructor({ kind = 'mock', nodes = 2, idleMs, heartbeatMs = 200, ceiling, wrongSecrets = false } = {}) {
    this.ceiling = ceiling;
    this.wrongSecrets = wrongSecrets;
    this.kind = kind;
    this.count = nodes;
    this.idleMs = idleMs;
    this.heartbeatMs = heartbeatMs;
    this.dir = mkdtempSync(join(tmpdir(), 'stockade-edge-'));
    this.id = this.dir.slice(-6).toLowerCase().replace(/[^a-z0-9]/g, 'x');
    this.children = new Set();
    this.nodes = [];
    this.cgroupName = `stockade-edge-${this.id}`;
  }

  spawn(cmd, args, opts = {}) {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
    child.log = '';
    child.stdout.on('data', (d) => (child.log += d));
    child.stderr.on('data', (d) => (child.log += d));
    child.exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
    this.children.add(child);
    child.exited.then(() => this.children.delete(child));
    return child;
  }

  static async kill(child) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await child.exited;
      clearTimeout(t);
    }
  }

  async start() {
    assert.ok(existsSync(EXE), `${EXE} is missing: build it with \`cargo build -p stockade-host --bins\` (or set STOCKADE_EXE)`);
    assert.ok(existsSync(join(edge, 'gen-jspi', 'stockade.js')), 'edge/gen-jspi is missing: run `npm run build` in edge/');
    if (this.kind === 'linux') this.cgroupMount = requireRootAndCgroupV2();
    for (let i = 1; i <= this.count; i++) this.nodes.push(await this.startNode(i));
    await this.startWorkerd();
    return this;
  }

  async startNode(i) {
    const port = await freePort();
    const data = join(this.dir, `node-${i}`);
    const config = join(this.dir, `node-${i}.toml`);
    const substrate =
      this.kind === 'linux'
        ? `kind = "linux"\nwarm = 0\ncgroup_root = "${join(this.cgroupMount, `${this.cgroupName}-n${i}`)}"\n`
        : `kind = "mock"\nrequire = []\n`;
    const ceiling = this.ceiling === undefined ? '' : `ceiling = ${this.ceiling}\n`;
    writeFileSync(
      config,
      `[substrate]\n${substrate}${ceiling}data_dir = "${data}"\n\n[node]\nlisten = "127.0.0.1:${port}"\nname = "node-${i}"\nheartbeat_ms = ${this.heartbeatMs}\n`,
    );
    const child = this.spawn(EXE, ['node', '--config', config]);
    await until(
      `node-${i} serving`,
      () => {
        if (child.exitCode !== null) assert.fail(`node-${i} exited:\n${child.log}`);
        return child.log.includes('serving on');
      },
      () => child.log,
    );
    return {
      name: `node-${i}`,
      port,
      child,
      cert: join(data, 'node', 'cert.pem'),
      secretFile: join(data, 'node', 'secret'),
      secret: readFileSync(join(data, 'node', 'secret'), 'utf8').trim(),
    };
  }

  async startWorkerd() {
    const port = await freePort();
    this.base = `http://127.0.0.1:${port}`;
    const desc = {
      listen: `127.0.0.1:${port}`,
      storage: join(this.dir, 'do-storage'),
      // Token files ending in a newline, as an operator's editor leaves them: the Worker
      // trims them as `stockade serve` does.
      api_token_file: 'api-token',
      approver_token_file: 'approver-token',
      heartbeat_ms: this.heartbeatMs,
      idle_ms: this.idleMs,
      nodes: this.nodes.map((n) => ({
        name: n.name,
        address: `127.0.0.1:${n.port}`,
        cert_file: n.cert,
        ...(this.wrongSecrets ? { secret: 'f'.repeat(64) } : { secret_file: n.secretFile }),
      })),
    };
    writeFileSync(join(this.dir, 'api-token'), `${TOKEN}\n`, { mode: 0o600 });
    writeFileSync(join(this.dir, 'approver-token'), `${APPROVER}\n`, { mode: 0o600 });
    mkdirSync(desc.storage, { recursive: true });
    const config = join(this.dir, 'deploy.capnp');
    writeFileSync(config, deployConfig(desc, { descDir: this.dir, outDir: this.dir }));
    const w = this.spawn(join(edge, 'node_modules', '.bin', 'workerd'), ['serve', config], { cwd: this.dir });
    this.workerd = w;
    await until(
      'workerd ready',
      async () => {
        if (w.exitCode !== null) assert.fail(`workerd exited:\n${w.log}`);
        try {
          return (await fetch(`${this.base}/v1/health`, { signal: AbortSignal.timeout(2000) })).ok;
        } catch {
          return false;
        }
      },
      () => w.log,
    );
  }

  async restartWorkerd() {
    await Cluster.kill(this.workerd);
    await this.startWorkerd();
  }

  /** A call of the public API with the consumer's token (or `token`). */
  async api(method, path, body, token = TOKEN) {
    const r = await fetch(`${this.base}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: r.status, json, text, type: r.headers.get('content-type') };
  }

  /** A signed call straight to a node (pinned to its certificate), as the Worker makes. */
  async nodeCall(node, key, call, body, { secret = node.secret, headers: extra = {} } = {}) {
    const path = `/node/v1/${call}`;
    const text = JSON.stringify(body);
    const headers = { ...(await signedHeaders(secret, { method: 'POST', path, key, body: text })), ...extra };
    return new Promise((resolve, reject) => {
      const req = httpsRequest(
        {
          host: '127.0.0.1',
          port: node.port,
          path,
          method: 'POST',
          ca: readFileSync(node.cert),
          servername: 'stockade-node',
          headers: { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
        },
        (res) => {
          let out = '';
          res.on('data', (d) => (out += d));
          res.on('end', () => resolve({ status: res.statusCode, body: out, headers }));
        },
      );
      req.on('error', reject);
      req.end(text);
    });
  }

  /** Stop everything started, remove everything made, and check none of it is left. */
  async stop() {
    for (const c of [...this.children]) await Cluster.kill(c);
    const mounts = () =>
      readFileSync('/proc/mounts', 'utf8')
        .split('\n')
        .map((l) => l.split(' ')[1])
        .filter((m) => m && m.startsWith(`${this.dir}/`))
        .sort((a, b) => b.length - a.length);
    for (const m of mounts()) {
      try {
        execFileSync('umount', ['-l', m]);
      } catch {
        // reported below
      }
    }
    assert.deepEqual(mounts(), [], 'mounts left under the test directory');
    rmSync(this.dir, { recursive: true, force: true });
    if (this.kind === 'linux') {
      const left = [];
      for (const ctl of readdirSync('/sys/fs/cgroup')) {
        const base = join('/sys/fs/cgroup', ctl);
        let entries = [];
        try {
          entries = readdirSync(base);
        } catch {
          continue;
        }
        for (const e of entries.filter((x) => x.startsWith(this.cgroupName))) {
          removeCgroup(join(base, e));
          if (existsSync(join(base, e))) left.push(join(base, e));
        }
      }
      assert.deepEqual(left, [], 'cgroups left');
    }
  }
}

/** rmdir a cgroup and its children, deepest first (only empty cgroups can go). */
function removeCgroup(path) {
  let entries = [];
  try {
    entries = readdirSync(path, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) if (e.isDirectory()) removeCgroup(join(path, e.name));
  try {
    rmdirSync(path);
  } catch {
    // still populated: reported by the caller
  }
}
