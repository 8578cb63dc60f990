/*
 * matmul_avx512.c — AVX-512 float-weight matmul variants: matmul.{f32,f16,bf16}.avx512.
 *
 * Compiled without -march: every function carries TARGET, and matmul.c registers the variants
 * as needing CPU_AVX512F (which implies BW/DQ/VL) and CPU_AVX2 (FMA, F16C).
 *
 * Few tokens (T <= GEMV_MAX_T, decode): GEMV. Four weight rows at a time are streamed with
 * 64-byte loads (F16 via vcvtph2ps, BF16 by widening and shifting left 16), masked loads for
 * the K tail, one horizontal sum per output. T = 1 keeps eight accumulators (4 rows x 2 column
 * halves); 2..4 tokens share each converted weight vector (4 rows x 4 tokens accumulators);
 * more tokens re-read the four rows from L1. The hardware prefetcher does not keep up with four
 * interleaved 2 KiB rows, so the next row group is prefetched (64% -> ~90% of read bandwidth).
 *
 * Many tokens (prefill): GEMM. A panel of NR = 32 weight rows x KC columns is converted to f32
 * once into a 32 KiB stack buffer laid out wp[k][32] (16x16 register transposes), then an
 * MR x NR = 8 tokens x 32 outputs micro-kernel keeps 16 zmm accumulators and per k does two
 * loads from wp, eight broadcasts of x and sixteen FMAs. wp (32 KiB) and the eight x rows
 * (8 KiB) stay in L1 across all T/8 micro-kernel calls; later K blocks add to y. The pack
 * prefetches (into L2) what the next pack reads, as its 32 row streams defeat the prefetcher.
 * Accumulation is f32 throughout, in an order that differs from matmul_ref (tolerance ~1e-5).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>

#include "backend/cpu/matmul_float.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma")))
#define INLINE static inline __attribute__((always_inline)) TARGET

enum {
    GEMV_ROWS = 4,   /* weight rows per GEMV step */
    GEMV_TOKENS = 4, /* tokens per GEMV step (4 rows x 4 tokens = 16 zmm accumulators) */
    GEMV_MAX_T = 8,  /* largest T that takes the GEMV path (measured crossover with the GEMM) */
    PF_ROWS = 4,     /* GEMV prefetches the rows this far ahead (the next row group) */
    NR = 32,         /* GEMM panel: weight rows (outputs) per micro-kernel */
    MR = 8,          /* GEMM micro-kernel: tokens */
    KC = 256,        /* GEMM panel: columns; wp is KC*NR*4 = 32 KiB */
};

static inline __mmask16 tail_mask(int64_t n) /* lowest min(n, 16) lanes */
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* 16 weights of a row from element k, as f32. */
INLINE __m512 load_w(enum qr_dtype wt, const void *row, int64_t k)
{
    if (wt == QR_F32)
        return _mm512_loadu_ps((const float *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (wt == QR_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The same for the lanes in m only (others 0, and their memory is not read). */
INLINE __m512 load_w_mask(enum qr_dtype wt, const void *row, int64_t k, __mmask16 m)
{
    if (wt == QR_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    if (wt == QR_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* out[r] = row r of W (rows at w, rb bytes apart) . x over K columns, for nr (constant) rows. */
INLINE void dot_rows(int nr, enum qr_dtype wt, const uint8_t *w, size_t rb, const float *x,
                     int64_t K, float *out)
{
    __m512 acc[GEMV_ROWS][2];
    size_t esz = wt == QR_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            if (PF_ROWS)
                _mm_prefetch((const char *)(w + (r + PF_ROWS) * rb) + k * esz, _MM_HINT_T0);
            if (wt == QR_F32)
                _mm_prefetch((const char *)(w + (r + PF_ROWS) * rb) + k * esz + 64, _MM_HINT_T0);
            acc[r][0] = _mm512_fmadd_ps(load_w(wt, w + r * rb, k), x0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(load_w(wt, w + r * rb, k + 16), x1, acc[r][1]);
        }
    }
    for (; k < K; k += 16) {
        __mmask16 m = tail_mask(K - k);
        __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            acc[r][0] = _mm512_fmadd_ps(load_w_mask(wt, w + r * rb, k, m), x0, acc[r][0]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

/* y[t][r] = row r of W . x[t] for nr rows and nt (2..GEMV_TOKENS, constant) tokens: each
 * weight vector is loaded and converted once and used for every token. */
INLINE void dot_rows_tokens(int nr, int nt, enum qr_dtype wt, const uint8_t *w, size_t rb,
                            const float *x, int64_t ldx, int64_t K, float *y, int64_t ldy)
{
    __m512 acc[GEMV_ROWS][GEMV_TOKENS], xv[GEMV_TOKENS];
    size_t esz = wt == QR_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 m = tail_mask(K - k);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            if ((k * esz) % 64 == 0)
                _mm_prefetch((const char *)(w + (r + PF_ROWS) * rb) + k * esz, _MM_HINT_T0);
            __m512 wv = load_w_mask(wt, w + r * rb, k, m);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
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

/* In-register transpose of a 16x16 f32 block: r[i] lane j <-> r[j] lane i. Three stages work
 * on 2x2 elements, 4x4 elements, then 4x4 128-bit lanes. */
INLINE void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + c], lane L: column 4L + c of rows 4g..4g+3 */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m512 lo0 = t[4 * g], hi0 = t[4 * g + 1], lo1 = t[4 * g + 2], hi1 = t[4 * g + 3];
        u[4 * g + 0] = _mm512_shuffle_ps(lo0, lo1, _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 1] = _mm512_shuffle_ps(lo0, lo1, _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * g + 2] = _mm512_shuffle_ps(hi0, hi1, _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 3] = _mm512_shuffle_ps(hi0, hi1, _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* column 4L + c = 128-bit lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512 p0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        __m512 p1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
        __m512 q0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 q1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
        r[c] = _mm512_shuffle_f32x4(p0, q0, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(p0, q0, 0xdd);
        r[8 + c] = _mm512_shuffle_f32x4(p1, q1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(p1, q1, 0xdd);
    }
}

/* wp[k][NR] = W[nb + n][kb + k] as f32 for n < nn, k < kc; 0 for rows n >= nn. */
INLINE void pack(const struct cpu_matmul_args *a, enum qr_dtype wt, int64_t nb, int64_t nn,
                 int64_t kb, int64_t kc, float *wp)
{
    size_t esz = wt == QR_F32 ? 4 : 2;
    for (int h = 0; h < NR / 16; h++) {
        const uint8_t *w = (const uint8_t *)a->w + (size_t)(nb + 16 * h) * a->w_row_bytes +
                           (size_t)kb * esz;
        int64_t rows = nn - 16 * h;
        /* prefetch what the next pack reads: the next K block, or the next panel's first */
        ptrdiff_t ahead = kb + KC < a->K ? (ptrdiff_t)(KC * esz)
                                         : (ptrdiff_t)(NR * a->w_row_bytes) - (ptrdiff_t)(kb * esz);
        for (int64_t c = 0; c < kc; c += 16) {
            __mmask16 m = tail_mask(kc - c);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const uint8_t *row = w + (size_t)i * a->w_row_bytes;
                _mm_prefetch((const char *)row + (ptrdiff_t)c * (ptrdiff_t)esz + ahead,
                             _MM_HINT_T1);
                r[i] = i < rows ? load_w_mask(wt, row, c, m) : _mm512_setzero_ps();
            }
            transpose16(r);
            int64_t cols = kc - c < 16 ? kc - c : 16;
            for (int j = 0; j < cols; j++)
                _mm512_store_ps(wp + (c + j) * NR + 16 * h, r[j]);
        }
    }
}

/* y[i][0..32) (+)= wp . x[i] for mr (constant) tokens; m0/m1 mask the two output halves. */
INLINE void ukernel(int mr, const float *wp, int64_t kc, const float *x, int64_t ldx, float *y,
                    int64_t ldy, __mmask16 m0, __mmask16 m1, bool accumulate)
{
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        c0[i] = accumulate ? _mm512_maskz_loadu_ps(m0, y + i * ldy) : _mm512_setzero_ps();
        c1[i] = accumulate ? _mm512_maskz_loadu_ps(m1, y + i * ldy + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(wp + k * NR), w1 = _mm512_load_ps(wp + k * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 b = _mm512_set1_ps(x[i * ldx + k]);
            c0[i] = _mm512_fmadd_ps(w0, b, c0[i]);
            c1[i] = _mm512_fmadd_ps(w1, b, c1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(y + i * ldy, m0, c0[i]);
        _mm512_mask_storeu_ps(y + i * ldy + 16, m1, c1[i]);
    }
}

typedef void (*ukernel_fn)(const float *wp, int64_t kc, const float *x, int64_t ldx, float *y,
                           int64_t ldy, __mmask16 m0, __mmask16 m1, bool accumulate);

#define UKERNEL(n)                                                                            \
    static TARGET void ukernel_##n(const float *wp, int64_t kc, const float *x, int64_t ldx,   \
                                   float *y, int64_t ldy, __mmask16 m0, __mmask16 m1,          \
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
UKERNEL(7)
UKERNEL(8)
#undef UKERNEL

static const ukernel_fn ukernels[MR + 1] = {
    NULL, ukernel_1, ukernel_2, ukernel_3, ukernel_4, ukernel_5, ukernel_6, ukernel_7, ukernel_8,
};

/* GEMM: output rows [n0, n1) for every token, panel by panel. */
INLINE void gemm_body(const struct cpu_matmul_args *a, int64_t n0, int64_t n1, enum qr_dtype wt)
{
    _Alignas(64) float wp[KC * NR];
    for (int64_t nb = n0; nb < n1; nb += NR) {
        int64_t nn = n1 - nb < NR ? n1 - nb : NR;
        __mmask16 m0 = tail_mask(nn), m1 = nn > 16 ? tail_mask(nn - 16) : 0;
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
    void matmul_##name##_avx512(const struct cpu_matmul_args *a)                              \
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
