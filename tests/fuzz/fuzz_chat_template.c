/*
 * fuzz_chat_template.c — libFuzzer target for chat rendering from a JSON request
 * (chat_render_json: messages, tools, tool calls, reasoning, flags) in each of the three
 * formats, and chat_format_detect on the same bytes taken as a template string.
 * Seeds: tests/fuzz/corpus/fuzz_chat_template/ (requests from the chat template fixtures).
 */
#include "fuzz_util.h"

#include "base/alloc.h"
#include "tokenizer/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_strdup(data, size);
    static const enum chat_format fmts[] = {CHAT_FORMAT_CHATML, CHAT_FORMAT_QWEN3,
                                            CHAT_FORMAT_QWEN35};
    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        char *out = NULL;
        size_t len = 0;
        struct qwenrt_error err = {0};
        if (chat_render_json(fmts[i], text, &out, &len, &err) == QWENRT_OK) {
            fuzz_check(out != NULL && strlen(out) == len);
            xfree(out);
        } else {
            fuzz_check(err.message[0] != 0);
        }
    }
    const char *warning = NULL;
    enum chat_format f = chat_format_detect(text, &warning);
    fuzz_check(chat_format_name(f) != NULL);
    free(text);
    return 0;
}
