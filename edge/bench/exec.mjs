// Benchmark of the edge deployment's fence overhead and live output latency, over ONE
// real linux node (root and cgroup v2; test-support/cluster.mjs
// starts `stockade node` and workerd with the deploy config, and removes every process,
// cgroup and directory it made afterwards, by pid and by its own names).
//
//   (a) edge:   POST /v1/sandboxes/{key}/exec {"argv":["/bin/true"]} through the Worker
//               (Durable Object + guest over JSPI + signed fetches to the node),
//               node.js fetch (keep-alive);
//   (b) direct: the substrate calls a fenced exec makes, from node.js straight to the
//               node, signed (src/sign.js), over a keep-alive agent pinned to the node's
//               certificate: ensure, apply-grant (no rules), run /bin/true, kill-all,
//               revoke-grant;
//   (c) direct, batched: the same as the guest makes it with the node's batch
//               (docs/NODE.md "Batches"): ensure, [apply-grant, run], [kill-all,
//               revoke-grant]: 3 signed calls (the guest's when it spends an approval);
//   (d) direct, ensure in the batch: [ensure, apply-grant, run], [kill-all,
//               revoke-grant]: 2 signed calls (the guest's when it spends no approval
//               and the key has a declared process);
//   (e) direct, one batch: [ensure, apply-grant, run, kill-all, revoke-grant], every
//               call after the ensure on the ensured container (""): 1 signed call (the
//               guest's when it spends no approval and the key has no declared
//               process, as this bench's key: the teardown goes in the same batch);
//   interleaved a, b, c, d, e, a, b, c, d, e … after warming the key; median and p95 of
//   each, (a)/(b) against the goal 1.5× (and (a)/(d), (a)/(e): (e) is like for like).
//   live:       a streaming exec through the Worker of `sh -c 'date +%s%N; sleep 0.2'`:
//               arrival of the first stdout chunk minus the time the command printed.
//
// Run (after `cargo build -p stockade-host --bins` and `bash edge/build.sh`):
//   node edge/bench/exec.mjs            # BENCH_N iterations (default 200), BENCH_LIVE (default 20)

import { Agent, request as httpsRequest } from 'node:https';
import { readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { cpus, loadavg } from 'node:os';

import { Cluster, TOKEN } from '../test-support/cluster.mjs';
import { signedHeaders } from '../src/sign.js';

const N = Number(process.env.BENCH_N ?? 200);
const LIVE = Number(process.env.BENCH_LIVE ?? 20);
const KEY = 'bench';
const GOAL = 1.5;

const now = () => performance.timeOrigin + performance.now(); // ms since the epoch, sub-ms

function stats(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
  return { median: at(0.5), p95: at(0.95), n: s.length };
}
const ms = (x) => x.toFixed(2);

/** Signed POSTs straight to one node over a keep-alive, certificate-pinned agent. */
function directClient(node) {
  const agent = new Agent({ keepAlive: true, maxSockets: 1, ca: readFileSync(node.cert), servername: 'stockade-node' });
  async function post(call, body) {
    const path = `/node/v1/${call}`;
    const text = JSON.stringify(body);
    const headers = await signedHeaders(node.secret, { method: 'POST', path, key: KEY, idempotency: randomUUID(), body: text });
    return new Promise((resolve, reject) => {
      const req = httpsRequest(
        {
          host: '127.0.0.1',
          port: node.port,
          path,
          method: 'POST',
          agent,
          servername: 'stockade-node',
          headers: { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
        },
        (res) => {
          let out = '';
          res.setEncoding('utf8');
          res.on('data', (d) => (out += d));
          res.on('end', () => resolve({ status: res.statusCode, body: out }));
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(text);
    });
  }
  async function call(name, body) {
    const r = await post(name, body);
    let v;
    if (name === 'run') {
      // NDJSON: the last line is the result (or an error).
      const lines = r.body.trim().split('\n').map((l) => JSON.parse(l));
      v = lines.at(-1);
      if (!v || !('result' in v)) throw new Error(`run: ${r.body}`);
      if (v.result.exit_code !== 0) throw new Error(`run: exit ${v.result.exit_code}`);
      return v.result;
    }
    v = JSON.parse(r.body);
    if (r.status !== 200 || !v || 'error' in v) throw new Error(`${name}: HTTP ${r.status} ${r.body}`);
    return v.ok;
  }
  /** The five calls of one fenced exec, as the guest makes them. */
  async function fencedExec() {
    const container = await call('ensure', {});
    await call('apply-grant', { container, fence: randomUUID(), rules: [] });
    await call('run', {
      container,
      cmd: { argv: ['/bin/true'], cwd: '/workspace', env: [], stdin: '' },
      timeout_ms: 600_000,
    });
    await call('kill-all', { container });
    await call('revoke-grant', { container });
  }
  /** A batch (docs/NODE.md "Batches"): every call answered `ok`, the run's exit 0. */
  async function batch(calls) {
    const r = await post('batch', { calls });
    const answers = r.body
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .filter((l) => 'answer' in l)
      .map((l) => l.answer);
    if (r.status !== 200 || answers.length !== calls.length || answers.some((a) => !('ok' in a))) {
      throw new Error(`batch: HTTP ${r.status} ${r.body}`);
    }
    return answers;
  }
  /** The same exec as the guest makes it with the node's batch: 3 signed calls. */
  async function batchedExec() {
    const container = await call('ensure', {});
    const [, run] = await batch([
      { 'apply-grant': { container, fence: randomUUID(), rules: [] } },
      { run: { container, cmd: { argv: ['/bin/true'], cwd: '/workspace', env: [], stdin: '' }, timeout_ms: 600_000 } },
    ]);
    if (run.ok.exit_code !== 0) throw new Error(`batch run: exit ${run.ok.exit_code}`);
    await batch([{ 'kill-all': { container } }, { 'revoke-grant': { container } }]);
  }
  /** The exec as the guest makes it when it spends no approval and the key has a
   * declared process: 2 signed calls. */
  async function ensuredExec() {
    const [ensured, , run] = await batch([
      { ensure: {} },
      { 'apply-grant': { container: '', fence: randomUUID(), rules: [] } },
      { run: { container: '', cmd: { argv: ['/bin/true'], cwd: '/workspace', env: [], stdin: '' }, timeout_ms: 600_000 } },
    ]);
    if (run.ok.exit_code !== 0) throw new Error(`batch run: exit ${run.ok.exit_code}`);
    const container = ensured.ok;
    await batch([{ 'kill-all': { container } }, { 'revoke-grant': { container } }]);
  }
  /** The exec as the guest makes it when it spends no approval and the key has no
   * declared process: the whole fence in 1 signed call. */
  async function oneBatchExec() {
    const [, , run, , revoke] = await batch([
      { ensure: {} },
      { 'apply-grant': { container: '', fence: randomUUID(), rules: [] } },
      { run: { container: '', cmd: { argv: ['/bin/true'], cwd: '/workspace', env: [], stdin: '' }, timeout_ms: 600_000 } },
      { 'kill-all': { container: '' } },
      { 'revoke-grant': { container: '' } },
    ]);
    if (run.ok.exit_code !== 0) throw new Error(`batch run: exit ${run.ok.exit_code}`);
    if (typeof revoke.ok?.admitted !== 'number') throw new Error(`batch revoke: ${JSON.stringify(revoke)}`);
  }
  return { fencedExec, batchedExec, ensuredExec, oneBatchExec, close: () => agent.destroy() };
}

async function edgeExec(c) {
  const r = await fetch(`${c.base}/v1/sandboxes/${KEY}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ argv: ['/bin/true'] }),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`edge exec: HTTP ${r.status} ${text}`);
  const v = JSON.parse(text);
  if (v.exit_code !== 0) throw new Error(`edge exec: ${text}`);
}

/** One streaming exec: the first stdout chunk's arrival minus the time it printed (ms). */
async function liveLatency(c) {
  const r = await fetch(`${c.base}/v1/sandboxes/${KEY}/exec/stream`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ argv: ['sh', '-c', 'date +%s%N; sleep 0.2'] }),
  });
  if (r.status !== 200) throw new Error(`stream: HTTP ${r.status} ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let latency;
  let exit;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const arrived = now();
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const e = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      if (e.type === 'stdout' && latency === undefined) {
        const printedNs = BigInt(e.data.trim());
        latency = arrived - Number(printedNs / 1000n) / 1000;
      }
      if (e.type === 'exit') exit = e;
    }
  }
  if (latency === undefined || exit?.exit_code !== 0) throw new Error(`stream: no stdout or a bad exit (${JSON.stringify(exit)})`);
  return latency;
}

async function main() {
  const c = new Cluster({ kind: 'linux', nodes: 1 });
  let direct;
  const stop = async () => {
    direct?.close();
    await c.stop();
  };
  process.once('SIGINT', () => stop().finally(() => process.exit(130)));
  try {
    await c.start();
    direct = directClient(c.nodes[0]);
    // Warm: the key's container exists, the object and its guest are loaded, both
    // connections are open.
    for (let i = 0; i < 5; i++) {
      await edgeExec(c);
      await direct.fencedExec();
      await direct.batchedExec();
      await direct.ensuredExec();
      await direct.oneBatchExec();
    }
    const a = [];
    const b = [];
    const b3 = [];
    const b2 = [];
    const b1 = [];
    for (let i = 0; i < N; i++) {
      let t = now();
      await edgeExec(c);
      a.push(now() - t);
      t = now();
      await direct.fencedExec();
      b.push(now() - t);
      t = now();
      await direct.batchedExec();
      b3.push(now() - t);
      t = now();
      await direct.ensuredExec();
      b2.push(now() - t);
      t = now();
      await direct.oneBatchExec();
      b1.push(now() - t);
    }
    const live = [];
    await liveLatency(c); // warm
    for (let i = 0; i < LIVE; i++) live.push(await liveLatency(c));

    const sa = stats(a);
    const sb = stats(b);
    const sl = stats(live);
    const sb3 = stats(b3);
    const sb2 = stats(b2);
    const sb1 = stats(b1);
    const ratio = sa.median / sb.median;
    const ratio95 = sa.p95 / sb.p95;
    console.log(`\nedge exec benchmark: 1 linux node + workerd, N=${N} interleaved, live runs=${LIVE}, ${new Date().toISOString()}, ${cpus().length} cpus, load average ${loadavg().map((x) => x.toFixed(2)).join(' ')}\n`);
    console.log('| measure | median ms | p95 ms | n |');
    console.log('|---|---:|---:|---:|');
    console.log(`| (a) edge: POST …/exec /bin/true via Worker + DO + guest | ${ms(sa.median)} | ${ms(sa.p95)} | ${sa.n} |`);
    console.log(`| (b) direct: ensure, apply-grant, run, kill-all, revoke-grant (5 signed calls) | ${ms(sb.median)} | ${ms(sb.p95)} | ${sb.n} |`);
    console.log(`| (a)/(b) (goal ≤ ${GOAL}×) | ${ratio.toFixed(2)}× ${ratio <= GOAL ? 'met' : 'NOT met'} | ${ratio95.toFixed(2)}× | |`);
    console.log(`| (c) direct: ensure, [apply-grant, run], [kill-all, revoke-grant] (3 signed calls, batches) | ${ms(sb3.median)} | ${ms(sb3.p95)} | ${sb3.n} |`);
    console.log(`| (d) direct: [ensure, apply-grant, run], [kill-all, revoke-grant] (2 signed calls, batches) | ${ms(sb2.median)} | ${ms(sb2.p95)} | ${sb2.n} |`);
    console.log(`| (a)/(d) | ${(sa.median / sb2.median).toFixed(2)}× | ${(sa.p95 / sb2.p95).toFixed(2)}× | |`);
    console.log(`| (e) direct: [ensure, apply-grant, run, kill-all, revoke-grant] (1 signed call, a batch) | ${ms(sb1.median)} | ${ms(sb1.p95)} | ${sb1.n} |`);
    console.log(`| (a)/(e) | ${(sa.median / sb1.median).toFixed(2)}× | ${(sa.p95 / sb1.p95).toFixed(2)}× | |`);
    console.log(`| live output latency via Worker (first stdout chunk − printed time) | ${ms(sl.median)} | ${ms(sl.p95)} | ${sl.n} |`);
  } finally {
    await stop();
  }
}

await main();
