/*
 * calibrate.c — automatic calibration (see calibrate.h).
 *
 * Candidates come from the kernel registries: for op kinds with several kernels that can run
 * here, one profile per non-default kernel; for matmul, one per non-default variant of each
 * weight dtype the model uses (capability-aware remap keeps the other dtypes on their default).
 * At most BENCH_MAX_LANES - 1 candidates are timed with the default in one bench (interleaved
 * trials, so they share the machine's drift). A candidate wins its op kind when its median
 * total time is below the baseline's and it is the fastest of its kind.
 */
#include "tools/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "tools/bench.h"
#include "tools/records.h"
#include "tools/tool_setup.h"
#include "tools/validate.h"

struct candidate {
    char op[32];
    char key[64];
    char path[512];
};

static json_t *profile_doc(const char *id, const char *desc, json_t *sets, const char *stability)
{
    char now[40];
    records_now(now);
    now[19] = 0;
    strcat(now, "Z");
    return json_pack(
        "{s:s, s:s, s:s, s:s, s:[s,s,s], s:s, s:s, s:s, s:s, s:{s:{s:{s:O}, s:{s:s, s:s}}}}", "id",
        id, "name", id, "description", desc, "intent", "calibrate", "compatibleIntents",
        "calibrate", "verify", "investigate", "stability", stability, "owner", "qwenrt calibrate",
        "createdAtUtc", now, "extends", "profiles/default", "runtime", "inference",
        "executionPatch", "set", sets, "kernelPathPolicy", "mode", "capability-aware",
        "onIncompatible", "remap");
}

/* Whether either phase of the model's plan has an op of kind k (a profile that patches a kind
 * the plan lacks is refused when it is bound: Qwen3 has no DeltaNet ops). */
static bool model_has_kind(const struct qwenrt_model *m, enum op_kind k)
{
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < m->plans[ph].n_ops; i++)
            if (m->plans[ph].ops[i].kind == k)
                return true;
    return false;
}

/* The candidates for this model and CPU. */
static int list_candidates(const struct qwenrt_model *m, const char *dir, struct candidate *c,
                           int max)
{
    uint32_t feat = cpu_features_detect();
    int n = 0;
    for (int k = 0; k < OP_KIND_COUNT && n < max; k++) {
        const struct cpu_op_kernel *best = cpu_op_pick((enum op_kind)k, feat, NULL);
        for (const struct cpu_op_kernel *e = cpu_op_kernels(); e->key && n < max; e++)
            if ((int)e->kind == k && e != best && (e->cpu_features & feat) == e->cpu_features &&
                k != OP_MATMUL && model_has_kind(m, (enum op_kind)k)) {
                snprintf(c[n].op, sizeof(c[n].op), "%s", op_kind_name(e->kind));
                snprintf(c[n].key, sizeof(c[n].key), "%s", e->key);
                n++;
            }
    }
    bool seen[256] = {false};
    for (int ph = 0; ph < 1; ph++)
        for (int32_t i = 0; i < m->plans[ph].n_ops; i++) {
            const struct plan_op *op = &m->plans[ph].ops[i];
            if (op->kind != OP_MATMUL || seen[op->w->dtype & 255])
                continue;
            seen[op->w->dtype & 255] = true;
            const struct cpu_matmul_variant *best = cpu_matmul_pick(op->w->dtype, feat, NULL);
            for (const struct cpu_matmul_variant *v = cpu_matmul_variants(); v->key && n < max; v++)
                if (v->wtype == op->w->dtype && v != best &&
                    (v->cpu_features & feat) == v->cpu_features && !strstr(v->key, ".ref")) {
                    snprintf(c[n].op, sizeof(c[n].op), "matmul");
                    snprintf(c[n].key, sizeof(c[n].key), "%s", v->key);
                    n++;
                }
        }
    for (int i = 0; i < n; i++)
        snprintf(c[i].path, sizeof(c[i].path), "%s/calibrate-candidate-%d.json", dir, i);
    return n;
}

static qwenrt_status write_json(json_t *doc, const char *path, struct qwenrt_error *err)
{
    return records_write(doc, path, err);
}

qwenrt_status calibrate_run(const struct calibrate_params *p, json_t **evidence,
                            struct qwenrt_error *err)
{
    *evidence = NULL;
    if (p->backend && !strcmp(p->backend, "cuda"))
        return calibrate_cuda_run(p, evidence, err);
    if (!p->work_dir)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "calibrate: no directory for the candidate profiles");
    struct tool_model tm;
    struct tool_open_params op = {.model_path = p->model_path,
                                  .backend = p->backend,
                                  .n_threads = p->n_threads,
                                  .profiles_dir = p->profiles_dir,
                                  .command = "calibrate",
                                  .intent = PROFILE_INTENT_CALIBRATE};
    qwenrt_status st = tool_open(&op, &tm, err);
    if (st)
        return st;
    struct candidate cand[BENCH_MAX_LANES - 1];
    int n = list_candidates(tm.model, p->work_dir, cand, BENCH_MAX_LANES - 1);
    tool_close(&tm);
    struct bench_params bp = {.model_path = p->model_path,
                              .backend = p->backend,
                              .n_threads = p->n_threads,
                              .profiles_dir = p->profiles_dir,
                              .n_prompt = p->n_prompt,
                              .n_gen = p->n_gen,
                              .warmup = p->warmup,
                              .trials = p->trials};
    char specs[BENCH_MAX_LANES - 1][600];
    for (int i = 0; i < n && !st; i++) {
        char id[128], desc[256];
        snprintf(id, sizeof(id), "calibrate-candidate-%d", i);
        snprintf(desc, sizeof(desc), "calibration candidate: op %.31s on %.63s", cand[i].op,
                 cand[i].key);
        json_t *set = json_pack("[{s:s, s:s}]", "op", cand[i].op, "kernelKey", cand[i].key);
        json_t *doc = profile_doc(id, desc, set, "experimental");
        json_decref(set);
        st = write_json(doc, cand[i].path, err);
        json_decref(doc);
        snprintf(specs[i], sizeof(specs[i]), "profile:%s", cand[i].path);
        bp.compare[bp.n_compare++] = specs[i];
    }
    json_t *rec = NULL;
    if (!st)
        st = bench_run(&bp, &rec, err);
    if (st) {
        for (int i = 0; i < n; i++)
            remove(cand[i].path);
        return st;
    }
    /* winners: per op kind, the fastest candidate that beat the baseline */
    json_t *lanes = json_object_get(rec, "lanes"), *sets = json_array(), *choices = json_array();
    double base = json_number_value(
        json_object_get(json_object_get(json_array_get(lanes, 0), "median"), "total_s"));
    bool timed = !strcmp(json_string_value(json_object_get(rec, "status")), "timed");
    for (int i = 0; i < n && timed; i++) {
        double t = json_number_value(json_object_get(
            json_object_get(json_array_get(lanes, (size_t)i + 1), "median"), "total_s"));
        bool best = t < base;
        for (int j = 0; j < n && best; j++) {
            double u = json_number_value(json_object_get(
                json_object_get(json_array_get(lanes, (size_t)j + 1), "median"), "total_s"));
            if (j != i && !strcmp(cand[j].op, cand[i].op) && strcmp(cand[j].key, cand[i].key) &&
                u < t)
                best = false;
        }
        json_array_append_new(choices, json_pack("{s:s, s:s, s:f, s:f, s:b}", "op", cand[i].op,
                                                 "key", cand[i].key, "median_total_s", t,
                                                 "baseline_total_s", base, "chosen", best));
        if (best)
            json_array_append_new(
                sets, json_pack("{s:s, s:s}", "op", cand[i].op, "kernelKey", cand[i].key));
    }
    char desc[512];
    snprintf(
        desc, sizeof(desc),
        "written by qwenrt calibrate for %.200s on this CPU: per op kind, the fastest kernel variant that passed validation and beat the default (prompt %d, output %d tokens, %d trials); evidence in the calibrate record",
        p->model_path, p->n_prompt, p->n_gen, p->trials);
    json_t *doc = profile_doc(p->profile_id, desc, sets, "experimental");
    json_decref(sets);
    json_t *ev =
        json_pack("{s:i, s:s, s:s, s:O, s:o, s:O, s:[s,s]}", "schema_version",
                  RECORDS_SCHEMA_VERSION, "kind", "calibration", "status",
                  timed ? "calibrated" : "failed", "profile", doc, "choices", choices, "bench", rec,
                  "not_tuned", "session fusion flags: the CPU backend has no fused kernels yet",
                  "decode cadence (batching, decodeLoop): the CPU backend decodes synchronously");
    if (timed) {
        st = write_json(doc, p->out_profile, err);
        /* the combined profile must pass the gate too */
        struct validate_params vp = {.model_path = p->model_path,
                                     .backend = p->backend,
                                     .n_threads = p->n_threads,
                                     .profile = p->out_profile,
                                     .profiles_dir = p->profiles_dir,
                                     .n_prompt = p->n_prompt,
                                     .n_gen = p->n_gen};
        struct validate_result r;
        if (!st && !(st = validate_run(&vp, &r, err))) {
            json_object_set_new(ev, "final_validation",
                                json_pack("{s:s, s:s}", "status",
                                          r.passed ? "validated" : "validation_failed", "failure",
                                          r.failure));
            if (!r.passed)
                json_object_set_new(ev, "status", json_string("failed"));
            validate_result_free(&r);
        }
    }
    json_decref(doc);
    json_decref(rec);
    for (int i = 0; i < n; i++)
        remove(cand[i].path);
    if (st) {
        json_decref(ev);
        return st;
    }
    *evidence = ev;
    return QWENRT_OK;
}
