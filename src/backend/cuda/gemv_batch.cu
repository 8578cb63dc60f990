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
 * How: a block owns RPW consecutive rows (2, or 4 for launches of >= 4096 rows) of the launch's
 * segments (q|k|v as one launch; SwiGLU's gate and up rows in pairs); its warps split the rows'
 * 16-byte chunks, each lane taking every 128th from its own, 2 or 4 chunks' loads issued before
 * the first use,
 * the weights loaded past L1 (ld.global.nc.L1::no_allocate) so that L1 keeps x: every block
 * reads all of x (T * K * 4 bytes, 96 KB at most), so x is read from L1, once per chunk for
 * all RPW rows — per 16 * RPW bytes of weights, 32 * T bytes of x. Each (row, token) sum is a
 * chain of f32 FMAs over the lane's chunks in order, then warp_sum, then the warps' sums added
 * in warp order through shared memory; a fused RMS norm is applied as gemv_kernel applies it
 * (see gemv_batch_kernel); one thread per (row, token) stores the result (GEMV_STORE,
 * GEMV_SWIGLU) or adds it to y (GEMV_ACCUM). The order of the sums differs from gemv2's
 * and from the one-token kernels': results differ by rounding (test_op_gemv_sizes holds every
 * variant to the CPU).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_batch.cuh"
#include "backend/cuda/gemv_smem.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#define GB_WARPS 4 /* warps per block */

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

/* TM: tokens the sums are sized for (a.T <= TM); RPW rows per block; P = 2: SwiGLU's gate and
 * up rows; NORM: x RMS-normalised with norm_w first — applied as gemv_kernel applies it, x times
 * norm_w in the dot products and 1 / rms on the sums, the squares of x summed from the chunks the
 * block reads anyway (together its lanes read all of x). The block's warps split the rows'
 * chunks (warp w takes chunks w * 32 + lane, then every GB_WARPS * 32 on): a launch of 1,024
 * rows has 512 blocks, not 128, so four times the loads are in flight. */
template <int DT, int TM, int RPW, int P, bool NORM>
__global__ void __launch_bounds__(32 * GB_WARPS) gemv_batch_kernel(const __grid_constant__ struct gemv_args a)
{
    __shared__ float s_part[GB_WARPS][RPW * P + 1][TM]; /* each warp's sums; [RPW * P]: x's squares */
    griddep_launch();
    griddep_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, T = a.T;
    const int64_t row0 = (int64_t)blockIdx.x * RPW;
    const uint4 *rp[RPW][P];
    float *yp[RPW];
    int32_t ldy[RPW];
    bool ok[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++)
        ok[r] = gemv_seg_row<P>(a, row0 + r, rp[r], yp[r], ldy[r]);
    if (!ok[0]) /* the whole block */
        return;
    const int chunks = a.K / 8;
    constexpr int U = RPW * P <= 2 ? 4 : 2; /* chunks per lane whose loads are in flight together
                                             * (fewer for 4 rows or pairs: no spills at TM = 8) */
    constexpr int STRIDE = 32 * GB_WARPS;
    float acc[RPW][P][TM], ss[TM];
#pragma unroll
    for (int t = 0; t < TM; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < RPW; r++)
#pragma unroll
            for (int p = 0; p < P; p++)
                acc[r][p][t] = 0.0f;
    }
    for (int c0 = warp * 32 + lane; c0 < chunks; c0 += STRIDE * U) {
        uint4 w[U][RPW][P];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int p = 0; p < P; p++)
                    w[u][r][p] = c0 + STRIDE * u < chunks ? gemv_ld_w128(rp[r][p] + c0 + STRIDE * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + STRIDE * u;
            if (c >= chunks)
                break;
            float4 g0 = make_float4(1.0f, 1.0f, 1.0f, 1.0f), g1 = g0;
            if (NORM)
                g0 = __ldg((const float4 *)(a.norm_w + c * 8)), g1 = __ldg((const float4 *)(a.norm_w + c * 8 + 4));
#pragma unroll
            for (int t = 0; t < TM; t++) {
                if (t >= T)
                    break;
                const float4 *xp = (const float4 *)(a.x + (int64_t)t * a.ldx + (int64_t)c * 8);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                if (NORM) {
                    ss[t] = fmaf(x0.x, x0.x, ss[t]), ss[t] = fmaf(x0.y, x0.y, ss[t]);
                    ss[t] = fmaf(x0.z, x0.z, ss[t]), ss[t] = fmaf(x0.w, x0.w, ss[t]);
                    ss[t] = fmaf(x1.x, x1.x, ss[t]), ss[t] = fmaf(x1.y, x1.y, ss[t]);
                    ss[t] = fmaf(x1.z, x1.z, ss[t]), ss[t] = fmaf(x1.w, x1.w, ss[t]);
                    x0 = make_float4(x0.x * g0.x, x0.y * g0.y, x0.z * g0.z, x0.w * g0.w);
                    x1 = make_float4(x1.x * g1.x, x1.y * g1.y, x1.z * g1.z, x1.w * g1.w);
                }
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int p = 0; p < P; p++)
                        acc[r][p][t] = gb_dot8<DT>(w[u][r][p], x0, x1, acc[r][p][t]);
            }
        }
    }
    gemv_batch_finish<GB_WARPS, TM, RPW, P, NORM>(a, s_part, acc, ss, ok, yp, ldy);
}

/* Rows per block for a launch of `rows` rows: 4 where the grid stays large (x read once for more
 * rows), else 2. */
static int gb_rows_per_block(int64_t rows) { return rows >= 4096 ? 4 : 2; }

bool gemv_batch_applies(const struct gemv_args *a)
{
    return (a->dtype == QR_BF16 || a->dtype == QR_F16) && gemv_batch_shape_ok(a, GEMV_MAX_T, 8);
}

template <int DT, int TM, int P, bool NORM>
static cudaError_t gb_launch(const struct gemv_args *a, cudaStream_t s)
{
    int64_t rows = gemv_launch_rows(a);
    int rpw = gb_rows_per_block(rows);
    int64_t per_block = rpw;
    dim3 grid((unsigned)((rows + per_block - 1) / per_block)), block(32 * GB_WARPS);
    if (rpw == 4)
        return launch_k(a->pdl, gemv_batch_kernel<DT, TM, 4, P, NORM>, grid, block, 0, s, *a);
    return launch_k(a->pdl, gemv_batch_kernel<DT, TM, 2, P, NORM>, grid, block, 0, s, *a);
}

template <int DT, int TM>
static cudaError_t gb_launch_form(const struct gemv_args *a, cudaStream_t s)
{
    if (a->mode == GEMV_SWIGLU)
        return a->norm_w ? gb_launch<DT, TM, 2, true>(a, s) : gb_launch<DT, TM, 2, false>(a, s);
    return a->norm_w ? gb_launch<DT, TM, 1, true>(a, s) : gb_launch<DT, TM, 1, false>(a, s);
}

template <int DT>
static cudaError_t gb_launch_dt(const struct gemv_args *a, cudaStream_t s)
{
    if (a->T <= 2)
        return gb_launch_form<DT, 2>(a, s);
    if (a->T <= 4)
        return gb_launch_form<DT, 4>(a, s);
    return gb_launch_form<DT, 8>(a, s);
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
    size_t rb = 0;
    if (!dtype_row_bytes((enum qr_dtype)dtype, K, &rb))
        return false;
    a.seg[0].row_bytes = (int64_t)rb;
    return !gemvq_applies(&a) && !gemv_smem_applies(&a) && (gemv_batch_applies(&a) || gemvq_batch_applies(&a));
}

/* ------------------------------------------------------------------ the tests' hook */

struct gb_host_bufs {
    void *w[4];
    float *x, *norm_w, *y[4];
    uint8_t *q_pre;
};

static void gb_host_free(struct gb_host_bufs *d)
{
    for (int i = 0; i < 4; i++)
        cudaFree(d->w[i]), cudaFree(d->y[i]);
    cudaFree(d->x);
    cudaFree(d->norm_w);
    cudaFree(d->q_pre);
}

/* A segment's dtype in the case. */
static int32_t gb_seg_dtype(const struct cuda_gemv_case *c, int i) { return c->mixed ? c->seg_dtype[i] : c->dtype; }

/* The case's arrays on the device (d), its arguments in a (its dtypes checked by the caller). */
static cudaError_t gb_host_upload(const struct cuda_gemv_case *c, struct gb_host_bufs *d, struct gemv_args *a)
{
    cudaError_t e = cudaSuccess;
    size_t xb = (size_t)c->T * c->K * 4;
    if ((e = cudaMalloc(&d->x, xb)) || (e = cudaMemcpy(d->x, c->x, xb, cudaMemcpyHostToDevice)))
        return e;
    if (c->norm_w && ((e = cudaMalloc(&d->norm_w, (size_t)c->K * 4)) ||
                      (e = cudaMemcpy(d->norm_w, c->norm_w, (size_t)c->K * 4, cudaMemcpyHostToDevice))))
        return e;
    a->x = d->x, a->ldx = c->K, a->K = c->K, a->T = c->T, a->dtype = gb_seg_dtype(c, 0), a->mode = c->mode;
    a->n_seg = c->n_seg, a->norm_w = d->norm_w, a->eps = c->eps, a->k_mixed = c->mixed;
    for (int i = 0; i < c->n_seg; i++) {
        size_t rb = 0;
        dtype_row_bytes((enum qr_dtype)gb_seg_dtype(c, i), c->K, &rb);
        size_t wb = (size_t)c->N[i] * rb, yb = (size_t)c->T * c->N[i] * 4;
        bool out = c->mode != GEMV_SWIGLU || i == 0;
        if ((e = cudaMalloc(&d->w[i], wb)) || (e = cudaMemcpy(d->w[i], c->w[i], wb, cudaMemcpyHostToDevice)))
            return e;
        if (out && ((e = cudaMalloc(&d->y[i], yb)) || (e = cudaMemcpy(d->y[i], c->y[i], yb, cudaMemcpyHostToDevice))))
            return e;
        a->seg[i].w = d->w[i], a->seg[i].N = c->N[i], a->seg[i].row_bytes = (int64_t)rb;
        a->seg[i].y = d->y[i], a->seg[i].ldy = c->N[i], a->seg[i].dtype = gb_seg_dtype(c, i);
    }
    return e;
}

/* Whether the case's dtypes are ones the test hook takes (16-bit or quantised rows of whole
 * blocks; mixed: Q4_K / Q6_K segments). */
static bool gb_host_dtypes_ok(const struct cuda_gemv_case *c)
{
    for (int i = 0; i < c->n_seg; i++) {
        int32_t dt = gb_seg_dtype(c, i);
        size_t rb;
        bool ok = c->mixed ? dt == QR_Q4_K || dt == QR_Q6_K
                           : dt == QR_BF16 || dt == QR_F16 || dt == QR_Q8_0 || dt == QR_Q4_K || dt == QR_Q6_K;
        if (!ok || !dtype_row_bytes((enum qr_dtype)dt, c->K, &rb))
            return false;
    }
    return true;
}

/* The one-token path a batched step in the default precision must agree with: each token alone
 * through gemvq with x in 8 bits, in the shape the session picks for quantised layers
 * (pick_gemvq_shape: blocks of 8 warps of 2 rows, 100 KB, the one-pass staging, an LM head's
 * looping blocks). */
static cudaError_t gb_host_one_token_int8(const struct gemv_args *a)
{
    cudaError_t e = cudaSuccess;
    for (int t = 0; e == cudaSuccess && t < a->T; t++) {
        struct gemv_args one = *a;
        one.T = 1, one.x = a->x + (int64_t)t * a->ldx, one.batch = one.batch_mma = false;
        one.v2 = one.q_int8 = one.q_one_pass = one.q_after_wait = true;
        one.q_rows = 2, one.q_warps = 8, one.q_smem_kb = 100, one.q_head_blocks = GEMVQ_HEAD_BLOCKS_DEFAULT;
        for (int i = 0; i < a->n_seg; i++)
            one.seg[i].y = a->seg[i].y + (int64_t)t * a->seg[i].ldy;
        if (!gemvq_applies(&one))
            return cudaErrorInvalidValue;
        e = launch_gemv(&one, 0);
    }
    return e;
}

/* The reference: gemv_kernel, one launch per segment for a mixed case (it reads every segment
 * as the launch's dtype); or with x in 8 bits (a->q_int8), the one-token path. */
static cudaError_t gb_host_reference(const struct gemv_args *a)
{
    if (a->q_int8)
        return gb_host_one_token_int8(a);
    if (!a->k_mixed)
        return launch_gemv(a, 0);
    cudaError_t e = cudaSuccess;
    for (int i = 0; e == cudaSuccess && i < a->n_seg; i++) {
        struct gemv_args one = *a;
        one.k_mixed = false, one.dtype = a->seg[i].dtype, one.n_seg = 1, one.seg[0] = a->seg[i];
        e = launch_gemv(&one, 0);
    }
    return e;
}

extern "C" qwenrt_status cuda_gemv_host(const struct cuda_gemv_case *c, bool batch, struct qwenrt_error *err)
{
    if (!c || c->T < 1 || c->T > ((c->mma && batch) || (c->int8 && !batch) ? GEMV_BATCH_MMA_MAX_T : GEMV_MAX_T) || c->K < 1 || c->n_seg < 1 || c->n_seg > 4 || !gb_host_dtypes_ok(c) ||
        c->mode < GEMV_STORE || c->mode > GEMV_SWIGLU ||
        (c->mode == GEMV_SWIGLU && (c->n_seg != 2 || c->N[0] != c->N[1] || c->mixed)))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_gemv_host: a malformed case");
    struct gb_host_bufs d;
    struct gemv_args a;
    memset(&d, 0, sizeof(d));
    memset(&a, 0, sizeof(a));
    cudaError_t e = gb_host_upload(c, &d, &a);
    a.batch = batch, a.batch_mma = batch && c->mma; /* v2, smem, gemvq off: gemv_kernel when not batch */
    a.q_int8 = c->int8 && (!batch || c->mma); /* not batch: each token alone through gemvq */
    if (e == cudaSuccess && c->prequant && a.q_int8 && batch &&
        (e = cudaMalloc(&d.q_pre, gemvq_batch_pre_bytes(c->T, c->K))) == cudaSuccess)
        a.q_pre = d.q_pre;
    qwenrt_status st = QWENRT_OK;
    if (e == cudaSuccess && a.q_int8 && batch) {
        if (!gemvq_batch_mma_applies(&a))
            st = err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda_gemv_host: gemvq_batch_mma does not take this case");
    } else if (e == cudaSuccess && a.batch_mma) {
        if (!gemv_batch_mma_applies(&a))
            st = err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda_gemv_host: gemv_batch_mma does not take this case");
    } else if (e == cudaSuccess && batch && !gemv_batch_applies(&a) && !gemvq_batch_applies(&a))
        st = err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda_gemv_host: neither gemv_batch nor gemvq_batch takes this case");
    if (e == cudaSuccess && !st &&
        (e = a.q_int8 && batch ? launch_gemvq_batch_mma(&a, 0)
             : a.batch_mma ? launch_gemv_batch_mma(&a, 0)
             : batch       ? launch_gemv(&a, 0)
                           : gb_host_reference(&a)) ==
            cudaSuccess)
        e = cudaDeviceSynchronize();
    for (int i = 0; e == cudaSuccess && !st && i < c->n_seg; i++)
        if (d.y[i])
            e = cudaMemcpy(c->y[i], d.y[i], (size_t)c->T * c->N[i] * 4, cudaMemcpyDeviceToHost);
    gb_host_free(&d);
    if (e != cudaSuccess && !st)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_gemv_host");
    return st;
}
