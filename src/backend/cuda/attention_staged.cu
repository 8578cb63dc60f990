/*
 * attention_staged.cu — the decode graph's attention (RoPE inside, T = 1) with the cached K/V
 * rows copied into shared memory by the copy engine (cuda_options.attn_stage): one block per
 * (KV head, split), its rows staged once for all the group's query heads, the arithmetic
 * reading shared memory.
 *
 * Why: deep in a context attention.cu's attention_kernel is latency-bound — at 4,096 positions
 * Nsight Compute finds it at 40% of the memory bandwidth and 20-34% of the arithmetic, each
 * warp holding at most two rounds of rows (8 KB) in flight in its registers, and fewer loads
 * (two query heads per block), fewer instructions (a row per group of lanes) or a contiguous
 * layout all left it where it was (docs/perf-log.md, session 29). Here the bytes in flight do
 * not live in registers: a ring of stages in shared memory, each a tile of TP positions' K and
 * V rows, filled by two tensor copies (cp.async.bulk.tensor: a box of TP rows of the block's
 * KV head from a map over the cache as [n_ctx][n_head_kv][HD], for K and for V, counted on the
 * stage's mbarrier) that one thread issues for the first stages before the wait (a.early) and
 * for each later tile as soon as the block is done with the stage it reuses. (A first form
 * copied each row on its own, 64 bulk copies a tile: level with the default kernel however
 * few bytes or deep a ring — the measurement build STG_ROW_COPIES 1 keeps it; perf-log
 * session 30.)
 *
 * Arithmetic per tile: a warp task is (query head g = warp mod G, PW consecutive positions);
 * for the scores each position takes LP = HD / 32 lanes, 32 elements a lane (16-byte chunks
 * (k ^ x) LP + c for lane part c, x = stg_xor of the row, so that a quarter-warp's rows read
 * different parts of 128 bytes: no bank conflicts on the dense rows), summed by log2(LP)
 * shuffles; one online-softmax update per task (the max over PW positions, not per row); then
 * the output, a lane's EPL = HD / 32 dimensions of each of the task's V rows, weighted by the
 * row's probability taken by shuffle from its lanes. Each warp keeps its head's (m, l, acc);
 * the block merges its warps head by head, then the splits merge as attention_kernel's do (a
 * partial per query head, the last block of the group merging all of them: attention_merge).
 * The current position's row is not in the cache when the copies start (the prologue writes
 * it): its K and V come from the prologue's copy in shared memory, as in attention_kernel.
 * The sums run in another order than attention_kernel's: the results agree to f32 rounding.
 * Needs sm_90 (tensor copies, mbarrier transaction counts): cuda_session takes it only there.
 * Not for the cluster-merged attention's graphs (attn_cluster).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <string.h>

#include <algorithm>

/* STG_ROW_COPIES 1 (a measurement build): one bulk copy per cached row into rows padded apart,
 * instead of one tensor copy per tile of K or V rows (perf-log session 30). */
#ifndef STG_ROW_COPIES
#define STG_ROW_COPIES 0
#endif
#ifndef STG_SMEM_MIN
#define STG_SMEM_MIN (96 * 1024) /* dynamic shared memory per block at least */
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define STG_SM90(stmt) __trap()
#else
#define STG_SM90(stmt) stmt
#endif

/* One instantiation's geometry (head size HD, cache element KV, G query heads per KV head). */
template <int HD, typename KV, int G>
struct stg_geo {
    static constexpr int LP = HD / 32;              /* lanes per position in the scores */
    static constexpr int PW = 32 / LP;              /* positions per warp task */
    static constexpr int CE = 16 / (int)sizeof(KV); /* elements per 16-byte chunk */
    static constexpr int NCH = 32 / CE;             /* chunks per lane per row */
    static constexpr int EPL = HD / 32;             /* output dimensions per lane */
    static constexpr int RB = HD * (int)sizeof(KV); /* bytes of a cached row */
    /* a staged row's stride: tensor copies write the rows densely (a quarter-warp's rows then
     * take different 64- or 32-byte parts of them: stg_xor); row copies pad them apart */
    static constexpr int RS = STG_ROW_COPIES ? RB + (LP * 16) % 128 : RB;
    /* positions per tile: G LP tasks (8 for Qwen3-0.6B: one per warp; a group of one query
     * head leaves warps idle). 64 for such groups made nvcc 13.0's cicc run for minutes. */
    static constexpr int TP = 32;
    static constexpr int TASKS = G * TP / PW;
    static constexpr int STAGE = 2 * TP * RS; /* K rows, then V rows */
    static_assert(ATT_WARPS % G == 0, "a warp's tasks stay with one query head");
};

/* The chunk order of a lane's row in the scores: dense rows put the same chunk of a
 * quarter-warp's rows (8 / LP of them) on the same banks, so row jr takes its lane's chunks in
 * the order k ^ (jr mod 8 / LP): the quarter-warp's rows read different parts of 128 bytes. */
template <class Geo>
__device__ __forceinline__ int stg_xor(int jr)
{
    return STG_ROW_COPIES ? 0 : jr % (8 / Geo::LP);
}

/* Thread 0 of warp 0: the tensor copy of one tile's K and V rows (TP positions from p0 of KV
 * head kvh: boxes of [TP][1][HD] from maps over [n_ctx][n_head_kv][HD]; rows past the cache
 * read as zeros), counted on bar. */
template <class Geo>
__device__ __forceinline__ void stg_issue_tiles(const CUtensorMap &tk, const CUtensorMap &tv, int kvh, int p0,
                                                uint32_t st, uint32_t bar)
{
    STG_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                          "n"(Geo::STAGE)
                          : "memory"));
    STG_SM90(asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                          " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(st), "l"((uint64_t)&tk), "r"(0), "r"(kvh),
                          "r"(p0), "r"(bar)
                          : "memory"));
    STG_SM90(asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                          " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(st + (uint32_t)(Geo::TP * Geo::RS)),
                          "l"((uint64_t)&tv), "r"(0), "r"(kvh), "r"(p0), "r"(bar)
                          : "memory"));
}

/* One row's bulk copy (RB bytes, 16-byte aligned at both ends) into shared memory at dst,
 * counted on mbarrier bar. */
template <int RB>
__device__ __forceinline__ void stg_row_copy(uint32_t dst, const char *src, uint32_t bar)
{
    STG_SM90(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                          ::"r"(dst), "l"(src), "n"(RB), "r"(bar)
                          : "memory"));
}

/* Warp 0: starts the copies of the n cached rows from position p0 (K and V, one bulk copy per
 * row) into the stage at address st, counted on mbarrier bar (n = 0: the phase completes). */
template <class Geo>
__device__ __forceinline__ void stg_issue(const char *kb, const char *vb, int64_t row_bytes, int p0, int n,
                                          uint32_t st, uint32_t bar)
{
    const int lane = threadIdx.x & 31;
    if (lane == 0)
        STG_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                              "r"((uint32_t)(n * 2 * Geo::RB))
                              : "memory"));
    __syncwarp();
    for (int j = lane; j < n; j += 32) {
        const int64_t off = (int64_t)(p0 + j) * row_bytes;
        stg_row_copy<Geo::RB>(st + (uint32_t)(j * Geo::RS), kb + off, bar);
        stg_row_copy<Geo::RB>(st + (uint32_t)((Geo::TP + j) * Geo::RS), vb + off, bar);
    }
}

/* One warp task: positions t0 + j0 .. t0 + j0 + PW - 1 of the tile staged at sk (K) / sv (V)
 * into this warp's online softmax (m, l: this lane's share of the sum) and output acc. The
 * current position pos reads the prologue's rows cur_k / cur_v; positions past last are left
 * out (their scores -inf; their V rows clamped to a valid one, weighted 0). */
template <class Geo, typename KV>
__device__ __forceinline__ void stg_task(const unsigned char *sk, const unsigned char *sv, int t0, int j0, int last,
                                         int pos, const KV *cur_k, const KV *cur_v,
                                         const float (&q)[Geo::NCH][Geo::CE], float &m, float &l,
                                         float (&acc)[Geo::EPL])
{
    constexpr int LP = Geo::LP, PW = Geo::PW, CE = Geo::CE, EPL = Geo::EPL;
    const int lane = threadIdx.x & 31, c = lane % LP, jr = lane / LP, p = t0 + j0 + jr, xr = stg_xor<Geo>(jr);
    const KV *krow = p == pos ? cur_k : (const KV *)(sk + (j0 + jr) * Geo::RS);
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < Geo::NCH; k++) {
        float x[CE];
        kv_get<CE>(krow + ((k ^ xr) * LP + c) * CE, x);
#pragma unroll
        for (int e = 0; e < CE; e++)
            d += q[k][e] * x[e];
    }
#pragma unroll
    for (int o = 1; o < LP; o <<= 1)
        d += __shfl_xor_sync(0xffffffffu, d, o);
    d = p <= last ? d : -INFINITY;
    float mx = d;
#pragma unroll
    for (int o = LP; o < 32; o <<= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx), corr = __expf(m - m_new), pj = __expf(d - m_new);
    l = l * corr + (c == 0 ? pj : 0.0f);
#pragma unroll
    for (int e = 0; e < EPL; e++)
        acc[e] *= corr;
#pragma unroll
    for (int j = 0; j < PW; j++) {
        const float w = __shfl_sync(0xffffffffu, pj, j * LP);
        const int pp = min(t0 + j0 + j, last);
        const KV *vrow = pp == pos ? cur_v : (const KV *)(sv + (pp - t0) * Geo::RS);
        float v[EPL];
        kv_get<EPL>(vrow + lane * EPL, v);
#pragma unroll
        for (int e = 0; e < EPL; e++)
            acc[e] += w * v[e];
    }
    m = m_new;
}

/* TL: the decode timeline's variant (a.stamps written), as attention_kernel's. */
template <int HD, typename KV, int G, bool TL>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    attention_staged_kernel(const __grid_constant__ struct attn_args a, const __grid_constant__ CUtensorMap tk,
                            const __grid_constant__ CUtensorMap tv)
{
    using Geo = stg_geo<HD, KV, G>;
    constexpr int EPL = Geo::EPL, TP = Geo::TP;
    if (TL)
        tl_stamp(a.stamps, 0);
    griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before any wait) */
    if (!a.early)
        griddep_wait();
    extern __shared__ __align__(128) unsigned char stg_ring[];
    __shared__ __align__(8) uint64_t stg_full[ATT_STAGES_MAX];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][HD];
    __shared__ __align__(16) float r_q[G][HD], r_k[HD], r_v[HD];
    __shared__ float r_cs[HD / 2], r_sn[HD / 2];
    __shared__ __align__(16) KV r_k16[sizeof(KV) == 2 ? HD : 8], r_v16[sizeof(KV) == 2 ? HD : 8];
    const KV *cur_k = sizeof(KV) == 2 ? r_k16 : (const KV *)r_k, *cur_v = sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    const int kvh = blockIdx.x, h0 = kvh * G, z = blockIdx.z, nz = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pos = *a.pos0;
    int last = pos, lo, S = attention_splits(a, last, nz); /* attention_kernel's splits */
    if (z >= S)
        return;
    attention_split_range(S, z, &lo, &last);
    const int nst = a.stages, nt = (last - lo + TP) / TP, cached_last = min(last, pos - 1);
    const char *kb = (const char *)a.kc + (int64_t)kvh * Geo::RB, *vb = (const char *)a.vc + (int64_t)kvh * Geo::RB;
    const int64_t row_bytes = (int64_t)a.kvw * (int64_t)sizeof(KV);
    const uint32_t ring = (smem_u32(stg_ring) + 127u) & ~127u, bar0 = smem_u32(stg_full); /* tensor copies: 128-byte aligned */
    auto rows_of = [&](int i) { return max(0, min(TP, cached_last - (lo + i * TP) + 1)); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; s++)
            mbar_init<1>(bar0 + 8 * s);
        STG_SM90(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
    }
    __syncthreads();
    auto issue = [&](int i, int s) { /* tile i into stage s */
        if (STG_ROW_COPIES)
            stg_issue<Geo>(kb, vb, row_bytes, lo + i * TP, rows_of(i), ring + s * Geo::STAGE, bar0 + 8 * s);
        else if (lane == 0)
            stg_issue_tiles<Geo>(tk, tv, kvh, lo + i * TP, ring + s * Geo::STAGE, bar0 + 8 * s);
    };
    if (warp == 0) /* the first stages' rows (written by earlier steps) before the wait */
        for (int i = 0; i < nst && i < nt; i++)
            issue(i, i);
    if (a.early)
        griddep_wait();
    if (TL)
        tl_stamp(a.stamps, 1);
    attention_rope_prologue<EPL, KV, G>(a, h0, kvh, pos, last == pos, r_q[0], r_k, r_v, r_k16, r_v16, r_cs, r_sn,
                                        r_q[0] + HD);
    if (TL)
        tl_stamp(a.stamps, 2);
    const int g = warp % G;
    float q[Geo::NCH][Geo::CE], acc[EPL], m = -INFINITY, l = 0.0f;
    const float scale = rsqrtf((float)HD);
#pragma unroll
    for (int k = 0; k < Geo::NCH; k++)
#pragma unroll
        for (int e = 0; e < Geo::CE; e++)
            q[k][e] = r_q[g][((k ^ stg_xor<Geo>(lane / Geo::LP)) * Geo::LP + lane % Geo::LP) * Geo::CE + e] * scale;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        acc[e] = 0.0f;
    for (int i = 0; i < nt; i++) {
        const int s = i % nst, t0 = lo + i * TP;
        mbar_wait_parity(bar0 + 8 * s, (uint32_t)(i / nst) & 1u);
        const unsigned char *sk = stg_ring + (ring - smem_u32(stg_ring)) + s * Geo::STAGE, *sv = sk + TP * Geo::RS;
        for (int t = warp; t < Geo::TASKS; t += ATT_WARPS) {
            const int j0 = t / G * Geo::PW;
            if (t0 + j0 > last)
                break; /* the tile's later tasks are past the split too */
            stg_task<Geo, KV>(sk, sv, t0, j0, last, pos, cur_k, cur_v, q, m, l, acc);
        }
        __syncthreads(); /* every warp is done with stage s: it takes tile i + nst */
        if (warp == 0 && i + nst < nt)
            issue(i + nst, s);
    }
    l = warp_sum(l);
    if (lane == 0)
        s_m[warp] = m, s_l[warp] = l;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    auto gate_of = [&](int j) { return a.q + (int64_t)(h0 + j) * a.q_stride + HD; };
    auto out_of = [&](int j) { return a.out + (int64_t)(h0 + j) * HD; };
#pragma unroll
    for (int j = 0; j < G; j++) { /* head h0 + j: its warps j, j + G, ... merged */
        float M = -INFINITY, L = 0.0f, f[ATT_WARPS / G];
#pragma unroll
        for (int w = 0; w < ATT_WARPS / G; w++)
            M = fmaxf(M, s_m[j + w * G]);
#pragma unroll
        for (int w = 0; w < ATT_WARPS / G; w++) {
            f[w] = s_m[j + w * G] == -INFINITY ? 0.0f : __expf(s_m[j + w * G] - M);
            L += s_l[j + w * G] * f[w];
        }
        float *part = S > 1 ? a.part + ((int64_t)(h0 + j) * nz + z) * (HD + 2) : nullptr;
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS / G; w++)
                o += s_acc[j + w * G][d] * f[w];
            if (part) {
                part[2 + d] = o;
            } else {
                o /= L;
                if (a.gate)
                    o *= sigmoid_f(gate_of(j)[d]);
                out_of(j)[d] = o;
            }
        }
        if (part && threadIdx.x == 0)
            part[0] = M, part[1] = L;
    }
    if (S > 1 && attention_split_arrive(a, h0, S)) { /* the group's last block merges its heads */
        __threadfence();
        for (int j = 0; j < G; j++) {
            attention_merge<EPL>(a, a.part + (int64_t)(h0 + j) * nz * (HD + 2), HD + 2, S, out_of(j), gate_of(j));
            __syncthreads(); /* attention_merge's shared weights are reused by the next head */
        }
    }
    if (TL)
        tl_stamp(a.stamps, 3);
}

/* The ring's stages for a.stages asked (at most ATT_STAGES_MAX, and what fits beside the
 * kernel's static shared memory in a multiprocessor's 227 KB). */
template <class Geo>
static int stg_stages(const struct attn_args *a)
{
    int n = a->stages < ATT_STAGES_MAX ? a->stages : ATT_STAGES_MAX;
    while (n > 1 && (size_t)n * Geo::STAGE + 128 > (size_t)200 * 1024)
        n--;
    return n;
}

/* A tensor map over one layer's K or V cache as [n_ctx][n_head_kv][hd] (elements of es bytes),
 * boxes of [TP][1][hd]; the encoder comes from the driver through the runtime (no link to
 * libcuda). */
static cudaError_t stg_tensor_map(CUtensorMap *map, const void *cache, const struct attn_args *a, int tp)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                     cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !encode)
        return e != cudaSuccess ? e : cudaErrorNotSupported;
    const cuuint64_t es = a->kv_f16 ? 2 : 4;
    const cuuint64_t dim[3] = {(cuuint64_t)a->hd, (cuuint64_t)a->n_head_kv, (cuuint64_t)a->n_ctx};
    const cuuint64_t stride[2] = {(cuuint64_t)a->hd * es, (cuuint64_t)a->kvw * es};
    const cuuint32_t box[3] = {(cuuint32_t)a->hd, 1, (cuuint32_t)tp}, one[3] = {1, 1, 1};
    CUresult r = encode(map, a->kv_f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3,
                        (void *)cache, dim, stride, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int HD, typename KV, int G>
static cudaError_t launch_staged(const struct attn_args *a, cudaStream_t s)
{
    using Geo = stg_geo<HD, KV, G>;
    struct attn_args b = *a;
    b.stages = stg_stages<Geo>(a);
    /* at least STG_SMEM_MIN: two blocks per multiprocessor at most, so that a launch of ~256
     * blocks spreads over all of them (with 64 KB the hardware put three on each of 88 and
     * left 44 idle: time line, perf-log session 30) */
    const size_t smem = std::max((size_t)b.stages * Geo::STAGE + 128, (size_t)STG_SMEM_MIN);
    CUtensorMap tk, tv;
    memset(&tk, 0, sizeof(tk));
    memset(&tv, 0, sizeof(tv));
    if (!STG_ROW_COPIES) {
        cudaError_t e = stg_tensor_map(&tk, a->kc, a, Geo::TP);
        if (e == cudaSuccess)
            e = stg_tensor_map(&tv, a->vc, a, Geo::TP);
        if (e != cudaSuccess)
            return e;
    }
    int splits = a->splits > 1 && a->part && a->count ? a->splits : 1;
    dim3 grid(a->n_head_kv, 1, splits), block(32 * ATT_WARPS);
    void (*k)(struct attn_args, CUtensorMap, CUtensorMap) = a->stamps ? attention_staged_kernel<HD, KV, G, true>
                                            : attention_staged_kernel<HD, KV, G, false>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    return launch_k(a->pdl, k, grid, block, smem, s, b, tk, tv);
}

bool attention_staged_applies(const struct attn_args *a)
{
    if (!(a->T == 1 && a->rope && !a->cluster_merge && a->stages > 0 && a->n_rot <= a->hd && a->n_head_kv > 0 &&
          a->n_head % a->n_head_kv == 0))
        return false;
    const int G = a->n_head / a->n_head_kv;
    const int64_t row_bytes = (int64_t)a->kvw * (a->kv_f16 ? 2 : 4);
    return (G == 1 || G == 2 || G == 4) && (a->hd == 64 || a->hd == 128 || a->hd == 256) && row_bytes % 16 == 0 &&
           (uintptr_t)a->kc % 16 == 0 && (uintptr_t)a->vc % 16 == 0 && a->n_ctx > 0;
}

template <int HD, typename KV>
static cudaError_t launch_staged_g(const struct attn_args *a, cudaStream_t s)
{
    switch (a->n_head / a->n_head_kv) {
    case 1: return launch_staged<HD, KV, 1>(a, s);
    case 2: return launch_staged<HD, KV, 2>(a, s);
    case 4: return launch_staged<HD, KV, 4>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

template <typename KV>
static cudaError_t launch_staged_kv(const struct attn_args *a, cudaStream_t s)
{
    switch (a->hd) {
    case 64: return launch_staged_g<64, KV>(a, s);
    case 128: return launch_staged_g<128, KV>(a, s);
    case 256: return launch_staged_g<256, KV>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_attention_staged(const struct attn_args *a, cudaStream_t s)
{
    if (!attention_staged_applies(a))
        return cudaErrorInvalidValue;
    return a->kv_f16 ? launch_staged_kv<__half>(a, s) : launch_staged_kv<float>(a, s);
}
