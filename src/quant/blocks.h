/*
 * blocks.h — the on-disk block structs of the quantised formats (llama.cpp's layouts, byte for
 * byte; see docs/gguf-and-quant.md) and the per-format row functions behind quant.h.
 *
 * Scales marked f16 are IEEE half bit patterns (little-endian on the x86 hosts we run on).
 * Q8_K is not a storage format: it is the 8-bit activation format the K-quant dot products
 * use (f32 scale, sums of each 16 quants so that mins and offsets cost one multiply per 16).
 * Every struct has a _Static_assert on its size; the layout tests check bytes, not structs.
 */
#ifndef QWENRT_QUANT_BLOCKS_H
#define QWENRT_QUANT_BLOCKS_H

#include <stdint.h>

#define QK8_0 32  /* elements per Q8_0 / Q4_0 block */
#define QK_K 256  /* elements per K-quant super-block */

struct block_q8_0 {
    uint16_t d;       /* f16 scale */
    int8_t qs[QK8_0]; /* x_i = d * qs[i] */
};
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 must be 34 bytes");

struct block_q4_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK8_0 / 2]; /* element j: low nibble of qs[j], element j+16: high nibble */
};
_Static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 must be 18 bytes");

struct block_q4_k {
    uint16_t d;          /* f16 super-scale of the 6-bit sub-block scales */
    uint16_t dmin;       /* f16 super-scale of the 6-bit sub-block mins */
    uint8_t scales[12];  /* 8 x (6-bit scale, 6-bit min), packed (quant_k_scale_min) */
    uint8_t qs[QK_K / 2];/* 4 chunks of 32 bytes: low nibbles sub 2c, high nibbles sub 2c+1 */
};
_Static_assert(sizeof(struct block_q4_k) == 144, "block_q4_k must be 144 bytes");

struct block_q5_k {
    uint16_t d;          /* f16 */
    uint16_t dmin;       /* f16 */
    uint8_t scales[12];  /* as Q4_K */
    uint8_t qh[QK_K / 8];/* 5th bits: bit 2c of qh[l] -> low element l of chunk c, 2c+1 high */
    uint8_t qs[QK_K / 2];/* as Q4_K */
};
_Static_assert(sizeof(struct block_q5_k) == 176, "block_q5_k must be 176 bytes");

struct block_q6_k {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* 16 sub-blocks of 16 */
    uint16_t d;               /* f16, last */
};
_Static_assert(sizeof(struct block_q6_k) == 210, "block_q6_k must be 210 bytes");

struct block_q8_k {
    float d;                  /* f32 scale */
    int8_t qs[QK_K];          /* x_i = d * qs[i] */
    int16_t bsums[QK_K / 16]; /* bsums[j] = sum of qs[16j .. 16j+15] */
};
_Static_assert(sizeof(struct block_q8_k) == 292, "block_q8_k must be 292 bytes");

/* Read-only types (other_quants.c): llama.cpp files use them, qwenrt dequantises them and
 * computes with converted copies (quant/transcode.h). */
struct block_q4_1 {
    uint16_t d, m;         /* f16 scale and offset */
    uint8_t qs[QK8_0 / 2]; /* as Q4_0; x = d·q + m, q in 0..15 */
};
_Static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 must be 20 bytes");

struct block_q5_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qh[4];         /* 5th bits: bit j of the little-endian word -> element j */
    uint8_t qs[QK8_0 / 2]; /* low 4 bits as Q4_0; x = d·(q − 16), q in 0..31 */
};
_Static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 must be 22 bytes");

struct block_q5_1 {
    uint16_t d, m;         /* f16 scale and offset */
    uint8_t qh[4];         /* as Q5_0 */
    uint8_t qs[QK8_0 / 2]; /* as Q5_0; x = d·q + m */
};
_Static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 must be 24 bytes");

struct block_q2_k {
    uint8_t scales[QK_K / 16]; /* sub-block s of 16: scale low nibble, min high nibble */
    uint8_t qs[QK_K / 4];      /* 2-bit levels, see quant_dequant_q2_k */
    uint16_t d, dmin;          /* f16 super-scales; x = d·sc·q − dmin·m, q in 0..3 */
};
_Static_assert(sizeof(struct block_q2_k) == 84, "block_q2_k must be 84 bytes");

struct block_q3_k {
    uint8_t hmask[QK_K / 8]; /* high bits: set means q, clear means q − 4 */
    uint8_t qs[QK_K / 4];    /* low 2 bits, laid out as Q2_K's */
    uint8_t scales[12];      /* 16 6-bit scales, packed (quant_q3_k_scale), offset 32 */
    uint16_t d;              /* f16; x = d·(sc − 32)·q, q in −4..3 */
};
_Static_assert(sizeof(struct block_q3_k) == 110, "block_q3_k must be 110 bytes");

/* IQ4_NL / IQ4_XS: 4-bit indices into a fixed table of 16 int8 levels (quant_iq4_levels). */
struct block_iq4_nl {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK8_0 / 2]; /* indices, nibbles as Q4_0; x = d·levels[q] */
};
_Static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl must be 18 bytes");

struct block_iq4_xs {
    uint16_t d;          /* f16 super-scale */
    uint16_t scales_h;   /* high 2 bits of sub-block b's scale: bits 2b, 2b + 1 */
    uint8_t scales_l[4]; /* low 4 bits: nibble b % 2 of byte b / 2 */
    uint8_t qs[QK_K / 2];/* 8 sub-blocks of 32, each 16 bytes as an IQ4_NL block's */
};                       /* x = d·(ls − 32)·levels[q] */
_Static_assert(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs must be 136 bytes");

extern const int8_t quant_iq4_levels[16];

/* Q4_K/Q5_K packed scales: sub-block j (0..7) -> 6-bit scale *sc and 6-bit min *m. */
static inline void quant_k_scale_min(const uint8_t s[12], int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Row functions; nb = number of blocks. Dequantise writes nb * block elements. */
void quant_dequant_q8_0(const struct block_q8_0 *b, float *y, int64_t nb);
void quant_dequant_q4_0(const struct block_q4_0 *b, float *y, int64_t nb);
void quant_dequant_q4_k(const struct block_q4_k *b, float *y, int64_t nb);
void quant_dequant_q5_k(const struct block_q5_k *b, float *y, int64_t nb);
void quant_dequant_q6_k(const struct block_q6_k *b, float *y, int64_t nb);
void quant_dequant_q8_k(const struct block_q8_k *b, float *y, int64_t nb);
void quant_dequant_q4_1(const struct block_q4_1 *b, float *y, int64_t nb);
void quant_dequant_q5_0(const struct block_q5_0 *b, float *y, int64_t nb);
void quant_dequant_q5_1(const struct block_q5_1 *b, float *y, int64_t nb);
void quant_dequant_q2_k(const struct block_q2_k *b, float *y, int64_t nb);
void quant_dequant_q3_k(const struct block_q3_k *b, float *y, int64_t nb);
void quant_dequant_iq4_nl(const struct block_iq4_nl *b, float *y, int64_t nb);
void quant_dequant_iq4_xs(const struct block_iq4_xs *b, float *y, int64_t nb);
/* The 6-bit scale of IQ4_XS sub-block b (0..7), 0..63 (the offset 32 not yet removed). */
int quant_iq4_xs_scale(const struct block_iq4_xs *x, int b);
/* The 6-bit scale of Q3_K sub-block s (0..15), 0..63 (the offset 32 not yet removed). */
int quant_q3_k_scale(const uint8_t scales[12], int s);
/* The 2-bit field of level i (0..255) of a Q2_K / Q3_K super-block's qs: bits 2j..2j+1 of
 * qs[32h + l], where i = 128h + 32j + l. */
static inline int quant_k2_level(const uint8_t qs[QK_K / 4], int i)
{
    int h = i / 128, j = (i % 128) / 32, l = i % 32;
    return (qs[32 * h + l] >> (2 * j)) & 3;
}

/* Quantisers with scale search (weights): minimise the squared round-trip error. */
void quant_quant_q8_0(const float *x, struct block_q8_0 *b, int64_t nb);
void quant_quant_q4_0(const float *x, struct block_q4_0 *b, int64_t nb);
void quant_quant_q4_k(const float *x, struct block_q4_k *b, int64_t nb);
void quant_quant_q5_k(const float *x, struct block_q5_k *b, int64_t nb);
void quant_quant_q6_k(const float *x, struct block_q6_k *b, int64_t nb);

/* Q6_K's ql / qh from its 256 levels L (−32..31, element order); scales and d untouched. */
void quant_q6_k_pack_levels(const int8_t L[QK_K], struct block_q6_k *b);

/* Activation quantisers (fast, max-abs scale; what the matmul kernels feed integer dots). */
void quant_quant_q8_k(const float *x, struct block_q8_k *b, int64_t nb);
/* Q8_0 activations are quant_quant_q8_0: it is already the plain max-abs rounding. */

#endif
