/*
 * test_checkpoint.c — issue 4 part 4: session checkpoints through the public API.
 *
 * On the fixtures (qwen35 and qwen3): snapshot after part of the prompt, continue the original
 * session (rest of the prompt, then the greedy continuation), restore the snapshot into a fresh
 * session, into the original (rewind), and through a file: every continuation gives
 * bit-identical logits, and they match the transformers decode logits. Refusals: a checkpoint
 * file from another model (bf16 copy of the same geometry, the other architecture), truncated
 * at many lengths, corrupted header or state, bad magic, a context too small; each with its
 * status and a message that says why, leaving the session unchanged. Allocation failures
 * return NOMEM.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "base/alloc.h"
#include "qwenrt.h"

#define LOGITS_REL_TOL 1e-4 /* against transformers, as in test_model_fixtures.c */
#define KV16_REL_TOL 1e-3   /* the same with the KV cache in f16 */




static struct qwenrt_session *new_session(struct qwenrt_model *m, int32_t n_ctx, bool kv16)
{
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = n_ctx;
    sp.kv_type = kv16 ? QWENRT_KV_F16 : QWENRT_KV_F32;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    return s;
}

/* From a session holding prompt[0..cut): the rest of the prompt in one piece, then the greedy
 * ids; out receives [1 + G - 1][V] logits (after the prompt, after each generated id but the
 * last). */
static void continue_chat(const struct ref_fixture *f, struct qwenrt_session *s, int32_t cut,
                          float *out)
{
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_n_past(s), cut);
    if (qwenrt_session_prefill(s, f->prompt + cut, f->T - cut, NULL, &err) != QWENRT_OK)
        fail_msg("prefill: %s", err.message);
    for (int32_t g = 0; g < f->G; g++) {
        if (g > 0 && qwenrt_session_decode(s, f->gen[g - 1], &err) != QWENRT_OK)
            fail_msg("decode: %s", err.message);
        memcpy(out + (size_t)g * f->V, qwenrt_session_logits(s), (size_t)f->V * sizeof(float));
    }
}

static void make_tmpdir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/qwenrt_ckpt_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

/* kv16: every session with its KV cache in f16 (the checkpoint holds f32 either way; f16 values
 * go through f32 and back unchanged, so the continuations stay bit-identical) */
static void round_trip(const char *fixture_dir, int32_t cut, bool kv16)
{
    struct ref_fixture f;
    ref_fixture_open(&f, fixture_dir, 2);
    struct qwenrt_error err = {0};
    size_t n_out = (size_t)f.G * f.V;
    float *orig = malloc(n_out * sizeof(float)), *again = malloc(n_out * sizeof(float));
    float *at_cut = malloc((size_t)f.V * sizeof(float));

    struct qwenrt_session *a = new_session(f.m, 0, kv16);
    assert_int_equal(qwenrt_session_prefill(a, f.prompt, cut, NULL, &err), QWENRT_OK);
    memcpy(at_cut, qwenrt_session_logits(a), (size_t)f.V * sizeof(float));
    struct qwenrt_checkpoint *cp = NULL;
    assert_int_equal(qwenrt_session_snapshot(a, &cp, &err), QWENRT_OK);
    assert_int_equal(qwenrt_checkpoint_n_past(cp), cut);
    continue_chat(&f, a, cut, orig);
    for (int32_t g = 0; g < f.G; g++) { /* the oracle: transformers */
        double e = rel_err(orig + (size_t)g * f.V, f.dlog + (size_t)g * f.V, (size_t)f.V);
        if (e > (kv16 ? KV16_REL_TOL : LOGITS_REL_TOL))
            fail_msg("%s: step %d after the checkpoint: rel err %.3g vs transformers", fixture_dir,
                     g, e);
    }

    /* restore into a fresh session with another context size */
    struct qwenrt_session *b = new_session(f.m, f.T + f.G + 7, kv16);
    assert_null(qwenrt_session_logits(b));
    assert_int_equal(qwenrt_session_restore(b, cp, &err), QWENRT_OK);
    assert_memory_equal(qwenrt_session_logits(b), at_cut, (size_t)f.V * sizeof(float));
    continue_chat(&f, b, cut, again);
    assert_memory_equal(again, orig, n_out * sizeof(float));

    /* rewind the original session */
    assert_int_equal(qwenrt_session_restore(a, cp, &err), QWENRT_OK);
    continue_chat(&f, a, cut, again);
    assert_memory_equal(again, orig, n_out * sizeof(float));

    /* through a file */
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/chat.qrck", dir);
    assert_int_equal(qwenrt_checkpoint_save(cp, path, &err), QWENRT_OK);
    struct qwenrt_checkpoint *loaded = NULL;
    if (qwenrt_checkpoint_load(f.m, path, &loaded, &err) != QWENRT_OK)
        fail_msg("load %s: %s", path, err.message);
    assert_int_equal(qwenrt_checkpoint_bytes(loaded), qwenrt_checkpoint_bytes(cp));
    struct qwenrt_session *c = new_session(f.m, 0, kv16);
    assert_int_equal(qwenrt_session_restore(c, loaded, &err), QWENRT_OK);
    continue_chat(&f, c, cut, again);
    assert_memory_equal(again, orig, n_out * sizeof(float));
    printf("%s: checkpoint at %d tokens, %llu bytes; continuations bit-identical\n", fixture_dir,
           cut, (unsigned long long)qwenrt_checkpoint_bytes(cp));

    remove(path);
    rmdir(dir);
    qwenrt_checkpoint_free(loaded);
    qwenrt_checkpoint_free(cp);
    qwenrt_session_free(c);
    qwenrt_session_free(b);
    qwenrt_session_free(a);
    free(orig), free(again), free(at_cut);
    ref_fixture_close(&f);
}

static void test_qwen35_round_trip(void **st)
{
    (void)st;
    round_trip("tests/data/qwen35-tiny-f32", 40, false);
}
static void test_qwen35_round_trip_odd(void **st)
{
    (void)st;
    round_trip("tests/data/qwen35-tiny-bf16", 3, false);
}
static void test_qwen3_round_trip(void **st)
{
    (void)st;
    round_trip("tests/data/qwen3-tiny-f32", 17, false);
}
static void test_round_trip_kv_f16(void **st)
{
    (void)st;
    round_trip("tests/data/qwen3-tiny-bf16", 11, true);
    round_trip("tests/data/qwen35-tiny-bf16", 5, true);
}

static void write_bytes(const char *path, const uint8_t *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_true(n == 0 || fwrite(data, n, 1, fp) == 1);
    fclose(fp);
}

static uint8_t *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *d = malloc(*n);
    assert_true(fread(d, *n, 1, fp) == 1);
    fclose(fp);
    return d;
}

/* load must fail with status and a message containing `why` */
static void expect_refused(const struct qwenrt_model *m, const char *path, qwenrt_status status,
                           const char *why)
{
    struct qwenrt_checkpoint *cp = (struct qwenrt_checkpoint *)1;
    struct qwenrt_error err = {0};
    qwenrt_status st = qwenrt_checkpoint_load(m, path, &cp, &err);
    if (st != status || !strstr(err.message, why))
        fail_msg("expected %s ('%s'), got %s: %s", qwenrt_status_name(status), why,
                 qwenrt_status_name(st), err.message);
    assert_null(cp);
}

static void test_refusals(void **st)
{
    (void)st;
    struct ref_fixture f, g, q3;
    ref_fixture_open(&f, "tests/data/qwen35-tiny-f32", 2);
    ref_fixture_open(&g, "tests/data/qwen35-tiny-bf16", 2); /* same geometry, other weights */
    ref_fixture_open(&q3, "tests/data/qwen3-tiny-f32", 2);
    struct qwenrt_error err = {0};
    struct qwenrt_session *a = new_session(f.m, 0, false);
    assert_int_equal(qwenrt_session_prefill(a, f.prompt, 40, NULL, &err), QWENRT_OK);
    struct qwenrt_checkpoint *cp = NULL;
    assert_int_equal(qwenrt_session_snapshot(a, &cp, &err), QWENRT_OK);
    char dir[64], path[128], bad[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.qrck", dir);
    snprintf(bad, sizeof(bad), "%s/bad.qrck", dir);
    assert_int_equal(qwenrt_checkpoint_save(cp, path, &err), QWENRT_OK);

    /* another model */
    expect_refused(g.m, path, QWENRT_ERR_INVALID_ARG, "another model");
    expect_refused(q3.m, path, QWENRT_ERR_INVALID_ARG, "another model");
    struct qwenrt_session *other = new_session(g.m, 0, false);
    assert_int_equal(qwenrt_session_restore(other, cp, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "another model"));
    assert_int_equal(qwenrt_session_n_past(other), 0);

    /* truncated at many lengths */
    size_t n;
    uint8_t *data = read_bytes(path, &n);
    size_t cuts[] = {0, 1, 8, 100, 383, 384, 385, 384 + 4096, n / 2, n - 4, n - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        write_bytes(bad, data, cuts[i]);
        expect_refused(f.m, bad, QWENRT_ERR_FORMAT, "truncated");
    }
    /* a byte too many, a flipped bit in the state, in the header, a bad magic */
    uint8_t *longer = malloc(n + 1);
    memcpy(longer, data, n);
    longer[n] = 0;
    write_bytes(bad, longer, n + 1);
    expect_refused(f.m, bad, QWENRT_ERR_FORMAT, "oversized");
    data[n - 100] ^= 1;
    write_bytes(bad, data, n);
    expect_refused(f.m, bad, QWENRT_ERR_FORMAT, "corrupted");
    data[n - 100] ^= 1;
    data[40] ^= 1; /* n_past */
    write_bytes(bad, data, n);
    expect_refused(f.m, bad, QWENRT_ERR_FORMAT, "header is corrupted");
    data[40] ^= 1;
    data[0] = 'X';
    write_bytes(bad, data, n);
    expect_refused(f.m, bad, QWENRT_ERR_FORMAT, "not a qwenrt checkpoint");
    snprintf(bad, sizeof(bad), "%s/missing.qrck", dir);
    expect_refused(f.m, bad, QWENRT_ERR_IO, "cannot open");

    /* a context too small; the session stays as it was */
    struct qwenrt_session *small = new_session(f.m, 16, false);
    assert_int_equal(qwenrt_session_prefill(small, f.prompt, 5, NULL, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_restore(small, cp, &err), QWENRT_ERR_LIMIT);
    assert_non_null(strstr(err.message, "context"));
    assert_int_equal(qwenrt_session_n_past(small), 5);

    /* saving where no file can be made */
    assert_int_equal(qwenrt_checkpoint_save(cp, "/nonexistent-dir/x.qrck", &err), QWENRT_ERR_IO);

    /* allocation failures */
    struct qwenrt_checkpoint *c2 = NULL;
    for (int64_t k = 0; k < 2; k++) {
        alloc_fault_after(k);
        qwenrt_status s = qwenrt_session_snapshot(a, &c2, &err);
        alloc_fault_after(-1);
        assert_int_equal(s, QWENRT_ERR_NOMEM);
        assert_null(c2);
    }
    for (int64_t k = 0; k < 2; k++) {
        alloc_fault_after(k);
        qwenrt_status s = qwenrt_checkpoint_load(f.m, path, &c2, &err);
        alloc_fault_after(-1);
        assert_int_equal(s, QWENRT_ERR_NOMEM);
        assert_null(c2);
    }
    printf("refusals: last message: %s\n", err.message);

    remove(path);
    remove(bad);
    snprintf(bad, sizeof(bad), "%s/bad.qrck", dir);
    remove(bad);
    rmdir(dir);
    free(longer);
    free(data);
    qwenrt_checkpoint_free(cp);
    qwenrt_session_free(small);
    qwenrt_session_free(other);
    qwenrt_session_free(a);
    ref_fixture_close(&q3);
    ref_fixture_close(&g);
    ref_fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen35_round_trip),
        cmocka_unit_test(test_qwen35_round_trip_odd),
        cmocka_unit_test(test_qwen3_round_trip),
        cmocka_unit_test(test_round_trip_kv_f16),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
