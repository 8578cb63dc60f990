/*
 * gemv_stage.cuh — the GEMV kernels' common start (gemv2 in matmul.cu, gemvq in
 * gemv_quant.cu): x staged in shared memory for the whole block, RMS-normalised when the
 * launch fuses the norm.
 *
 * Decode is latency-bound, and a GPU issues a warp's instructions in order: a rolled loop of
 * "load 16 bytes, store them" waits one L2 round trip per trip (six for K = 3072). Here every
 * load of a pass is issued before its first store (XB float4 per thread per batch; the
 * kernels pick XB so that one batch covers K), and the first norm weights are loaded before
 * griddep_wait, with the weights (docs/perf-log.md, session 11). The sums run in the same
 * order as the rolled loop did.
 */
#ifndef QWENRT_BACKEND_CUDA_GEMV_STAGE_CUH
#define QWENRT_BACKEND_CUDA_GEMV_STAGE_CUH

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define GEMV_NW 2 /* norm weights (float4) per thread loaded ahead: all of them for K <= 1024 at 128 threads */

/* The thread's first GEMV_NW float4 of the norm weights (zeros without a norm). */
__device__ __forceinline__ void gemv_load_norm_w(const struct gemv_args &a, float4 (&g0)[GEMV_NW])
{
    const float4 *nw = (const float4 *)a.norm_w;
#pragma unroll
    for (int j = 0; j < GEMV_NW; j++) {
        int i = threadIdx.x + j * blockDim.x;
        g0[j] = nw && i < a.K / 4 ? __ldg(nw + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* One thread-stride batch of x: v[j] = xt[i0 + j nt] below k4, zeros past it; every load
 * issued before the first use. */
template <int XB>
__device__ __forceinline__ void gemv_load_x(const float4 *xt, int i0, int nt, int k4, float4 (&v)[XB])
{
#pragma unroll
    for (int j = 0; j < XB; j++)
        v[j] = i0 + j * nt < k4 ? xt[i0 + j * nt] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ float gemv_sumsq4(float4 v)
{
    return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

/* v * (1 / rms) * norm weights w, element by element in that order (every staging of x
 * normalises alike). */
__device__ __forceinline__ float4 gemv_norm4(float4 v, float inv, float4 w)
{
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}

/* xs [T][K] = x, times 1/rms(x) * norm_w when a.norm_w; NWARPS warps (0: blockDim.x / 32, at
 * run time); s_part [warps][GEMV_MAX_T] shared. Ends with the block barrier that makes xs visible. */
template <int XB, int NWARPS>
__device__ __forceinline__ void gemv_stage_x(const struct gemv_args &a, float *xs, const float4 (&g0)[GEMV_NW],
                                             float (*s_part)[GEMV_MAX_T])
{
    const bool norm = a.norm_w != NULL;
    const int K = a.K, T = a.T, k4 = K / 4, nt = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *nw = (const float4 *)a.norm_w;
    float ss[GEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) {
        ss[t] = 0.0f;
        if (t >= T)
            break;
        const float4 *xt = (const float4 *)(a.x + (int64_t)t * a.ldx);
        float4 *xst = (float4 *)(xs + t * K);
        for (int i0 = threadIdx.x; i0 < k4; i0 += XB * nt) {
            float4 v[XB];
            gemv_load_x<XB>(xt, i0, nt, k4, v);
#pragma unroll
            for (int j = 0; j < XB; j++) {
                if (i0 + j * nt >= k4)
                    break;
                xst[i0 + j * nt] = v[j];
                ss[t] += gemv_sumsq4(v[j]);
            }
        }
    }
    if (norm) {
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t >= T)
                break;
            float v = warp_sum(ss[t]);
            if (lane == 0)
                s_part[warp][t] = v;
        }
    }
    __syncthreads();
    if (!norm)
        return;
    for (int t = 0; t < T; t++) {
        float tot = 0.0f;
        if (NWARPS > 0) {
#pragma unroll
            for (int q = 0; q < NWARPS; q++)
                tot += s_part[q][t];
        } else { /* the block's warps, counted at run time (the same order) */
            for (int q = 0; q < nt / 32; q++)
                tot += s_part[q][t];
        }
        float inv = rsqrtf(tot / (float)K + a.eps);
        float4 *xst = (float4 *)(xs + t * K);
        for (int i0 = threadIdx.x; i0 < k4; i0 += GEMV_NW * nt) {
            float4 g[GEMV_NW];
#pragma unroll
            for (int j = 0; j < GEMV_NW; j++)
                g[j] = i0 == (int)threadIdx.x ? g0[j]
                       : i0 + j * nt < k4 ? __ldg(nw + i0 + j * nt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < GEMV_NW; j++) {
                if (i0 + j * nt >= k4)
                    break;
                xst[i0 + j * nt] = gemv_norm4(xst[i0 + j * nt], inv, g[j]);
            }
        }
    }
    __syncthreads();
}

/* Σ_e w[e] * x[e] over one 16-byte chunk of 16-bit weights (8 of them; x0 holds x[0..3], x1
 * x[4..7]), summed in gemv2's order. */
template <int DT>
__device__ __forceinline__ float gemv_dot8x(uint4 raw, float4 x0, float4 x1)
{
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    float d = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        uint16_t lo = (uint16_t)(u[e] & 0xffff), hi = (uint16_t)(u[e] >> 16);
        d += (DT == QR_BF16 ? bf16_bits_to_f32(lo) : f16_bits_to_f32(lo)) * xv[2 * e];
        d += (DT == QR_BF16 ? bf16_bits_to_f32(hi) : f16_bits_to_f32(hi)) * xv[2 * e + 1];
    }
    return d;
}

/* The same with x[0..7] contiguous and 16-byte aligned in memory: the kernels that use it
 * give gemv2's results bit for bit. */
template <int DT>
__device__ __forceinline__ float gemv_dot8(uint4 raw, const float *x)
{
    return gemv_dot8x<DT>(raw, *(const float4 *)x, *(const float4 *)(x + 4));
}

#endif
