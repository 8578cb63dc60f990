/*
 * q4_0.c — Q4_0 blocks (32 elements, f16 scale, 4-bit quants with offset 8): dequantise and
 * quantise.
 *
 * Element j (0..15) is the low nibble of qs[j], element j+16 the high nibble; x = d·(q − 8).
 * The quantiser searches the scale (fit_scale_sym over levels −8..7, candidates that include
 * llama.cpp's d = extreme / −8) and then re-rounds the levels with the f16-rounded scale.
 */
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"

void quant_dequant_q4_0(const struct block_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(b[i].d);
        float *yb = y + i * QK8_0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            yb[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            yb[j + QK8_0 / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

void quant_quant_q4_0(const float *x, struct block_q4_0 *b, int64_t nb)
{
    float w[QK8_0];
    int8_t L[QK8_0];
    for (int j = 0; j < QK8_0; j++)
        w[j] = 1.0f; /* plain squared error, as llama.cpp's Q4_0 reference quantiser */
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK8_0;
        float d = fit_scale_sym(QK8_0, xb, w, -8, 7, L);
        b[i].d = f32_to_f16(d);
        fit_levels_sym(QK8_0, xb, -8, 7, f16_to_f32(b[i].d), L);
        for (int j = 0; j < QK8_0 / 2; j++)
            b[i].qs[j] = (uint8_t)((L[j] + 8) | ((L[j + QK8_0 / 2] + 8) << 4));
    }
}
