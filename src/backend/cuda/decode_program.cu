/*
 * decode_program.cu — the fused decode program: a pass over the decode plan rewrites runs of
 * ops into steps (struct step, cuda_session.cuh), each one launch or a few:
 *   rmsnorm + the matmuls reading its output   -> one GEMV with the norm fused (q|k|v in one
 *                                                 launch, DeltaNet qkv|z|b|a in one launch)
 *   matmul gate + matmul up + swiglu           -> one GEMV with the SwiGLU epilogue
 *   matmul + add (residual)                    -> one GEMV with y += epilogue
 *   qk_norm_rope + attention (+ sigmoid gate)  -> rope kernel that writes the KV cache, then
 *                                                 attention with the output gate
 *   final rmsnorm + logits                     -> one GEMV with the norm fused
 * A fusion applies only when the intermediate buffer is dead afterwards (buf_dead_after).
 * Without opt.fuse the program is the plan, op by op: the unfused twin stays runnable.
 * build_program makes the steps; finish_program adds what depends on the session's shape
 * picks (q|k|v + attention, attention + o, early reads, launches ahead, the L2 prefetch plan).
 * run_step launches one step; enqueue_decode the program; capture makes a CUDA graph of it,
 * with the token's pick on the GPU (argmax, or topk.cu + sample.cu's draw) for generation.
 */
#include "backend/cuda/cuda_session.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}

/* Op i is a DeltaNet core whose gated norm follows it (in place on the core's output). */
static bool gdn_gated_at(const struct plan *p, int32_t i)
{
    const struct plan_op *op = &p->ops[i];
    return i + 1 < p->n_ops && op->kind == OP_GDN_CORE && p->ops[i + 1].kind == OP_GATED_RMSNORM &&
           p->ops[i + 1].out == op->out && p->ops[i + 1].in != op->out &&
           p->ops[i + 1].n_v_heads == op->n_v_heads && p->ops[i + 1].v_dim == op->v_dim &&
           gdn_supports(op->k_dim, op->v_dim);
}

/* Tries the fusions at op i; fills *st and returns true when one applies. */
bool match_step(const struct plan *p, int32_t i, struct step *st)
{
    const struct plan_op *op = &p->ops[i];
    memset(st, 0, sizeof(*st));
    st->op = i;
    st->gate_op = -1;
    if (op->kind == OP_RMSNORM && op->group == bw(p, op->in) && op->in != op->out) {
        int32_t j = i + 1;
        /* the matmuls may differ in dtype (Q4_K_M's v among Q4_K q and k): run_step launches
         * them together when gemvq takes the mix, else one launch per dtype */
        while (j < p->n_ops && st->n_mm < GEMV_MAX_SEG && is_mm(&p->ops[j]) && p->ops[j].in == op->out)
            st->mm[st->n_mm++] = j++;
        if (st->n_mm == 0 || !plan_buf_dead_after(p, op->out, j))
            return false;
        st->kind = STEP_NORM_GEMV;
        st->n_ops = j - i;
        const struct plan_op *sw = j < p->n_ops ? &p->ops[j] : NULL;
        if (st->n_mm == 2 && sw && sw->kind == OP_SWIGLU && sw->out == p->ops[st->mm[0]].out &&
            p->ops[st->mm[0]].w->dtype == p->ops[st->mm[1]].w->dtype &&
            sw->in == p->ops[st->mm[1]].out && p->ops[st->mm[0]].w->ne[1] == p->ops[st->mm[1]].w->ne[1] &&
            plan_buf_dead_after(p, sw->in, j + 1)) {
            st->swiglu = true;
            st->n_ops++;
        }
        return true;
    }
    if (plan_matmul_add_fusable(p, i)) {
        st->kind = STEP_GEMV_ADD;
        st->n_ops = 2;
        return true;
    }
    if (op->kind == OP_QK_NORM_ROPE && i + 1 < p->n_ops && p->ops[i + 1].kind == OP_ATTENTION &&
        p->ops[i + 1].in == op->out && p->ops[i + 1].in2 == op->in) {
        const struct plan_op *at = &p->ops[i + 1];
        st->kind = STEP_ROPE_ATTN;
        st->n_ops = 2;
        if (i + 2 < p->n_ops && p->ops[i + 2].kind == OP_SIGMOID_GATE &&
            p->ops[i + 2].out == at->out && p->ops[i + 2].in == at->in &&
            p->ops[i + 2].q_stride == at->q_stride) {
            st->gate_op = i + 2;
            st->n_ops = 3;
        }
        return plan_buf_dead_after(p, at->in2, i + st->n_ops) && plan_buf_dead_after(p, at->in3, i + st->n_ops);
    }
    /* the DeltaNet core and its gated norm (in place on the core's output): one kernel */
    if (gdn_gated_at(p, i)) {
        st->kind = STEP_GDN_GATED;
        st->n_ops = 2;
        return true;
    }
    /* and the conv before them when every value head has its own key head: each block
     * convolves its own q, k and v channels first (18 launches fewer for Qwen3.5-0.8B) */
    if (op->kind == OP_GDN_CONV && gdn_gated_at(p, i + 1) && p->ops[i + 1].in == op->out &&
        p->ops[i + 1].n_v_heads == p->ops[i + 1].n_k_heads &&
        p->bufs[op->out].width == 2 * p->ops[i + 1].n_k_heads * p->ops[i + 1].k_dim +
                                      p->ops[i + 1].n_v_heads * p->ops[i + 1].v_dim) {
        st->kind = STEP_CONV_GDN_GATED;
        st->n_ops = 3;
        return true;
    }
    return false;
}

/* The fused MLP's arguments for st (STEP_NORM_GEMV with SwiGLU) followed by the down product
 * + residual add at plan op down (b: the decode buffers); false when mlp_fused.cu does not
 * take them (dtypes, sizes, or the intermediate read after the down product). */
static bool mlp_args_of(const struct cuda_session *cs, float *const *b, const struct step *st, int32_t down,
                        struct mlp_args *a)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const struct dop *d = cs->dops[PHASE_DECODE];
    /* st: the norm + gate|up step, or the STEP_MLP it became (two ops more) */
    int32_t n_gu = st->kind == STEP_MLP ? st->n_ops - 2 : st->n_ops;
    if ((st->kind != STEP_NORM_GEMV && st->kind != STEP_MLP) || !st->swiglu || !plan_matmul_add_fusable(p, down))
        return false;
    const struct plan_op *norm = &p->ops[st->op], *sw = &p->ops[st->op + n_gu - 1];
    const struct plan_op *mm = &p->ops[down], *add = &p->ops[down + 1];
    const struct dop *g = &d[st->mm[0]], *u = &d[st->mm[1]], *dn = &d[down];
    if (down != st->op + n_gu || mm->in != sw->out || !plan_buf_dead_after(p, sw->out, down + 2) ||
        g->dtype != u->dtype || g->dtype != dn->dtype || g->K != dn->N || g->N != dn->K ||
        g->row_bytes != (int64_t)g->K * 2 || u->row_bytes != g->row_bytes)
        return false;
    memset(a, 0, sizeof(*a));
    a->in.x = b[norm->in], a->in.ldx = bw(p, norm->in), a->in.K = g->K, a->in.T = 1;
    a->in.norm_w = d[st->op].vec, a->in.eps = norm->eps, a->in.dtype = g->dtype;
    a->w_gate = g->w, a->w_up = u->w, a->w_down = dn->w, a->down_row_bytes = dn->row_bytes;
    a->H = g->K, a->I = g->N, a->dtype = g->dtype;
    a->y = b[add->out], a->part = cs->mlp_part, a->count = cs->mlp_count;
    a->rows = cs->opt.mlp_rows > 0 ? cs->opt.mlp_rows : 0, a->n_sm = cs->n_sm, a->pdl = cs->decode_pdl;
    a->cluster = cs->opt.mlp_rows_cluster, a->down_regs = cs->opt.mlp_rows_down == 1;
    a->acc = cs->mlp_acc; /* (NULL before merge_mlp_steps allocates it: the shapes are checked without it) */
    if (a->rows == 3) /* the residual as the GEMV + residual before stored its copy */
        a->in.x = (const float *)a->acc, a->in.ldx = a->H;
    return a->rows ? mlp_rows_applies(a, cs->cc_major) : mlp_fused_applies(a, cs->cc_major);
}

/* mlp_rows 3: whether step prev, the one before a STEP_MLP whose norm reads the residual
 * buffer `residual`, is a GEMV + residual into that buffer whose kernel stores the copy the MLP
 * reads (gemv_smem / gemv_mma: 16-bit rows, launch_gemv's rules). */
static bool gemv_add_takes_copy(const struct cuda_session *cs, const struct step *prev, int32_t residual)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    if (prev->kind != STEP_GEMV_ADD || p->ops[prev->op + 1].out != residual)
        return false;
    const struct dop *d = &cs->dops[PHASE_DECODE][prev->op];
    const struct plan_op *mm = &p->ops[prev->op];
    struct gemv_args a;
    memset(&a, 0, sizeof(a));
    a.x = cs->dbufs[mm->in], a.ldx = bw(p, mm->in), a.K = d->K, a.T = 1, a.dtype = d->dtype;
    a.mode = GEMV_ACCUM, a.n_seg = 1;
    a.seg[0].w = d->w, a.seg[0].N = d->N, a.seg[0].row_bytes = d->row_bytes;
    a.seg[0].y = cs->dbufs[residual], a.seg[0].ldy = bw(p, residual);
    gemv_session_args(cs, true, &a);
    return !gemvq_applies(&a) && gemv_smem_applies(&a);
}

/* Merges each STEP_NORM_GEMV with SwiGLU and the down product + residual after it into one
 * STEP_MLP where the fused kernel applies; allocates its partial sums and counter. */
static qwenrt_status merge_mlp_steps(struct cuda_session *cs, struct qwenrt_error *err)
{
    int32_t n = 0, hidden = 0;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        struct step *st = &cs->steps[i];
        struct mlp_args a;
        if (i + 1 < cs->n_steps && cs->steps[i + 1].kind == STEP_GEMV_ADD &&
            mlp_args_of(cs, cs->dbufs, st, cs->steps[i + 1].op, &a) &&
            (cs->opt.mlp_rows != 3 ||
             (n > 0 && gemv_add_takes_copy(cs, &cs->steps[n - 1], cs->plans[PHASE_DECODE].ops[st->op].in)))) {
            if (cs->opt.mlp_rows == 3)
                cs->steps[n - 1].copy_out = true;
            struct step m = *st;
            m.kind = STEP_MLP;
            m.mm[2] = cs->steps[++i].op;
            m.n_ops += 2;
            cs->steps[n++] = m;
            hidden = a.H > hidden ? a.H : hidden;
        } else {
            cs->steps[n++] = *st;
        }
    }
    cs->n_steps = n;
    if (!hidden)
        return QWENRT_OK;
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->mlp_part, (size_t)MLPF_MAX_CLUSTERS * hidden * sizeof(float)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->mlp_count, 2 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->mlp_count, 0, 2 * sizeof(unsigned)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->mlp_acc, (size_t)hidden * 8));
    CUDA_CHECK(cudaMemset(cs->mlp_acc, 0, (size_t)hidden * 8));
    return QWENRT_OK;
}

/* Merges each norm + q|k|v step and the rope + attention step after it into one
 * STEP_QKV_ATTN where cuda_options.qkv_attn asks for it and qkv_attention.cu takes the pair
 * (sm_90; q, k and v read by nothing after the attention). Runs once the GEMV shapes are
 * picked (the launch's arguments carry them). */
static void merge_qkv_attn_steps(struct cuda_session *cs)
{
    if (!cs->opt.qkv_attn || cs->cc_major < 9)
        return;
    const struct plan *p = &cs->plans[PHASE_DECODE];
    struct run_ctx r = decode_ctx(cs);
    int32_t n = 0;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        struct step *st = &cs->steps[i], *nx = i + 1 < cs->n_steps ? &cs->steps[i + 1] : NULL;
        if (st->kind == STEP_NORM_GEMV && !st->swiglu && st->n_mm == 3 && nx && nx->kind == STEP_ROPE_ATTN &&
            nx->gate_op < 0 && nx->op == st->op + st->n_ops &&
            plan_buf_dead_after(p, p->ops[nx->op + 1].in, nx->op + nx->n_ops)) {
            struct gemv_args g;
            struct rope_args ra;
            struct attn_args a;
            norm_gemv_args(&r, st, g);
            rope_attn_args(&r, nx->op, -1, ra, a);
            if (qkv_attention_applies(&g, &a, cs->opt.qkv_attn)) {
                struct step m = *st;
                m.kind = STEP_QKV_ATTN;
                m.rope_op = nx->op;
                m.n_ops += nx->n_ops;
                cs->steps[n++] = m;
                i++;
                continue;
            }
        }
        cs->steps[n++] = *st;
    }
    cs->n_steps = n;
}

/* The fused attention + o product's arguments for st (a STEP_ROPE_ATTN, or the STEP_ATTN_O it
 * became) followed by the o product + residual at plan op mm; false when attn_o.cu does not
 * take them (the attention output read after the product, weights not 16-bit, sizes). */
static bool attn_o_args_at(struct run_ctx *r, const struct step *st, int32_t mm, struct attn_o_args *a)
{
    struct cuda_session *cs = r->cs;
    const struct plan *p = r->p;
    const struct plan_op *at = &p->ops[st->op + 1];
    if (!plan_matmul_add_fusable(p, mm) || p->ops[mm].in != at->out || !plan_buf_dead_after(p, at->out, mm + 1))
        return false;
    const struct dop *d = &r->d[mm];
    struct rope_args ra;
    memset(a, 0, sizeof(*a));
    rope_attn_args(r, st->op, st->gate_op, ra, a->t);
    a->w = d->w, a->row_bytes = d->row_bytes, a->dtype = d->dtype, a->N = d->N;
    a->y = r->b[p->ops[mm + 1].out];
    a->part = cs->ao_part, a->count = cs->ao_count;
    a->cluster = cs->opt.attn_o == 1 ? 0 : cs->opt.attn_o;
    a->single = cs->opt.attn_o_single ? cs->opt.attn_o_single : 64;
    return d->K == at->n_head * at->head_dim && d->row_bytes == (int64_t)d->K * 2 && attn_o_applies(a);
}

static bool attn_o_args_of(struct run_ctx *r, const struct step *st, struct attn_o_args *a)
{
    return st->kind == STEP_ATTN_O && attn_o_args_at(r, st, st->mm[0], a);
}

/* Merges each rope + attention step and the o product + residual step after it into one
 * STEP_ATTN_O where cuda_options.attn_o asks for it and attn_o.cu takes the pair (sm_90);
 * allocates their partial sums and counters. */
static qwenrt_status merge_attn_o_steps(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (!cs->opt.attn_o || cs->cc_major < 9)
        return QWENRT_OK;
    struct run_ctx r = decode_ctx(cs);
    int32_t n = 0;
    int64_t part = 0;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        struct step *st = &cs->steps[i], *nx = i + 1 < cs->n_steps ? &cs->steps[i + 1] : NULL;
        struct attn_o_args a;
        if (st->kind == STEP_ROPE_ATTN && nx && nx->kind == STEP_GEMV_ADD && attn_o_args_at(&r, st, nx->op, &a)) {
            struct step m = *st;
            m.kind = STEP_ATTN_O;
            m.mm[0] = nx->op;
            m.n_ops += nx->n_ops;
            cs->steps[n++] = m;
            part = (int64_t)a.t.n_head * a.N > part ? (int64_t)a.t.n_head * a.N : part;
            i++;
            continue;
        }
        cs->steps[n++] = *st;
    }
    cs->n_steps = n;
    if (!part)
        return QWENRT_OK;
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->ao_part, (size_t)part * sizeof(float)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->ao_count, 16 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->ao_count, 0, 16 * sizeof(unsigned)));
    return QWENRT_OK;
}

/* cuda_options.gemv_launch_ahead: a GEMV + residual step (o, out_proj, down) whose next step
 * is a fused-norm GEMV — 1: only the SwiGLU pair (gate|up), 2: any (also q|k|v and the DeltaNet
 * input after down), 3: any but gate|up — starts that launch before its own wait, so that the
 * next launch's blocks copy their rows while this one still waits for its input (the
 * attention, or the DeltaNet step). 0, the session's pick, for 16-bit rows (gemv_smem): before
 * q|k|v / in_proj always, before gate|up only in the cluster-merged attention's graphs (there
 * Qwen3-0.6B BF16 gains +4.6% at depth 1,024 with it, +1.2% without; at depth 0 it loses 1.3%
 * with it, and at 4,096 the attention's 512 split blocks lose room to gate|up's early blocks:
 * H200, session 28); 3 for K-quant rows (Qwen3-0.6B Q4_K_M +1.3%), none for Q8_0 rows (-0.5%
 * with 3, -4.3% with 2). Safe for the early reads above: a step that reads before its wait
 * relies on the launch before it waiting first, and those launches (q|k|v, in_proj) are not
 * GEMV + residual steps; completion stays transitive because every kernel waits before it
 * exits. */
static void mark_launch_ahead(struct cuda_session *cs)
{
    const int32_t opt = cs->opt.gemv_launch_ahead;
    if (!cs->decode_pdl || opt < 0)
        return;
    const struct dop *d = cs->dops[PHASE_DECODE];
    for (int32_t i = 0; i + 1 < cs->n_steps; i++) {
        const struct step *st = &cs->steps[i], *next = &cs->steps[i + 1];
        if (st->kind != STEP_GEMV_ADD || (next->kind != STEP_NORM_GEMV && next->kind != STEP_MLP))
            continue; /* (a STEP_MLP keeps its swiglu mark: it starts as gate|up does) */
        bool rows16 = d[st->op].dtype == QR_BF16 || d[st->op].dtype == QR_F16;
        bool k_quant = d[st->op].dtype == QR_Q4_K || d[st->op].dtype == QR_Q6_K;
        if (!opt) { /* the pick */
            cs->steps[i].ahead = (rows16 || k_quant) && !next->swiglu;
            cs->steps[i].ahead_cl = rows16 && next->swiglu;
            continue;
        }
        cs->steps[i].ahead = opt == 2 || (opt == 1 && next->swiglu) || (opt == 3 && !next->swiglu);
    }
}

/* Marks the steps that may read state before griddep_wait: the attention (attn_args.early:
 * the position and its first cached K/V rows) and the DeltaNet step (gdn_args.early: its
 * recurrent state). Allowed where the step before is one norm + GEMV launch whose kernel
 * (gemvq, or gemv_smem) calls griddep_launch only after its own griddep_wait: when the step
 * starts, that launch has passed its wait, so the launch before it has finished, and with it
 * every earlier one (each finishes only after its own wait) — the argmax that wrote the
 * position, the earlier steps that wrote the cached rows, the same layer's DeltaNet step of
 * the token before. Where the GEMV would start its successor before its wait (the session's
 * pick for 16-warp blocks), the option's value 1 makes that one launch wait first
 * (step.after_wait) so that the step after it may read early. Not with knock-outs
 * (omit_steps: the step before may be missing) nor without PDL. */
static void mark_early_reads(struct cuda_session *cs)
{
    if (!cs->decode_pdl || (cs->opt.omit_steps && *cs->opt.omit_steps))
        return;
    struct run_ctx r = decode_ctx(cs);
    for (int32_t i = 1; i < cs->n_steps; i++) {
        struct step *st = &cs->steps[i], *prev = &cs->steps[i - 1];
        bool gdn = st->kind == STEP_GDN_GATED || st->kind == STEP_CONV_GDN_GATED;
        /* want: -1 never, 0 where the launch before already waits first, 1 also where it must */
        bool attn = st->kind == STEP_ROPE_ATTN || st->kind == STEP_ATTN_O;
        int32_t want = gdn ? (cs->opt.gdn_early < 0 ? -1 : 1) : attn ? cs->opt.attn_early : -1;
        if (want < 0 || prev->kind != STEP_NORM_GEMV)
            continue;
        struct gemv_args g;
        norm_gemv_args(&r, prev, g);
        bool q = gemvq_applies(&g); /* launch_gemv's order: gemvq, gemv_smem, gemv2 */
        if ((g.k_mixed && !q) || (!q && !gemv_smem_applies(&g)))
            continue; /* one launch per dtype, or gemv2: not one kernel that waits first */
        bool waits_first = q ? g.q_after_wait : g.smem_after_wait;
        if (!waits_first && want == 1)
            prev->after_wait = waits_first = true;
        st->early = waits_first;
    }
}

/* The weight matrices a decode step streams (n of them, at most GEMV_MAX_SEG), in its order;
 * none for the LM head (hundreds of MB: no L2 holds it ahead, it streams well alone). */
static int32_t step_weights(const struct cuda_session *cs, const struct step *st, const struct dop **out)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const struct dop *d = cs->dops[PHASE_DECODE];
    int32_t n = 0;
    switch (st->kind) {
    case STEP_NORM_GEMV:
    case STEP_QKV_ATTN:
    case STEP_MLP:
        for (int32_t k = 0; k < st->n_mm + (st->kind == STEP_MLP); k++) {
            if (p->ops[st->mm[k]].kind == OP_LOGITS)
                return 0;
            out[n++] = &d[st->mm[k]];
        }
        return n;
    case STEP_GEMV_ADD:
        out[0] = &d[st->op];
        return 1;
    case STEP_ATTN_O:
        out[0] = &d[st->mm[0]];
        return 1;
    default:
        return 0;
    }
}

/* Whether the step's launch issues its l2_range (the kernels that call l2_prefetch_share). */
static bool step_prefetches(const struct step *st)
{
    return st->kind == STEP_NORM_GEMV || st->kind == STEP_GEMV_ADD || st->kind == STEP_ROPE_ATTN ||
           st->kind == STEP_QKV_ATTN || st->kind == STEP_GDN_GATED || st->kind == STEP_CONV_GDN_GATED ||
           st->kind == STEP_ATTN_O;
}

/* cuda_options.l2_prefetch_mb: each step whose launch can issue a prefetch asks the L2 for
 * the layers' weights up to that many MB past its own start (l2_plan.h has the rule; the LM
 * head is left out of the stream: it would evict what was fetched for the next token). */
static qwenrt_status plan_l2_prefetch(struct cuda_session *cs, struct qwenrt_error *err)
{
    for (int32_t i = 0; i < cs->n_steps; i++)
        memset(&cs->steps[i].pf, 0, sizeof(cs->steps[i].pf));
    if (cs->opt.l2_prefetch_mb <= 0 || cs->cc_major < 9)
        return QWENRT_OK;
    struct l2_piece *pieces = (struct l2_piece *)xcalloc((size_t)cs->n_steps * GEMV_MAX_SEG + 1, sizeof(*pieces));
    struct l2_step *steps = (struct l2_step *)xcalloc((size_t)cs->n_steps + 1, sizeof(*steps));
    struct l2_span *spans = (struct l2_span *)xcalloc((size_t)cs->n_steps + 1, sizeof(*spans));
    if (!pieces || !steps || !spans) {
        xfree(pieces), xfree(steps), xfree(spans);
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    }
    int32_t n_pieces = 0;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        const struct dop *own[GEMV_MAX_SEG + 1];
        steps[i].n_pieces = step_weights(cs, &cs->steps[i], own);
        steps[i].issues = step_prefetches(&cs->steps[i]);
        for (int32_t k = 0; k < steps[i].n_pieces; k++, n_pieces++)
            pieces[n_pieces].w = own[k]->w, pieces[n_pieces].bytes = (int64_t)own[k]->N * own[k]->row_bytes;
    }
    l2_plan_make(pieces, steps, cs->n_steps, (int64_t)cs->opt.l2_prefetch_mb << 20, spans);
    for (int32_t i = 0; i < cs->n_steps; i++)
        cs->steps[i].pf.p = spans[i].p, cs->steps[i].pf.bytes = spans[i].bytes;
    xfree(pieces), xfree(steps), xfree(spans);
    return QWENRT_OK;
}

/* Each label of cuda_options.omit_steps must name a step of the program (or "argmax"): a
 * misspelt one would time the whole step and call it a difference. */
static qwenrt_status check_omitted_labels(const struct cuda_session *cs, struct qwenrt_error *err)
{
    for (const char *p = cs->opt.omit_steps; p && *p; p += *p == ';') {
        size_t len = strcspn(p, ";");
        bool found = len == 6 && !strncmp(p, "argmax", 6);
        for (int32_t i = 0; i < cs->n_steps && !found; i++) {
            const char *l = step_label(&cs->plans[PHASE_DECODE], &cs->steps[i]);
            found = strlen(l) == len && !strncmp(p, l, len);
        }
        if (!found)
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "cuda: omit_steps names \"%.*s\", which is no step of this decode program",
                           (int)len, p);
        p += len;
    }
    return QWENRT_OK;
}

/* The decode plan as steps (cs->steps): each run of ops that match_step fuses as one step,
 * with opt.fuse, and the MLP merges where the options ask for them. */
qwenrt_status build_program(struct cuda_session *cs, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    cs->steps = (struct step *)xcalloc((size_t)p->n_ops, sizeof(struct step));
    if (!cs->steps)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    for (int32_t i = 0; i < p->n_ops;) {
        struct step *st = &cs->steps[cs->n_steps++];
        if (!cs->opt.fuse || !match_step(p, i, st)) {
            memset(st, 0, sizeof(*st));
            st->kind = STEP_OP;
            st->op = i;
            st->n_ops = 1;
            st->gate_op = -1;
        }
        i += st->n_ops;
    }
    qwenrt_status st =
        cs->opt.fuse && (cs->opt.mlp_fused || cs->opt.mlp_rows > 0) ? merge_mlp_steps(cs, err) : QWENRT_OK;
    return st ? st : check_omitted_labels(cs, err);
}

/* STEP_NORM_GEMV: the norm fused into the GEMV of the matmuls reading it. Matmuls of one
 * dtype go in one launch; a mix goes in one launch when gemvq takes it (Q4_K with Q6_K),
 * else in one launch per run of equal dtype, each with the norm fused. */
void norm_gemv_args(struct run_ctx *r, const struct step *st, struct gemv_args &a)
{
    const struct plan *p = r->p;
    const struct plan_op *op = &p->ops[st->op];
    memset(&a, 0, sizeof(a));
    a.x = r->b[op->in], a.ldx = bw(p, op->in), a.K = r->d[st->mm[0]].K, a.T = r->T;
    a.norm_w = r->d[st->op].vec, a.eps = op->eps, a.dtype = r->d[st->mm[0]].dtype;
    a.mode = st->swiglu ? GEMV_SWIGLU : GEMV_STORE;
    a.n_seg = st->n_mm;
    gemv_session_args(r->cs, r->pdl, &a);
    for (int k = 0; k < st->n_mm; k++) {
        const struct dop *d = &r->d[st->mm[k]];
        const struct plan_op *m = &p->ops[st->mm[k]];
        a.seg[k].w = d->w, a.seg[k].N = d->N, a.seg[k].row_bytes = d->row_bytes;
        a.seg[k].y = r->b[m->out], a.seg[k].ldy = bw(p, m->out), a.seg[k].dtype = d->dtype;
        a.k_mixed |= d->dtype != a.dtype;
    }
    a.pf = st->pf;
    a.stamps = r->stamps;
    if (st->after_wait)
        a.smem_after_wait = a.q_after_wait = true;
}

static qwenrt_status run_norm_gemv(struct run_ctx *r, const struct step *st, struct qwenrt_error *err)
{
    struct gemv_args a;
    norm_gemv_args(r, st, a);
    if (!a.k_mixed || gemvq_applies(&a) || (a.batch && gemvq_batch_applies(&a)) ||
        (a.batch && a.batch_mma && a.q_int8 && gemvq_batch_mma_applies(&a))) {
        CUDA_CHECK(launch_gemv(&a, r->stream));
        return QWENRT_OK;
    }
    struct gemv_args one = a; /* one launch per run of equal dtype */
    one.k_mixed = false;
    for (int k = 0; k < a.n_seg;) {
        int n = 1;
        while (k + n < a.n_seg && a.seg[k + n].dtype == a.seg[k].dtype)
            n++;
        one.dtype = a.seg[k].dtype, one.n_seg = n;
        memcpy(one.seg, a.seg + k, (size_t)n * sizeof(a.seg[0]));
        CUDA_CHECK(launch_gemv(&one, r->stream));
        one.pf.bytes = 0; /* the first launch asked for it */
        k += n;
    }
    return QWENRT_OK;
}

/* cuda_options.attn_shared_kv for the attention a (its kernel takes it where
 * attention_shared_kv_applies): the RoPE-inside attention outside the cluster-merged graphs. */
bool shared_kv_on(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->opt.attn_shared_kv > 0;
}

/* cuda_options.attn_lanes for the attention a (attn_args.lanes: 0 for a row per warp; its
 * kernel takes it where attention_lanes_applies): the RoPE-inside attention outside the
 * cluster-merged graphs. */
int32_t lanes_of(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->opt.attn_lanes != 32 ? cs->opt.attn_lanes : 0;
}

/* cuda_options.attn_stage for the attention a (attn_args.stages: the ring's tiles, 0 for none;
 * its kernel takes it where attention_staged_applies): the RoPE-inside attention outside the
 * cluster-merged graphs, on sm_90 (bulk copies). */
int32_t stages_of(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->cc_major >= 9 && cs->opt.attn_stage > 0 ? cs->opt.attn_stage : 0;
}

/* The arguments of a STEP_ROPE_ATTN at rope op i (gate: its sigmoid_gate op or -1): the rope
 * launch's, and the attention's with the norm + RoPE inside when cuda_options.attn_rope (a.rope). */
void rope_attn_args(struct run_ctx *r, int32_t i, int32_t gate, struct rope_args &ra, struct attn_args &a)
{
    struct cuda_session *cs = r->cs;
    const struct plan *p = r->p;
    float **b = r->b;
    const struct plan_op *op = &p->ops[i], *at = &p->ops[i + 1];
    const struct dop *d = &r->d[i];
    memset(&ra, 0, sizeof(ra));
    ra.q = b[op->out], ra.k = b[op->in], ra.v = b[at->in3];
    ra.ldq = bw(p, op->out), ra.ldk = bw(p, op->in), ra.ldv = bw(p, at->in3);
    ra.wq = d->vec, ra.wk = d->vec2, ra.n_head = op->n_head, ra.n_head_kv = op->n_head_kv;
    ra.hd = op->head_dim, ra.q_stride = op->q_stride, ra.n_rot = op->n_rot;
    ra.theta = op->rope_theta, ra.eps = op->eps, ra.pos0 = cs->d_pos, ra.T = 1;
    ra.inv_freq = rope_table(cs, op);
    ra.kc = cs->kc[at->layer], ra.vc = cs->vc[at->layer], ra.kvw = cs->kv_width;
    ra.kv_f16 = cs->opt.kv_f16;
    ra.pdl = r->pdl;
    memset(&a, 0, sizeof(a));
    a.out = b[at->out], a.q = b[at->in], a.kc = cs->kc[at->layer], a.vc = cs->vc[at->layer];
    a.ldo = bw(p, at->out), a.ldq = bw(p, at->in), a.q_stride = at->q_stride;
    a.kvw = cs->kv_width, a.n_head = at->n_head, a.n_head_kv = at->n_head_kv;
    a.hd = at->head_dim, a.pos0 = cs->d_pos, a.T = 1, a.gate = gate >= 0;
    a.pdl = r->pdl, a.kv_f16 = cs->opt.kv_f16;
    a.splits = cs->att_splits, a.part = cs->att_part, a.count = cs->att_count;
    a.split_min = cs->opt.attn_split_min, a.one_split = cs->opt.attn_one_split;
    attn_window(cs, a);
    /* the norm + RoPE inside the attention kernel (one launch) when the attention reads
     * the q that the rope op rotates in place */
    a.rope = cs->opt.attn_rope && ra.q == a.q;
    a.pipe = a.rope && cs->opt.attn_pipe > 0;
    a.cluster_merge = a.rope && cs->cl_variant == 1 && cs->cc_major >= 9;
    a.shared_kv = shared_kv_on(cs, a);
    a.lanes = lanes_of(cs, a);
    a.stages = stages_of(cs, a);
    a.n_ctx = cs->n_ctx;
    a.rope_regs = a.rope && cs->opt.attn_rope_regs == 1 && attention_rope_regs_applies(a.hd, ra.n_rot);
    if (a.rope) {
        a.rk = ra.k, a.rv = ra.v, a.wq = ra.wq, a.wk = ra.wk, a.n_rot = ra.n_rot;
        a.theta = ra.theta, a.eps = ra.eps, a.inv_freq = ra.inv_freq;
    }
}

qwenrt_status run_step(struct run_ctx *r, const struct step *st, struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    const struct plan *p = r->p;
    float **b = r->b;
    const struct plan_op *op = &p->ops[st->op];
    r->pf = &st->pf;
    switch (st->kind) {
    case STEP_OP:
        return run_op(r, st->op, err);
    case STEP_NORM_GEMV:
        return run_norm_gemv(r, st, err);
    case STEP_MLP: {
        struct mlp_args a;
        if (!mlp_args_of(cs, b, st, st->mm[2], &a))
            return err_set(err, QWENRT_ERR_INTERNAL, "cuda: the fused MLP no longer applies");
        CUDA_CHECK(a.rows ? launch_mlp_rows(&a, r->stream) : launch_mlp_fused(&a, r->stream));
        return QWENRT_OK;
    }
    case STEP_GDN_GATED: /* the core, then its gated norm in the same kernel */
    case STEP_CONV_GDN_GATED: { /* (the conv first) */
        int32_t core = st->kind == STEP_CONV_GDN_GATED ? st->op + 1 : st->op;
        const struct plan_op *gn = &p->ops[core + 1];
        struct gdn_args a = gdn_args_of(r, core, 1);
        a.z = b[gn->in], a.ldz = bw(p, gn->in), a.gnorm_w = r->d[core + 1].vec, a.geps = gn->eps;
        a.split = cs->opt.gdn_split && cs->cc_major >= 9;
        a.staged = cs->opt.gdn_staged == 1;
        a.wide = cs->opt.gdn_wide == 1;
        a.pf = st->pf, a.stamps = r->stamps;
        a.early = st->early && r->pdl;
        if (st->kind == STEP_CONV_GDN_GATED) {
            a.conv_state = cs->conv[op->layer], a.conv_taps = r->d[st->op].vec;
            a.conv_C = bw(p, op->out), a.conv_k = op->conv_k;
        }
        CUDA_CHECK(launch_gdn_core(&a, r->stream));
        return QWENRT_OK;
    }
    case STEP_GEMV_ADD: {
        const struct plan_op *add = &p->ops[st->op + 1];
        r->ahead = st->ahead || (st->ahead_cl && cs->cl_variant == 1);
        r->y_copy = st->copy_out ? (float *)cs->mlp_acc : NULL;
        qwenrt_status s = run_matmul(r, &r->d[st->op], b[op->in], bw(p, op->in), b[add->out], bw(p, add->out), r->T,
                                     true, err);
        r->ahead = false, r->y_copy = NULL;
        return s;
    }
    case STEP_ROPE_ATTN: {
        struct rope_args ra;
        struct attn_args a;
        rope_attn_args(r, st->op, st->gate_op, ra, a);
        a.early = st->early && a.rope && r->pdl;
        a.pf = st->pf, a.stamps = r->stamps;
        if (!a.rope)
            CUDA_CHECK(launch_qk_norm_rope(&ra, r->stream));
        CUDA_CHECK(launch_attention(&a, r->stream));
        return QWENRT_OK;
    }
    case STEP_ATTN_O: {
        struct attn_o_args a;
        if (!attn_o_args_of(r, st, &a))
            return err_set(err, QWENRT_ERR_INTERNAL, "cuda: the fused attention + o product no longer applies");
        a.t.early = st->early && r->pdl;
        a.t.pf = st->pf, a.t.stamps = r->stamps;
        CUDA_CHECK(launch_attn_o(&a, r->stream));
        return QWENRT_OK;
    }
    case STEP_QKV_ATTN: {
        struct gemv_args g;
        struct rope_args ra;
        struct attn_args a;
        norm_gemv_args(r, st, g);
        rope_attn_args(r, st->rope_op, -1, ra, a);
        CUDA_CHECK(launch_qkv_attention(&g, &a, cs->opt.qkv_attn, r->stream));
        return QWENRT_OK;
    }
    }
    return err_set(err, QWENRT_ERR_INTERNAL, "cuda: bad step kind");
}

/* true when cuda_options.omit_steps (a measurement) names label. */
static bool step_omitted(const struct cuda_session *cs, const char *label)
{
    size_t n = strlen(label);
    for (const char *p = cs->opt.omit_steps; p && *p; p += *p == ';') {
        size_t len = strcspn(p, ";");
        if (len == n && !strncmp(p, label, n))
            return true;
        p += len;
    }
    return false;
}

/* Enqueues the first n steps of the decode program. */
static qwenrt_status enqueue_steps(struct cuda_session *cs, int32_t n, struct qwenrt_error *err)
{
    struct run_ctx r = decode_ctx(cs);
    for (int32_t i = 0; i < n; i++) {
        if (step_omitted(cs, step_label(r.p, &cs->steps[i])))
            continue;
        r.stamps = cs->tl ? cs->tl + (size_t)i * TL_MAX_BLOCKS * TL_SLOTS : NULL;
        qwenrt_status st = run_step(&r, &cs->steps[i], err);
        if (st)
            return st;
    }
    return QWENRT_OK;
}

/* Enqueues one decode step (the program, or the plan op by op). */
qwenrt_status enqueue_decode(struct cuda_session *cs, struct qwenrt_error *err)
{
    return enqueue_steps(cs, cs->n_steps, err);
}

/* ---- the greedy loop's screened LM head (lm_screen.cuh) ---- */

/* The index of the program's last step when the screen can stand in for it and the argmax
 * after it: the final norm and the LM head in one GEMV, over rows the screen takes; else -1
 * (also while steps are left out for a measurement). */
static int32_t screen_step(const struct cuda_session *cs, struct lm_screen_args *a)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const struct dop *d = cs->dops[PHASE_DECODE];
    if (cs->n_steps < 1 || (cs->opt.omit_steps && *cs->opt.omit_steps))
        return -1;
    const int32_t i = cs->n_steps - 1;
    const struct step *st = &cs->steps[i];
    if (st->kind != STEP_NORM_GEMV || st->n_mm != 1 || st->swiglu || p->ops[st->mm[0]].kind != OP_LOGITS)
        return -1;
    const struct plan_op *norm = &p->ops[st->op];
    const struct dop *lm = &d[st->mm[0]];
    memset(a, 0, sizeof(*a));
    a->h = cs->dbufs[norm->in], a->norm_w = d[st->op].vec, a->eps = norm->eps;
    a->w = lm->w, a->dtype = lm->dtype, a->row_bytes = lm->row_bytes;
    a->ids = cs->d_ids, a->pos0 = cs->d_pos, a->out_ids = cs->d_out, a->step = cs->d_step;
    a->pdl = cs->decode_pdl;
    return lm->N == cs->n_vocab && lm_screen_applies(lm->dtype, lm->N, lm->K, lm->row_bytes, lm->w, a->h, a->norm_w)
               ? i
               : -1;
}

qwenrt_status lm_screen_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    (void)err;
    if (cs->screen_tried)
        return QWENRT_OK;
    cs->screen_tried = true;
    struct lm_screen_args a;
    int32_t i = cs->opt.lm_screen && cs->opt.graph && !cs->mk ? screen_step(cs, &a) : -1;
    if (i < 0)
        return QWENRT_OK;
    const struct dop *lm = &cs->dops[PHASE_DECODE][cs->steps[i].mm[0]];
    const struct lm_screen_copy *copy =
        weights_screen_copy(cs->weights, lm->w, lm->dtype, lm->N, lm->K, lm->row_bytes, cs->stream);
    struct qwenrt_error why;
    if (copy && lm_screen_attach(copy, cs->opt.allocs, cs->stream, &cs->screen, &why))
        cudaGetLastError(); /* no room for the session's buffers: the plain head serves */
    return QWENRT_OK;
}

bool lm_screen_takes(const struct cuda_session *cs, int gen, struct lm_screen_args *a)
{
    if (!cs->screen || screen_step(cs, a) < 0)
        return false;
    return gen == GEN_ARGMAX || (gen == GEN_SAMPLE && cs->opt.lm_screen == 2 && cs->samp_m >= 1 &&
                                 cs->samp_m <= lm_screen_best_limit(cs->screen));
}

qwenrt_status enqueue_last_logits(struct cuda_session *cs, struct qwenrt_error *err)
{
    struct run_ctx r = decode_ctx(cs);
    return run_step(&r, &cs->steps[cs->n_steps - 1], err);
}

qwenrt_status session_row_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (!cs->last_row)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no logits yet (nothing has run)");
    if (!cs->row_stale)
        return QWENRT_OK;
    qwenrt_status st = enqueue_last_logits(cs, err);
    if (!st)
        cs->row_stale = false, cs->unsynced = true; /* a pick or step on another stream waits for it */
    return st;
}

/* The attention variant for a graph launch of n decode steps from position pos: 1 (the
 * cluster-merged splits) where cl_mode says so for every one of them, else 0. */
int attn_variant(const struct cuda_session *cs, int32_t pos, int32_t n)
{
    if (cs->cl_mode == 1)
        return 1;
    return cs->cl_mode == 2 && pos >= cs->cl_from && pos + n <= cs->cl_until;
}

/* cuda_options.attn_cluster 0: the window where every attention op has at least 16 query
 * heads (8 blocks each: 128 or more blocks), else never; -1 never, 1 always, 2 the window. */
static int32_t pick_cl_mode(const struct cuda_session *cs)
{
    if (cs->cc_major < 9 || cs->opt.attn_cluster < 0)
        return 0;
    if (cs->opt.attn_cluster > 0)
        return cs->opt.attn_cluster;
    const struct plan *p = &cs->plans[PHASE_DECODE];
    int32_t heads = 0;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_ATTENTION)
            heads = heads == 0 || p->ops[i].n_head < heads ? p->ops[i].n_head : heads;
    return heads >= 16 ? 2 : 0;
}

/* The token after one decode step, chosen on the GPU (mode GEN_ARGMAX or GEN_SAMPLE). */
static cudaError_t enqueue_pick(struct cuda_session *cs, enum gen_mode mode)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const float *row = cs->dbufs[p->buf_logits];
    if (mode == GEN_ARGMAX)
        return step_omitted(cs, "argmax") ? cudaSuccess
                                          : launch_argmax(row, cs->n_vocab, cs->d_ids, cs->d_pos, cs->d_out,
                                                          cs->d_step, cs->stream, cs->decode_pdl, &cs->am);
    struct topk_draw dr = {cs->d_sp, cs->d_ids, cs->d_pos, cs->d_out, cs->d_step}; /* drawn in topk's last block */
    return launch_topk(row, cs->n_vocab, cs->samp_t, cs->samp_m, NULL, 0, cs->d_topk, cs->d_top,
                       (float *)(cs->d_top + CUDA_TOP_MAX_M), NULL, false, cs->stream, &dr, cs->decode_pdl);
}

/* g as an executable graph the way cuda_options.graph_flags says. */
static cudaError_t instantiate_decode(struct cuda_session *cs, cudaGraphExec_t *out, cudaGraph_t g)
{
    if (cs->opt.graph_flags == 2)
        return cudaGraphInstantiateWithFlags(out, g, cudaGraphInstantiateFlagDeviceLaunch);
    if (cs->opt.graph_flags == 1) {
        cudaGraphInstantiateParams ip;
        memset(&ip, 0, sizeof(ip));
        ip.flags = cudaGraphInstantiateFlagUpload;
        ip.uploadStream = cs->stream;
        return cudaGraphInstantiateWithParams(out, g, &ip);
    }
    return cudaGraphInstantiate(out, g, 0);
}

/* Captures enqueue_decode (+ the greedy argmax when gen) into an executable graph, steps
 * times over (gen only: each step reads the position and the token the one before it left on
 * the GPU, so the copies are the same step run in sequence). */
qwenrt_status capture(struct cuda_session *cs, int gen, int32_t steps, cudaGraphExec_t *out,
                             struct qwenrt_error *err)
{
    cudaGraph_t g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(cs->stream, cudaStreamCaptureModeThreadLocal));
    qwenrt_status st = QWENRT_OK;
    struct lm_screen_args sa;
    const bool screened = lm_screen_takes(cs, gen, &sa);
    /* the sampled screen ranks and draws as enqueue_pick's topk does, into the same buffers */
    const struct lm_screen_sampled smp = {cs->samp_m, cs->samp_t, cs->dbufs[cs->plans[PHASE_DECODE].buf_logits],
                                          cs->d_top, (float *)(cs->d_top + CUDA_TOP_MAX_M), cs->d_sp};
    for (int32_t k = 0; k < steps && !st; k++) {
        st = enqueue_steps(cs, cs->n_steps - screened, err); /* the screen stands in for the LM head */
        cudaError_t e = st || gen == GEN_NONE ? cudaSuccess
                        : !screened           ? enqueue_pick(cs, (enum gen_mode)gen)
                        : gen == GEN_ARGMAX   ? launch_lm_screen(cs->screen, &sa, cs->stream)
                                              : launch_lm_screen_sampled(cs->screen, &sa, &smp, cs->stream);
        if (e != cudaSuccess)
            st = cuda_fail(err, e, __FILE__, __LINE__, "the token's pick");
    }
    cudaError_t e = cudaStreamEndCapture(cs->stream, &g);
    if (st) {
        if (g)
            cudaGraphDestroy(g);
        return st;
    }
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "cudaStreamEndCapture");
    e = instantiate_decode(cs, out, g);
    cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "cudaGraphInstantiate");
    return QWENRT_OK;
}


/* A step's label in the decode profile. */
const char *step_label(const struct plan *p, const struct step *st)
{
    switch (st->kind) {
    case STEP_NORM_GEMV:
        return st->swiglu ? "norm+gate|up+swiglu" : p->ops[st->mm[0]].kind == OP_LOGITS ? "norm+lm_head"
               : st->n_mm > 1 ? "norm+gemv(multi)" : "norm+gemv";
    case STEP_GEMV_ADD: return "gemv+residual";
    case STEP_MLP: return "norm+gate|up+down+residual";
    case STEP_GDN_GATED: return "gdn_core+gated_norm";
    case STEP_CONV_GDN_GATED: return "conv+gdn_core+gated_norm";
    case STEP_ROPE_ATTN: return "rope+attention";
    case STEP_QKV_ATTN: return "norm+q|k|v+attention";
    case STEP_ATTN_O: return "rope+attention+o+residual";
    default: return op_kind_name(p->ops[st->op].kind);
    }
}

/* The fusions and marks that depend on the session's shape picks (cuda_session.cu's
 * init_device makes them after build_program): q|k|v + attention and attention + o merged,
 * the cluster-merged attention's window, the early reads and launches ahead, the L2 prefetch
 * plan; then the omitted steps' labels checked against the finished program. */
qwenrt_status finish_program(struct cuda_session *cs, struct qwenrt_error *err)
{
    merge_qkv_attn_steps(cs);
    cs->cl_mode = pick_cl_mode(cs);
    cs->cl_from = cs->opt.attn_cluster_from ? cs->opt.attn_cluster_from : ATTN_CLUSTER_FROM;
    cs->cl_until = cs->opt.attn_cluster_until ? cs->opt.attn_cluster_until : ATTN_CLUSTER_UNTIL;
    qwenrt_status st = merge_attn_o_steps(cs, err);
    if (st)
        return st;
    mark_early_reads(cs);
    mark_launch_ahead(cs);
    if ((st = plan_l2_prefetch(cs, err)))
        return st;
    return check_omitted_labels(cs, err);
}
