/*
 * gguf.c — the GGUF v2/v3 reader (see gguf.h); the writer is gguf_write.c.
 *
 * gguf_open maps the file and walks it with a bounds-checked cursor: header, key/values
 * (recursing into nested arrays up to MAX_DEPTH), tensor infos, then the data section at
 * align_up(end of infos, general.alignment). Every length and count is checked against the
 * bytes left in the file and the GGUF_MAX_* limits before anything is allocated, so a hostile
 * file can only make us allocate in proportion to its own size (an array item costs at least
 * one file byte and sizeof(struct gguf_value) of memory). Tensor views point into the mapping
 * and are checked to lie inside the file, on the alignment, and not to overlap each other.
 * Duplicate keys and tensor names are rejected (found by sorting, so hostile counts stay
 * O(n log n)). Status: FORMAT for lies and truncation, LIMIT for counts past GGUF_MAX_*,
 * UNSUPPORTED for ggml types qwenrt has no traits for (IQ*, TQ*, MXFP4, ...).
 */
#include "format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define MAX_DEPTH 4 /* nested array levels accepted when reading */

/* Bounds-checked reading position in the mapping. */
struct cursor {
    const uint8_t *data; /* mapping */
    size_t size;         /* bytes in the mapping */
    size_t pos;          /* next byte to read */
    const char *path;    /* for messages */
};

static size_t left(const struct cursor *c)
{
    return c->size - c->pos;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Reads an n-byte little-endian integer; what names the field for the message. */
static qwenrt_status rd_uint(struct cursor *c, int n, uint64_t *out, const char *what,
                             struct qwenrt_error *err)
{
    *out = 0;
    if (left(c) < (size_t)n)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: truncated: %s needs %d bytes at offset %zu but the file has %zu",
                       c->path, what, n, c->pos, c->size);
    *out = load_le(c->data + c->pos, n);
    c->pos += (size_t)n;
    return QWENRT_OK;
}

/* Reads a GGUF string (u64 length + bytes) into a NUL-terminated copy. */
static qwenrt_status rd_string(struct cursor *c, struct gguf_string *s, const char *what,
                               struct qwenrt_error *err)
{
    uint64_t len;
    qwenrt_status st = rd_uint(c, 8, &len, what, err);
    if (st)
        return st;
    if (len > GGUF_MAX_STRING)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: %s: string length %llu exceeds the limit %u",
                       c->path, what, (unsigned long long)len, GGUF_MAX_STRING);
    if (len > left(c))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s: string length %llu runs past the end of the file (%zu bytes left)",
                       c->path, what, (unsigned long long)len, left(c));
    s->str = xstrndup((const char *)c->data + c->pos, (size_t)len);
    if (!s->str)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: %s: out of memory for a %llu-byte string",
                       c->path, what, (unsigned long long)len);
    s->len = len;
    c->pos += (size_t)len;
    return QWENRT_OK;
}

/* Bytes a scalar value takes in the file; 0 for STRING and ARRAY and unknown types. */
static int scalar_size(enum gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/* Fewest file bytes one element of type t can take (the check before allocating items). */
static uint64_t min_elem_size(enum gguf_type t)
{
    if (t == GGUF_TYPE_STRING)
        return 8;
    if (t == GGUF_TYPE_ARRAY)
        return 12;
    return (uint64_t)scalar_size(t);
}

static void store_scalar(struct gguf_value *v, uint64_t raw)
{
    float f;
    uint32_t u32 = (uint32_t)raw;
    switch (v->type) {
    case GGUF_TYPE_INT8:
        v->v.i64 = (int8_t)raw;
        break;
    case GGUF_TYPE_INT16:
        v->v.i64 = (int16_t)raw;
        break;
    case GGUF_TYPE_INT32:
        v->v.i64 = (int32_t)raw;
        break;
    case GGUF_TYPE_INT64:
        v->v.i64 = (int64_t)raw;
        break;
    case GGUF_TYPE_FLOAT32:
        memcpy(&f, &u32, 4);
        v->v.f64 = f;
        break;
    case GGUF_TYPE_FLOAT64:
        memcpy(&v->v.f64, &raw, 8);
        break;
    case GGUF_TYPE_BOOL:
        v->v.u64 = raw != 0;
        break;
    default:
        v->v.u64 = raw;
        break;
    }
}

static qwenrt_status rd_value(struct cursor *c, struct gguf_value *v, int depth, const char *key,
                              struct qwenrt_error *err);

/* Reads an array body (elem type, count, items) into v, which already has type ARRAY. */
static qwenrt_status rd_array(struct cursor *c, struct gguf_value *v, int depth, const char *key,
                              struct qwenrt_error *err)
{
    uint64_t et, count;
    qwenrt_status st = rd_uint(c, 4, &et, key, err);
    if (!st)
        st = rd_uint(c, 8, &count, key, err);
    if (st)
        return st;
    if (et >= GGUF_TYPE_COUNT)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: key '%s': unknown array element type %llu",
                       c->path, key, (unsigned long long)et);
    if (et == GGUF_TYPE_ARRAY && depth + 1 >= MAX_DEPTH)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: key '%s': arrays nested deeper than %d levels",
                       c->path, key, MAX_DEPTH);
    v->v.arr.elem_type = (enum gguf_type)et;
    if (count > GGUF_MAX_ARRAY)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: key '%s': array count %llu exceeds the limit %u",
                       c->path, key, (unsigned long long)count, GGUF_MAX_ARRAY);
    if (count > left(c) / min_elem_size((enum gguf_type)et))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: key '%s': array count %llu runs past the end (%zu bytes left)", c->path,
                       key, (unsigned long long)count, left(c));
    v->v.arr.items = xcalloc(count ? (size_t)count : 1, sizeof(*v->v.arr.items));
    if (!v->v.arr.items)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: key '%s': out of memory for %llu array items",
                       c->path, key, (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) {
        v->v.arr.items[i].type = (enum gguf_type)et;
        v->v.arr.count = i + 1; /* so that gguf_value_free sees what was read */
        st = rd_value(c, &v->v.arr.items[i], depth + 1, key, err);
        if (st)
            return st;
    }
    v->v.arr.count = count;
    return QWENRT_OK;
}

/* Reads the body of a value whose type (v->type) is already known. */
static qwenrt_status rd_value(struct cursor *c, struct gguf_value *v, int depth, const char *key,
                              struct qwenrt_error *err)
{
    if (v->type == GGUF_TYPE_STRING)
        return rd_string(c, &v->v.str, key, err);
    if (v->type == GGUF_TYPE_ARRAY)
        return rd_array(c, v, depth, key, err);
    uint64_t raw;
    qwenrt_status st = rd_uint(c, scalar_size(v->type), &raw, key, err);
    if (!st)
        store_scalar(v, raw);
    return st;
}

void gguf_value_free(struct gguf_value *v)
{
    if (!v)
        return;
    if (v->type == GGUF_TYPE_STRING) {
        xfree(v->v.str.str);
    } else if (v->type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; v->v.arr.items && i < v->v.arr.count; i++)
            gguf_value_free(&v->v.arr.items[i]);
        xfree(v->v.arr.items);
    }
    memset(v, 0, sizeof(*v));
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Finds a repeated name among names[n] (sorted copy); NULL when all differ. */
static const char *find_duplicate(const char **names, int64_t n)
{
    qsort(names, (size_t)n, sizeof(*names), cmp_str_ptr);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

/* Rejects a key or tensor name that appears twice (what = "key" or "tensor"). */
static qwenrt_status check_unique(struct gguf_file *gf, bool tensors, struct qwenrt_error *err)
{
    int64_t n = tensors ? gf->n_tensors : gf->n_kv;
    const char **names = xmalloc(n ? (size_t)n : 1, sizeof(*names));
    if (!names)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", gf->map.path);
    for (int64_t i = 0; i < n; i++)
        names[i] = tensors ? gf->tensors[i].name : gf->kvs[i].key;
    const char *dup = find_duplicate(names, n);
    qwenrt_status st = QWENRT_OK;
    if (dup)
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: %s '%s': duplicate %s", gf->map.path,
                     tensors ? "tensor" : "key", dup, tensors ? "tensor name" : "key");
    xfree(names);
    return st;
}

/* Reads magic, version and the two counts, checking them against limits and file size. */
static qwenrt_status rd_header(struct cursor *c, struct gguf_file *gf, struct qwenrt_error *err)
{
    uint64_t magic, version, n_tensors, n_kv;
    if (c->size < 4 || memcmp(c->data, "GGUF", 4) != 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: bad magic: not a GGUF file (%zu bytes)",
                       c->path, c->size);
    qwenrt_status st = rd_uint(c, 4, &magic, "magic", err);
    if (!st)
        st = rd_uint(c, 4, &version, "version", err);
    if (st)
        return st;
    if (version != 2 && version != 3)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: bad version %llu: expected GGUF version 2 or 3",
                       c->path, (unsigned long long)version);
    st = rd_uint(c, 8, &n_tensors, "tensor count", err);
    if (!st)
        st = rd_uint(c, 8, &n_kv, "key/value count", err);
    if (st)
        return st;
    if (n_tensors > GGUF_MAX_TENSORS)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: tensor count %llu exceeds the limit %d", c->path,
                       (unsigned long long)n_tensors, GGUF_MAX_TENSORS);
    if (n_kv > GGUF_MAX_KV)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: key/value count %llu exceeds the limit %d",
                       c->path, (unsigned long long)n_kv, GGUF_MAX_KV);
    /* a key/value takes at least 8+4+1 bytes, a tensor info at least 8+4+8+4+8 */
    if (n_kv * 13 + n_tensors * 32 > left(c))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: truncated: %llu key/values and %llu tensors cannot fit in %zu bytes",
                       c->path, (unsigned long long)n_kv, (unsigned long long)n_tensors, left(c));
    gf->version = (uint32_t)version;
    gf->n_tensors = (int64_t)n_tensors;
    gf->n_kv = (int64_t)n_kv;
    return QWENRT_OK;
}

/* Sets gf->alignment from general.alignment (u32, power of two) or the default. */
static qwenrt_status take_alignment(struct gguf_file *gf, struct qwenrt_error *err)
{
    gf->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *kv = gguf_find_kv(gf, "general.alignment");
    if (!kv)
        return QWENRT_OK;
    if (kv->value.type != GGUF_TYPE_UINT32)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: key 'general.alignment': type %d, expected u32",
                       gf->map.path, (int)kv->value.type);
    uint64_t a = kv->value.v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: key 'general.alignment': %llu is not a nonzero power of two",
                       gf->map.path, (unsigned long long)a);
    gf->alignment = (uint32_t)a;
    return QWENRT_OK;
}

static qwenrt_status rd_kvs(struct cursor *c, struct gguf_file *gf, struct qwenrt_error *err)
{
    int64_t n = gf->n_kv;
    gf->n_kv = 0; /* counts what gguf_close must free */
    gf->kvs = xcalloc(n ? (size_t)n : 1, sizeof(*gf->kvs));
    if (!gf->kvs)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for %lld keys", c->path,
                       (long long)n);
    for (int64_t i = 0; i < n; i++) {
        struct gguf_kv *kv = &gf->kvs[i];
        struct gguf_string key;
        char what[48];
        snprintf(what, sizeof(what), "key %lld name", (long long)i);
        qwenrt_status st = rd_string(c, &key, what, err);
        if (st)
            return st;
        kv->key = key.str;
        gf->n_kv = i + 1;
        uint64_t type;
        st = rd_uint(c, 4, &type, kv->key, err);
        if (st)
            return st;
        if (type >= GGUF_TYPE_COUNT)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: key '%s': unknown value type %llu", c->path,
                           kv->key, (unsigned long long)type);
        kv->value.type = (enum gguf_type)type;
        st = rd_value(c, &kv->value, 0, kv->key, err);
        if (st)
            return st;
    }
    return QWENRT_OK;
}

/* Reads one tensor info's shape and type into t; checks dims, counts and block geometry. */
static qwenrt_status rd_tensor_shape(struct cursor *c, struct qr_tensor *t,
                                     struct qwenrt_error *err)
{
    uint64_t n_dims, v;
    qwenrt_status st = rd_uint(c, 4, &n_dims, t->name, err);
    if (st)
        return st;
    if (n_dims < 1 || n_dims > QR_MAX_DIMS)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': n_dims %llu, expected 1..%d",
                       c->path, t->name, (unsigned long long)n_dims, QR_MAX_DIMS);
    t->n_dims = (int32_t)n_dims;
    int64_t total = 1; /* product of the nonzero dims, so that no partial product overflows */
    for (int d = 0; d < QR_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if ((uint64_t)d >= n_dims)
            continue;
        if ((st = rd_uint(c, 8, &v, t->name, err)))
            return st;
        if (v > INT64_MAX)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': ne[%d] is negative (%lld)",
                           c->path, t->name, d, (long long)v);
        t->ne[d] = (int64_t)v;
        if (v && total > INT64_MAX / (int64_t)v)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': element count overflows",
                           c->path, t->name);
        total *= v ? (int64_t)v : 1;
    }
    if ((st = rd_uint(c, 4, &v, t->name, err)))
        return st;
    /* ids >= 200 are qwenrt's safetensors-only dtypes, not ggml types */
    if (v >= 200 || !dtype_traits((int32_t)v))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s': unknown ggml type %llu",
                       c->path, t->name, (unsigned long long)v);
    t->dtype = (enum qr_dtype)v;
    size_t row;
    if (!dtype_row_bytes(t->dtype, t->ne[0], &row))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: tensor '%s': row of %lld is not a whole number of %s blocks of %d",
                       c->path, t->name, (long long)t->ne[0], dtype_traits(t->dtype)->name,
                       dtype_traits(t->dtype)->block_size);
    int64_t rows = tensor_nrows(t);
    if (rows && row > SIZE_MAX / (uint64_t)rows)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': byte size overflows", c->path,
                       t->name);
    t->nbytes = row * (size_t)rows;
    return QWENRT_OK;
}

/* Reads the tensor infos; offsets (relative to the data section) are kept in offs[]. */
static qwenrt_status rd_tensor_infos(struct cursor *c, struct gguf_file *gf, uint64_t *offs,
                                     struct qwenrt_error *err)
{
    int64_t n = gf->n_tensors;
    gf->n_tensors = 0;
    for (int64_t i = 0; i < n; i++) {
        struct qr_tensor *t = &gf->tensors[i];
        struct gguf_string name;
        char what[48];
        snprintf(what, sizeof(what), "tensor %lld name", (long long)i);
        qwenrt_status st = rd_string(c, &name, what, err);
        if (st)
            return st;
        t->name = name.str;
        gf->n_tensors = i + 1;
        if ((st = rd_tensor_shape(c, t, err)) || (st = rd_uint(c, 8, &offs[i], t->name, err)))
            return st;
        if (offs[i] % gf->alignment != 0)
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                           c->path, t->name, (unsigned long long)offs[i], gf->alignment);
    }
    return QWENRT_OK;
}

/* Order of tensor indices by data offset, for the overlap check. */
struct by_off {
    uint64_t off;
    size_t nbytes;
    int64_t i;
};

static int cmp_by_off(const void *a, const void *b)
{
    const struct by_off *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* Points each tensor into the data section after checking it lies inside the file and that
 * no two tensors share bytes. */
static qwenrt_status place_tensors(struct gguf_file *gf, const uint64_t *offs,
                                   struct qwenrt_error *err)
{
    const char *path = gf->map.path;
    uint64_t size = gf->map.size, base = gf->data_offset;
    for (int64_t i = 0; i < gf->n_tensors; i++) {
        struct qr_tensor *t = &gf->tensors[i];
        if (base > size || offs[i] > size - base || t->nbytes > size - base - offs[i])
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: tensor '%s': %zu bytes at %llu+%llu run past the end (%llu)", path,
                           t->name, t->nbytes, (unsigned long long)base,
                           (unsigned long long)offs[i], (unsigned long long)size);
        t->data = gf->map.data + base + offs[i];
    }
    struct by_off *order = xmalloc(gf->n_tensors ? (size_t)gf->n_tensors : 1, sizeof(*order));
    if (!order)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < gf->n_tensors; i++)
        order[i] = (struct by_off){offs[i], gf->tensors[i].nbytes, i};
    qsort(order, (size_t)gf->n_tensors, sizeof(*order), cmp_by_off);
    qwenrt_status st = QWENRT_OK;
    for (int64_t k = 1; k < gf->n_tensors && !st; k++)
        if (order[k - 1].off + order[k - 1].nbytes > order[k].off && order[k].nbytes)
            st = err_set(err, QWENRT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path,
                         gf->tensors[order[k - 1].i].name, gf->tensors[order[k].i].name);
    xfree(order);
    return st;
}

static qwenrt_status rd_tensors(struct cursor *c, struct gguf_file *gf, struct qwenrt_error *err)
{
    int64_t n = gf->n_tensors;
    gf->tensors = xcalloc(n ? (size_t)n : 1, sizeof(*gf->tensors));
    uint64_t *offs = xcalloc(n ? (size_t)n : 1, sizeof(*offs));
    qwenrt_status st = QWENRT_OK;
    if (!gf->tensors || !offs) {
        gf->n_tensors = 0;
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for %lld tensors", c->path,
                     (long long)n);
        goto out_free;
    }
    if ((st = rd_tensor_infos(c, gf, offs, err)) || (st = check_unique(gf, true, err)))
        goto out_free;
    uint64_t a = gf->alignment;
    gf->data_offset = ((uint64_t)c->pos + a - 1) / a * a;
    st = place_tensors(gf, offs, err);
out_free:
    xfree(offs);
    return st;
}

qwenrt_status gguf_open(struct gguf_file *gf, const char *path, struct qwenrt_error *err)
{
    memset(gf, 0, sizeof(*gf));
    qwenrt_status st = mapfile_open(&gf->map, path, err);
    if (st)
        return st;
    struct cursor c = {gf->map.data, gf->map.size, 0, gf->map.path};
    if ((st = rd_header(&c, gf, err)) || (st = rd_kvs(&c, gf, err)) ||
        (st = check_unique(gf, false, err)) || (st = take_alignment(gf, err)) ||
        (st = rd_tensors(&c, gf, err)))
        goto out_close;
    return QWENRT_OK;
out_close:
    gguf_close(gf);
    return st;
}

void gguf_close(struct gguf_file *gf)
{
    if (!gf)
        return;
    for (int64_t i = 0; gf->kvs && i < gf->n_kv; i++) {
        xfree(gf->kvs[i].key);
        gguf_value_free(&gf->kvs[i].value);
    }
    xfree(gf->kvs);
    for (int64_t i = 0; gf->tensors && i < gf->n_tensors; i++)
        xfree((void *)gf->tensors[i].name);
    xfree(gf->tensors);
    mapfile_close(&gf->map);
    memset(gf, 0, sizeof(*gf));
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *gf, const char *key)
{
    for (int64_t i = 0; i < gf->n_kv; i++)
        if (strcmp(gf->kvs[i].key, key) == 0)
            return &gf->kvs[i];
    return NULL;
}

const struct qr_tensor *gguf_find_tensor(const struct gguf_file *gf, const char *name)
{
    for (int64_t i = 0; i < gf->n_tensors; i++)
        if (strcmp(gf->tensors[i].name, name) == 0)
            return &gf->tensors[i];
    return NULL;
}

static bool is_unsigned(enum gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_BOOL;
}

static bool is_signed(enum gguf_type t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

bool gguf_get_int(const struct gguf_file *gf, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv)
        return false;
    if (is_signed(kv->value.type)) {
        *out = kv->value.v.i64;
        return true;
    }
    if (is_unsigned(kv->value.type) && kv->value.v.u64 <= INT64_MAX) {
        *out = (int64_t)kv->value.v.u64;
        return true;
    }
    return false;
}

bool gguf_get_float(const struct gguf_file *gf, const char *key, double *out)
{
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv)
        return false;
    enum gguf_type t = kv->value.type;
    if (t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64)
        *out = kv->value.v.f64;
    else if (is_signed(t))
        *out = (double)kv->value.v.i64;
    else if (is_unsigned(t) && t != GGUF_TYPE_BOOL)
        *out = (double)kv->value.v.u64;
    else
        return false;
    return true;
}

bool gguf_get_bool(const struct gguf_file *gf, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv || kv->value.type != GGUF_TYPE_BOOL)
        return false;
    *out = kv->value.v.u64 != 0;
    return true;
}

const char *gguf_get_string(const struct gguf_file *gf, const char *key)
{
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv || kv->value.type != GGUF_TYPE_STRING)
        return NULL;
    return kv->value.v.str.str;
}

const struct gguf_value *gguf_get_array(const struct gguf_file *gf, const char *key)
{
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv || kv->value.type != GGUF_TYPE_ARRAY)
        return NULL;
    return &kv->value;
}
