/*
 * gemvq_batch_mma.cu — the GEMV of a few tokens at once (2 <= T <= 16) for Q4_K and Q6_K rows
 * (and Q4_K_M's q|k|v that mixes them) and Q8_0 rows with x in 8 bits and the integer dot
 * products on the tensor cores: the batched decode step's products for quantised models in the runtime's default
 * precision (cuda_options.gemvq_int8 on, gemv_batch_mma on).
 *
 * Why: the one-token products of a quantised model take x in 8 bits (Q8_K blocks, as the CPU
 * does: quant_rows_i8.cuh), but gemvq_batch.cu takes it in floats on the CUDA cores: a batched
 * step of 8 Qwen3-0.6B Q4_K_M sessions decoded ~3,000 tok/s in all where BF16's reaches ~8,500.
 * Here x is quantised exactly as the one-token path quantises it (the same helpers), so each
 * super-block's integer sums are the one-token kernel's and the CPU's, and the float terms are
 * added in quant_rows_i8.cuh's canonical order, which the one-token gemvq follows too: a row is
 * bit for bit the one-token one. That matters beyond the last bit: the next product quantises
 * its x to 8 bits again, and a float-order difference of 1e-7 there moves a quant a whole step
 * (0.03 of a Qwen3-0.6B Q4_K_M's logits batched vs alone before, docs/perf-log.md sessions 37-38);
 * now a server batches such models without changing any answer (cuda_batch_pays).
 *
 * How: a block owns a tile of 16 rows (SwiGLU: 16 gate and 16 up rows) and all T tokens; its W
 * warps (W <= 8: NSB = K / 256 super-blocks in R = ceil(NSB / 8) rounds) each take super-blocks
 * warp, warp + W, ... — or, where NSB <= 4 (SPLIT, K = 1,024; K-quant launches of at most 4
 * tiles an SM, see gqm_split), two warps a super-block, each half its sub-blocks, the second
 * half's exact sums handed over in shared memory. Before its wait a warp asks for its first
 * super-block's weights (the lane's words of rows g = lane / 4 and g + 8). After it the block
 * quantises x into shared memory as gq8_stage_quantise does (lane l: elements 8l .. 8l + 7 of a
 * 256-element block; the sums of squares per block added in block order for 1 / rms; max-abs
 * scale, round to nearest even): a row of K int8 per token, padded so that the lanes' reads fall in distinct banks, and each
 * block's scale. Then per super-block:
 *  - Q4_K: one mma.m16n8k32 (s8) per 32-element sub-block: A the tile's 4-bit quants (lane (g,
 *    c) holds elements 8c .. 8c + 7 of rows g and g + 8: the 8 bytes at 32j + 8c of the nibbles,
 *    low or high), B token g's quants of the same elements; D(row, token) the exact sum. Summed
 *    in int32 with the sub-block's 6-bit scale, and the minimum's term from a second mma of a
 *    matrix of ones (D = the sub-block's sum of x's quants for every row); per super-block
 *    dx (d isum - dmin imin) in f32.
 *  - Q6_K: one mma.m16n8k16 per 16-element group (its int8 scale): the 6-bit quants unsigned
 *    (0..63) and 32 times the ones-mma's sum subtracted, dx d (isum - 32 ioff).
 *  - Q8_0 (a kernel of its own, x in Q8_0 blocks of 32 as the one-token path takes it): one
 *    mma.m16n8k32 per block, its term (dw dx) S, the super-block's 8 terms added by
 *    gq8_q80_tree's pairs in registers.
 * The k index inside an mma is only a label: A and B name the same element for every k. Rows
 * are read through L1 for Q6_K (210-byte super-blocks, 2-byte aligned: aligned words shifted)
 * and past it for Q4_K. Each super-block's term goes to shared memory; one thread per (row, token)
 * adds them in the canonical order (gq8_canon_row), applies SwiGLU and stores or
 * adds (GEMV_ACCUM). A block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (the grid: as
 * many blocks as fit at once), staging x once; a mixed launch keeps a tile per block, each
 * taking its tile's dtype (segments of another dtype start at multiples of 16 rows).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_batch.cuh"
#include "backend/cuda/gemv_smem.cuh"
#include "backend/cuda/quant_rows_i8.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#define GQM_MAX_WARPS 8                   /* warps per block at most (255 registers a thread) */
#define GQM_ONES 0x01010101u              /* four int8 ones */
#ifndef GQM_MINB
#define GQM_MINB 1 /* the unsplit kernels' blocks of 8 warps an SM the registers must allow (-D for a variant
                    * build; 2, at most 128 registers, lost 2-4% on Q4_K_M and 16% on Q8_0 batches:
                    * docs/perf-log.md, session 43) */
#endif

static __device__ __forceinline__ void mma_s8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void mma_s8_16816(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

static __device__ __forceinline__ uint32_t gqm_ld32(const uint8_t *p) { return __ldg((const unsigned int *)p); }

static __device__ __forceinline__ uint2 gqm_ld64(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

static __device__ __forceinline__ float gqm_half(uint32_t bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

/* Bytes of a token's quantised row in shared memory: K and a pad that puts token g's reads of a
 * warp 8 banks (Q4_K, Q8_0: 8-byte reads) or 4 banks (Q6_K) from token g - 1's. */
static __host__ __device__ __forceinline__ int gqm_xstride(int K, int dt) { return K + (dt == QR_Q4_K ? 32 : 16); }

/* ---- the quantised x in shared memory ---- */

struct gqm_shared {
    uint8_t *xq;      /* [T][xstride] int8 */
    float *dx;        /* [T][NSB] each Q8_K block's scale ([T][8 NSB] Q8_0 blocks' for Q8_0 rows) */
    float *ss;        /* [T][NSB] each 256-element block's sum of squares (with a norm) */
    float *part;      /* [nsb][16 P][8 NG] each super-block's terms */
    uint32_t *xch;    /* SPLIT: [nsb][NG][GQM_ACC_WORDS(P)][32 lanes] the second halves' sums */
    uint64_t *bar;    /* gqm_bulk_x's mbarrier (the first 16 bytes) */
    int xstride, nsb, tm, groups; /* tm: 8 NG; groups: the canonical order's (GQ8_GROUPS_*) */
};

#define GQM_STAGE_U 8 /* (token, block) pairs a warp loads before it uses any */

/* One (token, block) pair's 8 values a lane (v0, v1: normalised already where the launch has a
 * norm) quantised as gq8_stage_quantise does: the int8 words at xw, the scale at dslot (Q8_K:
 * the block's, by lane 0; Q8_0 rows: each block of 32 over 4 lanes, by its first lane, dslot
 * that lane's block's): gqm_pre_kernel's. gqm_stage_x writes the same arithmetic out (a call
 * there cost its split kernels 4-48 bytes of spills); check_gemvq_int8_case holds the two to
 * the same bits. */
template <bool Q80>
static __device__ __forceinline__ void gqm_quant_pair(float4 v0, float4 v1, uint8_t *xw, float *dslot)
{
    const int lane = threadIdx.x & 31;
    float amax = gq8_amax8(v0, v1);
    int s;
    if (Q80) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float d = gq8_q80_d(amax);
        *(uint2 *)xw = gq8_words8(v0, v1, gq8_q80_id(d), &s);
        if ((lane & 3) == 0)
            *dslot = d;
    } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        *(uint2 *)xw = gq8_words8(v0, v1, gq8_q8k_id(amax), &s);
        if (lane == 0)
            *dslot = gq8_q8k_d(amax);
    }
}

/* 1 / rms of a token from its blocks' sums of squares, added in block order. */
static __device__ __forceinline__ float gqm_inv_rms(const float *ss, int nsb, float eps)
{
    float tot = 0.0f;
    for (int b = 0; b < nsb; b++)
        tot += ss[b];
    return rsqrtf(tot / (float)(256 * nsb) + eps);
}

/* x quantised into sh (every thread of the block; ends with a block barrier): token t's block b
 * by one warp, lane l elements 8l .. 8l + 7, normalised first when a.norm_w — the sums of
 * squares and the quantisation of gq8_stage_quantise (Q8_K blocks, or Q8_0's of 32 over 4
 * lanes for Q8_0 rows: Q80), so the words are the one-token path's.
 * Each warp loads GQM_STAGE_U pairs before it uses any (the first pass's loads come from L2;
 * one pair at a time would be a chain of L2 round trips). */
template <bool NORM, bool Q80>
static __device__ void gqm_stage_x(const struct gemv_args &a, const struct gqm_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5, T = a.T, nsb = sh.nsb;
    const int pairs = T * nsb;
    float4 v[GQM_STAGE_U][2];
    auto load = [&](int i0) {
#pragma unroll
        for (int u = 0; u < GQM_STAGE_U; u++) {
            const int i = i0 + u * W;
            if (i < pairs) {
                const float *xp = a.x + (int64_t)(i / nsb) * a.ldx + 256 * (i % nsb) + 8 * lane;
                v[u][0] = __ldg((const float4 *)xp), v[u][1] = __ldg((const float4 *)(xp + 4));
            }
        }
    };
    if (NORM) {
        for (int i0 = warp; i0 < pairs; i0 += GQM_STAGE_U * W) {
            load(i0);
#pragma unroll
            for (int u = 0; u < GQM_STAGE_U; u++) {
                const int i = i0 + u * W;
                if (i >= pairs) /* warp-uniform */
                    break;
                float ss = warp_sum(gq8_sumsq8(v[u][0], v[u][1]));
                if (lane == 0)
                    sh.ss[i] = ss; /* [t][b]: i = t nsb + b */
            }
        }
        __syncthreads();
    }
    for (int i0 = warp; i0 < pairs; i0 += GQM_STAGE_U * W) {
        load(i0); /* again: from L1 after the first pass */
#pragma unroll
        for (int u = 0; u < GQM_STAGE_U; u++) {
            const int i = i0 + u * W;
            if (i >= pairs)
                break;
            const int t = i / nsb, e = 256 * (i % nsb) + 8 * lane;
            float4 v0 = v[u][0], v1 = v[u][1];
            if (NORM) {
                float tot = 0.0f;
                for (int b2 = 0; b2 < nsb; b2++)
                    tot += sh.ss[t * nsb + b2];
                const float inv = rsqrtf(tot / (float)(256 * nsb) + a.eps);
                v0 = gemv_norm4(v0, inv, __ldg((const float4 *)(a.norm_w + e)));
                v1 = gemv_norm4(v1, inv, __ldg((const float4 *)(a.norm_w + e + 4)));
            }
            float amax = gq8_amax8(v0, v1); /* gqm_quant_pair's arithmetic, written out: its call
                                             * here cost the split kernels 4-48 bytes of spills */
            int s;
            if (Q80) { /* blocks of 32 over 4 lanes */
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float d = gq8_q80_d(amax);
                *(uint2 *)(sh.xq + t * sh.xstride + e) = gq8_words8(v0, v1, gq8_q80_id(d), &s);
                if ((lane & 3) == 0)
                    sh.dx[8 * t * nsb + e / 32] = d;
            } else {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                *(uint2 *)(sh.xq + t * sh.xstride + e) = gq8_words8(v0, v1, gq8_q8k_id(amax), &s);
                if (lane == 0)
                    sh.dx[i] = gq8_q8k_d(amax);
            }
        }
    }
    __syncthreads();
}

/* ---- x quantised once for all of a launch's blocks (a.q_pre) ----
 * The staging above is every block's work again: T K / 256 pairs of ~60-100 dependent
 * instructions after an L2 round trip, 1.44 of a 2.50 ms Qwen3-0.6B Q4_K_M step at 16 sessions
 * (docs/perf-log.md, session 41). With a.q_pre, gqm_pre_kernel normalises and quantises x once
 * into it — [T][gqm_pre_stride] int8, each token's row padded as the launch's blocks pad it in
 * shared memory, then at gqm_pre_dx the scales as sh.dx holds them — with the staging's
 * arithmetic in its order, and the product's blocks copy it (gqm_bulk_x; gqm_copy_x): the same
 * words (the tests compare every kernel case both ways, bit for bit). The session takes it from
 * cuda_options.gemvq_batch_pre sessions (default 2: the step at 16 sessions 1.85x faster,
 * docs/perf-log.md, session 42). */
static __host__ __device__ __forceinline__ int gqm_pre_stride(const struct gemv_args &a)
{
    return a.k_mixed || a.dtype != QR_Q6_K ? gqm_xstride(a.K, QR_Q4_K) : gqm_xstride(a.K, QR_Q6_K); /* Q8_0: Q4_K's */
}
/* the scales' offset: after T rows of the largest stride, whatever the launch's */
static __host__ __device__ __forceinline__ size_t gqm_pre_dx_offset(int T, int K)
{
    return ((size_t)T * gqm_xstride(K, QR_Q4_K) + 15) & ~(size_t)15;
}
static __device__ __forceinline__ float *gqm_pre_dx(uint8_t *q, int T, int K) { return (float *)(q + gqm_pre_dx_offset(T, K)); }

static_assert(GEMVQ_BATCH_PRE_KMAX == GQ8_KMAX, "the session sizes q_pre for gemvq_batch_mma's largest K");

extern "C" size_t gemvq_batch_pre_bytes(int32_t T, int32_t K)
{
    return gqm_pre_dx_offset(T, K) + (size_t)T * (K / 32) * 4; /* Q8_0 rows' scales, the most */
}

/* Block t: token t; warp b: its block b of 256 (the staging's pair (t, b), lane l elements 8l ..
 * 8l + 7). NORM: the block's sums of squares meet in shared memory, 1 / rms as the staging's. */
template <bool NORM, bool Q80>
__global__ void __launch_bounds__(32 * GQ8_KMAX / 256) gqm_pre_kernel(const __grid_constant__ struct gemv_args a)
{
    __shared__ float ss[GQ8_KMAX / 256];
    griddep_launch();
    const int lane = threadIdx.x & 31, b = threadIdx.x >> 5, t = blockIdx.x, nsb = a.K / 256, e = 256 * b + 8 * lane;
    float4 w0 = make_float4(0, 0, 0, 0), w1 = w0;
    if (NORM) /* weights: before the wait */
        w0 = __ldg((const float4 *)(a.norm_w + e)), w1 = __ldg((const float4 *)(a.norm_w + e + 4));
    griddep_wait();
    const float *xp = a.x + (int64_t)t * a.ldx + e;
    float4 v0 = __ldg((const float4 *)xp), v1 = __ldg((const float4 *)(xp + 4));
    if (NORM) {
        const float s2 = warp_sum(gq8_sumsq8(v0, v1));
        if (lane == 0)
            ss[b] = s2;
        __syncthreads();
        const float inv = gqm_inv_rms(ss, nsb, a.eps);
        v0 = gemv_norm4(v0, inv, w0), v1 = gemv_norm4(v1, inv, w1);
    }
    float *dx = gqm_pre_dx(a.q_pre, a.T, a.K);
    gqm_quant_pair<Q80>(v0, v1, a.q_pre + (int64_t)t * gqm_pre_stride(a) + e, Q80 ? dx + 8 * t * nsb + e / 32 : dx + t * nsb + b);
}

#define GQM_COPY_U 8 /* 16-byte words a thread loads before it stores any */
/* 1: gqm_pre_kernel's x comes into shared memory by bulk copies on sm_90 (gqm_bulk_x); 0: by
 * the block's own loads and stores everywhere (gqm_copy_x; -D for a variant build) */
#ifndef GQM_BULK_X
#define GQM_BULK_X 1
#endif
#if GQM_BULK_X && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GQM_BULK 1
#else
#define GQM_BULK 0
#endif

/* The bulk copy's mbarrier, initialised by thread 0 before the wait (every thread of the
 * block; ends with a block barrier that makes the initialisation visible to the waiters). */
static __device__ __forceinline__ void gqm_bulk_init(uint64_t *bar)
{
#if GQM_BULK
    if (threadIdx.x == 0) {
        mbar_init<1>(smem_u32(bar));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#else
    (void)bar;
#endif
}

/* One bulk copy of n bytes from global src to shared dst, counted on mbarrier bar. */
static __device__ __forceinline__ void gqm_bulk(void *dst, const void *src, uint32_t n, uint32_t bar)
{
#if GQM_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(n), "r"(bar)
                 : "memory");
#else
    (void)dst, (void)src, (void)n, (void)bar;
#endif
}

/* gqm_pre_kernel's x into sh by the copy engine (sm_90), counted on bar; every thread waits for
 * it. Where the block pads its rows as q_pre does (every block but a mixed launch's Q6_K tiles),
 * one copy takes all T rows, pads included; otherwise warp 0's lanes issue one row each. The
 * scales' copy is rounded up to 16 bytes: the rest lands in sh.ss, which the copied form never
 * reads, from the q_pre buffer's scale area, sized for Q8_0 rows' eight times as many. One L2
 * round trip where gqm_copy_x's loads and stores took a round of GQM_COPY_U words each and one
 * more for the scales (a batched Qwen3-0.6B Q4_K_M step at 3 sessions +12%), and one copy to
 * issue, not one a row from thread 0 (Q8_0 batches +3-8% more at 8-16 sessions, the K-quants'
 * level: docs/perf-log.md, session 43). */
template <bool Q80>
static __device__ void gqm_bulk_x(const struct gemv_args &a, const struct gqm_shared &sh, uint64_t *bar)
{
#if GQM_BULK
    const uint32_t b = smem_u32(bar), ps = (uint32_t)gqm_pre_stride(a);
    const bool one = (uint32_t)sh.xstride == ps;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const uint32_t nd = ((uint32_t)(a.T * sh.nsb * (Q80 ? 8 : 1) * 4) + 15u) & ~15u;
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
                         "r"((one ? (uint32_t)a.T * ps : (uint32_t)(a.T * a.K)) + nd)
                         : "memory");
        __syncwarp();
        if (lane == 31)
            gqm_bulk(sh.dx, gqm_pre_dx(a.q_pre, a.T, a.K), nd, b);
        if (one && lane == 0)
            gqm_bulk(sh.xq, a.q_pre, (uint32_t)a.T * ps, b);
        else if (!one && lane < a.T)
            gqm_bulk(sh.xq + (int64_t)lane * sh.xstride, a.q_pre + (int64_t)lane * ps, (uint32_t)a.K, b);
    }
    mbar_wait_parity(b, 0);
#else
    (void)a, (void)sh, (void)bar;
#endif
}

/* gqm_pre_kernel's x into sh (every thread of the block; ends with a block barrier). */
template <bool Q80>
static __device__ void gqm_copy_x(const struct gemv_args &a, const struct gqm_shared &sh)
{
    const int row16 = a.K / 16, n = a.T * row16, nd = a.T * sh.nsb * (Q80 ? 8 : 1), B = blockDim.x;
    const int ps16 = gqm_pre_stride(a) / 16;
    const uint4 *src = (const uint4 *)a.q_pre;
    for (int i0 = threadIdx.x; i0 < n; i0 += GQM_COPY_U * B) {
        uint4 r[GQM_COPY_U];
#pragma unroll
        for (int u = 0; u < GQM_COPY_U; u++)
            if (i0 + u * B < n)
                r[u] = __ldg(src + (i0 + u * B) / row16 * ps16 + (i0 + u * B) % row16);
#pragma unroll
        for (int u = 0; u < GQM_COPY_U; u++) {
            const int i = i0 + u * B;
            if (i < n)
                *(uint4 *)(sh.xq + (i / row16) * sh.xstride + 16 * (i % row16)) = r[u];
        }
    }
    const float *dx = gqm_pre_dx(a.q_pre, a.T, a.K);
    for (int i = threadIdx.x; i < nd; i += B)
        sh.dx[i] = __ldg(dx + i);
    __syncthreads();
}

/* Super-block sb's term for the lane's D element e (rows g, g, g + 8, g + 8; tokens 8j + 2c,
 * 8j + 2c + 1) of weight p: sh.part [nsb][16 P][8 NG], added in the canonical order at the end. */
static __device__ __forceinline__ void gqm_put(const struct gqm_shared &sh, int sb, int j, int p, int P, int e, float v)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    sh.part[(sb * 16 * P + (g + 8 * (e >> 1)) * P + p) * sh.tm + 8 * j + 2 * c + (e & 1)] = v;
}

/* ---- a super-block's sums, whole or half (SPLIT: two warps a super-block) ----
 * A warp's sums of its super-block for one token group: the K-quants' exact integer sums
 * (Q4_K: isum, imin; Q6_K: isum, ioff) or Q8_0's float halves of gq8_q80_tree. With SPLIT (K of
 * at most 4 super-blocks: 8 warps where there would be 4; K-quants only) warp half h takes
 * sub-blocks 4h .. 4h + 3 (Q6_K: groups 8h .. 8h + 7), half 1 leaves its sums in shared memory
 * (st) and half 0 adds them exactly (merge) before it makes the term: the same bits as one
 * warp's whole super-block. */
template <int P>
struct gqm_acc_i {
    int a[P][4], b[P][4];
    __device__ __forceinline__ void zero()
    {
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                a[p][e] = b[p][e] = 0;
    }
    /* word k of the lane at x[32 k] */
    __device__ __forceinline__ void st(uint32_t *x) const
    {
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                x[32 * (8 * p + e)] = (uint32_t)a[p][e], x[32 * (8 * p + 4 + e)] = (uint32_t)b[p][e];
    }
    __device__ __forceinline__ void merge(const uint32_t *x)
    {
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                a[p][e] += (int)x[32 * (8 * p + e)], b[p][e] += (int)x[32 * (8 * p + 4 + e)];
    }
};

template <int P>
struct gqm_acc_f { /* Q8_0's: never split (gqm_split) */
    float a[P][4];
};

#define GQM_ACC_WORDS(P) (8 * (P)) /* gqm_acc_i's words a lane (SPLIT) */

template <typename R, int P>
struct gqm_acc_of; /* R's accumulator: gqm_acc_i or gqm_acc_f */

/* ---- Q4_K ---- */

/* A row's super-block as the lane needs it: the 16-byte header (d, dmin, 12 scale bytes) and the
 * 8 bytes at 32j + 8c of each 32-byte group j of nibbles. */
struct gqm_q4k {
    static constexpr bool q80 = false; /* x in Q8_K blocks */
    uint4 h;
    uint2 q[4];
};

static __device__ __forceinline__ void gqm_load(gqm_q4k &r, const uint8_t *row, int sb)
{
    const uint8_t *b = row + 144 * sb;
    const int c = threadIdx.x & 3;
    r.h = gemv_ld_w128(b);
#pragma unroll
    for (int j = 0; j < 4; j++)
        r.q[j] = gqm_ld64(b + 16 + 32 * j + 8 * c);
}

/* Sub-block s's 6-bit scale and minimum from the header's scale bytes (words h.y, h.z, h.w). */
template <int S>
static __device__ __forceinline__ void gqm_q4k_scale(const uint4 &h, int &sc, int &m)
{
#define GQM_B(i) ((int)((((i) < 4 ? h.y : (i) < 8 ? h.z : h.w) >> (8 * ((i) & 3))) & 0xffu))
    if (S < 4) {
        sc = GQM_B(S) & 63, m = GQM_B(S + 4) & 63;
    } else {
        sc = (GQM_B(S + 4) & 0xF) | ((GQM_B(S - 4) >> 6) << 4);
        m = (GQM_B(S + 4) >> 4) | ((GQM_B(S) >> 6) << 4);
    }
#undef GQM_B
}

/* One super-block sb of the tile (rows r[0] = g, r[1] = g + 8 of each of the P weights) for the
 * token group j (B's column g is token 8j + g), its terms put in sh.part (rows g, g, g + 8, g + 8;
 * tokens 8j + 2c, 8j + 2c + 1). */
template <int P>
struct gqm_acc_of<gqm_q4k, P> {
    typedef gqm_acc_i<P> type;
};

/* Sub-blocks of the half H (-1: all 8) of super-block sb for token group j (B's column g is token
 * 8j + g): isum (acc.a) and imin (acc.b) for the lane's D elements (rows g, g, g + 8, g + 8;
 * tokens 8j + 2c, 8j + 2c + 1) of each of the P weights. */
template <int H, int P>
static __device__ __forceinline__ void gqm_sums(const gqm_q4k (&r)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                int T, gqm_acc_i<P> &acc)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int tok = min(8 * j + g, T - 1);
    const uint8_t *xr = sh.xq + tok * sh.xstride + 256 * sb + 8 * c;
    int (&isum)[P][4] = acc.a, (&imin)[P][4] = acc.b;
    acc.zero();
#pragma unroll
    for (int s = 0; s < 8; s++) {
        if (H >= 0 && s / 4 != H)
            continue;
        const uint2 xw = *(const uint2 *)(xr + 32 * s);
        int ones[4] = {0, 0, 0, 0};
        mma_s8_16832(ones, GQM_ONES, GQM_ONES, GQM_ONES, GQM_ONES, xw.x, xw.y);
        const int jp = s >> 1, sh4 = 4 * (s & 1);
#pragma unroll
        for (int p = 0; p < P; p++) {
            int dd[4] = {0, 0, 0, 0};
            mma_s8_16832(dd, (r[0][p].q[jp].x >> sh4) & 0x0F0F0F0Fu, (r[1][p].q[jp].x >> sh4) & 0x0F0F0F0Fu,
                         (r[0][p].q[jp].y >> sh4) & 0x0F0F0F0Fu, (r[1][p].q[jp].y >> sh4) & 0x0F0F0F0Fu, xw.x, xw.y);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int sc, m;
                switch (s) { /* the sub-block as a constant: no indexing into the header by s */
                case 0: gqm_q4k_scale<0>(r[h][p].h, sc, m); break;
                case 1: gqm_q4k_scale<1>(r[h][p].h, sc, m); break;
                case 2: gqm_q4k_scale<2>(r[h][p].h, sc, m); break;
                case 3: gqm_q4k_scale<3>(r[h][p].h, sc, m); break;
                case 4: gqm_q4k_scale<4>(r[h][p].h, sc, m); break;
                case 5: gqm_q4k_scale<5>(r[h][p].h, sc, m); break;
                case 6: gqm_q4k_scale<6>(r[h][p].h, sc, m); break;
                default: gqm_q4k_scale<7>(r[h][p].h, sc, m); break;
                }
                isum[p][2 * h] += sc * dd[2 * h], isum[p][2 * h + 1] += sc * dd[2 * h + 1];
                imin[p][2 * h] += m * ones[2 * h], imin[p][2 * h + 1] += m * ones[2 * h + 1];
            }
        }
    }
}

/* Super-block sb's terms from the whole sums, put in sh.part. */
template <int P>
static __device__ __forceinline__ void gqm_terms(const gqm_q4k (&r)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                 int T, const gqm_acc_i<P> &acc)
{
    const int c = threadIdx.x & 3, t0 = min(8 * j + 2 * c, T - 1), t1 = min(8 * j + 2 * c + 1, T - 1);
    const float dx0 = sh.dx[t0 * sh.nsb + sb], dx1 = sh.dx[t1 * sh.nsb + sb];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t hx = r[e >> 1][p].h.x;
            const float d = gqm_half(hx & 0xffffu), dmin = gqm_half(hx >> 16);
            gqm_put(sh, sb, j, p, P, e, gq8_term_q4k(e & 1 ? dx1 : dx0, d, dmin, acc.a[p][e], acc.b[p][e]));
        }
}

/* ---- Q6_K ---- */

/* A row's super-block as the lane needs it (210 bytes, only 2-byte aligned: each word the lane
 * needs is two aligned words shifted right by sh bits, 0 or 16): for half hh, the 4 words of low
 * bits at 64hh + 16k + 4c, the 2 words of high bits at 128 + 32hh + 16s + 4c, the 16 scales from
 * 192 (5 aligned words), d at 208. */
struct gqm_q6k {
    static constexpr bool q80 = false;
    uint32_t ql[2][4][2], qh[2][2][2], sc[5], d;
    uint32_t sh;
};

static __device__ __forceinline__ void gqm_pair(const uint8_t *p, uint32_t (&w)[2])
{
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    w[0] = gqm_ld32(a), w[1] = gqm_ld32(a + 4); /* inside the super-block for every word taken */
}

static __device__ __forceinline__ void gqm_load(gqm_q6k &r, const uint8_t *row, int sb)
{
    const uint8_t *b = row + 210 * sb;
    const int c = threadIdx.x & 3;
    r.sh = 8u * (uint32_t)((uintptr_t)b & 3);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            gqm_pair(b + 64 * hh + 16 * k + 4 * c, r.ql[hh][k]);
#pragma unroll
        for (int s = 0; s < 2; s++)
            gqm_pair(b + 128 + 32 * hh + 16 * s + 4 * c, r.qh[hh][s]);
    }
    const uint8_t *sa = (const uint8_t *)((uintptr_t)(b + 192) & ~(uintptr_t)3);
#pragma unroll
    for (int k = 0; k < 4; k++)
        r.sc[k] = gqm_ld32(sa + 4 * k);
    r.sc[4] = r.sh ? gqm_ld32(sa + 16) : 0u; /* aligned: the 16 scales end at a word's end */
    r.d = (uint32_t)__ldg((const unsigned short *)(b + 208));
}

/* Group G's (16 elements) 6-bit quants of the lane's 4 elements, unsigned, and its scale. */
template <int G>
static __device__ __forceinline__ uint32_t gqm_q6k_quants(const gqm_q6k &r)
{
    constexpr int hh = G >> 3, q4 = (G & 7) >> 1, s = G & 1, k = (q4 & 1) ? 2 + s : s;
    const uint32_t L = __funnelshift_r(r.ql[hh][k][0], r.ql[hh][k][1], r.sh);
    const uint32_t H = __funnelshift_r(r.qh[hh][s][0], r.qh[hh][s][1], r.sh);
    const uint32_t nib = q4 >= 2 ? (L >> 4) & 0x0F0F0F0Fu : L & 0x0F0F0F0Fu;
    return nib | (((H >> (2 * q4)) & 0x03030303u) << 4);
}

template <int G>
static __device__ __forceinline__ int gqm_q6k_scale(const gqm_q6k &r)
{
    const uint32_t w = __funnelshift_r(r.sc[G >> 2], r.sc[(G >> 2) + 1], r.sh);
    return (int)(int8_t)(uint8_t)(w >> (8 * (G & 3)));
}

template <int P>
struct gqm_acc_of<gqm_q6k, P> {
    typedef gqm_acc_i<P> type;
};

template <int G, int P>
static __device__ __forceinline__ void gqm_group_q6k(const gqm_q6k (&r)[2][P], const uint8_t *xr, int (&isum)[P][4],
                                                     int (&ioff)[P][4])
{
    const uint32_t xw = *(const uint32_t *)(xr + 16 * G);
    int ones[4] = {0, 0, 0, 0};
    mma_s8_16816(ones, GQM_ONES, GQM_ONES, xw);
#pragma unroll
    for (int p = 0; p < P; p++) {
        int dd[4] = {0, 0, 0, 0};
        mma_s8_16816(dd, gqm_q6k_quants<G>(r[0][p]), gqm_q6k_quants<G>(r[1][p]), xw);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sc = gqm_q6k_scale<G>(r[h][p]);
            isum[p][2 * h] += sc * dd[2 * h], isum[p][2 * h + 1] += sc * dd[2 * h + 1];
            ioff[p][2 * h] += sc * ones[2 * h], ioff[p][2 * h + 1] += sc * ones[2 * h + 1];
        }
    }
}

/* Groups of the half H (-1: all 16) of super-block sb: isum (acc.a) and ioff (acc.b). */
template <int H, int P>
static __device__ __forceinline__ void gqm_sums(const gqm_q6k (&r)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                int T, gqm_acc_i<P> &acc)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int tok = min(8 * j + g, T - 1);
    const uint8_t *xr = sh.xq + tok * sh.xstride + 256 * sb + 4 * c;
    int (&isum)[P][4] = acc.a, (&ioff)[P][4] = acc.b;
    acc.zero();
    if (H <= 0) {
        gqm_group_q6k<0>(r, xr, isum, ioff), gqm_group_q6k<1>(r, xr, isum, ioff);
        gqm_group_q6k<2>(r, xr, isum, ioff), gqm_group_q6k<3>(r, xr, isum, ioff);
        gqm_group_q6k<4>(r, xr, isum, ioff), gqm_group_q6k<5>(r, xr, isum, ioff);
        gqm_group_q6k<6>(r, xr, isum, ioff), gqm_group_q6k<7>(r, xr, isum, ioff);
    }
    if (H != 0) {
        gqm_group_q6k<8>(r, xr, isum, ioff), gqm_group_q6k<9>(r, xr, isum, ioff);
        gqm_group_q6k<10>(r, xr, isum, ioff), gqm_group_q6k<11>(r, xr, isum, ioff);
        gqm_group_q6k<12>(r, xr, isum, ioff), gqm_group_q6k<13>(r, xr, isum, ioff);
        gqm_group_q6k<14>(r, xr, isum, ioff), gqm_group_q6k<15>(r, xr, isum, ioff);
    }
}

template <int P>
static __device__ __forceinline__ void gqm_terms(const gqm_q6k (&r)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                 int T, const gqm_acc_i<P> &acc)
{
    const int c = threadIdx.x & 3, t0 = min(8 * j + 2 * c, T - 1), t1 = min(8 * j + 2 * c + 1, T - 1);
    const float dx0 = sh.dx[t0 * sh.nsb + sb], dx1 = sh.dx[t1 * sh.nsb + sb];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float d = gqm_half(r[e >> 1][p].d);
            gqm_put(sh, sb, j, p, P, e, gq8_term_q6k(e & 1 ? dx1 : dx0, d, acc.a[p][e] - 32 * acc.b[p][e]));
        }
}

/* ---- Q8_0 ---- */

/* A row's super-block as the lane needs it: of each block k (34 bytes: an f16 scale, 32 int8)
 * the 8 quants at 2 + 8c and the scale. Super-blocks are 272 bytes, so block k starts 2 bytes
 * past a word when k is odd: an even block's quants are read as three aligned words (w[k / 2]),
 * an odd one's as two (v[k / 2]). */
struct gqm_q80 {
    static constexpr bool q80 = true; /* x in Q8_0 blocks */
    uint32_t w[4][3], v[4][2], d[8];
};

static __device__ __forceinline__ void gqm_load(gqm_q80 &r, const uint8_t *row, int sb)
{
    const uint8_t *b = row + 272 * sb;
    const int c = threadIdx.x & 3;
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        const uint8_t *e = b + 34 * k + 8 * c, *o = b + 34 * (k + 1) + 2 + 8 * c; /* word-aligned */
        r.w[k / 2][0] = gqm_ld32(e), r.w[k / 2][1] = gqm_ld32(e + 4), r.w[k / 2][2] = gqm_ld32(e + 8);
        r.v[k / 2][0] = gqm_ld32(o), r.v[k / 2][1] = gqm_ld32(o + 4);
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        r.d[k] = (uint32_t)__ldg((const unsigned short *)(b + 34 * k));
}

/* Block K's two words of the lane's quants. */
template <int K>
static __device__ __forceinline__ uint2 gqm_q80_words(const gqm_q80 &r)
{
    if (K % 2)
        return make_uint2(r.v[K / 2][0], r.v[K / 2][1]);
    return make_uint2(__funnelshift_r(r.w[K / 2][0], r.w[K / 2][1], 16), __funnelshift_r(r.w[K / 2][1], r.w[K / 2][2], 16));
}

/* Block K's terms (gq8_term_q80) for the lane's D elements of each of the P weights. */
template <int K, int P>
static __device__ __forceinline__ void gqm_block_q80(const gqm_q80 (&r)[2][P], const uint8_t *xr, const float *dx0,
                                                     const float *dx1, float (&t)[P][4])
{
    const uint2 xw = *(const uint2 *)(xr + 32 * K);
    const float x0 = dx0[K], x1 = dx1[K];
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint2 a = gqm_q80_words<K>(r[0][p]), b = gqm_q80_words<K>(r[1][p]);
        int dd[4] = {0, 0, 0, 0};
        mma_s8_16832(dd, a.x, b.x, a.y, b.y, xw.x, xw.y);
#pragma unroll
        for (int e = 0; e < 4; e++)
            t[p][e] = gq8_term_q80(gqm_half(r[e >> 1][p].d[K]), e & 1 ? x1 : x0, dd[e]);
    }
}

/* a[p][e] = a + t, in place. */
template <int P>
static __device__ __forceinline__ void gqm_add(float (&a)[P][4], const float (&t)[P][4])
{
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            a[p][e] = __fadd_rn(a[p][e], t[p][e]);
}

template <int P>
struct gqm_acc_of<gqm_q80, P> {
    typedef gqm_acc_f<P> type;
};

/* One half of gq8_q80_tree over super-block sb's blocks: O = 0 the even ones, (t0 + t4) + (t2 +
 * t6), O = 1 the odd ones, (t1 + t5) + (t3 + t7). */
template <int O, int P>
static __device__ __forceinline__ void gqm_half_q80(const gqm_q80 (&r)[2][P], const uint8_t *xr, const float *dx0,
                                                    const float *dx1, float (&a)[P][4])
{
    float b[P][4], t[P][4];
    gqm_block_q80<O, P>(r, xr, dx0, dx1, a), gqm_block_q80<O + 4, P>(r, xr, dx0, dx1, t), gqm_add<P>(a, t);
    gqm_block_q80<O + 2, P>(r, xr, dx0, dx1, b), gqm_block_q80<O + 6, P>(r, xr, dx0, dx1, t), gqm_add<P>(b, t);
    gqm_add<P>(a, b);
}

/* A super-block of Q8_0 rows: one mma.m16n8k32 per block, the 8 blocks' terms added by
 * gq8_q80_tree's pairs as they come ((0, 4), (2, 6), then (1, 5), (3, 7)), in acc.a. Whole
 * super-blocks only (H = -1): a split cost Q8_0 launches 1-16% (docs/perf-log.md, session 41). */
template <int H, int P>
static __device__ __forceinline__ void gqm_sums(const gqm_q80 (&r)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                int T, gqm_acc_f<P> &acc)
{
    static_assert(H < 0, "Q8_0 rows are not split");
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int tok = min(8 * j + g, T - 1), t0 = min(8 * j + 2 * c, T - 1), t1 = min(8 * j + 2 * c + 1, T - 1);
    const uint8_t *xr = sh.xq + tok * sh.xstride + 256 * sb + 8 * c;
    const float *dx0 = sh.dx + 8 * (t0 * sh.nsb + sb), *dx1 = sh.dx + 8 * (t1 * sh.nsb + sb);
    float o[P][4];
    gqm_half_q80<0, P>(r, xr, dx0, dx1, acc.a);
    gqm_half_q80<1, P>(r, xr, dx0, dx1, o);
    gqm_add<P>(acc.a, o);
}

template <int P>
static __device__ __forceinline__ void gqm_terms(const gqm_q80 (&)[2][P], const struct gqm_shared &sh, int sb, int j,
                                                 int, const gqm_acc_f<P> &acc)
{
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            gqm_put(sh, sb, j, p, P, e, acc.a[p][e]);
}

/* Super-block sb of the tile for every token group: the sums (SPLIT: this warp's half, the
 * halves met in sh.xch across a block barrier, which every warp of the block reaches), the
 * terms put in sh.part. */
template <bool SPLIT, typename R, int P, int NG>
static __device__ __forceinline__ void gqm_super(const R (&r)[2][P], const struct gqm_shared &sh, int sb, int half, int T)
{
    typename gqm_acc_of<R, P>::type acc[NG];
    if constexpr (!SPLIT) {
#pragma unroll
        for (int j = 0; j < NG; j++)
            gqm_sums<-1, P>(r, sh, sb, j, T, acc[j]);
    } else {
        uint32_t *x = sh.xch + (sb * NG * GQM_ACC_WORDS(P)) * 32 + (threadIdx.x & 31);
        if (half) { /* warp-uniform */
#pragma unroll
            for (int j = 0; j < NG; j++) {
                gqm_sums<1, P>(r, sh, sb, j, T, acc[j]);
                acc[j].st(x + j * GQM_ACC_WORDS(P) * 32);
            }
        } else {
#pragma unroll
            for (int j = 0; j < NG; j++)
                gqm_sums<0, P>(r, sh, sb, j, T, acc[j]);
        }
        __syncthreads();
        if (half)
            return;
#pragma unroll
        for (int j = 0; j < NG; j++)
            acc[j].merge(x + j * GQM_ACC_WORDS(P) * 32);
    }
#pragma unroll
    for (int j = 0; j < NG; j++)
        gqm_terms<P>(r, sh, sb, j, T, acc[j]);
}

/* ---- the kernel ---- */

/* The P weight rows g and g + 8 of tile `tile` (past the end: row 0, unused). */
template <int P>
static __device__ __forceinline__ void gqm_rows(const struct gemv_args &a, int64_t tile, const uint8_t *(&rp)[2][P])
{
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 *src[P];
        float *yp;
        gemv_seg_row<P>(a, 16 * tile + g + 8 * h, src, yp);
#pragma unroll
        for (int p = 0; p < P; p++)
            rp[h][p] = (const uint8_t *)src[p];
    }
}

template <typename R, int P>
static __device__ __forceinline__ void gqm_load_tile(const struct gemv_args &a, R (&dst)[2][P], int64_t tile, int sb)
{
    const uint8_t *rp[2][P];
    gqm_rows<P>(a, tile, rp);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < P; p++)
            gqm_load(dst[h][p], rp[h][p], sb);
}

/* A finished tile: one thread per (row, token) adds its super-blocks' terms from sh.part in the
 * canonical order (quant_rows_i8.cuh: by groups of sb % G, then the groups' tree), SwiGLU's the
 * pair, stores or adds to y. Every thread of the block; barriers before and after. */
template <int P, int NG>
static __device__ void gqm_finish_tile(const struct gemv_args &a, int64_t tile, const struct gqm_shared &sh)
{
    constexpr int TM = 8 * NG;
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * TM; i += blockDim.x) {
        const int r = i / TM, tk = i % TM;
        int sg;
        int64_t rr;
        if (tk >= a.T || !gemv_seg_of<P>(a, 16 * tile + r, sg, rr))
            continue;
        float sum[P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const float *t = sh.part + (r * P + p) * TM + tk; /* super-block sb at t[sb 16 P TM] */
            sum[p] = sh.groups == GQ8_GROUPS_Q4K ? gq8_canon_row<GQ8_GROUPS_Q4K>(t, (int64_t)16 * P * TM, sh.nsb)
                                                 : gq8_canon_row<GQ8_GROUPS_Q6K>(t, (int64_t)16 * P * TM, sh.nsb);
        }
        float v = sum[0];
        if (P == 2)
            v = v / (1.0f + __expf(-v)) * sum[P - 1];
        float *y = a.seg[sg].y + rr + (int64_t)tk * a.seg[sg].ldy;
        *y = a.mode == GEMV_ACCUM ? *y + v : v;
    }
    __syncthreads(); /* sh.part is the next tile's */
}

/* The block's tiles blockIdx.x, blockIdx.x + gridDim.x, ... of rows of type R (gqm_q4k /
 * gqm_q6k): the first super-block's loads before the wait, x staged once, then each warp's
 * super-blocks of each tile in turn, the next one's loads in flight while one is summed where P =
 * 1 (across tiles too: an LM head's block walks ~36 tiles). */
template <typename R, int P, bool NORM, int NG, bool SPLIT, bool PRE>
static __device__ void gqm_tiles(const struct gemv_args &a, int64_t n_tiles, struct gqm_shared &sh)
{
    const int warp = threadIdx.x >> 5, W = blockDim.x >> 5, nsb = sh.nsb, T = a.T;
    const int half = SPLIT ? warp / nsb : 0; /* SPLIT: W = 2 nsb, a super-block per pair of warps */
    int64_t tile = blockIdx.x;
    int sb = SPLIT ? warp % nsb : warp;
    R w[2][P];
    gqm_load_tile<R, P>(a, w, tile, sb); /* the weights do not depend on the launch before */
    if constexpr (PRE && GQM_BULK)
        gqm_bulk_init(sh.bar);
    griddep_wait();
    if constexpr (PRE && GQM_BULK)
        gqm_bulk_x<R::q80>(a, sh, sh.bar);
    else if constexpr (PRE)
        gqm_copy_x<R::q80>(a, sh);
    else
        gqm_stage_x<NORM, R::q80>(a, sh);
    while (tile < n_tiles) {
        int64_t next_tile = tile;
        int next_sb = SPLIT ? sb : sb + W;
        if (SPLIT || next_sb >= nsb)
            next_tile += gridDim.x, next_sb = SPLIT ? sb : warp;
        const bool more = next_tile < n_tiles;
        if (P == 1 && more) {
            R wn[2][P];
            gqm_load_tile<R, P>(a, wn, next_tile, next_sb);
            gqm_super<SPLIT, R, P, NG>(w, sh, sb, half, T);
#pragma unroll
            for (int h = 0; h < 2; h++)
                w[h][0] = wn[h][0];
        } else {
            gqm_super<SPLIT, R, P, NG>(w, sh, sb, half, T);
            if (more)
                gqm_load_tile<R, P>(a, w, next_tile, next_sb);
        }
        if (next_tile != tile)
            gqm_finish_tile<P, NG>(a, tile, sh);
        tile = next_tile, sb = next_sb;
    }
}

template <int P, bool NORM, int NG, bool Q80, bool SPLIT, bool PRE>
__global__ void __launch_bounds__(32 * GQM_MAX_WARPS, SPLIT ? 2 : GQM_MINB) gemvq_batch_mma_kernel(const __grid_constant__ struct gemv_args a)
{
    extern __shared__ __align__(16) uint8_t gqm_smem[];
    griddep_launch();
    constexpr int TM = 8 * NG;
    const int T = a.T, nsb = a.K / 256;
    int64_t rows = a.seg[0].N;
    for (int i = 1; P == 1 && i < a.n_seg; i++)
        rows += a.seg[i].N;
    const int64_t n_tiles = (rows + 15) / 16;
    int sg;
    int64_t rr;
    gemv_seg_of<P>(a, (int64_t)blockIdx.x * 16, sg, rr); /* a mixed launch: a tile per block */
    const int dt = Q80 ? QR_Q8_0 : a.k_mixed ? a.seg[sg].dtype : a.dtype;
    struct gqm_shared sh;
    sh.nsb = nsb, sh.xstride = Q80 ? a.K + 32 : gqm_xstride(a.K, dt), sh.tm = TM; /* Q8_0: Q4_K's pad */
    sh.groups = Q80 ? GQ8_GROUPS_Q80 : dt == QR_Q4_K ? GQ8_GROUPS_Q4K : GQ8_GROUPS_Q6K;
    sh.bar = (uint64_t *)gqm_smem;
    sh.part = (float *)(gqm_smem + 16);                /* [nsb][16 P][TM] */
    sh.dx = sh.part + nsb * 16 * P * TM;               /* [T][nsb] (Q8_0: [T][8 nsb]) */
    sh.ss = sh.dx + T * nsb * (Q80 ? 8 : 1);           /* [T][nsb] */
    sh.xq = (uint8_t *)(((uintptr_t)(sh.ss + T * nsb) + 15) & ~(uintptr_t)15); /* [T][xstride] */
    sh.xch = (uint32_t *)(sh.xq + T * gqm_xstride(a.K, QR_Q4_K));                  /* the larger pad */
    if constexpr (Q80) /* a kernel of its own: the K-quants' registers as they were */
        gqm_tiles<gqm_q80, P, NORM, NG, SPLIT, PRE>(a, n_tiles, sh);
    else if (dt == QR_Q4_K)
        gqm_tiles<gqm_q4k, P, NORM, NG, SPLIT, PRE>(a, n_tiles, sh);
    else
        gqm_tiles<gqm_q6k, P, NORM, NG, SPLIT, PRE>(a, n_tiles, sh);
}

/* ---- host ---- */

/* Whether a launch takes two warps a super-block (SPLIT): where K has at most half as many
 * super-blocks as a block's warps (K = 1,024: 8 warps of half a super-block where there were 4
 * of one), its rows are K-quants, and it has at most 4 tiles an SM. A warp's chain
 * of ~2,200 instructions at ~10 cycles each was the launch (session 40); the split kernels keep
 * to 128 registers (2 blocks of 8 warps an SM; spills of 0.2-1.2 KB a thread). Measured
 * (docs/perf-log.md, session 41; GQM_SPLIT 0 never, 1 every K-quant launch K allows, 2 this
 * rule): the LM heads (36-60 tiles a block) lose with the split, and so does every Q8_0 launch;
 * against no split, Qwen3-0.6B Q4_K_M's q|k|v and gate|up gain 1-4% at 3 sessions and 10-15%
 * at 8-16, Qwen3.5-0.8B's in_proj (514 tiles) 2-3% at 8-16 (one round). */
#ifndef GQM_SPLIT
#define GQM_SPLIT 2
#endif
#ifndef GQM_SPLIT_TILES_PER_SM
#define GQM_SPLIT_TILES_PER_SM 4 /* GQM_SPLIT 2: a launch of at most this many tiles an SM splits */
#endif
static bool gqm_split(const struct gemv_args *a)
{
    if (!GQM_SPLIT || 2 * (a->K / 256) > GQM_MAX_WARPS || (!a->k_mixed && a->dtype == QR_Q8_0))
        return false;
    const int64_t tiles = (gemv_launch_rows(a) + 15) / 16;
    return GQM_SPLIT == 1 || tiles <= GQM_SPLIT_TILES_PER_SM * (int64_t)(a->n_sm > 0 ? a->n_sm : 132);
}

/* Warps per block: the super-blocks of K in the fewest rounds of at most GQM_MAX_WARPS warps,
 * spread evenly (K = 3072: 6 warps of 2; 3584: 7 of 2; 1024: 4 of 1), or two a super-block. */
static int gqm_warps(const struct gemv_args *a)
{
    const int nsb = a->K / 256, rounds = (nsb + GQM_MAX_WARPS - 1) / GQM_MAX_WARPS;
    return gqm_split(a) ? 2 * nsb : (nsb + rounds - 1) / rounds;
}

static size_t gqm_smem_bytes(const struct gemv_args *a, int P, int NG)
{
    const int nsb = a->K / 256;
    size_t part = (size_t)nsb * 16 * P * 8 * NG * 4, scales = (size_t)a->T * (nsb + a->K / 32) * 4; /* ss, dx */
    size_t xch = gqm_split(a) ? (size_t)nsb * NG * GQM_ACC_WORDS(P) * 32 * 4 : 0;
    return 16 + part + scales + 16 + (size_t)a->T * gqm_xstride(a->K, QR_Q4_K) + xch; /* bar; the larger pad */
}

bool gemvq_batch_mma_applies(const struct gemv_args *a)
{
    if (a->T < 2 || a->T > GEMV_BATCH_MMA_MAX_T || a->y_copy || a->n_seg < 1 || a->n_seg > GEMV_MAX_SEG ||
        a->K < 256 || a->K % 256 || a->K > GQ8_KMAX || a->ldx % 4 || (uintptr_t)a->x % 16 ||
        (uintptr_t)a->norm_w % 16 || (uintptr_t)a->q_pre % 16)
        return false;
    if (a->mode == GEMV_SWIGLU ? a->n_seg != 2 || a->seg[1].N != a->seg[0].N
                               : a->mode != GEMV_STORE && a->mode != GEMV_ACCUM)
        return false;
    int64_t start = 0;
    for (int i = 0; i < a->n_seg; i++) {
        int32_t dt = a->k_mixed ? a->seg[i].dtype : a->dtype;
        size_t rb = 0;
        if ((dt != QR_Q4_K && dt != QR_Q6_K && (dt != QR_Q8_0 || a->k_mixed)) || !dtype_row_bytes((enum qr_dtype)dt, a->K, &rb) ||
            (int64_t)rb != a->seg[i].row_bytes || a->seg[i].N < 1 || a->seg[i].ldy < a->seg[i].N)
            return false;
        /* Q4_K: 16- and 8-byte loads; Q6_K: 2-byte aligned fields read as aligned words; Q8_0:
         * words from word-aligned rows (272-byte super-blocks) */
        if ((uintptr_t)a->seg[i].w % (dt == QR_Q4_K ? 16 : dt == QR_Q8_0 ? 4 : 2))
            return false;
        /* a tile takes one dtype: SwiGLU's gate and up alike, a mixed launch's segments of
         * another dtype than the one before start at a multiple of 16 rows */
        int32_t prev = i ? (a->k_mixed ? a->seg[i - 1].dtype : a->dtype) : dt;
        if (a->mode == GEMV_SWIGLU ? i == 1 && dt != prev : dt != prev && start % 16)
            return false;
        start += a->seg[i].N;
    }
    return true;
}

template <int P, bool NORM, int NG, bool Q80, bool SPLIT, bool PRE>
static cudaError_t gqm_launch(const struct gemv_args *a, cudaStream_t s)
{
    const size_t smem = gqm_smem_bytes(a, P, NG);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(gemvq_batch_mma_kernel<P, NORM, NG, Q80, SPLIT, PRE>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
    }
    const int threads = 32 * gqm_warps(a);
    const int64_t tiles = (gemv_launch_rows(a) + 15) / 16;
    int64_t blocks = tiles;
    int per_sm = 0;
    if (!a->k_mixed && /* a mixed launch keeps a tile per block: one dtype each */
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemvq_batch_mma_kernel<P, NORM, NG, Q80, SPLIT, PRE>, threads, smem) ==
            cudaSuccess &&
        per_sm > 0) {
        const int64_t fit = (int64_t)per_sm * (a->n_sm > 0 ? a->n_sm : 132);
        blocks = tiles < fit ? tiles : fit;
    }
    return launch_k(a->pdl, gemvq_batch_mma_kernel<P, NORM, NG, Q80, SPLIT, PRE>, dim3((unsigned)blocks), dim3(threads), smem, s, *a);
}

template <int NG, bool Q80, bool SPLIT>
static cudaError_t gqm_launch_ng(const struct gemv_args *a, cudaStream_t s)
{
    if (a->q_pre) /* the norm was gqm_pre_kernel's */
        return a->mode == GEMV_SWIGLU ? gqm_launch<2, false, NG, Q80, SPLIT, true>(a, s)
                                      : gqm_launch<1, false, NG, Q80, SPLIT, true>(a, s);
    if (a->mode == GEMV_SWIGLU)
        return a->norm_w ? gqm_launch<2, true, NG, Q80, SPLIT, false>(a, s) : gqm_launch<2, false, NG, Q80, SPLIT, false>(a, s);
    return a->norm_w ? gqm_launch<1, true, NG, Q80, SPLIT, false>(a, s) : gqm_launch<1, false, NG, Q80, SPLIT, false>(a, s);
}

template <bool SPLIT>
static cudaError_t gqm_launch_split(const struct gemv_args *a, cudaStream_t s)
{
    if (!a->k_mixed && a->dtype == QR_Q8_0) {
        if constexpr (SPLIT) /* gqm_split never splits Q8_0 rows: their split kernels are not built */
            return cudaErrorInvalidValue;
        else
            return a->T > 8 ? gqm_launch_ng<2, true, SPLIT>(a, s) : gqm_launch_ng<1, true, SPLIT>(a, s);
    }
    return a->T > 8 ? gqm_launch_ng<2, false, SPLIT>(a, s) : gqm_launch_ng<1, false, SPLIT>(a, s);
}

cudaError_t launch_gemvq_batch_mma(const struct gemv_args *a, cudaStream_t s)
{
    if (!gemvq_batch_mma_applies(a))
        return cudaErrorInvalidValue;
    if (a->q_pre) {
        const bool q80 = !a->k_mixed && a->dtype == QR_Q8_0;
        void (*k)(const struct gemv_args) = a->norm_w ? (q80 ? gqm_pre_kernel<true, true> : gqm_pre_kernel<true, false>)
                                                      : (q80 ? gqm_pre_kernel<false, true> : gqm_pre_kernel<false, false>);
        cudaError_t e = launch_k(a->pdl, k, dim3((unsigned)a->T), dim3(32 * (a->K / 256)), 0, s, *a);
        if (e != cudaSuccess)
            return e;
    }
    return gqm_split(a) ? gqm_launch_split<true>(a, s) : gqm_launch_split<false>(a, s);
}
