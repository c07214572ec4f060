#!/usr/bin/env bash
# The test command: sets up libtorch on first use, then runs every test of the workspace,
# real training included. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/torch-env.sh
source scripts/torch-env.sh
cargo test --workspace --all-features --locked --no-fail-fast "$@"
