#!/bin/sh
# cuda_device_run.sh — what one call on the GPU machine runs: the CUDA tests, then the
# benchmarks of both real geometries. Binaries and the .so files the GPU machine lacks are
# carried in .devbin/ and .devlibs/ (built on the CPU machine: make BUILD=build-cuda).
# Usage: sh bench/cuda_device_run.sh [tests|bench|all] ; logs and JSON go to $OUT.
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv
if [ "$what" = tests ] || [ "$what" = all ]; then
    timeout 300 .devbin/test_cuda_backend > "$OUT/test_cuda.log" 2>&1
    echo "test_cuda_backend rc=$?"
    grep -E "PASSED|FAILED|ERROR|error|rel err|Failure|\[  " "$OUT/test_cuda.log" | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16 qwen3-0.6b:q8_0 qwen3-0.6b:q4_k_m}; do
        a=${cfg%%:*}; t=${cfg##*:}
        timeout 150 .devbin/cuda_bench --arch "$a" --type "$t" --json "$OUT/cuda-$a-$t.json" \
            > "$OUT/bench-$a-$t.log" 2>&1
        echo "bench $a $t rc=$?"
        grep -E "^\||validate|synth|note|fail|error" "$OUT/bench-$a-$t.log" | tail -12
    done
fi
