/*
 * test_chat_template.c — chat rendering against references:
 *  - qwen3-chat-template-cases.jsonl: transformers' apply_chat_template with Qwen3's template
 *    (rendered text, and the ids of that text from Hugging Face `tokenizers`);
 *  - qwen3-chat-template-tool-cases.jsonl, qwen35-chat-template-cases.jsonl: the Qwen3 and
 *    Qwen3.5 templates rendered by Jinja2 as transformers configures it
 *    (tests/make_chat_template_cases.py): tools, tool calls and responses, reasoning, trimming,
 *    and the Qwen3.5 template's errors;
 *  - template detection, and the plain ChatML fallback.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

static int render_case(enum chat_format fmt, json_t *c, const struct tokenizer *tok, size_t i)
{
    char *req = json_dumps(c, JSON_COMPACT);
    char *out = NULL;
    size_t len = 0;
    struct qwenrt_error err = {0};
    qwenrt_status st = chat_render_json(fmt, req, &out, &len, &err);
    free(req);
    json_t *want = json_object_get(c, "rendered");
    const char *want_err = json_string_value(json_object_get(c, "error"));
    int bad = 0;
    if (want_err) {
        if (st != QWENRT_ERR_INVALID_ARG || !strstr(err.message, want_err)) {
            fprintf(stderr, "case %zu: want error '%s', got %d '%s'\n", i, want_err, st,
                    err.message);
            bad = 1;
        }
    } else if (st != QWENRT_OK) {
        fprintf(stderr, "case %zu: %s\n", i, err.message);
        bad = 1;
    } else if (len != json_string_length(want) || memcmp(out, json_string_value(want), len)) {
        size_t k = 0;
        while (k < len && out[k] == json_string_value(want)[k])
            k++;
        fprintf(stderr, "case %zu: differs at %zu:\n got: %.80s\nwant: %.80s\n", i, k, out + k,
                json_string_value(want) + k);
        bad = 1;
    } else if (tok && json_object_get(c, "ids")) {
        int32_t *ids;
        size_t n;
        assert_int_equal(tokenizer_encode(tok, out, len, &ids, &n, NULL), QWENRT_OK);
        bad = !ids_equal("chat ids", ids, n, json_object_get(c, "ids"));
        xfree(ids);
    }
    xfree(out);
    return bad;
}

static int run_file(const char *path, enum chat_format fmt, const struct tokenizer *tok,
                    size_t min_cases)
{
    json_t *cases = read_jsonl(path);
    assert_non_null(cases);
    assert_true(json_array_size(cases) >= min_cases);
    int bad = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) bad += render_case(fmt, c, tok, i);
    json_decref(cases);
    return bad;
}

static void test_qwen3_transformers_cases(void **state)
{
    (void)state;
    struct tokenizer *tok = load_qwen3_or_fail();
    assert_non_null(tok);
    /* the renderer is chosen from the model's own template */
    const char *warning = "x";
    assert_int_equal(chat_format_detect(tokenizer_chat_template(tok), &warning), CHAT_FORMAT_QWEN3);
    assert_null(warning);
    assert_int_equal(run_file("tests/data/tokenizer/qwen3-chat-template-cases.jsonl",
                              CHAT_FORMAT_QWEN3, tok, 16),
                     0);
    tokenizer_free(tok);
}

static void test_qwen3_tool_cases(void **state)
{
    (void)state;
    assert_int_equal(run_file("tests/data/tokenizer/qwen3-chat-template-tool-cases.jsonl",
                              CHAT_FORMAT_QWEN3, NULL, 40),
                     0);
}

static void test_qwen35_cases(void **state)
{
    (void)state;
    assert_int_equal(run_file("tests/data/tokenizer/qwen35-chat-template-cases.jsonl",
                              CHAT_FORMAT_QWEN35, NULL, 40),
                     0);
}

static void test_detect(void **state)
{
    (void)state;
    const char *w = NULL;
    /* the distinctive parts of Qwen3.5's template */
    assert_int_equal(chat_format_detect("{{- '<|im_start|>system\\n' }} '<tool_call>\\n"
                                        "<function=' + tool_call.name + '<parameter=' + k",
                                        &w),
                     CHAT_FORMAT_QWEN35);
    assert_null(w);
    /* Qwen2.5-style ChatML with tools but none of Qwen3's reasoning handling */
    assert_int_equal(chat_format_detect("{%- for message in messages %}<|im_start|>{{ "
                                        "message.role }}<tool_call>{% endfor %}",
                                        &w),
                     CHAT_FORMAT_CHATML);
    assert_non_null(strstr(w, "neither Qwen3's nor Qwen3.5's"));
    assert_int_equal(chat_format_detect("{{ bos_token }}[INST] {{ m }} [/INST]", &w),
                     CHAT_FORMAT_CHATML);
    assert_non_null(strstr(w, "not ChatML-like"));
    assert_int_equal(chat_format_detect(NULL, &w), CHAT_FORMAT_CHATML);
    assert_non_null(strstr(w, "no chat template"));
    assert_string_equal(chat_format_name(CHAT_FORMAT_QWEN35), "qwen35");
}

static void test_struct_api_and_chatml(void **state)
{
    (void)state;
    /* Qwen3 passes string arguments through unchanged (OpenAI's form) */
    const struct chat_tool_call tc = {"f", "\"{\\\"x\\\": 1}\""};
    const struct chat_message msgs[] = {
        {"system", "S", NULL, NULL, 0},
        {"user", "U", NULL, NULL, 0},
        {"assistant", NULL, NULL, &tc, 1},
    };
    struct chat_params p = {msgs, 3, NULL, 0, true, true};
    char *out;
    size_t len;
    assert_int_equal(chat_render(CHAT_FORMAT_QWEN3, &p, &out, &len, NULL), QWENRT_OK);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
                             "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
                             "<|im_end|>\n<|im_start|>assistant\n");
    xfree(out);
    assert_int_equal(chat_render(CHAT_FORMAT_CHATML, &p, &out, &len, NULL), QWENRT_OK);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                             "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(len, strlen(out));
    xfree(out);
    /* bad JSON in arguments or tools is an error, not a crash */
    const struct chat_tool_call bad = {"f", "{not json"};
    const struct chat_message m2[] = {{"user", "U", NULL, NULL, 0},
                                      {"assistant", "", NULL, &bad, 1}};
    struct chat_params p2 = {m2, 2, NULL, 0, false, true};
    struct qwenrt_error err = {0};
    assert_int_equal(chat_render(CHAT_FORMAT_QWEN35, &p2, &out, &len, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "not JSON"));
    assert_int_equal(chat_render_json(CHAT_FORMAT_QWEN3, "{\"messages\": 3}", &out, &len, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_int_equal(chat_render_json(CHAT_FORMAT_QWEN3, "[", &out, &len, &err),
                     QWENRT_ERR_INVALID_ARG);
    /* content given as a list of text parts */
    assert_int_equal(
        chat_render_json(CHAT_FORMAT_QWEN35,
                         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\":"
                         " \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": "
                         "\"b\"}]}], \"enable_thinking\": false}",
                         &out, &len, &err),
        QWENRT_OK);
    assert_string_equal(out, "<|im_start|>user\nab<|im_end|>\n");
    xfree(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_transformers_cases),
        cmocka_unit_test(test_qwen3_tool_cases),
        cmocka_unit_test(test_qwen35_cases),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_struct_api_and_chatml),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
