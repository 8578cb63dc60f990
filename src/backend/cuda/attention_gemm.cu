/*
 * attention_gemm.cu — prefill attention as two f32 GEMMs per head group with a masked softmax
 * between them (the per-op profile showed the tiled CUDA-core kernel at ~5 TFLOP/s taking 40%
 * of a Qwen3-0.6B pp512: docs/perf-log.md).
 *
 * For a chunk of tc queries at positions pos0+t0.. and the Tk = pos0+t0+tc keys they can see:
 *   S_h = Q_h K_g^T          (tc x Tk, one strided-batched product per head of the group)
 *   P_h = softmax(S_h / sqrt(hd)) with the causal mask (j <= query position)
 *   O_h = P_h V_g            (tc x hd)
 * in f32 with f32 accumulation (CUBLAS_COMPUTE_32F, no TF32), as the reference computes it;
 * with a->tf32 (the fast prefill of 16-bit and quantised models) on TF32 tensor cores.
 * Query chunks keep the score buffer under ATT_SCORE_FLOATS. Head h reads KV head g = h / grp
 * (grouped-query attention): the products for the r-th head of every group are one batch with
 * constant strides.
 */
#include "backend/cuda/cuda_matmul.cuh"

#include <math.h>

#define ATT_SCORE_FLOATS (32ll << 20) /* 128 MiB of scores at most */

static void bgemm_plan_free(struct bgemm_plan *pl)
{
    if (pl->lc) cublasLtMatrixLayoutDestroy(pl->lc);
    if (pl->lb) cublasLtMatrixLayoutDestroy(pl->lb);
    if (pl->la) cublasLtMatrixLayoutDestroy(pl->la);
    if (pl->op) cublasLtMatmulDescDestroy(pl->op);
    memset(pl, 0, sizeof(*pl));
}

void attention_gemm_free(struct gemm_ctx *g)
{
    for (int32_t i = 0; i < g->n_bcache; i++)
        bgemm_plan_free(&g->bcache[i]);
    g->n_bcache = 0;
    dev_free(g->allocs, g->scores);
    g->scores = NULL;
    g->scores_cap = 0;
    dev_free(g->allocs, g->fa_part);
    dev_free(g->allocs, g->fa_count);
    g->fa_part = NULL, g->fa_count = NULL;
    g->fa_part_cap = g->fa_count_cap = 0;
    dev_free(g->allocs, g->fa_ops);
    g->fa_ops = NULL;
    g->fa_ops_cap = 0;
}

/* A layout of rows x cols (col-major, ld) repeated batch times stride floats apart. */
static cublasStatus_t ag_layout(cublasLtMatrixLayout_t *l, int64_t rows, int64_t cols, int64_t ld,
                                int32_t batch, int64_t stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, CUDA_R_32F, (uint64_t)rows, (uint64_t)cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch));
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                             sizeof(stride));
    return s;
}

/* C (m x n, col-major) = op(A) op(B), k inner, batch products with constant strides; f32.
 * Descriptors and algorithm are cached per shape. */
static qwenrt_status bgemm(struct gemm_ctx *g, bool ta, bool tf32, const float *A, int64_t lda, int64_t sa,
                           const float *B, int64_t ldb, int64_t sb, float *C, int64_t ldc,
                           int64_t sc, int64_t m, int64_t n, int64_t k, int32_t batch,
                           cudaStream_t s, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    struct bgemm_plan key, *pl = NULL;
    memset(&key, 0, sizeof(key));
    key.ta = ta, key.tf32 = tf32, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.sa = sa, key.sb = sb, key.sc = sc, key.batch = batch;
    for (int32_t i = 0; i < g->n_bcache && !pl; i++) {
        struct bgemm_plan *c = &g->bcache[i];
        if (c->ta == ta && c->tf32 == tf32 && c->m == m && c->n == n && c->k == k && c->lda == lda && c->ldb == ldb &&
            c->ldc == ldc && c->sa == sa && c->sb == sb && c->sc == sc && c->batch == batch)
            pl = c;
    }
    cublasLtMatmulPreference_t pref = NULL;
    if (!pl) {
        if (g->n_bcache == BGEMM_CACHE_MAX) { /* full: start over */
            for (int32_t i = 0; i < g->n_bcache; i++)
                bgemm_plan_free(&g->bcache[i]);
            g->n_bcache = 0;
        }
        pl = &g->bcache[g->n_bcache];
        *pl = key;
        cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        LT_CHECK(cublasLtMatmulDescCreate(&pl->op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F));
        LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
        LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
        LT_CHECK(ag_layout(&pl->la, ta ? k : m, ta ? m : k, lda, batch, sa));
        LT_CHECK(ag_layout(&pl->lb, k, n, ldb, batch, sb));
        LT_CHECK(ag_layout(&pl->lc, m, n, ldc, batch, sc));
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &g->ws_bytes, sizeof(g->ws_bytes)));
        /* the heads' slices start anywhere on a float: ask for algorithms that allow it */
        uint32_t align = 4;
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof(align)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof(align)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof(align)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof(align)));
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, pl->op, pl->la, pl->lb, pl->lc, pl->lc, pref, 1,
                                                &heur, &found));
        if (!found) {
            st = err_set(err, QWENRT_ERR_BACKEND, "cuBLASLt: no algorithm for a batched %lld x %lld x %lld product",
                         (long long)m, (long long)n, (long long)k);
            goto out;
        }
        pl->algo = heur.algo;
        g->n_bcache++;
    }
    {
        float alpha = 1.0f, beta = 0.0f;
        LT_CHECK(cublasLtMatmul(g->lt, pl->op, &alpha, A, pl->la, B, pl->lb, &beta, C, pl->lc, C,
                                pl->lc, &pl->algo, g->ws, g->ws_bytes, s));
    }
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (st && pl && pl == &g->bcache[g->n_bcache]) /* a plan that was never finished */
        bgemm_plan_free(pl);
    return st;
}

/* Row i of head h's scores (Tk wide): causal mask at query position qpos0 + i, scaled
 * softmax, in place; masked entries become 0. One block per (row, head). */
__global__ void masked_softmax_kernel(float *S, int32_t tc, int32_t Tk, int32_t qpos0, float scale)
{
    __shared__ float red[32];
    int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nw = blockDim.x >> 5;
    float *row = S + ((int64_t)h * tc + i) * Tk;
    int last = qpos0 + i; /* keys 0..last are visible */
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= last; j += blockDim.x)
        m = fmaxf(m, row[j] * scale);
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0)
        red[warp] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < nw; w++)
        m = fmaxf(m, red[w]);
    __syncthreads();
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        float e = __expf(row[j] * scale - m);
        row[j] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0)
        red[warp] = sum;
    __syncthreads();
    sum = 0.0f;
    for (int w = 0; w < nw; w++)
        sum += red[w];
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < Tk; j += blockDim.x)
        row[j] = j <= last ? row[j] * inv : 0.0f;
}

qwenrt_status attention_gemm(struct gemm_ctx *g, const struct attn_gemm_args *a, cudaStream_t s,
                             struct qwenrt_error *err)
{
    if (a->kv_f16) /* the session routes an f16 cache to the flash or tiled kernels */
        return err_set(err, QWENRT_ERR_INTERNAL, "cuda: attention through f32 GEMMs over an f16 KV cache");
    int32_t grp = a->n_head / a->n_head_kv, Tk_all = a->pos0 + a->T;
    int64_t tc = ATT_SCORE_FLOATS / ((int64_t)a->n_head * Tk_all);
    tc = tc > a->T ? a->T : tc < 1 ? 1 : tc;
    int64_t need = (int64_t)a->n_head * tc * Tk_all * (int64_t)sizeof(float);
    qwenrt_status grown = scratch_grow_to(g, g->allocs, (void **)&g->scores, &g->scores_cap, need, false, s, err);
    if (grown)
        return grown;
    float scale = 1.0f / sqrtf((float)a->hd);
    for (int32_t t0 = 0; t0 < a->T; t0 += (int32_t)tc) {
        int32_t n = a->T - t0 < tc ? a->T - t0 : (int32_t)tc, Tk = a->pos0 + t0 + n;
        int64_t hs = (int64_t)n * Tk; /* floats of one head's scores */
        const float *q = a->q + (int64_t)t0 * a->ldq;
        for (int32_t r = 0; r < grp; r++) {
            /* S_h (col-major Tk x n) = K_g^T-view: A = K_g (hd x Tk, ld kvw), op T; B = Q_h */
            qwenrt_status st = bgemm(g, true, a->tf32, (const float *)a->kc, a->kvw, a->hd, q + (int64_t)r * a->q_stride,
                                     a->ldq, (int64_t)grp * a->q_stride, g->scores + r * hs, Tk,
                                     (int64_t)grp * hs, Tk, n, a->hd, a->n_head_kv, s, err);
            if (st)
                return st;
        }
        int threads = Tk >= 1024 ? 256 : 128;
        masked_softmax_kernel<<<dim3(n, a->n_head), threads, 0, s>>>(g->scores, n, Tk, a->pos0 + t0, scale);
        CUDA_CHECK(cudaGetLastError());
        float *o = a->out + (int64_t)t0 * a->ldo;
        for (int32_t r = 0; r < grp; r++) {
            /* O_h (col-major hd x n, ld ldo) = V_g (hd x Tk, ld kvw) P_h (Tk x n, ld Tk) */
            qwenrt_status st = bgemm(g, false, a->tf32, (const float *)a->vc, a->kvw, a->hd, g->scores + r * hs, Tk,
                                     (int64_t)grp * hs, o + (int64_t)r * a->hd, a->ldo,
                                     (int64_t)grp * a->hd, a->hd, n, Tk, a->n_head_kv, s, err);
            if (st)
                return st;
        }
    }
    return QWENRT_OK;
}
