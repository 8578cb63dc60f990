/*
 * cmd_compare.c — `qwenrt compare -m CANDIDATE --ref REFERENCE [-n 256] [--seed S]
 * [--ids 1,2,3] [--out record.json]`: quality of a converted or quantised model against its
 * source: mean/p99/max KL divergence of next-token distributions and top-1 agreement over n
 * positions. Without --ids the sequence is n pseudo-random ids from --seed (deterministic).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/compare.h"

static int usage(void)
{
    fprintf(stderr, "usage: qwenrt compare -m CANDIDATE --ref REFERENCE [-n 256] [--seed S] [--ids 1,2,3]\n"
                    "                      [--out record.json] [--threads N] [--backend cpu|cuda]\n"
                    "                      [--precision default|exact]\n");
    return 2;
}

static int32_t *random_ids(int32_t n, int32_t vocab, long seed)
{
    int32_t *ids = malloc((size_t)n * sizeof(*ids));
    uint64_t s = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    for (int32_t i = 0; ids && i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        ids[i] = (int32_t)(s % (uint64_t)vocab);
    }
    return ids;
}

static void write_record(const char *path, const struct cli_model_opts *c, const char *ref,
                         const struct compare_result *r)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:f}", "kind", "qwenrt.compare",
                          "candidate", c->model, "reference", ref, "backend",
                          c->backend ? c->backend : "cpu", "precision",
                          c->precision == QWENRT_PRECISION_EXACT ? "exact" : "default",
                          "positions", r->n_positions,
                          "kl_mean", r->kl_mean, "kl_p99", r->kl_p99, "kl_max", r->kl_max,
                          "top1_agreement", r->top1_agreement, "logits_rel_err", r->logits_rel_err);
    if (json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
        fprintf(stderr, "qwenrt: cannot write %s\n", path);
    json_decref(o);
}

int cmd_compare(int argc, char **argv)
{
    struct cli_model_opts o = {0}, ro = {0};
    const char *ids_s = NULL, *out = NULL, *v;
    long n = 256, seed = 1;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&o, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r)
            continue;
        const char *a = argv[i];
        if (!strcmp(a, "--ref") && (ro.model = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--ids") && (ids_s = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--out") && (out = cli_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "-n") && (v = cli_value(argc, argv, &i)) && cli_parse_int(a, v, 1, 1 << 16, &n))
            continue;
        if (!strcmp(a, "--seed") && (v = cli_value(argc, argv, &i)) && cli_parse_int(a, v, 0, 0x7fffffffL, &seed))
            continue;
        return usage();
    }
    if (!o.model || !ro.model)
        return usage();
    if (o.kv_type == QWENRT_KV_F16) { /* compare_models runs both sessions with the f32 cache */
        fprintf(stderr, "qwenrt: compare: --kv-type f16 is not taken here (both models run with an f32 cache)\n");
        return 2;
    }
    ro.threads = o.threads;
    int rc = 1;
    int32_t *ids = NULL, n_ids = 0;
    struct qwenrt_model *cand = cli_load_model(&o), *ref = cand ? cli_load_model(&ro) : NULL;
    struct qwenrt_error err = {0};
    struct compare_result res;
    if (!ref)
        goto out;
    struct qwenrt_model_info info;
    qwenrt_model_get_info(ref, &info);
    if (ids_s ? !cli_parse_ids(ids_s, &ids, &n_ids) : !(ids = random_ids((int32_t)n, info.n_vocab, seed)))
        goto out;
    if (!ids_s)
        n_ids = (int32_t)n;
    if (compare_models(cand, ref, ids, n_ids, o.threads, o.precision, &res, &err) != QWENRT_OK) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        goto out;
    }
    printf("positions        %d\nKL mean          %.6g nats\nKL p99           %.6g\nKL max           %.6g\n"
           "top-1 agreement  %.2f%%\nlogits rel err   %.4g\n",
           res.n_positions, res.kl_mean, res.kl_p99, res.kl_max, 100.0 * res.top1_agreement, res.logits_rel_err);
    if (out)
        write_record(out, &o, ro.model, &res);
    rc = 0;
out:
    free(ids);
    qwenrt_model_free(cand);
    qwenrt_model_free(ref);
    return rc;
}
