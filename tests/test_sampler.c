/*
 * test_sampler.c — each sampling filter does what it says, with fixed seeds: greedy is argmax;
 * top-k never returns a token outside the k best; top-p keeps the smallest prefix reaching p;
 * min-p drops what is below min_p x the top probability; penalties change the right logits;
 * draw frequencies match the softmax distribution (chi-square); the same seed repeats; the
 * subset path (the m best tokens and the gathered logits, what a GPU session sends back) draws
 * exactly the token the whole row gives.
 */
#include <stdlib.h>

#include "testutil.h"

#include "qwenrt.h"
#include "runtime/sampler.h"

#define V 50

static void fill_logits(float *l, uint32_t seed)
{
    for (int i = 0; i < V; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = (float)(seed >> 8) / (float)(1u << 24) * 6.0f - 3.0f;
    }
}

static struct qwenrt_sampler *make(struct qwenrt_sampler_params p)
{
    struct qwenrt_sampler *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_OK);
    return s;
}

static void test_greedy(void **st)
{
    (void)st;
    float l[V];
    fill_logits(l, 1);
    struct qwenrt_sampler *s = make(qwenrt_sampler_default_params());
    for (int i = 0; i < 10; i++)
        assert_int_equal(qwenrt_sampler_sample(s, l), argmax_f(l, V));
    qwenrt_sampler_free(s);
}

static void test_top_k_only_best(void **st)
{
    (void)st;
    float l[V];
    fill_logits(l, 2);
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.temperature = 5.0f; /* flat: without top-k every token would appear */
    p.top_k = 5;
    p.seed = 42;
    struct qwenrt_sampler *s = make(p);
    int seen[V] = {0};
    for (int i = 0; i < 5000; i++)
        seen[qwenrt_sampler_sample(s, l)]++;
    int distinct = 0;
    for (int id = 0; id < V; id++) {
        if (!seen[id])
            continue;
        distinct++;
        int better = 0; /* tokens with a strictly higher logit */
        for (int j = 0; j < V; j++)
            better += l[j] > l[id];
        assert_true(better < 5);
    }
    assert_int_equal(distinct, 5);
    qwenrt_sampler_free(s);
}

/* frequencies over many draws match softmax(l / T): chi-square with V-1 dof below a bound
 * that a correct sampler exceeds with probability < 1e-6 */
static void test_distribution(void **st)
{
    (void)st;
    float l[V];
    fill_logits(l, 3);
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.temperature = 0.7f;
    p.seed = 7;
    struct qwenrt_sampler *s = make(p);
    const int N = 200000;
    int count[V] = {0};
    for (int i = 0; i < N; i++)
        count[qwenrt_sampler_sample(s, l)]++;
    double mx = -1e30, z = 0.0, prob[V], chi2 = 0.0;
    for (int i = 0; i < V; i++)
        mx = l[i] / 0.7 > mx ? l[i] / 0.7 : mx;
    for (int i = 0; i < V; i++)
        z += prob[i] = exp(l[i] / 0.7 - mx);
    for (int i = 0; i < V; i++) {
        double e = N * prob[i] / z;
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    printf("chi2 = %.1f over %d bins\n", chi2, V);
    assert_true(chi2 < 120.0); /* 49 dof: P(chi2 > 120) ~ 1e-7 */
    qwenrt_sampler_free(s);
}

static void test_top_p_and_min_p_filters(void **st)
{
    (void)st;
    struct sampler_cand c[4] = {{0, 0, 0.5f}, {1, 0, 0.3f}, {2, 0, 0.15f}, {3, 0, 0.05f}};
    assert_int_equal(sampler_top_p(c, 4, 0.75f), 2); /* 0.5 + 0.3 >= 0.75 */
    assert_float_equal(c[0].p + c[1].p, 1.0f, 1e-6);
    struct sampler_cand d[4] = {{0, 0, 0.5f}, {1, 0, 0.3f}, {2, 0, 0.15f}, {3, 0, 0.05f}};
    assert_int_equal(sampler_min_p(d, 4, 0.25f), 3); /* cut 0.125: keeps 0.5, 0.3, 0.15 */
    struct sampler_cand e[4] = {{0, 0, 0.5f}, {1, 0, 0.3f}, {2, 0, 0.15f}, {3, 0, 0.05f}};
    assert_int_equal(sampler_top_p(e, 4, 0.1f), 1); /* at least one */
    struct sampler_cand f[5] = {{0, 1.0f, 0}, {1, 5.0f, 0}, {2, -2.0f, 0}, {3, 3.0f, 0}, {4, 4.0f, 0}};
    assert_int_equal(sampler_top_k(f, 5, 3), 3);
    assert_int_equal(f[0].id, 1);
    assert_int_equal(f[1].id, 4);
    assert_int_equal(f[2].id, 3);
}

static void test_penalties(void **st)
{
    (void)st;
    float l[V] = {0};
    l[3] = 2.0f;
    l[4] = 1.9f;
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.repeat_penalty = 1.5f; /* 2.0 / 1.5 = 1.33 < 1.9 */
    struct qwenrt_sampler *s = make(p);
    assert_int_equal(qwenrt_sampler_sample(s, l), 3);
    qwenrt_sampler_accept(s, 3);
    assert_int_equal(qwenrt_sampler_sample(s, l), 4);
    qwenrt_sampler_free(s);
    p = qwenrt_sampler_default_params();
    p.presence_penalty = 0.5f;
    p.penalty_last_n = 1; /* only the last token counts */
    s = make(p);
    qwenrt_sampler_accept(s, 3);
    assert_int_equal(qwenrt_sampler_sample(s, l), 4);
    qwenrt_sampler_accept(s, 7); /* 3 leaves the window */
    assert_int_equal(qwenrt_sampler_sample(s, l), 3);
    qwenrt_sampler_free(s);
}

static void test_seed_repeats(void **st)
{
    (void)st;
    float l[V];
    fill_logits(l, 4);
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    p.seed = 123;
    struct qwenrt_sampler *a = make(p), *b = make(p);
    int differ = 0, ids[64];
    for (int i = 0; i < 64; i++) {
        ids[i] = qwenrt_sampler_sample(a, l);
        assert_int_equal(ids[i], qwenrt_sampler_sample(b, l));
    }
    qwenrt_sampler_reset(a);
    for (int i = 0; i < 64; i++)
        assert_int_equal(ids[i], qwenrt_sampler_sample(a, l));
    p.seed = 124;
    struct qwenrt_sampler *c = make(p);
    for (int i = 0; i < 64; i++)
        differ += ids[i] != qwenrt_sampler_sample(c, l);
    assert_true(differ > 0);
    qwenrt_sampler_free(a);
    qwenrt_sampler_free(b);
    qwenrt_sampler_free(c);
}

/* Without top-k: temperature alone, with min-p, and with top-p all follow the filtered softmax
 * (chi-square against the exact filtered distribution computed here). */
static void check_no_top_k(float top_p, float min_p)
{
    float l[V];
    fill_logits(l, 9);
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.temperature = 0.8f;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = 11;
    struct qwenrt_sampler *s = make(p);
    const int N = 100000;
    int count[V] = {0};
    for (int i = 0; i < N; i++)
        count[qwenrt_sampler_sample(s, l)]++;
    /* expected: softmax, sorted prefix reaching top_p, then min-p, renormalised */
    double prob[V], mx = -1e30, z = 0.0;
    int order[V];
    for (int i = 0; i < V; i++)
        mx = l[i] / 0.8 > mx ? l[i] / 0.8 : mx;
    for (int i = 0; i < V; i++)
        z += prob[i] = exp(l[i] / 0.8 - mx);
    for (int i = 0; i < V; i++) {
        prob[i] /= z;
        order[i] = i;
    }
    for (int i = 0; i < V; i++) /* selection sort by probability, descending */
        for (int j = i + 1; j < V; j++)
            if (prob[order[j]] > prob[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    bool keep[V] = {0};
    double cum = 0.0, kept = 0.0;
    for (int i = 0; i < V; i++) {
        int id = order[i];
        if (prob[id] < min_p * prob[order[0]])
            break;
        keep[id] = true;
        kept += prob[id];
        if ((cum += prob[id]) >= top_p)
            break;
    }
    double chi2 = 0.0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        if (!keep[i]) {
            assert_int_equal(count[i], 0);
            continue;
        }
        double e = N * prob[i] / kept;
        chi2 += (count[i] - e) * (count[i] - e) / e;
        bins++;
    }
    printf("top_p %.2f min_p %.2f: %d tokens kept, chi2 %.1f\n", top_p, min_p, bins, chi2);
    assert_true(chi2 < 3.0 * bins + 30.0);
    qwenrt_sampler_free(s);
}

static void test_no_top_k(void **st)
{
    (void)st;
    check_no_top_k(1.0f, 0.0f);
    check_no_top_k(1.0f, 0.2f);
    check_no_top_k(0.7f, 0.0f);
    check_no_top_k(0.9f, 0.05f);
}

/* Logit bias: -100 bans the argmax (greedy takes the runner-up), +100 forces a token in
 * greedy and sampled draws, and the sampler keeps its own copy of the entries. */
static void test_logit_bias(void **st)
{
    (void)st;
    float l[V];
    fill_logits(l, 3);
    int32_t best = argmax_f(l, V), second = best == 0 ? 1 : 0;
    for (int32_t i = 0; i < V; i++)
        if (i != best && l[i] > l[second])
            second = i;
    struct qwenrt_logit_bias b[2] = {{best, -100.0f}, {7, 0.0f}};
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.logit_bias = b, p.n_logit_bias = 2;
    struct qwenrt_sampler *s = make(p);
    b[0].bias = +100.0f; /* the caller's array changes: the sampler must not see it */
    assert_int_equal(qwenrt_sampler_sample(s, l), second);
    qwenrt_sampler_free(s);
    int32_t low = argmax_f(l, V) == 11 ? 12 : 11;
    struct qwenrt_logit_bias force = {low, 100.0f};
    p = qwenrt_sampler_default_params();
    p.logit_bias = &force, p.n_logit_bias = 1;
    p.temperature = 1.0f, p.seed = 9;
    s = make(p);
    for (int i = 0; i < 20; i++)
        assert_int_equal(qwenrt_sampler_sample(s, l), low);
    qwenrt_sampler_free(s);
    p.top_k = 5; /* through the sorted path too */
    s = make(p);
    for (int i = 0; i < 20; i++)
        assert_int_equal(qwenrt_sampler_sample(s, l), low);
    qwenrt_sampler_free(s);
}

static void test_bad_params(void **st)
{
    (void)st;
    struct qwenrt_sampler *s = NULL;
    struct qwenrt_error err = {0};
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.top_p = 0.0f;
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_ERR_INVALID_ARG);
    p = qwenrt_sampler_default_params();
    p.temperature = -1.0f;
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_ERR_INVALID_ARG);
    p = qwenrt_sampler_default_params();
    assert_int_equal(qwenrt_sampler_init(&p, 0, &s, &err), QWENRT_ERR_INVALID_ARG);
    struct qwenrt_logit_bias b = {V, 1.0f}; /* past the vocabulary */
    p.logit_bias = &b, p.n_logit_bias = 1;
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_ERR_INVALID_ARG);
    b.id = 3, b.bias = NAN;
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_ERR_INVALID_ARG);
    p.logit_bias = NULL; /* entries announced, none given */
    assert_int_equal(qwenrt_sampler_init(&p, V, &s, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(s);
}

/* ------------------------------------------------------------------ the subset path
 * sampler_sample_subset must give exactly qwenrt_sampler_sample's token (same RNG step) when
 * handed the m best tokens by (logit / temperature, lower id first) and the gathered logits:
 * what a CUDA session sends back instead of the whole row. Here the m best come from a plain
 * sort on the host; test_cuda_ops checks the GPU's selection against the same order. */

#define NV 1037

/* The m best of l[0..NV) by (l / t, lower id first): ids and raw logits. */
static void best_m(const float *l, float t, int32_t m, int32_t *ids, float *vals)
{
    test_best_tokens(l, NV, t, m, ids);
    for (int32_t i = 0; i < m; i++)
        vals[i] = l[ids[i]];
}

/* Continuous logits in [-8, 8), or (tied) multiples of 0.25 in [0, 4): many exact ties. */
static void fill_wide(float *l, uint32_t seed, bool tied)
{
    for (int32_t i = 0; i < NV; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = tied ? (float)((seed >> 20) & 15) * 0.25f : (float)(seed >> 8) / (float)(1u << 24) * 16.0f - 8.0f;
    }
}

static struct qwenrt_sampler *make_nv(struct qwenrt_sampler_params p)
{
    struct qwenrt_sampler *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_sampler_init(&p, NV, &s, &err), QWENRT_OK);
    return s;
}

/* 300 draws through both paths from the same seed, every token accepted by both. */
static void check_subset_matches(struct qwenrt_sampler_params p, bool tied)
{
    struct qwenrt_sampler *full = make_nv(p), *sub = make_nv(p);
    static float l[NV];
    int32_t gather[128], ids[256], m = 0;
    float vals[256], gvals[128], t = 0.0f;
    for (int32_t i = 0; i < 8; i++) { /* a prompt: recent tokens for the penalties */
        qwenrt_sampler_accept(full, 3 * i);
        qwenrt_sampler_accept(sub, 3 * i);
    }
    for (int32_t step = 0; step < 300; step++) {
        fill_wide(l, 1000u + (uint32_t)step, tied);
        int32_t n = sampler_subset_plan(sub, gather, 128, 256, &m, &t);
        assert_true(n >= 0);
        assert_true(m <= 256);
        for (int32_t i = 0; i < n; i++)
            gvals[i] = l[gather[i]];
        best_m(l, t, m, ids, vals);
        int32_t a = qwenrt_sampler_sample(full, l);
        int32_t b = sampler_sample_subset(sub, ids, vals, m, gather, gvals, n);
        assert_int_equal(a, b);
        qwenrt_sampler_accept(full, a);
        qwenrt_sampler_accept(sub, a);
    }
    qwenrt_sampler_free(full);
    qwenrt_sampler_free(sub);
}

static void test_subset_equals_full_row(void **st)
{
    (void)st;
    struct qwenrt_logit_bias bias[4] = {{5, -100.0f}, {900, 3.0f}, {5, 1.0f}, {17, 0.5f}};
    for (int tied = 0; tied < 2; tied++) {
        struct qwenrt_sampler_params p = qwenrt_sampler_default_params(); /* greedy */
        check_subset_matches(p, tied);
        p.repeat_penalty = 1.3f, p.presence_penalty = 0.5f, p.penalty_last_n = 16;
        check_subset_matches(p, tied);
        p.logit_bias = bias, p.n_logit_bias = 4; /* a ban, a boost, an id twice */
        check_subset_matches(p, tied);
        p = qwenrt_sampler_default_params(); /* qwenrt run's defaults */
        p.temperature = 0.8f, p.top_k = 40, p.top_p = 0.95f, p.min_p = 0.05f, p.seed = 7;
        check_subset_matches(p, tied);
        p.temperature = 1.3f, p.top_k = 1;
        check_subset_matches(p, tied);
        p.temperature = 0.6f, p.top_k = 180, p.top_p = 1.0f, p.min_p = 0.0f;
        p.repeat_penalty = 1.1f, p.penalty_last_n = 64, p.logit_bias = bias, p.n_logit_bias = 4;
        check_subset_matches(p, tied);
        p.temperature = 3.0f, p.top_k = 5, p.top_p = 0.5f, p.presence_penalty = -2.0f;
        check_subset_matches(p, tied);
    }
}

/* When a subset cannot give the same draw the plan says so (-1). */
static void test_subset_plan_limits(void **st)
{
    (void)st;
    int32_t gather[8], m = 0;
    float t = 0.0f;
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    p.temperature = 1.0f; /* no top-k: the whole distribution */
    struct qwenrt_sampler *s = make_nv(p);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), -1);
    qwenrt_sampler_free(s);
    p.top_k = 300; /* more than max_m */
    s = make_nv(p);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), -1);
    qwenrt_sampler_free(s);
    p.top_k = 10; /* m = 10 + 0 + 1, temperature passed on */
    s = make_nv(p);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), 0);
    assert_int_equal(m, 11);
    assert_true(t == 1.0f);
    qwenrt_sampler_free(s);
    struct qwenrt_logit_bias b[9];
    for (int i = 0; i < 9; i++)
        b[i].id = 100 + i, b[i].bias = 1.0f;
    p.logit_bias = b, p.n_logit_bias = 9; /* more ids to gather than cap */
    s = make_nv(p);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), -1);
    qwenrt_sampler_free(s);
    p = qwenrt_sampler_default_params(); /* greedy: m = 1 + gathered, temperature 1 */
    p.repeat_penalty = 1.2f;
    s = make_nv(p);
    qwenrt_sampler_accept(s, 4);
    qwenrt_sampler_accept(s, 4);
    qwenrt_sampler_accept(s, 9);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), 2);
    assert_int_equal(gather[0], 4);
    assert_int_equal(gather[1], 9);
    assert_int_equal(m, 3);
    qwenrt_sampler_free(s);
    p.temperature = 0.5f, p.top_k = 48; /* the m best and the gathered exceed a vocabulary of 50 */
    s = make(p);
    qwenrt_sampler_accept(s, 1);
    qwenrt_sampler_accept(s, 2);
    assert_int_equal(sampler_subset_plan(s, gather, 8, 256, &m, &t), -1);
    qwenrt_sampler_free(s);
}

/* Which samplers the GPU may draw for (sampler_device_plan: no bias, no penalties, a top-k
 * below the limit, or greedy), with the RNG state it would start from; and moving the RNG by
 * draws made elsewhere (sampler_skip_draws) gives the draws made here. */
static void test_device_plan(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct qwenrt_sampler_params p = qwenrt_sampler_default_params();
    struct qwenrt_logit_bias bias = {3, 1.0f};
    struct cuda_sample_params dp;
    struct {
        float temperature, repeat, presence;
        int32_t top_k, n_bias;
        bool ok;
    } cases[] = {
        {0.0f, 1.0f, 0.0f, 0, 0, true},    {0.8f, 1.0f, 0.0f, 40, 0, true},  {0.8f, 1.0f, 0.0f, 0, 0, false},
        {0.8f, 1.0f, 0.0f, 256, 0, false}, {0.8f, 1.0f, 0.0f, 255, 0, true}, {0.8f, 1.1f, 0.0f, 40, 0, false},
        {0.8f, 1.0f, 0.5f, 40, 0, false},  {0.8f, 1.0f, 0.0f, 40, 1, false}, {0.0f, 1.1f, 0.0f, 0, 0, false},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        p.temperature = cases[c].temperature, p.top_k = cases[c].top_k, p.repeat_penalty = cases[c].repeat;
        p.presence_penalty = cases[c].presence, p.logit_bias = &bias, p.n_logit_bias = cases[c].n_bias;
        p.top_p = 0.9f, p.min_p = 0.05f;
        struct qwenrt_sampler *s = NULL;
        assert_int_equal(qwenrt_sampler_init(&p, 300, &s, &err), QWENRT_OK);
        if (sampler_device_plan(s, 256, &dp) != cases[c].ok)
            fail_msg("case %zu: the GPU plan says %d", c, !cases[c].ok);
        if (cases[c].ok) {
            assert_true(dp.temperature == (p.temperature > 0.0f ? p.temperature : 0.0f));
            assert_int_equal(dp.top_k, p.temperature > 0.0f ? p.top_k : 1);
            assert_true(dp.top_p == 0.9f && dp.min_p == 0.05f);
        }
        qwenrt_sampler_free(s);
    }
    /* the RNG: 5 draws skipped = 5 draws made; skipping back repeats them */
    p = qwenrt_sampler_default_params();
    p.temperature = 1.0f, p.top_k = 50, p.seed = 77;
    float logits[300];
    for (int i = 0; i < 300; i++)
        logits[i] = (float)((i * 37) % 101) / 20.0f;
    struct qwenrt_sampler *a = NULL, *b = NULL;
    assert_int_equal(qwenrt_sampler_init(&p, 300, &a, &err), QWENRT_OK);
    assert_int_equal(qwenrt_sampler_init(&p, 300, &b, &err), QWENRT_OK);
    int32_t seq[8];
    for (int i = 0; i < 8; i++)
        seq[i] = qwenrt_sampler_sample(a, logits);
    sampler_skip_draws(b, 5);
    struct cuda_sample_params pa, pb;
    assert_true(sampler_device_plan(b, 256, &pb));
    qwenrt_sampler_reset(a);
    for (int i = 0; i < 5; i++)
        qwenrt_sampler_sample(a, logits);
    assert_true(sampler_device_plan(a, 256, &pa));
    assert_true(pa.rng == pb.rng);
    for (int i = 5; i < 8; i++)
        assert_int_equal(qwenrt_sampler_sample(b, logits), seq[i]);
    sampler_skip_draws(b, -3);
    for (int i = 5; i < 8; i++)
        assert_int_equal(qwenrt_sampler_sample(b, logits), seq[i]);
    int distinct = 0;
    for (int i = 1; i < 8; i++)
        distinct += seq[i] != seq[0];
    assert_true(distinct > 0); /* the draws differ: the checks above can fail */
    qwenrt_sampler_free(a);
    qwenrt_sampler_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),        cmocka_unit_test(test_top_k_only_best),
        cmocka_unit_test(test_distribution),  cmocka_unit_test(test_top_p_and_min_p_filters),
        cmocka_unit_test(test_penalties),     cmocka_unit_test(test_seed_repeats),
        cmocka_unit_test(test_no_top_k),     cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_logit_bias),    cmocka_unit_test(test_subset_equals_full_row),
        cmocka_unit_test(test_subset_plan_limits), cmocka_unit_test(test_device_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
