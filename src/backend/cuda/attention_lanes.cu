/*
 * attention_lanes.cu — the decode graph's attention (RoPE inside, T = 1) with each cached row's
 * dot product over a group of LPR lanes (8 or 16) instead of the whole warp
 * (cuda_options.attn_lanes): a warp takes 32 / LPR rows at once, one per group.
 *
 * Why: attention.cu's attention_kernel gives a row to a whole warp — each lane 4 of a 128-wide
 * row's elements, then a 5-step shuffle reduction and the online-softmax update, per row. Deep
 * in a context that chain of dependent instructions is the attention's time, not its bytes
 * (H200, session 29: at 4,096 positions two query heads per block took twice as long with half
 * the loads; the f16 cache, half the bytes, was 5% faster). Here a lane holds EPL = HD / LPR
 * elements of a row (16 for head size 128 over 8 lanes), so a warp's step covers 32 / LPR rows
 * with log2(LPR) shuffle steps: for head size 128, 3 steps per 4 rows instead of 5 per row, and
 * the products of 4 rows in one pass.
 *
 * Layout: group g of warp w (g = lane / LPR) owns the positions lo + w G + g + k NV (NV = the
 * block's groups, ATT_WARPS x G), k = 0, 1, ...: a round loads U rows per group, NV apart, and
 * two rounds are in flight as in attention_kernel's pipelined loop (attn_pipe): each buffer is
 * refilled with the round two ahead right after its use. The loop's condition is the warp's
 * (its first group's position), so every lane of a warp reaches every shuffle; rows past the
 * split's last position are loaded clamped and left out of the update. Each group keeps its own
 * online softmax (m, l) and output slice; the block merges its NV partials through shared
 * memory, then the splits merge as attention_kernel's do (the last block of a head,
 * attention_merge). The prologue (q/k norm, RoPE, the cache write) is attention_kernel's. The
 * sums run in another order than attention_kernel's: the results agree to f32 rounding, not
 * bit for bit. Not for the cluster-merged attention's graphs (attn_cluster).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

/* Rows per group per round: f32 rows take 2 x EPL registers each, f16 rows half that (the
 * same bytes in flight per warp as attention_kernel's ATT_U / ATT_U16 rows). */
template <typename KV>
__host__ __device__ constexpr int lanes_u() { return sizeof(KV) == 2 ? 2 : 1; }

/* One round of a group's rows: positions p0 + u * NV (u < U; clamped to last: a valid row,
 * masked by the caller), the lane's EPL elements of each (sub: its place in the group); the
 * current position's row from the prologue's copy in shared memory, as attention_load_round. */
template <int EPL, int NV, typename KV, int U>
__device__ __forceinline__ void lanes_load_round(const KV *kbase, const KV *vbase, int64_t kvw, int p0, int last,
                                                 int pos, const KV *rk, const KV *rv, int sub, int rows,
                                                 att_rows<KV, U, EPL> &r)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int p = p0 + u * NV, pc = p <= last ? p : last;
        bool current = pc == pos;
        if ((rows == ATT_ROWS_CACHED && current) || (rows == ATT_ROWS_CURRENT && !current))
            continue;
        r.load(u, current ? rk + sub * EPL : kbase + (int64_t)pc * kvw,
               current ? rv + sub * EPL : vbase + (int64_t)pc * kvw);
    }
}

/* One round of a group's rows (positions p0 + u NV; those past last masked) into its online
 * softmax (m, l) and output slice acc: each lane's EPL products in four partial sums, the
 * group's lanes summed by log2(LPR) shuffles (every lane of the warp takes part). */
template <int EPL, int LPR, int NV, typename KV, int U>
__device__ __forceinline__ void lanes_round(const att_rows<KV, U, EPL> &rw, const float (&q)[EPL], int p0, int last,
                                            float &m, float &l, float (&acc)[EPL])
{
    float dot[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < EPL; e++)
            d[e & 3] += q[e] * rw.K(u, e);
        dot[u] = (d[0] + d[1]) + (d[2] + d[3]);
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < U; u++)
            dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (p0 + u * NV > last)
            break;
        attention_row_update(rw, u, dot[u], m, l, acc);
    }
}

/* TL: the decode timeline's variant (a.stamps written), as attention_kernel's. */
template <int HD, int LPR, typename KV, bool TL>
__global__ void __launch_bounds__(32 * ATT_WARPS) attention_lanes_kernel(const __grid_constant__ struct attn_args a)
{
    constexpr int EPL = HD / LPR, G = 32 / LPR, NV = ATT_WARPS * G, U = lanes_u<KV>(), STEP = NV * U;
    static_assert(NV <= 32, "one warp merges the block's partials");
    if (TL)
        tl_stamp(a.stamps, 0);
    griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before any wait) */
    if (!a.early)
        griddep_wait();
    __shared__ float s_m[NV], s_l[NV], s_f[NV], s_ml[2];
    __shared__ float s_acc[NV][HD];
    __shared__ __align__(16) float r_q[HD], r_k[HD], r_v[HD];
    __shared__ float r_cs[HD / 2], r_sn[HD / 2];
    __shared__ __align__(16) KV r_k16[sizeof(KV) == 2 ? HD : 8], r_v16[sizeof(KV) == 2 ? HD : 8];
    const KV *cur_k = sizeof(KV) == 2 ? r_k16 : (const KV *)r_k, *cur_v = sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    const int h = blockIdx.x, z = blockIdx.z, nz = gridDim.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gi = lane / LPR, sub = lane % LPR, kvh = h / (a.n_head / a.n_head_kv), pos = *a.pos0;
    int last = pos, lo, S = attention_splits(a, last, nz); /* attention_kernel's splits */
    if (z >= S)
        return;
    attention_split_range(S, z, &lo, &last);
    const KV *kbase = (const KV *)a.kc + (int64_t)kvh * HD + sub * EPL;
    const KV *vbase = (const KV *)a.vc + (int64_t)kvh * HD + sub * EPL;
    int pw = lo + warp * G; /* the warp's first group's position: the loop's (warp-uniform) */
    att_rows<KV, U, EPL> r0, r1; /* the first two rounds' cached rows, requested before the wait */
    lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi, last, pos, cur_k, cur_v, sub, ATT_ROWS_CACHED, r0);
    lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi + STEP, last, pos, cur_k, cur_v, sub, ATT_ROWS_CACHED, r1);
    if (a.early)
        griddep_wait();
    if (TL)
        tl_stamp(a.stamps, 1);
    attention_rope_prologue<HD / 32, KV>(a, h, kvh, pos, last == pos, r_q, r_k, r_v, r_k16, r_v16, r_cs, r_sn);
    if (TL)
        tl_stamp(a.stamps, 2);
    float q[EPL], acc[EPL], m = -INFINITY, l = 0.0f, scale = rsqrtf((float)HD);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] = r_q[sub * EPL + e] * scale;
        acc[e] = 0.0f;
    }
    /* the current position's rows (skipped before the prologue), then two rounds in flight */
    lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi, last, pos, cur_k, cur_v, sub, ATT_ROWS_CURRENT, r0);
    lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi + STEP, last, pos, cur_k, cur_v, sub, ATT_ROWS_CURRENT, r1);
    for (; pw <= last; pw += 2 * STEP) {
        lanes_round<EPL, LPR, NV>(r0, q, pw + gi, last, m, l, acc);
        if (pw + 2 * STEP <= last)
            lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi + 2 * STEP, last, pos, cur_k, cur_v, sub,
                                      ATT_ROWS_ALL, r0);
        if (pw + STEP > last)
            break;
        lanes_round<EPL, LPR, NV>(r1, q, pw + gi + STEP, last, m, l, acc);
        if (pw + 3 * STEP <= last)
            lanes_load_round<EPL, NV>(kbase, vbase, a.kvw, pw + gi + 3 * STEP, last, pos, cur_k, cur_v, sub,
                                      ATT_ROWS_ALL, r1);
    }
    /* the output gate of this thread's first dimension (Qwen3.5), requested before the merge */
    const float *gp = a.q + (int64_t)h * a.q_stride + HD;
    float g0 = a.gate && (int)threadIdx.x < HD ? gp[threadIdx.x] : 0.0f;
    const int v = warp * G + gi; /* this group's partial */
    if (sub == 0)
        s_m[v] = m, s_l[v] = l;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[v][sub * EPL + e] = acc[e];
    __syncthreads();
    if (warp == 0) { /* the block's max, the partials' weights and the weighted sum of their sums */
        float mv = lane < NV ? s_m[lane] : -INFINITY, M = mv;
        for (int o = 16; o > 0; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float f = mv == -INFINITY ? 0.0f : __expf(mv - M);
        float L = warp_sum(lane < NV ? s_l[lane] * f : 0.0f);
        if (lane < NV)
            s_f[lane] = f;
        if (lane == 0)
            s_ml[0] = M, s_ml[1] = L;
    }
    __syncthreads();
    float *op = a.out + (int64_t)h * HD;
    if (S > 1) { /* this split's partial result, then the last block of the head merges */
        float *part = a.part + ((int64_t)h * nz + z) * (HD + 2);
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < NV; w++)
                o += s_acc[w][d] * s_f[w];
            part[2 + d] = o;
        }
        if (threadIdx.x == 0)
            part[0] = s_ml[0], part[1] = s_ml[1];
        if (attention_split_arrive(a, h, S)) {
            __threadfence();
            attention_merge<HD / 32>(a, a.part + (int64_t)h * nz * (HD + 2), HD + 2, S, op, gp);
        }
    } else {
        float inv = 1.0f / s_ml[1];
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < NV; w++)
                o += s_acc[w][d] * s_f[w];
            o *= inv;
            if (a.gate)
                o *= sigmoid_f(d == (int)threadIdx.x ? g0 : gp[d]);
            op[d] = o;
        }
    }
    if (TL)
        tl_stamp(a.stamps, 3);
}

bool attention_lanes_applies(const struct attn_args *a)
{
    return a->T == 1 && a->rope && !a->cluster_merge && (a->lanes == 8 || a->lanes == 16) && a->n_rot <= a->hd &&
           (a->hd == 64 || a->hd == 128 || (a->hd == 256 && a->lanes == 16));
}

template <int HD, int LPR, typename KV>
static cudaError_t launch_lanes(const struct attn_args *a, cudaStream_t s)
{
    int splits = a->splits > 1 && a->part && a->count ? a->splits : 1;
    dim3 grid(a->n_head, 1, splits), block(32 * ATT_WARPS);
    if (a->stamps)
        return launch_k(a->pdl, attention_lanes_kernel<HD, LPR, KV, true>, grid, block, 0, s, *a);
    return launch_k(a->pdl, attention_lanes_kernel<HD, LPR, KV, false>, grid, block, 0, s, *a);
}

template <typename KV>
static cudaError_t launch_lanes_kv(const struct attn_args *a, cudaStream_t s)
{
    switch (a->hd * 100 + a->lanes) {
    case 6408: return launch_lanes<64, 8, KV>(a, s);
    case 6416: return launch_lanes<64, 16, KV>(a, s);
    case 12808: return launch_lanes<128, 8, KV>(a, s);
    case 12816: return launch_lanes<128, 16, KV>(a, s);
    case 25616: return launch_lanes<256, 16, KV>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_attention_lanes(const struct attn_args *a, cudaStream_t s)
{
    if (!attention_lanes_applies(a))
        return cudaErrorInvalidValue;
    return a->kv_f16 ? launch_lanes_kv<__half>(a, s) : launch_lanes_kv<float>(a, s);
}
