#!/bin/sh
# make demo: the main job on an embedded default. With no model given (QWENRT_DEMO_MODEL unset),
# synthesise a Qwen3-0.6B-geometry model (random weights, F16, with the Qwen3 tokenizer) once,
# then show what qwenrt does with it: model info, greedy generation from ids, text in and text
# out, and a short prefill/decode benchmark.
set -eu
QWENRT=${1:-build/qwenrt}
MODEL=${QWENRT_DEMO_MODEL:-build/demo/qwen3-0.6b-f16.gguf}
THREADS=${QWENRT_THREADS:-$(nproc)}

if [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    echo "== synthesising $MODEL (Qwen3-0.6B geometry, random weights, f16)"
    "$QWENRT" synth --arch qwen3-0.6b --type f16 -o "$MODEL"
fi

echo "== qwenrt info"
"$QWENRT" info -m "$MODEL" | grep -v '^  '

echo "== qwenrt generate (greedy, 16 tokens after ids 9707,11,1879)"
"$QWENRT" generate -m "$MODEL" --ids 9707,11,1879 -n 16 --threads "$THREADS"

if "$QWENRT" tokenize -m "$MODEL" --text "Hello, world" >/dev/null 2>&1; then
    echo "== qwenrt tokenize / detokenize"
    ids=$("$QWENRT" tokenize -m "$MODEL" --text "Hello, world! qwenrt runs Qwen models.")
    echo "ids:  $ids"
    printf 'text: '
    "$QWENRT" detokenize -m "$MODEL" --ids "$ids"
    echo
fi

if "$QWENRT" run --help >/dev/null 2>&1; then
    echo "== qwenrt run (random weights: the words are noise, the pipeline is real)"
    "$QWENRT" run -m "$MODEL" -p "Tell me about the sea." -n 24 --seed 1 --threads "$THREADS" || true
    echo
fi

echo "== qwenrt bench (prefill 128 tokens, decode 64 tokens)"
"$QWENRT" bench -m "$MODEL" -p 128 -n 64 --warmup 1 --trials 3 --threads "$THREADS"
