/*
 * cmd_calibrate.c — `qwenrt calibrate`: find the fastest valid kernel binding for a model on
 * this machine and write it as a new profile (see src/tools/calibrate.h).
 *
 *   qwenrt calibrate -m MODEL [--backend cpu|cuda] [--threads N] [-p 32] [-n 16] [--warmup 1]
 *                    [--trials 3] [-o PROFILE.json] [--id ID] [--out EVIDENCE.json] [--depth-max 4096]
 * With --backend cuda the defaults are -p 64 -n 256 --trials 5 (a GPU decodes 16 tokens in
 * ~10 ms: too short to time), the choices are the CUDA decode's shapes, and then the window of
 * positions where the attention merges in clusters, measured at depths 256 ... --depth-max
 * (0: not measured).
 * Exit 0 when a profile was written and passed validation, 1 otherwise, 2 for usage errors.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "tools/calibrate.h"
#include "tools/records.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: qwenrt calibrate -m MODEL [--backend cpu|cuda] [--threads N] [-p 32] [-n 16] [--warmup 1]\n"
        "         [--trials 3] [-o PROFILE.json (calibrated.json)] [--id ID] [--out EVIDENCE.json]\n"
        "         [--profiles-dir D] [--depth-max N]\n"
        "  cuda: the decode's GEMV shapes, PDL and attention splits; defaults -p 64 -n 256 --trials 5;\n"
        "        then the attention's cluster window, decoding at depths 256, 512, ... N (default 4096, 0: skip)\n");
}

/* The CUDA calibration's lanes: gate, logits error against the baseline, median rates. */
static void print_cuda_lanes(json_t *ev)
{
    const char *chosen = "the session's own picks";
    size_t i;
    json_t *l;
    json_array_foreach (json_object_get(ev, "choices"), i, l)
        if (json_is_true(json_object_get(l, "chosen")))
            chosen = json_string_value(json_object_get(l, "key"));
    printf("%-40s %-7s %10s %12s %12s\n", "lane", "gate", "logits err", "prompt t/s", "decode t/s");
    json_array_foreach (json_object_get(ev, "lanes"), i, l)
        printf("%-40s %-7s %10.2g %12.1f %12.1f\n", json_string_value(json_object_get(l, "label")),
               json_string_value(json_object_get(l, "gate")),
               json_real_value(json_object_get(l, "max_logits_rel_err_vs_baseline")),
               json_real_value(json_object_get(l, "median_prefill_tok_s")),
               json_real_value(json_object_get(l, "median_decode_tok_s")));
    printf("chosen: %s\n", chosen);
    json_t *win = json_object_get(ev, "attention_cluster");
    if (!win)
        return;
    printf("%-8s %14s %14s %8s %-7s\n", "depth", "never t/s", "always t/s", "gain", "gate");
    json_array_foreach (json_object_get(win, "depths"), i, l)
        printf("%-8d %14.1f %14.1f %7.1f%% %-7s\n", (int)json_integer_value(json_object_get(l, "depth")),
               json_real_value(json_object_get(l, "never_decode_tok_s")),
               json_real_value(json_object_get(l, "always_decode_tok_s")),
               100 * json_real_value(json_object_get(l, "gain")), json_string_value(json_object_get(l, "gate")));
    if (json_object_get(win, "from"))
        printf("attention cluster merge: positions %d to %d\n", (int)json_integer_value(json_object_get(win, "from")),
               (int)json_integer_value(json_object_get(win, "until")));
    else
        printf("attention cluster merge: never\n");
}

int cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"backend", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'}, {"warmup", required_argument, 0, 'w'},
        {"trials", required_argument, 0, 'r'},  {"id", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'O'},     {"profiles-dir", required_argument, 0, 'd'},
        {"depth-max", required_argument, 0, 'D'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    struct calibrate_params p = {.n_prompt = 0, /* 0: the backend's default, below */
                                 .n_gen = 0,
                                 .warmup = 1,
                                 .trials = 0,
                                 .out_profile = "calibrated.json",
                                 .profile_id = "profiles/calibrated"};
    const char *out = NULL;
    bool depth_given = false;
    int c;
    optind = 1;
    const struct cli_run_opts ro = {.model = &p.model_path, .backend = &p.backend,
                                    .profiles_dir = &p.profiles_dir, .n_prompt = &p.n_prompt,
                                    .n_gen = &p.n_gen, .n_threads = &p.n_threads,
                                    .warmup = &p.warmup, .trials = &p.trials};
    while ((c = getopt_long(argc, argv, "m:p:n:o:h", opts, NULL)) != -1) {
        int shared = cli_run_opt(&ro, c, optarg);
        if (shared < 0)
            return 2;
        if (shared)
            continue;
        switch (c) {
        case 'o':
            p.out_profile = optarg;
            break;
        case 'i':
            p.profile_id = optarg;
            break;
        case 'O':
            out = optarg;
            break;
        case 'D':
            if (!cli_parse_int_arg("--depth-max", optarg, 0, 1 << 22, &p.depth_max))
                return 2;
            depth_given = true;
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
    bool gpu = p.backend && !strcmp(p.backend, "cuda");
    p.n_prompt = p.n_prompt ? p.n_prompt : gpu ? 64 : 32;
    p.n_gen = p.n_gen ? p.n_gen : gpu ? 256 : 16;
    p.trials = p.trials ? p.trials : gpu ? 5 : 3;
    p.depth_max = depth_given ? p.depth_max : gpu ? 4096 : 0;
    /* the candidate profiles go to a directory of this run's own: two calibrations at once
     * (or a test beside a user's run) must not overwrite or remove each other's files */
    char work[] = "/tmp/qwenrt-calibrate-XXXXXX";
    if (!mkdtemp(work)) {
        fprintf(stderr, "qwenrt calibrate: cannot make a directory in /tmp: %s\n", strerror(errno));
        return 1;
    }
    p.work_dir = work;
    json_t *ev = NULL;
    struct qwenrt_error err = {0};
    qwenrt_status st = calibrate_run(&p, &ev, &err);
    rmdir(work);
    if (st) {
        fprintf(stderr, "qwenrt calibrate: %s\n", err.message);
        return 1;
    }
    size_t i;
    json_t *ch;
    if (json_object_get(ev, "lanes")) /* the CUDA calibration: one line per lane */
        print_cuda_lanes(ev);
    else
        printf("%-16s %-28s %14s %14s %s\n", "op", "kernel", "total ms", "default ms", "chosen");
    json_array_foreach (json_object_get(ev, "lanes") ? NULL : json_object_get(ev, "choices"), i, ch)
        printf("%-16s %-28s %14.3f %14.3f %s\n", json_string_value(json_object_get(ch, "op")),
               json_string_value(json_object_get(ch, "key")),
               json_real_value(json_object_get(ch, "median_total_s")) * 1e3,
               json_real_value(json_object_get(ch, "baseline_total_s")) * 1e3,
               json_is_true(json_object_get(ch, "chosen")) ? "yes" : "no");
    bool ok = !strcmp(json_string_value(json_object_get(ev, "status")), "calibrated");
    printf("status %s%s%s\n", json_string_value(json_object_get(ev, "status")),
           ok ? ": wrote " : "", ok ? p.out_profile : "");
    int rc = ok ? 0 : 1;
    if (out && records_write(ev, out, &err)) {
        fprintf(stderr, "qwenrt calibrate: %s\n", err.message);
        rc = 1;
    }
    json_decref(ev);
    return rc;
}
