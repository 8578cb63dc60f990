/*
 * gemv_batch.cu — the GEMV of a few tokens at once (2 <= T <= 8) with 16-bit weights: each
 * weight chunk read once for all T tokens (cuda_options.gemv_batch).
 *
 * Why: the server's batched decode step (cuda_batch_decode) multiplies n sessions' rows by
 * every weight matrix, and for n <= GEMV_MAX_T that went to gemv2 (which stages all T x K
 * floats of x in shared memory: K = 3072 at T = 8 does not fit its 48 KB) or to the plain
 * gemv_kernel. H200, Qwen3-0.6B BF16, n = 8 (ncu, docs/perf-log.md session 33): the o and down
 * products took 34 us each for 4-6 MB of weights in gemv_kernel, q / k / v and gate / up 15-18
 * us in gemv2 — under 300 GB/s — and the step as a whole was slower at 8 sessions than at 16
 * (whose products go to the GEMM).
 *
 * How: a warp owns RPW consecutive rows (2, or 4 for N >= 4096); its lanes walk the rows'
 * 16-byte chunks c = lane, lane + 32, ..., GB_U chunks' loads issued before the first use,
 * the weights loaded past L1 (ld.global.nc.L1::no_allocate) so that L1 keeps x: every block
 * reads all of x (T * K * 4 bytes, 96 KB at most), so x is read from L1, once per chunk for
 * all RPW rows — per 16 * RPW bytes of weights, 32 * T bytes of x. Each (row, token) sum is a
 * chain of f32 FMAs over the lane's chunks in order, then warp_sum; one lane per (row, token)
 * stores (GEMV_STORE) or adds to y (GEMV_ACCUM). The order of the sums differs from gemv2's
 * and from the one-token kernels': results differ by rounding (test_op_gemv_sizes holds every
 * variant to the CPU).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#define GB_WARPS 4 /* warps per block */
#define GB_U 4     /* chunks per lane whose loads are in flight together */

/* 16 bytes of weights, not kept in L1 (which holds x for every block of the launch). */
static __device__ __forceinline__ uint4 gb_load_w(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The two halves of a 32-bit word of two 16-bit elements, as floats. */
template <int DT>
static __device__ __forceinline__ float2 gb_pair(uint32_t w)
{
    if (DT == QR_BF16)
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    return __half22float2(*reinterpret_cast<const __half2 *>(&w));
}

/* acc += the chunk's 8 weights times x's elements x0 (0-3) and x1 (4-7), in element order. */
template <int DT>
static __device__ __forceinline__ float gb_dot8(uint4 w, float4 x0, float4 x1, float acc)
{
    float2 p;
    p = gb_pair<DT>(w.x), acc = fmaf(p.x, x0.x, acc), acc = fmaf(p.y, x0.y, acc);
    p = gb_pair<DT>(w.y), acc = fmaf(p.x, x0.z, acc), acc = fmaf(p.y, x0.w, acc);
    p = gb_pair<DT>(w.z), acc = fmaf(p.x, x1.x, acc), acc = fmaf(p.y, x1.y, acc);
    p = gb_pair<DT>(w.w), acc = fmaf(p.x, x1.z, acc), acc = fmaf(p.y, x1.w, acc);
    return acc;
}

template <int DT, int T, int RPW>
__global__ void __launch_bounds__(32 * GB_WARPS) gemv_batch_kernel(const __grid_constant__ struct gemv_args a)
{
    griddep_launch();
    griddep_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const struct gemv_seg &sg = a.seg[0];
    const int64_t row0 = ((int64_t)blockIdx.x * GB_WARPS + warp) * RPW;
    if (row0 >= sg.N)
        return;
    const uint4 *rp[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) { /* rows past the end read the last one and store nothing */
        int64_t row = row0 + r < sg.N ? row0 + r : sg.N - 1;
        rp[r] = (const uint4 *)((const uint8_t *)sg.w + row * sg.row_bytes);
    }
    const int chunks = a.K / 8;
    float acc[RPW][T];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[r][t] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * GB_U) {
        uint4 w[GB_U][RPW];
#pragma unroll
        for (int u = 0; u < GB_U; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++)
                w[u][r] = c0 + 32 * u < chunks ? gb_load_w(rp[r] + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GB_U; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks)
                break;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float4 *xp = (const float4 *)(a.x + (int64_t)t * a.ldx + (int64_t)c * 8);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    acc[r][t] = gb_dot8<DT>(w[u][r], x0, x1, acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == r * T + t && row0 + r < sg.N) {
                float *y = sg.y + (int64_t)t * sg.ldy + row0 + r;
                *y = a.mode == GEMV_ACCUM ? *y + v : v;
            }
        }
}

/* Rows per warp for N rows: 4 where the grid stays large (x read once for more rows). */
static int gb_rows_per_warp(int64_t N) { return N >= 4096 ? 4 : 2; }

bool gemv_batch_applies(const struct gemv_args *a)
{
    const struct gemv_seg &sg = a->seg[0];
    return a->T >= 2 && a->T <= 8 && (a->dtype == QR_BF16 || a->dtype == QR_F16) &&
           (a->mode == GEMV_STORE || a->mode == GEMV_ACCUM) && a->n_seg == 1 && !a->norm_w && !a->k_mixed &&
           !a->y_copy && a->K >= 8 && a->K % 8 == 0 && a->ldx % 4 == 0 && (uintptr_t)a->x % 16 == 0 &&
           sg.row_bytes % 16 == 0 && (uintptr_t)sg.w % 16 == 0 && sg.N >= 1 && sg.ldy >= sg.N;
}

template <int DT, int T>
static cudaError_t gb_launch(const struct gemv_args *a, cudaStream_t s)
{
    int rpw = gb_rows_per_warp(a->seg[0].N);
    int64_t per_block = (int64_t)GB_WARPS * rpw;
    dim3 grid((unsigned)((a->seg[0].N + per_block - 1) / per_block)), block(32 * GB_WARPS);
    if (rpw == 4)
        return launch_k(a->pdl, gemv_batch_kernel<DT, T, 4>, grid, block, 0, s, *a);
    return launch_k(a->pdl, gemv_batch_kernel<DT, T, 2>, grid, block, 0, s, *a);
}

template <int DT>
static cudaError_t gb_launch_dt(const struct gemv_args *a, cudaStream_t s)
{
    switch (a->T) {
    case 2: return gb_launch<DT, 2>(a, s);
    case 3: return gb_launch<DT, 3>(a, s);
    case 4: return gb_launch<DT, 4>(a, s);
    case 5: return gb_launch<DT, 5>(a, s);
    case 6: return gb_launch<DT, 6>(a, s);
    case 7: return gb_launch<DT, 7>(a, s);
    default: return gb_launch<DT, 8>(a, s);
    }
}

cudaError_t launch_gemv_batch(const struct gemv_args *a, cudaStream_t s)
{
    if (!gemv_batch_applies(a))
        return cudaErrorInvalidValue;
    return a->dtype == QR_BF16 ? gb_launch_dt<QR_BF16>(a, s) : gb_launch_dt<QR_F16>(a, s);
}

extern "C" bool cuda_gemv_batch_takes(int32_t dtype, int32_t N, int32_t K, int32_t T)
{
    struct gemv_args a;
    memset(&a, 0, sizeof(a));
    a.x = (const float *)(uintptr_t)256, a.ldx = K, a.K = K, a.T = T, a.dtype = dtype;
    a.mode = GEMV_STORE, a.n_seg = 1, a.v2 = true, a.batch = true;
    a.seg[0].w = (const void *)(uintptr_t)4096, a.seg[0].N = N, a.seg[0].ldy = N;
    a.seg[0].row_bytes = (int64_t)K * (dtype == QR_F32 ? 4 : 2);
    return !gemvq_applies(&a) && !gemv_smem_applies(&a) && gemv_batch_applies(&a);
}
