/*
 * prefill_merge.c — the CUDA backend's merged prefill products: which consecutive products run
 * as one, and the buffer views their outputs become (the rules: prefill_merge.h).
 */
#include "backend/cuda/prefill_merge.h"

#include "base/alloc.h"
#include "base/error.h"

bool merge_strided_kind(enum op_kind k)
{
    return k == OP_MATMUL || k == OP_LOGITS || k == OP_RMSNORM || k == OP_QK_NORM_ROPE ||
           k == OP_ATTENTION || k == OP_SIGMOID_GATE || k == OP_SWIGLU || k == OP_GDN_CONV ||
           k == OP_GDN_CORE || k == OP_GATED_RMSNORM;
}

/* How many products from op i (a product) would merge: same input, dtype, K and row size, each
 * one's weights right after the previous one's, distinct outputs as wide as their products,
 * none of them the input or the logits, the last one not accumulated into the residual.
 * 0 when fewer than two. */
static int32_t merge_run(const struct plan *p, const struct merge_weight *wts, int32_t i)
{
    const struct plan_op *op = &p->ops[i];
    int32_t j = i + 1;
    for (; j < p->n_ops; j++) {
        const struct plan_op *o = &p->ops[j];
        const struct merge_weight *a = &wts[j - 1], *b = &wts[j];
        bool ok = o->kind == OP_MATMUL && o->in == op->in && b->dtype == a->dtype && b->K == a->K &&
                  b->row_bytes == a->row_bytes && a->w &&
                  b->w == (const void *)((const uint8_t *)a->w + (int64_t)a->N * a->row_bytes);
        for (int32_t k = i; ok && k < j; k++)
            ok = p->ops[k].out != o->out;
        if (!ok)
            break;
    }
    while (j > i && plan_matmul_add_fusable(p, j - 1)) /* its output goes into the residual */
        j--;
    for (int32_t k = i; k < j; k++) {
        int32_t b = p->ops[k].out;
        if (b < 0 || b == op->in || b == p->buf_logits || p->bufs[b].width != wts[k].N)
            return 0;
    }
    return j - i >= 2 ? j - i : 0;
}

/* Whether every op of the plan that touches a buffer in mask takes row strides. */
static bool views_safe(const struct plan *p, const bool *mask)
{
    for (int32_t k = 0; k < p->n_ops; k++) {
        const struct plan_op *o = &p->ops[k];
        int32_t refs[4] = {o->out, o->in, o->in2, o->in3};
        for (int m = 0; m < 4; m++)
            if (refs[m] >= 0 && mask[refs[m]] && !merge_strided_kind(o->kind))
                return false;
    }
    return true;
}

/* Ops [i, i + n) as one product if their outputs are all plain so far, or all already in
 * this very layout (an earlier layer's merge), and every op touching them takes strides. */
static bool merge_take(struct merge_layout *m, const struct plan *p, const struct merge_weight *wts,
                       int32_t i, int32_t n)
{
    int32_t own = p->ops[i].out, ld = 0;
    for (int32_t k = i; k < i + n; k++)
        ld += wts[k].N;
    bool all_plain = true, all_same = true, mask[PLAN_MAX_BUFS] = {false};
    for (int32_t k = i, off = 0; k < i + n; off += wts[k].N, k++) {
        int32_t b = p->ops[k].out;
        all_plain = all_plain && m->own[b] == b && m->ld[b] == p->bufs[b].width;
        all_same = all_same && m->own[b] == own && m->off[b] == off && m->ld[b] == ld;
        mask[b] = true;
    }
    if (!(all_plain || all_same) || !views_safe(p, mask))
        return false;
    for (int32_t k = i, off = 0; k < i + n; off += wts[k].N, k++) {
        int32_t b = p->ops[k].out;
        m->own[b] = own, m->off[b] = off, m->ld[b] = ld;
        m->run[k] = k == i ? n : 0;
    }
    return true;
}

qwenrt_status merge_layout_make(const struct plan *p, const struct merge_weight *wts, bool enabled,
                                struct merge_layout *out, struct qwenrt_error *err)
{
    for (int32_t b = 0; b < PLAN_MAX_BUFS; b++)
        out->own[b] = b, out->off[b] = 0, out->ld[b] = b < p->n_bufs ? p->bufs[b].width : 0;
    out->run = xcalloc((size_t)(p->n_ops > 0 ? p->n_ops : 1), sizeof(int32_t));
    if (!out->run)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory for the prefill's merge table");
    for (int32_t i = 0; i < p->n_ops; i++)
        out->run[i] = 1;
    for (int32_t i = 0; enabled && i < p->n_ops; i++) {
        int32_t n = p->ops[i].kind == OP_MATMUL ? merge_run(p, wts, i) : 0;
        if (n >= 2 && merge_take(out, p, wts, i, n))
            i += n - 1;
    }
    return QWENRT_OK;
}

void merge_layout_free(struct merge_layout *m)
{
    xfree(m->run);
    m->run = NULL;
}
