/*
 * session_options.cu — what a CUDA session is asked to do and what it decides for itself:
 * cuda_default_options (each default with the measurement that chose it), check_options (the
 * numbers the kernels are built for, refused by name before any device work), and the picks
 * init_device makes where an option is 0 (gemv_smem's block shape and minimum grids, gemvq's
 * shape, PDL, the prefill's bf16 products and their terms of x). The picks read the plans and
 * the device's multiprocessor count only; their measurements are in docs/perf-log.md.
 */
#include "backend/cuda/cuda_session.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ defaults */

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
    o.lm_screen = 2; /* greedy and sampled: docs/perf-log.md, sessions 56 and 57 */
    o.gdn_chunked = 0; /* FMA form: 2.71 vs 2.02 ms per pp512 (docs/perf-log.md, session 6) */
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
    o.attn_split_min = 0; /* ATT_SPLIT_MIN, 64 (cuda_internal.cuh) */
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


/* ------------------------------------------------------------------ the session's picks */

/* Whether the prefill may use the bf16 products (opt.prefill_bf16): not when a matmul has
 * F32 weights (such a model asked for f32 products). */
bool fast_prefill_applies(const struct plan *p)
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
void pick_gemv_smem_shape(struct cuda_session *cs)
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
int32_t pick_gemvq_rows(const struct cuda_session *cs)
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
 * runs), while with gemv2 / gemvq alone it costs 4-18% (docs/perf-log.md, sessions 12 and 13).
 * 16-bit layers with some block-quantised matrices among them (a Q5_K_M file on the GPU: its
 * Q5_K matrices converted to F16 at load, its Q6_K ones kept) take it too: session 55 measured
 * Qwen3-0.6B Q5_K_M at 1,242 tok/s without PDL, 1,441 with it; Qwen3.5-0.8B Q5_K_M 1,144 and
 * 1,549 (the same bits). F32 matrices: none. */
bool decode_pdl_applies(const struct plan *p)
{
    bool any16 = false;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind != OP_MATMUL || !op->w)
            continue;
        if (op->w->dtype == QR_BF16 || op->w->dtype == QR_F16)
            any16 = true;
        else if (dtype_is_float((enum qr_dtype)op->w->dtype))
            return false;
    }
    return any16;
}

extern "C" bool cuda_decode_plan_takes_pdl(const struct plan *decode_plan)
{
    return decode_pdl_applies(decode_plan);
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
bool pick_gemvq_shape(struct cuda_session *cs)
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
int32_t fast_x_terms(const struct cuda_options *o, const struct plan *p)
{
    if (o->prefill_x_terms == 1 || o->prefill_x_terms == 2)
        return o->prefill_x_terms;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == OP_GDN_CORE)
            return 2;
    return 1;
}


/* ------------------------------------------------------------------ checks */

/* The options that take a number: values outside what the kernels are built for are refused
 * (before any device work). */
qwenrt_status check_options(const struct cuda_options *o, struct qwenrt_error *err)
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
    if (o->lm_screen < 0 || o->lm_screen > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: lm_screen %d (0 off, 1 greedy, 2 greedy and sampled)",
                       (int)o->lm_screen);
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
    if (o->gdn_scan_warps != 0 && o->gdn_scan_warps != 8 && o->gdn_scan_warps != 16)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gdn_scan_warps %d (0: the default, 8 or 16)",
                       (int)o->gdn_scan_warps);
    if (o->gdn_chunked < 0 || o->gdn_chunked > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: gdn_chunked %d (0: the column scan, 1: chunks with f32 products, 2: on the tensor cores)",
                       (int)o->gdn_chunked);
    if (o->gdn_wide != 0 && o->gdn_wide != 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: gdn_wide %d (0: a block per norm group, 1: two)",
                       (int)o->gdn_wide);
    if (o->graph_flags < 0 || o->graph_flags > 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: graph_flags %d (0 plain, 1 upload, 2 device launch)",
                       (int)o->graph_flags);
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
