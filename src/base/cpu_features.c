/*
 * cpu_features.c — run-time CPU feature detection with GCC/Clang builtins (see header).
 */
#include "base/cpu_features.h"

#include <stdio.h>
#include <string.h>

uint32_t cpu_features_detect(void)
{
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        f |= CPU_AVX2; /* its kernels convert f16 with F16C (matmul_avx2.c, attention_avx2.c) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        f |= CPU_AVX512F;
    if ((f & CPU_AVX512F) && __builtin_cpu_supports("avx512vnni"))
        f |= CPU_AVX512VNNI;
    if ((f & CPU_AVX512F) && __builtin_cpu_supports("avx512bf16"))
        f |= CPU_AVX512BF16;
#endif
    return f;
}

void cpu_features_describe(uint32_t features, char *out, int len)
{
    static const struct { uint32_t bit; const char *name; } names[] = {
        {CPU_AVX2, "avx2"}, {CPU_AVX512F, "avx512f"}, {CPU_AVX512VNNI, "avx512vnni"},
        {CPU_AVX512BF16, "avx512bf16"}, {CPU_AVXVNNI, "avxvnni"},
    };
    int pos = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (!(features & names[i].bit) || pos >= len)
            continue;
        pos += snprintf(out + pos, (size_t)(len - pos), "%s%s", pos ? " " : "", names[i].name);
    }
    if (!out[0] && len > 0)
        snprintf(out, (size_t)len, "portable");
}
