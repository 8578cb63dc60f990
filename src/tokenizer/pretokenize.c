/*
 * pretokenize.c — Qwen's pre-tokeniser regexes as a hand-written matcher (see pretokenize.h).
 *
 * The text is first decoded into arrays of code points and class bits (unicode_class); then,
 * from each position, the alternatives are tried in the regex's order, reproducing what a
 * backtracking engine (Oniguruma, used by Hugging Face `tokenizers`) returns:
 *   1 '(?i:s|t|re|ve|m|ll|d)  case-insensitive, so U+017F (long s, which folds to s) counts
 *   2 [^\r\n L N]? L+         an optional non-letter/digit/newline char, then a letter run
 *   3 N                       one digit
 *   4 ' '? P+ [\r\n]*          P = not whitespace/letter/digit (Qwen3.5: nor mark)
 *   5 \s*[\r\n]+              up to and including the last \r or \n of the whitespace run
 *   6 \s+(?!\S)               the whitespace run, less its last char unless it ends the text
 *   7 \s+                     the whitespace run
 * A regex engine was not used: the two fixed patterns are small and this runs ~10x faster.
 */
#include "tokenizer/pretokenize.h"

#include <stdbool.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tokenizer/unicode.h"

static const char QWEN3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *pretok_regex(enum pretok_kind kind)
{
    return kind == PRETOK_QWEN35 ? QWEN35_REGEX : QWEN3_REGEX;
}

/* The decoded text: code point, class bits and byte offset of each char (off[n] = bytes). */
struct chars {
    uint32_t *cp;
    uint8_t *cls;
    size_t *off;
    size_t n;
};

static uint32_t fold(uint32_t c)
{
    if (c == 0x17F)
        return 's';
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Alternative 1: a contraction at i; returns its length in chars or 0. */
static size_t match_contraction(const struct chars *t, size_t i)
{
    if (t->cp[i] != '\'' || i + 1 >= t->n)
        return 0;
    uint32_t a = fold(t->cp[i + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (i + 2 >= t->n)
        return 0;
    uint32_t b = fold(t->cp[i + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

static size_t run_of(const struct chars *t, size_t i, unsigned any_of)
{
    while (i < t->n && (t->cls[i] & any_of))
        i++;
    return i;
}

static size_t run_not(const struct chars *t, size_t i, unsigned none_of)
{
    while (i < t->n && !(t->cls[i] & none_of))
        i++;
    return i;
}

/* Returns the end (in chars) of the match at i, or i when no alternative matches. */
static size_t match_at(const struct chars *t, size_t i, enum pretok_kind kind)
{
    const unsigned letter = kind == PRETOK_QWEN35 ? (UC_L | UC_M) : UC_L;
    const unsigned not_punct =
        kind == PRETOK_QWEN35 ? (UC_WS | UC_L | UC_M | UC_N) : (UC_WS | UC_L | UC_N);
    size_t n = t->n, k;
    unsigned c = t->cls[i];

    if ((k = match_contraction(t, i)))
        return i + k;
    /* 2: the greedy optional prefix first, then without it */
    if (!(c & (UC_NL | UC_L | UC_N)) && i + 1 < n && (t->cls[i + 1] & letter))
        return run_of(t, i + 1, letter);
    if (c & letter)
        return run_of(t, i, letter);
    if (c & UC_N)
        return i + 1;
    /* 4 */
    size_t j = i;
    if (t->cp[i] == ' ' && i + 1 < n && !(t->cls[i + 1] & not_punct))
        j = i + 1;
    if (!(t->cls[j] & not_punct)) {
        j = run_not(t, j, not_punct);
        while (j < n && (t->cls[j] & UC_NL))
            j++;
        return j;
    }
    if (!(c & UC_WS))
        return i;
    /* 5, 6, 7 over the maximal whitespace run [i, e) */
    size_t e = run_of(t, i, UC_WS);
    for (size_t q = e; q > i; q--)
        if (t->cls[q - 1] & UC_NL)
            return q;
    if (e == n || e - 1 > i)
        return e == n ? e : e - 1;
    return e;
}

static qwenrt_status decode_chars(const char *s, size_t n, struct chars *t,
                                  struct qwenrt_error *err)
{
    t->cp = xmalloc(n, sizeof(*t->cp));
    t->cls = xmalloc(n, sizeof(*t->cls));
    t->off = xmalloc(n + 1, sizeof(*t->off));
    if (!t->cp || !t->cls || !t->off)
        return err_set(err, QWENRT_ERR_NOMEM, "pre-tokeniser: out of memory for %zu bytes", n);
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        size_t len;
        uint32_t cp;
        if (u[i] < 0x80) {
            len = 1;
            cp = u[i];
        } else if (utf8_step(u + i, n - i, &len, &cp) != UTF8_OK) {
            return err_set(err, QWENRT_ERR_INTERNAL, "pre-tokeniser: invalid UTF-8 at byte %zu", i);
        }
        t->cp[k] = cp;
        t->cls[k] = (uint8_t)unicode_class(cp);
        t->off[k] = i;
        k++;
        i += len;
    }
    t->off[k] = n;
    t->n = k;
    return QWENRT_OK;
}

qwenrt_status pretok_split(enum pretok_kind kind, const char *s, size_t n, size_t **ends,
                           size_t *n_pieces, struct qwenrt_error *err)
{
    struct chars t = {0};
    qwenrt_status st;
    *ends = NULL;
    *n_pieces = 0;
    if (n == 0)
        return QWENRT_OK;
    if ((st = decode_chars(s, n, &t, err)) != QWENRT_OK)
        goto out_free;
    size_t *e = xmalloc(t.n, sizeof(*e)); /* at most one piece per char */
    if (!e) {
        st = err_set(err, QWENRT_ERR_NOMEM, "pre-tokeniser: out of memory for %zu pieces", t.n);
        goto out_free;
    }
    size_t np = 0, i = 0;
    bool in_gap = false; /* chars no alternative matched, kept as one piece (Isolated) */
    while (i < t.n) {
        size_t j = match_at(&t, i, kind);
        if (j == i) {
            in_gap = true;
            i++;
            continue;
        }
        if (in_gap) {
            e[np++] = t.off[i];
            in_gap = false;
        }
        e[np++] = t.off[j];
        i = j;
    }
    if (in_gap)
        e[np++] = n;
    *ends = e;
    *n_pieces = np;
    st = QWENRT_OK;
out_free:
    xfree(t.cp);
    xfree(t.cls);
    xfree(t.off);
    return st;
}
