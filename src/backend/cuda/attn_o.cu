/*
 * attn_o.cu — a decode layer's attention (q/k norm, RoPE, cache write, the output gate) and
 * its o product + residual add in one launch (cuda_options.attn_o; sm_90: thread-block
 * clusters and distributed shared memory):  y += W_o · attention(q, K, V).
 *
 * Why: in the decode graph the o product was a launch of its own after the attention. Its
 * chain — the release after the attention's last block, x (the attention output) staged from
 * L2, the dot products, the slowest block — cost ~3 us per layer for a product whose weights
 * (4 MB at Qwen3-0.6B's widths in BF16) were already in shared memory before it started.
 * Here the o product starts from the attention output the block itself holds.
 *
 * How: one cluster of C blocks (8, or 16 for models with 8 query heads or fewer) per query
 * head h; block c of it owns the rows [c R, (c+1) R) of W_o (R = N / C), and of them only the
 * columns of head h: R x hd 16-bit weights, copied into shared memory with cp.async before
 * griddep_wait (they do not depend on the launch before).
 *   1. the attention of head h, as attention.cu's attention kernel computes it (the same
 *      prologue, rounds of rows and online softmax: attention_decode.cuh). Below
 *      `single` positions every block of the cluster attends all of them itself (one or two
 *      rounds of rows: nothing to exchange); from there block c takes the c-th slice of the
 *      positions, and after a cluster barrier every block merges the C partial results
 *      (max, sum, unnormalised output) from its peers' shared memory, in rank order. Block 0
 *      of the group's first query head writes the cache row of the current position;
 *   2. its R rows' dot products with the head's output (each lane its hd / 32 elements; a
 *      warp's 8 rows summed transposed, ao_sum8): head h's share of those rows, into
 *      part[h][row];
 *   3. the last of the n_head blocks of row slice c to arrive (one counter per slice, reset
 *      by it for the next launch) adds the n_head partials to y in head order: the result does
 *      not depend on which block finished when.
 * Measured (H200, docs/perf-log.md session 25): Qwen3-0.6B BF16 level with the two launches
 * at short contexts (1,752-1,760 vs 1,759-1,761 tok/s), +3.1% at depth 512, +10.6% at 1,024,
 * +5.1% at 2,048, -5.9% at 4,096 (8 slices per head where the split attention takes up to 32);
 * Qwen3.5-0.8B -1.6% (6 of its 24 layers). Off by default. The time line says why short
 * contexts gain nothing: the tail of step 3 (fence, counter, the last block's sums from L2)
 * ends 1.8 us after the median block, as long as the o launch's release and x staging it
 * replaces. Tried and removed (same entry): the heads summed through distributed shared
 * memory in clusters of 16 blocks per row slice (-21%: clusters of 16 place badly) and of 8
 * with two heads per block (-2.2%: the cluster barrier waits for the slowest block's
 * attention, so the sum ends as late as the counter's).
 * Numerics: the attention and the product in f32 as the two launches compute them; the sums
 * run in other orders (per head, then across heads; the merge in rank order), so results
 * differ from the two launches' by rounding: test_graph_attn_o compares both.
 */
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define AO_THREADS (32 * ATT_WARPS)
#define AO_ROW_UNROLL 8 /* rows per warp whose dot products run before their sums */
#define AO_SMEM_MAX (200 * 1024)

/* The dot product of a lane's EPL 16-bit weights (at w, shared memory) with its EPL floats. */
template <int EPL, int DT>
__device__ __forceinline__ float ao_dot(const uint8_t *w, const float *x)
{
    uint32_t u[EPL / 2];
    if constexpr (EPL == 8) {
        uint4 v = *(const uint4 *)w;
        u[0] = v.x, u[1] = v.y, u[2] = v.z, u[3] = v.w;
    } else if constexpr (EPL == 4) {
        uint2 v = *(const uint2 *)w;
        u[0] = v.x, u[1] = v.y;
    } else {
        u[0] = *(const uint32_t *)w;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL / 2; j++) {
        uint16_t lo = (uint16_t)(u[j] & 0xffffu), hi = (uint16_t)(u[j] >> 16);
        float a = DT == QR_BF16 ? bf16_bits_to_f32(lo) : f16_bits_to_f32(lo);
        float b = DT == QR_BF16 ? bf16_bits_to_f32(hi) : f16_bits_to_f32(hi);
        s += a * x[2 * j] + b * x[2 * j + 1];
    }
    return s;
}

__device__ __forceinline__ void ao_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void ao_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

/* The sums of a warp's AO_ROW_UNROLL = 8 rows over its lanes, transposed as they are reduced
 * (9 shuffles where 8 warp sums take 40): lane l ends with row (l >> 2) & 7's sum. */
__device__ __forceinline__ float ao_sum8(float (&v)[8], int lane)
{
    float w4[4], w2[2];
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float mine = b4 ? v[i + 4] : v[i], other = b4 ? v[i] : v[i + 4];
        w4[i] = mine + __shfl_xor_sync(0xffffffffu, other, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mine = b3 ? w4[i + 2] : w4[i], other = b3 ? w4[i] : w4[i + 2];
        w2[i] = mine + __shfl_xor_sync(0xffffffffu, other, 8);
    }
    float mine = b2 ? w2[1] : w2[0], other = b2 ? w2[0] : w2[1];
    float w = mine + __shfl_xor_sync(0xffffffffu, other, 4);
    w += __shfl_xor_sync(0xffffffffu, w, 2);
    return w + __shfl_xor_sync(0xffffffffu, w, 1);
}

/* TL: the decode timeline's instantiation (stamps: start, released from the wait, the head's
 * output ready, end), launched only when the timeline asks. */
template <int EPL, typename KV, int DT, bool TL = false>
__global__ void __launch_bounds__(AO_THREADS) attn_o_kernel(const __grid_constant__ struct attn_o_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int hd = 32 * EPL;
    extern __shared__ __align__(16) uint8_t ao_w[]; /* [R][hd] 16-bit: this block's W_o slice */
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][hd];
    __shared__ __align__(16) float r_q[hd], r_k[hd], r_v[hd];
    __shared__ float r_cs[hd / 2], r_sn[hd / 2];
    __shared__ __align__(16) KV r_k16[sizeof(KV) == 2 ? hd : 8], r_v16[sizeof(KV) == 2 ? hd : 8];
    __shared__ __align__(16) float s_o[hd];  /* the head's (gated) output */
    __shared__ __align__(16) float s_po[hd]; /* split: this block's unnormalised partial output */
    __shared__ float s_pm[2];                /* split: its max and sum */
    __shared__ float s_f[16], s_inv;
    __shared__ bool s_last;
    const struct attn_args &t = a.t;
    const KV *cur_k = sizeof(KV) == 2 ? r_k16 : (const KV *)r_k, *cur_v = sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    const int C = (int)gridDim.x, c = (int)blockIdx.x, h = (int)blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, R = a.N / C, r0 = c * R;
    if (TL)
        tl_stamp(a.t.stamps, 0);
    griddep_launch();
    { /* the block's W_o slice: R rows of hd columns, 16-byte copies */
        constexpr int CPR = hd * 2 / 16;
        const uint8_t *src = (const uint8_t *)a.w + (int64_t)r0 * a.row_bytes + (int64_t)h * hd * 2;
        const uint32_t dst = smem_u32(ao_w);
        for (int i = threadIdx.x; i < R * CPR; i += blockDim.x) {
            int r = i / CPR, q = i % CPR;
            cp_async16(dst + (uint32_t)(r * hd * 2 + q * 16), src + (int64_t)r * a.row_bytes + q * 16);
        }
        cp_async_commit();
    }
    l2_prefetch_share(t.pf);
    if (!t.early)
        griddep_wait();
    const int kvh = h / (t.n_head / t.n_head_kv), pos = *t.pos0;
    const bool split = pos >= a.single; /* the same in every block of the cluster */
    const int S = split ? C : 1, chunk = (pos + S) / S, lo = (split ? c : 0) * chunk;
    const int last = min(pos, lo + chunk - 1); /* this block's positions lo..last (none: last < lo) */
    const KV *kbase = (const KV *)t.kc + (int64_t)kvh * hd + lane * EPL;
    const KV *vbase = (const KV *)t.vc + (int64_t)kvh * hd + lane * EPL;
    constexpr int U = att_u<KV>();
    att_rows<KV, U, EPL> rw;
    attention_load_round<EPL, true>(kbase, vbase, t.kvw, lo + warp, last, pos, cur_k, cur_v, ATT_ROWS_CACHED, rw);
    if (t.early)
        griddep_wait();
    if (TL)
        tl_stamp(a.t.stamps, 1);
    attention_rope_prologue<EPL, KV>(t, h, kvh, pos, c == 0, r_q, r_k, r_v, r_k16, r_v16, r_cs, r_sn);
    float q[EPL], acc[EPL];
    const float scale = rsqrtf((float)hd);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] = r_q[lane * EPL + e] * scale;
        acc[e] = 0.0f;
    }
    /* the attention kernel's rounds (attention_round, attention_decode.cuh) */
    float m = -INFINITY, l = 0.0f;
    for (int p0 = lo + warp; p0 <= last; p0 += ATT_WARPS * U) {
        attention_load_round<EPL, true>(kbase, vbase, t.kvw, p0, last, pos, cur_k, cur_v,
                                        p0 == lo + warp ? ATT_ROWS_CURRENT : ATT_ROWS_ALL, rw);
        attention_round<EPL, KV, U>(rw, q, p0, last, m, l, acc);
    }
    /* the output gate of this thread's dimension (Qwen3.5), requested before the merges */
    const float *gp = t.q + (int64_t)h * t.q_stride + hd;
    const float g0 = t.gate && (int)threadIdx.x < hd ? gp[threadIdx.x] : 0.0f;
    if (lane == 0)
        s_m[warp] = m, s_l[warp] = l;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    float M = -INFINITY, L = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, s_m[w]);
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    cg::cluster_group cl = cg::this_cluster();
    if (!split) {
        if ((int)threadIdx.x < hd) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++)
                o += s_acc[w][threadIdx.x] * f[w];
            o /= L;
            s_o[threadIdx.x] = t.gate ? o * sigmoid_f(g0) : o;
        }
    } else { /* the cluster's C partial results merged, in rank order, by every block */
        if ((int)threadIdx.x < hd) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++)
                o += s_acc[w][threadIdx.x] * f[w];
            s_po[threadIdx.x] = o;
        }
        if (threadIdx.x == 0)
            s_pm[0] = M, s_pm[1] = L;
        cl.sync();
        if (warp == 0) {
            float mj = lane < C ? *cl.map_shared_rank(&s_pm[0], lane) : -INFINITY;
            float lj = lane < C ? *cl.map_shared_rank(&s_pm[1], lane) : 0.0f;
            float Mx = mj;
            for (int o = 16; o > 0; o >>= 1)
                Mx = fmaxf(Mx, __shfl_xor_sync(0xffffffffu, Mx, o));
            float fj = mj == -INFINITY ? 0.0f : __expf(mj - Mx);
            float Lx = warp_sum(lj * fj);
            if (lane < 16)
                s_f[lane] = fj;
            if (lane == 0)
                s_inv = 1.0f / Lx;
        }
        __syncthreads();
        if ((int)threadIdx.x < hd) {
            float o = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (j < C)
                    o += *cl.map_shared_rank(&s_po[threadIdx.x], j) * s_f[j];
            o *= s_inv;
            s_o[threadIdx.x] = t.gate ? o * sigmoid_f(g0) : o;
        }
        ao_arrive(); /* this block has read its peers: they may leave once all have */
    }
    cp_async_wait<0>();
    __syncthreads();
    if (TL)
        tl_stamp(a.t.stamps, 2);

    /* 2. head h's share of the block's R rows */
    float x[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++)
        x[e] = s_o[lane * EPL + e];
    const int rpw = R / ATT_WARPS;
    float *part = a.part + (int64_t)h * a.N + r0;
    for (int i0 = warp * rpw; i0 < (warp + 1) * rpw; i0 += AO_ROW_UNROLL) {
        float d[AO_ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < AO_ROW_UNROLL; u++)
            d[u] = ao_dot<EPL, DT>(ao_w + (size_t)(i0 + u) * hd * 2 + lane * EPL * 2, x);
        float v = ao_sum8(d, lane);
        if ((lane & 3) == 0)
            part[i0 + (lane >> 2)] = v;
    }

    /* 3. the last head of this row slice adds the n_head partials to y, in head order */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned prev = atomicAdd(a.count + c, 1u);
        s_last = prev == gridDim.y - 1;
        if (s_last)
            a.count[c] = 0; /* every head has arrived: ready for the next launch */
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        for (int r = threadIdx.x; r < R; r += blockDim.x) {
            float s = 0.0f;
            for (int hh = 0; hh < (int)gridDim.y; hh++)
                s += __ldcg(a.part + (int64_t)hh * a.N + r0 + r);
            a.y[r0 + r] += s;
        }
    }
    if (TL)
        tl_stamp(a.t.stamps, 3);
    if (split)
        ao_wait();
#endif
}

/* The cluster size for a.t.n_head query heads: 16 where 8 blocks per head would leave most of
 * the multiprocessors idle (8 heads or fewer), else 8; 0 when the rows do not split into
 * whole rounds of the warps' rows. */
static int ao_cluster(const struct attn_o_args *a)
{
    int C = a->cluster ? a->cluster : (a->t.n_head <= 8 ? 16 : 8);
    if (C != 8 && C != 16)
        return 0;
    if (a->N % C || (a->N / C) % (ATT_WARPS * AO_ROW_UNROLL))
        return 0;
    return C;
}

static size_t ao_smem(const struct attn_o_args *a, int C) { return (size_t)(a->N / C) * a->t.hd * 2; }

bool attn_o_applies(const struct attn_o_args *a)
{
    const struct attn_args *t = &a->t;
    int C = ao_cluster(a);
    return C && t->T == 1 && t->rope && (t->hd == 64 || t->hd == 128 || t->hd == 256) && t->n_rot <= t->hd &&
           t->n_rot % 2 == 0 && t->n_head_kv > 0 && t->n_head % t->n_head_kv == 0 && t->n_head <= 65535 &&
           (a->dtype == QR_BF16 || a->dtype == QR_F16) && a->row_bytes >= (int64_t)t->n_head * t->hd * 2 &&
           a->row_bytes % 16 == 0 && ((uintptr_t)a->w & 15) == 0 && ao_smem(a, C) <= AO_SMEM_MAX &&
           a->single >= 0;
}

template <int EPL, typename KV, int DT>
static cudaError_t ao_launch(const struct attn_o_args *a, int C, cudaStream_t s)
{
    void (*k)(const struct attn_o_args) = a->t.stamps ? attn_o_kernel<EPL, KV, DT, true> : attn_o_kernel<EPL, KV, DT>;
    size_t smem = ao_smem(a, C);
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && C > 8)
        e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess)
        return e;
    return launch_kc(a->t.pdl, C, k, dim3(C, a->t.n_head), dim3(AO_THREADS), smem, s, *a);
}

template <typename KV, int DT>
static cudaError_t ao_launch_hd(const struct attn_o_args *a, int C, cudaStream_t s)
{
    switch (a->t.hd) {
    case 64: return ao_launch<2, KV, DT>(a, C, s);
    case 128: return ao_launch<4, KV, DT>(a, C, s);
    default: return ao_launch<8, KV, DT>(a, C, s);
    }
}

cudaError_t launch_attn_o(const struct attn_o_args *a, cudaStream_t s)
{
    if (!attn_o_applies(a) || !a->part || !a->count || !a->y)
        return cudaErrorInvalidValue;
    int C = ao_cluster(a);
    if (a->dtype == QR_BF16)
        return a->t.kv_f16 ? ao_launch_hd<__half, QR_BF16>(a, C, s) : ao_launch_hd<float, QR_BF16>(a, C, s);
    return a->t.kv_f16 ? ao_launch_hd<__half, QR_F16>(a, C, s) : ao_launch_hd<float, QR_F16>(a, C, s);
}
