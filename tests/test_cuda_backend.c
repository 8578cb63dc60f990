/*
 * test_cuda_backend.c — the CUDA backend against references (issue 6):
 *   - every op kind, one op at a time, against the CPU reference kernels on random inputs of
 *     awkward sizes (odd widths, 1 and many tokens, every weight dtype, GEMV and GEMM paths,
 *     decode steps after a prefill so the KV cache and DeltaNet state carry over);
 *   - both fixture families end to end on the GPU with the CPU's tolerances (logits at every
 *     prompt position rel err <= 1e-4 and same argmax, each layer's hidden state, the KV cache,
 *     the greedy continuation and its logits), through the public API (fused decode, graphs)
 *     and through cuda_session with every switch off (the unfused twin) and on, token by token
 *     through the decode megakernel and through the decode graph;
 *   - the megakernel against the graph on quantised synth models (Q4_K_M, Q8_0, Q6_K, F16);
 *   - the decode graph's alternatives against its default kernels: gemvq against the first
 *     GEMV kernel, the fused MLP (mlp_fused.cu) against its two launches, the DeltaNet step
 *     split over a cluster per head (gdn_decode.cu) against one block per head, the GEMV with
 *     its rows in shared memory (gemv_smem.cu) against gemv2;
 *   - batched decode of several CUDA sessions (issue 8) against each decoding alone, GEMV and
 *     GEMM sizes; checkpoints of CUDA sessions (snapshot, restore across sessions and
 *     backends, reset);
 *   - sampling on the GPU: the top-m selection against its reference kernel and a host sort,
 *     qwenrt_session_sample against the sampler on the whole row; sample.cu's draw against
 *     the host sampler's, and several sampled steps per graph (session_generate) against
 *     token by token, with the steps past a stop undone (session_generate_keep).
 * When no GPU can be used (or qwenrt is built without CUDA) only test_backend_errors runs: the
 * refusals that happen before any device work (bad cuda_options, bad bench shapes).
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_checks.h"
#include "base/cpu_features.h"
#include "qwenrt.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tools/calibrate.h"
#include "tools/convert.h"
#include "tools/gguf_export.h"
#include "tools/tool_setup.h"
#include "tools/synth.h"

#define LOGITS_REL_TOL 1e-4 /* issue 2/4/6: the CPU's tolerance for f32-computed logits */
#define HIDDEN_REL_TOL 1e-4
#define KV_REL_TOL 1e-4
#define OP_REL_TOL 2e-5     /* one op, f32 both sides: only summation order differs */
#define OP_GEMM_BF16_TOL 3e-5 /* bf16 weights, x split in two bf16 terms (~2^-17 each) */
#define OP_ATTN_TF32_TOL 5e-3 /* attention products in TF32 (inputs rounded to 2^-11) */
#define OP_ATTN_FLASH_TOL 5e-3 /* flash kernel: f16 q, k (2^-11), bf16 p, v (2^-8) */
#define OP_ATTN_KV16_TOL 3e-3  /* the KV cache in f16: k and v rounded to 2^-11 */
#define OP_GEMM_FAST_TOL 5e-3 /* x (and dequantised W) rounded to bf16: 2^-9 per element */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* ------------------------------------------------------------------ one op at a time */

/* A plan under test: embeds that fill the inputs, the op, and a logits op. */
struct op_case {
    struct plan plan;
    struct qr_tensor tensors[8];
    void *data[8];
    int n_tensors;
    float *vecs[4];
    int n_vecs;
    enum qr_dtype logits_dt; /* the tail's logits weights (QR_F32 = 0: an exact model) */
};

/* N random rows of K weights (uniform, times scale) stored as dt: *nbytes bytes, malloc'd.
 * Quantising is the slow part of a case (a 40,001-row Q6_K matrix takes seconds): cases that
 * run one matrix under several options make it once (test_op_gemv_sizes). */
static uint8_t *random_weights(enum qr_dtype dt, int64_t K, int64_t N, float scale, size_t *nbytes)
{
    float *f = malloc((size_t)K * N * sizeof(float));
    for (int64_t i = 0; i < K * N; i++)
        f[i] = frand() * scale;
    size_t row_bytes;
    assert_true(dtype_row_bytes(dt, K, &row_bytes));
    uint8_t *q = malloc(row_bytes * (size_t)N);
    for (int64_t r = 0; r < N; r++)
        assert_true(quant_quantize_row(dt, f + r * K, q + r * row_bytes, K));
    free(f);
    *nbytes = row_bytes * (size_t)N;
    return q;
}

/* The case's next tensor: K x N weights of dtype dt in q (nbytes; the case owns q now). */
static const struct qr_tensor *add_tensor_data(struct op_case *c, enum qr_dtype dt, int64_t K, int64_t N,
                                               uint8_t *q, size_t nbytes)
{
    struct qr_tensor *t = &c->tensors[c->n_tensors];
    c->data[c->n_tensors++] = q;
    memset(t, 0, sizeof(*t));
    t->name = "random", t->dtype = dt, t->n_dims = 2, t->ne[0] = K, t->ne[1] = N;
    t->ne[2] = t->ne[3] = 1, t->data = q, t->nbytes = nbytes;
    return t;
}

static const struct qr_tensor *add_tensor(struct op_case *c, enum qr_dtype dt, int64_t K, int64_t N,
                                          float scale)
{
    size_t nbytes;
    uint8_t *q = random_weights(dt, K, N, scale, &nbytes);
    return add_tensor_data(c, dt, K, N, q, nbytes);
}

static const float *add_vec(struct op_case *c, int64_t n, float base, float scale)
{
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = base + frand() * scale;
    c->vecs[c->n_vecs++] = v;
    return v;
}

static void case_free(struct op_case *c)
{
    for (int i = 0; i < c->n_tensors; i++)
        free(c->data[i]);
    for (int i = 0; i < c->n_vecs; i++)
        free(c->vecs[i]);
    for (int32_t i = 0; i < c->plan.n_ops; i++)
        free((char *)c->plan.ops[i].kernel);
    plan_free(&c->plan);
}

/* Starts a case: buffers named by widths; buffer i (i < n_in) is filled by an embed of a
 * random f32 table with 64 rows; the last buffer is logits (width 16). */
static void case_start(struct op_case *c, const int32_t *widths, int n_bufs, int n_in)
{
    memset(c, 0, sizeof(*c));
    assert_true(plan_init(&c->plan, PHASE_PREFILL));
    static const char *names[] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"};
    for (int i = 0; i < n_bufs; i++)
        plan_add_buf(&c->plan, names[i], widths[i]);
    c->plan.buf_logits = plan_add_buf(&c->plan, "logits", 16);
    c->plan.buf_x = 0;
    for (int i = 0; i < n_in; i++) {
        struct plan_op *op = plan_add_op(&c->plan, OP_EMBED, -1);
        op->out = i;
        op->w = add_tensor(c, QR_F32, widths[i], 64, 1.0f);
        op->dump = "in";
    }
}

/* Ends a case: logits from buffer 0 so that the plan has its usual tail. */
static void case_finish(struct op_case *c)
{
    struct plan_op *op = plan_add_op(&c->plan, OP_LOGITS, -1);
    op->out = c->plan.buf_logits;
    op->in = 0;
    op->w = add_tensor(c, c->logits_dt, c->plan.bufs[0].width, 16, 1.0f);
    assert_false(c->plan.failed);
}

struct captured {
    float *data[64];
    int32_t n, T[64], width[64];
};

static void capture_fn(void *user, const char *name, int32_t layer, const float *data, int32_t T,
                       int32_t width)
{
    struct captured *cap = user;
    (void)name, (void)layer;
    assert_true(cap->n < 64);
    cap->data[cap->n] = malloc((size_t)T * width * sizeof(float));
    memcpy(cap->data[cap->n], data, (size_t)T * width * sizeof(float));
    cap->T[cap->n] = T, cap->width[cap->n] = width;
    cap->n++;
}

static void captured_free(struct captured *cap)
{
    for (int i = 0; i < cap->n; i++)
        free(cap->data[i]);
    cap->n = 0;
}

/* CPU state for the plan's layer 0 (KV cache or DeltaNet state), n_ctx positions. */
static void cpu_state(struct seq_state *st, const struct plan *p, int32_t n_ctx)
{
    memset(st, 0, sizeof(*st));
    st->n_layer = 1, st->n_ctx = n_ctx;
    st->k_cache = calloc(1, sizeof(float *)), st->v_cache = calloc(1, sizeof(float *));
    st->conv_state = calloc(1, sizeof(float *)), st->ssm_state = calloc(1, sizeof(float *));
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if (op->kind == OP_ATTENTION) {
            st->kv_width = op->n_head_kv * op->head_dim;
            st->k_cache[0] = calloc((size_t)n_ctx * st->kv_width, sizeof(float));
            st->v_cache[0] = calloc((size_t)n_ctx * st->kv_width, sizeof(float));
        }
        if (op->kind == OP_GDN_CONV) {
            st->conv_rows = op->conv_k - 1, st->conv_dim = p->bufs[op->out].width;
            st->conv_state[0] = calloc((size_t)st->conv_rows * st->conv_dim, sizeof(float));
        }
        if (op->kind == OP_GDN_CORE) {
            st->ssm_len = (int64_t)op->n_v_heads * op->k_dim * op->v_dim;
            st->ssm_state[0] = calloc((size_t)st->ssm_len, sizeof(float));
        }
    }
}

static void cpu_state_free(struct seq_state *st)
{
    free(st->k_cache[0]), free(st->v_cache[0]), free(st->conv_state[0]), free(st->ssm_state[0]);
    free(st->k_cache), free(st->v_cache), free(st->conv_state), free(st->ssm_state);
}

/* Runs the plan T tokens at pos0 on the CPU, dumping every op with a dump name. */
static void cpu_run(const struct plan *p, struct seq_state *st, const int32_t *ids, int32_t T,
                    int32_t pos0, struct captured *cap)
{
    struct cpu_exec ex;
    memset(&ex, 0, sizeof(ex));
    ex.plan = p, ex.T = T, ex.pos0 = pos0, ex.ids = ids, ex.state = st, ex.n_threads = 2;
    ex.cpu_features = cpu_features_detect(), ex.dump = capture_fn, ex.dump_user = cap;
    for (int32_t i = 0; i < p->n_bufs; i++)
        ex.bufs[i] = calloc((size_t)T * p->bufs[i].width + 16, sizeof(float));
    ex.scratch_len = cpu_exec_scratch_floats(p, st, T) + 1024;
    ex.scratch = calloc((size_t)ex.scratch_len, sizeof(float));
    cpu_op_fn fns[64];
    struct qwenrt_error err = {0};
    assert_int_equal(cpu_bind_plan(p, ex.cpu_features, fns, &err), QWENRT_OK);
    assert_int_equal(cpu_run_plan(&ex, fns, &err), QWENRT_OK);
    for (int32_t i = 0; i < p->n_bufs; i++)
        free(ex.bufs[i]);
    free(ex.scratch);
}

/* Runs the case on both backends: a prefill of T tokens, then `steps` decode steps; compares
 * every dumped buffer. */
static void run_case(struct op_case *c, const char *what, int32_t T, int32_t steps, double tol,
                     const struct cuda_options *opt)
{
    case_finish(c);
    struct plan plans[2] = {c->plan, c->plan};
    plans[PHASE_DECODE].phase = PHASE_DECODE;
    struct qwenrt_error err = {0};
    struct cuda_session *cs = NULL;
    struct cuda_options o = opt ? *opt : cuda_default_options();
    o.graph = false; /* dumps need the op-by-op path anyway */
    int32_t n_ctx = T + steps + 1;
    if (cuda_session_init(plans, n_ctx, &o, &cs, &err) != QWENRT_OK)
        fail_msg("%s: cuda_session_init: %s", what, err.message);
    struct seq_state st;
    cpu_state(&st, &c->plan, n_ctx);
    int32_t *ids = malloc((size_t)(T + steps) * sizeof(int32_t));
    float *logits = malloc((size_t)(T + steps) * 16 * sizeof(float));
    assert_non_null(ids);
    assert_non_null(logits);
    for (int32_t i = 0; i < T + steps; i++)
        ids[i] = (int32_t)((i * 37 + 11) % 64);
    for (int32_t s = 0; s <= steps; s++) {
        int32_t n = s == 0 ? T : 1, pos0 = s == 0 ? 0 : T + s - 1;
        if (s > 0 && steps == 0)
            break;
        struct captured a = {0}, b = {0};
        cpu_run(&c->plan, &st, ids + pos0, n, pos0, &a);
        if (cuda_session_run(cs, ids + pos0, n, pos0, false, logits, capture_fn, &b, &err))
            fail_msg("%s: cuda_session_run: %s", what, err.message);
        assert_int_equal(a.n, b.n);
        for (int i = 0; i < a.n; i++) {
            size_t len = (size_t)a.T[i] * a.width[i];
            for (size_t k = 0; k < len; k++)
                if (isnan(b.data[i][k]) != isnan(a.data[i][k]))
                    fail_msg("%s: NaN mismatch in dump %d at %zu", what, i, k);
            double e = rel_err(b.data[i], a.data[i], len);
            if (!(e <= tol))
                fail_msg("%s (T=%d, step %d, dump %d): relative error %.3g > %.1g", what, n, s, i,
                         e, tol);
        }
        captured_free(&a);
        captured_free(&b);
    }
    cuda_session_free(cs);
    cpu_state_free(&st);
    case_free(c);
    free(ids);
    free(logits);
}

static const enum qr_dtype mm_dtypes[] = {QR_F32, QR_F16, QR_BF16, QR_Q8_0, QR_Q4_K, QR_Q6_K};

static void test_op_matmul(void **state)
{
    (void)state;
    static const int32_t Ts[] = {1, 3, 8, 9, 70};
    /* N = 77, and N = 16 / 5 (DeltaNet's beta and alpha: the products whose two terms stack) */
    static const int32_t Ns[] = {77, 16, 5};
    const size_t n_dt = sizeof(mm_dtypes) / sizeof(mm_dtypes[0]), n_n = sizeof(Ns) / sizeof(Ns[0]);
    for (size_t dn = 0; dn < n_dt * n_n; dn++) {
        enum qr_dtype dt = mm_dtypes[dn / n_n];
        int32_t N = Ns[dn % n_n];
        /* K: 100 takes the paths for rows that are not whole 16-byte chunks, 104 those that
         * are (the tensor-core products need K % 8 == 0) */
        int32_t K = dt == QR_Q4_K || dt == QR_Q6_K ? 512 : (dt == QR_Q8_0 ? 96 : (N <= 32 ? 104 : 100));
        for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
            /* split 0: f32 (dequantised W), 1: bf16x3 stacked, 2: three separate GEMMs,
             * 3: the fast product (x and W in bf16; the model has no F32 matmul), 4 and 5:
             * the fast product with x in two bf16 terms, stacked and separate (the GEMMs' choices:
             * a GEMV takes T <= 8) */
            for (int split = 0; split < 6; split++) {
                if (split >= 3 && (dt == QR_F32 || Ts[ti] <= 8))
                    continue; /* F32 models are never fast; T <= 8 is the GEMV (always f32) */
                struct op_case c;
                int32_t widths[] = {K, N};
                case_start(&c, widths, 2, 1);
                c.logits_dt = split >= 3 ? QR_BF16 : QR_F32;
                struct plan_op *op = plan_add_op(&c.plan, OP_MATMUL, 0);
                op->out = 1, op->in = 0, op->w = add_tensor(&c, dt, K, N, 0.5f), op->dump = "y";
                /* the GEMVs keep x in f32 (the f32-activation reference), except that Q4_K and
                 * Q6_K rows for 2-8 tokens take gemvq_batch_mma.cu in the default precision, x
                 * in 8 bits: the CPU's own product then, x in Q8_K (the same quants) */
                const bool int8 = (dt == QR_Q4_K || dt == QR_Q6_K) && Ts[ti] >= 2 && Ts[ti] <= 8;
                char key[32];
                snprintf(key, sizeof(key), "matmul.%s.exact", dtype_traits(dt)->name);
                op->kernel = dt == QR_F32 || dt == QR_F16 || dt == QR_BF16 || int8 ? NULL : strdup(key);
                struct cuda_options o = cuda_default_options();
                o.gemm_bf16x2 = split > 0;
                o.gemm_stack3 = split == 1 || split == 4;
                o.prefill_bf16 = split >= 3;
                o.prefill_x_terms = split >= 4 ? 2 : 1;
                char what[64];
                snprintf(what, sizeof(what), "matmul.%s N=%d T=%d split=%d",
                         dtype_traits(dt)->name, N, Ts[ti], split);
                /* two terms: x in two bf16 terms, W as stored (BF16) or dequantised into two
                 * bf16 terms (matmul.cu gemm_run_w2): 16 bits each side */
                double tol = split == 3 ? OP_GEMM_FAST_TOL
                             : split >= 4 || (dt == QR_BF16 && split && Ts[ti] > 8) ? OP_GEMM_BF16_TOL
                                                                                   : OP_REL_TOL;
                run_case(&c, what, Ts[ti], 0, tol, &o);
            }
        }
    }
}

/* The variants test_op_gemv_sizes runs each GEMV case under (cuda_options), by index:
 *   0: the first kernel (gemv_v2 off); 1: gemv2 / gemvq (the defaults); 2: gemv_smem on (the
 *   session's shape for one product, 8 warps and 136 KB, x in each warp's registers where K
 *   allows: gemv_smem_xreg, the default); 3: gemv_smem with 16 warps and
 *   160 KB (Qwen3.5's; 16-bit rows only); 4, 5: 2 and 3 with gemv_mma (BF16, T = 1);
 *   quantised rows at T = 1: gemvq blocks of 6: 8 warps of 2 rows with 100 KB reserved,
 *   7: 8 warps of 1 row, 8: 8 warps of 4 rows; LM heads (N >= 32768) 9: one tile per block
 *   (gemvq_head_blocks 0), 10: the loop in one block per multiprocessor (the default has 4);
 *   quantised rows at T = 1, 11: 4-warp blocks of 2 rows per warp with PDL one launch ahead
 *   (calibrate's pick for Qwen3-0.6B Q4_K_M, and Q4_K rows' 2 for Qwen3.5-0.8B); 12: x
 *   quantised to 8 bits (gemvq_int8) from a staged float copy (gemvq_one_pass 0) in the
 *   default shapes, 13: the same in 8-warp blocks of 2
 *   rows with 100 KB reserved and PDL after the wait (these two against the CPU's own
 *   quantised products, which quantise x the same way: the same integer sums); 16-bit rows at
 *   T = 1, 14: gemv_smem with x staged in shared memory (gemv_smem_xreg 0); quantised rows at
 *   T = 1 with x in 8 bits made in one pass from registers (gemvq_one_pass), 15: in gemvq's
 *   int8 shape (8 warps of 2 rows), 16: in 4-warp blocks of 2 rows, against the CPU's own
 *   quantised products like 12 and 13. Rows at T > 1 take gemv_batch.cu (16-bit) or
 *   gemvq_batch.cu (quantised) from variant 2 on (0 and 1 turn them off). */
#define GEMV_VARIANTS 17
#define GEMV_VARIANT_INT8(v) ((v) == 12 || (v) == 13 || (v) == 15 || (v) == 16)

/* Whether variant v applies to rows of dt, N of them, at T tokens. */
static bool gemv_variant_applies(enum qr_dtype dt, int32_t N, int32_t T, int v)
{
    bool sixteen = dt == QR_BF16 || dt == QR_F16;
    if (N > 4096 && T > 1)
        return false; /* the big-N rows are gemvq's (T = 1); the CPU reference is slow */
    if (v >= 4 && v < 6 && (dt != QR_BF16 || T > 1))
        return false;
    if (v >= 6 && v < 14 && (dtype_is_float(dt) || T > 1))
        return false;
    if (v >= 9 && v < 11 && N < 32768)
        return false;
    if (v == 14)
        return sixteen && T == 1;
    if (v >= 15)
        return !dtype_is_float(dt) && T == 1;
    return v != 3 || sixteen;
}

static struct cuda_options gemv_variant_options(int v)
{
    struct cuda_options o = cuda_default_options();
    o.gemv_v2 = v > 0, o.gemv_smem = v >= 2, o.gemv_mma = v >= 4;
    o.gemv_batch = v >= 2; /* 0 and 1 keep the first kernel and gemv2 for T > 1 */
    if (v == 3 || v == 5)
        o.gemv_smem_warps = 16, o.gemv_smem_kb = 160;
    if (v >= 6 && v < 9) { /* gemvq's other block shapes: the same rows, so the same results */
        o.gemv_smem = false;
        o.gemvq_warps = 8, o.gemvq_rows = v == 6 ? 2 : v == 7 ? 1 : 4;
        o.gemvq_smem_kb = v == 6 ? 100 : 0;
    }
    if (v >= 9 && v < 11) /* the LM head's loop off, or in one block per multiprocessor */
        o.gemvq_head_blocks = v == 9 ? 0 : 1;
    if (v == 11)
        o.gemvq_rows = 2, o.pdl = true, o.gemvq_launch = 2;
    o.gemvq_int8 = GEMV_VARIANT_INT8(v) ? 1 : -1; /* float x in the others (their reference's) */
    if (GEMV_VARIANT_INT8(v))
        o.gemv_smem = false;
    if (v == 13)
        o.gemvq_warps = 8, o.gemvq_rows = 2, o.gemvq_smem_kb = 100, o.pdl = true, o.gemvq_launch = 2;
    if (v == 14)
        o.gemv_smem = true, o.gemv_smem_xreg = 0;
    /* 12 and 13: the staged 8-bit x (float copy, norm pass, quantise pass), which shapes
     * without the one-pass form (1 or 4 rows per warp) still take; 15, 16: the one pass */
    o.gemvq_one_pass = v >= 15;
    if (v == 16) /* a shape option set: gemvq's 4-warp blocks, not its int8 shape */
        o.gemvq_rows = 2;
    return o;
}

/* Proof that variant v of the case runs the kernel it is meant to (before it runs). */
static void check_gemv_variant_kernel(enum qr_dtype dt, int32_t K, int32_t N, int32_t T, int v,
                                      const struct cuda_options *o)
{
    bool sixteen = dt == QR_BF16 || dt == QR_F16;
    if (v == 4) { /* the tensor cores where K splits over the warps of a tile in steps of 64
                   * (K % 128 up to 1024, K % 256 above) */
        bool splits = K % (K <= 1024 ? 128 : 256) == 0;
        assert_int_equal(cuda_gemv_mma_takes(N, K), splits);
    }
    if (v == 2 && T == 1 && sixteen) { /* x in registers: up to 4 chunks of 8 per lane (K <= 1024), 8 (K <= 2048) */
        int32_t chunks = (K / 8 + 31) / 32, want = chunks <= 4 ? 4 : chunks <= 8 ? 8 : 0;
        assert_int_equal(cuda_gemv_smem_xreg_chunks(dt, N, K), want);
    }
    if ((v >= 6 && v < 14) || v >= 15) { /* these shapes take every case the default gemvq takes (K = 1024, 2048,
                   * 3072, 3584; Q6_K at 3584 too, whose 2,940-byte rows start 4 bytes past a copy
                   * unit every other row: gq_copy_row) */
        bool takes = cuda_gemvq_blocks(dt, N, K, 0, 0, 0) > 0;
        assert_int_equal(takes, K == 1024 || K == 2048 || K == 3072 || K == 3584);
        int32_t blocks = cuda_gemvq_blocks(dt, N, K, o->gemvq_warps, o->gemvq_rows, o->gemvq_smem_kb);
        if (takes != (blocks > 0))
            fail_msg("gemvq %s K=%d N=%d v2=%d: grid of %d", dtype_traits(dt)->name, K, N, v, (int)blocks);
    }
    if (v == 2 && T == 1 && sixteen)
        assert_true(cuda_gemv_smem_takes(dt, N, K));
    if (v >= 2 && T > 1) /* 16-bit rows in whole 16-byte chunks (gemv_batch); quantised rows in
                          * whole 256-element spans (gemvq_batch) */
        assert_int_equal(cuda_gemv_batch_takes(dt, N, K, T),
                         sixteen ? K % 8 == 0 : dtype_is_float(dt) ? false : K % 256 == 0);
    if (v == 2 && !sixteen)
        assert_false(cuda_gemv_smem_takes(dt, N, K));
}

/* gemv_batch.cu (2-8 tokens, 16-bit rows), gemvq_batch.cu (quantised rows) and the plain
 * reference GEMV (gemv_kernel) on random cases of awkward sizes against a double-precision sum on
 * the host: every form the batched decode step launches — a fused RMS norm, several segments
 * (q|k|v; rows of a warp or block across a segment's end), SwiGLU's gate and up, the residual
 * added (GEMV_ACCUM), 4 rows per block (2 per warp for quantised rows) from 4,096 rows on, one
 * chunk per row (K = 8), Q6_K rows that start on 2-byte boundaries, Q4_K_M's q|k|v of Q4_K and
 * Q6_K segments in one launch. */
/* A token's x (K floats) as an 8-bit case takes it (c->int8): RMS-normalised in floats when
 * c->norm_w, quantised to Q8_K blocks by the CPU's own quant_quant_q8_k (Q8_0 rows: Q8_0 blocks,
 * quant_quant_q8_0) and made floats again, into xn. */
static void gemv_case_q8k(const struct cuda_gemv_case *c, const float *x, double *xn)
{
    int64_t nb = c->K / 256;
    float *xf = malloc((size_t)c->K * sizeof(float));
    struct block_q8_k *b = malloc((size_t)nb * sizeof(*b));
    assert_non_null(xf);
    assert_non_null(b);
    float ss = 0.0f;
    for (int32_t k = 0; k < c->K; k++)
        ss += x[k] * x[k];
    float inv = c->norm_w ? 1.0f / sqrtf(ss / (float)c->K + c->eps) : 1.0f;
    for (int32_t k = 0; k < c->K; k++)
        xf[k] = c->norm_w ? x[k] * inv * c->norm_w[k] : x[k];
    if (c->dtype == QR_Q8_0 && !c->mixed) { /* Q8_0 rows take x in Q8_0 blocks */
        struct block_q8_0 *b0 = malloc((size_t)(c->K / 32) * sizeof(*b0));
        assert_non_null(b0);
        quant_quant_q8_0(xf, b0, c->K / 32);
        quant_dequant_q8_0(b0, xf, c->K / 32);
        free(b0);
    } else {
        quant_quant_q8_k(xf, b, nb);
        quant_dequant_q8_k(b, xf, nb);
    }
    for (int32_t k = 0; k < c->K; k++)
        xn[k] = xf[k];
    free(b);
    free(xf);
}

static double gemv_case_ref_err(const struct cuda_gemv_case *c, float *const *y0, float *const *got)
{
    double num = 0, den = 0; /* the relative error of all outputs as one vector (rel_err's) */
    float *wf = malloc((size_t)c->K * sizeof(float));
    double *xn = malloc((size_t)c->K * sizeof(double));
    assert_non_null(wf);
    assert_non_null(xn);
    for (int32_t t = 0; t < c->T; t++) {
        const float *x = c->x + (size_t)t * c->K;
        double ss = 0;
        for (int32_t k = 0; k < c->K; k++)
            ss += (double)x[k] * x[k];
        double inv = c->norm_w ? 1.0 / sqrt(ss / c->K + c->eps) : 1.0;
        for (int32_t k = 0; k < c->K; k++)
            xn[k] = x[k] * inv * (c->norm_w ? c->norm_w[k] : 1.0);
        if (c->int8) /* x as the kernel takes it: normalised in floats, then Q8_K blocks */
            gemv_case_q8k(c, x, xn);
        int outs = c->mode == 2 ? 1 : c->n_seg;
        for (int i = 0; i < outs; i++)
            for (int32_t r = 0; r < c->N[i]; r++) {
                double v[2] = {0, 0};
                for (int p = 0; p < (c->mode == 2 ? 2 : 1); p++) {
                    enum qr_dtype dt = (enum qr_dtype)(c->mixed ? c->seg_dtype[i + p] : c->dtype);
                    size_t rb = 0;
                    assert_true(dtype_row_bytes(dt, c->K, &rb));
                    const uint8_t *row = (const uint8_t *)c->w[i + p] + (size_t)r * rb;
                    assert_true(quant_dequantize_row(dt, row, wf, c->K));
                    for (int32_t k = 0; k < c->K; k++)
                        v[p] += (double)wf[k] * xn[k];
                }
                double want = c->mode == 2 ? v[0] / (1.0 + exp(-v[0])) * v[1] : v[0];
                if (c->mode == 1)
                    want += y0[i][(size_t)t * c->N[i] + r];
                double d = got[i][(size_t)t * c->N[i] + r] - want;
                num += d * d, den += want * want;
            }
    }
    free(wf);
    free(xn);
    return sqrt(num / (den > 0 ? den : 1));
}

/* seg_dt: each segment's dtype (a mixed launch), or NULL: all dt. */
static void check_gemv_batch_mixed(enum qr_dtype dt, int32_t K, int32_t T, int mode, bool norm, int n_seg,
                                   const int32_t *N, const enum qr_dtype *seg_dt)
{
    struct qwenrt_error err = {0};
    struct cuda_gemv_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = dt, c.K = K, c.T = T, c.mode = mode, c.n_seg = n_seg, c.eps = 1e-6f;
    c.mixed = seg_dt != NULL;
    for (int i = 0; seg_dt && i < n_seg; i++)
        c.seg_dtype[i] = seg_dt[i];
    float *x = malloc((size_t)T * K * 4), *g = malloc((size_t)K * 4), *y0[4] = {0}, *yb[4] = {0}, *yr[4] = {0},
          *ym[4] = {0};
    assert_non_null(x);
    assert_non_null(g);
    for (int32_t i = 0; i < T * K; i++)
        x[i] = frand() * 2.0f;
    for (int32_t k = 0; k < K; k++)
        g[k] = 1.0f + 0.5f * frand();
    c.x = x, c.norm_w = norm ? g : NULL;
    size_t nb;
    for (int i = 0; i < n_seg; i++) {
        c.N[i] = N[i];
        c.w[i] = random_weights(seg_dt ? seg_dt[i] : dt, K, N[i], 0.5f, &nb);
        y0[i] = malloc((size_t)T * N[i] * 4), yb[i] = malloc((size_t)T * N[i] * 4), yr[i] = malloc((size_t)T * N[i] * 4);
        ym[i] = malloc((size_t)T * N[i] * 4);
        for (int32_t j = 0; j < T * N[i]; j++)
            y0[i][j] = frand();
    }
    /* BF16 rows of whole 32-element blocks: the tensor cores' form too (gemv_batch_mma.cu);
     * more than 8 tokens: only it (the other kernels take at most 8) */
    const bool mma = dt == QR_BF16 && !seg_dt && K % 32 == 0 && T >= 2;
    assert_true(T <= 8 || mma); /* a case of more tokens must run the only kernel that takes them */
    float **runs[3] = {yb, yr, ym};
    for (int run = T > 8 ? 2 : 0; run < (mma ? 3 : 2); run++) { /* 0: gemv_batch, 1: the reference kernel, 2: mma */
        for (int i = 0; i < n_seg; i++) {
            memcpy(runs[run][i], y0[i], (size_t)T * N[i] * 4);
            c.y[i] = runs[run][i];
        }
        c.mma = run == 2;
        if (cuda_gemv_host(&c, run != 1, &err))
            fail_msg("gemv %s K=%d T=%d mode %d norm %d%s: %s", dtype_traits(dt)->name, K, T, mode, norm,
                     run == 2 ? " (mma)" : "", err.message);
    }
    double eb = T > 8 ? 0.0 : gemv_case_ref_err(&c, y0, yb), er = T > 8 ? 0.0 : gemv_case_ref_err(&c, y0, yr);
    double em = mma ? gemv_case_ref_err(&c, y0, ym) : 0.0;
    if (T > 8)
        printf("gemv_batch_mma bf16 K=%d T=%d mode %d norm %d segs %d (N0 %d): rel err %.3g (only the tensor "
               "cores' form takes %d tokens)\n", K, T, mode, norm, n_seg, N[0], em, T);
    else
        printf("gemv_batch %s%s K=%d T=%d mode %d norm %d segs %d (N0 %d): rel err %.3g (reference kernel %.3g%s%.3g)\n",
               dtype_traits(dt)->name, seg_dt ? " mixed" : "", K, T, mode, norm, n_seg, N[0], eb, er,
               mma ? ", tensor cores " : "", em);
    if (!(eb <= 2e-5) || !(er <= 2e-5) || !(em <= 2e-5))
        fail_msg("gemv_batch %s K=%d T=%d mode %d: rel err %.3g / %.3g / mma %.3g", dtype_traits(dt)->name, K, T,
                 mode, eb, er, em);
    for (int i = 0; i < n_seg; i++) {
        free((void *)c.w[i]);
        free(y0[i]), free(yb[i]), free(yr[i]), free(ym[i]);
    }
    free(x);
    free(g);
}

static void check_gemv_batch_case(enum qr_dtype dt, int32_t K, int32_t T, int mode, bool norm, int n_seg,
                                  const int32_t *N)
{
    check_gemv_batch_mixed(dt, K, T, mode, norm, n_seg, N, NULL);
}

static void test_gemv_batch_kernel(void **st)
{
    (void)st;
    static const int32_t qkv[] = {100, 37, 37}, gu[] = {4099, 4099}, one[] = {77}, four[] = {1, 2, 3, 4},
                         big[] = {4100}, gu_small[] = {45, 45};
    check_gemv_batch_case(QR_BF16, 1032, 3, 0, true, 3, qkv);
    check_gemv_batch_case(QR_F16, 136, 8, 2, true, 2, gu);
    check_gemv_batch_case(QR_BF16, 3072, 5, 1, false, 1, one);
    check_gemv_batch_case(QR_BF16, 8, 2, 0, true, 4, four);
    check_gemv_batch_case(QR_BF16, 2048, 7, 1, true, 1, big);
    check_gemv_batch_case(QR_BF16, 1024, 6, 2, true, 2, gu_small);
    check_gemv_batch_case(QR_F16, 3584, 4, 0, false, 1, one);
    /* the tensor cores' form (gemv_batch_mma.cu; the cases above with K % 32 == 0 run it too):
     * 8 tokens, 16-row tiles cut by the segments' ends; 8 warps a block (fewer than 264 tiles),
     * 4 (from 264), 2 tiles a block (from 528: 8,500 rows) */
    static const int32_t qkv8[] = {2048, 1024, 1024}, huge[] = {8500}, gu8[] = {3072, 3072}, tail[] = {13, 19};
    check_gemv_batch_case(QR_BF16, 1024, 8, 0, true, 3, qkv8);
    check_gemv_batch_case(QR_BF16, 1024, 8, 2, true, 2, gu8);
    check_gemv_batch_case(QR_BF16, 3072, 8, 1, false, 1, one);
    check_gemv_batch_case(QR_BF16, 64, 2, 0, false, 1, huge);
    check_gemv_batch_case(QR_BF16, 96, 3, 1, true, 2, tail);
    /* 9-16 tokens (the batched step of up to 16 sessions): lane g takes tokens g and g + 8 */
    check_gemv_batch_case(QR_BF16, 1024, 16, 0, true, 3, qkv8);
    check_gemv_batch_case(QR_BF16, 1024, 12, 2, true, 2, gu8);
    check_gemv_batch_case(QR_BF16, 3072, 9, 1, false, 1, one);
    check_gemv_batch_case(QR_BF16, 64, 13, 1, true, 1, huge);
    /* quantised rows (gemvq_batch.cu): a row per block below 4,096 rows, 2 from there on (4 from
     * 32,768: test_op_gemv_sizes's LM-head sizes at T = 3 and 8) */
    static const int32_t big2[] = {4099}, mixed_n[] = {4001, 61, 60}, q6_n[] = {33};
    check_gemv_batch_case(QR_Q8_0, 1024, 3, 0, true, 3, qkv);
    check_gemv_batch_case(QR_Q4_K, 1024, 8, 2, true, 2, gu_small);
    check_gemv_batch_case(QR_Q6_K, 3072, 5, 1, false, 1, one);
    check_gemv_batch_case(QR_Q4_K, 256, 2, 0, true, 4, four);
    check_gemv_batch_case(QR_Q6_K, 1024, 7, 0, false, 1, big);
    check_gemv_batch_case(QR_Q8_0, 3584, 4, 1, true, 1, big2);
    check_gemv_batch_case(QR_Q6_K, 256, 6, 1, true, 1, q6_n); /* 210-byte rows: odd rows 2-byte aligned */
    check_gemv_batch_case(QR_Q8_0, 256, 8, 2, false, 2, gu_small); /* one span a row */
    check_gemv_batch_case(QR_Q4_K, 3584, 6, 2, true, 2, gu_small);
    static const enum qr_dtype kqv[] = {QR_Q4_K, QR_Q4_K, QR_Q6_K}, kqv2[] = {QR_Q6_K, QR_Q4_K, QR_Q6_K};
    check_gemv_batch_mixed(QR_Q4_K, 1024, 5, 0, true, 3, qkv, kqv);
    check_gemv_batch_mixed(QR_Q4_K, 1024, 8, 0, true, 3, mixed_n, kqv2); /* 2 rows per warp, across dtypes */
    /* what gemv_batch does not take is refused by name, nothing launched */
    struct qwenrt_error err = {0};
    struct cuda_gemv_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = QR_BF16, c.K = 12, c.T = 2, c.n_seg = 1, c.N[0] = 3; /* K not in 16-byte chunks */
    float x[2 * 96] = {0}, y[6] = {0}; /* the largest case below: T = 2, K = 96, N = 3 */
    uint16_t w[3 * 96] = {0}; /* the largest: K = 48 (refused after upload) */
    c.x = x, c.w[0] = w, c.y[0] = y;
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "gemv_batch"));
    c.K = 48, c.mma = true; /* 16-byte chunks, but not whole 32-element blocks: not the tensor cores' */
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "gemv_batch_mma"));
    c.K = 12, c.mma = false;
    c.mode = 2; /* SwiGLU with one segment */
    assert_int_equal(cuda_gemv_host(&c, false, &err), QWENRT_ERR_INVALID_ARG);
    c.mode = 0, c.dtype = QR_Q8_0, c.K = 96; /* 3 Q8_0 blocks a row: not a whole 256-element span */
    uint8_t q[3 * 102] = {0};
    c.w[0] = q;
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "gemvq_batch"));
    c.dtype = QR_Q4_K, c.K = 100; /* not whole super-blocks */
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_INVALID_ARG);
    c.dtype = QR_Q4_K, c.K = 256, c.mixed = true, c.seg_dtype[0] = QR_Q8_0; /* mixed: Q4_K / Q6_K only */
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_INVALID_ARG);
}

/* One case of gemvq_batch_mma.cu (quantised rows, x in 8 bits, 2-16 tokens) against each token
 * alone through the one-token gemvq in the session's shape (one_token: where gemvq takes the
 * case): the same quantised x, the same integer sums per super-block and the same float order
 * (quant_rows_i8.cuh's canonical order), so bit for bit — what lets a server batch requests
 * without changing their answers. And against the double sum of the dequantised rows and the
 * CPU's Q8_K x (gemv_case_q8k). Without a norm the kernel's quants are the CPU's bit for bit
 * (the same IEEE scale and rounding), so only the order of the float sums differs: tol 5e-6.
 * With a norm the GPU's 1 / rms (rsqrtf, warp-order sums) differs from the host's in the last
 * bits, and now and then a quant lands one step away (an x·id within an ulp of a half): ~3e-4
 * per such flip at these sizes, so tol 2e-3 there. */
static void check_gemvq_int8_case(int32_t K, int32_t T, int mode, bool norm, int n_seg, const int32_t *N,
                                  const enum qr_dtype *seg_dt, double tol, bool one_token)
{
    struct qwenrt_error err = {0};
    struct cuda_gemv_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = seg_dt[0], c.K = K, c.T = T, c.mode = mode, c.n_seg = n_seg, c.eps = 1e-6f, c.mma = c.int8 = true;
    for (int i = 0; i < n_seg; i++)
        c.mixed |= seg_dt[i] != seg_dt[0], c.seg_dtype[i] = seg_dt[i];
    float *x = malloc((size_t)T * K * 4), *g = malloc((size_t)K * 4), *y0[4] = {0}, *y[4] = {0};
    assert_non_null(x);
    assert_non_null(g);
    for (int32_t i = 0; i < T * K; i++)
        x[i] = frand() * 2.0f;
    for (int32_t k = 0; k < K; k++)
        g[k] = 1.0f + 0.5f * frand();
    c.x = x, c.norm_w = norm ? g : NULL;
    size_t nb;
    for (int i = 0; i < n_seg; i++) {
        c.N[i] = N[i];
        c.w[i] = random_weights(seg_dt[i], K, N[i], 0.5f, &nb);
        y0[i] = malloc((size_t)T * N[i] * 4), y[i] = malloc((size_t)T * N[i] * 4);
        for (int32_t j = 0; j < T * N[i]; j++)
            y0[i][j] = y[i][j] = frand();
        c.y[i] = y[i];
    }
    if (cuda_gemv_host(&c, true, &err))
        fail_msg("gemvq_batch_mma K=%d T=%d mode %d: %s", K, T, mode, err.message);
    long differ_pre = 0; /* x quantised once before the product (q_pre): the same bits as staged */
    {
        float *y2[4] = {0};
        for (int i = 0; i < n_seg; i++) {
            y2[i] = malloc((size_t)T * N[i] * 4);
            memcpy(y2[i], y0[i], (size_t)T * N[i] * 4);
            c.y[i] = y2[i];
        }
        c.prequant = true;
        if (cuda_gemv_host(&c, true, &err))
            fail_msg("gemvq_batch_mma with x quantised first, K=%d T=%d mode %d: %s", K, T, mode, err.message);
        c.prequant = false;
        for (int i = 0; i < (mode == 2 ? 1 : n_seg); i++)
            for (int32_t j = 0; j < T * N[i]; j++)
                differ_pre += memcmp(&y[i][j], &y2[i][j], sizeof(float)) != 0;
        for (int i = 0; i < n_seg; i++)
            c.y[i] = y[i], free(y2[i]);
    }
    double e = gemv_case_ref_err(&c, y0, y), e1 = 0;
    long differ = 0;
    if (one_token) { /* each token alone through gemvq, x in 8 bits: the same bits */
        float *y1[4] = {0};
        double num = 0, den = 0;
        for (int i = 0; i < n_seg; i++) {
            y1[i] = malloc((size_t)T * N[i] * 4);
            memcpy(y1[i], y0[i], (size_t)T * N[i] * 4);
            c.y[i] = y1[i];
        }
        if (cuda_gemv_host(&c, false, &err))
            fail_msg("gemvq one token, K=%d mode %d: %s", K, mode, err.message);
        for (int i = 0; i < (mode == 2 ? 1 : n_seg); i++)
            for (int32_t j = 0; j < T * N[i]; j++) {
                double d = (double)y[i][j] - y1[i][j];
                num += d * d, den += (double)y1[i][j] * y1[i][j];
                differ += memcmp(&y[i][j], &y1[i][j], sizeof(float)) != 0;
            }
        for (int i = 0; i < n_seg; i++)
            free(y1[i]);
        e1 = sqrt(num / (den > 0 ? den : 1));
    }
    printf("gemvq_batch_mma %s%s K=%d T=%d mode %d norm %d segs %d (N0 %d): rel err %.3g (tol %.0e); against each "
           "token alone through gemvq %.3g, %ld outputs not bit for bit; x quantised first: %ld not bit for bit\n",
           dtype_traits(seg_dt[0])->name, c.mixed ? " mixed" : "", K, T, mode, norm, n_seg, N[0], e, tol, e1, differ,
           differ_pre);
    if (!(e <= tol) || differ || differ_pre)
        fail_msg("gemvq_batch_mma K=%d T=%d mode %d: rel err %.3g > %.0e, or %ld outputs differ from one token (%.3g), "
                 "or %ld with x quantised first",
                 K, T, mode, e, tol, differ, e1, differ_pre);
    for (int i = 0; i < n_seg; i++) {
        free((void *)c.w[i]);
        free(y0[i]), free(y[i]);
    }
    free(x);
    free(g);
}

/* Q8_0 rows in gemvq_batch_mma.cu (x in Q8_0 blocks, one tensor-core product per block of 32):
 * the shapes of Qwen3-0.6B / Qwen3.5-0.8B Q8_0's batched step — q|k|v as three Q8_0 segments
 * after a norm, o and down with the residual added (K = 2,048, 3,072 with 16 tokens: two groups
 * of 8 columns; 3,584 cut at 77 rows), SwiGLU, an LM head of 32,771 rows — bit for bit each token
 * alone through gemvq (the blocks' terms in the canonical order: gq8_q80_tree, then Q4_K's
 * groups), and K = 256, which gemvq does not take, against the double sum only. */
static void test_gemvq_batch_mma_q8_0(void)
{
    static const enum qr_dtype q8[] = {QR_Q8_0, QR_Q8_0, QR_Q8_0};
    static const int32_t o[] = {1024}, tail[] = {77}, odd[] = {33}, qkv[] = {2048, 1024, 1024}, gu[] = {3072, 3072},
                         gu_small[] = {45, 45}, lm[] = {32771};
    check_gemvq_int8_case(1024, 8, 0, true, 3, qkv, q8, 2e-3, true);
    check_gemvq_int8_case(1024, 3, 0, false, 3, qkv, q8, 5e-6, true);
    check_gemvq_int8_case(2048, 5, 1, false, 1, o, q8, 5e-6, true);
    check_gemvq_int8_case(3072, 16, 1, false, 1, o, q8, 5e-6, true);
    check_gemvq_int8_case(3584, 9, 0, false, 1, tail, q8, 5e-6, true);
    check_gemvq_int8_case(1024, 12, 2, true, 2, gu, q8, 2e-3, true);
    check_gemvq_int8_case(1024, 3, 2, false, 2, gu_small, q8, 5e-6, true);
    check_gemvq_int8_case(256, 2, 0, false, 1, odd, q8, 5e-6, false);
    check_gemvq_int8_case(1024, 8, 0, true, 1, lm, q8, 2e-3, true);
}

/* gemvq_batch_mma.cu on the shapes the batched step of Qwen3-0.6B / Qwen3.5-0.8B Q4_K_M takes and
 * awkward ones: o / down (K = 2048, 3072: 6 warps of 2 super-blocks; 3584: 7 of 2) with the
 * residual added, Q4_K_M's q|k|v of Q4_K and Q6_K segments, SwiGLU on 9-16 tokens (two groups of
 * 8 columns), Q6_K rows on 2-byte boundaries (210-byte rows), tiles cut by the rows' end, an
 * LM-head-sized launch; what it does not take is refused by name. */
static void test_gemvq_batch_mma_kernel(void **st)
{
    (void)st;
    static const enum qr_dtype q4[] = {QR_Q4_K, QR_Q4_K}, q6[] = {QR_Q6_K, QR_Q6_K},
                               kqv[] = {QR_Q4_K, QR_Q4_K, QR_Q6_K}, kqv2[] = {QR_Q6_K, QR_Q4_K, QR_Q6_K};
    static const int32_t o[] = {1024}, tail[] = {77}, odd[] = {33}, qkv[] = {2048, 1024, 1024},
                         qkv2[] = {4000, 64, 48}, gu[] = {3072, 3072}, gu_small[] = {45, 45}, head[] = {20001};
    check_gemvq_int8_case(2048, 5, 1, false, 1, o, q4, 5e-6, true);
    check_gemvq_int8_case(3072, 16, 1, false, 1, o, q6, 5e-6, true);
    check_gemvq_int8_case(3584, 9, 0, false, 1, tail, q4, 5e-6, true);
    check_gemvq_int8_case(3584, 6, 1, false, 1, o, q6, 5e-6, true); /* Qwen3.5-0.8B's Q6_K down */
    check_gemvq_int8_case(256, 2, 0, false, 1, odd, q6, 5e-6, false); /* gemvq: K of 4-14 super-blocks */
    check_gemvq_int8_case(1024, 8, 0, false, 3, qkv, kqv, 5e-6, true);
    check_gemvq_int8_case(1024, 8, 0, true, 3, qkv, kqv, 2e-3, true);
    check_gemvq_int8_case(1024, 13, 0, true, 3, qkv2, kqv2, 2e-3, true);
    check_gemvq_int8_case(1024, 12, 2, true, 2, gu, q4, 2e-3, true);
    check_gemvq_int8_case(1024, 3, 2, true, 2, gu_small, q6, 2e-3, true);
    check_gemvq_int8_case(3584, 4, 2, false, 2, gu_small, q4, 5e-6, false); /* gemvq's SwiGLU: K = 1024 */
    check_gemvq_int8_case(1024, 16, 0, true, 1, head, q6, 2e-3, true);
    static const int32_t lm[] = {32771};
    check_gemvq_int8_case(1024, 8, 0, true, 1, lm, q6, 2e-3, true); /* an LM head: gemvq's looping blocks (from 32,768 rows) */
    test_gemvq_batch_mma_q8_0();
    /* refused: Q8_0 rows of 96 (not whole super-blocks of 256); a mixed launch whose Q6_K rows
     * start inside a tile of 16 */
    struct qwenrt_error err = {0};
    struct cuda_gemv_case c;
    memset(&c, 0, sizeof(c));
    size_t nb;
    float x[2 * 256] = {0}, y0[2 * 100] = {0}, y1[2 * 100] = {0};
    c.K = 96, c.T = 2, c.n_seg = 1, c.N[0] = 3, c.mma = c.int8 = true, c.dtype = QR_Q8_0, c.x = x, c.y[0] = y0;
    c.w[0] = random_weights(QR_Q8_0, 96, 3, 0.5f, &nb);
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "gemvq_batch_mma"));
    free((void *)c.w[0]);
    c.K = 256, c.dtype = QR_Q4_K, c.mixed = true, c.n_seg = 2, c.N[0] = 100, c.N[1] = 3, c.y[1] = y1;
    c.seg_dtype[0] = QR_Q4_K, c.seg_dtype[1] = QR_Q6_K;
    c.w[0] = random_weights(QR_Q4_K, 256, 100, 0.5f, &nb);
    c.w[1] = random_weights(QR_Q6_K, 256, 3, 0.5f, &nb);
    assert_int_equal(cuda_gemv_host(&c, true, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "gemvq_batch_mma"));
    free((void *)c.w[0]);
    free((void *)c.w[1]);
}

/* One run: a matmul case of the weights w (nbytes, copied) under variant v, against the CPU. */
static void run_gemv_variant(enum qr_dtype dt, int32_t K, int32_t N, int32_t T, int v, const uint8_t *w,
                             size_t nbytes)
{
    struct op_case c;
    int32_t widths[] = {K, N};
    case_start(&c, widths, 2, 1);
    struct plan_op *op = plan_add_op(&c.plan, OP_MATMUL, 0);
    uint8_t *copy = malloc(nbytes);
    assert_non_null(copy);
    memcpy(copy, w, nbytes);
    op->out = 1, op->in = 0, op->w = add_tensor_data(&c, dt, K, N, copy, nbytes);
    op->dump = "y";
    /* quantised rows against the reference with f32 activations; those gemvq takes with x in
     * 8 bits (variants 12 and 13 at T = 1) against the CPU's own products, x in Q8_K / Q8_0 */
    bool int8 = GEMV_VARIANT_INT8(v) && T == 1 && cuda_gemvq_blocks(dt, N, K, 0, 0, 0) > 0;
    if (!dtype_is_float(dt) && !int8) {
        char key[32];
        snprintf(key, sizeof(key), "matmul.%s.exact", dtype_traits(dt)->name);
        op->kernel = strdup(key);
    }
    struct cuda_options o = gemv_variant_options(v);
    check_gemv_variant_kernel(dt, K, N, T, v, &o);
    char what[64];
    snprintf(what, sizeof(what), "gemv.%s K=%d N=%d T=%d v2=%d", dtype_traits(dt)->name, K, N, T, v);
    run_case(&c, what, T, 0, OP_REL_TOL, &o);
}

/* The GEMV kernels at the sizes of real models (aligned rows: gemv2 applies to float weights,
 * gemvq to quantised ones at T = 1), under every variant above, against the CPU: T = 1..8
 * tokens, K up to 3072 (T*K*4 > 48 KB falls back); N not a multiple of the 4 rows of a gemvq
 * block; K = 3584 (Qwen3.5-0.8B's down) leaves lanes idle in gemvq's last round; N >= 32768
 * (an LM head) takes four rows per warp and the loop; gemv_smem over grids of one to 282 blocks
 * (N = 5000 and 9000 at K = 1024), halving its warps where the rows would not fit. Each case's
 * matrix is quantised once (a 40,001-row Q6_K matrix takes seconds) and copied into its runs. */
static void test_op_gemv_sizes(void **state)
{
    /* gemv_batch.cu at every T it is built for, 2 or 4 rows per warp (N >= 4096), a last
     * block of rows cut short, one chunk per row (K = 8) and rows of 17 chunks */
    static const struct {
        enum qr_dtype dt;
        int32_t K, N, T;
    } bs[] = {{QR_BF16, 1024, 4100, 2}, {QR_F16, 136, 4099, 5}, {QR_BF16, 3072, 77, 6}, {QR_BF16, 8, 3, 7},
              {QR_F16, 2048, 131, 4}, {QR_BF16, 1024, 33, 8}};
    for (size_t i = 0; i < sizeof(bs) / sizeof(bs[0]); i++) {
        size_t nbytes;
        uint8_t *w = random_weights(bs[i].dt, bs[i].K, bs[i].N, 0.5f, &nbytes);
        run_gemv_variant(bs[i].dt, bs[i].K, bs[i].N, bs[i].T, 2, w, nbytes);
        free(w);
    }
    (void)state;
    static const struct {
        enum qr_dtype dt;
        int32_t K, N;
    } cs[] = {{QR_BF16, 1024, 300}, {QR_BF16, 2048, 130}, {QR_BF16, 3072, 77}, {QR_F16, 1024, 70},
              {QR_F32, 512, 90}, {QR_BF16, 4096, 33}, {QR_BF16, 8, 40}, {QR_Q8_0, 1024, 301},
              {QR_Q8_0, 3072, 33}, {QR_Q4_K, 1024, 77}, {QR_Q4_K, 2048, 130}, {QR_Q6_K, 1024, 70},
              {QR_Q6_K, 3072, 45}, {QR_Q4_K, 1280, 9}, {QR_Q4_K, 3584, 37}, {QR_Q6_K, 3584, 19},
              {QR_Q8_0, 3584, 50}, {QR_Q6_K, 1024, 40001}, {QR_Q8_0, 1024, 32771}, {QR_Q4_K, 1024, 33001},
              {QR_BF16, 1024, 5000}, {QR_BF16, 1024, 9000}, {QR_BF16, 768, 13}, {QR_BF16, 1280, 50},
              {QR_BF16, 3584, 21}, {QR_Q8_0, 128, 1024}, {QR_Q8_0, 384, 128}, {QR_Q8_0, 128, 384},
              {QR_Q8_0, 256, 200}, {QR_Q4_K, 256, 130}, {QR_Q6_K, 512, 64}};
    static const int32_t Ts[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
        size_t nbytes;
        uint8_t *w = random_weights(cs[i].dt, cs[i].K, cs[i].N, 0.5f, &nbytes);
        for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++)
            for (int v = 0; v < GEMV_VARIANTS; v++)
                if (gemv_variant_applies(cs[i].dt, cs[i].N, Ts[ti], v))
                    run_gemv_variant(cs[i].dt, cs[i].K, cs[i].N, Ts[ti], v, w, nbytes);
        free(w);
    }
}

static void test_op_embed(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof(mm_dtypes) / sizeof(mm_dtypes[0]); d++) {
        enum qr_dtype dt = mm_dtypes[d];
        int32_t K = dt == QR_Q4_K || dt == QR_Q6_K ? 768 : 160;
        struct op_case c;
        int32_t widths[] = {16, K};
        case_start(&c, widths, 2, 1);
        struct plan_op *op = plan_add_op(&c.plan, OP_EMBED, -1);
        op->out = 1, op->w = add_tensor(&c, dt, K, 64, 1.0f), op->dump = "e";
        run_case(&c, dtype_traits(dt)->name, 5, 2, 1e-6, NULL);
    }
}

static void test_op_elementwise(void **state)
{
    (void)state;
    int32_t W = 333;
    for (int kind = 0; kind < 4; kind++) {
        struct op_case c;
        int32_t widths[] = {W, W};
        case_start(&c, widths, 2, 2);
        struct plan_op *op = plan_add_op(&c.plan, kind == 0 ? OP_ADD : kind == 1 ? OP_SWIGLU : OP_RMSNORM, 0);
        op->out = 0, op->in = 1, op->dump = "o";
        if (kind >= 2) { /* rmsnorm over the row, or over groups of 37 (heads) */
            op->out = 1, op->in = 0, op->group = kind == 2 ? W : 37, op->eps = 1e-6f;
            op->vec = add_vec(&c, op->group, 1.0f, 0.5f);
            assert_int_equal(W % op->group, 0);
        }
        run_case(&c, kind == 0 ? "add" : kind == 1 ? "swiglu" : "rmsnorm", 7, 2, OP_REL_TOL, NULL);
    }
}

/* q/k norm + RoPE, attention, sigmoid gate: one attention layer, prefill then decode steps,
 * under the options base with the prefill's form (tiled) and the cache's type (kv16) set. */
static void attention_case_with(const struct cuda_options *base, int32_t hd, int32_t n_head, int32_t n_kv,
                                int32_t n_rot, bool gated, int32_t T, int32_t steps, int tiled, bool kv16)
{
    struct cuda_options o = *base;
    o.kv_f16 = kv16;
    o.attn_tiled = tiled == 1;
    o.prefill_bf16 = tiled >= 2;
    o.attn_flash = tiled == 2;
    struct op_case c;
    int32_t qs = gated ? 2 * hd : hd;
    int32_t widths[] = {n_head * qs, n_kv * hd, n_kv * hd, n_head * hd};
    case_start(&c, widths, 4, 3);
    c.logits_dt = tiled >= 2 ? QR_BF16 : QR_F32; /* 2, 3: a 16-bit model (fast prefill) */
    struct plan_op *op = plan_add_op(&c.plan, OP_QK_NORM_ROPE, 0);
    op->out = 0, op->in = 1, op->eps = 1e-6f, op->n_head = n_head, op->n_head_kv = n_kv;
    op->head_dim = hd, op->n_rot = n_rot, op->q_stride = qs, op->rope_theta = 1e6f;
    op->vec = add_vec(&c, hd, 1.0f, 0.3f), op->vec2 = add_vec(&c, hd, 1.0f, 0.3f);
    op->dump = "q";
    op = plan_add_op(&c.plan, OP_ATTENTION, 0);
    op->out = 3, op->in = 0, op->in2 = 1, op->in3 = 2, op->n_head = n_head, op->n_head_kv = n_kv;
    op->head_dim = hd, op->q_stride = qs, op->dump = "att";
    if (gated) {
        op = plan_add_op(&c.plan, OP_SIGMOID_GATE, 0);
        op->out = 3, op->in = 0, op->n_head = n_head, op->head_dim = hd, op->q_stride = qs;
        op->dump = "gated";
    }
    char what[128];
    snprintf(what, sizeof(what), "attention hd=%d heads=%d/%d rot=%d gated=%d tiled=%d%s one_split=%d pipe=%d", hd,
             n_head, n_kv, n_rot, gated, tiled, kv16 ? " kv f16" : "", (int)o.attn_one_split, (int)o.attn_pipe);
    double tol = tiled == 2 ? OP_ATTN_FLASH_TOL : tiled == 3 ? OP_ATTN_TF32_TOL : OP_REL_TOL;
    run_case(&c, what, T, steps, kv16 && tol < OP_ATTN_KV16_TOL ? OP_ATTN_KV16_TOL : tol, &o);
}

static void attention_case(int32_t hd, int32_t n_head, int32_t n_kv, int32_t n_rot, bool gated,
                           int32_t T, int32_t steps, int tiled, bool kv16)
{
    struct cuda_options o = cuda_default_options();
    attention_case_with(&o, hd, n_head, n_kv, n_rot, gated, T, steps, tiled, kv16);
}

static void test_op_attention(void **state)
{
    (void)state;
    /* prefill: per-token kernel, query tiles (exact models: T >= 16 takes the f32 GEMMs),
     * then a 16-bit model's fast prefill: the flash kernel (2) and the TF32 GEMMs (3) */
    for (int tiled = 0; tiled < 4; tiled++) {
        attention_case(64, 4, 2, 64, false, 13, 3, tiled, false);
        attention_case(128, 16, 8, 128, false, 70, 2, tiled, false);
        attention_case(256, 8, 2, 64, true, 33, 3, tiled, false);
        attention_case(128, 6, 3, 32, true, 1, 4, tiled, false);
        attention_case(128, 16, 8, 128, false, 300, 1, tiled, false); /* several K/V tiles */
        attention_case(64, 4, 2, 64, false, 70, 2, tiled, false);     /* flash, head size 64 */
        attention_case(256, 8, 2, 64, true, 300, 1, tiled, false);    /* Qwen3.5's shape: flash, 256 */
        if (tiled >= 2) /* the flash kernel's second launch (> 8 query tiles), reused counters */
            attention_case(128, 8, 2, 128, false, 700, 1, tiled, false);
    }
    /* decode steps deep in the context (four query heads on one KV head at depth 2200: every
     * split in use and merged), one query head per KV head with the output gate, a group of 8 */
    attention_case(64, 4, 1, 64, false, 2200, 2, 1, false);
    attention_case(128, 4, 4, 128, true, 150, 3, 1, false);
    attention_case(128, 16, 2, 128, false, 90, 3, 1, false);
    /* the KV cache in f16 (cuda_options.kv_f16): every prefill form (the f32 GEMMs hand over
     * to the tiled kernel), decode with RoPE in the attention kernel, deep splits */
    for (int tiled = 0; tiled < 4; tiled++) {
        attention_case(128, 16, 8, 128, false, 70, 3, tiled, true);
        attention_case(256, 8, 2, 64, true, 33, 3, tiled, true);
        attention_case(64, 4, 2, 64, false, 13, 2, tiled, true);
    }
    attention_case(64, 4, 1, 64, false, 2200, 2, 1, true);
    /* cuda_options.attn_one_split (default 128: the cases above at positions below 128 take
     * one block per head, two rounds of rows, no merge; at 150 and 2200 the splits): here
     * without it, two splits merged at positions 90-92 */
    struct cuda_options one = cuda_default_options();
    one.attn_one_split = 0;
    attention_case_with(&one, 128, 16, 8, 128, false, 90, 3, 1, false);
    attention_case_with(&one, 128, 16, 8, 128, false, 90, 3, 1, true);
    one.attn_one_split = 4096; /* one split up to 4096: at 2200, 35 rounds of rows in one block */
    attention_case_with(&one, 64, 4, 1, 64, false, 2200, 2, 1, true);
    /* cuda_options.attn_pipe (two rounds of rows in flight, the default): one round and a
     * part (f32 rows 4 per warp: 32 positions a round; f16 8: 64), three and four rounds
     * (70-72, 90-92: the refill of both buffers), the splits at 150 and 2200, the 35 rounds
     * of one split, head sizes 64 and 256 with the gate, and the cluster merge */
    struct cuda_options pipe = cuda_default_options();
    pipe.attn_pipe = 1; /* the default: also set here so that the cases stay if it changes */
    attention_case_with(&pipe, 128, 16, 8, 128, false, 40, 3, 1, false);
    attention_case_with(&pipe, 128, 16, 8, 128, false, 70, 3, 1, false);
    attention_case_with(&pipe, 128, 16, 8, 128, false, 90, 3, 1, true);
    attention_case_with(&pipe, 128, 4, 4, 128, true, 150, 3, 1, false);
    attention_case_with(&pipe, 64, 4, 1, 64, false, 2200, 2, 1, true);
    attention_case_with(&pipe, 256, 8, 2, 64, true, 100, 3, 1, false);
    pipe.attn_one_split = 4096;
    attention_case_with(&pipe, 64, 4, 1, 64, false, 2200, 2, 1, false);
    pipe.attn_one_split = 0, pipe.attn_cluster = 1;
    attention_case_with(&pipe, 128, 16, 8, 128, false, 300, 3, 1, false);
    /* and without it (attn_pipe -1: one round at a time) */
    struct cuda_options nopipe = cuda_default_options();
    nopipe.attn_pipe = -1;
    attention_case_with(&nopipe, 128, 16, 8, 128, false, 70, 3, 1, false);
    attention_case_with(&nopipe, 64, 4, 1, 64, false, 2200, 2, 1, true);
    /* cuda_options.attn_shared_kv (two query heads of a KV head per block): groups of 2, 4 and 8
     * query heads, one split (positions 40-42, 90-92: several rounds), the splits merged pair by
     * pair (150; 2200 deep, every split in use), head sizes 64, 128 and 256 with the gate, both
     * caches; one query head per KV head (4 / 4) falls back to the default kernel */
    struct cuda_options skv = cuda_default_options();
    skv.attn_shared_kv = 1, skv.attn_cluster = -1;
    attention_case_with(&skv, 128, 16, 8, 128, false, 40, 3, 1, false);
    attention_case_with(&skv, 128, 16, 8, 128, false, 90, 3, 1, true);
    attention_case_with(&skv, 128, 16, 8, 128, false, 150, 3, 1, false);
    attention_case_with(&skv, 64, 4, 1, 64, false, 2200, 2, 1, false);
    attention_case_with(&skv, 64, 4, 1, 64, false, 2200, 2, 1, true);
    attention_case_with(&skv, 256, 8, 2, 64, true, 100, 3, 1, false);
    attention_case_with(&skv, 256, 8, 2, 64, true, 300, 2, 1, true);
    attention_case_with(&skv, 128, 16, 2, 128, false, 90, 3, 1, false);
    attention_case_with(&skv, 128, 4, 4, 128, true, 150, 3, 1, false);
    skv.attn_one_split = 0; /* splits from the first positions: empty ones at position 1 */
    attention_case_with(&skv, 128, 16, 8, 128, false, 1, 3, 1, false);
    /* cuda_options.attn_lanes (a row per group of 8 or 16 lanes): one round and a part, several
     * rounds (90-92: both buffers refilled), splits merged (150; 2200 deep, every split in
     * use), head sizes 64, 128 and 256 with the gate, both caches, groups of 1-8 query heads,
     * splits from position 1 (empty ones); 8 lanes with head size 256 falls back to a row per
     * warp */
    for (int lanes = 8; lanes <= 16; lanes += 8) {
        struct cuda_options ln = cuda_default_options();
        ln.attn_lanes = lanes, ln.attn_cluster = -1;
        attention_case_with(&ln, 128, 16, 8, 128, false, 40, 3, 1, false);
        attention_case_with(&ln, 128, 16, 8, 128, false, 90, 3, 1, true);
        attention_case_with(&ln, 128, 4, 4, 128, true, 150, 3, 1, false);
        attention_case_with(&ln, 64, 4, 1, 64, false, 2200, 2, 1, false);
        attention_case_with(&ln, 64, 4, 1, 64, false, 2200, 2, 1, true);
        attention_case_with(&ln, 256, 8, 2, 64, true, 100, 3, 1, false);
        attention_case_with(&ln, 256, 8, 2, 64, true, 300, 2, 1, true);
        attention_case_with(&ln, 128, 16, 2, 128, false, 70, 3, 1, true);
        ln.attn_one_split = 0;
        attention_case_with(&ln, 128, 16, 8, 128, false, 1, 3, 1, false);
    }
    /* cuda_options.attn_stage (the rows staged in shared memory by bulk copies, one block per
     * KV head): a ring of one tile (each refilled after its use) and of four; groups of 1, 2 and
     * 4 query heads (8 falls back to the default kernel), head sizes 64, 128 and 256 with the
     * gate, both caches, one split over one tile and a part (40-42) and several tiles (90-92,
     * 70-72), the splits merged (150; 2200 deep, every split in use), splits from position 1
     * (empty ones, and tiles holding only the current position) */
    for (int stages = 1; stages <= 4; stages += 3) {
        struct cuda_options sg = cuda_default_options();
        sg.attn_stage = stages, sg.attn_cluster = -1;
        attention_case_with(&sg, 128, 16, 8, 128, false, 40, 3, 1, false);
        attention_case_with(&sg, 128, 16, 8, 128, false, 90, 3, 1, true);
        attention_case_with(&sg, 128, 4, 4, 128, true, 150, 3, 1, false);
        attention_case_with(&sg, 64, 4, 1, 64, false, 2200, 2, 1, false);
        attention_case_with(&sg, 64, 4, 1, 64, false, 2200, 2, 1, true);
        attention_case_with(&sg, 256, 8, 2, 64, true, 100, 3, 1, false);
        attention_case_with(&sg, 256, 8, 2, 64, true, 300, 2, 1, true);
        attention_case_with(&sg, 256, 4, 2, 64, true, 70, 3, 1, true);
        attention_case_with(&sg, 128, 16, 2, 128, false, 70, 3, 1, true);
        sg.attn_one_split = 0;
        attention_case_with(&sg, 128, 16, 8, 128, false, 1, 3, 1, false);
    }
}

/* DeltaNet: conv, core, gated norm over one layer's buffers. */
static void deltanet_case(int32_t Hk, int32_t Hv, int32_t dk, int32_t dv, bool tiled, int32_t T,
                          int32_t steps, int par)
{
    struct cuda_options o = cuda_default_options();
    o.gdn_par = par > 0;
    o.gdn_chunked = par == 2;
    struct op_case c;
    int32_t C = 2 * Hk * dk + Hv * dv;
    int32_t widths[] = {C, Hv, Hv, Hv * dv, Hv * dv};
    case_start(&c, widths, 5, 4);
    struct plan_op *op = plan_add_op(&c.plan, OP_GDN_CONV, 0);
    op->out = 0, op->conv_k = 4, op->vec = add_vec(&c, (int64_t)C * 4, 0.0f, 0.5f);
    op->dump = "conv";
    op = plan_add_op(&c.plan, OP_GDN_CORE, 0);
    op->out = 4, op->in = 0, op->in2 = 1, op->in3 = 2, op->n_k_heads = Hk, op->n_v_heads = Hv;
    op->k_dim = dk, op->v_dim = dv, op->v_head_tiled = tiled;
    op->vec2 = add_vec(&c, Hv, 0.5f, 0.5f), op->vec3 = add_vec(&c, Hv, -1.0f, 0.5f);
    op->dump = "core";
    op = plan_add_op(&c.plan, OP_GATED_RMSNORM, 0);
    op->out = 4, op->in = 3, op->vec = add_vec(&c, dv, 1.0f, 0.3f), op->eps = 1e-6f;
    op->n_v_heads = Hv, op->v_dim = dv, op->dump = "norm";
    char what[96];
    snprintf(what, sizeof(what), "deltanet Hk=%d Hv=%d dk=%d dv=%d tiled=%d par=%d", Hk, Hv, dk,
             dv, tiled, par);
    run_case(&c, what, T, steps, OP_REL_TOL, &o);
}

static void test_op_deltanet(void **state)
{
    (void)state;
    /* prefill: recurrent kernel (par 0), the column scan (1), the chunks of 64 tokens (2) */
    for (int par = 0; par < 3; par++) {
        deltanet_case(2, 4, 32, 48, false, 11, 3, par);
        deltanet_case(16, 16, 128, 128, true, 40, 2, par);
        deltanet_case(2, 6, 64, 40, true, 1, 3, par);
        deltanet_case(4, 4, 256, 64, false, 37, 1, par); /* T not a multiple of the conv chunk */
        deltanet_case(2, 2, 64, 32, false, 2, 2, par);   /* T < conv_k - 1: state rows shift */
        /* the scan's shared-memory chunks (2048 / dk tokens): several of them, a partial last
         * one, and value columns that do not fill the last block of 16 */
        deltanet_case(2, 4, 128, 40, false, 53, 2, par);
        deltanet_case(1, 3, 32, 23, true, 150, 1, par);
        /* chunks: two full ones and a 2-token tail; Qwen3.5's head shape over 3 chunks */
        deltanet_case(2, 4, 64, 40, false, 130, 2, par);
        deltanet_case(4, 8, 128, 128, true, 150, 1, par);
    }
}

/* ------------------------------------------------------------------ fixtures end to end */

struct dump_check {
    const struct qr_tensor *ref;
    int32_t T, H, n_checked;
    double worst;
};

static void on_dump(void *user, const char *name, int32_t layer, const float *data, int32_t T,
                    int32_t width)
{
    struct dump_check *c = user;
    int32_t idx = -1, n_layers = (int32_t)c->ref->ne[2] - 1;
    if (!strcmp(name, "embed"))
        idx = 0;
    else if (!strcmp(name, "layer_out") && layer < n_layers - 1)
        idx = layer + 1;
    else if (!strcmp(name, "final_norm"))
        idx = n_layers;
    if (idx < 0 || T != c->T)
        return;
    const float *ref = (const float *)c->ref->data + (size_t)idx * T * width;
    double e = rel_err(data, ref, (size_t)T * width);
    if (e > c->worst)
        c->worst = e;
    printf("  %s.%d: %.3g\n", name, layer, e);
    if (e > HIDDEN_REL_TOL)
        fail_msg("hidden state %s.%d: relative error %.3g", name, layer, e);
    c->n_checked++;
}

/* The fast prefill (QWENRT_PRECISION_DEFAULT, bf16 fixtures): x rounded to bf16 in every
 * product of the prompt. Measured error against the f32 reference: see docs/perf-log.md. */
#define FAST_LOGITS_REL_TOL 2e-2
#define FAST_ARGMAX_MARGIN 0.1 /* argmax must agree where the reference's top two differ by more */
/* Qwen3.5's fast prefill keeps x in two bf16 terms (16 mantissa bits, cuda_options.prefill_x_terms) */
#define FAST2_LOGITS_REL_TOL 2e-3
#define KV16_LOGITS_REL_TOL 1e-3 /* exact products, K and V rounded to f16 (2^-11) in the cache: 1.6-3.0e-4 measured */

/* The default precision's logits tolerance for a fixture, or 0 where its default is exact
 * (f32 weights never take the fast products). */
static double fast_fixture_tol(const char *dir)
{
    if (strstr(dir, "qwen3-tiny-bf16"))
        return FAST_LOGITS_REL_TOL;
    return strstr(dir, "qwen35-tiny-bf16") ? FAST2_LOGITS_REL_TOL : 0.0;
}

/* Same argmax as the reference wherever the reference's margin is above min_margin. */
static void check_argmax(const float *out, const float *ref, int32_t T, int32_t V, double min_margin,
                         const char *what)
{
    for (int32_t t = 0; t < T; t++) {
        const float *r = ref + (size_t)t * V;
        int32_t best = argmax_f(r, V);
        float second = -INFINITY;
        for (int32_t v = 0; v < V; v++)
            if (v != best && r[v] > second)
                second = r[v];
        if (r[best] - second > min_margin && argmax_f(out + (size_t)t * V, V) != best)
            fail_msg("%s: position %d: argmax %d, reference %d (margin %.3g)", what, t,
                     argmax_f(out + (size_t)t * V, V), best, r[best] - second);
    }
}

/* Mode 0: public API with QWENRT_PRECISION_EXACT (megakernel or graph decode, f32-accurate
 * GEMMs). Mode 1: cuda_session, every switch off. Modes 2 and 3 run the prompt one token at a
 * time through the decode path: mode 2 the megakernel (asserted to be in use), mode 3 the fused
 * decode graph with programmatic dependent launch (megakernel off). Mode 4: public API with the
 * default precision: bf16 fixtures within the fast tolerance (no hidden-state or KV checks),
 * f32 fixtures exact (the fast products never apply to F32 weights). */
static void check_fixture(const char *dir, int mode)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/reference.safetensors", dir);
    struct safetensors_file ref;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&ref, path, &err), QWENRT_OK);
    const struct qr_tensor *prompt = ref_tensor(&ref, "prompt_ids"), *logits = ref_tensor(&ref, "logits");
    const struct qr_tensor *gen = ref_tensor(&ref, "generated_ids"), *dlog = ref_tensor(&ref, "decode_logits");
    int32_t T = (int32_t)prompt->ne[0], V = (int32_t)logits->ne[0], G = (int32_t)gen->ne[0];
    const int32_t *ids = prompt->data, *gen_ids = gen->data;

    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = mode == 0 || mode >= 4 ? "cuda" : "cpu";
    /* mode 5: exact products, the KV cache in f16 (QWENRT_CUDA_KV=f16); 6: the default
     * precision with it (16-bit fixtures) */
    bool fast = ((mode == 4 || mode == 6) && fast_fixture_tol(dir) > 0) || mode == 5;
    double tol = mode == 5 ? KV16_LOGITS_REL_TOL : fast ? fast_fixture_tol(dir) : LOGITS_REL_TOL;
    if (qwenrt_model_load(dir, &mp, &m, &err) != QWENRT_OK)
        fail_msg("load %s: %s", dir, err.message);
    float *out = malloc((size_t)T * V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
    struct qwenrt_session *s = NULL;
    struct cuda_session *cs = NULL;
    struct dump_check cap = {.ref = ref_tensor(&ref, "hidden_states"), .T = T, .H = m->hp.n_embd};
    if (mode == 0 || mode >= 4) {
        struct qwenrt_session_params sp = qwenrt_session_default_params();
        sp.precision = mode == 4 || mode == 6 ? QWENRT_PRECISION_DEFAULT : QWENRT_PRECISION_EXACT;
        if (mode >= 5)
            setenv("QWENRT_CUDA_KV", "f16", 1);
        qwenrt_status st = qwenrt_session_init(m, &sp, &s, &err);
        unsetenv("QWENRT_CUDA_KV");
        assert_int_equal(st, QWENRT_OK);
        assert_non_null(s->cuda);
        /* QWENRT_KV_DEFAULT: f16 in the default precision with 16-bit weights (the bf16
         * fixtures), f32 with F32 weights or the exact precision (session.c: resolve_kv_type) */
        bool kv16 = mode >= 5 || (mode == 4 && fast);
        assert_int_equal(qwenrt_session_kv_type(s), kv16 ? QWENRT_KV_F16 : QWENRT_KV_F32);
        if (!fast)
            session_set_dump(s, on_dump, &cap);
        assert_int_equal(qwenrt_session_prefill(s, ids, T, out, &err), QWENRT_OK);
        session_set_dump(s, NULL, NULL);
        if (fast)
            cap.n_checked = m->hp.n_layer + 1; /* hidden states: not at the f32 tolerance */
        cs = s->cuda;
    } else {
        struct cuda_options o = cuda_default_options();
        if (mode == 1) {
            o.graph = o.fuse = o.gemm_bf16x2 = o.gemv_v2 = o.pdl = o.gemm_cache = o.attn_tiled =
                o.gdn_par = o.gemm_stack3 = o.attn_gemm = o.attn_split = o.prefill_bf16 =
                    o.gemm_merge = false; /* plain buffers: modes 0 and 4 run merged products */
            o.mega = CUDA_MEGA_OFF;
        } else if (mode == 3) /* the decode graph with programmatic dependent launch */
            o.pdl = true, o.mega = CUDA_MEGA_OFF;
        else /* mode 2: the megakernel */
            o.mega = CUDA_MEGA_ON;
        if (cuda_session_init(m->plans, 256, &o, &cs, &err))
            fail_msg("%s: %s", dir, err.message);
        const char *why = NULL;
        bool mega = cuda_session_uses_megakernel(cs, &why);
        if (mode == 2 && !mega)
            fail_msg("%s: the megakernel is not used: %s", dir, why);
        if (mode != 2 && mega)
            fail_msg("%s mode %d: the megakernel is used although switched off", dir, mode);
        if (mode == 1) {
            assert_int_equal(cuda_session_run(cs, ids, T, 0, true, out, on_dump, &cap, &err), QWENRT_OK);
        } else {
            for (int32_t t = 0; t < T; t++)
                if (cuda_session_run(cs, ids + t, 1, t, false, out + (size_t)t * V, NULL, NULL, &err))
                    fail_msg("%s: decode %d: %s", dir, t, err.message);
            cap.n_checked = m->hp.n_layer + 1; /* no dumps through the graph */
        }
    }
    double e = rel_err(out, logits->data, (size_t)T * V);
    printf("%s mode %d: logits rel err %.3g, worst hidden %.3g over %d dumps\n", dir, mode, e,
           cap.worst, cap.n_checked);
    if (!(e <= tol))
        fail_msg("%s mode %d: logits relative error %.3g", dir, mode, e);
    assert_int_equal(cap.n_checked, m->hp.n_layer + 1);
    check_argmax(out, logits->data, T, V, fast ? FAST_ARGMAX_MARGIN : 0.0, dir);
    /* KV cache: ours [pos][head*hd], reference [head][pos][hd] */
    int32_t hd = m->hp.head_dim, nkv = m->hp.n_head_kv, kvw = nkv * hd, n_kv_checked = 0;
    float *kv = malloc((size_t)T * kvw * sizeof(float)), *re = malloc((size_t)T * kvw * sizeof(float));
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        for (int v = 0; v < 2; v++) {
            if (cuda_session_read_kv(cs, l, v, T, kv, NULL) != QWENRT_OK)
                continue;
            char name[64];
            snprintf(name, sizeof(name), "state.%s.%d", v ? "values" : "keys", l);
            const struct qr_tensor *r = ref_tensor(&ref, name);
            for (int32_t h = 0; h < nkv; h++)
                for (int32_t p = 0; p < T; p++)
                    memcpy(re + ((size_t)h * T + p) * hd, kv + (size_t)p * kvw + h * hd, (size_t)hd * 4);
            double ke = rel_err(re, r->data, (size_t)T * kvw);
            if (ke > (fast ? tol : KV_REL_TOL))
                fail_msg("%s: %s relative error %.3g", dir, name, ke);
            n_kv_checked++;
        }
    assert_true(n_kv_checked > 0);
    /* greedy continuation: through the API step by step (mode 0), or the on-GPU greedy loop
     * (modes 1, 2: ids read back every 3 steps; the last step's logits compared) */
    if (s) {
        for (int32_t g = 0; g < G; g++) {
            if (g > 0)
                assert_int_equal(qwenrt_session_decode(s, gen_ids[g - 1], &err), QWENRT_OK);
            const float *cur = qwenrt_session_logits(s);
            double de = rel_err(cur, (const float *)dlog->data + (size_t)g * V, (size_t)V);
            if (!(de <= tol))
                fail_msg("%s mode %d: decode step %d: logits relative error %.3g", dir, mode, g, de);
            check_argmax(cur, (const float *)dlog->data + (size_t)g * V, 1, V,
                         fast ? FAST_ARGMAX_MARGIN : 0.0, dir);
        }
    } else if (G > 1) {
        int32_t out_ids[64];
        assert_true(G <= 64);
        if (cuda_session_generate(cs, gen_ids[0], T, G - 1, 3, out_ids, lg, &err))
            fail_msg("%s: generate: %s", dir, err.message);
        for (int32_t g = 1; g < G; g++)
            assert_int_equal(out_ids[g - 1], gen_ids[g]);
        double de = rel_err(lg, (const float *)dlog->data + (size_t)(G - 1) * V, (size_t)V);
        if (de > LOGITS_REL_TOL)
            fail_msg("%s mode %d: last generated logits relative error %.3g", dir, mode, de);
    }
    free(kv);
    free(re);
    free(out);
    free(lg);
    if (s)
        qwenrt_session_free(s);
    else
        cuda_session_free(cs);
    qwenrt_model_free(m);
    safetensors_close(&ref);
}

static const char *const fixtures[] = {"tests/data/qwen3-tiny-f32", "tests/data/qwen3-tiny-bf16",
                                       "tests/data/qwen35-tiny-f32", "tests/data/qwen35-tiny-bf16"};

static void test_fixtures_api(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 0);
    check_fixture(fixtures[2], 0); /* again: the error must not move between runs */
}

/* The default precision: fast prefill products for the bf16 fixtures (x in one bf16 term for
 * Qwen3, two for Qwen3.5); exact for the f32 fixtures. */
static void test_fixtures_default_precision(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 4);
}

/* The KV cache in f16 through the API (QWENRT_CUDA_KV=f16): every fixture against the
 * reference within 1e-3 with exact products, the 16-bit ones within the default precision's
 * tolerance with its fast products, and a value the variable does not take refused by name. */
static void test_fixtures_kv_f16(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 5);
    check_fixture(fixtures[1], 6); /* the 16-bit fixtures in the default precision as well */
    check_fixture(fixtures[3], 6);
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    assert_int_equal(qwenrt_model_load(fixtures[0], &mp, &m, &err), QWENRT_OK);
    struct qwenrt_session *s = NULL;
    setenv("QWENRT_CUDA_KV", "q8", 1);
    qwenrt_status st2 = qwenrt_session_init(m, NULL, &s, &err);
    unsetenv("QWENRT_CUDA_KV");
    assert_int_equal(st2, QWENRT_ERR_INVALID_ARG);
    assert_null(s);
    assert_non_null(strstr(err.message, "QWENRT_CUDA_KV=q8"));
    qwenrt_model_free(m);
}

/* Overwrites path with a profile whose cudaTuning is 16 warps and splits of 32 positions. */
static void put_tuning_profile(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"id\": \"t\", \"name\": \"t\", \"owner\": \"t\", \"intent\": \"calibrate\", "
          "\"compatibleIntents\": [\"calibrate\"], \"stability\": \"experimental\", "
          "\"createdAtUtc\": \"2026-12-01T00:00:00Z\", \"extends\": \"profiles/default\", "
          "\"runtime\": {\"inference\": {\"cudaTuning\": {\"gemvSmemWarps\": 16, \"attnSplitMin\": 32}}}}\n",
          f);
    fclose(f);
}

/* calibrate --backend cuda (calibrate_cuda.c) on the bf16 fixtures: every candidate passes the
 * gate against the session's picks (the shapes move rows between warps, not the order of their
 * sums), the evidence names each lane, and the profile it writes loads and reaches the model
 * that tool_open binds under it (a session starts and prefills with that shape). On the first
 * fixture also the second stage (calibrate_window.c) at depth 256: the cluster merge passes
 * its gate there and the profile says never or the window that depth stands for. */
static void test_calibrate_cuda(void **st)
{
    (void)st;
    for (int f = 1; f < 4; f += 2) {
        char path[] = "/tmp/qwenrt-calcuda-XXXXXX.json";
        int fd = mkstemps(path, 5);
        assert_true(fd >= 0);
        close(fd);
        struct calibrate_params p = {.model_path = fixtures[f], .backend = "cuda", .n_prompt = 8, .n_gen = 12,
                                     .depth_max = f == 1 ? 256 : 0, .warmup = 0, .trials = 1, .out_profile = path,
                                     .profile_id = "profiles/calibrated-test"};
        json_t *ev = NULL;
        struct qwenrt_error err = {0};
        if (calibrate_run(&p, &ev, &err))
            fail_msg("%s: calibrate: %s", fixtures[f], err.message);
        assert_string_equal(json_string_value(json_object_get(ev, "status")), "calibrated");
        json_t *lanes = json_object_get(ev, "lanes");
        assert_true(json_array_size(lanes) >= 4);
        size_t i;
        json_t *l;
        json_array_foreach (lanes, i, l) {
            printf("%s: %-36s gate %s, err %.3g, %.0f tok/s\n", fixtures[f],
                   json_string_value(json_object_get(l, "label")), json_string_value(json_object_get(l, "gate")),
                   json_real_value(json_object_get(l, "max_logits_rel_err_vs_baseline")),
                   json_real_value(json_object_get(l, "median_decode_tok_s")));
            if (strcmp(json_string_value(json_object_get(l, "gate")), "passed"))
                fail_msg("%s: lane %s: %s", fixtures[f], json_string_value(json_object_get(l, "label")),
                         json_string_value(json_object_get(l, "gate_failure")));
        }
        json_t *win = json_object_get(ev, "attention_cluster"), *d = json_array_get(json_object_get(win, "depths"), 0);
        bool wins = json_is_true(json_object_get(d, "wins"));
        if (f == 1) {
            assert_int_equal(json_integer_value(json_object_get(d, "depth")), 256);
            if (strcmp(json_string_value(json_object_get(d, "gate")), "passed"))
                fail_msg("%s: the cluster merge at depth 256: %s", fixtures[f],
                         json_string_value(json_object_get(d, "gate_failure")));
            printf("%s: cluster merge at depth 256: %+.1f%%\n", fixtures[f], 100 * json_real_value(json_object_get(d, "gain")));
        } else {
            assert_null(win);
        }
        json_decref(ev);
        struct profile *pf = NULL; /* what calibrate wrote loads */
        if (profile_load(path, NULL, &pf, &err))
            fail_msg("%s: the calibrated profile: %s", fixtures[f], err.message);
        assert_true(pf->cuda_given);
        assert_int_equal(pf->cuda.attn_cluster, f != 1 ? 0 : wins ? 2 : -1);
        assert_int_equal(pf->cuda.attn_cluster_from, f == 1 && wins ? 192 : 0);
        assert_int_equal(pf->cuda.attn_cluster_until, f == 1 && wins ? 384 : 0);
        profile_free(pf);
        /* a profile through tool_open: the model carries its choice to the sessions */
        put_tuning_profile(path);
        struct tool_open_params op = {.model_path = fixtures[f], .backend = "cuda", .profile = path,
                                      .command = "test", .intent = PROFILE_INTENT_CALIBRATE};
        struct tool_model tm;
        if (tool_open(&op, &tm, &err))
            fail_msg("%s: tool_open: %s", fixtures[f], err.message);
        assert_int_equal(tm.model->cuda_tuning.gemv_smem_warps, 16);
        assert_int_equal(tm.model->cuda_tuning.attn_split_min, 32);
        struct qwenrt_session *s = NULL;
        assert_int_equal(qwenrt_session_init(tm.model, NULL, &s, &err), QWENRT_OK);
        int32_t prompt[3] = {5, 9, 11};
        assert_int_equal(qwenrt_session_prefill(s, prompt, 3, NULL, &err), QWENRT_OK);
        qwenrt_session_free(s);
        tool_close(&tm);
        remove(path);
    }
}

static void test_fixtures_unfused(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 1);
}

static void test_fixtures_decode_only(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 2);
}

static void test_fixtures_decode_graph(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_fixture(fixtures[i], 3);
}

/* The synth model of hyperparameters hp (arch's preset, changed) in type, written as a GGUF at
 * path (the caller removes it; tag tells test files apart) and loaded for the CPU. */
static struct qwenrt_model *write_load_synth(const char *arch, const struct model_hparams *hp,
                                             enum export_type type, const char *tag, char *path, size_t path_size)
{
    struct qwenrt_error err = {0};
    snprintf(path, path_size, "/tmp/qwenrt-test-synth%s-%s-%d-%d.gguf", tag, arch, (int)type, (int)getpid());
    struct export_params ep = {.type = type, .name = arch, .tied = true};
    if (synth_write(path, hp, 77, &ep, &err))
        fail_msg("synth %s: %s", arch, err.message);
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cpu";
    if (qwenrt_model_load(path, &mp, &m, &err))
        fail_msg("load %s: %s", path, err.message);
    return m;
}

/* A synth model of arch's tiny preset in type, widened to width (0: as is; 1024 with Qwen3:
 * Qwen3-0.6B's head geometry), loaded from a GGUF at path (the caller removes it). */
static struct qwenrt_model *load_synth_ssm(const char *arch, enum export_type type, int32_t width,
                                           bool own_key_heads, int32_t ssm_dim, char *path, size_t path_size)
{
    struct qwenrt_error err = {0};
    struct model_hparams hp;
    assert_int_equal(synth_preset(arch, &hp, &err), QWENRT_OK);
    if (own_key_heads) /* Hv == Hk, as in Qwen3.5-0.8B: the graph's conv runs inside its core */
        hp.ssm_n_v_heads = hp.ssm_n_k_heads;
    if (ssm_dim) /* DeltaNet heads of ssm_dim x ssm_dim (Qwen3.5-0.8B: 128) */
        hp.ssm_k_dim = hp.ssm_v_dim = ssm_dim;
    if (width) {
        hp.n_embd = width, hp.n_ff = 3 * width;
        hp.n_head = width / hp.head_dim;
    }
    if (width >= 1024 && hp.arch == ARCH_QWEN3) { /* Qwen3-0.6B's widths: o-proj K = 2048 */
        hp.head_dim = hp.n_rot = 128;
        hp.n_head = 2 * width / 128, hp.n_head_kv = width / 128;
    }
    return write_load_synth(arch, &hp, type, "", path, path_size);
}

static struct qwenrt_model *load_synth(const char *arch, enum export_type type, int32_t width, bool own_key_heads,
                                       char *path, size_t path_size)
{
    return load_synth_ssm(arch, type, width, own_key_heads, 0, path, path_size);
}

/* Frees what check_mega_synth and check_attention_rope hold: two sessions of a synth model,
 * the model, its file and two logits rows. */
static void free_synth_pair(struct cuda_session *a, struct cuda_session *b, struct qwenrt_model *m,
                            const char *path, float *la, float *lb)
{
    free(la);
    free(lb);
    cuda_session_free(a);
    cuda_session_free(b);
    qwenrt_model_free(m);
    remove(path);
}

/* Two CUDA sessions of model m (n_ctx positions) with options on and off; fails the test
 * naming what when either cannot be made. */
static void init_pair(const struct qwenrt_model *m, int32_t n_ctx, const struct cuda_options *on,
                      const struct cuda_options *off, struct cuda_session **a, struct cuda_session **b,
                      const char *what)
{
    struct qwenrt_error err = {0};
    *a = *b = NULL;
    if (cuda_session_init(m->plans, n_ctx, on, a, &err) || cuda_session_init(m->plans, n_ctx, off, b, &err))
        fail_msg("%s: %s", what, err.message);
}

/* 20 decode steps from position 0 on two sessions of one model, both fed b's greedy token:
 * the worst relative error between their logits (la, lb: V floats each); the argmaxes must
 * agree at every step unless any_ids (8-bit x: a flipped rounding may move a random model's
 * argmax). *id: the first token in, b's last greedy token out. */
static double decode_pair_ids(struct cuda_session *a, struct cuda_session *b, int32_t V, int32_t *id, float *la,
                              float *lb, const char *what, bool any_ids)
{
    struct qwenrt_error err = {0};
    double worst = 0;
    for (int32_t t = 0; t < 20; t++) {
        if (cuda_session_run(a, id, 1, t, false, la, NULL, NULL, &err) ||
            cuda_session_run(b, id, 1, t, false, lb, NULL, NULL, &err))
            fail_msg("%s step %d: %s", what, t, err.message);
        double e = rel_err(la, lb, (size_t)V);
        worst = e > worst ? e : worst;
        if (!any_ids)
            assert_int_equal(argmax_f(la, V), argmax_f(lb, V));
        *id = argmax_f(lb, V);
    }
    return worst;
}

static double decode_pair(struct cuda_session *a, struct cuda_session *b, int32_t V, int32_t *id,
                          float *la, float *lb, const char *what)
{
    return decode_pair_ids(a, b, V, id, la, lb, what, false);
}

/* decode_pair_ids from token 5 on a and b (sessions of m, a synth file at path), printed as
 * "what: worst ...", then everything freed (free_synth_pair): the worst relative error. */
static double decode_pair_once_ids(struct cuda_session *a, struct cuda_session *b, struct qwenrt_model *m,
                                   const char *path, const char *what, bool any_ids)
{
    int32_t V = m->hp.n_vocab, id = 5;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    double worst = decode_pair_ids(a, b, V, &id, la, lb, what, any_ids);
    printf("%s: worst logits rel err %.3g over 20 steps\n", what, worst);
    free_synth_pair(a, b, m, path, la, lb);
    return worst;
}

/* The same, the greedy ids required to agree at every step. */
static double decode_pair_once(struct cuda_session *a, struct cuda_session *b, struct qwenrt_model *m,
                               const char *path, const char *what)
{
    return decode_pair_once_ids(a, b, m, path, what, false);
}

/* The megakernel against the graph program on synth models of quantised weights (the
 * fixtures are f32/bf16): every decode step's logits and 12 greedy ids. Geometry: qwen3-tiny
 * widened to 256 so that the K-quants apply (Q4_K_M mixes Q4_K and Q6_K), and qwen35-tiny in
 * Q8_0 and BF16. */
static void check_mega_synth(const char *arch, enum export_type type, int32_t width, bool fuse_down,
                             bool own_key_heads)
{
    struct qwenrt_error err = {0};
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, own_key_heads, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = CUDA_MEGA_ON, off.mega = CUDA_MEGA_OFF;
    on.mega_fuse_down = fuse_down;
    /* the graph with gemv2, whose order of the sums the megakernel's rows follow (gemv_smem,
     * the default, sums in another order: test_graph_gemv_smem checks it against gemv2; with
     * it the random Qwen3.5 recurrence took this pair from 1.9e-4 to 1.1e-3 on the H200) */
    off.gemv_smem = false;
    off.gemvq_int8 = -1; /* float x, as the megakernel's quantised rows */
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, arch);
    const char *why = NULL;
    if (!cuda_session_uses_megakernel(a, &why))
        fail_msg("%s %s: the megakernel is not used: %s", arch, export_type_name(type), why);
    int32_t V = m->hp.n_vocab, id = 5;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    double worst = decode_pair(a, b, V, &id, la, lb, arch);
    printf("megakernel (fuse_down %s) vs graph, %s %s width %d%s: worst logits rel err %.3g over 20 steps\n",
           fuse_down ? "on" : "off", arch, export_type_name(type), (int)width,
           own_key_heads ? " (Hv = Hk)" : "", worst);
    /* random Qwen3.5 weights amplify rounding differences through the recurrence (the two
     * paths order the delta rule's sums differently): 1.4e-4 after 20 steps was seen; the
     * greedy ids below are the sharp check there */
    double tol = m->hp.arch == ARCH_QWEN35 ? 1e-3 : 1e-4;
    if (!(worst <= tol))
        fail_msg("%s %s: megakernel logits differ from the graph by %.3g", arch, export_type_name(type), worst);
    int32_t ga[12], gb[12];
    if (cuda_session_generate(a, id, 20, 12, 5, ga, NULL, &err) ||
        cuda_session_generate(b, id, 20, 12, 5, gb, NULL, &err))
        fail_msg("%s generate: %s", arch, err.message);
    assert_memory_equal(ga, gb, sizeof(ga));
    /* greedy sampling after a megakernel step takes the argmax its LM head phase found: the
     * same token and logit as the top-m kernels and as the whole row */
    int32_t top1[1], top2[2];
    float v1[1], v2[2];
    if (cuda_session_run(a, &ga[11], 1, 32, false, NULL, NULL, NULL, &err) ||
        cuda_session_top(a, 1.0f, 1, NULL, 0, top1, v1, NULL, &err) ||
        cuda_session_top(a, 1.0f, 2, NULL, 0, top2, v2, NULL, &err) || cuda_session_logits(a, la, &err))
        fail_msg("%s top: %s", arch, err.message);
    assert_int_equal(top1[0], top2[0]);
    assert_int_equal(top1[0], argmax_f(la, V));
    assert_true(v1[0] == v2[0] && v1[0] == la[top1[0]]);
    free_synth_pair(a, b, m, path, la, lb);
}

/* Sessions a and b of one model (V logits) decoding side by side: `steps` greedy steps (b's
 * tokens) from position 0, then again after a `prompt`-token prompt. same_bits: every step's
 * logits must be bit for bit the same (memcmp); else they are compared by relative error and
 * the argmax must agree wherever b's margin exceeds 1e-3. what names the pair in a failure.
 * Returns the worst relative error. */
static double decode_side_by_side(struct cuda_session *a, struct cuda_session *b, int32_t V, int32_t prompt,
                                  int32_t steps, bool same_bits, const char *what)
{
    struct qwenrt_error err = {0};
    int32_t *ids = malloc((size_t)prompt * sizeof(int32_t));
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(ids);
    assert_non_null(la);
    assert_non_null(lb);
    for (int32_t i = 0; i < prompt; i++)
        ids[i] = (i * 37 + 11) % V;
    double worst = 0;
    for (int32_t start = 0; start <= prompt; start += prompt) {
        int32_t id = 7;
        if (start && (cuda_session_run(a, ids, start, 0, false, la, NULL, NULL, &err) ||
                      cuda_session_run(b, ids, start, 0, false, lb, NULL, NULL, &err)))
            fail_msg("%s, prompt: %s", what, err.message);
        for (int32_t t = start; t < start + steps; t++) {
            if (cuda_session_run(a, &id, 1, t, false, la, NULL, NULL, &err) ||
                cuda_session_run(b, &id, 1, t, false, lb, NULL, NULL, &err))
                fail_msg("%s, step %d: %s", what, t, err.message);
            double e = rel_err(la, lb, (size_t)V);
            if (same_bits && memcmp(la, lb, (size_t)V * 4))
                fail_msg("%s differ at position %d (rel err %.3g)", what, t, e);
            if (!same_bits)
                check_argmax(la, lb, 1, V, 1e-3, what);
            worst = e > worst ? e : worst;
            id = argmax_f(lb, V);
        }
    }
    free(ids);
    free(la);
    free(lb);
    return worst;
}

/* The decode graph's attention with the q/k norm, RoPE and cache write inside it (attn_rope,
 * the default) against the separate rope launch: the same arithmetic, so the logits must be
 * bit for bit the same, from position 0 (one split) and after a 150-token prompt (three
 * splits: the current position's K and V come from shared memory in the last one). Qwen3 at
 * Qwen3-0.6B's head geometry (128) and Qwen3.5 (its output gate, partial RoPE). */
static void check_attention_rope(const char *arch, int32_t width)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, EXPORT_BF16, width, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    off.attn_rope = false;
    /* the cluster merge (from position ATTN_CLUSTER_FROM) comes only with the fused rope, and
     * merges in another order: off in both, so that the rest must agree bit for bit */
    on.attn_cluster = off.attn_cluster = -1;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 256, &on, &off, &a, &b, arch);
    char what[96];
    snprintf(what, sizeof(what), "%s: attn_rope on / off", arch);
    decode_side_by_side(a, b, m->hp.n_vocab, 150, 70, true, what);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

/* The attention reading the position and its first cached rows before its wait (attn_early)
 * against reading them after: the same arithmetic, so the logits must be bit for bit the same,
 * from position 0 and after a 150-token prompt. With early = 0 (only where the q|k|v launch
 * already starts its successor after its own wait) every layer's attention takes it (Qwen3
 * BF16 at Qwen3-0.6B's head geometry: gemv_smem after the wait; Q4_K_M: gemvq with 8-bit x,
 * after the wait; qwen35-tiny, its output gate) — or none, where gemv_smem starts its
 * successor before its wait (gemv_smem_launch 1, as Qwen3.5-0.8B's 16-warp blocks); with
 * early = 1 (the default) that launch is made to wait first, and every attention takes it. */
static void check_attn_early(const char *arch, enum export_type type, int32_t width, int32_t launch, int32_t early,
                             bool expect)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.kv_f16 = off.kv_f16 = true;
    on.gemv_smem_launch = off.gemv_smem_launch = launch;
    on.attn_early = early;
    off.attn_early = -1;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 256, &on, &off, &a, &b, arch);
    int32_t n_attn = cuda_session_count_steps(a, "rope+attention");
    assert_true(n_attn > 0);
    assert_int_equal(cuda_session_count_steps(a, "rope+attention (early)"), expect ? n_attn : 0);
    assert_int_equal(cuda_session_count_steps(b, "rope+attention (early)"), 0);
    char what[96];
    snprintf(what, sizeof(what), "%s %s: attn_early on / off", arch, export_type_name(type));
    decode_side_by_side(a, b, m->hp.n_vocab, 150, 70, true, what);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_attn_early(void **st)
{
    (void)st;
    check_attn_early("qwen3-tiny", EXPORT_BF16, 1024, 0, 0, true);
    check_attn_early("qwen3-tiny", EXPORT_Q4_K_M, 1024, 0, 0, true);
    check_attn_early("qwen35-tiny", EXPORT_BF16, 0, 0, 0, true);
    check_attn_early("qwen3-tiny", EXPORT_BF16, 1024, 1, 0, false);
    /* attn_early 1: the q|k|v launch that would start its successor first waits first */
    check_attn_early("qwen3-tiny", EXPORT_BF16, 1024, 1, 1, true);
}

/* The DeltaNet step reading its state before its wait (gdn_early 0, the default) against after: the same
 * arithmetic, bit for bit the same logits from position 0 and after a 150-token prompt, and
 * every DeltaNet step takes it — also where gemv_smem would start its successor before its
 * wait (gemv_smem_launch 1: the in_proj launch then waits first); with the conv fused (one
 * key head per value head, as Qwen3.5-0.8B), at the tiny and at Qwen3.5-0.8B's head geometry
 * (width 1024, heads of 128 x 128). */
static void check_gdn_early(int32_t width, int32_t launch)
{
    char path[256];
    struct qwenrt_model *m = load_synth_ssm("qwen35-tiny", EXPORT_BF16, width, true, width ? 128 : 0, path,
                                            sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.gemv_smem_launch = off.gemv_smem_launch = launch;
    on.gdn_early = 0;
    off.gdn_early = -1;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 256, &on, &off, &a, &b, "qwen35-tiny");
    int32_t n_gdn = cuda_session_count_steps(a, "conv+gdn_core+gated_norm") +
                    cuda_session_count_steps(a, "gdn_core+gated_norm");
    assert_true(n_gdn > 0);
    assert_int_equal(cuda_session_count_steps(a, "gdn (early)"), n_gdn);
    assert_int_equal(cuda_session_count_steps(b, "gdn (early)"), 0);
    char what[96];
    snprintf(what, sizeof(what), "qwen35-tiny width %d: gdn_early on / off", (int)width);
    decode_side_by_side(a, b, m->hp.n_vocab, 150, 40, true, what);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_gdn_early(void **st)
{
    (void)st;
    check_gdn_early(0, 0);
    check_gdn_early(0, 1);
    check_gdn_early(1024, 0);
}

/* Weights asked into the L2 ahead of their step (l2_prefetch_mb): a hint that changes no
 * arithmetic, so the logits must be bit for bit those of the program without it, from position
 * 0 and after a 150-token prompt; and the program must really ask (bytes per token > 0, at most
 * the session's device memory). Qwen3 BF16 (gemv_smem, the attention) and Q4_K_M (gemvq) at
 * width 1024, qwen35-tiny BF16 (its DeltaNet step over clusters). */
static void check_l2_prefetch(const char *arch, enum export_type type, int32_t width)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.l2_prefetch_mb = 1;
    off.l2_prefetch_mb = 0;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 256, &on, &off, &a, &b, arch);
    int64_t asked = cuda_session_l2_prefetch_bytes(a);
    assert_true(asked > 0 && asked <= cuda_session_device_bytes(a));
    assert_true(cuda_session_l2_prefetch_bytes(b) == 0);
    char what[96];
    snprintf(what, sizeof(what), "%s %s: l2_prefetch_mb 1 / 0", arch, export_type_name(type));
    decode_side_by_side(a, b, m->hp.n_vocab, 150, 40, true, what);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_l2_prefetch(void **st)
{
    (void)st;
    check_l2_prefetch("qwen3-tiny", EXPORT_BF16, 1024);
    check_l2_prefetch("qwen3-tiny", EXPORT_Q4_K_M, 1024);
    check_l2_prefetch("qwen35-tiny", EXPORT_BF16, 0);
}

/* cuda_session_timeline (a measurement): the report names the stamped steps of the decode
 * graph and a positive span; reps < 1 is refused by name; afterwards the session decodes as
 * one that never ran it (the timeline's graph is its own: no stamps left in the session's); a
 * megakernel session is refused (UNSUPPORTED, by name). */
static bool staged_in_timeline(struct cuda_session *cs, const char *label);

static void test_decode_timeline(void **st)
{
    (void)st;
    char path[256], rep[4096];
    struct qwenrt_model *m = load_synth("qwen3-tiny", EXPORT_BF16, 1024, false, path, sizeof(path));
    struct cuda_options o = cuda_default_options();
    o.mega = CUDA_MEGA_OFF;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &o, &o, &a, &b, "timeline");
    struct qwenrt_error err = {0};
    assert_int_equal(cuda_session_timeline(a, 7, 0, 0, rep, sizeof(rep), &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "reps 0"));
    if (cuda_session_timeline(a, 7, 0, 3, rep, sizeof(rep), &err))
        fail_msg("timeline: %s", err.message);
    assert_non_null(strstr(rep, "| norm+gemv(multi) |"));
    assert_non_null(strstr(rep, "| rope+attention |"));
    assert_non_null(strstr(rep, "| gemv+residual |"));
    assert_true(staged_in_timeline(a, "rope+attention")); /* the attention's third stamp */
    /* where the blocks ran: multiprocessors used and the most blocks on one (at least 1: the
     * stamps carry each block's multiprocessor), blocks on a shared one (a few at most:
     * qwen3-tiny's launches have fewer blocks than the GPU has multiprocessors), the share of
     * launches whose last block was one of them, the last block's lateness (finite) */
    const char *row = strstr(rep, "| gemv+residual |");
    int n = 0;
    double f[6], used = -1, most = -1, shared = -1, last_shared = -1, late[3];
    assert_true(sscanf(row + strlen("| gemv+residual |"),
                       " %d | %lf | %lf | %lf | %lf | %lf | %lf | %lf | %lf | %lf%% | %lf / %lf / %lf |", &n, &f[0], &f[1],
                       &f[2], &f[3], &f[4], &used, &most, &shared, &last_shared, &late[0], &late[1], &late[2]) == 13);
    assert_true(used >= 1 && most >= 1 && shared >= 0 && shared < 64 && last_shared >= 0 && last_shared <= 100);
    for (int i = 0; i < 3; i++)
        assert_true(late[i] > -1e3 && late[i] < 1e3);
    double span = 0;
    const char *tail = strstr(rep, "first start to last end: ");
    assert_non_null(tail);
    assert_true(sscanf(tail, "first start to last end: %lf", &span) == 1 && span > 0 && span < 1e5);
    decode_side_by_side(a, b, m->hp.n_vocab, 20, 10, true, "after a timeline / never");
    /* a megakernel session has no decode graph to stamp: refused by name */
    struct cuda_options mo = cuda_default_options();
    mo.mega = CUDA_MEGA_ON;
    struct cuda_session *mk = NULL;
    const char *why = NULL;
    if (cuda_session_init(m->plans, 64, &mo, &mk, &err))
        fail_msg("timeline, megakernel session: %s", err.message);
    if (!cuda_session_uses_megakernel(mk, &why))
        fail_msg("timeline: the megakernel is not used: %s", why);
    assert_int_equal(cuda_session_timeline(mk, 7, 0, 3, rep, sizeof(rep), &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "megakernel"));
    cuda_session_free(mk);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_attention_rope_fused(void **st)
{
    (void)st;
    check_attention_rope("qwen3-tiny", 1024);
    check_attention_rope("qwen35-tiny", 0);
}

/* The norm + q|k|v + attention launch (qkv_attn, qkv_attention.cu) against the two launches
 * it replaces: every layer takes it (the step count), and the logits agree within rounding
 * (its sums run in other orders) from position 0 — block 0 alone below one round of its warps'
 * loads (32 positions with 8 warps, 64 with 16), slices per block above — and after a
 * 600-token prompt, where each block walks its slice in more than one round (600 / 16 blocks
 * = 38 rows for 8 warps of 4 rows; 75 for 16 warps with clusters of 8), the current
 * position's rows from shared memory. Qwen3 at Qwen3-0.6B's head geometry (128) and the tiny one (64), BF16 and F16
 * weights, f32 and f16 caches, clusters of 16 and 8. */
static void check_qkv_attn(enum export_type type, int32_t width, int cluster, bool kv_f16)
{
    char path[256];
    struct qwenrt_model *m = load_synth("qwen3-tiny", type, width, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.qkv_attn = cluster;
    on.kv_f16 = off.kv_f16 = kv_f16;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 700, &on, &off, &a, &b, "qkv_attn");
    char what[128];
    snprintf(what, sizeof(what), "qkv_attn %d, %s width %d, %s cache", cluster, export_type_name(type), (int)width,
             kv_f16 ? "f16" : "f32");
    assert_int_equal(cuda_session_count_steps(a, "norm+q|k|v+attention"), m->hp.n_layer);
    assert_int_equal(cuda_session_count_steps(b, "norm+q|k|v+attention"), 0);
    double worst = decode_side_by_side(a, b, m->hp.n_vocab, 600, 40, false, what);
    printf("%s: worst logits rel err %.3g over positions 0-39 and 600-639\n", what, worst);
    if (!(worst <= 1e-4))
        fail_msg("%s: logits differ from the two launches by %.3g", what, worst);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_qkv_attn(void **st)
{
    (void)st;
    check_qkv_attn(EXPORT_BF16, 1024, 16, true);
    check_qkv_attn(EXPORT_BF16, 1024, 8, false);
    check_qkv_attn(EXPORT_F16, 1024, 16, false);
    check_qkv_attn(EXPORT_BF16, 0, 16, true);
    check_qkv_attn(EXPORT_BF16, 0, 8, false);
}

/* cuda_options.omit_steps (cuda_bench's knock-out measurements): a label that names no step
 * is refused by name; a named step is really left out (the logits change: the attention's
 * output is never written), and the rest still runs. */
/* cuda_options.gen_graph_steps: the greedy loop with 4 steps per graph launch gives the same
 * tokens and the same last logits, bit for bit, as one step per launch (the same kernels in
 * the same order), with read-backs that do not divide into 4 (11 tokens read back every 5:
 * 4 + 1, 4 + 1, 1 launches) and a run shorter than 4; and it does launch fewer graphs. */
static void test_generate_graph_steps(void **st)
{
    (void)st;
    const char *archs[] = {"qwen3-tiny", "qwen35-tiny"};
    for (int k = 0; k < 2; k++) {
        struct qwenrt_error err = {0};
        char path[256];
        struct qwenrt_model *m = load_synth(archs[k], EXPORT_BF16, 0, false, path, sizeof(path));
        struct cuda_options on = cuda_default_options(), off = on;
        on.mega = off.mega = CUDA_MEGA_OFF;
        on.gen_graph_steps = 4, off.gen_graph_steps = 1;
        struct cuda_session *a = NULL, *b = NULL;
        init_pair(m, 64, &on, &off, &a, &b, archs[k]);
        int32_t V = m->hp.n_vocab, ga[11], gb[11];
        float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
        assert_non_null(la);
        assert_non_null(lb);
        if (cuda_session_generate(a, 5, 0, 11, 5, ga, la, &err) || cuda_session_generate(b, 5, 0, 11, 5, gb, lb, &err))
            fail_msg("%s generate: %s", archs[k], err.message);
        assert_memory_equal(ga, gb, sizeof(ga));
        assert_memory_equal(la, lb, (size_t)V * 4);
        assert_int_equal(cuda_session_gen_graph_launches(a), 5);
        assert_int_equal(cuda_session_gen_graph_launches(b), 11);
        if (cuda_session_generate(a, ga[10], 11, 3, 0, ga, la, &err) ||
            cuda_session_generate(b, gb[10], 11, 3, 0, gb, lb, &err))
            fail_msg("%s generate: %s", archs[k], err.message);
        assert_memory_equal(ga, gb, 3 * sizeof(int32_t));
        assert_memory_equal(la, lb, (size_t)V * 4);
        assert_int_equal(cuda_session_gen_graph_launches(a), 8);
        printf("%s: 14 greedy tokens, 4 steps per graph: the same ids and last logits as 1 (8 launches, not 14)\n",
               archs[k]);
        free_synth_pair(a, b, m, path, la, lb);
    }
}

static void test_decode_omit_steps(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    char path[256];
    struct qwenrt_model *m = load_synth("qwen3-tiny", EXPORT_BF16, 0, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on, bad = on;
    on.mega = off.mega = bad.mega = CUDA_MEGA_OFF;
    bad.omit_steps = "rope+attention;no-such-step";
    struct cuda_session *a = NULL, *b = NULL;
    assert_int_equal(cuda_session_init(m->plans, 16, &bad, &a, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(a);
    assert_non_null(strstr(err.message, "\"no-such-step\", which is no step of this decode program"));
    on.omit_steps = "rope+attention;argmax";
    init_pair(m, 16, &on, &off, &a, &b, "omit_steps");
    int32_t V = m->hp.n_vocab, id = 5;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    if (cuda_session_run(a, &id, 1, 0, false, la, NULL, NULL, &err) ||
        cuda_session_run(b, &id, 1, 0, false, lb, NULL, NULL, &err))
        fail_msg("omit_steps: %s", err.message);
    assert_true(rel_err(la, lb, (size_t)V) > 1e-3);
    free_synth_pair(a, b, m, path, la, lb);
}

/* The decode graph's quantised GEMV (gemvq, gemv_v2 on) against the first kernel (v2 off) on
 * a synth model at the real widths: 20 steps' logits and greedy ids. Q4_K_M mixes Q4_K and
 * Q6_K in q|k|v: one gemvq launch with v2, one launch per dtype without. big: gemvq's other
 * block shape (8 warps of 2 rows, 100 KB reserved, PDL one launch ahead). */
static void check_graph_gemvq(const char *arch, enum export_type type, bool big)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, 1024, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    off.gemv_v2 = false;
    on.gemvq_int8 = -1; /* float x, as the first kernel's (check_graph_gemvq_int8 for 8 bits) */
    if (big)
        on.gemvq_warps = 8, on.gemvq_rows = 2, on.gemvq_smem_kb = 100, on.pdl = true, on.gemvq_launch = 2;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, arch);
    double tol = m->hp.arch == ARCH_QWEN35 ? 1e-3 : 1e-4; /* as check_mega_synth */
    char what[128];
    snprintf(what, sizeof(what), "graph gemvq%s vs first GEMV kernel, %s %s", big ? " (8 warps, 100 KB, pdl)" : "",
             arch, export_type_name(type));
    double worst = decode_pair_once(a, b, m, path, what);
    if (!(worst <= tol))
        fail_msg("%s: logits differ by %.3g", what, worst);
}

/* Two decode-graph sessions of a synth model (width 1024: every product at the real widths,
 * Q4_K_M's mixed q|k|v launch included where the type has it) with options on and off,
 * decode_pair_ids' 20 steps (any_ids: the greedy ids may differ): the worst logits relative
 * error must lie in (0, hi], or [0, hi] where may_equal. */
static void check_graph_options_pair(const char *arch, enum export_type type, const struct cuda_options *on,
                                     const struct cuda_options *off, double hi, bool any_ids, bool may_equal,
                                     const char *what)
{
    char path[256], full[160];
    struct qwenrt_model *m = load_synth(arch, type, 1024, true, path, sizeof(path));
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, on, off, &a, &b, arch);
    snprintf(full, sizeof(full), "graph %s, %s %s", what, arch, export_type_name(type));
    double worst = decode_pair_once_ids(a, b, m, path, full, any_ids);
    if (!((worst > 0 || (may_equal && worst == 0)) && worst <= hi))
        fail_msg("%s: logits differ by %.3g (want %s0, %g])", full, worst, may_equal ? "[" : "(", hi);
}

/* gemvq with x in 8 bits (gemvq_int8) against gemvq with float x through the decode graph
 * (the kernel-level check against the CPU is test_op_gemv_sizes' variants 12 and 13). The two
 * differ by x's rounding to 8 bits (~0.4% per element), so this is a bound that only a wrong
 * layout would break. Qwen3 only: the random Qwen3.5 recurrence turns x's rounding into
 * logits errors of ~0.6 (seen on the H200), as it does any rounding change (test_op_gemv_sizes
 * holds its kernels to the CPU's). */
static void check_graph_gemvq_int8(const char *arch, enum export_type type)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.gemvq_int8 = 1, off.gemvq_int8 = -1;
    check_graph_options_pair(arch, type, &on, &off, 5e-2, true, false, "gemvq int8 vs float x");
}

/* gemvq_one_pass (x normalised and quantised from registers) against the staged float copy
 * through the decode graph, with the norm fused into q|k|v and gate|up: the norm's sum of
 * squares is added in another order, so 1 / rms differs in its last bit in most launches (the
 * logits differ: the path ran), and where that flips an 8-bit rounding the random model's
 * cascade follows (session 19: the two sides then round independently), so the bound is
 * int8's own (variants 15 and 16 of test_op_gemv_sizes hold the kernels to the CPU's).
 * may_equal: Q8_0's synth model gave the same logits on the H200 (session 24: its sums of
 * squares came out the same in both orders), which is no fault; Q4_K_M's differ. */
static void check_graph_gemvq_one_pass(const char *arch, enum export_type type, bool may_equal)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.gemvq_int8 = off.gemvq_int8 = 1;
    on.gemvq_one_pass = 1, off.gemvq_one_pass = 0;
    check_graph_options_pair(arch, type, &on, &off, 5e-2, true, may_equal,
                             "gemvq x quantised in one pass vs staged");
}

/* The CPU model of the GGUF at path with every quantised product's x in f32 (the .exact
 * kernels), the reference the 8-bit products are measured from. */
static struct qwenrt_model *load_f32_x(const char *path)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    struct qwenrt_model *m = NULL;
    mp.backend = "cpu";
    if (qwenrt_model_load(path, &mp, &m, &err))
        fail_msg("load %s: %s", path, err.message);
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < m->plans[ph].n_ops; i++) {
            struct plan_op *op = &m->plans[ph].ops[i];
            if (op->kind == OP_LOGITS && !dtype_is_float(op->w->dtype)) {
                op->kernel = "logits.exact";
            } else if (op->kind == OP_MATMUL && !dtype_is_float(op->w->dtype)) {
                enum qr_dtype t = op->w->dtype;
                op->kernel = t == QR_Q8_0 ? "matmul.q8_0.exact" : t == QR_Q4_K ? "matmul.q4_k.exact"
                             : t == QR_Q6_K ? "matmul.q6_k.exact" : NULL;
                if (!op->kernel)
                    fail_msg("%s: no f32-x kernel for %s", path, dtype_traits(t)->name);
            }
        }
    return m;
}

/* The default decode step with x in 8 bits (gemvq_int8) against the CPU's default products,
 * which round x the same way, through the public API, from the CPU session's state at every
 * step (its checkpoint restored on the GPU), so that the steps' errors do not add up. Synth
 * models at width 1024 (gemvq is built for K of 1,024 and up: the transformers fixtures, K =
 * 128, decode with float x): Qwen3 Q4_K_M and Q8_0, Qwen3.5 Q8_0. The two sides' x differ in
 * their last bits, and where a rounding flips on one side only the random model amplifies it
 * (docs/perf-log.md, session 19), so each step is held within 2e-2 plus twice what rounding x
 * to 8 bits moves the CPU's own logits in that step (cuda_bench's bound); and the GPU must
 * really round (a float-x decode sits within ~1e-6 of the CPU's f32-x products). */
static void check_int8_from_cpu_state(const char *arch, enum export_type type)
{
    struct qwenrt_error err = {0};
    char path[256];
    struct qwenrt_model *cm = load_synth(arch, type, 1024, true, path, sizeof(path)), *gm = NULL;
    struct qwenrt_model *xm = load_f32_x(path);
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(path, &mp, &gm, &err))
        fail_msg("load %s: %s", path, err.message);
    int32_t V = gm->hp.n_vocab, prompt[9] = {11, 250, 37, 998, 4, 61, 300, 7, 90};
    struct qwenrt_session *g = NULL, *c = NULL, *x = NULL;
    assert_int_equal(qwenrt_session_init(gm, NULL, &g, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_init(cm, NULL, &c, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_init(xm, NULL, &x, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(c, prompt, 9, NULL, &err), QWENRT_OK);
    double rounds = 0; /* the GPU's largest distance from f32 x */
    for (int step = 0; step < 6; step++) {
        int32_t id = qwenrt_argmax(qwenrt_session_logits(c), V);
        struct qwenrt_checkpoint *cp = NULL;
        if (qwenrt_session_snapshot(c, &cp, &err) || qwenrt_session_restore(g, cp, &err) ||
            qwenrt_session_restore(x, cp, &err))
            fail_msg("%s: checkpoint: %s", arch, err.message);
        qwenrt_checkpoint_free(cp);
        assert_int_equal(qwenrt_session_decode(g, id, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_decode(c, id, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_decode(x, id, &err), QWENRT_OK);
        const float *lg = qwenrt_session_logits(g), *lc = qwenrt_session_logits(c), *lx = qwenrt_session_logits(x);
        double e = rel_err(lg, lc, (size_t)V), own = rel_err(lc, lx, (size_t)V), gx = rel_err(lg, lx, (size_t)V);
        printf("%s %s step %d: GPU vs the CPU's 8-bit products %.3g (bound %.3g), the CPU's own 8-bit effect %.3g, GPU vs f32 x %.3g\n",
               arch, export_type_name(type), step, e, 2e-2 + 2 * own, own, gx);
        if (!(e <= 2e-2 + 2 * own))
            fail_msg("%s %s step %d: the GPU's 8-bit decode is %.3g from the CPU's (own effect %.3g)", arch,
                     export_type_name(type), step, e, own);
        rounds = gx > rounds ? gx : rounds;
    }
    if (!(rounds > 1e-4))
        fail_msg("%s %s: the GPU's decode is within %.3g of f32 x: its products do not round x to 8 bits", arch,
                 export_type_name(type), rounds);
    qwenrt_session_free(g);
    qwenrt_session_free(c);
    qwenrt_session_free(x);
    qwenrt_model_free(gm);
    qwenrt_model_free(xm);
    qwenrt_model_free(cm);
    remove(path);
}

static void test_int8_from_cpu_state(void **st)
{
    (void)st;
    check_int8_from_cpu_state("qwen3-tiny", EXPORT_Q4_K_M);
    check_int8_from_cpu_state("qwen3-tiny", EXPORT_Q8_0);
    check_int8_from_cpu_state("qwen35-tiny", EXPORT_Q8_0);
}

static void test_graph_gemvq(void **st)
{
    (void)st;
    check_graph_gemvq("qwen3-tiny", EXPORT_Q4_K_M, false);
    check_graph_gemvq("qwen3-tiny", EXPORT_Q8_0, false);
    check_graph_gemvq("qwen35-tiny", EXPORT_Q4_K_M, false);
    check_graph_gemvq("qwen3-tiny", EXPORT_Q4_K_M, true);
    check_graph_gemvq("qwen35-tiny", EXPORT_Q8_0, true);
    check_graph_gemvq_int8("qwen3-tiny", EXPORT_Q4_K_M);
    check_graph_gemvq_int8("qwen3-tiny", EXPORT_Q8_0);
    check_graph_gemvq_one_pass("qwen3-tiny", EXPORT_Q4_K_M, false);
    check_graph_gemvq_one_pass("qwen3-tiny", EXPORT_Q8_0, true);
}

/* The fused MLP (norm + gate|up + SwiGLU + down + residual in one launch) against the two
 * launches it replaces, through the decode graph: 20 steps' logits and greedy ids (both forms
 * are off by default: this is their check). rows 0: mlp_fused.cu's clusters; 1 / 2:
 * mlp_rows.cu with the float / fixed-point accumulator; 3: its floats added to the residual
 * straight away (the GEMV + residual before storing the copy it reads). Sizes: Qwen3-0.6B's MLP (hidden 1024,
 * 3072 channels: mlp_fused.cu 12 clusters of 8 blocks, 32 channels and 128 rows of the down
 * product per block; mlp_rows.cu 128 blocks of 24 channels, on 132 multiprocessors), Qwen3.5's
 * at width 1024, and an awkward one (hidden 384, 1152 channels: mlp_fused.cu 12 per block, 48
 * rows, 12 chunks per down row; mlp_rows.cu 72 blocks of 16; F16). */
static void check_graph_mlp_shape(const char *arch, enum export_type type, int32_t width, int32_t rows,
                                  int32_t cluster, int32_t down)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.mlp_fused = rows == 0, off.mlp_fused = false;
    on.mlp_rows = rows, off.mlp_rows = 0;
    on.mlp_rows_cluster = cluster, on.mlp_rows_down = down;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, arch);
    const char *fused = "norm+gate|up+down+residual";
    assert_int_equal(cuda_session_count_steps(a, fused), m->hp.n_layer);
    assert_int_equal(cuda_session_count_steps(b, fused), 0);
    double tol = m->hp.arch == ARCH_QWEN35 ? 1e-3 : 1e-4; /* as check_mega_synth */
    char what[160];
    snprintf(what, sizeof(what), "graph fused MLP (%s, cluster %d, down %s) vs two launches, %s %s width %d",
             rows == 0 ? "clusters" : rows == 1 ? "rows, float sums" : rows == 2 ? "rows, fixed point" : "rows, in place",
             (int)cluster, down ? "in registers" : "in shared memory", arch, export_type_name(type), (int)width);
    double worst = decode_pair_once(a, b, m, path, what);
    if (!(worst <= tol))
        fail_msg("%s: logits differ by %.3g", what, worst);
    if (rows > 0 && !(worst > 0)) /* the two launches sum in another order: the rows did not run */
        fail_msg("%s: logits identical to the two launches'", what);
}

/* mlp_rows 2 (fixed point) gives the same logits bit for bit in two sessions, whatever order
 * its blocks' additions land in (the float accumulator, 1, is not held to this). */
static void test_graph_mlp_rows_same_bits(void **st)
{
    (void)st;
    char path[256];
    struct qwenrt_model *m = load_synth("qwen3-tiny", EXPORT_BF16, 1024, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options();
    on.mega = CUDA_MEGA_OFF;
    on.mlp_rows = 2;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &on, &a, &b, "mlp_rows 2 twice");
    assert_int_equal(cuda_session_count_steps(a, "norm+gate|up+down+residual"), m->hp.n_layer);
    double worst = decode_pair_once(a, b, m, path, "graph fused MLP (rows, fixed point), two sessions");
    if (worst != 0.0)
        fail_msg("mlp_rows 2: two sessions' logits differ by %.3g", worst);
}

/* cs's decode time line (cuda_session_timeline, reps replays) into rep: the text of the row
 * labelled label after its label cell, or NULL when there is no such row. */
static const char *timeline_row(struct cuda_session *cs, const char *label, int32_t reps, char *rep, size_t len)
{
    char key[96];
    struct qwenrt_error err = {0};
    if (cuda_session_timeline(cs, 7, 0, reps, rep, len, &err))
        fail_msg("timeline: %s", err.message);
    snprintf(key, sizeof(key), "| %s |", label);
    const char *row = strstr(rep, key);
    return row ? row + strlen(key) : NULL;
}

/* Whether cs's decode graph has launches labelled label that stamped "rows and x staged" in a
 * time line (cuda_session_timeline): gemv_smem, gemv_mma and the decode attention write that
 * stamp, gemv2 writes none, so this is the kernels' own word that they ran. */
static bool staged_in_timeline(struct cuda_session *cs, const char *label)
{
    char rep[4096];
    const char *row = timeline_row(cs, label, 1, rep, sizeof(rep));
    int n = 0;
    double ahead, release, staged; /* a '-' in the staged column stops the scan at 3 */
    return row && sscanf(row, " %d | %lf | %lf | %lf |", &n, &ahead, &release, &staged) == 4 && n > 0;
}

/* The GEMV with its rows in shared memory (gemv_smem.cu), with PDL as the decode graph uses it,
 * against gemv2 with PDL: 20 steps through the decode graph, logits and greedy ids. Widths: the
 * real 1024 (q|k|v and gate|up at 4 rows per warp, o and down K = 3072 / 3584 at 2) and an
 * awkward 384 in F16 (48 chunks per row: lanes 0-15 sum two, 16-31 one). warps / kb:
 * the block shape asked for (0, 0: the session's pick, 8 and 120 for these narrow models);
 * launch: cuda_options.gemv_smem_launch (when the blocks let the next launch start); mma:
 * cuda_options.gemv_mma (the sums on the tensor cores, BF16); xreg: cuda_options.gemv_smem_xreg
 * (x in each warp's registers, normalised there: the fused norms of q|k|v and gate|up). */
static void check_graph_gemv_smem(const char *arch, enum export_type type, int32_t width, int32_t warps, int32_t kb,
                                  int32_t launch, bool mma, bool xreg)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.pdl = off.pdl = true;
    on.gemv_smem = true, off.gemv_smem = false;
    on.gemv_smem_warps = warps, on.gemv_smem_kb = kb, on.gemv_smem_launch = launch, on.gemv_mma = mma;
    on.gemv_smem_xreg = xreg;
    if (xreg)
        assert_int_equal(cuda_gemv_smem_xreg_chunks(type == EXPORT_F16 ? QR_F16 : QR_BF16, width, width), 4);
    assert_true(cuda_gemv_smem_takes(type == EXPORT_F16 ? QR_F16 : QR_BF16, width, width));
    if (mma)
        assert_true(cuda_gemv_mma_takes(width, width));
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, arch);
    int32_t got_w = -1, got_kb = -1, got_launch = -1, got_mb = -1;
    cuda_session_gemv_smem_shape(a, &got_w, &got_kb, &got_launch, &got_mb);
    assert_int_equal(got_w, warps ? warps : 8);
    assert_int_equal(got_kb, kb ? kb : 136);
    /* the session's picks: after the wait with blocks of up to 8 warps, before it with 16;
     * warps halved below 96 blocks, 192 with 16 */
    assert_int_equal(got_launch, launch ? launch : got_w < 16 ? 2 : 1);
    assert_int_equal(got_mb, got_w >= 16 ? 192 : 96);
    /* the kinds' own: GEMV + residual and the SwiGLU pairs 64 with 16 warps, the rest as above */
    int32_t res = -1, pair = -1, multi = -1;
    cuda_session_gemv_smem_kind_minima(a, &res, &pair, &multi);
    assert_int_equal(res, got_w >= 16 ? 64 : 96);
    assert_int_equal(pair, got_w >= 16 ? 64 : 96);
    assert_int_equal(multi, got_mb);
    /* the kernels ran (their sums may equal gemv2's bit for bit: the same chunks per lane) */
    assert_true(staged_in_timeline(a, "gemv+residual"));
    assert_false(staged_in_timeline(b, "gemv+residual"));
    double tol = m->hp.arch == ARCH_QWEN35 ? 1e-3 : 1e-4; /* as check_mega_synth */
    char what[128];
    snprintf(what, sizeof(what), "graph gemv_smem (launch %d%s%s) vs gemv2 (pdl on), %s %s width %d", (int)launch,
             mma ? ", mma" : "", xreg ? ", x in registers" : "", arch, export_type_name(type), (int)width);
    double worst = decode_pair_once(a, b, m, path, what);
    if (!(worst <= tol))
        fail_msg("%s: logits differ by %.3g", what, worst);
}

/* cuda_options.gemv_smem_norm_late (1 / rms on the row sums of the fused-norm launches with x
 * in registers) against the default through the decode graph: the same products rounded in
 * another order, so the logits must differ (the path ran) and stay within gemv_smem's bounds
 * against gemv2 (above). warps / kb: the block shape (0, 0: the session's pick). */
static void check_graph_norm_late(const char *arch, int32_t warps, int32_t kb)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.gemv_smem_warps = off.gemv_smem_warps = warps, on.gemv_smem_kb = off.gemv_smem_kb = kb;
    on.gemv_smem_norm_late = 1, off.gemv_smem_norm_late = -1;
    assert_int_equal(cuda_gemv_smem_xreg_chunks(QR_BF16, 1024, 1024), 4);
    check_graph_options_pair(arch, EXPORT_BF16, &on, &off, strstr(arch, "qwen35") ? 1e-3 : 1e-4, false, false,
                             "gemv_smem norm late vs before the sums");
}

/* cuda_options.attn_o (the attention and the o product + residual in one launch, attn_o.cu)
 * against the two launches through the decode graph, on a synth model of arch widened to 1024
 * with head_dim (0: the preset's) heads: every attention layer must take the fused step, and
 * the logits of `prompt` prefilled positions and 20 decode steps after them must agree within
 * tol (not bit for bit: the sums run in other orders, which proves the path ran) with the same
 * greedy ids. single: attn_o_single (the position from which the cluster splits the positions
 * and merges them); cluster: attn_o (1: the session's pick, 8 or 16). */
static void check_graph_attn_pair(const char *arch, int32_t head_dim, const struct cuda_options *on_opt, bool kv16,
                                  int32_t prompt, double tol, const char *label, const char *fused);

static void check_graph_attn_o(const char *arch, int32_t head_dim, int32_t cluster, int32_t single, bool kv16,
                               int32_t prompt, double tol)
{
    struct cuda_options on = cuda_default_options();
    on.attn_o = cluster, on.attn_o_single = single;
    char label[64];
    snprintf(label, sizeof(label), "attn_o %d single %d", (int)cluster, (int)single);
    check_graph_attn_pair(arch, head_dim, &on, kv16, prompt, tol, label, "rope+attention+o+residual");
}

/* The decode graph with options on_opt (mega off, the cache f16 where kv16) against the
 * defaults on the attention geometry check_graph_attn_o describes: fused names the step that
 * must replace every "rope+attention" step, or, as "rope+attention (...)", the count of those
 * steps that must take the option on every layer and on none with the defaults (NULL: no
 * check of the steps). */
static void check_graph_attn_pair(const char *arch, int32_t head_dim, const struct cuda_options *on_opt, bool kv16,
                                  int32_t prompt, double tol, const char *label, const char *fused)
{
    struct qwenrt_error err = {0};
    struct model_hparams hp;
    char path[256], what[160];
    assert_int_equal(synth_preset(arch, &hp, &err), QWENRT_OK);
    hp.n_embd = 1024, hp.n_ff = 3072;
    hp.head_dim = head_dim ? head_dim : hp.head_dim;
    hp.n_rot = hp.arch == ARCH_QWEN35 ? hp.head_dim / 4 : hp.head_dim;
    hp.n_head = 2048 / hp.head_dim, hp.n_head_kv = hp.n_head / (hp.arch == ARCH_QWEN35 ? 4 : 2);
    struct qwenrt_model *m = write_load_synth(arch, &hp, EXPORT_BF16, "-attn", path, sizeof(path));
    struct cuda_options on = *on_opt, off = cuda_default_options();
    on.mega = off.mega = CUDA_MEGA_OFF;
    off.attn_cluster = -1; /* the default split and merge at every position */
    on.kv_f16 = off.kv_f16 = kv16;
    struct cuda_session *a = NULL, *b = NULL;
    snprintf(what, sizeof(what), "graph %s%s vs the defaults, %s head_dim %d, from position %d", label,
             kv16 ? " kv f16" : "", arch, (int)hp.head_dim, (int)prompt);
    init_pair(m, prompt + 64, &on, &off, &a, &b, what);
    int32_t layers = cuda_session_count_steps(b, "rope+attention");
    assert_true(layers > 0);
    if (fused && !strncmp(fused, "rope+attention (", 16)) {
        assert_int_equal(cuda_session_count_steps(a, fused), layers);
        assert_int_equal(cuda_session_count_steps(b, fused), 0);
    } else if (fused) {
        assert_int_equal(cuda_session_count_steps(a, fused), layers);
        assert_int_equal(cuda_session_count_steps(a, "rope+attention"), 0);
    }
    int32_t V = m->hp.n_vocab, id = 5;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    if (prompt > 0) {
        int32_t *ids = malloc((size_t)prompt * sizeof(int32_t));
        assert_non_null(ids);
        for (int32_t i = 0; i < prompt; i++)
            ids[i] = (i * 37 + 11) % V;
        if (cuda_session_run(a, ids, prompt, 0, false, la, NULL, NULL, &err) ||
            cuda_session_run(b, ids, prompt, 0, false, lb, NULL, NULL, &err))
            fail_msg("%s prompt: %s", what, err.message);
        free(ids);
        id = argmax_f(lb, V);
    }
    double worst = 0;
    for (int32_t t = prompt; t < prompt + 20; t++) {
        if (cuda_session_run(a, &id, 1, t, false, la, NULL, NULL, &err) ||
            cuda_session_run(b, &id, 1, t, false, lb, NULL, NULL, &err))
            fail_msg("%s step %d: %s", what, (int)t, err.message);
        double e = rel_err(la, lb, (size_t)V);
        worst = e > worst ? e : worst;
        assert_int_equal(argmax_f(la, V), argmax_f(lb, V));
        id = argmax_f(lb, V);
    }
    /* and the greedy loop: 32 steps, 8 per graph launch, from 12 positions before the prompt's
     * end (rewriting the cache rows from there), the same ids */
    int32_t ga[32], gb[32], from = prompt >= 12 ? prompt - 12 : prompt + 20;
    if (cuda_session_generate(a, id, from, 32, 0, ga, NULL, &err) ||
        cuda_session_generate(b, id, from, 32, 0, gb, NULL, &err))
        fail_msg("%s generate: %s", what, err.message);
    for (int i = 0; i < 32; i++)
        assert_int_equal(ga[i], gb[i]);
    printf("%s: worst logits rel err %.3g over 20 steps\n", what, worst);
    free_synth_pair(a, b, m, path, la, lb);
    if (tol == 0 ? worst != 0 : !(worst > 0 && worst <= tol))
        fail_msg("%s: logits differ by %.3g (want %s%g])", what, worst, tol == 0 ? "[" : "(0, ", tol);
}

/* cuda_options.attn_pipe (two rounds of K/V rows in flight, the default) against the loop of
 * one round at a time (attn_pipe -1): the same rounds summed in the same order, so the logits
 * are the same bit for bit — from position 0 (one round, then two), after 300 positions
 * (splits of 60: two rounds each), with the f16 cache (8 rows a round), at head sizes 256 and
 * 64. check_graph_attn_pair's other side runs the defaults (attn_pipe 1), so here "on" is the
 * option turned off. */
static void test_graph_attn_pipe(void **st)
{
    (void)st;
    struct cuda_options on = cuda_default_options();
    on.attn_pipe = -1;
    on.attn_cluster = -1; /* the pair's other side merges its splits the default way */
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 0, 0, "attn_pipe off", NULL);
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 300, 0, "attn_pipe off", NULL);
    check_graph_attn_pair("qwen3-tiny", 128, &on, true, 100, 0, "attn_pipe off", NULL);
    check_graph_attn_pair("qwen35-tiny", 256, &on, false, 40, 0, "attn_pipe off", NULL);
    check_graph_attn_pair("qwen35-tiny", 64, &on, true, 300, 0, "attn_pipe off", NULL);
}

/* cuda_options.attn_rope_regs (q/k norm + RoPE in each warp's registers) against the defaults:
 * the norm's sum in another order, so equal to rounding (and not bit for bit: that it ran) —
 * from position 0, after 300 positions (the cluster merge's window on this side, splits on the
 * other), the f16 cache, Qwen3.5's partial rotation (a quarter of 256 and of 64 dimensions). */
static void test_graph_attn_rope_regs(void **st)
{
    (void)st;
    struct cuda_options on = cuda_default_options();
    on.attn_rope_regs = 1;
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 0, 1e-4, "attn_rope_regs", NULL);
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 300, 1e-4, "attn_rope_regs", NULL);
    check_graph_attn_pair("qwen3-tiny", 128, &on, true, 100, 1e-4, "attn_rope_regs", NULL);
    check_graph_attn_pair("qwen35-tiny", 256, &on, false, 40, 1e-3, "attn_rope_regs", NULL);
    check_graph_attn_pair("qwen35-tiny", 64, &on, true, 300, 1e-3, "attn_rope_regs", NULL);
}

/* cuda_options.attn_shared_kv (each block attends two query heads of one KV head, loading
 * the rows once for both) against the default kernel through the decode graph: the same rounds
 * and sums for each head, so the logits keep their bits. Every attention layer must take it
 * (Qwen3: groups of 2 query heads, Qwen3.5: 4), from position 0 (one split) and after 300
 * positions (the splits merged pair by pair), both caches, head sizes 64, 128 and 256; with the
 * cluster merge in its window of positions the cluster's graphs keep their kernel. */
static void check_graph_shared_kv(const char *arch, int32_t head_dim, bool kv16, int32_t prompt,
                                  const struct cuda_options *on)
{
    check_graph_attn_pair(arch, head_dim, on, kv16, prompt, 0, "attn_shared_kv", "rope+attention (shared K/V)");
}

static void test_graph_attn_shared_kv(void **st)
{
    (void)st;
    struct cuda_options on = cuda_default_options();
    on.attn_shared_kv = 1;
    on.attn_cluster = -1; /* the pair's other side merges its splits the default way */
    check_graph_shared_kv("qwen3-tiny", 128, false, 0, &on);
    check_graph_shared_kv("qwen3-tiny", 128, false, 300, &on);
    check_graph_shared_kv("qwen3-tiny", 128, true, 100, &on);
    check_graph_shared_kv("qwen3-tiny", 64, true, 300, &on);
    check_graph_shared_kv("qwen35-tiny", 256, false, 40, &on);
    check_graph_shared_kv("qwen35-tiny", 256, true, 300, &on);
    /* beside the cluster merge's window (the session's pick for 16 heads): its graphs keep
     * their kernel, so the logits differ from the defaults' inside it as attn_cluster's do */
    on.attn_cluster = 0;
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, ATTN_CLUSTER_FROM - 12, 1e-4, "attn_shared_kv with the window",
                          "rope+attention (shared K/V)");
}

/* cuda_options.attn_lanes (a cached row's dot product over a group of 8 or 16 lanes) against
 * the default kernel (a row per warp) through the decode graph: the sums in another order, so
 * within tol with the same greedy ids; every attention layer must take it (head size 256: 16
 * lanes only). From position 0 (one split) and after 300 positions (splits), both caches; with
 * the cluster merge's window the cluster's graphs keep their kernel. */
static void test_graph_attn_lanes(void **st)
{
    (void)st;
    for (int lanes = 8; lanes <= 16; lanes += 8) {
        struct cuda_options on = cuda_default_options();
        on.attn_lanes = lanes;
        on.attn_cluster = -1; /* the pair's other side merges its splits the default way */
        const char *count = "rope+attention (lanes)";
        check_graph_attn_pair("qwen3-tiny", 128, &on, false, 0, 1e-4, "attn_lanes", count);
        check_graph_attn_pair("qwen3-tiny", 128, &on, true, 300, 1e-4, "attn_lanes", count);
        check_graph_attn_pair("qwen3-tiny", 64, &on, false, 300, 1e-4, "attn_lanes", count);
        if (lanes == 16) {
            check_graph_attn_pair("qwen35-tiny", 256, &on, false, 40, 1e-3, "attn_lanes", count);
            check_graph_attn_pair("qwen35-tiny", 256, &on, true, 300, 1e-3, "attn_lanes", count);
        }
        on.attn_cluster = 0; /* beside the window of the cluster merge (the session's pick) */
        check_graph_attn_pair("qwen3-tiny", 128, &on, false, ATTN_CLUSTER_FROM - 12, 1e-4, "attn_lanes with the window",
                              count);
    }
}

/* cuda_options.attn_stage (the cached rows staged in shared memory by bulk copies, one block
 * per KV head) against the default kernel through the decode graph: the sums in another order,
 * so within tol with the same greedy ids; every attention layer must take it (Qwen3: groups of
 * 2 query heads, Qwen3.5: 4). From position 0 (one split) and after 300 positions (splits),
 * both caches, head sizes 64, 128 and 256, rings of 1 and 4 tiles; with the cluster merge's
 * window the cluster's graphs keep their kernel. */
static void test_graph_attn_stage(void **st)
{
    (void)st;
    for (int stages = 1; stages <= 4; stages += 3) {
        struct cuda_options on = cuda_default_options();
        on.attn_stage = stages;
        on.attn_cluster = -1; /* the pair's other side merges its splits the default way */
        const char *count = "rope+attention (staged)";
        check_graph_attn_pair("qwen3-tiny", 128, &on, false, 0, 1e-4, "attn_stage", count);
        check_graph_attn_pair("qwen3-tiny", 128, &on, true, 300, 1e-4, "attn_stage", count);
        check_graph_attn_pair("qwen3-tiny", 64, &on, false, 300, 1e-4, "attn_stage", count);
        check_graph_attn_pair("qwen35-tiny", 256, &on, false, 40, 1e-3, "attn_stage", count);
        check_graph_attn_pair("qwen35-tiny", 256, &on, true, 300, 1e-3, "attn_stage", count);
        on.attn_cluster = 0; /* beside the window of the cluster merge (the session's pick) */
        check_graph_attn_pair("qwen3-tiny", 128, &on, false, ATTN_CLUSTER_FROM - 12, 1e-4, "attn_stage with the window",
                              count);
    }
}

/* cuda_options.attn_cluster (a head's attention splits as one cluster merged through
 * distributed shared memory) against the default split and merge: at every position (1)
 * after a prompt of 300 positions (8 splits against the default's 5), and from position 0
 * with splits from 16 positions on (attn_one_split 0, attn_split_min 16: empty splits in the
 * cluster); in its window of positions (2). */
static void test_graph_attn_cluster(void **st)
{
    (void)st;
    struct cuda_options on = cuda_default_options();
    on.attn_cluster = 1;
    check_graph_attn_pair("qwen3-tiny", 128, &on, true, 300, 1e-4, "attn_cluster", NULL);
    check_graph_attn_pair("qwen35-tiny", 256, &on, false, 300, 1e-3, "attn_cluster", NULL);
    check_graph_attn_pair("qwen35-tiny", 64, &on, true, 300, 1e-3, "attn_cluster", NULL);
    on.attn_one_split = 0, on.attn_split_min = 16;
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 0, 1e-4, "attn_cluster (split_min 16)", NULL);
    /* the window (attn_cluster 2, the default for 16 heads or more): single steps across its
     * start (from 12 positions before ATTN_CLUSTER_FROM to 8 after), and the greedy loop's
     * launches of 8 across it (from 24 before) */
    on = cuda_default_options();
    on.attn_cluster = 2;
    check_graph_attn_pair("qwen3-tiny", 128, &on, true, ATTN_CLUSTER_FROM - 12, 1e-4, "attn_cluster window", NULL);
    /* a window of a profile's (attn_cluster_from / _until): positions 140-159 are inside (past
     * attn_one_split's single split), so the logits differ from the defaults', which never
     * merge in a cluster there */
    on.attn_cluster_from = 140, on.attn_cluster_until = 160;
    check_graph_attn_pair("qwen3-tiny", 128, &on, false, 136, 1e-4, "attn_cluster window 140-160", NULL);
}

static void test_graph_attn_o(void **st)
{
    (void)st;
    /* Qwen3-0.6B's attention geometry (16 heads of 128, clusters of 8): every block attends
     * all positions; the cluster's slices merged from position 1 (empty slices at first) and
     * from 4; clusters of 16; the f16 cache */
    check_graph_attn_o("qwen3-tiny", 128, 1, 0, false, 0, 1e-4);
    check_graph_attn_o("qwen3-tiny", 128, 1, 1, false, 0, 1e-4);
    check_graph_attn_o("qwen3-tiny", 128, 16, 4, true, 0, 1e-4);
    /* Qwen3.5-0.8B's (8 gated heads of 256, clusters of 16), and head size 64 */
    check_graph_attn_o("qwen35-tiny", 256, 1, 0, true, 0, 1e-3);
    check_graph_attn_o("qwen35-tiny", 256, 8, 1, false, 0, 1e-3);
    check_graph_attn_o("qwen35-tiny", 64, 1, 4, true, 0, 1e-3);
    /* after a prompt of 300 positions: 38 per slice, several rounds of rows per warp */
    check_graph_attn_o("qwen3-tiny", 128, 1, 0, true, 300, 1e-4);
    check_graph_attn_o("qwen35-tiny", 256, 1, 0, true, 300, 1e-3);
}

/* cuda_options.gemv_smem_waves (blocks of any number of warps, the grid within N per
 * multiprocessor) against the default shapes through the decode graph: a row's sums do not
 * depend on its block (x in each warp's registers, or staged whole without a norm at K above
 * 2,048), so the logits must be the same bit for bit; 1 makes blocks of 6 warps for the
 * widened qwen3-tiny's gate|up pairs, 3 blocks of 2 (check_gemv_smem_waves has the shapes). */
/* on (the megakernel off) against the defaults through the decode graph of both families
 * (BF16, widened to 1024): the same logits bit for bit. */
static void check_same_logits_both(struct cuda_options on, const char *what)
{
    struct cuda_options off = cuda_default_options();
    on.mega = off.mega = CUDA_MEGA_OFF;
    check_graph_options_pair("qwen3-tiny", EXPORT_BF16, &on, &off, 0, false, true, what);
    check_graph_options_pair("qwen35-tiny", EXPORT_BF16, &on, &off, 0, false, true, what);
}

static void test_graph_gemv_smem_waves(void **st)
{
    (void)st;
    for (int32_t waves = 1; waves <= 3; waves += 2) {
        struct cuda_options on = cuda_default_options();
        on.gemv_smem_waves = waves;
        check_same_logits_both(on, waves == 1 ? "gemv_smem waves 1 vs halved shapes" : "gemv_smem waves 3 vs halved shapes");
    }
}

/* cuda_options.gemv_launch_ahead (a GEMV + residual launch starts the fused-norm GEMV after
 * it before its own wait) against it off (-1) through the decode graph: only when the next
 * launch's blocks start differs, so the logits must be the same bit for bit; 1 marks the
 * launches before gate|up (one per layer), 2 every GEMV + residual launch (each is followed by
 * a fused-norm GEMV: gate|up, the next layer's q|k|v or in_proj, the LM head), 3 all but those
 * before gate|up; 0, the session's pick, is 3 for 16-bit rows plus those before gate|up in the
 * cluster-merged attention's graphs, 3 for K-quant rows (Q4_K_M), none for Q8_0 rows. With the tiny models' few
 * heads the cluster graphs are not built, so the logits compare the launches that are marked. */
static void check_launch_ahead(const char *arch, enum export_type type)
{
    char path[256];
    for (int32_t ahead = 0; ahead <= 3; ahead++) {
        struct qwenrt_model *m = load_synth(arch, type, 1024, true, path, sizeof(path));
        struct cuda_options on = cuda_default_options(), off = on;
        on.mega = off.mega = CUDA_MEGA_OFF;
        on.gemv_launch_ahead = ahead, off.gemv_launch_ahead = -1;
        struct cuda_session *a = NULL, *b = NULL;
        init_pair(m, 64, &on, &off, &a, &b, arch);
        int32_t marked = cuda_session_count_steps(a, "gemv+residual (ahead)");
        bool quantised = type != EXPORT_BF16 && type != EXPORT_F16, q8 = type == EXPORT_Q8_0;
        int32_t all = cuda_session_count_steps(a, "gemv+residual"), mlp = cuda_session_count_steps(a, "norm+gate|up+swiglu");
        int32_t want = ahead == 1 ? mlp : ahead == 2 ? all : ahead == 3 || !q8 ? all - mlp : 0;
        /* the pick for 16-bit rows: before gate|up only in the cluster-merged attention's graphs */
        int32_t marked_cl = cuda_session_count_steps(a, "gemv+residual (ahead in cluster graphs)");
        int32_t want_cl = ahead == 0 && !quantised ? mlp : 0;
        if (marked != want || marked_cl != want_cl || marked < (ahead == 0 && q8 ? 0 : 1) ||
            cuda_session_count_steps(b, "gemv+residual (ahead)") != 0)
            fail_msg("gemv_launch_ahead %d, %s: %d (%d in cluster graphs) launches start the next early, want %d (%d)",
                     (int)ahead, arch, (int)marked, (int)marked_cl, (int)want, (int)want_cl);
        char what[96];
        snprintf(what, sizeof(what), "graph gemv_launch_ahead %d vs off, %s %s", (int)ahead, arch,
                 export_type_name(type));
        double worst = decode_pair_once(a, b, m, path, what);
        if (worst != 0)
            fail_msg("%s: logits differ by %.3g (want the same bits)", what, worst);
    }
}

static void test_graph_launch_ahead(void **st)
{
    (void)st;
    check_launch_ahead("qwen3-tiny", EXPORT_BF16);
    check_launch_ahead("qwen35-tiny", EXPORT_BF16);
    check_launch_ahead("qwen3-tiny", EXPORT_Q4_K_M);
    check_launch_ahead("qwen3-tiny", EXPORT_Q8_0);
    /* the pick's launches before gate|up that start it early only in the cluster-merged
     * attention's graphs: with the cluster merge always on (attn_cluster 1) those graphs are
     * the ones that run, and against gemv_launch_ahead off the logits keep their bits */
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.attn_cluster = off.attn_cluster = 1;
    off.gemv_launch_ahead = -1;
    check_graph_options_pair("qwen3-tiny", EXPORT_BF16, &on, &off, 0, false, true,
                             "gemv_launch_ahead pick vs off, cluster-merged attention graphs");
}

/* The time line's "most blocks on one multiprocessor" of cs's launches labelled label (mean
 * over launches and replays), -1 when the report has no such row. */
static double most_blocks_on_one_sm(struct cuda_session *cs, const char *label)
{
    char rep[4096];
    const char *row = timeline_row(cs, label, 2, rep, sizeof(rep));
    int n = 0;
    double f[7];
    if (!row || sscanf(row, " %d | %lf | %lf | %lf | %lf | %lf | %lf | %lf |", &n, &f[0], &f[1], &f[2], &f[3], &f[4],
                       &f[5], &f[6]) != 8)
        return -1;
    return f[6];
}

/* cuda_options.gemv_smem_alone (blocks that reserve over half a multiprocessor's shared
 * memory where the grid fits once) against the default: only the reservation differs, so the
 * logits must be the same bit for bit; and with 1, the q|k|v launches' blocks (under one
 * wave here) are each alone on their multiprocessor in the time line. */
static void test_graph_gemv_smem_alone(void **st)
{
    (void)st;
    for (int32_t alone = 1; alone <= 2; alone++) {
        struct cuda_options on = cuda_default_options();
        on.gemv_smem_alone = alone;
        check_same_logits_both(on, alone == 1 ? "gemv_smem alone 1 vs shared" : "gemv_smem alone 2 vs shared");
    }
    char path[256];
    struct qwenrt_model *m = load_synth("qwen3-tiny", EXPORT_BF16, 1024, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.gemv_smem_alone = 1;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, "alone");
    double most = most_blocks_on_one_sm(a, "norm+gemv(multi)");
    printf("gemv_smem alone 1: most q|k|v blocks on one multiprocessor %.2f (default %.2f)\n", most,
           most_blocks_on_one_sm(b, "norm+gemv(multi)"));
    assert_true(most == 1.0);
    free_synth_pair(a, b, m, path, NULL, NULL);
}

static void test_graph_gemv_smem(void **st)
{
    (void)st;
    check_graph_gemv_smem("qwen3-tiny", EXPORT_BF16, 1024, 0, 0, 0, false, false);
    check_graph_gemv_smem("qwen35-tiny", EXPORT_BF16, 1024, 0, 0, 0, false, false);
    check_graph_gemv_smem("qwen35-tiny", EXPORT_BF16, 1024, 16, 160, 0, false, false); /* Qwen3.5-0.8B's pick */
    check_graph_gemv_smem("qwen3-tiny", EXPORT_F16, 384, 0, 0, 0, false, false);
    /* every block launching its successor early, and every one after the wait */
    check_graph_gemv_smem("qwen3-tiny", EXPORT_BF16, 1024, 0, 0, 1, false, false);
    check_graph_gemv_smem("qwen35-tiny", EXPORT_BF16, 1024, 16, 160, 2, false, false);
    /* the sums on the tensor cores: norms fused, the SwiGLU pair, the residual added */
    check_graph_gemv_smem("qwen3-tiny", EXPORT_BF16, 1024, 0, 0, 0, true, false);
    check_graph_gemv_smem("qwen35-tiny", EXPORT_BF16, 1024, 16, 160, 0, true, false);
    /* x in each warp's registers: the norms, the pair, 8 chunks per lane without a norm */
    check_graph_gemv_smem("qwen3-tiny", EXPORT_BF16, 1024, 0, 0, 0, false, true);
    check_graph_gemv_smem("qwen35-tiny", EXPORT_BF16, 1024, 16, 160, 0, false, true);
    check_graph_gemv_smem("qwen3-tiny", EXPORT_F16, 384, 0, 0, 0, false, true);
    check_graph_norm_late("qwen3-tiny", 0, 0);
    check_graph_norm_late("qwen35-tiny", 16, 160);
}

/* The KV cache in f16 (cuda_options.kv_f16) against f32 through the decode graph: 20 steps'
 * logits within 1e-2 and the same greedy ids, half the cache's device bytes; a session that
 * asks for the megakernel with it gets the graph and a reason. */
static void check_graph_kv_f16(const char *arch, enum export_type type, int32_t width)
{
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.kv_f16 = true;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, arch);
    int64_t bytes16 = cuda_session_device_bytes(a), bytes32 = cuda_session_device_bytes(b);
    /* the cache: n_ctx 64 x kv width x 2 (K, V) x layers with attention, 2 bytes less each */
    int64_t kv_w = (int64_t)m->hp.n_head_kv * m->hp.head_dim, n_attn = 0;
    for (int32_t i = 0; i < m->plans[1].n_ops; i++) /* the decode plan: one attention op per layer */
        n_attn += m->plans[1].ops[i].kind == OP_ATTENTION;
    assert_true(n_attn > 0);
    if (bytes32 - bytes16 < n_attn * 2 * 64 * kv_w * 2)
        fail_msg("kv f16 %s: device bytes %lld vs %lld with f32", arch, (long long)bytes16, (long long)bytes32);
    struct qwenrt_error err = {0};
    struct cuda_options mk = on;
    mk.mega = CUDA_MEGA_ON;
    struct cuda_session *c = NULL;
    if (cuda_session_init(m->plans, 64, &mk, &c, &err))
        fail_msg("kv f16 with the megakernel asked for: %s", err.message);
    const char *why = NULL;
    assert_false(cuda_session_uses_megakernel(c, &why));
    assert_non_null(strstr(why, "kv_f16"));
    cuda_session_free(c);
    char what[96];
    snprintf(what, sizeof(what), "graph kv cache f16 vs f32, %s %s width %d", arch, export_type_name(type), (int)width);
    double worst = decode_pair_once(a, b, m, path, what);
    if (!(worst <= 1e-2) || worst == 0.0) /* 0: the f16 cache was not used */
        fail_msg("%s: logits differ by %.3g", what, worst);
}

static void test_graph_kv_f16(void **st)
{
    (void)st;
    check_graph_kv_f16("qwen3-tiny", EXPORT_BF16, 1024);
    check_graph_kv_f16("qwen35-tiny", EXPORT_BF16, 1024);
}

static void check_graph_mlp(const char *arch, enum export_type type, int32_t width, int32_t rows)
{
    check_graph_mlp_shape(arch, type, width, rows, 0, 0);
}

static void test_graph_mlp_fused(void **st)
{
    (void)st;
    for (int32_t rows = 0; rows <= 3; rows++) {
        check_graph_mlp("qwen3-tiny", EXPORT_BF16, 1024, rows);
        check_graph_mlp("qwen35-tiny", EXPORT_BF16, 1024, rows);
        check_graph_mlp("qwen3-tiny", EXPORT_F16, 384, rows);
    }
    /* mlp_rows' clusters (partials summed through distributed shared memory first; 384 / 8
     * rows of 4 floats: 12 per block) and its down columns in registers */
    for (int32_t rows = 1; rows <= 3; rows++) {
        check_graph_mlp_shape("qwen3-tiny", EXPORT_BF16, 1024, rows, 8, 1);
        check_graph_mlp_shape("qwen35-tiny", EXPORT_BF16, 1024, rows, 4, 0);
        check_graph_mlp_shape("qwen3-tiny", EXPORT_F16, 384, rows, 2, 1);
    }
}

/* One pair of decode graphs over a synth Qwen3.5 with the given DeltaNet heads (qwen35-tiny's
 * dk 32, dv 48 where ssm_dim is 0, else ssm_dim x ssm_dim; the conv fused where own_key_heads):
 * on against off (the megakernel off in both), 20 steps; the worst logits difference. The
 * heads go to *dk, *dv. */
static double gdn_graph_pair(bool own_key_heads, int32_t ssm_dim, struct cuda_options on, struct cuda_options off,
                             const char *form, int32_t *dk, int32_t *dv)
{
    char path[256];
    struct qwenrt_model *m = load_synth_ssm("qwen35-tiny", EXPORT_BF16, 256, own_key_heads, ssm_dim, path, sizeof(path));
    *dk = m->hp.ssm_k_dim, *dv = m->hp.ssm_v_dim;
    on.mega = off.mega = CUDA_MEGA_OFF;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, form);
    char what[160];
    snprintf(what, sizeof(what), "graph DeltaNet step, %s, heads %d x %d%s", form, (int)*dk, (int)*dv,
             own_key_heads ? ", conv fused" : "");
    return decode_pair_once(a, b, m, path, what);
}

/* The DeltaNet decode step split over a cluster per value head (gdn_decode.cu) against one
 * block per head (gdn_core_kernel), through the decode graph: 20 steps' logits and greedy ids.
 * Heads: qwen35-tiny's (dk 32, dv 48: 6 columns per block, 96 threads) with the conv fused
 * (Hv == Hk) and without (Hv = 2 Hk), and Qwen3.5-0.8B's (128 x 128: 16 columns, 256 threads). */
static void check_graph_gdn_split(bool own_key_heads, int32_t ssm_dim)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.gdn_split = true, off.gdn_split = false;
    int32_t dk, dv;
    double worst = gdn_graph_pair(own_key_heads, ssm_dim, on, off, "split per head vs one block per head", &dk, &dv);
    if (!(worst <= 1e-3)) /* as check_mega_synth for Qwen3.5 */
        fail_msg("gdn split: logits differ by %.3g", worst);
    /* and the split kernel did run: its row sums go in another order, so 20 steps of logits
     * are not bit for bit the one-block kernel's */
    if (!(worst > 0))
        fail_msg("gdn split: logits identical to the one-block kernel's: the split did not run");
}

/* cuda_options.gdn_staged: the split step with its state slice moved through shared memory in
 * rows against the same step without: the same arithmetic on the same values, so the same
 * logits bit for bit over 20 steps (a wrong row, column or stride of the tile would not be).
 * early: gdn_early (the slice copied before the step's wait) or -1 (after it). */
static void check_graph_gdn_staged(bool own_key_heads, int32_t ssm_dim, int32_t early)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.gdn_early = off.gdn_early = early;
    on.gdn_staged = 1;
    off.gdn_staged = 0; /* the default is on: pinned off, so that the pair compares the two forms */
    int32_t dk, dv;
    double worst = gdn_graph_pair(own_key_heads, ssm_dim, on, off,
                                  early < 0 ? "state staged vs not, read after the wait" : "state staged vs not", &dk, &dv);
    assert_true(cuda_gdn_staged_bytes(dk, dv, true) > 0); /* the staged form applies */
    if (worst != 0.0)
        fail_msg("gdn staged: logits differ by %.3g from the unstaged step's", worst);
}

/* cuda_options.gdn_wide: the one-session split step in blocks of two norm groups (half the
 * blocks per head, twice the threads) against a block per group: the gated norm's sum is added
 * group by group either way, so the same logits bit for bit over 20 steps (a group summed
 * twice or missed, or a part pushed to the wrong slot, would not be). */
static void check_graph_gdn_wide(bool own_key_heads, int32_t ssm_dim)
{
    struct cuda_options on = cuda_default_options(), off = on;
    on.gdn_wide = 1, off.gdn_wide = 0;
    int32_t dk, dv;
    double worst = gdn_graph_pair(own_key_heads, ssm_dim, on, off, "wide blocks vs a block per group", &dk, &dv);
    assert_true(cuda_gdn_staged_bytes(dk, dv, true) > cuda_gdn_staged_bytes(dk, dv, false)); /* the wide form applies */
    if (worst != 0.0)
        fail_msg("gdn wide: logits differ by %.3g from a block per group", worst);
}

static void test_graph_gdn_split(void **st)
{
    (void)st;
    check_graph_gdn_split(true, 0);
    check_graph_gdn_split(false, 0);
    check_graph_gdn_split(true, 128);
    check_graph_gdn_staged(true, 0, 0);
    check_graph_gdn_staged(false, 0, 0);
    check_graph_gdn_staged(true, 128, 0);
    check_graph_gdn_staged(true, 128, -1);
    check_graph_gdn_wide(true, 0);
    check_graph_gdn_wide(false, 0);
    check_graph_gdn_wide(true, 128);
}

/* The megakernel's register paths (16-bit rows with K = 1024, 2048 or 3072 and Q8_0 rows
 * with K = 1024 / 2048 / 3072) only run at the real models' widths: hidden 1024, o-proj K
 * 2048, down K 3072, on a few layers and a small vocabulary. */
static void test_megakernel_real_width(void **st)
{
    (void)st;
    /* 16-bit weights: the down product in the SwiGLU phase (mk_down, cuda_options.mega_fuse_down)
     * and as its own phase (the default) */
    check_mega_synth("qwen3-tiny", EXPORT_BF16, 1024, true, false);
    check_mega_synth("qwen3-tiny", EXPORT_BF16, 1024, false, false);
    check_mega_synth("qwen3-tiny", EXPORT_F16, 1024, true, false);
    check_mega_synth("qwen3-tiny", EXPORT_Q8_0, 1024, true, false);
    check_mega_synth("qwen3-tiny", EXPORT_Q4_K_M, 1024, true, false);
    check_mega_synth("qwen35-tiny", EXPORT_BF16, 1024, true, false);
    check_mega_synth("qwen35-tiny", EXPORT_BF16, 256, false, true);
    /* awkward fused shapes: 1152 rows of h over 132 blocks (8 or 9 each), 384 outputs (a
     * thread's four columns only for the first 96 threads) */
    check_mega_synth("qwen3-tiny", EXPORT_BF16, 384, true, false);
}

static void test_megakernel_quantised(void **st)
{
    (void)st;
    check_mega_synth("qwen3-tiny", EXPORT_Q4_K_M, 256, true, false);
    check_mega_synth("qwen3-tiny", EXPORT_Q8_0, 256, true, false);
    check_mega_synth("qwen3-tiny", EXPORT_F16, 256, true, false); /* fused: 768 rows of h, 5 or 6
                                                                * per block */
    check_mega_synth("qwen35-tiny", EXPORT_Q8_0, 0, true, false);
    check_mega_synth("qwen35-tiny", EXPORT_Q6_K, 256, true, false);
}

/* qwenrt_batch_decode on CUDA sessions (cuda_batch_decode) against each session decoding
 * alone: n sequences with different prompts and positions, several steps; n = 3 runs the
 * row-wise matmuls as GEMVs, n = 9 as GEMMs. */
static void check_batch_model(struct qwenrt_model *m, const char *dir, int32_t n, double tol)
{
    struct qwenrt_error err = {0};
    int32_t V = m->hp.n_vocab;
    struct qwenrt_session *bs[16], *rs[16];
    struct qwenrt_batch *batch = NULL;
    assert_true(n <= 16);
    assert_int_equal(qwenrt_batch_init(m, n, &batch, &err), QWENRT_OK);
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(qwenrt_session_init(m, NULL, &bs[i], &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_init(m, NULL, &rs[i], &err), QWENRT_OK);
        int32_t prompt[20];
        for (int32_t t = 0; t < 3 + i; t++) /* different lengths: different positions */
            prompt[t] = (17 * (i + 1) + 31 * t) % V;
        assert_int_equal(qwenrt_session_prefill(bs[i], prompt, 3 + i, NULL, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(rs[i], prompt, 3 + i, NULL, &err), QWENRT_OK);
    }
    double worst = 0;
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    assert_int_equal(qwenrt_sampler_init(&gp, V, &greedy, &err), QWENRT_OK);
    for (int step = 0; step < 4; step++) {
        int32_t ids[16];
        for (int32_t i = 0; i < n; i++)
            ids[i] = qwenrt_argmax(qwenrt_session_logits(rs[i]), V);
        if (qwenrt_batch_decode(batch, bs, ids, n, &err))
            fail_msg("%s: batch decode: %s", dir, err.message);
        for (int32_t i = 0; step % 2 && i < n; i++) /* every pick started first, as the server does */
            session_sample_start(bs[i], greedy);
        for (int32_t i = 0; i < n; i++) {
            assert_int_equal(qwenrt_session_decode(rs[i], ids[i], &err), QWENRT_OK);
            /* the batch left each row on the GPU: sampling reads its best token there */
            int32_t picked = -1;
            assert_int_equal(qwenrt_session_sample(bs[i], greedy, &picked, &err), QWENRT_OK);
            const float *a = qwenrt_session_logits(bs[i]), *b = qwenrt_session_logits(rs[i]);
            assert_int_equal(picked, qwenrt_argmax(a, V));
            double e = rel_err(a, b, (size_t)V);
            worst = e > worst ? e : worst;
            assert_int_equal(qwenrt_argmax(a, V), qwenrt_argmax(b, V));
        }
    }
    qwenrt_sampler_free(greedy);
    printf("%s: batch of %d on CUDA vs alone: worst logits rel err %.3g\n", dir, n, worst);
    if (!(worst <= tol))
        fail_msg("%s: batched CUDA decode differs by %.3g", dir, worst);
    for (int32_t i = 0; i < n; i++) {
        qwenrt_session_free(bs[i]);
        qwenrt_session_free(rs[i]);
    }
    qwenrt_batch_free(batch);
}

static void check_batch_cuda(const char *dir, int32_t n)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(dir, &mp, &m, &err))
        fail_msg("load %s: %s", dir, err.message);
    check_batch_model(m, dir, n, 1e-4);
    qwenrt_model_free(m);
}

static void test_batch_decode_cuda(void **st)
{
    (void)st;
    check_batch_cuda(fixtures[0], 3);
    check_batch_cuda(fixtures[0], 9);
    check_batch_cuda(fixtures[2], 3);
    check_batch_cuda(fixtures[3], 9);
    check_batch_cuda(fixtures[1], 5); /* 16-bit rows at n <= 8: gemv_batch.cu */
    check_batch_cuda(fixtures[3], 4);
}

/* A quantised model's batched step in the default precision (x in 8 bits) runs
 * gemvq_batch_mma.cu where every product is whole super-blocks. Where the one-token products
 * are gemvq's too (a Qwen3 Q4_K_M synth of width 1,024: K = 1,024, 2,048 and 3,072, as
 * Qwen3-0.6B's), both add in quant_rows_i8.cuh's canonical order, so each session's logits
 * batched are bit for bit its logits alone, step after step, and the server batches such models
 * (cuda_batch_pays: 3 to 16 sessions) — also deep in the context, where the batched attention
 * splits each session's keys as its own graph does (from position 128 several splits, from 192
 * the cluster window's 8; before session 38 a batch of 12 took 2). At width 256 the one-token
 * products take another kernel (gemvq is built for 4-14 super-blocks) with x in f32: the server
 * feeds those one by one, and the batch stays near alone (logits within 1e-1: 8-bit against f32
 * activations, ~2% on random weights; the argmax not asserted: a near tie of a random model may
 * flip). Qwen3.5: test_batch_int8_q35_cuda. */
static long batch_int8_differ(struct qwenrt_model *m, int32_t n, int32_t depth, double *worst_out)
{
    struct qwenrt_error err = {0};
    int32_t V = m->hp.n_vocab;
    struct qwenrt_session *bs[16], *rs[16];
    struct qwenrt_batch *batch = NULL;
    int32_t *prompt = malloc((size_t)(depth + 3 + n) * sizeof(int32_t));
    assert_non_null(prompt);
    assert_int_equal(qwenrt_batch_init(m, n, &batch, &err), QWENRT_OK);
    for (int32_t i = 0; i < n; i++) { /* session i at position depth + 3 + i */
        for (int32_t t = 0; t < depth + 3 + i; t++)
            prompt[t] = (17 * (i + 1) + 31 * t) % V;
        assert_int_equal(qwenrt_session_init(m, NULL, &bs[i], &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_init(m, NULL, &rs[i], &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(bs[i], prompt, depth + 3 + i, NULL, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(rs[i], prompt, depth + 3 + i, NULL, &err), QWENRT_OK);
    }
    free(prompt);
    double worst = 0;
    long differ = 0;
    for (int step = 0; step < 4; step++) {
        int32_t ids[16];
        for (int32_t i = 0; i < n; i++)
            ids[i] = qwenrt_argmax(qwenrt_session_logits(rs[i]), V);
        if (qwenrt_batch_decode(batch, bs, ids, n, &err))
            fail_msg("batch decode: %s", err.message);
        for (int32_t i = 0; i < n; i++) {
            assert_int_equal(qwenrt_session_decode(rs[i], ids[i], &err), QWENRT_OK);
            const float *a = qwenrt_session_logits(bs[i]), *b = qwenrt_session_logits(rs[i]);
            double e = rel_err(a, b, (size_t)V);
            worst = e > worst ? e : worst;
            for (int32_t v = 0; v < V; v++)
                differ += memcmp(&a[v], &b[v], sizeof(float)) != 0;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        qwenrt_session_free(bs[i]);
        qwenrt_session_free(rs[i]);
    }
    qwenrt_batch_free(batch);
    *worst_out = worst;
    return differ;
}

static void check_batch_int8_model(struct qwenrt_model *m, int32_t n, int32_t depth, bool same_bits,
                                   const char *what)
{
    double worst = 0;
    long differ = batch_int8_differ(m, n, depth, &worst);
    printf("%s: batch of %d (8-bit x) from depth %d vs alone: worst logits rel err %.3g, %ld logits not bit for bit\n",
           what, n, (int)depth, worst, differ);
    if (same_bits ? differ != 0 : !(worst <= 1e-1))
        fail_msg("%s: 8-bit batched decode differs by %.3g (%ld logits)", what, worst, differ);
}

/* cuda_batch_pays for 1-17 sessions of m in the default precision: from 3 to 16 when pays; never
 * where a profile pins gemvq's rows to 1 (its x staged otherwise than the batch's: not the same
 * quants after a fused norm) or turns the one-pass staging off. */
static void check_batch_pays_int8(const struct qwenrt_model *m, bool pays, const char *what)
{
    struct qwenrt_error err = {0};
    struct cuda_session *cs = NULL;
    struct cuda_options o = cuda_default_options();
    assert_int_equal(cuda_session_init(m->plans, 16, &o, &cs, &err), QWENRT_OK);
    for (int32_t n = 1; n <= 17; n++)
        if (cuda_batch_pays(cs, n) != (pays && n >= 3 && n <= 16))
            fail_msg("%s: cuda_batch_pays(%d) says %s", what, n, pays ? "no" : "yes");
    cuda_session_free(cs);
    for (int k = 0; k < 2; k++) {
        o = cuda_default_options();
        if (k == 0)
            o.gemvq_rows = 1;
        else
            o.gemvq_one_pass = 0;
        assert_int_equal(cuda_session_init(m->plans, 16, &o, &cs, &err), QWENRT_OK);
        if (cuda_batch_pays(cs, 8))
            fail_msg("%s: cuda_batch_pays(8) says yes with %s", what, k ? "gemvq_one_pass 0" : "gemvq_rows 1");
        cuda_session_free(cs);
    }
}

/* synth's model at path again, on the CUDA backend (load_synth's is the CPU's), the first freed. */
static struct qwenrt_model *reload_cuda(struct qwenrt_model *synth, const char *path)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    qwenrt_model_free(synth);
    if (qwenrt_model_load(path, &mp, &m, &err))
        fail_msg("load %s on CUDA: %s", path, err.message);
    return m;
}

/* Each of the n values bad of the environment variable var makes a session of m refused
 * (INVALID_ARG, no session) by a message that names var or the option it sets; var unset after. */
static void check_env_refused(struct qwenrt_model *m, const char *var, const char *option, const char *const *bad,
                              size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct qwenrt_error err = {0};
        struct qwenrt_session *s = NULL;
        setenv(var, bad[i], 1);
        assert_int_equal(qwenrt_session_init(m, NULL, &s, &err), QWENRT_ERR_INVALID_ARG);
        assert_null(s);
        if (!strstr(err.message, var) && !strstr(err.message, option))
            fail_msg("%s=\"%s\": the refusal \"%s\" names neither %s nor %s", var, bad[i], err.message, var, option);
    }
    unsetenv(var);
}

/* x quantised once a product (cuda_options.gemvq_batch_pre, default 2: the other checks take
 * it) against x staged by every block, through QWENRT_CUDA_BATCH_PRE: 0 (never) and 16 (a batch
 * of 3 stages, one of 16 quantises once) keep a batch of 3 and one of 16 bit for bit alone; and
 * the variable's bad values refused by name. */
static void check_batch_pre_env(struct qwenrt_model *m, const char *name)
{
    static const char *const good[] = {"0", "16"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char label[160];
        snprintf(label, sizeof(label), "%s, QWENRT_CUDA_BATCH_PRE=%s", name, good[i]);
        setenv("QWENRT_CUDA_BATCH_PRE", good[i], 1);
        check_batch_int8_model(m, 3, 0, true, label);
        check_batch_int8_model(m, 16, 300, true, label);
    }
    static const char *const bad[] = {"1", "17", "x", ""};
    check_env_refused(m, "QWENRT_CUDA_BATCH_PRE", "gemvq_batch_pre", bad, sizeof(bad) / sizeof(bad[0]));
    /* QWENRT_CUDA_BATCH_BLOCKS: the batched attention's blocks a head pair and session (2: at
     * position 130 the 3 splits in a run of 2 and one of 1; -1: a block a split) keeps a batch
     * of 12 bit for bit alone; its bad values refused by name */
    static const char *const blocks[] = {"2", "-1"};
    for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++) {
        char label[160];
        snprintf(label, sizeof(label), "%s, QWENRT_CUDA_BATCH_BLOCKS=%s", name, blocks[i]);
        setenv("QWENRT_CUDA_BATCH_BLOCKS", blocks[i], 1);
        check_batch_int8_model(m, 12, 130, true, label);
    }
    static const char *const bad_blocks[] = {"33", "-2", "x", ""};
    check_env_refused(m, "QWENRT_CUDA_BATCH_BLOCKS", "attn_batch_blocks", bad_blocks,
                      sizeof(bad_blocks) / sizeof(bad_blocks[0]));
}

static void test_batch_int8_cuda(void **st)
{
    (void)st;
    char path[256];
    struct qwenrt_model *m = load_synth("qwen3-tiny", EXPORT_Q4_K_M, 1024, false, path, sizeof(path));
    m = reload_cuda(m, path);
    check_batch_pays_int8(m, true, "qwen3-tiny q4_k_m w1024");
    check_batch_int8_model(m, 3, 0, true, "qwen3-tiny q4_k_m w1024");
    check_batch_int8_model(m, 12, 0, true, "qwen3-tiny q4_k_m w1024");
    check_batch_int8_model(m, 12, 130, true, "qwen3-tiny q4_k_m w1024"); /* 3 splits */
    check_batch_int8_model(m, 16, 300, true, "qwen3-tiny q4_k_m w1024"); /* the cluster window */
    check_batch_pre_env(m, "qwen3-tiny q4_k_m w1024");
    /* past the window (here to 320): from position 512 a session's graph takes 9 splits and
     * more, so the batch takes all (b_deep) — the third session reaches 512 at the second step */
    m->cuda_tuning.attn_cluster_from = 192, m->cuda_tuning.attn_cluster_until = 320;
    check_batch_int8_model(m, 3, 506, true, "qwen3-tiny q4_k_m w1024, window to 320");
    qwenrt_model_free(m);
    remove(path);
    m = reload_cuda(load_synth("qwen3-tiny", EXPORT_Q4_K_M, 256, false, path, sizeof(path)), path);
    check_batch_pays_int8(m, false, "qwen3-tiny q4_k_m w256");
    check_batch_int8_model(m, 3, 0, false, "qwen3-tiny q4_k_m w256");
    check_batch_int8_model(m, 12, 0, false, "qwen3-tiny q4_k_m w256");
    qwenrt_model_free(m);
    remove(path);
    m = load_synth("qwen35-tiny", EXPORT_Q4_K_M, 1024, false, path, sizeof(path));
    check_batch_pays_int8(m, false, "qwen35-tiny q4_k_m w1024"); /* its DeltaNet out product: K = 192 */
    qwenrt_model_free(m);
    remove(path);
    /* Q8_0 rows (from session 40: gemvq_batch_mma.cu's Q8_0 path, the one-token gemvq's Q8_0
     * terms in the canonical order) */
    m = reload_cuda(load_synth("qwen3-tiny", EXPORT_Q8_0, 1024, false, path, sizeof(path)), path);
    check_batch_pays_int8(m, true, "qwen3-tiny q8_0 w1024");
    check_batch_int8_model(m, 3, 0, true, "qwen3-tiny q8_0 w1024");
    check_batch_int8_model(m, 12, 130, true, "qwen3-tiny q8_0 w1024");
    check_batch_int8_model(m, 16, 300, true, "qwen3-tiny q8_0 w1024");
    check_batch_pre_env(m, "qwen3-tiny q8_0 w1024");
    qwenrt_model_free(m);
    remove(path);
}

/* Qwen3.5-0.8B's layer geometry in `type` (every fourth layer attention), `layers` of them and a
 * vocabulary of 1,024, on CUDA. */
static struct qwenrt_model *load_q35_layers(int32_t layers, enum export_type type, char *path, size_t size)
{
    struct qwenrt_error err = {0};
    struct model_hparams hp;
    assert_int_equal(synth_preset("qwen35-0.8b", &hp, &err), QWENRT_OK);
    hp.n_layer = layers, hp.n_vocab = 1024;
    return reload_cuda(write_load_synth("qwen35-0.8b", &hp, type, "-layers", path, size), path);
}

/* Qwen3.5 in Q4_K_M batched in the default precision: bit for bit alone, and the server batches
 * it. One DeltaNet layer whose down product is Q6_K rows at K = 3,584 (2,940-byte rows, which
 * the one-token gemvq took only from session 39: before, that product ran with x in f32 alone
 * and 8-bit x batched, and the batch parted from alone by 0.6-0.9 of the logits at the real
 * geometry); then four layers (three DeltaNet, one gated attention), also across and past
 * position 512, from where the graph of a session without a cluster window (Qwen3.5's 8 heads)
 * takes more than 8 splits (the batch then all of them: b_deep). */
static void test_batch_int8_q35_cuda(void **st)
{
    (void)st;
    char path[256];
    struct qwenrt_model *m = load_q35_layers(1, EXPORT_Q4_K_M, path, sizeof(path));
    check_batch_int8_model(m, 3, 0, true, "qwen35-0.8b geometry q4_k_m, 1 layer");
    qwenrt_model_free(m);
    remove(path);
    m = load_q35_layers(4, EXPORT_Q4_K_M, path, sizeof(path));
    check_batch_pays_int8(m, true, "qwen35-0.8b geometry q4_k_m, 4 layers");
    check_batch_int8_model(m, 3, 0, true, "qwen35-0.8b geometry q4_k_m, 4 layers");
    check_batch_int8_model(m, 3, 506, true, "qwen35-0.8b geometry q4_k_m, 4 layers"); /* 512 at step 2 */
    check_batch_int8_model(m, 12, 600, true, "qwen35-0.8b geometry q4_k_m, 4 layers");
    qwenrt_model_free(m);
    remove(path);
    m = load_q35_layers(4, EXPORT_Q8_0, path, sizeof(path)); /* Q8_0 rows: session 40 */
    check_batch_pays_int8(m, true, "qwen35-0.8b geometry q8_0, 4 layers");
    check_batch_int8_model(m, 3, 0, true, "qwen35-0.8b geometry q8_0, 4 layers");
    check_batch_int8_model(m, 8, 506, true, "qwen35-0.8b geometry q8_0, 4 layers");
    qwenrt_model_free(m);
    remove(path);
}

/* The batched step as a CUDA graph against the same step launched op by op (cuda_options.graph
 * off): the same kernels in the same order, so the logits must be bit for bit equal — through a
 * replay, a leader change, a member swapped for another (the graph updated), another batch size,
 * a session freed and replaced, and both ways of returning the logits (host rows, or each
 * session's row on the device). */
static void batch_step_pair(struct cuda_session **ga, struct cuda_session **ea, const int32_t *who, int32_t n,
                            int32_t *pos, int32_t *next, int32_t V, bool host, const char *what)
{
    struct qwenrt_error err = {0};
    struct cuda_session *g[4], *e[4];
    int32_t ids[4], ps[4];
    float *lg = malloc((size_t)n * V * 4), *le = malloc((size_t)n * V * 4);
    assert_non_null(lg);
    assert_non_null(le);
    for (int32_t r = 0; r < n; r++)
        g[r] = ga[who[r]], e[r] = ea[who[r]], ids[r] = next[who[r]], ps[r] = pos[who[r]];
    if (cuda_batch_decode(g, ids, ps, n, host ? lg : NULL, &err) || cuda_batch_decode(e, ids, ps, n, host ? le : NULL, &err))
        fail_msg("%s: batch of %d: %s", what, n, err.message);
    for (int32_t r = 0; r < n && !host; r++)
        if (cuda_session_logits(g[r], lg + (size_t)r * V, &err) || cuda_session_logits(e[r], le + (size_t)r * V, &err))
            fail_msg("%s: logits: %s", what, err.message);
    for (int32_t r = 0; r < n; r++) {
        if (memcmp(lg + (size_t)r * V, le + (size_t)r * V, (size_t)V * 4))
            fail_msg("%s: batch of %d, row %d (session %d): the graph's logits differ from the launches'", what, n, r,
                     who[r]);
        pos[who[r]]++;
        next[who[r]] = argmax_f(le + (size_t)r * V, V);
    }
    free(lg);
    free(le);
}

static void check_batch_graph(const char *dir)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(dir, &mp, &m, &err))
        fail_msg("load %s: %s", dir, err.message);
    int32_t V = m->hp.n_vocab, pos[5], next[5];
    assert_true(3 + 4 + 18 < 40);
    struct cuda_options on = cuda_default_options(), off = on;
    off.graph = false;
    struct cuda_session *ga[5] = {NULL}, *ea[5] = {NULL};
    float *l = malloc((size_t)V * 4);
    assert_non_null(l);
    for (int32_t i = 0; i < 5; i++) { /* session 4 replaces 3 later; prompts of 3 + i tokens */
        if (i == 4) {
            cuda_session_free(ga[3]);
            cuda_session_free(ea[3]);
        }
        init_pair(m, 40, &on, &off, &ga[i], &ea[i], dir);
        int32_t prompt[8];
        for (int32_t t = 0; t < 3 + i; t++)
            prompt[t] = (17 * (i + 1) + 31 * t) % V;
        if (cuda_session_run(ga[i], prompt, 3 + i, 0, false, l, NULL, NULL, &err) ||
            cuda_session_run(ea[i], prompt, 3 + i, 0, false, l, NULL, NULL, &err))
            fail_msg("%s: prompt: %s", dir, err.message);
        pos[i] = 3 + i, next[i] = argmax_f(l, V);
        if (i < 3)
            continue;
        static const int32_t first[] = {0, 1, 2}, lead2[] = {2, 0, 1}, swap[] = {0, 1, 3}, alone[] = {1};
        static const int32_t fresh[] = {0, 1, 4};
        /* a step is launched op by op for new members, captured the second time, replayed after */
        if (i == 3) {
            batch_step_pair(ga, ea, first, 3, pos, next, V, false, dir);
            batch_step_pair(ga, ea, first, 3, pos, next, V, false, dir); /* captured */
            batch_step_pair(ga, ea, first, 3, pos, next, V, false, dir); /* replayed */
            batch_step_pair(ga, ea, first, 3, pos, next, V, true, dir);  /* host rows: new members */
            batch_step_pair(ga, ea, lead2, 3, pos, next, V, false, dir); /* another leader */
            batch_step_pair(ga, ea, first, 3, pos, next, V, false, dir); /* session 2 left 0's graph */
            batch_step_pair(ga, ea, first, 3, pos, next, V, false, dir); /* the graph updated */
            batch_step_pair(ga, ea, swap, 3, pos, next, V, false, dir);  /* a member swapped */
            batch_step_pair(ga, ea, swap, 3, pos, next, V, false, dir);  /* updated */
            batch_step_pair(ga, ea, swap, 3, pos, next, V, false, dir);  /* replayed */
            batch_step_pair(ga, ea, alone, 1, pos, next, V, false, dir); /* another size */
            batch_step_pair(ga, ea, alone, 1, pos, next, V, false, dir);
        } else { /* 3 freed, 4 made (perhaps at 3's address) */
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, false, dir);
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, false, dir);
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, false, dir);
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, true, dir);
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, true, dir); /* a new graph: host rows */
            batch_step_pair(ga, ea, fresh, 3, pos, next, V, true, dir);
        }
    }
    /* the batched sessions continue alone as their op-by-op twins do */
    float *l2 = malloc((size_t)V * 4);
    assert_non_null(l2);
    for (int32_t i = 0; i < 5; i++) {
        if (i == 3)
            continue;
        if (cuda_session_run(ga[i], &next[i], 1, pos[i], false, l, NULL, NULL, &err) ||
            cuda_session_run(ea[i], &next[i], 1, pos[i], false, l2, NULL, NULL, &err))
            fail_msg("%s: after the batch: %s", dir, err.message);
        double e = rel_err(l, l2, (size_t)V);
        if (!(e <= 1e-4)) /* the fused decode graph and the op-by-op launches: rounding only */
            fail_msg("%s: session %d after the batch: rel err %.3g", dir, i, e);
        cuda_session_free(ga[i]);
        cuda_session_free(ea[i]);
    }
    printf("%s: batched step graph vs launches: bit for bit over 18 steps\n", dir);
    free(l);
    free(l2);
    qwenrt_model_free(m);
}

static void test_batch_graph_cuda(void **st)
{
    (void)st;
    check_batch_graph(fixtures[1]);
    check_batch_graph(fixtures[3]);
}

/* The batched step's per-sequence steps as one launch for all sessions (cuda_options.batch_seq:
 * attention_kernel's and gds_kernel's multi-session forms) against one launch per session on
 * side streams: the same arithmetic, so the logits must be bit for bit equal. With split_min
 * 16 (the least) and no one-split floor the heads split from position 16 on (positions 12-26
 * here: up to 2 splits; the multi-session launch gives each of 3 sessions a third of the
 * session's splits, still more than that); 17 sessions take two launches (16 + 1), at the
 * default one split below 128. */
/* How check_batch_seq_model's sessions split their keys: as by default (one split at its
 * positions, 12-24), in splits of 16 from the start, or one split below position 20 and splits
 * of 16 from there: the batched attention's launch goes from one split to several part way
 * (cuda_batch.cu's batch levels), its graph captured again; or in splits of 16 at positions
 * 60-72 (4 or 5 splits: the groups of splits a block, attention_batch.cu, end part way). */
enum seq_split { SEQ_DEFAULT, SEQ_SPLIT, SEQ_CROSS, SEQ_DEEP };

/* blocks: cuda_options.attn_batch_blocks of the batched sessions (0: the session picks). */
static void check_batch_seq_model(const struct qwenrt_model *m, const char *dir, int32_t n, enum seq_split split,
                                  bool kv_f16, int32_t blocks)
{
    struct qwenrt_error err = {0};
    int32_t V = m->hp.n_vocab, pos[17], ids[17];
    assert_true(n <= 17);
    struct cuda_options on = cuda_default_options();
    if (split != SEQ_DEFAULT)
        on.attn_one_split = split == SEQ_CROSS ? 20 : 0, on.attn_split_min = 16;
    on.kv_f16 = kv_f16;
    on.attn_batch_blocks = blocks;
    struct cuda_options off = on;
    off.batch_seq = false;
    struct cuda_session *ga[17], *ea[17];
    float *lg = malloc((size_t)n * V * 4), *le = malloc((size_t)n * V * 4);
    assert_non_null(lg);
    assert_non_null(le);
    for (int32_t i = 0; i < n; i++) {
        init_pair(m, split == SEQ_DEEP ? 80 : 32, &on, &off, &ga[i], &ea[i], dir);
        int32_t prompt[80];
        pos[i] = (split == SEQ_DEEP ? 60 : 12) + i % 7;
        for (int32_t t = 0; t < pos[i]; t++)
            prompt[t] = (13 * (i + 1) + 29 * t) % V;
        if (cuda_session_run(ga[i], prompt, pos[i], 0, false, lg, NULL, NULL, &err) ||
            cuda_session_run(ea[i], prompt, pos[i], 0, false, le, NULL, NULL, &err))
            fail_msg("%s: prompt: %s", dir, err.message);
        ids[i] = argmax_f(le, V);
    }
    /* the decode plan's per-sequence steps that have a one-launch form: its attention ops, and
     * its DeltaNet cores where every value head has its own key head (the conv then runs
     * inside the core: one fused step; with Hv = 2 Hk, as in qwen35-tiny, conv and core stay
     * two steps and run per session) */
    int32_t per_seq = 0;
    const struct plan *dp = &m->plans[PHASE_DECODE];
    for (int32_t i = 0; i < dp->n_ops; i++)
        per_seq += dp->ops[i].kind == OP_ATTENTION ||
                   (dp->ops[i].kind == OP_GDN_CORE && dp->ops[i].n_v_heads == dp->ops[i].n_k_heads);
    for (int step = 0; step < 6; step++) { /* launched, captured, then replayed */
        if (cuda_batch_decode(ga, ids, pos, n, lg, &err) || cuda_batch_decode(ea, ids, pos, n, le, &err))
            fail_msg("%s: batch of %d: %s", dir, n, err.message);
        if (cuda_batch_seq_steps(ga[0]) != per_seq || cuda_batch_seq_steps(ea[0]) != 0)
            fail_msg("%s: %d of %d per-sequence steps in one launch (%d with batch_seq off)", dir,
                     cuda_batch_seq_steps(ga[0]), per_seq, cuda_batch_seq_steps(ea[0]));
        for (int32_t r = 0; r < n; r++) {
            const float *a = lg + (size_t)r * V, *b = le + (size_t)r * V;
            for (int32_t v = 0; v < V; v++)
                if (memcmp(&a[v], &b[v], 4))
                    fail_msg("%s: batch of %d, step %d, session %d at position %d: logit %d is %.9g in one launch, "
                             "%.9g per session", dir, n, step, r, pos[r], v, a[v], b[v]);
            pos[r]++, ids[r] = argmax_f(b, V);
        }
    }
    printf("%s: %d sessions%s%s, attn_batch_blocks %d: one launch per step = one per session, bit for bit\n", dir, n,
           split == SEQ_SPLIT ? ", split heads"
           : split == SEQ_CROSS ? ", heads split from position 20"
           : split == SEQ_DEEP  ? ", 4-5 splits at positions 60-78"
                                : "",
           kv_f16 ? ", f16 cache" : "", (int)blocks);
    for (int32_t i = 0; i < n; i++) {
        cuda_session_free(ga[i]);
        cuda_session_free(ea[i]);
    }
    free(lg);
    free(le);
}

static void check_batch_seq(const char *dir, int32_t n, enum seq_split split, bool kv_f16, int32_t blocks)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(dir, &mp, &m, &err))
        fail_msg("load %s: %s", dir, err.message);
    check_batch_seq_model(m, dir, n, split, kv_f16, blocks);
    qwenrt_model_free(m);
}

/* A synth Qwen3.5 with Hv == Hk (the conv inside the DeltaNet core: its one-launch form runs),
 * DeltaNet heads of ssm_dim (0: the tiny preset's, 128: Qwen3.5-0.8B's) */
static void check_batch_seq_gdn(int32_t ssm_dim, int32_t n, enum seq_split split)
{
    char path[256];
    struct qwenrt_model *m = load_synth_ssm("qwen35-tiny", EXPORT_BF16, 256, true, ssm_dim, path, sizeof(path));
    check_batch_seq_model(m, ssm_dim ? "synth qwen35, 128 x 128 DeltaNet heads" : "synth qwen35, conv in the core", n,
                          split, false, 0);
    qwenrt_model_free(m);
    remove(path);
}

static void test_batch_seq_cuda(void **st)
{
    (void)st;
    for (int i = 0; i < 4; i++)
        check_batch_seq(fixtures[i], 3, SEQ_SPLIT, false, 0);
    check_batch_seq(fixtures[1], 17, SEQ_DEFAULT, false, 0);
    check_batch_seq(fixtures[3], 17, SEQ_DEFAULT, false, 0);
    check_batch_seq(fixtures[1], 7, SEQ_CROSS, false, 0);
    check_batch_seq(fixtures[2], 7, SEQ_CROSS, false, 0);
    check_batch_seq(fixtures[1], 3, SEQ_SPLIT, true, 0);
    check_batch_seq(fixtures[3], 3, SEQ_SPLIT, true, 0);
    /* runs of splits a block, a head pair each (attention_batch.cu): both splits in one block;
     * at 4-5 splits one block (it merges its own), 2 (runs of 2-3) and 3 (runs of 2, the last
     * short: the head's blocks arrive on its counter), 8 (one split each, some blocks idle), and
     * -1 (attention_kernel's block a split), with either cache, Qwen3 and Qwen3.5 (the output
     * gate); a batch of 17 crossing from one split to several in two launches */
    check_batch_seq(fixtures[1], 3, SEQ_SPLIT, false, 1);
    check_batch_seq(fixtures[1], 7, SEQ_DEEP, false, -1);
    check_batch_seq(fixtures[1], 7, SEQ_DEEP, false, 1);
    check_batch_seq(fixtures[0], 7, SEQ_DEEP, false, 3);
    check_batch_seq(fixtures[1], 5, SEQ_DEEP, true, 2);
    check_batch_seq(fixtures[1], 7, SEQ_DEEP, true, 8);
    check_batch_seq(fixtures[3], 7, SEQ_DEEP, false, 3);
    check_batch_seq(fixtures[2], 5, SEQ_DEEP, true, 1);
    check_batch_seq(fixtures[1], 17, SEQ_CROSS, true, 2);
    check_batch_seq_gdn(0, 3, SEQ_SPLIT);
    check_batch_seq_gdn(128, 5, SEQ_DEFAULT);
    check_batch_seq_gdn(0, 17, SEQ_DEFAULT);
}

/* A batched step that fails part way (cuda_options.batch_fail_at: a BACKEND error at that op,
 * after the layers before it ran) changes no session: every DeltaNet layer's conv and state rows
 * are as before, bit for bit, so the server's retry one session at a time decodes what a session
 * that never saw the failure decodes (without the copies back, the layers before the failure
 * would advance their state twice). Qwen3 (no recurrent state) alike; with and without graphs. */
static void check_batch_fail_kept(const char *dir, bool graph)
{
    enum { N = 3 };
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(dir, &mp, &m, &err))
        fail_msg("load %s: %s", dir, err.message);
    const struct plan *dp = &m->plans[PHASE_DECODE];
    int32_t V = m->hp.n_vocab, fail_at = 0, pos[N], ids[N];
    for (int32_t i = 0, seen = 0; i < dp->n_ops && !fail_at; i++) /* after two per-sequence steps */
        if (dp->ops[i].kind == OP_GDN_CORE || dp->ops[i].kind == OP_ATTENTION)
            fail_at = ++seen == 2 ? i + 1 : 0;
    assert_true(fail_at > 0 && fail_at < dp->n_ops);
    struct cuda_options failing = cuda_default_options(), plain = cuda_default_options();
    failing.graph = plain.graph = graph;
    failing.batch_fail_at = fail_at;
    struct cuda_session *ga[N], *ea[N];
    float *la = malloc((size_t)V * 4), *le = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(le);
    for (int32_t i = 0; i < N; i++) {
        init_pair(m, 32, &failing, &plain, &ga[i], &ea[i], dir);
        int32_t prompt[16];
        pos[i] = 9 + 2 * i;
        for (int32_t t = 0; t < pos[i]; t++)
            prompt[t] = (17 * (i + 1) + 31 * t) % V;
        if (cuda_session_run(ga[i], prompt, pos[i], 0, false, la, NULL, NULL, &err) ||
            cuda_session_run(ea[i], prompt, pos[i], 0, false, le, NULL, NULL, &err))
            fail_msg("%s: prompt: %s", dir, err.message);
        ids[i] = argmax_f(le, V);
    }
    qwenrt_status st = cuda_batch_decode(ga, ids, pos, N, NULL, &err);
    if (st != QWENRT_ERR_BACKEND || !strstr(err.message, "batch_fail_at"))
        fail_msg("%s: the failing batch returned %d (%s)", dir, (int)st, err.message);
    for (int32_t i = 0; i < N; i++) /* the retry, one session at a time, for two steps */
        for (int32_t t = 0; t < 2; t++) {
            if (cuda_session_run(ga[i], &ids[i], 1, pos[i] + t, false, la, NULL, NULL, &err) ||
                cuda_session_run(ea[i], &ids[i], 1, pos[i] + t, false, le, NULL, NULL, &err))
                fail_msg("%s: retry: %s", dir, err.message);
            for (int32_t v = 0; v < V; v++)
                if (memcmp(&la[v], &le[v], 4))
                    fail_msg("%s: session %d, step %d after the failed batch: logit %d is %.9g, %.9g without it", dir,
                             i, t, v, la[v], le[v]);
        }
    printf("%s%s: a batch failing at op %d of %d changed no session\n", dir, graph ? "" : " (no graph)", fail_at,
           dp->n_ops);
    for (int32_t i = 0; i < N; i++) {
        cuda_session_free(ga[i]);
        cuda_session_free(ea[i]);
    }
    free(la);
    free(le);
    qwenrt_model_free(m);
}

static void test_batch_fail_kept_cuda(void **st)
{
    (void)st;
    check_batch_fail_kept(fixtures[3], true);
    check_batch_fail_kept(fixtures[3], false);
    check_batch_fail_kept(fixtures[1], true);
}

/* The server batches CUDA sessions only where a batched step is faster than each session's own
 * decode graph: products a multi-token GEMV takes — 16-bit (gemv_batch.cu) from 2 sessions, Q8_0
 * / Q4_K / Q6_K (gemvq_batch.cu) from 3 to 8 where the one-token products take x in f32 too
 * (gemvq_int8 off) — not f32 ones, and none with cuda_options.gemv_batch off. With 8-bit x a
 * quantised model batches only where its products are bit for bit the one-token ones: not the
 * tiny synths here (their K is not gemvq's), test_batch_int8_cuda has one that does. */
static void test_batch_pays(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    static const struct {
        const char *dir;
        bool pays;
    } cases[] = {{"tests/data/qwen3-tiny-bf16", true}, {"tests/data/qwen35-tiny-bf16", true},
                 {"tests/data/qwen3-tiny-f32", false}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct qwenrt_model *m = NULL;
        struct cuda_session *cs = NULL;
        if (qwenrt_model_load(cases[i].dir, &mp, &m, &err))
            fail_msg("load %s: %s", cases[i].dir, err.message);
        struct cuda_options o = cuda_default_options();
        assert_int_equal(cuda_session_init(m->plans, 16, &o, &cs, &err), QWENRT_OK);
        assert_int_equal(cuda_batch_pays(cs, 2), cases[i].pays);
        assert_int_equal(cuda_batch_pays(cs, 16), cases[i].pays);
        assert_false(cuda_batch_pays(cs, 17)); /* BF16: the tensor cores' GEMV takes 16 at most */
        assert_false(cuda_batch_pays(cs, 1));
        cuda_session_free(cs);
        o.gemv_batch_mma = false; /* then 17 rows take the GEMM, still one step */
        assert_int_equal(cuda_session_init(m->plans, 16, &o, &cs, &err), QWENRT_OK);
        assert_int_equal(cuda_batch_pays(cs, 17), cases[i].pays);
        o.gemv_batch = false; /* without the kernel, no batched step pays */
        cuda_session_free(cs);
        assert_int_equal(cuda_session_init(m->plans, 16, &o, &cs, &err), QWENRT_OK);
        assert_false(cuda_batch_pays(cs, 4));
        cuda_session_free(cs);
        qwenrt_model_free(m);
    }
    static const enum export_type quant[] = {EXPORT_Q4_K_M, EXPORT_Q8_0};
    for (size_t i = 0; i < sizeof(quant) / sizeof(quant[0]); i++) {
        char path[256];
        struct qwenrt_model *q = load_synth("qwen3-tiny", quant[i], 0, false, path, sizeof(path));
        struct cuda_session *cs = NULL;
        struct cuda_options o = cuda_default_options();
        assert_true(o.gemvq_int8 >= 0); /* by default x in 8 bits alone, K of 1 super-block: no batch */
        assert_int_equal(cuda_session_init(q->plans, 16, &o, &cs, &err), QWENRT_OK);
        for (int32_t n = 1; n <= 16; n++)
            assert_false(cuda_batch_pays(cs, n));
        cuda_session_free(cs);
        o.gemvq_int8 = -1; /* x in f32 alone too (--precision exact) */
        assert_int_equal(cuda_session_init(q->plans, 16, &o, &cs, &err), QWENRT_OK);
        assert_false(cuda_batch_pays(cs, 2)); /* two sessions: each through its own graph */
        assert_true(cuda_batch_pays(cs, 3));
        assert_true(cuda_batch_pays(cs, 8));
        assert_false(cuda_batch_pays(cs, 9)); /* 9 or more rows take the GEMM */
        cuda_session_free(cs);
        o.gemv_batch = false;
        assert_int_equal(cuda_session_init(q->plans, 16, &o, &cs, &err), QWENRT_OK);
        assert_false(cuda_batch_pays(cs, 4));
        cuda_session_free(cs);
        qwenrt_model_free(q);
        remove(path);
    }
}

/* Checkpoints of CUDA sessions: a snapshot restored into another CUDA session continues
 * bit-identically; a CPU session's checkpoint restored on the GPU continues within the
 * fixture tolerance (and the reverse). */
static void check_checkpoint_cuda(const char *dir)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *gm = NULL, *cm = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    if (qwenrt_model_load(dir, &mp, &gm, &err))
        fail_msg("load %s: %s", dir, err.message);
    mp.backend = "cpu";
    if (qwenrt_model_load(dir, &mp, &cm, &err))
        fail_msg("load %s: %s", dir, err.message);
    int32_t V = gm->hp.n_vocab, prompt[9] = {11, 250, 37, 998, 4, 61, 300, 7, 90};
    struct qwenrt_session *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(qwenrt_session_init(gm, NULL, &a, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_init(gm, NULL, &b, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_init(cm, NULL, &c, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(a, prompt, 9, NULL, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(c, prompt, 9, NULL, &err), QWENRT_OK);
    struct qwenrt_checkpoint *cpa = NULL, *cpc = NULL;
    if (qwenrt_session_snapshot(a, &cpa, &err) || qwenrt_session_snapshot(c, &cpc, &err))
        fail_msg("%s: snapshot: %s", dir, err.message);
    /* b continues from a's checkpoint; a continues itself */
    assert_int_equal(qwenrt_session_restore(b, cpa, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_n_past(b), 9);
    float *la = malloc((size_t)V * 4);
    for (int step = 0; step < 3; step++) {
        int32_t id = qwenrt_argmax(qwenrt_session_logits(a), V);
        assert_int_equal(qwenrt_session_decode(a, id, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_decode(b, id, &err), QWENRT_OK);
        assert_memory_equal(qwenrt_session_logits(a), qwenrt_session_logits(b), (size_t)V * 4);
    }
    /* the CPU session's checkpoint on the GPU, then the GPU's back on the CPU */
    assert_int_equal(qwenrt_session_restore(b, cpc, &err), QWENRT_OK);
    int32_t id = qwenrt_argmax(qwenrt_session_logits(c), V);
    assert_int_equal(qwenrt_session_decode(b, id, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_decode(c, id, &err), QWENRT_OK);
    memcpy(la, qwenrt_session_logits(b), (size_t)V * 4);
    double e = rel_err(la, qwenrt_session_logits(c), (size_t)V);
    printf("%s: CPU checkpoint continued on CUDA: logits rel err %.3g\n", dir, e);
    if (!(e <= LOGITS_REL_TOL))
        fail_msg("%s: CPU checkpoint on the GPU: rel err %.3g", dir, e);
    assert_int_equal(qwenrt_session_restore(c, cpa, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_n_past(c), 9);
    /* reset (the server resets slots between requests): as new, then the prompt again gives
     * the first session's logits after the prompt */
    qwenrt_session_reset(b);
    assert_int_equal(qwenrt_session_n_past(b), 0);
    assert_int_equal(qwenrt_session_prefill(b, prompt, 9, NULL, &err), QWENRT_OK);
    struct qwenrt_session *fresh = NULL;
    assert_int_equal(qwenrt_session_init(gm, NULL, &fresh, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(fresh, prompt, 9, NULL, &err), QWENRT_OK);
    assert_memory_equal(qwenrt_session_logits(b), qwenrt_session_logits(fresh), (size_t)V * 4);
    qwenrt_session_free(fresh);
    free(la);
    qwenrt_checkpoint_free(cpa);
    qwenrt_checkpoint_free(cpc);
    qwenrt_session_free(a);
    qwenrt_session_free(b);
    qwenrt_session_free(c);
    qwenrt_model_free(gm);
    qwenrt_model_free(cm);
}

static void test_checkpoint_cuda(void **st)
{
    (void)st;
    check_checkpoint_cuda(fixtures[0]);
    check_checkpoint_cuda(fixtures[2]);
}

/* A prompt prefilled in two pieces on the GPU (the second at position 30: attention over the
 * cached keys plus its own, through the f32 GEMM attention, or for the bf16 fixture in the
 * default precision the flash kernel) gives the reference logits at every position of the
 * second piece. */
static void test_prefill_split_cuda(void **st)
{
    (void)st;
    for (int f = 0; f < 4; f++) { /* 1 and 3: bf16, the fast prefill (flash attention) */
        char path[512];
        snprintf(path, sizeof(path), "%s/reference.safetensors", fixtures[f]);
        struct safetensors_file ref;
        struct qwenrt_error err = {0};
        assert_int_equal(safetensors_open(&ref, path, &err), QWENRT_OK);
        const struct qr_tensor *prompt = ref_tensor(&ref, "prompt_ids"), *logits = ref_tensor(&ref, "logits");
        int32_t T = (int32_t)prompt->ne[0], V = (int32_t)logits->ne[0], cut = 30;
        assert_true(T > cut + 16);
        struct qwenrt_model *m = NULL;
        struct qwenrt_model_params mp = qwenrt_model_default_params();
        mp.backend = "cuda";
        assert_int_equal(qwenrt_model_load(fixtures[f], &mp, &m, &err), QWENRT_OK);
        struct qwenrt_session *s = NULL;
        assert_int_equal(qwenrt_session_init(m, NULL, &s, &err), QWENRT_OK);
        float *out = malloc((size_t)(T - cut) * V * sizeof(float));
        const int32_t *ids = prompt->data;
        assert_int_equal(qwenrt_session_prefill(s, ids, cut, NULL, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(s, ids + cut, T - cut, out, &err), QWENRT_OK);
        double e = rel_err(out, (const float *)logits->data + (size_t)cut * V, (size_t)(T - cut) * V);
        printf("%s: prefill %d + %d on CUDA: logits rel err %.3g\n", fixtures[f], cut, T - cut, e);
        double fast = fast_fixture_tol(fixtures[f]);
        if (!(e <= (fast > 0 ? fast : LOGITS_REL_TOL)))
            fail_msg("%s: split prefill: logits relative error %.3g", fixtures[f], e);
        free(out);
        qwenrt_session_free(s);
        qwenrt_model_free(m);
        safetensors_close(&ref);
    }
}

/* The greedy loop's argmax against its contract (the largest value that is not NaN, the first
 * of equals, 0 when every value is NaN): awkward sizes around its float4 passes and both
 * vocabularies, the maximum planted twice (the first wins), in the scalar tail and at 0, NaNs
 * everywhere, rows of -inf or NaN only, through the float4 path and the unaligned one. */
static int32_t argmax_contract(const float *x, int32_t n)
{
    int32_t b = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b]))
            b = i;
    return b < 0 ? 0 : b;
}

static void check_argmax_case(const float *x, int32_t n, const char *what)
{
    /* the single-block kernel, and the grid kernel in awkward numbers of blocks, its default
     * (128) and its limit (more blocks than float4s for the small rows) */
    static const int32_t blocks[] = {1, 2, 7, 128, 1024};
    for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++)
        for (int mis = 0; mis < 2; mis++) {
            struct qwenrt_error err = {0};
            int32_t id = -1;
            assert_int_equal(cuda_argmax(x, n, mis, blocks[b], &id, &err), QWENRT_OK);
            if (id != argmax_contract(x, n))
                fail_msg("argmax %s, n %d, %d blocks, misaligned %d: %d, want %d", what, (int)n, (int)blocks[b],
                         mis, (int)id, (int)argmax_contract(x, n));
        }
}

static void test_op_argmax(void **st)
{
    (void)st;
    static const int32_t ns[] = {1, 3, 5, 1023, 4100, 32771, 151936, 248323};
    float *x = (float *)malloc(248323 * sizeof(float));
    assert_non_null(x);
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        int32_t n = ns[k];
        for (int32_t i = 0; i < n; i++)
            x[i] = frand();
        check_argmax_case(x, n, "random");
        x[n / 3] = x[n - 1] = 2.0f; /* a tie: the first wins; then the last alone */
        check_argmax_case(x, n, "tie");
        x[n / 3] = 1.5f;
        check_argmax_case(x, n, "in the tail");
        for (int32_t i = 0; i < n; i += 7)
            x[i] = NAN;
        x[0] = 3.0f;
        check_argmax_case(x, n, "NaNs, at 0");
        for (int32_t i = 0; i < n; i++)
            x[i] = -INFINITY;
        check_argmax_case(x, n, "all -inf");
        for (int32_t i = 0; i < n; i++)
            x[i] = NAN;
        check_argmax_case(x, n, "all NaN");
    }
    free(x);
}

/* The GPU's top-m selection (topk.cu) against its one-thread reference kernel and a host sort:
 * awkward vocabulary sizes around the 4096-logit slices, rows full of ties (multiples of 0.5),
 * temperatures that create ties by rounding, m from 1 to the limit, gathered ids; a NaN ranks
 * last. Out-of-range requests are refused with UNSUPPORTED or INVALID_ARG. */
static void test_topk_select(void **st)
{
    (void)st;
    const int32_t Vs[] = {1, 7, 4095, 4097, 12289, 151936};
    const int32_t ms[] = {1, 3, 41, 256};
    const float ts[] = {1.0f, 0.7f, 3.3f};
    int32_t gather[5] = {0, 0, 0, 0, 0}, ids[256], ref_ids[256], host_ids[256];
    float vals[256], ref_vals[256], gv[5], ref_gv[5];
    struct qwenrt_error err = {0};
    uint32_t seed = 77;
    for (size_t vi = 0; vi < sizeof(Vs) / sizeof(Vs[0]); vi++) {
        int32_t V = Vs[vi];
        float *l = malloc((size_t)V * sizeof(float));
        for (int tied = 0; tied < 2; tied++) {
            for (int32_t i = 0; i < V; i++) {
                seed = seed * 1664525u + 1013904223u;
                l[i] = tied ? (float)((seed >> 24) & 7) * 0.5f : (float)(seed >> 8) / (float)(1u << 24) * 20.0f - 10.0f;
            }
            if (V > 100)
                l[V / 3] = NAN;
            for (int g = 0; g < 5; g++)
                gather[g] = (int32_t)(((uint32_t)g * 2654435761u) % (uint32_t)V);
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
                for (size_t ti = 0; ti < sizeof(ts) / sizeof(ts[0]); ti++) {
                    int32_t m = ms[mi];
                    if (m > V - (V > 100)) /* the NaN never makes the list when it fits */
                        continue;
                    assert_int_equal(cuda_topk_host(l, V, ts[ti], m, gather, 5, false, ids, vals, gv, &err), QWENRT_OK);
                    assert_int_equal(cuda_topk_host(l, V, ts[ti], m, gather, 5, true, ref_ids, ref_vals, ref_gv, &err),
                                     QWENRT_OK);
                    test_best_tokens(l, V, ts[ti], m, host_ids);
                    for (int32_t i = 0; i < m; i++) {
                        if (ids[i] != host_ids[i] || ref_ids[i] != host_ids[i])
                            fail_msg("top-%d of %d (t %g, tied %d): rank %d is %d (reference kernel %d), host %d", m, V,
                                     (double)ts[ti], tied, i, ids[i], ref_ids[i], host_ids[i]);
                        assert_true(vals[i] == l[ids[i]]);
                        assert_true(ref_vals[i] == vals[i]);
                    }
                    for (int g = 0; g < 5; g++)
                        assert_true(gv[g] == l[gather[g]] && ref_gv[g] == gv[g]);
                }
        }
        free(l);
    }
    float row[8] = {0};
    assert_int_equal(cuda_topk_host(row, 8, 1.0f, 9, NULL, 0, false, ids, vals, gv, &err), QWENRT_ERR_UNSUPPORTED);
    assert_int_equal(cuda_topk_host(row, 8, 1.0f, 257, NULL, 0, false, ids, vals, gv, &err), QWENRT_ERR_UNSUPPORTED);
    assert_int_equal(cuda_topk_host(row, 8, 0.0f, 1, NULL, 0, false, ids, vals, gv, &err), QWENRT_ERR_INVALID_ARG);
    gather[0] = 8;
    assert_int_equal(cuda_topk_host(row, 8, 1.0f, 1, gather, 1, false, ids, vals, gv, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "outside the vocabulary"));
}

/* The one-launch selection over several rows (launch_topk_rows: the server's picks after a
 * batched step, results written into mapped pinned memory) against a host sort of each row:
 * 1, 3 and 16 rows of different contents (every third row full of ties), vocabulary sizes
 * around the slices and Qwen's, m from 1 to the limit; n and m out of range are refused. */
static void test_topk_rows(void **st)
{
    (void)st;
    const int32_t Vs[] = {7, 4097, 151936}, ms[] = {1, 41, 256}, ns[] = {1, 3, 16};
    struct qwenrt_error err = {0};
    uint32_t seed = 5;
    int32_t *ids = malloc(16 * 256 * sizeof(int32_t)), host_ids[256];
    float *vals = malloc(16 * 256 * sizeof(float));
    assert_non_null(ids);
    assert_non_null(vals);
    for (size_t vi = 0; vi < 3; vi++) {
        int32_t V = Vs[vi];
        float *l = malloc((size_t)16 * V * sizeof(float));
        assert_non_null(l);
        for (int32_t r = 0; r < 16; r++)
            for (int32_t i = 0; i < V; i++) {
                seed = seed * 1664525u + 1013904223u;
                l[(size_t)r * V + i] = r % 3 == 2 ? (float)((seed >> 24) & 7) * 0.5f
                                                  : (float)(seed >> 8) / (float)(1u << 24) * 20.0f - 10.0f;
            }
        for (size_t mi = 0; mi < 3; mi++)
            for (size_t ni = 0; ni < 3; ni++) {
                int32_t m = ms[mi], n = ns[ni];
                float t = mi == 1 ? 0.7f : 1.0f;
                if (m > V)
                    continue;
                if (cuda_topk_rows_host(l, n, V, t, m, ids, vals, &err))
                    fail_msg("%d rows of %d, top-%d: %s", n, V, m, err.message);
                for (int32_t r = 0; r < n; r++) {
                    const float *row = l + (size_t)r * V;
                    test_best_tokens(row, V, t, m, host_ids);
                    for (int32_t i = 0; i < m; i++)
                        if (ids[r * m + i] != host_ids[i] || !(vals[r * m + i] == row[host_ids[i]]))
                            fail_msg("row %d of %d (V %d, top-%d): rank %d is %d, host %d", r, n, V, m, i,
                                     ids[r * m + i], host_ids[i]);
                }
            }
        free(l);
    }
    float row[8] = {0};
    assert_int_equal(cuda_topk_rows_host(row, 0, 8, 1.0f, 1, ids, vals, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_topk_rows_host(row, 17, 8, 1.0f, 1, ids, vals, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_topk_rows_host(row, 1, 8, 1.0f, 9, ids, vals, &err), QWENRT_ERR_UNSUPPORTED);
    free(ids);
    free(vals);
}

/* Two sessions of m and two samplers of p, to run the same tokens two ways. */
static void open_twins(struct qwenrt_model *m, const struct qwenrt_sampler_params *p, int32_t n_vocab,
                       struct qwenrt_session **a, struct qwenrt_session **b, struct qwenrt_sampler **sa,
                       struct qwenrt_sampler **sb)
{
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_init(m, NULL, a, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_init(m, NULL, b, &err), QWENRT_OK);
    assert_int_equal(qwenrt_sampler_init(p, n_vocab, sa, &err), QWENRT_OK);
    assert_int_equal(qwenrt_sampler_init(p, n_vocab, sb, &err), QWENRT_OK);
}

/* qwenrt_session_sample on a CUDA session (only the best tokens leave the GPU) picks what the
 * sampler picks from the whole row, step by step, for greedy, qwenrt run's defaults, and a
 * sampler with penalties and a logit bias; a sampler without top-k reads the whole row; with
 * the pick started ahead (session_sample_start) too, for the same sampler, another one, and a
 * row changed since. The two sessions run the same tokens, so their logits are identical. */
static void test_session_sample_cuda(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    assert_int_equal(qwenrt_model_load(fixtures[2], &mp, &m, &err), QWENRT_OK);
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    struct qwenrt_logit_bias bias[2] = {{11, -100.0f}, {12, 2.0f}};
    struct qwenrt_sampler_params ps[4];
    for (int k = 0; k < 4; k++)
        ps[k] = qwenrt_sampler_default_params(), ps[k].seed = 5 + (uint64_t)k;
    ps[1].temperature = 0.8f, ps[1].top_k = 40, ps[1].top_p = 0.95f, ps[1].min_p = 0.05f;
    ps[2].temperature = 1.5f, ps[2].top_k = 20, ps[2].repeat_penalty = 1.3f, ps[2].presence_penalty = 0.4f;
    ps[2].logit_bias = bias, ps[2].n_logit_bias = 2;
    ps[3].temperature = 1.0f; /* no top-k: the whole row */
    const int32_t prompt[5] = {1, 5, 9, 11, 12};
    for (int k = 0; k < 4; k++) {
        struct qwenrt_session *a = NULL, *b = NULL;
        struct qwenrt_sampler *sa = NULL, *sb = NULL;
        open_twins(m, &ps[k], info.n_vocab, &a, &b, &sa, &sb);
        struct qwenrt_sampler *greedy = NULL;
        assert_int_equal(qwenrt_sampler_init(&ps[0], info.n_vocab, &greedy, &err), QWENRT_OK);
        session_sample_start(a, sa); /* nothing has run: nothing starts */
        int32_t id = -1, top_id[1];
        float top_val[1], *row = malloc((size_t)info.n_vocab * sizeof(float));
        assert_int_equal(qwenrt_session_sample(a, sa, &id, &err), QWENRT_ERR_INVALID_ARG); /* nothing run */
        assert_int_equal(cuda_session_top(a->cuda, 1.0f, 1, NULL, 0, top_id, top_val, NULL, &err),
                         QWENRT_ERR_INVALID_ARG);
        assert_int_equal(cuda_session_logits(a->cuda, row, &err), QWENRT_ERR_INVALID_ARG);
        assert_non_null(strstr(err.message, "no logits yet"));
        free(row);
        assert_int_equal(qwenrt_session_prefill(a, prompt, 5, NULL, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(b, prompt, 5, NULL, &err), QWENRT_OK);
        for (int i = 0; i < 5; i++)
            qwenrt_sampler_accept(sa, prompt[i]), qwenrt_sampler_accept(sb, prompt[i]);
        for (int step = 0; step < 24; step++) {
            int32_t want = qwenrt_sampler_sample(sb, qwenrt_session_logits(b));
            /* the pick started ahead (session_sample_start): taken when it is the one asked for
             * (step % 4 == 0; 2: started at the end of the step before, after the decode), let
             * finish and not taken when another sampler's (1) or the row changed since (3) */
            if (step % 4 == 0)
                session_sample_start(a, sa);
            else if (step % 4 == 1)
                session_sample_start(a, greedy);
            assert_int_equal(qwenrt_session_sample(a, sa, &id, &err), QWENRT_OK);
            if (id != want)
                fail_msg("sampler %d, step %d: session_sample %d, whole row %d", k, step, id, want);
            qwenrt_sampler_accept(sa, id), qwenrt_sampler_accept(sb, id);
            if (step % 4 == 2) /* for the old row: the next step's sample must not take it */
                session_sample_start(a, sa);
            assert_int_equal(qwenrt_session_decode(a, id, &err), QWENRT_OK);
            assert_int_equal(qwenrt_session_decode(b, id, &err), QWENRT_OK);
            if (step % 4 == 1)
                session_sample_start(a, sa);
        }
        /* the row is still readable after sampling from its best tokens */
        const float *la = qwenrt_session_logits(a), *lb = qwenrt_session_logits(b);
        assert_non_null(la);
        assert_memory_equal(la, lb, (size_t)info.n_vocab * sizeof(float));
        qwenrt_sampler_free(greedy);
        qwenrt_sampler_free(sa);
        qwenrt_sampler_free(sb);
        qwenrt_session_free(a);
        qwenrt_session_free(b);
    }
    qwenrt_model_free(m);
}

/* session_sample_start_all, the server's picks: five sessions decoding together (a batch),
 * three sharing one sampling setting (one launch), one greedy (a launch of its own), one with
 * penalties and a logit bias (gathered ids: started alone); each sample is what its sampler
 * picks from the whole row of a twin decoding the same tokens in a batch of its own. A group
 * whose sessions were decoded one by one (rows on their own streams) too, on odd steps; and
 * cuda_sessions_top_start's refusals. */
static void test_session_sample_all_cuda(void **st)
{
    (void)st;
    enum { N = 5 };
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    assert_int_equal(qwenrt_model_load(fixtures[3], &mp, &m, &err), QWENRT_OK);
    int32_t V = m->hp.n_vocab;
    struct qwenrt_logit_bias bias[2] = {{11, -100.0f}, {12, 2.0f}};
    struct qwenrt_sampler_params ps[N];
    for (int k = 0; k < N; k++) {
        ps[k] = qwenrt_sampler_default_params(), ps[k].seed = 40 + (uint64_t)k;
        ps[k].temperature = 0.8f, ps[k].top_k = 40, ps[k].top_p = 0.95f;
    }
    ps[3].temperature = 0.0f; /* greedy */
    ps[4].repeat_penalty = 1.3f, ps[4].logit_bias = bias, ps[4].n_logit_bias = 2;
    struct qwenrt_session *a[N], *b[N];
    struct qwenrt_sampler *sa[N], *sb[N];
    struct qwenrt_batch *ba = NULL, *bb = NULL;
    assert_int_equal(qwenrt_batch_init(m, N, &ba, &err), QWENRT_OK);
    assert_int_equal(qwenrt_batch_init(m, N, &bb, &err), QWENRT_OK);
    for (int k = 0; k < N; k++) {
        open_twins(m, &ps[k], V, &a[k], &b[k], &sa[k], &sb[k]);
        int32_t prompt[8];
        for (int32_t t = 0; t < 3 + k; t++)
            prompt[t] = (19 * (k + 1) + 7 * t) % V;
        assert_int_equal(qwenrt_session_prefill(a[k], prompt, 3 + k, NULL, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_prefill(b[k], prompt, 3 + k, NULL, &err), QWENRT_OK);
    }
    /* the group's refusals: no sessions, more than 16, a session twice, one without logits */
    struct qwenrt_session *fresh = NULL;
    assert_int_equal(qwenrt_session_init(m, NULL, &fresh, &err), QWENRT_OK);
    struct cuda_session *twice[2] = {a[0]->cuda, a[0]->cuda}, *unrun[2] = {a[0]->cuda, fresh->cuda};
    assert_int_equal(cuda_sessions_top_start(twice, 0, 1.0f, 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_sessions_top_start(twice, CUDA_TOP_MAX_ROWS + 1, 1.0f, 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_sessions_top_start(twice, 2, 1.0f, 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "twice"));
    assert_int_equal(cuda_sessions_top_start(unrun, 2, 1.0f, 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "no logits yet"));
    qwenrt_session_free(fresh);
    for (int step = 0; step < 8; step++) {
        int32_t ids[N];
        session_sample_start_all(a, sa, N);
        for (int k = 0; k < N; k++) {
            int32_t want = qwenrt_sampler_sample(sb[k], qwenrt_session_logits(b[k]));
            assert_int_equal(qwenrt_session_sample(a[k], sa[k], &ids[k], &err), QWENRT_OK);
            if (ids[k] != want)
                fail_msg("step %d, session %d: picked %d, the whole row %d", step, k, ids[k], want);
            qwenrt_sampler_accept(sa[k], ids[k]), qwenrt_sampler_accept(sb[k], ids[k]);
        }
        for (int k = 0; step % 2 && k < N; k++) { /* one by one */
            assert_int_equal(qwenrt_session_decode(a[k], ids[k], &err), QWENRT_OK);
            assert_int_equal(qwenrt_session_decode(b[k], ids[k], &err), QWENRT_OK);
        }
        if (step % 2 == 0) {
            assert_int_equal(qwenrt_batch_decode(ba, a, ids, N, &err), QWENRT_OK);
            assert_int_equal(qwenrt_batch_decode(bb, b, ids, N, &err), QWENRT_OK);
        }
    }
    printf("session_sample_start_all: 5 sessions, 8 steps, every pick the sampler's own on the whole row\n");
    for (int k = 0; k < N; k++) {
        qwenrt_sampler_free(sa[k]);
        qwenrt_sampler_free(sb[k]);
        qwenrt_session_free(a[k]);
        qwenrt_session_free(b[k]);
    }
    qwenrt_batch_free(ba);
    qwenrt_batch_free(bb);
    qwenrt_model_free(m);
}

/* sample.cu's draw against the host sampler's (sampler_sample_subset over the same k + 1
 * candidates) on random candidates of awkward counts, tied logits included, every filter on
 * and off, draws 0 .. 40 from one RNG state; and its refusals. */
static void test_sample_kernel(void **st)
{
    (void)st;
    const int32_t ks[] = {1, 2, 7, 40, 129, 255};
    const float temps[] = {0.8f, 1.0f, 2.7f}, top_ps[] = {1.0f, 0.95f, 0.3f}, min_ps[] = {0.0f, 0.05f, 0.5f};
    struct qwenrt_error err = {0};
    uint32_t seed = 99;
    int32_t ids[256], ranked[256], cases = 0;
    float vals[256], rvals[256];
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++)
        for (int c = 0; c < 9; c++) {
            int32_t k = ks[ki], m = k + 1;
            bool tied = c % 3 == 2;
            for (int32_t i = 0; i < m; i++) { /* distinct ids, in no order */
                ids[i] = (int32_t)((uint32_t)(i * 7919 + c * 31) % 4096u);
                seed = seed * 1664525u + 1013904223u;
                vals[i] = tied ? (float)((seed >> 24) & 3) : (float)(seed >> 8) / (float)(1u << 24) * 12.0f - 6.0f;
            }
            struct qwenrt_sampler_params sp = qwenrt_sampler_default_params();
            sp.temperature = temps[c % 3], sp.top_k = k, sp.top_p = top_ps[(c / 3) % 3];
            sp.min_p = min_ps[(c + ki) % 3], sp.seed = 1000 + (uint64_t)c;
            struct qwenrt_sampler *smp = NULL;
            assert_int_equal(qwenrt_sampler_init(&sp, 4096, &smp, &err), QWENRT_OK);
            /* the GPU's input: the k best by (logit / temperature, lower id) */
            for (int32_t i = 0; i < m; i++)
                ranked[i] = i;
            for (int32_t i = 1; i < m; i++)
                for (int32_t j = i; j > 0; j--) {
                    float a = vals[ranked[j]] / sp.temperature, b = vals[ranked[j - 1]] / sp.temperature;
                    if (!(a > b || (a == b && ids[ranked[j]] < ids[ranked[j - 1]])))
                        break;
                    int32_t t = ranked[j];
                    ranked[j] = ranked[j - 1], ranked[j - 1] = t;
                }
            int32_t rids[256];
            for (int32_t i = 0; i < k; i++)
                rids[i] = ids[ranked[i]], rvals[i] = vals[ranked[i]];
            struct cuda_sample_params dp;
            assert_true(sampler_device_plan(smp, CUDA_TOP_MAX_M, &dp));
            for (int32_t draw = 0; draw <= 40; draw += 8) {
                int32_t got = -1, want;
                assert_int_equal(cuda_sample_host(rids, rvals, &dp, draw, &got, &err), QWENRT_OK);
                qwenrt_sampler_reset(smp);
                sampler_skip_draws(smp, draw);
                want = sampler_sample_subset(smp, ids, vals, m, NULL, NULL, 0);
                if (got != want)
                    fail_msg("k %d, case %d (t %g, top_p %g, min_p %g), draw %d: GPU %d, host %d", k, c,
                             (double)sp.temperature, (double)sp.top_p, (double)sp.min_p, draw, got, want);
                cases++;
            }
            qwenrt_sampler_free(smp);
        }
    assert_true(cases > 300);
    struct cuda_sample_params bad = {.temperature = 1.0f, .top_p = 1.0f, .top_k = CUDA_TOP_MAX_M};
    int32_t id;
    assert_int_equal(cuda_sample_host(ids, vals, &bad, 0, &id, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "top_k 256"));
    bad.top_k = 4, bad.temperature = 0.0f;
    assert_int_equal(cuda_sample_host(ids, vals, &bad, 0, &id, &err), QWENRT_ERR_INVALID_ARG);
    bad.temperature = 1.0f;
    assert_int_equal(cuda_sample_host(ids, vals, &bad, -1, &id, &err), QWENRT_ERR_INVALID_ARG);
}

/* n tokens token by token: decode the previous token, qwenrt_session_sample, from first. */
static void sample_token_by_token(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t first, int32_t n,
                                  int32_t *out)
{
    struct qwenrt_error err = {0};
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(qwenrt_session_decode(s, i ? out[i - 1] : first, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_sample(s, smp, &out[i], &err), QWENRT_OK);
    }
}

/* Several sampled steps per graph (session_generate: 16 steps as two graphs of 8 and a tail
 * of 5 as single steps) give token by token's tokens, on both fixture families in BF16 (Qwen3.5:
 * its recurrent state), for greedy, qwenrt run's defaults and a high temperature; a stop
 * inside the steps (session_generate_keep) leaves the session, its logits and the sampler's
 * RNG where token by token would have them: the next draws and the logits match bit for bit.
 * Samplers the GPU cannot run are refused with UNSUPPORTED and nothing changed. */
static void test_generate_sampled(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct qwenrt_sampler_params ps[3];
    for (int k = 0; k < 3; k++)
        ps[k] = qwenrt_sampler_default_params(), ps[k].seed = 40 + (uint64_t)k;
    ps[1].temperature = 0.8f, ps[1].top_k = 40, ps[1].top_p = 0.95f, ps[1].min_p = 0.05f;
    ps[2].temperature = 1.7f, ps[2].top_k = 5;
    const int32_t prompt[6] = {3, 9, 27, 81, 243, 729};
    for (int f = 1; f < 4; f += 2) {
        struct qwenrt_model *m = NULL;
        struct qwenrt_model_params mp = qwenrt_model_default_params();
        mp.backend = "cuda";
        assert_int_equal(qwenrt_model_load(fixtures[f], &mp, &m, &err), QWENRT_OK);
        struct qwenrt_model_info info;
        qwenrt_model_get_info(m, &info);
        float *la = malloc((size_t)info.n_vocab * sizeof(float));
        for (int k = 0; k < 3; k++) {
            struct qwenrt_session *a = NULL, *b = NULL;
            struct qwenrt_sampler *sa = NULL, *sb = NULL;
            open_twins(m, &ps[k], info.n_vocab, &a, &b, &sa, &sb);
            assert_int_equal(qwenrt_session_prefill(a, prompt, 6, NULL, &err), QWENRT_OK);
            assert_int_equal(qwenrt_session_prefill(b, prompt, 6, NULL, &err), QWENRT_OK);
            int32_t first, want[48], got[48];
            assert_int_equal(qwenrt_session_sample(a, sa, &first, &err), QWENRT_OK);
            assert_int_equal(qwenrt_session_sample(b, sb, &got[0], &err), QWENRT_OK);
            assert_int_equal(got[0], first);
            sample_token_by_token(a, sa, first, 21, want);
            assert_int_equal(session_generate(b, sb, first, 16, got, &err), QWENRT_OK);
            assert_int_equal(session_generate(b, sb, got[15], 5, got + 16, &err), QWENRT_OK);
            for (int32_t i = 0; i < 21; i++)
                if (got[i] != want[i])
                    fail_msg("%s, sampler %d: step %d drew %d on the GPU, %d token by token", fixtures[f], k, i,
                             got[i], want[i]);
            assert_int_equal(qwenrt_session_n_past(a), qwenrt_session_n_past(b));
            memcpy(la, qwenrt_session_logits(a), (size_t)info.n_vocab * sizeof(float));
            assert_memory_equal(la, qwenrt_session_logits(b), (size_t)info.n_vocab * sizeof(float));
            /* a stop at the 6th of 16 draws: b undoes 10 steps, then both go on token by token */
            int32_t from = want[20], more[16];
            sample_token_by_token(a, sa, from, 6, want);
            assert_int_equal(session_generate(b, sb, from, 16, more, &err), QWENRT_OK);
            assert_memory_equal(more, want, 6 * sizeof(int32_t));
            assert_int_equal(session_generate_keep(b, sb, from, more, 16, 6, &err), QWENRT_OK);
            assert_int_equal(qwenrt_session_n_past(a), qwenrt_session_n_past(b));
            memcpy(la, qwenrt_session_logits(a), (size_t)info.n_vocab * sizeof(float));
            assert_memory_equal(la, qwenrt_session_logits(b), (size_t)info.n_vocab * sizeof(float));
            sample_token_by_token(a, sa, want[5], 8, want);
            sample_token_by_token(b, sb, more[5], 8, got);
            assert_memory_equal(got, want, 8 * sizeof(int32_t));
            assert_int_equal(session_generate_keep(b, sb, from, more, 16, 0, &err), QWENRT_ERR_INVALID_ARG);
            qwenrt_sampler_free(sa);
            qwenrt_sampler_free(sb);
            qwenrt_session_free(a);
            qwenrt_session_free(b);
        }
        /* penalties, or no top-k: the host draws; nothing ran */
        struct qwenrt_sampler_params pen = ps[1];
        pen.repeat_penalty = 1.2f;
        struct qwenrt_session *c = NULL;
        struct qwenrt_sampler *sc = NULL;
        assert_int_equal(qwenrt_session_init(m, NULL, &c, &err), QWENRT_OK);
        assert_int_equal(qwenrt_sampler_init(&pen, info.n_vocab, &sc, &err), QWENRT_OK);
        int32_t out[4];
        assert_int_equal(session_generate(c, sc, 1, 4, out, &err), QWENRT_ERR_UNSUPPORTED);
        assert_int_equal(qwenrt_session_n_past(c), 0);
        qwenrt_sampler_free(sc);
        qwenrt_session_free(c);
        free(la);
        qwenrt_model_free(m);
    }
}

/* The decode attention's cheaper forms of two helpers against the plain ones on random
 * inputs (device_checks.cu): warp_sum_each must give every lane warp_sum's bits for every one
 * of its values (values of magnitudes 1e-3 to 1e3, so that another order of the additions
 * shows: checked by summing in lane order on the host, which must differ somewhere), in 37
 * warps for each count it takes; att_exp must be __expf bit for bit wherever x log2(e) (in f32,
 * as both compute it) is at least -126, and 0 below (arguments from -100 to 20, the edge near
 * -87.3 in steps of 1e-4, and -inf). Bad shapes are refused by name. */
static void test_device_helpers(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    enum { WARPS = 37 };
    static const int32_t ns[] = {1, 2, 4, 8, 16, 32};
    for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
        const int32_t n = ns[c];
        const size_t count = (size_t)WARPS * n * 32;
        float *x = malloc(count * 4), *each = malloc(count * 4), *plain = malloc(count * 4);
        assert_non_null(x), assert_non_null(each), assert_non_null(plain);
        for (size_t i = 0; i < count; i++)
            x[i] = frand() * powf(10.0f, 3.0f * frand());
        assert_int_equal(cuda_warp_sum_each_host(n, WARPS, x, each, plain, &err), QWENRT_OK);
        long differ = 0, lane_order_differs = 0;
        for (size_t v = 0; v < count / 32; v++) {
            float in_order = 0.0f;
            for (int l = 0; l < 32; l++) {
                differ += memcmp(&each[v * 32 + l], &plain[v * 32 + l], sizeof(float)) != 0;
                differ += memcmp(&plain[v * 32 + l], &plain[v * 32], sizeof(float)) != 0; /* every lane the same */
                in_order += x[v * 32 + l];
            }
            lane_order_differs += in_order != plain[v * 32];
        }
        printf("warp_sum_each of %d values, %d warps: %ld lanes not warp_sum's bits; the lane-order sum differs in "
               "%ld of %zu\n",
               (int)n, WARPS, differ, lane_order_differs, count / 32);
        assert_int_equal(differ, 0);
        assert_true(lane_order_differs > 0);
        free(x), free(each), free(plain);
    }
    enum { NE = 2 * 1200 + 10001 + 1 };
    float *x = malloc(NE * 4), *fast = malloc(NE * 4), *plain = malloc(NE * 4);
    assert_non_null(x), assert_non_null(fast), assert_non_null(plain);
    int32_t k = 0;
    for (int i = 0; i < 2 * 1200; i++)
        x[k++] = -100.0f + 120.0f * (float)i / (2 * 1200) + 0.01f * frand();
    for (int i = 0; i <= 10000; i++)
        x[k++] = -88.0f + 1e-4f * (float)i; /* __expf crosses 2^-126 near -87.34 */
    x[k++] = -INFINITY;
    assert_int_equal(cuda_att_exp_host(k, x, fast, plain, &err), QWENRT_OK);
    long bad = 0, normal = 0, flushed = 0;
    for (int32_t i = 0; i < k; i++) {
        const volatile float t = x[i] * 1.4426950408889634f; /* the f32 exponent both compute */
        if (t >= -126.0f) {
            normal++;
            bad += memcmp(&fast[i], &plain[i], sizeof(float)) != 0;
        } else {
            flushed += plain[i] > 0.0f;
            bad += fast[i] != 0.0f;
        }
    }
    printf("att_exp: %ld of %d not __expf's bits (%ld normal results, %ld subnormal ones flushed)\n", bad, (int)k,
           normal, flushed);
    assert_int_equal(bad, 0);
    assert_true(normal > 1000 && flushed > 100);
    free(x), free(fast), free(plain);
    float one = 0.0f, out[2 * 32 * 3];
    assert_int_equal(cuda_warp_sum_each_host(3, 1, &one, out, out + 96, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "warp_sum_each"));
    assert_int_equal(cuda_att_exp_host(0, &one, out, out + 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "att_exp"));
}

/* cuda_session_init refuses o with want before touching the device, and (CUDA compiled in)
 * its message names the option and the bad value. */
static void check_options_refused(const struct cuda_options *o, const char *option, int32_t bad,
                                  qwenrt_status want)
{
    struct qwenrt_error err = {0};
    struct cuda_session *cs = NULL;
    assert_int_equal(cuda_session_init(NULL, 16, o, &cs, &err), want);
    assert_null(cs);
    char msg[48];
    snprintf(msg, sizeof(msg), "%s %d ", option, (int)bad);
    if (cuda_backend_compiled() && !strstr(err.message, msg))
        fail_msg("the refusal \"%s\" does not name \"%s\"", err.message, msg);
}

static void test_backend_errors(void **st)
{
    (void)st;
    struct qwenrt_model *m = NULL;
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "tpu";
    assert_int_equal(qwenrt_model_load(fixtures[0], &mp, &m, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(err.message, "tpu"));
    /* the launch-floor bench refuses a bad shape before touching the device: no launches,
     * and a grid that clusters of 8 do not divide */
    double us = -1;
    qwenrt_status want = cuda_backend_compiled() ? QWENRT_ERR_INVALID_ARG : QWENRT_ERR_BACKEND;
    assert_int_equal(cuda_launch_floor_bench(0, 132, 128, 1, false, 3, &us, &err), want);
    assert_int_equal(cuda_launch_floor_bench(140, 130, 128, 8, false, 3, &us, &err), want);
    assert_true(us == -1);
    assert_int_equal(cuda_session_count_steps(NULL, "gemv+residual"), 0);
    /* the GEMV bench refuses a kernel it does not have (0 first, 1 gemv2, 2 gemv_smem, 3 the
     * multi-token GEMV, 4 its tensor cores' form, 5 quantised rows' 8-bit form), and more than 8
     * tokens but for kernels 4 and 5 (16 at most) */
    double gbs = -1;
    us = -1;
    assert_int_equal(cuda_gemv_bench(QR_BF16, 64, 64, 1, false, 6, false, 2, &us, &gbs, NULL, &err), want);
    assert_true(us == 0 && gbs == 0);
    assert_int_equal(cuda_gemv_bench(QR_BF16, 64, 64, 9, false, 3, false, 2, &us, &gbs, NULL, &err), want);
    assert_int_equal(cuda_gemv_bench(QR_BF16, 64, 64, 17, false, 4, false, 2, &us, &gbs, NULL, &err), want);
    assert_int_equal(cuda_gemv_bench(QR_Q4_K, 64, 256, 17, false, 5, false, 2, &us, &gbs, NULL, &err), want);
    if (cuda_backend_compiled())
        assert_non_null(strstr(err.message, "cuda_gemv_bench"));
    /* the argmax hook refuses an empty row */
    float one = 1.0f;
    int32_t id = -1;
    assert_int_equal(cuda_argmax(&one, 0, false, 1, &id, &err), want);
    assert_int_equal(id, 0);
    id = -1; /* and blocks outside 1-1,024 */
    assert_int_equal(cuda_argmax(&one, 1, false, 0, &id, &err), want);
    assert_int_equal(cuda_argmax(&one, 1, false, 1025, &id, &err), want);
    assert_int_equal(id, 0);
    if (cuda_backend_compiled())
        assert_non_null(strstr(err.message, "1025 blocks"));
    /* the decode's shape options out of range are refused by name before any device work:
     * gemv_smem warps 0 (the session picks), 1, 2, 4, 8 or 16, KB 0 or 16 to 226, launch 0 (the
     * session picks), 1 early, 2 after the wait; gemvq rows 0, 1, 2, 4, its launch order 0-2,
     * warps 0, 4, 8, KB reserved 0 to 200, LM-head loop blocks 0 to 8; argmax blocks 0 to
     * 1,024; the attention's minimum
     * positions per split 0 or 16 to 4096; gemv_smem_res_min_blocks, _pair_ and _multi_ 0 to 4096; gemv_smem_xreg 0 or 1; gen_graph_steps 0 to 16;
     * gdn_staged 0 or 1; gdn_wide 0 or 1; gemvq_one_pass 0 or 1; gemv_smem_norm_late -1 to 1; attn_one_split 0
     * to 4096; attn_o 0, 1, 8 or 16; attn_o_single 0 to 4096; attn_cluster -1 to 2, its window's
     * edges 0 or 1 to ATTN_CLUSTER_POS_LIMIT with until after from (100: before the default from);
     * attn_pipe -1 to 1; gemv_smem_waves 0 to 4; gemv_smem_alone 0 to 2; gemv_launch_ahead -1 to 3;
     * attn_shared_kv -1 to 1; attn_lanes 0, 8, 16 or 32; attn_stage -1 to 8; mlp_rows 0 to 3; mlp_rows_cluster
     * 0, 1, 2, 4 or 8; mlp_rows_down 0 or 1; attn_rope_regs 0 or 1; attn_batch_blocks -1 to 32 */
    static const struct {
        const char *name;
        size_t offset; /* of an int32_t in struct cuda_options */
        int32_t bad[2];
    } refused[] = {{"gemv_smem_warps", offsetof(struct cuda_options, gemv_smem_warps), {-1, 3}},
                   {"gemv_smem_kb", offsetof(struct cuda_options, gemv_smem_kb), {8, 300}},
                   {"gemv_smem_launch", offsetof(struct cuda_options, gemv_smem_launch), {-1, 3}},
                   {"gemvq_rows", offsetof(struct cuda_options, gemvq_rows), {3, 8}},
                   {"gemvq_launch", offsetof(struct cuda_options, gemvq_launch), {-1, 3}},
                   {"gemvq_warps", offsetof(struct cuda_options, gemvq_warps), {2, 16}},
                   {"gemvq_smem_kb", offsetof(struct cuda_options, gemvq_smem_kb), {-1, 201}},
                   {"gemvq_head_blocks", offsetof(struct cuda_options, gemvq_head_blocks), {-1, 9}},
                   {"argmax_blocks", offsetof(struct cuda_options, argmax_blocks), {-1, 1025}},
                   {"gemvq_int8", offsetof(struct cuda_options, gemvq_int8), {-2, 2}},
                   {"qkv_attn", offsetof(struct cuda_options, qkv_attn), {4, 32}},
                   {"gemv_smem_min_blocks", offsetof(struct cuda_options, gemv_smem_min_blocks), {-1, 5000}},
                   {"gemv_smem_res_min_blocks", offsetof(struct cuda_options, gemv_smem_res_min_blocks), {-1, 4097}},
                   {"gemv_smem_pair_min_blocks", offsetof(struct cuda_options, gemv_smem_pair_min_blocks), {-1, 4097}},
                   {"gemv_smem_multi_min_blocks", offsetof(struct cuda_options, gemv_smem_multi_min_blocks), {-1, 4097}},
                   {"attn_early", offsetof(struct cuda_options, attn_early), {-2, 2}},
                   {"gdn_early", offsetof(struct cuda_options, gdn_early), {-2, 1}},
                   {"attn_split_min", offsetof(struct cuda_options, attn_split_min), {8, 5000}},
                   {"l2_prefetch_mb", offsetof(struct cuda_options, l2_prefetch_mb), {-1, 65}},
                   {"gemv_smem_xreg", offsetof(struct cuda_options, gemv_smem_xreg), {-1, 2}},
                   {"gen_graph_steps", offsetof(struct cuda_options, gen_graph_steps), {-1, GEN_GRAPH_STEPS_LIMIT + 1}},
                   {"gdn_staged", offsetof(struct cuda_options, gdn_staged), {-1, 2}},
                   {"gdn_wide", offsetof(struct cuda_options, gdn_wide), {-1, 2}},
                   {"gemvq_one_pass", offsetof(struct cuda_options, gemvq_one_pass), {-1, 2}},
                   {"gemv_smem_norm_late", offsetof(struct cuda_options, gemv_smem_norm_late), {-2, 2}},
                   {"attn_one_split", offsetof(struct cuda_options, attn_one_split), {-1, 4097}},
                   {"attn_batch_blocks", offsetof(struct cuda_options, attn_batch_blocks), {-2, 33}},
                   {"attn_o", offsetof(struct cuda_options, attn_o), {2, 32}},
                   {"attn_o_single", offsetof(struct cuda_options, attn_o_single), {-1, 4097}},
                   {"attn_cluster", offsetof(struct cuda_options, attn_cluster), {-2, 3}},
                   {"attn_cluster_from", offsetof(struct cuda_options, attn_cluster_from), {-1, ATTN_CLUSTER_POS_LIMIT + 1}},
                   {"attn_cluster_until", offsetof(struct cuda_options, attn_cluster_until), {-1, 100}},
                   {"attn_pipe", offsetof(struct cuda_options, attn_pipe), {-2, 2}},
                   {"gemv_smem_waves", offsetof(struct cuda_options, gemv_smem_waves), {-1, 5}},
                   {"gemv_smem_alone", offsetof(struct cuda_options, gemv_smem_alone), {-1, 3}},
                   {"gemv_launch_ahead", offsetof(struct cuda_options, gemv_launch_ahead), {-2, 4}},
                   {"attn_shared_kv", offsetof(struct cuda_options, attn_shared_kv), {-2, 2}},
                   {"attn_lanes", offsetof(struct cuda_options, attn_lanes), {4, 64}},
                   {"attn_stage", offsetof(struct cuda_options, attn_stage), {-2, 9}},
                   {"mlp_rows", offsetof(struct cuda_options, mlp_rows), {-1, 4}},
                   {"mlp_rows_cluster", offsetof(struct cuda_options, mlp_rows_cluster), {3, 16}},
                   {"mlp_rows_down", offsetof(struct cuda_options, mlp_rows_down), {-1, 2}},
                   {"attn_rope_regs", offsetof(struct cuda_options, attn_rope_regs), {-1, 2}}};
    for (size_t r = 0; r < sizeof(refused) / sizeof(refused[0]); r++)
        for (int i = 0; i < 2; i++) {
            struct cuda_options o = cuda_default_options();
            *(int32_t *)((char *)&o + refused[r].offset) = refused[r].bad[i];
            check_options_refused(&o, refused[r].name, refused[r].bad[i], want);
        }
    int32_t w = -1, kb = -1, launch = -1, mb = -1;
    cuda_session_gemv_smem_shape(NULL, &w, &kb, &launch, &mb);
    assert_true(w == 0 && kb == 0 && launch == 0 && mb == 0);
    int32_t res = -1, pair = -1, multi = -1;
    cuda_session_gemv_smem_kind_minima(NULL, &res, &pair, &multi);
    assert_true(res == 0 && pair == 0 && multi == 0);
}

/* The decode GEMV's kernel and shape choices, host code that needs no device (so CI runs it):
 * gemv_smem takes one token of 16-bit rows (not f32 nor quantised ones, which gemvq takes);
 * the tensor cores take BF16 rows whose K splits over a tile's warps in steps of 64; with
 * gemv_smem_xreg, x is held in registers as 4 chunks of 8 per lane up to K = 1024 and 8 up to
 * 2048 (no norm in these launches), staged in shared memory above. Built without CUDA (the
 * stub), nothing is taken. */
/* The DeltaNet step's staged state slice (cuda_options.gdn_staged), host code: dk rows of
 * dv / GS + 1 floats, GS blocks per head: one per norm group (8 where dv / 8 >= 4), or with
 * gdn_wide one per two groups where a block of two stays within 512 threads (16 threads a
 * column); none where the split does not apply or the tile passes 44 KB. */
static void test_gdn_staged_shape(void **st)
{
    (void)st;
    if (!cuda_backend_compiled()) { /* the stub (built without CUDA) stages nothing */
        assert_int_equal(cuda_gdn_staged_bytes(128, 128, true), 0);
        return;
    }
    for (int wide = 0; wide <= 1; wide++) {
        const int32_t twice = wide ? 2 : 1; /* columns a block, in units of a group's */
        assert_int_equal(cuda_gdn_staged_bytes(128, 128, wide), 128 * (16 * twice + 1) * 4); /* Qwen3.5-0.8B */
        assert_int_equal(cuda_gdn_staged_bytes(32, 48, wide), 32 * (6 * twice + 1) * 4);     /* qwen35-tiny */
        assert_int_equal(cuda_gdn_staged_bytes(16, 16, wide), 16 * (4 * twice + 1) * 4); /* 4 groups of 4 */
        assert_int_equal(cuda_gdn_staged_bytes(256, 256, wide), 256 * 33 * 4); /* two groups: 1,024 threads */
        assert_int_equal(cuda_gdn_staged_bytes(256, 512, wide), 0); /* 256 x 65 floats: over 44 KB */
        assert_int_equal(cuda_gdn_staged_bytes(40, 128, wide), 0);  /* dk not a multiple of 16: no split */
    }
    assert_int_equal(cuda_gdn_staged_bytes(16, 8, true), 16 * 5 * 4); /* two groups: not halved */
}

/* gemv_smem's block shapes under the session's 8-warp pick (136 KB, 96 blocks at least), H200
 * (132 multiprocessors): without gemv_smem_waves, warps halved from 8 (Qwen3-0.6B's gate|up:
 * 96 blocks of 8 warps, its o and down 128 of 4); with waves 1, the fewest warps that keep the
 * grid within 132 blocks (gate|up 6 warps, 128 blocks; q|k|v stays 8 / 128, o 4 / 128), with
 * 2 within 264, and the same rule on an awkward count of 100 multiprocessors. */
static void check_gemv_smem_waves(void)
{
    static const struct {
        int32_t N, K;
        bool swiglu;
        int32_t waves, n_sm, warps, blocks;
    } cases[] = {{3072, 1024, true, 0, 132, 8, 96},  {3072, 1024, true, 1, 132, 6, 128},
                 {3072, 1024, true, 2, 132, 3, 256}, {4096, 1024, false, 1, 132, 8, 128},
                 {1024, 2048, false, 0, 132, 4, 128}, {1024, 2048, false, 1, 132, 4, 128},
                 {1024, 3072, false, 1, 132, 4, 128}, {3584, 1024, true, 1, 132, 7, 128},
                 {3072, 1024, true, 1, 100, 8, 96},  {1000, 1024, false, 1, 100, 3, 84}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t warps = -1;
        int32_t blocks = cuda_gemv_smem_grid(QR_BF16, cases[i].N, cases[i].K, cases[i].swiglu, cases[i].waves,
                                             cases[i].n_sm, &warps);
        if (blocks != cases[i].blocks || warps != cases[i].warps)
            fail_msg("gemv_smem %dx%d%s, waves %d on %d: %d blocks of %d warps, want %d of %d", (int)cases[i].N,
                     (int)cases[i].K, cases[i].swiglu ? " pairs" : "", (int)cases[i].waves, (int)cases[i].n_sm,
                     (int)blocks, (int)warps, (int)cases[i].blocks, (int)cases[i].warps);
    }
}

/* The launch kinds' own minimum grids under the 16-warp pick (gemv_smem_min_blocks 192, as
 * the session picks for Qwen3.5-0.8B): a GEMV + residual of 1,024 x 2,048 rows halves to 256
 * blocks of 2 warps, with its own minimum 64 it keeps 64 of 8; gate|up's 3,584 pairs 224 of 4,
 * with 96 or 64 (the session's pick since session 49) 112 of 8; two matrices of 2,048 rows
 * (K 1,024) 256 of 4, with 96 128 of 8; and a kind's minimum leaves the other kinds alone. */
static void check_gemv_smem_kind_minimum(void)
{
    static const struct {
        int32_t kind, set_kind, N, K, kind_min, warps, blocks;
    } cases[] = {{0, 0, 1024, 2048, 0, 2, 256},  {0, 0, 1024, 2048, 64, 8, 64}, {0, 1, 1024, 2048, 64, 2, 256},
                 {0, 2, 1024, 2048, 64, 2, 256}, {1, 1, 3584, 1024, 0, 4, 224}, {1, 1, 3584, 1024, 96, 8, 112},
                 {1, 1, 3584, 1024, 64, 8, 112} /* the session's pick with 16 warps */,
                 {1, 0, 3584, 1024, 96, 4, 224}, {2, 2, 4096, 1024, 0, 4, 256}, {2, 2, 4096, 1024, 96, 8, 128},
                 {2, 1, 4096, 1024, 96, 4, 256}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t warps = -1;
        int32_t blocks = cuda_gemv_smem_grid_kind(cases[i].kind, cases[i].set_kind, cases[i].N, cases[i].K, 192,
                                                  cases[i].kind_min, &warps);
        if (blocks != cases[i].blocks || warps != cases[i].warps)
            fail_msg("gemv_smem kind %d, %dx%d, kind %d's minimum %d: %d blocks of %d warps, want %d of %d",
                     (int)cases[i].kind, (int)cases[i].N, (int)cases[i].K, (int)cases[i].set_kind,
                     (int)cases[i].kind_min, (int)blocks, (int)warps, (int)cases[i].blocks, (int)cases[i].warps);
    }
}

static void test_gemv_shape_choices(void **st)
{
    (void)st;
    if (!cuda_backend_compiled()) { /* the stub (built without CUDA) takes nothing */
        assert_false(cuda_gemv_smem_takes(QR_BF16, 300, 1024));
        assert_false(cuda_gemv_mma_takes(300, 1024));
        assert_int_equal(cuda_gemv_smem_xreg_chunks(QR_BF16, 300, 1024), 0);
        int32_t warps = 0;
        assert_int_equal(cuda_gemv_smem_grid(QR_BF16, 3072, 1024, true, 1, 132, &warps), 0);
        assert_int_equal(cuda_gemv_smem_grid_kind(0, 0, 1024, 2048, 192, 64, &warps), 0);
        return;
    }
    static const struct {
        int32_t K, xreg;
    } ks[] = {{8, 4}, {384, 4}, {768, 4}, {1024, 4}, {1032, 8}, {1280, 8}, {2048, 8}, {2056, 0}, {3072, 0},
              {3584, 0}, {4096, 0}};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
        for (int d = 0; d < 2; d++) {
            enum qr_dtype dt = d ? QR_F16 : QR_BF16;
            assert_true(cuda_gemv_smem_takes(dt, 300, ks[i].K));
            if (cuda_gemv_smem_xreg_chunks(dt, 300, ks[i].K) != ks[i].xreg)
                fail_msg("%s K=%d: x chunks per lane %d, want %d", dtype_traits(dt)->name, (int)ks[i].K,
                         (int)cuda_gemv_smem_xreg_chunks(dt, 300, ks[i].K), (int)ks[i].xreg);
        }
    assert_true(cuda_gemv_mma_takes(300, 1024));
    assert_false(cuda_gemv_mma_takes(300, 768 + 64)); /* K = 832: not in steps of 128 at 8 lanes */
    assert_false(cuda_gemv_smem_takes(QR_F32, 300, 1024));
    assert_false(cuda_gemv_smem_takes(QR_Q8_0, 300, 1024));
    assert_int_equal(cuda_gemv_smem_xreg_chunks(QR_Q8_0, 300, 1024), 0);
    assert_false(cuda_gemv_smem_takes(QR_BF16, 70000, 1024)); /* an LM head's rows: gemv2 */
    assert_int_equal(cuda_gemv_smem_xreg_chunks(QR_BF16, 70000, 1024), 0);
    check_gemv_smem_waves();
    check_gemv_smem_kind_minimum();
}

int main(void)
{
    struct qwenrt_error err = {0};
    if (cuda_probe(0, &err) != QWENRT_OK) {
        printf("CUDA tests skipped: %s (only the refusals that need no device run)\n", err.message);
        const struct CMUnitTest none[] = {cmocka_unit_test(test_backend_errors),
                                          cmocka_unit_test(test_gemv_shape_choices),
                                          cmocka_unit_test(test_gdn_staged_shape)};
        return cmocka_run_group_tests(none, NULL, NULL);
    }
    char dev[256];
    cuda_device_describe(dev, sizeof(dev));
    printf("device: %s\n", dev);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_errors),
        cmocka_unit_test(test_gemv_shape_choices),
        cmocka_unit_test(test_gdn_staged_shape),
        cmocka_unit_test(test_op_embed),
        cmocka_unit_test(test_op_elementwise),
        cmocka_unit_test(test_op_matmul),
        cmocka_unit_test(test_op_gemv_sizes),
        cmocka_unit_test(test_graph_gemvq),
        cmocka_unit_test(test_graph_mlp_fused),
        cmocka_unit_test(test_graph_mlp_rows_same_bits),
        cmocka_unit_test(test_graph_gemv_smem),
        cmocka_unit_test(test_graph_gemv_smem_waves),
        cmocka_unit_test(test_graph_gemv_smem_alone),
        cmocka_unit_test(test_graph_launch_ahead),
        cmocka_unit_test(test_graph_attn_o),
        cmocka_unit_test(test_graph_attn_cluster),
        cmocka_unit_test(test_graph_attn_pipe),
        cmocka_unit_test(test_graph_attn_rope_regs),
        cmocka_unit_test(test_graph_attn_shared_kv),
        cmocka_unit_test(test_graph_attn_lanes),
        cmocka_unit_test(test_graph_attn_stage),
        cmocka_unit_test(test_graph_kv_f16),
        cmocka_unit_test(test_graph_gdn_split),
        cmocka_unit_test(test_op_attention),
        cmocka_unit_test(test_op_deltanet),
        cmocka_unit_test(test_fixtures_api),
        cmocka_unit_test(test_fixtures_default_precision),
        cmocka_unit_test(test_fixtures_kv_f16),
        cmocka_unit_test(test_calibrate_cuda),
        cmocka_unit_test(test_fixtures_unfused),
        cmocka_unit_test(test_fixtures_decode_only),
        cmocka_unit_test(test_fixtures_decode_graph),
        cmocka_unit_test(test_megakernel_quantised),
        cmocka_unit_test(test_megakernel_real_width),
        cmocka_unit_test(test_batch_decode_cuda),
        cmocka_unit_test(test_batch_graph_cuda),
        cmocka_unit_test(test_batch_seq_cuda),
        cmocka_unit_test(test_batch_fail_kept_cuda),
        cmocka_unit_test(test_gemv_batch_kernel),
        cmocka_unit_test(test_gemvq_batch_mma_kernel),
        cmocka_unit_test(test_device_helpers),
        cmocka_unit_test(test_batch_pays),
        cmocka_unit_test(test_batch_int8_cuda),
        cmocka_unit_test(test_batch_int8_q35_cuda),
        cmocka_unit_test(test_checkpoint_cuda),
        cmocka_unit_test(test_int8_from_cpu_state),
        cmocka_unit_test(test_prefill_split_cuda),
        cmocka_unit_test(test_topk_select),
        cmocka_unit_test(test_topk_rows),
        cmocka_unit_test(test_op_argmax),
        cmocka_unit_test(test_attention_rope_fused),
        cmocka_unit_test(test_attn_early),
        cmocka_unit_test(test_l2_prefetch),
        cmocka_unit_test(test_gdn_early),
        cmocka_unit_test(test_decode_timeline),
        cmocka_unit_test(test_qkv_attn),
        cmocka_unit_test(test_decode_omit_steps),
        cmocka_unit_test(test_generate_graph_steps),
        cmocka_unit_test(test_session_sample_cuda),
        cmocka_unit_test(test_session_sample_all_cuda),
        cmocka_unit_test(test_sample_kernel),
        cmocka_unit_test(test_generate_sampled),
    };
    /* QWENRT_TEST_FILTER=pattern (cmocka's: * and ? wildcards) runs only the matching tests:
     * GPU time is scarce, a device call may check one change */
    const char *filter = getenv("QWENRT_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
