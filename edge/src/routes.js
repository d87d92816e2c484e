// The public API's routes and their methods (docs/openapi.json, host/src/api.rs
// `ROUTES`), so the Worker answers a known route asked with another method as api.rs
// does: 405 `method-not-allowed` with an `Allow` header (RFC 9110), not 404. Pure.
// test/routes.test.mjs checks the table is exactly docs/openapi.json's (a route the
// Worker does not serve yet is listed too: another method is still a 405).

/** [template, methods]; `{name}` and `{path}` at the end take the rest of the path. */
export const ROUTES = [
  ['/v1/health', ['GET']],
  ['/v1/secrets', ['GET']],
  ['/v1/secrets/{name}', ['PUT', 'DELETE']],
  ['/v1/sandboxes/{key}/exec', ['POST']],
  ['/v1/sandboxes/{key}/exec/stream', ['POST']],
  ['/v1/sandboxes/{key}/detached', ['POST']],
  ['/v1/sandboxes/{key}/detached/{id}', ['GET', 'DELETE']],
  ['/v1/sandboxes/{key}/abort', ['POST']],
  ['/v1/sandboxes/{key}/checkpoint', ['POST']],
  ['/v1/sandboxes/{key}/denials', ['GET']],
  ['/v1/sandboxes/{key}/egress', ['GET']],
  ['/v1/sandboxes/{key}/artifacts', ['GET']],
  ['/v1/sandboxes/{key}/artifacts/{name}', ['GET']],
  ['/v1/sandboxes/{key}/approvals', ['POST']],
  ['/v1/sandboxes/{key}/files', ['PUT']],
  ['/v1/sandboxes/{key}/files/{path}', ['PUT']],
  ['/v1/sandboxes/{key}/previews', ['POST', 'GET']],
  ['/v1/sandboxes/{key}/previews/{port}', ['DELETE']],
  ['/v1/sandboxes/{key}/pty', ['GET']],
  ['/v1/sandboxes/{key}/egress/pending', ['GET']],
  ['/v1/egress/pending', ['GET']],
  ['/v1/egress/pending/{id}', ['POST']],
];

const REST = new Set(['{name}', '{path}']);

function matches(template, path) {
  const t = template.split('/');
  const p = path.split('/');
  for (let i = 0; i < t.length; i++) {
    if (i === t.length - 1 && REST.has(t[i])) return p.length >= t.length && p.slice(i).join('/') !== '';
    if (i >= p.length) return false;
    if (t[i].startsWith('{')) {
      if (p[i] === '') return false;
    } else if (t[i] !== p[i]) {
      return false;
    }
  }
  return p.length === t.length;
}

/** The methods `path`'s route takes, or undefined when no route has that shape. */
export function allowedMethods(path) {
  // The first template that matches: fixed segments are tried before a trailing rest.
  const hit = ROUTES.find(([t]) => matches(t, path));
  return hit?.[1];
}
