/*
 * attention_shared_kv.cu — the decode graph's attention (RoPE inside, T = 1) with each block
 * attending two query heads of one KV head (cuda_options.attn_shared_kv): every cached K/V row
 * a warp loads serves both heads, so a step reads the cache once per KV head instead of once
 * per query head, and launches half the blocks.
 *
 * Why: with grouped-query attention (Qwen3-0.6B: 16 query heads on 8 KV heads; Qwen3.5-0.8B:
 * 8 on 2) attention.cu's attention_kernel gives each query head its own blocks, and the blocks of
 * a group each load the same rows. Deep in a context those loads are the step: at 4,096
 * positions a Qwen3-0.6B layer's f32 cache is 33.5 MB, read twice (docs/perf-log.md, session
 * 29). Here block (j, 0, z) takes query heads h = 2j and h + 1 (a group's heads in pairs:
 * the group size must be even) over split z's positions; its warps load each round of rows
 * once and run attention_decode.cuh's round (attention_round) on it for each head, in the same order
 * and with the same sums as attention_kernel's pipelined loop (attn_pipe 1), so both heads'
 * outputs are bit for bit attention_kernel's. The prologue normalises and rotates both
 * queries (attention_rope_prologue with NQ = 2), the splits' partials go to the same places
 * as attention_kernel's (one per head), and the last block of a pair merges both heads
 * (attention_merge), counted on the pair's first head. Not for the cluster-merged attention
 * (attn_cluster), whose graphs keep attention_kernel.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

/* attention_pipe_rounds (attention.cu) for two query heads: each round's rows feed both heads'
 * online softmax before the buffer is refilled with the round two ahead. */
template <int EPL, typename KV, int U>
__device__ __forceinline__ void attention_pipe_rounds2(const KV *kbase, const KV *vbase, int64_t kvw, int p0,
                                                       int last, int pos, const KV *cur_k, const KV *cur_v,
                                                       const float (&q)[2][EPL], att_rows<KV, U, EPL> &r0,
                                                       att_rows<KV, U, EPL> &r1, float (&m)[2], float (&l)[2],
                                                       float (&acc)[2][EPL])
{
    constexpr int STEP = ATT_WARPS * U;
    attention_load_round<EPL, true>(kbase, vbase, kvw, p0, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r0);
    attention_load_round<EPL, true>(kbase, vbase, kvw, p0 + STEP, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r1);
    for (; p0 <= last; p0 += 2 * STEP) {
        attention_round<EPL, KV, U>(r0, q[0], p0, last, m[0], l[0], acc[0]);
        attention_round<EPL, KV, U>(r0, q[1], p0, last, m[1], l[1], acc[1]);
        if (p0 + 2 * STEP <= last)
            attention_load_round<EPL, true>(kbase, vbase, kvw, p0 + 2 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r0);
        if (p0 + STEP > last)
            break;
        attention_round<EPL, KV, U>(r1, q[0], p0 + STEP, last, m[0], l[0], acc[0]);
        attention_round<EPL, KV, U>(r1, q[1], p0 + STEP, last, m[1], l[1], acc[1]);
        if (p0 + 3 * STEP <= last)
            attention_load_round<EPL, true>(kbase, vbase, kvw, p0 + 3 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r1);
    }
}

/* TL: the decode timeline's variant (a.stamps written), as attention_kernel's. */
template <int EPL, typename KV, bool TL>
__global__ void __launch_bounds__(32 * ATT_WARPS) attention_shared_kv_kernel(const __grid_constant__ struct attn_args a)
{
    if (TL)
        tl_stamp(a.stamps, 0);
    griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before any wait) */
    if (!a.early)
        griddep_wait();
    constexpr int HD = 32 * EPL;
    __shared__ float s_m[2][ATT_WARPS], s_l[2][ATT_WARPS];
    __shared__ float s_acc[2][ATT_WARPS][HD];
    __shared__ __align__(16) float r_q[2][HD], r_k[HD], r_v[HD];
    __shared__ float r_cs[16 * EPL], r_sn[16 * EPL];
    __shared__ __align__(16) KV r_k16[sizeof(KV) == 2 ? HD : 8], r_v16[sizeof(KV) == 2 ? HD : 8];
    const KV *cur_k = sizeof(KV) == 2 ? r_k16 : (const KV *)r_k, *cur_v = sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    const int h = 2 * blockIdx.x, z = blockIdx.z, nz = gridDim.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (a.n_head / a.n_head_kv), pos = *a.pos0;
    int last = pos, lo, S = attention_splits(a, last, nz); /* attention_kernel's splits */
    if (z >= S)
        return;
    attention_split_range(S, z, &lo, &last);
    const KV *kbase = (const KV *)a.kc + (int64_t)kvh * HD + lane * EPL;
    const KV *vbase = (const KV *)a.vc + (int64_t)kvh * HD + lane * EPL;
    constexpr int U = att_u<KV>();
    att_rows<KV, U, EPL> rw, rw2; /* the first two rounds, requested before the wait */
    attention_load_round<EPL, true>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, ATT_ROWS_CACHED, rw);
    attention_load_round<EPL, true>(kbase, vbase, a.kvw, lo + warp + ATT_WARPS * U, last, pos, cur_k, cur_v,
                                    ATT_ROWS_CACHED, rw2);
    if (a.early)
        griddep_wait();
    if (TL)
        tl_stamp(a.stamps, 1);
    attention_rope_prologue<EPL, KV, 2>(a, h, kvh, pos, last == pos, r_q[0], r_k, r_v, r_k16, r_v16, r_cs, r_sn,
                                        r_q[1]);
    if (TL)
        tl_stamp(a.stamps, 2);
    float q[2][EPL], acc[2][EPL], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float scale = rsqrtf((float)HD);
#pragma unroll
    for (int g = 0; g < 2; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            q[g][e] = r_q[g][lane * EPL + e] * scale;
            acc[g][e] = 0.0f;
        }
    attention_pipe_rounds2<EPL, KV, U>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, q, rw, rw2, m, l,
                                       acc);
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < 2; g++)
            s_m[g][warp] = m[g], s_l[g][warp] = l[g];
#pragma unroll
    for (int g = 0; g < 2; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++)
            s_acc[g][warp][lane * EPL + e] = acc[g][e];
    __syncthreads();
    float M[2], L[2], f[2][ATT_WARPS];
#pragma unroll
    for (int g = 0; g < 2; g++) {
        M[g] = -INFINITY, L[g] = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            M[g] = fmaxf(M[g], s_m[g][w]);
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            f[g][w] = s_m[g][w] == -INFINITY ? 0.0f : __expf(s_m[g][w] - M[g]);
            L[g] += s_l[g][w] * f[g][w];
        }
    }
    /* head h + g's output gate (Qwen3.5) and output */
    auto gate_of = [&](int g) { return a.q + (int64_t)(h + g) * a.q_stride + HD; };
    auto out_of = [&](int g) { return a.out + (int64_t)(h + g) * HD; };
    if (S > 1) { /* both heads' partial results, then the pair's last block merges both */
#pragma unroll
        for (int g = 0; g < 2; g++) {
            float *part = a.part + ((int64_t)(h + g) * nz + z) * (HD + 2);
            for (int d = threadIdx.x; d < HD; d += blockDim.x) {
                float o = 0.0f;
#pragma unroll
                for (int w = 0; w < ATT_WARPS; w++)
                    o += s_acc[g][w][d] * f[g][w];
                part[2 + d] = o;
            }
            if (threadIdx.x == 0)
                part[0] = M[g], part[1] = L[g];
        }
        if (attention_split_arrive(a, h, S)) {
            __threadfence();
            attention_merge<EPL>(a, a.part + (int64_t)h * nz * (HD + 2), HD + 2, S, out_of(0), gate_of(0));
            __syncthreads(); /* attention_merge's shared weights are reused by the second head */
            attention_merge<EPL>(a, a.part + (int64_t)(h + 1) * nz * (HD + 2), HD + 2, S, out_of(1), gate_of(1));
        }
    } else {
#pragma unroll
        for (int g = 0; g < 2; g++)
            for (int d = threadIdx.x; d < HD; d += blockDim.x) {
                float o = 0.0f;
#pragma unroll
                for (int w = 0; w < ATT_WARPS; w++)
                    o += s_acc[g][w][d] * f[g][w];
                o /= L[g];
                if (a.gate)
                    o *= sigmoid_f(gate_of(g)[d]);
                out_of(g)[d] = o;
            }
    }
    if (TL)
        tl_stamp(a.stamps, 3);
}

template <int EPL, typename KV>
static cudaError_t launch_shared_kv(const struct attn_args *a, dim3 grid, cudaStream_t s)
{
    dim3 block(32 * ATT_WARPS);
    if (a->stamps)
        return launch_k(a->pdl, attention_shared_kv_kernel<EPL, KV, true>, grid, block, 0, s, *a);
    return launch_k(a->pdl, attention_shared_kv_kernel<EPL, KV, false>, grid, block, 0, s, *a);
}

bool attention_shared_kv_applies(const struct attn_args *a)
{
    return a->T == 1 && a->rope && !a->cluster_merge && a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 &&
           (a->n_head / a->n_head_kv) % 2 == 0 && a->n_rot <= a->hd &&
           (a->hd == 64 || a->hd == 128 || a->hd == 256);
}

template <typename KV>
static cudaError_t launch_shared_kv_kv(const struct attn_args *a, cudaStream_t s)
{
    int splits = a->splits > 1 && a->part && a->count ? a->splits : 1;
    dim3 grid(a->n_head / 2, 1, splits);
    switch (a->hd) {
    case 64: return launch_shared_kv<2, KV>(a, grid, s);
    case 128: return launch_shared_kv<4, KV>(a, grid, s);
    case 256: return launch_shared_kv<8, KV>(a, grid, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_attention_shared_kv(const struct attn_args *a, cudaStream_t s)
{
    if (!attention_shared_kv_applies(a))
        return cudaErrorInvalidValue;
    return a->kv_f16 ? launch_shared_kv_kv<__half>(a, s) : launch_shared_kv_kv<float>(a, s);
}
