/*
 * matmul.c — the registry of CPU matmul variants and the reference kernel (see matmul.h).
 *
 * Fast variants live in per-ISA files (matmul_avx512.c, ...) and are listed in `variants`
 * below with what they need; cpu_matmul_pick chooses the highest priority variant that can
 * run on this CPU. The reference variant for each dtype is always present.
 */
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_quant.h"
#include "backend/cpu/matmul_float.h"

#include <string.h>

#include "base/alloc.h"
#include "base/cpu_features.h"
#include "quant/quant.h"

/* Σ a[k]·b[k] in f32 with eight interleaved partial sums (lane j takes k ≡ j mod 8), added
 * pairwise at the end: a fixed order, independent of threads, that the compiler vectorises. */
static float dot_ref(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0}, tail = 0.0f;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[k + j] * b[k + j];
    for (; k < n; k++)
        tail += a[k] * b[k];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

/* The activations a quantised-weight product multiplies: for block types, each token's x
 * rounded through the type's 8-bit activation format (Q8_0 for Q8_0/Q4_0, Q8_K for the K
 * types) and back, as llama.cpp defines these products; for float weights, x itself.
 * Returns x or a new [T][K] buffer (*owned). */
static const float *reference_activations(const struct cpu_matmul_args *a, float **owned)
{
    *owned = NULL;
    enum qr_dtype act = quant_dot_act(a->wtype);
    size_t row_bytes;
    if (act == QR_DTYPE_INVALID || !dtype_row_bytes(act, a->K, &row_bytes))
        return a->x;
    float *xr = xmalloc((size_t)(a->T * a->K), sizeof(float));
    uint8_t *q = xmalloc(row_bytes, 1);
    if (xr && q)
        for (int64_t t = 0; t < a->T; t++) {
            quant_quantize_row(act, a->x + t * a->ldx, q, a->K);
            quant_dequantize_row(act, q, xr + t * a->K, a->K);
        }
    xfree(q);
    if (!xr)
        return a->x;
    *owned = xr;
    return xr;
}

/* y = x · Wᵀ: for each weight row n, dequantise it, then dot it with every token's x (x
 * rounded as reference_activations says for quantised weights: the fast integer kernels must
 * match this to f32 rounding). Rows are split across threads; each row's result does not
 * depend on the split. */
static void matmul_ref_impl(const struct cpu_matmul_args *a, bool round_activations)
{
    float *owned = NULL;
    const float *x = round_activations ? reference_activations(a, &owned) : a->x;
    int64_t ldx = owned ? a->K : a->ldx;
#pragma omp parallel num_threads(a->n_threads > 0 ? a->n_threads : 1)
    {
        float *row = xmalloc((size_t)a->K, sizeof(float));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < a->N; n++) {
            if (!row)
                continue; /* cannot happen for model sizes; K comes from validated shapes */
            quant_dequantize_row(a->wtype, (const uint8_t *)a->w + (size_t)n * a->w_row_bytes, row, a->K);
            for (int64_t t = 0; t < a->T; t++)
                a->y[t * a->ldy + n] = dot_ref(row, x + t * ldx, a->K);
        }
        xfree(row);
    }
    xfree(owned);
}

void matmul_ref(const struct cpu_matmul_args *a) { matmul_ref_impl(a, true); }

/* The same product with f32 activations for every weight type (no 8-bit rounding of x): the
 * oracle for backends that keep activations in f32 (the CUDA GEMVs) and for quality studies. */
void matmul_ref_exact(const struct cpu_matmul_args *a) { matmul_ref_impl(a, false); }

static const struct cpu_matmul_variant variants[] = {
    {"matmul.f32.ref", QR_F32, 0, 0, matmul_ref},
    {"matmul.f16.ref", QR_F16, 0, 0, matmul_ref},
    {"matmul.bf16.ref", QR_BF16, 0, 0, matmul_ref},
    {"matmul.f32.portable", QR_F32, 0, 10, matmul_f32_portable},
    {"matmul.f16.portable", QR_F16, 0, 10, matmul_f16_portable},
    {"matmul.bf16.portable", QR_BF16, 0, 10, matmul_bf16_portable},
    {"matmul.f32.avx2", QR_F32, CPU_AVX2, 20, matmul_f32_avx2},
    {"matmul.f16.avx2", QR_F16, CPU_AVX2, 20, matmul_f16_avx2},
    {"matmul.bf16.avx2", QR_BF16, CPU_AVX2, 20, matmul_bf16_avx2},
    {"matmul.f32.avx512", QR_F32, CPU_AVX512F | CPU_AVX2, 30, matmul_f32_avx512},
    {"matmul.f16.avx512", QR_F16, CPU_AVX512F | CPU_AVX2, 30, matmul_f16_avx512},
    {"matmul.bf16.avx512", QR_BF16, CPU_AVX512F | CPU_AVX2, 30, matmul_bf16_avx512},
    /* quantised weights: matmul_quant.h (int8 dots on 8-bit quantised activations) */
    {"matmul.q8_0.exact", QR_Q8_0, 0, -1, matmul_ref_exact},
    {"matmul.q4_0.exact", QR_Q4_0, 0, -1, matmul_ref_exact},
    {"matmul.q4_k.exact", QR_Q4_K, 0, -1, matmul_ref_exact},
    {"matmul.q5_k.exact", QR_Q5_K, 0, -1, matmul_ref_exact},
    {"matmul.q6_k.exact", QR_Q6_K, 0, -1, matmul_ref_exact},
    {"matmul.q8_0.ref", QR_Q8_0, 0, 0, matmul_ref},
    {"matmul.q4_0.ref", QR_Q4_0, 0, 0, matmul_ref},
    {"matmul.q4_k.ref", QR_Q4_K, 0, 0, matmul_ref},
    {"matmul.q5_k.ref", QR_Q5_K, 0, 0, matmul_ref},
    {"matmul.q6_k.ref", QR_Q6_K, 0, 0, matmul_ref},
    {"matmul.q8_0.portable", QR_Q8_0, 0, 10, matmul_q8_0_portable},
    {"matmul.q4_0.portable", QR_Q4_0, 0, 10, matmul_q4_0_portable},
    {"matmul.q4_k.portable", QR_Q4_K, 0, 10, matmul_q4_k_portable},
    {"matmul.q5_k.portable", QR_Q5_K, 0, 10, matmul_q5_k_portable},
    {"matmul.q6_k.portable", QR_Q6_K, 0, 10, matmul_q6_k_portable},
    {"matmul.q8_0.avx2", QR_Q8_0, CPU_AVX2, 20, matmul_q8_0_avx2},
    {"matmul.q4_0.avx2", QR_Q4_0, CPU_AVX2, 20, matmul_q4_0_avx2},
    {"matmul.q4_k.avx2", QR_Q4_K, CPU_AVX2, 20, matmul_q4_k_avx2},
    {"matmul.q5_k.avx2", QR_Q5_K, CPU_AVX2, 20, matmul_q5_k_avx2},
    {"matmul.q6_k.avx2", QR_Q6_K, CPU_AVX2, 20, matmul_q6_k_avx2},
    {"matmul.q8_0.avx512vnni", QR_Q8_0, CPU_AVX512VNNI | CPU_AVX2, 30, matmul_q8_0_avx512vnni},
    {"matmul.q4_0.avx512vnni", QR_Q4_0, CPU_AVX512VNNI | CPU_AVX2, 30, matmul_q4_0_avx512vnni},
    {"matmul.q4_k.avx512vnni", QR_Q4_K, CPU_AVX512VNNI | CPU_AVX2, 30, matmul_q4_k_avx512vnni},
    {"matmul.q5_k.avx512vnni", QR_Q5_K, CPU_AVX512VNNI | CPU_AVX2, 30, matmul_q5_k_avx512vnni},
    {"matmul.q6_k.avx512vnni", QR_Q6_K, CPU_AVX512VNNI | CPU_AVX2, 30, matmul_q6_k_avx512vnni},
    {NULL, 0, 0, 0, NULL},
};

const struct cpu_matmul_variant *cpu_matmul_variants(void) { return variants; }

bool cpu_weight_dtype_supported(int32_t dtype)
{
    return cpu_matmul_pick((enum qr_dtype)dtype, 0, NULL) != NULL;
}

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
