/*
 * attention_avx2.c — attention.avx2: attention_avx512.c's kernel for CPUs with AVX2, FMA and
 * F16C but without AVX-512 (8 lanes instead of 16); the same maths and layout as attention_ref
 * (kernels_ref.c), which stays the oracle (tests/test_attention_simd.c runs both kernels).
 *
 * Why: without it such CPUs run attention_ref, whose reads of an f16 cache convert a row at a
 * time before a serial dot product: there an f16 KV cache decoded 2.4x slower than f32 at
 * 1,024 positions (docs/perf-log.md, session 17), so the CPU could not default to f16 as
 * llama.cpp does. Here f16 rows are read 8 elements at a time through vcvtph2ps and written
 * through vcvtps2ph (kv_store_row's rounding), q·k and the softmax-weighted V use 8-lane
 * partial sums in a fixed order per (token, head) (deterministic across thread counts), and
 * e^x is a polynomial whose 2^n is built from exponent bits in two halves (no vscalefps).
 * attention_run.c drives it (threads, the cache writes).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define ACC_DIMS 64 /* o's dimensions held in registers at once: 8 ymm of the 16 */

static TARGET float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 floats; n < 8: the first n, zeros after (no byte past the row is read) */
static TARGET __m256 load8(const float *f, int32_t n)
{
    if (n >= 8)
        return _mm256_loadu_ps(f);
    float t[8] = {0};
    memcpy(t, f, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(t);
}

/* 8 f16 values as floats, the same tail rule */
static TARGET __m256 load8h(const uint16_t *h, int32_t n)
{
    if (n >= 8)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    uint16_t t[8] = {0};
    memcpy(t, h, (size_t)n * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

/* a · b over n, b f32 (bh NULL) or f16 (bh); two accumulators (whole 16s, then the rest) */
static TARGET float dot8(const float *a, const float *b, const uint16_t *bh, int32_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int32_t d = 0;
    if (bh)
        for (; d + 16 <= n; d += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bh + d))), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8),
                                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bh + d + 8))), acc1);
        }
    else
        for (; d + 16 <= n; d += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
        }
    for (; d < n; d += 8) {
        int32_t m = n - d < 8 ? n - d : 8;
        acc0 = _mm256_fmadd_ps(load8(a + d, m), bh ? load8h(bh + d, m) : load8(b + d, m), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* n floats into f16 bits, 8 at a time (round to nearest even, as f32_to_f16), the tail one by
 * one */
static TARGET void store8h(uint16_t *dst, const float *src, int32_t n)
{
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}

/* 2^n for integer-valued n in [-151, 0], as a product of two normal powers (n = a + b, each
 * >= -76): the product underflows to a subnormal or 0 as vscalefps would. */
static TARGET __m256 pow2n(__m256 n)
{
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 fa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    __m256 fb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    return _mm256_mul_ps(fa, fb);
}

/* e^x for 8 lanes, x <= 0: attention_avx512's exp16 (degree-6 Taylor on |r| <= ln2 / 2). */
static TARGET __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 pl = _mm256_set1_ps(1.0f / 720.0f);
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.0f / 120.0f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.0f / 24.0f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.0f / 6.0f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(0.5f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.0f));
    pl = _mm256_fmadd_ps(pl, r, _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(pl, pow2n(n));
}

/* scores[0..n) = e^(scores - mx); returns their sum (8-lane partial sums) */
static TARGET float softmax_exp(float *scores, int32_t n, float mx)
{
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    int32_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p), m));
        _mm256_storeu_ps(scores + p, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (p < n) { /* the tail through a padded copy: padding lanes are e^-inf-ish, dropped */
        float t[8];
        for (int32_t i = 0; i < 8; i++)
            t[i] = p + i < n ? scores[p + i] : -INFINITY;
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(t), m));
        float et[8];
        _mm256_storeu_ps(et, e);
        for (int32_t i = 0; p + i < n; i++)
            scores[p + i] = et[i];
        for (int32_t i = n - p; i < 8; i++)
            et[i] = 0.0f;
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(et));
    }
    return hsum8(acc);
}

TARGET void attention_avx2_exp(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i += 8) {
        int32_t m = n - i < 8 ? n - i : 8;
        float t[8];
        _mm256_storeu_ps(t, exp8(load8(x + i, m)));
        memcpy(y + i, t, (size_t)m * sizeof(float));
    }
}

/* o[0 .. 64) = inv x sum over p of w[p] v_p[off ..], in 8 registers */
static TARGET void wsum64(float *o, const float *w, int32_t n, float inv, const float *vc, const uint16_t *vh,
                          int32_t kvw, int32_t off)
{
    __m256 a[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_setzero_ps();
    if (vh)
        for (int32_t p = 0; p < n; p++) {
            const uint16_t *v = vh + (size_t)p * kvw + off;
            __m256 wv = _mm256_set1_ps(w[p]);
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + 8 * i))), a[i]);
        }
    else
        for (int32_t p = 0; p < n; p++) {
            const float *v = vc + (size_t)p * kvw + off;
            __m256 wv = _mm256_set1_ps(w[p]);
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8 * i), a[i]);
        }
    __m256 s = _mm256_set1_ps(inv);
    for (int i = 0; i < 8; i++)
        _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(a[i], s));
}

/* One (token, head), as attention_avx512.c's head(): f32 rows (kc, vc) or f16 (kh, vh). */
static TARGET void head(const float *q, float *o, const float *kc, const float *vc, const uint16_t *kh,
                        const uint16_t *vh, int32_t kvw, int32_t off, int32_t hd, int32_t last, float scale,
                        float *scores)
{
    float mx = -INFINITY;
    for (int32_t p = 0; p <= last; p++) {
        size_t at = (size_t)p * kvw + off;
        scores[p] = dot8(q, kc ? kc + at : NULL, kh ? kh + at : NULL, hd) * scale;
        mx = scores[p] > mx ? scores[p] : mx;
    }
    float inv = 1.0f / softmax_exp(scores, last + 1, mx);
    int32_t d0 = 0;
    for (; d0 + ACC_DIMS <= hd; d0 += ACC_DIMS)
        wsum64(o + d0, scores, last + 1, inv, vc, vh, kvw, off + d0);
    for (int32_t d = d0; d < hd; d++) { /* the rest after whole 64s, one dimension at a time */
        float acc = 0.0f;
        for (int32_t p = 0; p <= last; p++) {
            size_t at = (size_t)p * kvw + off + d;
            acc += scores[p] * (vh ? f16_to_f32(vh[at]) : vc[at]);
        }
        o[d] = acc * inv;
    }
}

void attention_avx2(const struct plan_op *op, struct cpu_exec *ex)
{
    attention_run(op, ex, store8h, head);
}
