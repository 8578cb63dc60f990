/*
 * test_cuda_batch.c — the server's batched decode step on CUDA sessions (cuda_batch.cu,
 * issue 8) against each session decoding alone: GEMV and GEMM sizes, 8-bit x, its graph
 * (captured, replayed, updated when members change), the one-launch attention and DeltaNet
 * step for several sessions (with their key splits crossing part way), a failed step that
 * changes no session, and where batching pays (cuda_batch_pays). Needs a GPU
 * (cuda_testutil.h).
 */
#include "cuda_testutil.h"

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

int main(void)
{
    if (!cuda_tests_device())
        return 77; /* ctest: skipped */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_decode_cuda),
        cmocka_unit_test(test_batch_graph_cuda),
        cmocka_unit_test(test_batch_seq_cuda),
        cmocka_unit_test(test_batch_fail_kept_cuda),
        cmocka_unit_test(test_batch_pays),
        cmocka_unit_test(test_batch_int8_cuda),
        cmocka_unit_test(test_batch_int8_q35_cuda),
    };
    cuda_tests_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
