/*
 * bench.h — timing a validated path (seeds 003/004): warm-ups, trials that alternate between
 * the candidate and its comparison lanes, medians and medians of per-trial ratios, TTFT,
 * prefill and decode tokens/s, per-token latency percentiles, peak memory, and the timing
 * definitions, as one JSON record.
 *
 * A qwenrt lane (the candidate, or a comparison profile/backend) is timed only after it passed
 * the gate (validate_run over the same workload, or a validate record given with
 * validation_record), and every warm-up and timed generation must reproduce the validated
 * token ids; otherwise the status is validation_failed or timing_validation_failed and no
 * timing is reported. An external command (e.g. llama.cpp's llama-bench) is timed as a whole
 * and its JSON output parsed when it is llama-bench's; its tokens cannot be checked, and the
 * record says so.
 */
#ifndef QWENRT_TOOLS_BENCH_H
#define QWENRT_TOOLS_BENCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "qwenrt.h"

#define BENCH_MAX_LANES 8

struct qwenrt_session;

struct bench_params {
    const char *model_path;
    const char *backend; /* NULL = cpu */
    int n_threads;
    const char *profile; /* candidate profile (NULL = default) */
    const char *profiles_dir;
    int32_t n_prompt, n_gen;       /* workload: prompt tokens, generated tokens */
    int warmup, trials;            /* per lane */
    uint64_t seed;                 /* synthetic prompt */
    const char *validation_record; /* reuse `qwenrt validate --out` instead of validating */
    /* comparison lanes: "profile:ID", "backend:NAME" or "cmd:COMMAND LINE" */
    const char *compare[BENCH_MAX_LANES - 1];
    int n_compare;
    /* Test hook: called with each qwenrt lane's timing session after its gate passed (tests
     * break a kernel there to see timing_validation_failed). */
    void (*lane_hook)(struct qwenrt_session *s, void *user);
    void *hook_user;
};

/* Runs the benchmark. Returns an error when it cannot run at all; a refused or failed timing
 * is QWENRT_OK with *record's status saying so. *record is a new reference. */
qwenrt_status bench_run(const struct bench_params *p, json_t **record, struct qwenrt_error *err);

/* An SVG bar chart of the lanes' median prefill and decode tokens/s from a bench record. */
qwenrt_status bench_plot_svg(const json_t *record, const char *path, struct qwenrt_error *err);

#endif
