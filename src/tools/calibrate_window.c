/*
 * calibrate_window.c — the second stage of `qwenrt calibrate --backend cuda`: the positions at
 * which the decode attention's splits of a head should merge inside a thread-block cluster
 * (cuda_options.attn_cluster) for this model on this GPU.
 *
 * Why: the cluster merge won 4-11% at depths 512-2,048 on the H200 for Qwen3-0.6B and lost at
 * depth 0 and 4,096 (docs/perf-log.md, session 25); the session's own window
 * [ATTN_CLUSTER_FROM, ATTN_CLUSTER_UNTIL) and its rule of at least 16 query heads come from
 * that one model on that one GPU. Here it is measured: two lanes under the first stage's
 * choice, the merge never and always, decode at depths 256, 512, ... up to
 * calibrate_params.depth_max (a random prompt of that many tokens, untimed as far as the
 * choice goes, then n_gen greedy steps), gated as the first stage's lanes are ("always" must
 * give "never"'s ids and logits at every depth). Each depth d stands for the positions from
 * the midpoint below it to the midpoint above it, [3d/4, 3d/2) (the steps measured run from d
 * to d + n_gen). A depth wins where "always" decodes CAL_MIN_GAIN faster, loses where it is
 * CAL_MIN_GAIN slower (or fails its gate), and is level between; the window is the run from a
 * winning depth to a winning depth with no loss inside (a level depth does not break it: the
 * H200 measured Qwen3-0.6B level at 512, where the default already takes 8 splits, between
 * wins of 5% at 256 and 9-13% at 1,024 and 2,048) with the largest summed gain; no winning
 * depth means never.
 */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tools/calibrate_lanes.h"
#include "tools/validate.h"

#define CW_MAX_DEPTHS 16

struct cw_depth {
    int32_t depth;
    bool gate_passed; /* the "always" lane's gate at this depth */
    char why[200];
    int32_t near_ties;
    double never_tg, always_tg; /* median decode tokens/s */
    double gain;                /* always / never - 1 (0 where the gate failed) */
};

/* One depth: a prompt of d tokens, the gate, the timed trials of both lanes. */
static qwenrt_status measure_depth(const struct calibrate_params *p, struct cal_lane *L, const int32_t *prompt,
                                   int32_t d, int32_t V, struct qwenrt_sampler *greedy,
                                   const struct validate_tolerance *tol, int32_t *base_ids, struct cw_depth *out,
                                   struct qwenrt_error *err)
{
    struct cal_run r = {.prompt = prompt, .n_prompt = d, .n_gen = p->n_gen, .V = V, .greedy = greedy, .tol = tol};
    memset(out, 0, sizeof(*out));
    out->depth = d;
    qwenrt_status st = cal_gate_lanes(L, 2, &r, base_ids, err);
    if (!st)
        st = cal_time_lanes(L, 2, &r, base_ids, p->warmup, p->trials, err);
    if (st)
        return st;
    if (!L[0].passed)
        return err_set(err, QWENRT_ERR_BACKEND,
                       "calibrate: at depth %d the lane without the cluster merge left its own tokens: %s", (int)d,
                       L[0].why);
    out->gate_passed = L[1].passed;
    out->near_ties = L[1].near_ties;
    snprintf(out->why, sizeof(out->why), "%s", L[1].why);
    out->never_tg = L[0].tg_med;
    out->always_tg = L[1].passed ? L[1].tg_med : 0;
    out->gain = L[1].passed && L[0].tg_med > 0 ? L[1].tg_med / L[0].tg_med - 1 : 0;
    return QWENRT_OK;
}

static bool wins(double gain, bool passed) { return passed && 1 + gain >= CAL_MIN_GAIN; }
static bool loses(double gain, bool passed) { return !passed || (1 + gain) * CAL_MIN_GAIN <= 1; }

void cal_window_choose(const int32_t *depths, const double *gain, const bool *passed, int n,
                       struct model_cuda_tuning *t)
{
    double best = 0;
    int a = -1, b = -1;
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int j = i; j < n && wins(gain[i], passed[i]) && !loses(gain[j], passed[j]); j++) {
            sum += gain[j];
            if (wins(gain[j], passed[j]) && (a < 0 || sum > best))
                best = sum, a = i, b = j;
        }
    }
    t->attn_cluster = a < 0 ? -1 : 2;
    t->attn_cluster_from = a < 0 ? 0 : depths[a] / 4 * 3;
    t->attn_cluster_until = a < 0 ? 0 : depths[b] / 2 * 3;
}

static json_t *evidence(const struct calibrate_params *p, const struct cw_depth *D, int n,
                        const struct model_cuda_tuning *t)
{
    json_t *rows = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(rows, json_pack("{s:i, s:f, s:f, s:f, s:s, s:s, s:i, s:b, s:b}", "depth", D[i].depth,
                                              "never_decode_tok_s", D[i].never_tg, "always_decode_tok_s",
                                              D[i].always_tg, "gain", D[i].gain, "gate",
                                              D[i].gate_passed ? "passed" : "failed", "gate_failure", D[i].why,
                                              "near_ties", D[i].near_ties, "wins", wins(D[i].gain, D[i].gate_passed),
                                              "loses", loses(D[i].gain, D[i].gate_passed)));
    json_t *o = json_pack("{s:o, s:s, s:i, s:s}", "depths", rows, "choice", t->attn_cluster == 2 ? "window" : "never",
                          "n_gen", p->n_gen, "method",
                          "the first stage's choice with the cluster merge never and always, a random prompt "
                          "of each depth's length, then n_gen greedy steps timed; each depth d stands for "
                          "positions [3d/4, 3d/2); a depth wins where always is min_gain faster, loses where it "
                          "is min_gain slower or fails its gate; the window runs from a win to a win with no loss "
                          "inside, the largest summed gain");
    if (t->attn_cluster == 2) {
        json_object_set_new(o, "from", json_integer(t->attn_cluster_from));
        json_object_set_new(o, "until", json_integer(t->attn_cluster_until));
    }
    return o;
}

/* The depths measured: 256, 512, ... up to depth_max. */
static int list_depths(int32_t depth_max, int32_t *depths)
{
    int n = 0;
    for (int64_t d = CAL_WINDOW_FIRST_DEPTH; d <= depth_max && n < CW_MAX_DEPTHS; d *= 2)
        depths[n++] = (int32_t)d;
    return n;
}

qwenrt_status cal_window_run(const struct calibrate_params *p, struct qwenrt_model *m, int first_index,
                             struct model_cuda_tuning *t, json_t **out, struct qwenrt_error *err)
{
    *out = NULL;
    if (p->depth_max <= 0)
        return QWENRT_OK;
    int32_t depths[CW_MAX_DEPTHS];
    int nd = list_depths(p->depth_max, depths);
    if (nd == 0) /* calibrate_cuda_run refuses such a depth_max before its first stage */
        return err_set(err, QWENRT_ERR_INVALID_ARG, "calibrate: no depth to measure up to %d", (int)p->depth_max);
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    int32_t dmax = depths[nd - 1], V = info.n_vocab;
    int32_t *prompt = xcalloc((size_t)dmax, sizeof(int32_t)), *base_ids = xcalloc((size_t)p->n_gen, sizeof(int32_t));
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    struct cal_lane L[2];
    int n = 0;
    struct model_cuda_tuning never = *t, always = *t;
    never.attn_cluster = -1, always.attn_cluster = 1;
    never.attn_cluster_from = never.attn_cluster_until = always.attn_cluster_from = always.attn_cluster_until = 0;
    cal_add_lane(L, &n, "attention cluster merge never", never);
    cal_add_lane(L, &n, "attention cluster merge always", always);
    struct cw_depth D[CW_MAX_DEPTHS];
    qwenrt_status st = prompt && base_ids ? QWENRT_OK : err_set(err, QWENRT_ERR_NOMEM, "calibrate: out of memory");
    if (!st)
        st = qwenrt_sampler_init(&gp, V, &greedy, err);
    if (!st) {
        validate_synthetic_prompt(1, V, prompt, dmax);
        st = cal_open_lanes(p, m, L, n, first_index, dmax + p->n_gen + 8, err);
    }
    for (int i = 0; i < nd && !st; i++)
        st = measure_depth(p, L, prompt, depths[i], V, greedy, cal_tolerance(m), base_ids, &D[i], err);
    if (!st) {
        double gain[CW_MAX_DEPTHS];
        bool passed[CW_MAX_DEPTHS];
        for (int i = 0; i < nd; i++)
            gain[i] = D[i].gain, passed[i] = D[i].gate_passed;
        cal_window_choose(depths, gain, passed, nd, t);
        *out = evidence(p, D, nd, t);
    }
    cal_free_lanes(L, n);
    qwenrt_sampler_free(greedy);
    xfree(prompt);
    xfree(base_ids);
    return st;
}
