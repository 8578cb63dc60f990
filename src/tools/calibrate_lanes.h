/*
 * calibrate_lanes.h — the lanes of `qwenrt calibrate --backend cuda`, shared by its two stages
 * (calibrate_cuda.c: the decode's shapes after a short prompt; calibrate_window.c: the
 * attention's cluster window at depth). A lane is one session of the model under one struct
 * model_cuda_tuning; a run of a lane is reset, prefill, n_gen greedy steps through
 * qwenrt_session_sample + qwenrt_session_decode (what `run` and `serve` do), the prompt and
 * the steps timed apart. The gate: lane 0 of a set is the baseline, and every other lane must
 * give its token ids at every step and logits within CAL_LOGITS_RTOL over the first
 * CAL_LOGITS_STEPS steps; a lane that leaves the gate's tokens in a timed run is out too.
 */
#ifndef QWENRT_TOOLS_CALIBRATE_LANES_H
#define QWENRT_TOOLS_CALIBRATE_LANES_H

#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"
#include "qwenrt.h"
#include "tools/calibrate.h"

#define CAL_MAX_LANES 8
#define CAL_LOGITS_RTOL 1e-4 /* candidate vs baseline, ||c - b|| / ||b|| per step */
#define CAL_MIN_GAIN 1.01    /* a candidate must decode at least 1% faster than the baseline */
#define CAL_MAX_TRIALS 50
#define CAL_LOGITS_STEPS 64 /* steps whose logits the gate compares (ids: every step); bounds its
                             * memory to 64 rows of the vocabulary */

struct cal_lane {
    char label[64];
    struct model_cuda_tuning t;
    struct qwenrt_session *s;
    bool passed;
    char why[160]; /* the gate's failure, or "" */
    double max_err;
    double pp[CAL_MAX_TRIALS], tg[CAL_MAX_TRIALS]; /* tokens/s per trial */
    double pp_med, tg_med;
};

/* One run's inputs: the prompt, the steps, the greedy sampler; for the gate, the baseline's
 * tokens to expect and its logits rows to compare (or the buffers that keep them). */
struct cal_run {
    const int32_t *prompt;
    int32_t n_prompt, n_gen, V;
    struct qwenrt_sampler *greedy;
    const int32_t *expect;   /* [n_gen] or NULL */
    int32_t *ids_out;        /* [n_gen] or NULL */
    float *logits_keep;      /* [n_gen][V]: written (baseline's gate run) or NULL */
    const float *logits_ref; /* [n_gen][V]: compared (candidates' gate runs) or NULL */
};

/* L[0 .. n) gets a label and a tuning, everything else cleared; false when the set is full. */
bool cal_add_lane(struct cal_lane *L, int *n, const char *label, struct model_cuda_tuning t);

/* A session per lane (n_ctx positions, each under its lane's tuning; p->lane_hook called with
 * first_index + i); every lane marked passed. */
qwenrt_status cal_open_lanes(const struct calibrate_params *p, struct qwenrt_model *m, struct cal_lane *L, int n,
                             int first_index, int32_t n_ctx, struct qwenrt_error *err);

/* The gate run of every lane of L[0 .. n) against lane 0 (r's expect and logits fields are
 * set here); base_ids [r->n_gen] gets lane 0's tokens. A lane that fails keeps passed false
 * and says why. */
qwenrt_status cal_gate_lanes(struct cal_lane *L, int n, const struct cal_run *r, int32_t *base_ids,
                             struct qwenrt_error *err);

/* warmup + trials runs of every lane that passed, the order rotating per trial; medians. */
qwenrt_status cal_time_lanes(struct cal_lane *L, int n, const struct cal_run *r, int warmup, int trials,
                             struct qwenrt_error *err);

/* n random token ids below V (a fixed sequence: every lane and every run reads the same). */
void cal_random_ids(int32_t *ids, int32_t n, int32_t V);

/* The profile's cudaTuning object: only the fields t sets. */
json_t *cal_tuning_json(const struct model_cuda_tuning *t);

void cal_free_lanes(struct cal_lane *L, int n);

/* The attention's cluster window (calibrate_window.c): measured at depths 256, 512, ... up to
 * p->depth_max with two lanes under *t (the merge never, always); *t gets the choice (attn_cluster
 * -1, or 2 with the window) and *out the evidence. Nothing changes when p->depth_max is 0. */
qwenrt_status cal_window_run(const struct calibrate_params *p, struct qwenrt_model *m, int first_index,
                             struct model_cuda_tuning *t, json_t **out, struct qwenrt_error *err);

#endif
