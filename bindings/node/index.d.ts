/** Where a session's files live. */
export interface Location {
  /** Always `sessionlog-session-dir`. */
  kind: string
  /** Absolute path of the session's directory of segments. */
  path: string
}

/**
 * A streaming read of one session's stored events (`SessionLog.storedReader`).
 * `open` resolves to the head, then each `next` to a chunk of events as a JSON
 * array of whole stored batches, or null at the end; head and events come from
 * one snapshot of the session. Call `next` again only after the previous call
 * resolved (issue it before parsing the chunk it returned, so the worker writes
 * the next chunk while JavaScript parses this one).
 */
export declare class StoredReader {
  /** `{"meta","revision","tornMarker"?}` (whole log) or `{"meta"}` (from a seq); null when absent. */
  open(): Promise<string | null>
  /** The next events (about maxBytes of JSON text; a larger batch comes whole), or null at the end. */
  next(maxBytes: number): Promise<string | null>
}

/**
 * One handle on a sessionlog store: the harness's `PersistenceBackend` hooks
 * with JSON text at the boundary. Every hook but `locate` runs off the
 * JavaScript thread. Failures reject with an Error whose message starts with
 * a `SESSIONLOG_*` code (e.g. `SESSIONLOG_LOCKED: ...`). A session id holding
 * a lone UTF-16 surrogate, which the store's UTF-8 ids cannot hold, is
 * refused with `SESSIONLOG_BAD_ID`.
 */
export declare class SessionLog {
  /** `{"meta","events","revision","tornMarker"?}`, or null when absent. */
  loadStored(id: string): Promise<string | null>
  /**
   * The revision loadStored would report, or null when absent; the one
   * listSnapshots lists. Reads the session without keeping it loaded. A
   * session whose files cannot be read (damaged) has the revision
   * `sessionlog:<store id>:<incarnation>:unreadable`, and its loadStored
   * rejects with the damage (`SESSIONLOG_CORRUPT`).
   */
  readStoredRevision(id: string): Promise<string | null>
  /** `{"meta","events"}` with the events whose seq is at least fromSeq, or null. */
  loadStoredFrom(id: string, fromSeq: number): Promise<string | null>
  /** A streaming read: every event (as loadStored, taking the session) when fromSeq is null, else those from fromSeq (as loadStoredFrom). */
  storedReader(id: string, fromSeq: number | null): StoredReader
  /** Durably append a contiguous batch; the first one (isMaterialized false) publishes the session. */
  appendBatch(metaJson: string, eventsJson: string, isMaterialized: boolean): Promise<void>
  /** Retire the torn tail tornMarker names (when not null), then durably append the closers. */
  commitRepair(metaJson: string, tornMarker: number | null, closersJson: string): Promise<void>
  /** `SessionHeader[]` of the stored sessions. */
  list(): Promise<string>
  /**
   * `{"header","revision"}[]` of the stored sessions (those `list` lists), each
   * revision as readStoredRevision reports it. A damaged session is listed, with
   * its `...:unreadable` revision (its loadStored reports the damage); one deleted
   * while the listing runs is left out. A transient failure (out of file
   * descriptors or memory for a moment) rejects the listing rather than
   * making up a revision. Keeps no session loaded, so a listing past
   * `maxOpenSessions` releases none of this process's sessions or writer locks.
   */
  listSnapshots(): Promise<string>
  /** The session's directory (computed; no disk access). */
  locate(metaJson: string): Location | null
  /** Flush and release this handle; the last handle on a root closes the store. */
  close(): Promise<void>
}

/**
 * Store options of `openSessionLog`; each is off when absent. Every handle on
 * one root in a process shares one store, so all must pass the same options:
 * the first hook of a handle that differs rejects with `SESSIONLOG_OPTIONS`.
 */
export interface OpenOptions {
  /** Store sealed segments compressed, by a background thread (raises the store to the newest format version, 5). */
  compressSealed?: boolean
  /** Share one sync among the durable appends of many sessions (a store-wide journal). */
  journal?: boolean
  /**
   * Sessions kept loaded at once (default 512). A session this process wrote
   * stays its own (another process's append gets `SESSIONLOG_LOCKED`) while it
   * is loaded; past this many, the least recently used idle ones are released,
   * writer lock included. Size it to the sessions one process owns at once.
   */
  maxOpenSessions?: number
}

/** Open (creating if absent) the store at an absolute root; the disk is touched by the first hook. */
export declare function openSessionLog(root: string, options?: OpenOptions): SessionLog

/** Test-only: leave a torn record after session id's durable end. Close every handle on root first. */
export declare function corruptTailForTest(root: string, id: string, cwd: string | null): Promise<void>

/**
 * Test-only: `listSnapshots` of the store open at root in this process, with the
 * sessions ids deleted by another handle after the listing read the sessions
 * directory and before it computed any revision (a deletion racing the listing).
 */
export declare function listSnapshotsDeletingForTest(root: string, ids: string[]): Promise<string>
