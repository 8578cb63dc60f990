/*
 * mlp_fused.cu — the decode graph's whole SwiGLU MLP of one token in one launch (16-bit
 * weights, sm_90):  y += W_down · (silu(W_gate · n) * (W_up · n)),  n = RMSNorm(x) * norm_w.
 * Off by default (cuda_options.mlp_fused): it measured slower than the two launches it
 * replaces (docs/perf-log.md, session 12). Kept, tested, for the next attempt.
 *
 * Why: decode is a chain of launches that each wait for the one before, and every launch
 * costs a few microseconds beyond its bytes. The MLP was two of them: norm + gate|up +
 * SwiGLU, then down + residual, because the down product needs every intermediate channel.
 * Split over the intermediate channels instead of over its rows, it needs none of the other
 * clusters' channels.
 *
 * Layout: C clusters of MLPF_CS blocks. Cluster c owns IC = I / C intermediate channels, its
 * block j IB = IC / MLPF_CS of them:
 *   1. at the start every thread requests its share of the block's weights with cp.async: the
 *      IB rows of W_gate and W_up (contiguous), and the columns [c*IC, (c+1)*IC) of the
 *      block's RB = H / MLPF_CS rows of W_down. Nothing waits for them yet;
 *   2. the block stages n (gemv_stage.cuh, as gemv2 does), waits for the gate|up bytes and
 *      forms its IB channels, each lane summing its 16-byte chunks in gemv2's order;
 *   3. cluster barrier; each block reads the cluster's IC channels from its peers' shared
 *      memory (distributed shared memory), waits for the down bytes and forms the partial
 *      sums of its RB rows over them: part[c][row];
 *   4. the last cluster to arrive (one counter) adds, for every row, the C partials to y in
 *      cluster order: the result does not depend on which cluster finished when. y may be x:
 *      the last cluster exists only after every block has staged x.
 * What it cost (H200, Qwen3-0.6B): a cluster's blocks must be resident together, one block
 * per multiprocessor with ~200 KB of shared memory, and at most 15 clusters of 8 fit at once;
 * so 12 clusters (96 multiprocessors) stream the 18.9 MB, at ~15 GB/s each: ~15 us against
 * the two launches' ~12.
 */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_stage.cuh"

namespace cg = cooperative_groups;

#ifndef MLPF_CS
#define MLPF_CS 8    /* blocks per cluster (the portable maximum) */
#endif
#ifndef MLPF_C_CAP
#define MLPF_C_CAP 12 /* clusters at most: 16 of 8 blocks did not fit at once (15 did) */
#endif
#define MLPF_WARPS 8 /* warps per block */
#define MLPF_SMEM_MAX (227 * 1024)

/* Shared-memory layout of one block (bytes from the dynamic base; every part 16-aligned). */
struct mlpf_layout {
    uint32_t gu, dn, xs, inter, mine, total;
};

__host__ __device__ static inline struct mlpf_layout mlpf_layout_of(int H, int I, int C)
{
    int IC = I / C, IB = IC / MLPF_CS, RB = H / MLPF_CS;
    struct mlpf_layout l;
    l.gu = 0;
    l.dn = l.gu + (uint32_t)(2 * IB * H * 2);
    l.xs = l.dn + (uint32_t)(RB * IC * 2);
    l.inter = l.xs + (uint32_t)(H * 4);
    l.mine = l.inter + (uint32_t)(IC * 4);
    l.total = l.mine + (uint32_t)(((IB + 3) / 4) * 16);
    return l;
}

/* Step 1: every thread copies 16-byte pieces (cp.async), the gate|up rows in one commit
 * group, the down columns in a second. */
__device__ __forceinline__ void mlpf_request(const struct mlp_args &a, uint8_t *gu, uint8_t *dn, int IB, int IC,
                                                 int RB, int ch0, int c, int r0)
{
    int64_t gb = (int64_t)IB * a.H * 2;
    const uint8_t *g = (const uint8_t *)a.w_gate + (int64_t)ch0 * a.H * 2, *u = (const uint8_t *)a.w_up + (int64_t)ch0 * a.H * 2;
    for (int64_t o = threadIdx.x * 16; o < gb; o += blockDim.x * 16) {
        cp_async16(smem_u32(gu + o), g + o);
        cp_async16(smem_u32(gu + gb + o), u + o);
    }
    cp_async_commit();
    int per_row = IC * 2 / 16;
    for (int i = threadIdx.x; i < RB * per_row; i += blockDim.x) {
        int r = i / per_row, q = i % per_row;
        cp_async16(smem_u32(dn + (size_t)r * IC * 2 + q * 16),
                   (const uint8_t *)a.w_down + (int64_t)(r0 + r) * a.down_row_bytes + (int64_t)c * IC * 2 + q * 16);
    }
    cp_async_commit();
}

/* Step 2: this block's IB channels, silu(gate) * up, into mine[]. */
template <int DT>
__device__ __forceinline__ void mlpf_gate_up(const uint8_t *gu, const float *xs, float *mine, int H, int IB)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nch = H / 8;
    for (int i = warp; i < IB; i += MLPF_WARPS) {
        const uint4 *gr = (const uint4 *)(gu + (size_t)i * H * 2), *ur = (const uint4 *)(gu + (size_t)(IB + i) * H * 2);
        float ag = 0.0f, au = 0.0f;
        for (int ch = lane; ch < nch; ch += 32) {
            ag += gemv_dot8<DT>(gr[ch], xs + ch * 8);
            au += gemv_dot8<DT>(ur[ch], xs + ch * 8);
        }
        ag = warp_sum(ag);
        au = warp_sum(au);
        if (lane == 0)
            mine[i] = ag / (1.0f + __expf(-ag)) * au; /* gemv2's SwiGLU */
    }
}

/* Step 3: the partial sums of this block's RB rows over the cluster's IC channels. */
template <int DT>
__device__ __forceinline__ void mlpf_down(const uint8_t *dn, const float *inter, float *part, int IC, int RB)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dch = IC / 8;
    for (int r = warp * 4; r < RB; r += MLPF_WARPS * 4) { /* four rows at a time: four sums in flight */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int ch = lane; ch < dch; ch += 32)
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (r + q < RB)
                    acc[q] += gemv_dot8<DT>(((const uint4 *)(dn + (size_t)(r + q) * IC * 2))[ch], inter + ch * 8);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float v = warp_sum(acc[q]);
            if (lane == 0 && r + q < RB)
                part[r + q] = v;
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(32 * MLPF_WARPS) mlpf_kernel(const __grid_constant__ struct mlp_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t mlpf_smem[];
    __shared__ float s_part[MLPF_WARPS][GEMV_MAX_T];
    __shared__ int s_last;
    cg::cluster_group cl = cg::this_cluster();
    const int H = a.H, C = (int)gridDim.x / MLPF_CS, IC = a.I / C, IB = IC / MLPF_CS, RB = H / MLPF_CS;
    const int j = (int)cl.block_rank(), c = (int)blockIdx.x / MLPF_CS, r0 = j * RB;
    const struct mlpf_layout L = mlpf_layout_of(H, a.I, C);
    uint8_t *gu = mlpf_smem + L.gu, *dn = mlpf_smem + L.dn;
    float *xs = (float *)(mlpf_smem + L.xs), *inter = (float *)(mlpf_smem + L.inter);
    float *mine = (float *)(mlpf_smem + L.mine);
    mlpf_request(a, gu, dn, IB, IC, RB, c * IC + j * IB, c, r0);
    float4 g0[GEMV_NW];
    gemv_load_norm_w(a.in, g0);
    gemv_stage_x<2, MLPF_WARPS>(a.in, xs, g0, s_part);
    cp_async_wait<1>(); /* this thread's gate|up copies; the barrier: everyone's */
    __syncthreads();
    mlpf_gate_up<DT>(gu, xs, mine, H, IB);
    cl.sync(); /* every block's channels written */
    for (int t = threadIdx.x; t < IC; t += blockDim.x)
        inter[t] = cl.map_shared_rank(mine, t / IB)[t % IB];
    cp_async_wait<0>();
    __syncthreads();
    mlpf_down<DT>(dn, inter, a.part + (size_t)c * H + r0, IC, RB);
    __threadfence(); /* the partials, before the cluster's arrival is counted */
    cl.sync();       /* (also: no block leaves while a peer may still read its mine[]) */
    if (j == 0 && threadIdx.x == 0) {
        int last = atomicAdd(a.count, 1u) == (unsigned)(C - 1);
        if (last)
            *a.count = 0; /* for the next launch (stream-ordered after this one) */
        for (int p = 0; p < MLPF_CS; p++)
            *cl.map_shared_rank(&s_last, p) = last;
    }
    cl.sync();
    if (!s_last)
        return;
    __threadfence();
    for (int r = r0 + (int)threadIdx.x; r < r0 + RB; r += blockDim.x) {
        float s = __ldcg(a.y + r);
        for (int q = 0; q < C; q++)
            s += __ldcg(a.part + (size_t)q * H + r);
        a.y[r] = s;
    }
#else
    __trap();
#endif
}

/* The cluster count for these sizes (0: the kernel does not apply). */
static int mlpf_clusters(const struct mlp_args *a)
{
    if ((a->dtype != QR_BF16 && a->dtype != QR_F16) || a->H <= 0 || a->I <= 0 || a->H % MLPF_CS ||
        a->H % 8 || a->down_row_bytes % 16 || a->down_row_bytes < (int64_t)a->I * 2)
        return 0;
    if (((uintptr_t)a->w_gate | (uintptr_t)a->w_up | (uintptr_t)a->w_down | (uintptr_t)a->in.x |
         (uintptr_t)a->in.norm_w) % 16 || a->in.T != 1 || a->in.K != a->H || !a->in.norm_w)
        return 0;
    for (int C = MLPF_C_CAP; C >= 1; C--) {
        if (a->I % (C * MLPF_CS) || (a->I / C) % 8)
            continue;
        if (mlpf_layout_of(a->H, a->I, C).total <= MLPF_SMEM_MAX - 1024)
            return C;
    }
    return 0;
}

bool mlp_fused_applies(const struct mlp_args *a, int cc_major)
{
    return cc_major >= 9 && mlpf_clusters(a) > 0;
}

cudaError_t launch_mlp_fused(const struct mlp_args *a, cudaStream_t s)
{
    int C = mlpf_clusters(a);
    if (!C)
        return cudaErrorInvalidValue;
    void (*k)(const struct mlp_args) = a->dtype == QR_BF16 ? mlpf_kernel<QR_BF16> : mlpf_kernel<QR_F16>;
    uint32_t smem = mlpf_layout_of(a->H, a->I, C).total;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    return launch_kc(false, MLPF_CS, k, dim3((unsigned)(C * MLPF_CS)), dim3(32 * MLPF_WARPS), smem, s, *a);
}
