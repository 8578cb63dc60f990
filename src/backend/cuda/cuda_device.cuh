/*
 * cuda_device.cuh — small device functions the CUDA kernels share (kernels.cu, matmul.cu,
 * megakernel.cu): the activations with the reference's formulas and warp / block sums.
 * Every function is static inline: each .cu file compiles its own copy (no device linking).
 */
#ifndef QWENRT_BACKEND_CUDA_DEVICE_CUH
#define QWENRT_BACKEND_CUDA_DEVICE_CUH

#include <cuda_runtime.h>
#include <math.h>

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

#endif
