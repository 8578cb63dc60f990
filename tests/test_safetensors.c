/*
 * test_safetensors.c — the safetensors reader and writer (src/format/safetensors.c).
 *
 * The fixtures in tests/data were written by transformers/torch; the expected shapes and
 * first values below were read from them with Python's json and struct modules, not with
 * our reader. Bad files are built here by hand (8-byte length + JSON + data), each asserting
 * the status and a word of the message, and that the message names the file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first */
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "format/safetensors.h"

#define F32_FIXTURE "tests/data/qwen3-tiny-f32/model.safetensors"
#define BF16_FIXTURE "tests/data/qwen3-tiny-bf16/model.safetensors"

struct ctx {
    char dir[64];
    char path[128];
};

static int setup(void **state)
{
    struct ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return -1;
    strcpy(c->dir, "/tmp/qwenrt_test_st_XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->path, sizeof(c->path), "%s/t.safetensors", c->dir);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct ctx *c = *state;
    char tmp[160];
    unlink(c->path);
    snprintf(tmp, sizeof(tmp), "%s.tmp", c->path);
    unlink(tmp);
    rmdir(c->dir);
    free(c);
    return 0;
}

/* Writes an 8-byte little-endian length, the header text, then data_len bytes 0,1,2,... */
static void write_st(const char *path, uint64_t hlen, const char *header, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fputc((int)((hlen >> (8 * i)) & 0xff), f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(i & 0xff), f);
    assert_int_equal(fclose(f), 0);
}

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void expect_fail_file(const char *path, qwenrt_status want, const char *word)
{
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    qwenrt_status st = safetensors_open(&sf, path, &err);
    if (st != want || !strstr(err.message, word) || !strstr(err.message, path))
        print_error("status %d (want %d), message: %s (want '%s')\n", st, want, err.message, word);
    assert_int_equal(st, want);
    assert_non_null(strstr(err.message, word));
    assert_non_null(strstr(err.message, path));
    assert_null(sf.tensors);
}

/* A file whose header is the given JSON (length exact) and data_len bytes of data. */
static void expect_fail(const char *path, const char *json, size_t data_len, qwenrt_status want,
                        const char *word)
{
    write_st(path, strlen(json), json, data_len);
    expect_fail_file(path, want, word);
}

/* ---------------------------------------------------------------- fixtures */

static void test_fixture_f32(void **state)
{
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&sf, F32_FIXTURE, &err), QWENRT_OK);
    assert_int_equal(sf.n_tensors, 36); /* 37 header entries minus __metadata__ */
    const struct qr_tensor *t = safetensors_find(&sf, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, QR_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 128);
    assert_int_equal(t->ne[1], 1024);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->nbytes, 128 * 1024 * 4);
    const float *x = t->data;
    /* first values as Python's struct module reads them from the file */
    assert_true(x[0] == 0.1391899287700653f);
    assert_true(x[1] == -0.9368072748184204f);
    assert_true(x[2] == 0.7303476333618164f);
    assert_true(x[3] == -0.2657240033149719f);
    t = safetensors_find(&sf, "model.layers.0.input_layernorm.weight");
    assert_true(t && t->n_dims == 1 && t->ne[0] == 128 && t->ne[1] == 1 && t->nbytes == 512);
    assert_null(safetensors_find(&sf, "__metadata__"));
    assert_null(safetensors_find(&sf, "model.missing"));
    /* sorted by offset, inside the mapping, not overlapping */
    for (int32_t i = 0; i < sf.n_tensors; i++) {
        const uint8_t *p = sf.tensors[i].data;
        assert_true(p >= sf.map.data && p + sf.tensors[i].nbytes <= sf.map.data + sf.map.size);
        if (i)
            assert_true((const uint8_t *)sf.tensors[i - 1].data + sf.tensors[i - 1].nbytes <= p);
    }
    safetensors_close(&sf);
    safetensors_close(NULL);
}

static void test_fixture_bf16(void **state)
{
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&sf, BF16_FIXTURE, &err), QWENRT_OK);
    const struct qr_tensor *t = safetensors_find(&sf, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, QR_BF16);
    assert_int_equal(t->ne[0], 128);
    assert_int_equal(t->ne[1], 1024);
    assert_int_equal(t->nbytes, 128 * 1024 * 2);
    const uint16_t *h = t->data; /* 0.396484375, 0.6953125 as bfloat16 */
    assert_int_equal(h[0], 0x3ECB);
    assert_int_equal(h[1], 0x3F32);
    safetensors_close(&sf);
}

/* ---------------------------------------------------------------- round trip */

static void test_write_read_roundtrip(void **state)
{
    struct ctx *c = *state;
    float a[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7};
    uint16_t b[4] = {0x3F80, 0xC000, 0x7F80, 0x0001};
    int32_t i32[2] = {-5, 2147483647};
    int64_t i64[1] = {INT64_MIN};
    uint8_t u8[3] = {0, 128, 255};
    uint16_t h[24];
    for (int i = 0; i < 24; i++)
        h[i] = (uint16_t)(0x3C00 + i);
    const struct safetensors_out out[] = {
        {"a", QR_F32, 2, {2, 3}, a},        {"b.bf16", QR_BF16, 1, {4}, b},
        {"i", QR_I32, 1, {2}, i32},         {"scalar", QR_I64, 0, {0}, i64},
        {"u", QR_U8, 1, {3}, u8},           {"h3", QR_F16, 3, {2, 3, 4}, h},
        {"empty", QR_F32, 2, {0, 5}, NULL},
    };
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_write(c->path, out, 7, &err), QWENRT_OK);
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", c->path);
    assert_int_not_equal(access(tmp, F_OK), 0);

    struct safetensors_file sf;
    assert_int_equal(safetensors_open(&sf, c->path, &err), QWENRT_OK);
    assert_int_equal(sf.n_tensors, 7);
    const struct qr_tensor *t = safetensors_find(&sf, "a");
    assert_true(t && t->dtype == QR_F32 && t->n_dims == 2 && t->ne[0] == 3 && t->ne[1] == 2);
    assert_memory_equal(t->data, a, sizeof(a));
    t = safetensors_find(&sf, "b.bf16");
    assert_true(t && t->dtype == QR_BF16 && t->ne[0] == 4 && t->nbytes == 8);
    assert_memory_equal(t->data, b, sizeof(b));
    t = safetensors_find(&sf, "i");
    assert_true(t && t->dtype == QR_I32 && t->nbytes == 8);
    assert_memory_equal(t->data, i32, sizeof(i32));
    t = safetensors_find(&sf, "scalar");
    assert_true(t && t->dtype == QR_I64 && t->n_dims == 1 && t->ne[0] == 1 && t->nbytes == 8);
    assert_memory_equal(t->data, i64, sizeof(i64));
    t = safetensors_find(&sf, "u");
    assert_true(t && t->dtype == QR_U8 && t->nbytes == 3);
    assert_memory_equal(t->data, u8, sizeof(u8));
    t = safetensors_find(&sf, "h3");
    assert_true(t && t->dtype == QR_F16 && t->n_dims == 3);
    assert_true(t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 2 && t->ne[3] == 1);
    assert_memory_equal(t->data, h, sizeof(h));
    t = safetensors_find(&sf, "empty");
    assert_true(t && t->nbytes == 0 && t->ne[0] == 5 && t->ne[1] == 0);
    safetensors_close(&sf);
}

static void test_write_rejects(void **state)
{
    struct ctx *c = *state;
    uint8_t q[34] = {0};
    const struct safetensors_out out[] = {{"q", QR_Q8_0, 1, {32}, q}};
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_write(c->path, out, 1, &err), QWENRT_ERR_UNSUPPORTED);
    assert_int_not_equal(access(c->path, F_OK), 0);
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/no/such/x.safetensors", c->dir);
    float a[1] = {1};
    const struct safetensors_out ok[] = {{"a", QR_F32, 1, {1}, a}};
    assert_int_equal(safetensors_write(bad, ok, 1, &err), QWENRT_ERR_IO);
}

/* ---------------------------------------------------------------- bad inputs */

static void test_too_short(void **state)
{
    struct ctx *c = *state;
    const uint8_t bytes[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 8; n++) {
        write_raw(c->path, bytes, n);
        expect_fail_file(c->path, QWENRT_ERR_FORMAT, "truncated");
    }
}

static void test_bad_headers(void **state)
{
    struct ctx *c = *state;
    /* header length past the end of the file */
    write_st(c->path, 1000, "{}", 0);
    expect_fail_file(c->path, QWENRT_ERR_FORMAT, "exceeds");
    write_st(c->path, UINT64_MAX, "{}", 0);
    expect_fail_file(c->path, QWENRT_ERR_FORMAT, "exceeds");
    expect_fail(c->path, "this is not json", 0, QWENRT_ERR_FORMAT, "JSON");
    expect_fail(c->path, "[1, 2]", 0, QWENRT_ERR_FORMAT, "JSON");
    expect_fail(c->path, "{\"a\": 5}", 0, QWENRT_ERR_FORMAT, "not an object");
    expect_fail(c->path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, QWENRT_ERR_FORMAT,
                "data_offsets");
    expect_fail(c->path,
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
                16, QWENRT_ERR_FORMAT, "JSON");
}

static void test_bad_entries(void **state)
{
    struct ctx *c = *state;
    /* data_offsets past the end of the file (16 bytes of data) */
    expect_fail(c->path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [8], \"data_offsets\": [0, 32]}}",
                16, QWENRT_ERR_FORMAT, "past the end");
    /* offsets span not matching the shape */
    expect_fail(c->path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}",
                16, QWENRT_ERR_FORMAT, "span");
    expect_fail(c->path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 4]}}",
                16, QWENRT_ERR_FORMAT, "data_offsets");
    expect_fail(c->path,
                "{\"a\": {\"dtype\": \"F8_XX\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 16,
                QWENRT_ERR_UNSUPPORTED, "unknown dtype");
    expect_fail(c->path,
                "{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0,1]}}", 16,
                QWENRT_ERR_UNSUPPORTED, "dimensions");
    expect_fail(c->path, "{\"a\": {\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 1]}}",
                16, QWENRT_ERR_FORMAT, "shape");
    expect_fail(c->path,
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [1099511627776, 1099511627776,"
                " 1099511627776], \"data_offsets\": [0, 4]}}",
                16, QWENRT_ERR_FORMAT, "overflows");
    /* overlapping tensors */
    expect_fail(c->path,
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                16, QWENRT_ERR_FORMAT, "overlap");
}

/* Empty tensors sharing their offset with the start of a real tensor are valid (torch writes
 * them so) and must not be reported as overlapping, whatever order the sort leaves them in. */
static void test_empty_tensor_at_shared_offset(void **state)
{
    struct ctx *c = *state;
    const char *json = "{\"e1\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
                       " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                       " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]},"
                       " \"e2\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [0, 0]},"
                       " \"e3\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [16, 16]},"
                       " \"e4\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]}}";
    write_st(c->path, strlen(json), json, 16);
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    qwenrt_status st = safetensors_open(&sf, c->path, &err);
    if (st)
        print_error("%s\n", err.message);
    assert_int_equal(st, QWENRT_OK);
    assert_int_equal(sf.n_tensors, 6);
    const struct qr_tensor *b = safetensors_find(&sf, "b");
    assert_int_equal(((const uint8_t *)b->data)[0], 8);
    safetensors_close(&sf);
}

/* Every strict prefix of a small valid file fails cleanly; the whole file opens. */
static void test_truncated_every_prefix(void **state)
{
    struct ctx *c = *state;
    const char *json = "{\"__metadata__\": {\"format\": \"pt\"},"
                       " \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0,12]},"
                       " \"v\": {\"dtype\": \"F32\", \"shape\": [5], \"data_offsets\": [12, 32]}}";
    write_st(c->path, strlen(json), json, 32);
    FILE *f = fopen(c->path, "rb");
    assert_non_null(f);
    uint8_t buf[512];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_int_equal(n, 8 + strlen(json) + 32);
    for (size_t k = 0; k <= n; k++) {
        write_raw(c->path, buf, k);
        struct safetensors_file sf;
        struct qwenrt_error err = {0};
        qwenrt_status st = safetensors_open(&sf, c->path, &err);
        if (k < n) {
            if (st != QWENRT_ERR_FORMAT)
                print_error("prefix %zu: status %d: %s\n", k, st, err.message);
            assert_int_equal(st, QWENRT_ERR_FORMAT);
            assert_non_null(strstr(err.message, c->path));
        } else {
            assert_int_equal(st, QWENRT_OK);
            assert_int_equal(sf.n_tensors, 2);
            safetensors_close(&sf);
        }
    }
}

/* Failing the Nth allocation returns NOMEM (or a clean error) for every N. */
static void test_open_alloc_faults(void **state)
{
    for (int64_t n = 0;; n++) {
        struct safetensors_file sf;
        struct qwenrt_error err = {0};
        alloc_fault_after(n);
        qwenrt_status st = safetensors_open(&sf, F32_FIXTURE, &err);
        alloc_fault_after(-1);
        if (st == QWENRT_OK) {
            assert_int_equal(sf.n_tensors, 36);
            safetensors_close(&sf);
            break;
        }
        assert_int_equal(st, QWENRT_ERR_NOMEM);
        assert_null(sf.tensors);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_f32),
        cmocka_unit_test(test_fixture_bf16),
        cmocka_unit_test_setup_teardown(test_write_read_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_rejects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_short, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_tensor_at_shared_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_every_prefix, setup, teardown),
        cmocka_unit_test(test_open_alloc_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
