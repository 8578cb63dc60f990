#!/bin/sh
# cli_validate.sh — `qwenrt validate` and `qwenrt profile` end to end: exit codes, the record
# written with --out, intent gating (seed 000 is calibrate-only), the reference file path, and
# `profile check` on seed 000 naming its WGSL remap, --keep-going. $1 = the qwenrt binary.
set -eu
Q=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

M=tests/data/qwen3-tiny-f32
"$Q" validate -m $M -p 6 -n 4 --threads 2 --out "$T/v.json" > "$T/out.txt" || fail "validate exited $?"
grep -q "status     validated" "$T/out.txt" || fail "no validated status in: $(cat "$T/out.txt")"
grep -q '"status": "validated"' "$T/v.json" || fail "record lacks status validated"
grep -q '"schema_version": 1' "$T/v.json" || fail "record lacks schema_version"

grep -q "greedy     9 of 9 positions equal, 0 near ties" "$T/out.txt" || fail "no greedy summary in: $(cat "$T/out.txt")"
"$Q" validate -m $M -p 6 -n 4 --threads 2 --keep-going --out "$T/k.json" > /dev/null || fail "validate --keep-going exited $?"
grep -q '"keep_going": true' "$T/k.json" || fail "record lacks keep_going"

"$Q" validate -m $M --reference $M/reference.safetensors --threads 2 --json > "$T/f.json" || fail "fixture validate"
grep -q '"kind": "file"' "$T/f.json" || fail "fixture reference not recorded"

# usage errors exit 2, errors exit 1
set +e
"$Q" validate -p 4 >/dev/null 2>&1; [ $? -eq 2 ] || fail "validate without -m should exit 2"
"$Q" validate -m /nonexistent >/dev/null 2>&1; [ $? -eq 1 ] || fail "missing model should exit 1"
"$Q" validate -m $M --backend tpu >/dev/null 2>"$T/err"; [ $? -eq 1 ] || fail "unknown backend should exit 1"
set -e
grep -q "backend 'tpu' is not available" "$T/err" || fail "backend message: $(cat "$T/err")"

"$Q" profile list > "$T/list" || fail "profile list"
grep -q "profiles/default" "$T/list" || fail "default profile not listed"
"$Q" profile show cpu-portable -m $M > "$T/show" || fail "profile show"
grep -q "matmul.f32.portable" "$T/show" || fail "cpu-portable does not bind matmul.f32.portable"

SEED=tests/data/seeds/000_952e095aa0e655ba.txt # copy of ../shared/seeds/
if [ -n "$SEED" ]; then
    "$Q" profile check "$SEED" -m tests/data/qwen35-tiny-f32 > "$T/seed" || fail "profile check seed 000"
    grep -q "decode attention (2 ops, layers 3,7): attn_decode_head256 -> attention" "$T/seed" \
        || fail "seed 000 remap not named: $(grep -A3 remaps "$T/seed")"
    grep -q "recorded      runtime.inference.session.decodeLoop.readbackMode" "$T/seed" || fail "cadence not classified"
    set +e
    "$Q" validate -m tests/data/qwen35-tiny-f32 --profile "$SEED" >/dev/null 2>"$T/err"
    rc=$?
    set -e
    [ $rc -eq 1 ] || fail "validate accepted a calibrate-only profile"
    grep -q "not compatible with 'validate' (intent verify)" "$T/err" || fail "intent message: $(cat "$T/err")"
fi
# numeric options are checked, not read as 0: usage error (2) naming the option
for bad in "validate -m $M -p abc" "validate -m $M -n -3" "bench -m $M --trials 0" \
           "calibrate -m $M --threads x" "bench -m $M --seed -1"; do
    set +e
    "$Q" $bad >/dev/null 2>"$T/err"; rc=$?
    set -e
    [ $rc -eq 2 ] || fail "'$bad' exited $rc, expected 2"
    grep -q "expects" "$T/err" || fail "'$bad' message: $(cat "$T/err")"
done
echo "cli_validate: ok"
