/*
 * fuzz_tokenizer_json.c — libFuzzer target for tokenizer.json loading (the hand-written
 * scanner in src/tokenizer/tokenizer_json.c plus the jansson-parsed parts): the input is
 * written as tokenizer.json in a scratch directory; when it loads, a fixed text is encoded and
 * decoded, and every id the encoder returns must be inside the vocabulary.
 * Seeds: tests/fuzz/corpus/fuzz_tokenizer_json/ (small byte-level BPE tokenizers).
 */
#include "fuzz_util.h"

#include "base/alloc.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write("tokenizer.json", data, size);
    struct tokenizer *tok = NULL;
    struct qwenrt_error err = {0};
    if (tokenizer_load_json(&tok, path, &err) != QWENRT_OK) {
        fuzz_check(tok == NULL);
        return 0;
    }
    static const char text[] = "ab abc <|x|>Hello\n\n  world 12345 \xe4\xbd\xa0\xe5\xa5\xbd\xcc\x81 "
                                "'s 're\xff\xfe";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(tok, text, sizeof(text) - 1, &ids, &n, &err) == QWENRT_OK) {
        int32_t nv = tokenizer_n_vocab(tok);
        for (size_t i = 0; i < n; i++)
            fuzz_check(ids[i] >= 0 && ids[i] < nv);
        char *out = NULL;
        size_t len = 0;
        if (tokenizer_decode(tok, ids, n, &out, &len, &err) == QWENRT_OK)
            xfree(out);
        xfree(ids);
    }
    (void)tokenizer_chat_template(tok);
    (void)tokenizer_special_ids(tok);
    tokenizer_free(tok);
    return 0;
}
