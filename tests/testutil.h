/*
 * testutil.h — helpers shared by the C tests: cmocka includes, relative error, reading
 * reference tensors from a fixture's reference.safetensors.
 */
#ifndef QWENRT_TESTUTIL_H
#define QWENRT_TESTUTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "format/safetensors.h"

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

/* The tensor `name` of an open safetensors file; fails the test when absent. */
static inline const struct qr_tensor *ref_tensor(const struct safetensors_file *sf, const char *name)
{
    const struct qr_tensor *t = safetensors_find(sf, name);
    if (!t)
        fail_msg("reference tensor '%s' missing", name);
    return t;
}

#endif
