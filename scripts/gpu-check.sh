#!/usr/bin/env bash
# The CUDA check: trains the tiny and 1B presets on cuda:0 (bf16, the whole inner step: forward,
# backward, clipping, AdamW), then on all the GPUs present as one sharded node, then as many of
# the 10B preset's blocks at full width as fit; prints tokens/s, MFU, the step time a scenario
# should use, and each run's memory plan beside the device's measured peak.
#   usage: scripts/gpu-check.sh [PEAK_FLOPS]
# PEAK_FLOPS is the GPU's bf16 dense peak (default 989e12: H100 or H200 SXM).
#
# It builds loco with libtorch (scripts/torch-env.sh) unless LOCO_BIN names a loco already built
# with `--features torch`; then it finds libtorch through the `python3` that holds PyTorch 2.11.0
# (or LIBTORCH), for a machine that has PyTorch but no Rust toolchain. For such a machine: build
# here, `strip` the binary, copy it into a folder git ignores, and run
#   LOCO_BIN=that/loco scripts/gpu-check.sh
# there. Each preset takes a few seconds on a recent GPU (most of it libtorch's start-up).
set -euo pipefail
cd "$(dirname "$0")/.."
PEAK="${1:-989e12}"
if [ -n "${LOCO_BIN:-}" ]; then
  LOCO="$LOCO_BIN"
  if [ -z "${LIBTORCH:-}" ]; then
    LIBTORCH="$(python3 -c 'import torch, pathlib; print(pathlib.Path(torch.__file__).parent)')"
  fi
  export LD_LIBRARY_PATH="$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  # shellcheck source=scripts/torch-env.sh
  source scripts/torch-env.sh
  cargo build --release --features torch --quiet
  LOCO="${CARGO_TARGET_DIR:-target}/release/loco"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$LOCO" --version
GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
GPUS="${GPUS:-1}"; [ "$GPUS" -ge 1 ] || GPUS=1
# The device's peak memory while a command runs, MiB (nvidia-smi polled every 200 ms).
peak_mem() {
  local log; log="$(mktemp)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$log" 2>/dev/null &
  local poll=$!
  local rc=0; "$@" || rc=$?
  kill "$poll" 2>/dev/null; wait "$poll" 2>/dev/null
  echo "peak device memory (nvidia-smi, any device): $(sort -n "$log" | tail -1) MiB"
  rm -f "$log"; return $rc
}
echo "== tiny preset on cuda:0"
"$LOCO" bench train --preset tiny --device cuda:0 --micro-batch 64 --steps 20 --warmup 3 \
  --peak-flops "$PEAK"
echo "== 1b preset on cuda:0 (4 sequences of 4096 tokens per step); target MFU >= 40%"
peak_mem "$LOCO" bench train --preset 1b --device cuda:0 --micro-batch 4 --steps 10 --warmup 2 \
  --peak-flops "$PEAK"
if [ "$GPUS" -gt 1 ]; then
  echo "== the same, one node of $GPUS GPUs sharded (ZeRO-3 style, a ring per GPU in a run)"
  "$LOCO" bench train --preset tiny --device cuda:0 --gpus "$GPUS" --micro-batch 64 --steps 20 \
    --warmup 3 --peak-flops "$PEAK"
  peak_mem "$LOCO" bench train --preset 1b --device cuda:0 --gpus "$GPUS" --micro-batch 4 \
    --steps 10 --warmup 2 --peak-flops "$PEAK"
fi
# The 10B preset's blocks at full width: as many as the plan fits in 90% of one device's memory
# (sharded over every GPU present), then the plan against the measured peak.
MEM_MIB="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1)"
LAYERS=0
for l in $(seq 42 -1 1); do
  need="$("$LOCO" bench train --preset 10b --device cuda:0 --gpus "$GPUS" --layers "$l" \
    --micro-batch 1 --seq-len 4096 --plan --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["per_device_bytes"])')"
  if [ "$need" -le $(( MEM_MIB * 1024 * 1024 * 9 / 10 )) ]; then LAYERS="$l"; break; fi
done
echo "== the 10b preset's blocks at full width: $LAYERS of 42 on $GPUS GPU(s) of $MEM_MIB MiB"
if [ "$LAYERS" -gt 0 ]; then
  "$LOCO" bench train --preset 10b --device cuda:0 --gpus "$GPUS" --layers "$LAYERS" \
    --micro-batch 1 --seq-len 4096 --plan
  peak_mem "$LOCO" bench train --preset 10b --device cuda:0 --gpus "$GPUS" --layers "$LAYERS" \
    --micro-batch 1 --seq-len 4096 --steps 3 --warmup 1 --peak-flops "$PEAK"
fi
