/*
 * kernels.cu — CUDA kernels for the row-wise plan ops: embed, rmsnorm, add, swiglu, sigmoid
 * gate, q/k norm + RoPE (optionally writing the KV cache), argmax. The attention kernels are in
 * attention.cu (and its decode variants in attention_*.cu), the Gated DeltaNet ops in
 * gdn_ops.cu. Each follows its reference in src/backend/cpu/kernels_ref.c; the comment on each
 * says how the work is split.
 *
 * Numerics: f32 everywhere; RoPE angles in double as the reference does (positions up to
 * 2^22 keep their precision).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

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
