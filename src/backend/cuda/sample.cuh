/*
 * sample.cuh — one draw of the sampler by one warp (sample_draw_warp), shared by sample.cu's
 * kernel and topk.cu's last block (which draws right after ranking the candidates, saving a
 * launch per token). The arithmetic is sampler.c's for a sampler without logit bias or
 * penalties: the top k in rank order, each logit divided by the temperature (IEEE, rounded to
 * nearest), expf of its distance to the best, probabilities (float)(p / sum) with the sum in
 * double, top-p as the shortest prefix whose running sum reaches top_p, the min-p cut, and
 * the draw u = splitmix64(state + (draw + 1) * golden) against the running sum. Two things
 * differ from the host: CUDA's expf (within 2 ulp, glibc's within 1), and the double sums
 * and running sums taken over the lanes (another order: equal to double rounding). So a draw
 * can differ from the host's only where u, or top_p, lies within a few float ulps of a
 * running sum.
 */
#ifndef QWENRT_BACKEND_CUDA_SAMPLE_CUH
#define QWENRT_BACKEND_CUDA_SAMPLE_CUH

#include "backend/cuda/cuda_internal.cuh"

#define SAMPLE_GOLDEN 0x9e3779b97f4a7c15ull

__device__ __forceinline__ double sample_warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* each of p[0..n) divided by their double sum (the softmax's last step, the host's
 * renormalise); every lane returns after the warp's stores */
__device__ __forceinline__ void sample_renormalise(float *p, int32_t n)
{
    double s = 0.0;
    for (int32_t i = threadIdx.x & 31; i < n; i += 32)
        s += p[i];
    s = sample_warp_sum(s);
    for (int32_t i = threadIdx.x & 31; i < n; i += 32)
        p[i] = (float)(p[i] / s);
    __syncwarp();
}

/* The first i < n whose running sum p[0] + ... + p[i] reaches target (cum >= target, or
 * with strict target < cum), -1 when none does: 32 at a time, a scan over the lanes. */
__device__ __forceinline__ int32_t sample_first_reaching(const float *p, int32_t n, double target, bool strict)
{
    const int lane = threadIdx.x & 31;
    double carry = 0.0;
    for (int32_t base = 0; base < n; base += 32) {
        int32_t i = base + lane;
        double v = i < n ? (double)p[i] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            double t = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o)
                v += t;
        }
        double cum = carry + v;
        unsigned hit = __ballot_sync(0xffffffffu, i < n && (strict ? target < cum : cum >= target));
        if (hit)
            return base + __ffs(hit) - 1;
        carry += __shfl_sync(0xffffffffu, v, 31);
    }
    return -1;
}

/* uniform in [0, 1): the host's next_uniform for the state after draw + 1 steps */
__device__ __forceinline__ double sample_uniform(uint64_t state, int32_t draw)
{
    uint64_t z = state + (uint64_t)(draw + 1) * SAMPLE_GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* One warp: the draw over the ranked candidates ids / vals (raw logits, sp->top_k of them)
 * with p [CUDA_TOP_MAX_M] of shared memory; next_id[0] = the token, and with step non-NULL
 * out_ids[*step] = it, (*step)++, (*pos0)++ (the draw number is *step, 0 without step). */
__device__ __forceinline__ void sample_draw_warp(const int32_t *ids, const float *vals,
                                                 const struct cuda_sample_params *sp, int32_t *next_id,
                                                 int32_t *pos0, int32_t *out_ids, int32_t *step, float *p)
{
    const int lane = threadIdx.x & 31;
    const float t = sp->temperature, top_p = sp->top_p, min_p = sp->min_p;
    const int32_t k = sp->top_k;
    const float mx = __fdiv_rn(vals[0], t); /* the best candidate's scaled logit */
    for (int32_t i = lane; i < k; i += 32)
        p[i] = expf(__fdiv_rn(vals[i], t) - mx);
    __syncwarp();
    int32_t n = k;
    sample_renormalise(p, n);
    if (top_p < 1.0f) {
        int32_t at = sample_first_reaching(p, n, (double)top_p, false);
        n = at < 0 ? n : at + 1;
        sample_renormalise(p, n);
    }
    if (min_p > 0.0f) {
        float cut = min_p * p[0];
        int32_t keep = n;
        for (int32_t base = 0; base < n; base += 32) { /* the first below the cut ends the prefix */
            int32_t i = base + lane;
            unsigned below = __ballot_sync(0xffffffffu, i >= 1 && i < n && !(p[i] >= cut));
            if (below) {
                keep = base + __ffs(below) - 1;
                break;
            }
        }
        n = keep;
        sample_renormalise(p, n);
    }
    int32_t draw = step ? *step : 0;
    int32_t at = sample_first_reaching(p, n, sample_uniform(sp->rng, draw), true);
    if (lane)
        return;
    int32_t id = ids[at < 0 ? n - 1 : at];
    next_id[0] = id;
    if (step) {
        out_ids[draw] = id;
        (*step)++;
        (*pos0)++;
    }
}

#endif
