/*
 * megakernel.cu — the whole decode step (every layer, the LM head and the argmax) as one
 * persistent kernel; see megakernel.cuh for the idea and the interface. This file is the
 * kernel, its launch (mk_run) and profile; megakernel_build.cu builds the program it runs.
 *
 * Execution: one block of NT threads per multiprocessor, launched cooperatively (all blocks
 * resident). The kernel walks the phase list (copied to shared memory when it fits); in each
 * phase the blocks split the work (each block a contiguous slice of every GEMV's rows over its
 * warps, attention heads x key ranges and DeltaNet heads x state columns over blocks with the
 * last arrival merging, elementwise ops over all threads), then meet at a grid barrier (a
 * monotonic 64-bit arrival counter, release add / acquire polling at GPU scope). Activations
 * are read with ld.global.cg (L2, never a stale L1 line) because other blocks wrote them
 * before the barrier.
 *
 * Weights: each block streams its share of every GEMV (a contiguous row range per matrix)
 * through a ring of MK_STAGES shared-memory stages with cp.async.bulk copies completed on
 * mbarriers. Every block's chunk schedule is made once at build (mk_schedule_kernel) and
 * copied to shared memory with the phases when a launch starts; the warp that releases
 * a stage last refills it with the chunk MK_STAGES ahead (no block barrier per chunk), so the
 * copies of the next phases are in flight while the block waits at a barrier or runs attention.
 *
 * Rows: 16-bit rows with K = 1024 / 2048 / 3072 / 3584 (mk_gemv_regs), Q8_0 rows (mk_gemv_q8)
 * and Q4_K / Q6_K rows (mk_gemv_kq) keep x in registers for the whole phase, in the order each
 * lane walks its weights, and read the stage with ld.shared; other rows go through the generic
 * per-row dot products (x in shared memory). The ring state is copied into registers by those
 * functions: the struct itself lives in local memory.
 *
 * Status (docs/perf-log.md, session 5): correct on every fixture and synth test, including the
 * real widths; faster than the graph program for quantised weights (Qwen3-0.6B Q8_0 837 vs
 * 499 tok/s, Q4_K_M 883 vs 470), level with it or 1% slower for float weights (BF16 972-977
 * vs 976-981, Qwen3.5 881-883 vs 879-892). Since session 11 the graph program is ahead for
 * every weight type (its GEMVs load all they need at once, gemvq takes quantised rows), so
 * CUDA_MEGA_AUTO no longer picks the megakernel; CUDA_MEGA_ON still does. Ring: 3 stages of 64 KB
 * (4 x 48 KB, 6 x 32 KB, 8 x 24 KB were slower: every chunk costs a wait, a release and a
 * refill). cuda_session_profile_decode times every phase and every
 * block's barrier arrival. Where a GEMV phase's ~7.3 us go (BF16): barrier ~0.9, the last block
 * ~1.4 after the median one, x staging ~0.8 (132 blocks reading the same lines from L2), rows
 * and refills the rest; warps issue once every ~14 cycles (8 per multiprocessor). Tried and
 * reverted: every warp reading and normalising x itself (731 tok/s); BF16 rows on the tensor
 * cores (session 6: per-row bulk copies serialise, 717 tok/s). Fewer phases per layer
 * (session 6): the down product split over the blocks' rows of h inside the SwiGLU phase
 * (mk_down, cuda_options.mega_fuse_down) removes 28 of Qwen3's 141 phases but saves only
 * 31 us of 930 (970 -> 997 tok/s): the fused phase grows by most of what the removed one
 * cost, so the time is in each phase's chains (x from L2, waits, shuffles), not in a fixed
 * cost per barrier. Off by default (the additions into the residual land in varying order).
 *
 * Numerics follow the reference kernels (kernels_ref.c) as the per-op CUDA kernels do: f32
 * accumulation, RoPE angles in double (reduced to [-pi, pi], then sincosf), online softmax,
 * quantised weights dequantised with f32 activations (the matmul.<q>.exact form).
 */
#include "backend/cuda/megakernel_internal.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/quant_rows.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}


/* ------------------------------------------------------------------ device helpers */

__device__ __forceinline__ unsigned long long mk_ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Grid barrier: a monotonic arrival counter. Thread 0 of each block adds 1 with release
 * semantics (after __syncthreads, so the whole block's writes are ordered before it) and
 * waits with acquire loads until all nb blocks of this round arrived; *target is thread 0's
 * count of arrivals expected so far. */
__device__ __forceinline__ void mk_grid_sync(struct mk_sync *s, unsigned nb, unsigned long long *target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        *target += nb;
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&s->count) : "memory");
        while (mk_ld_acquire(&s->count) < *target) {
        }
    }
    __syncthreads();
}

/* ------------------------------------------------------------------ row dot products
 * Each returns the warp's dot product of one or two weight rows with xs (shared memory, f32)
 * in every lane. */

/* Two 16-bit floats packed in w, times x0 and x1, added to acc. No arrays and no address
 * taken: everything stays in registers (a local array here cost ~1 us per row through L1). */
/* The two 16-bit weights of a word as floats, the low half first. */
template <int DT>
__device__ __forceinline__ float2 mk_unpack2(uint32_t w)
{
    if (DT == QR_BF16)
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    return make_float2(__half2float(__ushort_as_half((unsigned short)(w & 0xffffu))),
                       __half2float(__ushort_as_half((unsigned short)(w >> 16))));
}

__device__ __forceinline__ float mk_fma2(uint32_t w, float x0, float x1, float acc, int32_t dt)
{
    float lo, hi;
    if (dt == QR_BF16) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
        hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    }
    return fmaf(hi, x1, fmaf(lo, x0, acc));
}

__device__ __forceinline__ void mk_acc8(float &acc, uint4 v, const float *x, int32_t dt)
{
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    acc = mk_fma2(v.x, a.x, a.y, acc, dt);
    acc = mk_fma2(v.y, a.z, a.w, acc, dt);
    acc = mk_fma2(v.z, b.x, b.y, acc, dt);
    acc = mk_fma2(v.w, b.z, b.w, acc, dt);
}

__device__ __forceinline__ void mk_acc4(float &acc, uint4 v, const float *x)
{
    float4 a = *(const float4 *)x;
    acc = fmaf(__uint_as_float(v.x), a.x, acc);
    acc = fmaf(__uint_as_float(v.y), a.y, acc);
    acc = fmaf(__uint_as_float(v.z), a.z, acc);
    acc = fmaf(__uint_as_float(v.w), a.w, acc);
}

/* F32/F16/BF16 rows (16-byte aligned, K a multiple of the chunk): R rows, all loads of a
 * round issued before any is used. */
template <int DT, int R>
__device__ __forceinline__ void mk_dot_float(const uint8_t *row0, const uint8_t *row1, const float *xs,
                                             int32_t K, float *out)
{
    const int32_t dt = DT;
    int lane = threadIdx.x & 31, epc = dt == QR_F32 ? 4 : 8, nch = K / epc;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int c0 = 0; c0 < nch; c0 += 32 * MK_U) {
        uint4 v[R][MK_U];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < MK_U; u++) {
                int c = c0 + u * 32 + lane;
                v[r][u] = c < nch ? ((const uint4 *)(r ? row1 : row0))[c] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < MK_U; u++) {
            int c = c0 + u * 32 + lane;
            if (c >= nch)
                break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (dt == QR_F32)
                    mk_acc4(acc[r], v[r][u], xs + c * 4);
                else
                    mk_acc8(acc[r], v[r][u], xs + c * 8, dt);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        out[r] = warp_sum(acc[r]);
}

/* Q8_0: 34-byte blocks of 32; lane l takes blocks l, l+32, ... (2-byte loads). */
__device__ __noinline__ float mk_dot_q8_0(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nb = K / 32;
    float acc = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const uint16_t *p = (const uint16_t *)(row + (int64_t)b * 34);
        uint16_t q[17];
#pragma unroll
        for (int i = 0; i < 17; i++)
            q[i] = p[i];
        const float *x = xs + b * 32;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s = fmaf((float)(int8_t)(q[1 + i] & 0xff), x[2 * i], s);
            s = fmaf((float)(int8_t)(q[1 + i] >> 8), x[2 * i + 1], s);
        }
        acc = fmaf(mk_f16(q[0]), s, acc);
    }
    return warp_sum(acc);
}

/* Q4_K: 144-byte super-blocks of 256; 8 lanes per super-block, lane (c, half) takes 16 bytes
 * of chunk c: 16 low nibbles (sub-block 2c) and 16 high nibbles (sub-block 2c+1). */
__device__ __noinline__ float mk_dot_q4_k(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nsb = K / 256, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
    float acc = 0.0f;
    for (int sb = lane >> 3; sb < nsb; sb += 4) {
        const uint8_t *b = row + (int64_t)sb * 144;
        uint4 hdr = *(const uint4 *)b;
        uint4 qv = *(const uint4 *)(b + 16 + 32 * c + 16 * half);
        const float *x0 = xs + sb * 256 + 64 * c + 16 * half;
        acc += mk_q4k_lane(hdr, qv, c, x0, x0 + 32);
    }
    return warp_sum(acc);
}

/* Q6_K: 210-byte super-blocks of 256; 16 lanes per super-block, lane (h, g) takes l in
 * [4g, 4g+4) of half h for all four quarters (16 elements). */
__device__ __noinline__ float mk_dot_q6_k(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nsb = K / 256, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
    float acc = 0.0f;
    for (int sb = lane >> 4; sb < nsb; sb += 2) {
        const uint8_t *b = row + (int64_t)sb * 210;
        const uint8_t *ql = b + 64 * h + 4 * g, *qh = b + 128 + 32 * h + 4 * g;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + g / 4);
        float d = mk_f16((uint16_t)(b[208] | (b[209] << 8)));
        uint8_t lo0[4], lo1[4], hb[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo0[i] = ql[i];
            lo1[i] = ql[32 + i];
            hb[i] = qh[i];
        }
        acc = mk_q6k_lane<32>(d, lo0, lo1, hb, q6k_sc_ptr{sc}, xs + sb * 256 + 128 * h + 4 * g, acc);
    }
    return warp_sum(acc);
}

/* Any dtype deq_elem knows, one element at a time (unaligned float rows). */
__device__ __noinline__ float mk_dot_any(const uint8_t *row, int32_t dt, const float *xs, int32_t K)
{
    float acc = 0.0f;
    for (int i = threadIdx.x & 31; i < K; i += 32)
        acc = fmaf(deq_elem(row, dt, i), xs[i], acc);
    return warp_sum(acc);
}

__device__ __forceinline__ bool mk_float_fast(const struct mk_seg &s, int32_t K)
{
    int epc = s.dtype == QR_F32 ? 4 : 8;
    return (s.dtype == QR_F32 || s.dtype == QR_F16 || s.dtype == QR_BF16) && K % epc == 0 &&
           s.row_bytes % 16 == 0 && ((uintptr_t)s.w & 15) == 0;
}

/* The dot product of one row (in shared memory) of segment s with xs. */
__device__ float mk_dot_row(const struct mk_seg &s, const uint8_t *row, const float *xs, int32_t K)
{
    switch (s.dtype) {
    case QR_Q8_0: return mk_dot_q8_0(row, xs, K);
    case QR_Q4_K: return ((uintptr_t)row & 15) == 0 ? mk_dot_q4_k(row, xs, K) : mk_dot_any(row, s.dtype, xs, K);
    case QR_Q6_K: return mk_dot_q6_k(row, xs, K);
    default: return mk_dot_any(row, s.dtype, xs, K);
    }
}

/* ------------------------------------------------------------------ phases */

/* xs = in (K floats), RMS-normalised with norm_w when given. */
__device__ void mk_stage_x(const float *in, int32_t K, const float *norm_w, float eps, float *xs,
                           float *red)
{
    /* MK_XPT loads per thread issued together (one L2 round trip per batch, not per element);
     * the norm weights are loaded alongside and kept in registers */
    float ss = 0.0f, wv[MK_XPT];
    int nt = blockDim.x;
    for (int base = 0; base < K; base += nt * MK_XPT) {
        float v[MK_XPT];
#pragma unroll
        for (int u = 0; u < MK_XPT; u++) {
            int i = base + u * nt + threadIdx.x;
            v[u] = i < K ? __ldcg(in + i) : 0.0f;
            wv[u] = norm_w && i < K ? __ldg(norm_w + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MK_XPT; u++) {
            int i = base + u * nt + threadIdx.x;
            if (i < K)
                xs[i] = v[u];
            ss += v[u] * v[u];
        }
    }
    if (norm_w) {
        ss = block_sum(ss, red);
        float scale = rsqrtf(ss / (float)K + eps);
        if (K <= nt * MK_XPT) {
#pragma unroll
            for (int u = 0; u < MK_XPT; u++) {
                int i = u * nt + threadIdx.x;
                if (i < K)
                    xs[i] = xs[i] * scale * wv[u];
            }
        } else {
            for (int i = threadIdx.x; i < K; i += nt)
                xs[i] = xs[i] * scale * __ldg(norm_w + i);
        }
    }
    __syncthreads();
}

/* ---- the weight ring ----
 * Every block streams its share of every GEMV's weights (a contiguous row range per matrix:
 * rows [N b / nb, N (b+1) / nb)) through MK_STAGES shared-memory stages with 1-D bulk copies
 * (cp.async.bulk, completion on an mbarrier per stage). Chunks are numbered in execution order
 * across phases and tokens; thread 0 keeps MK_STAGES chunks in flight, refilling a stage as
 * soon as the block has consumed it, so the copies for the next phases run during barriers,
 * attention and x staging. The producer walks a compact table of the GEMVs (struct mk_gdesc in
 * megakernel_internal.cuh, copied to shared memory at start: no global-memory round trip per
 * chunk); the consumers walk the same chunk order for the phase they run. */

/* Block b's row range of an N-row matrix. */
__device__ __forceinline__ void mk_rows_of_block(int64_t N, int64_t *lo, int64_t *hi)
{
    /* 32-bit: N * nb < 2^32 for every matrix here (the builder checks) */
    uint32_t n = (uint32_t)N;
    *lo = n * blockIdx.x / gridDim.x;
    *hi = n * (blockIdx.x + 1) / gridDim.x;
}

/* Thread 0 at start: this block's chunks of one token in execution order (sched) and where
 * each GEMV's chunks begin (gfirst[g], gfirst[n_g] = the count). The host sized sched for the
 * block with the most chunks (mk_table). */
__device__ void mk_schedule(const struct mk_gdesc *gt, int32_t n_g, struct mk_chunk *sched, int32_t *gfirst)
{
    int32_t k = 0;
    for (int32_t g = 0; g < n_g; g++) {
        gfirst[g] = k;
        for (int32_t seg = 0; seg < gt[g].nseg; seg++) {
            int64_t lo, hi;
            mk_rows_of_block(gt[g].N[seg], &lo, &hi);
            for (int64_t r0 = lo; r0 < hi; r0 += gt[g].rpc, k++) {
                sched[k].r0 = (int32_t)r0;
                sched[k].n = (int32_t)(hi - r0 < gt[g].rpc ? hi - r0 : gt[g].rpc);
                sched[k].g = (int16_t)g, sched[k].seg = (int16_t)seg;
            }
        }
    }
    gfirst[n_g] = k;
}

/* Every block's schedule, once at build (grid = the megakernel's, one thread per block:
 * mk_rows_of_block splits by blockIdx / gridDim exactly as the megakernel will). */
__global__ void mk_schedule_kernel(const struct mk_gdesc *gt, int32_t n_g, struct mk_chunk *sched,
                                   int32_t *gfirst, int32_t max_chunks)
{
    mk_schedule(gt, n_g, sched + (int64_t)blockIdx.x * max_chunks, gfirst + (int64_t)blockIdx.x * (n_g + 1));
}

/* n 32-bit words from global memory to shared memory by the whole block, eight loads in
 * flight per thread (a copy loop with one load per store waits a round trip per word). */
__device__ __forceinline__ void mk_copy_words(uint32_t *dst, const uint32_t *src, int32_t n)
{
    const int B = 8;
    for (int32_t i0 = threadIdx.x; i0 < n; i0 += B * blockDim.x) {
        uint32_t v[B];
#pragma unroll
        for (int u = 0; u < B; u++) {
            int32_t i = i0 + u * blockDim.x;
            v[u] = i < n ? __ldg(src + i) : 0u;
        }
#pragma unroll
        for (int u = 0; u < B; u++) {
            int32_t i = i0 + u * blockDim.x;
            if (i < n)
                dst[i] = v[u];
        }
    }
}

/* The ring needs sm_90 (bulk copies, mbarrier transaction counts); mk_build refuses older
 * devices, and the PTX built for them traps if it were ever reached. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MK_SM90_ONLY(asm_stmt) __trap()
#else
#define MK_SM90_ONLY(asm_stmt) asm_stmt
#endif

__device__ __forceinline__ void mk_mbar_init(uint64_t *bar)
{
    mbar_init<1>(mk_smem_addr(bar));
}

__device__ __forceinline__ void mk_mbar_wait_at(uint32_t a, uint32_t parity)
{
    mbar_wait_parity(a, parity);
}

__device__ __forceinline__ void mk_mbar_wait(uint64_t *bar, uint32_t parity)
{
    mk_mbar_wait_at(mk_smem_addr(bar), parity);
}

/* The copies of a chunk (two for SwiGLU): 16-byte aligned source ranges and where the rows
 * start in the stage. */
struct mk_copy {
    const uint8_t *src[2];
    uint32_t size[2], off[2];
    int n;
};

__device__ void mk_chunk_copy(const struct mk_gdesc &D, const struct mk_chunk &ch, struct mk_copy &cp)
{
    cp.n = D.swiglu ? 2 : 1;
    uint32_t dst = 0;
    cp.src[1] = NULL, cp.size[1] = 0, cp.off[1] = 0;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (k >= cp.n)
            break;
        int s = k ? 1 : ch.seg;
        uintptr_t a = (uintptr_t)(D.w[s] + (int64_t)ch.r0 * D.row_bytes[s]), e = a + (uintptr_t)ch.n * D.row_bytes[s];
        uintptr_t al = a & ~(uintptr_t)15, el = (e + 15) & ~(uintptr_t)15;
        cp.src[k] = (const uint8_t *)al;
        cp.size[k] = (uint32_t)(el - al);
        cp.off[k] = dst + (uint32_t)(a - al);
        dst += cp.size[k];
    }
}

/* Thread 0: starts the copy of chunk ch into stage (completion on bar). */
__device__ void mk_issue(const struct mk_gdesc *gt, const struct mk_chunk &ch, uint8_t *stage,
                         uint64_t *bar)
{
    struct mk_copy cp;
    mk_chunk_copy(gt[ch.g], ch, cp);
    uint32_t b = mk_smem_addr(bar), total = cp.size[0] + (cp.n > 1 ? cp.size[1] : 0), dst = 0;
    if (total == 0)
        return; /* never: a chunk has at least one row */
    /* no proxy fence: the stage was only read by the generic proxy, and those reads are
     * ordered before this copy by the block barrier after the chunk (write-after-read) */
    MK_SM90_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(total) : "memory"));
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (k >= cp.n)
            break;
        MK_SM90_ONLY(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                                  ::"r"(mk_smem_addr(stage + dst)), "l"(cp.src[k]), "r"(cp.size[k]), "r"(b)
                                  : "memory"));
        dst += cp.size[k];
    }
}

struct mk_ring {
    unsigned long long *prof; /* block 0 thread 0 when profiling: [3] ns of the running phase */
    uint8_t *base;          /* MK_STAGES stages of stage_bytes */
    uint64_t *bar;          /* MK_STAGES "full" mbarriers (the copy landed) */
    unsigned *freed;        /* MK_STAGES counters of warps done with a stage (monotonic) */
    const struct mk_gdesc *gt; /* shared-memory copy of the GEMV table */
    const struct mk_chunk *sched; /* this block's chunks of one token */
    const int32_t *gfirst;  /* [n_g + 1] first chunk of each GEMV in sched */
    int32_t n_g, n_tok;
    int64_t stage_bytes;
    uint32_t next;          /* chunks consumed so far (every thread counts them) */
};

/* Starts the copy of chunk c (counted over all tokens) into its stage, if there is one.
 * Inlined into a caller that keeps its copy of the ring in registers: a ring in local memory
 * cost a dependent local load (often an L1 miss: shared memory leaves L1 ~30 KB) per field. */
__device__ __forceinline__ void mk_refill(const struct mk_ring &rg, uint32_t c)
{
    uint32_t nct = (uint32_t)rg.gfirst[rg.n_g];
    if (nct == 0 || c >= nct * (uint32_t)rg.n_tok)
        return;
    uint32_t st = c % MK_STAGES;
    mk_issue(rg.gt, rg.sched[c % nct], rg.base + st * rg.stage_bytes, &rg.bar[st]);
}

/* Chunk c is ready in its stage. */
__device__ __forceinline__ const uint8_t *mk_acquire(const struct mk_ring &rg, uint32_t c)
{
    uint32_t st = c % MK_STAGES;
    unsigned long long t1 = rg.prof ? globaltimer_ns() : 0;
    mk_mbar_wait(&rg.bar[st], (c / MK_STAGES) & 1);
    if (rg.prof)
        atomicAdd(&rg.prof[1], globaltimer_ns() - t1);
    return rg.base + st * rg.stage_bytes;
}

/* This warp is done with chunk c's stage; the last warp of the block to say so refills the
 * stage with chunk c + MK_STAGES. No block barrier: a warp that finishes its rows moves on to
 * the next chunk while the others still read theirs. The warp's shared-memory reads of the
 * stage are complete (their values went through the shuffles before this point), so the bulk
 * copy that overwrites it cannot overtake them. */
__device__ __forceinline__ void mk_release(const struct mk_ring &rg, uint32_t c)
{
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
        unsigned nw = blockDim.x >> 5;
        unsigned old = atomicAdd(&rg.freed[c % MK_STAGES], 1u);
        if ((old + 1) % nw == 0) {
            unsigned long long t2 = rg.prof ? globaltimer_ns() : 0;
            mk_refill(rg, c + MK_STAGES);
            if (rg.prof)
                atomicAdd(&rg.prof[3], globaltimer_ns() - t2);
        }
    }
}

/* y = v, or y += v (GEMV_ACCUM: the residual add) as a reduction in L2: no load of the old
 * value on the warp's path (it cost an L2 round trip per row). One warp owns each row, so
 * the single add rounds as old + v would: the result does not depend on timing. */
__device__ __forceinline__ void mk_store_row(float *y, float v, bool accum)
{
    if (accum)
        atomicAdd(y, v);
    else
        *y = v;
}

__device__ __forceinline__ unsigned long long mk_argmax_key(float v, int64_t i)
{
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffull - (unsigned long long)i);
}

/* The rows of one chunk of 16-bit or f32 rows, the dtype fixed at compile time so that the
 * loop a model runs is a few hundred instructions (the kernel's code is large; a loop with
 * every dtype's branch inside missed the instruction cache on every phase). */
template <int DT, bool SWIGLU>
__device__ __noinline__ void mk_rows_float(const struct mk_phase &P, const struct mk_chunk &ch,
                                           const uint8_t *base0, const uint8_t *base1,
                                           const float *xs, unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const struct mk_seg &s = P.seg[ch.seg];
    int64_t rb0 = s.row_bytes, rb1 = P.seg[1].row_bytes;
    for (int32_t i = warp; i < ch.n; i += nw) {
        int64_t r = ch.r0 + i;
        float v[2];
        if (SWIGLU) {
            mk_dot_float<DT, 2>(base0 + i * rb0, base1 + i * rb1, xs, P.K, v);
            if (lane == 0)
                s.y[r] = silu_f(v[0]) * v[1];
            continue;
        }
        mk_dot_float<DT, 1>(base0 + i * rb0, base0, xs, P.K, v);
        if (lane == 0) {
            mk_store_row(s.y + r, v[0], P.mode == GEMV_ACCUM);
            if (P.argmax && v[0] == v[0]) {
                unsigned long long key = mk_argmax_key(v[0], r);
                *best = key > *best ? key : *best;
            }
        }
    }
}

/* Quantised (or unaligned) rows: one dot product per row through mk_dot_row. */
__device__ __noinline__ void mk_rows_any(const struct mk_phase &P, const struct mk_chunk &ch,
                                         const uint8_t *base0, const uint8_t *base1,
                                         const float *xs, unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const struct mk_seg &s = P.seg[ch.seg];
    for (int32_t i = warp; i < ch.n; i += nw) {
        int64_t r = ch.r0 + i;
        const uint8_t *row = base0 + (int64_t)i * s.row_bytes;
        if (P.mode == GEMV_SWIGLU) {
            const struct mk_seg &u = P.seg[1];
            float g = mk_dot_row(s, row, xs, P.K);
            float up = mk_dot_row(u, base1 + (int64_t)i * u.row_bytes, xs, P.K);
            if (lane == 0)
                s.y[r] = silu_f(g) * up;
            continue;
        }
        float v = mk_dot_row(s, row, xs, P.K);
        if (lane == 0) {
            mk_store_row(s.y + r, v, P.mode == GEMV_ACCUM);
            if (P.argmax && v == v) {
                unsigned long long key = mk_argmax_key(v, r);
                *best = key > *best ? key : *best;
            }
        }
    }
}

/* Computes the rows of one chunk (in stage) over the block's warps and stores them. */
__device__ void mk_gemv_chunk(const struct mk_phase &P, const struct mk_gdesc &D,
                              const struct mk_chunk &ch, const uint8_t *stage, const float *xs,
                              unsigned long long *best)
{
    struct mk_copy cp;
    mk_chunk_copy(D, ch, cp);
    const struct mk_seg &s = P.seg[ch.seg];
    const uint8_t *b0 = stage + cp.off[0], *b1 = stage + cp.off[1];
    bool sw = P.mode == GEMV_SWIGLU;
    bool fast = mk_float_fast(s, P.K) && (!sw || (mk_float_fast(P.seg[1], P.K) && P.seg[1].dtype == s.dtype));
    if (!fast) {
        mk_rows_any(P, ch, b0, b1, xs, best);
        return;
    }
    switch (s.dtype) {
    case QR_BF16:
        sw ? mk_rows_float<QR_BF16, true>(P, ch, b0, b1, xs, best) : mk_rows_float<QR_BF16, false>(P, ch, b0, b1, xs, best);
        break;
    case QR_F16:
        sw ? mk_rows_float<QR_F16, true>(P, ch, b0, b1, xs, best) : mk_rows_float<QR_F16, false>(P, ch, b0, b1, xs, best);
        break;
    default:
        sw ? mk_rows_float<QR_F32, true>(P, ch, b0, b1, xs, best) : mk_rows_float<QR_F32, false>(P, ch, b0, b1, xs, best);
        break;
    }
}

#include "backend/cuda/megakernel_rows.cuh"

/* Any other GEMV phase: chunk by chunk through mk_gemv_chunk (x in shared memory). */
__device__ __noinline__ void mk_gemv_chunks(const struct mk_phase &P, struct mk_ring &rg, const float *xs,
                                            unsigned long long *best)
{
    const struct mk_gdesc &D = rg.gt[P.gidx];
    for (int32_t k = rg.gfirst[P.gidx]; k < rg.gfirst[P.gidx + 1]; k++, rg.next++) {
        const struct mk_chunk ch = rg.sched[k];
        mk_gemv_chunk(P, D, ch, mk_acquire(rg, rg.next), xs, best);
        mk_release(rg, rg.next);
    }
}

/* The down product fused into its SwiGLU phase: out[i] += Σ_r Wd[i][r] h[r] over this block's
 * rows r of h (the same range as its gate/up rows: written by its own warps just before), from
 * the transposed rows Wdᵀ[r] in the ring. Thread t owns outputs 4t.., 4t + 4 NT.., ...; each
 * adds its partial sums to the residual with one 4-wide reduction in L2 (the order of the
 * blocks' additions varies: f32 rounding, not a fixed order). Saves a phase (a grid barrier
 * and an x staging) per layer. */
template <int NT, int DT>
__device__ __noinline__ void mk_down(const struct mk_phase &P, struct mk_ring &rg, float *hs)
{
    const struct mk_seg &d = P.dseg;
    int64_t lo, hi;
    mk_rows_of_block(d.N, &lo, &hi);
    __syncthreads(); /* the block's h rows are in global memory (its warps wrote them) */
    for (int i = threadIdx.x; i < hi - lo; i += NT)
        hs[i] = __ldcg(P.seg[0].y + lo + i);
    __syncthreads();
    const int32_t n_out = (int32_t)(d.row_bytes / 2);
    float acc[4][4] = {};
    const struct mk_ring ring = rg; /* registers, as in mk_gemv_regs */
    const uint32_t base = mk_smem_addr(ring.base), bars = mk_smem_addr(ring.bar);
    const int32_t k0 = ring.gfirst[P.down_g], k1 = ring.gfirst[P.down_g + 1];
    uint32_t next = ring.next;
    for (int32_t k = k0; k < k1; k++, next++) {
        const struct mk_chunk ch = ring.sched[k];
        uint32_t st = next % MK_STAGES;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        const uint32_t b0 = base + st * (uint32_t)ring.stage_bytes;
        for (int32_t j = 0; j < ch.n; j++) {
            float h = hs[ch.r0 - lo + j];
            uint32_t row = b0 + (uint32_t)j * (uint32_t)d.row_bytes;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                int32_t c = 4 * (threadIdx.x + NT * g);
                if (c < n_out) {
                    uint32_t w0, w1;
                    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w0), "=r"(w1) : "r"(row + 2 * c));
                    float2 a = mk_unpack2<DT>(w0), b = mk_unpack2<DT>(w1);
                    acc[g][0] = fmaf(a.x, h, acc[g][0]), acc[g][1] = fmaf(a.y, h, acc[g][1]);
                    acc[g][2] = fmaf(b.x, h, acc[g][2]), acc[g][3] = fmaf(b.y, h, acc[g][3]);
                }
            }
        }
        mk_release(ring, next);
    }
    rg.next = next;
    if (hi <= lo)
        return;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        int32_t c = 4 * (threadIdx.x + NT * g);
        if (c < n_out)
            asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(d.y + c),
                         "f"(acc[g][0]), "f"(acc[g][1]), "f"(acc[g][2]), "f"(acc[g][3])
                         : "memory");
    }
}

/* y = [norm](x) · Wᵀ: the block's chunks of GEMV phase P (ordinal P.gidx), in the schedule's
 * order. */
template <int NT>
__device__ void mk_gemv(const struct mk_params &prm, const struct mk_phase &P, struct mk_ring &rg,
                        float *xs, float *red, int parity)
{
    int kc = mk_regs_kc(P);
    unsigned long long t0 = rg.prof ? globaltimer_ns() : 0;
    mk_stage_x(P.in, P.K, P.vec, P.eps, xs, red);
    unsigned long long t1 = rg.prof ? globaltimer_ns() : 0;
    if (rg.prof && threadIdx.x == 0)
        rg.prof[0] += t1 - t0;
    unsigned long long best = 0;
    bool bf = P.seg[0].dtype == QR_BF16, sw = P.mode == GEMV_SWIGLU;
    switch (kc) {
    case 4:
        if (sw)
            bf ? mk_gemv_regs<NT, QR_BF16, 4, true>(P, rg, xs, &best) : mk_gemv_regs<NT, QR_F16, 4, true>(P, rg, xs, &best);
        else
            bf ? mk_gemv_regs<NT, QR_BF16, 4, false>(P, rg, xs, &best) : mk_gemv_regs<NT, QR_F16, 4, false>(P, rg, xs, &best);
        break;
    case 8:
        bf ? mk_gemv_regs<NT, QR_BF16, 8, false>(P, rg, xs, &best) : mk_gemv_regs<NT, QR_F16, 8, false>(P, rg, xs, &best);
        break;
    case 12:
        bf ? mk_gemv_regs<NT, QR_BF16, 12, false>(P, rg, xs, &best) : mk_gemv_regs<NT, QR_F16, 12, false>(P, rg, xs, &best);
        break;
    case 14:
        bf ? mk_gemv_regs<NT, QR_BF16, 14, false>(P, rg, xs, &best) : mk_gemv_regs<NT, QR_F16, 14, false>(P, rg, xs, &best);
        break;
    default:
        switch (mk_q8_kb(P)) {
        case 1:
            sw ? mk_gemv_q8<NT, 1, true>(P, rg, xs, &best) : mk_gemv_q8<NT, 1, false>(P, rg, xs, &best);
            break;
        case 2: mk_gemv_q8<NT, 2, false>(P, rg, xs, &best); break;
        case 3: mk_gemv_q8<NT, 3, false>(P, rg, xs, &best); break;
        default:
            switch (mk_kq_kind(P)) {
            case 4 + 1: mk_gemv_kq<NT, 1, true, false>(P, rg, xs, &best); break;
            case 4 + 2: mk_gemv_kq<NT, 1, false, true>(P, rg, xs, &best); break;
            case 4 + 3: mk_gemv_kq<NT, 1, true, true>(P, rg, xs, &best); break;
            case 8 + 1: mk_gemv_kq<NT, 2, true, false>(P, rg, xs, &best); break;
            case 8 + 2: mk_gemv_kq<NT, 2, false, true>(P, rg, xs, &best); break;
            case 12 + 1: mk_gemv_kq<NT, 3, true, false>(P, rg, xs, &best); break;
            case 12 + 2: mk_gemv_kq<NT, 3, false, true>(P, rg, xs, &best); break;
            default: mk_gemv_chunks(P, rg, xs, &best); break;
            }
            break;
        }
        break;
    }
    if (P.has_down) /* hs after x (mk_table reserved K + 64 floats) */
        P.dseg.dtype == QR_BF16 ? mk_down<NT, QR_BF16>(P, rg, xs + P.K) : mk_down<NT, QR_F16>(P, rg, xs + P.K);
    if (rg.prof)
        atomicAdd(&rg.prof[4], globaltimer_ns() - t1);
    if (P.argmax && (threadIdx.x & 31) == 0 && best)
        atomicMax(&prm.sync->key[parity], best);
}

__device__ __noinline__ void mk_embed(const struct mk_phase &P, int32_t id)
{
    const uint8_t *row = P.w + (int64_t)id * P.row_bytes;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P.width; i += gridDim.x * blockDim.x)
        P.out[i] = deq_elem(row, P.dtype, i);
}

__device__ __noinline__ void mk_rmsnorm(const struct mk_phase &P, float *red)
{
    int groups = P.width / P.group;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const float *x = P.in + (int64_t)g * P.group;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < P.group; i += blockDim.x) {
            float v = __ldcg(x + i);
            ss += v * v;
        }
        ss = block_sum(ss, red);
        float scale = rsqrtf(ss / (float)P.group + P.eps);
        for (int i = threadIdx.x; i < P.group; i += blockDim.x)
            P.out[(int64_t)g * P.group + i] = __ldcg(x + i) * scale * __ldg(P.vec + i);
        __syncthreads();
    }
}

__device__ __noinline__ void mk_elementwise(const struct mk_phase &P)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P.width; i += gridDim.x * blockDim.x) {
        float x = __ldcg(P.in + i), y = __ldcg(P.out + i);
        P.out[i] = P.kind == MK_ADD ? y + x : silu_f(y) * x;
    }
}

/* x (hd floats in shared memory, this thread's element d) after RoPE at pos. */
/* cos and sin of RoPE angle pos * inv_freq[i] for this thread's element d (< n_rot), the
 * frequencies computed on the host in double as the reference does. */
__device__ __forceinline__ float2 mk_rope_cs(const double *inv_freq, int d, int32_t n_rot, int32_t pos)
{
    int half = n_rot / 2, i = d < half ? d : d - half;
    /* the angle in double as the reference, reduced to [-pi, pi] there, then sincosf (as
     * rope_table_kernel): a double sincos was ~1 us of the phase's critical path */
    double ang = (double)pos * inv_freq[i];
    ang -= rint(ang * 0.15915494309189535) * 6.283185307179586;
    float sn, cs;
    sincosf((float)ang, &sn, &cs);
    return make_float2(cs, sn);
}

/* x (hd floats in shared memory, element d) after RoPE with cs = (cos, sin). */
__device__ __forceinline__ float mk_rope(const float *x, int d, int32_t n_rot, float2 cs)
{
    if (d >= n_rot)
        return x[d];
    int half = n_rot / 2;
    return d < half ? x[d] * cs.x - x[d + half] * cs.y : x[d] * cs.x + x[d - half] * cs.y;
}

/* The last of `parts` blocks to call this for item i (counter cnt[i]) gets true, after which
 * the others' global writes are visible to it; it resets the counter. */
__device__ bool mk_last_arrival(unsigned *cnt, int parts, int *flag_smem)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        bool last = atomicAdd(cnt, 1u) == (unsigned)parts - 1;
        if (last)
            *cnt = 0;
        *flag_smem = last;
    }
    __syncthreads();
    bool last = *flag_smem != 0;
    if (last)
        __threadfence();
    return last;
}

/* A lane's EPL floats of a K or V row: from the cache in L2 (ld.global.cg, 16- or 8-byte
 * words: the row offset and lane * EPL keep them aligned) or from shared memory (the current
 * position, whose cache write may not be visible yet). */
template <int EPL>
__device__ __forceinline__ void mk_load_lane(float *dst, const float *src, bool cached)
{
    if (!cached) {
#pragma unroll
        for (int e = 0; e < EPL; e++)
            dst[e] = src[e];
    } else if (EPL % 4 == 0) {
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            float4 t = __ldcg((const float4 *)(src + e));
            dst[e] = t.x, dst[e + 1] = t.y, dst[e + 2] = t.z, dst[e + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            float2 t = __ldcg((const float2 *)(src + e));
            dst[e] = t.x, dst[e + 1] = t.y;
        }
    }
}

/* Split-K attention (flash decoding): query head h, positions [lo, hi) of 0..pos; q/k norm +
 * RoPE (and the cache write by split 0 of the group's first head); the block's partial
 * (max, sum, unnormalised output) goes to part, and the last split of the head merges all
 * of them (+ output gate). */
template <int EPL>
__device__ __noinline__ void mk_attn_head(const struct mk_phase &P, int h, int sp, int S, int32_t pos, float *sm,
                             float *red, float *part, unsigned *cnt)
{
    /* positions in flight per warp: MK_ATT_U, half that for head size 256 (registers) */
    const int hd = 32 * EPL, W = blockDim.x >> 5, U = EPL >= 8 ? MK_ATT_U / 2 : MK_ATT_U;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int grp = P.n_head / P.n_head_kv, g = h / grp;
    float *qs = sm, *ks = sm + hd, *vs = sm + 2 * hd, *accs = sm + 3 * hd;
    float *ms = accs + W * hd, *ls = ms + W, *tmp = ls + W;
    /* every global load of the phase's prologue at once (q, k, v, both norm weights, the
     * gate, the RoPE frequency): one L2 round trip, not one per step */
    bool on = tid < hd;
    float qv = on ? __ldcg(P.in + (int64_t)h * P.q_stride + tid) : 0.0f;
    float kv = on ? __ldcg(P.in2 + (int64_t)g * hd + tid) : 0.0f;
    float vv0 = on ? __ldcg(P.in3 + (int64_t)g * hd + tid) : 0.0f;
    float wq = on ? __ldg(P.vec + tid) : 0.0f, wk = on ? __ldg(P.vec2 + tid) : 0.0f;
    float gv = on && P.gate ? __ldcg(P.in + (int64_t)h * P.q_stride + hd + tid) : 0.0f;
    float2 cs = on && tid < P.n_rot ? mk_rope_cs(P.inv_freq, tid, P.n_rot, pos) : make_float2(1.0f, 0.0f);
    float sq = block_sum(qv * qv, red), sk = block_sum(kv * kv, red);
    if (on) {
        qs[tid] = qv * rsqrtf(sq / (float)hd + P.eps) * wq;
        tmp[tid] = kv * rsqrtf(sk / (float)hd + P.eps) * wk;
    }
    __syncthreads();
    float qr = 0.0f, kr = 0.0f;
    if (on) {
        qr = mk_rope(qs, tid, P.n_rot, cs);
        kr = mk_rope(tmp, tid, P.n_rot, cs);
    }
    __syncthreads();
    if (on) {
        float v = vv0;
        qs[tid] = qr, ks[tid] = kr, vs[tid] = v;
        if (h % grp == 0 && sp == 0) {
            int64_t off = (int64_t)pos * P.kvw + (int64_t)g * hd + tid;
            P.kc[off] = kr;
            P.vc[off] = v;
        }
    }
    __syncthreads();
    float q[EPL], acc[EPL], scale = rsqrtf((float)hd);
#pragma unroll
    for (int e = 0; e < EPL; e++)
        q[e] = qs[lane * EPL + e] * scale, acc[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const float *kb = P.kc + (int64_t)g * hd + lane * EPL, *vb = P.vc + (int64_t)g * hd + lane * EPL;
    int32_t lo = (int32_t)((int64_t)(pos + 1) * sp / S), hi = (int32_t)((int64_t)(pos + 1) * (sp + 1) / S);
    for (int p0 = lo + warp; p0 < hi; p0 += W * U) {
        float kk[U][EPL], vv[U][EPL], dot[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + u * W;
            const float *kp = p < pos ? kb + (int64_t)p * P.kvw : ks + lane * EPL;
            const float *vp = p < pos ? vb + (int64_t)p * P.kvw : vs + lane * EPL;
            mk_load_lane<EPL>(kk[u], kp, p < pos);
            mk_load_lane<EPL>(vv[u], vp, p < pos);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                d = fmaf(q[e], kk[u][e], d);
            dot[u] = warp_sum(d);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (p0 + u * W >= hi)
                break;
            float m_new = fmaxf(m, dot[u]), corr = __expf(m - m_new), pw = __expf(dot[u] - m_new);
            l = l * corr + pw;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                acc[e] = acc[e] * corr + pw * vv[u][e];
            m = m_new;
        }
    }
    if (lane == 0)
        ms[warp] = m, ls[warp] = l;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        accs[warp * hd + lane * EPL + e] = acc[e];
    __syncthreads();
    float M = -INFINITY, L = 0.0f, o = 0.0f;
    for (int w = 0; w < W; w++)
        M = fmaxf(M, ms[w]);
    for (int w = 0; w < W; w++) {
        float f = ms[w] == -INFINITY ? 0.0f : __expf(ms[w] - M);
        L += ls[w] * f;
        if (tid < hd)
            o += accs[w * hd + tid] * f;
    }
    if (S > 1) {
        float *mine = part + ((int64_t)h * S + sp) * (hd + 2);
        if (tid < hd)
            mine[2 + tid] = o;
        if (tid == 0)
            mine[0] = M, mine[1] = L;
        if (!mk_last_arrival(cnt + h, S, (int *)(tmp + hd)))
            return;
        float M2 = -INFINITY;
        for (int k = 0; k < S; k++)
            M2 = fmaxf(M2, __ldcg(part + ((int64_t)h * S + k) * (hd + 2)));
        L = 0.0f, o = 0.0f;
        for (int k = 0; k < S; k++) {
            const float *pk = part + ((int64_t)h * S + k) * (hd + 2);
            float mk = __ldcg(pk), f = mk == -INFINITY ? 0.0f : __expf(mk - M2);
            L += __ldcg(pk + 1) * f;
            if (tid < hd)
                o += __ldcg(pk + 2 + tid) * f;
        }
    }
    if (tid < hd) {
        o /= L;
        if (P.gate)
            o *= sigmoid_f(gv);
        P.out[(int64_t)h * hd + tid] = o;
    }
    __syncthreads();
}

/* Splits per head: the whole grid busy, at most MK_ATTN_SPLITS (the partials' buffer). */
__device__ __forceinline__ int mk_splits(int items)
{
    int S = (int)gridDim.x / items;
    return S < 1 ? 1 : S > MK_ATTN_SPLITS ? MK_ATTN_SPLITS : S;
}

__device__ __noinline__ void mk_attention(const struct mk_phase &P, int32_t pos, float *sm, float *red,
                             float *part, unsigned *cnt)
{
    /* splits only when each has ~64 positions or more: below that the merge (a fence, an
     * atomic and a second pass over L2) costs more than walking the positions (one round of
     * loads covers 8 warps x 4 positions) */
    int S = mk_splits(P.n_head), want = (pos + 64) / 64;
    S = want < S ? want : S;
    for (int it = blockIdx.x; it < P.n_head * S; it += gridDim.x) {
        int h = it / S, sp = it % S;
        if (P.hd == 64)
            mk_attn_head<2>(P, h, sp, S, pos, sm, red, part, cnt);
        else if (P.hd == 128)
            mk_attn_head<4>(P, h, sp, S, pos, sm, red, part, cnt);
        else
            mk_attn_head<8>(P, h, sp, S, pos, sm, red, part, cnt);
    }
}

/* Causal depthwise conv of one token over the conv state, SiLU; one thread per channel. */
__device__ __noinline__ void mk_gdn_conv(const struct mk_phase &P)
{
    int R = P.conv_k - 1, C = P.width;
    for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < C; ch += gridDim.x * blockDim.x) {
        const float *tap = P.vec + (int64_t)ch * P.conv_k;
        float in = __ldcg(P.out + ch), acc = __ldg(tap + R) * in;
        float prev = __ldcg(P.state + ch);
        for (int j = 0; j < R; j++) {
            acc = fmaf(__ldg(tap + j), prev, acc);
            float next = j + 1 < R ? __ldcg(P.state + (int64_t)(j + 1) * C + ch) : in;
            P.state[(int64_t)j * C + ch] = next;
            prev = next;
        }
        P.out[ch] = silu_f(acc);
    }
}

/* Delta rule for value head j, state columns [c_lo, c_hi) (one of S splits of the head):
 * thread (c, sub) owns column c at rows sub, sub+tpc, ...; the state is read twice from L2
 * (S^T k, then the update and S^T q). q and k are normalised by every split. With the gated
 * RMSNorm fused, the last split of the head normalises the head's whole output. */
__device__ __noinline__ void mk_gdn_head(const struct mk_phase &P, int j, int sp, int S, float *sm, float *red,
                            unsigned *cnt)
{
    int dk = P.dk, dv = P.dv, tid = threadIdx.x, nt = blockDim.x;
    int kh = P.tiled ? j % P.Hk : j / (P.Hv / P.Hk);
    int cps = (dv + S - 1) / S, c_lo = sp * cps, c_hi = c_lo + cps < dv ? c_lo + cps : dv;
    float *qs = sm, *ks = sm + dk, *os = sm + 2 * dk;
    const float *qsrc = P.in + (int64_t)kh * dk, *ksrc = P.in + (int64_t)P.Hk * dk + (int64_t)kh * dk;
    int ncol = c_hi - c_lo, tpc = 1;
    while (tpc < 32 && tpc * 2 * ncol <= nt)
        tpc *= 2;
    int cols = nt / tpc, sub = tid % tpc;
    float *S_ = P.state + (int64_t)j * dk * dv;
    const float *v = P.in + (int64_t)2 * P.Hk * dk + (int64_t)j * dv;
    float *out = P.out + (int64_t)j * dv;
    /* When one pass covers the columns and a thread's rows fit in MK_GDN_R registers, the
     * state slice is loaded once, up front with the other loads (its update needs it again
     * after S^T k: a second L2 round trip before). */
    bool reg = cols >= ncol && dk <= MK_GDN_R * tpc;
    int c = c_lo + tid / tpc;
    bool on1 = reg && c < c_hi;
    float sv[MK_GDN_R];
#pragma unroll
    for (int r = 0; r < MK_GDN_R; r++)
        sv[r] = on1 && sub + r * tpc < dk ? __ldcg(S_ + (int64_t)(sub + r * tpc) * dv + c) : 0.0f;
    float vc = on1 ? __ldcg(v + c) : 0.0f;
    float b_in = __ldcg(P.in2 + j), a_in = __ldcg(P.in3 + j), dt_b = __ldg(P.vec2 + j), ssm_a = __ldg(P.vec3 + j);
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < dk; i += nt) {
        float a = __ldcg(qsrc + i), b = __ldcg(ksrc + i);
        qs[i] = a, ks[i] = b;
        sq += a * a, sk += b * b;
    }
    sq = block_sum(sq, red);
    sk = block_sum(sk, red);
    float rq = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), rk = rsqrtf(sk + 1e-6f);
    for (int i = tid; i < dk; i += nt)
        qs[i] *= rq, ks[i] *= rk;
    __syncthreads();
    float beta = sigmoid_f(b_in);
    float decay = expf(ssm_a * softplus_f(a_in + dt_b));
    if (reg) {
        float mpart = 0.0f;
#pragma unroll
        for (int r = 0; r < MK_GDN_R; r++)
            if (sub + r * tpc < dk)
                mpart = fmaf(sv[r], ks[sub + r * tpc], mpart);
        for (int o = 1; o < tpc; o <<= 1)
            mpart += __shfl_xor_sync(0xffffffffu, mpart, o);
        float delta = on1 ? beta * (vc - decay * mpart) : 0.0f, opart = 0.0f;
#pragma unroll
        for (int r = 0; r < MK_GDN_R; r++) {
            int i = sub + r * tpc;
            if (on1 && i < dk) {
                float st = fmaf(ks[i], delta, sv[r] * decay);
                S_[(int64_t)i * dv + c] = st;
                opart = fmaf(st, qs[i], opart);
            }
        }
        for (int o = 1; o < tpc; o <<= 1)
            opart += __shfl_xor_sync(0xffffffffu, opart, o);
        if (on1 && sub == 0)
            out[c] = opart;
    }
    for (int c0 = reg ? c_hi : c_lo; c0 < c_hi; c0 += cols) {
        c = c0 + tid / tpc;
        bool on = c < c_hi;
        float mpart = 0.0f;
        for (int i = sub; on && i < dk; i += tpc)
            mpart = fmaf(__ldcg(S_ + (int64_t)i * dv + c), ks[i], mpart);
        for (int o = 1; o < tpc; o <<= 1)
            mpart += __shfl_xor_sync(0xffffffffu, mpart, o);
        float delta = on ? beta * (__ldcg(v + c) - decay * mpart) : 0.0f, opart = 0.0f;
        for (int i = sub; on && i < dk; i += tpc) {
            float *sp_ = S_ + (int64_t)i * dv + c;
            float st = fmaf(ks[i], delta, __ldcg(sp_) * decay);
            *sp_ = st;
            opart = fmaf(st, qs[i], opart);
        }
        for (int o = 1; o < tpc; o <<= 1)
            opart += __shfl_xor_sync(0xffffffffu, opart, o);
        if (on && sub == 0)
            out[c] = opart;
    }
    if (!P.gated || (S > 1 && !mk_last_arrival(cnt + j, S, (int *)(os + dv)))) {
        __syncthreads();
        return;
    }
    __syncthreads();
    float ss = 0.0f;
    for (int c = tid; c < dv; c += nt) {
        float o = __ldcg(out + c);
        os[c] = o;
        ss += o * o;
    }
    ss = block_sum(ss, red);
    float scale = rsqrtf(ss / (float)dv + P.geps);
    for (int c = tid; c < dv; c += nt)
        out[c] = os[c] * scale * __ldg(P.gnorm_w + c) * silu_f(__ldcg(P.z + (int64_t)j * dv + c));
    __syncthreads();
}

__device__ __noinline__ void mk_gdn_core(const struct mk_phase &P, float *sm, float *red, unsigned *cnt)
{
    int S = mk_splits(P.Hv);
    for (int it = blockIdx.x; it < P.Hv * S; it += gridDim.x)
        mk_gdn_head(P, it / S, it % S, S, sm, red, cnt);
}

/* ------------------------------------------------------------------ the kernel */

template <int NT>
__global__ void __launch_bounds__(NT, 1) mk_kernel(const __grid_constant__ struct mk_params prm)
{
    extern __shared__ __align__(128) uint8_t mk_smem[];
    __shared__ float red[32];
    __shared__ __align__(8) uint64_t bars[MK_STAGES];
    __shared__ unsigned freed[MK_STAGES];
    /* shared memory: [ring: MK_STAGES x stage_bytes][GEMV table][schedule][gfirst]
     * [phases, when they fit][scratch floats] */
    struct mk_ring rg;
    rg.base = mk_smem;
    rg.bar = bars;
    rg.freed = freed;
    rg.stage_bytes = prm.stage_bytes;
    rg.next = 0;
    rg.n_g = prm.n_g, rg.n_tok = prm.n_tok;
    rg.prof = NULL;
    struct mk_gdesc *gt = (struct mk_gdesc *)(mk_smem + (size_t)MK_STAGES * prm.stage_bytes);
    struct mk_chunk *sched = (struct mk_chunk *)(gt + prm.n_g);
    int32_t *gfirst = (int32_t *)(sched + prm.max_chunks);
    rg.gt = gt, rg.sched = sched, rg.gfirst = gfirst;
    struct mk_phase *phs = (struct mk_phase *)(((uintptr_t)(gfirst + prm.n_g + 1) + 127) & ~(uintptr_t)127);
    const struct mk_phase *ph = prm.ph_in_smem ? phs : prm.ph;
    float *sm = prm.ph_in_smem ? (float *)(((uintptr_t)(phs + prm.n_ph) + 127) & ~(uintptr_t)127)
                               : (float *)phs;
    /* the GEMV table, this block's schedule (made at build: mk_schedule_kernel) and the
     * phases into shared memory */
    mk_copy_words((uint32_t *)gt, (const uint32_t *)prm.gt, prm.n_g * (int)(sizeof(struct mk_gdesc) / 4));
    mk_copy_words((uint32_t *)sched, (const uint32_t *)(prm.sched + (int64_t)blockIdx.x * prm.max_chunks),
                  prm.max_chunks * (int)(sizeof(struct mk_chunk) / 4));
    mk_copy_words((uint32_t *)gfirst, (const uint32_t *)(prm.gfirst + (int64_t)blockIdx.x * (prm.n_g + 1)),
                  prm.n_g + 1);
    if (prm.ph_in_smem)
        mk_copy_words((uint32_t *)phs, (const uint32_t *)prm.ph, prm.n_ph * (int)(sizeof(struct mk_phase) / 4));
    __syncthreads();
    unsigned nb = gridDim.x;
    unsigned long long target = 0;
    if (threadIdx.x == 0) {
        target = mk_ld_acquire(&prm.sync->count) / nb * nb;
        for (int i = 0; i < MK_STAGES; i++) {
            mk_mbar_init(&bars[i]);
            freed[i] = 0;
        }
        MK_SM90_ONLY(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
        for (uint32_t c = 0; c < MK_STAGES; c++)
            mk_refill(rg, c);
    }
    __syncthreads();
    int32_t id = __ldcg(prm.ids), pos = __ldcg(prm.pos);
    bool stamp = prm.times && blockIdx.x == 0 && threadIdx.x == 0;
    if (stamp)
        prm.times[0] = globaltimer_ns();
    for (int32_t tok = 0; tok < prm.n_tok; tok++) {
        int parity = tok & 1;
        for (int32_t pi = 0; pi < prm.n_ph; pi++) {
            const struct mk_phase &P = ph[pi];
            /* profile: lane 0 of every warp of block 0 (token 0) */
            rg.prof = prm.times && blockIdx.x == 0 && (threadIdx.x & 31) == 0 && tok == 0
                          ? prm.times + 1 + prm.n_ph + MK_PROF_SLOTS * pi : NULL;
            switch (P.kind) {
            case MK_EMBED: mk_embed(P, id); break;
            case MK_RMSNORM: mk_rmsnorm(P, red); break;
            case MK_GEMV: mk_gemv<NT>(prm, P, rg, sm, red, parity); break;
            case MK_ATTN: mk_attention(P, pos, sm, red, prm.part, prm.cnt); break;
            case MK_GDN_CONV: mk_gdn_conv(P); break;
            case MK_GDN_CORE: mk_gdn_core(P, sm, red, prm.cnt); break;
            default: mk_elementwise(P); break;
            }
            unsigned long long tb = rg.prof ? globaltimer_ns() : 0;
            if (prm.times && tok == 0 && threadIdx.x == 0) /* every block's arrival */
                prm.times[1 + (1 + MK_PROF_SLOTS) * prm.n_ph + (int64_t)pi * nb + blockIdx.x] = globaltimer_ns();
            mk_grid_sync(prm.sync, nb, &target);
            if (stamp && tok == 0) {
                prm.times[1 + pi] = globaltimer_ns();
                rg.prof[2] = prm.times[1 + pi] - tb;
            }
            if (pi == 0 && blockIdx.x == 0 && threadIdx.x == 0)
                prm.sync->key[parity ^ 1] = 0; /* read by every block before this barrier */
        }
        unsigned long long key = __ldcg(&prm.sync->key[parity]);
        id = key ? (int32_t)(0xffffffffu - (unsigned)(key & 0xffffffffull)) : 0;
        if (!prm.gen && prm.out_ids && blockIdx.x == 0 && threadIdx.x == 0) {
            unsigned hi = (unsigned)(key >> 32); /* the orderable bits back to the float's */
            prm.out_ids[0] = id;
            prm.out_ids[1] = (int32_t)((hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi);
        }
        if (prm.gen && blockIdx.x == 0 && threadIdx.x == 0) {
            prm.ids[0] = id;
            prm.out_ids[*prm.step] = id;
            *prm.step += 1;
            *prm.pos = pos + 1;
        }
        pos++;
    }
    mk_grid_sync(prm.sync, nb, &target);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        prm.sync->key[0] = prm.sync->key[1] = 0;
}

template <int NT>
static qwenrt_status mk_configure_nt(struct mk_program *mk, int32_t n_sm, struct qwenrt_error *err)
{
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: needs compute capability 9.0 (this GPU: %d.x)",
                       major);
    if (mk->smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(mk_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)mk->smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mk_kernel<NT>, NT, mk->smem));
    if (per_sm < 1)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: %zu bytes of shared memory do not fit",
                       mk->smem);
    mk->nb = n_sm;
    return QWENRT_OK;
}

qwenrt_status mk_configure(struct mk_program *mk, int32_t n_sm, struct qwenrt_error *err)
{
    return mk->threads == 256 ? mk_configure_nt<256>(mk, n_sm, err) : mk_configure_nt<512>(mk, n_sm, err);
}

/* Every block's chunk schedule, made once on the device for the launch grid (mk->nb). */
qwenrt_status mk_make_schedules(struct mk_program *mk, struct qwenrt_error *err)
{
    size_t n_sched = (size_t)mk->nb * (size_t)(mk->max_chunks > 0 ? mk->max_chunks : 1);
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_sched, n_sched * sizeof(struct mk_chunk)));
    CUDA_CHECK(cudaMemset(mk->d_sched, 0, n_sched * sizeof(struct mk_chunk)));
    CUDA_CHECK(dev_malloc(mk->allocs, &mk->d_gfirst, (size_t)mk->nb * (size_t)(mk->n_g + 1) * sizeof(int32_t)));
    mk_schedule_kernel<<<mk->nb, 1>>>(mk->d_gt, mk->n_g, mk->d_sched, mk->d_gfirst, mk->max_chunks);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    return QWENRT_OK;
}

/* dst [cols][rows] = src [rows][cols] of 16-bit values, through 32 x 32 tiles. */
__global__ void mk_transpose16_kernel(uint16_t *dst, const uint16_t *src, int32_t rows, int32_t cols)
{
    __shared__ uint16_t tile[32][33];
    int32_t c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * 32;
    for (int32_t i = threadIdx.y; i < 32; i += blockDim.y)
        if (r0 + i < rows && c < cols)
            tile[i][threadIdx.x] = src[(int64_t)(r0 + i) * cols + c];
    __syncthreads();
    int32_t r = r0 + threadIdx.x, c0 = blockIdx.x * 32;
    for (int32_t i = threadIdx.y; i < 32; i += blockDim.y)
        if (c0 + i < cols && r < rows)
            dst[(int64_t)(c0 + i) * rows + r] = tile[threadIdx.x][i];
}

qwenrt_status mk_transpose16(void *dst, const void *src, int32_t rows, int32_t cols, struct qwenrt_error *err)
{
    mk_transpose16_kernel<<<dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8)>>>((uint16_t *)dst,
                                                                                     (const uint16_t *)src, rows, cols);
    CUDA_CHECK(cudaGetLastError());
    return QWENRT_OK;
}

int32_t mk_phase_count(const struct mk_program *mk) { return mk ? mk->n_ph : 0; }

static const char *const mk_kind_names[] = {"embed", "rmsnorm", "gemv", "attention", "gdn_conv",
                                            "gdn_core", "add", "swiglu"};

/* One phase's arrival stamps of the nb blocks (token 0) against the barrier's exit: adds the
 * median-to-last spread and the last-arrival-to-exit latency (us / reps), counts the last. */
static void mk_arrivals(const unsigned long long *arr, int32_t nb, unsigned long long exit_t, double *spread,
                        double *tail, int32_t *late, int32_t reps)
{
    unsigned long long sorted[1024], last = 0;
    int32_t m = nb < 1024 ? nb : 1024, who = 0;
    for (int32_t b = 0; b < m; b++) {
        sorted[b] = arr[b];
        if (arr[b] > last)
            last = arr[b], who = b;
    }
    for (int32_t i = 1; i < m; i++) /* insertion sort: 132 values */
        for (int32_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            unsigned long long t = sorted[j];
            sorted[j] = sorted[j - 1], sorted[j - 1] = t;
        }
    *spread += (double)(last - sorted[m / 2]) / 1e3 / reps;
    *tail += (double)(exit_t > last ? exit_t - last : 0) / 1e3 / reps;
    if (late)
        late[who]++;
}

qwenrt_status mk_profile(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                         int32_t reps, char *report, size_t report_len, struct qwenrt_error *err)
{
    int32_t n = mk->n_ph + 1, nt = n + MK_PROF_SLOTS * mk->n_ph + mk->n_ph * mk->nb;
    double nw = (double)(mk->threads / 32);
    double spread[8] = {0}, tail[8] = {0}; /* per kind: median -> last arrival, last -> exit */
    int32_t *late = (int32_t *)xcalloc((size_t)mk->nb, sizeof(int32_t)); /* times each block came last */
    unsigned long long *d_t = NULL, *h_t = (unsigned long long *)xcalloc((size_t)nt, sizeof(*h_t));
    double *us = (double *)xcalloc((size_t)n, sizeof(double)), split[MK_PROF_SLOTS] = {0, 0, 0, 0, 0};
    qwenrt_status st = QWENRT_OK;
    if (!h_t || !us)
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    else if (cudaMalloc(&d_t, (size_t)nt * sizeof(*d_t)) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda megakernel: no memory for the profile");
    for (int32_t r = 0; r < reps && !st; r++) {
        cudaError_t e0 = cudaMemsetAsync(d_t, 0, (size_t)nt * sizeof(*d_t), s);
        if (e0 != cudaSuccess)
            st = cuda_fail(err, e0, __FILE__, __LINE__, "profile memset");
        if (!st && !(st = mk_run(mk, s, ids, pos, NULL, NULL, 1, false, d_t, err))) {
            cudaError_t e = cudaMemcpyAsync(h_t, d_t, (size_t)nt * sizeof(*d_t), cudaMemcpyDeviceToHost, s);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(s);
            if (e != cudaSuccess)
                st = cuda_fail(err, e, __FILE__, __LINE__, "profile copy");
        }
        for (int32_t i = 0; i + 1 < n && !st; i++) {
            us[i] += (double)(h_t[i + 1] - h_t[i]) / 1e3 / reps;
            for (int k = 0; k < MK_PROF_SLOTS; k++) /* slots 1 and 4: summed over warps */
                split[k] += (double)h_t[n + MK_PROF_SLOTS * i + k] / 1e3 / reps / (k == 1 || k == 4 ? nw : 1.0);
            const unsigned long long *arr = h_t + n + MK_PROF_SLOTS * mk->n_ph + (size_t)i * mk->nb;
            mk_arrivals(arr, mk->nb, h_t[i + 1], &spread[mk->kinds[i]], &tail[mk->kinds[i]], late, reps);
        }
    }
    if (!st) {
        double by_kind[8] = {0}, total = 0;
        int32_t count[8] = {0};
        for (int32_t i = 0; i < mk->n_ph; i++) {
            by_kind[mk->kinds[i]] += us[i];
            count[mk->kinds[i]]++;
            total += us[i];
        }
        size_t o = (size_t)snprintf(report, report_len, "megakernel (%d x %d threads, %zu B smem, %d-byte stages, phases in %s) phases (us per token, incl. barrier): total %.1f",
                                       mk->nb, mk->threads, mk->smem, mk->stage_bytes,
                                       mk->ph_in_smem ? "smem" : "global", total);
        if (o < report_len)
            o += (size_t)snprintf(report + o, report_len - o,
                                  "; block 0: x staging %.1f, ring waits %.1f (mean warp), barriers %.1f, refills %.1f (all warps), GEMV rows %.1f (mean warp)",
                                  split[0], split[1], split[2], split[3], split[4]);
        for (int r = 0; r < 4 && o < report_len; r++) { /* the slowest phases */
            int32_t bi = 0;
            for (int32_t i = 1; i < mk->n_ph; i++)
                bi = us[i] > us[bi] ? i : bi;
            o += (size_t)snprintf(report + o, report_len - o, "; #%d %s %.1f", bi,
                                  mk_kind_names[mk->kinds[bi]], us[bi]);
            us[bi] = -us[bi];
        }
        for (int32_t i = 0; i < mk->n_ph; i++)
            us[i] = us[i] < 0 ? -us[i] : us[i];
        for (int k = 0; k < 8 && o < report_len; k++)
            if (count[k])
                o += (size_t)snprintf(report + o, report_len - o,
                                      "; %s x%d %.1f (%.2f each; median->last arrival %.2f, last arrival->exit %.2f)",
                                      mk_kind_names[k], count[k], by_kind[k], by_kind[k] / count[k],
                                      spread[k] / count[k], tail[k] / count[k]);
        for (int r = 0; r < 3 && late && o < report_len; r++) { /* the blocks most often last */
            int32_t bi = 0;
            for (int32_t i = 1; i < mk->nb; i++)
                bi = late[i] > late[bi] ? i : bi;
            o += (size_t)snprintf(report + o, report_len - o, "%s block %d last in %d phases",
                                  r ? "," : "; ", bi, late[bi] / reps);
            late[bi] = -1;
        }
    }
    cudaFree(d_t);
    xfree(h_t);
    xfree(us);
    xfree(late);
    return st;
}

qwenrt_status mk_run(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                     int32_t *out_ids, int32_t *step, int32_t n_tok, bool gen,
                     unsigned long long *times, struct qwenrt_error *err)
{
    if (n_tok < 1 || (!gen && n_tok != 1))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda megakernel: %d tokens", n_tok);
    struct mk_params prm;
    prm.ph = mk->d_ph, prm.n_ph = mk->n_ph, prm.sync = mk->d_sync;
    prm.stage_bytes = mk->stage_bytes, prm.scratch_floats = mk->scratch_floats;
    prm.ph_in_smem = mk->ph_in_smem;
    prm.gt = mk->d_gt, prm.n_g = mk->n_g, prm.max_chunks = mk->max_chunks, prm.part = mk->d_part, prm.cnt = mk->d_cnt;
    prm.sched = mk->d_sched, prm.gfirst = mk->d_gfirst;
    prm.ids = ids, prm.pos = pos, prm.out_ids = out_ids, prm.step = step;
    prm.n_tok = n_tok, prm.gen = gen, prm.times = times;
    void *args[] = {&prm};
    const void *k = mk->threads == 256 ? (const void *)mk_kernel<256> : (const void *)mk_kernel<512>;
    CUDA_CHECK(cudaLaunchCooperativeKernel(k, dim3(mk->nb), dim3(mk->threads), args, mk->smem, s));
    return QWENRT_OK;
}
