/*
 * dtype.h — the element types qwenrt stores weights in.
 *
 * The enum values are ggml's type ids, so a GGUF tensor's type field is a qr_dtype as is.
 * Block types (Q8_0, Q4_K, ...) hold block_size elements in type_size bytes; plain types have
 * block_size 1. Safetensors dtypes map onto the same enum (I32/I16/I8/I64/F64 and U8 too).
 */
#ifndef QWENRT_FORMAT_DTYPE_H
#define QWENRT_FORMAT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qr_dtype {
    QR_F32 = 0,
    QR_F16 = 1,
    QR_Q4_0 = 2,
    QR_Q4_1 = 3,
    QR_Q5_0 = 6,
    QR_Q5_1 = 7,
    QR_Q8_0 = 8,
    QR_Q8_1 = 9,
    QR_Q2_K = 10,
    QR_Q3_K = 11,
    QR_Q4_K = 12,
    QR_Q5_K = 13,
    QR_Q6_K = 14,
    QR_Q8_K = 15,
    QR_IQ4_NL = 20,
    QR_IQ4_XS = 23,
    QR_I8 = 24,
    QR_I16 = 25,
    QR_I32 = 26,
    QR_I64 = 27,
    QR_F64 = 28,
    QR_BF16 = 30,
    QR_U8 = 200, /* safetensors only (no ggml id) */
    QR_BOOL = 201, /* safetensors only */
    QR_DTYPE_INVALID = -1,
};

struct qr_dtype_traits {
    const char *name;   /* "f32", "q4_k", ... (lower case, as llama.cpp prints) */
    int32_t block_size; /* elements per block (1 for plain types) */
    int32_t type_size;  /* bytes per block */
};

/* Traits of a dtype; NULL when the id is unknown. */
const struct qr_dtype_traits *dtype_traits(int32_t dtype);

/* Parses "f32", "F32", "bf16", "q4_k", ... ; QR_DTYPE_INVALID when unknown. */
enum qr_dtype dtype_from_name(const char *name);

/* Bytes of a row of n elements; false when n is not a whole number of blocks or overflows. */
bool dtype_row_bytes(enum qr_dtype t, int64_t n, size_t *out);

static inline bool dtype_is_float(enum qr_dtype t)
{
    return t == QR_F32 || t == QR_F16 || t == QR_BF16;
}

#endif
