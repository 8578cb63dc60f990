/*
 * quant.c — row (de)quantisation dispatch by dtype. Plain float types live here; block types
 * live in their own files (q8_0.c, q4_0.c, k_quants.c, other_quants.c for the types qwenrt only
 * reads; structs in blocks.h) and are dispatched
 * from the switches below after checking that n is a whole number of blocks.
 */
#include "quant/quant.h"

#include <string.h>

#include "base/half.h"
#include "quant/blocks.h"

/* Elements per block of t (1 for plain types), 0 when t has no block row functions here. */
static int64_t block_elems(enum qr_dtype t)
{
    switch (t) {
    case QR_F32:
    case QR_F16:
    case QR_BF16:
        return 1;
    case QR_Q8_0:
    case QR_Q4_0:
    case QR_Q4_1:
    case QR_Q5_0:
    case QR_Q5_1:
    case QR_IQ4_NL:
        return QK8_0;
    case QR_Q2_K:
    case QR_Q3_K:
    case QR_Q4_K:
    case QR_Q5_K:
    case QR_Q6_K:
    case QR_Q8_K:
    case QR_IQ4_XS:
        return QK_K;
    default:
        return 0;
    }
}

bool quant_can_dequantize(enum qr_dtype t)
{
    switch (t) {
    case QR_F32:
    case QR_F16:
    case QR_BF16:
    case QR_Q8_0:
    case QR_Q4_0:
    case QR_Q4_1:
    case QR_Q5_0:
    case QR_Q5_1:
    case QR_Q2_K:
    case QR_Q3_K:
    case QR_Q4_K:
    case QR_Q5_K:
    case QR_Q6_K:
    case QR_Q8_K:
    case QR_IQ4_NL:
    case QR_IQ4_XS:
        return true;
    default:
        return false;
    }
}

bool quant_dequantize_row(enum qr_dtype t, const void *src, float *dst, int64_t n)
{
    int64_t be = block_elems(t);
    if (be == 0 || n < 0 || n % be != 0)
        return false;
    int64_t nb = n / be;
    switch (t) {
    case QR_Q8_0:
        quant_dequant_q8_0(src, dst, nb);
        return true;
    case QR_Q4_0:
        quant_dequant_q4_0(src, dst, nb);
        return true;
    case QR_Q4_K:
        quant_dequant_q4_k(src, dst, nb);
        return true;
    case QR_Q5_K:
        quant_dequant_q5_k(src, dst, nb);
        return true;
    case QR_Q6_K:
        quant_dequant_q6_k(src, dst, nb);
        return true;
    case QR_Q8_K:
        quant_dequant_q8_k(src, dst, nb);
        return true;
    case QR_Q4_1:
        quant_dequant_q4_1(src, dst, nb);
        return true;
    case QR_Q5_0:
        quant_dequant_q5_0(src, dst, nb);
        return true;
    case QR_Q5_1:
        quant_dequant_q5_1(src, dst, nb);
        return true;
    case QR_Q2_K:
        quant_dequant_q2_k(src, dst, nb);
        return true;
    case QR_Q3_K:
        quant_dequant_q3_k(src, dst, nb);
        return true;
    case QR_IQ4_NL:
        quant_dequant_iq4_nl(src, dst, nb);
        return true;
    case QR_IQ4_XS:
        quant_dequant_iq4_xs(src, dst, nb);
        return true;
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
    int64_t be = block_elems(t);
    if (be == 0 || n < 0 || n % be != 0)
        return false;
    int64_t nb = n / be;
    switch (t) {
    case QR_Q8_0:
        quant_quant_q8_0(src, dst, nb);
        return true;
    case QR_Q4_0:
        quant_quant_q4_0(src, dst, nb);
        return true;
    case QR_Q4_K:
        quant_quant_q4_k(src, dst, nb);
        return true;
    case QR_Q5_K:
        quant_quant_q5_k(src, dst, nb);
        return true;
    case QR_Q6_K:
        quant_quant_q6_k(src, dst, nb);
        return true;
    case QR_Q8_K:
        quant_quant_q8_k(src, dst, nb);
        return true;
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
