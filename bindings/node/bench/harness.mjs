// Loads the agent harness's TypeScript (its PersistenceCoordinator, its
// JSONL and SQLite backends, and this package's src/plugin.ts) the way the
// harness's vitest setup does: Vite's module runner with the workspace's
// own plugins (vite-tsconfig-paths over tsconfig.base.json, which maps every
// `@deepseek-ai/*` import to TypeScript source, and the standard-decorator
// transform from vitest.shared.ts). No file is written into the workspace.
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const here = fileURLToPath(new URL('.', import.meta.url))

/**
 * Resolves `@deepseek-ai/*` imports of the files outside the workspace (this
 * directory's entry.ts and ../src/plugin.ts) as the workspace's own files
 * resolve them: vite-tsconfig-paths applies tsconfig.base.json's `paths` only
 * to importers inside the workspace.
 * @param {string} dir - the workspace root
 */
function workspaceImports(dir) {
  const inside = join(dir, 'packages', 'bench-importer.ts')
  return {
    name: 'sessionlog-bench-workspace-imports',
    enforce: 'pre',
    async resolveId(source, importer, options) {
      if (!source.startsWith('@deepseek-ai/') || importer === undefined || importer.startsWith(dir + '/')) return null
      return this.resolve(source, inside, { ...options, skipSelf: true })
    },
  }
}

/**
 * @param {string} dir - a harness environment made by harness-contract/setup.sh
 * @returns {Promise<{ harness: any, close: () => Promise<void> }>}
 */
export async function loadHarness(dir) {
  const from = p => import(pathToFileURL(join(dir, p)).href)
  const vite = await from('node_modules/vite/dist/node/index.js')
  const tsconfigPaths = (await from('node_modules/vite-tsconfig-paths/dist/index.js')).default
  const { standardDecoratorPlugin } = await from('vitest.shared.ts')
  const server = await vite.createServer({
    root: dir,
    configFile: false,
    logLevel: 'error',
    plugins: [workspaceImports(dir), tsconfigPaths({ root: dir, projects: ['./tsconfig.base.json'] }), standardDecoratorPlugin()],
    server: { middlewareMode: true, hmr: false, ws: false, watch: null },
    optimizeDeps: { noDiscovery: true, include: [] },
  })
  const runner = vite.createServerModuleRunner(server.environments.ssr, { hmr: false })
  const harness = await runner.import(join(here, 'entry.ts'))
  return {
    harness,
    close: async () => { await runner.close(); await server.close() },
  }
}
