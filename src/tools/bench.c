/*
 * bench.c — the benchmark (see bench.h).
 *
 * Timing of one generation (seed 004's definitions): t0 just before the session reset,
 * prefill of the prompt (logits of the last position only), host argmax -> first token at t1;
 * then n_gen-1 decode steps, each ending with its argmax, the last at t2.
 * TTFT = t1 - t0; prefill tokens/s = n_prompt / TTFT; decode = t2 - t1 over n_gen-1 forwards,
 * decode tokens/s = (n_gen-1) / decode; total = t2 - t0 = TTFT + decode (checked). Per-token
 * latencies are the decode steps of every timed trial, pooled. Trials alternate the lane order
 * (even trials candidate first, odd trials candidate last) so drift hits every lane alike;
 * ratios are candidate / comparison per trial, then the median.
 * Peak memory: the kernel's peak RSS counter is reset after validation (clear_refs 5), so it
 * covers the timed lanes (models, sessions, warm-ups and trials), read from VmHWM.
 */
#include "tools/bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "runtime/session.h"
#include "tools/records.h"
#include "tools/tool_setup.h"
#include "tools/validate.h"

enum lane_kind { LANE_QWENRT, LANE_CMD };

struct lane {
    char name[256];
    enum lane_kind kind;
    const char *profile, *backend, *cmd;
    struct tool_model tm;
    struct qwenrt_session *s;
    struct qwenrt_sampler *greedy;  /* temperature 0: the argmax, as qwenrt run's users sample */
    int32_t *tokens;                /* validated tokens [n_gen] */
    json_t *validation;             /* summary of its gate */
    double *ttft, *pp, *tg, *total; /* [trials] */
    double *step_ms;                /* [trials * (n_gen-1)] decode step latencies */
    int32_t n_steps;
    bool tokens_ok;
};

struct bench {
    const struct bench_params *p;
    struct lane lanes[BENCH_MAX_LANES];
    int n_lanes;
    int32_t *prompt;
    int32_t *scratch_tokens;
    char status[32];
    char reason[512];
};

/* ------------------------------------------------------------------ statistics */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n values (copied, sorted). */
static double percentile(const double *v, int n, double pct)
{
    if (n <= 0)
        return NAN;
    double *s = xmalloc((size_t)n, sizeof(double));
    if (!s)
        return NAN;
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    int idx = (int)ceil(pct / 100.0 * n) - 1;
    double r = pct == 50 && n % 2 == 0 ? 0.5 * (s[n / 2 - 1] + s[n / 2]) : s[idx < 0 ? 0 : idx];
    xfree(s);
    return r;
}

static double median(const double *v, int n)
{
    return percentile(v, n, 50);
}

static json_t *jarray(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, isfinite(v[i]) ? json_real(v[i]) : json_null());
    return a;
}

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* ------------------------------------------------------------------ qwenrt lanes */

/* One greedy generation; tokens[n_gen]; times as defined above. */
static qwenrt_status generate(struct bench *b, struct lane *l, int32_t *tokens, double *ttft,
                              double *decode, double *steps, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    double t0 = time_now_s();
    qwenrt_session_reset(l->s);
    qwenrt_status st = qwenrt_session_prefill(l->s, b->prompt, p->n_prompt, NULL, err);
    if (st || (st = qwenrt_session_sample(l->s, l->greedy, &tokens[0], err)))
        return st;
    double t1 = time_now_s(), prev = t1;
    for (int32_t i = 1; i < p->n_gen; i++) {
        if ((st = qwenrt_session_decode(l->s, tokens[i - 1], err)) ||
            (st = qwenrt_session_sample(l->s, l->greedy, &tokens[i], err)))
            return st;
        double now = time_now_s();
        if (steps)
            steps[i - 1] = (now - prev) * 1e3;
        prev = now;
    }
    *ttft = t1 - t0;
    *decode = prev - t1;
    return QWENRT_OK;
}

static json_t *tokens_json(const int32_t *t, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < n && t; i++)
        json_array_append_new(a, json_integer(t[i]));
    return a;
}

/* Tokens from a validate record, when it covers this model, profile and workload. */
static qwenrt_status from_record(struct bench *b, struct lane *l, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    json_error_t je;
    json_t *rec = json_load_file(p->validation_record, 0, &je);
    if (!rec)
        return err_set(err, QWENRT_ERR_FORMAT, "%s:%d: %s", p->validation_record, je.line, je.text);
    json_t *w = json_object_get(rec, "workload"), *res = json_object_get(rec, "result");
    json_t *now = json_object();
    qwenrt_status st = records_add_model(now, l->tm.model, 0, 0, err);
    const char *psha =
        json_string_value(json_object_get(json_object_get(rec, "profile"), "sha256"));
    const char *why = NULL;
    if (st)
        goto out;
    if (strcmp(json_string_value(json_object_get(rec, "status")) ?: "", "validated"))
        why = "its status is not 'validated'";
    else if (!json_equal(json_object_get(rec, "checkpoint_sha256"),
                         json_object_get(now, "checkpoint_sha256")))
        why = "it was made for other model files (checkpoint_sha256 differs)";
    else if (!psha || !l->tm.profile || strcmp(psha, l->tm.profile->sha256))
        why = "it was made for another profile (profile sha256 differs)";
    else if (json_integer_value(json_object_get(w, "prompt_tokens")) != p->n_prompt ||
             json_integer_value(json_object_get(w, "output_tokens")) != p->n_gen ||
             (uint64_t)json_integer_value(json_object_get(w, "seed")) != p->seed ||
             !json_object_get(w, "seed"))
        why = "it covers another workload (prompt tokens, output tokens or seed differ)";
    else if (strcmp(json_string_value(json_object_get(json_object_get(rec, "reference"), "kind"))
                        ?: "",
                    "qwenrt-reference"))
        why = "its prompt is a reference file's, not the bench's synthetic prompt";
    if (why) {
        st = err_set(err, QWENRT_ERR_INVALID_ARG, "%s cannot stand for this run: %s",
                     p->validation_record, why);
        goto out;
    }
    json_t *toks = json_object_get(res, "generated_token_ids");
    for (int32_t i = 0; i < p->n_gen; i++)
        l->tokens[i] = (int32_t)json_integer_value(json_array_get(toks, (size_t)i));
    l->validation =
        json_pack("{s:s, s:s, s:O}", "status", "validated", "source", p->validation_record,
                  "positions_checked", json_object_get(res, "positions_checked"));
out:
    json_decref(now);
    json_decref(rec);
    return st;
}

/* Validates a qwenrt lane (or reads the record); false when the gate refused it. */
static qwenrt_status gate_lane(struct bench *b, struct lane *l, bool *passed,
                               struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    *passed = false;
    if (p->validation_record && l == &b->lanes[0]) {
        qwenrt_status st = from_record(b, l, err);
        *passed = !st;
        return st;
    }
    struct validate_params vp = {.model_path = p->model_path,
                                 .backend = l->backend,
                                 .n_threads = p->n_threads,
                                 .profile = l->profile,
                                 .profiles_dir = p->profiles_dir,
                                 .n_prompt = p->n_prompt,
                                 .n_gen = p->n_gen,
                                 .seed = p->seed,
                                 .command = "bench",
                                 .intent = PROFILE_INTENT_CALIBRATE};
    struct validate_result r;
    qwenrt_status st = validate_run(&vp, &r, err);
    if (st)
        return st;
    json_t *res = json_object_get(r.record, "result");
    l->validation = json_pack(
        "{s:s, s:s, s:O, s:O, s:s}", "status", r.passed ? "validated" : "validation_failed",
        "source", "validate_run (qwenrt reference path, same workload)", "positions_checked",
        json_object_get(res, "positions_checked"), "first_failure_position",
        json_object_get(res, "first_failure_position"), "failure", r.failure);
    if (r.passed)
        memcpy(l->tokens, r.tokens, (size_t)p->n_gen * sizeof(int32_t));
    else
        snprintf(b->reason, sizeof(b->reason), "lane '%s' failed validation: %s", l->name,
                 r.failure);
    *passed = r.passed;
    validate_result_free(&r);
    return QWENRT_OK;
}

static qwenrt_status open_lane(struct bench *b, struct lane *l, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    struct tool_open_params op = {.model_path = p->model_path,
                                  .backend = l->backend,
                                  .n_threads = p->n_threads,
                                  .profile = l->profile,
                                  .profiles_dir = p->profiles_dir,
                                  .command = "bench",
                                  .intent = PROFILE_INTENT_CALIBRATE};
    qwenrt_status st = tool_open(&op, &l->tm, err);
    if (st)
        return st;
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = p->n_prompt + p->n_gen + 1;
    sp.n_threads = p->n_threads;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    qwenrt_sampler_free(l->greedy);
    l->greedy = NULL;
    if ((st = qwenrt_sampler_init(&gp, l->tm.model->hp.n_vocab, &l->greedy, err)))
        return st;
    return qwenrt_session_init(l->tm.model, &sp, &l->s, err);
}

/* ------------------------------------------------------------------ external command lanes */

/* Runs the command, times it, and reads llama-bench JSON (-o json) from its output. */
static qwenrt_status run_cmd(struct lane *l, int trial, struct qwenrt_error *err)
{
    double t0 = time_now_s();
    FILE *f = popen(l->cmd, "r");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "cannot run '%s'", l->cmd);
    size_t cap = 1 << 16, n = 0;
    char *out = xmalloc(cap, 1);
    size_t got;
    while (out && (got = fread(out + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *o = xrealloc(out, cap * 2, 1);
            if (!o)
                break;
            out = o;
            cap *= 2;
        }
    }
    int rc = pclose(f);
    double wall = time_now_s() - t0;
    if (!out)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    out[n] = 0;
    if (trial < 0) { /* a warm-up */
        xfree(out);
        return rc == 0 ? QWENRT_OK
                       : err_set(err, QWENRT_ERR_BACKEND, "'%s' exited with status %d", l->cmd, rc);
    }
    l->total[trial] = wall;
    l->pp[trial] = l->tg[trial] = NAN;
    json_t *j = json_loads(strchr(out, '[') ? strchr(out, '[') : out, JSON_DISABLE_EOF_CHECK, NULL);
    size_t i;
    json_t *e;
    json_array_foreach (j, i, e) {
        json_int_t np = json_integer_value(json_object_get(e, "n_prompt"));
        json_int_t ng = json_integer_value(json_object_get(e, "n_gen"));
        double ts = json_number_value(json_object_get(e, "avg_ts"));
        if (np > 0 && ng == 0)
            l->pp[trial] = ts;
        if (ng > 0 && np == 0)
            l->tg[trial] = ts;
    }
    json_decref(j);
    xfree(out);
    if (rc != 0)
        return err_set(err, QWENRT_ERR_BACKEND, "'%s' exited with status %d", l->cmd, rc);
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ the run */

static qwenrt_status time_lane(struct bench *b, struct lane *l, int trial, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    if (l->kind == LANE_CMD)
        return run_cmd(l, trial, err);
    double ttft, dec;
    int32_t nsteps = p->n_gen - 1;
    qwenrt_status st = generate(b, l, b->scratch_tokens, &ttft, &dec,
                                trial >= 0 ? l->step_ms + (size_t)trial * nsteps : NULL, err);
    if (st)
        return st;
    if (memcmp(b->scratch_tokens, l->tokens, (size_t)p->n_gen * sizeof(int32_t))) {
        l->tokens_ok = false;
        snprintf(b->status, sizeof(b->status), "timing_validation_failed");
        snprintf(b->reason, sizeof(b->reason),
                 "lane '%s' %s %d produced other tokens than validated", l->name,
                 trial >= 0 ? "trial" : "warm-up", trial >= 0 ? trial : -trial - 1);
        return QWENRT_OK;
    }
    if (trial >= 0) {
        l->ttft[trial] = ttft;
        l->pp[trial] = p->n_prompt / ttft;
        l->tg[trial] = nsteps > 0 ? nsteps / dec : NAN;
        l->total[trial] = ttft + dec;
        l->n_steps += nsteps;
    }
    return QWENRT_OK;
}

static qwenrt_status setup_lanes(struct bench *b, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    struct lane *c = &b->lanes[b->n_lanes++];
    c->kind = LANE_QWENRT;
    c->profile = p->profile;
    c->backend = p->backend;
    snprintf(c->name, sizeof(c->name), "qwenrt %s profile %s", p->backend ? p->backend : "cpu",
             p->profile ? p->profile : "default");
    for (int i = 0; i < p->n_compare; i++) {
        struct lane *l = &b->lanes[b->n_lanes++];
        const char *s = p->compare[i];
        l->kind = LANE_QWENRT;
        l->profile = p->profile;
        l->backend = p->backend;
        if (!strncmp(s, "profile:", 8))
            l->profile = s + 8;
        else if (!strncmp(s, "backend:", 8))
            l->backend = s + 8;
        else if (!strncmp(s, "cmd:", 4)) {
            l->kind = LANE_CMD;
            l->cmd = s + 4;
        } else
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "--compare '%s': expected profile:ID, backend:NAME or cmd:COMMAND", s);
        if (l->kind == LANE_CMD)
            snprintf(l->name, sizeof(l->name), "command: %s", l->cmd);
        else
            snprintf(l->name, sizeof(l->name), "qwenrt %s profile %s",
                     l->backend ? l->backend : "cpu", l->profile ? l->profile : "default");
    }
    int T = p->trials;
    for (int i = 0; i < b->n_lanes; i++) {
        struct lane *l = &b->lanes[i];
        l->tokens_ok = true;
        l->tokens = xcalloc((size_t)p->n_gen, sizeof(int32_t));
        l->ttft = xcalloc((size_t)T, sizeof(double));
        l->pp = xcalloc((size_t)T, sizeof(double));
        l->tg = xcalloc((size_t)T, sizeof(double));
        l->total = xcalloc((size_t)T, sizeof(double));
        l->step_ms = xcalloc((size_t)T * (size_t)(p->n_gen > 1 ? p->n_gen - 1 : 1), sizeof(double));
        if (!l->tokens || !l->ttft || !l->pp || !l->tg || !l->total || !l->step_ms)
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory");
        for (int t = 0; t < T; t++)
            l->ttft[t] = NAN;
    }
    return QWENRT_OK;
}

/* Gate, open, warm up and time every lane; b->status says how far it got. */
static qwenrt_status run_lanes(struct bench *b, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    qwenrt_status st = QWENRT_OK;
    /* external commands first run once, untimed, so a broken command fails before the gate */
    for (int i = 0; i < b->n_lanes && !st; i++)
        if (b->lanes[i].kind == LANE_CMD)
            st = run_cmd(&b->lanes[i], -1, err);
    for (int i = 0; i < b->n_lanes && !st; i++) {
        struct lane *l = &b->lanes[i];
        if (l->kind == LANE_CMD) {
            l->validation = json_pack("{s:s, s:s}", "status", "not_validated", "source",
                                      "external command: its tokens cannot be checked");
            continue;
        }
        if ((st = open_lane(b, l, err)))
            break;
        bool passed;
        if (!(st = gate_lane(b, l, &passed, err)) && !passed) {
            snprintf(b->status, sizeof(b->status), "validation_failed");
            return QWENRT_OK;
        }
        if (!st && p->lane_hook)
            p->lane_hook(l->s, p->hook_user);
    }
    if (st)
        return st;
    FILE *f = fopen("/proc/self/clear_refs", "w"); /* reset the peak-RSS counter */
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    for (int w = 0; w < p->warmup; w++)
        for (int i = 0; i < b->n_lanes && !st && !strcmp(b->status, "timed"); i++)
            st = time_lane(b, &b->lanes[i], -w - 1, err);
    for (int t = 0; t < p->trials && !st && !strcmp(b->status, "timed"); t++)
        for (int k = 0; k < b->n_lanes && !st && !strcmp(b->status, "timed"); k++)
            st = time_lane(b, &b->lanes[t % 2 ? b->n_lanes - 1 - k : k], t, err);
    return st;
}

static int64_t peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6))
            sscanf(line + 6, "%lld", &kb);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static json_t *lane_json(struct bench *b, struct lane *l, struct lane *cand, bool timed)
{
    const struct bench_params *p = b->p;
    int T = p->trials;
    json_t *j = json_pack("{s:s, s:s, s:O}", "name", l->name, "kind",
                          l->kind == LANE_CMD ? "command" : "qwenrt", "validation",
                          l->validation ? l->validation : json_null());
    if (l->kind == LANE_QWENRT && l->tm.profile)
        json_object_set_new(
            j, "profile",
            json_pack("{s:s, s:s}", "id", l->tm.profile->id, "sha256", l->tm.profile->sha256));
    json_object_set_new(j, "backend", json_string(l->backend ? l->backend : "cpu"));
    if (l->kind == LANE_QWENRT) {
        if (l->s) /* the KV cache as the session resolved it (CUDA's default is f16) */
            json_object_set_new(j, "kv_cache", json_string(qwenrt_session_kv_type(l->s) == QWENRT_KV_F16 ? "f16" : "f32"));
        json_object_set_new(j, "tokens_match_validation", json_boolean(l->tokens_ok));
        json_object_set_new(j, "validated_token_ids", tokens_json(l->tokens, p->n_gen));
    }
    if (!timed)
        return j;
    json_object_set_new(j, "samples",
                        json_pack("{s:o, s:o, s:o, s:o}", "ttft_s", jarray(l->ttft, T),
                                  "prefill_tokens_per_s", jarray(l->pp, T), "decode_tokens_per_s",
                                  jarray(l->tg, T), "total_s", jarray(l->total, T)));
    json_object_set_new(j, "median",
                        json_pack("{s:o, s:o, s:o, s:o}", "ttft_s", jnum(median(l->ttft, T)),
                                  "prefill_tokens_per_s", jnum(median(l->pp, T)),
                                  "decode_tokens_per_s", jnum(median(l->tg, T)), "total_s",
                                  jnum(median(l->total, T))));
    if (l->kind == LANE_QWENRT)
        json_object_set_new(
            j, "per_token_ms",
            json_pack("{s:o, s:o, s:o, s:i}", "p50", jnum(percentile(l->step_ms, l->n_steps, 50)),
                      "p95", jnum(percentile(l->step_ms, l->n_steps, 95)), "p99",
                      jnum(percentile(l->step_ms, l->n_steps, 99)), "count", l->n_steps));
    if (l != cand) {
        double rp[64], rt[64];
        int n = T < 64 ? T : 64;
        for (int t = 0; t < n; t++) {
            rp[t] = cand->pp[t] / l->pp[t];
            rt[t] = cand->tg[t] / l->tg[t];
        }
        json_object_set_new(
            j, "ratio_candidate_over_this",
            json_pack(
                "{s:s, s:o, s:o, s:o, s:o}", "definition",
                "per trial: candidate tokens/s divided by this lane's tokens/s, then the median (> 1: candidate faster)",
                "prefill_per_trial", jarray(rp, n), "decode_per_trial", jarray(rt, n),
                "prefill_median", jnum(median(rp, n)), "decode_median", jnum(median(rt, n))));
    }
    return j;
}

static json_t *timing_definitions(void)
{
    return json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:[s,s,s,s], s:[s,s,s,s,s], s:s, s:s, s:s}", "metric",
        "token-id-to-token-id generation wall seconds (CLOCK_MONOTONIC), one sequence", "ttft",
        "session reset through the first returned token id: prefill of the whole prompt (last-position logits) and the host argmax",
        "prefill_tokens_per_s", "prompt tokens / TTFT", "decode",
        "first returned token id through the last one: output_count - 1 decode forwards, each with its logits and argmax",
        "decode_tokens_per_s", "(output_count - 1) / decode seconds", "total",
        "TTFT + decode (the same clock reads, so the sum holds exactly)", "per_token_ms",
        "latency of each decode step of every timed trial, pooled; nearest-rank p50/p95/p99",
        "included",
        "session reset (position and DeltaNet state zeroed; the KV cache is overwritten, not cleared)",
        "all prefill and decode model work, KV and state updates",
        "full-vocabulary logits for each returned token", "host greedy argmax per token",
        "excluded",
        "model loading and mapping, kernel binding, session and buffer allocation (done before timing)",
        "validation against the reference (before timing) and token comparisons (after each generation)",
        "tokenization and text decoding (token ids in, token ids out)", "warm-up generations",
        "external command lanes: their own definitions (llama-bench: pp = prompt processing, tg = generation, separate runs)",
        "aggregation",
        "medians over trials; comparison ratios are medians of per-trial candidate/comparison ratios",
        "order",
        "trials alternate the lane order: even trials candidate first, odd trials candidate last",
        "peak_memory",
        "host: VmHWM (peak resident set) of this process after the counter is reset at the end of validation; device: bytes the candidate's CUDA session holds (weights, KV, state, scratch), null on the CPU backend");
}

static json_t *build_record(struct bench *b, struct qwenrt_error *err)
{
    const struct bench_params *p = b->p;
    struct lane *c = &b->lanes[0];
    bool timed = !strcmp(b->status, "timed");
    json_t *rec = json_object();
    char now[40];
    records_now(now);
    json_object_set_new(rec, "schema_version", json_integer(RECORDS_SCHEMA_VERSION));
    json_object_set_new(rec, "kind", json_string("bench"));
    json_object_set_new(rec, "status", json_string(b->status));
    json_object_set_new(rec, "created_at", json_string(now));
    if (b->reason[0])
        json_object_set_new(rec, "status_reason", json_string(b->reason));
    if (c->tm.model && records_add_model(rec, c->tm.model, p->n_prompt + p->n_gen + 1,
                                         c->s ? c->s->n_threads : 0, err))
        json_object_set_new(rec, "checkpoint_error", json_string(err->message));
    records_add_environment(rec);
    if (c->s && c->s->cuda)
        records_add_gpu(rec);
    if (c->tm.model)
        json_object_set_new(rec, "kernels", c->s && c->s->cuda ? records_backend_kernels("cuda")
                                                               : records_kernels(&c->tm.binding));
    json_object_set_new(rec, "profile", records_profile(c->tm.profile));
    json_object_set_new(rec, "backend", json_string(p->backend ? p->backend : "cpu"));
    json_object_set_new(rec, "workload",
                        json_pack("{s:i, s:i, s:o, s:i, s:I, s:i, s:i, s:s, s:s}", "batch", 1,
                                  "prompt_tokens", p->n_prompt, "prompt_token_ids",
                                  tokens_json(b->prompt, p->n_prompt), "output_tokens", p->n_gen,
                                  "seed", (json_int_t)p->seed, "warmup_generations_per_lane",
                                  p->warmup, "trials", p->trials, "prompt_kind",
                                  "fixed synthetic token ids (xorshift64*, seed)", "sampling",
                                  "greedy argmax; EOS ignored; exact requested output count"));
    json_object_set_new(rec, "timing", timing_definitions());
    json_t *lanes = json_array();
    for (int i = 0; i < b->n_lanes; i++)
        json_array_append_new(lanes, lane_json(b, &b->lanes[i], c, timed));
    json_object_set_new(rec, "lanes", lanes);
    json_object_set_new(rec, "validation",
                        json_incref(c->validation ? c->validation : json_null()));
    int T = p->trials;
    json_object_set_new(rec, "prefill_tokens_per_s", timed ? jnum(median(c->pp, T)) : json_null());
    json_object_set_new(rec, "decode_tokens_per_s", timed ? jnum(median(c->tg, T)) : json_null());
    json_object_set_new(rec, "ttft_s", timed ? jnum(median(c->ttft, T)) : json_null());
    json_object_set_new(rec, "total_s", timed ? jnum(median(c->total, T)) : json_null());
    json_object_set_new(rec, "per_token_ms",
                        timed ? json_pack("{s:o, s:o, s:o}", "p50",
                                          jnum(percentile(c->step_ms, c->n_steps, 50)), "p95",
                                          jnum(percentile(c->step_ms, c->n_steps, 95)), "p99",
                                          jnum(percentile(c->step_ms, c->n_steps, 99)))
                              : json_null());
    int64_t rss = peak_rss_bytes();
    json_object_set_new(rec, "peak_memory",
                        json_pack("{s:o, s:o}", "host_bytes",
                                  timed && rss > 0 ? json_integer(rss) : json_null(),
                                  "device_bytes",
                                  timed && c->s && c->s->cuda
                                      ? json_integer(cuda_session_device_bytes(c->s->cuda))
                                      : json_null()));
    return rec;
}

qwenrt_status bench_run(const struct bench_params *p, json_t **record, struct qwenrt_error *err)
{
    *record = NULL;
    if (p->n_prompt < 1 || p->n_gen < 2 || p->trials < 1 || p->warmup < 0 ||
        p->n_compare >= BENCH_MAX_LANES)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "bench: needs -p >= 1, -n >= 2, trials >= 1, at most %d comparisons",
                       BENCH_MAX_LANES - 1);
    struct bench b = {.p = p};
    snprintf(b.status, sizeof(b.status), "timed");
    qwenrt_status st = setup_lanes(&b, err);
    b.prompt = xmalloc((size_t)p->n_prompt, sizeof(int32_t));
    b.scratch_tokens = xmalloc((size_t)p->n_gen, sizeof(int32_t));
    if (!st && (!b.prompt || !b.scratch_tokens))
        st = err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    if (!st && b.lanes[0].kind == LANE_QWENRT) {
        /* the prompt needs the vocabulary size: open the candidate first */
        st = open_lane(&b, &b.lanes[0], err);
        if (!st)
            validate_synthetic_prompt(p->seed, b.lanes[0].tm.model->hp.n_vocab, b.prompt,
                                      p->n_prompt);
        qwenrt_session_free(b.lanes[0].s);
        b.lanes[0].s = NULL;
        tool_close(&b.lanes[0].tm);
    }
    if (!st)
        st = run_lanes(&b, err);
    if (!st)
        *record = build_record(&b, err);
    for (int i = 0; i < b.n_lanes; i++) {
        struct lane *l = &b.lanes[i];
        qwenrt_session_free(l->s);
        qwenrt_sampler_free(l->greedy);
        tool_close(&l->tm);
        json_decref(l->validation);
        xfree(l->tokens);
        xfree(l->ttft);
        xfree(l->pp);
        xfree(l->tg);
        xfree(l->total);
        xfree(l->step_ms);
    }
    xfree(b.prompt);
    xfree(b.scratch_tokens);
    return st;
}

/* ------------------------------------------------------------------ plot */

qwenrt_status bench_plot_svg(const json_t *rec, const char *path, struct qwenrt_error *err)
{
    json_t *lanes = json_object_get(rec, "lanes");
    size_t n = json_array_size(lanes);
    double vmax[2] = {1e-9, 1e-9};
    static const char *const metric[2] = {"prefill_tokens_per_s", "decode_tokens_per_s"};
    size_t i;
    json_t *l;
    json_array_foreach (lanes, i, l)
        for (int m = 0; m < 2; m++)
            vmax[m] =
                fmax(vmax[m],
                     json_number_value(json_object_get(json_object_get(l, "median"), metric[m])));
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot write the plot", path);
    int W = 720, row = 26, H = 70 + (int)n * 2 * row + 40;
    fprintf(
        f,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H);
    fprintf(
        f,
        "<text x=\"10\" y=\"20\" font-size=\"14\">qwenrt bench: median tokens/s (%s, p%lld n%lld)</text>\n",
        json_string_value(json_object_get(json_object_get(rec, "model"), "name")),
        (long long)json_integer_value(
            json_object_get(json_object_get(rec, "workload"), "prompt_tokens")),
        (long long)json_integer_value(
            json_object_get(json_object_get(rec, "workload"), "output_tokens")));
    int y = 45;
    for (int m = 0; m < 2; m++) {
        fprintf(f, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">%s</text>\n", y,
                m ? "decode" : "prefill");
        y += 8;
        json_array_foreach (lanes, i, l) {
            double v = json_number_value(json_object_get(json_object_get(l, "median"), metric[m]));
            int w = (int)(400.0 * v / vmax[m]);
            char name[64];
            snprintf(name, sizeof(name), "%.60s", json_string_value(json_object_get(l, "name")));
            for (char *c = name; *c; c++)
                if (*c == '<' || *c == '>' || *c == '&' || *c == '"')
                    *c = '_';
            fprintf(f, "<text x=\"10\" y=\"%d\">%s</text>\n", y + 14, name);
            fprintf(f, "<rect x=\"250\" y=\"%d\" width=\"%d\" height=\"18\" fill=\"%s\"/>\n", y,
                    w > 0 ? w : 0, i ? "#999" : "#3366cc");
            fprintf(f, "<text x=\"%d\" y=\"%d\">%.1f</text>\n", 255 + (w > 0 ? w : 0), y + 14, v);
            y += row;
        }
        y += 10;
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot write the plot", path);
    return QWENRT_OK;
}
