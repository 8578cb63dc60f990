/*
 * matmul_q_avx512vnni.c — AVX-512 VNNI kernels for quantised weights:
 * matmul.{q8_0,q4_0,q4_k,q5_k,q6_k}.avx512vnni (driver and maths: matmul_quant.h/.c).
 *
 * Compiled without -march: every function carries TARGET; matmul.c registers the variants as
 * needing CPU_AVX512VNNI (which implies F/BW/DQ/VL) and CPU_AVX2 (F16C for the f16 scales).
 * All five run the tiled driver (matmul_quant_run_tiled): x is quantised once per call (the
 * values of quant_quantize_row's Q8_0/Q8_K, vectorised) and laid out for the kernel: contiguous
 * int8 values, f32 scales and sums in separate arrays. A tile is 4 rows x 1 token (decode, with
 * a software prefetch of the next 4 rows) or 2 rows x up to 8 tokens (prefill), one f32 zmm
 * accumulator per (row, token):
 * - Q8_0: x stored as u8 x+128 (dpbusd's unsigned operand), signed weights; the +128 bias is
 *   removed by starting the int32 sums at −dpbusd(0x80, w) (per row, shared by the tokens).
 *   Two blocks per zmm; block scales as lane vectors (weight f16 pair x a per-lane x scale).
 * - Q4_K, Q5_K: unsigned levels by maddubs (pairs ≤ 2·31·128, no saturation) and vpdpwssd with
 *   the 6-bit sub-block scales as int16 words; x is permuted at preparation so that the low and
 *   high nibbles of 64 weight bytes line up with 64 contiguous x bytes (no weight shuffles);
 *   mins as Σ_j (−dmin·m_j)·(xd·xsum_j), one 8-lane FMA, with xd·xsum_j prepared with x.
 * - Q6_K: levels 0..63 the same way, offset 32 as 32·Σ_s sc_s·bsum_s.
 * - Q4_0: levels − 8 unpacked to the element order of Q8_0, then the Q8_0 loop.
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/matmul_quant.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#define TARGET                                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,f16c,fma")))
#define INLINE static inline __attribute__((always_inline)) TARGET

INLINE float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* Two 32-byte halves into one zmm. */
INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* ---- Q8_0 and Q4_0 weights against Q8_0 activations: blocks in pairs ---- */

/* 16 nibble bytes -> 32 levels − 8 (element l: low nibble of byte l, element l+16: high). */
INLINE __m256i q4_0_levels(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const void *)qs);
    __m128i m = _mm_set1_epi8(0xF), e = _mm_set1_epi8(8);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m), e);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), e);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* ---- tiled kernels: activation rows prepared once per call ---- */

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Decode streams 4 rows at once; the hardware prefetcher sees 4 interleaved streams and
 * falls behind, so each step of a one-token tile prefetches its share of the next tile's
 * rows (the next NR·ws bytes after this tile, `lines` cache lines per step). Prefetches
 * past the matrix are harmless (no faults). */
INLINE void prefetch_lines(const uint8_t **pf, int lines)
{
    for (int l = 0; l < lines; l++)
        _mm_prefetch((const char *)(*pf + 64 * l), _MM_HINT_T0);
    *pf += 64 * lines;
}

/* Q8_0 activation row: u8 xq[K] = x + 128 (x quantised to Q8_0), then f32 dxe[K/4]: the block
 * scale (the f16 value, widened) once per int32 lane of a dpbusd, so a 64-byte step of xq lines
 * up with 16 floats. */
static size_t q8_0_act_bytes(int64_t K)
{
    return 2 * align64((size_t)K);
}

/* Round x·id to nearest even (lrintf under the default rounding mode), clamp to ±127, narrow. */
INLINE __m128i quant16(const float *x, __m512 id)
{
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), id));
    q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    return _mm512_cvtepi32_epi8(q);
}

INLINE float amax_n(const float *x, int n)
{
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16)
        m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + j)), m);
    return _mm512_reduce_max_ps(m);
}

/* Same values as quant_quant_q8_0 (q8_0.c): d = f16(amax/127), q = lrintf(x/d) clamped to ±127;
 * vectorised, every step an exact IEEE operation of the scalar code. */
static TARGET void q8_0_prep(const float *x, int64_t K, uint8_t *xa)
{
    float *dxe = (float *)(xa + align64((size_t)K));
    const __m128i k80 = _mm_set1_epi8((char)0x80);
    for (int64_t i = 0; i < K / 32; i++) {
        const float *xb = x + 32 * i;
        float d = f16_to_f32(f32_to_f16(amax_n(xb, 32) / 127.0f));
        __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        _mm_storeu_si128((void *)(xa + 32 * i), _mm_xor_si128(quant16(xb, id), k80));
        _mm_storeu_si128((void *)(xa + 32 * i + 16), _mm_xor_si128(quant16(xb + 16, id), k80));
        _mm256_storeu_ps(dxe + 8 * i, _mm256_set1_ps(d));
    }
}

/* Scales of two Q8_0 blocks, f16 at p0 and p1: [f(p0) x 8 | f(p1) x 8]. */
INLINE __m512 scales2(const uint16_t *p0, const uint16_t *p1)
{
    __m128i h = _mm_cvtsi32_si128((int)((uint32_t)*p0 | (uint32_t)*p1 << 16));
    __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(h));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 f);
}

/* Q8_0 weights (signed) against u8 x+128: dpbusd(x', w) = Σx·w + 128·Σw, so each weight pair
 * first gets init = −dpbusd(0x80, w) (once per row, shared by the tokens); products per lane
 * are at most 4·255·128, sums stay far inside int32. Two blocks per zmm; a last odd block uses
 * the low half with the high half of w zeroed (so its lanes contribute exactly 0). Q4_0 (Q4
 * set) runs the same loop on its levels − 8, unpacked to the natural element order. */
INLINE void q80_tile(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs, float *y,
                     int64_t ldy, const int NR, const int NT, const int Q4)
{
    const int64_t nb = K / 32;
    const size_t dx_off = align64((size_t)K);
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512 acc[QTILE_ROWS][QTILE_TOKENS];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    const uint8_t *pf = w + (size_t)NR * ws;
    for (int64_t i = 0; i < nb; i += 2) {
        const int two = i + 1 < nb;
        if (NT == 1)
            prefetch_lines(&pf, (NR * (Q4 ? 36 : 68) + 63) / 64);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            __m512i wv;
            const uint16_t *d0, *d1;
            if (Q4) {
                const struct block_q4_0 *b = (const struct block_q4_0 *)(w + (size_t)r * ws) + i;
                __m256i lo = q4_0_levels(b[0].qs);
                wv = two ? join256(lo, q4_0_levels(b[1].qs)) : _mm512_zextsi256_si512(lo);
                d0 = &b[0].d, d1 = two ? &b[1].d : &b[0].d;
            } else {
                const struct block_q8_0 *b = (const struct block_q8_0 *)(w + (size_t)r * ws) + i;
                __m256i lo = _mm256_loadu_si256((const void *)b[0].qs);
                wv = two ? join256(lo, _mm256_loadu_si256((const void *)b[1].qs))
                         : _mm512_zextsi256_si512(lo);
                d0 = &b[0].d, d1 = two ? &b[1].d : &b[0].d;
            }
            __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, wv));
            __m512 dw = scales2(d0, d1);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const uint8_t *x = xa + (size_t)t * xs;
                __m512i xv =
                    two ? _mm512_load_si512((const void *)(x + 32 * i))
                        : _mm512_zextsi256_si512(_mm256_load_si256((const void *)(x + 32 * i)));
                __m512i p = _mm512_dpbusd_epi32(init, xv, wv);
                __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps((const float *)(x + dx_off) + 8 * i));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

INLINE void q8_0_tile_n(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs,
                        float *y, int64_t ldy, const int NR, const int NT)
{
    q80_tile(K, w, ws, xa, xs, y, ldy, NR, NT, 0);
}

INLINE void q4_0_tile_n(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs,
                        float *y, int64_t ldy, const int NR, const int NT)
{
    q80_tile(K, w, ws, xa, xs, y, ldy, NR, NT, 1);
}

/* Q8_K-based activation rows for the K quants: s8 xq[K] (in the order the weight unpacking
 * produces, see each type), f32 d[K/256], then per super-block 32 bytes of sums: for
 * Q4_K/Q5_K the f32 d·Σx of each sub-block of 32 (natural order: the min term becomes one
 * 8-lane FMA per row and token), for Q6_K Q8_K's int16 bsums per 16. */
static size_t k_act_bytes(int64_t K)
{
    size_t nb = (size_t)K / 256;
    return align64((size_t)K) + align64(4 * nb) + align64(32 * nb);
}

static inline float *k_act_d(const uint8_t *xa, int64_t K)
{
    return (float *)(xa + align64((size_t)K));
}

static inline void *k_act_sums(const uint8_t *xa, int64_t K)
{
    return (void *)(xa + align64((size_t)K) + align64(4 * ((size_t)K / 256)));
}

/* Q4_K/Q5_K order: 64-byte vector c of a super-block holds sub-blocks A_c then B_c with
 * (A, B) = (0,2), (1,3), (4,6), (5,7): the low and high nibbles of qs[0..63] and qs[64..127]. */
static const int k4_sub[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};

/* Same values as quant_quant_q8_k (k_quants.c): d = amax/127, q = lrintf(x·127/amax) clamped
 * to ±127, sums of the int8 values (exact integers); vectorised with the same IEEE operations. */
static TARGET void k_prep(const float *x, int64_t K, uint8_t *xa, int permute, int sums16)
{
    int64_t nb = K / 256;
    float *d = k_act_d(xa, K);
    int16_t *sums = k_act_sums(xa, K);
    float *fsums = k_act_sums(xa, K);
    for (int64_t i = 0; i < nb; i++, x += 256) {
        int s32[8];
        float amax = amax_n(x, 256);
        d[i] = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        int8_t *q = (int8_t *)xa + 256 * i;
        for (int j = 0; j < 16; j++) { /* 16 values: sub-block j/2 of 32, half j%2 */
            int sub = j / 2, pos = 16 * j;
            if (permute) { /* sub-block s goes to vector c, half h where k4_sub[c][h] == s */
                int c = (sub & 1) | (sub >> 2) << 1, h = (sub >> 1) & 1;
                pos = 64 * c + 32 * h + 16 * (j & 1);
            }
            __m128i v = quant16(x + 16 * j, id);
            _mm_storeu_si128((void *)(q + pos), v);
            int s16 = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(v));
            if (sums16)
                sums[16 * i + j] = (int16_t)s16;
            else
                s32[sub] = (j & 1) ? s32[sub] + s16 : s16;
        }
        if (!sums16)
            for (int j = 0; j < 8; j++)
                fsums[8 * i + j] = d[i] * (float)s32[j];
    }
}

static void q4_k_prep(const float *x, int64_t K, uint8_t *xa)
{
    k_prep(x, K, xa, 1, 0);
}
static void q6_k_prep(const float *x, int64_t K, uint8_t *xa)
{
    k_prep(x, K, xa, 0, 1);
}

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

/* int16 scale words for vector c: 16 words of sub-block A_c, 16 of B_c (from 8 words). */
INLINE __m512i k4_scale_vec(__m512i sc16, int c)
{
    __m512i lo = _mm512_set1_epi16((short)k4_sub[c][0]),
            hi = _mm512_set1_epi16((short)k4_sub[c][1]);
    return _mm512_permutexvar_epi16(_mm512_mask_blend_epi16(0xFFFF0000u, lo, hi), sc16);
}

/* Unpacked Q4_K/Q5_K super-block: levels W (u8, in k4 order), scale words S, d broadcast,
 * and −dmin·m_j (8 floats, upper half zero). */
struct k4_unpacked {
    __m512i W[4], S[4];
    __m512 d, negmin;
};

INLINE void k4_unpack_common(const uint16_t *dd, const uint8_t *scales, const uint8_t *qs,
                             struct k4_unpacked *u)
{
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512i q0 = _mm512_loadu_si512((const void *)qs),
            q1 = _mm512_loadu_si512((const void *)(qs + 64));
    u->W[0] = _mm512_and_si512(q0, m4);
    u->W[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    u->W[2] = _mm512_and_si512(q1, m4);
    u->W[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
    uint64_t sc, mn;
    k_scales(scales, &sc, &mn);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
#pragma GCC unroll 8
    for (int c = 0; c < 4; c++)
        u->S[c] = k4_scale_vec(sc16, c);
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    u->d = _mm512_set1_ps(h2f(dd[0]));
    u->negmin = _mm512_zextps256_ps512(_mm256_mul_ps(m, _mm256_set1_ps(-h2f(dd[1]))));
}

/* One unpacked Q4_K/Q5_K super-block against token x (activation row, super-block i):
 * xd·d·Σ_c scale-weighted (w·x) + Σ_j (−dmin·m_j)·(xd·xsum_j), into acc. maddubs pairs are
 * at most 2·31·128 (no saturation); dpwssd sums stay < 2^31. */
INLINE __m512 k4_dot(const struct k4_unpacked *u, const uint8_t *x, int64_t K, int64_t i,
                     __m512 acc)
{
    const int8_t *xq = (const int8_t *)x + 256 * i;
    __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 4; c++)
        s = _mm512_dpwssd_epi32(
            s, _mm512_maddubs_epi16(u->W[c], _mm512_load_si512((const void *)(xq + 64 * c))),
            u->S[c]);
    const float *xsum = (const float *)k_act_sums(x, K) + 8 * i;
    __m512 sd = _mm512_mul_ps(u->d, _mm512_set1_ps(k_act_d(x, K)[i]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sd, acc);
    return _mm512_fmadd_ps(u->negmin, _mm512_zextps256_ps512(_mm256_load_ps(xsum)), acc);
}

INLINE void q4_k_tile_n(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs,
                        float *y, int64_t ldy, const int NR, const int NT)
{
    const int64_t nb = K / 256;
    __m512 acc[QTILE_ROWS][QTILE_TOKENS];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    const uint8_t *pf = w + (size_t)NR * ws;
    for (int64_t i = 0; i < nb; i++) {
        if (NT == 1)
            prefetch_lines(&pf, (NR * 144 + 63) / 64);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const struct block_q4_k *b = (const struct block_q4_k *)(w + (size_t)r * ws) + i;
            struct k4_unpacked u;
            k4_unpack_common(&b->d, b->scales, b->qs, &u);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[r][t] = k4_dot(&u, xa + (size_t)t * xs, K, i, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

INLINE void q5_k_tile_n(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs,
                        float *y, int64_t ldy, const int NR, const int NT)
{
    const int64_t nb = K / 256;
    __m512 acc[QTILE_ROWS][QTILE_TOKENS];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    const uint8_t *pf = w + (size_t)NR * ws;
    for (int64_t i = 0; i < nb; i++) {
        if (NT == 1)
            prefetch_lines(&pf, (NR * 176 + 63) / 64);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const struct block_q5_k *b = (const struct block_q5_k *)(w + (size_t)r * ws) + i;
            struct k4_unpacked u;
            k4_unpack_common(&b->d, b->scales, b->qs, &u);
            /* 5th bit: sub-block j takes bit j of qh[l] (l = element within the sub-block) */
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)b->qh));
#pragma GCC unroll 8
            for (int c = 0; c < 4; c++) {
                __m512i bit = join256(_mm256_set1_epi8((char)(1 << k4_sub[c][0])),
                                      _mm256_set1_epi8((char)(1 << k4_sub[c][1])));
                u.W[c] = _mm512_mask_add_epi8(u.W[c], _mm512_test_epi8_mask(qh, bit), u.W[c],
                                              _mm512_set1_epi8(16));
            }
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[r][t] = k4_dot(&u, xa + (size_t)t * xs, K, i, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* Q6_K levels 0..63 (offset 32 applied through the sums) in natural order: half h gives
 * elements 128h..128h+63 (low nibbles of ql[64h..], qh bits 0-1 / 2-3) and 128h+64..+127 (high
 * nibbles, qh bits 4-5 / 6-7). qh is broadcast to both 256-bit halves and shifted per half;
 * 16-bit shifts are safe because each byte is masked with 0x30 afterwards. */
INLINE void q6_levels(const struct block_q6_k *b, __m512i W[4])
{
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i sl = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i sr = join256(_mm256_set1_epi16(0), _mm256_set1_epi16(2));
    for (int h = 0; h < 2; h++) {
        __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(b->qh + 32 * h)));
        __m512i ha = _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30);
        __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30);
        W[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), ha);
        W[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hb);
    }
}

INLINE void q6_k_tile_n(int64_t K, const uint8_t *w, size_t ws, const uint8_t *xa, size_t xs,
                        float *y, int64_t ldy, const int NR, const int NT)
{
    const int64_t nb = K / 256;
    __m512 acc[QTILE_ROWS][QTILE_TOKENS];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    const uint8_t *pf = w + (size_t)NR * ws;
    for (int64_t i = 0; i < nb; i++) {
        if (NT == 1)
            prefetch_lines(&pf, (NR * 210 + 63) / 64);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const struct block_q6_k *b = (const struct block_q6_k *)(w + (size_t)r * ws) + i;
            __m512i W[4], S[4];
            q6_levels(b, W);
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)b->scales));
#pragma GCC unroll 8
            for (int c = 0; c < 4; c++) { /* word k of vector c: scale 4c + k/8 */
                __m512i idx = _mm512_srli_epi16(
                    _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                     15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                    3);
                idx = _mm512_add_epi16(idx, _mm512_set1_epi16((short)(4 * c)));
                S[c] = _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(sc16));
            }
            __m512 dw = _mm512_set1_ps(h2f(b->d));
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const uint8_t *x = xa + (size_t)t * xs;
                const int8_t *xq = (const int8_t *)x + 256 * i;
                __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int c = 0; c < 4; c++)
                    s = _mm512_dpwssd_epi32(
                        s,
                        _mm512_maddubs_epi16(W[c], _mm512_load_si512((const void *)(xq + 64 * c))),
                        S[c]);
                /* offset: 32·Σ_s sc_s·bsum_s */
                __m256i off = _mm256_madd_epi16(
                    sc16,
                    _mm256_load_si256((const void *)((const int16_t *)k_act_sums(x, K) + 16 * i)));
                s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
                __m512 sx = _mm512_mul_ps(dw, _mm512_set1_ps(k_act_d(x, K)[i]));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sx, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* Tile entry. Decode (one token): QTILE_ROWS rows at once. Prefill: pairs of rows against up
 * to QTILE_TOKENS tokens (16 accumulators; the unpacked weights of one row are reused by 8
 * tokens). A fully unrolled copy per shape. */
#define NT_SWITCH(t, wr, yr, NR)                                                                   \
    switch (nt) {                                                                                  \
    case 1:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 1);                                             \
        break;                                                                                     \
    case 2:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 2);                                             \
        break;                                                                                     \
    case 3:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 3);                                             \
        break;                                                                                     \
    case 4:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 4);                                             \
        break;                                                                                     \
    case 5:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 5);                                             \
        break;                                                                                     \
    case 6:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 6);                                             \
        break;                                                                                     \
    case 7:                                                                                        \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 7);                                             \
        break;                                                                                     \
    default:                                                                                       \
        t##_tile_n(K, wr, ws, xa, xs, yr, ldy, NR, 8);                                             \
        break;                                                                                     \
    }

#define TILE_ENTRY(t, prep_fn, bytes_fn)                                                           \
    static TARGET void tile_##t(int64_t K, const uint8_t *w, size_t ws, int nr, const uint8_t *xa, \
                                size_t xs, int nt, float *y, int64_t ldy)                          \
    {                                                                                              \
        if (nt == 1 && nr == QTILE_ROWS) {                                                         \
            t##_tile_n(K, w, ws, xa, xs, y, ldy, QTILE_ROWS, 1);                                   \
            return;                                                                                \
        }                                                                                          \
        for (int r = 0; r < nr; r += 2) {                                                          \
            const uint8_t *wr = w + (size_t)r * ws;                                                \
            if (r + 1 < nr) {                                                                      \
                NT_SWITCH(t, wr, y + r, 2)                                                         \
            } else {                                                                               \
                NT_SWITCH(t, wr, y + r, 1)                                                         \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    void matmul_##t##_avx512vnni(const struct cpu_matmul_args *a)                                  \
    {                                                                                              \
        static const struct quant_tiled q = {bytes_fn, prep_fn, tile_##t};                         \
        matmul_quant_run_tiled(a, &q);                                                             \
    }

TILE_ENTRY(q8_0, q8_0_prep, q8_0_act_bytes)
TILE_ENTRY(q4_0, q8_0_prep, q8_0_act_bytes)
TILE_ENTRY(q4_k, q4_k_prep, k_act_bytes)
TILE_ENTRY(q5_k, q4_k_prep, k_act_bytes)
TILE_ENTRY(q6_k, q6_k_prep, k_act_bytes)
