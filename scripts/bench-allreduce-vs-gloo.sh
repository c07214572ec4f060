#!/usr/bin/env bash
# loco's ring all-reduce over TCP (one process per rank, loopback) next to torch.distributed's
# gloo all_reduce from the same PyTorch install, same world size and size, in one run.
#   usage: scripts/bench-allreduce-vs-gloo.sh [WORLD] [ELEMENTS] [REPEAT] [ROUNDS]
# Default: 4 processes, 25M float32 values (100 MB), 7 timed all-reduces of the same inputs in
# each implementation's processes (after a warm-up, each after a barrier), 1 round. A repetition
# takes as long as its slowest rank. Besides PRIME's uint8 codec, loco's int8-block (absmax per
# block of 256 values: about the same bytes, half uint8's error, and no whole-chunk statistics
# pass) is shown too. With ROUNDS > 1 the implementations take turns (gloo, fp32, uint8,
# int8-block, gloo, ...), so that a busy spell of a shared machine falls on all of them; the table
# pools every round's repetitions.
#
# It prints the best and the median repetition and their ratios to gloo's, each rank's CPU time,
# the issue's targets (uint8 at most 0.5x gloo's time, fp32 at most 1.2x) against the best
# repetitions, and this machine's single-core memcpy bandwidth and core count: the ratios depend
# on how compute and memory bandwidth compare (the uint8 codec is compute, gloo's work mostly
# copies), and with more processes than cores every figure measures CPU work rather than the
# loopback path.
#
# It builds loco (release, no libtorch needed) unless LOCO_BIN names a loco binary to run.
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD="${1:-4}"; ELEMENTS="${2:-25000000}"; REPEAT="${3:-7}"; ROUNDS="${4:-1}"
for v in "$WORLD" "$ELEMENTS" "$REPEAT" "$ROUNDS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [WORLD] [ELEMENTS] [REPEAT] [ROUNDS] (positive integers; got '$v')" >&2; exit 2; }
done
# shellcheck source=scripts/torch-env.sh
source scripts/torch-env.sh
if [ -n "${LOCO_BIN:-}" ]; then
  LOCO="$LOCO_BIN"
else
  cargo build --release --quiet
  LOCO="${CARGO_TARGET_DIR:-target}/release/loco"
fi
runs=()
for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round of $ROUNDS: gloo, loco fp32, loco uint8, loco int8-block" >&2
  runs+=("$("$LOCO_PYTHON" scripts/gloo_allreduce.py --world "$WORLD" --elements "$ELEMENTS" \
    --repeat "$REPEAT" 2>/dev/null)")
  for codec in fp32 uint8 int8-block; do
    runs+=("$("$LOCO" bench allreduce --backend tcp --world "$WORLD" --elements "$ELEMENTS" \
      --codec "$codec" --repeat "$REPEAT" --json)")
  done
done
memcpy=$("$LOCO" bench codec --codec fp32 --threads 1 --repeats 3 --json)
python3 - "$WORLD" "$ELEMENTS" "$(nproc)" "$memcpy" "${runs[@]}" <<'PY'
import json, statistics, sys
world, n, cores = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
memcpy = json.loads(sys.argv[4])["memcpy_gbps"]
runs = [json.loads(a) for a in sys.argv[5:]]
names = ["torch gloo fp32", "loco ring fp32", "loco ring uint8", "loco ring int8-block"]
k = len(names)
# Pool each implementation's repetitions (and per-run CPU medians) over the rounds.
pooled = []
for i in range(k):
    mine = runs[i::k]
    reps = [t for r in mine for t in r["repetitions"]]
    cpu = [r["cpu_seconds_per_rank"] for r in mine if r.get("cpu_seconds_per_rank") is not None]
    pooled.append((min(reps), statistics.median(reps), statistics.median(cpu) if cpu else None, len(reps)))
print(f"all-reduce of {n} float32 ({n*4/1e6:.0f} MB) over {world} processes on loopback, "
      f"{pooled[0][3]} repetitions each in {len(runs) // k} round(s)")
print(f"this machine: {cores} cores, memcpy on one core {memcpy:.1f} GB/s"
      + (f"; {world} processes share {cores} cores, so the figures measure CPU work"
         if world > cores else ""))
print(f"{'implementation':<22}{'best s':>9}{'x gloo':>8}{'median s':>10}{'x gloo':>8}{'CPU/rank s':>12}")
g_best, g_med = pooled[0][0], pooled[0][1]
for name, (best, med, cpu, _) in zip(names, pooled):
    cpu = f"{cpu:>12.4f}" if cpu is not None else f"{'-':>12}"
    print(f"{name:<22}{best:>9.4f}{best/g_best:>8.2f}{med:>10.4f}{med/g_med:>8.2f}{cpu}")
if (world, n) == (4, 25_000_000):
    for name, (best, _, _, _), target in zip(names[1:3], pooled[1:3], [1.2, 0.5]):
        ratio = best / g_best
        verdict = "met" if ratio <= target else "not met"
        print(f"target: {name} at most {target}x gloo's best: {ratio:.2f}x, {verdict}")
else:
    print("(the targets, uint8 at most 0.5x gloo and fp32 at most 1.2x, are for 4 processes "
          "and 25000000 values)")
PY
