/*
 * transcode.h — weight rows rewritten in a stored type that a backend computes with, for the
 * types it does not (the CUDA kernels handle F32, F16, BF16, Q8_0, Q4_K and Q6_K, the CPU's
 * also Q4_0 and Q5_K; Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS have no kernels at all). model_load.c
 * transcodes each such matrix once when the model is loaded for that backend, so the plans,
 * the kernels and the reference path of that model all see the same values.
 *
 *   Q4_0 -> Q8_0  exactly: each block keeps its f16 scale d, and its levels q − 8 (−8..7) become
 *                 int8 values; d·(q − 8) is the same product in both formats. 34 bytes a
 *                 block instead of 18.
 *   Q5_0 -> Q8_0  exactly, the same way (levels q − 16, −16..15); IQ4_NL too (its 16 int8
 *                 levels are Q8_0 values).
 *   Q3_K -> Q6_K  exactly: the same d, each 16-element sub-block's scale sc − 32 as Q6_K's int8
 *                 scale, levels −4..3 as Q6_K's −32..31 (210 bytes a super-block, not 110).
 *   other -> F16  every other dequantisable type: each value as quant_dequantize_row gives it,
 *                 rounded to the nearest f16 (ties to even): within 2^-11 of the value (relative;
 *                 2^-25 absolute below 2^-14), where Q5_K's own step is ~2^-5 of a sub-block's
 *                 range. 2 bytes a value.
 */
#ifndef QWENRT_QUANT_TRANSCODE_H
#define QWENRT_QUANT_TRANSCODE_H

#include <stdbool.h>
#include <stdint.h>

#include "format/dtype.h"

/* The type `from` is transcoded to: QR_Q8_0 for Q4_0, Q5_0 and IQ4_NL, QR_Q6_K for Q3_K, QR_F16 for
 * any other type quant_dequantize_row handles, QR_DTYPE_INVALID for a type it does not. */
enum qr_dtype transcode_target(enum qr_dtype from);

/* n_rows rows of K elements at src (type from, rows back to back) rewritten at dst as type
 * transcode_target(from). false (nothing written) when from cannot be transcoded or K is not a
 * whole number of from's blocks. */
bool transcode_rows(enum qr_dtype from, const void *src, void *dst, int64_t K, int64_t n_rows);

#endif
