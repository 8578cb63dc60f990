/*
 * megakernel.cu — the whole decode step (every layer, the LM head and the argmax) as one
 * persistent kernel; see megakernel.cuh for the idea and the interface.
 *
 * Execution: one block of NT threads per multiprocessor, launched cooperatively (all blocks
 * resident). The kernel walks the phase list; in each phase the blocks split the work (GEMV
 * rows over all warps of the grid, attention and DeltaNet heads over blocks, elementwise ops
 * over all threads), then meet at a grid barrier (an arrival counter and a generation word,
 * release/acquire at GPU scope). Activations are read with ld.global.cg (L2, never a stale L1
 * line) because other blocks wrote them before the barrier; weights with the read-only path.
 *
 * Prefetch: the host lays the weights of all phases out as one stream in execution order and
 * gives each phase the slice of the stream that ends `lookahead` bytes past its own start; at
 * phase start every block issues cp.async.bulk.prefetch.L2 for its share of that slice. The
 * GEMVs then read their rows from L2 while DRAM already streams the next phases. The LM head
 * (too big for L2) prefetches its own rows a few iterations ahead instead.
 *
 * Numerics follow the reference kernels (kernels_ref.c) as the per-op CUDA kernels do: f32
 * accumulation, RoPE angles in double, online softmax, quantised weights dequantised with
 * f32 activations (the matmul.<q>.exact form).
 */
#include "backend/cuda/megakernel.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}

#define MK_MAX_SEG 4
#define MK_U 4          /* 16-byte loads per lane issued before the first use (float rows) */
#define MK_LM_AHEAD 4   /* LM head: iterations of rows prefetched ahead */
#define MK_PF_PIECE (64 << 10)

enum mk_kind { MK_EMBED, MK_RMSNORM, MK_GEMV, MK_ATTN, MK_GDN_CONV, MK_GDN_CORE, MK_ADD, MK_SWIGLU };

struct mk_seg {
    const uint8_t *w;
    int64_t row_bytes;
    float *y;
    int32_t N, dtype;
};

/* One phase; each kind uses the fields it needs. */
struct mk_phase {
    int32_t kind;
    float *out;
    const float *in, *in2, *in3;
    const float *vec, *vec2, *vec3;
    int32_t width, K, group;
    float eps;
    /* GEMV */
    int32_t mode, n_seg, rows, argmax, self_prefetch;
    struct mk_seg seg[MK_MAX_SEG];
    /* embed */
    const uint8_t *w;
    int64_t row_bytes;
    int32_t dtype;
    /* attention */
    float *kc, *vc;
    int32_t n_head, n_head_kv, hd, q_stride, n_rot, kvw, gate;
    float theta;
    /* DeltaNet */
    float *state;
    const float *z, *gnorm_w;
    int32_t Hk, Hv, dk, dv, conv_k, tiled, gated;
    float geps;
    /* prefetch slice */
    int32_t pf_first, pf_count;
};

struct mk_range {
    const uint8_t *p;
    int64_t bytes;
};

struct mk_sync {
    unsigned int count, gen;
    unsigned long long key[2]; /* argmax of the LM head, one per token parity */
};

struct mk_params {
    const struct mk_phase *ph;
    int32_t n_ph;
    const struct mk_range *pf;
    struct mk_sync *sync;
    int32_t *ids, *pos, *out_ids, *step;
    int32_t n_tok, gen;
    unsigned long long *times; /* profiling: [1 + n_ph] globaltimer stamps of token 0, or NULL */
};

struct mk_program {
    int32_t *kinds;           /* [n_ph] host copy of each phase's kind (profiles) */
    struct mk_phase *d_ph;
    struct mk_range *d_pf;
    struct mk_sync *d_sync;
    int32_t n_ph, nb, threads;
    size_t smem;
};

/* ------------------------------------------------------------------ device helpers */

__device__ __forceinline__ float mk_silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float mk_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float mk_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float mk_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block; every thread gets it. red: 32 floats of shared memory. */
__device__ float mk_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mk_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return mk_warp_sum(t);
}

__device__ __forceinline__ unsigned mk_ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mk_st_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Grid barrier: every block's writes before it are visible to every block after it. *gen is
 * thread 0's copy of the generation word. */
__device__ __forceinline__ void mk_grid_sync(struct mk_sync *s, unsigned nb, unsigned *gen)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned target = *gen + 1;
        __threadfence();
        if (atomicAdd(&s->count, 1u) == nb - 1) {
            atomicExch(&s->count, 0u);
            __threadfence();
            mk_st_release(&s->gen, target);
        } else {
            while (mk_ld_acquire(&s->gen) != target) {
            }
        }
        *gen = target;
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned long long mk_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void mk_prefetch_l2(const uint8_t *p, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

/* Issues this block's share of [p, p+bytes) as L2 prefetches (lanes of warp 0). */
__device__ void mk_prefetch_share(const uint8_t *p, int64_t bytes)
{
    if (threadIdx.x >= 32)
        return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)15, e = ((uintptr_t)p + bytes + 15) & ~(uintptr_t)15;
    int64_t n = (int64_t)(e - a), nb = gridDim.x;
    int64_t share = ((n + nb - 1) / nb + 255) & ~(int64_t)255;
    int64_t lo = share * blockIdx.x, hi = lo + share < n ? lo + share : n;
    for (int64_t o = lo + (int64_t)threadIdx.x * MK_PF_PIECE; o < hi; o += 32 * (int64_t)MK_PF_PIECE) {
        int64_t len = hi - o < MK_PF_PIECE ? hi - o : MK_PF_PIECE;
        mk_prefetch_l2((const uint8_t *)(a + o), (uint32_t)len);
    }
}

/* ------------------------------------------------------------------ row dot products
 * Each returns the warp's dot product of one or two weight rows with xs (shared memory, f32)
 * in every lane. */

__device__ __forceinline__ void mk_acc8(float &acc, uint4 v, const float *x, int32_t dt)
{
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lo, hi;
        if (dt == QR_BF16) {
            lo = __uint_as_float(w[i] << 16);
            hi = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            float2 f = __half22float2(*(const __half2 *)&w[i]);
            lo = f.x, hi = f.y;
        }
        acc = fmaf(lo, xv[2 * i], acc);
        acc = fmaf(hi, xv[2 * i + 1], acc);
    }
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
template <int R>
__device__ void mk_dot_float(const uint8_t *const *rows, int32_t dt, const float *xs, int32_t K,
                             float *out)
{
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
                v[r][u] = c < nch ? __ldg((const uint4 *)rows[r] + c) : make_uint4(0, 0, 0, 0);
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
        out[r] = mk_warp_sum(acc[r]);
}

__device__ __forceinline__ float mk_f16(uint16_t u) { return __half2float(__ushort_as_half(u)); }

/* Q8_0: 34-byte blocks of 32; lane l takes blocks l, l+32, ... (2-byte loads). */
__device__ float mk_dot_q8_0(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nb = K / 32;
    float acc = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const uint16_t *p = (const uint16_t *)(row + (int64_t)b * 34);
        uint16_t q[17];
#pragma unroll
        for (int i = 0; i < 17; i++)
            q[i] = __ldg(p + i);
        const float *x = xs + b * 32;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s = fmaf((float)(int8_t)(q[1 + i] & 0xff), x[2 * i], s);
            s = fmaf((float)(int8_t)(q[1 + i] >> 8), x[2 * i + 1], s);
        }
        acc = fmaf(mk_f16(q[0]), s, acc);
    }
    return mk_warp_sum(acc);
}

__device__ __forceinline__ void mk_q4k_scale_min(const uint8_t *s, int sub, int *sc, int *m)
{
    if (sub < 4) {
        *sc = s[sub] & 63;
        *m = s[sub + 4] & 63;
    } else {
        *sc = (s[sub + 4] & 0xF) | ((s[sub - 4] >> 6) << 4);
        *m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
    }
}

/* Q4_K: 144-byte super-blocks of 256; 8 lanes per super-block, lane (c, half) takes 16 bytes
 * of chunk c: 16 low nibbles (sub-block 2c) and 16 high nibbles (sub-block 2c+1). */
__device__ float mk_dot_q4_k(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nsb = K / 256, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
    float acc = 0.0f;
    for (int sb = lane >> 3; sb < nsb; sb += 4) {
        const uint8_t *b = row + (int64_t)sb * 144;
        uint4 hdr = __ldg((const uint4 *)b);
        uint4 qv = __ldg((const uint4 *)(b + 16 + 32 * c + 16 * half));
        float d = mk_f16((uint16_t)(hdr.x & 0xffff)), dmin = mk_f16((uint16_t)(hdr.x >> 16));
        uint8_t s[12];
        memcpy(s, &hdr.y, 4), memcpy(s + 4, &hdr.z, 4), memcpy(s + 8, &hdr.w, 4);
        int sc0, m0, sc1, m1;
        mk_q4k_scale_min(s, 2 * c, &sc0, &m0);
        mk_q4k_scale_min(s, 2 * c + 1, &sc1, &m1);
        uint8_t q[16];
        memcpy(q, &qv, 16);
        const float *x0 = xs + sb * 256 + 64 * c + 16 * half, *x1 = x0 + 32;
        float s0 = 0.0f, s1 = 0.0f, x0s = 0.0f, x1s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s0 = fmaf((float)(q[i] & 0xF), x0[i], s0);
            s1 = fmaf((float)(q[i] >> 4), x1[i], s1);
            x0s += x0[i];
            x1s += x1[i];
        }
        acc += d * ((float)sc0 * s0 + (float)sc1 * s1) - dmin * ((float)m0 * x0s + (float)m1 * x1s);
    }
    return mk_warp_sum(acc);
}

/* Q6_K: 210-byte super-blocks of 256; 16 lanes per super-block, lane (h, g) takes l in
 * [4g, 4g+4) of half h for all four quarters (16 elements). */
__device__ float mk_dot_q6_k(const uint8_t *row, const float *xs, int32_t K)
{
    int lane = threadIdx.x & 31, nsb = K / 256, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
    float acc = 0.0f;
    for (int sb = lane >> 4; sb < nsb; sb += 2) {
        const uint8_t *b = row + (int64_t)sb * 210;
        const uint8_t *ql = b + 64 * h + 4 * g, *qh = b + 128 + 32 * h + 4 * g;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + g / 4);
        float d = mk_f16((uint16_t)(__ldg(b + 208) | (__ldg(b + 209) << 8)));
        uint8_t lo0[4], lo1[4], hb[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo0[i] = __ldg(ql + i);
            lo1[i] = __ldg(ql + 32 + i);
            hb[i] = __ldg(qh + i);
        }
        const float *x = xs + sb * 256 + 128 * h + 4 * g;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int lo = ((qq & 1) ? lo1[i] : lo0[i]) >> ((qq >> 1) * 4) & 0xF;
                int q = (lo | (((hb[i] >> (2 * qq)) & 3) << 4)) - 32;
                s = fmaf((float)q, x[32 * qq + i], s);
            }
            acc = fmaf(d * (float)__ldg(sc + 2 * qq), s, acc);
        }
    }
    return mk_warp_sum(acc);
}

/* Any dtype deq_elem knows, one element at a time (unaligned float rows). */
__device__ float mk_dot_any(const uint8_t *row, int32_t dt, const float *xs, int32_t K)
{
    float acc = 0.0f;
    for (int i = threadIdx.x & 31; i < K; i += 32)
        acc = fmaf(deq_elem(row, dt, i), xs[i], acc);
    return mk_warp_sum(acc);
}

__device__ __forceinline__ bool mk_float_fast(const struct mk_seg &s, int32_t K)
{
    int epc = s.dtype == QR_F32 ? 4 : 8;
    return (s.dtype == QR_F32 || s.dtype == QR_F16 || s.dtype == QR_BF16) && K % epc == 0 &&
           s.row_bytes % 16 == 0 && ((uintptr_t)s.w & 15) == 0;
}

__device__ float mk_dot_row(const struct mk_seg &s, int64_t r, const float *xs, int32_t K)
{
    const uint8_t *row = s.w + r * s.row_bytes;
    if (mk_float_fast(s, K)) {
        float v;
        mk_dot_float<1>(&row, s.dtype, xs, K, &v);
        return v;
    }
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
    float ss = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = __ldcg(in + i);
        xs[i] = v;
        ss += v * v;
    }
    if (norm_w) {
        ss = mk_block_sum(ss, red);
        float scale = rsqrtf(ss / (float)K + eps);
        for (int i = threadIdx.x; i < K; i += blockDim.x)
            xs[i] = xs[i] * scale * __ldg(norm_w + i);
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned long long mk_argmax_key(float v, int64_t i)
{
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffull - (unsigned long long)i);
}

__device__ void mk_store(const struct mk_phase &P, const struct mk_seg &s, int64_t r, float v)
{
    if (P.mode == GEMV_ACCUM)
        s.y[r] = __ldcg(s.y + r) + v;
    else
        s.y[r] = v;
}

/* y = [norm](x) · Wᵀ over every warp of the grid; SwiGLU pairs rows of seg 0 and seg 1. */
__device__ void mk_gemv(const struct mk_phase &P, float *xs, float *red, struct mk_sync *sync,
                        int parity)
{
    mk_stage_x(P.in, P.K, P.vec, P.eps, xs, red);
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, warp = threadIdx.x >> 5;
    int64_t gw = (int64_t)blockIdx.x * wpb + warp, nw = (int64_t)gridDim.x * wpb;
    unsigned long long best = 0;
    if (P.mode == GEMV_SWIGLU) {
        const struct mk_seg &g = P.seg[0], &u = P.seg[1];
        bool fast = mk_float_fast(g, P.K) && mk_float_fast(u, P.K) && g.dtype == u.dtype;
        for (int64_t r = gw; r < g.N; r += nw) {
            float v[2];
            if (fast) {
                const uint8_t *rows[2] = {g.w + r * g.row_bytes, u.w + r * u.row_bytes};
                mk_dot_float<2>(rows, g.dtype, xs, P.K, v);
            } else {
                v[0] = mk_dot_row(g, r, xs, P.K);
                v[1] = mk_dot_row(u, r, xs, P.K);
            }
            if (lane == 0)
                g.y[r] = mk_silu(v[0]) * v[1];
        }
        return;
    }
    if (P.n_seg == 1 && mk_float_fast(P.seg[0], P.K)) {
        /* one matrix: two rows per warp per round (gw + 2k nw, gw + (2k+1) nw) */
        const struct mk_seg &s = P.seg[0];
        for (int64_t k = 0; gw + 2 * k * nw < s.N; k++) {
            if (P.self_prefetch && threadIdx.x == 0) {
                int64_t ahead = k + MK_LM_AHEAD, r0 = 2 * ahead * nw + (int64_t)blockIdx.x * wpb;
                for (int j = 0; j < 2; j++, r0 += nw) {
                    int64_t r1 = r0 + wpb < s.N ? r0 + wpb : s.N;
                    if (r0 < s.N)
                        mk_prefetch_l2(s.w + r0 * s.row_bytes, (uint32_t)((r1 - r0) * s.row_bytes));
                }
            }
            int64_t r0 = gw + 2 * k * nw, r1 = r0 + nw;
            float v[2];
            if (r1 < s.N) {
                const uint8_t *rows[2] = {s.w + r0 * s.row_bytes, s.w + r1 * s.row_bytes};
                mk_dot_float<2>(rows, s.dtype, xs, P.K, v);
            } else {
                const uint8_t *rows[1] = {s.w + r0 * s.row_bytes};
                mk_dot_float<1>(rows, s.dtype, xs, P.K, v);
            }
            for (int j = 0; j < 2; j++) {
                int64_t r = j ? r1 : r0;
                if (r >= s.N || lane != 0)
                    continue;
                mk_store(P, s, r, v[j]);
                if (P.argmax && v[j] == v[j]) {
                    unsigned long long key = mk_argmax_key(v[j], r);
                    best = key > best ? key : best;
                }
            }
        }
    } else {
        for (int64_t r = gw; r < P.rows; r += nw) {
            int si = 0;
            int64_t rr = r;
            while (rr >= P.seg[si].N)
                rr -= P.seg[si++].N;
            float v = mk_dot_row(P.seg[si], rr, xs, P.K);
            if (lane == 0) {
                mk_store(P, P.seg[si], rr, v);
                if (P.argmax && v == v) {
                    unsigned long long key = mk_argmax_key(v, rr);
                    best = key > best ? key : best;
                }
            }
        }
    }
    if (P.argmax && lane == 0 && best)
        atomicMax(&sync->key[parity], best);
}

__device__ void mk_embed(const struct mk_phase &P, int32_t id)
{
    const uint8_t *row = P.w + (int64_t)id * P.row_bytes;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P.width; i += gridDim.x * blockDim.x)
        P.out[i] = deq_elem(row, P.dtype, i);
}

__device__ void mk_rmsnorm(const struct mk_phase &P, float *red)
{
    int groups = P.width / P.group;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const float *x = P.in + (int64_t)g * P.group;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < P.group; i += blockDim.x) {
            float v = __ldcg(x + i);
            ss += v * v;
        }
        ss = mk_block_sum(ss, red);
        float scale = rsqrtf(ss / (float)P.group + P.eps);
        for (int i = threadIdx.x; i < P.group; i += blockDim.x)
            P.out[(int64_t)g * P.group + i] = __ldcg(x + i) * scale * __ldg(P.vec + i);
        __syncthreads();
    }
}

__device__ void mk_elementwise(const struct mk_phase &P)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P.width; i += gridDim.x * blockDim.x) {
        float x = __ldcg(P.in + i), y = __ldcg(P.out + i);
        P.out[i] = P.kind == MK_ADD ? y + x : mk_silu(y) * x;
    }
}

/* x (hd floats in shared memory, this thread's element d) after RoPE at pos. */
__device__ float mk_rope(const float *x, int d, int32_t n_rot, float theta, int32_t pos)
{
    if (d >= n_rot)
        return x[d];
    int half = n_rot / 2, i = d < half ? d : d - half;
    double inv_freq = pow((double)theta, -2.0 * (double)i / (double)n_rot), sn, cs;
    sincos((double)pos * inv_freq, &sn, &cs);
    float c = (float)cs, s = (float)sn;
    return d < half ? x[d] * c - x[d + half] * s : x[d] * c + x[d - half] * s;
}

/* q/k norm + RoPE + cache write + attention over 0..pos (+ output gate) for query head h. */
template <int EPL>
__device__ void mk_attn_head(const struct mk_phase &P, int h, int32_t pos, float *sm, float *red)
{
    const int hd = 32 * EPL, W = blockDim.x >> 5, U = 4;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int grp = P.n_head / P.n_head_kv, g = h / grp;
    float *qs = sm, *ks = sm + hd, *vs = sm + 2 * hd, *accs = sm + 3 * hd;
    float *ms = accs + W * hd, *ls = ms + W, *tmp = ls + W;
    float qv = tid < hd ? __ldcg(P.in + (int64_t)h * P.q_stride + tid) : 0.0f;
    float kv = tid < hd ? __ldcg(P.in2 + (int64_t)g * hd + tid) : 0.0f;
    float sq = mk_block_sum(qv * qv, red), sk = mk_block_sum(kv * kv, red);
    if (tid < hd) {
        qs[tid] = qv * rsqrtf(sq / (float)hd + P.eps) * __ldg(P.vec + tid);
        tmp[tid] = kv * rsqrtf(sk / (float)hd + P.eps) * __ldg(P.vec2 + tid);
    }
    __syncthreads();
    float qr = 0.0f, kr = 0.0f;
    if (tid < hd) {
        qr = mk_rope(qs, tid, P.n_rot, P.theta, pos);
        kr = mk_rope(tmp, tid, P.n_rot, P.theta, pos);
    }
    __syncthreads();
    if (tid < hd) {
        float v = __ldcg(P.in3 + (int64_t)g * hd + tid);
        qs[tid] = qr, ks[tid] = kr, vs[tid] = v;
        if (h % grp == 0) {
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
    for (int p0 = warp; p0 <= pos; p0 += W * U) {
        float kk[U][EPL], vv[U][EPL], dot[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + u * W;
            const float *kp = p < pos ? kb + (int64_t)p * P.kvw : ks + lane * EPL;
            const float *vp = p < pos ? vb + (int64_t)p * P.kvw : vs + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                kk[u][e] = p < pos ? __ldcg(kp + e) : kp[e];
                vv[u][e] = p < pos ? __ldcg(vp + e) : vp[e];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                d = fmaf(q[e], kk[u][e], d);
            dot[u] = mk_warp_sum(d);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (p0 + u * W > pos)
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
    if (tid < hd) {
        float M = -INFINITY, L = 0.0f, o = 0.0f;
        for (int w = 0; w < W; w++)
            M = fmaxf(M, ms[w]);
        for (int w = 0; w < W; w++) {
            float f = ms[w] == -INFINITY ? 0.0f : __expf(ms[w] - M);
            L += ls[w] * f;
            o += accs[w * hd + tid] * f;
        }
        o /= L;
        if (P.gate)
            o *= mk_sigmoid(__ldcg(P.in + (int64_t)h * P.q_stride + hd + tid));
        P.out[(int64_t)h * hd + tid] = o;
    }
    __syncthreads();
}

__device__ void mk_attention(const struct mk_phase &P, int32_t pos, float *sm, float *red)
{
    for (int h = blockIdx.x; h < P.n_head; h += gridDim.x) {
        if (P.hd == 64)
            mk_attn_head<2>(P, h, pos, sm, red);
        else if (P.hd == 128)
            mk_attn_head<4>(P, h, pos, sm, red);
        else
            mk_attn_head<8>(P, h, pos, sm, red);
    }
}

/* Causal depthwise conv of one token over the conv state, SiLU; one thread per channel. */
__device__ void mk_gdn_conv(const struct mk_phase &P)
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
        P.out[ch] = mk_silu(acc);
    }
}

/* Delta rule for value head j (+ the gated RMSNorm of its output): thread (c, sub) owns
 * column c at rows sub, sub+tpc, ...; the state is read twice from L2 (decay + S^T k, then
 * the update + S^T q). */
__device__ void mk_gdn_head(const struct mk_phase &P, int j, float *sm, float *red)
{
    int dk = P.dk, dv = P.dv, tid = threadIdx.x, nt = blockDim.x;
    int kh = P.tiled ? j % P.Hk : j / (P.Hv / P.Hk);
    float *qs = sm, *ks = sm + dk, *os = sm + 2 * dk;
    const float *qsrc = P.in + (int64_t)kh * dk, *ksrc = P.in + (int64_t)P.Hk * dk + (int64_t)kh * dk;
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < dk; i += nt) {
        float a = __ldcg(qsrc + i), b = __ldcg(ksrc + i);
        qs[i] = a, ks[i] = b;
        sq += a * a, sk += b * b;
    }
    sq = mk_block_sum(sq, red);
    sk = mk_block_sum(sk, red);
    float rq = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), rk = rsqrtf(sk + 1e-6f);
    for (int i = tid; i < dk; i += nt)
        qs[i] *= rq, ks[i] *= rk;
    __syncthreads();
    float beta = mk_sigmoid(__ldcg(P.in2 + j));
    float decay = expf(__ldg(P.vec3 + j) * mk_softplus(__ldcg(P.in3 + j) + __ldg(P.vec2 + j)));
    int tpc = 1;
    while (tpc < 32 && tpc * 2 * dv <= nt)
        tpc *= 2;
    int cols = nt / tpc, sub = tid % tpc;
    float *S = P.state + (int64_t)j * dk * dv;
    const float *v = P.in + (int64_t)2 * P.Hk * dk + (int64_t)j * dv;
    for (int c0 = 0; c0 < dv; c0 += cols) {
        int c = c0 + tid / tpc;
        bool on = c < dv;
        float mpart = 0.0f;
        for (int i = sub; on && i < dk; i += tpc)
            mpart = fmaf(__ldcg(S + (int64_t)i * dv + c), ks[i], mpart);
        for (int o = 1; o < tpc; o <<= 1)
            mpart += __shfl_xor_sync(0xffffffffu, mpart, o);
        float delta = on ? beta * (__ldcg(v + c) - decay * mpart) : 0.0f, opart = 0.0f;
        for (int i = sub; on && i < dk; i += tpc) {
            float *sp = S + (int64_t)i * dv + c;
            float s = fmaf(ks[i], delta, __ldcg(sp) * decay);
            *sp = s;
            opart = fmaf(s, qs[i], opart);
        }
        for (int o = 1; o < tpc; o <<= 1)
            opart += __shfl_xor_sync(0xffffffffu, opart, o);
        if (on && sub == 0)
            os[c] = opart;
    }
    __syncthreads();
    float *out = P.out + (int64_t)j * dv;
    if (!P.gated) {
        for (int c = tid; c < dv; c += nt)
            out[c] = os[c];
    } else {
        float ss = 0.0f;
        for (int c = tid; c < dv; c += nt)
            ss += os[c] * os[c];
        ss = mk_block_sum(ss, red);
        float scale = rsqrtf(ss / (float)dv + P.geps);
        for (int c = tid; c < dv; c += nt)
            out[c] = os[c] * scale * __ldg(P.gnorm_w + c) * mk_silu(__ldcg(P.z + (int64_t)j * dv + c));
    }
    __syncthreads();
}

/* ------------------------------------------------------------------ the kernel */

template <int NT>
__global__ void __launch_bounds__(NT, 1) mk_kernel(const __grid_constant__ struct mk_params prm)
{
    extern __shared__ float4 mk_smem4[];
    float *sm = (float *)mk_smem4;
    __shared__ float red[32];
    unsigned gen = 0, nb = gridDim.x;
    if (threadIdx.x == 0)
        gen = mk_ld_acquire(&prm.sync->gen);
    int32_t id = __ldcg(prm.ids), pos = __ldcg(prm.pos);
    bool stamp = prm.times && blockIdx.x == 0 && threadIdx.x == 0;
    if (stamp)
        prm.times[0] = mk_globaltimer();
    for (int32_t tok = 0; tok < prm.n_tok; tok++) {
        int parity = tok & 1;
        for (int32_t pi = 0; pi < prm.n_ph; pi++) {
            const struct mk_phase &P = prm.ph[pi];
            for (int32_t r = 0; r < P.pf_count; r++)
                mk_prefetch_share(prm.pf[P.pf_first + r].p, prm.pf[P.pf_first + r].bytes);
            switch (P.kind) {
            case MK_EMBED: mk_embed(P, id); break;
            case MK_RMSNORM: mk_rmsnorm(P, red); break;
            case MK_GEMV: mk_gemv(P, sm, red, prm.sync, parity); break;
            case MK_ATTN: mk_attention(P, pos, sm, red); break;
            case MK_GDN_CONV: mk_gdn_conv(P); break;
            case MK_GDN_CORE:
                for (int j = blockIdx.x; j < P.Hv; j += gridDim.x)
                    mk_gdn_head(P, j, sm, red);
                break;
            default: mk_elementwise(P); break;
            }
            mk_grid_sync(prm.sync, nb, &gen);
            if (stamp && tok == 0)
                prm.times[1 + pi] = mk_globaltimer();
            if (pi == 0 && blockIdx.x == 0 && threadIdx.x == 0)
                prm.sync->key[parity ^ 1] = 0; /* read by every block before this barrier */
        }
        unsigned long long key = __ldcg(&prm.sync->key[parity]);
        id = key ? (int32_t)(0xffffffffu - (unsigned)(key & 0xffffffffull)) : 0;
        if (prm.gen && blockIdx.x == 0 && threadIdx.x == 0) {
            prm.ids[0] = id;
            prm.out_ids[*prm.step] = id;
            *prm.step += 1;
            *prm.pos = pos + 1;
        }
        pos++;
    }
    mk_grid_sync(prm.sync, nb, &gen);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        prm.sync->key[0] = prm.sync->key[1] = 0;
}

/* ------------------------------------------------------------------ building the program */

struct mk_builder {
    const struct mk_inputs *in;
    struct mk_phase *ph;
    int32_t n_ph, cap_ph;
    struct mk_range *stream; /* weights in execution order, with the phase that reads them */
    int32_t *stream_phase;
    int32_t n_stream, cap_stream;
    int32_t max_K, max_attn, max_gdn; /* shared memory needs, floats */
};

static int32_t bwid(const struct plan *p, int32_t b) { return p->bufs[b].width; }

static bool mk_push_stream(struct mk_builder *b, const void *p, int64_t bytes)
{
    if (b->n_stream == b->cap_stream) {
        int32_t cap = b->cap_stream ? 2 * b->cap_stream : 256;
        struct mk_range *s = (struct mk_range *)xrealloc(b->stream, (size_t)cap, sizeof(*s));
        if (!s)
            return false;
        b->stream = s;
        int32_t *sp = (int32_t *)xrealloc(b->stream_phase, (size_t)cap, sizeof(*sp));
        if (!sp)
            return false;
        b->stream_phase = sp;
        b->cap_stream = cap;
    }
    b->stream[b->n_stream].p = (const uint8_t *)p;
    b->stream[b->n_stream].bytes = bytes;
    b->stream_phase[b->n_stream++] = b->n_ph;
    return true;
}

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
        if (!mk_dtype_ok(d->dtype) || d->K != ph->K)
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda megakernel: matmul op %d (dtype %d, K %d)",
                           mm[k], d->dtype, d->K);
        ph->seg[k].w = (const uint8_t *)d->w;
        ph->seg[k].row_bytes = d->row_bytes;
        ph->seg[k].N = d->N;
        ph->seg[k].dtype = d->dtype;
        ph->seg[k].y = accum_y ? accum_y : b->in->bufs[m->out];
        ph->rows += d->N;
        ph->argmax |= m->kind == OP_LOGITS;
        if (!mk_push_stream(b, d->w, (int64_t)d->N * d->row_bytes))
            return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
        if ((int64_t)d->N * d->row_bytes > (64 << 20))
            ph->self_prefetch = 1;
    }
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
        ph->gate = gate;
        int32_t need = 3 * ph->hd + (b->in->threads / 32) * (ph->hd + 2) + ph->hd;
        if (need > b->max_attn)
            b->max_attn = need;
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
        if (2 * ph->dk + ph->dv > b->max_gdn)
            b->max_gdn = 2 * ph->dk + ph->dv;
        if (!mk_push_stream(b, ph->state, (int64_t)ph->Hv * ph->dk * ph->dv * 4))
            break;
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

/* Gives each phase the part of the weight stream that ends lookahead bytes past its start. */
static qwenrt_status mk_windows(struct mk_builder *b, struct mk_range **out, int32_t *n_out,
                                struct qwenrt_error *err)
{
    int64_t total = 0;
    int64_t *start = (int64_t *)xcalloc((size_t)b->n_ph + 1, sizeof(int64_t));
    struct mk_range *r = (struct mk_range *)xcalloc((size_t)(b->n_stream + 1) * 2 + b->n_ph, sizeof(*r));
    if (!start || !r) {
        xfree(start), xfree(r);
        return err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    }
    for (int32_t ph = 0, s = 0; ph <= b->n_ph; ph++) {
        while (s < b->n_stream && b->stream_phase[s] < ph)
            total += b->stream[s++].bytes;
        start[ph] = total;
    }
    int32_t n = 0;
    int64_t done = 0;
    for (int32_t ph = 0; ph < b->n_ph; ph++) {
        int64_t hi = start[ph] + b->in->lookahead;
        hi = hi < total ? hi : total;
        b->ph[ph].pf_first = n;
        int64_t off = 0;
        for (int32_t s = 0; s < b->n_stream && done < hi; s++) {
            int64_t lo = off, e = off + b->stream[s].bytes;
            off = e;
            int64_t a = lo > done ? lo : done, z = e < hi ? e : hi;
            if (a < z) {
                r[n].p = b->stream[s].p + (a - lo);
                r[n++].bytes = z - a;
            }
        }
        b->ph[ph].pf_count = n - b->ph[ph].pf_first;
        done = hi > done ? hi : done;
    }
    xfree(start);
    *out = r;
    *n_out = n;
    return QWENRT_OK;
}

void mk_free(struct mk_program *mk)
{
    if (!mk)
        return;
    cudaFree(mk->d_ph);
    cudaFree(mk->d_pf);
    cudaFree(mk->d_sync);
    xfree(mk->kinds);
    xfree(mk);
}

static qwenrt_status mk_upload(struct mk_program *mk, const struct mk_builder *b,
                               const struct mk_range *pf, int32_t n_pf, struct qwenrt_error *err)
{
    CUDA_CHECK(cudaMalloc(&mk->d_ph, (size_t)b->n_ph * sizeof(struct mk_phase)));
    CUDA_CHECK(cudaMemcpy(mk->d_ph, b->ph, (size_t)b->n_ph * sizeof(struct mk_phase), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&mk->d_pf, (size_t)(n_pf + 1) * sizeof(struct mk_range)));
    if (n_pf)
        CUDA_CHECK(cudaMemcpy(mk->d_pf, pf, (size_t)n_pf * sizeof(struct mk_range), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&mk->d_sync, sizeof(struct mk_sync)));
    CUDA_CHECK(cudaMemset(mk->d_sync, 0, sizeof(struct mk_sync)));
    return QWENRT_OK;
}

template <int NT>
static qwenrt_status mk_configure(struct mk_program *mk, int32_t n_sm, struct qwenrt_error *err)
{
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
    struct mk_range *pf = NULL;
    int32_t n_pf = 0;
    struct mk_program *mk = NULL;
    if (!st)
        st = mk_windows(&b, &pf, &n_pf, err);
    if (!st && !(mk = (struct mk_program *)xcalloc(1, sizeof(*mk))))
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    if (!st) {
        int32_t need = b.max_K > b.max_attn ? b.max_K : b.max_attn;
        need = need > b.max_gdn ? need : b.max_gdn;
        mk->smem = ((size_t)need * 4 + 15) & ~(size_t)15;
        mk->n_ph = b.n_ph;
        mk->threads = in->threads;
        mk->kinds = (int32_t *)xcalloc((size_t)b.n_ph, sizeof(int32_t));
        for (int32_t i = 0; mk->kinds && i < b.n_ph; i++)
            mk->kinds[i] = b.ph[i].kind;
        st = mk->kinds ? mk_upload(mk, &b, pf, n_pf, err)
                       : err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    }
    if (!st)
        st = in->threads == 256 ? mk_configure<256>(mk, in->n_sm, err) : mk_configure<512>(mk, in->n_sm, err);
    xfree(pf);
    xfree(b.ph);
    xfree(b.stream);
    xfree(b.stream_phase);
    if (st) {
        mk_free(mk);
        return st;
    }
    *out = mk;
    return QWENRT_OK;
}

int32_t mk_phase_count(const struct mk_program *mk) { return mk ? mk->n_ph : 0; }

static const char *const mk_kind_names[] = {"embed", "rmsnorm", "gemv", "attention", "gdn_conv",
                                            "gdn_core", "add", "swiglu"};

qwenrt_status mk_profile(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                         int32_t reps, char *report, size_t report_len, struct qwenrt_error *err)
{
    int32_t n = mk->n_ph + 1;
    unsigned long long *d_t = NULL, *h_t = (unsigned long long *)xcalloc((size_t)n, sizeof(*h_t));
    double *us = (double *)xcalloc((size_t)n, sizeof(double));
    qwenrt_status st = QWENRT_OK;
    if (!h_t || !us)
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda megakernel: out of memory");
    else if (cudaMalloc(&d_t, (size_t)n * sizeof(*d_t)) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda megakernel: no memory for the profile");
    for (int32_t r = 0; r < reps && !st; r++) {
        if (!(st = mk_run(mk, s, ids, pos, NULL, NULL, 1, false, d_t, err))) {
            cudaError_t e = cudaMemcpyAsync(h_t, d_t, (size_t)n * sizeof(*d_t), cudaMemcpyDeviceToHost, s);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(s);
            if (e != cudaSuccess)
                st = cuda_fail(err, e, __FILE__, __LINE__, "profile copy");
        }
        for (int32_t i = 0; i + 1 < n && !st; i++)
            us[i] += (double)(h_t[i + 1] - h_t[i]) / 1e3 / reps;
    }
    if (!st) {
        double by_kind[8] = {0}, total = 0;
        int32_t count[8] = {0};
        for (int32_t i = 0; i < mk->n_ph; i++) {
            by_kind[mk->kinds[i]] += us[i];
            count[mk->kinds[i]]++;
            total += us[i];
        }
        size_t o = (size_t)snprintf(report, report_len, "megakernel phases (us per token, incl. barrier): total %.1f", total);
        for (int k = 0; k < 8 && o < report_len; k++)
            if (count[k])
                o += (size_t)snprintf(report + o, report_len - o, "; %s x%d %.1f (%.2f each)",
                                      mk_kind_names[k], count[k], by_kind[k], by_kind[k] / count[k]);
    }
    cudaFree(d_t);
    xfree(h_t);
    xfree(us);
    return st;
}

qwenrt_status mk_run(struct mk_program *mk, cudaStream_t s, int32_t *ids, int32_t *pos,
                     int32_t *out_ids, int32_t *step, int32_t n_tok, bool gen,
                     unsigned long long *times, struct qwenrt_error *err)
{
    if (n_tok < 1 || (!gen && n_tok != 1))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda megakernel: %d tokens", n_tok);
    struct mk_params prm;
    prm.ph = mk->d_ph, prm.n_ph = mk->n_ph, prm.pf = mk->d_pf, prm.sync = mk->d_sync;
    prm.ids = ids, prm.pos = pos, prm.out_ids = out_ids, prm.step = step;
    prm.n_tok = n_tok, prm.gen = gen, prm.times = times;
    void *args[] = {&prm};
    const void *k = mk->threads == 256 ? (const void *)mk_kernel<256> : (const void *)mk_kernel<512>;
    CUDA_CHECK(cudaLaunchCooperativeKernel(k, dim3(mk->nb), dim3(mk->threads), args, mk->smem, s));
    return QWENRT_OK;
}
