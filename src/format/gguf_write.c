/*
 * gguf_write.c — the GGUF v3 writer (see gguf.h); the reader is gguf.c.
 *
 * The writer collects deep copies of key/values (in first-set order; a re-set replaces the
 * value in place) and borrowed tensor data, then writes in one pass: header, key/values,
 * tensor infos with offsets aligned to `general.alignment` (u32 key if set, else 32), zero
 * padding to the alignment, then each tensor's data followed by zero padding to the alignment
 * (after the last tensor too, as llama.cpp does). The file is written as path.tmp, flushed,
 * fsync'ed and renamed over path, so a failure leaves nothing at path and the tmp file is
 * removed. Nested arrays are written if given (qwenrt itself never sets them).
 */
#include "format/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"

struct writer_tensor {
    char *name;              /* owned copy */
    enum qr_dtype dtype;     /* ggml type id */
    int32_t n_dims;          /* 1..4 */
    int64_t ne[QR_MAX_DIMS]; /* ggml order, unused dims 1 */
    const void *data;        /* borrowed until gguf_writer_write returns */
    size_t nbytes;           /* bytes of data */
};

struct gguf_writer {
    struct gguf_kv *kvs; /* [n_kv] in first-set order, values deep-copied */
    int64_t n_kv, cap_kv;
    struct writer_tensor *tensors; /* [n_tensors] in insertion order */
    int64_t n_tensors, cap_tensors;
};

qwenrt_status gguf_writer_init(struct gguf_writer **out, struct qwenrt_error *err)
{
    *out = xcalloc(1, sizeof(**out));
    if (!*out)
        return err_set(err, QWENRT_ERR_NOMEM, "gguf writer: out of memory");
    return QWENRT_OK;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        xfree(w->kvs[i].key);
        gguf_value_free(&w->kvs[i].value);
    }
    xfree(w->kvs);
    for (int64_t i = 0; i < w->n_tensors; i++)
        xfree(w->tensors[i].name);
    xfree(w->tensors);
    xfree(w);
}

/* Deep copy of src into dst (zeroed on failure). INVALID_ARG for a malformed value. */
static qwenrt_status value_copy(struct gguf_value *dst, const struct gguf_value *src)
{
    memset(dst, 0, sizeof(*dst));
    if ((unsigned)src->type >= GGUF_TYPE_COUNT)
        return QWENRT_ERR_INVALID_ARG;
    *dst = *src;
    if (src->type == GGUF_TYPE_STRING) {
        if (!src->v.str.str && src->v.str.len)
            return QWENRT_ERR_INVALID_ARG;
        dst->v.str.str = xstrndup(src->v.str.str ? src->v.str.str : "", (size_t)src->v.str.len);
        return dst->v.str.str ? QWENRT_OK : QWENRT_ERR_NOMEM;
    }
    if (src->type != GGUF_TYPE_ARRAY)
        return QWENRT_OK;
    uint64_t n = src->v.arr.count;
    if ((unsigned)src->v.arr.elem_type >= GGUF_TYPE_COUNT || (n && !src->v.arr.items) ||
        n > GGUF_MAX_ARRAY)
        return QWENRT_ERR_INVALID_ARG;
    dst->v.arr.count = 0;
    dst->v.arr.items = xcalloc(n ? (size_t)n : 1, sizeof(*dst->v.arr.items));
    if (!dst->v.arr.items)
        return QWENRT_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        qwenrt_status st = QWENRT_ERR_INVALID_ARG;
        if (src->v.arr.items[i].type == src->v.arr.elem_type)
            st = value_copy(&dst->v.arr.items[i], &src->v.arr.items[i]);
        dst->v.arr.count = i + 1;
        if (st) {
            gguf_value_free(dst);
            return st;
        }
    }
    return QWENRT_OK;
}

/* Makes room for one more element in an array of cap elements of size sz. */
static bool grow(void **p, int64_t n, int64_t *cap, size_t sz)
{
    if (n < *cap)
        return true;
    int64_t nc = *cap ? *cap * 2 : 16;
    void *np = xrealloc(*p, (size_t)nc, sz);
    if (!np)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

qwenrt_status gguf_writer_set(struct gguf_writer *w, const char *key, const struct gguf_value *v)
{
    if (!w || !key || !v)
        return QWENRT_ERR_INVALID_ARG;
    struct gguf_value copy;
    qwenrt_status st = value_copy(&copy, v);
    if (st)
        return st;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            gguf_value_free(&w->kvs[i].value);
            w->kvs[i].value = copy;
            return QWENRT_OK;
        }
    }
    char *k = NULL;
    if (w->n_kv >= GGUF_MAX_KV)
        st = QWENRT_ERR_LIMIT;
    else if (!grow((void **)&w->kvs, w->n_kv, &w->cap_kv, sizeof(*w->kvs)) || !(k = xstrdup(key)))
        st = QWENRT_ERR_NOMEM;
    if (st) {
        gguf_value_free(&copy);
        return st;
    }
    w->kvs[w->n_kv++] = (struct gguf_kv){k, copy};
    return QWENRT_OK;
}

qwenrt_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    struct gguf_value val = {.type = GGUF_TYPE_UINT32, .v.u64 = v};
    return gguf_writer_set(w, key, &val);
}

qwenrt_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    struct gguf_value val = {.type = GGUF_TYPE_INT32, .v.i64 = v};
    return gguf_writer_set(w, key, &val);
}

qwenrt_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    struct gguf_value val = {.type = GGUF_TYPE_FLOAT32, .v.f64 = v};
    return gguf_writer_set(w, key, &val);
}

qwenrt_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
    struct gguf_value val = {.type = GGUF_TYPE_BOOL, .v.u64 = v};
    return gguf_writer_set(w, key, &val);
}

qwenrt_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return QWENRT_ERR_INVALID_ARG;
    struct gguf_value val = {.type = GGUF_TYPE_STRING};
    val.v.str.str = (char *)v; /* only read: gguf_writer_set copies it */
    val.v.str.len = strlen(v);
    return gguf_writer_set(w, key, &val);
}

/* Sets an array of n i32, f32, bool or string elements read from src (of that C type). */
static qwenrt_status set_array(struct gguf_writer *w, const char *key, enum gguf_type et,
                               uint64_t n, const void *src)
{
    if (n && !src)
        return QWENRT_ERR_INVALID_ARG;
    if (n > GGUF_MAX_ARRAY)
        return QWENRT_ERR_LIMIT;
    struct gguf_value val = {.type = GGUF_TYPE_ARRAY};
    val.v.arr.elem_type = et;
    val.v.arr.count = n;
    val.v.arr.items = xcalloc(n ? (size_t)n : 1, sizeof(*val.v.arr.items));
    if (!val.v.arr.items)
        return QWENRT_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_value *it = &val.v.arr.items[i];
        it->type = et;
        if (et == GGUF_TYPE_INT32)
            it->v.i64 = ((const int32_t *)src)[i];
        else if (et == GGUF_TYPE_FLOAT32)
            it->v.f64 = ((const float *)src)[i];
        else if (et == GGUF_TYPE_BOOL)
            it->v.u64 = ((const bool *)src)[i];
        else {
            const char *s = ((const char *const *)src)[i];
            it->v.str.str = (char *)s; /* only read: copied by gguf_writer_set */
            it->v.str.len = s ? strlen(s) : 0;
        }
    }
    qwenrt_status st = gguf_writer_set(w, key, &val);
    xfree(val.v.arr.items); /* the items borrowed the caller's strings: free only the array */
    return st;
}

qwenrt_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                                      uint64_t n)
{
    return set_array(w, key, GGUF_TYPE_STRING, n, v);
}

qwenrt_status gguf_writer_set_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v,
                                      uint64_t n)
{
    return set_array(w, key, GGUF_TYPE_INT32, n, v);
}

qwenrt_status gguf_writer_set_arr_f32(struct gguf_writer *w, const char *key, const float *v,
                                      uint64_t n)
{
    return set_array(w, key, GGUF_TYPE_FLOAT32, n, v);
}

qwenrt_status gguf_writer_set_arr_bool(struct gguf_writer *w, const char *key, const bool *v,
                                       uint64_t n)
{
    return set_array(w, key, GGUF_TYPE_BOOL, n, v);
}

/* Byte size of a tensor of the given type and shape; false when invalid. */
static bool tensor_bytes(enum qr_dtype dtype, int32_t n_dims, const int64_t *ne, size_t *out)
{
    size_t row;
    if ((int32_t)dtype >= 200 || n_dims < 1 || n_dims > QR_MAX_DIMS ||
        !dtype_row_bytes(dtype, ne[0], &row))
        return false;
    size_t total = row;
    for (int32_t d = 1; d < n_dims; d++)
        if (ne[d] < 0 || size_mul_overflows(total, (size_t)ne[d], &total))
            return false;
    *out = total;
    return true;
}

qwenrt_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum qr_dtype dtype,
                                     int32_t n_dims, const int64_t *ne, const void *data)
{
    size_t nbytes;
    if (!w || !name || !ne || !tensor_bytes(dtype, n_dims, ne, &nbytes) || (nbytes && !data))
        return QWENRT_ERR_INVALID_ARG;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return QWENRT_ERR_INVALID_ARG;
    if (w->n_tensors >= GGUF_MAX_TENSORS)
        return QWENRT_ERR_LIMIT;
    if (!grow((void **)&w->tensors, w->n_tensors, &w->cap_tensors, sizeof(*w->tensors)))
        return QWENRT_ERR_NOMEM;
    struct writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    if (!(t->name = xstrdup(name)))
        return QWENRT_ERR_NOMEM;
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < QR_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data;
    t->nbytes = nbytes;
    w->n_tensors++;
    return QWENRT_OK;
}

/* ------------------------------------------------------------- serialising */

/* Output stream that remembers the first failure and counts bytes written. */
struct out {
    FILE *f;
    bool ok;
    uint64_t pos;
};

static void put(struct out *o, const void *p, size_t n)
{
    if (o->ok && n && fwrite(p, 1, n, o->f) != n)
        o->ok = false;
    o->pos += n;
}

static void put_le(struct out *o, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, (size_t)n);
}

static void put_str(struct out *o, const char *s, uint64_t len)
{
    put_le(o, len, 8);
    put(o, s, (size_t)len);
}

static void put_pad(struct out *o, uint32_t align)
{
    static const uint8_t zeros[256];
    uint64_t n = (align - o->pos % align) % align;
    while (n) {
        size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
        put(o, zeros, k);
        n -= k;
    }
}

static void put_value(struct out *o, const struct gguf_value *v)
{
    float f;
    uint32_t u;
    uint64_t u64;
    switch (v->type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL:
        put_le(o, v->v.u64, 1);
        break;
    case GGUF_TYPE_INT8:
        put_le(o, (uint64_t)v->v.i64, 1);
        break;
    case GGUF_TYPE_UINT16:
        put_le(o, v->v.u64, 2);
        break;
    case GGUF_TYPE_INT16:
        put_le(o, (uint64_t)v->v.i64, 2);
        break;
    case GGUF_TYPE_UINT32:
        put_le(o, v->v.u64, 4);
        break;
    case GGUF_TYPE_INT32:
        put_le(o, (uint64_t)v->v.i64, 4);
        break;
    case GGUF_TYPE_UINT64:
        put_le(o, v->v.u64, 8);
        break;
    case GGUF_TYPE_INT64:
        put_le(o, (uint64_t)v->v.i64, 8);
        break;
    case GGUF_TYPE_FLOAT32:
        f = (float)v->v.f64;
        memcpy(&u, &f, 4);
        put_le(o, u, 4);
        break;
    case GGUF_TYPE_FLOAT64:
        memcpy(&u64, &v->v.f64, 8);
        put_le(o, u64, 8);
        break;
    case GGUF_TYPE_STRING:
        put_str(o, v->v.str.str, v->v.str.len);
        break;
    case GGUF_TYPE_ARRAY:
        put_le(o, (uint64_t)v->v.arr.elem_type, 4);
        put_le(o, v->v.arr.count, 8);
        for (uint64_t i = 0; i < v->v.arr.count; i++)
            put_value(o, &v->v.arr.items[i]);
        break;
    default:
        o->ok = false;
        break;
    }
}

/* Alignment from general.alignment (u32, nonzero power of two) or the default. */
static qwenrt_status writer_alignment(const struct gguf_writer *w, const char *path, uint32_t *out,
                                      struct qwenrt_error *err)
{
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0)
            continue;
        const struct gguf_value *v = &w->kvs[i].value;
        if (v->type != GGUF_TYPE_UINT32 || v->v.u64 == 0 || (v->v.u64 & (v->v.u64 - 1)))
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "%s: key 'general.alignment': must be a u32 nonzero power of two", path);
        *out = (uint32_t)v->v.u64;
    }
    return QWENRT_OK;
}

/* Writes header, key/values and tensor infos, then the padding before the data section. */
static void put_meta(struct out *o, const struct gguf_writer *w, uint32_t align)
{
    put(o, "GGUF", 4);
    put_le(o, 3, 4);
    put_le(o, (uint64_t)w->n_tensors, 8);
    put_le(o, (uint64_t)w->n_kv, 8);
    for (int64_t i = 0; i < w->n_kv; i++) {
        put_str(o, w->kvs[i].key, strlen(w->kvs[i].key));
        put_le(o, (uint64_t)w->kvs[i].value.type, 4);
        put_value(o, &w->kvs[i].value);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        put_str(o, t->name, strlen(t->name));
        put_le(o, (uint64_t)t->n_dims, 4);
        for (int32_t d = 0; d < t->n_dims; d++)
            put_le(o, (uint64_t)t->ne[d], 8);
        put_le(o, (uint64_t)t->dtype, 4);
        put_le(o, off, 8);
        off += (t->nbytes + align - 1) / align * align;
    }
    put_pad(o, align);
}

/* Writes everything into the open tmp file. */
static qwenrt_status put_all(struct out *o, const struct gguf_writer *w, uint32_t align,
                             const char *path, gguf_progress_fn progress, void *user,
                             struct qwenrt_error *err)
{
    uint64_t total = 0, done = 0;
    for (int64_t i = 0; i < w->n_tensors; i++)
        total += w->tensors[i].nbytes;
    put_meta(o, w, align);
    for (int64_t i = 0; i < w->n_tensors && o->ok; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        put(o, t->data, t->nbytes);
        put_pad(o, align);
        done += t->nbytes;
        if (progress && o->ok)
            progress(user, t->name, done, total);
    }
    if (!o->ok)
        return err_set(err, QWENRT_ERR_IO, "%s: write failed after %llu bytes: %s", path,
                       (unsigned long long)o->pos, strerror(errno));
    return QWENRT_OK;
}

qwenrt_status gguf_writer_write(struct gguf_writer *w, const char *path, gguf_progress_fn progress,
                                void *user, struct qwenrt_error *err)
{
    if (!w || !path)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "gguf writer: no writer or path");
    uint32_t align;
    qwenrt_status st = writer_alignment(w, path, &align, err);
    if (st)
        return st;
    char *tmp = xmalloc(strlen(path) + 5, 1);
    if (!tmp)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, strlen(path) + 5, "%s.tmp", path);
    struct out o = {fopen(tmp, "wb"), true, 0};
    if (!o.f) {
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out_free;
    }
    st = put_all(&o, w, align, path, progress, user, err);
    if (!st && (fflush(o.f) != 0 || fsync(fileno(o.f)) != 0))
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot flush: %s", tmp, strerror(errno));
    if (fclose(o.f) != 0 && !st)
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot close: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp,
                     strerror(errno));
    if (st)
        unlink(tmp);
out_free:
    xfree(tmp);
    return st;
}
