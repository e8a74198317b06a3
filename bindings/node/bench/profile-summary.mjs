// Summarizes a V8 .cpuprofile (as `BENCH_CPU_PROF=DIR npm run bench` writes
// them for the measured call of each child): where the main thread's time
// went, by function, self and inclusive.
//
//   node bench/profile-summary.mjs FILE.cpuprofile [TOP]
import { readFileSync } from 'node:fs'
import { basename } from 'node:path'

const [file, topArg] = process.argv.slice(2)
const top = Number(topArg ?? 15)
const profile = JSON.parse(readFileSync(file, 'utf8'))
const byId = new Map(profile.nodes.map(n => [n.id, n]))
const parent = new Map()
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)

const label = (n) => {
  const f = n.callFrame
  const name = f.functionName || '(anonymous)'
  if (!f.url) return name
  return `${name} ${basename(f.url.replace(/\?.*$/, ''))}:${f.lineNumber + 1}`
}

const self = new Map()
const inclusive = new Map()
let total = 0
const { samples, timeDeltas } = profile
for (let i = 0; i < samples.length; i++) {
  const dt = (timeDeltas[i + 1] ?? timeDeltas[i] ?? 0) / 1000
  total += dt
  let node = byId.get(samples[i])
  const l = label(node)
  self.set(l, (self.get(l) ?? 0) + dt)
  const seen = new Set()
  while (node !== undefined) {
    const ln = label(node)
    if (!seen.has(ln)) {
      seen.add(ln)
      inclusive.set(ln, (inclusive.get(ln) ?? 0) + dt)
    }
    node = byId.get(parent.get(node.id))
  }
}

const table = (title, map) => {
  console.log(`\n${title} (of ${total.toFixed(0)} ms sampled):\n`)
  console.log('| ms | share | function |')
  console.log('|---:|---:|---|')
  for (const [l, ms] of [...map].sort((a, b) => b[1] - a[1]).slice(0, top)) {
    console.log(`| ${ms.toFixed(0)} | ${(100 * ms / total).toFixed(1)}% | ${l.replaceAll('|', '\\|')} |`)
  }
}
console.log(`${basename(file)}`)
table('Self time', self)
table('Inclusive time', inclusive)
