#!/bin/sh
# cli_server_browser.sh — the chat page of `qwenrt serve` in Debian's headless Chromium driven
# by playwright-core (tests/server/chat_page.mjs): a typed message gets a streamed answer, and a
# second turn hits the prompt cache. $1 = the qwenrt binary. Needs /usr/bin/chromium
# (scripts/setup.sh installs it).
set -eu
Q=$1
T=$(mktemp -d)
. "$(dirname "$0")/server/lib.sh"
trap 'kill_all; rm -rf "$T"' EXIT
[ -x /usr/bin/chromium ] || fail "/usr/bin/chromium is missing (scripts/setup.sh installs it)"
node_deps
"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/m.gguf" 2>/dev/null
start_server "$T/s.log" -m "$T/m.gguf" --parallel 2
timeout 150 node "$NODE_DIR/chat_page.mjs" "$URL" ||
    fail "chat page: $(tail -5 "$T/s.log")"
stop_server $PID
echo "cli_server_browser: ok"
