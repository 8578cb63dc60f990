/*
 * safetensors.c — safetensors reader and writer (see safetensors.h).
 *
 * Validation order: header length fits the file; header is a JSON object; every entry has a
 * known dtype, a shape of at most 4 non-negative dims and two offsets; end - begin equals the
 * element count times the dtype size; offsets lie inside the data region; entries do not
 * overlap. Only then are the tensor views built.
 */
#include "format/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"

static const struct {
    const char *name;
    enum qr_dtype dtype;
} st_dtypes[] = {
    {"F32", QR_F32}, {"F16", QR_F16}, {"BF16", QR_BF16}, {"F64", QR_F64}, {"I8", QR_I8},
    {"I16", QR_I16}, {"I32", QR_I32}, {"I64", QR_I64},   {"U8", QR_U8},   {"BOOL", QR_BOOL},
};

enum qr_dtype safetensors_dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return st_dtypes[i].dtype;
    return QR_DTYPE_INVALID;
}

const char *safetensors_dtype_name(enum qr_dtype t)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (st_dtypes[i].dtype == t)
            return st_dtypes[i].name;
    return NULL;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct qr_tensor *x = a, *y = b;
    if (x->data != y->data) /* ties: empty tensors first, so they never "overlap" a neighbour */
        return (x->data > y->data) - (x->data < y->data);
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Parses one header entry into t (data relative to the data region start). */
static qwenrt_status parse_entry(const char *path, const char *name, json_t *v, uint64_t data_len,
                                 struct qr_tensor *t, struct qwenrt_error *err)
{
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: tensor '%s': header entry needs dtype, shape and data_offsets", path, name);
    t->dtype = safetensors_dtype_from_name(json_string_value(jd));
    if (t->dtype == QR_DTYPE_INVALID)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", path, name,
                       json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > QR_MAX_DIMS)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions (at most %d)",
                       path, name, nd, QR_MAX_DIMS);
    t->n_dims = nd ? (int32_t)nd : 1;
    uint64_t count = 1;
    for (int i = 0; i < QR_MAX_DIMS; i++)
        t->ne[i] = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1LL << 40))
            return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': bad shape entry %zu", path,
                           name, i);
        int64_t n = json_integer_value(d);
        t->ne[nd - 1 - i] = n; /* reverse into ggml order */
        if (n && count > UINT64_MAX / (uint64_t)n)
            return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        count *= (uint64_t)n;
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    uint64_t esize = (uint64_t)dtype_traits(t->dtype)->type_size;
    if (count > UINT64_MAX / esize || end - begin != count * esize)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets span %llu bytes but the shape needs %llu",
                       path, name, (unsigned long long)(end - begin),
                       (unsigned long long)(count * esize));
    if (end > data_len)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: tensor '%s': data ends at byte %llu, past the end of the file's data (%llu bytes)",
                       path, name, (unsigned long long)end, (unsigned long long)data_len);
    t->data = (const void *)(uintptr_t)begin;
    t->nbytes = (size_t)(end - begin);
    return QWENRT_OK;
}

static qwenrt_status parse_header(struct safetensors_file *sf, json_t *root, uint64_t data_off,
                                  struct qwenrt_error *err)
{
    const char *path = sf->map.path;
    uint64_t data_len = sf->map.size - data_off;
    size_t n = json_object_size(root), names_len = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) names_len += strlen(key) + 1;
    sf->tensors = xcalloc(n ? n : 1, sizeof(*sf->tensors));
    sf->names = xmalloc(names_len + 1, 1);
    if (!sf->tensors || !sf->names)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for %zu tensors", path, n);
    char *np = sf->names;
    int32_t count = 0;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        if (!json_is_object(v))
            return err_set(err, QWENRT_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, key);
        struct qr_tensor *t = &sf->tensors[count];
        qwenrt_status st = parse_entry(path, key, v, data_len, t, err);
        if (st)
            return st;
        size_t kl = strlen(key);
        memcpy(np, key, kl + 1);
        t->name = np;
        np += kl + 1;
        count++;
    }
    sf->n_tensors = count;
    qsort(sf->tensors, (size_t)count, sizeof(*sf->tensors), cmp_by_offset);
    for (int32_t i = 0; i < count; i++) {
        struct qr_tensor *t = &sf->tensors[i];
        uintptr_t off = (uintptr_t)t->data;
        if (i > 0) {
            struct qr_tensor *p = &sf->tensors[i - 1];
            if ((uintptr_t)p->data - (uintptr_t)sf->map.data - data_off + p->nbytes > off)
                return err_set(err, QWENRT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path,
                               p->name, t->name);
        }
        t->data = sf->map.data + data_off + off;
    }
    return QWENRT_OK;
}

qwenrt_status safetensors_open(struct safetensors_file *sf, const char *path,
                               struct qwenrt_error *err)
{
    memset(sf, 0, sizeof(*sf));
    qwenrt_status st = mapfile_open(&sf->map, path, err);
    if (st)
        return st;
    if (sf->map.size < 8) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: truncated: %zu bytes, a safetensors file needs at least 8",
                     path, sf->map.size);
        goto out_fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | sf->map.data[i];
    if (hlen > SAFETENSORS_MAX_HEADER || hlen > sf->map.size - 8) {
        st = err_set(err, QWENRT_ERR_FORMAT,
                     "%s: header length %llu exceeds the file size (%zu bytes) or the %u-byte limit",
                     path, (unsigned long long)hlen, sf->map.size, SAFETENSORS_MAX_HEADER);
        goto out_fail;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)sf->map.data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: header is not a JSON object (%s)", path,
                     root ? "wrong type" : jerr.text);
        json_decref(root);
        goto out_fail;
    }
    st = parse_header(sf, root, 8 + hlen, err);
    json_decref(root);
    if (st)
        goto out_fail;
    return QWENRT_OK;
out_fail:
    safetensors_close(sf);
    return st;
}

void safetensors_close(struct safetensors_file *sf)
{
    if (!sf)
        return;
    mapfile_close(&sf->map);
    xfree(sf->tensors);
    xfree(sf->names);
    memset(sf, 0, sizeof(*sf));
}

const struct qr_tensor *safetensors_find(const struct safetensors_file *sf, const char *name)
{
    for (int32_t i = 0; i < sf->n_tensors; i++)
        if (strcmp(sf->tensors[i].name, name) == 0)
            return &sf->tensors[i];
    return NULL;
}

/* Builds the JSON header for tensors laid out back to back; returns its serialised text. */
static char *build_header(const struct safetensors_out *tensors, int32_t n, size_t *sizes)
{
    json_t *root = json_object();
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct safetensors_out *t = &tensors[i];
        json_t *shape = json_array();
        uint64_t count = 1;
        for (int d = 0; d < t->n_dims; d++) {
            json_array_append_new(shape, json_integer(t->shape[d]));
            count *= (uint64_t)t->shape[d];
        }
        sizes[i] = (size_t)(count * (uint64_t)dtype_traits(t->dtype)->type_size);
        json_t *offs = json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + sizes[i]));
        json_object_set_new(root, t->name,
                            json_pack("{s:s,s:o,s:o}", "dtype", safetensors_dtype_name(t->dtype),
                                      "shape", shape, "data_offsets", offs));
        off += sizes[i];
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

qwenrt_status safetensors_write(const char *path, const struct safetensors_out *tensors,
                                int32_t n, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    for (int32_t i = 0; i < n; i++)
        if (!safetensors_dtype_name(tensors[i].dtype))
            return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s': dtype not storable in safetensors",
                           path, tensors[i].name);
    size_t *sizes = xcalloc((size_t)n + 1, sizeof(*sizes));
    char *header = sizes ? build_header(tensors, n, sizes) : NULL;
    char *tmp = xmalloc(strlen(path) + 8, 1);
    if (!header || !tmp) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
        goto out_free;
    }
    sprintf(tmp, "%s.tmp", path);
    size_t hlen = strlen(header), padded = (hlen + 7) & ~(size_t)7;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out_free;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    for (int32_t i = 0; ok && i < n; i++)
        ok = sizes[i] == 0 || /* an empty tensor's data may be NULL */
             fwrite(tensors[i].data, 1, sizes[i], f) == sizes[i];
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        st = err_set(err, QWENRT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
    }
out_free:
    xfree(tmp);
    free(header);
    xfree(sizes);
    return st;
}
