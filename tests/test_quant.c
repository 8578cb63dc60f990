/*
 * test_quant.c — the block formats (src/quant): byte layouts, llama.cpp agreement, and the
 * quality of our quantisers.
 *
 * 1. Known blocks: raw byte arrays filled by hand from the layout text in
 *    docs/gguf-and-quant.md (field offsets written out, not taken from our structs), with the
 *    expected values computed here from the chosen codes. Catches layout mistakes that a round
 *    trip through our own quantiser would hide.
 * 2. tests/data/quant/llama_blocks.gguf: rows quantised and dequantised by llama.cpp's ggml
 *    (see tests/data/quant/README.md); our dequantiser must reproduce ggml's values; so must
 *    it for the types qwenrt only reads (llama_blocks_read_only.gguf, bit for bit).
 * 3. Round-trip error on uniform and Gaussian data must not exceed llama.cpp's reference
 *    quantisers' error on the same data (numbers measured with ggml, recorded below).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "format/gguf.h"
#include "quant/quant.h"

/* Dequantisation is one or two f32 products per element; ggml may contract d*sc*q - dmin*m
 * into an FMA, so allow a few ulps of the row's largest value. Known blocks use exact
 * power-of-two scales and must match exactly. */
#define TOL_DEQUANT_REL 1e-6

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

static void check_exact(enum qr_dtype t, const uint8_t *blk, const float *want, int n)
{
    float got[256];
    assert_true(quant_dequantize_row(t, blk, got, n));
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i])
            fail_msg("type %d element %d: got %g want %g", (int)t, i, got[i], want[i]);
    }
}

/* Q8_0: bytes 0-1 f16 d, bytes 2..33 int8 quants. d = 0.5 (0x3800). */
static void test_known_q8_0(void **state)
{
    (void)state;
    uint8_t b[34];
    float want[32];
    put_u16(b, 0x3800);
    for (int i = 0; i < 32; i++) {
        int8_t q = (int8_t)(i * 9 - 128);
        b[2 + i] = (uint8_t)q;
        want[i] = 0.5f * q;
    }
    check_exact(QR_Q8_0, b, want, 32);
}

/* Q4_0: f16 d, then 16 bytes: element j low nibble of byte j, element j+16 its high nibble,
 * value d*(q-8). d = -0.25 (0xB400). */
static void test_known_q4_0(void **state)
{
    (void)state;
    uint8_t b[18];
    float want[32];
    int q[32];
    put_u16(b, 0xB400);
    for (int i = 0; i < 32; i++) {
        q[i] = (i * 5 + 3) % 16;
        want[i] = -0.25f * (float)(q[i] - 8);
    }
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    check_exact(QR_Q4_0, b, want, 32);
}

/* Q4_K/Q5_K scale bytes: sub-blocks 0-3 keep scale in the low 6 bits of s[j] and min in the
 * low 6 bits of s[j+4]; sub-blocks 4-7 keep their low 4 bits in s[j+4] (scale low nibble, min
 * high nibble) and their top 2 bits in the top bits of s[j-4] (scale) and s[j] (min). */
static void pack_k_scales(const int sc[8], const int mn[8], uint8_t s[12])
{
    memset(s, 0, 12);
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
}

/* The K-quant test codes: 6-bit scales and mins that use the top bits for sub-blocks 4-7. */
static const int KSC[8] = {1, 17, 33, 63, 5, 48, 31, 60};
static const int KMN[8] = {0, 9, 62, 4, 40, 2, 63, 16};

/* Q4_K: d @0, dmin @2, scales @4 (12), qs @16 (128). Element e: sub-block e/32; byte
 * 32*(e/64) + e%32, low nibble when (e/32) is even, high nibble when odd.
 * d = 0.5 (0x3800), dmin = 0.25 (0x3400). */
static void test_known_q4_k(void **state)
{
    (void)state;
    uint8_t b[144] = {0};
    float want[256];
    put_u16(b, 0x3800);
    put_u16(b + 2, 0x3400);
    pack_k_scales(KSC, KMN, b + 4);
    for (int e = 0; e < 256; e++) {
        int q = (e * 7 + e / 32) % 16, sub = e / 32;
        int byte = 32 * (e / 64) + e % 32;
        b[16 + byte] |= (uint8_t)(sub % 2 ? q << 4 : q);
        want[e] = 0.5f * (float)(KSC[sub] * q) - 0.25f * (float)KMN[sub];
    }
    check_exact(QR_Q4_K, b, want, 256);
}

/* Q5_K: d @0, dmin @2, scales @4, qh @16 (32), qs @48 (128). The 5th bit of element e is bit
 * (e/32) of qh[e%32]. */
static void test_known_q5_k(void **state)
{
    (void)state;
    uint8_t b[176] = {0};
    float want[256];
    put_u16(b, 0x3800);
    put_u16(b + 2, 0x3400);
    pack_k_scales(KSC, KMN, b + 4);
    for (int e = 0; e < 256; e++) {
        int q = (e * 11 + 3 + e / 32) % 32, sub = e / 32;
        int byte = 32 * (e / 64) + e % 32;
        b[48 + byte] |= (uint8_t)(sub % 2 ? (q & 15) << 4 : (q & 15));
        b[16 + e % 32] |= (uint8_t)((q >> 4) << sub);
        want[e] = 0.5f * (float)(KSC[sub] * q) - 0.25f * (float)KMN[sub];
    }
    check_exact(QR_Q5_K, b, want, 256);
}

/* Q6_K: ql @0 (128), qh @128 (64), int8 scales @192 (16), f16 d @208. Element e in half
 * h = e/128, r = e%128, l = r%32, k = r/32: low 4 bits in ql[64h + l + 32*(k%2)], low nibble
 * for k < 2 and high nibble for k >= 2; top 2 bits at bit 2k of qh[32h + l]; value
 * d * scales[e/16] * (q - 32). d = 0.125 (0x3000). */
static void test_known_q6_k(void **state)
{
    (void)state;
    uint8_t b[210] = {0};
    float want[256];
    int8_t sc[16];
    for (int s = 0; s < 16; s++) {
        sc[s] = (int8_t)(s * 17 - 128);
        b[192 + s] = (uint8_t)sc[s];
    }
    put_u16(b + 208, 0x3000);
    for (int e = 0; e < 256; e++) {
        int q = (e * 13 + 5) % 64, h = e / 128, r = e % 128, l = r % 32, k = r / 32;
        b[64 * h + l + 32 * (k % 2)] |= (uint8_t)(k < 2 ? (q & 15) : (q & 15) << 4);
        b[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
        want[e] = 0.125f * (float)(sc[e / 16] * (q - 32));
    }
    check_exact(QR_Q6_K, b, want, 256);
}

/* Q8_K: f32 d @0, int8 qs @4 (256), int16 bsums @260 (not used by dequantisation). */
static void test_known_q8_k(void **state)
{
    (void)state;
    uint8_t b[292] = {0};
    float want[256], d = 0.375f;
    memcpy(b, &d, 4);
    for (int e = 0; e < 256; e++) {
        int8_t q = (int8_t)((e * 37) % 255 - 127);
        b[4 + e] = (uint8_t)q;
        want[e] = d * q;
    }
    check_exact(QR_Q8_K, b, want, 256);
}

static void test_bad_sizes(void **state)
{
    (void)state;
    float x[300] = {0}, y[300];
    uint8_t q[2048] = {0};
    assert_false(quant_dequantize_row(QR_Q4_K, q, y, 255));
    assert_false(quant_quantize_row(QR_Q6_K, x, q, 288));
    assert_false(quant_quantize_row(QR_Q8_0, x, q, 33));
    assert_false(quant_dequantize_row(QR_Q8_1, q, y, 256)); /* no dequantiser */
    assert_false(quant_dequantize_row(QR_Q3_K, q, y, 255)); /* not whole super-blocks */
    assert_false(quant_quantize_row(QR_Q3_K, x, q, 256));   /* read only: no quantiser */
    assert_false(quant_can_dequantize(QR_Q8_1));
    assert_true(quant_can_dequantize(QR_Q2_K));
    assert_true(quant_can_dequantize(QR_Q5_K));
}

/* All-zero rows stay zero; a constant row is reproduced closely by every type. */
static void test_zero_and_constant(void **state)
{
    (void)state;
    static const enum qr_dtype types[] = {QR_Q8_0, QR_Q4_0, QR_Q4_K, QR_Q5_K, QR_Q6_K, QR_Q8_K};
    float x[512], y[512];
    uint8_t q[2048];
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (int c = 0; c < 2; c++) {
            float v = c ? -0.7f : 0.0f;
            for (int i = 0; i < 512; i++)
                x[i] = v;
            assert_true(quant_quantize_row(types[t], x, q, 512));
            assert_true(quant_dequantize_row(types[t], q, y, 512));
            for (int i = 0; i < 512; i++)
                if (fabsf(y[i] - v) > 0.01f * fabsf(v) + 1e-30f)
                    fail_msg("type %d const %g element %d: got %g", (int)types[t], v, i, y[i]);
        }
    }
}

/* ---- llama.cpp fixture ---- */

static double rel_rmse(const float *a, const float *b, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return sqrt(e / s);
}

static void test_llama_fixture(void **state)
{
    (void)state;
    static const char *names[] = {"q8_0", "q4_0", "q4_K", "q5_K", "q6_K"}; /* ggml spelling */
    static const enum qr_dtype types[] = {QR_Q8_0, QR_Q4_0, QR_Q4_K, QR_Q5_K, QR_Q6_K};
    struct gguf_file gf;
    struct qwenrt_error err = {0};
    assert_int_equal(gguf_open(&gf, "tests/data/quant/llama_blocks.gguf", &err), QWENRT_OK);
    const struct qr_tensor *src = gguf_find_tensor(&gf, "source");
    assert_non_null(src);
    int64_t n = tensor_nelements(src);
    float *got = xmalloc((size_t)n, sizeof(float));
    uint8_t *mine = xmalloc((size_t)n, sizeof(float));
    for (int t = 0; t < 5; t++) {
        char dn[32];
        snprintf(dn, sizeof(dn), "%s.dequant", names[t]);
        const struct qr_tensor *q = gguf_find_tensor(&gf, names[t]);
        const struct qr_tensor *ref = gguf_find_tensor(&gf, dn);
        assert_non_null(q);
        assert_non_null(ref);
        assert_int_equal(q->dtype, types[t]);
        assert_int_equal(tensor_nelements(q), n);
        const float *want = ref->data;
        assert_true(quant_dequantize_row(types[t], q->data, got, n));
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++)
            amax = fmaxf(amax, fabsf(want[i]));
        for (int64_t i = 0; i < n; i++)
            if (fabsf(got[i] - want[i]) > TOL_DEQUANT_REL * amax)
                fail_msg("%s element %lld: got %.9g, ggml %.9g", names[t], (long long)i, got[i],
                         want[i]);
        /* our quantiser on the same rows: no worse than ggml's */
        double e_llama = rel_rmse(src->data, want, n);
        assert_true(quant_quantize_row(types[t], src->data, mine, n));
        assert_true(quant_dequantize_row(types[t], mine, got, n));
        double e_ours = rel_rmse(src->data, got, n);
        print_message("%s fixture rel rmse: ggml %.6f ours %.6f\n", names[t], e_llama, e_ours);
        assert_true(e_ours <= e_llama * 1.001);
    }
    xfree(mine);
    xfree(got);
    gguf_close(&gf);
}

/* The types qwenrt only reads: ggml's blocks of the same rows (llama_blocks_read_only.gguf)
 * dequantise to ggml's values, bit for bit (the products are formed in ggml's order). */
static void test_llama_fixture_read_only(void **state)
{
    (void)state;
    static const char *names[] = {"q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "iq4_nl", "iq4_xs"};
    static const enum qr_dtype types[] = {QR_Q4_1, QR_Q5_0, QR_Q5_1, QR_Q2_K, QR_Q3_K, QR_IQ4_NL, QR_IQ4_XS};
    struct gguf_file gf;
    struct qwenrt_error err = {0};
    assert_int_equal(gguf_open(&gf, "tests/data/quant/llama_blocks_read_only.gguf", &err), QWENRT_OK);
    int64_t n = tensor_nelements(gguf_find_tensor(&gf, "source"));
    float *got = xmalloc((size_t)n, sizeof(float));
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        char dn[32];
        snprintf(dn, sizeof(dn), "%s.dequant", names[t]);
        const struct qr_tensor *q = gguf_find_tensor(&gf, names[t]), *ref = gguf_find_tensor(&gf, dn);
        assert_non_null(q);
        assert_non_null(ref);
        assert_int_equal(q->dtype, types[t]);
        assert_int_equal(tensor_nelements(q), n);
        assert_true(quant_dequantize_row(types[t], q->data, got, n));
        const float *want = ref->data;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)))
                fail_msg("%s element %lld: got %.9g, ggml %.9g", names[t], (long long)i, got[i], want[i]);
    }
    xfree(got);
    gguf_close(&gf);
}

/* ---- quantiser quality against llama.cpp's numbers ---- */

/* Same generator as the scratch program that measured ggml (an LCG and Box-Muller in double),
 * so the data are identical. */
static double lcg_uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

static double lcg_gauss(uint64_t *s)
{
    double u1 = lcg_uniform(s), u2 = lcg_uniform(s);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Relative RMSE sqrt(Σ(x−x̂)²/Σx²) of llama.cpp's reference quantisers (ggml at llama.cpp
 * commit c392e5094, ggml_quantize_chunk without importance matrix) on 65536 values: uniform
 * in [-1, 1) (seed 12345) and standard Gaussian (seed 12346). They are also the documented
 * bound per type: Q8_0 0.4-0.5 %, Q6_K 1.3-1.8 %, Q5_K 2.8-3.6 %, Q4_K 5.5-7.1 %,
 * Q4_0 6.5-8.6 %. */
static const struct {
    enum qr_dtype t;
    double uniform, gauss;
} LLAMA_RMSE[] = {
    {QR_Q8_0, 0.003767, 0.005386}, {QR_Q4_0, 0.065272, 0.086334}, {QR_Q4_K, 0.054663, 0.071444},
    {QR_Q5_K, 0.027549, 0.036255}, {QR_Q6_K, 0.013277, 0.017851},
};

static void test_rmse_vs_llama(void **state)
{
    (void)state;
    const int64_t n = 256 * 256;
    float *x = xmalloc((size_t)n, sizeof(float)), *y = xmalloc((size_t)n, sizeof(float));
    uint8_t *q = xmalloc((size_t)n, sizeof(float));
    for (int dist = 0; dist < 2; dist++) {
        uint64_t s = 12345 + (uint64_t)dist;
        for (int64_t i = 0; i < n; i++)
            x[i] = dist ? (float)lcg_gauss(&s) : (float)(2 * lcg_uniform(&s) - 1);
        for (size_t t = 0; t < sizeof(LLAMA_RMSE) / sizeof(LLAMA_RMSE[0]); t++) {
            assert_true(quant_quantize_row(LLAMA_RMSE[t].t, x, q, n));
            assert_true(quant_dequantize_row(LLAMA_RMSE[t].t, q, y, n));
            double e = rel_rmse(x, y, n);
            double bound = dist ? LLAMA_RMSE[t].gauss : LLAMA_RMSE[t].uniform;
            print_message("type %d %s rel rmse %.6f (llama.cpp %.6f)\n", (int)LLAMA_RMSE[t].t,
                          dist ? "gauss" : "uniform", e, bound);
            /* the recorded number has 4 significant digits */
            assert_true(e <= bound * 1.0005);
        }
    }
    xfree(q);
    xfree(y);
    xfree(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_q8_0),        cmocka_unit_test(test_known_q4_0),
        cmocka_unit_test(test_known_q4_k),        cmocka_unit_test(test_known_q5_k),
        cmocka_unit_test(test_known_q6_k),        cmocka_unit_test(test_known_q8_k),
        cmocka_unit_test(test_bad_sizes),         cmocka_unit_test(test_zero_and_constant),
        cmocka_unit_test(test_llama_fixture),
        cmocka_unit_test(test_llama_fixture_read_only),     cmocka_unit_test(test_rmse_vs_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
