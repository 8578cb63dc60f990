/*
 * test_server_batch.c — issue 8: batched decode (qwenrt_batch_decode), the server's continuous
 * batching on the CPU, on the Qwen3 and Qwen3.5 fixtures.
 *
 * Three sessions at different positions (the whole prompt, and two shorter prefixes of it)
 * decode the fixture's greedy ids together, one batch per step; a twin of each decodes alone
 * with qwenrt_session_decode. Every step's logits agree with the twin's within BATCH_REL_TOL
 * (only the multi-row matmuls may round differently) with the same argmax, and the
 * full-prompt session's logits match transformers' decode logits. A batch that mixes the
 * sessions in another order gives the same result. Refusals: a session twice, an id outside
 * the vocabulary, more sessions than the batch holds, a full context; nothing changes then.
 * The server's start of every pick (session_sample_start_all) leaves CPU sessions alone.
 */
#include <stdlib.h>

#include "testutil.h"

#include "base/alloc.h"
#include "qwenrt.h"
#include "runtime/session.h"

#define LOGITS_REL_TOL 1e-4 /* against transformers, as in test_model_fixtures.c */
/* batched against one-by-one: the multi-row GEMV sums in another order (f32 rounding, ~1e-6
 * a step), which the DeltaNet recurrent state carries on over steps (1.5e-5 seen at step 2 in
 * an -O0 build); a wrong position or state is off by 1e-2 and more */
#define BATCH_REL_TOL 5e-5
#define N_SEQ 3



static struct qwenrt_session *session_with(struct ref_fixture *f, int32_t n_prompt, int32_t n_ctx)
{
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = n_ctx;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_init(f->m, &sp, &s, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(s, f->prompt, n_prompt, NULL, &err), QWENRT_OK);
    return s;
}

static void run_fixture(const char *dir)
{
    struct ref_fixture f = {0};
    struct qwenrt_error err = {0};
    ref_fixture_open(&f, dir, 2);
    int32_t lens[N_SEQ] = {f.T, f.T - 1, f.T / 2};
    struct qwenrt_session *b[N_SEQ], *alone[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) {
        b[i] = session_with(&f, lens[i], 256);
        alone[i] = session_with(&f, lens[i], 256);
    }
    struct qwenrt_batch *batch = NULL;
    assert_int_equal(qwenrt_batch_init(f.m, 4, &batch, &err), QWENRT_OK);
    assert_true(session_batch_pays(b[0], 2)); /* on the CPU the server always batches */
    /* the full-prompt session's first logits are the prefill's: transformers' row 0 */
    assert_true(rel_err(qwenrt_session_logits(b[0]), f.dlog, (size_t)f.V) < LOGITS_REL_TOL);
    for (int32_t g = 0; g + 1 < f.G; g++) {
        /* every session is fed the fixture's next greedy id; step order alternates */
        struct qwenrt_session *order[N_SEQ];
        int32_t ids[N_SEQ];
        for (int i = 0; i < N_SEQ; i++) {
            order[i] = b[g % 2 ? N_SEQ - 1 - i : i];
            ids[i] = f.gen[g];
        }
        if (qwenrt_batch_decode(batch, order, ids, N_SEQ, &err))
            fail_msg("batch decode: %s", err.message);
        for (int i = 0; i < N_SEQ; i++) {
            assert_int_equal(qwenrt_session_decode(alone[i], f.gen[g], &err), QWENRT_OK);
            const float *lb = qwenrt_session_logits(b[i]), *la = qwenrt_session_logits(alone[i]);
            assert_int_equal(qwenrt_session_n_past(b[i]), qwenrt_session_n_past(alone[i]));
            double e = rel_err(lb, la, (size_t)f.V);
            if (e > BATCH_REL_TOL)
                fail_msg("%s step %d seq %d: batched vs alone rel err %g", dir, g, i, e);
            assert_int_equal(argmax_f(lb, f.V), argmax_f(la, f.V));
        }
        double e =
            rel_err(qwenrt_session_logits(b[0]), f.dlog + (size_t)(g + 1) * f.V, (size_t)f.V);
        if (e > LOGITS_REL_TOL)
            fail_msg("%s step %d: against transformers rel err %g", dir, g, e);
    }

    /* the server's start of every pick (session_sample_start_all) does nothing to CPU
     * sessions, nor to NULL entries: the samples after it are the rows' own best tokens */
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    gp.temperature = 0.0f;
    assert_int_equal(qwenrt_sampler_init(&gp, f.V, &greedy, &err), QWENRT_OK);
    struct qwenrt_session *with_null[N_SEQ + 1] = {b[0], NULL, b[1], b[2]};
    struct qwenrt_sampler *smps[N_SEQ + 1] = {greedy, greedy, NULL, greedy};
    session_sample_start_all(with_null, smps, N_SEQ + 1);
    for (int i = 0; i < N_SEQ; i++) {
        int32_t id = -1;
        assert_int_equal(qwenrt_session_sample(b[i], greedy, &id, &err), QWENRT_OK);
        assert_int_equal(id, argmax_f(qwenrt_session_logits(b[i]), f.V));
    }
    qwenrt_sampler_free(greedy);

    /* refusals leave every session as it was */
    int32_t np = qwenrt_session_n_past(b[0]);
    struct qwenrt_session *twice[2] = {b[0], b[0]},
                          *many[5] = {b[0], b[1], b[2], alone[0], alone[1]};
    int32_t ids[5] = {1, 1, 1, 1, 1}, bad[2] = {1, f.V};
    assert_int_equal(qwenrt_batch_decode(batch, twice, ids, 2, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_batch_decode(batch, b, bad, 2, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_batch_decode(batch, many, ids, 5, &err), QWENRT_ERR_INVALID_ARG);
    struct qwenrt_session *full = session_with(&f, 2, 2), *with_full[2] = {b[0], full};
    assert_int_equal(qwenrt_batch_decode(batch, with_full, ids, 2, &err), QWENRT_ERR_LIMIT);
    assert_int_equal(qwenrt_session_n_past(b[0]), np);

    qwenrt_session_free(full);
    qwenrt_batch_free(batch);
    for (int i = 0; i < N_SEQ; i++) {
        qwenrt_session_free(b[i]);
        qwenrt_session_free(alone[i]);
    }
    ref_fixture_close(&f);
}

static void test_batch_qwen3(void **state)
{
    (void)state;
    run_fixture("tests/data/qwen3-tiny-f32");
}

static void test_batch_qwen35(void **state)
{
    (void)state;
    run_fixture("tests/data/qwen35-tiny-f32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_qwen3),
        cmocka_unit_test(test_batch_qwen35),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
