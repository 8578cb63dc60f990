#!/bin/sh
# cli_run.sh — `qwenrt run` end to end on a tiny model that carries the real Qwen3 tokenizer
# (synth --vocab 151936): greedy output is deterministic, the same seed gives the same sampled
# text and another seed other text, a stop string ends the answer before it, an interactive
# chat continues across turns and /reset works, --precision and --gpu-steps are parsed, bad
# flags are refused.
# $1 = the qwenrt binary.
set -eu
Q=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/m.gguf" 2>/dev/null
[ -s "$T/m.gguf" ] || fail "synth wrote nothing"

a=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2)
b=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 1)
[ -n "$a" ] || fail "greedy run printed nothing"
[ "$a" = "$b" ] || fail "greedy output differs between thread counts: '$a' vs '$b'"

s1=$("$Q" run -m "$T/m.gguf" -p "Hi" -n 24 --temp 1.0 --seed 5 --no-stats)
s2=$("$Q" run -m "$T/m.gguf" -p "Hi" -n 24 --temp 1.0 --seed 5 --no-stats)
s3=$("$Q" run -m "$T/m.gguf" -p "Hi" -n 24 --temp 1.0 --seed 6 --no-stats)
[ "$s1" = "$s2" ] || fail "same seed, different text"
[ "$s1" != "$s3" ] || fail "different seeds, same text"

# stop string: take a piece of the greedy answer and stop on it
piece=$(printf '%s' "$a" | cut -c4-6)
if [ -n "$piece" ]; then
    st=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --stop "$piece")
    case "$st" in *"$piece"*) fail "stop string '$piece' was emitted: '$st'" ;; esac
    case "$a" in "$st"*) ;; *) fail "stopped text '$st' is not a prefix of '$a'" ;; esac
fi

# interactive: two turns, a reset, exit; the stats line shows the second turn processed only
# its own tokens (fewer than the whole conversation)
out=$(printf 'Hello\nHow are you?\n/reset\nHello\n/exit\n' | \
      "$Q" run -m "$T/m.gguf" -i -n 8 --temp 0 2>"$T/err")
grep -c '^\[prompt' "$T/err" | grep -q '^3$' || fail "expected 3 answered turns: $(cat "$T/err")"
p1=$(grep '^\[prompt' "$T/err" | sed -n 1p | sed 's/\[prompt \([0-9]*\).*/\1/')
p2=$(grep '^\[prompt' "$T/err" | sed -n 2p | sed 's/\[prompt \([0-9]*\).*/\1/')
p3=$(grep '^\[prompt' "$T/err" | sed -n 3p | sed 's/\[prompt \([0-9]*\).*/\1/')
[ "$p3" = "$p1" ] || fail "after /reset the first turn should cost the same ($p1 vs $p3)"
grep -q 'conversation reset' "$T/err" || fail "/reset not acknowledged"
[ "$p2" -lt $((p1 + 16)) ] || fail "second turn re-processed the conversation ($p2 tokens)"

# precision: exact is accepted (the CPU backend ignores it: the same greedy text), anything
# else refused by name, by run and by serve
e=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2 --precision exact)
[ "$e" = "$a" ] || fail "--precision exact changed the CPU's output: '$e' vs '$a'"
if "$Q" run -m "$T/m.gguf" -p x --precision fast 2>"$T/err"; then fail "--precision fast accepted"; fi
grep -q "precision must be default or exact, got 'fast'" "$T/err" || fail "precision error: $(cat "$T/err")"
# the KV cache's type: f32 (the default: the same text), f16 (runs; the fixtures' tests check
# its numbers), anything else refused by name
e=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2 --kv-type f32)
[ "$e" = "$a" ] || fail "--kv-type f32 changed the CPU's output: '$e' vs '$a'"
e=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2 --kv-type default)
[ "$e" = "$a" ] || fail "--kv-type default is not f32 on the CPU: '$e' vs '$a'"
e=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2 --kv-type f16) ||
    fail "--kv-type f16 failed"
[ -n "$e" ] || fail "--kv-type f16 generated nothing"
if "$Q" run -m "$T/m.gguf" -p x --kv-type q8 2>"$T/err"; then fail "--kv-type q8 accepted"; fi
# --keep-layer-types: nothing is converted on the CPU, so the same text
e=$("$Q" run -m "$T/m.gguf" -p "Hello" -n 16 --temp 0 --no-stats --threads 2 --keep-layer-types)
[ "$e" = "$a" ] || fail "--keep-layer-types changed the CPU's output: '$e' vs '$a'"
grep -q "kv-type must be default, f32 or f16, got 'q8'" "$T/err" || fail "kv-type error: $(cat "$T/err")"
if "$Q" compare -m "$T/m.gguf" --ref "$T/m.gguf" -n 4 --kv-type f16 2>"$T/err"; then fail "compare --kv-type f16 accepted"; fi
grep -q "compare: --kv-type f16 is not taken here" "$T/err" || fail "compare kv-type error: $(cat "$T/err")"
"$Q" compare -m "$T/m.gguf" --ref "$T/m.gguf" -n 16 --precision exact --out "$T/cmp.json" >/dev/null \
    || fail "compare --precision exact"
grep -q '"precision": "exact"' "$T/cmp.json" || fail "compare record lacks the precision: $(cat "$T/cmp.json")"
grep -q '"kl_max": 0' "$T/cmp.json" || fail "a model against itself: $(cat "$T/cmp.json")"
if "$Q" serve -m "$T/m.gguf" --precision 1 2>"$T/err"; then fail "serve --precision 1 accepted"; fi
grep -q "precision must be default or exact, got '1'" "$T/err" || fail "serve precision error: $(cat "$T/err")"

# --gpu-steps: tokens per GPU submission (on the CPU the text is the same whatever the value)
g=$("$Q" run -m "$T/m.gguf" -p "Hi" -n 24 --temp 1.0 --seed 5 --no-stats --gpu-steps 1)
[ "$g" = "$s1" ] || fail "--gpu-steps 1 changed the CPU's sampled text: '$g' vs '$s1'"
if "$Q" run -m "$T/m.gguf" -p x --gpu-steps 65 2>"$T/err"; then fail "--gpu-steps 65 accepted"; fi
grep -q -- "--gpu-steps expects an integer in \[1, 64\], got '65'" "$T/err" || fail "gpu-steps error: $(cat "$T/err")"

# refused input
if "$Q" run -m "$T/m.gguf" -p x --temp abc 2>/dev/null; then fail "--temp abc accepted"; fi
if "$Q" run -m "$T/m.gguf" 2>/dev/null; then fail "run without -p or -i accepted"; fi
if "$Q" run -m "$T/nope.gguf" -p x 2>"$T/err"; then fail "missing model accepted"; fi
grep -q 'nope.gguf' "$T/err" || fail "missing model error does not name the file"
# profiles: run has the investigate intent; seed 000 is calibrate-only and is refused by name
"$Q" run -m "$T/m.gguf" -p hi -n 2 --temp 0 --no-stats --profile cpu-portable >/dev/null || fail "--profile cpu-portable"
if "$Q" run -m "$T/m.gguf" -p hi -n 2 --profile tests/data/seeds/000_952e095aa0e655ba.txt 2>"$T/err"; then
    fail "a calibrate-only profile was accepted by run"
fi
grep -q "not compatible with 'run'" "$T/err" || fail "intent refusal message: $(cat "$T/err")"
echo "cli_run: ok"
