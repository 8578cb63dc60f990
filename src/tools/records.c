/*
 * records.c — shared parts of JSON records (see records.h).
 *
 * Digests come from source_digests.h, generated at build time by cmake/source_digests.cmake
 * (sha256 of every file under src/, the git commit and whether src/ had uncommitted changes),
 * so a record names exactly the code that produced it even when the binary is moved.
 * A kernel key maps to the file that defines its function (key with dots as underscores, found
 * by the build-time scan), else by convention: *.ref op kernels and the *.auto dispatchers in
 * kernels_ref.c, matmul.<dtype>.ref in matmul.c; any other key (e.g. a variant made by a
 * macro) gets the digest of the whole CPU backend, so no change to it can be missed.
 */
#include "tools/records.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "base/alloc.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/sha256.h"
#include "source_digests.h"

#define CPU_DIR "src/backend/cpu/"

void records_now(char out[40])
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char base[24];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 40, "%.19s.%06ld+00:00", base, (long)tv.tv_usec % 1000000);
}

static const char *file_digest(const char *path)
{
    for (const struct source_digest *d = source_digests; d->path; d++)
        if (!strcmp(d->path, path))
            return d->sha256;
    return NULL;
}

const char *records_kernel_source(const char *key, char *buf, size_t len)
{
    char op[64] = "", impl[64] = "";
    const char *first = strchr(key, '.'), *last = strrchr(key, '.');
    if (!first)
        return NULL;
    snprintf(op, sizeof(op), "%.*s", (int)(first - key), key);
    snprintf(impl, sizeof(impl), "%s", last + 1);
    char fn[128];
    snprintf(fn, sizeof(fn), "%s", key);
    for (char *c = fn; *c; c++)
        if (*c == '.')
            *c = '_';
    for (const struct kernel_function *k = kernel_functions; k->name; k++)
        if (!strcmp(k->name, fn)) { /* the file that defines <op>_<impl> (style rule 7) */
            snprintf(buf, len, "%s", k->file);
            return buf;
        }
    if (!strcmp(impl, "auto") || (!strcmp(impl, "ref") && strcmp(op, "matmul")))
        snprintf(buf, len, CPU_DIR "kernels_ref.c");
    else if (!strcmp(op, "matmul") && !strcmp(impl, "ref"))
        snprintf(buf, len, CPU_DIR "matmul.c");
    else
        snprintf(buf, len, CPU_DIR "*");
    return buf;
}

/* sha256 over "path sha256\n" of every file under dir (a prefix). */
static void dir_digest(const char *dir, char out[65])
{
    size_t cap = 4096, n = 0;
    char *text = xmalloc(cap, 1);
    for (const struct source_digest *d = source_digests; d->path && text; d++) {
        if (strncmp(d->path, dir, strlen(dir)))
            continue;
        size_t need = strlen(d->path) + 67;
        if (n + need + 1 > cap) {
            char *t = xrealloc(text, cap * 2 + need, 1);
            if (!t)
                break;
            text = t;
            cap = cap * 2 + need;
        }
        n += (size_t)snprintf(text + n, cap - n, "%s %s\n", d->path, d->sha256);
    }
    sha256_hex(text ? text : "", text ? n : 0, out);
    xfree(text);
}

const char *records_kernel_digest(const char *key, char out[65])
{
    char src[256];
    if (!records_kernel_source(key, src, sizeof(src)))
        return NULL;
    if (!strcmp(src, CPU_DIR "*")) {
        dir_digest(CPU_DIR, out);
        return out;
    }
    const char *d = file_digest(src);
    if (!d)
        return NULL;
    snprintf(out, 65, "%s", d);
    return out;
}

json_t *records_kernels(const struct profile_binding *b)
{
    json_t *k = json_object();
    for (int ph = 0; ph < 2; ph++)
        for (int32_t i = 0; i < b->n_ops[ph]; i++) {
            const char *key = b->ops[ph][i].key;
            if (!key || json_object_get(k, key))
                continue;
            char src[256], dig[65];
            const char *d = records_kernel_digest(key, dig);
            json_object_set_new(k, key,
                                json_pack("{s:s?, s:s?}", "sha256", d, "source",
                                          records_kernel_source(key, src, sizeof(src))));
        }
    return k;
}

json_t *records_backend_kernels(const char *backend)
{
    char dir[128], src[140], dig[65];
    snprintf(dir, sizeof(dir), "src/backend/%s/", backend);
    snprintf(src, sizeof(src), "%s*", dir);
    dir_digest(dir, dig);
    return json_pack("{s:{s:s, s:s}}", backend, "sha256", dig, "source", src);
}

void records_add_gpu(json_t *rec)
{
    char gpu[256] = "";
    cuda_device_describe(gpu, sizeof(gpu));
    json_object_set_new(json_object_get(rec, "hardware"), "gpu", json_string(gpu));
}

static void cpu_model(char *out, size_t len)
{
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(out, len, "%s", strchr(line, ':') + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    fclose(f);
}

void records_add_environment(json_t *rec)
{
    char cpu[256], feats[128];
    cpu_model(cpu, sizeof(cpu));
    cpu_features_describe(cpu_features_detect(), feats, sizeof(feats));
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    json_object_set_new(rec, "hardware",
                        json_pack("{s:s, s:s, s:i, s:I}", "cpu", cpu, "cpu_features", feats,
                                  "logical_cores", (int)sysconf(_SC_NPROCESSORS_ONLN),
                                  "memory_bytes", (json_int_t)pages * psize));
    struct utsname u;
    char os[400] = "unknown";
    if (uname(&u) == 0)
        snprintf(os, sizeof(os), "%s %s %s", u.sysname, u.release, u.machine);
    json_object_set_new(rec, "software",
                        json_pack("{s:s, s:s, s:s, s:s, s:s}", "qwenrt", QWENRT_VERSION,
                                  "git_commit", QWENRT_GIT_COMMIT, "git_dirty_src",
                                  QWENRT_GIT_DIRTY, "platform", os, "jansson", JANSSON_VERSION));
#ifdef __VERSION__
    const char *compiler = "gcc-compatible " __VERSION__;
#else
    const char *compiler = "unknown";
#endif
    json_object_set_new(rec, "compiler", json_string(compiler));
    json_t *src = json_object();
    size_t cap = 1 << 16, n = 0;
    char *all = xmalloc(cap, 1);
    if (all)
        n = (size_t)snprintf(all, cap, "%s\n", compiler);
    for (const struct source_digest *d = source_digests; d->path; d++) {
        json_object_set_new(src, d->path, json_string(d->sha256));
        if (all && !strncmp(d->path, "src/backend/", 12) && n + 200 < cap)
            n += (size_t)snprintf(all + n, cap - n, "%s %s\n", d->path, d->sha256);
    }
    char ck[65];
    sha256_hex(all ? all : "", all ? n : 0, ck);
    xfree(all);
    json_object_set_new(rec, "source_sha256", src);
    json_object_set_new(rec, "compiler_and_kernels_sha256", json_string(ck));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_checkpoint_file(const char *name)
{
    size_t n = strlen(name);
    if (!strncmp(name, "reference", 9))
        return false; /* fixture references sit beside the model */
    return !strcmp(name, "config.json") || (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

/* sha256 of each checkpoint file: the GGUF file, or config.json + *.safetensors of a dir. */
static qwenrt_status checkpoint_digests(const char *path, json_t *out, struct qwenrt_error *err)
{
    struct stat sb;
    char hex[65];
    if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        const char *base = strrchr(path, '/');
        if (sha256_file_hex(path, hex, err))
            return err->status;
        json_object_set_new(out, base ? base + 1 : path, json_string(hex));
        return QWENRT_OK;
    }
    DIR *d = opendir(path);
    if (!d)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot list the model directory", path);
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (is_checkpoint_file(e->d_name))
            names[n++] = xstrdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), cmp_str);
    qwenrt_status st = QWENRT_OK;
    for (int i = 0; i < n; i++) {
        char fp[2048];
        snprintf(fp, sizeof(fp), "%s/%s", path, names[i] ? names[i] : "");
        if (!st && names[i] && !(st = sha256_file_hex(fp, hex, err)))
            json_object_set_new(out, names[i], json_string(hex));
        xfree(names[i]);
    }
    return st;
}

qwenrt_status records_add_model(json_t *rec, const struct qwenrt_model *m, int32_t capacity,
                                int threads, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &m->hp;
    json_t *ck = json_object();
    json_object_set_new(rec, "checkpoint_sha256", ck);
    qwenrt_status st = checkpoint_digests(m->path, ck, err);
    if (st)
        return st;
    const char *wdt = m->w.tok_embd ? dtype_traits(m->w.layers[0].ffn_down->dtype)->name : "?";
    json_object_set_new(rec, "model",
                        json_pack("{s:s, s:s, s:s, s:s}", "path", m->path, "name", hp->name, "arch",
                                  hp->arch == ARCH_QWEN35 ? "qwen35" : "qwen3", "format",
                                  m->format == MODEL_FORMAT_GGUF ? "gguf" : "hf"));
    json_t *g = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:i, s:s}",
                          "model_type", hp->arch == ARCH_QWEN35 ? "qwen3_5" : "qwen3",
                          "hidden_size", hp->n_embd, "num_hidden_layers", hp->n_layer,
                          "intermediate_size", hp->n_ff, "num_attention_heads", hp->n_head,
                          "num_key_value_heads", hp->n_head_kv, "head_dim", hp->head_dim,
                          "vocab_size", hp->n_vocab, "max_position_embeddings", hp->n_ctx_train,
                          "rms_norm_eps", (double)hp->rms_eps, "rope_theta", (double)hp->rope_theta,
                          "capacity", capacity, "threads", threads, "storage_dtype", wdt);
    json_object_set_new(g, "tie_word_embeddings", json_boolean(m->w.output == m->w.tok_embd));
    if (hp->arch == ARCH_QWEN35) {
        json_t *pattern = json_array();
        for (int32_t l = 0; l < hp->n_layer; l++)
            json_array_append_new(pattern, json_string(hp->is_recurrent[l] ? "linear" : "full"));
        json_object_set_new(g, "layer_types", pattern);
        json_object_set_new(g, "linear_num_key_heads", json_integer(hp->ssm_n_k_heads));
        json_object_set_new(g, "linear_num_value_heads", json_integer(hp->ssm_n_v_heads));
        json_object_set_new(g, "linear_key_head_dim", json_integer(hp->ssm_k_dim));
        json_object_set_new(g, "linear_value_head_dim", json_integer(hp->ssm_v_dim));
        json_object_set_new(g, "linear_conv_kernel_dim", json_integer(hp->ssm_conv));
        json_object_set_new(g, "rotary_dims", json_integer(hp->n_rot));
    }
    json_object_set_new(rec, "geometry", g);
    json_object_set_new(rec, "parameter_count", json_integer(m->n_params));
    return QWENRT_OK;
}

json_t *records_profile(const struct profile *p)
{
    if (!p)
        return json_null();
    json_t *chain = json_array();
    for (int i = 0; i < p->n_chain; i++)
        json_array_append_new(chain, json_string(p->chain[i]));
    return json_pack("{s:s, s:s, s:o, s:O}", "id", p->id, "sha256", p->sha256, "chain", chain,
                     "resolved", p->doc);
}

qwenrt_status records_write(const json_t *rec, const char *path, struct qwenrt_error *err)
{
    char tmp[2048];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (json_dump_file(rec, tmp, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10)) != 0)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot write the record", tmp);
    FILE *f = fopen(tmp, "a");
    if (f) {
        fputc('\n', f);
        fclose(f);
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return err_set(err, QWENRT_ERR_IO, "%s: cannot rename the record into place", path);
    }
    return QWENRT_OK;
}
