/*
 * lm_screen.cuh — the generation loops' LM head read through an 8-bit copy (lm_screen.cu).
 *
 * A greedy step needs the argmax of the logits, not the logits. For a 16-bit LM head (Qwen3-0.6B
 * BF16: 311 MB a token; Qwen3.5-0.8B BF16: 508 MB, a fifth of its token) the screen reads an
 * 8-bit copy instead (Q8_0's blocks of 32 with an f16 scale, the activations in 8 bits too),
 * which gives every row an approximate logit a_j with a proven bound |a_j - l_j| <= B on its
 * distance from the exact one l_j. Only the rows with a_j >= max a - 2B can hold the exact
 * argmax; their exact logits (the 16-bit rows, f32 sums) are computed and the largest wins, ties
 * to the lowest index as launch_argmax. The token is the argmax of exact logits, whatever the
 * bound lets through: a loose bound costs time (more rows read exactly), never the answer.
 * The sampled loop takes the m best instead of the argmax: every row whose approximate logit is
 * within 2B of a lower bound on the m-th largest is computed exactly (each of the exact m best
 * is among them), and the m best of those rows are ranked and drawn from in the same launch,
 * as topk.cu does for a whole row.
 *
 * The bound, per token, with x the normalised activation and x~ its 8-bit form:
 *   B = |x| * E + (|x~ - x| + g' * |x~|) * W
 *   E = max_j (|e_j| + g_K * |w_j|), e_j = s q_j - w_j the copy's error on row j
 *   W = max_j |s q_j|, g_K = K * 2^-24 and g' = (K / 32 + 8) * 2^-24 (the f32 sums' rounding)
 * (Cauchy-Schwarz on each of the three parts of a_j - l_j), each term rounded up by 0.1%.
 * E and W are measured once when the copy is made; |x| and |x~ - x| each token.
 */
#ifndef QWENRT_BACKEND_CUDA_LM_SCREEN_CUH
#define QWENRT_BACKEND_CUDA_LM_SCREEN_CUH

#include "backend/cuda/cuda_internal.cuh"

#define LM_SCREEN_MAX_K 8192 /* columns the staging's shared memory holds */
#define LM_SCREEN_PICK_STAMPS (3 * 128 + 4) /* the pick's phase clocks (lm_screen.cu) */

struct lm_screen_copy; /* the 8-bit copy and its bound's constants: one per weights copy */
struct lm_screen;      /* a session's screen over a copy: its own scratch and statistics */

/* The LM head step's device arguments: its input (the residual, normalised here as the fused
 * norm + GEMV does: x * (1 / rms) * norm_w), the exact rows, and the greedy loop's outputs
 * (as launch_argmax: ids[0] the token; with step, out_ids[*step] too, then *step and *pos0
 * advance). */
struct lm_screen_args {
    const float *h;
    const float *norm_w;
    float eps;
    const void *w; /* [N] rows of row_bytes, dtype QR_F32, QR_F16 or QR_BF16 */
    int32_t dtype;
    int64_t row_bytes;
    int32_t *ids, *pos0, *out_ids, *step;
    bool pdl;
    unsigned long long *stamps; /* NULL; else [LM_SCREEN_PICK_STAMPS] the pick's phase clocks
                                 * (lm_screen.cu's PICK_STAMPS: a measurement) */
};

/* Whether the screen takes an LM head of N rows of K elements of dtype (dense 16- or 32-bit
 * rows at w, K a multiple of 32 up to LM_SCREEN_MAX_K) reading the activation h. Not a Q6_K
 * head (Q4_K_M and Q5_K_M files): measured slower than gemvq's, and gemvq's 8-bit x gives
 * other logits than the exact pass's f32 x (docs/perf-log.md, session 56). */
bool lm_screen_applies(int32_t dtype, int32_t N, int32_t K, int64_t row_bytes, const void *w, const float *h,
                       const float *norm_w);

/* Makes the 8-bit copy of the rows at w on the device (on stream s, which it synchronises) and
 * measures E and W. *out is NULL (with QWENRT_OK) when the bound is not finite (rows with Inf or
 * NaN, or beyond f16's range): the plain LM head then serves. The copy is only read after this,
 * so the sessions of one weights copy share it (device_weights.cu, weights_screen_copy). allocs:
 * the count of the session that makes it (cuda_options.allocs), or NULL, for its whole life. */
qwenrt_status lm_screen_copy_build(const void *w, int32_t dtype, int32_t N, int32_t K, int64_t row_bytes,
                                   struct cuda_alloc_count *allocs, cudaStream_t s, struct lm_screen_copy **out,
                                   struct qwenrt_error *err);
void lm_screen_copy_free(struct lm_screen_copy *c);
const void *lm_screen_copy_rows(const struct lm_screen_copy *c); /* the rows it was made from */

/* A session's screen over copy c (which must outlive it): the buffers one token's screen and
 * pick write (~13 bytes a row), zeroed statistics, counted in allocs (the session's, or NULL). */
qwenrt_status lm_screen_attach(const struct lm_screen_copy *c, struct cuda_alloc_count *allocs, cudaStream_t s,
                               struct lm_screen **out, struct qwenrt_error *err);
/* A screen with a copy of its own (both above; the copy is freed with it): for the tests. */
qwenrt_status lm_screen_build(const void *w, int32_t dtype, int32_t N, int32_t K, int64_t row_bytes,
                              cudaStream_t s, struct lm_screen **out, struct qwenrt_error *err);
void lm_screen_free(struct lm_screen *sc);

/* One greedy pick: two launches (the screen over the copy, then the exact rows and the pick). */
cudaError_t launch_lm_screen(const struct lm_screen *sc, const struct lm_screen_args *a, cudaStream_t s);

/* The sampled loop's form: the m best rows by exact logit / temperature (ties: the lower id),
 * as launch_topk ranks a whole row, into top_ids / top_vals (the exact logits), best first;
 * with sp, the draw from them (sample.cuh: the token to ids[0], and with step, out_ids[*step],
 * then *step and *pos0 advance, as launch_topk's draw). The logits row [N] gets the exact logit
 * of every row read exactly and keeps its old values elsewhere. Two launches; m from 1 to
 * lm_screen_best_limit (the screen's blocks, whose maxima bound the m-th largest from below;
 * at most TOPK_MAX_M), and sp->top_k == m. */
struct lm_screen_sampled {
    int32_t m;
    float temperature;
    float *logits;
    int32_t *top_ids;
    float *top_vals;
    const struct cuda_sample_params *sp; /* NULL: rank only */
};
cudaError_t launch_lm_screen_sampled(const struct lm_screen *sc, const struct lm_screen_args *a,
                                     const struct lm_screen_sampled *smp, cudaStream_t s);
int32_t lm_screen_best_limit(const struct lm_screen *sc);

/* Picks made and rows computed exactly since the copy was made (one synchronous copy). */
qwenrt_status lm_screen_counts(const struct lm_screen *sc, int64_t *picks, int64_t *rows,
                               struct qwenrt_error *err);

/* Where the copy, its scales, the approximate logits and the scratch lie (device addresses). */
void lm_screen_buffers(const struct lm_screen *sc, uint64_t addr[4]);

/* The bound's constants E and W (see above), and the copy's bytes. */
void lm_screen_constants(const struct lm_screen *sc, float *E, float *W, int64_t *bytes);

#endif
