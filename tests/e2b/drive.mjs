// The unmodified JS `e2b` SDK (tests/e2b/js/package.json, pinned by its lockfile,
// installed by scripts/setup under target/e2b-js) against `stockade serve`'s E2B layer
// (docs/E2B.md), configured only by the environment the e2e test sets: E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY (the operator's token). argv[2] is the directory the
// SDK is installed in (its package.json and node_modules); the SDK is loaded from
// there as a bundler would (its package's `module` entry). Prints "e2b-js: all checks
// passed" at the end; any failed check throws.

import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { pathToFileURL } from 'node:url'
import assert from 'node:assert/strict'

const installed = process.argv[2]
const require = createRequire(join(installed, 'package.json'))
const pkgJson = require.resolve('e2b/package.json')
const pkg = JSON.parse(readFileSync(pkgJson, 'utf8'))
const {
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  FilesystemEventType,
  FileType,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
} = await import(pathToFileURL(join(dirname(pkgJson), pkg.module)).href)

const step = (what) => console.log(`e2b-js: ${what}`)

/** `f()` rejects with an instance of `type`. */
async function rejects(f, type, what) {
  try {
    await f()
  } catch (e) {
    assert.ok(e instanceof type, `${what}: ${e?.constructor?.name}: ${e?.message}`)
    return e
  }
  throw new assert.AssertionError({ message: `${what}: did not throw` })
}

/** Wait for `cond()` with a deadline (no sleep as synchronization). */
async function until(cond, what, ms = 10_000) {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) throw new assert.AssertionError({ message: `${what}: not within ${ms} ms` })
    await new Promise((r) => setTimeout(r, 50))
  }
}

step(`create (SDK ${pkg.version})`)
const sbx = await Sandbox.create()
assert.match(sbx.sandboxId, /^[a-z0-9]{16,}$/)

step("a command's output, stderr and exit code")
let r = await sbx.commands.run('echo hello')
assert.equal(r.stdout, 'hello\n')
assert.equal(r.exitCode, 0)
r = await sbx.commands.run('echo err >&2; echo out')
assert.deepEqual([r.stdout, r.stderr], ['out\n', 'err\n'])

step('a non-zero exit throws CommandExitError')
const exit = await rejects(() => sbx.commands.run('exit 3'), CommandExitError, 'exit 3')
assert.equal(exit.exitCode, 3)

step('output streams as it is written')
const seen = []
await sbx.commands.run('echo one; sleep 1; echo two', { onStdout: (s) => seen.push([Date.now(), s]) })
assert.equal(seen.map(([, s]) => s).join(''), 'one\ntwo\n')
assert.ok(seen.length === 2 && seen[1][0] - seen[0][0] > 500, JSON.stringify(seen))

step('files: write, read, and a command sees the file')
const info = await sbx.files.write('/home/user/a.txt', 'hi')
assert.equal(info.path, '/home/user/a.txt')
assert.equal(await sbx.files.read('/home/user/a.txt'), 'hi')
assert.equal((await sbx.commands.run('cat a.txt')).stdout, 'hi')
await rejects(() => sbx.files.read('/home/user/missing.txt'), NotFoundError, 'a missing file')

step('files: makeDir, list, exists, getInfo, rename, remove')
assert.equal(await sbx.files.makeDir('/home/user/d'), true)
assert.equal(await sbx.files.makeDir('/home/user/d'), false, 'an existing directory')
await sbx.files.write('/home/user/d/b.txt', 'bee')
const names = (await sbx.files.list('/home/user')).map((e) => e.name).sort()
assert.deepEqual(names, ['a.txt', 'd'])
const deep = (await sbx.files.list('/home/user', { depth: 2 })).map((e) => e.path).sort()
assert.deepEqual(deep, ['/home/user/a.txt', '/home/user/d', '/home/user/d/b.txt'])
const b = await sbx.files.getInfo('/home/user/d/b.txt')
assert.deepEqual([b.name, b.type, b.path, b.size], ['b.txt', FileType.FILE, '/home/user/d/b.txt', 3])
assert.equal((await sbx.files.getInfo('/home/user/d')).type, FileType.DIR)
assert.equal(await sbx.files.exists('/home/user/a.txt'), true)
assert.equal(await sbx.files.exists('/home/user/nope'), false)
await rejects(() => sbx.files.getInfo('/home/user/nope'), FileNotFoundError, 'a missing entry')
await rejects(() => sbx.files.list('/etc'), InvalidArgumentError, 'a path outside /home/user')
const moved = await sbx.files.rename('/home/user/d/b.txt', '/home/user/d/c.txt')
assert.equal(moved.path, '/home/user/d/c.txt')
assert.equal(await sbx.files.read('/home/user/d/c.txt'), 'bee')
await sbx.files.remove('/home/user/d')
assert.equal(await sbx.files.exists('/home/user/d'), false)

step('watchDir sees a file a command writes')
const events = []
const w = await sbx.files.watchDir('/home/user', (e) => events.push([e.name, e.type]))
await sbx.commands.run('echo x > w.txt')
await until(() => events.some(([n, t]) => n === 'w.txt' && t === FilesystemEventType.CREATE), 'the CREATE of w.txt')
await sbx.files.remove('/home/user/w.txt')
await until(() => events.some(([n, t]) => n === 'w.txt' && t === FilesystemEventType.REMOVE), 'the REMOVE of w.txt')
await w.stop()

step('a background command starts, is listed and killed')
const h = await sbx.commands.run('sleep 30', { background: true })
assert.ok(h.pid > 0)
assert.ok((await sbx.commands.list()).map((p) => p.pid).includes(h.pid))
assert.equal(await sbx.commands.kill(h.pid), true)
await rejects(() => h.wait(), CommandExitError, 'a killed command')
assert.ok(!(await sbx.commands.list()).map((p) => p.pid).includes(h.pid))

step('commands.connect follows a running command from then on')
let orig = ''
let tail = ''
const loop = await sbx.commands.run('for i in $(seq 1 10); do echo line-$i; sleep 0.2; done', {
  background: true,
  onStdout: (s) => (orig += s),
})
await until(() => orig.includes('line-2\n'), 'the loop started')
const follower = await sbx.commands.connect(loop.pid, { onStdout: (s) => (tail += s) })
assert.equal((await follower.wait()).exitCode, 0)
assert.equal((await loop.wait()).exitCode, 0)
const lines = Array.from({ length: 10 }, (_, i) => `line-${i + 1}\n`).join('')
assert.equal(orig, lines, 'the original stream keeps every line')
assert.ok(tail.endsWith('line-10\n') && !tail.startsWith('line-1\n'), JSON.stringify(tail))
await rejects(() => sbx.commands.connect(999999), NotFoundError, 'connect to an unknown pid')

step('info and list')
assert.equal((await sbx.getInfo()).sandboxId, sbx.sandboxId)
const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
assert.ok(listed.includes(sbx.sandboxId), JSON.stringify(listed))

step('a wrong API key throws AuthenticationError')
await rejects(
  () => Sandbox.create({ apiKey: 'stk_0000000000000000_' + '0'.repeat(64) }),
  AuthenticationError,
  'a wrong key',
)

step('an unknown sandbox id throws NotFoundError')
await rejects(() => Sandbox.connect('a'.repeat(20)), NotFoundError, 'an unknown id')

step('kill')
assert.equal(await sbx.isRunning(), true)
await sbx.kill()
assert.equal(await sbx.isRunning(), false)
await rejects(() => sbx.commands.run('true'), NotFoundError, 'a killed sandbox')

console.log('e2b-js: all checks passed')
