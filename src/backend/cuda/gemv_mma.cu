/*
 * gemv_mma.cu — gemv_smem's one-token GEMV for BF16 rows with the dot products on the tensor
 * cores (cuda_options.gemv_mma): the same blocks, the same copy of the rows into shared
 * memory before griddep_wait, the same rows per block; only the sums differ.
 *
 * Why: once PDL has the weights in shared memory before the input is ready, what is left of a
 * launch is the wait, x staged, and the dot products (session 13's timeline: ~1 us of each,
 * for a ~4.4 us q|k|v launch). On the CUDA cores a 16-byte chunk of weights costs ~20
 * instructions (two loads of x, eight conversions, eight FMAs, a chain of adds); with 2 warps
 * per scheduler nothing hides their latency. mma.sync m16n8k16 does 8 rows x 16 weights in
 * one instruction, and ldmatrix loads 8 rows x 32 weights in one: ~5 instructions per 512
 * bytes instead of ~640.
 *
 * A GEMV has one x, and a tensor-core product wants 16 of them: x goes in as A, its rows 0-2
 * the three bf16 terms of x (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): their
 * sum is x to ~2^-24, so the result keeps f32 accuracy; products of two bf16 are exact in f32),
 * the other 13 rows unused (their results are never read); W's rows are the 8 columns of B.
 * D row m, column n is then term m's dot product with row n, and rows 0-2 summed give y[n].
 *
 * A block's R rows (R = W * 32 / L as in gemv_smem, L = 8 or 16 by K: gs_lanes) are
 * tiles of 8; each tile belongs to S = L / 4 warps that split K (K % (64 S) == 0, checked by
 * gemv_smem_shape). A warp copies exactly the chunks it will read (its tile's 8 rows, its
 * K slice), so after its cp.async wait a __syncwarp makes them visible; one block barrier
 * adds the S partial sums. Four accumulators per product keep the chain of mma short.
 *
 * Shared memory: x's three terms first, K * 6 bytes: for each 32 elements of K, term t's 16
 * u32 words (two elements each) stored so that lane c of a quad reads words c, 4 + c, 8 + c,
 * 12 + c (its A fragments for two k steps) in one 16-byte load; lanes 0-11 read 192
 * contiguous bytes. Then the rows, K * 2 + 16 bytes apart (gate rows, then up rows for the
 * SwiGLU pair): the 16 bytes put ldmatrix's eight row addresses on eight bank groups.
 * Sums run in another order than gemv_smem's and with the tensor cores' own rounding of the
 * f32 accumulation: test_cuda_ops compares both with the CPU reference.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_smem.cuh"
#include "backend/cuda/gemv_stage.cuh"

#include <cuda_bf16.h>

#define GM_XB 4 /* x float4 per thread kept in registers while the norm's sum is made */

/* The three bf16 terms of two floats, as u32 words (element e0 in the low half). */
__device__ __forceinline__ void gm_terms(float e0, float e1, uint32_t (&w)[3])
{
    float v[2] = {e0, e1};
    uint16_t h[3][2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        __nv_bfloat16 hi = __float2bfloat16_rn(v[i]);
        float r = v[i] - __bfloat162float(hi);
        __nv_bfloat16 mid = __float2bfloat16_rn(r);
        __nv_bfloat16 lo = __float2bfloat16_rn(r - __bfloat162float(mid));
        h[0][i] = __bfloat16_as_ushort(hi), h[1][i] = __bfloat16_as_ushort(mid), h[2][i] = __bfloat16_as_ushort(lo);
    }
#pragma unroll
    for (int t = 0; t < 3; t++)
        w[t] = (uint32_t)h[t][0] | ((uint32_t)h[t][1] << 16);
}

/* x's float4 number i (times the norm) into the terms' layout (see the top of the file). */
__device__ __forceinline__ void gm_store_x4(uint32_t *xw, int i, float4 v)
{
    uint32_t w0[3], w1[3];
    gm_terms(v.x, v.y, w0);
    gm_terms(v.z, v.w, w1);
    const int kb = i >> 3, word = (i & 7) * 2; /* 32 elements per block, 16 words per term */
    const int p0 = (word & 3) * 4 + (word >> 2), p1 = ((word + 1) & 3) * 4 + ((word + 1) >> 2);
#pragma unroll
    for (int t = 0; t < 3; t++) {
        xw[kb * 48 + t * 16 + p0] = w0[t];
        xw[kb * 48 + t * 16 + p1] = w1[t];
    }
}

/* x (K floats) into shared memory as its three bf16 terms, times 1/rms(x) * norm_w when
 * a.norm_w; ends with the block barrier that makes them visible. A thread keeps its first
 * GM_XB float4 in registers while the sum of squares is made (all of x for K <= 16 * threads);
 * the rest is read again. */
__device__ __forceinline__ void gm_stage_x(const struct gemv_args &a, uint32_t *xw, const float4 (&g0)[GEMV_NW],
                                           float *s_red)
{
    const int k4 = a.K / 4, nt = blockDim.x;
    const float4 *xt = (const float4 *)a.x, *nw = (const float4 *)a.norm_w;
    float4 v[GM_XB];
    gemv_load_x<GM_XB>(xt, threadIdx.x, nt, k4, v);
    float inv = 1.0f;
    if (nw) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < GM_XB; j++)
            ss += gemv_sumsq4(v[j]); /* zeros past k4 */
        for (int i = threadIdx.x + GM_XB * nt; i < k4; i += nt)
            ss += gemv_sumsq4(xt[i]);
        inv = gs_rms_inv(ss, s_red, a.K, a.eps);
    }
    const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll
    for (int j = 0; j < GM_XB; j++) {
        int i = threadIdx.x + j * nt;
        if (i >= k4)
            break;
        float4 g = !nw ? one : j < GEMV_NW ? g0[j] : __ldg(nw + i);
        float4 x = v[j];
        gm_store_x4(xw, i, make_float4(x.x * inv * g.x, x.y * inv * g.y, x.z * inv * g.z, x.w * inv * g.w));
    }
    for (int i = threadIdx.x + GM_XB * nt; i < k4; i += nt) {
        float4 g = nw ? __ldg(nw + i) : one, x = xt[i];
        gm_store_x4(xw, i, make_float4(x.x * inv * g.x, x.y * inv * g.y, x.z * inv * g.z, x.w * inv * g.w));
    }
    __syncthreads();
}


/* P physical rows per row (2: the SwiGLU gate/up pair), S warps per 8-row tile. */
template <int P, int S>
__global__ void __launch_bounds__(32 * GEMV_SMEM_WARPS_LIMIT) gemv_mma_kernel(const __grid_constant__ struct gemv_args a,
                                                                      int32_t wstride, bool launch_early)
{
    extern __shared__ float4 gm_smem4[];
    __shared__ float s_red[GEMV_SMEM_WARPS_LIMIT];
    __shared__ float s_part[GEMV_SMEM_WARPS_LIMIT][P][8];
    unsigned long long *st = a.stamps && threadIdx.x == 0 ? a.stamps + TL_SLOTS * (size_t)blockIdx.x : NULL;
    if (st)
        st[0] = globaltimer_ns(), st[4] = tl_smid() + 1ull;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tile = warp / S, part = warp % S;
    const int R = (int)(blockDim.x >> 5) / S * 8, kslice = a.K / S, k0 = part * kslice;
    uint32_t *xw = (uint32_t *)gm_smem4;
    const uint32_t rows = smem_u32(gm_smem4) + (uint32_t)a.K * 6, pstride = (uint32_t)(R * wstride);
    const int64_t row0 = (int64_t)blockIdx.x * R + tile * 8;

    /* 1. this warp's chunks of its tile's rows (K slice k0 .. k0 + kslice) */
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint4 *src[P];
        float *y;
        if (!gemv_seg_row<P>(a, row0 + i, src, y))
            break;
#pragma unroll
        for (int p = 0; p < P; p++)
            for (int c = lane; c < kslice / 8; c += 32)
                cp_async16(rows + p * pstride + (uint32_t)((tile * 8 + i) * wstride + (k0 / 8 + c) * 16),
                           src[p] + k0 / 8 + c);
    }
    float4 g0[GEMV_NW];
    gs_commit_and_wait(a, launch_early, g0);
    if (st)
        st[1] = globaltimer_ns();
    /* the lane that stores row row0 + lane (part 0, lanes 0-7) */
    const uint4 *src_y[P];
    float *yp;
    const bool stores = part == 0 && lane < 8 && gemv_seg_row<P>(a, row0 + lane, src_y, yp);
    float yold = a.mode == GEMV_ACCUM && stores ? *yp : 0.0f;

    /* 2. x's terms */
    gm_stage_x(a, xw, g0, s_red);
    cp_async_wait<0>();
    __syncwarp();
    if (st)
        st[2] = globaltimer_ns();

    /* 3. the products: k blocks of 32 (two mma steps), four accumulators per product */
    float d[P][4][4];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            d[p][j][0] = d[p][j][1] = d[p][j][2] = d[p][j][3] = 0.0f;
    const int g = lane >> 2, c = lane & 3;
    const uint32_t xa = smem_u32(xw) + (uint32_t)(min(g, 2) * 64 + c * 16); /* A rows 3-15: unread results */
    const uint32_t la = rows + (uint32_t)((tile * 8 + (lane & 7)) * wstride + (lane >> 3) * 16);
    for (int kb = k0 / 32; kb < (k0 + kslice) / 32; kb += 2) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                         : "r"(xa + (uint32_t)(kb + h) * 192));
#pragma unroll
            for (int p = 0; p < P; p++) {
                uint32_t b[4];
                ldmatrix_x4(b, la + p * pstride + (uint32_t)(kb + h) * 64);
                mma_bf16_16816(d[p][2 * h], x0, 0u, x1, 0u, b[0], b[1]);
                mma_bf16_16816(d[p][2 * h + 1], x2, 0u, x3, 0u, b[2], b[3]);
            }
        }
    }

    /* 4. rows 2c, 2c + 1 of the tile: the accumulators, then terms 0-2 (lanes c, 4 + c,
     * 8 + c), then the S warps of the tile */
#pragma unroll
    for (int p = 0; p < P; p++) {
        float v0 = (d[p][0][0] + d[p][1][0]) + (d[p][2][0] + d[p][3][0]);
        float v1 = (d[p][0][1] + d[p][1][1]) + (d[p][2][1] + d[p][3][1]);
        float m0 = __shfl_down_sync(0xffffffffu, v0, 4), l0 = __shfl_down_sync(0xffffffffu, v0, 8);
        float m1 = __shfl_down_sync(0xffffffffu, v1, 4), l1 = __shfl_down_sync(0xffffffffu, v1, 8);
        if (lane < 4)
            s_part[warp][p][2 * lane] = v0 + (m0 + l0), s_part[warp][p][2 * lane + 1] = v1 + (m1 + l1);
    }
    __syncthreads();
    if (stores) {
        float acc[P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            acc[p] = 0.0f;
#pragma unroll
            for (int j = 0; j < S; j++)
                acc[p] += s_part[tile * S + j][p][lane];
        }
        float v = acc[0];
        if (P == 2)
            v = v / (1.0f + __expf(-v)) * acc[P - 1];
        v = a.mode == GEMV_ACCUM ? yold + v : v;
        *yp = v;
        if (a.y_copy)
            a.y_copy[yp - a.seg[0].y] = v;
    }
    if (st)
        st[3] = globaltimer_ns();
}

template <int P, int S>
static cudaError_t gemv_mma_go(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    cudaError_t e = gs_raise_smem_limit(gemv_mma_kernel<P, S>, sh);
    if (e != cudaSuccess)
        return e;
    return launch_k(a->pdl, gemv_mma_kernel<P, S>, dim3(sh.blocks), dim3(32 * sh.W), sh.smem, s, *a, sh.wstride,
                    sh.launch_early);
}

template <int S>
static cudaError_t gemv_mma_p(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    return a->mode == GEMV_SWIGLU ? gemv_mma_go<2, S>(a, sh, s) : gemv_mma_go<1, S>(a, sh, s);
}

cudaError_t launch_gemv_mma(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    switch (sh.L / 4) {
    case 1: return gemv_mma_p<1>(a, sh, s);
    case 2: return gemv_mma_p<2>(a, sh, s);
    case 4: return gemv_mma_p<4>(a, sh, s);
    case 8: return gemv_mma_p<8>(a, sh, s);
    default: return cudaErrorInvalidValue;
    }
}
