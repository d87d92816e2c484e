// The unmodified JS `e2b` SDK (target/e2b-js, as tests/e2b/drive.mjs loads it) through
// Stockade's E2B domain form (docs/E2B.md, "The domain form"): configured only by
// E2B_DOMAIN, E2B_API_KEY and E2B_VALIDATE_API_KEY, with NODE_EXTRA_CA_CERTS the
// test's CA. Names under the domain resolve to the server's HTTPS listener through the
// test's DNS answerer (tests/e2e/e2b.rs: this process's mount namespace's
// resolv.conf); the SDK is not modified. argv[2] is the SDK's install directory.
// Prints "e2b-js domain: all checks passed" at the end; any failed check throws.

import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { pathToFileURL } from 'node:url'
import assert from 'node:assert/strict'

const installed = process.argv[2]
const require = createRequire(join(installed, 'package.json'))
const pkgJson = require.resolve('e2b/package.json')
const pkg = JSON.parse(readFileSync(pkgJson, 'utf8'))
const { Sandbox } = await import(pathToFileURL(join(dirname(pkgJson), pkg.module)).href)

const domain = process.env.E2B_DOMAIN
const step = (what) => console.log(`e2b-js domain: ${what}`)

/** Poll `f()` until it answers something true, with a deadline. */
async function until(what, f, seconds = 30) {
  const deadline = Date.now() + seconds * 1000
  let last
  while (Date.now() < deadline) {
    try {
      const got = await f()
      if (got) return got
    } catch (e) {
      last = e
    }
    await new Promise((r) => setTimeout(r, 200))
  }
  throw new assert.AssertionError({ message: `not within ${seconds}s: ${what} (last: ${last})` })
}

const SERVE = 'python3 -m http.server 8000 --bind 127.0.0.1 --directory /workspace'

step('create through https://api.<domain>')
const sbx = await Sandbox.create()
step('a command through https://49983-<id>.<domain>')
const r = await sbx.commands.run('echo hello')
assert.equal(r.stdout, 'hello\n')
step('write and read a file')
await sbx.files.write('/home/user/index.html', 'hello from js\n')
assert.equal(await sbx.files.read('/home/user/index.html'), 'hello from js\n')
step('getHost(8000), fetched from a detached HTTP server in the sandbox')
const host = sbx.getHost(8000)
assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
await sbx.commands.run(SERVE, { background: true, envs: { STOCKADE_DETACH: '1' } })
const body = await until('the sandbox port answers through getHost', async () => {
  const res = await fetch(`https://${host}/index.html`)
  return res.status === 200 ? await res.text() : null
})
assert.equal(body, 'hello from js\n')
step('allowPublicTraffic false: 403 without the traffic token')
const priv = await Sandbox.create({ network: { allowPublicTraffic: false } })
assert.ok(priv.trafficAccessToken, 'the create answers trafficAccessToken')
const res = await fetch(`https://${priv.getHost(8000)}/`)
assert.equal(res.status, 403)
step('kill')
await priv.kill()
await sbx.kill()
const gone = await fetch(`https://${host}/index.html`)
assert.equal(gone.status, 404)
console.log('e2b-js domain: all checks passed')
