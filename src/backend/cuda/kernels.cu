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
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gdn_step.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

/* ---- embed: one block per token, threads over the row ---- */

__global__ void embed_kernel(float *out, int32_t width, const uint8_t *w, int32_t dtype,
                             int64_t row_bytes, const int32_t *ids)
{
    griddep_launch();
    griddep_wait();
    int t = blockIdx.x;
    const uint8_t *row = w + (int64_t)ids[t] * row_bytes;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        out[(int64_t)t * width + i] = deq_elem(row, dtype, i);
}

cudaError_t launch_embed(float *out, int32_t width, const void *w, int32_t dtype,
                         int64_t row_bytes, const int32_t *ids, int32_t T, cudaStream_t s, bool pdl)
{
    return launch_k(pdl, embed_kernel, dim3(T), dim3(256), 0, s, out, width, (const uint8_t *)w,
                    dtype, row_bytes, ids);
}

/* ---- rmsnorm: one block per (token, group) ---- */

/* f32 out, or bf16 rounded to nearest as round_bf16_kernel would round the f32 value (the
 * fast prefill's product input written directly: one pass instead of two), with the
 * remainder's bf16 in mid when it is not NULL (two terms, as split_bf16_kernel makes them). */
__device__ __forceinline__ void put_out(float *p, float *, float v) { *p = v; }
__device__ __forceinline__ void put_out(__nv_bfloat16 *p, __nv_bfloat16 *mid, float v)
{
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    *p = h;
    if (mid)
        *mid = __float2bfloat16_rn(v - __bfloat162float(h));
}

/* Four consecutive outputs (16-byte aligned in f32, 8-byte in bf16) in one store per array:
 * a warp then writes whole contiguous lines instead of 2-byte pieces 8 bytes apart. */
__device__ __forceinline__ void put_out4(float *p, float *, const float *v)
{
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void put_out4(__nv_bfloat16 *p, __nv_bfloat16 *mid, const float *v)
{
    __align__(8) __nv_bfloat16 h[4], m[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
        put_out(&h[e], &m[e], v[e]);
    *(uint2 *)p = *(const uint2 *)h;
    if (mid)
        *(uint2 *)mid = *(const uint2 *)m;
}

template <typename OUT>
__global__ void rmsnorm_kernel(OUT *out, OUT *mid, int32_t ldo, const float *in, int32_t ldi,
                               const float *w, int32_t group, float eps)
{
    griddep_launch();
    griddep_wait();
    __shared__ float red[32];
    int t = blockIdx.y, g = blockIdx.x;
    const float *x = in + (int64_t)t * ldi + (int64_t)g * group;
    OUT *y = out + (int64_t)t * ldo + (int64_t)g * group;
    OUT *ym = mid ? mid + (int64_t)t * ldo + (int64_t)g * group : NULL;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x)
        ss += x[i] * x[i];
    ss = block_sum(ss, red);
    float scale = rsqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x)
        put_out(&y[i], ym ? &ym[i] : NULL, x[i] * scale * w[i]);
}

cudaError_t launch_rmsnorm(float *out, int32_t ldo, const float *in, int32_t ldi, const float *w,
                           int32_t group, int32_t groups, float eps, int32_t T, cudaStream_t s, bool pdl)
{
    int threads = group >= 1024 ? 1024 : ((group + 31) / 32) * 32;
    return launch_k(pdl, rmsnorm_kernel<float>, dim3(groups, T), dim3(threads), 0, s, out, (float *)NULL,
                    ldo, in, ldi, w, group, eps);
}

cudaError_t launch_rmsnorm_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *in, int32_t ldi,
                                const float *w, int32_t width, float eps, int32_t T, cudaStream_t s)
{
    int threads = width >= 1024 ? 1024 : ((width + 31) / 32) * 32;
    rmsnorm_kernel<__nv_bfloat16><<<dim3(1, T), threads, 0, s>>>(out, mid, width, in, ldi, w, width, eps);
    return cudaGetLastError();
}

/* ---- elementwise ---- */

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    griddep_launch();
    griddep_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* SwiGLU over a [T][w] view whose rows are ldg (g) and ldu (u) floats apart (g and u of a
 * merged gate|up product share one buffer: cuda_session.cu, merged products): blockIdx.y walks
 * the rows, x the columns, VEC columns per thread (4: 16-byte loads, w and the strides
 * multiples of 4). */
template <typename OUT, int VEC>
__global__ void swiglu_rows_kernel(OUT *out, OUT *mid, float *g, const float *u, int32_t w,
                                   int32_t ldg, int32_t ldu, int32_t T)
{
    griddep_launch();
    griddep_wait();
    for (int32_t t = blockIdx.y; t < T; t += gridDim.y)
        for (int32_t c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC; c < w; c += gridDim.x * blockDim.x * VEC) {
            const float *gp = g + (int64_t)t * ldg + c, *up = u + (int64_t)t * ldu + c;
            float gv[VEC], uv[VEC], y[VEC];
            if constexpr (VEC == 4) {
                float4 a = *(const float4 *)gp, b = *(const float4 *)up;
                gv[0] = a.x, gv[1] = a.y, gv[2] = a.z, gv[3] = a.w;
                uv[0] = b.x, uv[1] = b.y, uv[2] = b.z, uv[3] = b.w;
            } else {
                gv[0] = gp[0], uv[0] = up[0];
            }
#pragma unroll
            for (int e = 0; e < VEC; e++)
                y[e] = silu_f(gv[e]) * uv[e];
            if constexpr (sizeof(OUT) == 4) { /* f32: in place on g */
                if constexpr (VEC == 4)
                    put_out4(g + (int64_t)t * ldg + c, NULL, y);
                else
                    g[(int64_t)t * ldg + c] = y[0];
            } else { /* bf16 terms: out (and mid) [T][w] */
                int64_t i = (int64_t)t * w + c;
                if constexpr (VEC == 4)
                    put_out4(out + i, mid ? mid + i : NULL, y);
                else
                    put_out(out + i, mid ? mid + i : NULL, y[0]);
            }
        }
}

template <typename OUT>
static cudaError_t launch_swiglu_rows(OUT *out, OUT *mid, float *g, const float *u, int32_t w,
                                      int32_t ldg, int32_t ldu, int32_t T, cudaStream_t s, bool pdl)
{
    bool vec = w % 4 == 0 && ldg % 4 == 0 && ldu % 4 == 0 && (uintptr_t)g % 16 == 0 && (uintptr_t)u % 16 == 0 &&
               (uintptr_t)out % 8 == 0 && (uintptr_t)mid % 8 == 0;
    int per = vec ? 4 : 1;
    int64_t bx = ((int64_t)w / per + 255) / 256;
    dim3 grid((unsigned)(bx < 1 ? 1 : bx > 64 ? 64 : bx), (unsigned)(T < 65535 ? (T < 1 ? 1 : T) : 65535));
    if (vec)
        return launch_k(pdl, swiglu_rows_kernel<OUT, 4>, grid, dim3(256), 0, s, out, mid, g, u, w, ldg, ldu, T);
    return launch_k(pdl, swiglu_rows_kernel<OUT, 1>, grid, dim3(256), 0, s, out, mid, g, u, w, ldg, ldu, T);
}

static int grid_for(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (int)(b > 4096 ? 4096 : (b < 1 ? 1 : b));
}

cudaError_t launch_add(float *y, const float *x, int64_t n, cudaStream_t s, bool pdl)
{
    return launch_k(pdl, add_kernel, dim3(grid_for(n)), dim3(256), 0, s, y, x, n);
}

cudaError_t launch_swiglu(float *g, int32_t ldg, const float *u, int32_t ldu, int32_t w, int32_t T,
                          cudaStream_t s, bool pdl)
{
    return launch_swiglu_rows<float>(NULL, NULL, g, u, w, ldg, ldu, T, s, pdl);
}

cudaError_t launch_swiglu_bf16(__nv_bfloat16 *out, __nv_bfloat16 *mid, const float *g, int32_t ldg,
                               const float *u, int32_t ldu, int32_t w, int32_t T, cudaStream_t s)
{
    return launch_swiglu_rows<__nv_bfloat16>(out, mid, (float *)g, u, w, ldg, ldu, T, s, false);
}

/* one block per (head, token) */
__global__ void sigmoid_gate_kernel(float *o, int32_t ldo, const float *g, int32_t ldg,
                                    int32_t hd, int32_t q_stride)
{
    griddep_launch();
    griddep_wait();
    int h = blockIdx.x, t = blockIdx.y;
    float *op = o + (int64_t)t * ldo + (int64_t)h * hd;
    const float *gp = g + (int64_t)t * ldg + (int64_t)h * q_stride + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        op[d] *= sigmoid_f(gp[d]);
}

cudaError_t launch_sigmoid_gate(float *o, int32_t ldo, const float *g, int32_t ldg,
                                int32_t n_head, int32_t hd, int32_t q_stride, int32_t T,
                                cudaStream_t s, bool pdl)
{
    return launch_k(pdl, sigmoid_gate_kernel, dim3(n_head, T), dim3(128), 0, s, o, ldo, g, ldg, hd,
                    q_stride);
}

/* ---- q/k norm + RoPE: one warp per (head of q or k, token), up to ROPE_HPB per block ----
 * Each block first makes its token's rotation table (cos, sin of pos * theta^(-2i/n_rot) for
 * i < n_rot/2: the frequencies in double as the reference (a.inv_freq, made once per session),
 * the angle reduced in double, sine and cosine in float) once for all its heads: the
 * per-element double pow + sincos of the first version cost ~30 us per layer at T = 512.
 * Warp heads past n_head are k heads; with a.kc set they also store k (after RoPE) and v of
 * their head into the cache row pos0+t (the attention op's cache write, fused). A head's
 * normalised values pass through shared memory, where the rotation finds each element's
 * partner d +- n_rot/2. */

#define ROPE_HPB 4 /* heads (warps) per block at most: prompts; decode uses one per block
                    * (more blocks in flight: 4 per block cost ~1 us per layer there) */

template <typename KV>
__global__ void __launch_bounds__(32 * ROPE_HPB) qk_norm_rope_kernel(const __grid_constant__ struct rope_args a)
{
    griddep_launch();
    griddep_wait();
    __shared__ float cs[128], sn[128];
    __shared__ float xw[ROPE_HPB][256];
    int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = a.hd;
    int pos = *a.pos0 + t, half = a.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq = a.inv_freq ? a.inv_freq[i]
                                     : pow((double)a.theta, -2.0 * (double)i / (double)a.n_rot);
        /* the angle reduced to [-pi, pi] in double, then a float sine and cosine (within an
         * ulp of the double ones rounded to float, at a fraction of their cost) */
        double ang = (double)pos * inv_freq;
        ang -= rint(ang * 0.15915494309189535) * 6.283185307179586;
        sincosf((float)ang, &sn[i], &cs[i]);
    }
    __syncthreads();
    int hh = blockIdx.x * (blockDim.x >> 5) + warp;
    if (hh >= a.n_head + a.n_head_kv)
        return;
    bool is_q = hh < a.n_head;
    int h = is_q ? hh : hh - a.n_head;
    float *x = is_q ? a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride
                    : a.k + (int64_t)t * a.ldk + (int64_t)h * hd;
    const float *w = is_q ? a.wq : a.wk;
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) {
        float v = x[d];
        xw[warp][d] = v;
        ss += v * v;
    }
    float scale = rsqrtf(warp_sum(ss) / (float)hd + a.eps);
    for (int d = lane; d < hd; d += 32)
        xw[warp][d] *= scale * w[d];
    __syncwarp();
    for (int d = lane; d < hd; d += 32) {
        const float *xs = xw[warp];
        float y = xs[d];
        if (d < a.n_rot) {
            int i = d < half ? d : d - half;
            float c = cs[i], s = sn[i];
            y = d < half ? xs[d] * c - xs[d + half] * s : xs[d] * c + xs[d - half] * s;
        }
        x[d] = y;
        if (!is_q && a.kc) {
            int64_t off = (int64_t)pos * a.kvw + (int64_t)h * hd + d;
            kv_put((KV *)a.kc + off, y);
            kv_put((KV *)a.vc + off, a.v[(int64_t)t * a.ldv + (int64_t)h * hd + d]);
        }
    }
}

cudaError_t launch_qk_norm_rope(const struct rope_args *a, cudaStream_t s)
{
    if (a->hd > 256 || a->n_rot > 256 || a->n_rot > a->hd)
        return cudaErrorInvalidValue;
    int heads = a->n_head + a->n_head_kv, hpb = a->T >= 16 ? ROPE_HPB : 1;
    return launch_k(a->pdl, a->kv_f16 ? qk_norm_rope_kernel<__half> : qk_norm_rope_kernel<float>,
                    dim3((heads + hpb - 1) / hpb, a->T), dim3(32 * hpb), 0, s, *a);
}

template <typename KV>
__global__ void kv_write_kernel(KV *kc, KV *vc, const float *k, int32_t ldk, const float *v,
                                int32_t ldv, int32_t kvw, const int32_t *pos0)
{
    griddep_launch();
    griddep_wait();
    int t = blockIdx.x;
    int64_t row = (int64_t)(*pos0 + t) * kvw;
    for (int i = threadIdx.x; i < kvw; i += blockDim.x) {
        kv_put(kc + row + i, k[(int64_t)t * ldk + i]);
        kv_put(vc + row + i, v[(int64_t)t * ldv + i]);
    }
}

cudaError_t launch_kv_write(void *kc, void *vc, bool kv_f16, const float *k, int32_t ldk, const float *v,
                            int32_t ldv, int32_t kvw, const int32_t *pos0, int32_t T,
                            cudaStream_t s, bool pdl)
{
    if (kv_f16)
        return launch_k(pdl, kv_write_kernel<__half>, dim3(T), dim3(256), 0, s, (__half *)kc, (__half *)vc, k, ldk,
                        v, ldv, kvw, pos0);
    return launch_k(pdl, kv_write_kernel<float>, dim3(T), dim3(256), 0, s, (float *)kc, (float *)vc, k, ldk, v,
                    ldv, kvw, pos0);
}

/* ---- attention: one block of ATT_WARPS warps per (query head, token, split) ----
 * Lane l holds dims [l*EPL, l*EPL+EPL) of q and of its running output; warp w visits positions
 * lo+w, lo+w+ATT_WARPS, ... <= hi, ATT_U of them per step with all their K/V loads issued
 * before the first use (decode is latency-bound: one HBM round trip per step, not per
 * position; with attn_pipe, the default, two steps in flight: attention_pipe_rounds), with an
 * online softmax (running max m, sum l); the warps' partial results are
 * merged through shared memory at the end. K/V rows are read as EPL contiguous floats per
 * lane: a warp reads one whole row, coalesced.
 * Split-K (flash decoding, gridDim.z = S > 1; T = 1): the positions 0..pos are cut into S
 * equal ranges, one block each, so that a long context occupies S x n_head blocks instead of
 * n_head (16 blocks walking 512 positions took ~60 us per layer). Each block writes its
 * (max, sum, unnormalised output) to a.part; the last block of a head to finish (a counter per
 * head, reset by that block for the next replay) merges the S partials and writes the output.
 * The range is computed on the device from *pos0, so one captured graph serves every
 * position. */


/* The CL merge: this block's partial result (max M, sum L, the warps' outputs s_acc rescaled
 * by f) into its shared memory; after a cluster barrier block z writes dimensions
 * [z hd / n, (z+1) hd / n) of the output, merged over the n blocks in rank order (an empty
 * split: M = -inf, weight 0); a second barrier keeps each block's partial alive until its
 * peers have read it. */
template <int EPL>
__device__ __forceinline__ void attention_cluster_merge(const struct attn_args &a, const float (*s_acc)[32 * EPL],
                                        const float *f, float M, float L, float *op, const float *gp)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int hd = 32 * EPL;
    __shared__ float c_part[hd], c_ml[2], c_f[ATT_CL_SPLITS], c_inv;
    cg::cluster_group cl = cg::this_cluster();
    const int n = (int)cl.num_blocks(), z = (int)cl.block_rank(), lane = threadIdx.x & 31;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += s_acc[w][d] * f[w];
        c_part[d] = o;
    }
    if (threadIdx.x == 0)
        c_ml[0] = M, c_ml[1] = L;
    cl.sync();
    if (threadIdx.x < 32) {
        float mj = lane < n ? *cl.map_shared_rank(&c_ml[0], lane) : -INFINITY;
        float lj = lane < n ? *cl.map_shared_rank(&c_ml[1], lane) : 0.0f;
        float Mx = mj;
        for (int o = 16; o > 0; o >>= 1)
            Mx = fmaxf(Mx, __shfl_xor_sync(0xffffffffu, Mx, o));
        float fj = mj == -INFINITY ? 0.0f : __expf(mj - Mx);
        float Lx = warp_sum(lj * fj);
        if (lane < ATT_CL_SPLITS)
            c_f[lane] = fj;
        if (lane == 0)
            c_inv = 1.0f / Lx;
    }
    __syncthreads();
    const int per = hd / n;
    if ((int)threadIdx.x < per) {
        int d = z * per + threadIdx.x;
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_CL_SPLITS; j++)
            if (j < n)
                o += *cl.map_shared_rank(&c_part[d], j) * c_f[j];
        o *= c_inv;
        if (a.gate)
            o *= sigmoid_f(gp[d]);
        op[d] = o;
    }
    cl.sync();
#endif
}

/* PIPE's loop over a warp's rounds from p0: r0 and r1 hold the first two rounds' cached rows
 * (requested before the wait; the current position's row is taken from shared memory here),
 * and each buffer is refilled with the round two ahead right after its use, so a round's loads
 * are in flight during the other buffer's arithmetic. The same rounds in the same order as the
 * one-round loop (attn_pipe -1): the same sums, bit for bit (test_graph_attn_pipe). */
template <int EPL, bool ROPE, typename KV, int U>
__device__ __forceinline__ void attention_pipe_rounds(const KV *kbase, const KV *vbase, int64_t kvw, int p0, int last,
                                                      int pos, const KV *cur_k, const KV *cur_v, const float (&q)[EPL],
                                                      att_rows<KV, U, EPL> &r0, att_rows<KV, U, EPL> &r1, float &m,
                                                      float &l, float (&acc)[EPL])
{
    constexpr int STEP = ATT_WARPS * U;
    attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r0);
    attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + STEP, last, pos, cur_k, cur_v, ATT_ROWS_CURRENT, r1);
    for (; p0 <= last; p0 += 2 * STEP) {
        attention_round<EPL, KV, U>(r0, q, p0, last, m, l, acc);
        if (p0 + 2 * STEP <= last)
            attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + 2 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r0);
        if (p0 + STEP > last)
            break;
        attention_round<EPL, KV, U>(r1, q, p0 + STEP, last, m, l, acc);
        if (p0 + 3 * STEP <= last)
            attention_load_round<EPL, ROPE>(kbase, vbase, kvw, p0 + 3 * STEP, last, pos, cur_k, cur_v, ATT_ROWS_ALL, r1);
    }
}

/* TL: the decode timeline's variant (a.stamps written; cuda_session_timeline). A separate
 * instantiation, so that the kernel the decode runs is the one without them: compiled into
 * it, the stamps changed its register allocation (90 -> 80) and Qwen3-0.6B BF16 measured
 * 3.7% slower (docs/perf-log.md, session 20). */
/* CL (cuda_options.attn_cluster, T = 1, sm_90): the splits of a head are one cluster of
 * ATT_CL_SPLITS blocks (grid: splits along x, heads along y) and merge through distributed
 * shared memory after a cluster barrier, each block its share of the dimensions, instead of
 * the last block reading every split's partial back from global memory. Another
 * instantiation: the default kernel's code stays as measured. */
/* PIPE (cuda_options.attn_pipe, T = 1, ROPE): two rounds of cached rows requested before the
 * wait instead of one, and in the loop each round's registers refilled with the round after
 * next as soon as they are used (attention_pipe_rounds): a warp's second round no longer waits
 * for a round trip after the first one's arithmetic. Another instantiation; the default since
 * session 27 (Qwen3-0.6B BF16 tg128 +3.0%, docs/perf-log.md). */
/* RREG (cuda_options.attn_rope_regs, ROPE): the q/k norm + RoPE in each warp's registers
 * (attention_rope_regs_row): no shared-memory copies of q, k, v and no block barrier between
 * the wait and the rounds. Another instantiation. */
/* MS (attn_args.n_seq, ROPE, not CL or RREG): one launch for several sessions, blockIdx.y
 * (t) the session: its rows, cache and position (attention_seq_of), its splits' partials and
 * counter at head t n_head + h. Another instantiation. */
template <int EPL, bool ROPE, typename KV, bool TL = false, bool CL = false, bool PIPE = false, bool RREG = false,
          bool MS = false>
__global__ void __launch_bounds__(32 * ATT_WARPS) attention_kernel(const __grid_constant__ struct attn_args a)
{
    static_assert(!MS || (ROPE && !CL && !RREG), "the multi-session form: RoPE inside, splits merged by the last");
    if (TL)
        tl_stamp(a.stamps, 0);
    griddep_launch();
    l2_prefetch_share(a.pf); /* a later step's weights (weights only: before any wait) */
    if (!a.early) /* a.early: the position and the cached rows are read before the wait (below) */
        griddep_wait();
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * EPL];
    __shared__ __align__(16) float r_q[ROPE ? 32 * EPL : 4], r_k[ROPE ? 32 * EPL : 4], r_v[ROPE ? 32 * EPL : 4];
    __shared__ float r_cs[ROPE ? 16 * EPL : 1], r_sn[ROPE ? 16 * EPL : 1];
    /* the current row in the cache's type (an f16 cache: rounded copies; f32: r_k, r_v) */
    __shared__ __align__(16) KV r_k16[ROPE && sizeof(KV) == 2 ? 32 * EPL : 8], r_v16[ROPE && sizeof(KV) == 2 ? 32 * EPL : 8];
    /* RREG: each warp's own copy of the current row (only the warp whose rounds hold it fills it) */
    __shared__ __align__(16) KV s_cur[RREG ? 2 * ATT_WARPS : 1][RREG ? 32 * EPL : 8];
    const KV *cur_k = RREG ? s_cur[RREG ? 2 * (threadIdx.x >> 5) : 0] : sizeof(KV) == 2 ? r_k16 : (const KV *)r_k;
    const KV *cur_v = RREG ? s_cur[RREG ? 2 * (threadIdx.x >> 5) + 1 : 0] : sizeof(KV) == 2 ? r_v16 : (const KV *)r_v;
    int h = CL ? blockIdx.y : blockIdx.x, t = CL ? 0 : blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int z = CL ? blockIdx.x : blockIdx.z, nz = CL ? gridDim.x : gridDim.z;
    const struct att_seq_view sv = attention_seq_of<MS>(a, t);
    int hd = 32 * EPL, kvh = h / (a.n_head / a.n_head_kv), pos = MS ? *sv.pos : *a.pos0 + t, last = pos;
    const int ph = MS ? t * a.n_head + h : h; /* the head's partials and counter */
    int S = min(attention_splits(a, last, a.nominal_splits > 0 ? a.nominal_splits : nz), nz);
    if (CL && S > 1)
        S = nz; /* every block of the cluster meets at its barrier (a split may be empty) */
    if (z >= S)
        return; /* a short context: this split has no positions and takes no part */
    int lo;
    attention_split_range(S, z, &lo, &last); /* this split's positions lo..last */
    const KV *kbase = (const KV *)sv.kc + (int64_t)kvh * hd + lane * EPL;
    const KV *vbase = (const KV *)sv.vc + (int64_t)kvh * hd + lane * EPL;
    /* the first round's cached rows load before the prologue: their addresses do not depend
     * on it, so their L2 round trip overlaps the prologue's */
    constexpr int U = att_u<KV>();
    att_rows<KV, U, EPL> rw;
    attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, ATT_ROWS_CACHED, rw);
    att_rows<KV, PIPE ? U : 1, EPL> rw2; /* PIPE: the second round */
    if constexpr (PIPE)
        attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, lo + warp + ATT_WARPS * U, last, pos, cur_k, cur_v,
                                        ATT_ROWS_CACHED, rw2);
    att_rope_regs<EPL> rt; /* RREG: the angles and norm weights, before the wait */
    if constexpr (RREG)
        attention_rope_regs_before<EPL>(a, pos, r_cs, r_sn, rt);
    if (a.early) /* q, k and v of this token come from the launch before */
        griddep_wait();
    if (TL)
        tl_stamp(a.stamps, 1);
    float q[EPL], acc[EPL];
    if constexpr (RREG) {
        attention_rope_regs_row<EPL>(a, a.q + (int64_t)h * a.q_stride, true, rt.wq, rt, q);
        if (last == pos && warp == (pos - lo) % ATT_WARPS) { /* this warp's rounds hold pos */
            float kr[EPL], vr[EPL];
            attention_rope_regs_row<EPL>(a, a.rk + (int64_t)kvh * hd, true, rt.wk, rt, kr);
            attention_rope_regs_row<EPL>(a, a.rv + (int64_t)kvh * hd, false, rt.wk, rt, vr);
            const bool writes = h % (a.n_head / a.n_head_kv) == 0; /* the session's cache */
            const int64_t off = (int64_t)pos * a.kvw + (int64_t)kvh * hd + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                kv_put(&s_cur[2 * warp][lane * EPL + e], kr[e]);
                kv_put(&s_cur[2 * warp + 1][lane * EPL + e], vr[e]);
                if (writes) {
                    kv_put((KV *)a.kc + off + e, kr[e]);
                    kv_put((KV *)a.vc + off + e, vr[e]);
                }
            }
            __syncwarp();
        }
    } else {
        if (ROPE)
            attention_rope_prologue<EPL, KV, 1, MS>(a, h, kvh, pos, last == pos, r_q, r_k, r_v, r_k16, r_v16, r_cs,
                                                    r_sn, nullptr, t);
        const float *qp = ROPE ? r_q + lane * EPL : a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            q[e] = qp[e];
    }
    if (TL) /* the time line's third stamp: q, k and v normalised, rotated and cached */
        tl_stamp(a.stamps, 2);
    float scale = rsqrtf((float)hd);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] *= scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    if constexpr (PIPE)
        attention_pipe_rounds<EPL, ROPE, KV, U>(kbase, vbase, a.kvw, lo + warp, last, pos, cur_k, cur_v, q, rw, rw2,
                                                m, l, acc);
    for (int p0 = lo + warp; !PIPE && p0 <= last; p0 += ATT_WARPS * U) {
        attention_load_round<EPL, ROPE>(kbase, vbase, a.kvw, p0, last, pos, cur_k, cur_v,
                                        p0 == lo + warp ? ATT_ROWS_CURRENT : ATT_ROWS_ALL, rw);
        attention_round<EPL, KV, U>(rw, q, p0, last, m, l, acc);
    }
    /* the output gate of this thread's first dimension (Qwen3.5), requested before the
     * warps' merge rather than after it */
    const float *gp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + hd;
    float g0 = a.gate && (int)threadIdx.x < hd ? gp[threadIdx.x] : 0.0f;
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++)
        s_acc[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    float M, L, f[ATT_WARPS];
    attention_split_weights(s_m, s_l, M, L, f);
    float *op = a.out + (int64_t)t * a.ldo + (int64_t)h * hd;
    if (CL && S > 1) {
        attention_cluster_merge<EPL>(a, s_acc, f, M, L, op, gp);
        if (TL)
            tl_stamp(a.stamps, 3);
        return;
    }
    if (S > 1) { /* this split's partial result, then the last block of the head merges */
        float *part = a.part + ((int64_t)ph * gridDim.z + blockIdx.z) * (hd + 2);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++)
                o += s_acc[w][d] * f[w];
            part[2 + d] = o;
        }
        if (threadIdx.x == 0)
            part[0] = M, part[1] = L;
        if (!attention_split_arrive(a, ph, S)) {
            if (TL)
                tl_stamp(a.stamps, 3);
            return;
        }
        __threadfence();
        attention_merge<EPL>(a, a.part + (int64_t)ph * gridDim.z * (hd + 2), hd + 2, S, op, gp);
        if (TL)
            tl_stamp(a.stamps, 3);
        return;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += s_acc[w][d] * f[w];
        o /= L;
        if (a.gate)
            o *= sigmoid_f(d == (int)threadIdx.x ? g0 : gp[d]);
        op[d] = o;
    }
    if (TL)
        tl_stamp(a.stamps, 3);
}

/* ---- attention for prefill (T > 1): one block of ATT_TW warps per (query head, tile of
 * ATT_TW * ATT_QPW tokens) ----
 * K and V rows are staged ATT_BK at a time in shared memory and shared by the block's queries
 * (the per-token kernel above re-reads every row from L2 for every query: ~2 GB per layer at
 * T = 512). Warp w owns ATT_QPW queries; lane l holds dims [l*EPL, l*EPL+EPL) of each query and
 * of its output. For each staged row j the warp reduces the dot product and lane j keeps the
 * score, so the online-softmax update (max, exps, sum) runs once per ATT_BK rows with the
 * exps spread across lanes; then the rows' V are accumulated with the probabilities
 * broadcast by shuffles. Same softmax as the reference up to f32 rounding. */

#define ATT_TW 4
#define ATT_QPW 4
#define ATT_BK 32

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int EPL, typename KV>
__global__ void __launch_bounds__(32 * ATT_TW)
    attention_tiled_kernel(const __grid_constant__ struct attn_args a)
{
    extern __shared__ float4 att_sm4[];
    griddep_launch();
    griddep_wait();
    constexpr int HD = 32 * EPL;
    float *ks = (float *)att_sm4, *vs = ks + ATT_BK * HD;
    int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (a.n_head / a.n_head_kv), pos0 = *a.pos0;
    int t0 = blockIdx.y * (ATT_TW * ATT_QPW), tw = t0 + warp * ATT_QPW;
    float scale = rsqrtf((float)HD);
    float q[ATT_QPW][EPL], acc[ATT_QPW][EPL], m[ATT_QPW], l[ATT_QPW];
#pragma unroll
    for (int qi = 0; qi < ATT_QPW; qi++) {
        int t = min(tw + qi, a.T - 1);
        const float *qp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            q[qi][e] = qp[e] * scale;
            acc[qi][e] = 0.0f;
        }
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
    }
    int last_block = pos0 + min(t0 + ATT_TW * ATT_QPW, a.T) - 1;
    int last_warp = pos0 + min(tw + ATT_QPW, a.T) - 1;
    for (int kt = 0; kt <= last_block; kt += ATT_BK) {
        int nrow = min(ATT_BK, last_block - kt + 1);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = threadIdx.x; i < nrow * (HD / 4); i += blockDim.x) {
            int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
            int64_t off = (int64_t)(kt + r) * a.kvw + (int64_t)kvh * HD + c;
            float4 k4, v4;
            kv_get<4>((const KV *)a.kc + off, &k4.x);
            kv_get<4>((const KV *)a.vc + off, &v4.x);
            *(float4 *)(ks + r * HD + c) = k4;
            *(float4 *)(vs + r * HD + c) = v4;
        }
        __syncthreads();
        if (kt > last_warp || tw >= a.T)
            continue;
        float sc[ATT_QPW];
#pragma unroll
        for (int qi = 0; qi < ATT_QPW; qi++)
            sc[qi] = -INFINITY;
#pragma unroll 2
        for (int j = 0; j < nrow; j++) {
            float kr[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e += 4) {
                float4 k4 = *(const float4 *)(ks + j * HD + lane * EPL + e);
                kr[e] = k4.x, kr[e + 1] = k4.y, kr[e + 2] = k4.z, kr[e + 3] = k4.w;
            }
#pragma unroll
            for (int qi = 0; qi < ATT_QPW; qi++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    d += q[qi][e] * kr[e];
                d = warp_sum(d);
                if (lane == j)
                    sc[qi] = d;
            }
        }
#pragma unroll
        for (int qi = 0; qi < ATT_QPW; qi++) {
            int qp = pos0 + tw + qi;
            float sv = (lane < nrow && kt + lane <= qp) ? sc[qi] : -INFINITY;
            float m_new = fmaxf(m[qi], warp_max(sv));
            float pw = sv == -INFINITY ? 0.0f : __expf(sv - m_new);
            float corr = m[qi] == -INFINITY ? 0.0f : __expf(m[qi] - m_new);
            l[qi] = l[qi] * corr + warp_sum(pw);
#pragma unroll
            for (int e = 0; e < EPL; e++)
                acc[qi][e] *= corr;
            m[qi] = m_new;
            sc[qi] = pw;
        }
#pragma unroll 2
        for (int j = 0; j < nrow; j++) {
            float vr[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e += 4) {
                float4 v4 = *(const float4 *)(vs + j * HD + lane * EPL + e);
                vr[e] = v4.x, vr[e + 1] = v4.y, vr[e + 2] = v4.z, vr[e + 3] = v4.w;
            }
#pragma unroll
            for (int qi = 0; qi < ATT_QPW; qi++) {
                float pj = __shfl_sync(0xffffffffu, sc[qi], j);
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    acc[qi][e] += pj * vr[e];
            }
        }
    }
#pragma unroll
    for (int qi = 0; qi < ATT_QPW; qi++) {
        int t = tw + qi;
        if (t >= a.T)
            break;
        float *op = a.out + (int64_t)t * a.ldo + (int64_t)h * HD + lane * EPL;
        const float *gp = a.q + (int64_t)t * a.ldq + (int64_t)h * a.q_stride + HD + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            float o = acc[qi][e] / l[qi];
            if (a.gate)
                o *= sigmoid_f(gp[e]);
            op[e] = o;
        }
    }
}

template <typename KV>
static cudaError_t launch_attention_tiled(const struct attn_args *a, cudaStream_t s)
{
    dim3 grid(a->n_head, (a->T + ATT_TW * ATT_QPW - 1) / (ATT_TW * ATT_QPW)), block(32 * ATT_TW);
    size_t smem = (size_t)2 * ATT_BK * a->hd * sizeof(float);
    cudaError_t e;
    switch (a->hd) {
    case 64:
        return launch_k(a->pdl, attention_tiled_kernel<2, KV>, grid, block, smem, s, *a);
    case 128:
        return launch_k(a->pdl, attention_tiled_kernel<4, KV>, grid, block, smem, s, *a);
    case 256:
        e = cudaFuncSetAttribute(attention_tiled_kernel<8, KV>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
        return launch_k(a->pdl, attention_tiled_kernel<8, KV>, grid, block, smem, s, *a);
    default:
        return cudaErrorInvalidValue;
    }
}

bool attention_supports(int32_t hd) { return hd == 64 || hd == 128 || hd == 256; }

/* The decode graph's attention (RoPE inside): the stamped instantiation for the timeline, the
 * cluster merge, the pipelined rounds (a->pipe). */
template <int EPL, typename KV, bool PIPE>
static cudaError_t launch_attention_rope_p(const struct attn_args *a, dim3 grid, dim3 block, cudaStream_t s)
{
    if (a->n_seq)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE, false, true>, grid, block, 0, s,
                        *a);
    if (a->cluster_merge) {
        dim3 g(ATT_CL_SPLITS, a->n_head);
        if (a->stamps)
            return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, true, true, PIPE>, g, block, 0, s,
                             *a);
        if (a->rope_regs)
            return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, false, true, PIPE, true>, g, block,
                             0, s, *a);
        return launch_kc(a->pdl, ATT_CL_SPLITS, attention_kernel<EPL, true, KV, false, true, PIPE>, g, block, 0, s, *a);
    }
    if (a->stamps)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, true, false, PIPE>, grid, block, 0, s, *a);
    if (a->rope_regs)
        return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE, true>, grid, block, 0, s, *a);
    return launch_k(a->pdl, attention_kernel<EPL, true, KV, false, false, PIPE>, grid, block, 0, s, *a);
}

template <int EPL, typename KV>
static cudaError_t launch_attention_rope(const struct attn_args *a, dim3 grid, dim3 block, cudaStream_t s)
{
    return a->pipe ? launch_attention_rope_p<EPL, KV, true>(a, grid, block, s)
                   : launch_attention_rope_p<EPL, KV, false>(a, grid, block, s);
}

template <typename KV>
static cudaError_t launch_attention_kv(const struct attn_args *a, cudaStream_t s)
{
    if (a->T > 1 && a->tiled)
        return launch_attention_tiled<KV>(a, s);
    int splits = a->T == 1 && a->splits > 1 && a->part && a->count ? a->splits : 1;
    dim3 grid(a->n_head, a->n_seq ? a->n_seq : a->T, splits), block(32 * ATT_WARPS);
    if (a->n_seq && (!a->rope || a->cluster_merge || a->rope_regs || a->n_seq > ATT_MAX_SEQ))
        return cudaErrorInvalidValue; /* the multi-session form has none of these */
    if (a->rope) {
        if (a->T != 1 || a->n_rot > a->hd)
            return cudaErrorInvalidValue;
        switch (a->hd) {
        case 64: return launch_attention_rope<2, KV>(a, grid, block, s);
        case 128: return launch_attention_rope<4, KV>(a, grid, block, s);
        case 256: return launch_attention_rope<8, KV>(a, grid, block, s);
        default: return cudaErrorInvalidValue;
        }
    }
    switch (a->hd) {
    case 64: return launch_k(a->pdl, attention_kernel<2, false, KV>, grid, block, 0, s, *a);
    case 128: return launch_k(a->pdl, attention_kernel<4, false, KV>, grid, block, 0, s, *a);
    case 256: return launch_k(a->pdl, attention_kernel<8, false, KV>, grid, block, 0, s, *a);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_attention(const struct attn_args *a, cudaStream_t s)
{
    if (a->n_seq && a->group_blocks > 0 && attention_group_applies(a))
        return launch_attention_group(a, s); /* several sessions, runs of splits a block */
    if (a->n_seq) /* several sessions: attention_kernel's multi-session form */
        return a->kv_f16 ? launch_attention_kv<__half>(a, s) : launch_attention_kv<float>(a, s);
    if (a->stages && attention_staged_applies(a))
        return launch_attention_staged(a, s);
    if (a->lanes && attention_lanes_applies(a))
        return launch_attention_lanes(a, s);
    if (a->shared_kv && attention_shared_kv_applies(a))
        return launch_attention_shared_kv(a, s);
    return a->kv_f16 ? launch_attention_kv<__half>(a, s) : launch_attention_kv<float>(a, s);
}

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

/* ---- argmax: one block of 1024 threads; the largest value that is not NaN, ties to the
 * lowest index (0 when every value is NaN) ----
 * Each thread walks float4s i, i + 1024, ... with AM_U loads in flight per pass. The rolled
 * loop it replaces (one float per trip) waited one L2 round trip per trip: ~30 us of a
 * Qwen3.5-0.8B greedy step for its 248,320 logits, the difference between cuda_bench's tg and
 * the per-token API's greedy (which selects with topk.cu) (docs/perf-log.md, session 14).
 * The order of the visits does not change the result: (value, -index) is a total order. */
#ifndef AM_U
#define AM_U 8 /* float4 loads per thread per pass (1024 threads: at most 64 registers each) */
#endif

__device__ __forceinline__ void argmax_take(float v, int i, float &best, int &bi)
{
    if (v > best || (v == best && i < bi))
        best = v, bi = i;
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float *x, int32_t n, int32_t *ids, int32_t *pos0,
                                                      int32_t *out_ids, int32_t *step)
{
    griddep_launch();
    griddep_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    float best = -INFINITY;
    int bi = 0x7fffffff;
    const int nt = blockDim.x, n4 = (uintptr_t)x % 16 == 0 ? n / 4 : 0;
    const float4 *x4 = (const float4 *)x;
    for (int i0 = threadIdx.x; i0 < n4; i0 += AM_U * nt) {
        float4 v[AM_U];
#pragma unroll
        for (int u = 0; u < AM_U; u++)
            v[u] = i0 + u * nt < n4 ? x4[i0 + u * nt] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < AM_U; u++) {
            int i = 4 * (i0 + u * nt);
            if (i0 + u * nt >= n4)
                break;
            argmax_take(v[u].x, i, best, bi), argmax_take(v[u].y, i + 1, best, bi);
            argmax_take(v[u].z, i + 2, best, bi), argmax_take(v[u].w, i + 3, best, bi);
        }
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += nt) /* the tail (all of x when unaligned) */
        argmax_take(x[i], i, best, bi);
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

/* ---- argmax over a grid: each of sc.blocks blocks takes a slice of the float4s, ----
 * AM_GU loads in flight per thread per pass (one pass for both vocabularies at 128 blocks),
 * writes its (value, index) to sc.part; the last block to arrive (sc.count, reset by it for
 * the next launch) takes the best of the parts and finishes as argmax_kernel does. The
 * single block above reads 0.6-1 MB through one multiprocessor: 11.5 us alone for
 * Qwen3-0.6B's 151,936 logits (ncu, perf-log session 17); the grid's chain is one pass, the
 * arrival and the parts' load. (value, -index) is a total order: the same id for any order
 * of the blocks. */
#ifndef AM_GU
#define AM_GU 4
#endif
#define AM_GRID_THREADS 256

/* The block's best (value, index) into (best, bi) of thread 0 (warp sums, then smem). */
__device__ __forceinline__ void argmax_block_reduce(float &best, int &bi)
{
    __shared__ float sv[32];
    __shared__ int si[32];
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
    }
}

__global__ void __launch_bounds__(AM_GRID_THREADS) argmax_grid_kernel(const float *x, int32_t n, int32_t *ids,
                                                                     int32_t *pos0, int32_t *out_ids,
                                                                     int32_t *step, int2 *part, unsigned *count)
{
    griddep_launch();
    griddep_wait();
    __shared__ bool s_last;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    const int nt = blockDim.x * gridDim.x, t = blockIdx.x * blockDim.x + threadIdx.x;
    const int n4 = (uintptr_t)x % 16 == 0 ? n / 4 : 0;
    const float4 *x4 = (const float4 *)x;
    for (int i0 = t; i0 < n4; i0 += AM_GU * nt) {
        float4 v[AM_GU];
#pragma unroll
        for (int u = 0; u < AM_GU; u++)
            v[u] = i0 + u * nt < n4 ? __ldcg(x4 + i0 + u * nt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < AM_GU; u++) {
            int i = 4 * (i0 + u * nt);
            if (i0 + u * nt >= n4)
                break;
            argmax_take(v[u].x, i, best, bi), argmax_take(v[u].y, i + 1, best, bi);
            argmax_take(v[u].z, i + 2, best, bi), argmax_take(v[u].w, i + 3, best, bi);
        }
    }
    for (int i = 4 * n4 + t; i < n; i += nt) /* the tail (all of x when unaligned) */
        argmax_take(__ldcg(x + i), i, best, bi);
    argmax_block_reduce(best, bi);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = make_int2(__float_as_int(best), bi);
        __threadfence();
        unsigned prev = atomicAdd(count, 1u);
        s_last = prev == gridDim.x - 1;
        if (s_last)
            *count = 0; /* every block has arrived: ready for the next launch */
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    best = -INFINITY, bi = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        int2 p = __ldcg(part + b);
        argmax_take(__int_as_float(p.x), p.y, best, bi);
    }
    __syncthreads(); /* argmax_block_reduce's shared arrays are reused */
    argmax_block_reduce(best, bi);
    if (threadIdx.x == 0) {
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

cudaError_t launch_argmax(const float *x, int32_t n, int32_t *ids, int32_t *pos0,
                          int32_t *out_ids, int32_t *step, cudaStream_t s, bool pdl,
                          const struct argmax_scratch *sc)
{
    if (sc && sc->blocks > 1)
        return launch_k(pdl, argmax_grid_kernel, dim3(sc->blocks), dim3(AM_GRID_THREADS), 0, s, x, n, ids, pos0,
                        out_ids, step, sc->part, sc->count);
    return launch_k(pdl, argmax_kernel, dim3(1), dim3(1024), 0, s, x, n, ids, pos0, out_ids, step);
}
