// The public API's routes and their methods (docs/openapi.json, host/src/api/mod.rs
// `ROUTES`), so the Worker answers a known route asked with another method as api.rs
// does: 405 `method-not-allowed` with an `Allow` header (RFC 9110), not 404. Pure.
// test/routes.test.mjs checks the table is exactly docs/openapi.json's (a route the
// Worker does not serve yet is listed too: another method is still a 405).

/** [template, methods]; a `{…}` is one segment, except the last of a REST route's. */
export const ROUTES = [
  ['/v1/health', ['GET']],
  ['/v1/secrets', ['GET']],
  ['/v1/secrets/{name}', ['PUT', 'DELETE']],
  ['/v1/sandboxes', ['GET']],
  ['/v1/sandboxes/{key}', ['GET', 'DELETE']],
  ['/v1/sandboxes/{key}/lifetime', ['PUT', 'DELETE']],
  ['/v1/sandboxes/{key}/metadata', ['PUT']],
  ['/v1/sandboxes/{key}/network', ['PUT', 'DELETE']],
  ['/v1/sandboxes/{key}/exec', ['POST']],
  ['/v1/sandboxes/{key}/exec/stream', ['POST']],
  ['/v1/sandboxes/{key}/detached', ['POST']],
  ['/v1/sandboxes/{key}/detached/{id}', ['GET', 'DELETE']],
  ['/v1/sandboxes/{key}/ensure', ['POST']],
  ['/v1/sandboxes/{key}/abort', ['POST']],
  ['/v1/sandboxes/{key}/checkpoint', ['POST']],
  ['/v1/sandboxes/{key}/snapshots', ['POST', 'GET']],
  ['/v1/sandboxes/{key}/snapshots/{name}', ['DELETE']],
  ['/v1/sandboxes/{key}/fork', ['POST']],
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
  // Scoped consumer tokens are `stockade serve`'s (docs/TENANTS.md): the Worker lists
  // the routes (another method is a 405) and answers them 404 until it serves them.
  ['/v1/tokens', ['POST', 'GET']],
  // A consumer learns its own scope; fixed before `{id}` (the first match wins).
  ['/v1/tokens/self', ['GET']],
  ['/v1/tokens/{id}', ['DELETE']],
];

/** The routes whose last parameter takes the rest of the path (api/mod.rs `{*name}`,
 * `{*path}`: an artifact's name, an uploaded file's path). */
const REST = new Set(['/v1/sandboxes/{key}/artifacts/{name}', '/v1/sandboxes/{key}/files/{path}']);

/** A route's last parameter that is a name the handler checks (a secret's, a snapshot's,
 * an artifact's, a file's path): a dot segment there is refused by that check. */
const NAMES = new Set(['{name}', '{path}']);

function matches(template, path) {
  const t = template.split('/');
  const p = path.split('/');
  for (let i = 0; i < t.length; i++) {
    if (i === t.length - 1 && REST.has(template)) return p.length >= t.length && p.slice(i).join('/') !== '';
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

/** The path of a request's URL as the client sent it. workerd hands the Worker the
 * request target unnormalized (`request.url`), but `new URL` resolves `.` and `..`
 * segments (WHATWG URL: `a/../../etc` becomes `etc`, also from `%2e%2e` and `\`), so
 * a path is checked for them here, before it is parsed. */
export function rawPath(url) {
  const m = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*([^?#]*)/i.exec(url);
  return m?.[1] || '/';
}

// A segment URL parsing would resolve: `.` or `..`, maybe percent-encoded.
const DOT = /^(\.|%2e){1,2}$/i;
const dotted = (seg) => seg.split('\\').some((s) => DOT.test(s));

/**
 * What `stockade serve` answers a path with a `.` or `..` segment, as [status, code,
 * message], or undefined when it has none. serve does not normalize a path: in a
 * route's trailing `{name}` or `{path}` (a secret's, a snapshot's or an artifact's name,
 * an uploaded file's path) such a segment is a name its checks refuse (400
 * `invalid-input`); anywhere else no route has the path's shape (404). Nothing is
 * resolved, so nothing outside the key is named either way. Pure.
 */
export function dotSegments(path) {
  const p = path.split('/');
  const at = p.findIndex(dotted);
  if (at < 0) return undefined;
  const inRest = ROUTES.some(([t]) => {
    const s = t.split('/');
    const rest = s.length - 1;
    if (!NAMES.has(s[rest]) || at < rest || p.length <= rest) return false;
    return s.slice(0, rest).every((x, i) => (x.startsWith('{') ? p[i] !== '' && !dotted(p[i]) : x === p[i]));
  });
  return inRest
    ? [400, 'invalid-input', `the path has a '.' or '..' segment (${JSON.stringify(p[at])}): a name is canonical, relative`]
    : [404, 'not-found', 'no such route'];
}
