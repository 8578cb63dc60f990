/*
 * cuda_internal.cuh — what the CUDA backend's .cu files share: the CUDA_CHECK macro that turns
 * a failed call into a qwenrt_status (file, line, CUDA's message; never aborts), device
 * helpers for the weight dtypes, and the launch functions of every kernel.
 *
 * Conventions: activations are f32 [T][ld] rows; weights are [N] rows of K elements in their
 * stored dtype (the file's bytes, copied to the device); a launch function returns the
 * cudaError_t of its launch (cudaGetLastError), which the caller passes through CUDA_CHECK.
 * Token ids and the position of the first token are read from device memory (ids, pos0) so
 * that a captured decode graph serves every step.
 */
#ifndef QWENRT_BACKEND_CUDA_INTERNAL_CUH
#define QWENRT_BACKEND_CUDA_INTERNAL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "format/dtype.h"
}

/* Turns a CUDA error into a status naming file, line, the call and CUDA's message, and takes it
 * out of CUDA's last-error state (the status carries it now: left there, the next launch's
 * cudaGetLastError would report it again, failing a later call that did nothing wrong; an error
 * that spoils the context stays sticky whatever is done here). */
static inline qwenrt_status cuda_fail(struct qwenrt_error *err, cudaError_t e, const char *file,
                                      int line, const char *what)
{
    cudaGetLastError();
    return err_set(err, QWENRT_ERR_BACKEND, "%s:%d: %s: %s (%s)", file, line, what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

/* A session's device (host false) or pinned (host true) allocation of n bytes, counted in a
 * (cuda_options.allocs; NULL: not counted); the a->fail_at-th fails as a shortage would, with
 * cudaErrorMemoryAllocation. A failure is returned, and taken out of CUDA's last-error state:
 * left there, the next launch's cudaGetLastError would report it, and a session whose buffer
 * could not grow would fail its next, smaller call too (so a real failure and a made one leave
 * the same state behind). Every allocation a session owns comes here and goes back through
 * dev_free / dev_free_host with the same a. */
static inline cudaError_t dev_malloc_bytes(struct cuda_alloc_count *a, void **p, size_t n, bool host)
{
    *p = NULL;
    if (a && ++a->made == a->fail_at)
        return cudaErrorMemoryAllocation;
    cudaError_t e = host ? cudaMallocHost(p, n) : cudaMalloc(p, n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
    } else if (a) {
        a->live++;
    }
    return e;
}

template <class T> static inline cudaError_t dev_malloc(struct cuda_alloc_count *a, T **p, size_t n)
{
    return dev_malloc_bytes(a, (void **)p, n, false);
}

template <class T> static inline cudaError_t dev_malloc_host(struct cuda_alloc_count *a, T **p, size_t n)
{
    return dev_malloc_bytes(a, (void **)p, n, true);
}

/* Frees what dev_malloc (dev_free) or dev_malloc_host (dev_free_host) made; NULL: nothing. */
static inline void dev_free_bytes(struct cuda_alloc_count *a, const void *p, bool host)
{
    if (!p)
        return;
    if (a)
        a->live--;
    host ? cudaFreeHost((void *)p) : cudaFree((void *)p);
}

static inline void dev_free(struct cuda_alloc_count *a, const void *p) { dev_free_bytes(a, p, false); }
static inline void dev_free_host(struct cuda_alloc_count *a, const void *p) { dev_free_bytes(a, p, true); }

static inline int cmp_float_asc(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n >= 1; sorts v in place): the measurements' timings. */
static inline float median_of_floats(float *v, int n)
{
    qsort(v, (size_t)n, sizeof(float), cmp_float_asc);
    return v[n / 2];
}

/* Returns from the enclosing status-returning function when call fails. */
#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess)                                                            \
            return cuda_fail(err, e_, __FILE__, __LINE__, #call);                         \
    } while (0)

#include <utility>

/* An op with its weights resolved to device memory. */
struct dop {
    const void *w;     /* device weight rows, or NULL */
    int32_t dtype;
    int64_t row_bytes;
    int32_t K, N;
    const float *vec, *vec2, *vec3; /* device copies of op->vec.. */
};

#define GEMV_MAX_T 8   /* tokens one GEMV launch handles (more: a GEMM) */
#define GEMV_MAX_SEG 4 /* weight matrices sharing one input in one GEMV launch */

/* ---- programmatic dependent launch (PDL) ----
 * A kernel launched with pdl = true may start while the kernel before it in the stream is
 * still running: everything it does before griddep_wait() must only read data no kernel
 * writes (weights). Every kernel of the backend calls griddep_launch() first (the next
 * kernel may then be scheduled) and griddep_wait() before it touches activations or state;
 * both are no-ops when the kernel was launched without the attribute. */

__device__ __forceinline__ void griddep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---- the decode timeline (cuda_session_timeline; a measurement) ----
 * A launch given a stamps array has thread 0 of each block write %globaltimer at point i
 * (0: start, 1: after griddep_wait, 2: the kernel's own (gemv_smem: rows and x in shared
 * memory; the decode attention: q, k and v normalised, rotated and cached), 3: end) into
 * stamps[block][TL_SLOTS], blocks numbered x-fastest, and with the start its multiprocessor
 * (%smid + 1) into slot 4, so that the report can tell blocks that shared one; NULL (always,
 * outside the timeline): nothing. */
#define TL_MAX_BLOCKS 16384 /* blocks of one launch the timeline keeps (later ones: none) */
#define TL_SLOTS 5          /* per block: the four stamps, then the multiprocessor + 1 */
__device__ __forceinline__ unsigned tl_smid()
{
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
__device__ __forceinline__ void tl_stamp(unsigned long long *stamps, int i)
{
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (stamps && !(threadIdx.x | threadIdx.y | threadIdx.z) && b < TL_MAX_BLOCKS) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        stamps[TL_SLOTS * (size_t)b + i] = t;
        if (i == 0)
            stamps[TL_SLOTS * (size_t)b + 4] = tl_smid() + 1ull;
    }
}

/* ---- weights asked into the L2 ahead of their step (cuda_options.l2_prefetch_mb) ----
 * A decode launch may carry a byte range of later steps' weights; its blocks share it out and
 * ask the L2 to fetch it (cp.async.bulk.prefetch, sm_90). A hint: nothing waits for it, no
 * result depends on it, and weights are never written, so any launch may issue it at any time
 * (before griddep_wait too). One range (the arena holds the layers' weights in program order,
 * so a stretch of the weight stream is one stretch of memory), 16-byte aligned, a multiple of
 * 16 long. */
struct l2_range {
    const void *p;
    uint32_t bytes; /* 0: none */
};

/* The block's share of pf (equal 16-byte-aligned pieces over the grid's blocks), issued by its
 * thread 0. 32-bit arithmetic: a 64-bit version made the attention kernel spill. */
__device__ __forceinline__ void l2_prefetch_share(const struct l2_range &pf)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pf.bytes == 0 || (threadIdx.x | threadIdx.y | threadIdx.z))
        return;
    const uint32_t nb = gridDim.x * gridDim.y * gridDim.z;
    const uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const uint32_t per = ((pf.bytes + nb - 1) / nb + 15) & ~15u, lo = b * per;
    if (lo < pf.bytes)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)pf.p + lo),
                     "r"(min(per, pf.bytes - lo))
                     : "memory");
#endif
}

/* Launches kernel k in thread-block clusters of `cluster` blocks along x (1: no clusters; sm_90)
 * and with the programmatic-serialization attribute when pdl; returns the launch's error. */
template <typename... KP, typename... A>
static inline cudaError_t launch_kc(bool pdl, int cluster, void (*k)(KP...), dim3 grid, dim3 block,
                                    size_t smem, cudaStream_t s, A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2] = {};
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cluster, at[n].val.clusterDim.y = 1, at[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

/* Launches kernel k (with the programmatic-serialization attribute when pdl) and returns the
 * launch's error. */
template <typename... KP, typename... A>
static inline cudaError_t launch_k(bool pdl, void (*k)(KP...), dim3 grid, dim3 block,
                                   size_t smem, cudaStream_t s, A &&...args)
{
    return launch_kc(pdl, 1, k, grid, block, smem, s, std::forward<A>(args)...);
}

/* ---- dtype helpers (device) ---- */

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t u)
{
    return __uint_as_float((uint32_t)u << 16);
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t u)
{
    return __half2float(__ushort_as_half(u));
}

/* Q4_K sub-block sub's 6-bit scale and min, unpacked from the super-block's 12 scale bytes. */
static __device__ __forceinline__ void q4k_scale_min(const uint8_t *s, int sub, int *sc, int *m)
{
    if (sub < 4) {
        *sc = s[sub] & 63;
        *m = s[sub + 4] & 63;
    } else {
        *sc = (s[sub + 4] & 0xF) | ((s[sub - 4] >> 6) << 4);
        *m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
    }
}

/* Element i of a row stored as dtype (every dtype the GEMV handles). */
static __device__ __forceinline__ float deq_elem(const uint8_t *row, int32_t dtype, int64_t i)
{
    switch (dtype) {
    case QR_F32:
        return ((const float *)row)[i];
    case QR_F16:
        return f16_bits_to_f32(((const uint16_t *)row)[i]);
    case QR_BF16:
        return bf16_bits_to_f32(((const uint16_t *)row)[i]);
    case QR_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
        return f16_bits_to_f32(d) * (float)(int8_t)b[2 + i % 32];
    }
    case QR_Q4_K: {
        const uint8_t *b = row + (i / 256) * 144;
        int j = (int)(i % 256), c = j / 64, hi = (j % 64) / 32, l = j % 32, sub = 2 * c + hi;
        float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        float dmin = f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8)));
        int sc, m;
        q4k_scale_min(b + 4, sub, &sc, &m);
        int q = (b[16 + 32 * c + l] >> (4 * hi)) & 0xF;
        return d * (float)sc * (float)q - dmin * (float)m;
    }
    case QR_Q6_K: {
        const uint8_t *b = row + (i / 256) * 210;
        int j = (int)(i % 256), h = j / 128, jj = j % 128, quarter = jj / 32, l = jj % 32;
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = f16_bits_to_f32((uint16_t)(b[208] | (b[209] << 8)));
        int lo = (ql[64 * h + (quarter & 1) * 32 + l] >> ((quarter >> 1) * 4)) & 0xF;
        int hb = (qh[32 * h + l] >> (2 * quarter)) & 3;
        int q = (lo | (hb << 4)) - 32;
        return d * (float)sc[8 * h + l / 16 + 2 * quarter] * (float)q;
    }
    default:
        return __int_as_float(0x7fc00000); /* NaN: an unsupported dtype shows in every test */
    }
}

/* ---- GEMV: y = [norm](x) · Wᵀ for T <= GEMV_MAX_T tokens, several weights at once ---- */

enum gemv_mode {
    GEMV_STORE = 0,  /* y = result */
    GEMV_ACCUM = 1,  /* y += result (residual add fused) */
    GEMV_SWIGLU = 2, /* seg[0] = gate, seg[1] = up (same N): seg[0].y = silu(gate) * up */
};

struct gemv_seg {
    const void *w;    /* [N] rows of K elements, dtype of the launch (k_mixed: this dtype) */
    int32_t N;
    int64_t row_bytes;
    float *y;         /* [T][ldy] */
    int32_t ldy;
    int32_t dtype;    /* k_mixed launches only: Q4_K or Q6_K */
};

struct gemv_args {
    const float *x;        /* [T][ldx] */
    int32_t ldx, K, T;
    const float *norm_w;   /* non-NULL: x is RMS-normalised with this weight [K] first */
    float eps;
    int32_t dtype;         /* enum qr_dtype of every segment */
    int32_t mode;          /* enum gemv_mode */
    int32_t n_seg;
    struct gemv_seg seg[GEMV_MAX_SEG];
    bool pdl;              /* launch with programmatic dependent launch */
    bool v2;               /* the all-loads-up-front kernels: gemv2 (float weights), gemvq (quantised, T = 1) */
    bool k_mixed;          /* segments of Q4_K and Q6_K mixed (Q4_K_M's q|k|v), seg[i].dtype each:
                            * only gemvq takes them (launch_gemv refuses when it does not apply) */
    int32_t n_sm;          /* multiprocessors (gemv2 sizes its rows per warp); 0: 132 */
    bool smem;             /* T = 1, 16-bit weights: the kernel that copies its rows into shared
                            * memory first (gemv_smem.cu), when it applies */
    int32_t smem_warps, smem_kb; /* its warps per block and shared memory per block (KB) at
                            * most (0: 8 and 120); the session's choice (pick_gemv_smem_shape) */
    int32_t smem_min_blocks; /* its warps per block halved while its grid would have fewer
                            * blocks than this (0: never; cuda_options.gemv_smem_min_blocks) */
    int32_t smem_res_min_blocks; /* the same for GEMV_ACCUM launches where > 0
                            * (cuda_options.gemv_smem_res_min_blocks), */
    int32_t smem_pair_min_blocks;  /* GEMV_SWIGLU ones (gemv_smem_pair_min_blocks), */
    int32_t smem_multi_min_blocks; /* and GEMV_STORE ones of several segments (..._multi_...) */
    int32_t smem_waves;    /* > 0: instead, the fewest warps per block (any number) that keep its
                            * grid within this many blocks per multiprocessor (n_sm;
                            * cuda_options.gemv_smem_waves) */
    int32_t smem_alone;    /* cuda_options.gemv_smem_alone: 1 launches of several segments, 2 all,
                            * with a grid within n_sm reserve at least smem_half_sm bytes */
    int32_t smem_half_sm;  /* half a multiprocessor's shared memory, bytes */
    bool smem_after_wait;  /* its blocks call griddep_launch after griddep_wait, not before
                            * (the session's pick, cuda_options.gemv_smem_launch) */
    int32_t q_rows;        /* gemvq: rows per warp below the LM head (0: 1, Q8_0 2;
                            * cuda_options.gemvq_rows) */
    bool q_after_wait;     /* gemvq: griddep_launch after griddep_wait (cuda_options.gemvq_launch) */
    int32_t q_warps;       /* gemvq: warps per block (0: 4, or 8; cuda_options.gemvq_warps) */
    int32_t q_smem_kb;     /* gemvq: KB of shared memory a block reserves at least (cuda_options.gemvq_smem_kb) */
    int32_t q_head_blocks; /* gemvq: an LM head loops over its tiles in this many blocks per
                            * multiprocessor (0: one tile per block; cuda_options.gemvq_head_blocks) */
    bool q_int8;           /* gemvq: x quantised to 8 bits as the CPU's quantised products do
                            * (Q8_K / Q8_0 blocks), integer dot products (cuda_options.gemvq_int8) */
    bool q_one_pass;       /* gemvq with q_int8: x normalised and quantised in one pass from
                            * registers (quant_rows_i8.cuh; cuda_options.gemvq_one_pass), where
                            * a warp has 2 rows, in the mixed q|k|v launch and the LM head's loop */
    bool batch;            /* 2 to 8 tokens: gemv_batch.cu (16-bit weights) or gemvq_batch.cu
                            * (quantised) where it applies (cuda_options.gemv_batch) */
    bool batch_mma;        /* with batch, BF16 rows: the multi-token sums on the tensor cores
                            * (gemv_batch_mma.cu; cuda_options.gemv_batch_mma) where it applies */
    bool mma;              /* its sums on the tensor cores for BF16 rows (gemv_mma.cu;
                            * cuda_options.gemv_mma) where the shape allows */
    bool smem_xreg;        /* gemv_smem: x in each warp's registers, not staged in shared
                            * memory, where K allows (cuda_options.gemv_smem_xreg) */
    bool smem_norm_late;   /* gemv_smem with x in registers and a fused norm: 1 / rms applied to
                            * the row sums (cuda_options.gemv_smem_norm_late) */
    unsigned long long *stamps; /* benchmarks (NULL otherwise): per block 4 %globaltimer stamps
                            * and the multiprocessor, [block][TL_SLOTS] (tl_stamp): start, after
                            * griddep_wait, (gemv_smem:) weights and x in shared memory, end;
                            * gemv_smem and gemv_mma only (their grids stay far below
                            * TL_MAX_BLOCKS). Not in gemvq nor gemv2: compiled in, stamps changed
                            * their register allocation (gemv2's LM head 82 -> 96) */
    struct l2_range pf;   /* a later step's weights asked into the L2 (gemv_smem, gemv_mma, gemvq) */
    uint8_t *q_pre;       /* gemvq_batch_mma: NULL, or device scratch of gemvq_batch_pre_bytes(T, K)
                           * (16-byte aligned): x normalised and quantised into it once by a launch
                           * of its own before the product, whose blocks copy it instead of each
                           * staging x (the session's default from 2 sessions; docs/perf-log.md, session 42) */
    float *y_copy;        /* GEMV_ACCUM, one token and one segment, gemv_smem / gemv_mma only
                           * (launch_gemv refuses it elsewhere): each result also stored here,
                           * at its row (mlp_rows 3 reads the residual from this copy while it
                           * adds to y) */
};

/* true when the GEMV kernels handle this dtype. */
bool gemv_supports(int32_t dtype);
cudaError_t launch_gemv(const struct gemv_args *a, cudaStream_t s);
/* true when launch_gemv would use the gemv2 kernel for these arguments. */
bool gemv2_applies(const struct gemv_args *a);
/* The quantised one-token GEMV (gemv_quant.cu): whether it applies, and its launch
 * (launch_gemv takes it when it applies). */
#define GEMVQ_WARPS_LIMIT 8     /* gemvq's warps per block at most (its launch bound: 256 threads
                                 * leave it the 255 registers of 128; 512 would cap them at 128: spills) */
#define GEMVQ_SMEM_KB_LIMIT 200 /* the shared memory a gemvq block may reserve at most, KB */
#ifndef GEMVQ_HEAD_BLOCKS_DEFAULT
#define GEMVQ_HEAD_BLOCKS_DEFAULT 4 /* cuda_options.gemvq_head_blocks by default */
#endif
bool gemvq_applies(const struct gemv_args *a);
bool gemvq_takes_k(int32_t K); /* a K gemvq is built for (its shapes decide the rest) */
cudaError_t launch_gemvq(const struct gemv_args *a, cudaStream_t s);
/* The one-token 16-bit GEMV with its rows in shared memory (gemv_smem.cu; a.smem asks for it,
 * launch_gemv takes it when it applies). */
#define GEMV_SMEM_WARPS_LIMIT 16 /* gemv_smem's warps per block at most (its launch bound) */
#define GEMV_SMEM_KB_LIMIT 226   /* its dynamic shared memory per block at most, KB: sm_90 allows
                                  * 227 KB with the static part */
bool gemv_smem_applies(const struct gemv_args *a);
/* The GEMV of 2 to 8 tokens with 16-bit weights (gemv_batch.cu; a.batch asks for it,
 * launch_gemv takes it when it applies). */
bool gemv_batch_applies(const struct gemv_args *a);
cudaError_t launch_gemv_batch(const struct gemv_args *a, cudaStream_t s);
/* The same for BF16 rows with the sums on the tensor cores (gemv_batch_mma.cu; a.batch and
 * a.batch_mma ask for it, launch_gemv takes it when it applies: K a multiple of 32) — for up to
 * GEMV_BATCH_MMA_MAX_T tokens (more than the other GEMVs: callers send T > GEMV_MAX_T only where
 * it applies), from GEMV_BATCH_MMA_MIN_T on (H200, the batched step at 2 sessions: gemv_batch
 * 2,092 tok/s, this 2,011; at 3: 2,703 and 2,827; docs/perf-log.md, session 35). */
#define GEMV_BATCH_MMA_MAX_T 16
#define GEMV_BATCH_MMA_MIN_T 3
bool gemv_batch_mma_applies(const struct gemv_args *a);
cudaError_t launch_gemv_batch_mma(const struct gemv_args *a, cudaStream_t s);
/* The same for Q4_K / Q6_K rows (and Q4_K_M's mixed q|k|v) with x in 8 bits as the one-token
 * products take it (gemvq_batch_mma.cu; a.batch, a.batch_mma and a.q_int8 ask for it: the
 * batched step in the default precision), 2 to GEMV_BATCH_MMA_MAX_T tokens, K whole
 * super-blocks up to GQ8_KMAX. */
bool gemvq_batch_mma_applies(const struct gemv_args *a);
cudaError_t launch_gemvq_batch_mma(const struct gemv_args *a, cudaStream_t s);
extern "C" size_t gemvq_batch_pre_bytes(int32_t T, int32_t K); /* gemv_args.q_pre's size */
#define GEMVQ_BATCH_PRE_KMAX 3584 /* the largest K gemvq_batch_mma takes (GQ8_KMAX) */
/* The same for quantised rows (gemvq_batch.cu: Q8_0, Q4_K, Q6_K, Q4_K_M's mixed q|k|v; a.batch
 * asks for it, launch_gemv takes it when it applies). */
bool gemvq_batch_applies(const struct gemv_args *a);
cudaError_t launch_gemvq_batch(const struct gemv_args *a, cudaStream_t s);
int32_t gemv_smem_blocks(const struct gemv_args *a); /* its grid (0: it does not apply) */
/* Whether a one-token product of rows x K (not an LM head: those stay gemv2) needs more than
 * one gemv_smem block of 8 warps per multiprocessor (the session's choice of block shape). */
bool gemv_smem_wide(int64_t rows, int32_t K, int32_t n_sm);
cudaError_t launch_gemv_smem(const struct gemv_args *a, cudaStream_t s);

/* ---- the whole SwiGLU MLP of one token in one launch (mlp_fused.cu) ----
 * y += W_down · (silu(W_gate · n) * (W_up · n)), n = RMSNorm(x) * norm_w; 16-bit weights,
 * sm_90 (thread-block clusters, bulk copies). */
struct mlp_args {
    struct gemv_args in;   /* x, K = H, T = 1, norm_w, eps: the norm's input (gemv_stage_x) */
    const void *w_gate, *w_up; /* [I] rows of H elements (row_bytes H * 2) */
    const void *w_down;    /* [H] rows of I elements */
    int64_t down_row_bytes;
    int32_t H, I, dtype;   /* dtype: QR_BF16 or QR_F16, all three matrices */
    float *y;              /* [H] the residual the result is added to (may be in.x) */
    float *part;           /* scratch [MLPF_MAX_CLUSTERS][H]: each cluster's partial sums */
    unsigned *count;       /* clusters (mlp_rows.cu: blocks) done, then mlp_rows.cu's flag; zero
                            * between launches (the last one resets them) */
    /* mlp_rows.cu (cuda_options.mlp_rows) */
    int32_t rows;          /* 1: float accumulator, 2: fixed point (the same bits every run),
                            * 3: floats into y, x read from the copy in acc */
    int32_t n_sm;          /* multiprocessors: the grid stays within one block each */
    bool pdl;              /* launched with programmatic dependent launch */
    void *acc;             /* [H] floats or 64-bit integers, zero between launches */
    int32_t cluster;       /* blocks per cluster summing their partials first (0 or 1: none; 2, 4, 8) */
    bool down_regs;        /* the down columns in registers, not shared memory (H <= 1024) */
};

#define MLPF_MAX_CLUSTERS 16
/* true when the fused MLP takes these arguments on this device (cc_major >= 9). */
bool mlp_fused_applies(const struct mlp_args *a, int cc_major);
cudaError_t launch_mlp_fused(const struct mlp_args *a, cudaStream_t s);
/* The same MLP split over the intermediate channels, partials summed by atomics (mlp_rows.cu):
 * true when it takes these arguments (a->rows 1 or 2) on this device. */
bool mlp_rows_applies(const struct mlp_args *a, int cc_major);
cudaError_t launch_mlp_rows(const struct mlp_args *a, cudaStream_t s);

/* Dequantises W [N][K] (dtype) to f32 [N][K]. */
cudaError_t launch_dequant(float *dst, const void *w, int32_t dtype, int64_t N, int64_t K,
                           int64_t row_bytes, cudaStream_t s);
/* x [T][K] (ld ldx) -> hi, mid, lo bf16 [T][K] with hi + mid + lo = x to ~2^-24 relative;
 * lo NULL: two terms, hi + mid = x to ~2^-16. */
cudaError_t launch_split_bf16(__nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo,
                              const float *x, int32_t ldx, int32_t K, int32_t T, cudaStream_t s);

/* ---- op kernels (kernels.cu, attention.cu, gdn_ops.cu) ---- */

cudaError_t launch_embed(float *out, int32_t width, const void *w, int32_t dtype,
                         int64_t row_bytes, const int32_t *ids, int32_t T, cudaStream_t s, bool pdl = false);
cudaError_t launch_rmsnorm(float *out, int32_t ldo, const float *in, int32_t ldi, const float *w,
                           int32_t group, int32_t groups, float eps, int32_t T, cudaStream_t s, bool pdl = false);
cudaError_t launch_add(float *y, const float *x, int64_t n, cudaStream_t s, bool pdl = false);
/* g[t][c] = silu(g[t][c]) u[t][c] for c < w, t < T (rows ldg and ldu floats apart) */
cudaError_t launch_swiglu(float *g, int32_t ldg, const float *u, int32_t ldu, int32_t w, int32_t T,
                          cudaStream_t s, bool pdl = false);
/* The same two ops writing bf16 [T][width] (the fast prefill's product input, gemm_x_slot):
 * the values round_bf16 would make of their f32 results; with mid (not NULL) also the
 * remainder's bf16, the second term split_bf16 would make (x_terms 2). */
cudaError_t launch_rmsnorm_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *in, int32_t ldi,
                                const float *w, int32_t width, float eps, int32_t T, cudaStream_t s);
cudaError_t launch_swiglu_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *g, int32_t ldg,
                               const float *u, int32_t ldu, int32_t w, int32_t T, cudaStream_t s);
cudaError_t launch_sigmoid_gate(float *o, int32_t ldo, const float *g, int32_t ldg,
                                int32_t n_head, int32_t hd, int32_t q_stride, int32_t T,
                                cudaStream_t s, bool pdl = false);

struct rope_args {
    float *q;            /* [T][ldq], heads q_stride apart (in place) */
    float *k;            /* [T][ldk] (in place) */
    const float *v;      /* [T][ldv]: copied to the cache with k when kc != NULL */
    int32_t ldq, ldk, ldv;
    const float *wq, *wk; /* per-head norm weights [hd] */
    int32_t n_head, n_head_kv, hd, q_stride, n_rot;
    float theta, eps;
    const int32_t *pos0; /* device: position of token 0 */
    int32_t T;
    void *kc, *vc;       /* non-NULL: write normed+roped k and v at pos0+t (fused cache write) */
    int32_t kvw;
    const double *inv_freq; /* theta^(-2i/n_rot), i < n_rot/2 (device), or NULL: computed */
    bool pdl;
    bool kv_f16;         /* the cache's elements are f16 (else f32) */
};
cudaError_t launch_qk_norm_rope(const struct rope_args *a, cudaStream_t s);
cudaError_t launch_kv_write(void *kc, void *vc, bool kv_f16, const float *k, int32_t ldk, const float *v,
                            int32_t ldv, int32_t kvw, const int32_t *pos0, int32_t T,
                            cudaStream_t s, bool pdl = false);

/* One session of a multi-session decode attention launch (attn_args.n_seq): its cache and its
 * position on the device. */
#define ATT_MAX_SEQ 16
struct attn_seq {
    void *kc, *vc;
    const int32_t *pos;
};

struct attn_args {
    float *out;           /* [T][ldo] */
    const float *q;       /* [T][ldq], heads q_stride apart */
    const void *kc, *vc;  /* [n_ctx][kvw], f32 or f16 (kv_f16, at the end) */
    int32_t ldo, ldq, q_stride, kvw, n_head, n_head_kv, hd;
    const int32_t *pos0;  /* device */
    int32_t T;
    bool gate;            /* out *= sigmoid(q[h*q_stride + hd + d]) (Qwen3.5 output gate) */
    bool tiled;           /* T > 1: query tiles share K/V tiles staged in shared memory */
    bool pdl;
    /* T == 1, splits > 1: split-K over the positions (flash decoding). part holds
     * [n_head][splits][hd + 2] floats, count [n_head] zeroed counters (left zeroed). */
    int32_t splits;
    int32_t split_min; /* positions per split at least (0: ATT_SPLIT_MIN, below) */
    int32_t one_split; /* T == 1: one split (no merge) while the position is below this (0: none) */
    /* T == 1: at positions in [win_from, win_until), once a position has more than one split,
     * ATT_CL_SPLITS of them: the cluster-merged variant's partition (cuda_session's cl_mode), so
     * that every variant, whichever graph a chunk of steps takes, and the batched step cut a
     * position's keys alike and sum them in one order (empty window: win_until <= win_from) */
    int32_t win_from, win_until;
    /* > 0: the splits the partition is computed for when the launch has another number
     * (gridDim.z; the batched step: the one-token graph's, so that a session's attention is
     * bit for bit its own decode's while the launch has as many splits as that needs) */
    int32_t nominal_splits;
    float *part;
    unsigned *count;
    /* rope (T == 1): q (at q, in place of the roped q) and k / v (rk, rv: this token's rows)
     * normalised and rotated in the kernel, as launch_qk_norm_rope would, and k / v written to
     * the cache at *pos0 (kc / vc are then written: the session's cache) */
    bool rope;
    const float *rk, *rv, *wq, *wk;
    int32_t n_rot;
    float theta, eps;
    const double *inv_freq;
    bool kv_f16;          /* the cache's elements are f16 (else f32) */
    /* T == 1, rope: *pos0 and the first round of cached K/V rows (positions before *pos0) are
     * read before griddep_wait. Only where the launch before this one lets it start after its
     * own wait (gemv_smem / gemvq "after the wait"): then every launch before that one has
     * finished, among them the argmax that wrote *pos0 and the earlier steps that wrote the
     * rows (the session decides: mark_early_reads) */
    bool early;
    struct l2_range pf;  /* T == 1: a later step's weights asked into the L2 at the start */
    unsigned long long *stamps; /* the decode timeline (tl_stamp; T == 1), or NULL */
    bool cluster_merge;  /* T == 1, rope, sm_90: a head's splits are one cluster of blocks merged
                          * through distributed shared memory (cuda_options.attn_cluster;
                          * part and count unused) */
    bool pipe;           /* T == 1, rope: two rounds of rows in flight (cuda_options.attn_pipe) */
    bool shared_kv;      /* T == 1, rope, not cluster_merge: two query heads of one KV head per
                          * block, their K/V rows loaded once (attention_shared_kv.cu;
                          * cuda_options.attn_shared_kv), where attention_shared_kv_applies */
    int32_t lanes;       /* T == 1, rope, not cluster_merge: 8 or 16 lanes per cached row, a warp
                          * taking 32 / lanes rows at once (attention_lanes.cu;
                          * cuda_options.attn_lanes), where attention_lanes_applies; 0: a row per
                          * warp (attention_kernel) */
    int32_t stages;      /* T == 1, rope, not cluster_merge, sm_90: the cached K/V rows staged in
                          * shared memory by tensor copies, a ring of this many tiles, one block
                          * per KV head and split (attention_staged.cu; cuda_options.attn_stage),
                          * where attention_staged_applies; 0: not */
    int32_t n_ctx;       /* with stages: the cache's rows (its tensor maps' extent) */
    bool rope_regs;      /* T == 1, rope: the q/k norm + RoPE in each warp's registers, no block
                          * barrier (attention_rope_regs; cuda_options.attn_rope_regs), where
                          * attention_rope_regs_applies */
    /* T == 1, rope, n_seq >= 1 (the server's batched step: one launch for several sessions,
     * blockIdx.y the session s, not cluster_merge, rope_regs, shared_kv, lanes or stages):
     * session s's rows are q + s ldq, rk + s ldrk, rv + s ldrv and out + s ldo, its cache and
     * position seq[s] (kc, vc and pos0 unused); part and count hold n_seq times a session's */
    int32_t n_seq, ldrk, ldrv;
    struct attn_seq seq[ATT_MAX_SEQ];
    /* n_seq >= 1, splits > 1: this many blocks for each pair of query heads and session, each
     * walking a run of its session's splits (attention_batch.cu; the same partials bit for
     * bit); 0: a block a head and split (attention_kernel's multi-session form) */
    int32_t group_blocks;
};
/* Whether the register prologue takes these heads: the rotated pairs (d, d + n_rot / 2) a
 * whole number of lanes apart, that number a power of two (a lane's EPL = hd / 32 elements
 * are contiguous in the attention's rounds). */
static inline bool attention_rope_regs_applies(int32_t hd, int32_t n_rot)
{
    int32_t epl = hd / 32, half = n_rot / 2;
    if (hd % 32 || n_rot <= 0 || n_rot > hd || n_rot % 2 || half % epl)
        return false;
    int32_t hl = half / epl;
    return hl >= 1 && hl <= 16 && (hl & (hl - 1)) == 0;
}
#ifndef ATT_MAX_SPLITS
#define ATT_MAX_SPLITS 32 /* at most 32: one warp merges the splits (docs/perf-log.md, session 10) */
#endif
#define ATT_CL_SPLITS 8 /* a cluster: the portable maximum (16 placed badly: perf-log session 25) */
#ifndef ATT_SPLIT_MIN
#define ATT_SPLIT_MIN 64 /* positions per split at least (two rounds of 8 warps x 4 positions) */
#endif

/* The decode attention's splits in use at position last (T = 1): at least split_min positions
 * each, at most nz, one below a.one_split positions (0: no such floor), and inside the cluster
 * window [a.win_from, a.win_until) the cluster-merged variant's ATT_CL_SPLITS once more than one
 * (that variant runs its whole cluster: attention.cu) — a pure function of the position, so a
 * step splits alike whichever graph runs it; split z then takes positions lo..last
 * (attention_split_range: attention_kernel's rule, shared by the kernels that replace it). The
 * host asks it too: how many splits a batch of sessions needs (cuda_batch.cu). */
__host__ __device__ __forceinline__ int attention_splits(const struct attn_args &a, int last, int nz)
{
    const int split_min = a.split_min > 0 ? a.split_min : ATT_SPLIT_MIN, grown = (last + split_min) / split_min;
    const int S = last < a.one_split ? 1 : grown < nz ? grown : nz;
    return S > 1 && last >= a.win_from && last < a.win_until ? (nz < ATT_CL_SPLITS ? nz : ATT_CL_SPLITS) : S;
}
#ifndef ATT_STAGES_MAX
#define ATT_STAGES_MAX 8 /* attention_staged.cu's ring: at most this many tiles */
#endif
bool attention_supports(int32_t hd);
cudaError_t launch_attention(const struct attn_args *a, cudaStream_t s);
/* attention_batch.cu: whether the multi-session attention in runs of splits a block takes
 * these arguments (n_seq >= 1, RoPE inside, group_blocks 1 to ATT_MAX_SPLITS, splits > 1 with
 * their partials and counters, query heads a whole number of attention_group_heads() a KV
 * head), its launch, its query heads a block, and how many of its blocks for head size hd fit
 * on a multiprocessor (0: unknown) */
bool attention_group_applies(const struct attn_args *a);
cudaError_t launch_attention_group(const struct attn_args *a, cudaStream_t s);
int attention_group_heads(void);
int attention_group_blocks_per_sm(int32_t hd, bool kv_f16);
/* attention_shared_kv.cu: whether the two-heads-per-block decode attention takes these
 * arguments (T = 1, RoPE inside, no cluster merge, an even number of query heads per KV head,
 * head size 64, 128 or 256), and its launch (the splits as attention_kernel's) */
bool attention_shared_kv_applies(const struct attn_args *a);
cudaError_t launch_attention_shared_kv(const struct attn_args *a, cudaStream_t s);
bool attention_staged_applies(const struct attn_args *a);
cudaError_t launch_attention_staged(const struct attn_args *a, cudaStream_t s);
/* attention_lanes.cu: whether the decode attention with a row per group of a->lanes lanes takes
 * these arguments (T = 1, RoPE inside, no cluster merge, lanes 8 or 16, head size 64 or 128,
 * or 256 with 16 lanes), and its launch (the grid and splits as attention_kernel's) */
bool attention_lanes_applies(const struct attn_args *a);
cudaError_t launch_attention_lanes(const struct attn_args *a, cudaStream_t s);
/* A decode layer's norm + q|k|v GEMV (g: three segments q, k, v) and its attention with RoPE
 * (t, rope on) in one launch of clusters of at most `cluster` (8 or 16) blocks
 * (qkv_attention.cu, sm_90): whether it applies, and the launch. */
bool qkv_attention_applies(const struct gemv_args *g, const struct attn_args *t, int cluster);
cudaError_t launch_qkv_attention(const struct gemv_args *g, const struct attn_args *t, int cluster, cudaStream_t s);

/* A decode layer's attention (t: T = 1, rope on) and its o product + residual add in one
 * launch of clusters of blocks per query head (attn_o.cu, sm_90): y += W_o · attention. */
struct attn_o_args {
    struct attn_args t;
    const void *w;         /* W_o [N][row_bytes], 16-bit (dtype QR_BF16 or QR_F16), K = n_head * hd */
    int64_t row_bytes;
    int32_t dtype, N;
    float *y;              /* [N] the residual */
    float *part;           /* scratch [n_head][N]: each head's share of the rows */
    unsigned *count;       /* [16] heads done per row slice (kept zeroed) */
    int32_t cluster;       /* blocks per query head: 8 or 16; 0: 16 for 8 heads or fewer, else 8 */
    int32_t single;        /* positions below which every block attends all of them itself */
};
bool attn_o_applies(const struct attn_o_args *a);
cudaError_t launch_attn_o(const struct attn_o_args *a, cudaStream_t s);

cudaError_t launch_gdn_conv(float *x, int32_t ldx, float *state, const float *taps, int32_t C,
                            int32_t K, int32_t T, cudaStream_t s, bool pdl = false);

/* One session of a multi-session DeltaNet step launch (gdn_args.n_seq): its recurrent state
 * and conv window. */
#define GDN_MAX_SEQ 16
struct gdn_seq {
    float *state, *conv_state;
};

struct gdn_args {
    float *out;            /* [T][ldo] o, Hv*dv */
    const float *qkv;      /* [T][ldi] conv output q | k | v */
    const float *b, *a;    /* [T][ldb], [T][lda] */
    int32_t ldo, ldi, ldb, lda;
    const float *dt, *ssm_a; /* [Hv] */
    float *state;          /* [Hv][dk][dv] */
    int32_t Hk, Hv, dk, dv, T;
    bool tiled;            /* value head j uses key head j % Hk */
    bool pdl;
    float *scratch;        /* gdn_scan: >= gdn_scan_scratch_floats() floats, else NULL */
    /* launch_gdn_core only: the gated RMS norm of each head's output fused (decode program) */
    const float *z, *gnorm_w; /* z [T][ldz]; w [dv]; z NULL: no norm */
    int32_t ldz;
    float geps;
    /* launch_gdn_core only, T = 1, Hv == Hk: the causal conv of the block's own q, k and v
     * channels first, in place on qkv (decode program; no other block reads them) */
    float *conv_state;        /* [conv_k - 1][conv_C]; NULL: qkv is already convolved */
    const float *conv_taps;   /* [conv_C][conv_k] */
    int32_t conv_C, conv_k;
    /* launch_gdn_core only, T = 1 with the gated norm: each value head over a cluster of
     * blocks (gdn_decode.cu) when it applies; the caller sets it only on sm_90 and later */
    bool split;
    struct l2_range pf;      /* launch_gdn_split: a later step's weights asked into the L2 */
    unsigned long long *stamps; /* launch_gdn_split: the decode timeline (tl_stamp), or NULL */
    bool early;              /* launch_gdn_split: the state and the conv windows read before
                              * griddep_wait — only where
                              * the launch before it starts this one after its own wait (then the
                              * step of the token before, which wrote the state, has finished; the
                              * session decides: mark_early_reads) */
    bool staged;             /* launch_gdn_split: the state slice through shared memory in rows
                              * (cuda_options.gdn_staged) */
    bool wide;               /* launch_gdn_split, one session: blocks of two norm groups, the
                              * next launch started after the wait (cuda_options.gdn_wide) */
    /* launch_gdn_split, n_seq >= 1 (the server's batched step: one launch for several sessions,
     * blockIdx.y the session s): session s's rows are out + s ldo, qkv + s ldi, b + s ldb,
     * a + s lda and z + s ldz, its state and conv state seq[s] (state and conv_state: session
     * 0's, which say whether there is a conv) */
    int32_t n_seq;
    struct gdn_seq seq[GDN_MAX_SEQ];
};
bool gdn_supports(int32_t dk, int32_t dv);
cudaError_t launch_gdn_core(const struct gdn_args *a, cudaStream_t s);
bool gdn_split_applies(const struct gdn_args *a);
cudaError_t launch_gdn_split(const struct gdn_args *a, cudaStream_t s);
/* Column-parallel prefill form (T > 1): q/k normalised, beta and decay for every token by one
 * kernel into scratch, then one warp per 4 state columns runs the recurrence. */
bool gdn_scan_supports(int32_t dk, int32_t dv);
int64_t gdn_scan_scratch_floats(const struct gdn_args *a);
cudaError_t launch_gdn_scan(const struct gdn_args *a, cudaStream_t s);
/* The scan's first kernel alone: qn, kn, beta, decay into scratch (gdn_scan_scratch_floats). */
cudaError_t launch_gdn_prep(const struct gdn_args *a, cudaStream_t s);
/* Chunked prefill form (gdn_chunked.cu): the prep kernel, then the state-free matrices of
 * every chunk at once and a walk over the chunks per block of state columns. */
bool gdn_chunked_supports(int32_t dk, int32_t dv);
int64_t gdn_chunked_scratch_floats(const struct gdn_args *a);
/* tensor_cores: both kernels' products in 3xTF32 on the tensor cores (gdn_chunk_tc.cuh),
 * else in f32 FMAs; scan_warps (8 or 16): the tensor-core walk's warps a block */
cudaError_t launch_gdn_chunked(const struct gdn_args *a, bool tensor_cores, int scan_warps, cudaStream_t s);
/* Token-parallel causal conv for prefill, in place on x ([T][ldx]) and on the conv state
 * ([K-1][C]: its rows become the last K - 1 inputs); halo is scratch of
 * gdn_conv_par_scratch_floats() floats. */
int64_t gdn_conv_par_scratch_floats(int32_t C, int32_t K, int32_t T);
cudaError_t launch_gdn_conv_par(float *x, int32_t ldx, float *state, float *halo, const float *taps,
                                int32_t C, int32_t K, int32_t T, cudaStream_t s);

cudaError_t launch_gated_rmsnorm(float *o, int32_t ldo, const float *z, int32_t ldz,
                                 const float *w, int32_t Hv, int32_t dv, float eps, int32_t T,
                                 cudaStream_t s, bool pdl = false);
/* The same writing bf16 [T][Hv dv] to out (and mid: the second term, when not NULL) instead of
 * o in place: the fast prefill's input of the out projection. */
cudaError_t launch_gated_rmsnorm_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *o,
                                      int32_t ldo, const float *z, int32_t ldz, const float *w,
                                      int32_t Hv, int32_t dv, float eps, int32_t T, cudaStream_t s);

/* The multi-block argmax's scratch: blocks (value bits, index) parts and an arrival counter
 * that each launch leaves at zero; one launch at a time per scratch. */
#define ARGMAX_BLOCKS_DEFAULT 128 /* cuda_options.argmax_blocks 0 */
#define ARGMAX_BLOCKS_LIMIT 1024
struct argmax_scratch {
    int2 *part;      /* [blocks] */
    unsigned *count; /* zero between launches */
    int32_t blocks;  /* 1: the single-block kernel (no scratch needed) */
};

/* id = argmax x[0..n) (the largest value that is not NaN, the first of equals; 0 when all are
 * NaN); then ids[0] = id, out_ids[*step] = id, (*step)++,
 * (*pos0)++ when step is non-NULL (the on-GPU greedy loop). sc NULL or sc->blocks 1: one
 * block of 1,024 threads; else sc->blocks blocks and the last to arrive finishes. */
cudaError_t launch_argmax(const float *x, int32_t n, int32_t *ids, int32_t *pos0,
                          int32_t *out_ids, int32_t *step, cudaStream_t s, bool pdl = false,
                          const struct argmax_scratch *sc = NULL);

/* topk.cu: the m best of V logits ranked by logit / temperature (ties: lower id first) into
 * out_ids / out_vals (raw logits), best first, and gather_vals[i] = logits[gather[i]];
 * topk_scratch_keys(V, m, max_keys) says whether it fits (-1: m or V out of range, or more
 * keys than the last block holds). scratch comes from topk_alloc_scratch (keys and an
 * arrival counter that each launch leaves at zero); one launch at a time per scratch.
 * reference: the one-thread reference kernel instead (tests). */
#define TOPK_MAX_M CUDA_TOP_MAX_M
#define TOPK_MAX_MERGE 16384 /* keys the last block selects from at most (128 KB of shared memory) */
#define TOPK_SCRATCH_WORDS (TOPK_MAX_MERGE + 1)
int64_t topk_scratch_keys(int32_t V, int32_t m, int32_t max_keys);
/* The kernel's shared-memory size, once before the first launch_topk; *max_keys = the keys
 * the last block holds on this device (TOPK_MAX_MERGE on Hopper, fewer where a block's
 * shared memory is smaller). */
cudaError_t topk_prepare(int32_t *max_keys);
/* a: the session's allocation count (cuda_options.allocs; NULL: none); freed by dev_free. */
cudaError_t topk_alloc_scratch(struct cuda_alloc_count *a, unsigned long long **scratch);
/* With draw (not with reference): the last block then draws the next token from the ranked
 * candidates as sample.cu does (draw->sp in device memory, m = its top_k), writing it where
 * launch_sample would. pdl: launched as a programmatic dependent of the kernel before it (the
 * decode loop's graphs), the row read after griddepcontrol.wait. */
struct topk_draw {
    const struct cuda_sample_params *sp;
    int32_t *next_id, *pos0, *out_ids, *step;
};
cudaError_t launch_topk(const float *logits, int32_t V, float temperature, int32_t m,
                        const int32_t *gather, int32_t n_gather, unsigned long long *scratch,
                        int32_t *out_ids, float *out_vals, float *gather_vals, bool reference,
                        cudaStream_t s, const struct topk_draw *draw = NULL, bool pdl = false);
/* The same selection for n rows in one launch (blockIdx.y: the row), each row with its own
 * logits, scratch and results (ids, vals: device pointers, which may be mapped host memory),
 * all of V logits with the same temperature and m, no gather: the server's picks of every
 * session after a batched step. */
#define TOPK_MAX_ROWS CUDA_TOP_MAX_ROWS
struct topk_rows {
    int32_t n;
    const float *logits[TOPK_MAX_ROWS];
    unsigned long long *scratch[TOPK_MAX_ROWS];
    int32_t *out_ids[TOPK_MAX_ROWS];
    float *out_vals[TOPK_MAX_ROWS];
};
cudaError_t launch_topk_rows(const struct topk_rows *rows, int32_t V, float temperature, int32_t m, cudaStream_t s);

/* sample.cu: one draw over topk.cu's candidates ids / vals (ranked, raw logits) with the
 * sampler parameters at sp (device memory); next_id[0] = the token, and with step non-NULL
 * out_ids[*step] = it, (*step)++, (*pos0)++ (the draw number is *step, 0 without step). */
cudaError_t launch_sample(const int32_t *ids, const float *vals, const struct cuda_sample_params *sp,
                          int32_t *next_id, int32_t *pos0, int32_t *out_ids, int32_t *step, cudaStream_t s);
/* Whether sp is a sampler sample.cu runs (struct cuda_sample_params' ranges). */
bool cuda_sample_params_ok(const struct cuda_sample_params *sp);

#endif
