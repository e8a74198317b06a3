/**
 * Oracle: the harness's OWN persistence backends load what sessionlog
 * exported, and find the events sessionlog holds. Copied into the harness
 * contract workspace and run by `tests/harness_oracle.rs` (see there).
 *
 * Env: ORACLE_SETS, a JSON file listing `{db, root, expected}`: a schema
 * 17 database and a current-layout JSONL root written by sessionlog, and
 * JSON lines `{header, events}` as sessionlog's store holds those sessions.
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

interface OracleSet {
  readonly db: string
  readonly root: string
  readonly expected: string
}

const sets: OracleSet[] = JSON.parse(readFileSync(process.env.ORACLE_SETS as string, 'utf8')) as OracleSet[]

function expectedOf(set: OracleSet): Expected[] {
  return readFileSync(set.expected, 'utf8')
    .split('\n')
    .filter(line => line.length > 0)
    .map(line => JSON.parse(line) as Expected)
}

function headerOf(e: Expected): Record<string, unknown> {
  const { type: _type, ...rest } = e.header
  return rest
}

it('the harness SQLite backend loads every exported session as sessionlog holds it', async () => {
  expect(sets.length).toBeGreaterThan(0)
  for (const set of sets) {
    const expected = expectedOf(set)
    const store = new SqliteStore({ path: set.db, journalMode: 'wal', busyTimeoutMs: 5000 })
    try {
      const listed = await store.list()
      expect(listed.length, set.db).toBe(expected.length)
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
  }
})

it('the harness JSONL backend loads every exported session as sessionlog holds it', async () => {
  for (const set of sets) {
    const expected = expectedOf(set)
    const ctx = new Context()
    await ctx.plugin(SessionStore)
    const fiber = await ctx.plugin(SessionPersistenceJsonl, { root: set.root })
    try {
      const backend = ctx.sessionPersistence as unknown as {
        list(): Promise<unknown[]>
        loadStored(id: never): Promise<{ meta: unknown; events: unknown[]; tornMarker?: unknown } | undefined>
      }
      expect((await backend.list()).length, set.root).toBe(expected.length)
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
  }
})
