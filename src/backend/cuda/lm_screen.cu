/*
 * lm_screen.cu — the generation loops' LM head through an 8-bit copy, then the exact rows that
 * can still win or be among the top_k (the design and the bound: lm_screen.cuh).
 *
 * Three kernels:
 *   build   once per weights copy (shared by its sessions): the copy (int8 rows, an f16 scale
 *           per 32) and E, W;
 *   screen  each token: every block normalises h and quantises x to 8 bits with a scale per 32
 *           (the same bits in every block), then its warps take 4 rows at a time, 16 bytes
 *           of each row a lane (dp4a), writing the approximate logits and the largest of them
 *           (an atomicMax on order-preserving bits); block 0 also writes x and |x|^2, |x~ - x|^2;
 *   pick    each token: the threshold (max a, or a lower bound on the m-th largest a) - 2B, a
 *           scan of the approximate logits, the exact dot product (a warp each) of every row
 *           at or over it; for the argmax an atomicMax on (logit, lowest index) keys, and the
 *           last block to arrive writes the token as launch_argmax does; for the m best (the
 *           sampled loop) each such row's exact logit goes to the logits row and its key
 *           (topk_select.cuh's order) to a list, from which the last block to arrive selects
 *           the m best, ranks them and draws the token (sample.cuh), as topk.cu's last block
 *           does for a whole row. The last block zeroes the scratch for the next token.
 */
#include "backend/cuda/lm_screen.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/sample.cuh"
#include "backend/cuda/topk_select.cuh"

#include <math.h>

extern "C" {
#include "base/alloc.h"
}

#define SCR_THREADS 256
#define SCR_WARPS (SCR_THREADS / 32)
#define SCR_ROWS 4          /* rows a warp screens at once */
#define PICK_BLOCKS 128
#define PICK_CHUNK 4096     /* candidate keys the sampled pick's last block selects from at once */
#define PICK_LIST 128       /* candidate rows a pick block lists for its warps */
#define BUILD_BLOCKS 1024

/* Device scratch kept zeroed between tokens (amax, count, key) and the statistics. */
struct scr_scratch {
    float xx, xe;             /* |x|^2 and |x~ - x|^2 of the token (block 0 of the screen) */
    unsigned amax;            /* order-preserving bits of the largest approximate logit, 0: none */
    unsigned count;           /* the pick's arrivals */
    unsigned n_cand;          /* the sampled pick's candidates so far */
    unsigned long long key;   /* the best exact (logit, index) so far, 0: none */
    unsigned long long picks; /* statistics: tokens picked, rows computed exactly */
    unsigned long long rows;
    unsigned e_bits, w_bits;  /* build: E and W as bits of non-negative floats */
};

/* The copy of an LM head's rows: made once and shared by the sessions of one weights copy
 * (device_weights.cu); never written after it is made. */
struct lm_screen_copy {
    int8_t *q;        /* [N][K] */
    __half *s;        /* [N][K / 32] */
    const void *rows; /* the 16- or 32-bit rows it copies */
    int32_t N, K, screen_blocks;
    float E, W;
    struct cuda_alloc_count *allocs; /* the count of the session that made it (dev_malloc), or NULL */
};

/* A session's screen: the copy it reads, and the session's own buffers. */
struct lm_screen {
    const struct lm_screen_copy *c;
    float *approx;   /* [N] */
    float *x;        /* [K] the token's normalised x (block 0 of the screen) */
    unsigned long long *cand; /* [N] the sampled pick's candidate keys */
    unsigned *block_max; /* [screen_blocks] */
    struct scr_scratch *sc;
    struct lm_screen_copy *own; /* lm_screen_build's copy, freed with the screen (else NULL) */
    struct cuda_alloc_count *allocs; /* its session's allocation count (dev_malloc), or NULL */
};

__device__ __forceinline__ unsigned ord_bits(float v)
{
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float unord_bits(unsigned o)
{
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

__device__ __forceinline__ float scr_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}


/* Element k of a 16- or 32-bit row. */
__device__ __forceinline__ float scr_elem(const uint8_t *row, int32_t dtype, int k)
{
    if (dtype == QR_F32)
        return ((const float *)row)[k];
    uint16_t u = ((const uint16_t *)row)[k];
    return dtype == QR_BF16 ? bf16_bits_to_f32(u) : f16_bits_to_f32(u);
}

/* ---- build: a warp per row, a lane per block of 32 ---- */
__global__ void __launch_bounds__(SCR_THREADS) lm_screen_build_kernel(const uint8_t *w, int32_t dtype, int64_t row_bytes,
                                                                      int32_t N, int32_t K, int8_t *q, __half *s,
                                                                      struct scr_scratch *sc, float gk)
{
    const int lane = threadIdx.x & 31, nb = K / 32;
    const int64_t n_warps = (int64_t)gridDim.x * SCR_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * SCR_WARPS + (threadIdx.x >> 5); r < N; r += n_warps) {
        const uint8_t *row = w + r * row_bytes;
        float se = 0.0f, sw = 0.0f, sq = 0.0f;
        for (int b = lane; b < nb; b += 32) {
            float v[32], m = 0.0f;
#pragma unroll
            for (int k = 0; k < 32; k++)
                v[k] = scr_elem(row, dtype, 32 * b + k), m = fmaxf(m, fabsf(v[k]));
            __half sh = __float2half_rn(m / 127.0f);
            float d = __half2float(sh);
            uint32_t packed[8];
#pragma unroll
            for (int k = 0; k < 32; k++) {
                float t = d > 0.0f ? fminf(fmaxf(rintf(v[k] / d), -127.0f), 127.0f) : 0.0f;
                float e = d * t - v[k]; /* d * t is exact in f32 (11 + 8 bits) */
                se += e * e, sw += v[k] * v[k], sq += (d * t) * (d * t);
                int8_t qi = (int8_t)(int)t;
                if (k % 4 == 0)
                    packed[k / 4] = 0;
                packed[k / 4] |= (uint32_t)(uint8_t)qi << (8 * (k % 4));
            }
            uint4 *dst = (uint4 *)(q + r * K + 32 * b);
            dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
            s[r * nb + b] = sh;
        }
        se = warp_sum(se), sw = warp_sum(sw), sq = warp_sum(sq);
        if (lane == 0) {
            /* non-negative floats order as their bits; NaN (any sign) orders above +Inf once
             * made positive, so a NaN row shows in the maximum */
            float eb = (sqrtf(se) + gk * sqrtf(sw)) * 1.001f, wb = sqrtf(sq) * 1.001f;
            atomicMax(&sc->e_bits, __float_as_uint(eb) & 0x7fffffffu | (eb != eb ? 0x7fc00000u : 0u));
            atomicMax(&sc->w_bits, __float_as_uint(wb) & 0x7fffffffu | (wb != wb ? 0x7fc00000u : 0u));
        }
    }
}

/* ---- screen ---- */
struct screen_params {
    const float *h, *norm_w;
    float eps;
    const int8_t *q;
    const __half *s;
    float *approx, *x;
    unsigned *block_max; /* [gridDim.x] each block's largest approximate logit (ordered bits, 0: none) */
    struct scr_scratch *sc;
    int32_t N, K;
};

/* Every block: x = h * (1 / rms) * norm_w, quantised per 32 into xq (int8) and xs (scales);
 * block 0 writes x and the two norms. */
__device__ void screen_stage(const struct screen_params &P, int8_t *xq, float *xs, float *red)
{
    const int K = P.K, nt = blockDim.x, lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < K; k += nt) {
        float v = __ldcg(P.h + k);
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)K + P.eps);
    float xx = 0.0f, xe = 0.0f;
    for (int k = threadIdx.x; k < K; k += nt) { /* nt % 32 == 0: a warp holds one block of 32 */
        float x = __ldcg(P.h + k) * inv * __ldg(P.norm_w + k);
        float m = scr_warp_max(fabsf(x)), d = m / 127.0f;
        float t = d > 0.0f ? fminf(fmaxf(rintf(x / d), -127.0f), 127.0f) : 0.0f;
        float e = x - d * t;
        xx += x * x, xe += e * e;
        xq[k] = (int8_t)(int)t;
        if (lane == 0)
            xs[k / 32] = d;
        if (blockIdx.x == 0)
            P.x[k] = x;
    }
    xx = block_sum(xx, red);
    xe = block_sum(xe, red);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        P.sc->xx = xx, P.sc->xe = xe;
    __syncthreads();
}

__device__ __forceinline__ int dp4a16(uint4 a, uint4 b)
{
    int t = __dp4a((int)a.x, (int)b.x, 0);
    t = __dp4a((int)a.y, (int)b.y, t);
    t = __dp4a((int)a.z, (int)b.z, t);
    return __dp4a((int)a.w, (int)b.w, t);
}

/* Rows r0 .. r0 + SCR_ROWS - 1: each lane takes 16-byte chunks lane and lane + 32 of each pass
 * of 1,024 columns (the scale of chunk c is block c / 2's, fetched once a pass by lane b and
 * handed round); the approximate logits go to approx, their largest to *best. */
__device__ __forceinline__ void screen_rows(const struct screen_params &P, int64_t r0, const int8_t *xq,
                                            const float *xs, float &best)
{
    const int K = P.K, lane = threadIdx.x & 31, nc = K / 16, nb = K / 32;
    float acc[SCR_ROWS];
#pragma unroll
    for (int r = 0; r < SCR_ROWS; r++)
        acc[r] = 0.0f;
    for (int p = 0; p < K; p += 1024) {
        const int c0 = p / 16 + lane, c1 = c0 + 32, b = p / 32 + lane;
        uint4 q0[SCR_ROWS], q1[SCR_ROWS];
        float d[SCR_ROWS];
#pragma unroll
        for (int r = 0; r < SCR_ROWS; r++) {
            const bool ok = r0 + r < P.N;
            const uint4 *row = (const uint4 *)(P.q + (r0 + r) * K);
            q0[r] = ok && c0 < nc ? __ldcs(row + c0) : make_uint4(0, 0, 0, 0);
            q1[r] = ok && c1 < nc ? __ldcs(row + c1) : make_uint4(0, 0, 0, 0);
            d[r] = ok && b < nb ? __half2float(P.s[(r0 + r) * nb + b]) : 0.0f;
        }
        const uint4 x0 = c0 < nc ? ((const uint4 *)xq)[c0] : make_uint4(0, 0, 0, 0);
        const uint4 x1 = c1 < nc ? ((const uint4 *)xq)[c1] : make_uint4(0, 0, 0, 0);
        const float s0 = c0 < nc ? xs[c0 / 2] : 0.0f, s1 = c1 < nc ? xs[c1 / 2] : 0.0f;
#pragma unroll
        for (int r = 0; r < SCR_ROWS; r++) {
            float d0 = __shfl_sync(0xffffffffu, d[r], lane / 2), d1 = __shfl_sync(0xffffffffu, d[r], 16 + lane / 2);
            acc[r] += (float)dp4a16(q0[r], x0) * (d0 * s0) + (float)dp4a16(q1[r], x1) * (d1 * s1);
        }
    }
#pragma unroll
    for (int r = 0; r < SCR_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < P.N) {
            P.approx[r0 + r] = v;
            if (v > best) /* NaN never wins */
                best = v;
        }
    }
}

__global__ void __launch_bounds__(SCR_THREADS) lm_screen_kernel(struct screen_params P)
{
    extern __shared__ __align__(16) unsigned char scr_smem[];
    __shared__ float red[32];
    int8_t *xq = (int8_t *)scr_smem;
    float *xs = (float *)(scr_smem + ((P.K + 15) & ~15));
    griddep_launch();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t first = ((int64_t)blockIdx.x * SCR_WARPS + warp) * SCR_ROWS;
    const int64_t stride = (int64_t)gridDim.x * SCR_WARPS * SCR_ROWS;
    /* the copy is never written: its first rows may be asked for before the wait */
    for (int r = 0; r < SCR_ROWS && first + r < P.N; r++)
        for (int c = lane; c < P.K / 16; c += 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(P.q + (first + r) * P.K + 16 * c));
    griddep_wait();
    screen_stage(P, xq, xs, red);
    float best = -INFINITY;
    for (int64_t r0 = first; r0 < P.N; r0 += stride)
        screen_rows(P, r0, xq, xs, best);
    __shared__ unsigned warp_best[SCR_WARPS];
    if (lane == 0)
        warp_best[warp] = best > -INFINITY ? ord_bits(best) : 0u;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned b = 0;
        for (int w = 0; w < SCR_WARPS; w++)
            b = max(b, warp_best[w]);
        P.block_max[blockIdx.x] = b;
        if (b)
            atomicMax(&P.sc->amax, b);
    }
}

/* ---- pick ---- */
struct pick_params {
    const float *approx, *x;
    const uint8_t *w;
    int32_t dtype;
    int64_t row_bytes;
    struct scr_scratch *sc;
    int32_t N, K;
    float E, W, gp;
    int32_t *ids, *pos0, *out_ids, *step;
    int32_t m;                  /* 0: the argmax; else the m best rows, ranked, then a draw */
    float temperature;          /* m > 0: the keys' order is logit / temperature's */
    float *logits;              /* m > 0: [N] the exact logit of every candidate row written */
    unsigned long long *cand;   /* m > 0: [N] the candidates' keys */
    const unsigned *block_max;  /* m > 0: the screen's block maxima */
    int32_t n_blocks;
    int32_t *top_ids;           /* m > 0: the m best, best first, and their exact logits */
    float *top_vals;
    const struct cuda_sample_params *sp; /* m > 0: the draw's sampler (NULL: rank only) */
    unsigned long long *stamps; /* lm_pick_kernel<true>: the phases' clocks (PICK_STAMPS) */
};

/* lm_pick_kernel<true>'s clock stamps (globaltimer ns), for a measurement of its phases
 * (cuda_lm_screen_phases): per block b, [3b] after the wait, [3b + 1] with the threshold
 * known, [3b + 2] with the block's exact rows done; the last block to arrive then stamps
 * [3 PICK_BLOCKS + 0] on arrival, + 1 with the m best selected, + 2 ranked, + 3 at its end. */
#define PICK_STAMPS (3 * PICK_BLOCKS + 4)
static_assert(PICK_STAMPS == LM_SCREEN_PICK_STAMPS, "lm_screen.cuh's count of the pick's stamps");
template <bool STAMPS>
__device__ __forceinline__ void pick_stamp(const struct pick_params &P, int i)
{
    if (STAMPS && threadIdx.x == 0)
        P.stamps[i] = globaltimer_ns();
}

/* A lower bound on the m-th largest approximate logit: the m-th largest of the screen's block
 * maxima (m blocks hold a value at least that large, each in a row of its own), by the radix
 * select over (maximum, block) keys; NaN where fewer than m blocks have one (then every row is
 * read exactly). Every thread gets it. */
__device__ float mth_block_max(const struct pick_params &P, unsigned long long *keys, unsigned long long *best,
                               struct topk_sel *st)
{
    __shared__ unsigned s_min;
    if (threadIdx.x == 0)
        s_min = 0xffffffffu;
    for (int i = threadIdx.x; i < P.n_blocks; i += blockDim.x)
        keys[i] = ((unsigned long long)__ldcg(P.block_max + i) << 32) | (0xffffffffu - (unsigned)i);
    __syncthreads();
    topk_block_select(keys, P.n_blocks, P.m, best, st); /* n_blocks >= m: lm_screen_best_limit */
    for (int i = threadIdx.x; i < P.m; i += blockDim.x)
        atomicMin(&s_min, (unsigned)(best[i] >> 32));
    __syncthreads();
    return s_min ? unord_bits(s_min) : NAN; /* 0: a block with no value among the m */
}

/* The sampled pick's last block: the m best of the n candidates' keys (n >= m: at least m
 * rows reach the threshold, see mth_block_max), PICK_CHUNK at a time into keys, ranked into
 * top_ids / top_vals (the exact logits the row holds for them), then the draw. */
template <bool STAMPS>
__device__ void pick_sample_last(const struct pick_params &P, int32_t n, unsigned long long *keys,
                                 unsigned long long *best, struct topk_sel *st)
{
    const int32_t m = P.m;
    int32_t kept = 0;
    for (int32_t c0 = 0; c0 < n;) {
        const int32_t take = min(PICK_CHUNK - kept, n - c0);
        for (int32_t i = threadIdx.x; i < take; i += blockDim.x)
            keys[kept + i] = __ldcg(P.cand + c0 + i);
        c0 += take, kept += take;
        __syncthreads();
        if (kept > m) {
            topk_block_select(keys, kept, m, best, st);
            for (int32_t i = threadIdx.x; i < m; i += blockDim.x)
                keys[i] = best[i];
            __syncthreads();
            kept = m;
        }
    }
    for (int32_t i = kept + threadIdx.x; i < m; i += blockDim.x)
        keys[i] = 0; /* never taken (n >= m); a padding key ranks last */
    __syncthreads();
    pick_stamp<STAMPS>(P, 3 * PICK_BLOCKS + 1);
    topk_write_ranked(keys, m, P.logits, P.top_ids, P.top_vals);
    if (STAMPS)
        __syncthreads();
    pick_stamp<STAMPS>(P, 3 * PICK_BLOCKS + 2);
    if (!P.sp)
        return;
    __syncthreads(); /* the ranked candidates are written (and best is free) */
    if (threadIdx.x < 32)
        sample_draw_warp(P.top_ids, P.top_vals, P.sp, P.ids, P.pos0, P.out_ids, P.step, (float *)best);
}

/* The exact logit of row j (the warp's f32 sums over the 16- or 32-bit row and x): each lane
 * takes 16 bytes of the row a pass, in order, with the loads of EX_PASSES passes issued before
 * the first is used (a row costs one memory round trip, not one a pass). */
#define EX_PASSES 4
__device__ float exact_logit(const struct pick_params &P, int64_t j)
{
    const int lane = threadIdx.x & 31;
    const uint8_t *row = P.w + j * P.row_bytes;
    float acc = 0.0f;
    if (P.dtype == QR_F32) {
        for (int k0 = 4 * lane; k0 < P.K; k0 += 128 * EX_PASSES) {
            float4 w[EX_PASSES], x[EX_PASSES];
#pragma unroll
            for (int u = 0; u < EX_PASSES; u++) {
                const int k = k0 + 128 * u;
                w[u] = k < P.K ? __ldg((const float4 *)(row + 4 * (int64_t)k)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                x[u] = k < P.K ? __ldcg((const float4 *)(P.x + k)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < EX_PASSES; u++)
                if (k0 + 128 * u < P.K)
                    acc += w[u].x * x[u].x + w[u].y * x[u].y + w[u].z * x[u].z + w[u].w * x[u].w;
        }
    } else {
        const bool bf = P.dtype == QR_BF16;
        for (int k0 = 8 * lane; k0 < P.K; k0 += 256 * EX_PASSES) {
            uint4 raw[EX_PASSES];
            float4 x0[EX_PASSES], x1[EX_PASSES];
#pragma unroll
            for (int u = 0; u < EX_PASSES; u++) {
                const int k = k0 + 256 * u;
                const bool in = k < P.K;
                raw[u] = in ? __ldg((const uint4 *)(row + 2 * (int64_t)k)) : make_uint4(0, 0, 0, 0);
                x0[u] = in ? __ldcg((const float4 *)(P.x + k)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                x1[u] = in ? __ldcg((const float4 *)(P.x + k + 4)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < EX_PASSES; u++) {
                if (k0 + 256 * u >= P.K)
                    break;
                const uint16_t *h = (const uint16_t *)&raw[u];
                const float xv[8] = {x0[u].x, x0[u].y, x0[u].z, x0[u].w, x1[u].x, x1[u].y, x1[u].z, x1[u].w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc += (bf ? bf16_bits_to_f32(h[e]) : f16_bits_to_f32(h[e])) * xv[e];
            }
        }
    }
    return warp_sum(acc);
}

/* One candidate row j by the calling warp: its exact logit, then (lane 0) into the m best's
 * list and the row, or into the argmax's key. */
__device__ __forceinline__ void take_row(const struct pick_params &P, int64_t j, unsigned long long &n_rows)
{
    const float v = exact_logit(P, j);
    n_rows++;
    if ((threadIdx.x & 31) != 0)
        return;
    if (P.m) /* a row ruled out (a < thr) is below the m-th best: unwritten */
        P.logits[j] = v, P.cand[atomicAdd(&P.sc->n_cand, 1u)] = topk_key(v, P.temperature, (int32_t)j);
    else if (v == v) /* (logit, lowest index) as one ordered key */
        atomicMax(&P.sc->key, ((unsigned long long)ord_bits(v) << 32) | (0xffffffffu - (unsigned)j));
}

template <bool STAMPS>
__global__ void __launch_bounds__(SCR_THREADS) lm_pick_kernel(struct pick_params P)
{
    extern __shared__ unsigned long long pick_keys[]; /* m > 0: the block maxima, then candidates */
    __shared__ unsigned long long s_best[TOPK_MAX_M];
    __shared__ struct topk_sel s_sel;
    __shared__ float s_thr;
    __shared__ bool s_last;
    __shared__ unsigned s_n, s_listed;
    __shared__ int32_t s_list[PICK_LIST];
    griddep_launch();
    griddep_wait();
    pick_stamp<STAMPS>(P, 3 * blockIdx.x);
    struct scr_scratch *sc = P.sc;
    /* the argmax: the largest approximate logit; the m best: a lower bound on the m-th largest */
    const float top = P.m ? mth_block_max(P, pick_keys, s_best, &s_sel)
                          : unord_bits(__ldcg(&sc->amax)); /* NaN: none */
    if (threadIdx.x == 0) {
        float nx = sqrtf(__ldcg(&sc->xx)) * 1.001f, ne = sqrtf(__ldcg(&sc->xe)) * 1.001f;
        float B = (nx * P.E + (ne + P.gp * (nx + ne)) * P.W) * 1.001f;
        float thr = top - 2.0f * B;
        s_thr = thr - 1e-6f * (fabsf(top) + 2.0f * B); /* the subtraction's rounding */
        s_listed = 0;
    }
    __syncthreads();
    pick_stamp<STAMPS>(P, 3 * blockIdx.x + 1);
    const float thr = s_thr; /* NaN: every row is read exactly */
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * SCR_WARPS * 32;
    unsigned long long n_rows = 0;
    /* the block's candidates go to s_list and are spread over its warps after the scan (one
     * warp finding several would read them one after another); past PICK_LIST, the warp that
     * finds one reads it at once */
    for (int64_t base = ((int64_t)blockIdx.x * SCR_WARPS + (threadIdx.x >> 5)) * 32; base < P.N; base += step) {
        const int64_t i = base + lane;
        const float a = i < P.N ? __ldcg(P.approx + i) : 0.0f;
        const bool cand = i < P.N && !(a < thr);
        const unsigned mask = __ballot_sync(0xffffffffu, cand);
        if (!mask)
            continue;
        unsigned first = 0;
        if (lane == 0)
            first = atomicAdd(&s_listed, (unsigned)__popc(mask));
        first = __shfl_sync(0xffffffffu, first, 0);
        const unsigned slot = first + (unsigned)__popc(mask & ((1u << lane) - 1u));
        if (cand && slot < PICK_LIST)
            s_list[slot] = (int32_t)i;
        for (unsigned over = __ballot_sync(0xffffffffu, cand && slot >= PICK_LIST); over; over &= over - 1)
            take_row(P, base + __ffs(over) - 1, n_rows);
    }
    __syncthreads();
    const int32_t n_listed = s_listed < PICK_LIST ? (int32_t)s_listed : PICK_LIST;
    for (int32_t c = threadIdx.x >> 5; c < n_listed; c += SCR_WARPS)
        take_row(P, s_list[c], n_rows);
    if (lane == 0 && n_rows)
        atomicAdd(&sc->rows, n_rows);
    __threadfence();
    __syncthreads();
    pick_stamp<STAMPS>(P, 3 * blockIdx.x + 2);
    if (threadIdx.x == 0)
        s_last = atomicAdd(&sc->count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    if (threadIdx.x == 0)
        s_n = atomicAdd(&sc->n_cand, 0u);
    __syncthreads();
    pick_stamp<STAMPS>(P, 3 * PICK_BLOCKS);
    if (threadIdx.x == 0) {
        sc->amax = 0, sc->count = 0, sc->n_cand = 0; /* ready for the next token */
        sc->picks++;
    }
    if (P.m) {
        pick_sample_last<STAMPS>(P, (int32_t)s_n, pick_keys, s_best, &s_sel);
        if (STAMPS)
            __syncthreads();
        pick_stamp<STAMPS>(P, 3 * PICK_BLOCKS + 3);
        return;
    }
    if (threadIdx.x != 0)
        return;
    unsigned long long key = atomicAdd(&sc->key, 0ull);
    sc->key = 0;
    int32_t id = key ? (int32_t)(0xffffffffu - (unsigned)(key & 0xffffffffu)) : 0; /* all NaN: 0, as argmax */
    P.ids[0] = id;
    if (P.step) {
        P.out_ids[*P.step] = id;
        (*P.step)++;
        (*P.pos0)++;
    }
    if (STAMPS) /* the greedy pick selects nothing: its phases after the arrival are its end */
        P.stamps[3 * PICK_BLOCKS + 1] = P.stamps[3 * PICK_BLOCKS + 2] = P.stamps[3 * PICK_BLOCKS + 3] =
            globaltimer_ns();
}

/* ---- host ---- */

bool lm_screen_applies(int32_t dtype, int32_t N, int32_t K, int64_t row_bytes, const void *w, const float *h,
                       const float *norm_w)
{
    int64_t eb = dtype == QR_F32 ? 4 : dtype == QR_F16 || dtype == QR_BF16 ? 2 : 0;
    return eb && N > 0 && K >= 32 && K % 32 == 0 && K <= LM_SCREEN_MAX_K && row_bytes == eb * K &&
           (uintptr_t)w % 16 == 0 && (uintptr_t)h % 16 == 0 && norm_w != NULL;
}

void lm_screen_copy_free(struct lm_screen_copy *c)
{
    if (!c)
        return;
    dev_free(c->allocs, c->q), dev_free(c->allocs, c->s);
    xfree(c);
}

static size_t screen_smem(int32_t K)
{
    return (size_t)((K + 15) & ~15) + (size_t)(K / 32) * sizeof(float);
}

/* The copy's rows and scales on the device and E, W measured (through a scratch of its own). */
static cudaError_t copy_rows(struct lm_screen_copy *c, const void *w, int32_t dtype, int64_t row_bytes,
                             cudaStream_t s)
{
    const int32_t N = c->N, K = c->K;
    struct scr_scratch *d_sc = NULL, host;
    cudaError_t e = dev_malloc(c->allocs, &c->q, (size_t)N * K);
    if (e == cudaSuccess)
        e = dev_malloc(c->allocs, &c->s, (size_t)N * (K / 32) * sizeof(__half));
    if (e == cudaSuccess)
        e = dev_malloc(c->allocs, &d_sc, sizeof(*d_sc));
    if (e == cudaSuccess)
        e = cudaMemsetAsync(d_sc, 0, sizeof(*d_sc), s);
    if (e == cudaSuccess) {
        lm_screen_build_kernel<<<BUILD_BLOCKS, SCR_THREADS, 0, s>>>((const uint8_t *)w, dtype, row_bytes, N, K, c->q,
                                                                    c->s, d_sc, (float)K * 0x1p-24f * 1.01f);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(&host, d_sc, sizeof(host), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    dev_free(c->allocs, d_sc);
    if (e == cudaSuccess) {
        memcpy(&c->E, &host.e_bits, sizeof(float));
        memcpy(&c->W, &host.w_bits, sizeof(float));
    }
    return e;
}

qwenrt_status lm_screen_copy_build(const void *w, int32_t dtype, int32_t N, int32_t K, int64_t row_bytes,
                                   struct cuda_alloc_count *allocs, cudaStream_t s, struct lm_screen_copy **out,
                                   struct qwenrt_error *err)
{
    *out = NULL;
    struct lm_screen_copy *c = (struct lm_screen_copy *)xcalloc(1, sizeof(*c));
    if (!c)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    c->N = N, c->K = K, c->rows = w, c->allocs = allocs;
    cudaError_t e = copy_rows(c, w, dtype, row_bytes, s);
    int dev = 0, n_sm = 0, per_sm = 0;
    if (e == cudaSuccess)
        e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lm_screen_kernel, SCR_THREADS, screen_smem(K));
    if (e != cudaSuccess) {
        lm_screen_copy_free(c);
        return cuda_fail(err, e, __FILE__, __LINE__, "the LM head's 8-bit copy");
    }
    c->screen_blocks = n_sm * (per_sm > 0 ? per_sm : 1);
    if (c->screen_blocks > PICK_CHUNK) /* the sampled pick holds every block's maximum */
        c->screen_blocks = PICK_CHUNK;
    if (!isfinite(c->E) || !isfinite(c->W)) {
        lm_screen_copy_free(c);
        return QWENRT_OK;
    }
    *out = c;
    return QWENRT_OK;
}

const void *lm_screen_copy_rows(const struct lm_screen_copy *c)
{
    return c->rows;
}

void lm_screen_free(struct lm_screen *sc)
{
    if (!sc)
        return;
    struct cuda_alloc_count *a = sc->allocs;
    dev_free(a, sc->approx), dev_free(a, sc->x), dev_free(a, sc->sc), dev_free(a, sc->block_max), dev_free(a, sc->cand);
    lm_screen_copy_free(sc->own);
    xfree(sc);
}

qwenrt_status lm_screen_attach(const struct lm_screen_copy *c, struct cuda_alloc_count *allocs, cudaStream_t s,
                               struct lm_screen **out, struct qwenrt_error *err)
{
    *out = NULL;
    struct lm_screen *sc = (struct lm_screen *)xcalloc(1, sizeof(*sc));
    if (!sc)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    sc->c = c, sc->allocs = allocs;
    cudaError_t e = dev_malloc(allocs, &sc->approx, (size_t)c->N * sizeof(float));
    if (e == cudaSuccess)
        e = dev_malloc(allocs, &sc->x, (size_t)c->K * sizeof(float));
    if (e == cudaSuccess)
        e = dev_malloc(allocs, &sc->cand, (size_t)c->N * sizeof(unsigned long long));
    if (e == cudaSuccess)
        e = dev_malloc(allocs, &sc->block_max, (size_t)c->screen_blocks * sizeof(unsigned));
    if (e == cudaSuccess)
        e = dev_malloc(allocs, &sc->sc, sizeof(*sc->sc));
    if (e == cudaSuccess)
        e = cudaMemsetAsync(sc->sc, 0, sizeof(*sc->sc), s);
    if (e != cudaSuccess) {
        lm_screen_free(sc);
        return cuda_fail(err, e, __FILE__, __LINE__, "the LM head screen's buffers");
    }
    *out = sc;
    return QWENRT_OK;
}

qwenrt_status lm_screen_build(const void *w, int32_t dtype, int32_t N, int32_t K, int64_t row_bytes,
                              cudaStream_t s, struct lm_screen **out, struct qwenrt_error *err)
{
    *out = NULL;
    struct lm_screen_copy *c = NULL;
    qwenrt_status st = lm_screen_copy_build(w, dtype, N, K, row_bytes, NULL, s, &c, err);
    if (st || !c)
        return st;
    if ((st = lm_screen_attach(c, NULL, s, out, err))) {
        lm_screen_copy_free(c);
        return st;
    }
    (*out)->own = c;
    return QWENRT_OK;
}

/* The screen, then the pick: the argmax (m 0) or the m best ranked (and the draw). */
static cudaError_t screen_and_pick(const struct lm_screen *sc, const struct lm_screen_args *a, int32_t m,
                                   const struct lm_screen_sampled *smp, cudaStream_t s)
{
    const struct lm_screen_copy *c = sc->c;
    struct screen_params sp = {a->h, a->norm_w, a->eps, c->q, c->s, sc->approx, sc->x, sc->block_max, sc->sc,
                               c->N, c->K};
    cudaError_t e = launch_k(a->pdl, lm_screen_kernel, dim3(c->screen_blocks), dim3(SCR_THREADS),
                             screen_smem(c->K), s, sp);
    if (e != cudaSuccess)
        return e;
    struct pick_params pp = {sc->approx, sc->x, (const uint8_t *)a->w, a->dtype, a->row_bytes, sc->sc, c->N, c->K,
                             c->E, c->W, (float)(c->K / 32 + 8) * 0x1p-24f * 1.1f,
                             a->ids, a->pos0, a->out_ids, a->step, m, smp ? smp->temperature : 1.0f,
                             smp ? smp->logits : NULL, sc->cand, sc->block_max, c->screen_blocks,
                             smp ? smp->top_ids : NULL, smp ? smp->top_vals : NULL, smp ? smp->sp : NULL,
                             a->stamps};
    const int32_t n_keys = c->screen_blocks > PICK_CHUNK ? c->screen_blocks : PICK_CHUNK;
    const size_t smem = m ? (size_t)n_keys * sizeof(unsigned long long) : 0;
    return a->stamps ? launch_k(a->pdl, lm_pick_kernel<true>, dim3(PICK_BLOCKS), dim3(SCR_THREADS), smem, s, pp)
                     : launch_k(a->pdl, lm_pick_kernel<false>, dim3(PICK_BLOCKS), dim3(SCR_THREADS), smem, s, pp);
}

cudaError_t launch_lm_screen(const struct lm_screen *sc, const struct lm_screen_args *a, cudaStream_t s)
{
    return screen_and_pick(sc, a, 0, NULL, s);
}

cudaError_t launch_lm_screen_sampled(const struct lm_screen *sc, const struct lm_screen_args *a,
                                     const struct lm_screen_sampled *smp, cudaStream_t s)
{
    const bool ok = smp && smp->m >= 1 && smp->m <= lm_screen_best_limit(sc) && smp->temperature > 0.0f &&
                    smp->logits && smp->top_ids && smp->top_vals && (!smp->sp || a->ids);
    return ok ? screen_and_pick(sc, a, smp->m, smp, s) : cudaErrorInvalidValue;
}

int32_t lm_screen_best_limit(const struct lm_screen *sc)
{
    const struct lm_screen_copy *c = sc->c;
    return c->screen_blocks < TOPK_MAX_M ? c->screen_blocks : TOPK_MAX_M;
}

qwenrt_status lm_screen_counts(const struct lm_screen *sc, int64_t *picks, int64_t *rows, struct qwenrt_error *err)
{
    struct scr_scratch host;
    CUDA_CHECK(cudaMemcpy(&host, sc->sc, sizeof(host), cudaMemcpyDeviceToHost));
    *picks = (int64_t)host.picks, *rows = (int64_t)host.rows;
    return QWENRT_OK;
}

void lm_screen_constants(const struct lm_screen *sc, float *E, float *W, int64_t *bytes)
{
    const struct lm_screen_copy *c = sc->c;
    *E = c->E, *W = c->W;
    *bytes = (int64_t)c->N * c->K + (int64_t)c->N * (c->K / 32) * 2;
}

void lm_screen_buffers(const struct lm_screen *sc, uint64_t addr[4])
{
    const struct lm_screen_copy *c = sc->c;
    addr[0] = (uint64_t)(uintptr_t)c->q, addr[1] = (uint64_t)(uintptr_t)c->s;
    addr[2] = (uint64_t)(uintptr_t)sc->approx, addr[3] = (uint64_t)(uintptr_t)sc->sc;
}
