// The Worker's route table (src/routes.js) against docs/openapi.json: the same routes
// with the same methods, and the matcher's decisions on hostile paths. Pure.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ROUTES, allowedMethods } from '../src/routes.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

test('the route table is exactly docs/openapi.json\'s paths and methods', () => {
  const doc = JSON.parse(readFileSync(join(root, 'docs', 'openapi.json'), 'utf8'));
  const want = Object.entries(doc.paths)
    .map(([p, ops]) => [p, Object.keys(ops).filter((m) => ['get', 'post', 'put', 'delete', 'patch'].includes(m)).map((m) => m.toUpperCase()).sort()])
    .sort(([a], [b]) => a.localeCompare(b));
  const got = ROUTES.map(([p, ms]) => [p, [...ms].sort()]).sort(([a], [b]) => a.localeCompare(b));
  assert.deepEqual(got, want);
});

test('a path gets its route\'s methods, or none when no route has its shape', () => {
  for (const [path, want] of [
    ['/v1/health', ['GET']],
    ['/v1/sandboxes/k/exec', ['POST']],
    ['/v1/sandboxes/k/exec/stream', ['POST']],
    ['/v1/sandboxes/k/egress', ['GET']],
    ['/v1/sandboxes/k/egress/pending', ['GET']],
    ['/v1/sandboxes/k/artifacts/a/b', ['GET']],
    ['/v1/sandboxes/k/files/x/y/z', ['PUT']],
    ['/v1/sandboxes/k/detached/one', ['GET', 'DELETE']],
    ['/v1/sandboxes/k/detached/one/two', undefined],
    ['/v1/sandboxes/k/artifacts/', undefined],
    ['/v1/sandboxes//exec', undefined],
    ['/v1/sandboxes/k/exec/', undefined],
    ['/v1/nope', undefined],
    ['/v1/health/', undefined],
    ['', undefined],
  ]) {
    assert.deepEqual(allowedMethods(path), want, path);
  }
});
