/*
 * cuda_batch.cu — the server's batched decode step (cuda_batch_decode): one step for several
 * sessions, each weight read once for all of them.
 *
 * The first session of a step leads it (c0): its batch buffers hold every session's row and its
 * stream runs the step, op by op while its members are new, captured as a CUDA graph the second
 * time in a row and replayed after that (batch_step). The products run once for all rows
 * (batch_row_step: gemv_batch.cu, gemvq_batch*.cu); the per-sequence steps (the attention with
 * its q/k norm, RoPE and cache write; the DeltaNet step) in one launch for all sessions where a
 * kernel takes them (batch_seq_run: attention_batch.cu, attention.cu's multi-session attention,
 * gdn_decode.cu), otherwise on side streams, one branch a session (batch_branch_ops). A failed
 * step changes no session (enqueue_batch_kept). Where the products keep the one-session sums'
 * order (batch_same_bits) every session's logits are bit for bit its own graph's;
 * cuda_batch_pays says where batching beats each session alone.
 */
#include "backend/cuda/cuda_session.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}

/* true for ops that read or write a sequence's position or state (run once per session) */
static bool per_sequence(enum op_kind k)
{
    return k == OP_QK_NORM_ROPE || k == OP_ATTENTION || k == OP_GDN_CONV || k == OP_GDN_CORE;
}

/* Weights a multi-token GEMV takes (gemv_batch.cu, gemvq_batch.cu). */
static bool batch_dtype(int32_t dt)
{
    return dt == QR_BF16 || dt == QR_F16 || dt == QR_Q8_0 || dt == QR_Q4_K || dt == QR_Q6_K;
}

/* Whether the batched step's products are bit for bit the one-token ones in the default
 * precision (x in 8 bits): every product Q4_K or Q6_K rows, or every one Q8_0 rows, that both
 * gemvq (one token: K of 4-14 super-blocks as gemv_quant.cu builds them, SwiGLU at K = 1024)
 * and gemvq_batch_mma.cu (many; Q8_0 from session 40) take, both adding the super-blocks'
 * terms in quant_rows_i8.cuh's canonical order; the
 * one-token graph of plain steps only (a norm into a GEMV, a GEMV + residual, the attention:
 * the fused MLP, attention + o and q|k|v + attention launches keep their own orders), its
 * attention attention.cu's attention_kernel (whose batched form splits each session's keys as its
 * graph does at every position: batch_split_floor). The rest of the batched step (norms, q/k norm +
 * RoPE, Qwen3.5's output gate and DeltaNet step: gds_ms_kernel is gds_kernel per session, picks)
 * is the one-token arithmetic per session. Qwen3.5-0.8B Q4_K_M parted from alone by 0.6-0.9 of
 * the logits until session 39 because gemvq did not take its Q6_K down rows (2,940 bytes: not
 * whole 8-byte copy units), so its one-token graph ran them with x in f32 (docs/perf-log.md). */
static bool batch_same_bits(const struct cuda_session *cs)
{
    if (!cs->gq_int8 || !cs->opt.gemv_batch_mma)
        return false;
    /* the batched attention is attention_kernel's multi-session form, split as the one-token
     * graph splits (batch_seq_attention): the one-token graph must take that kernel too */
    const struct cuda_options *o = &cs->opt;
    if (!o->attn_rope || o->attn_shared_kv > 0 || (o->attn_lanes != 0 && o->attn_lanes != 32) || o->attn_stage > 0 ||
        o->attn_rope_regs == 1)
        return false;
    /* x quantised as gemvq_batch_mma.cu quantises it (a fused norm's 1 / rms from the blocks' sums
     * in block order): gemvq's one-pass staging, which its shapes take where the session picks
     * them (2 rows a warp below the LM head, the LM head's looping blocks; gemv_quant.cu) — not
     * where a profile pins other rows (gemv_stage_x sums the squares in another order) */
    if (o->gemvq_one_pass != 1 || cs->gq_rows != 2 || o->gemvq_head_blocks <= 0)
        return false;
    const struct plan *p = &cs->plans[PHASE_DECODE];
    bool kquant = false, q80 = false; /* gemvq_batch_mma.cu launches no Q8_0 rows beside others */
    for (int32_t i = 0; i < p->n_ops; i++) {
        if (!is_mm(&p->ops[i]))
            continue;
        const struct dop *d = &cs->dops[PHASE_DECODE][i];
        kquant |= d->dtype == QR_Q4_K || d->dtype == QR_Q6_K, q80 |= d->dtype == QR_Q8_0;
        if ((d->dtype != QR_Q4_K && d->dtype != QR_Q6_K && d->dtype != QR_Q8_0) || !gemvq_takes_k(d->K))
            return false;
    }
    if (kquant && q80)
        return false;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        const struct step *st = &cs->steps[i];
        const bool plain = st->kind == STEP_OP || st->kind == STEP_NORM_GEMV || st->kind == STEP_GEMV_ADD ||
                           st->kind == STEP_ROPE_ATTN || st->kind == STEP_GDN_GATED || st->kind == STEP_CONV_GDN_GATED;
        if (!plain || (st->swiglu && cs->dops[PHASE_DECODE][st->mm[0]].K != 1024))
            return false;
    }
    return true;
}

/* The sessions whose batched step beats their own decode graphs one after another (16-bit rows:
 * from 2; BF16 ones up to 16, what the tensor cores' GEMV takes), and when a product is
 * quantised: from 3. H200, Qwen3-0.6B Q4_K_M (docs/perf-log.md, sessions 34 and 37): each
 * request through its own graph token by token ~1,936 tok/s whatever their number; batched
 * with gemvq_batch_mma.cu (8-bit x, tensor cores), in all, 1,641 with 2 sessions, 2,270 with 3,
 * 4,366 with 8, 5,799 with 16. 16-bit rows pay from 2 on (Qwen3-0.6B BF16: 1,796 one by one,
 * 1,841 with 2, 5,108 with 16).
 * A quantised model batches only where a request's answer cannot depend on how many others
 * generate beside it: in the default precision where its products are bit for bit the
 * one-token ones (batch_same_bits; 8-bit x turns a float-order difference of 1e-7 into whole
 * quant steps: 0.03 of the logits and 5 of 8 the same answers before the canonical order,
 * session 37), and under `--precision exact` (x in f32 both ways; gemvq_batch.cu up to
 * GEMV_MAX_T tokens, the float order alone differs). */
#define BATCH_QUANT_MIN 3

extern "C" bool cuda_batch_pays(const struct cuda_session *cs, int32_t n)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    bool quant = false, mma = cs->opt.gemv_batch_mma;
    for (int32_t i = 0; i < p->n_ops; i++) {
        if (!is_mm(&p->ops[i]))
            continue;
        const struct dop *d = &cs->dops[PHASE_DECODE][i];
        if (!batch_dtype(d->dtype))
            return false;
        quant |= d->dtype != QR_BF16 && d->dtype != QR_F16;
        mma &= d->dtype == QR_BF16 && d->K % 32 == 0;
    }
    if (quant && cs->gq_int8)
        return cs->opt.gemv_batch && batch_same_bits(cs) && n >= BATCH_QUANT_MIN && n <= GEMV_BATCH_MMA_MAX_T;
    if (quant)
        return cs->opt.gemv_batch && n >= BATCH_QUANT_MIN && n <= GEMV_MAX_T;
    /* BF16 rows the tensor cores' GEMV takes: at most 16 a step (more take the GEMM: Qwen3-0.6B
     * BF16 32 sessions 10,276 tok/s in one step, 16 12,600, session 35), so a server of 32
     * slots runs two steps of 16 */
    return cs->opt.gemv_batch && n >= 2 && (!mma || n <= GEMV_BATCH_MMA_MAX_T);
}

/* The batched step's graph and branches (cuda_session_free). */
void batch_free(struct cuda_session *cs)
{
    if (cs->g_batch)
        cudaGraphExecDestroy(cs->g_batch);
    cs->g_batch = NULL;
    xfree(cs->b_key);
    cs->b_key = NULL;
    if (!cs->b_side_ready)
        return;
    for (int b = 0; b < BATCH_BRANCHES; b++)
        cudaStreamDestroy(cs->b_side[b]);
    for (int b = 0; b <= BATCH_BRANCHES; b++)
        cudaEventDestroy(cs->b_ev[b]);
    cs->b_side_ready = false;
}

/* The side streams and events of the per-sequence branches, made once per leader. */
static qwenrt_status batch_branches(struct cuda_session *c0, struct qwenrt_error *err)
{
    if (c0->b_side_ready)
        return QWENRT_OK;
    int ns = 0, ne = 0; /* streams and events made */
    cudaError_t e = cudaSuccess;
    while (ns < BATCH_BRANCHES && (e = cudaStreamCreateWithFlags(&c0->b_side[ns], cudaStreamNonBlocking)) == cudaSuccess)
        ns++;
    while (e == cudaSuccess && ne <= BATCH_BRANCHES &&
           (e = cudaEventCreateWithFlags(&c0->b_ev[ne], cudaEventDisableTiming)) == cudaSuccess)
        ne++;
    if (e != cudaSuccess) { /* undo what was made: the next step tries again */
        for (int b = 0; b < ns; b++)
            cudaStreamDestroy(c0->b_side[b]);
        for (int b = 0; b < ne; b++)
            cudaEventDestroy(c0->b_ev[b]);
        return cuda_fail(err, e, __FILE__, __LINE__, "the batched step's streams");
    }
    c0->b_side_ready = true;
    return QWENRT_OK;
}

/* The fused decode steps a batch runs per session: the attention with its q/k norm, RoPE, cache
 * write (and Qwen3.5's output gate), the DeltaNet step with its conv and gated norm. */
static bool batch_branch_step(const struct cuda_session *c0, int32_t i, struct step *st)
{
    return c0->opt.fuse && match_step(&c0->plans[PHASE_DECODE], i, st) &&
           (st->kind == STEP_ROPE_ATTN || st->kind == STEP_GDN_GATED || st->kind == STEP_CONV_GDN_GATED);
}

/* The end of the run of per-sequence work that starts at op i (per-sequence ops, and the fused
 * steps that take row-wise ops with them). */
static int32_t batch_branch_end(const struct cuda_session *c0, int32_t i)
{
    const struct plan *p = &c0->plans[PHASE_DECODE];
    struct step st;
    while (i < p->n_ops) {
        if (batch_branch_step(c0, i, &st))
            i += st.n_ops;
        else if (per_sequence(p->ops[i].kind))
            i++;
        else
            break;
    }
    return i;
}

/* Ops i .. j - 1 (batch_branch_end) for every session, session r on branch r % BATCH_BRANCHES:
 * the sessions' work runs side by side, each session's in plan order, fused as its own decode
 * graph fuses it. */
static qwenrt_status batch_branch_ops(struct cuda_session *c0, struct cuda_session *const *css, int32_t n,
                                      int32_t i, int32_t j, struct qwenrt_error *err)
{
    const struct plan *p = &c0->plans[PHASE_DECODE];
    int nb = n < BATCH_BRANCHES ? n : BATCH_BRANCHES;
    CUDA_CHECK(cudaEventRecord(c0->b_ev[0], c0->stream));
    for (int b = 0; b < nb; b++)
        CUDA_CHECK(cudaStreamWaitEvent(c0->b_side[b], c0->b_ev[0], 0));
    for (int32_t r = 0; r < n; r++) {
        float *rows[PLAN_MAX_BUFS] = {NULL};
        for (int32_t k = 0; k < p->n_bufs; k++)
            rows[k] = c0->bbufs[k] + (size_t)r * p->bufs[k].width;
        struct run_ctx one = {css[r], p, css[r]->dops[PHASE_DECODE], rows, 1, false, c0->decode_pdl,
                              c0->b_side[r % BATCH_BRANCHES], 0, false, NULL, NULL, NULL, NULL, false, NULL};
        for (int32_t k = i; k < j;) {
            struct step st;
            bool fused = batch_branch_step(c0, k, &st);
            qwenrt_status e = fused ? run_step(&one, &st, err) : run_op(&one, k, err);
            one.pf = NULL; /* run_step pointed it at st */
            if (e)
                return e;
            k += fused ? st.n_ops : 1;
        }
    }
    for (int b = 0; b < nb; b++) {
        CUDA_CHECK(cudaEventRecord(c0->b_ev[1 + b], c0->b_side[b]));
        CUDA_CHECK(cudaStreamWaitEvent(c0->stream, c0->b_ev[1 + b], 0));
    }
    return QWENRT_OK;
}

/* The per-sequence work at ops i .. j - 1 (batch_branch_end) when it is one fused step with a
 * multi-session form (the attention with RoPE inside: attn_args.n_seq; the DeltaNet step over
 * clusters: gdn_args.n_seq), and every session keeps its cache as c0 does. */
static bool batch_seq_step(const struct cuda_session *c0, struct cuda_session *const *css, int32_t n, int32_t i,
                           int32_t j, struct step *st)
{
    if (!c0->opt.batch_seq || !batch_branch_step(c0, i, st) || i + st->n_ops != j)
        return false;
    for (int32_t r = 0; r < n; r++)
        if (css[r]->opt.kv_f16 != c0->opt.kv_f16 || css[r]->kv_width != c0->kv_width)
            return false;
    return true;
}

/* The splits of a multi-session attention launch: enough that each session's keys split as its
 * own graph splits them (attention_splits, a function of the position). Three levels, so that
 * the batched graph is captured again only when a batch changes level (cuda_batch_decode):
 *  - BATCH_SHALLOW: every session's graph takes one split (below attn_one_split, 128 positions
 *    by default): one. A launch of 16 sessions then has 256 blocks where it had 2,048 of which
 *    1,792 returned at once (docs/perf-log.md, session 43).
 *  - BATCH_MID: the cluster window's ATT_CL_SPLITS, which also covers every position below it
 *    (one split to 127, then one per 64 positions).
 *  - BATCH_DEEP: all of c0's, where a session's graph takes more than that: past the window's
 *    end, 5,120 by default, or from position 512 without a window, as Qwen3.5-0.8B's 8-head
 *    attention has none. */
enum batch_level { BATCH_SHALLOW, BATCH_MID, BATCH_DEEP };

static int32_t batch_split_floor(const struct cuda_session *c0, int level)
{
    if (level == BATCH_SHALLOW)
        return 1;
    return level == BATCH_DEEP || c0->att_splits < ATT_CL_SPLITS ? c0->att_splits : ATT_CL_SPLITS;
}

/* The level that the n sessions' graphs need at positions pos[r]: the most splits any of them
 * takes against batch_split_floor's levels. */
static int batch_level_of(const struct cuda_session *c0, const int32_t *pos, int32_t n)
{
    struct attn_args a;
    memset(&a, 0, sizeof(a));
    a.split_min = c0->opt.attn_split_min, a.one_split = c0->opt.attn_one_split;
    attn_window(c0, a);
    int32_t most = 1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t s = attention_splits(a, pos[r], c0->att_splits);
        most = s > most ? s : most;
    }
    return most <= 1 ? BATCH_SHALLOW : most <= batch_split_floor(c0, BATCH_MID) ? BATCH_MID : BATCH_DEEP;
}

/* The blocks of the batched attention launch b for each pair of query heads and session
 * (attn_args.group_blocks, attention_batch.cu): cuda_options.attn_batch_blocks', or as many as
 * fill one wave of the kernel on c0's multiprocessors, so that each block pays the fixed cost
 * of a split (its release, the q/k norm + RoPE prologue) once for a run of splits instead of
 * once a split, in waves (16 Qwen3-0.6B sessions at 512 positions: 2,048 blocks of one split,
 * ~8 waves). Each block takes ceil(S / Z) of the S splits the position has (the kernel computes
 * it: one graph fits every position). 0 (a block a head and split, attention_kernel) where the
 * option says -1 or the kernel does not take the heads. The same partials either way: bit for
 * bit. */
static int32_t batch_group_blocks(const struct cuda_session *c0, const struct attn_args &b)
{
    struct attn_args t = b;
    t.group_blocks = 1;
    if (c0->opt.attn_batch_blocks < 0 || !attention_group_applies(&t))
        return 0;
    if (c0->opt.attn_batch_blocks > 0)
        return c0->opt.attn_batch_blocks;
    const int64_t wave = (int64_t)attention_group_blocks_per_sm(b.hd, b.kv_f16) * (c0->n_sm > 0 ? c0->n_sm : 132);
    const int64_t per = (int64_t)b.n_head / attention_group_heads() * b.n_seq, z = wave / (per > 0 ? per : 1);
    return z < 1 ? 1 : z > b.splits ? b.splits : (int32_t)z;
}

/* The attention step st (STEP_ROPE_ATTN) of all n sessions: launches of up to ATT_MAX_SEQ
 * sessions each (blockIdx.y the session: attention_kernel's multi-session form, or once the
 * keys are split attention_batch.cu's runs of splits, batch_group_blocks) on c0's
 * stream, chained with PDL. Each session's keys are split as its own decode graph splits them
 * (attn_args.nominal_splits: c0's, with the cluster window), so its sums are that graph's bit
 * for bit wherever the launch has as many splits as that graph uses: the launch takes c0's
 * splits over its sessions (the blocks stay about as many as one session's), but at least
 * ATT_CL_SPLITS, which the graph uses at most inside the cluster window (to position 5,120 by
 * default) and below it, and all of c0's where a session's graph takes more; one where every
 * session's graph takes one (batch_split_floor's levels, c0->b_level): bit for bit at every
 * position. Session 37's launches of c0's splits / n made a
 * batch of 8 differ from alone from position 256, one of 16 from 128. False, launching
 * nothing, where the attention does not take the norm + RoPE inside (cuda_options.attn_rope
 * off). */
static qwenrt_status batch_seq_attention(struct run_ctx *all, struct cuda_session *const *css, int32_t n,
                                         const struct step *st, bool *done, struct qwenrt_error *err)
{
    struct cuda_session *c0 = all->cs;
    struct rope_args ra;
    struct attn_args a;
    rope_attn_args(all, st->op, st->gate_op, ra, a); /* c0's, on row 0 of the batch's buffers */
    *done = a.rope;
    if (!a.rope)
        return QWENRT_OK;
    int32_t layer = all->p->ops[st->op + 1].layer;
    a.cluster_merge = a.shared_kv = a.rope_regs = false, a.lanes = a.stages = 0;
    a.early = false, a.pos0 = NULL, a.kc = a.vc = NULL;
    a.ldrk = ra.ldk, a.ldrv = ra.ldv;
    a.part = c0->b_part, a.count = c0->b_count;
    for (int32_t g = 0; g < n; g += ATT_MAX_SEQ) {
        struct attn_args b = a;
        b.n_seq = n - g < ATT_MAX_SEQ ? n - g : ATT_MAX_SEQ;
        const int32_t share = c0->att_splits / b.n_seq, floor = batch_split_floor(c0, c0->b_level);
        b.splits = a.part && c0->b_level != BATCH_SHALLOW ? (share > floor ? share : floor) : 1;
        b.nominal_splits = a.part ? c0->att_splits : 0;
        b.group_blocks = batch_group_blocks(c0, b);
        b.q += (int64_t)g * a.ldq, b.out += (int64_t)g * a.ldo, b.rk += (int64_t)g * a.ldrk, b.rv += (int64_t)g * a.ldrv;
        for (int32_t k = 0; k < b.n_seq; k++) /* positions: c0's one copy for the step (cuda_batch_decode) */
            b.seq[k] = {css[g + k]->kc[layer], css[g + k]->vc[layer], c0->b_pos + g + k};
        CUDA_CHECK(launch_attention(&b, all->stream));
    }
    return QWENRT_OK;
}

/* The DeltaNet step st (STEP_GDN_GATED, STEP_CONV_GDN_GATED) of all n sessions: launches of up
 * to GDN_MAX_SEQ sessions each (gds_ms_kernel: blockIdx.y the session) on
 * c0's stream, chained with PDL, the step as each session's decode graph runs it. False,
 * launching nothing, where the step over clusters does not apply (gdn_split_applies). */
static qwenrt_status batch_seq_gdn(struct run_ctx *all, struct cuda_session *const *css, int32_t n,
                                   const struct step *st, bool *done, struct qwenrt_error *err)
{
    struct cuda_session *c0 = all->cs;
    const struct plan *p = all->p;
    int32_t core = st->kind == STEP_CONV_GDN_GATED ? st->op + 1 : st->op;
    const struct plan_op *op = &p->ops[st->op], *gn = &p->ops[core + 1];
    struct gdn_args a = gdn_args_of(all, core, 1); /* c0's, on row 0 of the batch's buffers */
    a.z = all->b[gn->in], a.ldz = bw(p, gn->in), a.gnorm_w = all->d[core + 1].vec, a.geps = gn->eps;
    a.split = c0->opt.gdn_split && c0->cc_major >= 9;
    a.staged = c0->opt.gdn_staged == 1;
    if (st->kind == STEP_CONV_GDN_GATED) {
        a.conv_state = c0->conv[op->layer], a.conv_taps = all->d[st->op].vec;
        a.conv_C = bw(p, op->out), a.conv_k = op->conv_k;
    }
    *done = a.split && gdn_split_applies(&a);
    if (!*done)
        return QWENRT_OK;
    for (int32_t g = 0; g < n; g += GDN_MAX_SEQ) {
        struct gdn_args b = a;
        b.n_seq = n - g < GDN_MAX_SEQ ? n - g : GDN_MAX_SEQ;
        b.out += (int64_t)g * a.ldo, b.qkv += (int64_t)g * a.ldi, b.z += (int64_t)g * a.ldz;
        b.b += (int64_t)g * a.ldb, b.a += (int64_t)g * a.lda;
        for (int32_t k = 0; k < b.n_seq; k++)
            b.seq[k] = {css[g + k]->ssm[p->ops[core].layer], a.conv_state ? css[g + k]->conv[op->layer] : NULL};
        CUDA_CHECK(launch_gdn_split(&b, all->stream));
    }
    return QWENRT_OK;
}

/* The per-sequence step st of all n sessions in launches for many sessions (batch_seq_step):
 * *done false where its kernel's conditions turn out not to hold (nothing launched). */
static qwenrt_status batch_seq_run(struct run_ctx *all, struct cuda_session *const *css, int32_t n,
                                   const struct step *st, bool *done, struct qwenrt_error *err)
{
    if (st->kind == STEP_ROPE_ATTN)
        return batch_seq_attention(all, css, n, st, done, err);
    return batch_seq_gdn(all, css, n, st, done, err);
}

/* A fused row-wise step at op i for the batch's n rows (all): the norm + products or a product +
 * residual, where gemv_batch.cu (16-bit rows) or gemvq_batch.cu (quantised rows) takes it (n <= 8);
 * elsewhere the ops run one by one (the GEMV kernels' or the GEMM's T-row forms). */
static bool batch_row_step(const struct cuda_session *c0, struct run_ctx *all, int32_t i, struct step *st)
{
    const struct plan *p = all->p;
    if (!c0->opt.fuse || !c0->opt.gemv_batch || all->T < 2 || all->T > GEMV_BATCH_MMA_MAX_T ||
        !match_step(p, i, st) || (st->kind != STEP_NORM_GEMV && st->kind != STEP_GEMV_ADD))
        return false;
    struct gemv_args a;
    if (st->kind == STEP_NORM_GEMV) {
        norm_gemv_args(all, st, a);
    } else {
        const struct dop *d = &all->d[st->op];
        const struct plan_op *op = &p->ops[st->op], *add = &p->ops[st->op + 1];
        memset(&a, 0, sizeof(a));
        a.x = all->b[op->in], a.ldx = bw(p, op->in), a.K = d->K, a.T = all->T, a.dtype = d->dtype;
        a.mode = GEMV_ACCUM, a.n_seg = 1;
        a.seg[0].w = d->w, a.seg[0].N = d->N, a.seg[0].row_bytes = d->row_bytes;
        a.seg[0].y = all->b[add->out], a.seg[0].ldy = bw(p, add->out);
        a.q_int8 = c0->gq_int8;
    }
    const bool int8_mma = c0->opt.gemv_batch_mma && a.q_int8 && gemvq_batch_mma_applies(&a);
    if (all->T <= c0->opt.gemv_max_T && all->T <= GEMV_MAX_T)
        return gemv_batch_applies(&a) || gemvq_batch_applies(&a) || int8_mma;
    return (c0->opt.gemv_batch_mma && gemv_batch_mma_applies(&a)) || int8_mma; /* 9-16 sessions */
}

/* The batched step on c0's stream: the row-wise ops once for all n rows (fused as the decode
 * graph fuses them: the norm into the products after it, q|k|v and gate|up + SwiGLU as one
 * launch, the residual add into the product before it), each run of per-sequence work on the
 * branches, then (to_rows) each session's logits row into its own decode buffer. The kernels
 * launch with PDL where the decode graph's do (decode_pdl: every kernel waits for its input with
 * griddep_wait; a dependency through an event — the branches' fork and join — stays whole). */
static qwenrt_status enqueue_batch(struct cuda_session *c0, struct cuda_session *const *css, int32_t n,
                                   bool to_rows, struct qwenrt_error *err)
{
    const struct plan *p = &c0->plans[PHASE_DECODE];
    struct run_ctx all = {c0, p, c0->dops[PHASE_DECODE], c0->bbufs, n, true, c0->decode_pdl, c0->stream, 0, false,
                          NULL, NULL, NULL, NULL, false, NULL};
    c0->b_seq_steps = 0;
    c0->b_own_pos = false;
    for (int32_t i = 0; i < p->n_ops;) {
        qwenrt_status st;
        struct step fs;
        if (c0->opt.batch_fail_at > 0 && i >= c0->opt.batch_fail_at)
            return err_set(err, QWENRT_ERR_BACKEND, "cuda batch: stopped at op %d of %d (cuda_options.batch_fail_at)", i,
                           p->n_ops);
        if (batch_row_step(c0, &all, i, &fs)) {
            st = run_step(&all, &fs, err); /* the norm + products, a product + residual: all n rows */
            all.pf = NULL;
            if (st)
                return st;
            i += fs.n_ops;
            continue;
        }
        if (!per_sequence(p->ops[i].kind) && !batch_branch_step(c0, i, &fs)) {
            if ((st = run_op(&all, i++, err)))
                return st;
            continue;
        }
        int32_t j = batch_branch_end(c0, i);
        bool done = false;
        if (batch_seq_step(c0, css, n, i, j, &fs) && (st = batch_seq_run(&all, css, n, &fs, &done, err)))
            return st;
        c0->b_own_pos |= !done;
        if (!done && (st = batch_branch_ops(c0, css, n, i, j, err)))
            return st;
        c0->b_seq_steps += done;
        i = j;
    }
    size_t row = (size_t)c0->n_vocab * sizeof(float);
    for (int32_t r = 0; to_rows && r < n; r++)
        CUDA_CHECK(cudaMemcpyAsync(css[r]->dbufs[p->buf_logits], c0->bbufs[p->buf_logits] + (size_t)r * c0->n_vocab,
                                   row, cudaMemcpyDeviceToDevice, c0->stream));
    return QWENRT_OK;
}

/* True when c0's last batched step (b_n rows, signed by to_rows) had exactly these sessions in
 * this order: each still names c0's latest step and its row there (a session freed and another
 * made at its address names none). */
static bool batch_same_members(const struct cuda_session *c0, struct cuda_session *const *css, int32_t n, bool to_rows)
{
    if (c0->b_n != (to_rows ? n : -n))
        return false;
    for (int32_t r = 0; r < n; r++)
        if (c0->b_key[r] != css[r] || css[r]->b_leader != c0 || css[r]->b_leader_gen != c0->b_gen ||
            css[r]->b_row != r)
            return false;
    return true;
}

/* Makes these sessions c0's members (a new b_gen: older graphs and members no longer match). */
static void batch_set_members(struct cuda_session *c0, struct cuda_session *const *css, int32_t n, bool to_rows)
{
    c0->b_gen++;
    c0->b_n = to_rows ? n : -n;
    for (int32_t r = 0; r < n; r++) {
        c0->b_key[r] = css[r];
        css[r]->b_leader = c0, css[r]->b_leader_gen = c0->b_gen, css[r]->b_row = r;
    }
}

/* Captures the batched step of c0's members into c0->g_batch: an update of the graph there when
 * its shape allows (the same n: only the sessions' pointers differ), else a new one. */
static qwenrt_status batch_capture(struct cuda_session *c0, struct cuda_session *const *css, int32_t n,
                                   bool to_rows, struct qwenrt_error *err)
{
    cudaGraph_t g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(c0->stream, cudaStreamCaptureModeThreadLocal));
    qwenrt_status st = enqueue_batch(c0, css, n, to_rows, err);
    cudaError_t e = cudaStreamEndCapture(c0->stream, &g);
    if (!st && e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cudaStreamEndCapture (batched step)");
    if (st) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        return st;
    }
    bool updated = false;
    if (c0->g_batch && c0->g_batch_n == c0->b_n) {
        cudaGraphExecUpdateResultInfo info;
        updated = cudaGraphExecUpdate(c0->g_batch, g, &info) == cudaSuccess;
        if (!updated)
            cudaGetLastError();
    }
    if (!updated) {
        if (c0->g_batch)
            cudaGraphExecDestroy(c0->g_batch);
        c0->g_batch = NULL;
        e = cudaGraphInstantiate(&c0->g_batch, g, 0);
        if (e != cudaSuccess) {
            cudaGraphDestroy(g);
            c0->g_batch = NULL;
            return cuda_fail(err, e, __FILE__, __LINE__, "cudaGraphInstantiate (batched step)");
        }
    }
    cudaGraphDestroy(g);
    c0->g_batch_n = c0->b_n;
    c0->g_batch_gen = c0->b_gen;
    return QWENRT_OK;
}

/* The step launched op by op, with every session's recurrent state (DeltaNet conv and state
 * rows) copied first (cuda_session_snapshot) and put back when a launch fails part way: the
 * layers before it would otherwise have advanced their state, and a caller that then decodes
 * the same token one session at a time would advance it twice. So a failed step changes no
 * session (qwenrt_batch_decode's promise); BACKEND when even the copies back fail. Captured
 * steps need none of this: a capture that fails has run nothing. */
static qwenrt_status enqueue_batch_kept(struct cuda_session *c0, struct cuda_session *const *css, int32_t n,
                                        bool to_rows, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    if (c0->rec_bytes) {
        for (int32_t r = 0; r < n && !st; r++)
            st = cuda_session_snapshot(css[r], false, err);
        for (int32_t r = 0; r < n && !st; r++) /* the copies are on each session's stream */
            CUDA_CHECK(cudaStreamSynchronize(css[r]->stream));
        if (st)
            return st;
    }
    st = enqueue_batch(c0, css, n, to_rows, err);
    if (!st || !c0->rec_bytes)
        return st;
    cudaError_t e = cudaStreamSynchronize(c0->stream); /* what did run, before the copies back */
    struct qwenrt_error back = {};
    for (int32_t r = 0; r < n && e == cudaSuccess && !back.status; r++)
        if (!cuda_session_snapshot(css[r], true, &back))
            e = cudaStreamSynchronize(css[r]->stream);
    if (e == cudaSuccess && !back.status)
        return st;
    char why[sizeof(err->message)] = "";
    if (err)
        snprintf(why, sizeof(why), "%s", err->message);
    cudaGetLastError();
    return err_set(err, QWENRT_ERR_BACKEND, "%s; the sessions' recurrent state could not be put back (%s)", why,
                   back.status ? back.message : cudaGetErrorString(e));
}

/* The step: launched op by op when these members are new to c0 (which also makes what the ops
 * allocate on first use, outside any capture), captured the second time in a row, replayed
 * after that. */
static qwenrt_status batch_step(struct cuda_session *c0, struct cuda_session *const *css, int32_t n, bool to_rows,
                                struct qwenrt_error *err)
{
    if (!c0->opt.graph)
        return enqueue_batch_kept(c0, css, n, to_rows, err);
    if (!batch_same_members(c0, css, n, to_rows)) {
        qwenrt_status st = enqueue_batch_kept(c0, css, n, to_rows, err);
        if (!st)
            batch_set_members(c0, css, n, to_rows);
        return st;
    }
    if (c0->g_batch_gen != c0->b_gen) {
        qwenrt_status st = batch_capture(c0, css, n, to_rows, err);
        if (st)
            return st;
    }
    CUDA_CHECK(cudaGraphLaunch(c0->g_batch, c0->stream));
    return QWENRT_OK;
}

extern "C" int32_t cuda_batch_seq_steps(const struct cuda_session *cs)
{
    return cs->b_seq_steps;
}

/* The multi-session attention's partials and counters for n sessions (batch_seq_attention):
 * n times a session's, the counters zeroed; none where the attention has no splits. */
static qwenrt_status alloc_batch_splits(struct cuda_session *c0, int32_t n, struct qwenrt_error *err)
{
    dev_free(c0->opt.allocs, c0->b_part);
    dev_free(c0->opt.allocs, c0->b_count);
    c0->b_part = NULL, c0->b_count = NULL;
    if (!c0->att_part)
        return QWENRT_OK;
    cudaError_t e = dev_malloc(c0->opt.allocs, &c0->b_part, (size_t)n * c0->att_part_floats * sizeof(float));
    if (e == cudaSuccess)
        e = dev_malloc(c0->opt.allocs, &c0->b_count, (size_t)n * c0->att_heads * sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemsetAsync(c0->b_count, 0, (size_t)n * c0->att_heads * sizeof(unsigned), c0->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dev_free(c0->opt.allocs, c0->b_part);
        c0->b_part = NULL;
        return err_set(err, QWENRT_ERR_NOMEM, "cuda batch: no device memory for the attention's partials of %d sessions",
                       n);
    }
    return QWENRT_OK;
}

/* x's scratch for the quantised products quantised once (gemv_args.q_pre) for n sessions,
 * where cuda_options.gemvq_batch_pre asks for it. */
static qwenrt_status alloc_batch_qpre(struct cuda_session *c0, int32_t n, struct qwenrt_error *err)
{
    dev_free(c0->opt.allocs, c0->b_qpre);
    c0->b_qpre = NULL;
    if (c0->opt.gemvq_batch_pre <= 0 || n < c0->opt.gemvq_batch_pre)
        return QWENRT_OK;
    if (dev_malloc(c0->opt.allocs, &c0->b_qpre, gemvq_batch_pre_bytes(n, GEMVQ_BATCH_PRE_KMAX)) != cudaSuccess) {
        cudaGetLastError();
        c0->b_qpre = NULL;
        return err_set(err, QWENRT_ERR_NOMEM, "cuda batch: no device memory for the quantised x of %d sessions", n);
    }
    return QWENRT_OK;
}

/* The batch's positions on the device and the pinned stage of its ids and positions, for n
 * sessions. */
static qwenrt_status alloc_batch_stage(struct cuda_session *c0, int32_t n, struct qwenrt_error *err)
{
    dev_free(c0->opt.allocs, c0->b_pos);
    dev_free_host(c0->opt.allocs, c0->b_stage);
    c0->b_pos = NULL, c0->b_stage = NULL;
    cudaError_t e = dev_malloc(c0->opt.allocs, &c0->b_pos, (size_t)n * sizeof(int32_t));
    if (e == cudaSuccess)
        e = dev_malloc_host(c0->opt.allocs, &c0->b_stage, 2 * (size_t)n * sizeof(int32_t));
    if (e != cudaSuccess) {
        cudaGetLastError();
        dev_free(c0->opt.allocs, c0->b_pos);
        c0->b_pos = NULL, c0->b_stage = NULL;
        return err_set(err, QWENRT_ERR_NOMEM, "cuda batch: no memory for the positions of %d sessions", n);
    }
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_batch_decode(struct cuda_session *const *css, const int32_t *ids,
                                           const int32_t *pos, int32_t n, float *logits,
                                           struct qwenrt_error *err)
{
    struct cuda_session *c0 = css[0];
    const struct plan *p = &c0->plans[PHASE_DECODE];
    if (n < 1 || n > c0->n_ctx)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda batch: %d sequences (1 to the first session's context of %d)", n,
                       c0->n_ctx);
    for (int32_t r = 0; r < n; r++) {
        if (css[r]->plans != c0->plans)
            return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda batch: session %d is of another model", r);
        if (pos[r] < 0 || pos[r] >= css[r]->n_ctx)
            return err_set(err, QWENRT_ERR_LIMIT, "cuda batch: position %d of session %d exceeds its context of %d",
                           pos[r], r, css[r]->n_ctx);
    }
    qwenrt_status st;
    if (n > c0->cap_batch) { /* the batch's activations: n rows of every decode buffer */
        CUDA_CHECK(cudaStreamSynchronize(c0->stream));
        free_bufs(c0->opt.allocs, c0->bbufs);
        if (c0->g_batch)
            cudaGraphExecDestroy(c0->g_batch);
        c0->g_batch = NULL;
        xfree(c0->b_key);
        c0->b_n = 0;
        c0->cap_batch = 0;
        if (!(c0->b_key = (const struct cuda_session **)xcalloc((size_t)n, sizeof(*c0->b_key))))
            return err_set(err, QWENRT_ERR_NOMEM, "cuda batch: out of memory");
        if ((st = alloc_bufs(c0->opt.allocs, p, c0->bbufs, n, n, err)) || (st = alloc_batch_splits(c0, n, err)) ||
            (st = alloc_batch_stage(c0, n, err)) || (st = alloc_batch_qpre(c0, n, err)))
            return st;
        c0->cap_batch = n;
    }
    if ((st = batch_branches(c0, err)))
        return st;
    /* a step that leaves the sessions' rows alone (host logits) keeps each session's row as it
     * was: one a screened loop left to be made is made now, from the hidden state the step
     * would overwrite */
    for (int32_t r = 0; logits && r < n; r++)
        if (css[r]->row_stale && (st = session_row_ready(css[r], err)))
            return st;
    /* every session's state is used on c0's stream: they must be idle (a run that returned
     * without waiting may still be in flight on its own stream) */
    for (int32_t r = 0; r < n; r++)
        if (css[r]->unsynced) {
            CUDA_CHECK(cudaStreamSynchronize(css[r]->stream));
            css[r]->unsynced = false;
        }
    CUDA_CHECK(cudaStreamSynchronize(c0->stream));
    /* the ids and positions in two copies from pinned memory: the multi-session attention
     * reads the positions from c0's array; per-session steps (batch_seq off, or a step without
     * a multi-session form) from each session's own, copied too when the last step with these
     * members ran such steps, or when the members are new */
    bool to_rows = !logits;
    const int level = batch_level_of(c0, pos, n);
    if (level != c0->b_level) { /* the attention's splits change: launched as new members, then captured again */
        c0->b_level = (int8_t)level;
        c0->b_n = 0;
    }
    bool own_pos = c0->b_own_pos || !batch_same_members(c0, css, n, to_rows);
    memcpy(c0->b_stage, ids, (size_t)n * sizeof(int32_t));
    memcpy(c0->b_stage + c0->cap_batch, pos, (size_t)n * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(c0->d_ids, c0->b_stage, (size_t)n * 4, cudaMemcpyHostToDevice, c0->stream));
    CUDA_CHECK(cudaMemcpyAsync(c0->b_pos, c0->b_stage + c0->cap_batch, (size_t)n * 4, cudaMemcpyHostToDevice,
                               c0->stream));
    for (int32_t r = 0; own_pos && r < n; r++) {
        css[r]->h_stage[1] = pos[r];
        CUDA_CHECK(cudaMemcpyAsync(css[r]->d_pos, &css[r]->h_stage[1], 4, cudaMemcpyHostToDevice, c0->stream));
    }
    if ((st = batch_step(c0, css, n, to_rows, err)))
        return st;
    size_t row = (size_t)c0->n_vocab * sizeof(float);
    if (logits)
        CUDA_CHECK(cudaMemcpyAsync(logits, c0->bbufs[p->buf_logits], n * row, cudaMemcpyDeviceToHost, c0->stream));
    for (int32_t r = 0; to_rows && r < n; r++) { /* for cuda_session_top / _logits */
        css[r]->last_row = css[r]->dbufs[p->buf_logits];
        css[r]->row_stale = false;
        css[r]->row_gen++;
        css[r]->mk_top_ready = false;
    }
    CUDA_CHECK(cudaStreamSynchronize(c0->stream));
    return QWENRT_OK;
}
