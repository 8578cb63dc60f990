/*
 * matmul_quant.h — CPU matmul variants for quantised weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K),
 * registered in matmul.c's `variants` table as matmul.<type>.{portable,avx2,avx512vnni}.
 *
 * All of them run one driver (matmul_quant_run): quantise each token's x to 8-bit blocks
 * (Q8_0 for Q8_0/Q4_0 weights, Q8_K for the K types, with quant_quantize_row, so every ISA sees
 * the same activations), then split the N weight rows among a->n_threads OpenMP threads and
 * call a per-ISA block dot `quant_dot_fn` that dots one weight row with up to QDOT_MAX_NX
 * tokens at once: the weight blocks are unpacked once and reused for each token (prefill),
 * and with one token each weight byte is read once (decode). Integer products per block,
 * scaled to f32 per block.
 */
#ifndef QWENRT_BACKEND_CPU_MATMUL_QUANT_H
#define QWENRT_BACKEND_CPU_MATMUL_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/matmul.h"

#define QDOT_MAX_NX 4 /* tokens per block-dot call */

/* out[j] = Σ_blocks dot(weight row w, activation row xq + j·xq_stride) for j < nx (1..4);
 * nb = blocks in the row; xq holds Q8_0 or Q8_K blocks (see quant_dot_act). */
typedef void (*quant_dot_fn)(int64_t nb, const void *w, const void *xq, size_t xq_stride,
                             int nx, float *out);

/* Activation block type (QR_Q8_0 or QR_Q8_K) for weight type t; QR_DTYPE_INVALID if none. */
enum qr_dtype quant_dot_act(enum qr_dtype t);

/* The driver every variant calls: quantise x, run dot over all rows and tokens. */
void matmul_quant_run(const struct cpu_matmul_args *a, quant_dot_fn dot);

/* ---- tiled driver (the AVX-512 VNNI variants) ----
 * Each token's x is prepared once into an ISA-specific activation row of act_bytes(K) bytes
 * (a multiple of 64; e.g. contiguous int8 values plus separate f32 scales and int16 sums, in
 * an order that matches the weight unpacking); then each thread walks its contiguous range of
 * rows in tiles of QTILE_ROWS_L1 rows, and for each group of up to QTILE_TOKENS tokens calls
 * tile() on up to QTILE_ROWS rows at a time, so unpacked weights are reused across tokens and
 * the activation loads across rows. */
#define QTILE_ROWS 4    /* weight rows per tile() call */
#define QTILE_TOKENS 8  /* tokens per tile() call */
#define QTILE_ROWS_L1 16 /* rows whose weights stay in L1 while the token groups pass */

/* y[t·ldy + r] = dot(weight row r at w + r·w_stride, activation row t at xa + t·xa_stride)
 * for r < nr (1..QTILE_ROWS), t < nt (1..QTILE_TOKENS). */
typedef void (*quant_tile_fn)(int64_t K, const uint8_t *w, size_t w_stride, int nr,
                              const uint8_t *xa, size_t xa_stride, int nt, float *y, int64_t ldy);

struct quant_tiled {
    size_t (*act_bytes)(int64_t K);                         /* activation row size, 64k */
    void (*prep)(const float *x, int64_t K, uint8_t *xa); /* x[K] -> activation row */
    quant_tile_fn tile;
};

void matmul_quant_run_tiled(const struct cpu_matmul_args *a, const struct quant_tiled *q);

/* Bytes a call moves (weights, activations and outputs once) and its flops (2·T·K·N). */
double matmul_quant_bytes(const struct cpu_matmul_args *a);
double matmul_quant_flops(const struct cpu_matmul_args *a);

#define QUANT_VARIANTS(isa)                                                                  \
    void matmul_q8_0_##isa(const struct cpu_matmul_args *a);                                 \
    void matmul_q4_0_##isa(const struct cpu_matmul_args *a);                                 \
    void matmul_q4_k_##isa(const struct cpu_matmul_args *a);                                 \
    void matmul_q5_k_##isa(const struct cpu_matmul_args *a);                                 \
    void matmul_q6_k_##isa(const struct cpu_matmul_args *a);

QUANT_VARIANTS(portable)
QUANT_VARIANTS(avx2)
QUANT_VARIANTS(avx512vnni)

#undef QUANT_VARIANTS

#endif
