/*
 * other_quants.c — dequantisers of the llama.cpp block types qwenrt reads but neither writes
 * nor computes with directly: Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32) and Q2_K, Q3_K, IQ4_XS
 * (super-blocks of 256). A model with such matrices computes with converted copies
 * (quant/transcode.h: Q5_0 and IQ4_NL as Q8_0 and Q3_K as Q6_K exactly, the others as F16).
 *
 * Layouts (llama.cpp's, byte for byte; structs in blocks.h):
 * - Q4_1: x = d·q + m; element j (0..15) the low nibble of qs[j], element j + 16 the high.
 * - Q5_0 / Q5_1: the nibbles as Q4_1 plus a 5th bit, bit e of the little-endian word qh for
 *   element e; Q5_0 x = d·(q − 16), Q5_1 x = d·q + m.
 * - Q2_K / Q3_K: element i = 128h + 32j + l (h 0..1, j 0..3, l 0..31) takes bits 2j..2j+1 of
 *   qs[32h + l] (quant_k2_level) and the scale of sub-block i / 16. Q2_K: scales[s] holds the
 *   4-bit scale (low nibble) and min (high); x = d·sc·q − dmin·m. Q3_K: bit 4h + j of
 *   hmask[l] clear subtracts 4 from q; 16 6-bit scales packed in 12 bytes (low 4 bits in the
 *   nibbles of bytes 0..7, high 2 bits in bytes 8..11); x = d·(sc − 32)·q.
 * - IQ4_NL: x = d·levels[q], q the nibbles as Q4_0's, levels the 16 non-uniform int8 values
 *   of quant_iq4_levels. IQ4_XS: 8 sub-blocks of 32 laid out as IQ4_NL's nibbles, each with a
 *   6-bit scale ls (low 4 bits in scales_l, high 2 in scales_h); x = d·(ls − 32)·levels[q].
 * Products are formed in f32 in the order llama.cpp's reference dequantisers use, so the values
 * are the same floats.
 */
#include "base/half.h"
#include "quant/blocks.h"

/* The 5-bit level of element e (0..31) of a Q5_0 / Q5_1 block. */
static int q5_level(const uint8_t qs[QK8_0 / 2], const uint8_t qh[4], int e)
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    int low = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
    return low | (int)((h >> e) & 1u) << 4;
}

void quant_dequant_q4_1(const struct block_q4_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < QK8_0 / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0xF) * d + m;
            y[j + QK8_0 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void quant_dequant_q5_0(const struct block_q5_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d);
        for (int e = 0; e < QK8_0; e++)
            y[e] = (float)(q5_level(b[i].qs, b[i].qh, e) - 16) * d;
    }
}

void quant_dequant_q5_1(const struct block_q5_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int e = 0; e < QK8_0; e++)
            y[e] = (float)q5_level(b[i].qs, b[i].qh, e) * d + m;
    }
}

void quant_dequant_q2_k(const struct block_q2_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            uint8_t sc = b[i].scales[e / 16];
            float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            y[e] = dl * (float)quant_k2_level(b[i].qs, e) - ml;
        }
    }
}

int quant_q3_k_scale(const uint8_t scales[12], int s)
{
    int low = (scales[s % 8] >> (4 * (s / 8))) & 0xF;
    int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    return low | high << 4;
}

void quant_dequant_q3_k(const struct block_q3_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = quant_k2_level(b[i].qs, e) - ((b[i].hmask[l] >> (4 * h + j)) & 1 ? 0 : 4);
            float dl = d * (float)(quant_q3_k_scale(b[i].scales, e / 16) - 32);
            y[e] = dl * (float)q;
        }
    }
}

/* IQ4_NL's levels (ggml's kvalues_iq4nl: the format's definition). */
const int8_t quant_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

void quant_dequant_iq4_nl(const struct block_iq4_nl *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0 / 2; j++) {
            y[j] = d * (float)quant_iq4_levels[b[i].qs[j] & 0xF];
            y[j + QK8_0 / 2] = d * (float)quant_iq4_levels[b[i].qs[j] >> 4];
        }
    }
}

int quant_iq4_xs_scale(const struct block_iq4_xs *x, int b)
{
    return ((x->scales_l[b / 2] >> (4 * (b % 2))) & 0xF) | ((x->scales_h >> (2 * b)) & 3) << 4;
}

void quant_dequant_iq4_xs(const struct block_iq4_xs *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(b[i].d);
        for (int s = 0; s < QK_K / 32; s++, y += 32) {
            float dl = d * (float)(quant_iq4_xs_scale(&b[i], s) - 32);
            const uint8_t *qs = b[i].qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quant_iq4_levels[qs[j] & 0xF];
                y[j + 16] = dl * (float)quant_iq4_levels[qs[j] >> 4];
            }
        }
    }
}
