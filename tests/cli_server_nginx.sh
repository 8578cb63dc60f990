#!/bin/sh
# cli_server_nginx.sh — two `qwenrt serve` replicas behind Debian's nginx on loopback, set up
# as docs/deploy.md describes: requests without a conversation key spread over both, requests
# with the same X-Conversation-Id stick to one replica (so its prompt cache hits: the second
# turn reports cached tokens), a stream passes through unbuffered, and when a replica is
# killed nginx routes its conversations to the other. $1 = the qwenrt binary.
set -eu
Q=$1
T=$(mktemp -d)
. "$(dirname "$0")/server/lib.sh"
NGINX_PID=""
# nginx gets SIGTERM (its master then stops its worker) and is waited for
stop_nginx() {
    [ -n "$NGINX_PID" ] || return 0
    kill -TERM $NGINX_PID 2>/dev/null || true
    wait $NGINX_PID 2>/dev/null || true
    NGINX_PID=""
}
trap 'stop_nginx; kill_all; rm -rf "$T"' EXIT
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || fail "nginx is missing (scripts/setup.sh installs it)"

"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/m.gguf" 2>/dev/null
start_server "$T/a.log" -m "$T/m.gguf" --parallel 2; A=$PID; PA=$PORT
start_server "$T/b.log" -m "$T/m.gguf" --parallel 2; B=$PID; PB=$PORT
# a free port for nginx (released just before nginx takes it)
PN=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
mkdir -p "$T/nginx/tmp"
USER_LINE=""
[ "$(id -u)" -ne 0 ] || USER_LINE="user root;"
cat >"$T/nginx/nginx.conf" <<CONF
$USER_LINE
worker_processes 1;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 256; }
http {
    client_body_temp_path $T/nginx/tmp/body;
    proxy_temp_path $T/nginx/tmp/proxy;
    fastcgi_temp_path $T/nginx/tmp/fastcgi;
    uwsgi_temp_path $T/nginx/tmp/uwsgi;
    scgi_temp_path $T/nginx/tmp/scgi;
    access_log off;
    # a conversation key routes a chat to one replica; without one, requests spread
    map \$http_x_conversation_id \$qwenrt_key {
        ""      \$request_id;
        default \$http_x_conversation_id;
    }
    upstream qwenrt {
        hash \$qwenrt_key consistent;
        server 127.0.0.1:$PA max_fails=1 fail_timeout=10s;
        server 127.0.0.1:$PB max_fails=1 fail_timeout=10s;
        keepalive 16;
    }
    server {
        listen 127.0.0.1:$PN;
        client_max_body_size 4m;
        location / {
            proxy_pass http://qwenrt;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
            proxy_next_upstream error timeout http_502 http_503;
            add_header X-Upstream \$upstream_addr always;
        }
    }
}
CONF
"$NGINX" -t -c "$T/nginx/nginx.conf" -p "$T/nginx" -e "$T/nginx/error.log" 2>"$T/nginx/t.log" ||
    fail "nginx config: $(cat "$T/nginx/t.log")"
"$NGINX" -c "$T/nginx/nginx.conf" -p "$T/nginx" -e "$T/nginx/error.log" >"$T/nginx/out" 2>&1 &
NGINX_PID=$!
URL="http://127.0.0.1:$PN"
i=0
until curl -s -o /dev/null --max-time 2 "$URL/health"; do
    i=$((i + 1))
    [ $i -lt 100 ] || fail "nginx did not start: $(cat "$T/nginx/error.log")"
    sleep 0.1
done

upstream() { # BODYFILE [HEADER]: prints the replica's port that answered (status must be 200)
    s=$(curl -s -o "$T/o" -D "$T/h" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
        ${2:+-H "$2"} --data-binary "@$1" "$URL/v1/chat/completions")
    [ "$s" = 200 ] || fail "through nginx: $s $(cat "$T/o")"
    sed -n 's/^[Xx]-[Uu]pstream: .*:\([0-9]*\).*/\1/p' "$T/h" | tail -n 1
}
printf '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}' >"$T/q.json"
seen=""
for k in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do seen="$seen $(upstream "$T/q.json")"; done
echo "$seen" | grep -q "$PA" || fail "replica A got no request: $seen"
echo "$seen" | grep -q "$PB" || fail "replica B got no request: $seen"

# a conversation sticks to one replica, and its second turn hits that replica's cache
printf '{"messages":[{"role":"user","content":"Tell me about nginx"}],"max_tokens":8,"temperature":0}' >"$T/t1.json"
r1=$(upstream "$T/t1.json" "X-Conversation-Id: conv-42")
cp "$T/o" "$T/r1"
node -e 'const fs=require("fs");const q=JSON.parse(fs.readFileSync(process.argv[1]));
         const r=JSON.parse(fs.readFileSync(process.argv[2]));
         q.messages.push({role:"assistant",content:r.choices[0].message.content},{role:"user",content:"More"});
         console.log(JSON.stringify(q))' "$T/t1.json" "$T/r1" >"$T/t2.json"
r=$(upstream "$T/t2.json" "X-Conversation-Id: conv-42")
[ "$r" = "$r1" ] || fail "conversation moved from $r1 to $r"
c=$(jget "$T/o" 'j.usage.prompt_tokens_details.cached_tokens')
p=$(jget "$T/o" 'j.usage.prompt_tokens')
[ "$c" -gt 0 ] && [ "$c" -lt "$p" ] || fail "second turn through nginx: cached $c of $p"
for k in 1 2 3 4; do
    r=$(upstream "$T/t2.json" "X-Conversation-Id: conv-42")
    [ "$r" = "$r1" ] || fail "conversation moved from $r1 to $r"
done

# a stream passes through nginx as events
printf '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"stream":true}' >"$T/s.json"
curl -sN --max-time 60 -H 'Content-Type: application/json' --data-binary "@$T/s.json" \
    "$URL/v1/chat/completions" >"$T/sse"
[ "$(grep -c '^data: ' "$T/sse")" -ge 3 ] || fail "stream through nginx: $(cat "$T/sse")"
grep -q '^data: \[DONE\]' "$T/sse" || fail "stream through nginx has no [DONE]"

# kill the conversation's replica: nginx routes it to the other one
if [ "$r1" = "$PA" ]; then victim=$A other=$PB; else victim=$B other=$PA; fi
kill -KILL $victim
wait $victim 2>/dev/null || true
for k in 1 2 3 4 5 6; do
    r=$(upstream "$T/t2.json" "X-Conversation-Id: conv-42")
    [ "$r" = "$other" ] || fail "request $k went to $r, not the live replica $other"
done
stop_nginx
echo "cli_server_nginx: ok (spread:$seen; conversation on $r1, then $other)"
