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

/* Several decode steps with the token chosen on the GPU between them (a CUDA session, a
 * sampler sampler_device_plan accepts): decodes id, draws the next token as
 * qwenrt_session_sample would, decodes it, ... n draws; out[i] = the token drawn after step i.
 * Then the session holds id and out[0 .. n-2] (out[n-1] is drawn, not decoded), its logits are
 * those after out[n-2], and the sampler's RNG has made n draws (none for greedy). The sampler
 * does not accept the tokens (qwenrt_sampler_accept; with penalties off it needs none). The
 * same tokens as token by token, but where a draw falls within float rounding of a boundary
 * between two tokens (sample.cu's expf). Errors: UNSUPPORTED (a CPU session, a sampler the
 * GPU cannot run, no decode graphs: decode token by token instead; nothing has changed),
 * INVALID_ARG, LIMIT (past the context), NOMEM, BACKEND. */
qwenrt_status session_generate(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t id, int32_t n,
                               int32_t *out, struct qwenrt_error *err);

/* After session_generate(s, smp, id, n, out): keeps only what token by token would have done
 * had it stopped at out[keep - 1] (1 <= keep <= n): the session holds id and out[0 .. keep-2]
 * with the logits after them, and the sampler's RNG has made keep draws. Decodes at most keep
 * tokens again (a model without recurrent layers: one). Errors: INVALID_ARG, BACKEND. */
qwenrt_status session_generate_keep(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t id,
                                    const int32_t *out, int32_t n, int32_t keep, struct qwenrt_error *err);

/* Starts what qwenrt_session_sample(s, smp) will wait for — on a CUDA session with its logits
 * on the device, the pick of the best tokens (cuda_session_top_start) — so that several
 * sessions' picks run at once; the sample itself is unchanged. A no-op elsewhere, and when
 * the pick cannot start (the sample then reports why). */
void session_sample_start(struct qwenrt_session *s, struct qwenrt_sampler *smp);

/* session_sample_start(s[i], smp[i]) for i < n, where the CUDA picks that share a temperature
 * and m and gather no ids (the same sampling settings, no penalties or logit bias) start as
 * one launch of up to 16 sessions (cuda_sessions_top_start); the others, or a group the GPU
 * refuses, one by one. */
void session_sample_start_all(struct qwenrt_session *const *s, struct qwenrt_sampler *const *smp, int32_t n);

/* Whether one qwenrt_batch_decode step for n sessions like s is faster than each session's own
 * decode one after another (the server's choice): always on the CPU; on CUDA where the model's
 * products take a multi-token GEMV and n is large enough (cuda_batch_pays). */
bool session_batch_pays(const struct qwenrt_session *s, int32_t n);

#endif
