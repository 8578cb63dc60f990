#!/bin/sh
# cli_valgrind.sh — short generations under valgrind memcheck: no invalid reads or writes, no
# use of uninitialised values, and no leaks (definite, indirect or possible) (issue 9).
#   1. qwenrt run on the micro Qwen3.5 GGUF of the fuzz corpus: GGUF + q8_0 weights, tokenizer
#      and chat template from GGUF metadata, sampler with temperature, DeltaNet + attention.
#   2. qwenrt generate on the tiny Qwen3 fixture directory: safetensors + config.json path.
# One thread: valgrind serialises threads anyway. "Still reachable" blocks are not errors: they
# are libgomp's thread pool and the CUDA libraries' static buffers, alive at exit by design.
# Exit 77 (skipped): valgrind is not installed (scripts/setup.sh installs it), or $1 is built
# with AddressSanitizer (build-asan/), which cannot run under valgrind.
# Usage: sh tests/cli_valgrind.sh path/to/qwenrt   (from the repository root)
set -u
QWENRT=$1
if ! command -v valgrind >/dev/null 2>&1; then
    echo "cli_valgrind: SKIP: valgrind not installed (run scripts/setup.sh)"
    exit 77
fi
if grep -q __asan_init "$QWENRT"; then
    echo "cli_valgrind: SKIP: $QWENRT is built with AddressSanitizer"
    exit 77
fi
VG="valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
--error-exitcode=99"
fail=0

check() { # name, command...
    name=$1
    shift
    out=$($VG "$@" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL: $name: exit $rc"
        echo "$out" | tail -40
        fail=1
    else
        echo "ok: $name"
    fi
}

check "run (GGUF q8_0, tokenizer, chat template, sampling)" \
    "$QWENRT" run -m tests/fuzz/corpus/fuzz_gguf/qwen35-micro-q8_0.gguf -p "ab abc" -n 6 \
    --threads 1 --seed 3 --temp 0.8 --no-stats
check "generate (safetensors directory, greedy)" \
    "$QWENRT" generate -m tests/data/qwen3-tiny-f32 --ids 1,2,3 -n 3 --threads 1
exit $fail
