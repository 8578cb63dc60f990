/*
 * test_calibrate_shapes.c — the CUDA calibration's machinery (src/tools/calibrate_cuda.c) run
 * on the CPU, whose sessions ignore the CUDA shapes: the lanes for the model's weights, the
 * gate against the baseline (a candidate whose decode is broken on purpose fails it by name
 * and is never chosen), the timed trials, the evidence record and the profile it writes
 * (which loads, with its cudaTuning). The GPU side (the shapes themselves) is
 * test_cuda_backend's test_calibrate_cuda.
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "backend/cpu/cpu_backend.h"
#include "runtime/profile.h"
#include "runtime/session.h"
#include "tools/calibrate.h"

#define MODEL "tests/data/qwen3-tiny-f32"

/* attention that writes K/V one row early and attends over rows 0..pos0-1 (decode only) */
static void attention_off_by_one(const struct plan_op *op, struct cpu_exec *ex)
{
    struct cpu_exec e = *ex;
    if (e.pos0 > 0)
        e.pos0--;
    attention_ref(op, &e);
}

struct break_lane {
    int lane;    /* which lane to break */
    int n_bound; /* kernels rebound */
};

static void break_decode_attention(struct qwenrt_session *s, int lane, void *user)
{
    struct break_lane *b = user;
    if (lane != b->lane)
        return;
    const struct plan *p = &s->model->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_ATTENTION) {
            s->fns[PHASE_DECODE][i] = attention_off_by_one;
            b->n_bound++;
        }
}

/* A new empty file /tmp/qwenrt-calshapes-XXXXXX.json for the profile (out: 64 bytes). */
static void temp_json(char *out)
{
    snprintf(out, 64, "/tmp/qwenrt-calshapes-XXXXXX.json");
    int fd = mkstemps(out, 5);
    assert_true(fd >= 0);
    close(fd);
}

static json_t *run(const char *out, void (*hook)(struct qwenrt_session *, int, void *), void *user,
                   int trials)
{
    struct calibrate_params p = {.model_path = MODEL, .backend = "cpu", .n_threads = 2, .n_prompt = 6,
                                 .n_gen = 5, .warmup = 1, .trials = trials, .out_profile = out,
                                 .profile_id = "profiles/calibrated-shapes-test", .lane_hook = hook,
                                 .hook_user = user};
    json_t *ev = NULL;
    struct qwenrt_error err = {0};
    if (calibrate_cuda_run(&p, &ev, &err))
        fail_msg("calibrate_cuda_run: %s", err.message);
    return ev;
}

static void test_lanes_gate_and_records(void **state)
{
    (void)state;
    char out[64];
    temp_json(out);
    json_t *ev = run(out, NULL, NULL, 3);
    assert_string_equal(json_string_value(json_object_get(ev, "status")), "calibrated");
    assert_string_equal(json_string_value(json_object_get(ev, "backend")), "cpu");
    json_t *lanes = json_object_get(ev, "lanes");
    /* F32 weights: the baseline, PDL, splits of 32 and of 128 positions */
    assert_int_equal(json_array_size(lanes), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(lanes, 0), "label")),
                        "session picks (default)");
    size_t i;
    json_t *l;
    json_array_foreach (lanes, i, l) {
        assert_string_equal(json_string_value(json_object_get(l, "gate")), "passed");
        assert_true(json_real_value(json_object_get(l, "max_logits_rel_err_vs_baseline")) == 0.0);
        assert_int_equal(json_array_size(json_object_get(l, "decode_tok_s")), 3);
        assert_true(json_real_value(json_object_get(l, "median_decode_tok_s")) > 0);
        assert_true(json_real_value(json_object_get(l, "median_prefill_tok_s")) > 0);
    }
    assert_int_equal(json_array_size(json_object_get(ev, "choices")), 3);
    json_t *tuning = json_object_get(json_object_get(json_object_get(json_object_get(ev, "profile"), "runtime"),
                                                     "inference"),
                                     "cudaTuning");
    assert_non_null(tuning);
    json_decref(ev);
    struct profile *pf = NULL; /* what it wrote loads */
    struct qwenrt_error err = {0};
    if (profile_load(out, "profiles", &pf, &err))
        fail_msg("the written profile: %s", err.message);
    assert_true(pf->cuda_given);
    assert_non_null(strstr(json_string_value(json_object_get(pf->doc, "description")), "qwenrt calibrate"));
    profile_free(pf);
    remove(out);
}

/* A candidate whose decode attention is off by one position fails the gate by name, keeps no
 * timings and is not chosen; the others pass. */
static void test_broken_lane_refused(void **state)
{
    (void)state;
    char out[64];
    temp_json(out);
    struct break_lane b = {.lane = 2};
    json_t *ev = run(out, break_decode_attention, &b, 1);
    assert_true(b.n_bound > 0);
    json_t *lanes = json_object_get(ev, "lanes");
    size_t i;
    json_t *l;
    json_array_foreach (lanes, i, l) {
        const char *gate = json_string_value(json_object_get(l, "gate"));
        const char *why = json_string_value(json_object_get(l, "gate_failure"));
        if (i == 2) {
            assert_string_equal(gate, "failed");
            if (!strstr(why, "differ from the baseline") && !strstr(why, "greedy token"))
                fail_msg("lane 2's failure: %s", why);
            assert_int_equal(json_array_size(json_object_get(l, "decode_tok_s")), 0);
        } else {
            assert_string_equal(gate, "passed");
        }
    }
    json_t *ch = json_array_get(json_object_get(ev, "choices"), 1); /* lane 2 */
    assert_false(json_is_true(json_object_get(ch, "chosen")));
    json_decref(ev);
    remove(out);
}

static void test_bad_parameters(void **state)
{
    (void)state;
    struct calibrate_params p = {.model_path = MODEL, .backend = "cpu", .n_prompt = 6, .n_gen = 5,
                                 .trials = 0, .out_profile = "/tmp/never.json"};
    json_t *ev = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(calibrate_cuda_run(&p, &ev, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(ev);
    assert_non_null(strstr(err.message, "trials 1 to"));
    p.trials = 1, p.model_path = "tests/data/no-such-model";
    assert_int_not_equal(calibrate_cuda_run(&p, &ev, &err), QWENRT_OK);
    assert_null(ev);
    assert_int_equal(access("/tmp/never.json", F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanes_gate_and_records),
        cmocka_unit_test(test_broken_lane_refused),
        cmocka_unit_test(test_bad_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
