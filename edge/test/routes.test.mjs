// The Worker's route table (src/routes.js) against docs/openapi.json: the same routes
// with the same methods, and the matcher's decisions on hostile paths. Pure.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ROUTES, allowedMethods, dotSegments, rawPath } from '../src/routes.js';

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
    ['/v1/sandboxes/k/snapshots', ['POST', 'GET']],
    ['/v1/sandboxes/k/snapshots/v1', ['DELETE']],
    // A snapshot's or a secret's name is one segment (api/mod.rs `{name}`, not `{*name}`).
    ['/v1/sandboxes/k/snapshots/v1/x', undefined],
    ['/v1/secrets/a/b', undefined],
    ['/v1/sandboxes/k/fork', ['POST']],
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

test('a path with a dot segment gets what stockade serve answers, from the raw request target', () => {
  assert.equal(rawPath('http://h:1/v1/sandboxes/k/artifacts/a/../../etc/passwd?x=1'), '/v1/sandboxes/k/artifacts/a/../../etc/passwd');
  assert.equal(rawPath('https://h'), '/');
  for (const [path, want] of [
    ['/v1/sandboxes/k/artifacts/a/../../etc/passwd', 400],
    ['/v1/sandboxes/k/artifacts/..', 400],
    ['/v1/sandboxes/k/artifacts/a/%2e%2E/x', 400],
    ['/v1/sandboxes/k/artifacts/a/.%2e/x', 400],
    ['/v1/sandboxes/k/artifacts/a\\..\\..\\etc', 400],
    ['/v1/sandboxes/k/artifacts/./a', 400],
    ['/v1/sandboxes/k/files/a/../b', 400],
    ['/v1/sandboxes/k/snapshots/..', 400],
    ['/v1/sandboxes/k/../other/exec', 404],
    ['/v1/sandboxes/../exec', 404],
    ['/v1/sandboxes/%2e%2e/artifacts/x', 404],
    ['/v1/../v1/health', 404],
    ['/v1/sandboxes/k/exec/..', 404],
  ]) {
    assert.equal(dotSegments(path)?.[0], want, path);
  }
  for (const path of ['/v1/sandboxes/k/artifacts/a..b', '/v1/sandboxes/k/artifacts/.hidden', '/v1/sandboxes/k/files/x/...', '/v1/health']) {
    assert.equal(dotSegments(path), undefined, path);
  }
});
