/*
 * gemv_quant.cu — the decode GEMV for quantised weights (Q8_0, Q4_K, Q6_K), one token: what
 * gemv2 (matmul.cu) is for float weights.
 *
 * The first GEMV kernel (gemv_kernel) walks a quantised row 32 elements at a time, each lane
 * reading its block's bytes and x from global memory as it goes: one round trip after another.
 * Here each warp owns R rows (each a gate/up pair with SwiGLU; R = 1 for K-quant rows, 2 for
 * Q8_0, 4 in products of 32,768 rows or more such as the LM head) and copies their raw bytes
 * into its slice of shared memory with cp.async before griddep_wait, all copies in flight at
 * once; the block stages x (normalised when the norm is fused, gemv_stage.cuh) meanwhile;
 * then each lane gathers the x of the blocks it walks into registers, once for the warp's
 * rows, and forms its part of each dot product from shared memory with the megakernel's row
 * functions (quant_rows.cuh), so the graph and the megakernel sum in the same order.
 *
 * Applies (gemvq_applies) for T = 1, K = 1024, 2048, 3072 or 3584 (SwiGLU: 1024), every segment of
 * the launch's dtype with rows that are whole copy units (16 bytes; 8 for Q6_K, whose
 * 210-byte super-blocks leave rows 8-byte aligned), and x 16-byte aligned; otherwise the
 * first kernel runs. k_mixed launches (Q4_K_M's q|k|v: Q4_K and Q6_K segments, each warp's
 * row of one) take gemvq alone: one launch instead of a norm and three GEMVs.
 *
 * With 8-bit x the rows add their super-blocks in quant_rows_i8.cuh's canonical order (each
 * super-block's integer sums, or Q8_0's block terms, halved over its lanes, one term per lane, a
 * tree), the order of gemvq_batch_mma.cu's batched rows. gemv_args.q_one_pass (cuda_options.gemvq_one_pass; the kernels' ONE) stages x
 * without the float copy: each warp loads its 256-element blocks of x, and the block
 * normalises and quantises them in registers (quant_rows_i8.cuh, gq8_stage_quantise: two
 * block barriers with a fused norm, one without, against gemv_stage_x + gq8_quantise's three);
 * built for 2 rows per warp (8-bit x's shape), the mixed q|k|v launch and the LM head's loop.
 *
 * Block shape: 4 warps by default; gemv_args.q_warps (8) and q_smem_kb (shared memory reserved,
 * so that fewer blocks share a multiprocessor) are calibration choices (cuda_options).
 * The LM heads (32,768 rows or more at K = 1024) run gemvq_loop_kernel by default: a few blocks
 * per multiprocessor that stage and gather x once and loop over tiles of rows, copying the
 * next tile while summing the current one (gemv_args.q_head_blocks; docs/perf-log.md, session 17).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_stage.cuh"
#include "backend/cuda/quant_rows.cuh"
#include "backend/cuda/quant_rows_i8.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#ifndef GQ_WARPS
#define GQ_WARPS 4 /* warps per block by default (gemv_args.q_warps: 8) */
#endif
#ifndef GQ_SMEM_MAX
/* dynamic shared memory of a default block (GQ_WARPS warps, nothing reserved) at most: under
 * the 48 KB that needs no attribute; other shapes go up to GEMVQ_SMEM_KB_LIMIT (a block that
 * reserves more so that fewer launches' blocks share a multiprocessor is gemv_args.q_smem_kb,
 * once the -D switch GQ_SMEM_MIN: sessions 15 and 17) */
#define GQ_SMEM_MAX (47 * 1024)
#endif
#define GQ_KMIXED (-1) /* the DT of k_mixed launches */

/* An asynchronous copy of CB bytes (4, 8 or 16) from global into shared memory. */
template <int CB>
__device__ __forceinline__ void gq_copy(uint32_t dst, const void *src)
{
    if (CB == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if (CB == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

/* Where row r of segment g starts in its shared-memory copy: 0, or 4 for Q6_K rows that start 4
 * bytes past a copy unit (Qwen3.5-0.8B's down product: rows of 14 super-blocks, 2,940 bytes, so
 * every other row; gemvq_shape). The Q6_K dot products read the row in 2-byte units, and a shift
 * of 4 keeps every field's alignment to 4 bytes as it was. */
#define GQ_SHIFTED(CB, NSB) ((CB) == 8 && (210 * (NSB)) % 8 != 0) /* Q6_K rows not whole units */

template <int CB, int NSB>
__device__ __forceinline__ uint32_t gq_row_shift(const struct gemv_seg &g, int64_t r)
{
    if (!GQ_SHIFTED(CB, NSB)) /* whole units from aligned starts (gemvq_shape): no shift */
        return 0u;
    return (uint32_t)(((uintptr_t)g.w + (uintptr_t)(r * g.row_bytes)) & (CB - 1));
}

/* The warp's copy of row r of g into shared memory at dst (every lane; the caller commits): in
 * units of CB bytes from the unit at or below the row's start, the row then at dst +
 * gq_row_shift, and a last 4 bytes by a copy of their own where the row ends inside a unit
 * (nothing past the row is read). */
template <int CB, int NSB>
__device__ __forceinline__ void gq_copy_row(uint32_t dst, const struct gemv_seg &g, int64_t r, int lane)
{
    const uint32_t shift = gq_row_shift<CB, NSB>(g, r);
    const uint8_t *base = (const uint8_t *)g.w + r * g.row_bytes - shift;
    const int64_t span = g.row_bytes + shift;
    const int n = (int)(span / CB);
    for (int k = lane; k < n; k += 32)
        gq_copy<CB>(dst + (uint32_t)(k * CB), base + (int64_t)k * CB);
    if (GQ_SHIFTED(CB, NSB) && span % CB && lane == 31) /* 4 bytes: rows and starts are whole words */
        gq_copy<4>(dst + (uint32_t)(n * CB), base + (int64_t)n * CB);
}

/* x floats a lane holds for dtype DT's rows of K = 256 NSB (mk_gather_q8 / q4k / q6k). */
#define GQ_XN(DT, NSB) ((DT) == QR_Q6_K ? 16 * (((NSB) + 1) / 2) : 32 * (((NSB) + 3) / 4))

/* The staged x at shared address xa gathered into the lane's registers in DT's order. */
template <int DT, int NSB>
__device__ __forceinline__ void gq_gather(uint32_t xa, float *x)
{
    constexpr int KB = (NSB + 3) / 4; /* rounds of 1,024 elements */
    if (DT == QR_Q8_0)
        mk_gather_q8<KB, 8 * NSB>(xa, x);
    else if (DT == QR_Q4_K)
        mk_gather_q4k<KB, NSB>(xa, x);
    else
        mk_gather_q6k<KB, NSB>(xa, x);
}

/* The warp's dot product of the row at shared address row with the gathered x (all lanes
 * get the sum). */
template <int DT, int NSB>
__device__ __forceinline__ float gq_row(uint32_t row, const float *x)
{
    constexpr int KB = (NSB + 3) / 4;
    if (DT == QR_Q8_0)
        return warp_sum(mk_dot_q8_regs<KB, 8 * NSB>(row, x));
    if (DT == QR_Q4_K)
        return warp_sum(mk_dot_q4k_regs<KB, NSB>(row, x));
    return warp_sum(mk_dot_q6k_regs<KB, NSB>(row, x));
}

/* A lane's x for rows of dtype D, gathered once for the warp's rows: floats from the staged
 * x (xa), or with I8 the 8-bit words of the quantised x (x8; quant_rows_i8.cuh). dot: the
 * warp's sum for the row at shared address row (all lanes get it). */
template <int D, int NSB, bool I8>
struct gq_xreg {
    float x[GQ_XN(D, NSB)];
    __device__ __forceinline__ void load(uint32_t xa, const struct gq8_x *) { gq_gather<D, NSB>(xa, x); }
    __device__ __forceinline__ float dot(uint32_t row) const { return gq_row<D, NSB>(row, x); }
};
template <int NSB>
struct gq_xreg<QR_Q8_0, NSB, true> {
    gq8_x_q8<8 * NSB> x;
    __device__ __forceinline__ void load(uint32_t, const struct gq8_x *x8) { gq8_gather_q8<8 * NSB>(x8, x); }
    __device__ __forceinline__ float dot(uint32_t row) const { return gq8_dot_q8<8 * NSB>(row, x); } /* summed */
};
template <int NSB>
struct gq_xreg<QR_Q4_K, NSB, true> {
    gq8_x_q4k<NSB> x;
    __device__ __forceinline__ void load(uint32_t, const struct gq8_x *x8) { gq8_gather_q4k<NSB>(x8, x); }
    __device__ __forceinline__ float dot(uint32_t row) const { return gq8_dot_q4k<NSB>(row, x); } /* summed */
};
template <int NSB>
struct gq_xreg<QR_Q6_K, NSB, true> {
    gq8_x_q6k<NSB> x;
    __device__ __forceinline__ void load(uint32_t, const struct gq8_x *x8) { gq8_gather_q6k<NSB>(x8, x); }
    __device__ __forceinline__ float dot(uint32_t row) const { return gq8_dot_q6k<NSB>(row, x); } /* summed */
};

/* One row of either K-quant (k_mixed launches), x gathered for it. */
template <int NSB, bool I8>
__device__ __forceinline__ float gq_row_kq(int32_t dtype, uint32_t xa, const struct gq8_x *x8, uint32_t row)
{
    if (dtype == QR_Q4_K) {
        gq_xreg<QR_Q4_K, NSB, I8> xr;
        xr.load(xa, x8);
        return xr.dot(row);
    }
    gq_xreg<QR_Q6_K, NSB, I8> xr;
    xr.load(xa, x8);
    return xr.dot(row);
}

/* With I8, the staged x quantised into the block's x8 (a barrier inside: every thread). */
template <int D, bool I8>
__device__ __forceinline__ void gq_quantise_x(const struct gemv_args &a, const float *xs, struct gq8_x *x8)
{
    if (I8)
        gq8_quantise(xs, a.K, D == QR_Q8_0, x8);
}

/* The middle of both gemvq kernels, once a warp's row copies are issued: close them as one
 * group, ask the L2 for the block's share of a later step's weights (a.pf), load the first norm weights (constant: before the wait), wait for the input, and let
 * the next launch start now when it should wait for this one's input (gemv_args.q_after_wait;
 * else the kernel let it start first thing). */
__device__ __forceinline__ void gq_commit_and_wait(const struct gemv_args &a, float4 (&g0)[GEMV_NW], bool norm_w = true)
{
    cp_async_commit();
    l2_prefetch_share(a.pf);
    if (norm_w) /* gemv_stage_x's (not for the one-pass staging: gq8_load_norm) */
        gemv_load_norm_w(a, g0);
    griddep_wait();
    if (a.q_after_wait)
        griddep_launch();
}

/* P = 2: SwiGLU (seg[0] gate, seg[1] up). R rows per warp (x gathered once for them).
 * stride: bytes of shared memory per row copy. DT = GQ_KMIXED: each segment Q4_K or Q6_K
 * (seg[].dtype; P = 1, R = 1, CB = 8). I8: x quantised to 8 bits (gemv_args.q_int8). */
template <int DT, int P, int NSB, int CB, int R, bool I8, bool ONE = false>
__global__ void __launch_bounds__(32 * GEMVQ_WARPS_LIMIT) gemvq_kernel(const __grid_constant__ struct gemv_args a,
                                                                       int32_t stride)
{
    static_assert(!ONE || I8, "the one-pass staging makes 8-bit x");
    extern __shared__ float4 gq_smem4[];
    __shared__ float s_part[GEMVQ_WARPS_LIMIT][GEMV_MAX_T];
    __shared__ __align__(16) char s_x8[I8 ? sizeof(struct gq8_x) : 16];
    __shared__ float s_ss[ONE ? GQ8_NB_MAX : 1];
    struct gq8_x *x8 = (struct gq8_x *)s_x8;
    if (!a.q_after_wait) /* a.q_after_wait: at most the next launch prefetches while this one runs */
        griddep_launch();
    float *xs = (float *)gq_smem4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + warp) * R;
    int64_t rr[R];
    int sg[R];
    bool ok[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        int64_t r = r0 + i;
        int s = 0;
        if (P == 1)
            while (s < a.n_seg - 1 && r >= a.seg[s].N)
                r -= a.seg[s++].N;
        rr[i] = r, sg[i] = s, ok[i] = r < a.seg[s].N;
    }
    const uint32_t rows = smem_u32(xs + a.K) + (uint32_t)(warp * R * P * stride);
#pragma unroll
    for (int i = 0; i < R; i++)
        if (ok[i])
#pragma unroll
            for (int p = 0; p < P; p++)
                gq_copy_row<CB, NSB>(rows + (uint32_t)((i * P + p) * stride), a.seg[P == 2 ? p : sg[i]], rr[i], lane);
    float4 g0[GEMV_NW], gq[ONE ? GQ8_BPW(NSB) : 1][2];
    if constexpr (ONE)
        gq8_load_norm<NSB>(a.norm_w, gq);
    gq_commit_and_wait(a, g0, !ONE);
    float yold[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        yold[i] = a.mode == GEMV_ACCUM && ok[i] && lane == 0 ? a.seg[sg[i]].y[rr[i]] : 0.0f;
    constexpr int D = DT == GQ_KMIXED ? QR_Q4_K : DT;
    if constexpr (ONE) {
        gq8_stage_quantise<NSB>(a.x, a.norm_w != NULL, a.eps, gq, D == QR_Q8_0, x8, s_ss);
    } else {
        gemv_stage_x<(NSB + 1) / 2, 0>(a, xs, g0, s_part); /* 64 NSB float4 over 128 threads: one batch */
        gq_quantise_x<D, I8>(a, xs, x8);
    }
    cp_async_wait<0>();
    __syncwarp(); /* every lane's copies of the rows are visible to the whole warp */
    if (!ok[0])
        return;
    const uint32_t xa = smem_u32(xs);
    if (DT == GQ_KMIXED) { /* R = 1: the warp's row decides the layout (warp-uniform) */
        float v = gq_row_kq<NSB, I8>(a.seg[sg[0]].dtype, xa, x8, rows + gq_row_shift<CB, NSB>(a.seg[sg[0]], rr[0]));
        if (lane == 0)
            a.seg[sg[0]].y[rr[0]] = a.mode == GEMV_ACCUM ? yold[0] + v : v;
        return;
    }
    gq_xreg<D, NSB, I8> xr;
    xr.load(xa, x8);
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (!ok[i])
            break;
        uint32_t row = rows + (uint32_t)(i * P * stride);
        float v = xr.dot(row + gq_row_shift<CB, NSB>(a.seg[P == 2 ? 0 : sg[i]], rr[i]));
        if (P == 2) {
            float u = xr.dot(row + (uint32_t)stride + gq_row_shift<CB, NSB>(a.seg[1], rr[i]));
            v = v / (1.0f + __expf(-v)) * u;
        }
        if (lane == 0)
            a.seg[sg[i]].y[rr[i]] = a.mode == GEMV_ACCUM ? yold[i] + v : v;
    }
}

/* The warp's R rows from r0 (those below g.N) into shared memory at dst, stride bytes apart,
 * in copy units of CB bytes (one cp.async group is committed by the caller). */
template <int CB, int R, int NSB>
__device__ __forceinline__ void gq_copy_rows(const struct gemv_seg &g, int64_t r0, uint32_t dst, int32_t stride,
                                             int lane)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (r0 + i >= g.N)
            break;
        gq_copy_row<CB, NSB>(dst + (uint32_t)(i * stride), g, r0 + i, lane);
    }
}

/* The LM head's gemvq (gemv_args.q_head_blocks > 0): blocks loop over tiles of W R rows
 * instead of one tile per block, so x is staged, normalised and gathered once per block
 * rather than once per 16 rows (9,496 blocks of 4 warps each staged the 4 KB x and its norm
 * weights: ~78 MB of L2 reads beside the 128 MB of Qwen3-0.6B Q4_K_M's Q6_K head, which ran at
 * 1.3 TB/s: ncu, docs/perf-log.md session 17). Each warp copies its rows of the next tile into
 * the other half of its shared-memory slice while it sums the current one (cp.async groups:
 * two in flight). The rows, x and every sum are the gemvq kernel's, so the logits are the
 * same bit for bit. One segment, GEMV_STORE. */
template <int DT, int NSB, int CB, int R, bool I8, bool ONE = false>
__global__ void __launch_bounds__(32 * GEMVQ_WARPS_LIMIT) gemvq_loop_kernel(const __grid_constant__ struct gemv_args a,
                                                                            int32_t stride)
{
    static_assert(!ONE || I8, "the one-pass staging makes 8-bit x");
    extern __shared__ float4 gq_smem4[];
    __shared__ float s_part[GEMVQ_WARPS_LIMIT][GEMV_MAX_T];
    __shared__ __align__(16) char s_x8[I8 ? sizeof(struct gq8_x) : 16];
    __shared__ float s_ss[ONE ? GQ8_NB_MAX : 1];
    struct gq8_x *x8 = (struct gq8_x *)s_x8;
    if (!a.q_after_wait)
        griddep_launch();
    float *xs = (float *)gq_smem4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const struct gemv_seg &g = a.seg[0];
    const int64_t tiles = (g.N + (int64_t)W * R - 1) / ((int64_t)W * R);
    const uint32_t half = (uint32_t)(W * R * stride); /* bytes of one tile's rows */
    const uint32_t slice = smem_u32(xs + a.K) + (uint32_t)(warp * R * stride);
    int64_t t = blockIdx.x;
    gq_copy_rows<CB, R, NSB>(g, (t * W + warp) * R, slice, stride, lane);
    float4 g0[GEMV_NW], gq[ONE ? GQ8_BPW(NSB) : 1][2];
    if constexpr (ONE)
        gq8_load_norm<NSB>(a.norm_w, gq);
    gq_commit_and_wait(a, g0, !ONE);
    if constexpr (ONE) {
        gq8_stage_quantise<NSB>(a.x, a.norm_w != NULL, a.eps, gq, DT == QR_Q8_0, x8, s_ss);
    } else {
        gemv_stage_x<(NSB + 1) / 2, 0>(a, xs, g0, s_part);
        gq_quantise_x<DT, I8>(a, xs, x8);
    }
    gq_xreg<DT, NSB, I8> xr;
    xr.load(smem_u32(xs), x8);
    for (int b = 0; t < tiles; t += gridDim.x, b ^= 1) {
        const int64_t next = t + gridDim.x;
        if (next < tiles) { /* the next tile's rows into the other half, then wait for this one's */
            gq_copy_rows<CB, R, NSB>(g, (next * W + warp) * R, slice + (b ^ 1) * half, stride, lane);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp(); /* every lane's copies of this tile are visible to the whole warp */
        const int64_t r0 = (t * W + warp) * R;
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (r0 + i >= g.N)
                break;
            float v = xr.dot(slice + b * half + (uint32_t)(i * stride) + gq_row_shift<CB, NSB>(g, r0 + i));
            if (lane == 0)
                g.y[r0 + i] = v;
        }
        __syncwarp(); /* read before the copies of the tile after next overwrite this half */
    }
}

/* The copy unit of dtype's rows. */
static int gq_copy_bytes(int32_t dtype) { return dtype == QR_Q6_K ? 8 : 16; }

/* The K values gemvq is built for, as K / 256 (3,584: Qwen3.5-0.8B's down product). */
static int gq_nsb(int32_t K) { return K == 1024 || K == 2048 || K == 3072 || K == 3584 ? K / 256 : 0; }

bool gemvq_takes_k(int32_t K) { return gq_nsb(K) != 0; }

/* Rows per warp: more for the big products (the LM head: x staged and gathered once per four
 * rows; H200, Qwen3-0.6B Q4_K_M 1,083 -> 1,130 tok/s) and two for Q8_0 everywhere (its x
 * gather reads floats 128 bytes apart per lane, one bank: Qwen3-0.6B Q8_0 928 -> 1,040, where
 * K-quant rows lose 1-2% with two); gemv_args.q_rows (cuda_options.gemvq_rows: 1, 2 or 4)
 * overrides the rows below the LM head, since the best count depends on the model (session
 * 15: Qwen3.5-0.8B Q4_K_M +6% with two). */
#ifndef GQ_R
#define GQ_R 1
#endif
#ifndef GQ_R_Q8
#define GQ_R_Q8 2
#endif
#ifndef GQ_R_BIG
#define GQ_R_BIG 4
#endif
#define GQ_BIG_ROWS 32768 /* rows from which a product takes GQ_R_BIG */

static size_t gq_at_least(size_t v, size_t floor) { return v < floor ? floor : v; }

/* How a gemvq launch runs: K / 256, rows per warp, bytes of shared memory per row copy, its
 * grid, and whether it is the LM head's loop (gemvq_loop_kernel). */
struct gq_shape {
    int kb, r;
    int32_t stride;
    int blocks, warps;
    size_t smem;
    bool loop;
};

/* The shape of the launch; false when gemvq does not apply. Blocks of GQ_WARPS warps that
 * reserve nothing extra stay under 48 KB (GQ_SMEM_MAX); other shapes (gemv_args.q_warps,
 * q_smem_kb) may take up to GEMVQ_SMEM_KB_LIMIT. */
static bool gemvq_shape(const struct gemv_args *a, struct gq_shape *sh)
{
    if (!a->v2 || a->T != 1 || (a->dtype != QR_Q8_0 && a->dtype != QR_Q4_K && a->dtype != QR_Q6_K))
        return false;
    int k = gq_nsb(a->K), P = a->mode == GEMV_SWIGLU ? 2 : 1;
    if (!k || (P == 2 && k != 4) || (P == 2 && a->k_mixed) || (uintptr_t)a->x % 16 ||
        (uintptr_t)a->norm_w % 16)
        return false;
    int cb = a->k_mixed ? 8 : gq_copy_bytes(a->dtype), nseg = P == 2 ? 2 : a->n_seg;
    /* Q6_K rows of 14 super-blocks (2,940 bytes, not whole units) may start a word past a copy
     * unit (gq_copy_row, GQ_SHIFTED): whole words suffice; every other row is whole units from
     * an aligned start */
    const bool words = !a->k_mixed && a->dtype == QR_Q6_K && k == 14;
    const int align = words ? 4 : cb;
    int64_t rows = 0, rb = 0;
    bool shifted = false;
    for (int i = 0; i < nseg; i++) {
        if (a->k_mixed && a->seg[i].dtype != QR_Q4_K && a->seg[i].dtype != QR_Q6_K)
            return false;
        if (a->seg[i].row_bytes % align || (uintptr_t)a->seg[i].w % align)
            return false;
        shifted |= a->seg[i].row_bytes % cb || (uintptr_t)a->seg[i].w % cb;
        rb = a->seg[i].row_bytes > rb ? a->seg[i].row_bytes : rb;
        rows += a->seg[i].N;
    }
    if (P == 2) {
        if (a->seg[1].N != a->seg[0].N)
            return false;
        rows = a->seg[0].N;
    }
    sh->kb = k;
    sh->stride = (int32_t)((rb + (shifted ? 4 : 0) + 15) / 16 * 16); /* a shifted row's 4 bytes more */
    /* GQ_R_BIG is built for K = 1024 without SwiGLU only: the LM heads of these models */
    const bool big = rows >= GQ_BIG_ROWS && k == 4 && P == 1 && !a->k_mixed;
    sh->r = a->k_mixed ? 1 : big ? GQ_R_BIG : a->q_rows ? a->q_rows : a->dtype == QR_Q8_0 ? GQ_R_Q8 : GQ_R;
    const int W = a->q_warps > 0 ? a->q_warps : GQ_WARPS;
    const size_t reserve = (size_t)a->q_smem_kb * 1024;
    const size_t cap = W == GQ_WARPS && !reserve ? GQ_SMEM_MAX : (size_t)GEMVQ_SMEM_KB_LIMIT * 1024;
    sh->loop = big && a->q_head_blocks > 0 && a->n_seg == 1 && a->mode == GEMV_STORE;
    const size_t tile = (size_t)W * sh->r * P * sh->stride; /* one tile's rows */
    if (!sh->loop && (size_t)a->K * 4 + tile > cap)
        sh->r = 1; /* the rows do not fit: one per warp */
    const size_t need = (size_t)a->K * 4 + (size_t)W * sh->r * P * sh->stride * (sh->loop ? 2 : 1);
    sh->smem = gq_at_least(need, reserve);
    sh->warps = W;
    sh->blocks = (int)((rows + W * sh->r - 1) / (W * sh->r));
    if (sh->loop) { /* a few blocks per multiprocessor, each looping over the tiles */
        int64_t most = (int64_t)(a->n_sm > 0 ? a->n_sm : 132) * a->q_head_blocks;
        sh->blocks = sh->blocks < most ? sh->blocks : (int)most;
    }
    return sh->smem <= cap;
}

bool gemvq_applies(const struct gemv_args *a)
{
    struct gq_shape sh;
    return gemvq_shape(a, &sh);
}

/* launch_k for a gemvq kernel, its dynamic shared-memory limit raised first (to the most any
 * shape takes, never lowered) when the launch needs more than the default 48 KB (a host call:
 * replayed graphs do not repeat it). */
template <typename... KP>
static cudaError_t gq_launch(bool pdl, void (*k)(KP...), const struct gq_shape &sh, cudaStream_t s,
                             const struct gemv_args *a)
{
    /* the 48 KB without the attribute count the static part too: int8 x's 4.9 KB */
    if (sh.smem + (a->q_int8 ? sizeof(struct gq8_x) : 0) > 47 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             GEMVQ_SMEM_KB_LIMIT * 1024);
        if (e != cudaSuccess)
            return e;
    }
    return launch_k(pdl, k, dim3(sh.blocks), dim3(32 * sh.warps), sh.smem, s, *a, sh.stride);
}

/* The launch of dtype DT (or GQ_KMIXED) with R rows per warp, by K / 256 and SwiGLU. */
template <int DT, int CB, int R, bool I8, bool ONE = false>
static cudaError_t gemvq_r(const struct gemv_args *a, const struct gq_shape &sh, cudaStream_t s)
{
    bool p = a->pdl;
    /* the one-pass staging is built for the shapes 8-bit x picks: 2 rows per warp, and the
     * mixed q|k|v's 1 (elsewhere the flag is ignored: gemv_args.q_one_pass) */
    if constexpr (I8 && !ONE && (R == 2 || DT == GQ_KMIXED))
        if (a->q_one_pass)
            return gemvq_r<DT, CB, R, true, true>(a, sh, s);
    if (a->mode == GEMV_SWIGLU)
        return gq_launch(p, gemvq_kernel<DT, 2, 4, CB, R, I8, ONE>, sh, s, a);
    switch (sh.kb) {
    case 4: return gq_launch(p, gemvq_kernel<DT, 1, 4, CB, R, I8, ONE>, sh, s, a);
    case 8: return gq_launch(p, gemvq_kernel<DT, 1, 8, CB, R, I8, ONE>, sh, s, a);
    case 12: return gq_launch(p, gemvq_kernel<DT, 1, 12, CB, R, I8, ONE>, sh, s, a);
    default: return gq_launch(p, gemvq_kernel<DT, 1, 14, CB, R, I8, ONE>, sh, s, a);
    }
}

template <int DT, bool I8>
static cudaError_t gemvq_dt(const struct gemv_args *a, const struct gq_shape &sh, cudaStream_t s)
{
    constexpr int CB = DT == QR_Q6_K ? 8 : 16;
    /* the row counts gemvq_shape picks: 1, 2 or 4 (each row count of every shape is ~1.5 MB
     * of kernels), and GQ_R_BIG for the LM head (looping or not) */
    if (sh.loop)
        return I8 && a->q_one_pass ? gq_launch(a->pdl, gemvq_loop_kernel<DT, 4, CB, GQ_R_BIG, I8, I8>, sh, s, a)
                                   : gq_launch(a->pdl, gemvq_loop_kernel<DT, 4, CB, GQ_R_BIG, I8>, sh, s, a);
    if (sh.r == GQ_R_BIG && sh.kb == 4 && a->mode != GEMV_SWIGLU)
        return gq_launch(a->pdl, gemvq_kernel<DT, 1, 4, CB, GQ_R_BIG, I8>, sh, s, a);
    switch (sh.r) {
    case 4: return gemvq_r<DT, CB, 4, I8>(a, sh, s);
    case 2: return gemvq_r<DT, CB, 2, I8>(a, sh, s);
    default: return gemvq_r<DT, CB, 1, I8>(a, sh, s);
    }
}

template <bool I8>
static cudaError_t gemvq_go(const struct gemv_args *a, const struct gq_shape &sh, cudaStream_t s)
{
    if (a->k_mixed) /* SwiGLU never mixes (gemvq_shape) */
        return gemvq_r<GQ_KMIXED, 8, 1, I8>(a, sh, s);
    switch (a->dtype) {
    case QR_Q8_0: return gemvq_dt<QR_Q8_0, I8>(a, sh, s);
    case QR_Q4_K: return gemvq_dt<QR_Q4_K, I8>(a, sh, s);
    default: return gemvq_dt<QR_Q6_K, I8>(a, sh, s);
    }
}

cudaError_t launch_gemvq(const struct gemv_args *a, cudaStream_t s)
{
    struct gq_shape sh;
    if (!gemvq_shape(a, &sh))
        return cudaErrorInvalidValue;
    return a->q_int8 ? gemvq_go<true>(a, sh, s) : gemvq_go<false>(a, sh, s);
}

extern "C" int32_t cuda_gemvq_blocks(int32_t dtype, int32_t N, int32_t K, int32_t warps, int32_t rows,
                                     int32_t smem_kb)
{
    struct gemv_args a;
    memset(&a, 0, sizeof(a));
    a.x = (const float *)(uintptr_t)256, a.ldx = K, a.K = K, a.T = 1, a.dtype = dtype;
    a.mode = GEMV_STORE, a.n_seg = 1, a.v2 = true;
    a.q_warps = warps, a.q_rows = rows, a.q_smem_kb = smem_kb;
    const struct qr_dtype_traits *t = dtype_traits((enum qr_dtype)dtype);
    a.seg[0].w = (const void *)(uintptr_t)4096, a.seg[0].N = N, a.seg[0].ldy = N;
    a.seg[0].row_bytes = (int64_t)K / t->block_size * t->type_size;
    struct gq_shape sh;
    return gemvq_shape(&a, &sh) ? sh.blocks : 0;
}
