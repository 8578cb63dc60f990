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
 * - failing any allocation of such a load returns an error without leaking (ASan);
 * - the types qwenrt only reads (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS): blocks built by
 *   hand give the values their layout defines; Q5_0 and IQ4_NL as Q8_0 and Q3_K as Q6_K are
 *   exact, the others their
 *   nearest f16; a model stored in each loads for the CPU (converted) and computes the logits of
 *   the same model stored as the f32 values of its blocks.
 */
#include "testutil.h"

#include <unistd.h>

#include "base/alloc.h"
#include "base/half.h"
#include "format/gguf.h"
#include "quant/blocks.h"
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
    assert_int_equal(transcode_target(QR_Q8_1), QR_DTYPE_INVALID); /* not dequantisable */
    uint8_t src[64] = {0}, dst[256];
    assert_false(transcode_rows(QR_Q8_1, src, dst, 32, 1));
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

/* Logits of the prompt 1..T under model m (CPU session, an f32 KV cache whatever the weights'
 * type: the default would round K and V to f16 for quantised and 16-bit weights only), caller
 * frees. */
static float *prompt_logits(struct qwenrt_model *m, int32_t T)
{
    struct qwenrt_error err = {0};
    struct qwenrt_session *s = NULL;
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.kv_type = QWENRT_KV_F32;
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
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
 * name and shape in the transcoded one, and so are the layer matrices (not the embedding) of
 * type `with_layers` (QR_DTYPE_INVALID: none); every other keeps its type and bytes. */
static void assert_only_from_transcoded(const struct qwenrt_model *plain, const struct qwenrt_model *tc,
                                        enum qr_dtype from, enum qr_dtype to, enum qr_dtype with_layers)
{
    const struct qr_tensor *a[1 + 16 * QR_MAX_LAYERS], *b[1 + 16 * QR_MAX_LAYERS];
    int n = matrices(plain, a);
    assert_int_equal(matrices(tc, b), n);
    for (int i = 0; i < n; i++) {
        if (a[i]->dtype != from && (i == 0 || a[i]->dtype != with_layers)) {
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
                            enum qr_dtype to, enum qr_dtype with_layers, bool f32_x, int *moved, int *kept)
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
    assert_only_from_transcoded(plain, tc, from, to, with_layers);
    *kept = count_dtype(plain, from);
    *moved = count_dtype(tc, to) - count_dtype(plain, to);
    struct qwenrt_model_info ip, it;
    qwenrt_model_get_info(plain, &ip);
    qwenrt_model_get_info(tc, &it);
    assert_int_equal(ip.n_converted, 0);
    assert_int_equal(it.n_converted, *moved);
    assert_int_equal(count_dtype(tc, from), 0);
    assert_ptr_equal(tc->w.output, tc->w.tok_embd); /* tied: one copy */
    if (*moved > 0)
        assert_true(tc->weight_bytes > plain->weight_bytes); /* the copies are larger */
    else
        assert_int_equal(tc->weight_bytes, plain->weight_bytes);
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
        double e = compare_loads(path, refuse_q4_0, QR_Q4_0, QR_Q8_0, QR_DTYPE_INVALID, false, &moved, &kept);
        printf("%s q4_0 -> q8_0: %d of %d matrices, logits rel diff %.3g\n", archs[a], moved, kept, e);
        assert_true(kept > 0);
        assert_int_equal(moved, kept);
        assert_true(e <= 1e-5);
    }
}

/* Q5_K_M as F16 for its Q5_K matrices and, with them, its Q6_K layer matrices (uniform
 * layers; the embedding keeps Q6_K), both loads' quantised products with x in f32: each weight
 * moves by at most 2^-11 relative (test_others_as_f16_nearest), the logits by ~1e-3 as f16
 * files do (test_gguf_model); a wrong layout or element order moves them by O(1). (With the
 * fast kernels the plain load rounds x to 8 bits: 2.5e-2.) With keep_layer_types the Q6_K
 * layer matrices stay; a Q4_K_M file, where nothing becomes F16, keeps every matrix as it is. */
static void test_q5_k_model_as_f16(void **st)
{
    (void)st;
    char path[256];
    int moved, kept;
    synth_model("qwen3-tiny", EXPORT_Q5_K_M, true, path, sizeof(path));
    struct qwenrt_error err = {0};
    struct qwenrt_model *plain = NULL;
    assert_int_equal(qwenrt_model_load(path, NULL, &plain, &err), QWENRT_OK);
    int q6_layers = count_dtype(plain, QR_Q6_K) - (plain->w.tok_embd->dtype == QR_Q6_K);
    qwenrt_model_free(plain);
    double e = compare_loads(path, refuse_q5_k, QR_Q5_K, QR_F16, QR_Q6_K, true, &moved, &kept);
    printf("qwen3-tiny (256 wide) q5_k_m -> f16: %d of %d Q5_K matrices and %d Q6_K layer matrices, logits rel "
           "diff %.3g\n", kept, kept, q6_layers, e);
    assert_true(kept > 0);
    assert_true(q6_layers > 0);
    assert_int_equal(moved, kept + q6_layers);
    assert_true(e <= 5e-3);
    /* with keep_layer_types the Q6_K layer matrices stay */
    struct qwenrt_model_params keep = qwenrt_model_default_params();
    keep.keep_layer_types = true;
    struct qwenrt_model *tc = NULL;
    assert_int_equal(model_load_for(path, &keep, refuse_q5_k, &tc, &err), QWENRT_OK);
    assert_int_equal(count_dtype(tc, QR_Q6_K), q6_layers + (tc->w.tok_embd->dtype == QR_Q6_K));
    assert_int_equal(count_dtype(tc, QR_Q5_K), 0);
    qwenrt_model_free(tc);
    synth_model("qwen3-tiny", EXPORT_Q4_K_M, true, path, sizeof(path));
    compare_loads(path, refuse_q5_k, QR_Q5_K, QR_F16, QR_DTYPE_INVALID, true, &moved, &kept); /* all kept */
    assert_int_equal(kept, 0);
    assert_int_equal(moved, 0);
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

/* ---- the types qwenrt only reads ---- */

static uint16_t h(float v) { return f32_to_f16(v); }

/* Q4_1 / Q5_0 / Q5_1 blocks built by hand: the values their layouts define. */
static void test_legacy_blocks_by_hand(void **st)
{
    (void)st;
    float y[32];
    struct block_q4_1 a = {.d = h(0.5f), .m = h(-1.0f)};
    a.qs[0] = 0x21, a.qs[15] = 0xF0; /* element 0: 1, 16: 2, 15: 0, 31: 15 */
    quant_dequant_q4_1(&a, y, 1);
    assert_true(y[0] == -0.5f && y[16] == 0.0f && y[15] == -1.0f && y[31] == 6.5f && y[1] == -1.0f);

    struct block_q5_0 b = {.d = h(0.25f), .qh = {0x01, 0x00, 0x02, 0x80}}; /* bits 0, 17, 31 */
    b.qs[0] = 0x3F, b.qs[1] = 0x3F, b.qs[15] = 0xF0;
    quant_dequant_q5_0(&b, y, 1);
    /* 0: 15|16 -> 31 - 16; 16: 3 (bit 16 clear) - 16; 17: 3|16 - 16; 31: 15|16 - 16; 15: 0 - 16 */
    assert_true(y[0] == 3.75f && y[16] == -3.25f && y[17] == 0.75f && y[31] == 3.75f && y[15] == -4.0f);

    struct block_q5_1 c = {.d = h(2.0f), .m = h(1.0f), .qh = {0x00, 0x01, 0x00, 0x00}}; /* bit 8 */
    c.qs[8] = 0x71;
    quant_dequant_q5_1(&c, y, 1);
    assert_true(y[8] == 35.0f && y[24] == 15.0f && y[0] == 1.0f); /* (1|16)·2 + 1, 7·2 + 1 */
}

/* Q2_K / Q3_K super-blocks built by hand. */
static void test_k_low_bits_by_hand(void **st)
{
    (void)st;
    float y[256];
    struct block_q2_k a = {.d = h(1.0f), .dmin = h(0.5f)};
    a.scales[0] = 0x21;  /* sub-block 0: scale 1, min 2 */
    a.scales[2] = 0x03;  /* sub-block 2 (elements 32..47): scale 3, min 0 */
    a.scales[9] = 0xF4;  /* sub-block 9 (elements 144..159): scale 4, min 15 */
    a.scales[10] = 0x12; /* sub-block 10 (elements 160..175): scale 2, min 1 */
    a.qs[0] = 0xE4;      /* bits 0-1: 0 (element 0), 2-3: 1 (element 32), 4-5: 2, 6-7: 3 */
    a.qs[32] = 0x0C;     /* half 1, l = 0, bits 2-3 (j = 1): 3 -> element 128 + 32 = 160 */
    a.qs[48] = 0x03;     /* half 1, l = 16, bits 0-1 (j = 0): 3 -> element 144 */
    quant_dequant_q2_k(&a, y, 1);
    assert_true(y[0] == -1.0f);   /* 1·1·0 − 0.5·2 */
    assert_true(y[32] == 3.0f);   /* 1·3·1 − 0 */
    assert_true(y[96] == 0.0f);   /* sub-block 6: scale 0, min 0 */
    assert_true(y[144] == 4.5f);  /* 4·3 − 0.5·15 */
    assert_true(y[160] == 5.5f);  /* 2·3 − 0.5·1 */

    struct block_q3_k b = {.d = h(0.5f)};
    b.scales[0] = 0x08; /* sub-block 0: low 4 bits 8 */
    b.scales[8] = 0x02; /* sub-block 0: high 2 bits 2 -> 40 */
    b.scales[5] = 0x10; /* sub-block 13: low 4 bits in byte 13 % 8's high nibble: 1 */
    b.scales[9] = 0xC0; /* sub-block 13: high bits (byte 8 + 13 % 4, shift 2·3) 3 -> 49 */
    b.qs[0] = 0x03;     /* element 0: 3 */
    b.qs[1] = 0x03;     /* element 1: 3 */
    b.hmask[0] = 0x01;  /* element 0 keeps 3; element 1's bit clear: 3 − 4 */
    b.qs[53] = 0x40;    /* half 1, j = 3, l = 21: element 128 + 96 + 21 = 245 (sub-block 15) */
    b.qs[37] = 0x0C;    /* half 1, j = 1, l = 5: element 128 + 32 + 5 = 165 (sub-block 10) */
    b.hmask[5] = 0x20;  /* bit 4·1 + 1 for element 165 */
    quant_dequant_q3_k(&b, y, 1);
    assert_int_equal(quant_q3_k_scale(b.scales, 0), 40);
    assert_int_equal(quant_q3_k_scale(b.scales, 13), 49);
    assert_true(y[0] == 0.5f * 8.0f * 3.0f);
    assert_true(y[1] == 0.5f * 8.0f * -1.0f);
    assert_true(y[165] == 0.5f * -32.0f * 3.0f); /* sub-block 10's scale 0 − 32, hmask set */
    assert_true(y[245] == 0.5f * -32.0f * -3.0f); /* level 1, hmask clear: 1 − 4 */
    assert_true(y[2] == 0.5f * 8.0f * -4.0f);     /* level 0, hmask clear */
}

/* IQ4_NL / IQ4_XS blocks built by hand: the levels table and IQ4_XS's split scales. */
static void test_iq4_blocks_by_hand(void **st)
{
    (void)st;
    float y[256];
    struct block_iq4_nl a = {.d = h(0.5f)};
    a.qs[0] = 0xF0, a.qs[3] = 0x78; /* element 0: index 0, 16: 15, 3: 8, 19: 7 */
    quant_dequant_iq4_nl(&a, y, 1);
    assert_true(y[0] == -63.5f && y[16] == 56.5f && y[3] == 0.5f && y[19] == -5.0f && y[1] == -63.5f);

    struct block_iq4_xs b = {.d = h(0.25f), .scales_h = 0x2 << 6}; /* sub-block 3: high bits 2 */
    b.scales_l[1] = 0x50;       /* sub-block 3 (byte 1, high nibble): low bits 5 -> 37 */
    b.scales_l[0] = 0x0A;       /* sub-block 0: 10 (high bits 0) */
    b.qs[16 * 3 + 2] = 0x9E;    /* sub-block 3, element 2: index 14; element 18: index 9 */
    b.qs[0] = 0x08;             /* sub-block 0, element 0: index 8 */
    quant_dequant_iq4_xs(&b, y, 1);
    assert_int_equal(quant_iq4_xs_scale(&b, 3), 37);
    assert_true(y[96 + 2] == 0.25f * 5.0f * 89.0f);
    assert_true(y[96 + 18] == 0.25f * 5.0f * 13.0f);
    assert_true(y[0] == 0.25f * -22.0f * 1.0f);
    assert_true(y[40] == 0.25f * -32.0f * -127.0f); /* sub-block 1: scale 0, index 0 */
}

/* n blocks of type t: random bytes, with each f16 scale field set to a finite value of
 * magnitude ~scale (caller frees). */
static uint8_t *random_blocks(enum qr_dtype t, int64_t nb, float scale)
{
    const struct qr_dtype_traits *tr = dtype_traits(t);
    uint8_t *b = malloc((size_t)(nb * tr->type_size));
    for (int64_t i = 0; i < nb * tr->type_size; i++)
        b[i] = (uint8_t)(urand() * 127.0f + 128.0f);
    /* where each type keeps its f16 fields: offset of d, and of m / dmin (-1: none) */
    int d_off = t == QR_Q2_K ? 80 : t == QR_Q3_K ? 108 : 0;
    int m_off = t == QR_Q4_1 || t == QR_Q5_1 ? 2 : t == QR_Q2_K ? 82 : -1;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *blk = b + i * tr->type_size;
        uint16_t d = f32_to_f16(scale * (0.5f + 0.5f * fabsf(urand()))), m = f32_to_f16(scale * 4.0f * urand());
        memcpy(blk + d_off, &d, 2);
        if (m_off >= 0)
            memcpy(blk + m_off, &m, 2);
    }
    return b;
}

/* Q5_0 as Q8_0 and Q3_K as Q6_K: the same floats; Q4_1, Q5_1, Q2_K as F16: the nearest. */
static void test_read_only_types_transcoded(void **st)
{
    (void)st;
    const enum qr_dtype types[] = {QR_Q5_0, QR_Q3_K, QR_IQ4_NL, QR_Q4_1, QR_Q5_1, QR_Q2_K, QR_IQ4_XS};
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        enum qr_dtype t = types[k], to = transcode_target(t);
        int64_t K = 512, n = 5, nb = K / dtype_traits(t)->block_size * n;
        size_t out_rb;
        uint8_t *src = random_blocks(t, nb, 0.01f);
        assert_true(dtype_row_bytes(to, K, &out_rb));
        uint8_t *dst = malloc(out_rb * (size_t)n);
        assert_true(transcode_rows(t, src, dst, K, n));
        float *v = malloc((size_t)(K * n) * 4), *w = malloc((size_t)(K * n) * 4);
        assert_true(quant_dequantize_row(t, src, v, K * n));
        assert_true(quant_dequantize_row(to, dst, w, K * n));
        for (int64_t i = 0; i < K * n; i++) {
            if (to == QR_F16)
                assert_nearest_f16(((const uint16_t *)dst)[i], v[i]);
            else if (memcmp(&v[i], &w[i], 4))
                fail_msg("%s as %s: element %lld is %.9g, was %.9g", dtype_traits(t)->name,
                         dtype_traits(to)->name, (long long)i, w[i], v[i]);
        }
        assert_int_equal(to, t == QR_Q5_0 || t == QR_IQ4_NL ? QR_Q8_0 : t == QR_Q3_K ? QR_Q6_K : QR_F16);
        free(v), free(w), free(src), free(dst);
    }
}

/* Writes the GGUF at src again twice: at typed with every matrix whose rows are whole blocks
 * of t as random blocks of t, and at f32 with those matrices as the blocks' f32 values; the
 * rest (vectors, metadata) as they are. Returns how many matrices were replaced. */
static int write_typed_pair(const char *src, enum qr_dtype t, float scale, const char *typed, const char *f32)
{
    struct qwenrt_error err = {0};
    struct gguf_file gf;
    struct gguf_writer *wt = NULL, *wf = NULL;
    assert_int_equal(gguf_open(&gf, src, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_init(&wt, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_init(&wf, &err), QWENRT_OK);
    for (int64_t i = 0; i < gf.n_kv; i++) {
        assert_int_equal(gguf_writer_set(wt, gf.kvs[i].key, &gf.kvs[i].value), QWENRT_OK);
        assert_int_equal(gguf_writer_set(wf, gf.kvs[i].key, &gf.kvs[i].value), QWENRT_OK);
    }
    void *owned[2 * 64];
    int n_owned = 0, replaced = 0;
    int64_t bs = dtype_traits(t)->block_size;
    for (int64_t i = 0; i < gf.n_tensors; i++) {
        const struct qr_tensor *x = &gf.tensors[i];
        const void *dt = x->data, *df = x->data;
        enum qr_dtype ty = x->dtype;
        if (x->n_dims == 2 && x->ne[0] % bs == 0 && x->dtype == QR_F32) {
            int64_t n = x->ne[0] * x->ne[1];
            uint8_t *b = random_blocks(t, n / bs, scale);
            float *v = malloc((size_t)n * 4);
            assert_true(quant_dequantize_row(t, b, v, n));
            dt = owned[n_owned++] = b, df = owned[n_owned++] = v, ty = t;
            replaced++;
            assert_true(n_owned <= 2 * 64);
        }
        assert_int_equal(gguf_writer_add_tensor(wt, x->name, ty, x->n_dims, x->ne, dt), QWENRT_OK);
        assert_int_equal(gguf_writer_add_tensor(wf, x->name, QR_F32, x->n_dims, x->ne, df), QWENRT_OK);
    }
    assert_int_equal(gguf_writer_write(wt, typed, NULL, NULL, &err), QWENRT_OK);
    assert_int_equal(gguf_writer_write(wf, f32, NULL, NULL, &err), QWENRT_OK);
    gguf_writer_free(wt);
    gguf_writer_free(wf);
    for (int k = 0; k < n_owned; k++)
        free(owned[k]);
    gguf_close(&gf);
    return replaced;
}

/* A model stored in each read-only type loads for the CPU (its matrices converted) and, with x
 * in f32 throughout, computes the logits of the same model stored as the blocks' f32 values:
 * to summation order where the conversion is exact (Q5_0, Q3_K, IQ4_NL), within f16 rounding (~1e-3,
 * as f16 files) where it is not. */
static void test_read_only_type_models(void **st)
{
    (void)st;
    const enum qr_dtype types[] = {QR_Q4_1, QR_Q5_0, QR_Q5_1, QR_Q2_K, QR_Q3_K, QR_IQ4_NL, QR_IQ4_XS};
    const float scales[] = {0.004f, 0.003f, 0.003f, 0.004f, 0.0004f, 0.0003f, 0.00001f}; /* weights ~0.02-0.05 */
    char base[256], typed[256], f32[256];
    synth_model("qwen3-tiny", EXPORT_F32, true, base, sizeof(base));
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        enum qr_dtype t = types[k];
        struct qwenrt_error err = {0};
        snprintf(typed, sizeof(typed), "%s/typed-%s.gguf", tmpdir, dtype_traits(t)->name);
        snprintf(f32, sizeof(f32), "%s/typed-%s-f32.gguf", tmpdir, dtype_traits(t)->name);
        int replaced = write_typed_pair(base, t, scales[k], typed, f32);
        struct qwenrt_model *a = NULL, *b = NULL;
        if (qwenrt_model_load(typed, NULL, &a, &err) != QWENRT_OK)
            fail_msg("load %s: %s", typed, err.message);
        assert_int_equal(qwenrt_model_load(f32, NULL, &b, &err), QWENRT_OK);
        struct qwenrt_model_info info;
        qwenrt_model_get_info(a, &info);
        assert_int_equal(info.n_converted, replaced);
        assert_int_equal(count_dtype(a, transcode_target(t)), replaced);
        test_bind_f32_x(a);
        const int32_t T = 6;
        float *la = prompt_logits(a, T), *lb = prompt_logits(b, T);
        double e = rel_err(la, lb, (size_t)T * (size_t)a->hp.n_vocab);
        bool exact = transcode_target(t) != QR_F16;
        printf("%s model (%d matrices as %s) vs its f32 values: logits rel diff %.3g\n", dtype_traits(t)->name,
               replaced, dtype_traits(transcode_target(t))->name, e);
        assert_true(replaced > 0);
        assert_true(e <= (exact ? 1e-5 : 2e-3)); /* measured 1.5-4e-7; 2-4e-5, IQ4_XS 5.4e-4 */
        free(la), free(lb);
        qwenrt_model_free(a);
        qwenrt_model_free(b);
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
        cmocka_unit_test(test_legacy_blocks_by_hand),
        cmocka_unit_test(test_k_low_bits_by_hand),
        cmocka_unit_test(test_iq4_blocks_by_hand),
        cmocka_unit_test(test_read_only_types_transcoded),
        cmocka_unit_test(test_read_only_type_models),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
