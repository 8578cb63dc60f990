/*
 * cuda_matmul.cuh — the GEMM (prefill) side of matmul.cu: a cuBLASLt handle with its
 * workspace and the scratch buffers the products need (dequantised f32 weights, the bf16
 * hi/mid/lo split of x), grown on demand and freed with the session.
 */
#ifndef QWENRT_BACKEND_CUDA_MATMUL_CUH
#define QWENRT_BACKEND_CUDA_MATMUL_CUH

#include <cublasLt.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

/* A cuBLASLt product's descriptors and chosen algorithm, kept for reuse (heuristic queries
 * cost microseconds of host time each, and a prefill makes hundreds of products). */
struct lt_plan {
    int32_t ab;                       /* cudaDataType_t of A and B */
    int64_t lda, ldb, ldc, N, K, T;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

#define LT_CACHE_MAX 64
#define BGEMM_CACHE_MAX 32
#define SCRATCH_PENDING_MAX 16

/* A scratch buffer that a frozen gemm_ctx (below) has to grow once its capture is thrown away. */
struct scratch_pending {
    void **p;                  /* the owner's pointer and capacity (bytes) fields */
    int64_t *cap;
    int64_t bytes;             /* the most any call asked for */
    bool zero;                 /* cleared after it is made (attention_flash's arrival counters) */
    struct cuda_alloc_count *allocs;
};

/* A batched f32 product's descriptors and algorithm (attention_gemm.cu). */
struct bgemm_plan {
    bool ta, tf32;
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc;
    int32_t batch;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

struct gemm_ctx {
    struct lt_plan cache[LT_CACHE_MAX];
    int32_t n_cache;
    bool use_cache;        /* cuda_options.gemm_cache */
    cublasLtHandle_t lt;
    void *ws;              /* cuBLASLt workspace */
    size_t ws_bytes;
    float *wf32;           /* [N][K] f32 scratch for dequantised weights */
    int64_t wf32_cap;      /* bytes */
    __nv_bfloat16 *wbf16;  /* [N][K] bf16 scratch for dequantised weights (fast products) */
    int64_t wbf16_cap;     /* bytes */
    __nv_bfloat16 *xsplit; /* [3][T][K] bf16 split of x: hi, mid, lo */
    int64_t xsplit_cap;    /* bytes */
    const float *xb_src;   /* xsplit holds x from here rounded to bf16 (xb_terms 1) or split */
    int64_t xb_T, xb_K, xb_ldx; /* into three bf16 terms (xb_terms 3) */
    int32_t xb_terms;
    float *c3;             /* [3][T][N] f32: the stacked split product's three terms */
    int64_t c3_cap;        /* bytes */
    struct bgemm_plan bcache[BGEMM_CACHE_MAX]; /* attention_gemm's products */
    int32_t n_bcache;
    float *scores;         /* attention_gemm: [n_head][chunk][Tk] */
    int64_t scores_cap;    /* bytes */
    float *fa_part;        /* attention_flash: the key splits' partial results */
    unsigned *fa_count;    /* attention_flash: arrival counters (kept zeroed) */
    int64_t fa_part_cap, fa_count_cap; /* bytes */
    void *fa_ops;          /* attention_flash: q, k, v rounded to 16 bits, head-major */
    int64_t fa_ops_cap;    /* bytes */
    struct cuda_alloc_count *allocs; /* the session's allocation count (dev_malloc), or NULL */
    /* While a prefill is captured into a graph (cuda_session_run, cuda_options.prefill_graph)
     * the context is frozen: no scratch buffer may be freed or made, since the capture's
     * earlier nodes hold the old addresses and cudaFree may not run during a capture. A buffer
     * that would grow is noted in pending instead and keeps its old address (the capture is
     * then thrown away, never run); scratch_apply grows them all, and the capture is made
     * again. */
    bool frozen;
    int32_t n_pending;
    struct scratch_pending pending[SCRATCH_PENDING_MAX];
};

/* y[T][ldy] (=|+=) x[T][ldx] · Wᵀ, W [N] rows of K elements of dtype (row_bytes apart). */
struct gemm_call {
    float *y;
    const float *x;
    const void *w;
    int32_t dtype;
    int64_t row_bytes;
    int32_t N, K, T, ldx, ldy;
    bool accumulate;  /* y += x · Wᵀ (the residual add fused) */
    bool bf16x2;      /* BF16 weights: split x into three bf16 terms, tensor cores */
    bool stack3;      /* the split terms as one product over terms x T columns, then a sum */
    bool fast;        /* non-F32 weights: x and W (dequantised) in bf16, one product */
    int32_t x_terms;  /* the fast product's x: 1 bf16 term, or 2 (hi + mid, 16 mantissa bits:
                       * DeltaNet models, cuda_options.prefill_x_terms) */
    bool x_reuse;     /* x is unchanged since the previous product read it: the fast path may
                       * reuse its bf16 copy (the caller knows; gemm_run checks the shape) */
};

/* Prefill attention through f32 GEMMs (attention_gemm.cu): queries t = 0..T-1 at positions
 * pos0 + t over the KV cache rows 0..pos0+T-1 (already written), causal. */
struct attn_gemm_args {
    float *out;                 /* [T][ldo] */
    const float *q;             /* [T][ldq], head h at h * q_stride */
    const void *kc, *vc;        /* [n_ctx][kvw] */
    int32_t ldo, ldq, q_stride, kvw, n_head, n_head_kv, hd;
    int32_t pos0, T;            /* host values */
    bool tf32;                  /* products on tensor cores in TF32 (10-bit mantissa inputs) */
    __nv_bfloat16 *out16;       /* attention_flash: write bf16 [T][ldo] here instead of out */
    const float *kin, *vin;     /* attention_flash: the prompt's k and v ([T][ldk], [T][ldv]),
                                 * written into the cache rows pos0.. by the kernel that rounds
                                 * them (no kv_write launch); NULL: the cache holds them already */
    int32_t ldk, ldv;
    bool kv_f16;                /* the cache's elements are f16 (attention_flash only: the f32
                                 * GEMMs refuse it) */
};
qwenrt_status attention_gemm(struct gemm_ctx *g, const struct attn_gemm_args *a, cudaStream_t s,
                             struct qwenrt_error *err);
void attention_gemm_free(struct gemm_ctx *g);

/* The same attention in one tensor-core kernel (attention_flash.cu): f16 scores, bf16
 * probabilities times V, f32 accumulation. For the fast prefill only. Errors: BACKEND. */
/* true when the kernel takes these arguments (head size 64/128/256, 16-byte aligned rows) */
bool attention_flash_applies(const struct attn_gemm_args *a);
qwenrt_status attention_flash(struct gemm_ctx *g, const struct attn_gemm_args *a, cudaStream_t s,
                              struct qwenrt_error *err);

/* A failed cuBLASLt call as a BACKEND error naming the call and the status. */
static inline qwenrt_status lt_fail(struct qwenrt_error *err, cublasStatus_t st, const char *file,
                                    int line, const char *what)
{
    return err_set(err, QWENRT_ERR_BACKEND, "%s:%d: cuBLASLt %s failed: status %d", file, line,
                   what, (int)st);
}

/* In a function with `qwenrt_status st` and an `out:` label: on failure, st = the error. */
#define LT_CHECK(call)                                                                    \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            st = lt_fail(err, s_, __FILE__, __LINE__, #call);                             \
            goto out;                                                                     \
        }                                                                                 \
    } while (0)

/* Grows *p (capacity *cap, bytes, contents not kept) to at least bytes, counted in allocs;
 * zero: cleared on stream s once made. g NULL or not frozen: at once (cudaFree waits for the
 * work queued before); g frozen: noted in g->pending, *p unchanged. Errors: BACKEND (no memory; *p and
 * *cap then read NULL and 0, never the freed buffer), LIMIT (more than SCRATCH_PENDING_MAX
 * buffers noted). */
qwenrt_status scratch_grow_to(struct gemm_ctx *g, struct cuda_alloc_count *allocs, void **p, int64_t *cap,
                              int64_t bytes, bool zero, cudaStream_t s, struct qwenrt_error *err);
/* What the frozen context noted, as "name bytes > capacity; ..." into buf (n bytes). */
void scratch_describe(const struct gemm_ctx *g, char *buf, size_t n);
/* Grows what the frozen context noted (g->pending), then forgets it. Errors: BACKEND. */
qwenrt_status scratch_apply(struct gemm_ctx *g, cudaStream_t s, struct qwenrt_error *err);

/* The cuBLASLt handle and workspace; the scratch buffers grow on use, all counted in allocs
 * (the session's, or NULL). Nothing is kept on error. */
qwenrt_status gemm_init(struct gemm_ctx *g, struct cuda_alloc_count *allocs, struct qwenrt_error *err);
void gemm_free(struct gemm_ctx *g);
qwenrt_status gemm_run(struct gemm_ctx *g, const struct gemm_call *c, cudaStream_t s,
                       struct qwenrt_error *err);

/* Where the producer of a fast product's input writes it in bf16 ([T][K], and with terms 2
 * the second term [T][K] right after): the products that then read x (with x_reuse) take it
 * as already rounded. x only names the input (the f32 buffer is not written). Errors:
 * BACKEND (no memory). */
qwenrt_status gemm_x_slot(struct gemm_ctx *g, const float *x, int64_t T, int64_t K, int64_t ldx,
                          int32_t terms, __nv_bfloat16 **slot, struct qwenrt_error *err);

#endif
