/*
 * plan.h — the op vocabulary and the plan: a model's forward pass as an ordered list of ops
 * over named activation buffers. Data only, no maths: model files (src/model/qwen3.c,
 * qwen35.c) build plans, backends (src/backend/...) execute them.
 *
 * Buffers are f32 activations of shape [n_tokens][width]; n_tokens is given when a plan runs
 * (the prompt length for prefill, 1 for decode). Ops name their layer so that a run can be
 * dumped as "<buffer>.<layer>" and compared with the fixtures layer by layer.
 * Per-sequence state (KV cache, DeltaNet conv and recurrent state) is not a buffer: ops that
 * touch it name their layer and the backend's session holds the state.
 */
#ifndef QWENRT_PLAN_PLAN_H
#define QWENRT_PLAN_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "format/tensor.h"

enum op_kind {
    OP_EMBED,          /* out[t] = dequant(W row ids[t]) */
    OP_RMSNORM,        /* out = in / rms(in) * w, in groups of `group` elements (per head) */
    OP_MATMUL,         /* out = in · Wᵀ  (W [N][K] any dtype) */
    OP_ADD,            /* out += in  (residual) */
    OP_QK_NORM_ROPE,   /* per-head RMSNorm of q and k, then RoPE on the first n_rot dims */
    OP_ATTENTION,      /* write k,v to the layer's cache; causal GQA softmax attention */
    OP_SIGMOID_GATE,   /* out[h][d] *= sigmoid(gate[h][d]) (gate read with a head stride) */
    OP_SWIGLU,         /* out = silu(out) * in */
    OP_GDN_CONV,       /* causal depthwise conv over q|k|v with the layer's conv state, SiLU */
    OP_GDN_CORE,       /* L2 norm q,k; beta, decay; delta-rule state update; readout */
    OP_GATED_RMSNORM,  /* out = rmsnorm(out per head) * w * silu(z) */
    OP_LOGITS,         /* out = in · Eᵀ for the rows the run asks for (last or all) */
    OP_KIND_COUNT
};

const char *op_kind_name(enum op_kind k); /* stable key: "rmsnorm", "gdn_core", ... */

#define PLAN_MAX_BUFS 16

struct plan_buf {
    const char *name; /* "x", "attn_norm", "q", ... */
    int32_t width;    /* floats per token */
};

/* Every op uses the fields its kind needs; the rest stay zero. */
struct plan_op {
    enum op_kind kind;
    int32_t layer;               /* -1 for global ops */
    int32_t out, in, in2, in3;   /* buffer ids (in2/in3: further inputs, e.g. v, beta, alpha) */
    const struct qr_tensor *w;   /* matmul / embed / logits weight */
    const float *vec;            /* small f32 weight: norm weight, q_norm, conv weight, ... */
    const float *vec2;           /* second small weight: k_norm, dt_bias */
    const float *vec3;           /* third: ssm_a (= -exp(A_log)) */
    int32_t group;               /* rmsnorm group size (width for a whole-row norm) */
    float eps;
    /* attention geometry */
    int32_t n_head, n_head_kv, head_dim, n_rot, q_stride; /* q_stride: floats between heads in q */
    float rope_theta;
    /* DeltaNet geometry */
    int32_t n_k_heads, n_v_heads, k_dim, v_dim, conv_k;
    bool v_head_tiled;           /* value head j uses key head j % Hk (GGUF) instead of j / r (HF) */
    const char *dump;            /* name of the output for layer dumps ("layer_out"), or NULL */
    const char *kernel;          /* kernel key bound to this op (set by the backend/profile) */
};

enum plan_phase { PHASE_PREFILL = 0, PHASE_DECODE = 1 };

struct plan {
    enum plan_phase phase;
    struct plan_buf bufs[PLAN_MAX_BUFS];
    int32_t n_bufs;
    struct plan_op *ops;
    int32_t n_ops, cap_ops;
    int32_t buf_x;      /* the residual stream buffer */
    int32_t buf_logits; /* the logits buffer (width n_vocab) */
    bool failed;        /* an allocation failed while building: the plan is unusable */
    struct plan_op sink; /* what plan_add_op returns after a failure, so builders need no checks */
};

/* Builder helpers. plan_add_op never returns NULL: on allocation failure it sets p->failed
 * and returns p->sink, so builders check p->failed once at the end. */
bool plan_init(struct plan *p, enum plan_phase phase);
void plan_free(struct plan *p);
int32_t plan_add_buf(struct plan *p, const char *name, int32_t width);
struct plan_op *plan_add_op(struct plan *p, enum op_kind kind, int32_t layer);

/* Liveness, for backends that fuse ops: true when op reads buf (as an input, or as the
 * output it updates in place). */
bool plan_op_reads(const struct plan_op *op, int32_t buf);
/* true when no op from index `from` on reads buf before something overwrites it (a fusion
 * may then skip writing buf). */
bool plan_buf_dead_after(const struct plan *p, int32_t buf, int32_t from);
/* true when op i is a matmul whose output only feeds the add right after it
 * (residual += x · Wᵀ): a backend may accumulate the product into the residual. */
bool plan_matmul_add_fusable(const struct plan *p, int32_t i);

#endif
