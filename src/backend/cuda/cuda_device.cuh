/*
 * cuda_device.cuh — small device functions the CUDA kernels share (kernels.cu, matmul.cu,
 * megakernel.cu, attention_flash.cu): the activations with the reference's formulas, warp /
 * block sums and the asynchronous global -> shared copies (cp.async, sm_80 and later).
 * Every function is static inline: each .cu file compiles its own copy (no device linking).
 */
#ifndef QWENRT_BACKEND_CUDA_DEVICE_CUH
#define QWENRT_BACKEND_CUDA_DEVICE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

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

static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#endif
