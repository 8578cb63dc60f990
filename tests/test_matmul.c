/*
 * test_matmul.c — every registered float-weight matmul variant (F32, F16, BF16) that can run on
 * this CPU against matmul_ref (matmul.<wtype>.ref).
 *
 * Shapes are awkward on purpose: K and N not multiples of 16 or 32, T below and above the
 * micro-kernel height, strides larger than K and N, 1 and 3 threads. Padding is poisoned:
 * x's row padding and each weight row's padding hold NaN (a kernel reading past K would turn
 * the result into NaN), and y's padding after each output row holds a guard value that must
 * survive. Specials: NaN and Inf in x and W must give NaN/Inf where the reference does.
 * Random data come from a fixed-seed xorshift, so runs are deterministic.
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
#include "quant/quant.h"

/* Variants sum in another order than the reference (and with several partial sums), so results
 * differ by f32 rounding: bounded by about sqrt(K) * 2^-24 * sum|w*x| for random signs; 1e-5
 * of sum|w*x| leaves a margin for K ~ 1000 while a wrong element (error ~ |w*x|) still fails. */
#define TOL_F32_ACCUM 1e-5

static const float GUARD = -12345.5f; /* written after each output row; must stay */

struct rng {
    uint64_t s;
};

static float rng_uniform(struct rng *r) /* in [-1, 1) */
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((r->s >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* One problem: inputs with poisoned padding, and the reference output. */
struct problem {
    struct cpu_matmul_args a; /* y points at `got`, n_threads set by the caller */
    float *x;                 /* [T][ldx], NaN after K */
    uint8_t *w;               /* [N][w_row_bytes], NaN after K elements */
    float *want;              /* [T][ldy] from matmul_ref */
    float *got;               /* [T][ldy] + guard tail */
    double *mag;              /* [T][N] sum_k |w*x| for the tolerance */
    int64_t y_len;            /* floats in got/want */
};

static size_t elem_size(enum qr_dtype t) { return t == QR_F32 ? 4 : 2; }

static void problem_init(struct problem *p, enum qr_dtype wt, int64_t T, int64_t K, int64_t N,
                         uint64_t seed)
{
    struct rng r = {seed * 0x9e3779b97f4a7c15ull + 1};
    memset(p, 0, sizeof(*p));
    int64_t ldx = K + 3, ldy = N + 5;
    size_t esz = elem_size(wt), rb = (size_t)K * esz + 8;
    p->y_len = T * ldy + 16;
    p->x = xmalloc((size_t)(T * ldx), sizeof(float));
    p->w = xmalloc((size_t)N, rb);
    p->want = xmalloc((size_t)p->y_len, sizeof(float));
    p->got = xmalloc((size_t)p->y_len, sizeof(float));
    p->mag = xcalloc((size_t)(T * N), sizeof(double));
    float *row = xmalloc((size_t)K, sizeof(float));
    assert_non_null(p->x);
    assert_non_null(p->w);
    assert_non_null(p->want);
    assert_non_null(p->got);
    assert_non_null(p->mag);
    assert_non_null(row);

    for (int64_t i = 0; i < T * ldx; i++)
        p->x[i] = (i % ldx) < K ? rng_uniform(&r) : NAN;
    memset(p->w, 0xff, (size_t)N * rb); /* all-ones = NaN in f32, f16 and bf16 */
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++)
            row[k] = rng_uniform(&r);
        assert_true(quant_quantize_row(wt, row, p->w + (size_t)n * rb, K));
    }
    for (int64_t i = 0; i < p->y_len; i++)
        p->want[i] = p->got[i] = GUARD;

    p->a = (struct cpu_matmul_args){
        .y = p->want, .x = p->x, .w = p->w, .wtype = wt, .T = T, .K = K, .N = N,
        .ldx = ldx, .ldy = ldy, .w_row_bytes = rb, .n_threads = 1,
    };
    matmul_ref(&p->a);
    p->a.y = p->got;
    xfree(row);
}

/* sum_k |w*x| per output, from the stored (rounded) weights. */
static void problem_magnitudes(struct problem *p)
{
    float *row = xmalloc((size_t)p->a.K, sizeof(float));
    assert_non_null(row);
    for (int64_t n = 0; n < p->a.N; n++) {
        assert_true(quant_dequantize_row(p->a.wtype, p->w + (size_t)n * p->a.w_row_bytes, row,
                                         p->a.K));
        for (int64_t t = 0; t < p->a.T; t++) {
            double s = 0.0;
            for (int64_t k = 0; k < p->a.K; k++)
                s += fabs((double)row[k] * (double)p->x[t * p->a.ldx + k]);
            p->mag[t * p->a.N + n] = s;
        }
    }
    xfree(row);
}

static void problem_free(struct problem *p)
{
    xfree(p->x);
    xfree(p->w);
    xfree(p->want);
    xfree(p->got);
    xfree(p->mag);
}

/* Number of mismatches (printed, at most a few); 0 when got matches want. */
static int problem_check(const struct problem *p, const char *key)
{
    int bad = 0;
    const struct cpu_matmul_args *a = &p->a;
    for (int64_t i = 0; i < p->y_len; i++) {
        int64_t t = i / a->ldy, n = i % a->ldy;
        float g = p->got[i], w = p->want[i];
        const char *why = NULL;
        if (t >= a->T || n >= a->N) {
            if (memcmp(&g, &GUARD, sizeof(g)) != 0)
                why = "guard overwritten";
        } else if (isnan(w) || isnan(g)) {
            if (isnan(w) != isnan(g))
                why = "NaN disagreement";
        } else if (isinf(w) || isinf(g)) {
            if (g != w)
                why = "Inf disagreement";
        } else if (fabs((double)g - (double)w) > TOL_F32_ACCUM * p->mag[t * a->N + n] + 1e-30) {
            why = "outside tolerance";
        }
        if (why && bad++ < 4)
            print_error("%s T=%lld K=%lld N=%lld threads=%d: y[%lld][%lld] = %.9g, ref %.9g: %s\n",
                        key, (long long)a->T, (long long)a->K, (long long)a->N, a->n_threads,
                        (long long)t, (long long)n, g, w, why);
    }
    return bad;
}

static bool is_runnable_float_variant(const struct cpu_matmul_variant *v, enum qr_dtype wt)
{
    uint32_t f = cpu_features_detect();
    return v->wtype == wt && v->fn != matmul_ref && (v->cpu_features & f) == v->cpu_features;
}

static void check_dtype_shapes(enum qr_dtype wt)
{
    static const int64_t Ks[] = {1, 15, 16, 17, 1000, 1024 + 3};
    static const int64_t Ns[] = {1, 7, 33, 129};
    static const int64_t Ts[] = {1, 2, 5, 7, 17, 64};
    static const int threads[] = {1, 3};
    int bad = 0, ran = 0;
    uint64_t seed = 1;
    for (size_t ik = 0; ik < sizeof(Ks) / sizeof(Ks[0]); ik++)
        for (size_t in = 0; in < sizeof(Ns) / sizeof(Ns[0]); in++)
            for (size_t it = 0; it < sizeof(Ts) / sizeof(Ts[0]); it++) {
                struct problem p;
                problem_init(&p, wt, Ts[it], Ks[ik], Ns[in], seed++);
                problem_magnitudes(&p);
                for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++) {
                    if (!is_runnable_float_variant(v, wt))
                        continue;
                    for (size_t th = 0; th < 2; th++) {
                        for (int64_t i = 0; i < p.y_len; i++)
                            p.got[i] = GUARD;
                        p.a.n_threads = threads[th];
                        v->fn(&p.a);
                        bad += problem_check(&p, v->key) != 0;
                        ran++;
                    }
                }
                problem_free(&p);
            }
    print_message("%s: %d runs, %d failed\n", dtype_traits(wt)->name, ran, bad);
    assert_true(ran > 0);
    assert_int_equal(bad, 0);
}

static void test_f32_shapes(void **state) { check_dtype_shapes(QR_F32); }
static void test_f16_shapes(void **state) { check_dtype_shapes(QR_F16); }
static void test_bf16_shapes(void **state) { check_dtype_shapes(QR_BF16); }

/* NaN and Inf in x and W: a NaN input poisons its token's (x) or its output's (W) results, an
 * Inf weight gives +-Inf (or NaN where it meets a zero or an opposite Inf) like the reference. */
static void check_dtype_specials(enum qr_dtype wt)
{
    static const int64_t shapes[][3] = {{1, 40, 37}, {3, 1000, 35}, {19, 33, 70}, {9, 257, 64}};
    int bad = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int64_t T = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        struct problem p;
        problem_init(&p, wt, T, K, N, 100 + s);
        float *row = xmalloc((size_t)K, sizeof(float));
        assert_non_null(row);
        /* weights: row 2 gets +Inf, row 5 -Inf, row 6 both (NaN), row N-1 a NaN */
        int64_t special_rows[] = {2, 5, 6, N - 1};
        for (size_t i = 0; i < 4; i++) {
            int64_t n = special_rows[i];
            uint8_t *dst = p.w + (size_t)n * p.a.w_row_bytes;
            assert_true(quant_dequantize_row(wt, dst, row, K));
            if (n == 2 || n == 6)
                row[K / 2] = INFINITY;
            if (n == 5 || n == 6)
                row[K - 1] = -INFINITY;
            if (n == N - 1)
                row[0] = NAN;
            assert_true(quant_quantize_row(wt, row, dst, K));
        }
        /* activations: last token gets a NaN, token 0 an Inf (when T > 1), one zero */
        p.x[(T - 1) * p.a.ldx + K / 3] = NAN;
        if (T > 1)
            p.x[K - 1] = INFINITY;
        p.x[K / 2] = 0.0f;
        for (int64_t i = 0; i < p.y_len; i++)
            p.want[i] = GUARD;
        p.a.y = p.want;
        matmul_ref(&p.a);
        p.a.y = p.got;
        problem_magnitudes(&p);
        for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++) {
            if (!is_runnable_float_variant(v, wt))
                continue;
            for (int th = 1; th <= 2; th++) {
                for (int64_t i = 0; i < p.y_len; i++)
                    p.got[i] = GUARD;
                p.a.n_threads = th;
                v->fn(&p.a);
                bad += problem_check(&p, v->key) != 0;
            }
        }
        xfree(row);
        problem_free(&p);
    }
    assert_int_equal(bad, 0);
}

static void test_f32_specials(void **state) { check_dtype_specials(QR_F32); }
static void test_f16_specials(void **state) { check_dtype_specials(QR_F16); }
static void test_bf16_specials(void **state) { check_dtype_specials(QR_BF16); }

/* The registry picks a runnable, non-reference float variant for each float dtype, and finds
 * each variant by its key. */
static void test_pick(void **state)
{
    uint32_t f = cpu_features_detect();
    enum qr_dtype types[] = {QR_F32, QR_F16, QR_BF16};
    for (size_t i = 0; i < 3; i++) {
        const struct cpu_matmul_variant *v = cpu_matmul_pick(types[i], f, NULL);
        assert_non_null(v);
        assert_int_equal(v->wtype, types[i]);
        assert_true(v->fn != matmul_ref);
        assert_int_equal(v->cpu_features & f, v->cpu_features);
    }
    for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key; v++)
        if ((v->cpu_features & f) == v->cpu_features)
            assert_ptr_equal(cpu_matmul_pick(v->wtype, f, v->key), v);
    assert_null(cpu_matmul_pick(QR_F16, f, "matmul.f16.nonexistent"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_shapes),   cmocka_unit_test(test_f16_shapes),
        cmocka_unit_test(test_bf16_shapes),  cmocka_unit_test(test_f32_specials),
        cmocka_unit_test(test_f16_specials), cmocka_unit_test(test_bf16_specials),
        cmocka_unit_test(test_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
