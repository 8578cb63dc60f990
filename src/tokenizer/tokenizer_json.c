/*
 * tokenizer_json.c — loads a Hugging Face tokenizer.json (and the tokenizer_config.json next to
 * it, if any) into a tokenizer.
 *
 * A 151k-token tokenizer.json is 11 MB; building a jansson tree of it takes ~200 ms plus ~60 ms
 * to free, so the file is read by a small scanner instead: it walks the top-level object and
 * `model`, parses model.vocab and model.merges directly into the tokenizer, and hands only the
 * small values (added_tokens, normalizer, pre_tokenizer) to jansson. Values the scanner skips
 * are checked for balanced brackets and well-formed strings, not fully validated.
 * Merges come as "a b" strings (split at the one space) or as ["a", "b"] pairs.
 */
#include <jansson.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/mapfile.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

#define JSON_MAX_DEPTH 256

struct scan {
    const char *p, *end, *base; /* cursor, end and start of the document */
    const char *src;            /* file name for messages */
    struct qwenrt_error *err;
    char *buf; /* decoded string (NUL-terminated) */
    size_t len, cap;
};

struct span {
    const char *p; /* NULL when the key was absent */
    size_t n;
};

static qwenrt_status fail(struct scan *s, const char *what)
{
    return err_set(s->err, QWENRT_ERR_FORMAT, "%s: not valid JSON at byte %zu: %s", s->src,
                   (size_t)(s->p - s->base), what);
}

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static bool eat(struct scan *s, char c)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

static qwenrt_status buf_put(struct scan *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *b = xrealloc(s->buf, cap, 1);
        if (!b)
            return err_set(s->err, QWENRT_ERR_NOMEM, "%s: out of memory", s->src);
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return QWENRT_OK;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'                     ? c - '0'
                : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* \uXXXX (with a following low surrogate when XXXX is a high one) at s->p (after the 'u'). */
static qwenrt_status unicode_escape(struct scan *s)
{
    if (s->end - s->p < 4 || hex4(s->p) < 0)
        return fail(s, "bad \\u escape");
    uint32_t cp = (uint32_t)hex4(s->p);
    s->p += 4;
    if (cp >= 0xD800 && cp < 0xDC00 && s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' &&
        hex4(s->p + 2) >= 0xDC00 && hex4(s->p + 2) < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)hex4(s->p + 2) - 0xDC00);
        s->p += 6;
    } else if (cp >= 0xD800 && cp < 0xE000) {
        cp = 0xFFFD; /* a lone surrogate */
    }
    uint8_t u[4];
    return buf_put(s, (const char *)u, utf8_put(cp, u));
}

/* Parses a string into s->buf / s->len. */
static qwenrt_status parse_string(struct scan *s)
{
    qwenrt_status st;
    s->len = 0;
    if (!eat(s, '"'))
        return fail(s, "expected a string");
    for (;;) {
        const char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20)
            q++;
        if ((st = buf_put(s, s->p, (size_t)(q - s->p))) != QWENRT_OK)
            return st;
        s->p = q;
        if (q >= s->end)
            return fail(s, "unterminated string");
        if (*q == '"') {
            s->p++;
            return QWENRT_OK;
        }
        if ((uint8_t)*q < 0x20)
            return fail(s, "control character in a string");
        if (s->end - q < 2)
            return fail(s, "unterminated escape");
        char c = q[1], out;
        s->p = q + 2;
        switch (c) {
        case '"':
            out = '"';
            break;
        case '\\':
            out = '\\';
            break;
        case '/':
            out = '/';
            break;
        case 'b':
            out = '\b';
            break;
        case 'f':
            out = '\f';
            break;
        case 'n':
            out = '\n';
            break;
        case 'r':
            out = '\r';
            break;
        case 't':
            out = '\t';
            break;
        case 'u':
            if ((st = unicode_escape(s)) != QWENRT_OK)
                return st;
            continue;
        default:
            return fail(s, "bad escape");
        }
        if ((st = buf_put(s, &out, 1)) != QWENRT_OK)
            return st;
    }
}

static qwenrt_status parse_int(struct scan *s, int64_t *v)
{
    skip_ws(s);
    bool neg = s->p < s->end && *s->p == '-';
    if (neg)
        s->p++;
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return fail(s, "expected an integer");
    int64_t x = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (x > (INT64_MAX - 9) / 10)
            return fail(s, "integer too large");
        x = x * 10 + (*s->p++ - '0');
    }
    if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E'))
        return fail(s, "expected an integer, not a fraction");
    *v = neg ? -x : x;
    return QWENRT_OK;
}

/* Skips one value, checking brackets and strings. */
static qwenrt_status skip_value(struct scan *s)
{
    char stack[JSON_MAX_DEPTH];
    int depth = 0;
    skip_ws(s);
    do {
        skip_ws(s);
        if (s->p >= s->end)
            return fail(s, "unexpected end of file");
        char c = *s->p;
        if (c == '"') {
            s->p++;
            while (s->p < s->end && *s->p != '"')
                s->p += *s->p == '\\' ? 2 : 1;
            if (s->p >= s->end)
                return fail(s, "unterminated string");
            s->p++;
        } else if (c == '{' || c == '[') {
            if (depth == JSON_MAX_DEPTH)
                return fail(s, "nested too deeply");
            stack[depth++] = c == '{' ? '}' : ']';
            s->p++;
        } else if (c == '}' || c == ']') {
            if (depth == 0 || stack[depth - 1] != c)
                return fail(s, "unbalanced brackets");
            depth--;
            s->p++;
        } else if (c == ',' || c == ':') {
            if (depth == 0)
                return fail(s, "unexpected separator");
            s->p++;
        } else {
            const char *q = s->p;
            while (q < s->end &&
                   (strchr("+-.eE", *q) || (*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'z')))
                q++;
            if (q == s->p)
                return fail(s, "unexpected character");
            s->p = q;
        }
    } while (depth > 0);
    return QWENRT_OK;
}

static qwenrt_status skip_span(struct scan *s, struct span *sp)
{
    skip_ws(s);
    sp->p = s->p;
    qwenrt_status st = skip_value(s);
    sp->n = (size_t)(s->p - sp->p);
    return st;
}

/* Walks an object, calling on_key for each key with the cursor at its value. */
typedef qwenrt_status (*key_fn)(struct scan *s, const char *key, void *ctx);

static qwenrt_status walk_object(struct scan *s, key_fn on_key, void *ctx)
{
    qwenrt_status st;
    if (!eat(s, '{'))
        return fail(s, "expected an object");
    if (eat(s, '}'))
        return QWENRT_OK;
    do {
        if ((st = parse_string(s)) != QWENRT_OK)
            return st;
        if (!eat(s, ':'))
            return fail(s, "expected ':'");
        char key[64];
        snprintf(key, sizeof(key), "%s", s->buf);
        if ((st = on_key(s, key, ctx)) != QWENRT_OK)
            return st;
    } while (eat(s, ','));
    return eat(s, '}') ? QWENRT_OK : fail(s, "expected ',' or '}'");
}

struct doc {
    struct span vocab, merges, model_type, added, normalizer, pretok;
};

static qwenrt_status on_model_key(struct scan *s, const char *key, void *ctx)
{
    struct doc *d = ctx;
    if (!strcmp(key, "vocab"))
        return skip_span(s, &d->vocab);
    if (!strcmp(key, "merges"))
        return skip_span(s, &d->merges);
    if (!strcmp(key, "type"))
        return skip_span(s, &d->model_type);
    return skip_value(s);
}

static qwenrt_status on_top_key(struct scan *s, const char *key, void *ctx)
{
    struct doc *d = ctx;
    if (!strcmp(key, "model")) {
        skip_ws(s);
        if (s->p < s->end && *s->p == '{')
            return walk_object(s, on_model_key, d);
    }
    if (!strcmp(key, "added_tokens"))
        return skip_span(s, &d->added);
    if (!strcmp(key, "normalizer"))
        return skip_span(s, &d->normalizer);
    if (!strcmp(key, "pre_tokenizer"))
        return skip_span(s, &d->pretok);
    return skip_value(s);
}

static void scan_at(struct scan *s, const struct span *sp)
{
    s->p = sp->p;
    s->end = sp->p + sp->n;
}

static qwenrt_status load_vocab(struct scan *s, struct tokenizer *t, const struct span *sp)
{
    qwenrt_status st;
    scan_at(s, sp);
    if (!eat(s, '{'))
        return err_set(s->err, QWENRT_ERR_FORMAT, "%s: model.vocab is not an object", s->src);
    if (eat(s, '}'))
        return QWENRT_OK;
    do {
        int64_t id = 0;
        if ((st = parse_string(s)) != QWENRT_OK)
            return st;
        if (!eat(s, ':'))
            return fail(s, "expected ':'");
        if ((st = parse_int(s, &id)) != QWENRT_OK)
            return st;
        if (id < 0 || id >= TOKENIZER_MAX_VOCAB)
            return err_set(s->err, QWENRT_ERR_FORMAT,
                           "%s: model.vocab['%s'] = %lld is out of range", s->src, s->buf,
                           (long long)id);
        if ((st = tok_add_token(t, (int32_t)id, s->buf, s->len, 0, s->err)) != QWENRT_OK)
            return st;
    } while (eat(s, ','));
    return eat(s, '}') ? QWENRT_OK : fail(s, "expected ',' or '}' in model.vocab");
}

static qwenrt_status load_merges(struct scan *s, struct tokenizer *t, const struct span *sp)
{
    qwenrt_status st;
    char *a = NULL;
    scan_at(s, sp);
    if (!eat(s, '['))
        return err_set(s->err, QWENRT_ERR_FORMAT, "%s: model.merges is not an array", s->src);
    if (eat(s, ']'))
        return QWENRT_OK;
    do {
        size_t alen;
        skip_ws(s);
        if (s->p < s->end && *s->p == '[') { /* ["a", "b"] */
            s->p++;
            if ((st = parse_string(s)) != QWENRT_OK)
                goto out;
            alen = s->len;
            xfree(a);
            if (!(a = xstrndup(s->buf, alen))) {
                st = err_set(s->err, QWENRT_ERR_NOMEM, "%s: out of memory", s->src);
                goto out;
            }
            if (!eat(s, ',')) {
                st = fail(s, "a merge pair needs two strings");
                goto out;
            }
            if ((st = parse_string(s)) != QWENRT_OK)
                goto out;
            if (!eat(s, ']')) {
                st = fail(s, "a merge pair needs exactly two strings");
                goto out;
            }
            st = tok_add_merge(t, a, alen, s->buf, s->len, s->src, s->err);
        } else { /* "a b" */
            if ((st = parse_string(s)) != QWENRT_OK)
                goto out;
            char *sp1 = memchr(s->buf, ' ', s->len);
            if (!sp1 || memchr(sp1 + 1, ' ', s->len - (size_t)(sp1 + 1 - s->buf))) {
                st = err_set(s->err, QWENRT_ERR_FORMAT,
                             "%s: merge %d '%s' is not two tokens separated by one space", s->src,
                             t->n_merges, s->buf);
                goto out;
            }
            alen = (size_t)(sp1 - s->buf);
            st = tok_add_merge(t, s->buf, alen, sp1 + 1, s->len - alen - 1, s->src, s->err);
        }
        if (st != QWENRT_OK)
            goto out;
    } while (eat(s, ','));
    st = eat(s, ']') ? QWENRT_OK : fail(s, "expected ',' or ']' in model.merges");
out:
    xfree(a);
    return st;
}

static qwenrt_status json_span(struct scan *s, const struct span *sp, const char *what,
                               json_t **out)
{
    json_error_t je;
    *out = json_loadb(sp->p, sp->n, JSON_DECODE_ANY, &je);
    if (!*out)
        return err_set(s->err, QWENRT_ERR_FORMAT, "%s: %s: %s", s->src, what, je.text);
    return QWENRT_OK;
}

static qwenrt_status load_added(struct scan *s, struct tokenizer *t, const struct span *sp)
{
    json_t *arr;
    qwenrt_status st;
    if (!sp->p)
        return QWENRT_OK;
    if ((st = json_span(s, sp, "added_tokens", &arr)) != QWENRT_OK)
        return st;
    if (!json_is_array(arr)) {
        st = err_set(s->err, QWENRT_ERR_FORMAT, "%s: added_tokens is not an array", s->src);
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        json_t *id = json_object_get(e, "id"), *content = json_object_get(e, "content");
        if (!json_is_integer(id) || !json_is_string(content)) {
            st = err_set(s->err, QWENRT_ERR_FORMAT,
                         "%s: added_tokens[%zu] needs an integer id and a string content", s->src,
                         i);
            goto out;
        }
        const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (json_is_true(json_object_get(e, flags[k]))) {
                st = err_set(s->err, QWENRT_ERR_UNSUPPORTED,
                             "%s: added token '%s' has %s: true, which qwenrt does not implement",
                             s->src, json_string_value(content), flags[k]);
                goto out;
            }
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= TOKENIZER_MAX_VOCAB) {
            st = err_set(s->err, QWENRT_ERR_FORMAT, "%s: added_tokens[%zu] id %lld out of range",
                         s->src, i, (long long)v);
            goto out;
        }
        unsigned f = TOKF_ADDED | (json_is_true(json_object_get(e, "special")) ? TOKF_SPECIAL : 0);
        st = tok_add_token(t, (int32_t)v, json_string_value(content), json_string_length(content),
                           f, s->err);
        if (st != QWENRT_OK)
            goto out;
    }
out:
    json_decref(arr);
    return st;
}

static qwenrt_status load_normalizer(struct scan *s, struct tokenizer *t, const struct span *sp)
{
    json_t *j;
    qwenrt_status st;
    t->nfc = false;
    if (!sp->p)
        return QWENRT_OK;
    if ((st = json_span(s, sp, "normalizer", &j)) != QWENRT_OK)
        return st;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (json_is_null(j))
        st = QWENRT_OK;
    else if (type && !strcmp(type, "NFC"))
        t->nfc = true;
    else
        st = err_set(s->err, QWENRT_ERR_UNSUPPORTED,
                     "%s: normalizer type '%s' is not supported (only NFC or none)", s->src,
                     type ? type : "?");
    json_decref(j);
    return st;
}

/* pre_tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)], with the regex
 * one of the two Qwen patterns. */
static qwenrt_status load_pretok(struct scan *s, struct tokenizer *t, const struct span *sp)
{
    json_t *j;
    qwenrt_status st;
    if (!sp->p)
        return err_set(s->err, QWENRT_ERR_UNSUPPORTED, "%s: no pre_tokenizer", s->src);
    if ((st = json_span(s, sp, "pre_tokenizer", &j)) != QWENRT_OK)
        return st;
    json_t *seq = json_object_get(j, "pretokenizers");
    json_t *split = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    const char *regex =
        json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *stype = json_string_value(json_object_get(split, "type"));
    const char *btype = json_string_value(json_object_get(bl, "type"));
    const char *beh = json_string_value(json_object_get(split, "behavior"));
    if (!type || strcmp(type, "Sequence") || json_array_size(seq) != 2 || !stype ||
        strcmp(stype, "Split") || !btype || strcmp(btype, "ByteLevel") || !beh ||
        strcmp(beh, "Isolated") || json_is_true(json_object_get(split, "invert")) ||
        json_is_true(json_object_get(bl, "use_regex")) || !regex) {
        st = err_set(s->err, QWENRT_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer is not Qwen's Sequence[Split(Regex), ByteLevel]", s->src);
    } else if (!strcmp(regex, pretok_regex(PRETOK_QWEN3))) {
        t->pretok = PRETOK_QWEN3;
    } else if (!strcmp(regex, pretok_regex(PRETOK_QWEN35))) {
        t->pretok = PRETOK_QWEN35;
    } else {
        st = err_set(s->err, QWENRT_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer regex \"%.200s\" is neither the Qwen3 nor the Qwen3.5 one",
                     s->src, regex);
    }
    json_decref(j);
    return st;
}

static qwenrt_status load_doc(struct scan *s, struct tokenizer *t)
{
    struct doc d = {0};
    qwenrt_status st;
    if ((st = walk_object(s, on_top_key, &d)) != QWENRT_OK)
        return st;
    skip_ws(s);
    if (s->p != s->end)
        return fail(s, "text after the top-level object");
    if (!d.vocab.p)
        return err_set(s->err, QWENRT_ERR_FORMAT, "%s: missing model.vocab", s->src);
    if (!d.merges.p)
        return err_set(s->err, QWENRT_ERR_FORMAT, "%s: missing model.merges", s->src);
    if (d.model_type.p && (d.model_type.n != 5 || memcmp(d.model_type.p, "\"BPE\"", 5)))
        return err_set(s->err, QWENRT_ERR_UNSUPPORTED, "%s: model.type %.*s is not \"BPE\"", s->src,
                       (int)(d.model_type.n > 40 ? 40 : d.model_type.n), d.model_type.p);
    if ((st = load_normalizer(s, t, &d.normalizer)) || (st = load_pretok(s, t, &d.pretok)))
        return st;
    if ((st = load_vocab(s, t, &d.vocab)) || (st = load_added(s, t, &d.added)))
        return st;
    if ((st = tok_index_vocab(t, (size_t)t->n_vocab, s->src, s->err)))
        return st;
    if ((st = load_merges(s, t, &d.merges)))
        return st;
    return tok_finish(t, s->src, s->err);
}

/* tokenizer_config.json next to the tokenizer.json: eos_token and chat_template, if present. */
static qwenrt_status load_config(struct tokenizer *t, const char *path, struct qwenrt_error *err)
{
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    char *cfg = xmalloc(dl + 32, 1);
    if (!cfg)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    memcpy(cfg, path, dl);
    strcpy(cfg + dl, "tokenizer_config.json");
    json_error_t je;
    json_t *j = json_load_file(cfg, 0, &je);
    qwenrt_status st = QWENRT_OK;
    if (!j) {
        FILE *f = fopen(cfg, "rb"); /* absent is fine; present but broken is an error */
        if (f) {
            fclose(f);
            st = err_set(err, QWENRT_ERR_FORMAT, "%s: line %d: %s", cfg, je.line, je.text);
        }
        goto out;
    }
    json_t *eos = json_object_get(j, "eos_token");
    if (json_is_object(eos))
        eos = json_object_get(eos, "content");
    if (json_is_string(eos))
        t->eos_config = tokenizer_token_id(t, json_string_value(eos), json_string_length(eos));
    json_t *tpl = json_object_get(j, "chat_template");
    if (json_is_array(tpl)) { /* [{"name": ..., "template": ...}]: take "default" */
        size_t i;
        json_t *e, *pick = NULL;
        json_array_foreach(tpl, i, e)
        {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!pick || (name && !strcmp(name, "default")))
                pick = json_object_get(e, "template");
        }
        tpl = pick;
    }
    if (json_is_string(tpl) && !(t->chat_template = xstrdup(json_string_value(tpl))))
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", cfg);
    json_decref(j);
out:
    xfree(cfg);
    return st;
}

qwenrt_status tokenizer_load_json(struct tokenizer **out, const char *path,
                                  struct qwenrt_error *err)
{
    struct mapped_file mf = {0};
    struct tokenizer *t = NULL;
    qwenrt_status st;
    *out = NULL;
    if ((st = mapfile_open(&mf, path, err)) != QWENRT_OK)
        return st;
    if (!mf.data) { /* before the scanner: NULL + 0 is undefined (fuzz_tokenizer_json) */
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: the file is empty", path);
        goto out_unmap;
    }
    if ((st = tok_new(&t, err)) != QWENRT_OK)
        goto out_unmap;
    struct scan s = {.p = (const char *)mf.data,
                     .end = (const char *)mf.data + mf.size,
                     .base = (const char *)mf.data,
                     .src = path,
                     .err = err};
    st = load_doc(&s, t);
    xfree(s.buf);
    if (st == QWENRT_OK && (st = load_config(t, path, err)) == QWENRT_OK) {
        /* eos_config was looked up after tok_finish: recompute the eos list */
        tok_find_special(t);
    }
    if (st != QWENRT_OK)
        tokenizer_free(t);
    else
        *out = t;
out_unmap:
    mapfile_close(&mf);
    return st;
}
