// The official E2B JS SDK (npm "e2b", pinned in package.json) on the broker,
// changed only by E2B_API_URL=<api_url>/e2b and the tenant's broker token
// as its API key: create for a thread (an acquire), connect, commands
// (foreground, background, env vars), files, setTimeout, list by metadata,
// kill (a release: parked warm), a second kill, and create for the same
// thread again, which gets the same sandbox and its files back. Another
// tenant's key sees none of it.
//
// Needs BROKER_API_URL, BROKER_TOKEN, BROKER_OTHER_TOKEN and
// E2B_SANDBOX_URL (the local stack serves every sandbox's envd on one URL).
// Run by test/e2e TestE2BSDKOnBrokeredSandbox. Exits 0 when every step
// behaves; otherwise prints "broker-connect FAILED: <step>: <why>".
import { Sandbox, SandboxNotFoundError, NotFoundError } from 'e2b'
import { randomUUID } from 'node:crypto'

for (const name of ['BROKER_API_URL', 'BROKER_TOKEN', 'BROKER_OTHER_TOKEN', 'E2B_SANDBOX_URL']) {
  if (!process.env[name]) {
    console.error(`broker-connect FAILED: setup: ${name} is not set`)
    process.exit(2)
  }
}
const api = process.env.BROKER_API_URL.replace(/\/+$/, '')
const token = process.env.BROKER_TOKEN
const otherToken = process.env.BROKER_OTHER_TOKEN
// What an E2B SDK user sets to move to the broker.
const e2b = (apiKey) => ({ apiUrl: `${api}/e2b`, apiKey })

let step = 'setup'
const log = (msg) => console.log(`broker-connect: ${msg}`)
function check(cond, why) {
  if (!cond) throw new Error(why)
}
function eq(got, want, what) {
  check(got === want, `${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
}
async function broker(method, path, body) {
  const res = await fetch(api + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const json = await res.json()
  check(res.ok, `${method} ${path}: HTTP ${res.status}: ${JSON.stringify(json)}`)
  return json
}
async function refused(what, fn, isExpected) {
  try {
    await fn()
  } catch (err) {
    check(isExpected(err), `${what}: unexpected ${err?.name}: ${err?.message}`)
    log(`${what}: ${err.name}: ${err.message}`)
    return
  }
  throw new Error(`${what}: succeeded, want a refusal`)
}
const notFound = (err) => err instanceof SandboxNotFoundError || err instanceof NotFoundError

try {
  step = 'create'
  const thread = `sdk-${randomUUID()}`
  const created = await Sandbox.create({ ...e2b(token), metadata: { user_id: 'sdk-user', thread_id: thread } })
  const id = created.sandboxId
  eq((await broker('GET', `/v1/sandboxes/${id}`)).state, 'active', 'state after create (acquired for the thread)')
  log(`created ${id} for thread ${thread}`)

  step = 'connect'
  const before = await broker('GET', `/v1/sandboxes/${id}`)
  const sbx = await Sandbox.connect(id, e2b(token))
  eq(sbx.sandboxId, id, 'sandbox id')
  const after = await broker('GET', `/v1/sandboxes/${id}`)
  eq(after.expires_at, before.expires_at, 'expires_at after connect (connect must not extend the sandbox)')

  step = 'commands.run'
  const res = await sbx.commands.run('echo "hello $WHO"; pwd', { envs: { WHO: 'sdk' } })
  eq(res.exitCode, 0, 'exit code')
  eq(res.stdout, 'hello sdk\n/home/user\n', 'stdout')

  step = 'files.write/read'
  await sbx.files.write('/home/user/workspace/from-sdk.txt', 'written by the E2B SDK\n')
  eq(await sbx.files.read('/home/user/workspace/from-sdk.txt'), 'written by the E2B SDK\n', 'file content')
  const cat = await sbx.commands.run('cat workspace/from-sdk.txt')
  eq(cat.stdout, 'written by the E2B SDK\n', 'file read back by a command')

  step = 'another tenant'
  await refused('connect with another tenant\'s key', () => Sandbox.connect(id, e2b(otherToken)), notFound)

  step = 'background process'
  await sbx.commands.run('sleep 600', { background: true })
  const ps = await sbx.commands.run('pgrep -x sleep || true')
  check(ps.stdout.trim() !== '', 'a background process started by one command is seen by the next')

  step = 'setTimeout'
  await sbx.setTimeout(60_000)

  step = 'list'
  const mine = await Sandbox.list({ ...e2b(token), query: { metadata: { thread_id: thread } } }).nextItems()
  eq(mine.map((i) => i.sandboxId).join(), id, 'list by the thread in metadata')
  const theirs = await Sandbox.list({ ...e2b(otherToken), query: { metadata: { thread_id: thread } } }).nextItems()
  eq(theirs.length, 0, "another tenant's list")

  step = 'kill'
  eq(await sbx.kill(), true, 'kill')
  eq((await broker('GET', `/v1/sandboxes/${id}`)).state, 'warm', 'state after kill (released, parked warm)')
  eq(await Sandbox.kill(id, e2b(token)), false, 'a second kill (not running)')

  step = 'create again'
  const again = await Sandbox.create({ ...e2b(token), metadata: { user_id: 'sdk-user', thread_id: thread } })
  eq(again.sandboxId, id, 'the thread gets its sandbox back')
  eq((await again.files.read('/home/user/workspace/from-sdk.txt')), 'written by the E2B SDK\n', 'its files')
  eq(await again.kill(), true, 'kill again')

  step = 'unknown sandbox'
  await refused('connect to an unknown id', () => Sandbox.connect('nosuchsandbox', e2b(token)), notFound)
  log('ok')
} catch (err) {
  console.error(`broker-connect FAILED: ${step}: ${err?.stack || err}`)
  process.exit(1)
}
