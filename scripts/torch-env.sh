#!/usr/bin/env bash
# Source this file: installs PyTorch 2.11.0 (for tch 0.24) into a virtual environment outside the
# clone on first use, then exports what the build and the binaries need to find libtorch.
#   LOCO_TORCH_VENV  where the environment lives (default: ~/.cache/loco/torch-2.11.0)
# The caller's shell options are restored at the end (a script with `set -e` keeps it).
_loco_caller_opts="$(shopt -po nounset pipefail)"
case $- in *e*) _loco_caller_opts+=$'\nset -e' ;; *) _loco_caller_opts+=$'\nset +e' ;; esac
set -euo pipefail
LOCO_TORCH_VERSION=2.11.0
LOCO_TORCH_VENV="${LOCO_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loco/torch-$LOCO_TORCH_VERSION}"
_py() { "$LOCO_TORCH_VENV/bin/python" "$@"; }
if ! _py -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$LOCO_TORCH_VERSION')" 2>/dev/null; then
  echo "loco: installing torch==$LOCO_TORCH_VERSION into $LOCO_TORCH_VENV (once; about 4.6 GB)" >&2
  mkdir -p "$(dirname "$LOCO_TORCH_VENV")"
  python3 -m venv "$LOCO_TORCH_VENV"
  "$LOCO_TORCH_VENV/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "torch==$LOCO_TORCH_VERSION"
fi
LIBTORCH="$(_py -c 'import torch, pathlib; print(pathlib.Path(torch.__file__).parent)')"
export LIBTORCH
export LD_LIBRARY_PATH="$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The interpreter that runs the gloo comparison script (bench allreduce --backend gloo).
export LOCO_PYTHON="$LOCO_TORCH_VENV/bin/python"
export PATH="$LOCO_TORCH_VENV/bin:$PATH"
eval "$_loco_caller_opts"
unset _loco_caller_opts
