/*
 * matmul.h — the CPU matrix products behind every `matmul` op: y = x · Wᵀ.
 *
 *   x: [T][K] f32 activations (row stride ldx), W: [N] rows of K elements stored as wtype
 *   (row stride w_row_bytes, as in the file), y: [T][N] f32 (row stride ldy).
 *   y[t][n] = Σ_k W[n][k] · x[t][k], accumulated in f32 (quantised variants may quantise x
 *   to 8-bit blocks first; their tolerance says so).
 *
 * T = 1 is the decode case (matrix-vector, bandwidth-bound); T > 1 the prefill case
 * (matrix-matrix, compute-bound). Every variant has a stable key "matmul.<wtype>.<impl>"
 * (e.g. matmul.f16.avx512) and is checked against matmul.<wtype>.ref in tests.
 */
#ifndef QWENRT_BACKEND_CPU_MATMUL_H
#define QWENRT_BACKEND_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"

struct cpu_matmul_args {
    float *y;           /* [T][ldy] output */
    const float *x;     /* [T][ldx] input */
    const void *w;      /* [N] rows of K elements of wtype */
    enum qr_dtype wtype;
    int64_t T, K, N;
    int64_t ldx, ldy;   /* row strides of x and y in floats */
    size_t w_row_bytes; /* bytes of one weight row */
    int n_threads;      /* OpenMP threads to use (>= 1) */
};

typedef void (*cpu_matmul_fn)(const struct cpu_matmul_args *a);

struct cpu_matmul_variant {
    const char *key;       /* "matmul.f16.avx512" */
    enum qr_dtype wtype;   /* weight dtype it handles */
    uint32_t cpu_features; /* CPU_* bits it needs (0 = portable) */
    int priority;          /* higher wins among variants that can run */
    cpu_matmul_fn fn;
};

/* All registered variants (reference ones included), NULL-key terminated. */
const struct cpu_matmul_variant *cpu_matmul_variants(void);

/* The best variant for wtype on a CPU with these features, or the one named key when key is
 * non-NULL (NULL when it does not exist or cannot run here). */
const struct cpu_matmul_variant *cpu_matmul_pick(enum qr_dtype wtype, uint32_t features,
                                                 const char *key);

/* true when a variant computes with weights stored as dtype (every type with kernels has a
 * portable one); a model loaded for the CPU has its other matrices (Q4_1, Q5_0, Q5_1, Q2_K,
 * Q3_K, IQ4_NL, IQ4_XS) converted (model_load.c, quant/transcode.h). */
bool cpu_weight_dtype_supported(int32_t dtype);

/* Reference: dequantise each row to f32, plain dot products (fixed order, rows split across
 * threads). For block-quantised weights the activations are first rounded through the type's
 * 8-bit activation format (Q8_0 / Q8_K), as llama.cpp defines these products and the integer
 * kernels compute them. Handles every dtype that quant_dequantize_row supports. */
void matmul_ref(const struct cpu_matmul_args *a);
/* The same with f32 activations for every weight type ("matmul.<q>.exact", never picked by
 * default): the oracle for backends that keep activations in f32, such as CUDA. */
void matmul_ref_exact(const struct cpu_matmul_args *a);

#endif
