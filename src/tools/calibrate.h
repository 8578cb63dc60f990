/*
 * calibrate.h — the calibrate intent made automatic (issue 7 §5): for a model on this machine,
 * try every kernel variant that can run for each op (one candidate profile per variant, the
 * default binding as the baseline), validate each (bench's gate), time the survivors in one
 * interleaved bench, keep per op kind the fastest variant that beat the baseline, validate the
 * combined profile, and write it as a new profile (stability experimental) plus an evidence
 * record (the bench record of all candidates, the choices, the final validation).
 * Fusion flags and decode cadence are listed in the evidence as not tunable here: the CPU
 * backend has no fused kernels yet and decodes synchronously. With backend "cuda" the
 * candidates are the CUDA decode's shapes instead (calibrate_cuda.c) and the profile gets a
 * runtime.inference.cudaTuning section.
 */
#ifndef QWENRT_TOOLS_CALIBRATE_H
#define QWENRT_TOOLS_CALIBRATE_H

#include <jansson.h>

#include "qwenrt.h"

struct calibrate_params {
    const char *model_path;
    const char *backend;
    int n_threads;
    const char *profiles_dir;
    int32_t n_prompt, n_gen;
    int32_t depth_max; /* CUDA: the attention's cluster window measured at depths 256, 512, ...
                        * up to this (calibrate_window.c); 0: not measured */
    int warmup, trials;
    const char *out_profile; /* where the new profile goes */
    const char *profile_id;  /* its id, e.g. "profiles/calibrated-qwen3-tiny" */
    const char *work_dir;    /* for the candidate profile files: a directory of this run's own
                              * (they are written, then removed; cmd_calibrate makes one) */
    /* Test hook (CUDA calibration): called with each lane's session after it is created, lane
     * 0 being the baseline (tests break a candidate's kernels through it). */
    void (*lane_hook)(struct qwenrt_session *s, int lane, void *user);
    void *hook_user;
};

/* Writes out_profile; *evidence is a new reference (status "calibrated" or "failed"). */
qwenrt_status calibrate_run(const struct calibrate_params *p, json_t **evidence,
                            struct qwenrt_error *err);

/* The same for backend "cuda" (calibrate_cuda.c; calibrate_run hands it over): the CUDA
 * decode's shapes instead of kernels, gated against the session's own picks. It runs on the
 * backend p->backend names: the tests run its gate, timing and records on the CPU, whose
 * sessions ignore the shapes. */
qwenrt_status calibrate_cuda_run(const struct calibrate_params *p, json_t **evidence,
                                 struct qwenrt_error *err);

#endif
