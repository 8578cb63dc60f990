/*
 * gemv_smem.cu — the one-token GEMV for 16-bit weights with the block's rows copied into
 * shared memory at its start, made for programmatic dependent launch (cuda_options.gemv_smem,
 * used with pdl in the decode graph).
 *
 * Why: a decode step is a chain of launches, and each GEMV of 4-13 MB costs ~2-3 us more than
 * its bytes: the launch, then one DRAM round trip before the first weight arrives, because
 * nobody asked for the weights until the kernel started. PDL lets the next kernel start while
 * the one before it finishes, so its weight loads can be in flight by then. With gemv2 that
 * never happened: gemv2 holds its weights in registers (64 per thread) and its blocks fill
 * the register file, so the next kernel's blocks cannot become resident early
 * (docs/perf-log.md, sessions 1 and 3). Here the weights wait in shared memory (the largest
 * matrix of a layer is ~95 KB per multiprocessor, 228 KB exist) and a thread needs few
 * registers, so the next GEMV's blocks fit beside the running kernel's (session 13's
 * timeline, `cuda_bench --gemv`: every block of the next launch starts 4-30 us early).
 *
 * Once the weights are in shared memory, shared memory bounds the dot products: a 16-byte
 * load of a warp takes four wavefronts (one cycle each per multiprocessor) whether its lanes
 * read 512 different bytes or fewer, and x in f32 is twice the bytes of the 16-bit weights.
 * So a warp owns RPW rows (4 for K <= 1024, 2 above: 32 / L in gs_shape's terms) and every
 * lane reads its chunks c = lane, lane + 32, ... of x once (x staged as two arrays, elements
 * 0-3 and 4-7 of each 8-element chunk) and uses them for all of the warp's rows: per 16 bytes
 * of weights 4 + 8 / (RPW * P) wavefronts, where a group of L lanes per row (sessions 13-20)
 * read x once per row: 12 (8 for the SwiGLU pair). Session 21's time line had the dot products
 * at 1.2-1.6 us of each launch's ~3 us after its release; this order measured Qwen3-0.6B BF16
 * +5.4% and Qwen3.5-0.8B BF16 +4.3% (docs/perf-log.md). Each lane's RPW * P sums are
 * independent chains, and gs_reduce_rows adds them over the warp by exchanging halves of the
 * rows: P (RPW - 1 + 5 - log2 RPW) shuffles instead of 5 RPW P.
 *
 * A block: W warps (cuda_options.gemv_smem_warps; by default the session picks 8, or 16 for
 * a model whose widest product would need more than one block of 8 warps per multiprocessor),
 * halved until its rows and x fit in gemv_smem_kb (picked with W: 136 KB, or 160) and while
 * the grid would have fewer than gemv_smem_min_blocks blocks (picked: 96, or 192; the GEMV +
 * residual launches and the SwiGLU pairs their own minima, gemv_smem_res_min_blocks and
 * gemv_smem_pair_min_blocks: 96, or 64); the
 * kernel's dynamic shared-memory limit is raised at launch when a block needs more than 48 KB.
 * In order:
 *   1. each lane copies its 16-byte chunks (lane, lane + 32, ...) of each of the warp's rows
 *      (P = 2: gate and up) into shared memory with cp.async; nothing reads activations yet;
 *   2. griddep_launch (the next kernel may start; after the wait instead when the session
 *      says so: pick_gemv_smem_shape), the first norm weights, griddep_wait;
 *   3. x staged and RMS-normalised in shared memory;
 *   4. each lane waits for its own copies (a thread's cp.async are visible to itself after
 *      its wait_group: no barrier), sums its chunks of every row, gs_reduce_rows adds the
 *      lanes' parts, and one lane per row stores.
 * With cuda_options.gemv_smem_xreg (on by default since session 22: Qwen3-0.6B BF16 +1.7%,
 * Qwen3.5-0.8B +0.2%, docs/perf-log.md) step 3 is each warp's own where K allows: its lanes
 * load their chunks of x from global memory into registers (4 per lane for K <= 1024, with
 * the norm's weights loaded before the wait; 8 for K <= 2048 without a norm), the warp sums
 * the squares itself (gs_load_x_regs), and the dot products read only weights from shared
 * memory: no x in shared memory, no block barrier, 4 wavefronts per 512 bytes of weights.
 * With cuda_options.gemv_smem_norm_late (picked by the session since session 24: on with
 * 16-warp blocks, Qwen3.5-0.8B BF16 +0.65%; off with 8, Qwen3-0.6B -0.1%) a launch
 * with a fused norm and x in registers multiplies x by the norm's weights only, and the row
 * sums by 1 / rms after the warp's reduction: the warp_sum of the squares (five shuffles) and
 * the rsqrt no longer stand between x's arrival and the first dot product.
 * The order of the sums differs from gemv2's (its lane-per-chunk order, then a butterfly per
 * row; here the same chunks per lane, then the exchange of halves), so the results may differ
 * from gemv2's by rounding; test_cuda_ops compares both with the CPU reference.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_smem.cuh"
#include "backend/cuda/gemv_stage.cuh"

#include <string.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#ifndef GS_MAX_ROWS
#define GS_MAX_ROWS 65536 /* more rows (an LM head: 311 MB streams best as gemv2) go to gemv2 */
#endif
#ifndef GS_L_SMALL
#define GS_L_SMALL 8 /* L for K <= 1024: 32 / L = 4 rows per warp (gemv_mma: L / 4 warps per tile) */
#endif
#ifndef GS_L_BIG
#define GS_L_BIG 16 /* L for 1024 < K <= 2048: 2 rows per warp */
#endif
#ifndef GS_L_HUGE
#define GS_L_HUGE GS_L_BIG /* L for K > 2048 */
#endif
#ifndef GS_WARPS_MAX
#define GS_WARPS_MAX 8 /* default warps per block (fewer only when their rows would not fit) */
#endif
#ifndef GS_SMEM_MAX
#define GS_SMEM_MAX (120 * 1024) /* default dynamic shared memory per block (a multiprocessor has 228 KB) */
#endif

/* Row lr of the launch: its P weight rows and its output; false past the last row. */
template <int P>
__device__ __forceinline__ bool gs_row(const struct gemv_args &a, int64_t lr, const uint4 *(&rp)[P], float *&yp)
{
    if (P == 2) {
        bool ok = lr < a.seg[0].N;
        rp[0] = (const uint4 *)((const uint8_t *)a.seg[0].w + (ok ? lr : 0) * a.seg[0].row_bytes);
        rp[P - 1] = (const uint4 *)((const uint8_t *)a.seg[1].w + (ok ? lr : 0) * a.seg[1].row_bytes);
        yp = a.seg[0].y + (ok ? lr : 0);
        return ok;
    }
    int sg = 0;
    int64_t r = lr;
    while (sg < a.n_seg - 1 && r >= a.seg[sg].N)
        r -= a.seg[sg++].N;
    bool ok = r < a.seg[sg].N;
    rp[0] = (const uint4 *)((const uint8_t *)a.seg[sg].w + (ok ? r : 0) * a.seg[sg].row_bytes);
    yp = a.seg[sg].y + (ok ? r : 0);
    return ok;
}

/* One 16-byte chunk ch of each of the warp's RPW x P rows (at shared address wrow, wstride
 * apart) times x's elements x0 (0-3) and x1 (4-7), added to acc. */
template <int DT, int RPW, int P>
__device__ __forceinline__ void gs_dot_chunk(uint32_t wrow, int32_t wstride, int ch, float4 x0, float4 x1,
                                             float (&acc)[RPW][P])
{
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int p = 0; p < P; p++) {
            uint4 raw;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                         : "r"(wrow + (uint32_t)((r * P + p) * wstride + ch * 16)));
            acc[r][p] += gemv_dot8x<DT>(raw, x0, x1);
        }
}

/* The warp's sums of its RPW rows (P each), every lane holding its parts of all of them,
 * reduced over the 32 lanes: halves of the rows exchanged (lanes with bit 16 >> s set keep the
 * upper half) until each lane holds one row, then a butterfly over the lanes that share it.
 * Afterwards lane l holds row (l >> (5 - S)) & (RPW - 1), S = log2 RPW. */
template <int RPW, int P>
__device__ __forceinline__ void gs_reduce_rows(float (&acc)[RPW][P], int lane)
{
    constexpr int S = RPW >= 8 ? 3 : RPW >= 4 ? 2 : RPW >= 2 ? 1 : 0;
#pragma unroll
    for (int s = 0; s < S; s++) {
        const int o = 16 >> s, half = RPW >> (s + 1);
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < half; i++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                float send = upper ? acc[i][p] : acc[i + half][p];
                float keep = upper ? acc[i + half][p] : acc[i][p];
                acc[i][p] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
    }
#pragma unroll
    for (int o = 16 >> S; o > 0; o >>= 1)
#pragma unroll
        for (int p = 0; p < P; p++)
            acc[0][p] += __shfl_xor_sync(0xffffffffu, acc[0][p], o);
}

/* cuda_options.gemv_smem_xreg: the warp's own copy of x in registers, xr[i] = chunk lane + 32 i
 * (elements 0-3, 4-7), RMS-normalised as gs_stage_x does it (x * (1 / rms) * norm_w, the sum of
 * squares over the warp's lanes instead of the block's threads, so 1 / rms may differ in its
 * last bit) when a.norm_w; NORM false: the launch has no norm. g holds the lane's norm weights,
 * loaded before the wait. No shared memory, no block barrier. */
template <int NC, bool NORM, bool LATE = false>
__device__ __forceinline__ float gs_load_x_regs(const struct gemv_args &a, const float4 (&g)[NC][2], float4 (&xr)[NC][2])
{
    const int lane = threadIdx.x & 31, nchunk = a.K / 8;
    const float4 *xt = (const float4 *)a.x, zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const int c = lane + 32 * i;
        xr[i][0] = c < nchunk ? xt[2 * c] : zero;
        xr[i][1] = c < nchunk ? xt[2 * c + 1] : zero;
    }
    if (!NORM)
        return 1.0f;
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NC; i++)
        ss += gemv_sumsq4(xr[i][0]) + gemv_sumsq4(xr[i][1]);
    const float inv = rsqrtf(warp_sum(ss) / (float)a.K + a.eps);
#pragma unroll
    for (int i = 0; i < NC; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float4 v = xr[i][h], w = g[i][h];
            /* LATE: x * norm_w now, 1 / rms on the row sums (the caller) */
            xr[i][h] = LATE ? make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w) : gemv_norm4(v, inv, w);
        }
    return inv;
}

/* 32 / L rows per warp (gs_shape.L; every lane sums a part of each), P physical rows per row
 * (2: the SwiGLU gate/up pair); wstride: bytes between rows in shared memory (K * 2); NC: x
 * chunks per lane in registers (gs_shape.xreg; 0: x staged in shared memory). LATE (with NC
 * and a fused norm; gemv_args.smem_norm_late): the dot products take x * norm_w and the row
 * sums are scaled by 1 / rms after the warp's reduction, so the warp's sum of squares is off
 * the chain between x's arrival and the first dot product. */
template <int DT, int P, int L, int NC, bool LATE = false>
__global__ void __launch_bounds__(32 * GEMV_SMEM_WARPS_LIMIT) gemv_smem_kernel(const __grid_constant__ struct gemv_args a,
                                                                       int32_t wstride, bool launch_early)
{
    extern __shared__ float4 gs_smem4[];
    __shared__ float s_red[GEMV_SMEM_WARPS_LIMIT];
    unsigned long long *st = a.stamps && threadIdx.x == 0 ? a.stamps + TL_SLOTS * (size_t)blockIdx.x : NULL;
    if (st)
        st[0] = globaltimer_ns(), st[4] = tl_smid() + 1ull;
    constexpr int RPW = 32 / L; /* rows per warp */
    constexpr int S = RPW >= 8 ? 3 : RPW >= 4 ? 2 : RPW >= 2 ? 1 : 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, nchunk = a.K / 8;
    float4 *xlo = gs_smem4, *xhi = gs_smem4 + nchunk; /* NC == 0 */
    const uint32_t wrow = smem_u32(gs_smem4 + (NC ? 0 : 2 * nchunk)) + (uint32_t)(warp * RPW * P * wstride);
    const int64_t lr0 = ((int64_t)blockIdx.x * nw + warp) * RPW;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const uint4 *rp[P];
        float *y;
        if (gs_row<P>(a, lr0 + r, rp, y))
#pragma unroll
            for (int p = 0; p < P; p++)
                for (int ch = lane; ch < nchunk; ch += 32)
                    cp_async16(wrow + (uint32_t)((r * P + p) * wstride + ch * 16), rp[p] + ch);
    }
    const int my_r = (lane >> (5 - S)) & (RPW - 1); /* the row this lane stores (gs_reduce_rows) */
    const uint4 *rp_mine[P];
    float *yp;
    const bool stores = (lane & ((32 >> S) - 1)) == 0 && gs_row<P>(a, lr0 + my_r, rp_mine, yp);
    constexpr int NCX = NC > 0 ? NC : 1;
    constexpr bool NORM = NC > 0 && NC <= 4; /* registers for x and its norm weights (gemv_smem_shape) */
    float4 g0[GEMV_NW], gx[NCX][2], xr[NCX][2];
    if (NORM) { /* the lane's norm weights, constant: before the wait */
        const float4 *nw = (const float4 *)a.norm_w, one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll
        for (int i = 0; i < NCX; i++) {
            const int c = lane + 32 * i;
            gx[i][0] = nw && c < nchunk ? __ldg(nw + 2 * c) : one;
            gx[i][1] = nw && c < nchunk ? __ldg(nw + 2 * c + 1) : one;
        }
    }
    gs_commit_and_wait(a, launch_early, g0);
    if (st)
        st[1] = globaltimer_ns();
    float yold = a.mode == GEMV_ACCUM && stores ? *yp : 0.0f;
    float inv = 1.0f; /* LATE: the row sums' 1 / rms */
    if (NC == 0)
        gs_stage_x(a, xlo, xhi, g0, s_red);
    else if (NORM && a.norm_w)
        inv = gs_load_x_regs<NCX, true, LATE>(a, gx, xr);
    else
        gs_load_x_regs<NCX, false>(a, gx, xr);
    cp_async_wait<0>();
    if (st)
        st[2] = globaltimer_ns();
    float acc[RPW][P];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int p = 0; p < P; p++)
            acc[r][p] = 0.0f;
    if (NC == 0) {
#pragma unroll(RPW * P > 8 ? 1 : 2) /* 16 chains of two chunks spill */
        for (int ch = lane; ch < nchunk; ch += 32)
            gs_dot_chunk<DT, RPW, P>(wrow, wstride, ch, xlo[ch], xhi[ch], acc);
    } else {
#pragma unroll
        for (int i = 0; i < NCX; i++)
            if (lane + 32 * i < nchunk)
                gs_dot_chunk<DT, RPW, P>(wrow, wstride, lane + 32 * i, xr[i][0], xr[i][1], acc);
    }
    gs_reduce_rows<RPW, P>(acc, lane);
    if (LATE)
#pragma unroll
        for (int p = 0; p < P; p++)
            acc[0][p] *= inv;
    float v = acc[0][0];
    if (P == 2)
        v = v / (1.0f + __expf(-v)) * acc[0][P - 1];
    if (stores) {
        v = a.mode == GEMV_ACCUM ? yold + v : v;
        *yp = v;
        if (a.y_copy)
            a.y_copy[yp - a.seg[0].y] = v;
    }
    if (st)
        st[3] = globaltimer_ns();
}

/* L at this K: 32 / L rows per warp on the CUDA cores, L / 4 warps per 8-row tile on the
 * tensor cores (the kernels are built for 4, 8, 16 and 32). */
static int gs_lanes(int32_t K)
{
    return K <= 1024 ? GS_L_SMALL : K <= 2048 ? GS_L_BIG : GS_L_HUGE;
}

/* The launch's minimum grid: its kind's own where set (GEMV + residual, the SwiGLU pair, a norm
 * into several matrices), else the session's. */
static int64_t gs_min_blocks(const struct gemv_args *a)
{
    const int32_t own = a->mode == GEMV_ACCUM    ? a->smem_res_min_blocks
                        : a->mode == GEMV_SWIGLU ? a->smem_pair_min_blocks
                        : a->n_seg > 1           ? a->smem_multi_min_blocks
                                                 : 0;
    return own > 0 ? own : a->smem_min_blocks;
}

/* The block for rows of K at L = l (P physical rows each): warps from the options, halved
 * until the rows and x fit under the cap and (gemv_smem_min_blocks) while the grid would be
 * smaller than the minimum; or (gemv_smem_waves, CUDA cores only) the fewest warps that keep
 * the grid within that many blocks per multiprocessor, one fewer at a time until they fit.
 * False when not even one warp's rows fit, or when mma and the block would hold fewer than 8
 * rows (one tile). Layouts in shared memory:
 *   CUDA cores: x as K floats (none with xreg chunks of x per lane in registers), rows of
 *     K * 2 bytes (a warp's 16-byte loads read 512 contiguous bytes of one row);
 *   tensor cores: x as three bf16 terms (K * 6 bytes), rows of K * 2 + 16 bytes: ldmatrix's
 *     eight row addresses then fall on eight different 16-byte bank groups. */
static bool gs_fit(const struct gemv_args *a, int64_t rows, int l, int P, bool mma, int xreg, struct gs_shape *sh)
{
    int w = a->smem_warps > 0 && a->smem_warps <= GEMV_SMEM_WARPS_LIMIT ? a->smem_warps : GS_WARPS_MAX;
    size_t cap = a->smem_kb > 0 && a->smem_kb <= GEMV_SMEM_KB_LIMIT ? (size_t)a->smem_kb * 1024 : GS_SMEM_MAX;
    int32_t ws = mma ? a->K * 2 + 16 : a->K * 2;
    size_t per_warp = (size_t)(32 / l) * P * ws, x = xreg ? 0 : (size_t)a->K * (mma ? 6 : 4);
    const int64_t rpw = 32 / l; /* rows per warp */
    const int64_t min_blocks = gs_min_blocks(a); /* > 0: fewer warps while the grid would be smaller */
    if (a->smem_waves > 0 && !mma) {
        const int64_t per_wave = (int64_t)a->smem_waves * (a->n_sm > 0 ? a->n_sm : 132) * rpw;
        const int64_t need = (rows + per_wave - 1) / per_wave; /* warps per block for the grid to fit */
        w = need < w ? (int)(need > 0 ? need : 1) : w;
        while (w > 1 && x + w * per_warp > cap)
            w--;
    }
    while (a->smem_waves <= 0 && w > 1 &&
           (x + w * per_warp > cap || (min_blocks > 0 && (rows + w * rpw - 1) / (w * rpw) < min_blocks)))
        w /= 2;
    if (x + w * per_warp > cap || (mma && (w * rpw) % 8))
        return false;
    sh->L = l, sh->W = w, sh->wstride = ws, sh->smem = x + w * per_warp, sh->cap = cap, sh->mma = mma;
    sh->blocks = (int)((rows + w * rpw - 1) / (w * rpw));
    sh->launch_early = !a->smem_after_wait;
    sh->xreg = xreg;
    const bool alone = a->smem_alone == 2 || (a->smem_alone == 1 && a->mode != GEMV_SWIGLU && a->n_seg > 1);
    if (alone && sh->blocks <= (a->n_sm > 0 ? a->n_sm : 132) && sh->smem < (size_t)a->smem_half_sm) {
        sh->smem = (size_t)a->smem_half_sm; /* with the block's reserved 1 KB, two no longer fit */
        sh->cap = sh->cap > sh->smem ? sh->cap : sh->smem;
    }
    return true;
}

/* x chunks per lane gemv_smem holds in registers with cuda_options.gemv_smem_xreg at L = l: 4
 * for K <= 1024 (with the norm's weights beside them), 8 for K <= 2048 without a norm; built
 * for L = 8 and 16 (4 and 2 rows per warp); 0 otherwise (x staged in shared memory). */
static int gs_xreg_chunks(const struct gemv_args *a, int l, int P)
{
    int chunks = (a->K / 8 + 31) / 32;
    if (!a->smem_xreg || (l != 8 && l != 16))
        return 0;
    return chunks <= 4 ? 4 : chunks <= 8 && l == 16 && P == 1 && !a->norm_w ? 8 : 0;
}

/* The shape of this launch; false when the kernel does not take these arguments. */
static bool gemv_smem_shape(const struct gemv_args *a, struct gs_shape *sh)
{
    if (!a->smem || a->T != 1 || a->k_mixed || (a->dtype != QR_BF16 && a->dtype != QR_F16))
        return false;
    if (a->K < 8 || a->K % 8 || a->ldx % 4 || (uintptr_t)a->x % 16 || (uintptr_t)a->norm_w % 16)
        return false;
    int nseg = a->mode == GEMV_SWIGLU ? 2 : a->n_seg, P = a->mode == GEMV_SWIGLU ? 2 : 1;
    if (a->mode == GEMV_SWIGLU && a->seg[1].N != a->seg[0].N)
        return false;
    int64_t rows = 0;
    for (int i = 0; i < nseg; i++) {
        if (a->seg[i].row_bytes % 16 || ((uintptr_t)a->seg[i].w) % 16 || a->seg[i].row_bytes < (int64_t)a->K * 2)
            return false;
        if (a->mode != GEMV_SWIGLU)
            rows += a->seg[i].N;
    }
    if (a->mode == GEMV_SWIGLU)
        rows = a->seg[0].N;
    if (rows > GS_MAX_ROWS)
        return false;
    /* the tensor cores take BF16 rows whose K splits evenly over the L / 4 warps of an 8-row
     * tile in steps of 32 (gemv_mma.cu); the other launches, and blocks of fewer than 8 rows,
     * sum on the CUDA cores */
    int l = gs_lanes(a->K);
    if (a->mma && a->dtype == QR_BF16 && a->K % (64 * (l / 4)) == 0 && gs_fit(a, rows, l, P, true, 0, sh))
        return true;
    return gs_fit(a, rows, l, P, false, gs_xreg_chunks(a, l, P), sh);
}

bool gemv_smem_wide(int64_t rows, int32_t K, int32_t n_sm)
{
    int64_t per_block = 8 * (32 / gs_lanes(K));
    return rows <= GS_MAX_ROWS && (rows + per_block - 1) / per_block > (n_sm > 0 ? n_sm : 132);
}

int32_t gemv_smem_blocks(const struct gemv_args *a)
{
    struct gs_shape sh;
    return gemv_smem_shape(a, &sh) ? sh.blocks : 0;
}

bool gemv_smem_applies(const struct gemv_args *a)
{
    return gemv_smem_blocks(a) > 0;
}

template <int DT, int P, int L, int NC, bool LATE = false>
static cudaError_t gemv_smem_go_nc(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    if constexpr (NC == 4 && !LATE) /* the norm's scale after the sums (x in registers with a norm) */
        if (a->smem_norm_late && a->norm_w)
            return gemv_smem_go_nc<DT, P, L, NC, true>(a, sh, s);
    cudaError_t e = gs_raise_smem_limit(gemv_smem_kernel<DT, P, L, NC, LATE>, sh);
    if (e != cudaSuccess)
        return e;
    return launch_k(a->pdl, gemv_smem_kernel<DT, P, L, NC, LATE>, dim3(sh.blocks), dim3(32 * sh.W), sh.smem, s, *a,
                    sh.wstride, sh.launch_early);
}

/* The kernel for sh.xreg (gs_xreg_chunks: 4 at L = 8 or 16, 8 at L = 16 without the pair). */
template <int DT, int P, int L>
static cudaError_t gemv_smem_go(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    constexpr bool x4 = L == 8 || L == 16, x8 = L == 16 && P == 1;
    if ((sh.xreg == 4 && !x4) || (sh.xreg == 8 && !x8) || (sh.xreg && sh.xreg != 4 && sh.xreg != 8))
        return cudaErrorInvalidValue;
    if (sh.xreg == 4)
        return gemv_smem_go_nc<DT, P, L, x4 ? 4 : 0>(a, sh, s);
    if (sh.xreg == 8)
        return gemv_smem_go_nc<DT, P, L, x8 ? 8 : 0>(a, sh, s);
    return gemv_smem_go_nc<DT, P, L, 0>(a, sh, s);
}

template <int DT, int L>
static cudaError_t gemv_smem_dt(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    return a->mode == GEMV_SWIGLU ? gemv_smem_go<DT, 2, L>(a, sh, s) : gemv_smem_go<DT, 1, L>(a, sh, s);
}

cudaError_t launch_gemv_smem(const struct gemv_args *a, cudaStream_t s)
{
    struct gs_shape sh;
    if (!gemv_smem_shape(a, &sh))
        return cudaErrorInvalidValue;
    if (sh.mma)
        return launch_gemv_mma(a, sh, s);
    bool f16 = a->dtype == QR_F16;
    switch (sh.L) {
    case 4: return f16 ? gemv_smem_dt<QR_F16, 4>(a, sh, s) : gemv_smem_dt<QR_BF16, 4>(a, sh, s);
    case 8: return f16 ? gemv_smem_dt<QR_F16, 8>(a, sh, s) : gemv_smem_dt<QR_BF16, 8>(a, sh, s);
    case 16: return f16 ? gemv_smem_dt<QR_F16, 16>(a, sh, s) : gemv_smem_dt<QR_BF16, 16>(a, sh, s);
    default: return f16 ? gemv_smem_dt<QR_F16, 32>(a, sh, s) : gemv_smem_dt<QR_BF16, 32>(a, sh, s);
    }
}

/* For the tests: whether launch_gemv takes this kernel for one token of N x K weights of
 * dtype (aligned buffers, no norm, y = result) when cuda_options.gemv_smem is on. */
static void takes_args(struct gemv_args *a, int32_t dtype, int32_t N, int32_t K, bool mma)
{
    memset(a, 0, sizeof(*a));
    a->x = (const float *)(uintptr_t)256, a->ldx = K, a->K = K, a->T = 1, a->dtype = dtype;
    a->mode = GEMV_STORE, a->n_seg = 1, a->v2 = true, a->smem = true, a->mma = mma;
    a->seg[0].w = (const void *)(uintptr_t)4096, a->seg[0].N = N;
    a->seg[0].row_bytes = (int64_t)K * (dtype == QR_F32 ? 4 : 2), a->seg[0].ldy = N;
}

extern "C" bool cuda_gemv_smem_takes(int32_t dtype, int32_t N, int32_t K)
{
    struct gemv_args a;
    takes_args(&a, dtype, N, K, false);
    return !gemvq_applies(&a) && gemv_smem_applies(&a);
}

/* For the tests: the grid and warps per block of one token of N x K rows (swiglu: N gate/up
 * pairs) under the session's 8-warp pick, with gemv_smem_waves = waves on n_sm multiprocessors. */
extern "C" int32_t cuda_gemv_smem_grid(int32_t dtype, int32_t N, int32_t K, bool swiglu, int32_t waves,
                                       int32_t n_sm, int32_t *warps)
{
    struct gemv_args a;
    takes_args(&a, dtype, N, K, false);
    if (swiglu)
        a.mode = GEMV_SWIGLU, a.n_seg = 2, a.seg[1] = a.seg[0];
    a.smem_xreg = true, a.smem_warps = 8, a.smem_kb = 136, a.smem_min_blocks = 96; /* the session's 8-warp pick */
    a.smem_waves = waves, a.n_sm = n_sm;
    struct gs_shape sh;
    if (gemvq_applies(&a) || !gemv_smem_shape(&a, &sh))
        return 0;
    *warps = sh.W;
    return sh.blocks;
}

/* For the tests: the grid and warps per block of one token of BF16 rows under the session's
 * 16-warp pick (160 KB) with gemv_smem_min_blocks = min_blocks, for a launch of kind (0: GEMV +
 * residual, N x K; 1: N gate/up pairs; 2: two matrices of N / 2 rows) with kind set_kind's own
 * minimum (the same numbering) set to kind_min. */
extern "C" int32_t cuda_gemv_smem_grid_kind(int32_t kind, int32_t set_kind, int32_t N, int32_t K, int32_t min_blocks,
                                            int32_t kind_min, int32_t *warps)
{
    struct gemv_args a;
    takes_args(&a, QR_BF16, N, K, false);
    if (kind == 0)
        a.mode = GEMV_ACCUM;
    else if (kind == 1)
        a.mode = GEMV_SWIGLU, a.n_seg = 2, a.seg[1] = a.seg[0];
    else
        a.n_seg = 2, a.seg[0].N = N / 2, a.seg[1] = a.seg[0];
    a.smem_warps = 16, a.smem_kb = 160, a.smem_min_blocks = min_blocks;
    (set_kind == 0 ? a.smem_res_min_blocks : set_kind == 1 ? a.smem_pair_min_blocks : a.smem_multi_min_blocks) = kind_min;
    struct gs_shape sh;
    if (gemvq_applies(&a) || !gemv_smem_shape(&a, &sh))
        return 0;
    *warps = sh.W;
    return sh.blocks;
}

extern "C" int32_t cuda_gemv_smem_xreg_chunks(int32_t dtype, int32_t N, int32_t K)
{
    struct gemv_args a;
    takes_args(&a, dtype, N, K, false);
    a.smem_xreg = true;
    struct gs_shape sh;
    return !gemvq_applies(&a) && gemv_smem_shape(&a, &sh) ? sh.xreg : 0;
}

extern "C" bool cuda_gemv_mma_takes(int32_t N, int32_t K)
{
    struct gemv_args a;
    takes_args(&a, QR_BF16, N, K, true);
    struct gs_shape sh;
    return !gemvq_applies(&a) && gemv_smem_shape(&a, &sh) && sh.mma;
}
