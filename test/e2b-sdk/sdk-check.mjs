// Acceptance check: the official E2B JS SDK (npm "e2b", pinned in
// package.json) drives the local sandbox host (internal/sandboxhost):
// commands (stdin, attach), files (metadata, watch, signed URLs), metrics,
// pause, kill (a running command fails as killed) and timeouts.
//
// Needs E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Exits 0 when every
// step behaves as E2B does; otherwise prints "sdk-check FAILED: <step>: <why>"
// and exits 1. Run from internal/sandboxhost's TestOfficialE2BSDK, or by hand:
//   E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… node test/e2b-sdk/sdk-check.mjs
import { Sandbox, CommandExitError } from 'e2b'
import { randomUUID } from 'node:crypto'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    console.error(`sdk-check FAILED: setup: ${name} is not set`)
    process.exit(2)
  }
}

let step = 'setup'
const log = (msg) => console.log(`sdk-check: ${msg}`)
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

let sandbox
try {
  const runId = randomUUID()
  const metadata = { purpose: 'sdk-check', run: runId }

  step = 'create'
  sandbox = await Sandbox.create({
    metadata,
    envs: { SANDBOX_LEVEL_VAR: 'from-create' },
    timeoutMs: 120_000,
  })
  check(/^[a-z0-9]+$/.test(sandbox.sandboxId), `sandbox id ${JSON.stringify(sandbox.sandboxId)} is not lowercase alphanumeric`)
  log(`created ${sandbox.sandboxId}`)

  step = 'isRunning'
  eq(await sandbox.isRunning(), true, 'isRunning after create')

  step = 'run command'
  const res = await sandbox.commands.run('echo "hello $WHO"; echo "$SANDBOX_LEVEL_VAR"; echo oops >&2; pwd', {
    envs: { WHO: 'sdk' },
  })
  eq(res.exitCode, 0, 'exit code')
  eq(res.stdout, 'hello sdk\nfrom-create\n/home/user\n', 'stdout')
  eq(res.stderr, 'oops\n', 'stderr')

  step = 'failing command'
  let failed
  try {
    await sandbox.commands.run('echo partial; exit 7')
  } catch (err) {
    failed = err
  }
  check(failed instanceof CommandExitError, `a failing command must throw CommandExitError, got ${failed}`)
  eq(failed.exitCode, 7, 'failing command exit code')
  eq(failed.stdout, 'partial\n', 'failing command stdout')

  step = 'write file'
  const content = `line one\nrun ${runId}\n`
  const info = await sandbox.files.write('notes/hello.txt', content)
  eq(info.path, '/home/user/notes/hello.txt', 'written path')

  step = 'read file'
  eq(await sandbox.files.read('/home/user/notes/hello.txt'), content, 'file content')

  step = 'file seen by a command'
  const cat = await sandbox.commands.run('cat notes/hello.txt')
  eq(cat.stdout, content, 'cat output')

  step = 'list directory'
  const entries = await sandbox.files.list('/home/user/notes')
  eq(entries.map((e) => e.name).join(','), 'hello.txt', 'directory entries')
  eq(entries[0].type, 'file', 'entry type')

  step = 'write several files'
  const many = await sandbox.files.write([
    { path: 'multi/one.txt', data: 'one' },
    { path: '/home/user/multi/two.txt', data: 'two' },
  ])
  eq(many.map((w) => w.path).sort().join(','), '/home/user/multi/one.txt,/home/user/multi/two.txt', 'paths written')
  eq(await sandbox.files.read('multi/two.txt'), 'two', 'second file content')

  step = 'filesystem operations'
  eq(await sandbox.files.exists('multi/one.txt'), true, 'exists(one.txt)')
  eq(await sandbox.files.exists('multi/none.txt'), false, 'exists(none.txt)')
  eq(await sandbox.files.makeDir('made/deep'), true, 'makeDir new')
  eq(await sandbox.files.makeDir('made/deep'), false, 'makeDir existing')
  const moved = await sandbox.files.rename('multi/one.txt', 'made/one.txt')
  eq(moved.path, '/home/user/made/one.txt', 'renamed path')
  await sandbox.files.remove('multi')
  eq(await sandbox.files.exists('multi'), false, 'exists after remove')

  step = 'stdin'
  const reader = await sandbox.commands.run('cat; echo end', { background: true, stdin: true })
  await sandbox.commands.sendStdin(reader.pid, 'piped\n')
  await sandbox.commands.closeStdin(reader.pid)
  eq((await reader.wait()).stdout, 'piped\nend\n', 'output of a command reading stdin')

  step = 'attach to a running command'
  const waiting = await sandbox.commands.run('read x; echo got $x', { background: true, stdin: true })
  const attached = await sandbox.commands.connect(waiting.pid)
  await sandbox.commands.sendStdin(waiting.pid, 'it\n')
  eq((await attached.wait()).stdout, 'got it\n', 'output through an attached handle')
  eq((await waiting.wait()).exitCode, 0, 'exit code through the starting handle')

  step = 'watch a directory'
  await sandbox.files.makeDir('watched')
  const seen = []
  const watcher = await sandbox.files.watchDir('watched', (e) => seen.push(e))
  await sandbox.files.write('watched/new.txt', 'x')
  await waitFor(async () => seen.some((e) => e.name === 'new.txt' && e.type === 'create'), 'a create event for new.txt')
  await watcher.stop()
  let watchMissing
  try {
    await sandbox.files.watchDir('no-such-dir', () => {})
  } catch (err) {
    watchMissing = err
  }
  check(watchMissing && /NotFound/.test(watchMissing.name), `watching a missing directory must throw a not-found error, got ${watchMissing}`)

  step = 'file metadata, owner and removal'
  await sandbox.files.write('meta.txt', 'm', { metadata: { author: 'sdk' } })
  const metaInfo = await sandbox.files.getInfo('meta.txt')
  eq(metaInfo.metadata && metaInfo.metadata.author, 'sdk', 'file metadata')
  eq(metaInfo.owner, 'user', 'file owner')
  await sandbox.files.remove('no/such/path')

  step = 'signed download URL'
  const signed = await sandbox.downloadUrl('notes/hello.txt')
  check(new URL(signed).searchParams.has('signature'), `download URL ${signed} carries no signature`)
  const fetched = await fetch(signed)
  eq(fetched.status, 200, 'status of a plain fetch of the signed URL')
  eq(await fetched.text(), content, 'content through the signed URL')

  step = 'metrics'
  const metrics = await sandbox.getMetrics()
  check(metrics.length >= 1 && metrics[0].diskTotal > 0 && metrics[0].memTotal > 0, `metrics ${JSON.stringify(metrics)}`)

  step = 'connect by id'
  const again = await Sandbox.connect(sandbox.sandboxId)
  eq((await again.commands.run('cat made/one.txt')).stdout, 'one', 'output through a connected instance')

  step = 'read missing file'
  let missing
  try {
    await sandbox.files.read('/home/user/does-not-exist')
  } catch (err) {
    missing = err
  }
  check(missing && missing.name === 'FileNotFoundError', `reading a missing file must throw FileNotFoundError, got ${missing}`)

  step = 'list by metadata'
  const paginator = Sandbox.list({ query: { metadata: { run: runId } } })
  const listed = []
  while (paginator.hasNext) listed.push(...(await paginator.nextItems()))
  eq(listed.length, 1, 'sandboxes listed for this run')
  eq(listed[0].sandboxId, sandbox.sandboxId, 'listed sandbox id')
  eq(listed[0].metadata.purpose, 'sdk-check', 'listed metadata')
  const other = Sandbox.list({ query: { metadata: { run: 'no-such-run' } } })
  eq((await other.nextItems()).length, 0, 'sandboxes listed for another run')

  step = 'pause'
  const counter = async (sbx) => Number((await sbx.files.read('counter')).trim())
  const bg = await sandbox.commands.run(
    'i=0; while :; do i=$((i+1)); echo $i > counter.tmp && mv counter.tmp counter; sleep 0.05; done',
    { background: true, timeoutMs: 0 },
  )
  await waitFor(async () => (await sandbox.files.exists('counter')) && (await counter(sandbox)) > 0, 'the background counter to count')
  eq(await sandbox.pause(), true, 'pause result')
  eq(await sandbox.pause(), false, 'second pause result (already paused)')
  eq((await Sandbox.getInfo(sandbox.sandboxId)).state, 'paused', 'state after pause')
  eq(await sandbox.isRunning(), false, 'isRunning while paused')
  const pausedList = Sandbox.list({ query: { metadata: { run: runId }, state: ['paused'] } })
  eq((await pausedList.nextItems()).length, 1, 'paused sandboxes listed for this run')
  let refused
  try {
    await sandbox.files.read('notes/hello.txt')
  } catch (err) {
    refused = err
  }
  check(refused !== undefined, 'reading a file of a paused sandbox must fail')

  step = 'connect resumes'
  const resumed = await Sandbox.connect(sandbox.sandboxId, { timeoutMs: 120_000 })
  eq((await Sandbox.getInfo(sandbox.sandboxId)).state, 'running', 'state after connect')
  eq(await resumed.files.read('notes/hello.txt'), content, 'file content after the resume')
  const counted = await counter(resumed)
  await waitFor(async () => (await counter(resumed)) > counted, 'the background counter to count on after the resume')
  check((await resumed.commands.list()).some((p) => p.pid === bg.pid), `background process ${bg.pid} listed after the resume`)
  eq(await bg.kill(), true, 'kill of the background process')

  step = 'set timeout'
  const before = Date.now()
  await sandbox.setTimeout(60_000)
  const got = await Sandbox.getInfo(sandbox.sandboxId)
  const left = got.endAt.getTime() - before
  check(left > 50_000 && left < 70_000, `endAt should be ~60 s from now, is ${left} ms`)

  step = 'kill'
  const sleeper = await sandbox.commands.run('sleep 100', { background: true, timeoutMs: 0 })
  eq(await sandbox.kill(), true, 'kill result')
  let dropped
  try {
    await sleeper.wait()
  } catch (err) {
    dropped = err
  }
  check(dropped && !(dropped instanceof CommandExitError) && /killed/.test(dropped.message),
    `a command of a killed sandbox must fail as killed, not exit, got ${dropped}`)
  eq(await sandbox.isRunning(), false, 'isRunning after kill')
  eq(await Sandbox.kill(sandbox.sandboxId), false, 'second kill reports not running')
  const after = Sandbox.list({ query: { metadata: { run: runId } } })
  eq((await after.nextItems()).length, 0, 'sandboxes listed after kill')
  let gone
  try {
    await Sandbox.getInfo(sandbox.sandboxId)
  } catch (err) {
    gone = err
  }
  check(gone && /NotFound/.test(gone.name), `getInfo after kill must throw a not-found error, got ${gone}`)
  sandbox = undefined

  step = 'timeout expiry'
  sandbox = await Sandbox.create({ metadata, timeoutMs: 60_000 })
  await sandbox.setTimeout(1_000)
  const deadline = Date.now() + 15_000
  while (await sandbox.isRunning()) {
    check(Date.now() < deadline, 'sandbox still running 15 s after a 1 s timeout')
    await new Promise((r) => setTimeout(r, 200))
  }
  const expired = Sandbox.list({ query: { metadata: { run: runId } } })
  eq((await expired.nextItems()).length, 0, 'sandboxes listed after timeout expiry')
  sandbox = undefined

  log('all checks passed')
} catch (err) {
  console.error(`sdk-check FAILED: ${step}: ${err && err.stack ? err.stack : err}`)
  if (sandbox) {
    try {
      await sandbox.kill()
    } catch {}
  }
  process.exit(1)
}
