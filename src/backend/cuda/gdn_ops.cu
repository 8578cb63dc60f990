/*
 * gdn_ops.cu — the Gated DeltaNet plan ops one by one (kernels_ref.c's gdn_conv, gdn_core,
 * gated_rmsnorm): the causal conv (a thread per channel, tokens in order; or token-parallel for
 * the prompt with a halo pass), the core in its recurrent form (a block per value head) and in
 * the prompt's column-parallel form (gdn_prep_kernel, then gdn_scan_kernel: each state column
 * walked by GDN_SCAN_LANES lanes), and the gated rmsnorm (f32, or the prefill products' bf16
 * terms written directly). The decode graph's fused step (conv + core + gated norm in one
 * launch) is gdn_decode.cu; the chunked prompt form, off by default, gdn_chunked.cu.
 *
 * Numerics: f32 throughout; dot products and norms are summed across lanes (warp_sum, block_sum),
 * so results equal the reference up to f32 rounding.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gdn_step.cuh"

#include <math.h>

/* ---- Gated DeltaNet causal conv: one thread per channel, tokens in order ----
 * The thread keeps the last K-1 inputs of its channel in registers (state rows first), so the
 * in-place update of x is safe. K <= CONV_MAX_K. */

#define CONV_MAX_K GDN_CONV_MAX_K

__global__ void gdn_conv_kernel(float *x, int32_t ldx, float *state, const float *taps,
                                int32_t C, int32_t K, int32_t T)
{
    griddep_launch();
    griddep_wait();
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C)
        return;
    int R = K - 1;
    float win[CONV_MAX_K], tap[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; j++) {
        win[j] = j < R ? state[(int64_t)j * C + ch] : 0.0f;
        tap[j] = j < K ? taps[(int64_t)ch * K + j] : 0.0f;
    }
    for (int t = 0; t < T; t++) {
        float in = x[(int64_t)t * ldx + ch];
        float acc = gdn_conv_dot(tap, win, in, R);
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++)
            if (j < R - 1)
                win[j] = win[j + 1];
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; j++)
            if (j == R - 1)
                win[j] = in;
        x[(int64_t)t * ldx + ch] = silu_f(acc);
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; j++)
        if (j < R)
            state[(int64_t)j * C + ch] = win[j];
}

cudaError_t launch_gdn_conv(float *x, int32_t ldx, float *state, const float *taps, int32_t C,
                            int32_t K, int32_t T, cudaStream_t s, bool pdl)
{
    if (K < 2 || K > CONV_MAX_K)
        return cudaErrorInvalidValue;
    return launch_k(pdl, gdn_conv_kernel, dim3((C + 127) / 128), dim3(128), 0, s, x, ldx, state,
                    taps, C, K, T);
}

/* ---- Gated DeltaNet core (recurrent form): one block per value head ----
 * Thread (c, sub) of the block, c = tid / TPC, owns column c of the head's state S [dk][dv]
 * at rows sub, sub+TPC, ... (dk/TPC <= 32 rows, in registers for the whole run). Per token:
 * warps 0 and 1 L2-normalise q and k into shared memory; each thread decays its rows, forms
 * its part of S^T k, the TPC threads of a column reduce it with shuffles, update their rows
 * with k*delta and form their part of S^T q, reduced the same way. The state is read once at
 * the start and written once at the end of the run. */

#define GDN_MAX_ROWS 32

/* One token of the causal conv (gdn_conv_kernel's arithmetic, in the same order) for value
 * head j's channels: q and k of key head j and v of head j, in place on qkv, the conv state
 * shifted. Only for Hv == Hk, where no other block reads these channels. */
__device__ void gdn_conv_own_channels(const struct gdn_args &a, int j)
{
    int dk = a.dk, dv = a.dv;
    for (int i = threadIdx.x; i < 2 * dk + dv; i += blockDim.x) {
        int ch = i < dk ? j * dk + i : i < 2 * dk ? a.Hk * dk + j * dk + (i - dk)
                                                  : 2 * a.Hk * dk + j * dv + (i - 2 * dk);
        float win[GDN_CONV_MAX_K];
        float y = gdn_conv_token(a, ch, win); /* every load before the first store */
        gdn_conv_store(a, ch, y, win);
    }
}

template <int TPC>
__global__ void gdn_core_kernel(const __grid_constant__ struct gdn_args a)
{
    griddep_launch();
    griddep_wait();
    __shared__ float qs[GDN_MAX_ROWS * 8], ks[GDN_MAX_ROWS * 8], red[32];
    int j = blockIdx.x, tid = threadIdx.x, c = tid / TPC, sub = tid % TPC;
    int lane = tid & 31, warp = tid >> 5;
    int dk = a.dk, dv = a.dv, nr = dk / TPC;
    int kh = a.tiled ? j % a.Hk : j / (a.Hv / a.Hk);
    float *S = a.state + (int64_t)j * dk * dv;
    float s[GDN_MAX_ROWS];
#pragma unroll
    for (int i = 0; i < GDN_MAX_ROWS; i++)
        s[i] = (i < nr && c < dv) ? S[(int64_t)(sub + TPC * i) * dv + c] : 0.0f;
    float qscale = rsqrtf((float)dk), dtb = a.dt[j], sa = a.ssm_a[j];
    /* token 0's gate inputs and z loaded with the state, off the chain of round trips */
    float b0 = a.b[j], a0 = a.a[j], z0 = a.z && c < dv ? a.z[(int64_t)j * dv + c] : 0.0f;
    float gw = a.z && c < dv ? a.gnorm_w[c] : 0.0f; /* the gated norm's weight, likewise */
    if (a.conv_state) { /* T = 1, Hv == Hk: this block's channels are its own */
        gdn_conv_own_channels(a, j);
        __syncthreads();
    }
    for (int t = 0; t < a.T; t++) {
        const float *row = a.qkv + (int64_t)t * a.ldi;
        if (warp < 2) { /* the row's loads all issued before the first use (dk <= 256) */
            const float *src = row + (int64_t)warp * a.Hk * dk + (int64_t)kh * dk;
            float xv[GDN_MAX_ROWS / 4], ss = 0.0f;
#pragma unroll
            for (int u = 0; u < GDN_MAX_ROWS / 4; u++)
                xv[u] = lane + 32 * u < dk ? src[lane + 32 * u] : 0.0f;
#pragma unroll
            for (int u = 0; u < GDN_MAX_ROWS / 4; u++)
                if (lane + 32 * u < dk)
                    ss += xv[u] * xv[u];
            ss = warp_sum(ss);
            float r = rsqrtf(ss + 1e-6f) * (warp == 0 ? qscale : 1.0f);
            float *dst = warp == 0 ? qs : ks;
#pragma unroll
            for (int u = 0; u < GDN_MAX_ROWS / 4; u++)
                if (lane + 32 * u < dk)
                    dst[lane + 32 * u] = xv[u] * r;
        }
        __syncthreads();
        float beta = sigmoid_f(t == 0 ? b0 : a.b[(int64_t)t * a.ldb + j]);
        float decay = expf(sa * softplus_f((t == 0 ? a0 : a.a[(int64_t)t * a.lda + j]) + dtb));
        float v = c < dv ? row[(int64_t)2 * a.Hk * dk + (int64_t)j * dv + c] : 0.0f;
        float opart = gdn_column_step<TPC, GDN_MAX_ROWS>(s, nr, sub, ks, qs, decay, beta, v);
        if (a.z) { /* the gated RMS norm over the head's dv outputs (one value per column) */
            float ss = block_sum(sub == 0 && c < dv ? opart * opart : 0.0f, red);
            if (c < dv)
                opart *= rsqrtf(ss / (float)dv + a.geps) * gw *
                         silu_f(t == 0 ? z0 : a.z[(int64_t)t * a.ldz + (int64_t)j * dv + c]);
        }
        if (sub == 0 && c < dv)
            a.out[(int64_t)t * a.ldo + (int64_t)j * dv + c] = opart;
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < GDN_MAX_ROWS; i++)
        if (i < nr && c < dv)
            S[(int64_t)(sub + TPC * i) * dv + c] = s[i];
}

/* TPC threads per column: the smallest power of two with dk / TPC <= 32. */
static int gdn_tpc(int32_t dk) { return dk <= 32 ? 1 : dk <= 64 ? 2 : dk <= 128 ? 4 : 8; }

bool gdn_supports(int32_t dk, int32_t dv)
{
    int tpc = gdn_tpc(dk);
    int threads = ((dv * tpc + 63) / 64) * 64;
    return dk <= 256 && dk % tpc == 0 && threads <= 1024;
}

cudaError_t launch_gdn_core(const struct gdn_args *a, cudaStream_t s)
{
    if (a->split && gdn_split_applies(a))
        return launch_gdn_split(a, s);
    int tpc = gdn_tpc(a->dk);
    int threads = ((a->dv * tpc + 63) / 64) * 64; /* >= 2 warps for the q/k norms */
    dim3 g(a->Hv), b(threads);
    switch (tpc) {
    case 1: return launch_k(a->pdl, gdn_core_kernel<1>, g, b, 0, s, *a);
    case 2: return launch_k(a->pdl, gdn_core_kernel<2>, g, b, 0, s, *a);
    case 4: return launch_k(a->pdl, gdn_core_kernel<4>, g, b, 0, s, *a);
    default: return launch_k(a->pdl, gdn_core_kernel<8>, g, b, 0, s, *a);
    }
}

/* ---- Gated DeltaNet, column-parallel prefill form ----
 * The recurrence is independent per state column: column c of head j needs only k, q (shared
 * by the head), beta, decay and v[c]. gdn_prep_kernel normalises q and k and computes k·q,
 * beta and decay for every token at once (one warp per (key head, token)); gdn_scan_kernel
 * then gives each column LPC lanes (NR = dk/LPC rows each, in registers) and runs the tokens
 * in order, reading them from shared-memory chunks that cp.async fills one chunk ahead (a
 * block barrier per chunk, none per token). Per token the chain is one pass over the rows and
 * log2(LPC) shuffle rounds (the session-4 form loaded each token's inputs from global memory
 * one token ahead and reduced s·k before computing s·q: ~1,000 cycles per token, 4.9 ms of
 * Qwen3.5's pp512). The scan is latency-bound with few warps (Qwen3.5: 16 heads x 128 columns
 * x 8 lanes was 4 warps per SM): 16 lanes per column double the warps and halve each lane's
 * rows (docs/perf-log.md, session 7).
 * Scratch: qn, kn [T][Hk][dk], beta, decay [T][Hv], kq [T][Hk]. */

int64_t gdn_scan_scratch_floats(const struct gdn_args *a)
{
    return (int64_t)a->T * (2 * (int64_t)a->Hk * a->dk + 2 * (int64_t)a->Hv + a->Hk);
}

bool gdn_scan_supports(int32_t dk, int32_t dv)
{
    return (dk == 32 || dk == 64 || dk == 128 || dk == 256) && dv >= 1;
}

#define GDN_PREP_WARPS 8

/* One warp per (key head, token): q's and k's rows L2-normalised (q also scaled by
 * 1/sqrt(dk)) and their dot product k·q (state-free, so the scan need not reduce it); the
 * block's threads also turn (token, value head) pairs into beta and decay. One block per
 * (head, token) with a block reduction cost ~22 us per Qwen3.5 layer at T = 512. */
__global__ void __launch_bounds__(32 * GDN_PREP_WARPS) gdn_prep_kernel(const __grid_constant__ struct gdn_args a)
{
    griddep_launch();
    griddep_wait();
    int lane = threadIdx.x & 31, dk = a.dk, Hk = a.Hk;
    int64_t w = (int64_t)blockIdx.x * GDN_PREP_WARPS + (threadIdx.x >> 5);
    float *qn = a.scratch, *kn = qn + (int64_t)a.T * Hk * dk;
    float *betas = kn + (int64_t)a.T * Hk * dk, *decays = betas + (int64_t)a.T * a.Hv;
    float *kqs = decays + (int64_t)a.T * a.Hv;
    if (w < (int64_t)a.T * Hk) {
        int t = (int)(w / Hk), kh = (int)(w % Hk);
        const float *qsrc = a.qkv + (int64_t)t * a.ldi + (int64_t)kh * dk;
        const float *ksrc = qsrc + (int64_t)Hk * dk;
        float q[8], k[8], qq = 0.0f, kk = 0.0f, kq = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            bool in = lane + 32 * i < dk;
            q[i] = in ? qsrc[lane + 32 * i] : 0.0f;
            k[i] = in ? ksrc[lane + 32 * i] : 0.0f;
            qq += q[i] * q[i], kk += k[i] * k[i];
        }
        float rq = 1.0f / sqrtf(warp_sum(qq) + 1e-6f) / sqrtf((float)dk);
        float rk = 1.0f / sqrtf(warp_sum(kk) + 1e-6f);
        int64_t row = ((int64_t)t * Hk + kh) * dk;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (lane + 32 * i < dk) {
                q[i] *= rq, k[i] *= rk;
                qn[row + lane + 32 * i] = q[i];
                kn[row + lane + 32 * i] = k[i];
                kq = fmaf(k[i], q[i], kq);
            }
        kq = warp_sum(kq);
        if (lane == 0)
            kqs[(int64_t)t * Hk + kh] = kq;
    }
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)a.T * a.Hv) {
        int t = (int)(i / a.Hv), j = (int)(i % a.Hv);
        betas[i] = sigmoid_f(a.b[(int64_t)t * a.ldb + j]);
        decays[i] = expf(a.ssm_a[j] * softplus_f(a.a[(int64_t)t * a.lda + j] + a.dt[j]));
    }
}

/* tokens of a chunk unrolled: the next token's loads issue while this one's chain runs
 * (session 6: 2 took gdn_core 2.02 -> 1.93 ms per pp512, 4 was slower; four accumulators for
 * s·q instead of one changed nothing) */
#ifndef GDN_SCAN_UNROLL
#define GDN_SCAN_UNROLL 2
#endif
static constexpr int gdn_scan_unroll = GDN_SCAN_UNROLL; /* #pragma unroll expands no macro */
/* lanes per state column (launch_scan_dk keeps 4..32 rows per lane); -D overrides */
#ifndef GDN_SCAN_LANES
#define GDN_SCAN_LANES 8
#endif
#define GDN_SCAN_COLS 16      /* state columns per block */
#define GDN_SCAN_FLOATS 2048  /* k and q floats per chunk buffer: TC x dk */

/* One chunk of the scan's inputs in shared memory: TC tokens of the head's normalised k and
 * q, the block's value columns, beta, decay and k·q. */
template <int DK, int TC>
struct gdn_chunk {
    float k[TC][DK], q[TC][DK], v[TC][GDN_SCAN_COLS], beta[TC], decay[TC], kq[TC];
};

/* Starts the copies of tokens [t0, t0 + TC) (those below T) into c; one commit group. */
template <int DK, int TC>
__device__ void gdn_scan_stage(struct gdn_chunk<DK, TC> &c, const struct gdn_args &a, int t0, int kh,
                               int j, int c0)
{
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * a.Hk * DK;
    const float *betas = kn + (int64_t)a.T * a.Hk * DK, *decays = betas + (int64_t)a.T * a.Hv;
    const float *kqs = decays + (int64_t)a.T * a.Hv;
    int n = a.T - t0 < TC ? a.T - t0 : TC;
    for (int i = threadIdx.x; i < n * (DK / 4); i += blockDim.x) {
        int tt = i / (DK / 4), e = (i % (DK / 4)) * 4;
        int64_t src = (int64_t)(t0 + tt) * a.Hk * DK + (int64_t)kh * DK + e;
        cp_async16(smem_u32(&c.k[tt][e]), kn + src);
        cp_async16(smem_u32(&c.q[tt][e]), qn + src);
    }
    const float *vsrc = a.qkv + (int64_t)2 * a.Hk * DK + (int64_t)j * a.dv;
    for (int i = threadIdx.x; i < n * GDN_SCAN_COLS; i += blockDim.x) {
        int tt = i / GDN_SCAN_COLS, cc = i % GDN_SCAN_COLS;
        if (c0 + cc < a.dv)
            cp_async4(smem_u32(&c.v[tt][cc]), vsrc + (int64_t)(t0 + tt) * a.ldi + c0 + cc);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        cp_async4(smem_u32(&c.beta[i]), betas + (int64_t)(t0 + i) * a.Hv + j);
        cp_async4(smem_u32(&c.decay[i]), decays + (int64_t)(t0 + i) * a.Hv + j);
        cp_async4(smem_u32(&c.kq[i]), kqs + (int64_t)(t0 + i) * a.Hk + kh);
    }
    cp_async_commit();
}

/* Row of state register i of a lane at position sub among its column's LPC lanes: rows
 * (i/4)*4*LPC + sub*4 + i%4, so the LPC lanes' 16-byte reads of k and q are contiguous. */
template <int LPC>
__device__ __forceinline__ int gdn_scan_row(int i, int sub)
{
    return (i / 4) * 4 * LPC + sub * 4 + (i & 3);
}

/* One token of the recurrence for this lane's NR state rows of column c:
 *   s *= decay; mp = s·k; delta = beta (v - mp); s += k delta; o = s·q
 * computed as mp = decay (s·k) and o = decay (s·q) + delta (k·q), so that the two dot
 * products are independent and share their shuffle rounds (k·q comes from the prep kernel):
 * the chain from one token's delta to the next is one pass over the rows and log2(LPC)
 * shuffle rounds. */
template <int NR, int LPC, int DK, int TC>
__device__ __forceinline__ float gdn_scan_token(float (&s)[NR], const struct gdn_chunk<DK, TC> &c, int tt,
                                                int sub, int col)
{
    float kr[NR], qr[NR];
#pragma unroll
    for (int m = 0; m < NR / 4; m++) {
        float4 k4 = *(const float4 *)&c.k[tt][m * 4 * LPC + sub * 4];
        float4 q4 = *(const float4 *)&c.q[tt][m * 4 * LPC + sub * 4];
        kr[4 * m] = k4.x, kr[4 * m + 1] = k4.y, kr[4 * m + 2] = k4.z, kr[4 * m + 3] = k4.w;
        qr[4 * m] = q4.x, qr[4 * m + 1] = q4.y, qr[4 * m + 2] = q4.z, qr[4 * m + 3] = q4.w;
    }
    float d = c.decay[tt], b = c.beta[tt], v = c.v[tt][col], kq = c.kq[tt];
    float sk[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NR; i++) {
        sk[i & 3] = fmaf(s[i], kr[i], sk[i & 3]);
        sq[i & 1] = fmaf(s[i], qr[i], sq[i & 1]);
    }
    float mp = (sk[0] + sk[1]) + (sk[2] + sk[3]), sqs = sq[0] + sq[1];
#pragma unroll
    for (int o = 1; o < LPC; o <<= 1) {
        mp += __shfl_xor_sync(0xffffffffu, mp, o);
        sqs += __shfl_xor_sync(0xffffffffu, sqs, o);
    }
    float delta = b * (v - d * mp);
#pragma unroll
    for (int i = 0; i < NR; i++)
        s[i] = fmaf(kr[i], delta, s[i] * d);
    return fmaf(d, sqs, delta * kq);
}

/* Block: value head j, state columns [c0, c0 + 16), LPC lanes per column with NR = dk/LPC
 * rows each in registers (16 * LPC / 32 warps). The inputs come through two shared-memory
 * chunks of TC tokens filled with cp.async, the next chunk in flight while this one runs. */
template <int NR, int LPC>
__global__ void __launch_bounds__(GDN_SCAN_COLS * LPC)
    gdn_scan_kernel(const __grid_constant__ struct gdn_args a)
{
    constexpr int DK = LPC * NR, TC = GDN_SCAN_FLOATS / DK;
    __shared__ __align__(16) struct gdn_chunk<DK, TC> buf[2];
    griddep_launch();
    griddep_wait();
    int sub = threadIdx.x % LPC, col = threadIdx.x / LPC;
    int j = blockIdx.x, dv = a.dv, c0 = blockIdx.y * GDN_SCAN_COLS, c = c0 + col;
    bool col_ok = c < dv;
    int cc = col_ok ? c : dv - 1;
    int kh = a.tiled ? j % a.Hk : j / (a.Hv / a.Hk);
    float *S = a.state + (int64_t)j * DK * dv;
    float s[NR];
#pragma unroll
    for (int i = 0; i < NR; i++)
        s[i] = S[(int64_t)gdn_scan_row<LPC>(i, sub) * dv + cc];
    gdn_scan_stage<DK, TC>(buf[0], a, 0, kh, j, c0);
    for (int t0 = 0, ch = 0; t0 < a.T; t0 += TC, ch ^= 1) {
        if (t0 + TC < a.T) {
            gdn_scan_stage<DK, TC>(buf[ch ^ 1], a, t0 + TC, kh, j, c0);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        int n = a.T - t0 < TC ? a.T - t0 : TC;
        float *out = a.out + (int64_t)t0 * a.ldo + (int64_t)j * dv + c;
#pragma unroll gdn_scan_unroll
        for (int tt = 0; tt < n; tt++) {
            float o = gdn_scan_token<NR, LPC, DK, TC>(s, buf[ch], tt, sub, col);
            if (sub == 0 && col_ok)
                out[(int64_t)tt * a.ldo] = o;
        }
        __syncthreads(); /* buf[ch] is refilled by the next iteration's stage */
    }
    if (col_ok)
#pragma unroll
        for (int i = 0; i < NR; i++)
            S[(int64_t)gdn_scan_row<LPC>(i, sub) * dv + c] = s[i];
}

cudaError_t launch_gdn_prep(const struct gdn_args *a, cudaStream_t s)
{
    int64_t rows = (int64_t)a->T * a->Hk, pairs = (int64_t)a->T * a->Hv;
    int64_t blocks = (rows + GDN_PREP_WARPS - 1) / GDN_PREP_WARPS, pb = (pairs + 32 * GDN_PREP_WARPS - 1) / (32 * GDN_PREP_WARPS);
    return launch_k(a->pdl, gdn_prep_kernel, dim3((unsigned)(blocks > pb ? blocks : pb)),
                    dim3(32 * GDN_PREP_WARPS), 0, s, *a);
}

/* Lanes per column for head size DK: GDN_SCAN_LANES, within 4..32 rows per lane. */
template <int DK>
static cudaError_t launch_scan_dk(const struct gdn_args *a, dim3 g, cudaStream_t s)
{
    constexpr int L0 = GDN_SCAN_LANES;
    static_assert(L0 == 4 || L0 == 8 || L0 == 16 || L0 == 32, "GDN_SCAN_LANES: 4, 8, 16 or 32");
    constexpr int L = DK / L0 > 32 ? DK / 32 : (DK / L0 < 4 ? DK / 4 : L0);
    return launch_k(a->pdl, gdn_scan_kernel<DK / L, L>, g, dim3(GDN_SCAN_COLS * L), 0, s, *a);
}

cudaError_t launch_gdn_scan(const struct gdn_args *a, cudaStream_t s)
{
    if (!gdn_scan_supports(a->dk, a->dv) || !a->scratch)
        return cudaErrorInvalidValue;
    cudaError_t e = launch_gdn_prep(a, s);
    if (e != cudaSuccess)
        return e;
    dim3 g(a->Hv, (a->dv + GDN_SCAN_COLS - 1) / GDN_SCAN_COLS);
    switch (a->dk) {
    case 32: return launch_scan_dk<32>(a, g, s);
    case 64: return launch_scan_dk<64>(a, g, s);
    case 128: return launch_scan_dk<128>(a, g, s);
    default: return launch_scan_dk<256>(a, g, s);
    }
}

/* ---- causal conv, token-parallel (prefill): one thread per (channel, CONV_CT tokens) ----
 * In place: gdn_conv_halo_kernel first saves, for every chunk of CONV_CT tokens, the K - 1
 * inputs before it (the old state's rows before token 0), and writes the new state rows over
 * the old ones (the thread of chunk 0 reads a channel's old rows before it writes them: no
 * copy of the new state through scratch); then each
 * thread of gdn_conv_par_kernel reads its chunk's inputs into registers before writing its
 * outputs over them, taking the rows before the chunk from the saved copy (which the previous
 * chunk's thread may already have overwritten in x). */

#define CONV_CT 16

int64_t gdn_conv_par_scratch_floats(int32_t C, int32_t K, int32_t T)
{
    return (int64_t)(T + CONV_CT - 1) / CONV_CT * (K - 1) * C;
}

__global__ void gdn_conv_halo_kernel(float *__restrict__ halo, const float *__restrict__ x, int32_t ldx,
                                     float *__restrict__ state, int32_t C, int32_t K, int32_t T)
{
    griddep_launch();
    griddep_wait();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, R = K - 1;
    if (ch >= C)
        return;
    float old[CONV_MAX_K], neu[CONV_MAX_K]; /* chunk c's rows before it; the new state */
#pragma unroll
    for (int r = 0; r < CONV_MAX_K - 1; r++) {
        if (r >= R)
            break;
        int pos = c * CONV_CT - R + r, pn = T - R + r;
        old[r] = pos < 0 ? state[(int64_t)(R + pos) * C + ch] : x[(int64_t)pos * ldx + ch];
        if (c == 0)
            neu[r] = pn < 0 ? state[(int64_t)(R + pn) * C + ch] : x[(int64_t)pn * ldx + ch];
    }
#pragma unroll
    for (int r = 0; r < CONV_MAX_K - 1; r++) {
        if (r >= R)
            break;
        halo[((int64_t)c * R + r) * C + ch] = old[r];
        if (c == 0) /* only chunk 0 reads the old state, and only this thread this channel */
            state[(int64_t)r * C + ch] = neu[r];
    }
}

__global__ void gdn_conv_par_kernel(float *x, int32_t ldx, const float *__restrict__ halo,
                                    const float *__restrict__ taps, int32_t C, int32_t K, int32_t T)
{
    griddep_launch();
    griddep_wait();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, t0 = c * CONV_CT, R = K - 1;
    if (ch >= C)
        return;
    float tap[CONV_MAX_K], win[CONV_CT + CONV_MAX_K - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; j++)
        tap[j] = j < K ? taps[(int64_t)ch * K + j] : 0.0f;
#pragma unroll
    for (int i = 0; i < CONV_CT + CONV_MAX_K - 1; i++) {
        int pos = t0 - R + i;
        float v = 0.0f;
        if (i < R)
            v = halo[((int64_t)c * R + i) * C + ch];
        else if (i < R + CONV_CT && pos < T)
            v = x[(int64_t)pos * ldx + ch];
        win[i] = v;
    }
#pragma unroll
    for (int tt = 0; tt < CONV_CT; tt++) {
        if (t0 + tt >= T)
            break;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; j++)
            if (j < K)
                acc += tap[j] * win[tt + j];
        x[(int64_t)(t0 + tt) * ldx + ch] = silu_f(acc);
    }
}

cudaError_t launch_gdn_conv_par(float *x, int32_t ldx, float *state, float *halo, const float *taps,
                                int32_t C, int32_t K, int32_t T, cudaStream_t s)
{
    if (K < 2 || K > CONV_MAX_K)
        return cudaErrorInvalidValue;
    unsigned nch = (unsigned)((T + CONV_CT - 1) / CONV_CT);
    cudaError_t e = launch_k(false, gdn_conv_halo_kernel, dim3((C + 127) / 128, nch), dim3(128), 0, s, halo,
                             (const float *)x, ldx, state, C, K, T);
    if (e != cudaSuccess)
        return e;
    return launch_k(false, gdn_conv_par_kernel, dim3((C + 127) / 128, nch), dim3(128), 0, s, x, ldx,
                    (const float *)halo, taps, C, K, T);
}

/* ---- gated rmsnorm: one block per (value head, token) ---- */

/* o's head rows normalised, times w and silu(z): in place (OUT float, out = o), or written to
 * out in bf16 (and the remainder's bf16 to mid: the fast prefill's product input). */
template <typename OUT>
__global__ void gated_rmsnorm_kernel(OUT *out, OUT *mid, int32_t ldout, const float *o, int32_t ldo,
                                     const float *z, int32_t ldz, const float *w, int32_t dv, float eps)
{
    griddep_launch();
    griddep_wait();
    __shared__ float red[32];
    int j = blockIdx.x, t = blockIdx.y;
    const float *op = o + (int64_t)t * ldo + (int64_t)j * dv;
    const float *zp = z + (int64_t)t * ldz + (int64_t)j * dv;
    OUT *yp = out + (int64_t)t * ldout + (int64_t)j * dv;
    OUT *ym = mid ? mid + (int64_t)t * ldout + (int64_t)j * dv : NULL;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dv; d += blockDim.x)
        ss += op[d] * op[d];
    ss = block_sum(ss, red);
    float scale = rsqrtf(ss / (float)dv + eps);
    for (int d = threadIdx.x; d < dv; d += blockDim.x)
        put_out(&yp[d], ym ? &ym[d] : NULL, op[d] * scale * w[d] * silu_f(zp[d]));
}

/* The same with one warp per (head, token) row, for dv a multiple of 4 up to 512 on 16-byte
 * aligned rows: float4 loads, a warp sum instead of a block barrier (one block of dv threads
 * per row waited on shared memory for a 128-element row). */
#define GN_WARPS 8
template <typename OUT>
__global__ void __launch_bounds__(32 * GN_WARPS)
    gated_rmsnorm_warp_kernel(OUT *out, OUT *mid, int32_t ldout, const float *o, int32_t ldo, const float *z,
                              int32_t ldz, const float *w, int32_t Hv, int32_t dv, float eps, int32_t T)
{
    griddep_launch();
    griddep_wait();
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * GN_WARPS + (threadIdx.x >> 5);
    if (row >= (int64_t)Hv * T)
        return;
    int t = (int)(row / Hv), j = (int)(row % Hv);
    const float *op = o + (int64_t)t * ldo + (int64_t)j * dv, *zp = z + (int64_t)t * ldz + (int64_t)j * dv;
    float4 ov[4], zv[4];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int d = 4 * (lane + 32 * u);
        bool in = d < dv;
        ov[u] = in ? *(const float4 *)(op + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        zv[u] = in ? *(const float4 *)(zp + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += ov[u].x * ov[u].x + ov[u].y * ov[u].y + ov[u].z * ov[u].z + ov[u].w * ov[u].w;
    }
    float scale = rsqrtf(warp_sum(ss) / (float)dv + eps);
    OUT *yp = out + (int64_t)t * ldout + (int64_t)j * dv;
    OUT *ym = mid ? mid + (int64_t)t * ldout + (int64_t)j * dv : NULL;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int d = 4 * (lane + 32 * u);
        if (d >= dv)
            break;
        float4 wv = *(const float4 *)(w + d);
        float y[4] = {ov[u].x * scale * wv.x * silu_f(zv[u].x), ov[u].y * scale * wv.y * silu_f(zv[u].y),
                      ov[u].z * scale * wv.z * silu_f(zv[u].z), ov[u].w * scale * wv.w * silu_f(zv[u].w)};
        put_out4(&yp[d], ym ? &ym[d] : NULL, y);
    }
}

static bool gn_warp_applies(const float *o, int32_t ldo, const float *z, int32_t ldz, const float *w, int32_t dv)
{
    return dv % 4 == 0 && dv <= 512 && ldo % 4 == 0 && ldz % 4 == 0 && (uintptr_t)o % 16 == 0 &&
           (uintptr_t)z % 16 == 0 && (uintptr_t)w % 16 == 0;
}

cudaError_t launch_gated_rmsnorm(float *o, int32_t ldo, const float *z, int32_t ldz,
                                 const float *w, int32_t Hv, int32_t dv, float eps, int32_t T,
                                 cudaStream_t s, bool pdl)
{
    if (gn_warp_applies(o, ldo, z, ldz, w, dv))
        return launch_k(pdl, gated_rmsnorm_warp_kernel<float>, dim3((unsigned)(((int64_t)Hv * T + GN_WARPS - 1) / GN_WARPS)),
                        dim3(32 * GN_WARPS), 0, s, o, (float *)NULL, ldo, (const float *)o, ldo, z, ldz, w,
                        Hv, dv, eps, T);
    int threads = dv >= 1024 ? 1024 : ((dv + 31) / 32) * 32;
    return launch_k(pdl, gated_rmsnorm_kernel<float>, dim3(Hv, T), dim3(threads), 0, s, o,
                    (float *)NULL, ldo, (const float *)o, ldo, z, ldz, w, dv, eps);
}

cudaError_t launch_gated_rmsnorm_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *o,
                                      int32_t ldo, const float *z, int32_t ldz, const float *w,
                                      int32_t Hv, int32_t dv, float eps, int32_t T, cudaStream_t s)
{
    if (gn_warp_applies(o, ldo, z, ldz, w, dv) && (uintptr_t)out % 8 == 0 && (uintptr_t)mid % 8 == 0)
        return launch_k(false, gated_rmsnorm_warp_kernel<__nv_bfloat16>,
                        dim3((unsigned)(((int64_t)Hv * T + GN_WARPS - 1) / GN_WARPS)), dim3(32 * GN_WARPS), 0, s,
                        out, mid, Hv * dv, o, ldo, z, ldz, w, Hv, dv, eps, T);
    int threads = dv >= 1024 ? 1024 : ((dv + 31) / 32) * 32;
    gated_rmsnorm_kernel<__nv_bfloat16><<<dim3(Hv, T), threads, 0, s>>>(out, mid, Hv * dv, o, ldo, z,
                                                                         ldz, w, dv, eps);
    return cudaGetLastError();
}
