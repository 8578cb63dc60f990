/*
 * fuzz_tool_calls.c — libFuzzer target for reading tool calls out of generated text
 * (src/server/tool_calls.c): any bytes as a model's answer. Checks: a parse either fails
 * leaving nothing, or gives 1..TOOL_CALLS_MAX calls with a name and arguments that are a JSON
 * object, and content before them; the streaming splitter fed the text in three pieces sends
 * exactly the content (the whole text when there is no call) and finds the same calls.
 * Seeds: tests/fuzz/corpus/fuzz_tool_calls/ (both Qwen forms, broken ones).
 */
#include <jansson.h>

#include "fuzz_util.h"

#include "base/alloc.h"
#include "server/tool_calls.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    struct tool_calls tc;
    bool ok = tool_calls_parse(text, size, &tc);
    fuzz_check(ok ? (tc.n >= 1 && tc.n <= TOOL_CALLS_MAX && tc.content_len <= size) : tc.n == 0);
    for (int i = 0; ok && i < tc.n; i++) {
        fuzz_check(tc.v[i].name && tc.v[i].name[0] && tc.v[i].arguments);
        json_error_t jerr;
        json_t *a = json_loads(tc.v[i].arguments, JSON_ALLOW_NUL, &jerr); /* escaped NULs are JSON */
        fuzz_check(json_is_object(a));
        json_decref(a);
    }
    fuzz_check(tool_calls_safe_len(text, size) <= size);
    /* the stream splitter: three pieces, the content it sends is a prefix of the text */
    struct tool_stream ts = {0};
    size_t cut1 = size / 3, cut2 = 2 * size / 3, sent = 0;
    size_t cuts[4] = {0, cut1, cut2, size};
    bool calls = false;
    struct tool_calls sc;
    for (int k = 0; k < 3; k++) {
        const char *out;
        size_t n;
        bool c;
        if (!tool_stream_add(&ts, text + cuts[k], cuts[k + 1] - cuts[k], k == 2, &out, &n, &sc, &c))
            break;
        fuzz_check(n == 0 || memcmp(out, text + sent, n) == 0);
        sent += n;
        calls = c;
    }
    fuzz_check(calls == ok);
    /* no calls: all of the text; calls: at least the content, never past the first tag */
    fuzz_check(ok ? sent >= tc.content_len && sent <= size : sent == size);
    if (calls) {
        fuzz_check(sc.n == tc.n);
        tool_calls_free(&sc);
    }
    tool_stream_free(&ts);
    if (ok)
        tool_calls_free(&tc);
    return 0;
}
