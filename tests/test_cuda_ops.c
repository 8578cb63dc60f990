/*
 * test_cuda_ops.c — the CUDA backend's kernels one op at a time against the CPU reference
 * kernels (issue 6), on random inputs of awkward sizes: odd widths, 1 and many tokens, every
 * weight dtype, GEMV and GEMM paths, decode steps after a prefill so that the KV cache and the
 * DeltaNet state carry over; the decode GEMV variants and the batched GEMVs (gemv_batch*.cu,
 * gemvq_batch*.cu) against the plain kernels; the greedy loop's argmax against its contract,
 * the screened LM head (lm_screen.cu) against exact logits in double, the top-m selection
 * (topk.cu) against its reference kernel and a host sort, sample.cu's draw
 * against the host sampler's, and the decode attention's cheaper helpers (device_checks.cu)
 * against the plain ones. Needs a GPU (cuda_testutil.h).
 */
#include "cuda_testutil.h"

#define OP_REL_TOL 2e-5     /* one op, f32 both sides: only summation order differs */
#define OP_GEMM_BF16_TOL 3e-5 /* bf16 weights, x split in two bf16 terms (~2^-17 each) */
#define OP_ATTN_TF32_TOL 5e-3 /* attention products in TF32 (inputs rounded to 2^-11) */
#define OP_ATTN_FLASH_TOL 5e-3 /* flash kernel: f16 q, k (2^-11), bf16 p, v (2^-8) */
#define OP_ATTN_KV16_TOL 3e-3  /* the KV cache in f16: k and v rounded to 2^-11 */
#define OP_GEMM_FAST_TOL 5e-3 /* x (and dequantised W) rounded to bf16: 2^-9 per element */

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
    o.gdn_chunked = par >= 3 ? 2 : par == 2 ? 1 : 0;
    o.gdn_scan_warps = par == 4 ? 16 : 0;
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
    /* prefill: recurrent kernel (par 0), the column scan (1), the chunks of 64 tokens with
     * f32 products (2) and with 3xTF32 tensor-core products, the walk on 8 warps (3) or 16 (4) */
    for (int par = 0; par < 5; par++) {
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

/* The screened LM head (lm_screen.cu) against the argmax of exact logits computed here in
 * double: awkward sizes (one row, K = 32, K beyond one 1,024-column pass), each 16- and
 * 32-bit dtype; a planted near-tie (a copy of the winning row raised by a few units in the
 * last place, far inside the 8-bit copy's error: only the exact pass can tell them apart); an
 * exact tie (the lower index wins); all-NaN input (0, as the argmax); a row with Inf (the
 * screen declines); bad arguments, a Q6_K head (not screened). Each
 * pick three times in a row (the scratch comes back zeroed), and the screen must read most
 * rows only through the copy; the sampled form's m best (check_screen_best). */
struct screen_ref {
    int32_t best, second;
    double l_best, l_second, scale; /* scale: max_j sum_k |x_k w_jk| (the f32 sums' size) */
    double *logits;                 /* [N] every exact logit (caller frees) */
};

static struct screen_ref screen_reference(const float *h, const float *g, float eps, const uint8_t *w,
                                          enum qr_dtype dt, int32_t N, int32_t K)
{
    size_t rb;
    assert_true(dtype_row_bytes(dt, K, &rb));
    double ss = 0.0;
    for (int32_t k = 0; k < K; k++)
        ss += (double)h[k] * h[k];
    double inv = 1.0 / sqrt(ss / K + eps), *x = malloc((size_t)K * sizeof(double));
    float *row = malloc((size_t)K * sizeof(float));
    for (int32_t k = 0; k < K; k++)
        x[k] = h[k] * inv * g[k];
    struct screen_ref r = {-1, -1, -INFINITY, -INFINITY, 0.0, malloc((size_t)N * sizeof(double))};
    for (int32_t j = 0; j < N; j++) {
        assert_true(quant_dequantize_row(dt, w + (size_t)j * rb, row, K));
        double l = 0.0, a = 0.0;
        for (int32_t k = 0; k < K; k++)
            l += x[k] * row[k], a += fabs(x[k] * row[k]);
        r.logits[j] = l;
        r.scale = a > r.scale ? a : r.scale;
        if (l > r.l_best)
            r.second = r.best, r.l_second = r.l_best, r.best = j, r.l_best = l;
        else if (l > r.l_second)
            r.second = j, r.l_second = l;
    }
    free(x);
    free(row);
    return r;
}

/* One pick checked: the token's exact logit is the largest (up to the f32 sums' rounding) and
 * is the reference's where the top two stand apart; returns the token. */
static int32_t check_screen_pick(const float *h, const float *g, const uint8_t *w, enum qr_dtype dt, int32_t N,
                                 int32_t K, const char *what)
{
    struct qwenrt_error err = {0};
    int32_t id = -2;
    int64_t rows = 0;
    bool built = false;
    if (cuda_lm_screen_pick(h, g, 1e-6f, w, dt, N, K, 0, 3, &id, NULL, NULL, &rows, &built, &err))
        fail_msg("lm_screen %s (dtype %d, %d x %d): %s", what, (int)dt, (int)N, (int)K, err.message);
    assert_true(built);
    struct screen_ref r = screen_reference(h, g, 1e-6f, w, dt, N, K);
    const double tol = 1e-5 * r.scale;
    free(r.logits);
    if (r.l_best - r.l_second > tol && id != r.best)
        fail_msg("lm_screen %s (dtype %d, %d x %d): %d, want %d (gap %.3g)", what, (int)dt, (int)N, (int)K, (int)id,
                 (int)r.best, r.l_best - r.l_second);
    assert_true(id >= 0 && id < N);
    assert_true(rows >= 3);
    if (N >= 1000 && rows > 3 * (int64_t)N / 20) /* more than 5% of the rows read exactly */
        fail_msg("lm_screen %s (%d x %d): %lld rows exactly over 3 picks", what, (int)N, (int)K, (long long)rows);
    printf("lm_screen %-9s dtype %2d, %6d x %4d: token %6d, %4.1f rows exactly a pick\n", what, (int)dt, (int)N,
           (int)K, (int)id, rows / 3.0);
    return id;
}

/* Rank order of the m best of l (value descending, then index ascending) into ids. */
static void best_m(const double *l, int32_t N, int32_t m, int32_t *ids)
{
    for (int32_t k = 0; k < m; k++) {
        int32_t b = -1;
        for (int32_t j = 0; j < N; j++) {
            bool taken = false;
            for (int32_t q = 0; q < k && !taken; q++)
                taken = ids[q] == j;
            if (!taken && (b < 0 || l[j] > l[b]))
                b = j;
        }
        ids[k] = b;
    }
}

/* The sampled loop's form for m: its m best rows, ranked, are the exact logits' m best (where
 * the m-th and the next stand apart; ranks may swap only within the sums' rounding), each value
 * the row's exact logit, every one at least the m-th best exact logit. */
static void check_screen_best(const float *h, const float *g, const uint8_t *w, enum qr_dtype dt, int32_t N, int32_t K,
                              int32_t m)
{
    struct qwenrt_error err = {0};
    int32_t id = -2, got[64], want[65];
    float vals[64];
    int64_t rows = 0;
    bool built = false;
    assert_true(m <= 64);
    if (cuda_lm_screen_pick(h, g, 1e-6f, w, dt, N, K, m, 2, &id, got, vals, &rows, &built, &err))
        fail_msg("lm_screen best %d (dtype %d, %d x %d): %s", (int)m, (int)dt, (int)N, (int)K, err.message);
    assert_true(built);
    struct screen_ref r = screen_reference(h, g, 1e-6f, w, dt, N, K);
    const double tol = 1e-5 * r.scale;
    best_m(r.logits, N, m < N ? m + 1 : m, want);
    assert_true(rows >= 2 * (int64_t)m && rows % 2 == 0); /* each pick reads the same rows */
    const bool apart = m == N || r.logits[want[m - 1]] - r.logits[want[m]] > tol;
    for (int32_t k = 0; k < m; k++) {
        assert_true(got[k] >= 0 && got[k] < N);
        for (int32_t q = 0; q < k; q++)
            if (got[q] == got[k])
                fail_msg("lm_screen best %d: row %d twice (ranks %d and %d)", (int)m, (int)got[k], (int)q, (int)k);
        if (fabs(vals[k] - r.logits[got[k]]) > tol)
            fail_msg("lm_screen best %d: rank %d, row %d is %.9g, exactly %.9g", (int)m, (int)k, (int)got[k], vals[k],
                     r.logits[got[k]]);
        if (k > 0 && !(vals[k] <= vals[k - 1]))
            fail_msg("lm_screen best %d: rank %d (%.9g) above rank %d (%.9g)", (int)m, (int)k, vals[k], (int)k - 1,
                     vals[k - 1]);
        if (r.logits[got[k]] < r.logits[want[m - 1]] - tol)
            fail_msg("lm_screen best %d: rank %d is row %d at %.9g, below the m-th best %.9g", (int)m, (int)k,
                     (int)got[k], r.logits[got[k]], r.logits[want[m - 1]]);
        if (apart && got[k] != want[k] && fabs(r.logits[got[k]] - r.logits[want[k]]) > tol)
            fail_msg("lm_screen best %d (%d x %d): rank %d is row %d, want %d", (int)m, (int)N, (int)K, (int)k,
                     (int)got[k], (int)want[k]);
    }
    printf("lm_screen best %3d, dtype %2d, %6d x %4d: %lld rows exactly\n", (int)m, (int)dt, (int)N, (int)K,
           (long long)(rows / 2));
    free(r.logits);
}

/* Row dst = row src of w (stored as dt), element k raised by delta (rounded as dt stores it). */
static void screen_copy_row(uint8_t *w, enum qr_dtype dt, int32_t K, int32_t src, int32_t dst, int32_t k, float delta)
{
    size_t rb;
    assert_true(dtype_row_bytes(dt, K, &rb));
    float *row = malloc((size_t)K * sizeof(float));
    assert_true(quant_dequantize_row(dt, w + (size_t)src * rb, row, K));
    row[k] += delta;
    assert_true(quant_quantize_row(dt, row, w + (size_t)dst * rb, K));
    free(row);
}

static void screen_case(enum qr_dtype dt, int32_t N, int32_t K)
{
    size_t nbytes, rb;
    assert_true(dtype_row_bytes(dt, K, &rb));
    uint8_t *w = random_weights(dt, K, N, 0.05f, &nbytes);
    float *h = malloc((size_t)K * sizeof(float)), *g = malloc((size_t)K * sizeof(float));
    for (int32_t k = 0; k < K; k++)
        h[k] = frand() * 3.0f, g[k] = 1.0f + 0.2f * frand();
    int32_t id = check_screen_pick(h, g, w, dt, N, K, "random");
    const int32_t ms[] = {1, 7, 40};
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        if (ms[i] <= N && N <= 5000)
            check_screen_best(h, g, w, dt, N, K, ms[i]);
    int32_t dst = (id + N / 2 + 1) % N;
    if (N >= 2 && dst == id)
        dst = (id + 1) % N;
    if (N >= 2) {
        /* a near-tie: a copy of the winner, its element of the largest |x| raised ~12 units in
         * the last place of a 16-bit weight */
        int32_t kmax = 0;
        for (int32_t k = 1; k < K; k++)
            if (fabsf(h[k] * g[k]) > fabsf(h[kmax] * g[kmax]))
                kmax = k;
        float sign = h[kmax] * g[kmax] > 0 ? 1.0f : -1.0f;
        screen_copy_row(w, dt, K, id, dst, kmax, sign * 0.05f * 0.06f);
        struct screen_ref r = screen_reference(h, g, 1e-6f, w, dt, N, K);
        free(r.logits);
        assert_int_equal(r.best, dst);
        assert_true(r.l_best - r.l_second > 3e-5 * r.scale); /* apart beyond the f32 sums' rounding */
        assert_int_equal(check_screen_pick(h, g, w, dt, N, K, "near-tie"), dst);
    }
    if (N >= 2) {
        /* an exact tie: the same bytes again at another row; the lower index wins */
        int32_t other = (dst + N / 3 + 1) % N;
        if (other != dst) {
            memcpy(w + (size_t)other * rb, w + (size_t)dst * rb, rb);
            assert_int_equal(check_screen_pick(h, g, w, dt, N, K, "tie"), other < dst ? other : dst);
        }
    }
    free(w), free(h), free(g);
}

static void test_lm_screen(void **st)
{
    (void)st;
    screen_case(QR_BF16, 1, 32);
    screen_case(QR_BF16, 1037, 96);
    screen_case(QR_F16, 4099, 160);
    screen_case(QR_F32, 3001, 1056);
    screen_case(QR_BF16, 2050, 2080);
    screen_case(QR_BF16, 40009, 1024);
    struct qwenrt_error err = {0};
    const int32_t N = 777, K = 64;
    size_t nbytes;
    uint8_t *w = random_weights(QR_BF16, K, N, 0.05f, &nbytes);
    float h[64], g[64];
    for (int32_t k = 0; k < K; k++)
        h[k] = NAN, g[k] = 1.0f;
    int32_t id = -2;
    int64_t rows = 0;
    bool built = false;
    assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w, QR_BF16, N, K, 0, 2, &id, NULL, NULL, &rows, &built, &err), QWENRT_OK);
    assert_true(built);
    assert_int_equal(id, 0); /* every logit NaN: 0, as the argmax; every row was read exactly */
    assert_int_equal(rows, 2 * N);
    { /* the sampled form with every logit NaN: all 40,009 rows are candidates (each pick block
       * finds more than it lists for its warps, and the last block selects them in chunks);
       * NaN keys rank by the lower id */
        const int32_t NN = 40009, M = 40;
        uint8_t *w2 = random_weights(QR_BF16, K, NN, 0.05f, &nbytes);
        int32_t top[40];
        float vals[40];
        assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w2, QR_BF16, NN, K, M, 2, &id, top, vals, &rows, &built, &err),
                         QWENRT_OK);
        assert_true(built);
        assert_int_equal(rows, 2 * NN);
        for (int32_t k = 0; k < M; k++) {
            assert_int_equal(top[k], k);
            assert_true(isnan(vals[k]));
        }
        assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w2, QR_BF16, NN, K, 300, 1, &id, top, vals, &rows, &built,
                                             &err),
                         QWENRT_ERR_INVALID_ARG); /* m over CUDA_TOP_MAX_M */
        assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w2, QR_BF16, NN, K, 5, 1, &id, NULL, vals, &rows, &built, &err),
                         QWENRT_ERR_INVALID_ARG);
        free(w2);
    }
    float inf_row[64];
    for (int32_t k = 0; k < K; k++)
        h[k] = frand(), inf_row[k] = k == 5 ? INFINITY : 0.0f;
    assert_true(quant_quantize_row(QR_BF16, inf_row, w + 9 * 2 * K, K));
    assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w, QR_BF16, N, K, 0, 1, &id, NULL, NULL, &rows, &built, &err), QWENRT_OK);
    assert_false(built);
    assert_int_equal(id, -1);
    assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w, QR_BF16, N, 48, 0, 1, &id, NULL, NULL, &rows, &built, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w, QR_Q8_0, N, K, 0, 1, &id, NULL, NULL, &rows, &built, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_int_equal(cuda_lm_screen_pick(h, g, 1e-6f, w, QR_Q6_K, 3, 256, 0, 1, &id, NULL, NULL, &rows, &built, &err),
                     QWENRT_ERR_INVALID_ARG); /* a Q6_K head is not screened */
    free(w);
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

int main(void)
{
    if (!cuda_tests_device())
        return 77; /* ctest: skipped */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_embed),
        cmocka_unit_test(test_op_elementwise),
        cmocka_unit_test(test_op_matmul),
        cmocka_unit_test(test_op_gemv_sizes),
        cmocka_unit_test(test_op_attention),
        cmocka_unit_test(test_op_deltanet),
        cmocka_unit_test(test_gemv_batch_kernel),
        cmocka_unit_test(test_gemvq_batch_mma_kernel),
        cmocka_unit_test(test_topk_select),
        cmocka_unit_test(test_topk_rows),
        cmocka_unit_test(test_op_argmax),
        cmocka_unit_test(test_lm_screen),
    };
    cuda_tests_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
