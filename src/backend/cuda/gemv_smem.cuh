/*
 * gemv_smem.cuh — what gemv_smem.cu (the one-token 16-bit GEMV with its rows in shared
 * memory) shares with gemv_mma.cu (the same launch with the dot products on the tensor
 * cores): the shape of a launch, chosen once in gemv_smem.cu, and the raised shared-memory
 * limit both kernels need for blocks above 48 KB; and the row mapping over a launch's segments
 * that gemv_mma.cu, gemv_batch.cu and gemvq_batch.cu share.
 */
#ifndef QWENRT_BACKEND_CUDA_GEMV_SMEM_CUH
#define QWENRT_BACKEND_CUDA_GEMV_SMEM_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_stage.cuh"

#define GS_SMEM_DEFAULT (47 * 1024) /* more needs the kernel's attribute raised */

/* The segment sg of a launch's row lr and its row r there (P = 2: the SwiGLU pair's gate and up
 * rows, over their N: segment 0); false past the last row, which then gives row 0
 * (gemv_mma.cu, gemv_batch.cu, gemvq_batch.cu). */
template <int P>
static __device__ __forceinline__ bool gemv_seg_of(const struct gemv_args &a, int64_t lr, int &sg, int64_t &r)
{
    sg = 0, r = lr;
    if (P == 1)
        while (sg < a.n_seg - 1 && r >= a.seg[sg].N)
            r -= a.seg[sg++].N;
    bool ok = r < a.seg[sg].N;
    r = ok ? r : 0;
    return ok;
}

/* Row lr of a launch over its segments (gemv_seg_of): its P weight rows, its output and the
 * output's row stride; false past the last row, which then reads row 0. */
template <int P>
static __device__ __forceinline__ bool gemv_seg_row(const struct gemv_args &a, int64_t lr, const uint4 *(&src)[P],
                                                    float *&y, int32_t &ldy)
{
    int sg;
    int64_t r;
    bool ok = gemv_seg_of<P>(a, lr, sg, r);
#pragma unroll
    for (int p = 0; p < P; p++)
        src[p] = (const uint4 *)((const uint8_t *)a.seg[sg + p].w + r * a.seg[sg + p].row_bytes);
    y = a.seg[sg].y + r, ldy = a.seg[sg].ldy;
    return ok;
}

template <int P>
static __device__ __forceinline__ bool gemv_seg_row(const struct gemv_args &a, int64_t lr, const uint4 *(&src)[P],
                                                    float *&y)
{
    int32_t ldy;
    return gemv_seg_row<P>(a, lr, src, y, ldy);
}

/* How a launch runs: L (gemv_smem: 32 / L rows per warp; gemv_mma: L / 4 warps per 8-row tile),
 * warps per block, blocks, the bytes between rows in shared memory, the block's dynamic
 * shared memory and the cap it was fitted under, whether its blocks let the next launch
 * start before they wait for their input, and whether the tensor cores do the sums. */
struct gs_shape {
    int L, W, blocks;
    int32_t wstride;
    size_t smem, cap;
    bool launch_early;
    bool mma;
    int xreg; /* gemv_smem: x chunks per lane held in registers (4 or 8; 0: x staged in shared memory) */
};

/* The kernel's dynamic shared-memory limit raised to sh.cap when the block needs more than the
 * default, never lowered: a launch captured earlier with a larger cap stays valid (a host
 * call: replayed graphs do not repeat it). */
template <typename K>
static cudaError_t gs_raise_smem_limit(K kernel, const struct gs_shape &sh)
{
    if (sh.smem <= GS_SMEM_DEFAULT)
        return cudaSuccess;
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
    if (e == cudaSuccess && (size_t)fa.maxDynamicSharedSizeBytes < sh.cap)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh.cap);
    return e;
}

/* The middle of both kernels, once a block's row copies are issued: close them as one group,
 * ask the L2 for its share of a later step's weights (a.pf), let the next launch start (before the wait, or after it: gs_shape.launch_early), load the
 * first norm weights (constant: before the wait), wait for the input. */
__device__ __forceinline__ void gs_commit_and_wait(const struct gemv_args &a, bool launch_early,
                                                   float4 (&g0)[GEMV_NW])
{
    cp_async_commit();
    l2_prefetch_share(a.pf);
    if (launch_early)
        griddep_launch();
    gemv_load_norm_w(a, g0);
    griddep_wait();
    if (!launch_early)
        griddep_launch();
}

#define GS_XB 8                 /* x float4 per thread per staging batch */

/* 1 / rms of a block's x from each thread's partial sum of squares ss: the warps' sums in
 * s_red (one float per warp), added in warp order by every thread (gemv_smem's and gemv_mma's
 * x staging; the same order as before this helper, so the same bits). Contains a block
 * barrier. */
static __device__ __forceinline__ float gs_rms_inv(float ss, float *s_red, int32_t K, float eps)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ss = warp_sum(ss);
    if (lane == 0)
        s_red[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++)
        tot += s_red[w];
    return rsqrtf(tot / (float)K + eps);
}

/* x (K floats) into shared memory as xlo[c] = x[8c .. 8c+3], xhi[c] = x[8c+4 .. 8c+7], times
 * 1/rms(x) * norm_w when a.norm_w. Each thread rescales the float4 it stored itself; the one
 * block barrier is the sum of squares' (and makes x visible). */
static __device__ __forceinline__ void gs_stage_x(const struct gemv_args &a, float4 *xlo, float4 *xhi,
                                           const float4 (&g0)[GEMV_NW], float *s_red)
{
    const int k4 = a.K / 4, nt = blockDim.x;
    const float4 *xt = (const float4 *)a.x, *nw = (const float4 *)a.norm_w;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < k4; i0 += GS_XB * nt) {
        float4 v[GS_XB];
        gemv_load_x<GS_XB>(xt, i0, nt, k4, v);
#pragma unroll
        for (int j = 0; j < GS_XB; j++) {
            int i = i0 + j * nt;
            if (i >= k4)
                break;
            ((i & 1) ? xhi : xlo)[i >> 1] = v[j];
            ss += gemv_sumsq4(v[j]);
        }
    }
    if (nw) {
        float inv = gs_rms_inv(ss, s_red, a.K, a.eps);
        int m = 0;
        for (int i = threadIdx.x; i < k4; i += nt, m++) {
            float4 g = m == 0 ? g0[0] : m == 1 ? g0[1] : __ldg(nw + i);
            float4 *p = ((i & 1) ? xhi : xlo) + (i >> 1);
            float4 v = *p;
            v.x = v.x * inv * g.x, v.y = v.y * inv * g.y, v.z = v.z * inv * g.z, v.w = v.w * inv * g.w;
            *p = v;
        }
    }
    __syncthreads();
}

/* gemv_mma.cu: the launch of a shape gemv_smem_shape made with sh.mma (BF16 weights). */
cudaError_t launch_gemv_mma(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s);

#endif
