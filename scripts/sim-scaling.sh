#!/usr/bin/env bash
# The simulator's scaling curve: N nodes in R regions (1 Gbit/s and 10 ms inside a region,
# 500 Mbit/s and 50-110 ms between), the 1B preset with int8-block, H = 20 steps of 2 s, and
# generated failures (Weibull up times of mean 24 h, shape 0.8, repairs of 20 min), replayed for
# the given simulated hours by `loco bench sim`. Prints nodes x simulated hours against wall
# time, peak memory, events and outer steps.
#   scripts/sim-scaling.sh [NODES...]          (default: 16 32 64 128)
# HOURS (default 1) sets the simulated hours, EXECUTOR (default events) the executor,
# COLLECTIVES (default: the scenario's, by size) how the event executor runs all-reduces;
# LOCO_BIN runs a prebuilt binary instead of `cargo run --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${LOCO_BIN:-}" ]]; then loco=("$LOCO_BIN"); else
  cargo build --release --quiet
  loco=(target/release/loco)
fi
hours="${HOURS:-1}"
executor="${EXECUTOR:-events}"
extra=()
[[ -z "${COLLECTIVES:-}" ]] || extra=(--collectives "$COLLECTIVES")
nodes=("$@")
[[ ${#nodes[@]} -gt 0 ]] || nodes=(16 32 64 128)
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
echo "| nodes | regions | simulated h | executor | wall s | peak memory | events | outer steps | invariants |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in "${nodes[@]}"; do
  regions=$(( n >= 8 ? 8 : n ))
  f="$dir/scale-$n.toml"
  python3 - "$n" "$regions" "$f" <<'PY'
import sys
n, regions, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
r = [f"r{i}" for i in range(regions)]
s = f'''name = "scale-{n}"
description = "{n} nodes in {regions} regions, generated failures"
seed = 7
[model]
preset = "1b"
[diloco]
inner_steps = 20
codec = "int8-block"
[mesh]
coordinator_region = "r0"
'''
for x in r:
    s += f'[[regions]]\nname = "{x}"\n'
for i, a in enumerate(r):
    for j in range(i, regions):
        b = r[j]
        if a == b:
            s += f'[[links]]\nfrom = "{a}"\nto = "{b}"\nbandwidth = "1Gbit/s"\nlatency = "10ms"\n'
        else:
            s += (f'[[links]]\nfrom = "{a}"\nto = "{b}"\nbandwidth = "500Mbit/s"\n'
                  f'latency = "{40 + 10 * (j - i)}ms"\n')
per, extra = divmod(n, regions)
for i, x in enumerate(r):
    c = per + (1 if i < extra else 0)
    if c:
        s += f'[[nodes]]\nname = "{x}"\ncount = {c}\nregion = "{x}"\nstep_time = "2s"\n'
s += '[[failures]]\nmtbf = "24h"\nshape = 0.8\nrepair = "20min"\n[stop]\ntime = "1h"\n'
open(path, "w").write(s)
PY
  "${loco[@]}" bench sim "$f" --hours "$hours" --executor "$executor" "${extra[@]}" --json > "$dir/out.json"
  python3 - "$dir/out.json" "$n" "$regions" "$hours" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
mem = f"{f['peak_rss_bytes'] / 1e6:.0f} MB" if f.get("peak_rss_bytes") else "unknown"
steps = f["events"] if f["executor"] == "events" else f"{f['ticks']} ticks"
ex = f"{f['executor']}, {f['collectives']}" if f["executor"] == "events" else f["executor"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {ex} | {f['wall_seconds']:.2f} | {mem} | "
      f"{steps} | {f['outer_steps']} | {'ok' if f['invariants_ok'] else 'BROKEN'} |")
PY
done
