/*
 * device_checks.cu — device_checks.h's entry points: one warp a case runs warp_sum_each and
 * warp_sum on the same values; one thread a value runs att_exp and __expf. Only the tests use
 * them; nothing here is on a decode path.
 */
extern "C" {
#include "backend/cuda/device_checks.h"
}
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cuda_internal.cuh"

template <int N>
__global__ void warp_sum_each_check_kernel(const float *x, float *each, float *plain)
{
    const int lane = threadIdx.x & 31;
    const int64_t w = blockIdx.x;
    float v[N];
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] = x[(w * N + i) * 32 + lane];
#pragma unroll
    for (int i = 0; i < N; i++)
        plain[(w * N + i) * 32 + lane] = warp_sum(v[i]);
    warp_sum_each(v);
#pragma unroll
    for (int i = 0; i < N; i++)
        each[(w * N + i) * 32 + lane] = v[i];
}

__global__ void att_exp_check_kernel(const float *x, int32_t count, float *fast, float *plain)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        fast[i] = att_exp(x[i]), plain[i] = __expf(x[i]);
}

static cudaError_t launch_warp_sum_each_check(int32_t n, int32_t warps, const float *x, float *each, float *plain)
{
    switch (n) {
    case 1: warp_sum_each_check_kernel<1><<<warps, 32>>>(x, each, plain); break;
    case 2: warp_sum_each_check_kernel<2><<<warps, 32>>>(x, each, plain); break;
    case 4: warp_sum_each_check_kernel<4><<<warps, 32>>>(x, each, plain); break;
    case 8: warp_sum_each_check_kernel<8><<<warps, 32>>>(x, each, plain); break;
    case 16: warp_sum_each_check_kernel<16><<<warps, 32>>>(x, each, plain); break;
    case 32: warp_sum_each_check_kernel<32><<<warps, 32>>>(x, each, plain); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* Copies `in` floats to the device, runs launch over the device buffers (one input, two
 * outputs of out floats each), copies both outputs back. */
template <typename F>
static qwenrt_status run_check(const char *what, const float *in, size_t n_in, float *out_a, float *out_b,
                               size_t n_out, F launch, struct qwenrt_error *err)
{
    float *d_in = NULL, *d_a = NULL, *d_b = NULL;
    cudaError_t e = cudaMalloc(&d_in, n_in * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_a, n_out * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&d_b, n_out * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemcpy(d_in, in, n_in * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = launch(d_in, d_a, d_b);
    if (e == cudaSuccess)
        e = cudaMemcpy(out_a, d_a, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(out_b, d_b, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(d_in);
    cudaFree(d_a);
    cudaFree(d_b);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(err, e, __FILE__, __LINE__, what);
    }
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_warp_sum_each_host(int32_t n, int32_t warps, const float *x, float *each,
                                                 float *plain, struct qwenrt_error *err)
{
    if ((n != 1 && n != 2 && n != 4 && n != 8 && n != 16 && n != 32) || warps < 1 || warps > 65535 || !x || !each ||
        !plain)
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda warp_sum_each check: %d values a lane (1, 2, 4, 8, 16 or 32) in %d warps (1 to 65,535)",
                       (int)n, (int)warps);
    const size_t count = (size_t)warps * n * 32;
    return run_check("cuda_warp_sum_each_host", x, count, each, plain, count,
                     [&](const float *dx, float *da, float *db) { return launch_warp_sum_each_check(n, warps, dx, da, db); },
                     err);
}

extern "C" qwenrt_status cuda_att_exp_host(int32_t count, const float *x, float *fast, float *plain,
                                           struct qwenrt_error *err)
{
    if (count < 1 || !x || !fast || !plain)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda att_exp check: %d values (at least 1)", (int)count);
    return run_check("cuda_att_exp_host", x, (size_t)count, fast, plain, (size_t)count,
                     [&](const float *dx, float *da, float *db) {
                         att_exp_check_kernel<<<(count + 255) / 256, 256>>>(dx, count, da, db);
                         return cudaGetLastError();
                     },
                     err);
}
