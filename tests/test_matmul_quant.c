/*
 * test_matmul_quant.c — every quantised-weight matmul variant (matmul.<type>.{portable,avx2,
 * avx512vnni} for Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) that can run here, checked two ways:
 *
 * 1. Against a double-precision dot of the dequantised W with the unquantised x (what
 *    matmul.<type>.exact computes). The other variants, matmul.<type>.ref included,
 *    quantise x to 8 bits first, so they differ by Σ_k ŵ_k·e_k where e_k, the activation
 *    rounding error, is uniform in ±s_k/2 with s_k the step of x's block (max|x_block|/127).
 *    That sum has standard deviation σ = sqrt(Σ_k ŵ_k²·s_k²/12); we allow 8σ (seeds are fixed,
 *    so this is deterministic; a wrong element costs ~|ŵ_k·x_k| ≫ σ) plus f32 rounding.
 * 2. Against a double-precision dot of the SAME quantised activations (x quantised here with
 *    quant_quantize_row into Q8_0/Q8_K and dequantised): the integer dot products are exact,
 *    so only f32 rounding of the per-block scale products and sums remains: 1e-5 of Σ|ŵ·x̂|.
 *
 * Shapes: K = 256 and 768 (3 super-blocks), and 800 for Q8_0/Q4_0 (25 blocks: an odd block
 * after the pairs),
 * N = 1, 7, 33, 129 (not multiples of the 16-row tile), T = 1, 3, 17 (token groups of 4 or 8 with
 * remainders); 1 and 3 threads. x's row padding is NaN, weight-row padding is 0xFF bytes, and
 * a guard value after each output row must survive.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/matmul.h"
#include "base/alloc.h"
#include "base/cpu_features.h"
#include "format/dtype.h"
#include "quant/quant.h"

#define TOL_ACT_SIGMAS 8.0     /* activation-quantisation error allowed, in σ (see above) */
#define TOL_F32_ACCUM 1e-5     /* f32 rounding, relative to Σ|w·x| */
#define W_PAD 16               /* poisoned bytes after each weight row */

static const float GUARD = -12345.5f;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((rng_next(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static float rng_gauss(uint64_t *s)
{
    float u1 = (float)(((rng_next(s) >> 40) + 1) * (1.0 / 16777217.0)), u2 = rng_uniform(s);
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

struct problem {
    enum qr_dtype wt, act;
    int64_t T, K, N, ldx, ldy;
    size_t row_bytes;
    float *x;      /* [T][ldx] */
    uint8_t *w;    /* [N][row_bytes] */
    float *wd;     /* [N][K] dequantised weights */
    float *xd;     /* [T][K] activations after Q8_0/Q8_K round trip */
    double *want_ref, *tol_ref, *want_q, *tol_q; /* [T][N] */
};

static void problem_init(struct problem *p, enum qr_dtype wt, int64_t T, int64_t K, int64_t N,
                         uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->wt = wt;
    p->act = (wt == QR_Q8_0 || wt == QR_Q4_0) ? QR_Q8_0 : QR_Q8_K;
    p->T = T, p->K = K, p->N = N, p->ldx = K + 5, p->ldy = N + 3;
    size_t rb, ab;
    assert_true(dtype_row_bytes(wt, K, &rb));
    assert_true(dtype_row_bytes(p->act, K, &ab));
    p->row_bytes = rb + W_PAD;
    p->x = xmalloc((size_t)(T * p->ldx), sizeof(float));
    p->w = xmalloc((size_t)N, p->row_bytes);
    p->wd = xmalloc((size_t)(N * K), sizeof(float));
    p->xd = xmalloc((size_t)(T * K), sizeof(float));
    uint8_t *xq = xmalloc(1, ab);
    float *row = xmalloc((size_t)K, sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        float scale = 0.02f * (float)(1 + n % 5);
        for (int64_t k = 0; k < K; k++)
            row[k] = scale * rng_gauss(&seed) + (k % 64 == 3 ? 0.05f : 0.0f);
        uint8_t *wr = p->w + (size_t)n * p->row_bytes;
        assert_true(quant_quantize_row(wt, row, wr, K));
        memset(wr + rb, 0xFF, W_PAD);
        assert_true(quant_dequantize_row(wt, wr, p->wd + n * K, K));
    }
    for (int64_t t = 0; t < T; t++) {
        float *xr = p->x + t * p->ldx;
        for (int64_t k = 0; k < K; k++)
            xr[k] = rng_uniform(&seed) * (k % 32 == 7 ? 8.0f : 1.0f);
        for (int64_t k = K; k < p->ldx; k++)
            xr[k] = NAN;
        assert_true(quant_quantize_row(p->act, xr, xq, K));
        assert_true(quant_dequantize_row(p->act, xq, p->xd + t * K, K));
    }
    size_t nr = (size_t)(T * N);
    p->want_ref = xmalloc(nr, sizeof(double));
    p->tol_ref = xmalloc(nr, sizeof(double));
    p->want_q = xmalloc(nr, sizeof(double));
    p->tol_q = xmalloc(nr, sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        const float *xr = p->x + t * p->ldx, *xq_d = p->xd + t * K;
        for (int64_t n = 0; n < N; n++) {
            const float *wr = p->wd + n * K;
            double s = 0, sq = 0, mag = 0, magq = 0, var = 0;
            int64_t blk = p->act == QR_Q8_0 ? 32 : 256;
            for (int64_t k0 = 0; k0 < K; k0 += blk) {
                float amax = 0.0f;
                for (int64_t k = k0; k < k0 + blk; k++)
                    amax = fmaxf(amax, fabsf(xr[k]));
                double step = amax / 127.0;
                for (int64_t k = k0; k < k0 + blk; k++) {
                    s += (double)wr[k] * xr[k];
                    sq += (double)wr[k] * xq_d[k];
                    mag += fabs((double)wr[k] * xr[k]);
                    magq += fabs((double)wr[k] * xq_d[k]);
                    var += (double)wr[k] * wr[k] * step * step / 12.0;
                }
            }
            p->want_ref[t * N + n] = s;
            p->tol_ref[t * N + n] = TOL_ACT_SIGMAS * sqrt(var) + TOL_F32_ACCUM * mag;
            p->want_q[t * N + n] = sq;
            p->tol_q[t * N + n] = TOL_F32_ACCUM * magq + 1e-30;
        }
    }
    xfree(row);
    xfree(xq);
}

static void problem_free(struct problem *p)
{
    xfree(p->x), xfree(p->w), xfree(p->wd), xfree(p->xd);
    xfree(p->want_ref), xfree(p->tol_ref), xfree(p->want_q), xfree(p->tol_q);
}

/* Runs v on p; checks guards and one of the two references. Returns the worst error/tol. */
static double run_check(const struct problem *p, const struct cpu_matmul_variant *v, int threads,
                        bool same_act)
{
    int64_t ylen = p->T * p->ldy;
    float *y = xmalloc((size_t)ylen, sizeof(float));
    for (int64_t i = 0; i < ylen; i++)
        y[i] = GUARD;
    struct cpu_matmul_args a = {
        .y = y, .x = p->x, .w = p->w, .wtype = p->wt, .T = p->T, .K = p->K, .N = p->N,
        .ldx = p->ldx, .ldy = p->ldy, .w_row_bytes = p->row_bytes, .n_threads = threads,
    };
    v->fn(&a);
    double worst = 0;
    for (int64_t t = 0; t < p->T; t++) {
        for (int64_t n = p->N; n < p->ldy; n++)
            if (y[t * p->ldy + n] != GUARD)
                fail_msg("%s: guard after row %lld overwritten", v->key, (long long)t);
        for (int64_t n = 0; n < p->N; n++) {
            double want = same_act ? p->want_q[t * p->N + n] : p->want_ref[t * p->N + n];
            double tol = same_act ? p->tol_q[t * p->N + n] : p->tol_ref[t * p->N + n];
            double got = y[t * p->ldy + n], r = fabs(got - want) / tol;
            if (!(r <= 1.0))
                fail_msg("%s T=%lld K=%lld N=%lld threads=%d %s: y[%lld][%lld] = %.8g, want "
                         "%.8g (tol %.3g)", v->key, (long long)p->T, (long long)p->K,
                         (long long)p->N, threads, same_act ? "same-activations" : "vs ref",
                         (long long)t, (long long)n, got, want, tol);
            worst = r > worst ? r : worst;
        }
    }
    xfree(y);
    return worst;
}

static void check_type(enum qr_dtype wt)
{
    static const int64_t Ks[] = {256, 768, 800}, Ns[] = {1, 7, 33, 129}, Ts[] = {1, 3, 17};
    size_t n_k = (wt == QR_Q8_0 || wt == QR_Q4_0) ? 3 : 2; /* 800: 25 blocks, an odd count */
    uint32_t feats = cpu_features_detect();
    int n_variants = 0;
    for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++) {
        if (v->wtype != wt || (v->cpu_features & feats) != v->cpu_features)
            continue;
        /* .exact keeps x in f32, so only the first check applies to it; .ref rounds x like the
         * fast variants and takes both */
        bool is_ref = strstr(v->key, ".exact") != NULL;
        double worst_ref = 0, worst_q = 0;
        uint64_t seed = 0x9E3779B97F4A7C15ull;
        for (size_t ik = 0; ik < n_k; ik++) {
            for (size_t in = 0; in < 4; in++) {
                for (size_t it = 0; it < 3; it++) {
                    struct problem p;
                    problem_init(&p, wt, Ts[it], Ks[ik], Ns[in], seed++);
                    for (int th = 1; th <= 3; th += 2) {
                        double r = run_check(&p, v, th, false);
                        worst_ref = r > worst_ref ? r : worst_ref;
                        if (!is_ref) {
                            r = run_check(&p, v, th, true);
                            worst_q = r > worst_q ? r : worst_q;
                        }
                    }
                    problem_free(&p);
                }
            }
        }
        print_message("%-24s worst error/tol: vs ref %.3f, same activations %.3f\n", v->key,
                      worst_ref, worst_q);
        n_variants++;
    }
    assert_true(n_variants >= 2); /* at least ref and portable */
}

static void test_q8_0(void **state) { (void)state; check_type(QR_Q8_0); }
static void test_q4_0(void **state) { (void)state; check_type(QR_Q4_0); }
static void test_q4_k(void **state) { (void)state; check_type(QR_Q4_K); }
static void test_q5_k(void **state) { (void)state; check_type(QR_Q5_K); }
static void test_q6_k(void **state) { (void)state; check_type(QR_Q6_K); }

/* On this CPU (AVX-512 VNNI) the pick must be the VNNI variant; elsewhere the best that runs. */
static void test_pick(void **state)
{
    (void)state;
    uint32_t f = cpu_features_detect();
    const struct cpu_matmul_variant *v = cpu_matmul_pick(QR_Q4_K, f, NULL);
    assert_non_null(v);
    if (f & CPU_AVX512VNNI)
        assert_string_equal(v->key, "matmul.q4_k.avx512vnni");
    assert_non_null(cpu_matmul_pick(QR_Q6_K, 0, "matmul.q6_k.portable"));
    assert_null(cpu_matmul_pick(QR_Q6_K, 0, "matmul.q6_k.avx2"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0), cmocka_unit_test(test_q4_0), cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_q5_k), cmocka_unit_test(test_q6_k), cmocka_unit_test(test_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
