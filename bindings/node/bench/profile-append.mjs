// A V8 CPU profile of one append cell of bench.mjs: the coordinator's public
// `append(id, batch of N)` into a fresh store of one backend.
//
//   HARNESS_ENV=DIR node --expose-gc bench/profile-append.mjs BACKEND N EVENTS OUT.cpuprofile
// (run it with the harness's Node 24); then bench/profile-summary.mjs OUT.cpuprofile
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { Session } from 'node:inspector/promises'
import { join, resolve } from 'node:path'
import { tmpdir } from 'node:os'
import { fileURLToPath } from 'node:url'
import { loadHarness } from './harness.mjs'
import { sessionEvents } from './events.mjs'

const [backend, n, count, out] = process.argv.slice(2)
const batch = Number(n)
const pkg = resolve(fileURLToPath(new URL('..', import.meta.url)))
const { harness: h, close } = await loadHarness(resolve(process.env.HARNESS_ENV ?? join(pkg, '../../target/harness-env')))
const dir = mkdtempSync(join(process.env.BENCH_DIR ?? tmpdir(), 'profile-append-'))
const ctx = new h.Context()
await ctx.plugin(h.SessionStore)
const plugins = {
  'jsonl-zstd': [h.SessionPersistenceJsonl, { root: join(dir, 'jsonl') }],
  sqlite: [h.SessionPersistenceSqlite, { path: join(dir, 'sessions.db') }],
  sessionlog: [h.SessionLogPersistence, { root: join(dir, 'sessionlog'), addon: join(pkg, 'index.js') }],
}
const fiber = await ctx.plugin(...plugins[backend])
const p = ctx.sessionPersistence
const events = sessionEvents(Number(count), { closed: true })
const id = h.SessionId('append')
await p.create({ version: h.SESSION_FORMAT_VERSION, id, createdAt: 1_780_000_000_000, cwd: '/work/project' })
const profiler = new Session()
profiler.connect()
await profiler.post('Profiler.enable')
await profiler.post('Profiler.setSamplingInterval', { interval: 200 })
await profiler.post('Profiler.start')
const t = performance.now()
for (let i = 0; i < events.length; i += batch) await p.append(id, events.slice(i, i + batch))
const ms = performance.now() - t
const { profile } = await profiler.post('Profiler.stop')
writeFileSync(out, JSON.stringify(profile))
console.log(`${backend} batch ${batch}: ${events.length} events in ${ms.toFixed(0)} ms (${(events.length / ms * 1000).toFixed(0)} events/s)`)
await fiber.dispose()
await close()
rmSync(dir, { recursive: true, force: true })
