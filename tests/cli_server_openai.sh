#!/bin/sh
# cli_server_openai.sh — the official `openai` npm package (tests/server/openai_client.mjs)
# against `qwenrt serve` with an API key on a free loopback port and a tiny model carrying the
# real Qwen3 tokenizer: chat and completions, streaming and not, usage, cache, error classes.
# $1 = the qwenrt binary. npm packages go to the build directory (node_deps in server/lib.sh).
set -eu
Q=$1
T=$(mktemp -d)
. "$(dirname "$0")/server/lib.sh"
trap 'kill_all; rm -rf "$T"' EXIT
node_deps
"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/tiny.gguf" 2>/dev/null
start_server "$T/s.log" -m "$T/tiny.gguf" --parallel 2 --api-key k-123
timeout 120 node "$NODE_DIR/openai_client.mjs" "$URL" tiny k-123 || fail "openai client: $(tail -5 "$T/s.log")"
stop_server $PID
echo "cli_server_openai: ok"
