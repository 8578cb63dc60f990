#!/bin/sh
# cuda_device_run.sh — what one call on the GPU machine runs: the CUDA tests, then the
# benchmarks (the first with the single-GEMV bandwidth table). Binaries and the .so files the
# GPU machine lacks are carried in .devbin/ and .devlibs/ (bench/cuda_bundle.sh packs them into
# .devexp/all.tar.xz, unpacked here; by hand, built on the CPU machine:
# cmake --build build-cudaperf --target cuda_bench test_cuda_backend test_cuda_ops test_cuda_graph
# test_cuda_batch test_cuda_faults; cp to .devbin/). Each of those programs links the whole library (~75 MB, most
# of it kernels): configured with -DQWENRT_SHARED_LIB=ON they share one libqwenrt.so, and all of
# them with qwenrt fit the carry limit (~27 MB xz-compressed; the library goes in .devbin/ too).
# Usage: sh bench/cuda_device_run.sh [tests|bench|serve|validate|calibrate|screen|slowstate|records|all] ; logs and JSON go to $OUT.
# records: `cuda_bench --reps 3 --json` for CFGS (default Qwen3-0.6B BF16 and Q4_K_M, Qwen3.5-0.8B
# BF16), only where the GPU is an H200; the JSON files go to $OUT for bench/results/.
# slowstate: Qwen3-0.6B BF16 sessions in turn (each as its letter, tok/s @ the process's graph
# launches after it), alone, after 260 empty graph launches (W), with 16 decode steps a graph launch (G)
# and after a context reset (R): whether the state that slows the sessions after ~7 made and
# freed, or after launches outside a graph, is a count of the process's submissions, and whether
# it belongs to the CUDA context (perf-log, sessions 59-60).
# screen: the screened LM head's measurements (session 58): `cuda_bench --screen-sessions 24`
# for both BF16 models (each session's tok/s, its screened pick alone, its buffers' addresses:
# the sessions that run ~5% slow now and then) and `cuda_bench --pick-phases` (the pick by
# phases from clock stamps, greedy and top_k 20 / 40).
# validate: issue 6's long check at the real geometry — `qwenrt validate --backend cuda` on
# synth models (CFGS, default BF16 and Q4_K_M of both), a VP-token prompt then VN decoded
# tokens (default 128 + 129: 256 positions checked, logits and KV against the CPU reference path,
# greedy ids; --keep-going: every position even past a failure), one validation record each ($OUT/validate-cuda-A-T.json); needs .devbin/qwenrt
# (gzipped) and .devlibs.
# calibrate: `qwenrt calibrate --backend cuda` on synth models of the real geometry (CFGS,
# default BF16, Q4_K_M and Q8_0 of Qwen3-0.6B, BF16 and Q4_K_M of Qwen3.5-0.8B): each lane's
# gate and median decode tokens/s, the evidence in $OUT/calibrate-A-T.json; needs .devbin/qwenrt.
# QWENRT_TEST_FILTER=pattern runs only the matching tests of the CUDA test programs (cmocka's
# wildcards); the whole suite took 147 s on the H200 in session 17, before its LM-head cases
# (one program then: session 50 split it into test_cuda_ops, _graph, _batch and _backend).
# serve: bench/cuda_serve_check.py on tiny synth models carrying the Qwen3 tokenizer, which
# comes gzipped in .devbin/tokenizer.json.gz (build/deps is not carried).
what=${1:-all}
# the bundle of bench/cuda_bundle.sh, unpacked once a call (a call starts from a fresh copy of
# the tree; the first step of a call unpacks, the later ones find .devbin/.unpacked)
if [ -e .devexp/all.tar.xz ] && [ ! -e .devbin/.unpacked ]; then
    rm -rf .devbin .devlibs
    xz -d < .devexp/all.tar.xz | tar xf - || { echo "cuda_device_run: .devexp/all.tar.xz does not unpack" >&2; exit 9; }
    touch .devbin/.unpacked
    echo "bundle of $(cat .devexp/all.rev 2>/dev/null || echo '(unknown revision)')"
fi
# binaries may come gzipped or xz-compressed (the carried tree is limited to 64 MiB)
TESTS=${TESTS:-"test_cuda_ops test_cuda_graph test_cuda_batch test_cuda_backend test_cuda_faults"} # or the ones named
for b in cuda_bench qwenrt $TESTS; do
    [ -e ".devbin/$b.gz" ] && gunzip -f ".devbin/$b.gz"
    [ -e ".devbin/$b.xz" ] && xz -d -f ".devbin/$b.xz"
    chmod +x ".devbin/$b" 2>/dev/null
done
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devbin:$PWD/.devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv
# a GPU whose clocks the hardware holds down (session 53: an H100 power-braked to ~300 MHz)
# times everything ~5x slow: say so before anything runs (cuda_bench also refuses to write
# records there, exit status 3)
reasons=$(nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader 2>/dev/null | head -n 1)
case "$reasons" in
0x*) [ $(( reasons & 0xe8 )) -ne 0 ] && echo "WARNING: clocks held down (event reasons $reasons: hardware or thermal slowdown, power brake): timings are no records" ;;
esac
if [ "$what" = tests ] || [ "$what" = all ]; then
    for t in $TESTS; do
        t0=$(date +%s)
        timeout ${TEST_TIMEOUT:-420} ".devbin/$t" > "$OUT/$t.log" 2>&1
        echo "$t rc=$? in $(( $(date +%s) - t0 )) s"
        grep -E "PASSED|FAILED|ERROR|error|Failure|\[  (FAILED|PASSED)" "$OUT/$t.log" | tail -20
    done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    first=1
    for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16 qwen3-0.6b:q8_0 qwen3-0.6b:q4_k_m}; do
        a=${cfg%%:*}; t=${cfg##*:}
        extra=""
        [ $first = 1 ] && extra="--gemv"
        first=0
        t0=$(date +%s)
        to=${BENCH_TIMEOUT:-110}; [ "$t" = q4_k_m ] && to=${Q4_TIMEOUT:-280}
        timeout $to .devbin/cuda_bench --arch "$a" --type "$t" $extra \
            --json "$OUT/cuda-$a-$t.json" > "$OUT/bench-$a-$t.log" 2>&1
        echo "bench $a $t rc=$? in $(( $(date +%s) - t0 )) s"
        grep -E "^\||validate|fail|error" "$OUT/bench-$a-$t.log" | grep -v "^|---" | tail -24
        rm -f /tmp/synth-$a-$t.gguf
    done
fi
if [ "$what" = validate ]; then
    for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16 qwen3-0.6b:q4_k_m qwen35-0.8b:q4_k_m}; do
        a=${cfg%%:*}; t=${cfg##*:}
        t0=$(date +%s)
        .devbin/qwenrt synth --arch "$a" --type "$t" --no-tokenizer -o "/tmp/v-$a-$t.gguf" > /dev/null &&
            timeout ${VALIDATE_TIMEOUT:-240} .devbin/qwenrt validate -m "/tmp/v-$a-$t.gguf" --backend cuda \
                -p ${VP:-128} -n ${VN:-129} --keep-going --out "$OUT/validate-cuda-$a-$t.json" > "$OUT/validate-$a-$t.log" 2>&1
        echo "validate $a $t rc=$? in $(( $(date +%s) - t0 )) s"
        grep -E "^(tolerance|positions|max error|status)" "$OUT/validate-$a-$t.log"
        rm -f "/tmp/v-$a-$t.gguf"
    done
fi
if [ "$what" = calibrate ]; then
    for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16 qwen3-0.6b:q4_k_m qwen3-0.6b:q8_0 qwen35-0.8b:q4_k_m}; do
        a=${cfg%%:*}; t=${cfg##*:}
        t0=$(date +%s)
        .devbin/qwenrt synth --arch "$a" --type "$t" --no-tokenizer -o "/tmp/c-$a-$t.gguf" > /dev/null &&
            timeout ${CALIBRATE_TIMEOUT:-150} .devbin/qwenrt calibrate -m "/tmp/c-$a-$t.gguf" --backend cuda \
                -o "$OUT/calibrated-$a-$t.json" --out "$OUT/calibrate-$a-$t.json" > "$OUT/calibrate-$a-$t.log" 2>&1
        echo "calibrate $a $t rc=$? in $(( $(date +%s) - t0 )) s"
        python3 - "$OUT/calibrate-$a-$t.json" <<'PY' || tail -5 "$OUT/calibrate-$a-$t.log"
import json, sys
e = json.load(open(sys.argv[1]))
for l in e["lanes"]:
    print("  %-38s %-6s err %.2g  tg %7.1f  %s" % (l["label"], l["gate"], l["max_logits_rel_err_vs_baseline"],
          l["median_decode_tok_s"], [round(x) for x in l["decode_tok_s"]]))
print("  chosen:", [c["key"] for c in e["choices"] if c["chosen"]] or "the session's own picks")
w = e.get("attention_cluster")
for d in (w or {}).get("depths", []):
    print("  depth %5d  never %7.1f  always %7.1f  gain %+5.1f%%  %s" % (d["depth"], d["never_decode_tok_s"],
          d["always_decode_tok_s"], 100 * d["gain"], d["gate"]))
if w:
    print("  attention cluster merge:", "positions %d to %d" % (w["from"], w["until"]) if "from" in w else "never")
PY
        rm -f "/tmp/c-$a-$t.gguf"
    done
fi
if [ "$what" = screen ]; then
    # the GPU's clocks, power and temperature every 100 ms beside the sessions (their rows carry
    # the time they ended): whether a slow run of sessions is the GPU's clock, not the code
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
        --format=csv,noheader -lms 100 > "$OUT/screen-clocks.csv" 2>&1 &
    clocks=$!
    for a in qwen3-0.6b qwen35-0.8b; do
        t0=$(date +%s)
        timeout ${SCREEN_TIMEOUT:-150} .devbin/cuda_bench --arch $a --type bf16 --screen-sessions ${SCREEN_SESSIONS:-24} \
            --n-gen 128 > "$OUT/screen-sessions-$a.log" 2>&1
        echo "screen sessions $a rc=$? in $(( $(date +%s) - t0 )) s"
        grep -E "^\|" "$OUT/screen-sessions-$a.log" | grep -v "^|---"
        rm -f /tmp/synth-$a-bf16.gguf
    done
    kill $clocks
    python3 bench/clock_sessions.py "$OUT"/screen-sessions-*.log "$OUT/screen-clocks.csv"
    t0=$(date +%s)
    timeout ${SCREEN_TIMEOUT:-150} .devbin/cuda_bench --pick-phases --reps ${PICK_REPS:-50} > "$OUT/pick-phases.log" 2>&1
    echo "pick phases rc=$? in $(( $(date +%s) - t0 )) s"
    grep -E "^\||pick-phases" "$OUT/pick-phases.log" | grep -v "^|---"
fi
if [ "$what" = slowstate ]; then
    # the process state that slows every session ~5% (perf-log, session 59): it set in at ~256
    # submissions (graph and kernel launches) in every probe so far. W makes 260 empty graph
    # launches before its session: if the count is the state, W's session and all after it are slow.
    # G / T: 16 / 32 decode steps a graph launch (~21 / ~13 submissions a session instead of ~37):
    # if the count is the state, G stays fast until session ~12 and T until ~19 instead of 7. R: the
    # context reset before its session: if the state is the context's, R and the ~6 sessions after
    # it are fast again
    # qwen35: Qwen3.5-0.8B, which turned slow after its first session in session 59; its reset
    # made 36 memsets (two for each DeltaNet layer) until session 60 and makes one now: if
    # memsets count, it stays fast until ~session 6
    # X: 8 streams made and destroyed before its session (every session makes and destroys its
    # own): if stream churn is the state, X turns slow within ~1 session; if the count, as s
    for p in sssssssssss Wsss ssWsss GGGGGGGGGGGGGGG TTTTTTTTTTTTTTTTTTTTTTTT XXXXXXXXXXX sssssssssRssss \
        qwen35:sssssssssss; do
        a=qwen3-0.6b
        case $p in qwen35:*) a=qwen35-0.8b p=${p#qwen35:} ;; esac
        timeout 150 .devbin/cuda_bench --arch $a --type bf16 --screen-sessions ${#p} \
            --screen-pattern $p --n-gen 128 > "$OUT/slowstate-$a-$p.log" 2>&1
        echo "$a $p: $(grep -E '^\| [0-9]' "$OUT/slowstate-$a-$p.log" |
            awk -F'|' -v p=$p '{printf "%s%.0f@%s ", substr(p, ($2 % length(p)) + 1, 1), $5, $13 + 0}')"
    done
fi
if [ "$what" = records ]; then
    # the records of bench/results/cuda-A-T.json, taken only on an H200 (issue 6's machine; the
    # pool lends H100s too, whose figures are no records): copy $OUT/cuda-*.json into bench/results/
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in
    *H200*)
        for cfg in ${CFGS:-qwen3-0.6b:bf16 qwen35-0.8b:bf16 qwen3-0.6b:q4_k_m}; do
            a=${cfg%%:*}; t=${cfg##*:}
            t0=$(date +%s)
            timeout ${RECORD_TIMEOUT:-150} .devbin/cuda_bench --arch "$a" --type "$t" --reps 3 \
                --json "$OUT/cuda-$a-$t.json" > "$OUT/record-$a-$t.log" 2>&1
            echo "record $a $t rc=$? in $(( $(date +%s) - t0 )) s"
            grep -E "^\|" "$OUT/record-$a-$t.log" | grep -v "^|---" | head -8
            rm -f /tmp/synth-$a-$t.gguf
        done ;;
    *) echo "records: not an H200, none taken" ;;
    esac
fi
if [ "$what" = serve ]; then
    gunzip -c .devbin/tokenizer.json.gz > /tmp/tokenizer.json
    for a in qwen3-tiny qwen35-tiny; do
        .devbin/qwenrt synth --arch $a --vocab 151936 --type f16 --tokenizer /tmp/tokenizer.json \
            -o /tmp/serve-$a.gguf 2>/dev/null || echo "synth $a failed"
        timeout ${SERVE_TIMEOUT:-200} python3 bench/cuda_serve_check.py .devbin/qwenrt \
            /tmp/serve-$a.gguf --parallel 4 --requests 8 2>&1 | tail -30
    done
fi
