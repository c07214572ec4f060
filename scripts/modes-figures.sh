#!/usr/bin/env bash
# The README's table of DiLoCo modes: replays the three INTELLECT-1 settings (30 outer steps of
# H = 100 inner steps each, seed 42) in sync, overlap and streaming mode (`--mode`, 4
# fragments), on the same links, and prints for each: compute utilisation (compute / wall),
# the median all-reduce (release to commit), the bytes a node sends per all-reduce (the median row's), and the
# rate a node needs to hide its all-reduce behind the compute beside it (those bytes over one
# round's compute; sync mode hides nothing, so the whole all-reduce waits), and the peak and mean
# rate a node sends at (the report's bandwidth plot). Needs jq.
#   usage: scripts/modes-figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
mkdir -p out/modes
echo "| setting | mode | utilisation | median all-reduce | bytes per node per all-reduce | rate to hide it | send rate per node: peak, mean |"
echo "|---|---|---|---|---|---|---|"
for s in intellect1-usa intellect1-usa-eu intellect1-global; do
  for m in sync overlap streaming; do
    dir="out/modes/$s-$m"
    ./target/release/loco replay "scenarios/$s.toml" --mode "$m" --out "$dir" > "$dir.txt"
    # The bytes of a row (a round's cycle holds one all-reduce's bytes), median over rows.
    bytes=$(tail -n +2 "$dir/outer_steps.csv" | cut -d, -f15 | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    # "peak X Mbit/s, mean Y Mbit/s", from the bandwidth plot's title.
    rates=$(grep -o 'Send rate per node: peak [^<(]*' "$dir/bandwidth.svg" | sed 's/Send rate per node: //; s/ *$//')
    jq -r --arg s "$s" --arg m "$m" --argjson b "$bytes" --arg rates "$rates" '
      (.extra.fragments // 1) as $p
      | (.inner_step_seconds * (100 / $p)) as $round
      | "| \($s) | \($m) | \(.utilization.mean * 1000 | round / 10)% | \(.allreduce_seconds.median * 10 | round / 10) s | \($b / 1e9 * 100 | round / 100) GB | "
        + (if $m == "sync" then "-" else "\($b * 8 / $round / 1e6 | round) Mbit/s" end) + " | \($rates) |"
    ' "$dir/summary.json"
  done
done
