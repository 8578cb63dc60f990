/*
 * ll_chain_bench.cu — what one dependent step of the decode chain costs when every value
 * carries the flag of the step that wrote it (NCCL's "LL" form: an 8-byte word = a float and a
 * 32-bit flag, stored and loaded whole), against the decode graph's form (a launch per step with
 * programmatic dependent launch, griddepcontrol.wait, then plain loads).
 *
 * Why: issue 6's batch-1 goals are bound by the chain of ~140 dependent steps a token, not by
 * bytes (docs/perf-log.md, sessions 26-31). A graph step costs its release after the launch
 * before ends (0.4-1.0 us) and then a round trip for x (0.7-1.3 us) before any arithmetic. With
 * flagged words the consumer's poll *is* its load of x: it sees each value one L2 round trip
 * after the producer stored it, and does not wait for the producer's grid to end. This bench
 * measures that, without the model's other work, on a chain with Qwen3-0.6B's four products a
 * layer (q|k|v 4096 x 1024, o 1024 x 2048, gate|up 6144 x 1024, down 1024 x 3072; BF16 rows,
 * 28 layers; each product's x is the first K outputs of the product before it):
 *
 *   graph  a CUDA graph of 112 launches a token, PDL, rows copied to shared memory before
 *          griddepcontrol.wait, x loaded after it (the runtime's gemv_smem pattern);
 *   ll     the same graph, x polled as flagged words (no griddepcontrol.wait), y stored flagged;
 *   ll late  ll, but a block lets the next launch in only once it has its x (in ll every block
 *          lets it in at its start, as the graph form does, so blocks of several later launches
 *          can be resident and polling at once);
 *   mega   one persistent launch for all the tokens (one block per multiprocessor used), the
 *          next product's rows copied while the current one waits for its x, x polled flagged;
 *   mega cnt  the same, synchronised by an arrival counter a step (release add, acquire poll)
 *          and x as plain floats;
 *   mega regs  one persistent launch of 16-warp blocks that load the next step's rows straight
 *          into registers (two buffers that alternate) instead of shared memory, x polled
 *          flagged (session 47: level with mega from DRAM; 2.2 us a step with --shared-layers,
 *          but there ~60% of its rows came from L1, which the smem forms' copies bypass);
 *   mega ring  mega with its shared memory a 200 KB ring by bytes, 2-3 steps of rows in flight
 *          (session 47: 11% slower than mega; deeper copies slow the chain's small loads);
 *   graph mc  the graph form in clusters of 4, x multicast to the cluster by bulk copies
 *          (session 47: the bare chain -8%, with rows +7%: clusters are placed later);
 *   graph regs  the graph form's launches with each warp's rows loaded into registers before
 *          the wait (at most 128 a thread: two blocks a multiprocessor; session 47: slower than
 *          graph everywhere, the chain alone 1.85 us a step: later launches cannot be resident).
 * --pf N: the persistent forms also ask the rows N steps beyond the next into the L2 (bulk
 * prefetches); --pf -N: mega regs does the same with one prefetch.global.L2 a 128-byte line.
 * --pad KB: the graph forms' blocks take at least KB of shared memory (fewer a multiprocessor);
 * --no-pdl: the graph forms' launches wait for the launch before in full.
 *
 * Flags: the graph forms alternate two graphs (token parity p), and step s writes flag
 * p S + s + 1, so a stale word always has another flag; the persistent form writes t S + s + 1.
 * Every form computes the same sums in the same order, so their outputs must agree bit for bit
 * (checked after 2 tokens, and against a CPU reference of the graph form's first token).
 *
 *   built by CMake where nvcc is found (build/ll_chain_bench), or by hand:
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o ll_chain_bench bench/ll_chain_bench.cu
 *   ./ll_chain_bench [--tokens N] [--shared-layers] [--sleep NS]
 *
 * --shared-layers: every layer uses layer 0's weights (30 MB, held in L2): the chain alone.
 * --knock 1: no products (y = x's first values: each step still needs all of x); 2: no rows
 * copied; 3: both. Knock-outs skip the check (their outputs are not the products).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NT 256            /* threads a block */
#define NB 128            /* blocks a product (each owns N / NB rows) */
#define LAYERS 28
#define PER_LAYER 4
#define STEPS (LAYERS * PER_LAYER)
#define MAX_K 3072
#define MAX_ROWS_BYTES (48 * 1024 * 2) /* gate|up: 48 rows of 1024 */
#define UPT ((MAX_K / 2 + NT - 1) / NT) /* 16-byte flagged pairs a thread polls, at most */
#define KNOCK_DOTS 1 /* --knock: y = x's first values instead of the products (the chain alone) */
#define KNOCK_ROWS 2 /* --knock: no rows copied */

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static const int shape_n[PER_LAYER] = {4096, 1024, 6144, 1024};
static const int shape_k[PER_LAYER] = {1024, 2048, 1024, 3072};

struct step_desc {
    const __nv_bfloat16 *w; /* N x K */
    int n, k;
    float *xf;              /* graph form: input (the previous step's output) */
    float *yf;              /* graph form: output */
    unsigned long long *xl; /* flagged forms: input words */
    unsigned long long *yl; /* flagged forms: output words */
};

struct chain {
    struct step_desc s[STEPS];
};

/* ---- device helpers ---- */

__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ld_pair(const unsigned long long *p, unsigned long long &a, unsigned long long &b)
{
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ void st_word(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long word(float v, unsigned flag)
{
    return ((unsigned long long)flag << 32) | __float_as_uint(v);
}

/* The block's rows of one product into shared memory (cp.async, one group). */
__device__ __forceinline__ void stage_rows(const struct step_desc &d, int b, __nv_bfloat16 *rows)
{
    const int R = d.n / NB;
    const char *src = (const char *)(d.w + (size_t)b * R * d.k);
    const int units = R * d.k * 2 / 16;
    for (int u = threadIdx.x; u < units; u += NT)
        cp_async16((char *)rows + 16 * u, src + 16 * u);
    cp_commit();
}

/* x as flagged words: every thread issues all its loads, then re-polls the pairs not yet
 * written with the wanted flag. */
__device__ __forceinline__ void poll_x(const unsigned long long *xl, int k, unsigned want, float *xs, int sleep_ns)
{
    const int pairs = k / 2;
    unsigned long long a[UPT], b[UPT];
#pragma unroll
    for (int i = 0; i < UPT; i++) {
        const int u = threadIdx.x + i * NT;
        if (u < pairs)
            ld_pair(xl + 2 * u, a[i], b[i]);
    }
#pragma unroll
    for (int i = 0; i < UPT; i++) {
        const int u = threadIdx.x + i * NT;
        if (u >= pairs)
            continue;
        while ((unsigned)(a[i] >> 32) != want || (unsigned)(b[i] >> 32) != want) {
            if (sleep_ns)
                __nanosleep(sleep_ns);
            ld_pair(xl + 2 * u, a[i], b[i]);
        }
        xs[2 * u] = __uint_as_float((unsigned)a[i]);
        xs[2 * u + 1] = __uint_as_float((unsigned)b[i]);
    }
}

/* s plus the 8 products of a 16-byte chunk of BF16 weights with x0 (elements 0-3) and x1 (4-7),
 * added in element order: the one order every form's sums take. */
__device__ __forceinline__ float chunk_fma(uint4 u, float4 x0, float4 x1, float s)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
    const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
    const float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
    s = fmaf(f0.x, x0.x, s), s = fmaf(f0.y, x0.y, s), s = fmaf(f1.x, x0.z, s), s = fmaf(f1.y, x0.w, s);
    s = fmaf(f2.x, x1.x, s), s = fmaf(f2.y, x1.y, s), s = fmaf(f3.x, x1.z, s), s = fmaf(f3.y, x1.w, s);
    return s;
}

/* The block's R rows times x, the runtime's gemv_smem way: warp w owns rows w RPW .. w RPW +
 * RPW - 1, every lane keeps its KC chunks of x (8 values each, chunk lane + 32 i) in registers
 * and adds a part of every row, the rows' sums side by side (independent chains), then one
 * butterfly a row, all the rows' shuffles interleaved. */
template <int KC, int RPW, typename Store>
__device__ __forceinline__ void dot_rows_t(const __nv_bfloat16 *rows, const float *xs, Store store)
{
    constexpr int K = KC * 256;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4 xr[KC][2];
#pragma unroll
    for (int i = 0; i < KC; i++)
        xr[i][0] = ((const float4 *)xs)[2 * (lane + 32 * i)], xr[i][1] = ((const float4 *)xs)[2 * (lane + 32 * i) + 1];
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++)
        acc[r] = 0.0f;
    const uint4 *wrows = (const uint4 *)(rows + (size_t)warp * RPW * K);
#pragma unroll
    for (int i = 0; i < KC; i++)
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            acc[r] = chunk_fma(wrows[r * (K / 8) + lane + 32 * i], xr[i][0], xr[i][1], acc[r]);
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < RPW; r++)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane < RPW) {
        float v = acc[0];
#pragma unroll
        for (int r = 1; r < RPW; r++)
            v = lane == r ? acc[r] : v;
        store(warp * RPW + lane, v);
    }
}

/* The four shapes of the chain (K, rows a warp at NB blocks of NT / 32 warps). */
template <typename Store>
__device__ __forceinline__ void dot_rows(const __nv_bfloat16 *rows, const float *xs, int R, int k, Store store)
{
    if (k == 1024 && R == 32)
        dot_rows_t<4, 4>(rows, xs, store);
    else if (k == 1024 && R == 48)
        dot_rows_t<4, 6>(rows, xs, store);
    else if (k == 2048 && R == 8)
        dot_rows_t<8, 1>(rows, xs, store);
    else if (k == 3072 && R == 8)
        dot_rows_t<12, 1>(rows, xs, store);
    else
        __trap();
}

/* ---- the graph forms: one launch a step ---- */

/* LL 0: the graph form; 1: x polled, the next launch let in at the start; 2: x polled, the next
 * launch let in once this block has its x (fewer spinning blocks of later launches). */
template <int LL>
__global__ void __launch_bounds__(NT) step_kernel(const struct step_desc d, unsigned want, unsigned flag, int sleep_ns, int knock)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int b = blockIdx.x, R = d.n / NB;
    __nv_bfloat16 *rows = (__nv_bfloat16 *)smem;
    float *xs = (float *)(smem + (size_t)R * d.k * 2);
    if (LL != 2)
        pdl_trigger();
    if (!(knock & KNOCK_ROWS))
        stage_rows(d, b, rows);
    if (LL) {
        poll_x(d.xl, d.k, want, xs, sleep_ns);
        if (LL == 2)
            pdl_trigger();
    } else {
        pdl_wait();
        for (int i = threadIdx.x; i < d.k / 4; i += NT)
            ((float4 *)xs)[i] = ((const float4 *)d.xf)[i];
    }
    cp_wait<0>();
    __syncthreads();
    if (knock & KNOCK_DOTS) {
        for (int r = threadIdx.x; r < R; r += NT)
            if (LL)
                st_word(d.yl + (size_t)b * R + r, word(xs[r], flag));
            else
                d.yf[(size_t)b * R + r] = xs[r];
    } else if (LL)
        dot_rows(rows, xs, R, d.k, [&](int r, float s) { st_word(d.yl + (size_t)b * R + r, word(s, flag)); });
    else
        dot_rows(rows, xs, R, d.k, [&](int r, float s) { d.yf[(size_t)b * R + r] = s; });
}

/* ---- the graph form with x multicast in clusters (graph mc) ----
 * In the graph form every block of a launch loads all of x from the same L2 lines at the same
 * moment. Here the launch is clusters of MC blocks: after the wait, block r of a cluster copies
 * the r-th 1/MC of x with one bulk copy multicast to every block of its cluster, each block's
 * mbarrier counting the K * 4 bytes it receives: each line of x leaves the L2 NB / MC times, not
 * NB. The cluster barrier that makes the peers' mbarriers safe to target runs before the wait. */
#define MC 4

__global__ void __launch_bounds__(NT) step_mc_kernel(const struct step_desc d, int knock)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    const int b = blockIdx.x, R = d.n / NB;
    __nv_bfloat16 *rows = (__nv_bfloat16 *)smem;
    float *xs = (float *)(smem + (size_t)R * d.k * 2);
    const unsigned mb = (unsigned)__cvta_generic_to_shared(&bar);
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    pdl_trigger();
    if (!(knock & KNOCK_ROWS))
        stage_rows(d, b, rows);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mb) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(d.k * 4) : "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    pdl_wait();
    if (threadIdx.x == 0) {
        const unsigned part = (unsigned)d.k * 4 / MC;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(xs) + rank * part;
        const char *src = (const char *)d.xf + rank * part;
        const unsigned short mask = (unsigned short)((1u << MC) - 1);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                     " [%0], [%1], %2, [%3], %4;" ::"r"(dst), "l"(src), "r"(part), "r"(mb), "h"(mask)
                     : "memory");
    }
    asm volatile("{\n\t.reg .pred p;\n\tWAIT_%=:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t"
                 "@!p bra WAIT_%=;\n\t}" ::"r"(mb)
                 : "memory");
    cp_wait<0>();
    __syncthreads();
    if (knock & KNOCK_DOTS) {
        for (int r = threadIdx.x; r < R; r += NT)
            d.yf[(size_t)b * R + r] = xs[r];
    } else
        dot_rows(rows, xs, R, d.k, [&](int r, float v) { d.yf[(size_t)b * R + r] = v; });
}

/* ---- the persistent forms: every step of every token in one launch ---- */

/* The block's rows of step d asked into the L2 (16 KB a thread). */
__device__ __forceinline__ void prefetch_rows_l2(const struct step_desc &d, int b)
{
    const int R = d.n / NB, bytes = R * d.k * 2, pieces = (bytes + 16383) / 16384;
    if ((int)threadIdx.x < pieces) {
        const char *src = (const char *)(d.w + (size_t)b * R * d.k) + 16384 * threadIdx.x;
        const int n = min(16384, bytes - 16384 * (int)threadIdx.x);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(n) : "memory");
    }
}

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* SYNC 0: x polled as flagged words. SYNC 1: each block, after its stores, adds one to the
 * step's arrival counter (release); a block's thread 0 polls the counter of the step before
 * (acquire) and the block then loads x as plain floats from L2. pf: steps asked into the L2
 * beyond the one being copied to shared memory (a deeper look-ahead than the two-stage ring). */
template <int SYNC>
__global__ void __launch_bounds__(NT, 1)
    mega_kernel(const struct chain *c, int tokens, int sleep_ns, int knock, unsigned long long *cnt, int pf)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *xs = (float *)(smem + 2 * MAX_ROWS_BYTES);
    const int b = blockIdx.x;
    const int total = tokens * STEPS;
    if (knock & KNOCK_ROWS)
        cp_commit();
    else
        stage_rows(c->s[0], b, (__nv_bfloat16 *)smem); /* a ring of two stages of MAX_ROWS_BYTES */
    for (int g = 0; g < total; g++) {
        const int s = g % STEPS;
        const struct step_desc &d = c->s[s];
        if (g + 1 < total && !(knock & KNOCK_ROWS))
            stage_rows(c->s[(g + 1) % STEPS], b, (__nv_bfloat16 *)(smem + ((g + 1) & 1) * MAX_ROWS_BYTES));
        else
            cp_commit();
        if (pf > 0 && g + 1 + pf < total && !(knock & KNOCK_ROWS))
            prefetch_rows_l2(c->s[(g + 1 + pf) % STEPS], b);
        if (SYNC == 0) {
            poll_x(d.xl, d.k, (unsigned)g, xs, sleep_ns);
        } else {
            if (g > 0 && threadIdx.x == 0) {
                const unsigned long long want = (unsigned long long)NB * ((g - 1) / STEPS + 1);
                while (ld_acquire(cnt + (g - 1) % STEPS) < want)
                    if (sleep_ns)
                        __nanosleep(sleep_ns);
            }
            __syncthreads();
            for (int i = threadIdx.x; i < d.k / 4; i += NT)
                ((float4 *)xs)[i] = __ldcg((const float4 *)d.xf + i);
        }
        cp_wait<1>();
        __syncthreads();
        const unsigned flag = (unsigned)g + 1;
        const int R = d.n / NB;
        auto store = [&](int r, float v) {
            if (SYNC == 0)
                st_word(d.yl + (size_t)b * R + r, word(v, flag));
            else
                __stcg(d.yf + (size_t)b * R + r, v);
        };
        if (knock & KNOCK_DOTS)
            for (int r = threadIdx.x; r < R; r += NT)
                store(r, xs[r]);
        else
            dot_rows((const __nv_bfloat16 *)(smem + (g & 1) * MAX_ROWS_BYTES), xs, R, d.k, store);
        __syncthreads(); /* the stage and xs are free; every store of the block is issued */
        if (SYNC == 1 && threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(cnt + s) : "memory");
    }
}

/* ---- the persistent form with a ring of rows by bytes (mega ring) ----
 * mega's two stages hold one step ahead whatever its size, so gate|up's 96 KB a block are asked
 * for only while the short o step runs. Here the shared memory is a ring of RING_BYTES: at the
 * start of each step the block asks for the rows of every later step that fits (at most
 * RING_AHEAD in flight), in order, each contiguous (a step that would pass the ring's end starts
 * at 0), one cp.async group a step; it then waits for its own step's group only. Every thread
 * keeps the same schedule (block-uniform arithmetic), so no flag is shared. x is polled flagged
 * as in mega. */
#define RING_BYTES (200 * 1024)
#define RING_AHEAD 6

struct ring_state {
    int head, tail, n;           /* next free byte, the oldest live step's first byte, live steps */
    int off[RING_AHEAD];         /* live steps' offsets, oldest first (slot = step % RING_AHEAD) */
};

/* The offset for n bytes, or -1 when they do not fit now. */
__device__ __forceinline__ int ring_alloc(const struct ring_state &r, int n)
{
    if (r.n == 0)
        return 0;
    if (r.head > r.tail || (r.head == r.tail && r.n == 0))
        return r.head + n <= RING_BYTES ? r.head : (n <= r.tail ? 0 : -1);
    return r.head + n <= r.tail ? r.head : -1;
}

__device__ __forceinline__ void cp_wait_dyn(int pending)
{
    switch (pending) {
    case 0: cp_wait<0>(); break;
    case 1: cp_wait<1>(); break;
    case 2: cp_wait<2>(); break;
    case 3: cp_wait<3>(); break;
    case 4: cp_wait<4>(); break;
    default: cp_wait<5>(); break;
    }
}

__global__ void __launch_bounds__(NT, 1) mega_ring_kernel(const struct chain *c, int tokens, int sleep_ns, int knock)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *xs = (float *)(smem + RING_BYTES);
    const int b = blockIdx.x, total = tokens * STEPS;
    struct ring_state r = {0, 0, 0, {0}};
    int issued = 0;
    for (int g = 0; g < total; g++) {
        while (issued < total && issued - g < RING_AHEAD) { /* every later step that fits, in order */
            const struct step_desc &d = c->s[issued % STEPS];
            const int bytes = (d.n / NB) * d.k * 2, o = ring_alloc(r, bytes);
            if (o < 0)
                break;
            if (knock & KNOCK_ROWS)
                cp_commit();
            else
                stage_rows(d, b, (__nv_bfloat16 *)(smem + o));
            if (r.n == 0)
                r.tail = o;
            r.off[issued % RING_AHEAD] = o, r.head = o + bytes, r.n++;
            issued++;
        }
        cp_wait_dyn(issued - g - 1); /* this step's group (the oldest pending) has landed */
        const struct step_desc &d = c->s[g % STEPS];
        poll_x(d.xl, d.k, (unsigned)g, xs, sleep_ns);
        __syncthreads();
        const int R = d.n / NB;
        const unsigned flag = (unsigned)g + 1;
        auto store = [&](int row, float v) { st_word(d.yl + (size_t)b * R + row, word(v, flag)); };
        if (knock & KNOCK_DOTS)
            for (int row = threadIdx.x; row < R; row += NT)
                store(row, xs[row]);
        else
            dot_rows((const __nv_bfloat16 *)(smem + r.off[g % RING_AHEAD]), xs, R, d.k, store);
        __syncthreads(); /* the step's rows and xs are free */
        if (--r.n == 0)
            r.head = r.tail = 0;
        else
            r.tail = r.off[(g + 1) % RING_AHEAD];
    }
}

/* ---- the persistent form with the rows in registers (mega regs) ----
 * Every form above stages rows in shared memory: a block's copies write it and its dot products
 * read it back, both through the multiprocessor's one shared-memory pipe. Here each warp loads
 * its rows of the next step straight into registers (16-byte loads, no shared memory) before it
 * polls x of the current step; the current step's dot products read rows from registers and x
 * from shared memory. Two register buffers alternate: A holds the q|k|v or gate|up rows, B the o
 * or down rows (the layer's four steps are unrolled, so every index is static). A block is 16
 * warps; q|k|v and gate|up take 2 and 3 rows a warp (4 chunks a lane each), o and down one row
 * on each of warps 0-7 (8 and 12 chunks a lane). Each row's sum runs in dot_rows_t's order, so
 * the outputs are the graph form's bit for bit. */
#define MR_NT 512
#define MR_BUF 12 /* 16-byte chunks a lane holds for one step, at most */

/* A warp's RPW rows, held as U 16-byte chunks a lane in buf (row r's chunk i at r U + i), times
 * x in shared memory, each row summed in dot_rows_t's order; lane r < RPW returns row r's sum. */
template <int RPW, int U, int NBUF>
__device__ __forceinline__ float regs_row_sums(const uint4 (&buf)[NBUF], const float *xs)
{
    static_assert(RPW * U <= NBUF, "the rows fit the buffer");
    const int lane = threadIdx.x & 31;
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++)
        acc[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < U; i++) {
        const float4 x0 = ((const float4 *)xs)[2 * (lane + 32 * i)], x1 = ((const float4 *)xs)[2 * (lane + 32 * i) + 1];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            acc[r] = chunk_fma(buf[r * U + i], x0, x1, acc[r]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < RPW; r++)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < RPW; r++)
        v = lane == r ? acc[r] : v;
    return v;
}

/* The warp's RPW rows of step d (block b's share) into buf, U 16-byte chunks a lane a row. */
template <int RPW, int U, int NBUF>
__device__ __forceinline__ void regs_load(const struct step_desc &d, int b, uint4 (&buf)[NBUF])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, R = d.n / NB;
    if (warp * RPW >= R)
        return;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const uint4 *row = (const uint4 *)(d.w + (size_t)(b * R + warp * RPW + r) * d.k);
#pragma unroll
        for (int i = 0; i < U; i++)
            buf[r * U + i] = __ldcs(row + lane + 32 * i);
    }
}

template <int RPW, int U>
__device__ __forceinline__ void mr_dots(const uint4 (&buf)[MR_BUF], const float *xs, const struct step_desc &d, int b,
                                        unsigned flag, int knock)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, R = d.n / NB;
    if (warp * RPW >= R)
        return;
    if (knock & KNOCK_DOTS) {
        if (lane < RPW)
            st_word(d.yl + (size_t)b * R + warp * RPW + lane, word(xs[warp * RPW + lane], flag));
        return;
    }
    const float v = regs_row_sums<RPW, U>(buf, xs);
    if (lane < RPW)
        st_word(d.yl + (size_t)b * R + warp * RPW + lane, word(v, flag));
}

/* Step g (rows in cur, shape RC x UC) with step g + 1's rows (shape RN x UN) asked into nxt first. */
template <int RC, int UC, int RN, int UN>
__device__ __forceinline__ void mr_step(const struct chain *c, int g, int total, uint4 (&cur)[MR_BUF],
                                        uint4 (&nxt)[MR_BUF], float *xs, int sleep_ns, int knock, int pf)
{
    const int b = blockIdx.x;
    if (g + 1 < total && !(knock & KNOCK_ROWS))
        regs_load<RN, UN>(c->s[(g + 1) % STEPS], b, nxt);
    if (pf > 0 && g + 1 + pf < total && !(knock & KNOCK_ROWS))
        prefetch_rows_l2(c->s[(g + 1 + pf) % STEPS], b);
    if (pf < 0 && g + 1 - pf < total && !(knock & KNOCK_ROWS)) { /* --pf -N: line by line */
        const struct step_desc &p = c->s[(g + 1 - pf) % STEPS];
        const int R = p.n / NB, bytes = R * p.k * 2;
        const char *src = (const char *)(p.w + (size_t)b * R * p.k);
        for (int o = threadIdx.x * 128; o < bytes; o += MR_NT * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(src + o));
    }
    const struct step_desc &d = c->s[g % STEPS];
    if (threadIdx.x < NT)
        poll_x(d.xl, d.k, (unsigned)g, xs, sleep_ns);
    __syncthreads();
    mr_dots<RC, UC>(cur, xs, d, b, (unsigned)g + 1, knock);
    __syncthreads(); /* xs is free */
}

__global__ void __launch_bounds__(MR_NT, 1) mega_regs_kernel(const struct chain *c, int tokens, int sleep_ns, int knock, int pf)
{
    __shared__ __align__(16) float xs[MAX_K];
    uint4 a[MR_BUF], bb[MR_BUF];
#pragma unroll
    for (int i = 0; i < MR_BUF; i++)
        a[i] = bb[i] = make_uint4(0, 0, 0, 0);
    const int total = tokens * STEPS;
    if (!(knock & KNOCK_ROWS))
        regs_load<2, 4>(c->s[0], blockIdx.x, a);
    for (int g = 0; g < total; g += PER_LAYER) { /* q|k|v, o, gate|up, down */
        mr_step<2, 4, 1, 8>(c, g, total, a, bb, xs, sleep_ns, knock, pf);
        mr_step<1, 8, 3, 4>(c, g + 1, total, bb, a, xs, sleep_ns, knock, pf);
        mr_step<3, 4, 1, 12>(c, g + 2, total, a, bb, xs, sleep_ns, knock, pf);
        mr_step<1, 12, 2, 4>(c, g + 3, total, bb, a, xs, sleep_ns, knock, pf);
    }
}

/* ---- the graph form with the rows in registers (graph regs) ----
 * step_kernel's launches, but each warp loads its rows into registers before the wait instead
 * of copying them into shared memory: RPW rows of U 16-byte chunks a lane (q|k|v 4 x 4, o 1 x 8,
 * gate|up 6 x 4, down 1 x 12), at most 128 registers a thread so that two blocks — the running
 * launch's and the next one's — fit on a multiprocessor. x goes to shared memory after the wait;
 * the sums run in dot_rows_t's order (bit for bit the graph form). */
template <int RPW, int U>
__global__ void __launch_bounds__(NT, 2) step_regs_kernel(const struct step_desc d, int knock)
{
    __shared__ __align__(16) float xs[MAX_K];
    const int b = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, R = d.n / NB;
    uint4 buf[RPW * U];
    pdl_trigger();
#pragma unroll
    for (int r = 0; r < RPW; r++) { /* (a select a chunk, not regs_load: the form measured in session 47) */
        const uint4 *row = (const uint4 *)(d.w + (size_t)(b * R + warp * RPW + r) * d.k);
#pragma unroll
        for (int i = 0; i < U; i++)
            buf[r * U + i] = (knock & KNOCK_ROWS) ? make_uint4(0, 0, 0, 0) : __ldcs(row + lane + 32 * i);
    }
    pdl_wait();
    for (int i = threadIdx.x; i < d.k / 4; i += NT)
        ((float4 *)xs)[i] = ((const float4 *)d.xf)[i];
    __syncthreads();
    if (knock & KNOCK_DOTS) {
        if (lane < RPW)
            d.yf[(size_t)b * R + warp * RPW + lane] = xs[warp * RPW + lane];
        return;
    }
    const float v = regs_row_sums<RPW, U>(buf, xs);
    if (lane < RPW)
        d.yf[(size_t)b * R + warp * RPW + lane] = v;
}

/* ---- set-up ---- */

__global__ void init_weights(__nv_bfloat16 *w, size_t n, float scale, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        w[i] = __float2bfloat16(((float)(h >> 8) / 16777216.0f * 2.0f - 1.0f) * scale);
    }
}

static void build_chain(struct chain *c, int shared_layers, __nv_bfloat16 **wbuf, size_t *wcount)
{
    size_t per_layer = 0;
    for (int j = 0; j < PER_LAYER; j++)
        per_layer += (size_t)shape_n[j] * shape_k[j];
    const int distinct = shared_layers ? 1 : LAYERS;
    *wcount = per_layer * distinct;
    CK(cudaMalloc(wbuf, *wcount * sizeof(__nv_bfloat16)));
    size_t off = 0;
    for (int j = 0; j < PER_LAYER; j++) {
        init_weights<<<1024, 256>>>(*wbuf + off, (size_t)shape_n[j] * shape_k[j], sqrtf(3.0f / shape_k[j]), 17u + j);
        off += (size_t)shape_n[j] * shape_k[j];
    }
    for (int l = 1; l < distinct; l++)
        CK(cudaMemcpy(*wbuf + l * per_layer, *wbuf, per_layer * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice));
    for (int s = 0; s < STEPS; s++) {
        const int l = s / PER_LAYER, j = s % PER_LAYER;
        size_t o = (shared_layers ? 0 : l * per_layer);
        for (int i = 0; i < j; i++)
            o += (size_t)shape_n[i] * shape_k[i];
        c->s[s].w = *wbuf + o;
        c->s[s].n = shape_n[j];
        c->s[s].k = shape_k[j];
        CK(cudaMalloc(&c->s[s].yf, shape_n[j] * sizeof(float)));
        CK(cudaMalloc(&c->s[s].yl, shape_n[j] * sizeof(unsigned long long)));
    }
    for (int s = 0; s < STEPS; s++) {
        const struct step_desc &p = c->s[(s + STEPS - 1) % STEPS];
        c->s[s].xf = p.yf, c->s[s].xl = p.yl;
    }
}

/* Initial x (the last step's output buffer, which step 0 reads) with the flag step 0 wants
 * first; every other word flag 0 (never wanted). */
static void reset_buffers(struct chain *c, unsigned first_want)
{
    for (int s = 0; s < STEPS; s++) {
        CK(cudaMemset(c->s[s].yf, 0, c->s[s].n * sizeof(float)));
        CK(cudaMemset(c->s[s].yl, 0, c->s[s].n * sizeof(unsigned long long)));
    }
    const int n = c->s[STEPS - 1].n;
    float *xf = (float *)malloc(n * sizeof(float));
    unsigned long long *xl = (unsigned long long *)malloc(n * sizeof(unsigned long long));
    for (int i = 0; i < n; i++) {
        xf[i] = sinf(0.37f * i + 0.1f);
        unsigned u;
        memcpy(&u, &xf[i], 4);
        xl[i] = ((unsigned long long)first_want << 32) | u;
    }
    CK(cudaMemcpy(c->s[STEPS - 1].yf, xf, n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c->s[STEPS - 1].yl, xl, n * sizeof(unsigned long long), cudaMemcpyHostToDevice));
    free(xf);
    free(xl);
}

/* A step's shared memory: its block's rows, then x (as the runtime sizes gemv_smem's). */
static size_t step_smem(const struct step_desc &d) { return (size_t)(d.n / NB) * d.k * 2 + d.k * sizeof(float); }

/* One token's graph (parity p) of the form LL (step_kernel). */
template <int LL>
static cudaGraphExec_t capture_token(const struct chain *c, cudaStream_t st, int parity, int sleep_ns, int knock,
                                     int pad_kb, int no_pdl)
{
    CK(cudaFuncSetAttribute(step_kernel<LL>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int s = 0; s < STEPS; s++) {
        const unsigned base = (unsigned)parity * STEPS;
        const unsigned want = s > 0 ? base + s : (unsigned)(1 - parity) * STEPS + STEPS;
        const unsigned flag = base + s + 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(NB);
        cfg.blockDim = dim3(NT);
        cfg.dynamicSmemBytes = step_smem(c->s[s]);
        if (cfg.dynamicSmemBytes < (size_t)pad_kb * 1024) /* --pad: fewer blocks a multiprocessor */
            cfg.dynamicSmemBytes = (size_t)pad_kb * 1024;
        cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = s > 0 && !no_pdl ? 1 : 0; /* the token's first step waits for the token before in full */
        CK(cudaLaunchKernelEx(&cfg, step_kernel<LL>, c->s[s], want, flag, sleep_ns, knock));
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
}

/* One token's graph of STEPS launches of NB blocks of NT threads: launch(s, cfg, attrs) sets
 * step s's shared memory and kernel; attribute 0 is PDL (from step 1 on, unless no_pdl), the
 * caller may add one more (at[1]) and count it in cfg.numAttrs. */
template <typename Launch>
static cudaGraphExec_t capture_steps(cudaStream_t st, int no_pdl, Launch launch)
{
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int s = 0; s < STEPS; s++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(NB);
        cfg.blockDim = dim3(NT);
        cfg.stream = st;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = s > 0 && !no_pdl ? 1 : 0;
        launch(s, cfg, at);
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
}

/* One token's graph of the graph regs form (step_regs_kernel, the shape by the step's product). */
static cudaGraphExec_t capture_token_regs(const struct chain *c, cudaStream_t st, int knock, int no_pdl)
{
    return capture_steps(st, no_pdl, [&](int s, cudaLaunchConfig_t &cfg, cudaLaunchAttribute *) {
        switch (s % PER_LAYER) {
        case 0: CK(cudaLaunchKernelEx(&cfg, step_regs_kernel<4, 4>, c->s[s], knock)); break;
        case 1: CK(cudaLaunchKernelEx(&cfg, step_regs_kernel<1, 8>, c->s[s], knock)); break;
        case 2: CK(cudaLaunchKernelEx(&cfg, step_regs_kernel<6, 4>, c->s[s], knock)); break;
        default: CK(cudaLaunchKernelEx(&cfg, step_regs_kernel<1, 12>, c->s[s], knock)); break;
        }
    });
}

/* One token's graph of the graph mc form (step_mc_kernel in clusters of MC). */
static cudaGraphExec_t capture_token_mc(const struct chain *c, cudaStream_t st, int knock, int no_pdl)
{
    CK(cudaFuncSetAttribute(step_mc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    return capture_steps(st, no_pdl, [&](int s, cudaLaunchConfig_t &cfg, cudaLaunchAttribute *at) {
        cfg.dynamicSmemBytes = step_smem(c->s[s]);
        at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        at[cfg.numAttrs].val.clusterDim.x = MC, at[cfg.numAttrs].val.clusterDim.y = 1;
        at[cfg.numAttrs].val.clusterDim.z = 1;
        cfg.numAttrs++;
        CK(cudaLaunchKernelEx(&cfg, step_mc_kernel, c->s[s], knock));
    });
}

/* The last step's output after the run, as floats. */
static void read_out(const struct chain *c, int ll, float *out)
{
    const int n = c->s[STEPS - 1].n;
    if (!ll) {
        CK(cudaMemcpy(out, c->s[STEPS - 1].yf, n * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    unsigned long long *w = (unsigned long long *)malloc(n * sizeof(*w));
    CK(cudaMemcpy(w, c->s[STEPS - 1].yl, n * sizeof(*w), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        unsigned u = (unsigned)w[i];
        memcpy(&out[i], &u, 4);
    }
    free(w);
}

enum form { F_GRAPH, F_LL, F_LL_LATE, F_MEGA, F_MEGA_CNT, F_MEGA_REGS, F_GRAPH_REGS, F_MEGA_RING, F_GRAPH_MC, F_COUNT };
static const char *form_name[F_COUNT] = {"graph (PDL + griddepcontrol.wait)", "ll (flagged x, no wait)",
                                         "ll late (flagged x, next launch after x)", "mega (one persistent launch, flagged x)",
                                         "mega cnt (one persistent launch, arrival counters)",
                                         "mega regs (persistent, rows in registers, flagged x)",
                                         "graph regs (PDL launches, rows in registers)",
                                         "mega ring (persistent, a ring of rows by bytes, flagged x)",
                                         "graph mc (PDL launches, x multicast in clusters of 4)"};

struct runner {
    struct chain *c, *dc;
    cudaStream_t st;
    cudaGraphExec_t g[F_COUNT][2];
    int sleep_ns, knock, pf;
    unsigned long long *cnt; /* [STEPS] mega cnt's arrival counters */
};

/* Runs `tokens` tokens of form f from the reset state; returns milliseconds. */
static float run_form(struct runner *r, int f, int tokens)
{
    reset_buffers(r->c, f == F_MEGA || f == F_MEGA_REGS || f == F_MEGA_RING ? 0u : 2u * STEPS);
    CK(cudaMemset(r->cnt, 0, STEPS * sizeof(unsigned long long)));
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, r->st));
    if (f == F_MEGA_RING) {
        void *args[] = {&r->dc, &tokens, &r->sleep_ns, &r->knock};
        CK(cudaLaunchCooperativeKernel((const void *)mega_ring_kernel, dim3(NB), dim3(NT), args, RING_BYTES + MAX_K * 4,
                                       r->st));
    } else if (f == F_MEGA_REGS) {
        void *args[] = {&r->dc, &tokens, &r->sleep_ns, &r->knock, &r->pf};
        CK(cudaLaunchCooperativeKernel((const void *)mega_regs_kernel, dim3(NB), dim3(MR_NT), args, 0, r->st));
    } else if (f == F_MEGA || f == F_MEGA_CNT) {
        void *args[] = {&r->dc, &tokens, &r->sleep_ns, &r->knock, &r->cnt, &r->pf};
        const void *k = f == F_MEGA ? (const void *)mega_kernel<0> : (const void *)mega_kernel<1>;
        CK(cudaLaunchCooperativeKernel(k, dim3(NB), dim3(NT), args, 2 * MAX_ROWS_BYTES + MAX_K * 4, r->st));
    } else {
        for (int t = 0; t < tokens; t++)
            CK(cudaGraphLaunch(r->g[f][t & 1], r->st));
    }
    CK(cudaEventRecord(b, r->st));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms;
}

/* A CPU reference of one token from the reset state (the graph form's x0). */
static void cpu_token(const struct chain *c, const __nv_bfloat16 *wbuf_dev, size_t wcount, float *out)
{
    uint16_t *w = (uint16_t *)malloc(wcount * 2);
    CK(cudaMemcpy(w, wbuf_dev, wcount * 2, cudaMemcpyDeviceToHost));
    static float x[8192], y[8192];
    const int n0 = c->s[STEPS - 1].n;
    for (int i = 0; i < n0; i++)
        x[i] = sinf(0.37f * i + 0.1f);
    for (int s = 0; s < STEPS; s++) {
        const uint16_t *ws = w + (c->s[s].w - wbuf_dev);
        for (int r = 0; r < c->s[s].n; r++) {
            double acc = 0;
            for (int k = 0; k < c->s[s].k; k++) {
                uint32_t u = (uint32_t)ws[(size_t)r * c->s[s].k + k] << 16;
                float f;
                memcpy(&f, &u, 4);
                acc += (double)f * x[k];
            }
            y[r] = (float)acc;
        }
        memcpy(x, y, c->s[s].n * sizeof(float));
    }
    memcpy(out, x, n0 * sizeof(float));
    free(w);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int tokens = 200, shared_layers = 0, sleep_ns = 0, reps = 5, knock = 0, pf = 0, pad_kb = 0, no_pdl = 0;
    const struct {
        const char *name;
        int *dst, flag; /* flag: set to 1, no value */
    } opts[] = {{"--tokens", &tokens, 0}, {"--shared-layers", &shared_layers, 1}, {"--sleep", &sleep_ns, 0},
                {"--pad", &pad_kb, 0},    {"--no-pdl", &no_pdl, 1},               {"--pf", &pf, 0},
                {"--knock", &knock, 0},   {"--reps", &reps, 0}};
    for (int i = 1; i < argc; i++) {
        size_t o = 0;
        while (o < sizeof(opts) / sizeof(opts[0]) && strcmp(argv[i], opts[o].name))
            o++;
        if (o == sizeof(opts) / sizeof(opts[0]) || (!opts[o].flag && i + 1 >= argc)) {
            fprintf(stderr, "usage: %s [--tokens N] [--shared-layers] [--sleep NS] [--reps N] [--knock 1|2|3] [--pf STEPS] "
                            "[--pad KB] [--no-pdl]\n",
                    argv[0]);
            return 2;
        }
        *opts[o].dst = opts[o].flag ? 1 : atoi(argv[++i]);
    }
    if (tokens < 1 || reps < 1 || knock < 0 || knock > 3 || pf < -8 || pad_kb < 0 || pad_kb > 220 || sleep_ns < 0) {
        fprintf(stderr, "%s: --tokens and --reps take 1 or more, --knock 0-3, --pad 0-220 KB, --pf -8 or more, the rest 0 or more\n",
                argv[0]);
        return 2;
    }
    struct runner r = {};
    r.c = (struct chain *)calloc(1, sizeof(struct chain));
    r.sleep_ns = sleep_ns, r.knock = knock, r.pf = pf;
    __nv_bfloat16 *wbuf;
    size_t wcount;
    build_chain(r.c, shared_layers, &wbuf, &wcount);
    CK(cudaMalloc(&r.dc, sizeof(struct chain)));
    CK(cudaMemcpy(r.dc, r.c, sizeof(struct chain), cudaMemcpyHostToDevice));
    CK(cudaFuncSetAttribute(mega_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * MAX_ROWS_BYTES + MAX_K * 4));
    CK(cudaFuncSetAttribute(mega_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES + MAX_K * 4));
    CK(cudaFuncSetAttribute(mega_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * MAX_ROWS_BYTES + MAX_K * 4));
    CK(cudaMalloc(&r.cnt, STEPS * sizeof(unsigned long long)));
    CK(cudaStreamCreateWithFlags(&r.st, cudaStreamNonBlocking));
    for (int p = 0; p < 2; p++) {
        r.g[F_GRAPH][p] = capture_token<0>(r.c, r.st, p, sleep_ns, knock, pad_kb, no_pdl);
        r.g[F_LL][p] = capture_token<1>(r.c, r.st, p, sleep_ns, knock, pad_kb, no_pdl);
        r.g[F_LL_LATE][p] = capture_token<2>(r.c, r.st, p, sleep_ns, knock, pad_kb, no_pdl);
        r.g[F_GRAPH_REGS][p] = capture_token_regs(r.c, r.st, knock, no_pdl);
        r.g[F_GRAPH_MC][p] = capture_token_mc(r.c, r.st, knock, no_pdl);
    }
    size_t bytes = 0;
    for (int s = 0; s < STEPS; s++)
        bytes += (size_t)r.c->s[s].n * r.c->s[s].k * 2;

    /* correctness: every form's output after 1 and 2 tokens against the graph form's, and the
     * graph form's first token against the CPU */
    const int n_out = r.c->s[STEPS - 1].n;
    float *ref = (float *)malloc(n_out * 4), *got = (float *)malloc(n_out * 4), *cpu = (float *)malloc(n_out * 4);
    int bad = 0;
    for (int t = 1; t <= 2 && !knock; t++) {
        run_form(&r, F_GRAPH, t);
        read_out(r.c, 0, ref);
        if (t == 1) {
            cpu_token(r.c, wbuf, wcount, cpu);
            double worst = 0, norm = 0;
            for (int i = 0; i < n_out; i++)
                worst = fmax(worst, fabs(ref[i] - cpu[i])), norm = fmax(norm, fabs(cpu[i]));
            printf("graph vs CPU after 1 token: worst |diff| %.3g of max |x| %.3g\n", worst, norm);
            if (!(worst <= 1e-3 * norm))
                bad = 1;
        }
        for (int f = F_LL; f < F_COUNT; f++) {
            run_form(&r, f, t);
            read_out(r.c, f != F_MEGA_CNT && f != F_GRAPH_REGS && f != F_GRAPH_MC, got);
            int diff = memcmp(ref, got, n_out * 4) != 0;
            printf("%-36s after %d token(s): %s\n", form_name[f], t, diff ? "DIFFERS from graph" : "bit for bit graph");
            bad |= diff;
        }
    }

    printf("\nchain: %d products a token (%s), %.1f MB of rows a token, %d tokens a run, medians of %d runs "
           "interleaved, sleep %d ns, knock-out %d, L2 look-ahead %d, pad %d KB, PDL %s\n",
           STEPS, shared_layers ? "every layer layer 0's rows: L2-resident" : "28 distinct layers",
           bytes / 1e6, tokens, reps, sleep_ns, knock, pf, pad_kb, no_pdl ? "off" : "on");
    printf("| form | us a token | us a step | GB/s of rows |\n|---|---:|---:|---:|\n");
    float *t_ms = (float *)calloc((size_t)F_COUNT * reps, sizeof(float));
    for (int f = 0; f < F_COUNT; f++)
        run_form(&r, f, tokens / 4 + 1); /* warm-up */
    for (int rep = 0; rep < reps; rep++)
        for (int f = 0; f < F_COUNT; f++)
            t_ms[f * reps + rep] = run_form(&r, f, tokens);
    for (int f = 0; f < F_COUNT; f++) {
        qsort(t_ms + f * reps, reps, sizeof(float), cmp_float);
        const double us = t_ms[f * reps + reps / 2] * 1e3 / tokens;
        printf("| %s | %.1f | %.3f | %.0f |\n", form_name[f], us, us / STEPS, bytes / us / 1e3);
    }
    printf("\n%s\n", bad ? "CHECK FAILED" : "all forms agree");
    return bad;
}
