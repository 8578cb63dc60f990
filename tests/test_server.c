/*
 * test_server.c — issue 8: the server's pure parts, without sockets.
 *
 * OpenAI request parsing (src/server/openai.c): a chat request renders the ChatML text the
 * format defines, sampling fields and stop strings land in the request, max_tokens is capped;
 * each malformed body, wrong type, out-of-range value, unknown model and n != 1 is refused
 * with the status, type, code and param OpenAI uses, and response, chunk and error JSON have
 * OpenAI's fields. Prompt cache (src/server/prompt_cache.c) on the Qwen3.5 fixture (KV and
 * DeltaNet state): the longest cached prefix is found, a non-prefix never is; a restored
 * prefix continued with the rest of the prompt and the greedy ids gives the transformers
 * decode logits, bit-identical to a session that processed the prefix itself; the budget evicts the
 * least recently used entry. Metrics: counters, cumulative histogram buckets in Prometheus text.
 * Tool calls (src/server/tool_calls.c): both Qwen forms parsed into name + JSON arguments, the
 * content before them kept, anything malformed or unterminated left as plain text; the
 * streaming hold-back; the tool_calls response and chunk shapes; tools / tool_choice parsing.
 * Logprobs: request fields, and the logprobs object attached to responses and chunks (token
 * text, exact bytes also for a token that is part of a UTF-8 character, alternatives).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/alloc.h"
#include "qwenrt.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/prompt_cache.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

#define LOGITS_REL_TOL 1e-4 /* against transformers, as in test_model_fixtures.c */

static const struct oai_limits LIM = {
    .model_id = "tiny", .max_tokens = 100, .top_k = 40, .fmt = CHAT_FORMAT_CHATML};

static bool parse(enum oai_kind k, const char *body, struct oai_request *r, struct oai_error *e)
{
    return oai_parse(k, body, strlen(body), &LIM, r, e);
}

static void test_chat_request(void **state)
{
    (void)state;
    struct oai_request r;
    struct oai_error e;
    const char *body = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],"
                       "\"temperature\":0.5,\"top_p\":0.9,\"seed\":7,\"max_tokens\":1000,"
                       "\"stop\":[\"a\",\"\",\"bc\"],\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"unknown_field\":1}";
    assert_true(parse(OAI_CHAT, body, &r, &e));
    /* ChatML: <|im_start|>role\ncontent<|im_end|>\n per message, then the assistant opening */
    assert_string_equal(r.prompt, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>"
                                  "\n<|im_start|>assistant\n");
    assert_true(r.sp.temperature == 0.5f && r.sp.top_p == 0.9f && r.sp.seed == 7);
    assert_int_equal(r.sp.top_k, 40);     /* the server's default */
    assert_int_equal(r.max_tokens, 100);  /* capped at the server's limit */
    assert_string_equal(r.stops[0], "a"); /* empty stop strings are dropped */
    assert_string_equal(r.stops[1], "bc");
    assert_null(r.stops[2]);
    assert_true(r.stream && r.include_usage);
    assert_non_null(r.chat_json);
    oai_request_free(&r);

    assert_true(
        parse(OAI_COMPLETION, "{\"prompt\":[\"Once\"],\"stop\":\"x\",\"top_k\":0}", &r, &e));
    assert_string_equal(r.prompt, "Once");
    assert_string_equal(r.stops[0], "x");
    assert_int_equal(r.sp.top_k, 0);
    assert_true(r.sp.temperature == 1.0f && !r.stream); /* OpenAI's defaults */
    assert_int_equal(r.max_tokens, 100);
    assert_null(r.chat_json);
    oai_request_free(&r);
}

static void expect_error(enum oai_kind k, const char *body, int status, const char *code,
                         const char *param)
{
    struct oai_request r;
    struct oai_error e;
    if (parse(k, body, &r, &e))
        fail_msg("accepted: %s", body);
    assert_int_equal(e.status, status);
    assert_string_equal(e.type, "invalid_request_error");
    if (code)
        assert_string_equal(e.code, code);
    else
        assert_null(e.code);
    if (param)
        assert_string_equal(e.param, param);
    else
        assert_null(e.param);
    assert_true(strlen(e.message) > 0);
    assert_null(r.prompt); /* nothing left allocated */
}

static void test_bad_requests(void **state)
{
    (void)state;
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[256];
    expect_error(OAI_CHAT, "{\"messages\":", 400, NULL, NULL);
    expect_error(OAI_CHAT, "[]", 400, NULL, NULL);
    expect_error(OAI_CHAT, "{}", 400, NULL, "messages");
    expect_error(OAI_CHAT, "{\"messages\":[]}", 400, NULL, "messages");
    expect_error(OAI_CHAT, "{\"messages\":[1]}", 400, NULL, "messages");
    expect_error(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, NULL,
                 "messages");
    static const struct {
        const char *field, *param;
    } bad[] = {{"\"max_tokens\":\"8\"", "max_tokens"},
               {"\"max_tokens\":0", "max_tokens"},
               {"\"temperature\":2.5", "temperature"},
               {"\"temperature\":\"hot\"", "temperature"},
               {"\"top_p\":0", "top_p"},
               {"\"top_p\":1.5", "top_p"},
               {"\"seed\":1.5", "seed"},
               {"\"n\":17", "n"},
               {"\"n\":0", "n"},
               {"\"stream\":1", "stream"},
               {"\"stop\":7", "stop"},
               {"\"stop\":[\"a\",1]", "stop"},
               {"\"model\":3", "model"},
               {"\"stream_options\":true", "stream_options"},
               {"\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]", "stop"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(b, sizeof(b), "{%s,%s}", msg, bad[i].field);
        expect_error(OAI_CHAT, b, 400, NULL, bad[i].param);
    }
    snprintf(b, sizeof(b), "{%s,\"model\":\"gpt-4o\"}", msg);
    expect_error(OAI_CHAT, b, 404, "model_not_found", "model");
    expect_error(OAI_COMPLETION, "{\"prompt\":5}", 400, NULL, "prompt");
    expect_error(OAI_COMPLETION, "{\"prompt\":[1,2]}", 400, NULL, "prompt");
    expect_error(OAI_COMPLETION, "{\"messages\":[]}", 400, NULL, "prompt");
}

static json_t *load(char *s)
{
    assert_non_null(s);
    json_t *j = json_loads(s, 0, NULL);
    xfree(s);
    assert_non_null(j);
    return j;
}

/* "n": the request keeps it; the choices' whole responses merge into one (index 0..n-1, the
 * prompt counted once, completion tokens summed); a part that is not a response is refused. */
static void test_n_choices(void **state)
{
    (void)state;
    struct oai_limits lim = {.model_id = "tiny", .max_tokens = 64, .top_k = 40};
    struct oai_request r;
    struct oai_error e;
    const char *body = "{\"prompt\":\"x\",\"n\":3,\"max_tokens\":4}";
    assert_true(oai_parse(OAI_COMPLETION, body, strlen(body), &lim, &r, &e));
    assert_int_equal(r.n, 3);
    oai_request_free(&r);
    body = "{\"prompt\":\"x\"}";
    assert_true(oai_parse(OAI_COMPLETION, body, strlen(body), &lim, &r, &e));
    assert_int_equal(r.n, 1);
    assert_int_equal(r.n_prompts, 1);
    oai_request_free(&r);
    /* completions: an array of prompts (lm-evaluation-harness batches them) */
    body = "{\"prompt\":[\"a\",\"b c\",\"d\"],\"n\":2}";
    assert_true(oai_parse(OAI_COMPLETION, body, strlen(body), &lim, &r, &e));
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompt, "a");
    assert_string_equal(r.more_prompts[0], "b c");
    assert_string_equal(r.more_prompts[1], "d");
    oai_request_free(&r);
    static const struct {
        const char *body, *param;
    } bad_prompts[] = {{"{\"prompt\":[]}", "prompt"},
                       {"{\"prompt\":[\"a\",2]}", "prompt"},
                       {"{\"prompt\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", "prompt"},
                       {"{\"prompt\":[\"1\",\"2\",\"3\",\"4\",\"5\"],\"n\":16}", "n"}};
    for (size_t i = 0; i < sizeof(bad_prompts) / sizeof(bad_prompts[0]); i++) {
        assert_false(oai_parse(OAI_COMPLETION, bad_prompts[i].body, strlen(bad_prompts[i].body), &lim, &r, &e));
        assert_string_equal(e.param, bad_prompts[i].param);
        assert_null(r.prompt);
    }

    struct oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-2", .created = 5, .model = "tiny"};
    struct oai_usage u[3] = {{.prompt = 10, .cached = 4, .completion = 3},
                             {.prompt = 10, .cached = 0, .completion = 5},
                             {.prompt = 10, .cached = 10, .completion = 1}};
    const char *texts[3] = {"red", "green", "b"}, *fin[3] = {"length", "stop", "stop"};
    char *parts[3];
    for (int i = 0; i < 3; i++)
        parts[i] = oai_response_json(&m, texts[i], strlen(texts[i]), fin[i], &u[i]);
    json_t *j = load(oai_merge_choices(parts, 3, 10)), *ch = json_object_get(j, "choices");
    assert_int_equal(json_array_size(ch), 3);
    for (int i = 0; i < 3; i++) {
        json_t *c = json_array_get(ch, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(c, "index")), i);
        assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")),
                            texts[i]);
        assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), fin[i]);
    }
    json_t *us = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "prompt_tokens")), 10);
    assert_int_equal(json_integer_value(json_object_get(us, "completion_tokens")), 9);
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 19);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-2");
    json_decref(j);
    m.index = 2; /* a stream chunk of choice 2 */
    j = load(oai_chunk_json(&m, "x", 1, false, NULL, NULL));
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "index")), 2);
    json_decref(j);
    char *bad[2] = {parts[0], "{\"choices\":[]}"};
    /* "logit_bias": token ids (strings) below the vocabulary to numbers in [-100, 100] */
    lim.n_vocab = 100;
    body = "{\"prompt\":\"x\",\"logit_bias\":{\"15\":100,\"99\":-100.0,\"0\":0.5}}";
    assert_true(oai_parse(OAI_COMPLETION, body, strlen(body), &lim, &r, &e));
    assert_int_equal(r.sp.n_logit_bias, 3);
    assert_ptr_equal(r.sp.logit_bias, r.bias);
    int seen = 0;
    for (int i = 0; i < 3; i++)
        seen |= (r.bias[i].id == 15 && r.bias[i].bias == 100.0f) << 0 |
                (r.bias[i].id == 99 && r.bias[i].bias == -100.0f) << 1 | (r.bias[i].id == 0 && r.bias[i].bias == 0.5f) << 2;
    assert_int_equal(seen, 7);
    oai_request_free(&r);
    static const char *const bad_bias[] = {"[1]", "{\"x\":1}", "{\"15\":101}", "{\"-1\":5}", "{\"100\":5}",
                                           "{\"15\":\"a\"}", "{\"\":1}", "{\"1e1\":1}", "7"};
    for (size_t i = 0; i < sizeof(bad_bias) / sizeof(bad_bias[0]); i++) {
        char b2[160];
        snprintf(b2, sizeof(b2), "{\"prompt\":\"x\",\"logit_bias\":%s}", bad_bias[i]);
        assert_false(oai_parse(OAI_COMPLETION, b2, strlen(b2), &lim, &r, &e));
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "logit_bias");
        assert_null(r.bias); /* nothing left allocated */
    }
    assert_null(oai_merge_choices(bad, 2, 10));
    bad[1] = "not json";
    assert_null(oai_merge_choices(bad, 2, 10));
    for (int i = 0; i < 3; i++)
        xfree(parts[i]);
}

static void test_response_shapes(void **state)
{
    (void)state;
    struct oai_error e;
    oai_fail(&e, 429, "rate_limit_exceeded", "queue_full", NULL, "busy %d", 1);
    json_t *j = load(oai_error_json(&e)), *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "busy 1");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "rate_limit_exceeded");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "queue_full");
    assert_true(json_is_null(json_object_get(err, "param")));
    json_decref(j);

    struct oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-1", .created = 5, .model = "tiny"};
    struct oai_usage u = {.prompt = 10, .cached = 4, .completion = 3};
    j = load(oai_response_json(&m, "h\xc3\xa9", 3, "length", &u));
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c, "message"), "content")), "h\xc3\xa9");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_t *us = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 13);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(us, "prompt_tokens_details"), "cached_tokens")),
                     4);
    json_decref(j);

    j = load(oai_chunk_json(&m, "", 0, true, NULL, NULL));
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "delta"), "role")),
                        "assistant");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(j);
    j = load(oai_chunk_json(&m, NULL, 0, false, NULL, &u)); /* include_usage: empty choices */
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 3);
    json_decref(j);
    m.kind = OAI_COMPLETION;
    j = load(oai_chunk_json(&m, "\xff", 1, false, "stop", NULL)); /* invalid UTF-8 never leaks */
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "\xef\xbf\xbd");
    json_decref(j);
}

/* ------------------------------------------------------------------ prompt cache */


static struct qwenrt_session *new_session(struct qwenrt_model *m)
{
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 256;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    return s;
}

/* From a session holding prompt[0..cut): the rest of the prompt, then the greedy ids; out
 * receives [G][V] logits. */
static void continue_run(const struct ref_fixture *f, struct qwenrt_session *s, int32_t cut, float *out)
{
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_n_past(s), cut);
    if (cut < f->T && qwenrt_session_prefill(s, f->prompt + cut, f->T - cut, NULL, &err))
        fail_msg("prefill: %s", err.message);
    for (int32_t g = 0; g < f->G; g++) {
        if (g > 0 && qwenrt_session_decode(s, f->gen[g - 1], &err))
            fail_msg("decode: %s", err.message);
        memcpy(out + (size_t)g * f->V, qwenrt_session_logits(s), (size_t)f->V * sizeof(float));
    }
}

static void test_prompt_cache_qwen35(void **state)
{
    (void)state;
    struct ref_fixture f = {0};
    struct qwenrt_error err = {0};
    ref_fixture_open(&f, "tests/data/qwen35-tiny-f32", 1);
    assert_true(f.T >= 4);

    /* the reference: one fresh session */
    float *fresh = xmalloc((size_t)f.G * f.V, sizeof(float));
    float *got = xmalloc((size_t)f.G * f.V, sizeof(float));
    struct qwenrt_session *s = new_session(f.m);
    continue_run(&f, s, 0, fresh);
    assert_true(rel_err(fresh, f.dlog, (size_t)f.G * f.V) < LOGITS_REL_TOL);

    /* cache two prefixes of the prompt, and one sequence that is not a prefix */
    struct pcache c;
    pcache_init(&c, 64u << 20);
    int32_t cut1 = f.T / 2, cut2 = f.T - 1, other[3] = {f.prompt[0], f.prompt[1] + 1, 5};
    int32_t cuts[2] = {cut1, cut2};
    for (int k = 0; k < 2; k++) {
        qwenrt_session_reset(s);
        assert_int_equal(qwenrt_session_prefill(s, f.prompt, cuts[k], NULL, &err), QWENRT_OK);
        assert_int_equal(pcache_insert(&c, s, f.prompt, cuts[k], &err), QWENRT_OK);
    }
    qwenrt_session_reset(s);
    assert_int_equal(qwenrt_session_prefill(s, other, 3, NULL, &err), QWENRT_OK);
    assert_int_equal(pcache_insert(&c, s, other, 3, &err), QWENRT_OK);
    assert_int_equal(pcache_insert(&c, s, other, 3, &err), QWENRT_OK); /* no duplicate */
    assert_int_equal(c.n_entries, 3);

    const struct pcache_entry *e = pcache_lookup(&c, f.prompt, f.T);
    assert_non_null(e);
    assert_int_equal(e->n, cut2); /* the longest prefix */
    assert_int_equal(pcache_lookup(&c, f.prompt, cut1 + 1)->n, cut1);
    assert_null(pcache_lookup(&c, f.prompt, cut1 - 1)); /* entries longer than the prompt */
    int32_t miss[2] = {f.prompt[0] + 1, f.prompt[1]};
    assert_null(pcache_lookup(&c, miss, 2));

    /* restored into another session: the logits of a session that processed the same pieces
     * (prefix, then the rest) itself, bit for bit */
    qwenrt_session_reset(s);
    assert_int_equal(qwenrt_session_prefill(s, f.prompt, cut2, NULL, &err), QWENRT_OK);
    continue_run(&f, s, cut2, fresh);
    struct qwenrt_session *s2 = new_session(f.m);
    assert_int_equal(qwenrt_session_restore(s2, e->cp, &err), QWENRT_OK);
    continue_run(&f, s2, cut2, got);
    assert_memory_equal(got, fresh, (size_t)f.G * f.V * sizeof(float));
    assert_true(rel_err(got, f.dlog, (size_t)f.G * f.V) < LOGITS_REL_TOL);

    /* a budget for two entries: inserting a third evicts the least recently used */
    size_t one = c.e[0].bytes;
    struct pcache small;
    pcache_init(&small, 2 * one + one / 2);
    for (int k = 0; k < 2; k++) {
        qwenrt_session_reset(s);
        assert_int_equal(qwenrt_session_prefill(s, f.prompt, cut1 + k, NULL, &err), QWENRT_OK);
        assert_int_equal(pcache_insert(&small, s, f.prompt, cut1 + k, &err), QWENRT_OK);
    }
    assert_int_equal(pcache_lookup(&small, f.prompt, cut1)->n, cut1); /* cut1 used last */
    qwenrt_session_reset(s);
    assert_int_equal(qwenrt_session_prefill(s, other, 3, NULL, &err), QWENRT_OK);
    assert_int_equal(pcache_insert(&small, s, other, 3, &err), QWENRT_OK);
    assert_int_equal(small.n_entries, 2);
    assert_true(small.bytes <= small.max_bytes);
    assert_int_equal(pcache_lookup(&small, f.prompt, f.T)->n, cut1); /* cut1 + 1 was evicted */
    pcache_free(&small);
    pcache_free(&c);

    xfree(fresh);
    xfree(got);
    qwenrt_session_free(s);
    qwenrt_session_free(s2);
    ref_fixture_close(&f);
}

static void test_metrics_text(void **state)
{
    (void)state;
    struct metrics m;
    metrics_init(&m);
    metrics_count_request(&m, "chat", 200);
    metrics_count_request(&m, "chat", 200);
    metrics_count_request(&m, "chat", 429);
    metrics_observe(&m, &m.ttft_s, 0.003);
    metrics_observe(&m, &m.ttft_s, 0.2);
    metrics_observe(&m, &m.ttft_s, 100.0);
    size_t len = 0;
    char *t = metrics_render(&m, &len);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    assert_non_null(strstr(t, "qwenrt_requests_total{endpoint=\"chat\",code=\"200\"} 2\n"));
    assert_non_null(strstr(t, "qwenrt_requests_total{endpoint=\"chat\",code=\"429\"} 1\n"));
    assert_non_null(strstr(t, "# TYPE qwenrt_time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(t, "qwenrt_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
    assert_non_null(strstr(t, "qwenrt_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"));
    assert_non_null(strstr(t, "qwenrt_time_to_first_token_seconds_bucket{le=\"60\"} 2\n"));
    assert_non_null(strstr(t, "qwenrt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "qwenrt_time_to_first_token_seconds_count 3\n"));
    xfree(t);
    metrics_free(&m);
}

static void parse_one(const char *text, const char *name, const char *args, size_t content_len)
{
    struct tool_calls tc;
    if (!tool_calls_parse(text, strlen(text), &tc))
        fail_msg("no tool call found in: %s", text);
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].name, name);
    assert_string_equal(tc.v[0].arguments, args);
    assert_int_equal(tc.content_len, content_len);
    tool_calls_free(&tc);
}

static void test_tool_calls_parse(void **state)
{
    (void)state;
    /* Qwen3: JSON inside the tags, content before */
    parse_one("Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
              "get_weather", "{\"city\":\"Paris\",\"days\":3}", 13);
    /* arguments given as a JSON string; no arguments at all */
    parse_one("<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": [1, 2]}\"}</tool_call>", "f",
              "{\"a\":[1,2]}", 0);
    parse_one("<tool_call>{\"name\":\"now\"}</tool_call>\n", "now", "{}", 0);
    /* Qwen3.5: XML; numbers and objects stay JSON, other text becomes a string (multi-line) */
    parse_one("<think>\nok\n</think>\n\n<tool_call>\n<function=search>\n<parameter=query>\nfirst "
              "line\nsecond line\n</parameter>\n<parameter=limit>\n5\n</parameter>\n"
              "<parameter=opts>\n{\"exact\": true}\n</parameter>\n</function>\n</tool_call>",
              "search", "{\"query\":\"first line\\nsecond line\",\"limit\":5,\"opts\":{\"exact\":true}}",
              strlen("<think>\nok\n</think>"));
    parse_one("<tool_call>\n<function=ping>\n</function>\n</tool_call>", "ping", "{}", 0);
    /* two calls, both forms */
    struct tool_calls tc;
    const char *two = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n<function=b>\n<parameter=x>\ny\n</parameter>\n</function>\n"
                      "</tool_call>";
    assert_true(tool_calls_parse(two, strlen(two), &tc));
    assert_int_equal(tc.n, 2);
    assert_string_equal(tc.v[1].name, "b");
    assert_string_equal(tc.v[1].arguments, "{\"x\":\"y\"}");
    tool_calls_free(&tc);
    /* not tool calls: plain text, unterminated, malformed, text after, no name */
    const char *bad[] = {
        "just an answer",
        "<tool_call>\n{\"name\": \"a\", \"argum",
        "<tool_call>\n{\"name\": \"a\", }\n</tool_call>",
        "<tool_call>\n{\"name\": \"a\"}\n</tool_call> and more text",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>\n<function=a b>\n</function>\n</tool_call>", /* names: no spaces */
        "<tool_call>\n{\"name\": \"\"}\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (tool_calls_parse(bad[i], strlen(bad[i]), &tc))
            fail_msg("parsed a tool call out of: %s", bad[i]);
        assert_int_equal(tc.n, 0);
    }
    /* found by fuzz_tool_calls: a NUL inside a name made it "" (a call without a name) */
    static const char nul_name[] = "<tool_call>\n<function=\0\0search>\n</function>\n</tool_call>";
    assert_false(tool_calls_parse(nul_name, sizeof(nul_name) - 1, &tc));
    static const char nul_key[] = "<tool_call>\n<function=f>\n<parameter=\0k>\nv\n</parameter>\n"
                                  "</function>\n</tool_call>";
    assert_false(tool_calls_parse(nul_key, sizeof(nul_key) - 1, &tc));
    /* streaming hold-back: never send the tag or what may become it */
    assert_int_equal(tool_calls_safe_len("abc", 3), 3);
    assert_int_equal(tool_calls_safe_len("abc<", 4), 3);
    assert_int_equal(tool_calls_safe_len("abc<tool_ca", 11), 3);
    assert_int_equal(tool_calls_safe_len("abc<tool_call>{", 15), 3);
    assert_int_equal(tool_calls_safe_len("a<b", 3), 3);
    assert_int_equal(tool_calls_safe_len("", 0), 0);
    /* a stream in pieces: content goes out until the tag, the call comes at the end */
    const char *pieces[] = {"Sure", ".\n<to", "ol_call>\n{\"name\"", ": \"f\"}\n</tool_call>"};
    const char *want[] = {"Sure", ".\n", "", ""}; /* whitespace before a call is streamed as is */
    struct tool_stream ts = {0};
    for (int i = 0; i < 4; i++) {
        const char *out;
        size_t n;
        bool calls;
        assert_true(tool_stream_add(&ts, pieces[i], strlen(pieces[i]), i == 3, &out, &n, &tc, &calls));
        assert_int_equal(n, strlen(want[i]));
        if (n)
            assert_memory_equal(out, want[i], n);
        assert_true(calls == (i == 3));
    }
    assert_string_equal(tc.v[0].name, "f");
    tool_calls_free(&tc);
    tool_stream_free(&ts);
    /* "<tool" that never becomes a call: held back, then sent at the end */
    const char *p2[] = {"a <tool", "s are fine"};
    const char *w2[] = {"a ", "<tools are fine"};
    for (int i = 0; i < 2; i++) {
        const char *out;
        size_t n;
        bool calls;
        assert_true(tool_stream_add(&ts, p2[i], strlen(p2[i]), i == 1, &out, &n, &tc, &calls));
        assert_int_equal(n, strlen(w2[i]));
        assert_memory_equal(out, w2[i], n);
        assert_false(calls);
    }
    tool_stream_free(&ts);
}

static void test_tool_calls_json(void **state)
{
    (void)state;
    struct oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-9", .created = 5, .model = "tiny", .tools = true};
    struct oai_usage u = {.prompt = 10, .cached = 0, .completion = 20};
    const char *text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    json_t *j = load(oai_response_json(&m, text, strlen(text), "stop", &u));
    json_t *c = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Sure.");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    assert_true(strlen(json_string_value(json_object_get(call, "id"))) > 5);
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Oslo\"}");
    json_decref(j);
    /* only content when the request offered no tools, or the text holds no call */
    m.tools = false;
    j = load(oai_response_json(&m, text, strlen(text), "stop", &u));
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    assert_null(json_object_get(json_object_get(c, "message"), "tool_calls"));
    json_decref(j);
    m.tools = true;
    j = load(oai_response_json(&m, "no call", 7, "length", &u));
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "no call");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_decref(j);
    /* content null when the answer is only calls; the stream chunk has indexes */
    const char *only = "<tool_call>{\"name\":\"x\"}</tool_call>";
    j = load(oai_response_json(&m, only, strlen(only), "stop", &u));
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_true(json_is_null(json_object_get(json_object_get(c, "message"), "content")));
    json_decref(j);
    struct tool_calls tc;
    assert_true(tool_calls_parse(only, strlen(only), &tc));
    j = load(oai_chunk_tool_calls_json(&m, &tc));
    tool_calls_free(&tc);
    c = json_array_get(json_object_get(j, "choices"), 0);
    call = json_array_get(json_object_get(json_object_get(c, "delta"), "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(call, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "x");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(j);
    /* request side: tools on, tool_choice "none" off, a wrong type refused */
    struct oai_request r;
    struct oai_error e;
    const char *tools = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
                        "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]%s}";
    char body[512];
    snprintf(body, sizeof(body), tools, "");
    assert_true(parse(OAI_CHAT, body, &r, &e));
    assert_true(r.tools);
    oai_request_free(&r);
    snprintf(body, sizeof(body), tools, ",\"tool_choice\":\"none\"");
    assert_true(parse(OAI_CHAT, body, &r, &e));
    assert_false(r.tools);
    oai_request_free(&r);
    snprintf(body, sizeof(body), tools, ",\"tool_choice\":5");
    assert_false(parse(OAI_CHAT, body, &r, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tool_choice");
}

/* The completions form of v (see test_logprobs): parallel arrays, alternatives as an object
 * (null without any), offsets in code points continuing across two chunks. */
static void check_legacy_logprobs(const struct tokenizer *tok, const struct oai_token_logprob *v)
{
    struct oai_meta m = {.kind = OAI_COMPLETION, .id = "cmpl-3", .created = 5, .model = "tiny"};
    int64_t off = 0;
    char *js = oai_chunk_json(&m, "Hello", 5, false, NULL, NULL);
    assert_true(oai_attach_logprobs(&js, OAI_COMPLETION, v, 2, tok, &off));
    assert_int_equal(off, 6); /* "Hello" 5 + the lead byte 0xE4 */
    json_t *j = load(js);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs"), *offs = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(toks), 2);
    assert_string_equal(json_string_value(json_array_get(toks, 0)), "Hello");
    assert_string_equal(json_string_value(json_array_get(toks, 1)), "\xef\xbf\xbd");
    assert_true(json_real_value(json_array_get(lps, 1)) == -1.5);
    json_t *alt0 = json_array_get(tops, 0);
    assert_int_equal(json_object_size(alt0), 2);
    assert_true(json_real_value(json_object_get(alt0, "Hello")) == -0.25);
    assert_true(json_real_value(json_object_get(alt0, "\xef\xbf\xbd")) == -3.5);
    assert_true(json_is_null(json_array_get(tops, 1)));
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), 5);
    json_decref(j);
    /* the next chunk's offsets continue */
    js = oai_chunk_json(&m, "Hello", 5, false, NULL, NULL);
    assert_true(oai_attach_logprobs(&js, OAI_COMPLETION, v, 1, tok, &off));
    j = load(js);
    offs = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
                           "text_offset");
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), 6);
    assert_int_equal(off, 11);
    json_decref(j);
    /* an echoed prompt's first token: no context, null logprob and alternatives */
    struct oai_token_logprob first = {.id = v[0].id, .logprob = NAN, .n_top = 0};
    js = oai_chunk_json(&m, "Hello", 5, false, NULL, NULL);
    assert_true(oai_attach_logprobs(&js, OAI_COMPLETION, &first, 1, tok, NULL));
    j = load(js);
    lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_true(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
    assert_true(json_is_null(json_array_get(json_object_get(lp, "top_logprobs"), 0)));
    assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), 0)), "Hello");
    json_decref(j);
}

static void test_logprobs(void **state)
{
    (void)state;
    struct oai_request r;
    struct oai_error e;
    assert_true(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                "\"logprobs\":true,\"top_logprobs\":3}", &r, &e));
    assert_int_equal(r.logprobs, 4);
    oai_request_free(&r);
    const char *bad[][2] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":1}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(OAI_CHAT, bad[i][0], 400, NULL, bad[i][1]);
    /* completions: logprobs is the number of alternatives; echo, and then max_tokens 0 */
    assert_true(parse(OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":2,\"echo\":false}", &r, &e));
    assert_int_equal(r.logprobs, 3);
    assert_false(r.echo);
    oai_request_free(&r);
    assert_true(parse(OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":1,\"echo\":true,\"max_tokens\":0}", &r, &e));
    assert_true(r.echo);
    assert_int_equal(r.max_tokens, 0);
    oai_request_free(&r);
    assert_true(parse(OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":0}", &r, &e));
    assert_int_equal(r.logprobs, 1);
    oai_request_free(&r);
    assert_true(parse(OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":null}", &r, &e));
    assert_int_equal(r.logprobs, 0);
    oai_request_free(&r);
    const char *bad_cmp[][2] = {
        {"{\"prompt\":\"a\",\"logprobs\":21}", "logprobs"},
        {"{\"prompt\":\"a\",\"logprobs\":true}", "logprobs"},
        {"{\"prompt\":\"a\",\"logprobs\":1,\"top_logprobs\":1}", "top_logprobs"},
        {"{\"prompt\":\"a\",\"echo\":1}", "echo"},
        {"{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens"},
    };
    for (size_t i = 0; i < sizeof(bad_cmp) / sizeof(bad_cmp[0]); i++)
        expect_error(OAI_COMPLETION, bad_cmp[i][0], 400, NULL, bad_cmp[i][1]);

    struct tokenizer *tok = load_qwen3_or_fail();
    assert_non_null(tok);
    int32_t hello = tokenizer_token_id(tok, "Hello", 5);
    int32_t byte_e4 = tokenizer_token_id(tok, "\xc3\xa4", 2); /* the byte 0xE4 alone */
    assert_true(hello >= 0 && byte_e4 >= 0);
    struct oai_token_logprob v[2] = {{.id = hello, .logprob = -0.25f, .n_top = 2,
                                      .top_id = {hello, byte_e4}, .top_lp = {-0.25f, -3.5f}},
                                     {.id = byte_e4, .logprob = -1.5f}};
    struct oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-3", .created = 5, .model = "tiny"};
    char *js = oai_chunk_json(&m, "Hello", 5, false, NULL, NULL);
    assert_true(oai_attach_logprobs(&js, OAI_CHAT, v, 2, tok, NULL));
    json_t *j = load(js);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                      "logprobs"), "content");
    assert_int_equal(json_array_size(content), 2);
    json_t *t0 = json_array_get(content, 0), *t1 = json_array_get(content, 1);
    assert_string_equal(json_string_value(json_object_get(t0, "token")), "Hello");
    assert_true(json_real_value(json_object_get(t0, "logprob")) == -0.25);
    assert_int_equal(json_array_size(json_object_get(t0, "bytes")), 5);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t0, "bytes"), 0)), 'H');
    json_t *alts = json_object_get(t0, "top_logprobs");
    assert_int_equal(json_array_size(alts), 2);
    assert_true(json_real_value(json_object_get(json_array_get(alts, 1), "logprob")) == -3.5);
    /* part of a UTF-8 character: replacement in the text, the exact byte in bytes */
    assert_string_equal(json_string_value(json_object_get(t1, "token")), "\xef\xbf\xbd");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 0)), 0xe4);
    assert_int_equal(json_array_size(json_object_get(t1, "top_logprobs")), 0);
    json_decref(j);
    /* a whole response too */
    struct oai_usage u = {.prompt = 1, .cached = 0, .completion = 1};
    js = oai_response_json(&m, "Hello", 5, "stop", &u);
    assert_true(oai_attach_logprobs(&js, OAI_CHAT, v, 1, tok, NULL));
    j = load(js);
    content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
                              "content");
    assert_int_equal(json_array_size(content), 1);
    json_decref(j);
    check_legacy_logprobs(tok, v);
    tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_request),    cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_response_shapes), cmocka_unit_test(test_prompt_cache_qwen35),
        cmocka_unit_test(test_metrics_text),    cmocka_unit_test(test_tool_calls_parse),
        cmocka_unit_test(test_tool_calls_json),  cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_n_choices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
