/*
 * q8_0.c — Q8_0 blocks (32 elements, f16 scale, int8 quants): dequantise and quantise.
 *
 * The quantiser is plain max-abs rounding, d = max|x| / 127, q = round(x / d): with 255
 * levels a scale search gains almost nothing, and the same function quantises activations
 * for the Q8_0/Q4_0 matmul kernels, where it must be fast. The quants are rounded with the
 * f16-rounded scale so that the stored d and qs agree.
 */
#include <math.h>

#include "base/half.h"
#include "quant/blocks.h"

void quant_dequant_q8_0(const struct block_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            y[i * QK8_0 + j] = d * (float)b[i].qs[j];
    }
}

void quant_quant_q8_0(const float *x, struct block_q8_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        uint16_t dh = f32_to_f16(amax / 127.0f);
        float d = f16_to_f32(dh);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = dh;
        for (int j = 0; j < QK8_0; j++) {
            long q = lrintf(xb[j] * id);
            b[i].qs[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}
