/*
 * batch.c — one decode step for several sessions of one model at once (public API in qwenrt.h,
 * "batched decode"), the server's continuous batching on the CPU.
 *
 * The decode plan runs op by op over a [n][width] activation block, one row per session: ops
 * that treat tokens independently (embed, rmsnorm, matmul, add, swiglu, sigmoid_gate,
 * gated_rmsnorm, logits) run once for all n rows, so each weight matrix is read once per step
 * instead of n times (the matmul kernels share each converted weight row across tokens);
 * ops that touch a sequence's own position or state (qk_norm_rope, attention, gdn_conv,
 * gdn_core) run once per session on its row, with that session's position, KV cache, DeltaNet
 * state and bound kernel. The result is each session's decode of its token, as
 * qwenrt_session_decode gives (up to float rounding of the multi-row matmuls).
 * CUDA sessions go to cuda_batch_decode, which splits the plan the same way on the GPU and
 * leaves each session's logits row on the device (qwenrt_session_sample reads its best tokens
 * there; qwenrt_session_logits copies the row when asked); a mix of CPU and CUDA sessions is
 * refused (UNSUPPORTED).
 */
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "base/alloc.h"
#include "base/error.h"
#include "runtime/session.h"

struct qwenrt_batch {
    const struct qwenrt_model *model; /* borrowed */
    int32_t max_seqs;                 /* rows the buffers hold */
    float *bufs[PLAN_MAX_BUFS];       /* [max_seqs][width] per plan buffer, f32 */
    float *scratch;                   /* per-op scratch, see cpu_exec_scratch_floats */
    int64_t scratch_len;              /* floats of scratch */
};

qwenrt_status qwenrt_batch_init(struct qwenrt_model *model, int32_t max_seqs,
                                struct qwenrt_batch **out, struct qwenrt_error *err)
{
    *out = NULL;
    if (!model || max_seqs < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "batch: no model or max_seqs %d < 1", max_seqs);
    struct qwenrt_batch *b = xcalloc(1, sizeof(*b));
    if (!b)
        return err_set(err, QWENRT_ERR_NOMEM, "batch: out of memory");
    b->model = model;
    b->max_seqs = max_seqs;
    const struct plan *p = &model->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_bufs; i++)
        if (!(b->bufs[i] =
                  xalloc_aligned((size_t)max_seqs * (size_t)p->bufs[i].width, sizeof(float)))) {
            qwenrt_batch_free(b);
            return err_set(err, QWENRT_ERR_NOMEM, "batch: out of memory for %d rows", max_seqs);
        }
    *out = b;
    return QWENRT_OK;
}

void qwenrt_batch_free(struct qwenrt_batch *b)
{
    if (!b)
        return;
    for (int i = 0; i < PLAN_MAX_BUFS; i++)
        xfree(b->bufs[i]);
    xfree(b->scratch);
    xfree(b);
}

/* true for ops that read or write a sequence's position or state */
static bool is_per_sequence(enum op_kind k)
{
    return k == OP_QK_NORM_ROPE || k == OP_ATTENTION || k == OP_GDN_CONV || k == OP_GDN_CORE;
}

static qwenrt_status check(struct qwenrt_batch *b, struct qwenrt_session *const *s,
                           const int32_t *ids, int32_t n, struct qwenrt_error *err)
{
    if (!b || !s || !ids || n < 1 || n > b->max_seqs)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "batch decode: %d sessions, the batch holds %d",
                       n, b ? b->max_seqs : 0);
    int32_t V = b->model->hp.n_vocab;
    for (int32_t i = 0; i < n; i++) {
        if (!s[i] || s[i]->model != b->model)
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "batch decode: session %d is not of the batch's model", i);
        if ((s[i]->cuda != NULL) != (s[0]->cuda != NULL))
            return err_set(err, QWENRT_ERR_UNSUPPORTED,
                           "batch decode: sessions 0 and %d run on different backends", i);
        if (ids[i] < 0 || ids[i] >= V)
            return err_set(
                err, QWENRT_ERR_INVALID_ARG,
                "batch decode: token id %d of session %d is outside the vocabulary [0, %d)", ids[i],
                i, V);
        if (s[i]->n_past >= s[i]->state.n_ctx)
            return err_set(err, QWENRT_ERR_LIMIT, "batch decode: session %d is full (%d tokens)", i,
                           s[i]->n_past);
        for (int32_t k = 0; k < i; k++)
            if (s[k] == s[i])
                return err_set(err, QWENRT_ERR_INVALID_ARG,
                               "batch decode: session %d appears twice", i);
    }
    return QWENRT_OK;
}

/* Scratch for the largest need: all rows for row-wise ops, one row of any session otherwise. */
static qwenrt_status ensure_scratch(struct qwenrt_batch *b, const struct plan *p,
                                    struct qwenrt_session *const *s, int32_t n,
                                    struct qwenrt_error *err)
{
    int64_t need = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t f = cpu_exec_scratch_floats(p, &s[i]->state, n);
        need = f > need ? f : need;
    }
    if (need <= b->scratch_len)
        return QWENRT_OK;
    xfree(b->scratch);
    b->scratch_len = 0;
    if (!(b->scratch = xalloc_aligned((size_t)need, sizeof(float))))
        return err_set(err, QWENRT_ERR_NOMEM, "batch decode: out of memory for scratch");
    b->scratch_len = need;
    return QWENRT_OK;
}

/* Each session's logits (rows of b's logits buffer) and position after a step. */
static void finish_step(struct qwenrt_batch *b, struct qwenrt_session *const *s, int32_t n)
{
    const struct plan *p = &b->model->plans[PHASE_DECODE];
    size_t V = (size_t)b->model->hp.n_vocab;
    for (int32_t r = 0; r < n; r++) {
        memcpy(s[r]->last_logits, b->bufs[p->buf_logits] + (size_t)r * V, V * sizeof(float));
        s[r]->n_past++;
        s[r]->has_logits = true;
        s[r]->logits_on_device = false;
    }
}

/* CUDA sessions: the same split of the plan, on the GPU. */
static qwenrt_status batch_decode_cuda(struct qwenrt_batch *b, struct qwenrt_session *const *s,
                                       const int32_t *ids, int32_t n, struct qwenrt_error *err)
{
    struct cuda_session **css = xcalloc((size_t)n, sizeof(*css));
    int32_t *pos = xcalloc((size_t)n, sizeof(*pos));
    qwenrt_status st = QWENRT_OK;
    if (!css || !pos)
        st = err_set(err, QWENRT_ERR_NOMEM, "batch decode: out of memory");
    for (int32_t r = 0; r < n && !st; r++)
        css[r] = s[r]->cuda, pos[r] = s[r]->n_past;
    if (!st) /* the logits stay on the GPU, one row per session (qwenrt_session_sample) */
        st = cuda_batch_decode(css, ids, pos, n, NULL, err);
    for (int32_t r = 0; r < n && !st; r++) {
        s[r]->n_past++;
        s[r]->has_logits = s[r]->logits_on_device = true;
    }
    xfree(css);
    xfree(pos);
    return st;
}

bool session_batch_pays(const struct qwenrt_session *s, int32_t n)
{
    return !s->cuda || cuda_batch_pays(s->cuda, n);
}

qwenrt_status qwenrt_batch_decode(struct qwenrt_batch *b, struct qwenrt_session *const *s,
                                  const int32_t *ids, int32_t n, struct qwenrt_error *err)
{
    qwenrt_status st = check(b, s, ids, n, err);
    if (!st && s[0]->cuda)
        return batch_decode_cuda(b, s, ids, n, err);
    const struct plan *p = &b->model->plans[PHASE_DECODE];
    if (st || (st = ensure_scratch(b, p, s, n, err)))
        return st;
    struct cpu_exec all = {
        .plan = p,
        .T = n,
        .pos0 = 0,
        .ids = ids,
        .all_logits = true,
        .state = &s[0]->state,
        .n_threads = s[0]->n_threads,
        .cpu_features = s[0]->cpu_features,
        .scratch = b->scratch,
        .scratch_len = b->scratch_len,
    };
    memcpy(all.bufs, b->bufs, sizeof(all.bufs));
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (!is_per_sequence(op->kind)) {
            s[0]->fns[PHASE_DECODE][i](op, &all);
            continue;
        }
        for (int32_t r = 0; r < n; r++) {
            struct cpu_exec one = all;
            one.T = 1;
            one.pos0 = s[r]->n_past;
            one.ids = ids + r;
            one.state = &s[r]->state;
            one.n_threads = s[r]->n_threads;
            for (int32_t k = 0; k < p->n_bufs; k++)
                one.bufs[k] = b->bufs[k] + (size_t)r * (size_t)p->bufs[k].width;
            s[r]->fns[PHASE_DECODE][i](op, &one);
        }
    }
    finish_step(b, s, n);
    return QWENRT_OK;
}
