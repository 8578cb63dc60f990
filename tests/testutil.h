/*
 * testutil.h — helpers shared by the C tests: cmocka includes, relative error, the sampler's
 * token ranking, reading reference tensors from a fixture's reference.safetensors, a fixture
 * opened with its model.
 */
#ifndef QWENRT_TESTUTIL_H
#define QWENRT_TESTUTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "format/safetensors.h"
#include "model/model.h"
#include "qwenrt.h"

/* ||a - b|| / ||b|| over n floats */
static inline double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static inline int32_t argmax_f(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The sampler's ranking (sampler.c, topk.cu): tokens by logit / t, larger first, then the
 * lower id; NaN last. */
struct test_ranked {
    float key;
    int32_t id;
};

static inline int test_ranked_cmp(const void *a, const void *b)
{
    const struct test_ranked *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ids[0..m): the m best of logits l[0..V) in that order, by a plain sort (the reference). */
static inline void test_best_tokens(const float *l, int32_t V, float t, int32_t m, int32_t *ids)
{
    struct test_ranked *r = malloc((size_t)V * sizeof(*r));
    assert_non_null(r);
    for (int32_t i = 0; i < V; i++)
        r[i].key = l[i] != l[i] ? -INFINITY : l[i] / t, r[i].id = i;
    qsort(r, (size_t)V, sizeof(*r), test_ranked_cmp);
    for (int32_t i = 0; i < m; i++)
        ids[i] = r[i].id;
    free(r);
}

/* The tensor `name` of an open safetensors file; fails the test when absent. */
static inline const struct qr_tensor *ref_tensor(const struct safetensors_file *sf, const char *name)
{
    const struct qr_tensor *t = safetensors_find(sf, name);
    if (!t)
        fail_msg("reference tensor '%s' missing", name);
    return t;
}

/* Every quantised product of model m (its matmuls and LM head) bound to the CPU's .exact
 * kernel: x in f32 instead of rounded to 8 bits, the reference that products with float x (the
 * GPU's exact precision, float weights, converted matrices) are measured from. */
static inline void test_bind_f32_x(struct qwenrt_model *m)
{
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < m->plans[ph].n_ops; i++) {
            struct plan_op *op = &m->plans[ph].ops[i];
            if (!op->w || dtype_is_float(op->w->dtype) || (op->kind != OP_LOGITS && op->kind != OP_MATMUL))
                continue;
            enum qr_dtype t = op->w->dtype;
            if (op->kind == OP_LOGITS)
                op->kernel = "logits.exact";
            else if (op->kind == OP_MATMUL)
                op->kernel = t == QR_Q8_0 ? "matmul.q8_0.exact" : t == QR_Q4_0 ? "matmul.q4_0.exact"
                           : t == QR_Q4_K ? "matmul.q4_k.exact" : t == QR_Q5_K ? "matmul.q5_k.exact"
                           : t == QR_Q6_K ? "matmul.q6_k.exact" : NULL;
            if (!op->kernel)
                fail_msg("no f32-x kernel for %s", dtype_traits(t)->name);
        }
}

/* A fresh directory /tmp/qwenrt-<tag>-XXXXXX in buf (for a test group's setup): 0 or -1. */
static inline int test_tmpdir_make(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "/tmp/qwenrt-%s-XXXXXX", tag);
    return mkdtemp(buf) ? 0 : -1;
}

/* Removes a directory made by test_tmpdir_make and everything in it: 0 or -1. */
static inline int test_tmpdir_remove(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A test group's scratch directory: defines `tmpdir` and the group's `setup` and `teardown`,
 * which make it (test_tmpdir_make with tag) and remove it, for cmocka_run_group_tests(tests,
 * setup, teardown). */
#define TEST_GROUP_TMPDIR(tag)                                                                     \
    static char tmpdir[64];                                                                        \
    static int setup(void **group_state)                                                           \
    {                                                                                              \
        (void)group_state;                                                                         \
        return test_tmpdir_make(tmpdir, sizeof(tmpdir), tag);                                      \
    }                                                                                              \
    static int teardown(void **group_state)                                                        \
    {                                                                                              \
        (void)group_state;                                                                         \
        return test_tmpdir_remove(tmpdir);                                                         \
    }

/* A fixture directory opened with its transformers reference (prompt, greedy ids, the
 * decode logits after the prompt and each generated id) and its model loaded. */
struct ref_fixture {
    struct safetensors_file ref;
    const int32_t *prompt, *gen;
    int32_t T, G, V;
    const float *dlog; /* [G][V] */
    struct qwenrt_model *m;
};

static inline void ref_fixture_open(struct ref_fixture *f, const char *dir, int n_threads)
{
    char path[512];
    struct qwenrt_error err = {0};
    snprintf(path, sizeof(path), "%s/reference.safetensors", dir);
    if (safetensors_open(&f->ref, path, &err) != QWENRT_OK)
        fail_msg("%s: %s", path, err.message);
    const struct qr_tensor *p = ref_tensor(&f->ref, "prompt_ids"),
                           *g = ref_tensor(&f->ref, "generated_ids"),
                           *d = ref_tensor(&f->ref, "decode_logits");
    f->prompt = p->data, f->gen = g->data, f->dlog = d->data;
    f->T = (int32_t)p->ne[0], f->G = (int32_t)g->ne[0], f->V = (int32_t)d->ne[0];
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = n_threads;
    if (qwenrt_model_load(dir, &mp, &f->m, &err) != QWENRT_OK)
        fail_msg("load %s: %s", dir, err.message);
}

static inline void ref_fixture_close(struct ref_fixture *f)
{
    qwenrt_model_free(f->m);
    safetensors_close(&f->ref);
}

#endif
