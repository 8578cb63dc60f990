/*
 * pretokenize.h — the pre-tokeniser split of Qwen's byte-level BPE, written by hand after the
 * two regexes that Qwen tokenizer.json files carry (docs/qwen-architecture.md §5):
 *
 *   Qwen3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *           | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen3.5 the same with letter runs [\p{L}\p{M}]+ and \p{M} excluded from the punctuation run.
 *
 * applied in "Isolated" mode: every match is a piece and so is every run of text between
 * matches (there is none with these regexes, but the split handles it).
 */
#ifndef QWENRT_TOKENIZER_PRETOKENIZE_H
#define QWENRT_TOKENIZER_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"

enum pretok_kind {
    PRETOK_QWEN3,  /* the Qwen2/Qwen3 regex (llama.cpp pre "qwen2") */
    PRETOK_QWEN35, /* the Qwen3.5 regex with \p{M} (llama.cpp pre "qwen35") */
};

/* The exact regex string of a kind, as tokenizer.json spells it. */
const char *pretok_regex(enum pretok_kind kind);

/* Splits valid UTF-8 s[0..n) into pieces; *ends receives the end byte offset of each piece
 * (xmalloc'd, *n_pieces entries, the last one n). Empty input gives no pieces. */
qwenrt_status pretok_split(enum pretok_kind kind, const char *s, size_t n, size_t **ends,
                           size_t *n_pieces, struct qwenrt_error *err);

#endif
