#!/usr/bin/env bash
# loco's ring all-reduce over TCP (one process per rank, loopback) next to torch.distributed's
# gloo all_reduce from the same PyTorch install, same world size and size, in one run.
#   usage: scripts/bench-allreduce-vs-gloo.sh [WORLD] [ELEMENTS] [REPEATS]
# Default: 4 processes, 25M float32 values (100 MB), best of 3 runs each.
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD="${1:-4}"; ELEMENTS="${2:-25000000}"; REPEATS="${3:-3}"
source scripts/torch-env.sh
cargo build --release --quiet
LOCO="${CARGO_TARGET_DIR:-target}/release/loco"
best() { python3 -c 'import json,sys; print(min(json.loads(l)["seconds"] for l in sys.stdin if l.strip()))'; }
run_n() { for _ in $(seq "$REPEATS"); do "$@"; done; }
gloo=$(run_n "$LOCO_PYTHON" scripts/gloo_allreduce.py --world "$WORLD" --elements "$ELEMENTS" | best)
fp32=$(run_n "$LOCO" bench allreduce --backend tcp --world "$WORLD" --elements "$ELEMENTS" --codec fp32 --json | python3 -c 'import json,sys; d=sys.stdin.read().replace("}\n{","}\x00{").split("\x00"); [print(json.dumps(json.loads(x))) for x in d if x.strip()]' | best)
uint8=$(run_n "$LOCO" bench allreduce --backend tcp --world "$WORLD" --elements "$ELEMENTS" --codec uint8 --json | python3 -c 'import json,sys; d=sys.stdin.read().replace("}\n{","}\x00{").split("\x00"); [print(json.dumps(json.loads(x))) for x in d if x.strip()]' | best)
python3 - "$WORLD" "$ELEMENTS" "$gloo" "$fp32" "$uint8" <<'PY'
import sys
world, n, gloo, fp32, uint8 = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
print(f"all-reduce of {n} float32 ({n*4/1e6:.0f} MB) over {world} processes on loopback, best of runs")
print(f"{'implementation':<28}{'seconds':>10}{'x gloo':>10}")
for name, t in [("torch gloo fp32", gloo), ("loco ring fp32", fp32), ("loco ring uint8", uint8)]:
    print(f"{name:<28}{t:>10.3f}{t/gloo:>10.2f}")
PY
