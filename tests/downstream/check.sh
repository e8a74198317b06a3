#!/usr/bin/env bash
# Proves the library's public API is what src/lib.rs curates, and no more:
# 1. a downstream crate (this directory) that uses the public API the way an
#    embedder does compiles;
# 2. the binary and the Node binding compile without the `internals`
#    feature (they use the public API only);
# 3. each probe naming one of the engine's internals (`sessionlog::segment`,
#    `sessionlog::vfs`, `Store::open_with_vfs`, ...) fails to compile, with a
#    name-resolution or privacy error, without the feature, and compiles
#    with `--features sessionlog/internals` (so the probe itself is right).
# Run by .ci/run; fails on the first surprise.
set -euo pipefail
cd "$(dirname "$0")/../.."
pkg=sessionlog-downstream

echo "-- the public API is enough: $pkg compiles"
cargo check -q -p "$pkg"
echo "-- the binary and the Node binding use the public API only"
cargo check -q -p sessionlog --bin sessionlog
cargo check -q -p sessionlog-node

probes=$(sed -n 's/^\(probe-[a-z-]*\) = \[\]$/\1/p' tests/downstream/Cargo.toml)
[ -n "$probes" ] || { echo "no probes found in tests/downstream/Cargo.toml" >&2; exit 1; }
for probe in $probes; do
  if out=$(cargo check -p "$pkg" --features "$probe" --message-format short 2>&1); then
    echo "FAIL: $probe compiles without the internals feature: the internal item is public" >&2
    exit 1
  fi
  # Unresolved import or path, private item, no such associated function.
  if ! grep -qE 'error\[E(0432|0433|0599|0603)\]' <<<"$out"; then
    echo "FAIL: $probe failed to compile for another reason than reachability:" >&2
    echo "$out" >&2
    exit 1
  fi
  if ! cargo check -q -p "$pkg" --features "$probe sessionlog/internals"; then
    echo "FAIL: $probe does not compile even with the internals feature: fix the probe" >&2
    exit 1
  fi
  echo "-- $probe: out of reach without the internals feature"
done
echo "-- public API check passed"
