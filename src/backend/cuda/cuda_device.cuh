/*
 * cuda_device.cuh — small device functions the CUDA kernels share (kernels.cu, attention.cu,
 * gdn_ops.cu, matmul.cu, megakernel.cu, attention_flash.cu, ...): the activations with the
 * reference's formulas, warp / block sums, the asynchronous global -> shared copies (cp.async,
 * sm_80 and later), and the f32 or bf16-term output stores of the ops that feed the fast
 * prefill products (put_out).
 * Every function is static inline: each .cu file compiles its own copy (no device linking).
 */
#ifndef QWENRT_BACKEND_CUDA_DEVICE_CUH
#define QWENRT_BACKEND_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }
static __device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * red: 32 floats of shared memory. */
static __device__ __forceinline__ float block_sum(float v, float *red)
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

/* The GPU's nanosecond clock (%globaltimer; it advances in steps of ~0.26 us on the H200):
 * the stamps of the profiles and timelines. */
static __device__ __forceinline__ unsigned long long globaltimer_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Asynchronous copies into shared memory (cp.async): 4 bytes (any aligned float) or 16 bytes
 * (both addresses on 16 bytes, bypassing L1); a commit closes a group, cp_async_wait<N> waits
 * until at most N of this thread's groups are still in flight. The shared address is the
 * 32-bit one the instruction takes. */
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* mbarriers in shared memory (sm_90; the PTX built for older devices traps if it were ever
 * reached): initialised for COUNT arrivals; waited for until the phase of the given parity
 * has completed (its arrivals and transaction bytes). bar: the 32-bit shared address. */
template <int COUNT>
static __device__ __forceinline__ void mbar_init(uint32_t bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "n"(COUNT) : "memory");
#endif
}

static __device__ __forceinline__ void mbar_wait_parity(uint32_t bar, uint32_t parity)
{
    uint32_t done = 0;
    while (!done) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
        __trap();
#else
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
#endif
    }
}

static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* d += a b on the tensor cores: m16n8k16, bf16 inputs, f32 d; A row-major 16x16, B col-major
 * 16x8. Lane (g = lane / 4, c = lane % 4) holds a0 = A(g, 2c..2c+1), a1 = A(g+8, 2c..),
 * a2 = A(g, 2c+8..), a3 = A(g+8, 2c+8..); b0 = B(2c..2c+1, g), b1 = B(2c+8.., g);
 * d = {D(g, 2c), D(g, 2c+1), D(g+8, 2c), D(g+8, 2c+1)}. Each u32 holds two elements, the
 * lower column (k) in its low half. */
static __device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Four 8x8 matrices of 16-bit elements from shared memory: lanes 8j..8j+7 give the addresses
 * of matrix j's rows (16 bytes each); lane l receives r[j] = matrix j's row l / 4, elements
 * 2 (l % 4) and 2 (l % 4) + 1 — for rows of W, the B fragments of mma_bf16_16816. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t row_of_lane)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_of_lane));
}

/* The KV cache's elements: f32, or f16 (cuda_options.kv_f16; written rounded to nearest).
 * Kernels that read or write the cache are templated on KV = float or __half and read n
 * consecutive elements with kv_get (n = 2, 4, 8 or 16, the address aligned to n elements). */
static __device__ __forceinline__ void kv_put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void kv_put(__half *p, float v) { *p = __float2half_rn(v); }

template <int N>
static __device__ __forceinline__ void kv_get(const float *p, float *out)
{
    static_assert(N == 2 || N % 4 == 0, "kv_get: 2 or a multiple of 4 elements");
    if constexpr (N == 2) {
        float2 v = *(const float2 *)p;
        out[0] = v.x, out[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            float4 v = *(const float4 *)(p + i);
            out[i] = v.x, out[i + 1] = v.y, out[i + 2] = v.z, out[i + 3] = v.w;
        }
    }
}

/* An f16 cache in two halves: the raw words first (issue every row's load before converting
 * any: a conversion right after its load makes the next load wait for it), then floats. */
template <int N>
static __device__ __forceinline__ void kv_load_raw(const __half *p, uint32_t (&w)[N / 2])
{
    static_assert(N == 2 || N == 4 || N % 8 == 0, "kv_load_raw: 2, 4 or a multiple of 8 elements");
    if constexpr (N == 2) {
        w[0] = *(const uint32_t *)p;
    } else if constexpr (N == 4) {
        uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 8) {
            uint4 u = *(const uint4 *)(p + i);
            w[i / 2] = u.x, w[i / 2 + 1] = u.y, w[i / 2 + 2] = u.z, w[i / 2 + 3] = u.w;
        }
    }
}

template <int N>
static __device__ __forceinline__ void kv_from_raw(const uint32_t (&w)[N / 2], float *out)
{
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        __half2 h;
        memcpy(&h, &w[i], sizeof(h));
        float2 f = __half22float2(h);
        out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
}

template <int N>
static __device__ __forceinline__ void kv_get(const __half *p, float *out)
{
    uint32_t w[N / 2];
    kv_load_raw<N>(p, w);
    kv_from_raw<N>(w, out);
}

/* f32 out, or bf16 rounded to nearest as round_bf16_kernel would round the f32 value (the
 * fast prefill's product input written directly: one pass instead of two), with the
 * remainder's bf16 in mid when it is not NULL (two terms, as split_bf16_kernel makes them). */
static __device__ __forceinline__ void put_out(float *p, float *, float v) { *p = v; }
static __device__ __forceinline__ void put_out(__nv_bfloat16 *p, __nv_bfloat16 *mid, float v)
{
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    *p = h;
    if (mid)
        *mid = __float2bfloat16_rn(v - __bfloat162float(h));
}

/* Four consecutive outputs (16-byte aligned in f32, 8-byte in bf16) in one store per array:
 * a warp then writes whole contiguous lines instead of 2-byte pieces 8 bytes apart. */
static __device__ __forceinline__ void put_out4(float *p, float *, const float *v)
{
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
}
static __device__ __forceinline__ void put_out4(__nv_bfloat16 *p, __nv_bfloat16 *mid, const float *v)
{
    __align__(8) __nv_bfloat16 h[4], m[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
        put_out(&h[e], &m[e], v[e]);
    *(uint2 *)p = *(const uint2 *)h;
    if (mid)
        *(uint2 *)mid = *(const uint2 *)m;
}

#endif
