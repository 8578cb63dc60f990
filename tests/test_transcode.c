/*
 * test_transcode.c — weight rows rewritten for a backend that does not compute with their type
 * (quant/transcode.h) and models loaded that way (model_load_for):
 * - Q4_0 rows as Q8_0 dequantise to the same floats, bit for bit (awkward row counts and
 *   widths); every other type as F16 gives each value's nearest f16 (checked against the f16
 *   values either side, subnormals included);
 * - types without a transcoding and widths that are not whole blocks are refused;
 * - a Q4_0 model loaded with Q4_0 refused computes the same logits as the plain load, its
 *   matrices Q8_0 and its tied output still the embedding; a Q5_K_M model's Q5_K matrices become
 *   F16 (its Q6_K ones stay) and its logits stay within the f16 rounding of the plain load's;
 * - failing any allocation of such a load returns an error without leaking (ASan).
 */
#include "testutil.h"

#include <unistd.h>

#include "base/alloc.h"
#include "base/half.h"
#include "model/model.h"
#include "quant/quant.h"
#include "quant/transcode.h"
#include "tools/gguf_export.h"
#include "tools/synth.h"

TEST_GROUP_TMPDIR("transcode")

static uint32_t rng = 12345u;

static float urand(void) /* [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

/* n_rows rows of K random values of magnitude ~scale, stored as t; caller frees. */
static void *random_rows(enum qr_dtype t, int64_t K, int64_t n_rows, float scale, size_t *row_bytes)
{
    assert_true(dtype_row_bytes(t, K, row_bytes));
    uint8_t *q = malloc(*row_bytes * (size_t)n_rows);
    float *x = malloc((size_t)K * sizeof(float));
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t i = 0; i < K; i++)
            x[i] = scale * urand();
        assert_true(quant_quantize_row(t, x, q + (size_t)r * *row_bytes, K));
    }
    free(x);
    return q;
}

static void test_targets_and_refusals(void **st)
{
    (void)st;
    assert_int_equal(transcode_target(QR_Q4_0), QR_Q8_0);
    assert_int_equal(transcode_target(QR_Q5_K), QR_F16);
    assert_int_equal(transcode_target(QR_Q4_K), QR_F16);
    assert_int_equal(transcode_target(QR_Q4_1), QR_DTYPE_INVALID); /* not dequantisable */
    uint8_t src[64] = {0}, dst[256];
    assert_false(transcode_rows(QR_Q4_1, src, dst, 32, 1));
    assert_false(transcode_rows(QR_Q4_0, src, dst, 48, 1));  /* not whole blocks of 32 */
    assert_false(transcode_rows(QR_Q5_K, src, dst, 128, 1)); /* not whole blocks of 256 */
    assert_false(transcode_rows(QR_Q4_0, src, dst, 32, -1));
    assert_true(transcode_rows(QR_Q4_0, src, dst, 32, 0)); /* no rows: nothing to do */
}

/* Q4_0 as Q8_0: the dequantised values are the same floats. */
static void test_q4_0_as_q8_0_exact(void **st)
{
    (void)st;
    const int64_t widths[] = {32, 96, 160, 1024}, rows[] = {1, 3, 7};
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
        for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
            int64_t K = widths[w], n = rows[r];
            size_t in_rb, out_rb;
            uint8_t *q4 = random_rows(QR_Q4_0, K, n, 0.5f, &in_rb);
            assert_true(dtype_row_bytes(QR_Q8_0, K, &out_rb));
            uint8_t *q8 = malloc(out_rb * (size_t)n);
            assert_true(transcode_rows(QR_Q4_0, q4, q8, K, n));
            float *a = malloc((size_t)K * 4), *b = malloc((size_t)K * 4);
            for (int64_t i = 0; i < n; i++) {
                assert_true(quant_dequantize_row(QR_Q4_0, q4 + (size_t)i * in_rb, a, K));
                assert_true(quant_dequantize_row(QR_Q8_0, q8 + (size_t)i * out_rb, b, K));
                assert_memory_equal(a, b, (size_t)K * 4);
            }
            free(a), free(b), free(q4), free(q8);
        }
}

/* h is the nearest f16 to v: no f16 next to it (one step up or down in the magnitude's bits)
 * is closer, and within 2^-11 relative or 2^-25 absolute. */
static void assert_nearest_f16(uint16_t h, float v)
{
    double e = fabs((double)f16_to_f32(h) - (double)v);
    uint16_t mag = h & 0x7fffu, sign = h & 0x8000u;
    if (mag < 0x7bffu) /* below the largest finite: the next one up */
        assert_true(e <= fabs((double)f16_to_f32((uint16_t)(sign | (mag + 1))) - (double)v));
    if (mag > 0) /* the next one down (towards zero) */
        assert_true(e <= fabs((double)f16_to_f32((uint16_t)(sign | (mag - 1))) - (double)v));
    assert_true(e <= ldexp(fabs((double)v), -11) + ldexp(1.0, -25));
}

/* Every other type as F16: each value its nearest f16; small scales reach f16's subnormals. */
static void test_others_as_f16_nearest(void **st)
{
    (void)st;
    const enum qr_dtype types[] = {QR_Q5_K, QR_Q4_K, QR_Q6_K, QR_Q8_0, QR_F32};
    const float scales[] = {1.0f, 3e-5f};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t s = 0; s < 2; s++) {
            int64_t K = 512, n = 3;
            size_t in_rb;
            uint8_t *q = random_rows(types[t], K, n, scales[s], &in_rb);
            uint16_t *h = malloc((size_t)(K * n) * 2);
            assert_true(transcode_rows(types[t], q, h, K, n));
            float *v = malloc((size_t)K * 4);
            for (int64_t r = 0; r < n; r++) {
                assert_true(quant_dequantize_row(types[t], q + (size_t)r * in_rb, v, K));
                for (int64_t i = 0; i < K; i++)
                    assert_nearest_f16(h[r * K + i], v[i]);
            }
            free(v), free(h), free(q);
        }
}

static bool refuse_q4_0(int32_t dtype) { return dtype != QR_Q4_0; }
static bool refuse_q5_k(int32_t dtype) { return dtype != QR_Q5_K; }

/* A synthetic model of preset `arch` (dims widened to whole K-quant blocks when wide), stored
 * as `type`; returns its path. */
static const char *synth_model(const char *arch, enum export_type type, bool wide, char *path, size_t len)
{
    struct model_hparams hp;
    struct qwenrt_error err = {0};
    assert_int_equal(synth_preset(arch, &hp, &err), QWENRT_OK);
    if (wide) { /* every K a multiple of 256: q, k, v, o, gate, up 256 wide, down 512 */
        hp.n_embd = 256;
        hp.n_ff = 512;
    }
    struct export_params p = {.type = type, .name = arch, .tied = true};
    snprintf(path, len, "%s/%s-%d-%d.gguf", tmpdir, arch, (int)type, (int)wide);
    if (synth_write(path, &hp, 21, &p, &err) != QWENRT_OK)
        fail_msg("synth %s: %s", arch, err.message);
    return path;
}

/* Logits of the prompt 1..T under model m (CPU session), caller frees. */
static float *prompt_logits(struct qwenrt_model *m, int32_t T)
{
    struct qwenrt_error err = {0};
    struct qwenrt_session *s = NULL;
    assert_int_equal(qwenrt_session_init(m, NULL, &s, &err), QWENRT_OK);
    int32_t ids[16];
    for (int32_t i = 0; i < T; i++)
        ids[i] = 1 + 37 * i;
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    float *lg = malloc((size_t)T * (size_t)info.n_vocab * sizeof(float));
    if (qwenrt_session_prefill(s, ids, T, lg, &err) != QWENRT_OK)
        fail_msg("prefill: %s", err.message);
    qwenrt_session_free(s);
    return lg;
}

/* The model's matrices (the embedding, then each layer's), at most 16 a layer; returns how many. */
static int matrices(const struct qwenrt_model *m, const struct qr_tensor **out)
{
    int n = 0;
    out[n++] = m->w.tok_embd;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct layer_weights *L = &m->w.layers[l];
        const struct qr_tensor *lt[] = {L->wq, L->wk, L->wv, L->wo, L->ssm_qkv, L->ssm_z, L->ssm_beta,
                                        L->ssm_alpha, L->ssm_out, L->ffn_gate, L->ffn_up, L->ffn_down};
        for (size_t i = 0; i < sizeof(lt) / sizeof(lt[0]); i++)
            if (lt[i])
                out[n++] = lt[i];
    }
    return n;
}

static int count_dtype(const struct qwenrt_model *m, enum qr_dtype t)
{
    const struct qr_tensor *ts[1 + 16 * QR_MAX_LAYERS];
    int n = matrices(m, ts), c = 0;
    for (int i = 0; i < n; i++)
        c += ts[i]->dtype == t;
    return c;
}

/* Matrix by matrix: those of type `from` in the plain load are copies of type `to` with the same
 * name and shape in the transcoded one; every other keeps its type and bytes. */
static void assert_only_from_transcoded(const struct qwenrt_model *plain, const struct qwenrt_model *tc,
                                        enum qr_dtype from, enum qr_dtype to)
{
    const struct qr_tensor *a[1 + 16 * QR_MAX_LAYERS], *b[1 + 16 * QR_MAX_LAYERS];
    int n = matrices(plain, a);
    assert_int_equal(matrices(tc, b), n);
    for (int i = 0; i < n; i++) {
        if (a[i]->dtype != from) {
            assert_int_equal(b[i]->dtype, a[i]->dtype);
            assert_int_equal(b[i]->nbytes, a[i]->nbytes);
            assert_memory_equal(b[i]->data, a[i]->data, a[i]->nbytes);
            continue;
        }
        assert_int_equal(b[i]->dtype, to);
        assert_string_equal(b[i]->name, a[i]->name);
        assert_memory_equal(b[i]->ne, a[i]->ne, sizeof(a[i]->ne));
        size_t rb;
        assert_true(dtype_row_bytes(to, a[i]->ne[0], &rb));
        assert_int_equal(b[i]->nbytes, rb * (size_t)tensor_nrows(a[i]));
    }
}

/* The plain load and the load with `refuse` against each other (f32_x: every quantised
 * product on its .exact kernel, so that only the weights differ): returns the logits' relative
 * difference; *moved / *kept count the refused type's matrices after each load. */
static double compare_loads(const char *path, bool (*refuse)(int32_t), enum qr_dtype from,
                            enum qr_dtype to, bool f32_x, int *moved, int *kept)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *plain = NULL, *tc = NULL;
    assert_int_equal(qwenrt_model_load(path, NULL, &plain, &err), QWENRT_OK);
    if (model_load_for(path, NULL, refuse, &tc, &err) != QWENRT_OK)
        fail_msg("load %s: %s", path, err.message);
    if (f32_x) { /* both sides' quantised products with x in f32 */
        test_bind_f32_x(plain);
        test_bind_f32_x(tc);
    }
    assert_only_from_transcoded(plain, tc, from, to);
    *kept = count_dtype(plain, from);
    *moved = count_dtype(tc, to) - count_dtype(plain, to);
    struct qwenrt_model_info ip, it;
    qwenrt_model_get_info(plain, &ip);
    qwenrt_model_get_info(tc, &it);
    assert_int_equal(ip.n_converted, 0);
    assert_int_equal(it.n_converted, *moved);
    assert_int_equal(count_dtype(tc, from), 0);
    assert_ptr_equal(tc->w.output, tc->w.tok_embd); /* tied: one copy */
    assert_true(tc->weight_bytes > plain->weight_bytes); /* the copies are larger */
    const int32_t T = 6;
    float *a = prompt_logits(plain, T), *b = prompt_logits(tc, T);
    double e = rel_err(b, a, (size_t)T * (size_t)plain->hp.n_vocab);
    free(a), free(b);
    qwenrt_model_free(plain);
    qwenrt_model_free(tc);
    return e;
}

/* Q4_0 models (both architectures) as Q8_0: the same values, so the same logits up to the
 * kernels' summation order (the AVX-512 VNNI kernel runs Q4_0 through Q8_0's loop: 0). */
static void test_q4_0_model_as_q8_0(void **st)
{
    (void)st;
    const char *archs[] = {"qwen3-tiny", "qwen35-tiny"};
    for (int a = 0; a < 2; a++) {
        char path[256];
        int moved, kept;
        synth_model(archs[a], EXPORT_Q4_0, false, path, sizeof(path));
        double e = compare_loads(path, refuse_q4_0, QR_Q4_0, QR_Q8_0, false, &moved, &kept);
        printf("%s q4_0 -> q8_0: %d of %d matrices, logits rel diff %.3g\n", archs[a], moved, kept, e);
        assert_true(kept > 0);
        assert_int_equal(moved, kept);
        assert_true(e <= 1e-5);
    }
}

/* Q5_K_M as F16 for its Q5_K matrices (its Q6_K ones stay), both loads' quantised products
 * with x in f32: each weight moves by at most 2^-11 relative (test_others_as_f16_nearest), the
 * logits by ~1e-3 as f16 files do (test_gguf_model); a wrong layout or element order moves
 * them by O(1). (With the fast kernels the plain load rounds x to 8 bits: 2.5e-2.) */
static void test_q5_k_model_as_f16(void **st)
{
    (void)st;
    char path[256];
    int moved, kept;
    synth_model("qwen3-tiny", EXPORT_Q5_K_M, true, path, sizeof(path));
    double e = compare_loads(path, refuse_q5_k, QR_Q5_K, QR_F16, true, &moved, &kept);
    printf("qwen3-tiny (256 wide) q5_k_m -> f16: %d of %d Q5_K matrices, logits rel diff %.3g\n", moved,
           kept, e);
    assert_true(kept > 0);
    assert_int_equal(moved, kept);
    assert_true(e <= 5e-3);
}

/* Failing each allocation of a transcoding load in turn: an error (no crash, no leak), until
 * the load succeeds. */
static void test_transcoding_load_alloc_faults(void **st)
{
    (void)st;
    char path[256];
    synth_model("qwen3-tiny", EXPORT_Q4_0, false, path, sizeof(path));
    for (int64_t n = 0;; n++) {
        struct qwenrt_error err = {0};
        struct qwenrt_model *m = NULL;
        alloc_fault_after(n);
        qwenrt_status s = model_load_for(path, NULL, refuse_q4_0, &m, &err);
        alloc_fault_after(-1);
        if (s == QWENRT_OK) {
            assert_true(n > 3);
            assert_true(count_dtype(m, QR_Q8_0) > 0);
            qwenrt_model_free(m);
            break;
        }
        assert_null(m);
        assert_int_equal(s, QWENRT_ERR_NOMEM);
        assert_true(n < 100000);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets_and_refusals),
        cmocka_unit_test(test_q4_0_as_q8_0_exact),
        cmocka_unit_test(test_others_as_f16_nearest),
        cmocka_unit_test(test_q4_0_model_as_q8_0),
        cmocka_unit_test(test_q5_k_model_as_f16),
        cmocka_unit_test(test_transcoding_load_alloc_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
