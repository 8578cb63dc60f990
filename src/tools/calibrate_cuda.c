/*
 * calibrate_cuda.c — `qwenrt calibrate --backend cuda`: the CUDA decode's shape choices
 * measured for one model on this GPU (see calibrate.h; the CPU calibration picks kernels).
 *
 * What is tuned: the knobs whose best value the H200 measurements showed to depend on the
 * model, the weight type and the machine (docs/perf-log.md, sessions 13-15): gemv_smem's warps
 * and shared memory per block and where its blocks release the next launch (16-bit weights),
 * gemvq's rows per warp, PDL and its launch order (quantised weights), and the decode
 * attention's positions per split. Each candidate is one struct model_cuda_tuning; the
 * baseline is the session's own picks (all zeros).
 *
 * The gate (calibrate_lanes.h): every candidate lane (one CUDA session each, the same model)
 * decodes the baseline's greedy tokens after the same prompt and must pick them itself (but
 * for near ties) with logits within `qwenrt validate`'s tolerance for the model's weights.
 * The baseline itself is what `qwenrt validate` and the test suite prove against the
 * reference; comparing against it instead of the reference path keeps random-weight models
 * (whose Qwen3.5 recurrences leave the float tolerance at position 7 on every backend: perf-log
 * session 11) calibratable, and the tolerance lets through a candidate whose sums differ only
 * in their order (shapes change which thread sums a row; the attention's merges change the
 * order), which in a quantised model flips some 8-bit roundings of x (perf-log session 26).
 * The machinery runs on whichever backend the parameters name: the tests run it on the CPU,
 * whose sessions ignore the shapes (every lane then computes the same thing).
 *
 * Timing: warm-ups, then trials in which every lane runs once, the lane order rotating per
 * trial (so drift is shared): reset, prefill (timed), n_gen greedy steps through
 * qwenrt_session_sample + qwenrt_session_decode (timed: what `run` and `serve` do), each
 * token checked against the gate's. A candidate is chosen when its median decode rate beats
 * the baseline's by CAL_MIN_GAIN and no other candidate's is higher; otherwise the profile
 * keeps the session's picks (an empty cudaTuning).
 * Then, with calibrate_params.depth_max, a second stage (calibrate_window.c) measures under
 * that choice where the attention's cluster merge pays, and adds the window to the profile.
 * The lane machinery both stages use is declared in calibrate_lanes.h.
 */
#include "tools/calibrate.h"
#include "tools/calibrate_lanes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "model/model.h"
#include "tools/records.h"
#include "tools/validate.h"
#include "tools/tool_setup.h"

enum weight_class { WEIGHTS_F32, WEIGHTS_16BIT, WEIGHTS_QUANT };

/* The layers' matrices decide the GEMV kernels: 16-bit take gemv_smem, quantised gemvq. */
static enum weight_class weight_class_of(const struct qwenrt_model *m)
{
    const struct plan *p = &m->plans[PHASE_DECODE];
    bool w16 = false;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind != OP_MATMUL || !op->w || op->layer < 0)
            continue;
        if (op->w->dtype != QR_F32 && op->w->dtype != QR_F16 && op->w->dtype != QR_BF16)
            return WEIGHTS_QUANT;
        w16 = w16 || op->w->dtype != QR_F32;
    }
    return w16 ? WEIGHTS_16BIT : WEIGHTS_F32;
}

/* Whether any layer matrix is Q8_0 (gemvq's default rows per warp there is 2, else 1). */
static bool has_q8_0(const struct qwenrt_model *m)
{
    const struct plan *p = &m->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_MATMUL && p->ops[i].w && p->ops[i].layer >= 0 &&
            p->ops[i].w->dtype == QR_Q8_0)
            return true;
    return false;
}

const struct validate_tolerance *cal_tolerance(const struct qwenrt_model *m)
{
    const struct plan *p = &m->plans[PHASE_DECODE];
    enum qr_dtype w = QR_F32;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_MATMUL && p->ops[i].w && p->ops[i].layer >= 0) {
            w = p->ops[i].w->dtype;
            break;
        }
    return validate_tolerance_for(w, false, m->hp.arch == ARCH_QWEN35);
}

bool cal_add_lane(struct cal_lane *L, int *n, const char *label, struct model_cuda_tuning t)
{
    if (*n >= CAL_MAX_LANES)
        return false;
    memset(&L[*n], 0, sizeof(L[*n]));
    snprintf(L[*n].label, sizeof(L[*n].label), "%s", label);
    L[*n].t = t;
    (*n)++;
    return true;
}

/* The baseline (lane 0) and the candidates for this model's weights. */
static int list_lanes(const struct qwenrt_model *m, struct cal_lane *L)
{
    int n = 0;
    struct model_cuda_tuning z = {0}, t;
    cal_add_lane(L, &n, "session picks (default)", z);
    enum weight_class wc = weight_class_of(m);
    if (wc == WEIGHTS_16BIT) {
        static const int32_t shapes[][3] = {{8, 120, 2}, {8, 120, 1}, {16, 160, 1},
                                            {16, 160, 2}, {16, 200, 1}, {4, 100, 2}};
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            char label[64];
            t = z;
            t.gemv_smem_warps = shapes[i][0], t.gemv_smem_kb = shapes[i][1];
            t.gemv_smem_launch = shapes[i][2];
            snprintf(label, sizeof(label), "gemv_smem %d warps %d KB %s", shapes[i][0], shapes[i][1],
                     shapes[i][2] == 2 ? "after-wait" : "before-wait");
            cal_add_lane(L, &n, label, t);
        }
    } else if (wc == WEIGHTS_QUANT) {
        int32_t def = has_q8_0(m) ? 2 : 1;
        static const int32_t rows[] = {1, 2, 4};
        for (int i = 0; i < 3; i++) {
            char label[64];
            t = z;
            t.gemvq_rows = rows[i];
            if (rows[i] != def) {
                snprintf(label, sizeof(label), "gemvq %d rows", rows[i]);
                cal_add_lane(L, &n, label, t);
            }
            t.pdl = true, t.gemvq_launch = 2;
            snprintf(label, sizeof(label), "gemvq %d rows, pdl after-wait", rows[i]);
            cal_add_lane(L, &n, label, t);
        }
        /* blocks of 8 warps reserving 100 KB (two per multiprocessor): with PDL one launch
         * ahead, Qwen3-0.6B Q8_0's best shape (H200, +3.9%; docs/perf-log.md, session 17) */
        t = z;
        t.gemvq_rows = 2, t.gemvq_warps = 8, t.gemvq_smem_kb = 100, t.pdl = true, t.gemvq_launch = 2;
        cal_add_lane(L, &n, "gemvq 8 warps x 2 rows, 100 KB, pdl after-wait", t);
    } else {
        t = z;
        t.pdl = true;
        cal_add_lane(L, &n, "pdl", t);
        t = z;
        t.attn_split_min = 32;
        cal_add_lane(L, &n, "attention splits of 32+", t);
    }
    t = z;
    t.attn_split_min = 128;
    cal_add_lane(L, &n, "attention splits of 128+", t);
    return n;
}

static double rel_err(const float *a, const float *b, int32_t n)
{
    double num = 0, den = 0;
    for (int32_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* A candidate's logits row against the baseline's (step g): element by element within the
 * tolerance; the relative difference by norm goes to l->max_err. */
static void check_logits(const struct cal_run *r, struct cal_lane *l, int32_t g, const float *row)
{
    const float *ref = r->logits_ref + (size_t)g * r->V;
    double e = rel_err(row, ref, r->V), mx, mean;
    l->max_err = e > l->max_err ? e : l->max_err;
    if (l->passed &&
        !validate_allclose(row, ref, (size_t)r->V, r->tol->logits_rtol, r->tol->logits_atol, &mx, &mean)) {
        l->passed = false;
        snprintf(l->why, sizeof(l->why),
                 "logits at step %d differ from the baseline's by up to %.3g (tolerance %g + %g x |baseline|)", g, mx,
                 r->tol->logits_atol, r->tol->logits_rtol);
    }
}

/* A candidate's own token id at step g against the baseline's b: equal, or a near tie (in the
 * candidate's own logits row, b within the tolerance of id; the rows themselves are compared
 * over the first CAL_LOGITS_STEPS steps). */
static void check_token(const struct cal_run *r, struct cal_lane *l, int32_t g, int32_t id, const float *row)
{
    int32_t b = r->force[g];
    if (id == b || !l->passed)
        return;
    double gap = (double)row[id] - row[b];
    if (gap <= r->tol->logits_atol + r->tol->logits_rtol * fabs((double)row[id])) {
        l->near_ties++;
        return;
    }
    l->passed = false;
    snprintf(l->why, sizeof(l->why), "greedy token %d at step %d, the baseline's is %d, %.3g below it (not a near tie)",
             id, g, b, gap);
}

/* One run of a lane: reset, prefill, n_gen steps (cal_run says what is decoded, kept and
 * checked). Times go to *pp_s and *tg_s. */
static qwenrt_status run_lane(const struct cal_run *r, struct cal_lane *l, double *pp_s, double *tg_s,
                              struct qwenrt_error *err)
{
    qwenrt_session_reset(l->s);
    double t0 = time_now_s();
    qwenrt_status st = qwenrt_session_prefill(l->s, r->prompt, r->n_prompt, NULL, err);
    if (st)
        return st;
    if (!qwenrt_session_logits(l->s)) /* waits for the GPU: the prompt's time is all its own */
        return err_set(err, QWENRT_ERR_BACKEND, "calibrate: no logits after the prompt");
    double t1 = time_now_s();
    for (int32_t g = 0; g < r->n_gen; g++) {
        const float *row = NULL; /* the gate's runs read every step's row (candidates: all) */
        if ((r->logits_keep && g < CAL_LOGITS_STEPS) || r->logits_ref) {
            if (!(row = qwenrt_session_logits(l->s)))
                return err_set(err, QWENRT_ERR_BACKEND, "calibrate: no logits at step %d", g);
            if (r->logits_keep)
                memcpy(r->logits_keep + (size_t)g * r->V, row, (size_t)r->V * sizeof(float));
            if (r->logits_ref && g < CAL_LOGITS_STEPS)
                check_logits(r, l, g, row);
        }
        int32_t id;
        if ((st = qwenrt_session_sample(l->s, r->greedy, &id, err)))
            return st;
        if (r->ids_out)
            r->ids_out[g] = id;
        if (r->logits_ref)
            check_token(r, l, g, id, row);
        if (r->expect && id != r->expect[g] && l->passed) {
            l->passed = false;
            snprintf(l->why, sizeof(l->why), "greedy token %d at step %d of a timed run, its gate run's was %d",
                     id, g, r->expect[g]);
        }
        if ((st = qwenrt_session_decode(l->s, r->force ? r->force[g] : id, err)))
            return st;
    }
    double t2 = time_now_s();
    *pp_s = t1 - t0, *tg_s = t2 - t1;
    return QWENRT_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[CAL_MAX_TRIALS];
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static const char *launch_name(int32_t v) { return v == 2 ? "after-wait" : v == 1 ? "before-wait" : "auto"; }

json_t *cal_tuning_json(const struct model_cuda_tuning *t)
{
    json_t *o = json_object();
    if (t->gemv_smem_warps)
        json_object_set_new(o, "gemvSmemWarps", json_integer(t->gemv_smem_warps));
    if (t->gemv_smem_kb)
        json_object_set_new(o, "gemvSmemKb", json_integer(t->gemv_smem_kb));
    if (t->gemv_smem_launch)
        json_object_set_new(o, "gemvSmemLaunch", json_string(launch_name(t->gemv_smem_launch)));
    if (t->gemvq_rows)
        json_object_set_new(o, "gemvqRows", json_integer(t->gemvq_rows));
    if (t->gemvq_launch)
        json_object_set_new(o, "gemvqLaunch", json_string(launch_name(t->gemvq_launch)));
    if (t->gemvq_warps)
        json_object_set_new(o, "gemvqWarps", json_integer(t->gemvq_warps));
    if (t->gemvq_smem_kb)
        json_object_set_new(o, "gemvqSmemKb", json_integer(t->gemvq_smem_kb));
    if (t->pdl)
        json_object_set_new(o, "pdl", json_true());
    if (t->attn_split_min)
        json_object_set_new(o, "attnSplitMin", json_integer(t->attn_split_min));
    if (t->attn_cluster) {
        static const char *const names[] = {"never", "auto", "always", "window"};
        json_object_set_new(o, "attnCluster", json_string(names[t->attn_cluster + 1]));
    }
    if (t->attn_cluster_from)
        json_object_set_new(o, "attnClusterFrom", json_integer(t->attn_cluster_from));
    if (t->attn_cluster_until)
        json_object_set_new(o, "attnClusterUntil", json_integer(t->attn_cluster_until));
    return o;
}

static json_t *profile_json(const char *id, const char *desc, const struct model_cuda_tuning *t)
{
    char now[40];
    records_now(now);
    now[19] = 0;
    strcat(now, "Z");
    return json_pack("{s:s, s:s, s:s, s:s, s:[s,s,s], s:s, s:s, s:s, s:s, s:{s:{s:o}}}", "id", id,
                     "name", id, "description", desc, "intent", "calibrate", "compatibleIntents",
                     "calibrate", "verify", "investigate", "stability", "experimental", "owner",
                     "qwenrt calibrate", "createdAtUtc", now, "extends", "profiles/default",
                     "runtime", "inference", "cudaTuning", cal_tuning_json(t));
}

qwenrt_status cal_open_lanes(const struct calibrate_params *p, struct qwenrt_model *m, struct cal_lane *L, int n,
                             int first_index, int32_t n_ctx, struct qwenrt_error *err)
{
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = n_ctx;
    qwenrt_status st = QWENRT_OK;
    for (int i = 0; i < n && !st; i++) {
        m->cuda_tuning = L[i].t; /* read by qwenrt_session_init */
        st = qwenrt_session_init(m, &sp, &L[i].s, err);
        if (st) {
            char msg[sizeof(err->message)];
            snprintf(msg, sizeof(msg), "%s", err->message);
            st = err_set(err, st, "calibrate: lane '%s': %s", L[i].label, msg);
            break;
        }
        if (p->lane_hook)
            p->lane_hook(L[i].s, first_index + i, p->hook_user);
        L[i].passed = true;
    }
    memset(&m->cuda_tuning, 0, sizeof(m->cuda_tuning));
    return st;
}

qwenrt_status cal_gate_lanes(struct cal_lane *L, int n, const struct cal_run *r, int32_t *base_ids,
                             struct qwenrt_error *err)
{
    int32_t rows = r->n_gen < CAL_LOGITS_STEPS ? r->n_gen : CAL_LOGITS_STEPS;
    float *keep = xalloc_aligned((size_t)rows * r->V, sizeof(float));
    qwenrt_status st = keep ? QWENRT_OK : err_set(err, QWENRT_ERR_NOMEM, "calibrate: out of memory for %d logits rows", rows);
    for (int i = 0; i < n && !st; i++) {
        L[i].passed = true, L[i].why[0] = 0, L[i].max_err = 0, L[i].near_ties = 0;
        if (!L[i].ids && !(L[i].ids = xcalloc((size_t)r->n_gen, sizeof(int32_t)))) {
            st = err_set(err, QWENRT_ERR_NOMEM, "calibrate: out of memory");
            break;
        }
        struct cal_run g = *r;
        g.force = i == 0 ? NULL : base_ids;
        g.expect = NULL;
        g.ids_out = L[i].ids;
        g.logits_keep = i == 0 ? keep : NULL;
        g.logits_ref = i == 0 ? NULL : keep;
        double a, b;
        st = run_lane(&g, &L[i], &a, &b, err);
        if (!st && i == 0)
            memcpy(base_ids, L[0].ids, (size_t)r->n_gen * sizeof(int32_t));
    }
    xfree(keep);
    return st;
}

void cal_free_lanes(struct cal_lane *L, int n)
{
    for (int i = 0; i < n; i++) {
        qwenrt_session_free(L[i].s);
        xfree(L[i].ids);
        L[i].s = NULL, L[i].ids = NULL;
    }
}

qwenrt_status cal_time_lanes(struct cal_lane *L, int n, const struct cal_run *r, const int32_t *base_ids, int warmup,
                             int trials, struct qwenrt_error *err)
{
    for (int k = -warmup; k < trials; k++)
        for (int j = 0; j < n; j++) {
            struct cal_lane *l = &L[(j + (k < 0 ? 0 : k)) % n]; /* rotate the order per trial */
            if (!l->passed)
                continue;
            struct cal_run t = *r; /* every lane decodes the baseline's tokens and repeats its own */
            t.force = base_ids, t.expect = l->ids, t.ids_out = NULL;
            t.logits_keep = NULL, t.logits_ref = NULL;
            double pp, tg;
            qwenrt_status st = run_lane(&t, l, &pp, &tg, err);
            if (st)
                return st;
            if (k >= 0) {
                l->pp[k] = r->n_prompt / pp;
                l->tg[k] = r->n_gen / tg;
            }
        }
    for (int i = 0; i < n; i++)
        if (L[i].passed)
            L[i].pp_med = median(L[i].pp, trials), L[i].tg_med = median(L[i].tg, trials);
    return QWENRT_OK;
}

/* The evidence record; *chosen gets the winning lane (0: the baseline). */
static json_t *evidence(const struct calibrate_params *p, const struct cal_lane *L, int n,
                        const struct validate_tolerance *tol, int *chosen)
{
    *chosen = 0;
    for (int i = 1; i < n; i++)
        if (L[i].passed && L[i].tg_med >= L[0].tg_med * CAL_MIN_GAIN && L[i].tg_med > L[*chosen].tg_med)
            *chosen = i;
    json_t *choices = json_array(), *lanes = json_array();
    double base_s = L[0].tg_med > 0 ? p->n_gen / L[0].tg_med : 0;
    for (int i = 0; i < n; i++) {
        json_t *pp = json_array(), *tg = json_array();
        for (int k = 0; L[i].passed && k < p->trials; k++) {
            json_array_append_new(pp, json_real(L[i].pp[k]));
            json_array_append_new(tg, json_real(L[i].tg[k]));
        }
        json_array_append_new(
            lanes, json_pack("{s:s, s:o, s:s, s:s, s:f, s:i, s:o, s:o, s:f, s:f}", "label", L[i].label, "cudaTuning",
                             cal_tuning_json(&L[i].t), "gate", L[i].passed ? "passed" : "failed", "gate_failure",
                             L[i].why, "max_logits_rel_err_vs_baseline", L[i].max_err, "near_ties", L[i].near_ties,
                             "prefill_tok_s", pp,
                             "decode_tok_s", tg, "median_prefill_tok_s", L[i].pp_med, "median_decode_tok_s",
                             L[i].tg_med));
        if (i > 0)
            json_array_append_new(
                choices, json_pack("{s:s, s:s, s:f, s:f, s:b}", "op", "cudaTuning", "key", L[i].label,
                                   "median_total_s", L[i].passed && L[i].tg_med > 0 ? p->n_gen / L[i].tg_med : 0.0,
                                   "baseline_total_s", base_s, "chosen", i == *chosen));
    }
    return json_pack("{s:i, s:s, s:s, s:s, s:o, s:o, s:{s:i, s:i, s:i, s:i, s:s, s:s, s:f, s:f, s:i, s:f}}",
                     "schema_version", RECORDS_SCHEMA_VERSION, "kind", "calibration", "backend", p->backend, "status",
                     "calibrated", "choices", choices, "lanes", lanes, "method", "n_prompt", p->n_prompt, "n_gen",
                     p->n_gen, "warmup", p->warmup, "trials", p->trials, "gate",
                     "candidates decode the baseline's greedy tokens (the session's own picks) and must pick "
                     "them too, but for near ties (the baseline's token within the tolerance of their own in "
                     "their own logits), with "
                     "logits within qwenrt validate's tolerance for the weights, element by element, over "
                     "the first logits_steps steps; in the timed runs every lane repeats its own gate tokens. "
                     "The baseline is what qwenrt validate and the tests prove against the reference",
                     "tolerance_family", tol->family, "logits_rtol", tol->logits_rtol, "logits_atol",
                     tol->logits_atol, "logits_steps", CAL_LOGITS_STEPS, "min_gain", CAL_MIN_GAIN);
}

qwenrt_status calibrate_cuda_run(const struct calibrate_params *p, json_t **out, struct qwenrt_error *err)
{
    *out = NULL;
    if (p->trials < 1 || p->trials > CAL_MAX_TRIALS || p->warmup < 0 || p->n_prompt < 1 || p->n_gen < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "calibrate: trials 1 to %d, warm-ups >= 0, -p and -n >= 1",
                       CAL_MAX_TRIALS);
    if (p->depth_max < 0 || (p->depth_max > 0 && p->depth_max < CAL_WINDOW_FIRST_DEPTH))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "calibrate: --depth-max %d is below the first depth measured (%d; 0: no window stage)",
                       (int)p->depth_max, CAL_WINDOW_FIRST_DEPTH);
    struct tool_model tm;
    struct tool_open_params op = {.model_path = p->model_path, .backend = p->backend, .n_threads = p->n_threads,
                                  .profiles_dir = p->profiles_dir, .command = "calibrate",
                                  .intent = PROFILE_INTENT_CALIBRATE};
    qwenrt_status st = tool_open(&op, &tm, err);
    if (st)
        return st;
    struct cal_lane L[CAL_MAX_LANES];
    int n = list_lanes(tm.model, L);
    struct qwenrt_model_info info;
    qwenrt_model_get_info(tm.model, &info);
    int32_t *prompt = xcalloc((size_t)p->n_prompt, sizeof(int32_t));
    int32_t *base_ids = xcalloc((size_t)p->n_gen, sizeof(int32_t));
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    if (!prompt || !base_ids)
        st = err_set(err, QWENRT_ERR_NOMEM, "calibrate: out of memory");
    if (!st)
        st = qwenrt_sampler_init(&gp, info.n_vocab, &greedy, err);
    if (!st)
        validate_synthetic_prompt(1, info.n_vocab, prompt, p->n_prompt); /* random ids, fixed */
    struct cal_run r = {.prompt = prompt, .n_prompt = p->n_prompt, .n_gen = p->n_gen, .V = info.n_vocab,
                        .greedy = greedy, .tol = cal_tolerance(tm.model)};
    if (!st)
        st = cal_open_lanes(p, tm.model, L, n, 0, r.n_prompt + r.n_gen + 8, err);
    if (!st)
        st = cal_gate_lanes(L, n, &r, base_ids, err);
    if (!st)
        st = cal_time_lanes(L, n, &r, base_ids, p->warmup, p->trials, err);
    int chosen = 0;
    json_t *ev = NULL;
    if (!st && !L[0].passed) /* its timed runs left its own gate tokens: not deterministic */
        st = err_set(err, QWENRT_ERR_BACKEND, "calibrate: the baseline lane failed: %s", L[0].why);
    struct model_cuda_tuning t = {0};
    if (!st) { /* a candidate whose timed tokens left the gate's is out (passed cleared) */
        ev = evidence(p, L, n, r.tol, &chosen);
        t = L[chosen].t;
        cal_free_lanes(L, n); /* the window's lanes need the memory of longer contexts */
        json_t *win = NULL;
        st = cal_window_run(p, tm.model, n, &t, &win, err);
        if (win)
            json_object_set_new(ev, "attention_cluster", win);
    }
    if (!st) {
        char desc[640], wtext[96] = "";
        if (t.attn_cluster == 2)
            snprintf(wtext, sizeof(wtext), "; the attention's cluster merge at positions %d to %d",
                     (int)t.attn_cluster_from, (int)t.attn_cluster_until);
        else if (t.attn_cluster == -1)
            snprintf(wtext, sizeof(wtext), "; the attention's cluster merge nowhere (measured to depth %d)",
                     (int)p->depth_max);
        snprintf(desc, sizeof(desc),
                 "written by qwenrt calibrate --backend cuda for %.200s on this GPU: %s (decode %.0f tokens/s "
                 "against %.0f with the session's own picks; prompt %d, output %d tokens, %d trials)%s",
                 p->model_path, chosen ? L[chosen].label : "the session's own picks", L[chosen].tg_med,
                 L[0].tg_med, p->n_prompt, p->n_gen, p->trials, wtext);
        json_t *doc = profile_json(p->profile_id, desc, &t);
        records_add_environment(ev);
        records_add_gpu(ev);
        json_object_set_new(ev, "profile", doc);
        st = records_write(doc, p->out_profile, err);
    }
    cal_free_lanes(L, n);
    qwenrt_sampler_free(greedy);
    xfree(prompt);
    xfree(base_ids);
    tool_close(&tm);
    if (st) {
        json_decref(ev);
        return st;
    }
    *out = ev;
    return QWENRT_OK;
}
