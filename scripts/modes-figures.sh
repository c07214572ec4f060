#!/usr/bin/env bash
# The table of DiLoCo modes in docs/benchmarks.md: replays the three INTELLECT-1 settings (30 outer steps of
# H = 100 inner steps each, seed 42) in sync, overlap (also with `--sync-delay 25`) and
# streaming mode (`--mode`, 4 fragments), on the same links, and prints for each: compute utilisation (compute / wall),
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
  # MODE[:SYNC_DELAY]
  for spec in sync overlap overlap:25 streaming; do
    m="${spec%%:*}"
    args=(--mode "$m")
    label="$m"
    if [[ "$spec" == *:* ]]; then
      args+=(--sync-delay "${spec#*:}")
      label="$m, sync_delay ${spec#*:}"
    fi
    dir="out/modes/$s-${spec/:/-}"
    ./target/release/loco replay "scenarios/$s.toml" "${args[@]}" --out "$dir" > "$dir.txt"
    # The bytes of an all-reduce, median over them: a row counts what the node sent in its
    # span, so a sync row holds its own all-reduce's (allreduce_wall_s, column 21, equal to
    # allreduce_s, column 9), and an overlapped row's all-reduce (longer than the wait) is in
    # the node's next row, beside whose compute it ran.
    bytes=$(tail -n +2 "$dir/outer_steps.csv" | sort -t, -k2,2 -k1,1n | awk -F, '
      $2 == node && over && $1 == step + 1 { print $15 }
      $21 > 0 && $21 <= $9 + 1e-9 { print $15 }
      { node = $2; step = $1; over = ($21 > $9 + 1e-9) }' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    # "peak X Mbit/s, mean Y Mbit/s", from the bandwidth plot's title.
    rates=$(grep -o 'Send rate per node: peak [^<(]*' "$dir/bandwidth.svg" | sed 's/Send rate per node: //; s/ *$//')
    jq -r --arg s "$s" --arg m "$m" --arg name "$label" --argjson b "$bytes" --arg rates "$rates" '
      # The compute an all-reduce runs beside: sync_delay inner steps (a round).
      (.inner_step_seconds * (.extra.sync_delay // 100)) as $round
      | "| \($s) | \($name) | \(.utilization.mean * 1000 | round / 10)% | \(.allreduce_seconds.median * 10 | round / 10) s | \($b / 1e9 * 100 | round / 100) GB | "
        + (if $m == "sync" then "-" else "\($b * 8 / $round / 1e6 | round) Mbit/s" end) + " | \($rates) |"
    ' "$dir/summary.json"
  done
done
