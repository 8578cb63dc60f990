/*
 * test_gguf_model.c — models through GGUF files: each HF fixture converted by `convert_model`
 * to GGUF (f32, f16) and loaded back gives the transformers reference logits (this exercises
 * the GGUF writer and reader, llama.cpp's Qwen3.5 conventions: 1+w norms, ssm_a, squeezed conv,
 * tiled V heads with 2 key heads for 4 value heads); `synth` is deterministic and loads.
 */
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "base/sha256.h"
#include "qwenrt.h"
#include "tools/convert.h"
#include "tools/synth.h"

TEST_GROUP_TMPDIR("gguf-model")

/* Converts fixture `dir` to GGUF of `type`, loads it, compares logits with the reference. */
static void check_converted(const char *dir, const char *type, double tol)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model *src = NULL, *m = NULL;
    char out[256], refp[256];
    snprintf(out, sizeof(out), "%s/%s-%s.gguf", tmpdir, strrchr(dir, '/') + 1, type);
    assert_int_equal(qwenrt_model_load(dir, NULL, &src, &err), QWENRT_OK);
    struct export_params p = {.type = (enum export_type)export_type_from_name(type)};
    if (convert_model(src, out, &p, &err) != QWENRT_OK)
        fail_msg("convert %s: %s", dir, err.message);
    qwenrt_model_free(src);
    if (qwenrt_model_load(out, NULL, &m, &err) != QWENRT_OK)
        fail_msg("load %s: %s", out, err.message);

    struct safetensors_file ref;
    snprintf(refp, sizeof(refp), "%s/reference.safetensors", dir);
    assert_int_equal(safetensors_open(&ref, refp, &err), QWENRT_OK);
    const struct qr_tensor *prompt = ref_tensor(&ref, "prompt_ids"), *logits = ref_tensor(&ref, "logits");
    int32_t T = (int32_t)prompt->ne[0], V = (int32_t)logits->ne[0];
    struct qwenrt_session *s = NULL;
    assert_int_equal(qwenrt_session_init(m, NULL, &s, &err), QWENRT_OK);
    float *lg = malloc((size_t)T * V * sizeof(float));
    assert_int_equal(qwenrt_session_prefill(s, prompt->data, T, lg, &err), QWENRT_OK);
    double e = rel_err(lg, logits->data, (size_t)T * V);
    int agree = 0;
    for (int32_t t = 0; t < T; t++)
        agree += argmax_f(lg + (size_t)t * V, V) == argmax_f((const float *)logits->data + (size_t)t * V, V);
    printf("%s as %s gguf: logits rel err %.3g, argmax agreement %d/%d\n", dir, type, e, agree, T);
    assert_true(e <= tol);
    if (tol <= 1e-4)
        assert_int_equal(agree, T);
    free(lg);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
    safetensors_close(&ref);
}

static void test_qwen3_gguf_f32(void **st) { (void)st; check_converted("tests/data/qwen3-tiny-f32", "f32", 1e-4); }
static void test_qwen35_gguf_f32(void **st) { (void)st; check_converted("tests/data/qwen35-tiny-f32", "f32", 1e-4); }
static void test_qwen35_bf16_gguf_f32(void **st) { (void)st; check_converted("tests/data/qwen35-tiny-bf16", "f32", 1e-4); }
/* f16 storage rounds every weight by up to 2^-11 relative; measured: Qwen3 logits move by
 * ~1e-3 relative, Qwen3.5 (random weights, its DeltaNet amplifies) by ~2e-2. The bounds sit
 * above those, far below what a layout or convention error gives (O(1)). */
static void test_qwen3_gguf_f16(void **st) { (void)st; check_converted("tests/data/qwen3-tiny-f32", "f16", 5e-3); }
static void test_qwen35_gguf_f16(void **st) { (void)st; check_converted("tests/data/qwen35-tiny-f32", "f16", 5e-2); }

/* synth: same seed -> byte-identical file; a different seed -> a different file; loads. */
static void test_synth_deterministic(void **st)
{
    (void)st;
    struct model_hparams hp;
    struct qwenrt_error err = {0};
    char a[256], b[256], c[256], ha[SHA256_HEX_LEN], hb[SHA256_HEX_LEN], hc[SHA256_HEX_LEN];
    assert_int_equal(synth_preset("qwen35-tiny", &hp, &err), QWENRT_OK);
    snprintf(a, sizeof(a), "%s/a.gguf", tmpdir);
    snprintf(b, sizeof(b), "%s/b.gguf", tmpdir);
    snprintf(c, sizeof(c), "%s/c.gguf", tmpdir);
    struct export_params p = {.type = EXPORT_F16, .tied = true};
    assert_int_equal(synth_write(a, &hp, 7, &p, &err), QWENRT_OK);
    assert_int_equal(synth_write(b, &hp, 7, &p, &err), QWENRT_OK);
    assert_int_equal(synth_write(c, &hp, 8, &p, &err), QWENRT_OK);
    assert_int_equal(sha256_file_hex(a, ha, &err), QWENRT_OK);
    assert_int_equal(sha256_file_hex(b, hb, &err), QWENRT_OK);
    assert_int_equal(sha256_file_hex(c, hc, &err), QWENRT_OK);
    assert_string_equal(ha, hb);
    assert_string_not_equal(ha, hc);
    struct qwenrt_model *m = NULL;
    if (qwenrt_model_load(a, NULL, &m, &err) != QWENRT_OK)
        fail_msg("%s", err.message);
    struct qwenrt_model_info info;
    qwenrt_model_get_info(m, &info);
    assert_string_equal(info.arch, "qwen35");
    assert_int_equal(info.n_layer, 8);
    qwenrt_model_free(m);
}

/* quantised export: the rows are quantised in parallel; the bytes must not depend on the
 * number of threads (Q4_K_M: Q4_K, Q6_K and the Q8_0 fallback, with the vocabulary rows of
 * the embedding giving many parallel chunks) */
static void test_export_threads_identical(void **st)
{
    (void)st;
    struct model_hparams hp;
    struct qwenrt_error err = {0};
    char a[256], b[256], ha[SHA256_HEX_LEN], hb[SHA256_HEX_LEN];
    assert_int_equal(synth_preset("qwen3-tiny", &hp, &err), QWENRT_OK);
    hp.n_embd = 256, hp.n_ff = 768, hp.n_head = 4, hp.n_vocab = 4096;
    snprintf(a, sizeof(a), "%s/t1.gguf", tmpdir);
    snprintf(b, sizeof(b), "%s/t3.gguf", tmpdir);
    struct export_params p = {.type = EXPORT_Q4_K_M, .tied = true};
    int before = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(synth_write(a, &hp, 11, &p, &err), QWENRT_OK);
    omp_set_num_threads(3);
    assert_int_equal(synth_write(b, &hp, 11, &p, &err), QWENRT_OK);
    omp_set_num_threads(before);
    assert_int_equal(sha256_file_hex(a, ha, &err), QWENRT_OK);
    assert_int_equal(sha256_file_hex(b, hb, &err), QWENRT_OK);
    assert_string_equal(ha, hb);
}

/* unknown preset names are refused with the list of presets */
static void test_synth_unknown_arch(void **st)
{
    (void)st;
    struct model_hparams hp;
    struct qwenrt_error err = {0};
    assert_int_equal(synth_preset("llama-7b", &hp, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "qwen35-0.8b"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_gguf_f32),
        cmocka_unit_test(test_qwen35_gguf_f32),
        cmocka_unit_test(test_qwen35_bf16_gguf_f32),
        cmocka_unit_test(test_qwen3_gguf_f16),
        cmocka_unit_test(test_qwen35_gguf_f16),
        cmocka_unit_test(test_synth_deterministic),
        cmocka_unit_test(test_export_threads_identical),
        cmocka_unit_test(test_synth_unknown_arch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
