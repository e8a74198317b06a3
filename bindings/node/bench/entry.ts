// The harness modules the benchmark drives, loaded through the harness
// workspace's own Vite pipeline (see harness.mjs).
export { Context } from '@deepseek-ai/cordis'
export { default as SessionStore, SESSION_FORMAT_VERSION, SessionId } from '@deepseek-ai/dsh-session'
export { PersistenceCoordinator } from '@deepseek-ai/dsh-session-persistence'
export { default as SessionPersistenceJsonl } from '@deepseek-ai/dsh-session-persistence-jsonl'
export { default as SessionPersistenceSqlite } from '@deepseek-ai/dsh-session-persistence-sqlite'
export { default as SessionLogPersistence } from '../src/plugin.ts'
