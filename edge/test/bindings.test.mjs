// The Worker's check of a grant's credential rules against their secrets' bindings
// (src/api.js `grantBindingError`), before any guest call, answered as api.rs
// `check_secrets` answers it: the same words, naming the rule's index. A grant in
// another shape is left to the guest (undefined here).

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { execInput, grantBindingError } from '../src/api.js';

const bindings = new Map([['s', { host: '127.0.0.2', port: 8443, methods: ['GET'], pathPrefix: '/api/' }]]);
const cred = { Authorization: { secret: 's' } };
const grant = (...rules) => execInput(JSON.stringify({ argv: ['true'], grant: { rules } })).grant;

test('a credential rule outside its binding is refused naming the rule, as api.rs words it', () => {
  const rows = [
    ['any method to another host', [{ host: '127.0.0.3:9443', headers: cred }],
      'rule 0: a rule with headers must list its methods (a credential is never added to every method)'],
    ['TRACE', [{ host: '127.0.0.2:8443', methods: ['GET', 'TRACE'], headers: cred }],
      'rule 0: a rule with headers may not admit "TRACE" (credentials go only on GET HEAD POST PUT PATCH DELETE OPTIONS)'],
    ['another host', [{ host: '127.0.0.3:9443', methods: ['GET'], path_prefix: '/api/', headers: cred }],
      'rule 0: secret "s": the rule\'s host "127.0.0.3" is not the secret\'s host "127.0.0.2"'],
    ['the bound host without its port', [{ host: '127.0.0.2', methods: ['GET'], path_prefix: '/api/', headers: cred }],
      'rule 0: secret "s": the rule\'s port 443 is not the secret\'s port 8443 (no port on a rule with headers means 443)'],
    ['the whole path', [{ host: '127.0.0.2:8443', methods: ['GET'], headers: cred }],
      'rule 0: secret "s": the rule\'s path prefix "/" is not at or below the secret\'s "/api/"'],
    ['a method it does not bind', [{ host: '127.0.0.2:8443', methods: ['GET', 'POST'], path_prefix: '/api/', headers: cred }],
      'rule 0: secret "s": the rule admits "POST", the secret only GET'],
    ['a wildcard host', [{ host: '*.example.com', methods: ['GET'], headers: cred }],
      'rule 0: secret "s": a rule naming a secret names one exact host, not a `*.` pattern'],
    ['the second rule', [{ host: 'example.com' }, { host: '127.0.0.2:8443', methods: ['GET'], path_prefix: '/apix', headers: cred }],
      'rule 1: secret "s": the rule\'s path prefix "/apix" is not at or below the secret\'s "/api/"'],
    ['a grammar error before a binding error', [
      { host: '127.0.0.3:1', methods: ['GET'], headers: cred }, { host: 'example.com', headers: cred }],
      'rule 1: a rule with headers must list its methods (a credential is never added to every method)'],
    ['inside the binding', [{ host: '127.0.0.2:8443', methods: ['GET'], path_prefix: '/api/x', headers: cred }], undefined],
    ['inside, the binding\'s own prefix', [{ host: '127.0.0.2:8443', methods: ['GET'], path_prefix: '/api/', headers: cred }], undefined],
    ['no credential at all', [{ host: 'anything.example' }], undefined],
    // Shapes the Worker does not parse: the guest (the grammar) decides.
    ['an IPv6 host', [{ host: '[::1]:8443', methods: ['GET'], headers: cred }], undefined],
    ['an upper-case host', [{ host: 'Example.com', methods: ['GET'], headers: cred }], undefined],
    ['a non-canonical IPv4', [{ host: '127.1:8443', methods: ['GET'], headers: cred }], undefined],
    ['a dot segment in the path', [{ host: '127.0.0.2:8443', methods: ['GET'], path_prefix: '/api/../x', headers: cred }], undefined],
    ['an unknown method', [{ host: '127.0.0.2:8443', methods: ['get'], headers: cred }], undefined],
    ['a reserved header', [{ host: '127.0.0.2:8443', methods: ['GET'], headers: { Host: { secret: 's' } } }], undefined],
    ['intercept = false', [{ host: '127.0.0.2:8443', intercept: false }, { host: '127.0.0.2:8443', methods: ['POST'], headers: cred }], undefined],
  ];
  for (const [what, rules, want] of rows) {
    assert.equal(grantBindingError(grant(...rules), bindings), want, what);
  }
});

test('a secret without a binding is refused for every rule naming it', () => {
  const g = grant({ host: '127.0.0.2:8443', methods: ['GET'], headers: { 'X-Key': { secret: 'other' } } });
  assert.equal(
    grantBindingError(g, bindings),
    'rule 0: secret "other": the secret has no binding (set it again with its host, methods and path)',
  );
  assert.equal(grantBindingError(undefined, bindings), undefined, 'no grant');
});
