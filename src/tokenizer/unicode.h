/*
 * unicode.h — the Unicode pieces the tokenizer needs: UTF-8 decoding with replacement,
 * NFC (through utf8proc, skipped when a quick check proves the text already NFC), the
 * character classes of the pre-tokeniser regexes, and GPT-2's byte <-> unicode table.
 *
 * Invalid UTF-8 is replaced by U+FFFD one "maximal subpart" at a time (Unicode 15 §3.9,
 * "U+FFFD substitution of maximal subparts"), which is what Python's
 * bytes.decode('utf-8', errors='replace') and Rust's String::from_utf8_lossy do: a truncated
 * but well-started sequence becomes one U+FFFD, every other bad byte one U+FFFD each.
 */
#ifndef QWENRT_TOKENIZER_UNICODE_H
#define QWENRT_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"

enum utf8_step {
    UTF8_OK,        /* a complete, valid character */
    UTF8_INVALID,   /* a maximal subpart that can never be valid: replace it by U+FFFD */
    UTF8_TRUNCATED, /* a valid start of a character that the buffer end cuts off */
};

/* Decodes one step at s[0..n) (n >= 1): sets *len (>= 1) to the bytes it covers and, for
 * UTF8_OK, *cp to the code point. */
enum utf8_step utf8_step(const uint8_t *s, size_t n, size_t *len, uint32_t *cp);

/* true when s[0..n) is valid UTF-8. */
bool utf8_is_valid(const uint8_t *s, size_t n);

/* Writes cp as UTF-8 into out (4 bytes room); returns the bytes written. */
size_t utf8_put(uint32_t cp, uint8_t *out);

/* A copy of s[0..n) with every invalid maximal subpart replaced by U+FFFD (EF BF BD); when
 * `keep_truncated_tail` the cut-off end is not replaced but left out and its length is
 * returned in *tail (for streaming). *out is xmalloc'd, NUL-terminated. */
qwenrt_status utf8_sanitize(const uint8_t *s, size_t n, bool keep_truncated_tail, char **out,
                            size_t *out_len, size_t *tail, struct qwenrt_error *err);

/* NFC-normalises valid UTF-8 s[0..n). When the text is already NFC by a quick check, sets
 * *out = NULL (use the input as is); otherwise *out is an xmalloc'd normalised copy. */
qwenrt_status unicode_nfc(const char *s, size_t n, char **out, size_t *out_len,
                          struct qwenrt_error *err);

/* Character classes of the pre-tokeniser (bit flags). */
enum {
    UC_L = 1u << 0,  /* \p{L} letter */
    UC_N = 1u << 1,  /* \p{N} number */
    UC_M = 1u << 2,  /* \p{M} mark */
    UC_WS = 1u << 3, /* \s: the Unicode White_Space property */
    UC_NL = 1u << 4, /* \r or \n */
};
unsigned unicode_class(uint32_t cp);

/* GPT-2 byte-level table: the code point that stands for byte b in vocabulary strings. */
uint32_t bytelevel_char(uint8_t b);
/* The byte a vocabulary code point stands for, or -1 when cp is not in the table. */
int bytelevel_byte(uint32_t cp);

#endif
