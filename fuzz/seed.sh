#!/usr/bin/env bash
# Seeds the fuzz corpora (fuzz/corpus/TARGET, not committed) from the harness
# JSONL fixtures and from the files of a real store.
#
#   fuzz/seed.sh                    # fixtures from ../../shared/fixtures/harness-jsonl
#   FIXTURES=/path/to/jsonl fuzz/seed.sh
#
# Needs cargo-fuzz (cargo install cargo-fuzz). Safe to run again: existing
# corpus entries are kept.
set -euo pipefail
cd "$(dirname "$0")"
FIXTURES="${FIXTURES:-../../shared/fixtures/harness-jsonl}"
mkdir -p corpus/recover corpus/import_jsonl corpus/append corpus/checkpoint

if compgen -G "$FIXTURES/*.jsonl" > /dev/null; then
    n=0
    for f in "$FIXTURES"/*.jsonl; do
        name="$(basename "$f")"
        cp "$f" "corpus/import_jsonl/$name"
        # A JSONL input (first byte '{') is read as batches of events.
        cp "$f" "corpus/append/$name"
        n=$((n + 1))
    done
    # A few fixtures as garbage written over a segment tail (mode 0,
    # zero-padded) and as a checkpoint-sample driver.
    for f in $(ls "$FIXTURES"/*.jsonl | head -n 8); do
        name="$(basename "$f")"
        { printf '\x00\x02\x40\x00'; head -c 2048 "$f"; } > "corpus/recover/tail-$name"
        { printf '\x01'; head -c 512 "$f"; } > "corpus/checkpoint/sample-$name"
    done
    echo "seeded $n fixtures from $FIXTURES"
else
    echo "no fixtures at $FIXTURES: seeding from the store files only" >&2
fi

# One seed per `recover` mode, cut from a real store's files (the target
# writes them when SESSIONLOG_FUZZ_SEED_DIR is set), and the real checkpoint
# file for `checkpoint` (leading byte 0: decode the rest as it is).
SESSIONLOG_FUZZ_SEED_DIR="$PWD/corpus/recover" \
    cargo fuzz run --sanitizer none recover -- -runs=0 > /dev/null 2>&1
{ printf '\x00'; cat corpus/recover/real-CHECKPOINT; } > corpus/checkpoint/real-checkpoint
rm -f corpus/recover/real-CHECKPOINT
for target in recover import_jsonl append checkpoint; do
    echo "corpus/$target: $(ls corpus/$target | wc -l) files"
done
