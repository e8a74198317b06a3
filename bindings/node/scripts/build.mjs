// Builds the addon (`cargo build --release -p sessionlog-node`) and copies
// the cdylib next to index.js as `sessionlog.node`, the name index.js loads.
// The artifact path comes from cargo's own JSON messages, so CARGO_TARGET_DIR
// and workspace layout changes need no edit here. No npm dependencies.
import { spawnSync } from 'node:child_process'
import { copyFileSync, renameSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(dirname(fileURLToPath(import.meta.url)))
const cargo = process.env.CARGO ?? 'cargo'
const run = spawnSync(
  cargo,
  ['build', '--release', '-p', 'sessionlog-node', '--message-format=json-render-diagnostics'],
  { cwd: here, stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 256 << 20 },
)
if (run.error) throw run.error
if (run.status !== 0) process.exit(run.status ?? 1)
let artifact
for (const line of run.stdout.toString().split('\n')) {
  if (!line.startsWith('{')) continue
  const msg = JSON.parse(line)
  if (msg.reason === 'compiler-artifact' && msg.target?.name === 'sessionlog_node'
    && msg.target.kind.includes('cdylib')) {
    artifact = msg.filenames.find(f => /\.(so|dylib|dll)$/.test(f))
  }
}
if (artifact === undefined) {
  console.error('build: cargo reported no cdylib for sessionlog-node')
  process.exit(1)
}
// Copy then rename: a process that has the old addon loaded keeps its
// mapping (overwriting a loaded .so in place can crash it).
const out = join(here, 'sessionlog.node')
copyFileSync(artifact, `${out}.tmp`)
renameSync(`${out}.tmp`, out)
console.log(`build: ${artifact} -> ${out}`)
