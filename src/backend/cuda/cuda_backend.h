/*
 * cuda_backend.h — executing plans on an NVIDIA GPU: the C interface the session calls.
 *
 * A cuda_session holds everything on the device for one sequence: the weights the plans use
 * (one cudaMalloc arena, shared by the sessions of one model: device_weights.cu), the KV
 * cache ([n_ctx][kv_width] f32 per attention layer), the DeltaNet conv state ([conv_k-1][conv_dim] f32) and recurrent state ([Hv][dk][dv] f32),
 * activation buffers ([T][width] f32 per plan buffer) and the cuBLASLt handle. The backend
 * reads only plans (src/plan/plan.h): layer kinds, widths and weights come from the ops.
 *
 * Decode (T = 1) runs either as one persistent kernel per step (megakernel.cu: every layer,
 * the LM head and the argmax, weights streamed through a shared-memory ring; only when
 * cuda_options.mega asks for it) or as fused kernels (decode_program.cu lists the fusions; each
 * has a switch in struct cuda_options) captured once in a CUDA graph and replayed (the
 * default for every weight type since session 11, where it measured faster). The token id and position
 * live in device memory, and cuda_session_generate keeps the argmax on the GPU between steps.
 * A run may leave its logits row on the device: cuda_session_top then sends back only the
 * best tokens the sampler needs (topk.cu; after a megakernel step greedy needs no launch at
 * all), cuda_session_logits the whole row.
 * Prefill runs the plan op by op with tensor-core GEMMs (one bf16 product per matmul by
 * default, three for f32 accuracy with prefill_bf16 off; products of one input whose weights
 * lie back to back — q|k|v, gate|up — as one, gemm_merge) and a flash-attention kernel.
 *
 * When qwenrt is built without CUDA, cuda_stub.c provides these functions: they report that
 * CUDA is not compiled in, so callers never #ifdef.
 */
#ifndef QWENRT_BACKEND_CUDA_BACKEND_H
#define QWENRT_BACKEND_CUDA_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "plan/plan.h"
#include "qwenrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called after ops that have a dump name (prefill/op-by-op runs only): data is [T][width] on
 * the host, valid during the call. Same shape as cpu_dump_fn. */
typedef void (*cuda_dump_fn)(void *user, const char *name, int32_t layer, const float *data,
                             int32_t T, int32_t width);

enum { CUDA_MEGA_OFF = 0, CUDA_MEGA_ON = 1, CUDA_MEGA_AUTO = 2 };

/* Switches (profiles / tests); cuda_default_options() turns everything on. */
#define ATTN_CLUSTER_FROM 192  /* cuda_options.attn_cluster's window of positions: what `qwenrt */
#define ATTN_CLUSTER_UNTIL 5120 /* calibrate` chose for Qwen3-0.6B BF16, Q8_0 and Q4_K_M on the
                                 * H200 (+5% at 256, level at 512, +8-13% at 1,024-2,048; perf-log
                                 * session 26), the upper edge moved from 3,072 in session 29,
                                 * where the merge measured +7.4% at 3,072, +3.1% at 4,096, -0.7%
                                 * at 5,120, -5.2% at 8,192 (why it changed since session 26 was
                                 * not measured; attn_pipe, session 27, is the likely cause) */
#define ATTN_CLUSTER_POS_LIMIT (1 << 22) /* a window's edges at most (the longest context) */

struct cuda_options {
    bool graph;          /* capture decode in a CUDA graph and replay it */
    bool prefill_graph;  /* run each prefill (cuda_session_run of 2 or more tokens) as one graph
                          * launch: captured, then instantiated or, where the kernels are the
                          * last prefill's, updated in place. The same bits as the launches. Made
                          * to keep a process out of the slow state (perf-log, sessions 60-61),
                          * which it does not; and a 64-token prompt takes 3.2-3.4 ms this way
                          * against 1.9 ms as launches (H100, session 61). Default off */
    int32_t graph_flags; /* how the decode graphs are instantiated (the slow state's probes):
                          * 0 (default) plainly, 1 uploaded to the session's stream at once
                          * (cudaGraphInstantiateFlagUpload), 2 for device launch
                          * (cudaGraphInstantiateFlagDeviceLaunch; launched from the host all
                          * the same) */
    bool fuse;           /* decode: fused kernels (norm->matmul, swiglu, residual, rope+cache) */
    bool gemm_bf16x2;    /* prefill, bf16 weights: x split into 3 bf16 terms, tensor cores */
    int32_t gemv_max_T;  /* up to this many tokens use the GEMV kernels instead of a GEMM */
    bool gemv_v2;        /* float weights: GEMV with every load issued up front (gemv2) */
    bool pdl;            /* decode: programmatic dependent launch (next kernel's prologue and
                          * weight loads overlap the previous kernel). Off by default: with
                          * gemv2 / gemvq it measured slower; gemv_smem turns it on by itself
                          * when the layers' weights are 16-bit */
    bool gemm_cache;     /* prefill: cuBLASLt descriptors and algorithm made once per shape */
    bool attn_tiled;     /* prefill: attention over query tiles sharing K/V tiles in smem */
    bool gdn_par;        /* prefill: DeltaNet conv token-parallel, core column-parallel */
    int32_t gdn_chunked; /* prefill (with gdn_par): the DeltaNet core in chunks of 64 tokens
                          * (gdn_chunked.cu) instead of the token-by-token column scan: 0 off
                          * (the default), 1 the scan's products in f32 FMAs (2.71 vs 2.02 ms
                          * per Qwen3.5 pp512, session 6), 2 on the tensor cores in 3xTF32
                          * (gdn_chunk_tc.cuh: 88.6k vs 91.4k tok/s, session 52; session
                          * 55, H200: pp64 20.6k vs 25.1k, pp512 90.4k vs 92.9k, pp2048
                          * 113.5k vs 112.2k) */
    int32_t gdn_scan_warps; /* gdn_chunked 2: warps a block of the walk over chunks, 8 or 16
                             * (the products' K split in halves), 0 the default (8); session
                             * 55: 16 level with 8 at pp64-2048 (within 1%) */
    bool gemm_stack3;    /* prefill, bf16x2: the 3 split terms as one GEMM over 3T columns */
    bool gemm_merge;     /* prefill: products of one input with weights back to back (q|k|v,
                          * gate|up, DeltaNet's qkv|z|beta|alpha) as one product */
    bool attn_gemm;      /* prefill (T >= 16): attention as f32 GEMMs + masked softmax */
    int32_t mega;        /* decode as one persistent kernel per step (megakernel.cu) when the
                          * plan allows, else the graph program: CUDA_MEGA_OFF, _ON, or _AUTO
                          * (the default, now the graph for every weight type: it measured
                          * faster than the megakernel; docs/perf-log.md, session 11) */
    int32_t mega_threads; /* megakernel block size: 256 or 512 */
    bool mega_fuse_down; /* megakernel, 16-bit weights: the down product in the SwiGLU phase
                          * (split over the blocks' rows of h, reductions into the residual:
                          * one grid barrier fewer per layer, a transposed copy of the down
                          * weights). Off by default: +2.5% (Qwen3-0.6B BF16 970 -> 997 tok/s),
                          * but the blocks' additions land in varying order, so the megakernel
                          * would no longer give the same logits bit for bit on every run. */
    bool attn_split;     /* decode attention split over the positions (flash decoding) */
    bool attn_rope;      /* decode graph: q/k norm + RoPE + cache write inside the attention
                          * kernel (one launch per layer fewer; same results bit for bit) */
    bool gdn_split;      /* decode graph, sm_90: each DeltaNet value head's step over a cluster
                          * of blocks (gdn_decode.cu) instead of one block per head */
    bool mlp_fused;      /* decode graph, 16-bit weights, sm_90: norm + gate|up + SwiGLU + down
                          * + residual in one launch (mlp_fused.cu) instead of two. Off by
                          * default: slower (Qwen3-0.6B BF16 1,080 vs 1,198 tok/s; its
                          * clusters stream from 96 multiprocessors; docs/perf-log.md) */
    bool gemv_batch;     /* 2 to 8 tokens, 16-bit weights: the GEMV that reads each weight chunk
                          * once for all tokens and x from L1 (gemv_batch.cu; the server's
                          * batched decode step). On by default; off: gemv2 or the plain GEMV */
    bool gemv_batch_mma; /* with gemv_batch, BF16 rows: the multi-token GEMV's sums on the
                          * tensor cores (gemv_batch_mma.cu: x as three bf16 terms, f32
                          * accuracy) where K is a multiple of 32, from 3 tokens, and up to 16
                          * tokens (the others take 8). On by default: Qwen3-0.6B BF16, 8
                          * sessions batched, 4,367 -> 6,842 tok/s (docs/perf-log.md, session 35) */
    bool batch_seq;      /* the batched decode step: each layer's attention (RoPE inside) and
                          * DeltaNet step as one launch for all sessions, chained with PDL,
                          * instead of one launch per session on side streams (forked and joined
                          * by events). On by default */
    int32_t batch_fail_at; /* tests only: a batched step launched op by op (new members, or no
                          * graph) stops at this op of the decode plan with BACKEND, as a launch
                          * that fails part way would; 0 (default): never */
    bool gemv_smem;      /* decode, one token, 16-bit weights: the GEMV that copies its rows into
                          * shared memory before it waits for its input (gemv_smem.cu), with
                          * PDL, so that the next GEMV's weights load while the kernel before it
                          * runs (gemv2 keeps them in registers: no room for the next blocks).
                          * On by default: Qwen3-0.6B BF16 decode +19%, Qwen3.5-0.8B +31%
                          * (docs/perf-log.md, sessions 13-14). Quantised weights keep gemvq and
                          * no PDL */
    int32_t gemv_smem_warps; /* its warps per block at most: 1, 2, 4, 8 or 16, fewer when the
                          * rows would not fit under gemv_smem_kb; 0 (default): the session
                          * picks 8, or 16 for a model whose widest layer product needs more
                          * than one block of 8 warps per multiprocessor (Qwen3.5-0.8B) */
    int32_t gemv_smem_kb; /* its shared memory per block at most, KB (16-226); 0 (default): the
                          * session picks 120, or 160 with 16 warps. PDL overlaps a launch
                          * only when its blocks fit beside the one before; which shape is
                          * fastest depends on the model (docs/perf-log.md, sessions 13-14) */
    bool kv_f16;         /* the KV cache in f16 instead of f32: half the bytes a decode step
                          * reads at depth (and half the memory). K and V rounded to 11
                          * significant bits when written; prefill attention takes the flash
                          * or tiled kernel (the f32 GEMMs refuse it), and decode the graph
                          * (the megakernel refuses it). Off by default */
    bool gemv_mma;       /* gemv_smem with BF16 rows: the dot products on the tensor cores
                          * (gemv_mma.cu; x as three bf16 terms, f32 accuracy) where K splits
                          * evenly (K % 128 == 0 up to 1024, % 256 above); off: CUDA cores */
    int32_t gemv_smem_launch; /* when a gemv_smem block lets the next launch start (PDL): 1
                          * early, before it waits for its input (the next launch may start
                          * its own successor in turn: several launches copy weights at once
                          * when their blocks are small); 2 after the wait (one launch ahead
                          * at most); 0 (default): the session picks 2 with blocks of up to 8
                          * warps, 1 with 16 (docs/perf-log.md, session 15) */
    int32_t gemvq_rows;  /* rows per warp of gemvq (quantised one-token GEMVs) below the LM
                          * head: 1, 2 or 4; 0 (default): 1, and 2 for Q8_0 and for every
                          * type in models with DeltaNet layers (Qwen3.5: +5%, three H200 runs).
                          * Which is fastest depends on the model (docs/perf-log.md, sessions
                          * 15 and 17): calibrate */
    int32_t gemvq_launch; /* when a gemvq block lets the next launch start under PDL: 1 before
                          * its wait (and 0, the default), 2 after it (gemv_smem_launch's
                          * choice for quantised rows) */
    int32_t gemvq_warps; /* warps per gemvq block: 4 (and 0, the default) or 8: fewer,
                          * larger blocks, so that fewer launches' blocks are resident at once
                          * under PDL (a calibration candidate, docs/perf-log.md, session 17) */
    int32_t gemvq_smem_kb; /* dynamic shared memory a gemvq block reserves at least (KB, 0: only
                          * what its rows and x need, up to 200): the same lever by memory */
    int32_t gemvq_head_blocks; /* a quantised LM head (32,768 rows or more) as a loop over its
                          * row tiles in this many blocks per multiprocessor (1 to 8), x staged
                          * once per block; 0: one tile per block (docs/perf-log.md, session 17) */
    int32_t gemvq_int8;  /* gemvq (quantised one-token GEMVs) with x quantised to 8 bits, as
                          * the CPU's quantised products do (Q8_K blocks for the K-quants, Q8_0
                          * for Q8_0: the same integer sums), and dp4a dot products instead of
                          * float ones (quant_rows_i8.cuh): 1 or 0 (default) on, -1 off (the
                          * session turns it off for --precision exact). With it, and no gemvq
                          * shape option set, gemvq takes its own block shape: tg128 +11-51%
                          * on the H200 (Qwen3 session 18, Qwen3.5 +33% session 19; cuda_bench
                          * holds each decode step from the CPU's state against the CPU's own
                          * 8-bit products) */
    int32_t gemvq_one_pass; /* gemvq with x in 8 bits: each warp loads its 256-element blocks
                          * of x, and the block normalises and quantises them in registers (two
                          * barriers with a fused norm, one without) instead of staging a float
                          * copy of x in shared memory, normalising it there and quantising it
                          * (three); where a warp has 2 rows (8-bit x's own shape), in Q4_K_M's
                          * mixed q|k|v and the LM head's loop. 1 (default): on (H200, session
                          * 24: Qwen3-0.6B Q4_K_M +17%, Q8_0 +16%); 0: off */
    int32_t attn_split_min; /* decode attention: positions per split at least (16 to 4096,
                          * 0: 64); fewer splits save the merge in short contexts and lose
                          * parallelism in long ones (docs/perf-log.md, session 15) */
    int32_t attn_one_split; /* decode attention: one split (no merge across blocks) while the
                          * position is below this, attn_split_min's splits from there: the
                          * merge's cost where a context is short, the splits' parallelism
                          * where it is long (session 15: a minimum of 128 per split was +1% at
                          * depth 0 and -5% at 512). 128 (default: H200 session 24, Qwen3-0.6B
                          * BF16 +1.4%, Qwen3.5-0.8B +0.5%); 0: none; up to 4096 */
    bool attn_flash;     /* fast prefill (T >= 16): attention in one tensor-core kernel
                          * (attention_flash.cu) instead of the TF32 GEMMs */
    bool prefill_bf16;   /* prefill with 16-bit or quantised weights: x rounded to bf16 and W
                          * (dequantised) in bf16, one tensor-core product per matmul, the
                          * attention products in TF32 — llama.cpp's and PyTorch-bf16's
                          * precision (~3e-3 relative). Off: f32-accurate products (bf16x3
                          * split, f32). Models with F32 matmul weights are always exact. */
    int32_t prefill_x_terms; /* the fast prefill's x: bf16 terms per element. 0: automatic —
                          * 1, and 2 for DeltaNet (Qwen3.5) models, whose recurrence amplifies
                          * one term's rounding (a logits error of 0.7 on random weights, 0.03
                          * with two: docs/perf-log.md); 1 or 2 force it. With two terms,
                          * weights bf16 does not hold (F16, quantised) are dequantised into
                          * two bf16 terms as well (three products). */
    int32_t lm_screen;     /* the generation loops' LM head (16- or 32-bit rows) read through
                          * an 8-bit copy, then exactly for the rows its proven bound cannot
                          * rule out (lm_screen.cuh: the same tokens, fewer bytes): 1 in the
                          * greedy loop (+7% / +10%, H100), 2 (default) in the sampled loop too
                          * (top_k up to 255: +6% / +10%, H100, session 57); 0 never */
    int32_t argmax_blocks; /* the greedy loop's argmax: 1 one block (the first kernel), 2 to
                          * 1,024 that many blocks, the last to arrive finishing; 0 (default):
                          * 128 (docs/perf-log.md, session 18) */
    int32_t gemv_smem_min_blocks; /* gemv_smem: a launch's warps per block (gemv_smem_warps or
                          * the session's pick) halved while its grid would have fewer blocks
                          * than this; 1: never; 0 (default): the session picks (96, or 192
                          * with 16-warp blocks: H200 session 22, +2.7% / +2.8%) */
    int32_t gemv_smem_res_min_blocks; /* the same for GEMV + residual launches (o, out_proj,
                          * down) alone: 0 (default): the session picks (64 with 16-warp
                          * blocks: Qwen3.5-0.8B BF16 +0.9% on the H200, session 48; else
                          * gemv_smem_min_blocks' value); 1: never; or up to 4096 */
    int32_t gemv_smem_pair_min_blocks; /* the same for the norm + gate|up + SwiGLU launches:
                          * 0 (default): the session picks (64 with 16-warp blocks:
                          * Qwen3.5-0.8B BF16 +1.6% on the H200, session 49; else
                          * gemv_smem_min_blocks' value); 1: never; or up to 4096 */
    int32_t gemv_smem_multi_min_blocks; /* and for a norm into several matrices (q|k|v, in_proj):
                          * 0 (default): gemv_smem_min_blocks' value; 1: never; or up to 4096
                          * (a sweep field: 48 to 384 level or worse on both models, session 49) */
    int32_t attn_early;  /* decode graph: the attention reads the position and its first round
                          * of cached K/V rows before waiting for the q|k|v launch, where that
                          * launch starts its successor only after its own wait (then every
                          * earlier launch has finished). 1 (default): everywhere, the q|k|v
                          * launch waiting first where it would start its successor before its
                          * wait (Qwen3.5's 16-warp blocks); 0: only where it already waits
                          * first; -1: never (docs/perf-log.md, sessions 19-20) */
    int32_t gdn_early;   /* decode graph: the DeltaNet step (over clusters) reads its recurrent
                          * state and conv windows before waiting for the in_proj launch, which then starts its
                          * successor only after its own wait (the rule of attn_early). 0
                          * (default): on; -1: off */
    int32_t qkv_attn;    /* decode graph, 16-bit weights, sm_90: a layer's norm + q|k|v + q/k
                          * norm + RoPE + cache write + attention in one launch, one cluster
                          * of blocks per KV head (qkv_attention.cu), where it applies (Qwen3:
                          * two query heads per KV head, head size 64 or 128). 0 (default):
                          * off; 8 or 16: on, with clusters of that many blocks at most.
                          * Tested; even with the two launches on the H200 in session 19, -9%
                          * (clusters of 8) and -16% (16) against today's faster q|k|v GEMV
                          * (perf-log session 26) */
    int32_t l2_prefetch_mb; /* decode graph: each launch (16-bit and quantised GEMVs, the
                          * attention, the DeltaNet step) asks the L2 for the weights that lie
                          * this many MB ahead of its own in the layers' order, so that HBM
                          * streams while the chain of dependent steps waits (a hint: results
                          * do not change). 0: off; 1 to 64 (default 8: docs/perf-log.md,
                          * session 20) */
    int32_t gemv_smem_xreg; /* gemv_smem on the CUDA cores: each warp reads x from global
                          * memory into its registers and normalises it itself instead of the
                          * block staging x in shared memory (no x in shared memory, no block
                          * barrier), where K <= 1024, or K <= 2048 without a norm. 0: off; 1
                          * (default): on (H200, session 22: Qwen3-0.6B BF16 +1.7%) */
    int32_t gemv_smem_norm_late; /* gemv_smem with x in registers and a fused RMS norm (the
                          * q|k|v and gate|up launches): x times the norm's weights in the dot
                          * products and 1 / rms on the row sums after the warp's reduction, so
                          * that the warp's sum of squares is off the chain before the first dot
                          * product. 0 (default): the session picks — on with 16-warp blocks
                          * (H200 session 24: Qwen3.5-0.8B BF16 +0.6%, Qwen3-0.6B's 8 warps
                          * -0.1%); 1: on; -1: off */
    int32_t attn_o;      /* decode graph, 16-bit o weights, sm_90: a layer's attention and
                          * its o product + residual add in one launch, a cluster of blocks per
                          * query head, each block a slice of W_o's rows (attn_o.cu). 0
                          * (default): off — H200 session 25: Qwen3-0.6B BF16 level at short
                          * contexts, +3% / +11% / +5% at depth 512 / 1,024 / 2,048, -6% at
                          * 4,096; Qwen3.5-0.8B -1.6%; 1: on, clusters of 16 blocks for models
                          * with 8 query heads or fewer, else 8; 8 or 16: on with that cluster
                          * size */
    int32_t attn_o_single; /* attn_o: below this position every block of a cluster attends all
                          * positions itself (no exchange); from it each block takes a slice
                          * and the cluster merges them. 0 (default): 64; 1 to 4096 */
    int32_t attn_cluster; /* decode graph, sm_90: the attention's splits of a head as one
                          * cluster of 8 blocks merged through distributed shared memory (each
                          * block a share of the dimensions) instead of up to 32 splits whose
                          * last block reads every partial back from global memory. H200 session
                          * 25, Qwen3-0.6B BF16: +4% / +11% / +5.5% at depth 512 / 1,024 /
                          * 2,048, -6% at 4,096, -1% at 0 (clusters cost their placement even
                          * where one block per head works; Q4_K_M -5%); Qwen3.5-0.8B (8 heads:
                          * 64 blocks) -1%. So the session captures a second set of graphs and
                          * launches them where every position of the launch lies in
                          * [ATTN_CLUSTER_FROM, ATTN_CLUSTER_UNTIL) (session 26: calibrate's
                          * choice for Qwen3-0.6B, +4.5% at 256 over session 25's [512, 2,560)).
                          * 0 (default): that window where every attention op has at least 16
                          * query heads, else never; 2: the window; 1: at every position; -1:
                          * never */
    int32_t attn_cluster_from, attn_cluster_until; /* attn_cluster's window of positions
                          * [from, until): 0 each (default): ATTN_CLUSTER_FROM / _UNTIL, the
                          * H200's edges for Qwen3-0.6B; a profile gives the window `qwenrt
                          * calibrate --backend cuda` measured for its model (1 to
                          * ATTN_CLUSTER_POS_LIMIT, until > from) */
    int32_t attn_pipe;   /* decode graph, the attention with RoPE inside: each warp's first two
                          * rounds of cached K/V rows requested before the wait (not one), and
                          * in the loop each round's registers refilled with the round after
                          * next as soon as they are used, so that a second round no longer
                          * waits one round trip after the first one's arithmetic (the same sums
                          * in the same order: logits bit for bit). 1 (default): on (H200,
                          * session 27, tg128: Qwen3-0.6B BF16 +3.0%, at depth 1,024 +3.4%,
                          * 4,096 +2.6%, Q4_K_M +2.2%; Qwen3.5-0.8B level); 0 or -1: off */
    int32_t gemv_smem_waves; /* gemv_smem: 0 (default): a launch's warps per block by
                          * gemv_smem_min_blocks (powers of two); N (1 to 4): the fewest warps,
                          * any number up to the block's cap, that keep its grid within N blocks
                          * per multiprocessor — Qwen3-0.6B's gate|up then runs 128 blocks of 6
                          * warps on 132 multiprocessors instead of 96 blocks of 8 */
    int32_t gemv_smem_alone; /* gemv_smem, a launch whose grid fits on the multiprocessors once:
                          * its blocks reserve over half a multiprocessor's shared memory, so
                          * that no two of them share one (the time line found the hardware
                          * placing two blocks of a 128-block launch on one multiprocessor, and
                          * none on others, in 30-60 of 128). 0 (default): off; 1: launches of
                          * several matrices (q|k|v, the DeltaNet input); 2: every such launch */
    int32_t gemv_launch_ahead; /* decode graph: a GEMV + residual launch (o, out_proj, down) starts
                          * the next launch before its own wait, whatever the session's pick,
                          * so that the next GEMV's blocks copy their rows while this one waits
                          * for the attention or the DeltaNet step. 1: where the next launch is
                          * gate|up; 2: before every fused-norm GEMV; 3: before every one but
                          * gate|up; -1: never; 0 (default): the session picks, for 16-bit rows,
                          * 3, and before gate|up too in the cluster-merged attention's graphs
                          * (H200, session 28, Qwen3-0.6B BF16 tg128 against -1: +2.5% at depth
                          * 0, +4.5% at 1,024, level at 4,096; Qwen3.5-0.8B level); 3 for Q4_K /
                          * Q6_K rows (Qwen3-0.6B Q4_K_M +1.3%); never for Q8_0 rows (-0.5%) */
    int32_t attn_shared_kv; /* decode graph, the attention with RoPE inside, outside the
                          * cluster-merged attention's graphs, an even number of query heads per
                          * KV head: each block attends two query heads of one KV head and loads
                          * each cached K/V row once for both (attention_shared_kv.cu; the same
                          * sums in the same order as the default kernel with attn_pipe 1: logits
                          * bit for bit). 0 (default): off; 1: on; -1: off. H200, session 29,
                          * Qwen3-0.6B BF16: depth 4,096 +1.2% (f32 cache) / -8.8% (f16), depth
                          * 0 -9.3%; Q4_K_M at 4,096 +6.1% */
    int32_t attn_lanes;  /* decode graph, the attention with RoPE inside, outside the
                          * cluster-merged attention's graphs: lanes per cached row's dot product
                          * (attention_lanes.cu: a warp takes 32 / lanes rows at once, fewer
                          * shuffle steps per row). 0 (default) or 32: a row per warp
                          * (attention_kernel); 8 or 16 (head size 256: 16 only). H200, session
                          * 29, Qwen3-0.6B BF16 with 8 / 16: depth 4,096 -5.4% / level (f32
                          * cache), +1.9% / +4.5% (f16); depth 0 -1.1% / -1.5% */
    int32_t gemvq_batch_pre; /* the batched step's quantised products in the default precision
                          * (gemvq_batch_mma.cu): x normalised and quantised once a product by a
                          * launch of its own (gemv_args.q_pre), which the product's blocks copy,
                          * from this many sessions (2-16), instead of by every block; 0:
                          * never. Default 2: bit for bit the staged form; H200, session 42,
                          * Qwen3-0.6B Q4_K_M +28% / +65% / +85% at 3 / 8 / 16 sessions, Q8_0
                          * +30% / +62% / +92% (docs/perf-log.md) */
    int32_t attn_stage;  /* decode graph, the attention with RoPE inside, outside the
                          * cluster-merged attention's graphs, sm_90: the cached K/V rows copied
                          * into shared memory by bulk copies, a ring of this many tiles of rows
                          * (1-8, fewer where they do not fit), one block per KV head and split
                          * serving all its query heads (attention_staged.cu; groups of 1, 2 or
                          * 4 query heads). 0 (default) or -1: off. H200, session 30, Qwen3-0.6B
                          * BF16 with 2 tiles at depth 4,096: 849 vs 845 default / 821 without the
                          * cluster merge (f32 cache), 920 vs 897 / 862 (f16); depth 0 -6.4%;
                          * Qwen3.5-0.8B at 4,096 -3% */
    int32_t attn_rope_regs; /* decode graph, the attention with RoPE inside (attention_kernel): 1:
                          * every warp normalises and rotates q (and the current row's k) in its
                          * own registers, no shared-memory copies and no block barrier between
                          * the wait and the rounds (the RoPE angles one per thread into shared
                          * memory before the wait); 0 (default): the shared prologue. H200,
                          * session 32: Qwen3-0.6B BF16 -0.3% at depth 0 (-0.4% with the f16
                          * cache), Qwen3.5-0.8B -0.1% (session 31's form, each lane's angles in
                          * sequence: -3.3% / -2.1% / -1.3%) */
    int32_t mlp_rows;    /* decode graph, 16-bit weights, sm_90: norm + gate|up + SwiGLU + down
                          * + residual in one launch split over the intermediate channels, each
                          * block its channels' partial sums for every output row, added up in
                          * global memory by atomics (mlp_rows.cu). 0 (default): off; 1: a float
                          * accumulator (the additions' order varies from run to run, so do the
                          * logits' last bits: a measurement); 2: fixed point (the same bits
                          * every run); 3: float atomics straight into the residual, which the
                          * GEMV + residual before also stores as the copy the blocks read (no
                          * last block; the additions' order varies as with 1). H200, session 31,
                          * Qwen3-0.6B BF16 tg128 1,843 off; 1,496 / 1,267 / 1,585 with 1 / 2 / 3;
                          * Qwen3.5-0.8B 1,521 -> 1,216 / 1,084 / 1,317 */
    int32_t mlp_rows_cluster; /* mlp_rows: blocks per cluster whose partials are summed through
                          * distributed shared memory before the atomics (fewer on each address):
                          * 0 or 1 (default): none; 2, 4 or 8 (session 31: 20% slower again) */
    int32_t mlp_rows_down; /* mlp_rows: 0 (default): the block's columns of W_down copied into
                          * shared memory; 1: into registers (hidden size up to 1,024), leaving
                          * the shared memory to the launches beside it (session 31: Qwen3.5
                          * +5%, Qwen3-0.6B -23%, both still below the two launches) */
    int32_t gdn_staged;  /* decode graph, the DeltaNet step split per head (gdn_decode.cu): its
                          * state slice read and written in whole rows through shared memory
                          * instead of by each thread's own column. 0: off; 1 (default): on
                          * (H200, session 23: Qwen3.5-0.8B BF16 +1.6%, logits bit for bit) */
    int32_t gdn_wide;    /* decode graph, the one-session DeltaNet step split per head: 1
                          * (default): blocks of two of the gated norm's groups (Qwen3.5-0.8B:
                          * 16 clusters of 4 blocks of 512 threads), the next launch started
                          * after the step's wait; 0: a block per group (16 clusters of 8), the
                          * next launch started at once. The same bits either way (H200,
                          * session 48: Qwen3.5-0.8B BF16 +2.1%) */
    int32_t gen_graph_steps; /* the greedy loop (cuda_session_generate): decode steps (each
                          * with its argmax) captured into one CUDA graph, so that one graph
                          * launch runs that many tokens and only every that many does a
                          * token wait for the graph before it to end. 0 or 1: one step per
                          * graph; up to GEN_GRAPH_STEPS_LIMIT; default 8 (H200, session 22:
                          * Qwen3.5-0.8B BF16 +1.0%, Qwen3-0.6B +0.3%, Q4_K_M +0.5%). A graph
                          * takes effect only where the caller reads the tokens back no more
                          * often (cuda_session_generate's readback_every) */
    int32_t attn_batch_blocks; /* the server's batched step, once its attention splits the
                          * keys: blocks for each pair of query heads and session, each walking a
                          * run of the session's splits with one prologue, every cached row used
                          * by both heads (attention_batch.cu; the same partials bit for bit).
                          * 0 (default): the session picks — as many as make the launch one wave;
                          * 1 to ATT_MAX_SPLITS (32): that many; -1: a block a head and split
                          * (attention_kernel's multi-session form). QWENRT_CUDA_BATCH_BLOCKS=N
                          * sets it for A/B runs */
    const char *omit_steps; /* measurement only (cuda_bench --sweep ...@L;L): the decode
                          * program leaves out its steps with these labels (';'-separated, as
                          * cuda_session_profile_decode names them, "argmax" for the greedy
                          * loop's), so that a step's share of the pipelined step time is the
                          * difference; the results are wrong. Must outlive the session.
                          * NULL (default): none */
    struct cuda_alloc_count *allocs; /* for the tests: the session's device and pinned
                          * allocations counted here, and the fail_at-th of them failed on
                          * purpose (struct cuda_alloc_count). Must outlive the session and the
                          * weights and screen copies it makes. NULL (default): none */
    void *stream;        /* a cudaStream_t the session works on instead of one of its own
                          * (borrowed: not destroyed with it; the caller keeps it to itself
                          * while the session lives). NULL (default): the session makes one */
};

/* For the tests (cuda_options.allocs): every device and pinned allocation a session makes —
 * its buffers and state, the weights' and the screen's copies it uploads, its graphs' scratch,
 * the megakernel's tables — counted, and one of them failed as out of memory, so that a test
 * can walk every allocation's error path and see that nothing stays behind (live back to 0
 * once the session is freed). An allocation made by one session and freed by another (a
 * shared copy) is counted where it was made. */
struct cuda_alloc_count {
    int64_t fail_at; /* the fail_at-th allocation (from 1) fails as out of memory
                      * (cudaErrorMemoryAllocation); 0: none */
    int64_t made;    /* allocations asked for, the failed one included */
    int64_t live;    /* allocations made and not yet freed */
};

#define GEN_GRAPH_STEPS_LIMIT 64 /* 16 until session 60; 32 and 64 for the slow state's probe */

struct cuda_options cuda_default_options(void);

/* true when this build has the CUDA backend. */
bool cuda_backend_compiled(void);

/* true when the CUDA kernels compute with weights stored as dtype (F32, F16, BF16, Q8_0, Q4_K,
 * Q6_K). Defined in both builds (weight_types.c): a model loaded for the CUDA backend has its
 * other matrices (Q4_0, Q5_K, and the types qwenrt only reads) transcoded at load (model_load.c,
 * quant/transcode.h). */
bool cuda_weight_dtype_supported(int32_t dtype);

/* Checks that a CUDA device can be used: a driver, a device of compute capability 8.0 or
 * newer, and (need_bytes > 0) that much free device memory. Errors: BACKEND with the reason
 * (not compiled in, no driver, driver too old, no device, device too old, too little
 * memory). */
qwenrt_status cuda_probe(int64_t need_bytes, struct qwenrt_error *err);

/* Device name and memory, for records ("NVIDIA H200, 139 GiB, cc 9.0"); "" when none. */
void cuda_device_describe(char *out, int out_len);

struct cuda_session;

/* Uploads the weights of both plans and allocates the state for n_ctx positions.
 * plans[PHASE_PREFILL] and plans[PHASE_DECODE] must outlive the session.
 * Errors: BACKEND (no device, out of device memory, CUDA failure), UNSUPPORTED (a head size
 * or dtype the kernels do not handle). Nothing is left allocated on error. */
qwenrt_status cuda_session_init(const struct plan *plans, int32_t n_ctx,
                                const struct cuda_options *opt, struct cuda_session **out,
                                struct qwenrt_error *err);
void cuda_session_free(struct cuda_session *cs);

/* The device copy of a model's weights (device_weights.cu): made by the first session of the
 * model on a device, shared by the sessions after it, freed with the last of them. */
struct cuda_weights;

/* cuda_session_init with the weights shared through *slot, which *mu guards (the model's
 * struct model_device_weights): a session takes the copy in *slot when it is on the same device
 * and has the same layout, else uploads its own and, where *slot is empty, leaves it there for
 * the sessions after it. mu and slot NULL: a copy of the session's own (cuda_session_init). */
qwenrt_status cuda_session_init_shared(const struct plan *plans, int32_t n_ctx,
                                       const struct cuda_options *opt, pthread_mutex_t *mu,
                                       struct cuda_weights **slot, struct cuda_session **out,
                                       struct qwenrt_error *err);

/* The device address of the session's weights (NULL without CUDA): two sessions sharing one
 * copy give the same address. For tests. */
const void *cuda_session_weights(const struct cuda_session *cs);

/* Runs T tokens at positions pos0.. (T == 1: decode plan, else prefill plan). Writes the
 * logits of the last position, or of every position when all_logits, to logits
 * ([rows][n_vocab] floats) and waits for the GPU. logits NULL (with all_logits false): the
 * row stays on the device for cuda_session_logits / cuda_session_top, and the call returns
 * once the work is queued (a failure inside it surfaces at the next call that waits).
 * dump (may be NULL) forces the op-by-op path. */
qwenrt_status cuda_session_run(struct cuda_session *cs, const int32_t *ids, int32_t T,
                               int32_t pos0, bool all_logits, float *logits, cuda_dump_fn dump,
                               void *dump_user, struct qwenrt_error *err);

#define CUDA_TOP_MAX_M 256      /* candidates cuda_session_top returns at most */
#define CUDA_TOP_MAX_GATHER 512 /* logits it gathers by id at most */

/* Copies the last position's logits of the latest run or generate call to dst ([n_vocab],
 * through a pinned staging row). Errors: INVALID_ARG (nothing has run), BACKEND. */
qwenrt_status cuda_session_logits(struct cuda_session *cs, float *dst, struct qwenrt_error *err);

/* The m best tokens of that row on the GPU, best first: ranked by logit / temperature (IEEE
 * division; pass 1 for raw logits), ties by the lower id — the CPU sampler's order — with
 * their raw logits in vals; gather_vals[i] = logits[gather[i]] (ids below n_vocab). Only
 * ~8 (m + n_gather) bytes cross to the host. Errors: INVALID_ARG (nothing has run, an id
 * outside the vocabulary, temperature <= 0), UNSUPPORTED (m > CUDA_TOP_MAX_M or > n_vocab,
 * n_gather > CUDA_TOP_MAX_GATHER, or more candidates than the last block of topk.cu holds
 * on this device: read the whole row instead), BACKEND. */
qwenrt_status cuda_session_top(struct cuda_session *cs, float temperature, int32_t m,
                               const int32_t *gather, int32_t n_gather, int32_t *ids, float *vals,
                               float *gather_vals, struct qwenrt_error *err);

/* Starts cuda_session_top's pick for these arguments without waiting for it (the server starts
 * every generating session's pick before it waits for any): the next cuda_session_top with the
 * same arguments on the same row takes its results; another call, or a row changed since,
 * lets it finish and runs its own. Errors as cuda_session_top's (nothing started). */
qwenrt_status cuda_session_top_start(struct cuda_session *cs, float temperature, int32_t m,
                                     const int32_t *gather, int32_t n_gather, struct qwenrt_error *err);

/* cuda_session_top_start for n sessions of one vocabulary with the same temperature and m and
 * no gathered ids (the server's picks after a batched step), as one launch on css[0]'s stream
 * that writes each session's results into its pinned result block; each session's own stream
 * waits for it, so cuda_session_top takes the results as from its own start. n: 1 to
 * CUDA_TOP_MAX_ROWS.
 * Errors: INVALID_ARG (a session twice, without logits or of another vocabulary, n out of
 * range), UNSUPPORTED (as cuda_session_top's, or a device that cannot write pinned host
 * memory), BACKEND. A session already made ready stays so, with no pick pending. */
#define CUDA_TOP_MAX_ROWS 16 /* sessions one cuda_sessions_top_start takes at most */
qwenrt_status cuda_sessions_top_start(struct cuda_session *const *css, int32_t n, float temperature,
                                      int32_t m, struct qwenrt_error *err);

/* The same selection on a host row of V logits, through the fast kernels or (reference) the
 * one-thread reference kernel: what test_cuda_ops compares. Errors as cuda_session_top. */
qwenrt_status cuda_topk_host(const float *logits, int32_t V, float temperature, int32_t m,
                             const int32_t *gather, int32_t n_gather, bool reference, int32_t *ids,
                             float *vals, float *gather_vals, struct qwenrt_error *err);
/* n host rows of V logits ([n][V]) through the one-launch form (cuda_sessions_top_start's
 * kernel, results written into mapped pinned memory as there): ids and vals [n][m]. n: 1 to
 * CUDA_TOP_MAX_ROWS. Errors as cuda_session_top, INVALID_ARG for n. */
qwenrt_status cuda_topk_rows_host(const float *logits, int32_t n, int32_t V, float temperature, int32_t m,
                                  int32_t *ids, float *vals, struct qwenrt_error *err);

/* Greedy decoding on the GPU: feeds id at position pos0, then each step's argmax, n steps.
 * out_ids[i] = argmax after step i. The token stays on the GPU; the host reads ids back every
 * readback_every steps (<= 0: once at the end). last_logits (may be NULL) gets the final
 * step's logits. */
qwenrt_status cuda_session_generate(struct cuda_session *cs, int32_t id, int32_t pos0,
                                    int32_t n, int32_t readback_every, int32_t *out_ids,
                                    float *last_logits, struct qwenrt_error *err);

/* A sampler the GPU can run between decode steps (sample.cu): no logit bias, no penalties,
 * temperature > 0 and 1 <= top_k < CUDA_TOP_MAX_M; top_p in (0, 1], min_p in [0, 1]. rng is
 * the host sampler's splitmix64 state before the first draw (sampler_device_plan fills it). */
struct cuda_sample_params {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t rng;
};

/* Sampled decoding on the GPU: feeds id at position pos0, then each step's draw, n steps, the
 * draws made as the host sampler with those parameters makes them (sample.cu: the same token
 * but where the draw falls within float rounding of a boundary); out_ids[i] = the token drawn
 * after step i (draw i, from sp->rng). Runs cuda_options.gen_graph_steps steps per graph
 * launch, the token kept on the device; the ids come back once, at the end. The last step's
 * logits stay on the device (cuda_session_logits). Errors: INVALID_ARG (sp out of range),
 * LIMIT (past the context), UNSUPPORTED (no graphs: cuda_options.graph off, or the megakernel
 * decodes), BACKEND. */
qwenrt_status cuda_session_generate_sampled(struct cuda_session *cs, int32_t id, int32_t pos0, int32_t n,
                                            const struct cuda_sample_params *sp, int32_t *out_ids,
                                            struct qwenrt_error *err);

/* One draw of sample.cu's kernel over host candidates ids / vals [sp->top_k] (ranked best
 * first, raw logits) as draw number draw from sp->rng: what test_cuda_ops compares with
 * the host sampler. Errors: INVALID_ARG, BACKEND. */
qwenrt_status cuda_sample_host(const int32_t *ids, const float *vals, const struct cuda_sample_params *sp,
                               int32_t draw, int32_t *id, struct qwenrt_error *err);

/* The token's pick timed over a random row of V logits (us, median of reps; bench/cuda_bench
 * --pick): the greedy loop's argmax, topk.cu's m best, and those with sample.cu's draw.
 * Errors: INVALID_ARG (V, m or reps out of range), NOMEM, BACKEND. */
qwenrt_status cuda_pick_bench(int32_t V, int32_t m, int32_t reps, double *argmax_us, double *topk_us,
                              double *sample_us, struct qwenrt_error *err);

/* The recurrent state (every DeltaNet layer's conv and state rows) copied to a device backup
 * (save) or back from it (restore: after a save), so that steps decoded past a stop can be
 * undone; the KV cache needs no copy (its rows are indexed by position). Nothing to do for a
 * model without recurrent layers. Errors: INVALID_ARG (restore before any save), NOMEM,
 * BACKEND. */
qwenrt_status cuda_session_snapshot(struct cuda_session *cs, bool restore, struct qwenrt_error *err);

/* One decode step for n sessions of one model together: session r decodes ids[r] at position
 * pos[r]. Ops that treat tokens independently (norms, matmuls: each weight read once for all
 * n rows; gemv_batch.cu for 2-8 rows of 16-bit weights) run once on css[0]'s weights and
 * stream; attention, RoPE and the DeltaNet steps run per session on its own state: one launch
 * for all sessions (cuda_options.batch_seq), or the sessions' side by side on css[0]'s side
 * streams. The step is captured in a CUDA graph led by
 * css[0] the second time the same sessions come in the same order, and replayed after that
 * (cuda_options.graph; see batch_step). logits: [n][n_vocab] on the host, or NULL: each session
 * keeps its row on the device (cuda_session_top / cuda_session_logits). Waits for the GPU.
 * Errors: INVALID_ARG (another model's session), LIMIT (position), NOMEM, BACKEND. */
qwenrt_status cuda_batch_decode(struct cuda_session *const *css, const int32_t *ids,
                                const int32_t *pos, int32_t n, float *logits,
                                struct qwenrt_error *err);
/* The per-sequence steps (attention, DeltaNet) that the last batched step led by cs (its css[0])
 * launched for all sessions at once (cuda_options.batch_seq), rather than per session: for
 * tests and benchmarks. */
int32_t cuda_batch_seq_steps(const struct cuda_session *cs);

/* Whether cuda_batch_decode of n sessions beats their own decode graphs one after another: where
 * every product of the decode plan has rows a multi-token GEMV takes — 16-bit (gemv_batch.cu,
 * gemv_batch_mma.cu) or Q8_0 / Q4_K / Q6_K (gemvq_batch.cu) — cuda_options.gemv_batch is on, and
 * n >= 2 (16-bit products; at most 16 where the tensor cores' GEMV takes every product: more
 * would take the GEMM, slower than two steps) or 3 <= n <= 8 (a quantised one: more take the
 * GEMM) where the one-token products also take x in f32 (gemvq_int8 off: the same answers
 * batched or alone). F32 rows have only the plain kernels (docs/perf-log.md, sessions 33-35). */
bool cuda_batch_pays(const struct cuda_session *cs, int32_t n);

/* Parts of a layer's state, for checkpoints. */
enum cuda_state_part { CUDA_STATE_K, CUDA_STATE_V, CUDA_STATE_CONV, CUDA_STATE_SSM };

/* Copies the first n_floats of a layer's state part to host (to_host) or from it (K/V rows
 * are [pos][kv_width], conv [conv_k-1][conv_dim], the DeltaNet state [Hv][dk][dv]: the CPU
 * backend's layouts). Errors: INVALID_ARG (no such part, too many floats), BACKEND. */
qwenrt_status cuda_session_state_io(struct cuda_session *cs, int32_t layer,
                                    enum cuda_state_part part, int64_t n_floats, float *host,
                                    bool to_host, struct qwenrt_error *err);

/* Zeroes the DeltaNet state (the KV cache is overwritten by position, so it stays). */
qwenrt_status cuda_session_reset(struct cuda_session *cs, struct qwenrt_error *err);

/* Copies rows [0, n_pos) of attention layer `layer`'s K (v = false) or V cache to dst
 * ([n_pos][kv_width] f32). Errors: INVALID_ARG when the layer has no KV cache. */
qwenrt_status cuda_session_read_kv(struct cuda_session *cs, int32_t layer, bool v,
                                   int32_t n_pos, float *dst, struct qwenrt_error *err);

/* For the tests: whether a session's decode steps over decode_plan launch with PDL by the
 * weights' types alone (cuda_options.gemv_smem on, pdl off): layers of 16-bit weights, with
 * block-quantised matrices among them or not, and no F32 ones. */
bool cuda_decode_plan_takes_pdl(const struct plan *decode_plan);
/* For the tests: whether the decode GEMV of one token of N x K weights of dtype (aligned, no
 * norm) runs the shared-memory kernel (gemv_smem.cu) when cuda_options.gemv_smem is on. */
bool cuda_gemv_smem_takes(int32_t dtype, int32_t N, int32_t K);
/* The same for T tokens (cuda_options.gemv_batch on): whether gemv_batch.cu (16-bit rows) or
 * gemvq_batch.cu (quantised rows) takes them. */
bool cuda_gemv_batch_takes(int32_t dtype, int32_t N, int32_t K, int32_t T);

/* For the tests: one GEMV launch of T tokens on host data. x: [T][K], RMS-normalised with
 * norm_w [K] and eps first when norm_w is non-NULL; n_seg segments of N[i] rows of K weights
 * w[i] (dtype BF16, F16, Q8_0, Q4_K or Q6_K, rows back to back; mixed: Q4_K / Q6_K each
 * segment's own); mode 0 stores y[i] [T][N[i]], 1 adds to it, 2 is SwiGLU (two segments, N
 * equal: y[0] = silu(gate) * up). batch: through gemv_batch.cu or gemvq_batch.cu (UNSUPPORTED
 * where neither applies), else the plain reference GEMV (gemv_kernel; a mixed case one launch
 * per segment). Errors: INVALID_ARG, UNSUPPORTED, NOMEM, BACKEND. */
struct cuda_gemv_case {
    int32_t dtype, K, T, mode, n_seg;
    int32_t N[4];
    bool mixed;            /* segments of their own dtypes (Q4_K / Q6_K: Q4_K_M's q|k|v) */
    int32_t seg_dtype[4];  /* each segment's dtype when mixed */
    const void *w[4];
    const float *x, *norm_w;
    float eps;
    float *y[4];
    bool mma;              /* with batch, BF16 rows: through gemv_batch_mma.cu (UNSUPPORTED where
                            * it does not apply), T up to 16 */
    bool int8;             /* with batch and mma, Q4_K / Q6_K rows: x in 8 bits through
                            * gemvq_batch_mma.cu (UNSUPPORTED where it does not apply); without
                            * batch, each token alone through gemvq with x in 8 bits (the
                            * one-token path of the default precision) */
    bool prequant;         /* with batch, mma and int8: x quantised once before the product
                            * (gemv_args.q_pre) instead of by each of its blocks */
};
qwenrt_status cuda_gemv_host(const struct cuda_gemv_case *c, bool batch, struct qwenrt_error *err);
/* The same for gemv_mma (cuda_options.gemv_mma on): BF16 rows that it takes. */
bool cuda_gemv_mma_takes(int32_t N, int32_t K);
/* The same with cuda_options.gemv_smem_xreg on: the chunks of x per lane gemv_smem holds in
 * registers (4 or 8; 0: x staged in shared memory, or not gemv_smem). */
int32_t cuda_gemv_smem_xreg_chunks(int32_t dtype, int32_t N, int32_t K);
/* gemv_smem's grid for one token of N x K rows (swiglu: N gate/up pairs) under the session's
 * 8-warp pick (136 KB, at least 96 blocks), cuda_options.gemv_smem_waves = waves on n_sm
 * multiprocessors, and its warps per block in *warps; 0 when gemv_smem does not take it. */
int32_t cuda_gemv_smem_grid(int32_t dtype, int32_t N, int32_t K, bool swiglu, int32_t waves, int32_t n_sm,
                            int32_t *warps);
/* gemv_smem's grid for one token of BF16 rows under the 16-warp pick (160 KB) with
 * gemv_smem_min_blocks = min_blocks, for a launch of kind (0: GEMV + residual, N x K; 1: N
 * gate/up pairs; 2: two matrices of N / 2 rows) where kind set_kind's own minimum
 * (gemv_smem_res_ / _pair_ / _multi_min_blocks) is kind_min; its warps in *warps; 0 when
 * gemv_smem does not take it. */
int32_t cuda_gemv_smem_grid_kind(int32_t kind, int32_t set_kind, int32_t N, int32_t K, int32_t min_blocks,
                                 int32_t kind_min, int32_t *warps);
/* The same for gemvq (quantised rows) with a block of warps (0: 4) of rows each (0: its pick)
 * reserving smem_kb: its grid, 0 when it does not take them. */
int32_t cuda_gemvq_blocks(int32_t dtype, int32_t N, int32_t K, int32_t warps, int32_t rows, int32_t smem_kb);

/* Times one GEMV of N x K weights of dtype (random data, T tokens, fused norm when norm) in
 * isolation: *us = median microseconds per launch over reps dependent launches captured in a
 * graph (each on another copy of the weights: not from L2), *gbs = weight bytes / time.
 * kernel: 0 the first GEMV kernel, 1 gemv2 / gemvq (gemv_v2), 2 gemv_smem when it applies, 3
 * the multi-token GEMV (gemv_args.batch: gemv_batch.cu / gemvq_batch.cu where they apply), 4
 * the same with the tensor cores' sums for BF16 rows (gemv_batch_mma.cu), 5 quantised rows with x
 * in 8 bits on the tensor cores (gemvq_batch_mma.cu);
 * pdl as in cuda_options. timeline (NULL: none), with gemv_smem: 6 medians over the chain, in
 * us: the first block's start after the launch before ended (negative: early), the share of
 * blocks started before that, a block's input-wait release after it, x and weights ready
 * after the release, dot products and stores, the last block's end after the one before's.
 * Errors: INVALID_ARG (bad shape or kernel), BACKEND. */
qwenrt_status cuda_gemv_bench(int32_t dtype, int32_t N, int32_t K, int32_t T, bool norm, int32_t kernel,
                              bool pdl, int32_t reps, double *us, double *gbs, double *timeline,
                              struct qwenrt_error *err);

/* For the tests: the screened LM head (lm_screen.cu) over host inputs: h [K], norm_w [K]
 * (x = h * (1 / rms(h)) * norm_w, as the fused final norm), rows w [N][K] of dtype (QR_F32,
 * QR_F16 or QR_BF16 bytes), N >= 1, K a multiple of 32 up to 8,192; reps picks in a row (the
 * scratch must come back zeroed: each must give the same). m 0: *id the token (the argmax of
 * the exact logits, ties to the lowest index, 0 when all are NaN); m >= 1: the sampled loop's
 * ranking at temperature 1, top_ids [m] and top_vals [m] the m best rows (by exact logit, ties
 * to the lower index), best first, and their exact logits; *id 0. *exact_rows: the rows
 * computed exactly over all reps; *built false (and *id -1) when the screen declines the rows
 * (a bound that is not finite). Errors: INVALID_ARG (also m above the screen's limit: its
 * blocks, at most CUDA_TOP_MAX_M), BACKEND. */
qwenrt_status cuda_lm_screen_pick(const float *h, const float *norm_w, float eps, const void *w, int32_t dtype,
                                  int32_t N, int32_t K, int32_t m, int32_t reps, int32_t *id, int32_t *top_ids,
                                  float *top_vals, int64_t *exact_rows, bool *built, struct qwenrt_error *err);

/* For cuda_bench --pick-phases: the screened LM head's pick (lm_screen.cu) over pseudo-random
 * BF16 rows [N][K] (the GEMV bench's fill; h a fixed pattern, norm weights 1), reps picks one after another, each with its
 * phases' clocks: m 0 the greedy pick; m 1 to 255 the sampled one (the m best ranked and a draw
 * at temperature 0.8, top_p 0.95, min_p 0.05). us[CUDA_PICK_PHASES], medians over the picks:
 * [0] from the first block's start to the threshold known in every block (for m >= 1 the m-th
 * block maximum), [1] the exact rows of every block, [2] the last block's arrival, [3] its
 * select of the m best, [4] their ranking, [5] the draw, [6] the whole pick; [7] the rows read
 * exactly a pick. Errors: INVALID_ARG, NOMEM, BACKEND. */
#define CUDA_PICK_PHASES 8
qwenrt_status cuda_lm_screen_phases(int32_t N, int32_t K, int32_t m, int32_t reps, double *us,
                                    struct qwenrt_error *err);

/* For the tests: device memory taken until at most leave_bytes stay free (in chunks, the largest
 * that cudaMalloc grants), as another program filling the GPU would; *hold gives it back to
 * cuda_test_release_memory. Errors: NOMEM (the hold's own list), BACKEND. */
struct cuda_memory_hold;
/* For the bench: the current device's free and total memory (cudaMemGetInfo), to see whether
 * sessions made and freed in turn give all of theirs back (cuda_bench --screen-sessions).
 * Errors: BACKEND (the stub: not built). */
qwenrt_status cuda_device_memory(int64_t *free_bytes, int64_t *total_bytes, struct qwenrt_error *err);
/* For the bench only: cudaDeviceReset — the process's primary context destroyed, every device
 * allocation of the process with it, and made afresh by the next CUDA call. The caller must hold
 * no session, model copy or other device object (cuda_bench --screen-pattern R: whether the
 * state that slows every session after ~256 submissions belongs to the context). Errors:
 * BACKEND (the stub: not built). */
qwenrt_status cuda_bench_device_reset(struct qwenrt_error *err);
/* For the bench only: n non-blocking streams made and destroyed, one after another, with no work
 * on them (cuda_bench --screen-pattern X: whether making and destroying streams, as every session
 * does, brings on the slow state). Errors: INVALID_ARG (n outside 1-1,024), BACKEND. */
qwenrt_status cuda_bench_stream_churn(int32_t n, struct qwenrt_error *err);
/* For the bench only: n launches outside any graph on a stream of their own — an empty kernel of
 * one block, or with memsets a 4-byte cudaMemsetAsync — then a wait for them (cuda_bench
 * --screen-pattern Y / V / Q: whether such launches, as a prompt's prefill makes, bring on the
 * slow state). Errors: INVALID_ARG (n outside 1-100,000), BACKEND. */
qwenrt_status cuda_bench_plain_launches(int32_t n, bool memsets, struct qwenrt_error *err);

/* For cuda_bench's slow-state probes: n_big blocks of 32 MiB and n_small of 64 KiB made with
 * cudaMalloc and freed in the order made, nothing launched (does where the next session's
 * buffers land set its speed?). Errors: INVALID_ARG (more than 64 of either), BACKEND. */
qwenrt_status cuda_bench_alloc_churn(int32_t n_big, int32_t n_small, struct qwenrt_error *err);

/* For cuda_bench's slow-state probes: n (1 to 64) non-blocking streams made now, for
 * cuda_options.stream (is a session slow because its stream was made after a prompt ran?), and
 * their release. Errors: INVALID_ARG, BACKEND (none kept). */
qwenrt_status cuda_bench_streams(int32_t n, void **streams, struct qwenrt_error *err);
void cuda_bench_streams_free(int32_t n, void **streams);
qwenrt_status cuda_test_hold_memory(int64_t leave_bytes, struct cuda_memory_hold **hold, struct qwenrt_error *err);
void cuda_test_release_memory(struct cuda_memory_hold *hold);

/* For the tests: the greedy loop's argmax kernel over n host floats (copied to the device 4
 * bytes past a 16-byte boundary when misalign: the kernel's scalar path) in blocks blocks (1:
 * the single-block kernel). *id: the largest value that is not NaN, ties to the lowest index,
 * 0 when every value is NaN. Errors: INVALID_ARG (n < 1, blocks outside 1-1,024), BACKEND. */
qwenrt_status cuda_argmax(const float *x, int32_t n, bool misalign, int32_t blocks, int32_t *id,
                          struct qwenrt_error *err);

/* The SM clock as a kernel sees it: a block on every multiprocessor spins warm_ms, then block 0
 * counts clock64 cycles over %globaltimer nanoseconds for ms more; *mhz is that rate and
 * *rated_mhz the device's peak (cudaDevAttrClockRate). A bench checks the two with
 * cuda_clock_held_down before it writes a record: session 53 was lent an H100 whose hardware
 * power brake held it at ~300 of 1,980 MHz, every timing ~5x slow. Errors: INVALID_ARG (ms or
 * warm_ms outside 1-1,000), BACKEND. */
qwenrt_status cuda_sm_clock(int32_t warm_ms, int32_t ms, double *mhz, double *rated_mhz, struct qwenrt_error *err);

/* Whether a measured SM clock is held down: under 70% of the rated peak (a GPU at its power
 * limit runs at ~85-95% of it; a power brake or thermal slowdown far lower). Unknown (rated
 * 0): no. */
static inline bool cuda_clock_held_down(double mhz, double rated_mhz)
{
    return rated_mhz > 0.0 && mhz < 0.7 * rated_mhz;
}

/* The launch floor: a graph of n_launch dependent launches of an empty kernel (blocks x
 * threads, in clusters of cluster blocks when cluster > 1; with programmatic dependent launch
 * when pdl) replayed reps times; *us: the median replay's microseconds per launch. Errors:
 * INVALID_ARG, BACKEND (clusters need sm_90). */
qwenrt_status cuda_launch_floor_bench(int32_t n_launch, int32_t blocks, int32_t threads, int32_t cluster,
                                      bool pdl, int32_t reps, double *us, struct qwenrt_error *err);

/* Runs a T-token prefill from position 0 op by op with an event after every op and writes the
 * time per op kind to report (the session's state is overwritten). Errors: INVALID_ARG,
 * BACKEND. */
qwenrt_status cuda_session_profile_prefill(struct cuda_session *cs, const int32_t *ids, int32_t T,
                                           char *report, size_t report_len,
                                           struct qwenrt_error *err);

/* gemv_smem's block shape in this session: warps and KB per block at most (the options', or
 * the session's pick when they are 0), when its blocks let the next launch start (1 before
 * their wait, 2 after it: the option's, or the session's pick), and the grid size below which
 * a launch's warps are halved (the option's, or the session's pick); zeros for a NULL
 * session. */
void cuda_session_gemv_smem_shape(const struct cuda_session *cs, int32_t *warps, int32_t *kb, int32_t *launch,
                                  int32_t *min_blocks);

/* The minimum grids of gemv_smem's three launch kinds in this session: GEMV + residual, the
 * norm + gate|up + SwiGLU pair, a norm into several matrices (each the option's, or the
 * session's pick: cuda_options.gemv_smem_res_ / _pair_ / _multi_min_blocks); zeros for a NULL
 * session. */
void cuda_session_gemv_smem_kind_minima(const struct cuda_session *cs, int32_t *res, int32_t *pair, int32_t *multi);

/* true when decode runs as the megakernel; else *why (may be NULL) says why not. */
bool cuda_session_uses_megakernel(const struct cuda_session *cs, const char **why);

/* How many launches of the decode graph program carry this step label (as in the decode
 * profile, e.g. "norm+gate|up+down+residual"; "rope+attention (early)": those attention steps
 * that read the position and cached rows before their wait, cuda_options.attn_early; "gdn
 * (early)": the DeltaNet steps that read their state before their wait, cuda_options.gdn_early;
 * "gemv+residual (ahead)": the GEMV + residual steps that start the next launch before their
 * own wait, cuda_options.gemv_launch_ahead; "gemv+residual (ahead in cluster graphs)": those
 * that do so only in the cluster-merged attention's graphs; "rope+attention (shared K/V)": the
 * attention steps whose blocks take two query heads each outside those graphs,
 * cuda_options.attn_shared_kv; "rope+attention (lanes)": those whose rows go to groups of lanes
 * outside those graphs, cuda_options.attn_lanes; "rope+attention (staged)": those whose rows
 * are staged in shared memory outside those graphs, cuda_options.attn_stage).
 * The program is built also when the megakernel runs decode. 0 for a NULL session or label. */
int32_t cuda_session_count_steps(const struct cuda_session *cs, const char *label);

/* The shared memory the DeltaNet step split per head takes with cuda_options.gdn_staged for
 * value heads of dk x dv (bytes), or 0 where the split or the staging does not apply (test
 * hook; host code). */
int32_t cuda_gdn_staged_bytes(int32_t dk, int32_t dv, bool wide);

/* Makes the greedy loop's graphs (cuda_session_generate: k steps and one step, each attention
 * variant the session uses) and its screen copy now rather than on first use, so that their
 * cost comes before the first token. Made for the slow state's probes (cuda_bench A): graphs made
 * before a session's prompt decode no faster than those made after it (perf-log, session 61).
 * Nothing for the megakernel or with graphs off. */
qwenrt_status cuda_session_prepare_generate(struct cuda_session *cs, struct qwenrt_error *err);

/* Graph launches cuda_session_generate has made on this session (one per token, or one per
 * cuda_options.gen_graph_steps tokens); 0 for a NULL session. */
int64_t cuda_session_gen_graph_launches(const struct cuda_session *cs);

/* How this session's prefills ran (cuda_options.prefill_graph): counts[0] as a graph made
 * anew, [1] as the last one's graph updated in place, [2] outside a graph (the option off
 * counts nowhere); *why (when why is not NULL): the last reason one ran outside a graph, or
 * "". Zeros and "" for a NULL session. */
void cuda_session_prefill_graphs(const struct cuda_session *cs, int64_t counts[3], const char **why);

/* The greedy loop's screened LM head (cuda_options.lm_screen, lm_screen.cuh): whether this
 * session has one (made by its first cuda_session_generate where it applies), the tokens it
 * picked and the rows it computed exactly for them (a synchronous read). false (with zeros)
 * where there is none. */
bool cuda_session_lm_screen(const struct cuda_session *cs, int64_t *picks, int64_t *exact_rows);

/* Where the screened LM head's buffers lie on the device (for a measurement of placement,
 * cuda_bench --screen-sessions): addr[0] the 8-bit copy, [1] its scales, [2] the approximate
 * logits, [3] the scratch its atomics use. false (zeros) where the session has no screen. */
bool cuda_session_lm_screen_buffers(const struct cuda_session *cs, uint64_t addr[4]);

/* Where this session's decode data lie (the slow state's probes: does the speed follow the
 * addresses?): its state block (KV caches, recurrent rows), its first decode buffer, the
 * attention's partials, the token ids. Zeros for a NULL session. */
void cuda_session_buffer_addresses(const struct cuda_session *cs, uint64_t addr[4]);
/* The screened LM head's greedy pick alone (its two launches, no PDL), reps times on the
 * session's last hidden state: the median time from event to event, *us. For the same
 * measurement. Errors: INVALID_ARG (no screen: no generation call yet, or none applies), BACKEND. */
qwenrt_status cuda_session_lm_screen_time(struct cuda_session *cs, int32_t reps, double *us,
                                          struct qwenrt_error *err);
/* Its parts alone (parts 1: the events around no launch; 2: the launches, a stream sync after
 * each; 3: both, as cuda_session_lm_screen_time): what in it leaves a process's later sessions
 * slow (docs/perf-log.md, session 59). Errors: INVALID_ARG also for parts outside 1..3. */
qwenrt_status cuda_session_lm_screen_probe(struct cuda_session *cs, int32_t reps, int32_t parts, double *us,
                                           struct qwenrt_error *err);

/* Bytes of weights the decode program's launches ask the L2 for per token
 * (cuda_options.l2_prefetch_mb); 0 when off or for a NULL session. */
int64_t cuda_session_l2_prefetch_bytes(const struct cuda_session *cs);

/* The decode graph's time line for token id at position pos (a measurement): the graph is
 * captured with every launch that can (GEMVs, the attention, the DeltaNet step) writing
 * %globaltimer stamps per block — start, release from its wait, end — and replayed reps times;
 * writes to report, per step label, how early the first block started before the launch
 * before it ended, how long after that end the median block was released, and how long from
 * that release to its last block's end (us, means over the steps and replays). Errors:
 * UNSUPPORTED (the megakernel decodes), INVALID_ARG (reps < 1), NOMEM, BACKEND. */
qwenrt_status cuda_session_timeline(struct cuda_session *cs, int32_t id, int32_t pos, int32_t reps, char *report,
                                    size_t report_len, struct qwenrt_error *err);

/* Times reps decode steps of token id at position pos: through the megakernel with a stamp
 * after every phase, or (no megakernel) the decode program's launches one by one with events
 * between them (no graph, so launch gaps are included); writes the mean microseconds per
 * phase or step kind to report. Errors: BACKEND. */
qwenrt_status cuda_session_profile_decode(struct cuda_session *cs, int32_t id, int32_t pos,
                                          int32_t reps, char *report, size_t report_len,
                                          struct qwenrt_error *err);

/* Bytes of device memory the session uses (weights shared with other sessions counted in full). */
int64_t cuda_session_device_bytes(const struct cuda_session *cs);

#ifdef __cplusplus
}
#endif

#endif
