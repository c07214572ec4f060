#!/usr/bin/env bash
# The test command: sets up libtorch (and, as root on Debian, Chromium) on first use, then runs
# every test of the workspace, real training included, then a short bounded run of every fuzz
# target (scripts/fuzz.sh; LOCO_FUZZ_SECONDS per target, default 20, 0 to skip). Extra
# arguments go to `cargo test`, and skip the fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/torch-env.sh
source scripts/torch-env.sh
# The data and export tests compare with Hugging Face's own code (tokenizers, transformers),
# installed into the same environment on first use.
if ! "$LOCO_TORCH_VENV/bin/python" -c "import tokenizers, transformers, sys; sys.exit(tokenizers.__version__ != '0.22.1' or transformers.__version__ != '4.57.1')" 2>/dev/null; then
    echo "loco: installing tokenizers and transformers into $LOCO_TORCH_VENV (once)" >&2
    "$LOCO_TORCH_VENV/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check \
        "tokenizers==0.22.1" "transformers==4.57.1"
fi
# The live page's test opens it in headless Chromium through chromedriver (Debian's packages).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "loco: installing chromium and chromium-driver (once, for the live page's test)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            chromium chromium-driver >/dev/null
    else
        echo "loco: the live page's test needs chromium and chromedriver:" \
            "apt-get install chromium chromium-driver" >&2
    fi
fi
# A one-off build (CI, a fresh clone) gains nothing from incremental state but its disk.
if [[ -n "${CI:-}" ]]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
cargo test --workspace --all-features --locked --no-fail-fast "$@"
fuzz_seconds="${LOCO_FUZZ_SECONDS:-20}"
if [[ $# -eq 0 && "$fuzz_seconds" != 0 ]]; then
    scripts/fuzz.sh "$fuzz_seconds"
fi
