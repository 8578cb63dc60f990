/*
 * attention_decode.cuh — the pieces of the decode attention that attention.cu's attention kernel
 * and attn_o.cu's fused attention + o product share: the launch constants (warps per block,
 * rows in flight), the q/k norm + RoPE + cache write prologue, the rounds of K/V rows each
 * warp loads before it uses them, and one round's dot products and online-softmax update
 * (attention_round). Moved here unchanged (the templates instantiate the same code in either
 * file).
 */
#ifndef QWENRT_BACKEND_CUDA_ATTENTION_DECODE_CUH
#define QWENRT_BACKEND_CUDA_ATTENTION_DECODE_CUH

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

/* -D overrides for bench/cuda_variant.sh */
#ifndef ATT_WARPS
#define ATT_WARPS 8
#endif
#ifndef ATT_U
#define ATT_U 4
#endif

/* The cache and the rows of this token that a block of the decode attention uses: the launch's
 * own (kc, vc, pos0, q, rk, rv), or with MS (attn_args.n_seq: several sessions in one launch)
 * session s's (attn_args.seq; its rows s row strides on). */
struct att_seq_view {
    const void *kc, *vc;
    const int32_t *pos;
    const float *q, *rk, *rv;
};
template <bool MS>
__device__ __forceinline__ struct att_seq_view attention_seq_of(const struct attn_args &a, int s)
{
    if (!MS)
        return {a.kc, a.vc, a.pos0, a.q, a.rk, a.rv};
    return {a.seq[s].kc, a.seq[s].vc, a.seq[s].pos, a.q + (int64_t)s * a.ldq, a.rk + (int64_t)s * a.ldrk,
            a.rv + (int64_t)s * a.ldrv};
}

/* The decode step's q/k norm + RoPE inside the attention kernel (ROPE, T = 1; a.rope): the
 * block's query head and its KV head, normalised and rotated exactly as qk_norm_rope_kernel
 * does (the same sums in the same order: bit-identical), into shared memory; the block whose
 * split holds the current position reads that position's K and V from there, and the group's
 * first head writes them to the cache. Saves the rope launch per layer. NQ > 1 (the shared-K/V
 * attention, attention_shared_kv.cu: 2; the staged attention, attention_staged.cu: up to 4;
 * the batched attention's pairs, attention_batch.cu: 2, MS):
 * the block's query heads h .. h + NQ - 1, head h + j (j >= 1) into r_q2 + (j - 1) hd by warp
 * 2 + j with warp 0's arithmetic. */
template <int EPL, typename KV, int NQ = 1, bool MS = false>
__device__ void attention_rope_prologue(const struct attn_args &a, int h, int kvh, int pos, bool has_pos,
                                        float *r_q, float *r_k, float *r_v, KV *r_k16, KV *r_v16, float *r_cs,
                                        float *r_sn, float *r_q2 = nullptr, int seq = 0)
{
    static_assert(NQ >= 1 && NQ <= ATT_WARPS - 2, "one query head per block, or one per warp from warp 3");
    const struct att_seq_view sv = attention_seq_of<MS>(a, seq);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = 32 * EPL, half = a.n_rot / 2;
    /* warp 0: q, 1: k (both normalised), 2: v; with NQ > 1, warps 3 .. NQ + 1: the other
     * queries. Every load of the warp (its row and its norm weights) is issued before the first
     * use, and before the RoPE angles' loads: one L2 round trip, not one per element a lane
     * reads */
    const bool q2 = NQ > 1 && warp >= 3 && warp < NQ + 2, active = warp < 3 || q2, normed = warp < 2 || q2;
    const float *src = q2 ? sv.q + (int64_t)(h + warp - 2) * a.q_stride
                          : warp == 0 ? sv.q + (int64_t)h * a.q_stride : (warp == 1 ? sv.rk : sv.rv) + (int64_t)kvh * hd;
    const float *w = warp == 0 || q2 ? a.wq : a.wk;
    float v[EPL], g[EPL];
    if (active)
#pragma unroll
        for (int j = 0; j < EPL; j++) {
            v[j] = src[lane + 32 * j];
            g[j] = normed ? w[lane + 32 * j] : 1.0f;
        }
    /* the angles on the warps that load nothing (from warp NQ + 2 on, where the block has
     * them), so that warps 0 and 1 go from their loads straight to the norms */
    const int t0 = (int)blockDim.x > 32 * (NQ + 2) ? 32 * (NQ + 2) : 0;
    for (int i = (int)threadIdx.x - t0; i >= 0 && i < half; i += (int)blockDim.x - t0) {
        double inv_freq = a.inv_freq ? a.inv_freq[i]
                                     : pow((double)a.theta, -2.0 * (double)i / (double)a.n_rot);
        double ang = (double)pos * inv_freq;
        ang -= rint(ang * 0.15915494309189535) * 6.283185307179586;
        sincosf((float)ang, &r_sn[i], &r_cs[i]);
    }
    if (active) {
        float *dst = q2 ? r_q2 + (warp - 3) * hd : warp == 0 ? r_q : warp == 1 ? r_k : r_v;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < EPL; j++)
            ss += v[j] * v[j];
        float scale = normed ? rsqrtf(warp_sum(ss) / (float)hd + a.eps) : 1.0f;
#pragma unroll
        for (int j = 0; j < EPL; j++)
            dst[lane + 32 * j] = normed ? v[j] * (scale * g[j]) : v[j];
    }
    __syncthreads();
    if (normed) {
        float *x = q2 ? r_q2 + (warp - 3) * hd : warp == 0 ? r_q : r_k, y[EPL];
#pragma unroll
        for (int j = 0; j < EPL; j++) {
            int d = lane + 32 * j;
            y[j] = x[d];
            if (d < a.n_rot) {
                int i = d < half ? d : d - half;
                y[j] = d < half ? x[d] * r_cs[i] - x[d + half] * r_sn[i] : x[d] * r_cs[i] + x[d - half] * r_sn[i];
            }
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < EPL; j++)
            x[lane + 32 * j] = y[j];
    }
    if (sizeof(KV) == 2 && warp >= 1 && warp < 3) { /* the current row as the cache holds it */
        const float *x = warp == 1 ? r_k : r_v;
        KV *xh = warp == 1 ? r_k16 : r_v16;
#pragma unroll
        for (int j = 0; j < EPL; j++)
            kv_put(xh + lane + 32 * j, x[lane + 32 * j]);
    }
    __syncthreads();
    if (has_pos && h % (a.n_head / a.n_head_kv) == 0) /* the session's cache: writable */
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            int64_t off = (int64_t)pos * a.kvw + (int64_t)kvh * hd + d;
            kv_put((KV *)sv.kc + off, r_k[d]);
            kv_put((KV *)sv.vc + off, r_v[d]);
        }
}

/* The same prologue in each warp's registers (cuda_options.attn_rope_regs): every warp loads
 * and normalises q itself, in the rounds' layout (lane l: elements l EPL .. l EPL + EPL - 1),
 * and rotates it with the partner element d +- n_rot / 2 from the lane hl = n_rot / 2 / EPL
 * away (one shuffle); no shared memory and no block barrier before the rounds. The warp whose
 * rounds hold the current position does the same for k (v as loaded), keeps that row for its
 * round and, in the group's first head, writes it to the cache. The angles and the norm
 * weights are read before the wait (they depend on the position only). The norm's sum runs in
 * another order than qk_norm_rope_kernel's: equal to rounding, not bit for bit. */
template <int EPL>
struct att_rope_regs {
    float cs[EPL], sn[EPL], wq[EPL], wk[EPL];
};

/* The angles one per thread into r_cs / r_sn (n_rot / 2 of them, as the shared prologue
 * computes them), a block barrier, then each lane's EPL into registers: all before the wait. */
template <int EPL>
__device__ __forceinline__ void attention_rope_regs_before(const struct attn_args &a, int pos, float *r_cs,
                                                           float *r_sn, att_rope_regs<EPL> &t)
{
    const int lane = threadIdx.x & 31, half = a.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq = a.inv_freq ? a.inv_freq[i] : pow((double)a.theta, -2.0 * (double)i / (double)a.n_rot);
        double ang = (double)pos * inv_freq;
        ang -= rint(ang * 0.15915494309189535) * 6.283185307179586;
        sincosf((float)ang, &r_sn[i], &r_cs[i]);
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int d = lane * EPL + e;
        t.wq[e] = a.wq[d];
        t.wk[e] = a.wk[d];
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int d = lane * EPL + e, i = d < half ? d : d - half;
        bool rot = d < a.n_rot;
        t.cs[e] = rot ? r_cs[i] : 1.0f;
        t.sn[e] = rot ? r_sn[i] : 0.0f;
    }
}

/* One head's row at src into v (the lane's elements): normalised with weights w and rotated
 * when normed (q, k), as loaded otherwise (v). */
template <int EPL>
__device__ __forceinline__ void attention_rope_regs_row(const struct attn_args &a, const float *src, bool normed,
                                                        const float (&w)[EPL], const att_rope_regs<EPL> &t,
                                                        float (&v)[EPL])
{
    const int lane = threadIdx.x & 31, half = a.n_rot / 2, hl = half / EPL;
#pragma unroll
    for (int e = 0; e < EPL; e += 2) {
        float2 p = *(const float2 *)(src + lane * EPL + e);
        v[e] = p.x, v[e + 1] = p.y;
    }
    if (!normed)
        return;
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        ss += v[e] * v[e];
    float scale = rsqrtf(warp_sum(ss) / (float)(32 * EPL) + a.eps);
#pragma unroll
    for (int e = 0; e < EPL; e++)
        v[e] = v[e] * (scale * w[e]);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        float p = __shfl_xor_sync(0xffffffffu, v[e], hl);
        int d = lane * EPL + e;
        if (d < a.n_rot)
            v[e] = d < half ? v[e] * t.cs[e] - p * t.sn[e] : v[e] * t.cs[e] + p * t.sn[e];
    }
}

/* Which rows attention_load_round reads: every one (the current position's from shared
 * memory), the cached ones only, or the current position's only. */
enum { ATT_ROWS_ALL, ATT_ROWS_CACHED, ATT_ROWS_CURRENT };

/* A lane's K and V elements of a round's U rows: f32 as loaded, or an f16 cache's raw words,
 * each converted where it is used (half the registers of floats, and every row's load issued
 * before the first conversion: a conversion right after its load made the next row's load wait,
 * perf-log session 15). */
template <typename KV, int U, int EPL>
struct att_rows {
    float k[U][EPL], v[U][EPL];
    __device__ __forceinline__ void load(int u, const float *kp, const float *vp)
    {
        kv_get<EPL>(kp, k[u]);
        kv_get<EPL>(vp, v[u]);
    }
    /* row u from words loaded elsewhere (attention_batch.cu's read-only loads) */
    __device__ __forceinline__ void set_raw(int u, const uint32_t (&wk)[EPL], const uint32_t (&wv)[EPL])
    {
#pragma unroll
        for (int e = 0; e < EPL; e++)
            k[u][e] = __uint_as_float(wk[e]), v[u][e] = __uint_as_float(wv[e]);
    }
    __device__ __forceinline__ float K(int u, int e) const { return k[u][e]; }
    __device__ __forceinline__ float V(int u, int e) const { return v[u][e]; }
};

template <int U, int EPL>
struct att_rows<__half, U, EPL> {
    uint32_t k[U][EPL / 2], v[U][EPL / 2];
    __device__ __forceinline__ void load(int u, const __half *kp, const __half *vp)
    {
        kv_load_raw<EPL>(kp, k[u]);
        kv_load_raw<EPL>(vp, v[u]);
    }
    __device__ __forceinline__ void set_raw(int u, const uint32_t (&wk)[EPL / 2], const uint32_t (&wv)[EPL / 2])
    {
#pragma unroll
        for (int e = 0; e < EPL / 2; e++)
            k[u][e] = wk[e], v[u][e] = wv[e];
    }
    static __device__ __forceinline__ float half_of(uint32_t w, int e)
    {
        return __half2float(__ushort_as_half((unsigned short)(e & 1 ? w >> 16 : w & 0xffffu)));
    }
    __device__ __forceinline__ float K(int u, int e) const { return half_of(k[u][e / 2], e); }
    __device__ __forceinline__ float V(int u, int e) const { return half_of(v[u][e / 2], e); }
};

/* Rows per warp in flight per round: ATT_U for an f32 cache, ATT_U16 for f16 (its rows take
 * half the registers). H200, Qwen3-0.6B BF16 with the f16 cache, 4 / 8 rows: depth 0 1,439 /
 * 1,546 tok/s, depth 4,096 990 / 936, depth 16,000 568 / 577 (f32 cache: 1,533, 868, 485);
 * Qwen3.5-0.8B level (perf-log session 15). ATT_U = 8 for f32 lost at depth. */
#ifndef ATT_U16
#define ATT_U16 8
#endif
template <typename KV>
__host__ __device__ constexpr int att_u() { return sizeof(KV) == 2 ? ATT_U16 : ATT_U; }

/* One round of a warp's K and V rows: positions p0 + u * ATT_WARPS (u < U, clamped to last: a
 * valid row, masked by the caller), the lane's EPL elements of each, as 16-byte words (8-byte
 * below: Qwen3.5 +0.7%, perf-log session 10). With ROPE the current position pos is not in the
 * cache yet: its rows come from the prologue's copy in shared memory (in the cache's type). */
template <int EPL, bool ROPE, typename KV, int U>
__device__ __forceinline__ void attention_load_round(const KV *kbase, const KV *vbase, int64_t kvw,
                                                     int p0, int last, int pos, const KV *rk,
                                                     const KV *rv, int rows, att_rows<KV, U, EPL> &r)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int p = p0 + u * ATT_WARPS, pc = p <= last ? p : last;
        bool current = ROPE && pc == pos;
        if ((rows == ATT_ROWS_CACHED && current) || (rows == ATT_ROWS_CURRENT && !current))
            continue;
        /* one load through either address */
        r.load(u, current ? rk + lane * EPL : kbase + (int64_t)pc * kvw,
               current ? rv + lane * EPL : vbase + (int64_t)pc * kvw);
    }
}

/* e^x for the online softmax's weights: __expf's arithmetic (x times log2(e) in f32, then the
 * MUFU's 2^t) with results below 2^-126 flushed to zero, so without __expf's fix-up for
 * subnormal results (a compare and two predicated multiplies around every MUFU: 6 instructions
 * an exp, now 2). The same bits as __expf wherever x log2(e) >= -126 (weights from 2^-126 up;
 * test_device_helpers); a weight below that adds nothing a float sum of weights near 1 can
 * hold. Every row update of the decode attention
 * (attention_row_update, attention_batch.cu's) and every split's end (attention_split_weights)
 * uses it, so a session's sums stay bit for bit the same batched or alone. */
__device__ __forceinline__ float att_exp(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* The end of a split (attention_kernel's and attention_batch.cu's, so that a session's sums stay
 * bit for bit the same batched or alone): the warps' maxima m[w] (shared memory) merged into M,
 * each warp's weight f[w] = e^(m[w] - M) (0 for a warp that had no rows) computed once, by lane
 * w of every group of ATT_WARPS lanes, and passed to the other lanes by shuffles, and L the
 * warps' sums l[w] weighted in warp order. Every thread used to compute all ATT_WARPS weights
 * with __expf and its -inf test (15% of the grouped batched attention's instructions,
 * docs/perf-log.md session 45). All 32 lanes of the warp must call it. */
__device__ __forceinline__ void attention_split_weights(const float *m, const float *l, float &M, float &L,
                                                        float (&f)[ATT_WARPS])
{
    static_assert(ATT_WARPS <= 32 && (ATT_WARPS & (ATT_WARPS - 1)) == 0, "warps a block: a power of two up to 32");
    const int lane = threadIdx.x & 31;
    const float mine = m[lane % ATT_WARPS];
    float mx = mine;
#pragma unroll
    for (int o = ATT_WARPS / 2; o > 0; o >>= 1) /* within each group of ATT_WARPS lanes: every lane's max */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    M = mx;
    const float fw = mine == -INFINITY ? 0.0f : att_exp(mine - M);
    L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = __shfl_sync(0xffffffffu, fw, w);
        L += l[w] * f[w];
    }
}

/* Row u of a round (its score dot) into the online softmax (m, l) and the output acc: the
 * running max, the rescale of what is summed so far, the row's weight times its V elements. */
template <int EPL, typename KV, int U>
__device__ __forceinline__ void attention_row_update(const att_rows<KV, U, EPL> &rw, int u, float dot, float &m,
                                                     float &l, float (&acc)[EPL])
{
    float m_new = fmaxf(m, dot), corr = att_exp(m - m_new), pw = att_exp(dot - m_new);
    l = l * corr + pw;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        acc[e] = acc[e] * corr + pw * rw.V(u, e);
    m = m_new;
}

/* warp_sum of each of N values (N a power of two, at most 32), every lane getting every sum,
 * in about half warp_sum's shuffles and adds: each level of warp_sum's butterfly (lanes 16,
 * 8, 4, ... apart) halves the values a lane still carries — it keeps one half, sends its
 * partner the other, and adds the partner's half of the same values to its own — until one is
 * left, whose remaining levels are warp_sum's; then each sum is read from the lane that holds
 * it. Every addition is one of warp_sum's (a lane's partial plus its partner's over the same
 * lanes: the same operands, and float addition commutes), so the sums are warp_sum's bit for
 * bit. N = 8 values: 40 shuffles, adds and selects against warp_sum's 80 (attention_round's
 * dots, attention_batch.cu's). */
template <int N>
__device__ __forceinline__ void warp_sum_each(float (&v)[N])
{
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "warp_sum_each: a power of two up to 32 values");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16, n = N; o > 0; o >>= 1, n = n > 1 ? n / 2 : 1) {
        if (n > 1) {
            const bool upper = lane & o; /* keeps the upper half of what it carries */
#pragma unroll
            for (int j = 0; j < n / 2; j++) {
                const float keep = upper ? v[j + n / 2] : v[j], send = upper ? v[j] : v[j + n / 2];
                v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
    if constexpr (N > 1) {
        const float mine = v[0];
        /* value i is held by the lanes whose bits 4, 3, ... (log2 N of them) spell i */
#pragma unroll
        for (int i = 0; i < N; i++) {
            int src = 0;
#pragma unroll
            for (int b = 0, n = N / 2, o = 16; n >= 1; b++, n /= 2, o >>= 1)
                src |= (i & n) ? o : 0;
            v[i] = __shfl_sync(0xffffffffu, mine, src);
        }
    }
}

/* One round of a warp's rows (positions p0 + u ATT_WARPS, u < U; those past last masked) into
 * the online softmax (m, l) and the output acc (attention_kernel's loops, attn_o.cu's). */
template <int EPL, typename KV, int U>
__device__ __forceinline__ void attention_round(const att_rows<KV, U, EPL> &rw, const float (&q)[EPL], int p0,
                                                int last, float &m, float &l, float (&acc)[EPL])
{
    float dot[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            d += q[e] * rw.K(u, e);
        dot[u] = d;
    }
    warp_sum_each(dot);
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (p0 + u * ATT_WARPS > last)
            break;
        attention_row_update(rw, u, dot[u], m, l, acc);
    }
}

/* attention_splits (cuda_internal.cuh): the splits in use at a position; then split z's range: */
__device__ __forceinline__ void attention_split_range(int S, int z, int *lo, int *last)
{
    int chunk = (*last + S) / S;
    *lo = z * chunk;
    *last = min(*last, *lo + chunk - 1);
}

/* After a split's partial result is written (every thread's stores): whether this block is the
 * last of head h's S splits to arrive, and so merges them; that block resets the head's counter
 * for the next step. */
__device__ __forceinline__ bool attention_split_arrive(const struct attn_args &a, int h, int S)
{
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned prev = atomicAdd(a.count + h, 1u);
        s_last = prev == (unsigned)S - 1;
        if (s_last)
            a.count[h] = 0; /* every split has arrived: ready for the next step */
    }
    __syncthreads();
    return s_last;
}

/* Merges the n partial results of head h (the last block of the head runs it; part rows are
 * stride floats apart; attention.cu's attention and attention_shared_kv.cu's): out = the
 * rescaled sum of the partial outputs over the rescaled sum of the partial sums. Every load of a pass is issued at once (the loops are unrolled to
 * ATT_MAX_SPLITS): a merge is a few L2 round trips, not one per split. */
template <int EPL>
__device__ void attention_merge(const struct attn_args &a, const float *part, int64_t stride,
                                int n, float *op, const float *gp)
{
    const int hd = 32 * EPL;
    __shared__ float s_f[ATT_MAX_SPLITS], s_inv;
    if (threadIdx.x < 32) {
        int s = threadIdx.x;
        float ms = s < n ? __ldcg(part + s * stride) : -INFINITY;
        float ls = s < n ? __ldcg(part + s * stride + 1) : 0.0f;
        float M = ms;
        for (int o = 16; o > 0; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float f = ms == -INFINITY ? 0.0f : __expf(ms - M);
        float L = warp_sum(ls * f);
        if (s < ATT_MAX_SPLITS)
            s_f[s] = f;
        if (s == 0)
            s_inv = 1.0f / L;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int s = 0; s < ATT_MAX_SPLITS; s++)
            if (s < n)
                o += __ldcg(part + s * stride + 2 + d) * s_f[s];
        o *= s_inv;
        if (a.gate)
            o *= sigmoid_f(gp[d]);
        op[d] = o;
    }
}

#endif
