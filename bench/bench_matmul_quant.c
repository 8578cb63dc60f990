/*
 * bench_matmul_quant.c — micro-benchmark of the quantised-weight matmul variants.
 *
 * Decode (T = 1): GB/s of weight bytes streamed. Several copies of the weight matrix (at least
 * 512 MiB in all, twice this VM's 260 MiB L3) are used in turn, so weights come from memory.
 * Prefill (T = 128): GFLOP/s (2·T·K·N per call) on one matrix. Median of the repetitions.
 * The machine is shared: 1-thread columns also report the speed from the thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID: time the thread was descheduled does not count), "cpu" columns,
 * which is the kernel's own speed; the first line gives the load average and an AVX-512 read
 * of 512 MiB with software prefetch 2 KiB ahead (1 and 2 threads, best of 5) as the bandwidth
 * the GB/s compare to. Run 2-thread numbers with OMP_WAIT_POLICY=active: with libgomp's default
 * wait, a worker that went to sleep on this loaded VM can make one call take milliseconds.
 * Build and run (not part of the CMake build; benches never run in tests):
 *   cc -O2 -fopenmp -Isrc -Iinclude bench/bench_matmul_quant.c build-quant/libqwenrt.a \
 *      $(pkg-config --libs jansson libutf8proc) -lcrypto -lm -o /tmp/bench_mq
 *   /tmp/bench_mq [K N [hot|cold [FILTER]]]  (hot: one copy of the weights, so they stay in
 *   cache; FILTER: only variants whose key contains it)
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/matmul.h"
#include "base/alloc.h"
#include "base/cpu_features.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "quant/quant.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

__attribute__((target("avx512f"))) static long long read_sum(const uint8_t *p, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        _mm_prefetch((const char *)(p + i + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 2048 + 64), _MM_HINT_T0);
        a = _mm512_add_epi32(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_add_epi32(b, _mm512_load_si512((const void *)(p + i + 64)));
    }
    return _mm512_reduce_add_epi32(_mm512_add_epi32(a, b));
}

/* Best-of-5 GB/s of a plain read of 512 MiB by `th` threads (the bandwidth reference). */
static double read_bandwidth(int th)
{
    size_t n = (size_t)512 << 20;
    uint8_t *p = xalloc_aligned(1, n);
    if (!p)
        return 0;
    memset(p, 1, n);
    double best = 0;
    long long sink = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = time_now_s();
#pragma omp parallel num_threads(th) reduction(+ : sink)
        {
            size_t c = n / (size_t)omp_get_num_threads();
            sink += read_sum(p + c * (size_t)omp_get_thread_num(), c);
        }
        double t = time_now_s() - t0;
        best = (double)n / t > best ? (double)n / t : best;
    }
    xfree(p);
    return best * 1e-9 + 0 * (double)sink;
}

int main(int argc, char **argv)
{
    int64_t K = argc > 2 ? atoll(argv[1]) : 1024, N = argc > 2 ? atoll(argv[2]) : 3072;
    static const enum qr_dtype types[] = {QR_Q8_0, QR_Q4_0, QR_Q4_K, QR_Q5_K, QR_Q6_K};
    uint32_t feats = cpu_features_detect();
    float *row = xmalloc((size_t)K, sizeof(float));
    int64_t Tmax = 128;
    float *x = xmalloc((size_t)(Tmax * K), sizeof(float));
    float *y = xmalloc((size_t)(Tmax * N), sizeof(float));
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < Tmax * K; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((s >> 40) * (1.0 / 8388608.0)) - 1.0f;
    }
    int hot = argc > 3 && strcmp(argv[3], "hot") == 0;
    const char *filter = argc > 4 ? argv[4] : "";
    double load[3] = {0};
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = -1;
        fclose(lf);
    }
    printf("K=%lld N=%lld %s, load %.2f, read bandwidth %.1f GB/s 1t, %.1f GB/s 2t\n",
           (long long)K, (long long)N, hot ? "hot" : "cold", load[0], read_bandwidth(1),
           read_bandwidth(2));
    printf("%-24s %8s %8s %8s %9s %9s %9s\n", "variant", "GB/s 1t", "cpu 1t", "GB/s 2t",
           "GF/s 1t", "cpu 1t", "GF/s 2t");
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        size_t rb;
        dtype_row_bytes(types[ti], K, &rb);
        size_t mat = rb * (size_t)N;
        int copies = hot ? 1 : (int)(((size_t)512 << 20) / mat) + 1;
        uint8_t *w = xmalloc((size_t)copies, mat);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                row[k] = 0.05f * ((float)((s >> 40) * (1.0 / 8388608.0)) - 1.0f);
            }
            quant_quantize_row(types[ti], row, w + (size_t)n * rb, K);
        }
        for (int c = 1; c < copies; c++)
            memcpy(w + (size_t)c * mat, w, mat);
        for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++) {
            if (v->wtype != types[ti] || (v->cpu_features & feats) != v->cpu_features ||
                strstr(v->key, ".ref") || !strstr(v->key, filter))
                continue;
            double res[4], cpu[4];
            for (int mode = 0; mode < 4; mode++) { /* decode 1t, 2t, prefill 1t, 2t */
                int64_t T = mode < 2 ? 1 : Tmax;
                int reps = mode < 2 ? 200 : 5;
                double t_rep[200], c_rep[200];
                struct cpu_matmul_args a = {.y = y, .x = x, .wtype = types[ti], .T = T, .K = K,
                                            .N = N, .ldx = K, .ldy = N, .w_row_bytes = rb,
                                            .n_threads = 1 + (mode & 1)};
                for (int r = -2; r < reps; r++) {
                    a.w = w + (size_t)((r + 2) % copies) * (mode < 2 ? mat : 0);
                    double t0 = time_now_s(), c0 = thread_cpu_s();
                    v->fn(&a);
                    if (r >= 0) {
                        t_rep[r] = time_now_s() - t0;
                        c_rep[r] = thread_cpu_s() - c0;
                    }
                }
                qsort(t_rep, (size_t)reps, sizeof(double), cmp_d);
                qsort(c_rep, (size_t)reps, sizeof(double), cmp_d);
                double work = mode < 2 ? (double)mat : 2.0 * (double)(T * K * N);
                res[mode] = work / t_rep[reps / 2] * 1e-9;
                cpu[mode] = work / c_rep[reps / 2] * 1e-9;
            }
            printf("%-24s %8.1f %8.1f %8.1f %9.1f %9.1f %9.1f\n", v->key, res[0], cpu[0], res[1],
                   res[2], cpu[2], res[3]);
        }
        xfree(w);
    }
    xfree(y);
    xfree(x);
    xfree(row);
    return 0;
}
