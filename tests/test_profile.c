/*
 * test_profile.c — runtime profiles (src/runtime/profile*.c, issue 7): extends chains and
 * cycles, merge rules (objects deep-merge, null resets, arrays and scalars replace), every
 * validation error with its message, intent gating, executionPatch binding (unknown key, set
 * matching nothing, kernel of another op, locked vs capability-aware remap), cudaTuning (the CUDA
 * decode's shapes: parsed, merged, every bad value refused by name), and seed 000 (the
 * Doppler profile, copied from ../shared/seeds into tests/data/seeds) bound to a Qwen3.5 model.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "base/cpu_features.h"
#include "model/model.h"
#include "runtime/profile.h"

static char dir[64];

#define META(id, intent, compat)                                                                   \
    "\"id\": \"" id "\", \"name\": \"" id "\", \"owner\": \"t\", \"intent\": \"" intent "\", "     \
    "\"compatibleIntents\": " compat ", \"stability\": \"experimental\", "                         \
    "\"createdAtUtc\": \"2026-01-02T03:04:05Z\""

static void put(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.json", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/qwenrt_profile_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    put("default", "{" META("profiles/default", "investigate",
                            "[\"verify\", \"investigate\", \"calibrate\"]") ", \"runtime\": {}}");
    put("base",
        "{" META(
            "base", "calibrate",
            "[\"calibrate\"]") ", \"extends\": \"profiles/default\", "
                               "\"runtime\": {\"inference\": {\"batching\": {\"batchSize\": 4, \"readbackInterval\": 2}, "
                               "\"session\": {\"decodeLoop\": {\"batchSize\": 4, \"ringStaging\": 3}}, "
                               "\"list\": [1, 2, 3], \"keep\": \"base\", \"drop\": {\"x\": 1}}}}");
    put("child",
        "{" META(
            "child", "calibrate",
            "[\"calibrate\", \"verify\"]") ", \"extends\": [\"base\"], "
                                           "\"runtime\": {\"inference\": {\"batching\": {\"batchSize\": 8}, \"list\": [9], "
                                           "\"drop\": null, \"session\": {\"decodeLoop\": {\"readbackMode\": \"overlapped\"}}}}}");
    put("cyc_a", "{" META("cyc_a", "verify", "[\"verify\"]") ", \"extends\": \"cyc_b\"}");
    put("cyc_b",
        "{" META("cyc_b", "verify", "[\"verify\"]") ", \"extends\": [\"default\", \"cyc_a\"]}");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

static struct profile *load_ok(const char *id)
{
    struct profile *p = NULL;
    struct qwenrt_error err = {0};
    if (profile_load(id, dir, &p, &err))
        fail_msg("profile_load(%s): %s", id, err.message);
    return p;
}

static void load_fails(const char *name, const char *text, const char *expect)
{
    put(name, text);
    struct profile *p = NULL;
    struct qwenrt_error err = {0};
    if (!profile_load(name, dir, &p, &err))
        fail_msg("profile '%s' loaded, expected an error containing '%s'", name, expect);
    if (!strstr(err.message, expect))
        fail_msg("profile '%s': expected '%s' in: %s", name, expect, err.message);
    assert_null(p);
}

static void test_extends_chain_and_merge(void **state)
{
    (void)state;
    struct profile *p = load_ok("child");
    assert_int_equal(p->n_chain, 3);
    assert_string_equal(p->chain[0], "profiles/default");
    assert_string_equal(p->chain[1], "base");
    assert_string_equal(p->chain[2], "child");
    json_t *inf = json_object_get(json_object_get(p->doc, "runtime"), "inference");
    json_t *bat = json_object_get(inf, "batching");
    /* objects deep-merge: child's batchSize replaces, base's readbackInterval stays */
    assert_int_equal(json_integer_value(json_object_get(bat, "batchSize")), 8);
    assert_int_equal(json_integer_value(json_object_get(bat, "readbackInterval")), 2);
    /* arrays replace, scalars kept from the base, null removes */
    assert_int_equal(json_array_size(json_object_get(inf, "list")), 1);
    assert_string_equal(json_string_value(json_object_get(inf, "keep")), "base");
    assert_null(json_object_get(inf, "drop"));
    /* the child's metadata wins */
    assert_string_equal(json_string_value(json_object_get(p->doc, "id")), "child");
    assert_int_equal(p->compatible, PROFILE_INTENT_CALIBRATE | PROFILE_INTENT_VERIFY);
    /* decodeLoop merged: overlapped with ringStaging 3 from the base is valid */
    assert_string_equal(p->decode.readback_mode, "overlapped");
    assert_int_equal(p->decode.ring_staging, 3);
    assert_int_equal(strlen(p->sha256), 64);
    profile_free(p);
}

static void test_merge_function(void **state)
{
    (void)state;
    json_t *base =
        json_loads("{\"a\": {\"b\": 1, \"c\": [1, 2]}, \"d\": 5, \"e\": {\"f\": 1}}", 0, NULL);
    json_t *over = json_loads("{\"a\": {\"c\": [3], \"g\": true}, \"d\": null, \"e\": 7}", 0, NULL);
    json_t *w = json_array();
    json_t *m = profile_merge(base, over, "", w);
    json_t *want = json_loads("{\"a\": {\"b\": 1, \"c\": [3], \"g\": true}, \"e\": 7}", 0, NULL);
    assert_true(json_equal(m, want));
    assert_int_equal(json_array_size(w), 1); /* e: object -> integer is a type change */
    json_decref(base);
    json_decref(over);
    json_decref(w);
    json_decref(m);
    json_decref(want);
}

static void test_cycle_refused(void **state)
{
    (void)state;
    struct profile *p = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(profile_load("cyc_a", dir, &p, &err), QWENRT_ERR_FORMAT);
    assert_non_null(strstr(err.message, "extends cycle: cyc_a -> cyc_b -> cyc_a"));
    assert_int_equal(profile_load("missing_profile", dir, &p, &err), QWENRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "'missing_profile' not found"));
}

static void test_metadata_errors(void **state)
{
    (void)state;
    load_fails("m1", "{\"id\": \"m1\", \"name\": \"m1\", \"intent\": \"verify\"}",
               "missing required field 'owner'");
    load_fails("m2", "{" META("m2", "benchmark", "[\"verify\"]") "}",
               "intent 'benchmark' is not one of");
    load_fails("m3", "{" META("m3", "verify", "[\"calibrate\"]") "}",
               "must contain the intent 'verify'");
    load_fails("m4", "{" META("m4", "verify", "[\"verify\", \"verify\"]") "}",
               "lists 'verify' twice");
    load_fails("m5", "{" META("m5", "verify", "[]") "}",
               "compatibleIntents must be a non-empty array");
    load_fails(
        "m6",
        "{\"id\": \"m6\", \"name\": \"m\", \"owner\": \"o\", \"intent\": \"verify\", "
        "\"compatibleIntents\": [\"verify\"], \"stability\": \"stable\", \"createdAtUtc\": \"2026-01-01T00:00:00Z\"}",
        "stability 'stable' is not one of");
    load_fails(
        "m7",
        "{\"id\": \"m7\", \"name\": \"m\", \"owner\": \"o\", \"intent\": \"verify\", "
        "\"compatibleIntents\": [\"verify\"], \"stability\": \"canonical\", \"createdAtUtc\": \"yesterday\"}",
        "createdAtUtc 'yesterday' is not an ISO-8601 time");
    load_fails("m8", "{" META("m8", "verify", "[\"verify\"]") ", \"extends\": 3}",
               "extends must be a profile id");
    load_fails("m9", "[1]", "a profile must be a JSON object");
    load_fails("m10", "{\"id\": ", "m10.json:1");
}

static void test_runtime_errors(void **state)
{
    (void)state;
#define RT(name, rt)                                                                               \
    "{" META(name, "verify", "[\"verify\"]") ", \"runtime\": {\"inference\": " rt "}}"
    load_fails("r1", RT("r1", "{\"executionPatch\": {\"layers\": []}}"),
               "executionPatch.layers is not supported yet");
    load_fails(
        "r2",
        RT("r2",
           "{\"executionPatch\": {\"addKernels\": [{\"key\": \"k\", \"kernel\": {\"kernel\": \"a.wgsl\", \"entry\": \"main\", \"digest\": \"sha256:12\"}}]}}"),
        "digest must be \"sha256:<64 hex digits>\"");
    load_fails(
        "r3",
        RT("r3",
           "{\"executionPatch\": {\"addKernels\": ["
           "{\"key\": \"k\", \"kernel\": {\"kernel\": \"a\", \"entry\": \"m\", \"digest\": \"sha256:"
           "0000000000000000000000000000000000000000000000000000000000000000\"}},"
           "{\"key\": \"k\", \"kernel\": {\"kernel\": \"a\", \"entry\": \"m\", \"digest\": \"sha256:"
           "0000000000000000000000000000000000000000000000000000000000000000\"}}]}}"),
        "key 'k' already exists");
    load_fails(
        "r4",
        RT("r4", "{\"executionPatch\": {\"set\": [{\"op\": \"matmul\", \"weights\": \"x\"}]}}"),
        "'weights' rewrites are not supported");
    load_fails(
        "r5",
        RT("r5",
           "{\"executionPatch\": {\"set\": [{\"op\": \"matmul\", \"kernelKey\": \"k\", \"section\": \"middle\"}]}}"),
        "section 'middle' is not one of");
    load_fails("r6", RT("r6", "{\"executionPatch\": {\"set\": [{\"kernelKey\": \"k\"}]}}"),
               "missing 'op'");
    load_fails("r7",
               RT("r7", "{\"batching\": {\"readbackMode\": \"overlapped\", \"ringStaging\": 1}}"),
               "'overlapped' needs ringStaging >= 2 (it is 1)");
    load_fails("r8", RT("r8", "{\"session\": {\"decodeLoop\": {\"readbackMode\": \"auto\"}}}"),
               "'auto' needs submitLatencyThresholdMs");
    load_fails("r9", RT("r9", "{\"batching\": {\"batchSize\": 0}}"),
               "batching.batchSize must be an integer >= 1");
    load_fails("r10", RT("r10", "{\"kernelPathPolicy\": {\"mode\": \"loose\"}}"),
               "mode 'loose' is not one of");
    load_fails(
        "r11",
        RT("r11",
           "{\"kernelPathPolicy\": {\"sourceScope\": [\"model\"], \"allowSources\": [\"config\"]}}"),
        "sourceScope and allowSources differ");
    load_fails("r12", RT("r12", "{\"batching\": {\"stopCheckMode\": \"never\"}}"),
               "stopCheckMode 'never'");
    /* runtime.inference.cudaTuning: the object, its keys, every key's values */
    static const struct {
        const char *name, *text, *expect;
    } cuda_bad[] = {
        {"r13", RT("r13", "{\"cudaTuning\": [8]}"),
         "cudaTuning must be an object"},
        {"r14", RT("r14", "{\"cudaTuning\": {\"gemvSmemWarp\": 8}}"),
         "cudaTuning.gemvSmemWarp is not a CUDA tuning key"},
        {"r15", RT("r15", "{\"cudaTuning\": {\"gemvSmemWarps\": 12}}"),
         "cudaTuning.gemvSmemWarps must be one of 0, 1, 2, 4, 8, 16"},
        {"r16", RT("r16", "{\"cudaTuning\": {\"gemvSmemKb\": 300}}"),
         "cudaTuning.gemvSmemKb must be one of 0 or 16 to 226"},
        {"r17", RT("r17", "{\"cudaTuning\": {\"gemvqRows\": \"2\"}}"),
         "cudaTuning.gemvqRows must be one of 0, 1, 2, 4"},
        {"r18", RT("r18", "{\"cudaTuning\": {\"gemvSmemLaunch\": \"early\"}}"),
         "cudaTuning.gemvSmemLaunch must be one of auto, before-wait, after-wait"},
        {"r19", RT("r19", "{\"cudaTuning\": {\"pdl\": 1}}"),
         "cudaTuning.pdl must be true or false"},
        {"r20", RT("r20", "{\"cudaTuning\": {\"attnSplitMin\": 8}}"),
         "cudaTuning.attnSplitMin must be one of 0 or 16 to 4096"},
        {"r21", RT("r21", "{\"cudaTuning\": {\"gemvqWarps\": 16}}"),
         "cudaTuning.gemvqWarps must be one of 0, 4, 8"},
        {"r22", RT("r22", "{\"cudaTuning\": {\"gemvqSmemKb\": 201}}"),
         "cudaTuning.gemvqSmemKb must be one of 0 or 1 to 200"},
        {"r23", RT("r23", "{\"cudaTuning\": {\"attnCluster\": \"sometimes\"}}"),
         "cudaTuning.attnCluster must be one of never, auto, always, window"},
        {"r24", RT("r24", "{\"cudaTuning\": {\"attnCluster\": 2}}"),
         "cudaTuning.attnCluster must be one of never, auto, always, window"},
        {"r25", RT("r25", "{\"cudaTuning\": {\"attnClusterFrom\": -5}}"),
         "cudaTuning.attnClusterFrom must be one of 0 or 1 to 4194304"},
        {"r26", RT("r26", "{\"cudaTuning\": {\"attnClusterUntil\": 4194305}}"),
         "cudaTuning.attnClusterUntil must be one of 0 or 1 to 4194304"},
        {"r27", RT("r27", "{\"cudaTuning\": {\"attnClusterFrom\": 1024, \"attnClusterUntil\": 512}}"),
         "cudaTuning.attnClusterUntil (512) must be after attnClusterFrom (1024)"},
    };
    for (size_t i = 0; i < sizeof(cuda_bad) / sizeof(cuda_bad[0]); i++)
        load_fails(cuda_bad[i].name, cuda_bad[i].text, cuda_bad[i].expect);
#undef RT
}

/* runtime.inference.cudaTuning: parsed into struct model_cuda_tuning, merged through extends
 * like any object (the child's keys over the base's), absent keys left at 0 (the session's
 * own picks). */
static void test_cuda_tuning(void **state)
{
    (void)state;
    put("cuda_base", "{" META("cuda_base", "calibrate", "[\"calibrate\", \"investigate\"]") ", "
                     "\"runtime\": {\"inference\": {\"cudaTuning\": {\"gemvSmemWarps\": 16, "
                     "\"gemvSmemKb\": 200, \"gemvSmemLaunch\": \"before-wait\", \"attnSplitMin\": 128, "
                     "\"attnCluster\": \"window\", \"attnClusterFrom\": 384, \"attnClusterUntil\": 3072}}}}");
    put("cuda_child", "{" META("cuda_child", "calibrate", "[\"calibrate\"]") ", \"extends\": \"cuda_base\", "
                      "\"runtime\": {\"inference\": {\"cudaTuning\": {\"gemvSmemKb\": 160, "
                      "\"gemvqRows\": 4, \"gemvqLaunch\": \"after-wait\", \"gemvqWarps\": 8, "
                      "\"gemvqSmemKb\": 100, \"pdl\": true}}}}");
    struct profile *p = load_ok("cuda_child");
    assert_true(p->cuda_given);
    assert_int_equal(p->cuda.gemv_smem_warps, 16);
    assert_int_equal(p->cuda.gemv_smem_kb, 160);
    assert_int_equal(p->cuda.gemv_smem_launch, 1);
    assert_int_equal(p->cuda.gemvq_rows, 4);
    assert_int_equal(p->cuda.gemvq_launch, 2);
    assert_int_equal(p->cuda.gemvq_warps, 8);
    assert_int_equal(p->cuda.gemvq_smem_kb, 100);
    assert_true(p->cuda.pdl);
    assert_int_equal(p->cuda.attn_split_min, 128);
    assert_int_equal(p->cuda.attn_cluster, 2);
    assert_int_equal(p->cuda.attn_cluster_from, 384);
    assert_int_equal(p->cuda.attn_cluster_until, 3072);
    profile_free(p);
    p = load_ok("default"); /* none: every choice the session's */
    assert_false(p->cuda_given);
    assert_int_equal(p->cuda.gemv_smem_warps + p->cuda.gemv_smem_kb + p->cuda.gemvq_rows + p->cuda.attn_split_min, 0);
    assert_int_equal(p->cuda.attn_cluster | p->cuda.attn_cluster_from | p->cuda.attn_cluster_until, 0);
    assert_false(p->cuda.pdl);
    profile_free(p);
}

static void test_intent_gating(void **state)
{
    (void)state;
    struct profile *p = load_ok("base"); /* calibrate only */
    struct qwenrt_error err = {0};
    assert_int_equal(profile_check_intent(p, "bench", PROFILE_INTENT_CALIBRATE, &err), QWENRT_OK);
    assert_int_equal(profile_check_intent(p, "validate", PROFILE_INTENT_VERIFY, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(
        err.message,
        "profile 'base' is not compatible with 'validate' (intent verify): its compatibleIntents are [calibrate]"));
    profile_free(p);
}

/* Binds profile text to a model's plans; returns the status, err filled. */
static qwenrt_status bind_text(const char *name, const char *inference, const char *model,
                               struct profile_binding *b, struct qwenrt_model **m,
                               struct qwenrt_error *err)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "{\"id\": \"%s\", \"name\": \"n\", \"owner\": \"o\", \"intent\": \"verify\", "
             "\"compatibleIntents\": [\"verify\"], \"stability\": \"experimental\", "
             "\"createdAtUtc\": \"2026-01-01T00:00:00Z\", \"runtime\": {\"inference\": %s}}",
             name, inference);
    put(name, text);
    struct profile *p = load_ok(name);
    if (qwenrt_model_load(model, NULL, m, err))
        fail_msg("%s", err->message);
    qwenrt_status st = profile_bind(p, (*m)->plans, cpu_features_detect(), b, err);
    profile_free(p);
    return st;
}

static void test_binding_errors_and_remap(void **state)
{
    (void)state;
    struct profile_binding b;
    struct qwenrt_model *m = NULL;
    struct qwenrt_error err = {0};
    const char *q3 = "tests/data/qwen3-tiny-f32";

    assert_int_equal(
        bind_text(
            "b1",
            "{\"executionPatch\": {\"set\": [{\"op\": \"attention\", \"kernelKey\": \"attention.magic\"}]}}",
            q3, &b, &m, &err),
        QWENRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "unknown kernel key 'attention.magic'"));
    qwenrt_model_free(m);

    assert_int_equal(
        bind_text(
            "b2",
            "{\"executionPatch\": {\"set\": [{\"op\": \"gdn_core\", \"kernelKey\": \"gdn_core.ref\"}]}}",
            q3, &b, &m, &err),
        QWENRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "(section any, op 'gdn_core') matches no op of the plan"));
    qwenrt_model_free(m);

    assert_int_equal(
        bind_text(
            "b3",
            "{\"executionPatch\": {\"set\": [{\"op\": \"attention\", \"kernelKey\": \"rmsnorm.ref\"}]}}",
            q3, &b, &m, &err),
        QWENRT_ERR_INVALID_ARG);
    assert_non_null(
        strstr(err.message, "is a kernel of op rmsnorm, it cannot bind op 'attention'"));
    qwenrt_model_free(m);

    /* an f16 matmul on f32 weights: locked fails, capability-aware remaps */
    assert_int_equal(
        bind_text(
            "b4",
            "{\"executionPatch\": {\"set\": [{\"op\": \"matmul\", \"kernelKey\": \"matmul.f16.portable\"}]}}",
            q3, &b, &m, &err),
        QWENRT_ERR_UNSUPPORTED);
    assert_non_null(
        strstr(err.message, "matmul.f16.portable is for f16 weights, this op's weight is f32"));
    assert_non_null(strstr(err.message, "kernelPathPolicy locked"));
    qwenrt_model_free(m);
    assert_int_equal(
        bind_text(
            "b5",
            "{\"executionPatch\": {\"set\": [{\"op\": \"matmul\", \"kernelKey\": \"matmul.f16.portable\"}, "
            "{\"section\": \"decode\", \"op\": \"matmul\", \"kernelKey\": \"matmul.f32.portable\"}]}, "
            "\"kernelPathPolicy\": {\"mode\": \"capability-aware\", \"onIncompatible\": \"remap\"}}",
            q3, &b, &m, &err),
        QWENRT_OK);
    int32_t q = 0; /* layer 0's q matmul */
    while (m->plans[PHASE_DECODE].ops[q].kind != OP_MATMUL)
        q++;
    assert_true(b.ops[PHASE_PREFILL][q].remapped);
    assert_false(b.ops[PHASE_DECODE][q].remapped);
    assert_string_equal(b.ops[PHASE_DECODE][q].key, "matmul.f32.portable");
    assert_int_equal(json_array_size(b.remaps), 1);
    assert_non_null(strstr(json_string_value(json_array_get(b.remaps, 0)),
                           "prefill matmul (21 ops, layers 0,1,2): matmul.f16.portable ->"));
    /* applying writes keys into the plans, which sessions bind */
    profile_apply(&b, m->plans);
    assert_string_equal(m->plans[PHASE_DECODE].ops[q].kernel, "matmul.f32.portable");
    profile_binding_free(&b);
    qwenrt_model_free(m);
}

static void test_seed_000(void **state)
{
    (void)state;
    const char *seed = "tests/data/seeds/000_952e095aa0e655ba.txt"; /* copy of ../shared/seeds */
    struct profile *p = NULL;
    struct qwenrt_error err = {0};
    if (profile_load(seed, "profiles", &p, &err))
        fail_msg("seed 000: %s", err.message);
    assert_int_equal(p->n_chain, 3); /* profiles/default -> profiles/throughput -> seed */
    assert_string_equal(p->chain[1], "profiles/throughput");
    assert_true(p->capability_aware && p->remap && p->remap_in_scope);
    assert_int_equal(p->decode.batch_size, 8);
    assert_int_equal(p->decode.max_batch_decode_tokens, 128);
    assert_int_equal(profile_check_intent(p, "validate", PROFILE_INTENT_VERIFY, &err),
                     QWENRT_ERR_INVALID_ARG);
    assert_int_equal(profile_check_intent(p, "bench", PROFILE_INTENT_CALIBRATE, &err), QWENRT_OK);

    struct qwenrt_model *m = NULL;
    if (qwenrt_model_load("tests/data/qwen35-tiny-f32", NULL, &m, &err))
        fail_msg("%s", err.message);
    struct profile_binding b;
    if (profile_bind(p, m->plans, cpu_features_detect(), &b, &err))
        fail_msg("seed 000 bind: %s", err.message);
    /* decode attention of both attention layers remapped from the WGSL kernel; prefill untouched */
    int n_remapped = 0;
    for (int32_t i = 0; i < b.n_ops[PHASE_DECODE]; i++)
        if (b.ops[PHASE_DECODE][i].remapped) {
            assert_int_equal(m->plans[PHASE_DECODE].ops[i].kind, OP_ATTENTION);
            assert_string_equal(b.ops[PHASE_DECODE][i].requested, "attn_decode_head256");
            n_remapped++;
        }
    assert_int_equal(n_remapped, 2);
    for (int32_t i = 0; i < b.n_ops[PHASE_PREFILL]; i++)
        assert_false(b.ops[PHASE_PREFILL][i].remapped);
    /* remaps named: one for the kernel, one per requested fusion qwenrt lacks */
    const char *r0 = json_string_value(json_array_get(b.remaps, 0));
    assert_non_null(
        strstr(r0, "decode attention (2 ops, layers 3,7): attn_decode_head256 -> attention"));
    assert_non_null(
        strstr(r0, "attention_decode_online_head256_f16kv_output_gate.wgsl#main is a wgsl source"));
    assert_int_equal(json_array_size(b.remaps), 6);
    /* the report classifies each field */
    json_t *rep = profile_report(p, &b, m->plans);
    size_t i;
    json_t *f;
    int seen = 0;
    json_array_foreach (json_object_get(rep, "fields"), i, f) {
        const char *path = json_string_value(json_object_get(f, "path"));
        const char *ap = json_string_value(json_object_get(f, "applies"));
        if (!strcmp(path, "runtime.inference.session.decodeLoop.readbackMode"))
            seen += !strcmp(ap, "recorded");
        if (!strcmp(path, "runtime.inference.session.useGreedyLmHeadArgmaxFusion"))
            seen += !strcmp(ap, "remapped");
        if (!strcmp(path, "runtime.inference.session.useLinearAttentionQKVZProjectionFusion"))
            seen += !strcmp(ap, "applies");
        if (!strcmp(path, "runtime.inference.session.lmHeadArgmaxQ4K.colsPerWorkgroup"))
            seen += !strcmp(ap, "ignored");
        if (!strcmp(path, "runtime.inference.executionPatch.set"))
            seen += !strcmp(ap, "applies");
    }
    assert_int_equal(seen, 5);
    json_decref(rep);
    profile_binding_free(&b);
    qwenrt_model_free(m);
    profile_free(p);
}

static void test_shipped_profiles(void **state)
{
    (void)state;
    static const char *const ids[] = {"profiles/default", "throughput", "cpu-portable"};
    for (int i = 0; i < 3; i++) {
        struct profile *p = NULL;
        struct qwenrt_error err = {0};
        if (profile_load(ids[i], "profiles", &p, &err))
            fail_msg("%s: %s", ids[i], err.message);
        assert_true(p->compatible &
                    PROFILE_INTENT_VERIFY); /* every shipped profile can be validated */
        profile_free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extends_chain_and_merge),
        cmocka_unit_test(test_merge_function),
        cmocka_unit_test(test_cycle_refused),
        cmocka_unit_test(test_metadata_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_cuda_tuning),
        cmocka_unit_test(test_intent_gating),
        cmocka_unit_test(test_binding_errors_and_remap),
        cmocka_unit_test(test_seed_000),
        cmocka_unit_test(test_shipped_profiles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
