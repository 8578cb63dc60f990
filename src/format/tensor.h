/*
 * tensor.h — a named, typed view of a tensor inside a mapped model file.
 *
 * Shapes use ggml's order: ne[0] is the contiguous (fastest-varying) dimension, i.e. the row
 * length. A Hugging Face weight of shape [out, in] has ne = {in, out, 1, 1}. Views never own
 * their data; it lives in the mapped file (or, for the few tensors a loader transforms, in a
 * buffer owned by the model).
 */
#ifndef QWENRT_FORMAT_TENSOR_H
#define QWENRT_FORMAT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"

#define QR_MAX_DIMS 4

struct qr_tensor {
    const char *name;     /* name in the file (HF or GGUF spelling), owned by the reader */
    enum qr_dtype dtype;  /* element type */
    int32_t n_dims;       /* 1..4 */
    int64_t ne[QR_MAX_DIMS]; /* elements per dimension, ggml order; unused dims are 1 */
    const void *data;     /* first byte of the tensor */
    size_t nbytes;        /* bytes of data */
};

static inline int64_t tensor_nelements(const struct qr_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* Number of rows (product of dims 1..3). */
static inline int64_t tensor_nrows(const struct qr_tensor *t)
{
    return t->ne[1] * t->ne[2] * t->ne[3];
}

#endif
