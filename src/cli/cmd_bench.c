/*
 * cmd_bench.c — `qwenrt bench`: prefill and decode speed of a validated path (see
 * src/tools/bench.h for the timing definitions and the gate).
 *
 *   qwenrt bench -m MODEL [-p 128] [-n 64] [--threads N] [--backend cpu] [--profile P]
 *                [--warmup 2] [--trials 5] [--seed S] [--validation RECORD]
 *                [--compare profile:ID|backend:NAME|cmd:COMMAND]... [--json] [--out FILE]
 *                [--plot out.svg]
 * Prints a table (to stderr with --json, where stdout gets the one JSON record). Exit 0 when
 * timed, 1 when the gate refused the path (validation_failed, timing_validation_failed) or on
 * errors, 2 for usage errors.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/bench.h"
#include "tools/records.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: qwenrt bench -m MODEL [-p PROMPT_TOKENS (128)] [-n OUTPUT_TOKENS (64)] [--threads N]\n"
        "         [--backend cpu] [--profile ID|FILE] [--warmup 2] [--trials 5] [--seed S]\n"
        "         [--validation VALIDATE_RECORD] [--compare profile:ID|backend:NAME|cmd:COMMAND]...\n"
        "         [--json] [--out FILE] [--plot out.svg] [--profiles-dir D]\n");
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void table(FILE *f, json_t *rec)
{
    fprintf(f, "status %s%s%s\n", json_string_value(json_object_get(rec, "status")),
            json_object_get(rec, "status_reason") ? ": " : "",
            json_object_get(rec, "status_reason")
                ? json_string_value(json_object_get(rec, "status_reason"))
                : "");
    json_t *w = json_object_get(rec, "workload");
    fprintf(
        f,
        "workload: prompt %lld tokens, output %lld tokens, %lld warm-ups, %lld trials (medians)\n",
        (long long)json_integer_value(json_object_get(w, "prompt_tokens")),
        (long long)json_integer_value(json_object_get(w, "output_tokens")),
        (long long)json_integer_value(json_object_get(w, "warmup_generations_per_lane")),
        (long long)json_integer_value(json_object_get(w, "trials")));
    fprintf(f, "%-40s %9s %9s %12s %11s %22s %14s\n", "lane", "total ms", "TTFT ms", "prefill t/s",
            "decode t/s", "per-token p50/95/99 ms", "ratio pp / tg");
    size_t i;
    json_t *l;
    json_array_foreach (json_object_get(rec, "lanes"), i, l) {
        json_t *m = json_object_get(l, "median"), *pt = json_object_get(l, "per_token_ms");
        json_t *r = json_object_get(l, "ratio_candidate_over_this");
        fprintf(f, "%-40.40s %9.2f %9.2f %12.1f %11.1f %8.2f/%6.2f/%6.2f",
                json_string_value(json_object_get(l, "name")), num(m, "total_s") * 1e3,
                num(m, "ttft_s") * 1e3, num(m, "prefill_tokens_per_s"),
                num(m, "decode_tokens_per_s"), num(pt, "p50"), num(pt, "p95"), num(pt, "p99"));
        if (r)
            fprintf(f, " %6.2fx/%5.2fx", num(r, "prefill_median"), num(r, "decode_median"));
        fprintf(f, "\n");
    }
    json_t *pm = json_object_get(rec, "peak_memory");
    if (json_is_integer(json_object_get(pm, "host_bytes")))
        fprintf(f, "peak host memory %.1f MiB\n",
                (double)json_integer_value(json_object_get(pm, "host_bytes")) / 1048576.0);
}

int cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"threads", required_argument, 0, 't'},
        {"backend", required_argument, 0, 'b'},
        {"profile", required_argument, 0, 'P'},
        {"warmup", required_argument, 0, 'w'},
        {"trials", required_argument, 0, 'r'},
        {"seed", required_argument, 0, 's'},
        {"validation", required_argument, 0, 'V'},
        {"compare", required_argument, 0, 'c'},
        {"json", no_argument, 0, 'j'},
        {"out", required_argument, 0, 'o'},
        {"plot", required_argument, 0, 'g'},
        {"profiles-dir", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    struct bench_params p = {.n_prompt = 128, .n_gen = 64, .warmup = 2, .trials = 5};
    const char *out = NULL, *plot = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    const struct cli_run_opts ro = {.model = &p.model_path, .backend = &p.backend,
                                    .profile = &p.profile, .profiles_dir = &p.profiles_dir,
                                    .n_prompt = &p.n_prompt, .n_gen = &p.n_gen,
                                    .n_threads = &p.n_threads, .warmup = &p.warmup,
                                    .trials = &p.trials, .seed = &p.seed};
    while ((c = getopt_long(argc, argv, "m:p:n:t:o:h", opts, NULL)) != -1) {
        int shared = cli_run_opt(&ro, c, optarg);
        if (shared < 0)
            return 2;
        if (shared)
            continue;
        switch (c) {
        case 'V':
            p.validation_record = optarg;
            break;
        case 'c':
            if (p.n_compare == BENCH_MAX_LANES - 1) {
                fprintf(stderr, "qwenrt bench: at most %d --compare lanes\n", BENCH_MAX_LANES - 1);
                return 2;
            }
            p.compare[p.n_compare++] = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'o':
            out = optarg;
            break;
        case 'g':
            plot = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!p.model_path || optind != argc) {
        usage(stderr);
        return 2;
    }
    json_t *rec = NULL;
    struct qwenrt_error err = {0};
    if (bench_run(&p, &rec, &err)) {
        fprintf(stderr, "qwenrt bench: %s\n", err.message);
        return 1;
    }
    table(as_json ? stderr : stdout, rec);
    if (as_json) {
        json_dumpf(rec, stdout, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
        printf("\n");
    }
    bool timed = !strcmp(json_string_value(json_object_get(rec, "status")), "timed");
    int rc = timed ? 0 : 1;
    if (out && records_write(rec, out, &err)) {
        fprintf(stderr, "qwenrt bench: %s\n", err.message);
        rc = 1;
    }
    if (plot && timed && bench_plot_svg(rec, plot, &err)) {
        fprintf(stderr, "qwenrt bench: %s\n", err.message);
        rc = 1;
    }
    json_decref(rec);
    return rc;
}
