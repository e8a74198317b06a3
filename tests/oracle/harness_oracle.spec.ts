/**
 * Oracle: the harness's OWN persistence backends load what sessionlog
 * exported, and find the events sessionlog holds. Copied into the harness
 * contract workspace and run by `tests/harness_oracle.rs` (see there).
 *
 * Env: ORACLE_DB (a schema 17 database written by `sessionlog export`),
 * ORACLE_ROOT (a JSONL root in the current layout), ORACLE_EXPECTED (JSON
 * lines `{header, events}` as sessionlog's store holds them).
 */
import { readFileSync } from 'node:fs'
import { expect, it } from 'vitest'
import { Context } from '@deepseek-ai/cordis'
import SessionStore from '@deepseek-ai/dsh-session'
import SessionPersistenceJsonl from '@deepseek-ai/dsh-session-persistence-jsonl'
import { SqliteStore } from '../src/store.ts'

interface Expected {
  readonly header: Record<string, unknown>
  readonly events: unknown[]
}

const expected: Expected[] = readFileSync(process.env.ORACLE_EXPECTED as string, 'utf8')
  .split('\n')
  .filter(line => line.length > 0)
  .map(line => JSON.parse(line) as Expected)

function headerOf(e: Expected): Record<string, unknown> {
  const { type: _type, ...rest } = e.header
  return rest
}

it('the harness SQLite backend loads every exported session as sessionlog holds it', async () => {
  const store = new SqliteStore({ path: process.env.ORACLE_DB as string, journalMode: 'wal', busyTimeoutMs: 5000 })
  try {
    const listed = await store.list()
    expect(listed.length).toBe(expected.length)
    for (const e of expected) {
      const id = e.header.id as never
      const stored = await store.loadStored(id)
      expect(stored, String(id)).toBeDefined()
      expect(stored?.tornMarker, String(id)).toBeUndefined()
      expect(stored?.meta, String(id)).toEqual(headerOf(e))
      expect(stored?.events, String(id)).toEqual(e.events)
    }
  } finally {
    await store.close()
  }
})

it('the harness JSONL backend loads every exported session as sessionlog holds it', async () => {
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const fiber = await ctx.plugin(SessionPersistenceJsonl, { root: process.env.ORACLE_ROOT as string })
  try {
    const backend = ctx.sessionPersistence as unknown as {
      list(): Promise<unknown[]>
      loadStored(id: never): Promise<{ meta: unknown; events: unknown[]; tornMarker?: unknown } | undefined>
    }
    expect((await backend.list()).length).toBe(expected.length)
    for (const e of expected) {
      const id = e.header.id as never
      const stored = await backend.loadStored(id)
      expect(stored, String(id)).toBeDefined()
      expect(stored?.tornMarker, String(id)).toBeUndefined()
      expect(stored?.meta, String(id)).toEqual(headerOf(e))
      expect(stored?.events, String(id)).toEqual(e.events)
    }
  } finally {
    await fiber.dispose()
  }
})
