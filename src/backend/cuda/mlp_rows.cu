/*
 * mlp_rows.cu — the decode graph's whole SwiGLU MLP of one token in one launch, split over the
 * intermediate channels with no clusters (16-bit weights, sm_90; cuda_options.mlp_rows):
 *     y += W_down · (silu(W_gate · n) * (W_up · n)),  n = RMSNorm(x) * norm_w.
 *
 * Why: a decode token is a chain of launches that each wait for the whole launch before, and
 * each costs ~2-2.4 us on the H200 whatever its bytes (docs/perf-log.md, session 26: the chain
 * is ~89% of a Qwen3-0.6B BF16 token). The MLP was two of them (norm + gate|up + SwiGLU; down +
 * residual) because the down product needs every intermediate channel. Split over the
 * channels instead, block b needs only its own: it forms IB channels and multiplies them by
 * the IB columns of W_down that read them, a partial sum for every output row. mlp_fused.cu
 * did this with clusters exchanging channels through distributed shared memory and lost: its
 * clusters of 8 fitted on 96 multiprocessors only. Here every block is on its own and the
 * partials meet in global memory:
 *   1. before its wait (the weights are constants) every thread requests its share of the
 *      block's weights with cp.async: the IB rows of W_gate and W_up (contiguous), then the IB
 *      columns of W_down's H rows, laid out chunk-major in shared memory (chunk c of row r at
 *      (c H + r) * 16 bytes: the down loop's lanes read consecutive 16-byte words);
 *   2. after the wait it stages x times the norm weights (the 1 / rms factor goes on the
 *      channels' sums: one pass over x and one barrier), forms its channels (a warp per
 *      channel, gate and up together, a warp's channels at once) and the H partial sums over
 *      them;
 *   3. it adds its partials to an accumulator in global memory with atomics, counts its
 *      arrival, and the last block to arrive adds the accumulator to y, clears it and the
 *      counter for the next launch. y may be x: the last block exists only after every block
 *      has staged x.
 * The accumulator (ACC): MLPR_F32, float atomics (four lanes at once) — the additions land in
 * varying order, so the logits differ in their last bits from run to run (a measurement of
 * what the determinism costs); MLPR_FIXED, 64-bit integer atomics on the partials in fixed
 * point (2^32 units per 1.0): integer addition does not depend on the order, so the result is
 * the same bits on every run. A partial that is not finite or is 2^30 or larger cannot be held
 * there; the block then raises a flag and the last block writes NaN into y (a broken model
 * shows as NaN, as the two launches would show it, instead of a wrong finite number).
 * MLPR_INPLACE: float atomics straight into y, no accumulator, no arrival count, no last block.
 * y cannot be the x the blocks stage then (a block could add to it before another has read
 * it), so the GEMV + residual before stores its result twice (gemv_args.y_copy) and the blocks
 * stage that copy (a.in.x); the order of the additions varies as with MLPR_F32.
 * What it cost (H200, session 31, tg128 at depth 0): off by default — every form is slower than
 * the two launches. Qwen3-0.6B BF16 1,843 tok/s with the two launches; MLPR_F32 1,496, FIXED
 * 1,267, INPLACE 1,585; clusters of 4 or 8 summing their partials first (CS times fewer atomics
 * per address) 1,160-1,250; Qwen3.5-0.8B BF16 1,521 -> 1,084-1,383. The meeting of 112-128
 * blocks in global memory costs more than the launch boundary it replaces (docs/perf-log.md).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_stage.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

#define MLPR_WARPS 8
#define MLPR_SMEM_MAX (227 * 1024)
#define MLPR_FIX_SCALE 4294967296.0 /* fixed-point units per 1.0 (2^32) */
#define MLPR_FIX_LIMIT 1073741824.0f /* partials from 2^30 up do not fit the 64-bit sum safely */

enum { MLPR_F32 = 1, MLPR_FIXED = 2, MLPR_INPLACE = 3 };

/* Shared-memory layout of one block (bytes from the dynamic base; every part 16-aligned). */
struct mlpr_layout {
    uint32_t gu, dn, xs, mine, out, total;
};

__host__ __device__ static inline struct mlpr_layout mlpr_layout_of(int H, int IB, bool down_regs)
{
    struct mlpr_layout l;
    l.gu = 0;
    l.dn = l.gu + (uint32_t)(2 * IB * H * 2);
    l.xs = l.dn + (down_regs ? 0u : (uint32_t)(IB * H * 2));
    l.mine = l.xs + (uint32_t)(H * 4);
    l.out = l.mine + (uint32_t)(((IB + 3) / 4) * 16);
    l.total = l.out + (uint32_t)(H * 4);
    return l;
}

/* Step 1: the gate|up rows in one commit group, the down columns (chunk-major) in a second
 * (empty with the down columns in registers). */
template <bool DREG>
__device__ __forceinline__ void mlpr_request(const struct mlp_args &a, uint8_t *gu, uint8_t *dn, int IB, int ch0)
{
    const int64_t gb = (int64_t)IB * a.H * 2;
    const uint8_t *g = (const uint8_t *)a.w_gate + (int64_t)ch0 * a.H * 2;
    const uint8_t *u = (const uint8_t *)a.w_up + (int64_t)ch0 * a.H * 2;
    for (int64_t o = threadIdx.x * 16; o < gb; o += blockDim.x * 16) {
        cp_async16(smem_u32(gu + o), g + o);
        cp_async16(smem_u32(gu + gb + o), u + o);
    }
    cp_async_commit();
    const int nch = IB / 8; /* 16-byte chunks of a down row's slice */
    const uint8_t *d = (const uint8_t *)a.w_down + (int64_t)ch0 * 2;
    for (int i = threadIdx.x; !DREG && i < a.H * nch; i += blockDim.x) {
        int r = i / nch, c = i % nch; /* consecutive threads: consecutive chunks of a row */
        cp_async16(smem_u32(dn + ((size_t)c * a.H + r) * 16), d + (int64_t)r * a.down_row_bytes + c * 16);
    }
    cp_async_commit();
}

/* Step 2, first half: xs = x * norm_w (the 1 / rms factor is applied to the channels' sums
 * instead, so that x needs one pass and one barrier), and the norm's inverse rms, which every
 * thread returns after that barrier. g0: the thread's norm weights, loaded before the wait. */
__device__ __forceinline__ float mlpr_stage_x(const struct mlp_args &a, float *xs, const float4 (&g0)[GEMV_NW],
                                              float (*s_part)[GEMV_MAX_T])
{
    const int k4 = a.H / 4, nt = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *xt = (const float4 *)a.in.x, *nw = (const float4 *)a.in.norm_w;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < k4; i0 += GEMV_NW * nt) {
        float4 v[GEMV_NW], g[GEMV_NW];
#pragma unroll
        for (int j = 0; j < GEMV_NW; j++) {
            int i = i0 + j * nt;
            v[j] = i < k4 ? xt[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            g[j] = i0 == (int)threadIdx.x ? g0[j] : i < k4 ? __ldg(nw + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < GEMV_NW; j++) {
            if (i0 + j * nt >= k4)
                break;
            ss += gemv_sumsq4(v[j]);
            ((float4 *)xs)[i0 + j * nt] = make_float4(v[j].x * g[j].x, v[j].y * g[j].y, v[j].z * g[j].z, v[j].w * g[j].w);
        }
    }
    ss = warp_sum(ss);
    if (lane == 0)
        s_part[warp][0] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int q = 0; q < MLPR_WARPS; q++)
        tot += s_part[q][0];
    return rsqrtf(tot / (float)a.H + a.in.eps);
}

/* Step 2a: this block's IB channels, silu(gate) * up, into mine[] (gemv2's SwiGLU): warp w
 * takes channels w, w + 8, ... (at most MLPR_CPW), all their rows' loads and sums at once. */
#define MLPR_CPW 4 /* channels per warp at most: IB <= 32 */
template <int DT>
__device__ __forceinline__ void mlpr_gate_up(const uint8_t *gu, const float *xs, float inv, float *mine, int H,
                                             int IB)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nch = H / 8;
    float ag[MLPR_CPW], au[MLPR_CPW];
#pragma unroll
    for (int k = 0; k < MLPR_CPW; k++) {
        ag[k] = au[k] = 0.0f;
        int i = warp + k * MLPR_WARPS;
        if (i >= IB)
            continue;
        const uint4 *gr = (const uint4 *)(gu + (size_t)i * H * 2), *ur = (const uint4 *)(gu + (size_t)(IB + i) * H * 2);
        for (int ch = lane; ch < nch; ch += 32) {
            ag[k] += gemv_dot8<DT>(gr[ch], xs + ch * 8);
            au[k] += gemv_dot8<DT>(ur[ch], xs + ch * 8);
        }
    }
#pragma unroll
    for (int k = 0; k < MLPR_CPW; k++) {
        ag[k] = warp_sum(ag[k]) * inv;
        au[k] = warp_sum(au[k]) * inv;
    }
#pragma unroll
    for (int k = 0; k < MLPR_CPW; k++) {
        int i = warp + k * MLPR_WARPS;
        if (lane == 0 && i < IB)
            mine[i] = ag[k] / (1.0f + __expf(-ag[k])) * au[k];
    }
}

/* Step 2b: out[r] = Σ_c W_down[r][ch0 + c] * mine[c] for every row r, a thread per row. */
template <int DT>
__device__ __forceinline__ void mlpr_down(const uint8_t *dn, const float *mine, float *out, int H, int IB)
{
    const uint4 *d = (const uint4 *)dn;
    for (int r = threadIdx.x; r < H; r += blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < IB / 8; c++)
            s += gemv_dot8<DT>(d[(size_t)c * H + r], mine + c * 8);
        out[r] = s;
    }
}

/* The down columns in registers instead (cuda_options.mlp_rows_down): thread t's rows t + k
 * blockDim.x (k < MLPR_RPT), chunks c < IB / 8, loaded before the wait. */
#define MLPR_RPT 4 /* rows per thread at most: H <= 1024 at 256 threads */
__device__ __forceinline__ void mlpr_load_down(const struct mlp_args &a, int IB, int ch0, uint4 (&dw)[MLPR_RPT][MLPR_CPW])
{
    const uint8_t *d = (const uint8_t *)a.w_down + (int64_t)ch0 * 2;
#pragma unroll
    for (int k = 0; k < MLPR_RPT; k++) {
        int r = threadIdx.x + k * blockDim.x;
#pragma unroll
        for (int c = 0; c < MLPR_CPW; c++)
            dw[k][c] = r < a.H && c < IB / 8 ? __ldg((const uint4 *)(d + (int64_t)r * a.down_row_bytes) + c)
                                             : make_uint4(0, 0, 0, 0);
    }
}

template <int DT>
__device__ __forceinline__ void mlpr_down_regs(const uint4 (&dw)[MLPR_RPT][MLPR_CPW], const float *mine, float *out,
                                               int H, int IB)
{
#pragma unroll
    for (int k = 0; k < MLPR_RPT; k++) {
        int r = threadIdx.x + k * blockDim.x;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < MLPR_CPW; c++)
            if (c < IB / 8)
                s += gemv_dot8<DT>(dw[k][c], mine + c * 8);
        if (r < H)
            out[r] = s;
    }
}

/* Step 3a: out[] into the accumulator; returns whether this thread saw a partial the fixed
 * point cannot hold. */
template <int ACC>
__device__ __forceinline__ bool mlpr_accumulate(const struct mlp_args &a, const float *out, int i0, int i1)
{
    bool bad = false;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float4 v = ((const float4 *)out)[i];
        if (ACC == MLPR_F32 || ACC == MLPR_INPLACE) {
            atomicAdd((float4 *)(ACC == MLPR_F32 ? (float *)a.acc : a.y) + i, v);
        } else {
            const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                bad |= !(fabsf(e[k]) < MLPR_FIX_LIMIT); /* NaN too */
                long long q = llrint((double)e[k] * MLPR_FIX_SCALE);
                atomicAdd((unsigned long long *)a.acc + 4 * i + k, (unsigned long long)q);
            }
        }
    }
    return bad;
}

/* Step 3b, the last block: y += the accumulator, which is cleared for the next launch. */
template <int ACC>
__device__ __forceinline__ void mlpr_finish(const struct mlp_args &a, bool poisoned)
{
    for (int r = threadIdx.x; r < a.H; r += blockDim.x) {
        float s;
        if (ACC == MLPR_F32) {
            s = __ldcg((const float *)a.acc + r);
            ((float *)a.acc)[r] = 0.0f;
        } else {
            long long q = (long long)__ldcg((const unsigned long long *)a.acc + r);
            ((unsigned long long *)a.acc)[r] = 0ull;
            s = poisoned ? NAN : (float)((double)q * (1.0 / MLPR_FIX_SCALE));
        }
        a.y[r] += s;
    }
}

/* CS: blocks per cluster (1: none; cuda_options.mlp_rows_cluster). With clusters, block j of a
 * cluster sums the cluster's partials of rows [j H / CS, (j + 1) H / CS) through distributed
 * shared memory (in rank order) and adds only those: CS times fewer atomics on each address.
 * DREG: the down columns in registers (cuda_options.mlp_rows_down), not in shared memory. */
template <int DT, int ACC, int CS, bool DREG>
__global__ void __launch_bounds__(32 * MLPR_WARPS) mlpr_kernel(const __grid_constant__ struct mlp_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t mlpr_smem[];
    __shared__ float s_part[MLPR_WARPS][GEMV_MAX_T];
    __shared__ int s_last, s_bad;
    const int H = a.H, IB = a.I / (int)gridDim.x, ch0 = (int)blockIdx.x * IB;
    const struct mlpr_layout L = mlpr_layout_of(H, IB, DREG);
    uint8_t *gu = mlpr_smem + L.gu, *dn = mlpr_smem + L.dn;
    float *xs = (float *)(mlpr_smem + L.xs), *mine = (float *)(mlpr_smem + L.mine);
    float *out = (float *)(mlpr_smem + L.out);
    griddep_launch();
    mlpr_request<DREG>(a, gu, dn, IB, ch0);
    uint4 dw[DREG ? MLPR_RPT : 1][DREG ? MLPR_CPW : 1];
    if constexpr (DREG)
        mlpr_load_down(a, IB, ch0, dw);
    float4 g0[GEMV_NW];
    gemv_load_norm_w(a.in, g0);
    if (threadIdx.x == 0)
        s_bad = 0;
    griddep_wait();
    cp_async_wait<1>(); /* this thread's gate|up copies; the staging's barrier: everyone's */
    float inv = mlpr_stage_x(a, xs, g0, s_part);
    mlpr_gate_up<DT>(gu, xs, inv, mine, H, IB);
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (DREG)
        mlpr_down_regs<DT>(dw, mine, out, H, IB);
    else
        mlpr_down<DT>(dn, mine, out, H, IB);
    __syncthreads();
    int i0 = 0, i1 = H / 4; /* the float4 of out[] this block adds */
    if constexpr (CS > 1) {
        cg::cluster_group cl = cg::this_cluster();
        const int j = (int)cl.block_rank(), n4 = H / 4 / CS;
        cl.sync(); /* every block's out[] written */
        i0 = j * n4, i1 = i0 + n4;
        float4 sum[2]; /* H / 4 / CS <= 2 blockDim.x (H <= 2048) */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int i = i0 + (int)threadIdx.x + q * (int)blockDim.x;
            sum[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i >= i1)
                continue;
#pragma unroll
            for (int p = 0; p < CS; p++) {
                float4 v = ((const float4 *)cl.map_shared_rank(out, p))[i];
                sum[q].x += v.x, sum[q].y += v.y, sum[q].z += v.z, sum[q].w += v.w;
            }
        }
        cl.sync(); /* every peer has read this block's out[] */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int i = i0 + (int)threadIdx.x + q * (int)blockDim.x;
            if (i < i1)
                ((float4 *)out)[i] = sum[q];
        }
        __syncthreads();
    }
    if (mlpr_accumulate<ACC>(a, out, i0, i1))
        s_bad = 1; /* any thread: the same value */
    if (ACC == MLPR_INPLACE)
        return;
    __threadfence(); /* this block's additions, before its arrival is counted */
    __syncthreads();
    if (threadIdx.x == 0) {
        if (s_bad)
            atomicOr(a.count + 1, 1u);
        unsigned prev = atomicAdd(a.count, 1u);
        s_last = prev == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    bool poisoned = __ldcg(a.count + 1) != 0;
    __syncthreads(); /* every thread has read the flag before it is cleared */
    if (threadIdx.x == 0)
        a.count[0] = 0, a.count[1] = 0; /* for the next launch (stream-ordered after this one) */
    mlpr_finish<ACC>(a, poisoned);
#else
    __trap();
#endif
}

/* Channels per block for these sizes (0: the kernel does not apply): the fewest (a multiple
 * of 8, dividing I, the grid a whole number of clusters) that keep the grid within one block
 * per multiprocessor and the block within shared memory. */
static int mlpr_channels(const struct mlp_args *a)
{
    const int cs = a->cluster > 1 ? a->cluster : 1;
    if ((a->dtype != QR_BF16 && a->dtype != QR_F16) || a->H <= 0 || a->I <= 0 || a->H % 8 ||
        a->down_row_bytes % 16 || a->down_row_bytes < (int64_t)a->I * 2 || a->H % (4 * cs) || a->H > 2048 ||
        (a->down_regs && a->H > MLPR_RPT * 32 * MLPR_WARPS))
        return 0;
    if (((uintptr_t)a->w_gate | (uintptr_t)a->w_up | (uintptr_t)a->w_down | (uintptr_t)a->in.x |
         (uintptr_t)a->in.norm_w | (uintptr_t)a->y) % 16 || a->in.T != 1 || a->in.K != a->H || !a->in.norm_w)
        return 0;
    int n_sm = a->n_sm > 0 ? a->n_sm : 132;
    for (int IB = 8; IB <= MLPR_CPW * MLPR_WARPS; IB += 8) {
        if (a->I % IB || a->I / IB > n_sm || (a->I / IB) % cs)
            continue;
        return mlpr_layout_of(a->H, IB, a->down_regs).total <= MLPR_SMEM_MAX - 1024 ? IB : 0;
    }
    return 0;
}

/* The accumulator and cluster size asked for are ones the kernel is built for. */
static bool mlpr_options_ok(const struct mlp_args *a)
{
    bool cs_ok = a->cluster <= 1 || a->cluster == 2 || a->cluster == 4 || a->cluster == 8;
    return a->rows >= MLPR_F32 && a->rows <= MLPR_INPLACE && cs_ok;
}

bool mlp_rows_applies(const struct mlp_args *a, int cc_major)
{
    return cc_major >= 9 && mlpr_options_ok(a) && mlpr_channels(a) > 0;
}

template <int DT, int ACC, int CS>
static void (*mlpr_pick_dreg(bool dreg))(const struct mlp_args)
{
    return dreg ? mlpr_kernel<DT, ACC, CS, true> : mlpr_kernel<DT, ACC, CS, false>;
}

template <int DT, int ACC>
static void (*mlpr_pick_cs(int cs, bool dreg))(const struct mlp_args)
{
    switch (cs) {
    case 2: return mlpr_pick_dreg<DT, ACC, 2>(dreg);
    case 4: return mlpr_pick_dreg<DT, ACC, 4>(dreg);
    case 8: return mlpr_pick_dreg<DT, ACC, 8>(dreg);
    default: return mlpr_pick_dreg<DT, ACC, 1>(dreg);
    }
}

template <int DT>
static void (*mlpr_pick(int acc, int cs, bool dreg))(const struct mlp_args)
{
    return acc == MLPR_F32     ? mlpr_pick_cs<DT, MLPR_F32>(cs, dreg)
           : acc == MLPR_FIXED ? mlpr_pick_cs<DT, MLPR_FIXED>(cs, dreg)
                               : mlpr_pick_cs<DT, MLPR_INPLACE>(cs, dreg);
}

cudaError_t launch_mlp_rows(const struct mlp_args *a, cudaStream_t s)
{
    int IB = mlpr_options_ok(a) ? mlpr_channels(a) : 0; /* (the caller checked the device) */
    if (!IB || !a->acc || !a->count)
        return cudaErrorInvalidValue;
    int cs = a->cluster > 1 ? a->cluster : 1;
    void (*k)(const struct mlp_args) = a->dtype == QR_BF16 ? mlpr_pick<QR_BF16>(a->rows, cs, a->down_regs)
                                                           : mlpr_pick<QR_F16>(a->rows, cs, a->down_regs);
    uint32_t smem = mlpr_layout_of(a->H, IB, a->down_regs).total;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    return launch_kc(a->pdl, cs, k, dim3((unsigned)(a->I / IB)), dim3(32 * MLPR_WARPS), smem, s, *a);
}
