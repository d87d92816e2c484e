// The JSPI lists for `jco transpile --async-mode jspi`, generated from the WIT so that
// none is missed (a sync-lowered import that returns a Promise fails at run time):
// every function of `interface substrate` is an async import (each is a signed fetch
// to a node), and every function of the exported interfaces (`facade`, `events`) is
// an async export. `records`, `policy`, `clock` and `log` stay synchronous: the
// Durable Object answers them from its own SQLite and a per-call prefetch.
//
//   node scripts/async-lists.mjs imports|exports|json [WIT]   (WIT: ../wit/sandbox.wit)
//
// Exported for the unit test (test/async-lists.test.mjs) as asyncLists(text).

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

/** The functions declared directly in `interface NAME { … }` of a WIT text. */
export function interfaceFunctions(text, name) {
  const noComments = text.replace(/\/\/[^\n]*/g, '');
  const start = noComments.search(new RegExp(`\\binterface\\s+${name}\\s*\\{`));
  if (start < 0) throw new Error(`no interface ${name} in the WIT`);
  let depth = 0;
  let i = noComments.indexOf('{', start);
  const open = i;
  for (; i < noComments.length; i++) {
    if (noComments[i] === '{') depth++;
    else if (noComments[i] === '}' && --depth === 0) break;
  }
  const body = noComments.slice(open + 1, i);
  // Only top-level items: drop nested record/variant/enum bodies.
  let flat = '';
  depth = 0;
  for (const ch of body) {
    if (ch === '{') depth++;
    else if (ch === '}') depth--;
    else if (depth === 0) flat += ch;
  }
  const out = [];
  for (const m of flat.matchAll(/(?:^|[;\s])%?([a-z][a-z0-9-]*)\s*:\s*func\s*\(/g)) out.push(m[1]);
  return out;
}

/** {pkg, imports, exports}: the jco names of the async imports and exports. */
export function asyncLists(text) {
  const pkg = /^\s*package\s+([a-z0-9-]+:[a-z0-9-]+)@([0-9.]+)\s*;/m.exec(text);
  if (!pkg) throw new Error('no package line in the WIT');
  const ns = pkg[1];
  const world = /\bworld\s+[a-z0-9-]+\s*\{([^}]*)\}/.exec(text);
  if (!world) throw new Error('no world in the WIT');
  const exported = [...world[1].matchAll(/\bexport\s+([a-z0-9-]+)\s*;/g)].map((m) => m[1]);
  const imports = interfaceFunctions(text, 'substrate').map((f) => `${ns}/substrate#${f}`);
  const exports = exported.flatMap((i) => interfaceFunctions(text, i).map((f) => `${ns}/${i}#${f}`));
  return { pkg: `${ns}@${pkg[2]}`, imports, exports };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const mode = process.argv[2] ?? 'json';
  const wit = process.argv[3] || path.join(here, '..', '..', 'wit', 'sandbox.wit');
  const { imports, exports } = asyncLists(readFileSync(wit, 'utf8'));
  if (mode === 'imports') console.log(imports.join('\n'));
  else if (mode === 'exports') console.log(exports.join('\n'));
  else console.log(JSON.stringify({ imports, exports }, null, 1));
}
