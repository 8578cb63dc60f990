/*
 * cuda_testutil.h — what the CUDA test programs share (test_cuda_ops.c, test_cuda_graph.c,
 * test_cuda_batch.c, test_cuda_backend.c): their includes, the CPU's logits tolerance, a seeded
 * random source, the fixture directories, the argmax check, synth models of the tiny presets
 * (widened to real widths where asked) and pairs of CUDA sessions over them, and the start of
 * each program: without a usable GPU (or without CUDA) a program runs its host-only tests, if
 * it has any, and otherwise exits with 77, which ctest reports as skipped (cmake/cuda.cmake).
 * QWENRT_TEST_FILTER=pattern (cmocka's: * and ? wildcards) runs only the matching tests: GPU
 * time is scarce, a device call may check one change.
 */
#ifndef QWENRT_CUDA_TESTUTIL_H
#define QWENRT_CUDA_TESTUTIL_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_checks.h"
#include "base/cpu_features.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "qwenrt.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "testutil.h"
#include "tools/calibrate.h"
#include "tools/convert.h"
#include "tools/gguf_export.h"
#include "tools/synth.h"
#include "tools/tool_setup.h"

#define LOGITS_REL_TOL 1e-4 /* issue 2/4/6: the CPU's tolerance for f32-computed logits */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* Same argmax as the reference wherever the reference's margin is above min_margin. */
static inline void check_argmax(const float *out, const float *ref, int32_t T, int32_t V,
                                double min_margin, const char *what)
{
    for (int32_t t = 0; t < T; t++) {
        const float *r = ref + (size_t)t * V;
        int32_t best = argmax_f(r, V);
        float second = -INFINITY;
        for (int32_t v = 0; v < V; v++)
            if (v != best && r[v] > second)
                second = r[v];
        if (r[best] - second > min_margin && argmax_f(out + (size_t)t * V, V) != best)
            fail_msg("%s: position %d: argmax %d, reference %d (margin %.3g)", what, t,
                     argmax_f(out + (size_t)t * V, V), best, r[best] - second);
    }
}

static const char *const fixtures[] = {"tests/data/qwen3-tiny-f32", "tests/data/qwen3-tiny-bf16",
                                       "tests/data/qwen35-tiny-f32", "tests/data/qwen35-tiny-bf16"};

/* The synth model of hyperparameters hp (arch's preset, changed) in type, written as a GGUF at
 * path (the caller removes it; tag tells test files apart) and loaded for the CPU. */
static inline struct qwenrt_model *write_load_synth(const char *arch,
                                                    const struct model_hparams *hp,
                                                    enum export_type type, const char *tag,
                                                    char *path, size_t path_size)
{
    struct qwenrt_error err = {0};
    snprintf(path, path_size, "/tmp/qwenrt-test-synth%s-%s-%d-%d.gguf", tag, arch, (int)type,
             (int)getpid());
    struct export_params ep = {.type = type, .name = arch, .tied = true};
    if (synth_write(path, hp, 77, &ep, &err))
        fail_msg("synth %s: %s", arch, err.message);
    struct qwenrt_model *m = NULL;
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.backend = "cpu";
    if (qwenrt_model_load(path, &mp, &m, &err))
        fail_msg("load %s: %s", path, err.message);
    return m;
}

/* A synth model of arch's tiny preset in type, widened to width (0: as is; 1024 with Qwen3:
 * Qwen3-0.6B's head geometry), loaded from a GGUF at path (the caller removes it). */
static inline struct qwenrt_model *load_synth_ssm(const char *arch, enum export_type type,
                                                  int32_t width, bool own_key_heads,
                                                  int32_t ssm_dim, char *path, size_t path_size)
{
    struct qwenrt_error err = {0};
    struct model_hparams hp;
    assert_int_equal(synth_preset(arch, &hp, &err), QWENRT_OK);
    if (own_key_heads) /* Hv == Hk, as in Qwen3.5-0.8B: the graph's conv runs inside its core */
        hp.ssm_n_v_heads = hp.ssm_n_k_heads;
    if (ssm_dim) /* DeltaNet heads of ssm_dim x ssm_dim (Qwen3.5-0.8B: 128) */
        hp.ssm_k_dim = hp.ssm_v_dim = ssm_dim;
    if (width) {
        hp.n_embd = width, hp.n_ff = 3 * width;
        hp.n_head = width / hp.head_dim;
    }
    if (width >= 1024 && hp.arch == ARCH_QWEN3) { /* Qwen3-0.6B's widths: o-proj K = 2048 */
        hp.head_dim = hp.n_rot = 128;
        hp.n_head = 2 * width / 128, hp.n_head_kv = width / 128;
    }
    return write_load_synth(arch, &hp, type, "", path, path_size);
}

static inline struct qwenrt_model *load_synth(const char *arch, enum export_type type,
                                              int32_t width, bool own_key_heads, char *path,
                                              size_t path_size)
{
    return load_synth_ssm(arch, type, width, own_key_heads, 0, path, path_size);
}

/* Frees what check_mega_synth and check_attention_rope hold: two sessions of a synth model,
 * the model, its file and two logits rows. */
static inline void free_synth_pair(struct cuda_session *a, struct cuda_session *b,
                                   struct qwenrt_model *m, const char *path, float *la, float *lb)
{
    free(la);
    free(lb);
    cuda_session_free(a);
    cuda_session_free(b);
    qwenrt_model_free(m);
    remove(path);
}

/* Two CUDA sessions of model m (n_ctx positions) with options on and off; fails the test
 * naming what when either cannot be made. */
static inline void init_pair(const struct qwenrt_model *m, int32_t n_ctx,
                             const struct cuda_options *on, const struct cuda_options *off,
                             struct cuda_session **a, struct cuda_session **b, const char *what)
{
    struct qwenrt_error err = {0};
    *a = *b = NULL;
    if (cuda_session_init(m->plans, n_ctx, on, a, &err) ||
        cuda_session_init(m->plans, n_ctx, off, b, &err))
        fail_msg("%s: %s", what, err.message);
}

/* Whether a GPU can run the tests; prints the device, or why the GPU tests are skipped. */
static inline bool cuda_tests_device(void)
{
    struct qwenrt_error err = {0};
    if (cuda_probe(0, &err) != QWENRT_OK) {
        printf("CUDA tests skipped: %s\n", err.message);
        return false;
    }
    char dev[256];
    cuda_device_describe(dev, sizeof(dev));
    printf("device: %s\n", dev);
    return true;
}

/* QWENRT_TEST_FILTER, when set, as cmocka's test filter. */
static inline void cuda_tests_filter(void)
{
    const char *filter = getenv("QWENRT_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
}

#endif
