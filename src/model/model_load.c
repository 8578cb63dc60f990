/*
 * model_load.c — qwenrt_model_load: opens a GGUF file or a Hugging Face directory, reads the
 * hyper-parameters, binds weights through the architecture file, and builds the plans.
 *
 * A HF directory is config.json plus model.safetensors, or the shards listed by
 * model.safetensors.index.json, or (failing both) every *.safetensors file in it.
 * Whether a path is GGUF is decided by its magic bytes, not its name.
 */
#include <dirent.h>
#include <jansson.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/meminfo.h"
#include "model/model.h"
#include "quant/quant.h"
#include "quant/transcode.h"

struct owned_chunk {
    struct owned_chunk *next;
    float data[];
};

/* A file tensor rewritten in a type the backend computes with (model->weight_dtype_ok). */
struct transcoded_tensor {
    struct transcoded_tensor *next;
    const struct qr_tensor *from; /* the file's tensor */
    struct qr_tensor t;           /* its copy: same name and shape, another dtype */
    void *data;                   /* t.data, owned */
};

float *model_alloc_floats(struct qwenrt_model *m, size_t n)
{
    if (n > (SIZE_MAX - sizeof(struct owned_chunk)) / sizeof(float))
        return NULL;
    struct owned_chunk *c = xmalloc(1, sizeof(*c) + n * sizeof(float));
    if (!c)
        return NULL;
    c->next = m->owned;
    m->owned = c;
    return c->data;
}

const struct qr_tensor *model_find_tensor(const struct qwenrt_model *m, const char *gguf_name)
{
    if (m->format == MODEL_FORMAT_GGUF)
        return gguf_find_tensor(&m->gguf, gguf_name);
    char hf[256];
    if (!names_gguf_to_hf(m->hp.arch, gguf_name, hf, sizeof(hf)))
        return NULL;
    for (int32_t i = 0; i < m->n_shards; i++) {
        const struct qr_tensor *t = safetensors_find(&m->shards[i], hf);
        if (t)
            return t;
    }
    return NULL;
}

/* The name as the user's file spells it, for messages. */
static const char *file_name_of(const struct qwenrt_model *m, const char *gguf_name, char *buf,
                                size_t len)
{
    if (m->format == MODEL_FORMAT_HF && names_gguf_to_hf(m->hp.arch, gguf_name, buf, len))
        return buf;
    return gguf_name;
}

/* Rows [0, n_rows) of `from` at src rewritten at dst (transcode_rows), in chunks over the
 * model's threads; false when any chunk failed (only for lack of memory: the type and the row
 * size were checked). */
static bool transcode_parallel(const struct qwenrt_model *m, const struct qr_tensor *from, void *dst)
{
    enum { CHUNK_ROWS = 256 };
    size_t in_bytes, out_bytes;
    int64_t K = from->ne[0], n_rows = tensor_nrows(from);
    if (!dtype_row_bytes(from->dtype, K, &in_bytes) ||
        !dtype_row_bytes(transcode_target(from->dtype), K, &out_bytes))
        return false;
    int64_t n_chunks = (n_rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    int failed = 0;
#pragma omp parallel for schedule(dynamic) num_threads(m->n_threads > 0 ? m->n_threads : omp_get_max_threads()) reduction(| : failed)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t r0 = c * CHUNK_ROWS, rows = n_rows - r0 < CHUNK_ROWS ? n_rows - r0 : CHUNK_ROWS;
        if (!transcode_rows(from->dtype, (const uint8_t *)from->data + (size_t)r0 * in_bytes,
                            (uint8_t *)dst + (size_t)r0 * out_bytes, K, rows))
            failed = 1;
    }
    return !failed;
}

/* The copy of t in a type the backend computes with: made once per file tensor (so a tied
 * output matrix stays the embedding's), owned by the model. */
static qwenrt_status bind_transcoded(struct qwenrt_model *m, const struct qr_tensor *t, const char *fn,
                                     const struct qr_tensor **out, struct qwenrt_error *err)
{
    for (struct transcoded_tensor *c = m->transcoded; c; c = c->next)
        if (c->from == t) {
            *out = &c->t;
            return QWENRT_OK;
        }
    enum qr_dtype to = transcode_target(t->dtype);
    size_t row_bytes, bytes;
    if (to == QR_DTYPE_INVALID || !dtype_row_bytes(to, t->ne[0], &row_bytes) ||
        size_mul_overflows(row_bytes, (size_t)tensor_nrows(t), &bytes))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which the %s backend cannot compute with or convert",
                       m->path, fn, dtype_traits(t->dtype)->name, m->backend);
    struct transcoded_tensor *c = xcalloc(1, sizeof(*c));
    void *data = c ? xalloc_aligned(bytes, 1) : NULL;
    if (!data || !transcode_parallel(m, t, data)) {
        xfree(data);
        xfree(c);
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory converting tensor '%s' (%s) to %s for the %s backend",
                       m->path, fn, dtype_traits(t->dtype)->name, dtype_traits(to)->name, m->backend);
    }
    c->from = t;
    c->t = *t;
    c->t.dtype = to;
    c->t.data = c->data = data;
    c->t.nbytes = bytes;
    c->next = m->transcoded;
    m->transcoded = c;
    *out = &c->t;
    return QWENRT_OK;
}

/* A block-quantised layer matrix ("blk.N.*", not F32, F16 or BF16) that the backend keeps
 * but that becomes F16 when m->layers_f16 (model_load_for). */
static bool goes_f16_with_layers(const struct qwenrt_model *m, const char *gguf_name, enum qr_dtype t)
{
    return m->layers_f16 && !strncmp(gguf_name, "blk.", 4) && t != QR_F32 && t != QR_F16 && t != QR_BF16 &&
           transcode_target(t) == QR_F16;
}

/* Whether the backend converts some layer matrix of the file to F16 (Q5_K_M on the GPU: its
 * Q5_K ones). The layers would then mix F16 with the block-quantised matrices the backend
 * keeps (Q5_K_M's Q6_K), and a decode step of one kind of layer matrix is faster than the mix
 * (docs/perf-log.md, session 56): the load converts those to F16 as well. */
static bool layers_partly_f16(const struct qwenrt_model *m)
{
    if (m->format != MODEL_FORMAT_GGUF || !m->weight_dtype_ok)
        return false;
    for (int64_t i = 0; i < m->gguf.n_tensors; i++) {
        const struct qr_tensor *t = &m->gguf.tensors[i];
        if (!strncmp(t->name, "blk.", 4) && t->n_dims >= 2 && !m->weight_dtype_ok(t->dtype) &&
            transcode_target(t->dtype) == QR_F16)
            return true;
    }
    return false;
}

qwenrt_status model_bind_matrix(struct qwenrt_model *m, const struct qr_tensor **out, int64_t ne0,
                                int64_t ne1, bool required, struct qwenrt_error *err,
                                const char *fmt, ...)
{
    char name[128], shown[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    *out = NULL;
    const struct qr_tensor *t = model_find_tensor(m, name);
    const char *fn = file_name_of(m, name, shown, sizeof(shown));
    if (!t)
        return required ? err_set(err, QWENRT_ERR_NOT_FOUND, "%s: missing tensor '%s'", m->path, fn)
                        : QWENRT_OK;
    int64_t want1 = ne1 ? ne1 : 1;
    if (t->ne[0] != ne0 || tensor_nrows(t) != want1 || (ne1 && t->ne[1] != ne1))
        return err_set(err, QWENRT_ERR_SHAPE,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld] (ggml order), expected [%lld, %lld]",
                       m->path, fn, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)ne0, (long long)want1);
    if (!quant_can_dequantize(t->dtype))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which qwenrt cannot compute with",
                       m->path, fn, dtype_traits(t->dtype) ? dtype_traits(t->dtype)->name : "unknown");
    if ((m->weight_dtype_ok && !m->weight_dtype_ok(t->dtype)) || goes_f16_with_layers(m, name, t->dtype))
        return bind_transcoded(m, t, fn, out, err);
    *out = t;
    return QWENRT_OK;
}

qwenrt_status model_bind_vector(struct qwenrt_model *m, const float **out, int64_t n, float add,
                                struct qwenrt_error *err, const char *fmt, ...)
{
    char name[128], shown[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    const struct qr_tensor *t = model_find_tensor(m, name);
    const char *fn = file_name_of(m, name, shown, sizeof(shown));
    if (!t)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: missing tensor '%s'", m->path, fn);
    if (tensor_nelements(t) != n)
        return err_set(err, QWENRT_ERR_SHAPE, "%s: tensor '%s' has %lld elements, expected %lld",
                       m->path, fn, (long long)tensor_nelements(t), (long long)n);
    if (!dtype_is_float(t->dtype))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "%s: tensor '%s' must be f32, f16 or bf16",
                       m->path, fn);
    float *v = model_alloc_floats(m, (size_t)n);
    if (!v)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", m->path);
    quant_dequantize_row(t->dtype, t->data, v, n);
    for (int64_t i = 0; i < n; i++)
        v[i] += add;
    *out = v;
    return QWENRT_OK;
}

static bool is_gguf_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (!f)
        return false;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

static qwenrt_status open_shard(struct qwenrt_model *m, const char *dir, const char *file,
                                struct qwenrt_error *err)
{
    for (int32_t i = 0; i < m->n_shards; i++) /* index files list each shard many times */
        if (!strcmp(strrchr(m->shards[i].map.path, '/') + 1, file))
            return QWENRT_OK;
    if (m->n_shards >= MODEL_MAX_SHARDS)
        return err_set(err, QWENRT_ERR_LIMIT, "%s: more than %d safetensors shards", dir, MODEL_MAX_SHARDS);
    if (strchr(file, '/'))
        return err_set(err, QWENRT_ERR_FORMAT, "%s: shard name '%s' must be a plain file name", dir, file);
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    qwenrt_status st = safetensors_open(&m->shards[m->n_shards], path, err);
    if (!st)
        m->n_shards++;
    return st;
}

static qwenrt_status open_indexed_shards(struct qwenrt_model *m, const char *dir, const char *index,
                                         struct qwenrt_error *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    json_t *map = root ? json_object_get(root, "weight_map") : NULL;
    qwenrt_status st = QWENRT_OK;
    if (!json_is_object(map)) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: not a safetensors index (no weight_map object)", index);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v)
    {
        if (!json_is_string(v)) {
            st = err_set(err, QWENRT_ERR_FORMAT, "%s: weight_map['%s'] is not a string", index, key);
            break;
        }
        if ((st = open_shard(m, dir, json_string_value(v), err)))
            break;
    }
out:
    json_decref(root);
    return st;
}

static qwenrt_status open_all_shards(struct qwenrt_model *m, const char *dir, struct qwenrt_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot list directory", dir);
    qwenrt_status st = QWENRT_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors"))
            st = open_shard(m, dir, e->d_name, err);
    }
    closedir(d);
    if (!st && m->n_shards == 0)
        st = err_set(err, QWENRT_ERR_NOT_FOUND, "%s: no *.safetensors files", dir);
    return st;
}

static qwenrt_status open_hf_dir(struct qwenrt_model *m, const char *dir, struct qwenrt_error *err)
{
    char path[4096];
    char *text = NULL;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    qwenrt_status st = file_read_all(path, 16u << 20, &text, NULL, err);
    if (st)
        return st;
    st = hparams_from_hf_config(&m->hp, text, path, err);
    xfree(text);
    if (st)
        return st;
    m->format = MODEL_FORMAT_HF;
    m->shards = xcalloc(MODEL_MAX_SHARDS, sizeof(*m->shards));
    if (!m->shards)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", dir);
    struct stat sb;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb) == 0)
        return open_indexed_shards(m, dir, path, err);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (stat(path, &sb) == 0)
        return open_shard(m, dir, "model.safetensors", err);
    return open_all_shards(m, dir, err);
}

static qwenrt_status open_gguf(struct qwenrt_model *m, const char *path, struct qwenrt_error *err)
{
    m->format = MODEL_FORMAT_GGUF;
    qwenrt_status st = gguf_open(&m->gguf, path, err);
    if (!st)
        st = hparams_from_gguf(&m->hp, &m->gguf, err);
    if (st)
        return st;
    const struct qr_tensor *e = gguf_find_tensor(&m->gguf, "token_embd.weight");
    if (!e)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: missing tensor 'token_embd.weight'", path);
    if (e->ne[1] > INT32_MAX)
        return err_set(err, QWENRT_ERR_SHAPE, "%s: 'token_embd.weight' has too many rows", path);
    m->hp.n_vocab = (int32_t)e->ne[1];
    m->v_head_tiled = true;
    return QWENRT_OK;
}

/* Counts parameters and bytes of every bound weight (the tied LM head once). */
static void count_params(struct qwenrt_model *m)
{
    const struct qr_tensor *ts[2 + 16 * QR_MAX_LAYERS];
    int n = 0;
    ts[n++] = m->w.tok_embd;
    if (m->w.output != m->w.tok_embd)
        ts[n++] = m->w.output;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct layer_weights *L = &m->w.layers[l];
        const struct qr_tensor *lt[] = {L->wq, L->wk, L->wv, L->wo, L->ssm_qkv, L->ssm_z,
                                        L->ssm_beta, L->ssm_alpha, L->ssm_out, L->ffn_gate,
                                        L->ffn_up, L->ffn_down};
        for (size_t i = 0; i < sizeof(lt) / sizeof(lt[0]); i++)
            if (lt[i])
                ts[n++] = lt[i];
    }
    m->n_params = m->weight_bytes = 0;
    for (int i = 0; i < n; i++) {
        m->n_params += tensor_nelements(ts[i]);
        m->weight_bytes += (int64_t)ts[i]->nbytes;
    }
    /* small vectors: norms etc. (counted from hparams) */
    const struct model_hparams *hp = &m->hp;
    int64_t small = hp->n_embd;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        small += 2 * hp->n_embd;
        if (hp->arch == ARCH_QWEN35 && hp->is_recurrent[l])
            small += (int64_t)hparams_ssm_conv_dim(hp) * hp->ssm_conv + 2 * hp->ssm_n_v_heads + hp->ssm_v_dim;
        else
            small += 2 * hp->head_dim;
    }
    m->n_params += small;
}

/* Refuses, with numbers, weights larger than this machine's memory before anything is bound
 * or converted (issue 9): mapped pages would thrash, and conversions would be OOM-killed. */
static qwenrt_status check_fits(const struct qwenrt_model *m, const char *path,
                                struct qwenrt_error *err)
{
    uint64_t bytes = m->format == MODEL_FORMAT_GGUF ? m->gguf.map.size : 0;
    for (int32_t i = 0; i < m->n_shards; i++)
        bytes += m->shards[i].map.size;
    uint64_t total = mem_total_bytes();
    if (!total || bytes <= total)
        return QWENRT_OK;
    return err_set(err, QWENRT_ERR_LIMIT,
                   "%s: the weights (%.2f GiB) do not fit in this machine's %.2f GiB of memory",
                   path, (double)bytes / (1 << 30), (double)total / (1 << 30));
}

/* "cpu" always works; "cuda" needs the CUDA backend compiled in, a driver and a device. */
static qwenrt_status check_backend(const char *backend, struct qwenrt_error *err)
{
    if (!strcmp(backend, "cpu"))
        return QWENRT_OK;
    if (!strcmp(backend, "cuda"))
        return cuda_probe(0, err);
    return err_set(err, QWENRT_ERR_INVALID_ARG, "backend '%s': expected 'cpu' or 'cuda'", backend);
}

qwenrt_status qwenrt_model_load(const char *path, const struct qwenrt_model_params *params,
                                struct qwenrt_model **out, struct qwenrt_error *err)
{
    return model_load_for(path, params, NULL, out, err);
}

qwenrt_status model_load_for(const char *path, const struct qwenrt_model_params *params,
                             bool (*weight_dtype_ok)(int32_t dtype), struct qwenrt_model **out,
                             struct qwenrt_error *err)
{
    *out = NULL;
    struct qwenrt_model_params defaults = qwenrt_model_default_params();
    if (!params)
        params = &defaults;
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return err_set(err, QWENRT_ERR_IO, "%s: no such file or directory", path ? path : "(null)");
    struct qwenrt_model *m = xcalloc(1, sizeof(*m));
    if (!m || !(m->path = xstrdup(path))) {
        xfree(m);
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    }
    pthread_mutex_init(&m->device_weights.mu, NULL);
    m->n_threads = params->n_threads;
    snprintf(m->backend, sizeof(m->backend), "%s", params->backend ? params->backend : "cpu");
    m->weight_dtype_ok = weight_dtype_ok          ? weight_dtype_ok
                         : !strcmp(m->backend, "cuda") ? cuda_weight_dtype_supported
                                                       : cpu_weight_dtype_supported;
    qwenrt_status st = check_backend(m->backend, err);
    if (st)
        ; /* reported by check_backend */
    else if (S_ISDIR(sb.st_mode))
        st = open_hf_dir(m, path, err);
    else if (is_gguf_file(path))
        st = open_gguf(m, path, err);
    else
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: neither a GGUF file (no 'GGUF' magic) nor a model directory", path);
    if (!st)
        st = hparams_validate(&m->hp, path, err);
    if (!st)
        st = check_fits(m, path, err);
    if (!st) {
        m->w.layers = xcalloc((size_t)m->hp.n_layer, sizeof(*m->w.layers));
        if (!m->w.layers)
            st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    }
    if (!st) {
        m->layers_f16 = !params->keep_layer_types && layers_partly_f16(m);
        st = m->hp.arch == ARCH_QWEN35 ? qwen35_load_weights(m, err) : qwen3_load_weights(m, err);
    }
    for (int ph = 0; ph < 2 && !st; ph++) {
        if (!plan_init(&m->plans[ph], (enum plan_phase)ph))
            st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
        else
            st = m->hp.arch == ARCH_QWEN35 ? qwen35_build_plan(m, &m->plans[ph], err)
                                            : qwen3_build_plan(m, &m->plans[ph], err);
    }
    if (st) {
        qwenrt_model_free(m);
        return st;
    }
    count_params(m);
    *out = m;
    return QWENRT_OK;
}

void qwenrt_model_free(struct qwenrt_model *m)
{
    if (!m)
        return;
    for (int ph = 0; ph < 2; ph++)
        plan_free(&m->plans[ph]);
    while (m->owned) {
        struct owned_chunk *next = m->owned->next;
        xfree(m->owned);
        m->owned = next;
    }
    while (m->transcoded) {
        struct transcoded_tensor *next = m->transcoded->next;
        xfree(m->transcoded->data);
        xfree(m->transcoded);
        m->transcoded = next;
    }
    xfree(m->w.layers);
    if (m->format == MODEL_FORMAT_GGUF)
        gguf_close(&m->gguf);
    for (int32_t i = 0; i < m->n_shards; i++)
        safetensors_close(&m->shards[i]);
    xfree(m->shards);
    xfree(m->path);
    pthread_mutex_destroy(&m->device_weights.mu); /* its sessions are gone: cuda is NULL */
    xfree(m);
}

struct qwenrt_model_params qwenrt_model_default_params(void)
{
    struct qwenrt_model_params p = {0};
    p.n_threads = 0;
    p.backend = "cpu";
    return p;
}

void qwenrt_model_get_info(const struct qwenrt_model *m, struct qwenrt_model_info *info)
{
    memset(info, 0, sizeof(*info));
    info->arch = arch_name(m->hp.arch);
    info->name = m->hp.name;
    info->n_vocab = m->hp.n_vocab;
    info->n_embd = m->hp.n_embd;
    info->n_layer = m->hp.n_layer;
    info->n_head = m->hp.n_head;
    info->n_head_kv = m->hp.n_head_kv;
    info->head_dim = m->hp.head_dim;
    info->n_ff = m->hp.n_ff;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    for (const struct transcoded_tensor *c = m->transcoded; c; c = c->next)
        info->n_converted++;
}
