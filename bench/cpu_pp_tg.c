/*
 * cpu_pp_tg.c — prefill and decode speed of qwenrt through the public API, shaped like
 * llama-bench's pp/tg tests so bench/cpu_vs_llamacpp.sh can interleave the two engines.
 *
 * pp: one prefill of P pseudo-random token ids into an empty session (P tokens / time).
 * tg: from an empty session, N single-token decodes of pseudo-random ids (N / time), as
 * llama-bench's tg does (no prompt, no sampling). One warm-up of each, then R timed runs;
 * prints one JSON line with every run and the medians. No validation gate: `qwenrt bench`
 * is the validated path; this is for interleaved ratios on the shared machine.
 *   cc -O2 -fopenmp -Iinclude -Isrc bench/cpu_pp_tg.c BUILD/libqwenrt.a \
 *      $(pkg-config --libs jansson libutf8proc) -lcrypto -lm -o /tmp/cpu_pp_tg
 *   /tmp/cpu_pp_tg MODEL P N THREADS R [KV f32|f16] [DEPTH]
 * KV: the session's KV cache type; DEPTH: tg after a DEPTH-token prompt (untimed), as
 * llama-bench -d.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "qwenrt.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_once(struct qwenrt_session *s, const int32_t *ids, int32_t P, int32_t N, int32_t depth,
                    double *pp, double *tg)
{
    struct qwenrt_error err = {0};
    qwenrt_session_reset(s);
    double t0 = time_now_s();
    if (qwenrt_session_prefill(s, ids, P, NULL, &err) != QWENRT_OK)
        goto fail;
    *pp = P / (time_now_s() - t0);
    qwenrt_session_reset(s);
    if (depth > 0 && qwenrt_session_prefill(s, ids, depth, NULL, &err) != QWENRT_OK)
        goto fail;
    t0 = time_now_s();
    for (int32_t i = 0; i < N; i++)
        if (qwenrt_session_decode(s, ids[i % P], &err) != QWENRT_OK)
            goto fail;
    *tg = N / (time_now_s() - t0);
    return 0;
fail:
    fprintf(stderr, "cpu_pp_tg: %s\n", err.message);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: cpu_pp_tg MODEL P N THREADS REPS [KV f32|f16] [DEPTH]\n");
        return 2;
    }
    int32_t P = atoi(argv[2]), N = atoi(argv[3]), th = atoi(argv[4]), R = atoi(argv[5]);
    int32_t depth = argc > 7 ? atoi(argv[7]) : 0, n_ids = P > depth ? P : depth;
    bool kv16 = argc > 6 && !strcmp(argv[6], "f16");
    if (P < 1 || N < 1 || th < 1 || R < 1 || R > 100 || depth < 0 || n_ids > 65536 ||
        (argc > 6 && !kv16 && strcmp(argv[6], "f32")))
        return 2;
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = th;
    struct qwenrt_model *m = NULL;
    struct qwenrt_session *s = NULL;
    if (qwenrt_model_load(argv[1], &mp, &m, &err) != QWENRT_OK) {
        fprintf(stderr, "cpu_pp_tg: %s\n", err.message);
        return 1;
    }
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = n_ids + N + 8;
    sp.n_threads = th;
    sp.kv_type = kv16 ? QWENRT_KV_F16 : QWENRT_KV_F32;
    if (qwenrt_session_init(m, &sp, &s, &err) != QWENRT_OK) {
        fprintf(stderr, "cpu_pp_tg: %s\n", err.message);
        qwenrt_model_free(m);
        return 1;
    }
    static int32_t ids[65536];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < n_ids; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)info.n_vocab);
    }
    double pp[100], tg[100], w0, w1;
    int rc = run_once(s, ids, P, N, depth, &w0, &w1);
    for (int r = 0; r < R && rc == 0; r++)
        rc = run_once(s, ids, P, N, depth, &pp[r], &tg[r]);
    if (rc == 0) {
        printf("{\"engine\": \"qwenrt\", \"model\": \"%s\", \"threads\": %d, \"pp\": %d, \"tg\": %d, "
               "\"kv\": \"%s\", \"depth\": %d, \"pp_runs\": [",
               argv[1], th, P, N, kv16 ? "f16" : "f32", depth);
        for (int r = 0; r < R; r++)
            printf("%s%.2f", r ? ", " : "", pp[r]);
        printf("], \"tg_runs\": [");
        for (int r = 0; r < R; r++)
            printf("%s%.2f", r ? ", " : "", tg[r]);
        qsort(pp, (size_t)R, sizeof(double), cmp_d);
        qsort(tg, (size_t)R, sizeof(double), cmp_d);
        printf("], \"pp_median\": %.2f, \"tg_median\": %.2f}\n", pp[R / 2], tg[R / 2]);
    }
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    return rc;
}
