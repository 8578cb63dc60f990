#!/bin/sh
# cuda_gpu_steps_check.sh — on the GPU machine: several sampled tokens per GPU submission
# (session_generate) give the same text as token by token, end to end through `qwenrt run`
# and `qwenrt serve --backend cuda` (issue 6, session 32). Tiny synth models of both families
# carrying the real Qwen3 tokenizer (its tokenizer.json given: build/deps is not carried).
#   `qwenrt run`: --gpu-steps 1 (token by token) against the default (16) and 5, sampled and
#   greedy, with a stop string inside a submission, and a two-turn chat whose first answer ends
#   on the length limit (the last token drawn is fed when the next turn starts).
#   `qwenrt serve`: the same seeded request without logprobs (alone on the server: 16 tokens
#   per submission) and with logprobs (token by token): the same content.
# Usage: sh bench/cuda_gpu_steps_check.sh QWENRT TOKENIZER.json ; exit status 0 when all hold.
set -u
Q=$1
TOK=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
bad=0
check() { if [ -n "$3" ] && [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1: '$2' vs '$3'"; bad=1; fi; }
for a in qwen3-tiny qwen35-tiny; do
    "$Q" synth --arch $a --vocab 151936 --type f16 --tokenizer "$TOK" -o "$T/$a.gguf" 2>/dev/null || { echo "synth $a failed"; exit 1; }
    M="$T/$a.gguf"
    R="$Q run -m $M --backend cuda --no-stats"
    for s in "--temp 0.8 --top-k 40 --top-p 0.95 --seed 3" "--temp 1.5 --top-k 7 --seed 9" "--temp 0"; do
        one=$($R -p "Hello there" -n 45 $s --gpu-steps 1)
        def=$($R -p "Hello there" -n 45 $s)
        five=$($R -p "Hello there" -n 45 $s --gpu-steps 5)
        check "$a run [$s] 16 vs 1" "$def" "$one"
        check "$a run [$s] 5 vs 1" "$five" "$one"
        piece=$(printf '%s' "$one" | cut -c20-23)
        if [ -n "$piece" ]; then
            st1=$($R -p "Hello there" -n 45 $s --gpu-steps 1 --stop "$piece")
            st16=$($R -p "Hello there" -n 45 $s --stop "$piece")
            check "$a run [$s] stop '$piece'" "$st16" "$st1"
        fi
        c1=$(printf 'Hello\nAnd then?\n/exit\n' | $R -i -n 21 $s --gpu-steps 1 2>/dev/null)
        c16=$(printf 'Hello\nAnd then?\n/exit\n' | $R -i -n 21 $s 2>/dev/null)
        check "$a chat [$s] two turns" "$c16" "$c1"
    done
    "$Q" serve -m "$M" --backend cuda --port 0 --parallel 2 2>"$T/serve.log" >/dev/null &
    pid=$!
    python3 - "$T/serve.log" <<'PY' || bad=1
import json, sys, time, urllib.request
log = sys.argv[1]
for _ in range(600):
    text = open(log, errors="replace").read()
    if "serving" in text:
        break
    time.sleep(0.1)
port = int(text.split("http://", 1)[1].split(":", 1)[1].split("/", 1)[0].split()[0].rstrip(".,)"))
url = "http://127.0.0.1:%d/v1/chat/completions" % port
def ask(**extra):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 50,
            "temperature": 0.8, "top_k": 40, "seed": 11}
    body.update(extra)
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]
def gpu_step_tokens():
    m = urllib.request.urlopen(url.replace("/v1/chat/completions", "/metrics"), timeout=30).read().decode()
    return int(float([l for l in m.splitlines() if l.startswith("qwenrt_gpu_step_tokens_total")][0].split()[-1]))
g0 = gpu_step_tokens()
steps = ask()
g1 = gpu_step_tokens()
per_token = ask(logprobs=True)
g2 = gpu_step_tokens()
print("%s serve: GPU-step tokens %d -> %d (lone request), -> %d (with logprobs)" % ("ok  " if g1 > g0 and g2 == g1 else "FAIL", g0, g1, g2))
again = ask(stop=[steps[10:13]]) if len(steps) > 13 else None
ok = steps == per_token and (again is None or steps.startswith(again)) and g1 > g0 and g2 == g1
print("%s serve: 16 per submission %r, token by token %r, stop -> %r" % ("ok  " if ok else "FAIL", steps[:40], per_token[:40], again and again[:40]))
sys.exit(0 if ok else 1)
PY
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
done
exit $bad
