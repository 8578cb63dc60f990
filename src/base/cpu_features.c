/*
 * cpu_features.c — run-time CPU feature detection with GCC/Clang builtins (see header).
 */
#include "base/cpu_features.h"

#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29) itself: Clang before 16 does not know "f16c" as a
 * __builtin_cpu_supports name (a compile error, which broke the clang build of make fuzz). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

uint32_t cpu_features_detect(void)
{
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
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
