/*
 * transcode.c — Q4_0 rows as Q8_0, any other dequantisable rows as F16 (see transcode.h).
 */
#include "quant/transcode.h"

#include <string.h>

#include "base/alloc.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

enum qr_dtype transcode_target(enum qr_dtype from)
{
    if (from == QR_Q4_0)
        return QR_Q8_0;
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
    if (to == QR_Q8_0) {
        int64_t blocks = K / QK8_0 * n_rows; /* rows are whole blocks: one run of blocks */
        for (int64_t b = 0; b < blocks; b++)
            q4_0_block_as_q8_0((const struct block_q4_0 *)in + b, (struct block_q8_0 *)out + b);
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
