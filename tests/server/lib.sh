# lib.sh — shared by tests/cli_server*.sh: start `qwenrt serve` on a free loopback port (the
# server binds port 0 and prints the port it got), stop it, and small JSON helpers (node, which
# setup.sh installs). Every server started here is killed by the caller's EXIT trap (kill_all).
PIDS=""
fail() { echo "FAIL: $*" >&2; exit 1; }

# start_server LOG ARGS...: sets PID and PORT; fails after 30 s without the "serving" line.
start_server() {
    _log=$1
    shift
    "$Q" serve --port 0 --threads 1 "$@" 2>"$_log" &
    PID=$!
    PIDS="$PIDS $PID"
    _i=0
    while ! grep -q 'serving' "$_log" 2>/dev/null; do
        _i=$((_i + 1))
        [ $_i -lt 300 ] || fail "server did not start: $(cat "$_log")"
        kill -0 "$PID" 2>/dev/null || fail "server exited: $(cat "$_log")"
        sleep 0.1
    done
    PORT=$(sed -n 's/.*http:\/\/[^:]*:\([0-9][0-9]*\).*/\1/p' "$_log" | head -n 1)
    URL="http://127.0.0.1:$PORT"
}

# stop_server PID: SIGTERM, then wait at most 20 s for a clean exit (status 0).
stop_server() {
    kill -TERM "$1" 2>/dev/null || return 0
    _i=0
    while kill -0 "$1" 2>/dev/null; do
        _i=$((_i + 1))
        [ $_i -lt 200 ] || { kill -KILL "$1"; fail "server $1 ignored SIGTERM for 20 s"; }
        sleep 0.1
    done
    wait "$1" || fail "server $1 exited with status $? after SIGTERM"
}

kill_all() {
    for p in $PIDS; do kill -KILL "$p" 2>/dev/null || true; done
    # children started with & by the test (curl clients)
    for p in $(jobs -p 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
}

# jget JSONFILE EXPR: prints the JavaScript expression EXPR over the parsed file (as j).
jget() {
    node -e 'const fs=require("fs");const j=JSON.parse(fs.readFileSync(process.argv[1],"utf8"));
             const v=eval(process.argv[2]);console.log(typeof v==="string"?v:JSON.stringify(v))' \
        "$1" "$2"
}

# http METHOD PATH BODYFILE OUT [CURL ARGS]: prints the status code, body into OUT.
http() {
    _m=$1 _p=$2 _b=$3 _o=$4
    shift 4
    if [ -n "$_b" ]; then
        curl -s -o "$_o" -w '%{http_code}' --max-time 60 -X "$_m" -H 'Content-Type: application/json' \
            --data-binary "@$_b" "$@" "$URL$_p"
    else
        curl -s -o "$_o" -w '%{http_code}' --max-time 60 -X "$_m" "$@" "$URL$_p"
    fi
}

# node_deps: installs tests/server/package.json (openai, playwright-core) with npm ci into
# NODE_DIR (next to the qwenrt binary, in the build directory; never in the source tree) and
# copies the test scripts there, so that their imports resolve. Reinstalls when the lock changes.
node_deps() {
    _src="$(cd "$(dirname "$0")/server" && pwd)"
    NODE_DIR="$(cd "$(dirname "$Q")" && pwd)/server-node"
    mkdir -p "$NODE_DIR"
    # tests run in parallel (ctest -j): one installs, the others wait (at most 5 minutes)
    _i=0
    until mkdir "$NODE_DIR/.lock" 2>/dev/null; do
        _i=$((_i + 1))
        [ $_i -lt 300 ] || fail "$NODE_DIR/.lock held for 5 minutes (remove it if stale)"
        sleep 1
    done
    _ok=1
    if ! cmp -s "$_src/package-lock.json" "$NODE_DIR/package-lock.json" ||
        [ ! -d "$NODE_DIR/node_modules/openai" ]; then
        cp "$_src/package.json" "$_src/package-lock.json" "$NODE_DIR/"
        (cd "$NODE_DIR" && npm ci --no-audit --no-fund --silent) || _ok=0
    fi
    rmdir "$NODE_DIR/.lock"
    [ $_ok = 1 ] || fail "npm ci of tests/server/package.json failed (needs the npm registry)"
    cp "$_src"/*.mjs "$NODE_DIR/"
}
