/*
 * quant.h — element and block formats: dequantise rows to f32, quantise f32 rows into them.
 *
 * Layouts are llama.cpp's byte for byte (see ../shared/docs/gguf-and-quant.md). A row of n
 * elements must hold a whole number of blocks (32 for Q8_0/Q4_0, 256 for the K types).
 */
#ifndef QWENRT_QUANT_QUANT_H
#define QWENRT_QUANT_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "format/dtype.h"

/* dst[0..n) = the n elements at src, as f32. false when t is not supported or n is not a
 * whole number of blocks. */
bool quant_dequantize_row(enum qr_dtype t, const void *src, float *dst, int64_t n);

/* Encodes n f32 values into dst as type t (F32, F16, BF16, and the block types that have a
 * quantiser: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and Q8_K for activations). false when t has no
 * quantiser or n is not a whole number of blocks. */
bool quant_quantize_row(enum qr_dtype t, const float *src, void *dst, int64_t n);

/* true when quant_dequantize_row handles t. */
bool quant_can_dequantize(enum qr_dtype t);

#endif
