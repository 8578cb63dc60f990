/*
 * tool_calls.c — parsing <tool_call> blocks of generated text (tool_calls.h).
 */
#include "server/tool_calls.h"

#include <jansson.h>
#include <string.h>

#include "base/alloc.h"

#define TOOL_CALL_CLOSE "</tool_call>"

/* The bytes [p, e) without leading and trailing whitespace. */
static void trim(const char **p, const char **e)
{
    while (*p < *e && strchr(" \t\r\n", **p))
        (*p)++;
    while (*e > *p && strchr(" \t\r\n", (*e)[-1]))
        (*e)--;
}

/* First occurrence of needle in [p, e), or NULL. */
static const char *find(const char *p, const char *e, const char *needle)
{
    size_t n = strlen(needle);
    for (; p && p + n <= e; p++)
        if (memcmp(p, needle, n) == 0)
            return p;
    return NULL;
}

/* A function or parameter name: 1..256 bytes, no control characters (a NUL would cut the C
 * string short), no whitespace, no '<' or '>'. */
static bool name_ok(const char *p, const char *e)
{
    if (p >= e || e - p > 256)
        return false;
    for (; p < e; p++)
        if ((unsigned char)*p <= ' ' || *p == '<' || *p == '>' || *p == 0x7f)
            return false;
    return true;
}

static char *dup_range(const char *p, const char *e)
{
    char *s = xmalloc((size_t)(e - p) + 1, 1);
    if (s) {
        memcpy(s, p, (size_t)(e - p));
        s[e - p] = 0;
    }
    return s;
}

/* Qwen3: {"name": N, "arguments": OBJECT or a string holding one}. */
static bool parse_json_call(const char *p, const char *e, struct tool_call *tc)
{
    json_error_t jerr;
    json_t *root = json_loadb(p, (size_t)(e - p), 0, &jerr);
    json_t *name = json_object_get(root, "name"), *args = json_object_get(root, "arguments");
    const char *nv = json_string_value(name);
    bool ok = nv && name_ok(nv, nv + json_string_length(name));
    json_t *obj = NULL;
    if (ok && json_is_string(args)) /* some models send the arguments as a JSON string */
        obj = json_loads(json_string_value(args), 0, &jerr);
    else if (ok && (!args || json_is_object(args)))
        obj = args ? json_incref(args) : json_object();
    ok = ok && json_is_object(obj);
    char *txt = ok ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (ok && txt) {
        tc->name = xstrdup(json_string_value(name));
        tc->arguments = xstrdup(txt);
    }
    ok = ok && txt && tc->name && tc->arguments;
    free(txt);
    json_decref(obj);
    json_decref(root);
    return ok;
}

/* A parameter's value: one leading and one trailing newline dropped; JSON when it parses as
 * a JSON value, else a string. */
static json_t *param_value(const char *p, const char *e)
{
    if (p < e && *p == '\n')
        p++;
    if (e > p && e[-1] == '\n')
        e--;
    json_error_t jerr;
    json_t *v = json_loadb(p, (size_t)(e - p), JSON_DECODE_ANY, &jerr);
    return v ? v : json_stringn(p, (size_t)(e - p));
}

/* Qwen3.5: <function=N> (<parameter=K>V</parameter>)* </function>. */
static bool parse_xml_call(const char *p, const char *e, struct tool_call *tc)
{
    static const char fopen_[] = "<function=", fclose_[] = "</function>";
    static const char popen_[] = "<parameter=", pclose_[] = "</parameter>";
    if ((size_t)(e - p) < sizeof(fopen_) || memcmp(p, fopen_, sizeof(fopen_) - 1))
        return false;
    const char *name = p + sizeof(fopen_) - 1, *gt = find(name, e, ">");
    const char *fend = find(name, e, fclose_);
    if (!gt || !fend || gt > fend || !name_ok(name, gt))
        return false;
    const char *rest = fend + sizeof(fclose_) - 1, *re = e;
    trim(&rest, &re);
    if (rest != re) /* something after </function> */
        return false;
    json_t *args = json_object();
    bool ok = args != NULL;
    for (const char *q = gt + 1; ok;) {
        const char *qs = q, *qe = fend;
        trim(&qs, &qe);
        if (qs == qe)
            break; /* only whitespace left */
        if ((size_t)(qe - qs) < sizeof(popen_) || memcmp(qs, popen_, sizeof(popen_) - 1)) {
            ok = false;
            break;
        }
        const char *key = qs + sizeof(popen_) - 1, *kgt = find(key, fend, ">");
        const char *vend = kgt ? find(kgt, fend, pclose_) : NULL;
        if (!kgt || !vend || !name_ok(key, kgt)) {
            ok = false;
            break;
        }
        char *k = dup_range(key, kgt);
        json_t *v = param_value(kgt + 1, vend);
        ok = k && v && json_object_set_new(args, k, v) == 0;
        if (!ok && v && k == NULL)
            json_decref(v);
        xfree(k);
        q = vend + sizeof(pclose_) - 1;
    }
    char *txt = ok ? json_dumps(args, JSON_COMPACT) : NULL;
    if (txt) {
        tc->name = dup_range(name, gt);
        tc->arguments = xstrdup(txt);
    }
    ok = txt && tc->name && tc->arguments;
    free(txt);
    json_decref(args);
    return ok;
}

void tool_calls_free(struct tool_calls *tc)
{
    for (int i = 0; i < tc->n; i++) {
        xfree(tc->v[i].name);
        xfree(tc->v[i].arguments);
    }
    memset(tc, 0, sizeof(*tc));
}

bool tool_calls_parse(const char *text, size_t len, struct tool_calls *out)
{
    memset(out, 0, sizeof(*out));
    const char *end = text + len, *first = find(text, end, TOOL_CALL_OPEN);
    if (!first)
        return false;
    const char *cs = text, *ce = first;
    while (ce > cs && strchr(" \t\r\n", ce[-1]))
        ce--;
    out->content_len = (size_t)(ce - cs);
    for (const char *p = first; p < end;) {
        const char *rest = p, *re = end;
        trim(&rest, &re);
        if (rest == re)
            break; /* trailing whitespace */
        const char *open = find(rest, re, TOOL_CALL_OPEN);
        if (open != rest || out->n == TOOL_CALLS_MAX) /* text between or after calls */
            goto fail;
        const char *body = open + strlen(TOOL_CALL_OPEN), *close = find(body, end, TOOL_CALL_CLOSE);
        if (!close)
            goto fail; /* unterminated: the generation stopped inside a call */
        const char *bs = body, *be = close;
        trim(&bs, &be);
        struct tool_call *tc = &out->v[out->n];
        bool ok = bs < be && (*bs == '{' ? parse_json_call(bs, be, tc) : parse_xml_call(bs, be, tc));
        out->n++; /* freed on failure too */
        if (!ok)
            goto fail;
        p = close + strlen(TOOL_CALL_CLOSE);
    }
    if (out->n > 0)
        return true;
fail:
    tool_calls_free(out);
    return false;
}

size_t tool_calls_safe_len(const char *text, size_t len)
{
    const char *open = find(text, text + len, TOOL_CALL_OPEN);
    if (open)
        return (size_t)(open - text);
    size_t n = strlen(TOOL_CALL_OPEN);
    for (size_t k = n - 1; k > 0; k--) /* the longest tail that begins the tag */
        if (k <= len && memcmp(text + len - k, TOOL_CALL_OPEN, k) == 0)
            return len - k;
    return len;
}

bool tool_stream_add(struct tool_stream *ts, const char *text, size_t len, bool last,
                     const char **content, size_t *content_len, struct tool_calls *calls,
                     bool *has_calls)
{
    *content = NULL, *content_len = 0, *has_calls = false;
    char *a = xrealloc(ts->acc, ts->len + len + 1, 1);
    if (!a)
        return false;
    ts->acc = a;
    memcpy(ts->acc + ts->len, text, len);
    ts->len += len;
    size_t safe = last ? ts->len : tool_calls_safe_len(ts->acc, ts->len);
    if (last && tool_calls_parse(ts->acc, ts->len, calls)) {
        *has_calls = true;
        safe = calls->content_len;
    }
    if (safe > ts->sent) {
        *content = ts->acc + ts->sent;
        *content_len = safe - ts->sent;
        ts->sent = safe;
    }
    return true;
}

void tool_stream_free(struct tool_stream *ts)
{
    xfree(ts->acc);
    memset(ts, 0, sizeof(*ts));
}
