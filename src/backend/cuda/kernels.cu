/*
 * kernels.cu — CUDA kernels for the plan ops other than matrix products: embed, rmsnorm, add,
 * swiglu, sigmoid gate, q/k norm + RoPE (optionally writing the KV cache), attention, the
 * Gated DeltaNet conv and core, gated rmsnorm, argmax. Each follows its reference in
 * src/backend/cpu/kernels_ref.c; the comment on each says how the work is split.
 *
 * Numerics: f32 everywhere; RoPE angles in double as the reference does (positions up to
 * 2^22 keep their precision); softmax is the online form (running max and sum per warp,
 * merged across warps), which equals the two-pass reference up to f32 rounding.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. */
__device__ float block_sum(float v, float *red /* [32] shared */)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

/* ---- embed: one block per token, threads over the row ---- */

__global__ void embed_kernel(float *out, int32_t width, const uint8_t *w, int32_t dtype,
                             int64_t row_bytes, const int32_t *ids)
{
    int t = blockIdx.x;
    const uint8_t *row = w + (int64_t)ids[t] * row_bytes;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        out[(int64_t)t * width + i] = deq_elem(row, dtype, i);
}

cudaError_t launch_embed(float *out, int32_t width, const void *w, int32_t dtype,
                         int64_t row_bytes, const int32_t *ids, int32_t T, cudaStream_t s)
{
    embed_kernel<<<T, 256, 0, s>>>(out, width, (const uint8_t *)w, dtype, row_bytes, ids);
    return cudaGetLastError();
}

/* ---- rmsnorm: one block per (token, group) ---- */

__global__ void rmsnorm_kernel(float *out, int32_t ldo, const float *in, int32_t ldi,
                               const float *w, int32_t group, float eps)
{
    __shared__ float red[32];
    int t = blockIdx.y, g = blockIdx.x;
    const float *x = in + (int64_t)t * ldi + (int64_t)g * group;
    float *y = out + (int64_t)t * ldo + (int64_t)g * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x)
        ss += x[i] * x[i];
    ss = block_sum(ss, red);
    float scale = rsqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x)
        y[i] = x[i] * scale * w[i];
}

cudaError_t launch_rmsnorm(float *out, int32_t ldo, const float *in, int32_t ldi, const float *w,
                           int32_t group, int32_t groups, float eps, int32_t T, cudaStream_t s)
{
    int threads = group >= 1024 ? 1024 : ((group + 31) / 32) * 32;
    rmsnorm_kernel<<<dim3(groups, T), threads, 0, s>>>(out, ldo, in, ldi, w, group, eps);
    return cudaGetLastError();
}

/* ---- elementwise ---- */

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void swiglu_kernel(float *g, const float *u, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = silu_f(g[i]) * u[i];
}

static int grid_for(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (int)(b > 4096 ? 4096 : (b < 1 ? 1 : b));
}

cudaError_t launch_add(float *y, const float *x, int64_t n, cudaStream_t s)
{
    add_kernel<<<grid_for(n), 256, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t launch_swiglu(float *g, const float *u, int64_t n, cudaStream_t s)
{
    swiglu_kernel<<<grid_for(n), 256, 0, s>>>(g, u, n);
    return cudaGetLastError();
}

/* one block per (head, token) */
__global__ void sigmoid_gate_kernel(float *o, int32_t ldo, const float *g, int32_t ldg,
                                    int32_t hd, int32_t q_stride)
{
    int h = blockIdx.x, t = blockIdx.y;
    float *op = o + (int64_t)t * ldo + (int64_t)h * hd;
    const float *gp = g + (int64_t)t * ldg + (int64_t)h * q_stride + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        op[d] *= sigmoid_f(gp[d]);
}

cudaError_t launch_sigmoid_gate(float *o, int32_t ldo, const float *g, int32_t ldg,
                                int32_t n_head, int32_t hd, int32_t q_stride, int32_t T,
                                cudaStream_t s)
{
    sigmoid_gate_kernel<<<dim3(n_head, T), 128, 0, s>>>(o, ldo, g, ldg, hd, q_stride);
    return cudaGetLastError();
}

/* ---- q/k norm + RoPE: one block per (head of q or k, token), hd threads ----
 * Blocks past n_head handle k heads; with a.kc set they also store k (after RoPE) and v of
 * their head into the cache row pos0+t (the attention op's cache write, fused). */

__global__ void qk_norm_rope_kernel(struct rope_args a)
{
    __shared__ float red[32];
    __shared__ float xs[1024];
    int hh = blockIdx.x, t = blockIdx.y, d = threadIdx.x, hd = a.hd;
    bool is_q = hh < a.n_head;
    int h = is_q ? hh : hh - a.n_head;
    float *x = is_q ? a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride
                    : a.k + (int64_t)t * a.ldk + (int64_t)h * hd;
    const float *w = is_q ? a.wq : a.wk;
    float v = d < hd ? x[d] : 0.0f;
    float ss = block_sum(v * v, red);
    float scale = rsqrtf(ss / (float)hd + a.eps);
    if (d < hd)
        xs[d] = v * scale * w[d];
    __syncthreads();
    int pos = *a.pos0 + t, half = a.n_rot / 2;
    float y = d < hd ? xs[d] : 0.0f;
    if (d < a.n_rot) {
        int i = d < half ? d : d - half;
        double inv_freq = pow((double)a.theta, -2.0 * (double)i / (double)a.n_rot);
        double sn, cs;
        sincos((double)pos * inv_freq, &sn, &cs);
        float c = (float)cs, s = (float)sn;
        y = d < half ? xs[d] * c - xs[d + half] * s : xs[d] * c + xs[d - half] * s;
    }
    if (d < hd) {
        x[d] = y;
        if (!is_q && a.kc) {
            int64_t off = (int64_t)pos * a.kvw + (int64_t)h * hd + d;
            a.kc[off] = y;
            a.vc[off] = a.v[(int64_t)t * a.ldv + (int64_t)h * hd + d];
        }
    }
}

cudaError_t launch_qk_norm_rope(const struct rope_args *a, cudaStream_t s)
{
    int threads = ((a->hd + 31) / 32) * 32;
    qk_norm_rope_kernel<<<dim3(a->n_head + a->n_head_kv, a->T), threads, 0, s>>>(*a);
    return cudaGetLastError();
}

__global__ void kv_write_kernel(float *kc, float *vc, const float *k, int32_t ldk, const float *v,
                                int32_t ldv, int32_t kvw, const int32_t *pos0)
{
    int t = blockIdx.x;
    int64_t row = (int64_t)(*pos0 + t) * kvw;
    for (int i = threadIdx.x; i < kvw; i += blockDim.x) {
        kc[row + i] = k[(int64_t)t * ldk + i];
        vc[row + i] = v[(int64_t)t * ldv + i];
    }
}

cudaError_t launch_kv_write(float *kc, float *vc, const float *k, int32_t ldk, const float *v,
                            int32_t ldv, int32_t kvw, const int32_t *pos0, int32_t T,
                            cudaStream_t s)
{
    kv_write_kernel<<<T, 256, 0, s>>>(kc, vc, k, ldk, v, ldv, kvw, pos0);
    return cudaGetLastError();
}

/* ---- attention: one block of ATT_WARPS warps per (query head, token) ----
 * Lane l holds dims [l*EPL, l*EPL+EPL) of q and of its running output; warp w visits positions
 * w, w+ATT_WARPS, ... <= pos0+t, ATT_U of them per step with all their K/V loads issued before
 * the first use (decode is latency-bound: one HBM round trip per step, not per position), with
 * an online softmax (running max m, sum l); the warps' partial results are merged through
 * shared memory at the end. K/V rows are read as EPL contiguous floats per lane: a warp reads
 * one whole row, coalesced. */

#define ATT_WARPS 8
#define ATT_U 4

template <int EPL>
__global__ void __launch_bounds__(32 * ATT_WARPS) attention_kernel(struct attn_args a)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * EPL];
    int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int hd = 32 * EPL, kvh = h / (a.n_head / a.n_head_kv), last = *a.pos0 + t;
    const float *qp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + lane * EPL;
    float q[EPL], acc[EPL];
    float scale = rsqrtf((float)hd);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] = qp[e] * scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const float *kbase = a.kc + (int64_t)kvh * hd + lane * EPL;
    const float *vbase = a.vc + (int64_t)kvh * hd + lane * EPL;
    for (int p0 = warp; p0 <= last; p0 += ATT_WARPS * ATT_U) {
        float kv[ATT_U][EPL], vv[ATT_U][EPL], dot[ATT_U];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            int p = p0 + u * ATT_WARPS;
            int pc = p <= last ? p : last; /* clamp: a valid row, masked below */
            const float *kp = kbase + (int64_t)pc * a.kvw, *vp = vbase + (int64_t)pc * a.kvw;
#pragma unroll
            for (int e = 0; e < EPL; e += 2) {
                float2 k2 = *(const float2 *)(kp + e), v2 = *(const float2 *)(vp + e);
                kv[u][e] = k2.x, kv[u][e + 1] = k2.y, vv[u][e] = v2.x, vv[u][e + 1] = v2.y;
            }
        }
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                d += q[e] * kv[u][e];
            dot[u] = d;
        }
#pragma unroll
        for (int u = 0; u < ATT_U; u++)
            dot[u] = warp_sum(dot[u]);
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            if (p0 + u * ATT_WARPS > last)
                break;
            float m_new = fmaxf(m, dot[u]), corr = __expf(m - m_new), pw = __expf(dot[u] - m_new);
            l = l * corr + pw;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                acc[e] = acc[e] * corr + pw * vv[u][e];
            m = m_new;
        }
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, s_m[w]);
    float L = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    float *op = a.out + (int64_t)t * a.ldo + (int64_t)h * hd;
    const float *gp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += s_acc[w][d] * f[w];
        o /= L;
        if (a.gate)
            o *= sigmoid_f(gp[d]);
        op[d] = o;
    }
}

bool attention_supports(int32_t hd) { return hd == 64 || hd == 128 || hd == 256; }

cudaError_t launch_attention(const struct attn_args *a, cudaStream_t s)
{
    dim3 grid(a->n_head, a->T);
    switch (a->hd) {
    case 64:
        attention_kernel<2><<<grid, 32 * ATT_WARPS, 0, s>>>(*a);
        break;
    case 128:
        attention_kernel<4><<<grid, 32 * ATT_WARPS, 0, s>>>(*a);
        break;
    case 256:
        attention_kernel<8><<<grid, 32 * ATT_WARPS, 0, s>>>(*a);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- Gated DeltaNet causal conv: one thread per channel, tokens in order ----
 * The thread keeps the last K-1 inputs of its channel in registers (state rows first), so the
 * in-place update of x is safe. K <= CONV_MAX_K. */

#define CONV_MAX_K 8

__global__ void gdn_conv_kernel(float *x, int32_t ldx, float *state, const float *taps,
                                int32_t C, int32_t K, int32_t T)
{
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
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; j++)
            if (j < R)
                acc += tap[j] * win[j];
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; j++)
            if (j == R)
                acc += tap[j] * in;
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
                            int32_t K, int32_t T, cudaStream_t s)
{
    if (K < 2 || K > CONV_MAX_K)
        return cudaErrorInvalidValue;
    gdn_conv_kernel<<<(C + 127) / 128, 128, 0, s>>>(x, ldx, state, taps, C, K, T);
    return cudaGetLastError();
}

/* ---- Gated DeltaNet core (recurrent form): one block per value head ----
 * Thread (c, sub) of the block, c = tid / TPC, owns column c of the head's state S [dk][dv]
 * at rows sub, sub+TPC, ... (dk/TPC <= 32 rows, in registers for the whole run). Per token:
 * warps 0 and 1 L2-normalise q and k into shared memory; each thread decays its rows, forms
 * its part of S^T k, the TPC threads of a column reduce it with shuffles, update their rows
 * with k*delta and form their part of S^T q, reduced the same way. The state is read once at
 * the start and written once at the end of the run. */

#define GDN_MAX_ROWS 32

template <int TPC>
__global__ void gdn_core_kernel(struct gdn_args a)
{
    __shared__ float qs[GDN_MAX_ROWS * 8], ks[GDN_MAX_ROWS * 8];
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
    for (int t = 0; t < a.T; t++) {
        const float *row = a.qkv + (int64_t)t * a.ldi;
        if (warp < 2) {
            const float *src = row + (int64_t)warp * a.Hk * dk + (int64_t)kh * dk;
            float ss = 0.0f;
            for (int i = lane; i < dk; i += 32)
                ss += src[i] * src[i];
            ss = warp_sum(ss);
            float r = rsqrtf(ss + 1e-6f) * (warp == 0 ? qscale : 1.0f);
            float *dst = warp == 0 ? qs : ks;
            for (int i = lane; i < dk; i += 32)
                dst[i] = src[i] * r;
        }
        __syncthreads();
        float beta = sigmoid_f(a.b[(int64_t)t * a.ldb + j]);
        float decay = expf(sa * softplus_f(a.a[(int64_t)t * a.lda + j] + dtb));
        float v = c < dv ? row[(int64_t)2 * a.Hk * dk + (int64_t)j * dv + c] : 0.0f;
        float mpart = 0.0f;
#pragma unroll
        for (int i = 0; i < GDN_MAX_ROWS; i++)
            if (i < nr) {
                s[i] *= decay;
                mpart += s[i] * ks[sub + TPC * i];
            }
#pragma unroll
        for (int o = 1; o < TPC; o <<= 1)
            mpart += __shfl_xor_sync(0xffffffffu, mpart, o);
        float delta = beta * (v - mpart), opart = 0.0f;
#pragma unroll
        for (int i = 0; i < GDN_MAX_ROWS; i++)
            if (i < nr) {
                s[i] += ks[sub + TPC * i] * delta;
                opart += s[i] * qs[sub + TPC * i];
            }
#pragma unroll
        for (int o = 1; o < TPC; o <<= 1)
            opart += __shfl_xor_sync(0xffffffffu, opart, o);
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
    int tpc = gdn_tpc(a->dk);
    int threads = ((a->dv * tpc + 63) / 64) * 64; /* >= 2 warps for the q/k norms */
    switch (tpc) {
    case 1:
        gdn_core_kernel<1><<<a->Hv, threads, 0, s>>>(*a);
        break;
    case 2:
        gdn_core_kernel<2><<<a->Hv, threads, 0, s>>>(*a);
        break;
    case 4:
        gdn_core_kernel<4><<<a->Hv, threads, 0, s>>>(*a);
        break;
    default:
        gdn_core_kernel<8><<<a->Hv, threads, 0, s>>>(*a);
        break;
    }
    return cudaGetLastError();
}

/* ---- gated rmsnorm: one block per (value head, token) ---- */

__global__ void gated_rmsnorm_kernel(float *o, int32_t ldo, const float *z, int32_t ldz,
                                     const float *w, int32_t dv, float eps)
{
    __shared__ float red[32];
    int j = blockIdx.x, t = blockIdx.y;
    float *op = o + (int64_t)t * ldo + (int64_t)j * dv;
    const float *zp = z + (int64_t)t * ldz + (int64_t)j * dv;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dv; d += blockDim.x)
        ss += op[d] * op[d];
    ss = block_sum(ss, red);
    float scale = rsqrtf(ss / (float)dv + eps);
    for (int d = threadIdx.x; d < dv; d += blockDim.x)
        op[d] = op[d] * scale * w[d] * silu_f(zp[d]);
}

cudaError_t launch_gated_rmsnorm(float *o, int32_t ldo, const float *z, int32_t ldz,
                                 const float *w, int32_t Hv, int32_t dv, float eps, int32_t T,
                                 cudaStream_t s)
{
    int threads = dv >= 1024 ? 1024 : ((dv + 31) / 32) * 32;
    gated_rmsnorm_kernel<<<dim3(Hv, T), threads, 0, s>>>(o, ldo, z, ldz, w, dv, eps);
    return cudaGetLastError();
}

/* ---- argmax: one block of 1024 threads; ties go to the lowest index ---- */

__global__ void argmax_kernel(const float *x, int32_t n, int32_t *ids, int32_t *pos0,
                              int32_t *out_ids, int32_t *step)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > best || (v == best && i < bi))
            best = v, bi = i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi))
            best = ov, bi = oi;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        sv[warp] = best, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi))
                best = ov, bi = oi;
        }
        if (lane == 0) {
            if (bi == 0x7fffffff) /* all NaN: report 0 as the CPU's argmax does */
                bi = 0;
            ids[0] = bi;
            if (step) {
                out_ids[*step] = bi;
                (*step)++;
                (*pos0)++;
            }
        }
    }
}

cudaError_t launch_argmax(const float *x, int32_t n, int32_t *ids, int32_t *pos0,
                          int32_t *out_ids, int32_t *step, cudaStream_t s)
{
    argmax_kernel<<<1, 1024, 0, s>>>(x, n, ids, pos0, out_ids, step);
    return cudaGetLastError();
}
