/*
 * openai.c — OpenAI request parsing and response/chunk/error JSON (openai.h).
 */
#include "server/openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

bool oai_fail(struct oai_error *e, int status, const char *type, const char *code,
              const char *param, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(e, param, ...) oai_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

void oai_request_free(struct oai_request *r)
{
    if (!r)
        return;
    xfree(r->prompt);
    xfree(r->chat_json);
    for (int i = 0; i < TEXTGEN_MAX_STOP; i++)
        xfree(r->stops[i]);
    for (int i = 0; i < OAI_PROMPTS_MAX - 1; i++)
        xfree(r->more_prompts[i]);
    xfree(r->bias);
    memset(r, 0, sizeof(*r));
}

/* A number field in [lo, hi]; absent or null leaves *out. */
static bool get_num(json_t *root, const char *key, double lo, double hi, float *out,
                    struct oai_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v))
        return BAD(e, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (d < lo || d > hi)
        return BAD(e, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = (float)d;
    return true;
}

/* An integer field in [lo, hi]; absent or null leaves *out. */
static bool get_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                    struct oai_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_integer(v))
        return BAD(e, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(e, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return true;
}

static bool get_bool(json_t *root, const char *key, bool *out, struct oai_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v))
        return BAD(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return true;
}

/* Chat: "logprobs": true and "top_logprobs": 0..OAI_TOP_LOGPROBS_MAX. */
static bool chat_logprobs_field(json_t *root, struct oai_request *r, struct oai_error *e)
{
    bool lp = false;
    long long top = 0;
    if (!get_bool(root, "logprobs", &lp, e) ||
        !get_int(root, "top_logprobs", 0, OAI_TOP_LOGPROBS_MAX, &top, e))
        return false;
    if (top > 0 && !lp)
        return BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->logprobs = lp ? 1 + (int32_t)top : 0;
    return true;
}

/* Completions: "logprobs": the number of alternatives per token (0..OAI_TOP_LOGPROBS_MAX;
 * null or absent: none); "echo": the prompt starts the answer. */
static bool completion_logprobs(json_t *root, struct oai_request *r, struct oai_error *e)
{
    long long top = -1;
    bool echo = false;
    json_t *tl = json_object_get(root, "top_logprobs");
    if (tl && !json_is_null(tl))
        return BAD(e, "top_logprobs", "/v1/completions takes the number of alternatives in 'logprobs'");
    if (!get_int(root, "logprobs", 0, OAI_TOP_LOGPROBS_MAX, &top, e) || !get_bool(root, "echo", &echo, e))
        return false;
    r->echo = echo;
    r->logprobs = top >= 0 ? 1 + (int32_t)top : 0;
    return true;
}

static bool parse_stop(json_t *root, struct oai_request *r, struct oai_error *e)
{
    json_t *v = json_object_get(root, "stop"), *x;
    size_t i, n = 0;
    if (!v || json_is_null(v))
        return true;
    if (json_is_string(v)) {
        if (json_string_length(v) && !(r->stops[0] = xstrdup(json_string_value(v))))
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return true;
    }
    if (!json_is_array(v))
        return BAD(e, "stop", "'stop' must be a string or an array of strings");
    if (json_array_size(v) > TEXTGEN_MAX_STOP)
        return BAD(e, "stop", "'stop' holds at most %d strings", TEXTGEN_MAX_STOP);
    json_array_foreach(v, i, x)
    {
        if (!json_is_string(x))
            return BAD(e, "stop", "'stop[%zu]' must be a string", i);
        if (json_string_length(x) && !(r->stops[n++] = xstrdup(json_string_value(x))))
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return true;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...} (OpenAI's form: ids as strings). */
static bool parse_logit_bias(json_t *root, const struct oai_limits *lim, struct oai_request *r,
                             struct oai_error *e)
{
    json_t *v = json_object_get(root, "logit_bias"), *x;
    const char *key;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_object(v))
        return BAD(e, "logit_bias", "'logit_bias' must be an object of token ids to numbers");
    size_t n = json_object_size(v);
    if (n > OAI_LOGIT_BIAS_MAX)
        return BAD(e, "logit_bias", "'logit_bias' holds at most %d entries, got %zu", OAI_LOGIT_BIAS_MAX, n);
    if (!n)
        return true;
    if (!(r->bias = xcalloc(n, sizeof(*r->bias))))
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int32_t k = 0;
    json_object_foreach(v, key, x)
    {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || (lim->n_vocab > 0 && id >= lim->n_vocab) || id > INT32_MAX)
            return BAD(e, "logit_bias", "'logit_bias' key '%.40s' is not a token id (0 to %d)", key,
                       lim->n_vocab > 0 ? lim->n_vocab - 1 : INT32_MAX);
        if (!json_is_number(x) || !(json_number_value(x) >= -100.0 && json_number_value(x) <= 100.0))
            return BAD(e, "logit_bias", "'logit_bias' value of token %lld must be a number from -100 to 100", id);
        r->bias[k].id = (int32_t)id;
        r->bias[k++].bias = (float)json_number_value(x);
    }
    r->sp.logit_bias = r->bias;
    r->sp.n_logit_bias = k;
    return true;
}

static bool parse_sampling(json_t *root, const struct oai_limits *lim, struct oai_request *r,
                           struct oai_error *e)
{
    long long n = 1, seed = -1, top_k = lim->top_k, max_tok = lim->max_tokens;
    float freq = 0.0f;
    r->sp = qwenrt_sampler_default_params();
    r->sp.temperature = 1.0f; /* OpenAI's defaults */
    r->sp.top_p = 1.0f;
    if (!get_num(root, "temperature", 0.0, 2.0, &r->sp.temperature, e) ||
        !get_num(root, "top_p", 0.0, 1.0, &r->sp.top_p, e) ||
        !get_num(root, "min_p", 0.0, 1.0, &r->sp.min_p, e) ||
        !get_num(root, "presence_penalty", -2.0, 2.0, &r->sp.presence_penalty, e) ||
        !get_num(root, "frequency_penalty", -2.0, 2.0, &freq, e) ||
        !get_int(root, "top_k", 0, 1 << 30, &top_k, e) ||
        !get_int(root, "seed", -(1LL << 62), 1LL << 62, &seed, e) ||
        !get_int(root, "n", 1, 128, &n, e) ||
        !get_int(root, "max_tokens", 0, 1 << 30, &max_tok, e) ||
        !get_int(root, "max_completion_tokens", 0, 1 << 30, &max_tok, e))
        return false;
    if (n > OAI_N_MAX)
        return BAD(e, "n", "'n' must be at most %d, got %lld", OAI_N_MAX, n);
    r->n = (int32_t)n;
    if (!(r->kind == OAI_COMPLETION ? completion_logprobs(root, r, e) : chat_logprobs_field(root, r, e)) ||
        !parse_logit_bias(root, lim, r, e))
        return false;
    if (max_tok == 0 && !r->echo) /* nothing to answer: only scoring an echoed prompt */
        return BAD(e, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')");
    if (r->sp.top_p <= 0.0f)
        return BAD(e, "top_p", "'top_p' must be greater than 0");
    r->sp.top_k = (int32_t)top_k;
    if (seed >= 0) {
        r->sp.seed = (uint64_t)seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sp.seed = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
    }
    r->max_tokens = max_tok > lim->max_tokens ? lim->max_tokens : (int32_t)max_tok;
    return true;
}

/* The chat prompt: messages (and tools) rendered with the model's template. */
static bool render_chat(json_t *root, const struct oai_limits *lim, struct oai_request *r,
                        struct oai_error *e)
{
    json_t *msgs = json_object_get(root, "messages"), *m, *tools = json_object_get(root, "tools");
    size_t i;
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return BAD(e, "messages", "'messages' must be a non-empty array");
    json_array_foreach(msgs, i, m)
    {
        json_t *c = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return BAD(e, "messages", "'messages[%zu]' must be an object with a string 'role'", i);
        if (c && !json_is_string(c) && !json_is_array(c) && !json_is_null(c))
            return BAD(e, "messages", "'messages[%zu].content' must be a string or an array", i);
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return BAD(e, "tools", "'tools' must be an array");
    json_t *choice = json_object_get(root, "tool_choice");
    if (choice && !json_is_null(choice) && !json_is_string(choice) && !json_is_object(choice))
        return BAD(e, "tool_choice", "'tool_choice' must be a string or an object");
    r->tools = json_is_array(tools) && json_array_size(tools) > 0 &&
               !(json_is_string(choice) && !strcmp(json_string_value(choice), "none"));
    bool think = true;
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (!get_bool(root, "enable_thinking", &think, e) ||
        (json_is_object(kw) && !get_bool(kw, "enable_thinking", &think, e)))
        return false;
    json_t *req = json_pack("{s:O,s:b,s:b}", "messages", msgs, "add_generation_prompt", 1,
                            "enable_thinking", think);
    if (req && json_is_array(tools))
        json_object_set(req, "tools", tools);
    char *txt = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!txt)
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    struct qwenrt_error err = {0};
    size_t len;
    qwenrt_status st = chat_render_json(lim->fmt, txt, &r->prompt, &len, &err);
    if (!st && !(r->chat_json = xstrdup(txt)))
        st = QWENRT_ERR_NOMEM;
    free(txt);
    if (st == QWENRT_ERR_NOMEM)
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (st)
        return BAD(e, "messages", "%s", err.message);
    return true;
}

static bool parse_prompt(json_t *root, struct oai_request *r, struct oai_error *e)
{
    json_t *p = json_object_get(root, "prompt");
    size_t n = json_is_array(p) ? json_array_size(p) : 1;
    if (json_is_array(p) && (n < 1 || n > OAI_PROMPTS_MAX))
        return BAD(e, "prompt", "'prompt' as an array holds 1 to %d strings, got %zu", OAI_PROMPTS_MAX, n);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(p) ? json_array_get(p, i) : p;
        if (!json_is_string(x))
            return BAD(e, "prompt", "'prompt' must be a string or an array of strings");
        char *t = xstrdup(json_string_value(x));
        if (!t)
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        *(i ? &r->more_prompts[i - 1] : &r->prompt) = t;
    }
    r->n_prompts = (int32_t)n;
    if ((long long)r->n_prompts * r->n > OAI_JOBS_MAX)
        return BAD(e, "n", "%d prompts x 'n' %d is more than %d answers", r->n_prompts, r->n, OAI_JOBS_MAX);
    return true;
}

bool oai_parse(enum oai_kind kind, const char *body, size_t len, const struct oai_limits *lim,
               struct oai_request *r, struct oai_error *e)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->n_prompts = 1;
    json_t *root = oai_load_object(body, len, e);
    bool ok = false;
    if (!root)
        goto out;
    json_t *model = json_object_get(root, "model"), *so = json_object_get(root, "stream_options");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        BAD(e, "model", "'model' must be a string");
        goto out;
    }
    if (json_is_string(model) && strcmp(json_string_value(model), lim->model_id)) {
        oai_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                 "The model '%.200s' does not exist; this server serves '%.200s'",
                 json_string_value(model), lim->model_id);
        goto out;
    }
    if (so && !json_is_null(so) && !json_is_object(so)) {
        BAD(e, "stream_options", "'stream_options' must be an object");
        goto out;
    }
    if (!get_bool(root, "stream", &r->stream, e) ||
        (json_is_object(so) && !get_bool(so, "include_usage", &r->include_usage, e)) ||
        !parse_sampling(root, lim, r, e) || !parse_stop(root, r, e))
        goto out;
    ok = kind == OAI_CHAT ? render_chat(root, lim, r, e) : parse_prompt(root, r, e);
out:
    json_decref(root);
    if (!ok)
        oai_request_free(r);
    return ok;
}

/* ------------------------------------------------------------------ output */

json_t *oai_load_object(const char *body, size_t len, struct oai_error *e)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        BAD(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
            jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

char *oai_dump(json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s)
        return NULL;
    char *out = xstrdup(s); /* callers free with xfree */
    free(s);
    return out;
}

char *oai_error_json(const struct oai_error *e)
{
    json_t *err = json_pack("{s:s,s:s}", "message", e->message, "type", e->type);
    if (!err)
        return NULL;
    json_object_set_new(err, "param", e->param ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    return oai_dump(json_pack("{s:o}", "error", err));
}

/* A JSON string of generated text (whole UTF-8 characters by construction; checked anyway so
 * that a client never receives invalid JSON: invalid text becomes U+FFFD). */
static json_t *utf8_string(const char *text, size_t len)
{
    json_t *t = json_stringn(text ? text : "", text ? len : 0);
    return t ? t : json_string("\xef\xbf\xbd");
}

static json_t *usage_json(const struct oai_usage *u)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", u->prompt, "completion_tokens",
                     u->completion, "total_tokens", u->prompt + u->completion,
                     "prompt_tokens_details", "cached_tokens", u->cached);
}

static json_t *meta_json(const struct oai_meta *m, bool chunk)
{
    const char *obj = m->kind == OAI_COMPLETION ? "text_completion"
                      : chunk                   ? "chat.completion.chunk"
                                                : "chat.completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", m->id, "object", obj, "created", m->created,
                     "model", m->model, "system_fingerprint", "qwenrt-" QWENRT_VERSION);
}

/* [{"id", "type": "function", "function": {"name", "arguments"}}] (+ "index" in chunks). */
static json_t *tool_calls_json(const struct oai_meta *m, const struct tool_calls *tc, bool chunk)
{
    json_t *a = json_array();
    for (int i = 0; a && i < tc->n; i++) {
        char id[96];
        if (m->index) /* choice k > 0 of an "n" > 1 request */
            snprintf(id, sizeof(id), "call_%s_%d_%d", m->id, (int)m->index, i);
        else
            snprintf(id, sizeof(id), "call_%s_%d", m->id, i);
        json_t *c = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                              "name", tc->v[i].name, "arguments", tc->v[i].arguments);
        if (c && chunk)
            json_object_set_new(c, "index", json_integer(i));
        if (!c || json_array_append_new(a, c)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* A chat answer that is tool calls: content before them (or null), the calls. */
static json_t *tool_message(const struct oai_meta *m, const char *text, const struct tool_calls *tc)
{
    json_t *msg = json_pack("{s:s}", "role", "assistant"), *calls = tool_calls_json(m, tc, false);
    if (!msg || !calls) {
        json_decref(msg);
        json_decref(calls);
        return NULL;
    }
    json_object_set_new(msg, "content", tc->content_len ? utf8_string(text, tc->content_len) : json_null());
    json_object_set_new(msg, "tool_calls", calls);
    return msg;
}

char *oai_response_json(const struct oai_meta *m, const char *text, size_t len, const char *finish,
                        const struct oai_usage *u)
{
    json_t *root = meta_json(m, false), *choice;
    struct tool_calls tc;
    if (m->kind == OAI_CHAT && m->tools && tool_calls_parse(text, len, &tc)) {
        json_t *msg = tool_message(m, text, &tc);
        tool_calls_free(&tc);
        choice = msg ? json_pack("{s:i,s:o,s:n,s:s}", "index", (int)m->index, "message", msg, "logprobs",
                                 "finish_reason", "tool_calls")
                     : NULL;
    } else if (m->kind == OAI_CHAT) {
        choice = json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", (int)m->index, "message", "role", "assistant",
                           "content", utf8_string(text, len), "logprobs", "finish_reason", finish);
    } else {
        choice = json_pack("{s:i,s:o,s:n,s:s}", "index", (int)m->index, "text", utf8_string(text, len),
                           "logprobs", "finish_reason", finish);
    }
    if (!root || !choice) {
        json_decref(root);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage_json(u));
    return oai_dump(root);
}

char *oai_merge_choices(char *const *json, int n, int32_t prompt_tokens)
{
    json_t *root = n > 0 && json[0] ? json_loads(json[0], 0, NULL) : NULL;
    json_t *choices = json_object_get(root, "choices"), *usage = json_object_get(root, "usage");
    bool ok = json_is_array(choices) && json_array_size(choices) == 1 && json_is_object(usage);
    json_int_t completion = json_integer_value(json_object_get(usage, "completion_tokens"));
    for (int i = 1; ok && i < n; i++) {
        json_t *r = json[i] ? json_loads(json[i], 0, NULL) : NULL;
        json_t *c = json_array_get(json_object_get(r, "choices"), 0);
        json_t *u = json_object_get(r, "usage");
        ok = json_is_object(c) && json_is_object(u) &&
             !json_object_set_new(c, "index", json_integer(i)) && !json_array_append(choices, c);
        completion += json_integer_value(json_object_get(u, "completion_tokens"));
        json_decref(r);
    }
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    json_object_set_new(usage, "prompt_tokens", json_integer(prompt_tokens));
    json_object_set_new(usage, "completion_tokens", json_integer(completion));
    json_object_set_new(usage, "total_tokens", json_integer(prompt_tokens + completion));
    return oai_dump(root);
}

char *oai_chunk_json(const struct oai_meta *m, const char *text, size_t len, bool role,
                     const char *finish, const struct oai_usage *usage)
{
    json_t *root = meta_json(m, true);
    if (!root)
        return NULL;
    if (usage) {
        json_object_set_new(root, "choices", json_array());
        json_object_set_new(root, "usage", usage_json(usage));
        return oai_dump(root);
    }
    json_t *choice = json_pack("{s:i,s:n}", "index", (int)m->index, "logprobs");
    json_t *t = text ? utf8_string(text, len) : NULL;
    if (m->kind == OAI_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (t)
            json_object_set_new(delta, "content", t);
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", t ? t : json_string(""));
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    return oai_dump(root);
}

char *oai_chunk_tool_calls_json(const struct oai_meta *m, const struct tool_calls *tc)
{
    json_t *root = meta_json(m, true), *calls = tool_calls_json(m, tc, true);
    json_t *choice = json_pack("{s:i,s:n,s:n}", "index", (int)m->index, "logprobs", "finish_reason");
    if (!root || !calls || !choice) {
        json_decref(root);
        json_decref(calls);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(choice, "delta", json_pack("{s:o}", "tool_calls", calls));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    return oai_dump(root);
}

/* The bytes of token id (special tokens: their text). */
static const uint8_t *token_bytes(const struct tokenizer *tok, int32_t id, size_t *len)
{
    const uint8_t *b = tokenizer_token_bytes(tok, id, len);
    if (!b) {
        const char *str = tokenizer_token_str(tok, id, len);
        b = (const uint8_t *)(str ? str : "");
        *len = str ? *len : 0;
    }
    return b;
}

/* The bytes as a JSON string; when they are not whole UTF-8 (part of a character), every
 * byte >= 0x80 becomes U+FFFD. NULL: out of memory. */
static json_t *token_text(const uint8_t *b, size_t len)
{
    json_t *t = json_stringn((const char *)b, len);
    if (t)
        return t;
    char *fixed = xmalloc(len * 3 + 1, 1);
    size_t o = 0;
    for (size_t i = 0; fixed && i < len; i++) {
        if (b[i] < 0x80) {
            fixed[o++] = (char)b[i];
        } else {
            memcpy(fixed + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
    }
    t = fixed ? json_stringn(fixed, o) : NULL;
    xfree(fixed);
    return t;
}

/* {"token", "logprob", "bytes"} of one token. */
static json_t *token_lp_json(const struct tokenizer *tok, int32_t id, float logprob)
{
    size_t len = 0;
    const uint8_t *b = token_bytes(tok, id, &len);
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < len; i++)
        if (json_array_append_new(bytes, json_integer(b[i]))) {
            json_decref(bytes);
            bytes = NULL;
        }
    json_t *t = token_text(b, len);
    json_t *v = t && bytes ? json_pack("{s:o,s:f,s:o}", "token", t, "logprob", (double)logprob, "bytes", bytes)
                           : NULL;
    if (!v) {
        json_decref(t);
        json_decref(bytes);
    }
    return v;
}

/* Code points that start in b[0..len) (bytes that are not UTF-8 continuation bytes). */
static int64_t code_points(const uint8_t *b, size_t len)
{
    int64_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += (b[i] & 0xc0) != 0x80;
    return n;
}

/* One entry of the legacy top_logprobs: {token text: logprob} of the alternatives (the first,
 * most likely, of two that read the same is kept), or null when none were asked for. */
static json_t *legacy_alternatives(const struct oai_token_logprob *v, const struct tokenizer *tok)
{
    if (v->n_top == 0 || isnan(v->logprob))
        return json_null();
    json_t *alt = json_object();
    for (int k = 0; alt && k < v->n_top; k++) {
        size_t len = 0;
        const uint8_t *b = token_bytes(tok, v->top_id[k], &len);
        json_t *key = token_text(b, len);
        if (!key || (!json_object_get(alt, json_string_value(key)) &&
                     json_object_set_new(alt, json_string_value(key), json_real(v->top_lp[k])))) {
            json_decref(alt);
            alt = NULL;
        }
        json_decref(key);
    }
    return alt;
}

/* The /v1/completions form: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, the
 * offsets in code points of the generated text, continuing from *offset (advanced). */
static json_t *legacy_logprobs(const struct oai_token_logprob *v, int n, const struct tokenizer *tok,
                               int64_t *offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    bool ok = tokens && lps && tops && offs;
    for (int i = 0; ok && i < n; i++) {
        size_t len = 0;
        const uint8_t *b = token_bytes(tok, v[i].id, &len);
        json_t *t = token_text(b, len), *alt = legacy_alternatives(&v[i], tok);
        if (!t || !alt) {
            json_decref(t);
            json_decref(alt);
            ok = false;
            break;
        }
        /* the append calls take their argument's reference, also when they fail */
        ok = !json_array_append_new(tokens, t);
        if (!ok) {
            json_decref(alt);
            break;
        }
        json_t *lp = isnan(v[i].logprob) ? json_null() : json_real(v[i].logprob);
        ok = !json_array_append_new(tops, alt) && !json_array_append_new(lps, lp) &&
             !json_array_append_new(offs, json_integer(*offset));
        *offset += code_points(b, len);
    }
    json_t *r = ok ? json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps,
                               "top_logprobs", tops, "text_offset", offs)
                   : NULL;
    if (!r) {
        json_decref(tokens), json_decref(lps), json_decref(tops), json_decref(offs);
    }
    return r;
}

/* The chat form: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}. */
static json_t *chat_logprobs(const struct oai_token_logprob *v, int n, const struct tokenizer *tok)
{
    json_t *content = json_array();
    bool ok = content != NULL;
    for (int i = 0; ok && i < n; i++) {
        json_t *one = token_lp_json(tok, v[i].id, v[i].logprob), *tops = json_array();
        for (int k = 0; one && tops && k < v[i].n_top; k++) {
            json_t *alt = token_lp_json(tok, v[i].top_id[k], v[i].top_lp[k]);
            if (!alt || json_array_append_new(tops, alt)) {
                json_decref(tops);
                tops = NULL;
            }
        }
        if (!one || !tops) {
            json_decref(one);
            json_decref(tops);
            ok = false;
            break;
        }
        /* both calls take their argument's reference, also when they fail */
        ok = !json_object_set_new(one, "top_logprobs", tops) ? !json_array_append_new(content, one)
                                                              : (json_decref(one), false);
    }
    json_t *r = ok ? json_pack("{s:o}", "content", content) : NULL;
    if (!r)
        json_decref(content);
    return r;
}

bool oai_attach_logprobs(char **json, enum oai_kind kind, const struct oai_token_logprob *v, int n,
                         const struct tokenizer *tok, int64_t *text_offset)
{
    json_error_t jerr;
    json_t *root = *json ? json_loads(*json, 0, &jerr) : NULL;
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    int64_t off = text_offset ? *text_offset : 0;
    json_t *lp = !choice ? NULL
                 : kind == OAI_COMPLETION ? legacy_logprobs(v, n, tok, &off)
                                          : chat_logprobs(v, n, tok);
    char *out = NULL;
    if (lp && !json_object_set_new(choice, "logprobs", lp))
        out = oai_dump(json_incref(root));
    json_decref(root);
    if (!out)
        return false;
    xfree(*json);
    *json = out;
    if (text_offset)
        *text_offset = off;
    return true;
}
