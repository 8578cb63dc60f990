#!/bin/sh
# server_load.sh — load benchmark of `qwenrt serve` on the CPU with a tiny model (not a test):
# one streaming client, then 64 concurrent ones, each for a bounded time; every request must
# complete (none lost), and the server's resident memory after the load must match the memory
# after the single-client warm-up (flat). Prints one JSON line per run and the RSS figures.
# Usage: bench/server_load.sh [QWENRT_BIN] [SECONDS] [PARALLEL] [THREADS]
#        (defaults: build/qwenrt 20 8 1)
set -eu
Q=${1:-build/qwenrt}
SECS=${2:-20}
PAR=${3:-8}
THR=${4:-1}
T=$(mktemp -d)
trap 'kill $SPID 2>/dev/null; rm -rf "$T"' EXIT
"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/m.gguf" 2>/dev/null
"$Q" serve -m "$T/m.gguf" --port 0 --parallel "$PAR" --threads "$THR" --queue 128 --no-log 2>"$T/log" &
SPID=$!
until grep -q serving "$T/log"; do sleep 0.1; done
URL="http://127.0.0.1:$(sed -n 's/.*:\([0-9][0-9]*\) (.*/\1/p' "$T/log")"
rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\).*/\1/p' /proc/$SPID/status; }
echo "server: $(grep serving "$T/log")"
echo "rss_kb start $(rss)"
node "$(dirname "$0")/server_load.mjs" "$URL" 1 "$SECS" 64
echo "rss_kb after 1 client $(rss)"
node "$(dirname "$0")/server_load.mjs" "$URL" 64 "$SECS" 64
echo "rss_kb after 64 clients $(rss)"
node "$(dirname "$0")/server_load.mjs" "$URL" 64 "$SECS" 64
echo "rss_kb after 64 clients again $(rss)"
curl -s "$URL/metrics" | grep -E '^qwenrt_(requests_total|completion_tokens|requests_cancelled|requests_rejected|prompt_cache_(bytes|entries))'
kill -TERM $SPID
wait $SPID && echo "clean exit"
