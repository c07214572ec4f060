#!/usr/bin/env bash
# Regenerates the figures and the Table-2 comparison of the README and docs/fidelity.md:
# replays the three INTELLECT-1 scenarios and the 4-of-12 drop, draws their reports, and copies
# the plots into docs/figures/. Deterministic: the same seeds give the same files.
#   usage: scripts/readme-figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
mkdir -p docs/figures out
for s in intellect1-usa intellect1-usa-eu intellect1-global drop-4-of-12; do
  ./target/release/loco replay "scenarios/$s.toml" --out "out/$s" > "out/$s.txt" || true
  for p in active_nodes allreduce_hist time_by_step; do
    cp "out/$s/$p.png" "docs/figures/$s-$p.png"
  done
done
./target/release/loco report out/intellect1-usa out/intellect1-usa-eu out/intellect1-global
cp out/intellect1-usa/comparison.csv docs/figures/table2-comparison.csv
cat docs/figures/table2-comparison.csv
