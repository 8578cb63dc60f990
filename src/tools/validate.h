/*
 * validate.h — the correctness gate (seed 004): a candidate path (model + backend + profile)
 * against a reference, at every prompt and generated position, before anything is timed.
 *
 * The reference is qwenrt's own reference path (every op on its *.ref kernel, weights
 * dequantised to f32 row by row, f32 KV) over the same model, or a fixture file in the format
 * of tests/data/<model>/reference.safetensors (transformers, float64). At each position:
 * logits (max and mean absolute error, allclose with rtol/atol, argmax equality), the K and V
 * cache rows of every attention layer for all valid positions, the DeltaNet conv and recurrent
 * state of every linear-attention layer (where the reference has it), and the greedy token.
 * The first failing position stops the run (status "validated" or "validation_failed"), unless
 * keep_going: then every position is checked, the first failure still decides the status, and
 * the record counts the positions that passed, the equal greedy ids and the near ties, with
 * each position's relative logits error (||c - r|| / ||r||): the curve of a model whose
 * random weights amplify rounding (Qwen3.5 at the real widths, docs/perf-log.md session 11).
 * Tolerances come from one table (validate_tolerances) and are printed in the record.
 */
#ifndef QWENRT_TOOLS_VALIDATE_H
#define QWENRT_TOOLS_VALIDATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "format/dtype.h"
#include "qwenrt.h"

struct validate_tolerance {
    const char *family; /* "float", "quantized", "fixture-float64", ... */
    double logits_rtol, logits_atol;
    double cache_rtol, cache_atol;
    double state_rtol, state_atol;
    const char *reason; /* why these values */
};

/* The tolerance table, NULL-family terminated. */
const struct validate_tolerance *validate_tolerances(void);
/* The row for weights of dtype wtype against the qwenrt reference (fixture = false) or a
 * transformers float64 fixture (fixture = true). */
/* The row for a model whose matrices are stored as wtype; fixture: against a transformers
 * reference file; hybrid: a Qwen3.5 (DeltaNet) model. */
const struct validate_tolerance *validate_tolerance_for(enum qr_dtype wtype, bool fixture,
                                                        bool hybrid);

struct qwenrt_session;

struct validate_params {
    const char *model_path;
    const char *backend; /* NULL = cpu */
    int n_threads;
    const char *profile; /* id or file; NULL = default */
    const char *profiles_dir;
    const char *reference_file; /* NULL = qwenrt's reference path */
    int32_t n_prompt;           /* synthetic prompt length (ignored with a reference file) */
    int32_t n_gen;              /* greedy tokens to generate (<= the file's with one) */
    uint64_t seed;              /* of the synthetic prompt */
    const char *command;        /* whose intent gates the profile: NULL = "validate" */
    unsigned intent;            /* 0 = PROFILE_INTENT_VERIFY (bench passes calibrate) */
    bool keep_going;            /* check every position, past the first failure */
    /* Test hook: called with the candidate session right after it is created (tests rebind
     * kernels to deliberately broken ones through it). */
    void (*candidate_hook)(struct qwenrt_session *s, void *user);
    void *hook_user;
};

struct validate_result {
    bool passed;
    int32_t first_failure; /* position of the first failing check, -1 when none */
    char failure[256];     /* which check failed there, and by how much */
    int32_t *prompt;       /* [n_prompt] ids used */
    int32_t n_prompt;
    int32_t *tokens; /* [n_tokens] candidate greedy tokens (all validated when passed) */
    int32_t n_tokens;
    json_t *record; /* the seed 004 record */
};

/* Runs the gate. Returns an error only when it cannot run (model, profile, reference file);
 * a failing check is QWENRT_OK with r->passed = false. */
qwenrt_status validate_run(const struct validate_params *p, struct validate_result *r,
                           struct qwenrt_error *err);
void validate_result_free(struct validate_result *r);

/* Deterministic synthetic prompt ids in [0, n_vocab) (xorshift64*, like seed 004's fixed ids). */
void validate_synthetic_prompt(uint64_t seed, int32_t n_vocab, int32_t *ids, int32_t n);

/* allclose: |a - b| <= atol + rtol |b| for every element (NaN fails); *max_err and *mean_err
 * get the largest and the mean absolute difference. */
bool validate_allclose(const float *a, const float *b, size_t n, double rtol, double atol, double *max_err,
                       double *mean_err);

#endif
