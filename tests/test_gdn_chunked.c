/*
 * test_gdn_chunked.c — issue 4 part 3: prefill without a token-by-token DeltaNet walk.
 *
 * Kernel level: gdn_core.chunked and gdn_core.chunked.avx512 against gdn_core.ref (the
 * recurrence) on random inputs of awkward sizes: T in {1, 3, 63, 64, 65, 130}, Hk != Hv,
 * dk != dv, both value-head orders, a non-zero initial state, mild and very strong decays;
 * outputs and the final state agree to f32 rounding. Runs split into pieces agree as well.
 * Model level: the qwen35 fixture prompt (70 tokens) prefilled in pieces (1, 3, 63, 64, 65 ...)
 * gives the same last logits and DeltaNet/KV state as one piece, and both match the
 * transformers logits of the last prompt position.
 */
#include <stdlib.h>

#include "testutil.h"

#include "backend/cpu/cpu_backend.h"
#include "base/cpu_features.h"
#include "qwenrt.h"
#include "runtime/session.h"

#define CHUNK_REL_TOL 2e-5  /* regrouped f32 sums over <= 130 tokens: observed ~1e-6 */
#define SPLIT_REL_TOL 5e-5  /* same model, prompt split differently: f32 regrouping only. Each
                             * side is ~2e-5 from transformers, so they may differ by the sum:
                             * the portable chunked kernel (CPUs without AVX-512, an AMD EPYC
                             * VM) puts {63, 7} 3.0e-5 from one piece while it is itself 1.1e-5
                             * from transformers, the one piece 2.0e-5 */
#define TOKEN_REL_TOL 5e-5  /* token by token: decode takes the GEMV matmuls, another sum order */
#define LOGITS_REL_TOL 1e-4 /* against transformers, as in test_model_fixtures.c */

struct rng {
    uint64_t s;
};

static float urand(struct rng *r, float lo, float hi) /* xorshift64*, deterministic */
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint64_t x = r->s * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((double)(x >> 40) / (double)(1ull << 24));
}

struct gdn_case {
    int32_t Hk, Hv, dk, dv;
    bool tiled;
    float a_log_hi; /* A_log drawn in [-2, a_log_hi]: 4 gives decays down to e^-300 per token */
};

struct gdn_fixture {
    struct plan plan;
    struct plan_op *op;
    struct seq_state st;
    float *ssm_ptr[1];
    float *x, *b, *a, *o, *dt, *ssm_a, *scratch;
    int64_t scratch_len;
};

static void fixture_init(struct gdn_fixture *f, const struct gdn_case *c, int32_t T, struct rng *r)
{
    memset(f, 0, sizeof(*f));
    assert_true(plan_init(&f->plan, PHASE_PREFILL));
    int32_t wx = 2 * c->Hk * c->dk + c->Hv * c->dv;
    int32_t bx = plan_add_buf(&f->plan, "qkv", wx), bb = plan_add_buf(&f->plan, "beta", c->Hv);
    int32_t ba = plan_add_buf(&f->plan, "alpha", c->Hv),
            bo = plan_add_buf(&f->plan, "o", c->Hv * c->dv);
    f->op = plan_add_op(&f->plan, OP_GDN_CORE, 0);
    assert_false(f->plan.failed);
    f->x = malloc((size_t)T * wx * sizeof(float));
    f->b = malloc((size_t)T * c->Hv * sizeof(float));
    f->a = malloc((size_t)T * c->Hv * sizeof(float));
    f->o = calloc((size_t)T * c->Hv * c->dv, sizeof(float));
    f->dt = malloc((size_t)c->Hv * sizeof(float));
    f->ssm_a = malloc((size_t)c->Hv * sizeof(float));
    for (int64_t i = 0; i < (int64_t)T * wx; i++)
        f->x[i] = urand(r, -1.0f, 1.0f);
    for (int64_t i = 0; i < (int64_t)T * c->Hv; i++) {
        f->b[i] = urand(r, -4.0f, 4.0f);
        f->a[i] = urand(r, -4.0f, 4.0f);
    }
    for (int32_t j = 0; j < c->Hv; j++) {
        f->dt[j] = urand(r, -1.0f, 1.0f);
        f->ssm_a[j] = -expf(urand(r, -2.0f, c->a_log_hi));
    }
    *f->op = (struct plan_op){
        .kind = OP_GDN_CORE,
        .layer = 0,
        .out = bo,
        .in = bx,
        .in2 = bb,
        .in3 = ba,
        .vec2 = f->dt,
        .vec3 = f->ssm_a,
        .n_k_heads = c->Hk,
        .n_v_heads = c->Hv,
        .k_dim = c->dk,
        .v_dim = c->dv,
        .v_head_tiled = c->tiled,
    };
    f->st.n_layer = 1;
    f->st.ssm_len = (int64_t)c->Hv * c->dk * c->dv;
    f->ssm_ptr[0] = malloc((size_t)f->st.ssm_len * sizeof(float));
    for (int64_t i = 0; i < f->st.ssm_len; i++) /* a state left by earlier tokens */
        f->ssm_ptr[0][i] = urand(r, -0.5f, 0.5f);
    f->st.ssm_state = f->ssm_ptr;
    f->scratch_len = gdn_chunked_scratch_floats(f->op);
    f->scratch = malloc((size_t)f->scratch_len * sizeof(float));
}

static void fixture_free(struct gdn_fixture *f)
{
    free(f->x), free(f->b), free(f->a), free(f->o), free(f->dt), free(f->ssm_a);
    free(f->ssm_ptr[0]), free(f->scratch);
    plan_free(&f->plan);
}

/* Runs kernel fn over tokens [t0, t0+n) of the fixture's inputs (buffers offset by t0). */
static void run_piece(struct gdn_fixture *f, cpu_op_fn fn, int32_t t0, int32_t n)
{
    const struct plan_op *op = f->op;
    struct cpu_exec ex = {.plan = &f->plan,
                          .T = n,
                          .pos0 = t0,
                          .state = &f->st,
                          .n_threads = 2,
                          .scratch = f->scratch,
                          .scratch_len = f->scratch_len};
    ex.bufs[op->in] = f->x + (size_t)t0 * f->plan.bufs[op->in].width;
    ex.bufs[op->in2] = f->b + (size_t)t0 * op->n_v_heads;
    ex.bufs[op->in3] = f->a + (size_t)t0 * op->n_v_heads;
    ex.bufs[op->out] = f->o + (size_t)t0 * f->plan.bufs[op->out].width;
    fn(op, &ex);
}

static const struct gdn_case cases[] = {
    {2, 4, 32, 48, false, 1.0f}, /* the fixture's geometry, HF head order */
    {2, 4, 32, 48, true, 1.0f},  /* GGUF (tiled) head order */
    {3, 6, 20, 12, false, 2.0f}, /* odd dims, r = 2 */
    {3, 6, 20, 12, true, 2.0f},
    {1, 3, 17, 33, false, 4.0f},   /* very strong decays: e^G underflows inside a chunk */
    {2, 2, 128, 128, false, 0.5f}, /* the 0.8B head size */
};
static const int32_t lengths[] = {1, 3, 63, 64, 65, 130};

/* Outputs and state of variant fn vs gdn_core_ref over T tokens in one run. */
static void check_variant(const char *key, cpu_op_fn fn)
{
    struct rng r = {0x9e3779b97f4a7c15ull};
    double worst = 0.0;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        for (size_t li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++) {
            const struct gdn_case *c = &cases[ci];
            int32_t T = lengths[li];
            struct gdn_fixture f;
            fixture_init(&f, c, T, &r);
            size_t n_out = (size_t)T * c->Hv * c->dv, n_st = (size_t)f.st.ssm_len;
            float *s0 = malloc(n_st * sizeof(float)), *o_ref = malloc(n_out * sizeof(float));
            memcpy(s0, f.ssm_ptr[0], n_st * sizeof(float));
            run_piece(&f, gdn_core_ref, 0, T);
            memcpy(o_ref, f.o, n_out * sizeof(float));
            float *s_ref = malloc(n_st * sizeof(float));
            memcpy(s_ref, f.ssm_ptr[0], n_st * sizeof(float));
            memcpy(f.ssm_ptr[0], s0, n_st * sizeof(float));
            memset(f.o, 0, n_out * sizeof(float));
            run_piece(&f, fn, 0, T);
            double eo = rel_err(f.o, o_ref, n_out), es = rel_err(f.ssm_ptr[0], s_ref, n_st);
            for (size_t i = 0; i < n_out; i++)
                if (!isfinite(f.o[i]))
                    fail_msg("%s case %zu T=%d: non-finite output at %zu", key, ci, T, i);
            if (eo > CHUNK_REL_TOL || es > CHUNK_REL_TOL)
                fail_msg(
                    "%s case %zu (Hk %d Hv %d dk %d dv %d tiled %d) T=%d: output rel err %.3g, "
                    "state rel err %.3g",
                    key, ci, c->Hk, c->Hv, c->dk, c->dv, c->tiled, T, eo, es);
            worst = fmax(worst, fmax(eo, es));
            free(s0), free(o_ref), free(s_ref);
            fixture_free(&f);
        }
    }
    printf("%s vs gdn_core.ref: worst relative error %.3g\n", key, worst);
}

static void test_chunked_vs_ref(void **st)
{
    (void)st;
    check_variant("gdn_core.chunked", gdn_core_chunked);
}

static void test_chunked_avx512_vs_ref(void **st)
{
    (void)st;
    uint32_t need = CPU_AVX512F | CPU_AVX2;
    if ((cpu_features_detect() & need) != need)
        skip();
    check_variant("gdn_core.chunked.avx512", gdn_core_chunked_avx512);
}

/* The best registered kernel, run in pieces 1, 3, 63, 64, 65 (196 tokens), equals the reference
 * recurrence over all 196 tokens in one run. */
static void test_pieces_vs_ref(void **st)
{
    (void)st;
    static const int32_t pieces[] = {1, 3, 63, 64, 65};
    const struct cpu_op_kernel *k = cpu_op_pick(OP_GDN_CORE, cpu_features_detect(), NULL);
    assert_non_null(k);
    assert_true(strncmp(k->key, "gdn_core.chunked", 16) == 0);
    struct rng r = {12345};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const struct gdn_case *c = &cases[ci];
        int32_t T = 196;
        struct gdn_fixture f;
        fixture_init(&f, c, T, &r);
        size_t n_out = (size_t)T * c->Hv * c->dv, n_st = (size_t)f.st.ssm_len;
        float *s0 = malloc(n_st * sizeof(float)), *o_ref = malloc(n_out * sizeof(float));
        float *s_ref = malloc(n_st * sizeof(float));
        memcpy(s0, f.ssm_ptr[0], n_st * sizeof(float));
        run_piece(&f, gdn_core_ref, 0, T);
        memcpy(o_ref, f.o, n_out * sizeof(float));
        memcpy(s_ref, f.ssm_ptr[0], n_st * sizeof(float));
        memcpy(f.ssm_ptr[0], s0, n_st * sizeof(float));
        memset(f.o, 0, n_out * sizeof(float));
        for (int32_t p = 0, t0 = 0; p < 5; t0 += pieces[p], p++)
            run_piece(&f, k->fn, t0, pieces[p]);
        double eo = rel_err(f.o, o_ref, n_out), es = rel_err(f.ssm_ptr[0], s_ref, n_st);
        if (eo > CHUNK_REL_TOL || es > CHUNK_REL_TOL)
            fail_msg("%s in pieces, case %zu: output rel err %.3g, state rel err %.3g", k->key, ci,
                     eo, es);
        free(s0), free(o_ref), free(s_ref);
        fixture_free(&f);
    }
}

/* ---- model level: the qwen35 fixture prompt in pieces */

struct prompt_run {
    struct qwenrt_session *s;
    float *logits; /* last position */
};

static void prefill_pieces(struct qwenrt_model *m, const int32_t *ids, const int32_t *pieces,
                           int n_pieces, struct prompt_run *out)
{
    struct qwenrt_error err = {0};
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.kv_type = QWENRT_KV_F32; /* state_err compares the f32 cache rows */
    assert_int_equal(qwenrt_session_init(m, &sp, &out->s, &err), QWENRT_OK);
    int32_t t0 = 0;
    for (int i = 0; i < n_pieces; i++) {
        if (qwenrt_session_prefill(out->s, ids + t0, pieces[i], NULL, &err) != QWENRT_OK)
            fail_msg("prefill piece %d (%d tokens): %s", i, pieces[i], err.message);
        t0 += pieces[i];
    }
    assert_int_equal(qwenrt_session_n_past(out->s), t0);
    out->logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    memcpy(out->logits, qwenrt_session_logits(out->s), (size_t)m->hp.n_vocab * sizeof(float));
}

/* Worst relative error between two sessions' DeltaNet (conv, recurrent) and KV state. */
static double state_err(const struct qwenrt_session *a, const struct qwenrt_session *b)
{
    const struct seq_state *x = &a->state, *y = &b->state;
    double worst = 0.0;
    size_t kv = (size_t)a->n_past * x->kv_width, conv = (size_t)x->conv_rows * x->conv_dim;
    for (int32_t l = 0; l < x->n_layer; l++) {
        if (x->ssm_state[l]) {
            worst = fmax(worst, rel_err(x->ssm_state[l], y->ssm_state[l], (size_t)x->ssm_len));
            worst = fmax(worst, rel_err(x->conv_state[l], y->conv_state[l], conv));
        } else {
            worst = fmax(worst, rel_err(x->k_cache[l], y->k_cache[l], kv));
            worst = fmax(worst, rel_err(x->v_cache[l], y->v_cache[l], kv));
        }
    }
    return worst;
}

static void check_splits(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/reference.safetensors", dir);
    struct safetensors_file ref;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&ref, path, &err), QWENRT_OK);
    const struct qr_tensor *prompt = ref_tensor(&ref, "prompt_ids"),
                           *logits = ref_tensor(&ref, "logits");
    int32_t T = (int32_t)prompt->ne[0], V = (int32_t)logits->ne[0];
    assert_int_equal(T, 70);
    const int32_t *ids = prompt->data;
    const float *ref_last = (const float *)logits->data + (size_t)(T - 1) * V;

    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 2;
    if (qwenrt_model_load(dir, &mp, &m, &err) != QWENRT_OK)
        fail_msg("load %s: %s", dir, err.message);
    static const int32_t whole[] = {70};
    static const int32_t splits[][8] = {
        {1, 69},       {3, 67},          {63, 7},       {64, 6},          {65, 5},
        {1, 3, 63, 3}, {3, 64, 1, 1, 1}, {65, 1, 3, 1}, {1, 1, 1, 64, 3},
    };
    struct prompt_run one;
    prefill_pieces(m, ids, whole, 1, &one);
    double e_one = rel_err(one.logits, ref_last, (size_t)V);
    assert_true(e_one <= LOGITS_REL_TOL);
    for (size_t si = 0; si < sizeof(splits) / sizeof(splits[0]); si++) {
        int n = 0;
        while (n < 8 && splits[si][n])
            n++;
        struct prompt_run run;
        prefill_pieces(m, ids, splits[si], n, &run);
        double el = rel_err(run.logits, one.logits, (size_t)V), es = state_err(run.s, one.s);
        double er = rel_err(run.logits, ref_last, (size_t)V);
        printf("%s split %zu: logits vs one piece %.3g, state %.3g, vs transformers %.3g\n", dir,
               si, el, es, er);
        if (el > SPLIT_REL_TOL || es > SPLIT_REL_TOL || er > LOGITS_REL_TOL)
            fail_msg("split %zu: logits rel err %.3g, state rel err %.3g, vs reference %.3g", si,
                     el, es, er);
        assert_int_equal(qwenrt_argmax(run.logits, V), qwenrt_argmax(one.logits, V));
        free(run.logits);
        qwenrt_session_free(run.s);
    }
    /* token by token (the decode path for every token) */
    int32_t ones[70];
    for (int i = 0; i < 70; i++)
        ones[i] = 1;
    struct prompt_run tok;
    prefill_pieces(m, ids, ones, 70, &tok);
    double el = rel_err(tok.logits, one.logits, (size_t)V), es = state_err(tok.s, one.s);
    printf("%s token by token: logits vs one piece %.3g, state %.3g\n", dir, el, es);
    assert_true(el <= TOKEN_REL_TOL && es <= TOKEN_REL_TOL);
    free(tok.logits);
    qwenrt_session_free(tok.s);
    free(one.logits);
    qwenrt_session_free(one.s);
    qwenrt_model_free(m);
    safetensors_close(&ref);
}

static void test_split_prompt_f32(void **st)
{
    (void)st;
    check_splits("tests/data/qwen35-tiny-f32");
}
static void test_split_prompt_bf16(void **st)
{
    (void)st;
    check_splits("tests/data/qwen35-tiny-bf16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_vs_ref),    cmocka_unit_test(test_chunked_avx512_vs_ref),
        cmocka_unit_test(test_pieces_vs_ref),     cmocka_unit_test(test_split_prompt_f32),
        cmocka_unit_test(test_split_prompt_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
