/*
 * attention.cu — the attention op's kernels (kernels_ref.c's attention): the decode kernel,
 * attention_kernel (one block of ATT_WARPS warps per query head, token and split of the keys,
 * its splits merged by the last block; as a cluster of 8 merged through distributed shared
 * memory with attn_args.cluster_merge; one launch for several sessions with attn_args.n_seq),
 * and the prompt's tiled kernel (one block per query head and tile of queries).
 * launch_attention picks among them and the decode variants of attention_lanes.cu,
 * attention_staged.cu and attention_shared_kv.cu (attention_decode.cuh has what they share);
 * the prompt's flash and GEMM forms are attention_flash.cu and attention_gemm.cu.
 *
 * Numerics: f32 everywhere; softmax is the online form (running max and sum per warp, merged
 * across warps), which equals the two-pass reference up to f32 rounding.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

/* ---- attention: one block of ATT_WARPS warps per (query head, token, split) ----
 * Lane l holds dims [l*EPL, l*EPL+EPL) of q and of its running output; warp w visits positions
 * lo+w, lo+w+ATT_WARPS, ... <= hi, ATT_U of them per step with all their K/V loads issued
 * before the first use (decode is latency-bound: one HBM round trip per step, not per
 * position; with attn_pipe, the default, two steps in flight: attention_pipe_rounds), with an
 * online softmax (running max m, sum l); the warps' partial results are
 * merged through shared memory at the end. K/V rows are read as EPL contiguous floats per
 * lane: a warp reads one whole row, coalesced.
 * Split-K (flash decoding, gridDim.z = S > 1; T = 1): the positions 0..pos are cut into S
 * equal ranges, one block each, so that a long context occupies S x n_head blocks instead of
 * n_head (16 blocks walking 512 positions took ~60 us per layer). Each block writes its
 * (max, sum, unnormalised output) to a.part; the last block of a head to finish (a counter per
 * head, reset by that block for the next replay) merges the S partials and writes the output.
 * The range is computed on the device from *pos0, so one captured graph serves every
 * position. */


/* The CL merge: this block's partial result (max M, sum L, the warps' outputs s_acc rescaled
 * by f) into its shared memory; after a cluster barrier block z writes dimensions
 * [z hd / n, (z+1) hd / n) of the output, merged over the n blocks in rank order (an empty
 * split: M = -inf, weight 0); a second barrier keeps each block's partial alive until its
 * peers have read it. */
template <int EPL>
__device__ __forceinline__ void attention_cluster_merge(const struct attn_args &a, const float (*s_acc)[32 * EPL],
                                        const float *f, float M, float L, float *op, const float *gp)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int hd = 32 * EPL;
    __shared__ float c_part[hd], c_ml[2], c_f[ATT_CL_SPLITS], c_inv;
    cg::cluster_group cl = cg::this_cluster();
    const int n = (int)cl.num_blocks(), z = (int)cl.block_rank(), lane = threadIdx.x & 31;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += s_acc[w][d] * f[w];
        c_part[d] = o;
    }
    if (threadIdx.x == 0)
        c_ml[0] = M, c_ml[1] = L;
    cl.sync();
    if (threadIdx.x < 32) {
        float mj = lane < n ? *cl.map_shared_rank(&c_ml[0], lane) : -INFINITY;
        float lj = lane < n ? *cl.map_shared_rank(&c_ml[1], lane) : 0.0f;
        float Mx = mj;
        for (int o = 16; o > 0; o >>= 1)
            Mx = fmaxf(Mx, __shfl_xor_sync(0xffffffffu, Mx, o));
        float fj = mj == -INFINITY ? 0.0f : __expf(mj - Mx);
        float Lx = warp_sum(lj * fj);
        if (lane < ATT_CL_SPLITS)
            c_f[lane] = fj;
        if (lane == 0)
            c_inv = 1.0f / Lx;
    }
    __syncthreads();
    const int per = hd / n;
    if ((int)threadIdx.x < per) {
        int d = z * per + threadIdx.x;
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_CL_SPLITS; j++)
            if (j < n)
                o += *cl.map_shared_rank(&c_part[d], j) * c_f[j];
        o *= c_inv;
        if (a.gate)
            o *= sigmoid_f(gp[d]);
        op[d] = o;
    }
    cl.sync();
#endif
}

/* PIPE's loop over a warp's rounds from p0: r0 and r1 hold the first two rounds' cached rows
 * (requested before the wait; the current position's row is taken from shared memory here),
 * and each buffer is refilled with the round two ahead right after its use, so a round's loads
 * are in flight during the other buffer's arithmetic. The same rounds in the same order as the
 * one-round loop (attn_pipe -1): the same sums, bit for bit (test_graph_attn_pipe). */
template <int EPL, bool ROPE, typename KV, int U>
__device__ __forceinline__ void attention_pipe_rounds(const KV *kbase, const KV *vbase, int64_t kvw, int p0, int last,
                                                      int pos, const KV *cur_k, const KV *cur_v, const float (&q)[EPL],
                                                      att_rows<KV, U, EPL> &r0, att_rows<KV, U, EPL> &r1, float &m,
                                                      float &l, float (&acc)[EPL])
{
    constexpr int STEP = ATT_WARPS * U;
    attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r0);
    attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + STEP, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r1);
    for (; p0 <= last; p0 += 2 * STEP) {
        attention_round<EPL, KV, U>(r0, q, p0, last, m, l, acc);
        if (p0 + 2 * STEP <= last)
            attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + 2 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r0);
        if (p0 + STEP > last)
            break;
        attention_round<EPL, KV, U>(r1, q, p0 + STEP, last, m, l, acc);
        if (p0 + 3 * STEP <= last)
            attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + 3 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r1);
    }
}

/* TL: the decode timeline's variant (a.stamps written; cuda_session_timeline). A separate
 * instantiation, so that the kernel the decode runs is the one without them: compiled into
 * it, the stamps changed its register allocation (90 -> 80) and Qwen3-0.6B BF16 measured
 * 3.7% slower (docs/perf-log.md, session 20). */
/* CL (cuda_options.attn_cluster, T = 1, sm_90): the splits of a head are one cluster of
 * ATT_CL_SPLITS blocks (grid: splits along x, heads along y) and merge through distributed
 * shared memory after a cluster barrier, each block its share of the dimensions, instead of
 * the last block reading every split's partial back from global memory. Another
 * instantiation: the default kernel's code stays as measured. */
/* PIPE (cuda_options.attn_pipe, T = 1, ROPE): two rounds of cached rows requested before the
 * wait instead of one, and in the loop each round's registers refilled with the round after
 * next as soon as they are used (attention_pipe_rounds): a warp's second round no longer waits
 * for a round trip after the first one's arithmetic. Another instantiation; the default since
 * session 27 (Qwen3-0.6B BF16 tg128 +3.0%, docs/perf-log.md). */
/* RREG (cuda_options.attn_rope_regs, ROPE): the q/k norm + RoPE in each warp's registers
 * (attention_rope_regs_row): no shared-memory copies of q, k, v and no block barrier between
 * the wait and the rounds. Another instantiation. */
/* MS (attn_args.n_seq, ROPE, not CL or RREG): one launch for several sessions, blockIdx.y
 * (t) the session: its rows, cache and position (attention_seq_of), its splits' partials and
 * counter at head t n_head + h. Another instantiation. */
template <int EPL, bool ROPE, typename KV, bool TL = false, bool CL = false, bool PIPE = false, bool RREG = false,
          bool MS = false>
__global__ void __launch_bounds__(32 * ATT_WARPS) attention_kernel(const __grid_constant__ struct attn_args a)
{
    static_assert(!MS || (ROPE && !CL && !RREG), "the multi-session form: RoPE inside, splits merged by the last");
    if (TL)
        tl_stamp(a.stamps, 0);
    griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before any wait) */
    if (!a.early) /* a.early: the position and the cached rows are read before the wait (below) */
        griddep_wait();
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * EPL];
    __shared__ __align__(16) float r_q[ROPE ? 32 * EPL : 4], r_k[ROPE ? 32 * EPL : 4], r_v[ROPE ? 32 * EPL : 4];
    __shared__ float r_cs[ROPE ? 16 * EPL : 1], r_sn[ROPE ? 16 * EPL : 1];
    /* the current row in the cache's type (an f16 cache: rounded copies; f32: r_k, r_v) */
    __shared__ __align__(16) KV r_k16[ROPE && sizeof(KV) == 2 ? 32 * EPL : 8], r_v16[ROPE && sizeof(KV) == 2 ? 32 * EPL : 8];
    /* RREG: each warp's own copy of the current row (only the warp whose rounds hold it fills it) */
    __shared__ __align__(16) KV s_cur[RREG ? 2 * ATT_WARPS : 1][RREG ? 32 * EPL : 8];
    const KV *cur_k = RREG ? s_cur[RREG ? 2 * (threadIdx.x >> 5) : 0] : sizeof(KV) == 2 ? r_k16 : (const KV *)r_k;
    const KV *cur_v = RREG ? s_cur[RREG ? 2 * (threadIdx.x >> 5) + 1 : 0] : sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    int h = CL ? blockIdx.y : blockIdx.x, t = CL ? 0 : blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int z = CL ? blockIdx.x : blockIdx.z, nz = CL ? gridDim.x : gridDim.z;
    const struct att_seq_view sv = attention_seq_of<MS>(a, t);
    int hd = 32 * EPL, kvh = h / (a.n_head / a.n_head_kv), pos = MS ? *sv.pos : *a.pos0 + t, last = pos;
    const int ph = MS ? t * a.n_head + h : h; /* the head's partials and counter */
    int S = min(attention_splits(a, last, a.nominal_splits > 0 ? a.nominal_splits : nz), nz);
    if (CL && S > 1)
        S = nz; /* every block of the cluster meets at its barrier (a split may be empty) */
    if (z >= S)
        return; /* a short context: this split has no positions and takes no part */
    int lo;
    attention_split_range(S, z, &lo, &last); /* this split's positions lo..last */
    const KV *kbase = (const KV *)sv.kc + (int64_t)kvh * hd + lane * EPL;
    const KV *vbase = (const KV *)sv.vc + (int64_t)kvh * hd + lane * EPL;
    /* the first round's cached rows load before the prologue: their addresses do not depend
     * on it, so their L2 round trip overlaps the prologue's */
    constexpr int U = att_u<KV>();
    att_rows<KV, U, EPL> rw;
    attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, ATT_ROWS_CACHED, rw);
    att_rows<KV, PIPE ? U : 1, EPL> rw2; /* PIPE: the second round */
    if constexpr (PIPE)
        attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, lo + warp + ATT_WARPS * U, last, pos, cur_k, cur_v,
                                        ATT_ROWS_CACHED, rw2);
    att_rope_regs<EPL> rt; /* RREG: the angles and norm weights, before the wait */
    if constexpr (RREG)
        attention_rope_regs_before<EPL>(a, pos, r_cs, r_sn, rt);
    if (a.early) /* q, k and v of this token come from the launch before */
        griddep_wait();
    if (TL)
        tl_stamp(a.stamps, 1);
    float q[EPL], acc[EPL];
    if constexpr (RREG) {
        attention_rope_regs_row<EPL>(a, a.q + (int64_t)h * a.q_stride, true, rt.wq, rt, q);
        if (last == pos && warp == (pos - lo) % ATT_WARPS) { /* this warp's rounds hold pos */
            float kr[EPL], vr[EPL];
            attention_rope_regs_row<EPL>(a, a.rk + (int64_t)kvh * hd, true, rt.wk, rt, kr);
            attention_rope_regs_row<EPL>(a, a.rv + (int64_t)kvh * hd, false, rt.wk, rt, vr);
            const bool writes = h % (a.n_head / a.n_head_kv) == 0; /* the session's cache */
            const int64_t off = (int64_t)pos * a.kvw + (int64_t)kvh * hd + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                kv_put(&s_cur[2 * warp][lane * EPL + e], kr[e]);
                kv_put(&s_cur[2 * warp + 1][lane * EPL + e], vr[e]);
                if (writes) {
                    kv_put((KV *)a.kc + off + e, kr[e]);
                    kv_put((KV *)a.vc + off + e, vr[e]);
                }
            }
            __syncwarp();
        }
    } else {
        if (ROPE)
            attention_rope_prologue<EPL, KV, 1, MS>(a, h, kvh, pos, last == pos, r_q, r_k, r_v, r_k16, r_v16, r_cs,
                                                    r_sn, nullptr, t);
        const float *qp = ROPE ? r_q + lane * EPL : a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            q[e] = qp[e];
    }
    if (TL) /* the time line's third stamp: q, k and v normalised, rotated and cached */
        tl_stamp(a.stamps, 2);
    float scale = rsqrtf((float)hd);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] *= scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    if constexpr (PIPE)
        attention_pipe_rounds<EPL, ROPE, KV, U>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, q, rw, rw2,
                                                m, l, acc);
    for (int p0 = lo + warp; !PIPE && p0 <= last; p0 += ATT_WARPS * U) {
        attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, p0, last, pos, cur_k, cur_v,
                                        p0 == lo + warp ? ATT_ROWS_CURRENT : ATT_ROWS_ALL, rw);
        attention_round<EPL, KV, U>(rw, q, p0, last, m, l, acc);
    }
    /* the output gate of this thread's first dimension (Qwen3.5), requested before the
     * warps' merge rather than after it */
    const float *gp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + hd;
    float g0 = a.gate && (int)threadIdx.x < hd ? gp[threadIdx.x] : 0.0f;
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    float M, L, f[ATT_WARPS];
    attention_split_weights(s_m, s_l, M, L, f);
    float *op = a.out + (int64_t)t * a.ldo + (int64_t)h * hd;
    if (CL && S > 1) {
        attention_cluster_merge<EPL>(a, s_acc, f, M, L, op, gp);
        if (TL)
            tl_stamp(a.stamps, 3);
        return;
    }
    if (S > 1) { /* this split's partial result, then the last block of the head merges */
        float *part = a.part + ((int64_t)ph * gridDim.z + blockIdx.z) * (hd + 2);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++)
                o += s_acc[w][d] * f[w];
            part[2 + d] = o;
        }
        if (threadIdx.x == 0)
            part[0] = M, part[1] = L;
        if (!attention_split_arrive(a, ph, S)) {
            if (TL)
                tl_stamp(a.stamps, 3);
            return;
        }
        __threadfence();
        attention_merge<EPL>(a, a.part + (int64_t)ph * gridDim.z * (hd + 2), hd + 2, S, op, gp);
        if (TL)
            tl_stamp(a.stamps, 3);
        return;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += s_acc[w][d] * f[w];
        o /= L;
        if (a.gate)
            o *= sigmoid_f(d == (int)threadIdx.x ? g0 : gp[d]);
        op[d] = o;
    }
    if (TL)
        tl_stamp(a.stamps, 3);
}

/* ---- attention for prefill (T > 1): one block of ATT_TW warps per (query head, tile of
 * ATT_TW * ATT_QPW tokens) ----
 * K and V rows are staged ATT_BK at a time in shared memory and shared by the block's queries
 * (the per-token kernel above re-reads every row from L2 for every query: ~2 GB per layer at
 * T = 512). Warp w owns ATT_QPW queries; lane l holds dims [l*EPL, l*EPL+EPL) of each query and
 * of its output. For each staged row j the warp reduces the dot product and lane j keeps the
 * score, so the online-softmax update (max, exps, sum) runs once per ATT_BK rows with the
 * exps spread across lanes; then the rows' V are accumulated with the probabilities
 * broadcast by shuffles. Same softmax as the reference up to f32 rounding. */

#define ATT_TW 4
#define ATT_QPW 4
#define ATT_BK 32

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int EPL, typename KV>
__global__ void __launch_bounds__(32 * ATT_TW)
    attention_tiled_kernel(const __grid_constant__ struct attn_args a)
{
    extern __shared__ float4 att_sm4[];
    griddep_launch();
    griddep_wait();
    constexpr int HD = 32 * EPL;
    float *ks = (float *)att_sm4, *vs = ks + ATT_BK * HD;
    int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (a.n_head / a.n_head_kv), pos0 = *a.pos0;
    int t0 = blockIdx.y * (ATT_TW * ATT_QPW), tw = t0 + warp * ATT_QPW;
    float scale = rsqrtf((float)HD);
    float q[ATT_QPW][EPL], acc[ATT_QPW][EPL], m[ATT_QPW], l[ATT_QPW];
#pragma unroll
    for (int qi = 0; qi < ATT_QPW; qi++) {
        int t = min(tw + qi, a.T - 1);
        const float *qp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            q[qi][e] = qp[e] * scale;
            acc[qi][e] = 0.0f;
        }
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
    }
    int last_block = pos0 + min(t0 + ATT_TW * ATT_QPW, a.T) - 1;
    int last_warp = pos0 + min(tw + ATT_QPW, a.T) - 1;
    for (int kt = 0; kt <= last_block; kt += ATT_BK) {
        int nrow = min(ATT_BK, last_block - kt + 1);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = threadIdx.x; i < nrow * (HD / 4); i += blockDim.x) {
            int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
            int64_t off = (int64_t)(kt + r) * a.kvw + (int64_t)kvh * HD + c;
            float4 k4, v4;
            kv_get<4>((const KV *)a.kc + off, &k4.x);
            kv_get<4>((const KV *)a.vc + off, &v4.x);
            *(float4 *)(ks + r * HD + c) = k4;
            *(float4 *)(vs + r * HD + c) = v4;
        }
        __syncthreads();
        if (kt > last_warp || tw >= a.T)
            continue;
        float sc[ATT_QPW];
#pragma unroll
        for (int qi = 0; qi < ATT_QPW; qi++)
            sc[qi] = -INFINITY;
#pragma unroll 2
        for (int j = 0; j < nrow; j++) {
            float kr[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e += 4) {
                float4 k4 = *(const float4 *)(ks + j * HD + lane * EPL + e);
                kr[e] = k4.x, kr[e + 1] = k4.y, kr[e + 2] = k4.z, kr[e + 3] = k4.w;
            }
#pragma unroll
            for (int qi = 0; qi < ATT_QPW; qi++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    d += q[qi][e] * kr[e];
                d = warp_sum(d);
                if (lane == j)
                    sc[qi] = d;
            }
        }
#pragma unroll
        for (int qi = 0; qi < ATT_QPW; qi++) {
            int qp = pos0 + tw + qi;
            float sv = (lane < nrow && kt + lane <= qp) ? sc[qi] : -INFINITY;
            float m_new = fmaxf(m[qi], warp_max(sv));
            float pw = sv == -INFINITY ? 0.0f : __expf(sv - m_new);
            float corr = m[qi] == -INFINITY ? 0.0f : __expf(m[qi] - m_new);
            l[qi] = l[qi] * corr + warp_sum(pw);
#pragma unroll
            for (int e = 0; e < EPL; e++)
                acc[qi][e] *= corr;
            m[qi] = m_new;
            sc[qi] = pw;
        }
#pragma unroll 2
        for (int j = 0; j < nrow; j++) {
            float vr[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e += 4) {
                float4 v4 = *(const float4 *)(vs + j * HD + lane * EPL + e);
                vr[e] = v4.x, vr[e + 1] = v4.y, vr[e + 2] = v4.z, vr[e + 3] = v4.w;
            }
#pragma unroll
            for (int qi = 0; qi < ATT_QPW; qi++) {
                float pj = __shfl_sync(0xffffffffu, sc[qi], j);
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    acc[qi][e] += pj * vr[e];
            }
        }
    }
#pragma unroll
    for (int qi = 0; qi < ATT_QPW; qi++) {
        int t = tw + qi;
        if (t >= a.T)
            break;
        float *op = a.out + (int64_t)t * a.ldo + (int64_t)h * HD + lane * EPL;
        const float *gp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + HD + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            float o = acc[qi][e] / l[qi];
            if (a.gate)
                o *= sigmoid_f(gp[e]);
            op[e] = o;
        }
    }
}

template <typename KV>
static cudaError_t launch_attention_tiled(const struct attn_args *a, cudaStream_t s)
{
    dim3 grid(a->n_head, (a->T + ATT_TW * ATT_QPW - 1) / (ATT_TW * ATT_QPW)), block(32 * ATT_TW);
    size_t smem = (size_t)2 * ATT_BK * a->hd * sizeof(float);
    cudaError_t e;
    switch (a->hd) {
    case 64:
        return launch_k(a->pdl, attention_tiled_kernel<2, KV>, grid, block, smem, s, *a);
    case 128:
        return launch_k(a->pdl, attention_tiled_kernel<4, KV>, grid, block, smem, s, *a);
    case 256:
        e = cudaFuncSetAttribute(attention_tiled_kernel<8, KV>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
        return launch_k(a->pdl, attention_tiled_kernel<8, KV>, grid, block, smem, s, *a);
    default:
        return cudaErrorInvalidValue;
    }
}

bool attention_supports(int32_t hd) { return hd == 64 || hd == 128 || hd == 256; }

/* The decode graph's attention (RoPE inside): the stamped instantiation for the timeline, the
 * cluster merge, the pipelined rounds (a->pipe). */
template <int EPL, typename KV, bool PIPE>
static cudaError_t launch_attention_rope_p(const struct attn_args *a, dim3 grid, dim3 block, cudaStream_t s)
{
    if (a->n_seq)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE, false, true>, grid, block, 0, s,
                        *a);
    if (a->cluster_merge) {
        dim3 g(ATT_CL_SPLITS, a->n_head);
        if (a->stamps)
            return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, true, true, PIPE>, g, block, 0, s,
                             *a);
        if (a->rope_regs)
            return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, false, true, PIPE, true>, g, block,
                             0, s, *a);
        return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, false, true, PIPE>, g, block, 0, s, *a);
    }
    if (a->stamps)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, true, false, PIPE>, grid, block, 0, s, *a);
    if (a->rope_regs)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE, true>, grid, block, 0, s, *a);
    return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE>, grid, block, 0, s, *a);
}

template <int EPL, typename KV>
static cudaError_t launch_attention_rope(const struct attn_args *a, dim3 grid, dim3 block, cudaStream_t s)
{
    return a->pipe ? launch_attention_rope_p<EPL, KV, true>(a, grid, block, s)
                   : launch_attention_rope_p<EPL, KV, false>(a, grid, block, s);
}

template <typename KV>
static cudaError_t launch_attention_kv(const struct attn_args *a, cudaStream_t s)
{
    if (a->T > 1 && a->tiled)
        return launch_attention_tiled<KV>(a, s);
    int splits = a->T == 1 && a->splits > 1 && a->part && a->count ? a->splits : 1;
    dim3 grid(a->n_head, a->n_seq ? a->n_seq : a->T, splits), block(32 * ATT_WARPS);
    if (a->n_seq && (!a->rope || a->cluster_merge || a->rope_regs || a->n_seq > ATT_MAX_SEQ))
        return cudaErrorInvalidValue; /* the multi-session form has none of these */
    if (a->rope) {
        if (a->T != 1 || a->n_rot > a->hd)
            return cudaErrorInvalidValue;
        switch (a->hd) {
        case 64: return launch_attention_rope<2, KV>(a, grid, block, s);
        case 128: return launch_attention_rope<4, KV>(a, grid, block, s);
        case 256: return launch_attention_rope<8, KV>(a, grid, block, s);
        default: return cudaErrorInvalidValue;
        }
    }
    switch (a->hd) {
    case 64: return launch_k(a->pdl, attention_kernel<2, false, KV>, grid, block, 0, s, *a);
    case 128: return launch_k(a->pdl, attention_kernel<4, false, KV>, grid, block, 0, s, *a);
    case 256: return launch_k(a->pdl, attention_kernel<8, false, KV>, grid, block, 0, s, *a);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_attention(const struct attn_args *a, cudaStream_t s)
{
    if (a->n_seq && a->group_blocks > 0 && attention_group_applies(a))
        return launch_attention_group(a, s); /* several sessions, runs of splits a block */
    if (a->n_seq) /* several sessions: attention_kernel's multi-session form */
        return a->kv_f16 ? launch_attention_kv<__half>(a, s) : launch_attention_kv<float>(a, s);
    if (a->stages && attention_staged_applies(a))
        return launch_attention_staged(a, s);
    if (a->lanes && attention_lanes_applies(a))
        return launch_attention_lanes(a, s);
    if (a->shared_kv && attention_shared_kv_applies(a))
        return launch_attention_shared_kv(a, s);
    return a->kv_f16 ? launch_attention_kv<__half>(a, s) : launch_attention_kv<float>(a, s);
}
