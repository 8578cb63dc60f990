/*
 * cpu_features.h — which x86 SIMD extensions this CPU has, detected at run time, so that
 * kernels compiled for several ISAs (via target attributes) pick the best one that can run.
 */
#ifndef QWENRT_BASE_CPU_FEATURES_H
#define QWENRT_BASE_CPU_FEATURES_H

#include <stdint.h>

enum {
    CPU_AVX2 = 1u << 0,       /* with FMA and F16C */
    CPU_AVX512F = 1u << 1,    /* with AVX512BW, DQ, VL */
    CPU_AVX512VNNI = 1u << 2,
    CPU_AVX512BF16 = 1u << 3,
    CPU_AVXVNNI = 1u << 4,
};

/* Bit set of CPU_* flags (0 on non-x86 machines). Pure: reads cpuid each call (cheap). */
uint32_t cpu_features_detect(void);

/* "avx2 avx512f ..." for records; writes at most len bytes. */
void cpu_features_describe(uint32_t features, char *out, int len);

#endif
