/*
 * megakernel.cuh — decode as one persistent kernel (megakernel.cu): the interface the session
 * uses.
 *
 * mk_build turns the decode plan into a list of phases (one fused GEMV, one attention head
 * sweep, one DeltaNet step, ...) and mk_run executes every phase of n_tok decode steps in a
 * single cooperative launch, one block per multiprocessor, with a grid-wide barrier between
 * phases. Each block streams its share of every weight matrix through a ring of shared-memory
 * stages with bulk copies issued several chunks ahead, across phase boundaries, so the DRAM
 * stream does not stop at a barrier or a kernel launch: this is what the launch-per-op decode
 * (~6 kernels per layer, ~4 us each however small) cannot do.
 *
 * mk_build returns UNSUPPORTED (and the session keeps its graph path) when the plan has an
 * op sequence the phases do not cover; the reason is in the error.
 */
#ifndef QWENRT_BACKEND_CUDA_MEGAKERNEL_CUH
#define QWENRT_BACKEND_CUDA_MEGAKERNEL_CUH

#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "plan/plan.h"
}

/* What mk_build needs from the session: the decode plan with its ops resolved to device
 * memory, the one-token buffers and the per-layer state. */
struct mk_inputs {
    const struct plan *p;
    const struct dop *d;   /* [p->n_ops] */
    float *const *bufs;    /* [PLAN_MAX_BUFS] one-token decode buffers */
    float *const *kc, *const *vc, *const *conv, *const *ssm; /* [n_layer] or NULL entries */
    int32_t kv_width, conv_dim, n_sm;
    int32_t threads;       /* per block: 256 or 512 */
    bool fuse_down;        /* the down product joins its SwiGLU phase (16-bit weights: mk_down) */
    struct cuda_alloc_count *allocs; /* the session's allocation count (dev_malloc), or NULL */
};

struct mk_program;

qwenrt_status mk_build(const struct mk_inputs *in, struct mk_program **out,
                       struct qwenrt_error *err);
void mk_free(struct mk_program *mk);

/* Runs n_tok decode steps from the token ids[0] at position *pos. gen: after each step the
 * argmax becomes the next token (ids[0], out_ids[(*step)++], (*pos)++), as argmax_kernel does;
 * otherwise n_tok must be 1 and the logits buffer is written, and out_ids (when not NULL)
 * gets the argmax (lowest id among equal maxima, NaN never) and its logit's bits:
 * out_ids[0] = id, out_ids[1] = the float's bits. */
qwenrt_status mk_run(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                     int32_t *out_ids, int32_t *step, int32_t n_tok, bool gen,
                     unsigned long long *times, struct qwenrt_error *err);

/* Runs reps single decode steps with a timestamp after every phase's barrier and writes the
 * mean time per phase kind ("gemv x113 412.0 (3.65 each); ...") to report. */
qwenrt_status mk_profile(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                         int32_t reps, char *report, size_t report_len, struct qwenrt_error *err);

/* Phases in the program (for records and tests). */
int32_t mk_phase_count(const struct mk_program *mk);

#endif
