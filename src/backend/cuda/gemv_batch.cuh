/*
 * gemv_batch.cuh — what the GEMVs of a few tokens at once share (gemv_batch.cu and
 * gemv_batch_mma.cu for 16-bit rows, gemvq_batch.cu for quantised ones): the weights' loads past
 * L1, the launches they take, the rows a launch covers, and the end of a block whose warps each
 * hold partial sums of the same rows: the warps' sums added in warp order (the same bits every
 * run), the fused norm's 1 / rms and SwiGLU applied, one thread per (row, token) storing or
 * adding the result.
 */
#ifndef QWENRT_BACKEND_CUDA_GEMV_BATCH_CUH
#define QWENRT_BACKEND_CUDA_GEMV_BATCH_CUH

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

/* 16 bytes of weights, not kept in L1 (which holds x for every block of the launch). */
static __device__ __forceinline__ uint4 gemv_ld_w128(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* What the 16-bit multi-token GEMVs take besides their dtype: 2 to max_T tokens, K a multiple
 * of k_unit elements, x and norm_w 16-byte aligned, no mixed segments or extra copy, a mode they
 * know (SwiGLU: two segments of equal rows), rows 16-byte aligned. */
static inline bool gemv_batch_shape_ok(const struct gemv_args *a, int max_T, int k_unit)
{
    if (a->T < 2 || a->T > max_T || a->k_mixed || a->y_copy || a->n_seg < 1 || a->n_seg > GEMV_MAX_SEG ||
        a->K < k_unit || a->K % k_unit || a->ldx % 4 || (uintptr_t)a->x % 16 || (uintptr_t)a->norm_w % 16)
        return false;
    if (a->mode == GEMV_SWIGLU ? a->n_seg != 2 || a->seg[1].N != a->seg[0].N
                               : a->mode != GEMV_STORE && a->mode != GEMV_ACCUM)
        return false;
    for (int i = 0; i < a->n_seg; i++)
        if (a->seg[i].row_bytes % 16 || (uintptr_t)a->seg[i].w % 16 || a->seg[i].N < 1 || a->seg[i].ldy < a->seg[i].N)
            return false;
    return true;
}

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

/* Row r's result for token t from the warps' sums in s_part ([WARPS][RPB * P + 1][TM]: each
 * warp's sums of row r's P weight rows, and [RPB * P] its sums of x's squares with NORM): added
 * in warp order, times 1 / rms, SwiGLU'd for P = 2. */
template <int WARPS, int TM, int RPB, int P, bool NORM>
static __device__ __forceinline__ float gemv_batch_value(const struct gemv_args &a,
                                                         const float (*s_part)[RPB * P + 1][TM], int r, int t)
{
    float sum[P + 1];
#pragma unroll
    for (int p = 0; p <= P; p++) {
        sum[p] = 0.0f;
        if (p == P && !NORM)
            break;
        const int i = p < P ? r * P + p : RPB * P;
#pragma unroll
        for (int w2 = 0; w2 < WARPS; w2++)
            sum[p] += s_part[w2][i][t];
    }
    const float inv = NORM ? rsqrtf(sum[P] / (float)a.K + a.eps) : 1.0f;
    float v = sum[0] * inv;
    if (P == 2) {
        const float up = sum[P - 1] * inv;
        v = v / (1.0f + __expf(-v)) * up;
    }
    return v;
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
    const float v = gemv_batch_value<WARPS, TM, RPB, P, NORM>(a, s_part, r, t);
#pragma unroll
    for (int rr = 0; rr < RPB; rr++) /* rr == r, without indexing the arrays by a run-time r */
        if (rr == r && ok[rr]) {
            float *y = yp[rr] + (int64_t)t * ldy[rr];
            *y = a.mode == GEMV_ACCUM ? *y + v : v;
        }
}

#endif
