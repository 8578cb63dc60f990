/*
 * test_model_errors.c — bad models and bad requests get a clear error naming the file and the
 * problem, and nothing crashes: a config.json that is not JSON, a missing config key, an
 * unknown model_type, a missing tensor, a tensor of the wrong shape, a truncated weights file,
 * a GGUF file that is truncated, ids outside the vocabulary, a full context, and the session
 * left unchanged after a refused call.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "qwenrt.h"
#include "runtime/session.h"

TEST_GROUP_TMPDIR("model-errors")

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A copy of the qwen3 f32 fixture in tmpdir/name, with config text (NULL = the original) and
 * the weights rewritten: tensor `drop` left out, tensor `reshape` given a wrong shape. */
static void make_model(const char *name, const char *config, const char *drop, const char *reshape,
                       char *dir, size_t len)
{
    snprintf(dir, len, "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    char path[512], cmd[1024];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (config) {
        write_file(path, config);
    } else {
        snprintf(cmd, sizeof(cmd), "cp tests/data/qwen3-tiny-f32/config.json %s", path);
        assert_int_equal(system(cmd), 0);
    }
    struct safetensors_file sf;
    struct qwenrt_error err = {0};
    assert_int_equal(safetensors_open(&sf, "tests/data/qwen3-tiny-f32/model.safetensors", &err), QWENRT_OK);
    struct safetensors_out *outs = calloc((size_t)sf.n_tensors, sizeof(*outs));
    int32_t n = 0;
    for (int32_t i = 0; i < sf.n_tensors; i++) {
        const struct qr_tensor *t = &sf.tensors[i];
        if (drop && !strcmp(t->name, drop))
            continue;
        struct safetensors_out *o = &outs[n++];
        o->name = t->name;
        o->dtype = t->dtype;
        o->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims; d++)
            o->shape[d] = t->ne[t->n_dims - 1 - d];
        if (reshape && !strcmp(t->name, reshape) && t->n_dims == 2) { /* same bytes, other shape */
            o->shape[0] *= 2;
            o->shape[1] /= 2;
        }
        o->data = t->data;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(safetensors_write(path, outs, n, &err), QWENRT_OK);
    free(outs);
    safetensors_close(&sf);
}

/* Loading dir fails with `status` and a message containing each of the words. */
static void expect_load_error(const char *dir, qwenrt_status status, const char *w1, const char *w2)
{
    struct qwenrt_model *m = NULL;
    struct qwenrt_error err = {0};
    qwenrt_status st = qwenrt_model_load(dir, NULL, &m, &err);
    printf("%s -> %s: %s\n", dir, qwenrt_status_name(st), err.message);
    assert_int_equal(st, status);
    assert_null(m);
    assert_non_null(strstr(err.message, w1));
    if (w2)
        assert_non_null(strstr(err.message, w2));
}

static void test_config_not_json(void **st)
{
    (void)st;
    char dir[256];
    make_model("notjson", "{\"model_type\": \"qwen3\", ", NULL, NULL, dir, sizeof(dir));
    expect_load_error(dir, QWENRT_ERR_FORMAT, "config.json", "JSON");
}

static void test_config_missing_key(void **st)
{
    (void)st;
    char dir[256];
    make_model("nokey", "{\"model_type\": \"qwen3\", \"vocab_size\": 1024}", NULL, NULL, dir, sizeof(dir));
    expect_load_error(dir, QWENRT_ERR_FORMAT, "config.json", "hidden_size");
}

static void test_config_unknown_type(void **st)
{
    (void)st;
    char dir[256];
    make_model("llama", "{\"model_type\": \"llama\"}", NULL, NULL, dir, sizeof(dir));
    expect_load_error(dir, QWENRT_ERR_UNSUPPORTED, "config.json", "llama");
}

static void test_missing_tensor(void **st)
{
    (void)st;
    char dir[256];
    make_model("missing", NULL, "model.layers.1.mlp.up_proj.weight", NULL, dir, sizeof(dir));
    expect_load_error(dir, QWENRT_ERR_NOT_FOUND, "model.layers.1.mlp.up_proj.weight", dir);
}

static void test_wrong_shape(void **st)
{
    (void)st;
    char dir[256];
    make_model("shape", NULL, NULL, "model.layers.2.self_attn.k_proj.weight", dir, sizeof(dir));
    expect_load_error(dir, QWENRT_ERR_SHAPE, "model.layers.2.self_attn.k_proj.weight", "expected");
}

static void test_truncated_weights(void **st)
{
    (void)st;
    char dir[256], cmd[1024];
    make_model("trunc", NULL, NULL, NULL, dir, sizeof(dir));
    snprintf(cmd, sizeof(cmd), "truncate -s 100000 %s/model.safetensors", dir);
    assert_int_equal(system(cmd), 0);
    expect_load_error(dir, QWENRT_ERR_FORMAT, "model.safetensors", "past the end");
}

static void test_not_a_model(void **st)
{
    (void)st;
    char path[256];
    snprintf(path, sizeof(path), "%s/notes.txt", tmpdir);
    write_file(path, "hello");
    expect_load_error(path, QWENRT_ERR_FORMAT, "notes.txt", "GGUF");
    expect_load_error("/nonexistent/model.gguf", QWENRT_ERR_IO, "/nonexistent/model.gguf", NULL);
}

static void test_truncated_gguf(void **st)
{
    (void)st;
    char src[256], dst[256], cmd[1024];
    snprintf(src, sizeof(src), "%s/ok.gguf", tmpdir);
    snprintf(dst, sizeof(dst), "%s/cut.gguf", tmpdir);
    snprintf(cmd, sizeof(cmd), "%s convert tests/data/qwen3-tiny-f32 -o %s --type f16 2>/dev/null", getenv("QWENRT_BIN") ? getenv("QWENRT_BIN") : "build/qwenrt", src);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "head -c 500000 %s > %s", src, dst);
    assert_int_equal(system(cmd), 0);
    expect_load_error(dst, QWENRT_ERR_FORMAT, "cut.gguf", NULL);
}

static void test_bad_ids_and_context(void **st)
{
    (void)st;
    struct qwenrt_model *m = NULL;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_model_load("tests/data/qwen3-tiny-f32", NULL, &m, &err), QWENRT_OK);
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 8;
    sp.precision = 7; /* not an enum qwenrt_precision: refused, no session */
    s = (struct qwenrt_session *)1;
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(s);
    assert_non_null(strstr(err.message, "unknown precision 7"));
    sp.precision = QWENRT_PRECISION_EXACT;
    sp.kv_type = 5; /* not an enum qwenrt_kv_type */
    s = (struct qwenrt_session *)1;
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_ERR_INVALID_ARG);
    assert_null(s);
    assert_non_null(strstr(err.message, "unknown KV cache type 5"));
    sp.kv_type = QWENRT_KV_F16; /* on the CPU as asked */
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_kv_type(s), QWENRT_KV_F16);
    qwenrt_session_free(s);
    sp.kv_type = QWENRT_KV_DEFAULT; /* the CPU's default cache is f32 */
    sp.precision = QWENRT_PRECISION_DEFAULT;
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_kv_type(s), QWENRT_KV_F32);
    int32_t bad[3] = {5, 1024, 7}, neg = -1, ok[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(qwenrt_session_prefill(s, bad, 3, NULL, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "1024"));
    assert_int_equal(qwenrt_session_decode(s, neg, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_session_prefill(s, ok, 0, NULL, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_session_n_past(s), 0); /* refused calls change nothing */
    assert_null(qwenrt_session_logits(s));
    struct qwenrt_sampler *greedy = NULL;
    struct qwenrt_sampler_params gp = qwenrt_sampler_default_params();
    assert_int_equal(qwenrt_sampler_init(&gp, 1024, &greedy, &err), QWENRT_OK);
    int32_t id = -7;
    assert_int_equal(qwenrt_session_sample(s, greedy, &id, &err), QWENRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "no logits yet"));
    assert_int_equal(qwenrt_session_sample(NULL, greedy, &id, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_session_sample(s, NULL, &id, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_session_sample(s, greedy, NULL, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(id, -7);
    session_sample_start(s, greedy); /* nothing has run, no sampler, no session: no-ops */
    session_sample_start(s, NULL);
    session_sample_start(NULL, greedy);
    assert_int_equal(qwenrt_session_prefill(s, ok, 6, NULL, &err), QWENRT_OK);
    session_sample_start(s, greedy); /* a CPU session: nothing to start, the sample as before */
    assert_int_equal(qwenrt_session_sample(s, greedy, &id, &err), QWENRT_OK);
    assert_int_equal(id, qwenrt_argmax(qwenrt_session_logits(s), 1024));
    /* several steps per call need a CUDA session: refused here, nothing changed; bad keeps */
    int32_t steps[2];
    assert_int_equal(session_generate(s, greedy, 1, 2, steps, &err), QWENRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "not a CUDA session"));
    assert_int_equal(session_generate(s, greedy, 1, 0, steps, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(session_generate_keep(s, greedy, 1, steps, 2, 1, &err), QWENRT_ERR_INVALID_ARG);
    assert_int_equal(qwenrt_session_n_past(s), 6);
    qwenrt_sampler_free(greedy);
    assert_int_equal(qwenrt_session_prefill(s, ok, 3, NULL, &err), QWENRT_ERR_LIMIT);
    assert_non_null(strstr(err.message, "context full"));
    assert_int_equal(qwenrt_session_n_past(s), 6);
    assert_int_equal(qwenrt_session_decode(s, 1, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_decode(s, 1, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_decode(s, 1, &err), QWENRT_ERR_LIMIT);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_not_json),  cmocka_unit_test(test_config_missing_key),
        cmocka_unit_test(test_config_unknown_type), cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_wrong_shape),      cmocka_unit_test(test_truncated_weights),
        cmocka_unit_test(test_not_a_model),      cmocka_unit_test(test_truncated_gguf),
        cmocka_unit_test(test_bad_ids_and_context),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
