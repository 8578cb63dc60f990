/*
 * gguf.h — reading (memory-mapped) and writing llama.cpp GGUF v3 files.
 *
 * Container (little-endian): "GGUF", u32 version, i64 n_tensors, i64 n_kv; n_kv key/values
 * (string key, i32 type, value; arrays are i32 elem_type + u64 count + elements); n_tensors
 * infos (string name, u32 n_dims, i64 ne[n_dims], i32 ggml type, u64 offset); padding to
 * `general.alignment` (default 32); the data section. See docs/gguf-and-quant.md in ../shared.
 *
 * The reader validates every count, length and offset against the file size and the limits
 * below before trusting it; tensor views point into the mapping. Strings returned by the
 * accessors are NUL-terminated copies owned by the gguf_file.
 */
#ifndef QWENRT_FORMAT_GGUF_H
#define QWENRT_FORMAT_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "base/mapfile.h"
#include "format/tensor.h"
#include "qwenrt.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_TENSORS 65536     /* far above any Qwen model (~400) */
#define GGUF_MAX_KV 65536
#define GGUF_MAX_STRING (64u << 20) /* one string (e.g. a chat template) */
#define GGUF_MAX_ARRAY (64u << 20)  /* elements of one array (vocabularies are ~250k) */

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

struct gguf_string {
    char *str;    /* NUL-terminated copy (may contain NULs inside; use len) */
    uint64_t len; /* bytes, without the terminating NUL */
};

struct gguf_value {
    enum gguf_type type;
    union {
        uint64_t u64; /* every unsigned integer type and bool */
        int64_t i64;  /* every signed integer type */
        double f64;   /* FLOAT32 and FLOAT64 */
        struct gguf_string str;
        struct {
            enum gguf_type elem_type; /* never ARRAY in files qwenrt writes; nested arrays are read */
            uint64_t count;
            struct gguf_value *items; /* [count] */
        } arr;
    } v;
};

struct gguf_kv {
    char *key;
    struct gguf_value value;
};

struct gguf_file {
    struct mapped_file map;
    uint32_t version;
    struct gguf_kv *kvs;        /* [n_kv] in file order */
    int64_t n_kv;
    struct qr_tensor *tensors;  /* [n_tensors] in file order; names owned by the gguf_file */
    int64_t n_tensors;
    uint32_t alignment;
    uint64_t data_offset;       /* file offset of the data section */
};

/* Frees what a value owns (strings, array items, recursively) and zeroes it; NULL is fine. */
void gguf_value_free(struct gguf_value *v);

/* Errors: IO, FORMAT (bad magic/version, truncated, counts or offsets that lie), LIMIT. */
qwenrt_status gguf_open(struct gguf_file *gf, const char *path, struct qwenrt_error *err);
void gguf_close(struct gguf_file *gf);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *gf, const char *key);
const struct qr_tensor *gguf_find_tensor(const struct gguf_file *gf, const char *name);

/* Typed getters: false when the key is missing or of an incompatible type.
 * gguf_get_int accepts any integer type or bool; gguf_get_float any float or integer type. */
bool gguf_get_int(const struct gguf_file *gf, const char *key, int64_t *out);
bool gguf_get_float(const struct gguf_file *gf, const char *key, double *out);
bool gguf_get_bool(const struct gguf_file *gf, const char *key, bool *out);
const char *gguf_get_string(const struct gguf_file *gf, const char *key); /* NULL if absent */
/* An array value (items of arr), or NULL when the key is missing or not an array. */
const struct gguf_value *gguf_get_array(const struct gguf_file *gf, const char *key);

/* ----------------------------------------------------------------- writer */

struct gguf_writer;

qwenrt_status gguf_writer_init(struct gguf_writer **out, struct qwenrt_error *err);
void gguf_writer_free(struct gguf_writer *w);

/* Key/values are written in the order they are set; setting a key again replaces it. */
qwenrt_status gguf_writer_set(struct gguf_writer *w, const char *key, const struct gguf_value *v);
qwenrt_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
qwenrt_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
qwenrt_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
qwenrt_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
qwenrt_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
qwenrt_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                      const char *const *v, uint64_t n);
qwenrt_status gguf_writer_set_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v,
                                      uint64_t n);
qwenrt_status gguf_writer_set_arr_f32(struct gguf_writer *w, const char *key, const float *v,
                                      uint64_t n);
qwenrt_status gguf_writer_set_arr_bool(struct gguf_writer *w, const char *key, const bool *v,
                                       uint64_t n);

/* Adds a tensor; data is borrowed until gguf_writer_write returns (ne in ggml order). */
qwenrt_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum qr_dtype dtype,
                                     int32_t n_dims, const int64_t *ne, const void *data);

/* Progress callback: called after each tensor is written (may be NULL). */
typedef void (*gguf_progress_fn)(void *user, const char *tensor_name, uint64_t bytes_done,
                                 uint64_t bytes_total);

/* Writes everything to path through path.tmp + rename: an interrupted or failed write leaves
 * no partial file at path. */
qwenrt_status gguf_writer_write(struct gguf_writer *w, const char *path, gguf_progress_fn progress,
                                void *user, struct qwenrt_error *err);

#endif
