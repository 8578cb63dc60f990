/*
 * topk.cu — the m best tokens of a logits row on the GPU, so that sampling needs a few hundred
 * bytes back from the device instead of the whole row (151,936 floats for Qwen).
 *
 * Order: tokens rank by logit / temperature (IEEE division, rounded to nearest: the host
 * sampler's own scaling), ties by the lower id — the order in which the CPU sampler's top-k
 * and greedy argmax pick (sampler.c). A NaN ranks below everything. Each token becomes one
 * 64-bit key (the scaled value's bits made monotonic in the high word, 0xffffffff - id in the
 * low word), so "larger key" is exactly that order and a padding key of 0 loses to every
 * token.
 *
 * One launch (topk_kernel): each block turns a slice of TOPK_SLICE logits into keys in shared
 * memory and selects the slice's m best with a radix select (8-bit digits from the top: a
 * histogram of the candidates' next digit, the bin where the m-th best falls, until that bin
 * holds exactly what remains or all 64 bits are fixed), writing them unsorted to scratch; the
 * last block to finish (an arrival counter after the scratch, reset by that block) selects
 * the m best of the nb x m keys the same way, sorts those m by rank, and writes the ids with
 * their raw (unscaled) logits. The same block gathers the raw logits of up to TOPK_MAX_GATHER
 * given ids (the tokens the sampler's logit bias and penalties touch). m = 1 (greedy) takes a
 * maximum instead of the select. Until session 10 each block bitonic-sorted its whole slice
 * and a second launch sorted the nb x m keys: 66 + 6 us for greedy, 66 + 27 us for top-41
 * (ncu, H200). With a draw (struct topk_draw, the sampled decode loop) the last block's first
 * warp then draws the token from the ranked candidates (sample.cuh). launch_topk_rows runs the
 * same for up to TOPK_MAX_ROWS rows in one launch (blockIdx.y: the row; a table of each row's
 * logits, scratch and results in the launch's parameters): the server's picks after a batched
 * step. A reference kernel beside it (topk_ref_kernel: one thread, m passes over the
 * row) is what test_cuda_ops compares against.
 */
#include "backend/cuda/sample.cuh"
#include "backend/cuda/topk_select.cuh"

#define TOPK_SLICE 4096 /* logits per block */
#define TOPK_STATIC_SMEM 4096 /* bytes of static shared memory topk_kernel needs at most */

/* One row's selection (a block of the row's launch: topk_kernel, or topk_rows_kernel's row
 * blockIdx.y). */
__device__ __forceinline__ void topk_row(const float *logits, int32_t V, float temperature, int32_t m,
                                         unsigned long long *scratch, unsigned *arrivals, const int32_t *gather,
                                         int32_t n_gather, int32_t *out_ids, float *out_vals, float *gather_vals,
                                         struct topk_draw dr)
{
    extern __shared__ unsigned long long tk_keys[]; /* max(TOPK_SLICE, gridDim.x * m) */
    __shared__ struct topk_sel st;
    __shared__ unsigned long long best[TOPK_MAX_M];
    __shared__ bool last;
    const int PER = TOPK_SLICE / TOPK_THREADS;
    griddep_launch(); /* launched with PDL (the decode loop): the row is read after the wait */
    griddep_wait();
    int64_t base = (int64_t)blockIdx.x * TOPK_SLICE;
    float l[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) { /* every load issued before the first use */
        int64_t t = base + threadIdx.x + k * TOPK_THREADS;
        l[k] = t < V ? logits[t] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int64_t t = base + threadIdx.x + k * TOPK_THREADS;
        tk_keys[threadIdx.x + k * TOPK_THREADS] = t < V ? topk_key(l[k], temperature, (int32_t)t) : 0ull;
    }
    __syncthreads();
    topk_block_select(tk_keys, TOPK_SLICE, m, scratch + (int64_t)blockIdx.x * m, &st);
    __threadfence(); /* this block's keys are visible before its arrival counts */
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    int32_t n = (int32_t)gridDim.x * m;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        tk_keys[i] = __ldcg(scratch + i);
    for (int32_t i = threadIdx.x; i < n_gather; i += blockDim.x)
        gather_vals[i] = logits[gather[i]];
    __syncthreads();
    topk_block_select(tk_keys, n, m, best, &st);
    topk_write_ranked(best, m, logits, out_ids, out_vals);
    if (threadIdx.x == 0)
        *arrivals = 0; /* ready for the next launch */
    if (!dr.sp)
        return;
    __syncthreads(); /* the ranked candidates are written (and best is free) */
    if (threadIdx.x < 32)
        sample_draw_warp(out_ids, out_vals, dr.sp, dr.next_id, dr.pos0, dr.out_ids, dr.step, (float *)best);
}

__global__ void __launch_bounds__(TOPK_THREADS)
topk_kernel(const float *logits, int32_t V, float temperature, int32_t m, unsigned long long *scratch,
            unsigned *arrivals, const int32_t *gather, int32_t n_gather, int32_t *out_ids,
            float *out_vals, float *gather_vals, struct topk_draw dr)
{
    topk_row(logits, V, temperature, m, scratch, arrivals, gather, n_gather, out_ids, out_vals, gather_vals, dr);
}

__global__ void __launch_bounds__(TOPK_THREADS)
topk_rows_kernel(const __grid_constant__ struct topk_rows rows, int32_t V, float temperature, int32_t m)
{
    const int32_t y = (int32_t)blockIdx.y;
    unsigned long long *scratch = rows.scratch[y];
    topk_row(rows.logits[y], V, temperature, m, scratch, (unsigned *)(scratch + TOPK_MAX_MERGE), NULL, 0,
             rows.out_ids[y], rows.out_vals[y], NULL, topk_draw{NULL, NULL, NULL, NULL, NULL});
}

/* The reference: one thread, m passes, each taking the largest key below the previous one. */
__global__ void topk_ref_kernel(const float *logits, int32_t V, float temperature, int32_t m,
                                const int32_t *gather, int32_t n_gather, int32_t *out_ids,
                                float *out_vals, float *gather_vals)
{
    if (threadIdx.x || blockIdx.x)
        return;
    unsigned long long prev = ~0ull;
    for (int32_t r = 0; r < m; r++) {
        unsigned long long b = 0;
        for (int32_t t = 0; t < V; t++) {
            unsigned long long k = topk_key(logits[t], temperature, t);
            if (k < prev && k > b)
                b = k;
        }
        out_ids[r] = topk_id(b);
        out_vals[r] = logits[topk_id(b)];
        prev = b;
    }
    for (int32_t i = 0; i < n_gather; i++)
        gather_vals[i] = logits[gather[i]];
}

static int32_t topk_slices(int32_t V) { return (V + TOPK_SLICE - 1) / TOPK_SLICE; }

/* Keys of scratch that launch_topk needs for a row of V logits and m results, or -1 when the
 * last block's keys would not fit its shared memory (nb x m > max_keys, topk_prepare's limit). */
int64_t topk_scratch_keys(int32_t V, int32_t m, int32_t max_keys)
{
    int64_t n = (int64_t)topk_slices(V) * m;
    return V < 1 || m < 1 || m > TOPK_MAX_M || m > V || n > max_keys ? -1 : n;
}

cudaError_t topk_prepare(int32_t *max_keys)
{
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return e;
    /* the last block holds nb x m keys beside its static shared memory: as many as this
     * device's blocks take (every CUDA device of compute capability 8.0 or later holds a slice) */
    int64_t keys = ((int64_t)optin - TOPK_STATIC_SMEM) / (int64_t)sizeof(unsigned long long);
    keys = keys > TOPK_MAX_MERGE ? TOPK_MAX_MERGE : keys;
    if (keys < TOPK_SLICE)
        return cudaErrorInvalidConfiguration;
    e = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(keys * sizeof(unsigned long long)));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(topk_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(keys * sizeof(unsigned long long)));
    if (e != cudaSuccess)
        return e;
    /* the largest shared-memory carveout, as the decode megakernel needs (a multiprocessor
     * switching carveouts between kernels has to drain first); a hint, so a refusal is fine */
    cudaFuncSetAttribute(topk_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaFuncSetAttribute(topk_rows_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaGetLastError(); /* a refused hint must not surface as the next launch's error */
    *max_keys = (int32_t)keys;
    return cudaSuccess;
}

cudaError_t topk_alloc_scratch(struct cuda_alloc_count *a, unsigned long long **scratch)
{
    cudaError_t e = dev_malloc(a, scratch, TOPK_SCRATCH_WORDS * sizeof(unsigned long long));
    if (e == cudaSuccess)
        e = cudaMemset(*scratch + TOPK_MAX_MERGE, 0, sizeof(unsigned long long)); /* the arrival counter */
    return e;
}

cudaError_t launch_topk(const float *logits, int32_t V, float temperature, int32_t m,
                        const int32_t *gather, int32_t n_gather, unsigned long long *scratch,
                        int32_t *out_ids, float *out_vals, float *gather_vals, bool reference,
                        cudaStream_t s, const struct topk_draw *draw, bool pdl)
{
    if (draw && reference)
        return cudaErrorInvalidValue; /* the reference kernel only ranks */
    if (reference) {
        topk_ref_kernel<<<1, 1, 0, s>>>(logits, V, temperature, m, gather, n_gather, out_ids, out_vals,
                                        gather_vals);
        return cudaGetLastError();
    }
    int32_t nb = topk_slices(V), n_keys = nb * m;
    size_t smem = (size_t)(n_keys > TOPK_SLICE ? n_keys : TOPK_SLICE) * sizeof(unsigned long long);
    return launch_k(pdl, topk_kernel, dim3(nb), dim3(TOPK_THREADS), smem, s, logits, V, temperature, m, scratch,
                    (unsigned *)(scratch + TOPK_MAX_MERGE), gather, n_gather, out_ids, out_vals, gather_vals,
                    draw ? *draw : topk_draw{NULL, NULL, NULL, NULL, NULL});
}

cudaError_t launch_topk_rows(const struct topk_rows *rows, int32_t V, float temperature, int32_t m, cudaStream_t s)
{
    if (rows->n < 1 || rows->n > TOPK_MAX_ROWS)
        return cudaErrorInvalidValue;
    int32_t nb = topk_slices(V), n_keys = nb * m;
    size_t smem = (size_t)(n_keys > TOPK_SLICE ? n_keys : TOPK_SLICE) * sizeof(unsigned long long);
    topk_rows_kernel<<<dim3((unsigned)nb, (unsigned)rows->n), TOPK_THREADS, smem, s>>>(*rows, V, temperature, m);
    return cudaGetLastError();
}
