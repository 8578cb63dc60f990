/*
 * matmul_bench.c — speed of the CPU float-weight matmul variants on Qwen3-0.6B's shapes, next to
 * the machine's measured streaming-read bandwidth.
 *
 *   matmul_bench [dtype=f16] [threads=2] [variant-key] [tokens=10]
 *
 * 1. read bandwidth: an AVX-512 sum over the whole weight buffer (1.2 GB for f16), best of 5;
 * 2. decode: one "token" = the 28 layers' q,k,v,o,gate,up,down GEMVs plus the LM head, weights
 *    laid out like a real model (so nothing stays in cache); time per op, GB/s and tok/s;
 * 3. prefill: each layer shape at T=128 (weights of one layer), GFLOP/s, and the body's
 *    matmul-only tok/s for pp128 (28 layers; the LM head runs for the last token only).
 * Weights are random finite values (never zeros). Build (after make BUILD=build-matmul):
 *   gcc -O2 -fopenmp -Iinclude -Isrc bench/matmul_bench.c build-matmul/libqwenrt.a -lm \
 *       -o build-matmul/matmul_bench
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_float.h"
#include "base/alloc.h"
#include "base/cpu_features.h"
#include "base/timer.h"

enum { N_LAYER = 28, HIDDEN = 1024, Q_DIM = 2048, KV_DIM = 1024, FFN = 3072, VOCAB = 151936 };

struct shape {
    const char *name;
    int64_t K, N;
};

static const struct shape layer_shapes[] = {
    {"q_proj", HIDDEN, Q_DIM},  {"k_proj", HIDDEN, KV_DIM}, {"v_proj", HIDDEN, KV_DIM},
    {"o_proj", Q_DIM, HIDDEN},  {"gate_proj", HIDDEN, FFN}, {"up_proj", HIDDEN, FFN},
    {"down_proj", FFN, HIDDEN},
};
enum { N_SHAPE = sizeof(layer_shapes) / sizeof(layer_shapes[0]) };
static const struct shape lm_head = {"lm_head", HIDDEN, VOCAB};

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random finite weights of magnitude 2^-6 .. 1 with random signs. */
static void fill(enum qr_dtype wt, void *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
#pragma omp parallel for firstprivate(s)
    for (size_t i = 0; i < n; i += 4096) {
        uint64_t ls = s ^ (i * 0x9e3779b97f4a7c15ull) ^ 1;
        size_t end = i + 4096 < n ? i + 4096 : n;
        for (size_t j = i; j < end; j++) {
            uint64_t r = next(&ls);
            uint32_t sign = (uint32_t)(r & 1), e = (uint32_t)((r >> 1) % 6), m = (uint32_t)(r >> 8);
            if (wt == QR_F16)
                ((uint16_t *)dst)[j] = (uint16_t)(sign << 15 | (9 + e) << 10 | (m & 0x3ff));
            else if (wt == QR_BF16)
                ((uint16_t *)dst)[j] = (uint16_t)(sign << 15 | (121 + e) << 7 | (m & 0x7f));
            else
                ((uint32_t *)dst)[j] = sign << 31 | (121 + e) << 23 | (m & 0x7fffff);
        }
    }
}

__attribute__((target("avx512f"))) static double read_sum(const float *p, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* Streaming-read GB/s over bytes at p (64-byte aligned), best of 5. */
static double read_bandwidth(const void *p, size_t bytes, int threads)
{
    double best = 1e30, sink = 0.0;
    size_t nf = bytes / 4 / 64 * 64;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = time_now_s();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            size_t i = (size_t)omp_get_thread_num(), got = (size_t)omp_get_num_threads();
            size_t b = nf / 64 * i / got * 64, e = nf / 64 * (i + 1) / got * 64;
            sink += read_sum((const float *)p + b, e - b);
        }
        double dt = time_now_s() - t0;
        if (dt < best)
            best = dt;
    }
    if (sink == 12345.0)
        printf(" ");
    return (double)nf * 4 / best / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    enum qr_dtype wt = argc > 1 ? dtype_from_name(argv[1]) : QR_F16;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    const char *key = argc > 3 && strcmp(argv[3], "-") ? argv[3] : NULL;
    int tokens = argc > 4 ? atoi(argv[4]) : 10;
    if (!dtype_is_float(wt) || threads < 1 || tokens < 1) {
        fprintf(stderr, "usage: matmul_bench [f32|f16|bf16] [threads] [variant-key|-] [tokens]\n");
        return 2;
    }
    uint32_t feat = cpu_features_detect();
    const struct cpu_matmul_variant *v = cpu_matmul_pick(wt, feat, key);
    if (!v) {
        fprintf(stderr, "matmul_bench: no runnable variant %s\n", key ? key : "");
        return 1;
    }
    size_t esz = wt == QR_F32 ? 4 : 2;

    /* the decode weights: 28 layers x 7 matrices, then the LM head, one buffer */
    size_t off[N_LAYER * N_SHAPE + 1], total = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int s = 0; s < N_SHAPE; s++) {
            off[l * N_SHAPE + s] = total;
            total += (size_t)(layer_shapes[s].K * layer_shapes[s].N) * esz;
        }
    off[N_LAYER * N_SHAPE] = total;
    total += (size_t)(lm_head.K * lm_head.N) * esz;
    uint8_t *w = xalloc_aligned(total, 1);
    float *x = xalloc_aligned(128 * FFN, sizeof(float));
    float *y = xalloc_aligned((size_t)128 * VOCAB, sizeof(float));
    if (!w || !x || !y) {
        fprintf(stderr, "matmul_bench: out of memory (%zu bytes of weights)\n", total);
        return 1;
    }
    fill(wt, w, total / esz, 42);
    fill(QR_F32, x, 128 * FFN, 7);

    char fdesc[128];
    cpu_features_describe(feat, fdesc, sizeof(fdesc));
    printf("variant %s, %s weights, %d threads, cpu: %s\n", v->key, dtype_traits(wt)->name,
           threads, fdesc);
    double bw1 = read_bandwidth(w, total, 1), bw = read_bandwidth(w, total, threads);
    printf("read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads), %.2f GB buffer\n",
           bw1, bw, threads, total / 1e9);

    /* decode: all matrices in model order, T = 1 */
    double op_time[N_SHAPE + 1] = {0}, tok[64];
    if (tokens > 64)
        tokens = 64;
    for (int it = -2; it < tokens; it++) {
        double t_tok = time_now_s();
        for (int i = 0; i <= N_LAYER * N_SHAPE; i++) {
            const struct shape *sh = i < N_LAYER * N_SHAPE ? &layer_shapes[i % N_SHAPE] : &lm_head;
            struct cpu_matmul_args a = {
                .y = y, .x = x, .w = w + off[i], .wtype = wt, .T = 1, .K = sh->K, .N = sh->N,
                .ldx = sh->K, .ldy = sh->N, .w_row_bytes = (size_t)sh->K * esz,
                .n_threads = threads,
            };
            double t0 = time_now_s();
            v->fn(&a);
            if (it >= 0)
                op_time[i < N_LAYER * N_SHAPE ? i % N_SHAPE : N_SHAPE] += time_now_s() - t0;
        }
        if (it >= 0)
            tok[it] = time_now_s() - t_tok;
    }
    qsort(tok, (size_t)tokens, sizeof(double), cmp_double);
    double med = tok[tokens / 2];
    printf("decode T=1 (per token: 28 layers + lm_head, %.3f GB):\n", total / 1e9);
    for (int s = 0; s <= N_SHAPE; s++) {
        const struct shape *sh = s < N_SHAPE ? &layer_shapes[s] : &lm_head;
        double bytes = (double)(sh->K * sh->N) * esz * (s < N_SHAPE ? N_LAYER : 1);
        double t = op_time[s] / tokens;
        printf("  %-9s K=%-5lld N=%-6lld %8.3f ms/token %6.1f GB/s\n", sh->name,
               (long long)sh->K, (long long)sh->N, t * 1e3, bytes / t / 1e9);
    }
    printf("  token: median %.2f ms = %.1f tok/s, %.1f GB/s = %.0f%% of read bandwidth\n",
           med * 1e3, 1.0 / med, total / med / 1e9, 100.0 * total / med / 1e9 / bw);

    /* small batches: one pass over every matrix with T tokens (weights cold, as in decode) */
    printf("small T (one pass over all matrices, weights from memory):\n");
    static const int64_t small_t[] = {2, 4, 8, 12, 16, 32};
    for (size_t st = 0; st < sizeof(small_t) / sizeof(small_t[0]); st++) {
        double best = 1e30;
        for (int it = 0; it < 3; it++) {
            double t0 = time_now_s();
            for (int i = 0; i <= N_LAYER * N_SHAPE; i++) {
                const struct shape *sh =
                    i < N_LAYER * N_SHAPE ? &layer_shapes[i % N_SHAPE] : &lm_head;
                struct cpu_matmul_args a = {
                    .y = y, .x = x, .w = w + off[i], .wtype = wt, .T = small_t[st], .K = sh->K,
                    .N = sh->N, .ldx = FFN, .ldy = VOCAB, .w_row_bytes = (size_t)sh->K * esz,
                    .n_threads = threads,
                };
                v->fn(&a);
            }
            double dt = time_now_s() - t0;
            best = dt < best ? dt : best;
        }
        printf("  T=%-3lld %8.2f ms per pass, %6.1f GB/s, %6.1f GFLOP/s\n",
               (long long)small_t[st], best * 1e3, total / best / 1e9,
               2.0 * (double)small_t[st] * (double)(total / esz) / best / 1e9);
    }

    /* prefill: T = 128, weights of layer 0 */
    double layer_t = 0.0;
    printf("prefill T=128 (weights of one layer):\n");
    for (int s = 0; s < N_SHAPE; s++) {
        const struct shape *sh = &layer_shapes[s];
        struct cpu_matmul_args a = {
            .y = y, .x = x, .w = w + off[s], .wtype = wt, .T = 128, .K = sh->K, .N = sh->N,
            .ldx = sh->K, .ldy = sh->N, .w_row_bytes = (size_t)sh->K * esz,
            .n_threads = threads,
        };
        double rt[9];
        for (int it = 0; it < 9; it++) {
            double t0 = time_now_s();
            v->fn(&a);
            rt[it] = time_now_s() - t0;
        }
        qsort(rt, 9, sizeof(double), cmp_double);
        layer_t += rt[4];
        printf("  %-9s K=%-5lld N=%-6lld T=128 %8.3f ms %6.1f GFLOP/s\n", sh->name,
               (long long)sh->K, (long long)sh->N, rt[4] * 1e3,
               matmul_float_flops(&a) / rt[4] / 1e9);
    }
    printf("  pp128 body matmuls: %.1f ms for 28 layers = %.0f tok/s (matmuls only)\n",
           layer_t * N_LAYER * 1e3, 128.0 / (layer_t * N_LAYER));
    xfree(w);
    xfree(x);
    xfree(y);
    return 0;
}
