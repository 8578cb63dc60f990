#!/bin/sh
# cli_bench.sh — `qwenrt bench` end to end: --json prints one JSON object with
# prefill_tokens_per_s and decode_tokens_per_s (issue 2), --out and --plot write files, a
# comparison lane is timed with ratios, a validate record is reused only for the workload it
# covers, and seed 000 (calibrate) is accepted by bench. $1 = the qwenrt binary.
set -eu
Q=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

M=tests/data/qwen35-tiny-f32
"$Q" bench -m $M -p 8 -n 4 --warmup 1 --trials 3 --threads 2 --json --out "$T/b.json" --plot "$T/b.svg" \
    --compare profile:cpu-portable > "$T/stdout" 2> "$T/table" || fail "bench exited $?"
python3 - "$T/stdout" <<'PY' || fail "--json output"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "timed", r["status"]
assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
assert len(r["lanes"]) == 2 and "ratio_candidate_over_this" in r["lanes"][1]
assert r["per_token_ms"]["p50"] > 0
assert r["lanes"][0]["kv_cache"] == "f32", r["lanes"][0].get("kv_cache")  # the CPU's default
PY
[ -s "$T/b.json" ] || fail "--out wrote nothing"
grep -q "<svg" "$T/b.svg" || fail "--plot wrote no svg"
grep -q "decode t/s" "$T/table" || fail "no table on stderr with --json"

"$Q" validate -m $M -p 8 -n 4 --threads 2 --out "$T/v.json" >/dev/null || fail "validate"
"$Q" bench -m $M -p 8 -n 4 --warmup 0 --trials 1 --validation "$T/v.json" >/dev/null || fail "bench with record"
set +e
"$Q" bench -m $M -p 8 -n 5 --validation "$T/v.json" >/dev/null 2>"$T/err"; rc=$?
set -e
[ $rc -eq 1 ] || fail "a record for another workload was accepted"
grep -q "covers another workload" "$T/err" || fail "refusal message: $(cat "$T/err")"

SEED=tests/data/seeds/000_952e095aa0e655ba.txt # copy of ../shared/seeds/
if [ -n "$SEED" ]; then
    "$Q" bench -m $M --profile "$SEED" -p 8 -n 4 --warmup 0 --trials 1 >/dev/null || fail "bench refused seed 000"
fi
# calibrate writes a profile that binds and validates; card gathers the records
"$Q" calibrate -m $M -p 6 -n 3 --warmup 0 --trials 1 --threads 2 -o "$T/cal.json" --out "$T/ev.json" >/dev/null \
    || fail "calibrate"
"$Q" profile check "$T/cal.json" -m $M >/dev/null || fail "calibrated profile does not bind"
grep -q '"kind": "calibration"' "$T/ev.json" || fail "calibrate evidence record"
# a dense model: no candidate for the DeltaNet kernels it lacks (a profile patching gdn_core
# was refused by the binder), and no candidate file left behind in /tmp
before=$(ls -d /tmp/qwenrt-calibrate-* 2>/dev/null | wc -l)
"$Q" calibrate -m tests/data/qwen3-tiny-f32 -p 6 -n 3 --warmup 0 --trials 1 --threads 2 \
    -o "$T/cal3.json" --out "$T/ev3.json" >"$T/cal3.out" 2>&1 || fail "calibrate qwen3: $(cat "$T/cal3.out")"
grep -q '"op": "gdn' "$T/ev3.json" && fail "qwen3 calibration tried DeltaNet kernels"
[ "$(ls -d /tmp/qwenrt-calibrate-* 2>/dev/null | wc -l)" = "$before" ] || fail "calibrate left its directory"
# a profile with CUDA decode shapes binds on the CPU (which ignores them) and says so; calibrate
# --backend cuda either runs (a GPU) or says why CUDA cannot run here
cat > "$T/cudatune.json" <<'JSON'
{"id": "cudatune", "name": "cudatune", "owner": "t", "intent": "calibrate",
 "compatibleIntents": ["calibrate", "investigate", "verify"], "stability": "experimental",
 "createdAtUtc": "2026-12-01T00:00:00Z", "extends": "profiles/default",
 "runtime": {"inference": {"cudaTuning": {"gemvSmemWarps": 16, "gemvSmemLaunch": "before-wait"}}}}
JSON
"$Q" profile check "$T/cudatune.json" -m $M >/dev/null || fail "a cudaTuning profile does not bind"
"$Q" profile show "$T/cudatune.json" | grep -q "cudaTuning" || fail "profile show lacks cudaTuning"
"$Q" bench -m $M --profile "$T/cudatune.json" -p 4 -n 2 --warmup 0 --trials 1 --threads 2 >/dev/null \
    || fail "bench with a cudaTuning profile on the CPU"
if "$Q" calibrate -m $M --backend cuda -p 6 -n 8 --warmup 0 --trials 1 -o "$T/calc.json" --out "$T/evc.json" \
    >"$T/calc.out" 2>&1; then
    grep -q '"backend": "cuda"' "$T/evc.json" || fail "cuda calibration record"
    grep -q '"cudaTuning"' "$T/calc.json" || fail "cuda calibration profile"
else
    grep -qi "cuda" "$T/calc.out" || fail "calibrate --backend cuda failed without naming CUDA: $(cat "$T/calc.out")"
fi
# --depth-max (the attention's cluster window): a bad value is a usage error naming the option
for bad in -1 abc 4194305; do
    set +e
    "$Q" calibrate -m $M --backend cuda --depth-max $bad -o "$T/never.json" >"$T/dm.out" 2>&1
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "calibrate --depth-max $bad: exit $rc, expected 2"
    grep -q -- "--depth-max" "$T/dm.out" || fail "calibrate --depth-max $bad: $(cat "$T/dm.out")"
done
[ -e "$T/never.json" ] && fail "calibrate wrote a profile after a usage error"
mkdir "$T/records"
cp "$T/v.json" "$T/b.json" "$T/records/"
echo "written by a person" > "$T/pitfalls.txt"
"$Q" card "$T/records" -o "$T/card.json" --md "$T/card.md" --pitfalls "$T/pitfalls.txt" >/dev/null || fail "card"
python3 - "$T/card.json" <<'PY' || fail "card content"
import json, sys
c = json.load(open(sys.argv[1]))
assert len(c["validations"]) == 1 and len(c["benchmarks"]) == 1, c
assert len(c["device"]["records"]) == 2 and all("source" in r for r in c["device"]["records"])
assert c["pitfalls"] == ["written by a person"]
assert c["artifacts"] and all(len(a["sha256"]) == 64 for a in c["artifacts"])
PY
grep -q "## Benchmarks" "$T/card.md" || fail "card markdown"
echo "cli_bench: ok"
