/*
 * sample.cu — one draw of the sampler on the GPU, so that a sampled generation (temperature,
 * top-k, top-p, min-p) can run several decode steps per graph with the token kept on the
 * device, as the greedy loop does with its argmax (cuda_session_generate_sampled).
 *
 * Input: topk.cu's m best tokens of the logits row, ranked by (logit / temperature, lower id
 * first), with their raw logits. The kernel repeats sampler.c's arithmetic for a sampler
 * without logit bias or penalties, in the same order and precision: the top k of that rank
 * (sampler_top_k keeps exactly them, in that order), each logit divided by the temperature
 * (IEEE, rounded to nearest), expf of its distance to the best, the sum in double, each
 * probability (float)(p / sum), the top-p prefix by a double running sum, the min-p cut, and
 * the draw u = splitmix64(state + (draw + 1) * golden) against a double running sum. The one
 * difference from the host is expf itself (CUDA's is within 2 ulp, glibc's within 1): a draw
 * can differ only where u lies within a few float ulps of a boundary between two tokens.
 *
 * One warp: the lanes divide and exponentiate, lane 0 runs the sums in the host's order. Like
 * the argmax kernel it writes the token as the next step's input, appends it to the out ids
 * at *step, and advances *step and the position.
 */
#include "backend/cuda/cuda_internal.cuh"

#define SAMPLE_GOLDEN 0x9e3779b97f4a7c15ull

/* The host sampler's renormalise: each of p[0..n) divided by their double sum. */
__device__ static void sample_renormalise(float *p, int32_t n)
{
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += p[i];
    for (int32_t i = 0; i < n; i++)
        p[i] = (float)(p[i] / sum);
}

/* uniform in [0, 1): the host's next_uniform for the state after draw + 1 steps */
__device__ static double sample_uniform(uint64_t state, int32_t draw)
{
    uint64_t z = state + (uint64_t)(draw + 1) * SAMPLE_GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* Lane 0: top-p, min-p and the draw over p[0..n) (probabilities of the ranked candidates). */
__device__ static int32_t sample_pick(float *p, int32_t n, const int32_t *ids, const struct cuda_sample_params *sp,
                                      int32_t draw)
{
    if (sp->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++)
            if ((cum += p[i]) >= sp->top_p) {
                keep = i + 1;
                break;
            }
        sample_renormalise(p, keep);
        n = keep;
    }
    if (sp->min_p > 0.0f) {
        float cut = sp->min_p * p[0];
        int32_t keep = 1;
        while (keep < n && p[keep] >= cut)
            keep++;
        sample_renormalise(p, keep);
        n = keep;
    }
    double u = sample_uniform(sp->rng, draw), cum = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (u < (cum += p[i]))
            return ids[i];
    return ids[n - 1];
}

__global__ void __launch_bounds__(32) sample_kernel(const int32_t *ids, const float *vals,
                                                    const struct cuda_sample_params *sp, int32_t *next_id,
                                                    int32_t *pos0, int32_t *out_ids, int32_t *step)
{
    __shared__ float p[CUDA_TOP_MAX_M];
    const float t = sp->temperature;
    const int32_t k = sp->top_k;
    const float mx = __fdiv_rn(vals[0], t); /* the best candidate's scaled logit */
    for (int32_t i = threadIdx.x; i < k; i += 32)
        p[i] = expf(__fdiv_rn(vals[i], t) - mx);
    __syncwarp();
    if (threadIdx.x)
        return;
    double sum = 0.0;
    for (int32_t i = 0; i < k; i++)
        sum += p[i];
    for (int32_t i = 0; i < k; i++)
        p[i] = (float)(p[i] / sum);
    int32_t draw = step ? *step : 0;
    int32_t id = sample_pick(p, k, ids, sp, draw);
    next_id[0] = id;
    if (step) {
        out_ids[draw] = id;
        (*step)++;
        (*pos0)++;
    }
}

cudaError_t launch_sample(const int32_t *ids, const float *vals, const struct cuda_sample_params *sp,
                          int32_t *next_id, int32_t *pos0, int32_t *out_ids, int32_t *step, cudaStream_t s)
{
    sample_kernel<<<1, 32, 0, s>>>(ids, vals, sp, next_id, pos0, out_ids, step);
    return cudaGetLastError();
}

bool cuda_sample_params_ok(const struct cuda_sample_params *sp)
{
    return sp && sp->temperature > 0.0f && sp->top_k >= 1 && sp->top_k < CUDA_TOP_MAX_M &&
           sp->top_p > 0.0f && sp->top_p <= 1.0f && sp->min_p >= 0.0f && sp->min_p <= 1.0f;
}

extern "C" qwenrt_status cuda_sample_host(const int32_t *ids, const float *vals, const struct cuda_sample_params *sp,
                                          int32_t draw, int32_t *id, struct qwenrt_error *err)
{
    if (!cuda_sample_params_ok(sp))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda sample: temperature %g, top_k %d (1 to %d), top_p %g, min_p %g",
                       sp ? (double)sp->temperature : 0.0, sp ? sp->top_k : 0, CUDA_TOP_MAX_M - 1,
                       sp ? (double)sp->top_p : 0.0, sp ? (double)sp->min_p : 0.0);
    if (draw < 0)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda sample: draw %d", draw);
    const int32_t k = sp->top_k;
    int32_t *d_ids = NULL, *d_words = NULL;
    float *d_vals = NULL;
    struct cuda_sample_params *d_sp = NULL;
    cudaError_t e = cudaMalloc(&d_ids, (size_t)k * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_vals, (size_t)k * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_sp, sizeof(*d_sp));
    if (e == cudaSuccess) /* next id, position, the out id at index draw, step */
        e = cudaMalloc(&d_words, (size_t)(draw + 4) * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMemcpy(d_ids, ids, (size_t)k * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_vals, vals, (size_t)k * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_sp, sp, sizeof(*sp), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_words + 2, &draw, sizeof(int32_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = launch_sample(d_ids, d_vals, d_sp, d_words, d_words + 1, d_words + 3, d_words + 2, 0);
    if (e == cudaSuccess)
        e = cudaMemcpy(id, d_words + 3 + draw, sizeof(int32_t), cudaMemcpyDeviceToHost);
    cudaFree(d_ids);
    cudaFree(d_vals);
    cudaFree(d_sp);
    cudaFree(d_words);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "cuda_sample_host");
    return QWENRT_OK;
}
