/*
 * blocks.c — weight binding and plan fragments shared by qwen3.c and qwen35.c (see blocks.h).
 */
#include "base/error.h"
#include "model/blocks.h"

/* The weights every architecture shares: embedding, final norm, LM head. */

qwenrt_status model_bind_globals(struct qwenrt_model *m, float norm_add, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    qwenrt_status st = model_bind_matrix(m, &m->w.tok_embd, hp->n_embd, hp->n_vocab, true, err,
                                         "token_embd.weight");
    if (!st)
        st = model_bind_matrix(m, &m->w.output, hp->n_embd, hp->n_vocab, false, err, "output.weight");
    if (!st && !m->w.output)
        m->w.output = m->w.tok_embd; /* tied */
    if (!st)
        st = model_bind_vector(m, &m->w.output_norm, hp->n_embd, norm_add, err, "output_norm.weight");
    return st;
}

/* Attention and MLP weights of layer l; norm_add is 1 for HF Qwen3.5's (1+w) norms. */

qwenrt_status model_bind_attention(struct qwenrt_model *m, int32_t l, float norm_add,
                                   struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *L = &m->w.layers[l];
    int64_t E = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    qwenrt_status st = model_bind_matrix(m, &L->wq, E, qd * (hp->attn_gated ? 2 : 1), true, err,
                                         "blk.%d.attn_q.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->wk, E, kvd, true, err, "blk.%d.attn_k.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->wv, E, kvd, true, err, "blk.%d.attn_v.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->wo, qd, E, true, err, "blk.%d.attn_output.weight", l);
    if (!st)
        st = model_bind_vector(m, &L->q_norm, hp->head_dim, norm_add, err, "blk.%d.attn_q_norm.weight", l);
    if (!st)
        st = model_bind_vector(m, &L->k_norm, hp->head_dim, norm_add, err, "blk.%d.attn_k_norm.weight", l);
    return st;
}


qwenrt_status model_bind_mlp(struct qwenrt_model *m, int32_t l, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *L = &m->w.layers[l];
    qwenrt_status st = model_bind_matrix(m, &L->ffn_gate, hp->n_embd, hp->n_ff, true, err,
                                         "blk.%d.ffn_gate.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ffn_up, hp->n_embd, hp->n_ff, true, err, "blk.%d.ffn_up.weight", l);
    if (!st)
        st = model_bind_matrix(m, &L->ffn_down, hp->n_ff, hp->n_embd, true, err, "blk.%d.ffn_down.weight", l);
    return st;
}

/* Buffers shared by both architectures' plans. */

/* ops: u = rmsnorm(x); q,k,v; norm+rope; attention (+ sigmoid gate); x += o_proj(.) */

void plan_attention_block(struct plan *p, const struct qwenrt_model *m, int32_t l)
{
    const struct model_hparams *hp = &m->hp;
    const struct layer_weights *L = &m->w.layers[l];
    struct plan_op *op;
    op = plan_add_op(p, OP_RMSNORM, l); op->out = B_XN; op->in = B_X; op->vec = L->attn_norm;
    op->group = hp->n_embd; op->eps = hp->rms_eps;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_Q; op->in = B_XN; op->w = L->wq;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_K; op->in = B_XN; op->w = L->wk;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_V; op->in = B_XN; op->w = L->wv;
    int32_t q_stride = hp->head_dim * (hp->attn_gated ? 2 : 1);
    op = plan_add_op(p, OP_QK_NORM_ROPE, l); op->out = B_Q; op->in = B_K;
    op->vec = L->q_norm; op->vec2 = L->k_norm; op->eps = hp->rms_eps;
    op->n_head = hp->n_head; op->n_head_kv = hp->n_head_kv; op->head_dim = hp->head_dim;
    op->n_rot = hp->n_rot; op->q_stride = q_stride; op->rope_theta = hp->rope_theta;
    op = plan_add_op(p, OP_ATTENTION, l); op->out = B_ATT; op->in = B_Q; op->in2 = B_K; op->in3 = B_V;
    op->n_head = hp->n_head; op->n_head_kv = hp->n_head_kv; op->head_dim = hp->head_dim;
    op->q_stride = q_stride;
    if (hp->attn_gated) {
        op = plan_add_op(p, OP_SIGMOID_GATE, l); op->out = B_ATT; op->in = B_Q;
        op->n_head = hp->n_head; op->head_dim = hp->head_dim; op->q_stride = q_stride;
    }
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_TMP; op->in = B_ATT; op->w = L->wo;
    op = plan_add_op(p, OP_ADD, l); op->out = B_X; op->in = B_TMP;
}

/* ops: u = rmsnorm(x); x += down(silu(gate u) ⊙ up u) */

void plan_mlp_block(struct plan *p, const struct qwenrt_model *m, int32_t l)
{
    const struct layer_weights *L = &m->w.layers[l];
    struct plan_op *op;
    op = plan_add_op(p, OP_RMSNORM, l); op->out = B_XN; op->in = B_X; op->vec = L->ffn_norm;
    op->group = m->hp.n_embd; op->eps = m->hp.rms_eps;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_GATE; op->in = B_XN; op->w = L->ffn_gate;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_UP; op->in = B_XN; op->w = L->ffn_up;
    op = plan_add_op(p, OP_SWIGLU, l); op->out = B_GATE; op->in = B_UP;
    op = plan_add_op(p, OP_MATMUL, l); op->out = B_TMP; op->in = B_GATE; op->w = L->ffn_down;
    op = plan_add_op(p, OP_ADD, l); op->out = B_X; op->in = B_TMP; op->dump = "layer_out";
}

/* Buffers, embedding first; the final norm and LM head come from plan_finish. */
void plan_finish(struct plan *p, const struct qwenrt_model *m);

void plan_start(struct plan *p, const struct qwenrt_model *m)
{
    const struct model_hparams *hp = &m->hp;
    int32_t qw = hp->n_head * hp->head_dim, kvw = hp->n_head_kv * hp->head_dim;
    plan_add_buf(p, "x", hp->n_embd);
    plan_add_buf(p, "xn", hp->n_embd);
    plan_add_buf(p, "tmp", hp->n_embd);
    plan_add_buf(p, "q", qw * (hp->attn_gated ? 2 : 1));
    plan_add_buf(p, "k", kvw);
    plan_add_buf(p, "v", kvw);
    plan_add_buf(p, "attn", qw);
    plan_add_buf(p, "ffn_gate", hp->n_ff);
    plan_add_buf(p, "ffn_up", hp->n_ff);
    plan_add_buf(p, "logits", hp->n_vocab);
    p->buf_x = B_X;
    p->buf_logits = B_LOGITS;
    struct plan_op *op = plan_add_op(p, OP_EMBED, -1);
    op->out = B_X; op->w = m->w.tok_embd; op->dump = "embed";
}

void plan_finish(struct plan *p, const struct qwenrt_model *m)
{
    struct plan_op *op = plan_add_op(p, OP_RMSNORM, -1);
    op->out = B_XN; op->in = B_X; op->vec = m->w.output_norm; op->group = m->hp.n_embd;
    op->eps = m->hp.rms_eps; op->dump = "final_norm";
    op = plan_add_op(p, OP_LOGITS, -1); op->out = B_LOGITS; op->in = B_XN; op->w = m->w.output;
}

