/*
 * matmul_portable.c — float-weight matmul variants in plain C (matmul.{f32,f16,bf16}.portable)
 * that the compiler vectorises for the baseline ISA, plus the thread splitting and cost model
 * shared by every float variant (matmul_float.h).
 *
 * Layout: a tile of RB weight rows x KB columns is converted to f32 into a stack buffer, then
 * dotted with every token's x (`omp simd` reductions, f32), so each weight byte is read from
 * memory once whatever T is. K is blocked so the tile stays in L1; partial sums of later K
 * blocks are added to y. F16 is converted with a branch-free bit trick (see f16_bits_to_f32)
 * because half.h's branchy converter does not vectorise; it is exact, specials included.
 */
#include <omp.h>
#include <string.h>

#include "backend/cpu/matmul_float.h"

enum {
    RB = 4,   /* weight rows per tile */
    KB = 512, /* columns per tile: RB*KB*4 bytes = 8 KiB of f32 */
};

void matmul_parallel_rows(const struct cpu_matmul_args *a, int64_t align, matmul_rows_fn fn)
{
    int64_t chunks = (a->N + align - 1) / align;
    int64_t nt = a->n_threads < 1 ? 1 : a->n_threads;
    if (nt > chunks)
        nt = chunks;
    if (nt <= 1) {
        fn(a, 0, a->N);
        return;
    }
#pragma omp parallel num_threads((int)nt)
    {
        int64_t i = omp_get_thread_num(), got = omp_get_num_threads();
        int64_t n0 = chunks * i / got * align, n1 = chunks * (i + 1) / got * align;
        if (n1 > a->N)
            n1 = a->N;
        if (n0 < n1)
            fn(a, n0, n1);
    }
}

double matmul_float_bytes(const struct cpu_matmul_args *a)
{
    return (double)a->N * (double)a->w_row_bytes + 4.0 * (double)a->T * (double)(a->K + a->N);
}

double matmul_float_flops(const struct cpu_matmul_args *a)
{
    return 2.0 * (double)a->T * (double)a->N * (double)a->K;
}

/* IEEE half -> f32 without branches: placing exponent and mantissa 13 bits up and multiplying
 * by 2^112 rebiases normals (15 -> 127) and turns subnormals (an f32 denormal times 2^112) into
 * exact normals; the all-ones exponent (inf/NaN) is patched with a select. */
static inline float f16_bits_to_f32(uint16_t h)
{
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13, u;
    float f;
    memcpy(&f, &em, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    u = (h & 0x7c00u) == 0x7c00u ? (em | 0x7f800000u) : u;
    u |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, 4);
    return f;
}

static inline __attribute__((always_inline)) void convert(enum qr_dtype wt, const void *src,
                                                          float *restrict dst, int64_t n)
{
    if (wt == QR_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (wt == QR_F16) {
        const uint16_t *s = src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dst[i] = f16_bits_to_f32(s[i]);
    } else {
        const uint16_t *s = src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(&dst[i], &u, 4);
        }
    }
}

static inline float dot(const float *restrict w, const float *restrict x, int64_t n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < n; k++)
        s += w[k] * x[k];
    return s;
}

/* Output rows [n0, n1) for all tokens, weights of type wt (a constant after inlining). */
static inline __attribute__((always_inline)) void rows_body(const struct cpu_matmul_args *a,
                                                            int64_t n0, int64_t n1,
                                                            enum qr_dtype wt)
{
    _Alignas(64) float tile[RB][KB];
    size_t esz = wt == QR_F32 ? 4 : 2;
    for (int64_t n = n0; n < n1; n += RB) {
        int64_t nr = n1 - n < RB ? n1 - n : RB;
        for (int64_t kb = 0; kb < a->K; kb += KB) {
            int64_t kc = a->K - kb < KB ? a->K - kb : KB;
            for (int64_t r = 0; r < nr; r++) {
                const uint8_t *row = (const uint8_t *)a->w + (size_t)(n + r) * a->w_row_bytes;
                convert(wt, row + (size_t)kb * esz, tile[r], kc);
            }
            for (int64_t t = 0; t < a->T; t++) {
                const float *x = a->x + t * a->ldx + kb;
                float *y = a->y + t * a->ldy + n;
                for (int64_t r = 0; r < nr; r++) {
                    float s = dot(tile[r], x, kc);
                    y[r] = kb ? y[r] + s : s;
                }
            }
        }
    }
}

static void rows_f32(const struct cpu_matmul_args *a, int64_t n0, int64_t n1)
{
    rows_body(a, n0, n1, QR_F32);
}

static void rows_f16(const struct cpu_matmul_args *a, int64_t n0, int64_t n1)
{
    rows_body(a, n0, n1, QR_F16);
}

static void rows_bf16(const struct cpu_matmul_args *a, int64_t n0, int64_t n1)
{
    rows_body(a, n0, n1, QR_BF16);
}

void matmul_f32_portable(const struct cpu_matmul_args *a) { matmul_parallel_rows(a, RB, rows_f32); }
void matmul_f16_portable(const struct cpu_matmul_args *a) { matmul_parallel_rows(a, RB, rows_f16); }
void matmul_bf16_portable(const struct cpu_matmul_args *a)
{
    matmul_parallel_rows(a, RB, rows_bf16);
}
