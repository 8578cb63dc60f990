/*
 * gemv_batch.cuh — what the two GEMVs of a few tokens at once share (gemv_batch.cu for 16-bit
 * rows, gemvq_batch.cu for quantised ones): the rows a launch covers, and the end of a block
 * whose warps each hold partial sums of the same rows: the warps' sums added in warp order (the
 * same bits every run), the fused norm's 1 / rms and SwiGLU applied, one thread per (row, token)
 * storing or adding the result.
 */
#ifndef QWENRT_BACKEND_CUDA_GEMV_BATCH_CUH
#define QWENRT_BACKEND_CUDA_GEMV_BATCH_CUH

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

/* The rows of a launch: its segments' together, or the SwiGLU pairs. */
static inline int64_t gemv_launch_rows(const struct gemv_args *a)
{
    if (a->mode == GEMV_SWIGLU)
        return a->seg[0].N;
    int64_t rows = 0;
    for (int i = 0; i < a->n_seg; i++)
        rows += a->seg[i].N;
    return rows;
}

/* The end of a block of WARPS warps owning RPB rows (P = 2: gate and up pairs) for TM tokens:
 * acc holds each warp's lane partial sums, ss (NORM) its lanes' sums of x's squares over the part
 * of K it read; s_part is the block's shared [WARPS][RPB * P + 1][TM]. Ends with a block barrier,
 * so every thread of the block must call it. */
template <int WARPS, int TM, int RPB, int P, bool NORM>
static __device__ __forceinline__ void gemv_batch_finish(const struct gemv_args &a, float (*s_part)[RPB * P + 1][TM],
                                                         const float (&acc)[RPB][P][TM], const float (&ss)[TM],
                                                         const bool (&ok)[RPB], float *const (&yp)[RPB],
                                                         const int32_t (&ldy)[RPB])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, T = a.T;
#pragma unroll
    for (int t = 0; t < TM; t++) {
        if (t >= T)
            break;
#pragma unroll
        for (int r = 0; r < RPB; r++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                float v = warp_sum(acc[r][p][t]);
                if (lane == 0)
                    s_part[warp][r * P + p][t] = v;
            }
        if (NORM) {
            float v = warp_sum(ss[t]);
            if (lane == 0)
                s_part[warp][RPB * P][t] = v;
        }
    }
    __syncthreads();
    const int r = threadIdx.x / TM, t = threadIdx.x % TM;
    if (r >= RPB || t >= T)
        return;
    float sum[P + 1];
#pragma unroll
    for (int p = 0; p <= P; p++) {
        sum[p] = 0.0f;
        if (p == P && !NORM)
            break;
        int i = p < P ? r * P + p : RPB * P;
#pragma unroll
        for (int w2 = 0; w2 < WARPS; w2++)
            sum[p] += s_part[w2][i][t];
    }
    float inv = NORM ? rsqrtf(sum[P] / (float)a.K + a.eps) : 1.0f;
    float v = sum[0] * inv;
    if (P == 2) {
        float up = sum[P - 1] * inv;
        v = v / (1.0f + __expf(-v)) * up;
    }
#pragma unroll
    for (int rr = 0; rr < RPB; rr++) /* rr == r, without indexing the arrays by a run-time r */
        if (rr == r && ok[rr]) {
            float *y = yp[rr] + (int64_t)t * ldy[rr];
            *y = a.mode == GEMV_ACCUM ? *y + v : v;
        }
}

#endif
