/*
 * matmul_q_avx2.c — AVX2 block dots for quantised weights: matmul.{q8_0,q4_0,q4_k,q5_k,
 * q6_k}.avx2 (driver and maths: matmul_quant.h/.c), for CPUs without AVX-512 VNNI.
 *
 * Compiled without -march: functions carry TARGET; registered as needing CPU_AVX2 (with FMA,
 * F16C). vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16; it saturates
 * above 32767, which no operand pair here reaches (|w| ≤ 128 and |x| ≤ 127 for Q8_0/Q4_0 with
 * the sign moved onto x; levels ≤ 63 for the K types: 2·63·127 = 16002). vpmaddwd then adds
 * pairs into int32 while multiplying by the sub-block scale (K types) or by 1.
 * Q4_K/Q5_K mins and the Q6_K offset of 32 come from Q8_K's bsums, as in the AVX-512 file.
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/matmul_quant.h"
#include "quant/blocks.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

INLINE const void *xrow(const void *xq, size_t xs, int j)
{
    return (const uint8_t *)xq + (size_t)j * xs;
}

INLINE float hsum8(__m256 v)
{
    __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_add_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

INLINE __m256i ldu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Σ of 32 signed-weight × signed-x products as 8 int32 lanes. */
INLINE __m256i dot32_signed(__m256i aw, __m256i wq, __m256i xv)
{
    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wq));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

INLINE void dot_q8_0_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q8_0 *b = w;
    __m256 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i wq = ldu(b[i].qs), aw = _mm256_sign_epi8(wq, wq);
        float dw = h2f(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_0 *x = xrow(xq, xs, j);
            __m256i p = dot32_signed(aw, wq, ldu(x[i].qs));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * h2f(x[i].d)),
                                     acc[j]);
        }
    }
    for (int j = 0; j < nx; j++)
        out[j] = hsum8(acc[j]);
}

INLINE void dot_q4_0_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q4_0 *b = w;
    __m256 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm256_setzero_ps();
    const __m128i m = _mm_set1_epi8(0xF), e = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++) {
        __m128i v = _mm_loadu_si128((const void *)b[i].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m), e);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), e);
        __m256i wq = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        __m256i aw = _mm256_sign_epi8(wq, wq); /* |w|, w in −8..7 */
        float dw = h2f(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_0 *x = xrow(xq, xs, j);
            __m256i p = dot32_signed(aw, wq, ldu(x[i].qs));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * h2f(x[i].d)),
                                     acc[j]);
        }
    }
    for (int j = 0; j < nx; j++)
        out[j] = hsum8(acc[j]);
}

/* Q4_K/Q5_K scale bytes: see matmul_q_avx512vnni.c k_scales. */
INLINE void k_scales(const uint8_t s[12], uint8_t sc[8], uint8_t mn[8])
{
    uint32_t w0, w1, w2, v[4];
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    v[0] = w0 & 0x3F3F3F3Fu;
    v[1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    v[2] = w1 & 0x3F3F3F3Fu;
    v[3] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

/* Q4_K (hbits == NULL) and Q5_K: per chunk c, low nibbles are sub-block 2c, high 2c+1. */
INLINE void kdot(const uint8_t *qs, const uint8_t *qh, const uint8_t s[12], float d, float dmin,
                 const void *xq, size_t xs, int64_t i, int nx, __m256 *acc, __m256 *accm)
{
    uint8_t sc[8], mn[8];
    k_scales(s, sc, mn);
    __m128i m8 = _mm_loadl_epi64((const void *)mn);
    __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    __m256i isum[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        isum[j] = _mm256_setzero_si256();
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256i hv = qh ? ldu(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i v = ldu(qs + 32 * c);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qh) { /* 5th bit: bit 2c of qh[l] for the low element l, bit 2c+1 for the high */
            __m256i bl = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), one);
            __m256i bh = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c + 1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(bl, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(bh, 4));
        }
        __m256i slo = _mm256_set1_epi16(sc[2 * c]), shi = _mm256_set1_epi16(sc[2 * c + 1]);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_k *x = xrow(xq, xs, j);
            __m256i pl = _mm256_maddubs_epi16(lo, ldu(x[i].qs + 64 * c));
            __m256i ph = _mm256_maddubs_epi16(hi, ldu(x[i].qs + 64 * c + 32));
            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(pl, slo));
            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(ph, shi));
        }
    }
    for (int j = 0; j < nx; j++) {
        const struct block_q8_k *x = xrow(xq, xs, j);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(d * x[i].d), acc[j]);
        __m256i ms = _mm256_madd_epi16(m16, ldu(x[i].bsums));
        accm[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * x[i].d), accm[j]);
    }
}

INLINE void dot_q4_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q4_k *b = w;
    __m256 acc[QDOT_MAX_NX], accm[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = accm[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++)
        kdot(b[i].qs, NULL, b[i].scales, h2f(b[i].d), h2f(b[i].dmin), xq, xs, i, nx, acc, accm);
    for (int j = 0; j < nx; j++)
        out[j] = hsum8(acc[j]) - hsum8(accm[j]);
}

INLINE void dot_q5_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q5_k *b = w;
    __m256 acc[QDOT_MAX_NX], accm[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = accm[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++)
        kdot(b[i].qs, b[i].qh, b[i].scales, h2f(b[i].d), h2f(b[i].dmin), xq, xs, i, nx, acc,
             accm);
    for (int j = 0; j < nx; j++)
        out[j] = hsum8(acc[j]) - hsum8(accm[j]);
}

INLINE void dot_q6_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q6_k *b = w;
    __m256 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        __m256i isum[QDOT_MAX_NX];
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)b[i].scales));
        for (int j = 0; j < nx; j++) { /* offset first: −32·Σ_s sc_s·bsum_s */
            const struct block_q8_k *x = xrow(xq, xs, j);
            isum[j] = _mm256_slli_epi32(_mm256_madd_epi16(sc16, ldu(x[i].bsums)), 5);
            isum[j] = _mm256_sub_epi32(_mm256_setzero_si256(), isum[j]);
        }
        for (int h = 0; h < 2; h++) {
            __m256i l0 = ldu(b[i].ql + 64 * h), l1 = ldu(b[i].ql + 64 * h + 32);
            __m256i hq = ldu(b[i].qh + 32 * h);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hq, 4), m2));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hq, 2), m2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(hq, m2));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hq, 2), m2));
            for (int k = 0; k < 4; k++) {
                /* 32 elements = sub-blocks s, s+1: scale per 128-bit lane */
                int s = 8 * h + 2 * k;
                __m256i sv = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_set1_epi16(b[i].scales[s])),
                    _mm_set1_epi16(b[i].scales[s + 1]), 1);
                for (int j = 0; j < nx; j++) {
                    const struct block_q8_k *x = xrow(xq, xs, j);
                    __m256i p = _mm256_maddubs_epi16(q[k], ldu(x[i].qs + 128 * h + 32 * k));
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, sv));
                }
            }
        }
        float d = h2f(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_k *x = xrow(xq, xs, j);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(d * x[i].d),
                                     acc[j]);
        }
    }
    for (int j = 0; j < nx; j++)
        out[j] = hsum8(acc[j]);
}

#define DOT_ENTRY(t)                                                                         \
    static TARGET void dot_##t(int64_t nb, const void *w, const void *xq, size_t xs, int nx, \
                               float *out)                                                   \
    {                                                                                        \
        switch (nx) {                                                                        \
        case 1: dot_##t##_n(nb, w, xq, xs, 1, out); break;                                  \
        case 2: dot_##t##_n(nb, w, xq, xs, 2, out); break;                                  \
        case 3: dot_##t##_n(nb, w, xq, xs, 3, out); break;                                  \
        default: dot_##t##_n(nb, w, xq, xs, 4, out); break;                                 \
        }                                                                                    \
    }                                                                                        \
    void matmul_##t##_avx2(const struct cpu_matmul_args *a) { matmul_quant_run(a, dot_##t); }

DOT_ENTRY(q8_0)
DOT_ENTRY(q4_0)
DOT_ENTRY(q4_k)
DOT_ENTRY(q5_k)
DOT_ENTRY(q6_k)
