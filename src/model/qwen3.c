/*
 * qwen3.c — Qwen3 (dense), per ../shared/docs/qwen-architecture.md §2.1:
 *
 *   x = embed(ids)
 *   for each layer:  h = x + o_proj(attn(rope(q_norm(q_proj u)), rope(k_norm(k_proj u)), v_proj u)),
 *                        u = rmsnorm(x)                       (plain-weight RMSNorm, GQA, NEOX RoPE)
 *                    x = h + down(silu(gate(u')) ⊙ up(u')),  u' = rmsnorm(h)
 *   logits = lm_head(rmsnorm(x))                              (lm_head tied to embed when absent)
 *
 * This file checks the expected tensors and their shapes, then writes the plan; it computes
 * nothing. Tensor names are llama.cpp's (model/names.c maps them for HF directories).
 */
#include "base/error.h"
#include "model/blocks.h"

qwenrt_status qwen3_load_weights(struct qwenrt_model *m, struct qwenrt_error *err)
{
    qwenrt_status st = model_bind_globals(m, 0.0f, err);
    for (int32_t l = 0; l < m->hp.n_layer && !st; l++) {
        struct layer_weights *L = &m->w.layers[l];
        st = model_bind_vector(m, &L->attn_norm, m->hp.n_embd, 0.0f, err, "blk.%d.attn_norm.weight", l);
        if (!st)
            st = model_bind_vector(m, &L->ffn_norm, m->hp.n_embd, 0.0f, err, "blk.%d.ffn_norm.weight", l);
        if (!st)
            st = model_bind_attention(m, l, 0.0f, err);
        if (!st)
            st = model_bind_mlp(m, l, err);
    }
    return st;
}

qwenrt_status qwen3_build_plan(const struct qwenrt_model *m, struct plan *p, struct qwenrt_error *err)
{
    plan_start(p, m);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        plan_attention_block(p, m, l);
        plan_mlp_block(p, m, l);
    }
    plan_finish(p, m);
    if (p->failed)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory building the plan", m->path);
    return QWENRT_OK;
}
