/*
 * compare.h — how far a candidate model's next-token distributions are from a reference's over
 * the same token sequence (e.g. a quantised GGUF against its F32 source): mean and max KL
 * divergence KL(P_ref || P_cand), top-1 agreement, and the relative error of the logits.
 */
#ifndef QWENRT_TOOLS_COMPARE_H
#define QWENRT_TOOLS_COMPARE_H

#include <stdint.h>

#include "qwenrt.h"

struct compare_result {
    int32_t n_positions;
    double kl_mean, kl_max, kl_p99; /* nats */
    double top1_agreement;          /* fraction of positions with the same argmax */
    double logits_rel_err;          /* ||cand - ref|| / ||ref|| over all positions */
};

/* Runs both models over ids (in chunks, batched prefill, all logits) and compares; the
 * candidate's session has the given enum qwenrt_precision (the GPU's prompt products). */
qwenrt_status compare_models(struct qwenrt_model *cand, struct qwenrt_model *ref,
                             const int32_t *ids, int32_t n, int n_threads, int32_t precision,
                             struct compare_result *out, struct qwenrt_error *err);

#endif
