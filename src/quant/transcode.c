/*
 * transcode.c — Q4_0, Q5_0 and IQ4_NL rows as Q8_0, Q3_K rows as Q6_K, any other
 * dequantisable rows as F16 (see transcode.h).
 */
#include "quant/transcode.h"

#include <string.h>

#include "base/alloc.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

enum qr_dtype transcode_target(enum qr_dtype from)
{
    if (from == QR_Q4_0 || from == QR_Q5_0 || from == QR_IQ4_NL)
        return QR_Q8_0;
    if (from == QR_Q3_K)
        return QR_Q6_K;
    return quant_can_dequantize(from) ? QR_F16 : QR_DTYPE_INVALID;
}

/* Q4_0 block -> Q8_0 block: the same scale bits, levels q − 8 (element order as q4_0.c). */
static void q4_0_block_as_q8_0(const struct block_q4_0 *in, struct block_q8_0 *out)
{
    out->d = in->d;
    for (int j = 0; j < QK8_0 / 2; j++) {
        out->qs[j] = (int8_t)((in->qs[j] & 0xF) - 8);
        out->qs[j + QK8_0 / 2] = (int8_t)((in->qs[j] >> 4) - 8);
    }
}

/* Q5_0 block -> Q8_0 block: the same scale bits, levels q − 16 (−16..15). */
static void q5_0_block_as_q8_0(const struct block_q5_0 *in, struct block_q8_0 *out)
{
    uint32_t h = (uint32_t)in->qh[0] | (uint32_t)in->qh[1] << 8 | (uint32_t)in->qh[2] << 16 |
                 (uint32_t)in->qh[3] << 24;
    out->d = in->d;
    for (int e = 0; e < QK8_0; e++) {
        int low = e < QK8_0 / 2 ? in->qs[e] & 0xF : in->qs[e - QK8_0 / 2] >> 4;
        out->qs[e] = (int8_t)((low | (int)((h >> e) & 1u) << 4) - 16);
    }
}

/* IQ4_NL block -> Q8_0 block: the same scale bits, each index's level as the int8 value. */
static void iq4_nl_block_as_q8_0(const struct block_iq4_nl *in, struct block_q8_0 *out)
{
    out->d = in->d;
    for (int j = 0; j < QK8_0 / 2; j++) {
        out->qs[j] = quant_iq4_levels[in->qs[j] & 0xF];
        out->qs[j + QK8_0 / 2] = quant_iq4_levels[in->qs[j] >> 4];
    }
}

/* Q3_K super-block -> Q6_K: the same d bits, each sub-block's scale sc − 32 as Q6_K's int8
 * scale, levels q (−4..3) as Q6_K's (−32..31): d·(sc − 32)·q is the same product. */
static void q3_k_block_as_q6_k(const struct block_q3_k *in, struct block_q6_k *out)
{
    int8_t L[QK_K];
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32;
        L[e] = (int8_t)(quant_k2_level(in->qs, e) - ((in->hmask[l] >> (4 * h + j)) & 1 ? 0 : 4));
    }
    quant_q6_k_pack_levels(L, out);
    for (int s = 0; s < QK_K / 16; s++)
        out->scales[s] = (int8_t)(quant_q3_k_scale(in->scales, s) - 32);
    out->d = in->d;
}

/* One row through f32: dequantised into tmp[K], each value rounded to f16. */
static void row_as_f16(enum qr_dtype from, const void *src, uint16_t *dst, int64_t K, float *tmp)
{
    quant_dequantize_row(from, src, tmp, K);
    for (int64_t i = 0; i < K; i++)
        dst[i] = f32_to_f16(tmp[i]);
}

bool transcode_rows(enum qr_dtype from, const void *src, void *dst, int64_t K, int64_t n_rows)
{
    enum qr_dtype to = transcode_target(from);
    size_t in_bytes, out_bytes;
    if (to == QR_DTYPE_INVALID || n_rows < 0 || !dtype_row_bytes(from, K, &in_bytes) ||
        !dtype_row_bytes(to, K, &out_bytes))
        return false;
    const uint8_t *in = (const uint8_t *)src;
    uint8_t *out = (uint8_t *)dst;
    /* block for block: rows are whole blocks, so the rows are one run of blocks */
    if (to == QR_Q8_0) {
        struct block_q8_0 *o = (struct block_q8_0 *)out;
        for (int64_t b = 0; b < K / QK8_0 * n_rows; b++) {
            if (from == QR_Q4_0)
                q4_0_block_as_q8_0((const struct block_q4_0 *)in + b, o + b);
            else if (from == QR_Q5_0)
                q5_0_block_as_q8_0((const struct block_q5_0 *)in + b, o + b);
            else
                iq4_nl_block_as_q8_0((const struct block_iq4_nl *)in + b, o + b);
        }
        return true;
    }
    if (from == QR_Q3_K) {
        for (int64_t b = 0; b < K / QK_K * n_rows; b++)
            q3_k_block_as_q6_k((const struct block_q3_k *)in + b, (struct block_q6_k *)out + b);
        return true;
    }
    float *tmp = xmalloc((size_t)K, sizeof(float));
    if (!tmp)
        return false;
    for (int64_t r = 0; r < n_rows; r++)
        row_as_f16(from, in + (size_t)r * in_bytes, (uint16_t *)(out + (size_t)r * out_bytes), K, tmp);
    xfree(tmp);
    return true;
}
