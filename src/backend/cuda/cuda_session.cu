/*
 * cuda_session.cu — the CUDA backend's session (see cuda_backend.h): device probing, weight
 * upload, state, running plans op by op, a session's life (init, free, reset, snapshot). The
 * files around it (cuda_session.cuh lists them): the options and picks in session_options.cu,
 * the fused decode program and its graphs in decode_program.cu, logits and generation in
 * session_output.cu, measurements in session_measure.cu, the batched step in cuda_batch.cu.
 *
 * Weights: every tensor and small vector the two plans name is copied once into one arena
 * (256-byte aligned entries, so 16-byte vector loads of rows are aligned when the row length
 * allows), which the sessions of one model share (device_weights.cu). Ops are resolved to
 * device pointers at init (struct dop, one per plan op).
 * Buffers: prefill buffers grow with T; decode has its own one-token buffers, so a captured
 * decode graph never sees a pointer change. ids/pos live in device memory (d_ids, d_pos).
 *
 * Prefill (T > 1) runs the prefill plan op by op (run_plan_ops) with one fusion, matmul +
 * residual add as one product accumulating into the residual (skipped when ops are dumped).
 * Its products and attention follow the session's precision (fast_prefill: bf16 products and
 * the flash kernel for Qwen3 models with 16-bit or quantised weights; else f32-accurate).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/prefill_merge.h"
#include "backend/cuda/megakernel.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define QR_LAYERS_MAX_CUDA 1024 /* layers a session handles (hparams allow 256) */

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/l2_plan.h"
#include "base/alloc.h"
#include "base/half.h"
}

#include "backend/cuda/cuda_session.cuh"

/* ------------------------------------------------------------------ probing */

extern "C" bool cuda_backend_compiled(void) { return true; }

extern "C" qwenrt_status cuda_probe(int64_t need_bytes, struct qwenrt_error *err)
{
    int drv = 0, n = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0)
        return err_set(err, QWENRT_ERR_BACKEND,
                       "cuda: no NVIDIA driver found (libcuda.so could not be loaded)");
    if (drv < CUDART_VERSION)
        return err_set(err, QWENRT_ERR_BACKEND,
                       "cuda: the driver supports CUDA %d.%d, qwenrt was built for %d.%d",
                       drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000,
                       CUDART_VERSION % 1000 / 10);
    e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
        return err_set(err, QWENRT_ERR_BACKEND, "cuda: no CUDA device found");
    if (e != cudaSuccess)
        return err_set(err, QWENRT_ERR_BACKEND, "cuda: cannot use the driver: %s",
                       cudaGetErrorString(e));
    int dev = 0, major = 0, minor = 0;
    e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess)
        return err_set(err, QWENRT_ERR_BACKEND, "cuda: cannot query the device: %s", cudaGetErrorString(e));
    if (major < 8) /* the code is sm_90a machine code plus compute_80 PTX (bf16 tensor cores) */
        return err_set(err, QWENRT_ERR_BACKEND,
                       "cuda: the GPU has compute capability %d.%d; qwenrt's kernels need 8.0 or newer", major,
                       minor);
    if (need_bytes > 0) {
        size_t free_b = 0, total = 0;
        e = cudaMemGetInfo(&free_b, &total);
        if (e != cudaSuccess)
            return err_set(err, QWENRT_ERR_BACKEND, "cuda: cannot query device memory: %s",
                           cudaGetErrorString(e));
        if ((int64_t)free_b < need_bytes)
            return err_set(err, QWENRT_ERR_BACKEND,
                           "cuda: too little device memory: need %lld MiB, %lld MiB free of %lld",
                           (long long)(need_bytes >> 20), (long long)(free_b >> 20),
                           (long long)(total >> 20));
    }
    return QWENRT_OK;
}

extern "C" void cuda_device_describe(char *out, int out_len)
{
    cudaDeviceProp p;
    int dev = 0, drv = 0;
    if (out_len <= 0)
        return;
    out[0] = '\0';
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
        return;
    cudaDriverGetVersion(&drv);
    snprintf(out, (size_t)out_len, "%s, %d SMs, %.0f GiB, cc %d.%d, driver CUDA %d.%d", p.name,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), p.major, p.minor,
             drv / 1000, drv % 1000 / 10);
}

/* ------------------------------------------------------------------ weights */

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Registers host memory [host, host+bytes) for upload (once per pointer). */
static bool map_add(struct cuda_session *cs, const void *host, size_t bytes)
{
    if (!host)
        return true;
    for (int32_t i = 0; i < cs->n_map; i++)
        if (cs->map[i].host == host) {
            if (bytes > cs->map[i].bytes)
                return false; /* one pointer, two sizes: a plan bug */
            return true;
        }
    if (cs->n_map == cs->cap_map) {
        int32_t cap = cs->cap_map ? cs->cap_map * 2 : 256;
        struct hostdev *m = (struct hostdev *)xrealloc(cs->map, (size_t)cap, sizeof(*m));
        if (!m)
            return false;
        cs->map = m;
        cs->cap_map = cap;
    }
    cs->map[cs->n_map].host = host;
    cs->map[cs->n_map].bytes = bytes;
    cs->map[cs->n_map].off = cs->arena_bytes;
    cs->arena_bytes += align256(bytes);
    cs->n_map++;
    return true;
}

static const void *dev_ptr(const struct cuda_session *cs, const void *host)
{
    if (!host)
        return NULL;
    for (int32_t i = 0; i < cs->n_map; i++)
        if (cs->map[i].host == host)
            return cs->arena + cs->map[i].off;
    return NULL;
}

/* Floats of op->vec / vec2 / vec3 (which = 0, 1, 2), from the op's geometry. */
static int64_t vec_len(const struct plan *p, const struct plan_op *op, int which)
{
    switch (op->kind) {
    case OP_RMSNORM: return which == 0 ? op->group : 0;
    case OP_QK_NORM_ROPE: return which < 2 ? op->head_dim : 0;
    case OP_GDN_CONV: return which == 0 ? (int64_t)bw(p, op->out) * op->conv_k : 0;
    case OP_GDN_CORE: return which > 0 ? op->n_v_heads : 0;
    case OP_GATED_RMSNORM: return which == 0 ? op->v_dim : 0;
    default: return 0;
    }
}

/* Checks that every op can run here and collects what to upload. */
static qwenrt_status collect(struct cuda_session *cs, struct qwenrt_error *err)
{
    for (int ph = 0; ph < 2; ph++) {
        const struct plan *p = &cs->plans[ph];
        for (int32_t i = 0; i < p->n_ops; i++) {
            const struct plan_op *op = &p->ops[i];
            if (op->w) {
                if (!gemv_supports(op->w->dtype))
                    return err_set(err, QWENRT_ERR_UNSUPPORTED,
                                   "cuda: tensor '%s' has dtype %s, which the CUDA kernels do not handle (f32, f16, bf16, q8_0, q4_k, q6_k)",
                                   op->w->name ? op->w->name : "?",
                                   dtype_traits(op->w->dtype) ? dtype_traits(op->w->dtype)->name : "?");
                if (!map_add(cs, op->w->data, op->w->nbytes))
                    return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
            }
            const float *v[3] = {op->vec, op->vec2, op->vec3};
            for (int k = 0; k < 3; k++)
                if (v[k] && !map_add(cs, v[k], (size_t)vec_len(p, op, k) * sizeof(float)))
                    return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
            if (op->kind == OP_ATTENTION && !attention_supports(op->head_dim))
                return err_set(err, QWENRT_ERR_UNSUPPORTED,
                               "cuda: attention head size %d (layer %d); the kernel handles 64, 128, 256",
                               op->head_dim, op->layer);
            if (op->kind == OP_QK_NORM_ROPE && op->head_dim > 1024)
                return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: head size %d > 1024",
                               op->head_dim);
            if (op->kind == OP_GDN_CORE && !gdn_supports(op->k_dim, op->v_dim))
                return err_set(err, QWENRT_ERR_UNSUPPORTED,
                               "cuda: DeltaNet head sizes k %d, v %d are not handled (k <= 256)",
                               op->k_dim, op->v_dim);
            if (op->kind == OP_GDN_CONV && (op->conv_k < 2 || op->conv_k > 8))
                return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: conv kernel %d (2..8)",
                               op->conv_k);
            if (op->layer + 1 > cs->n_layer)
                cs->n_layer = op->layer + 1;
            if (op->kind == OP_ATTENTION)
                cs->kv_width = op->n_head_kv * op->head_dim;
            if (op->kind == OP_GDN_CONV) {
                cs->conv_rows = op->conv_k - 1;
                cs->conv_dim = bw(p, op->out);
            }
            if (op->kind == OP_GDN_CORE)
                cs->ssm_len = (int64_t)op->n_v_heads * op->k_dim * op->v_dim;
        }
    }
    cs->n_vocab = bw(&cs->plans[PHASE_DECODE], cs->plans[PHASE_DECODE].buf_logits);
    return QWENRT_OK;
}

/* Each op's device pointers into the weights' arena (weights_acquire put them there). */
static qwenrt_status resolve_ops(struct cuda_session *cs, struct qwenrt_error *err)
{
    for (int ph = 0; ph < 2; ph++) {
        const struct plan *p = &cs->plans[ph];
        cs->dops[ph] = (struct dop *)xcalloc((size_t)p->n_ops, sizeof(struct dop));
        if (!cs->dops[ph])
            return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
        for (int32_t i = 0; i < p->n_ops; i++) {
            const struct plan_op *op = &p->ops[i];
            struct dop *d = &cs->dops[ph][i];
            if (op->w) {
                d->w = dev_ptr(cs, op->w->data);
                d->dtype = op->w->dtype;
                d->K = (int32_t)op->w->ne[0];
                d->N = (int32_t)op->w->ne[1];
                d->row_bytes = (int64_t)(op->w->nbytes / (size_t)op->w->ne[1]);
            }
            d->vec = (const float *)dev_ptr(cs, op->vec);
            d->vec2 = (const float *)dev_ptr(cs, op->vec2);
            d->vec3 = (const float *)dev_ptr(cs, op->vec3);
        }
    }
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ state and buffers */

/* Bytes of one KV cache element: 2 with cuda_options.kv_f16, else 4. */
static size_t kv_elem_bytes(const struct cuda_session *cs)
{
    return cs->opt.kv_f16 ? 2 : 4;
}

static size_t state_bytes_needed(const struct cuda_session *cs, const bool *has_kv,
                                 const bool *has_ssm)
{
    size_t n = 0;
    for (int32_t l = 0; l < cs->n_layer; l++) {
        if (has_kv[l])
            n += 2 * align256((size_t)cs->n_ctx * cs->kv_width * kv_elem_bytes(cs));
        if (has_ssm[l])
            n += align256((size_t)cs->conv_rows * cs->conv_dim * sizeof(float)) +
                 align256((size_t)cs->ssm_len * sizeof(float));
    }
    return n;
}

/* The RoPE frequency table for op, when it is the session's (same theta and n_rot), else
 * NULL (the kernel computes them). */
const double *rope_table(const struct cuda_session *cs, const struct plan_op *op)
{
    return cs->rope_freq && op->rope_theta == cs->rope_theta && op->n_rot == cs->rope_n_rot
               ? cs->rope_freq : NULL;
}

/* theta^(-2i/n_rot) in double, as the reference computes it, once per session for the first
 * RoPE op's theta and n_rot (every layer of a model shares them). */
static qwenrt_status alloc_rope_table(struct cuda_session *cs, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind != OP_QK_NORM_ROPE || op->n_rot < 2)
            continue;
        int32_t half = op->n_rot / 2;
        double *f = (double *)xmalloc((size_t)half, sizeof(double));
        if (!f)
            return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
        for (int32_t k = 0; k < half; k++)
            f[k] = pow((double)op->rope_theta, -2.0 * (double)k / (double)op->n_rot);
        cudaError_t e = dev_malloc(cs->opt.allocs, &cs->rope_freq, (size_t)half * sizeof(double));
        if (e == cudaSuccess)
            e = cudaMemcpy(cs->rope_freq, f, (size_t)half * sizeof(double), cudaMemcpyHostToDevice);
        xfree(f);
        if (e != cudaSuccess)
            return cuda_fail(err, e, __FILE__, __LINE__, "rope table");
        cs->rope_theta = op->rope_theta, cs->rope_n_rot = op->n_rot;
        break;
    }
    return QWENRT_OK;
}

#ifndef ATT_SPLIT_BLOCKS_PER_SM
#define ATT_SPLIT_BLOCKS_PER_SM 4 /* 2: Qwen3-0.6B at depth 4096 611 vs 715 tok/s (perf-log, session 10) */
#endif

/* Split-K decode attention: enough blocks for four per multiprocessor, at most
 * ATT_MAX_SPLITS per head; the partials and counters for the widest attention op. */
static qwenrt_status alloc_attention_splits(struct cuda_session *cs, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    int32_t heads = 0, hd = 0;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_ATTENTION) {
            heads = p->ops[i].n_head > heads ? p->ops[i].n_head : heads;
            hd = p->ops[i].head_dim > hd ? p->ops[i].head_dim : hd;
        }
    cs->att_splits = 1;
    if (!heads || !cs->opt.attn_split)
        return QWENRT_OK;
    int32_t s = ATT_SPLIT_BLOCKS_PER_SM * (cs->n_sm > 0 ? cs->n_sm : 132) / heads;
    cs->att_splits = s < 1 ? 1 : s > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : s;
    cs->att_part_floats = (int64_t)heads * cs->att_splits * (hd + 2), cs->att_heads = heads;
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->att_part, (size_t)cs->att_part_floats * sizeof(float)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->att_count, (size_t)heads * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->att_count, 0, (size_t)heads * sizeof(unsigned)));
    return QWENRT_OK;
}

static qwenrt_status alloc_state(struct cuda_session *cs, struct qwenrt_error *err)
{
    bool has_kv[QR_LAYERS_MAX_CUDA] = {false}, has_ssm[QR_LAYERS_MAX_CUDA] = {false};
    if (cs->n_layer > QR_LAYERS_MAX_CUDA)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d layers (at most %d)", cs->n_layer,
                       QR_LAYERS_MAX_CUDA);
    const struct plan *p = &cs->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_ops; i++) {
        if (p->ops[i].kind == OP_ATTENTION)
            has_kv[p->ops[i].layer] = true;
        if (p->ops[i].kind == OP_GDN_CONV)
            has_ssm[p->ops[i].layer] = true;
    }
    cs->kc = (void **)xcalloc((size_t)cs->n_layer + 1, sizeof(void *));
    cs->vc = (void **)xcalloc((size_t)cs->n_layer + 1, sizeof(void *));
    cs->conv = (float **)xcalloc((size_t)cs->n_layer + 1, sizeof(float *));
    cs->ssm = (float **)xcalloc((size_t)cs->n_layer + 1, sizeof(float *));
    if (!cs->kc || !cs->vc || !cs->conv || !cs->ssm)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    cs->state_bytes = state_bytes_needed(cs, has_kv, has_ssm);
    qwenrt_status st = cuda_probe((int64_t)cs->state_bytes + (64 << 20), err);
    if (st)
        return err_prefix(err, "KV cache and state for %d positions: ", cs->n_ctx);
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->state, cs->state_bytes ? cs->state_bytes : 256));
    CUDA_CHECK(cudaMemset(cs->state, 0, cs->state_bytes));
    if ((st = alloc_attention_splits(cs, err)) || (st = alloc_rope_table(cs, err)))
        return st;
    /* the recurrent layers' state first, in one block (cuda_session_snapshot copies it at
     * once), then the KV caches */
    uint8_t *q = (uint8_t *)cs->state;
    for (int32_t l = 0; l < cs->n_layer; l++)
        if (has_ssm[l]) {
            cs->conv[l] = (float *)q, q += align256((size_t)cs->conv_rows * cs->conv_dim * 4);
            cs->ssm[l] = (float *)q, q += align256((size_t)cs->ssm_len * 4);
        }
    cs->rec_bytes = (size_t)(q - (uint8_t *)cs->state);
    for (int32_t l = 0; l < cs->n_layer; l++)
        if (has_kv[l]) {
            size_t b = align256((size_t)cs->n_ctx * cs->kv_width * kv_elem_bytes(cs));
            cs->kc[l] = q, q += b;
            cs->vc[l] = q, q += b;
        }
    return QWENRT_OK;
}

/* Frees bufs; own (NULL: every buffer owns its memory) names the views to leave alone. */
void free_bufs(struct cuda_alloc_count *a, float **b, const int32_t *own)
{
    for (int i = 0; i < PLAN_MAX_BUFS; i++) {
        if (!own || own[i] == i)
            dev_free(a, b[i]);
        b[i] = NULL;
    }
}

/* Allocates bufs for T tokens (the logits buffer for rows rows). With own / off / ld (merged
 * products): buffer i is a view at column off[i] of buffer own[i], rows ld[i] floats long. */
qwenrt_status alloc_bufs(struct cuda_alloc_count *a, const struct plan *p, float **b, int32_t T, int32_t rows,
                         struct qwenrt_error *err, const int32_t *own, const int32_t *off, const int32_t *ld)
{
    for (int32_t i = 0; i < p->n_bufs; i++) {
        if (own && own[i] != i)
            continue;
        size_t n = (size_t)(i == p->buf_logits ? rows : T) * (size_t)(ld ? ld[i] : p->bufs[i].width);
        CUDA_CHECK(dev_malloc(a, &b[i], n * sizeof(float) + 256));
    }
    for (int32_t i = 0; own && i < p->n_bufs; i++)
        if (own[i] != i)
            b[i] = b[own[i]] + off[i];
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ running ops */


/* The context of the decode program's steps: one token, the session's decode buffers. */
struct run_ctx decode_ctx(struct cuda_session *cs)
{
    return {cs, &cs->plans[PHASE_DECODE], cs->dops[PHASE_DECODE], cs->dbufs, 1, false, cs->decode_pdl, cs->stream,
            0, false, NULL, NULL, NULL, NULL, false, NULL};
}

/* Row stride of buffer id in this run (a merged product's outputs share one buffer). */
int32_t ld_of(const struct run_ctx *r, int32_t id)
{
    return r->ld ? r->ld[id] : r->p->bufs[id].width;
}

/* Grows the prefill scratch to n floats (contents not kept); noted instead while a prefill is
 * captured (gemm_ctx.frozen). */
static qwenrt_status scratch_grow(struct cuda_session *cs, int64_t n, struct qwenrt_error *err)
{
    return scratch_grow_to(cs->gemm_ready ? &cs->gemm : NULL, cs->opt.allocs, (void **)&cs->scratch,
                           &cs->scratch_cap, n * (int64_t)sizeof(float), false, cs->stream, err);
}

/* The cuBLASLt context, made on first use. */
static qwenrt_status gemm_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (!cs->gemm_ready) {
        qwenrt_status st = gemm_init(&cs->gemm, cs->opt.allocs, err);
        if (st)
            return st;
        cs->gemm_ready = true;
    }
    cs->gemm.use_cache = cs->opt.gemm_cache;
    return QWENRT_OK;
}


/* The session's choices of GEMV kernel and shape (options and picks) into a launch's args. */
void gemv_session_args(const struct cuda_session *cs, bool pdl, struct gemv_args *a)
{
    a->pdl = pdl, a->v2 = cs->opt.gemv_v2, a->n_sm = cs->n_sm, a->smem = cs->opt.gemv_smem;
    a->smem_warps = cs->gs_warps, a->smem_kb = cs->gs_kb, a->smem_after_wait = cs->gs_after_wait;
    a->smem_min_blocks = cs->gs_min_blocks, a->smem_waves = cs->opt.gemv_smem_waves;
    a->smem_res_min_blocks = cs->gs_res_min_blocks;
    a->smem_pair_min_blocks = cs->gs_pair_min_blocks;
    a->smem_multi_min_blocks = cs->gs_multi_min_blocks;
    a->smem_alone = cs->opt.gemv_smem_alone, a->smem_half_sm = cs->smem_per_sm / 2;
    a->q_rows = cs->gq_rows, a->q_after_wait = cs->gq_after_wait;
    a->q_warps = cs->gq_warps, a->q_smem_kb = cs->gq_kb;
    a->q_head_blocks = cs->opt.gemvq_head_blocks, a->q_int8 = cs->gq_int8;
    a->mma = cs->opt.gemv_mma, a->smem_xreg = cs->opt.gemv_smem_xreg == 1;
    a->q_one_pass = cs->opt.gemvq_one_pass == 1;
    a->smem_norm_late = cs->gs_norm_late;
    a->batch = cs->opt.gemv_batch, a->batch_mma = cs->opt.gemv_batch_mma;
    /* a->T is the launch's: the batched step's quantised products from gemvq_batch_pre tokens
     * (b_qpre: allocated with the batch this session leads, for cap_batch tokens) */
    const int32_t pre = cs->opt.gemvq_batch_pre;
    a->q_pre = pre > 0 && a->T >= pre && a->T <= cs->cap_batch ? cs->b_qpre : NULL;
}

/* Whether the GEMV a (its session's arguments) takes its T tokens in run r: up to gemv_max_T,
 * or in the batched decode step up to GEMV_BATCH_MMA_MAX_T where the tensor cores' multi-token
 * form applies (BF16 rows: 9-16 sessions read each weight once, not through the GEMM; prompts
 * keep the GEMM). */
static bool gemv_takes_T(const struct run_ctx *r, const struct gemv_args &a)
{
    if (a.T <= r->cs->opt.gemv_max_T && a.T <= GEMV_MAX_T)
        return true;
    return r->p == &r->cs->plans[PHASE_DECODE] && a.T <= GEMV_BATCH_MMA_MAX_T && a.batch && a.batch_mma &&
           (gemv_batch_mma_applies(&a) || (a.q_int8 && gemvq_batch_mma_applies(&a)));
}

/* y = x · Wᵀ for T tokens through the GEMV (small T) or the GEMM. */
qwenrt_status run_matmul(struct run_ctx *r, const struct dop *d, const float *x,
                                int32_t ldx, float *y, int32_t ldy, int32_t T, bool accumulate,
                                struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    if (T <= GEMV_BATCH_MMA_MAX_T) {
        struct gemv_args a;
        memset(&a, 0, sizeof(a));
        a.x = x, a.ldx = ldx, a.K = d->K, a.T = T, a.dtype = d->dtype;
        a.mode = accumulate ? GEMV_ACCUM : GEMV_STORE;
        a.n_seg = 1;
        a.seg[0].w = d->w, a.seg[0].N = d->N, a.seg[0].row_bytes = d->row_bytes;
        a.seg[0].y = y, a.seg[0].ldy = ldy;
        gemv_session_args(cs, r->pdl, &a);
        if (r->pf)
            a.pf = *r->pf;
        a.stamps = r->stamps;
        if (r->ahead)
            a.smem_after_wait = a.q_after_wait = false;
        a.y_copy = accumulate ? r->y_copy : NULL;
        if (gemv_takes_T(r, a)) {
            CUDA_CHECK(launch_gemv(&a, r->stream));
            return QWENRT_OK;
        }
    }
    qwenrt_status st = gemm_ready(cs, err);
    if (st)
        return st;
    struct gemm_call c;
    memset(&c, 0, sizeof(c));
    c.y = y, c.x = x, c.w = d->w, c.dtype = d->dtype, c.row_bytes = d->row_bytes;
    c.N = d->N, c.K = d->K, c.T = T, c.ldx = ldx, c.ldy = ldy, c.accumulate = accumulate;
    c.bf16x2 = cs->opt.gemm_bf16x2;
    c.stack3 = cs->opt.gemm_stack3;
    /* decode stays f32; with two x terms, weights bf16 does not hold take two terms too */
    c.fast = cs->fast_prefill && r->p == &cs->plans[PHASE_PREFILL];
    c.x_terms = cs->x_terms;
    c.x_reuse = r->x_reuse;
    return gemm_run(&cs->gemm, &c, r->stream, err);
}

/* The prompt's attention (op i): the flash kernel (fast prefill; its operand pass also writes
 * the prompt's cache rows), or the cache rows written, then the GEMM form (T >= 16) or the
 * per-token kernel. out16: the flash kernel writes bf16 there instead of the f32 output
 * (run_bf16_producer; the caller checked it applies). */
static qwenrt_status run_attention(struct run_ctx *r, int32_t i, __nv_bfloat16 *out16,
                                   struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    const struct plan *p = r->p;
    const struct plan_op *op = &p->ops[i];
    float *const *b = r->b;
    cudaStream_t s = r->stream;
    int32_t T = r->T;
    struct attn_args a;
    memset(&a, 0, sizeof(a));
    a.out = b[op->out], a.q = b[op->in], a.kc = cs->kc[op->layer], a.vc = cs->vc[op->layer];
    a.ldo = ld_of(r, op->out), a.ldq = ld_of(r, op->in), a.q_stride = op->q_stride, a.kvw = cs->kv_width;
    a.n_head = op->n_head, a.n_head_kv = op->n_head_kv, a.hd = op->head_dim;
    a.pos0 = cs->d_pos, a.T = T, a.gate = false;
    a.tiled = cs->opt.attn_tiled, a.pdl = r->pdl;
    a.splits = cs->att_splits, a.part = cs->att_part, a.count = cs->att_count;
    a.split_min = cs->opt.attn_split_min, a.one_split = cs->opt.attn_one_split;
    attn_window(cs, a);
    struct attn_gemm_args ga = {a.out, a.q, a.kc, a.vc, a.ldo, a.ldq, a.q_stride, a.kvw,
                                a.n_head, a.n_head_kv, a.hd, r->pos0, T, cs->fast_prefill, out16,
                                b[op->in2], b[op->in3], ld_of(r, op->in2), ld_of(r, op->in3), cs->opt.kv_f16};
    a.kv_f16 = cs->opt.kv_f16;
    bool fast = T >= 16 && cs->opt.attn_gemm && cs->fast_prefill && cs->opt.attn_flash;
    if (!fast || !attention_flash_applies(&ga)) /* k, v not on 16 bytes: kv_write below */
        ga.kin = ga.vin = NULL;
    bool flash = fast && attention_flash_applies(&ga);
    if (out16 && !flash)
        return err_set(err, QWENRT_ERR_INTERNAL, "cuda: bf16 attention output without the flash kernel");
    if (!ga.kin) /* else the flash kernel's operand pass writes the prompt's cache rows */
        CUDA_CHECK(launch_kv_write(cs->kc[op->layer], cs->vc[op->layer], cs->opt.kv_f16, b[op->in2],
                                   ld_of(r, op->in2), b[op->in3], ld_of(r, op->in3), cs->kv_width, cs->d_pos, T,
                                   s, r->pdl));
    /* the f32 GEMMs read an f32 cache only: an f16 one takes the tiled kernel instead */
    if (T >= 16 && cs->opt.attn_gemm && (flash || !cs->opt.kv_f16)) {
        qwenrt_status st = gemm_ready(cs, err);
        if (st)
            return st;
        return flash ? attention_flash(&cs->gemm, &ga, s, err) : attention_gemm(&cs->gemm, &ga, s, err);
    }
    CUDA_CHECK(launch_attention(&a, s));
    return QWENRT_OK;
}

/* The DeltaNet core's arguments for op i over T tokens (no scratch, no fused norm). */
struct gdn_args gdn_args_of(const struct run_ctx *r, int32_t i, int32_t T)
{
    const struct plan *p = r->p;
    const struct plan_op *op = &p->ops[i];
    const struct dop *d = &r->d[i];
    struct gdn_args a;
    memset(&a, 0, sizeof(a));
    a.out = r->b[op->out], a.qkv = r->b[op->in], a.b = r->b[op->in2], a.a = r->b[op->in3];
    a.ldo = ld_of(r, op->out), a.ldi = ld_of(r, op->in), a.ldb = ld_of(r, op->in2), a.lda = ld_of(r, op->in3);
    a.dt = d->vec2, a.ssm_a = d->vec3, a.state = r->cs->ssm[op->layer];
    a.Hk = op->n_k_heads, a.Hv = op->n_v_heads, a.dk = op->k_dim, a.dv = op->v_dim;
    a.T = T, a.tiled = op->v_head_tiled, a.pdl = r->pdl;
    return a;
}

/* Runs plan op i alone (the reference order of kernels). */
qwenrt_status run_op(struct run_ctx *r, int32_t i, struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    const struct plan *p = r->p;
    const struct plan_op *op = &p->ops[i];
    const struct dop *d = &r->d[i];
    float **b = r->b;
    int32_t T = r->T;
    cudaStream_t s = r->stream;
    int32_t wo = op->out >= 0 ? bw(p, op->out) : 0, wi = op->in >= 0 ? bw(p, op->in) : 0;
    int32_t lo = op->out >= 0 ? ld_of(r, op->out) : 0, li = op->in >= 0 ? ld_of(r, op->in) : 0;
    switch (op->kind) {
    case OP_EMBED:
        CUDA_CHECK(launch_embed(b[op->out], wo, d->w, d->dtype, d->row_bytes, cs->d_ids, T, s,
                                r->pdl));
        break;
    case OP_RMSNORM:
        CUDA_CHECK(launch_rmsnorm(b[op->out], lo, b[op->in], li, d->vec, op->group,
                                  wi / op->group, op->eps, T, s, r->pdl));
        break;
    case OP_MATMUL:
        return run_matmul(r, d, b[op->in], li, b[op->out], lo, T, false, err);
    case OP_ADD:
        CUDA_CHECK(launch_add(b[op->out], b[op->in], (int64_t)T * wo, s, r->pdl));
        break;
    case OP_QK_NORM_ROPE: {
        struct rope_args a;
        memset(&a, 0, sizeof(a));
        a.q = b[op->out], a.k = b[op->in], a.ldq = lo, a.ldk = li;
        a.wq = d->vec, a.wk = d->vec2, a.n_head = op->n_head, a.n_head_kv = op->n_head_kv;
        a.hd = op->head_dim, a.q_stride = op->q_stride, a.n_rot = op->n_rot;
        a.theta = op->rope_theta, a.eps = op->eps, a.pos0 = cs->d_pos, a.T = T, a.pdl = r->pdl;
        a.inv_freq = rope_table(cs, op);
        CUDA_CHECK(launch_qk_norm_rope(&a, s));
        break;
    }
    case OP_ATTENTION:
        return run_attention(r, i, NULL, err);
    case OP_SIGMOID_GATE:
        CUDA_CHECK(launch_sigmoid_gate(b[op->out], lo, b[op->in], li, op->n_head, op->head_dim,
                                       op->q_stride, T, s, r->pdl));
        break;
    case OP_SWIGLU:
        CUDA_CHECK(launch_swiglu(b[op->out], lo, b[op->in], li, wo, T, s, r->pdl));
        break;
    case OP_GDN_CONV:
        if (T > 1 && cs->opt.gdn_par && wo == cs->conv_dim) {
            int64_t C = cs->conv_dim;
            qwenrt_status st = scratch_grow(cs, gdn_conv_par_scratch_floats((int32_t)C, op->conv_k, T), err);
            if (st)
                return st;
            CUDA_CHECK(launch_gdn_conv_par(b[op->out], lo, cs->conv[op->layer], cs->scratch, d->vec,
                                           (int32_t)C, op->conv_k, T, s));
            break;
        }
        CUDA_CHECK(launch_gdn_conv(b[op->out], lo, cs->conv[op->layer], d->vec, cs->conv_dim,
                                   op->conv_k, T, s, r->pdl));
        break;
    case OP_GDN_CORE: {
        struct gdn_args a = gdn_args_of(r, i, T);
        /* prefill: the chunked form (when switched on) or the column scan, with scratch */
        bool par = T > 1 && cs->opt.gdn_par;
        bool chunked = par && cs->opt.gdn_chunked && gdn_chunked_supports(a.dk, a.dv);
        if (chunked || (par && gdn_scan_supports(a.dk, a.dv))) {
            qwenrt_status st = scratch_grow(cs, chunked ? gdn_chunked_scratch_floats(&a) : gdn_scan_scratch_floats(&a), err);
            if (st)
                return st;
            a.scratch = cs->scratch;
            CUDA_CHECK(chunked ? launch_gdn_chunked(&a, cs->opt.gdn_chunked == 2, cs->opt.gdn_scan_warps ? cs->opt.gdn_scan_warps : 8, s) : launch_gdn_scan(&a, s));
            break;
        }
        CUDA_CHECK(launch_gdn_core(&a, s));
        break;
    }
    case OP_GATED_RMSNORM:
        CUDA_CHECK(launch_gated_rmsnorm(b[op->out], lo, b[op->in], li, d->vec, op->n_v_heads,
                                        op->v_dim, op->eps, T, s, r->pdl));
        break;
    case OP_LOGITS: {
        int32_t rows = r->all_logits ? T : 1;
        return run_matmul(r, d, b[op->in] + (size_t)(T - rows) * li, li, b[op->out], lo, rows,
                          false, err);
    }
    default:
        return err_set(err, QWENRT_ERR_INTERNAL, "cuda: op kind %d has no kernel", op->kind);
    }
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ a session's life: free, init */

extern "C" void cuda_session_free(struct cuda_session *cs)
{
    if (!cs)
        return;
    struct cuda_alloc_count *a = cs->opt.allocs; /* the tests' count, or NULL */
    if (cs->stream)
        cudaStreamSynchronize(cs->stream);
    if (cs->g_prefill)
        cudaGraphExecDestroy(cs->g_prefill);
    for (int v = 0; v < 2; v++) {
        if (cs->g_decode[v])
            cudaGraphExecDestroy(cs->g_decode[v]);
        if (cs->g_gen[v])
            cudaGraphExecDestroy(cs->g_gen[v]);
        if (cs->g_gen_k[v])
            cudaGraphExecDestroy(cs->g_gen_k[v]);
        if (cs->g_samp[v])
            cudaGraphExecDestroy(cs->g_samp[v]);
        if (cs->g_samp_k[v])
            cudaGraphExecDestroy(cs->g_samp_k[v]);
    }
    if (cs->gemm_ready)
        gemm_free(&cs->gemm);
    mk_free(cs->mk);
    lm_screen_free(cs->screen);
    free_bufs(a, cs->pbufs, cs->pm.run ? cs->pm.own : NULL);
    free_bufs(a, cs->dbufs);
    free_bufs(a, cs->bbufs);
    dev_free(a, cs->b_part);
    dev_free(a, cs->b_count);
    dev_free(a, cs->b_qpre);
    dev_free(a, cs->b_pos);
    dev_free_host(a, cs->b_stage);
    batch_free(cs);
    dev_free(a, cs->d_ids);
    dev_free(a, cs->d_pos);
    dev_free(a, cs->d_step);
    dev_free(a, cs->am.part);
    dev_free(a, cs->am.count);
    dev_free(a, cs->d_out);
    dev_free(a, cs->d_mk_top);
    dev_free_host(a, cs->h_stage);
    dev_free(a, cs->d_topk);
    dev_free(a, cs->d_top);
    dev_free(a, cs->d_sp);
    dev_free_host(a, cs->h_sp);
    dev_free(a, cs->snap);
    dev_free_host(a, cs->h_top);
    dev_free_host(a, cs->h_row);
    if (cs->top_ev)
        cudaEventDestroy(cs->top_ev);
    dev_free(a, cs->state);
    dev_free(a, cs->att_part);
    dev_free(a, cs->rope_freq);
    dev_free(a, cs->att_count);
    dev_free(a, cs->mlp_part);
    dev_free(a, cs->mlp_count);
    dev_free(a, cs->mlp_acc);
    dev_free(a, cs->ao_part);
    dev_free(a, cs->ao_count);
    weights_release(cs->weights);
    dev_free(a, cs->scratch);
    if (cs->stream && !cs->opt.stream) /* a borrowed one stays its owner's */
        cudaStreamDestroy(cs->stream);
    xfree(cs->kc);
    xfree(cs->vc);
    xfree(cs->conv);
    xfree(cs->ssm);
    xfree(cs->dops[0]);
    xfree(cs->dops[1]);
    merge_layout_free(&cs->pm);
    xfree(cs->map);
    xfree(cs->steps);
    xfree(cs);
}

/* The decode megakernel when opt.mega and the plan allow it; a plan it cannot express
 * (UNSUPPORTED) keeps the graph program, with the reason kept for cuda_session_uses_megakernel. */
static qwenrt_status build_megakernel(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (cs->opt.mega == CUDA_MEGA_OFF) {
        snprintf(cs->mk_why, sizeof(cs->mk_why), "switched off (cuda_options.mega)");
        return QWENRT_OK;
    }
    /* auto: the graph program, which is ahead for every weight type since session 11 (H200,
     * docs/perf-log.md: Qwen3-0.6B BF16 1,200 vs 1,013 tok/s, Q4_K_M 1,128 vs 904, Q8_0 1,040
     * vs 863; Qwen3.5-0.8B Q8_0 887 vs 760) */
    if (cs->opt.mega == CUDA_MEGA_AUTO) {
        snprintf(cs->mk_why, sizeof(cs->mk_why), "the graph program is faster (cuda_options.mega auto)");
        return QWENRT_OK;
    }
    if (cs->opt.kv_f16) {
        snprintf(cs->mk_why, sizeof(cs->mk_why), "the megakernel reads an f32 KV cache (cuda_options.kv_f16 is on)");
        return QWENRT_OK;
    }
    struct mk_inputs in;
    memset(&in, 0, sizeof(in));
    in.p = &cs->plans[PHASE_DECODE];
    in.d = cs->dops[PHASE_DECODE];
    in.bufs = cs->dbufs;
    in.kc = (float *const *)cs->kc, in.vc = (float *const *)cs->vc; /* f32 (kv_f16 refused above) */
    in.conv = cs->conv, in.ssm = cs->ssm;
    in.kv_width = cs->kv_width, in.conv_dim = cs->conv_dim, in.n_sm = cs->n_sm;
    in.threads = cs->opt.mega_threads;
    in.fuse_down = cs->opt.mega_fuse_down;
    in.allocs = cs->opt.allocs;
    struct qwenrt_error e2;
    memset(&e2, 0, sizeof(e2));
    qwenrt_status st = mk_build(&in, &cs->mk, &e2);
    if (st == QWENRT_ERR_UNSUPPORTED) {
        snprintf(cs->mk_why, sizeof(cs->mk_why), "%.150s", e2.message);
        return QWENRT_OK;
    }
    if (st && err)
        *err = e2;
    return st;
}

/* The prefill's merged products (prefill_merge.h; cuda_options.gemm_merge) over the weights
 * as uploaded: the arena is laid out in plan order, so q, k and v (gate and up, ...) lie back
 * to back. */
static qwenrt_status plan_merges(struct cuda_session *cs, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_PREFILL];
    const struct dop *d = cs->dops[PHASE_PREFILL];
    struct merge_weight *wts = (struct merge_weight *)xcalloc((size_t)(p->n_ops > 0 ? p->n_ops : 1), sizeof(*wts));
    if (!wts)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    for (int32_t i = 0; i < p->n_ops; i++)
        wts[i].w = d[i].w, wts[i].dtype = d[i].dtype, wts[i].K = d[i].K, wts[i].N = d[i].N,
        wts[i].row_bytes = d[i].row_bytes;
    qwenrt_status st = merge_layout_make(p, wts, cs->opt.gemm_merge, &cs->pm, err);
    xfree(wts);
    return st;
}

static qwenrt_status init_device(struct cuda_session *cs, pthread_mutex_t *mu, struct cuda_weights **slot,
                                 struct qwenrt_error *err)
{
    qwenrt_status st = collect(cs, err);
    if (st || (st = weights_acquire(cs, mu, slot, err)))
        return st;
    if (cs->opt.stream)
        cs->stream = (cudaStream_t)cs->opt.stream;
    else
        CUDA_CHECK(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking));
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->n_sm, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    if ((st = resolve_ops(cs, err)) || (st = alloc_state(cs, err)) || (st = plan_merges(cs, err)))
        return st;
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_ids, (size_t)cs->n_ctx * sizeof(int32_t)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_out, (size_t)cs->n_ctx * sizeof(int32_t)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_mk_top, 2 * sizeof(int32_t)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_pos, sizeof(int32_t)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_step, sizeof(int32_t)));
    cs->am.blocks = cs->opt.argmax_blocks ? cs->opt.argmax_blocks : ARGMAX_BLOCKS_DEFAULT;
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->am.part, (size_t)cs->am.blocks * sizeof(int2)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->am.count, sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->am.count, 0, sizeof(unsigned)));
    CUDA_CHECK(dev_malloc_host(cs->opt.allocs, &cs->h_stage, 4 * sizeof(int32_t)));
    if ((st = alloc_bufs(cs->opt.allocs, &cs->plans[PHASE_DECODE], cs->dbufs, 1, 1, err)))
        return st;
    if ((st = build_program(cs, err)))
        return st;
    pick_gemv_smem_shape(cs);
    cs->gq_rows = pick_gemvq_rows(cs);
    bool gq_pdl = pick_gemvq_shape(cs);
    cs->fast_prefill = cs->opt.prefill_bf16 && fast_prefill_applies(&cs->plans[PHASE_PREFILL]);
    cs->decode_pdl = cs->opt.pdl || gq_pdl || (cs->opt.gemv_smem && decode_pdl_applies(&cs->plans[PHASE_DECODE]));
    cs->x_terms = fast_x_terms(&cs->opt, &cs->plans[PHASE_PREFILL]);
    if ((st = finish_program(cs, err)))
        return st;
    return build_megakernel(cs, err);
}

extern "C" qwenrt_status cuda_session_init(const struct plan *plans, int32_t n_ctx,
                                           const struct cuda_options *opt,
                                           struct cuda_session **out, struct qwenrt_error *err)
{
    return cuda_session_init_shared(plans, n_ctx, opt, NULL, NULL, out, err);
}

extern "C" qwenrt_status cuda_session_init_shared(const struct plan *plans, int32_t n_ctx,
                                                  const struct cuda_options *opt, pthread_mutex_t *mu,
                                                  struct cuda_weights **slot, struct cuda_session **out,
                                                  struct qwenrt_error *err)
{
    *out = NULL;
    qwenrt_status st = opt ? check_options(opt, err) : QWENRT_OK;
    if (st || (st = cuda_probe(0, err)))
        return st;
    struct cuda_session *cs = (struct cuda_session *)xcalloc(1, sizeof(*cs));
    if (!cs)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    cs->plans = plans;
    cs->n_ctx = n_ctx;
    cs->opt = opt ? *opt : cuda_default_options();
    st = init_device(cs, mu, slot, err);
    if (st) {
        cuda_session_free(cs);
        return st;
    }
    *out = cs;
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ running a plan */

/* Copies ids and pos0 to the device (stream-ordered). */
qwenrt_status stage_inputs(struct cuda_session *cs, const int32_t *ids, int32_t T,
                                  int32_t pos0, struct qwenrt_error *err)
{
    if (T == 1) {
        if (cs->unsynced) /* the last run's copies from h_stage may not have happened yet */
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        cs->unsynced = false;
        cs->h_stage[0] = ids[0];
        cs->h_stage[1] = pos0;
        CUDA_CHECK(cudaMemcpyAsync(cs->d_ids, &cs->h_stage[0], 4, cudaMemcpyHostToDevice, cs->stream));
        CUDA_CHECK(cudaMemcpyAsync(cs->d_pos, &cs->h_stage[1], 4, cudaMemcpyHostToDevice, cs->stream));
        return QWENRT_OK;
    }
    CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* h_stage may still be in flight */
    cs->h_stage[1] = pos0;
    CUDA_CHECK(cudaMemcpyAsync(cs->d_ids, ids, (size_t)T * 4, cudaMemcpyHostToDevice, cs->stream));
    CUDA_CHECK(cudaMemcpyAsync(cs->d_pos, &cs->h_stage[1], 4, cudaMemcpyHostToDevice, cs->stream));
    return QWENRT_OK;
}

/* The op-by-op path with dumps: after each dumped op, copy its output back. */
/* Op i is a product that takes the fast GEMM (gemm_run_bf16): the fast prefill, more tokens
 * than the GEMV takes, 16-bit or quantised weights, K a multiple of 8. */
static bool fast_gemm_op(const struct run_ctx *r, int32_t i)
{
    const struct cuda_session *cs = r->cs;
    const struct dop *d = &r->d[i];
    return r->p->ops[i].kind == OP_MATMUL && cs->fast_prefill && r->p == &cs->plans[PHASE_PREFILL] &&
           !(r->T <= cs->opt.gemv_max_T && r->T <= GEMV_MAX_T) && d->dtype != QR_F32 && d->K % 8 == 0;
}

/* Whether the prompt's attention at op i runs the flash kernel (which can write bf16). */
static bool attention_bf16_ok(const struct run_ctx *r, int32_t i)
{
    const struct cuda_session *cs = r->cs;
    const struct plan_op *op = &r->p->ops[i];
    struct attn_gemm_args ga;
    memset(&ga, 0, sizeof(ga));
    ga.out = r->b[op->out], ga.q = r->b[op->in], ga.kc = cs->kc[op->layer], ga.vc = cs->vc[op->layer];
    ga.ldo = ld_of(r, op->out), ga.ldq = ld_of(r, op->in), ga.q_stride = op->q_stride;
    ga.kvw = cs->kv_width, ga.n_head = op->n_head, ga.n_head_kv = op->n_head_kv, ga.hd = op->head_dim;
    return r->T >= 16 && cs->opt.attn_gemm && cs->fast_prefill && cs->opt.attn_flash &&
           attention_flash_applies(&ga);
}

/* The fast prefill's product inputs written in bf16 by their producer (one pass instead of
 * an f32 store and a rounding pass): an RMS norm of whole rows read only by the fast products
 * right after it (q, k, v; gate, up), SwiGLU read only by the down product, DeltaNet's gated
 * norm read only by the out projection, or the flash attention's output read only by the o
 * product (x in one bf16 term only; the others also write two terms).
 * Returns the buffer now held in bf16 (the f32 buffer is not written), or -1 when op i is not such a
 * producer (nothing is run then). */
static int32_t run_bf16_producer(struct run_ctx *r, int32_t i, qwenrt_status *st, struct qwenrt_error *err)
{
    const struct plan *p = r->p;
    const struct plan_op *op = &p->ops[i];
    const struct dop *d = &r->d[i];
    int32_t j = i + 1, wo = op->out >= 0 ? bw(p, op->out) : 0;
    int32_t terms = r->cs->x_terms;
    if (!r->cs->opt.fuse || op->in == op->out ||
        (op->kind != OP_RMSNORM && op->kind != OP_SWIGLU && op->kind != OP_ATTENTION &&
         op->kind != OP_GATED_RMSNORM))
        return -1;
    if (op->kind == OP_ATTENTION && terms != 1) /* the flash kernel writes one term */
        return -1;
    if (op->kind == OP_RMSNORM && op->group != bw(p, op->in))
        return -1;
    if (op->kind == OP_ATTENTION && !attention_bf16_ok(r, i))
        return -1;
    while (j < p->n_ops && p->ops[j].kind == OP_MATMUL && p->ops[j].in == op->out && fast_gemm_op(r, j) &&
           r->d[j].K == wo)
        j++;
    if (j == i + 1 || (op->kind != OP_RMSNORM && j != i + 2) || !plan_buf_dead_after(p, op->out, j))
        return -1;
    __nv_bfloat16 *slot = NULL;
    if ((*st = gemm_ready(r->cs, err)) ||
        (*st = gemm_x_slot(&r->cs->gemm, r->b[op->out], r->T, wo, ld_of(r, op->out), terms, &slot, err)))
        return -1;
    if (op->kind == OP_ATTENTION)
        return (*st = run_attention(r, i, slot, err)) ? -1 : op->out;
    __nv_bfloat16 *mid = terms == 2 ? slot + (int64_t)r->T * wo : NULL;
    cudaError_t e;
    if (op->kind == OP_RMSNORM)
        e = launch_rmsnorm_bf16(slot, mid, r->b[op->in], ld_of(r, op->in), d->vec, wo, op->eps, r->T, r->stream);
    else if (op->kind == OP_SWIGLU)
        e = launch_swiglu_bf16(slot, mid, r->b[op->out], ld_of(r, op->out), r->b[op->in], ld_of(r, op->in),
                               wo, r->T, r->stream);
    else /* the gated norm, in place on out in the f32 form */
        e = launch_gated_rmsnorm_bf16(slot, mid, r->b[op->out], ld_of(r, op->out), r->b[op->in], ld_of(r, op->in), d->vec,
                                      op->n_v_heads, op->v_dim, op->eps, r->T, r->stream);
    if (e != cudaSuccess)
        *st = cuda_fail(err, e, __FILE__, __LINE__, "bf16 producer");
    return op->out;
}

/* Products i .. i + merge[i] - 1 (plan_merges) as one: their weights lie back to back in the
 * arena, their outputs are views side by side in op i's buffer. */
static qwenrt_status run_merged(struct run_ctx *r, int32_t i, struct qwenrt_error *err)
{
    const struct plan_op *op = &r->p->ops[i];
    struct dop d = r->d[i];
    for (int32_t k = 1; k < r->merge[i]; k++)
        d.N += r->d[i + k].N;
    return run_matmul(r, &d, r->b[op->in], ld_of(r, op->in), r->b[op->out], ld_of(r, op->out), r->T,
                      false, err);
}

static qwenrt_status run_plan_ops(struct run_ctx *r, cuda_dump_fn dump, void *user,
                                  struct qwenrt_error *err)
{
    int32_t bf16_buf = -1; /* a buffer a producer just wrote in bf16 only (run_bf16_producer) */
    float *host = NULL;
    size_t host_n = 0;
    qwenrt_status st = QWENRT_OK;
    for (int32_t i = 0; i < r->p->n_ops && !st; i++) {
        const struct plan_op *op = &r->p->ops[i];
        /* a product right after another one reading the same buffer (a product never writes
         * its own input), or right after the op that wrote its input in bf16 only, reuses
         * that bf16 copy */
        bool same = i > 0 && r->p->ops[i - 1].kind == OP_MATMUL && r->p->ops[i - 1].in == op->in &&
                    r->p->ops[i - 1].out != op->in;
        r->x_reuse = op->kind == OP_MATMUL && (same || op->in == bf16_buf);
        if (op->kind != OP_MATMUL)
            bf16_buf = -1;
        if (!dump && (bf16_buf = run_bf16_producer(r, i, &st, err)) >= 0)
            continue;
        if (st)
            break;
        if (!dump && r->merge && r->merge[i] >= 2) { /* products merged into one (plan_merges) */
            st = run_merged(r, i, err);
            i += r->merge[i] - 1;
            continue;
        }
        if (!dump && r->cs->opt.fuse && plan_matmul_add_fusable(r->p, i)) { /* the residual add in
                                                                         * the product */
            const struct plan_op *add = &r->p->ops[i + 1];
            st = run_matmul(r, &r->d[i], r->b[op->in], ld_of(r, op->in), r->b[add->out],
                            ld_of(r, add->out), r->T, true, err);
            i++;
            continue;
        }
        st = run_op(r, i, err);
        if (st || !dump || !op->dump)
            continue;
        int32_t rows = op->kind == OP_LOGITS && !r->all_logits ? 1 : r->T;
        size_t n = (size_t)rows * bw(r->p, op->out);
        if (n > host_n) {
            xfree(host);
            host = (float *)xmalloc(n, sizeof(float));
            host_n = host ? n : 0;
            if (!host) {
                st = err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory for a dump");
                break;
            }
        }
        size_t w = (size_t)bw(r->p, op->out);
        cudaError_t e = cudaMemcpy2DAsync(host, w * sizeof(float), r->b[op->out],
                                          (size_t)ld_of(r, op->out) * sizeof(float), w * sizeof(float),
                                          (size_t)rows, cudaMemcpyDeviceToHost, r->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(r->stream);
        if (e != cudaSuccess) {
            st = cuda_fail(err, e, __FILE__, __LINE__, "dump copy");
            break;
        }
        dump(user, op->dump, op->layer, host, rows, bw(r->p, op->out));
    }
    r->x_reuse = false;
    xfree(host);
    return st;
}

/* Captures the prefill's launches (run_plan_ops) into *g with the scratch frozen (gemm_ctx):
 * what would have grown is left in cs->gemm.pending. */
static qwenrt_status capture_plan(struct run_ctx *r, cudaGraph_t *g, struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    *g = NULL;
    cs->gemm.frozen = true;
    cs->gemm.n_pending = 0;
    cudaError_t e = cudaStreamBeginCapture(cs->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cs->gemm.frozen = false;
        return cuda_fail(err, e, __FILE__, __LINE__, "cudaStreamBeginCapture (prefill)");
    }
    qwenrt_status st = run_plan_ops(r, NULL, NULL, err);
    e = cudaStreamEndCapture(cs->stream, g);
    cs->gemm.frozen = false;
    if (!st && e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cudaStreamEndCapture (prefill)");
    cudaGetLastError(); /* a capture that failed above leaves its error behind */
    return st;
}

/* Launches g through the session's prefill graph: updated in place where its kernels are the
 * last prefill's (the same T and program, new arguments), else instantiated anew. */
static qwenrt_status launch_plan_graph(struct cuda_session *cs, cudaGraph_t g, struct qwenrt_error *err)
{
    cudaGraphExecUpdateResultInfo info;
    if (cs->g_prefill && cudaGraphExecUpdate(cs->g_prefill, g, &info) == cudaSuccess) {
        cs->prefill_graphs[1]++;
    } else {
        cudaGetLastError(); /* a refused update is no error: the graph is made anew */
        if (cs->g_prefill)
            cudaGraphExecDestroy(cs->g_prefill);
        cs->g_prefill = NULL;
        CUDA_CHECK(cudaGraphInstantiate(&cs->g_prefill, g, 0));
        cs->prefill_graphs[0]++;
    }
    CUDA_CHECK(cudaGraphLaunch(cs->g_prefill, cs->stream));
    return QWENRT_OK;
}

/* The prefill as one graph launch (cuda_options.prefill_graph). A capture that would grow a
 * scratch buffer is thrown away, the buffers grown, and the prefill captured again. That can take
 * more than two captures: some paths depend on whether a buffer exists at all (a frozen,
 * never-made x slot is NULL, and a NULL slot takes the products' own conversions and no flash
 * attention), so the capture after the first growth may ask for more. Buffers only grow, so the
 * captures settle; one that fails otherwise, or that has not settled after
 * PREFILL_CAPTURE_ATTEMPTS, runs outside a graph, where an error of the prefill's own is
 * reported as before; prefill_graphs counts each way (cuda_session_prefill_graphs). */
#define PREFILL_CAPTURE_ATTEMPTS 8
static qwenrt_status run_plan_graph(struct run_ctx *r, struct qwenrt_error *err)
{
    struct cuda_session *cs = r->cs;
    qwenrt_status st = gemm_ready(cs, err); /* its handle and workspace are made outside a capture */
    if (st)
        return st;
    char why[sizeof(cs->prefill_why)] = "";
    for (int attempt = 0; attempt < PREFILL_CAPTURE_ATTEMPTS; attempt++) {
        cudaGraph_t g = NULL;
        st = capture_plan(r, &g, err);
        if (!st && !cs->gemm.n_pending) {
            st = launch_plan_graph(cs, g, err);
            cudaGraphDestroy(g);
            return st;
        }
        if (g)
            cudaGraphDestroy(g);
        cs->gemm.xb_src = NULL; /* the memo names a conversion the thrown-away capture never ran */
        if (!cs->gemm.n_pending) { /* a failure of its own: the plain run below reports it, or runs */
            snprintf(why, sizeof(why), "%.180s", err ? err->message : "the capture failed");
            break;
        }
        char grew[128];
        scratch_describe(&cs->gemm, grew, sizeof(grew));
        snprintf(why, sizeof(why), "its scratch buffers still grew after %d captures (the last: %.100s)",
                 PREFILL_CAPTURE_ATTEMPTS, grew);
        if ((st = scratch_apply(&cs->gemm, cs->stream, err)))
            return st; /* no memory for the growth */
    }
    memcpy(cs->prefill_why, why, sizeof(why));
    cs->prefill_graphs[2]++;
    return run_plan_ops(r, NULL, NULL, err);
}

extern "C" qwenrt_status cuda_session_run(struct cuda_session *cs, const int32_t *ids,
                                          int32_t T, int32_t pos0, bool all_logits,
                                          float *logits, cuda_dump_fn dump, void *dump_user,
                                          struct qwenrt_error *err)
{
    if (T < 1 || pos0 < 0 || pos0 + T > cs->n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d tokens at position %d exceed the context of %d",
                       T, pos0, cs->n_ctx);
    qwenrt_status st = stage_inputs(cs, ids, T, pos0, err);
    if (st)
        return st;
    int ph = T == 1 ? PHASE_DECODE : PHASE_PREFILL;
    const struct plan *p = &cs->plans[ph];
    int32_t rows = all_logits ? T : 1;
    float **b = cs->dbufs;
    if (ph == PHASE_PREFILL) {
        if (T > cs->cap_T || rows > cs->cap_rows) {
            int32_t capT = T > cs->cap_T ? T : cs->cap_T;
            int32_t cap_rows = rows > cs->cap_rows ? rows : cs->cap_rows;
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
            free_bufs(cs->opt.allocs, cs->pbufs, cs->pm.run ? cs->pm.own : NULL);
            cs->cap_T = cs->cap_rows = 0;
            if ((st = alloc_bufs(cs->opt.allocs, p, cs->pbufs, capT, cap_rows, err, cs->pm.own, cs->pm.off, cs->pm.ld)))
                return st;
            cs->cap_T = capT, cs->cap_rows = cap_rows;
        }
        b = cs->pbufs;
    }
    struct run_ctx r = {cs, p, cs->dops[ph], b, T, all_logits, false, cs->stream, pos0, false,
                        ph == PHASE_PREFILL ? cs->pm.ld : NULL, ph == PHASE_PREFILL ? cs->pm.run : NULL, NULL, NULL,
                        false, NULL};
    cs->mk_top_ready = false;
    if (ph == PHASE_DECODE && !dump) {
        if (cs->mk) { /* the step's argmax comes along (cuda_session_top's greedy shortcut) */
            if ((st = mk_run(cs->mk, cs->stream, cs->d_ids, cs->d_pos, cs->d_mk_top, NULL, 1, false, NULL, err)))
                return st;
            cs->mk_top_ready = true;
        } else if (cs->opt.graph) {
            int v = cs->cl_variant = attn_variant(cs, pos0, 1);
            if (!cs->g_decode[v] && (st = capture(cs, GEN_NONE, 1, &cs->g_decode[v], err)))
                return st;
            CUDA_CHECK(cudaGraphLaunch(cs->g_decode[v], cs->stream));
        } else {
            cs->cl_variant = attn_variant(cs, pos0, 1);
            if ((st = enqueue_decode(cs, err)))
                return st;
        }
    } else if (ph == PHASE_PREFILL && !dump && cs->opt.prefill_graph) {
        if ((st = run_plan_graph(&r, err)))
            return st;
    } else if ((st = run_plan_ops(&r, dump, dump_user, err))) {
        return st;
    }
    cs->last_row = b[p->buf_logits] + (size_t)(rows - 1) * cs->n_vocab;
    cs->row_stale = false;
    cs->row_gen++;
    if (!logits && !all_logits) { /* the row stays on the device (cuda_session_top) */
        cs->unsynced = true;
        return QWENRT_OK;
    }
    if (!logits)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: all_logits without a logits buffer");
    CUDA_CHECK(cudaMemcpyAsync(logits, b[p->buf_logits], (size_t)rows * cs->n_vocab * sizeof(float),
                               cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ state: snapshot, reset, read */

extern "C" qwenrt_status cuda_session_snapshot(struct cuda_session *cs, bool restore, struct qwenrt_error *err)
{
    if (restore && !cs->snap_saved)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no saved state to restore");
    if (!cs->rec_bytes)
        return QWENRT_OK;
    if (!cs->snap) {
        cudaError_t e = dev_malloc(cs->opt.allocs, &cs->snap, cs->rec_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cs->snap = NULL;
            return err_set(err, QWENRT_ERR_NOMEM, "cuda: no device memory for a copy of the recurrent state (%zu bytes)",
                           cs->rec_bytes);
        }
    }
    CUDA_CHECK(cudaMemcpyAsync(restore ? cs->state : cs->snap, restore ? cs->snap : cs->state, cs->rec_bytes,
                               cudaMemcpyDeviceToDevice, cs->stream));
    cs->snap_saved = true;
    return QWENRT_OK;
}

/* The recurrent layers' conv and state rows lie in one block at the start of cs->state
 * (alloc_state), so one memset clears them all: Qwen3.5-0.8B's 18 DeltaNet layers took 36
 * before session 60, each a submission of its own (the slow state's count, perf-log). */
extern "C" qwenrt_status cuda_session_reset(struct cuda_session *cs, struct qwenrt_error *err)
{
    cs->row_gen++; /* a pick started ahead is for the old state */
    if (cs->rec_bytes)
        CUDA_CHECK(cudaMemsetAsync(cs->state, 0, cs->rec_bytes, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    return QWENRT_OK;
}

/* n floats between a KV cache (f32, or f16 with opt.kv_f16) and host f32, either way; an f16
 * cache goes through a host buffer, converted to / rounded from f32 on the host. */
static qwenrt_status kv_copy(struct cuda_session *cs, void *dev, int64_t n, float *host, bool to_host,
                             struct qwenrt_error *err)
{
    if (!cs->opt.kv_f16) {
        CUDA_CHECK(cudaMemcpyAsync(to_host ? (void *)host : dev, to_host ? (const void *)dev : (const void *)host,
                                   (size_t)n * sizeof(float), to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                   cs->stream));
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        return QWENRT_OK;
    }
    uint16_t *h = (uint16_t *)xmalloc((size_t)n, sizeof(uint16_t));
    if (!h)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory for a KV cache copy of %lld values", (long long)n);
    for (int64_t i = 0; !to_host && i < n; i++)
        h[i] = f32_to_f16(host[i]);
    cudaError_t e = cudaMemcpyAsync(to_host ? (void *)h : dev, to_host ? (const void *)dev : (const void *)h,
                                    (size_t)n * sizeof(uint16_t),
                                    to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, cs->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cs->stream);
    for (int64_t i = 0; e == cudaSuccess && to_host && i < n; i++)
        host[i] = f16_to_f32(h[i]);
    xfree(h);
    CUDA_CHECK(e);
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_read_kv(struct cuda_session *cs, int32_t layer, bool v,
                                              int32_t n_pos, float *dst, struct qwenrt_error *err)
{
    if (layer < 0 || layer >= cs->n_layer || !cs->kc[layer] || n_pos < 0 || n_pos > cs->n_ctx)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: layer %d has no KV cache of %d rows",
                       layer, n_pos);
    return kv_copy(cs, v ? cs->vc[layer] : cs->kc[layer], (int64_t)n_pos * cs->kv_width, dst, true, err);
}

extern "C" qwenrt_status cuda_session_state_io(struct cuda_session *cs, int32_t layer,
                                              enum cuda_state_part part, int64_t n_floats,
                                              float *host, bool to_host, struct qwenrt_error *err)
{
    void *dev = NULL;
    int64_t cap = 0;
    if (!to_host)
        cs->row_gen++; /* a pick started ahead is for the old state */
    if (layer >= 0 && layer < cs->n_layer) {
        switch (part) {
        case CUDA_STATE_K: dev = cs->kc[layer], cap = (int64_t)cs->n_ctx * cs->kv_width; break;
        case CUDA_STATE_V: dev = cs->vc[layer], cap = (int64_t)cs->n_ctx * cs->kv_width; break;
        case CUDA_STATE_CONV: dev = cs->conv[layer], cap = (int64_t)cs->conv_rows * cs->conv_dim; break;
        case CUDA_STATE_SSM: dev = cs->ssm[layer], cap = cs->ssm_len; break;
        }
    }
    if (!dev || n_floats < 0 || n_floats > cap)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: layer %d has no state part %d of %lld floats",
                       layer, (int)part, (long long)n_floats);
    if (n_floats == 0)
        return QWENRT_OK;
    if (part == CUDA_STATE_K || part == CUDA_STATE_V)
        return kv_copy(cs, dev, n_floats, host, to_host, err);
    size_t bytes = (size_t)n_floats * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(to_host ? (void *)host : (void *)dev, to_host ? (const void *)dev : (const void *)host,
                               bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    return QWENRT_OK;
}

extern "C" const void *cuda_session_weights(const struct cuda_session *cs)
{
    return cs ? cs->arena : NULL;
}

extern "C" int64_t cuda_session_device_bytes(const struct cuda_session *cs)
{
    return cs ? (int64_t)(cs->arena_bytes + cs->state_bytes) : 0;
}

