/*
 * test_model_fixtures.c — both architectures on the CPU against the transformers fixtures
 * (tests/data/<model>/reference.safetensors, float64 reference over the stored weights):
 * logits at every prompt position (relative error <= 1e-4, same argmax), each layer's hidden
 * state, the attention KV cache after the prompt, the greedy continuation and its logits.
 * Again with the KV cache in f16 (qwenrt_session_params.kv_type): logits and cache within 1e-3,
 * the same argmax wherever the reference's top two are more than 0.05 apart.
 */
#include <stdlib.h>

#include "testutil.h"

#include "qwenrt.h"
#include "runtime/session.h"

#define LOGITS_REL_TOL 1e-4   /* issue 2/4: relative error of logits */
#define HIDDEN_REL_TOL 1e-4   /* per-layer hidden states */
#define KV_REL_TOL 1e-4       /* K after norm and RoPE, V */
#define KV16_REL_TOL 1e-3     /* logits and cache with the cache in f16 (K, V rounded to 2^-11) */
#define KV16_MARGIN 0.05      /* f16: argmax compared where the reference's top two differ by more */

struct dump_capture {
    const struct qr_tensor *ref; /* hidden_states [L+1][T][H] */
    int32_t T, H, n_checked;
    double worst;
};

/* hidden_states[0] = embedding, [l+1] = layer l output, last = after the final norm */
static void on_dump(void *user, const char *name, int32_t layer, const float *data, int32_t T,
                    int32_t width)
{
    struct dump_capture *c = user;
    int32_t idx = -1, n_layers = (int32_t)c->ref->ne[2] - 1;
    if (!strcmp(name, "embed"))
        idx = 0;
    else if (!strcmp(name, "layer_out") && layer < n_layers - 1)
        idx = layer + 1;
    else if (!strcmp(name, "final_norm"))
        idx = n_layers;
    if (idx < 0 || T != c->T)
        return;
    assert_int_equal(width, c->H);
    const float *ref = (const float *)c->ref->data + (size_t)idx * T * width;
    double e = rel_err(data, ref, (size_t)T * width);
    if (e > c->worst)
        c->worst = e;
    if (e > HIDDEN_REL_TOL)
        fail_msg("hidden state %s.%d: relative error %.3g > %.1g", name, layer, e, HIDDEN_REL_TOL);
    c->n_checked++;
}

static void check_kv(struct qwenrt_session *s, const struct safetensors_file *ref, int32_t T, double tol)
{
    const struct seq_state *st = &s->state;
    int32_t hd = s->model->hp.head_dim, nkv = s->model->hp.n_head_kv, checked = 0;
    float *buf = malloc((size_t)nkv * T * hd * sizeof(float));
    for (int32_t l = 0; l < st->n_layer; l++) {
        if (!(st->kv_f16 ? (void *)st->k_cache16[l] : (void *)st->k_cache[l]))
            continue;
        for (int kv = 0; kv < 2; kv++) {
            char name[64];
            snprintf(name, sizeof(name), "state.%s.%d", kv ? "values" : "keys", l);
            const struct qr_tensor *r = ref_tensor(ref, name);
            /* ours: [pos][head*hd]; reference: [head][pos][hd] */
            for (int32_t h = 0; h < nkv; h++)
                for (int32_t p = 0; p < T; p++)
                    kv_load(st, l, kv, p, h * hd, hd, buf + ((size_t)h * T + p) * hd);
            double e = rel_err(buf, r->data, (size_t)nkv * T * hd);
            if (e > tol)
                fail_msg("%s: relative error %.3g", name, e);
            checked++;
        }
    }
    assert_true(checked > 0);
    free(buf);
}

/* Same argmax as the reference, where its top two differ by more than margin. */
static void check_argmax_margin(const float *got, const float *ref, int32_t V, double margin, const char *what)
{
    int32_t best = argmax_f(ref, V);
    float second = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        if (i != best && ref[i] > second)
            second = ref[i];
    if (ref[best] - second > margin && argmax_f(got, V) != best)
        fail_msg("%s: argmax %d, the reference's %d (margin %.3g)", what, argmax_f(got, V), best,
                 (double)(ref[best] - second));
}

static void check_fixture(const char *dir, bool kv16)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/reference.safetensors", dir);
    struct safetensors_file ref;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&ref, path, &err), QWENRT_OK);
    const struct qr_tensor *prompt = ref_tensor(&ref, "prompt_ids"), *logits = ref_tensor(&ref, "logits");
    const struct qr_tensor *gen = ref_tensor(&ref, "generated_ids"), *dlog = ref_tensor(&ref, "decode_logits");
    int32_t T = (int32_t)prompt->ne[0], V = (int32_t)logits->ne[0], G = (int32_t)gen->ne[0];

    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 2;
    if (qwenrt_model_load(dir, &mp, &m, &err) != QWENRT_OK)
        fail_msg("load %s: %s", dir, err.message);
    struct qwenrt_session *s = NULL;
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.kv_type = kv16 ? QWENRT_KV_F16 : QWENRT_KV_F32;
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    assert_true(s->state.kv_f16 == kv16);
    double tol = kv16 ? KV16_REL_TOL : LOGITS_REL_TOL;
    struct dump_capture cap = {.ref = ref_tensor(&ref, "hidden_states"), .T = T, .H = m->hp.n_embd};
    if (!kv16) /* the hidden states' 1e-4 is the f32 cache's */
        session_set_dump(s, on_dump, &cap);

    float *out = malloc((size_t)T * V * sizeof(float));
    assert_int_equal(qwenrt_session_prefill(s, prompt->data, T, out, &err), QWENRT_OK);
    double e = rel_err(out, logits->data, (size_t)T * V);
    printf("%s%s: logits rel err %.3g, worst hidden %.3g over %d dumps\n", dir, kv16 ? " (kv f16)" : "", e,
           cap.worst, cap.n_checked);
    assert_true(e <= tol);
    if (kv16 && e == 0.0)
        fail_msg("%s: the f16 cache changed nothing", dir);
    assert_int_equal(cap.n_checked, kv16 ? 0 : m->hp.n_layer + 1);
    for (int32_t t = 0; t < T; t++)
        check_argmax_margin(out + (size_t)t * V, (const float *)logits->data + (size_t)t * V, V,
                            kv16 ? KV16_MARGIN : 0.0, dir);
    check_kv(s, &ref, T, kv16 ? KV16_REL_TOL : KV_REL_TOL);

    session_set_dump(s, NULL, NULL);
    const int32_t *gen_ids = gen->data;
    for (int32_t g = 0; g < G; g++) {
        if (g > 0)
            assert_int_equal(qwenrt_session_decode(s, gen_ids[g - 1], &err), QWENRT_OK);
        const float *lg = qwenrt_session_logits(s);
        double de = rel_err(lg, (const float *)dlog->data + (size_t)g * V, (size_t)V);
        if (de > tol)
            fail_msg("decode step %d: logits relative error %.3g", g, de);
        if (kv16)
            check_argmax_margin(lg, (const float *)dlog->data + (size_t)g * V, V, KV16_MARGIN, dir);
        else
            assert_int_equal(qwenrt_argmax(lg, V), gen_ids[g]);
    }
    free(out);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    safetensors_close(&ref);
}

static void test_qwen3_f32(void **st) { (void)st; check_fixture("tests/data/qwen3-tiny-f32", false); }
static void test_qwen3_bf16(void **st) { (void)st; check_fixture("tests/data/qwen3-tiny-bf16", false); }
static void test_qwen35_f32(void **st) { (void)st; check_fixture("tests/data/qwen35-tiny-f32", false); }
static void test_qwen35_bf16(void **st) { (void)st; check_fixture("tests/data/qwen35-tiny-bf16", false); }

static void test_kv_f16(void **st)
{
    (void)st;
    check_fixture("tests/data/qwen3-tiny-f32", true);
    check_fixture("tests/data/qwen3-tiny-bf16", true);
    check_fixture("tests/data/qwen35-tiny-f32", true);
    check_fixture("tests/data/qwen35-tiny-bf16", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_f32),
        cmocka_unit_test(test_qwen3_bf16),
        cmocka_unit_test(test_qwen35_f32),
        cmocka_unit_test(test_qwen35_bf16),
        cmocka_unit_test(test_kv_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
