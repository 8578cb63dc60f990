#!/bin/sh
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan in build-fuzz/
# and runs each for FUZZ_SECONDS (default 60), one at a time, from the repository root.
#   scripts/fuzz.sh                 every target
#   scripts/fuzz.sh fuzz_gguf ...   the named targets
#   FUZZ_SECONDS=600 FUZZ_NICE=10 scripts/fuzz.sh fuzz_config
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>/) plus what earlier
# runs found (build-fuzz/corpus/<target>/, not committed). A crash, leak or sanitizer report
# leaves its input in build-fuzz/artifacts/ and makes the script exit 1; reproduce it with
#   build-fuzz/<target> build-fuzz/artifacts/<file>
# Seconds run per target are added up in build-fuzz/fuzz-time.tsv (target, seconds, date, result).
#   FUZZ_SEEDS_ONLY=1 scripts/fuzz.sh   build, then run each target once over its committed seeds
#                                       and stop (deterministic: what CI runs, so that the clang
#                                       build and the harnesses keep working)
set -eu
cd "$(dirname "$0")/.."
B=${FUZZ_BUILD:-build-fuzz}
SECS=${FUZZ_SECONDS:-60}
NICE=${FUZZ_NICE:-0}
CC_FUZZ=${FUZZ_CC:-clang}
command -v "$CC_FUZZ" >/dev/null 2>&1 || { echo "fuzz: $CC_FUZZ not found (make deps)"; exit 1; }

# RelWithDebInfo: -O2 -g, so reports have line numbers. CUDA off: the fuzzers test the CPU side.
if [ ! -f "$B/CMakeCache.txt" ]; then
    CC="$CC_FUZZ" CXX="${CC_FUZZ}++" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DQWENRT_FUZZ=ON -DQWENRT_SANITIZE=ON -DQWENRT_CUDA=OFF >/dev/null
fi
cmake --build "$B" --target fuzz_all -j "$(nproc)" >/dev/null

if [ $# -gt 0 ]; then
    targets="$*"
else
    targets=$(ls tests/fuzz/fuzz_*.c | sed 's|.*/||; s|\.c$||')
fi
mkdir -p "$B/artifacts" "$B/logs"
failed=""
for t in $targets; do
    mkdir -p "$B/corpus/$t" "tests/fuzz/corpus/$t"
    # scratch files of the harnesses (tests/fuzz/fuzz_util.h), removed after each target
    export TMPDIR="$PWD/$B/tmp"
    rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
    start=$(date +%s)
    # rss/malloc limit 2 GiB: an input that makes qwenrt allocate more is a finding (a limit
    # is missing). -timeout 20: one input running longer is a hang.
    if [ "${FUZZ_SEEDS_ONLY:-0}" = 1 ]; then
        set -- "tests/fuzz/corpus/$t" -runs=0
    else
        set -- "$B/corpus/$t" "tests/fuzz/corpus/$t" -max_total_time="$SECS"
    fi
    if nice -n "$NICE" "$B/$t" "$@" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
        -artifact_prefix="$B/artifacts/$t-" >"$B/logs/$t.log" 2>&1; then
        result=ok
    else
        result=FOUND
        failed="$failed $t"
    fi
    secs=$(( $(date +%s) - start ))
    rm -rf "$TMPDIR"
    printf '%s\t%s\t%s\t%s\n' "$t" "$secs" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$result" \
        >>"$B/fuzz-time.tsv"
    echo "fuzz: $t ${secs}s $result ($(grep -o 'cov: [0-9]*' "$B/logs/$t.log" | tail -1))"
done
if [ -n "$failed" ]; then
    echo "fuzz: findings in$failed (see $B/logs/ and $B/artifacts/)"
    exit 1
fi
