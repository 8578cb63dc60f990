/*
 * k_quants.c — the K-quant super-blocks (256 elements): Q4_K, Q5_K and Q6_K (dequantise and
 * quantise) and Q8_K (the activation format of the K-quant dot products).
 *
 * Quantisers work in two levels, as the format does. First each sub-block gets its own float
 * scale (and min) from a grid search with least-squares refits (fit.c), weighted by importance
 * (Q4_K/Q5_K: w = rms(sub-block) + |x|; Q6_K: w = x², the weightings llama.cpp found to work).
 * Then the super-block scales d (and dmin) are set from the largest sub-block values and the
 * 6- or 8-bit sub-block codes are rounded; finally each sub-block tries its rounded code ±1
 * (scale and min) with freshly rounded levels and keeps the lowest error, which repairs most
 * of the loss from coding the scales (llama.cpp re-rounds only the levels).
 */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantisation: straight from the layout text in docs/gguf-and-quant.md ---- */

void quant_dequant_q4_k(const struct block_q4_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            uint8_t sc1, m1, sc2, m2;
            quant_k_scale_min(b[i].scales, 2 * c, &sc1, &m1);
            quant_k_scale_min(b[i].scales, 2 * c + 1, &sc2, &m2);
            const uint8_t *q = b[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) {
                y[64 * c + l] = d * sc1 * (float)(q[l] & 0xF) - dmin * m1;
                y[64 * c + 32 + l] = d * sc2 * (float)(q[l] >> 4) - dmin * m2;
            }
        }
    }
}

void quant_dequant_q5_k(const struct block_q5_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            uint8_t sc1, m1, sc2, m2;
            quant_k_scale_min(b[i].scales, 2 * c, &sc1, &m1);
            quant_k_scale_min(b[i].scales, 2 * c + 1, &sc2, &m2);
            const uint8_t *q = b[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 0xF) | (((b[i].qh[l] >> (2 * c)) & 1) << 4);
                int hi = (q[l] >> 4) | (((b[i].qh[l] >> (2 * c + 1)) & 1) << 4);
                y[64 * c + l] = d * sc1 * (float)lo - dmin * m1;
                y[64 * c + 32 + l] = d * sc2 * (float)hi - dmin * m2;
            }
        }
    }
}

void quant_dequant_q6_k(const struct block_q6_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            float *yh = y + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                int s = l / 16;
                yh[l] = d * sc[s] * (float)q1;
                yh[l + 32] = d * sc[s + 2] * (float)q2;
                yh[l + 64] = d * sc[s + 4] * (float)q3;
                yh[l + 96] = d * sc[s + 6] * (float)q4;
            }
        }
    }
}

void quant_dequant_q8_k(const struct block_q8_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++)
            y[j] = b[i].d * (float)b[i].qs[j];
}

/* ---- Q4_K / Q5_K quantisation ---- */

/* Importance weights of one 32-element sub-block: rms + |x|. */
static void weights_rms_abs(const float *x, float *w)
{
    float s2 = 0.0f;
    for (int l = 0; l < 32; l++)
        s2 += x[l] * x[l];
    float av = sqrtf(s2 / 32.0f);
    for (int l = 0; l < 32; l++)
        w[l] = av + fabsf(x[l]);
}

/* Codes (6-bit scale, 6-bit min) and levels of each sub-block for one super-block of 256,
 * with levels in [0, nmax]. Writes d, dmin (f16) and sc[8], mn[8], L[256]. */
static void fit_k_superblock(const float *x, int nmax, uint16_t *dh, uint16_t *dminh,
                             uint8_t sc[8], uint8_t mn[8], uint8_t L[QK_K])
{
    float w[QK_K], fs[8], fm[8], max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < 8; j++) {
        weights_rms_abs(x + 32 * j, w + 32 * j);
        fit_scale_min(32, x + 32 * j, w + 32 * j, nmax, L + 32 * j, &fs[j], &fm[j]);
        max_s = fmaxf(max_s, fs[j]);
        max_m = fmaxf(max_m, fm[j]);
    }
    *dh = f32_to_f16(max_s / 63.0f);
    *dminh = f32_to_f16(max_m / 63.0f);
    float d = f16_to_f32(*dh), dmin = f16_to_f32(*dminh);
    uint8_t cand[32];
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        int rs = d > 0.0f ? (int)lrintf(fs[j] / d) : 0;
        int rm = dmin > 0.0f ? (int)lrintf(fm[j] / dmin) : 0;
        float best = INFINITY;
        for (int a = rs - 1; a <= rs + 1; a++) {
            for (int b = rm - 1; b <= rm + 1; b++) {
                if (a < 0 || a > 63 || b < 0 || b > 63)
                    continue;
                float sd = d * (float)a, sm = dmin * (float)b;
                fit_levels_affine(32, xs, nmax, sd, sm, cand);
                float e = fit_err_affine(32, xs, w + 32 * j, cand, sd, sm);
                if (e < best) {
                    best = e;
                    sc[j] = (uint8_t)a;
                    mn[j] = (uint8_t)b;
                    memcpy(L + 32 * j, cand, 32);
                }
            }
        }
    }
}

/* Inverse of quant_k_scale_min. */
static void pack_scale_min(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[12])
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= sc[j] & 63;
            s[j + 4] |= mn[j] & 63;
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

void quant_quant_q4_k(const float *x, struct block_q4_k *b, int64_t nb)
{
    uint8_t sc[8], mn[8], L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        fit_k_superblock(x, 15, &b[i].d, &b[i].dmin, sc, mn, L);
        pack_scale_min(sc, mn, b[i].scales);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

void quant_quant_q5_k(const float *x, struct block_q5_k *b, int64_t nb)
{
    uint8_t sc[8], mn[8], L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        fit_k_superblock(x, 31, &b[i].d, &b[i].dmin, sc, mn, L);
        pack_scale_min(sc, mn, b[i].scales);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                b[i].qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                b[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
        }
    }
}

/* ---- Q6_K quantisation ---- */

void quant_quant_q6_k(const float *x, struct block_q6_k *b, int64_t nb)
{
    float w[16], fs[16];
    int8_t L[QK_K], cand[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float xm = 0.0f; /* signed sub-block scale of largest magnitude */
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++)
                w[l] = x[16 * j + l] * x[16 * j + l];
            fs[j] = fit_scale_sym(16, x + 16 * j, w, -32, 31, L + 16 * j);
            if (fabsf(fs[j]) > fabsf(xm))
                xm = fs[j];
        }
        /* the extreme sub-block scale codes to −128, the full int8 range */
        b[i].d = f32_to_f16(xm / -128.0f);
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            const float *xs = x + 16 * j;
            for (int l = 0; l < 16; l++)
                w[l] = xs[l] * xs[l];
            int r = d != 0.0f ? (int)lrintf(fs[j] / d) : 0;
            float best = INFINITY;
            for (int a = r - 1; a <= r + 1; a++) {
                if (a < -128 || a > 127)
                    continue;
                fit_levels_sym(16, xs, -32, 31, d * (float)a, cand);
                float e = fit_err_sym(16, xs, w, cand, d * (float)a);
                if (e < best) {
                    best = e;
                    b[i].scales[j] = (int8_t)a;
                    memcpy(L + 16 * j, cand, 16);
                }
            }
        }
        quant_q6_k_pack_levels(L, &b[i]);
    }
}

void quant_q6_k_pack_levels(const int8_t L[QK_K], struct block_q6_k *b)
{
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            const int8_t *Lh = L + 128 * h;
            int q1 = Lh[l] + 32, q2 = Lh[l + 32] + 32, q3 = Lh[l + 64] + 32;
            int q4 = Lh[l + 96] + 32;
            b->ql[64 * h + l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            b->ql[64 * h + l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
            b->qh[32 * h + l] =
                (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

/* ---- Q8_K activations ---- */

void quant_quant_q8_k(const float *x, struct block_q8_k *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = d;
        for (int j = 0; j < QK_K; j++)
            b[i].qs[j] = (int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}
