/**
 * Invariant companion of the sessionlog plugin inside the harness's
 * workspace. The harness's Vitest setup refuses to run a package test whose
 * package has no `src/invariant.ts`; like the first-party persistence
 * backends' companions it installs nothing.
 * @module @deepseek-ai/dsh-session-persistence-sessionlog-node/invariant
 */

import type { Context } from '@deepseek-ai/cordis'
import type { InvariantInstaller } from '@deepseek-ai/dsh-invariants'

const PACKAGE_NAME = '@deepseek-ai/dsh-session-persistence-sessionlog-node'

/** Cordis companion plugin name. */
export const name = 'session-persistence-sessionlog-node-invariant'
/** Service required before the companion can reserve package ownership. */
export const inject = ['invariants']

/** No runtime invariant: correctness is pinned by the shared contract suites. */
const install: InvariantInstaller = () => {}

/**
 * Register this package's invariant companion.
 * @param ctx - Cordis context carrying the invariant service.
 * @returns the installed registration's disposer after setup succeeds.
 */
export const apply = (ctx: Context): Promise<() => void> =>
  Promise.resolve(ctx.invariants.register(PACKAGE_NAME, install))
