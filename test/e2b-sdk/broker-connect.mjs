// The official E2B JS SDK (npm "e2b", pinned in package.json) on the broker,
// changed only by E2B_API_URL=<api_url>/e2b and the tenant's broker token
// as its API key, runs a whole agent session: create for a thread (an
// acquire), connect, commands (foreground, background, stdin, kill, env
// vars, cwd), files (write, read, list, exists, rename, remove, watch),
// metrics, setTimeout, pause and connect (the same sandbox, its files and
// its background process), list by metadata in both orders, a create
// refused for capacity (429) that the SDK retries once a slot frees, kill
// (isRunning() is then false), a second kill, and create for the same
// thread again, which gets the same sandbox back (source resumed). Another
// tenant's key sees none of it.
//
// Needs BROKER_API_URL, BROKER_TOKEN, BROKER_OTHER_TOKEN and
// E2B_SANDBOX_URL (the local stack serves every sandbox's envd on one
// URL); the deployment must run two sandboxes at most, refusing more
// (SANDBOX_REPLICAS=2, SANDBOX_OVERFLOW_POLICY=reject). Run by test/e2e
// TestE2BSDKOnBrokeredSandbox. Exits 0 when every step behaves; otherwise
// prints "broker-connect FAILED: <step>: <why>".
import { Sandbox, SandboxNotFoundError, NotFoundError, RateLimitError } from 'e2b'
import { randomUUID } from 'node:crypto'
import http from 'node:http'

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
const e2b = (apiKey, base = api) => ({ apiUrl: `${base}/e2b`, apiKey })

let step = 'setup'
const log = (msg) => console.log(`broker-connect: ${msg}`)
function check(cond, why) {
  if (!cond) throw new Error(why)
}
function eq(got, want, what) {
  check(got === want, `${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
}
// waitFor polls cond every 50 ms for up to 15 s.
async function waitFor(cond, what) {
  const deadline = Date.now() + 15_000
  while (!(await cond())) {
    check(Date.now() < deadline, `timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
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

// recorder is a pass-through proxy in front of the broker that notes the
// status and Retry-After of every reply, to see what the SDK was answered.
function recorder() {
  const seen = []
  const server = http.createServer(async (req, res) => {
    const chunks = []
    for await (const c of req) chunks.push(c)
    const headers = { ...req.headers }
    for (const h of ['host', 'connection', 'content-length', 'transfer-encoding']) delete headers[h]
    const up = await fetch(api + req.url, {
      method: req.method, headers, body: chunks.length ? Buffer.concat(chunks) : undefined,
    })
    const body = Buffer.from(await up.arrayBuffer())
    seen.push({ method: req.method, path: req.url.split('?')[0], status: up.status, retryAfter: up.headers.get('retry-after') })
    const out = {}
    up.headers.forEach((v, k) => {
      if (!['content-encoding', 'content-length', 'transfer-encoding', 'connection'].includes(k)) out[k] = v
    })
    res.writeHead(up.status, out)
    res.end(body)
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () =>
    resolve({ url: `http://127.0.0.1:${server.address().port}`, seen, close: () => server.close() })))
}

try {
  step = 'create'
  const user = `sdk-${randomUUID()}`
  const thread = `t-${randomUUID()}`
  const created = await Sandbox.create({ ...e2b(token), metadata: { user_id: user, thread_id: thread } })
  const id = created.sandboxId
  const rec = await broker('GET', `/v1/sandboxes/${id}`)
  eq(rec.state, 'active', 'state after create (acquired for the thread)')
  eq(rec.source, 'created', 'source after create')
  log(`created ${id} for thread ${thread}`)

  step = 'connect'
  const before = await broker('GET', `/v1/sandboxes/${id}`)
  const sbx = await Sandbox.connect(id, e2b(token))
  eq(sbx.sandboxId, id, 'sandbox id')
  eq((await broker('GET', `/v1/sandboxes/${id}`)).expires_at, before.expires_at, 'expires_at after connect (connect must not extend the sandbox)')
  eq(await sbx.isRunning(), true, 'isRunning after create')

  step = 'commands: env vars and cwd'
  const res = await sbx.commands.run('echo "hello $WHO"; pwd', { envs: { WHO: 'sdk' } })
  eq(res.exitCode, 0, 'exit code')
  eq(res.stdout, 'hello sdk\n/home/user\n', 'stdout')
  await sbx.files.makeDir('/home/user/workspace')
  eq((await sbx.commands.run('pwd', { cwd: '/home/user/workspace' })).stdout, '/home/user/workspace\n', 'pwd under cwd')

  step = 'commands: stdin'
  const reader = await sbx.commands.run('cat; echo end', { background: true, stdin: true })
  await sbx.commands.sendStdin(reader.pid, 'piped\n')
  await sbx.commands.closeStdin(reader.pid)
  eq((await reader.wait()).stdout, 'piped\nend\n', 'output of a command reading stdin')

  step = 'commands: kill'
  const doomed = await sbx.commands.run('sleep 300', { background: true, timeoutMs: 0 })
  eq(await sbx.commands.kill(doomed.pid), true, 'kill of a running command')
  const ended = await doomed.wait().then((r) => r.exitCode, (err) => err?.exitCode ?? err?.name)
  check(ended !== 0, `a killed command must not end with 0, got ${ended}`)
  check(!(await sbx.commands.list()).some((p) => p.pid === doomed.pid), `killed process ${doomed.pid} still listed`)

  step = 'files'
  await sbx.files.write('/home/user/workspace/from-sdk.txt', 'written by the E2B SDK\n')
  eq(await sbx.files.read('/home/user/workspace/from-sdk.txt'), 'written by the E2B SDK\n', 'file content')
  eq((await sbx.commands.run('cat workspace/from-sdk.txt')).stdout, 'written by the E2B SDK\n', 'file read back by a command')
  await sbx.files.write('scratch/a.txt', 'a')
  eq((await sbx.files.list('scratch')).map((e) => e.name).join(), 'a.txt', 'directory entries')
  eq(await sbx.files.exists('scratch/a.txt'), true, 'exists(a.txt)')
  eq(await sbx.files.exists('scratch/none.txt'), false, 'exists(none.txt)')
  eq((await sbx.files.rename('scratch/a.txt', 'scratch/b.txt')).path, '/home/user/scratch/b.txt', 'renamed path')
  eq(await sbx.files.exists('scratch/a.txt'), false, 'exists(a.txt) after rename')
  await sbx.files.remove('scratch')
  eq(await sbx.files.exists('scratch'), false, 'exists after remove')

  step = 'files: watch'
  await sbx.files.makeDir('watched')
  const events = []
  const watcher = await sbx.files.watchDir('watched', (e) => events.push(e))
  await sbx.files.write('watched/new.txt', 'x')
  await waitFor(async () => events.some((e) => e.name === 'new.txt' && e.type === 'create'), 'a create event for new.txt')
  await watcher.stop()
  await refused('watch a missing directory', () => sbx.files.watchDir('no-such-dir', () => {}), (err) => /NotFound/.test(err?.name))

  step = 'metrics'
  const metrics = await sbx.getMetrics()
  check(metrics.length >= 1 && metrics[0].memTotal > 0 && metrics[0].diskTotal > 0, `metrics ${JSON.stringify(metrics)}`)
  await refused("another tenant's metrics", () => Sandbox.getMetrics(id, e2b(otherToken)), notFound)

  step = 'another tenant'
  await refused("connect with another tenant's key", () => Sandbox.connect(id, e2b(otherToken)), notFound)
  await refused("another tenant's info", () => Sandbox.getInfo(id, e2b(otherToken)), notFound)
  eq(await Sandbox.kill(id, e2b(otherToken)), false, "kill with another tenant's key")

  step = 'background process'
  const bg = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  check((await sbx.commands.list()).some((p) => p.pid === bg.pid), `background process ${bg.pid} not listed`)

  step = 'setTimeout'
  await sbx.setTimeout(120_000)

  step = 'pause'
  eq(await sbx.pause(), true, 'pause')
  eq((await broker('GET', `/v1/sandboxes/${id}`)).state, 'paused', 'state after pause (released, paused)')
  eq(await sbx.isRunning(), false, 'isRunning while paused')

  step = 'connect after pause'
  const back = await Sandbox.connect(id, e2b(token))
  eq(back.sandboxId, id, 'the same sandbox')
  const resumed = await broker('GET', `/v1/sandboxes/${id}`)
  eq(resumed.state + '/' + resumed.source, 'active/resumed', 'state/source after connect')
  eq(await back.files.read('/home/user/workspace/from-sdk.txt'), 'written by the E2B SDK\n', 'its files')
  check((await back.commands.list()).some((p) => p.pid === bg.pid), `background process ${bg.pid} gone after the resume`)
  eq((await back.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n', 'the background process runs')

  step = 'list'
  const second = await Sandbox.create({ ...e2b(token), metadata: { user_id: user, thread_id: `${thread}-2` } })
  const ids = async (opts) => (await Sandbox.list({ ...e2b(token), query: { metadata: { user_id: user } }, ...opts }).nextItems()).map((i) => i.sandboxId).join()
  eq(await ids({}), `${second.sandboxId},${id}`, 'list by user, newest first')
  eq(await ids({ order: 'asc' }), `${id},${second.sandboxId}`, 'list by user, oldest first')
  eq((await Sandbox.list({ ...e2b(token), query: { metadata: { thread_id: thread } } }).nextItems()).map((i) => i.sandboxId).join(), id, 'list by thread')
  eq((await Sandbox.list({ ...e2b(otherToken), query: { metadata: { user_id: user } } }).nextItems()).length, 0, "another tenant's list")

  step = 'capacity refusal'
  // Both slots are held: a third thread's create is refused with E2B's 429.
  const third = { user_id: user, thread_id: `${thread}-3` }
  const raw = await fetch(`${api}/e2b/v2/sandboxes`, {
    method: 'POST', headers: { 'X-API-Key': token, 'Content-Type': 'application/json' }, body: JSON.stringify({ metadata: third }),
  })
  const rawBody = await raw.json()
  eq(raw.status, 429, 'status of a create over capacity')
  check(/^\d+$/.test(raw.headers.get('retry-after') ?? ''), `Retry-After ${raw.headers.get('retry-after')} is not whole seconds`)
  eq(rawBody.code, 429, "the refusal's code (E2B's error shape)")
  check(typeof rawBody.message === 'string' && rawBody.message !== '', `refusal message ${JSON.stringify(rawBody)}`)
  await refused('create over capacity, no retries', () => Sandbox.create({ ...e2b(token), metadata: third, retries: 0 }), (err) => err instanceof RateLimitError)

  step = 'capacity refusal retried by the SDK'
  const rec429 = await recorder()
  const creating = Sandbox.create({ ...e2b(token, rec429.url), metadata: third })
  const creates = () => rec429.seen.filter((s) => s.method === 'POST' && s.path === '/e2b/v2/sandboxes')
  await waitFor(async () => creates().length > 0, 'the first create attempt')
  eq(await second.kill(), true, 'kill of the second sandbox (frees a slot)')
  const thirdSbx = await creating
  rec429.close()
  const statuses = creates().map((s) => s.status)
  check(statuses[0] === 429 && statuses.at(-1) === 201, `create statuses ${statuses}: want a 429, retried by the SDK to a 201`)
  log(`create answered ${statuses} (Retry-After ${creates()[0].retryAfter}s)`)
  eq(await Sandbox.kill(thirdSbx.sandboxId, e2b(token)), true, 'kill of the third sandbox')

  step = 'kill'
  eq(await back.kill(), true, 'kill')
  eq((await broker('GET', `/v1/sandboxes/${id}`)).state, 'paused', 'state after kill (released, parked paused)')
  eq(await back.isRunning(), false, 'isRunning after kill')
  eq(await Sandbox.kill(id, e2b(token)), false, 'a second kill (not running)')

  step = 'create again'
  const again = await Sandbox.create({ ...e2b(token), metadata: { user_id: user, thread_id: thread } })
  eq(again.sandboxId, id, 'the thread gets its sandbox back')
  eq((await broker('GET', `/v1/sandboxes/${id}`)).source, 'resumed', 'source of the create after kill')
  eq(await again.files.read('/home/user/workspace/from-sdk.txt'), 'written by the E2B SDK\n', 'its files')
  eq(await again.kill(), true, 'kill again')

  step = 'one-off sandbox'
  const oneoff = await Sandbox.create(e2b(token))
  eq((await oneoff.commands.run('echo one-off')).stdout, 'one-off\n', 'a command in a one-off sandbox')
  eq(await oneoff.kill(), true, 'kill of a one-off sandbox')
  eq(await oneoff.isRunning(), false, 'isRunning after kill of a one-off sandbox')

  step = 'unknown sandbox'
  await refused('connect to an unknown id', () => Sandbox.connect('nosuchsandbox', e2b(token)), notFound)
  log('ok')
  process.exit(0)
} catch (err) {
  console.error(`broker-connect FAILED: ${step}: ${err?.stack || err}`)
  process.exit(1)
}
