/*
 * cuda_microbench.cu — measurements without a session: the launch floor (a chain of empty
 * kernels in one graph, with or without PDL and clusters: cuda_launch_floor_bench), one GEMV
 * kernel alone over random weights (cuda_gemv_bench, optionally with its block time line),
 * the argmax (cuda_argmax) and the SM clock a kernel sees (cuda_sm_clock), for cuda_bench and
 * the CUDA tests (tests/test_cuda_ops.c); the screened LM head's pick by phases
 * (cuda_lm_screen_phases); and for the tests, device memory held as by another program
 * (cuda_test_hold_memory); for the bench, the context reset (cuda_bench_device_reset).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_session.cuh"


#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ SM clock */

/* Every block spins warm_ns (the clocks leave idle); then block 0 counts cycles over ns. */
__global__ void sm_clock_kernel(unsigned long long warm_ns, unsigned long long ns, unsigned long long *out)
{
    const unsigned long long start = globaltimer_ns();
    while (globaltimer_ns() - start < warm_ns) {
    }
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    const long long c0 = clock64();
    const unsigned long long t0 = globaltimer_ns();
    unsigned long long t = t0;
    while (t - t0 < ns)
        t = globaltimer_ns();
    out[0] = (unsigned long long)(clock64() - c0), out[1] = t - t0;
}

extern "C" qwenrt_status cuda_sm_clock(int32_t warm_ms, int32_t ms, double *mhz, double *rated_mhz,
                                       struct qwenrt_error *err)
{
    if (warm_ms < 1 || warm_ms > 1000 || ms < 1 || ms > 1000)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_sm_clock: warm_ms %d and ms %d must lie in 1-1000",
                       (int)warm_ms, (int)ms);
    int dev = 0, sms = 0, khz = 0;
    unsigned long long *d = NULL, h[2] = {0, 0};
    cudaError_t e;
    if (!(e = cudaGetDevice(&dev)) && !(e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) &&
        !(e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev)) && !(e = cudaMalloc(&d, sizeof(h)))) {
        sm_clock_kernel<<<sms, 32>>>(1000000ull * (unsigned)warm_ms, 1000000ull * (unsigned)ms, d);
        if (!(e = cudaGetLastError()) && !(e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost)))
            *mhz = h[1] ? 1e3 * (double)h[0] / (double)h[1] : 0.0, *rated_mhz = khz / 1e3;
    }
    cudaFree(d);
    return e ? cuda_fail(err, e, __FILE__, __LINE__, "cuda_sm_clock") : QWENRT_OK;
}

/* ------------------------------------------------------------------ launch floor */

/* The least a decode launch can cost: each block reads and writes one float the launch
 * before it wrote, nothing else. */
__global__ void floor_kernel(float *p)
{
    griddep_launch();
    griddep_wait();
    if (threadIdx.x == 0)
        p[blockIdx.x] += 1.0f;
}

extern "C" qwenrt_status cuda_launch_floor_bench(int32_t n_launch, int32_t blocks, int32_t threads, int32_t cluster,
                                                 bool pdl, int32_t reps, double *us, struct qwenrt_error *err)
{
    if (n_launch < 1 || blocks < 1 || threads < 32 || threads > 1024 || reps < 1 || reps > 64 || cluster < 0 ||
        cluster > 8 || (cluster > 1 && blocks % cluster))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_launch_floor_bench: bad arguments");
    float *p = NULL;
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float t[64];
    cudaError_t e = cudaMalloc(&p, (size_t)blocks * sizeof(float));
    if (!e) e = cudaMemset(p, 0, (size_t)blocks * sizeof(float));
    if (!e) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (!e) e = cudaEventCreate(&e0);
    if (!e) e = cudaEventCreate(&e1);
    if (!e) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int32_t i = 0; !e && i < n_launch; i++)
        e = launch_kc(pdl, cluster, floor_kernel, dim3(blocks), dim3(threads), 0, s, p);
    if (s) {
        cudaError_t e2 = cudaStreamEndCapture(s, &g);
        e = e ? e : e2;
    }
    if (!e) e = cudaGraphInstantiate(&ge, g, 0);
    for (int32_t r = -1; !e && r < reps; r++) { /* r = -1 warms up */
        if (!(e = cudaEventRecord(e0, s)) && !(e = cudaGraphLaunch(ge, s)) && !(e = cudaEventRecord(e1, s)) &&
            !(e = cudaEventSynchronize(e1)) && r >= 0)
            e = cudaEventElapsedTime(&t[r], e0, e1);
    }
    if (!e)
        *us = 1e3 * median_of_floats(t, reps) / n_launch;
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cudaFree(p);
    return e ? cuda_fail(err, e, __FILE__, __LINE__, "cuda_launch_floor_bench") : QWENRT_OK;
}

/* ------------------------------------------------------------------ GEMV microbenchmark */

__global__ void bench_fill_kernel(uint16_t *p, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (uint16_t)(0x3C00u | (h & 0x3FFu) | ((h >> 16) & 0x8000u)); /* no NaN, no zero */
    }
}

struct bench_bufs {
    uint8_t *w;
    float *x, *nw, *y;
    unsigned long long *stamps; /* gemv_smem's per-block stamps, [reps][blocks][TL_SLOTS] */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaEvent_t e0, e1;
};

static void bench_bufs_free(struct bench_bufs *b)
{
    if (b->ge) cudaGraphExecDestroy(b->ge);
    if (b->g) cudaGraphDestroy(b->g);
    if (b->e0) cudaEventDestroy(b->e0);
    if (b->e1) cudaEventDestroy(b->e1);
    cudaFree(b->w);
    cudaFree(b->x);
    cudaFree(b->nw);
    cudaFree(b->y);
    cudaFree(b->stamps);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_d(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n ? v[n / 2] : 0;
}

/* The timeline of a chain of gemv_smem launches from their stamps (us), medians over launches
 * 1..reps-1 of: [0] the first block's start after the launch before ended (its last block),
 * [1] the share of blocks that started before it ended, [2] a block's griddep_wait release after
 * it ended (median block), [3] x staged and weights in shared memory after the release, [4]
 * the dot products and stores, [5] the last block's end after the launch before's. */
static void gemv_timeline(const unsigned long long *h, int reps, int nb, double *tl)
{
    double *col[6], *tmp = (double *)malloc(sizeof(double) * (size_t)nb * 3);
    for (int j = 0; j < 6; j++)
        col[j] = (double *)calloc((size_t)reps, sizeof(double));
    for (int k = 1; k < reps && tmp && col[5]; k++) {
        const unsigned long long *p = h + (size_t)(k - 1) * nb * TL_SLOTS, *c = h + (size_t)k * nb * TL_SLOTS;
        unsigned long long prev_end = 0, first = ~0ull, last = 0;
        int early = 0;
        for (int b = 0; b < nb; b++) {
            prev_end = p[TL_SLOTS * b + 3] > prev_end ? p[TL_SLOTS * b + 3] : prev_end;
            last = c[TL_SLOTS * b + 3] > last ? c[TL_SLOTS * b + 3] : last;
            first = c[TL_SLOTS * b] < first ? c[TL_SLOTS * b] : first;
        }
        for (int b = 0; b < nb; b++) {
            early += c[TL_SLOTS * b] < prev_end;
            tmp[b] = ((double)c[TL_SLOTS * b + 1] - (double)prev_end) / 1e3;
            tmp[nb + b] = ((double)c[TL_SLOTS * b + 2] - (double)c[TL_SLOTS * b + 1]) / 1e3;
            tmp[2 * nb + b] = ((double)c[TL_SLOTS * b + 3] - (double)c[TL_SLOTS * b + 2]) / 1e3;
        }
        col[0][k - 1] = ((double)first - (double)prev_end) / 1e3;
        col[1][k - 1] = (double)early / nb;
        col[2][k - 1] = median_d(tmp, nb);
        col[3][k - 1] = median_d(tmp + nb, nb);
        col[4][k - 1] = median_d(tmp + 2 * nb, nb);
        col[5][k - 1] = ((double)last - (double)prev_end) / 1e3;
    }
    for (int j = 0; j < 6; j++) {
        tl[j] = col[j] && tmp ? median_d(col[j], reps - 1) : 0;
        free(col[j]);
    }
    free(tmp);
}

static qwenrt_status gemv_bench_run(struct bench_bufs *b, int32_t dtype, int32_t N, int32_t K,
                                    int32_t T, bool norm, int32_t kernel, bool pdl, int32_t reps,
                                    double *us, double *gbs, double *timeline, struct qwenrt_error *err)
{
    size_t rb = 0;
    if (!gemv_supports(dtype) || !dtype_row_bytes((enum qr_dtype)dtype, K, &rb) || T < 1 ||
        T > (kernel >= 4 ? GEMV_BATCH_MMA_MAX_T : GEMV_MAX_T) || N < 1 || reps < 1 || kernel < 0 || kernel > 5)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_gemv_bench: bad arguments");
    size_t mat = rb * (size_t)N;
    int copies = (int)((256u << 20) / mat) + 1; /* rotate through > 256 MB: not the L2 */
    copies = copies > 64 ? 64 : copies;
    size_t stride = (mat + 255) & ~(size_t)255;
    CUDA_CHECK(cudaMalloc(&b->w, stride * copies));
    CUDA_CHECK(cudaMalloc(&b->x, (size_t)T * K * 4));
    CUDA_CHECK(cudaMalloc(&b->nw, (size_t)K * 4));
    CUDA_CHECK(cudaMalloc(&b->y, (size_t)T * N * 4));
    bench_fill_kernel<<<1024, 256>>>((uint16_t *)b->w, (int64_t)(stride * copies / 2), 1u);
    bench_fill_kernel<<<64, 256>>>((uint16_t *)b->x, (int64_t)T * K * 2, 2u);
    bench_fill_kernel<<<64, 256>>>((uint16_t *)b->nw, (int64_t)K * 2, 3u);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t s = NULL;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int dev = 0, n_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    struct gemv_args a;
    memset(&a, 0, sizeof(a));
    a.x = b->x, a.ldx = K, a.K = K, a.T = T, a.norm_w = norm ? b->nw : NULL, a.eps = 1e-6f;
    a.dtype = dtype, a.mode = GEMV_STORE, a.n_seg = 1, a.pdl = pdl, a.v2 = kernel > 0, a.n_sm = n_sm;
    a.smem = kernel == 2, a.batch = kernel >= 3, a.batch_mma = kernel >= 4, a.q_int8 = kernel == 5;
    a.seg[0].N = N, a.seg[0].row_bytes = (int64_t)rb, a.seg[0].y = b->y, a.seg[0].ldy = N;
    a.seg[0].w = b->w;
    int32_t nb = timeline ? gemv_smem_blocks(&a) : 0;
    if (nb > 0)
        CUDA_CHECK(cudaMalloc(&b->stamps, sizeof(unsigned long long) * TL_SLOTS * (size_t)nb * reps));
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int32_t i = 0; i < reps && e == cudaSuccess; i++) {
        a.seg[0].w = b->w + stride * (size_t)(i % copies);
        a.stamps = nb > 0 ? b->stamps + TL_SLOTS * (size_t)nb * i : NULL;
        e = launch_gemv(&a, s);
    }
    cudaError_t e2 = cudaStreamEndCapture(s, &b->g);
    if (e == cudaSuccess)
        e = e2;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&b->ge, b->g, 0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b->e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b->e1);
    float t[7];
    for (int i = -1; i < 7 && e == cudaSuccess; i++) {
        e = cudaEventRecord(b->e0, s);
        if (e == cudaSuccess)
            e = cudaGraphLaunch(b->ge, s);
        if (e == cudaSuccess)
            e = cudaEventRecord(b->e1, s);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(b->e1);
        if (e == cudaSuccess && i >= 0)
            e = cudaEventElapsedTime(&t[i], b->e0, b->e1);
    }
    cudaStreamDestroy(s);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "gemv bench");
    *us = (double)median_of_floats(t, 7) * 1e3 / reps;
    *gbs = (double)mat / (*us * 1e-6) / 1e9;
    if (nb > 0 && reps > 1) { /* the last replay's stamps */
        size_t n = TL_SLOTS * (size_t)nb * reps;
        unsigned long long *h = (unsigned long long *)malloc(n * sizeof(*h));
        if (!h)
            return err_set(err, QWENRT_ERR_NOMEM, "gemv bench: out of memory");
        e = cudaMemcpy(h, b->stamps, n * sizeof(*h), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            gemv_timeline(h, reps, nb, timeline);
        free(h);
        if (e != cudaSuccess)
            return cuda_fail(err, e, __FILE__, __LINE__, "gemv bench stamps");
    }
    return QWENRT_OK;
}

/* cuda_argmax's device part: x copied in, one argmax launch (sc), the id copied back. */
static qwenrt_status argmax_run(const float *x, int32_t n, bool misalign, float *d_x, int32_t *d_id,
                                const struct argmax_scratch *sc, int32_t *id, struct qwenrt_error *err)
{
    float *dx = d_x + (misalign ? 1 : 0);
    CUDA_CHECK(cudaMemcpy(dx, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(launch_argmax(dx, n, d_id, NULL, NULL, NULL, 0, false, sc));
    CUDA_CHECK(cudaMemcpy(id, d_id, sizeof(int32_t), cudaMemcpyDeviceToHost));
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_argmax(const float *x, int32_t n, bool misalign, int32_t blocks, int32_t *id,
                                     struct qwenrt_error *err)
{
    *id = 0;
    if (!x || n < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_argmax: %d values", (int)n);
    if (blocks < 1 || blocks > ARGMAX_BLOCKS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_argmax: %d blocks (1 to %d)", (int)blocks,
                       ARGMAX_BLOCKS_LIMIT);
    float *d_x = NULL;
    int32_t *d_id = NULL;
    struct argmax_scratch sc = {NULL, NULL, blocks};
    cudaError_t e = cudaMalloc(&d_x, ((size_t)n + 4) * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_id, sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc(&sc.part, (size_t)blocks * sizeof(int2));
    if (e == cudaSuccess)
        e = cudaMalloc(&sc.count, sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemset(sc.count, 0, sizeof(unsigned));
    qwenrt_status st = e != cudaSuccess ? cuda_fail(err, e, __FILE__, __LINE__, "cudaMalloc")
                                        : argmax_run(x, n, misalign, d_x, d_id, &sc, id, err);
    cudaFree(d_x);
    cudaFree(d_id);
    cudaFree(sc.part);
    cudaFree(sc.count);
    return st;
}

/* ------------------------------------------------------------------ the screened pick's phases */

/* One pick's phases (us) from its stamps (lm_screen.cu's PICK_STAMPS), into col[j][rep]. */
static void pick_phases(const unsigned long long *t, double **col, int rep)
{
    const int last = LM_SCREEN_PICK_STAMPS - 4, nb = last / 3;
    unsigned long long entry = ~0ull, bound = 0, rows = 0;
    for (int b = 0; b < nb; b++) {
        entry = t[3 * b] < entry ? t[3 * b] : entry;
        bound = t[3 * b + 1] > bound ? t[3 * b + 1] : bound;
        rows = t[3 * b + 2] > rows ? t[3 * b + 2] : rows;
    }
    const double at[7] = {(double)entry, (double)bound, (double)rows, (double)t[last], (double)t[last + 1],
                          (double)t[last + 2], (double)t[last + 3]};
    for (int j = 0; j < 6; j++)
        col[j][rep] = (at[j + 1] - at[j]) * 1e-3;
    col[6][rep] = (at[6] - at[0]) * 1e-3;
}

/* cuda_lm_screen_phases' device part: d holds h [K], norm_w [K], then the rows. */
static qwenrt_status phases_run(uint8_t *d, int32_t N, int32_t K, int32_t m, int32_t reps, double *us,
                                struct qwenrt_error *err)
{
    struct lm_screen *sc = NULL;
    int32_t *d_ids = NULL, *d_top_ids = NULL;
    float *d_row = NULL, *d_top_vals = NULL;
    struct cuda_sample_params *d_sp = NULL;
    unsigned long long *d_stamps = NULL, h_stamps[LM_SCREEN_PICK_STAMPS];
    double *col[7] = {NULL};
    qwenrt_status st = lm_screen_build(d + 8 * (size_t)K, QR_BF16, N, K, 2 * (int64_t)K, 0, &sc, err);
    if (st || !sc)
        return st ? st : err_set(err, QWENRT_ERR_BACKEND, "cuda_lm_screen_phases: the screen declined the rows");
    const struct cuda_sample_params sp = {0.8f, 0.95f, 0.05f, m, 12345};
    cudaError_t e = cudaMalloc(&d_ids, 4 * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_row, (size_t)N * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_top_ids, 256 * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_top_vals, 256 * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_sp, sizeof(sp));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_stamps, sizeof(h_stamps));
    if (e == cudaSuccess)
        e = cudaMemcpy(d_sp, &sp, sizeof(sp), cudaMemcpyHostToDevice);
    bool have_cols = true;
    for (int j = 0; j < 7; j++)
        have_cols = (col[j] = (double *)calloc((size_t)reps, sizeof(double))) != NULL && have_cols;
    struct lm_screen_args a = {(const float *)d, (const float *)d + K, 1e-6f, d + 8 * (size_t)K, QR_BF16, 2 * (int64_t)K,
                               d_ids, NULL, NULL, NULL, false, d_stamps};
    const struct lm_screen_sampled smp = {m, sp.temperature, d_row, d_top_ids, d_top_vals, d_sp};
    for (int32_t r = 0; r < reps && e == cudaSuccess && have_cols; r++) {
        e = m ? launch_lm_screen_sampled(sc, &a, &smp, 0) : launch_lm_screen(sc, &a, 0);
        if (e == cudaSuccess)
            e = cudaMemcpy(h_stamps, d_stamps, sizeof(h_stamps), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            pick_phases(h_stamps, col, r);
    }
    int64_t picks = 0, rows = 0;
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "the screened pick's phases");
    else if (!have_cols)
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda_lm_screen_phases: out of memory");
    else if (!(st = lm_screen_counts(sc, &picks, &rows, err))) {
        for (int j = 0; j < 7; j++)
            us[j] = median_d(col[j], reps);
        us[7] = picks ? (double)rows / (double)picks : 0.0;
    }
    for (int j = 0; j < 7; j++)
        free(col[j]);
    cudaFree(d_ids), cudaFree(d_row), cudaFree(d_top_ids), cudaFree(d_top_vals), cudaFree(d_sp), cudaFree(d_stamps);
    lm_screen_free(sc);
    return st;
}

extern "C" qwenrt_status cuda_lm_screen_phases(int32_t N, int32_t K, int32_t m, int32_t reps, double *us,
                                               struct qwenrt_error *err)
{
    if (N < 1 || K < 32 || K % 32 || K > LM_SCREEN_MAX_K || m < 0 || m > 255 || reps < 1 || reps > 1000)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_lm_screen_phases: %d rows of %d, m %d, %d picks", (int)N,
                       (int)K, (int)m, (int)reps);
    float *hn = (float *)malloc(8 * (size_t)K); /* h, then the norm weights */
    uint8_t *d = NULL;
    if (!hn)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda_lm_screen_phases: out of memory");
    for (int32_t k = 0; k < K; k++)
        hn[k] = (float)((k * 37) % 101 - 50) * 0.04f, hn[K + k] = 1.0f;
    cudaError_t e = cudaMalloc(&d, 8 * (size_t)K + (size_t)N * K * 2);
    if (e == cudaSuccess)
        e = cudaMemcpy(d, hn, 8 * (size_t)K, cudaMemcpyHostToDevice);
    free(hn);
    if (e == cudaSuccess) { /* the rows: bench_fill_kernel's bits read as BF16: 2^-7 to 2, either sign */
        bench_fill_kernel<<<1024, 256>>>((uint16_t *)(d + 8 * (size_t)K), (int64_t)N * K, 7u);
        e = cudaGetLastError();
    }
    qwenrt_status st = e == cudaSuccess ? phases_run(d, N, K, m, reps, us, err)
                                        : cuda_fail(err, e, __FILE__, __LINE__, "the screened pick's phases");
    cudaFree(d);
    return st;
}

/* ------------------------------------------------------------------ a GPU nearly full */

#define HOLD_MAX_CHUNKS 256

struct cuda_memory_hold {
    void *chunk[HOLD_MAX_CHUNKS];
    int n;
};

extern "C" void cuda_test_release_memory(struct cuda_memory_hold *hold)
{
    if (!hold)
        return;
    for (int i = 0; i < hold->n; i++)
        cudaFree(hold->chunk[i]);
    free(hold);
}

extern "C" qwenrt_status cuda_test_hold_memory(int64_t leave_bytes, struct cuda_memory_hold **hold,
                                               struct qwenrt_error *err)
{
    *hold = NULL;
    struct cuda_memory_hold *h = (struct cuda_memory_hold *)calloc(1, sizeof(*h));
    if (!h)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda_test_hold_memory: out of memory");
    const size_t step = (size_t)2 << 20; /* cudaMalloc's granularity */
    size_t free_b = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total);
    while (e == cudaSuccess && (int64_t)free_b > leave_bytes && h->n < HOLD_MAX_CHUNKS) {
        size_t want = ((size_t)((int64_t)free_b - leave_bytes) + step - 1) / step * step;
        void *p = NULL;
        while (want >= step && cudaMalloc(&p, want) != cudaSuccess)
            want /= 2;
        cudaGetLastError(); /* a refused size is no error here */
        if (want < step)
            break; /* nothing more is granted */
        h->chunk[h->n++] = p;
        e = cudaMemGetInfo(&free_b, &total);
    }
    if (e != cudaSuccess) {
        cuda_test_release_memory(h);
        return cuda_fail(err, e, __FILE__, __LINE__, "holding device memory");
    }
    *hold = h;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_device_memory(int64_t *free_bytes, int64_t *total_bytes, struct qwenrt_error *err)
{
    size_t free_b = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total);
    *free_bytes = (int64_t)free_b, *total_bytes = (int64_t)total;
    return e == cudaSuccess ? QWENRT_OK : cuda_fail(err, e, __FILE__, __LINE__, "cudaMemGetInfo");
}

extern "C" qwenrt_status cuda_bench_device_reset(struct qwenrt_error *err)
{
    cudaError_t e = cudaDeviceReset();
    return e == cudaSuccess ? QWENRT_OK : cuda_fail(err, e, __FILE__, __LINE__, "cudaDeviceReset");
}

extern "C" qwenrt_status cuda_bench_plain_launches(int32_t n, bool memsets, struct qwenrt_error *err)
{
    if (n < 1 || n > 100000)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_bench_plain_launches: %d launches (1 to 100,000)", (int)n);
    float *p = NULL;
    cudaStream_t s = NULL;
    cudaError_t e = cudaMalloc(&p, 4 * sizeof(float));
    if (!e) e = cudaMemset(p, 0, 4 * sizeof(float));
    if (!e) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int32_t i = 0; !e && i < n; i++) {
        if (memsets) {
            e = cudaMemsetAsync(p, 0, sizeof(float), s);
        } else {
            floor_kernel<<<1, 32, 0, s>>>(p);
            e = cudaGetLastError();
        }
    }
    if (!e) e = cudaStreamSynchronize(s);
    if (s) cudaStreamDestroy(s);
    cudaFree(p);
    return e == cudaSuccess ? QWENRT_OK : cuda_fail(err, e, __FILE__, __LINE__, "the plain launches");
}

extern "C" void cuda_bench_streams_free(int32_t n, void **streams)
{
    for (int32_t i = 0; i < n; i++)
        if (streams[i])
            cudaStreamDestroy((cudaStream_t)streams[i]);
}

extern "C" qwenrt_status cuda_bench_streams(int32_t n, void **streams, struct qwenrt_error *err)
{
    if (n < 1 || n > 64)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_bench_streams: %d streams (1 to 64)", (int)n);
    memset(streams, 0, (size_t)n * sizeof(void *));
    for (int32_t i = 0; i < n; i++) {
        cudaStream_t s = NULL;
        cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            cuda_bench_streams_free(i, streams);
            memset(streams, 0, (size_t)n * sizeof(void *));
            return cuda_fail(err, e, __FILE__, __LINE__, "cuda_bench_streams");
        }
        streams[i] = s;
    }
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_bench_alloc_churn(int32_t n_big, int32_t n_small, struct qwenrt_error *err)
{
    if (n_big < 0 || n_big > 64 || n_small < 0 || n_small > 64)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_bench_alloc_churn: %d and %d blocks (0 to 64 each)",
                       (int)n_big, (int)n_small);
    void *p[128] = {NULL};
    cudaError_t e = cudaSuccess;
    int n = 0;
    for (; n < n_big + n_small && e == cudaSuccess; n++)
        e = cudaMalloc(&p[n], n < n_big ? (size_t)32 << 20 : (size_t)64 << 10);
    for (int i = 0; i < n; i++)
        cudaFree(p[i]);
    return e == cudaSuccess ? QWENRT_OK : cuda_fail(err, e, __FILE__, __LINE__, "cuda_bench_alloc_churn");
}

extern "C" qwenrt_status cuda_bench_stream_churn(int32_t n, struct qwenrt_error *err)
{
    if (n < 1 || n > 1024)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_bench_stream_churn: %d streams (1 to 1,024)", (int)n);
    for (int32_t i = 0; i < n; i++) {
        cudaStream_t s = NULL;
        cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaStreamDestroy(s);
        if (e != cudaSuccess)
            return cuda_fail(err, e, __FILE__, __LINE__, "cudaStreamCreateWithFlags, cudaStreamDestroy");
    }
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ the screened LM head */

/* cuda_lm_screen_pick's device part: the inputs at d (h, norm_w, the rows, the id, then the
 * logits row and the m best's ids and values), reps picks. */
static qwenrt_status screen_pick_run(uint8_t *d, float eps, int32_t dtype, int32_t N, int32_t K, int64_t row_bytes,
                                     int32_t m, int32_t reps, int32_t *id, int32_t *top_ids, float *top_vals,
                                     int64_t *exact_rows, bool *built, struct qwenrt_error *err)
{
    struct lm_screen *sc = NULL;
    qwenrt_status st = lm_screen_build(d + 8 * (size_t)K, dtype, N, K, row_bytes, 0, &sc, err);
    if (st || !sc)
        return st;
    *built = true;
    int32_t *d_id = (int32_t *)(d + ((8 * (size_t)K + (size_t)N * row_bytes + 15) & ~(size_t)15));
    float *d_row = (float *)(d_id + 4);
    int32_t *d_top_ids = (int32_t *)(d_row + N);
    float *d_top_vals = (float *)(d_top_ids + (m > 0 ? m : 0));
    const int32_t limit = lm_screen_best_limit(sc);
    if (m > limit) {
        lm_screen_free(sc);
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_lm_screen_pick: m %d (at most %d here)", (int)m, (int)limit);
    }
    struct lm_screen_args a = {(const float *)d, (const float *)d + K, eps, d + 8 * (size_t)K, dtype, row_bytes,
                               d_id, NULL, NULL, NULL, false, NULL};
    const struct lm_screen_sampled smp = {m, 1.0f, d_row, d_top_ids, d_top_vals, NULL};
    const size_t top_bytes = (size_t)(m > 0 ? m : 0) * sizeof(int32_t);
    int32_t *prev = (int32_t *)malloc(2 * top_bytes + 1);
    int64_t picks = 0;
    cudaError_t e = prev ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int32_t r = 0; r < reps && e == cudaSuccess && !st; r++) {
        int32_t one = -1;
        e = m ? launch_lm_screen_sampled(sc, &a, &smp, 0) : launch_lm_screen(sc, &a, 0);
        if (e == cudaSuccess && !m)
            e = cudaMemcpy(&one, d_id, sizeof(one), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess && m) { /* the m best must not change from pick to pick */
            if (r > 0)
                memcpy(prev, top_ids, top_bytes), memcpy(prev + m, top_vals, top_bytes);
            e = cudaMemcpy(top_ids, d_top_ids, top_bytes, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess)
                e = cudaMemcpy(top_vals, d_top_vals, top_bytes, cudaMemcpyDeviceToHost);
            one = r > 0 && (memcmp(prev, top_ids, top_bytes) || memcmp(prev + m, top_vals, top_bytes)) ? -3 : 0;
        }
        if (e == cudaSuccess && r > 0 && one != *id)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda_lm_screen_pick: pick %d gave %d, the first %d", (int)r,
                         (int)one, (int)*id);
        *id = st ? *id : one;
    }
    free(prev);
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "the screened LM head");
    if (!st)
        st = lm_screen_counts(sc, &picks, exact_rows, err);
    if (!st && picks != reps)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda_lm_screen_pick: %lld picks counted, %d made", (long long)picks,
                     (int)reps);
    lm_screen_free(sc);
    return st;
}

extern "C" qwenrt_status cuda_lm_screen_pick(const float *h, const float *norm_w, float eps, const void *w,
                                             int32_t dtype, int32_t N, int32_t K, int32_t m, int32_t reps,
                                             int32_t *id, int32_t *top_ids, float *top_vals, int64_t *exact_rows,
                                             bool *built, struct qwenrt_error *err)
{
    *id = -1, *exact_rows = 0, *built = false;
    size_t rb = 0;
    const int64_t row_bytes = K > 0 && dtype_row_bytes((enum qr_dtype)dtype, K, &rb) ? (int64_t)rb : 0;
    if (!h || !norm_w || !w || reps < 1 || m < 0 || m > CUDA_TOP_MAX_M || (m && (!top_ids || !top_vals)) ||
        !lm_screen_applies(dtype, N, K, row_bytes, (void *)16, (float *)16, (float *)16))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_lm_screen_pick: %d rows of %d of dtype %d, m %d, %d picks",
                       (int)N, (int)K, (int)dtype, (int)m, (int)reps);
    uint8_t *d = NULL; /* h, norm_w (4 K each: 16-byte aligned as K % 32 == 0), the rows, the id, the row, the m best */
    cudaError_t e = cudaMalloc(&d, 8 * (size_t)K + (size_t)N * row_bytes + 32 + (size_t)N * sizeof(float) +
                                       (size_t)m * 8);
    if (e == cudaSuccess)
        e = cudaMemcpy(d, h, 4 * (size_t)K, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d + 4 * (size_t)K, norm_w, 4 * (size_t)K, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d + 8 * (size_t)K, w, (size_t)N * row_bytes, cudaMemcpyHostToDevice);
    qwenrt_status st = e != cudaSuccess ? cuda_fail(err, e, __FILE__, __LINE__, "cudaMalloc, cudaMemcpy")
                                        : screen_pick_run(d, eps, dtype, N, K, row_bytes, m, reps, id, top_ids,
                                                          top_vals, exact_rows, built, err);
    cudaFree(d);
    return st;
}

extern "C" qwenrt_status cuda_gemv_bench(int32_t dtype, int32_t N, int32_t K, int32_t T,
                                         bool norm, int32_t kernel, bool pdl, int32_t reps, double *us,
                                         double *gbs, double *timeline, struct qwenrt_error *err)
{
    struct bench_bufs b;
    memset(&b, 0, sizeof(b));
    *us = *gbs = 0;
    qwenrt_status st = gemv_bench_run(&b, dtype, N, K, T, norm, kernel, pdl, reps, us, gbs, timeline, err);
    bench_bufs_free(&b);
    return st;
}
