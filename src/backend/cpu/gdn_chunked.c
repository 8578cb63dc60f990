/*
 * gdn_chunked.c — Gated DeltaNet core without a token-by-token walk over the prompt:
 * gdn_core.chunked (portable C) and gdn_core.chunked.avx512 (same source, compiled for AVX-512).
 * Same contract as gdn_core_ref (kernels_ref.c); cpu_exec.c registers both above it.
 *
 * Per value head, the prompt is cut into chunks of GDN_CHUNK tokens. With S0 the state before
 * a chunk, G_i = Σ_{l<=i} g_l (cumulative log decay in the chunk, in double) and
 * D[i][s] = exp(G_i − G_s), the delta rule unrolls to (the WY form, solved by substitution):
 *   u_i = β_i (v_i − e^{G_i} S0ᵀk_i) − Σ_{s<i} β_i D[i][s] (k_i·k_s) u_s     (u_i = δ_i)
 *   o_i = e^{G_i} S0ᵀq_i + Σ_{s<=i} D[i][s] (q_i·k_s) u_s
 *   S   = e^{G_n−1} S0 + Σ_s D[n−1][s] k_s u_sᵀ
 * which is the recurrence of gdn_core_ref regrouped: equal up to f32 rounding (tests/
 * test_gdn_chunked.c). Everything but the substitution is matrix products (gemm_acc), whose
 * inner loops run over v (or s) and vectorise. Decays are formed as exp of differences so that
 * no e^{G} is ever divided by (no overflow when G is very negative; underflow to 0 is exact).
 * One token (decode) takes the recurrence itself, with S traversed row by row so the loops run
 * over v: for T = 1 the result is the reference's arithmetic in the same order.
 * Layout: state S [Hv][dk][dv] (row r = key dim); per-head scratch, see head_scratch_floats.
 * Heads run in parallel (OpenMP); each head owns a slice of ex->scratch.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#define GDN_CHUNK 64 /* tokens per chunk */

#define INLINE static inline __attribute__((always_inline))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

struct gdn_args {
    const float *x;       /* conv output [T][wx]: q(Hk*dk) | k(Hk*dk) | v(Hv*dv) */
    const float *b, *a;   /* [T][wb], [T][wa]: beta and alpha logits */
    float *o;             /* [T][wo] output, head j at j*dv */
    const float *dt_bias; /* [Hv] */
    const float *ssm_a;   /* [Hv] -exp(A_log) */
    float *state;         /* [Hv][dk][dv] */
    float *scratch;       /* [Hv][head_scratch] */
    int64_t head_scratch;
    int32_t wx, wb, wa, wo;
    int32_t T, Hk, Hv, dk, dv;
    bool tiled;
};

static int64_t head_scratch_floats(int32_t dk, int32_t dv)
{
    int64_t c = GDN_CHUNK;
    return 3 * c * dk + c * dv + 2 * c * c + 2 * (int64_t)dv;
}

int64_t gdn_chunked_scratch_floats(const struct plan_op *op)
{
    return (int64_t)op->n_v_heads * head_scratch_floats(op->k_dim, op->v_dim);
}

INLINE float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}
INLINE float softplusf(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* x ← x / sqrt(Σx² + 1e-6) · scale, as gdn_core_ref's l2norm then q scaling */
INLINE void l2norm_scaled(float *y, const float *x, int32_t n, float scale, bool do_scale)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int32_t i = 0; i < n; i++)
        y[i] = x[i] * r;
    if (do_scale)
        for (int32_t i = 0; i < n; i++)
            y[i] *= scale;
}

/* 16 floats as one value: GCC/Clang vector extension, lowered to one zmm under TARGET_AVX512
 * and to several narrower registers in the portable build. Unaligned via memcpy. */
typedef float v16f __attribute__((vector_size(64)));

/* Loads and stores as macros: a function passing v16f by value would warn of a 512-bit ABI. */
#define V16_LOAD(v, p) memcpy(&(v), (p), sizeof(v16f))
#define V16_STORE(p, v) memcpy((p), &(v), sizeof(v16f))

/* C[4][W*16] (at column n) += A[4][K] · B[K][W*16]: 4*W accumulators stay in registers. */
#define MICRO(W)                                                                                   \
    INLINE void micro_4x##W(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,     \
                            int32_t ldb, int32_t K)                                                \
    {                                                                                              \
        v16f acc[4][W];                                                                            \
        for (int r = 0; r < 4; r++)                                                                \
            for (int w = 0; w < W; w++)                                                            \
                V16_LOAD(acc[r][w], C + (size_t)r * ldc + 16 * w);                                \
        for (int32_t k = 0; k < K; k++) {                                                          \
            v16f b[W];                                                                             \
            for (int w = 0; w < W; w++)                                                            \
                V16_LOAD(b[w], B + (size_t)k * ldb + 16 * w);                                     \
            for (int r = 0; r < 4; r++) {                                                          \
                float x = A[(size_t)r * lda + k];                                                  \
                for (int w = 0; w < W; w++)                                                        \
                    acc[r][w] += x * b[w];                                                         \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < 4; r++)                                                                \
            for (int w = 0; w < W; w++)                                                            \
                V16_STORE(C + (size_t)r * ldc + 16 * w, acc[r][w]);                                \
    }
MICRO(2)
MICRO(1)
#undef MICRO

/* C[M][N] += A[M][K] · B[K][N]  (row strides lda, ldb, ldc), plain loops over n: what the
 * portable variant uses (64-byte vectors lowered to SSE2 spill and run 4x slower). */
INLINE void gemm_acc_plain(float *restrict C, int32_t ldc, const float *restrict A, int32_t lda,
                           const float *restrict B, int32_t ldb, int32_t M, int32_t K, int32_t N)
{
    for (int32_t r = 0; r < M; r++) {
        float *restrict c0 = C + (size_t)r * ldc;
        for (int32_t k = 0; k < K; k++) {
            const float *restrict b = B + (size_t)k * ldb;
            float x0 = A[(size_t)r * lda + k];
            for (int32_t n = 0; n < N; n++)
                c0[n] += x0 * b[n];
        }
    }
}

/* The same product; with wide (AVX-512 build), blocks of 4 rows x 32 or 16 columns go through
 * the register micro-kernels and only the edges take plain loops. */
INLINE void gemm_acc(float *restrict C, int32_t ldc, const float *restrict A, int32_t lda,
                     const float *restrict B, int32_t ldb, int32_t M, int32_t K, int32_t N,
                     bool wide)
{
    if (!wide) {
        gemm_acc_plain(C, ldc, A, lda, B, ldb, M, K, N);
        return;
    }
    int32_t i = 0, n16 = N & ~15;
    for (; i + 4 <= M; i += 4) {
        int32_t n = 0;
        for (; n + 32 <= N; n += 32)
            micro_4x2(C + (size_t)i * ldc + n, ldc, A + (size_t)i * lda, lda, B + n, ldb, K);
        for (; n < n16; n += 16)
            micro_4x1(C + (size_t)i * ldc + n, ldc, A + (size_t)i * lda, lda, B + n, ldb, K);
    }
    if (n16 < N) /* columns past the last block of 16, in the rows done above */
        gemm_acc_plain(C + n16, ldc, A, lda, B + n16, ldb, i, K, N - n16);
    if (i < M) /* rows past the last block of 4 */
        gemm_acc_plain(C + (size_t)i * ldc, ldc, A + (size_t)i * lda, lda, B, ldb, M - i, K, N);
}

/* One token of head j: the recurrence of gdn_core_ref with loops over v innermost. */
INLINE void recurrent_token(const struct gdn_args *a, float *S, float *w, int32_t t, int32_t j,
                            int32_t kh)
{
    int32_t dk = a->dk, dv = a->dv;
    float q[1024], k[1024]; /* dk <= 1024 (hparams_validate) */
    float *m = w, *delta = w + dv;
    const float *row = a->x + (size_t)t * a->wx;
    l2norm_scaled(q, row + (size_t)kh * dk, dk, 1.0f / sqrtf((float)dk), true);
    l2norm_scaled(k, row + (size_t)a->Hk * dk + (size_t)kh * dk, dk, 1.0f, false);
    const float *v = row + (size_t)2 * a->Hk * dk + (size_t)j * dv;
    float beta = sigmoidf(a->b[(size_t)t * a->wb + j]);
    float decay = expf(a->ssm_a[j] * softplusf(a->a[(size_t)t * a->wa + j] + a->dt_bias[j]));
    float *o = a->o + (size_t)t * a->wo + (size_t)j * dv;
    memset(m, 0, (size_t)dv * sizeof(float));
    for (int32_t r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv;
        for (int32_t c = 0; c < dv; c++) {
            Sr[c] *= decay;
            m[c] += Sr[c] * k[r];
        }
    }
    for (int32_t c = 0; c < dv; c++) {
        delta[c] = beta * (v[c] - m[c]);
        o[c] = 0.0f;
    }
    for (int32_t r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv;
        for (int32_t c = 0; c < dv; c++) {
            Sr[c] += k[r] * delta[c];
            o[c] += Sr[c] * q[r];
        }
    }
}

/* Tokens t0..t0+n-1 (n <= GDN_CHUNK) of head j: the chunked form in the header comment. */
INLINE void chunk(const struct gdn_args *a, float *S, float *w, int32_t t0, int32_t n, int32_t j,
                  int32_t kh, bool wide)
{
    enum { CH = GDN_CHUNK };
    int32_t dk = a->dk, dv = a->dv;
    float *Q = w, *K = Q + (size_t)CH * dk, *Kt = K + (size_t)CH * dk; /* [CH][dk] x2, [dk][CH] */
    float *U = Kt + (size_t)CH * dk, *A = U + (size_t)CH * dv, *P = A + CH * CH; /* U [CH][dv] */
    double G[CH];
    float beta[CH];
    float qscale = 1.0f / sqrtf((float)dk);
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = t0 + i;
        const float *row = a->x + (size_t)t * a->wx;
        l2norm_scaled(Q + (size_t)i * dk, row + (size_t)kh * dk, dk, qscale, true);
        l2norm_scaled(K + (size_t)i * dk, row + (size_t)a->Hk * dk + (size_t)kh * dk, dk, 1.0f,
                      false);
        for (int32_t r = 0; r < dk; r++)
            Kt[(size_t)r * CH + i] = K[(size_t)i * dk + r];
        beta[i] = sigmoidf(a->b[(size_t)t * a->wb + j]);
        cum += (double)(a->ssm_a[j] * softplusf(a->a[(size_t)t * a->wa + j] + a->dt_bias[j]));
        G[i] = cum;
    }
    /* A[i][s] = k_i·k_s, P[i][s] = q_i·k_s for s <= i (rows zero past the diagonal) */
    memset(A, 0, sizeof(float) * CH * CH);
    memset(P, 0, sizeof(float) * CH * CH);
    gemm_acc(A, CH, K, dk, Kt, CH, n, dk, n, wide);
    gemm_acc(P, CH, Q, dk, Kt, CH, n, dk, n, wide);
    for (int32_t i = 0; i < n; i++) {
        for (int32_t s = 0; s <= i; s++) {
            float d = expf((float)(G[i] - G[s]));
            A[i * CH + s] *= beta[i] * d;
            P[i * CH + s] *= d;
        }
        for (int32_t s = i + 1; s < n; s++)
            P[i * CH + s] = 0.0f;
    }
    /* U = K S0, O = Q S0 (the old state) */
    memset(U, 0, sizeof(float) * (size_t)n * dv);
    gemm_acc(U, dv, K, dk, S, dv, n, dk, dv, wide);
    float *O = a->o + (size_t)t0 * a->wo + (size_t)j * dv;
    for (int32_t i = 0; i < n; i++)
        memset(O + (size_t)i * a->wo, 0, (size_t)dv * sizeof(float));
    gemm_acc(O, a->wo, Q, dk, S, dv, n, dk, dv, wide);
    /* u_i = β_i (v_i − e^{G_i} (K S0)_i) − Σ_{s<i} A[i][s] u_s, by forward substitution */
    for (int32_t i = 0; i < n; i++) {
        const float *v = a->x + (size_t)(t0 + i) * a->wx + (size_t)2 * a->Hk * dk + (size_t)j * dv;
        float *u = U + (size_t)i * dv, eg = expf((float)G[i]);
        for (int32_t c = 0; c < dv; c++)
            u[c] = beta[i] * (v[c] - eg * u[c]);
        for (int32_t s = 0; s < i; s++) {
            const float *us = U + (size_t)s * dv;
            float f = A[i * CH + s];
            for (int32_t c = 0; c < dv; c++)
                u[c] -= f * us[c];
        }
        float *o = O + (size_t)i * a->wo;
        for (int32_t c = 0; c < dv; c++)
            o[c] *= eg;
    }
    gemm_acc(O, a->wo, P, CH, U, dv, n, n, dv, wide);
    /* S = e^{G_last} S0 + Σ_s e^{G_last − G_s} k_s u_sᵀ */
    float e_last = expf((float)G[n - 1]);
    for (int32_t s = 0; s < n; s++) {
        float d = expf((float)(G[n - 1] - G[s]));
        for (int32_t r = 0; r < dk; r++)
            Kt[(size_t)r * CH + s] *= d;
    }
    for (size_t i = 0; i < (size_t)dk * dv; i++)
        S[i] *= e_last;
    gemm_acc(S, dv, Kt, CH, U, dv, dk, n, dv, wide);
}

INLINE void head_body(const struct gdn_args *a, int32_t j, bool wide)
{
    int32_t kh = a->tiled ? j % a->Hk : j / (a->Hv / a->Hk);
    float *S = a->state + (size_t)j * a->dk * a->dv;
    float *w = a->scratch + (size_t)j * a->head_scratch;
    if (a->T == 1) {
        recurrent_token(a, S, w, 0, j, kh);
        return;
    }
    for (int32_t t0 = 0; t0 < a->T; t0 += GDN_CHUNK)
        chunk(a, S, w, t0, a->T - t0 < GDN_CHUNK ? a->T - t0 : GDN_CHUNK, j, kh, wide);
}

static void head_generic(const struct gdn_args *a, int32_t j)
{
    head_body(a, j, false);
}
static TARGET_AVX512 void head_avx512(const struct gdn_args *a, int32_t j)
{
    head_body(a, j, true);
}

static void run(const struct plan_op *op, struct cpu_exec *ex,
                void (*head)(const struct gdn_args *, int32_t))
{
    const struct plan *p = ex->plan;
    struct gdn_args a = {
        .x = ex->bufs[op->in],
        .b = ex->bufs[op->in2],
        .a = ex->bufs[op->in3],
        .o = ex->bufs[op->out],
        .dt_bias = op->vec2,
        .ssm_a = op->vec3,
        .state = ex->state->ssm_state[op->layer],
        .scratch = ex->scratch,
        .head_scratch = head_scratch_floats(op->k_dim, op->v_dim),
        .wx = p->bufs[op->in].width,
        .wb = p->bufs[op->in2].width,
        .wa = p->bufs[op->in3].width,
        .wo = p->bufs[op->out].width,
        .T = ex->T,
        .Hk = op->n_k_heads,
        .Hv = op->n_v_heads,
        .dk = op->k_dim,
        .dv = op->v_dim,
        .tiled = op->v_head_tiled,
    };
#pragma omp parallel for num_threads(ex->n_threads) schedule(dynamic, 1)
    for (int32_t j = 0; j < a.Hv; j++)
        head(&a, j);
}

void gdn_core_chunked(const struct plan_op *op, struct cpu_exec *ex)
{
    run(op, ex, head_generic);
}

void gdn_core_chunked_avx512(const struct plan_op *op, struct cpu_exec *ex)
{
    run(op, ex, head_avx512);
}
