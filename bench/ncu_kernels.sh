#!/bin/sh
# ncu_kernels.sh — where a run's GPU time goes, kernel by kernel, without the per-op
# profile's event overhead: Nsight Compute times each of the first N kernels of a cuda_bench
# run alone (serialised, caches flushed between kernels, so short kernels read slower than in
# the pipelined run) and the table sums them by name. Run on the GPU machine with the binaries
# carried in .devbin/ (as for cuda_device_run.sh):
#   sh bench/ncu_kernels.sh [N] [cuda_bench arguments...]
#   e.g. sh bench/ncu_kernels.sh 150 --arch qwen3-0.6b --type bf16 --prefill-only --no-validate --reps 1
# Session 5 found the flash attention (45.8 us per layer) and the DeltaNet prep kernel (21.8
# us) this way (docs/perf-log.md).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
n=${1:-150}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- --arch qwen3-0.6b --type bf16 --prefill-only --no-validate --reps 1
timeout ${NCU_TIMEOUT:-240} "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    -c "$n" .devbin/cuda_bench "$@" > "$OUT/ncu-kernels.csv" 2> "$OUT/ncu-kernels.err"
echo "ncu rc=$?"
python3 - "$OUT/ncu-kernels.csv" <<'PY'
import collections, csv, sys
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
rows = csv.DictReader(line for line in open(sys.argv[1]) if line.startswith('"'))
by_name = collections.OrderedDict()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    us = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], float("nan"))
    n = by_name.setdefault(r["Kernel Name"][:80], [0, 0.0])
    n[0] += 1
    n[1] += us
total = sum(t for _, t in by_name.values())
print("| kernel | launches | us each | us total | share |")
print("|---|---:|---:|---:|---:|")
for name, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
    print("| %s | %d | %.2f | %.1f | %.1f%% |" % (name, c, t / c, t, 100 * t / total))
PY
