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
#include "tools/calibrate_lanes.h"

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

/* The logits op followed by a change to the logits row (the last row: decode and the prompt's
 * last token): token a = argmax + 1 set to the best logit plus `lift` (a candidate that picks a
 * where the baseline does not), or minus `sink` (the baseline's near tie). */
static void logits_then(const struct plan_op *op, struct cpu_exec *ex, double delta)
{
    logits_op(op, ex);
    int32_t V = ex->plan->bufs[op->out].width, rows = ex->all_logits ? ex->T : 1;
    float *row = ex->bufs[op->out] + (size_t)(rows - 1) * V;
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        best = row[i] > row[best] ? i : best;
    row[(best + 1) % V] = (float)(row[best] + delta);
}
static void logits_sink_1e4(const struct plan_op *op, struct cpu_exec *ex) { logits_then(op, ex, -1e-4); }
static void logits_lift_1e4(const struct plan_op *op, struct cpu_exec *ex) { logits_then(op, ex, 1e-4); }
static void logits_lift_half(const struct plan_op *op, struct cpu_exec *ex) { logits_then(op, ex, 0.5); }

struct tie_lanes {
    int baseline, tie, far; /* the lanes whose logits op is rebound */
};

static void rebind_logits(struct qwenrt_session *s, int lane, void *user)
{
    const struct tie_lanes *t = user;
    cpu_op_fn fn = lane == t->baseline ? logits_sink_1e4 : lane == t->tie ? logits_lift_1e4
                   : lane == t->far    ? logits_lift_half : NULL;
    for (int ph = 0; fn && ph < 2; ph++) {
        const struct plan *p = &s->model->plans[ph];
        for (int32_t i = 0; i < p->n_ops; i++)
            if (p->ops[i].kind == OP_LOGITS)
                s->fns[ph][i] = fn;
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

static json_t *run_depth(const char *out, void (*hook)(struct qwenrt_session *, int, void *), void *user,
                         int trials, int32_t depth_max)
{
    struct calibrate_params p = {.model_path = MODEL, .backend = "cpu", .n_threads = 2, .n_prompt = 6,
                                 .n_gen = 5, .depth_max = depth_max, .warmup = 1, .trials = trials, .out_profile = out,
                                 .profile_id = "profiles/calibrated-shapes-test", .lane_hook = hook,
                                 .hook_user = user};
    json_t *ev = NULL;
    struct qwenrt_error err = {0};
    if (calibrate_cuda_run(&p, &ev, &err))
        fail_msg("calibrate_cuda_run: %s", err.message);
    return ev;
}

static json_t *run(const char *out, void (*hook)(struct qwenrt_session *, int, void *), void *user,
                   int trials)
{
    return run_depth(out, hook, user, trials, 0);
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
    assert_null(json_object_get(ev, "attention_cluster")); /* depth_max 0: no window measured */
    assert_null(json_object_get(tuning, "attnCluster"));
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

/* The second stage (calibrate_window.c) at depths 256 and 512: both lanes pass their gates at
 * both depths, and the profile says what the evidence chose — never, or the window of the run
 * of winning depths, each depth d standing for [3d/4, 3d/2). (On the CPU the two lanes compute
 * the same thing, so which it is depends on the timing.) */
static void test_window_records(void **state)
{
    (void)state;
    char out[64];
    temp_json(out);
    json_t *ev = run_depth(out, NULL, NULL, 1, 512);
    json_t *win = json_object_get(ev, "attention_cluster"), *depths = json_object_get(win, "depths");
    assert_int_equal(json_array_size(depths), 2);
    int32_t lo = 0, hi = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(depths, i);
        int32_t depth = (int32_t)json_integer_value(json_object_get(d, "depth"));
        assert_int_equal(depth, 256 << i);
        assert_string_equal(json_string_value(json_object_get(d, "gate")), "passed");
        assert_true(json_real_value(json_object_get(d, "never_decode_tok_s")) > 0);
        assert_true(json_real_value(json_object_get(d, "always_decode_tok_s")) > 0);
        if (json_is_true(json_object_get(d, "wins"))) {
            lo = lo ? lo : depth / 4 * 3;
            hi = depth / 2 * 3;
        }
    }
    char choice[16];
    snprintf(choice, sizeof(choice), "%s", json_string_value(json_object_get(win, "choice")));
    json_decref(ev);
    struct profile *pf = NULL;
    struct qwenrt_error err = {0};
    if (profile_load(out, "profiles", &pf, &err))
        fail_msg("the written profile: %s", err.message);
    if (!strcmp(choice, "window")) { /* wins at 256 and 512 form one run; any win is the window */
        assert_int_equal(pf->cuda.attn_cluster, 2);
        assert_int_equal(pf->cuda.attn_cluster_from, lo);
        assert_int_equal(pf->cuda.attn_cluster_until, hi);
    } else {
        assert_string_equal(choice, "never");
        assert_int_equal(lo, 0);
        assert_int_equal(pf->cuda.attn_cluster, -1);
    }
    profile_free(pf);
    remove(out);
}

/* The "always" lane (the fifth lane: after F32's four) with its decode attention off by one
 * position fails its gate at every depth, so the window is never. */
static void test_window_broken_lane(void **state)
{
    (void)state;
    char out[64];
    temp_json(out);
    struct break_lane b = {.lane = 5};
    json_t *ev = run_depth(out, break_decode_attention, &b, 1, 512);
    assert_true(b.n_bound > 0);
    json_t *win = json_object_get(ev, "attention_cluster");
    size_t i;
    json_t *d;
    json_array_foreach (json_object_get(win, "depths"), i, d) {
        assert_string_equal(json_string_value(json_object_get(d, "gate")), "failed");
        assert_false(json_is_true(json_object_get(d, "wins")));
        assert_true(strlen(json_string_value(json_object_get(d, "gate_failure"))) > 0);
    }
    assert_string_equal(json_string_value(json_object_get(win, "choice")), "never");
    json_t *tuning = json_object_get(json_object_get(json_object_get(json_object_get(ev, "profile"), "runtime"),
                                                     "inference"),
                                     "cudaTuning");
    assert_string_equal(json_string_value(json_object_get(tuning, "attnCluster")), "never");
    json_decref(ev);
    remove(out);
}

/* The gate's tolerance (validate's float family here: 1e-3 relative + 5e-3) and its near-tie
 * rule: the baseline's second best logit is made 1e-4 below its best at every step; lane 2
 * lifts the same token 1e-4 above the best, so it picks another token at every step, a near
 * tie the gate accepts (logits 2e-4 apart in one element); lane 3 lifts it 0.5 above, which
 * the gate refuses by the logits. */
static void test_gate_near_ties(void **state)
{
    (void)state;
    char out[64];
    temp_json(out);
    struct tie_lanes t = {.baseline = 0, .tie = 2, .far = 3};
    json_t *ev = run(out, rebind_logits, &t, 1);
    json_t *lanes = json_object_get(ev, "lanes");
    json_t *tie = json_array_get(lanes, 2), *far = json_array_get(lanes, 3), *plain = json_array_get(lanes, 1);
    assert_string_equal(json_string_value(json_object_get(tie, "gate")), "passed");
    assert_int_equal(json_integer_value(json_object_get(tie, "near_ties")), 5); /* every step */
    assert_true(json_real_value(json_object_get(tie, "max_logits_rel_err_vs_baseline")) > 0);
    assert_string_equal(json_string_value(json_object_get(far, "gate")), "failed");
    assert_non_null(strstr(json_string_value(json_object_get(far, "gate_failure")), "logits at step 0 differ"));
    /* lane 1 keeps the plain logits op: token a keeps its own logit, far below the one the
     * baseline moved next to its best, so the logits differ beyond the tolerance */
    assert_string_equal(json_string_value(json_object_get(plain, "gate")), "failed");
    assert_non_null(strstr(json_string_value(json_object_get(plain, "gate_failure")), "logits at step 0 differ"));
    json_t *method = json_object_get(ev, "method");
    assert_string_equal(json_string_value(json_object_get(method, "tolerance_family")), "float");
    json_decref(ev);
    remove(out);
}

/* The window's rule on gains the H200 measured (session 26, depths 256 ... 4,096): a level
 * depth inside a run does not break it, a loss or a failed gate does, the larger summed gain
 * of two runs wins, and no win means never. */
static void test_window_choice(void **state)
{
    (void)state;
    static const int32_t depths[5] = {256, 512, 1024, 2048, 4096};
    static const struct {
        double gain[5];
        bool failed_at[5];
        int32_t mode, from, until;
    } cases[] = {
        {{0.054, -0.007, 0.110, 0.105, -0.016}, {0}, 2, 192, 3072}, /* Qwen3-0.6B Q4_K_M: 512 level */
        {{0.050, 0.014, 0.091, 0.085, -0.039}, {0}, 2, 192, 3072},  /* Qwen3-0.6B BF16 */
        {{0.019, 0.005, -0.011, -0.015, -0.063}, {0}, 2, 192, 384}, /* Qwen3.5-0.8B BF16 */
        {{0.008, -0.005, -0.018, -0.015, -0.052}, {0}, -1, 0, 0},   /* Qwen3.5-0.8B Q4_K_M: no win */
        {{0.050, -0.020, 0.091, 0.085, -0.039}, {0}, 2, 768, 3072}, /* a loss at 512 splits the runs */
        {{0.300, -0.020, 0.091, 0.085, -0.039}, {0}, 2, 192, 384},  /* ... the larger sum wins */
        {{0.050, 0.0, 0.091, 0.085, 0.02}, {0, 0, 1, 0, 0}, 2, 1536, 6144}, /* a failed gate at 1,024 */
        {{0.02, 0.02, 0.02, 0.02, 0.02}, {0}, 2, 192, 6144},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        bool passed[5];
        for (int i = 0; i < 5; i++)
            passed[i] = !cases[c].failed_at[i];
        struct model_cuda_tuning t = {0};
        t.attn_split_min = 77; /* left as it was */
        cal_window_choose(depths, cases[c].gain, passed, 5, &t);
        if (t.attn_cluster != cases[c].mode || t.attn_cluster_from != cases[c].from ||
            t.attn_cluster_until != cases[c].until || t.attn_split_min != 77)
            fail_msg("case %zu: %d [%d, %d), want %d [%d, %d)", c, (int)t.attn_cluster, (int)t.attn_cluster_from,
                     (int)t.attn_cluster_until, (int)cases[c].mode, (int)cases[c].from, (int)cases[c].until);
    }
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
    p.model_path = MODEL, p.depth_max = 100; /* below the first depth measured (256) */
    assert_int_equal(calibrate_cuda_run(&p, &ev, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(ev);
    assert_non_null(strstr(err.message, "--depth-max 100 is below the first depth"));
    assert_int_equal(access("/tmp/never.json", F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanes_gate_and_records),
        cmocka_unit_test(test_broken_lane_refused),
        cmocka_unit_test(test_gate_near_ties),
        cmocka_unit_test(test_window_choice),
        cmocka_unit_test(test_window_records),
        cmocka_unit_test(test_window_broken_lane),
        cmocka_unit_test(test_bad_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
