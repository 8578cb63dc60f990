/*
 * megakernel_build.cu — the megakernel's program, built on the host from the decode plan
 * (megakernel.cuh's mk_build, mk_free): each op or fused run of ops becomes a phase (struct
 * mk_phase: an embed, a norm, a GEMV of up to MK_MAX_SEG matrices with its norm / SwiGLU /
 * residual folded in, an attention head sweep, a DeltaNet step, ...), the GEMVs a table of
 * weight segments (struct mk_gdesc) for the ring's chunks, and everything uploaded once.
 * megakernel.cu runs the program; megakernel_internal.cuh has what the two share.
 */
#include "backend/cuda/megakernel_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}

/* ------------------------------------------------------------------ building the program */

struct mk_builder {
    const struct mk_inputs *in;
    struct mk_phase *ph;
    int32_t n_ph, cap_ph;
    int64_t max_row;                  /* bytes of the widest ring row (SwiGLU: both rows) */
    int32_t n_g;                      /* GEMV phases so far */
    int64_t part_floats;              /* attention partials */
    int32_t n_rot;                    /* RoPE dims and base shared by every attention layer */
    float theta;
    int32_t max_heads;                /* counters */
    int32_t max_K, max_attn, max_gdn; /* shared memory needs, floats */
    int32_t *fused;                   /* [n_fused] phases whose dseg.w still names the
                                       * untransposed down matrix (mk_transpose_down) */
    int32_t n_fused;
};

/* Whether the down product (dop d, reading in, adding onto the residual) can join the SwiGLU
 * GEMV phase before it (mk_down): that phase wrote in, nothing else joined it yet, and the
 * down weights are 16-bit rows (transposed exactly: quantised blocks would need requantising)
 * of at most 4 x 4 x threads outputs. */
static bool mk_down_fusable(const struct mk_builder *b, const struct dop *d, const float *in)
{
    const struct mk_phase *pv = b->n_ph > 0 ? &b->ph[b->n_ph - 1] : NULL;
    return b->in->fuse_down && pv && pv->kind == MK_GEMV && pv->mode == GEMV_SWIGLU && !pv->has_down &&
           pv->seg[0].y == in && d->K == pv->seg[0].N && (d->dtype == QR_BF16 || d->dtype == QR_F16) &&
           d->row_bytes == 2 * (int64_t)d->K && d->N % 4 == 0 && d->N <= 16 * b->in->threads &&
           2 * (int64_t)d->N <= MK_STAGE_MIN - 64;
}

/* Joins the down product to the SwiGLU phase before it: its transposed rows become the next
 * GEMV table entry (so the ring streams them right after the gate/up rows). */
static qwenrt_status mk_fuse_down(struct mk_builder *b, const struct dop *d, float *accum_y,
                                  struct qwenrt_error *err)
{
    struct mk_phase *pv = &b->ph[b->n_ph - 1];
    int32_t *f = (int32_t *)xrealloc(b->fused, (size_t)b->n_fused + 1, sizeof(*f));
    if (!f)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    b->fused = f;
    b->fused[b->n_fused++] = b->n_ph - 1; /* an index: b->ph moves as it grows */
    pv->has_down = 1;
    pv->down_g = b->n_g++;
    pv->dseg.w = (const uint8_t *)d->w; /* replaced by the transposed copy (mk_transpose_down) */
    pv->dseg.N = d->K;
    pv->dseg.row_bytes = 2 * (int64_t)d->N;
    pv->dseg.dtype = d->dtype;
    pv->dseg.y = accum_y;
    if (pv->K + 64 > b->max_K)
        b->max_K = pv->K + 64;
    return QWENRT_OK;
}

static int32_t bwid(const struct plan *p, int32_t b) { return p->bufs[b].width; }

static struct mk_phase *mk_push(struct mk_builder *b, int32_t kind)
{
    if (b->n_ph == b->cap_ph) {
        int32_t cap = b->cap_ph ? 2 * b->cap_ph : 128;
        struct mk_phase *ph = (struct mk_phase *)xrealloc(b->ph, (size_t)cap, sizeof(*ph));
        if (!ph)
            return NULL;
        b->ph = ph;
        b->cap_ph = cap;
    }
    struct mk_phase *ph = &b->ph[b->n_ph];
    memset(ph, 0, sizeof(*ph));
    ph->kind = kind;
    return ph;
}

static bool mk_dtype_ok(int32_t dt)
{
    return dt == QR_F32 || dt == QR_F16 || dt == QR_BF16 || dt == QR_Q8_0 || dt == QR_Q4_K ||
           dt == QR_Q6_K;
}

/* A GEMV phase over the matmul/logits ops mm[0..n) reading x (normalised by norm op when
 * norm >= 0). */
static qwenrt_status mk_add_gemv(struct mk_builder *b, int32_t norm, const int32_t *mm, int32_t n,
                                 int32_t mode, float *accum_y, struct qwenrt_error *err)
{
    const struct plan *p = b->in->p;
    const struct plan_op *m0 = &p->ops[mm[0]];
    struct mk_phase *ph = mk_push(b, MK_GEMV);
    if (!ph)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    ph->in = b->in->bufs[m0->in];
    ph->K = b->in->d[mm[0]].K;
    if (ph->K != bwid(p, m0->in))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: matmul K %d != input width %d",
                       ph->K, bwid(p, m0->in));
    if (norm >= 0) /* x is the norm's input; the normalised buffer is never written */
        ph->in = b->in->bufs[p->ops[norm].in], ph->vec = b->in->d[norm].vec,
        ph->eps = p->ops[norm].eps;
    ph->mode = mode;
    ph->n_seg = n;
    for (int32_t k = 0; k < n; k++) {
        const struct dop *d = &b->in->d[mm[k]];
        const struct plan_op *m = &p->ops[mm[k]];
        if (!mk_dtype_ok(d->dtype) || d->K != ph->K || d->N > (1 << 22)) /* row split in 32 bits */
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: matmul op %d (dtype %d, K %d)",
                           mm[k], d->dtype, d->K);
        ph->seg[k].w = (const uint8_t *)d->w;
        ph->seg[k].row_bytes = d->row_bytes;
        ph->seg[k].N = d->N;
        ph->seg[k].dtype = d->dtype;
        ph->seg[k].y = accum_y ? accum_y : b->in->bufs[m->out];
        ph->argmax |= m->kind == OP_LOGITS;
    }
    int64_t per_row = ph->seg[0].row_bytes + (mode == GEMV_SWIGLU ? ph->seg[1].row_bytes : 0);
    if (per_row > (1 << 20))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: rows of %lld bytes",
                       (long long)per_row);
    ph->gidx = b->n_g++;
    if (per_row > b->max_row)
        b->max_row = per_row;
    if (ph->K > b->max_K)
        b->max_K = ph->K;
    b->n_ph++;
    return QWENRT_OK;
}

/* Matches the fusions at op i (same rules as the graph program); *used = ops consumed. */
static qwenrt_status mk_add_op(struct mk_builder *b, int32_t i, int32_t *used,
                               struct qwenrt_error *err)
{
    const struct plan *p = b->in->p;
    const struct plan_op *op = &p->ops[i];
    float *const *B = b->in->bufs;
    const struct dop *d = &b->in->d[i];
    *used = 1;
    struct mk_phase *ph = NULL;
    switch (op->kind) {
    case OP_RMSNORM: {
        int32_t mm[MK_MAX_SEG], n = 0, j = i + 1;
        while (op->group == bwid(p, op->in) && op->in != op->out && j < p->n_ops && n < MK_MAX_SEG &&
               (p->ops[j].kind == OP_MATMUL || p->ops[j].kind == OP_LOGITS) && p->ops[j].in == op->out)
            mm[n++] = j++;
        if (n > 0 && plan_buf_dead_after(p, op->out, j)) {
            const struct plan_op *sw = j < p->n_ops ? &p->ops[j] : NULL;
            bool swiglu = n == 2 && sw && sw->kind == OP_SWIGLU && sw->out == p->ops[mm[0]].out &&
                          sw->in == p->ops[mm[1]].out && b->in->d[mm[0]].N == b->in->d[mm[1]].N &&
                          plan_buf_dead_after(p, sw->in, j + 1);
            *used = j - i + (swiglu ? 1 : 0);
            return mk_add_gemv(b, i, mm, n, swiglu ? GEMV_SWIGLU : GEMV_STORE, NULL, err);
        }
        if (!(ph = mk_push(b, MK_RMSNORM)))
            break;
        ph->out = B[op->out], ph->in = B[op->in], ph->vec = d->vec, ph->eps = op->eps;
        ph->width = bwid(p, op->in), ph->group = op->group;
        b->n_ph++;
        return QWENRT_OK;
    }
    case OP_MATMUL:
    case OP_LOGITS: {
        const struct plan_op *add = i + 1 < p->n_ops ? &p->ops[i + 1] : NULL;
        if (op->kind == OP_MATMUL && add && add->kind == OP_ADD && add->in == op->out &&
            add->out != op->out && op->in != add->out && plan_buf_dead_after(p, op->out, i + 2)) {
            *used = 2;
            if (mk_down_fusable(b, d, B[op->in]))
                return mk_fuse_down(b, d, B[add->out], err);
            return mk_add_gemv(b, -1, &i, 1, GEMV_ACCUM, B[add->out], err);
        }
        return mk_add_gemv(b, -1, &i, 1, GEMV_STORE, NULL, err);
    }
    case OP_QK_NORM_ROPE: {
        const struct plan_op *at = i + 1 < p->n_ops ? &p->ops[i + 1] : NULL;
        if (!at || at->kind != OP_ATTENTION || at->in != op->out || at->in2 != op->in ||
            !(op->head_dim == 64 || op->head_dim == 128 || op->head_dim == 256) ||
            op->head_dim > b->in->threads)
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: attention at op %d", i);
        *used = 2;
        bool gate = i + 2 < p->n_ops && p->ops[i + 2].kind == OP_SIGMOID_GATE &&
                    p->ops[i + 2].out == at->out && p->ops[i + 2].in == at->in;
        if (gate)
            *used = 3;
        if (!plan_buf_dead_after(p, at->in2, i + *used) || !plan_buf_dead_after(p, at->in3, i + *used))
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: k/v read after op %d", i);
        if (!(ph = mk_push(b, MK_ATTN)))
            break;
        ph->out = B[at->out], ph->in = B[at->in], ph->in2 = B[at->in2], ph->in3 = B[at->in3];
        ph->vec = d->vec, ph->vec2 = d->vec2, ph->eps = op->eps;
        ph->kc = b->in->kc[at->layer], ph->vc = b->in->vc[at->layer], ph->kvw = b->in->kv_width;
        ph->n_head = op->n_head, ph->n_head_kv = op->n_head_kv, ph->hd = op->head_dim;
        ph->q_stride = op->q_stride, ph->n_rot = op->n_rot, ph->theta = op->rope_theta;
        if ((b->n_rot && (b->n_rot != op->n_rot || b->theta != op->rope_theta)) || op->n_rot > 1024)
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: layers with different RoPE");
        b->n_rot = op->n_rot, b->theta = op->rope_theta;
        ph->gate = gate;
        int32_t need = 3 * ph->hd + (b->in->threads / 32) * (ph->hd + 2) + ph->hd + 4;
        if (need > b->max_attn)
            b->max_attn = need;
        int64_t pf = (int64_t)ph->n_head * MK_ATTN_SPLITS * (ph->hd + 2);
        b->part_floats = pf > b->part_floats ? pf : b->part_floats;
        b->max_heads = ph->n_head > b->max_heads ? ph->n_head : b->max_heads;
        b->n_ph++;
        return QWENRT_OK;
    }
    case OP_GDN_CONV:
        if (!(ph = mk_push(b, MK_GDN_CONV)))
            break;
        ph->out = B[op->out], ph->vec = d->vec, ph->state = b->in->conv[op->layer];
        ph->width = bwid(p, op->out), ph->conv_k = op->conv_k;
        b->n_ph++;
        return QWENRT_OK;
    case OP_GDN_CORE: {
        const struct plan_op *gn = i + 1 < p->n_ops ? &p->ops[i + 1] : NULL;
        if (!(ph = mk_push(b, MK_GDN_CORE)))
            break;
        ph->out = B[op->out], ph->in = B[op->in], ph->in2 = B[op->in2], ph->in3 = B[op->in3];
        ph->vec2 = d->vec2, ph->vec3 = d->vec3, ph->state = b->in->ssm[op->layer];
        ph->Hk = op->n_k_heads, ph->Hv = op->n_v_heads, ph->dk = op->k_dim, ph->dv = op->v_dim;
        ph->tiled = op->v_head_tiled;
        if (gn && gn->kind == OP_GATED_RMSNORM && gn->out == op->out) {
            ph->gated = 1, ph->z = B[gn->in], ph->gnorm_w = b->in->d[i + 1].vec, ph->geps = gn->eps;
            *used = 2;
        }
        if (2 * ph->dk + ph->dv + 4 > b->max_gdn)
            b->max_gdn = 2 * ph->dk + ph->dv + 4;
        b->max_heads = ph->Hv > b->max_heads ? ph->Hv : b->max_heads;
        b->n_ph++;
        return QWENRT_OK;
    }
    case OP_EMBED:
        if (!(ph = mk_push(b, MK_EMBED)))
            break;
        ph->out = B[op->out], ph->width = bwid(p, op->out);
        ph->w = (const uint8_t *)d->w, ph->row_bytes = d->row_bytes, ph->dtype = d->dtype;
        b->n_ph++;
        return QWENRT_OK;
    case OP_ADD:
    case OP_SWIGLU:
        if (!(ph = mk_push(b, op->kind == OP_ADD ? MK_ADD : MK_SWIGLU)))
            break;
        ph->out = B[op->out], ph->in = B[op->in], ph->width = bwid(p, op->out);
        b->n_ph++;
        return QWENRT_OK;
    default:
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: op %d (%s) has no phase", i,
                       op_kind_name(op->kind));
    }
    return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
}

void mk_free(struct mk_program *mk)
{
    if (!mk)
        return;
    dev_free(mk->allocs, mk->d_ph);
    dev_free(mk->allocs, mk->d_gt);
    dev_free(mk->allocs, mk->d_sched);
    dev_free(mk->allocs, mk->d_gfirst);
    dev_free(mk->allocs, mk->d_part);
    dev_free(mk->allocs, mk->d_freq);
    dev_free(mk->allocs, mk->d_cnt);
    dev_free(mk->allocs, mk->d_sync);
    dev_free(mk->allocs, mk->d_wt);
    xfree(mk->kinds);
    xfree(mk);
}

/* Sizes the ring (stages as large as shared memory allows next to the GEMV table and the
 * scratch, at most MK_STAGE_MAX) and builds the GEMV table with rows per chunk. */
/* Rows per chunk of every GEMV for ring stages of `stage` bytes, and the most chunks any of
 * the nb blocks gets per token (its schedule in shared memory). */
static int64_t mk_fill_table(const struct mk_builder *b, struct mk_gdesc *gt, int64_t stage, int32_t nb)
{
    for (int32_t i = 0; i < b->n_ph; i++) {
        const struct mk_phase *ph = &b->ph[i];
        if (ph->kind != MK_GEMV)
            continue;
        struct mk_gdesc *D = &gt[ph->gidx];
        D->swiglu = ph->mode == GEMV_SWIGLU;
        D->nseg = D->swiglu ? 1 : ph->n_seg;
        int64_t per_row = 0;
        for (int32_t k = 0; k < ph->n_seg; k++) {
            D->w[k] = ph->seg[k].w;
            D->N[k] = ph->seg[k].N;
            D->row_bytes[k] = (int32_t)ph->seg[k].row_bytes;
            if (D->swiglu || ph->seg[k].row_bytes > per_row)
                per_row = D->swiglu ? per_row + ph->seg[k].row_bytes : ph->seg[k].row_bytes;
        }
        D->rpc = (int32_t)((stage - 64) / per_row);
        if (ph->has_down) { /* the transposed down rows: the next entry */
            struct mk_gdesc *T = &gt[ph->down_g];
            T->w[0] = ph->dseg.w, T->N[0] = ph->dseg.N, T->row_bytes[0] = (int32_t)ph->dseg.row_bytes;
            T->nseg = 1, T->swiglu = 0;
            T->rpc = (int32_t)((stage - 64) / ph->dseg.row_bytes);
        }
    }
    int64_t most = 0;
    for (int32_t blk = 0; blk < nb; blk++) { /* the rows of block blk as mk_rows_of_block */
        int64_t n = 0;
        for (int32_t g = 0; g < b->n_g; g++)
            for (int32_t k = 0; k < gt[g].nseg; k++) {
                uint32_t N = (uint32_t)gt[g].N[k];
                int64_t rows = (int64_t)(N * (uint32_t)(blk + 1) / (uint32_t)nb) - (int64_t)(N * (uint32_t)blk / (uint32_t)nb);
                n += (rows + gt[g].rpc - 1) / gt[g].rpc;
            }
        most = n > most ? n : most;
    }
    return most;
}

static qwenrt_status mk_table(const struct mk_builder *b, struct mk_gdesc **out, struct mk_program *mk,
                              struct qwenrt_error *err)
{
    int32_t need = b->max_K > b->max_attn ? b->max_K : b->max_attn;
    need = need > b->max_gdn ? need : b->max_gdn;
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    struct mk_gdesc *gt = (struct mk_gdesc *)xcalloc((size_t)b->n_g, sizeof(*gt));
    if (!gt)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    /* the schedule's size depends on the stage size and the other way round: start without
     * it and grow the reservation until it holds (smaller stages, more chunks) */
    int64_t sched_bytes = 0, stage = 0, chunks = 0;
    size_t fixed = 0;
    for (int iter = 0; iter < 8; iter++) {
        fixed = (((size_t)b->n_g * sizeof(struct mk_gdesc) + (size_t)sched_bytes + 127) & ~(size_t)127) +
                (((size_t)need * 4 + 127) & ~(size_t)127);
        size_t phases = ((size_t)b->n_ph * sizeof(struct mk_phase) + 127) & ~(size_t)127;
        /* the phases go to shared memory when that leaves stages of >= MK_STAGE_MIN bytes */
        int64_t avail = (int64_t)optin - 1024 - (int64_t)fixed; /* 1 KiB: static shared memory */
        mk->ph_in_smem = (avail - (int64_t)phases) / MK_STAGES >= MK_STAGE_MIN;
        if (mk->ph_in_smem) {
            avail -= (int64_t)phases;
            fixed += phases;
        }
        stage = avail / MK_STAGES;
        stage = (stage > MK_STAGE_MAX ? MK_STAGE_MAX : stage) & ~(int64_t)127;
        if (stage < b->max_row + 64) {
            xfree(gt);
            return err_set(err, QWENRT_ERR_UNSUPPORTED,
                           "cuda megakernel: %lld-byte rows do not fit the %lld-byte ring stages",
                           (long long)b->max_row, (long long)stage);
        }
        chunks = mk_fill_table(b, gt, stage, b->in->n_sm);
        int64_t want = chunks * (int64_t)sizeof(struct mk_chunk) + (int64_t)(b->n_g + 1) * 4;
        if (want <= sched_bytes)
            break;
        sched_bytes = want;
    }
    if (chunks * (int64_t)sizeof(struct mk_chunk) + (int64_t)(b->n_g + 1) * 4 > sched_bytes) {
        xfree(gt);
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: the schedule does not fit");
    }
    mk->max_chunks = (int32_t)chunks;
    mk->scratch_floats = need;
    mk->stage_bytes = (int32_t)stage;
    mk->n_g = b->n_g;
    mk->smem = (size_t)MK_STAGES * stage + fixed;
    *out = gt;
    return QWENRT_OK;
}

static qwenrt_status mk_upload(struct mk_program *mk, const struct mk_builder *b,
                               const struct mk_gdesc *gt, struct qwenrt_error *err)
{
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_gt, (size_t)b->n_g * sizeof(struct mk_gdesc)));
    CUDA_CHECK(cudaMemcpy(mk->d_gt, gt, (size_t)b->n_g * sizeof(struct mk_gdesc), cudaMemcpyHostToDevice));
    double freq[513] = {0};
    int32_t nf = b->n_rot / 2 < 512 ? b->n_rot / 2 : 512;
    for (int32_t i = 0; i < nf; i++) /* as the reference: theta^(-2i/n_rot) in double */
        freq[i] = pow((double)b->theta, -2.0 * (double)i / (double)b->n_rot);
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_freq, (size_t)(nf + 1) * sizeof(double)));
    CUDA_CHECK(cudaMemcpy(mk->d_freq, freq, (size_t)(nf + 1) * sizeof(double), cudaMemcpyHostToDevice));
    for (int32_t i = 0; i < b->n_ph; i++)
        b->ph[i].inv_freq = mk->d_freq;
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_ph, (size_t)b->n_ph * sizeof(struct mk_phase)));
    CUDA_CHECK(cudaMemcpy(mk->d_ph, b->ph, (size_t)b->n_ph * sizeof(struct mk_phase), cudaMemcpyHostToDevice));
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_part, (size_t)(b->part_floats + 1) * sizeof(float)));
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_cnt, (size_t)(b->max_heads + 1) * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(mk->d_cnt, 0, (size_t)(b->max_heads + 1) * sizeof(unsigned)));
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_sync, sizeof(struct mk_sync)));
    CUDA_CHECK(cudaMemset(mk->d_sync, 0, sizeof(struct mk_sync)));
    return QWENRT_OK;
}

/* The fused phases' down matrices, transposed into one device buffer (mk->d_wt); each phase's
 * dseg.w then names its copy. Exact: 16-bit values moved, not converted. */
static qwenrt_status mk_transpose_down(struct mk_builder *b, struct mk_program *mk, struct qwenrt_error *err)
{
    int64_t total = 0;
    for (int32_t i = 0; i < b->n_fused; i++)
        total += (int64_t)b->ph[b->fused[i]].dseg.N * b->ph[b->fused[i]].dseg.row_bytes;
    if (total == 0)
        return QWENRT_OK;
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_wt, (size_t)total));
    uint8_t *dst = (uint8_t *)mk->d_wt;
    for (int32_t i = 0; i < b->n_fused; i++) {
        struct mk_seg *d = &b->ph[b->fused[i]].dseg;
        int32_t rows = (int32_t)(d->row_bytes / 2), cols = d->N; /* the original: [outputs][K] */
        qwenrt_status st = mk_transpose16(dst, d->w, rows, cols, err);
        if (st)
            return st;
        d->w = dst;
        dst += (int64_t)d->N * d->row_bytes;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return QWENRT_OK;
}

qwenrt_status mk_build(const struct mk_inputs *in, struct mk_program **out, struct qwenrt_error *err)
{
    *out = NULL;
    if (in->threads != 256 && in->threads != 512)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda megakernel: %d threads (256 or 512)", in->threads);
    struct mk_builder b;
    memset(&b, 0, sizeof(b));
    b.in = in;
    qwenrt_status st = QWENRT_OK;
    int32_t n_logits = 0;
    for (int32_t i = 0; i < in->p->n_ops; i++)
        n_logits += in->p->ops[i].kind == OP_LOGITS;
    for (int32_t i = 0; i < in->p->n_ops && !st;) {
        int32_t used = 1;
        st = mk_add_op(&b, i, &used, err);
        i += used;
    }
    if (!st && (n_logits != 1 || in->p->ops[in->p->n_ops - 1].kind != OP_LOGITS))
        st = err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: the plan must end with its LM head");
    struct mk_program *mk = NULL;
    if (!st && !(mk = (struct mk_program *)xcalloc(1, sizeof(*mk))))
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    if (mk)
        mk->allocs = in->allocs;
    struct mk_gdesc *gt = NULL;
    if (!st)
        st = mk_transpose_down(&b, mk, err);
    if (!st)
        st = mk_table(&b, &gt, mk, err);
    if (!st) {
        mk->n_ph = b.n_ph;
        mk->threads = in->threads;
        mk->kinds = (int32_t *)xcalloc((size_t)b.n_ph, sizeof(int32_t));
        for (int32_t i = 0; mk->kinds && i < b.n_ph; i++)
            mk->kinds[i] = b.ph[i].kind;
        st = mk->kinds ? mk_upload(mk, &b, gt, err)
                       : err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    }
    xfree(gt);
    if (!st)
        st = mk_configure(mk, in->n_sm, err);
    if (!st)
        st = mk_make_schedules(mk, err);
    xfree(b.ph);
    xfree(b.fused);
    if (st) {
        mk_free(mk);
        return st;
    }
    *out = mk;
    return QWENRT_OK;
}
