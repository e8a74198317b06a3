/**
 * sessionlog as the agent harness's session persistence: a Cordis plugin
 * that provides `ctx.sessionPersistence` over a sessionlog store, the way
 * the harness's own `SqliteSessionPersistence` does over SQLite.
 *
 * ```ts
 * import SessionLogPersistence from '@sessionlog/node/src/plugin.ts'
 * ctx.plugin(SessionStore)
 * ctx.plugin(SessionLogPersistence, { root: '/var/lib/agent/sessions' })
 * ```
 *
 * The native addon (`../index.js`, built by `npm run build`) stores and
 * reads; the harness's `PersistenceCoordinator` does everything else
 * (write-behind batching, seq contiguity, adoption of live sessions, crash
 * repair, format-version and unknown-event refusal, legacy normalization),
 * exactly as for the first-party backends. Only the hook level of the
 * harness's persistence interface is implemented here.
 *
 * This file imports the harness's own packages (`@deepseek-ai/cordis`,
 * `@deepseek-ai/schemastery`, `@deepseek-ai/dsh-session`,
 * `@deepseek-ai/dsh-session-persistence`), so it is compiled inside the
 * harness's workspace; `run-harness-suites.sh plugin` mounts it there and
 * runs the harness's contract suites against it.
 * @module @sessionlog/node/plugin
 */

import { createRequire } from 'node:module'
import { resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Context, Service } from '@deepseek-ai/cordis'
import z from '@deepseek-ai/schemastery'
import type { SessionEvent, SessionHeader, SessionId, SessionPreparation } from '@deepseek-ai/dsh-session'
import {
  DEFAULT_PREPARED_SESSION_CACHE_SIZE,
  DEFAULT_WRITE_BATCH_MAX_DELAY_MS,
  MAX_WRITE_BATCH_DELAY_MS,
  PersistenceCoordinator,
  SessionPersistence,
  SessionPersistenceRevision,
  type PersistenceBackend,
  type SessionInspection,
  type SessionLocation,
  type SessionPersistenceSnapshot,
  type StoredPrefix,
  type StoredSuffix,
} from '@deepseek-ai/dsh-session-persistence'

/** One handle on a store, as the addon's `openSessionLog` returns it (see `index.d.ts`). */
export interface NativeSessionLog {
  loadStored(id: string): Promise<string | null>
  readStoredRevision(id: string): Promise<string | null>
  loadStoredFrom(id: string, fromSeq: number): Promise<string | null>
  storedReader(id: string, fromSeq: number | null): NativeStoredReader
  appendBatch(metaJson: string, eventsJson: string, isMaterialized: boolean): Promise<void>
  commitRepair(metaJson: string, tornMarker: number | null, closersJson: string): Promise<void>
  list(): Promise<string>
  listSnapshots(): Promise<string>
  locate(metaJson: string): SessionLocation | null
  close(): Promise<void>
}

/** A streaming read of one session's events (see `index.d.ts`). */
export interface NativeStoredReader {
  open(): Promise<string | null>
  next(maxBytes: number): Promise<string | null>
}

/** Store options of `openSessionLog` (see `index.d.ts`); each is off when absent. */
export interface NativeOpenOptions {
  compressSealed?: boolean
  journal?: boolean
  maxOpenSessions?: number
}

/** The addon module. */
export interface NativeSessionLogModule {
  openSessionLog(root: string, options?: NativeOpenOptions): NativeSessionLog
}

/**
 * A failure reported by the store. `code` is the `SESSIONLOG_*` prefix of
 * the addon's message, e.g. `SESSIONLOG_LOCKED` when another process holds
 * the store's write lock, `SESSIONLOG_REJECTED` for a batch the store
 * refused, `SESSIONLOG_CORRUPT` for damage a crash cannot explain.
 */
export class SessionLogError extends Error {
  override readonly name = 'SessionLogError'
  /**
   * @param code - the stable `SESSIONLOG_*` code.
   * @param message - the store's explanation.
   * @param options - the addon's original error.
   */
  constructor(readonly code: string, message: string, options?: ErrorOptions) {
    super(message, options)
  }
}

/** Give an addon rejection its `SESSIONLOG_*` code as a typed error. */
function typed(error: unknown): unknown {
  const match = error instanceof Error ? /^(SESSIONLOG_[A-Z_]+): ([\s\S]*)$/.exec(error.message) : null
  return match === null ? error : new SessionLogError(match[1]!, match[2]!, { cause: error })
}

/** Await an addon call, rethrowing its failure as a {@link SessionLogError}. */
async function call<T>(work: () => Promise<T>): Promise<T> {
  try {
    return await work()
  } catch (error: unknown) {
    throw typed(error)
  }
}

/** Load the addon from `path` (default: this package's `index.js`) with Node's own require. */
export function loadNativeModule(path?: string): NativeSessionLogModule {
  const entry = path ?? fileURLToPath(new URL('../index.js', import.meta.url))
  return createRequire(import.meta.url)(resolve(entry)) as NativeSessionLogModule
}

/**
 * Text the addon writes per chunk of a streaming read: large enough that the
 * per-call cost is nothing (~250 chunks for a 1.3M-event log), small
 * enough that JavaScript holds little text at once and starts parsing early.
 */
const READ_CHUNK_BYTES = 1 << 20

/**
 * Reads a session's events through the addon's streaming reader: the head
 * (parsed), then the events, chunk by chunk. The next chunk is requested
 * before this one is parsed, so the worker writes it while the JavaScript
 * thread parses; no string of the whole log's text ever exists.
 */
async function readStored<Head>(reader: NativeStoredReader): Promise<{ head: Head, events: SessionEvent[] } | undefined> {
  const headText = await call(() => reader.open())
  if (headText === null) return undefined
  const head = JSON.parse(headText) as Head
  const events: SessionEvent[] = []
  let pending = call(() => reader.next(READ_CHUNK_BYTES))
  for (;;) {
    const text = await pending
    if (text === null) break
    pending = call(() => reader.next(READ_CHUNK_BYTES))
    let chunk: SessionEvent[]
    try {
      chunk = JSON.parse(text) as SessionEvent[]
    } catch (error: unknown) {
      pending.catch(() => undefined) // nobody awaits it any more
      throw error
    }
    for (const event of chunk) events.push(event)
  }
  return { head, events }
}

/**
 * The harness's storage hooks over one native handle. The torn marker is the
 * byte offset where the store found a torn record; events and headers cross
 * as JSON text (so strings with lone UTF-16 surrogates survive: see the
 * README), and every parse yields fresh, unaliased objects as the
 * coordinator requires.
 */
export class NativeSessionLogBackend implements PersistenceBackend<number> {
  readonly name = 'session-persistence-sessionlog'

  /** @param native - the handle; closed by {@link close}. */
  constructor(private readonly native: NativeSessionLog) {}

  async loadStored(id: SessionId, signal?: AbortSignal): Promise<StoredPrefix<number> | undefined> {
    signal?.throwIfAborted()
    const stored = await readStored<{ meta: SessionHeader, revision: string, tornMarker?: number }>(
      this.native.storedReader(id, null))
    signal?.throwIfAborted()
    if (stored === undefined) return undefined
    const { head } = stored
    return {
      meta: head.meta,
      events: stored.events,
      revision: SessionPersistenceRevision(head.revision),
      ...head.tornMarker === undefined ? {} : { tornMarker: head.tornMarker },
    }
  }

  async readStoredRevision(id: SessionId, signal?: AbortSignal): Promise<SessionPersistenceRevision | undefined> {
    signal?.throwIfAborted()
    const revision = await call(() => this.native.readStoredRevision(id))
    return revision === null ? undefined : SessionPersistenceRevision(revision)
  }

  /** Seek read: the store decodes only the batches holding `seq >= fromSeq`. */
  async loadStoredFrom(id: SessionId, fromSeq: number, signal?: AbortSignal): Promise<StoredSuffix | undefined> {
    signal?.throwIfAborted()
    const stored = await readStored<{ meta: SessionHeader }>(this.native.storedReader(id, fromSeq))
    signal?.throwIfAborted()
    return stored === undefined ? undefined : { meta: stored.head.meta, events: stored.events }
  }

  async appendBatch(meta: SessionHeader, events: readonly SessionEvent[], isMaterialized: boolean): Promise<void> {
    await call(() => this.native.appendBatch(JSON.stringify(meta), JSON.stringify(events), isMaterialized))
  }

  async commitRepair(meta: SessionHeader, tornMarker: number | undefined, closers: readonly SessionEvent[]): Promise<void> {
    await call(() => this.native.commitRepair(JSON.stringify(meta), tornMarker ?? null, JSON.stringify(closers)))
  }

  async list(signal?: AbortSignal): Promise<SessionHeader[]> {
    signal?.throwIfAborted()
    const text = await call(() => this.native.list())
    signal?.throwIfAborted()
    return JSON.parse(text) as SessionHeader[]
  }

  /** Every stored session's header with its revision. */
  async listSnapshots(signal?: AbortSignal): Promise<SessionPersistenceSnapshot[]> {
    signal?.throwIfAborted()
    const text = await call(() => this.native.listSnapshots())
    signal?.throwIfAborted()
    return (JSON.parse(text) as Array<{ header: SessionHeader; revision: string }>)
      .map(({ header, revision }) => ({ header, revision: SessionPersistenceRevision(revision) }))
  }

  /** The session's directory of segments (computed, no disk access). */
  locate(meta: SessionHeader): SessionLocation | undefined {
    return this.native.locate(JSON.stringify(meta)) ?? undefined
  }

  async close(): Promise<void> {
    await call(() => this.native.close())
  }
}

/** Plugin configuration. */
export interface Config {
  /** Store root directory (created when missing). Relative paths resolve against the process's cwd. */
  root: string
  /** Path of the addon's `index.js`; defaults to the one beside this package. */
  addon?: string
  /** Maximum cold Session preparations retained for history-to-resume reuse. */
  preparedSessionCacheSize?: number
  /** Fixed live-event coalescing window (ms); not a completion deadline. */
  writeBatchMaxDelayMs?: number
  /**
   * Store sealed segments compressed, by a background thread (the store's
   * `Options::compress_sealed`; default off): sealed data takes about
   * 0.2-0.4x the bytes of plain JSONL, and reads of it decode it.
   */
  compressSealed?: boolean
  /**
   * Share one sync among the durable appends of many sessions (the store's
   * `Options::journal`; default off): for a host writing many sessions at once.
   */
  journal?: boolean
  /**
   * Sessions the store keeps loaded, and owned when this process writes them
   * (default 512): past it the least recently used idle ones are released,
   * writer lock included, so another process may write them.
   */
  maxOpenSessions?: number
}

/**
 * `SessionPersistence` over a sessionlog store. Mount it instead of the
 * JSONL or SQLite plugin; several mounts on one root in a process share one
 * store (a hot reload re-mounts while the old instance drains).
 */
export class SessionLogPersistence extends SessionPersistence {
  override readonly supportsRawArtifacts = false
  override readonly name = 'session-persistence-sessionlog'

  static inject = ['sessions']

  static Config: z<Config> = z.object({
    root: z.string().required().description('Store root directory.'),
    addon: z.string().description('Path of the native addon entry (index.js); defaults to the bundled one.'),
    preparedSessionCacheSize: z.number().step(1).min(1).default(DEFAULT_PREPARED_SESSION_CACHE_SIZE),
    writeBatchMaxDelayMs: z.number().step(1).min(1).max(MAX_WRITE_BATCH_DELAY_MS)
      .default(DEFAULT_WRITE_BATCH_MAX_DELAY_MS),
    compressSealed: z.boolean().default(false)
      .description('Store sealed segments compressed, in the background.'),
    journal: z.boolean().default(false)
      .description('Share one sync among the appends of many sessions.'),
    maxOpenSessions: z.number().step(1).min(1).default(512)
      .description('Sessions kept loaded (and owned, when written) at once.'),
  })

  private readonly backend: NativeSessionLogBackend
  private readonly coordinator: PersistenceCoordinator<number>

  constructor(ctx: Context, public config: Config) {
    super(ctx)
    const native = loadNativeModule(config.addon).openSessionLog(resolve(config.root), {
      compressSealed: config.compressSealed ?? false,
      journal: config.journal ?? false,
      maxOpenSessions: config.maxOpenSessions ?? 512,
    })
    this.backend = new NativeSessionLogBackend(native)
    this.coordinator = new PersistenceCoordinator(this.ctx, this.backend, {
      preparedSessionCacheSize: config.preparedSessionCacheSize ?? DEFAULT_PREPARED_SESSION_CACHE_SIZE,
      writeBatchMaxDelayMs: config.writeBatchMaxDelayMs ?? DEFAULT_WRITE_BATCH_MAX_DELAY_MS,
    })
  }

  /**
   * Open the store before the service is published, so a store another
   * process holds fails the mount (`SESSIONLOG_LOCKED`) instead of the
   * first write.
   */
  protected async [Service.init](): Promise<void> {
    // Any hook opens the store; the empty id is never stored, so this one
    // reads nothing.
    await this.backend.readStoredRevision('' as SessionId)
  }

  locate(meta: SessionHeader): SessionLocation | undefined {
    return this.backend.locate(meta)
  }

  create(meta: SessionHeader): Promise<void> {
    return this.coordinator.create(meta)
  }

  append(id: SessionId, events: readonly SessionEvent[]): Promise<void> {
    return this.coordinator.append(id, events)
  }

  override prepare(id: SessionId, signal?: AbortSignal): Promise<SessionPreparation> {
    return this.coordinator.prepare(id, signal)
  }

  load(id: SessionId): Promise<SessionInspection> {
    return this.coordinator.load(id)
  }

  inspect(id: SessionId, signal?: AbortSignal): Promise<SessionInspection> {
    return this.coordinator.inspect(id, signal)
  }

  readFrom(id: SessionId, fromSeq: number, signal?: AbortSignal): Promise<{ meta: SessionHeader; events: SessionEvent[] }> {
    return this.coordinator.readFrom(id, fromSeq, signal)
  }

  list(signal?: AbortSignal): Promise<SessionHeader[]> {
    return this.backend.list(signal)
  }

  listSnapshots(signal?: AbortSignal): Promise<SessionPersistenceSnapshot[]> {
    return this.backend.listSnapshots(signal)
  }
}

export default SessionLogPersistence
