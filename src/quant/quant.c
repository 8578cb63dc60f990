/*
 * quant.c — row (de)quantisation dispatch by dtype. Plain float types live here; block types
 * are added in their own files (one per format family) and dispatched from the switches below.
 */
#include "quant/quant.h"

#include <string.h>

#include "base/half.h"

bool quant_can_dequantize(enum qr_dtype t)
{
    switch (t) {
    case QR_F32:
    case QR_F16:
    case QR_BF16:
        return true;
    default:
        return false;
    }
}

bool quant_dequantize_row(enum qr_dtype t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case QR_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case QR_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(s[i]);
        return true;
    }
    case QR_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(s[i]);
        return true;
    }
    default:
        return false;
    }
}

bool quant_quantize_row(enum qr_dtype t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case QR_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case QR_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = f32_to_f16(src[i]);
        return true;
    }
    case QR_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = f32_to_bf16(src[i]);
        return true;
    }
    default:
        return false;
    }
}
