/*
 * qwen35.c — Qwen3.5 (hybrid), per ../shared/docs/qwen-architecture.md §2.2–2.4:
 *
 *   x = embed(ids)
 *   for each layer:  x = x + Mixer(rmsnorm1p(x))        Mixer: Gated DeltaNet, or gated
 *                    x = x + MLP(rmsnorm1p(x))          attention every 4th layer
 *   logits = lm_head(rmsnorm1p(x))
 *
 * Gated DeltaNet: qkv = in_proj_qkv u → causal conv (k=4) + SiLU → L2-norm q,k, q/sqrt(dk);
 * beta = sigmoid(in_proj_b u), g = ssm_a·softplus(in_proj_a u + dt_bias); delta-rule state
 * update; o = gated_rmsnorm(o, silu(in_proj_z u)) → out_proj.
 * Gated attention: q_proj holds [query | gate] per head; (1+w) q/k norms; RoPE on the first
 * 25% of dims; o = attn ⊙ sigmoid(gate) → o_proj.
 *
 * Conventions: HF files keep zero-centred norm weights w (applied as 1+w) and A_log; GGUF files
 * store 1+w and ssm_a = -exp(A_log) and tile V heads. Loading converts both to the GGUF values
 * (model.h); only the V-head order stays a flag (op->v_head_tiled).
 */
#include <math.h>

#include "base/error.h"
#include "model/blocks.h"

/* Buffers beyond the common ones. */
enum { B_QKV = B_COMMON_COUNT, B_Z, B_BETA, B_ALPHA, B_O };

static qwenrt_status bind_deltanet(struct qwenrt_model *m, int32_t l, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *L = &m->w.layers[l];
    int64_t E = hp->n_embd, C = hparams_ssm_conv_dim(hp), Hv = hp->ssm_n_v_heads;
    int64_t vd = Hv * hp->ssm_v_dim;
    qwenrt_status st = model_bind_matrix(m, &L->ssm_qkv, E, C, true, err, "blk.%d.attn_qkv.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ssm_z, E, vd, true, err, "blk.%d.attn_gate.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ssm_beta, E, Hv, true, err, "blk.%d.ssm_beta.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ssm_alpha, E, Hv, true, err, "blk.%d.ssm_alpha.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ssm_out, vd, E, true, err, "blk.%d.ssm_out.weight", l);
    if (!st)
        st = model_bind_vector(m, &L->ssm_conv, C * hp->ssm_conv, 0.0f, err, "blk.%d.ssm_conv1d.weight", l);
    if (!st)
        st = model_bind_vector(m, &L->ssm_dt, Hv, 0.0f, err, "blk.%d.ssm_dt.bias", l);
    if (!st)
        st = model_bind_vector(m, &L->ssm_norm, hp->ssm_v_dim, 0.0f, err, "blk.%d.ssm_norm.weight", l);
    if (!st)
        st = model_bind_vector(m, &L->ssm_a, Hv, 0.0f, err, "blk.%d.ssm_a", l);
    if (!st && m->format == MODEL_FORMAT_HF) { /* the file holds A_log: ssm_a = -exp(A_log) */
        float *a = (float *)L->ssm_a;
        for (int64_t i = 0; i < Hv; i++)
            a[i] = -expf(a[i]);
    }
    return st;
}

qwenrt_status qwen35_load_weights(struct qwenrt_model *m, struct qwenrt_error *err)
{
    float norm_add = m->format == MODEL_FORMAT_HF ? 1.0f : 0.0f; /* HF stores w of (1+w) */
    qwenrt_status st = model_bind_globals(m, norm_add, err);
    for (int32_t l = 0; l < m->hp.n_layer && !st; l++) {
        struct layer_weights *L = &m->w.layers[l];
        st = model_bind_vector(m, &L->attn_norm, m->hp.n_embd, norm_add, err, "blk.%d.attn_norm.weight", l);
        if (!st)
            st = model_bind_vector(m, &L->ffn_norm, m->hp.n_embd, norm_add, err,
                                   "blk.%d.post_attention_norm.weight", l);
        if (!st)
            st = m->hp.is_recurrent[l] ? bind_deltanet(m, l, err) : model_bind_attention(m, l, norm_add, err);
        if (!st)
            st = model_bind_mlp(m, l, err);
    }
    return st;
}

/* u = rmsnorm(x); qkv, z, b, a projections; conv; delta rule; gated norm; x += out_proj(o) */
static void plan_deltanet_block(struct plan *p, const struct qwenrt_model *m, int32_t l)
{
    const struct model_hparams *hp = &m->hp;
    const struct layer_weights *L = &m->w.layers[l];
    struct plan_op *op;
    op = plan_add_op(p, OP_RMSNORM, l); op->out = B_XN; op->in = B_X; op->vec = L->attn_norm;
    op->group = hp->n_embd; op->eps = hp->rms_eps;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_QKV; op->in = B_XN; op->w = L->ssm_qkv;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_Z; op->in = B_XN; op->w = L->ssm_z;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_BETA; op->in = B_XN; op->w = L->ssm_beta;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_ALPHA; op->in = B_XN; op->w = L->ssm_alpha;
    op = plan_add_op(p, OP_GDN_CONV, l); op->out = B_QKV; op->vec = L->ssm_conv; op->conv_k = hp->ssm_conv;
    op = plan_add_op(p, OP_GDN_CORE, l); op->out = B_O; op->in = B_QKV; op->in2 = B_BETA; op->in3 = B_ALPHA;
    op->vec2 = L->ssm_dt; op->vec3 = L->ssm_a; op->n_k_heads = hp->ssm_n_k_heads;
    op->n_v_heads = hp->ssm_n_v_heads; op->k_dim = hp->ssm_k_dim; op->v_dim = hp->ssm_v_dim;
    op->v_head_tiled = m->v_head_tiled;
    op = plan_add_op(p, OP_GATED_RMSNORM, l); op->out = B_O; op->in = B_Z; op->vec = L->ssm_norm;
    op->eps = hp->rms_eps; op->n_v_heads = hp->ssm_n_v_heads; op->v_dim = hp->ssm_v_dim;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_TMP; op->in = B_O; op->w = L->ssm_out;
    op = plan_add_op(p, OP_ADD, l); op->out = B_X; op->in = B_TMP;
}

qwenrt_status qwen35_build_plan(const struct qwenrt_model *m, struct plan *p, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    plan_start(p, m);
    plan_add_buf(p, "gdn_qkv", hparams_ssm_conv_dim(hp));
    plan_add_buf(p, "gdn_z", hp->ssm_n_v_heads * hp->ssm_v_dim);
    plan_add_buf(p, "gdn_beta", hp->ssm_n_v_heads);
    plan_add_buf(p, "gdn_alpha", hp->ssm_n_v_heads);
    plan_add_buf(p, "gdn_o", hp->ssm_n_v_heads * hp->ssm_v_dim);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        if (hp->is_recurrent[l])
            plan_deltanet_block(p, m, l);
        else
            plan_attention_block(p, m, l);
        plan_mlp_block(p, m, l);
    }
    plan_finish(p, m);
    if (p->failed)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory building the plan", m->path);
    return QWENRT_OK;
}
