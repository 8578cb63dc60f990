/*
 * matmul_q_avx512vnni.c — AVX-512 VNNI block dots for quantised weights:
 * matmul.{q8_0,q4_0,q4_k,q5_k,q6_k}.avx512vnni (driver and maths: matmul_quant.h/.c).
 *
 * Compiled without -march: every function carries TARGET; matmul.c registers the variants as
 * needing CPU_AVX512VNNI (which implies F/BW/DQ/VL) and CPU_AVX2 (F16C for the f16 scales).
 * vpdpbusd multiplies unsigned by signed bytes and adds groups of 4 into int32 lanes:
 * - Q8_0, Q4_0 (levels −8..7): signed weights, so |w| goes in as the unsigned operand and x
 *   takes w's sign (x is never −128: activations are clamped to ±127). Two 32-blocks per zmm.
 * - Q4_K, Q5_K (levels 0..15 / 0..31): unsigned as they are; the nibbles of each 32-byte
 *   chunk are rearranged to [low | high] so they line up with 64 contiguous x bytes; lane sums
 *   times the sub-block scale (vpmulld) accumulate in int32 (at most 31·127·32·63·8 < 2^31);
 *   the mins use Q8_K's bsums: dmin·Σ_j m_j·Σx_j.
 * - Q6_K (levels 0..63, offset 32): unsigned dot, and the offset as 32·Σ_s sc_s·bsum_s.
 * Weight blocks are unpacked once per call and reused for each of nx (≤ 4) tokens.
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/matmul_quant.h"
#include "quant/blocks.h"

#define TARGET                                                                               \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,f16c,fma")))
#define INLINE static inline __attribute__((always_inline)) TARGET

INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

INLINE const void *xrow(const void *xq, size_t xs, int j)
{
    return (const uint8_t *)xq + (size_t)j * xs;
}

/* Two 32-byte halves into one zmm. */
INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

INLINE __m512 join_scales(float s0, float s1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

/* ---- Q8_0 and Q4_0 against Q8_0 activations: blocks in pairs ---- */

/* Signed weight bytes wq (64 = two blocks) with scales dw0, dw1, against each token. */
INLINE void dot_pair(__m512i wq, float dw0, float dw1, const void *xq, size_t xs, int64_t i,
                     int nx, __m512 *acc, int both)
{
    __m512i aw = _mm512_abs_epi8(wq);
    __mmask64 neg = _mm512_movepi8_mask(wq);
    for (int j = 0; j < nx; j++) {
        const struct block_q8_0 *x = xrow(xq, xs, j);
        __m512i xv = both ? join256(_mm256_loadu_si256((const void *)x[i].qs),
                                    _mm256_loadu_si256((const void *)x[i + 1].qs))
                          : _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)x[i].qs));
        xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, xv);
        float s1 = both ? dw1 * h2f(x[i + 1].d) : 0.0f;
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), join_scales(dw0 * h2f(x[i].d), s1), acc[j]);
    }
}

INLINE void finish(const __m512 *acc, int nx, float *out)
{
    for (int j = 0; j < nx; j++)
        out[j] = _mm512_reduce_add_ps(acc[j]);
}

INLINE void dot_q8_0_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q8_0 *b = w;
    __m512 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        __m512i wq = join256(_mm256_loadu_si256((const void *)b[i].qs),
                             _mm256_loadu_si256((const void *)b[i + 1].qs));
        dot_pair(wq, h2f(b[i].d), h2f(b[i + 1].d), xq, xs, i, nx, acc, 1);
    }
    if (i < nb) {
        __m512i wq = _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)b[i].qs));
        dot_pair(wq, h2f(b[i].d), 0.0f, xq, xs, i, nx, acc, 0);
    }
    finish(acc, nx, out);
}

/* 16 nibble bytes -> 32 levels − 8 (element l: low nibble of byte l, element l+16: high). */
INLINE __m256i q4_0_levels(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const void *)qs);
    __m128i m = _mm_set1_epi8(0xF), e = _mm_set1_epi8(8);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m), e);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), e);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

INLINE void dot_q4_0_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q4_0 *b = w;
    __m512 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        __m512i wq = join256(q4_0_levels(b[i].qs), q4_0_levels(b[i + 1].qs));
        dot_pair(wq, h2f(b[i].d), h2f(b[i + 1].d), xq, xs, i, nx, acc, 1);
    }
    if (i < nb)
        dot_pair(_mm512_zextsi256_si512(q4_0_levels(b[i].qs)), h2f(b[i].d), 0.0f, xq, xs, i, nx,
                 acc, 0);
    finish(acc, nx, out);
}

/* ---- K quants against Q8_K activations ---- */

/* Q4_K/Q5_K packed scales -> 8 scale bytes and 8 min bytes (low 6 bits of the first four
 * bytes, then low nibbles of bytes 8-11 with the top two bits of bytes 0-3 / 4-7). */
INLINE void k_scales(const uint8_t s[12], uint64_t *sc, uint64_t *mn)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    uint32_t sc_hi = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    uint32_t mn_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    *sc = (uint64_t)(w0 & 0x3F3F3F3Fu) | ((uint64_t)sc_hi << 32);
    *mn = (uint64_t)(w1 & 0x3F3F3F3Fu) | ((uint64_t)mn_hi << 32);
}

/* Per-lane int32 scale for chunk c: sub-block 2c in lanes 0-7, 2c+1 in lanes 8-15. */
INLINE __m512i chunk_scales(__m128i sc8, int c)
{
    __m128i idx = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    idx = _mm_add_epi8(idx, _mm_set1_epi8((char)(2 * c)));
    return _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sc8, idx));
}

/* Chunk c of qs (32 bytes) as [low nibbles | high nibbles]: x bytes 64c..64c+63 in order. */
INLINE __m512i chunk_nibbles(const uint8_t *qs)
{
    __m256i v = _mm256_loadu_si256((const void *)qs);
    return _mm512_and_si512(join256(v, _mm256_srli_epi16(v, 4)), _mm512_set1_epi8(0xF));
}

/* Shared tail of Q4_K/Q5_K: W[4] levels, S[4] scales, mins m16 (each min twice, int16). */
INLINE void kdot_tokens(const __m512i W[4], const __m512i S[4], __m256i m16, float d, float dmin,
                        const void *xq, size_t xs, int64_t i, int nx, __m512 *acc, __m256 *accm)
{
    for (int j = 0; j < nx; j++) {
        const struct block_q8_k *x = xrow(xq, xs, j);
        const __m512i *xv = (const void *)x[i].qs;
        __m512i s = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[c],
                                            _mm512_loadu_si512(xv + c));
            s = _mm512_add_epi32(s, _mm512_mullo_epi32(p, S[c]));
        }
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d * x[i].d), acc[j]);
        __m256i ms = _mm256_madd_epi16(m16, _mm256_loadu_si256((const void *)x[i].bsums));
        accm[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * x[i].d), accm[j]);
    }
}

/* Scale and min vectors of one Q4_K/Q5_K block. */
INLINE void k_scale_vectors(const uint8_t s[12], __m512i S[4], __m256i *m16)
{
    uint64_t sc, mn;
    k_scales(s, &sc, &mn);
    __m128i sc8 = _mm_cvtsi64_si128((long long)sc);
    for (int c = 0; c < 4; c++)
        S[c] = chunk_scales(sc8, c);
    __m128i m8 = _mm_cvtsi64_si128((long long)mn);
    *m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... m7 m7 */
}

INLINE void kfinish(const __m512 *acc, const __m256 *accm, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        __m256 m = accm[j];
        __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_add_ss(m4, _mm_movehdup_ps(m4));
        out[j] = _mm512_reduce_add_ps(acc[j]) - _mm_cvtss_f32(m4);
    }
}

INLINE void dot_q4_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q4_k *b = w;
    __m512 acc[QDOT_MAX_NX];
    __m256 accm[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++) {
        acc[j] = _mm512_setzero_ps();
        accm[j] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        __m512i W[4], S[4];
        __m256i m16;
        for (int c = 0; c < 4; c++)
            W[c] = chunk_nibbles(b[i].qs + 32 * c);
        k_scale_vectors(b[i].scales, S, &m16);
        kdot_tokens(W, S, m16, h2f(b[i].d), h2f(b[i].dmin), xq, xs, i, nx, acc, accm);
    }
    kfinish(acc, accm, nx, out);
}

INLINE void dot_q5_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q5_k *b = w;
    __m512 acc[QDOT_MAX_NX];
    __m256 accm[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++) {
        acc[j] = _mm512_setzero_ps();
        accm[j] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        __m512i W[4], S[4];
        __m256i m16;
        /* qh in both halves; chunk c's low half takes bit 2c, its high half bit 2c+1 */
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)b[i].qh));
        for (int c = 0; c < 4; c++) {
            __m512i bit = join256(_mm256_set1_epi8((char)(1 << (2 * c))),
                                  _mm256_set1_epi8((char)(1 << (2 * c + 1))));
            __mmask64 hb = _mm512_test_epi8_mask(qh, bit);
            W[c] = chunk_nibbles(b[i].qs + 32 * c);
            W[c] = _mm512_mask_add_epi8(W[c], hb, W[c], _mm512_set1_epi8(16));
        }
        k_scale_vectors(b[i].scales, S, &m16);
        kdot_tokens(W, S, m16, h2f(b[i].d), h2f(b[i].dmin), xq, xs, i, nx, acc, accm);
    }
    kfinish(acc, accm, nx, out);
}

/* Q6_K levels of one half (128 elements) as two zmm: elements 0-63 and 64-127. */
INLINE void q6_half(const uint8_t *ql, const uint8_t *qh, __m512i *wa, __m512i *wb)
{
    __m512i l = _mm512_loadu_si512((const void *)ql);
    __m256i h = _mm256_loadu_si256((const void *)qh);
    __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(0x30);
    /* high bits to bit 4-5: elements 0-31 use qh bits 0-1, 32-63 bits 2-3, 64-95 bits 4-5,
     * 96-127 bits 6-7; 16-bit shifts are safe because each byte is masked afterwards */
    __m512i ha = join256(_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2));
    __m512i hb = join256(h, _mm256_srli_epi16(h, 2));
    *wa = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(ha, m2));
    *wb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(hb, m2));
}

/* int32 lane scales for 64 elements starting at sub-block s0 (4 lanes per sub-block of 16). */
INLINE __m512i q6_scales(__m128i sc, int s0)
{
    __m128i idx = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    idx = _mm_add_epi8(idx, _mm_set1_epi8((char)s0));
    return _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc, idx));
}

INLINE void dot_q6_k_n(int64_t nb, const void *w, const void *xq, size_t xs, int nx, float *out)
{
    const struct block_q6_k *b = w;
    __m512 acc[QDOT_MAX_NX];
    for (int j = 0; j < nx; j++)
        acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m512i W[4], S[4];
        __m128i sc = _mm_loadu_si128((const void *)b[i].scales);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc);
        for (int h = 0; h < 2; h++) {
            q6_half(b[i].ql + 64 * h, b[i].qh + 32 * h, &W[2 * h], &W[2 * h + 1]);
            S[2 * h] = q6_scales(sc, 8 * h);
            S[2 * h + 1] = q6_scales(sc, 8 * h + 4);
        }
        float d = h2f(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_k *x = xrow(xq, xs, j);
            const __m512i *xv = (const void *)x[i].qs;
            __m512i s = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[c],
                                                _mm512_loadu_si512(xv + c));
                s = _mm512_add_epi32(s, _mm512_mullo_epi32(p, S[c]));
            }
            /* offset: 32·Σ_s sc_s·bsum_s, as 8 int32 lanes */
            __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const void *)x[i].bsums));
            s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d * x[i].d), acc[j]);
        }
    }
    finish(acc, nx, out);
}

/* Dispatch on nx so that each token count gets a fully unrolled copy. */
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
    void matmul_##t##_avx512vnni(const struct cpu_matmul_args *a)                            \
    {                                                                                        \
        matmul_quant_run(a, dot_##t);                                                        \
    }

DOT_ENTRY(q8_0)
DOT_ENTRY(q4_0)
DOT_ENTRY(q4_k)
DOT_ENTRY(q5_k)
DOT_ENTRY(q6_k)
