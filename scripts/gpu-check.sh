#!/usr/bin/env bash
# The CUDA check: trains the tiny and 1B presets on cuda:0 (bf16, the whole inner step: forward,
# backward, clipping, AdamW) and prints tokens/s, MFU and the step time a scenario should use.
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
echo "== tiny preset on cuda:0"
"$LOCO" bench train --preset tiny --device cuda:0 --micro-batch 64 --steps 20 --warmup 3 \
  --peak-flops "$PEAK"
echo "== 1b preset on cuda:0 (4 sequences of 4096 tokens per step)"
"$LOCO" bench train --preset 1b --device cuda:0 --micro-batch 4 --steps 10 --warmup 2 \
  --peak-flops "$PEAK"
