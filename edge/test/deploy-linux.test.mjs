// The deployment over two real linux nodes (containers; root and cgroup v2 required,
// a loud failure without): live output is relayed while the command runs, a
// checkpoint (and restore on the next call) keeps /workspace, and detached processes
// and placement work on real containers. Each node's cgroup root is
// /sys/fs/cgroup/<v2 mount>/stockade-edge-<id>-n<i>, removed afterwards with
// everything else the cluster made (test-support/cluster.mjs).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

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
