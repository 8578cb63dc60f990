/*
 * chat_template.c — the Qwen3, Qwen3.5 and plain ChatML chat renderers (see chat_template.h).
 *
 * Each renderer follows its Jinja template statement by statement; comments quote the template
 * where the behaviour is not obvious. Python string semantics are reproduced exactly:
 * split/strip('\n') in Qwen3, Jinja's |trim (Python str.strip(), Unicode whitespace) in
 * Qwen3.5, tojson as transformers defines it (json.dumps, ensure_ascii=False) and |string as
 * Python's str() (True, False, None, float repr).
 * A Jinja interpreter was not written: two fixed templates are far less code, and a template
 * that is neither is better served by a clear warning than by partial Jinja support.
 */
#include "tokenizer/chat_template.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tokenizer/unicode.h"

/* ------------------------------------------------------------------ text helpers */

struct sb {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = xrealloc(b->p, cap, 1);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(struct sb *b, const char *s)
{
    put(b, s, strlen(s));
}

struct sv {
    const char *p;
    size_t n;
};

static struct sv sv_of(const char *s)
{
    return (struct sv){s ? s : "", s ? strlen(s) : 0};
}

static void put_sv(struct sb *b, struct sv v)
{
    put(b, v.p, v.n);
}

static bool sv_starts(struct sv v, const char *pre)
{
    size_t n = strlen(pre);
    return v.n >= n && !memcmp(v.p, pre, n);
}

static bool sv_ends(struct sv v, const char *suf)
{
    size_t n = strlen(suf);
    return v.n >= n && !memcmp(v.p + v.n - n, suf, n);
}

/* Offset of the first (last when `last`) occurrence of pat, or -1. */
static long sv_find(struct sv v, const char *pat, bool last)
{
    size_t n = strlen(pat);
    long found = -1;
    for (size_t i = 0; i + n <= v.n; i++)
        if (!memcmp(v.p + i, pat, n)) {
            found = (long)i;
            if (!last)
                break;
        }
    return found;
}

static struct sv sv_strip_nl(struct sv v, bool left, bool right)
{
    while (left && v.n && v.p[0] == '\n')
        v.p++, v.n--;
    while (right && v.n && v.p[v.n - 1] == '\n')
        v.n--;
    return v;
}

/* Python's str.isspace() for one code point. */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Jinja's |trim: Python str.strip() (Unicode whitespace at both ends). */
static struct sv sv_trim(struct sv v)
{
    for (;;) { /* left */
        size_t len;
        uint32_t cp;
        if (!v.n || utf8_step((const uint8_t *)v.p, v.n, &len, &cp) != UTF8_OK || !py_space(cp))
            break;
        v.p += len, v.n -= len;
    }
    while (v.n) { /* right: find the start of the last char */
        size_t s = v.n - 1, len;
        uint32_t cp;
        while (s > 0 && ((uint8_t)v.p[s] & 0xC0) == 0x80 && v.n - s < 4)
            s--;
        if (utf8_step((const uint8_t *)v.p + s, v.n - s, &len, &cp) != UTF8_OK || s + len != v.n ||
            !py_space(cp))
            break;
        v.n = s;
    }
    return v;
}

/* ------------------------------------------------------------------ Python-style JSON */

/* repr(float): the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16. */
static void py_float(struct sb *b, double x)
{
    char buf[40], digits[24];
    int prec, exp;
    if (x == 0) {
        puts_(b, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    /* buf = [-]d[.ddd]e[+-]XX */
    const char *p = buf;
    if (*p == '-') {
        puts_(b, "-");
        p++;
    }
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    exp = atoi(p + 1);
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            puts_(b, "0.");
            for (int i = 0; i < -exp - 1; i++)
                puts_(b, "0");
            put(b, digits, nd);
        } else {
            for (int i = 0; i <= exp; i++)
                put(b, i < (int)nd ? &digits[i] : "0", 1);
            puts_(b, ".");
            if ((int)nd > exp + 1)
                put(b, digits + exp + 1, nd - (size_t)exp - 1);
            else
                puts_(b, "0");
        }
        return;
    }
    put(b, digits, 1);
    if (nd > 1) {
        puts_(b, ".");
        put(b, digits + 1, nd - 1);
    }
    snprintf(buf, sizeof(buf), "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    puts_(b, buf);
}

static void py_json_str(struct sb *b, const char *s, size_t n)
{
    puts_(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(u, sizeof(u), "\\u%04x", c);
            esc = u;
        }
        if (!esc)
            continue;
        put(b, s + run, i - run);
        puts_(b, esc);
        run = i + 1;
    }
    put(b, s + run, n - run);
    puts_(b, "\"");
}

/* json.dumps(v, ensure_ascii=False): ", " and ": " separators, key order kept. */
static void py_json(struct sb *b, const json_t *v)
{
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        puts_(b, "{");
        json_object_foreach((json_t *)v, k, x)
        {
            if (!first)
                puts_(b, ", ");
            first = false;
            py_json_str(b, k, strlen(k));
            puts_(b, ": ");
            py_json(b, x);
        }
        puts_(b, "}");
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *x;
        puts_(b, "[");
        json_array_foreach(v, i, x)
        {
            if (i)
                puts_(b, ", ");
            py_json(b, x);
        }
        puts_(b, "]");
        break;
    }
    case JSON_STRING:
        py_json_str(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
        puts_(b, num);
        break;
    case JSON_REAL:
        py_float(b, json_real_value(v));
        break;
    case JSON_TRUE:
        puts_(b, "true");
        break;
    case JSON_FALSE:
        puts_(b, "false");
        break;
    case JSON_NULL:
        puts_(b, "null");
        break;
    }
}

/* Python str() of a scalar, tojson of a mapping or list (Qwen3.5's parameter values). */
static void py_str(struct sb *b, const json_t *v)
{
    if (json_is_string(v))
        put(b, json_string_value(v), json_string_length(v));
    else if (json_is_true(v))
        puts_(b, "True");
    else if (json_is_false(v))
        puts_(b, "False");
    else if (json_is_null(v))
        puts_(b, "None");
    else
        py_json(b, v);
}

static qwenrt_status parse_json(const char *text, const char *what, json_t **out,
                                struct qwenrt_error *err)
{
    json_error_t je;
    *out = json_loads(text ? text : "null", JSON_DECODE_ANY, &je);
    if (!*out)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "chat template: %s is not JSON: %s", what,
                       je.text);
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ detection */

enum chat_format chat_format_detect(const char *t, const char **warning)
{
    const char *w = NULL;
    enum chat_format f = CHAT_FORMAT_CHATML;
    if (!t || !*t)
        w = "the model has no chat template; using plain ChatML (no tools, no reasoning)";
    else if (strstr(t, "<|im_start|>") && strstr(t, "<function=") && strstr(t, "<parameter="))
        f = CHAT_FORMAT_QWEN35;
    else if (strstr(t, "<|im_start|>") && strstr(t, "<tool_call>") &&
             strstr(t, "last_query_index") && strstr(t, "reasoning_content"))
        f = CHAT_FORMAT_QWEN3;
    else if (strstr(t, "<|im_start|>"))
        w = "the model's chat template is neither Qwen3's nor Qwen3.5's; using plain ChatML "
            "(no tools, no reasoning)";
    else
        w = "the model's chat template is not ChatML-like and not supported; using plain ChatML";
    if (warning)
        *warning = w;
    return f;
}

const char *chat_format_name(enum chat_format f)
{
    return f == CHAT_FORMAT_QWEN3 ? "qwen3" : f == CHAT_FORMAT_QWEN35 ? "qwen35" : "chatml";
}

/* ------------------------------------------------------------------ renderers */

static bool role_is(const struct chat_message *m, const char *r)
{
    return m->role && !strcmp(m->role, r);
}

/* content.split('</think>'): reasoning = [0].rstrip('\n').split('<think>')[-1].lstrip('\n'),
 * content = [-1].lstrip('\n'). */
static void split_think(struct sv *content, struct sv *reasoning)
{
    long first = sv_find(*content, "</think>", false), last = sv_find(*content, "</think>", true);
    struct sv before = {content->p, (size_t)first};
    before = sv_strip_nl(before, false, true);
    long open = sv_find(before, "<think>", true);
    if (open >= 0)
        before.p += open + 7, before.n -= (size_t)open + 7;
    *reasoning = sv_strip_nl(before, true, false);
    struct sv after = {content->p + last + 8, content->n - (size_t)last - 8};
    *content = sv_strip_nl(after, true, false);
}

static qwenrt_status put_tools(struct sb *b, const struct chat_params *p, struct qwenrt_error *err)
{
    for (size_t i = 0; i < p->n_tools; i++) {
        json_t *j;
        char what[32];
        snprintf(what, sizeof(what), "tools[%zu]", i);
        qwenrt_status st = parse_json(p->tools[i], what, &j, err);
        if (st != QWENRT_OK)
            return st;
        puts_(b, "\n");
        py_json(b, j);
        json_decref(j);
    }
    return QWENRT_OK;
}

static const char Q3_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char Q3_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

/* Qwen3: <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>, ARGS as given when a
 * string, else tojson. */
static qwenrt_status q3_tool_call(struct sb *b, const struct chat_tool_call *tc,
                                  struct qwenrt_error *err)
{
    json_t *args;
    qwenrt_status st = parse_json(tc->arguments, "tool call arguments", &args, err);
    if (st != QWENRT_OK)
        return st;
    puts_(b, "<tool_call>\n{\"name\": \"");
    puts_(b, tc->name ? tc->name : "");
    puts_(b, "\", \"arguments\": ");
    if (json_is_string(args))
        put(b, json_string_value(args), json_string_length(args));
    else
        py_json(b, args);
    puts_(b, "}\n</tool_call>");
    json_decref(args);
    return QWENRT_OK;
}

static qwenrt_status render_qwen3(struct sb *b, const struct chat_params *p,
                                  struct qwenrt_error *err)
{
    const struct chat_message *m = p->messages;
    size_t n = p->n_messages;
    qwenrt_status st;
    bool sys0 = n > 0 && role_is(&m[0], "system");
    if (p->n_tools) {
        puts_(b, "<|im_start|>system\n");
        if (sys0) {
            put_sv(b, sv_of(m[0].content));
            puts_(b, "\n\n");
        }
        puts_(b, Q3_TOOLS_HEAD);
        if ((st = put_tools(b, p, err)) != QWENRT_OK)
            return st;
        puts_(b, Q3_TOOLS_TAIL);
    } else if (sys0) {
        puts_(b, "<|im_start|>system\n");
        put_sv(b, sv_of(m[0].content));
        puts_(b, "<|im_end|>\n");
    }
    /* the last user message that is not a wrapped tool response */
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        struct sv c = sv_of(m[k].content);
        if (role_is(&m[k], "user") &&
            !(sv_starts(c, "<tool_response>") && sv_ends(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct sv content = sv_of(m[i].content), reasoning = {"", 0};
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0)) {
            puts_(b, "<|im_start|>");
            puts_(b, m[i].role);
            puts_(b, "\n");
            put_sv(b, content);
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            if (m[i].reasoning_content)
                reasoning = sv_of(m[i].reasoning_content);
            else if (sv_find(content, "</think>", false) >= 0)
                split_think(&content, &reasoning);
            puts_(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                puts_(b, "<think>\n");
                put_sv(b, sv_strip_nl(reasoning, true, true));
                puts_(b, "\n</think>\n\n");
                put_sv(b, sv_strip_nl(content, true, false));
            } else {
                put_sv(b, content);
            }
            for (size_t k = 0; k < m[i].n_tool_calls; k++) {
                if (k > 0 || content.n)
                    puts_(b, "\n");
                if ((st = q3_tool_call(b, &m[i].tool_calls[k], err)) != QWENRT_OK)
                    return st;
            }
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool"))
                puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            put_sv(b, content);
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&m[i + 1], "tool"))
                puts_(b, "<|im_end|>\n");
        }
    }
    if (p->add_generation_prompt) {
        puts_(b, "<|im_start|>assistant\n");
        if (!p->enable_thinking)
            puts_(b, "<think>\n\n</think>\n\n");
    }
    return QWENRT_OK;
}

static const char Q35_TOOLS_HEAD[] =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char Q35_TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

/* Qwen3.5: <tool_call>\n<function=N>\n then <parameter=K>\nV\n</parameter>\n per argument. */
static qwenrt_status q35_tool_call(struct sb *b, const struct chat_tool_call *tc,
                                   struct qwenrt_error *err)
{
    json_t *args = NULL;
    qwenrt_status st = QWENRT_OK;
    puts_(b, "<function=");
    puts_(b, tc->name ? tc->name : "");
    puts_(b, ">\n");
    if (tc->arguments) {
        if ((st = parse_json(tc->arguments, "tool call arguments", &args, err)) != QWENRT_OK)
            return st;
        if (json_is_string(args)) { /* OpenAI sends the arguments as a JSON string */
            json_t *inner;
            if ((st = parse_json(json_string_value(args), "tool call arguments", &inner, err)))
                goto out;
            json_decref(args);
            args = inner;
        }
        if (!json_is_object(args)) {
            st = err_set(err, QWENRT_ERR_INVALID_ARG,
                         "chat template: arguments of tool call '%s' are not a JSON object",
                         tc->name ? tc->name : "");
            goto out;
        }
        const char *k;
        json_t *v;
        json_object_foreach(args, k, v)
        {
            puts_(b, "<parameter=");
            puts_(b, k);
            puts_(b, ">\n");
            py_str(b, v);
            puts_(b, "\n</parameter>\n");
        }
    }
    puts_(b, "</function>\n</tool_call>");
out:
    json_decref(args);
    return st;
}

static qwenrt_status render_qwen35(struct sb *b, const struct chat_params *p,
                                   struct qwenrt_error *err)
{
    const struct chat_message *m = p->messages;
    size_t n = p->n_messages;
    qwenrt_status st;
    if (n == 0)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "chat template: No messages provided.");
    bool sys0 = role_is(&m[0], "system");
    if (p->n_tools) {
        puts_(b, Q35_TOOLS_HEAD);
        if ((st = put_tools(b, p, err)) != QWENRT_OK)
            return st;
        puts_(b, Q35_TOOLS_TAIL);
        struct sv c = sys0 ? sv_trim(sv_of(m[0].content)) : (struct sv){"", 0};
        if (c.n) {
            puts_(b, "\n\n");
            put_sv(b, c);
        }
        puts_(b, "<|im_end|>\n");
    } else if (sys0) {
        puts_(b, "<|im_start|>system\n");
        put_sv(b, sv_trim(sv_of(m[0].content)));
        puts_(b, "<|im_end|>\n");
    }
    size_t last_query = SIZE_MAX;
    for (size_t k = n; k-- > 0 && last_query == SIZE_MAX;) {
        struct sv c = sv_trim(sv_of(m[k].content));
        if (role_is(&m[k], "user") &&
            !(sv_starts(c, "<tool_response>") && sv_ends(c, "</tool_response>")))
            last_query = k;
    }
    if (last_query == SIZE_MAX)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "chat template: No user query found in messages.");
    for (size_t i = 0; i < n; i++) {
        struct sv content = sv_trim(sv_of(m[i].content)), reasoning = {"", 0};
        if (role_is(&m[i], "system")) {
            if (i > 0)
                return err_set(err, QWENRT_ERR_INVALID_ARG,
                               "chat template: System message must be at the beginning.");
        } else if (role_is(&m[i], "user")) {
            puts_(b, "<|im_start|>user\n");
            put_sv(b, content);
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            if (m[i].reasoning_content)
                reasoning = sv_of(m[i].reasoning_content);
            else if (sv_find(content, "</think>", false) >= 0)
                split_think(&content, &reasoning);
            reasoning = sv_trim(reasoning);
            puts_(b, "<|im_start|>assistant\n");
            if (i > last_query && reasoning.n) {
                puts_(b, "<think>\n");
                put_sv(b, reasoning);
                puts_(b, "\n</think>\n\n");
            }
            put_sv(b, content);
            for (size_t k = 0; k < m[i].n_tool_calls; k++) {
                puts_(b, k > 0                ? "\n<tool_call>\n"
                         : sv_trim(content).n ? "\n\n<tool_call>\n"
                                              : "<tool_call>\n");
                if ((st = q35_tool_call(b, &m[i].tool_calls[k], err)) != QWENRT_OK)
                    return st;
            }
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "tool")) {
            if (i > 0 && !role_is(&m[i - 1], "tool"))
                puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            put_sv(b, content);
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&m[i + 1], "tool"))
                puts_(b, "<|im_end|>\n");
        } else {
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "chat template: Unexpected message role '%s'.",
                           m[i].role ? m[i].role : "(null)");
        }
    }
    if (p->add_generation_prompt)
        puts_(b, p->enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                    : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return QWENRT_OK;
}

static qwenrt_status render_chatml(struct sb *b, const struct chat_params *p)
{
    for (size_t i = 0; i < p->n_messages; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, p->messages[i].role ? p->messages[i].role : "user");
        puts_(b, "\n");
        put_sv(b, sv_of(p->messages[i].content));
        puts_(b, "<|im_end|>\n");
    }
    if (p->add_generation_prompt)
        puts_(b, "<|im_start|>assistant\n");
    return QWENRT_OK;
}

qwenrt_status chat_render(enum chat_format fmt, const struct chat_params *p, char **out,
                          size_t *len, struct qwenrt_error *err)
{
    struct sb b = {0};
    qwenrt_status st;
    *out = NULL;
    *len = 0;
    puts_(&b, "");
    if (fmt == CHAT_FORMAT_QWEN3)
        st = render_qwen3(&b, p, err);
    else if (fmt == CHAT_FORMAT_QWEN35)
        st = render_qwen35(&b, p, err);
    else
        st = render_chatml(&b, p);
    if (st == QWENRT_OK && b.oom)
        st = err_set(err, QWENRT_ERR_NOMEM, "chat template: out of memory");
    if (st != QWENRT_OK) {
        xfree(b.p);
        return st;
    }
    *out = b.p;
    *len = b.n;
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ JSON requests */

struct req {
    struct chat_message *msgs;
    struct chat_tool_call *calls;
    char **texts; /* owned strings (tool JSON, arguments, joined content parts) */
    size_t n_texts;
    const char **tools;
};

static const char *own(struct req *r, char *s)
{
    if (s)
        r->texts[r->n_texts++] = s;
    return s;
}

/* A message's content: a string, null, or a list of {"type": "text", "text": ...} parts. */
static qwenrt_status content_of(struct req *r, json_t *c, size_t i, const char **out,
                                struct qwenrt_error *err)
{
    *out = NULL;
    if (json_is_string(c) || json_is_null(c) || !c) {
        *out = json_string_value(c);
        return QWENRT_OK;
    }
    if (!json_is_array(c))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "chat: messages[%zu].content has a bad type",
                       i);
    struct sb b = {0};
    size_t k;
    json_t *part;
    puts_(&b, "");
    json_array_foreach(c, k, part)
    {
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            xfree(b.p);
            return err_set(err, QWENRT_ERR_UNSUPPORTED,
                           "chat: messages[%zu].content[%zu] is not text (no images/video)", i, k);
        }
        put(&b, json_string_value(t), json_string_length(t));
    }
    if (b.oom)
        return err_set(err, QWENRT_ERR_NOMEM, "chat: out of memory");
    *out = own(r, b.p);
    return QWENRT_OK;
}

static qwenrt_status build_request(struct req *r, json_t *root, struct chat_params *p,
                                   struct qwenrt_error *err)
{
    json_t *msgs = json_object_get(root, "messages"), *tools = json_object_get(root, "tools");
    size_t n = json_array_size(msgs), nt = json_array_size(tools), ncalls = 0, i, k;
    json_t *m, *tc;
    qwenrt_status st;
    if (!json_is_array(msgs))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "chat: \"messages\" is not an array");
    json_array_foreach(msgs, i, m) ncalls += json_array_size(json_object_get(m, "tool_calls"));
    r->msgs = xcalloc(n + 1, sizeof(*r->msgs));
    r->calls = xcalloc(ncalls + 1, sizeof(*r->calls));
    r->texts = xcalloc(nt + ncalls + n + 1, sizeof(*r->texts));
    r->tools = xcalloc(nt + 1, sizeof(*r->tools));
    if (!r->msgs || !r->calls || !r->texts || !r->tools)
        return err_set(err, QWENRT_ERR_NOMEM, "chat: out of memory");
    json_array_foreach(
        tools, k,
        tc) if (!(r->tools[k] =
                      own(r, json_dumps(
                                 tc, JSON_COMPACT |
                                         JSON_ENCODE_ANY)))) return err_set(err, QWENRT_ERR_NOMEM,
                                                                            "chat: out of memory");
    size_t c = 0;
    json_array_foreach(msgs, i, m)
    {
        struct chat_message *cm = &r->msgs[i];
        cm->role = json_string_value(json_object_get(m, "role"));
        if (!cm->role)
            return err_set(err, QWENRT_ERR_INVALID_ARG, "chat: messages[%zu] has no role", i);
        if ((st = content_of(r, json_object_get(m, "content"), i, &cm->content, err)))
            return st;
        cm->reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
        cm->tool_calls = r->calls + c;
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc)
        {
            json_t *f = json_object_get(tc, "function") ? json_object_get(tc, "function") : tc;
            json_t *args = json_object_get(f, "arguments");
            r->calls[c].name = json_string_value(json_object_get(f, "name"));
            if (args &&
                !(r->calls[c].arguments = own(r, json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY))))
                return err_set(err, QWENRT_ERR_NOMEM, "chat: out of memory");
            c++;
            cm->n_tool_calls++;
        }
    }
    p->messages = r->msgs;
    p->n_messages = n;
    p->tools = r->tools;
    p->n_tools = nt;
    json_t *agp = json_object_get(root, "add_generation_prompt");
    json_t *think = json_object_get(root, "enable_thinking");
    p->add_generation_prompt = json_is_true(agp);
    p->enable_thinking = !json_is_false(think);
    return QWENRT_OK;
}

qwenrt_status chat_render_json(enum chat_format fmt, const char *request_json, char **out,
                               size_t *len, struct qwenrt_error *err)
{
    json_t *root;
    struct req r = {0};
    struct chat_params p = {0};
    qwenrt_status st = parse_json(request_json, "the request", &root, err);
    if (st != QWENRT_OK)
        return st;
    if ((st = build_request(&r, root, &p, err)) == QWENRT_OK)
        st = chat_render(fmt, &p, out, len, err);
    for (size_t i = 0; i < r.n_texts; i++)
        free(r.texts[i]); /* json_dumps strings are malloc'd; joined content is xmalloc'd */
    xfree(r.msgs);
    xfree(r.calls);
    xfree(r.texts);
    xfree(r.tools);
    json_decref(root);
    return st;
}
