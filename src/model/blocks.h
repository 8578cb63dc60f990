/*
 * blocks.h — the pieces both architecture files share: binding the global, attention and MLP
 * weights (with shape checks), and the plan fragments for the attention block, the MLP block,
 * the embedding and the final norm + LM head. Buffer ids below are the common buffers.
 */
#ifndef QWENRT_MODEL_BLOCKS_H
#define QWENRT_MODEL_BLOCKS_H

#include "model/model.h"

/* Buffers every plan has, in this order (plan_start adds them). */
enum { B_X, B_XN, B_TMP, B_Q, B_K, B_V, B_ATT, B_GATE, B_UP, B_LOGITS, B_COMMON_COUNT };

/* Embedding, final norm, LM head (tied to the embedding when output.weight is absent).
 * norm_add is added to norm weights (1 for HF Qwen3.5's zero-centred norms, else 0). */
qwenrt_status model_bind_globals(struct qwenrt_model *m, float norm_add, struct qwenrt_error *err);
/* q/k/v/o projections and q/k norms of layer l. */
qwenrt_status model_bind_attention(struct qwenrt_model *m, int32_t l, float norm_add,
                                   struct qwenrt_error *err);
/* gate/up/down of layer l. */
qwenrt_status model_bind_mlp(struct qwenrt_model *m, int32_t l, struct qwenrt_error *err);

/* Adds the common buffers and the embedding op. */
void plan_start(struct plan *p, const struct qwenrt_model *m);
/* u = rmsnorm(x); q,k,v; q/k norm + RoPE; attention (+ sigmoid gate); x += o_proj(.) */
void plan_attention_block(struct plan *p, const struct qwenrt_model *m, int32_t l);
/* u = rmsnorm(x); x += down(silu(gate u) ⊙ up u) */
void plan_mlp_block(struct plan *p, const struct qwenrt_model *m, int32_t l);
/* final rmsnorm, logits */
void plan_finish(struct plan *p, const struct qwenrt_model *m);

#endif
