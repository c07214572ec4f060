#!/usr/bin/env bash
# loco's ring all-reduce over TCP (one process per rank, loopback) next to torch.distributed's
# gloo all_reduce from the same PyTorch install, same world size and size, in one run.
#   usage: scripts/bench-allreduce-vs-gloo.sh [WORLD] [ELEMENTS] [REPEAT]
# Default: 4 processes, 25M float32 values (100 MB), 7 timed all-reduces of the same inputs in
# each implementation's processes (after a warm-up, each after a barrier). A repetition takes
# as long as its slowest rank; the table shows the best and the median repetition, and the
# ratios to gloo of each. It also prints this machine's single-core memcpy bandwidth over 64 MiB:
# the ratios depend on how compute and memory bandwidth compare (the codec is compute, gloo's
# work mostly copies), so a figure means little without it.
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD="${1:-4}"; ELEMENTS="${2:-25000000}"; REPEAT="${3:-7}"
source scripts/torch-env.sh
cargo build --release --quiet
LOCO="${CARGO_TARGET_DIR:-target}/release/loco"
gloo=$("$LOCO_PYTHON" scripts/gloo_allreduce.py --world "$WORLD" --elements "$ELEMENTS" \
  --repeat "$REPEAT" 2>/dev/null)
loco_run() {
  "$LOCO" bench allreduce --backend tcp --world "$WORLD" --elements "$ELEMENTS" --codec "$1" \
    --repeat "$REPEAT" --json
}
fp32=$(loco_run fp32)
uint8=$(loco_run uint8)
memcpy=$("$LOCO" bench codec --codec fp32 --threads 1 --repeats 3 --json)
python3 - "$WORLD" "$ELEMENTS" "$memcpy" "$gloo" "$fp32" "$uint8" <<'PY'
import json, statistics, sys
world, n = sys.argv[1], int(sys.argv[2])
memcpy = json.loads(sys.argv[3])["memcpy_gbps"]
runs = [json.loads(a) for a in sys.argv[4:]]
print(f"all-reduce of {n} float32 ({n*4/1e6:.0f} MB) over {world} processes on loopback, "
      f"{len(runs[0]['repetitions'])} repetitions each; memcpy on one core {memcpy:.1f} GB/s")
print(f"{'implementation':<20}{'best s':>9}{'x gloo':>8}{'median s':>10}{'x gloo':>8}{'CPU/rank s':>12}")
g_best = runs[0]["seconds"]
g_med = statistics.median(runs[0]["repetitions"])
names = ["torch gloo fp32", "loco ring fp32", "loco ring uint8"]
for name, r in zip(names, runs):
    best, med = r["seconds"], statistics.median(r["repetitions"])
    cpu = r.get("cpu_seconds_per_rank")
    cpu = f"{cpu:>12.4f}" if cpu is not None else f"{'-':>12}"
    print(f"{name:<20}{best:>9.4f}{best/g_best:>8.2f}{med:>10.4f}{med/g_med:>8.2f}{cpu}")
PY
