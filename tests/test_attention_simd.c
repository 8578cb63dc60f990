/*
 * test_attention_simd.c — attention.avx512 and attention.avx2 (each where the CPU has it)
 * against attention.ref (kernels_ref.c) on random
 * q/k/v of awkward sizes: head_dim 128, 80 (a 16-lane tail) and 8; GQA groups 1, 2 and 3;
 * T = 1 (decode: serial path, and threaded over 300 cached positions) and 5, 37 (prefill,
 * threaded path) after a prefix already in the cache (pos0 = 0, 23, 300); 1 and 3 threads; a
 * peaky softmax (q scaled by 40: most weights underflow to 0). Only the summation order of q·k and of the
 * softmax-weighted V differs, so outputs agree to f32 rounding relative to Σ|w·v|, and the KV
 * cache rows written are bit-identical. The result must not depend on the thread count.
 * The same with the cache in f16 (seq_state.kv_f16): both kernels read the same rounded rows,
 * and the f16 result stays within f16 rounding of the f32 one (and is not it); the rows they
 * write from values at the edges of f16 rounding are the same bits.
 */
#include <stdlib.h>

#include "testutil.h"

#include "backend/cpu/cpu_backend.h"
#include "base/cpu_features.h"

#define REL_TOL 2e-5 /* f32 regrouping over <= 128 products and <= 60 positions */

/* The vector kernels and what they need of the CPU. */
static const struct simd_kernel {
    const char *key;
    cpu_op_fn fn;
    void (*exp)(const float *x, float *y, int32_t n);
    uint32_t needs;
} simd[] = {
    {"attention.avx512", attention_avx512, attention_avx512_exp, CPU_AVX512F | CPU_AVX2},
    {"attention.avx2", attention_avx2, attention_avx2_exp, CPU_AVX2},
};
#define N_SIMD (sizeof(simd) / sizeof(simd[0]))

/* Whether kernel k runs here; skips the test when none does. */
static bool simd_here(size_t k)
{
    uint32_t f = cpu_features_detect();
    bool any = false;
    for (size_t i = 0; i < N_SIMD; i++)
        any |= (f & simd[i].needs) == simd[i].needs;
    if (!any)
        skip();
    return (f & simd[k].needs) == simd[k].needs;
}

struct rng {
    uint64_t s;
};

static float urand(struct rng *r, float lo, float hi)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint64_t x = r->s * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((double)(x >> 40) / (double)(1ull << 24));
}

struct attn_case {
    int32_t n_head, n_head_kv, head_dim, T, pos0;
    bool specials; /* K and V rows start with the values f16 rounding must get right */
    float q_amp;   /* q in [-2 q_amp, 2 q_amp]: large values make the softmax peaky (scores far
                    * below their maximum, e^x underflowing) */
};

/* f32 values at the edges of f16 rounding (NaN aside: its payload is not specified): ties to
 * even among the subnormals and normals, the largest finite and the first to overflow, zeros
 * of both signs, infinities, an f32 subnormal. */
static const float f16_edges[] = {
    0x1p-25f, 0x3p-25f, 0x1p-24f, 0x1p-14f, 0x1p-14f - 0x1p-25f, 6.1e-5f, 1e-7f, -3e-8f,
    65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f, -0.0f, 0.0f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
    -(1.0f + 0x3p-11f), INFINITY, -INFINITY, 1e-40f, 0.333333343f, -2.71828175f};

/* Runs fn on a fresh copy of the inputs; returns out [T][n_head*hd] and the KV cache (f32 rows,
 * or with f16 the rows as f16 bits in kcache16 / vcache16). */
static void run(cpu_op_fn fn, const struct attn_case *c, int threads, uint64_t seed, float *out,
                float *kcache, float *vcache, bool f16, uint16_t *kcache16, uint16_t *vcache16)
{
    struct rng r = {seed};
    int32_t hd = c->head_dim, kvw = c->n_head_kv * hd, qw = c->n_head * hd;
    int32_t n_ctx = c->pos0 + c->T;
    struct plan plan;
    assert_true(plan_init(&plan, PHASE_PREFILL));
    int32_t bq = plan_add_buf(&plan, "q", qw), bk = plan_add_buf(&plan, "k", kvw),
            bv = plan_add_buf(&plan, "v", kvw), bo = plan_add_buf(&plan, "o", qw);
    struct plan_op *op = plan_add_op(&plan, OP_ATTENTION, 0);
    assert_false(plan.failed);
    *op = (struct plan_op){.kind = OP_ATTENTION,
                           .layer = 0,
                           .out = bo,
                           .in = bq,
                           .in2 = bk,
                           .in3 = bv,
                           .n_head = c->n_head,
                           .n_head_kv = c->n_head_kv,
                           .head_dim = hd,
                           .q_stride = hd};
    float *q = malloc((size_t)c->T * qw * sizeof(float));
    float *k = malloc((size_t)c->T * kvw * sizeof(float));
    float *v = malloc((size_t)c->T * kvw * sizeof(float));
    for (int64_t i = 0; i < (int64_t)c->T * qw; i++)
        q[i] = urand(&r, -2.0f, 2.0f) * c->q_amp;
    for (int64_t i = 0; i < (int64_t)c->T * kvw; i++) {
        k[i] = urand(&r, -2.0f, 2.0f);
        v[i] = urand(&r, -1.0f, 1.0f);
    }
    size_t n_edges = sizeof(f16_edges) / sizeof(f16_edges[0]);
    for (size_t i = 0; c->specials && i < n_edges && i < (size_t)c->T * kvw; i++)
        k[i] = f16_edges[i], v[(size_t)c->T * kvw - 1 - i] = f16_edges[i];
    for (int64_t i = 0; i < (int64_t)n_ctx * kvw; i++) { /* the prefix already cached */
        kcache[i] = i < (int64_t)c->pos0 * kvw ? urand(&r, -2.0f, 2.0f) : 0.0f;
        vcache[i] = i < (int64_t)c->pos0 * kvw ? urand(&r, -1.0f, 1.0f) : 0.0f;
        if (f16)
            kcache16[i] = f32_to_f16(kcache[i]), vcache16[i] = f32_to_f16(vcache[i]);
    }
    float *kp[1] = {f16 ? NULL : kcache}, *vp[1] = {f16 ? NULL : vcache};
    uint16_t *kp16[1] = {kcache16}, *vp16[1] = {vcache16};
    struct seq_state st = {.n_layer = 1,
                           .n_ctx = n_ctx,
                           .k_cache = kp,
                           .v_cache = vp,
                           .kv_f16 = f16,
                           .k_cache16 = kp16,
                           .v_cache16 = vp16,
                           .kv_width = kvw};
    float *scratch = malloc((size_t)(n_ctx + 1) * 256 * sizeof(float));
    struct cpu_exec ex = {.plan = &plan,
                          .T = c->T,
                          .pos0 = c->pos0,
                          .state = &st,
                          .n_threads = threads,
                          .scratch = scratch,
                          .scratch_len = (int64_t)(n_ctx + 1) * 256};
    ex.bufs[bq] = q, ex.bufs[bk] = k, ex.bufs[bv] = v, ex.bufs[bo] = out;
    fn(op, &ex);
    free(q), free(k), free(v), free(scratch);
    plan_free(&plan);
}

static void check_vs_ref(size_t k)
{
    cpu_op_fn fast = simd[k].fn;
    static const struct attn_case cases[] = {
        {16, 8, 128, 1, 0, false, 1.0f}, {16, 8, 128, 1, 23, false, 1.0f}, {16, 8, 128, 37, 0, false, 1.0f}, {16, 8, 128, 5, 23, false, 1.0f},
        {6, 2, 80, 1, 23, false, 1.0f},  {6, 2, 80, 37, 23, false, 1.0f},  {4, 4, 8, 5, 23, false, 1.0f},    {3, 1, 128, 37, 0, false, 1.0f},
        {16, 8, 128, 1, 300, false, 1.0f}, /* decode over 1.2 MB of cache: the threaded path */
        {4, 2, 256, 3, 40, false, 40.0f},  /* scores spread over ~+-100: exp's underflow and clamp */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct attn_case *c = &cases[i];
        size_t nout = (size_t)c->T * c->n_head * c->head_dim;
        size_t ncache = (size_t)(c->pos0 + c->T) * c->n_head_kv * c->head_dim;
        float *want = calloc(nout, sizeof(float)), *got = calloc(nout, sizeof(float));
        float *got1 = calloc(nout, sizeof(float));
        float *kw = malloc(ncache * sizeof(float)), *vw = malloc(ncache * sizeof(float));
        float *kg = malloc(ncache * sizeof(float)), *vg = malloc(ncache * sizeof(float));
        run(attention_ref, c, 1, 1000 + i, want, kw, vw, false, NULL, NULL);
        run(fast, c, 3, 1000 + i, got, kg, vg, false, NULL, NULL);
        run(fast, c, 1, 1000 + i, got1, kg, vg, false, NULL, NULL);
        assert_memory_equal(kw, kg, ncache * sizeof(float));
        assert_memory_equal(vw, vg, ncache * sizeof(float));
        assert_memory_equal(got, got1, nout * sizeof(float)); /* thread count is invisible */
        for (size_t j = 0; j < nout; j++) {
            /* |o| <= max|v| = 1, a convex combination: relative to 1 */
            if (!(fabsf(got[j] - want[j]) <= REL_TOL))
                fail_msg("%s case %zu (H %d/%d hd %d T %d pos0 %d): out[%zu] = %.8g, want %.8g", simd[k].key, i,
                         c->n_head, c->n_head_kv, c->head_dim, c->T, c->pos0, j, got[j], want[j]);
        }
        free(want), free(got), free(got1), free(kw), free(vw), free(kg), free(vg);
    }
}

static void test_vs_ref(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SIMD; k++)
        if (simd_here(k))
            check_vs_ref(k);
}

/* The f16 cache: the two kernels on the same rounded rows agree as closely as on f32 rows, the
 * cache rows they write are the same bits, and the result is the f32 one to f16 rounding. */
static void check_f16_cache(size_t k)
{
    static const struct attn_case cases[] = {
        {16, 8, 128, 1, 23, false, 1.0f}, {16, 8, 128, 5, 0, false, 1.0f}, {6, 2, 80, 37, 23, false, 1.0f}, {4, 4, 8, 5, 23, false, 1.0f}, {3, 1, 256, 1, 40, false, 1.0f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct attn_case *c = &cases[i];
        size_t nout = (size_t)c->T * c->n_head * c->head_dim;
        size_t ncache = (size_t)(c->pos0 + c->T) * c->n_head_kv * c->head_dim;
        float *want = calloc(nout, sizeof(float)), *got = calloc(nout, sizeof(float));
        float *f32 = calloc(nout, sizeof(float));
        float *kf = malloc(ncache * sizeof(float)), *vf = malloc(ncache * sizeof(float));
        uint16_t *kw = calloc(ncache, 2), *vw = calloc(ncache, 2), *kg = calloc(ncache, 2), *vg = calloc(ncache, 2);
        run(attention_ref, c, 1, 2000 + i, want, kf, vf, true, kw, vw);
        run(simd[k].fn, c, 3, 2000 + i, got, kf, vf, true, kg, vg);
        assert_memory_equal(kw, kg, ncache * 2);
        assert_memory_equal(vw, vg, ncache * 2);
        run(attention_ref, c, 1, 2000 + i, f32, kf, vf, false, NULL, NULL);
        double worst16 = 0;
        for (size_t j = 0; j < nout; j++) {
            if (!(fabsf(got[j] - want[j]) <= REL_TOL))
                fail_msg("%s f16 case %zu: out[%zu] = %.8g, want %.8g", simd[k].key, i, j, got[j], want[j]);
            worst16 = fmax(worst16, fabsf(want[j] - f32[j]));
        }
        /* k rounded to 2^-11 of |k| <= 2 moves the scores by ~1e-2 at most */
        if (!(worst16 <= 2e-2) || worst16 == 0.0)
            fail_msg("f16 case %zu: %.3g from the f32 cache's result", i, worst16);
        free(want), free(got), free(f32), free(kf), free(vf), free(kw), free(vw), free(kg), free(vg);
    }
}

static void test_f16_cache(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SIMD; k++)
        if (simd_here(k))
            check_f16_cache(k);
}

/* The f16 rows each kernel writes, from values at the edges of f16 rounding (the fast kernel
 * converts 16 at a time with vcvtps2ph, the reference one by one): the same bits. */
static void check_f16_store_edges(size_t k)
{
    static const struct attn_case cases[] = {{2, 1, 24, 2, 0, true, 1.0f}, {4, 2, 128, 1, 3, true, 1.0f}, {6, 2, 80, 3, 1, true, 1.0f}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct attn_case *c = &cases[i];
        size_t nout = (size_t)c->T * c->n_head * c->head_dim;
        size_t ncache = (size_t)(c->pos0 + c->T) * c->n_head_kv * c->head_dim;
        float *out = calloc(nout, sizeof(float));
        float *kf = malloc(ncache * sizeof(float)), *vf = malloc(ncache * sizeof(float));
        uint16_t *kw = calloc(ncache, 2), *vw = calloc(ncache, 2), *kg = calloc(ncache, 2), *vg = calloc(ncache, 2);
        run(attention_ref, c, 1, 3000 + i, out, kf, vf, true, kw, vw);
        run(simd[k].fn, c, 1, 3000 + i, out, kf, vf, true, kg, vg);
        for (size_t j = 0; j < ncache; j++)
            if (kw[j] != kg[j] || vw[j] != vg[j])
                fail_msg("%s case %zu: cache element %zu: K %04x vs %04x, V %04x vs %04x", simd[k].key, i, j, kw[j], kg[j], vw[j],
                         vg[j]);
        size_t at = (size_t)c->pos0 * c->n_head_kv * c->head_dim; /* the first written K row */
        assert_int_equal(kw[at + 0], 0x0000);  /* 2^-25: a tie, to the even 0 */
        assert_int_equal(kw[at + 1], 0x0002);  /* 3 x 2^-25: a tie, to the even 2 x 2^-24 */
        assert_int_equal(kw[at + 10], 0x7c00); /* 65520: overflows to infinity */
        assert_int_equal(kw[at + 13], 0x8000); /* -0 */
        free(out), free(kf), free(vf), free(kw), free(vw), free(kg), free(vg);
    }
}

static void test_f16_store_edges(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SIMD; k++)
        if (simd_here(k))
            check_f16_store_edges(k);
}

/* The softmax's vector e^x against expf over [-110, 0]: within 3e-7 relative where the result
 * is normal, 0 or tiny beyond; e^0 = 1 exactly. */
static void check_exp(size_t k)
{
    enum { N = 20011 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    struct rng r = {77};
    for (int i = 0; i < N; i++)
        x[i] = i < 11001 ? -110.0f * (float)i / 11000.0f : urand(&r, -20.0f, 0.0f);
    x[5] = 0.0f, x[6] = -0.0f;
    simd[k].exp(x, y, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        if (want < 1.2e-38) { /* past the normal range: zero or a subnormal as small */
            if (!(y[i] >= 0 && y[i] < 1.2e-38))
                fail_msg("e^%g = %g, want ~%g", x[i], y[i], want);
            continue;
        }
        double e = fabs(y[i] - want) / want;
        worst = e > worst ? e : worst;
    }
    printf("%s exp worst relative error %.3g\n", simd[k].key, worst);
    assert_true(worst <= 3e-7);
    assert_true(y[5] == 1.0f && y[6] == 1.0f);
    free(x), free(y);
}

static void test_exp(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SIMD; k++)
        if (simd_here(k))
            check_exp(k);
}

/* The registry picks it on this CPU; a forced key finds it. */
static void test_pick(void **state)
{
    (void)state;
    uint32_t f = cpu_features_detect();
    const struct cpu_op_kernel *k = cpu_op_pick(OP_ATTENTION, f, NULL);
    assert_non_null(k);
    if ((f & (CPU_AVX512F | CPU_AVX2)) == (CPU_AVX512F | CPU_AVX2))
        assert_string_equal(k->key, "attention.avx512");
    /* a CPU with AVX2 but not AVX-512 gets the AVX2 kernel, one with neither the reference */
    assert_string_equal(cpu_op_pick(OP_ATTENTION, CPU_AVX2, NULL)->key, "attention.avx2");
    assert_string_equal(cpu_op_pick(OP_ATTENTION, 0, NULL)->key, "attention.ref");
    assert_non_null(cpu_op_pick(OP_ATTENTION, 0, "attention.ref"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_ref),
        cmocka_unit_test(test_f16_cache),
        cmocka_unit_test(test_f16_store_edges),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
