/*
 * test_gguf.c — the GGUF reader and writer (src/format/gguf.c, gguf_write.c).
 *
 * The oracle is the GGUF v3 layout itself (docs/gguf-and-quant.md in ../shared): bad and
 * unusual files (nested arrays, version 2, every kind of lie) are built byte by byte here with
 * a small builder, independently of our writer, and the writer's output for a small file is
 * compared byte for byte with a hand-built one. Round trips cover every metadata type and
 * several tensor dtypes. Every bad input asserts the status and a word of the message, and
 * that the message names the file. Files go to a fresh mkdtemp directory under /tmp.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first */
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/alloc.h"
#include "format/gguf.h"

/* ------------------------------------------------------------ byte builder */

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void b_bytes(struct buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void b_le(struct buf *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        b_bytes(b, &c, 1);
    }
}

static void b_u32(struct buf *b, uint32_t v)
{
    b_le(b, v, 4);
}
static void b_u64(struct buf *b, uint64_t v)
{
    b_le(b, v, 8);
}

static void b_str(struct buf *b, const char *s)
{
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}

static void b_pad(struct buf *b, size_t align)
{
    while (b->n % align)
        b_le(b, 0, 1);
}

static void b_header(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b_bytes(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}

/* A tensor info: name, n_dims, ne[], type, offset. */
static void b_tinfo(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                    uint32_t type, uint64_t off)
{
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        b_u64(b, ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}

/* -------------------------------------------------------------- fixtures */

struct ctx {
    char dir[64];
    char path[128];
};

static int setup(void **state)
{
    struct ctx *c = calloc(1, sizeof(*c));
    strcpy(c->dir, "/tmp/qwenrt_test_gguf_XXXXXX");
    if (!c || !mkdtemp(c->dir))
        return -1;
    snprintf(c->path, sizeof(c->path), "%s/t.gguf", c->dir);
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

static void write_file(const char *path, const struct buf *b)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (b->n)
        assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    assert_int_equal(fclose(f), 0);
}

static bool file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Writes b to path, opens it and asserts the status and a word of the message. */
static void expect_fail(const char *path, const struct buf *b, qwenrt_status want, const char *word)
{
    struct gguf_file gf;
    struct qwenrt_error err = {0};
    write_file(path, b);
    qwenrt_status st = gguf_open(&gf, path, &err);
    if (st != want || !strstr(err.message, word) || !strstr(err.message, path))
        print_error("status %d (want %d), message: %s (want '%s')\n", st, want, err.message, word);
    assert_int_equal(st, want);
    assert_non_null(strstr(err.message, word));
    assert_non_null(strstr(err.message, path));
    assert_null(gf.kvs); /* closed on failure */
    assert_null(gf.tensors);
}

/* ------------------------------------------------------- round trips */

struct progress_log {
    int calls;
    uint64_t last_done, last_total;
    char last_name[64];
};

static void on_progress(void *user, const char *name, uint64_t done, uint64_t total)
{
    struct progress_log *p = user;
    assert_true(done > p->last_done || p->calls == 0);
    p->calls++;
    p->last_done = done;
    p->last_total = total;
    snprintf(p->last_name, sizeof(p->last_name), "%s", name);
}

static const struct gguf_kv *kv_at(const struct gguf_file *gf, int64_t i, const char *key)
{
    assert_true(i < gf->n_kv);
    assert_string_equal(gf->kvs[i].key, key);
    return &gf->kvs[i];
}

static void set_scalars(struct gguf_writer *w)
{
    struct gguf_value v;
    v = (struct gguf_value){.type = GGUF_TYPE_UINT8, .v.u64 = 250};
    assert_int_equal(gguf_writer_set(w, "t.u8", &v), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_INT8, .v.i64 = -120};
    assert_int_equal(gguf_writer_set(w, "t.i8", &v), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_UINT16, .v.u64 = 65000};
    assert_int_equal(gguf_writer_set(w, "t.u16", &v), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_INT16, .v.i64 = -32000};
    assert_int_equal(gguf_writer_set(w, "t.i16", &v), QWENRT_OK);
    assert_int_equal(gguf_writer_set_u32(w, "t.u32", 4000000000u), QWENRT_OK);
    assert_int_equal(gguf_writer_set_i32(w, "t.i32", 17), QWENRT_OK);
    assert_int_equal(gguf_writer_set_f32(w, "t.f32", 1e-6f), QWENRT_OK);
    assert_int_equal(gguf_writer_set_bool(w, "t.bool", true), QWENRT_OK);
    assert_int_equal(gguf_writer_set_str(w, "t.str", "héllo {{ template }}"), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_UINT64, .v.u64 = 0xFEDCBA9876543210ull};
    assert_int_equal(gguf_writer_set(w, "t.u64", &v), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_INT64, .v.i64 = INT64_MIN + 5};
    assert_int_equal(gguf_writer_set(w, "t.i64", &v), QWENRT_OK);
    v = (struct gguf_value){.type = GGUF_TYPE_FLOAT64, .v.f64 = 3.141592653589793};
    assert_int_equal(gguf_writer_set(w, "t.f64", &v), QWENRT_OK);
    /* a string with an embedded NUL keeps its length */
    v = (struct gguf_value){.type = GGUF_TYPE_STRING};
    v.v.str.str = (char *)"a\0b";
    v.v.str.len = 3;
    assert_int_equal(gguf_writer_set(w, "t.nul", &v), QWENRT_OK);
}

static void set_arrays(struct gguf_writer *w)
{
    static const int32_t ai[] = {1, -2, 2147483647, -2147483647 - 1};
    static const float af[] = {0.5f, -1e30f, 1e-30f};
    static const bool ab[] = {true, false, true};
    static const char *const as[] = {"", "Ġthe", "<|im_end|>", "a b"};
    assert_int_equal(gguf_writer_set_arr_i32(w, "a.i32", ai, 4), QWENRT_OK);
    assert_int_equal(gguf_writer_set_arr_f32(w, "a.f32", af, 3), QWENRT_OK);
    assert_int_equal(gguf_writer_set_arr_bool(w, "a.bool", ab, 3), QWENRT_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "a.str", as, 4), QWENRT_OK);
    assert_int_equal(gguf_writer_set_arr_i32(w, "a.empty", NULL, 0), QWENRT_OK);
    struct gguf_value items[3] = {{.type = GGUF_TYPE_UINT8, .v.u64 = 7},
                                  {.type = GGUF_TYPE_UINT8, .v.u64 = 0},
                                  {.type = GGUF_TYPE_UINT8, .v.u64 = 255}};
    struct gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.elem_type = GGUF_TYPE_UINT8;
    v.v.arr.count = 3;
    v.v.arr.items = items;
    assert_int_equal(gguf_writer_set(w, "a.u8", &v), QWENRT_OK);
}

static void check_scalars(const struct gguf_file *gf)
{
    int64_t i;
    double d;
    bool b;
    assert_int_equal(kv_at(gf, 0, "t.u8")->value.type, GGUF_TYPE_UINT8);
    assert_true(gguf_get_int(gf, "t.u8", &i) && i == 250);
    assert_true(gguf_get_int(gf, "t.i8", &i) && i == -120);
    assert_int_equal(kv_at(gf, 1, "t.i8")->value.type, GGUF_TYPE_INT8);
    assert_true(gguf_get_int(gf, "t.u16", &i) && i == 65000);
    assert_int_equal(kv_at(gf, 2, "t.u16")->value.type, GGUF_TYPE_UINT16);
    assert_true(gguf_get_int(gf, "t.i16", &i) && i == -32000);
    assert_int_equal(kv_at(gf, 3, "t.i16")->value.type, GGUF_TYPE_INT16);
    assert_true(gguf_get_int(gf, "t.u32", &i) && i == 4000000000LL);
    assert_int_equal(kv_at(gf, 4, "t.u32")->value.type, GGUF_TYPE_UINT32);
    assert_true(gguf_get_int(gf, "t.i32", &i) && i == -2000000000);
    assert_int_equal(kv_at(gf, 5, "t.i32")->value.type, GGUF_TYPE_INT32); /* re-set in place */
    assert_true(gguf_get_float(gf, "t.f32", &d) && (float)d == 1e-6f);
    assert_int_equal(kv_at(gf, 6, "t.f32")->value.type, GGUF_TYPE_FLOAT32);
    assert_true(gguf_get_bool(gf, "t.bool", &b) && b);
    assert_true(gguf_get_int(gf, "t.bool", &i) && i == 1); /* bool counts as an integer */
    assert_false(gguf_get_float(gf, "t.bool", &d));
    assert_string_equal(gguf_get_string(gf, "t.str"), "héllo {{ template }}");
    assert_int_equal(kv_at(gf, 9, "t.u64")->value.v.u64, 0xFEDCBA9876543210ull);
    assert_false(gguf_get_int(gf, "t.u64", &i)); /* does not fit in int64 */
    assert_true(gguf_get_int(gf, "t.i64", &i) && i == INT64_MIN + 5);
    assert_true(gguf_get_float(gf, "t.f64", &d) && d == 3.141592653589793);
    assert_int_equal(kv_at(gf, 11, "t.f64")->value.type, GGUF_TYPE_FLOAT64);
    const struct gguf_kv *nul = kv_at(gf, 12, "t.nul");
    assert_int_equal(nul->value.v.str.len, 3);
    assert_memory_equal(nul->value.v.str.str, "a\0b", 4);
    /* wrong types and missing keys */
    assert_null(gguf_get_string(gf, "t.u8"));
    assert_false(gguf_get_int(gf, "t.str", &i));
    assert_false(gguf_get_bool(gf, "t.u8", &b));
    assert_null(gguf_get_array(gf, "t.u8"));
    assert_null(gguf_find_kv(gf, "missing"));
    assert_true(gguf_get_float(gf, "t.i32", &d) && d == -2000000000.0);
}

static void check_arrays(const struct gguf_file *gf)
{
    const struct gguf_value *a = gguf_get_array(gf, "a.i32");
    assert_non_null(a);
    assert_int_equal(a->v.arr.elem_type, GGUF_TYPE_INT32);
    assert_int_equal(a->v.arr.count, 4);
    assert_int_equal(a->v.arr.items[1].v.i64, -2);
    assert_int_equal(a->v.arr.items[3].v.i64, -2147483647 - 1);
    a = gguf_get_array(gf, "a.f32");
    assert_true(a && a->v.arr.count == 3 && a->v.arr.elem_type == GGUF_TYPE_FLOAT32);
    assert_true((float)a->v.arr.items[1].v.f64 == -1e30f);
    assert_true((float)a->v.arr.items[2].v.f64 == 1e-30f);
    a = gguf_get_array(gf, "a.bool");
    assert_true(a && a->v.arr.count == 3 && a->v.arr.elem_type == GGUF_TYPE_BOOL);
    assert_true(a->v.arr.items[0].v.u64 == 1 && a->v.arr.items[1].v.u64 == 0);
    a = gguf_get_array(gf, "a.str");
    assert_true(a && a->v.arr.count == 4 && a->v.arr.elem_type == GGUF_TYPE_STRING);
    assert_string_equal(a->v.arr.items[0].v.str.str, "");
    assert_string_equal(a->v.arr.items[1].v.str.str, "Ġthe");
    assert_string_equal(a->v.arr.items[3].v.str.str, "a b");
    a = gguf_get_array(gf, "a.empty");
    assert_true(a && a->v.arr.count == 0 && a->v.arr.elem_type == GGUF_TYPE_INT32);
    a = gguf_get_array(gf, "a.u8");
    assert_true(a && a->v.arr.count == 3 && a->v.arr.items[2].v.u64 == 255);
}

/* Three tensors of different dtypes with recognisable bytes. */
struct tdata {
    float f32[6];       /* ne {3, 2} */
    uint16_t f16[5];    /* ne {5} */
    uint8_t q8[2 * 34]; /* q8_0, ne {32, 1, 2}: 2 rows of one block */
};

static void fill_tdata(struct tdata *t)
{
    for (int i = 0; i < 6; i++)
        t->f32[i] = (float)i * 0.25f - 1.0f;
    uint16_t h[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7E00}; /* 1, -2, max, subnormal, NaN */
    memcpy(t->f16, h, sizeof(h));
    for (int i = 0; i < 68; i++)
        t->q8[i] = (uint8_t)(i * 37 + 11);
}

static void add_tensors(struct gguf_writer *w, const struct tdata *t)
{
    const int64_t ne_f32[] = {3, 2}, ne_f16[] = {5}, ne_q8[] = {32, 1, 2};
    assert_int_equal(gguf_writer_add_tensor(w, "w.f32", QR_F32, 2, ne_f32, t->f32), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "w.f16", QR_F16, 1, ne_f16, t->f16), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "w.q8", QR_Q8_0, 3, ne_q8, t->q8), QWENRT_OK);
}

static void check_tensor(const struct gguf_file *gf, int64_t i, const char *name, enum qr_dtype dt,
                         int32_t n_dims, const int64_t *ne, const void *data, size_t nbytes)
{
    const struct qr_tensor *t = gguf_find_tensor(gf, name);
    assert_ptr_equal(t, &gf->tensors[i]);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->n_dims, n_dims);
    for (int d = 0; d < QR_MAX_DIMS; d++)
        assert_int_equal(t->ne[d], d < n_dims ? ne[d] : 1);
    assert_int_equal(t->nbytes, nbytes);
    assert_memory_equal(t->data, data, nbytes);
    size_t off = (size_t)((const uint8_t *)t->data - gf->map.data);
    assert_int_equal(off % gf->alignment, 0);
    assert_true(off >= gf->data_offset && off + nbytes <= gf->map.size);
}

static void check_tensors(const struct gguf_file *gf, const struct tdata *t)
{
    const int64_t ne_f32[] = {3, 2}, ne_f16[] = {5}, ne_q8[] = {32, 1, 2};
    assert_int_equal(gf->n_tensors, 3);
    check_tensor(gf, 0, "w.f32", QR_F32, 2, ne_f32, t->f32, 24);
    check_tensor(gf, 1, "w.f16", QR_F16, 1, ne_f16, t->f16, 10);
    check_tensor(gf, 2, "w.q8", QR_Q8_0, 3, ne_q8, t->q8, 68);
    assert_null(gguf_find_tensor(gf, "w.missing"));
}

static void test_roundtrip_all_types(void **state)
{
    struct ctx *c = *state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    struct tdata td;
    fill_tdata(&td);
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    set_scalars(w);
    set_arrays(w);
    assert_int_equal(gguf_writer_set_i32(w, "t.i32", -2000000000), QWENRT_OK); /* re-set */
    add_tensors(w, &td);
    struct progress_log pl = {0};
    assert_int_equal(gguf_writer_write(w, c->path, on_progress, &pl, &err), QWENRT_OK);
    gguf_writer_free(w);
    assert_int_equal(pl.calls, 3);
    assert_int_equal(pl.last_done, 24 + 10 + 68);
    assert_int_equal(pl.last_total, 24 + 10 + 68);
    assert_string_equal(pl.last_name, "w.q8");

    struct gguf_file gf;
    qwenrt_status st = gguf_open(&gf, c->path, &err);
    if (st)
        print_error("%s\n", err.message);
    assert_int_equal(st, QWENRT_OK);
    assert_int_equal(gf.version, 3);
    assert_int_equal(gf.alignment, 32);
    assert_int_equal(gf.data_offset % 32, 0);
    assert_int_equal(gf.n_kv, 13 + 6); /* re-set kept one entry, in its first position */
    check_scalars(&gf);
    check_arrays(&gf);
    check_tensors(&gf, &td);
    gguf_close(&gf);
    gguf_close(NULL);
}

static void test_custom_alignment(void **state)
{
    struct ctx *c = *state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    struct tdata td;
    fill_tdata(&td);
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 256), QWENRT_OK);
    add_tensors(w, &td);
    assert_int_equal(gguf_writer_write(w, c->path, NULL, NULL, &err), QWENRT_OK);
    gguf_writer_free(w);
    struct gguf_file gf;
    assert_int_equal(gguf_open(&gf, c->path, &err), QWENRT_OK);
    assert_int_equal(gf.alignment, 256);
    assert_int_equal(gf.data_offset % 256, 0);
    check_tensors(&gf, &td); /* checks every tensor starts on a 256-byte boundary */
    assert_int_equal((const uint8_t *)gf.tensors[1].data - (const uint8_t *)gf.tensors[0].data,
                     256);
    gguf_close(&gf);
}

/* The writer's bytes for a tiny file equal the layout built by hand from the spec. */
static void test_writer_exact_bytes(void **state)
{
    struct ctx *c = *state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    const float x[2] = {1.0f, -2.0f};
    const int64_t ne[1] = {2};
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_set_u32(w, "k", 7), QWENRT_OK);
    assert_int_equal(gguf_writer_set_str(w, "s", "ab"), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "x", QR_F32, 1, ne, x), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "y", QR_F32, 1, ne, x), QWENRT_OK);
    assert_int_equal(gguf_writer_write(w, c->path, NULL, NULL, &err), QWENRT_OK);
    gguf_writer_free(w);

    struct buf want = {0};
    const uint64_t one[1] = {2};
    b_header(&want, 3, 2, 2);
    b_str(&want, "k");
    b_u32(&want, GGUF_TYPE_UINT32);
    b_u32(&want, 7);
    b_str(&want, "s");
    b_u32(&want, GGUF_TYPE_STRING);
    b_str(&want, "ab");
    b_tinfo(&want, "x", 1, one, 0, 0);
    b_tinfo(&want, "y", 1, one, 0, 32);
    b_pad(&want, 32);
    b_bytes(&want, x, 8);
    b_pad(&want, 32);
    b_bytes(&want, x, 8);
    b_pad(&want, 32);

    FILE *f = fopen(c->path, "rb");
    assert_non_null(f);
    uint8_t got[512];
    size_t n = fread(got, 1, sizeof(got), f);
    fclose(f);
    assert_int_equal(n, want.n);
    assert_memory_equal(got, want.p, want.n);
    free(want.p);
}

/* Nested arrays (array of arrays of i32) and a version-2 file are read. */
static void test_nested_array_and_v2(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    b_header(&b, 2, 0, 2);
    b_str(&b, "nested");
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u64(&b, 2);
    b_u32(&b, GGUF_TYPE_INT32);
    b_u64(&b, 2);
    b_u32(&b, 11);
    b_u32(&b, (uint32_t)-12);
    b_u32(&b, GGUF_TYPE_STRING);
    b_u64(&b, 1);
    b_str(&b, "deep");
    b_str(&b, "after");
    b_u32(&b, GGUF_TYPE_UINT16);
    b_le(&b, 513, 2);
    write_file(c->path, &b);
    free(b.p);

    struct gguf_file gf;
    struct qwenrt_error err = {0};
    assert_int_equal(gguf_open(&gf, c->path, &err), QWENRT_OK);
    assert_int_equal(gf.version, 2);
    assert_int_equal(gf.n_tensors, 0);
    const struct gguf_value *a = gguf_get_array(&gf, "nested");
    assert_true(a && a->v.arr.elem_type == GGUF_TYPE_ARRAY && a->v.arr.count == 2);
    const struct gguf_value *a0 = &a->v.arr.items[0], *a1 = &a->v.arr.items[1];
    assert_true(a0->v.arr.elem_type == GGUF_TYPE_INT32 && a0->v.arr.count == 2);
    assert_int_equal(a0->v.arr.items[0].v.i64, 11);
    assert_int_equal(a0->v.arr.items[1].v.i64, -12);
    assert_true(a1->v.arr.elem_type == GGUF_TYPE_STRING && a1->v.arr.count == 1);
    assert_string_equal(a1->v.arr.items[0].v.str.str, "deep");
    int64_t i;
    assert_true(gguf_get_int(&gf, "after", &i) && i == 513);
    gguf_close(&gf);
}

/* -------------------------------------------------------------- bad inputs */

/* A small valid file: 3 key/values (u32, string, i32 array), 2 f32 tensors. Returns in
 * *data_end the offset just past the last tensor's bytes (the rest is padding). */
static void build_small(struct buf *b, size_t *data_end)
{
    const uint64_t ne0[2] = {4, 2}, ne1[1] = {8};
    b_header(b, 3, 2, 3);
    b_str(b, "general.architecture");
    b_u32(b, GGUF_TYPE_STRING);
    b_str(b, "qwen3");
    b_str(b, "qwen3.block_count");
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, 28);
    b_str(b, "ids");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_INT32);
    b_u64(b, 3);
    b_u32(b, 1);
    b_u32(b, 2);
    b_u32(b, 3);
    b_tinfo(b, "a", 2, ne0, 0, 0);
    b_tinfo(b, "b", 1, ne1, 0, 32);
    b_pad(b, 32);
    for (int i = 0; i < 8; i++)
        b_u32(b, 0x3F800000u + (uint32_t)i);
    for (int i = 0; i < 8; i++)
        b_u32(b, 0x40000000u + (uint32_t)i);
    *data_end = b->n;
    b_pad(b, 64);
}

static void test_truncated_every_prefix(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    size_t end;
    build_small(&b, &end);
    for (size_t n = 0; n <= b.n; n++) {
        struct buf p = {b.p, n, n};
        struct gguf_file gf;
        struct qwenrt_error err = {0};
        write_file(c->path, &p);
        qwenrt_status st = gguf_open(&gf, c->path, &err);
        if (n < end) {
            if (st != QWENRT_ERR_FORMAT)
                print_error("prefix %zu: status %d: %s\n", n, st, err.message);
            assert_int_equal(st, QWENRT_ERR_FORMAT);
            assert_non_null(strstr(err.message, c->path));
            assert_true(strstr(err.message, "truncated") || strstr(err.message, "past the end") ||
                        strstr(err.message, "magic"));
        } else {
            assert_int_equal(st, QWENRT_OK); /* only trailing padding is missing */
            assert_int_equal(gf.n_tensors, 2);
            assert_int_equal(((const uint32_t *)gf.tensors[1].data)[7], 0x40000007u);
            gguf_close(&gf);
        }
    }
    free(b.p);
}

static void test_empty_magic_version(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "magic");
    b_bytes(&b, "GGUX", 4);
    b_u32(&b, 3);
    b_u64(&b, 0);
    b_u64(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "magic");
    b.n = 0;
    b_header(&b, 4, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "version");
    b.n = 0;
    b_header(&b, 1, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "version");
    b.n = 0;
    b_header(&b, 3, 0, 0); /* the smallest valid file */
    write_file(c->path, &b);
    struct gguf_file gf;
    assert_int_equal(gguf_open(&gf, c->path, NULL), QWENRT_OK);
    gguf_close(&gf);
    free(b.p);
}

static void test_absurd_counts(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    b_header(&b, 3, 1ull << 40, 0);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "tensor count");
    b.n = 0;
    b_header(&b, 3, 0, 1ull << 40);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "key/value count");
    b.n = 0;
    b_header(&b, 3, UINT64_MAX, 0); /* negative as i64 */
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "tensor count");
    b.n = 0;
    b_header(&b, 3, 1000, 1000); /* within limits but cannot fit in the file */
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "cannot fit");
    free(b.p);
}

/* A header with one key named "k" of the given type, then whatever the caller appends. */
static void one_key(struct buf *b, uint32_t type)
{
    b->n = 0;
    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, type);
}

static void test_bad_strings_and_arrays(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    one_key(&b, GGUF_TYPE_STRING);
    b_u64(&b, 1000);
    b_bytes(&b, "short", 5);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "past the end");
    one_key(&b, GGUF_TYPE_STRING);
    b_u64(&b, 1ull << 60);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "string length");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_u64(&b, 1ull << 62); /* the key name itself */
    b_u64(&b, 0);
    b_u64(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "string length");
    one_key(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_UINT8);
    b_u64(&b, 1ull << 40);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "array count");
    one_key(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_STRING);
    b_u64(&b, 100000); /* under the limit, but 100000 strings need 800000 bytes */
    b_u64(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "past the end");
    one_key(&b, 13);
    b_u32(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "unknown value type");
    one_key(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, 77);
    b_u64(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "unknown array element type");
    one_key(&b, GGUF_TYPE_ARRAY); /* arrays nested 5 deep */
    for (int i = 0; i < 5; i++) {
        b_u32(&b, GGUF_TYPE_ARRAY);
        b_u64(&b, 1);
    }
    b_u64(&b, 0);
    expect_fail(c->path, &b, QWENRT_ERR_LIMIT, "nested");
    free(b.p);
}

static void test_bad_keys(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    b_header(&b, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        b_str(&b, "dup.key");
        b_u32(&b, GGUF_TYPE_UINT8);
        b_le(&b, 1, 1);
    }
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "duplicate");
    const uint32_t bad_align[] = {0, 3, 48};
    for (int i = 0; i < 3; i++) {
        b.n = 0;
        b_header(&b, 3, 0, 1);
        b_str(&b, "general.alignment");
        b_u32(&b, GGUF_TYPE_UINT32);
        b_u32(&b, bad_align[i]);
        expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "power of two");
    }
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_TYPE_UINT64);
    b_u64(&b, 32);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "general.alignment");
    free(b.p);
}

/* One tensor named "t" with the given shape/type/offset and 64 bytes of data after padding. */
static void one_tensor(struct buf *b, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t off)
{
    b->n = 0;
    b_header(b, 3, 1, 0);
    b_tinfo(b, "t", n_dims, ne, type, off);
    b_pad(b, 32);
    for (int i = 0; i < 64; i++)
        b_le(b, (uint64_t)i, 1);
}

static void test_bad_tensors(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    const uint64_t ne4[5] = {4, 1, 1, 1, 1}, big[2] = {1ull << 40, 1ull << 40};
    const uint64_t neg[2] = {4, (uint64_t)-1}, odd[1] = {33}, zero_big[4] = {0, 1ull << 62, 4, 1};
    one_tensor(&b, 2, ne4, 99, 0);
    expect_fail(c->path, &b, QWENRT_ERR_UNSUPPORTED, "unknown ggml type 99");
    one_tensor(&b, 1, ne4, 16, 0); /* IQ2_XXS: a ggml type we have no traits for */
    expect_fail(c->path, &b, QWENRT_ERR_UNSUPPORTED, "unknown ggml type");
    one_tensor(&b, 1, ne4, 200, 0); /* qwenrt's safetensors-only U8 is not a ggml type */
    expect_fail(c->path, &b, QWENRT_ERR_UNSUPPORTED, "unknown ggml type");
    one_tensor(&b, 5, ne4, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "n_dims 5");
    one_tensor(&b, 0, ne4, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "n_dims 0");
    one_tensor(&b, 2, ne4, 0, 64); /* 16 bytes at 64: past the 64-byte data section */
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "past the end");
    one_tensor(&b, 2, ne4, 0, UINT64_MAX - 31);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "past the end");
    one_tensor(&b, 2, ne4, 0, 4);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "alignment");
    one_tensor(&b, 2, big, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "overflow");
    one_tensor(&b, 4, zero_big, 0, 0); /* zero elements, but rows would overflow */
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "overflow");
    one_tensor(&b, 2, neg, 0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "negative");
    one_tensor(&b, 1, odd, QR_Q8_0, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "blocks");
    /* the types qwenrt only reads get the same checks: whole blocks, data inside the file */
    one_tensor(&b, 1, odd, QR_Q3_K, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "blocks");
    const uint64_t one_super[1] = {256}; /* an IQ4_XS super-block: 136 bytes, the data has 64 */
    one_tensor(&b, 1, one_super, QR_IQ4_XS, 0);
    expect_fail(c->path, &b, QWENRT_ERR_FORMAT, "past the end");
    free(b.p);
}

static void test_duplicate_and_overlap(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    const uint64_t ne[1] = {8};
    const char *names[2][2] = {{"same", "same"}, {"x", "y"}};
    const uint64_t offs[2][2] = {{0, 32}, {0, 0}};
    const char *word[2] = {"duplicate", "overlap"};
    for (int k = 0; k < 2; k++) {
        b.n = 0;
        b_header(&b, 3, 2, 0);
        b_tinfo(&b, names[k][0], 1, ne, 0, offs[k][0]);
        b_tinfo(&b, names[k][1], 1, ne, 0, offs[k][1]);
        b_pad(&b, 32);
        for (int i = 0; i < 64; i++)
            b_le(&b, 0, 1);
        expect_fail(c->path, &b, QWENRT_ERR_FORMAT, word[k]);
    }
    free(b.p);
}

/* ------------------------------------------------------ writer failures */

static void test_writer_rejects(void **state)
{
    struct ctx *c = *state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    float x[64] = {0};
    const int64_t ne[2] = {33, 1}, ne_ok[1] = {64}, ne5[5] = {1, 1, 1, 1, 1};
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "q", QR_Q8_0, 2, ne, x), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "t", QR_F32, 5, ne5, x), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "t", QR_F32, 1, ne_ok, x), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t", QR_F32, 1, ne_ok, x), QWENRT_ERR_INVALID_ARG);
    struct gguf_value bad = {.type = GGUF_TYPE_COUNT};
    assert_int_equal(gguf_writer_set(w, "bad", &bad), QWENRT_ERR_INVALID_ARG);
    /* a bad alignment fails before anything is created */
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 48), QWENRT_OK);
    assert_int_equal(gguf_writer_write(w, c->path, NULL, NULL, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "general.alignment"));
    assert_false(file_exists(c->path));
    /* a directory that does not exist */
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 32), QWENRT_OK);
    char bad_path[160];
    snprintf(bad_path, sizeof(bad_path), "%s/no/such/dir.gguf", c->dir);
    assert_int_equal(gguf_writer_write(w, bad_path, NULL, NULL, &err), QWENRT_ERR_IO);
    assert_non_null(strstr(err.message, "cannot create"));
    gguf_writer_free(w);
    gguf_writer_free(NULL);
}

/* A write that fails half way (file size limit) leaves neither path nor path.tmp. */
static void test_writer_fails_midway(void **state)
{
    struct ctx *c = *state;
    struct gguf_writer *w;
    struct qwenrt_error err = {0};
    static float big[64 * 1024];
    const int64_t ne[1] = {64 * 1024};
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", c->path);
    assert_int_equal(gguf_writer_init(&w, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "big", QR_F32, 1, ne, big), QWENRT_OK);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 8192;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    qwenrt_status st = gguf_writer_write(w, c->path, NULL, NULL, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(st, QWENRT_ERR_IO);
    assert_non_null(strstr(err.message, c->path));
    assert_false(file_exists(c->path));
    assert_false(file_exists(tmp));
    gguf_writer_free(w);
}

/* Failing the Nth allocation of gguf_open returns NOMEM cleanly for every N. */
static void test_open_alloc_faults(void **state)
{
    struct ctx *c = *state;
    struct buf b = {0};
    size_t end;
    build_small(&b, &end);
    write_file(c->path, &b);
    free(b.p);
    for (int64_t n = 0;; n++) {
        struct gguf_file gf;
        struct qwenrt_error err = {0};
        alloc_fault_after(n);
        qwenrt_status st = gguf_open(&gf, c->path, &err);
        alloc_fault_after(-1);
        if (st == QWENRT_OK) {
            assert_true(n > 5);
            assert_int_equal(gf.n_tensors, 2);
            gguf_close(&gf);
            break;
        }
        assert_int_equal(st, QWENRT_ERR_NOMEM);
        assert_null(gf.kvs);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_all_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_alignment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_exact_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nested_array_and_v2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_every_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_magic_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absurd_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_strings_and_arrays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_and_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_rejects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_fails_midway, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_alloc_faults, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
