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
 * Two launches: topk_slices_kernel sorts slices of TOPK_SLICE logits in shared memory (bitonic)
 * and keeps each slice's m best keys; topk_merge_kernel sorts those nb x m keys in one block and
 * writes the m best ids with their raw (unscaled) logits. The same launch gathers the raw
 * logits of up to TOPK_MAX_GATHER given ids (the tokens the sampler's logit bias and penalties
 * touch). A reference kernel beside it (topk_ref_kernel: one thread, m passes over the row)
 * is what test_cuda_backend compares against.
 */
#include "backend/cuda/cuda_internal.cuh"

#define TOPK_SLICE 4096       /* logits per block in the first pass */
#define TOPK_SLICE_THREADS 512

__device__ __forceinline__ unsigned long long topk_key(float l, float temperature, int32_t id)
{
    float v = __fdiv_rn(l, temperature); /* logit / temperature, as the host computes it */
    uint32_t u = __float_as_uint(v);
    uint32_t hi = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)hi << 32) | (0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ int32_t topk_id(unsigned long long key)
{
    return (int32_t)(0xffffffffu - (uint32_t)(key & 0xffffffffull));
}

/* Sorts n keys (a power of two) in shared memory into descending order (bitonic network). */
__device__ void topk_sort_desc(unsigned long long *s, int32_t n)
{
    for (int32_t k = 2; k <= n; k <<= 1)
        for (int32_t j = k >> 1; j > 0; j >>= 1) {
            for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
                int32_t p = i ^ j;
                if (p <= i)
                    continue;
                unsigned long long a = s[i], b = s[p];
                bool desc = (i & k) == 0; /* this pair's run ends up descending */
                if (desc ? a < b : a > b) {
                    s[i] = b;
                    s[p] = a;
                }
            }
            __syncthreads();
        }
}

__global__ void __launch_bounds__(TOPK_SLICE_THREADS)
topk_slices_kernel(const float *logits, int32_t V, float temperature, int32_t m,
                   unsigned long long *best)
{
    __shared__ unsigned long long s[TOPK_SLICE];
    int64_t base = (int64_t)blockIdx.x * TOPK_SLICE;
    for (int32_t i = threadIdx.x; i < TOPK_SLICE; i += blockDim.x) {
        int64_t t = base + i;
        s[i] = t < V ? topk_key(logits[t], temperature, (int32_t)t) : 0ull;
    }
    __syncthreads();
    topk_sort_desc(s, TOPK_SLICE);
    for (int32_t i = threadIdx.x; i < m; i += blockDim.x)
        best[(int64_t)blockIdx.x * m + i] = s[i];
}

__global__ void __launch_bounds__(1024)
topk_merge_kernel(const float *logits, const unsigned long long *best, int32_t n_keys, int32_t n_pow2,
                  int32_t m, const int32_t *gather, int32_t n_gather, int32_t *out_ids,
                  float *out_vals, float *gather_vals)
{
    extern __shared__ unsigned long long s[];
    for (int32_t i = threadIdx.x; i < n_pow2; i += blockDim.x)
        s[i] = i < n_keys ? best[i] : 0ull;
    for (int32_t i = threadIdx.x; i < n_gather; i += blockDim.x)
        gather_vals[i] = logits[gather[i]];
    __syncthreads();
    topk_sort_desc(s, n_pow2);
    for (int32_t i = threadIdx.x; i < m; i += blockDim.x) {
        int32_t id = topk_id(s[i]);
        out_ids[i] = id;
        out_vals[i] = logits[id];
    }
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

static int32_t pow2_at_least(int32_t n)
{
    int32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* Keys of scratch that launch_topk needs for a row of V logits and m results, or -1 when the
 * merge would not fit one block's shared memory (nb x m > max_keys, topk_prepare's limit). */
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
    /* the merge sorts a power of two of 8-byte keys: as many as this device's blocks hold */
    int32_t keys = TOPK_MAX_MERGE;
    while (keys > 64 && (size_t)keys * sizeof(unsigned long long) > (size_t)optin)
        keys >>= 1;
    e = cudaFuncSetAttribute(topk_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(keys * sizeof(unsigned long long)));
    if (e != cudaSuccess)
        return e;
    /* the largest shared-memory carveout, as the decode megakernel needs (a multiprocessor
     * switching carveouts between kernels has to drain first); a hint, so a refusal is fine */
    cudaFuncSetAttribute(topk_merge_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaFuncSetAttribute(topk_slices_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaGetLastError(); /* a refused hint must not surface as the next launch's error */
    *max_keys = keys;
    return cudaSuccess;
}

cudaError_t launch_topk(const float *logits, int32_t V, float temperature, int32_t m,
                        const int32_t *gather, int32_t n_gather, unsigned long long *scratch,
                        int32_t *out_ids, float *out_vals, float *gather_vals, bool reference,
                        cudaStream_t s)
{
    if (reference) {
        topk_ref_kernel<<<1, 1, 0, s>>>(logits, V, temperature, m, gather, n_gather, out_ids, out_vals,
                                        gather_vals);
        return cudaGetLastError();
    }
    int32_t nb = topk_slices(V), n_keys = nb * m, n_pow2 = pow2_at_least(n_keys);
    size_t smem = (size_t)n_pow2 * sizeof(unsigned long long);
    topk_slices_kernel<<<nb, TOPK_SLICE_THREADS, 0, s>>>(logits, V, temperature, m, scratch);
    topk_merge_kernel<<<1, 1024, smem, s>>>(logits, scratch, n_keys, n_pow2, m, gather, n_gather, out_ids,
                                            out_vals, gather_vals);
    return cudaGetLastError();
}
