/*
 * test_regress_limits.c — limits instead of crashes (issue 9, item 3): what does not fit in
 * memory is refused with numbers before it is allocated, and a full disk during convert or a
 * save leaves no partial output.
 *
 * Memory: base/meminfo's per-thread override pretends the machine has little memory, so the
 * checks trigger on the tiny fixtures (a real 40k-token context of Qwen3-0.6B needs ~9 GiB,
 * too much to allocate in a test). Disk: RLIMIT_FSIZE makes writes fail with EFBIG partway, as
 * a full disk does (SIGXFSZ is ignored so the write returns an error instead of killing us).
 */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/meminfo.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "tools/convert.h"

#define TINY "tests/data/qwen3-tiny-f32"
#define TINY35 "tests/data/qwen35-tiny-f32"

TEST_GROUP_TMPDIR("limits")

static struct qwenrt_model *load(const char *path)
{
    struct qwenrt_model *m = NULL;
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 1;
    if (qwenrt_model_load(path, &mp, &m, &err))
        fail_msg("%s: %s", path, err.message);
    return m;
}

/* A session whose KV cache cannot fit: LIMIT naming the context and both sizes, no session. */
static void test_session_state_does_not_fit(void **state)
{
    (void)state;
    struct qwenrt_model *m = load(TINY);
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 4096; /* 3 layers x 2 x 4096 x 128 floats = 12 MiB of KV cache */
    struct qwenrt_session *s = (void *)1;
    struct qwenrt_error err = {0};
    mem_override(1u << 20); /* 1 MiB available */
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_ERR_LIMIT);
    mem_override(0);
    assert_null(s);
    assert_non_null(strstr(err.message, "4096-token context needs 0.01 GiB"));
    assert_non_null(strstr(err.message, "only 0.00 GiB of memory is available"));
    /* with the memory back, the same request works */
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
}

/* A prefill whose activations cannot fit: LIMIT, and the session is unchanged and usable. */
static void test_prefill_activations_do_not_fit(void **state)
{
    (void)state;
    struct qwenrt_model *m = load(TINY35);
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 1024;
    struct qwenrt_session *s = NULL;
    struct qwenrt_error err = {0};
    assert_int_equal(qwenrt_session_init(m, &sp, &s, &err), QWENRT_OK);
    int32_t ids[512];
    for (int i = 0; i < 512; i++)
        ids[i] = (i * 37) % 1000;
    assert_int_equal(qwenrt_session_prefill(s, ids, 2, NULL, &err), QWENRT_OK);
    float keep[1024];
    memcpy(keep, qwenrt_session_logits(s), sizeof(keep));
    mem_override(256u << 10);
    assert_int_equal(qwenrt_session_prefill(s, ids, 512, NULL, &err), QWENRT_ERR_LIMIT);
    mem_override(0);
    assert_non_null(strstr(err.message, "activations for a batch of 512 tokens"));
    assert_int_equal(qwenrt_session_n_past(s), 2);
    assert_memory_equal(qwenrt_session_logits(s), keep, sizeof(keep));
    assert_int_equal(qwenrt_session_decode(s, 5, &err), QWENRT_OK);
    assert_int_equal(qwenrt_session_n_past(s), 3);
    qwenrt_session_free(s);
    qwenrt_model_free(m);
}

/* Weights larger than the machine's memory: LIMIT with both sizes, before any binding. */
static void test_model_does_not_fit(void **state)
{
    (void)state;
    struct qwenrt_model *m = (void *)1;
    struct qwenrt_error err = {0};
    mem_override(1u << 20);
    assert_int_equal(qwenrt_model_load(TINY, NULL, &m, &err), QWENRT_ERR_LIMIT);
    mem_override(0);
    assert_null(m);
    assert_non_null(strstr(err.message, "do not fit in this machine's 0.00 GiB of memory"));
}

/* Runs fn with file writes limited to `bytes` (EFBIG past it, like a full disk). */
static void with_fsize_limit(rlim_t bytes, void (*fn)(void *), void *user)
{
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    fn(user);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
}

/* Nothing at path, and no temporary file beside it. */
static void assert_no_output(const char *path)
{
    struct stat sb;
    assert_int_not_equal(stat(path, &sb), 0);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ls '%s' | grep -q tmp", tmpdir);
    assert_int_not_equal(system(cmd), 0);
}

struct write_case {
    struct qwenrt_model *m;
    struct qwenrt_checkpoint *cp;
    char path[128];
    qwenrt_status st;
    struct qwenrt_error err;
};

static void do_convert(void *user)
{
    struct write_case *c = user;
    struct export_params ep = {.type = EXPORT_F32, .name = "t", .tied = true};
    c->st = convert_model(c->m, c->path, &ep, &c->err);
}

static void do_safetensors(void *user)
{
    struct write_case *c = user;
    const struct qr_tensor *e = c->m->w.tok_embd;
    struct safetensors_out t = {.name = "embed", .dtype = e->dtype, .n_dims = 2,
                                .shape = {e->ne[1], e->ne[0]}, .data = e->data};
    c->st = safetensors_write(c->path, &t, 1, &c->err);
}

static void do_checkpoint(void *user)
{
    struct write_case *c = user;
    c->st = qwenrt_checkpoint_save(c->cp, c->path, &c->err);
}

/* A full disk while converting (GGUF), writing safetensors or saving a checkpoint: an IO
 * error naming the file, and neither the file nor its temporary is left. */
static void test_full_disk_leaves_no_partial_output(void **state)
{
    (void)state;
    struct write_case c = {.m = load(TINY35)};
    snprintf(c.path, sizeof(c.path), "%s/out.gguf", tmpdir);
    with_fsize_limit(64 << 10, do_convert, &c);
    assert_int_equal(c.st, QWENRT_ERR_IO);
    assert_non_null(strstr(c.err.message, "out.gguf"));
    assert_no_output(c.path);

    snprintf(c.path, sizeof(c.path), "%s/out.safetensors", tmpdir);
    with_fsize_limit(64 << 10, do_safetensors, &c);
    assert_int_equal(c.st, QWENRT_ERR_IO);
    assert_no_output(c.path);

    struct qwenrt_session *s = NULL;
    int32_t ids[3] = {1, 2, 3};
    assert_int_equal(qwenrt_session_init(c.m, NULL, &s, &c.err), QWENRT_OK);
    assert_int_equal(qwenrt_session_prefill(s, ids, 3, NULL, &c.err), QWENRT_OK);
    assert_int_equal(qwenrt_session_snapshot(s, &c.cp, &c.err), QWENRT_OK);
    snprintf(c.path, sizeof(c.path), "%s/state.ckpt", tmpdir);
    with_fsize_limit(64 << 10, do_checkpoint, &c);
    assert_int_equal(c.st, QWENRT_ERR_IO);
    assert_no_output(c.path);

    /* the same writes succeed with room on the disk (so the failures above were the limit) */
    do_checkpoint(&c);
    assert_int_equal(c.st, QWENRT_OK);
    snprintf(c.path, sizeof(c.path), "%s/out.gguf", tmpdir);
    do_convert(&c);
    assert_int_equal(c.st, QWENRT_OK);
    qwenrt_checkpoint_free(c.cp);
    qwenrt_session_free(s);
    qwenrt_model_free(c.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_state_does_not_fit),
        cmocka_unit_test(test_prefill_activations_do_not_fit),
        cmocka_unit_test(test_model_does_not_fit),
        cmocka_unit_test(test_full_disk_leaves_no_partial_output),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
