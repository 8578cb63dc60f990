/*
 * test_cuda_faults.c — every device and pinned allocation of a CUDA session failed in turn.
 *
 * A workload (two sessions of the Qwen3.5 BF16 fixture: init, a short prefill, the greedy loop
 * through the screened LM head, the logits read back, a top-k pick, the sampled loop, a snapshot
 * of the recurrent state, a second session's long prefill through the fast products and flash
 * attention, a batched step of both) runs once with its allocations counted
 * (cuda_options.allocs), then once for each of them with that one failed as out of memory. For
 * every failure:
 *   - the call that met it returns an error that says memory ran short (never a crash), or goes
 *     on without the piece where the session has a way round (the screen: the plain LM head,
 *     whose tokens the run must then give);
 *   - the workload then goes on as a caller would — a session that could not be made asked for
 *     again, otherwise the sessions reset and the calls made again from the prompt — and every
 *     call succeeds (a failure leaves no half-made buffer and no stale CUDA error behind), ending
 *     with the greedy tokens of the clean run;
 *   - once both sessions are freed, every allocation is gone: the count's live is 0 and the
 *     device's free memory is back where it was.
 * The same sweep runs over a Qwen3 session decoding through the megakernel (its tables). Modules
 * load eagerly (CUDA_MODULE_LOADING=EAGER) so that no kernel's first use moves the device's free
 * memory between runs. Needs a GPU (exit 77 without one).
 */
#include "cuda_testutil.h"

#define FAULT_CTX 96
#define FAULT_LONG 40 /* the second session's prompt: the fast prefill (T >= 16) */

/* What one workload run hands back. */
struct fault_run {
    int32_t greedy[8];  /* the greedy loop's tokens */
    int failures;       /* calls that failed (each then made again) */
    int absorbed;       /* runs whose failed allocation no call reported (the screen's) */
    char first_error[256];
};

/* A call of the workload: one step on sessions s[0], s[1]. */
typedef qwenrt_status (*fault_step)(const struct qwenrt_model *m, const struct cuda_options *o,
                                    struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err);

static const int32_t prompt[FAULT_LONG] = {1,  7,   42,  3,   99,  512, 8,   17, 300, 64,  5,   901, 33, 2,
                                           77, 640, 128, 256, 19,  4,   800, 23, 11,  701, 450, 6,   90, 91,
                                           92, 93,  94,  95,  96,  97,  98,  12, 13,  14,  15,  16};

static qwenrt_status step_init_a(const struct qwenrt_model *m, const struct cuda_options *o, struct cuda_session **s,
                                 struct fault_run *r, struct qwenrt_error *err)
{
    (void)r;
    return cuda_session_init(m->plans, FAULT_CTX, o, &s[0], err);
}

static qwenrt_status step_prefill_a(const struct qwenrt_model *m, const struct cuda_options *o,
                                    struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o, (void)r;
    return cuda_session_run(s[0], prompt, 5, 0, false, NULL, NULL, NULL, err);
}

static qwenrt_status step_greedy_a(const struct qwenrt_model *m, const struct cuda_options *o, struct cuda_session **s,
                                   struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o;
    return cuda_session_generate(s[0], prompt[5], 5, 8, 8, r->greedy, NULL, err); /* one 8-step graph */
}

static qwenrt_status step_logits_a(const struct qwenrt_model *m, const struct cuda_options *o,
                                   struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err)
{
    (void)o, (void)r;
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    assert_non_null(logits);
    qwenrt_status st = cuda_session_logits(s[0], logits, err);
    free(logits);
    return st;
}

static qwenrt_status step_top_a(const struct qwenrt_model *m, const struct cuda_options *o, struct cuda_session **s,
                                struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o, (void)r;
    int32_t ids[8];
    float vals[8];
    return cuda_session_top(s[0], 1.0f, 8, NULL, 0, ids, vals, NULL, err);
}

static qwenrt_status step_sampled_a(const struct qwenrt_model *m, const struct cuda_options *o,
                                    struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o, (void)r;
    struct cuda_sample_params sp = {0.8f, 0.95f, 0.0f, 20, 12345};
    int32_t out[4];
    return cuda_session_generate_sampled(s[0], prompt[6], 13, 4, &sp, out, err);
}

static qwenrt_status step_snapshot_a(const struct qwenrt_model *m, const struct cuda_options *o,
                                     struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o, (void)r;
    return cuda_session_snapshot(s[0], false, err);
}

static qwenrt_status step_init_b(const struct qwenrt_model *m, const struct cuda_options *o, struct cuda_session **s,
                                 struct fault_run *r, struct qwenrt_error *err)
{
    (void)r;
    return cuda_session_init(m->plans, FAULT_CTX, o, &s[1], err);
}

static qwenrt_status step_prefill_b(const struct qwenrt_model *m, const struct cuda_options *o,
                                    struct cuda_session **s, struct fault_run *r, struct qwenrt_error *err)
{
    (void)m, (void)o, (void)r;
    return cuda_session_run(s[1], prompt, FAULT_LONG, 0, false, NULL, NULL, NULL, err);
}

static qwenrt_status step_batch(const struct qwenrt_model *m, const struct cuda_options *o, struct cuda_session **s,
                                struct fault_run *r, struct qwenrt_error *err)
{
    (void)o, (void)r;
    const int32_t ids[2] = {prompt[20], prompt[21]}, pos[2] = {17, FAULT_LONG};
    float *logits = malloc(2 * (size_t)m->hp.n_vocab * sizeof(float));
    assert_non_null(logits);
    qwenrt_status st = cuda_batch_decode(s, ids, pos, 2, logits, err);
    free(logits);
    return st;
}

static const fault_step steps[] = {step_init_a,     step_prefill_a, step_greedy_a,  step_logits_a, step_top_a,
                                   step_sampled_a,  step_snapshot_a, step_init_b,   step_prefill_b, step_batch};
static const char *const step_names[] = {"init A",    "prefill A",  "greedy A", "logits A",  "top A",
                                         "sampled A", "snapshot A", "init B",   "prefill B", "batch"};

#define ALL_STEPS (sizeof(steps) / sizeof(steps[0]))

/* The fixture at dir loaded for its plans (the sessions upload weights of their own). */
static struct qwenrt_model *load_plans(const char *dir)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cpu";
    if (qwenrt_model_load(dir, &mp, &m, &err))
        fail_msg("load %s: %s", dir, err.message);
    return m;
}

/* The workload's first n_steps calls with options o (o->allocs counts, and fails one). Each
 * failed call must say it ran out of memory, and the workload must then go on to the end; the
 * sessions are freed. */
static void run_workload(const struct qwenrt_model *m, const struct cuda_options *o, size_t n_steps,
                         struct fault_run *r)
{
    struct cuda_session *s[2] = {NULL, NULL};
    memset(r, 0, sizeof(*r));
    for (size_t i = 0; i < n_steps; i++) {
        struct qwenrt_error err = {0};
        qwenrt_status st = steps[i](m, o, s, r, &err);
        if (st == QWENRT_OK)
            continue;
        r->failures++;
        if (!r->first_error[0])
            snprintf(r->first_error, sizeof(r->first_error), "%s: %.200s", step_names[i], err.message);
        if (!strstr(err.message, "memory"))
            fail_msg("allocation %lld of %s failed as \"%s\", which does not say memory ran short",
                     (long long)o->allocs->fail_at, step_names[i], err.message);
        if ((steps[i] == step_init_a && s[0]) || (steps[i] == step_init_b && s[1]))
            fail_msg("%s failed (\"%s\") and still handed back a session", step_names[i], err.message);
        /* as a caller goes on: a session that was not made is asked for again; otherwise the
         * sessions' state is reset and the calls are made again from the prompt (a failed call may
         * have advanced part of the recurrent state) */
        struct qwenrt_error again = {0};
        if (steps[i] == step_init_a || steps[i] == step_init_b) {
            if (steps[i](m, o, s, r, &again))
                fail_msg("allocation %lld: %s failed (\"%s\"), and again when asked again: \"%s\"",
                         (long long)o->allocs->fail_at, step_names[i], err.message, again.message);
            continue;
        }
        for (int j = 0; j < 2; j++)
            if (s[j] && cuda_session_reset(s[j], &again))
                fail_msg("allocation %lld: the reset after %s failed: %s", (long long)o->allocs->fail_at, step_names[i],
                         again.message);
        for (size_t j = 1; j <= i; j++)
            if (steps[j] != step_init_b && steps[j](m, o, s, r, &again))
                fail_msg("allocation %lld: %s failed (\"%s\"), then %s when made again: \"%s\"",
                         (long long)o->allocs->fail_at, step_names[i], err.message, step_names[j], again.message);
    }
    cuda_session_free(s[1]);
    cuda_session_free(s[0]);
}

/* The sweep: the workload's first n_steps calls on the fixture at dir with options o, once clean
 * (and once with the plain LM head, for the tokens of a run whose screen failed), then once for
 * each allocation with that one failed. */
static void sweep_allocations(const char *dir, struct cuda_options o, size_t n_steps)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = load_plans(dir);
    struct cuda_alloc_count count = {0};
    o.allocs = &count;
    /* warm-ups: the plain head's and the screen's paths (the context, cuBLASLt's first handle) */
    struct fault_run clean, plain, r;
    struct cuda_options o_plain = o;
    o_plain.lm_screen = 0;
    run_workload(m, &o_plain, n_steps, &plain);
    memset(&count, 0, sizeof(count));
    run_workload(m, &o, n_steps, &clean);
    assert_int_equal(clean.failures, 0);
    assert_int_equal(count.live, 0);
    const int64_t total = count.made;
    assert_true(total >= 10); /* a session's buffers alone are more than a handful */
    if (memcmp(plain.greedy, clean.greedy, sizeof(clean.greedy))) /* a near tie rounded apart */
        printf("note: the plain LM head's greedy tokens differ from the screened head's\n");
    int64_t free0 = 0, free1 = 0, dev_total = 0;
    assert_int_equal(cuda_device_memory(&free0, &dev_total, &err), QWENRT_OK);
    int absorbed = 0;
    for (int64_t k = 1; k <= total; k++) {
        memset(&count, 0, sizeof(count));
        count.fail_at = k;
        run_workload(m, &o, n_steps, &r);
        if (count.made < k)
            fail_msg("%s: allocation %lld of %lld was never asked for: the workload's allocations vary from run to run",
                     dir, (long long)k, (long long)total);
        if (count.live != 0)
            fail_msg("%s: allocation %lld failed (\"%s\"): %lld allocations left behind after the sessions were freed",
                     dir, (long long)k, r.first_error, (long long)count.live);
        assert_int_equal(cuda_device_memory(&free1, &dev_total, &err), QWENRT_OK);
        if (free1 != free0)
            fail_msg("%s: allocation %lld failed (\"%s\"): the device has %lld bytes less free than before", dir,
                     (long long)k, r.first_error, (long long)(free0 - free1));
        /* a failure no call reported was the screen's: the plain head picked the tokens */
        const struct fault_run *same = r.failures ? &clean : &plain;
        if (memcmp(r.greedy, same->greedy, sizeof(same->greedy)))
            fail_msg("%s: allocation %lld failed (\"%s\"): the greedy tokens differ from the clean run's", dir,
                     (long long)k, r.failures ? r.first_error : "absorbed");
        absorbed += r.failures == 0;
    }
    printf("%s, %zu calls: %lld allocations failed in turn, %lld reported and made again, %d absorbed (the screen's)\n",
           dir, n_steps, (long long)total, (long long)total - absorbed, absorbed);
    assert_true(absorbed < total / 4); /* most failures are the caller's to see */
    qwenrt_model_free(m);
}

/* The whole workload: two Qwen3.5 sessions, the graphs, the screen, the fast prefill, a batch. */
static void test_every_allocation_fails_cleanly(void **state)
{
    (void)state;
    sweep_allocations("tests/data/qwen35-tiny-bf16", cuda_default_options(), ALL_STEPS);
}

/* The same with each prefill captured into a graph (cuda_options.prefill_graph): the scratch
 * that a capture notes and scratch_apply then grows. */
static void test_prefill_graph_allocations_fail_cleanly(void **state)
{
    (void)state;
    struct cuda_options o = cuda_default_options();
    o.prefill_graph = true;
    sweep_allocations("tests/data/qwen35-tiny-bf16", o, ALL_STEPS);
}

/* The megakernel's tables (a Qwen3 session decoding through it: init, prefill, the greedy loop). */
static void test_megakernel_allocations_fail_cleanly(void **state)
{
    (void)state;
    struct cuda_options o = cuda_default_options();
    o.mega = CUDA_MEGA_ON;
    o.kv_f16 = false; /* the megakernel reads an f32 cache */
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = load_plans("tests/data/qwen3-tiny-bf16");
    struct cuda_session *cs = NULL;
    const char *why = NULL;
    if (cuda_session_init(m->plans, FAULT_CTX, &o, &cs, &err))
        fail_msg("qwen3-tiny-bf16: %s", err.message);
    if (!cuda_session_uses_megakernel(cs, &why))
        fail_msg("the megakernel does not take qwen3-tiny-bf16: %s", why ? why : "(no reason)");
    cuda_session_free(cs);
    qwenrt_model_free(m);
    sweep_allocations("tests/data/qwen3-tiny-bf16", o, 3);
}

/* A session's own count without faults: everything it allocates it frees, whichever calls ran
 * (a session freed right after init, after a prefill, after the sampled loop). */
static void test_counts_balance(void **state)
{
    (void)state;
    struct qwenrt_error err = {0};
    struct qwenrt_model *m = load_plans("tests/data/qwen3-tiny-bf16");
    struct cuda_alloc_count count = {0};
    struct cuda_options o = cuda_default_options();
    o.allocs = &count;
    struct fault_run r = {0};
    for (int upto = 1; upto <= 6; upto++) {
        struct cuda_session *s[2] = {NULL, NULL};
        memset(&count, 0, sizeof(count));
        for (int i = 0; i < upto; i++)
            if (steps[i](m, &o, s, &r, &err))
                fail_msg("%s: %s", step_names[i], err.message);
        assert_true(count.live > 0 && count.live <= count.made);
        cuda_session_free(s[0]);
        if (count.live != 0)
            fail_msg("freed after %s: %lld of %lld allocations left", step_names[upto - 1], (long long)count.live,
                     (long long)count.made);
    }
    qwenrt_model_free(m);
}

int main(void)
{
    setenv("CUDA_MODULE_LOADING", "EAGER", 1); /* before the first CUDA call */
    if (!cuda_tests_device())
        return 77; /* ctest: skipped */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_balance),
        cmocka_unit_test(test_every_allocation_fails_cleanly),
        cmocka_unit_test(test_prefill_graph_allocations_fail_cleanly),
        cmocka_unit_test(test_megakernel_allocations_fail_cleanly),
    };
    cuda_tests_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
