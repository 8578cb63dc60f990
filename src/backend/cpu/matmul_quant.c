/*
 * matmul_quant.c — the driver of the quantised-weight matmul variants (see matmul_quant.h)
 * and their portable block dots (matmul.<type>.portable).
 *
 * Driver: the activations x[T][K] are quantised into a 64-byte aligned scratch of T rows of
 * Q8_0 or Q8_K blocks; the N weight rows are cut into one contiguous range per thread (static
 * schedule, so a decode thread streams its rows front to back); inside a range, tiles of
 * ROW_TILE rows are walked once per group of QDOT_MAX_NX tokens, so a tile's weights stay in
 * L1/L2 while the token groups pass over them. A failed scratch allocation leaves y untouched
 * (the args interface has no status; model-size K makes it a few KiB per token).
 *
 * matmul_quant_run_tiled (the AVX-512 VNNI variants of Q8_0 and the K types) is the same split
 * with an ISA-specific activation row per token (prep) and a tile() of up to 4 rows x 8 tokens;
 * its threads split rows in multiples of QTILE_ROWS and prepare the tokens of a prefill.
 *
 * Portable dots decode a weight block into int8 levels and integer sub-block scales, then do
 * plain integer dot products per token (the compiler may vectorise them for the baseline ISA).
 */
#include "backend/cpu/matmul_quant.h"

#include <omp.h>
#include <string.h>

#include "base/alloc.h"
#include "base/half.h"
#include "format/dtype.h"
#include "quant/blocks.h"
#include "quant/quant.h"

enum { ROW_TILE = 16 }; /* weight rows per tile: 16 Q4_K rows of K=1024 are 9 KiB */

enum qr_dtype quant_dot_act(enum qr_dtype t)
{
    switch (t) {
    case QR_Q8_0:
    case QR_Q4_0:
        return QR_Q8_0;
    case QR_Q4_K:
    case QR_Q5_K:
    case QR_Q6_K:
        return QR_Q8_K;
    default:
        return QR_DTYPE_INVALID;
    }
}

double matmul_quant_bytes(const struct cpu_matmul_args *a)
{
    return (double)a->w_row_bytes * (double)a->N + 4.0 * (double)a->T * (double)(a->K + a->N);
}

double matmul_quant_flops(const struct cpu_matmul_args *a)
{
    return 2.0 * (double)a->T * (double)a->K * (double)a->N;
}

/* Rows [n0, n1) for all tokens. */
static void run_rows(const struct cpu_matmul_args *a, quant_dot_fn dot, const uint8_t *xq,
                     size_t xq_stride, int64_t nb, int64_t n0, int64_t n1)
{
    float out[QDOT_MAX_NX];
    for (int64_t r0 = n0; r0 < n1; r0 += ROW_TILE) {
        int64_t r1 = r0 + ROW_TILE < n1 ? r0 + ROW_TILE : n1;
        for (int64_t t0 = 0; t0 < a->T; t0 += QDOT_MAX_NX) {
            int nx = a->T - t0 < QDOT_MAX_NX ? (int)(a->T - t0) : QDOT_MAX_NX;
            for (int64_t n = r0; n < r1; n++) {
                dot(nb, (const uint8_t *)a->w + (size_t)n * a->w_row_bytes,
                    xq + (size_t)t0 * xq_stride, xq_stride, nx, out);
                for (int j = 0; j < nx; j++)
                    a->y[(t0 + j) * a->ldy + n] = out[j];
            }
        }
    }
}

void matmul_quant_run(const struct cpu_matmul_args *a, quant_dot_fn dot)
{
    enum qr_dtype act = quant_dot_act(a->wtype);
    const struct qr_dtype_traits *wt = dtype_traits(a->wtype);
    size_t xq_stride;
    if (act == QR_DTYPE_INVALID || !dtype_row_bytes(act, a->K, &xq_stride))
        return; /* matmul.c registers these variants only for their own types */
    int64_t nb = a->K / wt->block_size;
    uint8_t *xq = xalloc_aligned((size_t)a->T, xq_stride);
    if (!xq)
        return;
    int nt = a->n_threads > 1 ? a->n_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (a->T >= 8 && nt > 1)
    for (int64_t t = 0; t < a->T; t++)
        quant_quantize_row(act, a->x + t * a->ldx, xq + (size_t)t * xq_stride, a->K);
    if (nt == 1) {
        run_rows(a, dot, xq, xq_stride, nb, 0, a->N);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t i = omp_get_thread_num(), got = omp_get_num_threads();
            /* contiguous ranges, multiples of ROW_TILE where N allows */
            int64_t tiles = (a->N + ROW_TILE - 1) / ROW_TILE;
            int64_t n0 = tiles * i / got * ROW_TILE, n1 = tiles * (i + 1) / got * ROW_TILE;
            if (n1 > a->N)
                n1 = a->N;
            if (n0 < n1)
                run_rows(a, dot, xq, xq_stride, nb, n0, n1);
        }
    }
    xfree(xq);
}

/* ---- tiled driver ---- */

static void run_tiles(const struct cpu_matmul_args *a, const struct quant_tiled *q,
                      const uint8_t *xa, size_t xs, int64_t n0, int64_t n1)
{
    for (int64_t r0 = n0; r0 < n1; r0 += QTILE_ROWS_L1) {
        int64_t r1 = r0 + QTILE_ROWS_L1 < n1 ? r0 + QTILE_ROWS_L1 : n1;
        for (int64_t t0 = 0; t0 < a->T; t0 += QTILE_TOKENS) {
            int nt = a->T - t0 < QTILE_TOKENS ? (int)(a->T - t0) : QTILE_TOKENS;
            for (int64_t r = r0; r < r1; r += QTILE_ROWS) {
                int nr = r1 - r < QTILE_ROWS ? (int)(r1 - r) : QTILE_ROWS;
                q->tile(a->K, (const uint8_t *)a->w + (size_t)r * a->w_row_bytes,
                        a->w_row_bytes, nr, xa + (size_t)t0 * xs, xs, nt,
                        a->y + t0 * a->ldy + r, a->ldy);
            }
        }
    }
}

void matmul_quant_run_tiled(const struct cpu_matmul_args *a, const struct quant_tiled *q)
{
    size_t xs = q->act_bytes(a->K);
    uint8_t *xa = xalloc_aligned((size_t)a->T, xs);
    if (!xa)
        return;
    int nt = a->n_threads > 1 ? a->n_threads : 1;
    if (a->T < 8 || nt == 1)
        for (int64_t t = 0; t < a->T; t++)
            q->prep(a->x + t * a->ldx, a->K, xa + (size_t)t * xs);
    if (nt == 1) {
        run_tiles(a, q, xa, xs, 0, a->N);
    } else {
#pragma omp parallel num_threads(nt)
        {
            if (a->T >= 8) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < a->T; t++)
                    q->prep(a->x + t * a->ldx, a->K, xa + (size_t)t * xs);
            }
            int64_t i = omp_get_thread_num(), got = omp_get_num_threads();
            int64_t groups = (a->N + QTILE_ROWS - 1) / QTILE_ROWS;
            int64_t n0 = groups * i / got * QTILE_ROWS, n1 = groups * (i + 1) / got * QTILE_ROWS;
            if (n1 > a->N)
                n1 = a->N;
            if (n0 < n1)
                run_tiles(a, q, xa, xs, n0, n1);
        }
    }
    xfree(xa);
}

/* ---- portable block dots ---- */

static int32_t dot_i8(const int8_t *w, const int8_t *x, int n)
{
    int32_t s = 0;
    for (int i = 0; i < n; i++)
        s += (int32_t)w[i] * x[i];
    return s;
}

static void dot_q8_0_portable(int64_t nb, const void *w, const void *xq, size_t xs, int nx,
                              float *out)
{
    const struct block_q8_0 *b = w;
    for (int j = 0; j < nx; j++) {
        const struct block_q8_0 *x = (const void *)((const uint8_t *)xq + (size_t)j * xs);
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i++)
            acc += f16_to_f32(b[i].d) * f16_to_f32(x[i].d) * (float)dot_i8(b[i].qs, x[i].qs, 32);
        out[j] = acc;
    }
}

static void dot_q4_0_portable(int64_t nb, const void *w, const void *xq, size_t xs, int nx,
                              float *out)
{
    const struct block_q4_0 *b = w;
    float acc[QDOT_MAX_NX] = {0};
    int8_t q[32];
    for (int64_t i = 0; i < nb; i++) {
        for (int l = 0; l < 16; l++) {
            q[l] = (int8_t)((b[i].qs[l] & 0xF) - 8);
            q[l + 16] = (int8_t)((b[i].qs[l] >> 4) - 8);
        }
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_0 *x = (const void *)((const uint8_t *)xq + (size_t)j * xs);
            acc[j] += d * f16_to_f32(x[i].d) * (float)dot_i8(q, x[i].qs, 32);
        }
    }
    memcpy(out, acc, (size_t)nx * sizeof(float));
}

/* One Q4_K/Q5_K super-block against Q8_K rows: d·xd·Σ_j sc_j·(q_j·x_j) − dmin·xd·Σ_j m_j·Σx_j. */
static void kdot_scale_min(const int8_t q[256], const uint8_t sc[8], const uint8_t m[8], float d,
                           float dmin, const void *xq, size_t xs, int64_t i, int nx, float *acc)
{
    for (int j = 0; j < nx; j++) {
        const struct block_q8_k *x = (const void *)((const uint8_t *)xq + (size_t)j * xs);
        int32_t s = 0, ms = 0;
        for (int k = 0; k < 8; k++) {
            s += sc[k] * dot_i8(q + 32 * k, x[i].qs + 32 * k, 32);
            ms += m[k] * (x[i].bsums[2 * k] + x[i].bsums[2 * k + 1]);
        }
        acc[j] += x[i].d * (d * (float)s - dmin * (float)ms);
    }
}

static void dot_q4_k_portable(int64_t nb, const void *w, const void *xq, size_t xs, int nx,
                              float *out)
{
    const struct block_q4_k *b = w;
    float acc[QDOT_MAX_NX] = {0};
    int8_t q[256];
    uint8_t sc[8], m[8];
    for (int64_t i = 0; i < nb; i++) {
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = (int8_t)(b[i].qs[32 * c + l] & 0xF);
                q[64 * c + 32 + l] = (int8_t)(b[i].qs[32 * c + l] >> 4);
            }
        }
        for (int k = 0; k < 8; k++)
            quant_k_scale_min(b[i].scales, k, &sc[k], &m[k]);
        kdot_scale_min(q, sc, m, f16_to_f32(b[i].d), f16_to_f32(b[i].dmin), xq, xs, i, nx, acc);
    }
    memcpy(out, acc, (size_t)nx * sizeof(float));
}

static void dot_q5_k_portable(int64_t nb, const void *w, const void *xq, size_t xs, int nx,
                              float *out)
{
    const struct block_q5_k *b = w;
    float acc[QDOT_MAX_NX] = {0};
    int8_t q[256];
    uint8_t sc[8], m[8];
    for (int64_t i = 0; i < nb; i++) {
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                int h = b[i].qh[l] >> (2 * c);
                q[64 * c + l] = (int8_t)((b[i].qs[32 * c + l] & 0xF) | ((h & 1) << 4));
                q[64 * c + 32 + l] = (int8_t)((b[i].qs[32 * c + l] >> 4) | ((h & 2) << 3));
            }
        }
        for (int k = 0; k < 8; k++)
            quant_k_scale_min(b[i].scales, k, &sc[k], &m[k]);
        kdot_scale_min(q, sc, m, f16_to_f32(b[i].d), f16_to_f32(b[i].dmin), xq, xs, i, nx, acc);
    }
    memcpy(out, acc, (size_t)nx * sizeof(float));
}

static void dot_q6_k_portable(int64_t nb, const void *w, const void *xq, size_t xs, int nx,
                              float *out)
{
    const struct block_q6_k *b = w;
    float acc[QDOT_MAX_NX] = {0};
    int8_t q[256];
    for (int64_t i = 0; i < nb; i++) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            int8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                qq[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                qq[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                qq[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                qq[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < nx; j++) {
            const struct block_q8_k *x = (const void *)((const uint8_t *)xq + (size_t)j * xs);
            int32_t s = 0;
            for (int k = 0; k < 16; k++)
                s += b[i].scales[k] * dot_i8(q + 16 * k, x[i].qs + 16 * k, 16);
            acc[j] += d * x[i].d * (float)s;
        }
    }
    memcpy(out, acc, (size_t)nx * sizeof(float));
}

#define VARIANT(t)                                                                           \
    void matmul_##t##_portable(const struct cpu_matmul_args *a)                              \
    {                                                                                        \
        matmul_quant_run(a, dot_##t##_portable);                                             \
    }
VARIANT(q8_0)
VARIANT(q4_0)
VARIANT(q4_k)
VARIANT(q5_k)
VARIANT(q6_k)
