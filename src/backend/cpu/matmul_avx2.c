/*
 * matmul_avx2.c — AVX2 + FMA + F16C float-weight matmul variants: matmul.{f32,f16,bf16}.avx2.
 *
 * The same two paths as matmul_avx512.c at half the width (see there for the reasoning):
 * GEMV for T <= GEMV_MAX_T (four weight rows streamed at a time, eight ymm accumulators for
 * one token or 4 rows x 4 tokens sharing each converted weight vector, the next row group
 * prefetched; the K tail goes through zero-padded stack copies because AVX2 has
 * no masked 16-bit load), and GEMM for larger T (a panel of NR = 16 rows x KC columns converted
 * to f32 once into wp[k][16] with 8x8 register transposes, then a 6 tokens x 16 outputs
 * micro-kernel with twelve ymm accumulators; y tails use vmaskmov). Compiled without -march:
 * every function carries TARGET; matmul.c registers the variants as needing CPU_AVX2.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "backend/cpu/matmul_float.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

enum {
    GEMV_ROWS = 4,   /* weight rows per GEMV step */
    GEMV_TOKENS = 4, /* tokens per GEMV step (4 rows x 4 tokens = 16 ymm accumulators) */
    GEMV_MAX_T = 8,  /* largest T that takes the GEMV path (as in matmul_avx512.c) */
    PF_ROWS = 4,     /* GEMV prefetches the row group this many rows ahead */
    NR = 16,        /* GEMM panel: weight rows (outputs) */
    MR = 6,         /* GEMM micro-kernel: tokens */
    KC = 256,       /* GEMM panel: columns; wp is KC*NR*4 = 16 KiB */
};

/* Lane mask for vmaskmov: lanes below n (0..8) set. */
INLINE __m256i lane_mask(int64_t n)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx);
}

/* 8 weights of a row from element k, as f32. */
INLINE __m256 load_w(enum qr_dtype wt, const void *row, int64_t k)
{
    if (wt == QR_F32)
        return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (wt == QR_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The first n (< 8) weights from element k, zero-padded; reads only those n elements. */
INLINE __m256 load_w_part(enum qr_dtype wt, const void *row, int64_t k, int64_t n)
{
    _Alignas(32) uint8_t tmp[32] = {0};
    size_t esz = wt == QR_F32 ? 4 : 2;
    memcpy(tmp, (const uint8_t *)row + (size_t)k * esz, (size_t)n * esz);
    return load_w(wt, tmp, 0);
}

INLINE float hsum(__m256 s) /* sum of the 8 lanes */
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* out[r] = row r of W (rows rb bytes apart) . x over K columns, for nr (constant) rows. */
INLINE void dot_rows(int nr, enum qr_dtype wt, const uint8_t *w, size_t rb, const float *x,
                     int64_t K, float *out)
{
    __m256 acc[GEMV_ROWS][2];
    size_t esz = wt == QR_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            /* the same columns of the next row group; 16 elements are 32 or 64 bytes */
            if ((k * esz) % 64 == 0)
                _mm_prefetch((const char *)(w + (r + PF_ROWS) * rb) + k * esz, _MM_HINT_T0);
            acc[r][0] = _mm256_fmadd_ps(load_w(wt, w + r * rb, k), x0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(load_w(wt, w + r * rb, k + 8), x1, acc[r][1]);
        }
    }
    for (; k < K; k += 8) {
        int64_t n = K - k < 8 ? K - k : 8;
        __m256 x0 = _mm256_maskload_ps(x + k, lane_mask(n));
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256 wv = n == 8 ? load_w(wt, w + r * rb, k) : load_w_part(wt, w + r * rb, k, n);
            acc[r][0] = _mm256_fmadd_ps(wv, x0, acc[r][0]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

/* y[t][r] = row r of W . x[t] for nr rows and nt (2..GEMV_TOKENS, constant) tokens: each
 * weight vector is loaded and converted once and used for every token. */
INLINE void dot_rows_tokens(int nr, int nt, enum qr_dtype wt, const uint8_t *w, size_t rb,
                            const float *x, int64_t ldx, int64_t K, float *y, int64_t ldy)
{
    __m256 acc[GEMV_ROWS][GEMV_TOKENS], xv[GEMV_TOKENS];
    size_t esz = wt == QR_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[r][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
        int64_t n = K - k < 8 ? K - k : 8;
        __m256i m = lane_mask(n);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            xv[t] = _mm256_maskload_ps(x + t * ldx + k, m);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            if ((k * esz) % 64 == 0)
                _mm_prefetch((const char *)(w + (r + PF_ROWS) * rb) + k * esz, _MM_HINT_T0);
            __m256 wv = n == 8 ? load_w(wt, w + r * rb, k) : load_w_part(wt, w + r * rb, k, n);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = hsum(acc[r][t]);
}

/* nr (constant) rows at w for every token, GEMV_TOKENS tokens at a time: the rows come from
 * memory for the first group and from L1 for the others. */
INLINE void gemv_rows(int nr, const struct cpu_matmul_args *a, enum qr_dtype wt,
                      const uint8_t *w, int64_t n)
{
    size_t rb = a->w_row_bytes;
    for (int64_t t = 0; t < a->T; t += GEMV_TOKENS) {
        const float *x = a->x + t * a->ldx;
        float *y = a->y + t * a->ldy + n;
        switch (a->T - t < GEMV_TOKENS ? a->T - t : GEMV_TOKENS) {
        case 1:
            dot_rows(nr, wt, w, rb, x, a->K, y);
            break;
        case 2:
            dot_rows_tokens(nr, 2, wt, w, rb, x, a->ldx, a->K, y, a->ldy);
            break;
        case 3:
            dot_rows_tokens(nr, 3, wt, w, rb, x, a->ldx, a->K, y, a->ldy);
            break;
        default:
            dot_rows_tokens(nr, 4, wt, w, rb, x, a->ldx, a->K, y, a->ldy);
            break;
        }
    }
}

/* GEMV: output rows [n0, n1) for every token. */
INLINE void gemv_body(const struct cpu_matmul_args *a, int64_t n0, int64_t n1, enum qr_dtype wt)
{
    int64_t n = n0;
    for (; n + GEMV_ROWS <= n1; n += GEMV_ROWS)
        gemv_rows(GEMV_ROWS, a, wt, (const uint8_t *)a->w + (size_t)n * a->w_row_bytes, n);
    for (; n < n1; n++)
        gemv_rows(1, a, wt, (const uint8_t *)a->w + (size_t)n * a->w_row_bytes, n);
}

/* In-register transpose of an 8x8 f32 block: r[i] lane j <-> r[j] lane i. */
INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3 */
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* wp[k][NR] = W[nb + n][kb + k] as f32 for n < nn, k < kc; 0 for rows n >= nn. */
INLINE void pack(const struct cpu_matmul_args *a, enum qr_dtype wt, int64_t nb, int64_t nn,
                 int64_t kb, int64_t kc, float *wp)
{
    size_t esz = wt == QR_F32 ? 4 : 2;
    for (int h = 0; h < NR / 8; h++) {
        const uint8_t *w = (const uint8_t *)a->w + (size_t)(nb + 8 * h) * a->w_row_bytes +
                           (size_t)kb * esz;
        int64_t rows = nn - 8 * h;
        /* prefetch what the next pack reads: the next K block, or the next panel's first */
        ptrdiff_t ahead = kb + KC < a->K ? (ptrdiff_t)(KC * esz)
                                         : (ptrdiff_t)(NR * a->w_row_bytes) - (ptrdiff_t)(kb * esz);
        for (int64_t c = 0; c < kc; c += 8) {
            int64_t cols = kc - c < 8 ? kc - c : 8;
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const uint8_t *row = w + (size_t)i * a->w_row_bytes;
                _mm_prefetch((const char *)row + (ptrdiff_t)c * (ptrdiff_t)esz + ahead,
                             _MM_HINT_T1);
                if (i >= rows)
                    r[i] = _mm256_setzero_ps();
                else
                    r[i] = cols == 8 ? load_w(wt, row, c) : load_w_part(wt, row, c, cols);
            }
            transpose8(r);
            for (int j = 0; j < cols; j++)
                _mm256_store_ps(wp + (c + j) * NR + 8 * h, r[j]);
        }
    }
}

/* y[i][0..16) (+)= wp . x[i] for mr (constant) tokens; m0/m1 mask the two output halves. */
INLINE void ukernel(int mr, const float *wp, int64_t kc, const float *x, int64_t ldx, float *y,
                    int64_t ldy, __m256i m0, __m256i m1, bool accumulate)
{
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
        c0[i] = accumulate ? _mm256_maskload_ps(y + i * ldy, m0) : _mm256_setzero_ps();
        c1[i] = accumulate ? _mm256_maskload_ps(y + i * ldy + 8, m1) : _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(wp + k * NR), w1 = _mm256_load_ps(wp + k * NR + 8);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            __m256 b = _mm256_broadcast_ss(x + i * ldx + k);
            c0[i] = _mm256_fmadd_ps(w0, b, c0[i]);
            c1[i] = _mm256_fmadd_ps(w1, b, c1[i]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
        _mm256_maskstore_ps(y + i * ldy, m0, c0[i]);
        _mm256_maskstore_ps(y + i * ldy + 8, m1, c1[i]);
    }
}

typedef void (*ukernel_fn)(const float *wp, int64_t kc, const float *x, int64_t ldx, float *y,
                           int64_t ldy, __m256i m0, __m256i m1, bool accumulate);

#define UKERNEL(n)                                                                            \
    static TARGET void ukernel_##n(const float *wp, int64_t kc, const float *x, int64_t ldx,   \
                                   float *y, int64_t ldy, __m256i m0, __m256i m1,              \
                                   bool accumulate)                                            \
    {                                                                                         \
        ukernel(n, wp, kc, x, ldx, y, ldy, m0, m1, accumulate);                               \
    }
UKERNEL(1)
UKERNEL(2)
UKERNEL(3)
UKERNEL(4)
UKERNEL(5)
UKERNEL(6)
#undef UKERNEL

static const ukernel_fn ukernels[MR + 1] = {
    NULL, ukernel_1, ukernel_2, ukernel_3, ukernel_4, ukernel_5, ukernel_6,
};

/* GEMM: output rows [n0, n1) for every token, panel by panel. */
INLINE void gemm_body(const struct cpu_matmul_args *a, int64_t n0, int64_t n1, enum qr_dtype wt)
{
    _Alignas(64) float wp[KC * NR];
    for (int64_t nb = n0; nb < n1; nb += NR) {
        int64_t nn = n1 - nb < NR ? n1 - nb : NR;
        __m256i m0 = lane_mask(nn), m1 = lane_mask(nn > 8 ? nn - 8 : 0);
        for (int64_t kb = 0; kb < a->K; kb += KC) {
            int64_t kc = a->K - kb < KC ? a->K - kb : KC;
            pack(a, wt, nb, nn, kb, kc, wp);
            for (int64_t t = 0; t < a->T; t += MR) {
                int64_t mr = a->T - t < MR ? a->T - t : MR;
                ukernels[mr](wp, kc, a->x + t * a->ldx + kb, a->ldx, a->y + t * a->ldy + nb,
                             a->ldy, m0, m1, kb > 0);
            }
        }
    }
}

#define VARIANT(name, wt)                                                                     \
    static TARGET void gemv_##name(const struct cpu_matmul_args *a, int64_t n0, int64_t n1)    \
    {                                                                                         \
        gemv_body(a, n0, n1, wt);                                                             \
    }                                                                                         \
    static TARGET void gemm_##name(const struct cpu_matmul_args *a, int64_t n0, int64_t n1)    \
    {                                                                                         \
        gemm_body(a, n0, n1, wt);                                                             \
    }                                                                                         \
    void matmul_##name##_avx2(const struct cpu_matmul_args *a)                                \
    {                                                                                         \
        if (a->T <= GEMV_MAX_T)                                                               \
            matmul_parallel_rows(a, GEMV_ROWS, gemv_##name);                                  \
        else                                                                                  \
            matmul_parallel_rows(a, NR, gemm_##name);                                         \
    }
VARIANT(f32, QR_F32)
VARIANT(f16, QR_F16)
VARIANT(bf16, QR_BF16)
#undef VARIANT
