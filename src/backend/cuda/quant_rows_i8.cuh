/*
 * quant_rows_i8.cuh — gemvq's one-token dot products with x quantised to 8 bits, the CPU's
 * activation formats (cuda_options.gemvq_int8): Q8_K blocks of 256 (a float scale, 256 int8,
 * sums of 16) for Q4_K and Q6_K rows, Q8_0 blocks of 32 (an f16 scale) for Q8_0 rows, made
 * as quant_quant_q8_k and quant_quant_q8_0 make them (max-abs scale, round to nearest even,
 * clamp to ±127), so each block's integer sum is the CPU's (matmul.<type>.portable and its
 * SIMD twins); only the order of the float sums over blocks differs. The K-quant rows add their
 * super-blocks' terms in one canonical order that gemvq_batch_mma.cu follows too (below), so
 * the batched step's rows are bit for bit these.
 *
 * Why: with x in floats (quant_rows.cuh) a lane spends four instructions per weight (unpack,
 * convert, multiply-add, and the sum of x for the K-quants' minimum) and holds 32 floats of x
 * per row; here four weights cost one dp4a, and x is 8 words. A quantised decode step costs
 * more than a BF16 one although it reads a third of the bytes (docs/perf-log.md, session 18).
 *
 * The lanes walk the rows in quant_rows.cuh's layouts (the same weight bytes per lane), each
 * gathering its x words once for the warp's rows. Rows live in shared memory (32-bit
 * addresses); gq8_dot_q8 returns the lane's part (the caller sums over the warp),
 * gq8_dot_q4k / gq8_dot_q6k the row's value in the canonical order in every lane.
 */
#ifndef QWENRT_BACKEND_CUDA_QUANT_ROWS_I8_CUH
#define QWENRT_BACKEND_CUDA_QUANT_ROWS_I8_CUH

#include "backend/cuda/gemv_stage.cuh"
#include "backend/cuda/quant_rows.cuh"

#define GQ8_KMAX 3584 /* the largest K gemvq takes (Qwen3.5-0.8B's down product) */

/* x quantised in shared memory: q[K] int8, d[] one scale per block (K / 256 for Q8_K, K / 32
 * for Q8_0), bs[K / 16] the Q8_K sums of 16 (unused for Q8_0). */
struct gq8_x {
    int8_t q[GQ8_KMAX];
    float d[GQ8_KMAX / 32];
    int32_t bs[GQ8_KMAX / 16];
};

__device__ __forceinline__ int gq8_q(float v, float id)
{
    int q = __float2int_rn(v * id);
    return q > 127 ? 127 : q < -127 ? -127 : q;
}

__device__ __forceinline__ uint32_t gq8_pack(int a, int b, int c, int d)
{
    return (uint32_t)(a & 0xff) | ((uint32_t)(b & 0xff) << 8) | ((uint32_t)(c & 0xff) << 16) |
           ((uint32_t)(d & 0xff) << 24);
}

/* The largest magnitude of a lane's 8 elements. */
__device__ __forceinline__ float gq8_amax8(float4 a, float4 b)
{
    return fmaxf(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))),
                 fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
}

/* A lane's 8 elements quantised with the inverse scale id (gq8_q): their two words, and the
 * sum of the 8 quants in *s. */
__device__ __forceinline__ uint2 gq8_words8(float4 a, float4 b, float id, int *s)
{
    int q0 = gq8_q(a.x, id), q1 = gq8_q(a.y, id), q2 = gq8_q(a.z, id), q3 = gq8_q(a.w, id);
    int q4 = gq8_q(b.x, id), q5 = gq8_q(b.y, id), q6 = gq8_q(b.z, id), q7 = gq8_q(b.w, id);
    *s = q0 + q1 + q2 + q3 + q4 + q5 + q6 + q7;
    return make_uint2(gq8_pack(q0, q1, q2, q3), gq8_pack(q4, q5, q6, q7));
}

/* The sum of a lane's 8 squares, in the order every 8-bit x path adds them (the multi-token
 * tensor-core GEMV must normalise x to the same bits as the one-token one). */
__device__ __forceinline__ float gq8_sumsq8(float4 a, float4 b)
{
    return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
}

/* A Q8_K block's inverse scale and scale from the largest magnitude of its 256 elements, as
 * quant_quant_q8_k computes them. */
__device__ __forceinline__ float gq8_q8k_id(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }
__device__ __forceinline__ float gq8_q8k_d(float amax) { return amax / 127.0f; }

/* A Q8_0 block's scale (rounded to f16, as the CPU stores it) from the largest magnitude of its
 * 32 elements, and the inverse scale its quants are made with (quant_quant_q8_0). */
__device__ __forceinline__ float gq8_q80_d(float amax) { return __half2float(__float2half_rn(amax / 127.0f)); }
__device__ __forceinline__ float gq8_q80_id(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

/* ---- one float order for every 8-bit path ----
 * A row's value is a sum over its super-blocks (256 elements) of one term each. A K-quant's
 * term is made from exact integer sums over the super-block: Q4_K dx (d I - dmin M) with
 * I = Σ sc_u Σ q x and M = Σ m_u Σ x over the sub-blocks u, Q6_K dx d S with S = Σ sc_g Σ (q - 32) x
 * over the groups of 16 (explicit roundings: no contraction). A Q8_0 super-block is 8 blocks of
 * 32, each with its own scales: block k's term is (dw dx) S_k, S_k its exact integer sum, and the
 * super-block's term the 8 added by the tree ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))
 * (gq8_q80_tree; the one-token warp's lanes 8q + k hold t_k and reach it through the halving's
 * masks 4, 2, 1). The super-blocks' terms are added in one fixed order, the canonical order:
 * the super-blocks in G groups by sb % G (Q4_K and Q8_0: 4, Q6_K: 2); inside group q
 * its J = ceil(NSB / G) terms t_j = term(q + G j), padded with +0 to JP (the power of two at or
 * above J), by a pairwise tree ((t0 + t1) + (t2 + t3)) + ...; then the groups, Q4_K as
 * (a0 + a2) + (a1 + a3), Q6_K as a0 + a1. The one-token warp reaches it through its shuffles
 * (gq8_dot_q4k / gq8_dot_q6k: each super-block's integer sums reduced over the lanes that hold
 * parts of it, one term per super-block, the tree over the lanes), gemvq_batch_mma.cu from the
 * terms in shared memory (gq8_canon_row), so a batched row is bit for bit
 * the one-token one — and the next product's 8-bit x the same quants (docs/perf-log.md,
 * sessions 37 and 38). Float additions commute exactly, so the order is a tree, not a
 * direction. */
#define GQ8_GROUPS_Q4K 4
#define GQ8_GROUPS_Q6K 2
#define GQ8_GROUPS_Q80 4
#define GQ8_JP_MAX 8 /* the tree's leaves at most: Q6_K at K = 3,584, 7 terms a group */

/* Q4_K: dx (d I - dmin M). */
__device__ __forceinline__ float gq8_term_q4k(float dx, float d, float dmin, int isum, int imin)
{
    return __fmul_rn(dx, __fsub_rn(__fmul_rn(d, __int2float_rn(isum)), __fmul_rn(dmin, __int2float_rn(imin))));
}

/* Q6_K: dx (d S). */
__device__ __forceinline__ float gq8_term_q6k(float dx, float d, int s)
{
    return __fmul_rn(dx, __fmul_rn(d, __int2float_rn(s)));
}

/* Q8_0 block k of a super-block: (dw dx) S_k. */
__device__ __forceinline__ float gq8_term_q80(float dw, float dx, int s)
{
    return __fmul_rn(__fmul_rn(dw, dx), __int2float_rn(s));
}

/* A Q8_0 super-block's term from its 8 blocks' terms t[k]. */
__device__ __forceinline__ float gq8_q80_tree(const float (&t)[8])
{
    return __fadd_rn(__fadd_rn(__fadd_rn(t[0], t[4]), __fadd_rn(t[2], t[6])),
                     __fadd_rn(__fadd_rn(t[1], t[5]), __fadd_rn(t[3], t[7])));
}

/* The tree's leaves for J terms: the power of two at or above J. */
__device__ __forceinline__ int gq8_jp(int j) { return j <= 1 ? 1 : j <= 2 ? 2 : j <= 4 ? 4 : 8; }

/* The groups' sums a[] combined: G = 4 as (a0 + a2) + (a1 + a3), G = 2 as a0 + a1. */
template <int G>
__device__ __forceinline__ float gq8_canon_groups(const float *a)
{
    if (G == 4)
        return __fadd_rn(__fadd_rn(a[0], a[2]), __fadd_rn(a[1], a[3]));
    return __fadd_rn(a[0], a[1]);
}

/* A row's value from its super-blocks' terms t[sb] (stride floats apart): group q's terms
 * (sb = q, q + G, ... below nsb) by the pairwise tree over JP leaves, the missing ones +0, then
 * the groups. JP is gq8_jp(ceil(nsb / G)), a compile-time count here (the tree fully unrolled:
 * a runtime one cost a batched launch ~500 of its ~2,200 instructions per warp, session 40). */
template <int G, int JP>
__device__ __forceinline__ float gq8_canon_row_jp(const float *t, int64_t stride, int nsb)
{
    float a[G];
#pragma unroll
    for (int q = 0; q < G; q++) {
        float v[JP];
#pragma unroll
        for (int j = 0; j < JP; j++) {
            const int sb = q + G * j;
            v[j] = sb < nsb ? t[sb * stride] : 0.0f;
        }
#pragma unroll
        for (int w = 1; w < JP; w *= 2)
#pragma unroll
            for (int i = 0; i < JP; i += 2 * w)
                v[i] = __fadd_rn(v[i], v[i + w]);
        a[q] = v[0];
    }
    return gq8_canon_groups<G>(a);
}

template <int G>
__device__ __forceinline__ float gq8_canon_row(const float *t, int64_t stride, int nsb)
{
    switch (gq8_jp((nsb + G - 1) / G)) {
    case 1: return gq8_canon_row_jp<G, 1>(t, stride, nsb);
    case 2: return gq8_canon_row_jp<G, 2>(t, stride, nsb);
    case 4: return gq8_canon_row_jp<G, 4>(t, stride, nsb);
    default: return gq8_canon_row_jp<G, GQ8_JP_MAX>(t, stride, nsb);
    }
}

/* ---- the one-token warp's side of the canonical order ----
 * A super-block's lanes (LANES = 8 for Q4_K and Q8_0, 16 for Q6_K: xor-adjacent, masks
 * LANES / 2 .. 1) each hold parts of JP sums (one per super-block j of their group: a K-quant's
 * integer sums, Q8_0's block terms). Recursive halving: at mask m a lane keeps the half of its
 * sums that its bit m selects and adds its partner's part of them; once one is left, the rest
 * of the masks add it whole. Each lane ends with the whole sum of super-block gq8_own_j, in
 * JP - 1 + log2(LANES / JP) shuffles (Q4_K 3-4, Q6_K 4-8) where reducing one sum at a time would
 * take 3 J and 4 J. For Q8_0's floats the masks 4, 2, 1 make gq8_q80_tree's pairs whatever JP. */
template <int JP, int LANES>
__device__ __forceinline__ int gq8_own_j()
{
    const int lane = threadIdx.x & 31;
    int j = 0, n = JP;
#pragma unroll
    for (int m = LANES / 2; m >= 1; m >>= 1)
        if (n > 1) {
            j += lane & m ? n / 2 : 0;
            n /= 2;
        }
    return j;
}

__device__ __forceinline__ int gq8_add(int a, int b) { return a + b; }
__device__ __forceinline__ float gq8_add(float a, float b) { return __fadd_rn(a, b); }

template <int JP, int LANES, typename V>
__device__ __forceinline__ V gq8_halve(V (&v)[JP])
{
    static_assert(JP <= LANES / 2, "a sum per pair of lanes at most");
    const int lane = threadIdx.x & 31;
    int n = JP;
#pragma unroll
    for (int m = LANES / 2; m >= 1; m >>= 1) {
        if (n > 1) {
            const bool up = lane & m;
#pragma unroll
            for (int i = 0; i < JP / 2; i++)
                if (i < n / 2) {
                    const V keep = up ? v[i + n / 2] : v[i], send = up ? v[i] : v[i + n / 2];
                    v[i] = gq8_add(keep, __shfl_xor_sync(0xffffffffu, send, m));
                }
            n /= 2;
        } else {
            v[0] = gq8_add(v[0], __shfl_xor_sync(0xffffffffu, v[0], m));
        }
    }
    return v[0];
}

/* The lane's term (super-block gq8_own_j's) added over the group's lanes by the pairwise tree:
 * leaf j's lane bits are the halving's masks, j's lowest bit at LANES / JP. */
template <int JP, int LANES>
__device__ __forceinline__ float gq8_tree_lanes(float t)
{
#pragma unroll
    for (int m = LANES / JP; m < LANES; m <<= 1)
        t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, m));
    return t;
}

/* The lane's 8 consecutive elements a (0-3), b (4-7) of x, element e in the warp's Q8_K block
 * blk of 256, quantised into xq: the Q8_0 block of 32 over 4 lanes when q8_0 (its scale
 * rounded to f16 as the CPU stores it), else block blk; the words, the scale and (Q8_K) the
 * sums of 16. Every lane of the warp. */
__device__ __forceinline__ void gq8_put8(float4 a, float4 b, int e, int blk, bool q8_0, struct gq8_x *xq)
{
    const int lane = threadIdx.x & 31;
    float amax = gq8_amax8(a, b);
    float id;
    if (q8_0) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float d = gq8_q80_d(amax);
        id = gq8_q80_id(d);
        if ((lane & 3) == 0)
            xq->d[e / 32] = d;
    } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        id = gq8_q8k_id(amax);
        if (lane == 0)
            xq->d[blk] = gq8_q8k_d(amax);
    }
    int s;
    *(uint2 *)(xq->q + e) = gq8_words8(a, b, id, &s);
    s += __shfl_xor_sync(0xffffffffu, s, 1); /* two lanes: a sum of 16 */
    if (!q8_0 && (lane & 1) == 0)
        xq->bs[e / 16] = s;
}

/* The block's staged float x (xs, K floats, already normalised) into xq: Q8_0 blocks of 32
 * when q8_0, else Q8_K blocks of 256; a warp per 256 elements, each lane 8 consecutive ones.
 * Ends with a block barrier. */
__device__ __forceinline__ void gq8_quantise(const float *xs, int K, bool q8_0, struct gq8_x *xq)
{
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5, warp = threadIdx.x >> 5;
    for (int base = warp * 256; base < K; base += nw * 256) {
        const int e = base + lane * 8;
        gq8_put8(*(const float4 *)(xs + e), *(const float4 *)(xs + e + 4), e, base / 256, q8_0, xq);
    }
    __syncthreads();
}

/* ---- gemv_args.q_one_pass: x normalised and quantised in one pass from registers ----
 * gemv_stage_x + gq8_quantise take three block barriers and four passes over a float copy of
 * x in shared memory (store, norm, read, words). Here warp w loads the 256-element blocks w,
 * w + warps, ... of x itself (8 consecutive elements per lane: gq8_quantise's layout) with
 * their norm weights (loaded before the input's wait), leaves each block's sum of squares in
 * s_ss[block], and after one barrier every thread adds them in block order (so 1 / rms does
 * not depend on the block's warps), normalises its elements in registers and quantises them
 * as gq8_quantise does; a second barrier publishes the words. Without a norm: one barrier. */

#define GQ8_NB_MAX (GQ8_KMAX / 256) /* 256-element blocks of x at most */
#define GQ8_BPW(NSB) (((NSB) + 3) / 4) /* blocks per warp at most (blocks of 4 warps or more) */

/* The lane's norm weights for the blocks its warp takes (ones without a norm). */
template <int NSB>
__device__ __forceinline__ void gq8_load_norm(const float *norm_w, float4 (&g)[GQ8_BPW(NSB)][2])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll
    for (int i = 0; i < GQ8_BPW(NSB); i++) {
        const int b = warp + i * nw, e = b * 256 + lane * 8;
        g[i][0] = norm_w && b < NSB ? __ldg((const float4 *)(norm_w + e)) : one;
        g[i][1] = norm_w && b < NSB ? __ldg((const float4 *)(norm_w + e + 4)) : one;
    }
}

/* x (K = 256 NSB floats in global memory) normalised when norm_w (weights g from
 * gq8_load_norm) and quantised into xq: Q8_0 blocks when q8_0, else Q8_K. Every thread of the
 * block; ends with a block barrier. */
template <int NSB>
__device__ __forceinline__ void gq8_stage_quantise(const float *x, bool norm, float eps, const float4 (&g)[GQ8_BPW(NSB)][2],
                                                   bool q8_0, struct gq8_x *xq, float *s_ss)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    constexpr int BPW = GQ8_BPW(NSB);
    float4 v[BPW][2];
#pragma unroll
    for (int i = 0; i < BPW; i++) {
        const int b = warp + i * nw, e = b * 256 + lane * 8;
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[i][0] = b < NSB ? *(const float4 *)(x + e) : zero;
        v[i][1] = b < NSB ? *(const float4 *)(x + e + 4) : zero;
    }
    if (norm) {
#pragma unroll
        for (int i = 0; i < BPW; i++) {
            const int b = warp + i * nw;
            float ss = warp_sum(gq8_sumsq8(v[i][0], v[i][1]));
            if (lane == 0 && b < NSB)
                s_ss[b] = ss;
        }
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int b = 0; b < NSB; b++)
            tot += s_ss[b];
        const float inv = rsqrtf(tot / (float)(256 * NSB) + eps);
#pragma unroll
        for (int i = 0; i < BPW; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                v[i][h] = gemv_norm4(v[i][h], inv, g[i][h]);
    }
#pragma unroll
    for (int i = 0; i < BPW; i++) {
        const int b = warp + i * nw;
        if (b >= NSB) /* warp-uniform */
            break;
        gq8_put8(v[i][0], v[i][1], b * 256 + lane * 8, b, q8_0, xq);
    }
    __syncthreads();
}

/* ---- Q8_0: lane l takes blocks l + 32 j (quant_rows.cuh's mk_dot_q8_regs layout): block k =
 * l % 8 of super-block 4 j + l / 8, so the lanes of group q = l / 8 hold super-blocks q + 4 j as
 * Q4_K's do. Each lane's term per j (gq8_term_q80), halved over the group's 8 lanes (floats:
 * gq8_q80_tree's pairs), the tree over j, then the groups as Q4_K's. ---- */

template <int NB>
struct gq8_x_q8 {
    uint32_t w[(NB + 31) / 32][8];
    float d[(NB + 31) / 32];
};

template <int NB>
__device__ __forceinline__ void gq8_gather_q8(const struct gq8_x *xq, gq8_x_q8<NB> &x)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < (NB + 31) / 32; u++) {
        if (NB % 32 && lane + 32 * u >= NB)
            break;
        const int blk = lane + 32 * u;
        uint4 a = *(const uint4 *)(xq->q + 32 * blk), b = *(const uint4 *)(xq->q + 32 * blk + 16);
        x.w[u][0] = a.x, x.w[u][1] = a.y, x.w[u][2] = a.z, x.w[u][3] = a.w;
        x.w[u][4] = b.x, x.w[u][5] = b.y, x.w[u][6] = b.z, x.w[u][7] = b.w;
        x.d[u] = xq->d[blk];
    }
}

/* The row's value in the canonical order (every lane gets it); NB = 8 NSB blocks. */
template <int NB>
__device__ __forceinline__ float gq8_dot_q8(uint32_t row, const gq8_x_q8<NB> &x)
{
    static_assert(NB % 8 == 0, "whole super-blocks of 256");
    constexpr int J = (NB + 31) / 32, JP = J <= 1 ? 1 : J <= 2 ? 2 : 4;
    const int lane = threadIdx.x & 31;
    float t[JP];
#pragma unroll
    for (int u = 0; u < JP; u++) {
        t[u] = 0.0f;
        if (u >= J || (NB % 32 && lane + 32 * u >= NB))
            continue;
        uint32_t b = row + 34u * (uint32_t)(lane + 32 * u); /* 2-byte aligned */
        float dw = mk_f16((uint16_t)mk_lds_u16(b));
        int s = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t w = __byte_perm(mk_lds_u16(b + 2 + 4 * k), mk_lds_u16(b + 4 + 4 * k), 0x5410);
            s = __dp4a((int)w, (int)x.w[u][k], s);
        }
        t[u] = gq8_term_q80(dw, x.d[u], s);
    }
    float v = gq8_tree_lanes<JP, 8>(gq8_halve<JP, 8>(t));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16)); /* (a0 + a2), (a1 + a3) */
    return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));
}

/* ---- Q4_K: lane (c, half) of super-block group q = lane / 8 takes super-blocks q + 4 j, the
 * 16 bytes of chunk c at half (low nibbles: sub-block 2c, high: 2c + 1; mk_dot_q4k_regs) ----
 * Each lane sums its part of every I_j (exact), the 8 lanes of the group halve them
 * (gq8_halve), and each lane makes the term of its own super-block: d and dmin from the
 * header, M whole from the 8 minima and x's 8 sub-block sums (two dp2a pairs). */

#define GQ8_J_Q4K(NSB) (((NSB) + 3) / 4)
#define GQ8_JP_Q4K(NSB) (GQ8_J_Q4K(NSB) <= 1 ? 1 : GQ8_J_Q4K(NSB) <= 2 ? 2 : 4)

template <int NSB>
struct gq8_x_q4k {
    uint32_t lo[GQ8_J_Q4K(NSB)][4], hi[GQ8_J_Q4K(NSB)][4]; /* x of the low / high nibbles */
    uint32_t bs[4]; /* the own super-block's 8 sub-block sums of x, two int16 a word */
    float d;        /* its scale (0 where the lane has none: NSB % 4) */
};

/* The lane's own super-block after the halving (NSB at most: none). */
template <int NSB>
__device__ __forceinline__ int gq8_own_sb_q4k()
{
    return ((threadIdx.x & 31) >> 3) + 4 * gq8_own_j<GQ8_JP_Q4K(NSB), 8>();
}

template <int NSB>
__device__ __forceinline__ void gq8_gather_q4k(const struct gq8_x *xq, gq8_x_q4k<NSB> &x)
{
    const int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
#pragma unroll
    for (int j = 0; j < GQ8_J_Q4K(NSB); j++) {
        if (NSB % 4 && (lane >> 3) + 4 * j >= NSB)
            break;
        const int sb = (lane >> 3) + 4 * j, e = sb * 256 + 64 * c + 16 * half;
        uint4 a = *(const uint4 *)(xq->q + e), b = *(const uint4 *)(xq->q + e + 32);
        x.lo[j][0] = a.x, x.lo[j][1] = a.y, x.lo[j][2] = a.z, x.lo[j][3] = a.w;
        x.hi[j][0] = b.x, x.hi[j][1] = b.y, x.hi[j][2] = b.z, x.hi[j][3] = b.w;
    }
    const int sb = gq8_own_sb_q4k<NSB>();
    x.d = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++)
        x.bs[k] = 0u;
    if (sb < NSB) {
        const int4 lo = *(const int4 *)(xq->bs + 16 * sb), hi = *(const int4 *)(xq->bs + 16 * sb + 4);
        const int4 lo2 = *(const int4 *)(xq->bs + 16 * sb + 8), hi2 = *(const int4 *)(xq->bs + 16 * sb + 12);
        const int u[8] = {lo.x + lo.y, lo.z + lo.w, hi.x + hi.y, hi.z + hi.w,
                          lo2.x + lo2.y, lo2.z + lo2.w, hi2.x + hi2.y, hi2.z + hi2.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            x.bs[k] = ((uint32_t)u[2 * k] & 0xffffu) | ((uint32_t)u[2 * k + 1] << 16);
        x.d = xq->d[sb];
    }
}

/* M = Σ m_u Σ x over the 8 sub-blocks, from the header's scale words z (bytes 4-7) and w (8-11):
 * m_0..3 = bytes 4-7 & 63, m_4..7 = (bytes 8-11 >> 4) | (bytes 4-7 >> 6) << 4. */
__device__ __forceinline__ int gq8_q4k_min_sum(uint32_t z, uint32_t w, const uint32_t (&bs)[4])
{
    const int m03 = (int)(z & 0x3f3f3f3fu), m47 = (int)(((w >> 4) & 0x0f0f0f0fu) | ((z >> 2) & 0x30303030u));
    int s = __dp2a_lo((int)bs[0], m03, 0);
    s = __dp2a_hi((int)bs[1], m03, s);
    s = __dp2a_lo((int)bs[2], m47, s);
    return __dp2a_hi((int)bs[3], m47, s);
}

/* The row's value in the canonical order (every lane gets it). */
template <int NSB>
__device__ __forceinline__ float gq8_dot_q4k(uint32_t row, const gq8_x_q4k<NSB> &x)
{
    constexpr int JP = GQ8_JP_Q4K(NSB);
    const int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
    const int own = gq8_own_j<JP, 8>();
    int isum[JP];
    uint4 hown = make_uint4(0u, 0u, 0u, 0u); /* the own super-block's header, kept from the loop */
#pragma unroll
    for (int j = 0; j < JP; j++) {
        isum[j] = 0;
        if (j >= GQ8_J_Q4K(NSB) || (NSB % 4 && (lane >> 3) + 4 * j >= NSB))
            continue;
        uint32_t b = row + 144u * (uint32_t)((lane >> 3) + 4 * j);
        uint4 hdr = mk_lds_u4(b), qv = mk_lds_u4(b + 16 + 32 * c + 16 * half);
        if (j == own)
            hown = hdr;
        int sc0, m0, sc1, m1;
        mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c, &sc0, &m0);
        mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c + 1, &sc1, &m1);
        const uint32_t q[4] = {qv.x, qv.y, qv.z, qv.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s0 = __dp4a((int)(q[k] & 0x0f0f0f0fu), (int)x.lo[j][k], s0);
            s1 = __dp4a((int)((q[k] >> 4) & 0x0f0f0f0fu), (int)x.hi[j][k], s1);
        }
        isum[j] = sc0 * s0 + sc1 * s1;
    }
    const int I = gq8_halve<JP, 8>(isum);
    float t = 0.0f;
    if ((lane >> 3) + 4 * own < NSB) {
        const float d = mk_f16((uint16_t)(hown.x & 0xffff)), dmin = mk_f16((uint16_t)(hown.x >> 16));
        t = gq8_term_q4k(x.d, d, dmin, I, gq8_q4k_min_sum(hown.z, hown.w, x.bs));
    }
    t = gq8_tree_lanes<JP, 8>(t);
    t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 16)); /* (a0 + a2), (a1 + a3) */
    return __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 8));
}

/* ---- Q6_K: lane (h, g) of super-block group lane / 16 takes super-blocks lane / 16 + 2 j,
 * elements 128 h + 32 qq + 4 g + i (qq, i < 4; mk_dot_q6k_regs) ----
 * As Q4_K's: each lane's part of every S_j, halved over the 16 lanes of the group, one term per
 * lane, the tree, then a0 + a1. */

#define GQ8_J_Q6K(NSB) (((NSB) + 1) / 2)
#define GQ8_JP_Q6K(NSB) (GQ8_J_Q6K(NSB) <= 1 ? 1 : GQ8_J_Q6K(NSB) <= 2 ? 2 : GQ8_J_Q6K(NSB) <= 4 ? 4 : 8)

template <int NSB>
struct gq8_x_q6k {
    uint32_t w[GQ8_J_Q6K(NSB)][4]; /* x of quarter qq */
    int s32[GQ8_J_Q6K(NSB)][4];    /* 32 x their sum: the -32 offset of the weights */
    float d;                       /* the own super-block's scale (0: none) */
};

template <int NSB>
__device__ __forceinline__ int gq8_own_sb_q6k()
{
    return ((threadIdx.x & 31) >> 4) + 2 * gq8_own_j<GQ8_JP_Q6K(NSB), 16>();
}

template <int NSB>
__device__ __forceinline__ void gq8_gather_q6k(const struct gq8_x *xq, gq8_x_q6k<NSB> &x)
{
    const int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
#pragma unroll
    for (int j = 0; j < GQ8_J_Q6K(NSB); j++) {
        if (NSB % 2 && (lane >> 4) + 2 * j >= NSB)
            break;
        const int sb = (lane >> 4) + 2 * j;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            uint32_t w = *(const uint32_t *)(xq->q + sb * 256 + 128 * h + 32 * qq + 4 * g);
            x.w[j][qq] = w;
            x.s32[j][qq] = 32 * __dp4a((int)w, 0x01010101, 0);
        }
    }
    const int sb = gq8_own_sb_q6k<NSB>();
    x.d = sb < NSB ? xq->d[sb] : 0.0f; /* past the end: the tree's +0 leaves */
}

/* Four bytes at a 2-byte aligned shared-memory address (Q6_K super-blocks are 210 bytes). */
__device__ __forceinline__ uint32_t gq8_lds_w16(uint32_t a)
{
    return __byte_perm(mk_lds_u16(a), mk_lds_u16(a + 2), 0x5410);
}

template <int NSB>
__device__ __forceinline__ float gq8_dot_q6k(uint32_t row, const gq8_x_q6k<NSB> &x)
{
    constexpr int JP = GQ8_JP_Q6K(NSB);
    const int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
    int ssum[JP];
#pragma unroll
    for (int j = 0; j < JP; j++) {
        ssum[j] = 0;
        if (j >= GQ8_J_Q6K(NSB) || (NSB % 2 && (lane >> 4) + 2 * j >= NSB))
            continue;
        uint32_t b = row + 210u * (uint32_t)((lane >> 4) + 2 * j);
        uint32_t ql0 = gq8_lds_w16(b + 64 * h + 4 * g), ql1 = gq8_lds_w16(b + 64 * h + 32 + 4 * g);
        uint32_t qh = gq8_lds_w16(b + 128 + 32 * h + 4 * g), sc = b + 192 + 8 * h + g / 4;
        int s = 0;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            uint32_t lo = ((qq & 1) ? ql1 : ql0) >> (4 * (qq >> 1)) & 0x0f0f0f0fu;
            uint32_t v = lo | ((qh >> (2 * qq)) & 0x03030303u) << 4; /* 0..63: the level + 32 */
            int t = __dp4a((int)v, (int)x.w[j][qq], 0) - x.s32[j][qq];
            s += (int)(int8_t)mk_lds_u8(sc + 2 * qq) * t;
        }
        ssum[j] = s;
    }
    const int S = gq8_halve<JP, 16>(ssum), sb = gq8_own_sb_q6k<NSB>();
    float t = 0.0f;
    if (sb < NSB)
        t = gq8_term_q6k(x.d, mk_f16((uint16_t)mk_lds_u16(row + 210u * (uint32_t)sb + 208)), S);
    t = gq8_tree_lanes<JP, 16>(t);
    return __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 16)); /* a0 + a1 */
}

#endif
