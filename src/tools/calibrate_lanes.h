/*
 * calibrate_lanes.h — the lanes of `qwenrt calibrate --backend cuda`, shared by its two stages
 * (calibrate_cuda.c: the decode's shapes after a short prompt; calibrate_window.c: the
 * attention's cluster window at depth). A lane is one session of the model under one struct
 * model_cuda_tuning; a run of a lane is reset, prefill, n_gen steps of qwenrt_session_sample
 * (greedy) + qwenrt_session_decode (what `run` and `serve` do), the prompt and the steps timed
 * apart.
 * The gate: lane 0 of a set is the baseline and decodes its own greedy tokens; every other
 * lane decodes the baseline's tokens (so one near tie does not end the comparison) and must
 * pick the baseline's token at every step but for near ties (in its own logits row, the
 * baseline's token within the tolerance of its own), with logits within the tolerance of the
 * baseline's over the first CAL_LOGITS_STEPS steps. The tolerance is `qwenrt validate`'s for the model's weights (validate.c: the float
 * family for 16-bit weights, the quantised ones where x is rounded to 8 bits and one flipped
 * rounding cascades), applied element by element: a candidate must stay as close to the
 * baseline as the baseline must stay to the reference. In the timed runs every lane must
 * repeat its own gate tokens (a kernel that is not deterministic is out).
 */
#ifndef QWENRT_TOOLS_CALIBRATE_LANES_H
#define QWENRT_TOOLS_CALIBRATE_LANES_H

#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"
#include "qwenrt.h"
#include "tools/calibrate.h"

#define CAL_MAX_LANES 8
#define CAL_MIN_GAIN 1.01 /* a candidate must decode at least 1% faster than the baseline */
#define CAL_MAX_TRIALS 50
#define CAL_WINDOW_FIRST_DEPTH 256 /* the window stage's first depth (then 512, 1,024, ...) */
#define CAL_LOGITS_STEPS 64 /* steps whose logits the gate compares (tokens: every step); bounds its
                             * memory to 64 rows of the vocabulary */

struct validate_tolerance;

struct cal_lane {
    char label[64];
    struct model_cuda_tuning t;
    struct qwenrt_session *s;
    bool passed;
    char why[200]; /* the gate's failure, or "" */
    double max_err; /* the logits' largest relative difference (by norm) from the baseline's */
    int32_t near_ties; /* steps whose token differed from the baseline's in a near tie */
    int32_t *ids;   /* [n_gen]: the lane's own greedy tokens in its gate run */
    double pp[CAL_MAX_TRIALS], tg[CAL_MAX_TRIALS]; /* tokens/s per trial */
    double pp_med, tg_med;
};

/* One run's inputs: the prompt, the steps, the greedy sampler, the gate's tolerance; what the
 * run keeps or compares (set by cal_gate_lanes and cal_time_lanes). */
struct cal_run {
    const int32_t *prompt;
    int32_t n_prompt, n_gen, V;
    struct qwenrt_sampler *greedy;
    const struct validate_tolerance *tol;
    const int32_t *force;      /* [n_gen]: the tokens decoded, or NULL: the lane's own */
    const int32_t *expect;     /* [n_gen]: the lane's own tokens must be these, or NULL */
    int32_t *ids_out;          /* [n_gen]: the lane's own tokens, or NULL */
    float *logits_keep;        /* [CAL_LOGITS_STEPS][V]: written (the baseline's gate run) or NULL */
    const float *logits_ref;   /* the baseline's rows: compared, and every step's token checked
                                * (candidates' gate runs), or NULL */
};

/* validate's tolerance for the model's weights (the type of its first layer matrix; Qwen3.5's
 * quantised row where the model has DeltaNet layers). */
const struct validate_tolerance *cal_tolerance(const struct qwenrt_model *m);

/* L[0 .. n) gets a label and a tuning, everything else cleared; false when the set is full. */
bool cal_add_lane(struct cal_lane *L, int *n, const char *label, struct model_cuda_tuning t);

/* A session per lane (n_ctx positions, each under its lane's tuning; p->lane_hook called with
 * first_index + i); every lane marked passed. */
qwenrt_status cal_open_lanes(const struct calibrate_params *p, struct qwenrt_model *m, struct cal_lane *L, int n,
                             int first_index, int32_t n_ctx, struct qwenrt_error *err);

/* The gate run of every lane of L[0 .. n) against lane 0 (r's fields past tol are set here);
 * base_ids [r->n_gen] gets lane 0's tokens, each lane's ids its own. A lane that fails keeps
 * passed false and says why. */
qwenrt_status cal_gate_lanes(struct cal_lane *L, int n, const struct cal_run *r, int32_t *base_ids,
                             struct qwenrt_error *err);

/* warmup + trials runs of every lane that passed, decoding base_ids (the gate's baseline
 * tokens), each lane checked against its own gate tokens; the order rotates per trial;
 * medians. */
qwenrt_status cal_time_lanes(struct cal_lane *L, int n, const struct cal_run *r, const int32_t *base_ids, int warmup,
                             int trials, struct qwenrt_error *err);

/* The profile's cudaTuning object: only the fields t sets. */
json_t *cal_tuning_json(const struct model_cuda_tuning *t);

void cal_free_lanes(struct cal_lane *L, int n);

/* The attention's cluster window (calibrate_window.c): measured at depths 256, 512, ... up to
 * p->depth_max with two lanes under *t (the merge never, always); *t gets the choice (attn_cluster
 * -1, or 2 with the window) and *out the evidence. Nothing changes when p->depth_max is 0. */
qwenrt_status cal_window_run(const struct calibrate_params *p, struct qwenrt_model *m, int first_index,
                             struct model_cuda_tuning *t, json_t **out, struct qwenrt_error *err);

/* The window from the measured depths (ascending), the gain of the merge at each (always /
 * never - 1) and whether its gate passed there: a depth wins at +CAL_MIN_GAIN, loses at
 * -CAL_MIN_GAIN or a failed gate, is level between; the run from a winning depth to a winning
 * depth with no loss inside and the largest summed gain becomes t->attn_cluster 2 with
 * attn_cluster_from / _until (each depth d standing for [3d/4, 3d/2)); no win: -1. */
void cal_window_choose(const int32_t *depths, const double *gain, const bool *passed, int n,
                       struct model_cuda_tuning *t);

#endif
