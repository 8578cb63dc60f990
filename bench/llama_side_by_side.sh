#!/bin/sh
# llama_side_by_side.sh — qwenrt (cuda_bench) and llama.cpp (llama-bench: CUDA, flash attention
# on, every layer on the GPU) on the same synth GGUF files of the real geometry, interleaved
# round by round, medians: the side-by-side run issue 6 asks for.
# Runs on the GPU machine with the binaries carried gzipped in .devbin/ (the carried tree is
# limited to 64 MiB): cuda_bench.gz or .xz (build-cudaperf, as for cuda_device_run.sh) and
# llama-bench.gz / .xz or an uncompressed .devbin/llama-bench (a llama.cpp CUDA build for sm_90a made
# outside the repository, its CUDA libraries taken from the GPU machine; the session-6 and
# session-7 notes on issue 6 say how it was built). At 43 MB gzipped it does not fit beside the
# tree in one call: session 7 sent it xz-compressed in two halves, the first copied to /tmp by a
# call of its own (it stays while the machine is warm, ~30 s idle), then joined and unpacked
# into .devbin/llama-bench before this script ran (docs/perf-log.md, session 7). And
# tokenizer.json.gz (the synth GGUF embeds it: llama.cpp refuses a model without a vocabulary).
# Usage: [CFGS="qwen3-0.6b:bf16 qwen35-0.8b:bf16"] [ROUNDS=3] sh bench/llama_side_by_side.sh
# Logs and the table go to $OUT (every round's numbers in $OUT/side-by-side.jsonl); llama-bench's
# own errors to $OUT/llama-*.err.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# a llama.cpp built with NCCL (GGML_CUDA_NCCL, its default) needs libnccl.so.2: the GPU
# machine has one in PyTorch's packages, not in /usr/local/cuda
nccl=$(find /usr /opt /root -name 'libnccl.so.2' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$PWD/.devlibs:/usr/local/cuda/lib64${nccl:+:${nccl%/*}}:$LD_LIBRARY_PATH"
for f in .devbin/cuda_bench.gz .devbin/llama-bench.gz .devbin/tokenizer.json.gz; do [ -e "$f" ] && gunzip -f "$f"; done
for f in .devbin/cuda_bench.xz .devbin/llama-bench.xz; do [ -e "$f" ] && xz -d -f "$f"; done
chmod +x .devbin/cuda_bench .devbin/llama-bench
for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16}; do
    a=${cfg%%:*}; t=${cfg##*:}; g=/tmp/synth-$a-$t.gguf
    # cuda_bench writes the synth model (seed 1234) to $g and leaves it there
    timeout 300 .devbin/cuda_bench --arch "$a" --type "$t" --prefill-only --no-validate --reps 1 \
        --tokenizer .devbin/tokenizer.json \
        > "$OUT/synth-$a-$t.log" 2>&1 || { echo "$cfg: cuda_bench could not write $g"; continue; }
    for r in $(seq "${ROUNDS:-3}"); do
        timeout 180 .devbin/llama-bench -m "$g" -p 512 -n 128 -fa 1 -ngl 99 -r 5 -o jsonl \
            >> "$OUT/llama-$a-$t.jsonl" 2>> "$OUT/llama-$a-$t.err"
        for mode in --prefill-only --decode-only; do
            timeout 180 .devbin/cuda_bench --gguf "$g" --arch "$a" --type "$t" $mode --no-validate \
                --reps 3 >> "$OUT/qwenrt-$a-$t.log" 2>&1
        done
    done
    python3 - "$OUT/llama-$a-$t.jsonl" "$OUT/qwenrt-$a-$t.log" "$a" "$t" "$OUT/side-by-side.jsonl" <<'PY'
import json, statistics, sys
llama, qwenrt, arch, typ, record = sys.argv[1:6]
lp, lg = [], []
build = None
for line in open(llama):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    # the median of the run's samples: llama-bench's first pp sample is cold (2-3x slower)
    # and its avg_ts includes it
    (lp if r.get("n_prompt") else lg).append(statistics.median(r["samples_ts"]))
    build = r.get("build_commit")
qp, qg = [], []
for line in open(qwenrt, errors="replace"):
    cells = [c.strip() for c in line.split("|")]
    # the first table row: | model | weights | pp tok/s | tg tok/s | ...
    if len(cells) > 5 and cells[1] == arch and cells[2] == typ:
        pp, tg = float(cells[3]), float(cells[4])
        (qp if pp else qg).append(pp or tg)
med = lambda v: "%.0f (%d)" % (statistics.median(v), len(v)) if v else "-"
print("| model | weights | qwenrt pp512 | llama.cpp pp512 | qwenrt tg128 | llama.cpp tg128 |")
print("|---|---|---:|---:|---:|---:|")
print("| %s | %s | %s | %s | %s | %s |" % (arch, typ, med(qp), med(lp), med(qg), med(lg)))
# one line per model: the medians and every round's value (one file to bring back)
with open(record, "a") as f:
    f.write(json.dumps({"arch": arch, "weights": typ, "llama_cpp_build": build,
                        "qwenrt_pp512": qp, "llama_pp512": lp, "qwenrt_tg128": qg,
                        "llama_tg128": lg}) + "\n")
PY
    rm -f "$g"
done
