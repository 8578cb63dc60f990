/*
 * gemvq_batch.cu — the GEMV of a few tokens at once (2 <= T <= 8) with quantised weights: Q8_0,
 * Q4_K, Q6_K, and Q4_K_M's q|k|v that mixes Q4_K and Q6_K segments; each weight block read once
 * for all T tokens (cuda_options.gemv_batch). gemv_batch.cu is the same for 16-bit weights.
 *
 * Why: the server's batched decode step (cuda_batch_decode) multiplies n sessions' rows by every
 * weight matrix. Quantised rows had only the plain gemv_kernel for T > 1 (a warp per row, the
 * norm's sums in a pass of their own, every segment a launch of its own), so two Q4_K_M
 * sessions batched decoded 832 tok/s in all where one alone decodes ~1,950, and the server fed
 * quantised sessions one by one (docs/perf-log.md, session 33).
 *
 * How: every dtype is walked in spans of 256 elements (a K-quant super-block, or 8 Q8_0 blocks),
 * lane l taking elements 8l .. 8l + 7 of each span, so that the warp's loads of x (through L1:
 * every block reads all of x) are 1 KB in a row for each token, as gemv_batch's are. A block of 4
 * warps owns RPB consecutive rows of the launch's segments (4 from 32,768 rows, 2 from 4,096, else 1; q|k|v as
 * one launch, SwiGLU's gate and up rows in pairs); its warps split the spans, each loading the
 * raw words of up to 4 spans of the rows (about 32 words a lane) before using any, the first ones
 * before griddep_wait, and their sums are added in warp order through shared memory. Q4_K: the
 * super-block's 16-byte header (one load for the warp) and the lane's 8 bytes of nibbles; Q8_0's
 * 34-byte blocks and Q6_K's 210-byte super-blocks are only 2-byte aligned, so their fields are
 * read as aligned 32-bit words and shifted. The 8 weights are made floats without a conversion
 * instruction (gqb_float: I2F issues at a sixteenth of FFMA's rate) and each 8 elements of x
 * serve all RPB rows of every token. A fused RMS norm: norm_w folded into the weights, the
 * squares summed from the x the block reads anyway (its warps together read all K), 1 / rms
 * applied to the row sums. Each (row, token) sum is a chain of f32 FMAs in the lane's element
 * order, then warp_sum, then the warps' sums in order; the order differs from gemvq's and the
 * CPU's, so results differ from them by rounding (test_gemv_batch_kernel holds both this
 * and the reference gemv_kernel to a double sum). Two first forms measured slower (docs/perf-log.md,
 * session 34): 32-element units per lane (neighbouring lanes reading x 128 bytes apart), and a
 * warp per row (a row of K = 3072 took three rounds of loads, one after another).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_batch.cuh"
#include "backend/cuda/gemv_smem.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#define GQB_WARPS 4     /* warps per block */
#define GQB_KMIXED (-1) /* the DT of a launch whose segments are Q4_K or Q6_K each */
#define GQB_WORDS 8     /* raw 32-bit words of a lane's 8 elements at most (Q6_K's) */

/* 4, 8 and 16 bytes of weights. The 32-bit words (Q8_0, Q6_K: several per lane from the same
 * lines) go through L1; the Q4_K loads, each byte once per warp, past it. */
static __device__ __forceinline__ uint32_t gqb_ld32(const uint8_t *p) { return __ldg((const unsigned int *)p); }

static __device__ __forceinline__ uint2 gqb_ld64(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

static __device__ __forceinline__ uint4 gqb_ld128(const uint8_t *p) { return gemv_ld_w128(p); }

/* The aligned words holding the 8 bytes at the 2-byte aligned address p: 2, or 3 when p is not
 * 4-byte aligned (no third word otherwise: it could lie past the tensor's end). */
static __device__ __forceinline__ void gqb_words8(const uint8_t *p, uint32_t *w)
{
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    w[0] = gqb_ld32(a), w[1] = gqb_ld32(a + 4);
    w[2] = (uintptr_t)p & 2 ? gqb_ld32(a + 8) : 0u;
}

/* Bytes 4i .. 4i + 3 of the 8 that gqb_words8 loaded for the address whose low bits are p_low. */
static __device__ __forceinline__ uint32_t gqb_word(const uint32_t *w, int i, uint32_t p_low)
{
    return __funnelshift_r(w[i], w[i + 1], 8 * (p_low & 3));
}

/* The exact float of a small non-negative integer v (< 2^23) minus bias, without a conversion
 * instruction (I2F issues at a sixteenth of FFMA's rate): 2^23 + v has v in its low mantissa. */
static __device__ __forceinline__ float gqb_float(uint32_t v, float bias)
{
    return __int_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

/* Lane l's raw words for elements 8l .. 8l + 7 of the 256-element span sb of the row at `row`
 * (dtype dt; a span is a K-quant super-block, or 8 Q8_0 blocks); nothing decoded.
 * Q8_0 (block l / 4 of the span, quants 8 (l % 4) on): w[0..2] the quants' words (gqb_words8),
 *   w[3] the word holding the block's d.
 * Q4_K (sub-block l / 4): w[0..3] the super-block's header (d, dmin, 12 scale bytes; one load
 *   for the whole warp), w[4..5] the 8 bytes whose low (even sub-block) or high nibbles are the
 *   lane's.
 * Q6_K (half l / 16, quarter (l % 16) / 4): w[0..2] the 8 low-bit bytes, w[3..5] the 8 high-bit
 *   bytes, w[6] the word holding the lane's scale, w[7] the word holding d. */
static __device__ __forceinline__ void gqb_load(int dt, const uint8_t *row, int sb, uint32_t *w)
{
    const int l = threadIdx.x & 31;
    if (dt == QR_Q8_0) {
        const uint8_t *b = row + 34 * (8 * sb + (l >> 2));
        gqb_words8(b + 2 + 8 * (l & 3), w);
        w[3] = gqb_ld32((const uint8_t *)((uintptr_t)b & ~(uintptr_t)3));
    } else if (dt == QR_Q4_K) {
        const uint8_t *b = row + 144 * sb;
        uint4 h = gqb_ld128(b);
        uint2 q = gqb_ld64(b + 16 + 32 * (l >> 3) + 8 * (l & 3));
        w[0] = h.x, w[1] = h.y, w[2] = h.z, w[3] = h.w, w[4] = q.x, w[5] = q.y;
    } else {
        const uint8_t *b = row + 210 * sb;
        int h = l >> 4, quarter = (l >> 2) & 3, off = 8 * (l & 3);
        gqb_words8(b + 64 * h + 32 * (quarter & 1) + off, w);
        gqb_words8(b + 128 + 32 * h + off, w + 3);
        const uint8_t *sc = b + 192 + 8 * h + 2 * quarter + (off >> 4), *d = b + 208;
        w[6] = gqb_ld32((const uint8_t *)((uintptr_t)sc & ~(uintptr_t)3));
        w[7] = gqb_ld32((const uint8_t *)((uintptr_t)d & ~(uintptr_t)3));
    }
}

/* Lane l's 8 weights of span sb (raw words w loaded from row) as floats. */
static __device__ __forceinline__ void gqb_dequant8(int dt, const uint8_t *row, int sb, const uint32_t *w, float *o)
{
    const int l = threadIdx.x & 31;
    if (dt == QR_Q8_0) {
        uint32_t b = (uint32_t)(uintptr_t)(row + 34 * (8 * sb + (l >> 2)));
        float d = __half2float(__ushort_as_half((unsigned short)((w[3] >> (8 * (b & 2))) & 0xffffu)));
        uint32_t q0 = gqb_word(w, 0, b + 2), q1 = gqb_word(w, 1, b + 2); /* quants at b + 2 + 8 (l % 4) */
#pragma unroll
        for (int e = 0; e < 4; e++) { /* a signed byte plus 128, biased back */
            o[e] = d * gqb_float(((q0 >> (8 * e)) & 0xffu) ^ 0x80u, 128.0f);
            o[4 + e] = d * gqb_float(((q1 >> (8 * e)) & 0xffu) ^ 0x80u, 128.0f);
        }
    } else if (dt == QR_Q4_K) {
        int sub = l >> 2, sc, m;
        /* scale byte i (header byte 4 + i) from w[1..3], chosen without indexing by the run-time
         * sub-block (an indexed array would go to local memory) */
#define SB(i) ((int)((((i) < 4 ? w[1] : (i) < 8 ? w[2] : w[3]) >> (8 * ((i) & 3))) & 0xffu))
        if (sub < 4) {
            sc = SB(sub) & 63, m = SB(sub + 4) & 63;
        } else {
            sc = (SB(sub + 4) & 0xF) | ((SB(sub - 4) >> 6) << 4);
            m = (SB(sub + 4) >> 4) | ((SB(sub) >> 6) << 4);
        }
#undef SB
        float d = __half2float(__ushort_as_half((unsigned short)(w[0] & 0xffffu)));
        float dmin = __half2float(__ushort_as_half((unsigned short)(w[0] >> 16)));
        float ds = d * (float)sc, dm = dmin * (float)m;
        int shift = 4 * (sub & 1);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            o[e] = fmaf(ds, gqb_float((w[4] >> (8 * e + shift)) & 0xFu, 0.0f), -dm);
            o[4 + e] = fmaf(ds, gqb_float((w[5] >> (8 * e + shift)) & 0xFu, 0.0f), -dm);
        }
    } else {
        uint32_t b = (uint32_t)(uintptr_t)(row + 210 * sb);
        int h = l >> 4, quarter = (l >> 2) & 3, off = 8 * (l & 3);
        uint32_t lo_a = b + 64 * h + 32 * (quarter & 1) + off, hi_a = b + 128 + 32 * h + off;
        uint32_t sc_a = b + 192 + 8 * h + 2 * quarter + (off >> 4), d_a = b + 208;
        float d = __half2float(__ushort_as_half((unsigned short)((w[7] >> (8 * (d_a & 3))) & 0xffffu)));
        float ds = d * (float)(int)(int8_t)(w[6] >> (8 * (sc_a & 3)));
        int shl = (quarter >> 1) * 4, shh = 2 * quarter;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t ql = gqb_word(w, k, lo_a), qh = gqb_word(w + 3, k, hi_a);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint32_t q = ((ql >> (8 * e + shl)) & 0xFu) | (((qh >> (8 * e + shh)) & 3u) << 4);
                o[4 * k + e] = ds * gqb_float(q, 32.0f);
            }
        }
    }
}

/* Row lr of the launch over its segments (gemv_seg_of): its P rows and their dtypes, its output
 * and the output's row stride; false past the last row (which then reads row 0). */
template <int P>
static __device__ __forceinline__ bool gqb_row(const struct gemv_args &a, int64_t lr, const uint8_t *(&rp)[P],
                                               int (&dt)[P], float *&y, int32_t &ldy)
{
    int sg;
    int64_t r;
    bool ok = gemv_seg_of<P>(a, lr, sg, r);
#pragma unroll
    for (int p = 0; p < P; p++) {
        rp[p] = (const uint8_t *)a.seg[sg + p].w + r * a.seg[sg + p].row_bytes;
        dt[p] = a.k_mixed ? a.seg[sg + p].dtype : a.dtype;
    }
    y = a.seg[sg].y + r, ldy = a.seg[sg].ldy;
    return ok;
}

/* Spans per warp whose loads are in flight together: 4 for one row of Q8_0 or Q4_K rows (fewer
 * with more rows: about 32 raw words a lane in all), at least one. */
template <int DT, int RP>
struct gqb_flight {
    static constexpr int words = DT == QR_Q8_0 ? 4 : DT == QR_Q4_K ? 6 : GQB_WORDS;
    static constexpr int fit = 32 / (words * RP);
    static constexpr int U = fit > 4 ? 4 : fit > 0 ? fit : 1;
};

/* TM: tokens the sums are sized for (a.T <= TM); RPB rows per block; P = 2: SwiGLU's gate and up
 * rows; NORM: x RMS-normalised with norm_w first (norm_w folded into the weights, 1 / rms applied
 * to the sums). DT: the launch's dtype, or GQB_KMIXED (each row's own, Q4_K or Q6_K; the branches
 * are warp-uniform). The block's warps split the rows' spans (warp w takes spans w, w + 4, ...:
 * K = 3072 is 3 spans a warp, all loaded in one round) and their sums are added in warp order
 * through shared memory. The first spans' loads are issued before griddep_wait (weights only). */
template <int DT, int TM, int RPB, int P, bool NORM>
__global__ void __launch_bounds__(32 * GQB_WARPS) gemvq_batch_kernel(const __grid_constant__ struct gemv_args a)
{
    __shared__ float s_part[GQB_WARPS][RPB * P + 1][TM]; /* each warp's sums; [RPB * P]: x's squares */
    griddep_launch();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, T = a.T;
    const int64_t row0 = (int64_t)blockIdx.x * RPB;
    const uint8_t *rp[RPB][P];
    int dt[RPB][P];
    float *yp[RPB];
    int32_t ldy[RPB];
    bool ok[RPB];
#pragma unroll
    for (int r = 0; r < RPB; r++)
        ok[r] = gqb_row<P>(a, row0 + r, rp[r], dt[r], yp[r], ldy[r]);
    if (!ok[0]) { /* the whole block */
        griddep_wait();
        return;
    }
#pragma unroll
    for (int r = 0; r < RPB; r++)
#pragma unroll
        for (int p = 0; p < P; p++)
            if (DT != GQB_KMIXED)
                dt[r][p] = DT;
    const int spans = a.K / 256;
    constexpr int U = gqb_flight<DT == GQB_KMIXED ? QR_Q6_K : DT, RPB * P>::U;
    constexpr int NW = gqb_flight<DT == GQB_KMIXED ? QR_Q6_K : DT, 1>::words;
    float acc[RPB][P][TM], ss[TM];
#pragma unroll
    for (int t = 0; t < TM; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < RPB; r++)
#pragma unroll
            for (int p = 0; p < P; p++)
                acc[r][p][t] = 0.0f;
    }
    bool waited = false;
    for (int s0 = warp; s0 < spans; s0 += GQB_WARPS * U) {
        uint32_t w[U][RPB][P][NW];
#pragma unroll
        for (int v = 0; v < U; v++)
#pragma unroll
            for (int r = 0; r < RPB; r++)
#pragma unroll
                for (int p = 0; p < P; p++)
                    if (s0 + GQB_WARPS * v < spans)
                        gqb_load(dt[r][p], rp[r][p], s0 + GQB_WARPS * v, w[v][r][p]);
        if (!waited)
            griddep_wait(), waited = true;
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int sb = s0 + GQB_WARPS * v;
            if (sb >= spans)
                break;
            const int c = 256 * sb + 8 * lane; /* the lane's 8 elements of x */
            float wq[RPB][P][8];
#pragma unroll
            for (int r = 0; r < RPB; r++)
#pragma unroll
                for (int p = 0; p < P; p++)
                    gqb_dequant8(dt[r][p], rp[r][p], sb, w[v][r][p], wq[r][p]);
            if (NORM) {
                float4 g0 = __ldg((const float4 *)(a.norm_w + c)), g1 = __ldg((const float4 *)(a.norm_w + c + 4));
                const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
                for (int r = 0; r < RPB; r++)
#pragma unroll
                    for (int p = 0; p < P; p++)
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            wq[r][p][e] *= g[e];
            }
#pragma unroll
            for (int t = 0; t < TM; t++) {
                if (t >= T)
                    break;
                const float4 *xp = (const float4 *)(a.x + (int64_t)t * a.ldx + c);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                if (NORM)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        ss[t] = fmaf(xs[e], xs[e], ss[t]);
#pragma unroll
                for (int r = 0; r < RPB; r++)
#pragma unroll
                    for (int p = 0; p < P; p++)
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            acc[r][p][t] = fmaf(wq[r][p][e], xs[e], acc[r][p][t]);
            }
        }
    }
    if (!waited) /* a warp without spans (K < 1,024) */
        griddep_wait();
    gemv_batch_finish<GQB_WARPS, TM, RPB, P, NORM>(a, s_part, acc, ss, ok, yp, ldy);
}

/* Rows per block without SwiGLU pairs: 4 in launches of 32,768 rows or more (LM heads: a quarter
 * of the blocks, x read once for four rows), 2 from 4,096 rows (the grid stays large), else 1. */
static int gqb_rows_per_block(int64_t rows, int32_t mode)
{
    if (mode == GEMV_SWIGLU)
        return 1;
    return rows >= 32768 ? 4 : rows >= 4096 ? 2 : 1;
}

static bool gqb_dtype_ok(int32_t dt) { return dt == QR_Q8_0 || dt == QR_Q4_K || dt == QR_Q6_K; }

bool gemvq_batch_applies(const struct gemv_args *a)
{
    /* whole 256-element spans (K-quant super-blocks; 8 Q8_0 blocks) */
    if (a->T < 2 || a->T > 8 || a->y_copy || a->n_seg < 1 || a->n_seg > GEMV_MAX_SEG || a->K < 256 ||
        a->K % 256 || a->ldx % 4 || (uintptr_t)a->x % 16 || (uintptr_t)a->norm_w % 16)
        return false;
    if (!a->k_mixed && !gqb_dtype_ok(a->dtype))
        return false;
    if (a->mode == GEMV_SWIGLU ? a->n_seg != 2 || a->seg[1].N != a->seg[0].N
                               : a->mode != GEMV_STORE && a->mode != GEMV_ACCUM)
        return false;
    for (int i = 0; i < a->n_seg; i++) {
        int32_t dt = a->k_mixed ? a->seg[i].dtype : a->dtype;
        size_t rb = 0;
        if (a->k_mixed && dt != QR_Q4_K && dt != QR_Q6_K)
            return false;
        if (!gqb_dtype_ok(dt) || !dtype_row_bytes((enum qr_dtype)dt, a->K, &rb) || (int64_t)rb != a->seg[i].row_bytes)
            return false; /* K whole blocks (dtype_row_bytes), rows back to back */
        /* Q4_K: 16-byte loads; Q8_0 and Q6_K: aligned 32-bit words (gqb_words8), from a
         * 4-byte aligned start (a word before a 2-byte aligned field stays inside the tensor) */
        int align = dt == QR_Q4_K ? 16 : 4;
        if ((dt == QR_Q4_K && rb % 16) || (uintptr_t)a->seg[i].w % align || a->seg[i].N < 1 ||
            a->seg[i].ldy < a->seg[i].N)
            return false;
    }
    return true;
}

template <int DT, int TM, int P, bool NORM>
static cudaError_t gqb_launch(const struct gemv_args *a, cudaStream_t s)
{
    int64_t rows = gemv_launch_rows(a);
    int rpb = gqb_rows_per_block(rows, a->mode);
    dim3 grid((unsigned)((rows + rpb - 1) / rpb)), block(32 * GQB_WARPS);
    if (P == 1 && rpb == 4)
        return launch_k(a->pdl, gemvq_batch_kernel<DT, TM, 4, 1, NORM>, grid, block, 0, s, *a);
    if (P == 1 && rpb == 2)
        return launch_k(a->pdl, gemvq_batch_kernel<DT, TM, 2, 1, NORM>, grid, block, 0, s, *a);
    return launch_k(a->pdl, gemvq_batch_kernel<DT, TM, 1, P, NORM>, grid, block, 0, s, *a);
}

template <int DT, int TM>
static cudaError_t gqb_launch_form(const struct gemv_args *a, cudaStream_t s)
{
    if (a->mode == GEMV_SWIGLU)
        return a->norm_w ? gqb_launch<DT, TM, 2, true>(a, s) : gqb_launch<DT, TM, 2, false>(a, s);
    return a->norm_w ? gqb_launch<DT, TM, 1, true>(a, s) : gqb_launch<DT, TM, 1, false>(a, s);
}

template <int DT>
static cudaError_t gqb_launch_dt(const struct gemv_args *a, cudaStream_t s)
{
    if (a->T <= 4)
        return gqb_launch_form<DT, 4>(a, s);
    return gqb_launch_form<DT, 8>(a, s);
}

cudaError_t launch_gemvq_batch(const struct gemv_args *a, cudaStream_t s)
{
    if (!gemvq_batch_applies(a))
        return cudaErrorInvalidValue;
    if (a->k_mixed)
        return gqb_launch_dt<GQB_KMIXED>(a, s);
    switch (a->dtype) {
    case QR_Q8_0: return gqb_launch_dt<QR_Q8_0>(a, s);
    case QR_Q4_K: return gqb_launch_dt<QR_Q4_K>(a, s);
    default: return gqb_launch_dt<QR_Q6_K>(a, s);
    }
}
