/*
 * lm_screen_bits.c — how many LM-head rows the screen (src/backend/cuda/lm_screen.cuh) would read
 * exactly if its copy of the rows had fewer than 8 bits: a CPU experiment, before any kernel.
 *
 * The screen reads an 8-bit copy of a 16-bit LM head (Q8_0's blocks of 32 with an f16 scale) and
 * computes exactly only the rows whose approximate logit a_j lies within 2B of the largest (or, for
 * the sampled loop, of the m-th largest), B the proven bound of lm_screen.cuh:
 *   B = |x| E + (|x~ - x| + g'|x~|) W,  E = max_j (|e_j| + g_K |w_j|),  W = max_j |s q_j|.
 * A copy of b bits has about 2^(8-b) times the error, so B grows and more rows pass; the copy's
 * bytes, which set the screen's time (~80% of its ~68 us on an H100), fall to b/8. This program
 * runs a model on the CPU (greedy, from a fixed prompt), takes the screen's input at every
 * step (the final norm's output, the "final_norm" dump), and for b = 8, 6, 5, 4 builds the copy as
 * lm_screen_build_kernel does (scale = max|w| / (2^(b-1) - 1) rounded to f16, levels rounded and
 * clamped), x in 8 bits as the screen does, and reports E, B, the largest actual error
 * max_j |a_j - l_j| (how loose the bound is), and the rows that pass for the argmax and for the 40
 * best (the threshold taken as the exact 40th largest a: the kernel's lower bound on it can only
 * be lower, so these are the fewest rows it would read). Every step checks that the exact
 * argmax row passes (the bound's promise).
 *
 *   build/lm_screen_bits MODEL.gguf [steps] [threads]     (synth models: qwenrt synth --seed 1234)
 * (built with the project; by hand: cc -O2 -fopenmp -Iinclude -Isrc bench/lm_screen_bits.c
 *  BUILD/libqwenrt.a $(pkg-config --libs jansson libutf8proc) -lcrypto -lm)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "model/model.h"
#include "qwenrt.h"
#include "runtime/session.h"

#define MAX_STEPS 64
#define TOP_M 40

struct capture {
    float *x[MAX_STEPS + 1]; /* the screen's input after the prompt and after each step */
    int n;
    int32_t width;
};

static void on_dump(void *user, const char *name, int32_t layer, const float *data, int32_t T, int32_t width)
{
    (void)layer;
    struct capture *c = user;
    if (strcmp(name, "final_norm") || c->n > MAX_STEPS)
        return;
    c->x[c->n] = malloc((size_t)width * sizeof(float));
    if (!c->x[c->n])
        return;
    memcpy(c->x[c->n], data + (size_t)(T - 1) * width, (size_t)width * sizeof(float));
    c->width = width;
    c->n++;
}

static float head_elem(const struct qr_tensor *t, int64_t j, int64_t k)
{
    const int64_t K = t->ne[0];
    switch (t->dtype) {
    case QR_F32: return ((const float *)t->data)[j * K + k];
    case QR_F16: return f16_to_f32(((const uint16_t *)t->data)[j * K + k]);
    case QR_BF16: return bf16_to_f32(((const uint16_t *)t->data)[j * K + k]);
    default: return NAN;
    }
}

static float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }

/* The b-bit copy of the head: q [N][K] levels, s [N][K/32] scales; E and W as the build kernel
 * measures them. */
struct copy {
    int8_t *q;
    float *s;
    double E, W;
};

static int make_copy(const struct qr_tensor *t, int bits, struct copy *c)
{
    const int64_t N = t->ne[1], K = t->ne[0], nb = K / 32;
    const float qmax = (float)((1 << (bits - 1)) - 1), gk = (float)K * 0x1p-24f;
    c->q = malloc((size_t)(N * K));
    c->s = malloc((size_t)(N * nb) * sizeof(float));
    if (!c->q || !c->s)
        return -1;
    double E = 0, W = 0;
#pragma omp parallel for reduction(max : E, W) schedule(static)
    for (int64_t j = 0; j < N; j++) {
        double se = 0, sw = 0, sq = 0;
        for (int64_t b = 0; b < nb; b++) {
            float v[32], m = 0.0f;
            for (int k = 0; k < 32; k++)
                v[k] = head_elem(t, j, 32 * b + k), m = fmaxf(m, fabsf(v[k]));
            float d = f16_round(m / qmax);
            c->s[j * nb + b] = d;
            for (int k = 0; k < 32; k++) {
                float l = d > 0.0f ? fminf(fmaxf(rintf(v[k] / d), -qmax), qmax) : 0.0f;
                double e = (double)d * l - v[k];
                se += e * e, sw += (double)v[k] * v[k], sq += ((double)d * l) * ((double)d * l);
                c->q[j * K + 32 * b + k] = (int8_t)l;
            }
        }
        double eb = (sqrt(se) + gk * sqrt(sw)) * 1.001, wb = sqrt(sq) * 1.001;
        E = eb > E ? eb : E;
        W = wb > W ? wb : W;
    }
    c->E = E, c->W = W;
    return 0;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* One step's x through the copy: the bound, the largest actual error, the rows that pass. */
struct step_result {
    double B, err, rows_argmax, rows_top;
    int argmax_in;
};

static struct step_result screen_step(const struct qr_tensor *t, const struct copy *c, const float *x, int x_terms,
                                      float *a, float *sorted)
{
    const int64_t N = t->ne[1], K = t->ne[0], nb = K / 32;
    int8_t *xq = malloc((size_t)K * 2); /* [0, K): x's 8-bit levels; [K, 2K): the remainder's */
    float *xs = malloc((size_t)nb * 2 * sizeof(float));
    struct step_result r = {0};
    if (!xq || !xs) {
        free(xq), free(xs);
        r.B = NAN;
        return r;
    }
    double xx = 0, xe = 0, xt = 0;
    for (int64_t b = 0; b < nb; b++) { /* x in 8 bits, a scale per 32, as screen_stage does */
        float m = 0.0f, m2 = 0.0f, r[32];
        for (int k = 0; k < 32; k++)
            m = fmaxf(m, fabsf(x[32 * b + k]));
        float d = m / 127.0f;
        xs[b] = d;
        for (int k = 0; k < 32; k++) {
            float v = x[32 * b + k], l = d > 0.0f ? fminf(fmaxf(rintf(v / d), -127.0f), 127.0f) : 0.0f;
            xq[32 * b + k] = (int8_t)l;
            r[k] = v - d * l, m2 = fmaxf(m2, fabsf(r[k]));
        }
        /* x_terms 2: the remainder in 8 bits too (x ~ d l + d2 l2: twice the dp4a, ~1/128 the error) */
        float d2 = x_terms == 2 ? m2 / 127.0f : 0.0f;
        xs[nb + b] = d2;
        for (int k = 0; k < 32; k++) {
            float l2 = d2 > 0.0f ? fminf(fmaxf(rintf(r[k] / d2), -127.0f), 127.0f) : 0.0f;
            xq[K + 32 * b + k] = (int8_t)l2;
            double v = x[32 * b + k], q = (double)d * xq[32 * b + k] + (double)d2 * l2;
            xx += v * v, xe += (v - q) * (v - q), xt += q * q;
        }
    }
    const double gp = (double)(x_terms * K / 32 + 8) * 0x1p-24; /* one more f32 sum a block with 2 terms */
    r.B = sqrt(xx) * c->E + (sqrt(xe) + gp * sqrt(xt)) * c->W;
    double err = 0, best_l = -INFINITY;
    int64_t best = 0;
#pragma omp parallel for reduction(max : err) schedule(static)
    for (int64_t j = 0; j < N; j++) {
        double acc = 0;
        for (int64_t b = 0; b < nb; b++) {
            int32_t dot = 0, dot2 = 0;
            for (int k = 0; k < 32; k++)
                dot += (int32_t)c->q[j * K + 32 * b + k] * xq[32 * b + k],
                    dot2 += (int32_t)c->q[j * K + 32 * b + k] * xq[K + 32 * b + k];
            acc += (double)c->s[j * nb + b] * ((double)xs[b] * dot + (double)xs[nb + b] * dot2);
        }
        a[j] = (float)acc;
        double l = 0;
        for (int64_t k = 0; k < K; k++)
            l += (double)head_elem(t, j, k) * x[k];
        double e = fabs(acc - l);
        err = e > err ? e : err;
        sorted[j] = (float)l; /* the exact logits, for the argmax below */
    }
    for (int64_t j = 0; j < N; j++)
        if (sorted[j] > best_l)
            best_l = sorted[j], best = j;
    r.err = err;
    float amax = -INFINITY;
    for (int64_t j = 0; j < N; j++)
        amax = fmaxf(amax, a[j]);
    memcpy(sorted, a, (size_t)N * sizeof(float));
    qsort(sorted, (size_t)N, sizeof(float), cmp_desc);
    const double thr_argmax = amax - 2 * r.B, thr_top = sorted[TOP_M - 1] - 2 * r.B;
    for (int64_t j = 0; j < N; j++) {
        r.rows_argmax += a[j] >= thr_argmax;
        r.rows_top += a[j] >= thr_top;
    }
    r.argmax_in = a[best] >= thr_argmax;
    free(xq), free(xs);
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [steps (default 16)] [threads (default 2)]\n", argv[0]);
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 16, threads = argc > 3 ? atoi(argv[3]) : 2;
    steps = steps < 1 ? 1 : steps > MAX_STEPS ? MAX_STEPS : steps;
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cpu";
    if (qwenrt_model_load(argv[1], &mp, &m, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err.message);
        return 1;
    }
    const struct qr_tensor *t = m->w.output;
    if (t->dtype != QR_BF16 && t->dtype != QR_F16 && t->dtype != QR_F32) {
        fprintf(stderr, "the LM head is not 16- or 32-bit: the screen does not take it\n");
        return 1;
    }
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_threads = threads;
    struct qwenrt_session *s = NULL;
    if (qwenrt_session_init(m, &sp, &s, &err)) {
        fprintf(stderr, "session: %s\n", err.message);
        return 1;
    }
    struct capture cap = {0};
    session_set_dump(s, on_dump, &cap);
    const int32_t V = m->hp.n_vocab, prompt[8] = {9707, 11, 1879, 0, 3555, 374, 279, 6722};
    int32_t ids[8];
    for (int i = 0; i < 8; i++)
        ids[i] = prompt[i] % V;
    if (qwenrt_session_prefill(s, ids, 8, NULL, &err)) {
        fprintf(stderr, "prefill: %s\n", err.message);
        return 1;
    }
    for (int i = 0; i < steps - 1; i++)
        if (qwenrt_session_decode(s, qwenrt_argmax(qwenrt_session_logits(s), V), &err)) {
            fprintf(stderr, "decode: %s\n", err.message);
            return 1;
        }
    printf("%s: LM head %lld x %lld, %d screen inputs (the prompt's last and %d greedy steps)\n", argv[1],
           (long long)t->ne[1], (long long)t->ne[0], cap.n, cap.n - 1);
    printf("| bits | x terms | copy MB | E | W | B (mean) | largest actual error (mean) | rows, argmax (mean / max) | rows, "
           "%d best (mean / max) | argmax passed |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           TOP_M);
    const int64_t N = t->ne[1], K = t->ne[0];
    float *a = malloc((size_t)N * sizeof(float)), *sorted = malloc((size_t)N * sizeof(float));
    static const int bits_list[] = {8, 8, 6, 6, 5, 4}, terms_list[] = {1, 2, 1, 2, 1, 1};
    for (size_t bi = 0; a && sorted && bi < sizeof(bits_list) / sizeof(bits_list[0]); bi++) {
        struct copy c = {0};
        if (make_copy(t, bits_list[bi], &c)) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        double sB = 0, serr = 0, sra = 0, srt = 0, mra = 0, mrt = 0;
        int in = 0;
        for (int i = 0; i < cap.n; i++) {
            struct step_result r = screen_step(t, &c, cap.x[i], terms_list[bi], a, sorted);
            sB += r.B, serr += r.err, sra += r.rows_argmax, srt += r.rows_top, in += r.argmax_in;
            mra = r.rows_argmax > mra ? r.rows_argmax : mra;
            mrt = r.rows_top > mrt ? r.rows_top : mrt;
        }
        const double copy_mb = ((double)N * K * bits_list[bi] / 8 + (double)N * (K / 32) * 2) / 1e6;
        printf("| %d | %d | %.0f | %.4g | %.4g | %.4g | %.4g | %.1f / %.0f | %.1f / %.0f | %d of %d |\n", bits_list[bi],
               terms_list[bi], copy_mb, c.E, c.W, sB / cap.n, serr / cap.n, sra / cap.n, mra, srt / cap.n, mrt, in, cap.n);
        fflush(stdout);
        free(c.q), free(c.s);
    }
    free(a), free(sorted);
    for (int i = 0; i < cap.n; i++)
        free(cap.x[i]);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    return 0;
}
