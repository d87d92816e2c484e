// The deployment over two real linux nodes (containers; root and cgroup v2 required,
// a loud failure without): live output is relayed while the command runs, a
// checkpoint (and restore on the next call) keeps /workspace, and detached processes
// and placement work on real containers. Each node's cgroup root is
// /sys/fs/cgroup/<v2 mount>/stockade-edge-<id>-n<i>, removed afterwards with
// everything else the cluster made (test-support/cluster.mjs).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';

import { Cluster, TOKEN, until } from '../test-support/cluster.mjs';

let c;

before(async () => {
  c = await new Cluster({ kind: 'linux', nodes: 2 }).start();
});

after(async () => {
  await c?.stop();
});

test('a streaming exec delivers output while the command still runs', async () => {
  const r = await fetch(`${c.base}/v1/sandboxes/live/exec/stream`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}` },
    // The command's own pause (not the test's) separates the lines: the first must
    // reach the client at least a second before the exit event does.
    body: JSON.stringify({ argv: ['sh', '-c', 'echo first; sleep 2; echo second'] }),
  });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const events = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      events.push([Date.now(), JSON.parse(buf.slice(0, nl))]);
      buf = buf.slice(nl + 1);
    }
  }
  const first = events.find(([, e]) => e.type === 'stdout' && e.data.includes('first'));
  const exit = events.find(([, e]) => e.type === 'exit');
  assert.ok(first && exit, JSON.stringify(events));
  assert.equal(exit[1].exit_code, 0);
  assert.ok(exit[0] - first[0] >= 1000, `the first line came ${exit[0] - first[0]} ms before the end`);
  assert.equal(
    events
      .filter(([, e]) => e.type === 'stdout')
      .map(([, e]) => e.data)
      .join(''),
    'first\nsecond\n',
  );
});

test('/workspace survives a checkpoint: the next call restores it', async () => {
  const w = await c.api('POST', '/v1/sandboxes/ckpt/exec', { argv: ['sh', '-c', 'echo kept > /workspace/f'] });
  assert.equal(w.status, 200, w.text);
  const k = await c.api('POST', '/v1/sandboxes/ckpt/checkpoint');
  assert.deepEqual(k.json, { checkpointed: 'ckpt' }, k.text);
  const placed = (await c.api('GET', '/v1/sandboxes/ckpt/records')).json.node;
  const node = c.nodes.find((n) => n.name === placed);
  assert.equal(JSON.parse((await c.nodeCall(node, 'ckpt', 'current', {})).body).ok, null, 'stopped');
  const r = await c.api('POST', '/v1/sandboxes/ckpt/exec', { argv: ['cat', '/workspace/f'] });
  assert.equal(r.json.stdout, 'kept\n', r.text);
});

test('a detached process on a real container: start, status, stop', async () => {
  const s = await c.api('POST', '/v1/sandboxes/det/detached', { argv: ['sleep', '300'] });
  assert.equal(s.status, 201, s.text);
  assert.deepEqual((await c.api('GET', `/v1/sandboxes/det/detached/${s.json.id}`)).json, { state: 'running' });
  assert.deepEqual((await c.api('DELETE', `/v1/sandboxes/det/detached/${s.json.id}`)).json, { stopped: s.json.id });
  assert.equal((await c.api('GET', `/v1/sandboxes/det/detached/${s.json.id}`)).json.state, 'gone');
});

test('a streaming client that hangs up ends its command (at its next output): the fence is torn down and revoked', async () => {
  const key = 'hangup';
  const ctl = new AbortController();
  const r = await fetch(`${c.base}/v1/sandboxes/${key}/exec/stream`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}` },
    // It keeps writing: workerd tells the object of the hang-up when a write fails.
    body: JSON.stringify({ argv: ['sh', '-c', 'echo go; while :; do echo tick; sleep 0.2; done'], timeout_ms: 120000 }),
    signal: ctl.signal,
  });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const { value } = await reader.read();
  assert.match(new TextDecoder().decode(value), /go/);
  const placed = (await c.api('GET', `/v1/sandboxes/${key}/records`)).json.node;
  const node = c.nodes.find((n) => n.name === placed);
  const container = JSON.parse((await c.nodeCall(node, key, 'current', {})).body).ok;
  const open = async () => JSON.parse((await c.nodeCall(node, '', 'open-grants', {})).body).ok;
  assert.ok((await open()).includes(container), 'the fence is open while the command runs');
  ctl.abort();
  await until('the fence revoked after the hang-up', async () => !(await open()).includes(container), () => c.workerd.log, 30_000);
});

test('an idle key is checkpointed by its object\'s alarm; a key with a running detached process is not', async () => {
  const idle = await new Cluster({ kind: 'linux', nodes: 1, idleMs: 1000 }).start();
  try {
    const [n] = idle.nodes;
    const current = async (key) => JSON.parse((await idle.nodeCall(n, key, 'current', {})).body).ok;
    assert.equal((await idle.api('POST', '/v1/sandboxes/quiet/exec', { argv: ['true'] })).status, 200);
    const s = await idle.api('POST', '/v1/sandboxes/busy/detached', { argv: ['sleep', '300'] });
    assert.equal(s.status, 201, s.text);
    assert.ok(await current('quiet'));
    // The alarm fires IDLE_MS after the last call: the quiet key's container is
    // checkpointed (stopped); the busy one's alarm finds its process and waits.
    await until('the idle checkpoint', async () => (await current('quiet')) === null, () => idle.workerd.log, 30_000);
    await until('the busy key\'s alarm', () => /"event":"idle alarm: the container is busy on its node","key":"busy"/.test(idle.workerd.log), () => idle.workerd.log, 30_000);
    assert.ok(await current('busy'), 'a container with a running process is not checkpointed');
    assert.deepEqual((await idle.api('GET', `/v1/sandboxes/busy/detached/${s.json.id}`)).json, { state: 'running' });
    // The quiet key's next call restores it.
    assert.equal((await idle.api('POST', '/v1/sandboxes/quiet/exec', { argv: ['true'] })).status, 200);
    await idle.api('DELETE', `/v1/sandboxes/busy/detached/${s.json.id}`);
  } finally {
    await idle.stop();
  }
});

test('GET egress answers a real denial from the key\'s node (its proxy decided)', async () => {
  const key = 'egress-real';
  const r = await c.api('POST', `/v1/sandboxes/${key}/exec`, {
    argv: ['sh', '-c', 'curl -s -o /dev/null --max-time 5 http://blocked.example/refused; true'],
    grant: { rules: [{ host: 'allowed.example' }] },
  });
  assert.equal(r.status, 200, r.text);
  const a = await c.api('GET', `/v1/sandboxes/${key}/egress`);
  assert.equal(a.status, 200, a.text);
  const d = a.json.egress.find((e) => e.decision === 'deny' && e.host === 'blocked.example');
  assert.ok(d, a.text);
  assert.equal(d.method, 'GET', a.text);
  assert.equal(d.path, '/refused', a.text);
  assert.ok(d.at_ms > 0 && d.rule_set, a.text);
  assert.deepEqual(Object.keys(d), ['decision', 'at_ms', 'host', 'method', 'path', 'rule_set', 'reason']);
  assert.ok(!a.json.egress.some((e) => e.decision === 'allow'), a.text);
});

/** A tar archive of `entries` [name, kind ('file' | 'symlink' | 'dir'), contents or
 * link target], written by Python's tarfile with the names as given (a hostile
 * archive's `../` and escaping links included). */
function tarOf(entries) {
  const script = `
import io, json, sys, tarfile
out = io.BytesIO()
with tarfile.open(fileobj=out, mode='w', format=tarfile.GNU_FORMAT) as t:
    for name, kind, data in json.loads(sys.argv[1]):
        i = tarfile.TarInfo(name)
        i.mode = 0o644
        if kind == 'symlink':
            i.type = tarfile.SYMTYPE; i.linkname = data; t.addfile(i)
        elif kind == 'dir':
            i.type = tarfile.DIRTYPE; i.mode = 0o755; t.addfile(i)
        else:
            b = data.encode(); i.size = len(b); t.addfile(i, io.BytesIO(b))
sys.stdout.buffer.write(out.getvalue())
`;
  return execFileSync('python3', ['-c', script, JSON.stringify(entries)], { maxBuffer: 1 << 26 });
}

const put = async (path, body, headers = {}) => {
  const r = await fetch(`${c.base}${path}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${TOKEN}`, ...headers },
    body,
    ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
  });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text };
};

const sh = async (key, script) => {
  const r = await c.api('POST', `/v1/sandboxes/${key}/exec`, { argv: ['sh', '-c', script] });
  assert.equal(r.status, 200, r.text);
  return r.json.stdout;
};

test('PUT files: an archive and one file go into /workspace, checked on the node', async () => {
  const key = 'put-ok';
  const a = await put(
    `/v1/sandboxes/${key}/files?dest=up`,
    tarOf([
      ['d', 'dir', ''],
      ['d/a.txt', 'file', 'alpha\n'],
      ['link', 'symlink', 'd/a.txt'],
    ]),
  );
  assert.equal(a.status, 201, a.text);
  assert.deepEqual(a.json, { dest: '/workspace/up', entries: 3 });
  const f = await put(`/v1/sandboxes/${key}/files/notes/b.bin`, new Uint8Array([0, 1, 2, 255]));
  assert.equal(f.status, 201, f.text);
  assert.deepEqual(f.json, { dest: '/workspace/', entries: 1 });
  assert.equal(
    await sh(key, 'cat up/d/a.txt up/link; od -An -tu1 notes/b.bin | tr -s " "; ls -A /workspace'),
    'alpha\nalpha\n 0 1 2 255\nnotes\nup\n',
  );
});

test('PUT files: a refused archive (a ../ path, a symlink out of the tree) or path changes nothing', async () => {
  const key = 'put-refused';
  assert.equal(await sh(key, 'echo before > keep.txt; ls -A /workspace'), 'keep.txt\n');
  const rows = [
    ['a ../ path', `/v1/sandboxes/${key}/files`, tarOf([['ok.txt', 'file', 'fine'], ['../evil', 'file', 'EVIL']]), 400, /evil has \.\./],
    ['a symlink out of the tree', `/v1/sandboxes/${key}/files`, tarOf([['esc', 'symlink', '../../etc'], ['esc/x', 'file', 'EVIL']]), 400, /esc/],
    ['an absolute name', `/v1/sandboxes/${key}/files`, tarOf([['/abs', 'file', 'EVIL']]), 400, /absolute/],
    ['not a tar archive', `/v1/sandboxes/${key}/files`, new TextEncoder().encode('not a tar archive, plainly'), 400, /./],
    ['a destination with ..', `/v1/sandboxes/${key}/files?dest=../x`, tarOf([['ok.txt', 'file', 'fine']]), 400, /\.\./],
    ['a file path with ..', `/v1/sandboxes/${key}/files/a%2F..%2Fb`, new Uint8Array([1]), 400, /segment/],
  ];
  for (const [why, path, body, status, says] of rows) {
    const r = await put(path, body);
    assert.equal(r.status, status, `${why}: ${r.text}`);
    assert.equal(r.json?.error?.code, 'invalid-input', `${why}: ${r.text}`);
    assert.match(r.json.error.message, says, why);
  }
  assert.equal(await sh(key, 'ls -A /workspace; cat keep.txt; ls / | grep -c evil; true'), 'keep.txt\nbefore\n0\n');
});

test('PUT files: a file upload needs its length; a large one streams through the edge to the node', async () => {
  const key = 'put-big';
  const chunked = new ReadableStream({
    start(ctl) {
      ctl.enqueue(new Uint8Array([1, 2, 3]));
      ctl.close();
    },
  });
  const r = await put(`/v1/sandboxes/${key}/files/x.bin`, chunked);
  assert.equal(r.status, 411, r.text);
  const len = 64 << 20;
  const body = new Uint8Array(len).fill(120);
  const started = Date.now();
  const big = await put(`/v1/sandboxes/${key}/files/big.bin`, body);
  const took = Date.now() - started;
  assert.equal(big.status, 201, big.text);
  console.log(`a ${len >> 20} MiB file through the edge in ${took} ms: ${Math.round(len / took / 1000)} MB/s`);
  assert.equal(await sh(key, 'wc -c < big.bin; head -c 3 big.bin'), `${len}\nxxx`);
});
