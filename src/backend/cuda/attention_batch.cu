/*
 * attention_batch.cu — the server's batched decode attention (attn_args.n_seq: one launch for
 * several sessions) in few blocks that each walk a run of their session's splits, for a pair
 * of query heads at once (attn_args.group_blocks).
 *
 * Why: attention.cu's multi-session attention gives every (query head, session, split) its own
 * block of 8 warps. Deep enough in a context that the sessions' graphs split their keys (from
 * position 128), 16 Qwen3-0.6B sessions make 16 x 16 x 8 = 2,048 blocks, about eight waves of
 * two blocks a multiprocessor, and each block pays the whole fixed cost of a split for one
 * round of rows: its release, the q/k norm + RoPE prologue, one L2/DRAM round trip, the warps'
 * merge, the partial's store and the counter. Nsight Compute put that launch at 46 us a layer
 * at 512 positions, 17% of the bandwidth (docs/perf-log.md, session 43).
 *
 * Here block (p, s, b) takes query heads ATB_NQ p .. ATB_NQ p + ATB_NQ - 1 (one KV head) of
 * session s, and of the S splits the session's position has, the b-th run of G = ceil(S / Z)
 * (Z = gridDim.z, chosen by the host so that the launch is one wave; computed from S on the
 * device, so one captured graph fits every position): one prologue, then the run's rounds of
 * rows back to back with two rounds in flight across the splits' edges, each row used by both
 * heads, each split ended as attention_kernel ends it (the warps' merge into the split's
 * partial, in the same order with the same sums), and each head's splits merged by
 * attention_merge — by the block itself where it holds them all, otherwise by the last of the
 * head's blocks to arrive. A warp updates its online softmax row by row in position order
 * however many rows a round holds, so every partial, and every output, is attention_kernel's
 * bit for bit: a session's attention stays its own decode graph's (test_batch_seq_cuda).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

#ifndef ATB_NQ
#define ATB_NQ 2 /* query heads a block: a KV head's pair (groups of another size: attention_kernel) */
#endif
#ifndef ATB_MIN_BLOCKS
#define ATB_MIN_BLOCKS 2 /* blocks a multiprocessor: registers held to 128 a thread */
#endif

/* Rows a warp takes per round: the registers of attention_kernel's f32 / f16 rounds at head size
 * 128 and one head, whatever the head size, shared by the block's heads (two rounds in flight:
 * 64 a thread). */
#ifndef ATB_ROWS_X
#define ATB_ROWS_X 1 /* a variant build's factor on the rows a round */
#endif
template <int EPL, typename KV>
__host__ __device__ constexpr int att_group_u()
{
    constexpr int u = (sizeof(KV) == 2 ? (32 / EPL < 8 ? 32 / EPL : 8) : (16 / EPL < 4 ? 16 / EPL : 4)) * ATB_ROWS_X / ATB_NQ;
    return u < 1 ? 1 : u;
}

/* Rounds of rows each warp takes in a split of positions lo..last: the same for every warp of
 * the block (a warp whose positions end a round earlier runs that round masked: no update), at
 * least one (an empty split's warps leave m = -inf, as attention_kernel's do). */
template <int U>
__device__ __forceinline__ int att_group_rounds(int lo, int last)
{
    constexpr int STEP = ATT_WARPS * U;
    const int n = (last - lo + STEP) / STEP;
    return n < 1 ? 1 : n;
}

/* The block's rounds in the order they are used: round j of split z (of nr rounds over
 * positions lo..last), then the next (the next split's first after a split's last). The
 * split's range is computed once a split (a division), not once a round. */
struct att_group_cursor {
    int z, j, lo, last, nr;
};

template <int U>
__device__ __forceinline__ void att_group_cursor_at(struct att_group_cursor &c, int z, int S, int pos)
{
    c.z = z, c.j = 0, c.last = pos;
    attention_split_range(S, z, &c.lo, &c.last);
    c.nr = att_group_rounds<U>(c.lo, c.last);
}

/* Moves c to the block's next round (z_end: the block's splits end there). */
template <int U>
__device__ __forceinline__ void att_group_cursor_next(struct att_group_cursor &c, int z_end, int S, int pos)
{
    if (++c.j < c.nr)
        return;
    if (c.z + 1 < z_end)
        att_group_cursor_at<U>(c, c.z + 1, S, pos);
    else
        c.z = z_end, c.j = 0;
}

/* Loads the round at cursor c (its rows: which, as attention_load_round takes them) into r, if
 * c is one of the block's (split below z_end); then moves c on. The first two rounds, issued
 * around the prologue. */
template <int EPL, typename KV, int U>
__device__ __forceinline__ void att_group_load(struct att_group_cursor &c, int z_end, int S, int pos, const KV *kbase,
                                               const KV *vbase, int64_t kvw, const KV *cur_k, const KV *cur_v, int which,
                                               att_rows<KV, U, EPL> &r)
{
    if (c.z >= z_end)
        return;
    const int p0 = c.lo + (int)(threadIdx.x >> 5) + c.j * ATT_WARPS * U;
    attention_load_round<EPL, true>(kbase, vbase, kvw, p0, c.last, pos, cur_k, cur_v, which, r);
    att_group_cursor_next<U>(c, z_end, S, pos);
}

/* The same for every later round (the prologue done): the current position's rows from shared
 * memory, every other row of the split straight from the cache by a read-only global load (the
 * cache's rows before pos were written by earlier launches), rows past the split's end not
 * loaded at all (their dot products are computed and never used: att_group_round stops
 * before them). One 64-bit address a round, the rows a fixed stride on. */
template <typename KV, int U, int EPL>
__device__ __forceinline__ void att_group_load_global(const KV *p, uint32_t (&w)[sizeof(KV) * EPL / 4])
{
    if constexpr (sizeof(KV) * EPL == 4) {
        w[0] = __ldg((const unsigned int *)p);
    } else if constexpr (sizeof(KV) * EPL == 8) {
        const uint2 v = __ldg((const uint2 *)p);
        w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < (int)(sizeof(KV) * EPL / 16); i++) {
            const uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    }
}

template <int EPL, typename KV, int U>
__device__ __forceinline__ void att_group_load_next(struct att_group_cursor &c, int z_end, int S, int pos,
                                                    const KV *kbase, const KV *vbase, int64_t kvw, const KV *cur_k,
                                                    const KV *cur_v, att_rows<KV, U, EPL> &r)
{
    if (c.z >= z_end)
        return;
    const int lane = threadIdx.x & 31, p0 = c.lo + (int)(threadIdx.x >> 5) + c.j * ATT_WARPS * U;
    const int64_t step = (int64_t)ATT_WARPS * kvw;
    const KV *kp = kbase + (int64_t)p0 * kvw, *vp = vbase + (int64_t)p0 * kvw;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int p = p0 + u * ATT_WARPS;
        if (p == pos) {
            r.load(u, cur_k + lane * EPL, cur_v + lane * EPL);
        } else if (p <= c.last) {
            uint32_t wk[sizeof(KV) * EPL / 4], wv[sizeof(KV) * EPL / 4];
            att_group_load_global<KV, U, EPL>(kp + u * step, wk);
            att_group_load_global<KV, U, EPL>(vp + u * step, wv);
            r.set_raw(u, wk, wv);
        }
    }
    att_group_cursor_next<U>(c, z_end, S, pos);
}

/* The split a warp's rounds are in: its index z and range lo..last, its rounds nr, the round j
 * next used, and the warp's online softmax over it so far, for each of the block's heads. */
template <int EPL>
struct att_group_split {
    int z, lo, last, nr, j;
    float m[ATB_NQ], l[ATB_NQ], acc[ATB_NQ][EPL];
};

template <int U, int EPL>
__device__ __forceinline__ void att_group_split_start(struct att_group_split<EPL> &sp, int z, int S, int pos)
{
    sp.z = z, sp.j = 0, sp.last = pos;
    attention_split_range(S, z, &sp.lo, &sp.last);
    sp.nr = att_group_rounds<U>(sp.lo, sp.last);
#pragma unroll
    for (int k = 0; k < ATB_NQ; k++) {
        sp.m[k] = -INFINITY, sp.l[k] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            sp.acc[k][e] = 0.0f;
    }
}

/* The shared memory of a block: the warps' (m, l, acc) by head for two splits (one barrier a
 * split), the prologue's rows. */
template <int EPL, typename KV>
struct att_group_smem {
    float m[2][ATB_NQ][ATT_WARPS], l[2][ATB_NQ][ATT_WARPS];
    float acc[2][ATB_NQ][ATT_WARPS][32 * EPL];
    __align__(16) float q[ATB_NQ][32 * EPL];
    __align__(16) float k[32 * EPL], v[32 * EPL];
    float cs[16 * EPL], sn[16 * EPL];
    __align__(16) KV k16[sizeof(KV) == 2 ? 32 * EPL : 8], v16[sizeof(KV) == 2 ? 32 * EPL : 8];
};

/* Where the block's heads read and write: head k's partials (split z at part[k] + z (hd + 2)),
 * output row and output gate. */
struct att_group_out {
    float *part[ATB_NQ], *op[ATB_NQ];
    const float *gp[ATB_NQ];
};

/* The end of split z for every head of the block (attention_kernel's, bit for bit): the warps'
 * (m, l, acc) through shared memory (a block barrier), merged in warp order into the split's
 * partial (S > 1), or into the output itself (S == 1: the head's only split, with the output
 * gate). */
template <int EPL, typename KV>
__device__ __forceinline__ void att_group_split_end(const struct attn_args &a, const struct att_group_split<EPL> &sp,
                                                    struct att_group_smem<EPL, KV> &sm, const struct att_group_out &o,
                                                    int S)
{
    constexpr int hd = 32 * EPL;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, b = sp.z & 1;
#pragma unroll
    for (int k = 0; k < ATB_NQ; k++) {
        if (lane == 0)
            sm.m[b][k][warp] = sp.m[k], sm.l[b][k][warp] = sp.l[k];
#pragma unroll
        for (int e = 0; e < EPL; e++)
            sm.acc[b][k][warp][lane * EPL + e] = sp.acc[k][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ATB_NQ * hd; i += blockDim.x) {
        const int k = i / hd, d = i - k * hd; /* k is the same for a warp's lanes (hd: 32 EPL) */
        float M, L, f[ATT_WARPS];
        attention_split_weights(sm.m[b][k], sm.l[b][k], M, L, f);
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            v += sm.acc[b][k][w][d] * f[w];
        if (S > 1) {
            float *part = o.part[k] + (int64_t)sp.z * (hd + 2);
            part[2 + d] = v;
            if (d == 0)
                part[0] = M, part[1] = L;
        } else {
            v /= L;
            if (a.gate)
                v *= sigmoid_f(o.gp[k][d]);
            o.op[k][d] = v;
        }
    }
}

/* After a round: on to the next, ending the split after its last round and starting the next;
 * true when the block's last split has ended. */
template <int EPL, typename KV, int U>
__device__ __forceinline__ bool att_group_advance(const struct attn_args &a, struct att_group_split<EPL> &sp, int z_end,
                                                  int S, int pos, struct att_group_smem<EPL, KV> &sm,
                                                  const struct att_group_out &o)
{
    if (++sp.j < sp.nr)
        return false;
    att_group_split_end<EPL, KV>(a, sp, sm, o, S);
    if (sp.z + 1 >= z_end)
        return true;
    att_group_split_start<U>(sp, sp.z + 1, S, pos);
    return false;
}

/* One round of rows r into every head's online softmax: attention_round's arithmetic for each
 * head (the same dots, sums and updates in the same order: bit for bit), the rows converted to
 * floats once for all the heads and the heads' dot products summed side by side (against
 * attention_round per head: +2% at 8-16 sessions, docs/perf-log.md session 44). */
template <int EPL, typename KV, int U>
__device__ __forceinline__ void att_group_round(const att_rows<KV, U, EPL> &r, const float (&q)[ATB_NQ][EPL],
                                                struct att_group_split<EPL> &sp)
{
    const int p0 = sp.lo + (int)(threadIdx.x >> 5) + sp.j * ATT_WARPS * U;
    float dot[ATB_NQ * U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kf[EPL];
#pragma unroll
        for (int e = 0; e < EPL; e++)
            kf[e] = r.K(u, e);
#pragma unroll
        for (int k = 0; k < ATB_NQ; k++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                d += q[k][e] * kf[e];
            dot[k * U + u] = d;
        }
    }
    warp_sum_each(dot);
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (p0 + u * ATT_WARPS > sp.last)
            break;
        float vf[EPL];
#pragma unroll
        for (int e = 0; e < EPL; e++)
            vf[e] = r.V(u, e);
#pragma unroll
        for (int k = 0; k < ATB_NQ; k++) { /* attention_row_update */
            const float d = dot[k * U + u];
            float m_new = fmaxf(sp.m[k], d), corr = att_exp(sp.m[k] - m_new), pw = att_exp(d - m_new);
            sp.l[k] = sp.l[k] * corr + pw;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                sp.acc[k][e] = sp.acc[k][e] * corr + pw * vf[e];
            sp.m[k] = m_new;
        }
    }
}

/* Grid (n_head / ATB_NQ, n_seq, Z); 8 warps a block. The partition of each session's keys is
 * attention_kernel's (attention_splits with the launch's splits as its grid, a.nominal_splits),
 * its partials at the same places, its counter the first head's. */
template <int EPL, typename KV>
__global__ void __launch_bounds__(32 * ATT_WARPS, ATB_MIN_BLOCKS)
    attention_group_kernel(const __grid_constant__ struct attn_args a)
{
    constexpr int hd = 32 * EPL, U = att_group_u<EPL, KV>();
    griddep_launch();
    l2_prefetch_share(a.pf);
    griddep_wait();
    __shared__ struct att_group_smem<EPL, KV> sm;
    const KV *cur_k = sizeof(KV) == 2 ? sm.k16 : (const KV *)sm.k;
    const KV *cur_v = sizeof(KV) == 2 ? sm.v16 : (const KV *)sm.v;
    const int h0 = blockIdx.x * ATB_NQ, t = blockIdx.y, lane = threadIdx.x & 31;
    const int nz = a.splits;
    const struct att_seq_view sv = attention_seq_of<true>(a, t);
    const int kvh = h0 / (a.n_head / a.n_head_kv), pos = *sv.pos;
    const int S = min(attention_splits(a, pos, a.nominal_splits > 0 ? a.nominal_splits : nz), nz);
    const int G = (S + gridDim.z - 1) / gridDim.z, z0 = blockIdx.z * G, z_end = min(z0 + G, S);
    if (z0 >= S)
        return; /* fewer runs than blocks at this position */
    const KV *kbase = (const KV *)sv.kc + (int64_t)kvh * hd + lane * EPL;
    const KV *vbase = (const KV *)sv.vc + (int64_t)kvh * hd + lane * EPL;
    /* the first two rounds' cached rows before the prologue, the current position's after it */
    att_rows<KV, U, EPL> r0, r1;
    struct att_group_cursor ld;
    att_group_cursor_at<U>(ld, z0, S, pos);
    att_group_load<EPL, KV, U>(ld, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, ATT_ROWS_CACHED, r0);
    att_group_load<EPL, KV, U>(ld, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, ATT_ROWS_CACHED, r1);
    attention_rope_prologue<EPL, KV, ATB_NQ, true>(a, h0, kvh, pos, z_end == S, sm.q[0], sm.k, sm.v, sm.k16, sm.v16,
                                                   sm.cs, sm.sn, sm.q[ATB_NQ > 1 ? 1 : 0], t);
    {
        struct att_group_cursor c;
        att_group_cursor_at<U>(c, z0, S, pos);
        att_group_load<EPL, KV, U>(c, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, ATT_ROWS_CURRENT, r0);
        att_group_load<EPL, KV, U>(c, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, ATT_ROWS_CURRENT, r1);
    }
    float q[ATB_NQ][EPL];
    const float scale = rsqrtf((float)hd);
    struct att_group_out o;
#pragma unroll
    for (int k = 0; k < ATB_NQ; k++) {
#pragma unroll
        for (int e = 0; e < EPL; e++)
            q[k][e] = sm.q[k][lane * EPL + e] * scale;
        o.part[k] = a.part + ((int64_t)t * a.n_head + h0 + k) * nz * (hd + 2);
        o.op[k] = a.out + (int64_t)t * a.ldo + (int64_t)(h0 + k) * hd;
        o.gp[k] = sv.q + (int64_t)(h0 + k) * a.q_stride + hd;
    }
    /* the rounds in order, r0 and r1 in turn (each refilled with the round two ahead as soon as
     * it is used); a split ends after the same round in every warp: its barrier is uniform */
    struct att_group_split<EPL> sp;
    att_group_split_start<U>(sp, z0, S, pos);
    for (;;) {
        att_group_round<EPL, KV, U>(r0, q, sp);
        att_group_load_next<EPL, KV, U>(ld, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, r0);
        if (att_group_advance<EPL, KV, U>(a, sp, z_end, S, pos, sm, o))
            break;
        att_group_round<EPL, KV, U>(r1, q, sp);
        att_group_load_next<EPL, KV, U>(ld, z_end, S, pos, kbase, vbase, a.kvw, cur_k, cur_v, r1);
        if (att_group_advance<EPL, KV, U>(a, sp, z_end, S, pos, sm, o))
            break;
    }
    if (S == 1)
        return;
    const int runs = (S + G - 1) / G; /* the blocks with splits */
    if (runs > 1) {
        if (!attention_split_arrive(a, t * a.n_head + h0, runs))
            return;
    } else {
        __syncthreads(); /* every split's partial stored */
    }
    __threadfence();
#pragma unroll
    for (int k = 0; k < ATB_NQ; k++) {
        if (k)
            __syncthreads(); /* attention_merge's shared factors: read by the head before */
        attention_merge<EPL>(a, o.part[k], hd + 2, S, o.op[k], o.gp[k]);
    }
}

template <typename KV>
static cudaError_t launch_attention_group_kv(const struct attn_args *a, cudaStream_t s)
{
    dim3 grid(a->n_head / ATB_NQ, a->n_seq, a->group_blocks), block(32 * ATT_WARPS);
    switch (a->hd) {
    case 64: return launch_k(a->pdl, attention_group_kernel<2, KV>, grid, block, 0, s, *a);
    case 128: return launch_k(a->pdl, attention_group_kernel<4, KV>, grid, block, 0, s, *a);
    case 256: return launch_k(a->pdl, attention_group_kernel<8, KV>, grid, block, 0, s, *a);
    default: return cudaErrorInvalidValue;
    }
}

bool attention_group_applies(const struct attn_args *a)
{
    return a->n_seq >= 1 && a->n_seq <= ATT_MAX_SEQ && a->T == 1 && a->rope && !a->cluster_merge && !a->rope_regs &&
           a->group_blocks >= 1 && a->group_blocks <= ATT_MAX_SPLITS && a->splits > 1 && a->part && a->count &&
           a->n_rot <= a->hd && attention_supports(a->hd) && a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 &&
           (a->n_head / a->n_head_kv) % ATB_NQ == 0;
}

cudaError_t launch_attention_group(const struct attn_args *a, cudaStream_t s)
{
    if (!attention_group_applies(a))
        return cudaErrorInvalidValue;
    return a->kv_f16 ? launch_attention_group_kv<__half>(a, s) : launch_attention_group_kv<float>(a, s);
}

int attention_group_heads(void) { return ATB_NQ; }

/* How many blocks of the grouped kernel for head size hd fit on one multiprocessor (the
 * host's choice of Z: cuda_batch.cu); 0 where the runtime cannot say. */
int attention_group_blocks_per_sm(int32_t hd, bool kv_f16)
{
    int n = 0;
    cudaError_t e = cudaErrorInvalidValue;
    const int threads = 32 * ATT_WARPS;
    if (hd == 64)
        e = kv_f16 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<2, __half>, threads, 0)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<2, float>, threads, 0);
    else if (hd == 128)
        e = kv_f16 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<4, __half>, threads, 0)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<4, float>, threads, 0);
    else if (hd == 256)
        e = kv_f16 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<8, __half>, threads, 0)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_group_kernel<8, float>, threads, 0);
    return e == cudaSuccess ? n : 0;
}
