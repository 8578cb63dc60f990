/*
 * test_validate_records.c — validate and bench records (issue 7) pass the JSON schemas kept in
 * docs/schemas/, for the fixture models and synth models (a Qwen3.5 bf16 and a Qwen3 q8_0
 * GGUF written by src/tools/synth.c); two runs of the same thing differ only in timings and
 * timestamps; a failing gate's record and a refused bench are valid records too; the schema
 * checker itself rejects broken records with the path of the violation; profile files pass
 * profile.schema.json.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "backend/cpu/cpu_backend.h"
#include "runtime/session.h"
#include "tools/bench.h"
#include "tools/json_schema.h"
#include "tools/synth.h"
#include "tools/validate.h"

static json_t *schema(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "docs/schemas/%s.schema.json", name);
    json_error_t je;
    json_t *s = json_load_file(path, 0, &je);
    if (!s)
        fail_msg("%s:%d: %s", path, je.line, je.text);
    return s;
}

static void conforms(const char *name, json_t *doc)
{
    json_t *s = schema(name);
    struct qwenrt_error err = {0};
    if (json_schema_check(s, doc, &err))
        fail_msg("%s record does not conform: %s", name, err.message);
    json_decref(s);
}

static json_t *validate_record(const char *model, const char *reference)
{
    struct validate_params p = {.model_path = model,
                                .n_prompt = 5,
                                .n_gen = 4,
                                .n_threads = 2,
                                .reference_file = reference,
                                .profiles_dir = "profiles",
                                .seed = 7};
    struct validate_result r;
    struct qwenrt_error err = {0};
    if (validate_run(&p, &r, &err))
        fail_msg("validate %s: %s", model, err.message);
    json_t *rec = json_incref(r.record);
    validate_result_free(&r);
    return rec;
}

/* Removes what may differ between two runs: timestamps and timings. */
static void strip_volatile(json_t *rec)
{
    static const char *const top[] = {
        "created_at", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s",
        "total_s",    "per_token_ms",         "peak_memory"};
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
        json_object_del(rec, top[i]);
    size_t i;
    json_t *l;
    json_array_foreach (json_object_get(rec, "lanes"), i, l) {
        json_object_del(l, "samples");
        json_object_del(l, "median");
        json_object_del(l, "per_token_ms");
        json_object_del(l, "ratio_candidate_over_this");
    }
}

static void same_but_volatile(json_t *a, json_t *b)
{
    strip_volatile(a);
    strip_volatile(b);
    if (!json_equal(a, b)) {
        char *x = json_dumps(a, JSON_SORT_KEYS | JSON_COMPACT),
             *y = json_dumps(b, JSON_SORT_KEYS | JSON_COMPACT);
        size_t k = 0;
        while (x[k] && x[k] == y[k])
            k++;
        fail_msg("two runs differ beyond timings and timestamps near: ...%.80s",
                 x + (k > 40 ? k - 40 : 0));
    }
}

static void test_validate_records_conform(void **state)
{
    (void)state;
    static const char *const models[] = {"tests/data/qwen3-tiny-f32",
                                         "tests/data/qwen35-tiny-bf16"};
    for (int i = 0; i < 2; i++) {
        json_t *a = validate_record(models[i], NULL), *b = validate_record(models[i], NULL);
        assert_string_equal(json_string_value(json_object_get(a, "status")), "validated");
        conforms("validation", a);
        conforms("validation", b);
        same_but_volatile(a, b);
        json_decref(a);
        json_decref(b);
        char ref[256];
        snprintf(ref, sizeof(ref), "%s/reference.safetensors", models[i]);
        json_t *f = validate_record(models[i], ref);
        conforms("validation", f);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(f, "reference"), "kind")), "file");
        json_decref(f);
    }
}

static void test_synth_models(void **state)
{
    (void)state;
    static const struct {
        const char *preset;
        enum export_type type;
        const char *tolerance;
    } cases[] = {{"qwen35-tiny", EXPORT_BF16, "float"}, {"qwen3-tiny", EXPORT_Q8_0, "quantized"}};
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/tmp/qwenrt_records_synth_%d_%d.gguf", i, (int)getpid());
        struct model_hparams hp;
        struct qwenrt_error err = {0};
        struct export_params ep = {.type = cases[i].type, .name = cases[i].preset, .tied = true};
        if (synth_preset(cases[i].preset, &hp, &err) || synth_write(path, &hp, 1234, &ep, &err))
            fail_msg("synth %s: %s", cases[i].preset, err.message);
        json_t *a = validate_record(path, NULL), *b = validate_record(path, NULL);
        conforms("validation", a);
        if (strcmp(json_string_value(json_object_get(a, "status")), "validated"))
            fail_msg("synth %s: %s", cases[i].preset,
                     json_string_value(json_object_get(json_object_get(a, "result"), "failure")));
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(a, "tolerances"), "applied")),
            cases[i].tolerance);
        same_but_volatile(a, b);
        json_decref(a);
        json_decref(b);
        remove(path);
    }
}

static json_t *bench_record(const char *model, const char *compare)
{
    struct bench_params p = {.model_path = model,
                             .n_prompt = 6,
                             .n_gen = 4,
                             .warmup = 1,
                             .trials = 3,
                             .n_threads = 2,
                             .profiles_dir = "profiles",
                             .seed = 3};
    if (compare)
        p.compare[p.n_compare++] = compare;
    json_t *rec = NULL;
    struct qwenrt_error err = {0};
    if (bench_run(&p, &rec, &err))
        fail_msg("bench %s: %s", model, err.message);
    return rec;
}

static void test_bench_records_conform(void **state)
{
    (void)state;
    json_t *a = bench_record("tests/data/qwen35-tiny-f32", "profile:cpu-portable");
    json_t *b = bench_record("tests/data/qwen35-tiny-f32", "profile:cpu-portable");
    assert_string_equal(json_string_value(json_object_get(a, "status")), "timed");
    assert_true(json_number_value(json_object_get(a, "prefill_tokens_per_s")) > 0);
    assert_true(json_number_value(json_object_get(a, "decode_tokens_per_s")) > 0);
    conforms("bench", a);
    conforms("bench", b);
    /* both lanes timed the validated tokens */
    size_t i;
    json_t *l;
    json_array_foreach (json_object_get(a, "lanes"), i, l)
        assert_true(json_is_true(json_object_get(l, "tokens_match_validation")));
    same_but_volatile(a, b);
    json_decref(a);
    json_decref(b);
    json_t *c = bench_record("tests/data/qwen3-tiny-bf16", "cmd:true");
    conforms("bench", c);
    json_decref(c);
}

static void lose_gate(const struct plan_op *op, struct cpu_exec *ex)
{
    (void)op;
    (void)ex;
}

static void break_gate(struct qwenrt_session *s, void *user)
{
    (void)user;
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < s->model->plans[ph].n_ops; i++)
            if (s->model->plans[ph].ops[i].kind == OP_SIGMOID_GATE)
                s->fns[ph][i] = lose_gate;
}

/* A path that passed the gate but times something else is refused: timing_validation_failed,
 * no timings in the record. */
static void test_bench_timing_validation_failed(void **state)
{
    (void)state;
    struct bench_params p = {.model_path = "tests/data/qwen35-tiny-f32",
                             .n_prompt = 6,
                             .n_gen = 6,
                             .warmup = 1,
                             .trials = 2,
                             .n_threads = 2,
                             .profiles_dir = "profiles",
                             .lane_hook = break_gate};
    json_t *rec = NULL;
    struct qwenrt_error err = {0};
    if (bench_run(&p, &rec, &err))
        fail_msg("bench: %s", err.message);
    assert_string_equal(json_string_value(json_object_get(rec, "status")),
                        "timing_validation_failed");
    assert_non_null(strstr(json_string_value(json_object_get(rec, "status_reason")),
                           "warm-up 0 produced other tokens"));
    assert_true(json_is_null(json_object_get(rec, "decode_tokens_per_s")));
    assert_null(json_object_get(json_array_get(json_object_get(rec, "lanes"), 0), "samples"));
    conforms("bench", rec);
    json_decref(rec);
}

static void test_checker_rejects(void **state)
{
    (void)state;
    json_t *rec = validate_record("tests/data/qwen3-tiny-f32", NULL);
    json_t *s = schema("validation");
    struct qwenrt_error err = {0};
    json_t *bad = json_deep_copy(rec);
    json_object_del(bad, "status");
    assert_int_equal(json_schema_check(s, bad, &err), QWENRT_ERR_FORMAT);
    assert_non_null(strstr(err.message, "$: missing required key 'status'"));
    json_decref(bad);
    bad = json_deep_copy(rec);
    json_t *c0 = json_array_get(json_object_get(bad, "checks"), 0);
    json_object_set_new(json_object_get(c0, "logits"), "max_absolute_error", json_string("small"));
    assert_int_equal(json_schema_check(s, bad, &err), QWENRT_ERR_FORMAT);
    assert_non_null(
        strstr(err.message, "$.checks[0].logits.max_absolute_error: expected number, got string"));
    json_decref(bad);
    bad = json_deep_copy(rec);
    json_object_set_new(bad, "status", json_string("probably_fine"));
    assert_int_equal(json_schema_check(s, bad, &err), QWENRT_ERR_FORMAT);
    assert_non_null(strstr(err.message, "$.status: value is not one of the enum"));
    json_decref(bad);
    json_decref(s);
    json_decref(rec);
}

static void test_profiles_conform(void **state)
{
    (void)state;
    static const char *const files[] = {"profiles/default.json", "profiles/throughput.json",
                                        "profiles/cpu-portable.json"};
    json_t *s = schema("profile");
    for (int i = 0; i < 3; i++) {
        json_t *p = json_load_file(files[i], 0, NULL);
        struct qwenrt_error err = {0};
        assert_non_null(p);
        if (json_schema_check(s, p, &err))
            fail_msg("%s: %s", files[i], err.message);
        json_decref(p);
    }
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_rejects),
        cmocka_unit_test(test_validate_records_conform),
        cmocka_unit_test(test_synth_models),
        cmocka_unit_test(test_bench_records_conform),
        cmocka_unit_test(test_bench_timing_validation_failed),
        cmocka_unit_test(test_profiles_conform),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
