#!/usr/bin/env bash
# The test command: sets up libtorch on first use, then runs every test of the workspace,
# real training included, then a short bounded run of every fuzz target (scripts/fuzz.sh;
# LOCO_FUZZ_SECONDS per target, default 20, 0 to skip). Extra arguments go to `cargo test`, and
# skip the fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/torch-env.sh
source scripts/torch-env.sh
# A one-off build (CI, a fresh clone) gains nothing from incremental state but its disk.
if [[ -n "${CI:-}" ]]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
cargo test --workspace --all-features --locked --no-fail-fast "$@"
fuzz_seconds="${LOCO_FUZZ_SECONDS:-20}"
if [[ $# -eq 0 && "$fuzz_seconds" != 0 ]]; then
    scripts/fuzz.sh "$fuzz_seconds"
fi
