/*
 * device_checks.h — host entry points that run one device helper of the CUDA kernels over host
 * data, beside the plain form it replaces, so that test_cuda_ops can hold the two to the
 * same bits on random inputs. The helpers are small pieces of the decode attention's
 * arithmetic (attention_decode.cuh) whose whole point is computing the plain form's result in
 * fewer instructions; a kernel test alone would show a wrong one only where a model happens to
 * reach it.
 *
 * Both return QWENRT_OK, INVALID_ARG for a shape they do not take, or BACKEND (no device, or a
 * CUDA error); the CPU-only build's stubs (cuda_stub.c) return BACKEND.
 */
#ifndef QWENRT_BACKEND_CUDA_DEVICE_CHECKS_H
#define QWENRT_BACKEND_CUDA_DEVICE_CHECKS_H

#include <stdint.h>

#include "qwenrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* warp_sum_each over n values a lane (n: 1, 2, 4, 8, 16 or 32) in each of `warps` warps: x is
 * [warps][n][32] (value i of lane l at x[(w n + i) 32 + l]); each gets what every lane holds
 * after warp_sum_each, plain what it holds after warp_sum of each value, both [warps][n][32]. */
qwenrt_status cuda_warp_sum_each_host(int32_t n, int32_t warps, const float *x, float *each, float *plain,
                                      struct qwenrt_error *err);

/* att_exp and __expf of each of count values: fast[i] = att_exp(x[i]), plain[i] = __expf(x[i]). */
qwenrt_status cuda_att_exp_host(int32_t count, const float *x, float *fast, float *plain, struct qwenrt_error *err);

#ifdef __cplusplus
}
#endif

#endif
