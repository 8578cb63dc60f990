/*
 * matmul.c — the registry of CPU matmul variants and the reference kernel (see matmul.h).
 *
 * Fast variants live in per-ISA files (matmul_avx512.c, ...) and are listed in `variants`
 * below with what they need; cpu_matmul_pick chooses the highest priority variant that can
 * run on this CPU. The reference variant for each dtype is always present.
 */
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_float.h"

#include <string.h>

#include "base/alloc.h"
#include "base/cpu_features.h"
#include "quant/quant.h"

/* y = x · Wᵀ: for each weight row n, dequantise it, then dot it with every token's x. */
void matmul_ref(const struct cpu_matmul_args *a)
{
    float *row = xmalloc((size_t)a->K, sizeof(float));
    if (!row)
        return; /* cannot happen for model sizes; callers size K from validated shapes */
    for (int64_t n = 0; n < a->N; n++) {
        quant_dequantize_row(a->wtype, (const uint8_t *)a->w + (size_t)n * a->w_row_bytes, row, a->K);
        for (int64_t t = 0; t < a->T; t++) {
            const float *x = a->x + t * a->ldx;
            float acc = 0.0f;
            for (int64_t k = 0; k < a->K; k++)
                acc += row[k] * x[k];
            a->y[t * a->ldy + n] = acc;
        }
    }
    xfree(row);
}

static const struct cpu_matmul_variant variants[] = {
    {"matmul.f32.ref", QR_F32, 0, 0, matmul_ref},
    {"matmul.f16.ref", QR_F16, 0, 0, matmul_ref},
    {"matmul.bf16.ref", QR_BF16, 0, 0, matmul_ref},
    {"matmul.f32.portable", QR_F32, 0, 10, matmul_f32_portable},
    {"matmul.f16.portable", QR_F16, 0, 10, matmul_f16_portable},
    {"matmul.bf16.portable", QR_BF16, 0, 10, matmul_bf16_portable},
    {"matmul.f32.avx512", QR_F32, CPU_AVX512F | CPU_AVX2, 30, matmul_f32_avx512},
    {"matmul.f16.avx512", QR_F16, CPU_AVX512F | CPU_AVX2, 30, matmul_f16_avx512},
    {"matmul.bf16.avx512", QR_BF16, CPU_AVX512F | CPU_AVX2, 30, matmul_bf16_avx512},
    {NULL, 0, 0, 0, NULL},
};

const struct cpu_matmul_variant *cpu_matmul_variants(void) { return variants; }

const struct cpu_matmul_variant *cpu_matmul_pick(enum qr_dtype wtype, uint32_t features,
                                                 const char *key)
{
    const struct cpu_matmul_variant *best = NULL;
    for (const struct cpu_matmul_variant *v = variants; v->key; v++) {
        if ((v->cpu_features & features) != v->cpu_features)
            continue;
        if (key) {
            if (strcmp(v->key, key) == 0)
                return v;
            continue;
        }
        if (v->wtype == wtype && (!best || v->priority > best->priority))
            best = v;
    }
    return best;
}
