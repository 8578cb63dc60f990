/*
 * cuda_session.cu — the CUDA backend's session (see cuda_backend.h): device probing, weight
 * upload, state, running plans op by op, the fused decode program, CUDA graphs, and the
 * on-GPU greedy loop. The server's batched step over several sessions is cuda_batch.cu; what
 * the two share (the session's struct, the steps, a run's context) is cuda_session.cuh.
 *
 * Weights: every tensor and small vector the two plans name is copied once into one arena
 * (256-byte aligned entries, so 16-byte vector loads of rows are aligned when the row length
 * allows). Ops are resolved to device pointers at init (struct dop, one per plan op).
 * Buffers: prefill buffers grow with T; decode has its own one-token buffers, so a captured
 * decode graph never sees a pointer change. ids/pos live in device memory (d_ids, d_pos).
 *
 * Decode program (opt.fuse): a pass over the decode plan rewrites runs of ops into steps:
 *   rmsnorm + the matmuls reading its output   -> one GEMV with the norm fused (q|k|v in one
 *                                                 launch, DeltaNet qkv|z|b|a in one launch)
 *   matmul gate + matmul up + swiglu           -> one GEMV with the SwiGLU epilogue
 *   matmul + add (residual)                    -> one GEMV with y += epilogue
 *   qk_norm_rope + attention (+ sigmoid gate)  -> rope kernel that writes the KV cache, then
 *                                                 attention with the output gate
 *   final rmsnorm + logits                     -> one GEMV with the norm fused
 * A fusion applies only when the intermediate buffer is dead afterwards (buf_dead_after).
 * Without opt.fuse the program is the plan, op by op: the unfused twin stays runnable.
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

static const char *step_label(const struct plan *p, const struct step *st);

static qwenrt_status stage_inputs(struct cuda_session *cs, const int32_t *ids, int32_t T,
                                  int32_t pos0, struct qwenrt_error *err);

/* ------------------------------------------------------------------ probing */

extern "C" struct cuda_options cuda_default_options(void)
{
    struct cuda_options o;
    memset(&o, 0, sizeof(o)); /* a field not named below is 0 / false / NULL */
    o.graph = true;
    o.fuse = true;
    o.gemm_bf16x2 = true;
    o.gemv_max_T = GEMV_MAX_T;
    o.gemv_v2 = true;
    o.pdl = false; /* measured 3% slower on the H200 (docs/perf-log.md) */
    o.gemm_cache = true;
    o.attn_tiled = true;
    o.gdn_par = true;
    o.gdn_chunked = false; /* 2.71 vs 2.02 ms per pp512 (docs/perf-log.md, session 6) */
    o.gemm_stack3 = true;
    o.gemm_merge = true;
    o.attn_gemm = true;
    o.mega = CUDA_MEGA_AUTO;
    o.mega_threads = 256;
    o.mega_fuse_down = false; /* +2.5% but the residual's additions in varying order (perf-log) */
    o.attn_split = true;
    o.attn_rope = true;
    o.attn_flash = true;
    o.gdn_split = true;
    o.mlp_fused = false; /* slower: 1,080 vs 1,198 tok/s (docs/perf-log.md, session 12) */
    o.gemv_smem = true; /* with PDL: +19% / +31% decode (docs/perf-log.md, sessions 13-14) */
    o.gemv_batch = true; /* the batched step at n = 8: see docs/perf-log.md, session 33 */
    o.batch_seq = true; /* the batched step +3.5% to +16% (docs/perf-log.md, session 35) */
    o.gemv_batch_mma = true; /* the batched step at 8 sessions +57% (docs/perf-log.md, session 35) */
    o.gemv_smem_warps = 0; /* 0, 0: the session picks (pick_gemv_smem_shape) */
    o.gemv_smem_kb = 0;
    o.gemv_smem_launch = 0; /* the session picks (pick_gemv_smem_shape) */
    o.gemv_mma = false;
    o.gemvq_rows = 0; /* 1, Q8_0 2 (gemv_quant.cu) */
    o.gemvq_launch = 0;
    o.gemvq_warps = 0;   /* 4 (gemv_quant.cu) */
    o.gemvq_smem_kb = 0; /* what the block needs */
    o.gemvq_head_blocks = GEMVQ_HEAD_BLOCKS_DEFAULT;
    o.gemvq_int8 = 0; /* on (pick_gemvq_shape): H200 tg128 +11-51% */
    o.gemvq_one_pass = 1; /* Qwen3-0.6B Q4_K_M +17%, Q8_0 +16% (perf-log session 24) */
    o.gemv_smem_norm_late = 0; /* the session picks (pick_gemv_smem_shape): with 16-warp blocks */
    o.attn_split_min = 0; /* 64 (kernels.cu) */
    o.attn_one_split = 128; /* Qwen3-0.6B BF16 +1.4%, Qwen3.5-0.8B +0.5% (perf-log session 24) */
    o.attn_batch_blocks = 0; /* the batched attention's blocks: the session picks (batch_group_blocks) */
    o.attn_early = 1;     /* also where the q|k|v launch must wait first: Qwen3.5 +0.8-1% (perf-log session 20) */
    o.gdn_early = 0;      /* on: Qwen3.5-0.8B +2.3-2.4% (perf-log session 20) */
    o.l2_prefetch_mb = 8; /* +1-2% (perf-log session 20) */
    o.gemv_smem_xreg = 1; /* Qwen3-0.6B BF16 +1.7%, Qwen3.5-0.8B +0.2% (perf-log session 22) */
    o.gen_graph_steps = 8; /* Qwen3.5-0.8B BF16 +1.0% (perf-log session 22) */
    o.gdn_staged = 1;      /* Qwen3.5-0.8B BF16 +1.6% (perf-log session 23) */
    o.gdn_wide = 1;        /* Qwen3.5-0.8B BF16 +2.1%, same bits (perf-log session 48) */
    o.attn_rope_regs = 0;  /* Qwen3-0.6B BF16 -3.3% (perf-log session 31) */
    o.mlp_rows = 0;        /* Qwen3-0.6B BF16 -14% to -31% (perf-log session 31) */
    o.mlp_rows_cluster = 0;
    o.mlp_rows_down = 0;
    o.attn_o = 0;          /* Qwen3-0.6B BF16 level at short contexts, -6% at 4,096 (perf-log session 25) */
    o.attn_o_single = 0;   /* 64 */
    o.attn_cluster = 0;    /* the session picks (pick_cl_mode): Qwen3-0.6B BF16 +4-11% at depths
                            * 512-2,048 (perf-log session 25) */
    o.attn_pipe = 1; /* Qwen3-0.6B BF16 +3.0%, Q4_K_M +2.2% (perf-log session 27) */
    o.gemv_smem_waves = 0; /* Qwen3-0.6B BF16 -2.7%, Qwen3.5-0.8B -7% with 1 (perf-log session 28) */
    o.gemv_smem_alone = 0; /* Qwen3-0.6B BF16 -2.0% with 1 (perf-log session 28) */
    o.gemv_launch_ahead = 0; /* the session picks (mark_launch_ahead): Qwen3-0.6B BF16 +2.5%,
                              * Q4_K_M +1.3% (perf-log session 28) */
    o.attn_shared_kv = 0;  /* depth 4,096 +1.2% (f32 cache) / -8.8% (f16), depth 0 -9.3% (perf-log
                            * session 29) */
    o.attn_lanes = 0;      /* depth 0 -1.5%, depth 4,096 -5.4% to +4.5% (perf-log session 29) */
    o.attn_stage = 0;      /* depth 0 -6.4%, Qwen3.5-0.8B at 4,096 -3.0% (perf-log session 30) */
    o.gemvq_batch_pre = 2; /* batched Qwen3-0.6B Q4_K_M +28% / +65% / +85% at 3 / 8 / 16 sessions
                            * (perf-log session 42) */
    o.kv_f16 = false;
    o.prefill_bf16 = true;
    o.prefill_x_terms = 0;
    return o;
}

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

static qwenrt_status upload(struct cuda_session *cs, struct qwenrt_error *err)
{
    CUDA_CHECK(cudaMalloc(&cs->arena, cs->arena_bytes ? cs->arena_bytes : 256));
    for (int32_t i = 0; i < cs->n_map; i++)
        CUDA_CHECK(cudaMemcpy(cs->arena + cs->map[i].off, cs->map[i].host, cs->map[i].bytes,
                              cudaMemcpyHostToDevice));
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
static const double *rope_table(const struct cuda_session *cs, const struct plan_op *op)
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
        cudaError_t e = cudaMalloc(&cs->rope_freq, (size_t)half * sizeof(double));
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
    CUDA_CHECK(cudaMalloc(&cs->att_part, (size_t)cs->att_part_floats * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&cs->att_count, (size_t)heads * sizeof(unsigned)));
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
    CUDA_CHECK(cudaMalloc(&cs->state, cs->state_bytes ? cs->state_bytes : 256));
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
void free_bufs(float **b, const int32_t *own)
{
    for (int i = 0; i < PLAN_MAX_BUFS; i++) {
        if (!own || own[i] == i)
            cudaFree(b[i]);
        b[i] = NULL;
    }
}

/* Allocates bufs for T tokens (the logits buffer for rows rows). With own / off / ld (merged
 * products): buffer i is a view at column off[i] of buffer own[i], rows ld[i] floats long. */
qwenrt_status alloc_bufs(const struct plan *p, float **b, int32_t T, int32_t rows, struct qwenrt_error *err,
                         const int32_t *own, const int32_t *off, const int32_t *ld)
{
    for (int32_t i = 0; i < p->n_bufs; i++) {
        if (own && own[i] != i)
            continue;
        size_t n = (size_t)(i == p->buf_logits ? rows : T) * (size_t)(ld ? ld[i] : p->bufs[i].width);
        CUDA_CHECK(cudaMalloc(&b[i], n * sizeof(float) + 256));
    }
    for (int32_t i = 0; own && i < p->n_bufs; i++)
        if (own[i] != i)
            b[i] = b[own[i]] + off[i];
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ running ops */


/* The context of the decode program's steps: one token, the session's decode buffers. */
static struct run_ctx decode_ctx(struct cuda_session *cs)
{
    return {cs, &cs->plans[PHASE_DECODE], cs->dops[PHASE_DECODE], cs->dbufs, 1, false, cs->decode_pdl, cs->stream,
            0, false, NULL, NULL, NULL, NULL, false, NULL};
}

/* Row stride of buffer id in this run (a merged product's outputs share one buffer). */
static int32_t ld_of(const struct run_ctx *r, int32_t id)
{
    return r->ld ? r->ld[id] : r->p->bufs[id].width;
}

/* Grows the prefill scratch to n floats (contents not kept). */
static qwenrt_status scratch_grow(struct cuda_session *cs, int64_t n, struct qwenrt_error *err)
{
    if (n <= cs->scratch_cap)
        return QWENRT_OK;
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cudaFree(cs->scratch);
    cs->scratch = NULL;
    cs->scratch_cap = 0;
    CUDA_CHECK(cudaMalloc(&cs->scratch, (size_t)n * sizeof(float)));
    cs->scratch_cap = n;
    return QWENRT_OK;
}

/* The cuBLASLt context, made on first use. */
static qwenrt_status gemm_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (!cs->gemm_ready) {
        qwenrt_status st = gemm_init(&cs->gemm, err);
        if (st)
            return st;
        cs->gemm_ready = true;
    }
    cs->gemm.use_cache = cs->opt.gemm_cache;
    return QWENRT_OK;
}


/* The session's choices of GEMV kernel and shape (options and picks) into a launch's args. */
static void gemv_session_args(const struct cuda_session *cs, bool pdl, struct gemv_args *a)
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
static qwenrt_status run_matmul(struct run_ctx *r, const struct dop *d, const float *x,
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

/* Runs plan op i alone (the reference order of kernels). */
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
            CUDA_CHECK(chunked ? launch_gdn_chunked(&a, s) : launch_gdn_scan(&a, s));
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

/* ------------------------------------------------------------------ the fused decode program */

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
    CUDA_CHECK(cudaMalloc(&cs->mlp_part, (size_t)MLPF_MAX_CLUSTERS * hidden * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&cs->mlp_count, 2 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->mlp_count, 0, 2 * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&cs->mlp_acc, (size_t)hidden * 8));
    CUDA_CHECK(cudaMemset(cs->mlp_acc, 0, (size_t)hidden * 8));
    return QWENRT_OK;
}

/* Merges each norm + q|k|v step and the rope + attention step after it into one
 * STEP_QKV_ATTN where cuda_options.qkv_attn asks for it and qkv_attention.cu takes the pair
 * (sm_90; q, k and v read by nothing after the attention). Runs once the GEMV shapes are
 * picked (the launch's arguments carry them). */
struct run_ctx;
void norm_gemv_args(struct run_ctx *r, const struct step *st, struct gemv_args &a);
void rope_attn_args(struct run_ctx *r, int32_t i, int32_t gate, struct rope_args &ra, struct attn_args &a);

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
    CUDA_CHECK(cudaMalloc(&cs->ao_part, (size_t)part * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&cs->ao_count, 16 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->ao_count, 0, 16 * sizeof(unsigned)));
    return QWENRT_OK;
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

static qwenrt_status build_program(struct cuda_session *cs, struct qwenrt_error *err)
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

/* The arguments of a STEP_ROPE_ATTN at rope op i (gate: its sigmoid_gate op or -1): the rope
 * launch's, and the attention's with the norm + RoPE inside when cuda_options.attn_rope (a.rope). */
/* cuda_options.attn_shared_kv for the attention a (its kernel takes it where
 * attention_shared_kv_applies): the RoPE-inside attention outside the cluster-merged graphs. */
static bool shared_kv_on(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->opt.attn_shared_kv > 0;
}

/* cuda_options.attn_lanes for the attention a (attn_args.lanes: 0 for a row per warp; its
 * kernel takes it where attention_lanes_applies): the RoPE-inside attention outside the
 * cluster-merged graphs. */
static int32_t lanes_of(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->opt.attn_lanes != 32 ? cs->opt.attn_lanes : 0;
}

/* cuda_options.attn_stage for the attention a (attn_args.stages: the ring's tiles, 0 for none;
 * its kernel takes it where attention_staged_applies): the RoPE-inside attention outside the
 * cluster-merged graphs, on sm_90 (bulk copies). */
static int32_t stages_of(const struct cuda_session *cs, const struct attn_args &a)
{
    return a.rope && !a.cluster_merge && cs->cc_major >= 9 && cs->opt.attn_stage > 0 ? cs->opt.attn_stage : 0;
}

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

/* Enqueues one decode step (the program, or the plan op by op). */
static qwenrt_status enqueue_decode(struct cuda_session *cs, struct qwenrt_error *err)
{
    struct run_ctx r = decode_ctx(cs);
    for (int32_t i = 0; i < cs->n_steps; i++) {
        if (step_omitted(cs, step_label(r.p, &cs->steps[i])))
            continue;
        r.stamps = cs->tl ? cs->tl + (size_t)i * TL_MAX_BLOCKS * TL_SLOTS : NULL;
        qwenrt_status st = run_step(&r, &cs->steps[i], err);
        if (st)
            return st;
    }
    return QWENRT_OK;
}

/* The attention variant for a graph launch of n decode steps from position pos: 1 (the
 * cluster-merged splits) where cl_mode says so for every one of them, else 0. */
static int attn_variant(const struct cuda_session *cs, int32_t pos, int32_t n)
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

/* Captures enqueue_decode (+ the greedy argmax when gen) into an executable graph, steps
 * times over (gen only: each step reads the position and the token the one before it left on
 * the GPU, so the copies are the same step run in sequence). */
/* What a captured step does after the decode: nothing (the logits stay), the argmax, or
 * sample.cu's draw over topk.cu's candidates; the latter two feed the token to the next step. */
enum gen_mode { GEN_NONE, GEN_ARGMAX, GEN_SAMPLE };

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
                       (float *)(cs->d_top + CUDA_TOP_MAX_M), NULL, false, cs->stream, &dr);
}

static qwenrt_status capture(struct cuda_session *cs, int gen, int32_t steps, cudaGraphExec_t *out,
                             struct qwenrt_error *err)
{
    cudaGraph_t g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(cs->stream, cudaStreamCaptureModeThreadLocal));
    qwenrt_status st = QWENRT_OK;
    for (int32_t k = 0; k < steps && !st; k++) {
        st = enqueue_decode(cs, err);
        cudaError_t e = !st && gen != GEN_NONE ? enqueue_pick(cs, (enum gen_mode)gen) : cudaSuccess;
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
    e = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "cudaGraphInstantiate");
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ public entry points */

extern "C" void cuda_session_free(struct cuda_session *cs)
{
    if (!cs)
        return;
    if (cs->stream)
        cudaStreamSynchronize(cs->stream);
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
    free_bufs(cs->pbufs, cs->pm.run ? cs->pm.own : NULL);
    free_bufs(cs->dbufs);
    free_bufs(cs->bbufs);
    cudaFree(cs->b_part);
    cudaFree(cs->b_count);
    cudaFree(cs->b_qpre);
    cudaFree(cs->b_pos);
    cudaFreeHost(cs->b_stage);
    batch_free(cs);
    cudaFree(cs->d_ids);
    cudaFree(cs->d_pos);
    cudaFree(cs->d_step);
    cudaFree(cs->am.part);
    cudaFree(cs->am.count);
    cudaFree(cs->d_out);
    cudaFree(cs->d_mk_top);
    cudaFreeHost(cs->h_stage);
    cudaFree(cs->d_topk);
    cudaFree(cs->d_top);
    cudaFree(cs->d_sp);
    cudaFreeHost(cs->h_sp);
    cudaFree(cs->snap);
    cudaFreeHost(cs->h_top);
    cudaFreeHost(cs->h_row);
    if (cs->top_ev)
        cudaEventDestroy(cs->top_ev);
    cudaFree(cs->state);
    cudaFree(cs->att_part);
    cudaFree(cs->rope_freq);
    cudaFree(cs->att_count);
    cudaFree(cs->mlp_part);
    cudaFree(cs->mlp_count);
    cudaFree(cs->mlp_acc);
    cudaFree(cs->ao_part);
    cudaFree(cs->ao_count);
    cudaFree(cs->arena);
    cudaFree(cs->scratch);
    if (cs->stream)
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

/* true when a matmul of the plan has block-quantised weights. */
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

/* A step's label in the decode profile. */
static const char *step_label(const struct plan *p, const struct step *st)
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

extern "C" int64_t cuda_session_gen_graph_launches(const struct cuda_session *cs)
{
    return cs ? cs->gen_launches : 0;
}

/* Which kernel a decode attention step takes in the default graphs (those without the cluster
 * merge), as launch_attention chooses: attention_staged.cu's, attention_lanes.cu's or
 * attention_shared_kv.cu's. */
enum attn_kernel_kind { ATTN_TAKES_STAGED, ATTN_TAKES_LANES, ATTN_TAKES_SHARED_KV };

static bool attn_step_takes(const struct cuda_session *cs, const struct step *st, enum attn_kernel_kind kind)
{
    if (st->kind != STEP_ROPE_ATTN)
        return false;
    struct run_ctx r = decode_ctx((struct cuda_session *)cs);
    struct rope_args ra;
    struct attn_args a;
    rope_attn_args(&r, st->op, st->gate_op, ra, a);
    a.cluster_merge = false;
    a.lanes = lanes_of(cs, a);
    a.stages = stages_of(cs, a);
    bool staged = a.stages && attention_staged_applies(&a);
    bool by_lanes = !staged && a.lanes && attention_lanes_applies(&a);
    switch (kind) {
    case ATTN_TAKES_STAGED: return staged;
    case ATTN_TAKES_LANES: return by_lanes;
    default: return !staged && !by_lanes && shared_kv_on(cs, a) && attention_shared_kv_applies(&a);
    }
}

extern "C" int32_t cuda_session_count_steps(const struct cuda_session *cs, const char *label)
{
    int32_t n = 0;
    bool early = label && !strcmp(label, "rope+attention (early)");
    bool gdn_early = label && !strcmp(label, "gdn (early)");
    bool ahead = label && !strcmp(label, "gemv+residual (ahead)");
    bool ahead_cl = label && !strcmp(label, "gemv+residual (ahead in cluster graphs)");
    bool shared_kv = label && !strcmp(label, "rope+attention (shared K/V)");
    bool lanes = label && !strcmp(label, "rope+attention (lanes)");
    bool staged = label && !strcmp(label, "rope+attention (staged)");
    enum attn_kernel_kind kind = staged ? ATTN_TAKES_STAGED : lanes ? ATTN_TAKES_LANES : ATTN_TAKES_SHARED_KV;
    for (int32_t i = 0; cs && label && i < cs->n_steps; i++)
        n += shared_kv || lanes || staged ? attn_step_takes(cs, &cs->steps[i], kind)
             : ahead    ? cs->steps[i].ahead
             : ahead_cl ? cs->steps[i].ahead_cl
             : early ? (cs->steps[i].kind == STEP_ROPE_ATTN || cs->steps[i].kind == STEP_ATTN_O) && cs->steps[i].early
             : gdn_early ? (cs->steps[i].kind == STEP_GDN_GATED || cs->steps[i].kind == STEP_CONV_GDN_GATED) &&
                               cs->steps[i].early
                   : !strcmp(step_label(&cs->plans[PHASE_DECODE], &cs->steps[i]), label);
    return n;
}

extern "C" int64_t cuda_session_l2_prefetch_bytes(const struct cuda_session *cs)
{
    int64_t n = 0;
    for (int32_t i = 0; cs && i < cs->n_steps; i++)
        n += cs->steps[i].pf.bytes;
    return n;
}

#define PROFILE_LABELS 16

/* The slot of step label l among the n_label so far (added when new and there is room); n_label
 * when there is none. */
static int32_t label_slot(const char **label, int32_t *n_label, const char *l)
{
    int32_t k = 0;
    while (k < *n_label && strcmp(label[k], l))
        k++;
    if (k == *n_label && *n_label < PROFILE_LABELS)
        label[(*n_label)++] = l;
    return k;
}

/* The decode program's steps timed one by one (events between launches, no graph), mean
 * microseconds per token by step label. The decode inputs are staged. */
static qwenrt_status profile_program(struct cuda_session *cs, int32_t reps, char *report,
                                     size_t report_len, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    qwenrt_status st = QWENRT_OK;
    int32_t n = cs->n_steps, n_ev = 0;
    cudaEvent_t *ev = (cudaEvent_t *)xcalloc((size_t)n + 1, sizeof(cudaEvent_t));
    const char *label[PROFILE_LABELS];
    double us[PROFILE_LABELS] = {0}, total = 0;
    int32_t cnt[PROFILE_LABELS] = {0}, n_label = 0;
    if (!ev)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    for (; n_ev <= n; n_ev++)
        if (cudaEventCreate(&ev[n_ev]) != cudaSuccess) {
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventCreate failed");
            break;
        }
    struct run_ctx r = decode_ctx(cs);
    for (int32_t rep = -1; rep < reps && !st; rep++) { /* rep -1 warms up */
        if (cudaEventRecord(ev[0], cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
        for (int32_t i = 0; i < n && !st; i++) {
            st = run_step(&r, &cs->steps[i], err);
            if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
                st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
        }
        if (!st && cudaStreamSynchronize(cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: profile run failed");
        for (int32_t i = 0; i < n && !st && rep >= 0; i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
            int32_t k = label_slot(label, &n_label, step_label(p, &cs->steps[i]));
            if (k < n_label)
                us[k] += 1e3 * ms / reps, cnt[k]++;
            total += 1e3 * ms / reps;
        }
    }
    if (!st) {
        size_t o = (size_t)snprintf(report, report_len, "program (%d launches, events between): %.1f us/token",
                                    n, total);
        for (int32_t k = 0; k < n_label && o < report_len; k++)
            o += (size_t)snprintf(report + o, report_len - o, "; %s x%d %.1f us", label[k],
                                  cnt[k] / (reps > 0 ? reps : 1), us[k]);
    }
    for (int32_t i = 0; i < n_ev; i++)
        cudaEventDestroy(ev[i]);
    xfree(ev);
    return st;
}

extern "C" qwenrt_status cuda_session_profile_decode(struct cuda_session *cs, int32_t id,
                                                     int32_t pos, int32_t reps, char *report,
                                                     size_t report_len, struct qwenrt_error *err)
{
    qwenrt_status st = stage_inputs(cs, &id, 1, pos, err);
    if (st)
        return st;
    if (!cs->mk)
        return profile_program(cs, reps, report, report_len, err);
    return mk_profile(cs->mk, cs->stream, cs->d_ids, cs->d_pos, reps, report, report_len, err);
}

/* The timeline's per-step times of one replay, us from the token's first block start: the
 * first block's start, the median block's release from griddep_wait, the last block's end;
 * -1 where the step's kernels write no stamps. And where the launch's blocks ran: how many
 * shared a multiprocessor with another block of the same launch, whether the last block to
 * end was one of them, and how much later than the median block that last one started, was
 * released and had its rows staged (a late end is then a late start, a late release, late
 * rows, or a shared multiprocessor's arithmetic). */
struct tl_times {
    double start, release, staged, mid_end, end; /* staged: gemv_smem's rows and x in shared memory,
                                                   * the attention's q, k, v ready (median block;
                                                   * -1 elsewhere); mid_end: the median block's end */
    double shared, last_shared;                 /* blocks on a shared multiprocessor; 1 when the last was */
    double used, most;                          /* multiprocessors with a block; most blocks on one */
    double last_start, last_release, last_staged; /* the last block's stamps after the median's, us */
};

static int cmp_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* The median of the blocks' stamp k (those written) relative to t0, us; -1 when none. */
static double tl_median(const unsigned long long *st, int k, unsigned long long t0, unsigned long long *scratch)
{
    int32_t n = 0;
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++)
        if (st[TL_SLOTS * (size_t)b] && st[TL_SLOTS * (size_t)b + k])
            scratch[n++] = st[TL_SLOTS * (size_t)b + k];
    if (!n)
        return -1;
    qsort(scratch, (size_t)n, sizeof(*scratch), cmp_u64);
    return (double)(scratch[n / 2] - t0) * 1e-3;
}

#define TL_MAX_SMS 1024 /* multiprocessor ids the report counts (more: not counted) */

/* Blocks of one step that shared a multiprocessor, and whether block `last` did (slot 4:
 * the multiprocessor + 1, 0 where a kernel did not record it; blocks without an end stamp,
 * such as an attention split with no positions, are not counted). */
static void tl_sharing(const unsigned long long *st, int32_t last, struct tl_times *t)
{
    uint16_t on_sm[TL_MAX_SMS] = {0};
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++) {
        unsigned long long sm = st[TL_SLOTS * (size_t)b + 4];
        if (st[TL_SLOTS * (size_t)b] && st[TL_SLOTS * (size_t)b + 3] && sm && sm <= TL_MAX_SMS)
            on_sm[sm - 1]++;
    }
    t->shared = t->used = t->most = 0;
    for (int32_t i = 0; i < TL_MAX_SMS; i++) {
        t->shared += on_sm[i] > 1 ? on_sm[i] : 0;
        t->used += on_sm[i] > 0;
        t->most = on_sm[i] > t->most ? on_sm[i] : t->most;
    }
    unsigned long long sm_last = last >= 0 ? st[TL_SLOTS * (size_t)last + 4] : 0;
    t->last_shared = sm_last && sm_last <= TL_MAX_SMS && on_sm[sm_last - 1] > 1;
}

/* One step's stamps (TL_MAX_BLOCKS blocks x TL_SLOTS) into times relative to t0 (ns); rel: scratch. */
static struct tl_times tl_step(const unsigned long long *st, unsigned long long t0, unsigned long long *rel)
{
    struct tl_times t = {-1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0};
    unsigned long long s0 = ~0ull, s3 = 0;
    int32_t last = -1;
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++) {
        const unsigned long long *q = st + TL_SLOTS * (size_t)b;
        if (!q[0])
            continue;
        s0 = q[0] < s0 ? q[0] : s0;
        if (q[3] > s3)
            s3 = q[3], last = b;
    }
    if (s0 == ~0ull)
        return t;
    t.start = (double)(s0 - t0) * 1e-3;
    t.release = tl_median(st, 1, t0, rel);
    t.staged = tl_median(st, 2, t0, rel);
    t.mid_end = tl_median(st, 3, t0, rel);
    t.end = s3 ? (double)(s3 - t0) * 1e-3 : -1;
    tl_sharing(st, last, &t);
    if (last >= 0) {
        const unsigned long long *q = st + TL_SLOTS * (size_t)last;
        double mid_start = tl_median(st, 0, t0, rel);
        t.last_start = (double)(q[0] - t0) * 1e-3 - mid_start;
        t.last_release = q[1] && t.release >= 0 ? (double)(q[1] - t0) * 1e-3 - t.release : 0;
        t.last_staged = q[2] && t.staged >= 0 ? (double)(q[2] - t0) * 1e-3 - t.staged : 0;
    }
    return t;
}

/* avg += t / reps, field by field */
static void tl_add(struct tl_times *avg, const struct tl_times *t, int32_t reps)
{
    avg->start += t->start / reps, avg->release += t->release / reps, avg->end += t->end / reps;
    avg->staged += t->staged / reps, avg->mid_end += t->mid_end / reps;
    avg->shared += t->shared / reps, avg->last_shared += t->last_shared / reps;
    avg->used += t->used / reps, avg->most += t->most / reps;
    avg->last_start += t->last_start / reps, avg->last_release += t->last_release / reps;
    avg->last_staged += t->last_staged / reps;
}

/* The decode graph replayed with stamps (tl_stamp) in every launch that writes them; the
 * times of each step averaged over reps replays (each after the one before has finished). */
static qwenrt_status tl_collect(struct cuda_session *cs, int32_t reps, struct tl_times *avg, struct qwenrt_error *err)
{
    size_t n = (size_t)cs->n_steps * TL_MAX_BLOCKS * TL_SLOTS;
    unsigned long long *h = (unsigned long long *)xcalloc(n, sizeof(*h));
    unsigned long long *rel = (unsigned long long *)xcalloc(TL_MAX_BLOCKS, sizeof(*rel));
    unsigned long long *d = NULL;
    cudaGraphExec_t g = NULL;
    qwenrt_status st = h && rel ? QWENRT_OK : err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    cudaError_t e = st ? cudaSuccess : cudaMalloc(&d, n * sizeof(*h));
    if (!st && e == cudaSuccess) {
        cs->tl = d;
        st = capture(cs, GEN_NONE, 1, &g, err);
        cs->tl = NULL; /* the graph keeps the pointers; nothing else stamps */
    }
    for (int32_t r = 0; !st && e == cudaSuccess && r < reps; r++) {
        if ((e = cudaMemsetAsync(d, 0, n * sizeof(*h), cs->stream)) != cudaSuccess ||
            (e = cudaGraphLaunch(g, cs->stream)) != cudaSuccess || (e = cudaStreamSynchronize(cs->stream)) != cudaSuccess ||
            (e = cudaMemcpy(h, d, n * sizeof(*h), cudaMemcpyDeviceToHost)) != cudaSuccess)
            break;
        unsigned long long t0 = ~0ull;
        for (size_t b = 0; b < n; b += TL_SLOTS)
            t0 = h[b] && h[b] < t0 ? h[b] : t0;
        for (int32_t i = 0; i < cs->n_steps; i++) {
            struct tl_times t = tl_step(h + (size_t)i * TL_MAX_BLOCKS * TL_SLOTS, t0, rel);
            tl_add(&avg[i], &t, reps);
        }
    }
    if (g)
        cudaGraphExecDestroy(g);
    cudaFree(d);
    xfree(h), xfree(rel);
    if (!st && e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "decode timeline");
    return st;
}

extern "C" qwenrt_status cuda_session_timeline(struct cuda_session *cs, int32_t id, int32_t pos, int32_t reps,
                                               char *report, size_t report_len, struct qwenrt_error *err)
{
    if (cs->mk)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: the timeline is the decode graph's, not the megakernel's");
    if (reps < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: timeline reps %d (at least 1)", (int)reps);
    qwenrt_status st = stage_inputs(cs, &id, 1, pos, err);
    cs->cl_variant = attn_variant(cs, pos, 1); /* the graph a decode at pos would launch */
    struct tl_times *t = (struct tl_times *)xcalloc((size_t)cs->n_steps, sizeof(*t));
    if (!st && !t)
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    if (!st)
        st = tl_collect(cs, reps, t, err);
    if (st) {
        xfree(t);
        return st;
    }
    /* per label: steps, mean gap from the step before's last end to this step's median
     * release, mean time from that release to this step's last end */
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const char *label[PROFILE_LABELS];
    double gap[PROFILE_LABELS] = {0}, work[PROFILE_LABELS] = {0}, ahead[PROFILE_LABELS] = {0}, total = 0;
    double staged[PROFILE_LABELS] = {0}, mid[PROFILE_LABELS] = {0};
    struct tl_times late[PROFILE_LABELS]; /* the sharing and the last block's lateness, summed */
    memset(late, 0, sizeof(late));
    int32_t n_staged[PROFILE_LABELS] = {0};
    int32_t cnt[PROFILE_LABELS] = {0}, n_label = 0;
    double prev_end = -1;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        if (t[i].release < 0 || t[i].end < 0)
            continue;
        int32_t k = label_slot(label, &n_label, step_label(p, &cs->steps[i]));
        if (k < n_label && prev_end >= 0) {
            gap[k] += t[i].release - prev_end, work[k] += t[i].end - t[i].release, cnt[k]++;
            ahead[k] += prev_end - t[i].start;
            mid[k] += t[i].mid_end - t[i].release;
            if (t[i].staged >= 0)
                staged[k] += t[i].staged - t[i].release, n_staged[k]++;
            late[k].shared += t[i].shared, late[k].last_shared += t[i].last_shared;
            late[k].used += t[i].used, late[k].most += t[i].most;
            late[k].last_start += t[i].last_start, late[k].last_release += t[i].last_release;
            late[k].last_staged += t[i].last_staged;
        }
        prev_end = t[i].end;
        total = t[i].end > total ? t[i].end : total;
    }
    size_t o = (size_t)snprintf(report, report_len,
                                "| step (decode graph, stamped launches) | launches | first block started before the "
                                "launch before ended, us | release (median block) after that end, us | release to "
                                "rows and x staged (gemv_smem) or q, k, v ready (attention), median, us | release to "
                                "the median block's end, us | "
                                "release to the last block's end, us | multiprocessors used | most blocks on one | "
                                "blocks sharing a multiprocessor | the last block shared one | the last block's start / "
                                "release / staged after the median block's, us "
                                "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int32_t k = 0; k < n_label && o < report_len; k++) {
        if (!cnt[k])
            continue;
        char sg[32] = "-";
        if (n_staged[k])
            snprintf(sg, sizeof(sg), "%.2f", staged[k] / n_staged[k]);
        o += (size_t)snprintf(report + o, report_len - o,
                              "| %s | %d | %.2f | %.2f | %s | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f%% | %.2f / %.2f / %.2f |\n",
                              label[k], (int)cnt[k], ahead[k] / cnt[k], gap[k] / cnt[k], sg, mid[k] / cnt[k],
                              work[k] / cnt[k], late[k].used / cnt[k], late[k].most / cnt[k], late[k].shared / cnt[k],
                              100.0 * late[k].last_shared / cnt[k],
                              late[k].last_start / cnt[k], late[k].last_release / cnt[k], late[k].last_staged / cnt[k]);
    }
    if (o < report_len)
        o += (size_t)snprintf(report + o, report_len - o, "first start to last end: %.1f us (%d reps)\n", total,
                              (int)reps);
    xfree(t);
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_profile_prefill(struct cuda_session *cs, const int32_t *ids,
                                                      int32_t T, char *report, size_t report_len,
                                                      struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_PREFILL];
    qwenrt_status st = QWENRT_OK;
    if (T < 2 || T > cs->n_ctx)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: profile of %d tokens", T);
    float *logits = (float *)xmalloc((size_t)cs->n_vocab, sizeof(float));
    cudaEvent_t *ev = (cudaEvent_t *)xcalloc((size_t)p->n_ops + 1, sizeof(cudaEvent_t));
    if (!logits || !ev) {
        xfree(logits), xfree(ev);
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    }
    /* a plain run first: buffers sized, GEMM plans cached, clocks up */
    st = cuda_session_run(cs, ids, T, 0, false, logits, NULL, NULL, err);
    int32_t n_ev = 0;
    for (; !st && n_ev <= p->n_ops; n_ev++)
        if (cudaEventCreate(&ev[n_ev]) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventCreate failed");
    if (!st)
        st = cuda_session_reset(cs, err);
    if (!st)
        st = stage_inputs(cs, ids, T, 0, err);
    struct run_ctx r = {cs, p, cs->dops[PHASE_PREFILL], cs->pbufs, T, false, false, cs->stream, 0, false,
                        cs->pm.ld, NULL, NULL, NULL, false, NULL};
    if (!st && cudaEventRecord(ev[0], cs->stream) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
    for (int32_t i = 0; i < p->n_ops && !st; i++) {
        if (cs->opt.fuse && plan_matmul_add_fusable(p, i)) { /* as run_plan_ops: the add in the
                                                         * product, its time under matmul */
            const struct plan_op *op = &p->ops[i], *add = &p->ops[i + 1];
            st = run_matmul(&r, &r.d[i], r.b[op->in], ld_of(&r, op->in), r.b[add->out],
                            ld_of(&r, add->out), T, true, err);
            if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
                st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
            i++;
        } else {
            st = run_op(&r, i, err);
        }
        if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
    }
    if (!st && cudaStreamSynchronize(cs->stream) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda: profile run failed");
    if (!st) {
        double ms[OP_KIND_COUNT] = {0}, mm_big = 0, total = 0;
        int32_t cnt[OP_KIND_COUNT] = {0};
        for (int32_t i = 0; i < p->n_ops; i++) {
            float t = 0;
            cudaEventElapsedTime(&t, ev[i], ev[i + 1]);
            ms[p->ops[i].kind] += t, cnt[p->ops[i].kind]++, total += t;
            if (p->ops[i].kind == OP_MATMUL && cs->dops[PHASE_PREFILL][i].N > 2 * cs->dops[PHASE_PREFILL][i].K)
                mm_big += t;
        }
        size_t o = (size_t)snprintf(report, report_len, "prefill T=%d op by op: %.2f ms", T, total);
        for (int k = 0; k < OP_KIND_COUNT && o < report_len; k++)
            if (cnt[k])
                o += (size_t)snprintf(report + o, report_len - o, "; %s x%d %.2f ms", op_kind_name((enum op_kind)k),
                                      cnt[k], ms[k]);
        if (o < report_len)
            snprintf(report + o, report_len - o, " (matmuls with N > 2K: %.2f ms)", mm_big);
    }
    for (int32_t i = 0; i < n_ev; i++)
        cudaEventDestroy(ev[i]);
    xfree(ev);
    xfree(logits);
    return st;
}

extern "C" void cuda_session_gemv_smem_shape(const struct cuda_session *cs, int32_t *warps, int32_t *kb,
                                             int32_t *launch, int32_t *min_blocks)
{
    *warps = cs ? cs->gs_warps : 0;
    *kb = cs ? cs->gs_kb : 0;
    *launch = cs ? (cs->gs_after_wait ? 2 : 1) : 0;
    *min_blocks = cs ? cs->gs_min_blocks : 0;
}

extern "C" void cuda_session_gemv_smem_kind_minima(const struct cuda_session *cs, int32_t *res, int32_t *pair,
                                                   int32_t *multi)
{
    *res = cs ? cs->gs_res_min_blocks : 0;
    *pair = cs ? cs->gs_pair_min_blocks : 0;
    *multi = cs ? cs->gs_multi_min_blocks : 0;
}

extern "C" bool cuda_session_uses_megakernel(const struct cuda_session *cs, const char **why)
{
    if (why)
        *why = cs->mk ? "" : cs->mk_why;
    return cs->mk != NULL;
}

/* Whether the prefill may use the bf16 products (opt.prefill_bf16): not when a matmul has
 * F32 weights (such a model asked for f32 products). */
static bool fast_prefill_applies(const struct plan *p)
{
    for (int32_t i = 0; i < p->n_ops; i++)
        if (is_mm(&p->ops[i]) && p->ops[i].w && p->ops[i].w->dtype == QR_F32)
            return false;
    return true;
}

/* gemv_smem's block shape, where the options leave it to the session (0): 16 warps and up to
 * 160 KB per block when a layer's widest 16-bit one-token product would need more than one
 * block of 8 warps per multiprocessor (Qwen3.5-0.8B: its DeltaNet input, 8,224 rows), else 8
 * warps and 120 KB. Measured on the H200 (docs/perf-log.md, session 14): Qwen3.5-0.8B BF16
 * 1,259 tok/s with 16 / 160 against 1,166 with 8 / 120; Qwen3-0.6B 1,400 with 8 / 120 against
 * 1,352; no single shape was best for both, nor was one block per multiprocessor for every
 * product ("spread": 1,302 / 1,236).
 * And when its blocks let the next launch start: after their wait with blocks of up to 8
 * warps (68-108 KB and 256 threads: two or three fit on a multiprocessor, so launches that
 * started early would start their own successors, and several would copy weights at once
 * beside the kernel on the critical path), before it with 16 (one such block per
 * multiprocessor: one successor at most, and it gets the longer head start). Measured on the
 * H200 (session 15): Qwen3-0.6B BF16 1,451 -> 1,537 tok/s after the wait; Qwen3.5-0.8B 1,330
 * before, 1,305 after; the same rule by each launch's own block size (mixed within a layer)
 * lost (1,409).
 * Since x sits in each warp's registers (gemv_smem_xreg, session 22) the shapes were swept
 * again (H200, tg128, medians of 5, two rounds; docs/perf-log.md): with 8-warp blocks, 136 KB
 * (gate|up's 8 warps of 16 KB fit: 96 blocks instead of 192 of 4 warps) and warps halved below
 * 96 blocks (the o and down products: 128 blocks of 4 warps instead of 64 of 8), Qwen3-0.6B BF16
 * 1,698 -> 1,744 (136 KB alone 1,716; below 128 or 192 blocks: 1,701 / 1,620); with 16-warp
 * blocks, warps halved below 192 blocks (every launch of Qwen3.5-0.8B: 128-320 blocks of 2-8
 * warps), Qwen3.5-0.8B BF16 1,435 -> 1,475 (96: 1,469; 256: 1,393). */
static void pick_gemv_smem_shape(struct cuda_session *cs)
{
    bool wide = false;
    const struct dop *d = cs->dops[PHASE_DECODE];
    for (int32_t i = 0; i < cs->n_steps && !wide; i++) {
        const struct step *st = &cs->steps[i];
        if (st->kind != STEP_NORM_GEMV || (d[st->mm[0]].dtype != QR_BF16 && d[st->mm[0]].dtype != QR_F16))
            continue;
        int64_t rows = 0;
        for (int k = 0; k < (st->swiglu ? 1 : st->n_mm); k++)
            rows += d[st->mm[k]].N;
        wide = gemv_smem_wide(rows, d[st->mm[0]].K, cs->n_sm);
    }
    cs->gs_warps = cs->opt.gemv_smem_warps ? cs->opt.gemv_smem_warps : wide ? 16 : 8;
    cs->gs_kb = cs->opt.gemv_smem_kb ? cs->opt.gemv_smem_kb : wide ? 160 : 136;
    cs->gs_after_wait = cs->opt.gemv_smem_launch ? cs->opt.gemv_smem_launch == 2 : cs->gs_warps < 16;
    cs->gs_min_blocks = cs->opt.gemv_smem_min_blocks ? cs->opt.gemv_smem_min_blocks : cs->gs_warps >= 16 ? 192 : 96;
    /* the GEMV + residual launches in fewer, larger blocks with 16-warp blocks: Qwen3.5-0.8B BF16
     * +0.9% with 64 (its 1,024 rows as 64 blocks of 8 warps instead of 256 of 2; 128 of 4
     * lost 3%); Qwen3-0.6B's o and down lose with 64 (-2.6%) or 192 (-5.6%) against its 96
     * (H200, perf-log session 48) */
    cs->gs_res_min_blocks = cs->opt.gemv_smem_res_min_blocks ? cs->opt.gemv_smem_res_min_blocks
                            : cs->gs_warps >= 16                ? 64
                                                                : cs->gs_min_blocks;
    /* the same for the norm + gate|up + SwiGLU launches: Qwen3.5-0.8B BF16 +1.6% with 64 (its
     * 3,584 pairs as 112 blocks of 8 warps instead of 224 of 4); Qwen3-0.6B level at 48 or
     * 64, -2.6% at 128 or 192 (H200, perf-log session 49) */
    cs->gs_pair_min_blocks = cs->opt.gemv_smem_pair_min_blocks ? cs->opt.gemv_smem_pair_min_blocks
                             : cs->gs_warps >= 16                 ? 64
                                                                  : cs->gs_min_blocks;
    /* a norm into several matrices (q|k|v, in_proj): the option, else the session's minimum
     * (48 to 384 level or worse on both models, perf-log session 49) */
    cs->gs_multi_min_blocks = cs->opt.gemv_smem_multi_min_blocks ? cs->opt.gemv_smem_multi_min_blocks
                                                                 : cs->gs_min_blocks;
    /* 1 / rms after the sums: Qwen3.5-0.8B BF16 (16-warp blocks) +0.6%, Qwen3-0.6B (8) -0.1%
     * (H200, perf-log session 24) */
    cs->gs_norm_late = cs->opt.gemv_smem_norm_late ? cs->opt.gemv_smem_norm_late == 1 : cs->gs_warps >= 16;
}

/* gemvq's rows per warp below the LM head: the option, else 2 for a model with DeltaNet layers
 * (Qwen3.5-0.8B Q4_K_M: +5.7%, +5.5% and +4.9% in three H200 runs, sessions 15 and 17, where
 * Qwen3-0.6B Q4_K_M loses 2%), else 0 (gemv_quant.cu's default: 1, Q8_0 2). */
static int32_t pick_gemvq_rows(const struct cuda_session *cs)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    if (cs->opt.gemvq_rows)
        return cs->opt.gemvq_rows;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_GDN_CORE)
            return 2;
    return 0;
}

/* Whether the decode GEMVs of the layers take gemv_smem (16-bit weights; the LM head does not
 * count: it stays gemv2 or gemvq): then PDL pays (their weights load while the kernel before
 * runs), while with gemv2 / gemvq it costs 4-18% (docs/perf-log.md, sessions 12 and 13). */
static bool decode_pdl_applies(const struct plan *p)
{
    bool any = false;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind != OP_MATMUL || !op->w)
            continue;
        if (op->w->dtype != QR_BF16 && op->w->dtype != QR_F16)
            return false;
        any = true;
    }
    return any;
}

/* true when every layer matmul of the plan has block-quantised weights (gemvq's). */
static bool layers_quantised(const struct plan *p)
{
    bool any = false;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind != OP_MATMUL || !op->w)
            continue;
        if (dtype_is_float((enum qr_dtype)op->w->dtype))
            return false;
        any = true;
    }
    return any;
}

/* Whether gemvq's x is in 8 bits (cuda_options.gemvq_int8; 0, automatic: yes, for every
 * model since session 19), and its block shape: the options', or — with x in 8 bits, quantised layers and no shape
 * option set — blocks of 8 warps of 2 rows with 100 KB reserved, each block starting the next
 * launch after its wait, and PDL on: with int8 x that shape gained over the 4-warp default
 * on all three models measured (H200 tg128: Qwen3-0.6B Q4_K_M 1,308 -> 1,522, Qwen3.5-0.8B
 * Q4_K_M 1,129 -> 1,282, Qwen3-0.6B Q8_0 1,324 -> 1,665; docs/perf-log.md, session 18).
 * Returns whether the session should launch with PDL for it. */
static bool pick_gemvq_shape(struct cuda_session *cs)
{
    const struct cuda_options *o = &cs->opt;
    cs->gq_int8 = o->gemvq_int8 >= 0;
    bool pick = cs->gq_int8 && !o->gemvq_warps && !o->gemvq_smem_kb && !o->gemvq_launch && !o->gemvq_rows &&
                layers_quantised(&cs->plans[PHASE_DECODE]);
    cs->gq_warps = pick ? 8 : o->gemvq_warps;
    cs->gq_kb = pick ? 100 : o->gemvq_smem_kb;
    cs->gq_after_wait = pick || o->gemvq_launch == 2;
    if (pick)
        cs->gq_rows = 2;
    return pick;
}

/* The fast products' bf16 terms of x: opt.prefill_x_terms, or (0) one, and two for DeltaNet
 * models: on random-weight Qwen3.5 models the recurrence amplifies one term's rounding from
 * 0.7% after the first layer to a logits error of 0.49-0.7; two terms give 0.03, the size of
 * the exact path's own error against the CPU (docs/perf-log.md, 2026-11-30). */
static int32_t fast_x_terms(const struct cuda_options *o, const struct plan *p)
{
    if (o->prefill_x_terms == 1 || o->prefill_x_terms == 2)
        return o->prefill_x_terms;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_GDN_CORE)
            return 2;
    return 1;
}

/* ------------------------------------------------------------------ merged prefill products */

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

static qwenrt_status init_device(struct cuda_session *cs, struct qwenrt_error *err)
{
    qwenrt_status st = collect(cs, err);
    if (st)
        return st;
    if ((st = cuda_probe((int64_t)cs->arena_bytes + (64 << 20), err)))
        return err_prefix(err, "weights of %lld MiB: ", (long long)(cs->arena_bytes >> 20));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking));
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->n_sm, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    if ((st = upload(cs, err)) || (st = alloc_state(cs, err)) || (st = plan_merges(cs, err)))
        return st;
    CUDA_CHECK(cudaMalloc(&cs->d_ids, (size_t)cs->n_ctx * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&cs->d_out, (size_t)cs->n_ctx * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&cs->d_mk_top, 2 * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&cs->d_pos, sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&cs->d_step, sizeof(int32_t)));
    cs->am.blocks = cs->opt.argmax_blocks ? cs->opt.argmax_blocks : ARGMAX_BLOCKS_DEFAULT;
    CUDA_CHECK(cudaMalloc(&cs->am.part, (size_t)cs->am.blocks * sizeof(int2)));
    CUDA_CHECK(cudaMalloc(&cs->am.count, sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(cs->am.count, 0, sizeof(unsigned)));
    CUDA_CHECK(cudaMallocHost(&cs->h_stage, 4 * sizeof(int32_t)));
    if ((st = alloc_bufs(&cs->plans[PHASE_DECODE], cs->dbufs, 1, 1, err)))
        return st;
    if ((st = build_program(cs, err)))
        return st;
    pick_gemv_smem_shape(cs);
    cs->gq_rows = pick_gemvq_rows(cs);
    bool gq_pdl = pick_gemvq_shape(cs);
    cs->fast_prefill = cs->opt.prefill_bf16 && fast_prefill_applies(&cs->plans[PHASE_PREFILL]);
    cs->decode_pdl = cs->opt.pdl || gq_pdl || (cs->opt.gemv_smem && decode_pdl_applies(&cs->plans[PHASE_DECODE]));
    cs->x_terms = fast_x_terms(&cs->opt, &cs->plans[PHASE_PREFILL]);
    merge_qkv_attn_steps(cs);
    cs->cl_mode = pick_cl_mode(cs);
    cs->cl_from = cs->opt.attn_cluster_from ? cs->opt.attn_cluster_from : ATTN_CLUSTER_FROM;
    cs->cl_until = cs->opt.attn_cluster_until ? cs->opt.attn_cluster_until : ATTN_CLUSTER_UNTIL;
    if ((st = merge_attn_o_steps(cs, err)))
        return st;
    mark_early_reads(cs);
    mark_launch_ahead(cs);
    if ((st = plan_l2_prefetch(cs, err)) || (st = check_omitted_labels(cs, err)))
        return st;
    return build_megakernel(cs, err);
}

/* The options that take a number: values outside what the kernels are built for are refused
 * (before any device work). */
static qwenrt_status check_options(const struct cuda_options *o, struct qwenrt_error *err)
{
    int w = o->gemv_smem_warps;
    if (w < 0 || w > GEMV_SMEM_WARPS_LIMIT || (w & (w - 1)))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_smem_warps %d (0: the session picks, or a power of two, 1 to %d)", w,
                       GEMV_SMEM_WARPS_LIMIT);
    int kb = o->gemv_smem_kb;
    if (kb != 0 && (kb < 16 || kb > GEMV_SMEM_KB_LIMIT))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_kb %d (0: the session picks, or 16 to %d)", kb,
                       GEMV_SMEM_KB_LIMIT);
    if (o->gemv_smem_launch < 0 || o->gemv_smem_launch > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_smem_launch %d (0: the session picks, 1: before the wait, 2: after it)",
                       (int)o->gemv_smem_launch);
    int r = o->gemvq_rows;
    if (r != 0 && r != 1 && r != 2 && r != 4)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_rows %d (0: the default, or 1, 2 or 4)", r);
    if (o->gemvq_launch < 0 || o->gemvq_launch > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemvq_launch %d (0: the default, 1: before the wait, 2: after it)",
                       (int)o->gemvq_launch);
    int qw = o->gemvq_warps;
    if (qw != 0 && qw != 4 && qw != GEMVQ_WARPS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_warps %d (0: the default, or 4 or %d)", qw,
                       GEMVQ_WARPS_LIMIT);
    if (o->gemvq_smem_kb < 0 || o->gemvq_smem_kb > GEMVQ_SMEM_KB_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_smem_kb %d (0: what the block needs, or up to %d)",
                       (int)o->gemvq_smem_kb, GEMVQ_SMEM_KB_LIMIT);
    if (o->argmax_blocks < 0 || o->argmax_blocks > ARGMAX_BLOCKS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: argmax_blocks %d (0: %d, 1: one block, or up to %d)",
                       (int)o->argmax_blocks, ARGMAX_BLOCKS_DEFAULT, ARGMAX_BLOCKS_LIMIT);
    if (o->gemvq_int8 < -1 || o->gemvq_int8 > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_int8 %d (0: automatic, 1: on, -1: off)",
                       (int)o->gemvq_int8);
    if (o->gemvq_head_blocks < 0 || o->gemvq_head_blocks > 8)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_head_blocks %d (0: off, or 1 to 8 per multiprocessor)",
                       (int)o->gemvq_head_blocks);
    if (o->gemv_smem_min_blocks < 0 || o->gemv_smem_min_blocks > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_min_blocks %d (0: the session picks, 1: never, or up to 4096)",
                       (int)o->gemv_smem_min_blocks);
    if (o->gemv_smem_res_min_blocks < 0 || o->gemv_smem_res_min_blocks > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_smem_res_min_blocks %d (0: the session picks, 1: never, or up to 4096)",
                       (int)o->gemv_smem_res_min_blocks);
    if (o->gemv_smem_pair_min_blocks < 0 || o->gemv_smem_pair_min_blocks > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_smem_pair_min_blocks %d (0: the session picks, 1: never, or up to 4096)",
                       (int)o->gemv_smem_pair_min_blocks);
    if (o->gemv_smem_multi_min_blocks < 0 || o->gemv_smem_multi_min_blocks > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_smem_multi_min_blocks %d (0: as gemv_smem_min_blocks, 1: never, or up to 4096)",
                       (int)o->gemv_smem_multi_min_blocks);
    if (o->attn_early < -1 || o->attn_early > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: attn_early %d (1: everywhere, the q|k|v launch waiting first where it must; 0: only where "
                       "it already does; -1: never)",
                       (int)o->attn_early);
    if (o->gdn_early < -1 || o->gdn_early > 0)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gdn_early %d (0: where it applies, -1: never)",
                       (int)o->gdn_early);
    if (o->qkv_attn != 0 && o->qkv_attn != 8 && o->qkv_attn != 16)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: qkv_attn %d (0: off, or clusters of 8 or 16 blocks)",
                       (int)o->qkv_attn);
    if (o->l2_prefetch_mb < 0 || o->l2_prefetch_mb > 64)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: l2_prefetch_mb %d (0: off, or 1 to 64)",
                       (int)o->l2_prefetch_mb);
    if (o->gemv_smem_norm_late < -1 || o->gemv_smem_norm_late > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_norm_late %d (0: the session picks, 1: on, -1: off)",
                       (int)o->gemv_smem_norm_late);
    if (o->gemvq_one_pass != 0 && o->gemvq_one_pass != 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemvq_one_pass %d (0: off, 1: on)", (int)o->gemvq_one_pass);
    if (o->gemv_smem_xreg != 0 && o->gemv_smem_xreg != 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_xreg %d (0: off, 1: on)", (int)o->gemv_smem_xreg);
    if (o->attn_o != 0 && o->attn_o != 1 && o->attn_o != 8 && o->attn_o != 16)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: attn_o %d (0: off, 1: on, 8 or 16: on with clusters of that size)", (int)o->attn_o);
    if (o->attn_o_single < 0 || o->attn_o_single > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_o_single %d (0: 64, or 1 to 4096 positions)",
                       (int)o->attn_o_single);
    if (o->attn_cluster < -1 || o->attn_cluster > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: attn_cluster %d (0: the session picks, -1: off, 1: on, 2: in a window of positions)",
                       (int)o->attn_cluster);
    if (o->attn_cluster_from < 0 || o->attn_cluster_from > ATTN_CLUSTER_POS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_cluster_from %d (0: %d, or 1 to %d positions)",
                       (int)o->attn_cluster_from, ATTN_CLUSTER_FROM, ATTN_CLUSTER_POS_LIMIT);
    if (o->attn_cluster_until < 0 || o->attn_cluster_until > ATTN_CLUSTER_POS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_cluster_until %d (0: %d, or 1 to %d positions)",
                       (int)o->attn_cluster_until, ATTN_CLUSTER_UNTIL, ATTN_CLUSTER_POS_LIMIT);
    int32_t from = o->attn_cluster_from ? o->attn_cluster_from : ATTN_CLUSTER_FROM;
    int32_t until = o->attn_cluster_until ? o->attn_cluster_until : ATTN_CLUSTER_UNTIL;
    if (until <= from)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: attn_cluster_until %d is not after attn_cluster_from %d (an empty window)",
                       (int)until, (int)from);
    if (o->gdn_staged != 0 && o->gdn_staged != 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gdn_staged %d (0: off, 1: on)", (int)o->gdn_staged);
    if (o->gdn_wide != 0 && o->gdn_wide != 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gdn_wide %d (0: a block per norm group, 1: two)",
                       (int)o->gdn_wide);
    if (o->gen_graph_steps < 0 || o->gen_graph_steps > GEN_GRAPH_STEPS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gen_graph_steps %d (0 or 1: one step per graph, up to %d)",
                       (int)o->gen_graph_steps, GEN_GRAPH_STEPS_LIMIT);
    int m = o->attn_split_min;
    if (m != 0 && (m < 16 || m > 4096))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_split_min %d (0: the default, or 16 to 4096)", m);
    if (o->attn_pipe < -1 || o->attn_pipe > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_pipe %d (0 or -1: off, 1: on)", (int)o->attn_pipe);
    if (o->attn_lanes != 0 && o->attn_lanes != 8 && o->attn_lanes != 16 && o->attn_lanes != 32)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_lanes %d (0 or 32: a row per warp, 8 or 16 lanes a row)",
                       (int)o->attn_lanes);
    if (o->mlp_rows < 0 || o->mlp_rows > 3)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: mlp_rows %d (0: off, 1: a float accumulator, 2: fixed point, 3: floats added to the "
                       "residual)",
                       (int)o->mlp_rows);
    if (o->attn_rope_regs < 0 || o->attn_rope_regs > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_rope_regs %d (0: off, 1: on)", (int)o->attn_rope_regs);
    int32_t mc = o->mlp_rows_cluster;
    if (mc < 0 || mc > 8 || (mc > 2 && mc != 4 && mc != 8))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: mlp_rows_cluster %d (0 or 1: none, 2, 4 or 8)", (int)mc);
    if (o->mlp_rows_down < 0 || o->mlp_rows_down > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: mlp_rows_down %d (0: shared memory, 1: registers)",
                       (int)o->mlp_rows_down);
    if (o->gemvq_batch_pre != 0 && (o->gemvq_batch_pre < 2 || o->gemvq_batch_pre > GEMV_BATCH_MMA_MAX_T))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemvq_batch_pre %d (0: off, 2 to %d: x quantised once a product from this many "
                       "sessions)",
                       (int)o->gemvq_batch_pre, GEMV_BATCH_MMA_MAX_T);
    if (o->attn_stage < -1 || o->attn_stage > ATT_STAGES_MAX)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_stage %d (0 or -1: off, 1 to %d: tiles in the ring)",
                       (int)o->attn_stage, ATT_STAGES_MAX);
    if (o->attn_shared_kv < -1 || o->attn_shared_kv > 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_shared_kv %d (0 or -1: off, 1: on)",
                       (int)o->attn_shared_kv);
    if (o->gemv_launch_ahead < -1 || o->gemv_launch_ahead > 3)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gemv_launch_ahead %d (0: the session picks, -1: off, 1: before gate|up, 2: before "
                       "every fused-norm GEMV, 3: before every one but gate|up)",
                       (int)o->gemv_launch_ahead);
    if (o->gemv_smem_alone < 0 || o->gemv_smem_alone > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_alone %d (0: off, 1: q|k|v-style launches, 2: all)",
                       (int)o->gemv_smem_alone);
    if (o->gemv_smem_waves < 0 || o->gemv_smem_waves > 4)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gemv_smem_waves %d (0: off, or 1 to 4 blocks per multiprocessor)",
                       (int)o->gemv_smem_waves);
    if (o->attn_one_split < 0 || o->attn_one_split > 4096)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: attn_one_split %d (0: none, or up to 4096 positions)",
                       (int)o->attn_one_split);
    if (o->attn_batch_blocks < -1 || o->attn_batch_blocks > ATT_MAX_SPLITS)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: attn_batch_blocks %d (0: the session picks, -1: a block a split, 1 to %d blocks a head "
                       "pair and session)",
                       (int)o->attn_batch_blocks, ATT_MAX_SPLITS);
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_init(const struct plan *plans, int32_t n_ctx,
                                           const struct cuda_options *opt,
                                           struct cuda_session **out, struct qwenrt_error *err)
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
    st = init_device(cs, err);
    if (st) {
        cuda_session_free(cs);
        return st;
    }
    *out = cs;
    return QWENRT_OK;
}

/* Copies ids and pos0 to the device (stream-ordered). */
static qwenrt_status stage_inputs(struct cuda_session *cs, const int32_t *ids, int32_t T,
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
            free_bufs(cs->pbufs, cs->pm.run ? cs->pm.own : NULL);
            cs->cap_T = cs->cap_rows = 0;
            if ((st = alloc_bufs(p, cs->pbufs, capT, cap_rows, err, cs->pm.own, cs->pm.off, cs->pm.ld)))
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
    } else if ((st = run_plan_ops(&r, dump, dump_user, err))) {
        return st;
    }
    cs->last_row = b[p->buf_logits] + (size_t)(rows - 1) * cs->n_vocab;
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

/* ------------------------------------------------------------------ reading the logits */

extern "C" qwenrt_status cuda_session_logits(struct cuda_session *cs, float *dst, struct qwenrt_error *err)
{
    if (!cs->last_row)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no logits yet (nothing has run)");
    if (!cs->h_row)
        CUDA_CHECK(cudaMallocHost(&cs->h_row, (size_t)cs->n_vocab * sizeof(float)));
    CUDA_CHECK(cudaMemcpyAsync(cs->h_row, cs->last_row, (size_t)cs->n_vocab * sizeof(float),
                               cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->unsynced = false;
    memcpy(dst, cs->h_row, (size_t)cs->n_vocab * sizeof(float));
    return QWENRT_OK;
}

/* The arguments of a top-m selection over V logits, checked. */
static qwenrt_status top_args(int32_t V, float temperature, int32_t m, const int32_t *gather,
                              int32_t n_gather, int32_t max_keys, struct qwenrt_error *err)
{
    if (!(temperature > 0.0f) || m < 1 || n_gather < 0 || (n_gather && !gather))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: temperature %g, m %d, %d gathered ids",
                       (double)temperature, m, n_gather);
    if (topk_scratch_keys(V, m, max_keys) < 0 || n_gather > CUDA_TOP_MAX_GATHER)
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "cuda top: %d of %d logits with %d gathered (at most %d and %d)", m, V, n_gather,
                       CUDA_TOP_MAX_M, CUDA_TOP_MAX_GATHER);
    for (int32_t i = 0; i < n_gather; i++)
        if (gather[i] < 0 || gather[i] >= V)
            return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: gathered id %d outside the vocabulary of %d",
                           gather[i], V);
    return QWENRT_OK;
}

/* Words of the result block: [m ids][m vals][gather ids][gather vals]. */
#define TOP_WORDS (2 * CUDA_TOP_MAX_M + 2 * CUDA_TOP_MAX_GATHER)

/* launch_topk over a device row with the result block's layout; d_top / h_top (pinned) hold
 * TOP_WORDS words, scratch the keys. */
/* The selection's launch and its results' copies to h_top, not waited for (top_collect). */
static qwenrt_status top_launch(const float *row, int32_t V, float temperature, int32_t m, const int32_t *gather,
                                int32_t n_gather, bool reference, unsigned long long *scratch, int32_t *d_top,
                                int32_t *h_top, cudaStream_t s, struct qwenrt_error *err)
{
    int32_t *d_gather = d_top + 2 * CUDA_TOP_MAX_M, *h_gather = h_top + 2 * CUDA_TOP_MAX_M;
    if (n_gather) {
        memcpy(h_gather, gather, (size_t)n_gather * sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(d_gather, h_gather, (size_t)n_gather * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
    }
    float *d_gvals = (float *)(d_gather + CUDA_TOP_MAX_GATHER);
    CUDA_CHECK(launch_topk(row, V, temperature, m, d_gather, n_gather, scratch, d_top,
                           (float *)(d_top + CUDA_TOP_MAX_M), d_gvals, reference, s));
    CUDA_CHECK(cudaMemcpyAsync(h_top, d_top, 2 * CUDA_TOP_MAX_M * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    if (n_gather)
        CUDA_CHECK(cudaMemcpyAsync(h_gather + CUDA_TOP_MAX_GATHER, d_gvals, (size_t)n_gather * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    return QWENRT_OK;
}

/* top_launch's results, once its stream has been waited for. */
static void top_collect(const int32_t *h_top, int32_t m, int32_t n_gather, int32_t *ids, float *vals,
                        float *gather_vals)
{
    const int32_t *h_gather = h_top + 2 * CUDA_TOP_MAX_M;
    memcpy(ids, h_top, (size_t)m * sizeof(int32_t));
    memcpy(vals, h_top + CUDA_TOP_MAX_M, (size_t)m * sizeof(float));
    if (n_gather)
        memcpy(gather_vals, h_gather + CUDA_TOP_MAX_GATHER, (size_t)n_gather * sizeof(float));
}

static qwenrt_status top_run(const float *row, int32_t V, float temperature, int32_t m,
                             const int32_t *gather, int32_t n_gather, bool reference,
                             unsigned long long *scratch, int32_t *d_top, int32_t *h_top,
                             cudaStream_t s, int32_t *ids, float *vals, float *gather_vals,
                             struct qwenrt_error *err)
{
    qwenrt_status st = top_launch(row, V, temperature, m, gather, n_gather, reference, scratch, d_top, h_top, s, err);
    if (st)
        return st;
    CUDA_CHECK(cudaStreamSynchronize(s));
    top_collect(h_top, m, n_gather, ids, vals, gather_vals);
    return QWENRT_OK;
}

/* cuda_session_top's scratch and result blocks, each piece once (even when an earlier try
 * failed half way). */
static qwenrt_status top_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (cs->d_top)
        return QWENRT_OK;
    if (!cs->topk_keys)
        CUDA_CHECK(topk_prepare(&cs->topk_keys));
    if (!cs->d_topk)
        CUDA_CHECK(topk_alloc_scratch(&cs->d_topk));
    if (!cs->h_top)
        CUDA_CHECK(cudaMallocHost(&cs->h_top, TOP_WORDS * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&cs->d_top, TOP_WORDS * sizeof(int32_t)));
    return QWENRT_OK;
}

/* Whether the pick started ahead is the one asked for now, on the same row. */
static bool top_pending_fits(const struct cuda_session *cs, float temperature, int32_t m, const int32_t *gather,
                             int32_t n_gather)
{
    return cs->top_pending && cs->top_gen == cs->row_gen && cs->top_t == temperature && cs->top_m == m &&
           cs->top_n_gather == n_gather &&
           (!n_gather || !memcmp(cs->h_top + 2 * CUDA_TOP_MAX_M, gather, (size_t)n_gather * sizeof(int32_t)));
}

extern "C" qwenrt_status cuda_session_top_start(struct cuda_session *cs, float temperature, int32_t m,
                                                const int32_t *gather, int32_t n_gather, struct qwenrt_error *err)
{
    if (!cs->last_row)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no logits yet (nothing has run)");
    qwenrt_status st = top_ready(cs, err);
    if (st || (st = top_args(cs->n_vocab, temperature, m, gather, n_gather, cs->topk_keys, err)))
        return st;
    if (cs->top_pending) /* h_top may still be written by the one before */
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->top_pending = false;
    if (m == 1 && n_gather == 0 && temperature == 1.0f && cs->mk_top_ready)
        return QWENRT_OK; /* cuda_session_top needs no launch */
    if ((st = top_launch(cs->last_row, cs->n_vocab, temperature, m, gather, n_gather, false, cs->d_topk, cs->d_top,
                         cs->h_top, cs->stream, err)))
        return st;
    cs->top_pending = true;
    cs->unsynced = true; /* a step on another stream (a batch) waits for it first */
    cs->top_t = temperature, cs->top_m = m, cs->top_n_gather = n_gather, cs->top_gen = cs->row_gen;
    return QWENRT_OK;
}

/* One session of a group pick: its scratch and result blocks, h_top's device address, its
 * pick before (left to finish), and its row finished on its own stream. */
static qwenrt_status top_group_member(struct cuda_session *cs, const struct cuda_session *c0, float temperature,
                                      int32_t m, struct qwenrt_error *err)
{
    if (!cs->last_row || cs->n_vocab != c0->n_vocab)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: a session of the group has %s",
                       cs->last_row ? "another vocabulary" : "no logits yet");
    qwenrt_status st = top_ready(cs, err);
    if (st || (st = top_args(cs->n_vocab, temperature, m, NULL, 0, cs->topk_keys, err)))
        return st;
    if (!cs->h_top_dev && cudaHostGetDevicePointer((void **)&cs->h_top_dev, cs->h_top, 0) != cudaSuccess) {
        cudaGetLastError();
        cs->h_top_dev = NULL;
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda top: the device cannot write the host's result block");
    }
    if (cs->top_pending || cs->unsynced) /* its scratch and h_top free, its row written */
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->top_pending = false;
    cs->unsynced = false;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_sessions_top_start(struct cuda_session *const *css, int32_t n, float temperature,
                                                 int32_t m, struct qwenrt_error *err)
{
    if (n < 1 || n > TOPK_MAX_ROWS || !css)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: a group of %d sessions (1 to %d)", n, TOPK_MAX_ROWS);
    struct cuda_session *c0 = css[0];
    struct topk_rows rows;
    rows.n = n;
    for (int32_t r = 0; r < n; r++) {
        for (int32_t k = 0; k < r; k++)
            if (css[k] == css[r])
                return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: session %d of the group appears twice", r);
        qwenrt_status st = top_group_member(css[r], c0, temperature, m, err);
        if (st)
            return st;
        rows.logits[r] = css[r]->last_row, rows.scratch[r] = css[r]->d_topk;
        rows.out_ids[r] = css[r]->h_top_dev, rows.out_vals[r] = (float *)(css[r]->h_top_dev + CUDA_TOP_MAX_M);
    }
    if (!c0->top_ev)
        CUDA_CHECK(cudaEventCreateWithFlags(&c0->top_ev, cudaEventDisableTiming));
    CUDA_CHECK(launch_topk_rows(&rows, c0->n_vocab, temperature, m, c0->stream));
    CUDA_CHECK(cudaEventRecord(c0->top_ev, c0->stream));
    for (int32_t r = 0; r < n; r++) { /* each session's stream waits for the pick: cuda_session_top's wait */
        if (css[r] != c0)
            CUDA_CHECK(cudaStreamWaitEvent(css[r]->stream, c0->top_ev, 0));
        struct cuda_session *cs = css[r];
        cs->top_pending = true;
        cs->unsynced = true; /* a step on another stream (a batch) waits for it first */
        cs->top_t = temperature, cs->top_m = m, cs->top_n_gather = 0, cs->top_gen = cs->row_gen;
    }
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_top(struct cuda_session *cs, float temperature, int32_t m,
                                          const int32_t *gather, int32_t n_gather, int32_t *ids,
                                          float *vals, float *gather_vals, struct qwenrt_error *err)
{
    if (!cs->last_row)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no logits yet (nothing has run)");
    if (cs->top_pending) { /* started ahead: its results if they are these, else let it finish */
        bool fits = top_pending_fits(cs, temperature, m, gather, n_gather);
        cs->top_pending = false;
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        if (fits) {
            cs->unsynced = false;
            top_collect(cs->h_top, m, n_gather, ids, vals, gather_vals);
            return QWENRT_OK;
        }
    }
    qwenrt_status st = top_ready(cs, err);
    if (st)
        return st;
    st = top_args(cs->n_vocab, temperature, m, gather, n_gather, cs->topk_keys, err);
    if (st)
        return st;
    if (m == 1 && n_gather == 0 && temperature == 1.0f && cs->mk_top_ready) {
        /* greedy after a megakernel step: its LM head phase already found the argmax in the
         * same order (largest logit, lowest id, NaN never) */
        CUDA_CHECK(cudaMemcpyAsync(cs->h_top, cs->d_mk_top, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, cs->stream));
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        cs->unsynced = false;
        ids[0] = cs->h_top[0];
        memcpy(vals, &cs->h_top[1], sizeof(float));
        return QWENRT_OK;
    }
    st = top_run(cs->last_row, cs->n_vocab, temperature, m, gather, n_gather, false, cs->d_topk, cs->d_top,
                 cs->h_top, cs->stream, ids, vals, gather_vals, err);
    if (!st)
        cs->unsynced = false;
    return st;
}

extern "C" qwenrt_status cuda_topk_host(const float *logits, int32_t V, float temperature, int32_t m,
                                        const int32_t *gather, int32_t n_gather, bool reference,
                                        int32_t *ids, float *vals, float *gather_vals,
                                        struct qwenrt_error *err)
{
    int32_t max_keys = 0;
    cudaError_t e = topk_prepare(&max_keys);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "topk_prepare");
    qwenrt_status st = top_args(V, temperature, m, gather, n_gather, max_keys, err);
    if (st)
        return st;
    float *row = NULL;
    unsigned long long *keys = NULL;
    int32_t *d_top = NULL, *h_top = NULL;
    e = cudaMalloc(&row, (size_t)V * sizeof(float));
    if (e == cudaSuccess)
        e = topk_alloc_scratch(&keys);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_top, TOP_WORDS * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMallocHost(&h_top, TOP_WORDS * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMemcpy(row, logits, (size_t)V * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_topk_host setup");
    else
        st = top_run(row, V, temperature, m, gather, n_gather, reference, keys, d_top, h_top, 0, ids, vals,
                     gather_vals, err);
    cudaFree(row);
    cudaFree(keys);
    cudaFree(d_top);
    cudaFreeHost(h_top);
    return st;
}

extern "C" qwenrt_status cuda_topk_rows_host(const float *logits, int32_t n, int32_t V, float temperature, int32_t m,
                                             int32_t *ids, float *vals, struct qwenrt_error *err)
{
    if (n < 1 || n > TOPK_MAX_ROWS || !logits || !ids || !vals)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: %d rows (1 to %d)", n, TOPK_MAX_ROWS);
    int32_t max_keys = 0;
    cudaError_t e = topk_prepare(&max_keys);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "topk_prepare");
    qwenrt_status st = top_args(V, temperature, m, NULL, 0, max_keys, err);
    if (st)
        return st;
    float *rows_d = NULL;
    unsigned long long *keys[TOPK_MAX_ROWS] = {NULL};
    int32_t *h_top = NULL, *h_dev = NULL;
    struct topk_rows rows;
    rows.n = n;
    e = cudaMalloc(&rows_d, (size_t)n * V * sizeof(float));
    for (int32_t r = 0; r < n && e == cudaSuccess; r++)
        e = topk_alloc_scratch(&keys[r]);
    if (e == cudaSuccess)
        e = cudaMallocHost(&h_top, (size_t)n * 2 * m * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&h_dev, h_top, 0);
    if (e == cudaSuccess)
        e = cudaMemcpy(rows_d, logits, (size_t)n * V * sizeof(float), cudaMemcpyHostToDevice);
    for (int32_t r = 0; r < n && e == cudaSuccess; r++) {
        rows.logits[r] = rows_d + (size_t)r * V, rows.scratch[r] = keys[r];
        rows.out_ids[r] = h_dev + (size_t)r * 2 * m, rows.out_vals[r] = (float *)(h_dev + (size_t)r * 2 * m + m);
    }
    if (e == cudaSuccess)
        e = launch_topk_rows(&rows, V, temperature, m, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    for (int32_t r = 0; r < n && e == cudaSuccess; r++) {
        memcpy(ids + (size_t)r * m, h_top + (size_t)r * 2 * m, (size_t)m * sizeof(int32_t));
        memcpy(vals + (size_t)r * m, h_top + (size_t)r * 2 * m + m, (size_t)m * sizeof(float));
    }
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_topk_rows_host");
    cudaFree(rows_d);
    for (int32_t r = 0; r < n; r++)
        cudaFree(keys[r]);
    cudaFreeHost(h_top);
    return st;
}

extern "C" qwenrt_status cuda_session_generate(struct cuda_session *cs, int32_t id, int32_t pos0,
                                               int32_t n, int32_t readback_every,
                                               int32_t *out_ids, float *last_logits,
                                               struct qwenrt_error *err)
{
    if (n < 1 || pos0 < 0 || pos0 + n > cs->n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d steps at position %d exceed the context of %d",
                       n, pos0, cs->n_ctx);
    qwenrt_status st = stage_inputs(cs, &id, 1, pos0, err);
    if (st)
        return st;
    CUDA_CHECK(cudaMemsetAsync(cs->d_step, 0, sizeof(int32_t), cs->stream));
    const int32_t k = cs->opt.gen_graph_steps > 1 ? cs->opt.gen_graph_steps : 1;
    int32_t every = readback_every > 0 ? readback_every : n, done = 0;
    const struct plan *p = &cs->plans[PHASE_DECODE];
    for (int32_t i = 0; i < n; i++) {
        if (cs->mk) { /* the megakernel runs every step up to the next read-back at once */
            int32_t chunk = every - (i - done) < n - i ? every - (i - done) : n - i;
            if ((st = mk_run(cs->mk, cs->stream, cs->d_ids, cs->d_pos, cs->d_out, cs->d_step,
                             chunk, true, NULL, err)))
                return st;
            i += chunk - 1;
        } else if (cs->opt.graph && k > 1 && every - (i - done) >= k && n - i >= k) {
            int v = cs->cl_variant = attn_variant(cs, pos0 + i, k);
            if (!cs->g_gen_k[v] && (st = capture(cs, GEN_ARGMAX, k, &cs->g_gen_k[v], err)))
                return st;
            CUDA_CHECK(cudaGraphLaunch(cs->g_gen_k[v], cs->stream)); /* k steps up to the read-back */
            cs->gen_launches++;
            i += k - 1;
        } else if (cs->opt.graph) {
            int v = cs->cl_variant = attn_variant(cs, pos0 + i, 1);
            if (!cs->g_gen[v] && (st = capture(cs, GEN_ARGMAX, 1, &cs->g_gen[v], err)))
                return st;
            CUDA_CHECK(cudaGraphLaunch(cs->g_gen[v], cs->stream));
            cs->gen_launches++;
        } else {
            cs->cl_variant = attn_variant(cs, pos0 + i, 1);
            if ((st = enqueue_decode(cs, err)))
                return st;
            CUDA_CHECK(launch_argmax(cs->dbufs[p->buf_logits], cs->n_vocab, cs->d_ids, cs->d_pos,
                                     cs->d_out, cs->d_step, cs->stream, false, &cs->am));
        }
        if (i + 1 - done == every || i + 1 == n) {
            CUDA_CHECK(cudaMemcpyAsync(out_ids + done, cs->d_out + done,
                                       (size_t)(i + 1 - done) * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, cs->stream));
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
            done = i + 1;
        }
    }
    cs->last_row = cs->dbufs[p->buf_logits];
    cs->row_gen++;
    cs->mk_top_ready = false;
    if (last_logits) {
        CUDA_CHECK(cudaMemcpyAsync(last_logits, cs->dbufs[p->buf_logits],
                                   (size_t)cs->n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                   cs->stream));
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    }
    return QWENRT_OK;
}

/* The sampled loop's graphs rank by one temperature and candidate count: other values drop
 * them (captured again on first use). */
static qwenrt_status sample_graphs_for(struct cuda_session *cs, const struct cuda_sample_params *sp,
                                       struct qwenrt_error *err)
{
    if (!cs->d_sp) {
        if (!cs->h_sp)
            CUDA_CHECK(cudaMallocHost(&cs->h_sp, sizeof(*cs->h_sp)));
        CUDA_CHECK(cudaMalloc(&cs->d_sp, sizeof(*cs->d_sp)));
    }
    if (cs->samp_t == sp->temperature && cs->samp_m == sp->top_k)
        return QWENRT_OK;
    for (int v = 0; v < 2; v++) {
        if (cs->g_samp[v])
            cudaGraphExecDestroy(cs->g_samp[v]);
        if (cs->g_samp_k[v])
            cudaGraphExecDestroy(cs->g_samp_k[v]);
        cs->g_samp[v] = cs->g_samp_k[v] = NULL;
    }
    cs->samp_t = sp->temperature, cs->samp_m = sp->top_k;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_generate_sampled(struct cuda_session *cs, int32_t id, int32_t pos0, int32_t n,
                                                       const struct cuda_sample_params *sp, int32_t *out_ids,
                                                       struct qwenrt_error *err)
{
    if (!cuda_sample_params_ok(sp))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: sampled generation needs temperature > 0, 1 <= top_k < %d, 0 < top_p <= 1, 0 <= min_p <= 1",
                       CUDA_TOP_MAX_M);
    if (!out_ids || n < 1 || pos0 < 0 || pos0 + n > cs->n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d steps at position %d exceed the context of %d",
                       n, pos0, cs->n_ctx);
    if (!cs->opt.graph || cs->mk)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: sampled generation runs in decode graphs (%s)",
                       cs->mk ? "the megakernel decodes" : "graphs are off");
    qwenrt_status st = top_ready(cs, err);
    if (!st)
        st = top_args(cs->n_vocab, sp->temperature, sp->top_k, NULL, 0, cs->topk_keys, err);
    if (st || (st = sample_graphs_for(cs, sp, err)) || (st = stage_inputs(cs, &id, 1, pos0, err)))
        return st;
    *cs->h_sp = *sp;
    CUDA_CHECK(cudaMemcpyAsync(cs->d_sp, cs->h_sp, sizeof(*sp), cudaMemcpyHostToDevice, cs->stream));
    CUDA_CHECK(cudaMemsetAsync(cs->d_step, 0, sizeof(int32_t), cs->stream));
    const int32_t k = cs->opt.gen_graph_steps > 1 ? cs->opt.gen_graph_steps : 1;
    for (int32_t i = 0; i < n;) {
        bool many = k > 1 && n - i >= k;
        int v = cs->cl_variant = attn_variant(cs, pos0 + i, many ? k : 1);
        cudaGraphExec_t *g = many ? &cs->g_samp_k[v] : &cs->g_samp[v];
        if (!*g && (st = capture(cs, GEN_SAMPLE, many ? k : 1, g, err)))
            return st;
        CUDA_CHECK(cudaGraphLaunch(*g, cs->stream));
        cs->gen_launches++;
        i += many ? k : 1;
    }
    CUDA_CHECK(cudaMemcpyAsync(out_ids, cs->d_out, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* also: h_sp and h_stage are free again */
    cs->unsynced = false;
    cs->last_row = cs->dbufs[cs->plans[PHASE_DECODE].buf_logits];
    cs->row_gen++;
    cs->mk_top_ready = false;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_snapshot(struct cuda_session *cs, bool restore, struct qwenrt_error *err)
{
    if (restore && !cs->snap_saved)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no saved state to restore");
    if (!cs->rec_bytes)
        return QWENRT_OK;
    if (!cs->snap) {
        cudaError_t e = cudaMalloc(&cs->snap, cs->rec_bytes);
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

extern "C" qwenrt_status cuda_session_reset(struct cuda_session *cs, struct qwenrt_error *err)
{
    cs->row_gen++; /* a pick started ahead is for the old state */
    for (int32_t l = 0; l < cs->n_layer; l++) {
        if (cs->conv[l])
            CUDA_CHECK(cudaMemsetAsync(cs->conv[l], 0, (size_t)cs->conv_rows * cs->conv_dim * 4, cs->stream));
        if (cs->ssm[l])
            CUDA_CHECK(cudaMemsetAsync(cs->ssm[l], 0, (size_t)cs->ssm_len * 4, cs->stream));
    }
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

extern "C" int64_t cuda_session_device_bytes(const struct cuda_session *cs)
{
    return cs ? (int64_t)(cs->arena_bytes + cs->state_bytes) : 0;
}

/* ------------------------------------------------------------------ launch floor */

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The least a decode launch can cost: each block reads and writes one float the launch
 * before it wrote, nothing else. */
__global__ void floor_kernel(float *p)
{
    griddep_launch();
    griddep_wait();
    if (threadIdx.x == 0)
        p[blockIdx.x] += 1.0f;
}

extern "C" qwenrt_status cuda_launch_floor_bench(int32_t n_launch, int32_t blocks, int32_t threads, int32_t cluster,
                                                 bool pdl, int32_t reps, double *us, struct qwenrt_error *err)
{
    if (n_launch < 1 || blocks < 1 || threads < 32 || threads > 1024 || reps < 1 || reps > 64 || cluster < 0 ||
        cluster > 8 || (cluster > 1 && blocks % cluster))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_launch_floor_bench: bad arguments");
    float *p = NULL;
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float t[64];
    cudaError_t e = cudaMalloc(&p, (size_t)blocks * sizeof(float));
    if (!e) e = cudaMemset(p, 0, (size_t)blocks * sizeof(float));
    if (!e) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (!e) e = cudaEventCreate(&e0);
    if (!e) e = cudaEventCreate(&e1);
    if (!e) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int32_t i = 0; !e && i < n_launch; i++)
        e = launch_kc(pdl, cluster, floor_kernel, dim3(blocks), dim3(threads), 0, s, p);
    if (s) {
        cudaError_t e2 = cudaStreamEndCapture(s, &g);
        e = e ? e : e2;
    }
    if (!e) e = cudaGraphInstantiate(&ge, g, 0);
    for (int32_t r = -1; !e && r < reps; r++) { /* r = -1 warms up */
        if (!(e = cudaEventRecord(e0, s)) && !(e = cudaGraphLaunch(ge, s)) && !(e = cudaEventRecord(e1, s)) &&
            !(e = cudaEventSynchronize(e1)) && r >= 0)
            e = cudaEventElapsedTime(&t[r], e0, e1);
    }
    if (!e) {
        qsort(t, (size_t)reps, sizeof(float), cmp_f);
        *us = 1e3 * t[reps / 2] / n_launch;
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cudaFree(p);
    return e ? cuda_fail(err, e, __FILE__, __LINE__, "cuda_launch_floor_bench") : QWENRT_OK;
}

/* ------------------------------------------------------------------ GEMV microbenchmark */

__global__ void bench_fill_kernel(uint16_t *p, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (uint16_t)(0x3C00u | (h & 0x3FFu) | ((h >> 16) & 0x8000u)); /* no NaN, no zero */
    }
}

struct bench_bufs {
    uint8_t *w;
    float *x, *nw, *y;
    unsigned long long *stamps; /* gemv_smem's per-block stamps, [reps][blocks][TL_SLOTS] */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaEvent_t e0, e1;
};

static void bench_bufs_free(struct bench_bufs *b)
{
    if (b->ge) cudaGraphExecDestroy(b->ge);
    if (b->g) cudaGraphDestroy(b->g);
    if (b->e0) cudaEventDestroy(b->e0);
    if (b->e1) cudaEventDestroy(b->e1);
    cudaFree(b->w);
    cudaFree(b->x);
    cudaFree(b->nw);
    cudaFree(b->y);
    cudaFree(b->stamps);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_d(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n ? v[n / 2] : 0;
}

/* The timeline of a chain of gemv_smem launches from their stamps (us), medians over launches
 * 1..reps-1 of: [0] the first block's start after the launch before ended (its last block),
 * [1] the share of blocks that started before it ended, [2] a block's griddep_wait release after
 * it ended (median block), [3] x staged and weights in shared memory after the release, [4]
 * the dot products and stores, [5] the last block's end after the launch before's. */
static void gemv_timeline(const unsigned long long *h, int reps, int nb, double *tl)
{
    double *col[6], *tmp = (double *)malloc(sizeof(double) * (size_t)nb * 3);
    for (int j = 0; j < 6; j++)
        col[j] = (double *)calloc((size_t)reps, sizeof(double));
    for (int k = 1; k < reps && tmp && col[5]; k++) {
        const unsigned long long *p = h + (size_t)(k - 1) * nb * TL_SLOTS, *c = h + (size_t)k * nb * TL_SLOTS;
        unsigned long long prev_end = 0, first = ~0ull, last = 0;
        int early = 0;
        for (int b = 0; b < nb; b++) {
            prev_end = p[TL_SLOTS * b + 3] > prev_end ? p[TL_SLOTS * b + 3] : prev_end;
            last = c[TL_SLOTS * b + 3] > last ? c[TL_SLOTS * b + 3] : last;
            first = c[TL_SLOTS * b] < first ? c[TL_SLOTS * b] : first;
        }
        for (int b = 0; b < nb; b++) {
            early += c[TL_SLOTS * b] < prev_end;
            tmp[b] = ((double)c[TL_SLOTS * b + 1] - (double)prev_end) / 1e3;
            tmp[nb + b] = ((double)c[TL_SLOTS * b + 2] - (double)c[TL_SLOTS * b + 1]) / 1e3;
            tmp[2 * nb + b] = ((double)c[TL_SLOTS * b + 3] - (double)c[TL_SLOTS * b + 2]) / 1e3;
        }
        col[0][k - 1] = ((double)first - (double)prev_end) / 1e3;
        col[1][k - 1] = (double)early / nb;
        col[2][k - 1] = median_d(tmp, nb);
        col[3][k - 1] = median_d(tmp + nb, nb);
        col[4][k - 1] = median_d(tmp + 2 * nb, nb);
        col[5][k - 1] = ((double)last - (double)prev_end) / 1e3;
    }
    for (int j = 0; j < 6; j++) {
        tl[j] = col[j] && tmp ? median_d(col[j], reps - 1) : 0;
        free(col[j]);
    }
    free(tmp);
}

static qwenrt_status gemv_bench_run(struct bench_bufs *b, int32_t dtype, int32_t N, int32_t K,
                                    int32_t T, bool norm, int32_t kernel, bool pdl, int32_t reps,
                                    double *us, double *gbs, double *timeline, struct qwenrt_error *err)
{
    size_t rb = 0;
    if (!gemv_supports(dtype) || !dtype_row_bytes((enum qr_dtype)dtype, K, &rb) || T < 1 ||
        T > (kernel >= 4 ? GEMV_BATCH_MMA_MAX_T : GEMV_MAX_T) || N < 1 || reps < 1 || kernel < 0 || kernel > 5)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_gemv_bench: bad arguments");
    size_t mat = rb * (size_t)N;
    int copies = (int)((256u << 20) / mat) + 1; /* rotate through > 256 MB: not the L2 */
    copies = copies > 64 ? 64 : copies;
    size_t stride = (mat + 255) & ~(size_t)255;
    CUDA_CHECK(cudaMalloc(&b->w, stride * copies));
    CUDA_CHECK(cudaMalloc(&b->x, (size_t)T * K * 4));
    CUDA_CHECK(cudaMalloc(&b->nw, (size_t)K * 4));
    CUDA_CHECK(cudaMalloc(&b->y, (size_t)T * N * 4));
    bench_fill_kernel<<<1024, 256>>>((uint16_t *)b->w, (int64_t)(stride * copies / 2), 1u);
    bench_fill_kernel<<<64, 256>>>((uint16_t *)b->x, (int64_t)T * K * 2, 2u);
    bench_fill_kernel<<<64, 256>>>((uint16_t *)b->nw, (int64_t)K * 2, 3u);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t s = NULL;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int dev = 0, n_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    struct gemv_args a;
    memset(&a, 0, sizeof(a));
    a.x = b->x, a.ldx = K, a.K = K, a.T = T, a.norm_w = norm ? b->nw : NULL, a.eps = 1e-6f;
    a.dtype = dtype, a.mode = GEMV_STORE, a.n_seg = 1, a.pdl = pdl, a.v2 = kernel > 0, a.n_sm = n_sm;
    a.smem = kernel == 2, a.batch = kernel >= 3, a.batch_mma = kernel >= 4, a.q_int8 = kernel == 5;
    a.seg[0].N = N, a.seg[0].row_bytes = (int64_t)rb, a.seg[0].y = b->y, a.seg[0].ldy = N;
    a.seg[0].w = b->w;
    int32_t nb = timeline ? gemv_smem_blocks(&a) : 0;
    if (nb > 0)
        CUDA_CHECK(cudaMalloc(&b->stamps, sizeof(unsigned long long) * TL_SLOTS * (size_t)nb * reps));
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int32_t i = 0; i < reps && e == cudaSuccess; i++) {
        a.seg[0].w = b->w + stride * (size_t)(i % copies);
        a.stamps = nb > 0 ? b->stamps + TL_SLOTS * (size_t)nb * i : NULL;
        e = launch_gemv(&a, s);
    }
    cudaError_t e2 = cudaStreamEndCapture(s, &b->g);
    if (e == cudaSuccess)
        e = e2;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&b->ge, b->g, 0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b->e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b->e1);
    float t[7];
    for (int i = -1; i < 7 && e == cudaSuccess; i++) {
        e = cudaEventRecord(b->e0, s);
        if (e == cudaSuccess)
            e = cudaGraphLaunch(b->ge, s);
        if (e == cudaSuccess)
            e = cudaEventRecord(b->e1, s);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(b->e1);
        if (e == cudaSuccess && i >= 0)
            e = cudaEventElapsedTime(&t[i], b->e0, b->e1);
    }
    cudaStreamDestroy(s);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "gemv bench");
    qsort(t, 7, sizeof(float), cmp_f);
    *us = (double)t[3] * 1e3 / reps;
    *gbs = (double)mat / (*us * 1e-6) / 1e9;
    if (nb > 0 && reps > 1) { /* the last replay's stamps */
        size_t n = TL_SLOTS * (size_t)nb * reps;
        unsigned long long *h = (unsigned long long *)malloc(n * sizeof(*h));
        if (!h)
            return err_set(err, QWENRT_ERR_NOMEM, "gemv bench: out of memory");
        e = cudaMemcpy(h, b->stamps, n * sizeof(*h), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            gemv_timeline(h, reps, nb, timeline);
        free(h);
        if (e != cudaSuccess)
            return cuda_fail(err, e, __FILE__, __LINE__, "gemv bench stamps");
    }
    return QWENRT_OK;
}

/* cuda_argmax's device part: x copied in, one argmax launch (sc), the id copied back. */
static qwenrt_status argmax_run(const float *x, int32_t n, bool misalign, float *d_x, int32_t *d_id,
                                const struct argmax_scratch *sc, int32_t *id, struct qwenrt_error *err)
{
    float *dx = d_x + (misalign ? 1 : 0);
    CUDA_CHECK(cudaMemcpy(dx, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(launch_argmax(dx, n, d_id, NULL, NULL, NULL, 0, false, sc));
    CUDA_CHECK(cudaMemcpy(id, d_id, sizeof(int32_t), cudaMemcpyDeviceToHost));
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_argmax(const float *x, int32_t n, bool misalign, int32_t blocks, int32_t *id,
                                     struct qwenrt_error *err)
{
    *id = 0;
    if (!x || n < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_argmax: %d values", (int)n);
    if (blocks < 1 || blocks > ARGMAX_BLOCKS_LIMIT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda_argmax: %d blocks (1 to %d)", (int)blocks,
                       ARGMAX_BLOCKS_LIMIT);
    float *d_x = NULL;
    int32_t *d_id = NULL;
    struct argmax_scratch sc = {NULL, NULL, blocks};
    cudaError_t e = cudaMalloc(&d_x, ((size_t)n + 4) * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_id, sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc(&sc.part, (size_t)blocks * sizeof(int2));
    if (e == cudaSuccess)
        e = cudaMalloc(&sc.count, sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemset(sc.count, 0, sizeof(unsigned));
    qwenrt_status st = e != cudaSuccess ? cuda_fail(err, e, __FILE__, __LINE__, "cudaMalloc")
                                        : argmax_run(x, n, misalign, d_x, d_id, &sc, id, err);
    cudaFree(d_x);
    cudaFree(d_id);
    cudaFree(sc.part);
    cudaFree(sc.count);
    return st;
}

extern "C" qwenrt_status cuda_gemv_bench(int32_t dtype, int32_t N, int32_t K, int32_t T,
                                         bool norm, int32_t kernel, bool pdl, int32_t reps, double *us,
                                         double *gbs, double *timeline, struct qwenrt_error *err)
{
    struct bench_bufs b;
    memset(&b, 0, sizeof(b));
    *us = *gbs = 0;
    qwenrt_status st = gemv_bench_run(&b, dtype, N, K, T, norm, kernel, pdl, reps, us, gbs, timeline, err);
    bench_bufs_free(&b);
    return st;
}
