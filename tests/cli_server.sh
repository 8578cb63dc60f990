#!/bin/sh
# cli_server.sh — `qwenrt serve` against curl on a free loopback port, with a tiny model that
# carries the real Qwen3 tokenizer: health, models, chat and completions (JSON and server-sent
# events, usage), greedy answers equal to `qwenrt run`, OpenAI error shapes (malformed JSON,
# wrong types, unknown model, n=2, oversized body, unknown path, wrong method, missing or
# wrong API key), 429 when the queue is full, a client that disconnects mid-stream frees its
# slot at once, slow writers are cut off while others are served, a slow reader completes,
# metrics, the request log, prompt caching across two chat turns with Qwen3.5 geometry
# (KV + DeltaNet state), and a clean exit on SIGTERM in the middle of a stream.
# $1 = the qwenrt binary. Bounded: every curl has --max-time; servers die with the test.
set -eu
Q=$1
T=$(mktemp -d)
. "$(dirname "$0")/server/lib.sh"
trap 'kill_all; rm -rf "$T"' EXIT

"$Q" synth --arch qwen3-tiny --vocab 151936 --type f16 -o "$T/m.gguf" 2>/dev/null
"$Q" synth --arch qwen35-tiny --vocab 151936 --type f16 -o "$T/m35.gguf" 2>/dev/null

# ---------------------------------------------------------------- basics
start_server "$T/s1.log" -m "$T/m.gguf" --parallel 2 --max-body-kb 64 --timeout 2
S1=$PID
[ "$(http GET /health "" "$T/o")" = 200 ] || fail "health"
grep -q '"ok"' "$T/o" || fail "health body: $(cat "$T/o")"
[ "$(http GET /v1/models "" "$T/o")" = 200 ] || fail "models"
[ "$(jget "$T/o" 'j.data[0].id')" = m ] || fail "model id: $(cat "$T/o")"
[ "$(http GET /v1/models/m "" "$T/o")" = 200 ] || fail "models/m"
[ "$(http GET / "" "$T/o")" = 200 ] || fail "chat page"
grep -q '/v1/chat/completions' "$T/o" || fail "chat page does not call the API"

cat >"$T/chat.json" <<'J'
{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,
 "chat_template_kwargs":{"enable_thinking":false}}
J
[ "$(http POST /v1/chat/completions "$T/chat.json" "$T/c1")" = 200 ] || fail "chat: $(cat "$T/c1")"
[ "$(jget "$T/c1" 'j.object')" = chat.completion ] || fail "chat object: $(cat "$T/c1")"
[ "$(jget "$T/c1" 'j.choices[0].message.role')" = assistant ] || fail "role"
[ "$(jget "$T/c1" 'j.usage.completion_tokens')" -le 8 ] || fail "usage: $(cat "$T/c1")"
[ "$(jget "$T/c1" 'j.usage.total_tokens==j.usage.prompt_tokens+j.usage.completion_tokens')" = true ] || fail "total_tokens"
answer=$(jget "$T/c1" 'j.choices[0].message.content')
# the same greedy request through `qwenrt run` (same template, same decode loop)
ref=$("$Q" run -m "$T/m.gguf" -p Hi -n 8 --temp 0 --no-stats --threads 1)
[ "$answer" = "$ref" ] || fail "server answer '$answer' differs from qwenrt run '$ref'"
http POST /v1/chat/completions "$T/chat.json" "$T/c2" >/dev/null
[ "$(jget "$T/c2" 'j.choices[0].message.content')" = "$answer" ] || fail "greedy not repeatable"
[ "$(jget "$T/c2" 'j.usage.prompt_tokens_details.cached_tokens==j.usage.prompt_tokens')" = true ] \
    || fail "a repeated prompt should come whole from the cache: $(cat "$T/c2")"

# stream_events PATH BODY_FILE: the JSON of every data event of a streamed request, one a line
stream_events() {
    curl -sN --max-time 60 -H 'Content-Type: application/json' --data-binary "@$2" "$URL$1" |
        grep '^data: {' | sed 's/^data: //'
}

# streaming: role first, text deltas, finish_reason, usage chunk, [DONE]; same text
sed 's/"max_tokens":8/"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}/' \
    "$T/chat.json" >"$T/chat_s.json"
curl -sN --max-time 60 -H 'Content-Type: application/json' --data-binary "@$T/chat_s.json" \
    -D "$T/h" "$URL/v1/chat/completions" >"$T/sse"
grep -qi '^content-type: text/event-stream' "$T/h" || fail "stream content type: $(cat "$T/h")"
[ "$(tail -n 2 "$T/sse" | head -n 1)" = "data: [DONE]" ] || fail "stream does not end with [DONE]"
grep '^data: {' "$T/sse" | sed 's/^data: //' >"$T/events"
node -e '
const ev=require("fs").readFileSync(process.argv[1],"utf8").trim().split("\n").map(JSON.parse);
if(ev[0].choices[0].delta.role!=="assistant")throw "first chunk has no role";
let text="";for(const e of ev)if(e.choices.length&&e.choices[0].delta.content)text+=e.choices[0].delta.content;
const fin=ev.filter(e=>e.choices.length&&e.choices[0].finish_reason);
if(fin.length!==1)throw "expected one finish_reason chunk";
const u=ev[ev.length-1];if(!u.usage||u.choices.length!==0)throw "no usage chunk last";
if(ev.some(e=>e.object!=="chat.completion.chunk"))throw "chunk object";
if(text!==process.argv[2])throw "streamed text differs: "+JSON.stringify(text);
' "$T/events" "$answer" || fail "stream checks"

# tools offered: the (random) model answers in text, so the answer is content with the usual
# finish reason, streamed or not, and the whole streamed text arrives (held-back tails too)
node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));j.max_tokens=12;
         j.tools=[{type:"function",function:{name:"get_weather",description:"Weather of a city",
           parameters:{type:"object",properties:{city:{type:"string"}},required:["city"]}}}];
         console.log(JSON.stringify(j))' "$T/chat.json" >"$T/tools.json"
[ "$(http POST /v1/chat/completions "$T/tools.json" "$T/o")" = 200 ] || fail "tools: $(cat "$T/o")"
tanswer=$(jget "$T/o" 'j.choices[0].message.content')
[ "$(jget "$T/o" '["stop","length","tool_calls"].includes(j.choices[0].finish_reason)')" = true ] \
    || fail "tools finish_reason: $(cat "$T/o")"
sed 's/"max_tokens":12/"max_tokens":12,"stream":true/' "$T/tools.json" >"$T/tools_s.json"
stream_events /v1/chat/completions "$T/tools_s.json" >"$T/tev"
node -e '
const ev=require("fs").readFileSync(process.argv[1],"utf8").trim().split("\n").map(JSON.parse);
let text="";for(const e of ev)if(e.choices.length&&e.choices[0].delta.content)text+=e.choices[0].delta.content;
if(process.argv[2]!=="null"&&text!==process.argv[2])throw "streamed text with tools differs: "+JSON.stringify(text);
' "$T/tev" "$tanswer" || fail "tools stream checks"

# logprobs, greedy: one entry per generated token, each the most likely one (its logprob is
# the first alternative's), alternatives sorted, all <= 0; the stream carries the same entries
node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));j.logprobs=true;
         j.top_logprobs=3;console.log(JSON.stringify(j))' "$T/chat.json" >"$T/lp.json"
[ "$(http POST /v1/chat/completions "$T/lp.json" "$T/lp")" = 200 ] || fail "logprobs: $(cat "$T/lp")"
sed 's/"logprobs":true/"logprobs":true,"stream":true/' "$T/lp.json" >"$T/lp_s.json"
stream_events /v1/chat/completions "$T/lp_s.json" >"$T/lpev"
node -e '
const fs=require("fs");const r=JSON.parse(fs.readFileSync(process.argv[1]));
const c=r.choices[0].logprobs.content, n=r.usage.completion_tokens;
if(c.length!==n&&!(r.choices[0].finish_reason==="stop"&&c.length===n-1))throw "entries "+c.length+" for "+n+" tokens";
for(const t of c){
  if(!(t.logprob<=0))throw "logprob > 0";
  if(t.top_logprobs.length!==3)throw "top_logprobs count";
  if(t.top_logprobs[0].token!==t.token||Math.abs(t.top_logprobs[0].logprob-t.logprob)>1e-6)throw "greedy token is not the most likely";
  for(let k=1;k<3;k++)if(t.top_logprobs[k].logprob>t.top_logprobs[k-1].logprob)throw "alternatives not sorted";
  if(!Array.isArray(t.bytes)||!t.bytes.length)throw "bytes";
}
if(c.map(t=>t.token).join("")!==r.choices[0].message.content&&!c.some(t=>t.token.includes("\ufffd")))throw "tokens do not spell the content";
const ev=fs.readFileSync(process.argv[2],"utf8").trim().split("\n").map(JSON.parse);
let s=[];for(const e of ev)if(e.choices.length&&e.choices[0].logprobs)s=s.concat(e.choices[0].logprobs.content);
if(JSON.stringify(s.map(t=>[t.token,t.logprob]))!==JSON.stringify(c.map(t=>[t.token,t.logprob])))throw "streamed logprobs differ";
' "$T/lp" "$T/lpev" || fail "logprobs checks: $(head -c 600 "$T/lp")"

printf '{"prompt":"Once upon a time","max_tokens":6,"temperature":0}' >"$T/cmp.json"
[ "$(http POST /v1/completions "$T/cmp.json" "$T/o")" = 200 ] || fail "completions: $(cat "$T/o")"
[ "$(jget "$T/o" 'j.object')" = text_completion ] || fail "completion object"
[ "$(jget "$T/o" 'j.choices[0].finish_reason')" = length ] || fail "finish_reason"
[ "$(jget "$T/o" 'j.usage.completion_tokens')" = 6 ] || fail "completion tokens: $(cat "$T/o")"

# "n": several choices in one response. Greedy: each equals the single answer above, the prompt
# counts once, the completion tokens n times. Sampled: choice i draws with seed + i, so the
# choices differ from each other and a repeated request gives the same ones
sed 's/"temperature":0}/"temperature":0,"n":3}/' "$T/cmp.json" >"$T/cmp_n.json"
[ "$(http POST /v1/completions "$T/cmp_n.json" "$T/on")" = 200 ] || fail "n=3: $(cat "$T/on")"
printf '{"prompt":"Once upon a time","max_tokens":6,"temperature":1,"seed":5,"n":4}' >"$T/cmp_ns.json"
http POST /v1/completions "$T/cmp_ns.json" "$T/ons1" >/dev/null
http POST /v1/completions "$T/cmp_ns.json" "$T/ons2" >/dev/null
node -e '
const fs=require("fs"), rd=f=>JSON.parse(fs.readFileSync(f));
const one=rd(process.argv[1]), r=rd(process.argv[2]), s1=rd(process.argv[3]), s2=rd(process.argv[4]);
if(r.choices.length!==3)throw "choices "+r.choices.length;
r.choices.forEach((c,i)=>{if(c.index!==i)throw "index "+c.index;if(c.text!==one.choices[0].text)throw "greedy choice "+i+" differs";});
if(r.usage.prompt_tokens!==one.usage.prompt_tokens||r.usage.completion_tokens!==3*one.usage.completion_tokens)throw "usage "+JSON.stringify(r.usage);
const t1=s1.choices.map(c=>c.text), t2=s2.choices.map(c=>c.text);
if(t1.length!==4||new Set(t1).size<2)throw "sampled choices "+JSON.stringify(t1);
if(JSON.stringify(t1)!==JSON.stringify(t2))throw "seeded choices not repeatable";
' "$T/o" "$T/on" "$T/ons1" "$T/ons2" || fail "n responses: $(head -c 400 "$T/on") / $(head -c 400 "$T/ons1")"
# an array of prompts (lm-evaluation-harness batches them): choices prompt-major, each prompt's
# greedy answers equal to its own single answer, every prompt counted once in usage; scoring
# (echo + logprobs + max_tokens 0) gives each prompt its own text and token logprobs
printf '{"prompt":"Hello","max_tokens":6,"temperature":0}' >"$T/cmp_b.json"
http POST /v1/completions "$T/cmp_b.json" "$T/ob1" >/dev/null
printf '{"prompt":["Once upon a time","Hello"],"max_tokens":6,"temperature":0,"n":2}' >"$T/cmp_mp.json"
[ "$(http POST /v1/completions "$T/cmp_mp.json" "$T/omp")" = 200 ] || fail "prompt array: $(cat "$T/omp")"
printf '{"prompt":["Once upon a time","Hello"],"max_tokens":0,"echo":true,"logprobs":1}' >"$T/cmp_sc.json"
[ "$(http POST /v1/completions "$T/cmp_sc.json" "$T/osc")" = 200 ] || fail "prompt array scoring: $(cat "$T/osc")"
node -e '
const fs=require("fs"), rd=f=>JSON.parse(fs.readFileSync(f));
const a=rd(process.argv[1]), b=rd(process.argv[2]), r=rd(process.argv[3]), sc=rd(process.argv[4]);
const want=[a,a,b,b].map(x=>x.choices[0].text);
if(JSON.stringify(r.choices.map(c=>c.text))!==JSON.stringify(want))throw "choices "+JSON.stringify(r.choices.map(c=>c.text));
r.choices.forEach((c,i)=>{if(c.index!==i)throw "index"});
if(r.usage.prompt_tokens!==a.usage.prompt_tokens+b.usage.prompt_tokens)throw "prompt tokens "+r.usage.prompt_tokens;
if(r.usage.completion_tokens!==2*(a.usage.completion_tokens+b.usage.completion_tokens))throw "completion tokens";
const prompts=["Once upon a time","Hello"];
sc.choices.forEach((c,i)=>{
  if(c.text!==prompts[i])throw "scored text "+c.text;
  if(c.logprobs.tokens.join("")!==prompts[i]||c.logprobs.token_logprobs[0]!==null)throw "scored logprobs "+JSON.stringify(c.logprobs);
});
' "$T/o" "$T/ob1" "$T/omp" "$T/osc" || fail "prompt array: $(head -c 600 "$T/omp") / $(head -c 600 "$T/osc")"

# /tokenize and /detokenize (llama.cpp server's form): ids round trip to the text; pieces spell
# it, a piece that is part of a UTF-8 character comes as its bytes
printf '{"content":"Hello, world! h\\u00e9llo \\ud800\\udf48"}' >"$T/tk.json"
[ "$(http POST /tokenize "$T/tk.json" "$T/tko")" = 200 ] || fail "tokenize: $(cat "$T/tko")"
node -e 'const fs=require("fs");console.log(JSON.stringify({tokens:JSON.parse(fs.readFileSync(process.argv[1])).tokens}))' \
    "$T/tko" >"$T/dtk.json"
[ "$(http POST /detokenize "$T/dtk.json" "$T/dtko")" = 200 ] || fail "detokenize: $(cat "$T/dtko")"
node -e 'const fs=require("fs"),rd=f=>JSON.parse(fs.readFileSync(f));
if(rd(process.argv[1]).content!==rd(process.argv[2]).content)throw "differs"' "$T/dtko" "$T/tk.json" ||
    fail "tokenize/detokenize round trip: $(cat "$T/tko") -> $(cat "$T/dtko")"
sed 's/}$/,"with_pieces":true}/' "$T/tk.json" >"$T/tkp.json"
[ "$(http POST /tokenize "$T/tkp.json" "$T/tkpo")" = 200 ] || fail "tokenize pieces: $(cat "$T/tkpo")"
node -e '
const fs=require("fs"), r=JSON.parse(fs.readFileSync(process.argv[1])), ids=JSON.parse(fs.readFileSync(process.argv[2])).tokens;
const text=JSON.parse(fs.readFileSync(process.argv[3])).content;
if(JSON.stringify(r.tokens.map(t=>t.id))!==JSON.stringify(ids))throw "ids differ";
const bytes=Buffer.concat(r.tokens.map(t=>typeof t.piece==="string"?Buffer.from(t.piece,"utf8"):Buffer.from(t.piece)));
if(bytes.toString("utf8")!==text)throw "pieces spell "+bytes.toString("utf8");
if(!r.tokens.some(t=>Array.isArray(t.piece)))throw "no byte piece for U+10348";
' "$T/tkpo" "$T/tko" "$T/tk.json" || fail "pieces: $(cat "$T/tkpo")"

# logit_bias: +100 on token 15 ("0" in the Qwen tokenizer) forces it at every step, greedy or
# sampled, in every choice; -100 bans it (the greedy answer then has no "0")
printf '{"prompt":"Once upon a time","max_tokens":4,"temperature":0.8,"seed":3,"n":2,"logit_bias":{"15":100}}' >"$T/cmp_bias.json"
[ "$(http POST /v1/completions "$T/cmp_bias.json" "$T/ob")" = 200 ] || fail "logit_bias: $(cat "$T/ob")"
[ "$(jget "$T/ob" 'j.choices.map(c=>c.text).join("|")')" = "0000|0000" ] || fail "logit_bias +100: $(cat "$T/ob")"
printf '{"prompt":"0","max_tokens":4,"temperature":0,"logit_bias":{"15":-100}}' >"$T/cmp_ban.json"
[ "$(http POST /v1/completions "$T/cmp_ban.json" "$T/oban")" = 200 ] || fail "logit_bias ban: $(cat "$T/oban")"
jget "$T/oban" 'j.choices[0].text.includes("0")' | grep -q false || fail "logit_bias -100: $(cat "$T/oban")"

# the choices share one processing of the prompt: choice 0 processes it, the others wait for
# it and restore it from the prompt cache (a new prompt longer than one prefill chunk, 256
# tokens, so that a second slot would otherwise start on it at once: two hits, twice its
# tokens cached)
metric() { http GET /metrics "" "$T/m" >/dev/null; sed -n "s/^$1 //p" "$T/m"; }
h0=$(metric qwenrt_prompt_cache_hits_total); c0=$(metric qwenrt_prompt_tokens_cached_total)
node -e 'console.log(JSON.stringify({prompt:"Three answers share this prompt:"+" again and".repeat(300),max_tokens:4,temperature:0,n:3}))' >"$T/cmp_share.json"
[ "$(http POST /v1/completions "$T/cmp_share.json" "$T/osh")" = 200 ] || fail "n=3 shared: $(cat "$T/osh")"
h1=$(metric qwenrt_prompt_cache_hits_total); c1=$(metric qwenrt_prompt_tokens_cached_total)
np=$(jget "$T/osh" 'j.usage.prompt_tokens')
[ $((h1 - h0)) = 2 ] && [ $((c1 - c0)) = $((2 * np)) ] ||
    fail "n=3 should process its prompt once: cache hits +$((h1 - h0)), cached tokens +$((c1 - c0)) of $np"
# streamed: the same choices, each one's chunks carrying its index, one finish per index, one
# usage chunk summing the completions
printf '{"prompt":"Once upon a time","max_tokens":6,"temperature":1,"seed":5,"n":4,"stream":true,"stream_options":{"include_usage":true}}' >"$T/cmp_nst.json"
stream_events /v1/completions "$T/cmp_nst.json" >"$T/nev"
node -e '
const fs=require("fs"), r=JSON.parse(fs.readFileSync(process.argv[1]));
const ev=fs.readFileSync(process.argv[2],"utf8").trim().split("\n").map(JSON.parse);
const text=["","","",""], fin=[0,0,0,0];let usage=null;
for(const e of ev){
  if(!e.choices.length){usage=e.usage;continue;}
  const c=e.choices[0];text[c.index]+=c.text;if(c.finish_reason)fin[c.index]++;
}
if(JSON.stringify(text)!==JSON.stringify(r.choices.map(c=>c.text)))throw "streamed choices differ: "+JSON.stringify(text);
if(fin.some(f=>f!==1))throw "finish chunks "+fin;
if(!usage||usage.completion_tokens!==r.usage.completion_tokens)throw "usage "+JSON.stringify(usage);
' "$T/ons1" "$T/nev" || fail "streamed n: $(head -c 600 "$T/nev")"

# completions logprobs (OpenAI's legacy form), greedy: parallel arrays over the 6 tokens, each
# token the most likely of its 3 alternatives, offsets growing by each token's code points; the
# stream carries the same tokens with offsets continuing across chunks
printf '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"logprobs":3}' >"$T/cmp_lp.json"
[ "$(http POST /v1/completions "$T/cmp_lp.json" "$T/clp")" = 200 ] || fail "completions logprobs: $(cat "$T/clp")"
sed 's/"logprobs":3/"logprobs":3,"stream":true/' "$T/cmp_lp.json" >"$T/cmp_lp_s.json"
stream_events /v1/completions "$T/cmp_lp_s.json" >"$T/clpev"
node -e '
const fs=require("fs");const r=JSON.parse(fs.readFileSync(process.argv[1]));
const l=r.choices[0].logprobs, n=r.usage.completion_tokens;
if(l.tokens.length!==n||l.token_logprobs.length!==n||l.top_logprobs.length!==n||l.text_offset.length!==n)throw "arrays of "+n;
let off=0;const partial=l.tokens.some(t=>t.includes("\ufffd")); /* bytes of a character split over tokens: offsets count code points */
for(let i=0;i<n;i++){
  if(!(l.token_logprobs[i]<=0))throw "logprob > 0";
  const alts=Object.values(l.top_logprobs[i]);
  if(alts.length<1||alts.length>3)throw "alternatives "+alts.length;
  if(Math.abs(Math.max(...alts)-l.token_logprobs[i])>1e-6)throw "greedy token is not the most likely";
  if(partial?(i&&l.text_offset[i]<l.text_offset[i-1]):l.text_offset[i]!==off)throw "text_offset "+l.text_offset[i]+" expected "+off;
  off+=[...l.tokens[i]].length;
}
if(l.tokens.join("")!==r.choices[0].text&&!l.tokens.some(t=>t.includes("\ufffd")))throw "tokens do not spell the text";
const ev=fs.readFileSync(process.argv[2],"utf8").trim().split("\n").map(JSON.parse);
let t=[],o=[];for(const e of ev)if(e.choices.length&&e.choices[0].logprobs){t=t.concat(e.choices[0].logprobs.tokens);o=o.concat(e.choices[0].logprobs.text_offset);}
if(JSON.stringify(t)!==JSON.stringify(l.tokens)||JSON.stringify(o)!==JSON.stringify(l.text_offset))throw "streamed logprobs differ";
' "$T/clp" "$T/clpev" || fail "completions logprobs checks: $(head -c 600 "$T/clp")"

# echo: the prompt starts the text; with logprobs and max_tokens 0 (scoring a text) every
# prompt token gets its logprob (the first null). Scoring the prompt followed by the greedy
# answer must give the answer's tokens the logprobs the generation reported (prefill vs decode)
node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1]));
         console.log(JSON.stringify({prompt:"Once upon a time"+r.choices[0].text,max_tokens:0,
                                     echo:true,logprobs:1}))' "$T/clp" >"$T/echo.json"
[ "$(http POST /v1/completions "$T/echo.json" "$T/ech")" = 200 ] || fail "echo: $(cat "$T/ech")"
node -e '
const fs=require("fs");const g=JSON.parse(fs.readFileSync(process.argv[1])),r=JSON.parse(fs.readFileSync(process.argv[2]));
const l=r.choices[0].logprobs, gl=g.choices[0].logprobs, want="Once upon a time"+g.choices[0].text;
if(r.choices[0].text!==want)throw "echo text "+JSON.stringify(r.choices[0].text);
if(r.usage.completion_tokens!==0||r.choices[0].finish_reason!=="length")throw "max_tokens 0";
if(l.tokens.length!==r.usage.prompt_tokens)throw "entries "+l.tokens.length+" for "+r.usage.prompt_tokens+" prompt tokens";
if(l.token_logprobs[0]!==null||l.top_logprobs[0]!==null)throw "first token has a logprob";
for(let i=1;i<l.tokens.length;i++)if(!(l.token_logprobs[i]<=0))throw "logprob "+i;
const n=gl.tokens.length, tail=l.tokens.slice(-n);
if(JSON.stringify(tail)===JSON.stringify(gl.tokens)){ /* the text tokenizes back the same way */
  const a=l.token_logprobs.slice(-n);
  for(let i=0;i<n;i++)if(Math.abs(a[i]-gl.token_logprobs[i])>1e-3)throw "token "+i+": prompt scoring "+a[i]+" vs generation "+gl.token_logprobs[i];
}
' "$T/clp" "$T/ech" || fail "echo checks: $(head -c 600 "$T/ech")"

# stop string: cut the greedy answer before its second half
stop=$(printf '%s' "$answer" | cut -c5-7)
if [ -n "$stop" ]; then
    node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));j.stop=[process.argv[2]];
             console.log(JSON.stringify(j))' "$T/chat.json" "$stop" >"$T/stop.json"
    http POST /v1/chat/completions "$T/stop.json" "$T/o" >/dev/null
    st=$(jget "$T/o" 'j.choices[0].message.content')
    case "$st" in *"$stop"*) fail "stop string emitted: '$st'" ;; esac
    case "$answer" in "$st"*) ;; *) fail "stopped text '$st' is not a prefix of '$answer'" ;; esac
    [ "$(jget "$T/o" 'j.choices[0].finish_reason')" = stop ] || fail "stop finish_reason"
fi

# ---------------------------------------------------------------- errors
err() { # expected-status body-file path [method] -> checks the OpenAI error shape
    s=$(http "${4:-POST}" "$3" "$2" "$T/e")
    [ "$s" = "$1" ] || fail "$3 $(cat "$2" 2>/dev/null | head -c 80): status $s, expected $1: $(cat "$T/e")"
    jget "$T/e" 'typeof j.error.message==="string"&&typeof j.error.type==="string"&&"param" in j.error&&"code" in j.error' \
        | grep -q true || fail "error shape: $(cat "$T/e")"
}
printf '{"messages": [' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '[1,2]' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '{"messages":"hi"}' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '{"messages":[{"role":"user","content":"x"}],"max_tokens":"8"}' >"$T/b"
err 400 "$T/b" /v1/chat/completions
[ "$(jget "$T/e" 'j.error.param')" = max_tokens ] || fail "param of a wrong type"
printf '{"messages":[{"role":"user","content":"x"}],"temperature":7}' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '{"messages":[{"role":"user","content":"x"}],"n":17}' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '{"tokens":[1,-1]}' >"$T/b"; err 400 "$T/b" /detokenize
[ "$(jget "$T/e" 'j.error.param')" = tokens ] || fail "detokenize param"
printf '{"tokens":[999999999]}' >"$T/b"; err 400 "$T/b" /detokenize
printf '{"tokens":"12"}' >"$T/b"; err 400 "$T/b" /detokenize
printf '{"content":5}' >"$T/b"; err 400 "$T/b" /tokenize
[ "$(jget "$T/e" 'j.error.param')" = content ] || fail "tokenize param"
printf '{"content":"x","with_pieces":"yes"}' >"$T/b"; err 400 "$T/b" /tokenize
err 405 "" /tokenize GET
printf '{"content":"ab\377"}' >"$T/b"; err 400 "$T/b" /tokenize        # invalid UTF-8
printf '{"content":"ab' >"$T/b"; err 400 "$T/b" /tokenize                # truncated body
printf '["ab"]' >"$T/b"; err 400 "$T/b" /tokenize                        # not an object
printf '{"tokens":[126190]}' >"$T/b"                                     # part of a character
[ "$(http POST /detokenize "$T/b" "$T/o")" = 200 ] || fail "detokenize a partial character: $(cat "$T/o")"
[ "$(jget "$T/o" 'j.content===String.fromCharCode(0xfffd).repeat(j.content.length)&&j.content.length>0')" = true ] ||
    fail "a partial character detokenizes to U+FFFD: $(cat "$T/o")"
printf '{"prompt":"x","logit_bias":{"999999999":1}}' >"$T/b"; err 400 "$T/b" /v1/completions
[ "$(jget "$T/e" 'j.error.param')" = logit_bias ] || fail "logit_bias param"
printf '{"messages":[{"role":"user","content":"x"}],"stream":"yes"}' >"$T/b"; err 400 "$T/b" /v1/chat/completions
printf '{"prompt":42}' >"$T/b"; err 400 "$T/b" /v1/completions
printf '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}' >"$T/b"
err 404 "$T/b" /v1/chat/completions
[ "$(jget "$T/e" 'j.error.code')" = model_not_found ] || fail "model_not_found code"
node -e 'console.log(JSON.stringify({prompt:"x".repeat(100000)}))' >"$T/big"
err 413 "$T/big" /v1/completions
err 404 "" /v1/nothing GET
err 405 "" /v1/chat/completions GET
[ "$(http GET /health "" "$T/o")" = 200 ] || fail "server died after the bad requests"

# ---------------------------------------------------------------- slow clients
# a writer that stalls mid-body is cut off after --timeout 2 s; others are served meanwhile
t0=$(date +%s)
( printf '{"prompt":"x",'; sleep 6 ) | curl -s -o /dev/null --max-time 20 -T - -X POST \
    -H 'Content-Type: application/json' "$URL/v1/completions" &
SLOW=$!
sleep 0.5
[ "$(http POST /v1/completions "$T/cmp.json" "$T/o")" = 200 ] || fail "served while a client stalls"
wait $SLOW || true
[ $(( $(date +%s) - t0 )) -le 12 ] || fail "stalled writer was not cut off"
# a slow reader (1 KB/s) still gets its whole stream
printf '{"prompt":"Hello","max_tokens":32,"stream":true}' >"$T/b"
curl -sN --max-time 60 --limit-rate 1K -H 'Content-Type: application/json' --data-binary "@$T/b" \
    "$URL/v1/completions" >"$T/slow"
grep -q '^data: \[DONE\]' "$T/slow" || fail "slow reader lost its stream"

grep -q '"POST /v1/chat/completions" 200 .*prompt=.* cached=.* completion=' "$T/s1.log" \
    || fail "no request log line: $(cat "$T/s1.log")"
stop_server $S1

# ---------------------------------------------------------------- auth, 429, disconnects
start_server "$T/s2.log" -m "$T/m.gguf" --parallel 1 --queue 1 --api-key sekret --max-tokens 3000
S2=$PID
printf '{"prompt":"Hello","max_tokens":4}' >"$T/short.json"
err 401 "$T/short.json" /v1/completions
s=$(http POST /v1/completions "$T/short.json" "$T/e" -H 'Authorization: Bearer wrong')
[ "$s" = 401 ] || fail "wrong key: $s"
[ "$(http GET /health "" "$T/o")" = 200 ] || fail "health needs no key"
[ "$(http GET /metrics "" "$T/o")" = 401 ] || fail "metrics without key"
AUTH='Authorization: Bearer sekret'
[ "$(http POST /v1/completions "$T/short.json" "$T/o" -H "$AUTH")" = 200 ] || fail "right key: $(cat "$T/o")"

printf '{"prompt":"Hello","max_tokens":3000,"stream":true,"temperature":0}' >"$T/long.json"
long() {
    curl -sN --max-time 60 -H "$AUTH" -H 'Content-Type: application/json' \
        --data-binary "@$T/long.json" "$URL/v1/completions" >"$1" &
}
long "$T/l1"; L1=$!
sleep 1
long "$T/l2"; L2=$!
sleep 1
# one generating, one queued: the third is refused
s=$(http POST /v1/completions "$T/short.json" "$T/e" -H "$AUTH")
[ "$s" = 429 ] || fail "expected 429 with a full queue, got $s: $(cat "$T/e")"
[ "$(jget "$T/e" 'j.error.type')" = rate_limit_exceeded ] || fail "429 shape: $(cat "$T/e")"
# both long clients hang up: their slot and queue place are free at once
kill $L1 $L2 2>/dev/null || true
wait $L1 $L2 2>/dev/null || true
grep -q '^data: {' "$T/l1" || fail "the first long stream sent nothing"
t0=$(date +%s)
[ "$(http POST /v1/completions "$T/short.json" "$T/o" -H "$AUTH")" = 200 ] || fail "after disconnects: $(cat "$T/o")"
[ $(( $(date +%s) - t0 )) -le 5 ] || fail "the disconnected stream kept its slot"
http GET /metrics "" "$T/m" -H "$AUTH" >/dev/null
grep -q '^qwenrt_requests_cancelled_total [1-9]' "$T/m" || fail "cancelled not counted: $(grep cancel "$T/m")"
grep -q '^qwenrt_requests_rejected_total 1' "$T/m" || fail "429 not counted"
grep -q '^qwenrt_slots_busy 0' "$T/m" || fail "a slot is still busy: $(grep slots "$T/m")"
grep -q '^qwenrt_time_to_first_token_seconds_count [1-9]' "$T/m" || fail "ttft histogram"
grep -q 'qwenrt_requests_total{endpoint="completions",code="429"} 1' "$T/m" || fail "requests_total"

# SIGTERM in the middle of a stream: the stream ends with an error event, the server exits 0
long "$T/l3"; L3=$!
sleep 1
stop_server $S2
wait $L3 2>/dev/null || true
grep -q 'server is shutting down' "$T/l3" || fail "stream not told about the shutdown: $(tail -c 300 "$T/l3")"
grep -q 'stopped' "$T/s2.log" || fail "no clean stop: $(tail -3 "$T/s2.log")"

# ---------------------------------------------------------------- prompt cache, Qwen3.5
start_server "$T/s3.log" -m "$T/m35.gguf" --parallel 2
S3=$PID
for think in false true; do
    printf '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a colour %s"}],"max_tokens":10,"temperature":0,"chat_template_kwargs":{"enable_thinking":%s}}' \
        "$think" "$think" >"$T/t1.json"
    http POST /v1/chat/completions "$T/t1.json" "$T/r1" >/dev/null
    node -e 'const fs=require("fs");const q=JSON.parse(fs.readFileSync(process.argv[1]));
             const r=JSON.parse(fs.readFileSync(process.argv[2]));
             q.messages.push({role:"assistant",content:r.choices[0].message.content},
                             {role:"user",content:"And another one?"});
             console.log(JSON.stringify(q))' "$T/t1.json" "$T/r1" >"$T/t2.json"
    http POST /v1/chat/completions "$T/t2.json" "$T/r2" >/dev/null
    p1=$(jget "$T/r1" 'j.usage.prompt_tokens')
    c2=$(jget "$T/r2" 'j.usage.prompt_tokens_details.cached_tokens')
    p2=$(jget "$T/r2" 'j.usage.prompt_tokens')
    # only the new turn is processed: the user message and the assistant header (the synth
    # model carries the Qwen3 tokenizer and template: an empty think block without thinking)
    if [ $think = true ]; then tail=''; else tail='<think>\n\n</think>\n\n'; fi
    printf "<|im_start|>user\nAnd another one?<|im_end|>\n<|im_start|>assistant\n$tail" >"$T/turn"
    n_turn=$("$Q" tokenize -m "$T/m35.gguf" --file "$T/turn" | tr ',' '\n' | wc -l)
    [ $((p2 - c2)) -eq "$n_turn" ] ||
        fail "thinking=$think: turn 2 processed $((p2 - c2)) tokens, its own turn has $n_turn"
    echo "cli_server: Qwen3.5 thinking=$think turn 1 prompt $p1, turn 2 prompt $p2 cached $c2"
done
http GET /metrics "" "$T/m" >/dev/null
grep -q '^qwenrt_prompt_tokens_cached_total [1-9]' "$T/m" || fail "cached tokens not in metrics"
grep -q '^qwenrt_prompt_cache_hits_total [1-9]' "$T/m" || fail "cache hits not in metrics"
# several tokens per GPU submission happen only on a CUDA server: none here
grep -q '^qwenrt_gpu_step_tokens_total 0$' "$T/m" || fail "GPU-step tokens on a CPU server: $(grep gpu_step "$T/m")"
stop_server $S3
echo "cli_server: ok"
