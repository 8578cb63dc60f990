/*
 * session.h — internal view of struct qwenrt_session (the public API is in qwenrt.h).
 *
 * A session owns one sequence's state (struct seq_state: KV cache, DeltaNet conv and recurrent
 * state), the activation buffers sized for the largest batch seen so far, and the logits of
 * the last position. Runs go through the model's prefill plan (n > 1) or decode plan (n = 1).
 */
#ifndef QWENRT_RUNTIME_SESSION_H
#define QWENRT_RUNTIME_SESSION_H

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/model.h"
#include "qwenrt.h"

struct qwenrt_session {
    struct qwenrt_model *model;
    struct seq_state state;
    int32_t n_past;               /* tokens processed */
    int32_t kv_type;              /* the KV cache's element type as resolved: QWENRT_KV_F32 or _F16 */
    int n_threads;
    uint32_t cpu_features;
    cpu_op_fn *fns[2];            /* bound kernels of each plan ([n_ops] per phase) */
    float *bufs[PLAN_MAX_BUFS];   /* activation buffers for up to cap_T tokens */
    int32_t cap_T;                /* tokens the buffers hold */
    int32_t cap_logit_rows;       /* rows the logits buffer holds */
    float *scratch;
    int64_t scratch_len;
    float *last_logits;           /* [n_vocab] */
    bool has_logits;
    bool logits_on_device;        /* CUDA: the last logits are still only on the GPU
                                     (session_fetch_logits copies them into last_logits) */
    cpu_dump_fn dump;             /* optional per-op dump (tests, debugging) */
    void *dump_user;
    struct cuda_session *cuda;    /* non-NULL: the model's backend is "cuda"; the sequence state
                                     lives on the GPU and `state` holds no arrays */
};

void session_set_dump(struct qwenrt_session *s, cpu_dump_fn fn, void *user);

/* Makes last_logits hold the last logits (a CUDA session copies them from the device the
 * first time they are asked for). Errors: BACKEND. */
qwenrt_status session_fetch_logits(struct qwenrt_session *s, struct qwenrt_error *err);

#endif
