/*
 * safetensors.h — reading (memory-mapped) and writing Hugging Face .safetensors files.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
 * then the data region; offsets are relative to its start. The reader validates the whole
 * header against the file size (lengths, offsets, dtype sizes, overlaps) before any tensor is
 * handed out, so a view never points outside the mapping.
 */
#ifndef QWENRT_FORMAT_SAFETENSORS_H
#define QWENRT_FORMAT_SAFETENSORS_H

#include "base/mapfile.h"
#include "format/tensor.h"
#include "qwenrt.h"

#define SAFETENSORS_MAX_HEADER (100u << 20) /* 100 MiB of JSON header at most */

struct safetensors_file {
    struct mapped_file map;
    struct qr_tensor *tensors; /* [n_tensors], sorted by data offset */
    int32_t n_tensors;
    char *names;               /* storage of every tensor name, NUL-separated */
};

qwenrt_status safetensors_open(struct safetensors_file *sf, const char *path,
                               struct qwenrt_error *err);
void safetensors_close(struct safetensors_file *sf);

/* The tensor called name, or NULL. */
const struct qr_tensor *safetensors_find(const struct safetensors_file *sf, const char *name);

/* A tensor to write: shape in safetensors (row-major, outermost first) order. */
struct safetensors_out {
    const char *name;
    enum qr_dtype dtype;
    int32_t n_dims;
    int64_t shape[QR_MAX_DIMS];
    const void *data;
};

/* Writes tensors to path (via a temporary file renamed at the end). */
qwenrt_status safetensors_write(const char *path, const struct safetensors_out *tensors,
                                int32_t n, struct qwenrt_error *err);

/* safetensors dtype names ("F32", "BF16", ...) <-> qr_dtype. */
enum qr_dtype safetensors_dtype_from_name(const char *name);
const char *safetensors_dtype_name(enum qr_dtype t);

#endif
