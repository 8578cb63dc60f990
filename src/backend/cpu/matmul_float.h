/*
 * matmul_float.h — the fast CPU matmul variants for float weights (F32, F16, BF16), and the
 * helpers they share. Registered in matmul.c's `variants` table; see matmul.h for the maths.
 *
 * Each ISA has its own file (matmul_avx512.c, matmul_avx2.c, matmul_portable.c) whose kernels
 * carry target attributes, so the build needs no -march flag. Every variant splits the N output
 * rows among a->n_threads OpenMP threads (matmul_parallel_rows) and inside a thread runs either
 * a GEMV path (few tokens: stream each weight row once from memory) or a GEMM path (many tokens:
 * convert a tile of weight rows to f32 once, reuse it across all tokens).
 *
 * Cost model (style rule 17): matmul_float_bytes / matmul_float_flops give what a call moves
 * and computes, for benchmarks.
 */
#ifndef QWENRT_BACKEND_CPU_MATMUL_FLOAT_H
#define QWENRT_BACKEND_CPU_MATMUL_FLOAT_H

#include <stdint.h>

#include "backend/cpu/matmul.h"

/* A kernel computing output rows [n0, n1) of y for all T tokens. */
typedef void (*matmul_rows_fn)(const struct cpu_matmul_args *a, int64_t n0, int64_t n1);

/* Splits [0, N) into chunks whose boundaries are multiples of `align` rows and runs fn over them
 * on min(n_threads, chunks) OpenMP threads (directly, without a parallel region, for one). */
void matmul_parallel_rows(const struct cpu_matmul_args *a, int64_t align, matmul_rows_fn fn);

/* Bytes a call reads and writes (weights once, activations once, outputs once) and its flops. */
double matmul_float_bytes(const struct cpu_matmul_args *a);
double matmul_float_flops(const struct cpu_matmul_args *a);

void matmul_f32_portable(const struct cpu_matmul_args *a);
void matmul_f16_portable(const struct cpu_matmul_args *a);
void matmul_bf16_portable(const struct cpu_matmul_args *a);

void matmul_f32_avx2(const struct cpu_matmul_args *a);
void matmul_f16_avx2(const struct cpu_matmul_args *a);
void matmul_bf16_avx2(const struct cpu_matmul_args *a);

void matmul_f32_avx512(const struct cpu_matmul_args *a);
void matmul_f16_avx512(const struct cpu_matmul_args *a);
void matmul_bf16_avx512(const struct cpu_matmul_args *a);

#endif
