/*
 * cpu_exec.c — binding plan ops to CPU kernels and running a plan (see cpu_backend.h).
 *
 * The table below is the registry of op kernels: reference kernels for every op kind plus any
 * fast variants (with the CPU features they need). matmul and logits dispatch further by weight
 * dtype inside matmul_op / logits_op (see matmul.h for those variants).
 */
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/error.h"

/* logits = x · Eᵀ through matmul_ref, for the validate reference path (never a default). */
/* The LM head through the reference product; exact: f32 activations for quantised weights
 * (the CUDA backend's definition) instead of the Q8-rounded ones llama.cpp uses. */
static void logits_reference(const struct plan_op *op, struct cpu_exec *ex, bool exact)
{
    int32_t rows = ex->all_logits ? ex->T : 1, win = ex->plan->bufs[op->in].width;
    struct cpu_matmul_args a = {
        .y = ex->bufs[op->out], .x = ex->bufs[op->in] + (size_t)(ex->T - rows) * win,
        .w = op->w->data, .wtype = op->w->dtype, .T = rows, .K = op->w->ne[0], .N = op->w->ne[1],
        .ldx = win, .ldy = ex->plan->bufs[op->out].width,
        .w_row_bytes = op->w->nbytes / (size_t)op->w->ne[1], .n_threads = ex->n_threads,
    };
    if (exact) /* rows split across threads: the result does not depend on the count */
        matmul_ref_exact(&a);
    else
        matmul_ref(&a);
}

static void logits_ref(const struct plan_op *op, struct cpu_exec *ex) { logits_reference(op, ex, false); }
static void logits_exact(const struct plan_op *op, struct cpu_exec *ex) { logits_reference(op, ex, true); }

static const struct cpu_op_kernel kernels[] = {
    {"embed.ref", OP_EMBED, 0, 0, embed_ref},
    {"rmsnorm.ref", OP_RMSNORM, 0, 0, rmsnorm_ref},
    {"matmul.auto", OP_MATMUL, 0, 0, matmul_op},
    {"add.ref", OP_ADD, 0, 0, add_ref},
    {"qk_norm_rope.ref", OP_QK_NORM_ROPE, 0, 0, qk_norm_rope_ref},
    {"attention.ref", OP_ATTENTION, 0, 0, attention_ref},
    {"attention.avx512", OP_ATTENTION, CPU_AVX512F | CPU_AVX2, 10, attention_avx512},
    {"attention.avx2", OP_ATTENTION, CPU_AVX2, 5, attention_avx2},
    {"sigmoid_gate.ref", OP_SIGMOID_GATE, 0, 0, sigmoid_gate_ref},
    {"swiglu.ref", OP_SWIGLU, 0, 0, swiglu_ref},
    {"gdn_conv.ref", OP_GDN_CONV, 0, 0, gdn_conv_ref},
    {"gdn_core.ref", OP_GDN_CORE, 0, 0, gdn_core_ref},
    {"gdn_core.chunked", OP_GDN_CORE, 0, 10, gdn_core_chunked},
    {"gdn_core.chunked.avx512", OP_GDN_CORE, CPU_AVX512F | CPU_AVX2, 20, gdn_core_chunked_avx512},
    {"gated_rmsnorm.ref", OP_GATED_RMSNORM, 0, 0, gated_rmsnorm_ref},
    {"logits.auto", OP_LOGITS, 0, 0, logits_op},
    {"logits.ref", OP_LOGITS, 0, -1, logits_ref},
    {"logits.exact", OP_LOGITS, 0, -1, logits_exact},
    {NULL, 0, 0, 0, NULL},
};

const struct cpu_op_kernel *cpu_op_kernels(void) { return kernels; }

const struct cpu_op_kernel *cpu_op_pick(enum op_kind kind, uint32_t features, const char *key)
{
    const struct cpu_op_kernel *best = NULL;
    for (const struct cpu_op_kernel *k = kernels; k->key; k++) {
        if (k->kind != kind || (k->cpu_features & features) != k->cpu_features)
            continue;
        if (key && strcmp(k->key, key) == 0)
            return k;
        if (!best || k->priority > best->priority)
            best = k;
    }
    return key ? NULL : best;
}

qwenrt_status cpu_bind_plan(const struct plan *p, uint32_t features, cpu_op_fn *fns,
                            struct qwenrt_error *err)
{
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        /* a matmul.<dtype>.<impl> key is resolved inside matmul_op; other keys bind here */
        const char *key = (op->kernel && op->kind != OP_MATMUL) ? op->kernel : NULL;
        const struct cpu_op_kernel *k = cpu_op_pick(op->kind, features, key);
        if (!k)
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "no CPU kernel '%s' for op %s (layer %d)",
                           key ? key : "(any)", op_kind_name(op->kind), op->layer);
        fns[i] = k->fn;
    }
    return QWENRT_OK;
}

int64_t cpu_exec_scratch_floats(const struct plan *p, const struct seq_state *s, int32_t T)
{
    int64_t attn = (int64_t)(s->n_ctx + 1) * 256; /* scores per thread; 256 threads at most */
    int64_t conv = (int64_t)(s->conv_rows + T) * s->conv_dim;
    int64_t need = attn > conv ? attn : conv;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_GDN_CORE && gdn_chunked_scratch_floats(&p->ops[i]) > need)
            need = gdn_chunked_scratch_floats(&p->ops[i]);
    return need;
}

qwenrt_status cpu_run_plan(struct cpu_exec *ex, cpu_op_fn const *fns, struct qwenrt_error *err)
{
    const struct plan *p = ex->plan;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        fns[i](op, ex);
        if (ex->dump && op->dump)
            ex->dump(ex->dump_user, op->dump, op->layer, ex->bufs[op->out],
                     op->kind == OP_LOGITS && !ex->all_logits ? 1 : ex->T, p->bufs[op->out].width);
    }
    (void)err;
    return QWENRT_OK;
}
