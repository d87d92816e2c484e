// The terminal's pure parts, in node (no workerd): the client's message table of
// `GET …/pty` (host/src/api/pty.rs `the_frame_table`'s rows) and the frames a front
// seals for the node's `run-pty` against the vector host/node-protocol/src/pty.rs checks
// (`a_sealed_frame_is_the_documented_vector`, computed from docs/NODE.md's formula).

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { ptyFrame, PTY_MAX_INPUT } from '../src/api.js';
import { Sealer } from '../src/nodes.js';

const SECRET = '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef';
const hex = (b) => Buffer.from(b).toString('hex');
const bin = (bytes) => new Uint8Array(bytes).buffer;

test('the client message table', () => {
  const start = (m) => ptyFrame(JSON.stringify(m), false);
  assert.deepEqual(start({ type: 'start', rows: 24, cols: 80 }), {
    start: { command: { argv: ['/bin/sh', '-i'] }, rows: 24, cols: 80 },
  });
  assert.deepEqual(start({ type: 'start', command: { argv: ['sleep', '1'] }, rows: 5, cols: 7 }).start.command.argv, [
    'sleep',
    '1',
  ]);
  const refused = [
    ['a start with stdin', JSON.stringify({ type: 'start', command: { argv: ['sh'], stdin: 'x' }, rows: 5, cols: 7 }), false, 1008],
    ['a second start', JSON.stringify({ type: 'start', rows: 24, cols: 80 }), true, 1008],
    ['a huge resize', JSON.stringify({ type: 'resize', rows: 100000, cols: 80 }), true, 1008],
    ['a zero resize', JSON.stringify({ type: 'resize', rows: 0, cols: 0 }), true, 1008],
    ['a negative resize', JSON.stringify({ type: 'resize', rows: -1, cols: 80 }), true, 1008],
    ['a resize before the start', JSON.stringify({ type: 'resize', rows: 40, cols: 120 }), false, 1008],
    ['an unknown field', JSON.stringify({ type: 'resize', rows: 4, cols: 4, x: 1 }), true, 1008],
    ['an unknown type', JSON.stringify({ type: 'signal', sig: 9 }), true, 1008],
    ['not JSON', '\u001b[A', true, 1008],
    ['binary before the start', bin([108, 115, 10]), false, 1008],
    ['an input message over the bound', bin(new Array(PTY_MAX_INPUT + 1).fill(97)), true, 1009],
  ];
  for (const [what, data, started, code] of refused) {
    assert.equal(ptyFrame(data, started).refuse?.[0], code, what);
  }
  assert.deepEqual(ptyFrame(JSON.stringify({ type: 'resize', rows: 40, cols: 120 }), true), {
    resize: { rows: 40, cols: 120 },
  });
  assert.deepEqual([...ptyFrame(bin([3, 4, 255, 0]), true).input], [3, 4, 255, 0]);
});

test('sealed frames are the documented vector', async () => {
  const s = new Sealer(SECRET, 'ab'.repeat(32));
  assert.equal(
    hex(await s.seal(0, new TextEncoder().encode('ls\n'))),
    '006c730aa9ba02a087f8dd648bd5f34366f0aa5ec664c2ff57eb60b7a357cbbd22ee9616',
  );
  assert.equal(hex(await s.resize(40, 120)), '0100280078afe14beda25b64e9ea4aefce72516972438eb5e59814d31d8aeef672f59e7b6b');
  assert.equal(hex(await s.alive()), '02d0dd9271b5da0c1f412eea0ab29e61a7019514f2d61ffd397a89c3175262696b');
});
