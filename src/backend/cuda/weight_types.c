/*
 * weight_types.c — the stored weight types the CUDA kernels compute with, in one place for
 * both builds (with and without nvcc): the session refuses any other (cuda_session.cu, via
 * gemv_supports), and model_load.c transcodes a model's other matrices when it is loaded for
 * the CUDA backend (quant/transcode.h: Q4_0, Q5_0 and IQ4_NL as Q8_0, Q3_K as Q6_K, others
 * as F16).
 */
#include "backend/cuda/cuda_backend.h"
#include "format/dtype.h"

bool cuda_weight_dtype_supported(int32_t dtype)
{
    return dtype == QR_F32 || dtype == QR_F16 || dtype == QR_BF16 || dtype == QR_Q8_0 ||
           dtype == QR_Q4_K || dtype == QR_Q6_K;
}
