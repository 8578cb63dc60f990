/*
 * matmul.cu — the matrix products of the CUDA backend: y = x · Wᵀ, W [N][K] in its stored
 * dtype (F32, F16, BF16, Q8_0, Q4_K, Q6_K), f32 accumulation.
 *
 * GEMV (T <= GEMV_MAX_T tokens, the decode path): one warp per output row, 8 rows per block.
 * Float weights are read as 16-byte chunks per lane (a warp reads 512 contiguous bytes per
 * step, coalesced); quantised weights in 32-element units (lane u of the warp dequantises
 * unit u: a Q8_0 block, a Q4_K or Q6_K sub-block) into registers. Each weight is read once
 * for all T tokens. Options fused into the launch: RMSNorm of x (every block recomputes the
 * 1/rms of its tokens from x, which sits in L2; the norm weight multiplies x on the fly),
 * several matrices sharing x (q|k|v, gate|up), the SwiGLU epilogue, and y += (residual).
 * Bytes moved: N*row_bytes + T*K*4*(rows/8 blocks, from L2) + T*N*4; flops 2*T*N*K.
 *
 * GEMM (prefill): cuBLASLt. BF16 weights: x is split into three bf16 terms hi + mid + lo
 * (24 significant bits, f32's precision) and the three products are summed in f32 on the
 * tensor cores. x rounded to bf16 alone costs ~3e-3 relative error; two terms (tried first)
 * gave 1e-4 after 7 layers of the Qwen3.5 fixture, over the 1e-4 tolerance. Other dtypes: W is dequantised to an f32
 * scratch matrix and multiplied in plain f32 (CUBLAS_COMPUTE_32F, no TF32).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/gemv_stage.cuh"

#define GEMV_WARPS 8

/* 16 bytes of weights that are read once: keep them out of L1. Not volatile: the compiler
 * may hoist several of these ahead of their use (the loads have no side effects). */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Adds w[0..n) · x_t[0..n) (x_t scaled by the norm weight when NORM) to acc[t], t < T. */
template <int N, bool NORM>
__device__ __forceinline__ void dot_chunk(const float *w, const float *x, int32_t ldx,
                                          const float *nw, int32_t T, float *acc)
{
    float ww[N];
#pragma unroll
    for (int e = 0; e < N; e += 4) {
        ww[e] = w[e], ww[e + 1] = w[e + 1], ww[e + 2] = w[e + 2], ww[e + 3] = w[e + 3];
        if (NORM) {
            float4 g = *(const float4 *)(nw + e);
            ww[e] *= g.x, ww[e + 1] *= g.y, ww[e + 2] *= g.z, ww[e + 3] *= g.w;
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) {
        if (t >= T)
            break;
        const float *xt = x + (int64_t)t * ldx;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < N; e += 4) {
            float4 xv = *(const float4 *)(xt + e);
            s += ww[e] * xv.x + ww[e + 1] * xv.y + ww[e + 2] * xv.z + ww[e + 3] * xv.w;
        }
        acc[t] += s;
    }
}

/* Float weights, 16-byte chunks (K a multiple of the chunk, rows 16-byte aligned). */
template <int DT, bool NORM>
__device__ __forceinline__ void row_dot_float(const uint8_t *row, const struct gemv_args &a,
                                              float *acc, int lane)
{
    constexpr int VE = DT == QR_F32 ? 4 : 8;
    int nchunk = a.K / VE;
    const uint4 *wr = (const uint4 *)row;
#pragma unroll 4
    for (int c = lane; c < nchunk; c += 32) {
        uint4 raw = ld_stream(wr + c);
        float w[VE];
        if (DT == QR_F32) {
            w[0] = __uint_as_float(raw.x), w[1] = __uint_as_float(raw.y);
            w[2] = __uint_as_float(raw.z), w[3] = __uint_as_float(raw.w);
        } else {
            uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint16_t lo = (uint16_t)(u[e] & 0xffff), hi = (uint16_t)(u[e] >> 16);
                if (DT == QR_BF16) {
                    w[VE - 8 + 2 * e] = bf16_bits_to_f32(lo);
                    w[VE - 8 + 2 * e + 1] = bf16_bits_to_f32(hi);
                } else {
                    w[VE - 8 + 2 * e] = f16_bits_to_f32(lo);
                    w[VE - 8 + 2 * e + 1] = f16_bits_to_f32(hi);
                }
            }
        }
        dot_chunk<VE, NORM>(w, a.x + (int64_t)c * VE, a.ldx, a.norm_w + (NORM ? c * VE : 0), a.T,
                            acc);
    }
}

/* Any dtype, element by element: rows that are not 16-byte aligned, K not a chunk multiple. */
template <bool NORM>
__device__ void row_dot_scalar(const uint8_t *row, int32_t dtype, const struct gemv_args &a,
                               float *acc, int lane)
{
    for (int k = lane; k < a.K; k += 32) {
        float w = deq_elem(row, dtype, k) * (NORM ? a.norm_w[k] : 1.0f);
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++)
            if (t < a.T)
                acc[t] += w * a.x[(int64_t)t * a.ldx + k];
    }
}

/* Dequantises 32-element unit u of a quantised row into w. */
template <int DT>
__device__ __forceinline__ void deq_unit(const uint8_t *row, int u, float *w)
{
    if (DT == QR_Q8_0) {
        const uint8_t *b = row + (int64_t)u * 34;
        const uint16_t *h = (const uint16_t *)b;
        float d = f16_bits_to_f32(h[0]);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            uint16_t p = h[1 + i];
            w[2 * i] = d * (float)(int8_t)(p & 0xff);
            w[2 * i + 1] = d * (float)(int8_t)(p >> 8);
        }
    } else if (DT == QR_Q4_K) {
        const uint8_t *b = row + (int64_t)(u / 8) * 144;
        int sub = u % 8, c = sub / 2, hi = sub % 2;
        const uint16_t *h = (const uint16_t *)b;
        float d = f16_bits_to_f32(h[0]), dmin = f16_bits_to_f32(h[1]);
        int sc, m;
        q4k_scale_min(b + 4, sub, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint4 *q = (const uint4 *)(b + 16 + 32 * c);
        uint4 q0 = ld_stream(q), q1 = ld_stream(q + 1);
        uint32_t qq[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                w[4 * i + e] = ds * (float)((qq[i] >> (8 * e + 4 * hi)) & 0xF) - dm;
    } else { /* QR_Q6_K */
        const uint8_t *b = row + (int64_t)(u / 8) * 210;
        int q8 = u % 8, h = q8 / 4, quarter = q8 % 4;
        const uint8_t *ql = b + 64 * h + (quarter & 1) * 32, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * quarter;
        float d = f16_bits_to_f32((uint16_t)(b[208] | (b[209] << 8)));
        float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
        int shl = (quarter >> 1) * 4, shh = 2 * quarter;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (((ql[l] >> shl) & 0xF) | (((qh[l] >> shh) & 3) << 4)) - 32;
            w[l] = (l < 16 ? d0 : d1) * (float)q;
        }
    }
}

template <int DT, bool NORM>
__device__ __forceinline__ void row_dot_quant(const uint8_t *row, const struct gemv_args &a,
                                              float *acc, int lane)
{
    int nunit = a.K / 32;
    for (int u = lane; u < nunit; u += 32) {
        float w[32];
        deq_unit<DT>(row, u, w);
        dot_chunk<32, NORM>(w, a.x + (int64_t)u * 32, a.ldx, a.norm_w + (NORM ? u * 32 : 0), a.T,
                            acc);
    }
}

template <int DT, bool NORM>
__device__ __forceinline__ void row_dot(const uint8_t *row, int64_t row_bytes,
                                        const struct gemv_args &a, float *acc, int lane)
{
    if (DT == QR_F32 || DT == QR_F16 || DT == QR_BF16) {
        constexpr int VE = DT == QR_F32 ? 4 : 8;
        if (row_bytes % 16 == 0 && a.K % VE == 0 && a.ldx % 4 == 0)
            row_dot_float<DT, NORM>(row, a, acc, lane);
        else
            row_dot_scalar<NORM>(row, DT, a, acc, lane);
    } else {
        if (a.ldx % 4 == 0)
            row_dot_quant<DT, NORM>(row, a, acc, lane);
        else
            row_dot_scalar<NORM>(row, DT, a, acc, lane);
    }
}

template <int DT, int MODE, bool NORM>
__global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(const __grid_constant__ struct gemv_args a)
{
    __shared__ float s_inv[GEMV_MAX_T];
    griddep_launch();
    griddep_wait();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (NORM) { /* 1/rms of each token: the whole block shares each sum (one pass over x) */
        __shared__ float s_red[GEMV_WARPS];
        for (int t = 0; t < a.T; t++) {
            const float *xt = a.x + (int64_t)t * a.ldx;
            float ss = 0.0f;
            for (int k = threadIdx.x; k < a.K; k += 32 * GEMV_WARPS)
                ss += xt[k] * xt[k];
            ss = warp_sum(ss);
            if (lane == 0)
                s_red[warp] = ss;
            __syncthreads();
            if (threadIdx.x == 0) {
                float tot = 0.0f;
#pragma unroll
                for (int w = 0; w < GEMV_WARPS; w++)
                    tot += s_red[w];
                s_inv[t] = rsqrtf(tot / (float)a.K + a.eps);
            }
            __syncthreads();
        }
    }
    int r = blockIdx.x * GEMV_WARPS + warp, s = 0;
    if (MODE == GEMV_SWIGLU) {
        if (r >= a.seg[0].N)
            return;
    } else {
        while (s < a.n_seg && r >= a.seg[s].N)
            r -= a.seg[s++].N;
        if (s >= a.n_seg)
            return;
    }
    const struct gemv_seg &g = a.seg[s];
    float acc[GEMV_MAX_T], acc2[GEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++)
        acc[t] = acc2[t] = 0.0f;
    row_dot<DT, NORM>((const uint8_t *)g.w + (int64_t)r * g.row_bytes, g.row_bytes, a, acc, lane);
    if (MODE == GEMV_SWIGLU)
        row_dot<DT, NORM>((const uint8_t *)a.seg[1].w + (int64_t)r * a.seg[1].row_bytes,
                          a.seg[1].row_bytes, a, acc2, lane);
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) {
        if (t >= a.T)
            break;
        float v = warp_sum(acc[t]) * (NORM ? s_inv[t] : 1.0f);
        if (MODE == GEMV_SWIGLU) {
            float u = warp_sum(acc2[t]) * (NORM ? s_inv[t] : 1.0f);
            v = v / (1.0f + __expf(-v)) * u;
        }
        if (lane == 0) {
            float *y = g.y + (int64_t)t * g.ldy + r;
            *y = MODE == GEMV_ACCUM ? *y + v : v;
        }
    }
}

bool gemv_supports(int32_t dtype)
{
    return cuda_weight_dtype_supported(dtype);
}

template <int DT>
static cudaError_t gemv_dt(const struct gemv_args *a, int blocks, cudaStream_t s)
{
    dim3 g(blocks), th(32 * GEMV_WARPS);
    bool norm = a->norm_w != NULL, p = a->pdl;
    switch (a->mode * 2 + (norm ? 1 : 0)) {
    case 0: return launch_k(p, gemv_kernel<DT, GEMV_STORE, false>, g, th, 0, s, *a);
    case 1: return launch_k(p, gemv_kernel<DT, GEMV_STORE, true>, g, th, 0, s, *a);
    case 2: return launch_k(p, gemv_kernel<DT, GEMV_ACCUM, false>, g, th, 0, s, *a);
    case 3: return launch_k(p, gemv_kernel<DT, GEMV_ACCUM, true>, g, th, 0, s, *a);
    case 4: return launch_k(p, gemv_kernel<DT, GEMV_SWIGLU, false>, g, th, 0, s, *a);
    default: return launch_k(p, gemv_kernel<DT, GEMV_SWIGLU, true>, g, th, 0, s, *a);
    }
}

/* ---- gemv2: float weights, every load of the warp issued before the first use ----
 * Decode is latency-bound: a warp that streams a row 4 chunks at a time waits one HBM round
 * trip per 2 KB. Here each warp owns R rows (P = 2 physical rows per row for the SwiGLU pair)
 * and issues all R*P*CM 16-byte loads per lane (<= G2_LOADS, 64 registers) up front, before
 * griddep_wait(): with PDL the weights stream while the previous kernel finishes. Then the
 * block stages x (normalised and scaled by the norm weight when fused: RMSNorm of the plan's
 * order, x * 1/rms * w) in shared memory, each warp forms its dot products from registers
 * and shared memory and reduces them once at the end. Without PDL R is lowered until the
 * grid has at least two blocks per multiprocessor; with PDL it stays as large as the 64
 * registers allow (fewer blocks, so the next kernel's fit beside them). Needs 16-byte aligned rows, K a multiple of the
 * 16-byte chunk, ldx % 4 == 0, and T*K floats of shared memory <= 48 KB. */

#define G2_WARPS 4
#define G2_LOADS 16

template <int DT, int P, int R, int CM>
__global__ void __launch_bounds__(32 * G2_WARPS) gemv2_kernel(const __grid_constant__ struct gemv_args a)
{
    extern __shared__ float4 g2_xs4[];
    __shared__ float s_part[G2_WARPS][GEMV_MAX_T];
    griddep_launch();
    constexpr int VE = DT == QR_F32 ? 4 : 8;
    float *xs = (float *)g2_xs4;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nchunk = a.K / VE, T = a.T, K = a.K;
    int64_t lr0 = ((int64_t)blockIdx.x * G2_WARPS + warp) * R;
    const uint4 *rp[R * P];
    bool ok[R * P];
    float *yp[R];
    int32_t ldy[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        int64_t lr = lr0 + i;
        if (P == 2) {
            bool v = lr < a.seg[0].N;
            ok[2 * i] = ok[2 * i + 1] = v;
            rp[2 * i] = (const uint4 *)((const uint8_t *)a.seg[0].w + (v ? lr : 0) * a.seg[0].row_bytes);
            rp[2 * i + 1] = (const uint4 *)((const uint8_t *)a.seg[1].w + (v ? lr : 0) * a.seg[1].row_bytes);
            yp[i] = a.seg[0].y + (v ? lr : 0);
            ldy[i] = a.seg[0].ldy;
        } else {
            int sg = 0;
            int64_t r = lr;
            while (sg < a.n_seg - 1 && r >= a.seg[sg].N)
                r -= a.seg[sg++].N;
            bool v = r < a.seg[sg].N;
            ok[i] = v;
            rp[i] = (const uint4 *)((const uint8_t *)a.seg[sg].w + (v ? r : 0) * a.seg[sg].row_bytes);
            yp[i] = a.seg[sg].y + (v ? r : 0);
            ldy[i] = a.seg[sg].ldy;
        }
    }
    uint4 w[R * P][CM];
#pragma unroll
    for (int p = 0; p < R * P; p++)
#pragma unroll
        for (int c = 0; c < CM; c++) {
            int ch = lane + 32 * c;
            w[p][c] = ok[p] && ch < nchunk ? ld_stream(rp[p] + ch) : make_uint4(0, 0, 0, 0);
        }
    float4 g0[GEMV_NW];
    gemv_load_norm_w(a, g0); /* constant: with the weights, before the wait */
    griddep_wait();
    /* the old values of the rows this warp adds to (GEMV_ACCUM, one token): read now, in the
     * shadow of x's loads, not after the dot products */
    float yold[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        yold[i] = a.mode == GEMV_ACCUM && T == 1 && lane == 0 && ok[P * i] ? *yp[i] : 0.0f;
    constexpr int XB = CM / 2 > 1 ? CM / 2 : 1; /* one batch covers K */
    gemv_stage_x<XB, G2_WARPS>(a, xs, g0, s_part);
    float acc[R * P][GEMV_MAX_T];
#pragma unroll
    for (int p = 0; p < R * P; p++)
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++)
            acc[p][t] = 0.0f;
#pragma unroll
    for (int c = 0; c < CM; c++) {
        int ch = lane + 32 * c;
        if (ch >= nchunk)
            break;
        float wf[R * P][VE];
#pragma unroll
        for (int p = 0; p < R * P; p++) {
            uint4 raw = w[p][c];
            if (DT == QR_F32) {
                wf[p][0] = __uint_as_float(raw.x), wf[p][1] = __uint_as_float(raw.y);
                wf[p][2 % VE] = __uint_as_float(raw.z), wf[p][3 % VE] = __uint_as_float(raw.w);
            } else {
                uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    uint16_t lo = (uint16_t)(u[e] & 0xffff), hi = (uint16_t)(u[e] >> 16);
                    wf[p][(2 * e) % VE] = DT == QR_BF16 ? bf16_bits_to_f32(lo) : f16_bits_to_f32(lo);
                    wf[p][(2 * e + 1) % VE] = DT == QR_BF16 ? bf16_bits_to_f32(hi) : f16_bits_to_f32(hi);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t >= T)
                break;
            const float *xp = xs + t * K + ch * VE;
            float xv[VE];
#pragma unroll
            for (int e = 0; e < VE; e += 4) {
                float4 v = *(const float4 *)(xp + e);
                xv[e] = v.x, xv[e + 1] = v.y, xv[e + 2] = v.z, xv[e + 3] = v.w;
            }
#pragma unroll
            for (int p = 0; p < R * P; p++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < VE; e++)
                    d += wf[p][e] * xv[e];
                acc[p][t] += d;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t >= T)
                break;
            float v = warp_sum(acc[P * i][t]);
            if (P == 2) {
                float u = warp_sum(acc[P * i + 1][t]);
                v = v / (1.0f + __expf(-v)) * u;
            }
            if (lane == 0 && ok[P * i]) {
                float *y = yp[i] + (int64_t)t * ldy[i];
                *y = a.mode != GEMV_ACCUM ? v : T == 1 ? yold[i] + v : *y + v;
            }
        }
    }
}

/* Chunks per lane, rows per warp and the grid for gemv2; false when it does not apply. */
static bool gemv2_shape(const struct gemv_args *a, int *cm, int *r, int *blocks)
{
    if (!a->v2 || (a->dtype != QR_F32 && a->dtype != QR_F16 && a->dtype != QR_BF16))
        return false;
    int ve = a->dtype == QR_F32 ? 4 : 8;
    /* dynamic + static shared memory must stay under the 48 KB default */
    if (a->K % ve || a->ldx % 4 || (int64_t)a->T * a->K * 4 > 47 * 1024 ||
        (uintptr_t)a->x % 16 || (uintptr_t)a->norm_w % 16)
        return false;
    int nseg = a->mode == GEMV_SWIGLU ? 2 : a->n_seg;
    for (int i = 0; i < nseg; i++)
        if (a->seg[i].row_bytes % 16 || ((uintptr_t)a->seg[i].w) % 16)
            return false;
    if (a->mode == GEMV_SWIGLU && a->seg[1].N != a->seg[0].N)
        return false;
    int c = (a->K / ve + 31) / 32, P = a->mode == GEMV_SWIGLU ? 2 : 1;
    int m = c <= 4 ? 4 : c <= 8 ? 8 : c <= 16 ? 16 : 0;
    if (!m || m * P > G2_LOADS)
        return false;
    int64_t rows = 0;
    if (a->mode == GEMV_SWIGLU)
        rows = a->seg[0].N;
    else
        for (int i = 0; i < a->n_seg; i++)
            rows += a->seg[i].N;
    int rr = G2_LOADS / (m * P);
    rr = rr >= 4 ? 4 : rr >= 2 ? 2 : 1;
    int n_sm = a->n_sm > 0 ? a->n_sm : 132;
    /* Without PDL: more, smaller blocks (at least two per multiprocessor) hide the latency.
     * With PDL: as few blocks as the registers allow, so that the next kernel's blocks fit
     * beside this one's and issue their weight loads while it runs. */
    while (!a->pdl && rr > 1 && (rows + (int64_t)G2_WARPS * rr - 1) / ((int64_t)G2_WARPS * rr) < 2 * n_sm)
        rr /= 2;
    *cm = m, *r = rr;
    *blocks = (int)((rows + (int64_t)G2_WARPS * rr - 1) / ((int64_t)G2_WARPS * rr));
    return true;
}

bool gemv2_applies(const struct gemv_args *a)
{
    int cm, r, b;
    return gemv2_shape(a, &cm, &r, &b);
}

template <int DT>
static cudaError_t gemv2_dt(const struct gemv_args *a, int cm, int r, int blocks, cudaStream_t s)
{
    dim3 g(blocks), th(32 * G2_WARPS);
    size_t sm = (size_t)a->T * a->K * 4;
    bool p = a->pdl;
    if (a->mode == GEMV_SWIGLU) {
        if (cm == 4 && r >= 2) return launch_k(p, gemv2_kernel<DT, 2, 2, 4>, g, th, sm, s, *a);
        if (cm == 4) return launch_k(p, gemv2_kernel<DT, 2, 1, 4>, g, th, sm, s, *a);
        return launch_k(p, gemv2_kernel<DT, 2, 1, 8>, g, th, sm, s, *a);
    }
    switch (cm * 10 + r) {
    case 44: return launch_k(p, gemv2_kernel<DT, 1, 4, 4>, g, th, sm, s, *a);
    case 42: return launch_k(p, gemv2_kernel<DT, 1, 2, 4>, g, th, sm, s, *a);
    case 41: return launch_k(p, gemv2_kernel<DT, 1, 1, 4>, g, th, sm, s, *a);
    case 82: return launch_k(p, gemv2_kernel<DT, 1, 2, 8>, g, th, sm, s, *a);
    case 81: return launch_k(p, gemv2_kernel<DT, 1, 1, 8>, g, th, sm, s, *a);
    default: return launch_k(p, gemv2_kernel<DT, 1, 1, 16>, g, th, sm, s, *a);
    }
}

cudaError_t launch_gemv(const struct gemv_args *a, cudaStream_t s)
{
    if (a->T < 1 || a->T > GEMV_BATCH_MMA_MAX_T || a->n_seg < 1 || a->n_seg > GEMV_MAX_SEG)
        return cudaErrorInvalidValue;
    if (a->batch && a->batch_mma && a->q_int8 && gemvq_batch_mma_applies(a))
        return launch_gemvq_batch_mma(a, s); /* quantised rows, x in 8 bits as at T = 1 */
    if (a->T > GEMV_MAX_T) /* only the tensor cores' multi-token forms take more tokens */
        return a->batch && a->batch_mma && gemv_batch_mma_applies(a) ? launch_gemv_batch_mma(a, s)
                                                                     : cudaErrorInvalidValue;
    int64_t rows = 0;
    if (a->mode == GEMV_SWIGLU)
        rows = a->seg[0].N;
    else
        for (int i = 0; i < a->n_seg; i++)
            rows += a->seg[i].N;
    int blocks = (int)((rows + GEMV_WARPS - 1) / GEMV_WARPS);
    if (a->y_copy && (a->mode != GEMV_ACCUM || a->T != 1 || a->n_seg != 1 || gemvq_applies(a) ||
                      !gemv_smem_applies(a)))
        return cudaErrorInvalidValue; /* only gemv_smem / gemv_mma store the copy */
    if (gemvq_applies(a))
        return launch_gemvq(a, s);
    if (gemv_smem_applies(a))
        return launch_gemv_smem(a, s);
    if (a->batch && a->batch_mma && a->T >= GEMV_BATCH_MMA_MIN_T && gemv_batch_mma_applies(a))
        return launch_gemv_batch_mma(a, s);
    if (a->batch && gemv_batch_applies(a))
        return launch_gemv_batch(a, s);
    if (a->batch && gemvq_batch_applies(a))
        return launch_gemvq_batch(a, s);
    if (a->k_mixed)
        return cudaErrorInvalidValue; /* the other kernels read every segment as a->dtype */
    int cm, rr, b2;
    if (gemv2_shape(a, &cm, &rr, &b2)) {
        switch (a->dtype) {
        case QR_F32: return gemv2_dt<QR_F32>(a, cm, rr, b2, s);
        case QR_F16: return gemv2_dt<QR_F16>(a, cm, rr, b2, s);
        default: return gemv2_dt<QR_BF16>(a, cm, rr, b2, s);
        }
    }
    switch (a->dtype) {
    case QR_F32: return gemv_dt<QR_F32>(a, blocks, s);
    case QR_F16: return gemv_dt<QR_F16>(a, blocks, s);
    case QR_BF16: return gemv_dt<QR_BF16>(a, blocks, s);
    case QR_Q8_0: return gemv_dt<QR_Q8_0>(a, blocks, s);
    case QR_Q4_K: return gemv_dt<QR_Q4_K>(a, blocks, s);
    case QR_Q6_K: return gemv_dt<QR_Q6_K>(a, blocks, s);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- helpers for the GEMM path ---- */

__global__ void dequant_kernel(float *dst, const uint8_t *w, int32_t dtype, int64_t N, int64_t K,
                               int64_t row_bytes)
{
    int64_t n_el = N * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_el;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / K, k = i % K;
        dst[i] = deq_elem(w + r * row_bytes, dtype, k);
    }
}

cudaError_t launch_dequant(float *dst, const void *w, int32_t dtype, int64_t N, int64_t K,
                           int64_t row_bytes, cudaStream_t s)
{
    dequant_kernel<<<4096, 256, 0, s>>>(dst, (const uint8_t *)w, dtype, N, K, row_bytes);
    return cudaGetLastError();
}

/* Elements k0 .. k0+7 of a row stored as dtype (k0 % 8 == 0): each block's scales decoded
 * once for the eight (deq_elem decodes them per element). */
__device__ __forceinline__ void deq8(const uint8_t *row, int32_t dtype, int32_t k0, float (&f)[8])
{
    switch (dtype) {
    case QR_Q8_0: {
        const uint8_t *b = row + (k0 / 32) * 34;
        float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        const int8_t *q = (const int8_t *)(b + 2 + k0 % 32);
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = d * (float)q[e];
        return;
    }
    case QR_Q4_K: {
        const uint8_t *b = row + (k0 / 256) * 144;
        int j = k0 % 256, c = j / 64, hi = (j % 64) / 32, l = j % 32, sub = 2 * c + hi;
        float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        float dmin = f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8)));
        int sc, m;
        q4k_scale_min(b + 4, sub, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *qs = b + 16 + 32 * c + l;
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = ds * (float)((qs[e] >> (4 * hi)) & 0xF) - dm;
        return;
    }
    case QR_Q6_K: {
        const uint8_t *b = row + (k0 / 256) * 210;
        int j = k0 % 256, h = j / 128, jj = j % 128, quarter = jj / 32, l = jj % 32;
        const uint8_t *ql = b + 64 * h + (quarter & 1) * 32 + l, *qh = b + 128 + 32 * h + l;
        float d = f16_bits_to_f32((uint16_t)(b[208] | (b[209] << 8)));
        float ds = d * (float)((const int8_t *)(b + 192))[8 * h + l / 16 + 2 * quarter];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int lo = (ql[e] >> ((quarter >> 1) * 4)) & 0xF, hb = (qh[e] >> (2 * quarter)) & 3;
            f[e] = ds * (float)((lo | (hb << 4)) - 32);
        }
        return;
    }
    default:
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = deq_elem(row, dtype, k0 + e);
    }
}

/* W [N][K] (dtype, K % 8 == 0) -> TERMS bf16 terms, each [N][K]: hi = bf16(w) and, with two,
 * lo = bf16(w - hi) (16 significant bits: exact for F16, 2^-17 relative for the dequantised
 * Q8_0 / K-quant values). Eight elements per thread, one 16-byte store per term (a thread
 * per element with a 64-bit division each was ~1 ms of Qwen3 Q4_K_M's pp512). */
template <int TERMS>
__global__ void dequant_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const uint8_t *w,
                                    int32_t dtype, int64_t N, int32_t K, int64_t row_bytes)
{
    int32_t units = K / 8;
    int64_t n_units = N * units;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < n_units;
         u += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = u / units;
        int32_t k0 = (int32_t)(u - r * units) * 8;
        float f[8];
        deq8(w + r * row_bytes, dtype, k0, f);
        __align__(16) __nv_bfloat16 h[8], l[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            h[e] = __float2bfloat16_rn(f[e]);
            l[e] = __float2bfloat16_rn(f[e] - __bfloat162float(h[e]));
        }
        *(uint4 *)(hi + r * K + k0) = *(const uint4 *)h;
        if (TERMS == 2)
            *(uint4 *)(lo + r * K + k0) = *(const uint4 *)l;
    }
}

/* x [T][K] (ld ldx) -> bf16 [T][K], rounded to nearest. */
__global__ void round_bf16_kernel(__nv_bfloat16 *dst, const float *x, int32_t ldx, int32_t K, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(x[(i / K) * ldx + i % K]);
}

/* y (=|+=) the sum of the stacked split product's terms (c [terms][T][N]: hi, mid[, lo]),
 * smallest first: the same order of f32 additions as the products accumulated one by one
 * with beta = 1. */
__global__ void combine_terms_kernel(float *y, int32_t ldy, const float *c, int32_t N, int32_t T,
                                     int32_t terms, bool accumulate)
{
    int64_t n = (int64_t)N * T;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / N, col = i % N;
        float *yp = y + t * ldy + col;
        float v = accumulate ? *yp : 0.0f;
        for (int32_t k = terms - 1; k >= 0; k--)
            v += c[k * n + i];
        *yp = v;
    }
}

__global__ void split_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo,
                                  const float *x, int32_t ldx, int32_t K, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[(i / K) * ldx + i % K];
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        float r = v - __bfloat162float(h);
        __nv_bfloat16 m = __float2bfloat16_rn(r);
        hi[i] = h;
        mid[i] = m;
        if (lo) /* NULL: two terms */
            lo[i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

cudaError_t launch_split_bf16(__nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo,
                              const float *x, int32_t ldx, int32_t K, int32_t T, cudaStream_t s)
{
    split_bf16_kernel<<<2048, 256, 0, s>>>(hi, mid, lo, x, ldx, K, (int64_t)K * T);
    return cudaGetLastError();
}

/* ---- cuBLASLt ---- */

/* Creates the descriptors of a product and asks the heuristic for its algorithm. (Timing the
 * heuristic's first 8 candidates on the first call and keeping the fastest was tried: pp512
 * 112k -> 109k tok/s. Timed back to back, the weights sit in L2, so the winner is the
 * fastest on warm weights, not in the prefill; docs/perf-log.md.) */
static qwenrt_status lt_plan_make(struct gemm_ctx *g, struct lt_plan *pl, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cudaDataType_t ab = (cudaDataType_t)pl->ab;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    pl->op = NULL, pl->la = pl->lb = pl->lc = NULL;
    LT_CHECK(cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->la, ab, (uint64_t)pl->K, (uint64_t)pl->N, pl->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->lb, ab, (uint64_t)pl->K, (uint64_t)pl->T, pl->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->lc, CUDA_R_32F, (uint64_t)pl->N, (uint64_t)pl->T, pl->ldc));
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &g->ws_bytes, sizeof(g->ws_bytes)));
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, pl->op, pl->la, pl->lb, pl->lc, pl->lc, pref, 1,
                                            &heur, &found));
    if (!found) {
        st = err_set(err, QWENRT_ERR_BACKEND,
                     "cuBLASLt: no algorithm for a %lld x %lld x %lld product", (long long)pl->N,
                     (long long)pl->K, (long long)pl->T);
        goto out;
    }
    pl->algo = heur.algo;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static void lt_plan_free(struct lt_plan *pl)
{
    if (pl->lc) cublasLtMatrixLayoutDestroy(pl->lc);
    if (pl->lb) cublasLtMatrixLayoutDestroy(pl->lb);
    if (pl->la) cublasLtMatrixLayoutDestroy(pl->la);
    if (pl->op) cublasLtMatmulDescDestroy(pl->op);
    pl->op = NULL, pl->la = pl->lb = pl->lc = NULL;
}

/* C[N][T] (col-major, ldc) = beta*C + A^T B, A = W as [K][N] col-major (lda), B = x [K][T].
 * With g->use_cache the descriptors and algorithm of each shape are made once. */
static qwenrt_status lt_matmul(struct gemm_ctx *g, cudaDataType_t ab, const void *A, int64_t lda,
                               const void *B, int64_t ldb, float *C, int64_t ldc, int64_t N,
                               int64_t K, int64_t T, float beta, cudaStream_t s,
                               struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    float alpha = 1.0f;
    struct lt_plan tmp, *pl = NULL;
    memset(&tmp, 0, sizeof(tmp));
    tmp.ab = (int32_t)ab, tmp.lda = lda, tmp.ldb = ldb, tmp.ldc = ldc, tmp.N = N, tmp.K = K, tmp.T = T;
    if (g->use_cache)
        for (int32_t i = 0; i < g->n_cache && !pl; i++) {
            struct lt_plan *c = &g->cache[i];
            if (c->ab == tmp.ab && c->lda == lda && c->ldb == ldb && c->ldc == ldc && c->N == N &&
                c->K == K && c->T == T)
                pl = c;
        }
    if (!pl) {
        if ((st = lt_plan_make(g, &tmp, err))) {
            lt_plan_free(&tmp);
            return st;
        }
        if (g->use_cache && g->n_cache < LT_CACHE_MAX) {
            g->cache[g->n_cache] = tmp;
            pl = &g->cache[g->n_cache++];
        } else {
            pl = &tmp;
        }
    }
    LT_CHECK(cublasLtMatmul(g->lt, pl->op, &alpha, A, pl->la, B, pl->lb, &beta, C, pl->lc, C,
                            pl->lc, &pl->algo, g->ws, g->ws_bytes, s));
out:
    if (pl == &tmp)
        lt_plan_free(&tmp);
    return st;
}

/* Grows *p to bytes now (contents not kept; zero: cleared on s). p and cap are the owner's own
 * fields: when the new allocation fails they read NULL and 0, never the freed buffer. */
static qwenrt_status grow_now(struct cuda_alloc_count *a, void **p, int64_t *cap, int64_t bytes, bool zero,
                              cudaStream_t s, struct qwenrt_error *err)
{
    dev_free(a, *p); /* cudaFree waits for the work queued before, which may still read it */
    *p = NULL;
    *cap = 0;
    CUDA_CHECK(dev_malloc(a, p, (size_t)bytes));
    if (zero)
        CUDA_CHECK(cudaMemsetAsync(*p, 0, (size_t)bytes, s));
    *cap = bytes;
    return QWENRT_OK;
}

qwenrt_status scratch_grow_to(struct gemm_ctx *g, struct cuda_alloc_count *allocs, void **p, int64_t *cap,
                              int64_t bytes, bool zero, cudaStream_t s, struct qwenrt_error *err)
{
    if (bytes <= *cap)
        return QWENRT_OK;
    if (!g || !g->frozen)
        return grow_now(allocs, p, cap, bytes, zero, s, err);
    for (int32_t i = 0; i < g->n_pending; i++)
        if (g->pending[i].p == p) {
            g->pending[i].bytes = bytes > g->pending[i].bytes ? bytes : g->pending[i].bytes;
            return QWENRT_OK;
        }
    if (g->n_pending == SCRATCH_PENDING_MAX)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: more than %d scratch buffers grow in one captured prefill",
                       SCRATCH_PENDING_MAX);
    g->pending[g->n_pending++] = (struct scratch_pending){p, cap, bytes, zero, allocs};
    return QWENRT_OK;
}

static const char *scratch_name(const struct gemm_ctx *g, void *const *p)
{
    return p == (void *const *)&g->wf32 ? "wf32" : p == (void *const *)&g->wbf16 ? "wbf16"
           : p == (void *const *)&g->xsplit ? "xsplit" : p == (void *const *)&g->c3 ? "c3"
           : p == (void *const *)&g->scores ? "scores" : p == (void *const *)&g->fa_part ? "fa_part"
           : p == (void *const *)&g->fa_count ? "fa_count" : p == (void *const *)&g->fa_ops ? "fa_ops"
                                                      : "the session's scratch";
}

void scratch_describe(const struct gemm_ctx *g, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < g->n_pending && at < n; i++) {
        const struct scratch_pending *q = &g->pending[i];
        int w = snprintf(buf + at, n - at, "%s%s %lld > %lld", i ? "; " : "", scratch_name(g, q->p),
                         (long long)q->bytes, (long long)*q->cap);
        at += w > 0 ? (size_t)w : 0;
    }
}

qwenrt_status scratch_apply(struct gemm_ctx *g, cudaStream_t s, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    for (int32_t i = 0; i < g->n_pending && !st; i++) {
        const struct scratch_pending *q = &g->pending[i];
        if (q->bytes > *q->cap)
            st = grow_now(q->allocs, q->p, q->cap, q->bytes, q->zero, s, err);
    }
    g->n_pending = 0;
    return st;
}

/* A product's scratch: scratch_grow_to on the context's own count. */
static qwenrt_status grow(struct gemm_ctx *g, void **p, int64_t *cap, int64_t bytes, struct qwenrt_error *err)
{
    return scratch_grow_to(g, g->allocs, p, cap, bytes, false, NULL, err);
}

qwenrt_status gemm_init(struct gemm_ctx *g, struct cuda_alloc_count *allocs, struct qwenrt_error *err)
{
    memset(g, 0, sizeof(*g));
    g->allocs = allocs;
    cublasStatus_t s = cublasLtCreate(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        g->lt = NULL;
        return lt_fail(err, s, __FILE__, __LINE__, "cublasLtCreate");
    }
    g->ws_bytes = 32u << 20;
    cudaError_t e = dev_malloc(allocs, &g->ws, g->ws_bytes);
    if (e != cudaSuccess) { /* nothing kept: the handle goes too */
        gemm_free(g);
        return cuda_fail(err, e, __FILE__, __LINE__, "the cuBLASLt workspace (cudaMalloc)");
    }
    return QWENRT_OK;
}

void gemm_free(struct gemm_ctx *g)
{
    attention_gemm_free(g);
    for (int32_t i = 0; i < g->n_cache; i++)
        lt_plan_free(&g->cache[i]);
    if (g->lt)
        cublasLtDestroy(g->lt);
    dev_free(g->allocs, g->ws);
    dev_free(g->allocs, g->wf32);
    dev_free(g->allocs, g->wbf16);
    dev_free(g->allocs, g->xsplit);
    dev_free(g->allocs, g->c3);
    memset(g, 0, sizeof(*g));
}

/* Whether xsplit already holds c->x in the form of `terms` bf16 terms (the caller vouches
 * with x_reuse that x has not changed since it was converted), and remembering it. */
static bool xb_current(const struct gemm_ctx *g, const struct gemm_call *c, int32_t terms)
{
    return c->x_reuse && g->xb_src == c->x && g->xb_terms == terms && g->xb_T == c->T &&
           g->xb_K == c->K && g->xb_ldx == c->ldx;
}

static void xb_remember(struct gemm_ctx *g, const struct gemm_call *c, int32_t terms)
{
    g->xb_src = c->x, g->xb_terms = terms, g->xb_T = c->T, g->xb_K = c->K, g->xb_ldx = c->ldx;
}

/* g->xsplit of at least bytes; a new buffer holds nothing the memo (xb_src) could name. */
static qwenrt_status xsplit_grow(struct gemm_ctx *g, int64_t bytes, struct qwenrt_error *err)
{
    if (bytes > g->xsplit_cap)
        g->xb_src = NULL;
    return grow(g, (void **)&g->xsplit, &g->xsplit_cap, bytes, err);
}

qwenrt_status gemm_x_slot(struct gemm_ctx *g, const float *x, int64_t T, int64_t K, int64_t ldx,
                          int32_t terms, __nv_bfloat16 **slot, struct qwenrt_error *err)
{
    qwenrt_status st = xsplit_grow(g, terms * T * K * 2, err);
    if (st)
        return st;
    g->xb_src = x, g->xb_terms = terms, g->xb_T = T, g->xb_K = K, g->xb_ldx = ldx;
    *slot = g->xsplit;
    return QWENRT_OK;
}

/* W in bf16: as stored, or dequantised into g->wbf16. */
static qwenrt_status weights_bf16(struct gemm_ctx *g, const struct gemm_call *c, const void **wb,
                                  cudaStream_t s, struct qwenrt_error *err)
{
    *wb = c->w;
    if (c->dtype == QR_BF16 && c->row_bytes == c->K * 2)
        return QWENRT_OK;
    qwenrt_status st = grow(g, (void **)&g->wbf16, &g->wbf16_cap, (int64_t)c->N * c->K * 2, err);
    if (st)
        return st;
    dequant_bf16_kernel<1><<<4096, 256, 0, s>>>(g->wbf16, NULL, (const uint8_t *)c->w, c->dtype,
                                                 c->N, c->K, c->row_bytes);
    CUDA_CHECK(cudaGetLastError());
    *wb = g->wbf16;
    return QWENRT_OK;
}

/* The fast product: x rounded to bf16, W in bf16 (as stored, or dequantised into a scratch
 * matrix), one tensor-core product with f32 accumulation. */
static qwenrt_status gemm_run_bf16(struct gemm_ctx *g, const struct gemm_call *c, cudaStream_t s,
                                   struct qwenrt_error *err)
{
    qwenrt_status st;
    int64_t n = (int64_t)c->T * c->K;
    const void *wb = NULL;
    if ((st = xsplit_grow(g, n * 2, err)) || (st = weights_bf16(g, c, &wb, s, err)))
        return st;
    /* q, k and v (gate and up) read the same x: round it once */
    if (!xb_current(g, c, 1)) {
        int64_t blocks = (n + 255) / 256;
        round_bf16_kernel<<<(int)(blocks > 4096 ? 4096 : blocks), 256, 0, s>>>(g->xsplit, c->x,
                                                                                c->ldx, c->K, n);
        CUDA_CHECK(cudaGetLastError());
        xb_remember(g, c, 1);
    }
    return lt_matmul(g, CUDA_R_16BF, wb, c->K, g->xsplit, c->K, c->y, c->ldy, c->N, c->K, c->T,
                     c->accumulate ? 1.0f : 0.0f, s, err);
}

/* Two-term products stack their terms only up to this N: above it the sum of the stacked
 * products (combine_terms_kernel, a pass over 3 T N floats) cost more than a second product
 * accumulating onto y (ncu: 8.5 us per product at Qwen3.5's pp512). -D overrides. */
#ifndef GEMM_STACK2_MAX_N
#define GEMM_STACK2_MAX_N 512
#endif

/* The two-term product of weights bf16 does not hold (F16, quantised): W dequantised into
 * two bf16 terms w_hi + w_lo (16 bits, as x's two terms), y = w_lo·x_hi + w_hi·x_mid +
 * w_hi·x_hi, smallest first (w_lo·x_mid, below 2^-16 of y, is left out). Stacked for small
 * N: w_hi over [x_hi; x_mid] and w_lo·x_hi into the third slice, then one sum. */
static qwenrt_status gemm_run_w2(struct gemm_ctx *g, const struct gemm_call *c,
                                 __nv_bfloat16 *xhi, __nv_bfloat16 *xmid, cudaStream_t s,
                                 struct qwenrt_error *err)
{
    int64_t nk = (int64_t)c->N * c->K, tn = (int64_t)c->T * c->N;
    qwenrt_status st = grow(g, (void **)&g->wbf16, &g->wbf16_cap, 2 * nk * 2, err);
    if (st)
        return st;
    __nv_bfloat16 *whi = g->wbf16, *wlo = whi + nk;
    dequant_bf16_kernel<2><<<4096, 256, 0, s>>>(whi, wlo, (const uint8_t *)c->w, c->dtype, c->N,
                                                 c->K, c->row_bytes);
    CUDA_CHECK(cudaGetLastError());
    if (c->stack3 && c->N <= GEMM_STACK2_MAX_N) {
        if ((st = grow(g, (void **)&g->c3, &g->c3_cap, 3 * tn * 4, err)) ||
            (st = lt_matmul(g, CUDA_R_16BF, whi, c->K, xhi, c->K, g->c3, c->N, c->N, c->K,
                            2 * (int64_t)c->T, 0.0f, s, err)) ||
            (st = lt_matmul(g, CUDA_R_16BF, wlo, c->K, xhi, c->K, g->c3 + 2 * tn, c->N, c->N,
                            c->K, c->T, 0.0f, s, err)))
            return st;
        int64_t blocks = (tn + 255) / 256;
        combine_terms_kernel<<<(int)(blocks > 4096 ? 4096 : blocks), 256, 0, s>>>(
            c->y, c->ldy, g->c3, c->N, c->T, 3, c->accumulate);
        CUDA_CHECK(cudaGetLastError());
        return QWENRT_OK;
    }
    const __nv_bfloat16 *ws[3] = {wlo, whi, whi}, *xs[3] = {xhi, xmid, xhi};
    for (int i = 0; i < 3; i++)
        if ((st = lt_matmul(g, CUDA_R_16BF, ws[i], c->K, xs[i], c->K, c->y, c->ldy, c->N, c->K,
                            c->T, i > 0 || c->accumulate ? 1.0f : 0.0f, s, err)))
            return st;
    return QWENRT_OK;
}

/* The split product: x as `terms` bf16 terms (hi, mid and lo carry all 24 bits of an f32
 * mantissa, hi and mid 16), W in bf16, one tensor-core product per term (or one over the
 * stacked terms), summed in f32. Three terms are the exact prefill of BF16 weights; two the
 * fast prefill of DeltaNet models (gemm_call.x_terms), where weights bf16 does not hold
 * exactly take two terms as well (gemm_run_w2). */
static qwenrt_status gemm_run_split(struct gemm_ctx *g, const struct gemm_call *c, int32_t terms,
                                    cudaStream_t s, struct qwenrt_error *err)
{
    qwenrt_status st;
    int64_t n = (int64_t)c->T * c->K;
    const void *wb = NULL;
    bool w_exact = c->dtype == QR_BF16 && c->row_bytes == c->K * 2;
    if ((st = xsplit_grow(g, terms * n * 2, err)))
        return st;
    __nv_bfloat16 *hi = g->xsplit, *mid = hi + n, *lo = terms == 3 ? mid + n : NULL;
    if (!xb_current(g, c, terms)) { /* the products sharing an input split it once */
        CUDA_CHECK(launch_split_bf16(hi, mid, lo, c->x, c->ldx, c->K, c->T, s));
        xb_remember(g, c, terms);
    }
    if (terms == 2 && !w_exact)
        return gemm_run_w2(g, c, hi, mid, s, err);
    if ((st = weights_bf16(g, c, &wb, s, err)))
        return st;
    if (c->stack3 && (terms == 3 || c->N <= GEMM_STACK2_MAX_N)) {
        /* one product over terms x T columns (the terms are contiguous [T][K] blocks): more
         * output tiles than one term has, so small-N products fill the GPU */
        if ((st = grow(g, (void **)&g->c3, &g->c3_cap, terms * (int64_t)c->T * c->N * 4, err)))
            return st;
        if ((st = lt_matmul(g, CUDA_R_16BF, wb, c->K, hi, c->K, g->c3, c->N, c->N, c->K,
                            terms * (int64_t)c->T, 0.0f, s, err)))
            return st;
        int64_t tot = (int64_t)c->T * c->N, blocks = (tot + 255) / 256;
        combine_terms_kernel<<<(int)(blocks > 4096 ? 4096 : blocks), 256, 0, s>>>(
            c->y, c->ldy, g->c3, c->N, c->T, terms, c->accumulate);
        CUDA_CHECK(cudaGetLastError());
        return QWENRT_OK;
    }
    /* smallest term first, each added onto the f32 result */
    __nv_bfloat16 *by_size[3] = {lo, mid, hi};
    for (int i = 3 - terms; i < 3; i++) {
        float beta = i > 3 - terms || c->accumulate ? 1.0f : 0.0f;
        if ((st = lt_matmul(g, CUDA_R_16BF, wb, c->K, by_size[i], c->K, c->y, c->ldy, c->N, c->K,
                            c->T, beta, s, err)))
            return st;
    }
    return QWENRT_OK;
}

qwenrt_status gemm_run(struct gemm_ctx *g, const struct gemm_call *c, cudaStream_t s,
                       struct qwenrt_error *err)
{
    qwenrt_status st;
    if (c->fast && c->dtype != QR_F32 && c->K % 8 == 0)
        return c->x_terms >= 2 ? gemm_run_split(g, c, c->x_terms > 3 ? 3 : c->x_terms, s, err)
                               : gemm_run_bf16(g, c, s, err);
    if (c->dtype == QR_BF16 && c->bf16x2 && c->row_bytes == c->K * 2 && c->K % 8 == 0)
        return gemm_run_split(g, c, 3, s, err);
    const float *wf = (const float *)c->w;
    if (c->dtype != QR_F32 || c->row_bytes != c->K * 4) {
        if ((st = grow(g, (void **)&g->wf32, &g->wf32_cap, (int64_t)c->N * c->K * 4, err)))
            return st;
        CUDA_CHECK(launch_dequant(g->wf32, c->w, c->dtype, c->N, c->K, c->row_bytes, s));
        wf = g->wf32;
    }
    return lt_matmul(g, CUDA_R_32F, wf, c->K, c->x, c->ldx, c->y, c->ldy, c->N, c->K, c->T,
                     c->accumulate ? 1.0f : 0.0f, s, err);
}
