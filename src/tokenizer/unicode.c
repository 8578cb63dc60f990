/*
 * unicode.c — UTF-8 decoding with maximal-subpart replacement, NFC with a quick check,
 * pre-tokeniser character classes and the GPT-2 byte-level table (see unicode.h).
 *
 * Categories come from utf8proc (\p{L} = Lu Ll Lt Lm Lo, \p{N} = Nd Nl No, \p{M} = Mn Mc Me);
 * \s is the White_Space property, which is what Oniguruma (the regex engine behind Hugging
 * Face `tokenizers`) uses for \s in Unicode mode. ASCII goes through a 128-entry table.
 */
#include "tokenizer/unicode.h"

#include <string.h>
#include <utf8proc.h>

#include "base/alloc.h"
#include "base/error.h"

enum utf8_step utf8_step(const uint8_t *s, size_t n, size_t *len, uint32_t *cp)
{
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        *cp = c;
        return UTF8_OK;
    }
    size_t need;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *len = 1; /* a continuation byte, C0, C1 or F5..FF */
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = i;
            return UTF8_TRUNCATED;
        }
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) {
            *len = i;
            return UTF8_INVALID;
        }
        v = (v << 6) | (b & 0x3F);
    }
    *len = need;
    *cp = v;
    return UTF8_OK;
}

bool utf8_is_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* skip ASCII eight bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        size_t len;
        uint32_t cp;
        if (utf8_step(s + i, n - i, &len, &cp) != UTF8_OK)
            return false;
        i += len;
    }
    return true;
}

size_t utf8_put(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

qwenrt_status utf8_sanitize(const uint8_t *s, size_t n, bool keep_truncated_tail, char **out,
                            size_t *out_len, size_t *tail, struct qwenrt_error *err)
{
    size_t cap; /* each bad byte grows to at most 3 bytes */
    if (size_mul_overflows(n, 3, &cap) || cap == SIZE_MAX)
        return err_set(err, QWENRT_ERR_NOMEM, "utf-8: input of %zu bytes is too large", n);
    uint8_t *o = xmalloc(cap + 1, 1);
    if (!o)
        return err_set(err, QWENRT_ERR_NOMEM, "utf-8: out of memory for %zu bytes", cap + 1);
    size_t i = 0, k = 0;
    if (tail)
        *tail = 0;
    while (i < n) {
        size_t len;
        uint32_t cp;
        enum utf8_step st = utf8_step(s + i, n - i, &len, &cp);
        if (st == UTF8_OK) {
            memcpy(o + k, s + i, len);
            k += len;
        } else if (st == UTF8_TRUNCATED && keep_truncated_tail) {
            if (tail)
                *tail = len;
        } else {
            o[k++] = 0xEF;
            o[k++] = 0xBF;
            o[k++] = 0xBD;
        }
        i += len;
    }
    o[k] = '\0';
    *out = (char *)o;
    *out_len = k;
    return QWENRT_OK;
}

/* true when cp can neither change under NFC nor combine with what comes before it. Chars below
 * U+0300 are all NFC_Quick_Check=Yes and none of them composes with a preceding character. */
static bool nfc_inert(uint32_t cp)
{
    if (cp < 0x300)
        return true;
    if (cp >= 0x1100 && cp < 0x1200)
        return false; /* Hangul jamo compose algorithmically */
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    if (p->combining_class != 0 || (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0))
        return false; /* a mark, or a canonical decomposition (compatibility ones stay in NFC) */
    /* comb_index >= 0x8000 (and not "none") marks the second character of a composition */
    return p->comb_index == UINT16_MAX || p->comb_index < 0x8000;
}

/* NFC of s[a..b) appended to o (xmalloc'd, grown as needed). */
static qwenrt_status nfc_run(const char *s, size_t a, size_t b, char **o, size_t *k, size_t *cap,
                             struct qwenrt_error *err)
{
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + a, (utf8proc_ssize_t)(b - a),
                                      &res, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0)
        return err_set(err, r == UTF8PROC_ERROR_NOMEM ? QWENRT_ERR_NOMEM : QWENRT_ERR_INTERNAL,
                       "nfc: utf8proc: %s", utf8proc_errmsg(r));
    if (*k + (size_t)r + 1 > *cap) {
        size_t c = (*cap + (size_t)r + 1) * 2;
        char *p = xrealloc(*o, c, 1);
        if (!p) {
            free(res);
            return err_set(err, QWENRT_ERR_NOMEM, "nfc: out of memory for %zu bytes", c);
        }
        *o = p;
        *cap = c;
    }
    memcpy(*o + *k, res, (size_t)r);
    *k += (size_t)r;
    free(res); /* utf8proc allocates with malloc */
    return QWENRT_OK;
}

/* NFC is local: a text can be cut right before any inert character (it neither composes with
 * what precedes it nor reorders), so only the runs around non-inert characters, plus the one
 * character before each run (a starter they may compose with), go through utf8proc. */
qwenrt_status unicode_nfc(const char *s, size_t n, char **out, size_t *out_len,
                          struct qwenrt_error *err)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, prev = 0, copied = 0, k = 0, cap = 0;
    char *o = NULL;
    qwenrt_status st = QWENRT_OK;
    *out = NULL;
    *out_len = n;
    if (n > (size_t)PTRDIFF_MAX)
        return err_set(err, QWENRT_ERR_LIMIT, "nfc: input of %zu bytes is too large", n);
    while (i < n) {
        size_t len;
        uint32_t cp;
        if (u[i] < 0x80) {
            prev = i++;
            continue;
        }
        if (utf8_step(u + i, n - i, &len, &cp) != UTF8_OK) {
            st = err_set(err, QWENRT_ERR_INTERNAL, "nfc: invalid UTF-8 at byte %zu", i);
            goto out_fail;
        }
        if (nfc_inert(cp)) {
            prev = i;
            i += len;
            continue;
        }
        size_t a = i > 0 ? prev : 0, b = i + len; /* the run [a, b) ends before an inert char */
        while (b < n && !(u[b] < 0x80)) {
            if (utf8_step(u + b, n - b, &len, &cp) != UTF8_OK || nfc_inert(cp))
                break;
            b += len;
        }
        if (k + (a - copied) + 1 > cap) {
            cap = (k + (a - copied) + 1) * 2 + n / 8;
            char *p = xrealloc(o, cap, 1);
            if (!p) {
                st = err_set(err, QWENRT_ERR_NOMEM, "nfc: out of memory for %zu bytes", cap);
                goto out_fail;
            }
            o = p;
        }
        memcpy(o + k, s + copied, a - copied);
        k += a - copied;
        if ((st = nfc_run(s, a, b, &o, &k, &cap, err)) != QWENRT_OK)
            goto out_fail;
        copied = b;
        prev = i = b;
    }
    if (!o)
        return QWENRT_OK; /* already NFC */
    if (k + (n - copied) + 1 > cap) {
        char *p = xrealloc(o, k + (n - copied) + 1, 1);
        if (!p) {
            st = err_set(err, QWENRT_ERR_NOMEM, "nfc: out of memory");
            goto out_fail;
        }
        o = p;
    }
    memcpy(o + k, s + copied, n - copied);
    k += n - copied;
    o[k] = '\0';
    *out = o;
    *out_len = k;
    return QWENRT_OK;
out_fail:
    xfree(o);
    return st;
}

static unsigned category_class(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
        return UC_L;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return UC_N;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
        return UC_M;
    default:
        return 0;
    }
}

static bool is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

unsigned unicode_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return UC_L;
        if (cp >= '0' && cp <= '9')
            return UC_N;
        if (cp == '\r' || cp == '\n')
            return UC_WS | UC_NL;
        if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20)
            return UC_WS;
        return 0;
    }
    return category_class(cp) | (is_white_space(cp) ? UC_WS : 0);
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * (0x00-0x20, 0x7F-0xA0, 0xAD) for U+0100.. in byte order. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t bytelevel_char(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xA0)
        return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int bytelevel_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67)
        return 0xAD;
    return -1;
}
