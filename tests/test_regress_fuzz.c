/*
 * test_regress_fuzz.c — regression tests for what the fuzz targets (tests/fuzz/) found, issue
 * 9. Each case replays the input that broke a parser (or its smallest form) and checks the
 * clean error qwenrt gives now; run under build-asan/ (make test) it also proves the crash,
 * leak or undefined behaviour is gone. Case names say what broke.
 */
#include "testutil.h"

#include <stdlib.h>
#include <unistd.h>

#include "base/alloc.h"
#include "tokenizer/tokenizer.h"

TEST_GROUP_TMPDIR("regress")

/* Writes bytes to <tmpdir>/name; returns the path (static storage). */
static const char *write_tmp(const char *name, const void *data, size_t size)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (size)
        assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* fuzz_tokenizer_json, first input: an empty tokenizer.json made the scanner compute
 * NULL + 0 (undefined behaviour; UBSan stops there) before the empty-file check. */
static void test_tokenizer_json_empty_file_null_offset(void **state)
{
    (void)state;
    struct tokenizer *tok = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(tokenizer_load_json(&tok, write_tmp("tokenizer.json", "", 0), &err),
                     QWENRT_ERR_FORMAT);
    assert_null(tok);
    assert_non_null(strstr(err.message, "empty"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_json_empty_file_null_offset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
