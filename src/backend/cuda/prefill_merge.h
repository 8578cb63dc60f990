/*
 * prefill_merge.h — which prefill products the CUDA backend runs as one (host code, C, built
 * with or without CUDA so that its rules are tested on any machine: tests/test_prefill_merge.c).
 *
 * Consecutive products that read the same input (q, k, v; gate, up; DeltaNet's qkv, z, beta,
 * alpha) and whose weights lie back to back in memory with one dtype, K and row size are one
 * product of N1 + N2 + ... rows: one wider GEMM fills the GPU better than several narrow ones
 * and reads x once. Their outputs then share one allocation: each output buffer is a view at
 * a column offset of the first one's buffer, rows ld = N1 + N2 + ... floats long. A merge is
 * made only when every op of the plan that touches such a buffer reads and writes it with row
 * strides (the strided op kinds below; an add or an embedding takes flat buffers), when no
 * output is the input, the logits or narrower / wider than its product, when the last
 * product's output is not accumulated into the residual (plan_matmul_add_fusable), and when a
 * buffer keeps one layout over the whole plan (every layer's merge agrees, else that merge is
 * left out).
 */
#ifndef QWENRT_BACKEND_CUDA_PREFILL_MERGE_H
#define QWENRT_BACKEND_CUDA_PREFILL_MERGE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "plan/plan.h" /* a C header without its own extern "C" */
#include "qwenrt.h"

/* A product's weight as the backend stores it (w: its first byte, host or device). */
struct merge_weight {
    const void *w;
    int32_t dtype, K, N;
    int64_t row_bytes;
};

struct merge_layout {
    int32_t ld[PLAN_MAX_BUFS];  /* each buffer's row stride in floats (its width unless merged) */
    int32_t own[PLAN_MAX_BUFS]; /* the buffer whose allocation holds buffer i (i: its own) */
    int32_t off[PLAN_MAX_BUFS]; /* buffer i's first column there */
    int32_t *run;               /* [n_ops]: the products op i runs as one: >= 2 (ops i.. merged),
                                 * 0 (merged into an earlier op), 1 (every other op) */
};

/* true when an op of kind k takes its buffers with row strides (views may be handed to it) */
bool merge_strided_kind(enum op_kind k);

/* Fills *out for plan p (wts[i]: op i's weight, read for products only). enabled false: no
 * merges (plain layout). Errors: NOMEM. Free with merge_layout_free. */
qwenrt_status merge_layout_make(const struct plan *p, const struct merge_weight *wts, bool enabled,
                                struct merge_layout *out, struct qwenrt_error *err);
void merge_layout_free(struct merge_layout *m);

#ifdef __cplusplus
}
#endif

#endif
