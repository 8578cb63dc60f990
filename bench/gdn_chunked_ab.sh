#!/bin/sh
# gdn_chunked_ab.sh — one GPU call that decides the DeltaNet prefill form (docs/perf-log.md,
# session 53): the DeltaNet op tests on the hardware, then Qwen3.5-0.8B BF16 (synth, real
# geometry) prefill with the column scan (gdn_chunked 0), the tensor-core chunks on 8 warps and
# on 16 (gdn_scan_warps), at several prompt lengths, in interleaved rounds (medians within a
# round, every round's numbers printed), then Nsight Compute's time a layer for each form.
# Runs on the GPU machine with the binaries in .devbin/ (cuda_bench, test_cuda_ops) and their
# libraries in .devlibs/, as bench/cuda_device_run.sh:
#   sh bench/gdn_chunked_ab.sh [ROUNDS] [PROMPT_LENGTHS]     e.g. sh bench/gdn_chunked_ab.sh 2 "64 512 2048"
# cuda_bench exits with status 3 when the SM clock is held down (no record, printed as such).
ROUNDS=${1:-2}
LENGTHS=${2:-"64 128 512 2048"}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
CB=.devbin/cuda_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks_event_reasons.active --format=csv,noheader
if [ -x .devbin/test_cuda_ops ]; then
    QWENRT_TEST_FILTER=test_op_deltanet timeout 180 .devbin/test_cuda_ops > "$OUT/deltanet.log" 2>&1
    echo "test_op_deltanet rc=$?"
    grep -E "PASSED|FAILED|ERROR" "$OUT/deltanet.log" | head -5
fi
# form: name and cuda_bench arguments
forms="scan:--gdn-chunked|0 tc8:--gdn-chunked|2|--gdn-scan-warps|8 tc16:--gdn-chunked|2|--gdn-scan-warps|16"
echo "| round | pp | form | tok/s |"
echo "|---:|---:|---|---:|"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for n in $LENGTHS; do
        for f in $forms; do
            name=${f%%:*}
            args=$(echo "${f#*:}" | tr '|' ' ')
            # shellcheck disable=SC2086
            timeout 120 "$CB" --arch qwen35-0.8b --type bf16 --prefill-only --no-validate --reps 5 \
                --n-prompt "$n" $args > "$OUT/ab-$name-$n-$r.log" 2>&1
            rc=$?
            tok=$(grep -E "^\| qwen35-0.8b \| bf16 \|" "$OUT/ab-$name-$n-$r.log" | head -n 1 | cut -d'|' -f4 | tr -d ' ')
            held=$(grep -c "HELD DOWN" "$OUT/ab-$name-$n-$r.log")
            echo "| $r | $n | $name | ${tok:-?}$([ "$held" -gt 0 ] && echo ' (clock held down)')$([ "$rc" -ne 0 ] && [ "$rc" -ne 3 ] && echo " (rc $rc)") |"
        done
    done
    r=$((r + 1))
done
# time a layer for each form: bench/ncu_kernels.sh sums Nsight Compute's kernel times by name
for f in $forms; do
    args=$(echo "${f#*:}" | tr '|' ' ')
    echo "ncu, ${f%%:*}:"
    # shellcheck disable=SC2086
    OUT=$OUT NCU_TIMEOUT=150 sh bench/ncu_kernels.sh 420 --arch qwen35-0.8b --type bf16 --prefill-only \
        --no-validate --reps 1 $args 2>&1 | grep -E "gdn_|ncu rc"
done
