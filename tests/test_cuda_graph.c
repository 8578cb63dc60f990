/*
 * test_cuda_graph.c — the decode graph's alternatives against its defaults (issue 6), on synth
 * models of the tiny presets, some widened to Qwen3-0.6B's and Qwen3.5-0.8B's widths: every
 * cuda_options switch of the decode program (gemvq, 8-bit x, the fused MLP and its row form,
 * gemv_smem and its shapes, the attention's forms: RoPE inside, pipelined, shared K/V, lanes,
 * staged, cluster-merged, with the o product; the DeltaNet step split per head, staged, wide;
 * early reads, L2 prefetch, launches ahead, knock-outs, the time line, the greedy graph steps,
 * the screened LM head)
 * decoding side by side with the form it replaces, and the megakernel against the graph on
 * real widths and quantised weights; Q4_0 and Q5_K_M files, whose matrices the CUDA backend
 * converts at load, against the CPU over the same weights. Needs a GPU (cuda_testutil.h).
 */
#include "cuda_testutil.h"

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

/* The greedy loop with the screened LM head (cuda_options.lm_screen, lm_screen.cu) against
 * the whole head and the argmax: both fixtures' synth models (Qwen3's also at the real width,
 * 1,024), BF16 and F32 heads, 40 tokens read back every 16 in graphs of 8 and single steps:
 * the same ids, the same top 5 after the first call (which asks for no logits), and the same
 * last logits bit for bit (the screened graphs leave the logits unwritten; the first read
 * fills them from the last hidden state with the plain step); then the
 * sampled loop (lm_screen 2), top_k 20 and 1, 20 tokens each: the same draws and last logits.
 * A Q4_K_M file's Q6_K head and a Q8_0 head are not screened. The screen
 * counts one pick per token and reads fewer than a quarter of the rows exactly; a session
 * without it has none, and a Q8_0 head (already 8-bit) takes none. */
static void check_screen_generate(const char *arch, enum export_type type, int32_t width, bool screened)
{
    struct qwenrt_error err = {0};
    char path[256];
    struct qwenrt_model *m = load_synth(arch, type, width, false, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.lm_screen = 2, off.lm_screen = 0; /* greedy and sampled */
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 96, &on, &off, &a, &b, arch);
    int32_t V = m->hp.n_vocab, ga[40], gb[40];
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    if (cuda_session_generate(a, 7, 0, 37, 16, ga, NULL, &err) || cuda_session_generate(b, 7, 0, 37, 16, gb, NULL, &err))
        fail_msg("%s generate: %s", arch, err.message);
    { /* no logits asked for: the screened loop's row is made when it is first read, here */
        int32_t ta[5], tb[5];
        float va[5], vb[5];
        if (cuda_session_top(a, 1.0f, 5, NULL, 0, ta, va, NULL, &err) ||
            cuda_session_top(b, 1.0f, 5, NULL, 0, tb, vb, NULL, &err))
            fail_msg("%s top: %s", arch, err.message);
        assert_memory_equal(ta, tb, sizeof(ta));
        assert_memory_equal(va, vb, sizeof(va));
    }
    { /* the screened pick timed alone (a measurement) changes nothing the loop reads next */
        double us = 0;
        assert_int_equal(cuda_session_lm_screen_time(a, 3, &us, &err), screened ? QWENRT_OK : QWENRT_ERR_INVALID_ARG);
        assert_true(screened ? us > 0 : us == 0);
        assert_int_equal(cuda_session_lm_screen_time(b, 3, &us, &err), QWENRT_ERR_INVALID_ARG);
    }
    if (cuda_session_generate(a, ga[36], 37, 3, 0, ga + 37, la, &err) ||
        cuda_session_generate(b, gb[36], 37, 3, 0, gb + 37, lb, &err))
        fail_msg("%s generate: %s", arch, err.message);
    assert_memory_equal(ga, gb, sizeof(ga));
    assert_memory_equal(la, lb, (size_t)V * 4);
    int64_t picks = 0, rows = 0;
    assert_int_equal(cuda_session_lm_screen(a, &picks, &rows), screened);
    if (screened) {
        assert_int_equal(picks, 43); /* 40 tokens and the 3 picks timed */
        assert_true(rows >= picks && rows < picks * V / 4);
    }
    /* sampled, top_k 20 (graphs of 8, then 4 single steps), and top_k 1 */
    struct cuda_sample_params sp = {0.8f, 0.95f, 0.0f, 20, 12345};
    int32_t sa[20], sb[20];
    for (int pass = 0; pass < 2; pass++) {
        if (cuda_session_generate_sampled(a, ga[39], 40 + 20 * pass, 20, &sp, sa, &err) ||
            cuda_session_generate_sampled(b, ga[39], 40 + 20 * pass, 20, &sp, sb, &err))
            fail_msg("%s sampled: %s", arch, err.message);
        assert_memory_equal(sa, sb, sizeof(sa));
        if (cuda_session_logits(a, la, &err) || cuda_session_logits(b, lb, &err))
            fail_msg("%s logits: %s", arch, err.message);
        assert_memory_equal(la, lb, (size_t)V * 4);
        sp.top_k = 1;
    }
    int64_t picks2 = 0;
    assert_int_equal(cuda_session_lm_screen(a, &picks2, &rows), screened);
    if (screened)
        assert_int_equal(picks2, 83); /* 40 greedy and 40 sampled tokens, and the 3 timed */
    printf("%s (type %d, width %d): 40 greedy tokens, the same ids and last logits with the screen (%.1f rows "
           "exactly a token)\n", arch, (int)type, (int)m->hp.n_embd, picks ? (double)rows / picks : 0.0);
    assert_false(cuda_session_lm_screen(b, &picks, &rows));
    assert_int_equal(picks, 0);
    free_synth_pair(a, b, m, path, la, lb);
}

static void test_lm_screen_generate(void **st)
{
    (void)st;
    /* the default screens the greedy and the sampled loop */
    struct cuda_options d = cuda_default_options();
    assert_int_equal(d.lm_screen, 2);
    check_screen_generate("qwen3-tiny", EXPORT_BF16, 0, true);
    check_screen_generate("qwen35-tiny", EXPORT_BF16, 0, true);
    check_screen_generate("qwen3-tiny", EXPORT_F32, 0, true);
    check_screen_generate("qwen3-tiny", EXPORT_BF16, 1024, true);
    check_screen_generate("qwen3-tiny", EXPORT_Q4_K_M, 1024, false); /* a Q6_K head: not screened */
    check_screen_generate("qwen3-tiny", EXPORT_Q8_0, 0, false);
}

/* A GPU with no room for the screen's 8-bit copy (another program holds all but 48 MB while the
 * first generation call would make it; the copy of 151,936 rows of 1,024 needs ~165 MB): the
 * plain head serves, with the same tokens and logits as a session without the screen, and the
 * session reports no screen; once the memory is back it stays without one (tried once). */
static void test_lm_screen_no_room(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct model_hparams hp;
    assert_int_equal(synth_preset("qwen3-tiny", &hp, &err), QWENRT_OK);
    hp.n_embd = 1024, hp.n_ff = 3072, hp.head_dim = hp.n_rot = 128, hp.n_head = 16, hp.n_head_kv = 8;
    hp.n_vocab = 151936; /* Qwen3-0.6B's head */
    char path[256];
    struct qwenrt_model *m = write_load_synth("qwen3-tiny", &hp, EXPORT_BF16, "-noroom", path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    off.lm_screen = 0;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 64, &on, &off, &a, &b, "no room");
    int32_t ga[24], gb[24], V = m->hp.n_vocab;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    struct cuda_memory_hold *hold = NULL;
    if (cuda_test_hold_memory((int64_t)48 << 20, &hold, &err))
        fail_msg("holding device memory: %s", err.message);
    qwenrt_status sa = cuda_session_generate(a, 7, 0, 16, 8, ga, NULL, &err);
    cuda_test_release_memory(hold);
    if (sa)
        fail_msg("generate with the GPU nearly full: %s", err.message);
    if (cuda_session_generate(a, ga[15], 16, 8, 0, ga + 16, la, &err) ||
        cuda_session_generate(b, 7, 0, 16, 8, gb, NULL, &err) ||
        cuda_session_generate(b, gb[15], 16, 8, 0, gb + 16, lb, &err))
        fail_msg("generate: %s", err.message);
    assert_memory_equal(ga, gb, sizeof(ga));
    assert_memory_equal(la, lb, (size_t)V * 4);
    int64_t picks = -1, rows = -1;
    assert_false(cuda_session_lm_screen(a, &picks, &rows));
    assert_int_equal(picks, 0);
    printf("lm_screen with 48 MB free: no copy, the plain head: 24 greedy tokens and the last logits as "
           "without the screen\n");
    free_synth_pair(a, b, m, path, la, lb);
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
    test_bind_f32_x(m);
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

/* Q4_0 and Q5_K_M files on the GPU: loaded for CUDA, their Q4_0 / Q5_K matrices are converted
 * (as Q8_0 exactly, as F16; quant/transcode.h), and the GPU's logits in the exact precision (a
 * prompt, then decode steps through the public API) stay within cuda_bench's exact gates
 * (Qwen3 1e-3, Qwen3.5 5e-2: its recurrence amplifies summation order) of the CPU's over the
 * same converted weights with x in f32. */
static void check_converted(const char *arch, enum export_type type, int32_t width, double tol)
{
    struct qwenrt_error err = {0};
    char path[256], what[96];
    qwenrt_model_free(load_synth(arch, type, width, true, path, sizeof(path)));
    snprintf(what, sizeof(what), "%s %s converted", arch, export_type_name(type));
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cuda";
    struct qwenrt_model *gm = NULL, *cm = NULL;
    if (qwenrt_model_load(path, &mp, &gm, &err) ||
        model_load_for(path, NULL, cuda_weight_dtype_supported, &cm, &err))
        fail_msg("%s: load: %s", what, err.message);
    test_bind_f32_x(cm);
    struct qwenrt_model_info info;
    qwenrt_model_get_info(gm, &info);
    assert_true(info.n_converted > 0);
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.precision = QWENRT_PRECISION_EXACT;
    struct qwenrt_session *g = NULL, *c = NULL;
    if (qwenrt_session_init(gm, &sp, &g, &err) || qwenrt_session_init(cm, &sp, &c, &err))
        fail_msg("%s: session: %s", what, err.message);
    enum { T = 9 };
    int32_t V = gm->hp.n_vocab, prompt[T] = {11, 250, 37, 998, 4, 61, 300, 7, 90};
    float *lg = malloc((size_t)T * V * sizeof(float)), *lc = malloc((size_t)T * V * sizeof(float));
    assert_int_equal(qwenrt_session_prefill(g, prompt, T, lg, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(c, prompt, T, lc, &err), QWENRT_OK);
    double e = rel_err(lg, lc, (size_t)T * V);
    printf("%s: %d matrices converted, prompt logits rel err %.3g (gate %.3g)\n", what, info.n_converted, e, tol);
    assert_true(e <= tol);
    for (int step = 0; step < 4; step++) {
        int32_t id = qwenrt_argmax(qwenrt_session_logits(c), V);
        assert_int_equal(qwenrt_session_decode(g, id, &err), QWENRT_OK);
        assert_int_equal(qwenrt_session_decode(c, id, &err), QWENRT_OK);
        e = rel_err(qwenrt_session_logits(g), qwenrt_session_logits(c), (size_t)V);
        if (!(e <= tol))
            fail_msg("%s: decode step %d: logits rel err %.3g (gate %.3g)", what, step, e, tol);
    }
    free(lg);
    free(lc);
    qwenrt_session_free(g);
    qwenrt_session_free(c);
    qwenrt_model_free(gm);
    qwenrt_model_free(cm);
    remove(path);
}

static void test_converted_weights(void **st)
{
    (void)st;
    check_converted("qwen3-tiny", EXPORT_Q4_0, 1024, 1e-3);
    check_converted("qwen3-tiny", EXPORT_Q5_K_M, 1024, 1e-3);
    check_converted("qwen35-tiny", EXPORT_Q4_0, 0, 5e-2);
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

/* Prefills of T tokens at pos0 on a (cuda_options.prefill_graph on) and b (off): the last
 * position's logits the same to 1e-6 with the same argmax (the same kernels in the same
 * order, so in practice the same bits). */
static void prefill_pair(struct cuda_session *a, struct cuda_session *b, int32_t V, int32_t T, int32_t pos0,
                         float *la, float *lb, const char *what)
{
    struct qwenrt_error err = {0};
    int32_t ids[160];
    assert_true(T <= 160);
    for (int32_t i = 0; i < T; i++)
        ids[i] = (int32_t)(((pos0 + i) * 7919 + 17) % V);
    if (cuda_session_run(a, ids, T, pos0, false, la, NULL, NULL, &err) ||
        cuda_session_run(b, ids, T, pos0, false, lb, NULL, NULL, &err))
        fail_msg("%s, %d tokens at %d: %s", what, (int)T, (int)pos0, err.message);
    double e = rel_err(la, lb, (size_t)V);
    printf("%s, %d tokens at %d: rel err %.3g%s\n", what, (int)T, (int)pos0, e,
           memcmp(la, lb, (size_t)V * 4) ? "" : " (the same bits)");
    if (!(e <= 1e-6))
        fail_msg("%s, %d tokens at %d: logits differ by %.3g", what, (int)T, (int)pos0, e);
    assert_int_equal(argmax_f(la, V), argmax_f(lb, V));
}

/* cuda_options.prefill_graph: prompts prefilled as one graph launch against the same
 * prompts outside a graph, at Qwen3-0.6B's / Qwen3.5-0.8B's widths (the fast prefill's
 * products, flash attention, the DeltaNet scan): a first prompt (every scratch buffer grown:
 * the capture thrown away and made again), a continuation, the first again after a reset
 * (updated in place), a longer one past the GEMV prompt length (the GEMMs; it may run outside
 * a graph, whose reason is printed), the two again after a reset (the longer one now in a
 * graph), then decode steps over what they left. */
static void check_prefill_graph(const char *arch, enum export_type type, int32_t width)
{
    char path[256], what[96];
    struct qwenrt_model *m = load_synth(arch, type, width, true, path, sizeof(path));
    struct cuda_options on = cuda_default_options(), off = on;
    on.mega = off.mega = CUDA_MEGA_OFF;
    on.prefill_graph = true, off.prefill_graph = false;
    struct cuda_session *a = NULL, *b = NULL;
    init_pair(m, 300, &on, &off, &a, &b, arch);
    int32_t V = m->hp.n_vocab, id = 5;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    snprintf(what, sizeof(what), "prefill graph, %s %s width %d", arch, export_type_name(type), (int)width);
    struct qwenrt_error err = {0};
    int64_t ca[3], before[3], cb[3];
    const char *why = NULL;
    for (int round = 0; round < 2; round++) {
        assert_int_equal(cuda_session_reset(a, &err), QWENRT_OK);
        assert_int_equal(cuda_session_reset(b, &err), QWENRT_OK);
        prefill_pair(a, b, V, 40, 0, la, lb, what);
        if (round == 0) {
            prefill_pair(a, b, V, 17, 40, la, lb, what);
            assert_int_equal(cuda_session_reset(a, &err), QWENRT_OK);
            assert_int_equal(cuda_session_reset(b, &err), QWENRT_OK);
            prefill_pair(a, b, V, 40, 0, la, lb, what);
        }
        cuda_session_prefill_graphs(a, before, NULL);
        prefill_pair(a, b, V, 150, 40, la, lb, what);
        cuda_session_prefill_graphs(a, ca, &why);
        printf("%s, round %d: %lld graphs made, %lld updated, %lld prefills outside a graph%s%s\n", what, round,
               (long long)ca[0], (long long)ca[1], (long long)ca[2], *why ? " (the last because: " : "",
               *why ? why : "");
        if (round == 0) { /* every prefill before the longer one in a graph, the same prompt updated */
            assert_int_equal(before[0] + before[1], 3);
            assert_int_equal(before[2], 0);
            assert_true(before[1] >= 1);
        } else { /* the longer one's second time: in a graph */
            assert_int_equal(ca[2], before[2]);
        }
    }
    cuda_session_prefill_graphs(b, cb, NULL);
    assert_int_equal(cb[0] + cb[1] + cb[2], 0);
    for (int32_t t = 0; t < 4; t++) { /* over the caches and states the two prefills left */
        if (cuda_session_run(a, &id, 1, 190 + t, false, la, NULL, NULL, &err) ||
            cuda_session_run(b, &id, 1, 190 + t, false, lb, NULL, NULL, &err))
            fail_msg("%s: decode: %s", what, err.message);
        if (!(rel_err(la, lb, (size_t)V) <= 1e-6))
            fail_msg("%s: decode step %d after the prefills: logits differ by %.3g", what, (int)t,
                     rel_err(la, lb, (size_t)V));
        id = argmax_f(lb, V);
    }
    free_synth_pair(a, b, m, path, la, lb);
}

/* cuda_options.stream: a session on a borrowed stream computes what one on its own computes,
 * and leaves the stream to its owner (a second session works on it after the first is freed). */
static void test_borrowed_stream(void **st)
{
    (void)st;
    char path[256];
    struct qwenrt_model *m = load_synth("qwen35-tiny", EXPORT_BF16, 256, true, path, sizeof(path));
    struct qwenrt_error err = {0};
    void *stream = NULL;
    if (cuda_bench_streams(1, &stream, &err))
        fail_msg("a stream: %s", err.message);
    struct cuda_options on = cuda_default_options(), off = on;
    on.stream = stream;
    int32_t V = m->hp.n_vocab;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    assert_non_null(la);
    assert_non_null(lb);
    for (int round = 0; round < 2; round++) { /* the second on the stream the first left */
        struct cuda_session *a = NULL, *b = NULL;
        init_pair(m, 64, &on, &off, &a, &b, "borrowed stream");
        prefill_pair(a, b, V, 20, 0, la, lb, "borrowed stream");
        int32_t id = argmax_f(lb, V);
        double worst = decode_pair(a, b, V, &id, la, lb, "borrowed stream");
        printf("borrowed stream, round %d: worst decode rel err %.3g\n", round, worst);
        if (!(worst <= 1e-6))
            fail_msg("borrowed stream, round %d: decode differs by %.3g", round, worst);
        cuda_session_free(a);
        cuda_session_free(b);
    }
    cuda_bench_streams_free(1, &stream);
    free(la);
    free(lb);
    qwenrt_model_free(m);
    remove(path);
}

static void test_prefill_graph(void **st)
{
    (void)st;
    check_prefill_graph("qwen3-tiny", EXPORT_BF16, 1024);
    check_prefill_graph("qwen35-tiny", EXPORT_BF16, 1024);
    check_prefill_graph("qwen3-tiny", EXPORT_Q4_K_M, 1024);
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

int main(void)
{
    if (!cuda_tests_device())
        return 77; /* ctest: skipped */
    const struct CMUnitTest tests[] = {
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
        cmocka_unit_test(test_prefill_graph),
        cmocka_unit_test(test_borrowed_stream),
        cmocka_unit_test(test_graph_gdn_split),
        cmocka_unit_test(test_megakernel_quantised),
        cmocka_unit_test(test_megakernel_real_width),
        cmocka_unit_test(test_int8_from_cpu_state),
        cmocka_unit_test(test_converted_weights),
        cmocka_unit_test(test_attention_rope_fused),
        cmocka_unit_test(test_attn_early),
        cmocka_unit_test(test_l2_prefetch),
        cmocka_unit_test(test_gdn_early),
        cmocka_unit_test(test_decode_timeline),
        cmocka_unit_test(test_qkv_attn),
        cmocka_unit_test(test_decode_omit_steps),
        cmocka_unit_test(test_generate_graph_steps),
        cmocka_unit_test(test_lm_screen_generate),
        cmocka_unit_test(test_lm_screen_no_room),
    };
    cuda_tests_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
