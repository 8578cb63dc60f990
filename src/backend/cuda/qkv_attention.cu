/*
 * qkv_attention.cu — a decode layer's norm + q|k|v products + q/k norm + RoPE + cache write +
 * attention in one launch (cuda_options.qkv_attn; sm_90: clusters and distributed shared
 * memory).
 *
 * Why: in the decode graph the attention was a launch of its own after the q|k|v GEMV, and it
 * cost 4.8 us per Qwen3-0.6B layer although at short contexts it reads almost nothing: the
 * GEMV's last block must finish, q, k and v make a round trip through global memory, and the
 * next launch drains and fills the GPU again (knock-outs, docs/perf-log.md session 18).
 *
 * How: one cluster of CS blocks (8 or 16) per KV head. The cluster's blocks together compute
 * the rows of that head's group — its G query heads, then its k and its v, (G + 2) * hd rows —
 * each block B = (G + 2) * hd / CS of them, as gemv_smem.cu did until session 21 (the block's
 * rows copied into shared memory with cp.async before griddep_wait, x staged and RMS-normalised
 * in shared memory, L lanes per row, a butterfly; gemv_smem now has every lane read its x once
 * for all of its warp's rows, which this kernel has not taken over). Then, with the cluster
 * barrier split into its arrive and wait halves (work between them overlaps the slowest block):
 *   1. barrier A; meanwhile each attending block loads its first round of cached K/V rows and
 *      RoPE's angles; then it gathers the group's q, k and v from its peers' shared memory,
 *      normalises and rotates q and k (attention_rope_prologue's arithmetic, attention_decode.cuh), and
 *      block 0 writes k and v to the cache at the current position;
 *   2. a short context (fewer positions than one round of the block's warps) is attended by
 *      block 0 alone, which writes the output (barrier B only keeps its peers' shared memory
 *      alive while it reads); a longer one in a slice of positions per block, all G query
 *      heads at once per K/V row, the current row from shared memory in the cache's rounding,
 *      an online softmax per head per warp merged into the block's (max, sum, output);
 *   3. (longer contexts) barrier C; block r merges the CS partial results for its share of
 *      the G * hd output dimensions from its peers' shared memory; barrier D before leaving.
 * The rows of positions before pos are read after griddep_wait, when every earlier launch has
 * finished. Sums run in other orders than the two-launch path's: results differ by rounding;
 * test_qkv_attn compares both.
 *
 * Measured (H200, Qwen3-0.6B BF16, tg128 with the f16 cache, cuda_bench --sweep, medians of
 * 5): even with the two launches (1,544 vs 1,550 tok/s with clusters of 8; 16: 1,500), so
 * off by default. Knock-outs of this kernel, per layer: its GEMV alone is 0.8 us faster than
 * gemv_smem's q|k|v (2,015 tok/s against 1,941 with the attention launch left out), but the
 * gather + norm + RoPE + cache write after barrier A cost 2.5 us and the attention 2.8 us:
 * inside one launch the attention's chain of dependent steps is no shorter than as a launch
 * of its own (4.7 us; docs/perf-log.md, session 19).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_smem.cuh"
#include "backend/cuda/gemv_stage.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define QA_THREADS 512 /* 16 warps at most (launch bound) */
#define QA_U 4         /* K/V rows per warp per round, all loads issued before the first use */
#define QA_G 2         /* query heads per KV head the kernel is built for (Qwen3) */

/* The launch's shape: cluster size, rows per block, lanes per row, warps, bytes between rows in
 * shared memory, dynamic shared memory. */
struct qa_shape {
    int cs, rows, L, warps;
    int32_t wstride;
    size_t smem;
};

/* Dynamic shared memory, in this order (floats unless named): x as two float4 arrays (K),
 * the block's rows (rows * wstride bytes), its products y (rows), the group's q|k|v (R), the
 * current k and v rows as the cache holds them (2 hd), the block's partial result per head
 * (G * (hd + 2)), the warps' partial results (warps * G * (hd + 2)), RoPE's cos and sin (hd). */
static size_t qa_smem_bytes(int K, int rows, int32_t wstride, int R, int hd, int warps)
{
    return (size_t)K * 4 + (size_t)rows * wstride +
           4 * ((size_t)rows + R + 2 * hd + (size_t)QA_G * (hd + 2) * (1 + warps) + hd);
}

template <int EPL>
__device__ __forceinline__ void qa_norm_rope(float *x, const float *w, const float *cs_, const float *sn,
                                             int n_rot, float eps)
{
    /* one warp: x (32 * EPL floats) RMS-normalised with weight w, then NEOX RoPE over its
     * first n_rot dims (the sums and products of attention_rope_prologue) */
    const int lane = threadIdx.x & 31, hd = 32 * EPL, half = n_rot / 2;
    float v[EPL], g[EPL], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        v[j] = x[lane + 32 * j];
        g[j] = w[lane + 32 * j];
    }
#pragma unroll
    for (int j = 0; j < EPL; j++)
        ss += v[j] * v[j];
    float scale = rsqrtf(warp_sum(ss) / (float)hd + eps);
#pragma unroll
    for (int j = 0; j < EPL; j++)
        x[lane + 32 * j] = v[j] * (scale * g[j]);
    __syncwarp();
    float y[EPL];
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        int d = lane + 32 * j;
        y[j] = x[d];
        if (d < n_rot) {
            int i = d < half ? d : d - half;
            y[j] = d < half ? x[d] * cs_[i] - x[d + half] * sn[i] : x[d] * cs_[i] + x[d - half] * sn[i];
        }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < EPL; j++)
        x[lane + 32 * j] = y[j];
}

/* Which q|k|v row the group's local row lr is: its segment (0 q, 1 k, 2 v) and row there. */
__device__ __forceinline__ int qa_row(int lr, int grp, int hd, int64_t *row)
{
    if (lr < QA_G * hd) {
        *row = (int64_t)grp * QA_G * hd + lr;
        return 0;
    }
    int s = lr < (QA_G + 1) * hd ? 1 : 2;
    *row = (int64_t)grp * hd + lr - (QA_G + s - 1) * hd;
    return s;
}

/* The cluster barrier in two halves: arrive (this thread's shared-memory writes released to
 * the peers), then wait (the peers' acquired); work between them overlaps the slowest block. */
__device__ __forceinline__ void qa_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void qa_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

/* A warp's round of K and V rows: positions p0 + u * nw (u < QA_U), clamped to hi (a valid
 * row, masked by the caller); the current position pos from cur (the cache's rounding) when
 * cur is given, else left out (the prefetch before the current row exists). */
template <typename KV, int EPL>
__device__ __forceinline__ void qa_load_round(const KV *kb, const KV *vb, int64_t kvw, int p0, int nw, int hi, int pos,
                                              const float *cur, float (&kr)[QA_U][EPL], float (&vr)[QA_U][EPL])
{
    const int lane = threadIdx.x & 31, hd = 32 * EPL;
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
        int p = min(p0 + u * nw, hi);
        if (p != pos) {
            kv_get<EPL>(kb + (int64_t)p * kvw, kr[u]);
            kv_get<EPL>(vb + (int64_t)p * kvw, vr[u]);
        } else if (cur) {
#pragma unroll
            for (int e = 0; e < EPL; e++)
                kr[u][e] = cur[lane * EPL + e], vr[u][e] = cur[hd + lane * EPL + e];
        }
    }
}

/* Contexts shorter than this many positions are attended by one block of the cluster (one
 * round of its warps' loads, issued before barrier A): no partial results to merge across the
 * cluster. */
__device__ __forceinline__ int qa_single_max(int nw) { return nw * QA_U; }

template <int DT, typename KV, int EPL, int L>
__global__ void __launch_bounds__(QA_THREADS) qkv_attn_kernel(const __grid_constant__ struct gemv_args g,
                                                              const __grid_constant__ struct attn_args t,
                                                              int32_t wstride, bool launch_early)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float4 qa_smem4[];
    __shared__ float s_red[QA_THREADS / 32];
    cg::cluster_group cl = cg::this_cluster();
    constexpr int RPW = 32 / L, hd = 32 * EPL, R = (QA_G + 2) * hd;
    const int CS = (int)cl.num_blocks(), rank = (int)cl.block_rank(), grp = (int)blockIdx.x / CS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int gi = lane / L, q = lane % L, nchunk = g.K / 8, B = R / CS;
    float4 *xlo = qa_smem4, *xhi = qa_smem4 + nchunk;
    uint8_t *rows = (uint8_t *)(qa_smem4 + 2 * nchunk);
    float *s_y = (float *)(rows + (size_t)B * wstride), *s_qkv = s_y + B, *s_cur = s_qkv + R;
    float *s_part = s_cur + 2 * hd, *s_warp = s_part + QA_G * (hd + 2), *s_cs = s_warp + nw * QA_G * (hd + 2);
    float *s_sn = s_cs + hd / 2;

    /* 1. the block's rows: copies issued before the wait (gemv_smem.cu's order) */
    const int lr = rank * B + warp * RPW + gi;
    int64_t row;
    const int sg = qa_row(lr, grp, hd, &row);
    const uint32_t wrow = smem_u32(rows) + (uint32_t)((warp * RPW + gi) * wstride);
    const uint4 *rp = (const uint4 *)((const uint8_t *)g.seg[sg].w + row * g.seg[sg].row_bytes);
    for (int ch = q; ch < nchunk; ch += L)
        cp_async16(wrow + (uint32_t)(ch * 16), rp + ch);
    float4 g0[GEMV_NW];
    gs_commit_and_wait(g, launch_early, g0);
    const int pos = *t.pos0;
    gs_stage_x(g, xlo, xhi, g0, s_red);
    cp_async_wait<0>();
    float acc = 0.0f;
#pragma unroll 4
    for (int ch = q; ch < nchunk; ch += L) {
        uint4 raw;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                     : "r"(wrow + (uint32_t)(ch * 16)));
        acc += gemv_dot8x<DT>(raw, xlo[ch], xhi[ch]);
    }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (q == 0)
        s_y[warp * RPW + gi] = acc;
    qa_arrive(); /* barrier A: every block's products in its shared memory */

    /* the attention's positions: all of them in block 0 for a short context, else a slice per
     * block; the first round of cached rows loads while the slowest block finishes */
    const bool single = pos < qa_single_max(nw), attend = !single || rank == 0;
    const int chunk = (pos + CS) / CS, lo = single ? 0 : rank * chunk, hi = single ? pos : min(pos, lo + chunk - 1);
    KV *kc = (KV *)t.kc, *vc = (KV *)t.vc;
    const KV *kb = kc + (int64_t)grp * hd + lane * EPL, *vb = vc + (int64_t)grp * hd + lane * EPL;
    float kr[QA_U][EPL], vr[QA_U][EPL];
    if (attend && lo + warp <= hi)
        qa_load_round<KV, EPL>(kb, vb, t.kvw, lo + warp, nw, hi, pos, NULL, kr, vr);
    for (int i = threadIdx.x; i < hd / 2 && i < t.n_rot / 2; i += blockDim.x) { /* RoPE's angles */
        double inv_freq = t.inv_freq ? t.inv_freq[i] : pow((double)t.theta, -2.0 * (double)i / (double)t.n_rot);
        double ang = (double)pos * inv_freq;
        ang -= rint(ang * 0.15915494309189535) * 6.283185307179586;
        sincosf((float)ang, &s_sn[i], &s_cs[i]);
    }
    qa_wait();

    /* 2. the group's q|k|v from the peers, q and k normalised and rotated, the cache row */
    if (attend) {
        for (int i = threadIdx.x; i < R; i += blockDim.x)
            s_qkv[i] = *cl.map_shared_rank(s_y + i % B, i / B);
        __syncthreads();
    }
    if (single) /* barrier B: block 0 has read its peers' products (they wait for it at the end) */
        qa_arrive();
    if (attend) {
        if (warp <= QA_G) /* warps 0..G-1: the query heads, G: k */
            qa_norm_rope<EPL>(s_qkv + warp * hd, warp < QA_G ? t.wq : t.wk, s_cs, s_sn, t.n_rot, t.eps);
        __syncthreads();
        const float *k_now = s_qkv + QA_G * hd, *v_now = k_now + hd;
        for (int d = threadIdx.x; d < 2 * hd; d += blockDim.x) { /* the current row as the cache holds it */
            float x = d < hd ? k_now[d] : v_now[d - hd];
            KV c;
            kv_put(&c, x);
            s_cur[d] = (float)c;
            if (rank == 0)
                kv_put((d < hd ? kc : vc) + (int64_t)pos * t.kvw + (int64_t)grp * hd + d % hd, x);
        }
        __syncthreads();
    }

    /* 3. this block's positions lo..hi, every query head of the group per K/V row */
    const float scale = rsqrtf((float)hd);
    float qv[QA_G][EPL], m[QA_G], l[QA_G], o[QA_G][EPL];
#pragma unroll
    for (int h = 0; h < QA_G; h++) {
        m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            qv[h][e] = attend ? s_qkv[h * hd + lane * EPL + e] * scale : 0.0f, o[h][e] = 0.0f;
    }
    for (int p0 = lo + warp; attend && p0 <= hi; p0 += nw * QA_U) {
        if (p0 == lo + warp) { /* the prefetched round: only the current row is missing */
#pragma unroll
            for (int u = 0; u < QA_U; u++)
                if (min(p0 + u * nw, hi) == pos)
#pragma unroll
                    for (int e = 0; e < EPL; e++)
                        kr[u][e] = s_cur[lane * EPL + e], vr[u][e] = s_cur[hd + lane * EPL + e];
        } else {
            qa_load_round<KV, EPL>(kb, vb, t.kvw, p0, nw, hi, pos, s_cur, kr, vr);
        }
        float dot[QA_U][QA_G];
#pragma unroll
        for (int u = 0; u < QA_U; u++)
#pragma unroll
            for (int h = 0; h < QA_G; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    d += qv[h][e] * kr[u][e];
                dot[u][h] = warp_sum(d);
            }
#pragma unroll
        for (int u = 0; u < QA_U; u++) {
            if (p0 + u * nw > hi)
                break;
#pragma unroll
            for (int h = 0; h < QA_G; h++) {
                float mn = fmaxf(m[h], dot[u][h]), corr = __expf(m[h] - mn), pw = __expf(dot[u][h] - mn);
                l[h] = l[h] * corr + pw;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    o[h][e] = o[h][e] * corr + pw * vr[u][e];
                m[h] = mn;
            }
        }
    }
    /* the warps' results, then the block's: (max, sum, unnormalised output) per head; a short
     * context's block writes the output itself */
    if (attend) {
#pragma unroll
        for (int h = 0; h < QA_G; h++) {
            float *wp = s_warp + (warp * QA_G + h) * (hd + 2);
            if (lane == 0)
                wp[0] = m[h], wp[1] = l[h];
#pragma unroll
            for (int e = 0; e < EPL; e++)
                wp[2 + lane * EPL + e] = o[h][e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < QA_G * hd; i += blockDim.x) {
            int h = i / hd, d = i % hd;
            float M = -INFINITY;
            for (int w = 0; w < nw; w++)
                M = fmaxf(M, s_warp[(w * QA_G + h) * (hd + 2)]);
            float Ls = 0.0f, O = 0.0f;
            for (int w = 0; w < nw; w++) {
                const float *wp = s_warp + (w * QA_G + h) * (hd + 2);
                float f = wp[0] == -INFINITY ? 0.0f : __expf(wp[0] - M);
                Ls += wp[1] * f;
                O += wp[2 + d] * f;
            }
            if (single) {
                t.out[(int64_t)(grp * QA_G + h) * hd + d] = O / Ls;
            } else {
                s_part[h * (hd + 2) + 2 + d] = O;
                if (d == 0)
                    s_part[h * (hd + 2)] = M, s_part[h * (hd + 2) + 1] = Ls;
            }
        }
    }
    if (single) { /* barrier B's wait: the peers may leave once block 0 has read them */
        qa_wait();
        return;
    }
    qa_arrive(); /* barrier C: every block's partial result in its shared memory */
    qa_wait();

    /* 4. this block's share of the group's output dimensions, merged over the CS blocks */
    const int D = QA_G * hd / CS;
    if ((int)threadIdx.x < D) {
        int od = rank * D + threadIdx.x, h = od / hd, d = od % hd;
        float Mj[16], Lj[16], Oj[16], M = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (j < CS) {
                const float *pp = cl.map_shared_rank(s_part + h * (hd + 2), j);
                Mj[j] = pp[0], Lj[j] = pp[1], Oj[j] = pp[2 + d];
            }
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (j < CS)
                M = fmaxf(M, Mj[j]);
        float Ls = 0.0f, O = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (j < CS) {
                float f = Mj[j] == -INFINITY ? 0.0f : __expf(Mj[j] - M);
                Ls += Lj[j] * f;
                O += Oj[j] * f;
            }
        t.out[(int64_t)(grp * QA_G + h) * hd + d] = O / Ls;
    }
    qa_arrive(); /* barrier D: the peers have read this block's shared memory */
    qa_wait();
#else
    __trap();
#endif
}

/* The shape for these arguments, or false when the kernel does not take them: one token,
 * 16-bit weights of q, k and v in three segments feeding the attention's q / k / v, K a
 * multiple of 8 up to 2,048, head size 64 or 128, two query heads per KV head, RoPE fused, no
 * output gate; cluster 16 when asked for (cluster = 16) and the rows split evenly, else 8. */
static bool qa_shape_of(const struct gemv_args *g, const struct attn_args *t, int cluster, struct qa_shape *sh)
{
    if (g->T != 1 || t->T != 1 || g->n_seg != 3 || g->mode != GEMV_STORE || g->k_mixed || !g->norm_w ||
        (g->dtype != QR_BF16 && g->dtype != QR_F16) || !t->rope || t->gate || (t->hd != 64 && t->hd != 128) ||
        t->n_head != QA_G * t->n_head_kv || t->q_stride != t->hd || t->n_rot < 2 || t->n_rot > t->hd || t->n_rot % 2)
        return false;
    if (g->K < 8 || g->K % 8 || g->K > 2048 || g->ldx % 4 || (uintptr_t)g->x % 16 || (uintptr_t)g->norm_w % 16)
        return false;
    int64_t want[3] = {(int64_t)t->n_head * t->hd, (int64_t)t->n_head_kv * t->hd, (int64_t)t->n_head_kv * t->hd};
    const float *outs[3] = {t->q, t->rk, t->rv};
    for (int i = 0; i < 3; i++)
        if (g->seg[i].N != want[i] || g->seg[i].y != outs[i] || g->seg[i].row_bytes % 16 ||
            (uintptr_t)g->seg[i].w % 16 || g->seg[i].row_bytes < (int64_t)g->K * 2)
            return false;
    int R = (QA_G + 2) * t->hd, L = g->K <= 1024 ? 8 : 16, rpw = 32 / L;
    for (int cs = cluster == 16 ? 16 : 8; cs >= 8; cs /= 2) {
        int rows = R / cs, warps = rows / rpw;
        if (R % cs || rows % rpw || warps < QA_G + 1 || warps > QA_THREADS / 32 || (QA_G * t->hd) % cs ||
            QA_G * t->hd / cs > 32 * warps)
            continue;
        sh->cs = cs, sh->rows = rows, sh->L = L, sh->warps = warps, sh->wstride = g->K * 2;
        sh->smem = qa_smem_bytes(g->K, rows, sh->wstride, R, t->hd, warps);
        return sh->smem <= (size_t)GEMV_SMEM_KB_LIMIT * 1024;
    }
    return false;
}

bool qkv_attention_applies(const struct gemv_args *g, const struct attn_args *t, int cluster)
{
    struct qa_shape sh;
    return qa_shape_of(g, t, cluster, &sh);
}

template <int DT, typename KV, int EPL, int L>
static cudaError_t qa_go(const struct gemv_args *g, const struct attn_args *t, const struct qa_shape &sh,
                         cudaStream_t s)
{
    auto k = qkv_attn_kernel<DT, KV, EPL, L>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh.smem);
    if (e == cudaSuccess && sh.cs > 8)
        e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess)
        return e;
    return launch_kc(g->pdl, sh.cs, k, dim3((unsigned)(t->n_head_kv * sh.cs)), dim3(32 * sh.warps), sh.smem, s,
                     *g, *t, sh.wstride, !g->smem_after_wait);
}

template <int DT, typename KV>
static cudaError_t qa_kv(const struct gemv_args *g, const struct attn_args *t, const struct qa_shape &sh,
                         cudaStream_t s)
{
    if (t->hd == 64)
        return sh.L == 8 ? qa_go<DT, KV, 2, 8>(g, t, sh, s) : qa_go<DT, KV, 2, 16>(g, t, sh, s);
    return sh.L == 8 ? qa_go<DT, KV, 4, 8>(g, t, sh, s) : qa_go<DT, KV, 4, 16>(g, t, sh, s);
}

cudaError_t launch_qkv_attention(const struct gemv_args *g, const struct attn_args *t, int cluster, cudaStream_t s)
{
    struct qa_shape sh;
    if (!qa_shape_of(g, t, cluster, &sh))
        return cudaErrorInvalidValue;
    if (g->dtype == QR_F16)
        return t->kv_f16 ? qa_kv<QR_F16, __half>(g, t, sh, s) : qa_kv<QR_F16, float>(g, t, sh, s);
    return t->kv_f16 ? qa_kv<QR_BF16, __half>(g, t, sh, s) : qa_kv<QR_BF16, float>(g, t, sh, s);
}
