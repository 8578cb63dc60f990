#!/bin/sh
# ncu_megakernel.sh — where the decode megakernel's warps stall, from Nsight Compute's warp
# state sampling, per CUDA source line and per SASS instruction (run on the GPU machine, where
# ncu reads the counters; binaries carried in .devbin/ as for cuda_device_run.sh):
#   sh bench/ncu_megakernel.sh [arch] [type]     (default qwen3-0.6b bf16)
# Profiles one launch of mk_kernel (8 greedy steps, cuda_bench --mega-only) and prints the
# stall-reason breakdown and the hottest lines (bench/ncu_top.py); the report stays in $OUT.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
a=${1:-qwen3-0.6b}; t=${2:-bf16}
timeout ${NCU_TIMEOUT:-240} "$NCU" --clock-control none -k regex:mk_kernel -c 1 \
    --section WarpStateStats --section SourceCounters --section SchedulerStats \
    --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --import-source yes -f -o "$OUT/mk" \
    .devbin/cuda_bench --arch "$a" --type "$t" --mega-only --no-validate > "$OUT/ncu-run.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$OUT/mk.ncu-rep" --page details --print-details all > "$OUT/mk-details.txt" 2>&1
grep -iE "stall|Warp Cycles|Issued Warp|Throughput|Duration|Bandwidth|Busy" "$OUT/mk-details.txt" | head -60
for src in cuda sass; do
    "$NCU" -i "$OUT/mk.ncu-rep" --page source --csv --print-source $src > "$OUT/mk-$src.csv" 2>&1
    python3 bench/ncu_top.py "$OUT/mk-$src.csv" ${TOP:-30}
done
rm -f "$OUT/mk.ncu-rep"
