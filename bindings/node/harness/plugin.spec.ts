/**
 * The harness's own persistence suites against sessionlog's Cordis plugin
 * (`bindings/node/src/plugin.ts`, copied into the harness workspace as this
 * package's `src/index.ts` by `run-harness-suites.sh`), the way the JSONL and
 * SQLite specs call them. The addon is the one named by SESSIONLOG_BACKEND.
 */

import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, expect, it } from 'vitest'
import { Context } from '@deepseek-ai/cordis'
import SessionStore from '@deepseek-ai/dsh-session'
import { runPersistenceContract, type ContractBackend } from '../../session-persistence/tests/contract.ts'
import { runCoordinatorContract, type CoordinatorFixture } from '../../session-persistence/tests/coordinator-contract.ts'
import SessionLogPersistence, { loadNativeModule, SessionLogError, type Config } from '../src/index.ts'

const addon = process.env['SESSIONLOG_BACKEND']
if (addon === undefined || addon === '') throw new Error('set SESSIONLOG_BACKEND to the addon index.js')
const corrupt = (loadNativeModule(addon) as unknown as {
  corruptTailForTest: (root: string, id: string, cwd: string | null) => Promise<void>
}).corruptTailForTest

describe('sessionlog plugin', () => {
  it('validates its config and types store failures', async () => {
    expect(() => SessionLogPersistence.Config({} as unknown as Config)).toThrow()
    expect(SessionLogPersistence.Config({ root: '/x' }))
      .toMatchObject({ root: '/x', preparedSessionCacheSize: 5, compressSealed: false, journal: false })
    expect(SessionLogPersistence.Config({ root: '/x', journal: true })).toMatchObject({ journal: true })
    const root = await mkdtemp(join(tmpdir(), 'dsh-sessionlog-plugin-'))
    const native = loadNativeModule(addon).openSessionLog(root)
    try {
      const error = await native.appendBatch('{"version":0,"id":"a","createdAt":1,"extra":1}', '[]', false)
        .then(() => undefined, (e: unknown) => e)
      expect(String(error)).toMatch(/SESSIONLOG_BAD_INPUT/)
      expect(new SessionLogError('SESSIONLOG_X', 'm').code).toBe('SESSIONLOG_X')
    } finally {
      await native.close()
      await rm(root, { recursive: true, force: true })
    }
  })
})

describe('sessionlog plugin listSnapshots', () => {
  it('lists a damaged session beside the others, and its load reports the damage', async () => {
    const root = await mkdtemp(join(tmpdir(), 'dsh-sessionlog-plugin-'))
    const native = loadNativeModule(addon).openSessionLog(root)
    const meta = (id: string) => JSON.stringify({ version: 1, id, createdAt: 1, cwd: '/w' })
    for (const id of ['a', 'b', 'c']) {
      await native.appendBatch(meta(id), '[{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}]', false)
    }
    await native.close()
    // Flip a byte of b's last record: the checkpoint's end is not there.
    const dir = native.locate(meta('b'))!.path
    const seg = join(dir, (await readdir(dir)).find(n => n.endsWith('.seg'))!)
    const bytes = await readFile(seg)
    let end = bytes.length
    while (end > 0 && bytes[end - 1] === 0) end--
    bytes[end - 10] = (bytes[end - 10] as number) ^ 0xff
    await writeFile(seg, bytes)
    const ctx = new Context()
    await ctx.plugin(SessionStore)
    const fiber = await ctx.plugin(SessionLogPersistence, { root, addon })
    try {
      const listed = await ctx.sessionPersistence.listSnapshots()
      expect(listed.map(s => s.header.id)).toEqual(['a', 'b', 'c'])
      expect(listed.map(s => s.header)).toEqual(await ctx.sessionPersistence.list())
      expect(String(listed[1]?.revision)).toMatch(/:unreadable$/)
      const error = await ctx.sessionPersistence.load(listed[1]!.header.id).then(() => undefined, (e: unknown) => e)
      expect(error).toBeInstanceOf(SessionLogError)
      expect((error as SessionLogError).code).toBe('SESSIONLOG_CORRUPT')
    } finally {
      await fiber.dispose()
      await rm(root, { recursive: true, force: true })
    }
  })
})

describe('sessionlog plugin options', () => {
  it('reach the store: compressSealed raises its format, journal keeps a journal', async () => {
    for (const [options, version, journal] of [
      [{}, 3, false],
      [{ compressSealed: true, journal: true }, 5, true],
    ] as const) {
      const root = await mkdtemp(join(tmpdir(), 'dsh-sessionlog-plugin-'))
      const ctx = new Context()
      await ctx.plugin(SessionStore)
      // The mount opens the store (Service.init), before any session is written.
      const fiber = await ctx.plugin(SessionLogPersistence, { root, addon, ...options })
      try {
        // format-spec.md section 2: the store format version is a u32 at byte 8.
        expect((await readFile(join(root, 'MANIFEST'))).readUInt32LE(8)).toBe(version)
        const wal = await readdir(join(root, 'journal')).then(names => names.some(n => n.endsWith('.wal')), () => false)
        expect(wal).toBe(journal)
      } finally {
        await fiber.dispose()
        await rm(root, { recursive: true, force: true })
      }
    }
  })
})

runPersistenceContract('sessionlog plugin', async (): Promise<ContractBackend> => {
  const root = await mkdtemp(join(tmpdir(), 'dsh-sessionlog-plugin-'))
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const fiber = await ctx.plugin(SessionLogPersistence, { root, addon })
  return {
    persistence: ctx.sessionPersistence,
    dispose: async () => {
      await fiber.dispose()
      await rm(root, { recursive: true, force: true })
    },
  }
})

for (const [name, options] of [
  ['sessionlog plugin', {}],
  // The store options change how an append becomes durable (a shared
  // journal) and what sealed data looks like on disk, not what the hooks do.
  ['sessionlog plugin, compressSealed + journal', { compressSealed: true, journal: true }],
] as const) {
  runCoordinatorContract(name, async (): Promise<CoordinatorFixture> => {
    const root = await mkdtemp(join(tmpdir(), 'dsh-sessionlog-plugin-coord-'))
    return {
      mount: async ctx => ctx.plugin(SessionLogPersistence, { root, addon, ...options }),
      corruptTail: async (id, cwd) => { await corrupt(root, id, cwd ?? null) },
      cleanup: async () => { await rm(root, { recursive: true, force: true }) },
    }
  })
}
