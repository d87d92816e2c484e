// Writes the workerd configuration of the deployment (the Worker, its Durable Objects
// on local disk, one `external` HTTPS service per node pinned to its certificate) from
// a JSON description:
//
//   node scripts/deploy-config.mjs DESCRIPTION.json OUT.capnp
//
//   {
//     "listen": "127.0.0.1:8800",            // the public API's socket (the default; README "Ports")
//     "storage": "/var/lib/stockade-edge",   // Durable Objects' SQLite (localDisk), absolute;
//                                            // it must exist before `workerd serve` (README)
//     "api_token_file": "...", "approver_token_file": "...",   // or "api_token", "approver_token"
//     "idle_ms": 600000, "heartbeat_ms": 1000, "approval_ttl_ms": 900000,   // optional
//     "floor": [["rm", "-rf", "/"], ["git", "push", "**"]],   // optional: [floor] rules
//     "mcp_origins": ["https://agent.example.com"],   // optional: api.mcp_origins (/mcp)
//     "ceiling": 32,                         // optional: the deployment's ceiling, the most a
//                                            // scoped token's share may be (default: 16 per node)
//     "nodes": [{"name": "node-1", "address": "10.0.0.2:8788",
//                "cert_file": ".../cert.pem", "secret_file": ".../secret"}]
//   }
//
// File paths may be relative to the description; the configuration embeds them
// (relative to OUT), so no secret is copied into it. edge/deploy.capnp is this script's
// output for edge/deploy.example.json.

import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const edge = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');

/** A Cap'n Proto text literal. */
export function capnpString(s) {
  return `"${String(s).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`;
}

/** The Worker's socket when the description names none: a port no Stockade process
 * takes by default (`stockade serve` 8787, `stockade node` 8788, its preview doors 8790). */
export const DEFAULT_LISTEN = '127.0.0.1:8800';

/** What to tell the operator when the storage directory does not exist (else null):
 * workerd does not make it, and its error names the service, not the directory's
 * absence ("Directory named "do-storage" not found", then "durableObjectStorage config
 * refers to the service "do-storage", but that service is not a local disk service"). */
export function storageNotice(storage, exists = existsSync) {
  if (exists(storage)) return null;
  return (
    `storage ${storage} does not exist: make it before \`workerd serve\` (mkdir -p ${storage}), ` +
    `or workerd stops with "service do-storage: Directory named "do-storage" not found"`
  );
}

/** The worker's module list (ES modules and the JSPI build's core modules). */
export const MODULES = [
  ['deploy.js', 'src/deploy.js'],
  ['sandbox.js', 'src/sandbox.js'],
  ['nodes.js', 'src/nodes.js'],
  ['sign.js', 'src/sign.js'],
  ['placement.js', 'src/placement.js'],
  ['api.js', 'src/api.js'],
  ['routes.js', 'src/routes.js'],
  ['pending.js', 'src/pending.js'],
  ['scope.js', 'src/scope.js'],
  ['tenants.js', 'src/tenants.js'],
  ['known.js', 'src/known.js'],
  ['lifetime.js', 'src/lifetime.js'],
  ['mcp.js', 'src/mcp.js'],
  ['jspi/openapi.json', 'gen-jspi/openapi.json'],
  ['upload.js', 'src/upload.js'],
  ['#gen/unpack.js', 'gen/unpack.js'],
  ['jspi-host.js', 'src/jspi-host.js'],
  ['call.js', 'src/call.js'],
  ['mock.js', 'src/mock.js'],
  ['batch.js', 'src/batch.js'],
  ['settle.js', 'src/settle.js'],
  ['defaults.js', 'src/defaults.js'],
  ['jspi/stockade.js', 'gen-jspi/stockade.js'],
  ['jspi/stockade.core.wasm', 'gen-jspi/stockade.core.wasm'],
  ['jspi/stockade.core2.wasm', 'gen-jspi/stockade.core2.wasm'],
  ['jspi/stockade.core3.wasm', 'gen-jspi/stockade.core3.wasm'],
];

/** The configuration text for `desc`; `outDir` is where it will be written. */
export function deployConfig(desc, { descDir = process.cwd(), outDir = edge } = {}) {
  const rel = (p) => {
    const r = path.relative(outDir, path.resolve(descDir, p));
    return r.startsWith('.') ? r : `./${r}`;
  };
  const text = (inline, file, what) => {
    if (typeof inline === 'string') {
      if (inline.trim() === '') throw new Error(`${what}: empty`);
      return capnpString(inline);
    }
    if (typeof file === 'string') return `embed ${capnpString(rel(file))}`;
    throw new Error(`${what}: give it inline or as a file`);
  };
  if (!Array.isArray(desc.nodes) || desc.nodes.length === 0) throw new Error('nodes: at least one');
  const names = new Set();
  for (const n of desc.nodes) {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(n.name ?? '') || names.has(n.name)) {
      throw new Error(`node name ${JSON.stringify(n.name)}: invalid or repeated`);
    }
    names.add(n.name);
  }
  if (!path.isAbsolute(desc.storage ?? '')) throw new Error('storage: an absolute directory');
  const floor = desc.floor;
  if (
    floor !== undefined &&
    !(Array.isArray(floor) && floor.every((r) => Array.isArray(r) && r.length > 0 && r.every((w) => typeof w === 'string')))
  ) {
    throw new Error('floor: a list of argv patterns (non-empty lists of strings)');
  }
  const mcpOrigins = desc.mcp_origins;
  if (mcpOrigins !== undefined && !(Array.isArray(mcpOrigins) && mcpOrigins.every((o) => typeof o === 'string'))) {
    throw new Error('mcp_origins: a list of origins (strings)');
  }
  const ceiling = desc.ceiling;
  if (ceiling !== undefined && !(Number.isSafeInteger(ceiling) && ceiling >= 1 && ceiling <= 4294967295)) {
    throw new Error('ceiling: a whole number of live containers, at least 1');
  }
  const services = [
    `    (name = "stockade", worker = .stockadeWorker)`,
    `    (name = "do-storage", disk = (path = ${capnpString(desc.storage)}, writable = true))`,
    ...desc.nodes.map(
      (n) =>
        `    (name = ${capnpString(`node:${n.name}`)}, external = (address = ${capnpString(n.address)}, https = (\n` +
        `      tlsOptions = (trustedCertificates = [ ${text(n.cert, n.cert_file, `${n.name} cert`)} ]),\n` +
        `      certificateHost = "stockade-node")))`,
    ),
  ];
  const nodes = desc.nodes.map((n, i) => ({ name: n.name, service: `NODE${i}`, secret: `NODE${i}_SECRET` }));
  const bindings = [
    `    (name = "API_TOKEN", text = ${text(desc.api_token, desc.api_token_file, 'api_token')})`,
    `    (name = "APPROVER_TOKEN", text = ${text(desc.approver_token, desc.approver_token_file, 'approver_token')})`,
    `    (name = "NODES", json = ${capnpString(JSON.stringify(nodes))})`,
    `    (name = "IDLE_MS", text = ${capnpString(String(desc.idle_ms ?? 600000))})`,
    `    (name = "HEARTBEAT_MS", text = ${capnpString(String(desc.heartbeat_ms ?? 1000))})`,
    `    (name = "APPROVAL_TTL_MS", text = ${capnpString(String(desc.approval_ttl_ms ?? 900000))})`,
    ...(floor === undefined ? [] : [`    (name = "FLOOR", json = ${capnpString(JSON.stringify(floor))})`]),
    `    (name = "SANDBOX", durableObjectNamespace = "Sandbox")`,
    `    (name = "REGISTRY", durableObjectNamespace = "Registry")`,
    `    (name = "MCP", durableObjectNamespace = "McpSessions")`,
    `    (name = "TENANTS", durableObjectNamespace = "Tenants")`,
    `    (name = "KNOWN", durableObjectNamespace = "Known")`,
    `    (name = "CEILING", text = ${capnpString(String(ceiling ?? 16 * desc.nodes.length))})`,
    ...(mcpOrigins === undefined ? [] : [`    (name = "MCP_ORIGINS", json = ${capnpString(JSON.stringify(mcpOrigins))})`]),
    ...desc.nodes.flatMap((n, i) => [
      `    (name = "NODE${i}", service = ${capnpString(`node:${n.name}`)})`,
      `    (name = "NODE${i}_SECRET", text = ${text(n.secret, n.secret_file, `${n.name} secret`)})`,
    ]),
  ];
  const modules = MODULES.map(
    ([name, file]) =>
      `    (name = ${capnpString(name)}, ${file.endsWith('.wasm') ? 'wasm' : file.endsWith('.json') ? 'json' : 'esModule'} = embed ${capnpString(rel(path.join(edge, file)))})`,
  );
  return `# The Stockade edge deployment: the public API in a Worker, one Durable Object per
# sandbox key (SQLite on local disk), the substrate on nodes over pinned HTTPS.
# Generated by edge/scripts/deploy-config.mjs; serve with:
#   npx workerd serve THIS_FILE --experimental
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
${services.join(',\n')},
  ],
  sockets = [ (name = "http", address = ${capnpString(desc.listen ?? DEFAULT_LISTEN)}, http = (), service = "stockade") ],
);

const stockadeWorker :Workerd.Worker = (
  modules = [
${modules.join(',\n')},
  ],
  compatibilityDate = "2024-09-23",
  # request.signal for a buffered exec's caller gone, where the platform reports it (README "A caller that leaves").
  compatibilityFlags = ["enable_request_signal", "request_signal_passthrough"],
  bindings = [
${bindings.join(',\n')},
  ],
  durableObjectNamespaces = [
    (className = "Sandbox", uniqueKey = "stockade-sandbox", enableSql = true),
    (className = "Registry", uniqueKey = "stockade-registry", enableSql = true),
    (className = "McpSessions", uniqueKey = "stockade-mcp", enableSql = true),
    (className = "Tenants", uniqueKey = "stockade-tenants", enableSql = true),
    (className = "Known", uniqueKey = "stockade-known", enableSql = true),
  ],
  durableObjectStorage = (localDisk = "do-storage"),
);
`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [descPath, out] = process.argv.slice(2);
  if (!descPath || !out) {
    console.error('usage: node scripts/deploy-config.mjs DESCRIPTION.json OUT.capnp');
    process.exit(2);
  }
  const desc = JSON.parse(readFileSync(descPath, 'utf8'));
  writeFileSync(out, deployConfig(desc, { descDir: path.dirname(path.resolve(descPath)), outDir: path.dirname(path.resolve(out)) }));
  const notice = storageNotice(desc.storage);
  if (notice) console.error(`deploy-config: wrote ${out}; ${notice}`);
}
