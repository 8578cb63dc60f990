/*
 * sample.cu — one draw of the sampler on the GPU (sample.cuh's arithmetic), so that a
 * sampled generation (temperature, top-k, top-p, min-p) runs several decode steps per graph
 * with the token kept on the device, as the greedy loop does with its argmax
 * (cuda_session_generate_sampled). The decode graphs draw inside topk.cu's last block; the
 * kernel here is the same draw on its own: what the tests compare with the host sampler
 * (cuda_sample_host), and the pick's timing (cuda_pick_bench).
 */
#include "backend/cuda/sample.cuh"

__global__ void __launch_bounds__(32) sample_kernel(const int32_t *ids, const float *vals,
                                                    const struct cuda_sample_params *sp, int32_t *next_id,
                                                    int32_t *pos0, int32_t *out_ids, int32_t *step)
{
    __shared__ float p[CUDA_TOP_MAX_M];
    sample_draw_warp(ids, vals, sp, next_id, pos0, out_ids, step, p);
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

/* Times (us per token, graphs of 50 back to back, median of reps) the greedy pick (the argmax
 * over 128 blocks, as the decode loop's) and the sampled one (topk.cu's m best, then the draw)
 * over a random row of V logits. */
extern "C" qwenrt_status cuda_pick_bench(int32_t V, int32_t m, int32_t reps, double *argmax_us, double *topk_us,
                                         double *sample_us, struct qwenrt_error *err)
{
    const int32_t per_graph = 50;
    int32_t max_keys = 0;
    CUDA_CHECK(topk_prepare(&max_keys));
    if (topk_scratch_keys(V, m, max_keys) < 0 || m >= CUDA_TOP_MAX_M || reps < 1 || reps > 64)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_pick_bench: V %d, m %d, reps %d", V, m, reps);
    float *h = (float *)malloc((size_t)V * sizeof(float));
    if (!h)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda_pick_bench: out of memory");
    uint32_t seed = 12345;
    for (int32_t i = 0; i < V; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (float)(seed >> 8) / (float)(1u << 24) * 30.0f - 15.0f;
    }
    float *row = NULL;
    int32_t *words = NULL;
    unsigned long long *keys = NULL;
    struct cuda_sample_params sp = {0.8f, 0.95f, 0.05f, m, 7}, *d_sp = NULL;
    struct argmax_scratch am = {NULL, NULL, 128};
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    qwenrt_status st = QWENRT_OK;
    cudaError_t e = cudaMalloc(&row, (size_t)V * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&words, (size_t)(2 * CUDA_TOP_MAX_M + 8 + per_graph) * sizeof(int32_t));
    if (e == cudaSuccess)
        e = topk_alloc_scratch(NULL, &keys);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_sp, sizeof(*d_sp));
    if (e == cudaSuccess)
        e = cudaMalloc(&am.part, 128 * sizeof(int2));
    if (e == cudaSuccess)
        e = cudaMalloc(&am.count, sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemset(am.count, 0, sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemcpy(row, h, (size_t)V * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_sp, &sp, sizeof(sp), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e1);
    int32_t *ids = words, *next = words + 2 * CUDA_TOP_MAX_M, *pos = next + 1, *step = next + 2, *out = next + 8;
    float *vals = (float *)(words + CUDA_TOP_MAX_M);
    double *res[3] = {argmax_us, topk_us, sample_us};
    for (int kind = 0; kind < 3 && e == cudaSuccess; kind++) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        for (int32_t i = 0; i < per_graph && e == cudaSuccess; i++) {
            struct topk_draw dr = {d_sp, next, pos, out, NULL};
            if (kind == 0)
                e = launch_argmax(row, V, next, NULL, NULL, NULL, s, false, &am);
            else /* the sampled decode loop's form: the draw in topk's last block */
                e = launch_topk(row, V, sp.temperature, m, NULL, 0, keys, ids, vals, NULL, false, s,
                                kind == 2 ? &dr : NULL);
        }
        cudaError_t ec = cudaStreamEndCapture(s, &g);
        e = e != cudaSuccess ? e : ec;
        if (e == cudaSuccess)
            e = cudaGraphInstantiate(&ge, g, 0);
        double t[64];
        for (int32_t r = -1; r < reps && e == cudaSuccess; r++) {
            float ms = 0.0f;
            e = cudaEventRecord(e0, s);
            if (e == cudaSuccess)
                e = cudaGraphLaunch(ge, s);
            if (e == cudaSuccess)
                e = cudaEventRecord(e1, s);
            if (e == cudaSuccess)
                e = cudaEventSynchronize(e1);
            if (e == cudaSuccess)
                e = cudaEventElapsedTime(&ms, e0, e1);
            if (r >= 0)
                t[r] = ms * 1e3 / per_graph;
        }
        for (int32_t i = 1; i < reps; i++) /* median */
            for (int32_t j = i; j > 0 && t[j] < t[j - 1]; j--) {
                double x = t[j];
                t[j] = t[j - 1], t[j - 1] = x;
            }
        if (e == cudaSuccess)
            *res[kind] = t[reps / 2];
        if (ge)
            cudaGraphExecDestroy(ge);
        if (g)
            cudaGraphDestroy(g);
    }
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_pick_bench");
    (void)step;
    free(h);
    cudaFree(row);
    cudaFree(words);
    cudaFree(keys);
    cudaFree(d_sp);
    cudaFree(am.part);
    cudaFree(am.count);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    return st;
}
