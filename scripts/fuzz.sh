#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, through cargo-fuzz) of the decoders that take bytes from the
# network or the disk: the frame decoder, both ends of the handshake and the secured records,
# a joiner's state-piece assembly, the scenario parser, the checkpoint loader, the mesh's
# coordinator and member under decoded messages, and the ring all-reduce under hostile frames.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default: 20 s each, every target)
#
# Runs each target for the time given (bounded: CI runs it for seconds, a long run for hours:
# `scripts/fuzz.sh 3600`), keeps the corpus it grows in fuzz/corpus/TARGET for the next run,
# and prints inputs tried, coverage and crashes per target. Exits 1 if any target crashed,
# naming the input that did (fuzz/artifacts/TARGET/) and how to replay it.
#
# Built with overflow checks and debug assertions on, without a sanitizer: the workspace has no
# unsafe code (`unsafe_code = "deny"`), so what the targets hunt is panics, overflows, unbounded
# allocation (-rss_limit_mb, -malloc_limit_mb) and hangs (-timeout); a sanitizer would need a
# nightly compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
shift || true
all=(frame handshake state_assembly scenario checkpoint mesh ring)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || {
    echo "fuzz.sh: SECONDS_PER_TARGET must be a whole number of seconds, got '$seconds'" >&2
    exit 2
}
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || {
        echo "fuzz.sh: no target '$t' (targets: ${all[*]})" >&2
        exit 2
    }
done

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION (once)" >&2
    cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

cd fuzz
echo "fuzz.sh: building the targets" >&2
cargo fuzz build -s none -a >&2
mkdir -p out
# The scenario parser starts from the shipped scenarios.
mkdir -p corpus/scenario
cp ../scenarios/*.toml corpus/scenario/

failed=0
printf '%-15s %12s %8s %7s %8s %8s\n' target inputs seconds cov corpus crashes
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="out/$t.log"
    before=$(find "artifacts/$t" -type f | wc -l)
    set +e
    cargo fuzz run -s none -a "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -max_len=65536 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
    took=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE 'in [0-9]+' | grep -oE '[0-9]+' || echo "$seconds")
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
    corpus=$(find "corpus/$t" -type f | wc -l)
    crashes=$(($(find "artifacts/$t" -type f | wc -l) - before))
    if [[ $rc -ne 0 && $crashes -eq 0 ]]; then
        crashes=1 # libFuzzer failed without leaving an input: the log says why
    fi
    printf '%-15s %12s %8s %7s %8s %8s\n' "$t" "$runs" "$took" "$cov" "$corpus" "$crashes"
    if [[ $crashes -ne 0 ]]; then
        failed=1
        echo "  $t failed (log: fuzz/$log):" >&2
        grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -5 | sed 's/^/    /' >&2
        newest=$(find "artifacts/$t" -type f -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
        [[ -n "$newest" ]] && echo "  replay: (cd fuzz && cargo fuzz run -s none -a $t $newest)" >&2
    fi
done
exit $failed
