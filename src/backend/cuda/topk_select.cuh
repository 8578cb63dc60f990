/*
 * topk_select.cuh — the m best of n 64-bit keys by one block (a radix select over 8-bit digits
 * from the top), and the key that orders tokens for it: shared by topk.cu (a logits row's m
 * best) and lm_screen.cu (the m best of the screen's candidates, and the m-th largest of its
 * block maxima). The order and the select are described at the top of topk.cu.
 */
#ifndef QWENRT_BACKEND_CUDA_TOPK_SELECT_CUH
#define QWENRT_BACKEND_CUDA_TOPK_SELECT_CUH

#include "backend/cuda/cuda_internal.cuh"

#define TOPK_THREADS 512 /* the most threads a selecting block has */

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

/* The select's shared state: the digits fixed so far (prefix under mask), how many keys with
 * that prefix are still to take (r), and the digit histogram. */
struct topk_sel {
    unsigned hist[256];
    unsigned long long prefix, mask, wbest[TOPK_THREADS / 32];
    int32_t r, done;
    unsigned n_gt, n_eq;
};

/* Block-wide maximum of the n keys in s into *out (m = 1). */
static __device__ void topk_block_max(const unsigned long long *s, int32_t n, unsigned long long *out, struct topk_sel *st)
{
    unsigned long long b = 0;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
        b = s[i] > b ? s[i] : b;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long v = __shfl_xor_sync(0xffffffffu, b, o);
        b = v > b ? v : b;
    }
    if ((threadIdx.x & 31) == 0)
        st->wbest[threadIdx.x >> 5] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int32_t w = 1; w < (int32_t)(blockDim.x >> 5); w++)
            b = st->wbest[w] > b ? st->wbest[w] : b;
        *out = b;
    }
    __syncthreads();
}

/* Picks the digit of this pass (lanes of warp 0; lane l holds bins 255 - 8l down to
 * 248 - 8l): the bin in which the r-th largest candidate falls, counting from the top. */
static __device__ void topk_pick_digit(struct topk_sel *st, int shift)
{
    int lane = threadIdx.x & 31;
    unsigned c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        c[j] = st->hist[255 - 8 * lane - j];
        sum += c[j];
    }
    unsigned incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += v;
    }
    unsigned r = (unsigned)st->r;
    unsigned ballot = __ballot_sync(0xffffffffu, incl >= r); /* never empty: r <= candidates */
    if (lane != __ffs(ballot) - 1)
        return;
    unsigned above = incl - sum;
    int j = 0;
    while (j < 7 && above + c[j] < r)
        above += c[j++];
    st->r = (int32_t)(r - above);
    st->prefix |= (unsigned long long)(255 - 8 * lane - j) << shift;
    st->mask |= 255ull << shift;
    st->done = c[j] == r - above; /* the bin holds exactly what remains: all of it is taken */
}

/* The m largest of the n keys in s (n >= m; every thread of the block calls it) into
 * out[0..m), in no particular order. Equal keys (only the padding zeros can be equal) are
 * interchangeable. */
static __device__ void topk_block_select(const unsigned long long *s, int32_t n, int32_t m, unsigned long long *out,
                                  struct topk_sel *st)
{
    if (m == 1) {
        topk_block_max(s, n, out, st);
        return;
    }
    int lane = threadIdx.x & 31;
    if (threadIdx.x == 0)
        st->prefix = 0, st->mask = 0, st->r = m, st->done = 0, st->n_gt = 0, st->n_eq = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int32_t i = threadIdx.x; i < 256; i += blockDim.x)
            st->hist[i] = 0;
        __syncthreads();
        const unsigned long long pre = st->prefix, msk = st->mask;
        for (int32_t base = 0; base < n; base += blockDim.x) { /* whole warps: match_any below */
            int32_t i = base + threadIdx.x;
            unsigned long long key = i < n ? s[i] : 0;
            bool act = i < n && (key & msk) == pre;
            unsigned d = (unsigned)(key >> shift) & 255u;
            unsigned peers = __match_any_sync(0xffffffffu, act ? d : 256u);
            if (act && lane == __ffs(peers) - 1) /* one atomic per distinct digit in the warp */
                atomicAdd(&st->hist[d], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32)
            topk_pick_digit(st, shift);
        __syncthreads();
        if (st->done)
            break;
    }
    const unsigned long long pre = st->prefix, msk = st->mask;
    const int32_t r = st->r;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
        unsigned long long key = s[i], km = key & msk;
        if (km > pre) {
            out[atomicAdd(&st->n_gt, 1u)] = key; /* exactly m - r of them */
        } else if (km == pre) {
            unsigned e = atomicAdd(&st->n_eq, 1u);
            if ((int32_t)e < r)
                out[m - r + (int32_t)e] = key;
        }
    }
    __syncthreads();
}

/* The m keys (the m best, any order) ranked into out_ids / out_vals, best first: each key's
 * rank is the count of keys ahead of it, its value logits[id] (read through L2: other blocks of
 * the same launch may have written it). A padding key (0) ranks last as id 0, value -Inf. */
static __device__ void topk_write_ranked(const unsigned long long *keys, int32_t m, const float *logits,
                                         int32_t *out_ids, float *out_vals)
{
    for (int32_t i = threadIdx.x; i < m; i += blockDim.x) {
        const unsigned long long key = keys[i];
        int32_t rank = 0;
        for (int32_t j = 0; j < m; j++)
            rank += keys[j] > key || (keys[j] == key && j < i);
        const int32_t id = key ? topk_id(key) : 0;
        out_ids[rank] = id;
        out_vals[rank] = key ? __ldcg(logits + id) : -INFINITY;
    }
}

#endif
