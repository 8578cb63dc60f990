/*
 * gdn_decode.cu — the decode graph's Gated DeltaNet step for one token, each value head split
 * over a cluster of blocks (sm_90): conv of the head's channels (when fused), q/k L2 norms,
 * gates, the state's decay and delta-rule update, the read-out and the gated RMS norm.
 *
 * Why: gdn_core_kernel (gdn_ops.cu) gives each value head one block, so Qwen3.5-0.8B's step
 * ran on 16 of 132 multiprocessors, each streaming its head's 64 KB f32 state in and out and
 * walking the conv, the norms and the two row sums one after another: ~10 us per layer for
 * ~2 MB of traffic (docs/perf-log.md, session 12). The state's columns are independent (each
 * needs the whole of q and k, and its own v), so here head j is a cluster of GS blocks, block
 * r owning the columns [r*CB, (r+1)*CB) (CB = dv / GS): every block convolves and normalises
 * q and k itself (2 * dk channels from L2, no exchange), and only the gated norm's sum of
 * squares crosses blocks: each block pushes its partial into every peer's shared memory
 * (distributed shared memory, st.async counted on the peer's mbarrier: gds_push_part), waits
 * for its own GS partials and sums them in rank order (the same total in every block). The
 * conv state and the in-place conv output are written after that wait (rank 0 for q and k,
 * each block for its v), so no block reads a value a peer has already shifted.
 *
 * Thread (cc, sub), cc = tid / TPC, owns column r*CB + cc at rows sub, sub+TPC, ...; the row
 * sums reduce over the TPC lanes of a column with shuffles, as in gdn_core_kernel. T = 1.
 *
 * Norm groups and wide blocks (cuda_options.gdn_wide): the gated norm's sum of squares is
 * added in G fixed groups of dv / G columns (gds_groups: G = 8 for Qwen3.5-0.8B), each group's
 * sum over its warps in warp order, then the G sums in group order, whatever the cluster. The
 * multi-session form, and the one-session form without gdn_wide, run one block per group
 * (GS = G). With gdn_wide the one-session form runs blocks of two groups (GS = G / 2: 16
 * clusters of 4 blocks of 512 threads for Qwen3.5-0.8B, against 16 of 8 blocks of 256): the
 * same sums in the same order, so the same bits. The 128 blocks of 256 threads shared
 * multiprocessors (two on each of 48: the H200's placement of clusters of 8), the 64 of 512
 * have one each. With them the step lets the next launch (out_proj) start only after its own
 * wait instead of at its start, so that out_proj's blocks take the multiprocessors the step
 * left free. Each change alone gained 0.5% or nothing, both together +2.1% (Qwen3.5-0.8B BF16
 * tg128 on the H200, docs/perf-log.md session 48).
 */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gdn_step.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

namespace cg = cooperative_groups;

#define GDS_TPC 16      /* threads per state column */
#define GDS_MAX_ROWS 16 /* rows per thread: dk <= 256 */
#define GDS_MAX_DK 256
#define GDS_MAX_GROUPS 8 /* norm groups per head (the most blocks per head: a portable cluster) */
#define GDS_WIDE_MAX_THREADS 512 /* a wide block at most (~96 registers a thread: one a multiprocessor) */
/* The multi-session form's registers: at most 64 a thread (blocks of up to GDS_MS_THREADS, 2 of
 * them per multiprocessor), where the one-session form takes 95. Qwen3.5-0.8B's step for 8
 * sessions is 1,024 blocks of 256 threads: at 95 registers 2 fit on a multiprocessor (~4 waves,
 * 33.5 us under ncu, 37% of the batched step), at 64 four (one wave). */
#define GDS_MS_THREADS 512
#define GDS_MS_BLOCKS 2
/* Each block's part of the gated norm's sum of squares goes to slot [rank] of every peer with
 * st.async, which counts its bytes on the peer's mbarrier (expecting GS * 4 of them): a block
 * waits for exactly the parts it needs. The cluster barrier this replaced (session 22) put a
 * GPU-scope memory fence before its arrival (MEMBAR.ALL.GPU + ERRBAR: 9% of the kernel's warp
 * stall samples in ncu); Qwen3.5-0.8B BF16 1,470 -> 1,484 tok/s (docs/perf-log.md). */
__device__ __forceinline__ void gds_push_part(float *part, uint64_t *bar, int slot, int peer, float v)
{
    uint32_t dst, mb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(smem_u32(part + slot)), "r"(peer));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mb) : "r"(smem_u32(bar)), "r"(peer));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
                 "r"(__float_as_uint(v)), "r"(mb)
                 : "memory");
}

/* The gated norm's groups of a head: the largest of 8, 4, 2 dividing dv with at least 4 columns
 * each; 0: none (the split does not apply). */
__host__ __device__ static inline int gds_groups(int dv)
{
    for (int g = GDS_MAX_GROUPS; g >= 2; g /= 2)
        if (dv % g == 0 && dv / g >= 4)
            return g;
    return 0;
}

/* q (qs) and k (ks) of key head kh, L2-normalised (q also by 1/sqrt(dk)): warp 0 and warp 1. */
__device__ __forceinline__ void gds_norm_qk(float *qs, float *ks, int dk)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < 2) {
        float *x = warp == 0 ? qs : ks, v[GDS_MAX_DK / 32], ss = 0.0f;
#pragma unroll
        for (int u = 0; u < GDS_MAX_DK / 32; u++) {
            v[u] = lane + 32 * u < dk ? x[lane + 32 * u] : 0.0f;
            ss += v[u] * v[u];
        }
        ss = warp_sum(ss);
        float r = rsqrtf(ss + 1e-6f) * (warp == 0 ? rsqrtf((float)dk) : 1.0f);
#pragma unroll
        for (int u = 0; u < GDS_MAX_DK / 32; u++)
            if (lane + 32 * u < dk)
                x[lane + 32 * u] = v[u] * r;
    }
    __syncthreads();
}

/* The thread's rows (sub, sub + TPC, ...) of state column c; zeros for a thread of no column. */
__device__ __forceinline__ void gds_load_state(const float *S, int nr, bool own, int sub, int dv, int c,
                                               float (&s)[GDS_MAX_ROWS])
{
#pragma unroll
    for (int i = 0; i < GDS_MAX_ROWS; i++)
        s[i] = i < nr && own ? S[(int64_t)(sub + GDS_TPC * i) * dv + c] : 0.0f;
}

/* cuda_options.gdn_staged (on by default: Qwen3.5-0.8B BF16 +1.6% on the H200, session 23;
 * the step's last block ends ~1.2 us sooner on the decode time line): the block's state
 * slice, dk rows of its CB columns, moves between global and shared memory in rows (a warp's lanes on consecutive columns: whole 32-byte sectors), and the
 * threads take their column's rows from there. Without it a warp's lanes are 16 rows of two
 * columns, each lane in its own sector (ncu: 67% of the kernel's L2 sectors excessive), for
 * the state's loads and for its stores, which end the kernel. tile: [dk][CB + 1] floats (the
 * extra column keeps a warp's column reads on different banks). */
__device__ __forceinline__ void gds_tile_load(const float *S, float *tile, int dk, int dv, int CB, int c0, int TS)
{
    if (TS == CB + 4) { /* gds_wide: 16 bytes a copy */
        const int C4 = CB / 4, n = dk * C4;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int r = e / C4, col = 4 * (e - r * C4);
            cp_async16(smem_u32(tile + r * TS + col), S + (int64_t)r * dv + c0 + col);
        }
    } else {
        const int n = dk * CB;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int r = e / CB, col = e - r * CB;
            cp_async4(smem_u32(tile + r * TS + col), S + (int64_t)r * dv + c0 + col);
        }
    }
    cp_async_commit();
}

__device__ __forceinline__ void gds_tile_store(float *S, const float *tile, int dk, int dv, int CB, int c0, int TS)
{
    if (TS == CB + 4) {
        const int C4 = CB / 4, n = dk * C4;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int r = e / C4, col = 4 * (e - r * C4);
            *(float4 *)(S + (int64_t)r * dv + c0 + col) = *(const float4 *)(tile + r * TS + col);
        }
        return;
    }
    const int n = dk * CB;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int r = e / CB, col = e - r * CB;
        S[(int64_t)r * dv + c0 + col] = tile[r * TS + col];
    }
}

/* The multi-session form moves its state tile 16 bytes at a time (a row stride of CB + 4
 * floats) where the columns and the state allow: at 8 sessions the 4-byte copies and stores of
 * 16 MB were ~2 x 16k memory instructions per multiprocessor (docs/perf-log.md, session 36). */
__device__ __forceinline__ bool gds_wide(const float *S, int dk, int dv, int CB)
{
    uint32_t smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
    return CB % 4 == 0 && dv % 4 == 0 && ((uintptr_t)S & 15) == 0 && smem >= (uint32_t)(dk * (CB + 4) * 4);
}

/* A block's parts of the gated norm's sum of squares: v summed over each warp, then over each
 * group of WG consecutive warps (PER groups in the block) as block_sum sums a block's warps (the
 * same butterfly over lanes < WG). Lane l of warp 0 gets group l % PER's sum; other warps get
 * 0. Contains two block barriers (the STAGED tile's reads are before them). */
template <int PER>
__device__ __forceinline__ float gds_group_part(float v, float *red, int WG)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float mine = 0.0f;
    if (warp == 0)
#pragma unroll
        for (int h = 0; h < PER; h++) {
            const float t = warp_sum(lane < WG ? red[h * WG + lane] : 0.0f);
            mine = lane % PER == h ? t : mine;
        }
    return mine;
}

/* The step of one head's CB columns (a block of its cluster). STAGED: cuda_options.gdn_staged
 * (a separate instantiation; without it each thread moves its own column). MS (gdn_args.n_seq):
 * one launch for several sessions, blockIdx.y the session: its rows, state and conv window
 * (gds_ms_kernel, whose registers are capped: GDS_MS_THREADS). PER: norm groups a block (1, or
 * 2 for gdn_wide's blocks; a constant, as the first build with a run-time count was 0.5 us
 * slower a step on the H200). */
template <bool STAGED, bool MS, int PER>
__device__ __forceinline__ void gds_step(const struct gdn_args &a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float qs[GDS_MAX_DK], ks[GDS_MAX_DK], red[32], part[GDS_MAX_GROUPS];
    __shared__ __align__(8) uint64_t part_bar; /* every peer's part landed (gds_push_part) */
    extern __shared__ float gds_tile[]; /* STAGED: [dk][TS] (gds_tile_load) */
    tl_stamp(a.stamps, 0);
    cg::cluster_group cl = cg::this_cluster();
    const int GS = (int)cl.num_blocks(), rank = (int)cl.block_rank(), j = (int)blockIdx.x / GS;
    constexpr int per = PER;
    const int G = GS * per;
    if (per == 1) /* wide blocks let the next launch in after their wait */
        griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before the wait) */
    const int dk = a.dk, dv = a.dv, CB = dv / GS, nr = dk / GDS_TPC;
    const int tid = threadIdx.x, cc = tid / GDS_TPC, sub = tid % GDS_TPC, c = rank * CB + cc;
    const bool own = cc < CB; /* a thread of one of the block's columns */
    /* STAGED: the tile's row stride (CB + 1: a warp's column reads on different banks; CB + 4:
     * 16-byte rows for the multi-session form's wide copies) */
    const int kh = a.tiled ? j % a.Hk : j / (a.Hv / a.Hk);
    const int sq = MS ? (int)blockIdx.y : 0; /* the session */
    float *S = (MS ? a.seq[sq].state : a.state) + (int64_t)j * dk * dv;
    const int TS = MS && gds_wide(S, dk, dv, CB) ? CB + 4 : CB + 1;
    float *const conv_state = MS ? a.seq[sq].conv_state : a.conv_state;
    float *const qkv = (float *)a.qkv + (MS ? (int64_t)sq * a.ldi : 0);
    /* the weights (gates' constants, norm weight, conv taps) before the wait; the state slice
     * and the conv windows too with a.early (the launch before waited first: the step of the
     * token before, which wrote them, has finished); then the gates and z: the chain starts
     * with every load in flight */
    if (tid == 0) { /* part_bar: one arrival (this one) and G parts of 4 bytes */
        mbar_init<1>(smem_u32(&part_bar));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&part_bar)),
                     "r"(G * 4)
                     : "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); /* waited for before the push */
    const int qch = kh * dk, kch = a.Hk * dk + kh * dk, vch = 2 * a.Hk * dk + j * dv + c;
    const int ch_qk = tid < 2 * dk ? (tid < dk ? qch + tid : kch + tid - dk) : -1;
    const bool conv_v = own && sub == 0;
    float dtb = a.dt[j], sa = a.ssm_a[j], gw = own ? a.gnorm_w[c] : 0.0f;
    float s[GDS_MAX_ROWS];
    struct gdn_conv_in cv_qk, cv_v;
    if (a.early) {
        if (STAGED)
            gds_tile_load(S, gds_tile, dk, dv, CB, rank * CB, TS);
        else
            gds_load_state(S, nr, own, sub, dv, c, s);
        if (a.conv_state && ch_qk >= 0)
            gdn_conv_load_at(a, conv_state, ch_qk, cv_qk);
        if (a.conv_state && conv_v)
            gdn_conv_load_at(a, conv_state, vch, cv_v);
    }
    griddep_wait();
    if (per > 1)
        griddep_launch();
    tl_stamp(a.stamps, 1);
    if (!a.early) {
        if (STAGED)
            gds_tile_load(S, gds_tile, dk, dv, CB, rank * CB, TS);
        else
            gds_load_state(S, nr, own, sub, dv, c, s);
        if (a.conv_state && ch_qk >= 0)
            gdn_conv_load_at(a, conv_state, ch_qk, cv_qk);
        if (a.conv_state && conv_v)
            gdn_conv_load_at(a, conv_state, vch, cv_v);
    }
    float b0 = a.b[(MS ? (int64_t)sq * a.ldb : 0) + j], a0 = a.a[(MS ? (int64_t)sq * a.lda : 0) + j];
    float z0 = own ? a.z[(MS ? (int64_t)sq * a.ldz : 0) + (int64_t)j * dv + c] : 0.0f;
    /* q and k (every block all of them), this block's v */
    float win_qk[GDN_CONV_MAX_K], win_v[GDN_CONV_MAX_K], y_qk = 0.0f, v = 0.0f;
    if (a.conv_state) {
        if (ch_qk >= 0)
            y_qk = gdn_conv_finish(a, cv_qk, qkv[ch_qk], win_qk);
        if (conv_v)
            v = gdn_conv_finish(a, cv_v, qkv[vch], win_v);
    } else {
        if (ch_qk >= 0)
            y_qk = qkv[ch_qk];
        if (conv_v)
            v = qkv[vch];
    }
    if (ch_qk >= 0) /* blockDim >= 2 dk: one channel per thread */
        (tid < dk ? qs : ks)[tid < dk ? tid : tid - dk] = y_qk;
    if (STAGED)
        cp_async_wait<0>(); /* this thread's copies; the barrier makes the tile whole */
    __syncthreads();
    if (STAGED)
#pragma unroll
        for (int i = 0; i < GDS_MAX_ROWS; i++)
            s[i] = i < nr && own ? gds_tile[(sub + GDS_TPC * i) * TS + cc] : 0.0f;
    gds_norm_qk(qs, ks, dk);
    v = __shfl_sync(0xffffffffu, v, (threadIdx.x & 31) & ~(GDS_TPC - 1)); /* the column's v to its lanes */
    float beta = sigmoid_f(b0), decay = expf(sa * softplus_f(a0 + dtb));
    float opart = gdn_column_step<GDS_TPC, GDS_MAX_ROWS>(s, nr, sub, ks, qs, decay, beta, v);
    /* the gated norm's sum of squares over the head's dv columns: this block's groups' parts
     * (each over its WG warps, as block_sum adds a block's), part h pushed to every peer's slot
     * [rank * per + h] by thread peer * per + h of warp 0 */
    const float ss = gds_group_part<PER>(sub == 0 && own ? opart * opart : 0.0f, red, (CB / PER) * GDS_TPC / 32);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* every peer has started */
    /* a peer's parts are sent after its reads of qkv and the conv state were used, so all G
     * parts here also mean that no peer still reads what rank 0 rewrites below */
    if (tid < G)
        gds_push_part(part, &part_bar, rank * per + tid % per, tid / per, ss);
    mbar_wait_parity(smem_u32(&part_bar), 0);
    float tot = 0.0f;
    for (int q = 0; q < G; q++)
        tot += part[q];
    if (own && sub == 0)
        a.out[(MS ? (int64_t)sq * a.ldo : 0) + (int64_t)j * dv + c] = opart * rsqrtf(tot / (float)dv + a.geps) * gw * silu_f(z0);
    if (STAGED) { /* every read of the tile was before gds_group_part's barriers */
#pragma unroll
        for (int i = 0; i < GDS_MAX_ROWS; i++)
            if (i < nr && own)
                gds_tile[(sub + GDS_TPC * i) * TS + cc] = s[i];
        __syncthreads();
        gds_tile_store(S, gds_tile, dk, dv, CB, rank * CB, TS);
    } else {
#pragma unroll
        for (int i = 0; i < GDS_MAX_ROWS; i++)
            if (i < nr && own)
                S[(int64_t)(sub + GDS_TPC * i) * dv + c] = s[i];
    }
    if (a.conv_state) {
        if (rank == 0 && ch_qk >= 0)
            gdn_conv_store_at(a, conv_state, qkv, ch_qk, y_qk, win_qk);
        if (own && sub == 0)
            gdn_conv_store_at(a, conv_state, qkv, vch, v, win_v);
    }
    tl_stamp(a.stamps, 3);
#else
    __trap();
#endif
}

template <bool STAGED, int PER>
__global__ void gds_kernel(const __grid_constant__ struct gdn_args a)
{
    gds_step<STAGED, false, PER>(a);
}

template <bool STAGED>
__global__ void __launch_bounds__(GDS_MS_THREADS, GDS_MS_BLOCKS) gds_ms_kernel(const __grid_constant__ struct gdn_args a)
{
    gds_step<STAGED, true, 1>(a);
}

/* Blocks per head (the cluster) of this launch: one per norm group, or one per two groups in
 * the one-session form with gdn_args.wide where that is 4+ groups and blocks of at most
 * GDS_WIDE_MAX_THREADS. */
static int gds_blocks(const struct gdn_args *a)
{
    const int g = gds_groups(a->dv);
    if (a->wide && !a->n_seq && g >= 4 && a->dv / (g / 2) * GDS_TPC <= GDS_WIDE_MAX_THREADS)
        return g / 2;
    return g;
}

bool gdn_split_applies(const struct gdn_args *a)
{
    int gs = gds_groups(a->dv); /* (wide blocks have twice the threads, at most 512) */
    if (a->T != 1 || !a->z || !gs || a->dk % GDS_TPC || a->dk > GDS_MAX_DK)
        return false;
    int threads = a->dv / gs * GDS_TPC;
    if (threads < 2 * a->dk || threads > 1024 || threads % 32)
        return false; /* one conv channel of q|k per thread; whole warps (the v shuffle) */
    return !a->conv_state || (a->Hv == a->Hk && a->conv_k >= 2 && a->conv_k <= GDN_CONV_MAX_K);
}

/* The staged state slice's shared memory (cuda_options.gdn_staged), bytes: dk rows of
 * dv / GS + 1 floats; 0 where the split does not apply or the tile would pass 44 KB (the
 * 48 KB a launch gets without raising its limit, less the kernel's static arrays): then the
 * state moves as without the option. */
static size_t gds_tile_bytes(const struct gdn_args *a, int pad = 1)
{
    int gs = gds_blocks(a);
    size_t bytes = gs ? (size_t)a->dk * (a->dv / gs + pad) * sizeof(float) : 0;
    return bytes <= 44 * 1024 ? bytes : 0;
}

cudaError_t launch_gdn_split(const struct gdn_args *a, cudaStream_t s)
{
    int gs = gds_blocks(a);
    size_t tile = a->staged ? gds_tile_bytes(a) : 0;
    if (tile && a->n_seq && gds_tile_bytes(a, 4)) /* room for gds_wide's rows */
        tile = gds_tile_bytes(a, 4);
    dim3 grid((unsigned)(a->Hv * gs), (unsigned)(a->n_seq ? a->n_seq : 1)), block((unsigned)(a->dv / gs * GDS_TPC));
    if (a->n_seq > GDN_MAX_SEQ)
        return cudaErrorInvalidValue;
    if (a->n_seq)
        return tile ? launch_kc(a->pdl, gs, gds_ms_kernel<true>, grid, block, tile, s, *a)
                    : launch_kc(a->pdl, gs, gds_ms_kernel<false>, grid, block, 0, s, *a);
    const bool wide = gs < gds_groups(a->dv);
    if (tile)
        return wide ? launch_kc(a->pdl, gs, gds_kernel<true, 2>, grid, block, tile, s, *a)
                    : launch_kc(a->pdl, gs, gds_kernel<true, 1>, grid, block, tile, s, *a);
    return wide ? launch_kc(a->pdl, gs, gds_kernel<false, 2>, grid, block, 0, s, *a)
                : launch_kc(a->pdl, gs, gds_kernel<false, 1>, grid, block, 0, s, *a);
}

extern "C" int32_t cuda_gdn_staged_bytes(int32_t dk, int32_t dv, bool wide)
{
    struct gdn_args a;
    memset(&a, 0, sizeof(a));
    a.dk = dk, a.dv = dv, a.T = 1, a.Hk = a.Hv = 1, a.wide = wide;
    a.z = (const float *)(uintptr_t)16; /* the gated norm fused: the split's condition */
    return gdn_split_applies(&a) ? (int32_t)gds_tile_bytes(&a) : 0;
}
