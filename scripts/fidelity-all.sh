#!/usr/bin/env bash
# Runs `loco fidelity` on every scenario of scenarios/fidelity/ and prints the table of
# docs/fidelity.md: per scenario, the simulator's error on the median all-reduce, the mean outer
# step and the utilisation against the real run, whether the bytes and the membership story agree.
#   scripts/fidelity-all.sh [OUT_DIR]      (needs root for the emulated network)
# LOCO_BIN runs a prebuilt binary instead of `cargo run --release`; NETWORK=relay runs the real
# side through the userspace relays (no root needed) against the simulator's fluid model.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/fidelity}"
if [[ -n "${LOCO_BIN:-}" ]]; then loco=("$LOCO_BIN"); else
  cargo build --release --quiet
  loco=(target/release/loco)
fi
mkdir -p "$out"
echo "| scenario | median all-reduce, sim / real (error) | mean outer step, sim / real (error) | utilisation, sim / real (error) | bytes | membership story |"
echo "|---|---|---|---|---|---|"
for f in scenarios/fidelity/*.toml; do
  name="$(basename "$f" .toml)"
  # Exit 1 means outside the tolerance: the table says so; anything else is an error.
  rc=0; "${loco[@]}" fidelity "$f" --out "$out/$name" ${NETWORK:+--network "$NETWORK"} > "$out/$name.log" 2>&1 || rc=$?
  if [[ $rc -gt 1 ]]; then echo "$name: loco fidelity failed ($rc); see $out/$name.log" >&2; exit "$rc"; fi
  python3 - "$out/$name/fidelity.json" "$name" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
def cell(e, unit, scale=1.0, fmt="{:.3f}"):
    return f"{fmt.format(e['sim'] * scale)} / {fmt.format(e['real'] * scale)}{unit} ({e['relative'] * 100:+.1f}%)"
story = "the same" if not f["story_differences"] else "differs: " + "; ".join(f["story_differences"])
b = f["bytes"]["relative"]
print(f"| {sys.argv[2]} | {cell(f['allreduce_median'], ' s')} | {cell(f['outer_step_mean'], ' s')} | "
      f"{cell(f['utilisation'], '%', 100.0, '{:.1f}')} | {'equal' if abs(b) < 1e-4 else f'{b * 100:+.1f}%'} | {story} |")
PY
done
