/*
 * test_prefill_merge.c — the CUDA backend's merged prefill products (prefill_merge.h), on any
 * machine: which consecutive products of one input become one product, and the buffer views
 * their outputs become, over plans shaped like the real ones (Qwen3's q|k|v and gate|up,
 * DeltaNet's qkv|z|beta|alpha) with weights laid out in plan order, as the CUDA upload lays
 * them out. Every case changes one thing that must stop a merge (weights apart, a reader
 * without row strides, the residual product, a layout another layer already set, an output
 * of another width, the switch off) and checks what still merges. The GPU tests
 * (test_cuda_backend) run the merged products themselves against transformers.
 */
#include "testutil.h"

#include "backend/cuda/prefill_merge.h"
#include "format/dtype.h"

/* Buffers of the test plans (widths: hidden 64, q 32, k and v 16, FFN 48). */
enum { B_X, B_XN, B_Q, B_K, B_V, B_ATT, B_TMP, B_GATE, B_UP, B_LOGITS, B_QKV, B_Z, B_BETA, B_ALPHA, B_O, N_BUFS };

struct test_plan {
    struct plan p;
    struct merge_layout m; /* what merge_layout_make made of p (make) */
    struct merge_weight wts[128];
    uint8_t *next; /* where the next product's weights go (plan order) */
    uint8_t arena[1 << 20];
};

static void tp_init(struct test_plan *t)
{
    static const struct {
        const char *name;
        int32_t width;
    } bufs[N_BUFS] = {{"x", 64},    {"xn", 64}, {"q", 32},      {"k", 16},   {"v", 16},
                      {"att", 32},  {"tmp", 64}, {"gate", 48},  {"up", 48},  {"logits", 100},
                      {"qkv", 96},  {"z", 32},  {"beta", 4},    {"alpha", 4}, {"o", 32}};
    memset(t, 0, sizeof(*t));
    assert_true(plan_init(&t->p, PHASE_PREFILL));
    for (int b = 0; b < N_BUFS; b++)
        assert_int_equal(plan_add_buf(&t->p, bufs[b].name, bufs[b].width), b);
    t->p.buf_x = B_X, t->p.buf_logits = B_LOGITS;
    t->next = t->arena;
}

/* A product out = in · Wᵀ (N = out's width, K = in's width, BF16 rows), its weights right
 * after the previous product's, or gap bytes further on. */
static struct plan_op *tp_matmul(struct test_plan *t, int32_t out, int32_t in, int64_t gap)
{
    int32_t i = t->p.n_ops;
    struct plan_op *op = plan_add_op(&t->p, OP_MATMUL, 0);
    op->out = out, op->in = in;
    struct merge_weight *w = &t->wts[i];
    w->dtype = QR_BF16, w->K = t->p.bufs[in].width, w->N = t->p.bufs[out].width;
    w->row_bytes = (int64_t)w->K * 2;
    t->next += gap;
    w->w = t->next;
    t->next += w->N * w->row_bytes;
    assert_true(t->next <= t->arena + sizeof(t->arena));
    return op;
}

static struct plan_op *tp_op(struct test_plan *t, enum op_kind kind, int32_t out, int32_t in)
{
    struct plan_op *op = plan_add_op(&t->p, kind, 0);
    op->out = out, op->in = in;
    return op;
}

/* A Qwen3 layer: norm, q k v, RoPE, attention, o + residual, norm, gate up, SwiGLU, down +
 * residual. gap_v: bytes between k's and v's weights. Returns the index of its q product. */
static int32_t tp_qwen3_layer(struct test_plan *t, int64_t gap_v)
{
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    int32_t q = t->p.n_ops;
    tp_matmul(t, B_Q, B_XN, 0);
    tp_matmul(t, B_K, B_XN, 0);
    tp_matmul(t, B_V, B_XN, gap_v);
    tp_op(t, OP_QK_NORM_ROPE, B_Q, B_K);
    struct plan_op *at = tp_op(t, OP_ATTENTION, B_ATT, B_Q);
    at->in2 = B_K, at->in3 = B_V;
    tp_matmul(t, B_TMP, B_ATT, 0);
    tp_op(t, OP_ADD, B_X, B_TMP);
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    tp_matmul(t, B_GATE, B_XN, 0);
    tp_matmul(t, B_UP, B_XN, 0);
    tp_op(t, OP_SWIGLU, B_GATE, B_UP);
    tp_matmul(t, B_TMP, B_GATE, 0);
    tp_op(t, OP_ADD, B_X, B_TMP);
    return q;
}

static void tp_logits(struct test_plan *t)
{
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    int32_t i = t->p.n_ops;
    tp_op(t, OP_LOGITS, B_LOGITS, B_XN);
    t->wts[i].N = 100, t->wts[i].K = 64;
}

/* cmocka setup / teardown: every test gets a fresh plan with the buffers above */
static int tp_setup(void **state)
{
    struct test_plan *t = malloc(sizeof(*t));
    if (!t)
        return -1;
    tp_init(t);
    *state = t;
    return 0;
}

static int tp_teardown(void **state)
{
    struct test_plan *t = *state;
    merge_layout_free(&t->m);
    plan_free(&t->p);
    free(t);
    return 0;
}

/* The layout of the plan built so far (merges on or off); t->m. */
static const struct merge_layout *make(struct test_plan *t, bool enabled)
{
    assert_false(t->p.failed);
    struct qwenrt_error err = {0};
    assert_int_equal(merge_layout_make(&t->p, t->wts, enabled, &t->m, &err), QWENRT_OK);
    return &t->m;
}

static void assert_plain(const struct merge_layout *m, int32_t b, int32_t width)
{
    assert_int_equal(m->own[b], b);
    assert_int_equal(m->off[b], 0);
    assert_int_equal(m->ld[b], width);
}

static void assert_view(const struct merge_layout *m, int32_t b, int32_t own, int32_t off, int32_t ld)
{
    assert_int_equal(m->own[b], own);
    assert_int_equal(m->off[b], off);
    assert_int_equal(m->ld[b], ld);
}

static void test_qkv_and_gate_up_merge(void **state)
{
    struct test_plan *t = *state;
    int32_t q0 = tp_qwen3_layer(t, 0), q1 = tp_qwen3_layer(t, 0);
    tp_logits(t);
    const struct merge_layout *m = make(t, true);
    for (int l = 0; l < 2; l++) {
        int32_t q = l ? q1 : q0;
        assert_int_equal(m->run[q], 3); /* q | k | v */
        assert_int_equal(m->run[q + 1], 0);
        assert_int_equal(m->run[q + 2], 0);
        assert_int_equal(m->run[q + 5], 1); /* o: its own input, into the residual */
        assert_int_equal(m->run[q + 8], 2); /* gate | up */
        assert_int_equal(m->run[q + 9], 0);
        assert_int_equal(m->run[q + 11], 1); /* down */
    }
    assert_view(m, B_Q, B_Q, 0, 64);
    assert_view(m, B_K, B_Q, 32, 64);
    assert_view(m, B_V, B_Q, 48, 64);
    assert_view(m, B_GATE, B_GATE, 0, 96);
    assert_view(m, B_UP, B_GATE, 48, 96);
    assert_plain(m, B_X, 64);
    assert_plain(m, B_TMP, 64);
    assert_plain(m, B_LOGITS, 100);
    assert_int_equal(m->run[t->p.n_ops - 1], 1);
    merge_layout_free(&t->m); /* teardown frees it again: a second free is a no-op */
    assert_null(t->m.run);
}

static void test_switched_off(void **state)
{
    struct test_plan *t = *state;
    tp_qwen3_layer(t, 0);
    const struct merge_layout *m = make(t, false);
    for (int32_t i = 0; i < t->p.n_ops; i++)
        assert_int_equal(m->run[i], 1);
    for (int32_t b = 0; b < N_BUFS; b++)
        assert_plain(m, b, t->p.bufs[b].width);
}

/* v's weights 256 bytes after k's: q | k merge, v stays alone */
static void test_weights_apart(void **state)
{
    struct test_plan *t = *state;
    int32_t q = tp_qwen3_layer(t, 256);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[q], 2);
    assert_int_equal(m->run[q + 1], 0);
    assert_int_equal(m->run[q + 2], 1);
    assert_view(m, B_K, B_Q, 32, 48);
    assert_plain(m, B_V, 16);
    assert_int_equal(m->run[q + 8], 2); /* gate | up unaffected */
}

/* another dtype or row size in the run stops it there */
static void test_dtype_and_row_size(void **state)
{
    struct test_plan *t = *state;
    int32_t q = tp_qwen3_layer(t, 0);
    t->wts[q + 1].dtype = QR_F16; /* k */
    t->wts[q + 9].row_bytes += 2; /* up: rows of another size (and its start still adjacent) */
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[q], 1);
    assert_int_equal(m->run[q + 1], 1); /* k | v would be F16 then BF16 */
    assert_int_equal(m->run[q + 2], 1);
    assert_int_equal(m->run[q + 8], 1);
    assert_plain(m, B_Q, 32);
    assert_plain(m, B_GATE, 48);
}

/* an add reading up (a flat reader) forbids views of gate and up; q | k | v still merge */
static void test_flat_reader(void **state)
{
    struct test_plan *t = *state;
    int32_t q = tp_qwen3_layer(t, 0);
    tp_op(t, OP_ADD, B_X, B_UP);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[q], 3);
    assert_int_equal(m->run[q + 8], 1);
    assert_int_equal(m->run[q + 9], 1);
    assert_plain(m, B_GATE, 48);
    assert_plain(m, B_UP, 48);
}

/* three products of xn where the last one goes into the residual: the first two merge */
static void test_residual_product_left_out(void **state)
{
    struct test_plan *t = *state;
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    tp_matmul(t, B_GATE, B_XN, 0);
    tp_matmul(t, B_UP, B_XN, 0);
    tp_matmul(t, B_TMP, B_XN, 0);
    tp_op(t, OP_ADD, B_X, B_TMP);
    tp_op(t, OP_SWIGLU, B_GATE, B_UP);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[1], 2);
    assert_int_equal(m->run[3], 1);
    assert_view(m, B_UP, B_GATE, 48, 96);
    assert_plain(m, B_TMP, 64);
}

/* layer 1 merges q | k | v; layer 2's weights allow only q | k, a layout the buffers cannot
 * also have: layer 2 runs its products alone over layer 1's views */
static void test_layers_disagree(void **state)
{
    struct test_plan *t = *state;
    int32_t q0 = tp_qwen3_layer(t, 0), q1 = tp_qwen3_layer(t, 512);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[q0], 3);
    assert_int_equal(m->run[q1], 1);
    assert_int_equal(m->run[q1 + 1], 1);
    assert_int_equal(m->run[q1 + 2], 1);
    assert_view(m, B_K, B_Q, 32, 64);
    assert_int_equal(m->run[q1 + 8], 2); /* gate | up agree in both layers */
}

/* a product narrower than its output buffer (or writing the logits) never merges */
static void test_widths_and_logits(void **state)
{
    struct test_plan *t = *state;
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    tp_matmul(t, B_GATE, B_XN, 0);
    tp_matmul(t, B_UP, B_XN, 0);
    tp_op(t, OP_SWIGLU, B_GATE, B_UP);
    t->wts[2].N = 40; /* up's rows fewer than its buffer's width (48) */
    tp_matmul(t, B_Z, B_XN, 0);
    tp_matmul(t, B_LOGITS, B_XN, 0);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[1], 1);
    assert_int_equal(m->run[2], 1);
    assert_int_equal(m->run[4], 1);
    assert_int_equal(m->run[5], 1);
    assert_plain(m, B_Z, 32);
    assert_plain(m, B_LOGITS, 100);
}

/* DeltaNet: qkv | z | beta | alpha into one product, read by the conv, the core and the gated
 * norm (all take strides) */
static void test_deltanet_in_projections(void **state)
{
    struct test_plan *t = *state;
    tp_op(t, OP_RMSNORM, B_XN, B_X);
    tp_matmul(t, B_QKV, B_XN, 0);
    tp_matmul(t, B_Z, B_XN, 0);
    tp_matmul(t, B_BETA, B_XN, 0);
    tp_matmul(t, B_ALPHA, B_XN, 0);
    tp_op(t, OP_GDN_CONV, B_QKV, -1);
    struct plan_op *core = tp_op(t, OP_GDN_CORE, B_O, B_QKV);
    core->in2 = B_BETA, core->in3 = B_ALPHA;
    tp_op(t, OP_GATED_RMSNORM, B_O, B_Z);
    tp_matmul(t, B_TMP, B_O, 0);
    tp_op(t, OP_ADD, B_X, B_TMP);
    const struct merge_layout *m = make(t, true);
    assert_int_equal(m->run[1], 4);
    assert_view(m, B_QKV, B_QKV, 0, 136);
    assert_view(m, B_Z, B_QKV, 96, 136);
    assert_view(m, B_BETA, B_QKV, 128, 136);
    assert_view(m, B_ALPHA, B_QKV, 132, 136);
    assert_plain(m, B_O, 32);
}

static void test_strided_kinds(void **state)
{
    (void)state;
    assert_true(merge_strided_kind(OP_MATMUL));
    assert_true(merge_strided_kind(OP_SWIGLU));
    assert_true(merge_strided_kind(OP_GDN_CORE));
    assert_false(merge_strided_kind(OP_ADD));
    assert_false(merge_strided_kind(OP_EMBED));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_qkv_and_gate_up_merge, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_switched_off, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_weights_apart, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_dtype_and_row_size, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_flat_reader, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_residual_product_left_out, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_layers_disagree, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_widths_and_logits, tp_setup, tp_teardown),
        cmocka_unit_test_setup_teardown(test_deltanet_in_projections, tp_setup, tp_teardown),
        cmocka_unit_test(test_strided_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
