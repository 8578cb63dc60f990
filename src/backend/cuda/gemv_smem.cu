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
 * Once the weights are in shared memory, shared-memory bandwidth bounds the dot products
 * (128 bytes per cycle per multiprocessor): the copy in, the weights out, and x. Reading x
 * once per 16-byte chunk of weights, as gemv2's lane-per-chunk order does, costs 2-4 times the
 * weights' own traffic (measured: 1.5-2.3 us for a 64 KB share). So here a row belongs to a
 * group of L lanes (L = 8 or 16; 32 / L rows per warp): in one instruction the 32 / L rows
 * read the same L chunks of x, 16 bytes apart (x is staged as two arrays, elements 0-3 and
 * 4-7 of each chunk), and each group's L weight chunks are 128 or 256 contiguous bytes: no
 * bank conflicts, and x costs a quarter to a half of the weights' traffic.
 *
 * A block: W warps (cuda_options.gemv_smem_warps; by default the session picks 8, or 16 for
 * a model whose widest product would need more than one block of 8 warps per multiprocessor),
 * halved until its rows and x fit in gemv_smem_kb (picked with W: 120 KB, or 160); the
 * kernel's dynamic shared-memory limit is raised at launch when a block needs more than 48 KB.
 * In order:
 *   1. each lane copies its 16-byte chunks (q, q + L, ...) of its group's row(s) (P = 2:
 *      gate and up) into shared memory with cp.async; nothing reads activations yet;
 *   2. griddep_launch (the next kernel may start; after the wait instead when the session
 *      says so: pick_gemv_smem_shape), the first norm weights, griddep_wait;
 *   3. x staged and RMS-normalised in shared memory;
 *   4. each lane waits for its own copies (a thread's cp.async are visible to itself after
 *      its wait_group: no barrier), sums its chunks, and the group adds its L partial sums
 *      (butterfly), lane q = 0 stores.
 * The order of the sums differs from gemv2's (per group, then the butterfly), so the results
 * differ from gemv2's by rounding; test_cuda_backend compares both with the CPU reference.
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
#define GS_L_SMALL 8 /* lanes per row for K <= 1024 */
#endif
#ifndef GS_L_BIG
#define GS_L_BIG 16 /* lanes per row for 1024 < K <= 2048 */
#endif
#ifndef GS_L_HUGE
#define GS_L_HUGE GS_L_BIG /* lanes per row for K > 2048 */
#endif
#ifndef GS_WARPS_MAX
#define GS_WARPS_MAX 8 /* default warps per block (fewer only when their rows would not fit) */
#endif
#ifndef GS_SMEM_MAX
#define GS_SMEM_MAX (120 * 1024) /* default dynamic shared memory per block (a multiprocessor has 228 KB) */
#endif
/* L lanes per row, P physical rows per row (2: the SwiGLU gate/up pair); wstride: bytes
 * between rows in shared memory (K * 2). */
template <int DT, int P, int L>
__global__ void __launch_bounds__(32 * GEMV_SMEM_WARPS_LIMIT) gemv_smem_kernel(const __grid_constant__ struct gemv_args a,
                                                                       int32_t wstride, bool launch_early)
{
    extern __shared__ float4 gs_smem4[];
    __shared__ float s_red[GEMV_SMEM_WARPS_LIMIT];
    unsigned long long *st = a.stamps && threadIdx.x == 0 ? a.stamps + 4 * (size_t)blockIdx.x : NULL;
    if (st)
        st[0] = globaltimer_ns();
    constexpr int RPW = 32 / L; /* rows per warp */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane / L, q = lane % L, nchunk = a.K / 8;
    float4 *xlo = gs_smem4, *xhi = gs_smem4 + nchunk;
    const uint32_t wrow = smem_u32(gs_smem4 + 2 * nchunk) + (uint32_t)((warp * RPW + g) * P * wstride);
    const int64_t lr = ((int64_t)blockIdx.x * nw + warp) * RPW + g;
    const uint4 *rp[P];
    bool ok;
    float *yp;
    if (P == 2) {
        ok = lr < a.seg[0].N;
        rp[0] = (const uint4 *)((const uint8_t *)a.seg[0].w + (ok ? lr : 0) * a.seg[0].row_bytes);
        rp[P - 1] = (const uint4 *)((const uint8_t *)a.seg[1].w + (ok ? lr : 0) * a.seg[1].row_bytes);
        yp = a.seg[0].y + (ok ? lr : 0);
    } else {
        int sg = 0;
        int64_t r = lr;
        while (sg < a.n_seg - 1 && r >= a.seg[sg].N)
            r -= a.seg[sg++].N;
        ok = r < a.seg[sg].N;
        rp[0] = (const uint4 *)((const uint8_t *)a.seg[sg].w + (ok ? r : 0) * a.seg[sg].row_bytes);
        yp = a.seg[sg].y + (ok ? r : 0);
    }
    if (ok)
#pragma unroll
        for (int p = 0; p < P; p++)
            for (int ch = q; ch < nchunk; ch += L)
                cp_async16(wrow + (uint32_t)(p * wstride + ch * 16), rp[p] + ch);
    float4 g0[GEMV_NW];
    gs_commit_and_wait(a, launch_early, g0);
    if (st)
        st[1] = globaltimer_ns();
    float yold = a.mode == GEMV_ACCUM && q == 0 && ok ? *yp : 0.0f;
    gs_stage_x(a, xlo, xhi, g0, s_red);
    cp_async_wait<0>();
    if (st)
        st[2] = globaltimer_ns();
    float acc[P];
#pragma unroll
    for (int p = 0; p < P; p++)
        acc[p] = 0.0f;
#pragma unroll 4
    for (int ch = q; ch < nchunk; ch += L) {
        float4 x0 = xlo[ch], x1 = xhi[ch];
#pragma unroll
        for (int p = 0; p < P; p++) {
            uint4 raw;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                         : "r"(wrow + (uint32_t)(p * wstride + ch * 16)));
            acc[p] += gemv_dot8x<DT>(raw, x0, x1);
        }
    }
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
            acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], o);
    float v = acc[0];
    if (P == 2)
        v = v / (1.0f + __expf(-v)) * acc[P - 1];
    if (q == 0 && ok)
        *yp = a.mode == GEMV_ACCUM ? yold + v : v;
    if (st)
        st[3] = globaltimer_ns();
}

/* Lanes per row at this K (the kernel is built for 4, 8, 16 and 32). */
static int gs_lanes(int32_t K)
{
    return K <= 1024 ? GS_L_SMALL : K <= 2048 ? GS_L_BIG : GS_L_HUGE;
}

/* The block for rows of K at l lanes per row (P physical rows each): warps from the options,
 * halved until the rows and x fit under the cap; false when not even one warp's fit, or when
 * mma and the block would hold fewer than 8 rows (one tile). Layouts in shared memory:
 *   CUDA cores: x as K floats, rows of K * 2 bytes (64 more below 8 lanes per row: two rows
 *     in one quarter warp stay off each other's banks);
 *   tensor cores: x as three bf16 terms (K * 6 bytes), rows of K * 2 + 16 bytes: ldmatrix's
 *     eight row addresses then fall on eight different 16-byte bank groups. */
static bool gs_fit(const struct gemv_args *a, int64_t rows, int l, int P, bool mma, struct gs_shape *sh)
{
    int w = a->smem_warps > 0 && a->smem_warps <= GEMV_SMEM_WARPS_LIMIT ? a->smem_warps : GS_WARPS_MAX;
    size_t cap = a->smem_kb > 0 && a->smem_kb <= GEMV_SMEM_KB_LIMIT ? (size_t)a->smem_kb * 1024 : GS_SMEM_MAX;
    int32_t ws = mma ? a->K * 2 + 16 : a->K * 2 + (l < 8 ? 64 : 0);
    size_t per_warp = (size_t)(32 / l) * P * ws, x = (size_t)a->K * (mma ? 6 : 4);
    const int64_t rpw = 32 / l; /* rows per warp */
    const int64_t min_blocks = a->smem_min_blocks; /* > 0: fewer warps while the grid would be smaller */
    while (w > 1 && (x + w * per_warp > cap || (min_blocks > 0 && (rows + w * rpw - 1) / (w * rpw) < min_blocks)))
        w /= 2;
    if (x + w * per_warp > cap || (mma && (w * rpw) % 8))
        return false;
    sh->L = l, sh->W = w, sh->wstride = ws, sh->smem = x + w * per_warp, sh->cap = cap, sh->mma = mma;
    sh->blocks = (int)((rows + w * rpw - 1) / (w * rpw));
    sh->launch_early = !a->smem_after_wait;
    return true;
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
    if (a->mma && a->dtype == QR_BF16 && a->K % (64 * (l / 4)) == 0 && gs_fit(a, rows, l, P, true, sh))
        return true;
    return gs_fit(a, rows, l, P, false, sh);
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

template <int DT, int P, int L>
static cudaError_t gemv_smem_go(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s)
{
    cudaError_t e = gs_raise_smem_limit(gemv_smem_kernel<DT, P, L>, sh);
    if (e != cudaSuccess)
        return e;
    return launch_k(a->pdl, gemv_smem_kernel<DT, P, L>, dim3(sh.blocks), dim3(32 * sh.W), sh.smem, s, *a,
                    sh.wstride, sh.launch_early);
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

extern "C" bool cuda_gemv_mma_takes(int32_t N, int32_t K)
{
    struct gemv_args a;
    takes_args(&a, QR_BF16, N, K, true);
    struct gs_shape sh;
    return !gemvq_applies(&a) && gemv_smem_shape(&a, &sh) && sh.mma;
}
