/*
 * bench_matmul_quant.c — micro-benchmark of the quantised-weight matmul variants.
 *
 * Decode (T = 1): GB/s of weight bytes streamed. Several copies of the weight matrix (at least
 * 64 MiB in all) are used in turn, so weights come from memory, not from the last-level cache.
 * Prefill (T = 128): GFLOP/s (2·T·K·N per call) on one matrix. Median of the repetitions.
 * Build and run (not part of the CMake build; benches never run in tests):
 *   cc -O2 -fopenmp -Isrc -Iinclude bench/bench_matmul_quant.c build-quant/libqwenrt.a \
 *      $(pkg-config --libs jansson libutf8proc) -lcrypto -lm -o /tmp/bench_mq
 *   /tmp/bench_mq [K N [hot]]   (hot: one copy of the weights, so they stay in cache)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    printf("K=%lld N=%lld\n%-24s %8s %8s %9s %9s\n", (long long)K, (long long)N, "variant",
           "GB/s 1t", "GB/s 2t", "GF/s 1t", "GF/s 2t");
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        size_t rb;
        dtype_row_bytes(types[ti], K, &rb);
        size_t mat = rb * (size_t)N;
        int copies = argc > 3 ? 1 : (int)((64u << 20) / mat) + 1;
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
                strstr(v->key, ".ref"))
                continue;
            double res[4];
            for (int mode = 0; mode < 4; mode++) { /* decode 1t, 2t, prefill 1t, 2t */
                int64_t T = mode < 2 ? 1 : Tmax;
                int reps = mode < 2 ? 200 : 5;
                double t_rep[200];
                struct cpu_matmul_args a = {.y = y, .x = x, .wtype = types[ti], .T = T, .K = K,
                                            .N = N, .ldx = K, .ldy = N, .w_row_bytes = rb,
                                            .n_threads = 1 + (mode & 1)};
                for (int r = -2; r < reps; r++) {
                    a.w = w + (size_t)((r + 2) % copies) * (mode < 2 ? mat : 0);
                    double t0 = time_now_s();
                    v->fn(&a);
                    if (r >= 0)
                        t_rep[r] = time_now_s() - t0;
                }
                qsort(t_rep, (size_t)reps, sizeof(double), cmp_d);
                double med = t_rep[reps / 2];
                res[mode] = mode < 2 ? (double)mat / med * 1e-9 : 2.0 * T * K * N / med * 1e-9;
            }
            printf("%-24s %8.1f %8.1f %9.1f %9.1f\n", v->key, res[0], res[1], res[2], res[3]);
        }
        xfree(w);
    }
    xfree(y);
    xfree(x);
    xfree(row);
    return 0;
}
