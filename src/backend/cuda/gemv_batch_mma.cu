/*
 * gemv_batch_mma.cu — the GEMV of a few tokens at once (2 <= T <= 8) for BF16 rows with the
 * dot products on the tensor cores (cuda_options.gemv_batch_mma): gemv_batch.cu's job, the same
 * fusions, other arithmetic.
 *
 * Why: gemv_batch spends T FMAs, a conversion and T / RPB loads of x from L1 per weight on the
 * CUDA cores; at T = 8 that is ~10 instructions a weight, and the server's batched step at 8
 * sessions took ~2 ms where its weights take ~0.3 ms to read (docs/perf-log.md, session 35).
 * mma.sync m16n8k16 does 16 rows x 16 weights x 8 columns in one instruction.
 *
 * How: W's rows are A (16 rows a tile), x the columns of B: column n of tile τ is term τ of token
 * n (n < 8), where x = hi + mid + lo with hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi -
 * mid) — their sum is x to ~2^-24, and a product of two bf16 is exact in f32, so the result
 * keeps f32 accuracy (gemv_mma.cu's three terms). Three products into one accumulator, so D(row,
 * n) is row · x_n. No shared memory and no ldmatrix: the k index inside a product is only a
 * label, so lane (g = lane / 4, c = lane % 4) takes the 16 bytes at elements 8c .. 8c + 7 of
 * each 32-element block of rows g and g + 8 and of token g's x, and the two k steps of the block
 * use words 0-1 and 2-3 of them: A's and B's fragments then name the same element for every k
 * (see gbm_block). A lane loads its rows with ld.global.nc past L1 (x stays in L1 for every
 * block), x through L1, and makes x's terms itself: each element of x is split once per block.
 * A block owns RPB = 16 MT rows (MT tiles, or MT tiles of gate and of up rows for SwiGLU), its
 * WARPS warps split the 32-element blocks of K (warp w takes w, w + WARPS, ...: together they
 * read 64 WARPS contiguous bytes of each row), U blocks' loads in flight per lane; the first
 * round of weights is requested before griddep_wait. Each warp's D and its lanes' sums of x's
 * squares (a fused norm) go to shared memory; the block's threads add them in warp order, apply
 * 1 / rms and SwiGLU as gemv_batch does, and store or add (GEMV_ACCUM) one (row, token) each.
 * The order of the sums and the tensor cores' accumulation differ from gemv_batch's: results
 * agree to rounding (test_gemv_batch_kernel holds both to a double sum on the host).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_batch.cuh"
#include "backend/cuda/gemv_smem.cuh"

#include <cuda_bf16.h>
#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

/* Two floats as bf16 (round to nearest), lower element in the low half; and back. */
static __device__ __forceinline__ uint32_t gbm_pack(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}
static __device__ __forceinline__ float2 gbm_unpack(uint32_t w)
{
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

/* x's three bf16 terms for 8 elements (words: elements 0-1, 2-3, 4-5, 6-7). */
struct gbm_terms {
    uint32_t hi[4], mid[4], lo[4];
};
static __device__ __forceinline__ void gbm_split(const float (&x)[8], gbm_terms &t)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        t.hi[i] = gbm_pack(a, b);
        float2 h = gbm_unpack(t.hi[i]);
        a -= h.x, b -= h.y;
        t.mid[i] = gbm_pack(a, b);
        float2 m = gbm_unpack(t.mid[i]);
        t.lo[i] = gbm_pack(a - m.x, b - m.y);
    }
}

/* One 32-element block of K for one tile of 16 rows: wg, wg8 the lane's 16 bytes of rows g and
 * g + 8, t token g's terms of the same 8 elements. k step s takes words 2s, 2s + 1 of each: A's
 * a0 / a2 (row g, logical k 2c..2c+1 / 2c+8..2c+9) and B's b0 / b1 (column g, the same logical
 * k) are then elements 8c + 4s + 0..1 / 8c + 4s + 2..3 on both sides. */
static __device__ __forceinline__ void gbm_block(float (&d)[4], const uint4 &wg, const uint4 &wg8, const gbm_terms &t)
{
    mma_bf16_16816(d, wg.x, wg8.x, wg.y, wg8.y, t.hi[0], t.hi[1]);
    mma_bf16_16816(d, wg.x, wg8.x, wg.y, wg8.y, t.mid[0], t.mid[1]);
    mma_bf16_16816(d, wg.x, wg8.x, wg.y, wg8.y, t.lo[0], t.lo[1]);
    mma_bf16_16816(d, wg.z, wg8.z, wg.w, wg8.w, t.hi[2], t.hi[3]);
    mma_bf16_16816(d, wg.z, wg8.z, wg.w, wg8.w, t.mid[2], t.mid[3]);
    mma_bf16_16816(d, wg.z, wg8.z, wg.w, wg8.w, t.lo[2], t.lo[3]);
}

/* WARPS warps per block, MT tiles of 16 rows, P = 2: SwiGLU's gate and up rows, NORM: x RMS-
 * normalised with norm_w first (x times norm_w in the products, 1 / rms on the sums), U blocks
 * of K per lane in flight, NG groups of 8 tokens (lane g: tokens g and, NG = 2, g + 8). */
template <int WARPS, int MT, int P, bool NORM, int U, int NG>
__global__ void __launch_bounds__(32 * WARPS) gemv_batch_mma_kernel(const __grid_constant__ struct gemv_args a)
{
    constexpr int RPB = 16 * MT, TM = 8 * NG;
    __shared__ float s_part[WARPS][RPB * P + 1][TM]; /* each warp's sums; [RPB * P]: x's squares */
    griddep_launch();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3, T = a.T;
    const int64_t row0 = (int64_t)blockIdx.x * RPB;
    const uint4 *rp[MT][2][P]; /* rows g and g + 8 of each tile */
    float *yp;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 *src[P];
            gemv_seg_row<P>(a, row0 + 16 * m + 8 * h + g, src, yp); /* past the end: row 0, unused */
#pragma unroll
            for (int p = 0; p < P; p++)
                rp[m][h][p] = src[p] + c;
        }
    const int KB = a.K / 32; /* 32-element blocks of K: 4 uint4 chunks of a row each */
    bool has_x[NG];
    const float *xr[NG];
    float d[MT][P][NG][4], ss[NG];
#pragma unroll
    for (int j = 0; j < NG; j++) {
        has_x[j] = g + 8 * j < T;
        xr[j] = a.x + (int64_t)(has_x[j] ? g + 8 * j : 0) * a.ldx + 8 * c;
        ss[j] = 0.0f;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    d[m][p][j][i] = 0.0f;
    }
    /* a round of U blocks in w while the next round's loads are in flight in wn */
    uint4 w[U][MT][2][P], wn[U][MT][2][P];
    auto load = [&](uint4(&dst)[U][MT][2][P], int kb0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = kb0 + WARPS * u;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int p = 0; p < P; p++)
                        dst[u][m][h][p] = kb < KB ? gemv_ld_w128(rp[m][h][p] + 4 * kb) : make_uint4(0, 0, 0, 0);
        }
    };
    load(w, warp); /* the weights do not depend on the launch before */
    griddep_wait();
    for (int kb0 = warp; kb0 < KB; kb0 += WARPS * U) {
        const bool more = kb0 + WARPS * U < KB;
        if (more)
            load(wn, kb0 + WARPS * U);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = kb0 + WARPS * u;
            if (kb >= KB)
                break;
            float gw[8];
            if (NORM) {
                float4 g0 = __ldg((const float4 *)(a.norm_w + 32 * kb + 8 * c));
                float4 g1 = __ldg((const float4 *)(a.norm_w + 32 * kb + 8 * c + 4));
                gw[0] = g0.x, gw[1] = g0.y, gw[2] = g0.z, gw[3] = g0.w, gw[4] = g1.x, gw[5] = g1.y, gw[6] = g1.z;
                gw[7] = g1.w;
            }
#pragma unroll
            for (int j = 0; j < NG; j++) {
                float x[8];
                if (has_x[j]) {
                    float4 x0 = __ldg((const float4 *)(xr[j] + 32 * kb));
                    float4 x1 = __ldg((const float4 *)(xr[j] + 32 * kb + 4));
                    x[0] = x0.x, x[1] = x0.y, x[2] = x0.z, x[3] = x0.w;
                    x[4] = x1.x, x[5] = x1.y, x[6] = x1.z, x[7] = x1.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        x[e] = 0.0f;
                }
                if (NORM)
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        ss[j] = fmaf(x[e], x[e], ss[j]);
                        x[e] *= gw[e];
                    }
                gbm_terms t;
                gbm_split(x, t);
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int p = 0; p < P; p++)
                        gbm_block(d[m][p][j], w[u][m][0][p], w[u][m][1][p], t);
            }
        }
        if (more)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int p = 0; p < P; p++)
                            w[u][m][h][p] = wn[u][m][h][p];
    }
    /* D(row, n): lane (g, c) holds rows g, g + 8 of each tile, tokens 8j + 2c, 8j + 2c + 1 */
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int r = 16 * m + g, n = 8 * j + 2 * c;
                s_part[warp][r * P + p][n] = d[m][p][j][0];
                s_part[warp][r * P + p][n + 1] = d[m][p][j][1];
                s_part[warp][(r + 8) * P + p][n] = d[m][p][j][2];
                s_part[warp][(r + 8) * P + p][n + 1] = d[m][p][j][3];
            }
    if (NORM) /* token g + 8j's squares over this warp's blocks: lanes 4g .. 4g + 3 */
#pragma unroll
        for (int j = 0; j < NG; j++) {
            float v = ss[j];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (c == 0)
                s_part[warp][RPB * P][8 * j + g] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < RPB * TM; i += 32 * WARPS) {
        const int r = i / TM, tk = i % TM;
        if (tk >= T)
            continue;
        const float v = gemv_batch_value<WARPS, TM, RPB, P, NORM>(a, s_part, r, tk);
        int sg;
        int64_t rr;
        if (!gemv_seg_of<P>(a, row0 + r, sg, rr))
            continue;
        float *y = a.seg[sg].y + rr + (int64_t)tk * a.seg[sg].ldy;
        *y = a.mode == GEMV_ACCUM ? *y + v : v;
    }
}

bool gemv_batch_mma_applies(const struct gemv_args *a)
{
    return a->dtype == QR_BF16 && gemv_batch_shape_ok(a, GEMV_BATCH_MMA_MAX_T, 32);
}

/* Tiles per block: 2 where the grid keeps at least 2 blocks per multiprocessor, else 1; warps
 * per block: 16 where the grid would have fewer blocks than multiprocessors (o, down: 64), 8
 * where fewer than 2 per multiprocessor, else 4 (more loads in flight for small launches). */
template <int P, bool NORM, int NG>
static cudaError_t gbm_launch(const struct gemv_args *a, cudaStream_t s)
{
    const int64_t rows = gemv_launch_rows(a);
    const int n_sm = a->n_sm > 0 ? a->n_sm : 132;
    const bool two = (rows + 31) / 32 >= 2 * n_sm, wide = !two && (rows + 15) / 16 < 2 * n_sm;
    const bool wider = wide && (rows + 15) / 16 < n_sm;
    constexpr int U = P == 1 ? 4 : 2;
    if (two) {
        dim3 grid((unsigned)((rows + 31) / 32));
        return launch_k(a->pdl, gemv_batch_mma_kernel<4, 2, P, NORM, U / 2 ? U / 2 : 1, NG>, grid, dim3(128), 0, s,
                        *a);
    }
    dim3 grid((unsigned)((rows + 15) / 16));
    if (wider)
        return launch_k(a->pdl, gemv_batch_mma_kernel<16, 1, P, NORM, U, NG>, grid, dim3(512), 0, s, *a);
    if (wide)
        return launch_k(a->pdl, gemv_batch_mma_kernel<8, 1, P, NORM, U, NG>, grid, dim3(256), 0, s, *a);
    return launch_k(a->pdl, gemv_batch_mma_kernel<4, 1, P, NORM, U, NG>, grid, dim3(128), 0, s, *a);
}

cudaError_t launch_gemv_batch_mma(const struct gemv_args *a, cudaStream_t s)
{
    if (!gemv_batch_mma_applies(a))
        return cudaErrorInvalidValue;
    if (a->T > 8)
        return a->mode == GEMV_SWIGLU ? a->norm_w ? gbm_launch<2, true, 2>(a, s) : gbm_launch<2, false, 2>(a, s)
               : a->norm_w            ? gbm_launch<1, true, 2>(a, s)
                                      : gbm_launch<1, false, 2>(a, s);
    if (a->mode == GEMV_SWIGLU)
        return a->norm_w ? gbm_launch<2, true, 1>(a, s) : gbm_launch<2, false, 1>(a, s);
    return a->norm_w ? gbm_launch<1, true, 1>(a, s) : gbm_launch<1, false, 1>(a, s);
}
