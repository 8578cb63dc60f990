/*
 * attention_avx512.c — attention.avx512: causal softmax attention over the f32 KV cache with
 * AVX-512 dot products; the same maths and layout as attention_ref (kernels_ref.c), which
 * stays the oracle (tests/test_attention_simd.c).
 *
 * attention_ref's q·k loop is a serial f32 sum (no reassociation without -ffast-math), so it
 * runs at one multiply-add per 4 cycles: at prefill 128 that is most of the non-matmul time.
 * Here q·k uses 16-lane partial sums (a fixed order per (token, head), independent of the
 * thread split, so results are deterministic across thread counts); softmax and the weighted
 * sum of V are vectorised the same way. attention_run.c drives it: a short decode on the
 * calling thread, the heads shared out across threads once the work or the cache rows read
 * grow (Qwen3-0.6B: past ~64 positions; at 1,024 positions, 8 MB per layer).
 * An f16 cache (seq_state.kv_f16) is read 16 elements at a time through vcvtph2ps (AVX-512F)
 * and written through vcvtps2ph (the same bits as kv_store_row's rounding); the sums run in the
 * same order as for f32.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#define TARGET __attribute__((target("avx512f,avx2,fma")))

static TARGET float dot16(const float *a, const float *b, int32_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    if (d < n) {
        __mmask16 m = (__mmask16)((1u << (n - d)) - 1);
        acc =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* o[d] += w·v[d] */
static TARGET void axpy16(float *o, float w, const float *v, int32_t n)
{
    __m512 wv = _mm512_set1_ps(w);
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(o + d,
                         _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + d), _mm512_loadu_ps(o + d)));
    for (; d < n; d++)
        o[d] += w * v[d];
}

/* 16 f16 values as floats; n < 16: the first n, zeros after (read through a zeroed copy: no
 * byte past the row is touched) */
static TARGET __m512 load16h(const uint16_t *h, int32_t n)
{
    if (n >= 16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    uint16_t t[16] = {0};
    memcpy(t, h, (size_t)n * sizeof(uint16_t));
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t));
}

/* dot16 with b an f16 row */
static TARGET float dot16h(const float *a, const uint16_t *b, int32_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), load16h(b + d, 16), acc);
    if (d < n) {
        __mmask16 m = (__mmask16)((1u << (n - d)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), load16h(b + d, n - d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* axpy16 with v an f16 row */
static TARGET void axpy16h(float *o, float w, const uint16_t *v, int32_t n)
{
    __m512 wv = _mm512_set1_ps(w);
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(o + d, _mm512_fmadd_ps(wv, load16h(v + d, 16), _mm512_loadu_ps(o + d)));
    for (; d < n; d++)
        o[d] += w * f16_to_f32(v[d]);
}

/* n floats into f16 bits, 16 at a time with vcvtps2ph (round to nearest even, as
 * f32_to_f16; NaN payloads aside), the tail one by one. kv_store_row converts one value at a
 * time: ~10% of a short prompt's time at Qwen3-0.6B's widths (docs/perf-log.md, session 16). */
static TARGET void store16h(uint16_t *dst, const float *src, int32_t n)
{
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}

/* e^x for 16 lanes, x <= 0 (a softmax's scores minus their maximum): x = n ln2 + r with
 * |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (error < 2e-7 relative, against
 * expf's 1 ulp), times 2^n through vscalefps (0 once x < -104). */
static TARGET __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x); /* ln2, high part */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);      /* ln2, the rest */
    __m512 pl = _mm512_set1_ps(1.0f / 720.0f);
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.0f / 120.0f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.0f / 24.0f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.0f / 6.0f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(0.5f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.0f));
    pl = _mm512_fmadd_ps(pl, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(pl, n);
}

/* scores[0..n) = e^(scores - mx), 16 at a time; returns their sum (16-lane partial sums). */
static TARGET float softmax_exp(float *scores, int32_t n, float mx)
{
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (int32_t p = 0; p < n; p += 16) {
        __mmask16 k = n - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - p)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, scores + p), m));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(scores + p, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

TARGET void attention_avx512_exp(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

#define ACC_DIMS 128 /* o's dimensions held in registers at once: 8 zmm */

/* o[d0 .. d0 + 128) = inv x sum over p of w[p] v_p[d0 ..], in 8 registers (no load or store
 * of o per position). */
static TARGET void wsum128(float *o, const float *w, int32_t n, float inv, const float *vc, const uint16_t *vh,
                           int32_t kvw, int32_t off)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int32_t p = 0; p < n; p++) {
        size_t at = (size_t)p * kvw + off;
        __m512 wv = _mm512_set1_ps(w[p]);
        if (vh) {
            const uint16_t *v = vh + at;
            a0 = _mm512_fmadd_ps(wv, load16h(v, 16), a0);
            a1 = _mm512_fmadd_ps(wv, load16h(v + 16, 16), a1);
            a2 = _mm512_fmadd_ps(wv, load16h(v + 32, 16), a2);
            a3 = _mm512_fmadd_ps(wv, load16h(v + 48, 16), a3);
            a4 = _mm512_fmadd_ps(wv, load16h(v + 64, 16), a4);
            a5 = _mm512_fmadd_ps(wv, load16h(v + 80, 16), a5);
            a6 = _mm512_fmadd_ps(wv, load16h(v + 96, 16), a6);
            a7 = _mm512_fmadd_ps(wv, load16h(v + 112, 16), a7);
        } else {
            const float *v = vc + at;
            a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v), a0);
            a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 16), a1);
            a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 32), a2);
            a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 48), a3);
            a4 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 64), a4);
            a5 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 80), a5);
            a6 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 96), a6);
            a7 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 112), a7);
        }
    }
    __m512 s = _mm512_set1_ps(inv);
    _mm512_storeu_ps(o, _mm512_mul_ps(a0, s));
    _mm512_storeu_ps(o + 16, _mm512_mul_ps(a1, s));
    _mm512_storeu_ps(o + 32, _mm512_mul_ps(a2, s));
    _mm512_storeu_ps(o + 48, _mm512_mul_ps(a3, s));
    _mm512_storeu_ps(o + 64, _mm512_mul_ps(a4, s));
    _mm512_storeu_ps(o + 80, _mm512_mul_ps(a5, s));
    _mm512_storeu_ps(o + 96, _mm512_mul_ps(a6, s));
    _mm512_storeu_ps(o + 112, _mm512_mul_ps(a7, s));
}

/* One (token, head): scores over positions 0..last, softmax, weighted sum of V; the cache's
 * rows are f32 (kc, vc) or f16 (kh, vh: the others NULL). The weighted sum runs 128
 * dimensions at a time in registers (head sizes 128 and 256); other widths (and the rest
 * after whole 128s) add into o position by position. */
static TARGET void head(const float *q, float *o, const float *kc, const float *vc, const uint16_t *kh,
                        const uint16_t *vh, int32_t kvw, int32_t off, int32_t hd, int32_t last, float scale,
                        float *scores)
{
    float mx = -INFINITY;
    for (int32_t p = 0; p <= last; p++) {
        size_t at = (size_t)p * kvw + off;
        scores[p] = (kh ? dot16h(q, kh + at, hd) : dot16(q, kc + at, hd)) * scale;
        mx = scores[p] > mx ? scores[p] : mx;
    }
    float inv = 1.0f / softmax_exp(scores, last + 1, mx);
    int32_t d0 = 0;
    for (; d0 + ACC_DIMS <= hd; d0 += ACC_DIMS)
        wsum128(o + d0, scores, last + 1, inv, vc, vh, kvw, off + d0);
    if (d0 == hd)
        return;
    memset(o + d0, 0, (size_t)(hd - d0) * sizeof(float));
    for (int32_t p = 0; p <= last; p++) {
        size_t at = (size_t)p * kvw + off + d0;
        if (vh)
            axpy16h(o + d0, scores[p] * inv, vh + at, hd - d0);
        else
            axpy16(o + d0, scores[p] * inv, vc + at, hd - d0);
    }
}

void attention_avx512(const struct plan_op *op, struct cpu_exec *ex)
{
    attention_run(op, ex, store16h, head);
}
