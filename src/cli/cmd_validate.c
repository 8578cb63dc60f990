/*
 * cmd_validate.c — `qwenrt validate`: the correctness gate (seed 004) for a model, backend and
 * profile, against qwenrt's reference path or a reference.safetensors file.
 *
 *   qwenrt validate -m MODEL [--backend cpu] [--profile P] [--reference FILE]
 *                   [-p PROMPT_TOKENS] [-n OUTPUT_TOKENS] [--seed S] [--threads N]
 *                   [--keep-going] [--out FILE] [--json]
 * Prints a readable summary and writes the JSON record with --out (or prints it with --json).
 * --keep-going checks every position past the first failure (the first still decides the
 * status). Exit 0 validated, 1 validation_failed or error, 2 usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/records.h"
#include "tools/validate.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: qwenrt validate -m MODEL [--backend cpu] [--profile ID|FILE] [--reference FILE]\n"
        "         [-p PROMPT_TOKENS (8)] [-n OUTPUT_TOKENS (8)] [--seed S] [--threads N]\n"
        "         [--profiles-dir D] [--keep-going] [--out FILE] [--json]\n");
}

static void summary(const struct validate_result *r)
{
    json_t *rec = r->record, *res = json_object_get(rec, "result");
    json_t *tol = json_object_get(rec, "tolerances");
    printf("model      %s (%s)\n",
           json_string_value(json_object_get(json_object_get(rec, "model"), "path")),
           json_string_value(json_object_get(json_object_get(rec, "geometry"), "storage_dtype")));
    json_t *prof = json_object_get(rec, "profile");
    printf("profile    %s\n",
           json_is_object(prof) ? json_string_value(json_object_get(prof, "id")) : "-");
    printf("reference  %s\n",
           json_string_value(json_object_get(json_object_get(rec, "reference"), "kind")));
    printf("tolerance  %s\n", json_string_value(json_object_get(tol, "applied")));
    printf("positions  %lld checked (prompt %lld, output %lld)\n",
           (long long)json_integer_value(json_object_get(res, "positions_checked")),
           (long long)json_integer_value(
               json_object_get(json_object_get(rec, "workload"), "prompt_tokens")),
           (long long)json_integer_value(
               json_object_get(json_object_get(rec, "workload"), "output_tokens")));
    printf("max error  logits %.3g, KV cache %.3g, DeltaNet state %.3g\n",
           json_real_value(json_object_get(res, "max_logits_error")),
           json_real_value(json_object_get(res, "max_cache_error")),
           json_real_value(json_object_get(res, "max_state_error")));
    printf("greedy     %lld of %lld positions equal, %lld near ties; worst logits relative error %.3g\n",
           (long long)json_integer_value(json_object_get(res, "greedy_token_equal")),
           (long long)json_integer_value(json_object_get(res, "positions_checked")),
           (long long)json_integer_value(json_object_get(res, "near_ties")),
           json_real_value(json_object_get(res, "max_logits_relative_error")));
    if (r->passed)
        printf("status     validated\n");
    else
        printf("status     validation_failed: %s\n", r->failure);
}

int cmd_validate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"backend", required_argument, 0, 'b'},
        {"profile", required_argument, 0, 'P'},
        {"reference", required_argument, 0, 'r'},
        {"threads", required_argument, 0, 't'},
        {"seed", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'},
        {"json", no_argument, 0, 'j'},
        {"profiles-dir", required_argument, 0, 'd'},
        {"keep-going", no_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    struct validate_params p = {.n_prompt = 8, .n_gen = 8};
    const char *out = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    const struct cli_run_opts ro = {.model = &p.model_path, .backend = &p.backend,
                                    .profile = &p.profile, .profiles_dir = &p.profiles_dir,
                                    .n_prompt = &p.n_prompt, .n_gen = &p.n_gen,
                                    .n_threads = &p.n_threads, .seed = &p.seed};
    while ((c = getopt_long(argc, argv, "m:p:n:t:o:h", opts, NULL)) != -1) {
        if (c == 'r') { /* --reference here, not --trials */
            p.reference_file = optarg;
            continue;
        }
        int shared = cli_run_opt(&ro, c, optarg);
        if (shared < 0)
            return 2;
        if (shared)
            continue;
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'k':
            p.keep_going = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!p.model_path || optind != argc || p.n_prompt < 1 || p.n_gen < 1) {
        usage(stderr);
        return 2;
    }
    struct validate_result r;
    struct qwenrt_error err = {0};
    if (validate_run(&p, &r, &err)) {
        fprintf(stderr, "qwenrt validate: %s\n", err.message);
        return 1;
    }
    if (as_json) {
        json_dumpf(r.record, stdout, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
        printf("\n");
    } else {
        summary(&r);
    }
    int rc = r.passed ? 0 : 1;
    if (out && records_write(r.record, out, &err)) {
        fprintf(stderr, "qwenrt validate: %s\n", err.message);
        rc = 1;
    }
    validate_result_free(&r);
    return rc;
}
