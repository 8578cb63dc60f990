/*
 * test_compare.c — compare_models: a model against itself has zero KL and full agreement;
 * an F16 copy of the fixture is close to it (small KL, high agreement) and a model with other
 * weights is far from it; models of different vocabularies are refused.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "qwenrt.h"
#include "tools/compare.h"
#include "tools/convert.h"

static struct qwenrt_model *load(const char *p)
{
    struct qwenrt_model *m = NULL;
    struct qwenrt_error err = {0};
    if (qwenrt_model_load(p, NULL, &m, &err) != QWENRT_OK)
        fail_msg("%s", err.message);
    return m;
}

static void test_compare(void **st)
{
    (void)st;
    struct qwenrt_error err = {0};
    struct qwenrt_model *f32 = load("tests/data/qwen3-tiny-f32"), *other = load("tests/data/qwen3-tiny-bf16");
    char dir[] = "/tmp/qwenrt-compare-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/f16.gguf", dir);
    struct export_params p = {.type = EXPORT_F16};
    assert_int_equal(convert_model(f32, path, &p, &err), QWENRT_OK);
    struct qwenrt_model *f16 = load(path);
    int32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = (i * 37 + 11) % 1024;
    struct compare_result r;
    assert_int_equal(compare_models(f32, f32, ids, 100, 2, QWENRT_PRECISION_DEFAULT, &r, &err), QWENRT_OK);
    assert_true(r.kl_max < 1e-9);
    assert_true(r.top1_agreement == 1.0);
    assert_int_equal(compare_models(f16, f32, ids, 100, 2, QWENRT_PRECISION_DEFAULT, &r, &err), QWENRT_OK);
    printf("f16 vs f32: KL mean %.3g, top-1 %.3f\n", r.kl_mean, r.top1_agreement);
    assert_true(r.kl_mean > 0 && r.kl_mean < 1e-3);
    assert_true(r.top1_agreement >= 0.97);
    assert_int_equal(compare_models(other, f32, ids, 100, 2, QWENRT_PRECISION_DEFAULT, &r, &err), QWENRT_OK);
    printf("other weights vs f32: KL mean %.3g, top-1 %.3f\n", r.kl_mean, r.top1_agreement);
    assert_true(r.kl_mean > 0.1);
    struct qwenrt_model *q35 = load("tests/data/qwen35-tiny-f32");
    assert_int_equal(compare_models(q35, f32, ids, 100, 2, QWENRT_PRECISION_DEFAULT, &r, &err), QWENRT_ERR_INVALID_ARG);
    qwenrt_model_free(q35);
    qwenrt_model_free(f16);
    qwenrt_model_free(other);
    qwenrt_model_free(f32);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_compare)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
