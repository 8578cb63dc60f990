/*
 * gemv_smem.cuh — what gemv_smem.cu (the one-token 16-bit GEMV with its rows in shared
 * memory) shares with gemv_mma.cu (the same launch with the dot products on the tensor
 * cores): the shape of a launch, chosen once in gemv_smem.cu, and the raised shared-memory
 * limit both kernels need for blocks above 48 KB.
 */
#ifndef QWENRT_BACKEND_CUDA_GEMV_SMEM_CUH
#define QWENRT_BACKEND_CUDA_GEMV_SMEM_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_stage.cuh"

#define GS_SMEM_DEFAULT (47 * 1024) /* more needs the kernel's attribute raised */

/* How a launch runs: lanes per row (gemv_smem) or warps per 8-row tile L / 4 (gemv_mma),
 * warps per block, blocks, the bytes between rows in shared memory, the block's dynamic
 * shared memory and the cap it was fitted under, whether its blocks let the next launch
 * start before they wait for their input, and whether the tensor cores do the sums. */
struct gs_shape {
    int L, W, blocks;
    int32_t wstride;
    size_t smem, cap;
    bool launch_early;
    bool mma;
};

/* The kernel's dynamic shared-memory limit raised to sh.cap when the block needs more than the
 * default, never lowered: a launch captured earlier with a larger cap stays valid (a host
 * call: replayed graphs do not repeat it). */
template <typename K>
static cudaError_t gs_raise_smem_limit(K kernel, const struct gs_shape &sh)
{
    if (sh.smem <= GS_SMEM_DEFAULT)
        return cudaSuccess;
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
    if (e == cudaSuccess && (size_t)fa.maxDynamicSharedSizeBytes < sh.cap)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh.cap);
    return e;
}

/* The middle of both kernels, once a block's row copies are issued: close them as one group,
 * let the next launch start (before the wait, or after it: gs_shape.launch_early), load the
 * first norm weights (constant: before the wait), wait for the input. */
__device__ __forceinline__ void gs_commit_and_wait(const struct gemv_args &a, bool launch_early,
                                                   float4 (&g0)[GEMV_NW])
{
    cp_async_commit();
    if (launch_early)
        griddep_launch();
    gemv_load_norm_w(a, g0);
    griddep_wait();
    if (!launch_early)
        griddep_launch();
}

/* gemv_mma.cu: the launch of a shape gemv_smem_shape made with sh.mma (BF16 weights). */
cudaError_t launch_gemv_mma(const struct gemv_args *a, const struct gs_shape &sh, cudaStream_t s);

#endif
