/*
 * plan.c — building plans (see plan.h): buffers and ops appended in order.
 */
#include "plan/plan.h"

#include <string.h>

#include "base/alloc.h"

static const char *const kind_names[OP_KIND_COUNT] = {
    "embed", "rmsnorm", "matmul", "add", "qk_norm_rope", "attention", "sigmoid_gate", "swiglu",
    "gdn_conv", "gdn_core", "gated_rmsnorm", "logits",
};

const char *op_kind_name(enum op_kind k)
{
    return (k >= 0 && k < OP_KIND_COUNT) ? kind_names[k] : "?";
}

bool plan_init(struct plan *p, enum plan_phase phase)
{
    memset(p, 0, sizeof(*p));
    p->phase = phase;
    p->cap_ops = 64;
    p->ops = xcalloc((size_t)p->cap_ops, sizeof(*p->ops));
    p->buf_x = p->buf_logits = -1;
    return p->ops != NULL;
}

void plan_free(struct plan *p)
{
    if (!p)
        return;
    xfree(p->ops);
    memset(p, 0, sizeof(*p));
}

int32_t plan_add_buf(struct plan *p, const char *name, int32_t width)
{
    if (p->n_bufs >= PLAN_MAX_BUFS) {
        p->failed = true;
        return 0;
    }
    p->bufs[p->n_bufs].name = name;
    p->bufs[p->n_bufs].width = width;
    return p->n_bufs++;
}

struct plan_op *plan_add_op(struct plan *p, enum op_kind kind, int32_t layer)
{
    if (p->n_ops == p->cap_ops) {
        struct plan_op *n = xrealloc(p->ops, (size_t)p->cap_ops * 2, sizeof(*n));
        if (!n) {
            p->failed = true;
            return &p->sink;
        }
        p->ops = n;
        p->cap_ops *= 2;
    }
    struct plan_op *op = &p->ops[p->n_ops++];
    memset(op, 0, sizeof(*op));
    op->kind = kind;
    op->layer = layer;
    op->out = op->in = op->in2 = op->in3 = -1;
    return op;
}

/* Ops that read their output buffer (they update it in place). */
static bool op_is_inplace(enum op_kind k)
{
    return k == OP_ADD || k == OP_SWIGLU || k == OP_GDN_CONV || k == OP_GATED_RMSNORM ||
           k == OP_SIGMOID_GATE || k == OP_QK_NORM_ROPE;
}

bool plan_op_reads(const struct plan_op *op, int32_t buf)
{
    return op->in == buf || op->in2 == buf || op->in3 == buf ||
           (op->out == buf && op_is_inplace(op->kind));
}

bool plan_matmul_add_fusable(const struct plan *p, int32_t i)
{
    const struct plan_op *op = &p->ops[i];
    return op->kind == OP_MATMUL && i + 1 < p->n_ops && p->ops[i + 1].kind == OP_ADD &&
           p->ops[i + 1].in == op->out && p->ops[i + 1].out != op->out && op->in != p->ops[i + 1].out &&
           plan_buf_dead_after(p, op->out, i + 2);
}

bool plan_buf_dead_after(const struct plan *p, int32_t buf, int32_t from)
{
    for (int32_t i = from; i < p->n_ops; i++) {
        if (plan_op_reads(&p->ops[i], buf))
            return false;
        if (p->ops[i].out == buf)
            return true;
    }
    return true;
}
